//! Operators whose PostgreSQL meaning DataFusion lacks or types differently, planned as SQL
//! is turned into expressions (when operand types are known and before result types are
//! fixed): `interval * number`, `interval / number`, `timestamp - timestamp` (an interval
//! with days), `date ± interval` (a timestamp), `date - date` (an integer), interval
//! comparisons by length, and `extract` (numeric).

use std::sync::Arc;

use arrow::datatypes::{DataType, TimeUnit};
use datafusion::common::{DFSchema, Result, ScalarValue};
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::planner::{
    ExprPlanner, PlannerResult, RawBinaryExpr, RawFieldAccessExpr,
};
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
    /// The functions standing for jsonb's operators ([`super::jsonb::operator`]).
    pub jsonb_operators: Vec<Arc<ScalarUDF>>,
}

fn is_list(t: &DataType) -> bool {
    matches!(
        t,
        DataType::List(_) | DataType::LargeList(_) | DataType::FixedSizeList(..)
    )
}

impl PgPlanner {
    /// A jsonb operator (`j -> 'a'`, `j @> '{...}'`, `j ? 'k'`) as its function; the right
    /// side of the path and key-list operators read as text[] (`'{a,1}'`). A jsonb-only
    /// operator on another type is 42883, as in PostgreSQL.
    fn jsonb_operator(
        &self,
        expr: RawBinaryExpr,
        schema: &DFSchema,
    ) -> Result<PlannerResult<RawBinaryExpr>> {
        let Some(function) = super::jsonb::operator(&expr.op) else {
            return Ok(PlannerResult::Original(expr));
        };
        let (Ok((_, left)), Ok((_, right))) =
            (expr.left.to_field(schema), expr.right.to_field(schema))
        else {
            return Ok(PlannerResult::Original(expr));
        };
        if !super::jsonb::is_json(&left) {
            if matches!(expr.op, BinaryOperator::AtArrow | BinaryOperator::ArrowAt) {
                return Ok(PlannerResult::Original(expr));
            }
            let name = |f: &arrow::datatypes::Field| crate::types::pg_type_name(f);
            return Err(super::udf::error(
                eddy_common::SqlState::UNDEFINED_FUNCTION,
                format!(
                    "operator does not exist: {} {} {}",
                    name(&left),
                    expr.op,
                    name(&right)
                ),
            ));
        }
        let Some(udf) = self.jsonb_operators.iter().find(|f| f.name() == function) else {
            return Ok(PlannerResult::Original(expr));
        };
        let right_expr = if super::jsonb::takes_path(function) && !is_list(right.data_type()) {
            cast(
                expr.right,
                &DataType::List(Arc::new(arrow::datatypes::Field::new_list_field(
                    DataType::Utf8,
                    true,
                ))),
            )
        } else {
            expr.right
        };
        Ok(PlannerResult::Planned(call(
            udf,
            vec![expr.left, right_expr],
        )))
    }
}

fn is_number(t: &DataType) -> bool {
    t.is_numeric() || t == &DataType::Null
}

fn call(udf: &Arc<ScalarUDF>, args: Vec<Expr>) -> Expr {
    Expr::ScalarFunction(ScalarFunction::new_udf(Arc::clone(udf), args))
}

fn float(e: Expr) -> Expr {
    Expr::Cast(datafusion::logical_expr::expr::Cast::new(
        Box::new(e),
        DataType::Float64,
    ))
}

fn timestamp_us(e: Expr, t: &DataType) -> Expr {
    let zone = match t {
        DataType::Timestamp(_, Some(_)) => Some(crate::types::UTC.into()),
        _ => None,
    };
    Expr::Cast(datafusion::logical_expr::expr::Cast::new(
        Box::new(e),
        DataType::Timestamp(TimeUnit::Microsecond, zone),
    ))
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
    matches!(
        op,
        BinaryOperator::Plus
            | BinaryOperator::Minus
            | BinaryOperator::Multiply
            | BinaryOperator::Divide
            | BinaryOperator::Modulo
    )
}

