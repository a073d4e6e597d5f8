//! The catalog as one session sees it, for the planner ([`CatalogSource`]): schemas, the
//! relations of each (its transaction's private copies of tables first), Eddy's own tables in
//! `eddy_catalog`, plain views' definitions, and the session's search path.
//!
//! Entry point: [`SessionCatalog`]. Invariant: one statement reads one published moment of
//! every materialized view (the snapshots are taken when it first reads one).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use eddy_common::{Error, ObjectId, Result, SqlState};
use eddy_sql::pg_catalog::Namespace;
use eddy_sql::{CatalogSource, EDDY_CATALOG_SCHEMA, QualifiedName, TableSource, ViewDefinition};

use crate::names::SearchPath;
use crate::table::{TableData, TableScan};
use crate::table_chunks::ViewRows;
use crate::table_log::LogScan;
use crate::variables::Variables;
use crate::{Engine, Table};

#[derive(Debug)]
pub(crate) struct SessionCatalog {
    pub(crate) engine: Arc<Engine>,
    pub(crate) forks: Mutex<HashMap<ObjectId, TableData>>,
    /// The views' contents as the running statement reads them: taken when it first scans a
    /// view, so that all the views it reads are of one epoch (and statements that read no
    /// view never have snapshots built).
    views: Arc<StatementViews>,
    path: Mutex<SearchPath>,
    /// The session's backend pid (`pg_stat_activity`).
    pub(crate) pid: i32,
    /// The session's settings as the running statement started with them, plus what its
    /// `set_config()` calls changed; `pending_settings` is applied when it ends.
    pub(crate) variables: Mutex<Variables>,
    pub(crate) pending_settings: Mutex<Vec<(String, String)>>,
    /// Relations one statement defines for itself (`excluded` of ON CONFLICT, the rows
    /// RETURNING reads), by name; see [`SessionCatalog::local`]. They shadow every schema.
    locals: Mutex<HashMap<&'static str, Arc<dyn TableSource>>>,
}

/// A statement-local relation, gone when this is dropped.
pub(crate) struct Local<'a> {
    catalog: &'a SessionCatalog,
    name: &'static str,
}

impl Drop for Local<'_> {
    fn drop(&mut self) {
        self.catalog
            .locals
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(self.name);
    }
}

impl SessionCatalog {
    pub(crate) fn new(engine: Arc<Engine>, path: SearchPath, pid: i32) -> Self {
        SessionCatalog {
            views: Arc::new(StatementViews {
                engine: Arc::clone(&engine),
                taken: Mutex::new(None),
            }),
            engine,
            forks: Mutex::new(HashMap::new()),
            path: Mutex::new(path),
            pid,
            variables: Mutex::new(Variables::default()),
            pending_settings: Mutex::new(Vec::new()),
            locals: Mutex::new(HashMap::new()),
        }
    }

