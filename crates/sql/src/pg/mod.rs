//! PostgreSQL semantics on top of DataFusion: where DataFusion's functions, casts, literal
//! types, operators or text forms differ from PostgreSQL's, Eddy's own versions replace them.
//!
//! Entry points: [`session_state`] builds every session's DataFusion state with them (so
//! ad-hoc queries and materialized views evaluate the same functions), [`ast::rewrite`] runs
//! on each statement before planning, and [`text`] is the one place values become PostgreSQL
//! text (shared with the wire encoding). The layers, in the order a statement meets them:
//!
//! 1. [`ast`]: literal types, casts to types Arrow cannot name, interval literals;
//! 2. [`planner`]: operators planned with PostgreSQL's meaning (interval arithmetic, ...);
//! 3. [`rules::ExplicitCasts`] (before type coercion) and [`rules::CheckedArithmetic`]
//!    (after it): casts, overflow checks ([`arith`]), implicit conversions to text;
//! 4. the functions: [`cast`], [`interval`], [`datetime_fn`], [`to_char`],
//!    [`to_char_numeric`], [`to_timestamp`], [`math`], [`strings`], [`json`],
//!    [`aggregates`].

pub mod aggregates;
pub mod arith;
pub mod array;
pub mod assign;
pub mod ast;
pub mod cast;
pub mod datetime_fn;
pub mod datetime_in;
pub mod decimal;
pub mod interval;
pub mod json;
pub mod jsonb;
pub mod math;
pub mod names;
pub mod planner;
pub mod repeated_names;
pub mod rules;
pub mod strings;
pub mod sum;
pub mod template;
pub mod text;
pub mod to_char;
pub mod to_char_numeric;
pub mod to_timestamp;
pub mod udf;

use std::sync::Arc;

use datafusion::execution::FunctionRegistry;
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::context::SessionState;
use datafusion::logical_expr::ScalarUDF;
use datafusion::logical_expr::planner::ExprPlanner;
use datafusion::optimizer::{Analyzer, AnalyzerRule};
use datafusion::prelude::SessionConfig;
use eddy_common::{Error, Result};

pub use text::{TimeZone, parse_time_zone};

/// The SQL options PostgreSQL's reading of a statement needs: `1.5` is a numeric, not a
/// double; `text` is Arrow's `Utf8` (the type Eddy stores).
pub fn configure(config: SessionConfig) -> SessionConfig {
    config
        .set_bool("datafusion.sql_parser.parse_float_as_decimal", true)
        .set_bool("datafusion.sql_parser.map_string_types_to_utf8view", false)
}

fn find(functions: &[Arc<ScalarUDF>], name: &str) -> Result<Arc<ScalarUDF>> {
    functions
        .iter()
        .find(|f| f.name() == name)
        .cloned()
        .ok_or_else(|| Error::internal(format!("function {name} is not defined")))
}

/// A session state with DataFusion's defaults and Eddy's PostgreSQL layer.
pub fn session_state(config: SessionConfig) -> Result<SessionState> {
    let base = SessionStateBuilder::new()
        .with_config(configure(config))
        .with_default_features()
        .build();
    let mut functions: Vec<Arc<ScalarUDF>> = Vec::new();
    for group in [
        cast::functions(),
        interval::functions(),
        datetime_fn::functions(),
        to_char::functions(),
        to_timestamp::functions(),
        math::functions(),
        strings::functions(),
        json::functions(),
        jsonb::functions(),
        array::functions(),
    ] {
        functions.extend(group.into_iter().map(Arc::new));
    }
    let arithmetic = Arc::new(arith::arithmetic_functions(
        find(&functions, cast::OUTPUT_TEXT)?,
        find(&functions, cast::CAST)?,
    ));
    functions.extend(arithmetic.all());
    let pg_planner = planner::PgPlanner {
        interval_mul: find(&functions, interval::MUL)?,
        interval_div: find(&functions, interval::DIV)?,
        timestamp_diff: find(&functions, interval::TIMESTAMP_DIFF)?,
        interval_key: find(&functions, interval::COMPARISON_KEY)?,
        date_diff: find(&functions, datetime_fn::DATE_DIFF)?,
        extract: find(&functions, "extract")?,
        jsonb_operators: [
            jsonb::GET,
            jsonb::GET_TEXT,
            jsonb::PATH,
            jsonb::PATH_TEXT,
            jsonb::CONTAINS,
            jsonb::CONTAINED,
            jsonb::EXISTS,
            jsonb::EXISTS_ANY,
            jsonb::EXISTS_ALL,
        ]
        .iter()
        .map(|name| find(&functions, name))
        .collect::<Result<_>>()?,
    };
    let mut planners: Vec<Arc<dyn ExprPlanner>> = vec![Arc::new(pg_planner)];
    planners.extend(base.expr_planners().iter().cloned());
    let mut rules: Vec<Arc<dyn AnalyzerRule + Send + Sync>> =
        vec![Arc::new(rules::ExplicitCasts {
            cast: find(&functions, cast::CAST)?,
        })];
    rules.extend(Analyzer::new().rules);
    rules.push(Arc::new(rules::CheckedArithmetic {
        functions: arithmetic,
    }));
    let mut state = SessionStateBuilder::new_from_existing(base)
        .with_expr_planners(planners)
        .with_analyzer_rules(rules)
        .build();
    for f in functions {
        // Replacing DataFusion's function of the same name (to_char, round, ...) is the point.
        state
            .register_udf(f)
            .map_err(crate::error::from_datafusion)?;
    }
    for f in aggregates::functions().into_iter().chain([sum::function()]) {
        state
            .register_udaf(f)
            .map_err(crate::error::from_datafusion)?;
    }
    Ok(state)
}
