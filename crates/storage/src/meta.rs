//! The metadata store: the catalog of objects, kept in sled under `<data-dir>/meta`.
//!
//! sled holds small, transactional data only (catalog entries, checkpoint manifests, dead
//! letters and sink progress); bulk data lives in the log's own files. Entries are opaque
//! bytes here: the engine owns their encoding. Every mutation is flushed before it returns,
//! except sink progress written with `durable = false`.

use std::path::Path;

use eddy_common::{Error, ObjectId, Result, SqlState};

const CATALOG_TREE: &str = "catalog";
const DEAD_LETTERS_TREE: &str = "dead_letters";
const CHECKPOINTS_TREE: &str = "checkpoints";
const SINK_PROGRESS_TREE: &str = "sink_progress";
/// PostgreSQL OIDs given to objects (object id -> first OID of its block), and the next free
/// OID under [`NEXT_OID_KEY`].
const OIDS_TREE: &str = "oids";
const NEXT_OID_KEY: &[u8] = b"next";

/// The catalog (object id -> encoded definition) and the dead letters of ingestion.
pub struct MetaStore {
    db: sled::Db,
    catalog: sled::Tree,
    dead_letters: sled::Tree,
    /// Checkpoint manifests by epoch (big-endian): a checkpoint exists once its manifest does.
    checkpoints: sled::Tree,
    /// What each Kafka or file sink has written (sink id -> the engine's encoding).
    sink_progress: sled::Tree,
    oids: sled::Tree,
    /// Serializes OID allocation (read the next free OID, store it advanced).
    oid_lock: std::sync::Mutex<()>,
}

/// A record that could not be decoded or converted (`eddy_dead_letters`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    pub object: ObjectId,
    /// Where the record sits in its source, when it has a position there (a file or Kafka
    /// partition and offset). A letter with a position is stored under it, so a record read
    /// again after a crash replaces its letter instead of adding a second one.
    pub partition: Option<u32>,
    pub offset: Option<u64>,
    /// The record's key, for sources that have keys (Kafka).
    pub key: Option<Vec<u8>>,
    /// The record's value (`None`: a Kafka tombstone).
    pub raw: Option<Vec<u8>>,
    pub error: String,
    pub received_at_micros: i64,
}

/// Flags of a stored dead letter (the byte after its offset).
const LETTER_HAS_OFFSET: u8 = 1;
/// Key and value are stored as length-prefixed sections (older letters hold the value only).
const LETTER_KEY_VALUE: u8 = 2;
/// The length written for an absent key or value.
const ABSENT: u32 = u32::MAX;

impl DeadLetter {
    fn encode(&self) -> Vec<u8> {
        let (key, raw) = (self.key.as_deref(), self.raw.as_deref());
        let mut out = Vec::with_capacity(
            29 + self.error.len() + key.map_or(0, <[u8]>::len) + raw.map_or(0, <[u8]>::len),
        );
        out.extend_from_slice(&self.received_at_micros.to_le_bytes());
        out.extend_from_slice(&self.offset.map_or(u64::MAX, |o| o).to_le_bytes());
        out.push(
            LETTER_KEY_VALUE
                | if self.offset.is_some() {
                    LETTER_HAS_OFFSET
                } else {
                    0
                },
        );
        out.extend_from_slice(&(self.error.len() as u32).to_le_bytes());
        out.extend_from_slice(self.error.as_bytes());
        for section in [key, raw] {
            out.extend_from_slice(&section.map_or(ABSENT, |s| s.len() as u32).to_le_bytes());
            out.extend_from_slice(section.unwrap_or_default());
        }
        out
    }

