//! `information_schema` as PostgreSQL 15 shows it, from the same snapshot of the catalog as
//! `pg_catalog`: `tables`, `columns`, `views`, `schemata`, `table_constraints` (primary keys and
//! the NOT NULL checks PostgreSQL lists), `check_constraints`, `key_column_usage`,
//! `referential_constraints`, `routines`, `character_sets`; its other views exist with
//! PostgreSQL's columns and no rows. As in PostgreSQL, materialized views appear in none of
//! them (tools find them in `pg_class` / `pg_matviews`); sources are `FOREIGN` tables.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::catalog::{SchemaProvider, TableProvider};
use datafusion::error::Result as DfResult;

use super::objects::{Relation, RelationKind};
use super::spec::{Rows, Value, spec, specs};
use super::types::missing;
use super::{Function, Snapshot};
use crate::catalog::CatalogSource;

pub(crate) const SCHEMA: &str = "information_schema";

#[derive(Debug)]
pub(crate) struct InformationSchema {
    pub source: Arc<dyn CatalogSource>,
    pub database: String,
    pub functions: Arc<Vec<Function>>,
}

#[async_trait]
impl SchemaProvider for InformationSchema {
    fn table_names(&self) -> Vec<String> {
        specs()
            .iter()
            .filter(|s| s.schema == SCHEMA)
            .map(|s| s.name.to_owned())
            .collect()
    }

    async fn table(&self, name: &str) -> DfResult<Option<Arc<dyn TableProvider>>> {
        let Some(table) = spec(SCHEMA, name) else {
            return Ok(None);
        };
        let db = self.database.as_str();
        let rows = match name {
            "tables" => tables(&Snapshot::take(self.source.as_ref()), db)?,
            "columns" => columns(&Snapshot::take(self.source.as_ref()), db)?,
            "views" => views(&Snapshot::take(self.source.as_ref()), db)?,
            "schemata" => schemata(&Snapshot::take(self.source.as_ref()), db)?,
            "table_constraints" => table_constraints(&Snapshot::take(self.source.as_ref()), db)?,
            "check_constraints" => check_constraints(&Snapshot::take(self.source.as_ref()), db)?,
            "key_column_usage" => key_column_usage(&Snapshot::take(self.source.as_ref()), db)?,
            "routines" => routines(&self.functions, db)?,
            "character_sets" => character_sets(db)?,
            _ => table.builder(),
        };
        Ok(Some(rows.table()?))
    }

    fn table_exist(&self, name: &str) -> bool {
        spec(SCHEMA, name).is_some()
    }
}

fn builder(name: &str) -> DfResult<Rows> {
    Ok(spec(SCHEMA, name).ok_or_else(|| missing(name))?.builder())
}

fn yes(b: bool) -> Value {
    Value::from(if b { "YES" } else { "NO" })
}

/// The relations `information_schema` lists: all but materialized views, as PostgreSQL.
fn listed(snapshot: &Snapshot) -> impl Iterator<Item = &Relation> {
    snapshot
        .relations
        .iter()
        .filter(|r| r.kind != RelationKind::MaterializedView)
}

fn table_type(r: &Relation) -> &'static str {
    match r.kind {
        RelationKind::Table | RelationKind::MaterializedView => "BASE TABLE",
        RelationKind::View => "VIEW",
        RelationKind::Source => "FOREIGN",
    }
}

fn tables(snapshot: &Snapshot, db: &str) -> DfResult<Rows> {
    let mut rows = builder("tables")?;
    for r in listed(snapshot) {
        rows.push([
            ("table_catalog", db.into()),
            ("table_schema", (&r.schema).into()),
            ("table_name", (&r.name).into()),
            ("table_type", table_type(r).into()),
            ("is_insertable_into", yes(r.kind == RelationKind::Table)),
            ("is_typed", yes(false)),
        ]);
    }
    Ok(rows)
}

fn views(snapshot: &Snapshot, db: &str) -> DfResult<Rows> {
    let mut rows = builder("views")?;
    for r in listed(snapshot).filter(|r| r.kind == RelationKind::View) {
        rows.push([
            ("table_catalog", db.into()),
            ("table_schema", (&r.schema).into()),
            ("table_name", (&r.name).into()),
            (
                "view_definition",
                super::relations::view_definition(r).into(),
            ),
            ("check_option", "NONE".into()),
            ("is_updatable", yes(false)),
            ("is_insertable_into", yes(false)),
            ("is_trigger_updatable", yes(false)),
            ("is_trigger_deletable", yes(false)),
            ("is_trigger_insertable_into", yes(false)),
        ]);
    }
    Ok(rows)
}

fn schemata(snapshot: &Snapshot, db: &str) -> DfResult<Rows> {
    let mut rows = builder("schemata")?;
    let mut namespaces = snapshot.all_namespaces();
    namespaces.sort_by(|a, b| a.name.cmp(&b.name));
    for n in namespaces {
        let owner = if n.oid == super::PUBLIC_OID {
            "pg_database_owner"
        } else {
            "eddy"
        };
        rows.push([
            ("catalog_name", db.into()),
            ("schema_name", n.name.into()),
            ("schema_owner", owner.into()),
        ]);
    }
    Ok(rows)
}

