//! The catalog functions clients call: `format_type`, `pg_get_*def`, `pg_table_is_visible`,
//! privileges, settings (`current_setting`, `set_config`), sizes, and the functions behind
//! `::regclass`, `::regtype`, `::regnamespace`, `::regproc` and `::oid` (see [`super::rewrite`]).
//!
//! Every function reads the catalog as it is when it runs. Names resolve as PostgreSQL resolves
//! them: `pg_catalog` first, then the schemas of `search_path`.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use arrow::array::{
    Array, ArrayRef, BooleanArray, Int64Array, ListBuilder, StringArray, StringBuilder,
    TimestampMicrosecondArray, UInt32Array,
};
use arrow::datatypes::{DataType, Field, TimeUnit};
use datafusion::common::DataFusionError;
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, Signature, Volatility,
};
use datafusion::prelude::SessionContext;
use eddy_common::SqlState;

use super::Snapshot;
use super::objects::{FIRST_USER_OID, PG_CATALOG_OID, RelationKind};
use super::relations::{constraint_definition, index_definition, view_definition};
use super::system::{Function, role_name};
use super::types::{format_type, type_oid_named};
use crate::catalog::CatalogSource;
use crate::pg::udf::{PgFunction, arrays, error, pg_field};

type Result<T> = datafusion::common::Result<T>;

#[path = "functions_session.rs"]
mod session;
use session::*;

/// What the catalog functions of one session read.
#[derive(Debug)]
pub(crate) struct Context {
    pub source: Arc<dyn CatalogSource>,
    pub user: String,
    pub functions: Arc<Vec<Function>>,
    /// `txid_current()`: a number per call that only grows.
    transactions: AtomicI64,
}

pub(crate) const REGCLASS: &str = "eddy_regclass";
pub(crate) const REGCLASS_TEXT: &str = "eddy_regclass_text";
pub(crate) const REGTYPE: &str = "eddy_regtype";
pub(crate) const REGTYPE_TEXT: &str = "eddy_regtype_text";
pub(crate) const REGNAMESPACE: &str = "eddy_regnamespace";
pub(crate) const REGNAMESPACE_TEXT: &str = "eddy_regnamespace_text";
pub(crate) const REGPROC: &str = "eddy_regproc";
pub(crate) const REGPROC_TEXT: &str = "eddy_regproc_text";
pub(crate) const TO_OID: &str = "eddy_to_oid";

fn text_at(a: &ArrayRef, i: usize) -> Option<String> {
    if a.is_null(i) {
        return None;
    }
    let s = arrow::compute::cast(&a.slice(i, 1), &DataType::Utf8).ok()?;
    s.as_any()
        .downcast_ref::<StringArray>()
        .map(|s| s.value(0).to_owned())
}

fn int_at(a: &ArrayRef, i: usize) -> Option<i64> {
    if a.is_null(i) {
        return None;
    }
    let v = arrow::compute::cast(&a.slice(i, 1), &DataType::Int64).ok()?;
    v.as_any()
        .downcast_ref::<Int64Array>()
        .filter(|v| !v.is_null(0))
        .map(|v| v.value(0))
}

fn bool_at(a: &ArrayRef, i: usize) -> Option<bool> {
    if a.is_null(i) {
        return None;
    }
    let v = arrow::compute::cast(&a.slice(i, 1), &DataType::Boolean).ok()?;
    v.as_any()
        .downcast_ref::<BooleanArray>()
        .map(|v| v.value(0))
}

fn oid_at(a: &ArrayRef, i: usize) -> Option<u32> {
    int_at(a, i).and_then(|v| u32::try_from(v).ok())
}

/// Runs `f` on each row's arguments.
fn per_row<T>(
    args: &ScalarFunctionArgs,
    mut f: impl FnMut(&[ArrayRef], usize) -> Result<Option<T>>,
) -> Result<Vec<Option<T>>> {
    let a = arrays(args)?;
    (0..args.number_rows).map(|i| f(&a, i)).collect()
}

fn texts(values: Vec<Option<String>>) -> Result<ColumnarValue> {
    Ok(ColumnarValue::Array(Arc::new(StringArray::from(values))))
}

fn oids(values: Vec<Option<u32>>) -> Result<ColumnarValue> {
    Ok(ColumnarValue::Array(Arc::new(UInt32Array::from(values))))
}

