//! Materialized views: the runtime that feeds committed changes through every view's dataflow,
//! ends epochs, and publishes the views' contents.
//!
//! Entry point: [`ViewRuntime`]. One thread owns every dataflow (operators are synchronous).
//! Committed changes arrive in commit order (they are sent under the engine's write lock);
//! an epoch ends every [`BARRIER_INTERVAL`] when something changed, and on `FLUSH`. At the end
//! of an epoch views are processed in creation order, so a view's output reaches the views that
//! read it in the same epoch; then the views' contents are published together as one
//! snapshot map, so one query over several views sees one moment. Snapshots are built when a
//! reader first asks for them after an epoch changed something (a view of millions of rows
//! that changes every epoch costs nothing until it is read).

use std::collections::{BTreeMap, HashMap};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use eddy_common::limits;
use eddy_common::panic::catch_panic;
use eddy_common::{ChangeBatch, Error, ObjectId, Result, SqlState};
use eddy_dataflow::EventTime;
use tokio::sync::oneshot;

use crate::catalog::ViewDef;
use crate::checkpoint::{Checkpoint, Checkpointer, ClockState, ViewState};
use crate::clock::{ClockSpec, StreamClock};
use crate::sink::{Handed, Offsets, Resume, RuntimeSink, SinkEpoch, SinkFeed};
use crate::table::TableData;

/// How often an epoch ends while changes are flowing (`barrier_interval`).
pub const BARRIER_INTERVAL: Duration = Duration::from_millis(100);
/// How often a long backfill reports its progress (as a NOTICE to the session creating it).
const BACKFILL_PROGRESS_INTERVAL: Duration = Duration::from_secs(1);

