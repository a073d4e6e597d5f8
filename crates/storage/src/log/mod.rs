//! The durable, partitioned, append-only log that every table write goes to first.
//!
//! Entry point: [`LogStore`]. Layout: `<root>/<object id>/<partition>/<first offset>.seg`.
//! Writes go through one committer thread ([`LogStore::commit`]): it takes every commit waiting
//! in its queue, appends their records, fsyncs each touched partition once (group commit) and
//! only then answers each waiting writer. Records of one commit carry the same transaction id;
//! a commit that touches several objects lists them in every record, so that recovery can drop a
//! transaction that reached only some of its partitions before a crash.
//! Invariants: offsets are dense per partition; transaction ids grow with commit order; a
//! commit is answered `Ok` only once all its records are durable.

mod codec;
mod frame;
mod segment;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use eddy_common::{Error, ObjectId, Offset, PartitionId, Result, SqlState, TxnId, limits};
use tokio::sync::oneshot;

pub use codec::{
    decode_changes, decode_positions, decode_rows, decode_watermark, encode_changes,
    encode_changes_at, encode_watermark,
};
pub use frame::{Participant, Record};
use segment::PartitionLog;
pub use segment::SealedSegment;

/// One record to append in a commit.
pub struct Write {
    pub object: ObjectId,
    pub partition: PartitionId,
    pub payload: Vec<u8>,
}

/// Where a commit's records landed.
#[derive(Debug, Clone)]
pub struct Committed {
    pub txn_id: TxnId,
    pub offsets: Vec<(ObjectId, PartitionId, Offset)>,
}

/// A commit in flight; await it to learn that the commit is durable.
pub type CommitTicket = oneshot::Receiver<Result<Committed>>;

struct CommitRequest {
    writes: Vec<Write>,
    /// The offset each write was promised when it was queued ([`LogStore::commit_at`]).
    promised: Vec<Offset>,
    reply: oneshot::Sender<Result<Committed>>,
}

/// The committer's queue, and the offset the next queued record of each partition gets: the
/// committer appends in queue order, so a record's offset is known when it is queued.
struct Queue {
    tx: Option<SyncSender<CommitRequest>>,
    next: HashMap<PartitionKey, u64>,
}

type PartitionKey = (ObjectId, PartitionId);

struct Shared {
    root: PathBuf,
    partitions: Mutex<HashMap<PartitionKey, Arc<Mutex<PartitionLog>>>>,
    /// Set once an fsync failed: the log can no longer promise durability (as PostgreSQL, we
    /// refuse further writes rather than guess what reached the disk).
    failed: Mutex<Option<String>>,
    segment_bytes: u64,
}

pub struct LogStore {
    shared: Arc<Shared>,
    queue: Mutex<Queue>,
    committer: Mutex<Option<JoinHandle<()>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A poisoned lock means a thread panicked while holding it; the data is still the best we
    // have, and refusing to go on would turn one bug into an outage.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn partition_dir(root: &Path, key: PartitionKey) -> PathBuf {
    root.join(key.0.0.to_string()).join(key.1.0.to_string())
}

impl LogStore {
    /// Opens the log under `root` for the given objects and their partition counts, repairing
    /// what a crash may have left: torn frames, and multi-object transactions that reached
    /// only some of their partitions. Directories of objects not listed are removed (they
    /// belong to objects dropped, or created but never committed to the catalog).
    pub fn open(root: &Path, objects: &[(ObjectId, u32)]) -> Result<Arc<Self>> {
        LogStore::open_with(root, objects, limits::LOG_SEGMENT_BYTES_TARGET)
    }

