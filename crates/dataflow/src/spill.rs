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
        let db = fjall::Database::builder(dir)
            .manual_journal_persist(true)
            .temporary(true)
            .worker_threads(1)
            .open()
            .map_err(spill_error)?;
        let keys = db
            .keyspace("state", fjall::KeyspaceCreateOptions::default)
            .map_err(spill_error)?;
        let due = db
            .keyspace("due", fjall::KeyspaceCreateOptions::default)
            .map_err(spill_error)?;
        Ok(Store { db, keys, due })
    }

    pub(crate) fn batch(&self) -> Batch<'_> {
        Batch {
            store: self,
            batch: self.db.batch().durability(None),
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

/// Writes to the spill store, applied together.
pub(crate) struct Batch<'a> {
    store: &'a Store,
    batch: fjall::OwnedWriteBatch,
}

impl Batch<'_> {
    pub(crate) fn insert(&mut self, key: &[u8], value: &[u8]) {
        self.batch.insert(&self.store.keys, key, value);
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
