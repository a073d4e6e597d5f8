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
mod copy;
mod dropping;
mod failpoints;
mod ingest;
mod names;
mod pg_objects;
mod plain_views;
mod recovery;
mod retention;
mod schemas;
mod session;
mod session_catalog;
mod sink;
mod source;
mod system;
mod table;
mod variables;
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
}

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
    /// Views read from the catalog at start-up, planned again by [`Engine::restore_views`].
    stored_views: std::sync::Mutex<Vec<ViewDef>>,
    /// Sinks read from the catalog at start-up, started by [`Engine::restore_views`].
    stored_sinks: std::sync::Mutex<Vec<sink::SinkDef>>,
    sinks: RwLock<BTreeMap<QualifiedName, sink::Sink>>,
    /// Per keyed table partition, the offset its log is compacted to (this run of the server).
    /// Held by a retention/compaction run.
    compacted: tokio::sync::Mutex<HashMap<(ObjectId, u32), u64>>,
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
        let mut tables = BTreeMap::new();
        let mut clocks = Vec::new();
        for def in defs {
            let (table, clock) = load_table(&log, def)?;
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
            stored_views: std::sync::Mutex::new(view_defs),
            stored_sinks: std::sync::Mutex::new(sink_defs),
            sinks: RwLock::new(BTreeMap::new()),
            compacted: tokio::sync::Mutex::new(HashMap::new()),
            recovery: tokio::sync::watch::Sender::new(None),
            mark_requests: std::sync::Mutex::new(Some(mark_requests)),
            restored_from: RwLock::new(HashMap::new()),
            sink_buffer_bytes: config
                .sink_buffer_bytes
                .unwrap_or(eddy_common::limits::SINK_BUFFER_BYTES),
            sessions: pg_objects::Sessions::default(),
            started_at_micros: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_micros() as i64),
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
        self.enforce_retention().await?;
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

    /// Creates a sink writing out materialized view `view` (its columns and key given), and
    /// starts it from the view's contents.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn create_sink(
        self: &Arc<Self>,
        name: QualifiedName,
        view: &QualifiedName,
        options: Vec<(String, String)>,
        format: Option<(String, String)>,
        sql: String,
        key: Vec<usize>,
        if_not_exists: bool,
    ) -> Result<()> {
        let guard = self.lock_writes().await;
        if self.name_taken(&name) {
            if if_not_exists
                && self
                    .sinks
                    .read()
                    .unwrap_or_else(|p| p.into_inner())
                    .contains_key(&name)
            {
                return Ok(());
            }
            return Err(Error::new(
                SqlState::DUPLICATE_TABLE,
                format!("relation \"{}\" already exists", name.name),
            ));
        }
        let view = self.view(view).ok_or_else(|| {
            Error::new(
                SqlState::UNDEFINED_TABLE,
                format!("materialized view \"{}\" does not exist", view.display()),
            )
        })?;
        sink::SinkDef::validate(&options, format.as_ref())?;
        let columns = view
            .schema
            .fields()
            .iter()
            .map(|f| (f.name().clone(), eddy_sql::types::pg_type_name(f)))
            .collect();
        let def = sink::SinkDef {
            id: self.meta.allocate_object_id()?,
            schema: name.schema.clone(),
            name: name.name.clone(),
            view: view.def.id,
            options,
            format,
            sql,
            key,
            columns,
        };
        let (sink, _, feed) = sink::Sink::start(
            def.clone(),
            true,
            Arc::clone(&self.meta),
            self.sink_buffer_bytes,
        )
        .await?;
        self.meta
            .put_object(def.id, &ObjectDef::Sink(def.clone()).encode()?)?;
        self.runtime.add_sink(def.id, def.view, None, feed).await?;
        self.sinks
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name, sink);
        drop(guard);
        Ok(())
    }

    /// Start-up: starts the stored sinks of the views `ready` (their progress decides what
    /// they write first; see `sink.rs`). A sink whose target cannot be reached is listed with
    /// its error and started in the background once it can be.
    async fn start_stored_sinks(self: &Arc<Self>, ready: impl Fn(ObjectId) -> bool) -> Result<()> {
        let defs: Vec<sink::SinkDef> = {
            let mut stored = self.stored_sinks.lock().unwrap_or_else(|p| p.into_inner());
            let (now, later): (Vec<_>, Vec<_>) = stored.drain(..).partition(|d| ready(d.view));
            *stored = later;
            now
        };
        for def in defs {
            let name = def.qualified();
            match self.start_stored_sink(&def).await {
                Ok(sink) => {
                    self.sinks
                        .write()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(name, sink);
                }
                Err(e) => {
                    tracing::error!(sink = %name.display(), error = %e, "starting a sink failed; retrying in the background");
                    let retry =
                        tokio::spawn(Self::start_sink_later(Arc::downgrade(self), def.clone()));
                    self.sinks
                        .write()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(name, sink::Sink::waiting(def, e.message, retry));
                }
            }
        }
        Ok(())
    }

    /// Starts a stored sink (its progress decides what it writes first) and hands it its view.
    async fn start_stored_sink(&self, def: &sink::SinkDef) -> Result<sink::Sink> {
        let (sink, resume, feed) = sink::Sink::start(
            def.clone(),
            false,
            Arc::clone(&self.meta),
            self.sink_buffer_bytes,
        )
        .await?;
        self.runtime
            .add_sink(def.id, def.view, resume, feed)
            .await?;
        Ok(sink)
    }

    /// Tries to start a stored sink every few seconds until it starts or is dropped.
    async fn start_sink_later(engine: std::sync::Weak<Engine>, def: sink::SinkDef) {
        loop {
            tokio::time::sleep(sink::START_RETRY).await;
            let Some(engine) = engine.upgrade() else {
                return;
            };
            let _guard = engine.lock_writes().await;
            let still_waiting = engine
                .sinks
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .get(&def.qualified())
                .is_some_and(|s| s.def.id == def.id);
            if !still_waiting {
                return;
            }
            match engine.start_stored_sink(&def).await {
                Ok(sink) => {
                    tracing::info!(sink = %def.name, "the sink started");
                    let waiting = engine
                        .sinks
                        .write()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(def.qualified(), sink);
                    // This task is the waiting sink's: let it end by itself rather than abort it.
                    if let Some(waiting) = waiting {
                        waiting.detach();
                    }
                    return;
                }
                Err(e) => {
                    tracing::warn!(sink = %def.name, error = %e, "starting a sink failed; retrying");
                    if let Some(s) = engine
                        .sinks
                        .read()
                        .unwrap_or_else(|p| p.into_inner())
                        .get(&def.qualified())
                    {
                        s.status.lock().unwrap_or_else(|p| p.into_inner()).error = Some(e.message);
                    }
                }
            }
        }
    }

    /// Drops sinks by name.
    /// Drops sinks by name; returns the NOTICEs for those missing under `IF EXISTS`.
    pub(crate) async fn drop_sinks(
        &self,
        names: &[QualifiedName],
        if_exists: bool,
    ) -> Result<Vec<session::Notice>> {
        let _guard = self.lock_writes().await;
        let mut notices = Vec::new();
        for name in names {
            if !self
                .sinks
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .contains_key(name)
            {
                if if_exists {
                    notices.push(format!("sink \"{}\" does not exist, skipping", name.name).into());
                    continue;
                }
                let state = if self.name_taken(name) {
                    SqlState::WRONG_OBJECT_TYPE
                } else {
                    SqlState::UNDEFINED_OBJECT
                };
                return Err(Error::new(
                    state,
                    format!("sink \"{}\" does not exist", name.display()),
                ));
            }
            self.drop_sink_now(name)?;
        }
        Ok(notices)
    }

    fn drop_sink_now(&self, name: &QualifiedName) -> Result<()> {
        let sink = self
            .sinks
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(name);
        if let Some(sink) = sink {
            self.meta.delete_object(sink.def.id)?;
            self.meta.delete_sink_progress(sink.def.id)?;
            self.runtime.drop_sink(sink.def.id)?;
        }
        Ok(())
    }

    /// `SHOW CREATE SINK`: the statement as written (without the password).
    pub(crate) fn sink_sql(&self, name: &QualifiedName) -> Result<String> {
        let sql = self
            .sinks
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .map(|s| s.def.sql.clone());
        match sql {
            Some(sql) => Ok(sql),
            None if self.name_taken(name) => Err(Error::new(
                SqlState::WRONG_OBJECT_TYPE,
                format!("\"{}\" is not a sink", name.display()),
            )),
            None => Err(Error::new(
                SqlState::UNDEFINED_OBJECT,
                format!("sink \"{}\" does not exist", name.display()),
            )),
        }
    }

    /// `SHOW SINKS`: name, view, connector, target, last committed epoch, rows committed since
    /// start, last error.
    pub(crate) fn sink_rows(&self) -> Vec<Vec<String>> {
        let sinks = self.sinks.read().unwrap_or_else(|p| p.into_inner());
        sinks
            .values()
            .map(|s| {
                let status = s.status.lock().unwrap_or_else(|p| p.into_inner()).clone();
                let target = s.def.target_text();
                vec![
                    s.def.qualified().display(),
                    self.object_name(s.def.view).unwrap_or_default(),
                    s.def.option("connector").unwrap_or_default(),
                    target,
                    status
                        .committed_epoch
                        .map(|e| e.to_string())
                        .unwrap_or_default(),
                    status.rows.to_string(),
                    status.error.unwrap_or_default(),
                ]
            })
            .collect()
    }

    /// Waits until every view reflects everything committed before the call.
    pub async fn flush(&self) -> Result<u64> {
        self.runtime
            .flush()?
            .await
            .map_err(|_| Error::internal("the view runtime stopped"))?
    }

    pub(crate) fn runtime(&self) -> &ViewRuntime {
        &self.runtime
    }

    pub(crate) fn view_snapshots(&self) -> views::Snapshots {
        self.runtime.snapshots()
    }

    /// Registers a materialized view and backfills it; `id` is given when restoring one.
    /// Returns how many table rows the backfill read and how many sources it read to their
    /// end (a new view over sources answers once it has).
    pub(crate) async fn create_view(
        self: &Arc<Self>,
        name: QualifiedName,
        sql: String,
        plan: eddy_sql::ViewPlan,
        id: Option<ObjectId>,
        progress: Option<tokio::sync::mpsc::UnboundedSender<String>>,
    ) -> Result<(usize, usize)> {
        let guard = self.lock_writes().await;
        // A view rebuilt in place (RESTART) keeps its name.
        let rebuilt = id.is_some() && self.view(&name).map(|v| v.def.id) == id;
        if self.name_taken(&name) && !rebuilt {
            return Err(Error::new(
                SqlState::DUPLICATE_TABLE,
                format!("relation \"{}\" already exists", name.name),
            ));
        }
        self.check_schema_for_create(&name)?;
        let sources = plan.node.sources();
        let event_time = Arc::new(eddy_dataflow::EventTime::new(&sources));
        let dataflow = eddy_dataflow::build(&plan.node, &event_time, &self.workers)?;
        let tables = self.backfill_inputs(&sources).await?;
        let backfill_rows: usize = tables
            .iter()
            .flat_map(|b| b.batches.iter())
            .flat_map(|r| r.changes.iter())
            .map(|b| b.len())
            .sum();
        let is_new = id.is_none();
        let id = match id {
            Some(id) => id,
            None => self.meta.allocate_object_id()?,
        };
        let readers = self.new_readers(id, &sources, None)?;
        let mut dependencies = sources.clone();
        dependencies.extend(plan.views.iter().copied().filter(|v| !sources.contains(v)));
        let def = ViewDef {
            id,
            schema: name.schema.clone(),
            name: name.name.clone(),
            sql,
            dependencies,
        };
        if is_new {
            self.meta
                .put_object(id, &ObjectDef::MaterializedView(def.clone()).encode()?)?;
        }
        let view = Arc::new(View {
            def,
            schema: plan.schema,
            watermark: plan.watermark,
        });
        self.views
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.clone(), Arc::clone(&view));
        let done = self
            .runtime
            .add_view(view, dataflow, event_time, sources, tables, progress)?;
        let caught_up = self.start_readers(readers);
        drop(guard);
        let result = done
            .await
            .map_err(|_| Error::internal("the view runtime stopped"))?;
        if let Err(e) = result {
            if is_new {
                // A new view that cannot be built is not kept.
                let _ = self
                    .drop_objects(&[name], true, true, ObjectKind::MaterializedView)
                    .await;
            } else {
                // A stored one keeps its catalog entry: recovery marks it failed.
                self.stop_readers(id);
                self.views
                    .write()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&name);
                let _ = self.runtime.drop_view(id);
            }
            return Err(e);
        }
        let sources_read = caught_up.len();
        if is_new && sources_read > 0 {
            // A new view over sources answers once it has read what they hold now.
            for wait in caught_up {
                let _ = wait.await;
            }
            self.flush().await?;
        }
        Ok((backfill_rows, sources_read))
    }

    /// A view that lives only as long as a subscription: not in the catalog, not visible by
    /// name. Returns its id; drop it with [`Engine::drop_temporary_view`].
    pub(crate) async fn create_temporary_view(
        self: &Arc<Self>,
        plan: eddy_sql::ViewPlan,
    ) -> Result<ObjectId> {
        let guard = self.lock_writes().await;
        let sources = plan.node.sources();
        let event_time = Arc::new(eddy_dataflow::EventTime::new(&sources));
        let dataflow = eddy_dataflow::build(&plan.node, &event_time, &self.workers)?;
        let tables = self.backfill_inputs(&sources).await?;
        let id = self.meta.allocate_object_id()?;
        let def = ViewDef {
            id,
            schema: eddy_sql::PUBLIC_SCHEMA.to_owned(),
            name: format!("subscription {id}"),
            sql: String::new(),
            dependencies: sources.clone(),
        };
        let view = Arc::new(View {
            def,
            schema: plan.schema,
            watermark: plan.watermark,
        });
        let readers = self.new_readers(id, &sources, None)?;
        let done = self
            .runtime
            .add_view(view, dataflow, event_time, sources, tables, None)?;
        self.start_readers(readers);
        drop(guard);
        if let Err(e) = done
            .await
            .map_err(|_| Error::internal("the view runtime stopped"))?
        {
            self.drop_temporary_view(id);
            return Err(e);
        }
        Ok(id)
    }

    pub(crate) fn drop_temporary_view(&self, id: ObjectId) {
        self.stop_readers(id);
        let _ = self.runtime.drop_view(id);
    }

    pub(crate) async fn subscribe(
        &self,
        view: ObjectId,
        snapshot: bool,
    ) -> Result<views::Subscription> {
        self.runtime.subscribe(view, snapshot).await
    }

    /// What a new view reads first from each table among `sources` (call under the write
    /// lock, so that it lines up with the changes the view runtime receives next): the table's
    /// log from offset 0 in commit order, batch by batch — so a stream's watermark advances and
    /// late rows are judged exactly as they were live.
    async fn backfill_inputs(&self, sources: &[ObjectId]) -> Result<Vec<views::Backfill>> {
        // Commits queued before the write lock was taken may not be in the log files yet (their
        // changes already reached the runtime): an empty commit returns once they are.
        self.log
            .commit(Vec::new())
            .await
            .map_err(|_| Error::internal("the log committer stopped without answering"))??;
        let tables: Vec<Arc<Table>> = self
            .tables
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .filter(|t| sources.contains(&t.def.id))
            .cloned()
            .collect();
        let mut out = Vec::with_capacity(tables.len());
        for table in tables {
            let mut records: Vec<views::LogRecord> = Vec::new();
            let start = (0..table.def.partitions)
                .map(|p| Ok((p, self.log.start_offset(table.def.id, PartitionId(p))?.0)))
                .collect::<Result<Vec<_>>>()?;
            for p in 0..table.def.partitions {
                self.log
                    .scan(table.def.id, PartitionId(p), Offset(0), |_, record| {
                        records.push(views::LogRecord::decode(&record, p, &table.schema)?);
                        Ok(())
                    })?;
            }
            records.sort_by_key(|r| (r.txn, r.partition));
            let batches = records;
            out.push(views::Backfill {
                object: table.def.id,
                name: table.def.qualified().display(),
                clock: table.clock,
                start,
                batches,
            });
        }
        Ok(out)
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
                if let Err(e) = engine.enforce_retention().await {
                    tracing::error!(error = %e, "applying retention failed");
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

    pub(crate) async fn lock_writes(&self) -> WriteGuard {
        Arc::clone(&self.write_lock).lock_owned().await
    }

    /// Binds `CREATE TABLE | SOURCE` to a definition with a new id (call under the write
    /// lock); `None` when the name exists and `IF NOT EXISTS` was given.
    fn bind_new_relation(
        &self,
        create: &eddy_sql::CreateTable,
        name: &QualifiedName,
    ) -> Result<Option<TableDef>> {
        if self.name_taken(name) {
            if create.if_not_exists {
                return Ok(None);
            }
            return Err(Error::new(
                SqlState::DUPLICATE_TABLE,
                format!("relation \"{}\" already exists", name.name),
            ));
        }
        self.check_schema_for_create(name)?;
        let id = self.meta.allocate_object_id()?;
        catalog::bind_create_table(create, id, name.clone()).map(Some)
    }

    /// Creates table `name`; `None` when it exists and `IF NOT EXISTS` was given.
    pub(crate) async fn create_table(
        &self,
        create: &eddy_sql::CreateTable,
        name: &QualifiedName,
    ) -> Result<Option<Arc<Table>>> {
        let _guard = self.lock_writes().await;
        let Some(def) = self.bind_new_relation(create, name)? else {
            return Ok(None);
        };
        let (id, name) = (def.id, def.qualified());
        let schema = def.schema()?;
        // The log first: a crash before the catalog entry leaves an orphan the next start removes.
        self.log.create_object(id, def.partitions)?;
        self.meta
            .put_object(id, &ObjectDef::Table(def.clone()).encode()?)?;
        let data = TableData::new(&def, Arc::clone(&schema))?;
        let clock = clock_of(&def)?;
        let table = Arc::new(Table {
            def,
            schema,
            data: RwLock::new(data),
            next_partition: AtomicU64::new(0),
            clock,
            progress: Default::default(),
        });
        self.tables
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name, Arc::clone(&table));
        Ok(Some(table))
    }

    /// `ALTER TABLE name ALTER COLUMN column DROP NOT NULL`: the table takes NULLs in `column`
    /// from now on (the usual fix before replaying dead letters that lacked it).
    pub(crate) async fn drop_not_null(&self, name: &QualifiedName, column: &str) -> Result<()> {
        let _guard = self.lock_writes().await;
        let old = self.table(name).ok_or_else(|| {
            Error::new(
                SqlState::UNDEFINED_TABLE,
                format!("table \"{}\" does not exist", name.display()),
            )
        })?;
        let mut def = old.def.clone();
        let index = def
            .columns
            .iter()
            .position(|c| c.name == column)
            .ok_or_else(|| {
                Error::new(
                    SqlState::UNDEFINED_COLUMN,
                    format!(
                        "column \"{column}\" of relation \"{}\" does not exist",
                        name.name
                    ),
                )
            })?;
        if def.primary_key.contains(&index) {
            return Err(Error::new(
                SqlState::INVALID_TABLE_DEFINITION,
                format!("column \"{column}\" is in a primary key"),
            ));
        }
        def.columns[index].nullable = true;
        let schema = def.schema()?;
        self.meta
            .put_object(def.id, &ObjectDef::Table(def.clone()).encode()?)?;
        let data = std::mem::replace(
            &mut *old.write(),
            TableData::new(&def, Arc::clone(&schema))?,
        )
        .relabel(Arc::clone(&schema));
        let table = Table {
            def,
            schema,
            data: RwLock::new(data),
            next_partition: AtomicU64::new(old.next_partition.load(Ordering::Relaxed)),
            clock: old.clock,
            progress: Arc::clone(&old.progress),
        };
        self.tables
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.clone(), Arc::new(table));
        Ok(())
    }

    /// `ALTER TABLE name ADD COLUMN`: the table is rebuilt from its log under the new
    /// definition (older records read the column as NULL). Views keep the columns they were
    /// planned with.
    pub(crate) async fn add_column(
        &self,
        name: &QualifiedName,
        column: &eddy_sql::ast::ColumnDef,
        if_not_exists: bool,
    ) -> Result<()> {
        let _guard = self.lock_writes().await;
        let old = self.table(name).ok_or_else(|| {
            Error::new(
                SqlState::UNDEFINED_TABLE,
                format!("table \"{}\" does not exist", name.display()),
            )
        })?;
        if if_not_exists
            && old
                .def
                .columns
                .iter()
                .any(|c| c.name == catalog::normalize_ident(&column.name))
        {
            return Ok(());
        }
        let mut def = old.def.clone();
        def.columns.push(catalog::bind_added_column(&def, column)?);
        // Commits queued before the lock may not be in the log files yet.
        self.log
            .commit(Vec::new())
            .await
            .map_err(|_| Error::internal("the log committer stopped without answering"))??;
        let (mut table, _) = load_table(&self.log, def.clone())?;
        self.meta
            .put_object(def.id, &ObjectDef::Table(def).encode()?)?;
        if let Some(table) = Arc::get_mut(&mut table) {
            table.progress = Arc::clone(&old.progress);
        }
        table.next_partition.store(
            old.next_partition.load(Ordering::Relaxed),
            Ordering::Relaxed,
        );
        self.tables
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.clone(), table);
        Ok(())
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

    /// Checks, logs and applies one transaction's changes. Takes the write guard and releases
    /// it as soon as the commit is queued, so that other writers join the same group commit;
    /// returns once the commit is durable.
    ///
    /// `positions` (a connector's write to one table) are recorded with the changes: how far
    /// the connector has read each source partition, so a restart resumes exactly there. They
    /// are written even when no row changed.
    /// `partition` pins an append-only table's write to one partition (a connector keeps a
    /// source partition's records in one log partition).
    pub(crate) async fn commit(
        &self,
        guard: WriteGuard,
        writes: Vec<(Arc<Table>, Vec<ChangeBatch>)>,
        positions: &[(u32, u64)],
        partition: Option<u32>,
    ) -> Result<()> {
        let writes: Vec<_> = writes
            .into_iter()
            .filter(|(_, c)| !positions.is_empty() || c.iter().any(|b| !b.is_empty()))
            .collect();
        if writes.is_empty() {
            return Ok(());
        }
        let writes = writes
            .into_iter()
            .map(|(t, c)| Ok((Arc::clone(&t), fill_proctime(&t.def, &t.schema, c)?)))
            .collect::<Result<Vec<_>>>()?;
        let mut log_writes = Vec::with_capacity(writes.len());
        let mut routed: Vec<Vec<(u32, ChangeBatch)>> = Vec::with_capacity(writes.len());
        for (table, changes) in &writes {
            match self.table_by_id(table.def.id) {
                None => {
                    return Err(Error::new(
                        SqlState::UNDEFINED_TABLE,
                        format!("table \"{}\" was dropped", table.def.qualified().display()),
                    ));
                }
                // ALTER TABLE replaced the table since this statement read it.
                Some(now) if !Arc::ptr_eq(&now, table) => {
                    return Err(Error::new(
                        SqlState::SERIALIZATION_FAILURE,
                        format!(
                            "table \"{}\" was altered while the statement ran; run it again",
                            table.def.name
                        ),
                    ));
                }
                Some(_) => {}
            }
            table.read().check(changes)?;
            let mut parts = table.route(concat_changes(&table.schema, changes)?, partition)?;
            if parts.is_empty() {
                parts.push((
                    0,
                    ChangeBatch::inserts(RecordBatch::new_empty(Arc::clone(&table.schema))),
                ));
            }
            for (partition, part) in &parts {
                log_writes.push(Write {
                    object: table.def.id,
                    partition: PartitionId(*partition),
                    payload: encode_changes_at(part, positions)?,
                });
            }
            routed.push(parts);
        }
        // Room in the view runtime's queue first: while views are behind, writers wait here.
        let bytes: usize = routed
            .iter()
            .flatten()
            .map(|(_, p)| p.rows().get_array_memory_size())
            .sum();
        let mut budget = Some(self.runtime.reserve(bytes).await?);
        let ticket = self.log.commit(log_writes);
        for ((table, changes), parts) in writes.iter().zip(routed) {
            table.write().apply(changes)?;
            table.progress.advance(positions);
            for (partition, part) in parts {
                self.runtime.changes(
                    table.def.id,
                    partition,
                    table.clock,
                    vec![part],
                    budget.take(),
                )?;
            }
        }
        drop(guard);
        ticket
            .await
            .map_err(|_| Error::internal("the log committer stopped without answering"))?
            .map(|_| ())
    }
}