    fn decode(key: &[u8], value: &[u8]) -> Result<Self> {
        let corrupt = || Error::new(SqlState::DATA_CORRUPTED, "unreadable dead letter");
        if key.len() != 20 || value.len() < 21 {
            return Err(corrupt());
        }
        let u64_at = |b: &[u8], at: usize| {
            b.get(at..at + 8)
                .and_then(|s| s.try_into().ok())
                .map(u64::from_be_bytes)
        };
        let object = ObjectId(u64_at(key, 0).ok_or_else(corrupt)?);
        let partition = u32::from_be_bytes(key[8..12].try_into().map_err(|_| corrupt())?);
        let le64 = |at: usize| {
            value
                .get(at..at + 8)
                .and_then(|s| s.try_into().ok())
                .map(u64::from_le_bytes)
                .ok_or_else(corrupt)
        };
        let le32 = |at: usize| {
            value
                .get(at..at + 4)
                .and_then(|s| s.try_into().ok())
                .map(u32::from_le_bytes)
                .ok_or_else(corrupt)
        };
        let received_at_micros = le64(0)? as i64;
        let flags = value[16];
        let offset = (flags & LETTER_HAS_OFFSET != 0).then_some(le64(8)?);
        let error_len = le32(17)? as usize;
        let error = value.get(21..21 + error_len).ok_or_else(corrupt)?;
        let mut at = 21 + error_len;
        let (record_key, raw) = if flags & LETTER_KEY_VALUE == 0 {
            (None, Some(value[at..].to_vec()))
        } else {
            let mut section = || -> Result<Option<Vec<u8>>> {
                let len = le32(at)?;
                at += 4;
                if len == ABSENT {
                    return Ok(None);
                }
                let bytes = value
                    .get(at..at + len as usize)
                    .ok_or_else(corrupt)?
                    .to_vec();
                at += len as usize;
                Ok(Some(bytes))
            };
            (section()?, section()?)
        };
        Ok(DeadLetter {
            object,
            partition: (partition != u32::MAX).then_some(partition),
            offset,
            key: record_key,
            raw,
            error: String::from_utf8_lossy(error).into_owned(),
            received_at_micros,
        })
    }
}

/// Identifies a stored dead letter (to remove it once replayed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterKey(Vec<u8>);

fn meta_error(context: &str, err: sled::Error) -> Error {
    Error::new(
        SqlState::IO_ERROR,
        format!("metadata store: {context}: {err}"),
    )
}

/// Removes the snapshot files sled left unfinished when the process died while writing one.
///
/// sled 0.34.7 writes a snapshot to `snap.<lsn>.generating`, fsyncs it and renames it to
/// `snap.<lsn>`; only then does it remove the older snapshot. But on open it takes the
/// highest-named `snap.*` file, and `snap.<lsn>.generating` sorts after `snap.<lsn>`: a crash
/// before the rename (a SIGKILL during start-up, which writes a snapshot) left a truncated file
/// it then refused as corrupt, and the store never opened again (spacejam/sled#1527). An
/// unfinished snapshot holds nothing the log does not: the complete snapshot before it is still
/// there (or, with none, sled replays the log from its start).
fn remove_unfinished_snapshots(dir: &Path) -> Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => {
            return Err(Error::new(
                SqlState::IO_ERROR,
                format!("metadata store: reading {}: {e}", dir.display()),
            ));
        }
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("snap.") && name.ends_with(".generating") {
            tracing::warn!(file = %entry.path().display(), "removing an unfinished metadata snapshot left by a crash");
            std::fs::remove_file(entry.path()).map_err(|e| {
                Error::new(
                    SqlState::IO_ERROR,
                    format!("metadata store: removing {}: {e}", entry.path().display()),
                )
            })?;
        }
    }
    Ok(())
}

impl MetaStore {
    pub fn open(dir: &Path) -> Result<Self> {
        remove_unfinished_snapshots(dir)?;
        let db = sled::Config::new()
            .path(dir)
            .flush_every_ms(None)
            .open()
            .map_err(|e| meta_error("open", e))?;
        let catalog = db
            .open_tree(CATALOG_TREE)
            .map_err(|e| meta_error("open catalog", e))?;
        let dead_letters = db
            .open_tree(DEAD_LETTERS_TREE)
            .map_err(|e| meta_error("open dead letters", e))?;
        let checkpoints = db
            .open_tree(CHECKPOINTS_TREE)
            .map_err(|e| meta_error("open checkpoints", e))?;
        let sink_progress = db
            .open_tree(SINK_PROGRESS_TREE)
            .map_err(|e| meta_error("open sink progress", e))?;
        let oids = db
            .open_tree(OIDS_TREE)
            .map_err(|e| meta_error("open oids", e))?;
        Ok(MetaStore {
            db,
            catalog,
            dead_letters,
            checkpoints,
            sink_progress,
            oids,
            oid_lock: std::sync::Mutex::new(()),
        })
    }

