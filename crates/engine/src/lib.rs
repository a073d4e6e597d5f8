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
mod checkpoint;
mod clock;
mod commit;
use commit::{concat_changes, fill_proctime};
mod copy;
mod dropping;
mod failpoints;
mod ingest;
mod names;
mod pg_objects;
mod plain_views;
mod recovery;
mod retention;
#[cfg(test)]
mod route_tests;
mod schemas;
mod session;
mod session_catalog;
mod sink;
mod sink_ddl;
mod source;
mod system;
mod table;
mod table_chunks;
mod table_ddl;
mod table_log;
#[cfg(test)]
mod table_tests;
#[cfg(test)]
mod time_tests;
mod variables;
mod view_ddl;
mod views;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use arrow::array::{Int64Array, RecordBatch};
use arrow::datatypes::SchemaRef;
use eddy_common::{ChangeBatch, Error, ObjectId, Offset, PartitionId, Result, SqlState};
use eddy_storage::log::{
    LogStore, Write, decode_changes, decode_positions, decode_watermark, encode_changes_at,
    encode_watermark,
};
use eddy_storage::meta::MetaStore;
use tokio::sync::{Mutex, OwnedMutexGuard};

pub use catalog::{TableDef, quote_ident};
pub use copy::{CopyFormat, CopyIn, text_to_array};
pub use eddy_sql::QualifiedName;
pub use eddy_sql::types::{PG_TYPE_KEY, pg_type_name};
pub use eddy_sql::{Parsed, SessionInfo, Statement, Subscribe, parse_statements};
pub use ingest::IngestReport;
pub use session::{Outcome, Session, StatementDescription, SubscriptionStream};
pub use variables::{TimeZone, Variables};
pub use views::BARRIER_INTERVAL;

use catalog::{ObjectDef, ViewDef};
use ingest::ConnectorProgress;
use table::TableData;
use views::{View, ViewRuntime};

/// The PostgreSQL version Eddy reports to drivers, and its own.
pub const PG_VERSION: &str = "15.0";
pub const EDDY_VERSION: &str = env!("CARGO_PKG_VERSION");

pub fn version_string() -> String {
    format!(
        "PostgreSQL {PG_VERSION} (Eddy {EDDY_VERSION}) on {}-linux, a streaming SQL database",
        std::env::consts::ARCH
    )
}

#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub data_dir: PathBuf,
    /// Threads that views' stateful operators are sharded across (by key); 1: no sharding.
    pub workers: usize,
    /// How often views are checkpointed while they change (`None`: only on `CHECKPOINT`).
    pub checkpoint_interval: Option<std::time::Duration>,
    /// Size at which a table partition's log starts a new segment (`None`: the default).
    pub log_segment_bytes: Option<u64>,
    /// Bytes of changes a sink may have waiting (`None`: the default).
    pub sink_buffer_bytes: Option<usize>,
    /// Where time comes from ([`eddy_common::time::system_clock`] but in tests).
    pub clock: Arc<dyn eddy_common::time::Clock>,
    /// How often an epoch ends while changes flow ([`views::BARRIER_INTERVAL`] by default):
    /// shorter lowers the latency of views and subscriptions, at more work per row.
    pub barrier_interval: std::time::Duration,
    /// The most rows of state one operator of a view may hold, unless the view says otherwise
    /// (`WITH (max_state_rows = n)`); `None`: no limit.
    pub max_state_rows: Option<u64>,
    /// The most client connections at once; the next one is refused with 53300.
    pub max_connections: usize,
    /// Bytes of memory the server is held to (`None`: no limit). Views' operator state and
    /// the index of their contents get [`STATE_SHARE_OF_MEMORY`] of it; past that,
    /// arrangements spill their coldest keys to disk (ADR 0012).
    pub memory_limit: Option<u64>,
}

/// Where operator state spills, under the data directory (emptied at every start).
const SPILL_DIR: &str = "spill";

/// The part of [`EngineConfig::memory_limit`] that views' operator state may hold in memory;
/// the rest is left for tables, batches in flight and queries.
pub const STATE_SHARE_OF_MEMORY: f64 = 0.5;

