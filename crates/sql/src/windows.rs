//! Window table functions: `TUMBLE(rel, ts, size [, offset])` and `HOP(rel, ts, slide, size [,
//! offset])` in FROM.
//!
//! They are rewritten in the AST before DataFusion plans the query: TUMBLE becomes
//! `(SELECT *, tumble_start(ts, size, offset) AS window_start, tumble_end(...) AS window_end
//! FROM rel)`, HOP the UNION ALL of `size / slide` such projections (`hop_start(ts, slide, size,
//! offset, i)` is the i-th window a row belongs to). Ad-hoc queries run them in batch; the
//! lowering recognises the window-bound functions to close windows by the watermark.

use std::ops::ControlFlow;

use arrow::array::{ArrayRef, AsArray, PrimitiveArray};
use arrow::datatypes::{DataType, Int64Type, TimeUnit};
use datafusion::common::ScalarValue;
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};
use datafusion::prelude::SessionContext;
use datafusion::sql::sqlparser::ast::{self, VisitMut, VisitorMut};
use eddy_common::{Error, Result, SqlState};

/// Which bound of which window a function computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WindowBound {
    TumbleStart,
    TumbleEnd,
    HopStart,
    HopEnd,
    /// Placeholders in a view's plan (the row's own time): the lowering computes sessions.
    SessionStart,
    SessionEnd,
}

impl WindowBound {
    const ALL: [WindowBound; 6] = [
        WindowBound::TumbleStart,
        WindowBound::TumbleEnd,
        WindowBound::HopStart,
        WindowBound::HopEnd,
        WindowBound::SessionStart,
        WindowBound::SessionEnd,
    ];

    pub fn name(self) -> &'static str {
        match self {
            WindowBound::TumbleStart => "tumble_start",
            WindowBound::TumbleEnd => "tumble_end",
            WindowBound::HopStart => "hop_start",
            WindowBound::HopEnd => "hop_end",
            WindowBound::SessionStart => "session_start",
            WindowBound::SessionEnd => "session_end",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|b| b.name() == name)
    }

    pub fn is_end(self) -> bool {
        matches!(
            self,
            WindowBound::TumbleEnd | WindowBound::HopEnd | WindowBound::SessionEnd
        )
    }

    pub fn is_session(self) -> bool {
        matches!(self, WindowBound::SessionStart | WindowBound::SessionEnd)
    }
}

/// `now()` inside a materialized view: the time an epoch is processed, never folded into a
/// constant (the lowering turns comparisons with it into a temporal filter).
pub const VIEW_NOW: &str = "eddy_now";

/// Registers the window-bound functions and `eddy_now()`.
pub fn register(ctx: &SessionContext) {
    for bound in WindowBound::ALL {
        // tumble_start(ts, size [, offset]) is also callable directly, as in RisingWave.
        let signature = match bound {
            WindowBound::TumbleStart | WindowBound::TumbleEnd => Signature::one_of(
                vec![
                    datafusion::logical_expr::TypeSignature::Any(2),
                    datafusion::logical_expr::TypeSignature::Any(3),
                ],
                Volatility::Immutable,
            ),
            WindowBound::HopStart | WindowBound::HopEnd => Signature::any(5, Volatility::Immutable),
            WindowBound::SessionStart | WindowBound::SessionEnd => {
                Signature::any(2, Volatility::Immutable)
            }
        };
        ctx.register_udf(ScalarUDF::new_from_impl(BoundFunction { bound, signature }));
    }
    // `proctime()` in ad-hoc queries: the current time, like now().
    ctx.register_udf(datafusion::logical_expr::create_udf(
        "proctime",
        vec![],
        DataType::Timestamp(TimeUnit::Nanosecond, Some("+00:00".into())),
        Volatility::Stable,
        std::sync::Arc::new(|_args: &[ColumnarValue]| {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as i64);
            Ok(ColumnarValue::Scalar(ScalarValue::TimestampNanosecond(
                Some(now),
                Some("+00:00".into()),
            )))
        }),
    ));
    ctx.register_udf(datafusion::logical_expr::create_udf(
        VIEW_NOW,
        vec![],
        DataType::Timestamp(TimeUnit::Nanosecond, Some("+00:00".into())),
        Volatility::Volatile,
        std::sync::Arc::new(|_args: &[ColumnarValue]| {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as i64);
            Ok(ColumnarValue::Scalar(ScalarValue::TimestampNanosecond(
                Some(now),
                Some("+00:00".into()),
            )))
        }),
    ));
}

