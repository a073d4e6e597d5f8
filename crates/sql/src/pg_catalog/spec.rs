//! The shapes of the system catalogs (read from `tables.txt`, generated from PostgreSQL 15)
//! and a builder that fills one with rows by column name.
//!
//! Invariant: every catalog relation Eddy serves has exactly PostgreSQL 15's columns, in its
//! order, with Arrow types that render as PostgreSQL renders those types; a row sets the
//! columns it knows and the others take the table's default (zero/false for the `pg_*` base
//! catalogs, whose columns PostgreSQL declares NOT NULL; NULL for views).

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

use arrow::array::{
    ArrayRef, BooleanBuilder, Float32Builder, Float64Builder, Int16Builder, Int32Builder,
    Int64Builder, ListBuilder, RecordBatch, StringBuilder, TimestampMicrosecondBuilder,
    UInt32Builder,
};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion::catalog::TableProvider;
use datafusion::datasource::MemTable;
use datafusion::error::Result as DfResult;

use crate::types::PG_TYPE_KEY;

/// One catalog relation: its schema, name, OID, relkind and columns as PostgreSQL 15 has them.
#[derive(Debug)]
pub(crate) struct TableSpec {
    pub schema: &'static str,
    pub name: &'static str,
    pub oid: u32,
    /// `r` (a table) or `v` (a view), as in PostgreSQL.
    pub relkind: &'static str,
    /// (name, PostgreSQL type as `format_type` prints it).
    pub columns: Vec<(&'static str, &'static str)>,
}

static SPECS: LazyLock<Vec<TableSpec>> = LazyLock::new(|| parse_specs(include_str!("tables.txt")));

fn parse_specs(text: &'static str) -> Vec<TableSpec> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|line| {
            let mut parts = line.splitn(5, '|');
            let (schema, name, oid, relkind, columns) = (
                parts.next()?,
                parts.next()?,
                parts.next()?,
                parts.next()?,
                parts.next()?,
            );
            let columns = columns
                .split(", ")
                .filter_map(|c| c.split_once(' '))
                .collect();
            Some(TableSpec {
                schema,
                name,
                oid: oid.parse().ok()?,
                relkind,
                columns,
            })
        })
        .collect()
}

/// Every catalog relation, `pg_catalog`'s first.
pub(crate) fn specs() -> &'static [TableSpec] {
    &SPECS
}

pub(crate) fn spec(schema: &str, name: &str) -> Option<&'static TableSpec> {
    SPECS.iter().find(|s| s.schema == schema && s.name == name)
}

/// The element type of an array type name (`text[]`, `int2vector`), if it is one.
fn element_type(pg_type: &str) -> Option<&str> {
    match pg_type {
        "int2vector" => Some("smallint"),
        "oidvector" => Some("oid"),
        _ => pg_type.strip_suffix("[]"),
    }
}

/// The Arrow field for a catalog column of PostgreSQL type `pg_type`.
pub(crate) fn field(name: &str, pg_type: &str) -> Field {
    if let Some(element) = element_type(pg_type) {
        let item = field("item", element);
        let list = Field::new(name, DataType::List(Arc::new(item)), true);
        // `int2vector` and `oidvector` have their own type and text form.
        return match pg_type {
            "int2vector" | "oidvector" => list.with_metadata(HashMap::from([(
                PG_TYPE_KEY.to_owned(),
                pg_type.to_owned(),
            )])),
            _ => list,
        };
    }
    let (data_type, declared) = match pg_type {
        "oid" | "regclass" | "regtype" | "regnamespace" => (DataType::UInt32, Some("oid")),
        "xid" => (DataType::UInt32, Some("xid")),
        "name" | "information_schema.sql_identifier" => (DataType::Utf8, Some("name")),
        "\"char\"" => (DataType::Utf8, Some("\"char\"")),
        "regproc" => (DataType::Utf8, Some("regproc")),
        "boolean" => (DataType::Boolean, None),
        "smallint" => (DataType::Int16, None),
        "integer" | "information_schema.cardinal_number" => (DataType::Int32, None),
        "bigint" => (DataType::Int64, None),
        "real" => (DataType::Float32, None),
        "double precision" => (DataType::Float64, None),
        "timestamp with time zone" | "information_schema.time_stamp" => (
            DataType::Timestamp(TimeUnit::Microsecond, Some(crate::types::UTC.into())),
            None,
        ),
        _ => (DataType::Utf8, None),
    };
    let field = Field::new(name, data_type, true);
    match declared {
        Some(d) => field.with_metadata(HashMap::from([(PG_TYPE_KEY.to_owned(), d.to_owned())])),
        None => field,
    }
}

