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

use std::sync::Arc;

use eddy_common::{ChangeBatch, Error, ObjectId, Result, SqlState};

use crate::graph::{Barrier, Delivery, Graph, Handler, Message, NodeId, Route};
use crate::plan::{Expr, Node};
use crate::pool::{PARALLEL_ROWS, run_rounds};
use crate::{EventTime, OperatorStats, Workers, handlers, share, stateless};

/// One node's place in the plan.
struct Place {
    /// `0`, `0.1`, ...: the root, then the input index at each step down.
    path: String,
    /// The nodes feeding this one, in the order of its inputs.
    inputs: Vec<NodeId>,
    /// The copies the node runs as: one per worker, or 1 (on worker 0 only).
    shards: usize,
    /// How the node passes its input's columns on ([`source_routes`]).
    shape: Shape,
    /// A keyed operator with one input, sharded on several workers: its key.
    single_input_keys: Option<Vec<Expr>>,
    /// The positions of the key its copies are split by when its rows are routed at the
    /// sources (`None`: by the whole key, at its input).
    route_positions: Option<Vec<usize>>,
}

/// What a node does with its input's columns, as far as routing at the sources cares.
enum Shape {
    Source,
    /// Rows pass with their columns as they are (filter, late filter).
    Pass,
    /// The output's columns are these expressions over the input's.
    Project(Vec<Expr>),
    /// Every input's rows, columns as they are.
    Union,
    Other,
}

impl Shape {
    fn of(node: &Node) -> Shape {
        match node {
            Node::Source { .. } => Shape::Source,
            Node::Filter { .. } | Node::LateFilter { .. } => Shape::Pass,
            Node::Project { exprs, .. } => Shape::Project(exprs.clone()),
            Node::Union { .. } => Shape::Union,
            _ => Shape::Other,
        }
    }
}

#[path = "source_routes.rs"]
mod source_routes;

#[path = "flow_save.rs"]
mod save;
#[cfg(test)]
pub(crate) use save::{TestCheckpoints, restart};

/// A view's operators as a graph — one copy per worker — with the node each table's or
/// view's changes enter at.
pub struct Dataflow {
    /// Per worker, its copy of the graph (node ids are the same in every copy).
    copies: Vec<Graph>,
    workers: Workers,
    sources: Vec<(ObjectId, NodeId)>,
    source_schemas: Vec<(NodeId, arrow::datatypes::SchemaRef)>,
    /// Source nodes whose rows go to the worker a hash of these columns picks (routing at the
    /// sources); the others' batches are cut into slices.
    source_routes: Vec<(NodeId, Vec<Expr>)>,
    /// Per node (by id, which is preorder).
    places: Vec<Place>,
    output: NodeId,
    epoch: u64,
    failed: Option<Error>,
    /// The most rows of state any one operator may hold ([`Dataflow::limit_state_rows`]).
    max_state_rows: Option<u64>,
}

/// Builds the dataflow of a plan; its window operators read watermarks from `event_time` and
/// record late rows there. With several `workers` the graph runs as one copy per worker:
/// sources, filters and projections in every copy on its share of the rows, stateful operators
/// with a key (grouped aggregates, equi-joins, partitioned top-N, sessions) sharded by it
/// behind an exchange, and operators without a key once, on worker 0.
pub fn build(node: &Node, event_time: &Arc<EventTime>, workers: &Workers) -> Result<Dataflow> {
    let n = workers.count().max(1);
    let mut flow = Dataflow {
        copies: (0..n).map(|w| Graph::on_worker(w, n)).collect(),
        workers: workers.clone(),
        sources: Vec::new(),
        source_schemas: Vec::new(),
        source_routes: Vec::new(),
        places: Vec::new(),
        output: 0,
        epoch: 0,
        failed: None,
        max_state_rows: None,
    };
    flow.output = flow.add(node, "0".to_owned(), event_time, &mut Vec::new())?;
    flow.route_at_sources()?;
    for copy in &mut flow.copies {
        copy.collect(flow.output);
    }
    Ok(flow)
}

