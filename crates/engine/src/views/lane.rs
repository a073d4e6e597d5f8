//! A view's dataflow on its own thread (its *lane*): the runtime hands it changes and marks
//! without waiting, so views compute at once, alongside each other and alongside the runtime
//! thread that takes the next commits; an epoch end is a request answered with everything the
//! view emitted in the epoch (ADR 0009, step 4's seam).
//!
//! A lane holds at most [`limits::VIEW_QUEUE_KIB`] of changes sent and not yet handled: past
//! it, [`Lane::push`] waits for the view (the per-view budget), so a view that is behind holds
//! the runtime thread and, through the runtime's queue, the writers, instead of the server
//! buffering without bound.
//!
//! Invariants: a lane handles its commands in the order sent, so a view sees its inputs in
//! commit order with marks and barriers in place, exactly as when the runtime thread ran the
//! dataflow itself; a failure (an error or a panic in an operator) is kept and answers every
//! later epoch end, and the lane handles nothing more; dropping the lane lets its thread end
//! once it has handled what was sent (the runtime never waits for a dropped view).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, mpsc};
use std::time::Duration;

use arrow::array::RecordBatch;
use eddy_common::panic::catch_panic;
use eddy_common::{ChangeBatch, Error, ObjectId, Result, SqlState, limits};
use eddy_dataflow::{Dataflow, OperatorStats};

enum Command {
    /// Changes, and the bytes of them counted against the budget.
    Push(ObjectId, Vec<ChangeBatch>, usize),
    Watermark(ObjectId, i64),
    EndEpoch(EpochEnd, mpsc::Sender<Result<Vec<ChangeBatch>>>),
    Save(mpsc::Sender<Result<Vec<(String, RecordBatch)>>>),
}

/// What the end of an epoch brings a view: the epoch's output of the views it reads (pushed
/// first), their watermarks, and the epoch's wall-clock time.
pub(super) struct EpochEnd {
    pub(super) now_micros: i64,
    pub(super) upstream: Vec<(ObjectId, Vec<ChangeBatch>)>,
    pub(super) marks: Vec<(ObjectId, i64)>,
}

/// The runtime's handle of one view's lane.
pub(super) struct Lane {
    commands: mpsc::Sender<Command>,
    queue: Arc<Queue>,
}

/// What the runtime and a lane's thread share: the bytes of changes sent to the lane and not
/// yet handled, and its operators as of the last epoch it ended.
#[derive(Default)]
struct Queue {
    bytes: Mutex<usize>,
    handled: Condvar,
    /// The lane's thread ended (nothing will lower `bytes` again).
    ended: AtomicBool,
    /// Published before each epoch end is answered, so `eddy_operators` never waits for a
    /// view that is busy or behind.
    stats: Mutex<Vec<OperatorStats>>,
}

impl Queue {
    fn handled(&self, bytes: usize) {
        let mut queued = self.bytes.lock().unwrap_or_else(|p| p.into_inner());
        *queued = queued.saturating_sub(bytes);
        self.handled.notify_all();
    }
}

/// Marks the queue ended when the lane's thread ends, however it ends.
struct EndGuard(Arc<Queue>);

impl Drop for EndGuard {
    fn drop(&mut self) {
        self.0.ended.store(true, Ordering::Release);
        self.0.handled.notify_all();
    }
}

/// Counts a push as handled once the lane is done with it, whatever it did.
struct Handled<'a>(&'a Queue, usize);

impl Drop for Handled<'_> {
    fn drop(&mut self) {
        self.0.handled(self.1);
    }
}

/// An epoch end sent to a lane, to be answered.
pub(super) struct Answer(mpsc::Receiver<Result<Vec<ChangeBatch>>>);

impl Answer {
    /// The view's output of the epoch (or why it failed).
    pub(super) fn wait(self) -> Result<Vec<ChangeBatch>> {
        self.0.recv().unwrap_or_else(|_| Err(gone()))
    }

    /// The answer if it comes within `timeout`; else the answer still to come.
    pub(super) fn wait_for(
        self,
        timeout: Duration,
    ) -> std::result::Result<Result<Vec<ChangeBatch>>, Answer> {
        match self.0.recv_timeout(timeout) {
            Ok(answer) => Ok(answer),
            Err(mpsc::RecvTimeoutError::Timeout) => Err(self),
            Err(mpsc::RecvTimeoutError::Disconnected) => Ok(Err(gone())),
        }
    }

    /// The answer if it has come; else the answer still to come.
    pub(super) fn ready(self) -> std::result::Result<Result<Vec<ChangeBatch>>, Answer> {
        match self.0.try_recv() {
            Ok(answer) => Ok(answer),
            Err(mpsc::TryRecvError::Empty) => Err(self),
            Err(mpsc::TryRecvError::Disconnected) => Ok(Err(gone())),
        }
    }
}

fn gone() -> Error {
    Error::new(SqlState::INTERNAL_ERROR, "a view's dataflow thread ended")
}

