//! Result column names as PostgreSQL gives them (its `FigureColname`), read from the query
//! as written, before Eddy's rewrites replace casts and operators by functions whose names
//! DataFusion would show: `ARRAY[1]` is `array`, `'x'::varchar` is `varchar`, `a[1]` is `a`,
//! `j -> 'k'` is `?column?`, `true` is `?column?` (PostgreSQL 15), `CASE ...` is `case`.
//!
//! Entry point: [`output_names`]; `None` where the names cannot be read from the text alone
//! (a `*` in the list), and a `None` name where DataFusion's is already PostgreSQL's.

use datafusion::sql::sqlparser::ast::{self, DataType, Expr, SelectItem, SetExpr, Value};

use crate::names::normalize_ident;

const UNNAMED: &str = "?column?";

/// The names of a query's result columns, one per column, when its select list says them.
pub fn output_names(query: &ast::Query) -> Option<Vec<Option<String>>> {
    let mut body = query.body.as_ref();
    while let SetExpr::SetOperation { left, .. } = body {
        body = left.as_ref();
    }
    let SetExpr::Select(select) = body else {
        return None;
    };
    select
        .projection
        .iter()
        .map(|item| match item {
            SelectItem::UnnamedExpr(expr) => Some(match expr {
                Expr::Identifier(_) | Expr::CompoundIdentifier(_) => None,
                other => Some(expr_name(other).unwrap_or_else(|| UNNAMED.to_owned())),
            }),
            SelectItem::ExprWithAlias { .. } => Some(None),
            _ => None,
        })
        .collect()
}

/// PostgreSQL's name for an expression, `None` for `?column?`.
pub(crate) fn expr_name(expr: &Expr) -> Option<String> {
    match expr {
        Expr::Identifier(i) => Some(normalize_ident(i)),
        Expr::CompoundIdentifier(parts) => parts.last().map(normalize_ident),
        Expr::Function(f) => f
            .name
            .0
            .last()
            .and_then(|p| p.as_ident())
            .map(normalize_ident),
        Expr::Nested(inner) => expr_name(inner),
        Expr::Cast {
            expr, data_type, ..
        } => expr_name(expr).or_else(|| type_name(data_type).map(str::to_owned)),
        Expr::TypedString(typed) => type_name(&typed.data_type).map(str::to_owned),
        Expr::Interval(_) => Some("interval".to_owned()),
        Expr::Array(_) => Some("array".to_owned()),
        Expr::CompoundFieldAccess { root, .. } => expr_name(root),
        Expr::Case { .. } => Some("case".to_owned()),
        Expr::Exists { .. } => Some("exists".to_owned()),
        Expr::Value(v) if matches!(v.value, Value::Boolean(_)) => Some("?column?".to_owned()),
        Expr::Extract { .. } => Some("extract".to_owned()),
        Expr::Substring { .. } => Some("substring".to_owned()),
        Expr::Trim { .. } => Some("btrim".to_owned()),
        Expr::Position { .. } => Some("position".to_owned()),
        Expr::Overlay { .. } => Some("overlay".to_owned()),
        Expr::Ceil { .. } => Some("ceil".to_owned()),
        Expr::Floor { .. } => Some("floor".to_owned()),
        _ => None,
    }
}

/// The internal name PostgreSQL prints for a type in a cast (`int4` for `integer`), the
/// element's for an array type.
fn type_name(data_type: &DataType) -> Option<&'static str> {
    use DataType as T;
    Some(match data_type {
        T::Array(
            ast::ArrayElemTypeDef::SquareBracket(element, _)
            | ast::ArrayElemTypeDef::AngleBracket(element)
            | ast::ArrayElemTypeDef::Parenthesis(element),
        ) => return type_name(element),
        T::Bool | T::Boolean => "bool",
        T::SmallInt(_) | T::Int2(_) => "int2",
        T::Int(_) | T::Integer(_) | T::Int4(_) => "int4",
        T::BigInt(_) | T::Int8(_) => "int8",
        T::Real | T::Float4 => "float4",
        T::DoublePrecision | T::Float8 | T::Double(_) | T::Float(_) => "float8",
        T::Numeric(_) | T::Decimal(_) | T::Dec(_) => "numeric",
        T::Text | T::String(_) => "text",
        T::Varchar(_) | T::CharacterVarying(_) | T::CharVarying(_) => "varchar",
        T::Char(_) | T::Character(_) => "bpchar",
        T::Bytea => "bytea",
        T::Date => "date",
        T::Time(_, ast::TimezoneInfo::WithTimeZone | ast::TimezoneInfo::Tz) => "timetz",
        T::Time(..) => "time",
        T::Timestamp(_, ast::TimezoneInfo::WithTimeZone | ast::TimezoneInfo::Tz) => "timestamptz",
        T::Timestamp(..) => "timestamp",
        T::Interval { .. } => "interval",
        T::JSON => "json",
        T::JSONB => "jsonb",
        T::Custom(name, _) => match name.to_string().to_lowercase().as_str() {
            "timestamptz" => "timestamptz",
            "jsonb" => "jsonb",
            "oid" => "oid",
            "regclass" => "regclass",
            "regtype" => "regtype",
            "name" => "name",
            _ => return None,
        },
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(sql: &str) -> Vec<String> {
        let statements = crate::parse_statements(sql).unwrap();
        let crate::Statement::Sql(statement) = &statements[0].statement else {
            panic!()
        };
        let ast::Statement::Query(query) = statement.as_ref() else {
            panic!()
        };
        output_names(query)
            .unwrap()
            .into_iter()
            .map(|n| n.unwrap_or_else(|| "-".into()))
            .collect()
    }

    #[test]
    fn names_as_postgres_figures_them() {
        assert_eq!(
            names(
                "SELECT a, t.b, 1, 1 + 1, ARRAY[1], '{1}'::int[], 'x'::varchar, a::text, count(*), a[1], (ARRAY[1])[1], j -> 'k', true, CASE WHEN a THEN 1 END, x AS y, DATE '2024-01-01'"
            ),
            [
                "-", "-", "?column?", "?column?", "array", "int4", "varchar", "a", "count", "a",
                "array", "?column?", "?column?", "case", "-", "date"
            ]
        );
    }
}