/// In a view's query, `now()`, `CURRENT_TIMESTAMP` and `proctime()` become `eddy_now()`.
pub fn rewrite_now(statement: &mut ast::Statement) {
    struct Now;
    impl VisitorMut for Now {
        type Break = ();
        fn post_visit_expr(&mut self, expr: &mut ast::Expr) -> ControlFlow<()> {
            if let ast::Expr::Function(f) = expr
                && matches!(
                    f.name.to_string().to_lowercase().as_str(),
                    "now" | "current_timestamp" | "proctime"
                )
            {
                f.name = ast::ObjectName::from(vec![ast::Ident::new(VIEW_NOW)]);
                f.args = ast::FunctionArguments::List(ast::FunctionArgumentList {
                    duplicate_treatment: None,
                    args: Vec::new(),
                    clauses: Vec::new(),
                });
            }
            ControlFlow::Continue(())
        }
    }
    let _ = statement.visit(&mut Now);
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct BoundFunction {
    bound: WindowBound,
    signature: Signature,
}

impl ScalarUDFImpl for BoundFunction {
    fn name(&self) -> &str {
        self.bound.name()
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> datafusion::error::Result<DataType> {
        match args.first() {
            Some(t @ DataType::Timestamp(_, _)) => Ok(t.clone()),
            other => {
                let found = other.map_or_else(
                    || "nothing".to_owned(),
                    |t| {
                        crate::types::pg_type_name(&arrow::datatypes::Field::new(
                            "",
                            t.clone(),
                            true,
                        ))
                    },
                );
                let window = self
                    .bound
                    .name()
                    .split('_')
                    .next()
                    .unwrap_or_default()
                    .to_uppercase();
                Err(datafusion::error::DataFusionError::External(Box::new(
                    Error::new(
                        SqlState::DATATYPE_MISMATCH,
                        format!(
                            "{window}: the time column must be a timestamp or timestamptz, not {found}"
                        ),
                    ),
                )))
            }
        }
    }

    fn invoke_with_args(
        &self,
        args: ScalarFunctionArgs,
    ) -> datafusion::error::Result<ColumnarValue> {
        if self.bound.is_session() {
            // The row's own time; sessions are computed by the view's session aggregate.
            return Ok(args.args[0].clone());
        }
        let interval = |i: usize| -> datafusion::error::Result<i64> {
            match &args.args[i] {
                ColumnarValue::Scalar(ScalarValue::IntervalMonthDayNano(Some(v)))
                    if v.months == 0 =>
                {
                    Ok(i64::from(v.days) * 86_400_000_000 + v.nanoseconds / 1000)
                }
                ColumnarValue::Scalar(ScalarValue::Int64(Some(v))) => Ok(*v),
                other => Err(datafusion::error::DataFusionError::Plan(format!(
                    "{}: window sizes must be constant intervals without months, not {other:?}",
                    self.bound.name()
                ))),
            }
        };
        let (slide, size, offset, index) = match self.bound {
            WindowBound::TumbleStart | WindowBound::TumbleEnd => {
                let offset = if args.args.len() > 2 { interval(2)? } else { 0 };
                (interval(1)?, interval(1)?, offset, 0)
            }
            WindowBound::HopStart | WindowBound::HopEnd => {
                (interval(1)?, interval(2)?, interval(3)?, interval(4)?)
            }
            WindowBound::SessionStart | WindowBound::SessionEnd => return Ok(args.args[0].clone()),
        };
        if slide <= 0 || size <= 0 {
            return Err(datafusion::error::DataFusionError::Plan(format!(
                "{}: window sizes must be positive",
                self.bound.name()
            )));
        }
        let times = args.args[0].to_array(args.number_rows)?;
        let DataType::Timestamp(unit, tz) = times.data_type().clone() else {
            return Err(datafusion::error::DataFusionError::Plan(format!(
                "{}: the time column must be a timestamp",
                self.bound.name()
            )));
        };
        // Work in the column's unit.
        let per_micro = match unit {
            TimeUnit::Second => {
                return Err(datafusion::error::DataFusionError::Plan(
                    "second-precision timestamps are not supported in windows".into(),
                ));
            }
            TimeUnit::Millisecond => {
                return Err(datafusion::error::DataFusionError::Plan(
                    "millisecond-precision timestamps are not supported in windows".into(),
                ));
            }
            TimeUnit::Microsecond => 1,
            TimeUnit::Nanosecond => 1000,
        };
        let (slide, size, offset) = (slide * per_micro, size * per_micro, offset * per_micro);
        let end = self.bound.is_end();
        let raw = arrow::compute::cast(&times, &DataType::Int64)?;
        let values: &PrimitiveArray<Int64Type> = raw.as_primitive();
        let bounds: PrimitiveArray<Int64Type> = values.unary(|t| {
            let start = t - (t - offset).rem_euclid(slide) - index * slide;
            if end { start + size } else { start }
        });
        let out: ArrayRef = arrow::compute::cast(&bounds, &DataType::Timestamp(unit, tz))?;
        Ok(ColumnarValue::Array(out))
    }
}

/// Microseconds of a constant interval such as `INTERVAL '5 seconds'` or `INTERVAL '4' SECOND`
/// (months are refused: they have no fixed length).
pub fn interval_micros(expr: &ast::Expr) -> Result<i64> {
    let bad = || {
        Error::new(
            SqlState::INVALID_PARAMETER_VALUE,
            format!("{expr} is not a constant interval without months"),
        )
    };
    let ast::Expr::Interval(interval) = expr else {
        return Err(bad());
    };
    let ast::Expr::Value(value) = interval.value.as_ref() else {
        return Err(bad());
    };
    let text = match &value.value {
        ast::Value::SingleQuotedString(s) => s.clone(),
        ast::Value::Number(n, _) => n.clone(),
        _ => return Err(bad()),
    };
    let text = match &interval.leading_field {
        Some(unit) => format!("{text} {unit}"),
        None => text,
    };
    let parsed = arrow::compute::kernels::cast_utils::parse_interval_month_day_nano(&text)
        .map_err(|_| bad())?;
    if parsed.months != 0 {
        return Err(bad());
    }
    Ok(i64::from(parsed.days) * 86_400_000_000 + parsed.nanoseconds / 1000)
}

/// Replaces the window table functions in FROM with the subqueries they stand for, and
/// temporal table references (`t FOR SYSTEM_TIME AS OF PROCTIME()`) with plain ones; returns
/// the names (aliases) of the temporal references.
pub fn rewrite(statement: &mut ast::Statement, for_view: bool) -> Result<Vec<String>> {
    struct Rewriter {
        temporal: Vec<String>,
        for_view: bool,
    }
    impl VisitorMut for Rewriter {
        type Break = Error;
        fn post_visit_table_factor(&mut self, factor: &mut ast::TableFactor) -> ControlFlow<Error> {
            if let ast::TableFactor::Table {
                name,
                alias,
                args: Some(args),
                ..
            } = factor
                && name
                    .to_string()
                    .eq_ignore_ascii_case(crate::parser::TEMPORAL_MARK)
            {
                let parts = match args.args.first() {
                    Some(ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Expr(
                        ast::Expr::Identifier(table),
                    ))) => vec![table.clone()],
                    Some(ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Expr(
                        ast::Expr::CompoundIdentifier(parts),
                    ))) if !parts.is_empty() => parts.clone(),
                    _ => {
                        return ControlFlow::Break(Error::unsupported(
                            "FOR SYSTEM_TIME AS OF PROCTIME() needs a table name",
                        ));
                    }
                };
                let table = parts[parts.len() - 1].clone();
                let alias = alias.clone().unwrap_or(ast::TableAlias {
                    explicit: true,
                    at: None,
                    name: table.clone(),
                    columns: Vec::new(),
                });
                self.temporal.push(alias.name.value.to_lowercase());
                *factor = ast::TableFactor::Table {
                    name: ast::ObjectName::from(parts),
                    alias: Some(alias),
                    args: None,
                    with_hints: Vec::new(),
                    version: None,
                    with_ordinality: false,
                    partitions: Vec::new(),
                    json_path: None,
                    sample: None,
                    index_hints: Vec::new(),
                };
                return ControlFlow::Continue(());
            }
            match window_subquery(factor, self.for_view) {
                Ok(Some(replacement)) => {
                    *factor = replacement;
                    ControlFlow::Continue(())
                }
                Ok(None) => ControlFlow::Continue(()),
                Err(e) => ControlFlow::Break(e),
            }
        }
    }
    let mut rewriter = Rewriter {
        temporal: Vec::new(),
        for_view,
    };
    match statement.visit(&mut rewriter) {
        ControlFlow::Break(e) => Err(e),
        ControlFlow::Continue(()) => Ok(rewriter.temporal),
    }
}