    /// [`LogStore::open`] with segments of `segment_bytes` (retention deletes whole segments:
    /// small ones trim finely; tests use them).
    pub fn open_with(
        root: &Path,
        objects: &[(ObjectId, u32)],
        segment_bytes: u64,
    ) -> Result<Arc<Self>> {
        fs::create_dir_all(root).map_err(|e| Error::io("create the log directory", e))?;
        remove_unknown_objects(root, objects)?;
        let mut partitions = HashMap::new();
        for &(object, count) in objects {
            for p in 0..count {
                let key = (object, PartitionId(p));
                let log = PartitionLog::open_with(&partition_dir(root, key), segment_bytes)?;
                partitions.insert(key, log);
            }
        }
        repair_torn_transactions(&mut partitions)?;
        let txn_max = partitions
            .values()
            .map(|p| p.txn_max)
            .max()
            .unwrap_or(TxnId(0));
        let shared = Arc::new(Shared {
            root: root.to_path_buf(),
            partitions: Mutex::new(
                partitions
                    .into_iter()
                    .map(|(k, v)| (k, Arc::new(Mutex::new(v))))
                    .collect(),
            ),
            failed: Mutex::new(None),
            segment_bytes,
        });
        let (tx, rx) = mpsc::sync_channel(limits::COMMIT_QUEUE_CAPACITY);
        let thread_shared = Arc::clone(&shared);
        let committer = std::thread::Builder::new()
            .name("eddy-log-committer".into())
            .spawn(move || run_committer(&thread_shared, &rx, txn_max))
            .map_err(|e| Error::io("start the log committer", e))?;
        Ok(Arc::new(LogStore {
            shared,
            queue: Mutex::new(Queue {
                tx: Some(tx),
                next: HashMap::new(),
            }),
            committer: Mutex::new(Some(committer)),
        }))
    }

    /// Creates the partitions of a new object.
    pub fn create_object(&self, object: ObjectId, partitions: u32) -> Result<()> {
        let mut map = lock(&self.shared.partitions);
        for p in 0..partitions {
            let key = (object, PartitionId(p));
            let log = PartitionLog::open_with(
                &partition_dir(&self.shared.root, key),
                self.shared.segment_bytes,
            )?;
            map.insert(key, Arc::new(Mutex::new(log)));
        }
        segment::sync_dir(&self.shared.root)
    }