fn bools(values: Vec<Option<bool>>) -> Result<ColumnarValue> {
    Ok(ColumnarValue::Array(Arc::new(BooleanArray::from(values))))
}

fn ints(values: Vec<Option<i64>>) -> Result<ColumnarValue> {
    Ok(ColumnarValue::Array(Arc::new(Int64Array::from(values))))
}

fn text_lists(values: Vec<Option<Vec<String>>>) -> Result<ColumnarValue> {
    let mut b = ListBuilder::new(StringBuilder::new());
    for v in values {
        match v {
            Some(items) => {
                for item in items {
                    b.values().append_value(item);
                }
                b.append(true);
            }
            None => b.append_null(),
        }
    }
    Ok(ColumnarValue::Array(Arc::new(b.finish())))
}

fn oid_field() -> Field {
    pg_field("", DataType::UInt32, "oid")
}

const STABLE: Volatility = Volatility::Stable;

/// Splits a possibly qualified, possibly quoted name (`public."My Table"`) into its parts,
/// folding unquoted parts to lower case; `None` when it is not a valid name.
pub(crate) fn split_name(name: &str) -> Option<Vec<String>> {
    let mut parts = Vec::new();
    let mut chars = name.trim().chars().peekable();
    loop {
        let mut part = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            loop {
                match chars.next()? {
                    '"' if chars.peek() == Some(&'"') => {
                        chars.next();
                        part.push('"');
                    }
                    '"' => break,
                    c => part.push(c),
                }
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c == '.' || c.is_whitespace() {
                    break;
                }
                part.extend(c.to_lowercase());
                chars.next();
            }
            if part.is_empty() {
                return None;
            }
        }
        parts.push(part);
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        match chars.next() {
            None => return Some(parts),
            Some('.') => {
                while chars.peek().is_some_and(|c| c.is_whitespace()) {
                    chars.next();
                }
            }
            Some(_) => return None,
        }
    }
}

impl Context {
    /// The schemas an unqualified name is looked up in, in order (implicit ones first).
    fn search_path(&self) -> Vec<String> {
        self.source.search_path()
    }

    fn relation_oid(&self, snapshot: &Snapshot, name: &str) -> Option<u32> {
        let parts = split_name(name)?;
        let (schema, name) = match parts.as_slice() {
            [name] => (None, name),
            [schema, name] => (Some(schema.as_str()), name),
            [_, schema, name] => (Some(schema.as_str()), name),
            _ => return None,
        };
        let found = |schema: &str| {
            snapshot
                .relations
                .iter()
                .find(|r| r.schema == schema && &r.name == name)
                .map(|r| r.oid)
        };
        let index = |schema: &str| {
            snapshot
                .users()
                .iter()
                .find(|r| {
                    r.schema == schema && !r.primary_key.is_empty() && &r.index_name() == name
                })
                .map(|r| r.index_oid())
        };
        match schema {
            Some(schema) => found(schema).or_else(|| index(schema)),
            None => self
                .search_path()
                .iter()
                .find_map(|s| found(s).or_else(|| index(s))),
        }
    }

    /// `x::regclass` for a name; an OID (a number) is taken as it is.
    fn regclass(&self, value: &str) -> Result<u32> {
        if let Ok(oid) = value.trim().parse::<u32>() {
            return Ok(oid);
        }
        let snapshot = Snapshot::take(self.source.as_ref());
        self.relation_oid(&snapshot, value).ok_or_else(|| {
            error(
                SqlState::UNDEFINED_TABLE,
                format!("relation \"{value}\" does not exist"),
            )
        })
    }

    fn regclass_text(&self, oid: u32) -> String {
        let snapshot = Snapshot::take(self.source.as_ref());
        let visible = self.search_path();
        if let Some(r) = snapshot.relation(oid) {
            return if visible.contains(&r.schema) {
                quote(&r.name)
            } else {
                format!("{}.{}", quote(&r.schema), quote(&r.name))
            };
        }
        snapshot
            .keyed_by(oid)
            .filter(|r| r.index_oid() == oid)
            .map_or_else(|| oid.to_string(), |r| quote(&r.index_name()))
    }

