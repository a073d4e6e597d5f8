//! Rewrites of the parsed statement before DataFusion plans it, for what PostgreSQL decides
//! from the SQL text itself:
//!
//! - integer literals are `integer` when they fit, `bigint` when that fits, else `numeric`
//!   (DataFusion makes every one a bigint); positions that need a plain literal (LIMIT, OFFSET,
//!   `GROUP BY 1`, `ORDER BY 1`, window frames, table-function and `lag`/`lead`/`ntile`
//!   arguments) keep it;
//! - casts to types Arrow cannot name (`jsonb`, `json`, `varchar(n)`, `char(n)`, unconstrained
//!   `numeric`) become calls of Eddy's functions that carry the PostgreSQL type;
//! - interval literals are read with PostgreSQL's syntax (`'1 day 02:03:04'`, `'1.5 hours'`);
//! - `make_interval(days => 3)` gets its omitted arguments, and `age(ts)` its first one;
//! - the column of a one-column set-returning function is named after its table alias
//!   (`FROM generate_series(1, 3) g` has a column `g`, as in PostgreSQL).

use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::{
    self, CastKind, CharacterLength, DataType, ExactNumberInfo, Expr, FunctionArg, FunctionArgExpr,
    FunctionArguments, Ident, ObjectName, TableFactor, UnaryOperator, Value, VisitMut, VisitorMut,
    WindowFrameBound, WindowType,
};
use eddy_common::Result;

use super::datetime_in;

pub const TO_JSONB: &str = "eddy_to_jsonb";
pub const TO_JSON: &str = "eddy_to_json";
pub const TO_VARCHAR: &str = "eddy_to_varchar";
pub const TO_BPCHAR: &str = "eddy_to_bpchar";
pub const TO_NUMERIC: &str = "eddy_to_numeric";

/// Set-returning functions PostgreSQL has that are `unnest` of a list Eddy computes: the
/// function, the list function, and the column name PostgreSQL gives it in FROM (`None`:
/// named after the table alias, as a function returning a scalar is).
const UNNESTED_FUNCTIONS: [(&str, &str, Option<&str>); 4] = [
    ("generate_subscripts", super::array::SUBSCRIPTS, None),
    (
        "jsonb_array_elements",
        super::jsonb::ELEMENTS,
        Some("value"),
    ),
    (
        "jsonb_array_elements_text",
        super::jsonb::ELEMENTS_TEXT,
        Some("value"),
    ),
    ("jsonb_object_keys", super::jsonb::OBJECT_KEYS, None),
];

/// `generate_subscripts(a, 1)` as `unnest(eddy_array_subscripts(a, 1))` (jsonb elements
/// typed jsonb again, which unnest forgets), with the name PostgreSQL gives its column in FROM.
fn unnested(
    name: &ObjectName,
    args: &[FunctionArg],
) -> Option<(Expr, &'static str, Option<&'static str>)> {
    let function = name
        .0
        .last()
        .and_then(|p| p.as_ident())
        .map(|i| i.value.to_lowercase())?;
    let (name, list, column) = UNNESTED_FUNCTIONS.iter().find(|(f, _, _)| *f == function)?;
    let inner: Vec<Expr> = args
        .iter()
        .filter_map(|a| match a {
            FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => Some(e.clone()),
            _ => None,
        })
        .collect();
    let unnest = call("unnest", vec![call(list, inner)]);
    let expr = if *list == super::jsonb::ELEMENTS {
        call(TO_JSONB, vec![unnest])
    } else {
        unnest
    };
    Some((expr, name, *column))
}

/// `FROM generate_subscripts(a, 1) AS s` as `FROM (SELECT unnest(...) AS s) AS s`: a derived
/// table names and types its column as PostgreSQL does, where DataFusion's UNNEST would not.
fn unnested_table(factor: &TableFactor) -> Option<TableFactor> {
    let TableFactor::Table {
        name,
        args: Some(args),
        alias,
        ..
    } = factor
    else {
        return None;
    };
    let (expr, function, column) = unnested(name, &args.args)?;
    let mut alias = alias.clone().unwrap_or_else(|| ast::TableAlias {
        explicit: false,
        name: Ident::new(function),
        columns: vec![],
        at: None,
    });
    let column = match (alias.columns.first(), column) {
        (Some(c), _) => c.name.clone(),
        (None, Some(c)) => Ident::new(c),
        (None, None) => alias.name.clone(),
    };
    alias.columns.clear();
    let sql = format!("SELECT {expr} AS {column}");
    let query = datafusion::sql::sqlparser::parser::Parser::new(
        &datafusion::sql::sqlparser::dialect::PostgreSqlDialect {},
    )
    .try_with_sql(&sql)
    .ok()?
    .parse_query()
    .ok()?;
    Some(TableFactor::Derived {
        lateral: false,
        subquery: query,
        alias: Some(alias),
        sample: None,
    })
}

