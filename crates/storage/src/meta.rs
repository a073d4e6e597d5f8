//! The metadata store: the catalog of objects, kept in sled under `<data-dir>/meta`.
//!
//! sled holds small, transactional data only (catalog entries, later checkpoint manifests and
//! source offsets); bulk data lives in the log's own files. Entries are opaque bytes here: the
//! engine owns their encoding. Every mutation is flushed before it returns.

use std::path::Path;

use eddy_common::{Error, ObjectId, Result, SqlState};

const CATALOG_TREE: &str = "catalog";

/// The catalog: object id -> encoded definition.
pub struct MetaStore {
    db: sled::Db,
    catalog: sled::Tree,
}

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
        Ok(MetaStore { db, catalog })
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
}