    /// Makes `rows` readable as the relation `name` until the returned guard drops.
    pub(crate) fn local(
        &self,
        name: &'static str,
        schema: SchemaRef,
        rows: Vec<RecordBatch>,
    ) -> Local<'_> {
        let table = SnapshotTable {
            id: ObjectId(0),
            kind: "BASE TABLE",
            schema,
            contents: Contents::Rows(Arc::new(ViewRows::Rows(Arc::new(rows)))),
            watermark: None,
            append_only: false,
        };
        self.locals
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name, Arc::new(table));
        Local {
            catalog: self,
            name,
        }
    }

    /// Runs `f` on the table's contents as this session sees them (its transaction's copy).
    pub(crate) fn with_table_data_mut<R>(
        &self,
        table: &Table,
        f: impl FnOnce(&mut TableData) -> R,
    ) -> Result<R> {
        let mut forks = self.forks.lock().unwrap_or_else(|p| p.into_inner());
        Ok(match forks.get_mut(&table.def.id) {
            Some(fork) => f(fork),
            None => f(&mut table.write()),
        })
    }

    pub(crate) fn begin_statement(&self) {
        self.views.forget();
    }

    pub(crate) fn end_statement(&self) {
        self.views.forget();
    }

    /// The session's search path.
    pub(crate) fn path(&self) -> SearchPath {
        self.path.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub(crate) fn set_path(&self, path: SearchPath) {
        *self.path.lock().unwrap_or_else(|p| p.into_inner()) = path;
    }

    fn view_table(&self, name: &QualifiedName) -> Option<Arc<dyn TableSource>> {
        let view = self.engine.view(name)?;
        let watermark = view.watermark.as_ref().map(|(column, _)| column.clone());
        Some(Arc::new(SnapshotTable {
            id: view.def.id,
            kind: "VIEW",
            schema: Arc::clone(&view.schema),
            contents: Contents::View(Arc::clone(&self.views), name.display()),
            watermark,
            append_only: false,
        }))
    }

    fn plain_view_table(&self, name: &QualifiedName) -> Option<Arc<dyn TableSource>> {
        let view = self.engine.plain_view(name)?;
        let schema = view.arrow_schema().map_err(|e| tracing::error!(view = %name.display(), error = %e, "a plain view's columns are unreadable")).ok()?;
        Some(Arc::new(SnapshotTable {
            id: view.id,
            kind: "VIEW",
            schema,
            contents: Contents::None,
            watermark: None,
            append_only: false,
        }))
    }

    fn table_table(&self, name: &QualifiedName) -> Option<Arc<dyn TableSource>> {
        let table = self.engine.table(name)?;
        // A transaction's private copy is not looked up by key (it is not `table`'s data).
        let (snapshot, shared) = {
            let mut forks = self.forks.lock().unwrap_or_else(|p| p.into_inner());
            match forks.get_mut(&table.def.id) {
                Some(fork) => (fork.scan(), false),
                None => (table.scan(), true),
            }
        };
        // A snapshot that cannot be built (decoding rows failed, a bug) fails the statements
        // that scan the table, not those that only name it (`\d`, a catalog lookup).
        let contents = match snapshot {
            Ok(TableScan::Rows { rows, version }) if shared => Contents::Keyed {
                rows,
                table: Arc::clone(&table),
                version,
            },
            Ok(TableScan::Rows { rows, .. }) => Contents::Rows(rows),
            Ok(TableScan::Log(log)) => Contents::Log(log),
            Err(e) => {
                tracing::error!(table = %name.display(), error = %e, "building a table snapshot failed");
                Contents::Failed(e)
            }
        };
        let watermark = table.def.watermark.as_ref().map(|w| w.column.clone());
        Some(Arc::new(SnapshotTable {
            id: table.def.id,
            kind: "BASE TABLE",
            schema: Arc::clone(&table.schema),
            contents,
            watermark,
            append_only: table.def.append_only,
        }))
    }
}

impl CatalogSource for SessionCatalog {
    fn table(&self, schema: &str, name: &str) -> Option<Arc<dyn TableSource>> {
        if let Some(local) = self
            .locals
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
        {
            return Some(Arc::clone(local));
        }
        if schema == EDDY_CATALOG_SCHEMA {
            let (name, schema) = crate::system::schema(name)?;
            return Some(Arc::new(SnapshotTable {
                id: ObjectId(0),
                kind: "BASE TABLE",
                schema,
                contents: Contents::System(Arc::clone(&self.engine), name),
                watermark: None,
                append_only: false,
            }));
        }
        let name = QualifiedName::new(schema, name);
        if let Some(source) = self.engine.source(&name) {
            let watermark = source.def.watermark.as_ref().map(|w| w.column.clone());
            return Some(Arc::new(SnapshotTable {
                id: source.def.id,
                kind: "FOREIGN",
                schema: Arc::clone(&source.schema),
                contents: Contents::None,
                watermark,
                append_only: source.def.append_only,
            }));
        }
        self.table_table(&name)
            .or_else(|| self.view_table(&name))
            .or_else(|| self.plain_view_table(&name))
    }

    fn failure(&self, schema: &str, name: &str) -> Option<Error> {
        self.engine
            .view_failure(&*self.engine.view(&QualifiedName::new(schema, name))?)
    }

    fn table_names(&self, schema: &str) -> Vec<String> {
        if schema == EDDY_CATALOG_SCHEMA {
            return crate::system::NAMES
                .iter()
                .map(|n| (*n).to_owned())
                .collect();
        }
        let mut names: Vec<QualifiedName> = self.engine.table_names();
        names.extend(self.engine.view_names());
        names.extend(self.engine.source_names());
        names.extend(self.engine.plain_view_names());
        names
            .into_iter()
            .filter(|n| n.schema == schema)
            .map(|n| n.name)
            .collect()
    }