/// [`EngineConfig::max_state_rows`] by default: 100 M rows (a few GB of state in one operator).
pub const MAX_STATE_ROWS: u64 = 100_000_000;
/// [`EngineConfig::max_connections`] by default, as PostgreSQL's.
pub const MAX_CONNECTIONS: usize = 100;

/// A table: its definition, schema and current contents.
pub struct Table {
    pub def: TableDef,
    pub schema: SchemaRef,
    data: RwLock<TableData>,
    /// Round-robin cursor over partitions for writes.
    next_partition: AtomicU64,
    /// How the view runtime tracks this stream's watermark (tables with `WATERMARK FOR`).
    clock: Option<clock::ClockSpec>,
    /// How far its connector has read (restored from the log's records); shared by the
    /// definitions an ALTER TABLE replaces.
    progress: Arc<ConnectorProgress>,
}

/// The watermark clock of a table definition.
fn clock_of(def: &TableDef) -> Result<Option<clock::ClockSpec>> {
    let Some(w) = &def.watermark else {
        return Ok(None);
    };
    let column = def
        .columns
        .iter()
        .position(|c| c.name == w.column)
        .ok_or_else(|| Error::internal("watermark column missing"))?;
    let idle_timeout = match def.options.iter().find(|(k, _)| k == "idle_timeout") {
        Some((_, v)) => Some(std::time::Duration::from_micros(
            eddy_sql::windows::duration_micros(v)?.max(0) as u64,
        )),
        None => None,
    };
    Ok(Some(clock::ClockSpec {
        column,
        delay_micros: eddy_sql::windows::watermark_delay_micros(&w.expr)?,
        partitions: def.partitions,
        idle_timeout,
    }))
}

impl std::fmt::Debug for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Table")
            .field("name", &self.def.qualified().display())
            .finish()
    }
}

impl Table {
    fn read(&self) -> RwLockReadGuard<'_, TableData> {
        self.data.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, TableData> {
        self.data.write().unwrap_or_else(|p| p.into_inner())
    }

    /// The contents as a statement scans them (see [`TableData::scan`]).
    pub(crate) fn scan(&self) -> Result<table::TableScan> {
        self.write().scan()
    }

    /// See [`TableData::lookup`].
    pub(crate) fn lookup(
        &self,
        version: u64,
        key: &[arrow::array::ArrayRef],
    ) -> Result<Option<Vec<RecordBatch>>> {
        self.write().lookup(version, key)
    }

    /// The log partitions one transaction's changes go to: an append-only table's inserts to
    /// the next partition in turn; other tables' rows by a hash of the primary key (or of the
    /// whole row without one), so that every change of a key stays in order in one partition.
    fn route(&self, changes: ChangeBatch, pinned: Option<u32>) -> Result<Vec<(u32, ChangeBatch)>> {
        let n = self.def.partitions.max(1);
        if self.def.append_only || n == 1 {
            let partition = match pinned {
                Some(p) => p % n,
                None => (self.next_partition.fetch_add(1, Ordering::Relaxed) % u64::from(n)) as u32,
            };
            return Ok(vec![(partition, changes)]);
        }
        let key: Vec<usize> = if self.def.primary_key.is_empty() {
            (0..self.schema.fields().len()).collect()
        } else {
            self.def.primary_key.clone()
        };
        let parts = eddy_dataflow::partition_by_key(&changes, &key, n)?;
        Ok(parts
            .into_iter()
            .enumerate()
            .filter(|(_, p)| !p.is_empty())
            .map(|(i, p)| (i as u32, p))
            .collect())
    }
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("tables", &self.table_names())
            .finish()
    }
}