    fn regtype(&self, value: &str) -> Result<u32> {
        if let Ok(oid) = value.trim().parse::<u32>() {
            return Ok(oid);
        }
        if let Some(oid) = type_oid_named(value) {
            return Ok(oid);
        }
        let snapshot = Snapshot::take(self.source.as_ref());
        split_name(value)
            .and_then(|parts| parts.last().cloned())
            .and_then(|name| {
                snapshot
                    .users()
                    .iter()
                    .find(|r| r.name == name)
                    .map(|r| r.rowtype_oid())
            })
            .ok_or_else(|| {
                error(
                    SqlState::UNDEFINED_OBJECT,
                    format!("type \"{value}\" does not exist"),
                )
            })
    }

    fn regtype_text(&self, oid: u32) -> String {
        if super::types::type_by_oid(oid).is_some() {
            return format_type(oid, None);
        }
        let snapshot = Snapshot::take(self.source.as_ref());
        snapshot
            .users()
            .iter()
            .find(|r| r.rowtype_oid() == oid)
            .map_or_else(|| oid.to_string(), |r| quote(&r.name))
    }

    fn regnamespace(&self, value: &str) -> Result<u32> {
        if let Ok(oid) = value.trim().parse::<u32>() {
            return Ok(oid);
        }
        let snapshot = Snapshot::take(self.source.as_ref());
        let name = split_name(value)
            .filter(|p| p.len() == 1)
            .and_then(|mut p| p.pop());
        name.and_then(|n| {
            snapshot
                .all_namespaces()
                .into_iter()
                .find(|s| s.name == n)
                .map(|s| s.oid)
        })
        .ok_or_else(|| {
            error(
                SqlState::INVALID_SCHEMA_NAME,
                format!("schema \"{value}\" does not exist"),
            )
        })
    }

    fn regnamespace_text(&self, oid: u32) -> String {
        let snapshot = Snapshot::take(self.source.as_ref());
        snapshot
            .all_namespaces()
            .into_iter()
            .find(|s| s.oid == oid)
            .map_or_else(|| oid.to_string(), |s| quote(&s.name))
    }

    fn regproc(&self, value: &str) -> Result<u32> {
        if let Ok(oid) = value.trim().parse::<u32>() {
            return Ok(oid);
        }
        let name = split_name(value)
            .and_then(|p| p.last().cloned())
            .unwrap_or_default();
        self.functions
            .iter()
            .find(|f| f.name == name)
            .map(|f| f.oid)
            .ok_or_else(|| {
                error(
                    SqlState::UNDEFINED_FUNCTION,
                    format!("function \"{value}\" does not exist"),
                )
            })
    }

    fn regproc_text(&self, oid: u32) -> String {
        self.functions.iter().find(|f| f.oid == oid).map_or_else(
            || {
                if oid == 0 {
                    "-".into()
                } else {
                    oid.to_string()
                }
            },
            |f| f.name.clone(),
        )
    }

    fn table_is_visible(&self, oid: u32) -> Option<bool> {
        let snapshot = Snapshot::take(self.source.as_ref());
        let schema = snapshot
            .relation(oid)
            .map(|r| r.schema.clone())
            .or_else(|| snapshot.keyed_by(oid).map(|r| r.schema.clone()))?;
        Some(self.search_path().contains(&schema))
    }

    fn type_is_visible(&self, oid: u32) -> Option<bool> {
        if super::types::type_by_oid(oid).is_some() {
            return Some(true);
        }
        let snapshot = Snapshot::take(self.source.as_ref());
        let r = snapshot.users().iter().find(|r| r.rowtype_oid() == oid)?;
        Some(self.search_path().contains(&r.schema))
    }

    /// `pg_total_relation_size` and friends: bytes of a relation's log and state.
    fn relation_size(&self, oid: u32, indexes: bool) -> Option<i64> {
        let snapshot = Snapshot::take(self.source.as_ref());
        if indexes
            || snapshot.keyed_by(oid).is_some_and(|r| r.index_oid() == oid)
            || oid < FIRST_USER_OID
        {
            // Keys are arranged in the table's state, so an index takes nothing of its own.
            return snapshot
                .relation(oid)
                .or_else(|| snapshot.keyed_by(oid))
                .map(|_| 0);
        }
        self.source.relation_size(oid).map(|b| b as i64)
    }
}

fn quote(name: &str) -> String {
    crate::pg::strings::quote_ident(name)
}

