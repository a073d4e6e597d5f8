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
#[cfg(test)]
mod aggregate_tests;
mod join;
#[cfg(test)]
mod join_tests;
mod outer_join;
pub mod plan;
mod rows;
pub use rows::consolidate;
mod stateless;
mod topn;

use eddy_common::{ChangeBatch, ObjectId, Result};

pub use plan::Node;

/// One node of a view's dataflow, owning its inputs.
pub trait Operator: Send {
    /// Changes to `source` (a table or view id) arrived. Returns the changes this operator
    /// emits right away (stateless operators and joins); stateful operators may hold their
    /// output back until [`Operator::end_epoch`].
    fn push(&mut self, source: ObjectId, changes: &ChangeBatch) -> Result<Vec<ChangeBatch>>;

    /// The epoch ends: returns every change held back. After it returns, the accumulated output
    /// equals the query over the accumulated input.
    fn end_epoch(&mut self) -> Result<Vec<ChangeBatch>>;

    /// A one-line description for EXPLAIN and `eddy_operators`.
    fn describe(&self) -> String;
}

/// Builds the operator tree of a plan.
pub fn build(node: &Node) -> Result<Box<dyn Operator>> {
    Ok(match node {
        Node::Source { object, .. } => Box::new(stateless::Source { object: *object }),
        Node::Filter { input, predicate } => Box::new(stateless::Filter { input: build(input)?, predicate: predicate.clone() }),
        Node::Project { input, exprs, schema } => {
            Box::new(stateless::Project { input: build(input)?, exprs: exprs.clone(), schema: schema.clone() })
        }
        Node::TopN { input, partition, order, offset, limit, rank, schema } => Box::new(topn::TopN::new(
            build(input)?,
            input.schema(),
            partition.clone(),
            order.clone(),
            (*offset, *limit),
            *rank,
            schema.clone(),
        )?),
        Node::Union { inputs, schema } => Box::new(stateless::Union {
            inputs: inputs.iter().map(build).collect::<Result<_>>()?,
            schema: schema.clone(),
        }),
        Node::Aggregate { input, group, aggregates, schema } => {
            Box::new(aggregate::Aggregate::new(build(input)?, &input.schema(), group.clone(), aggregates.clone(), schema.clone())?)
        }
        Node::Join { kind, left, right, left_keys, right_keys, filter, nulls_equal, schema } if *kind != plan::JoinKind::Inner => Box::new(outer_join::OuterJoin::new(
            *kind,
            *nulls_equal,
            build(left)?,
            build(right)?,
            left.schema(),
            right.schema(),
            left_keys.clone(),
            right_keys.clone(),
            filter.clone(),
            schema.clone(),
        )?),
        Node::Join { left, right, left_keys, right_keys, filter, nulls_equal, schema, .. } => Box::new(join::InnerJoin::new(
            *nulls_equal,
            build(left)?,
            build(right)?,
            left.schema(),
            right.schema(),
            left_keys.clone(),
            right_keys.clone(),
            filter.clone(),
            schema.clone(),
        )?),
    })
}