fn window_subquery(factor: &ast::TableFactor, for_view: bool) -> Result<Option<ast::TableFactor>> {
    let ast::TableFactor::Table {
        name,
        alias,
        args: Some(args),
        ..
    } = factor
    else {
        return Ok(None);
    };
    let function = name.to_string().to_lowercase();
    if !matches!(function.as_str(), "tumble" | "hop" | "session") {
        return Ok(None);
    }
    let args: Vec<&ast::Expr> = args
        .args
        .iter()
        .map(|a| match a {
            ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Expr(e)) => Ok(e),
            other => Err(Error::syntax(format!(
                "{function}: unexpected argument {other}"
            ))),
        })
        .collect::<Result<_>>()?;
    let usage = |form: &str| Error::new(SqlState::SYNTAX_ERROR, format!("{function} takes {form}"));
    let relation = |e: &ast::Expr| match e {
        ast::Expr::Identifier(i) => Ok(i.to_string()),
        ast::Expr::CompoundIdentifier(parts) => Ok(parts
            .iter()
            .map(|p| p.to_string())
            .collect::<Vec<_>>()
            .join(".")),
        other => Err(Error::unsupported(format!(
            "{function}: the first argument must name a table or view, not {other}"
        ))),
    };
    let (relation_sql, branches) = match function.as_str() {
        "tumble" => {
            if !(3..=4).contains(&args.len()) {
                return Err(usage("(relation, time_column, size [, offset])"));
            }
            let size = interval_micros(args[2])?;
            if size <= 0 {
                return Err(Error::new(
                    SqlState::INVALID_PARAMETER_VALUE,
                    "TUMBLE: the window size must be positive",
                ));
            }
            let offset = args
                .get(3)
                .map_or("INTERVAL '0' SECOND".to_owned(), |o| o.to_string());
            let (ts, size) = (args[1].to_string(), args[2].to_string());
            (
                relation(args[0])?,
                vec![format!(
                    "tumble_start({ts}, {size}, {offset}) AS window_start, tumble_end({ts}, {size}, {offset}) AS window_end"
                )],
            )
        }
        "hop" => {
            if !(4..=5).contains(&args.len()) {
                return Err(usage("(relation, time_column, slide, size [, offset])"));
            }
            let (slide_us, size_us) = (interval_micros(args[2])?, interval_micros(args[3])?);
            if slide_us <= 0 || size_us <= 0 {
                return Err(Error::new(
                    SqlState::INVALID_PARAMETER_VALUE,
                    "HOP: the slide and the size must be positive",
                ));
            }
            if size_us % slide_us != 0 {
                return Err(Error::new(
                    SqlState::INVALID_PARAMETER_VALUE,
                    "HOP: the window size must be a multiple of the slide",
                ));
            }
            let offset = args
                .get(4)
                .map_or("INTERVAL '0' SECOND".to_owned(), |o| o.to_string());
            let (ts, slide, size) = (
                args[1].to_string(),
                args[2].to_string(),
                args[3].to_string(),
            );
            let branches = (0..size_us / slide_us)
                .map(|i| format!("hop_start({ts}, {slide}, {size}, {offset}, {i}) AS window_start, hop_end({ts}, {slide}, {size}, {offset}, {i}) AS window_end"))
                .collect();
            (relation(args[0])?, branches)
        }
        _ => {
            if args.len() != 3 {
                return Err(usage("(relation, time_column, gap)"));
            }
            if interval_micros(args[2])? <= 0 {
                return Err(Error::new(
                    SqlState::INVALID_PARAMETER_VALUE,
                    "SESSION: the gap must be positive",
                ));
            }
            if !for_view {
                return Err(Error::unsupported(
                    "SESSION windows are maintained by materialized views (and SUBSCRIBE), not computed by ad-hoc queries",
                ));
            }
            // Placeholders: the lowering turns the GROUP BY over them into sessions per key.
            let (ts, gap) = (args[1].to_string(), args[2].to_string());
            (
                relation(args[0])?,
                vec![format!(
                    "session_start({ts}, {gap}) AS window_start, session_end({ts}, {gap}) AS window_end"
                )],
            )
        }
    };
    let sql = branches
        .iter()
        .map(|b| format!("SELECT *, {b} FROM {relation_sql}"))
        .collect::<Vec<_>>()
        .join(" UNION ALL ");
    let parsed = crate::parser::parse_statements(&sql)?;
    let Some(crate::parser::Statement::Sql(statement)) =
        parsed.into_iter().next().map(|p| p.statement)
    else {
        return Err(Error::internal("window rewrite did not parse"));
    };
    let ast::Statement::Query(query) = *statement else {
        return Err(Error::internal("window rewrite is not a query"));
    };
    // Without an alias the subquery keeps the relation's name, so `t.column` still resolves.
    let alias = alias.clone().or_else(|| {
        let last = match args[0] {
            ast::Expr::Identifier(i) => i.clone(),
            ast::Expr::CompoundIdentifier(parts) => parts.last()?.clone(),
            _ => return None,
        };
        Some(ast::TableAlias {
            explicit: true,
            at: None,
            name: last,
            columns: Vec::new(),
        })
    });
    Ok(Some(ast::TableFactor::Derived {
        lateral: false,
        subquery: query,
        alias,
        sample: None,
    }))
}