    /// Stores dead letters durably (before the records around them are acknowledged).
    pub fn put_dead_letters(&self, letters: &[DeadLetter]) -> Result<()> {
        if letters.is_empty() {
            return Ok(());
        }
        let mut batch = sled::Batch::default();
        for letter in letters {
            // Key: object | partition | offset (or a fresh id for records without a position).
            let id = match letter.offset {
                Some(o) => o,
                None => self
                    .db
                    .generate_id()
                    .map_err(|e| meta_error("allocate id", e))?,
            };
            let mut key = Vec::with_capacity(20);
            key.extend_from_slice(&letter.object.0.to_be_bytes());
            key.extend_from_slice(&letter.partition.unwrap_or(u32::MAX).to_be_bytes());
            key.extend_from_slice(&id.to_be_bytes());
            batch.insert(key, letter.encode());
        }
        self.dead_letters
            .apply_batch(batch)
            .map_err(|e| meta_error("write dead letters", e))?;
        self.flush()
    }

    /// Dead letters of `object` (every object when `None`), in object, partition, offset order.
    pub fn dead_letters(
        &self,
        object: Option<ObjectId>,
    ) -> Result<Vec<(DeadLetterKey, DeadLetter)>> {
        let prefix = object
            .map(|o| o.0.to_be_bytes().to_vec())
            .unwrap_or_default();
        let mut out = Vec::new();
        for entry in self.dead_letters.scan_prefix(prefix) {
            let (key, value) = entry.map_err(|e| meta_error("scan dead letters", e))?;
            out.push((
                DeadLetterKey(key.to_vec()),
                DeadLetter::decode(&key, &value)?,
            ));
        }
        Ok(out)
    }

    pub fn delete_dead_letters(&self, keys: &[DeadLetterKey]) -> Result<()> {
        let mut batch = sled::Batch::default();
        for key in keys {
            batch.remove(key.0.as_slice());
        }
        self.dead_letters
            .apply_batch(batch)
            .map_err(|e| meta_error("delete dead letters", e))?;
        self.flush()
    }

    /// A fresh object id, never handed out before in this data directory.
    pub fn allocate_object_id(&self) -> Result<ObjectId> {
        // sled persists its id generator; ids start at 0, we start at 1.
        let id = self
            .db
            .generate_id()
            .map_err(|e| meta_error("allocate id", e))?;
        Ok(ObjectId(id + 1))
    }

    pub fn put_object(&self, id: ObjectId, definition: &[u8]) -> Result<()> {
        self.catalog
            .insert(id.0.to_be_bytes(), definition)
            .map_err(|e| meta_error("write", e))?;
        self.flush()
    }

    pub fn delete_object(&self, id: ObjectId) -> Result<()> {
        self.catalog
            .remove(id.0.to_be_bytes())
            .map_err(|e| meta_error("delete", e))?;
        self.flush()
    }

    /// Every object, in id order (creation order).
    pub fn objects(&self) -> Result<Vec<(ObjectId, Vec<u8>)>> {
        let mut out = Vec::new();
        for entry in self.catalog.iter() {
            let (key, value) = entry.map_err(|e| meta_error("scan", e))?;
            let key: [u8; 8] = key
                .as_ref()
                .try_into()
                .map_err(|_| Error::new(SqlState::DATA_CORRUPTED, "catalog key is not 8 bytes"))?;
            out.push((ObjectId(u64::from_be_bytes(key)), value.to_vec()));
        }
        Ok(out)
    }

    /// The first OID of each object's block of `block` OIDs, allocated (from `first` up, never
    /// reused) and stored the first time an object is asked for, so an object keeps its OIDs
    /// across restarts.
    pub fn object_oids(&self, ids: &[ObjectId], block: u32, first: u32) -> Result<Vec<u32>> {
        let key = |id: ObjectId| id.0.to_be_bytes();
        let read = |bytes: &[u8]| -> Result<u32> {
            let raw: [u8; 4] = bytes
                .try_into()
                .map_err(|_| Error::new(SqlState::DATA_CORRUPTED, "stored OID is not 4 bytes"))?;
            Ok(u32::from_be_bytes(raw))
        };
        let mut out = Vec::with_capacity(ids.len());
        let mut missing = Vec::new();
        for (i, id) in ids.iter().enumerate() {
            match self
                .oids
                .get(key(*id))
                .map_err(|e| meta_error("read oids", e))?
            {
                Some(v) => out.push(read(&v)?),
                None => {
                    out.push(0);
                    missing.push(i);
                }
            }
        }
        if missing.is_empty() {
            return Ok(out);
        }
        let _guard = self.oid_lock.lock().unwrap_or_else(|p| p.into_inner());
        let mut next = match self
            .oids
            .get(NEXT_OID_KEY)
            .map_err(|e| meta_error("read oids", e))?
        {
            Some(v) => read(&v)?,
            None => first,
        };
        let mut batch = sled::Batch::default();
        for i in missing {
            // Another caller may have assigned it while this one waited for the lock.
            if let Some(v) = self
                .oids
                .get(key(ids[i]))
                .map_err(|e| meta_error("read oids", e))?
            {
                out[i] = read(&v)?;
                continue;
            }
            out[i] = next;
            batch.insert(&key(ids[i]), &next.to_be_bytes());
            next = next
                .checked_add(block)
                .ok_or_else(|| Error::new(SqlState::PROGRAM_LIMIT_EXCEEDED, "no OIDs left"))?;
        }
        batch.insert(NEXT_OID_KEY, &next.to_be_bytes());
        self.oids
            .apply_batch(batch)
            .map_err(|e| meta_error("write oids", e))?;
        self.flush()?;
        Ok(out)
    }