fn is_string_literal(e: &Expr) -> bool {
    matches!(
        e,
        Expr::Literal(
            ScalarValue::Utf8(Some(_))
                | ScalarValue::Utf8View(Some(_))
                | ScalarValue::LargeUtf8(Some(_)),
            _
        )
    )
}

fn cast(e: Expr, to: &DataType) -> Expr {
    Expr::Cast(datafusion::logical_expr::expr::Cast::new(
        Box::new(e),
        to.clone(),
    ))
}

/// PostgreSQL's typing of operands DataFusion would type otherwise: a quoted literal next to
/// a value of another type is of that type (`'t' = true`, `1 + 'a'` reads `'a'` as an
/// integer), and `real` with anything but `real` computes in double precision.
fn retype(expr: RawBinaryExpr, lt: &DataType, rt: &DataType) -> RawBinaryExpr {
    let RawBinaryExpr { op, left, right } = expr;
    let typed = |t: &DataType| {
        !matches!(
            t,
            DataType::Utf8 | DataType::Utf8View | DataType::LargeUtf8 | DataType::Null
        )
    };
    let takes_type = |t: &DataType| {
        comparison(&op).is_some() && typed(t) || is_arithmetic(&op) && t.is_numeric()
    };
    let (left, right) = if is_string_literal(&left) && takes_type(rt) {
        (cast(left, rt), right)
    } else if is_string_literal(&right) && takes_type(lt) {
        (left, cast(right, lt))
    } else if is_arithmetic(&op)
        && (lt == &DataType::Float32) != (rt == &DataType::Float32)
        && lt.is_numeric()
        && rt.is_numeric()
    {
        (
            cast(left, &DataType::Float64),
            cast(right, &DataType::Float64),
        )
    } else {
        (left, right)
    };
    RawBinaryExpr { op, left, right }
}

