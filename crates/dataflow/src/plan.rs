//! The dataflow plan IR: what the SQL planner produces and [`crate::build`] consumes.
//! Expressions are DataFusion physical expressions over the node's input schema.

use std::fmt;
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::aggregate::AggregateFunctionExpr;
use eddy_common::ObjectId;

pub type Expr = Arc<dyn PhysicalExpr>;

/// An aggregate call with its optional `FILTER (WHERE ...)`.
#[derive(Clone)]
pub struct AggregateCall {
    pub function: Arc<AggregateFunctionExpr>,
    pub filter: Option<Expr>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JoinKind {
    Inner,
    Left,
    Right,
    Full,
    LeftSemi,
    LeftAnti,
    RightSemi,
    RightAnti,
}

#[derive(Clone)]
pub enum Node {
    /// The changes of a table or view.
    Source {
        object: ObjectId,
        name: String,
        schema: SchemaRef,
    },
    Filter {
        input: Box<Node>,
        predicate: Expr,
    },
    Project {
        input: Box<Node>,
        exprs: Vec<Expr>,
        schema: SchemaRef,
    },
    /// `UNION ALL` of inputs with equal schemas.
    Union {
        inputs: Vec<Node>,
        schema: SchemaRef,
    },
    /// GROUP BY `group` (empty: one global group) computing `aggregates`; output columns are
    /// the group columns then the aggregates.
    /// With `window`, one group key is a window bound over a watermarked stream: windows are
    /// closed (and their state freed) by the watermark.
    /// With `append_only` (the input only inserts), min/max and the like keep one value per
    /// group instead of a multiset.
    Aggregate {
        input: Box<Node>,
        group: Vec<Expr>,
        aggregates: Vec<AggregateCall>,
        window: Option<WindowClose>,
        append_only: bool,
        schema: SchemaRef,
    },
    /// Drops (and records) rows for closed windows, as `lateness` says; `end` and `time` are
    /// each row's window end and event time, `sources` the streams whose watermark applies.
    LateFilter {
        input: Box<Node>,
        end: Expr,
        time: Expr,
        sources: Vec<ObjectId>,
        lateness: Lateness,
    },
    /// `GROUP BY` over SESSION windows: per value of the group keys other than `starts` and
    /// `ends` (the positions of window_start / window_end), events closer than `gap_micros`
    /// in `time` form a session [first, last + gap); each session is one output row. With
    /// `window`, sessions close by the watermark (its `key` and `to_end_micros` are unused).
    SessionAggregate {
        input: Box<Node>,
        group: Vec<Expr>,
        starts: Vec<usize>,
        ends: Vec<usize>,
        time: Expr,
        gap_micros: i64,
        aggregates: Vec<AggregateCall>,
        window: Option<WindowClose>,
        schema: SchemaRef,
    },
    /// A filter on processing time (`ts > now() - INTERVAL '1 hour'` in a view): each row is in
    /// the output while the wall clock is within its bounds — from the latest of `from` (each
    /// an expression over the row plus µs; inclusive) until the earliest of `until`
    /// (exclusive) — and is inserted and retracted as the clock passes them.
    TemporalFilter {
        input: Box<Node>,
        from: Vec<(Expr, i64)>,
        until: Vec<(Expr, i64)>,
    },
    /// `EMIT ON WINDOW CLOSE` over plain rows: holds rows back until the watermark of `sources`
    /// passes their `time`, then releases them in event-time order; rows already behind the
    /// watermark are late.
    Release {
        input: Box<Node>,
        time: Expr,
        sources: Vec<ObjectId>,
        lateness: Lateness,
    },
    /// `ORDER BY order LIMIT limit OFFSET offset` per partition (`partition` empty: the whole
    /// input). With `rank`, each output row gets its rank as a trailing UInt64 column and the
    /// limit bounds the rank (`ROW_NUMBER() | RANK() | DENSE_RANK() OVER (PARTITION BY .. ORDER
    /// BY ..) <= n`); `schema` is the output.
    /// With `window` (a partition expression at `key` is a window bound), a window's partition
    /// is forgotten once the watermark passes its end plus the allowed lateness. With
    /// `append_only` (the input only inserts), a row that falls out of its partition's top can
    /// never come back, so only the top rows are kept.
    TopN {
        input: Box<Node>,
        partition: Vec<Expr>,
        order: Vec<(Expr, arrow::compute::SortOptions)>,
        offset: usize,
        limit: usize,
        rank: Option<Ranking>,
        window: Option<WindowClose>,
        append_only: bool,
        schema: SchemaRef,
    },
    /// Equi-join; `filter` is over the concatenated left and right columns; `nulls_equal` makes
    /// NULL keys match each other (IS NOT DISTINCT FROM, as INTERSECT and EXCEPT need). The output is
    /// left ++ right columns, or one side's columns for semi and anti joins.
    /// With `bounds` (inner joins of two streams bounded in time), each side's rows are
    /// forgotten once no future row of the other side can match them.
    /// With `lookup` (`right FOR SYSTEM_TIME AS OF PROCTIME()`), left rows are joined with the
    /// right side as it is when they arrive; right changes never change earlier output, and
    /// left rows are not kept. Inner or left joins only.
    Join {
        kind: JoinKind,
        left: Box<Node>,
        right: Box<Node>,
        left_keys: Vec<Expr>,
        right_keys: Vec<Expr>,
        filter: Option<Expr>,
        nulls_equal: bool,
        bounds: Option<Box<[TimeBound; 2]>>,
        lookup: bool,
        schema: SchemaRef,
    },
}

/// What a view does with rows for closed windows (`late_events`, `allowed_lateness`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Lateness {
    /// Apply late rows while the window's state is kept, publishing corrections.
    pub retract: bool,
    /// How long after a window closes its state is kept, µs.
    pub allowed_micros: i64,
}

