//! The bridge from the engine's catalog to DataFusion: the engine implements [`CatalogSource`]
//! and [`TableSource`]; this module wraps them as DataFusion catalog, schema and table
//! providers. Catalog views (`pg_catalog`, `information_schema`) read the same trait.

use std::fmt;
use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch};
use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use datafusion::catalog::SchemaProvider;
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::ScalarValue;
use datafusion::datasource::TableType;
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::error::Result as DfResult;
use datafusion::execution::TaskContext;
use datafusion::logical_expr::utils::split_conjunction;
use datafusion::logical_expr::{BinaryExpr, Expr, Operator, TableProviderFilterPushDown};
use datafusion::physical_plan::streaming::{PartitionStream, StreamingTableExec};
use datafusion::physical_plan::{ExecutionPlan, SendableRecordBatchStream};
use eddy_common::Error;

use crate::pg_catalog::{Activity, Namespace, Relation};

/// A table as the planner sees it: a schema and a consistent snapshot of its rows.
#[async_trait]
pub trait TableSource: Send + Sync + fmt::Debug {
    /// The catalog id of the table or view (what dataflows name as their sources).
    fn object_id(&self) -> eddy_common::ObjectId;
    fn schema(&self) -> SchemaRef;
    /// The table's current contents, read when a statement's plan is made executable. Repeated
    /// calls within one statement must return the same snapshot (the engine hands out an
    /// immutable `Arc`ed copy). It may wait, asynchronously (a materialized view's contents
    /// being published); an error fails the statement.
    async fn scan(&self) -> eddy_common::Result<Arc<Vec<RecordBatch>>>;
    /// Contents too large to hold in memory (an append-only table's log), read as a stream
    /// each time a plan runs; `None` (the default): [`TableSource::scan`] gives them.
    fn stream(&self) -> Option<Arc<dyn StreamSource>> {
        None
    }
    /// The columns of the primary key, in key order (empty: none).
    fn primary_key(&self) -> Vec<usize> {
        Vec::new()
    }
    /// The rows of the statement's snapshot whose primary key is one of `key` (one array per
    /// key column, of the column's type, a value per key), found by the table's index; `None`
    /// when the source cannot (then the plan scans every row).
    fn lookup(&self, _key: &[ArrayRef]) -> Option<eddy_common::Result<Vec<RecordBatch>>> {
        None
    }
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

/// A frozen relation read as a stream of batches: every `open` yields the same rows.
pub trait StreamSource: Send + Sync + fmt::Debug {
    /// The rows, only the columns `projection` picks (all when `None`), labelled with
    /// `schema` (those columns, perhaps with other nullability); errors come as items of the
    /// stream.
    fn open(&self, projection: Option<&[usize]>, schema: SchemaRef) -> SendableRecordBatchStream;
}

/// One [`StreamSource`] as DataFusion's partition of a streaming scan, its projection read by
/// the source itself.
#[derive(Debug)]
struct StreamPartition {
    source: Arc<dyn StreamSource>,
    projection: Option<Vec<usize>>,
    schema: SchemaRef,
}

impl PartitionStream for StreamPartition {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        self.source
            .open(self.projection.as_deref(), Arc::clone(&self.schema))
    }
}

/// The schema PostgreSQL creates in every database.
pub use crate::pg_catalog::objects::PUBLIC_SCHEMA;
/// The schema of Eddy's own tables (`eddy_dead_letters`, `eddy_views`, ...).
pub const EDDY_CATALOG_SCHEMA: &str = "eddy_catalog";
/// `eddy_catalog`'s OID (below [`crate::pg_catalog::objects::FIRST_USER_OID`], like
/// PostgreSQL's own schemas).
pub const EDDY_CATALOG_OID: u32 = 16383;

/// A plain view as its definition stands (what the planner expands where it is named).
#[derive(Debug, Clone)]
pub struct ViewDefinition {
    pub id: eddy_common::ObjectId,
    /// The view's query as written (`SELECT ...`), with every relation it names that is not
    /// found in `public` or a system schema qualified by its schema.
    pub query: String,
    /// The view's column names, in order.
    pub columns: Vec<String>,
}

