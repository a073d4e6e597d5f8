//! A view's dataflow on its own thread (its *lane*): the runtime hands it changes and marks
//! without waiting, so views compute at once, alongside each other and alongside the runtime
//! thread that takes the next commits; an epoch end is a request answered with everything the
//! view emitted in the epoch (ADR 0009, step 4's seam).
//!
//! A lane holds at most [`limits::VIEW_QUEUE_KIB`] of changes sent and not yet handled in
//! memory (the per-view budget). Past it, [`Lane::push`] writes the changes to the lane's spill
//! file (an unlinked temporary file in the data directory) and sends the lane only where they
//! are, so a view slower than its inputs falls behind (`eddy_views.lag_epochs`) without holding
//! the runtime thread, the other views or the writers. A view's own source reader holds room
//! for what it sent until the lane has handled it ([`super::ReaderRoom`], as much again as the
//! budget), so it waits at its source instead, and the lane takes its changes as they come. Past [`limits::VIEW_SPILL_MIB_MAX`] on
//! disk too (or without a data directory), `push` waits for the view: the writers are then
//! throttled, and nothing grows without bound.
//!
//! Invariants: a lane handles its commands in the order sent, spilled changes in their place
//! among them, so a view sees its inputs in commit order with marks and barriers in place,
//! exactly as when the runtime thread ran the dataflow itself; a failure (an error or a panic
//! in an operator) is kept and answers every later epoch end, and the lane handles nothing
//! more; dropping the lane lets its thread end once it has handled what was sent (the runtime
//! never waits for a dropped view).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, mpsc};
use std::time::Duration;

use eddy_common::panic::catch_panic;
use eddy_common::{ChangeBatch, Error, ObjectId, Result, SqlState, limits};
use eddy_dataflow::arrangement::SaveMode;
use eddy_dataflow::{Dataflow, OperatorStats};

use super::ReaderRoom;
use crate::checkpoint::Staging;

enum Command {
    /// Changes, the bytes of them counted against the budget, and the room a source reader
    /// holds for them (released once handled).
    Push(ObjectId, Vec<ChangeBatch>, usize, Option<ReaderRoom>),
    /// Changes past the budget, in the spill file (the reader's room with the last of a push).
    Spilled(ObjectId, Spilled, Option<ReaderRoom>),
    Watermark(ObjectId, i64),
    EndEpoch(EpochEnd, mpsc::Sender<Result<Vec<ChangeBatch>>>),
    /// Writes the view's operator state into the files of a checkpoint.
    Save(SaveMode, Box<Staging>, mpsc::Sender<Result<Saved>>),
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
    /// Where changes past the budget go (`None`: nowhere, `push` waits).
    spill: Option<Spill>,
    /// Set when the runtime drops the lane (the view is dropped or rebuilt): a backfill still
    /// running stops at its next log record.
    dropped: Arc<AtomicBool>,
}

impl Drop for Lane {
    fn drop(&mut self) {
        self.dropped.store(true, Ordering::Release);
    }
}

/// A lane's spill file: created at the first spill, appended by the runtime thread, read back
/// by the lane's thread at the offsets its commands name; emptied whenever everything written
/// has been read. It is unlinked from the start, so it goes with the lane (or a crash).
struct Spill {
    dir: std::path::PathBuf,
    file: Option<Arc<std::fs::File>>,
    /// Where the next write goes.
    end: u64,
}

/// One batch of changes in the spill file.
struct Spilled {
    file: Arc<std::fs::File>,
    at: u64,
    len: usize,
    schema: arrow::datatypes::SchemaRef,
}

impl Spilled {
    fn read(&self) -> Result<Vec<ChangeBatch>> {
        use std::os::unix::fs::FileExt;
        let mut payload = vec![0; self.len];
        self.file
            .read_exact_at(&mut payload, self.at)
            .map_err(|e| Error::io("read a view's spilled changes", e))?;
        eddy_storage::log::decode_changes(&payload, &self.schema)
    }
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
    /// Bytes in the spill file not read back yet.
    spilled: std::sync::atomic::AtomicU64,
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

/// A view's operator state as checkpoint files (and what the writer still has to write of
/// it), and when its lane had saved it.
pub(super) struct Saved {
    pub(super) parts: Box<Staging>,
    pub(super) done: std::time::Instant,
}

/// A command sent to a lane, to be answered: an epoch end (the view's output of the epoch) or
/// a save (its state).
pub(super) struct Answer<T = Vec<ChangeBatch>>(mpsc::Receiver<Result<T>>);

impl<T> Answer<T> {
    /// The answer (or why the view failed).
    pub(super) fn wait(self) -> Result<T> {
        self.0.recv().unwrap_or_else(|_| Err(gone()))
    }

    /// The answer if it comes within `timeout`; else the answer still to come.
    pub(super) fn wait_for(self, timeout: Duration) -> std::result::Result<Result<T>, Self> {
        match self.0.recv_timeout(timeout) {
            Ok(answer) => Ok(answer),
            Err(mpsc::RecvTimeoutError::Timeout) => Err(self),
            Err(mpsc::RecvTimeoutError::Disconnected) => Ok(Err(gone())),
        }
    }

