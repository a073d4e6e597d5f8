//! A view's dataflow: its plan built as a [`Graph`] of handlers, driven by the engine one
//! change batch and one epoch at a time (ADR 0009, step 2).
//!
//! Entry points: [`build`] and [`Dataflow`]. Invariants:
//! - the graph has one node per distinct plan node, numbered in preorder (a node before its
//!   inputs), so a node's *path* (`0`, `0.1`, `0.1.0`: where the plan first has it) names it
//!   in `eddy_operators` and in checkpoints the same way whatever the graph's shape;
//! - subplans are shared: a plan node equal to one built already (`share::same`: the same
//!   operator, parameters and inputs) is not built again, its readers read the first one's
//!   output; an aggregate equal but for the order of its group keys reads the first through
//!   a projection that reorders the columns (q5's two `HOP` counts run once);
//! - [`Dataflow::end_epoch`] sends the epoch's barrier into every source node; once it returns
//!   every node handled the barrier, so nothing is held back in flight and the accumulated
//!   output equals the query over the accumulated input;
//! - a failed node (an error or a panic in its handler) fails the dataflow: every later call
//!   returns that error.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::RecordBatch;
use eddy_common::{ChangeBatch, Error, ObjectId, Result};

use crate::graph::{Barrier, Graph, Message, NodeId};
use crate::plan::{Expr, Node};
use crate::{EventTime, OperatorStats, Workers, handlers, shard, share, stateless};

/// One node's place in the plan.
struct Place {
    /// `0`, `0.1`, ...: the root, then the input index at each step down.
    path: String,
    /// The nodes feeding this one, in the order of its inputs.
    inputs: Vec<NodeId>,
    /// Copies of the operator, each holding the state of some keys (1: not sharded).
    shards: usize,
}

/// A view's operators as a graph, with the node each table's or view's changes enter at.
pub struct Dataflow {
    graph: Graph,
    sources: Vec<(ObjectId, NodeId)>,
    /// Per node (by id, which is preorder).
    places: Vec<Place>,
    output: NodeId,
    epoch: u64,
}

/// Builds the dataflow of a plan; its window operators read watermarks from `event_time` and
/// record late rows there. With several `workers`, stateful operators with a key (grouped
/// aggregates, equi-joins, partitioned top-N, sessions) run sharded by it across them.
pub fn build(node: &Node, event_time: &Arc<EventTime>, workers: &Workers) -> Result<Dataflow> {
    let mut flow = Dataflow {
        graph: Graph::new(),
        sources: Vec::new(),
        places: Vec::new(),
        output: 0,
        epoch: 0,
    };
    flow.output = flow.add(node, "0".to_owned(), event_time, workers, &mut Vec::new())?;
    flow.graph.collect(flow.output);
    Ok(flow)
}

impl Dataflow {
    /// Adds `node` and what it reads, unless an equal node was built already (`built`): then
    /// that node's output is read again ([`share`]).
    fn add<'a>(
        &mut self,
        node: &'a Node,
        path: String,
        et: &Arc<EventTime>,
        workers: &Workers,
        built: &mut Vec<(&'a Node, NodeId)>,
    ) -> Result<NodeId> {
        if let Some((_, id)) = built.iter().find(|(b, _)| share::same(b, node)) {
            return Ok(*id);
        }
        if let Some((columns, id, of)) = built
            .iter()
            .find_map(|(b, id)| Some((share::regrouped(b, node)?, *id, b.schema())))
        {
            // The same aggregate with its group keys in another order: its columns reordered.
            let exprs = columns
                .iter()
                .map(|&c| -> Expr {
                    Arc::new(datafusion::physical_expr::expressions::Column::new(
                        of.field(c).name(),
                        c,
                    ))
                })
                .collect();
            let schema = node.schema();
            let project = self.graph.add(
                Box::new(stateless::Project {
                    exprs,
                    schema,
                    context: Arc::clone(et),
                }),
                1,
            );
            self.places.push(Place {
                path,
                inputs: vec![id],
                shards: 1,
            });
            self.graph.connect(id, project, 0)?;
            built.push((node, project));
            return Ok(project);
        }
        let inputs = handlers::inputs(node);
        let (handler, shards): (Box<dyn crate::graph::Handler>, usize) = match node {
            Node::Source { object, schema, .. } => (
                Box::new(stateless::Source {
                    object: *object,
                    schema: Arc::clone(schema),
                }),
                1,
            ),
            _ => match (workers.pool(), shard_keys(node)) {
                (Some(pool), Some(keys)) => {
                    let copies = (0..workers.count())
                        .map(|_| handlers::handler(node, et))
                        .collect::<Result<Vec<_>>>()?;
                    let n = copies.len();
                    let sharded = shard::Sharded::new(keys, copies, Arc::clone(pool))?;
                    (Box::new(sharded), n)
                }
                _ => (handlers::handler(node, et)?, 1),
            },
        };
        let id = self.graph.add(handler, inputs.len());
        if let Node::Source { object, .. } = node {
            self.sources.push((*object, id));
        }
        self.places.push(Place {
            path: path.clone(),
            inputs: Vec::new(),
            shards,
        });
        for (port, input) in inputs.into_iter().enumerate() {
            let from = self.add(input, format!("{path}.{port}"), et, workers, built)?;
            self.graph.connect(from, id, port)?;
            self.places[id].inputs.push(from);
        }
        built.push((node, id));
        Ok(id)
    }

