//! Lowering event time: windows closed by watermarks, sessions, time-bounded joins,
//! `EMIT ON WINDOW CLOSE` over plain rows, and filters on `now()`.

use super::*;

impl Lowering<'_> {
    /// How a GROUP BY closes its windows: a group key that is a window bound over a
    /// watermarked stream (traced through the input's projections).
    pub(super) fn window_close(
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
    pub(super) fn session_aggregate(
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
    pub(super) fn trace_bound_any(
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
    pub(super) fn trace_bound(
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
    pub(super) fn join_bounds(
        &self,
        join: &datafusion::logical_expr::Join,
    ) -> Result<Option<[TimeBound; 2]>> {
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
    pub(super) fn is_temporal(&self, plan: &LogicalPlan) -> bool {
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

    pub(super) fn temporal_filter(
        &self,
        f: &datafusion::logical_expr::Filter,
        input: Node,
    ) -> Result<Node> {
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
pub(super) fn mentions_now(expr: &Expr) -> bool {
    use datafusion::common::tree_node::TreeNode;
    expr.exists(|e| {
        Ok(matches!(e, Expr::ScalarFunction(f) if f.func.name() == crate::windows::VIEW_NOW))
    })
    .unwrap_or(true)
}

/// `now()`, `now() + interval` or `now() - interval` as the offset in µs.
pub(super) fn now_offset(expr: &Expr) -> Option<i64> {
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

/// `a AND b AND ...` as comparisons (`BETWEEN` becomes two).
pub(super) fn split_conjunction(expr: &Expr, out: &mut Vec<(Expr, Operator, Expr)>) {
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

pub(super) fn flip(op: Operator) -> Operator {
    match op {
        Operator::Lt => Operator::Gt,
        Operator::LtEq => Operator::GtEq,
        Operator::Gt => Operator::Lt,
        Operator::GtEq => Operator::LtEq,
        other => other,
    }
}

pub(super) fn column_of(expr: &Expr) -> Option<&datafusion::common::Column> {
    match expr {
        Expr::Column(c) => Some(c),
        _ => None,
    }
}

/// µs of a constant interval literal without months.
pub(super) fn interval_literal(expr: &Expr) -> Option<i64> {
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
pub(super) fn time_offset(expr: &Expr) -> Option<(Expr, i64)> {
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
pub(super) struct TimeSide {
    /// The streams whose watermark bounds it.
    sources: Vec<eddy_common::ObjectId>,
    /// A windowed aggregate's window_end rather than a stream's watermark column.
    window_end: bool,
}

/// The window-bound call in `expr` (through aliases), if any: the bound and its arguments.
pub(super) fn window_bound(expr: &Expr) -> Option<(WindowBound, &[Expr], &Expr)> {
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
pub(super) fn watermark_sources(
    expr: &Expr,
    plan: &LogicalPlan,
) -> Option<Vec<eddy_common::ObjectId>> {
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