impl Lane {
    /// Starts the lane of view `name` with its built (backfilled or restored) dataflow and
    /// what it emitted already in the epoch.
    pub(super) fn start(name: &str, dataflow: Dataflow, pending: Vec<ChangeBatch>) -> Result<Lane> {
        let (commands, inbox) = mpsc::channel();
        let view = name.to_owned();
        let queue = Arc::new(Queue::default());
        let guard = EndGuard(Arc::clone(&queue));
        std::thread::Builder::new()
            .name(format!(
                "eddy-view-{}",
                name.chars().take(20).collect::<String>()
            ))
            .spawn(move || {
                let guard = guard;
                run(&view, dataflow, pending, inbox, &guard.0);
            })
            .map_err(|e| Error::internal(format!("starting the thread of view {name}: {e}")))?;
        Ok(Lane { commands, queue })
    }

    /// Changes to `object` (a table, source or view the view reads), in commit order. Waits
    /// while the view has more than its budget of changes to handle.
    pub(super) fn push(&self, object: ObjectId, batches: Vec<ChangeBatch>) {
        let bytes: usize = batches
            .iter()
            .map(|b| b.rows().get_array_memory_size())
            .sum();
        let budget = limits::VIEW_QUEUE_KIB as usize * 1024;
        let mut queued = self.queue.bytes.lock().unwrap_or_else(|p| p.into_inner());
        while *queued > 0
            && queued.saturating_add(bytes) > budget
            && !self.queue.ended.load(Ordering::Acquire)
        {
            queued = self
                .queue
                .handled
                .wait_timeout(queued, Duration::from_millis(100))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        *queued += bytes;
        drop(queued);
        if self
            .commands
            .send(Command::Push(object, batches, bytes))
            .is_err()
        {
            self.queue.handled(bytes);
        }
    }

    /// The watermark of `object` rose, after the changes sent before.
    pub(super) fn watermark(&self, object: ObjectId, value: i64) {
        let _ = self.commands.send(Command::Watermark(object, value));
    }

    /// Ends the view's epoch; [`Answer::wait`] gives its output.
    pub(super) fn end_epoch(&self, end: EpochEnd) -> Answer {
        let (reply, answer) = mpsc::channel();
        let _ = self.commands.send(Command::EndEpoch(end, reply));
        Answer(answer)
    }

    /// The view's operator state as checkpoint parts, between epochs.
    pub(super) fn save(&self) -> Result<Vec<(String, RecordBatch)>> {
        let (reply, answer) = mpsc::channel();
        self.commands
            .send(Command::Save(reply))
            .map_err(|_| gone())?;
        answer.recv().unwrap_or_else(|_| Err(gone()))
    }

    /// The view's operators (`eddy_operators`) as of the last epoch it ended.
    pub(super) fn stats(&self) -> Vec<OperatorStats> {
        self.queue
            .stats
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// The lane's loop: commands in order until the runtime drops the lane.
fn run(
    view: &str,
    mut dataflow: Dataflow,
    mut pending: Vec<ChangeBatch>,
    inbox: mpsc::Receiver<Command>,
    queue: &Queue,
) {
    let mut failed: Option<Error> = None;
    let publish = |dataflow: &Dataflow| {
        *queue.stats.lock().unwrap_or_else(|p| p.into_inner()) = dataflow.stats();
    };
    publish(&dataflow);
    for command in inbox {
        match command {
            Command::Push(object, batches, bytes) => {
                let _handled = Handled(queue, bytes);
                if failed.is_some() {
                    continue;
                }
                for batch in &batches {
                    match catch_panic("a view's operators", || {
                        crate::failpoints::failpoint("view_changes", view)?;
                        dataflow.push(object, batch)
                    }) {
                        Ok(out) => pending.extend(out),
                        Err(e) => {
                            failed = Some(e);
                            break;
                        }
                    }
                }
            }
            Command::Watermark(object, value) => {
                if failed.is_some() {
                    continue;
                }
                match catch_panic("a view's operators", || dataflow.watermark(object, value)) {
                    Ok(out) => pending.extend(out),
                    Err(e) => failed = Some(e),
                }
            }
            Command::EndEpoch(end, reply) => {
                let result = match &failed {
                    Some(e) => Err(e.clone()),
                    None => end_epoch(view, &mut dataflow, std::mem::take(&mut pending), end),
                };
                if let Err(e) = &result {
                    failed.get_or_insert_with(|| e.clone());
                    pending.clear();
                }
                publish(&dataflow);
                let _ = reply.send(result);
            }
            Command::Save(reply) => {
                let _ = reply.send(catch_panic("saving a view's state", || dataflow.save()));
            }
        }
    }
}

fn end_epoch(
    view: &str,
    dataflow: &mut Dataflow,
    mut out: Vec<ChangeBatch>,
    end: EpochEnd,
) -> Result<Vec<ChangeBatch>> {
    for (source, batches) in &end.upstream {
        for batch in batches {
            out.extend(catch_panic("a view's operators", || {
                crate::failpoints::failpoint("view_changes", view)?;
                dataflow.push(*source, batch)
            })?);
        }
    }
    for (source, watermark) in &end.marks {
        out.extend(catch_panic("a view's operators", || {
            dataflow.watermark(*source, *watermark)
        })?);
    }
    out.extend(catch_panic("a view's operators", || {
        dataflow.end_epoch(end.now_micros)
    })?);
    Ok(out)
}
