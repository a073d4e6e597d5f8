//! [`ViewRuntime`]: the handle sessions and the engine hold. Every call that changes something
//! is a message to the runtime thread; reads (snapshots, what the system tables show) take what
//! the thread published and never wait for it to answer.

use super::*;

pub struct ViewRuntime {
    queue: Waker,
    published: Arc<RwLock<Published>>,
    requests: Arc<SnapshotRequests>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    budget: Arc<tokio::sync::Semaphore>,
    failures: ViewFailures,
    lag: ViewLag,
    observed: Arc<observed::Observed>,
}

fn stopped() -> Error {
    Error::internal("the view runtime stopped")
}

impl ViewRuntime {
    /// Starts the runtime thread; with `checkpoints`, it hands a checkpoint to the writer
    /// every `interval` while views change (`None`: only on `CHECKPOINT`).
    /// Idle decisions about tables' watermarks go to `marks` (table, watermark): the engine
    /// records each in the table's log and sends it back as [`ViewRuntime::watermark`] (`None`:
    /// applied at once, for tests without a log). A view's changes past its budget in memory
    /// are spilled to `spill_dir` (`None`: the runtime waits for the view instead). Views'
    /// contents keep their index of rows within `memory` (the server's budget, if any).
    pub fn start(
        checkpoints: Option<Checkpoints>,
        marks: Option<tokio::sync::mpsc::Sender<(ObjectId, i64)>>,
        clock: Arc<dyn eddy_common::time::Clock>,
        barrier_interval: Duration,
        spill_dir: Option<std::path::PathBuf>,
        memory: Option<Arc<eddy_dataflow::spill::MemoryBudget>>,
    ) -> Result<ViewRuntime> {
        // Room for the budgeted changes, and as much again for requests (DDL, FLUSH, ...).
        let (tx, rx) = mpsc::sync_channel(2 * limits::RUNTIME_QUEUE_CAPACITY);
        let queue = Waker::new(tx);
        let published = Arc::new(RwLock::new(Published {
            snapshots: Arc::new(HashMap::new()),
            stale: false,
        }));
        let requests = Arc::new(SnapshotRequests::default());
        let failures = ViewFailures::default();
        let lag: ViewLag = Arc::new(tokio::sync::watch::Sender::new(BTreeMap::new()));
        let observed = Arc::new(observed::Observed::default());
        let state = RuntimeState {
            views: Vec::new(),
            epoch: 0,
            published: Arc::clone(&published),
            requests: Arc::clone(&requests),
            dirty: false,
            failures: Arc::clone(&failures),
            lag: Arc::clone(&lag),
            subscribers: Vec::new(),
            clocks: HashMap::new(),
            observed: Arc::clone(&observed),
            checkpoints,
            last_checkpoint: Instant::now(),
            recovered: false,
            changed_since_checkpoint: false,
            deferred_checkpoints: Default::default(),
            restored_clocks: HashMap::new(),
            sinks: Vec::new(),
            parked_sinks: Vec::new(),
            marks,
            clock,
            barrier_interval,
            spill_dir,
            memory,
            pending_checkpoints: Default::default(),
            waker: queue.clone(),
        };
        let thread = std::thread::Builder::new()
            .name("eddy-views".into())
            .spawn(move || state.run(&rx))
            .map_err(|e| Error::io("start the view runtime", e))?;
        let budget = Arc::new(tokio::sync::Semaphore::new(
            limits::RUNTIME_QUEUE_KIB as usize,
        ));
        Ok(ViewRuntime {
            queue,
            published,
            requests,
            thread: Mutex::new(Some(thread)),
            budget,
            failures,
            lag,
            observed,
        })
    }

    fn send(&self, message: Message) -> Result<()> {
        let queue = self.queue.lock();
        match queue.as_ref() {
            Some(tx) => tx.send(message).map_err(|_| stopped()),
            None => Err(Error::new(
                SqlState::ADMIN_SHUTDOWN,
                "the server is shutting down",
            )),
        }
    }

