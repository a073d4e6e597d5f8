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
pub mod checkpoint;

/// A hash map for operator state: foldhash instead of std's SipHash (keys are Eddy's own
/// row encodings, and the state maps are on every row's path).
pub(crate) type StateMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
pub(crate) type StateSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;
mod aggregate_call;
#[cfg(test)]
mod aggregate_tests;
#[cfg(test)]
mod aggregate_typed_tests;
pub mod decimal;
pub mod event_time;
mod exact_sum;
pub mod graph;
mod handlers;
mod join;
#[cfg(test)]
mod join_tests;
mod outer_join;
pub mod plan;
mod rows;
pub use rows::{consolidate, partition_by_key};
mod session;
mod shard;
pub use shard::Workers;
mod stateless;
mod temporal;
mod topn;
mod tree;

use eddy_common::{ChangeBatch, ObjectId, Result};
use plan::Expr;

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

    /// How many shards (copies, each with the state of some keys) the operator runs as.
    fn shards(&self) -> usize {
        1
    }

    /// The operators feeding this one, to walk into them (saving and loading state).
    fn children_mut(&mut self) -> Vec<&mut dyn Operator>;

    /// The operator's own state as named Arrow batches, at the end of an epoch (stateless
    /// operators have none).
    fn save_state(&mut self) -> Result<checkpoint::Parts> {
        Ok(Vec::new())
    }

    /// Takes back one part of what [`Operator::save_state`] returned, into a freshly built
    /// operator.
    fn load_state(&mut self, name: &str, _batch: &arrow::array::RecordBatch) -> Result<()> {
        Err(checkpoint::unknown_part(&self.state().name, name))
    }

    /// Saves this operator's state and its inputs' under `path` (see [`checkpoint::save`]).
    fn save_tree(
        &mut self,
        path: &str,
        out: &mut Vec<(String, arrow::array::RecordBatch)>,
    ) -> Result<()> {
        checkpoint::save_walk(self, path, out)
    }

    /// Loads what [`Operator::save_tree`] saved under `path`.
    fn load_tree(
        &mut self,
        path: &str,
        parts: &mut std::collections::HashMap<String, arrow::array::RecordBatch>,
    ) -> Result<()> {
        checkpoint::load_walk(self, path, parts)
    }
}

/// The operators a node owns as its inputs, for [`Operator::children`].
pub(crate) fn inputs_of(inputs: &[Box<dyn Operator>]) -> Vec<&dyn Operator> {
    inputs.iter().map(|i| i.as_ref()).collect()
}