    fn namespaces(&self) -> Vec<Namespace> {
        self.engine.namespaces()
    }

    fn relations(&self) -> Vec<eddy_sql::pg_catalog::Relation> {
        crate::pg_objects::relations(&self.engine)
    }

    fn relation_size(&self, oid: u32) -> Option<u64> {
        crate::pg_objects::relation_size(&self.engine, oid)
    }

    fn activity(&self) -> Vec<eddy_sql::pg_catalog::Activity> {
        self.engine.sessions.list()
    }

    fn settings(&self) -> Vec<(String, String)> {
        self.variables
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .all()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    }

    fn set_setting(&self, name: &str, value: &str) -> Result<String> {
        let mut variables = self.variables.lock().unwrap_or_else(|p| p.into_inner());
        variables.set(name, Some(value.to_owned()))?;
        let (canonical, value) = variables.get(name)?;
        self.pending_settings
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((canonical.to_owned(), value.clone()));
        Ok(value)
    }

    fn server_start_micros(&self) -> i64 {
        self.engine.started_at_micros
    }

    fn search_path(&self) -> Vec<String> {
        self.path().lookup(&self.engine)
    }

    fn view_definition(&self, schema: &str, name: &str) -> Option<ViewDefinition> {
        let view = self.engine.plain_view(&QualifiedName::new(schema, name))?;
        Some(ViewDefinition {
            id: view.id,
            query: view.query.clone(),
            columns: view.columns.iter().map(|c| c.name.clone()).collect(),
        })
    }
}

/// A relation as a statement resolved it: a table frozen then, a materialized view or a
/// system table read when the statement first scans it (a source or a plain view has no
/// contents to read).
#[derive(Debug)]
struct SnapshotTable {
    id: ObjectId,
    /// `information_schema.tables.table_type`.
    kind: &'static str,
    schema: SchemaRef,
    contents: Contents,
    watermark: Option<String>,
    append_only: bool,
}

#[async_trait::async_trait]
impl TableSource for SnapshotTable {
    fn table_type(&self) -> &'static str {
        self.kind
    }

    fn watermark_column(&self) -> Option<String> {
        self.watermark.clone()
    }

    fn append_only(&self) -> bool {
        self.append_only
    }

    fn object_id(&self) -> ObjectId {
        self.id
    }

    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    fn primary_key(&self) -> Vec<usize> {
        match &self.contents {
            Contents::Keyed { table, .. } => table.def.primary_key.clone(),
            _ => Vec::new(),
        }
    }

    fn lookup(&self, key: &[arrow::array::ArrayRef]) -> Option<Result<Vec<RecordBatch>>> {
        match &self.contents {
            Contents::Keyed { table, version, .. } => table.lookup(*version, key).transpose(),
            _ => None,
        }
    }

    fn stream(&self) -> Option<Arc<dyn eddy_sql::StreamSource>> {
        match &self.contents {
            Contents::Log(log) => Some(Arc::clone(log) as Arc<dyn eddy_sql::StreamSource>),
            Contents::View(views, name) => Some(Arc::new(ViewStream {
                views: Arc::clone(views),
                id: self.id,
                name: name.clone(),
            })),
            // A table with rows on disk is read a chunk at a time, not into memory whole.
            Contents::Rows(rows) | Contents::Keyed { rows, .. }
                if matches!(**rows, ViewRows::Pieces { .. }) =>
            {
                Some(Arc::new(PiecesStream(Arc::clone(rows))))
            }
            _ => None,
        }
    }

    async fn scan(&self) -> Result<Arc<Vec<RecordBatch>>> {
        match &self.contents {
            Contents::Rows(rows) | Contents::Keyed { rows, .. } => rows.batches(),
            Contents::Log(log) => Ok(Arc::new(log.collect()?)),
            Contents::Failed(e) => Err(e.clone()),
            Contents::View(views, name) => views.rows(self.id, name).await,
            Contents::System(engine, name) => Ok(Arc::new(crate::system::rows(engine, name)?)),
            Contents::None => Err(match self.kind {
                "VIEW" => Error::internal("a plain view is expanded into its query, never scanned"),
                _ => Error::unsupported("a source is not stored by Eddy, so it cannot be queried directly")
                    .with_hint("read it through a materialized view (CREATE MATERIALIZED VIEW v AS SELECT ... FROM the source), or SUBSCRIBE to a query over it"),
            }),
        }
    }
}