/// One column as `information_schema.columns` describes it.
struct ColumnInfo {
    data_type: String,
    udt_name: String,
    character_maximum_length: Option<i32>,
    character_octet_length: Option<i32>,
    numeric_precision: Option<i32>,
    numeric_precision_radix: Option<i32>,
    numeric_scale: Option<i32>,
    datetime_precision: Option<i32>,
}

/// Bytes PostgreSQL reports for unbounded text (1 GB).
const TEXT_OCTETS_MAX: i32 = 1_073_741_824;

/// Splits a declared PostgreSQL type (`numeric(10,2)`, `character varying(5)`) into what
/// `information_schema.columns` reports.
fn column_info(pg_type: &str) -> ColumnInfo {
    let (base, modifiers) = match pg_type.split_once('(') {
        Some((base, rest)) => (
            base.trim(),
            rest.trim_end_matches(')')
                .split(',')
                .filter_map(|m| m.trim().parse::<i32>().ok())
                .collect::<Vec<_>>(),
        ),
        None => (pg_type, Vec::new()),
    };
    let mut info = ColumnInfo {
        data_type: base.to_owned(),
        udt_name: String::new(),
        character_maximum_length: None,
        character_octet_length: None,
        numeric_precision: None,
        numeric_precision_radix: None,
        numeric_scale: None,
        datetime_precision: None,
    };
    let oid = super::types::type_oid_named(pg_type).unwrap_or(25);
    info.udt_name = super::types::type_by_oid(oid)
        .map_or("text", |t| t.name)
        .to_owned();
    if pg_type.ends_with("[]") {
        info.data_type = "ARRAY".into();
        return info;
    }
    let mut number = |precision: Option<i32>, radix: i32, scale: Option<i32>| {
        info.numeric_precision = precision;
        info.numeric_precision_radix = Some(radix);
        info.numeric_scale = scale;
    };
    match info.udt_name.as_str() {
        "int2" => number(Some(16), 2, Some(0)),
        "int4" => number(Some(32), 2, Some(0)),
        "int8" => number(Some(64), 2, Some(0)),
        "float4" => number(Some(24), 2, None),
        "float8" => number(Some(53), 2, None),
        "numeric" => number(modifiers.first().copied(), 10, modifiers.get(1).copied()),
        "varchar" | "bpchar" => {
            info.character_maximum_length = modifiers.first().copied();
            info.character_octet_length =
                Some(modifiers.first().map_or(TEXT_OCTETS_MAX, |n| n * 4));
        }
        "text" => info.character_octet_length = Some(TEXT_OCTETS_MAX),
        "date" => info.datetime_precision = Some(0),
        "time" | "timestamp" | "timestamptz" | "interval" => info.datetime_precision = Some(6),
        _ => {}
    }
    info
}

fn columns(snapshot: &Snapshot, db: &str) -> DfResult<Rows> {
    let mut rows = builder("columns")?;
    for r in listed(snapshot) {
        for (i, field) in r.columns.fields().iter().enumerate() {
            let (oid, typmod) = super::relations::attribute_type(r, field, i);
            let info = column_info(&super::types::format_type(oid, Some(typmod)));
            let nullable = field.is_nullable() && !r.primary_key.contains(&i);
            rows.push([
                ("table_catalog", db.into()),
                ("table_schema", (&r.schema).into()),
                ("table_name", (&r.name).into()),
                ("column_name", field.name().into()),
                ("ordinal_position", (i + 1).into()),
                ("is_nullable", yes(nullable)),
                ("column_default", r.column_default(i).into()),
                ("data_type", info.data_type.into()),
                (
                    "character_maximum_length",
                    info.character_maximum_length.into(),
                ),
                ("character_octet_length", info.character_octet_length.into()),
                ("numeric_precision", info.numeric_precision.into()),
                (
                    "numeric_precision_radix",
                    info.numeric_precision_radix.into(),
                ),
                ("numeric_scale", info.numeric_scale.into()),
                ("datetime_precision", info.datetime_precision.into()),
                ("udt_catalog", db.into()),
                ("udt_schema", "pg_catalog".into()),
                ("udt_name", info.udt_name.into()),
                ("dtd_identifier", (i + 1).to_string().into()),
                ("is_self_referencing", yes(false)),
                ("is_identity", yes(false)),
                ("identity_cycle", yes(false)),
                ("is_generated", "NEVER".into()),
                ("is_updatable", yes(r.kind == RelationKind::Table)),
            ]);
        }
    }
    Ok(rows)
}

/// The NOT NULL columns PostgreSQL 15 lists as CHECK constraints named
/// `<schema oid>_<table oid>_<attnum>_not_null`.
fn not_null_checks(r: &Relation) -> Vec<(String, String)> {
    if r.kind != RelationKind::Table || r.oid < super::objects::FIRST_USER_OID {
        return Vec::new();
    }
    r.columns
        .fields()
        .iter()
        .enumerate()
        .filter(|(i, f)| !f.is_nullable() || r.primary_key.contains(i))
        .map(|(i, f)| {
            (
                format!("{}_{}_{}_not_null", r.namespace_oid, r.oid, i + 1),
                format!("{} IS NOT NULL", crate::pg::strings::quote_ident(f.name())),
            )
        })
        .collect()
}