/// A reservation of the runtime's queue, released once the runtime has processed the changes.
pub struct QueueBudget(#[allow(dead_code)] tokio::sync::OwnedSemaphorePermit);

/// Published contents of every view, all as of one epoch.
pub type Snapshots = Arc<HashMap<ObjectId, Arc<Vec<RecordBatch>>>>;

/// What readers see: the last snapshots built, and whether an epoch has changed some view
/// since (then a reader asks the runtime to build them again).
/// Views that failed and why, by id ([`ViewRuntime::failures`]).
pub type ViewFailures = Arc<RwLock<BTreeMap<ObjectId, Error>>>;

/// Whether view `id` failed.
fn is_failed(failures: &ViewFailures, id: ObjectId) -> bool {
    failures
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .contains_key(&id)
}

struct Published {
    snapshots: Snapshots,
    stale: bool,
}

/// Readers waiting for the runtime to publish fresh snapshots.
#[derive(Default)]
struct SnapshotRequests {
    waiting: Mutex<Vec<mpsc::Sender<Snapshots>>>,
    pending: std::sync::atomic::AtomicBool,
}

pub struct View {
    pub def: ViewDef,
    pub schema: SchemaRef,
    /// The column that carries a watermark, and the sources whose watermark it is.
    pub watermark: Option<(String, Vec<ObjectId>)>,
}

impl Entry {
    /// What the view has committed, in the order sinks record it.
    fn committed_offsets(&self) -> Offsets {
        self.committed.iter().map(|(k, n)| (*k, *n)).collect()
    }

    /// The watermark of the view's watermark column, as of the rows it has processed.
    fn watermark(&self) -> Option<i64> {
        let (_, sources) = self.view.watermark.as_ref()?;
        self.event_time.min_of(sources)
    }
}

/// What a new view reads first from one table: (transaction id, partition, that commit's
/// changes) in commit order.
pub struct Backfill {
    pub object: ObjectId,
    pub name: String,
    pub clock: Option<ClockSpec>,
    /// Per partition, the offset of the first record in `batches` (after retention, not 0).
    pub start: Vec<(u32, u64)>,
    pub batches: Vec<LogRecord>,
}

/// One record of a table's log, as a backfill or a replay reads it.
pub struct LogRecord {
    pub txn: u64,
    pub partition: u32,
    pub changes: Vec<ChangeBatch>,
    /// A watermark mark (then `changes` holds no rows).
    pub watermark: Option<i64>,
}

impl LogRecord {
    /// Decodes a record of `object`'s log read from `partition`.
    pub fn decode(
        record: &eddy_storage::log::Record,
        partition: u32,
        schema: &SchemaRef,
    ) -> Result<LogRecord> {
        let watermark = eddy_storage::log::decode_watermark(&record.payload)?;
        let changes = match watermark {
            Some(_) => Vec::new(),
            None => eddy_storage::log::decode_changes(&record.payload, schema)?,
        };
        Ok(LogRecord {
            txn: record.txn_id.0,
            partition,
            changes,
            watermark,
        })
    }
}

/// A table, or a source as read by one view (its reader's own pace).
type ClockKey = (ObjectId, Option<ObjectId>);

/// Whether `entry` receives changes of `object` sent for `reader` (`None`: every reader).
fn receives(entry: &Entry, object: ObjectId, reader: Option<ObjectId>) -> bool {
    entry.sources.contains(&object) && reader.is_none_or(|view| entry.view.def.id == view)
}

/// One row of `eddy_late_events`.
#[derive(Debug, Clone)]
pub struct LateRecord {
    pub view: String,
    pub event: eddy_dataflow::LateEvent,
    pub received_at: std::time::SystemTime,
}

/// A row a view could not evaluate (a dead letter of the view, `eddy_dead_letters`).
#[derive(Debug, Clone)]
pub struct FailedRow {
    pub view: String,
    /// The input row, as JSON.
    pub row: String,
    pub error: String,
    pub received_at: std::time::SystemTime,
}

/// One row of `eddy_watermarks`: a table partition (or `None` for the merged value) or a view.
#[derive(Debug, Clone)]
pub struct WatermarkRow {
    pub object: String,
    pub partition: Option<u32>,
    pub watermark: Option<i64>,
}

/// One epoch of a view's changes, consolidated, as a subscriber receives it.
#[derive(Debug, Clone)]
pub struct EpochChanges {
    pub epoch: u64,
    pub changes: Option<ChangeBatch>,
}

/// The receiving end of a subscription. Once `events` ends, `ended` holds why when the
/// runtime ended it (it fell behind, its view failed or restarts); unset: the view was dropped.
pub struct Subscription {
    pub events: tokio::sync::mpsc::Receiver<EpochChanges>,
    pub ended: Arc<std::sync::OnceLock<Error>>,
}

impl Subscription {
    /// What the end of `events` means: `Ok` when the view was dropped, else why it ended.
    pub fn end(&self) -> Result<()> {
        match self.ended.get() {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }
}

struct Subscriber {
    view: ObjectId,
    events: tokio::sync::mpsc::Sender<EpochChanges>,
    ended: Arc<std::sync::OnceLock<Error>>,
}

enum Message {
    Subscribe {
        view: ObjectId,
        snapshot: bool,
        subscriber_events: tokio::sync::mpsc::Sender<EpochChanges>,
        ended: Arc<std::sync::OnceLock<Error>>,
        reply: oneshot::Sender<Result<()>>,
    },
    Changes {
        object: ObjectId,
        partition: u32,
        clock: Option<ClockSpec>,
        batches: Vec<ChangeBatch>,
        budget: Option<QueueBudget>,
        reader: Option<ReaderPosition>,
    },
    AddView {
        view: Arc<View>,
        dataflow: eddy_dataflow::Dataflow,
        event_time: Arc<EventTime>,
        sources: Vec<ObjectId>,
        tables: Vec<Backfill>,
        progress: Option<tokio::sync::mpsc::UnboundedSender<String>>,
        reply: oneshot::Sender<Result<()>>,
    },
    LateEvents {
        reply: mpsc::Sender<Vec<LateRecord>>,
    },
    DeadLetters {
        reply: mpsc::Sender<Vec<FailedRow>>,
    },
    Watermarks {
        reply: mpsc::Sender<Vec<WatermarkRow>>,
    },
    DropView {
        id: ObjectId,
    },
    Flush {
        reply: oneshot::Sender<Result<u64>>,
    },
    Operators {
        reply: mpsc::Sender<Vec<(String, eddy_dataflow::OperatorStats)>>,
    },
    Offsets {
        reply: mpsc::Sender<Vec<ConsumerOffsets>>,
    },
    /// Wakes an idle runtime to answer [`SnapshotRequests`].
    Wake,
    /// Ends the epoch and checkpoints (`CHECKPOINT`); answered once the checkpoint is committed.
    Checkpoint {
        reply: oneshot::Sender<Result<u64>>,
    },
    /// Recovery is over: periodic checkpoints may start (one taken earlier would lack the views
    /// still being restored).
    Recovered,
    /// A table's watermark mark, in commit order: live, an idle decision the log now holds;
    /// in a replay, one read from the log. It takes a record's place in partition 0.
    Watermark {
        object: ObjectId,
        watermark: i64,
    },
    /// Start-up: the tables' clocks as their logs end.
    SeedClocks {
        clocks: Vec<(ObjectId, StreamClock)>,
    },
    /// Recovery: the epoch to go on from and the streams' watermarks.
    RestoreClocks {
        epoch: u64,
        clocks: Vec<ClockState>,
    },
    /// Starts handing a view's epochs to a sink; `resume` is what the sink last committed
    /// (`None`: a new sink, which starts from the view's contents).
    AddSink {
        id: ObjectId,
        view: ObjectId,
        resume: Option<Resume>,
        feed: SinkFeed,
        reply: oneshot::Sender<Result<()>>,
    },
    DropSink {
        id: ObjectId,
    },
    /// `ALTER MATERIALIZED VIEW .. RESTART`: takes the views out to be added again, rebuilt
    /// from their inputs. Reading them fails with `why` until then; their subscriptions end;
    /// their sinks wait and get the new contents.
    StopViews {
        ids: Vec<ObjectId>,
        why: Error,
        reply: oneshot::Sender<()>,
    },
    /// Recovery: a view whose dataflow holds its checkpointed state; it has read `committed`.
    RestoreView {
        view: Arc<View>,
        dataflow: eddy_dataflow::Dataflow,
        event_time: Arc<EventTime>,
        sources: Vec<ObjectId>,
        contents: Vec<RecordBatch>,
        committed: HashMap<(ObjectId, u32), u64>,
        reply: oneshot::Sender<Result<()>>,
    },
}

/// Changes that one view's reader of a source read: only that view receives them, and they
/// take it to these source positions (partition, next offset).
#[derive(Debug, Clone)]
pub struct ReaderPosition {
    pub view: ObjectId,
    pub positions: Vec<(u32, u64)>,
    /// The reader's: once set (the view stopped reading, to be dropped or rebuilt with a new
    /// reader), what it sent is dropped, so it never reaches the view's next dataflow.
    pub stopped: Arc<std::sync::atomic::AtomicBool>,
}

/// How far a materialized view has read what it reads: per (table, partition), the offset
/// after the last log record whose changes the view has committed; per (source, partition),
/// the source offset (`eddy_source_offsets`).
#[derive(Debug, Clone)]
pub struct ConsumerOffsets {
    pub id: ObjectId,
    pub view: String,
    pub sources: Vec<ObjectId>,
    pub committed: HashMap<(ObjectId, u32), u64>,
}

pub struct ViewRuntime {
    queue: Mutex<Option<SyncSender<Message>>>,
    published: Arc<RwLock<Published>>,
    requests: Arc<SnapshotRequests>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    budget: Arc<tokio::sync::Semaphore>,
    failures: ViewFailures,
}

impl ViewRuntime {
    /// Starts the runtime thread; with `checkpoints`, it hands a checkpoint to the writer
    /// every `interval` while views change (`None`: only on `CHECKPOINT`).
    /// Idle decisions about tables' watermarks go to `marks` (table, watermark): the engine
    /// records each in the table's log and sends it back as [`ViewRuntime::watermark`] (`None`:
    /// applied at once, for tests without a log).
    pub fn start(
        checkpoints: Option<Checkpoints>,
        marks: Option<tokio::sync::mpsc::Sender<(ObjectId, i64)>>,
    ) -> Result<ViewRuntime> {
        let (tx, rx) = mpsc::sync_channel(limits::RUNTIME_QUEUE_CAPACITY);
        let published = Arc::new(RwLock::new(Published {
            snapshots: Arc::new(HashMap::new()),
            stale: false,
        }));
        let requests = Arc::new(SnapshotRequests::default());
        let failures = ViewFailures::default();
        let state = RuntimeState {
            views: Vec::new(),
            epoch: 0,
            published: Arc::clone(&published),
            requests: Arc::clone(&requests),
            dirty: false,
            failures: Arc::clone(&failures),
            subscribers: Vec::new(),
            clocks: HashMap::new(),
            late: Vec::new(),
            failed: Vec::new(),
            checkpoints,
            last_checkpoint: Instant::now(),
            recovered: false,
            changed_since_checkpoint: false,
            restored_clocks: HashMap::new(),
            sinks: Vec::new(),
            parked_sinks: Vec::new(),
            marks,
        };
        let thread = std::thread::Builder::new()
            .name("eddy-views".into())
            .spawn(move || state.run(&rx))
            .map_err(|e| Error::io("start the view runtime", e))?;
        let budget = Arc::new(tokio::sync::Semaphore::new(
            limits::RUNTIME_QUEUE_KIB as usize,
        ));
        Ok(ViewRuntime {
            queue: Mutex::new(Some(tx)),
            published,
            requests,
            thread: Mutex::new(Some(thread)),
            budget,
            failures,
        })
    }

    fn send(&self, message: Message) -> Result<()> {
        let queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        match queue.as_ref() {
            Some(tx) => tx
                .send(message)
                .map_err(|_| Error::internal("the view runtime stopped")),
            None => Err(Error::new(
                SqlState::ADMIN_SHUTDOWN,
                "the server is shutting down",
            )),
        }
    }

    /// Reserves room for `bytes` of changes in the runtime's queue, waiting while views are
    /// behind (a reservation larger than the whole queue waits for all of it).
    pub async fn reserve(&self, bytes: usize) -> Result<QueueBudget> {
        let kib = (bytes / 1024).clamp(1, limits::RUNTIME_QUEUE_KIB as usize) as u32;
        let permit = Arc::clone(&self.budget)
            .acquire_many_owned(kib)
            .await
            .map_err(|_| Error::internal("the view runtime stopped"))?;
        Ok(QueueBudget(permit))
    }

    /// Committed changes of a table, in commit order (call under the engine's write lock);
    /// `budget` is released once the runtime has processed them.
    pub fn changes(
        &self,
        object: ObjectId,
        partition: u32,
        clock: Option<ClockSpec>,
        batches: Vec<ChangeBatch>,
        budget: Option<QueueBudget>,
    ) -> Result<()> {
        self.send(Message::Changes {
            object,
            partition,
            clock,
            batches,
            budget,
            reader: None,
        })
    }

    /// Changes of a source for the one view whose reader read them (source `partition`).
    pub fn reader_changes(
        &self,
        object: ObjectId,
        partition: u32,
        clock: Option<ClockSpec>,
        batches: Vec<ChangeBatch>,
        budget: QueueBudget,
        reader: ReaderPosition,
    ) -> Result<()> {
        self.send(Message::Changes {
            object,
            partition,
            clock,
            batches,
            budget: Some(budget),
            reader: Some(reader),
        })
    }

    /// Every late row the views dropped (`eddy_late_events`).
    pub fn late_events(&self) -> Result<Vec<LateRecord>> {
        self.ask(|reply| Message::LateEvents { reply })
    }

    /// Views that failed, with why: their dataflow failed (they stopped updating), or they
    /// could not be restored at start-up. Shared with the engine, which reads and adds to it.
    pub fn failures(&self) -> ViewFailures {
        Arc::clone(&self.failures)
    }

    /// Lets periodic checkpoints start: every stored view is restored or marked failed.
    pub fn recovered(&self) -> Result<()> {
        self.send(Message::Recovered)
    }

    /// Every row a view could not evaluate (`eddy_dead_letters`).
    pub fn dead_letters(&self) -> Result<Vec<FailedRow>> {
        self.ask(|reply| Message::DeadLetters { reply })
    }

    /// The watermark of every stream partition and view (`eddy_watermarks`).
    pub fn watermarks(&self) -> Result<Vec<WatermarkRow>> {
        self.ask(|reply| Message::Watermarks { reply })
    }

    /// Sends a question to the runtime thread and waits for the answer; a runtime busy with a
    /// long backfill answers 53000 after 10 s rather than hanging the session.
    fn ask<T>(&self, message: impl FnOnce(mpsc::Sender<T>) -> Message) -> Result<T> {
        let (reply, answer) = mpsc::channel();
        self.send(message(reply))?;
        answer.recv_timeout(Duration::from_secs(10)).map_err(|_| {
            Error::new(
                SqlState::INSUFFICIENT_RESOURCES,
                "the view runtime did not answer within 10 s",
            )
        })
    }

    /// Registers a view; `tables` are the logged commits of the tables it reads (taken under
    /// the write lock, like [`ViewRuntime::changes`]). Resolves once the view is backfilled.
    /// `progress` receives a line every second of a long backfill.
    pub fn add_view(
        &self,
        view: Arc<View>,
        dataflow: eddy_dataflow::Dataflow,
        event_time: Arc<EventTime>,
        sources: Vec<ObjectId>,
        tables: Vec<Backfill>,
        progress: Option<tokio::sync::mpsc::UnboundedSender<String>>,
    ) -> Result<oneshot::Receiver<Result<()>>> {
        let (reply, done) = oneshot::channel();
        self.send(Message::AddView {
            view,
            dataflow,
            event_time,
            sources,
            tables,
            progress,
            reply,
        })?;
        Ok(done)
    }

    /// Subscribes to a view's changes from the next epoch on (with its current contents first
    /// when `snapshot`).
    pub async fn subscribe(&self, view: ObjectId, snapshot: bool) -> Result<Subscription> {
        let (tx, rx) = tokio::sync::mpsc::channel(eddy_common::limits::SUBSCRIBER_LAG_EPOCHS_MAX);
        let ended = Arc::new(std::sync::OnceLock::new());
        let (reply, done) = oneshot::channel();
        self.send(Message::Subscribe {
            view,
            snapshot,
            subscriber_events: tx,
            ended: Arc::clone(&ended),
            reply,
        })?;
        done.await
            .map_err(|_| Error::internal("the view runtime stopped"))??;
        Ok(Subscription { events: rx, ended })
    }

    /// Takes the views `ids` out to rebuild them; see [`Message::StopViews`].
    pub async fn stop_views(&self, ids: Vec<ObjectId>, why: Error) -> Result<()> {
        let (reply, done) = oneshot::channel();
        self.send(Message::StopViews { ids, why, reply })?;
        done.await
            .map_err(|_| Error::internal("the view runtime stopped"))
    }

    /// Drops the view `id` and the subscriptions' temporary views reading `id` (a view or a
    /// table), whose subscribers then see their stream end.
    pub fn drop_view(&self, id: ObjectId) -> Result<()> {
        self.send(Message::DropView { id })
    }

    /// Ends the current epoch and checkpoints every view; resolves with the checkpoint's epoch
    /// once it is committed.
    pub fn checkpoint(&self) -> Result<oneshot::Receiver<Result<u64>>> {
        let (reply, done) = oneshot::channel();
        self.send(Message::Checkpoint { reply })?;
        Ok(done)
    }

    /// Hands the view's epochs to a sink from now on (see `sink.rs` for `resume`).
    pub async fn add_sink(
        &self,
        id: ObjectId,
        view: ObjectId,
        resume: Option<Resume>,
        feed: SinkFeed,
    ) -> Result<()> {
        let (reply, done) = oneshot::channel();
        self.send(Message::AddSink {
            id,
            view,
            resume,
            feed,
            reply,
        })?;
        done.await
            .map_err(|_| Error::internal("the view runtime stopped"))?
    }

    pub fn drop_sink(&self, id: ObjectId) -> Result<()> {
        self.send(Message::DropSink { id })
    }

    /// A table's watermark rose to `watermark` by a mark of its log (in commit order).
    pub fn watermark(&self, object: ObjectId, watermark: i64) -> Result<()> {
        self.send(Message::Watermark { object, watermark })
    }

    /// Start-up, before any change: each table's clock as its log ends, so that the watermark
    /// after a restart is the one before it.
    pub(crate) fn seed_clocks(&self, clocks: Vec<(ObjectId, StreamClock)>) -> Result<()> {
        self.send(Message::SeedClocks { clocks })
    }

    /// Recovery, before any change: the epoch to continue from and the streams' watermarks.
    pub fn restore_clocks(&self, epoch: u64, clocks: Vec<ClockState>) -> Result<()> {
        self.send(Message::RestoreClocks { epoch, clocks })
    }

    /// Recovery: registers a view whose dataflow was loaded from a checkpoint, with its
    /// contents and the offsets it had committed then (it reads on from there).
    #[allow(clippy::too_many_arguments)]
    pub fn restore_view(
        &self,
        view: Arc<View>,
        dataflow: eddy_dataflow::Dataflow,
        event_time: Arc<EventTime>,
        sources: Vec<ObjectId>,
        contents: Vec<RecordBatch>,
        committed: HashMap<(ObjectId, u32), u64>,
    ) -> Result<oneshot::Receiver<Result<()>>> {
        let (reply, done) = oneshot::channel();
        self.send(Message::RestoreView {
            view,
            dataflow,
            event_time,
            sources,
            contents,
            committed,
            reply,
        })?;
        Ok(done)
    }

    /// Ends the current epoch; resolves once every view reflects everything sent before.
    pub fn flush(&self) -> Result<oneshot::Receiver<Result<u64>>> {
        let (reply, done) = oneshot::channel();
        self.send(Message::Flush { reply })?;
        Ok(done)
    }

    /// How far every materialized view has read its tables' logs.
    pub fn offsets(&self) -> Result<Vec<ConsumerOffsets>> {
        self.ask(|reply| Message::Offsets { reply })
    }

    /// Every operator of every materialized view (temporary subscription views excluded).
    pub fn operators(&self) -> Result<Vec<(String, eddy_dataflow::OperatorStats)>> {
        self.ask(|reply| Message::Operators { reply })
    }

    /// The contents of every view as of the last epoch. When an epoch changed some view since
    /// they were last built, the runtime builds them between two messages (before the queued
    /// changes behind them); a runtime busy for 10 s (a long backfill) leaves the reader with
    /// the last snapshots built, an earlier but consistent moment.
    pub fn snapshots(&self) -> Snapshots {
        {
            let published = self.published.read().unwrap_or_else(|p| p.into_inner());
            if !published.stale {
                return Arc::clone(&published.snapshots);
            }
        }
        let (reply, answer) = mpsc::channel();
        self.requests
            .waiting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(reply);
        self.requests
            .pending
            .store(true, std::sync::atomic::Ordering::Release);
        // An idle runtime waits on its queue; a full queue means it is busy and looks soon.
        if let Some(queue) = self
            .queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            let _ = queue.try_send(Message::Wake);
        }
        answer
            .recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|_| {
                tracing::warn!(
                    "the view runtime did not publish within 10 s; reading earlier snapshots"
                );
                Arc::clone(
                    &self
                        .published
                        .read()
                        .unwrap_or_else(|p| p.into_inner())
                        .snapshots,
                )
            })
    }

    pub fn shutdown(&self) {
        self.queue.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(t) = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = t.join();
        }
    }
}

