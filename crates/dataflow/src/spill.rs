//! The disk tier of operator state (issue 19, ADR 0012): a server-wide [`MemoryBudget`] for the
//! arrangements of every view, and the store their coldest keys move to when they pass it.
//!
//! The store is one `fjall` database (an LSM tree) in a directory of its own, emptied when the
//! server starts: spilled state is a cache of what the arrangements hold, not a durable copy
//! (checkpoints are), so nothing in it is synced and nothing survives a restart. An
//! arrangement's keys are stored under its own 8-byte prefix; the value of a key is its rows
//! (see [`encode_row`]). A second keyspace orders spilled keys by the earliest expiry of their
//! rows (arrangement prefix, expiry, key), so the keys due at a watermark are one range scan.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use eddy_common::{Error, Result, SqlState};

/// The bytes of operator state the arrangements of every view may keep in memory together;
/// past it, each arrangement that grows moves its coldest keys to the spill store.
pub struct MemoryBudget {
    limit: usize,
    used: AtomicUsize,
    dir: PathBuf,
    /// Opened when something first spills.
    store: Mutex<Option<Arc<Store>>>,
    next_id: AtomicU64,
    spilled: AtomicUsize,
    spills: AtomicU64,
}

impl MemoryBudget {
    /// A budget of `limit` bytes, spilling under `dir` (emptied now, and created when the
    /// first key spills).
    pub fn new(limit: usize, dir: &Path) -> Result<Arc<MemoryBudget>> {
        empty_spill_dir(dir)?;
        Ok(Arc::new(MemoryBudget {
            limit,
            used: AtomicUsize::new(0),
            dir: dir.to_path_buf(),
            store: Mutex::new(None),
            next_id: AtomicU64::new(0),
            spilled: AtomicUsize::new(0),
            spills: AtomicU64::new(0),
        }))
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Bytes of state the arrangements report holding in memory.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// Keys of state on disk now, over every arrangement.
    pub fn spilled_keys(&self) -> usize {
        self.spilled.load(Ordering::Relaxed)
    }

    /// Keys spilled since the server started (a key spilled twice counts twice).
    pub fn spills(&self) -> u64 {
        self.spills.load(Ordering::Relaxed)
    }

    pub(crate) fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Records that an arrangement (or another holder of state in the budget, such as a view's
    /// contents) holds `now` bytes where it reported `before`; returns the budget's total.
    pub fn report(&self, before: usize, now: usize) -> usize {
        if now >= before {
            self.used.fetch_add(now - before, Ordering::Relaxed) + (now - before)
        } else {
            self.used.fetch_sub(before - now, Ordering::Relaxed) - (before - now)
        }
    }

    pub(crate) fn count_spilled(&self, added: usize, removed: usize) {
        self.spills.fetch_add(added as u64, Ordering::Relaxed);
        self.spilled.fetch_add(added, Ordering::Relaxed);
        self.spilled.fetch_sub(removed, Ordering::Relaxed);
    }

    /// A directory for state spilled as files (a view's contents' chunks), beside the store;
    /// emptied at start like it.
    pub fn files_dir(&self) -> PathBuf {
        files_dir(&self.dir)
    }

    pub(crate) fn store(&self) -> Result<Arc<Store>> {
        let mut store = self
            .store
            .lock()
            .map_err(|_| Error::internal("the spill store's lock is poisoned"))?;
        if let Some(s) = &*store {
            return Ok(s.clone());
        }
        let opened = Arc::new(Store::open(&self.dir)?);
        *store = Some(opened.clone());
        Ok(opened)
    }
}

/// Removes what a previous run spilled under `dir` and as files beside it (spilled state never
/// outlives its server).
pub fn empty_spill_dir(dir: &Path) -> Result<()> {
    for dir in [dir.to_path_buf(), files_dir(dir)] {
        if dir.exists() {
            std::fs::remove_dir_all(&dir)
                .map_err(|e| Error::io("emptying the spill directory", e))?;
        }
    }
    Ok(())
}

/// The directory of spilled files beside the store's directory `dir`.
fn files_dir(dir: &Path) -> PathBuf {
    let mut name = dir.file_name().unwrap_or_default().to_os_string();
    name.push("-files");
    dir.with_file_name(name)
}

/// The bytes of a holder's prefix in the store.
pub(crate) const PREFIX: usize = 8;

/// One holder of state's link to the budget and the store (an arrangement's, an aggregate's):
/// its prefix in the store, what it last reported and how many of its keys are on disk. Its
/// keys leave the store with it.
pub(crate) struct Tier {
    pub budget: Arc<MemoryBudget>,
    store: Option<Arc<Store>>,
    pub prefix: [u8; PREFIX],
    /// Bytes last reported to the budget.
    pub reported: usize,
    /// Keys on disk.
    pub keys: usize,
    /// No entry of the expiry keyspace is earlier than this (`i64::MAX`: there is none).
    next_due: i64,
    store_key: Vec<u8>,
}

impl Tier {
    pub(crate) fn new(budget: &Arc<MemoryBudget>) -> Tier {
        Tier {
            budget: Arc::clone(budget),
            store: None,
            prefix: budget.next_id().to_be_bytes(),
            reported: 0,
            keys: 0,
            next_due: i64::MAX,
            store_key: Vec::new(),
        }
    }

    /// The store, opened when first needed.
    pub(crate) fn store(&mut self) -> Result<Arc<Store>> {
        if let Some(s) = &self.store {
            return Ok(s.clone());
        }
        let store = self.budget.store()?;
        self.store = Some(store.clone());
        Ok(store)
    }

    /// The store once something spilled to it.
    pub(crate) fn opened(&self) -> Option<&Arc<Store>> {
        self.store.as_ref()
    }

    /// The store's key of `key`: this holder's prefix, then the key's bytes.
    pub(crate) fn store_key(&mut self, key: &[u8]) -> &[u8] {
        self.store_key.clear();
        self.store_key.extend_from_slice(&self.prefix);
        self.store_key.extend_from_slice(key);
        &self.store_key
    }

    /// Enters `key` in the expiry keyspace (in `batch`), due at `expires`.
    pub(crate) fn enter_due(&mut self, batch: &mut Batch<'_>, expires: i64, key: &[u8]) {
        due_key(&mut self.store_key, &self.prefix, expires, key);
        batch.insert_due(&self.store_key);
        self.next_due = self.next_due.min(expires);
    }

    /// Whether an entry of the expiry keyspace may be due at `watermark`.
    pub(crate) fn due_by(&self, watermark: i64) -> bool {
        self.next_due <= watermark
    }

    /// The keys entered in the expiry keyspace that are due at `watermark`, earliest first;
    /// their entries are removed (in `batch`). A key may have left the disk since.
    pub(crate) fn take_due(
        &mut self,
        store: &Store,
        batch: &mut Batch<'_>,
        watermark: i64,
    ) -> Result<Vec<Vec<u8>>> {
        let mut keys = Vec::new();
        if !self.due_by(watermark) {
            return Ok(keys);
        }
        self.next_due = i64::MAX;
        for due in store.scan_due(&self.prefix) {
            let due = due?;
            let (expires, key) = parse_due_key(&due, PREFIX)?;
            if expires > watermark {
                self.next_due = expires;
                break;
            }
            batch.remove_due(&due);
            keys.push(key.to_vec());
        }
        Ok(keys)
    }

    /// Reports that this holder keeps `now` bytes in memory; returns the budget's total.
    pub(crate) fn report(&mut self, now: usize) -> usize {
        let total = self.budget.report(self.reported, now);
        self.reported = now;
        total
    }

    /// The bytes this holder may keep when the budget's total is `total` and it holds `now`:
    /// its part of the limit, in proportion to what it holds; `None` within the limit.
    pub(crate) fn share(&self, now: usize, total: usize) -> Option<usize> {
        let limit = self.budget.limit();
        (total > limit).then(|| (now as u128 * limit as u128 / total.max(1) as u128) as usize)
    }

    /// Records `added` keys written to disk and `removed` ones taken off it.
    pub(crate) fn count(&mut self, added: usize, removed: usize) {
        self.keys = self.keys + added - removed;
        self.budget.count_spilled(added, removed);
    }

    /// Point reads of the keys on disk as they are now, to be made later, off the operators'
    /// thread (a save of changes' spilled keys); `None` when nothing is on disk.
    pub(crate) fn reader(&self) -> Option<SpilledReader> {
        let store = self.store.as_ref().filter(|_| self.keys > 0)?;
        Some(SpilledReader {
            snapshot: store.snapshot(),
            store: Arc::clone(store),
            prefix: self.prefix,
            store_key: Vec::new(),
        })
    }

    /// Every key on disk now with its value, to be read later, off the operators' thread (a
    /// whole save's spilled part); `None` when nothing is on disk.
    pub(crate) fn snapshot(&self) -> Option<SpilledSnapshot> {
        let store = self.store.as_ref().filter(|_| self.keys > 0)?;
        Some(SpilledSnapshot {
            pairs: Box::new(store.scan_snapshot(&self.prefix)),
            store: Arc::clone(store),
            keys: self.keys,
        })
    }
}

impl Drop for Tier {
    fn drop(&mut self) {
        self.budget.report(self.reported, 0);
        self.budget.count_spilled(0, self.keys);
        if let Some(store) = &self.store {
            // A failure leaves dead keys in the store, which the next start empties.
            if let Err(e) = store.clear(&self.prefix) {
                tracing::warn!("could not clear spilled operator state: {e}");
            }
        }
    }
}

/// Point reads of what a holder had on disk at one moment ([`Tier::reader`]): writes to the
/// store after it was taken do not show.
#[derive(Clone)]
pub(crate) struct SpilledReader {
    snapshot: fjall::Snapshot,
    /// Keeps the store's files while they are read (dropped after the snapshot).
    store: Arc<Store>,
    prefix: [u8; PREFIX],
    store_key: Vec<u8>,
}

impl SpilledReader {
    /// Whether `key` was on disk then, or the store cannot say (a check off the hot path).
    pub(crate) fn may_hold(&self, key: &[u8]) -> bool {
        let mut store_key = self.prefix.to_vec();
        store_key.extend_from_slice(key);
        !matches!(self.store.get_at(&self.snapshot, &store_key), Ok(None))
    }

    /// `key`'s stored value then, if it was on disk.
    pub(crate) fn get(&mut self, key: &[u8]) -> Result<Option<fjall::Slice>> {
        self.store_key.clear();
        self.store_key.extend_from_slice(&self.prefix);
        self.store_key.extend_from_slice(key);
        self.store.get_at(&self.snapshot, &self.store_key)
    }
}

/// The keys a holder had on disk at one moment ([`Tier::snapshot`]): writes to the store after
/// it was taken do not show in it.
pub(crate) struct SpilledSnapshot {
    pairs: Box<dyn Iterator<Item = Result<(fjall::Slice, fjall::Slice)>> + Send>,
    /// Keeps the store's files while they are read.
    store: Arc<Store>,
    /// Keys on disk then.
    keys: usize,
}

impl SpilledSnapshot {
    /// Hands `f` every key with its stored value.
    pub(crate) fn for_each(self, mut f: impl FnMut(&[u8], &[u8]) -> Result<()>) -> Result<()> {
        let mut seen = 0;
        for pair in self.pairs {
            let (store_key, value) = pair?;
            f(&store_key[PREFIX..], &value)?;
            seen += 1;
        }
        drop(self.store);
        if seen != self.keys {
            return Err(Error::internal(format!(
                "{seen} spilled keys of operator state are in the store, {} expected",
                self.keys
            )));
        }
        Ok(())
    }
}

/// The spill store: one keyspace of (arrangement prefix, key) → rows, and one of (arrangement
/// prefix, expiry, key) → nothing.
pub(crate) struct Store {
    db: fjall::Database,
    keys: fjall::Keyspace,
    due: fjall::Keyspace,
}

/// A key of the expiry keyspace: `prefix`, `expires` (ordered as signed), `key`.
pub(crate) fn due_key(out: &mut Vec<u8>, prefix: &[u8], expires: i64, key: &[u8]) {
    out.clear();
    out.extend_from_slice(prefix);
    out.extend_from_slice(&((expires as u64) ^ (1 << 63)).to_be_bytes());
    out.extend_from_slice(key);
}

/// The expiry and the key of an expiry keyspace key with a `prefix_len`-byte prefix.
pub(crate) fn parse_due_key(due: &[u8], prefix_len: usize) -> Result<(i64, &[u8])> {
    let at = prefix_len + 8;
    let time = due
        .get(prefix_len..at)
        .and_then(|b| b.try_into().ok())
        .map(|b| (u64::from_be_bytes(b) ^ (1 << 63)) as i64)
        .ok_or_else(|| Error::internal("a spilled expiry of operator state is corrupt"))?;
    Ok((time, &due[at..]))
}

fn spill_error(e: fjall::Error) -> Error {
    match e {
        fjall::Error::Io(io) => Error::io("spilling operator state", io),
        e => Error::new(SqlState::IO_ERROR, format!("spilling operator state: {e}")),
    }
}

impl Store {
    fn open(dir: &Path) -> Result<Store> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io("creating the spill directory", e))?;
        // Memory the store itself holds, besides what the budget counts: its block cache (32
        // MiB), and per keyspace an active memtable and up to four sealed ones waiting for the
        // flush (writes wait past that); journals are rotated (memtables flushed) past 64 MiB.
        let db = fjall::Database::builder(dir)
            .manual_journal_persist(true)
            .temporary(true)
            .worker_threads(1)
            .max_journaling_size(64 << 20)
            .open()
            .map_err(spill_error)?;
        let options = || fjall::KeyspaceCreateOptions::default().max_memtable_size(MEMTABLE_BYTES);
        let keys = db.keyspace("state", options).map_err(spill_error)?;
        let due = db.keyspace("due", options).map_err(spill_error)?;
        Ok(Store { db, keys, due })
    }