/// How a windowed aggregate closes its windows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowClose {
    /// The group key holding a window bound (a timestamp).
    pub key: usize,
    /// Added to the key's value (µs) to get the window end: 0 for `window_end`, the size for
    /// `window_start`.
    pub to_end_micros: i64,
    /// The streams whose watermark closes the windows.
    pub sources: Vec<ObjectId>,
    pub lateness: Lateness,
    /// `EMIT ON WINDOW CLOSE`: a window appears only once closed.
    pub emit_on_close: bool,
}

/// When one side of a time-bounded join may forget a row: once the other side's watermark
/// reaches the row's `time + horizon_micros`. With `drop_late`, rows arriving with `time +
/// allowed_micros` at or below their own side's watermark are dropped and recorded (an
/// interval join's raw event times; a window join's late rows were dropped before it).
#[derive(Debug, Clone)]
pub struct TimeBound {
    pub time: Expr,
    pub horizon_micros: i64,
    /// Interval joins: a row of this side at time t matches rows of the other side whose time
    /// is within [t + range.0, t + range.1] (the probe reads only that range).
    pub range: Option<(i64, i64)>,
    pub own: Vec<ObjectId>,
    pub other: Vec<ObjectId>,
    pub allowed_micros: i64,
    pub drop_late: bool,
}

/// How top-N per partition numbers its rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ranking {
    /// 1, 2, 3, ... — ties get consecutive numbers.
    RowNumber,
    /// Ties share a rank and leave gaps: 1, 1, 3.
    Rank,
    /// Ties share a rank without gaps: 1, 1, 2.
    DenseRank,
}

impl Ranking {
    pub fn sql_name(self) -> &'static str {
        match self {
            Ranking::RowNumber => "row_number",
            Ranking::Rank => "rank",
            Ranking::DenseRank => "dense_rank",
        }
    }
}

impl Node {
    pub fn schema(&self) -> SchemaRef {
        match self {
            Node::Source { schema, .. }
            | Node::Project { schema, .. }
            | Node::Union { schema, .. }
            | Node::Aggregate { schema, .. }
            | Node::SessionAggregate { schema, .. }
            | Node::Join { schema, .. } => schema.clone(),
            Node::TopN { schema, .. } => schema.clone(),
            Node::Filter { input, .. }
            | Node::LateFilter { input, .. }
            | Node::Release { input, .. }
            | Node::TemporalFilter { input, .. } => input.schema(),
        }
    }

    /// Output columns whose values identify a row (a grouped aggregate's group columns, also
    /// through a projection that keeps them as they are); `None` when there is no such key.
    pub fn unique_key(&self) -> Option<Vec<usize>> {
        match self {
            Node::Aggregate { group, .. } if !group.is_empty() => Some((0..group.len()).collect()),
            Node::Project { input, exprs, .. } => {
                let inner = input.unique_key()?;
                let column = |e: &Expr| {
                    let any: &dyn std::any::Any = e.as_ref();
                    any.downcast_ref::<datafusion::physical_expr::expressions::Column>()
                        .map(|c| c.index())
                };
                inner
                    .iter()
                    .map(|k| exprs.iter().position(|e| column(e) == Some(*k)))
                    .collect()
            }
            _ => None,
        }
    }