/// Whether `node` runs in every copy of a graph on `n` workers: sources, row-by-row
/// operators over such inputs, and keyed stateful operators (behind an exchange).
fn spreads(node: &Node, n: usize) -> bool {
    if n <= 1 {
        return false;
    }
    match node {
        Node::Source { .. } => true,
        Node::Filter { .. }
        | Node::Project { .. }
        | Node::Union { .. }
        | Node::LateFilter { .. } => handlers::inputs(node).into_iter().all(|i| spreads(i, n)),
        _ => shard_keys(node).is_some(),
    }
}

/// The copy of an operator on a worker where it does not run: it should never be reached.
struct Elsewhere(String);

impl Handler for Elsewhere {
    fn on_data(&mut self, _: usize, _: ChangeBatch, _: &mut crate::graph::Output) -> Result<()> {
        Err(Error::internal(format!("{} runs on worker 0 only", self.0)))
    }
    fn name(&self) -> String {
        self.0.clone()
    }
}

impl Dataflow {
    /// Adds a node to every copy: `make(worker)` in the copies it runs in (`spread`: all,
    /// else worker 0's).
    fn add_node(
        &mut self,
        inputs: usize,
        spread: bool,
        make: impl Fn() -> Result<Box<dyn Handler>>,
    ) -> Result<NodeId> {
        let mut id = None;
        for (worker, copy) in self.copies.iter_mut().enumerate() {
            let handler = if spread || worker == 0 {
                make()?
            } else {
                let name = self.places.len().to_string();
                Box::new(Elsewhere(format!("operator {name}")))
            };
            let added = copy.add(handler, inputs);
            if id.is_some_and(|id| id != added) {
                return Err(Error::internal("the copies of a dataflow differ"));
            }
            id = Some(added);
        }
        id.ok_or_else(|| Error::internal("a dataflow without workers"))
    }

    /// Connects `from` to input `port` of `to` in every copy.
    fn connect(
        &mut self,
        from: NodeId,
        to: NodeId,
        port: usize,
        keys: Option<&[Expr]>,
    ) -> Result<()> {
        let n = self.copies.len();
        let (from_spread, to_spread) = (self.places[from].shards > 1, self.places[to].shards > 1);
        let (route, senders) = match (keys, from_spread, to_spread) {
            (Some(keys), _, true) => (Route::Hash(keys.to_vec()), if from_spread { n } else { 1 }),
            (_, true, false) => (Route::Gather, n),
            _ => (Route::Local, 1),
        };
        for copy in &mut self.copies {
            copy.connect_by(from, to, port, route.clone(), senders)?;
        }
        Ok(())
    }

    /// Adds `node` and what it reads, unless an equal node was built already (`built`): then
    /// that node's output is read again ([`share`]).
    fn add<'a>(
        &mut self,
        node: &'a Node,
        path: String,
        et: &Arc<EventTime>,
        built: &mut Vec<(&'a Node, NodeId)>,
    ) -> Result<NodeId> {
        if let Some((_, id)) = built.iter().find(|(b, _)| share::same(b, node)) {
            return Ok(*id);
        }
        let n = self.copies.len();
        if let Some((columns, id, of)) = built
            .iter()
            .find_map(|(b, id)| Some((share::regrouped(b, node)?, *id, b.schema())))
        {
            // The same aggregate with its group keys in another order: its columns reordered.
            let exprs: Vec<Expr> = columns
                .iter()
                .map(|&c| -> Expr {
                    Arc::new(datafusion::physical_expr::expressions::Column::new(
                        of.field(c).name(),
                        c,
                    ))
                })
                .collect();
            let schema = node.schema();
            let shards = self.places[id].shards;
            let project = self.add_node(1, shards > 1, || {
                Ok(Box::new(stateless::Project {
                    exprs: exprs.clone(),
                    schema: Arc::clone(&schema),
                    context: Arc::clone(et),
                }))
            })?;
            self.places.push(Place {
                path,
                inputs: vec![id],
                shards,
                shape: Shape::Project(exprs),
                single_input_keys: None,
                route_positions: None,
            });
            self.connect(id, project, 0, None)?;
            built.push((node, project));
            return Ok(project);
        }
        let inputs = handlers::inputs(node);
        let spread = spreads(node, n);
        let keys = if spread { shard_keys(node) } else { None };
        let id = match node {
            Node::Source { object, schema, .. } => {
                let id = self.add_node(1, spread, || {
                    Ok(Box::new(stateless::Source {
                        object: *object,
                        schema: Arc::clone(schema),
                    }))
                })?;
                self.sources.push((*object, id));
                self.source_schemas.push((id, Arc::clone(schema)));
                id
            }
            _ => self.add_node(inputs.len(), spread, || handlers::handler(node, et))?,
        };
        self.places.push(Place {
            path: path.clone(),
            inputs: Vec::new(),
            shards: if spread { n } else { 1 },
            shape: Shape::of(node),
            single_input_keys: keys
                .as_ref()
                .filter(|k| k.len() == 1)
                .and_then(|k| k.first().cloned()),
            route_positions: None,
        });
        for (port, input) in inputs.into_iter().enumerate() {
            let from = self.add(input, format!("{path}.{port}"), et, built)?;
            let key = keys.as_ref().and_then(|k| k.get(port)).map(Vec::as_slice);
            self.connect(from, id, port, key)?;
            self.places[id].inputs.push(from);
        }
        built.push((node, id));
        Ok(id)
    }