    /// Changes to `source` (a table or view id) arrived; returns what the dataflow emits right
    /// away (stateless operators and joins; stateful ones may hold theirs until the epoch
    /// ends).
    pub fn push(&mut self, source: ObjectId, changes: &ChangeBatch) -> Result<Vec<ChangeBatch>> {
        if !changes.is_empty() {
            for i in 0..self.sources.len() {
                let (object, node) = self.sources[i];
                if object == source {
                    self.graph.send(node, 0, Message::Data(changes.clone()));
                }
            }
        }
        self.output()
    }

    /// The watermark of `source` rose to `value`: the mark goes into its source nodes, after
    /// the changes pushed before it (rows pushed later are judged against it). Returns what the
    /// dataflow emits (operators act on marks with the next batch or barrier: nothing, as a
    /// rule).
    pub fn watermark(&mut self, source: ObjectId, value: i64) -> Result<Vec<ChangeBatch>> {
        let mark = crate::graph::Watermark { source, value };
        for i in 0..self.sources.len() {
            let (object, node) = self.sources[i];
            if object == source {
                self.graph.send(node, 0, Message::Watermark(mark));
            }
        }
        self.output()
    }

    /// The epoch ends at `now_micros` (wall-clock µs; `now()` for temporal filters): returns
    /// every change held back. After it returns, the accumulated output equals the query over
    /// the accumulated input.
    pub fn end_epoch(&mut self, now_micros: i64) -> Result<Vec<ChangeBatch>> {
        self.epoch += 1;
        let barrier = Barrier {
            epoch: self.epoch,
            checkpoint: false,
            now_micros,
        };
        for i in 0..self.sources.len() {
            let node = self.sources[i].1;
            self.graph.send(node, 0, Message::Barrier(barrier));
        }
        self.output()
    }

    fn output(&mut self) -> Result<Vec<ChangeBatch>> {
        match self.graph.failure(self.output) {
            Some(e) => Err(e.clone()),
            None => Ok(self.graph.take_output()),
        }
    }

    /// Every operator, parents before their inputs. A source's input is its output.
    pub fn stats(&self) -> Vec<OperatorStats> {
        self.places
            .iter()
            .enumerate()
            .filter_map(|(id, place)| {
                let state = self.graph.handler(id)?.state();
                let rows_in = if place.inputs.is_empty() {
                    self.graph.rows_out(id)
                } else {
                    place.inputs.iter().map(|i| self.graph.rows_out(*i)).sum()
                };
                Some(OperatorStats {
                    path: place.path.clone(),
                    inputs: place
                        .inputs
                        .iter()
                        .map(|i| self.places[*i].path.clone())
                        .collect(),
                    name: crate::plan::readable_intervals(&state.name),
                    rows_in,
                    rows_out: self.graph.rows_out(id),
                    state_rows: state.rows,
                    state_bytes: state.bytes,
                    shards: place.shards,
                })
            })
            .collect()
    }