    /// Every table or view the plan reads.
    pub fn sources(&self) -> Vec<ObjectId> {
        let mut out = Vec::new();
        self.collect_sources(&mut out);
        out.sort();
        out.dedup();
        out
    }

    fn collect_sources(&self, out: &mut Vec<ObjectId>) {
        match self {
            Node::Source { object, .. } => out.push(*object),
            Node::Filter { input, .. }
            | Node::LateFilter { input, .. }
            | Node::Release { input, .. }
            | Node::TemporalFilter { input, .. }
            | Node::Project { input, .. }
            | Node::Aggregate { input, .. }
            | Node::SessionAggregate { input, .. }
            | Node::TopN { input, .. } => input.collect_sources(out),
            Node::Union { inputs, .. } => inputs.iter().for_each(|i| i.collect_sources(out)),
            Node::Join { left, right, .. } => {
                left.collect_sources(out);
                right.collect_sources(out);
            }
        }
    }

    fn fmt_indent(&self, f: &mut fmt::Formatter<'_>, depth: usize) -> fmt::Result {
        let pad = "  ".repeat(depth);
        let list = |exprs: &[Expr]| {
            exprs
                .iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        match self {
            Node::Source { name, object, .. } => writeln!(f, "{pad}Source: {name} (id {object})"),
            Node::Filter { input, predicate } => {
                writeln!(f, "{pad}Filter: {predicate}")?;
                input.fmt_indent(f, depth + 1)
            }
            Node::Project { input, exprs, .. } => {
                writeln!(f, "{pad}Project: {}", list(exprs))?;
                input.fmt_indent(f, depth + 1)
            }
            Node::TopN {
                input,
                partition,
                order,
                offset,
                limit,
                rank,
                window,
                append_only,
                ..
            } => {
                let keys = order
                    .iter()
                    .map(|(e, o)| format!("{e}{}", if o.descending { " DESC" } else { "" }))
                    .collect::<Vec<_>>()
                    .join(", ");
                let groups = if partition.is_empty() {
                    String::new()
                } else {
                    format!(" partition=[{}]", list(partition))
                };
                let bound = match rank {
                    None => format!("offset={offset} limit={limit}"),
                    Some(r) => format!("{}<={limit}", r.sql_name()),
                };
                let kept = if *append_only {
                    "input=append-only state=the top rows"
                } else {
                    "state=input rows"
                };
                let state = match window {
                    None if *append_only => format!("{kept} per partition"),
                    None => "state=all input rows".to_owned(),
                    Some(w) => format!(
                        "{kept} per window until the watermark passes its end + {}us",
                        w.lateness.allowed_micros
                    ),
                };
                writeln!(f, "{pad}TopN:{groups} order=[{keys}] {bound} {state}")?;
                input.fmt_indent(f, depth + 1)
            }
            Node::Union { inputs, .. } => {
                writeln!(f, "{pad}Union")?;
                inputs.iter().try_for_each(|i| i.fmt_indent(f, depth + 1))
            }
            Node::Aggregate {
                input,
                group,
                aggregates,
                window,
                append_only,
                ..
            } => {
                let aggs = aggregates
                    .iter()
                    .map(|a| a.function.name().to_owned())
                    .collect::<Vec<_>>()
                    .join(", ");
                let state = match window {
                    None if *append_only => "input=append-only state=per group".to_owned(),
                    None => "state=per group".to_owned(),
                    Some(w) => format!(
                        "window=group {} +{}us emit={} state=per group until the watermark passes the window end + {}us",
                        w.key,
                        w.to_end_micros,
                        if w.emit_on_close {
                            "on window close"
                        } else {
                            "on update"
                        },
                        w.lateness.allowed_micros
                    ),
                };
                writeln!(
                    f,
                    "{pad}Aggregate: group=[{}] aggregates=[{aggs}] {state}",
                    list(group)
                )?;
                input.fmt_indent(f, depth + 1)
            }
            Node::SessionAggregate {
                input,
                group,
                time,
                gap_micros,
                aggregates,
                window,
                ..
            } => {
                let aggs = aggregates
                    .iter()
                    .map(|a| a.function.name().to_owned())
                    .collect::<Vec<_>>()
                    .join(", ");
                let close = match window {
                    None => String::new(),
                    Some(w) => format!(
                        " emit={} allowed_lateness={}us",
                        if w.emit_on_close {
                            "on window close"
                        } else {
                            "on update"
                        },
                        w.lateness.allowed_micros
                    ),
                };
                writeln!(
                    f,
                    "{pad}SessionAggregate: group=[{}] time={time} gap={gap_micros}us aggregates=[{aggs}]{close} state=events per key until their session closes",
                    list(group)
                )?;
                input.fmt_indent(f, depth + 1)
            }
            Node::TemporalFilter { input, from, until } => {
                let bound = |b: &[(Expr, i64)]| {
                    b.iter()
                        .map(|(e, us)| format!("{e} {us:+}us"))
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                writeln!(
                    f,
                    "{pad}TemporalFilter: from=[{}] until=[{}] state=rows until they expire",
                    bound(from),
                    bound(until)
                )?;
                input.fmt_indent(f, depth + 1)
            }
            Node::Release { input, time, .. } => {
                writeln!(
                    f,
                    "{pad}Release: in order of {time} once the watermark passes it state=rows not yet released"
                )?;
                input.fmt_indent(f, depth + 1)
            }
            Node::LateFilter {
                input,
                end,
                lateness,
                ..
            } => {
                let policy = if lateness.retract { "retract" } else { "drop" };
                writeln!(
                    f,
                    "{pad}LateFilter: window end={end} late_events={policy} allowed_lateness={}us",
                    lateness.allowed_micros
                )?;
                input.fmt_indent(f, depth + 1)
            }
            Node::Join {
                kind,
                left,
                right,
                left_keys,
                right_keys,
                filter,
                nulls_equal,
                bounds,
                lookup,
                ..
            } => {
                let mut residual = filter
                    .as_ref()
                    .map(|e| format!(" filter={e}"))
                    .unwrap_or_default();
                if *nulls_equal {
                    residual.push_str(" nulls_equal");
                }
                let state = match bounds.as_deref() {
                    None if *lookup => {
                        "lookup (right side as of processing time) state=right side by key"
                            .to_owned()
                    }
                    None => "state=both sides by key".to_owned(),
                    Some([l, r]) => format!(
                        "state=both sides by key, left rows until the right watermark passes {} + {}us, right rows until the left watermark passes {} + {}us",
                        l.time, l.horizon_micros, r.time, r.horizon_micros
                    ),
                };
                writeln!(
                    f,
                    "{pad}{kind:?}Join: left=[{}] right=[{}]{residual} {state}",
                    list(left_keys),
                    list(right_keys)
                )?;
                left.fmt_indent(f, depth + 1)?;
                right.fmt_indent(f, depth + 1)
            }
        }
    }
}

impl fmt::Display for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        struct Indented<'a>(&'a Node);
        impl fmt::Display for Indented<'_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt_indent(f, 0)
            }
        }
        f.write_str(&readable_intervals(&Indented(self).to_string()))
    }
}

