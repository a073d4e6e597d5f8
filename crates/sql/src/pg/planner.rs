//! Operators whose PostgreSQL meaning DataFusion lacks or types differently, planned as SQL
//! is turned into expressions (when operand types are known and before result types are
//! fixed): `interval * number`, `interval / number`, `timestamp - timestamp` (an interval
//! with days), `date ± interval` (a timestamp), `date - date` (an integer), interval
//! comparisons by length, and `extract` (numeric).

use std::sync::Arc;

use arrow::datatypes::{DataType, TimeUnit};
use datafusion::common::{DFSchema, Result, ScalarValue};
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::planner::{ExprPlanner, PlannerResult, RawBinaryExpr};
use datafusion::logical_expr::{Expr, ExprSchemable, Operator, ScalarUDF, binary_expr};
use datafusion::sql::sqlparser::ast::BinaryOperator;

#[derive(Debug)]
pub struct PgPlanner {
    pub interval_mul: Arc<ScalarUDF>,
    pub interval_div: Arc<ScalarUDF>,
    pub timestamp_diff: Arc<ScalarUDF>,
    pub interval_key: Arc<ScalarUDF>,
    pub date_diff: Arc<ScalarUDF>,
    pub extract: Arc<ScalarUDF>,
}

fn is_number(t: &DataType) -> bool {
    t.is_numeric() || t == &DataType::Null
}

fn call(udf: &Arc<ScalarUDF>, args: Vec<Expr>) -> Expr {
    Expr::ScalarFunction(ScalarFunction::new_udf(Arc::clone(udf), args))
}

fn float(e: Expr) -> Expr {
    Expr::Cast(datafusion::logical_expr::expr::Cast::new(Box::new(e), DataType::Float64))
}

fn timestamp_us(e: Expr, t: &DataType) -> Expr {
    let zone = match t {
        DataType::Timestamp(_, Some(_)) => Some(crate::types::UTC.into()),
        _ => None,
    };
    Expr::Cast(datafusion::logical_expr::expr::Cast::new(Box::new(e), DataType::Timestamp(TimeUnit::Microsecond, zone)))
}

fn comparison(op: &BinaryOperator) -> Option<Operator> {
    Some(match op {
        BinaryOperator::Eq => Operator::Eq,
        BinaryOperator::NotEq => Operator::NotEq,
        BinaryOperator::Lt => Operator::Lt,
        BinaryOperator::LtEq => Operator::LtEq,
        BinaryOperator::Gt => Operator::Gt,
        BinaryOperator::GtEq => Operator::GtEq,
        _ => return None,
    })
}

fn is_arithmetic(op: &BinaryOperator) -> bool {
    matches!(op, BinaryOperator::Plus | BinaryOperator::Minus | BinaryOperator::Multiply | BinaryOperator::Divide | BinaryOperator::Modulo)
}

fn is_string_literal(e: &Expr) -> bool {
    matches!(e, Expr::Literal(ScalarValue::Utf8(Some(_)) | ScalarValue::Utf8View(Some(_)) | ScalarValue::LargeUtf8(Some(_)), _))
}

fn cast(e: Expr, to: &DataType) -> Expr {
    Expr::Cast(datafusion::logical_expr::expr::Cast::new(Box::new(e), to.clone()))
}

/// PostgreSQL's typing of operands DataFusion would type otherwise: a quoted literal next to
/// a value of another type is of that type (`'t' = true`, `1 + 'a'` reads `'a'` as an
/// integer), and `real` with anything but `real` computes in double precision.
fn retype(expr: RawBinaryExpr, lt: &DataType, rt: &DataType) -> RawBinaryExpr {
    let RawBinaryExpr { op, left, right } = expr;
    let typed = |t: &DataType| !matches!(t, DataType::Utf8 | DataType::Utf8View | DataType::LargeUtf8 | DataType::Null);
    let takes_type = |t: &DataType| comparison(&op).is_some() && typed(t) || is_arithmetic(&op) && t.is_numeric();
    let (left, right) = if is_string_literal(&left) && takes_type(rt) {
        (cast(left, rt), right)
    } else if is_string_literal(&right) && takes_type(lt) {
        (left, cast(right, lt))
    } else if is_arithmetic(&op) && (lt == &DataType::Float32) != (rt == &DataType::Float32) && lt.is_numeric() && rt.is_numeric() {
        (cast(left, &DataType::Float64), cast(right, &DataType::Float64))
    } else {
        (left, right)
    };
    RawBinaryExpr { op, left, right }
}