struct Entry {
    view: Arc<View>,
    dataflow: eddy_dataflow::Dataflow,
    event_time: Arc<EventTime>,
    sources: Vec<ObjectId>,
    /// Output produced this epoch, not yet applied.
    pending: Vec<ChangeBatch>,
    contents: TableData,
    /// Log records read per (table, partition): each message of changes is one record; for a
    /// source, the source offset its reader got to.
    read: HashMap<(ObjectId, u32), u64>,
    /// `read` as of the last epoch the view committed.
    committed: HashMap<(ObjectId, u32), u64>,
}

/// Where and how often the runtime checkpoints.
pub struct Checkpoints {
    pub writer: Arc<Checkpointer>,
    /// `None`: only when asked (`CHECKPOINT`).
    pub interval: Option<Duration>,
    /// Shards per sharded operator (recorded: state is restored into as many).
    pub workers: usize,
}

struct RuntimeState {
    views: Vec<Entry>,
    epoch: u64,
    published: Arc<RwLock<Published>>,
    requests: Arc<SnapshotRequests>,
    dirty: bool,
    /// Views that failed (they stop updating); reported by every FLUSH until dropped.
    failures: ViewFailures,
    subscribers: Vec<Subscriber>,
    /// Watermark of every stream that sent changes; a source's per view reading it.
    clocks: HashMap<ClockKey, StreamClock>,
    late: Vec<LateRecord>,
    failed: Vec<FailedRow>,
    checkpoints: Option<Checkpoints>,
    last_checkpoint: Instant,
    /// Every stored view is restored (or marked failed): periodic checkpoints may run.
    recovered: bool,
    /// Some epoch changed a view since the last checkpoint.
    changed_since_checkpoint: bool,
    /// Streams' watermarks from a checkpoint, taken up by their clocks when they start.
    restored_clocks: HashMap<ClockKey, ClockState>,
    sinks: Vec<RuntimeSink>,
    /// Sinks of views being rebuilt ([`Message::StopViews`]): back in `sinks` when their view is.
    parked_sinks: Vec<RuntimeSink>,
    /// Where idle decisions about tables' watermarks go to be recorded in their logs.
    marks: Option<tokio::sync::mpsc::Sender<(ObjectId, i64)>>,
}