/// The catalog as one session sees it (its open transaction's uncommitted writes included):
/// the relations of each schema, plain views' definitions, and the session's search path.
/// Names are already normalized (lowercase unless quoted). Sinks are not relations.
pub trait CatalogSource: Send + Sync + fmt::Debug {
    /// The relation `schema.name` of any kind (a plain view too: its columns, never
    /// scanned), `None` when there is none. Eddy's own tables are in `eddy_catalog`.
    fn table(&self, schema: &str, name: &str) -> Option<Arc<dyn TableSource>>;
    /// The names of the relations in `schema` (empty when it does not exist).
    fn table_names(&self, schema: &str) -> Vec<String>;
    /// Where an unqualified relation name is looked up, in order: `pg_catalog` (unless the
    /// session's `search_path` places it), `eddy_catalog` (likewise), then the existing
    /// schemas of `search_path` (`$user` expanded). What `current_schemas(true)` returns.
    fn search_path(&self) -> Vec<String> {
        vec![
            "pg_catalog".to_owned(),
            EDDY_CATALOG_SCHEMA.to_owned(),
            PUBLIC_SCHEMA.to_owned(),
        ]
    }
    /// The definition of plain view `schema.name`, `None` when it is not one.
    fn view_definition(&self, _schema: &str, _name: &str) -> Option<ViewDefinition> {
        None
    }
    /// Why `schema.name` cannot be read, when it exists but cannot answer (a materialized
    /// view that failed): a query naming it fails with this error instead of reading stale rows.
    fn failure(&self, _schema: &str, _name: &str) -> Option<Error> {
        None
    }

    // What `pg_catalog` and `information_schema` show (crates/sql/src/pg_catalog/). The
    // defaults describe an empty database, so a test catalog needs none of them.

    /// Every relation (tables, plain and materialized views, sources) with its OIDs and
    /// schema (`Relation::schema`, `Relation::namespace_oid`); a plain view's
    /// `Relation::definition` is its query (`pg_get_viewdef`). Sinks are not relations.
    fn relations(&self) -> Vec<Relation> {
        Vec::new()
    }
    /// The schemas users' objects live in (`public`, `eddy_catalog` and those made with
    /// `CREATE SCHEMA`), each with an OID kept across restarts, in OID order.
    fn namespaces(&self) -> Vec<Namespace> {
        vec![Namespace {
            oid: crate::pg_catalog::PUBLIC_OID,
            name: "public".into(),
        }]
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
        Err(Error::unsupported(format!(
            "set_config({name}) is not supported here"
        )))
    }
    /// When the server started, in µs since the Unix epoch (`pg_postmaster_start_time()`).
    fn server_start_micros(&self) -> i64 {
        0
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
        Ok(self
            .source
            .table(&self.schema, name)
            .map(|t| Arc::new(TableBridge::new(t)) as Arc<dyn TableProvider>))
    }

    fn table_exist(&self, name: &str) -> bool {
        self.source.table(&self.schema, name).is_some()
    }
}

/// DataFusion's view of the `eddy` catalog: the schemas the planner serves itself
/// (`pg_catalog`, `information_schema`) and every schema of the [`CatalogSource`].
#[derive(Debug)]
pub(crate) struct CatalogBridge {
    pub source: Arc<dyn CatalogSource>,
    pub fixed: std::sync::RwLock<std::collections::BTreeMap<String, Arc<dyn SchemaProvider>>>,
}

