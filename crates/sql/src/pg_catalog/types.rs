//! `pg_type`: the built-in types Eddy serves (rows taken from PostgreSQL 15, `types.txt`),
//! each relation's row type, and the type functions over them (`format_type`, a column's
//! type OID and typmod, `::regtype` names).

use std::sync::LazyLock;

use arrow::datatypes::{DataType, Field};
use datafusion::error::Result as DfResult;

use super::objects::{PG_CATALOG_OID, Relation, SUPERUSER_OID};
use super::spec::{Rows, Value, spec};
use crate::types::pg_type_name;

/// One built-in type's `pg_type` row.
#[derive(Debug)]
pub(crate) struct BuiltinType {
    pub oid: u32,
    pub name: &'static str,
    fields: Vec<&'static str>,
}

impl BuiltinType {
    fn field(&self, i: usize) -> &'static str {
        self.fields.get(i).copied().unwrap_or("")
    }
    pub fn elem(&self) -> u32 {
        self.field(8).parse().unwrap_or(0)
    }
    pub fn array(&self) -> u32 {
        self.field(9).parse().unwrap_or(0)
    }
    pub fn category(&self) -> &'static str {
        self.field(5)
    }
}

static TYPES: LazyLock<Vec<BuiltinType>> = LazyLock::new(|| {
    include_str!("types.txt")
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let fields: Vec<&'static str> = l.split('|').collect();
            Some(BuiltinType {
                oid: fields.first()?.parse().ok()?,
                name: fields.get(1)?,
                fields,
            })
        })
        .collect()
});

pub(crate) fn builtin_types() -> &'static [BuiltinType] {
    &TYPES
}

pub(crate) fn type_by_oid(oid: u32) -> Option<&'static BuiltinType> {
    TYPES.iter().find(|t| t.oid == oid)
}

/// The OID of a type written in SQL (`int4`, `integer`, `character varying`, `text[]`,
/// `pg_catalog.int8`), if Eddy knows it.
pub(crate) fn type_oid_named(name: &str) -> Option<u32> {
    let name = name.trim().trim_start_matches("pg_catalog.").to_lowercase();
    if let Some(element) = name.strip_suffix("[]") {
        return type_by_oid(type_oid_named(element)?)
            .map(|t| t.array())
            .filter(|a| *a != 0);
    }
    let base = name.split('(').next().unwrap_or_default().trim();
    let canonical = match base {
        "boolean" => "bool",
        "smallint" => "int2",
        "integer" | "int" => "int4",
        "bigint" => "int8",
        "real" => "float4",
        "double precision" | "float" => "float8",
        "character varying" => "varchar",
        "character" | "char" if name != "\"char\"" => "bpchar",
        "\"char\"" => "char",
        "decimal" => "numeric",
        "timestamp" | "timestamp without time zone" => "timestamp",
        "timestamp with time zone" => "timestamptz",
        "time" | "time without time zone" => "time",
        "time with time zone" => "timetz",
        other => other,
    };
    TYPES.iter().find(|t| t.name == canonical).map(|t| t.oid)
}

/// PostgreSQL's `format_type(oid, typmod)`; `typmod` `None` is SQL NULL.
pub(crate) fn format_type(oid: u32, typmod: Option<i32>) -> String {
    let Some(t) = type_by_oid(oid) else {
        return if oid == 0 { "-".into() } else { "???".into() };
    };
    if t.category() == "A" && t.elem() != 0 && t.name.starts_with('_') {
        return format!("{}[]", format_type(t.elem(), typmod));
    }
    let modifier = typmod.filter(|m| *m >= 0);
    let with = |name: &str, m: String| format!("{name}{m}");
    match t.name {
        "bool" => "boolean".into(),
        "int2" => "smallint".into(),
        "int4" => "integer".into(),
        "int8" => "bigint".into(),
        "float4" => "real".into(),
        "float8" => "double precision".into(),
        "char" => "\"char\"".into(),
        "varchar" => modifier.map_or("character varying".into(), |m| {
            with("character varying", format!("({})", m - 4))
        }),
        "bpchar" => match (modifier, typmod) {
            (Some(m), _) => with("character", format!("({})", m - 4)),
            (None, Some(_)) => "bpchar".into(),
            (None, None) => "character".into(),
        },
        "numeric" => modifier.map_or("numeric".into(), |m| {
            let m = m - 4;
            with(
                "numeric",
                format!("({},{})", (m >> 16) & 0xffff, m & 0xffff),
            )
        }),
        "timestamp" => "timestamp without time zone".into(),
        "timestamptz" => "timestamp with time zone".into(),
        "time" => "time without time zone".into(),
        "timetz" => "time with time zone".into(),
        other => other.to_owned(),
    }
}

/// A column's type OID and typmod, as `pg_attribute` records them.
pub(crate) fn column_type(field: &Field) -> (u32, i32) {
    if let DataType::List(item) | DataType::LargeList(item) | DataType::FixedSizeList(item, _) =
        field.data_type()
    {
        let (element, typmod) = column_type(item);
        return (type_by_oid(element).map_or(0, |t| t.array()), typmod);
    }
    let declared = pg_type_name(field);
    let modifiers: Vec<i32> = declared
        .split_once('(')
        .map(|(_, m)| {
            m.trim_end_matches(')')
                .split(',')
                .filter_map(|n| n.trim().parse().ok())
                .collect()
        })
        .unwrap_or_default();
    let oid = type_oid_named(&declared).unwrap_or(25);
    // A numeric nobody declared (a view's `sum(amount)`) has no typmod, as in PostgreSQL: the
    // precision and scale of an Arrow decimal are Eddy's storage, not the column's type.
    let declared_here = field.metadata().contains_key(crate::types::PG_TYPE_KEY);
    let typmod = match (type_by_oid(oid).map(|t| t.name), modifiers.as_slice()) {
        (Some("numeric"), _) if !declared_here => -1,
        (Some("varchar" | "bpchar"), [n]) => n + 4,
        (Some("numeric"), [p]) => (p << 16) + 4,
        (Some("numeric"), [p, s]) => ((p << 16) | s) + 4,
        _ => -1,
    };
    (oid, typmod)
}