pub struct Engine {
    meta: Arc<MetaStore>,
    data_dir: PathBuf,
    log: Arc<LogStore>,
    tables: RwLock<BTreeMap<QualifiedName, Arc<Table>>>,
    views: RwLock<BTreeMap<QualifiedName, Arc<View>>>,
    sources: RwLock<BTreeMap<QualifiedName, Arc<source::Source>>>,
    /// Plain views (`CREATE VIEW`): named queries, expanded where they are used.
    plain_views: RwLock<BTreeMap<QualifiedName, Arc<plain_views::PlainViewDef>>>,
    /// The schemas made with `CREATE SCHEMA`, by name (`public` and `eddy_catalog` always exist).
    schemas: RwLock<BTreeMap<String, schemas::SchemaDef>>,
    runtime: ViewRuntime,
    checkpoints: Arc<checkpoint::Checkpointer>,
    /// The threads views' sharded operators run on.
    workers: eddy_dataflow::Workers,
    max_state_rows: Option<u64>,
    max_connections: usize,
    /// The budget of views' operator state (and their contents' index), when the server has a
    /// memory limit.
    memory: Option<Arc<eddy_dataflow::spill::MemoryBudget>>,
    /// Views read from the catalog at start-up, planned again by [`Engine::restore_views`].
    stored_views: std::sync::Mutex<Vec<ViewDef>>,
    /// Sinks read from the catalog at start-up, started by [`Engine::restore_views`].
    stored_sinks: std::sync::Mutex<Vec<sink::SinkDef>>,
    sinks: RwLock<BTreeMap<QualifiedName, sink::Sink>>,
    /// Per keyed table partition, the offset its log is compacted to (this run of the server).
    /// Held by a retention/compaction run.
    compacted: tokio::sync::Mutex<HashMap<(ObjectId, u32), u64>>,
    /// Tables whose logs a new view's backfill is reading (retention leaves them alone).
    backfilling: views::Backfilling,
    /// Serializes catalog changes and commits: the order writers pass through here is the order
    /// of the log and of the in-memory contents.
    write_lock: Arc<Mutex<()>>,
    /// `Some(what is happening)` while the server recovers (statements wait for it); `None`
    /// once it may run them.
    recovery: tokio::sync::watch::Sender<Option<recovery::RecoveryStep>>,
    /// The view runtime's idle decisions about tables' watermarks, until
    /// [`Engine::start_background`] takes them to record them as marks.
    mark_requests: std::sync::Mutex<Option<tokio::sync::mpsc::Receiver<(ObjectId, i64)>>>,
    /// What start-up restored each view from (`checkpoint N`, `log`), for `eddy_views`.
    restored_from: RwLock<HashMap<ObjectId, String>>,
    /// Bytes of changes each sink may have waiting ([`sink::SinkFeed`]).
    sink_buffer_bytes: usize,
    /// The sessions connected now (`pg_stat_activity`).
    sessions: pg_objects::Sessions,
    /// When the engine opened, µs since the Unix epoch (`pg_postmaster_start_time()`).
    started_at_micros: i64,
    /// Where time comes from (proctime, received-at times, retention by age).
    pub(crate) clock: Arc<dyn eddy_common::time::Clock>,
}

pub(crate) type WriteGuard = OwnedMutexGuard<()>;

/// What a DROP names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ObjectKind {
    Table,
    MaterializedView,
    Source,
    View,
}

