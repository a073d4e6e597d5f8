//! Shared subplans (ADR 0009): which plan nodes compute the same changes, so that a dataflow
//! builds them once and fans their output out to every reader.
//!
//! Two nodes are [`same`] when they are the same operator with the same parameters over the
//! same inputs: deterministic operators then emit the same changes at the same moments. Every
//! field of every node is compared (the match destructures them all, so a field added later
//! cannot be forgotten here). An aggregate is also shared with another that groups the same
//! input by the same keys in another order ([`regrouped`]): q5's two `HOP` counts.

use crate::plan::{AggregateCall, Expr, Node, TimeBound, WindowClose};

fn exprs(a: &[Expr], b: &[Expr]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.as_ref() == y.as_ref())
}

fn bounds(a: &[(Expr, i64)], b: &[(Expr, i64)]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|((x, i), (y, j))| i == j && x.as_ref() == y.as_ref())
}

fn option_expr(a: &Option<Expr>, b: &Option<Expr>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(x), Some(y)) => x.as_ref() == y.as_ref(),
        _ => false,
    }
}

/// DataFusion's own equality of aggregate expressions leaves out DISTINCT, IGNORE NULLS, the
/// order and reversal; they are compared here too.
fn aggregates(a: &[AggregateCall], b: &[AggregateCall]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            let (f, g) = (x.function.as_ref(), y.function.as_ref());
            f == g
                && f.is_distinct() == g.is_distinct()
                && f.ignore_nulls() == g.ignore_nulls()
                && f.is_reversed() == g.is_reversed()
                && f.order_bys() == g.order_bys()
                && option_expr(&x.filter, &y.filter)
        })
}

fn time_bound(a: &TimeBound, b: &TimeBound) -> bool {
    let TimeBound {
        time,
        horizon_micros,
        range,
        own,
        other,
        allowed_micros,
        drop_late,
    } = a;
    time.as_ref() == b.time.as_ref()
        && *horizon_micros == b.horizon_micros
        && *range == b.range
        && *own == b.own
        && *other == b.other
        && *allowed_micros == b.allowed_micros
        && *drop_late == b.drop_late
}

