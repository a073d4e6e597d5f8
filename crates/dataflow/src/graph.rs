//! The dataflow graph (ADR 0009): operators are message handlers on nodes the runtime wires;
//! edges carry [`Message`]s — data, in-band watermarks and epoch barriers.
//!
//! Entry points: [`Handler`] (what an operator implements), [`Graph`] (nodes, edges and a
//! deterministic executor that delivers messages until the graph is quiet). Invariants:
//! - a node with several inputs is *aligned*: once a barrier arrived on one input, that input's
//!   later messages wait until every input delivered the barrier; then the node's
//!   [`Handler::on_barrier`] runs once and the barrier goes on downstream, so every node sees
//!   each epoch's data complete before the epoch's barrier;
//! - an operator never owns another: what it emits goes to [`Output`], and the graph forwards it
//!   along the node's edges (batches split at [`BATCH_ROWS_MAX`]);
//! - a node whose handler fails (an error or a panic) fails alone with everything downstream of
//!   it (the views reading it); the rest of the graph goes on.
//!
//! A view's graph is built and driven by [`crate::Dataflow`]; this module knows nothing of
//! plans.

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};

use eddy_common::limits::BATCH_ROWS_MAX;
use eddy_common::{ChangeBatch, Error, ObjectId, Result};

use crate::arrangement::SaveMode;

/// A two-input operator's changes as (left, right) batches: input 0 is the left side.
pub(crate) fn by_side(input: usize, changes: ChangeBatch) -> (Vec<ChangeBatch>, Vec<ChangeBatch>) {
    if input == 0 {
        (vec![changes], Vec::new())
    } else {
        (Vec::new(), vec![changes])
    }
}

/// A node's index in its [`Graph`].
pub type NodeId = usize;

/// The event time of stream `source` (a table, source or view) has reached `value` (µs): no
/// later row of it has a smaller event time (rows that do are late). Marks travel on every
/// edge in order with the data, each node passes them on, and an operator that closes windows
/// or judges lateness keeps the latest per stream ([`crate::event_time::Marks`]) and takes
/// the least over the streams its plan names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Watermark {
    pub source: ObjectId,
    pub value: i64,
}

/// The end of an epoch; a checkpoint's barrier asks every node to save its state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Barrier {
    pub epoch: u64,
    pub checkpoint: bool,
    /// The wall-clock time the epoch ends at (µs since the Unix epoch), one for every node:
    /// what `now()` is for a temporal filter.
    pub now_micros: i64,
}

/// What travels on an edge.
#[derive(Debug, Clone)]
pub enum Message {
    Data(ChangeBatch),
    Watermark(Watermark),
    Barrier(Barrier),
}

/// What a handler emits while it handles one message.
#[derive(Debug, Default)]
pub struct Output {
    messages: Vec<Message>,
    rows: u64,
}

impl Output {
    /// Emits changes (split into batches of at most [`BATCH_ROWS_MAX`] rows; empty ones are
    /// dropped).
    pub fn data(&mut self, changes: ChangeBatch) {
        let n = changes.len();
        self.rows += n as u64;
        if n <= BATCH_ROWS_MAX {
            if n > 0 {
                self.messages.push(Message::Data(changes));
            }
            return;
        }
        let (rows, diffs) = changes.into_parts();
        let mut at = 0;
        while at < n {
            let len = BATCH_ROWS_MAX.min(n - at);
            self.messages.push(Message::Data(ChangeBatch::new(
                rows.slice(at, len),
                diffs.slice(at, len),
            )));
            at += len;
        }
    }

    /// Emits a watermark of the node's output.
    pub fn watermark(&mut self, mark: Watermark) {
        self.messages.push(Message::Watermark(mark));
    }
}

/// An operator: synchronous and deterministic handlers of the messages of its inputs
/// (numbered from 0 in the order the graph connected them).
pub trait Handler: Send {
    /// Changes arrived on `input`.
    fn on_data(&mut self, input: usize, changes: ChangeBatch, out: &mut Output) -> Result<()>;