impl Engine {
    /// Opens (or creates) a data directory, rebuilding every table from its log.
    pub fn open(config: &EngineConfig) -> Result<Arc<Engine>> {
        let dir = &config.data_dir;
        std::fs::create_dir_all(dir).map_err(|e| Error::io("create the data directory", e))?;
        let meta = Arc::new(MetaStore::open(&dir.join("meta"))?);
        let mut defs = Vec::new();
        let mut view_defs = Vec::new();
        let mut sink_defs = Vec::new();
        let mut sources = BTreeMap::new();
        let mut plain_views = BTreeMap::new();
        let mut schemas = BTreeMap::new();
        for (id, bytes) in meta.objects()? {
            let object = ObjectDef::decode(&bytes)?;
            let named = object.id();
            if named != id {
                return Err(Error::new(
                    SqlState::DATA_CORRUPTED,
                    format!("catalog entry {id} names object id {named}"),
                ));
            }
            match object {
                ObjectDef::Table(def) => defs.push(def),
                ObjectDef::MaterializedView(def) => view_defs.push(def),
                ObjectDef::Sink(def) => sink_defs.push(def),
                ObjectDef::Source(def) => {
                    sources.insert(def.table.qualified(), Arc::new(source::Source::new(def)?));
                }
                ObjectDef::View(def) => {
                    plain_views.insert(def.qualified(), Arc::new(def));
                }
                ObjectDef::Schema(def) => {
                    schemas.insert(def.name.clone(), def);
                }
            }
        }
        let log_objects: Vec<(ObjectId, u32)> = defs.iter().map(|d| (d.id, d.partitions)).collect();
        let log = LogStore::open_with(
            &dir.join("log"),
            &log_objects,
            config
                .log_segment_bytes
                .unwrap_or(eddy_common::limits::LOG_SEGMENT_BYTES_TARGET),
        )?;
        let memory = match config.memory_limit {
            Some(limit) => Some(eddy_dataflow::spill::MemoryBudget::new(
                (limit as f64 * STATE_SHARE_OF_MEMORY) as usize,
                &dir.join(SPILL_DIR),
            )?),
            None => {
                eddy_dataflow::spill::empty_spill_dir(&dir.join(SPILL_DIR))?;
                None
            }
        };
        let mut tables = BTreeMap::new();
        let mut clocks = Vec::new();
        for def in defs {
            let (table, clock) = load_table(&log, def, memory.as_ref())?;
            clocks.extend(clock.map(|c| (table.def.id, c)));
            tables.insert(table.def.qualified(), table);
        }
        let checkpoints = Arc::new(checkpoint::Checkpointer::start(dir, Arc::clone(&meta))?);
        let (marks, mark_requests) =
            tokio::sync::mpsc::channel(eddy_common::limits::WATERMARK_MARKS_IN_FLIGHT_MAX);
        let runtime = ViewRuntime::start(
            Some(views::Checkpoints {
                writer: Arc::clone(&checkpoints),
                interval: config.checkpoint_interval,
                workers: config.workers.max(1),
            }),
            Some(marks),
            Arc::clone(&config.clock),
            config.barrier_interval,
            Some(dir.clone()),
            memory.clone(),
        )?;
        runtime.seed_clocks(clocks)?;
        Ok(Arc::new(Engine {
            meta,
            data_dir: dir.clone(),
            log,
            tables: RwLock::new(tables),
            views: RwLock::new(BTreeMap::new()),
            sources: RwLock::new(sources),
            plain_views: RwLock::new(plain_views),
            schemas: RwLock::new(schemas),
            runtime,
            checkpoints,
            workers: eddy_dataflow::Workers::new(config.workers)?,
            max_state_rows: config.max_state_rows,
            max_connections: config.max_connections,
            memory,
            stored_views: std::sync::Mutex::new(view_defs),
            stored_sinks: std::sync::Mutex::new(sink_defs),
            sinks: RwLock::new(BTreeMap::new()),
            compacted: tokio::sync::Mutex::new(HashMap::new()),
            backfilling: views::Backfilling::default(),
            recovery: tokio::sync::watch::Sender::new(None),
            mark_requests: std::sync::Mutex::new(Some(mark_requests)),
            restored_from: RwLock::new(HashMap::new()),
            sink_buffer_bytes: config
                .sink_buffer_bytes
                .unwrap_or(eddy_common::limits::SINK_BUFFER_BYTES),
            sessions: pg_objects::Sessions::new(Arc::clone(&config.clock)),
            started_at_micros: config.clock.now_micros(),
            clock: Arc::clone(&config.clock),
            write_lock: Arc::new(Mutex::new(())),
        }))
    }

    /// Stops accepting writes after answering those queued; the data stays consistent.
    pub fn shutdown(&self) {
        self.log.shutdown();
        self.runtime.shutdown();
        self.checkpoints.shutdown();
    }