    /// Sends one message per source node of `source`, by worker (`None`: every copy's
    /// source node gets `message`), and runs the copies until they are quiet.
    fn deliver(&mut self, source: Option<ObjectId>, each: impl Fn(usize) -> Option<Message>) {
        let n = self.copies.len();
        let mut inboxes: Vec<Vec<Delivery>> = (0..n).map(|_| Vec::new()).collect();
        for &(object, node) in &self.sources {
            if source.is_some_and(|s| s != object) {
                continue;
            }
            for (worker, inbox) in inboxes.iter_mut().enumerate() {
                if let Some(message) = each(worker) {
                    inbox.push(Delivery {
                        node,
                        input: 0,
                        sender: 0,
                        message,
                    });
                }
            }
        }
        run_rounds(&self.workers, &mut self.copies, inboxes);
    }

    /// Changes to `source` (a table or view id) arrived; returns what the dataflow emits right
    /// away (stateless operators and joins; stateful ones may hold theirs until the epoch
    /// ends). On several workers a large batch is cut into one slice per worker.
    pub fn push(&mut self, source: ObjectId, changes: &ChangeBatch) -> Result<Vec<ChangeBatch>> {
        if !changes.is_empty() && self.failed.is_none() {
            let n = self.copies.len();
            let len = changes.len();
            let slices = if n > 1 && len >= PARALLEL_ROWS { n } else { 1 };
            let (rows, diffs) = (changes.rows(), changes.diffs());
            let mut inboxes: Vec<Vec<Delivery>> = (0..n).map(|_| Vec::new()).collect();
            for &(object, node) in &self.sources {
                if object != source {
                    continue;
                }
                let data = |changes: ChangeBatch| Delivery {
                    node,
                    input: 0,
                    sender: 0,
                    message: Message::Data(changes),
                };
                match self.source_routes.iter().find(|(s, _)| *s == node) {
                    Some((_, keys)) => {
                        let parts = match crate::route::split(changes, keys, n) {
                            Ok(parts) => parts,
                            Err(e) => {
                                self.failed = Some(e.clone());
                                return Err(e);
                            }
                        };
                        for (worker, part) in parts {
                            inboxes[worker].push(data(part));
                        }
                    }
                    None => {
                        for (worker, inbox) in inboxes.iter_mut().enumerate().take(slices) {
                            let (from, to) = (len * worker / slices, len * (worker + 1) / slices);
                            let slice = ChangeBatch::new(
                                rows.slice(from, to - from),
                                diffs.slice(from, to - from),
                            );
                            inbox.push(data(slice));
                        }
                    }
                }
            }
            run_rounds(&self.workers, &mut self.copies, inboxes);
        }
        self.output()
    }

