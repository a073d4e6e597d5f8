//! The metadata store: the catalog of objects, kept in sled under `<data-dir>/meta`.
//!
//! sled holds small, transactional data only (catalog entries, later checkpoint manifests and
//! source offsets); bulk data lives in the log's own files. Entries are opaque bytes here: the
//! engine owns their encoding. Every mutation is flushed before it returns.

use std::path::Path;

use eddy_common::{Error, ObjectId, Result, SqlState};

const CATALOG_TREE: &str = "catalog";
const DEAD_LETTERS_TREE: &str = "dead_letters";

/// The catalog (object id -> encoded definition) and the dead letters of ingestion.
pub struct MetaStore {
    db: sled::Db,
    catalog: sled::Tree,
    dead_letters: sled::Tree,
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
    pub raw: Vec<u8>,
    pub error: String,
    pub received_at_micros: i64,
}

impl DeadLetter {
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(30 + self.error.len() + self.raw.len());
        out.extend_from_slice(&self.received_at_micros.to_le_bytes());
        out.extend_from_slice(&self.offset.map_or(u64::MAX, |o| o).to_le_bytes());
        out.push(u8::from(self.offset.is_some()));
        out.extend_from_slice(&(self.error.len() as u32).to_le_bytes());
        out.extend_from_slice(self.error.as_bytes());
        out.extend_from_slice(&self.raw);
        out
    }

    fn decode(key: &[u8], value: &[u8]) -> Result<Self> {
        let corrupt = || Error::new(SqlState::DATA_CORRUPTED, "unreadable dead letter");
        if key.len() != 20 || value.len() < 21 {
            return Err(corrupt());
        }
        let u64_at = |b: &[u8], at: usize| b.get(at..at + 8).and_then(|s| s.try_into().ok()).map(u64::from_be_bytes);
        let object = ObjectId(u64_at(key, 0).ok_or_else(corrupt)?);
        let partition = u32::from_be_bytes(key[8..12].try_into().map_err(|_| corrupt())?);
        let le64 = |at: usize| value.get(at..at + 8).and_then(|s| s.try_into().ok()).map(u64::from_le_bytes).ok_or_else(corrupt);
        let received_at_micros = le64(0)? as i64;
        let offset = (value[16] == 1).then_some(le64(8)?);
        let error_len = u32::from_le_bytes(value[17..21].try_into().map_err(|_| corrupt())?) as usize;
        let error = value.get(21..21 + error_len).ok_or_else(corrupt)?;
        Ok(DeadLetter {
            object,
            partition: (partition != u32::MAX).then_some(partition),
            offset,
            raw: value[21 + error_len..].to_vec(),
            error: String::from_utf8_lossy(error).into_owned(),
            received_at_micros,
        })
    }
}

/// Identifies a stored dead letter (to remove it once replayed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterKey(Vec<u8>);

fn meta_error(context: &str, err: sled::Error) -> Error {
    Error::new(SqlState::IO_ERROR, format!("metadata store: {context}: {err}"))
}

impl MetaStore {
    pub fn open(dir: &Path) -> Result<Self> {
        let db = sled::Config::new()
            .path(dir)
            .flush_every_ms(None)
            .open()
            .map_err(|e| meta_error("open", e))?;
        let catalog = db.open_tree(CATALOG_TREE).map_err(|e| meta_error("open catalog", e))?;
        let dead_letters = db.open_tree(DEAD_LETTERS_TREE).map_err(|e| meta_error("open dead letters", e))?;
        Ok(MetaStore { db, catalog, dead_letters })
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
                None => self.db.generate_id().map_err(|e| meta_error("allocate id", e))?,
            };
            let mut key = Vec::with_capacity(20);
            key.extend_from_slice(&letter.object.0.to_be_bytes());
            key.extend_from_slice(&letter.partition.unwrap_or(u32::MAX).to_be_bytes());
            key.extend_from_slice(&id.to_be_bytes());
            batch.insert(key, letter.encode());
        }
        self.dead_letters.apply_batch(batch).map_err(|e| meta_error("write dead letters", e))?;
        self.flush()
    }

    /// Dead letters of `object` (every object when `None`), in object, partition, offset order.
    pub fn dead_letters(&self, object: Option<ObjectId>) -> Result<Vec<(DeadLetterKey, DeadLetter)>> {
        let prefix = object.map(|o| o.0.to_be_bytes().to_vec()).unwrap_or_default();
        let mut out = Vec::new();
        for entry in self.dead_letters.scan_prefix(prefix) {
            let (key, value) = entry.map_err(|e| meta_error("scan dead letters", e))?;
            out.push((DeadLetterKey(key.to_vec()), DeadLetter::decode(&key, &value)?));
        }
        Ok(out)
    }

    pub fn delete_dead_letters(&self, keys: &[DeadLetterKey]) -> Result<()> {
        let mut batch = sled::Batch::default();
        for key in keys {
            batch.remove(key.0.as_slice());
        }
        self.dead_letters.apply_batch(batch).map_err(|e| meta_error("delete dead letters", e))?;
        self.flush()
    }

    /// A fresh object id, never handed out before in this data directory.
    pub fn allocate_object_id(&self) -> Result<ObjectId> {
        // sled persists its id generator; ids start at 0, we start at 1.
        let id = self.db.generate_id().map_err(|e| meta_error("allocate id", e))?;
        Ok(ObjectId(id + 1))
    }

    pub fn put_object(&self, id: ObjectId, definition: &[u8]) -> Result<()> {
        self.catalog.insert(id.0.to_be_bytes(), definition).map_err(|e| meta_error("write", e))?;
        self.flush()
    }

    pub fn delete_object(&self, id: ObjectId) -> Result<()> {
        self.catalog.remove(id.0.to_be_bytes()).map_err(|e| meta_error("delete", e))?;
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

    fn flush(&self) -> Result<()> {
        self.db.flush().map_err(|e| meta_error("flush", e))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let meta = MetaStore::open(dir.path()).unwrap();
        assert_eq!(meta.objects().unwrap(), vec![(b, b"second".to_vec())]);
        assert!(meta.allocate_object_id().unwrap() > b);
        assert!(a < b);
    }

    #[test]
    fn dead_letters_are_keyed_by_position() {
        let dir = tempfile::tempdir().unwrap();
        let letter = |object: u64, partition: Option<u32>, offset: Option<u64>, raw: &[u8]| DeadLetter {
            object: ObjectId(object),
            partition,
            offset,
            raw: raw.to_vec(),
            error: "bad".into(),
            received_at_micros: 7,
        };
        {
            let meta = MetaStore::open(dir.path()).unwrap();
            meta.put_dead_letters(&[letter(1, Some(0), Some(5), b"x"), letter(1, None, None, b"y"), letter(2, Some(1), Some(0), b"z")]).unwrap();
            // The same record read again after a crash replaces its letter.
            meta.put_dead_letters(&[letter(1, Some(0), Some(5), b"x")]).unwrap();
        }
        let meta = MetaStore::open(dir.path()).unwrap();
        let all = meta.dead_letters(None).unwrap();
        assert_eq!(all.len(), 3);
        let mine = meta.dead_letters(Some(ObjectId(1))).unwrap();
        assert_eq!(mine.iter().map(|(_, l)| l.clone()).collect::<Vec<_>>(), vec![letter(1, Some(0), Some(5), b"x"), letter(1, None, None, b"y")]);
        meta.delete_dead_letters(&[mine[0].0.clone()]).unwrap();
        assert_eq!(meta.dead_letters(None).unwrap().len(), 2);
    }
}