    /// Commits a checkpoint's manifest and removes the manifests of `older` checkpoints, in
    /// one atomic write.
    pub fn commit_checkpoint(&self, epoch: u64, manifest: &[u8], older: &[u64]) -> Result<()> {
        let mut batch = sled::Batch::default();
        batch.insert(&epoch.to_be_bytes(), manifest);
        for e in older {
            batch.remove(&e.to_be_bytes());
        }
        self.checkpoints
            .apply_batch(batch)
            .map_err(|e| meta_error("commit a checkpoint", e))?;
        self.flush()
    }

    /// Committed checkpoint manifests, oldest first.
    pub fn checkpoints(&self) -> Result<Vec<(u64, Vec<u8>)>> {
        let mut out = Vec::new();
        for entry in self.checkpoints.iter() {
            let (key, value) = entry.map_err(|e| meta_error("scan checkpoints", e))?;
            let key: [u8; 8] = key.as_ref().try_into().map_err(|_| {
                Error::new(SqlState::DATA_CORRUPTED, "checkpoint key is not 8 bytes")
            })?;
            out.push((u64::from_be_bytes(key), value.to_vec()));
        }
        Ok(out)
    }

    /// Records a sink's progress; `durable`: flushed before returning (else with the next flush).
    pub fn put_sink_progress(&self, sink: ObjectId, progress: &[u8], durable: bool) -> Result<()> {
        self.sink_progress
            .insert(sink.0.to_be_bytes(), progress)
            .map_err(|e| meta_error("write sink progress", e))?;
        if durable { self.flush() } else { Ok(()) }
    }

    pub fn sink_progress(&self, sink: ObjectId) -> Result<Option<Vec<u8>>> {
        Ok(self
            .sink_progress
            .get(sink.0.to_be_bytes())
            .map_err(|e| meta_error("read sink progress", e))?
            .map(|v| v.to_vec()))
    }

    pub fn delete_sink_progress(&self, sink: ObjectId) -> Result<()> {
        self.sink_progress
            .remove(sink.0.to_be_bytes())
            .map_err(|e| meta_error("delete sink progress", e))?;
        self.flush()
    }

    fn flush(&self) -> Result<()> {
        self.db.flush().map_err(|e| meta_error("flush", e))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Opens the store again in the same process: sled's I/O threads may still hold the file
    /// lock of the store just dropped for a moment, so a failed open is retried for up to 10 s.
    fn reopen(dir: &Path) -> MetaStore {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            match MetaStore::open(dir) {
                Ok(meta) => return meta,
                Err(e) if std::time::Instant::now() < deadline && e.message.contains("lock") => {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                Err(e) => panic!("reopening the metadata store: {e:?}"),
            }
        }
    }

    /// A crash while sled writes a snapshot leaves `snap.<lsn>.generating` behind, truncated;
    /// the store must open again, with everything it held.
    #[test]
    fn opens_after_a_crash_while_writing_a_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let id = {
            let meta = MetaStore::open(dir.path()).unwrap();
            let id = meta.allocate_object_id().unwrap();
            meta.put_object(id, b"kept").unwrap();
            id
        };
        // Opening writes a snapshot; find its name and leave a later one half-written.
        drop(reopen(dir.path()));
        let snapshot = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .find(|n| n.starts_with("snap.") && !n.ends_with(".generating"))
            .expect("sled wrote a snapshot");
        let unfinished = dir.path().join(format!("{snapshot}.generating"));
        std::fs::write(&unfinished, b"trunc").unwrap();
        let meta = reopen(dir.path());
        let objects = meta.objects().unwrap();
        assert_eq!(objects, vec![(id, b"kept".to_vec())]);
        assert!(!unfinished.exists());
    }

