//! The database as a library: catalog operations, DML turned into changes on the log, table
//! contents rebuilt from the log, and sessions that run statements.
//!
//! Entry points: [`Engine::open`] for a data directory and [`Session`] per client. The path of
//! a write: a statement is planned into rows to insert and rows to retract ([`ChangeBatch`]es),
//! checked against the table's contents (keys, NOT NULL, concurrent changes), queued on the log
//! under the engine's write lock (so log order is apply order), applied in memory, and
//! acknowledged once the log's group commit has made it durable.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod catalog;
mod copy;
mod session;
mod table;
mod variables;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use arrow::array::{Int64Array, RecordBatch};
use arrow::datatypes::SchemaRef;
use eddy_common::{ChangeBatch, Error, ObjectId, Offset, PartitionId, Result, SqlState};
use eddy_storage::log::{LogStore, Write, decode_changes, encode_changes};
use eddy_storage::meta::MetaStore;
use tokio::sync::{Mutex, OwnedMutexGuard};

pub use catalog::{TableDef, quote_ident};
pub use copy::{CopyFormat, CopyIn, text_to_array};
pub use eddy_sql::types::{PG_TYPE_KEY, pg_type_name};
pub use eddy_sql::{Parsed, SessionInfo, Statement, parse_statements};
pub use session::{Outcome, Session, StatementDescription};
pub use variables::{TimeZone, Variables};

use catalog::ObjectDef;
use table::TableData;

/// The PostgreSQL version Eddy reports to drivers, and its own.
pub const PG_VERSION: &str = "15.0";
pub const EDDY_VERSION: &str = env!("CARGO_PKG_VERSION");

pub fn version_string() -> String {
    format!("PostgreSQL {PG_VERSION} (Eddy {EDDY_VERSION}) on {}-linux, a streaming SQL database", std::env::consts::ARCH)
}

#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub data_dir: PathBuf,
}

/// A table: its definition, schema and current contents.
pub struct Table {
    pub def: TableDef,
    pub schema: SchemaRef,
    data: RwLock<TableData>,
    /// Round-robin cursor over partitions for writes.
    next_partition: AtomicU64,
}

impl Table {
    fn read(&self) -> RwLockReadGuard<'_, TableData> {
        self.data.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, TableData> {
        self.data.write().unwrap_or_else(|p| p.into_inner())
    }

    pub fn snapshot(&self) -> Result<Arc<Vec<RecordBatch>>> {
        self.write().snapshot()
    }
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").field("tables", &self.table_names()).finish()
    }
}

pub struct Engine {
    meta: MetaStore,
    log: Arc<LogStore>,
    tables: RwLock<BTreeMap<String, Arc<Table>>>,
    /// Serializes catalog changes and commits: the order writers pass through here is the order
    /// of the log and of the in-memory contents.
    write_lock: Arc<Mutex<()>>,
}

pub(crate) type WriteGuard = OwnedMutexGuard<()>;

impl Engine {
    /// Opens (or creates) a data directory, rebuilding every table from its log.
    pub fn open(config: &EngineConfig) -> Result<Arc<Engine>> {
        let dir = &config.data_dir;
        std::fs::create_dir_all(dir).map_err(|e| Error::io("create the data directory", e))?;
        let meta = MetaStore::open(&dir.join("meta"))?;
        let mut defs = Vec::new();
        for (id, bytes) in meta.objects()? {
            match ObjectDef::decode(&bytes)? {
                ObjectDef::Table(def) if def.id == id => defs.push(def),
                ObjectDef::Table(def) => {
                    return Err(Error::new(SqlState::DATA_CORRUPTED, format!("catalog entry {id} names table id {}", def.id)));
                }
            }
        }
        let log_objects: Vec<(ObjectId, u32)> = defs.iter().map(|d| (d.id, d.partitions)).collect();
        let log = LogStore::open(&dir.join("log"), &log_objects)?;
        let mut tables = BTreeMap::new();
        for def in defs {
            let table = load_table(&log, def)?;
            tables.insert(table.def.name.clone(), table);
        }
        Ok(Arc::new(Engine { meta, log, tables: RwLock::new(tables), write_lock: Arc::new(Mutex::new(())) }))
    }

    /// Stops accepting writes after answering those queued; the data stays consistent.
    pub fn shutdown(&self) {
        self.log.shutdown();
    }

    pub fn table(&self, name: &str) -> Option<Arc<Table>> {
        self.tables.read().unwrap_or_else(|p| p.into_inner()).get(name).cloned()
    }

    pub fn table_names(&self) -> Vec<String> {
        self.tables.read().unwrap_or_else(|p| p.into_inner()).keys().cloned().collect()
    }

    pub(crate) async fn lock_writes(&self) -> WriteGuard {
        Arc::clone(&self.write_lock).lock_owned().await
    }