    pub(crate) fn batch(&self) -> Batch<'_> {
        Batch {
            store: self,
            batch: self.db.batch().durability(None),
            bytes: 0,
        }
    }

    pub(crate) fn get(&self, key: &[u8]) -> Result<Option<fjall::Slice>> {
        self.keys.get(key).map_err(spill_error)
    }

    /// The store as of now, for reads later ([`Store::get_at`]).
    pub(crate) fn snapshot(&self) -> fjall::Snapshot {
        self.db.snapshot()
    }

    /// `key`'s value in `snapshot`.
    pub(crate) fn get_at(
        &self,
        snapshot: &fjall::Snapshot,
        key: &[u8],
    ) -> Result<Option<fjall::Slice>> {
        use fjall::Readable;
        snapshot.get(&self.keys, key).map_err(spill_error)
    }

    /// Every (key, value) under `prefix` as of now, in key order: the iterator reads a
    /// snapshot, so writes after this call do not show in it (a deferred checkpoint save).
    pub(crate) fn scan_snapshot(
        &self,
        prefix: &[u8],
    ) -> impl Iterator<Item = Result<(fjall::Slice, fjall::Slice)>> + Send + use<> {
        use fjall::Readable;
        self.db
            .snapshot()
            .prefix(&self.keys, prefix)
            .map(|guard| guard.into_inner().map_err(spill_error))
    }

    /// Every key of the expiry keyspace under `prefix`, earliest expiry first.
    pub(crate) fn scan_due(
        &self,
        prefix: &[u8],
    ) -> impl Iterator<Item = Result<fjall::Slice>> + use<> {
        self.due
            .prefix(prefix)
            .map(|guard| guard.key().map_err(spill_error))
    }

    /// Forgets every key under `prefix`, in both keyspaces.
    pub(crate) fn clear(&self, prefix: &[u8]) -> Result<()> {
        let mut batch = self.batch();
        for guard in self.keys.prefix(prefix) {
            let key = guard.key().map_err(spill_error)?;
            batch.remove(&key);
        }
        for guard in self.due.prefix(prefix) {
            let key = guard.key().map_err(spill_error)?;
            batch.remove_due(&key);
        }
        batch.commit()
    }
}