fn table_constraints(snapshot: &Snapshot, db: &str) -> DfResult<Rows> {
    let mut rows = builder("table_constraints")?;
    for r in snapshot.users() {
        let mut constraints: Vec<(String, &str)> = Vec::new();
        if !r.primary_key.is_empty() {
            constraints.push((r.index_name(), "PRIMARY KEY"));
        }
        constraints.extend(
            not_null_checks(r)
                .into_iter()
                .map(|(name, _)| (name, "CHECK")),
        );
        for (name, kind) in constraints {
            rows.push([
                ("constraint_catalog", db.into()),
                ("constraint_schema", (&r.schema).into()),
                ("constraint_name", name.into()),
                ("table_catalog", db.into()),
                ("table_schema", (&r.schema).into()),
                ("table_name", (&r.name).into()),
                ("constraint_type", kind.into()),
                ("is_deferrable", yes(false)),
                ("initially_deferred", yes(false)),
                ("enforced", yes(true)),
            ]);
        }
    }
    Ok(rows)
}

fn check_constraints(snapshot: &Snapshot, db: &str) -> DfResult<Rows> {
    let mut rows = builder("check_constraints")?;
    for r in snapshot.users() {
        for (name, clause) in not_null_checks(r) {
            rows.push([
                ("constraint_catalog", db.into()),
                ("constraint_schema", (&r.schema).into()),
                ("constraint_name", name.into()),
                ("check_clause", clause.into()),
            ]);
        }
    }
    Ok(rows)
}

fn key_column_usage(snapshot: &Snapshot, db: &str) -> DfResult<Rows> {
    let mut rows = builder("key_column_usage")?;
    for r in snapshot.users() {
        for (position, &i) in r.primary_key.iter().enumerate() {
            let Some(field) = r.columns.fields().get(i) else {
                continue;
            };
            rows.push([
                ("constraint_catalog", db.into()),
                ("constraint_schema", (&r.schema).into()),
                ("constraint_name", r.index_name().into()),
                ("table_catalog", db.into()),
                ("table_schema", (&r.schema).into()),
                ("table_name", (&r.name).into()),
                ("column_name", field.name().into()),
                ("ordinal_position", (position + 1).into()),
            ]);
        }
    }
    Ok(rows)
}

/// `routines`: the functions a session can call, in `pg_catalog` as PostgreSQL's are.
fn routines(functions: &[Function], db: &str) -> DfResult<Rows> {
    let mut rows = builder("routines")?;
    for f in functions.iter().filter(|f| f.kind == "f") {
        rows.push([
            ("specific_catalog", db.into()),
            ("specific_schema", "pg_catalog".into()),
            ("specific_name", format!("{}_{}", f.name, f.oid).into()),
            ("routine_catalog", db.into()),
            ("routine_schema", "pg_catalog".into()),
            ("routine_name", (&f.name).into()),
            ("routine_type", "FUNCTION".into()),
            ("routine_body", "EXTERNAL".into()),
            ("external_language", "INTERNAL".into()),
            ("parameter_style", "GENERAL".into()),
            ("is_deterministic", yes(false)),
            ("sql_data_access", "MODIFIES".into()),
            ("is_null_call", yes(true)),
            ("schema_level_routine", yes(true)),
            ("is_user_defined_cast", yes(false)),
            ("is_implicitly_invocable", yes(false)),
            ("security_type", "INVOKER".into()),
            ("as_locator", yes(false)),
            ("is_udt_dependent", yes(false)),
        ]);
    }
    Ok(rows)
}

fn character_sets(db: &str) -> DfResult<Rows> {
    let mut rows = builder("character_sets")?;
    rows.push([
        ("character_set_name", "UTF8".into()),
        ("character_repertoire", "UCS".into()),
        ("form_of_use", "UTF8".into()),
        ("default_collate_catalog", db.into()),
    ]);
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn declared_types_split_into_name_and_modifiers() {
        let v = column_info("character varying(5)");
        assert_eq!(
            (
                v.data_type.as_str(),
                v.udt_name.as_str(),
                v.character_maximum_length,
                v.character_octet_length
            ),
            ("character varying", "varchar", Some(5), Some(20))
        );
        let n = column_info("numeric(10,2)");
        assert_eq!(
            (
                n.data_type.as_str(),
                n.udt_name.as_str(),
                n.numeric_precision,
                n.numeric_scale,
                n.numeric_precision_radix
            ),
            ("numeric", "numeric", Some(10), Some(2), Some(10))
        );
        let t = column_info("timestamp with time zone");
        assert_eq!(
            (
                t.data_type.as_str(),
                t.udt_name.as_str(),
                t.datetime_precision
            ),
            ("timestamp with time zone", "timestamptz", Some(6))
        );
        let i = column_info("integer");
        assert_eq!(
            (i.udt_name.as_str(), i.numeric_precision, i.numeric_scale),
            ("int4", Some(32), Some(0))
        );
    }
}
