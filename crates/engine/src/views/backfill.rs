//! A new view backfilled from its inputs (in its own lane), and a view restored from a
//! checkpoint.

use super::*;

/// A new view's backfill, which its lane runs before anything else (so the runtime thread, the
/// other views and the writers go on meanwhile): every input's logged commits in commit order
/// (views' contents first), each stream with its own clock so that its watermark moves as it
/// did live (by the data and the log's watermark marks, never by the wall clock), then the
/// inputs' live watermarks as of the view's registration.
pub(super) struct Job {
    view: String,
    inputs: Vec<Backfill>,
    clocks: HashMap<ObjectId, StreamClock>,
    live: Vec<(ObjectId, i64)>,
    event_time: Arc<EventTime>,
    clock: Arc<dyn eddy_common::time::Clock>,
    progress: Option<tokio::sync::mpsc::UnboundedSender<String>>,
    /// Rows read, for whoever created the view.
    rows: Arc<std::sync::atomic::AtomicUsize>,
    /// The view's columns: its output is consolidated as it grows.
    schema: SchemaRef,
}

impl Job {
    /// Pushes everything through `dataflow`, its output into `pending` (the view's first
    /// epoch). Stops at the next log record once `dropped` is set (the view was dropped or
    /// rebuilt meanwhile: nobody reads its output).
    pub(super) fn run(
        mut self,
        dataflow: &mut eddy_dataflow::Dataflow,
        pending: &mut Vec<ChangeBatch>,
        dropped: &std::sync::atomic::AtomicBool,
    ) -> Result<()> {
        let mut commits = log_reader::Commits::new(std::mem::take(&mut self.inputs));
        let total = commits.total;
        tracing::info!(view = %self.view, records = total, "backfilling a materialized view");
        let started = Instant::now();
        let mut reported = Instant::now();
        let (mut records, mut rows, mut since_epoch) = (0u64, 0usize, 0usize);
        let mut consolidated = 0usize;
        while let Some((object, record)) = commits.next()? {
            if dropped.load(std::sync::atomic::Ordering::Acquire) {
                tracing::info!(view = %self.view, records, "backfill stopped: the view was dropped");
                return Err(dropped_while_created(&self.view));
            }
            crate::failpoints::failpoint("backfill", &self.view)?;
            records += 1;
            for batch in &record.changes {
                pending.extend(catch_panic("a view's operators", || {
                    dataflow.push(object, batch)
                })?);
                rows += batch.len();
                since_epoch += batch.len();
            }
            if let Some(clock) = self.clocks.get_mut(&object) {
                let raised = match record.watermark {
                    Some(mark) => clock.mark(mark),
                    None => {
                        clock.observe(record.partition, &record.changes, self.clock.instant())?
                    }
                };
                if let Some(w) = raised {
                    self.event_time.advance(object, w);
                    pending.extend(dataflow.watermark(object, w)?);
                }
            }
            if since_epoch >= limits::BACKFILL_EPOCH_ROWS {
                since_epoch = 0;
                pending.extend(catch_panic("a view's operators", || {
                    dataflow.end_epoch(self.clock.now_micros())
                })?);
                // Each of those epochs retracts and inserts again the groups it touched: kept
                // as they come, the output would be a multiple of the view (20 M changes for
                // a 200 K-row view of 10 M rows), for the runtime thread to apply.
                let held: usize = pending.iter().map(ChangeBatch::len).sum();
                if held > limits::BACKFILL_EPOCH_ROWS.max(2 * consolidated) {
                    *pending = eddy_dataflow::consolidate(&self.schema, pending)?
                        .into_iter()
                        .collect();
                    consolidated = pending.iter().map(ChangeBatch::len).sum();
                }
            }
            if let Some(progress) = &self.progress
                && reported.elapsed() >= BACKFILL_PROGRESS_INTERVAL
            {
                reported = Instant::now();
                let _ = progress.send(format!(
                    "materialized view \"{}\": backfilled {records} of {total} log records ({rows} rows, {} s)",
                    self.view,
                    started.elapsed().as_secs()
                ));
            }
        }
        for (object, live) in &self.live {
            self.event_time.advance(*object, *live);
            pending.extend(dataflow.watermark(*object, *live)?);
        }
        if consolidated > 0 {
            *pending = eddy_dataflow::consolidate(&self.schema, pending)?
                .into_iter()
                .collect();
        }
        self.rows.store(rows, std::sync::atomic::Ordering::Release);
        tracing::info!(view = %self.view, records, rows, seconds = started.elapsed().as_secs_f64(), "backfilled a materialized view");
        Ok(())
    }
}

/// What the CREATE of a view dropped before its backfill was done answers.
pub(super) fn dropped_while_created(view: &str) -> Error {
    Error::new(
        SqlState::QUERY_CANCELED,
        format!("materialized view \"{view}\" was dropped while it was being created"),
    )
}

/// Who waits for a new view to be created, and the rows its backfill read.
pub(super) struct Created {
    reply: oneshot::Sender<Result<usize>>,
    rows: Arc<std::sync::atomic::AtomicUsize>,
}

impl Created {
    /// The view has applied its first epoch.
    pub(super) fn done(self) {
        let rows = self.rows.load(std::sync::atomic::Ordering::Acquire);
        let _ = self.reply.send(Ok(rows));
    }

    pub(super) fn failed(self, e: Error) {
        let _ = self.reply.send(Err(e));
    }
}

