//! Analyzer rules that give plans PostgreSQL's semantics.
//!
//! [`ExplicitCasts`] runs before DataFusion's type coercion, so the casts it sees are the ones
//! the query wrote (`x::int`, `'1 day'::interval`, and the casts INSERT adds to fit a column):
//! they become `eddy_cast` calls ([`super::cast`]). [`CheckedArithmetic`] runs after it, when
//! both sides of every operator have one type: operators become the checked functions of
//! [`super::arith`], the casts coercion inserted read text with PostgreSQL's input syntax, and
//! the conversions to text it inserted print PostgreSQL's output forms. Rewritten expressions
//! keep their names, so references to them by name still resolve.

use std::sync::Arc;

use arrow::datatypes::DataType;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{DFSchema, Result};
use datafusion::logical_expr::expr::{Cast, ScalarFunction};
use datafusion::logical_expr::expr_rewriter::NamePreserver;
use datafusion::logical_expr::utils::merge_schema;
use datafusion::logical_expr::{BinaryExpr, Expr, ExprSchemable, LogicalPlan, Operator, ScalarUDF};
use datafusion::optimizer::AnalyzerRule;

use super::arith::ArithmeticFunctions;
use super::cast;
use crate::types::PG_TYPE_KEY;

/// Rewrites every expression of every node (subqueries included) with `f`, which is given
/// the schema the node's expressions are evaluated against; recomputes the schemas of the
/// nodes it changed (a rewritten expression may be typed more precisely).
fn rewrite_plan(
    plan: LogicalPlan,
    f: &dyn Fn(Expr, &DFSchema) -> Result<Transformed<Expr>>,
) -> Result<LogicalPlan> {
    plan.transform_up_with_subqueries(|node| {
        let mut schema = merge_schema(&node.inputs());
        if let LogicalPlan::TableScan(scan) = &node {
            schema.merge(&DFSchema::try_from_qualified_schema(
                scan.table_name.clone(),
                &scan.source.schema(),
            )?);
        }
        let names = NamePreserver::new(&node);
        let rewritten = node.map_expressions(|expr| {
            let name = names.save(&expr);
            expr.transform_up(|e| f(e, &schema))
                .map(|t| t.update_data(|e| name.restore(e)))
        })?;
        if rewritten.transformed {
            rewritten.map_data(|p| p.recompute_schema())
        } else {
            Ok(rewritten)
        }
    })
    .map(|t| t.data)
}

fn is_text(t: &DataType) -> bool {
    matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View)
}

#[derive(Debug)]
pub struct ExplicitCasts {
    pub cast: Arc<ScalarUDF>,
}

impl AnalyzerRule for ExplicitCasts {
    fn name(&self) -> &str {
        "eddy_explicit_casts"
    }

    fn analyze(&self, plan: LogicalPlan, _config: &ConfigOptions) -> Result<LogicalPlan> {
        rewrite_plan(plan, &|expr, schema| {
            let Expr::Cast(Cast { expr: inner, field }) = &expr else {
                return Ok(Transformed::no(expr));
            };
            let Ok(from) = inner.to_field(schema).map(|(_, f)| f) else {
                return Ok(Transformed::no(expr));
            };
            // `j::text` of a jsonb (or varchar(n), char(n)) value is plain text: a new value
            // without the source's PostgreSQL type.
            if is_text(field.data_type())
                && is_text(from.data_type())
                && from.metadata().contains_key(PG_TYPE_KEY)
            {
                return Ok(Transformed::yes(self.cast.call(vec![
                    inner.as_ref().clone(),
                    datafusion::logical_expr::lit(field.data_type().to_string()),
                ])));
            }
            match cast::explicit(
                &self.cast,
                inner.as_ref().clone(),
                from.data_type(),
                field.data_type(),
            ) {
                Some(rewritten) => Ok(Transformed::yes(rewritten)),
                None => Ok(Transformed::no(expr)),
            }
        })
    }
}

#[derive(Debug)]
pub struct CheckedArithmetic {
    pub functions: Arc<ArithmeticFunctions>,
}

fn is_integer(t: &DataType) -> bool {
    matches!(t, DataType::Int16 | DataType::Int32 | DataType::Int64)
}

fn is_float(t: &DataType) -> bool {
    matches!(t, DataType::Float32 | DataType::Float64)
}