/// Whether `a` and `b` compute the same changes.
pub(crate) fn same(a: &Node, b: &Node) -> bool {
    match (a, b) {
        (
            Node::Source {
                object,
                name,
                schema,
            },
            Node::Source {
                object: o,
                name: n,
                schema: s,
            },
        ) => object == o && name == n && schema == s,
        (
            Node::Filter { input, predicate },
            Node::Filter {
                input: i,
                predicate: p,
            },
        ) => predicate.as_ref() == p.as_ref() && same(input, i),
        (
            Node::Project {
                input,
                exprs: e,
                schema,
            },
            Node::Project {
                input: i,
                exprs: f,
                schema: s,
            },
        ) => schema == s && exprs(e, f) && same(input, i),
        (
            Node::Union { inputs, schema },
            Node::Union {
                inputs: i,
                schema: s,
            },
        ) => {
            schema == s && inputs.len() == i.len() && inputs.iter().zip(i).all(|(x, y)| same(x, y))
        }
        (
            Node::Aggregate {
                input,
                group,
                aggregates: a,
                window,
                append_only,
                schema,
            },
            Node::Aggregate {
                input: i,
                group: g,
                aggregates: b,
                window: w,
                append_only: o,
                schema: s,
            },
        ) => {
            append_only == o
                && window == w
                && schema == s
                && exprs(group, g)
                && aggregates(a, b)
                && same(input, i)
        }
        (
            Node::LateFilter {
                input,
                end,
                time,
                sources,
                lateness,
            },
            Node::LateFilter {
                input: i,
                end: e,
                time: t,
                sources: s,
                lateness: l,
            },
        ) => {
            end.as_ref() == e.as_ref()
                && time.as_ref() == t.as_ref()
                && sources == s
                && lateness == l
                && same(input, i)
        }
        (
            Node::SessionAggregate {
                input,
                group,
                starts,
                ends,
                time,
                gap_micros,
                aggregates: a,
                window,
                schema,
            },
            Node::SessionAggregate {
                input: i,
                group: g,
                starts: st,
                ends: en,
                time: t,
                gap_micros: gap,
                aggregates: b,
                window: w,
                schema: s,
            },
        ) => {
            starts == st
                && ends == en
                && gap_micros == gap
                && window == w
                && schema == s
                && time.as_ref() == t.as_ref()
                && exprs(group, g)
                && aggregates(a, b)
                && same(input, i)
        }
        (
            Node::TemporalFilter { input, from, until },
            Node::TemporalFilter {
                input: i,
                from: f,
                until: u,
            },
        ) => bounds(from, f) && bounds(until, u) && same(input, i),
        (
            Node::Release {
                input,
                time,
                sources,
                lateness,
            },
            Node::Release {
                input: i,
                time: t,
                sources: s,
                lateness: l,
            },
        ) => time.as_ref() == t.as_ref() && sources == s && lateness == l && same(input, i),
        (
            Node::TopN {
                input,
                partition,
                order,
                offset,
                limit,
                rank,
                window,
                append_only,
                schema,
            },
            Node::TopN {
                input: i,
                partition: p,
                order: ord,
                offset: off,
                limit: lim,
                rank: r,
                window: w,
                append_only: a,
                schema: s,
            },
        ) => {
            offset == off
                && limit == lim
                && rank == r
                && window == w
                && append_only == a
                && schema == s
                && exprs(partition, p)
                && order.len() == ord.len()
                && order
                    .iter()
                    .zip(ord)
                    .all(|((x, o), (y, q))| o == q && x.as_ref() == y.as_ref())
                && same(input, i)
        }
        (
            Node::Join {
                kind,
                left,
                right,
                left_keys,
                right_keys,
                filter,
                nulls_equal,
                bounds: time,
                lookup,
                schema,
            },
            Node::Join {
                kind: k,
                left: l,
                right: r,
                left_keys: lk,
                right_keys: rk,
                filter: f,
                nulls_equal: n,
                bounds: t,
                lookup: lu,
                schema: s,
            },
        ) => {
            kind == k
                && nulls_equal == n
                && lookup == lu
                && schema == s
                && option_expr(filter, f)
                && match (time, t) {
                    (None, None) => true,
                    (Some(x), Some(y)) => time_bound(&x[0], &y[0]) && time_bound(&x[1], &y[1]),
                    _ => false,
                }
                && exprs(left_keys, lk)
                && exprs(right_keys, rk)
                && same(left, l)
                && same(right, r)
        }
        _ => false,
    }
}

/// When `b` is an aggregate that `a` computes with its group keys in another order: for each
/// of `b`'s output columns, the column of `a`'s output that holds it.
pub(crate) fn regrouped(a: &Node, b: &Node) -> Option<Vec<usize>> {
    let (
        Node::Aggregate {
            input,
            group,
            aggregates: calls,
            window,
            append_only,
            schema,
        },
        Node::Aggregate {
            input: i,
            group: g,
            aggregates: c,
            window: w,
            append_only: o,
            schema: s,
        },
    ) = (a, b)
    else {
        return None;
    };
    if group.len() != g.len() || append_only != o || !aggregates(calls, c) {
        return None;
    }
    // b's group key k is a's key order[k].
    let mut order = Vec::with_capacity(g.len());
    for key in g {
        let at = group
            .iter()
            .enumerate()
            .position(|(j, e)| e.as_ref() == key.as_ref() && !order.contains(&j))?;
        order.push(at);
    }
    let window_matches = match (window, w) {
        (None, None) => true,
        (Some(x), Some(y)) => {
            order.get(y.key) == Some(&x.key)
                && WindowClose {
                    key: 0,
                    ..x.clone()
                } == WindowClose {
                    key: 0,
                    ..y.clone()
                }
        }
        _ => false,
    };
    let columns: Vec<usize> = order
        .iter()
        .copied()
        .chain(group.len()..group.len() + calls.len())
        .collect();
    let fields_match = columns.len() == s.fields().len()
        && columns.iter().enumerate().all(|(k, &j)| {
            schema.fields().get(j).is_some_and(|f| {
                f.data_type() == s.field(k).data_type()
                    && f.is_nullable() == s.field(k).is_nullable()
            })
        });
    (window_matches && fields_match && same(input, i)).then_some(columns)
}