impl datafusion::catalog::CatalogProvider for CatalogBridge {
    fn schema_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .fixed
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .cloned()
            .collect();
        names.extend(self.source.namespaces().into_iter().map(|s| s.name));
        names
    }

    fn schema(&self, name: &str) -> Option<Arc<dyn SchemaProvider>> {
        if let Some(fixed) = self
            .fixed
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
        {
            return Some(Arc::clone(fixed));
        }
        self.source
            .namespaces()
            .iter()
            .any(|s| s.name == name)
            .then(|| {
                Arc::new(SchemaBridge {
                    source: Arc::clone(&self.source),
                    schema: name.to_owned(),
                }) as Arc<dyn SchemaProvider>
            })
    }

    fn register_schema(
        &self,
        name: &str,
        schema: Arc<dyn SchemaProvider>,
    ) -> DfResult<Option<Arc<dyn SchemaProvider>>> {
        Ok(self
            .fixed
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.to_owned(), schema))
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
        let fields: Vec<arrow::datatypes::Field> = table
            .fields()
            .iter()
            .map(|f| f.as_ref().clone().with_nullable(true))
            .collect();
        let schema = Arc::new(arrow::datatypes::Schema::new_with_metadata(
            fields,
            table.metadata().clone(),
        ));
        TableBridge { source, schema }
    }
}

impl TableBridge {
    /// The primary keys `filters` pin down, as arrays of the key columns' types: one key
    /// (`key_column = constant` for every key column, among their conjuncts), or on a single
    /// integer key column bounded on both sides by integer constants (`BETWEEN`, `>=`, `>`,
    /// `<=`, `<`) every value of the range, up to [`RANGE_LOOKUP_MAX`] of them. The filters
    /// are applied again above the rows found.
    fn key_in(&self, filters: &[Expr]) -> Option<Vec<ArrayRef>> {
        let key = self.source.primary_key();
        if key.is_empty() {
            return None;
        }
        let mut values: Vec<Option<ScalarValue>> = vec![None; key.len()];
        for conjunct in filters.iter().flat_map(split_conjunction) {
            let Expr::BinaryExpr(BinaryExpr {
                left,
                op: Operator::Eq,
                right,
            }) = conjunct
            else {
                continue;
            };
            let ((Expr::Column(column), Expr::Literal(value, _))
            | (Expr::Literal(value, _), Expr::Column(column))) = (left.as_ref(), right.as_ref())
            else {
                continue;
            };
            let Ok(index) = self.schema.index_of(&column.name) else {
                continue;
            };
            if let Some(at) = key.iter().position(|&k| k == index) {
                values[at] = Some(value.clone());
            }
        }
        key.iter()
            .zip(values)
            .map(|(&column, value)| {
                let data_type = self.schema.field(column).data_type();
                if !equal_means_same_bytes(data_type) {
                    return None;
                }
                let value = value?.cast_to(data_type).ok()?;
                value.to_array_of_size(1).ok()
            })
            .collect::<Option<Vec<ArrayRef>>>()
            .or_else(|| self.key_range(&key, filters))
    }

    /// Every value of a single integer key column between the bounds `filters` give it (see
    /// [`TableBridge::key_in`]).
    fn key_range(&self, key: &[usize], filters: &[Expr]) -> Option<Vec<ArrayRef>> {
        use arrow::datatypes::DataType as T;
        let [column] = key else {
            return None;
        };
        let data_type = self.schema.field(*column).data_type();
        let (min, max) = match data_type {
            T::Int8 => (i128::from(i8::MIN), i128::from(i8::MAX)),
            T::Int16 => (i128::from(i16::MIN), i128::from(i16::MAX)),
            T::Int32 => (i128::from(i32::MIN), i128::from(i32::MAX)),
            T::Int64 => (i128::from(i64::MIN), i128::from(i64::MAX)),
            _ => return None,
        };
        let is_key =
            |c: &datafusion::common::Column| self.schema.index_of(&c.name).ok() == Some(*column);
        let (mut low, mut high) = (None::<i128>, None::<i128>);
        let mut bound = |op: Operator, value: i128| match op {
            Operator::Gt => low = Some(low.map_or(value + 1, |l| l.max(value + 1))),
            Operator::GtEq => low = Some(low.map_or(value, |l| l.max(value))),
            Operator::Lt => high = Some(high.map_or(value - 1, |h| h.min(value - 1))),
            Operator::LtEq => high = Some(high.map_or(value, |h| h.min(value))),
            _ => {}
        };
        for conjunct in filters.iter().flat_map(split_conjunction) {
            match conjunct {
                Expr::Between(b) if !b.negated => {
                    if let (Expr::Column(c), Some(l), Some(h)) =
                        (b.expr.as_ref(), integer(&b.low), integer(&b.high))
                        && is_key(c)
                    {
                        bound(Operator::GtEq, l);
                        bound(Operator::LtEq, h);
                    }
                }
                Expr::BinaryExpr(BinaryExpr { left, op, right }) => {
                    match (left.as_ref(), right.as_ref()) {
                        (Expr::Column(c), value) if is_key(c) => {
                            if let Some(v) = integer(value) {
                                bound(*op, v);
                            }
                        }
                        (value, Expr::Column(c)) if is_key(c) => {
                            if let (Some(v), Some(op)) = (integer(value), op.swap()) {
                                bound(op, v);
                            }
                        }
                        _ => {}
                    }
                }
                _ => {}
            }
        }
        let (low, high) = (low?.max(min), high?.min(max));
        if high - low >= RANGE_LOOKUP_MAX {
            return None;
        }
        // Within the key type's range, so within i64's.
        let values: arrow::array::Int64Array = (low..=high)
            .filter_map(|v| i64::try_from(v).ok())
            .collect::<Vec<i64>>()
            .into();
        let values = arrow::compute::cast(&values, data_type).ok()?;
        Some(vec![values])
    }
}