/// `pg_size_pretty`, as PostgreSQL 15 rounds: bytes below 10 kB, then the largest unit
/// that keeps the number below 10 240 (half away from zero).
pub(crate) fn size_pretty(bytes: i64) -> String {
    const UNITS: [&str; 5] = ["kB", "MB", "GB", "TB", "PB"];
    let limit: i64 = 10 * 1024;
    if bytes.abs() < limit {
        return format!("{bytes} bytes");
    }
    // One extra bit is kept for rounding.
    let mut size = bytes >> 9;
    for (i, unit) in UNITS.iter().enumerate() {
        if size.abs() < limit * 2 - 1 || i == UNITS.len() - 1 {
            let rounded = (size + if size < 0 { -1 } else { 1 }) / 2;
            return format!("{rounded} {unit}");
        }
        size >>= 10;
    }
    format!("{bytes} bytes")
}

fn regclass_functions(ctx: &Arc<Context>) -> Vec<ScalarUDF> {
    type Resolve = fn(&Context, &str) -> Result<u32>;
    type Show = fn(&Context, u32) -> String;
    let kinds: [(&str, &str, &str, Resolve, Show); 4] = [
        (
            REGCLASS,
            REGCLASS_TEXT,
            "to_regclass",
            Context::regclass,
            Context::regclass_text,
        ),
        (
            REGTYPE,
            REGTYPE_TEXT,
            "to_regtype",
            Context::regtype,
            Context::regtype_text,
        ),
        (
            REGNAMESPACE,
            REGNAMESPACE_TEXT,
            "to_regnamespace",
            Context::regnamespace,
            Context::regnamespace_text,
        ),
        (
            REGPROC,
            REGPROC_TEXT,
            "to_regproc",
            Context::regproc,
            Context::regproc_text,
        ),
    ];
    let mut out = Vec::new();
    for (cast, show, to_reg, resolve, text) in kinds {
        let c = Arc::clone(ctx);
        out.push(
            PgFunction::with_return(
                cast,
                Signature::any(1, STABLE),
                |_| Ok(oid_field()),
                move |args| {
                    oids(per_row(args, |a, i| {
                        text_at(&a[0], i).map(|v| resolve(&c, &v)).transpose()
                    })?)
                },
            )
            .udf(),
        );
        let c = Arc::clone(ctx);
        out.push(
            PgFunction::new(
                show,
                Signature::any(1, STABLE),
                DataType::Utf8,
                move |args| {
                    texts(per_row(args, |a, i| {
                        Ok(oid_at(&a[0], i).map(|o| text(&c, o)))
                    })?)
                },
            )
            .udf(),
        );
        let c = Arc::clone(ctx);
        out.push(
            PgFunction::with_return(
                to_reg,
                Signature::any(1, STABLE),
                |_| Ok(oid_field()),
                move |args| {
                    // to_reg*: NULL instead of an error for a name that does not exist.
                    oids(per_row(args, |a, i| {
                        Ok(text_at(&a[0], i)
                            .filter(|v| v.parse::<u32>().is_err())
                            .and_then(|v| resolve(&c, &v).ok()))
                    })?)
                },
            )
            .udf(),
        );
    }
    out.push(
        PgFunction::with_return(
            TO_OID,
            Signature::any(1, Volatility::Immutable),
            |_| Ok(oid_field()),
            |args| oids(per_row(args, |a, i| Ok(oid_at(&a[0], i)))?),
        )
        .udf(),
    );
    out
}

