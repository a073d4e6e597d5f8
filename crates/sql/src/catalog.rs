//! The bridge from the engine's catalog to DataFusion: the engine implements [`CatalogSource`]
//! and [`TableSource`]; this module wraps them as DataFusion catalog, schema and table
//! providers. Catalog views (`information_schema`, `pg_catalog`) read the same trait.

use std::fmt;
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use datafusion::catalog::{Session, TableProvider};
use datafusion::catalog::SchemaProvider;
use datafusion::datasource::TableType;
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::error::Result as DfResult;
use datafusion::logical_expr::Expr;
use datafusion::physical_plan::ExecutionPlan;
use eddy_common::Error;

/// What kind of relation a [`TableSource`] is: what `pg_class.relkind` and
/// `information_schema.tables.table_type` report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelationKind {
    /// A table (`CREATE TABLE`, append-only or keyed): relkind `r`.
    Table,
    /// A plain view (`CREATE VIEW`): a named query, expanded where it is used; relkind `v`.
    /// Its definition is [`CatalogSource::view_definition`]; it is never scanned.
    View,
    /// A materialized view: relkind `m`.
    MaterializedView,
    /// A source (`CREATE SOURCE`): its records live in the external system; relkind `f`
    /// (PostgreSQL's foreign table is the closest thing).
    Source,
    /// One of Eddy's own tables in schema `eddy_catalog` (`eddy_dead_letters`, ...): relkind `r`.
    System,
}

impl RelationKind {
    /// `pg_class.relkind`.
    pub fn relkind(self) -> char {
        match self {
            RelationKind::Table | RelationKind::System => 'r',
            RelationKind::View => 'v',
            RelationKind::MaterializedView => 'm',
            RelationKind::Source => 'f',
        }
    }
}

/// The first OID PostgreSQL gives to user objects: object `id` has OID `FIRST_USER_OID + id`
/// (see [`object_oid`]), so OIDs stay stable across restarts (ids are never reused).
pub const FIRST_USER_OID: u32 = 16384;

/// The OID of catalog object `id` (a table, view, source, sink or schema).
pub fn object_oid(id: eddy_common::ObjectId) -> u32 {
    FIRST_USER_OID.saturating_add(u32::try_from(id.0).unwrap_or(u32::MAX - FIRST_USER_OID))
}

/// A schema (`pg_namespace` row).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaEntry {
    pub name: String,
    /// Stable across restarts: `public` is 2200 as in PostgreSQL, `eddy_catalog` is
    /// [`EDDY_CATALOG_OID`], a created schema has its object's OID ([`object_oid`]).
    pub oid: u32,
    /// Eddy's own (`eddy_catalog`): nothing can be created or dropped in it.
    pub system: bool,
}

/// The schema PostgreSQL creates in every database.
pub const PUBLIC_SCHEMA: &str = "public";
pub const PUBLIC_OID: u32 = 2200;
/// The schema of Eddy's own tables (`eddy_dead_letters`, `eddy_views`, ...).
pub const EDDY_CATALOG_SCHEMA: &str = "eddy_catalog";
pub const EDDY_CATALOG_OID: u32 = 16383;

/// A plain view as its definition stands (what `pg_get_viewdef` and `pg_views` show).
#[derive(Debug, Clone)]
pub struct ViewDefinition {
    pub id: eddy_common::ObjectId,
    /// The view's query as written (`SELECT ...`), with every relation it names that is not
    /// found in `public` or a system schema qualified by its schema.
    pub query: String,
    /// The view's column names, in order.
    pub columns: Vec<String>,
}

/// A relation as the planner sees it: a schema and a consistent snapshot of its rows.
pub trait TableSource: Send + Sync + fmt::Debug {
    /// The catalog id of the relation (what dataflows name as their sources; `ObjectId(0)`
    /// for Eddy's system tables). Its OID is [`object_oid`] of it.
    fn object_id(&self) -> eddy_common::ObjectId;
    fn schema(&self) -> SchemaRef;
    /// The relation's current contents. Repeated calls within one statement must return the
    /// same snapshot (the engine hands out an immutable `Arc`ed copy). A plain view or a
    /// source has none: an error.
    fn scan(&self) -> eddy_common::Result<Arc<Vec<RecordBatch>>>;
    /// The column `WATERMARK FOR` names, for streams that declare one.
    fn watermark_column(&self) -> Option<String> {
        None
    }
    /// An `APPEND ONLY` table (a stream).
    fn append_only(&self) -> bool {
        false
    }
    /// What the relation is.
    fn kind(&self) -> RelationKind {
        RelationKind::Table
    }
    /// What `information_schema.tables` calls it: `BASE TABLE`, `VIEW` (a plain or
    /// materialized view) or `FOREIGN` (a source, whose records live elsewhere).
    fn table_type(&self) -> &'static str {
        match self.kind() {
            RelationKind::Table | RelationKind::System => "BASE TABLE",
            RelationKind::View | RelationKind::MaterializedView => "VIEW",
            RelationKind::Source => "FOREIGN",
        }
    }
}