/// Most keys a range of an integer primary key is looked up by, one probe each; past it the
/// table is scanned (a probe costs about as much as filtering a hundred rows of a scan).
const RANGE_LOOKUP_MAX: i128 = 1024;

/// The value of an integer constant.
fn integer(expr: &Expr) -> Option<i128> {
    let Expr::Literal(value, _) = expr else {
        return None;
    };
    match value {
        ScalarValue::Int8(Some(v)) => Some(i128::from(*v)),
        ScalarValue::Int16(Some(v)) => Some(i128::from(*v)),
        ScalarValue::Int32(Some(v)) => Some(i128::from(*v)),
        ScalarValue::Int64(Some(v)) => Some(i128::from(*v)),
        ScalarValue::UInt8(Some(v)) => Some(i128::from(*v)),
        ScalarValue::UInt16(Some(v)) => Some(i128::from(*v)),
        ScalarValue::UInt32(Some(v)) => Some(i128::from(*v)),
        ScalarValue::UInt64(Some(v)) => Some(i128::from(*v)),
        _ => None,
    }
}

/// Whether two values of `data_type` are `=` exactly when their encodings are the same (what
/// an index probe compares). Not floats (`-0.0 = 0.0`) nor intervals (`'1 day' = '24 hours'`).
fn equal_means_same_bytes(data_type: &arrow::datatypes::DataType) -> bool {
    use arrow::datatypes::DataType as T;
    matches!(
        data_type,
        T::Boolean
            | T::Int8
            | T::Int16
            | T::Int32
            | T::Int64
            | T::UInt8
            | T::UInt16
            | T::UInt32
            | T::UInt64
            | T::Utf8
            | T::LargeUtf8
            | T::Utf8View
            | T::Binary
            | T::LargeBinary
            | T::Date32
            | T::Timestamp(_, _)
            | T::Decimal128(_, _)
    )
}