    /// Reserves room for `bytes` of changes in `messages` messages in the runtime's queue,
    /// waiting (asynchronously) while views are behind; a reservation larger than the whole
    /// queue waits for all of it. Each message counts at least its share of the queue's
    /// capacity in messages, so budgeted changes cannot fill the channel and block the sending
    /// thread (a tokio worker, under the write lock) in [`ViewRuntime::changes`].
    pub async fn reserve(&self, bytes: usize, messages: usize) -> Result<QueueBudget> {
        let per_message = limits::RUNTIME_QUEUE_KIB as usize / limits::RUNTIME_QUEUE_CAPACITY;
        let kib = (bytes / 1024)
            .max(messages.saturating_mul(per_message))
            .clamp(1, limits::RUNTIME_QUEUE_KIB as usize) as u32;
        let permit = Arc::clone(&self.budget)
            .acquire_many_owned(kib)
            .await
            .map_err(|_| stopped())?;
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
            held: None,
        })
    }

    /// Changes of a source for the one view whose reader read them (source `partition`).
    /// `held` is the reader's room for them: released once the view has handled them.
    #[allow(clippy::too_many_arguments)]
    pub fn reader_changes(
        &self,
        object: ObjectId,
        partition: u32,
        clock: Option<ClockSpec>,
        batches: Vec<ChangeBatch>,
        budget: QueueBudget,
        reader: ReaderPosition,
        held: ReaderRoom,
    ) -> Result<()> {
        self.send(Message::Changes {
            object,
            partition,
            clock,
            batches,
            budget: Some(budget),
            reader: Some(reader),
            held: Some(held),
        })
    }

    /// Every late row the views dropped (`eddy_late_events`), oldest first.
    pub fn late_events(&self) -> Vec<LateRecord> {
        self.observed.late()
    }

    /// Views that failed, with why: their dataflow failed (they stopped updating), or they
    /// could not be restored at start-up. Shared with the engine, which reads and adds to it.
    pub fn failures(&self) -> ViewFailures {
        Arc::clone(&self.failures)
    }

    /// Views that are behind, with how many epochs (`eddy_views.lag_epochs`).
    pub fn lag(&self) -> BTreeMap<ObjectId, u64> {
        self.lag
            .borrow()
            .iter()
            .map(|(id, lag)| (*id, lag.epochs))
            .collect()
    }

    /// Lets periodic checkpoints start: every stored view is restored or marked failed.
    pub fn recovered(&self) -> Result<()> {
        self.send(Message::Recovered)
    }

    /// Every row a view could not evaluate (`eddy_dead_letters`), oldest first.
    pub fn dead_letters(&self) -> Vec<FailedRow> {
        self.observed.failed()
    }

    /// The watermark of every stream partition and view (`eddy_watermarks`) as of the last
    /// epoch end.
    pub fn watermarks(&self) -> Vec<WatermarkRow> {
        self.observed.watermarks()
    }

    /// Registers a view; `tables` are the logged commits of the tables it reads (taken under
    /// the write lock, like [`ViewRuntime::changes`]). Resolves once the view is backfilled.
    /// `progress` receives a line every second of a long backfill. Resolves to the rows the
    /// backfill read.
    pub fn add_view(
        &self,
        view: Arc<View>,
        dataflow: eddy_dataflow::Dataflow,
        event_time: Arc<EventTime>,
        sources: Vec<ObjectId>,
        tables: Vec<Backfill>,
        progress: Option<tokio::sync::mpsc::UnboundedSender<String>>,
    ) -> Result<oneshot::Receiver<Result<usize>>> {
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
        done.await.map_err(|_| stopped())??;
        Ok(Subscription { events: rx, ended })
    }

    /// Takes the views `ids` out to rebuild them; see [`Message::StopViews`].
    pub async fn stop_views(&self, ids: Vec<ObjectId>, why: Error) -> Result<()> {
        let (reply, done) = oneshot::channel();
        self.send(Message::StopViews { ids, why, reply })?;
        done.await.map_err(|_| stopped())
    }

    /// Drops the view `id` and the subscriptions' temporary views reading `id` (a view or a
    /// table), whose subscribers then see their stream end.
    pub fn drop_view(&self, id: ObjectId) -> Result<()> {
        self.send(Message::DropView { id })
    }

    /// Resolves once the runtime has handled every message sent before (a dropped view's late
    /// and failed rows are forgotten, its subscriptions ended).
    pub async fn barrier(&self) -> Result<()> {
        let (reply, done) = oneshot::channel();
        self.send(Message::Barrier { reply })?;
        done.await.map_err(|_| stopped())
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
        done.await.map_err(|_| stopped())?
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
    pub fn restore_view(
        &self,
        view: Arc<View>,
        dataflow: eddy_dataflow::Dataflow,
        event_time: Arc<EventTime>,
        sources: Vec<ObjectId>,
        state: Restoring,
    ) -> Result<oneshot::Receiver<Result<()>>> {
        let (reply, done) = oneshot::channel();
        self.send(Message::RestoreView {
            view,
            dataflow,
            event_time,
            sources,
            state: Box::new(state),
            reply,
        })?;
        Ok(done)
    }

    /// Ends the current epoch; resolves once every view reflects everything sent before (a
    /// view behind is waited for here, by the caller, never by the runtime thread: the other
    /// views and the writers go on meanwhile). Returns the epoch.
    pub async fn flush(&self) -> Result<u64> {
        let (reply, done) = oneshot::channel();
        self.send(Message::Flush { reply })?;
        let epoch = done.await.map_err(|_| stopped())??;
        self.caught_up(Some(epoch), None).await?;
        Ok(epoch)
    }

    /// Waits until the views `only` (every view: `None`) have answered `epoch` (every epoch
    /// ended so far: `None`). A failed or dropped view is not waited for.
    pub async fn caught_up(&self, epoch: Option<u64>, only: Option<&[ObjectId]>) -> Result<()> {
        let mut lag = self.lag.subscribe();
        lag.wait_for(|views| {
            views
                .iter()
                .filter(|(id, _)| only.is_none_or(|o| o.contains(id)))
                .all(|(_, lag)| epoch.is_some_and(|e| lag.oldest > e))
        })
        .await
        .map(|_| ())
        .map_err(|_| stopped())
    }

    /// How far every materialized view has read its tables' logs, as of the last epoch end.
    pub fn offsets(&self) -> Vec<ConsumerOffsets> {
        self.observed.offsets()
    }

    /// Every operator of every materialized view (temporary subscription views excluded), as
    /// each view's lane published them at the last epoch end it answered.
    pub fn operators(&self) -> Vec<(String, eddy_dataflow::OperatorStats)> {
        self.observed.operators()
    }

    /// The contents of every view as of the last epoch. When an epoch changed some view since
    /// they were last built, the runtime builds them between two messages (before the queued
    /// changes behind them); a runtime busy for [`SNAPSHOT_WAIT`] (a long backfill) leaves
    /// the reader with the last snapshots built, an earlier but consistent moment. The wait
    /// is asynchronous: the session's tokio worker serves other sessions meanwhile.
    pub async fn snapshots(&self) -> Snapshots {
        {
            let published = self.published.read().unwrap_or_else(|p| p.into_inner());
            if !published.stale {
                return Arc::clone(&published.snapshots);
            }
        }
        let (reply, answer) = oneshot::channel();
        self.requests
            .waiting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(reply);
        self.requests
            .pending
            .store(true, std::sync::atomic::Ordering::Release);
        self.queue.wake();
        match tokio::time::timeout(SNAPSHOT_WAIT, answer).await {
            Ok(Ok(snapshots)) => snapshots,
            _ => {
                tracing::warn!(
                    "the view runtime did not publish within {SNAPSHOT_WAIT:?}; reading earlier snapshots"
                );
                Arc::clone(
                    &self
                        .published
                        .read()
                        .unwrap_or_else(|p| p.into_inner())
                        .snapshots,
                )
            }
        }
    }

    pub fn shutdown(&self) {
        self.queue.lock().take();
        if let Some(t) = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;

    /// A runtime without checkpoints, log or spill.
    fn runtime() -> ViewRuntime {
        ViewRuntime::start(
            None,
            None,
            eddy_common::time::system_clock(),
            BARRIER_INTERVAL,
            None,
            None,
        )
        .unwrap()
    }

    #[tokio::test]
    async fn writers_wait_while_the_runtime_queue_is_full() {
        let runtime = runtime();
        // Everything the queue holds is in flight: the next writer waits...
        let all = runtime.reserve(usize::MAX, 1).await.unwrap();
        assert!(runtime.reserve(4096, 1).now_or_never().is_none());
        // ...until the runtime has processed those changes.
        runtime
            .changes(ObjectId(1), 0, None, Vec::new(), Some(all))
            .unwrap();
        runtime.flush().await.unwrap();
        assert!(runtime.reserve(4096, 1).now_or_never().is_some());
        runtime.shutdown();
    }

    #[tokio::test]
    async fn small_writes_wait_before_they_could_fill_the_runtime_channel() {
        let runtime = runtime();
        // Whether a reservation is granted at once (outside tokio's cooperative budget, which
        // would make the 129th poll of a task pending whatever the semaphore holds).
        let now = |messages: usize| {
            tokio::task::unconstrained(runtime.reserve(16, messages)).now_or_never()
        };
        // One-message writes of a few bytes: as many as the channel has room for exhaust the
        // budget, so the next one waits for a permit instead of blocking in `changes`.
        let held: Vec<QueueBudget> = (0..limits::RUNTIME_QUEUE_CAPACITY)
            .map(|_| now(1).unwrap().unwrap())
            .collect();
        assert!(now(1).is_none());
        drop(held);
        // A write of many partitions counts each message.
        let half = limits::RUNTIME_QUEUE_CAPACITY / 2;
        let first = now(half).unwrap().unwrap();
        let _second = now(half).unwrap().unwrap();
        assert!(now(1).is_none());
        drop(first);
        assert!(now(1).is_some());
        runtime.shutdown();
    }
}