/// Sets the `AS PROCTIME()` columns of inserted rows (where they are NULL) to now.
fn fill_proctime(
    def: &TableDef,
    schema: &SchemaRef,
    changes: Vec<ChangeBatch>,
) -> Result<Vec<ChangeBatch>> {
    let columns: Vec<usize> = def
        .columns
        .iter()
        .enumerate()
        .filter(|(_, c)| c.proctime)
        .map(|(i, _)| i)
        .collect();
    if columns.is_empty() {
        return Ok(changes);
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64);
    changes
        .into_iter()
        .map(|c| {
            let (rows, diffs) = c.into_parts();
            let mut arrays = rows.columns().to_vec();
            for &i in &columns {
                let arrow::datatypes::DataType::Timestamp(_, tz) =
                    schema.field(i).data_type().clone()
                else {
                    continue;
                };
                let old = arrow::compute::cast(&arrays[i], &arrow::datatypes::DataType::Int64)
                    .map_err(|e| Error::internal(format!("proctime: {e}")))?;
                let old = old
                    .as_any()
                    .downcast_ref::<Int64Array>()
                    .ok_or_else(|| Error::internal("proctime column"))?;
                let filled: arrow::array::TimestampMicrosecondArray = old
                    .iter()
                    .zip(diffs.values())
                    .map(|(v, d)| if *d > 0 && v.is_none() { Some(now) } else { v })
                    .collect();
                arrays[i] = Arc::new(filled.with_timezone_opt(tz));
            }
            let rows = RecordBatch::try_new(rows.schema(), arrays)
                .map_err(|e| Error::internal(format!("proctime: {e}")))?;
            Ok(ChangeBatch::new(rows, diffs))
        })
        .collect()
}