/// Functions PostgreSQL names as DataFusion names another one.
fn renamed(function: &str) -> Option<&'static str> {
    Some(match function {
        // PostgreSQL's array_remove and array_replace change every occurrence.
        "array_remove" => "array_remove_all",
        "array_replace" => "array_replace_all",
        _ => return None,
    })
}

/// Applies every rewrite to a statement.
pub fn rewrite(statement: &mut ast::Statement) -> Result<()> {
    let mut rewriter = Rewriter { error: None };
    let _ = statement.visit(&mut rewriter);
    if let Some(e) = rewriter.error {
        return Err(e);
    }
    let _ = statement.visit(&mut Unmark);
    Ok(())
}

/// Marks a literal that must stay as DataFusion reads it (sqlparser's "long" flag, which
/// DataFusion ignores and [`Unmark`] clears again).
fn protect(expr: &mut Expr) {
    match expr {
        Expr::Value(v) => {
            if let Value::Number(_, long) = &mut v.value {
                *long = true;
            }
        }
        Expr::UnaryOp {
            op: UnaryOperator::Minus,
            expr,
        } => protect(expr),
        Expr::Nested(inner) => protect(inner),
        _ => {}
    }
}

fn protect_args(args: &mut [FunctionArg]) {
    for arg in args {
        if let FunctionArg::Unnamed(FunctionArgExpr::Expr(e))
        | FunctionArg::Named {
            arg: FunctionArgExpr::Expr(e),
            ..
        } = arg
        {
            protect(e);
        }
    }
}

fn function_args(f: &mut ast::Function) -> Option<&mut Vec<FunctionArg>> {
    match &mut f.args {
        FunctionArguments::List(list) => Some(&mut list.args),
        _ => None,
    }
}

fn function_name(f: &ast::Function) -> String {
    f.name
        .0
        .last()
        .and_then(|p| p.as_ident())
        .map(|i| i.value.to_lowercase())
        .unwrap_or_default()
}

fn call(name: &str, args: Vec<Expr>) -> Expr {
    Expr::Function(ast::Function {
        name: ObjectName::from(vec![Ident::new(name)]),
        uses_odbc_syntax: false,
        parameters: FunctionArguments::None,
        args: FunctionArguments::List(ast::FunctionArgumentList {
            duplicate_treatment: None,
            args: args
                .into_iter()
                .map(|a| FunctionArg::Unnamed(FunctionArgExpr::Expr(a)))
                .collect(),
            clauses: vec![],
        }),
        filter: None,
        null_treatment: None,
        over: None,
        within_group: vec![],
    })
}

fn number(n: impl ToString) -> Expr {
    Expr::value(Value::Number(n.to_string(), true))
}

fn string(s: impl Into<String>) -> Expr {
    Expr::value(Value::SingleQuotedString(s.into()))
}

/// The function that stands for a cast to `data_type`, when Arrow has no such type.
fn cast_function(expr: Expr, data_type: &DataType) -> Option<Expr> {
    let length = |l: &Option<CharacterLength>| match l {
        Some(CharacterLength::IntegerLength { length, .. }) => Some(*length),
        _ => None,
    };
    Some(match data_type {
        DataType::JSONB => call(TO_JSONB, vec![expr]),
        DataType::JSON => call(TO_JSON, vec![expr]),
        DataType::Varchar(l) | DataType::CharacterVarying(l) | DataType::CharVarying(l) => {
            match length(l) {
                Some(n) => call(TO_VARCHAR, vec![expr, number(n)]),
                None => call(TO_VARCHAR, vec![expr]),
            }
        }
        DataType::Char(l) | DataType::Character(l) => {
            call(TO_BPCHAR, vec![expr, number(length(l).unwrap_or(1))])
        }
        DataType::Numeric(ExactNumberInfo::None)
        | DataType::Decimal(ExactNumberInfo::None)
        | DataType::Dec(ExactNumberInfo::None) => call(TO_NUMERIC, vec![expr]),
        DataType::Custom(name, _) if name.to_string().eq_ignore_ascii_case("jsonb") => {
            call(TO_JSONB, vec![expr])
        }
        _ => return None,
    })
}