impl RuntimeState {
    fn run(mut self, queue: &Receiver<Message>) {
        let mut last_epoch = Instant::now();
        loop {
            // Idle, wait for work; with changes pending, wait only until the barrier is due.
            let wait = if self.dirty {
                BARRIER_INTERVAL.saturating_sub(last_epoch.elapsed())
            } else {
                BARRIER_INTERVAL
            };
            match queue.recv_timeout(wait) {
                Ok(message) => self.handle(message, &mut last_epoch),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    self.requests
                        .waiting
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .clear();
                    return;
                }
            }
            self.answer_snapshot_requests();
            self.expire_idle_partitions();
            // Views whose output moves with the wall clock (temporal filters) see every epoch.
            if !self.dirty && self.views.iter().any(|e| e.event_time.wants_ticks()) {
                self.dirty = true;
            }
            if self.dirty && last_epoch.elapsed() >= BARRIER_INTERVAL {
                self.end_epoch_logged();
                last_epoch = Instant::now();
            }
            // A sink that fell behind gets the view's contents once it has caught up, even when
            // no epoch ends (between epochs, contents and offsets agree).
            if !self.dirty
                && self
                    .sinks
                    .iter()
                    .any(|s| s.waiting.is_some() && s.feed.drained())
            {
                self.feed_sinks(&HashMap::new());
            }
            let due = self
                .checkpoints
                .as_ref()
                .and_then(|c| c.interval)
                .is_some_and(|i| self.last_checkpoint.elapsed() >= i);
            if due && self.recovered && self.changed_since_checkpoint && !self.dirty {
                self.checkpoint(None);
            }
        }
    }

    /// Copies every materialized view's state (at an epoch end, when nothing is in flight) and
    /// hands it to the checkpoint writer. A periodic checkpoint is skipped while the last one
    /// is still being written; `CHECKPOINT` waits for the writer.
    fn checkpoint(&mut self, reply: Option<oneshot::Sender<Result<u64>>>) {
        self.sink_progress();
        let Some(checkpoints) = &self.checkpoints else {
            if let Some(reply) = reply {
                let _ = reply.send(Err(Error::unsupported(
                    "this server does not write checkpoints",
                )));
            }
            return;
        };
        let started = Instant::now();
        let started_at_micros = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as i64);
        let mut views = Vec::new();
        for entry in self.views.iter_mut().filter(|e| !e.view.def.sql.is_empty()) {
            let id = entry.view.def.id;
            if is_failed(&self.failures, id) {
                // Its state stopped at the failure; the next start rebuilds it from the log.
                tracing::warn!(view = %entry.view.def.name, "the checkpoint leaves out a failed view: a restart rebuilds it from the log");
                continue;
            }
            let state = (|| -> Result<ViewState> {
                Ok(ViewState {
                    id,
                    parts: catch_panic("saving a view's state", || entry.dataflow.save())?,
                    contents: entry.contents.snapshot()?.as_ref().clone(),
                    committed: entry
                        .committed
                        .iter()
                        .map(|((o, p), n)| (*o, *p, *n))
                        .collect(),
                    watermarks: entry.event_time.watermarks(),
                })
            })();
            match state {
                Ok(state) => views.push(state),
                Err(e) => {
                    if let Some(reply) = reply {
                        let _ = reply.send(Err(e));
                    } else {
                        tracing::error!(view = %entry.view.def.name, error = %e, "copying a view's state for a checkpoint failed");
                    }
                    return;
                }
            }
        }
        let clocks = self
            .clocks
            .iter()
            .map(|((object, reader), c)| ClockState {
                object: *object,
                reader: *reader,
                partitions: c.partitions.clone(),
                watermark: c.watermark,
            })
            .collect();
        let wait = reply.is_some();
        let checkpoint = Checkpoint {
            epoch: self.epoch,
            started_at_micros,
            pause: started.elapsed(),
            started,
            workers: checkpoints.workers,
            views,
            clocks,
            reply,
        };
        match checkpoints.writer.submit(checkpoint, wait) {
            Ok(()) => {
                self.last_checkpoint = Instant::now();
                self.changed_since_checkpoint = false;
            }
            Err(c) => {
                if let Some(reply) = c.reply {
                    let _ = reply.send(Err(Error::new(
                        SqlState::ADMIN_SHUTDOWN,
                        "the checkpoint writer stopped",
                    )));
                }
            }
        }
    }

    /// Hands each sink its view's changes of the epoch that just ended (`outputs`); a sink
    /// waiting for its view to catch up gets the view's whole contents once it has (and once
    /// it has written what it was handed before). A sink whose backlog would pass its limit
    /// gets no more changes and waits for its contents the same way.
    fn feed_sinks(&mut self, outputs: &HashMap<ObjectId, Vec<ChangeBatch>>) {
        let epoch = self.epoch;
        for sink in &mut self.sinks {
            let Some(entry) = self.views.iter_mut().find(|e| e.view.def.id == sink.view) else {
                continue;
            };
            if is_failed(&self.failures, sink.view) {
                continue;
            }
            let read = entry.committed_offsets();
            let handed = match &sink.waiting {
                Some(until)
                    if sink.feed.drained()
                        && until
                            .as_ref()
                            .is_none_or(|s| crate::sink::at_least(&read, s)) =>
                {
                    match entry.contents.snapshot() {
                        Ok(rows) => {
                            sink.waiting = None;
                            tracing::info!(view = %entry.view.def.name, sink = %sink.id, epoch, "the sink is handed the view's whole contents");
                            Handed::Contents(
                                rows.iter()
                                    .filter(|b| b.num_rows() > 0)
                                    .cloned()
                                    .map(ChangeBatch::inserts)
                                    .collect(),
                            )
                        }
                        Err(e) => {
                            tracing::error!(view = %entry.view.def.name, error = %e, "reading a view's contents for its sink failed");
                            continue;
                        }
                    }
                }
                Some(_) => continue,
                None => match outputs.get(&sink.view) {
                    Some(out) if out.iter().any(|b| !b.is_empty()) => {
                        Handed::Changes(out.iter().filter(|b| !b.is_empty()).cloned().collect())
                    }
                    _ => continue,
                },
            };
            let bytes = match &handed {
                Handed::Changes(batches) => batches
                    .iter()
                    .map(|c| {
                        c.rows().get_array_memory_size()
                            + arrow::array::Array::get_array_memory_size(c.diffs())
                    })
                    .sum(),
                Handed::Contents(_) => 0,
            };
            if sink.feed.full(bytes) {
                tracing::warn!(view = %entry.view.def.name, sink = %sink.id, epoch, limit = sink.feed.limit, "a sink fell behind by more than its buffer; it gets the view's contents once it catches up");
                sink.waiting = Some(None);
                continue;
            }
            sink.feed.send(SinkEpoch {
                epoch,
                offsets: read.clone(),
                handed,
                bytes,
            });
            sink.sent = Some(read);
        }
    }

    /// With a checkpoint: sinks whose view read on without changing record how far it read,
    /// so that after a restart they need not replace their table.
    fn sink_progress(&mut self) {
        let epoch = self.epoch;
        for sink in self.sinks.iter_mut().filter(|s| s.waiting.is_none()) {
            let Some(entry) = self.views.iter().find(|e| e.view.def.id == sink.view) else {
                continue;
            };
            let read = entry.committed_offsets();
            if sink.sent.as_ref() != Some(&read) {
                sink.feed.send(SinkEpoch {
                    epoch,
                    offsets: read.clone(),
                    handed: Handed::Changes(Vec::new()),
                    bytes: 0,
                });
                sink.sent = Some(read);
            }
        }
    }

    /// Recovery: registers a view restored from a checkpoint.
    fn restore_view(
        &mut self,
        view: Arc<View>,
        dataflow: eddy_dataflow::Dataflow,
        event_time: Arc<EventTime>,
        sources: Vec<ObjectId>,
        contents: Vec<RecordBatch>,
        committed: HashMap<(ObjectId, u32), u64>,
    ) -> Result<()> {
        let mut data = TableData::for_view(Arc::clone(&view.schema));
        let inserts: Vec<ChangeBatch> = contents
            .into_iter()
            .filter(|b| b.num_rows() > 0)
            .map(ChangeBatch::inserts)
            .collect();
        if !inserts.is_empty() {
            data.apply(&inserts)?;
        }
        self.views.push(Entry {
            view,
            dataflow,
            event_time,
            sources,
            pending: Vec::new(),
            contents: data,
            read: committed.clone(),
            committed,
        });
        self.mark_stale();
        Ok(())
    }

    fn handle(&mut self, message: Message, last_epoch: &mut Instant) {
        match message {
            Message::Changes {
                object,
                partition,
                clock,
                batches,
                budget,
                reader,
            } => {
                if reader
                    .as_ref()
                    .is_some_and(|r| r.stopped.load(std::sync::atomic::Ordering::Acquire))
                {
                    return;
                }
                let view = reader.as_ref().map(|r| r.view);
                for entry in self.views.iter_mut().filter(|e| receives(e, object, view)) {
                    match &reader {
                        Some(r) => entry.read.extend(
                            r.positions
                                .iter()
                                .map(|(p, offset)| ((object, *p), *offset)),
                        ),
                        None => *entry.read.entry((object, partition)).or_default() += 1,
                    }
                }
                self.push(object, partition, clock, &batches, view);
                drop(budget);
            }
            Message::AddView {
                view,
                dataflow,
                event_time,
                sources,
                tables,
                progress,
                reply,
            } => {
                let result = self.add_view(
                    view,
                    dataflow,
                    event_time,
                    sources,
                    tables,
                    progress.as_ref(),
                );
                *last_epoch = Instant::now();
                let _ = reply.send(result);
            }
            Message::Subscribe {
                view,
                snapshot,
                subscriber_events,
                ended,
                reply,
            } => {
                let result = self.subscribe(view, snapshot, subscriber_events, ended);
                let _ = reply.send(result);
            }
            Message::DropView { id } => {
                // Catalog views that read `id` were dropped before it; what still reads it are
                // subscriptions' temporary views, whose streams end with it.
                let gone: Vec<String> = self
                    .views
                    .iter()
                    .filter(|v| v.view.def.id == id || v.sources.contains(&id))
                    .map(|v| v.view.def.name.clone())
                    .collect();
                self.late.retain(|r| !gone.contains(&r.view));
                self.failed.retain(|r| !gone.contains(&r.view));
                self.views
                    .retain(|v| v.view.def.id != id && !v.sources.contains(&id));
                let views = &self.views;
                self.sinks
                    .retain(|s| views.iter().any(|v| v.view.def.id == s.view));
                self.clocks
                    .retain(|(object, reader), _| *object != id && *reader != Some(id));
                let views = &self.views;
                self.subscribers
                    .retain(|s| views.iter().any(|v| v.view.def.id == s.view));
                self.failures
                    .write()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&id);
                self.mark_stale();
            }
            Message::LateEvents { reply } => {
                let _ = reply.send(self.late.clone());
            }
            Message::Recovered => self.recovered = true,
            Message::DeadLetters { reply } => {
                let _ = reply.send(self.failed.clone());
            }
            Message::Watermarks { reply } => {
                let _ = reply.send(self.watermark_rows());
            }
            Message::Offsets { reply } => {
                let rows = self
                    .views
                    .iter()
                    .filter(|v| !v.view.def.sql.is_empty())
                    .map(|v| ConsumerOffsets {
                        id: v.view.def.id,
                        view: v.view.def.qualified().display(),
                        sources: v.sources.clone(),
                        committed: v.committed.clone(),
                    })
                    .collect();
                let _ = reply.send(rows);
            }
            Message::Operators { reply } => {
                let rows = self
                    .views
                    .iter()
                    .filter(|v| !v.view.def.sql.is_empty())
                    .flat_map(|v| {
                        v.dataflow
                            .stats()
                            .into_iter()
                            .map(|s| (v.view.def.qualified().display(), s))
                    })
                    .collect();
                let _ = reply.send(rows);
            }
            Message::Wake => {}
            Message::Checkpoint { reply } => {
                let ended = self.end_epoch();
                *last_epoch = Instant::now();
                match ended {
                    Ok(()) => self.checkpoint(Some(reply)),
                    Err(e) => {
                        let _ = reply.send(Err(e));
                    }
                }
            }
            Message::AddSink {
                id,
                view,
                resume,
                feed,
                reply,
            } => {
                let result = match self.views.iter().find(|e| e.view.def.id == view) {
                    Some(entry) => {
                        let read = entry.committed_offsets();
                        let waiting = match resume {
                            None => Some(None),
                            Some(r) if r.clean && r.offsets == read => None,
                            Some(r) if crate::sink::at_least(&read, &r.offsets) => Some(None),
                            Some(r) => Some(Some(r.offsets)),
                        };
                        tracing::info!(view = %entry.view.def.name, sink = %id, live = waiting.is_none(), waits = matches!(waiting, Some(Some(_))), "a sink starts");
                        self.sinks.push(RuntimeSink {
                            id,
                            view,
                            waiting,
                            feed,
                            sent: None,
                        });
                        self.feed_sinks(&HashMap::new());
                        Ok(())
                    }
                    None => Err(Error::internal("a sink of an unknown view")),
                };
                let _ = reply.send(result);
            }
            Message::DropSink { id } => {
                self.sinks.retain(|s| s.id != id);
                self.parked_sinks.retain(|s| s.id != id);
            }
            Message::StopViews { ids, why, reply } => {
                self.stop_views(&ids, &why);
                let _ = reply.send(());
            }
            Message::RestoreClocks { epoch, clocks } => {
                self.epoch = epoch;
                for c in clocks {
                    // A seeded table clock goes back to the checkpoint's: the replay that follows
                    // raises it again, judging the replayed rows as they were judged live.
                    match self.clocks.get_mut(&(c.object, c.reader)) {
                        Some(clock) if clock.partitions.len() == c.partitions.len() => {
                            clock.partitions = c.partitions;
                            clock.watermark = c.watermark;
                        }
                        _ => {
                            self.restored_clocks.insert((c.object, c.reader), c);
                        }
                    }
                }
            }
            Message::SeedClocks { clocks } => {
                for (object, clock) in clocks {
                    self.clocks.insert((object, None), clock);
                }
            }
            Message::Watermark { object, watermark } => self.apply_mark(object, watermark),
            Message::RestoreView {
                view,
                dataflow,
                event_time,
                sources,
                contents,
                committed,
                reply,
            } => {
                let _ = reply.send(
                    self.restore_view(view, dataflow, event_time, sources, contents, committed),
                );
            }
            Message::Flush { reply } => {
                // Failed views do not hold FLUSH (nor writers) back: the session reports them.
                let result = self.end_epoch().map(|()| self.epoch);
                *last_epoch = Instant::now();
                let _ = reply.send(result);
            }
        }
    }

    fn name_of(&self, id: ObjectId) -> String {
        self.views
            .iter()
            .find(|v| v.view.def.id == id)
            .map_or_else(|| id.to_string(), |v| v.view.def.qualified().display())
    }

    /// Marks `view` failed, and every view reading it (they would go stale silently); their
    /// subscriptions end. The other views and every writer go on.
    fn fail(&mut self, view: ObjectId, error: Error) {
        tracing::error!(view = %self.name_of(view), error = %error, "a view's dataflow failed; it stops updating");
        let name = self.name_of(view);
        let mut failed = vec![(
            view,
            Error::new(
                error.state,
                format!("materialized view {name} failed: {}", error.message),
            )
            .with_hint(format!(
                "ALTER MATERIALIZED VIEW {name} RESTART rebuilds it from its inputs"
            )),
        )];
        let mut at = 0;
        while let Some((id, _)) = failed.get(at) {
            let id = *id;
            at += 1;
            let upstream = self.name_of(id);
            for reader in self.views.iter().filter(|e| e.sources.contains(&id)) {
                let reader_id = reader.view.def.id;
                if failed.iter().any(|(f, _)| *f == reader_id) {
                    continue;
                }
                let reader_name = reader.view.def.qualified().display();
                failed.push((
                    reader_id,
                    Error::new(
                        SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE,
                        format!(
                            "materialized view {reader_name} reads materialized view {upstream}, which failed"
                        ),
                    )
                    .with_hint(format!(
                        "ALTER MATERIALIZED VIEW {name} RESTART rebuilds it and the views reading it"
                    )),
                ));
            }
        }
        let mut failures = self.failures.write().unwrap_or_else(|p| p.into_inner());
        for (id, error) in failed {
            self.subscribers.retain(|s| {
                let reading = s.view == id;
                if reading {
                    let _ = s.ended.set(error.clone());
                }
                !reading
            });
            if let Some(entry) = self.views.iter_mut().find(|e| e.view.def.id == id) {
                entry.pending.clear();
            }
            failures.entry(id).or_insert(error);
        }
    }

    /// Feeds a table's or view's changes to every view reading it (a source's to the one view
    /// whose reader read them); a view whose dataflow fails stops, the others go on. Then
    /// advances the stream's watermark: rows are judged against the watermark as it stood
    /// before their batch.
    fn push(
        &mut self,
        object: ObjectId,
        partition: u32,
        clock: Option<ClockSpec>,
        batches: &[ChangeBatch],
        reader: Option<ObjectId>,
    ) {
        let mut failed = Vec::new();
        for entry in self
            .views
            .iter_mut()
            .filter(|e| receives(e, object, reader))
        {
            if is_failed(&self.failures, entry.view.def.id) {
                continue;
            }
            for batch in batches {
                match catch_panic("a view's operators", || {
                    crate::failpoints::failpoint("view_changes", &entry.view.def.name)?;
                    entry.dataflow.push(object, batch)
                }) {
                    Ok(out) => entry.pending.extend(out),
                    Err(e) => {
                        failed.push((entry.view.def.id, e));
                        break;
                    }
                }
                self.dirty = true;
            }
        }
        for (view, e) in failed {
            self.fail(view, e);
        }
        let late: Vec<(String, Arc<EventTime>)> = self
            .views
            .iter()
            .map(|e| (e.view.def.name.clone(), Arc::clone(&e.event_time)))
            .collect();
        for (name, event_time) in late {
            self.collect_late(&name, &event_time);
        }
        let Some(spec) = clock else { return };
        let restored = &mut self.restored_clocks;
        let clock = self.clocks.entry((object, reader)).or_insert_with(|| {
            let mut clock = StreamClock::new(spec);
            if let Some(saved) = restored.remove(&(object, reader))
                && saved.partitions.len() == clock.partitions.len()
            {
                clock.partitions = saved.partitions;
                clock.watermark = saved.watermark;
            }
            clock
        });
        match clock.observe(partition, batches) {
            Ok(Some(watermark)) => {
                for entry in self.views.iter().filter(|e| receives(e, object, reader)) {
                    entry.event_time.advance(object, watermark);
                }
                self.dirty = true;
            }
            Ok(None) => {}
            Err(e) => tracing::error!(error = %e, "reading event times failed"),
        }
    }

    /// Partitions idle past their stream's `idle_timeout` stop holding its watermark back. For
    /// a table, the decision goes to its log first and is applied when it comes back as a mark
    /// ([`RuntimeState::apply_mark`]); a source's reader, which has no log of Eddy's, applies it.
    fn expire_idle_partitions(&mut self) {
        let now = Instant::now();
        let mut raised = Vec::new();
        for (key, clock) in &mut self.clocks {
            let Some(w) = clock.idle_raise(now) else {
                continue;
            };
            match (&self.marks, key.1) {
                (Some(marks), None) => {
                    // Full: asked again at the next look.
                    if marks.try_send((key.0, w)).is_ok() {
                        clock.requested = Some(w);
                    }
                }
                _ => {
                    if let Some(w) = clock.mark(w) {
                        raised.push((*key, w));
                    }
                }
            }
        }
        for ((object, reader), watermark) in raised {
            for entry in self.views.iter().filter(|e| receives(e, object, reader)) {
                entry.event_time.advance(object, watermark);
            }
            self.dirty = true;
        }
    }

    /// A table's watermark mark (live or replayed): it counts as the record it is in partition 0
    /// of the table's log for every view reading it, and raises the table's clock.
    fn apply_mark(&mut self, object: ObjectId, watermark: i64) {
        for entry in self.views.iter_mut().filter(|e| receives(e, object, None)) {
            *entry.read.entry((object, 0)).or_default() += 1;
        }
        let Some(clock) = self.clocks.get_mut(&(object, None)) else {
            tracing::warn!(object = %object, "a watermark mark for a table without a clock");
            return;
        };
        if let Some(w) = clock.mark(watermark) {
            for entry in self.views.iter().filter(|e| receives(e, object, None)) {
                entry.event_time.advance(object, w);
            }
        }
        self.dirty = true;
    }

    /// Collects what a view's operators set aside: late rows and rows that failed to evaluate.
    fn collect_late(&mut self, view: &str, event_time: &EventTime) {
        let failed = event_time.take_failed_rows();
        if !failed.is_empty() {
            let now = std::time::SystemTime::now();
            tracing::warn!(
                view,
                rows = failed.len(),
                "rows a view could not evaluate went to eddy_dead_letters"
            );
            self.failed
                .extend(failed.into_iter().map(|(row, error)| FailedRow {
                    view: view.to_owned(),
                    row,
                    error,
                    received_at: now,
                }));
            let max = eddy_common::limits::LATE_EVENTS_KEPT_MAX;
            if self.failed.len() > max {
                let excess = self.failed.len() - max;
                self.failed.drain(..excess);
            }
        }
        let events = event_time.take_late_events();
        if events.is_empty() {
            return;
        }
        let now = std::time::SystemTime::now();
        self.late.extend(events.into_iter().map(|event| LateRecord {
            view: view.to_owned(),
            event,
            received_at: now,
        }));
        // Bounded: the oldest records go first.
        let max = eddy_common::limits::LATE_EVENTS_KEPT_MAX;
        if self.late.len() > max {
            let excess = self.late.len() - max;
            self.late.drain(..excess);
        }
    }

    fn watermark_rows(&self) -> Vec<WatermarkRow> {
        let mut rows = Vec::new();
        for ((id, reader), clock) in &self.clocks {
            // A source's watermark is its reader's: named after the view reading it.
            let object = match reader {
                Some(view) => format!("{id} ({})", self.name_of(*view)),
                None => id.to_string(),
            };
            rows.push(WatermarkRow {
                object: object.clone(),
                partition: None,
                watermark: clock.watermark,
            });
            for (p, w) in clock.partitions.iter().enumerate() {
                rows.push(WatermarkRow {
                    object: object.clone(),
                    partition: Some(p as u32),
                    watermark: *w,
                });
            }
        }
        // A view's watermark: that of its watermark column, else the least over the streams
        // (and watermarked views) it reads.
        for entry in self.views.iter().filter(|e| !e.view.def.sql.is_empty()) {
            let watermark = match &entry.view.watermark {
                Some(_) => entry.watermark(),
                None => {
                    let timed: Vec<ObjectId> = entry
                        .sources
                        .iter()
                        .copied()
                        .filter(|s| {
                            self.clocks.contains_key(&(*s, None))
                                || self.clocks.contains_key(&(*s, Some(entry.view.def.id)))
                                || self
                                    .views
                                    .iter()
                                    .any(|v| v.view.def.id == *s && v.view.watermark.is_some())
                        })
                        .collect();
                    if timed.is_empty() {
                        continue;
                    }
                    entry.event_time.min_of(&timed)
                }
            };
            rows.push(WatermarkRow {
                object: entry.view.def.name.clone(),
                partition: None,
                watermark,
            });
        }
        rows
    }

    fn add_view(
        &mut self,
        view: Arc<View>,
        mut dataflow: eddy_dataflow::Dataflow,
        event_time: Arc<EventTime>,
        sources: Vec<ObjectId>,
        tables: Vec<Backfill>,
        progress: Option<&tokio::sync::mpsc::UnboundedSender<String>>,
    ) -> Result<()> {
        // Close the epoch in flight so that upstream views' contents are complete.
        self.end_epoch()?;
        let mut pending = Vec::new();
        let mut read: HashMap<(ObjectId, u32), u64> = HashMap::new();
        for table in &tables {
            for (partition, start) in &table.start {
                read.insert((table.object, *partition), *start);
                if *start > 0
                    && let Some(progress) = progress
                {
                    let _ = progress.send(format!(
                        "table \"{}\" keeps its log from offset {start} of partition {partition} on (retention deleted what came before): the view is built from what it keeps",
                        table.name
                    ));
                }
            }
            for record in &table.batches {
                *read.entry((table.object, record.partition)).or_default() += 1;
            }
        }
        let mut inputs = tables;
        for source in &sources {
            if let Some(upstream) = self.views.iter_mut().find(|e| e.view.def.id == *source) {
                let batches = upstream
                    .contents
                    .snapshot()?
                    .iter()
                    .cloned()
                    .map(|b| LogRecord {
                        txn: 0,
                        partition: 0,
                        changes: vec![ChangeBatch::inserts(b)],
                        watermark: None,
                    })
                    .collect();
                inputs.push(Backfill {
                    object: *source,
                    name: upstream.view.def.name.clone(),
                    clock: None,
                    start: Vec::new(),
                    batches,
                });
            }
        }
        let rows: usize = inputs
            .iter()
            .flat_map(|b| b.batches.iter())
            .flat_map(|r| r.changes.iter())
            .map(|b| b.len())
            .sum();
        tracing::info!(view = %view.def.name, rows, "backfilling a materialized view");
        let started = Instant::now();
        let mut reported = Instant::now();
        let mut done = 0usize;
        let mut since_epoch = 0usize;
        // Every table's commits in commit order (views' contents first), each stream with its
        // own clock so that its watermark moves as it did live: by the data and the log's
        // watermark marks, never by the wall clock.
        let mut clocks: HashMap<ObjectId, StreamClock> = inputs
            .iter()
            .filter_map(|i| Some((i.object, StreamClock::replaying(i.clock?))))
            .collect();
        let mut commits: Vec<(ObjectId, &LogRecord)> = inputs
            .iter()
            .flat_map(|i| i.batches.iter().map(move |r| (i.object, r)))
            .collect();
        commits.sort_by_key(|(object, r)| (r.txn, *object, r.partition));
        for (object, record) in commits {
            for batch in &record.changes {
                pending.extend(catch_panic("a view's operators", || {
                    dataflow.push(object, batch)
                })?);
                done += batch.len();
                since_epoch += batch.len();
            }
            if let Some(clock) = clocks.get_mut(&object) {
                let raised = match record.watermark {
                    Some(mark) => clock.mark(mark),
                    None => clock.observe(record.partition, &record.changes)?,
                };
                if let Some(w) = raised {
                    event_time.advance(object, w);
                }
            }
            if since_epoch >= limits::BACKFILL_EPOCH_ROWS {
                since_epoch = 0;
                pending.extend(catch_panic("a view's operators", || dataflow.end_epoch())?);
            }
            // Readers of the other views need not wait for a long backfill: their contents
            // stay as of the epoch ended above until it is done.
            self.answer_snapshot_requests();
            if let Some(progress) = progress
                && reported.elapsed() >= BACKFILL_PROGRESS_INTERVAL
            {
                reported = Instant::now();
                let _ = progress.send(format!(
                    "materialized view \"{}\": backfilled {done} of {rows} rows ({} s)",
                    view.def.name,
                    started.elapsed().as_secs()
                ));
            }
        }
        for input in &inputs {
            let live = match self.clocks.get(&(input.object, None)) {
                Some(clock) => clock.watermark,
                None => self
                    .views
                    .iter()
                    .find(|e| e.view.def.id == input.object)
                    .and_then(Entry::watermark),
            };
            if let Some(live) = live {
                event_time.advance(input.object, live);
            }
        }
        self.collect_late(&view.def.name, &event_time);
        let contents = TableData::for_view(Arc::clone(&view.schema));
        let id = view.def.id;
        self.failures
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
        let (back, parked) = std::mem::take(&mut self.parked_sinks)
            .into_iter()
            .partition(|s| s.view == id);
        self.parked_sinks = parked;
        self.sinks.extend(back);
        self.views.push(Entry {
            view,
            dataflow,
            event_time,
            sources,
            pending,
            contents,
            committed: HashMap::new(),
            read,
        });
        self.dirty = true;
        self.end_epoch()
    }

    fn subscribe(
        &mut self,
        view: ObjectId,
        snapshot: bool,
        events: tokio::sync::mpsc::Sender<EpochChanges>,
        ended: Arc<std::sync::OnceLock<Error>>,
    ) -> Result<()> {
        let entry = self
            .views
            .iter_mut()
            .find(|e| e.view.def.id == view)
            .ok_or_else(|| Error::internal("subscribing to an unknown view"))?;
        if snapshot {
            let contents = entry.contents.snapshot()?;
            let batches: Vec<ChangeBatch> =
                contents.iter().cloned().map(ChangeBatch::inserts).collect();
            let changes = eddy_dataflow::consolidate(&entry.view.schema, &batches)?;
            let _ = events.try_send(EpochChanges {
                epoch: self.epoch,
                changes,
            });
        }
        self.subscribers.push(Subscriber {
            view,
            events,
            ended,
        });
        Ok(())
    }

    /// Hands each subscriber its view's consolidated changes of the epoch that just ended;
    /// drops subscribers that are gone or too far behind.
    fn notify(&mut self, outputs: &HashMap<ObjectId, Vec<ChangeBatch>>) {
        let epoch = self.epoch;
        let views = &self.views;
        self.subscribers.retain(|s| {
            let Some(entry) = views.iter().find(|e| e.view.def.id == s.view) else { return false };
            let changes = match outputs.get(&s.view) {
                Some(out) => match eddy_dataflow::consolidate(&entry.view.schema, out) {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::error!(error = %e, "consolidating a subscription's changes failed");
                        return false;
                    }
                },
                None => None,
            };
            match s.events.try_send(EpochChanges { epoch, changes }) {
                Ok(()) => true,
                Err(tokio::sync::mpsc::error::TrySendError::Full(_)) => {
                    let _ = s.ended.set(Error::new(
                        SqlState::INSUFFICIENT_RESOURCES,
                        format!(
                            "subscription fell more than {} epochs behind and was dropped",
                            eddy_common::limits::SUBSCRIBER_LAG_EPOCHS_MAX
                        ),
                    ));
                    false
                }
                Err(tokio::sync::mpsc::error::TrySendError::Closed(_)) => false,
            }
        });
    }

    fn end_epoch_logged(&mut self) {
        if let Err(e) = self.end_epoch() {
            tracing::error!(error = %e, "ending an epoch failed");
        }
    }

    /// Ends the epoch: every view emits what it held back, downstream views receive upstream
    /// output, then all contents are applied and published together.
    fn end_epoch(&mut self) -> Result<()> {
        let mut outputs: HashMap<ObjectId, Vec<ChangeBatch>> = HashMap::new();
        for i in 0..self.views.len() {
            // Watermarks of the views this one reads: they advance once their rows were pushed.
            let upstream: Vec<(ObjectId, i64)> = self.views[i]
                .sources
                .iter()
                .filter_map(|s| {
                    self.views[..i]
                        .iter()
                        .find(|e| e.view.def.id == *s)
                        .and_then(|e| Some((*s, e.watermark()?)))
                })
                .collect();
            let entry = &mut self.views[i];
            if is_failed(&self.failures, entry.view.def.id) {
                entry.pending.clear();
                continue;
            }
            let result = (|| -> Result<Vec<ChangeBatch>> {
                let mut out = std::mem::take(&mut entry.pending);
                for source in entry.sources.clone() {
                    if let Some(upstream) = outputs.get(&source) {
                        for batch in upstream {
                            out.extend(catch_panic("a view's operators", || {
                                crate::failpoints::failpoint("view_changes", &entry.view.def.name)?;
                                entry.dataflow.push(source, batch)
                            })?);
                        }
                    }
                }
                for (source, watermark) in &upstream {
                    entry.event_time.advance(*source, *watermark);
                }
                out.extend(catch_panic("a view's operators", || {
                    entry.dataflow.end_epoch()
                })?);
                entry.contents.check_view_output(&out)?;
                Ok(out)
            })();
            match result {
                Ok(out) => {
                    outputs.insert(entry.view.def.id, out);
                    entry.committed.clone_from(&entry.read);
                }
                Err(e) => {
                    let id = entry.view.def.id;
                    self.fail(id, e);
                }
            }
        }
        let mut changed = false;
        for entry in &mut self.views {
            if let Some(out) = outputs.get(&entry.view.def.id)
                && !out.is_empty()
            {
                entry.contents.apply(out)?;
                changed = true;
            }
        }
        let late: Vec<(String, Arc<EventTime>)> = self
            .views
            .iter()
            .map(|e| (e.view.def.name.clone(), Arc::clone(&e.event_time)))
            .collect();
        for (name, event_time) in late {
            self.collect_late(&name, &event_time);
        }
        self.dirty = false;
        self.changed_since_checkpoint |= changed;
        self.epoch += 1;
        if !self.subscribers.is_empty() {
            self.notify(&outputs);
        }
        if !self.sinks.is_empty() {
            self.feed_sinks(&outputs);
        }
        if changed
            || self
                .published
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .snapshots
                .len()
                != self.views.len()
        {
            self.mark_stale();
        }
        Ok(())
    }

    /// Takes views out to rebuild them ([`Message::StopViews`]), with the subscriptions'
    /// temporary views reading them.
    fn stop_views(&mut self, ids: &[ObjectId], why: &Error) {
        let gone: Vec<ObjectId> = self
            .views
            .iter()
            .filter(|e| {
                ids.contains(&e.view.def.id)
                    || (e.view.def.sql.is_empty() && e.sources.iter().any(|s| ids.contains(s)))
            })
            .map(|e| e.view.def.id)
            .collect();
        self.subscribers.retain(|s| {
            let reading = gone.contains(&s.view);
            if reading {
                let _ = s.ended.set(why.clone());
            }
            !reading
        });
        self.views.retain(|e| !gone.contains(&e.view.def.id));
        for mut sink in std::mem::take(&mut self.sinks) {
            if gone.contains(&sink.view) {
                sink.waiting = Some(None);
                sink.sent = None;
                self.parked_sinks.push(sink);
            } else {
                self.sinks.push(sink);
            }
        }
        self.clocks
            .retain(|(_, reader), _| reader.is_none_or(|r| !gone.contains(&r)));
        let mut failures = self.failures.write().unwrap_or_else(|p| p.into_inner());
        for id in gone {
            if ids.contains(&id) {
                failures.insert(id, why.clone());
            } else {
                failures.remove(&id);
            }
        }
        drop(failures);
        self.mark_stale();
    }

    /// Some view's contents changed: the next reader has snapshots built.
    fn mark_stale(&self) {
        self.published
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .stale = true;
    }

    /// When readers wait for snapshots: publishes fresh ones (if an epoch changed something)
    /// and hands them to every waiting reader.
    fn answer_snapshot_requests(&mut self) {
        if !self
            .requests
            .pending
            .swap(false, std::sync::atomic::Ordering::AcqRel)
        {
            return;
        }
        if self
            .published
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .stale
        {
            self.publish();
        }
        let snapshots = Arc::clone(
            &self
                .published
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .snapshots,
        );
        for reader in self
            .requests
            .waiting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            let _ = reader.send(Arc::clone(&snapshots));
        }
    }

    fn publish(&mut self) {
        let mut map = HashMap::with_capacity(self.views.len());
        for entry in &mut self.views {
            match entry.contents.snapshot() {
                Ok(s) => {
                    map.insert(entry.view.def.id, s);
                }
                Err(e) => {
                    tracing::error!(view = %entry.view.def.name, error = %e, "building a view snapshot failed")
                }
            }
        }
        *self.published.write().unwrap_or_else(|p| p.into_inner()) = Published {
            snapshots: Arc::new(map),
            stale: false,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;

    #[tokio::test]
    async fn writers_wait_while_the_runtime_queue_is_full() {
        let runtime = ViewRuntime::start(None, None).unwrap();
        // Everything the queue holds is in flight: the next writer waits...
        let all = runtime.reserve(usize::MAX).await.unwrap();
        assert!(runtime.reserve(4096).now_or_never().is_none());
        // ...until the runtime has processed those changes.
        runtime
            .changes(ObjectId(1), 0, None, Vec::new(), Some(all))
            .unwrap();
        runtime.flush().unwrap().await.unwrap().unwrap();
        assert!(runtime.reserve(4096).now_or_never().is_some());
        runtime.shutdown();
    }
}