impl TableSpec {
    pub(crate) fn arrow_schema(&self) -> SchemaRef {
        Arc::new(Schema::new(
            self.columns
                .iter()
                .map(|(n, t)| field(n, t))
                .collect::<Vec<_>>(),
        ))
    }

    /// A builder whose unset columns are NULL (views) or zero/false (base catalogs).
    pub(crate) fn builder(&'static self) -> Rows {
        Rows {
            spec: self,
            rows: Vec::new(),
            zero_defaults: self.relkind == "r" && self.schema == "pg_catalog",
        }
    }
}

/// A catalog value, converted to the column's Arrow type when the table is built.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Text(String),
    List(Vec<Value>),
}

impl From<bool> for Value {
    fn from(v: bool) -> Self {
        Value::Bool(v)
    }
}
impl From<&str> for Value {
    fn from(v: &str) -> Self {
        Value::Text(v.to_owned())
    }
}
impl From<String> for Value {
    fn from(v: String) -> Self {
        Value::Text(v)
    }
}
impl From<&String> for Value {
    fn from(v: &String) -> Self {
        Value::Text(v.clone())
    }
}
macro_rules! int_value {
    ($($t:ty),*) => {$(impl From<$t> for Value { fn from(v: $t) -> Self { Value::Int(v as i64) } })*};
}
int_value!(i16, i32, i64, u32, usize, u64);
impl From<f64> for Value {
    fn from(v: f64) -> Self {
        Value::Float(v)
    }
}
impl<T: Into<Value>> From<Option<T>> for Value {
    fn from(v: Option<T>) -> Self {
        v.map_or(Value::Null, Into::into)
    }
}
impl<T: Into<Value>> From<Vec<T>> for Value {
    fn from(v: Vec<T>) -> Self {
        Value::List(v.into_iter().map(Into::into).collect())
    }
}

/// The rows of one catalog relation, set column by column.
pub(crate) struct Rows {
    spec: &'static TableSpec,
    rows: Vec<Vec<Value>>,
    zero_defaults: bool,
}

impl Rows {
    /// Adds a row from (column, value) pairs; unnamed columns take the default.
    pub(crate) fn push<const N: usize>(&mut self, values: [(&str, Value); N]) {
        let mut row = vec![None; self.spec.columns.len()];
        for (name, value) in values {
            // A column this table does not have is a typo in Eddy's code: fail loudly in tests.
            let index = self.spec.columns.iter().position(|(c, _)| *c == name);
            debug_assert!(index.is_some(), "{}.{name} is not a column", self.spec.name);
            if let Some(i) = index {
                row[i] = Some(value);
            }
        }
        self.rows.push(
            row.into_iter()
                .enumerate()
                .map(|(i, v)| v.unwrap_or_else(|| self.default(i)))
                .collect(),
        );
    }

    fn default(&self, column: usize) -> Value {
        if !self.zero_defaults {
            return Value::Null;
        }
        match self.spec.columns[column].1 {
            "boolean" => Value::Bool(false),
            "oid" | "regclass" | "regtype" | "xid" | "smallint" | "integer" | "bigint" => {
                Value::Int(0)
            }
            "real" | "double precision" => Value::Float(0.0),
            "regproc" => Value::Text("-".into()),
            _ => Value::Null,
        }
    }

    pub(crate) fn batch(self) -> DfResult<RecordBatch> {
        let schema = self.spec.arrow_schema();
        let columns = schema
            .fields()
            .iter()
            .enumerate()
            .map(|(i, f)| column(f.data_type(), self.rows.iter().map(|r| &r[i])))
            .collect();
        Ok(RecordBatch::try_new(schema, columns)?)
    }

