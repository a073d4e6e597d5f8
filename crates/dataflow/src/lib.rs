//! Incremental dataflow over Arrow batches of changes: the plan IR, the operators as message
//! handlers ([`graph::Handler`]) and the graph that runs them.
//!
//! Entry points: [`plan::Node`] (built by `eddy-sql` from a DataFusion logical plan) and
//! [`build`], which turns a plan into a [`Dataflow`]: a graph of operators. Operators are
//! synchronous and never touch disk; the engine's runtime owns the dataflows, feeds them
//! changes and ends epochs. Invariants: every operator's accumulated output equals its query
//! over its accumulated input (checked by oracle tests); a dataflow holds back nothing once
//! [`Dataflow::end_epoch`] returned.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod aggregate;
mod arena;
pub mod arrangement;
pub mod checkpoint;

mod aggregate_call;
#[cfg(test)]
mod aggregate_tests;
#[cfg(test)]
mod aggregate_typed_tests;
pub mod decimal;
pub mod event_time;
mod exact_sum;
mod flow;
pub use flow::{Dataflow, build};
pub mod graph;
mod handlers;
mod join;
#[cfg(test)]
mod join_tests;
mod outer_join;
mod packed;
pub mod plan;
pub mod route;
mod rows;
pub use rows::{consolidate, partition_by_key};
mod pool;
mod session;
pub mod spill;
pub use pool::Workers;
mod share;
#[cfg(test)]
mod source_routes_tests;
mod stateless;
mod temporal;
#[cfg(test)]
mod temporal_tests;
mod topn;
#[cfg(test)]
mod topn_tests;

pub use event_time::{EventTime, LateEvent};
pub use plan::Node;

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
    /// Position in the plan: `0`, `0.1`, `0.1.0`, ... (where the plan first has it).
    pub path: String,
    /// The positions of the operators it reads, in the order of its inputs (a shared
    /// operator is read from its own position, which may lie under another parent).
    pub inputs: Vec<String>,
    pub name: String,
    pub rows_in: u64,
    pub rows_out: u64,
    pub state_rows: usize,
    pub state_bytes: usize,
    /// Rows of its state on disk, not in memory (ADR 0012).
    pub spilled_rows: usize,
    /// Shards the operator runs as (1: not sharded).
    pub shards: usize,
}