/// DataFusion prints interval literals as `IntervalMonthDayNano { months: 0, days: 0,
/// nanoseconds: 60000000000 }`; plans show them as `INTERVAL '60 seconds'`.
pub fn readable_intervals(text: &str) -> String {
    const START: &str = "IntervalMonthDayNano { months: ";
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(START) {
        out.push_str(&rest[..at]);
        let after = &rest[at + START.len()..];
        let Some(end) = after.find('}') else { break };
        let fields: Vec<i64> = after[..end]
            .split(',')
            .filter_map(|part| part.rsplit(':').next().and_then(|v| v.trim().parse().ok()))
            .collect();
        match fields.as_slice() {
            [months, days, nanos] => {
                let mut parts = Vec::new();
                if *months != 0 {
                    parts.push(format!("{months} months"));
                }
                if *days != 0 {
                    parts.push(format!("{days} days"));
                }
                if *nanos != 0 || parts.is_empty() {
                    let seconds = *nanos as f64 / 1e9;
                    parts.push(if nanos % 1_000_000_000 == 0 {
                        format!("{} seconds", nanos / 1_000_000_000)
                    } else {
                        format!("{seconds} seconds")
                    });
                }
                out.push_str(&format!("INTERVAL '{}'", parts.join(" ")));
            }
            _ => out.push_str(&rest[at..at + START.len() + end + 1]),
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    out
}