    /// Deletes an object's log. Call only once the catalog no longer lists the object.
    pub fn drop_object(&self, object: ObjectId) -> Result<()> {
        lock(&self.queue).next.retain(|k, _| k.0 != object);
        lock(&self.shared.partitions).retain(|k, _| k.0 != object);
        let dir = self.shared.root.join(object.0.to_string());
        match fs::remove_dir_all(&dir) {
            Ok(()) => segment::sync_dir(&self.shared.root),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io("remove a dropped table's log", e)),
        }
    }

    /// Queues a commit. The order of calls is the order of the log; the ticket resolves once
    /// the commit is durable (or failed). Blocks while the queue is full (back-pressure).
    pub fn commit(&self, writes: Vec<Write>) -> CommitTicket {
        self.commit_at(writes).0
    }

    /// [`LogStore::commit`], also returning the offset each write gets (in the order of
    /// `writes`) if the commit succeeds: readers can tell a record they hold in memory from
    /// the same record read back from the log. A record that does not land where it was
    /// promised fails the log (see `append_commit`), so a promise is never silently wrong.
    pub fn commit_at(&self, writes: Vec<Write>) -> (CommitTicket, Vec<Offset>) {
        let (reply, ticket) = oneshot::channel();
        // What would fail to append fails here, before offsets are promised.
        let participants = writes
            .iter()
            .map(|w| (w.object, w.partition))
            .collect::<HashSet<_>>()
            .len();
        let participants = if participants < 2 { 0 } else { participants };
        if let Some(e) = writes
            .iter()
            .find_map(|w| frame::check(participants, w.payload.len()).err())
        {
            let _ = reply.send(Err(e));
            return (ticket, Vec::new());
        }
        let mut queue = lock(&self.queue);
        let mut promised = Vec::with_capacity(writes.len());
        for w in &writes {
            let key = (w.object, w.partition);
            let next = match queue.next.get(&key) {
                Some(&n) => n,
                // Nothing of this partition is queued: its end is where the next record goes.
                None => self.end_offset(w.object, w.partition).map_or(0, |o| o.0),
            };
            queue.next.insert(key, next + 1);
            promised.push(Offset(next));
        }
        match queue.tx.as_ref() {
            Some(tx) => {
                let request = CommitRequest {
                    writes,
                    promised: promised.clone(),
                    reply,
                };
                if let Err(mpsc::SendError(request)) = tx.send(request) {
                    let _ = request.reply.send(Err(shut_down()));
                }
            }
            None => {
                let _ = reply.send(Err(shut_down()));
            }
        }
        (ticket, promised)
    }

    /// The offset the next record appended to a partition gets (its log end).
    pub fn end_offset(&self, object: ObjectId, partition: PartitionId) -> Result<Offset> {
        let log = lock(&self.shared.partitions)
            .get(&(object, partition))
            .cloned();
        let log = log.ok_or_else(|| Error::internal(format!("no log for object {object}")))?;
        Ok(lock(&log).end_offset())
    }

    fn partition(
        &self,
        object: ObjectId,
        partition: PartitionId,
    ) -> Result<Arc<Mutex<PartitionLog>>> {
        lock(&self.shared.partitions)
            .get(&(object, partition))
            .cloned()
            .ok_or_else(|| Error::internal(format!("no log for object {object}")))
    }

    /// The offset of the oldest record a partition keeps (0 until retention deleted some).
    pub fn start_offset(&self, object: ObjectId, partition: PartitionId) -> Result<Offset> {
        let log = self.partition(object, partition)?;
        Ok(lock(&log).start_offset())
    }

    /// A partition's segments that retention may delete, oldest first.
    pub fn sealed_segments(
        &self,
        object: ObjectId,
        partition: PartitionId,
    ) -> Result<Vec<SealedSegment>> {
        let log = self.partition(object, partition)?;
        Ok(lock(&log).sealed_segments())
    }

    /// Deletes a partition's oldest segments whose records all lie before `before`.
    pub fn delete_segments_before(
        &self,
        object: ObjectId,
        partition: PartitionId,
        before: Offset,
    ) -> Result<usize> {
        let log = self.partition(object, partition)?;
        lock(&log).delete_segments_before(before)
    }

    /// Replaces the records of a sealed segment (compaction; see `PartitionLog::rewrite_segment`).
    pub fn rewrite_segment(
        &self,
        object: ObjectId,
        partition: PartitionId,
        base: Offset,
        records: &[Record],
    ) -> Result<()> {
        let log = self.partition(object, partition)?;
        lock(&log).rewrite_segment(base, records)
    }

    /// Calls `f` for each record of a partition from `from` to the current end.
    pub fn scan(
        &self,
        object: ObjectId,
        partition: PartitionId,
        from: Offset,
        f: impl FnMut(Offset, Record) -> Result<()>,
    ) -> Result<()> {
        let log = self.partition(object, partition)?;
        lock(&log).scan(from, f)
    }

    /// The records of a partition from `from` up to `until` (exclusive) or its end: a bounded
    /// read, holding the partition only while it reads them (appends wait that long).
    pub fn read_range(
        &self,
        object: ObjectId,
        partition: PartitionId,
        from: Offset,
        until: Offset,
    ) -> Result<Vec<(Offset, Record)>> {
        let mut records = Vec::new();
        let log = self.partition(object, partition)?;
        lock(&log).scan_range(from, until, |offset, record| {
            records.push((offset, record));
            Ok(())
        })?;
        Ok(records)
    }

    /// Stops the committer after it has answered every queued commit.
    /// Bytes the object's log takes on disk, over all its partitions.
    pub fn object_bytes(&self, object: ObjectId) -> u64 {
        fn walk(dir: &Path) -> u64 {
            let Ok(entries) = std::fs::read_dir(dir) else {
                return 0;
            };
            entries
                .flatten()
                .map(|e| match e.metadata() {
                    Ok(m) if m.is_dir() => walk(&e.path()),
                    Ok(m) => m.len(),
                    Err(_) => 0,
                })
                .sum()
        }
        walk(&self.shared.root.join(object.0.to_string()))
    }

    pub fn shutdown(&self) {
        lock(&self.queue).tx.take();
        if let Some(handle) = lock(&self.committer).take() {
            let _ = handle.join();
        }
    }
}

