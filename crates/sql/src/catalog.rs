//! The bridge from the engine's tables to DataFusion: the engine implements [`CatalogSource`]
//! and [`TableSource`]; this module wraps them as DataFusion schema and table providers.

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

use crate::pg_catalog::{Activity, Namespace, Relation};

/// A table as the planner sees it: a schema and a consistent snapshot of its rows.
pub trait TableSource: Send + Sync + fmt::Debug {
    /// The catalog id of the table or view (what dataflows name as their sources).
    fn object_id(&self) -> eddy_common::ObjectId;
    fn schema(&self) -> SchemaRef;
    /// The table's current contents. Repeated calls within one statement must return the same
    /// snapshot (the engine hands out an immutable `Arc`ed copy).
    fn scan(&self) -> eddy_common::Result<Arc<Vec<RecordBatch>>>;
    /// The column `WATERMARK FOR` names, for streams that declare one.
    fn watermark_column(&self) -> Option<String> {
        None
    }
    /// An `APPEND ONLY` table (a stream).
    fn append_only(&self) -> bool {
        false
    }
    /// What `information_schema.tables` calls it: `BASE TABLE`, `VIEW` (a materialized view)
    /// or `FOREIGN` (a source, whose records live elsewhere).
    fn table_type(&self) -> &'static str {
        "BASE TABLE"
    }
}

/// The tables of the `public` schema, as one session sees them (its open transaction's
/// uncommitted writes included).
pub trait CatalogSource: Send + Sync + fmt::Debug {
    /// `name` is already normalized (lowercase unless quoted).
    fn table(&self, name: &str) -> Option<Arc<dyn TableSource>>;
    fn table_names(&self) -> Vec<String>;
    /// Why `name` cannot be read, when it exists but cannot answer (a materialized view that
    /// failed): a query naming it fails with this error instead of reading stale rows.
    fn failure(&self, _name: &str) -> Option<Error> {
        None
    }

    // What `pg_catalog` and `information_schema` show (crates/sql/src/pg_catalog/). The
    // defaults describe an empty database, so a test catalog needs none of them.

    /// Every relation (tables, views, sources) with its OIDs; sinks are not relations.
    fn relations(&self) -> Vec<Relation> {
        Vec::new()
    }
    /// The schemas users' objects live in (`public` and any created ones).
    fn namespaces(&self) -> Vec<Namespace> {
        vec![Namespace { oid: crate::pg_catalog::PUBLIC_OID, name: "public".into() }]
    }
    /// Bytes a relation takes, its log and its state (`pg_total_relation_size`); `None` for an
    /// OID that is not one of the engine's relations.
    fn relation_size(&self, _oid: u32) -> Option<u64> {
        None
    }
    /// Every client session (`pg_stat_activity`).
    fn activity(&self) -> Vec<Activity> {
        Vec::new()
    }
    /// This session's settings by canonical name, as `SHOW ALL` lists them.
    fn settings(&self) -> Vec<(String, String)> {
        Vec::new()
    }
    /// `set_config(name, value, is_local)`: sets a setting for the session (once the statement
    /// ends) and returns the value as it will read, or fails as `SET` would.
    fn set_setting(&self, name: &str, _value: &str) -> eddy_common::Result<String> {
        Err(Error::unsupported(format!("set_config({name}) is not supported here")))
    }
    /// When the server started, in µs since the Unix epoch (`pg_postmaster_start_time()`).
    fn server_start_micros(&self) -> i64 {
        0
    }
}

#[derive(Debug)]
pub(crate) struct SchemaBridge {
    pub source: Arc<dyn CatalogSource>,
    /// `pg_catalog`, which PostgreSQL searches before the search path: `pg_class` alone names
    /// the catalog unless a user relation has that name.
    pub system: Option<Arc<crate::pg_catalog::PgCatalog>>,
}

#[async_trait]
impl SchemaProvider for SchemaBridge {
    fn table_names(&self) -> Vec<String> {
        self.source.table_names()
    }

    async fn table(&self, name: &str) -> DfResult<Option<Arc<dyn TableProvider>>> {
        if let Some(e) = self.source.failure(name) {
            return Err(datafusion::error::DataFusionError::External(Box::new(e)));
        }
        if let Some(t) = self.source.table(name) {
            return Ok(Some(Arc::new(TableBridge::new(t)) as Arc<dyn TableProvider>));
        }
        match &self.system {
            Some(system) => system.build(name),
            None => Ok(None),
        }
    }

    fn table_exist(&self, name: &str) -> bool {
        self.source.table(name).is_some() || self.system.as_ref().is_some_and(|s| s.table_exist(name))
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
