//! Lowering an optimized DataFusion logical plan to the dataflow plan IR.
//!
//! Every construct the dataflow cannot maintain incrementally yet is refused with 0A000 naming
//! it — never run wrongly.

use std::sync::Arc;

use arrow::datatypes::{Field, Schema, SchemaRef};
use datafusion::common::{DFSchema, NullEquality};
use datafusion::datasource::source_as_provider;
use datafusion::execution::context::ExecutionProps;
use datafusion::execution::context::SessionState;
use datafusion::logical_expr::{Expr, FetchType, JoinType, LogicalPlan, SkipType};
// TODO(#6): move to LoweredAggregateBuilder, DataFusion 55's replacement of this helper.
use datafusion::logical_expr::Operator;
#[allow(deprecated)]
use datafusion::physical_planner::create_aggregate_expr_and_maybe_filter;
use eddy_common::{Error, Result};
use eddy_dataflow::plan::{
    AggregateCall, JoinKind, Lateness, Node, Ranking, TimeBound, WindowClose,
};

use crate::windows::WindowBound;

use crate::catalog::TableBridge;
use crate::error::from_datafusion;
use crate::planner::pg_column_name;

/// A schema with every field nullable (retractions and outer values may carry NULLs).
pub fn nullable(schema: &Schema) -> SchemaRef {
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|f| f.as_ref().clone().with_nullable(true))
        .collect();
    Arc::new(Schema::new(fields))
}

/// The output schema of a view: PostgreSQL-style names, nullable fields.
pub fn view_schema(plan: &LogicalPlan) -> SchemaRef {
    let schema = plan.schema().as_arrow();
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|f| {
            f.as_ref()
                .clone()
                .with_name(pg_column_name(f.name()))
                .with_nullable(true)
        })
        .collect();
    Arc::new(Schema::new(fields))
}

#[path = "lower_time.rs"]
mod time;
#[path = "lower_topn.rs"]
mod topn;
pub use time::release_time;
use time::*;

pub struct Lowering<'a> {
    pub state: &'a SessionState,
    pub options: &'a ViewOptions,
    /// Relations referenced `FOR SYSTEM_TIME AS OF PROCTIME()` (by alias).
    pub temporal: &'a [String],
    /// Set once a windowed aggregate was lowered (EMIT ON WINDOW CLOSE needs one).
    pub windowed: std::cell::Cell<bool>,
    /// Set once a session aggregate was lowered (SESSION placeholders need one).
    pub sessions: std::cell::Cell<bool>,
}

/// A view's options: `WITH (late_events, allowed_lateness, unbounded_joins, max_state_rows)`
/// and `EMIT ON WINDOW CLOSE`.
#[derive(Debug, Clone, Copy, Default)]
pub struct ViewOptions {
    pub lateness: Lateness,
    pub emit_on_close: bool,
    /// `unbounded_joins = 'allow'`: a join of two streams without a time bound keeps every
    /// row of both (its state grows with the streams), as asked.
    pub unbounded_joins: bool,
    /// `max_state_rows = n`: past `n` rows of state in any one operator the view fails with
    /// 54000 (`None`: the server's `--max-state-rows`).
    pub max_state_rows: Option<u64>,
}

/// Whether `expr` still holds a subquery (one the optimizer could not turn into a join).
fn mentions_subquery(expr: &Expr) -> bool {
    use datafusion::common::tree_node::TreeNode;
    expr.exists(|e| {
        Ok(matches!(
            e,
            Expr::ScalarSubquery(_) | Expr::InSubquery(_) | Expr::Exists(_)
        ))
    })
    .unwrap_or(false)
}

/// True when `plan` only ever inserts rows: a stream ([`is_stream`]), or an inner join of two
/// such inputs (ΔL⋈R + L'⋈ΔR of inserts is inserts; bounded joins forget rows without
/// retracting output). Aggregates and top-N over it keep the cheaper insert-only state.
fn is_append_only(plan: &LogicalPlan) -> bool {
    inserts_only(plan, true)
}

/// True when every table `plan` reads is an append-only table and nothing between turns it
/// into an updating relation (a stream, as far as joins are concerned).
fn is_stream(plan: &LogicalPlan) -> bool {
    inserts_only(plan, false)
}

