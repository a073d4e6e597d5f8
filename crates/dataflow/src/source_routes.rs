//! Routing at the sources (ADR 0006's "next step", on the worker pool): a keyed operator with
//! one input whose rows reach it from its sources through a union — a HOP window is the union
//! of one projection per window — is fed by routing the *sources'* rows by the key columns
//! that pass through unchanged, instead of routing the multiplied rows at its input. Each
//! source row is then hashed once, not once per window (q5's bids five times), and the union
//! and projections run on the worker that owns the key.
//!
//! The operator's state is still split by a hash of its key, of the positions that pass
//! through (`Place::route_positions`): rows with equal keys agree on those, so they meet in one
//! copy. The pass applies only where nothing else reads any node on the way (each node is
//! read only by nodes on the paths traced: a HOP's source by each of its projections), every
//! path keeps the same key positions, and a source read by several paths gives the same
//! columns on each.

use std::sync::Arc;

use datafusion::physical_expr::expressions::Column;

use super::{Dataflow, Shape};
use crate::graph::{NodeId, Route};
use crate::plan::Expr;
use eddy_common::Result;

/// The input column `e` is, if it is one.
fn column(e: &Expr) -> Option<usize> {
    let any: &dyn std::any::Any = e.as_ref();
    any.downcast_ref::<Column>().map(Column::index)
}

impl Dataflow {
    /// Moves the exchange of each eligible keyed operator down to its sources.
    pub(super) fn route_at_sources(&mut self) -> Result<()> {
        if self.copies.len() <= 1 {
            return Ok(());
        }
        for id in 0..self.places.len() {
            let Some(keys) = self.places[id].single_input_keys.clone() else {
                continue;
            };
            let &[input] = self.places[id].inputs.as_slice() else {
                continue;
            };
            // Key position -> column of the input's output, for the keys that are columns.
            let columns: Vec<(usize, usize)> = keys
                .iter()
                .enumerate()
                .filter_map(|(p, e)| Some((p, column(e)?)))
                .collect();
            let mut sources = Vec::new();
            let mut union = false;
            let mut visits: Vec<NodeId> = Vec::new();
            let Some(kept) = self.trace(input, columns, &mut sources, &mut union, &mut visits)
            else {
                continue;
            };
            if kept.is_empty() || !union {
                continue;
            }
            // Nothing outside the paths reads a node on them.
            let read_elsewhere = visits.iter().any(|node| {
                self.copies[0]
                    .readers(*node)
                    .iter()
                    .any(|r| *r != id && !visits.contains(r))
            });
            // A source reached by several paths routes by the same columns on each.
            sources.sort_by_key(|(node, _)| *node);
            let agree = sources
                .windows(2)
                .all(|w| w[0].0 != w[1].0 || w[0].1 == w[1].1);
            sources.dedup_by_key(|(node, _)| *node);
            if read_elsewhere || !agree {
                continue;
            }
            let positions: Vec<usize> = kept.iter().map(|(p, _)| *p).collect();
            if sources
                .iter()
                .any(|(_, cols)| cols.iter().map(|(p, _)| *p).ne(positions.iter().copied()))
            {
                continue;
            }
            for (source, columns) in &sources {
                let schema = self.source_schema(*source);
                let exprs: Vec<Expr> = columns
                    .iter()
                    .map(|(_, c)| -> Expr {
                        let name = schema.as_ref().map_or("", |s| s.field(*c).name().as_str());
                        Arc::new(Column::new(name, *c))
                    })
                    .collect();
                self.source_routes.push((*source, exprs));
            }
            for copy in &mut self.copies {
                copy.reroute(input, id, 0, Route::Local, 1)?;
            }
            self.places[id].route_positions = Some(positions);
        }
        Ok(())
    }

    /// Follows `columns` ((key position, column) pairs over `node`'s output) down to the
    /// sources; the positions that reach every source unchanged, with the source columns in
    /// `sources`. `None`: a node on the way is read by another, or is not a row-by-row one.
    fn trace(
        &self,
        node: NodeId,
        columns: Vec<(usize, usize)>,
        sources: &mut Vec<(NodeId, Vec<(usize, usize)>)>,
        union: &mut bool,
        visits: &mut Vec<NodeId>,
    ) -> Option<Vec<(usize, usize)>> {
        if self.source_routes.iter().any(|(s, _)| *s == node) {
            return None;
        }
        visits.push(node);
        let place = &self.places[node];
        match &place.shape {
            Shape::Source => {
                sources.push((node, columns.clone()));
                Some(columns)
            }
            Shape::Pass => self.trace(*place.inputs.first()?, columns, sources, union, visits),
            Shape::Project(exprs) => {
                let below = columns
                    .into_iter()
                    .filter_map(|(p, c)| {
                        let e = exprs.get(c)?;
                        Some((p, column(e)?))
                    })
                    .collect();
                self.trace(*place.inputs.first()?, below, sources, union, visits)
            }
            Shape::Union => {
                *union = true;
                let mut kept: Option<Vec<usize>> = None;
                let start = sources.len();
                for input in &place.inputs {
                    let got = self.trace(*input, columns.clone(), sources, union, visits)?;
                    let positions: Vec<usize> = got.iter().map(|(p, _)| *p).collect();
                    kept = Some(match kept {
                        None => positions,
                        Some(k) => k.into_iter().filter(|p| positions.contains(p)).collect(),
                    });
                }
                let kept = kept?;
                // Every source routes by the same key positions, in the same order.
                for (_, cols) in &mut sources[start..] {
                    cols.retain(|(p, _)| kept.contains(p));
                }
                Some(
                    columns
                        .into_iter()
                        .filter(|(p, _)| kept.contains(p))
                        .collect(),
                )
            }
            Shape::Other => None,
        }
    }

    fn source_schema(&self, node: NodeId) -> Option<arrow::datatypes::SchemaRef> {
        self.source_schemas
            .iter()
            .find(|(id, _)| *id == node)
            .map(|(_, s)| Arc::clone(s))
    }
}

#[cfg(test)]
impl Dataflow {
    /// How many source nodes route their rows by key.
    pub(crate) fn routed_at_sources(&self) -> usize {
        self.source_routes.len()
    }
}