/// Bytes a value of the type takes (`attlen`, `typlen`): -1 for variable length.
pub(crate) fn type_len(oid: u32) -> i16 {
    type_by_oid(oid)
        .and_then(|t| t.field(2).parse().ok())
        .unwrap_or(-1)
}

pub(crate) fn type_align(oid: u32) -> &'static str {
    type_by_oid(oid).map_or("i", |t| t.field(16))
}

pub(crate) fn type_storage(oid: u32) -> &'static str {
    type_by_oid(oid).map_or("x", |t| t.field(17))
}

pub(crate) fn type_byval(oid: u32) -> bool {
    type_by_oid(oid).is_some_and(|t| t.field(3) == "t")
}

pub(crate) fn type_collation(oid: u32) -> u32 {
    type_by_oid(oid)
        .and_then(|t| t.field(18).parse().ok())
        .unwrap_or(0)
}

/// `pg_type`: the built-in types, then each relation's row type.
pub(crate) fn pg_type(relations: &[Relation]) -> DfResult<Rows> {
    let Some(spec) = spec("pg_catalog", "pg_type") else {
        return Err(missing("pg_type"));
    };
    let mut rows = spec.builder();
    for t in builtin_types() {
        let f = |i: usize| t.field(i);
        let proc = |i: usize| Value::from(if f(i) == "-" { "-" } else { f(i) });
        rows.push([
            ("oid", t.oid.into()),
            ("typname", t.name.into()),
            ("typnamespace", PG_CATALOG_OID.into()),
            ("typowner", SUPERUSER_OID.into()),
            ("typlen", f(2).parse::<i16>().unwrap_or(-1).into()),
            ("typbyval", (f(3) == "t").into()),
            ("typtype", f(4).into()),
            ("typcategory", f(5).into()),
            ("typispreferred", (f(6) == "t").into()),
            ("typisdefined", true.into()),
            ("typdelim", f(7).into()),
            ("typsubscript", proc(19)),
            ("typelem", t.elem().into()),
            ("typarray", t.array().into()),
            ("typinput", proc(10)),
            ("typoutput", proc(11)),
            ("typreceive", proc(12)),
            ("typsend", proc(13)),
            ("typmodin", proc(14)),
            ("typmodout", proc(15)),
            (
                "typanalyze",
                Value::from(if t.category() == "A" {
                    "array_typanalyze"
                } else {
                    "-"
                }),
            ),
            ("typalign", f(16).into()),
            ("typstorage", f(17).into()),
            ("typtypmod", (-1i32).into()),
            ("typcollation", f(18).parse::<u32>().unwrap_or(0).into()),
        ]);
    }
    for r in relations {
        rows.push([
            ("oid", r.rowtype_oid().into()),
            ("typname", (&r.name).into()),
            ("typnamespace", r.namespace_oid.into()),
            ("typowner", SUPERUSER_OID.into()),
            ("typlen", (-1i16).into()),
            ("typtype", "c".into()),
            ("typcategory", "C".into()),
            ("typisdefined", true.into()),
            ("typdelim", ",".into()),
            ("typrelid", r.oid.into()),
            ("typinput", "record_in".into()),
            ("typoutput", "record_out".into()),
            ("typreceive", "record_recv".into()),
            ("typsend", "record_send".into()),
            ("typalign", "d".into()),
            ("typstorage", "x".into()),
            ("typtypmod", (-1i32).into()),
        ]);
    }
    Ok(rows)
}

pub(crate) fn missing(name: &str) -> datafusion::error::DataFusionError {
    datafusion::error::DataFusionError::Internal(format!("catalog {name} has no definition"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::column_type_named;

    #[test]
    fn format_type_is_postgres() {
        let cases = [
            ((1042, None), "character"),
            ((1042, Some(-1)), "bpchar"),
            ((1043, Some(-1)), "character varying"),
            ((1015, Some(9)), "character varying(5)[]"),
            ((1700, Some(655366)), "numeric(10,2)"),
            ((1184, None), "timestamp with time zone"),
            ((18, Some(-1)), "\"char\""),
            ((1009, Some(-1)), "text[]"),
            ((0, Some(-1)), "-"),
            ((999_999, Some(-1)), "???"),
            ((16, Some(5)), "boolean"),
        ];
        for ((oid, typmod), expected) in cases {
            assert_eq!(
                format_type(oid, typmod),
                expected,
                "format_type({oid}, {typmod:?})"
            );
        }
    }

    #[test]
    fn columns_have_type_oids_and_typmods() {
        let field = |t: &str| column_type_named(t).unwrap().field("c", true);
        assert_eq!(column_type(&field("varchar(5)")), (1043, 9));
        assert_eq!(column_type(&field("numeric(10,2)")), (1700, 655366));
        assert_eq!(column_type(&field("numeric")), (1700, -1));
        assert_eq!(column_type(&field("timestamptz")), (1184, -1));
        assert_eq!(column_type(&field("bigint")), (20, -1));
        assert_eq!(column_type(&field("char(3)")), (1042, 7));
        assert_eq!(type_oid_named("pg_catalog.int2[]"), Some(1005));
    }
}