    /// Every operator's state as named batches (see [`crate::checkpoint`] for the names), at
    /// the end of an epoch.
    pub fn save(&mut self) -> Result<Vec<(String, RecordBatch)>> {
        let mut out = Vec::new();
        for id in 0..self.places.len() {
            let path = self.places[id].path.clone();
            let handler = self.handler(id)?;
            match handler.shards() {
                Some(shards) => {
                    for (i, shard) in shards.iter_mut().enumerate() {
                        for (name, batch) in shard.save()? {
                            out.push((format!("{path}#{i}:{name}"), batch));
                        }
                    }
                }
                None => {
                    for (name, batch) in handler.save()? {
                        out.push((format!("{path}:{name}"), batch));
                    }
                }
            }
        }
        Ok(out)
    }

    /// Restores `parts` (from [`Dataflow::save`] of the same plan) into this freshly built
    /// dataflow. Fails when a part has no operator to take it (a changed plan, or a checkpoint
    /// taken with another number of shards).
    pub fn load(&mut self, parts: Vec<(String, RecordBatch)>) -> Result<()> {
        let by_path: HashMap<&str, NodeId> = self
            .places
            .iter()
            .enumerate()
            .map(|(id, p)| (p.path.as_str(), id))
            .collect();
        let mut targets = Vec::with_capacity(parts.len());
        for (key, batch) in parts {
            let no_operator = || {
                Error::internal(format!(
                    "checkpointed state {key} has no operator in the dataflow"
                ))
            };
            let (place, name) = key.split_once(':').ok_or_else(no_operator)?;
            let (path, shard) = match place.split_once('#') {
                Some((path, shard)) => (
                    path,
                    Some(shard.parse::<usize>().map_err(|_| no_operator())?),
                ),
                None => (place, None),
            };
            let id = *by_path.get(path).ok_or_else(no_operator)?;
            let sharded = self.places[id].shards > 1;
            if sharded != shard.is_some() || shard.is_some_and(|s| s >= self.places[id].shards) {
                return Err(Error::internal(format!(
                    "checkpointed state {key} was taken with another number of shards than {}",
                    self.places[id].shards
                )));
            }
            targets.push((id, shard, name.to_owned(), batch));
        }
        for (id, shard, name, batch) in targets {
            let handler = self.handler(id)?;
            match (shard, handler.shards()) {
                (Some(i), Some(shards)) => match shards.get_mut(i) {
                    Some(copy) => copy.load(&name, &batch)?,
                    None => return Err(Error::internal(format!("no shard {i} of node {id}"))),
                },
                _ => handler.load(&name, &batch)?,
            }
        }
        Ok(())
    }

    fn handler(&mut self, id: NodeId) -> Result<&mut (dyn crate::graph::Handler + 'static)> {
        self.graph
            .handler_mut(id)
            .ok_or_else(|| Error::internal(format!("no node {id}")))
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
    // Every key has a value to route by, of a type the routing hash encodes.
    let routable = keys.iter().zip(handlers::inputs(node)).all(|(k, input)| {
        let schema = input.schema();
        !k.is_empty()
            && k.iter().all(|e| {
                e.data_type(&schema)
                    .is_ok_and(|t| crate::route::routable(&t))
            })
    });
    routable.then_some(keys)
}

/// Tests' restart: saves `flow`'s state, sends every part through an Arrow IPC file (as the
/// engine's checkpoints do), and loads it into the dataflow `rebuild` makes.
#[cfg(test)]
pub(crate) fn restart(flow: &mut Dataflow, rebuild: impl FnOnce() -> Dataflow) {
    let parts = flow.save().unwrap();
    let parts = parts
        .into_iter()
        .map(|(name, batch)| {
            let mut file = Vec::new();
            let mut writer =
                arrow::ipc::writer::FileWriter::try_new(&mut file, &batch.schema()).unwrap();
            writer.write(&batch).unwrap();
            writer.finish().unwrap();
            drop(writer);
            let mut reader =
                arrow::ipc::reader::FileReader::try_new(std::io::Cursor::new(file), None).unwrap();
            (name, reader.next().unwrap().unwrap())
        })
        .collect();
    let mut fresh = rebuild();
    fresh.load(parts).unwrap();
    *flow = fresh;
}
