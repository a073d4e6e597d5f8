//! The relation catalogs: `pg_namespace`, `pg_class`, `pg_attribute`, `pg_index`,
//! `pg_constraint`, `pg_attrdef`, `pg_depend`, `pg_rewrite` and the views over them
//! (`pg_tables`, `pg_views`, `pg_matviews`, `pg_indexes`), from the engine's relations plus the
//! catalogs themselves (their OIDs are PostgreSQL's).
//!
//! A table with a primary key has the index `<table>_pkey` (`relkind` `i`, btree) and the
//! constraint of the same name, as PostgreSQL creates them. NOT NULL is `attnotnull`, as in
//! PostgreSQL 15 (which has no NOT NULL rows in `pg_constraint`).

use std::sync::Arc;

use arrow::datatypes::{Field, Schema};
use datafusion::error::Result as DfResult;

use super::objects::{
    BTREE_AM_OID, FIRST_USER_OID, HEAP_AM_OID, INFORMATION_SCHEMA_OID, Namespace, PG_CATALOG_OID,
    PG_TOAST_OID, PUBLIC_OID, Relation, RelationKind, SUPERUSER_OID,
};
use super::spec::{Rows, Value, spec, specs};
use super::types::{
    column_type, missing, type_align, type_byval, type_collation, type_len, type_oid_named,
    type_storage,
};
use crate::pg::strings::quote_ident;

/// The OIDs of the classes objects belong to (`classid`, `refclassid`).
pub(crate) const PG_CLASS_OID: u32 = 1259;
pub(crate) const PG_TYPE_OID: u32 = 1247;
pub(crate) const PG_CONSTRAINT_OID: u32 = 2606;
pub(crate) const PG_REWRITE_OID: u32 = 2618;

/// The system schemas: `pg_catalog`, `information_schema`, `pg_toast`.
pub(crate) fn system_namespaces() -> Vec<Namespace> {
    [
        (PG_CATALOG_OID, "pg_catalog"),
        (INFORMATION_SCHEMA_OID, "information_schema"),
        (PG_TOAST_OID, "pg_toast"),
    ]
    .into_iter()
    .map(|(oid, name)| Namespace {
        oid,
        name: name.to_owned(),
    })
    .collect()
}

/// The catalogs themselves as relations (`pg_class` lists them, as PostgreSQL does).
pub(crate) fn system_relations() -> Vec<Relation> {
    specs()
        .iter()
        .map(|s| {
            let fields: Vec<Field> = s
                .columns
                .iter()
                .map(|(n, t)| super::spec::field(n, t))
                .collect();
            Relation {
                oid: s.oid,
                schema: s.schema.to_owned(),
                namespace_oid: if s.schema == "pg_catalog" {
                    PG_CATALOG_OID
                } else {
                    INFORMATION_SCHEMA_OID
                },
                name: s.name.to_owned(),
                kind: if s.relkind == "v" {
                    RelationKind::View
                } else {
                    RelationKind::Table
                },
                columns: Arc::new(Schema::new(fields)),
                primary_key: Vec::new(),
                definition: None,
                inputs: Vec::new(),
            }
        })
        .collect()
}

fn is_system(r: &Relation) -> bool {
    r.oid < FIRST_USER_OID
}

/// A catalog column's type: `information_schema`'s domains are their base types here.
pub(crate) fn attribute_type(r: &Relation, field: &Field, index: usize) -> (u32, i32) {
    if !is_system(r) {
        return column_type(field);
    }
    let declared = spec(&r.schema, &r.name)
        .and_then(|s| s.columns.get(index))
        .map_or("text", |c| c.1);
    let base = match declared {
        "information_schema.sql_identifier" => "name",
        "information_schema.cardinal_number" => "integer",
        "information_schema.character_data" | "information_schema.yes_or_no" => "character varying",
        "information_schema.time_stamp" => "timestamp with time zone",
        other => other,
    };
    (type_oid_named(base).unwrap_or(25), -1)
}