/// A materialized view's contents read by a plan as a stream: the statement's snapshot of the
/// view, then its pieces one at a time (those on disk read from their files), so a query over
/// a view larger than memory holds a few pieces at a time, not the view.
#[derive(Debug)]
struct ViewStream {
    views: Arc<StatementViews>,
    id: ObjectId,
    name: String,
}

impl eddy_sql::StreamSource for ViewStream {
    fn open(
        &self,
        projection: Option<&[usize]>,
        schema: SchemaRef,
    ) -> datafusion::physical_plan::SendableRecordBatchStream {
        let (views, id, name) = (Arc::clone(&self.views), self.id, self.name.clone());
        let projection = projection.map(<[usize]>::to_vec);
        crate::table_chunks::stream_pieces(schema, async move {
            Ok((views.view_rows(id, &name).await?, projection))
        })
    }
}

/// A table's rows frozen for a statement, some of them on disk, read as a stream of its
/// pieces (see [`ViewStream`]).
#[derive(Debug)]
struct PiecesStream(Arc<ViewRows>);

impl eddy_sql::StreamSource for PiecesStream {
    fn open(
        &self,
        projection: Option<&[usize]>,
        schema: SchemaRef,
    ) -> datafusion::physical_plan::SendableRecordBatchStream {
        let rows = Arc::clone(&self.0);
        let projection = projection.map(<[usize]>::to_vec);
        crate::table_chunks::stream_pieces(schema, async move { Ok((rows, projection)) })
    }
}

/// What scanning a [`SnapshotTable`] reads.
#[derive(Debug)]
enum Contents {
    Rows(Arc<ViewRows>),
    /// A table's rows, which its primary-key index can find while `table` is still at
    /// `version` ([`crate::table::TableData::lookup`]).
    Keyed {
        rows: Arc<ViewRows>,
        table: Arc<Table>,
        version: u64,
    },
    /// An append-only table's rows, read from its log as the statement scans them.
    Log(Arc<LogScan>),
    /// Rows that could not be read.
    Failed(Error),
    /// A materialized view (by name, for errors), from the statement's snapshots.
    View(Arc<StatementViews>, String),
    /// A table of `eddy_catalog`, computed when scanned.
    System(Arc<Engine>, &'static str),
    /// A source or a plain view.
    None,
}

/// The published contents of every materialized view as one statement reads them: taken at
/// the statement's first scan of a view and kept until it ends, so one statement sees one
/// epoch of every view. Taking them may wait for the runtime to build them, asynchronously.
#[derive(Debug)]
pub(crate) struct StatementViews {
    engine: Arc<Engine>,
    taken: Mutex<Option<crate::views::Snapshots>>,
}

impl StatementViews {
    fn forget(&self) {
        self.taken.lock().unwrap_or_else(|p| p.into_inner()).take();
    }

    async fn rows(&self, id: ObjectId, name: &str) -> Result<Arc<Vec<RecordBatch>>> {
        self.view_rows(id, name).await?.batches()
    }

    /// The statement's snapshot of view `id`'s contents (its rows on disk not read yet).
    async fn view_rows(
        &self,
        id: ObjectId,
        name: &str,
    ) -> Result<Arc<crate::table_chunks::ViewRows>> {
        let taken = self.taken.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let snapshots = match taken {
            Some(snapshots) => snapshots,
            None => {
                let fresh = self.engine.runtime().snapshots().await;
                // Another scan of this statement may have taken them meanwhile: the first wins.
                self.taken
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get_or_insert(fresh)
                    .clone()
            }
        };
        match snapshots.get(&id) {
            Some(Ok(rows)) => Ok(Arc::clone(rows)),
            Some(Err(e)) => Err(e.clone()),
            // The runtime has not published since the view was added (it is busy: a backfill,
            // a restore, a view it waits for): no contents to read yet, which is not "empty".
            None => Err(Error::new(
                SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE,
                format!("materialized view {name} has no contents published yet"),
            )
            .with_hint("the view is still being built (its backfill), or the view runtime is busy (a restore or a view it waits for); try again in a moment")),
        }
    }
}

impl std::fmt::Debug for TableData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TableData")
            .field("rows", &self.row_count())
            .finish()
    }
}