/// An integer literal typed as PostgreSQL types it.
fn typed_number(text: &str, negative: bool) -> Option<Expr> {
    if text.contains(['.', 'e', 'E']) {
        return decimal_literal(text);
    }
    let signed = if negative {
        format!("-{text}")
    } else {
        text.to_owned()
    };
    let literal = || {
        let n = number(text);
        if negative {
            Expr::UnaryOp {
                op: UnaryOperator::Minus,
                expr: Box::new(n),
            }
        } else {
            n
        }
    };
    let cast = |expr: Expr, data_type: DataType| Expr::Cast {
        kind: CastKind::DoubleColon,
        expr: Box::new(expr),
        data_type,
        array: false,
        format: None,
    };
    if signed.parse::<i32>().is_ok() {
        Some(cast(literal(), DataType::Int(None)))
    } else if signed.parse::<i64>().is_ok() {
        negative.then(literal)
    } else {
        // Beyond bigint: numeric, as PostgreSQL (DataFusion would read an unsigned or a float).
        Some(call(TO_NUMERIC, vec![string(signed)]))
    }
}

/// A numeric literal a 38-digit decimal cannot hold (`1e308`) is a double, the nearest type
/// Eddy has; the others stay DataFusion's decimals.
fn decimal_literal(text: &str) -> Option<Expr> {
    let exponent: i64 = text
        .find(['e', 'E'])
        .and_then(|i| text[i + 1..].parse().ok())
        .unwrap_or(0);
    let mantissa = text.split(['e', 'E']).next().unwrap_or(text);
    let fraction = mantissa.split_once('.').map_or(0, |(_, f)| f.len()) as i64;
    let scale = (fraction - exponent).clamp(0, 38) as i8;
    if super::decimal::parse(text, scale)
        .is_ok_and(|v| super::decimal::fits(v, super::decimal::PRECISION_MAX))
    {
        return None;
    }
    Some(Expr::Cast {
        kind: CastKind::DoubleColon,
        expr: Box::new(string(text)),
        data_type: DataType::DoublePrecision,
        array: false,
        format: None,
    })
}

/// `INTERVAL '1 day 02:03:04'` in the form DataFusion reads: months, days, microseconds
/// (negated for `-INTERVAL '...'`, which DataFusion would negate only the first field of).
fn interval_literal(interval: &mut ast::Interval, negate: bool) -> Result<bool> {
    if interval.leading_field.is_some() || interval.last_field.is_some() {
        return Ok(false);
    }
    let Expr::Value(v) = interval.value.as_ref() else {
        return Ok(false);
    };
    let Value::SingleQuotedString(text) = &v.value else {
        return Ok(false);
    };
    let parsed = datetime_in::parse_interval(text)?;
    let sign = if negate { -1 } else { 1 };
    let (months, days, micros) = (
        i64::from(parsed.months) * sign,
        i64::from(parsed.days) * sign,
        parsed.micros * sign,
    );
    *interval.value = string(format!("{months} months {days} days {micros} microseconds"));
    Ok(true)
}

/// `make_interval(days => 3)`: every parameter, positionally, 0 where omitted.
fn make_interval_positional(args: &mut Vec<FunctionArg>) {
    const PARAMETERS: [&str; 7] = ["years", "months", "weeks", "days", "hours", "mins", "secs"];
    if !args
        .iter()
        .any(|a| matches!(a, FunctionArg::Named { .. } | FunctionArg::ExprNamed { .. }))
    {
        return;
    }
    let mut positional: Vec<Option<Expr>> = vec![None; PARAMETERS.len()];
    for (i, arg) in args.drain(..).enumerate() {
        match arg {
            FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) if i < PARAMETERS.len() => {
                positional[i] = Some(e)
            }
            FunctionArg::Named {
                name,
                arg: FunctionArgExpr::Expr(e),
                ..
            }
            | FunctionArg::ExprNamed {
                name: Expr::Identifier(name),
                arg: FunctionArgExpr::Expr(e),
                ..
            } => {
                if let Some(k) = PARAMETERS
                    .iter()
                    .position(|p| p.eq_ignore_ascii_case(&name.value))
                {
                    positional[k] = Some(e);
                }
            }
            _ => {}
        }
    }
    let last = positional.iter().rposition(Option::is_some).unwrap_or(0);
    *args = positional
        .into_iter()
        .take(last + 1)
        .map(|e| {
            FunctionArg::Unnamed(FunctionArgExpr::Expr(
                e.unwrap_or_else(|| Expr::value(Value::Number("0".into(), false))),
            ))
        })
        .collect();
}

/// Set-returning functions of one column: PostgreSQL names that column after the table alias
/// (`generate_series(1, 3) g` has a column `g`), or after the function without one.
const SINGLE_COLUMN_FUNCTIONS: [&str; 3] = ["generate_series", "range", "unnest"];