    /// Ends the epoch and checkpoints every view (`CHECKPOINT`); returns the checkpoint's epoch
    /// once it is committed.
    pub async fn checkpoint(&self) -> Result<u64> {
        let epoch = self
            .runtime
            .checkpoint()?
            .await
            .map_err(|_| Error::internal("the view runtime stopped"))??;
        self.enforce_retention(true).await?;
        Ok(epoch)
    }

    /// The committed checkpoints (`eddy_checkpoints`).
    pub(crate) fn checkpoint_list(&self) -> Result<Vec<checkpoint::CheckpointInfo>> {
        checkpoint::list(&self.meta)
    }

    pub fn table(&self, name: &QualifiedName) -> Option<Arc<Table>> {
        self.tables
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .cloned()
    }

    pub(crate) fn tables(&self) -> Vec<Arc<Table>> {
        self.tables
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// The offset the next record of a table partition gets.
    pub(crate) fn log_end(&self, table: ObjectId, partition: u32) -> Result<u64> {
        Ok(self.log.end_offset(table, PartitionId(partition))?.0)
    }

    /// The tables, in every schema.
    pub fn table_names(&self) -> Vec<QualifiedName> {
        self.tables
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .cloned()
            .collect()
    }

    pub(crate) fn view(&self, name: &QualifiedName) -> Option<Arc<View>> {
        self.views
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .cloned()
    }

    /// The materialized views, in every schema.
    pub fn view_names(&self) -> Vec<QualifiedName> {
        self.views
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .cloned()
            .collect()
    }

    /// Whether any object (a relation or a sink) has this name.
    fn name_taken(&self, name: &QualifiedName) -> bool {
        self.table(name).is_some()
            || self.view(name).is_some()
            || self.source(name).is_some()
            || self.plain_view(name).is_some()
            || self
                .sinks
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .contains_key(name)
    }

    /// Waits until every view reflects everything committed before the call.
    pub async fn flush(&self) -> Result<u64> {
        self.runtime.flush().await
    }

    pub(crate) fn runtime(&self) -> &ViewRuntime {
        &self.runtime
    }

    /// Applies tables' retention every [`retention::RETENTION_INTERVAL`] from now on, and
    /// records the view runtime's idle decisions about watermarks in the tables' logs.
    pub fn start_background(self: &Arc<Self>) {
        if let Some(mut requests) = self
            .mark_requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            let engine = Arc::downgrade(self);
            tokio::spawn(async move {
                while let Some((object, watermark)) = requests.recv().await {
                    let Some(engine) = engine.upgrade() else {
                        return;
                    };
                    if let Err(e) = engine.commit_watermark(object, watermark).await {
                        tracing::error!(error = %e, "recording a watermark in a table's log failed");
                    }
                }
            });
        }
        let engine = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(retention::RETENTION_INTERVAL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(engine) = engine.upgrade() else {
                    return;
                };
                // On a blocking thread: compaction reads and rewrites log segments.
                let handle = tokio::runtime::Handle::current();
                let run = tokio::task::spawn_blocking(move || {
                    handle.block_on(engine.enforce_retention(false))
                });
                match run.await {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => tracing::error!(error = %e, "applying retention failed"),
                    Err(e) => tracing::error!(error = %e, "applying retention panicked"),
                }
            }
        });
    }

    /// Records that `object`'s watermark rose to `watermark` for a reason its data does not
    /// show (an idle partition) as a mark in partition 0 of its log, and hands the mark to the
    /// view runtime in commit order: replays and later backfills meet it at the same place.
    async fn commit_watermark(&self, object: ObjectId, watermark: i64) -> Result<()> {
        let guard = self.lock_writes().await;
        let Some(table) = self.table_by_id(object) else {
            return Ok(());
        };
        let payload = encode_watermark(&table.schema, watermark)?;
        let ticket = self.log.commit(vec![Write {
            object,
            partition: PartitionId(0),
            payload,
        }]);
        self.runtime.watermark(object, watermark)?;
        drop(guard);
        ticket
            .await
            .map_err(|_| Error::internal("the log committer stopped without answering"))?
            .map(|_| ())
    }

    /// The current table with this id (a table is replaced when its definition changes).
    pub(crate) fn table_by_id(&self, id: ObjectId) -> Option<Arc<Table>> {
        self.tables
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .find(|t| t.def.id == id)
            .cloned()
    }
}