    /// The watermark of `source` rose to `value`: the mark goes into its source nodes, after
    /// the changes pushed before it (rows pushed later are judged against it). Returns what the
    /// dataflow emits (operators act on marks with the next batch or barrier: nothing, as a
    /// rule).
    pub fn watermark(&mut self, source: ObjectId, value: i64) -> Result<Vec<ChangeBatch>> {
        let mark = crate::graph::Watermark { source, value };
        if self.failed.is_none() {
            self.deliver(Some(source), |_| Some(Message::Watermark(mark)));
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
        if self.failed.is_none() {
            self.deliver(None, |_| Some(Message::Barrier(barrier)));
            self.check_state_rows();
        }
        self.output()
    }

    /// Caps every operator's state at `max` rows (summed over its shards: groups, open
    /// windows, join rows, ...), checked as each epoch ends: an operator past it fails the
    /// dataflow with 54000, naming it, instead of growing until the machine runs out of memory.
    pub fn limit_state_rows(&mut self, max: Option<u64>) {
        self.max_state_rows = max;
    }

    /// Lets every operator keep its arrangements within its share of `budget`, spilling the
    /// rest to disk (ADR 0012); called before a checkpoint is loaded into the dataflow.
    pub fn spill_to(&mut self, budget: &Arc<crate::spill::MemoryBudget>) {
        for copy in &mut self.copies {
            for id in 0..self.places.len() {
                if let Some(handler) = copy.handler_mut(id) {
                    handler.spill_to(budget);
                }
            }
        }
    }

    fn check_state_rows(&mut self) {
        let Some(max) = self.max_state_rows else {
            return;
        };
        for (id, place) in self.places.iter().enumerate() {
            let copies = if place.shards > 1 {
                &self.copies[..]
            } else {
                &self.copies[..1.min(self.copies.len())]
            };
            let rows: u64 = copies
                .iter()
                .filter_map(|c| c.handler(id))
                .map(|h| h.state_rows() as u64)
                .sum();
            if rows > max {
                let name = copies
                    .first()
                    .and_then(|c| c.handler(id))
                    .map(|h| crate::plan::readable_intervals(&h.state().name))
                    .unwrap_or_default();
                self.failed = Some(Error::new(
                    SqlState::PROGRAM_LIMIT_EXCEEDED,
                    format!(
                        "operator {} ({name}) holds {rows} rows of state, more than the limit of {max} (max_state_rows); create the view again WITH (max_state_rows = ...) or start the server with a higher --max-state-rows",
                        place.path
                    ),
                ));
                return;
            }
        }
    }

    /// What the copies emitted since the last call, in worker order; the first failure of
    /// any copy fails the dataflow (every node leads to the output).
    fn output(&mut self) -> Result<Vec<ChangeBatch>> {
        if self.failed.is_none() {
            self.failed = self.copies.iter().find_map(|c| c.first_failure().cloned());
        }
        match &self.failed {
            Some(e) => Err(e.clone()),
            None => Ok(self
                .copies
                .iter_mut()
                .flat_map(Graph::take_output)
                .collect()),
        }
    }

    /// Every operator, parents before their inputs. A source's input is its output.
    pub fn stats(&self) -> Vec<OperatorStats> {
        let rows_out = |id: NodeId| -> u64 { self.copies.iter().map(|c| c.rows_out(id)).sum() };
        self.places
            .iter()
            .enumerate()
            .filter_map(|(id, place)| {
                let first = self.copies.first()?.handler(id)?;
                let (mut state, mut spilled_rows) = (first.state(), first.spilled_rows());
                if place.shards > 1 {
                    for copy in &self.copies[1..] {
                        let handler = copy.handler(id)?;
                        let more = handler.state();
                        state.rows += more.rows;
                        state.bytes += more.bytes;
                        spilled_rows += handler.spilled_rows();
                    }
                }
                let rows_in = if place.inputs.is_empty() {
                    rows_out(id)
                } else {
                    place.inputs.iter().map(|i| rows_out(*i)).sum()
                };
                Some(OperatorStats {
                    path: place.path.clone(),
                    inputs: place
                        .inputs
                        .iter()
                        .map(|i| self.places[*i].path.clone())
                        .collect(),
                    name: match self.source_routes.iter().find(|(s, _)| *s == id) {
                        // Routed at the source: by which columns.
                        Some((_, keys)) => format!(
                            "{} routed by {}",
                            state.name,
                            keys.iter()
                                .map(|k| k.to_string())
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                        None => crate::plan::readable_intervals(&state.name),
                    },
                    rows_in,
                    rows_out: rows_out(id),
                    state_rows: state.rows,
                    state_bytes: state.bytes,
                    spilled_rows,
                    shards: place.shards,
                })
            })
            .collect()
    }

    fn handler(&mut self, worker: usize, id: NodeId) -> Result<&mut (dyn Handler + 'static)> {
        self.copies
            .get_mut(worker)
            .and_then(|c| c.handler_mut(id))
            .ok_or_else(|| Error::internal(format!("no node {id} on worker {worker}")))
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