fn name_function_column(name: &ObjectName, alias: &mut Option<ast::TableAlias>) {
    let function = name
        .0
        .last()
        .and_then(|p| p.as_ident())
        .map(|i| i.value.to_lowercase())
        .unwrap_or_default();
    if !SINGLE_COLUMN_FUNCTIONS.contains(&function.as_str()) {
        return;
    }
    let alias = alias.get_or_insert_with(|| ast::TableAlias {
        explicit: false,
        name: Ident::new(function.clone()),
        columns: vec![],
        at: None,
    });
    if alias.columns.is_empty() {
        alias.columns = vec![ast::TableAliasColumnDef {
            name: alias.name.clone(),
            data_type: None,
        }];
    }
}

struct Rewriter {
    error: Option<eddy_common::Error>,
}

impl VisitorMut for Rewriter {
    type Break = ();

    fn pre_visit_query(&mut self, query: &mut ast::Query) -> ControlFlow<()> {
        if let Some(ast::LimitClause::LimitOffset { limit, offset, .. }) = &mut query.limit_clause {
            if let Some(limit) = limit {
                protect(limit);
            }
            if let Some(offset) = offset {
                protect(&mut offset.value);
            }
        }
        if let Some(ast::LimitClause::OffsetCommaLimit { offset, limit }) = &mut query.limit_clause
        {
            protect(offset);
            protect(limit);
        }
        if let Some(fetch) = &mut query.fetch
            && let Some(q) = &mut fetch.quantity
        {
            protect(q);
        }
        if let Some(order_by) = &mut query.order_by
            && let ast::OrderByKind::Expressions(exprs) = &mut order_by.kind
        {
            exprs.iter_mut().for_each(|o| protect(&mut o.expr));
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_select(&mut self, select: &mut ast::Select) -> ControlFlow<()> {
        if let ast::GroupByExpr::Expressions(exprs, _) = &mut select.group_by {
            exprs.iter_mut().for_each(protect);
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_table_factor(&mut self, factor: &mut TableFactor) -> ControlFlow<()> {
        match factor {
            TableFactor::Table { .. } if let Some(derived) = unnested_table(factor) => {
                *factor = derived
            }
            TableFactor::Table {
                name,
                args: Some(args),
                alias,
                ..
            } => {
                protect_args(&mut args.args);
                name_function_column(name, alias);
            }
            TableFactor::Function { args, .. } => protect_args(args),
            // `FROM unnest(a)` has a column named `unnest`, as in PostgreSQL.
            TableFactor::UNNEST {
                alias,
                array_exprs,
                with_offset: false,
                with_ordinality: false,
                ..
            } if array_exprs.len() == 1 => {
                let alias = alias.get_or_insert_with(|| ast::TableAlias {
                    explicit: false,
                    name: Ident::new("unnest"),
                    columns: vec![],
                    at: None,
                });
                if alias.columns.is_empty() {
                    alias.columns = vec![ast::TableAliasColumnDef {
                        name: alias.name.clone(),
                        data_type: None,
                    }];
                }
            }
            _ => {}
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<()> {
        match expr {
            Expr::Function(f) => {
                if let Some(WindowType::WindowSpec(spec)) = &mut f.over
                    && let Some(frame) = &mut spec.window_frame
                {
                    for bound in
                        std::iter::once(&mut frame.start_bound).chain(frame.end_bound.as_mut())
                    {
                        if let WindowFrameBound::Preceding(Some(e))
                        | WindowFrameBound::Following(Some(e)) = bound
                        {
                            protect(e);
                        }
                    }
                }
                let name = function_name(f);
                if let FunctionArguments::List(list) = &f.args
                    && let Some((unnest, _, _)) = unnested(&f.name, &list.args)
                {
                    *expr = unnest;
                    return ControlFlow::Continue(());
                }
                if let Some(new_name) = renamed(&name) {
                    f.name = ObjectName::from(vec![Ident::new(new_name)]);
                }
                // Arguments that must be constants (and round's places, which type its result).
                if matches!(
                    name.as_str(),
                    "lag" | "lead" | "ntile" | "nth_value" | "round" | "trunc"
                ) && let Some(args) = function_args(f)
                {
                    let first = if name == "ntile" {
                        0
                    } else {
                        1.min(args.len())
                    };
                    protect_args(&mut args[first..]);
                }
                if name == "make_interval"
                    && let Some(args) = function_args(f)
                {
                    make_interval_positional(args);
                }
                if name == "age"
                    && let Some(args) = function_args(f)
                    && args.len() == 1
                {
                    // age(ts) is age(current_date, ts): midnight of today.
                    let today = Expr::Cast {
                        kind: CastKind::DoubleColon,
                        expr: Box::new(call(
                            "date_trunc",
                            vec![string("day"), call("now", vec![])],
                        )),
                        data_type: DataType::Timestamp(None, ast::TimezoneInfo::None),
                        array: false,
                        format: None,
                    };
                    args.insert(0, FunctionArg::Unnamed(FunctionArgExpr::Expr(today)));
                }
            }
            Expr::UnaryOp {
                op: UnaryOperator::Minus,
                expr: inner,
            } => {
                if let Expr::Value(v) = inner.as_ref()
                    && let Value::Number(text, false) = &v.value
                    && let Some(typed) = typed_number(text, true)
                {
                    *expr = typed;
                } else if let Expr::Interval(interval) = inner.as_mut() {
                    match interval_literal(interval, true) {
                        Ok(true) => *expr = Expr::Interval(interval.clone()),
                        Ok(false) => {}
                        Err(e) => {
                            self.error = Some(e);
                            return ControlFlow::Break(());
                        }
                    }
                }
            }
            Expr::Interval(interval) => {
                if let Err(e) = interval_literal(interval, false) {
                    self.error = Some(e);
                    return ControlFlow::Break(());
                }
            }
            _ => {}
        }
        ControlFlow::Continue(())
    }

    fn post_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<()> {
        match expr {
            Expr::Value(v) => {
                if let Value::Number(text, false) = &v.value
                    && let Some(typed) = typed_number(text, false)
                {
                    *expr = typed;
                }
            }
            Expr::Cast {
                kind: CastKind::Cast | CastKind::DoubleColon,
                expr: inner,
                data_type,
                format: None,
                ..
            } => {
                if let Some(f) = cast_function(inner.as_ref().clone(), data_type) {
                    *expr = f;
                }
            }
            Expr::TypedString(typed) => {
                let literal = Expr::Value(typed.value.clone());
                if let Some(f) = cast_function(literal, &typed.data_type) {
                    *expr = f;
                }
            }
            // DataFusion's LIKE knows only the backslash escape: rewrite the pattern to it.
            Expr::Like {
                pattern,
                escape_char,
                ..
            }
            | Expr::ILike {
                pattern,
                escape_char,
                ..
            } if escape_char.as_ref().is_some_and(
                |e| !matches!(&e.value, Value::SingleQuotedString(c) if c == "\\"),
            ) =>
            {
                let Some(escape) = escape_char.take() else {
                    return ControlFlow::Continue(());
                };
                let args = vec![pattern.as_ref().clone(), Expr::Value(escape)];
                **pattern = call(crate::pg::strings::LIKE_ESCAPE, args);
            }
            _ => {}
        }
        ControlFlow::Continue(())
    }
}

/// Clears the marks [`protect`] set, so the statement prints as written.
struct Unmark;

impl VisitorMut for Unmark {
    type Break = ();

    fn post_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<()> {
        if let Expr::Value(v) = expr
            && let Value::Number(_, long) = &mut v.value
        {
            *long = false;
        }
        ControlFlow::Continue(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rewritten(sql: &str) -> String {
        let mut statements = crate::parse_statements(sql).unwrap();
        let crate::Statement::Sql(statement) = &mut statements[0].statement else {
            panic!()
        };
        rewrite(statement).unwrap();
        statement.to_string()
    }

    #[test]
    fn literals_are_typed_like_postgres() {
        assert_eq!(
            rewritten("SELECT 1, 2147483648, -2147483648, 9223372036854775808"),
            "SELECT 1::INT, 2147483648, -2147483648::INT, eddy_to_numeric('9223372036854775808')"
        );
        assert_eq!(
            rewritten("SELECT a FROM t GROUP BY 1 ORDER BY 1 LIMIT 5 OFFSET 2"),
            "SELECT a FROM t GROUP BY 1 ORDER BY 1 LIMIT 5 OFFSET 2"
        );
        assert_eq!(
            rewritten("SELECT '{}'::jsonb, x::varchar(3), y::numeric"),
            "SELECT eddy_to_jsonb('{}'), eddy_to_varchar(x, 3), eddy_to_numeric(y)"
        );
        assert_eq!(
            rewritten("SELECT make_interval(days => 3)"),
            "SELECT make_interval(0::INT, 0::INT, 0::INT, 3::INT)"
        );
        assert_eq!(
            rewritten("SELECT INTERVAL '1 day 02:00:00'"),
            "SELECT INTERVAL '0 months 1 days 7200000000 microseconds'"
        );
    }
}