    /// The answer if it has come.
    pub(super) fn try_take(&self) -> Option<Result<T>> {
        match self.0.try_recv() {
            Ok(answer) => Some(answer),
            Err(mpsc::TryRecvError::Empty) => None,
            Err(mpsc::TryRecvError::Disconnected) => Some(Err(gone())),
        }
    }

    /// The answer if it has come; else the answer still to come.
    pub(super) fn ready(self) -> std::result::Result<Result<T>, Self> {
        self.try_take().ok_or(self)
    }
}

fn gone() -> Error {
    Error::new(SqlState::INTERNAL_ERROR, "a view's dataflow thread ended")
}

impl Lane {
    /// Starts the lane of view `name` with its built (backfilled or restored) dataflow and
    /// the backfill it runs first (a new view; a restored one has none).
    /// `spill_dir`: where changes past the budget may go (`None`: `push` waits instead).
    /// `waker` wakes the runtime thread when the lane answers.
    pub(super) fn start(
        name: &str,
        dataflow: Dataflow,
        backfill: Option<super::backfill::Job>,
        spill_dir: Option<&std::path::Path>,
        waker: super::Waker,
    ) -> Result<Lane> {
        let (commands, inbox) = mpsc::channel();
        let view = name.to_owned();
        let queue = Arc::new(Queue::default());
        let guard = EndGuard(Arc::clone(&queue));
        let dropped = Arc::new(AtomicBool::new(false));
        let lane = Ends {
            waker,
            dropped: Arc::clone(&dropped),
        };
        std::thread::Builder::new()
            .name(format!(
                "eddy-view-{}",
                name.chars().take(20).collect::<String>()
            ))
            .spawn(move || {
                let guard = guard;
                run(&view, dataflow, backfill, inbox, &guard.0, &lane);
            })
            .map_err(|e| Error::internal(format!("starting the thread of view {name}: {e}")))?;
        Ok(Lane {
            commands,
            queue,
            spill: spill_dir.map(|dir| Spill {
                dir: dir.to_owned(),
                file: None,
                end: 0,
            }),
            dropped,
        })
    }

    /// Changes to `object` (a table, source or view the view reads), in commit order. Past the
    /// view's budget in memory they go to its spill file; past the spill's limit too, this
    /// waits while the view has more than its budget to handle.
    pub(super) fn push(
        &mut self,
        object: ObjectId,
        batches: Vec<ChangeBatch>,
        mut held: Option<ReaderRoom>,
    ) {
        let bytes: usize = batches
            .iter()
            .map(|b| b.rows().get_array_memory_size())
            .sum();
        let budget = limits::VIEW_QUEUE_KIB as usize * 1024;
        // A source reader's changes are bounded by its room already: taken as they come.
        let bounded = held.is_some();
        let over = !bounded && {
            let queued = self.queue.bytes.lock().unwrap_or_else(|p| p.into_inner());
            *queued > 0 && queued.saturating_add(bytes) > budget
        };
        if over {
            match self.spill(object, &batches, &mut held) {
                Ok(true) => return,
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "spilling a view's changes failed; waiting for the view instead")
                }
            }
        }
        let mut queued = self.queue.bytes.lock().unwrap_or_else(|p| p.into_inner());
        while !bounded
            && *queued > 0
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
            .send(Command::Push(object, batches, bytes, held))
            .is_err()
        {
            self.queue.handled(bytes);
        }
    }

    /// Writes `batches` to the spill file and sends the lane where they are (with `held`);
    /// `false` when the spill is full (or there is none) and nothing was written.
    fn spill(
        &mut self,
        object: ObjectId,
        batches: &[ChangeBatch],
        held: &mut Option<ReaderRoom>,
    ) -> Result<bool> {
        use std::os::unix::fs::FileExt;
        let Some(spill) = self.spill.as_mut() else {
            return Ok(false);
        };
        let payloads = batches
            .iter()
            .map(eddy_storage::log::encode_changes)
            .collect::<Result<Vec<_>>>()?;
        let len: u64 = payloads.iter().map(|p| p.len() as u64).sum();
        let outstanding = self.queue.spilled.load(Ordering::Acquire);
        if outstanding.saturating_add(len) > limits::VIEW_SPILL_MIB_MAX << 20 {
            return Ok(false);
        }
        let file = match &spill.file {
            Some(file) => Arc::clone(file),
            None => {
                let file = Arc::new(
                    tempfile::tempfile_in(&spill.dir)
                        .map_err(|e| Error::io("create a view's spill file", e))?,
                );
                spill.file = Some(Arc::clone(&file));
                file
            }
        };
        // Everything written was read back: start the file again (only this thread writes,
        // and the lane reads only what its commands name).
        if outstanding == 0 && spill.end > 0 {
            file.set_len(0)
                .map_err(|e| Error::io("empty a view's spill file", e))?;
            spill.end = 0;
        }
        // Every batch is written before any is handed over: a failed write hands over none,
        // and the caller sends them all in memory instead.
        let mut at = spill.end;
        for payload in &payloads {
            file.write_all_at(payload, at)
                .map_err(|e| Error::io("write a view's spilled changes", e))?;
            at += payload.len() as u64;
        }
        self.queue.spilled.fetch_add(len, Ordering::AcqRel);
        let last = payloads.len().saturating_sub(1);
        for (i, (payload, batch)) in payloads.iter().zip(batches).enumerate() {
            let spilled = Spilled {
                file: Arc::clone(&file),
                at: spill.end,
                len: payload.len(),
                schema: batch.rows().schema(),
            };
            spill.end += payload.len() as u64;
            if self
                .commands
                .send(Command::Spilled(
                    object,
                    spilled,
                    if i == last { held.take() } else { None },
                ))
                .is_err()
            {
                self.queue
                    .spilled
                    .fetch_sub(payload.len() as u64, Ordering::AcqRel);
            }
        }
        Ok(true)
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

    /// Writes the view's operator state into `staging`'s files, as of everything sent to the
    /// lane before (a view behind saves once it has caught up to here).
    /// [`SaveMode::Changes`]: the caller vouches that the view's last save is in the
    /// checkpoint the new one builds on.
    pub(super) fn save(&self, mode: SaveMode, staging: Staging) -> Answer<Saved> {
        let (reply, answer) = mpsc::channel();
        let _ = self
            .commands
            .send(Command::Save(mode, Box::new(staging), reply));
        Answer(answer)
    }

    /// The view's operators (`eddy_operators`), readable without the runtime.
    pub(super) fn stats(&self) -> Stats {
        Stats(Arc::clone(&self.queue))
    }
}