impl RuntimeState {
    /// Registers a new view whose lane backfills it from `tables` and the contents of the
    /// views among `sources`; `reply` is answered once the view has applied its first epoch
    /// (the backfill's output), or with why it could not be built. Until then the view is
    /// behind, and reading it is an error (no contents published yet).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn add_view(
        &mut self,
        view: Arc<View>,
        dataflow: eddy_dataflow::Dataflow,
        event_time: Arc<EventTime>,
        sources: Vec<ObjectId>,
        tables: Vec<Backfill>,
        progress: Option<tokio::sync::mpsc::UnboundedSender<String>>,
        reply: oneshot::Sender<Result<usize>>,
    ) {
        let rows = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        // Close the epoch in flight so that upstream views' contents are complete (views behind
        // that it does not read stay behind).
        let lane = self.end_epoch(&sources).and_then(|()| {
            self.backfill_lane(
                &view,
                dataflow,
                (&event_time, &sources),
                tables,
                progress,
                Arc::clone(&rows),
            )
        });
        let (lane, read) = match lane {
            Ok(lane) => lane,
            Err(e) => {
                let _ = reply.send(Err(e));
                return;
            }
        };
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
        let contents = TableData::for_view(Arc::clone(&view.schema), self.memory.as_ref());
        self.views.push(Entry {
            view,
            lane,
            event_time,
            sources: sources.clone(),
            contents,
            behind: Default::default(),
            committed: HashMap::new(),
            read,
            created: Some(Created { reply, rows }),
            saved_in: None,
            output_since: Default::default(),
        });
        // Its first epoch is the backfill's output: the epoch goes on without it.
        self.dirty = true;
        if let Err(e) = self.end_epoch(&sources) {
            tracing::error!(error = %e, "ending an epoch failed");
        }
    }

    /// The new view's lane, its backfill handed to it, and what the view has read of each
    /// table by then.
    fn backfill_lane(
        &mut self,
        view: &View,
        dataflow: eddy_dataflow::Dataflow,
        (event_time, sources): (&Arc<EventTime>, &[ObjectId]),
        tables: Vec<Backfill>,
        progress: Option<tokio::sync::mpsc::UnboundedSender<String>>,
        rows: Arc<std::sync::atomic::AtomicUsize>,
    ) -> Result<(lane::Lane, ReadOffsets)> {
        let mut read = ReadOffsets::new();
        for table in &tables {
            let BackfillInput::Log { ranges, .. } = &table.input else {
                continue;
            };
            for (partition, start, end) in ranges {
                read.insert((table.object, *partition), *end);
                if *start > 0
                    && let Some(progress) = &progress
                {
                    let _ = progress.send(format!(
                        "table \"{}\" keeps its log from offset {start} of partition {partition} on (retention deleted what came before): the view is built from what it keeps",
                        table.name
                    ));
                }
            }
        }
        let mut inputs = tables;
        for source in sources {
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
                    input: BackfillInput::Rows(batches),
                });
            }
        }
        let clocks: HashMap<ObjectId, StreamClock> = inputs
            .iter()
            .filter_map(|i| Some((i.object, StreamClock::replaying(i.clock?))))
            .collect();
        let live = inputs
            .iter()
            .filter_map(|input| {
                let live = match self.clocks.get(&(input.object, None)) {
                    Some(clock) => clock.watermark,
                    None => self
                        .views
                        .iter()
                        .find(|e| e.view.def.id == input.object)
                        .and_then(Entry::watermark),
                };
                Some((input.object, live?))
            })
            .collect();
        let job = Job {
            view: view.def.name.clone(),
            inputs,
            clocks,
            live,
            event_time: Arc::clone(event_time),
            clock: Arc::clone(&self.clock),
            progress,
            rows,
            schema: Arc::clone(&view.schema),
        };
        let lane = lane::Lane::start(
            &view.def.name,
            dataflow,
            Some(job),
            self.spill_dir.as_deref(),
            self.waker.clone(),
        )?;
        Ok((lane, read))
    }

    /// Recovery: registers a view restored from a checkpoint.
    pub(super) fn restore_view(
        &mut self,
        view: Arc<View>,
        dataflow: eddy_dataflow::Dataflow,
        event_time: Arc<EventTime>,
        sources: Vec<ObjectId>,
        state: Restoring,
    ) -> Result<()> {
        let Restoring {
            contents,
            committed,
            checkpoint: saved_in,
        } = state;
        // The contents of the last whole save, then the changes saved since, in order, read
        // and applied a batch at a time (as batches while they only insert: a view that never
        // retracts stays cheap; the first retraction makes them a multiset within the budget).
        let mut data = TableData::for_view(Arc::clone(&view.schema), self.memory.as_ref());
        let (mut whole_rows, mut since) = (0, 0);
        for batch in contents {
            let (_, batch) = batch?;
            if batch.num_rows() == 0 {
                continue;
            }
            if !eddy_dataflow::checkpoint::is_changes(&batch) {
                whole_rows += batch.num_rows();
                data.apply(&[ChangeBatch::inserts(batch)])?;
                continue;
            }
            since += batch.num_rows();
            data.apply_view_output(&[eddy_dataflow::checkpoint::changes_of(&batch)?])?;
        }
        let mut output_since = checkpointing::OutputSince::default();
        if saved_in.is_some() {
            output_since.restart(
                whole_rows,
                since,
                data.only_inserted().then(|| data.row_count()),
            );
        }
        let lane = lane::Lane::start(
            &view.def.name,
            dataflow,
            None,
            self.spill_dir.as_deref(),
            self.waker.clone(),
        )?;
        self.views.push(Entry {
            view,
            lane,
            event_time,
            sources,
            contents: data,
            behind: Default::default(),
            read: committed.clone(),
            committed,
            created: None,
            saved_in,
            output_since,
        });
        self.mark_stale();
        Ok(())
    }
}