/// A table as its log holds it, with its watermark clock as the log ends (tables with a
/// `WATERMARK FOR`): the watermark a restart goes on from. Its rows are kept within `memory`
/// (the server's budget, when it has one) as they are read.
fn load_table(
    log: &Arc<LogStore>,
    def: TableDef,
    memory: Option<&Arc<eddy_dataflow::spill::MemoryBudget>>,
) -> Result<(Arc<Table>, Option<clock::StreamClock>)> {
    let schema = def.schema()?;
    let clock = clock_of(&def)?;
    let mut stream_clock = clock.map(clock::StreamClock::replaying);
    let (data, positions) = load_contents_with(log, &def, &schema, stream_clock.as_mut(), memory)?;
    // Live, the clock judges idleness by the wall clock again.
    if let (Some(c), Some(spec)) = (stream_clock.as_mut(), clock) {
        c.spec = spec;
    }
    let table = Arc::new(Table {
        def,
        schema,
        data: RwLock::new(data),
        next_partition: AtomicU64::new(0),
        clock,
        progress: Arc::new(ConnectorProgress::at(positions)),
    });
    Ok((table, stream_clock))
}

/// A table's contents as its log holds them, and (for a table fed by a connector) the source
/// position each source partition was read to.
#[cfg(test)]
fn load_contents(
    log: &Arc<LogStore>,
    def: &TableDef,
    schema: &SchemaRef,
) -> Result<(TableData, Vec<(u32, u64)>)> {
    load_contents_with(log, def, schema, None, None)
}

/// [`load_contents`], also raising `clock` with every record's data and watermark marks.
fn load_contents_with(
    log: &Arc<LogStore>,
    def: &TableDef,
    schema: &SchemaRef,
    mut clock: Option<&mut clock::StreamClock>,
    memory: Option<&Arc<eddy_dataflow::spill::MemoryBudget>>,
) -> Result<(TableData, Vec<(u32, u64)>)> {
    // An append-only table's rows stay in its log: only counted here.
    let mut data = (!def.append_only)
        .then(|| TableData::new(def, Arc::clone(schema)).map(|d| d.within(memory)))
        .transpose()?;
    let mut appended = 0usize;
    let mut records = 0u64;
    // Per source partition: the position written by the latest transaction.
    let mut positions: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
    let fed = def.option("connector").is_some();
    for p in 0..def.partitions {
        log.scan(def.id, PartitionId(p), Offset(0), |_, record| {
            let record_watermark = decode_watermark(&record.payload)?;
            let changes = decode_changes(&record.payload, schema)?;
            if let Some(clock) = clock.as_deref_mut() {
                // The final value does not depend on the order partitions are read in: each
                // partition's value only rises, and marks only raise the merged one.
                match record_watermark {
                    Some(w) => {
                        clock.mark(w);
                    }
                    None => {
                        clock.observe(p, &changes, std::time::Instant::now())?;
                    }
                }
            }
            match data.as_mut() {
                Some(data) => data.apply(&changes)?,
                None => appended += changes.iter().map(ChangeBatch::len).sum::<usize>(),
            }
            if fed {
                for (p, offset) in decode_positions(&record.payload)? {
                    let slot = positions.entry(p).or_insert((record.txn_id.0, offset));
                    if record.txn_id.0 >= slot.0 {
                        *slot = (record.txn_id.0, offset);
                    }
                }
            }
            records += 1;
            Ok(())
        })?;
    }
    let data = match data {
        Some(data) => data,
        None => TableData::logged(def, Arc::clone(schema), log, appended)?,
    };
    tracing::info!(table = %def.qualified().display(), records, rows = data.row_count(), "table restored from its log");
    Ok((
        data,
        positions.into_iter().map(|(p, (_, o))| (p, o)).collect(),
    ))
}