/// A view's operators as its lane published them at the last epoch end it answered.
#[derive(Clone)]
pub(super) struct Stats(Arc<Queue>);

impl Stats {
    pub(super) fn read(&self) -> Vec<OperatorStats> {
        self.0
            .stats
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// What a lane's thread shares with the runtime thread besides its commands.
struct Ends {
    /// Wakes the runtime thread after an answer.
    waker: super::Waker,
    /// The runtime dropped the lane.
    dropped: Arc<AtomicBool>,
}

/// The lane's loop: the backfill, then commands in order until the runtime drops the lane
/// (what the runtime sent during the backfill waits in the inbox).
fn run(
    view: &str,
    mut dataflow: Dataflow,
    backfill: Option<super::backfill::Job>,
    inbox: mpsc::Receiver<Command>,
    queue: &Queue,
    lane: &Ends,
) {
    let mut failed: Option<Error> = None;
    let mut pending = Vec::new();
    let publish = |dataflow: &Dataflow| {
        *queue.stats.lock().unwrap_or_else(|p| p.into_inner()) = dataflow.stats();
    };
    if let Some(job) = backfill
        && let Err(e) = catch_panic("a view's backfill", || {
            job.run(&mut dataflow, &mut pending, &lane.dropped)
        })
    {
        failed = Some(e);
        pending.clear();
    }
    publish(&dataflow);
    for command in inbox {
        match command {
            Command::Push(object, batches, bytes, _held) => {
                let _handled = Handled(queue, bytes);
                if failed.is_none()
                    && let Err(e) = push_all(view, &mut dataflow, object, &batches, &mut pending)
                {
                    failed = Some(e);
                }
            }
            Command::Spilled(object, spilled, _held) => {
                let read = spilled.read();
                queue
                    .spilled
                    .fetch_sub(spilled.len as u64, Ordering::AcqRel);
                if failed.is_none()
                    && let Err(e) = read.and_then(|batches| {
                        push_all(view, &mut dataflow, object, &batches, &mut pending)
                    })
                {
                    failed = Some(e);
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
                lane.waker.wake();
            }
            Command::Save(mode, mut staging, reply) => {
                let saved = catch_panic("saving a view's state", || {
                    dataflow.save(mode, staging.as_mut())
                });
                let _ = reply.send(saved.map(|()| Saved {
                    parts: staging,
                    done: std::time::Instant::now(),
                }));
                lane.waker.wake();
            }
        }
    }
}

/// Pushes changes into the dataflow, its output into `pending`; an error (or a panic) stops at
/// the batch that failed.
fn push_all(
    view: &str,
    dataflow: &mut Dataflow,
    object: ObjectId,
    batches: &[ChangeBatch],
    pending: &mut Vec<ChangeBatch>,
) -> Result<()> {
    for batch in batches {
        pending.extend(catch_panic("a view's operators", || {
            crate::failpoints::failpoint("view_changes", view)?;
            dataflow.push(object, batch)
        })?);
    }
    Ok(())
}

fn end_epoch(
    view: &str,
    dataflow: &mut Dataflow,
    mut out: Vec<ChangeBatch>,
    end: EpochEnd,
) -> Result<Vec<ChangeBatch>> {
    for (source, batches) in &end.upstream {
        push_all(view, dataflow, *source, batches, &mut out)?;
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