    /// A stream's event time advanced (the graph delivers each mark once per node, and only
    /// when it raises that stream's mark). An operator that judges lateness or closes windows
    /// records it here and acts on it with the next batch or at the barrier; every operator
    /// passes it on (the default), as the rows that follow it are still that stream's.
    fn on_watermark(&mut self, _input: usize, mark: Watermark, out: &mut Output) -> Result<()> {
        out.watermark(mark);
        Ok(())
    }

    /// Every input delivered the epoch's barrier: emit what the epoch leaves (the graph then
    /// passes the barrier on). Stateless operators leave nothing: the default.
    fn on_barrier(&mut self, _barrier: &Barrier, _out: &mut Output) -> Result<()> {
        Ok(())
    }

    /// The operator's name as `eddy_operators` and EXPLAIN show it.
    fn name(&self) -> String;

    /// The state the operator holds (`eddy_operators`); stateless by default.
    fn state(&self) -> crate::OperatorState {
        crate::OperatorState::stateless(self.name())
    }

    /// Lets the operator's arrangements spill to disk past their share of `budget` (ADR 0012);
    /// operators whose state is not in arrangements keep it in memory.
    fn spill_to(&mut self, _budget: &std::sync::Arc<crate::spill::MemoryBudget>) {}

    /// Rows of its state that are on disk (`state().rows` counts them too).
    fn spilled_rows(&self) -> usize {
        0
    }

    /// `state().rows`, checked every epoch against the view's limit: operators whose
    /// `state` walks their state to size it answer this without.
    fn state_rows(&self) -> usize {
        self.state().rows
    }

    /// Puts the operator's state into `out` as named Arrow batches, at a barrier (stateless:
    /// none). With [`SaveMode::Changes`], an arrangement's part may hold only its changes
    /// since the last save ([`crate::checkpoint::is_changes`]); other parts are whole.
    fn save(&mut self, _mode: SaveMode, _out: &mut dyn crate::checkpoint::Sink) -> Result<()> {
        Ok(())
    }

    /// Takes back one part of what [`Handler::save`] returned, into a fresh operator.
    fn load(&mut self, name: &str, _batch: &arrow::array::RecordBatch) -> Result<()> {
        Err(crate::checkpoint::unknown_part(&self.name(), name))
    }

    /// The key of each row of state part `name`, as the values the exchange into the operator
    /// hashes: how a checkpoint taken on another number of workers is re-sharded. Operators
    /// that run sharded say it for every part they save; `None`: the operator cannot.
    fn part_keys(
        &mut self,
        _name: &str,
        _batch: &arrow::array::RecordBatch,
    ) -> Result<Option<Vec<arrow::array::ArrayRef>>> {
        Ok(None)
    }
}

struct Sender {
    /// The sender delivered the barrier being aligned.
    aligned: bool,
    /// Its messages after that barrier, waiting for the other senders' and inputs' barriers.
    held: VecDeque<Message>,
}

/// One input of a node: fed by one upstream node, which runs as one or several copies (on
/// several workers: an exchange), each a sender whose barrier the input waits for.
struct Port {
    senders: Vec<Sender>,
}

impl Port {
    fn new(senders: usize) -> Port {
        Port {
            senders: (0..senders.max(1))
                .map(|_| Sender {
                    aligned: false,
                    held: VecDeque::new(),
                })
                .collect(),
        }
    }

    fn aligned(&self) -> bool {
        self.senders.iter().all(|s| s.aligned)
    }
}

/// How an edge reaches its target node on a graph that runs as one copy per worker
/// ([`crate::Dataflow`]).
#[derive(Clone)]
pub(crate) enum Route {
    /// The target's copy on this worker.
    Local,
    /// An exchange: each row to the copy on the worker a hash of these expressions picks
    /// ([`crate::route::shard_of`]); watermarks and barriers to every copy.
    Hash(Vec<crate::plan::Expr>),
    /// Everything to worker 0, where the target runs as a single copy.
    Gather,
}