pub(crate) fn pg_namespace(namespaces: &[Namespace]) -> DfResult<Rows> {
    let mut rows = spec("pg_catalog", "pg_namespace")
        .ok_or_else(|| missing("pg_namespace"))?
        .builder();
    let mut all = system_namespaces();
    all.extend(namespaces.iter().cloned());
    all.sort_by_key(|n| n.oid);
    for n in all {
        // PostgreSQL 15's public schema belongs to pg_database_owner (6171).
        let (owner, acl): (u32, Value) = if n.oid == PUBLIC_OID {
            (
                6171,
                vec![
                    "pg_database_owner=UC/pg_database_owner",
                    "=U/pg_database_owner",
                ]
                .into(),
            )
        } else if n.oid == PG_CATALOG_OID
            || n.oid == INFORMATION_SCHEMA_OID
            || n.name == crate::EDDY_CATALOG_SCHEMA
        {
            // Readable by everyone, as initdb grants it.
            (SUPERUSER_OID, vec!["eddy=UC/eddy", "=U/eddy"].into())
        } else {
            (SUPERUSER_OID, Value::Null)
        };
        rows.push([
            ("oid", n.oid.into()),
            ("nspname", n.name.into()),
            ("nspowner", owner.into()),
            ("nspacl", acl),
        ]);
    }
    Ok(rows)
}

pub(crate) fn pg_class(relations: &[Relation]) -> DfResult<Rows> {
    let mut rows = spec("pg_catalog", "pg_class")
        .ok_or_else(|| missing("pg_class"))?
        .builder();
    for r in relations {
        let stored = matches!(r.kind, RelationKind::Table | RelationKind::MaterializedView);
        let system = is_system(r);
        rows.push([
            ("oid", r.oid.into()),
            ("relname", (&r.name).into()),
            ("relnamespace", r.namespace_oid.into()),
            (
                "reltype",
                Value::from(if system { 0 } else { r.rowtype_oid() }),
            ),
            ("relowner", SUPERUSER_OID.into()),
            ("relam", Value::from(if stored { HEAP_AM_OID } else { 0 })),
            (
                "relfilenode",
                Value::from(if stored && !system { r.oid } else { 0 }),
            ),
            ("reltuples", Value::from(-1.0)),
            ("relhasindex", (!r.primary_key.is_empty()).into()),
            ("relpersistence", "p".into()),
            ("relkind", r.kind.relkind().into()),
            ("relnatts", r.columns.fields().len().into()),
            ("relhasrules", (r.kind == RelationKind::View).into()),
            ("relispopulated", true.into()),
            ("relreplident", Value::from(if stored { "d" } else { "n" })),
            ("relfrozenxid", Value::from(if stored { 1u32 } else { 0 })),
            ("relminmxid", Value::from(if stored { 1u32 } else { 0 })),
        ]);
        if !r.primary_key.is_empty() {
            rows.push([
                ("oid", r.index_oid().into()),
                ("relname", r.index_name().into()),
                ("relnamespace", r.namespace_oid.into()),
                ("relowner", SUPERUSER_OID.into()),
                ("relam", BTREE_AM_OID.into()),
                ("relfilenode", r.index_oid().into()),
                ("reltuples", Value::from(-1.0)),
                ("relpersistence", "p".into()),
                ("relkind", "i".into()),
                ("relnatts", r.primary_key.len().into()),
                ("relispopulated", true.into()),
                ("relreplident", "n".into()),
            ]);
        }
    }
    Ok(rows)
}

pub(crate) fn pg_attribute(relations: &[Relation]) -> DfResult<Rows> {
    let mut rows = spec("pg_catalog", "pg_attribute")
        .ok_or_else(|| missing("pg_attribute"))?
        .builder();
    for r in relations {
        for (i, field) in r.columns.fields().iter().enumerate() {
            let (type_oid, typmod) = attribute_type(r, field, i);
            let not_null = !field.is_nullable() && !is_system(r) || r.primary_key.contains(&i);
            rows.push([
                ("attrelid", r.oid.into()),
                ("attname", field.name().into()),
                ("atttypid", type_oid.into()),
                ("attstattarget", (-1i32).into()),
                ("attlen", type_len(type_oid).into()),
                ("attnum", (i + 1).into()),
                (
                    "attndims",
                    Value::from(i32::from(field.data_type().is_nested())),
                ),
                ("attcacheoff", (-1i32).into()),
                ("atttypmod", typmod.into()),
                ("attbyval", type_byval(type_oid).into()),
                ("attalign", type_align(type_oid).into()),
                ("attstorage", type_storage(type_oid).into()),
                ("attcompression", "".into()),
                ("attnotnull", not_null.into()),
                ("atthasdef", r.column_default(i).is_some().into()),
                ("attidentity", "".into()),
                ("attgenerated", "".into()),
                ("attislocal", true.into()),
                ("attcollation", type_collation(type_oid).into()),
            ]);
        }
        if !r.primary_key.is_empty() {
            for (n, &i) in r.primary_key.iter().enumerate() {
                let Some(field) = r.columns.fields().get(i) else {
                    continue;
                };
                let (type_oid, typmod) = column_type(field);
                rows.push([
                    ("attrelid", r.index_oid().into()),
                    ("attname", field.name().into()),
                    ("atttypid", type_oid.into()),
                    ("attstattarget", (-1i32).into()),
                    ("attlen", type_len(type_oid).into()),
                    ("attnum", (n + 1).into()),
                    ("attcacheoff", (-1i32).into()),
                    ("atttypmod", typmod.into()),
                    ("attbyval", type_byval(type_oid).into()),
                    ("attalign", type_align(type_oid).into()),
                    ("attstorage", type_storage(type_oid).into()),
                    ("attcompression", "".into()),
                    ("attidentity", "".into()),
                    ("attgenerated", "".into()),
                    ("attislocal", true.into()),
                    ("attcollation", type_collation(type_oid).into()),
                ]);
            }
        }
    }
    Ok(rows)
}

