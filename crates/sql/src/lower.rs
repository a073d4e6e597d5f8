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

impl Lowering<'_> {
    /// How a GROUP BY closes its windows: a group key that is a window bound over a
    /// watermarked stream (traced through the input's projections).
    fn window_close(
        &self,
        agg: &datafusion::logical_expr::Aggregate,
    ) -> Result<Option<WindowClose>> {
        for (key, group_expr) in agg.group_expr.iter().enumerate() {
            let Some((bound, args, sources)) = self.trace_bound(group_expr, &agg.input) else {
                continue;
            };
            if bound.is_session() {
                continue;
            }
            let to_end_micros = if bound.is_end() {
                0
            } else {
                // window_start: the size is the 2nd argument of tumble_*, the 3rd of hop_*.
                let size = if matches!(bound, WindowBound::TumbleStart) {
                    &args[1]
                } else {
                    &args[2]
                };
                match size {
                    Expr::Literal(
                        datafusion::common::ScalarValue::IntervalMonthDayNano(Some(v)),
                        _,
                    ) => i64::from(v.days) * 86_400_000_000 + v.nanoseconds / 1000,
                    _ => continue,
                }
            };
            self.windowed.set(true);
            return Ok(Some(WindowClose {
                key,
                to_end_micros,
                sources,
                lateness: self.options.lateness,
                emit_on_close: self.options.emit_on_close,
            }));
        }
        Ok(None)
    }

    /// `GROUP BY` over `SESSION(...)`'s window_start / window_end: sessions per the other keys.
    fn session_aggregate(
        &self,
        agg: &datafusion::logical_expr::Aggregate,
        input: &Node,
        group: &[eddy_dataflow::plan::Expr],
        aggregates: &[AggregateCall],
    ) -> Result<Option<Node>> {
        let mut starts = Vec::new();
        let mut ends = Vec::new();
        let mut gap = None;
        let mut sources = None;
        for (i, e) in agg.group_expr.iter().enumerate() {
            let Some((bound, args, found)) = self.trace_bound_any(e, &agg.input) else {
                continue;
            };
            if !bound.is_session() {
                continue;
            }
            if bound.is_end() {
                ends.push(i)
            } else {
                starts.push(i)
            }
            gap = interval_literal(&args[1]);
            sources = found;
        }
        let time = match (starts.first(), ends.first()) {
            (Some(&i), _) | (None, Some(&i)) => group[i].clone(),
            (None, None) => {
                if self.trace_sessions_anywhere(&agg.input) {
                    return Err(Error::unsupported(
                        "SESSION windows need GROUP BY window_start or window_end",
                    ));
                }
                return Ok(None);
            }
        };
        let gap_micros =
            gap.ok_or_else(|| Error::unsupported("SESSION: the gap must be a constant interval"))?;
        self.sessions.set(true);
        let window = sources.map(|sources| WindowClose {
            key: 0,
            to_end_micros: 0,
            sources,
            lateness: self.options.lateness,
            emit_on_close: self.options.emit_on_close,
        });
        if window.is_some() {
            self.windowed.set(true);
        }
        Ok(Some(Node::SessionAggregate {
            input: Box::new(input.clone()),
            group: group.to_vec(),
            starts,
            ends,
            time,
            gap_micros,
            aggregates: aggregates.to_vec(),
            window,
            schema: nullable(agg.schema.as_arrow()),
        }))
    }

    /// Like [`Self::trace_bound`], also for bounds over a time column without a watermark.
    fn trace_bound_any(
        &self,
        expr: &Expr,
        plan: &LogicalPlan,
    ) -> Option<(WindowBound, Vec<Expr>, Option<Vec<eddy_common::ObjectId>>)> {
        if let Some((bound, args, _)) = window_bound(expr) {
            let sources = watermark_sources(&args[0], plan);
            return Some((bound, args.to_vec(), sources));
        }
        let column = match expr {
            Expr::Alias(a) => return self.trace_bound_any(&a.expr, plan),
            Expr::Column(column) => column,
            _ => return None,
        };
        let index = plan.schema().index_of_column(column).ok()?;
        let input_column = |input: &LogicalPlan, i: usize| {
            Expr::Column(datafusion::common::Column::from(
                input.schema().qualified_field(i),
            ))
        };
        match plan {
            LogicalPlan::Projection(p) => self.trace_bound_any(&p.expr[index], &p.input),
            LogicalPlan::Filter(f) => self.trace_bound_any(expr, &f.input),
            LogicalPlan::SubqueryAlias(a) => {
                self.trace_bound_any(&input_column(&a.input, index), &a.input)
            }
            _ => None,
        }
    }

    /// Whether `plan` computes SESSION placeholders anywhere (which only a GROUP BY may use).
    pub fn trace_sessions_anywhere(&self, plan: &LogicalPlan) -> bool {
        use datafusion::common::tree_node::TreeNode;
        plan.exists(|p| {
            Ok(p.expressions().iter().any(|e| {
                e.exists(|e| Ok(matches!(e, Expr::ScalarFunction(f) if WindowBound::from_name(f.func.name()).is_some_and(WindowBound::is_session))))
                    .unwrap_or(false)
            }))
        })
        .unwrap_or(false)
    }

    /// Follows a column back to the window-bound call that computes it; with the streams whose
    /// watermark its time argument carries.
    fn trace_bound(
        &self,
        expr: &Expr,
        plan: &LogicalPlan,
    ) -> Option<(WindowBound, Vec<Expr>, Vec<eddy_common::ObjectId>)> {
        if let Some((bound, args, _)) = window_bound(expr) {
            return Some((bound, args.to_vec(), watermark_sources(&args[0], plan)?));
        }
        // `window_start AS starttime` in a subquery is still the window.
        let column = match expr {
            Expr::Alias(a) => return self.trace_bound(&a.expr, plan),
            Expr::Column(column) => column,
            _ => return None,
        };
        let index = plan.schema().index_of_column(column).ok()?;
        let input_column = |input: &LogicalPlan, i: usize| {
            Expr::Column(datafusion::common::Column::from(
                input.schema().qualified_field(i),
            ))
        };
        match plan {
            LogicalPlan::Projection(p) => self.trace_bound(&p.expr[index], &p.input),
            LogicalPlan::Filter(f) => self.trace_bound(expr, &f.input),
            // A windowed aggregate's window column is still the window.
            LogicalPlan::Aggregate(a) if index < a.group_expr.len() => {
                self.trace_bound(&a.group_expr[index], &a.input)
            }
            LogicalPlan::SubqueryAlias(a) => {
                self.trace_bound(&input_column(&a.input, index), &a.input)
            }
            LogicalPlan::Union(u) => {
                let mut found: Option<(WindowBound, Vec<Expr>, Vec<eddy_common::ObjectId>)> = None;
                for input in &u.inputs {
                    let (bound, args, sources) =
                        self.trace_bound(&input_column(input, index), input)?;
                    match &mut found {
                        None => found = Some((bound, args, sources)),
                        Some((b, _, all)) if *b == bound => all.extend(sources),
                        Some(_) => return None,
                    }
                }
                found
            }
            LogicalPlan::Join(j) => {
                let left = j.left.schema().fields().len();
                if index < left {
                    self.trace_bound(&input_column(&j.left, index), &j.left)
                } else {
                    self.trace_bound(&input_column(&j.right, index - left), &j.right)
                }
            }
            _ => None,
        }
    }

    /// How long each side of a join of two watermarked streams must keep its rows: from a
    /// window join (equal window bounds on both sides) or from interval conditions between the
    /// two sides' watermark columns. `None` when the join is not bounded in time.
    fn join_bounds(&self, join: &datafusion::logical_expr::Join) -> Result<Option<[TimeBound; 2]>> {
        let allowed = self.options.lateness.allowed_micros;
        for (l, r) in &join.on {
            let (Some((lb, largs, lsrc)), Some((rb, rargs, rsrc))) = (
                self.trace_bound(l, &join.left),
                self.trace_bound(r, &join.right),
            ) else {
                continue;
            };
            if lb.is_end() != rb.is_end() {
                continue;
            }
            let to_end = |bound: WindowBound, args: &[Expr]| -> Option<i64> {
                if bound.is_end() {
                    return Some(0);
                }
                interval_literal(if matches!(bound, WindowBound::TumbleStart) {
                    &args[1]
                } else {
                    &args[2]
                })
            };
            let (Some(lend), Some(rend)) = (to_end(lb, &largs), to_end(rb, &rargs)) else {
                continue;
            };
            let left = TimeBound {
                time: self.expr(l, join.left.schema())?,
                horizon_micros: lend + allowed,
                range: None,
                own: lsrc.clone(),
                other: rsrc.clone(),
                allowed_micros: allowed,
                drop_late: false,
            };
            let right = TimeBound {
                time: self.expr(r, join.right.schema())?,
                horizon_micros: rend + allowed,
                range: None,
                own: rsrc,
                other: lsrc,
                allowed_micros: allowed,
                drop_late: false,
            };
            return Ok(Some([left, right]));
        }
        // Interval conditions: t_left - t_right within [lo, hi].
        let Some(filter) = &join.filter else {
            return Ok(None);
        };
        let mut conjuncts = Vec::new();
        split_conjunction(filter, &mut conjuncts);
        let (mut lo, mut hi): (Option<i64>, Option<i64>) = (None, None);
        let mut columns: Option<(Expr, Expr, TimeSide, TimeSide)> = None;
        // A side's time: a watermark column of a stream (rows behind the watermark are late),
        // or the window_end of a windowed aggregate below (`window_end AS date_time`): its rows
        // change only until the watermark of the window's streams passes the end, like events
        // with the same allowed lateness, but reach the join when the aggregate emits — maybe
        // behind that watermark already — so they are never dropped as late.
        let time_side = |column: &Expr, plan: &LogicalPlan| -> Option<TimeSide> {
            if let Some(sources) = watermark_sources(column, plan) {
                return Some(TimeSide {
                    sources,
                    window_end: false,
                });
            }
            let (bound, _, sources) = self.trace_bound(column, plan)?;
            (bound.is_end() && !bound.is_session()).then_some(TimeSide {
                sources,
                window_end: true,
            })
        };
        for (a, op, b) in conjuncts {
            let side = |e: &Expr| -> Option<(bool, Expr, i64, TimeSide)> {
                let (column, offset) = time_offset(e)?;
                let name = column_of(&column)?;
                if join.left.schema().has_column(name) {
                    return Some((
                        true,
                        column.clone(),
                        offset,
                        time_side(&column, &join.left)?,
                    ));
                }
                Some((
                    false,
                    column.clone(),
                    offset,
                    time_side(&column, &join.right)?,
                ))
            };
            let (Some((a_left, ca, oa, sa)), Some((b_left, cb, ob, sb))) = (side(&a), side(&b))
            else {
                continue;
            };
            if a_left == b_left || (sa.window_end && sb.window_end) {
                continue;
            }
            // ca + oa op cb + ob  =>  ca - cb op ob - oa; written as t_left - t_right.
            let (c, op, lcol, rcol, lsrc, rsrc) = if a_left {
                (ob - oa, op, ca, cb, sa, sb)
            } else {
                (oa - ob, flip(op), cb, ca, sb, sa)
            };
            match op {
                Operator::GtEq | Operator::Gt => lo = Some(lo.map_or(c, |l| l.max(c))),
                Operator::LtEq | Operator::Lt => hi = Some(hi.map_or(c, |h| h.min(c))),
                _ => continue,
            }
            columns.get_or_insert((lcol, rcol, lsrc, rsrc));
        }
        let (Some(lo), Some(hi), Some((lcol, rcol, lsrc, rsrc))) = (lo, hi, columns) else {
            return Ok(None);
        };
        // t_left - t_right within [lo, hi]: a left row meets right rows in [t - hi, t - lo], a
        // right row meets left rows in [t + lo, t + hi].
        let left = TimeBound {
            time: self.expr(&lcol, join.left.schema())?,
            horizon_micros: allowed - lo,
            range: Some((-hi, -lo)),
            own: lsrc.sources.clone(),
            other: rsrc.sources.clone(),
            allowed_micros: allowed,
            drop_late: !lsrc.window_end,
        };
        let right = TimeBound {
            time: self.expr(&rcol, join.right.schema())?,
            horizon_micros: hi + allowed,
            range: Some((lo, hi)),
            own: rsrc.sources,
            other: lsrc.sources,
            allowed_micros: allowed,
            drop_late: !rsrc.window_end,
        };
        Ok(Some([left, right]))
    }

    /// Whether `plan` reads a relation referenced `FOR SYSTEM_TIME AS OF PROCTIME()`.
    fn is_temporal(&self, plan: &LogicalPlan) -> bool {
        match plan {
            LogicalPlan::SubqueryAlias(a) => {
                self.temporal.contains(&a.alias.table().to_lowercase())
                    || self.is_temporal(&a.input)
            }
            LogicalPlan::Projection(p) => self.is_temporal(&p.input),
            LogicalPlan::Filter(f) => self.is_temporal(&f.input),
            LogicalPlan::TableScan(s) => {
                self.temporal.contains(&s.table_name.table().to_lowercase())
            }
            _ => false,
        }
    }

    fn top_n(
        &self,
        sort: &datafusion::logical_expr::Sort,
        offset: usize,
        limit: usize,
    ) -> Result<Node> {
        let input = self.lower(&sort.input)?;
        let order = sort
            .expr
            .iter()
            .map(|s| {
                let expr = self.expr(&s.expr, sort.input.schema())?;
                Ok((
                    expr,
                    arrow::compute::SortOptions {
                        descending: !s.asc,
                        nulls_first: s.nulls_first,
                    },
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        let schema = input.schema();
        let append_only = is_append_only(&sort.input);
        Ok(Node::TopN {
            input: Box::new(input),
            partition: Vec::new(),
            order,
            offset,
            limit,
            rank: None,
            window: None,
            append_only,
            schema,
        })
    }

    /// `Filter(rn <= n)` over `Window(row_number() | rank() | dense_rank() OVER (PARTITION BY .. ORDER BY ..))`: top-N
    /// per partition with the row number as the last column. `None` when the shape differs.
    fn ranked_top_n(&self, filter: &datafusion::logical_expr::Filter) -> Result<Option<Node>> {
        use datafusion::common::ScalarValue;
        use datafusion::logical_expr::{BinaryExpr, Operator};
        // The optimizer may prune columns between the filter and the window.
        let (window, projection) = match filter.input.as_ref() {
            LogicalPlan::Window(w) => (w, None),
            LogicalPlan::Projection(p) if p.expr.iter().all(|e| matches!(e, Expr::Column(_))) => {
                match p.input.as_ref() {
                    LogicalPlan::Window(w) => (w, Some(p)),
                    _ => return Ok(None),
                }
            }
            _ => return Ok(None),
        };
        let [Expr::WindowFunction(function)] = window.window_expr.as_slice() else {
            return Ok(None);
        };
        let ranking = match function.fun.name() {
            "row_number" => Ranking::RowNumber,
            "rank" => Ranking::Rank,
            "dense_rank" => Ranking::DenseRank,
            _ => return Ok(None),
        };
        if !function.params.args.is_empty() || function.params.filter.is_some() {
            return Ok(None);
        }
        let rank_column = window
            .schema
            .field(window.schema.fields().len() - 1)
            .name()
            .clone();
        let Expr::BinaryExpr(BinaryExpr { left, op, right }) = &filter.predicate else {
            return Ok(None);
        };
        let refers_to_rank = matches!(left.as_ref(), Expr::Column(c) if c.name == rank_column);
        let bound = match right.as_ref() {
            Expr::Literal(ScalarValue::UInt64(Some(n)), _) => Some(*n as i64),
            Expr::Literal(ScalarValue::Int64(Some(n)), _) => Some(*n),
            _ => None,
        };
        let (true, Some(bound)) = (refers_to_rank, bound) else {
            return Ok(None);
        };
        let limit = match op {
            Operator::LtEq => bound,
            Operator::Lt => bound - 1,
            Operator::Eq if bound == 1 => 1,
            _ => return Ok(None),
        };
        let limit = usize::try_from(limit.max(0)).unwrap_or(0);
        let input = self.lower(&window.input)?;
        let partition = function
            .params
            .partition_by
            .iter()
            .map(|e| self.expr(e, window.input.schema()))
            .collect::<Result<_>>()?;
        let order = function
            .params
            .order_by
            .iter()
            .map(|s| {
                Ok((
                    self.expr(&s.expr, window.input.schema())?,
                    arrow::compute::SortOptions {
                        descending: !s.asc,
                        nulls_first: s.nulls_first,
                    },
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        // Top-N per window: a window's partition is forgotten once the watermark passes it.
        let mut closes = None;
        for (i, e) in function.params.partition_by.iter().enumerate() {
            let Some((bound, args, sources)) = self.trace_bound(e, &window.input) else {
                continue;
            };
            if bound.is_session() {
                continue;
            }
            let to_end = if bound.is_end() {
                Some(0)
            } else {
                interval_literal(if matches!(bound, WindowBound::TumbleStart) {
                    &args[1]
                } else {
                    &args[2]
                })
            };
            if let Some(to_end) = to_end {
                closes = Some(WindowClose {
                    key: i,
                    to_end_micros: to_end,
                    sources,
                    lateness: self.options.lateness,
                    emit_on_close: false,
                });
                break;
            }
        }
        let append_only = is_append_only(&window.input);
        let top = Node::TopN {
            input: Box::new(input),
            partition,
            order,
            offset: 0,
            limit,
            rank: Some(ranking),
            window: closes,
            append_only,
            schema: nullable(window.schema.as_arrow()),
        };
        Ok(Some(match projection {
            None => top,
            Some(p) => {
                let exprs = p
                    .expr
                    .iter()
                    .map(|e| self.expr(e, &window.schema))
                    .collect::<Result<_>>()?;
                Node::Project {
                    input: Box::new(top),
                    exprs,
                    schema: nullable(p.schema.as_arrow()),
                }
            }
        }))
    }
}

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

/// The first output column of `plan` that is a stream's watermark column, as an expression over
/// the output, with the streams (for `EMIT ON WINDOW CLOSE` over plain rows).
pub fn release_time(
    plan: &LogicalPlan,
) -> Option<(usize, eddy_dataflow::plan::Expr, Vec<eddy_common::ObjectId>)> {
    for (i, (qualifier, field)) in plan.schema().iter().enumerate() {
        let column = Expr::Column(datafusion::common::Column::new(
            qualifier.cloned(),
            field.name(),
        ));
        if let Some(sources) = watermark_sources(&column, plan) {
            let expr = Arc::new(datafusion::physical_expr::expressions::Column::new(
                field.name(),
                i,
            )) as eddy_dataflow::plan::Expr;
            return Some((i, expr, sources));
        }
    }
    None
}

/// Whether `expr` calls `now()` (as rewritten for views).
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

fn mentions_now(expr: &Expr) -> bool {
    use datafusion::common::tree_node::TreeNode;
    expr.exists(|e| {
        Ok(matches!(e, Expr::ScalarFunction(f) if f.func.name() == crate::windows::VIEW_NOW))
    })
    .unwrap_or(true)
}

/// `now()`, `now() + interval` or `now() - interval` as the offset in µs.
fn now_offset(expr: &Expr) -> Option<i64> {
    match expr {
        Expr::ScalarFunction(f) if f.func.name() == crate::windows::VIEW_NOW => Some(0),
        Expr::Cast(c) => now_offset(&c.expr),
        Expr::TryCast(c) => now_offset(&c.expr),
        Expr::BinaryExpr(b) if matches!(b.op, Operator::Plus | Operator::Minus) => {
            let base = now_offset(&b.left)?;
            let delta = interval_literal(&b.right)?;
            Some(if b.op == Operator::Plus {
                base + delta
            } else {
                base - delta
            })
        }
        _ => None,
    }
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

/// `a AND b AND ...` as comparisons (`BETWEEN` becomes two).
fn split_conjunction(expr: &Expr, out: &mut Vec<(Expr, Operator, Expr)>) {
    match expr {
        Expr::BinaryExpr(b) if b.op == Operator::And => {
            split_conjunction(&b.left, out);
            split_conjunction(&b.right, out);
        }
        Expr::BinaryExpr(b)
            if matches!(
                b.op,
                Operator::Lt | Operator::LtEq | Operator::Gt | Operator::GtEq
            ) =>
        {
            out.push((b.left.as_ref().clone(), b.op, b.right.as_ref().clone()));
        }
        Expr::Between(between) if !between.negated => {
            out.push((
                between.expr.as_ref().clone(),
                Operator::GtEq,
                between.low.as_ref().clone(),
            ));
            out.push((
                between.expr.as_ref().clone(),
                Operator::LtEq,
                between.high.as_ref().clone(),
            ));
        }
        _ => {}
    }
}

fn flip(op: Operator) -> Operator {
    match op {
        Operator::Lt => Operator::Gt,
        Operator::LtEq => Operator::GtEq,
        Operator::Gt => Operator::Lt,
        Operator::GtEq => Operator::LtEq,
        other => other,
    }
}

fn column_of(expr: &Expr) -> Option<&datafusion::common::Column> {
    match expr {
        Expr::Column(c) => Some(c),
        _ => None,
    }
}

/// µs of a constant interval literal without months.
fn interval_literal(expr: &Expr) -> Option<i64> {
    match expr {
        Expr::Literal(datafusion::common::ScalarValue::IntervalMonthDayNano(Some(v)), _)
            if v.months == 0 =>
        {
            Some(i64::from(v.days) * 86_400_000_000 + v.nanoseconds / 1000)
        }
        Expr::Cast(c) => interval_literal(&c.expr),
        _ => None,
    }
}

/// `column`, `column + interval` or `column - interval` as (column, offset µs).
fn time_offset(expr: &Expr) -> Option<(Expr, i64)> {
    match expr {
        Expr::Column(_) => Some((expr.clone(), 0)),
        Expr::Cast(c) => time_offset(&c.expr),
        Expr::BinaryExpr(b) if matches!(b.op, Operator::Plus | Operator::Minus) => {
            let (column, base) = time_offset(&b.left)?;
            let delta = interval_literal(&b.right)?;
            Some((
                column,
                if b.op == Operator::Plus {
                    base + delta
                } else {
                    base - delta
                },
            ))
        }
        _ => None,
    }
}

/// The time column of one side of an interval join.
#[derive(Clone)]
struct TimeSide {
    /// The streams whose watermark bounds it.
    sources: Vec<eddy_common::ObjectId>,
    /// A windowed aggregate's window_end rather than a stream's watermark column.
    window_end: bool,
}

/// The window-bound call in `expr` (through aliases), if any: the bound and its arguments.
fn window_bound(expr: &Expr) -> Option<(WindowBound, &[Expr], &Expr)> {
    match expr {
        Expr::Alias(a) => window_bound(&a.expr),
        Expr::ScalarFunction(f) => {
            WindowBound::from_name(f.func.name()).map(|b| (b, f.args.as_slice(), expr))
        }
        _ => None,
    }
}

/// The streams whose watermark column `expr` (over `plan`'s output) is, traced through
/// projections, filters, aliases, unions and joins; `None` if it is not such a column.
fn watermark_sources(expr: &Expr, plan: &LogicalPlan) -> Option<Vec<eddy_common::ObjectId>> {
    let column = match expr {
        Expr::Alias(a) => return watermark_sources(&a.expr, plan),
        Expr::Cast(c) => return watermark_sources(&c.expr, plan),
        Expr::Column(c) => c,
        _ => return None,
    };
    let index = plan.schema().index_of_column(column).ok()?;
    let input_column = |input: &LogicalPlan, i: usize| {
        Expr::Column(datafusion::common::Column::from(
            input.schema().qualified_field(i),
        ))
    };
    match plan {
        LogicalPlan::Projection(p) => watermark_sources(&p.expr[index], &p.input),
        LogicalPlan::Filter(f) => watermark_sources(expr, &f.input),
        LogicalPlan::Sort(s) => watermark_sources(expr, &s.input),
        LogicalPlan::Limit(l) => watermark_sources(expr, &l.input),
        LogicalPlan::SubqueryAlias(a) => {
            watermark_sources(&input_column(&a.input, index), &a.input)
        }
        LogicalPlan::Union(u) => {
            let mut out = Vec::new();
            for input in &u.inputs {
                out.extend(watermark_sources(&input_column(input, index), input)?);
            }
            Some(out)
        }
        LogicalPlan::Join(j) => {
            let left = j.left.schema().fields().len();
            if index < left {
                watermark_sources(&input_column(&j.left, index), &j.left)
            } else {
                watermark_sources(&input_column(&j.right, index - left), &j.right)
            }
        }
        LogicalPlan::TableScan(scan) => {
            let provider = source_as_provider(&scan.source).ok()?;
            let any: &dyn std::any::Any = provider.as_ref();
            let bridge = any.downcast_ref::<TableBridge>()?;
            let name = scan.projected_schema.field(index).name();
            (bridge.source.watermark_column().as_deref() == Some(name.as_str()))
                .then(|| vec![bridge.source.object_id()])
        }
        _ => None,
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
    fn temporal_filter(&self, f: &datafusion::logical_expr::Filter, input: Node) -> Result<Node> {
        let mut from = Vec::new();
        let mut until = Vec::new();
        let mut rest = Vec::new();
        for conjunct in datafusion::logical_expr::utils::split_conjunction(&f.predicate) {
            if !mentions_now(conjunct) {
                rest.push(conjunct.clone());
                continue;
            }
            let unsupported = || {
                Error::unsupported(format!(
                    "now() in a materialized view must be compared with a row value, e.g. ts > now() - INTERVAL '1 hour'; found {conjunct}"
                ))
            };
            let Expr::BinaryExpr(b) = conjunct else {
                return Err(unsupported());
            };
            // Normalize to `row op now() + c`.
            let (row, op, c) = match (now_offset(&b.left), now_offset(&b.right)) {
                (None, Some(c)) if !mentions_now(&b.left) => (b.left.as_ref(), b.op, c),
                (Some(c), None) if !mentions_now(&b.right) => (b.right.as_ref(), flip(b.op), c),
                _ => return Err(unsupported()),
            };
            let row = self.expr(row, f.input.schema())?;
            match op {
                // row > now + c  <=>  now < row - c
                Operator::Gt => until.push((row, -c)),
                Operator::GtEq => until.push((row, 1 - c)),
                // row < now + c  <=>  now > row - c
                Operator::Lt => from.push((row, 1 - c)),
                Operator::LtEq => from.push((row, -c)),
                _ => return Err(unsupported()),
            }
        }
        let input = match datafusion::logical_expr::utils::conjunction(rest) {
            Some(predicate) => Node::Filter {
                input: Box::new(input),
                predicate: self.expr(&predicate, f.input.schema())?,
            },
            None => input,
        };
        Ok(Node::TemporalFilter {
            input: Box::new(input),
            from,
            until,
        })
    }

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
