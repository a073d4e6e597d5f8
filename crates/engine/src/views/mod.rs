//! Materialized views: the runtime that feeds committed changes through every view's dataflow,
//! ends epochs, and publishes the views' contents.
//!
//! Entry point: [`ViewRuntime`]. One thread runs the views: it takes committed changes in
//! commit order (they are sent under the engine's write lock) and hands them to each view's
//! dataflow, which runs on its own thread (`lane.rs`), so views compute at once;
//! an epoch ends every barrier interval ([`BARRIER_INTERVAL`] unless the server is started
//! with another) when something changed, and on `FLUSH`. At the end
//! of an epoch views are processed in creation order, so a view's output reaches the views that
//! read it in the same epoch; then the views' contents are published together as one
//! snapshot map, so one query over several views sees one moment. Snapshots are built when a
//! reader first asks for them after an epoch changed something (a view of millions of rows
//! that changes every epoch costs nothing until it is read).
//!
//! Layout: `handle.rs` is what sessions and the engine call (each call a [`Message`] to the
//! thread); `supervise.rs` the thread's loop, its messages, failed and restarted views;
//! `epoch.rs` pushes, epoch ends and publishing; `backfill.rs` new and restored views;
//! `outputs.rs` subscribers and sinks; `watermarks.rs` streams' clocks and late rows;
//! `checkpointing.rs` the state handed to the checkpoint writer; `observed.rs` what the system
//! tables read, published so that no reader waits for the runtime thread.

use std::collections::{BTreeMap, HashMap};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

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

mod backfill;
mod checkpointing;
mod epoch;
mod handle;
mod lane;
mod log_reader;
mod observed;
mod outputs;
mod supervise;
mod watermarks;

pub use handle::ViewRuntime;

/// How often an epoch ends while changes are flowing, unless the server says otherwise
/// (`--barrier-interval`).
pub const BARRIER_INTERVAL: Duration = Duration::from_millis(100);
/// How often a long backfill reports its progress (as a NOTICE to the session creating it).
const BACKFILL_PROGRESS_INTERVAL: Duration = Duration::from_secs(1);

/// A reservation of the runtime's queue, released once the runtime has processed the changes.
pub struct QueueBudget(#[allow(dead_code)] tokio::sync::OwnedSemaphorePermit);

/// A source reader's room for changes it sent to its view (as much as the view's budget for
/// its other inputs), released once the view's lane has handled them: a reader is held back at
/// its source (whose external log is the buffer) by its own view, never by the runtime thread
/// waiting for it, and the lane takes its changes without spilling them.
pub type ReaderRoom = tokio::sync::OwnedSemaphorePermit;

/// Published contents of every view, all as of one epoch (or why a view's could not be built).
pub type Snapshots = Arc<HashMap<ObjectId, Result<Arc<crate::table_chunks::ViewRows>>>>;

/// What readers see: the last snapshots built, and whether an epoch has changed some view
/// since (then a reader asks the runtime to build them again).
/// Views that failed and why, by id ([`ViewRuntime::failures`]).
pub type ViewFailures = Arc<RwLock<BTreeMap<ObjectId, Error>>>;

/// Views behind the others, by id (failed views are not: nothing waits for them). Sessions
/// wait on it (FLUSH) without the runtime thread waiting for the views.
pub type ViewLag = Arc<tokio::sync::watch::Sender<BTreeMap<ObjectId, Lag>>>;

/// How far a view is behind the others.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lag {
    /// Epochs it has still to answer.
    pub epochs: u64,
    /// The oldest of them: the view's contents are as of the epoch before it.
    pub oldest: u64,
}

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

/// How long a reader waits for the runtime to build fresh snapshots before it reads the last
/// ones built.
const SNAPSHOT_WAIT: Duration = Duration::from_secs(10);

/// Readers waiting for the runtime to publish fresh snapshots.
#[derive(Default)]
struct SnapshotRequests {
    waiting: Mutex<Vec<oneshot::Sender<Snapshots>>>,
    pending: std::sync::atomic::AtomicBool,
}

pub struct View {
    pub def: ViewDef,
    pub schema: SchemaRef,
    /// The column that carries a watermark, and the sources whose watermark it is.
    pub watermark: Option<(String, Vec<ObjectId>)>,
}