/// A view's options from `WITH (late_events = 'drop' | 'retract', allowed_lateness = '1 hour',
/// unbounded_joins = 'allow' | 'refuse', max_state_rows = n)` and `EMIT ON WINDOW CLOSE`.
pub fn view_options(
    options: &ast::CreateTableOptions,
    emit_on_close: bool,
) -> Result<crate::ViewOptions> {
    let mut out = crate::ViewOptions {
        emit_on_close,
        ..Default::default()
    };
    let list = match options {
        ast::CreateTableOptions::None => return Ok(out),
        ast::CreateTableOptions::With(list) => list,
        other => {
            return Err(Error::unsupported(format!(
                "materialized view options {other}"
            )));
        }
    };
    for option in list {
        let ast::SqlOption::KeyValue { key, value } = option else {
            return Err(Error::syntax(format!(
                "materialized view option {option}: expected key = value"
            )));
        };
        let text = match value {
            ast::Expr::Value(v) => match &v.value {
                ast::Value::SingleQuotedString(s) => s.clone(),
                other => other.to_string(),
            },
            ast::Expr::Identifier(i) => i.value.clone(),
            other => other.to_string(),
        };
        let invalid = |what: &str| {
            Error::new(
                SqlState::INVALID_PARAMETER_VALUE,
                format!("invalid value for {}: \"{text}\" ({what})", key.value),
            )
        };
        match key.value.to_lowercase().as_str() {
            "late_events" => {
                out.lateness.retract = match text.to_lowercase().as_str() {
                    "drop" => false,
                    "retract" => true,
                    _ => return Err(invalid("expected 'drop' or 'retract'")),
                }
            }
            "allowed_lateness" => {
                out.lateness.allowed_micros = duration_micros(&text)
                    .map_err(|_| invalid("expected an interval such as '1 hour'"))?;
            }
            "max_state_rows" => {
                out.max_state_rows = Some(
                    text.trim()
                        .parse::<u64>()
                        .ok()
                        .filter(|n| *n > 0)
                        .ok_or_else(|| invalid("expected a positive number of rows"))?,
                );
            }
            "unbounded_joins" => {
                out.unbounded_joins = match text.to_lowercase().as_str() {
                    "allow" => true,
                    "refuse" => false,
                    _ => return Err(invalid("expected 'allow' or 'refuse'")),
                }
            }
            other => {
                return Err(Error::new(
                    SqlState::INVALID_PARAMETER_VALUE,
                    format!(
                        "unknown materialized view option \"{other}\" (expected late_events, allowed_lateness, unbounded_joins, max_state_rows)"
                    ),
                ));
            }
        }
    }
    Ok(out)
}