struct Target {
    node: NodeId,
    input: usize,
    route: Route,
}

struct Node {
    handler: Box<dyn Handler>,
    ports: Vec<Port>,
    /// Where this node's output goes.
    targets: Vec<Target>,
    /// The latest mark per stream delivered to the node: a mark that does not raise it (the
    /// same mark arriving by another path or from another worker) is not delivered again.
    marks: crate::event_time::Marks,
    rows_out: u64,
    failed: Option<Error>,
}

/// A message on its way: to input `input` of `node`, from copy `sender` of the node feeding
/// that input.
pub(crate) struct Delivery {
    pub(crate) node: NodeId,
    pub(crate) input: usize,
    pub(crate) sender: usize,
    pub(crate) message: Message,
}

/// Nodes and edges, and the executor that runs them on the calling thread. In a dataflow on
/// several workers each worker has its copy of the graph; what crosses an exchange waits in
/// the outbox for [`crate::Dataflow`] to hand it to the worker it is for.
pub struct Graph {
    nodes: Vec<Node>,
    queue: VecDeque<Delivery>,
    /// This copy's worker, of `workers`.
    worker: usize,
    workers: usize,
    /// Messages for other workers' copies (or this one's, across an exchange), by worker.
    outbox: Vec<(usize, Delivery)>,
    /// The node whose emitted changes [`Graph::take_output`] hands out.
    output: Option<NodeId>,
    collected: Vec<ChangeBatch>,
    /// The first failure in this copy (what reads the node on other workers fails with it).
    first_failure: Option<Error>,
}

impl Default for Graph {
    fn default() -> Self {
        Graph::on_worker(0, 1)
    }
}

impl Graph {
    pub fn new() -> Self {
        Graph::default()
    }

    /// The copy of a graph that runs on `worker` of `workers`.
    pub(crate) fn on_worker(worker: usize, workers: usize) -> Self {
        Graph {
            nodes: Vec::new(),
            queue: VecDeque::new(),
            worker,
            workers: workers.max(1),
            outbox: Vec::new(),
            output: None,
            collected: Vec::new(),
            first_failure: None,
        }
    }

    /// Adds a node with `inputs` inputs (a source has one: what the runtime sends it).
    pub fn add(&mut self, handler: Box<dyn Handler>, inputs: usize) -> NodeId {
        let inputs = inputs.max(1);
        self.nodes.push(Node {
            handler,
            ports: (0..inputs).map(|_| Port::new(1)).collect(),
            targets: Vec::new(),
            marks: crate::event_time::Marks::default(),
            rows_out: 0,
            failed: None,
        });
        self.nodes.len() - 1
    }

    /// Connects `from`'s output to input `input` of `to`.
    pub fn connect(&mut self, from: NodeId, to: NodeId, input: usize) -> Result<()> {
        self.connect_by(from, to, input, Route::Local, 1)
    }

    /// Connects `from`'s output to input `input` of `to` by `route`, the input waiting for the
    /// barriers of `senders` copies of `from`.
    pub(crate) fn connect_by(
        &mut self,
        from: NodeId,
        to: NodeId,
        input: usize,
        route: Route,
        senders: usize,
    ) -> Result<()> {
        let inputs = self
            .nodes
            .get(to)
            .map(|n| n.ports.len())
            .ok_or_else(|| Error::internal(format!("no node {to}")))?;
        if input >= inputs || from >= self.nodes.len() {
            return Err(Error::internal(format!(
                "no edge {from} -> {to}.{input}: {to} has {inputs} inputs"
            )));
        }
        self.nodes[to].ports[input] = Port::new(senders);
        self.nodes[from].targets.push(Target {
            node: to,
            input,
            route,
        });
        Ok(())
    }

    /// The nodes that read `node`'s output (one entry per edge).
    pub(crate) fn readers(&self, node: NodeId) -> Vec<NodeId> {
        self.nodes
            .get(node)
            .map_or_else(Vec::new, |n| n.targets.iter().map(|t| t.node).collect())
    }