impl Drop for LogStore {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn shut_down() -> Error {
    Error::new(SqlState::ADMIN_SHUTDOWN, "the server is shutting down")
}

fn remove_unknown_objects(root: &Path, objects: &[(ObjectId, u32)]) -> Result<()> {
    let known: HashSet<String> = objects.iter().map(|(o, _)| o.0.to_string()).collect();
    for entry in fs::read_dir(root).map_err(|e| Error::io("list the log directory", e))? {
        let entry = entry.map_err(|e| Error::io("list the log directory", e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !known.contains(&name) && entry.path().is_dir() {
            tracing::info!(object = %name, "removing the log of an object the catalog does not list");
            fs::remove_dir_all(entry.path()).map_err(|e| Error::io("remove an orphaned log", e))?;
        }
    }
    Ok(())
}

/// Drops every record from the first torn multi-partition transaction on.
///
/// A multi-partition commit is torn when some partition it names lacks its record. Only the
/// last group commit before a crash can be torn, and nothing from it was acknowledged, so
/// cutting every partition at the first torn transaction id leaves exactly a prefix of
/// acknowledged commits plus possibly some unacknowledged complete ones.
fn repair_torn_transactions(partitions: &mut HashMap<PartitionKey, PartitionLog>) -> Result<()> {
    let mut present: HashMap<TxnId, HashSet<PartitionKey>> = HashMap::new();
    let mut expected: BTreeMap<TxnId, HashSet<Participant>> = BTreeMap::new();
    let objects: HashSet<ObjectId> = partitions.keys().map(|k| k.0).collect();
    for (key, log) in partitions.iter() {
        for r in &log.multi_partition_records {
            present.entry(r.txn_id).or_default().insert(*key);
            let names = expected.entry(r.txn_id).or_default();
            names.extend(
                r.participants
                    .iter()
                    .filter(|p| objects.contains(&p.object)),
            );
        }
    }
    let reached = |have: &HashSet<PartitionKey>, p: &Participant| match p.partition {
        Some(partition) => have.contains(&(p.object, partition)),
        // Version 1 records named objects only.
        None => have.iter().any(|k| k.0 == p.object),
    };
    let torn = expected
        .iter()
        .find(|(txn, names)| {
            present
                .get(txn)
                .is_none_or(|have| !names.iter().all(|p| reached(have, p)))
        })
        .map(|(txn, _)| *txn);
    let Some(torn) = torn else { return Ok(()) };
    tracing::warn!(
        txn = torn.0,
        "dropping a transaction that reached only some of its partitions before a crash"
    );
    for log in partitions.values_mut() {
        let cut = log
            .multi_partition_records
            .iter()
            .find(|r| r.txn_id >= torn)
            .map(|r| r.offset);
        if let Some(cut) = cut {
            log.truncate_from(cut)?;
        }
    }
    Ok(())
}

fn run_committer(shared: &Shared, queue: &Receiver<CommitRequest>, txn_max: TxnId) {
    let mut next_txn = txn_max.0 + 1;
    let mut scratch = Vec::new();
    while let Ok(first) = queue.recv() {
        let mut batch = vec![first];
        while let Ok(request) = queue.try_recv() {
            batch.push(request);
        }
        let failed = lock(&shared.failed).clone();
        if let Some(why) = failed {
            for request in batch {
                let _ = request.reply.send(Err(log_failed(&why)));
            }
            continue;
        }
        let mut results = Vec::with_capacity(batch.len());
        let mut touched: HashMap<PartitionKey, Arc<Mutex<PartitionLog>>> = HashMap::new();
        for request in &batch {
            let txn_id = TxnId(next_txn);
            next_txn += 1;
            results.push(append_commit(
                shared,
                request,
                txn_id,
                &mut touched,
                &mut scratch,
            ));
        }
        let mut sync_error = None;
        for log in touched.values() {
            if let Err(e) = lock(log).sync() {
                sync_error = Some(e);
            }
        }
        if let Some(e) = sync_error {
            tracing::error!(error = %e, "fsync of the log failed; refusing further writes");
            *lock(&shared.failed) = Some(e.message.clone());
            for request in batch {
                let _ = request.reply.send(Err(log_failed(&e.message)));
            }
            continue;
        }
        for (request, result) in batch.into_iter().zip(results) {
            let _ = request.reply.send(result);
        }
    }
}

fn log_failed(why: &str) -> Error {
    Error::new(
        SqlState::IO_ERROR,
        format!("the log cannot accept writes after a failed fsync: {why}"),
    )
}

/// Appends one commit's records. Every partition is looked up before anything is appended (a
/// commit naming a dropped object appends nothing); an append that fails, or lands elsewhere
/// than promised, fails the log: what reached the file is unknown, and offsets promised to
/// readers would no longer hold.
fn append_commit(
    shared: &Shared,
    request: &CommitRequest,
    txn_id: TxnId,
    touched: &mut HashMap<PartitionKey, Arc<Mutex<PartitionLog>>>,
    scratch: &mut Vec<u8>,
) -> Result<Committed> {
    let writes = &request.writes;
    let mut participants: Vec<Participant> = writes
        .iter()
        .map(|w| Participant {
            object: w.object,
            partition: Some(w.partition),
        })
        .collect();
    participants.sort();
    participants.dedup();
    if participants.len() < 2 {
        participants.clear();
    }
    let logs = writes
        .iter()
        .map(|write| {
            lock(&shared.partitions)
                .get(&(write.object, write.partition))
                .cloned()
                .ok_or_else(|| {
                    Error::new(
                        SqlState::UNDEFINED_TABLE,
                        format!("table {} was dropped", write.object),
                    )
                })
        })
        .collect::<Result<Vec<_>>>()?;
    let mut offsets = Vec::with_capacity(writes.len());
    for ((write, log), promised) in writes.iter().zip(logs).zip(&request.promised) {
        let record = Record {
            txn_id,
            participants: participants.clone(),
            payload: write.payload.clone(),
        };
        let appended = lock(&log).append(&record, scratch);
        let failure = match &appended {
            Err(e) => Some(e.message.clone()),
            Ok(offset) if offset != promised => Some(format!(
                "a record of object {} landed at offset {offset}, not at {promised} as promised",
                write.object
            )),
            Ok(_) => None,
        };
        if let Some(why) = failure {
            tracing::error!(error = %why, "appending to the log failed; refusing further writes");
            *lock(&shared.failed) = Some(why.clone());
            return Err(log_failed(&why));
        }
        let offset = *promised;
        touched.insert((write.object, write.partition), log);
        offsets.push((write.object, write.partition, offset));
    }
    Ok(Committed { txn_id, offsets })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(object: u64, payload: &[u8]) -> Write {
        Write {
            object: ObjectId(object),
            partition: PartitionId(0),
            payload: payload.to_vec(),
        }
    }

    fn payloads(store: &LogStore, object: u64) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        store
            .scan(ObjectId(object), PartitionId(0), Offset(0), |_, r| {
                out.push(r.payload);
                Ok(())
            })
            .unwrap();
        out
    }

    #[tokio::test]
    async fn commits_are_durable_and_ordered() {
        let dir = tempfile::tempdir().unwrap();
        let objects = [(ObjectId(1), 1), (ObjectId(2), 1)];
        {
            let store = LogStore::open(dir.path(), &objects).unwrap();
            let a = store.commit(vec![write(1, b"a1")]);
            let b = store.commit(vec![write(1, b"a2"), write(2, b"b1")]);
            let a = a.await.unwrap().unwrap();
            let b = b.await.unwrap().unwrap();
            assert!(b.txn_id > a.txn_id);
            assert_eq!(b.offsets[0].2, Offset(1));
        }
        let store = LogStore::open(dir.path(), &objects).unwrap();
        assert_eq!(payloads(&store, 1), vec![b"a1".to_vec(), b"a2".to_vec()]);
        assert_eq!(payloads(&store, 2), vec![b"b1".to_vec()]);
        let c = store.commit(vec![write(2, b"b2")]).await.unwrap().unwrap();
        assert!(
            c.txn_id.0 >= 3,
            "transaction ids keep growing across restarts"
        );
    }

    /// Offsets promised when commits are queued are where the records land, commit after
    /// commit without waiting, across restarts; a record too large is refused before it is
    /// promised anything, and the promises after it still hold.
    #[tokio::test]
    async fn queued_records_land_where_they_were_promised() {
        let dir = tempfile::tempdir().unwrap();
        let objects = [(ObjectId(1), 1), (ObjectId(2), 1)];
        for round in 0..2u64 {
            let store = LogStore::open(dir.path(), &objects).unwrap();
            let mut queued = Vec::new();
            for i in 0..50u64 {
                let writes = if i % 3 == 0 {
                    vec![write(1, b"a"), write(2, b"b")]
                } else {
                    vec![write(1 + i % 2, b"c")]
                };
                queued.push(store.commit_at(writes));
                if i == 25 {
                    let huge = vec![0u8; limits::LOG_RECORD_BYTES_MAX + 1];
                    let (ticket, promised) = store.commit_at(vec![write(1, &huge)]);
                    assert!(promised.is_empty());
                    let e = ticket.await.unwrap().unwrap_err();
                    assert_eq!(e.state, SqlState::PROGRAM_LIMIT_EXCEEDED);
                }
            }
            for (ticket, promised) in queued {
                let committed = ticket.await.unwrap().unwrap();
                let landed: Vec<Offset> = committed.offsets.iter().map(|o| o.2).collect();
                assert_eq!(landed, promised, "round {round}");
            }
            assert!(store.end_offset(ObjectId(1), PartitionId(0)).unwrap().0 > 30 * (round + 1));
        }
    }

    #[tokio::test]
    async fn a_transaction_torn_across_tables_is_dropped_everywhere() {
        let dir = tempfile::tempdir().unwrap();
        let objects = [(ObjectId(1), 1), (ObjectId(2), 1)];
        {
            let store = LogStore::open(dir.path(), &objects).unwrap();
            store.commit(vec![write(1, b"ok")]).await.unwrap().unwrap();
            store
                .commit(vec![write(1, b"t1"), write(2, b"t2")])
                .await
                .unwrap()
                .unwrap();
        }
        // Simulate a crash that lost table 2's half of the transaction.
        let seg =
            partition_dir(dir.path(), (ObjectId(2), PartitionId(0))).join(format!("{:020}.seg", 0));
        fs::write(&seg, b"").unwrap();
        let store = LogStore::open(dir.path(), &objects).unwrap();
        assert_eq!(payloads(&store, 1), vec![b"ok".to_vec()]);
        assert!(payloads(&store, 2).is_empty());
    }

    #[tokio::test]
    async fn a_transaction_torn_across_partitions_of_one_table_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let objects = [(ObjectId(1), 2)];
        let to = |p: u32, payload: &[u8]| Write {
            object: ObjectId(1),
            partition: PartitionId(p),
            payload: payload.to_vec(),
        };
        {
            let store = LogStore::open(dir.path(), &objects).unwrap();
            store.commit(vec![to(0, b"ok")]).await.unwrap().unwrap();
            store
                .commit(vec![to(0, b"t0"), to(1, b"t1")])
                .await
                .unwrap()
                .unwrap();
        }
        let seg =
            partition_dir(dir.path(), (ObjectId(1), PartitionId(1))).join(format!("{:020}.seg", 0));
        fs::write(&seg, b"").unwrap();
        let store = LogStore::open(dir.path(), &objects).unwrap();
        assert_eq!(payloads(&store, 1), vec![b"ok".to_vec()]);
        assert_eq!(
            store.end_offset(ObjectId(1), PartitionId(1)).unwrap(),
            Offset(0)
        );
    }

    #[tokio::test]
    async fn unknown_object_directories_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = LogStore::open(dir.path(), &[(ObjectId(7), 1)]).unwrap();
            store.commit(vec![write(7, b"x")]).await.unwrap().unwrap();
        }
        let _store = LogStore::open(dir.path(), &[]).unwrap();
        assert!(!dir.path().join("7").exists());
    }
}