#[async_trait]
impl TableProvider for TableBridge {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    /// Filters reach [`TableBridge::scan`] on a table with a primary key (which may answer
    /// them by its index), and are applied again above it.
    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> DfResult<Vec<TableProviderFilterPushDown>> {
        let pushdown = if self.source.primary_key().is_empty() {
            TableProviderFilterPushDown::Unsupported
        } else {
            TableProviderFilterPushDown::Inexact
        };
        Ok(vec![pushdown; filters.len()])
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        if let Some(key) = self.key_in(filters)
            && let Some(found) = self.source.lookup(&key)
        {
            let batches = found
                .map_err(|e| datafusion::error::DataFusionError::External(Box::new(e)))?
                .into_iter()
                .map(|b| b.with_schema(Arc::clone(&self.schema)))
                .collect::<Result<Vec<_>, _>>()?;
            return MemorySourceConfig::try_new_exec(
                &[batches],
                self.schema(),
                projection.cloned(),
            )
            .map(|e| e as Arc<dyn ExecutionPlan>);
        }
        if let Some(source) = self.source.stream() {
            let schema = match projection {
                Some(p) => Arc::new(self.schema.project(p)?),
                None => self.schema(),
            };
            let partition = Arc::new(StreamPartition {
                source,
                projection: projection.cloned(),
                schema: Arc::clone(&schema),
            });
            return Ok(Arc::new(StreamingTableExec::try_new(
                schema,
                vec![partition],
                None,
                Vec::new(),
                false,
                limit,
            )?));
        }
        let batches: Vec<RecordBatch> = self
            .source
            .scan()
            .await
            .map_err(|e| datafusion::error::DataFusionError::External(Box::new(e)))?
            .iter()
            .map(|b| b.clone().with_schema(Arc::clone(&self.schema)))
            .collect::<Result<_, _>>()?;
        let exec =
            MemorySourceConfig::try_new_exec(&[batches], self.schema(), projection.cloned())?;
        Ok(exec)
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::AsArray;
    use arrow::datatypes::{DataType, Field, Int32Type, Schema};
    use datafusion::prelude::{col, lit};

    use super::*;

    /// `t (id INT PRIMARY KEY, v TEXT)`.
    #[derive(Debug)]
    struct Keyed;

    #[async_trait]
    impl TableSource for Keyed {
        fn object_id(&self) -> eddy_common::ObjectId {
            eddy_common::ObjectId(1)
        }
        fn schema(&self) -> SchemaRef {
            Arc::new(Schema::new(vec![
                Field::new("id", DataType::Int32, false),
                Field::new("v", DataType::Utf8, true),
            ]))
        }
        async fn scan(&self) -> eddy_common::Result<Arc<Vec<RecordBatch>>> {
            Ok(Arc::new(Vec::new()))
        }
        fn primary_key(&self) -> Vec<usize> {
            vec![0]
        }
    }

    fn keys(filters: &[Expr]) -> Option<Vec<i32>> {
        let found = TableBridge::new(Arc::new(Keyed)).key_in(filters)?;
        Some(found[0].as_primitive::<Int32Type>().values().to_vec())
    }

    #[test]
    fn a_bounded_integer_key_is_looked_up_by_every_value_of_its_range() {
        let id = || col("id");
        assert_eq!(keys(&[id().eq(lit(7))]), Some(vec![7]));
        assert_eq!(
            keys(&[id().between(lit(3), lit(6))]),
            Some(vec![3, 4, 5, 6])
        );
        assert_eq!(
            keys(&[id().gt(lit(3_i64)).and(id().lt_eq(lit(6_i64)))]),
            Some(vec![4, 5, 6])
        );
        // Constant on the left; bounds in separate filters; the tighter bound wins.
        assert_eq!(
            keys(&[lit(3).lt_eq(id()), id().lt(lit(9)), id().lt(lit(6))]),
            Some(vec![3, 4, 5])
        );
        assert_eq!(keys(&[id().between(lit(6), lit(3))]), Some(vec![]));
        // Clipped to the key type's range.
        assert_eq!(
            keys(&[id().between(lit(i64::from(i32::MAX) - 1), lit(i64::MAX))]),
            Some(vec![i32::MAX - 1, i32::MAX])
        );
        // Not looked up: one bound, a wide range, a bound that is not an integer, an OR.
        assert_eq!(keys(&[id().gt(lit(3))]), None);
        assert_eq!(keys(&[id().between(lit(0), lit(1024))]), None);
        assert_eq!(
            keys(&[id().between(lit(0), lit(1023))]).map(|k| k.len()),
            Some(1024)
        );
        assert_eq!(keys(&[id().gt(lit(1.5)).and(id().lt(lit(4)))]), None);
        assert_eq!(keys(&[id().gt(lit(1)).or(id().lt(lit(4)))]), None);
    }
}