fn inserts_only(plan: &LogicalPlan, through_joins: bool) -> bool {
    match plan {
        LogicalPlan::Projection(p) => inserts_only(&p.input, through_joins),
        LogicalPlan::Filter(f) => inserts_only(&f.input, through_joins),
        LogicalPlan::SubqueryAlias(a) => inserts_only(&a.input, through_joins),
        LogicalPlan::Union(u) => u.inputs.iter().all(|i| inserts_only(i, through_joins)),
        LogicalPlan::Join(j) if through_joins && j.join_type == JoinType::Inner => {
            inserts_only(&j.left, true) && inserts_only(&j.right, true)
        }
        LogicalPlan::TableScan(scan) => source_as_provider(&scan.source)
            .ok()
            .and_then(|p| {
                let any: &dyn std::any::Any = p.as_ref();
                any.downcast_ref::<TableBridge>()
                    .map(|b| b.source.append_only())
            })
            .unwrap_or(false),
        _ => false,
    }
}

impl Lowering<'_> {
    fn expr(&self, expr: &Expr, schema: &DFSchema) -> Result<eddy_dataflow::plan::Expr> {
        if mentions_now(expr) {
            return Err(Error::unsupported(
                "now() in a materialized view is supported only in WHERE, compared with a column, e.g. ts > now() - INTERVAL '1 hour'",
            ));
        }
        if mentions_subquery(expr) {
            return Err(Error::unsupported(
                "a subquery that is not correlated with the outer row (e.g. WHERE v > (SELECT max(v) FROM t)) is not supported in a materialized view yet",
            ));
        }
        self.state
            .create_physical_expr(expr.clone(), schema)
            .map_err(from_datafusion)
    }

    /// A filter whose conjuncts compare row values with `now()`: a temporal filter for those,
    /// an ordinary filter for the rest.
    pub fn lower(&self, plan: &LogicalPlan) -> Result<Node> {
        match plan {
            LogicalPlan::Projection(p) => {
                let mut input = self.lower(&p.input)?;
                // Window bounds over a watermarked stream: late rows are judged right here,
                // where each row's event time and window are known.
                if let Some((bound, args, _)) = p.expr.iter().find_map(window_bound)
                    && !bound.is_session()
                    && let Some(sources) = watermark_sources(&args[0], &p.input)
                {
                    let end_name =
                        if matches!(bound, WindowBound::TumbleStart | WindowBound::TumbleEnd) {
                            "tumble_end"
                        } else {
                            "hop_end"
                        };
                    let end_udf = self
                        .state
                        .scalar_functions()
                        .get(end_name)
                        .cloned()
                        .ok_or_else(|| Error::internal("window functions not registered"))?;
                    let end = Expr::ScalarFunction(
                        datafusion::logical_expr::expr::ScalarFunction::new_udf(
                            end_udf,
                            args.to_vec(),
                        ),
                    );
                    input = Node::LateFilter {
                        input: Box::new(input),
                        end: self.expr(&end, p.input.schema())?,
                        time: self.expr(&args[0], p.input.schema())?,
                        sources,
                        lateness: self.options.lateness,
                    };
                }
                let exprs = p
                    .expr
                    .iter()
                    .map(|e| self.expr(e, p.input.schema()))
                    .collect::<Result<_>>()?;
                Ok(Node::Project {
                    input: Box::new(input),
                    exprs,
                    schema: nullable(p.schema.as_arrow()),
                })
            }
            LogicalPlan::Filter(f) => {
                if let Some(top) = self.ranked_top_n(f)? {
                    return Ok(top);
                }
                let input = self.lower(&f.input)?;
                if mentions_now(&f.predicate) {
                    return self.temporal_filter(f, input);
                }
                let predicate = self.expr(&f.predicate, f.input.schema())?;
                Ok(Node::Filter {
                    input: Box::new(input),
                    predicate,
                })
            }
            LogicalPlan::SubqueryAlias(a) => self.lower(&a.input),
            LogicalPlan::TableScan(scan) => {
                // Filters pushed into the scan are only hints (`TableBridge` takes them
                // `Inexact`): the Filter above still applies them, so they are not lowered.
                if scan.fetch.is_some() {
                    return Err(Error::internal("table scan with a pushed-down limit"));
                }
                let provider = source_as_provider(&scan.source).map_err(from_datafusion)?;
                let any: &dyn std::any::Any = provider.as_ref();
                let bridge = any.downcast_ref::<TableBridge>().ok_or_else(|| {
                    Error::unsupported(format!(
                        "{} cannot be read by a materialized view",
                        scan.table_name
                    ))
                })?;
                let schema = nullable(&bridge.source.schema());
                let source = Node::Source {
                    object: bridge.source.object_id(),
                    name: scan.table_name.table().to_owned(),
                    schema: schema.clone(),
                };
                match &scan.projection {
                    None => Ok(source),
                    Some(columns) => {
                        let exprs = columns
                            .iter()
                            .map(|&i| {
                                let field = schema.field(i);
                                Ok(
                                    Arc::new(datafusion::physical_expr::expressions::Column::new(
                                        field.name(),
                                        i,
                                    ))
                                        as eddy_dataflow::plan::Expr,
                                )
                            })
                            .collect::<Result<Vec<_>>>()?;
                        Ok(Node::Project {
                            input: Box::new(source),
                            exprs,
                            schema: nullable(scan.projected_schema.as_arrow()),
                        })
                    }
                }
            }
            LogicalPlan::Aggregate(agg) => {
                if agg
                    .group_expr
                    .iter()
                    .any(|e| matches!(e, Expr::GroupingSet(_)))
                {
                    return Err(Error::unsupported(
                        "GROUPING SETS, CUBE and ROLLUP in a materialized view are not supported yet",
                    ));
                }
                let input = self.lower(&agg.input)?;
                let group = agg
                    .group_expr
                    .iter()
                    .map(|e| self.expr(e, agg.input.schema()))
                    .collect::<Result<Vec<_>>>()?;
                let physical_input = agg.input.schema().as_arrow().clone();
                let props = ExecutionProps::new();
                let mut aggregates = Vec::with_capacity(agg.aggr_expr.len());
                #[allow(deprecated)]
                for e in &agg.aggr_expr {
                    let (function, filter, _order) = create_aggregate_expr_and_maybe_filter(
                        e,
                        agg.input.schema(),
                        &physical_input,
                        &props,
                    )
                    .map_err(from_datafusion)?;
                    aggregates.push(AggregateCall { function, filter });
                }
                if let Some(session) = self.session_aggregate(agg, &input, &group, &aggregates)? {
                    return Ok(session);
                }
                let window = self.window_close(agg)?;
                let append_only = is_append_only(&agg.input);
                Ok(Node::Aggregate {
                    input: Box::new(input),
                    group,
                    aggregates,
                    window,
                    append_only,
                    schema: nullable(agg.schema.as_arrow()),
                })
            }
            LogicalPlan::Distinct(datafusion::logical_expr::Distinct::All(input)) => {
                let lowered = self.lower(input)?;
                let group = (0..input.schema().fields().len())
                    .map(|i| {
                        let f = input.schema().field(i);
                        Arc::new(datafusion::physical_expr::expressions::Column::new(
                            f.name(),
                            i,
                        )) as eddy_dataflow::plan::Expr
                    })
                    .collect();
                Ok(Node::Aggregate {
                    input: Box::new(lowered),
                    group,
                    aggregates: Vec::new(),
                    window: None,
                    append_only: false,
                    schema: nullable(input.schema().as_arrow()),
                })
            }
            LogicalPlan::Join(join) => {
                let kind = match join.join_type {
                    JoinType::Inner => JoinKind::Inner,
                    JoinType::Left => JoinKind::Left,
                    JoinType::Right => JoinKind::Right,
                    JoinType::Full => JoinKind::Full,
                    JoinType::LeftSemi => JoinKind::LeftSemi,
                    JoinType::LeftAnti => JoinKind::LeftAnti,
                    JoinType::RightSemi => JoinKind::RightSemi,
                    JoinType::RightAnti => JoinKind::RightAnti,
                    other => {
                        return Err(Error::unsupported(format!(
                            "{other} join in a materialized view is not supported yet"
                        )));
                    }
                };
                if join.null_aware {
                    return Err(Error::unsupported(
                        "NOT IN (subquery) in a materialized view is not supported yet: use NOT EXISTS",
                    ));
                }
                if join.on.is_empty() {
                    return Err(Error::unsupported(
                        "a join without an equality condition (cross join) in a materialized view is not supported",
                    ));
                }
                let lookup = self.is_temporal(&join.right);
                if self.is_temporal(&join.left) {
                    return Err(Error::unsupported(
                        "FOR SYSTEM_TIME AS OF PROCTIME() applies to the right side of a join: put the table after JOIN",
                    ));
                }
                if lookup && !matches!(kind, JoinKind::Inner | JoinKind::Left) {
                    return Err(Error::unsupported(
                        "a join with a table FOR SYSTEM_TIME AS OF PROCTIME() must be an inner or left join",
                    ));
                }
                let bounds = if lookup {
                    None
                } else {
                    self.join_bounds(join)?
                };
                if !lookup
                    && is_stream(&join.left)
                    && is_stream(&join.right)
                    && !(bounds.is_none() && self.options.unbounded_joins)
                {
                    if bounds.is_none() {
                        return Err(Error::unsupported(
                            "a join of two append-only streams must be bounded in time, or its state grows forever: join TUMBLE(a, ts, ...) with TUMBLE(b, ts, ...) on window_start or window_end (and keys), or add a condition such as a.ts BETWEEN b.ts - INTERVAL '10 minutes' AND b.ts + INTERVAL '10 minutes' over the streams' watermark columns (or accept the growing state: CREATE MATERIALIZED VIEW ... WITH (unbounded_joins = 'allow'))",
                        ));
                    }
                    let window_join = bounds.as_ref().is_some_and(|[l, _]| l.range.is_none());
                    if kind != JoinKind::Inner && !window_join {
                        return Err(Error::unsupported(format!(
                            "{kind:?} interval joins of two streams are not supported yet: use an inner join, or a window join (TUMBLE/HOP on both sides, joined on the window bounds)"
                        )));
                    }
                }
                // Window bounds make keys expire; interval bounds apply to inner joins only.
                let bounds = match bounds {
                    Some(b) if kind == JoinKind::Inner || b[0].range.is_none() => Some(Box::new(b)),
                    _ => None,
                };
                let left = self.lower(&join.left)?;
                let right = self.lower(&join.right)?;
                let left_keys = join
                    .on
                    .iter()
                    .map(|(l, _)| self.expr(l, join.left.schema()))
                    .collect::<Result<_>>()?;
                let right_keys = join
                    .on
                    .iter()
                    .map(|(_, r)| self.expr(r, join.right.schema()))
                    .collect::<Result<_>>()?;
                // The residual filter sees both sides' columns, also for semi and anti joins
                // (whose output has one side only).
                let both = join
                    .left
                    .schema()
                    .join(join.right.schema())
                    .map_err(from_datafusion)?;
                let filter = join
                    .filter
                    .as_ref()
                    .map(|f| self.expr(f, &both))
                    .transpose()?;
                Ok(Node::Join {
                    kind,
                    left: Box::new(left),
                    right: Box::new(right),
                    left_keys,
                    right_keys,
                    filter,
                    nulls_equal: join.null_equality == NullEquality::NullEqualsNull,
                    bounds,
                    lookup,
                    schema: nullable(join.schema.as_arrow()),
                })
            }
            LogicalPlan::Union(union) => {
                let inputs = union
                    .inputs
                    .iter()
                    .map(|i| self.lower(i))
                    .collect::<Result<_>>()?;
                Ok(Node::Union {
                    inputs,
                    schema: nullable(union.schema.as_arrow()),
                })
            }
            // ORDER BY without LIMIT does not change a view's contents (rows have no order).
            LogicalPlan::Sort(sort) if sort.fetch.is_none() => self.lower(&sort.input),
            LogicalPlan::Sort(sort) => self.top_n(sort, 0, sort.fetch.unwrap_or(usize::MAX)),
            LogicalPlan::Limit(limit) => {
                let skip = match limit.get_skip_type().map_err(from_datafusion)? {
                    SkipType::Literal(n) => n,
                    SkipType::UnsupportedExpr => {
                        return Err(Error::unsupported(
                            "OFFSET must be a constant in a materialized view",
                        ));
                    }
                };
                let fetch = match limit.get_fetch_type().map_err(from_datafusion)? {
                    FetchType::Literal(n) => n.unwrap_or(usize::MAX),
                    FetchType::UnsupportedExpr => {
                        return Err(Error::unsupported(
                            "LIMIT must be a constant in a materialized view",
                        ));
                    }
                };
                match limit.input.as_ref() {
                    LogicalPlan::Sort(sort) => self.top_n(
                        sort,
                        skip,
                        fetch.min(sort.fetch.map_or(usize::MAX, |f| f.saturating_sub(skip))),
                    ),
                    _ => Err(Error::unsupported(
                        "LIMIT without ORDER BY in a materialized view picks arbitrary rows; add an ORDER BY",
                    )),
                }
            }
            LogicalPlan::Window(_) => Err(Error::unsupported(
                "window functions in a materialized view are not supported yet, except ROW_NUMBER() OVER (PARTITION BY ... ORDER BY ...) filtered by <= n",
            )),
            LogicalPlan::EmptyRelation(_) | LogicalPlan::Values(_) => Err(Error::unsupported(
                "a materialized view must read at least one table or view",
            )),
            other => Err(Error::unsupported(format!(
                "{} in a materialized view is not supported yet",
                other.display()
            ))),
        }
    }
}