    /// Changes how the edge `from` -> input `input` of `to` routes, and how many copies of
    /// `from` that input waits for (before any message was sent).
    pub(crate) fn reroute(
        &mut self,
        from: NodeId,
        to: NodeId,
        input: usize,
        route: Route,
        senders: usize,
    ) -> Result<()> {
        let target = self
            .nodes
            .get_mut(from)
            .and_then(|n| {
                n.targets
                    .iter_mut()
                    .find(|t| t.node == to && t.input == input)
            })
            .ok_or_else(|| Error::internal(format!("no edge {from} -> {to}.{input}")))?;
        target.route = route;
        if let Some(port) = self.nodes.get_mut(to).and_then(|n| n.ports.get_mut(input)) {
            *port = Port::new(senders);
        }
        Ok(())
    }

    /// Delivers `message` to input `input` of `node`, then everything it causes, until the
    /// graph is quiet.
    pub fn send(&mut self, node: NodeId, input: usize, message: Message) {
        self.run_all(vec![Delivery {
            node,
            input,
            sender: 0,
            message,
        }]);
    }

    /// Delivers `messages` in order, then everything they cause on this worker, until it is
    /// quiet (what crosses an exchange waits in the outbox).
    pub(crate) fn run_all(&mut self, messages: Vec<Delivery>) {
        self.queue.extend(messages);
        while let Some(d) = self.queue.pop_front() {
            self.deliver(d);
        }
    }

    /// What this copy emitted across exchanges since the last call, with the worker each
    /// message is for, in the order emitted.
    pub(crate) fn take_outbox(&mut self) -> Vec<(usize, Delivery)> {
        std::mem::take(&mut self.outbox)
    }

    /// The first node of this copy that failed, with its error.
    pub(crate) fn first_failure(&self) -> Option<&Error> {
        self.first_failure.as_ref()
    }

    /// Keeps the changes `node` emits, for [`Graph::take_output`].
    pub fn collect(&mut self, node: NodeId) {
        self.output = Some(node);
    }

    /// The changes the collected node emitted since the last call.
    pub fn take_output(&mut self) -> Vec<ChangeBatch> {
        std::mem::take(&mut self.collected)
    }

    /// Why `node` failed, if it did (its own error or one upstream).
    pub fn failure(&self, node: NodeId) -> Option<&Error> {
        self.nodes.get(node).and_then(|n| n.failed.as_ref())
    }

    /// Rows `node` has emitted.
    pub fn rows_out(&self, node: NodeId) -> u64 {
        self.nodes.get(node).map_or(0, |n| n.rows_out)
    }

    /// The handler of `node`.
    pub fn handler(&self, node: NodeId) -> Option<&dyn Handler> {
        self.nodes.get(node).map(|n| n.handler.as_ref())
    }

    /// The handler of `node`, to save or load its state between epochs.
    pub fn handler_mut(&mut self, node: NodeId) -> Option<&mut (dyn Handler + 'static)> {
        self.nodes.get_mut(node).map(|n| n.handler.as_mut())
    }

    fn deliver(&mut self, d: Delivery) {
        let Delivery {
            node: id,
            input,
            sender,
            message,
        } = d;
        let Some(node) = self.nodes.get_mut(id) else {
            return;
        };
        if node.failed.is_some() {
            return;
        }
        let Some(from) = node
            .ports
            .get_mut(input)
            .and_then(|p| p.senders.get_mut(sender))
        else {
            return;
        };
        if from.aligned {
            from.held.push_back(message);
            return;
        }
        let barrier = match message {
            Message::Barrier(b) => b,
            Message::Watermark(mark) if !node.marks.observe(mark) => return,
            other => {
                self.run(id, |h, out| match other {
                    Message::Data(changes) => h.on_data(input, changes, out),
                    Message::Watermark(mark) => h.on_watermark(input, mark, out),
                    Message::Barrier(_) => Ok(()),
                });
                return;
            }
        };
        from.aligned = true;
        if !node.ports.iter().all(Port::aligned) {
            return;
        }
        for port in &mut node.ports {
            port.senders.iter_mut().for_each(|s| s.aligned = false);
        }
        if self.run(id, |h, out| h.on_barrier(&barrier, out)) {
            self.emit(id, vec![Message::Barrier(barrier)]);
        }
        // The next epoch's messages that waited, in the order they came, per input and sender.
        for input in 0..self.nodes[id].ports.len() {
            for sender in 0..self.nodes[id].ports[input].senders.len() {
                loop {
                    let from = &mut self.nodes[id].ports[input].senders[sender];
                    if from.aligned {
                        break;
                    }
                    let Some(message) = from.held.pop_front() else {
                        break;
                    };
                    self.deliver(Delivery {
                        node: id,
                        input,
                        sender,
                        message,
                    });
                }
            }
        }
    }