/// A non-negative duration written as an interval (`'5 seconds'`, `'1 hour'`, `'200ms'`), µs.
pub fn duration_micros(text: &str) -> Result<i64> {
    let text = text.trim().trim_matches('\'');
    let invalid = || {
        Error::new(
            SqlState::INVALID_PARAMETER_VALUE,
            format!("\"{text}\" is not a duration such as '5 seconds'"),
        )
    };
    // Accept the short units people write in options: 200ms, 5s, 1m, 1h.
    let expanded = match text.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) if text[..i].trim().parse::<f64>().is_ok() => {
            let unit = match text[i..].trim() {
                "ms" => "milliseconds",
                "s" => "seconds",
                "m" | "min" => "minutes",
                "h" => "hours",
                "d" => "days",
                other => other,
            };
            format!("{} {unit}", text[..i].trim())
        }
        _ => text.to_owned(),
    };
    let parsed = arrow::compute::kernels::cast_utils::parse_interval_month_day_nano(&expanded)
        .map_err(|_| invalid())?;
    let micros = i64::from(parsed.days) * 86_400_000_000 + parsed.nanoseconds / 1000;
    if parsed.months != 0 || micros < 0 {
        return Err(invalid());
    }
    Ok(micros)
}

/// The delay of a stored `WATERMARK FOR ts AS <expr>` expression, µs: 0 for `ts`, the interval
/// for `ts - INTERVAL '...'`.
pub fn watermark_delay_micros(expr_sql: &str) -> Result<i64> {
    use datafusion::sql::sqlparser::{dialect::PostgreSqlDialect, parser::Parser};
    let expr = Parser::new(&PostgreSqlDialect {})
        .try_with_sql(expr_sql)
        .and_then(|mut p| p.parse_expr())
        .map_err(|e| Error::internal(format!("stored watermark expression {expr_sql}: {e}")))?;
    match &expr {
        ast::Expr::BinaryOp {
            op: ast::BinaryOperator::Minus,
            right,
            ..
        } => interval_micros(right),
        _ => Ok(0),
    }
}