impl ExprPlanner for PgPlanner {
    fn plan_binary_op(&self, expr: RawBinaryExpr, schema: &DFSchema) -> Result<PlannerResult<RawBinaryExpr>> {
        let (Ok(lt), Ok(rt)) = (expr.left.get_type(schema), expr.right.get_type(schema)) else {
            return Ok(PlannerResult::Original(expr));
        };
        // PostgreSQL has no % for floating point (DataFusion computes fmod).
        if expr.op == BinaryOperator::Modulo && (matches!(lt, DataType::Float32 | DataType::Float64) || matches!(rt, DataType::Float32 | DataType::Float64)) {
            let name = |t: &DataType| crate::types::pg_type_name(&arrow::datatypes::Field::new("", t.clone(), true));
            return Err(super::udf::error(eddy_common::SqlState::UNDEFINED_FUNCTION, format!("operator does not exist: {} % {}", name(&lt), name(&rt))));
        }
        let expr = retype(expr, &lt, &rt);
        let (Ok(lt), Ok(rt)) = (expr.left.get_type(schema), expr.right.get_type(schema)) else {
            return Ok(PlannerResult::Original(expr));
        };
        let interval = |t: &DataType| matches!(t, DataType::Interval(_));
        let timestamp = |t: &DataType| matches!(t, DataType::Timestamp(..));
        let (left, right) = (expr.left.clone(), expr.right.clone());
        let planned = match (&expr.op, &lt, &rt) {
            (BinaryOperator::Multiply, l, r) if interval(l) && is_number(r) => call(&self.interval_mul, vec![left, float(right)]),
            (BinaryOperator::Multiply, l, r) if is_number(l) && interval(r) => call(&self.interval_mul, vec![right, float(left)]),
            (BinaryOperator::Divide, l, r) if interval(l) && is_number(r) => call(&self.interval_div, vec![left, float(right)]),
            (BinaryOperator::Minus, l, r) if timestamp(l) && timestamp(r) => {
                // Both sides in one zone form (PostgreSQL would compare timestamptz to a
                // timestamp taken in the session zone; the instant difference is the same).
                let target = if matches!(l, DataType::Timestamp(_, Some(_))) || matches!(r, DataType::Timestamp(_, Some(_))) { &DataType::Timestamp(TimeUnit::Microsecond, Some(crate::types::UTC.into())) } else { l };
                call(&self.timestamp_diff, vec![timestamp_us(left, target), timestamp_us(right, target)])
            }
            (BinaryOperator::Plus | BinaryOperator::Minus, DataType::Date32, r) if interval(r) => {
                let op = if expr.op == BinaryOperator::Plus { Operator::Plus } else { Operator::Minus };
                binary_expr(timestamp_us(left, &DataType::Timestamp(TimeUnit::Microsecond, None)), op, right)
            }
            (BinaryOperator::Plus, l, DataType::Date32) if interval(l) => {
                binary_expr(timestamp_us(right, &DataType::Timestamp(TimeUnit::Microsecond, None)), Operator::Plus, left)
            }
            (BinaryOperator::Minus, DataType::Date32, DataType::Date32) => call(&self.date_diff, vec![left, right]),
            (op, l, r) if interval(l) && interval(r) => match comparison(op) {
                Some(op) => binary_expr(call(&self.interval_key, vec![left]), op, call(&self.interval_key, vec![right])),
                None => return Ok(PlannerResult::Original(expr)),
            },
            _ => return Ok(PlannerResult::Original(expr)),
        };
        Ok(PlannerResult::Planned(planned))
    }

    fn plan_extract(&self, args: Vec<Expr>) -> Result<PlannerResult<Vec<Expr>>> {
        Ok(PlannerResult::Planned(call(&self.extract, args)))
    }
}