    pub(crate) async fn create_table(&self, create: &eddy_sql::CreateTable) -> Result<bool> {
        let _guard = self.lock_writes().await;
        let name = catalog::object_name(&create.name)?;
        if self.table(&name).is_some() {
            if create.if_not_exists {
                return Ok(false);
            }
            return Err(Error::new(SqlState::DUPLICATE_TABLE, format!("relation \"{name}\" already exists")));
        }
        let id = self.meta.allocate_object_id()?;
        let def = catalog::bind_create_table(create, id)?;
        let schema = def.schema()?;
        // The log first: a crash before the catalog entry leaves an orphan the next start removes.
        self.log.create_object(id, def.partitions)?;
        self.meta.put_object(id, &ObjectDef::Table(def.clone()).encode()?)?;
        let data = TableData::new(&def, Arc::clone(&schema))?;
        let table = Arc::new(Table { def, schema, data: RwLock::new(data), next_partition: AtomicU64::new(0) });
        self.tables.write().unwrap_or_else(|p| p.into_inner()).insert(name, table);
        Ok(true)
    }

    /// Drops tables; returns how many existed. Nothing depends on tables yet, so CASCADE and
    /// RESTRICT behave alike.
    pub(crate) async fn drop_tables(&self, names: &[String], if_exists: bool) -> Result<()> {
        let _guard = self.lock_writes().await;
        for name in names {
            if self.table(name).is_none() && !if_exists {
                return Err(Error::new(SqlState::UNDEFINED_TABLE, format!("table \"{name}\" does not exist")));
            }
        }
        for name in names {
            let Some(table) = self.table(name) else { continue };
            // The catalog first: a crash before the log is removed leaves an orphan log that
            // the next start deletes.
            self.meta.delete_object(table.def.id)?;
            self.tables.write().unwrap_or_else(|p| p.into_inner()).remove(name);
            self.log.drop_object(table.def.id)?;
        }
        Ok(())
    }

    /// Checks, logs and applies one transaction's changes. Takes the write guard and releases
    /// it as soon as the commit is queued, so that other writers join the same group commit;
    /// returns once the commit is durable.
    pub(crate) async fn commit(&self, guard: WriteGuard, writes: Vec<(Arc<Table>, Vec<ChangeBatch>)>) -> Result<()> {
        let writes: Vec<_> = writes.into_iter().filter(|(_, c)| c.iter().any(|b| !b.is_empty())).collect();
        if writes.is_empty() {
            return Ok(());
        }
        let mut log_writes = Vec::with_capacity(writes.len());
        for (table, changes) in &writes {
            if self.table(&table.def.name).is_none_or(|t| t.def.id != table.def.id) {
                return Err(Error::new(SqlState::UNDEFINED_TABLE, format!("table \"{}\" was dropped", table.def.name)));
            }
            table.read().check(changes)?;
            let merged = concat_changes(&table.schema, changes)?;
            // Inserts into an append-only table may land in any partition; a mutable table's
            // retractions must replay after the inserts they cancel, so it writes partition 0
            // until key-hash routing (with per-key order) arrives.
            let partition = if table.def.append_only {
                table.next_partition.fetch_add(1, Ordering::Relaxed) % u64::from(table.def.partitions)
            } else {
                0
            };
            log_writes.push(Write {
                object: table.def.id,
                partition: PartitionId(partition as u32),
                payload: encode_changes(&merged)?,
            });
        }
        let ticket = self.log.commit(log_writes);
        for (table, changes) in &writes {
            table.write().apply(changes)?;
        }
        drop(guard);
        ticket
            .await
            .map_err(|_| Error::internal("the log committer stopped without answering"))?
            .map(|_| ())
    }
}

fn concat_changes(schema: &SchemaRef, changes: &[ChangeBatch]) -> Result<ChangeBatch> {
    if let [one] = changes {
        return Ok(one.clone());
    }
    let rows: Vec<&RecordBatch> = changes.iter().map(|c| c.rows()).collect();
    let rows = arrow::compute::concat_batches(schema, rows)
        .map_err(|e| Error::internal(format!("concatenating changes: {e}")))?;
    let diffs: Vec<i64> = changes.iter().flat_map(|c| c.diffs().values().iter().copied()).collect();
    Ok(ChangeBatch::new(rows, Int64Array::from(diffs)))
}

fn load_table(log: &LogStore, def: TableDef) -> Result<Arc<Table>> {
    let schema = def.schema()?;
    let mut data = TableData::new(&def, Arc::clone(&schema))?;
    let mut records = 0u64;
    for p in 0..def.partitions {
        log.scan(def.id, PartitionId(p), Offset(0), |_, record| {
            let changes = decode_changes(&record.payload, &schema)?;
            data.apply(&changes)?;
            records += 1;
            Ok(())
        })?;
    }
    tracing::info!(table = %def.name, records, rows = data.row_count(), "table restored from its log");
    Ok(Arc::new(Table { def, schema, data: RwLock::new(data), next_partition: AtomicU64::new(0) }))
}

/// The data directory's layout, for operators and tests.
pub fn log_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("log")
}