impl ExprPlanner for PgPlanner {
    fn plan_binary_op(
        &self,
        expr: RawBinaryExpr,
        schema: &DFSchema,
    ) -> Result<PlannerResult<RawBinaryExpr>> {
        if super::jsonb::operator(&expr.op).is_some() {
            return self.jsonb_operator(expr, schema);
        }
        if expr.op == BinaryOperator::PGOverlap
            && expr.left.get_type(schema).is_ok_and(|t| is_list(&t))
        {
            return Ok(PlannerResult::Planned(
                datafusion::functions_nested::expr_fn::array_has_any(expr.left, expr.right),
            ));
        }
        let (Ok(lt), Ok(rt)) = (expr.left.get_type(schema), expr.right.get_type(schema)) else {
            return Ok(PlannerResult::Original(expr));
        };
        // PostgreSQL has no % for floating point (DataFusion computes fmod).
        if expr.op == BinaryOperator::Modulo
            && (matches!(lt, DataType::Float32 | DataType::Float64)
                || matches!(rt, DataType::Float32 | DataType::Float64))
        {
            let name = |t: &DataType| {
                crate::types::pg_type_name(&arrow::datatypes::Field::new("", t.clone(), true))
            };
            return Err(super::udf::error(
                eddy_common::SqlState::UNDEFINED_FUNCTION,
                format!("operator does not exist: {} % {}", name(&lt), name(&rt)),
            ));
        }
        let expr = retype(expr, &lt, &rt);
        let (Ok(lt), Ok(rt)) = (expr.left.get_type(schema), expr.right.get_type(schema)) else {
            return Ok(PlannerResult::Original(expr));
        };
        let interval = |t: &DataType| matches!(t, DataType::Interval(_));
        let timestamp = |t: &DataType| matches!(t, DataType::Timestamp(..));
        let (left, right) = (expr.left.clone(), expr.right.clone());
        let planned = match (&expr.op, &lt, &rt) {
            (BinaryOperator::Multiply, l, r) if interval(l) && is_number(r) => {
                call(&self.interval_mul, vec![left, float(right)])
            }
            (BinaryOperator::Multiply, l, r) if is_number(l) && interval(r) => {
                call(&self.interval_mul, vec![right, float(left)])
            }
            (BinaryOperator::Divide, l, r) if interval(l) && is_number(r) => {
                call(&self.interval_div, vec![left, float(right)])
            }
            (BinaryOperator::Minus, l, r) if timestamp(l) && timestamp(r) => {
                // Both sides in one zone form (PostgreSQL would compare timestamptz to a
                // timestamp taken in the session zone; the instant difference is the same).
                let target = if matches!(l, DataType::Timestamp(_, Some(_)))
                    || matches!(r, DataType::Timestamp(_, Some(_)))
                {
                    &DataType::Timestamp(TimeUnit::Microsecond, Some(crate::types::UTC.into()))
                } else {
                    l
                };
                call(
                    &self.timestamp_diff,
                    vec![timestamp_us(left, target), timestamp_us(right, target)],
                )
            }
            (BinaryOperator::Plus | BinaryOperator::Minus, DataType::Date32, r) if interval(r) => {
                let op = if expr.op == BinaryOperator::Plus {
                    Operator::Plus
                } else {
                    Operator::Minus
                };
                binary_expr(
                    timestamp_us(left, &DataType::Timestamp(TimeUnit::Microsecond, None)),
                    op,
                    right,
                )
            }
            (BinaryOperator::Plus, l, DataType::Date32) if interval(l) => binary_expr(
                timestamp_us(right, &DataType::Timestamp(TimeUnit::Microsecond, None)),
                Operator::Plus,
                left,
            ),
            (BinaryOperator::Minus, DataType::Date32, DataType::Date32) => {
                call(&self.date_diff, vec![left, right])
            }
            (op, l, r) if interval(l) && interval(r) => match comparison(op) {
                Some(op) => binary_expr(
                    call(&self.interval_key, vec![left]),
                    op,
                    call(&self.interval_key, vec![right]),
                ),
                None => return Ok(PlannerResult::Original(expr)),
            },
            _ => return Ok(PlannerResult::Original(expr)),
        };
        Ok(PlannerResult::Planned(planned))
    }

    /// Subscripts as PostgreSQL reads them: `a[0]` and `a[-1]` are NULL (DataFusion counts
    /// negative ones from the end), and a slice's bounds are cut to the array's.
    fn plan_field_access(
        &self,
        expr: RawFieldAccessExpr,
        schema: &DFSchema,
    ) -> Result<PlannerResult<RawFieldAccessExpr>> {
        use datafusion::logical_expr::{GetFieldAccess, lit, when};
        if !expr.expr.get_type(schema).is_ok_and(|t| is_list(&t)) {
            return Ok(PlannerResult::Original(expr));
        }
        let field_access = match expr.field_access {
            GetFieldAccess::ListIndex { key } => GetFieldAccess::ListIndex {
                key: Box::new(when(key.as_ref().clone().gt_eq(lit(1i64)), *key).end()?),
            },
            GetFieldAccess::ListRange {
                start,
                stop,
                stride,
            } => GetFieldAccess::ListRange {
                start: Box::new(
                    when(start.as_ref().clone().lt(lit(1i64)), lit(1i64)).otherwise(*start)?,
                ),
                stop: Box::new(
                    when(stop.as_ref().clone().lt(lit(0i64)), lit(0i64)).otherwise(*stop)?,
                ),
                stride,
            },
            other => other,
        };
        Ok(PlannerResult::Original(RawFieldAccessExpr {
            field_access,
            expr: expr.expr,
        }))
    }

    fn plan_extract(&self, args: Vec<Expr>) -> Result<PlannerResult<Vec<Expr>>> {
        Ok(PlannerResult::Planned(call(&self.extract, args)))
    }
}
