//! [`ViewRuntime`]: the handle sessions and the engine hold; every call is a message to the runtime
//! thread.

use super::*;

pub struct ViewRuntime {
    queue: Mutex<Option<SyncSender<Message>>>,
    published: Arc<RwLock<Published>>,
    requests: Arc<SnapshotRequests>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    budget: Arc<tokio::sync::Semaphore>,
    failures: ViewFailures,
    lag: ViewLag,
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
        clock: Arc<dyn eddy_common::time::Clock>,
        barrier_interval: Duration,
    ) -> Result<ViewRuntime> {
        let (tx, rx) = mpsc::sync_channel(limits::RUNTIME_QUEUE_CAPACITY);
        let published = Arc::new(RwLock::new(Published {
            snapshots: Arc::new(HashMap::new()),
            stale: false,
        }));
        let requests = Arc::new(SnapshotRequests::default());
        let failures = ViewFailures::default();
        let lag = ViewLag::default();
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
            clock,
            barrier_interval,
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
            lag,
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

    /// Views that are behind, with how many epochs (`eddy_views.lag_epochs`).
    pub fn lag(&self) -> BTreeMap<ObjectId, u64> {
        self.lag.read().unwrap_or_else(|p| p.into_inner()).clone()
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

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;

    #[tokio::test]
    async fn writers_wait_while_the_runtime_queue_is_full() {
        let runtime = ViewRuntime::start(
            None,
            None,
            eddy_common::time::system_clock(),
            BARRIER_INTERVAL,
        )
        .unwrap();
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