fn key_numbers(r: &Relation) -> Vec<i16> {
    r.primary_key.iter().map(|&i| i as i16 + 1).collect()
}

pub(crate) fn pg_index(relations: &[Relation]) -> DfResult<Rows> {
    let mut rows = spec("pg_catalog", "pg_index")
        .ok_or_else(|| missing("pg_index"))?
        .builder();
    for r in relations.iter().filter(|r| !r.primary_key.is_empty()) {
        let n = r.primary_key.len();
        rows.push([
            ("indexrelid", r.index_oid().into()),
            ("indrelid", r.oid.into()),
            ("indnatts", n.into()),
            ("indnkeyatts", n.into()),
            ("indisunique", true.into()),
            ("indisprimary", true.into()),
            ("indimmediate", true.into()),
            ("indisvalid", true.into()),
            ("indisready", true.into()),
            ("indislive", true.into()),
            ("indkey", key_numbers(r).into()),
            (
                "indcollation",
                r.primary_key
                    .iter()
                    .map(|&i| {
                        r.columns
                            .fields()
                            .get(i)
                            .map_or(0, |f| type_collation(column_type(f).0))
                    })
                    .collect::<Vec<u32>>()
                    .into(),
            ),
            ("indclass", vec![0u32; n].into()),
            ("indoption", vec![0i16; n].into()),
        ]);
    }
    Ok(rows)
}

pub(crate) fn pg_constraint(relations: &[Relation]) -> DfResult<Rows> {
    let mut rows = spec("pg_catalog", "pg_constraint")
        .ok_or_else(|| missing("pg_constraint"))?
        .builder();
    for r in relations.iter().filter(|r| !r.primary_key.is_empty()) {
        rows.push([
            ("oid", r.constraint_oid().into()),
            ("conname", r.index_name().into()),
            ("connamespace", r.namespace_oid.into()),
            ("contype", "p".into()),
            ("convalidated", true.into()),
            ("conrelid", r.oid.into()),
            ("conindid", r.index_oid().into()),
            ("confupdtype", " ".into()),
            ("confdeltype", " ".into()),
            ("confmatchtype", " ".into()),
            ("conislocal", true.into()),
            ("connoinherit", true.into()),
            ("conkey", key_numbers(r).into()),
        ]);
    }
    Ok(rows)
}

/// `pg_depend`: each view's rule on the relations it reads (as PostgreSQL records a view's
/// dependencies), each primary key's index on its constraint and the constraint on its
/// table, each row type on its relation.
pub(crate) fn pg_depend(relations: &[Relation]) -> DfResult<Rows> {
    let mut rows = spec("pg_catalog", "pg_depend")
        .ok_or_else(|| missing("pg_depend"))?
        .builder();
    let dep = |rows: &mut Rows,
               classid: u32,
               objid: u32,
               refclassid: u32,
               refobjid: u32,
               deptype: &str| {
        rows.push([
            ("classid", classid.into()),
            ("objid", objid.into()),
            ("objsubid", 0i32.into()),
            ("refclassid", refclassid.into()),
            ("refobjid", refobjid.into()),
            ("refobjsubid", 0i32.into()),
            ("deptype", deptype.into()),
        ]);
    };
    for r in relations.iter().filter(|r| !is_system(r)) {
        dep(
            &mut rows,
            PG_TYPE_OID,
            r.rowtype_oid(),
            PG_CLASS_OID,
            r.oid,
            "i",
        );
        if matches!(r.kind, RelationKind::View | RelationKind::MaterializedView) {
            dep(
                &mut rows,
                PG_REWRITE_OID,
                r.rule_oid(),
                PG_CLASS_OID,
                r.oid,
                "i",
            );
            for &input in &r.inputs {
                dep(
                    &mut rows,
                    PG_REWRITE_OID,
                    r.rule_oid(),
                    PG_CLASS_OID,
                    input,
                    "n",
                );
            }
        }
        if !r.primary_key.is_empty() {
            dep(
                &mut rows,
                PG_CLASS_OID,
                r.index_oid(),
                PG_CONSTRAINT_OID,
                r.constraint_oid(),
                "i",
            );
            dep(
                &mut rows,
                PG_CONSTRAINT_OID,
                r.constraint_oid(),
                PG_CLASS_OID,
                r.oid,
                "a",
            );
        }
    }
    Ok(rows)
}