fn call(udf: &Arc<ScalarUDF>, args: Vec<Expr>) -> Result<Transformed<Expr>> {
    Ok(Transformed::yes(Expr::ScalarFunction(
        ScalarFunction::new_udf(Arc::clone(udf), args),
    )))
}

impl CheckedArithmetic {
    /// A cast coercion inserted: to text it prints the output form; from text it reads
    /// PostgreSQL's input syntax, as an explicit cast does.
    fn implicit_cast(
        &self,
        expr: Expr,
        inner: &Expr,
        to: &DataType,
        schema: &DFSchema,
    ) -> Result<Transformed<Expr>> {
        let f = &self.functions;
        let Ok(from) = inner.get_type(schema) else {
            return Ok(Transformed::no(expr));
        };
        if is_text(to) {
            return match cast::output_text(&f.output_text, inner.clone(), &from) {
                Some(text) if to == &DataType::Utf8 => Ok(Transformed::yes(text)),
                Some(text) => Ok(Transformed::yes(text.cast_to(to, schema)?)),
                None => Ok(Transformed::no(expr)),
            };
        }
        if is_text(&from)
            && let Some(parse) = cast::explicit(&f.cast, inner.clone(), &from, to)
        {
            return Ok(Transformed::yes(parse));
        }
        Ok(Transformed::no(expr))
    }

    fn binary(&self, expr: Expr, schema: &DFSchema) -> Result<Transformed<Expr>> {
        let f = &self.functions;
        let Expr::BinaryExpr(BinaryExpr { left, op, right }) = &expr else {
            return Ok(Transformed::no(expr));
        };
        // `'a' || true` casts the boolean as `::text` does (`atrue`), not as output (`t`).
        if *op == Operator::StringConcat {
            let explicit = |e: &Expr| match e {
                Expr::ScalarFunction(s) if s.func.name() == cast::OUTPUT_TEXT => {
                    Some(f.cast.call(vec![
                        s.args[0].clone(),
                        datafusion::logical_expr::lit(DataType::Utf8.to_string()),
                    ]))
                }
                _ => None,
            };
            return match (explicit(left), explicit(right)) {
                (None, None) => Ok(Transformed::no(expr)),
                (l, r) => Ok(Transformed::yes(Expr::BinaryExpr(BinaryExpr::new(
                    Box::new(l.unwrap_or_else(|| left.as_ref().clone())),
                    *op,
                    Box::new(r.unwrap_or_else(|| right.as_ref().clone())),
                )))),
            };
        }
        let (Ok(lt), Ok(rt)) = (left.get_type(schema), right.get_type(schema)) else {
            return Ok(Transformed::no(expr));
        };
        let args = vec![left.as_ref().clone(), right.as_ref().clone()];
        match op {
            Operator::Divide
                if matches!(
                    (&lt, &rt),
                    (DataType::Decimal128(..), DataType::Decimal128(..))
                ) =>
            {
                call(&f.numeric_divide, args)
            }
            _ if lt != rt => Ok(Transformed::no(expr)),
            Operator::Plus | Operator::Minus | Operator::Multiply if is_integer(&lt) => {
                call(&f.int[op_index(*op)], args)
            }
            Operator::Plus | Operator::Minus | Operator::Multiply | Operator::Divide
                if is_float(&lt) =>
            {
                call(&f.float[op_index(*op)], args)
            }
            _ => Ok(Transformed::no(expr)),
        }
    }
}

impl AnalyzerRule for CheckedArithmetic {
    fn name(&self) -> &str {
        "eddy_checked_arithmetic"
    }

    fn analyze(&self, plan: LogicalPlan, _config: &ConfigOptions) -> Result<LogicalPlan> {
        rewrite_plan(plan, &|expr, schema| match &expr {
            Expr::Cast(Cast { expr: inner, field }) => {
                let (inner, to) = (inner.as_ref().clone(), field.data_type().clone());
                self.implicit_cast(expr, &inner, &to, schema)
            }
            Expr::BinaryExpr(_) => self.binary(expr, schema),
            Expr::Negative(inner) if inner.get_type(schema).is_ok_and(|t| is_integer(&t)) => {
                call(&self.functions.negate, vec![inner.as_ref().clone()])
            }
            _ => Ok(Transformed::no(expr)),
        })
    }
}

fn op_index(op: Operator) -> usize {
    match op {
        Operator::Plus => 0,
        Operator::Minus => 1,
        Operator::Multiply => 2,
        _ => 3,
    }
}