impl Entry {
    /// The last epoch whose output the view has applied to its contents.
    fn committed_epoch(&self, epoch: u64) -> u64 {
        self.behind.front().map_or(epoch, |b| b.epoch - 1)
    }

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

/// What a new view reads first from one of its inputs, in commit order.
pub struct Backfill {
    pub object: ObjectId,
    pub name: String,
    pub clock: Option<ClockSpec>,
    pub input: BackfillInput,
}

pub enum BackfillInput {
    /// A table's log: per partition, the first offset it keeps (after retention, not 0) and
    /// its end when the view was registered. The view's lane reads it a few records at a time
    /// ([`limits::BACKFILL_READ_RECORDS`]), never all at once; the pin keeps retention and
    /// compaction off it meanwhile.
    Log {
        log: Arc<eddy_storage::log::LogStore>,
        schema: SchemaRef,
        ranges: Vec<(u32, u64, u64)>,
        pin: BackfillPin,
    },
    /// A view's contents, as one commit.
    Rows(Vec<LogRecord>),
}

/// Tables whose logs backfills are reading: retention and compaction leave them alone
/// meanwhile (a record deleted or rewritten mid-read would be lost or counted twice).
#[derive(Clone, Default)]
pub struct Backfilling(Arc<Mutex<HashMap<ObjectId, usize>>>);

impl Backfilling {
    pub fn pin(&self, table: ObjectId) -> BackfillPin {
        *self
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(table)
            .or_default() += 1;
        BackfillPin {
            set: self.clone(),
            table,
        }
    }

    /// Runs `f` (retention or compaction of `table`) unless a backfill is reading the table;
    /// no backfill pins it while `f` runs.
    pub fn unless_pinned<T>(
        &self,
        table: ObjectId,
        f: impl FnOnce() -> Result<T>,
    ) -> Option<Result<T>> {
        let pins = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if pins.contains_key(&table) {
            return None;
        }
        let result = f();
        drop(pins);
        Some(result)
    }
}

/// A backfill reading a table's log, until it is dropped.
pub struct BackfillPin {
    set: Backfilling,
    table: ObjectId,
}

impl Drop for BackfillPin {
    fn drop(&mut self) {
        let mut pins = self.set.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = pins.get_mut(&self.table) {
            *n -= 1;
            if *n == 0 {
                pins.remove(&self.table);
            }
        }
    }
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
        /// The reader's room, with a reader's changes.
        held: Option<ReaderRoom>,
    },
    AddView {
        view: Arc<View>,
        dataflow: eddy_dataflow::Dataflow,
        event_time: Arc<EventTime>,
        sources: Vec<ObjectId>,
        tables: Vec<Backfill>,
        progress: Option<tokio::sync::mpsc::UnboundedSender<String>>,
        reply: oneshot::Sender<Result<usize>>,
    },
    DropView {
        id: ObjectId,
    },
    Flush {
        reply: oneshot::Sender<Result<u64>>,
    },
    /// Wakes an idle runtime to answer [`SnapshotRequests`] or look at a lane's answer.
    Wake,
    /// Answered once every message queued before it is handled (a DROP's runtime side done).
    Barrier {
        reply: oneshot::Sender<()>,
    },
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
        state: Box<Restoring>,
        reply: oneshot::Sender<Result<()>>,
    },
}