/// `pg_rewrite`: the `_RETURN` rule of each view and materialized view.
pub(crate) fn pg_rewrite(relations: &[Relation]) -> DfResult<Rows> {
    let mut rows = spec("pg_catalog", "pg_rewrite")
        .ok_or_else(|| missing("pg_rewrite"))?
        .builder();
    for r in relations.iter().filter(|r| {
        !is_system(r) && matches!(r.kind, RelationKind::View | RelationKind::MaterializedView)
    }) {
        rows.push([
            ("oid", r.rule_oid().into()),
            ("rulename", "_RETURN".into()),
            ("ev_class", r.oid.into()),
            ("ev_type", "1".into()),
            ("ev_enabled", "O".into()),
            ("is_instead", true.into()),
        ]);
    }
    Ok(rows)
}

/// `pg_get_viewdef`'s text: the query, led by a space and ended by `;` as PostgreSQL prints it.
pub(crate) fn view_definition(r: &Relation) -> Option<String> {
    r.definition
        .as_ref()
        .map(|d| format!(" {};", d.trim().trim_end_matches(';')))
}

/// `pg_get_indexdef` of a primary key's index.
pub(crate) fn index_definition(r: &Relation) -> String {
    format!(
        "CREATE UNIQUE INDEX {} ON {}.{} USING btree ({})",
        quote_ident(&r.index_name()),
        quote_ident(&r.schema),
        quote_ident(&r.name),
        key_columns(r)
    )
}

/// `pg_get_constraintdef` of a primary key.
pub(crate) fn constraint_definition(r: &Relation) -> String {
    format!("PRIMARY KEY ({})", key_columns(r))
}

fn key_columns(r: &Relation) -> String {
    r.primary_key
        .iter()
        .filter_map(|&i| r.columns.fields().get(i))
        .map(|f| quote_ident(f.name()))
        .collect::<Vec<_>>()
        .join(", ")
}

fn user_relations(relations: &[Relation], kind: RelationKind) -> impl Iterator<Item = &Relation> {
    relations.iter().filter(move |r| {
        r.kind == kind && (r.schema != "information_schema" || kind != RelationKind::View)
    })
}

pub(crate) fn pg_tables(relations: &[Relation]) -> DfResult<Rows> {
    let mut rows = spec("pg_catalog", "pg_tables")
        .ok_or_else(|| missing("pg_tables"))?
        .builder();
    for r in user_relations(relations, RelationKind::Table) {
        rows.push([
            ("schemaname", (&r.schema).into()),
            ("tablename", (&r.name).into()),
            ("tableowner", "eddy".into()),
            ("hasindexes", (!r.primary_key.is_empty()).into()),
            ("hasrules", false.into()),
            ("hastriggers", false.into()),
            ("rowsecurity", false.into()),
        ]);
    }
    Ok(rows)
}

pub(crate) fn pg_views(relations: &[Relation]) -> DfResult<Rows> {
    let mut rows = spec("pg_catalog", "pg_views")
        .ok_or_else(|| missing("pg_views"))?
        .builder();
    for r in relations.iter().filter(|r| r.kind == RelationKind::View) {
        rows.push([
            ("schemaname", (&r.schema).into()),
            ("viewname", (&r.name).into()),
            ("viewowner", "eddy".into()),
            ("definition", view_definition(r).into()),
        ]);
    }
    Ok(rows)
}

