//! Incremental dataflow over Arrow batches of changes: the plan IR, the [`Operator`] trait and
//! the operators.
//!
//! Entry points: [`plan::Node`] (built by `eddy-sql` from a DataFusion logical plan) and
//! [`build`], which turns a plan into a tree of operators. Operators are synchronous and never
//! touch disk; the engine's runtime owns them, feeds them changes and ends epochs.
//! Invariants: every operator's accumulated output equals its query over its accumulated input
//! (checked by oracle tests); an operator holds back nothing once [`Operator::end_epoch`]
//! returned.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod aggregate;

/// A hash map for operator state: foldhash instead of std's SipHash (keys are Eddy's own
/// row encodings, and the state maps are on every row's path).
pub(crate) type StateMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
pub(crate) type StateSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;
pub mod event_time;
#[cfg(test)]
mod aggregate_tests;
mod join;
#[cfg(test)]
mod join_tests;
mod outer_join;
pub mod plan;
mod rows;
pub use rows::{consolidate, partition_by_key};
mod session;
mod stateless;
mod temporal;
mod topn;

use eddy_common::{ChangeBatch, ObjectId, Result};

pub use event_time::{EventTime, LateEvent};
pub use plan::Node;

use std::sync::Arc;

// `stats` and `OperatorStats` report what `eddy_operators` shows.

/// One node of a view's dataflow, owning its inputs.
pub trait Operator: Send {
    /// Changes to `source` (a table or view id) arrived. Returns the changes this operator
    /// emits right away (stateless operators and joins); stateful operators may hold their
    /// output back until [`Operator::end_epoch`].
    fn push(&mut self, source: ObjectId, changes: &ChangeBatch) -> Result<Vec<ChangeBatch>>;

    /// The epoch ends: returns every change held back. After it returns, the accumulated output
    /// equals the query over the accumulated input.
    fn end_epoch(&mut self) -> Result<Vec<ChangeBatch>>;

    /// The operator's name and the state it holds (`eddy_operators`).
    fn state(&self) -> OperatorState;

    /// The operators feeding this one.
    fn children(&self) -> Vec<&dyn Operator>;

    /// Rows this operator has emitted so far (counted by [`build`]'s instrumentation).
    fn rows_out(&self) -> u64 {
        0
    }
}

/// Counts the rows an operator emits; [`build`] wraps every operator in one.
struct Instrumented {
    inner: Box<dyn Operator>,
    rows_out: u64,
}

impl Instrumented {
    fn count(&mut self, out: Result<Vec<ChangeBatch>>) -> Result<Vec<ChangeBatch>> {
        let out = out?;
        self.rows_out += out.iter().map(|b| b.len() as u64).sum::<u64>();
        Ok(out)
    }
}

impl Operator for Instrumented {
    fn push(&mut self, source: ObjectId, changes: &ChangeBatch) -> Result<Vec<ChangeBatch>> {
        let out = self.inner.push(source, changes);
        self.count(out)
    }

    fn end_epoch(&mut self) -> Result<Vec<ChangeBatch>> {
        let out = self.inner.end_epoch();
        self.count(out)
    }

    fn state(&self) -> OperatorState {
        self.inner.state()
    }

    fn children(&self) -> Vec<&dyn Operator> {
        self.inner.children()
    }

    fn rows_out(&self) -> u64 {
        self.rows_out
    }
}

/// What an operator holds: its name, rows of state and their approximate size in memory
/// (payload bytes plus per-entry bookkeeping; not allocator slack).
#[derive(Debug, Clone, Default)]
pub struct OperatorState {
    pub name: String,
    pub rows: usize,
    pub bytes: usize,
}

impl OperatorState {
    pub fn stateless(name: String) -> Self {
        OperatorState { name, rows: 0, bytes: 0 }
    }
}

/// One operator of a dataflow, for `eddy_operators`.
#[derive(Debug, Clone)]
pub struct OperatorStats {
    /// Position in the tree: `0`, `0.1`, `0.1.0`, ...
    pub path: String,
    pub name: String,
    pub rows_in: u64,
    pub rows_out: u64,
    pub state_rows: usize,
    pub state_bytes: usize,
}

/// Every operator of a dataflow, parents before children. A source's input is its output.
pub fn stats(root: &dyn Operator) -> Vec<OperatorStats> {
    fn walk(op: &dyn Operator, path: String, out: &mut Vec<OperatorStats>) {
        let state = op.state();
        let children = op.children();
        let rows_in = if children.is_empty() { op.rows_out() } else { children.iter().map(|c| c.rows_out()).sum() };
        let name = plan::readable_intervals(&state.name);
        out.push(OperatorStats { path: path.clone(), name, rows_in, rows_out: op.rows_out(), state_rows: state.rows, state_bytes: state.bytes });
        for (i, child) in children.into_iter().enumerate() {
            walk(child, format!("{path}.{i}"), out);
        }
    }
    let mut out = Vec::new();
    walk(root, "0".to_owned(), &mut out);
    out
}