/// A view's state read back from a checkpoint, besides its dataflow.
pub struct Restoring {
    /// The contents' batches (whole, then changes since), read as they are taken.
    pub contents: crate::checkpoint::PartReader,
    /// Per (table or source, partition): what the view had committed.
    pub committed: HashMap<(ObjectId, u32), u64>,
    /// The checkpoint it was read from, when its operators hold their parts as saved then (not
    /// re-sharded): the next checkpoint may save only their changes since.
    pub checkpoint: Option<u64>,
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

/// Per (table, partition) the log records read; per (source, partition) the source offset.
type ReadOffsets = HashMap<(ObjectId, u32), u64>;

struct Entry {
    view: Arc<View>,
    /// The view's dataflow, on its own thread.
    lane: lane::Lane,
    event_time: Arc<EventTime>,
    sources: Vec<ObjectId>,
    contents: TableData,
    /// Epoch ends the view has not answered yet, oldest first (empty: the view is in step).
    /// Only a view that no other view reads falls behind.
    behind: std::collections::VecDeque<Behind>,
    /// Log records read per (table, partition): each message of changes is one record; for a
    /// source, the source offset its reader got to.
    read: ReadOffsets,
    /// `read` as of the last epoch the view committed.
    committed: ReadOffsets,
    /// A new view until it has applied its first epoch (its backfill): who waits for that.
    created: Option<backfill::Created>,
    /// The checkpoint the view's last save was handed to the writer in (or restored from):
    /// once that one is committed, the next save may write only the changes since.
    saved_in: Option<u64>,
    /// The view's output since its last save (its contents' changes since).
    output_since: checkpointing::OutputSince,
}

/// An epoch end a view is still computing: its answer, and what the view had read by then
/// (what it has committed once the answer is applied).
struct Behind {
    epoch: u64,
    answer: lane::Answer,
    read: HashMap<(ObjectId, u32), u64>,
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
    lag: ViewLag,
    subscribers: Vec<Subscriber>,
    /// Watermark of every stream that sent changes; a source's per view reading it.
    clocks: HashMap<ClockKey, StreamClock>,
    /// What the system tables read (late and failed rows, watermarks, offsets, operators).
    observed: Arc<observed::Observed>,
    checkpoints: Option<Checkpoints>,
    last_checkpoint: Instant,
    /// Every stored view is restored (or marked failed): periodic checkpoints may run.
    recovered: bool,
    /// Some epoch changed a view since the last checkpoint.
    changed_since_checkpoint: bool,
    /// `CHECKPOINT`s waiting for the checkpoint in flight to be written, so that theirs saves
    /// only the changes since it.
    deferred_checkpoints: std::collections::VecDeque<oneshot::Sender<Result<u64>>>,
    /// Streams' watermarks from a checkpoint, taken up by their clocks when they start.
    restored_clocks: HashMap<ClockKey, ClockState>,
    sinks: Vec<RuntimeSink>,
    /// Sinks of views being rebuilt ([`Message::StopViews`]): back in `sinks` when their view is.
    parked_sinks: Vec<RuntimeSink>,
    /// Where idle decisions about tables' watermarks go to be recorded in their logs.
    marks: Option<tokio::sync::mpsc::Sender<(ObjectId, i64)>>,
    /// Wall-clock time of epochs, late rows and checkpoints; monotonic time of idle partitions.
    clock: Arc<dyn eddy_common::time::Clock>,
    /// How often an epoch ends while changes are flowing.
    barrier_interval: Duration,
    /// Where lanes spill changes past their budget (`None`: they hold the runtime instead).
    spill_dir: Option<std::path::PathBuf>,
    /// The server's memory budget, which views' contents spill their index of rows past.
    memory: Option<Arc<eddy_dataflow::spill::MemoryBudget>>,
    /// Checkpoints whose views are still saving their state (or catching up to its epoch),
    /// oldest first; each is handed to the writer once complete.
    pending_checkpoints: std::collections::VecDeque<checkpointing::Pending>,
    /// Wakes this thread when a lane answers (its lanes hold clones).
    waker: Waker,
}

/// The runtime's queue, shared by the handle and the lanes; taken (`None`) at shutdown so that
/// the runtime thread sees its queue disconnect.
#[derive(Clone)]
struct Waker(Arc<WakerInner>);

struct WakerInner {
    queue: Mutex<Option<SyncSender<Message>>>,
    /// A [`Message::Wake`] is queued: the runtime will look, no need to queue another.
    queued: std::sync::atomic::AtomicBool,
}

impl Waker {
    fn new(queue: SyncSender<Message>) -> Waker {
        Waker(Arc::new(WakerInner {
            queue: Mutex::new(Some(queue)),
            queued: Default::default(),
        }))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<SyncSender<Message>>> {
        self.0.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wakes an idle runtime thread to look at its lanes' answers and its snapshot requests.
    /// One wake at a time is queued; a full queue means the runtime is busy and looks soon.
    fn wake(&self) {
        use std::sync::atomic::Ordering;
        if self.0.queued.swap(true, Ordering::AcqRel) {
            return;
        }
        let sent = self
            .lock()
            .as_ref()
            .is_some_and(|queue| queue.try_send(Message::Wake).is_ok());
        if !sent {
            self.0.queued.store(false, Ordering::Release);
        }
    }

    /// The runtime took a wake: it looks at everything after this, so the next answer queues
    /// a new one.
    fn woken(&self) {
        self.0
            .queued
            .store(false, std::sync::atomic::Ordering::Release);
    }
}