pub(crate) fn pg_matviews(relations: &[Relation]) -> DfResult<Rows> {
    let mut rows = spec("pg_catalog", "pg_matviews")
        .ok_or_else(|| missing("pg_matviews"))?
        .builder();
    for r in user_relations(relations, RelationKind::MaterializedView) {
        rows.push([
            ("schemaname", (&r.schema).into()),
            ("matviewname", (&r.name).into()),
            ("matviewowner", "eddy".into()),
            ("hasindexes", false.into()),
            ("ispopulated", true.into()),
            ("definition", view_definition(r).into()),
        ]);
    }
    Ok(rows)
}

pub(crate) fn pg_indexes(relations: &[Relation]) -> DfResult<Rows> {
    let mut rows = spec("pg_catalog", "pg_indexes")
        .ok_or_else(|| missing("pg_indexes"))?
        .builder();
    for r in relations.iter().filter(|r| !r.primary_key.is_empty()) {
        rows.push([
            ("schemaname", (&r.schema).into()),
            ("tablename", (&r.name).into()),
            ("indexname", r.index_name().into()),
            ("indexdef", index_definition(r).into()),
        ]);
    }
    Ok(rows)
}

/// `pg_description`: Eddy has no `COMMENT`; only the public schema's, as PostgreSQL has it.
/// `pg_namespace`'s own OID (the `classoid` of a schema's comment).
pub(crate) const PG_NAMESPACE_CLASS: u32 = 2615;

/// The schemas' comments, as initdb writes them (`pg_description`, `obj_description`); Eddy
/// has no `COMMENT ON`, so these are all there are.
pub(crate) const SCHEMA_COMMENTS: [(u32, &str); 3] = [
    (PG_CATALOG_OID, "system catalog schema"),
    (PG_TOAST_OID, "reserved schema for TOAST tables"),
    (PUBLIC_OID, "standard public schema"),
];

/// `pg_attrdef`: the tables' column defaults; `adbin` holds the expression's text, which
/// `pg_get_expr` returns.
pub(crate) fn pg_attrdef(relations: &[Relation]) -> DfResult<Rows> {
    let mut rows = spec("pg_catalog", "pg_attrdef")
        .ok_or_else(|| missing("pg_attrdef"))?
        .builder();
    for r in relations {
        for i in 0..r.columns.fields().len() {
            if let Some(default) = r.column_default(i) {
                rows.push([
                    ("oid", r.default_oid(i).into()),
                    ("adrelid", r.oid.into()),
                    ("adnum", (i + 1).into()),
                    ("adbin", default.into()),
                ]);
            }
        }
    }
    Ok(rows)
}

pub(crate) fn pg_description() -> DfResult<Rows> {
    let mut rows = spec("pg_catalog", "pg_description")
        .ok_or_else(|| missing("pg_description"))?
        .builder();
    for (oid, description) in SCHEMA_COMMENTS {
        rows.push([
            ("objoid", oid.into()),
            ("classoid", PG_NAMESPACE_CLASS.into()),
            ("objsubid", 0i32.into()),
            ("description", description.into()),
        ]);
    }
    Ok(rows)
}

/// `pg_stat_user_tables`: every table and materialized view, with no statistics gathered.
pub(crate) fn pg_stat_user_tables(relations: &[Relation]) -> DfResult<Rows> {
    let mut rows = spec("pg_catalog", "pg_stat_user_tables")
        .ok_or_else(|| missing("pg_stat_user_tables"))?
        .builder();
    for r in relations
        .iter()
        .filter(|r| matches!(r.kind, RelationKind::Table | RelationKind::MaterializedView))
    {
        let zero = || Value::Int(0);
        rows.push([
            ("relid", r.oid.into()),
            ("schemaname", (&r.schema).into()),
            ("relname", (&r.name).into()),
            ("seq_scan", zero()),
            ("seq_tup_read", zero()),
            (
                "idx_scan",
                if r.primary_key.is_empty() {
                    Value::Null
                } else {
                    zero()
                },
            ),
            (
                "idx_tup_fetch",
                if r.primary_key.is_empty() {
                    Value::Null
                } else {
                    zero()
                },
            ),
            ("n_tup_ins", zero()),
            ("n_tup_upd", zero()),
            ("n_tup_del", zero()),
            ("n_tup_hot_upd", zero()),
            ("n_live_tup", zero()),
            ("n_dead_tup", zero()),
            ("n_mod_since_analyze", zero()),
            ("n_ins_since_vacuum", zero()),
            ("vacuum_count", zero()),
            ("autovacuum_count", zero()),
            ("analyze_count", zero()),
            ("autoanalyze_count", zero()),
        ]);
    }
    Ok(rows)
}