/// [`inputs_of`], to walk into them ([`Operator::children_mut`]).
pub(crate) fn inputs_of_mut(inputs: &mut [Box<dyn Operator>]) -> Vec<&mut dyn Operator> {
    inputs
        .iter_mut()
        .map(|i| i.as_mut() as &mut dyn Operator)
        .collect()
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

    fn shards(&self) -> usize {
        self.inner.shards()
    }

    fn children_mut(&mut self) -> Vec<&mut dyn Operator> {
        self.inner.children_mut()
    }

    fn save_tree(
        &mut self,
        path: &str,
        out: &mut Vec<(String, arrow::array::RecordBatch)>,
    ) -> Result<()> {
        self.inner.save_tree(path, out)
    }

    fn load_tree(
        &mut self,
        path: &str,
        parts: &mut std::collections::HashMap<String, arrow::array::RecordBatch>,
    ) -> Result<()> {
        self.inner.load_tree(path, parts)
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
        OperatorState {
            name,
            rows: 0,
            bytes: 0,
        }
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
    /// Shards the operator runs as (1: not sharded).
    pub shards: usize,
}

/// Every operator of a dataflow, parents before children. A source's input is its output.
pub fn stats(root: &dyn Operator) -> Vec<OperatorStats> {
    fn walk(op: &dyn Operator, path: String, out: &mut Vec<OperatorStats>) {
        let state = op.state();
        let children = op.children();
        let rows_in = if children.is_empty() {
            op.rows_out()
        } else {
            children.iter().map(|c| c.rows_out()).sum()
        };
        let name = plan::readable_intervals(&state.name);
        out.push(OperatorStats {
            path: path.clone(),
            name,
            rows_in,
            rows_out: op.rows_out(),
            state_rows: state.rows,
            state_bytes: state.bytes,
            shards: op.shards(),
        });
        for (i, child) in children.into_iter().enumerate() {
            walk(child, format!("{path}.{i}"), out);
        }
    }
    let mut out = Vec::new();
    walk(root, "0".to_owned(), &mut out);
    out
}

/// Builds the operator tree of a plan; its window operators read watermarks from `event_time`
/// and record late rows there. With several `workers`, stateful operators with a key (grouped
/// aggregates, equi-joins, partitioned top-N) are sharded by it across them.
pub fn build(
    node: &Node,
    event_time: &Arc<EventTime>,
    workers: &Workers,
) -> Result<Box<dyn Operator>> {
    Ok(Box::new(Instrumented {
        inner: build_bare(node, event_time, workers)?,
        rows_out: 0,
    }))
}

fn build_bare(node: &Node, et: &Arc<EventTime>, workers: &Workers) -> Result<Box<dyn Operator>> {
    if let Some(inputs) = stateful_inputs(node) {
        let built = inputs
            .iter()
            .map(|i| build(i, et, workers))
            .collect::<Result<Vec<_>>>()?;
        if let (Some(pool), Some(keys)) = (workers.pool(), shard_keys(node)) {
            let shards = (0..workers.count())
                .map(|_| {
                    let stubs = inputs
                        .iter()
                        .zip(shard::SHARD_INPUTS)
                        .map(|(input, object)| {
                            Box::new(stateless::Source {
                                object,
                                schema: input.schema(),
                            }) as Box<dyn Operator>
                        })
                        .collect();
                    build_stateful(node, stubs, et)
                })
                .collect::<Result<Vec<_>>>()?;
            return Ok(Box::new(shard::Sharded::new(
                built,
                keys,
                shards,
                Arc::clone(pool),
            )?));
        }
        return build_stateful(node, built, et);
    }
    Ok(match node {
        Node::Source { object, schema, .. } => Box::new(stateless::Source {
            object: *object,
            schema: Arc::clone(schema),
        }),
        _ => Box::new(tree::TreeNode::new(
            handlers::handler(node, et)?,
            handlers::inputs(node)
                .into_iter()
                .map(|i| build(i, et, workers))
                .collect::<Result<_>>()?,
        )),
    })
}

/// The inputs of the operators that keep state by key (and may be sharded).
fn stateful_inputs(node: &Node) -> Option<Vec<&Node>> {
    match node {
        Node::Aggregate { input, .. }
        | Node::SessionAggregate { input, .. }
        | Node::TopN { input, .. } => Some(vec![input.as_ref()]),
        Node::Join { left, right, .. } => Some(vec![left.as_ref(), right.as_ref()]),
        _ => None,
    }
}

/// Per input, the expressions whose values decide a row's shard; `None` when the operator
/// has no key to shard by (a global aggregate or top-N, a join without equalities).
fn shard_keys(node: &Node) -> Option<Vec<Vec<Expr>>> {
    let keys = match node {
        Node::Aggregate { group, .. } => vec![group.clone()],
        Node::SessionAggregate {
            group,
            starts,
            ends,
            ..
        } => {
            vec![
                group
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| !starts.contains(i) && !ends.contains(i))
                    .map(|(_, e)| e.clone())
                    .collect(),
            ]
        }
        Node::TopN { partition, .. } => vec![partition.clone()],
        Node::Join {
            left_keys,
            right_keys,
            ..
        } => vec![left_keys.clone(), right_keys.clone()],
        _ => return None,
    };
    keys.iter().all(|k| !k.is_empty()).then_some(keys)
}

/// Builds a stateful operator over already built `inputs` (see [`stateful_inputs`]).
fn build_stateful(
    node: &Node,
    inputs: Vec<Box<dyn Operator>>,
    et: &Arc<EventTime>,
) -> Result<Box<dyn Operator>> {
    Ok(Box::new(tree::TreeNode::new(
        handlers::handler(node, et)?,
        inputs,
    )))
}