    /// Runs one handler call and forwards its output; `false` when the node failed.
    fn run(
        &mut self,
        id: NodeId,
        call: impl FnOnce(&mut dyn Handler, &mut Output) -> Result<()>,
    ) -> bool {
        let mut out = Output::default();
        let handler = self.nodes[id].handler.as_mut();
        let result = catch_unwind(AssertUnwindSafe(|| call(handler, &mut out)))
            .unwrap_or_else(|panic| Err(Error::internal(panic_message(&panic))));
        match result {
            Ok(()) => {
                self.nodes[id].rows_out += out.rows;
                self.emit(id, out.messages);
                true
            }
            Err(e) => {
                self.fail(id, e);
                false
            }
        }
    }

    fn emit(&mut self, id: NodeId, messages: Vec<Message>) {
        if self.output == Some(id) {
            self.collected
                .extend(messages.iter().filter_map(|m| match m {
                    Message::Data(changes) => Some(changes.clone()),
                    _ => None,
                }));
        }
        let mut routed = Vec::new();
        let targets = &self.nodes[id].targets;
        for message in messages {
            for t in targets {
                let to = |sender, message| Delivery {
                    node: t.node,
                    input: t.input,
                    sender,
                    message,
                };
                match (&t.route, &message) {
                    (Route::Local, _) => self.queue.push_back(to(0, message.clone())),
                    (Route::Gather, _) => self.outbox.push((0, to(self.worker, message.clone()))),
                    (Route::Hash(keys), Message::Data(changes)) => {
                        match crate::route::split(changes, keys, self.workers) {
                            Ok(parts) => {
                                for (worker, part) in parts {
                                    self.outbox
                                        .push((worker, to(self.worker, Message::Data(part))));
                                }
                            }
                            Err(e) => routed.push(e),
                        }
                    }
                    (Route::Hash(_), _) => {
                        for worker in 0..self.workers {
                            self.outbox.push((worker, to(self.worker, message.clone())));
                        }
                    }
                }
            }
        }
        if let Some(e) = routed.into_iter().next() {
            self.fail(id, e);
        }
    }

    /// Fails `id` and every node downstream of it on this worker (on other workers, the
    /// dataflow fails what reads it: [`Graph::first_failure`]).
    fn fail(&mut self, id: NodeId, error: Error) {
        let name = self.nodes[id].handler.name();
        if self.first_failure.is_none() {
            self.first_failure = Some(error.clone());
        }
        let mut stack = vec![(id, error)];
        while let Some((node, error)) = stack.pop() {
            let Some(n) = self.nodes.get_mut(node) else {
                continue;
            };
            if n.failed.is_some() {
                continue;
            }
            for port in &mut n.ports {
                port.senders.iter_mut().for_each(|s| s.held.clear());
            }
            for t in &n.targets {
                let upstream = Error::new(error.state, format!("{name} failed: {}", error.message));
                stack.push((t.node, upstream));
            }
            n.failed = Some(error);
        }
        self.queue.retain(|d| self.nodes[d.node].failed.is_none());
    }
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    let what = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".to_owned());
    format!("operator panicked: {what}")
}

#[cfg(test)]
#[path = "graph_tests.rs"]
pub(crate) mod tests;