fn definition_functions(ctx: &Arc<Context>) -> Vec<ScalarUDF> {
    let c = Arc::clone(ctx);
    let constraintdef = move |args: &ScalarFunctionArgs| {
        let snapshot = Snapshot::take(c.source.as_ref());
        texts(per_row(args, |a, i| {
            Ok(oid_at(&a[0], i)
                .and_then(|o| snapshot.keyed_by(o))
                .map(constraint_definition))
        })?)
    };
    let c = Arc::clone(ctx);
    let indexdef = move |args: &ScalarFunctionArgs| {
        let snapshot = Snapshot::take(c.source.as_ref());
        texts(per_row(args, |a, i| {
            let Some(r) = oid_at(&a[0], i).and_then(|o| snapshot.keyed_by(o)) else {
                return Ok(None);
            };
            // With a column number, just that key column's name.
            match a.get(1).and_then(|c| int_at(c, i)).filter(|n| *n > 0) {
                Some(n) => Ok(r
                    .primary_key
                    .get(n as usize - 1)
                    .and_then(|&k| r.columns.fields().get(k))
                    .map(|f| quote(f.name()))
                    .or(Some(String::new()))),
                None => Ok(Some(index_definition(r))),
            }
        })?)
    };
    let c = Arc::clone(ctx);
    let viewdef = move |args: &ScalarFunctionArgs| {
        let snapshot = Snapshot::take(c.source.as_ref());
        texts(per_row(args, |a, i| {
            let Some(v) = text_at(&a[0], i) else {
                return Ok(None);
            };
            let oid = match v.parse::<u32>() {
                Ok(oid) => oid,
                Err(_) => c.relation_oid(&snapshot, &v).ok_or_else(|| {
                    error(
                        SqlState::UNDEFINED_TABLE,
                        format!("relation \"{v}\" does not exist"),
                    )
                })?,
            };
            Ok(snapshot
                .relation(oid)
                .filter(|r| matches!(r.kind, RelationKind::View | RelationKind::MaterializedView))
                .and_then(view_definition))
        })?)
    };
    vec![
        PgFunction::new(
            "pg_get_constraintdef",
            Signature::variadic_any(STABLE),
            DataType::Utf8,
            constraintdef,
        )
        .udf(),
        PgFunction::new(
            "pg_get_indexdef",
            Signature::variadic_any(STABLE),
            DataType::Utf8,
            indexdef,
        )
        .udf(),
        PgFunction::new(
            "pg_get_viewdef",
            Signature::variadic_any(STABLE),
            DataType::Utf8,
            viewdef,
        )
        .udf(),
        // Eddy keeps expressions (column defaults) as their text, in PostgreSQL's form: an
        // operator at the top in parentheses, which the pretty form drops. Partition bounds
        // and policies do not exist: NULL.
        PgFunction::new(
            "pg_get_expr",
            Signature::variadic_any(STABLE),
            DataType::Utf8,
            |args| {
                texts(per_row(args, |a, i| {
                    let pretty = a.get(2).and_then(|p| bool_at(p, i)).unwrap_or(false);
                    Ok(text_at(&a[0], i).map(|e| if pretty { strip_outer_parens(&e) } else { e }))
                })?)
            },
        )
        .udf(),
    ]
}

/// `(a + b)` as `a + b`; `(a) + (b)` stays.
fn strip_outer_parens(expr: &str) -> String {
    let Some(inner) = expr.strip_prefix('(').and_then(|e| e.strip_suffix(')')) else {
        return expr.to_owned();
    };
    let mut depth = 0i32;
    for c in inner.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            _ => {}
        }
        if depth < 0 {
            return expr.to_owned();
        }
    }
    inner.to_owned()
}

/// Registers the catalog functions of one session.
pub(crate) fn register(
    ctx: &SessionContext,
    source: Arc<dyn CatalogSource>,
    user: &str,
    functions: Arc<Vec<Function>>,
) {
    let context = Arc::new(Context {
        source,
        user: user.to_owned(),
        functions,
        transactions: AtomicI64::new(i64::from(FIRST_USER_OID) + i64::from(PG_CATALOG_OID)),
    });
    let groups = [
        regclass_functions(&context),
        definition_functions(&context),
        visibility_functions(&context),
        setting_functions(&context),
        size_functions(&context),
        constant_functions(),
    ];
    for udf in groups.into_iter().flatten() {
        ctx.register_udf(udf);
    }
    ctx.register_udtf("pg_get_keywords", Arc::new(super::keywords::PgGetKeywords));
}

/// The names of the functions [`register`] adds, for `pg_proc` (the session lists its own).
pub(crate) fn is_internal(name: &str) -> bool {
    name.starts_with("eddy_")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_print_as_postgres() {
        let cases = [
            (0, "0 bytes"),
            (10239, "10239 bytes"),
            (10240, "10 kB"),
            (1_000_000, "977 kB"),
            (20_000_000, "19 MB"),
            (1 << 40, "1024 GB"),
            (-10240, "-10 kB"),
        ];
        for (bytes, text) in cases {
            assert_eq!(size_pretty(bytes), text, "{bytes}");
        }
    }

    #[test]
    fn names_split_as_postgres() {
        assert_eq!(
            split_name("Public.\"My T\"").unwrap(),
            vec!["public", "My T"]
        );
        assert_eq!(split_name("a . b").unwrap(), vec!["a", "b"]);
        assert!(split_name("a..b").is_none());
        assert!(split_name("\"open").is_none());
    }
}
