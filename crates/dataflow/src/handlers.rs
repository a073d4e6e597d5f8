//! What each plan node runs as: its [`Handler`] and the nodes it reads. The operator tree
//! ([`crate::build`]) and the dataflow graph ([`crate::graph::from_plan`]) both build their
//! operators here.

use std::sync::Arc;

use eddy_common::{Error, Result};

use crate::graph::Handler;
use crate::plan::{self, Node};
use crate::{
    EventTime, aggregate, event_time, join, outer_join, session, stateless, temporal, topn,
};

/// The nodes `node` reads, in the order of its inputs.
pub(crate) fn inputs(node: &Node) -> Vec<&Node> {
    match node {
        Node::Source { .. } => Vec::new(),
        Node::Union { inputs, .. } => inputs.iter().collect(),
        Node::Join { left, right, .. } => vec![left.as_ref(), right.as_ref()],
        Node::Filter { input, .. }
        | Node::Project { input, .. }
        | Node::TemporalFilter { input, .. }
        | Node::Release { input, .. }
        | Node::LateFilter { input, .. }
        | Node::Aggregate { input, .. }
        | Node::SessionAggregate { input, .. }
        | Node::TopN { input, .. } => vec![input.as_ref()],
    }
}

/// The operator of every node but a source; window operators read watermarks from `et` and
/// record late rows there.
pub(crate) fn handler(node: &Node, et: &Arc<EventTime>) -> Result<Box<dyn Handler>> {
    Ok(match node {
        Node::Source { .. } => {
            return Err(Error::internal("a source is not an operator"));
        }
        Node::Filter { predicate, .. } => Box::new(stateless::Filter {
            predicate: predicate.clone(),
            context: Arc::clone(et),
        }),
        Node::Project { exprs, schema, .. } => Box::new(stateless::Project {
            exprs: exprs.clone(),
            schema: schema.clone(),
            context: Arc::clone(et),
        }),
        Node::Union { schema, .. } => Box::new(stateless::Union {
            schema: schema.clone(),
        }),
        Node::TemporalFilter { input, from, until } => {
            et.needs_ticks();
            Box::new(temporal::TemporalFilter::new(
                &input.schema(),
                from.clone(),
                until.clone(),
            )?)
        }
        Node::Release {
            time,
            sources,
            lateness,
            ..
        } => Box::new(event_time::Release::new(
            time.clone(),
            sources.clone(),
            *lateness,
            Arc::clone(et),
        )),
        Node::LateFilter {
            end,
            time,
            sources,
            lateness,
            ..
        } => Box::new(event_time::LateFilter {
            end: end.clone(),
            time: time.clone(),
            sources: sources.clone(),
            lateness: *lateness,
            event_time: Arc::clone(et),
            marks: event_time::Marks::default(),
        }),
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
        } => Box::new(topn::TopN::new(
            input.schema(),
            partition.clone(),
            order.clone(),
            (*offset, *limit),
            *rank,
            window.clone().map(|w| (w, Arc::clone(et))),
            *append_only,
            schema.clone(),
        )?),
        Node::Aggregate {
            input,
            group,
            aggregates,
            window,
            append_only,
            schema,
        } => Box::new(aggregate::Aggregate::new(
            &input.schema(),
            group.clone(),
            aggregates.clone(),
            window.clone().map(|w| (w, Arc::clone(et))),
            *append_only,
            schema.clone(),
        )?),
        Node::SessionAggregate {
            input,
            group,
            starts,
            ends,
            time,
            gap_micros,
            aggregates,
            window,
            schema,
        } => Box::new(session::SessionAggregate::new(
            &input.schema(),
            session::Spec {
                group: group.clone(),
                starts: starts.clone(),
                ends: ends.clone(),
                time: time.clone(),
                gap_micros: *gap_micros,
            },
            aggregates.clone(),
            window.clone().map(|w| (w, Arc::clone(et))),
            schema.clone(),
        )?),
        Node::Join {
            kind,
            left,
            right,
            left_keys,
            right_keys,
            filter,
            nulls_equal,
            schema,
            bounds,
            lookup: false,
        } if *kind != plan::JoinKind::Inner => {
            let mut join = outer_join::OuterJoin::new(
                *kind,
                *nulls_equal,
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
            schema,
        } => {
            let mut join = join::InnerJoin::new(
                *nulls_equal,
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