/// The catalog as one session sees it (its open transaction's uncommitted writes included):
/// schemas, the relations in each, and the session's search path. Names are already
/// normalized (lowercase unless quoted). Sinks are not relations and are not listed.
pub trait CatalogSource: Send + Sync + fmt::Debug {
    /// The relation `schema.name` of any kind, `None` when there is none.
    fn table(&self, schema: &str, name: &str) -> Option<Arc<dyn TableSource>>;
    /// The names of the relations in `schema` (empty when it does not exist).
    fn table_names(&self, schema: &str) -> Vec<String>;
    /// Every schema Eddy has (`public`, `eddy_catalog`, those created), in OID order. Not
    /// `pg_catalog` or `information_schema`, which the planner serves itself.
    fn schemas(&self) -> Vec<SchemaEntry>;
    /// Where an unqualified relation name is looked up, in order: `pg_catalog` (unless the
    /// session's `search_path` places it), `eddy_catalog` (likewise), then the existing
    /// schemas of `search_path` (`$user` expanded). What `current_schemas(true)` returns.
    fn search_path(&self) -> Vec<String>;
    /// The definition of plain view `schema.name`, `None` when it is not one.
    fn view_definition(&self, _schema: &str, _name: &str) -> Option<ViewDefinition> {
        None
    }
    /// Why `schema.name` cannot be read, when it exists but cannot answer (a materialized
    /// view that failed): a query naming it fails with this error instead of reading stale rows.
    fn failure(&self, _schema: &str, _name: &str) -> Option<Error> {
        None
    }
    /// Every relation, as (schema, name, relation), schemas in OID order and names sorted.
    fn relations(&self) -> Vec<(String, String, Arc<dyn TableSource>)> {
        let mut out = Vec::new();
        for schema in self.schemas() {
            let mut names = self.table_names(&schema.name);
            names.sort();
            for name in names {
                if let Some(table) = self.table(&schema.name, &name) {
                    out.push((schema.name.clone(), name, table));
                }
            }
        }
        out
    }
}

/// DataFusion's view of the `eddy` catalog: the schemas the planner registers itself
/// (`information_schema`, `pg_catalog`) and every schema of the [`CatalogSource`].
#[derive(Debug)]
pub(crate) struct CatalogBridge {
    pub source: Arc<dyn CatalogSource>,
    pub fixed: std::sync::RwLock<std::collections::BTreeMap<String, Arc<dyn SchemaProvider>>>,
}

impl datafusion::catalog::CatalogProvider for CatalogBridge {
    fn schema_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.fixed.read().unwrap_or_else(|p| p.into_inner()).keys().cloned().collect();
        names.extend(self.source.schemas().into_iter().map(|s| s.name));
        names
    }

    fn schema(&self, name: &str) -> Option<Arc<dyn SchemaProvider>> {
        if let Some(fixed) = self.fixed.read().unwrap_or_else(|p| p.into_inner()).get(name) {
            return Some(Arc::clone(fixed));
        }
        self.source
            .schemas()
            .iter()
            .any(|s| s.name == name)
            .then(|| Arc::new(SchemaBridge { source: Arc::clone(&self.source), schema: name.to_owned() }) as Arc<dyn SchemaProvider>)
    }

    fn register_schema(&self, name: &str, schema: Arc<dyn SchemaProvider>) -> DfResult<Option<Arc<dyn SchemaProvider>>> {
        Ok(self.fixed.write().unwrap_or_else(|p| p.into_inner()).insert(name.to_owned(), schema))
    }
}

#[derive(Debug)]
pub(crate) struct SchemaBridge {
    pub source: Arc<dyn CatalogSource>,
    pub schema: String,
}

#[async_trait]
impl SchemaProvider for SchemaBridge {
    fn table_names(&self) -> Vec<String> {
        self.source.table_names(&self.schema)
    }

    async fn table(&self, name: &str) -> DfResult<Option<Arc<dyn TableProvider>>> {
        if let Some(e) = self.source.failure(&self.schema, name) {
            return Err(datafusion::error::DataFusionError::External(Box::new(e)));
        }
        Ok(self.source.table(&self.schema, name).map(|t| Arc::new(TableBridge::new(t)) as Arc<dyn TableProvider>))
    }

    fn table_exist(&self, name: &str) -> bool {
        self.source.table(&self.schema, name).is_some()
    }
}

#[derive(Debug)]
pub(crate) struct TableBridge {
    pub(crate) source: Arc<dyn TableSource>,
    /// The table's schema with every column nullable: the engine enforces NOT NULL itself, with
    /// PostgreSQL's error (23502) and the table's column names, which DataFusion's own check
    /// during INSERT planning would not give.
    schema: SchemaRef,
}

impl TableBridge {
    fn new(source: Arc<dyn TableSource>) -> Self {
        let table = source.schema();
        let fields: Vec<arrow::datatypes::Field> =
            table.fields().iter().map(|f| f.as_ref().clone().with_nullable(true)).collect();
        let schema = Arc::new(arrow::datatypes::Schema::new_with_metadata(fields, table.metadata().clone()));
        TableBridge { source, schema }
    }
}

#[async_trait]
impl TableProvider for TableBridge {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let batches: Vec<RecordBatch> = self
            .source
            .scan()
            .map_err(|e| datafusion::error::DataFusionError::External(Box::new(e)))?
            .iter()
            .map(|b| b.clone().with_schema(Arc::clone(&self.schema)))
            .collect::<Result<_, _>>()?;
        let exec = MemorySourceConfig::try_new_exec(&[batches], self.schema(), projection.cloned())?;
        Ok(exec)
    }
}