    pub(crate) fn table(self) -> DfResult<Arc<dyn TableProvider>> {
        let batch = self.batch()?;
        Ok(Arc::new(MemTable::try_new(
            batch.schema(),
            vec![vec![batch]],
        )?))
    }
}

fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        Value::Bool(b) => Some(i64::from(*b)),
        Value::Float(f) => Some(*f as i64),
        Value::Text(t) => t.parse().ok(),
        _ => None,
    }
}

fn float(v: &Value) -> Option<f64> {
    match v {
        Value::Float(f) => Some(*f),
        Value::Int(i) => Some(*i as f64),
        _ => None,
    }
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::Null | Value::List(_) => None,
        Value::Text(t) => Some(t.clone()),
        Value::Bool(b) => Some(if *b { "t" } else { "f" }.to_owned()),
        Value::Int(i) => Some(i.to_string()),
        Value::Float(f) => Some(f.to_string()),
    }
}

/// One Arrow column of `data_type` from values (types `field` produces only).
fn column<'a>(data_type: &DataType, values: impl Iterator<Item = &'a Value>) -> ArrayRef {
    macro_rules! primitive {
        ($builder:ty, $convert:expr) => {{
            let mut b = <$builder>::new();
            for v in values {
                b.append_option($convert(v));
            }
            Arc::new(b.finish()) as ArrayRef
        }};
    }
    match data_type {
        DataType::Boolean => primitive!(BooleanBuilder, |v: &Value| match v {
            Value::Bool(b) => Some(*b),
            _ => None,
        }),
        DataType::Int16 => primitive!(Int16Builder, |v| int(v).map(|i| i as i16)),
        DataType::Int32 => primitive!(Int32Builder, |v| int(v).map(|i| i as i32)),
        DataType::Int64 => primitive!(Int64Builder, int),
        DataType::UInt32 => primitive!(UInt32Builder, |v| int(v).map(|i| i as u32)),
        DataType::Float32 => primitive!(Float32Builder, |v| float(v).map(|f| f as f32)),
        DataType::Float64 => primitive!(Float64Builder, float),
        DataType::Timestamp(_, tz) => {
            let mut b = TimestampMicrosecondBuilder::new();
            for v in values {
                b.append_option(int(v));
            }
            Arc::new(b.finish().with_timezone_opt(tz.clone()))
        }
        DataType::List(item) => {
            let mut b = ListBuilder::new(StringBuilder::new());
            // Build lists of text first, then cast the items: one path for every element type.
            for v in values {
                match v {
                    Value::List(items) => {
                        for item in items {
                            b.values().append_option(text(item));
                        }
                        b.append(true);
                    }
                    _ => b.append_null(),
                }
            }
            let strings = b.finish();
            let (_, offsets, items, nulls) = strings.into_parts();
            let items = arrow::compute::cast(&items, item.data_type())
                .unwrap_or_else(|_| arrow::array::new_null_array(item.data_type(), items.len()));
            Arc::new(arrow::array::ListArray::new(
                Arc::clone(item),
                offsets,
                items,
                nulls,
            ))
        }
        _ => primitive!(StringBuilder, text),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_catalog_parses() {
        assert!(specs().len() > 80);
        let class = spec("pg_catalog", "pg_class").unwrap();
        assert_eq!(
            (class.oid, class.columns[0], class.columns.len()),
            (1259, ("oid", "oid"), 33)
        );
        for s in specs() {
            s.arrow_schema();
        }
    }

    #[test]
    fn rows_take_defaults() {
        let mut rows = spec("pg_catalog", "pg_namespace").unwrap().builder();
        rows.push([("oid", 11u32.into()), ("nspname", "pg_catalog".into())]);
        rows.push([
            ("oid", 2200u32.into()),
            ("nspname", "public".into()),
            ("nspacl", vec!["a", "b"].into()),
        ]);
        let batch = rows.batch().unwrap();
        assert_eq!(batch.num_rows(), 2);
        assert_eq!(
            batch
                .column(2)
                .as_any()
                .downcast_ref::<arrow::array::UInt32Array>()
                .unwrap()
                .value(0),
            0
        );
        assert!(batch.column(3).is_null(0));
    }
}
