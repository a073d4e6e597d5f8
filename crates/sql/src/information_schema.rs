//! `information_schema` as PostgreSQL shows it: `tables`, `columns`, `views` and `schemata`,
//! computed from the session's catalog when a query reads them, with PostgreSQL type names
//! (`integer`, `character varying`, ...) rather than Arrow's. BI tools and drivers list
//! relations and columns through it.

use std::sync::Arc;

use arrow::array::{ArrayRef, Int32Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use async_trait::async_trait;
use datafusion::catalog::{SchemaProvider, TableProvider};
use datafusion::datasource::MemTable;
use datafusion::error::Result as DfResult;

use crate::catalog::CatalogSource;
use crate::planner::CATALOG_NAME;
use crate::types::pg_type_name;

pub(crate) const SCHEMA: &str = "information_schema";
const TABLES: [&str; 4] = ["tables", "columns", "views", "schemata"];

#[derive(Debug)]
pub(crate) struct InformationSchema {
    pub source: Arc<dyn CatalogSource>,
}

#[async_trait]
impl SchemaProvider for InformationSchema {
    fn table_names(&self) -> Vec<String> {
        TABLES.iter().map(|t| (*t).to_owned()).collect()
    }

    async fn table(&self, name: &str) -> DfResult<Option<Arc<dyn TableProvider>>> {
        let (schema, columns) = match name {
            "tables" => tables(self.source.as_ref()),
            "columns" => columns(self.source.as_ref()),
            "views" => views(self.source.as_ref()),
            "schemata" => schemata(self.source.as_ref()),
            _ => return Ok(None),
        };
        let batch = RecordBatch::try_new(Arc::clone(&schema), columns)?;
        Ok(Some(Arc::new(MemTable::try_new(schema, vec![vec![batch]])?)))
    }

    fn table_exist(&self, name: &str) -> bool {
        TABLES.contains(&name)
    }
}

fn text(name: &str) -> Field {
    Field::new(name, DataType::Utf8, true)
}

fn strings<S: AsRef<str>>(values: impl IntoIterator<Item = Option<S>>) -> ArrayRef {
    Arc::new(StringArray::from(values.into_iter().map(|v| v.map(|s| s.as_ref().to_owned())).collect::<Vec<_>>()))
}

/// Every relation of the catalog but Eddy's own tables, with its `table_type` and schema.
fn relations(source: &dyn CatalogSource) -> Vec<(String, &'static str, SchemaRef, String)> {
    source
        .relations()
        .into_iter()
        .filter(|(_, _, t)| t.kind() != crate::RelationKind::System)
        .map(|(schema, name, t)| (name, t.table_type(), t.schema(), schema))
        .collect()
}

fn tables(source: &dyn CatalogSource) -> (SchemaRef, Vec<ArrayRef>) {
    let schema = Arc::new(Schema::new(vec![text("table_catalog"), text("table_schema"), text("table_name"), text("table_type")]));
    let rows = relations(source);
    let columns = vec![
        strings(rows.iter().map(|_| Some(CATALOG_NAME))),
        strings(rows.iter().map(|r| Some(r.3.as_str()))),
        strings(rows.iter().map(|r| Some(r.0.as_str()))),
        strings(rows.iter().map(|r| Some(r.1))),
    ];
    (schema, columns)
}

fn views(source: &dyn CatalogSource) -> (SchemaRef, Vec<ArrayRef>) {
    let schema = Arc::new(Schema::new(vec![text("table_catalog"), text("table_schema"), text("table_name")]));
    let rows: Vec<_> = relations(source).into_iter().filter(|r| r.1 == "VIEW").collect();
    let columns = vec![
        strings(rows.iter().map(|_| Some(CATALOG_NAME))),
        strings(rows.iter().map(|r| Some(r.3.as_str()))),
        strings(rows.iter().map(|r| Some(r.0.as_str()))),
    ];
    (schema, columns)
}

fn schemata(source: &dyn CatalogSource) -> (SchemaRef, Vec<ArrayRef>) {
    let schema = Arc::new(Schema::new(vec![text("catalog_name"), text("schema_name"), text("schema_owner")]));
    let mut names: Vec<String> = source.schemas().into_iter().map(|s| s.name).collect();
    names.push(SCHEMA.to_owned());
    let columns = vec![strings(names.iter().map(|_| Some(CATALOG_NAME))), strings(names.iter().map(Some)), strings(names.iter().map(|_| Some("eddy")))];
    (schema, columns)
}

/// One column as `information_schema.columns` describes it.
struct ColumnInfo {
    data_type: String,
    udt_name: &'static str,
    character_maximum_length: Option<i32>,
    numeric_precision: Option<i32>,
    numeric_scale: Option<i32>,
}

/// Splits a declared PostgreSQL type (`numeric(10,2)`, `character varying(5)`) into what
/// `information_schema.columns` reports.
fn column_info(pg_type: &str) -> ColumnInfo {
    let (base, modifiers) = match pg_type.split_once('(') {
        Some((base, rest)) => (base.trim(), rest.trim_end_matches(')').split(',').filter_map(|m| m.trim().parse::<i32>().ok()).collect::<Vec<_>>()),
        None => (pg_type, Vec::new()),
    };
    let mut info = ColumnInfo { data_type: base.to_owned(), udt_name: "text", character_maximum_length: None, numeric_precision: None, numeric_scale: None };
    let integer = |bits: i32, info: &mut ColumnInfo| {
        info.numeric_precision = Some(bits);
        info.numeric_scale = Some(0);
    };
    info.udt_name = match base {
        "boolean" => "bool",
        "smallint" => {
            integer(16, &mut info);
            "int2"
        }
        "integer" => {
            integer(32, &mut info);
            "int4"
        }
        "bigint" => {
            integer(64, &mut info);
            "int8"
        }
        "real" => {
            info.numeric_precision = Some(24);
            "float4"
        }
        "double precision" => {
            info.numeric_precision = Some(53);
            "float8"
        }
        "numeric" => {
            info.numeric_precision = modifiers.first().copied();
            info.numeric_scale = modifiers.get(1).copied();
            "numeric"
        }
        "character varying" => {
            info.character_maximum_length = modifiers.first().copied();
            "varchar"
        }
        "character" => {
            info.character_maximum_length = modifiers.first().copied();
            "bpchar"
        }
        "bytea" => "bytea",
        "date" => "date",
        "time without time zone" => "time",
        "timestamp without time zone" => "timestamp",
        "timestamp with time zone" => "timestamptz",
        "interval" => "interval",
        "json" => "json",
        "jsonb" => "jsonb",
        _ => "text",
    };
    info
}

fn columns(source: &dyn CatalogSource) -> (SchemaRef, Vec<ArrayRef>) {
    let schema = Arc::new(Schema::new(vec![
        text("table_catalog"),
        text("table_schema"),
        text("table_name"),
        text("column_name"),
        Field::new("ordinal_position", DataType::Int32, false),
        text("column_default"),
        text("is_nullable"),
        text("data_type"),
        Field::new("character_maximum_length", DataType::Int32, true),
        Field::new("numeric_precision", DataType::Int32, true),
        Field::new("numeric_scale", DataType::Int32, true),
        text("udt_name"),
    ]));
    let mut rows: Vec<(String, i32, String, bool, ColumnInfo, String)> = Vec::new();
    for (table, _, table_schema, schema) in relations(source) {
        for (i, field) in table_schema.fields().iter().enumerate() {
            rows.push((table.clone(), i as i32 + 1, field.name().clone(), field.is_nullable(), column_info(&pg_type_name(field)), schema.clone()));
        }
    }
    let columns = vec![
        strings(rows.iter().map(|_| Some(CATALOG_NAME))),
        strings(rows.iter().map(|r| Some(r.5.as_str()))),
        strings(rows.iter().map(|r| Some(r.0.as_str()))),
        strings(rows.iter().map(|r| Some(r.2.as_str()))),
        Arc::new(Int32Array::from(rows.iter().map(|r| r.1).collect::<Vec<_>>())) as ArrayRef,
        strings(rows.iter().map(|_| None::<&str>)),
        strings(rows.iter().map(|r| Some(if r.3 { "YES" } else { "NO" }))),
        strings(rows.iter().map(|r| Some(r.4.data_type.as_str()))),
        Arc::new(Int32Array::from(rows.iter().map(|r| r.4.character_maximum_length).collect::<Vec<_>>())),
        Arc::new(Int32Array::from(rows.iter().map(|r| r.4.numeric_precision).collect::<Vec<_>>())),
        Arc::new(Int32Array::from(rows.iter().map(|r| r.4.numeric_scale).collect::<Vec<_>>())),
        strings(rows.iter().map(|r| Some(r.4.udt_name))),
    ];
    (schema, columns)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn declared_types_split_into_name_and_modifiers() {
        let v = column_info("character varying(5)");
        assert_eq!((v.data_type.as_str(), v.udt_name, v.character_maximum_length), ("character varying", "varchar", Some(5)));
        let n = column_info("numeric(10,2)");
        assert_eq!((n.data_type.as_str(), n.udt_name, n.numeric_precision, n.numeric_scale), ("numeric", "numeric", Some(10), Some(2)));
        let t = column_info("timestamp with time zone");
        assert_eq!((t.data_type.as_str(), t.udt_name), ("timestamp with time zone", "timestamptz"));
        let i = column_info("integer");
        assert_eq!((i.udt_name, i.numeric_precision, i.numeric_scale), ("int4", Some(32), Some(0)));
    }
}