fn concat_changes(schema: &SchemaRef, changes: &[ChangeBatch]) -> Result<ChangeBatch> {
    if let [one] = changes {
        return Ok(one.clone());
    }
    let rows: Vec<&RecordBatch> = changes.iter().map(|c| c.rows()).collect();
    let rows = arrow::compute::concat_batches(schema, rows)
        .map_err(|e| Error::internal(format!("concatenating changes: {e}")))?;
    let diffs: Vec<i64> = changes
        .iter()
        .flat_map(|c| c.diffs().values().iter().copied())
        .collect();
    Ok(ChangeBatch::new(rows, Int64Array::from(diffs)))
}

/// A table as its log holds it, with its watermark clock as the log ends (tables with a
/// `WATERMARK FOR`): the watermark a restart goes on from.
fn load_table(log: &LogStore, def: TableDef) -> Result<(Arc<Table>, Option<clock::StreamClock>)> {
    let schema = def.schema()?;
    let clock = clock_of(&def)?;
    let mut stream_clock = clock.map(clock::StreamClock::replaying);
    let (data, positions) = load_contents_with(log, &def, &schema, stream_clock.as_mut())?;
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
fn load_contents(
    log: &LogStore,
    def: &TableDef,
    schema: &SchemaRef,
) -> Result<(TableData, Vec<(u32, u64)>)> {
    load_contents_with(log, def, schema, None)
}

/// [`load_contents`], also raising `clock` with every record's data and watermark marks.
fn load_contents_with(
    log: &LogStore,
    def: &TableDef,
    schema: &SchemaRef,
    mut clock: Option<&mut clock::StreamClock>,
) -> Result<(TableData, Vec<(u32, u64)>)> {
    let mut data = TableData::new(def, Arc::clone(schema))?;
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
                        clock.observe(p, &changes)?;
                    }
                }
            }
            data.apply(&changes)?;
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
    tracing::info!(table = %def.qualified().display(), records, rows = data.row_count(), "table restored from its log");
    Ok((
        data,
        positions.into_iter().map(|(p, (_, o))| (p, o)).collect(),
    ))
}