/// Writes to the spill store, applied together (or, with [`Batch::commit_if_large`], in
/// parts of at most about [`BATCH_BYTES`]).
pub(crate) struct Batch<'a> {
    store: &'a Store,
    batch: fjall::OwnedWriteBatch,
    /// Bytes of keys and values inserted since the batch began.
    bytes: usize,
}

/// The spill store's memtables rotate past this.
const MEMTABLE_BYTES: u64 = 16 << 20;

/// Bytes of a write to the store committed at once by long evictions: a write goes whole into
/// the store's memtable, so one of a million keys would hold them all in memory until flushed.
const BATCH_BYTES: usize = 8 << 20;

impl Batch<'_> {
    pub(crate) fn insert(&mut self, key: &[u8], value: &[u8]) {
        self.bytes += key.len() + value.len();
        self.batch.insert(&self.store.keys, key, value);
    }

    /// Commits what the batch holds once it passes [`BATCH_BYTES`], and goes on with a new
    /// one (for writes whose parts may land apart: evictions).
    pub(crate) fn commit_if_large(&mut self) -> Result<()> {
        if self.bytes < BATCH_BYTES {
            return Ok(());
        }
        let full = std::mem::replace(self, self.store.batch());
        full.commit()
    }

    pub(crate) fn remove(&mut self, key: &[u8]) {
        self.batch.remove(&self.store.keys, key);
    }

    pub(crate) fn insert_due(&mut self, key: &[u8]) {
        self.batch.insert(&self.store.due, key, []);
    }

    pub(crate) fn remove_due(&mut self, key: &[u8]) {
        self.batch.remove(&self.store.due, key);
    }

    pub(crate) fn commit(self) -> Result<()> {
        if self.batch.is_empty() {
            return Ok(());
        }
        self.batch.commit().map_err(spill_error)
    }
}