    #[test]
    fn objects_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = {
            let meta = MetaStore::open(dir.path()).unwrap();
            let a = meta.allocate_object_id().unwrap();
            let b = meta.allocate_object_id().unwrap();
            meta.put_object(a, b"first").unwrap();
            meta.put_object(b, b"second").unwrap();
            meta.delete_object(a).unwrap();
            (a, b)
        };
        let meta = reopen(dir.path());
        assert_eq!(meta.objects().unwrap(), vec![(b, b"second".to_vec())]);
        assert!(meta.allocate_object_id().unwrap() > b);
        assert!(a < b);
    }

    #[test]
    fn oids_are_kept_across_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let first = {
            let meta = MetaStore::open(dir.path()).unwrap();
            let oids = meta
                .object_oids(&[ObjectId(7), ObjectId(3)], 4, 16384)
                .unwrap();
            assert_eq!(oids, vec![16384, 16388]);
            assert_eq!(
                meta.object_oids(&[ObjectId(3)], 4, 16384).unwrap(),
                vec![16388]
            );
            oids
        };
        let meta = reopen(dir.path());
        assert_eq!(
            meta.object_oids(&[ObjectId(3), ObjectId(9), ObjectId(7)], 4, 16384)
                .unwrap(),
            vec![first[1], 16392, first[0]]
        );
    }

    #[test]
    fn dead_letters_are_keyed_by_position() {
        let dir = tempfile::tempdir().unwrap();
        let letter =
            |object: u64, partition: Option<u32>, offset: Option<u64>, raw: &[u8]| DeadLetter {
                object: ObjectId(object),
                partition,
                offset,
                key: None,
                raw: Some(raw.to_vec()),
                error: "bad".into(),
                received_at_micros: 7,
            };
        {
            let meta = MetaStore::open(dir.path()).unwrap();
            meta.put_dead_letters(&[
                letter(1, Some(0), Some(5), b"x"),
                letter(1, None, None, b"y"),
                letter(2, Some(1), Some(0), b"z"),
            ])
            .unwrap();
            // The same record read again after a crash replaces its letter.
            meta.put_dead_letters(&[letter(1, Some(0), Some(5), b"x")])
                .unwrap();
        }
        let meta = reopen(dir.path());
        let all = meta.dead_letters(None).unwrap();
        assert_eq!(all.len(), 3);
        let mine = meta.dead_letters(Some(ObjectId(1))).unwrap();
        assert_eq!(
            mine.iter().map(|(_, l)| l.clone()).collect::<Vec<_>>(),
            vec![
                letter(1, Some(0), Some(5), b"x"),
                letter(1, None, None, b"y")
            ]
        );
        meta.delete_dead_letters(&[mine[0].0.clone()]).unwrap();
        assert_eq!(meta.dead_letters(None).unwrap().len(), 2);
    }

    #[test]
    fn dead_letters_keep_key_and_value_apart() {
        let dir = tempfile::tempdir().unwrap();
        let meta = MetaStore::open(dir.path()).unwrap();
        let tombstone = DeadLetter {
            object: ObjectId(3),
            partition: Some(2),
            offset: Some(9),
            key: Some(b"{bad".to_vec()),
            raw: None,
            error: "bad key".into(),
            received_at_micros: 1,
        };
        let empty = DeadLetter {
            offset: Some(10),
            key: None,
            raw: Some(Vec::new()),
            ..tombstone.clone()
        };
        meta.put_dead_letters(&[tombstone.clone(), empty.clone()])
            .unwrap();
        let stored: Vec<DeadLetter> = meta
            .dead_letters(Some(ObjectId(3)))
            .unwrap()
            .into_iter()
            .map(|(_, l)| l)
            .collect();
        assert_eq!(stored, vec![tombstone, empty]);
    }

    #[test]
    fn letters_stored_before_keys_were_kept_read_as_values() {
        // The layout of a letter written before key and value were stored apart.
        let mut value = 5i64.to_le_bytes().to_vec();
        value.extend_from_slice(&3u64.to_le_bytes());
        value.push(1);
        value.extend_from_slice(&2u32.to_le_bytes());
        value.extend_from_slice(b"no{\"a\":1}");
        let mut key = 1u64.to_be_bytes().to_vec();
        key.extend_from_slice(&0u32.to_be_bytes());
        key.extend_from_slice(&3u64.to_be_bytes());
        let letter = DeadLetter::decode(&key, &value).unwrap();
        assert_eq!(
            (letter.offset, letter.key, letter.raw, letter.error.as_str()),
            (Some(3), None, Some(b"{\"a\":1}".to_vec()), "no")
        );
    }
}