/// Builds the operator tree of a plan.
/// Builds the operator tree of a plan; its window operators read watermarks from `event_time`
/// and record late rows there.
pub fn build(node: &Node, event_time: &Arc<EventTime>) -> Result<Box<dyn Operator>> {
    Ok(Box::new(Instrumented { inner: build_bare(node, event_time)?, rows_out: 0 }))
}

fn build_bare(node: &Node, et: &Arc<EventTime>) -> Result<Box<dyn Operator>> {
    Ok(match node {
        Node::Source { object, schema, .. } => Box::new(stateless::Source { object: *object, schema: Arc::clone(schema) }),
        Node::Filter { input, predicate } => {
            Box::new(stateless::Filter { input: build(input, et)?, predicate: predicate.clone(), context: Arc::clone(et) })
        }
        Node::Project { input, exprs, schema } => {
            Box::new(stateless::Project { input: build(input, et)?, exprs: exprs.clone(), schema: schema.clone(), context: Arc::clone(et) })
        }
        Node::TopN { input, partition, order, offset, limit, rank, window, schema } => Box::new(topn::TopN::new(
            build(input, et)?,
            input.schema(),
            partition.clone(),
            order.clone(),
            (*offset, *limit),
            *rank,
            window.clone().map(|w| (w, Arc::clone(et))),
            schema.clone(),
        )?),
        Node::Union { inputs, schema } => Box::new(stateless::Union {
            inputs: inputs.iter().map(|i| build(i, et)).collect::<Result<_>>()?,
            schema: schema.clone(),
        }),
        Node::Aggregate { input, group, aggregates, window, append_only, schema } => Box::new(aggregate::Aggregate::new(
            build(input, et)?,
            &input.schema(),
            group.clone(),
            aggregates.clone(),
            window.clone().map(|w| (w, Arc::clone(et))),
            *append_only,
            schema.clone(),
        )?),
        Node::SessionAggregate { input, group, starts, ends, time, gap_micros, aggregates, window, schema } => Box::new(session::SessionAggregate::new(
            build(input, et)?,
            &input.schema(),
            session::Spec { group: group.clone(), starts: starts.clone(), ends: ends.clone(), time: time.clone(), gap_micros: *gap_micros },
            aggregates.clone(),
            window.clone().map(|w| (w, Arc::clone(et))),
            schema.clone(),
        )?),
        Node::TemporalFilter { input, from, until } => {
            et.needs_ticks();
            Box::new(temporal::TemporalFilter::new(build(input, et)?, &input.schema(), from.clone(), until.clone())?)
        }
        Node::Release { input, time, sources, lateness } => Box::new(event_time::Release::new(build(input, et)?, time.clone(), sources.clone(), *lateness, Arc::clone(et))),
        Node::LateFilter { input, end, time, sources, lateness } => Box::new(event_time::LateFilter {
            input: build(input, et)?,
            end: end.clone(),
            time: time.clone(),
            sources: sources.clone(),
            lateness: *lateness,
            event_time: Arc::clone(et),
            dropped: 0,
        }),
        Node::Join { kind, left, right, left_keys, right_keys, filter, nulls_equal, schema, bounds, lookup: false } if *kind != plan::JoinKind::Inner => {
            let mut join = outer_join::OuterJoin::new(
                *kind,
                *nulls_equal,
                build(left, et)?,
                build(right, et)?,
                left.schema(),
                right.schema(),
                left_keys.clone(),
                right_keys.clone(),
                filter.clone(),
                schema.clone(),
            )?;
            if let Some(bounds) = bounds {
                join.bound_by_time(bounds.as_ref().clone(), Arc::clone(et));
            }
            Box::new(join)
        }
        Node::Join { kind, left, right, left_keys, right_keys, filter, nulls_equal, bounds, lookup, schema } => {
            let mut join = join::InnerJoin::new(
                *nulls_equal,
                build(left, et)?,
                build(right, et)?,
                left.schema(),
                right.schema(),
                left_keys.clone(),
                right_keys.clone(),
                filter.clone(),
                schema.clone(),
            )?;
            if let Some(bounds) = bounds {
                let [l, r] = bounds.as_ref().clone();
                join.bound_by_time(l, r, Arc::clone(et));
            }
            if *lookup {
                join.lookup(*kind == plan::JoinKind::Left);
            }
            Box::new(join)
        }
    })
}