/// One row of a spilled key: its bytes and the entry's numbers.
pub(crate) struct SpilledRow<'a> {
    pub row: &'a [u8],
    pub time: i64,
    pub weight: i64,
    pub expires: i64,
    pub aux: i64,
}

const HEADER: usize = 4 * 8 + 4;

/// Appends one row to a spilled key's value: time, weight, expires, aux (little-endian i64s),
/// the row's length (u32) and its bytes.
pub(crate) fn encode_row(out: &mut Vec<u8>, row: &SpilledRow<'_>) {
    out.reserve(HEADER + row.row.len());
    for n in [row.time, row.weight, row.expires, row.aux] {
        out.extend_from_slice(&n.to_le_bytes());
    }
    out.extend_from_slice(&(row.row.len() as u32).to_le_bytes());
    out.extend_from_slice(row.row);
}

/// The rows of a spilled key's value, in the order [`encode_row`] wrote them.
pub(crate) fn decode_rows(mut value: &[u8]) -> impl Iterator<Item = Result<SpilledRow<'_>>> {
    std::iter::from_fn(move || {
        if value.is_empty() {
            return None;
        }
        let corrupt = || Error::internal("a spilled key of operator state is corrupt");
        if value.len() < HEADER {
            value = &[];
            return Some(Err(corrupt()));
        }
        let int =
            |i: usize| i64::from_le_bytes(value[i * 8..i * 8 + 8].try_into().unwrap_or_default());
        let len = u32::from_le_bytes(value[32..36].try_into().unwrap_or_default()) as usize;
        if value.len() < HEADER + len {
            value = &[];
            return Some(Err(corrupt()));
        }
        let (time, weight, expires, aux) = (int(0), int(1), int(2), int(3));
        let (head, rest) = value.split_at(HEADER + len);
        value = rest;
        Some(Ok(SpilledRow {
            row: &head[HEADER..],
            time,
            weight,
            expires,
            aux,
        }))
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A budget for tests, spilling into a directory that lives as long as it.
    pub(crate) struct Spilling {
        pub budget: Arc<MemoryBudget>,
        _dir: tempfile::TempDir,
    }

    impl Spilling {
        pub(crate) fn with_limit(limit: usize) -> Spilling {
            let dir = tempfile::tempdir().unwrap();
            let budget = MemoryBudget::new(limit, &dir.path().join("spill")).unwrap();
            Spilling { budget, _dir: dir }
        }
    }

    #[test]
    fn rows_decode_as_they_were_encoded() {
        let mut value = Vec::new();
        let rows = [
            (b"first".as_slice(), 1, 2, 3, 4),
            (b"", -1, i64::MIN, NEVER_TEST, 0),
        ];
        for (row, time, weight, expires, aux) in rows {
            encode_row(
                &mut value,
                &SpilledRow {
                    row,
                    time,
                    weight,
                    expires,
                    aux,
                },
            );
        }
        let back: Vec<_> = decode_rows(&value)
            .map(|r| r.map(|r| (r.row.to_vec(), r.time, r.weight, r.expires, r.aux)))
            .collect::<Result<_>>()
            .unwrap();
        assert_eq!(
            back,
            rows.map(|(r, t, w, e, a)| (r.to_vec(), t, w, e, a))
                .to_vec()
        );
        // A value cut short is an error, not a panic or a shorter list.
        let cut: Vec<_> = decode_rows(&value[..value.len() - 1]).collect();
        assert!(cut.last().unwrap().is_err());
    }

    const NEVER_TEST: i64 = i64::MAX;
}
