//! A new view backfilled from its inputs, and a view restored from a checkpoint.

use super::*;

impl RuntimeState {
    pub(super) fn add_view(
        &mut self,
        view: Arc<View>,
        mut dataflow: eddy_dataflow::Dataflow,
        event_time: Arc<EventTime>,
        sources: Vec<ObjectId>,
        tables: Vec<Backfill>,
        progress: Option<&tokio::sync::mpsc::UnboundedSender<String>>,
    ) -> Result<()> {
        // Close the epoch in flight so that upstream views' contents are complete (views behind
        // that it does not read stay behind).
        self.end_epoch(&sources)?;
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
            crate::failpoints::failpoint("backfill", &view.def.name)?;
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
                    None => {
                        clock.observe(record.partition, &record.changes, self.clock.instant())?
                    }
                };
                if let Some(w) = raised {
                    event_time.advance(object, w);
                    pending.extend(dataflow.watermark(object, w)?);
                }
            }
            if since_epoch >= limits::BACKFILL_EPOCH_ROWS {
                since_epoch = 0;
                pending.extend(catch_panic("a view's operators", || {
                    dataflow.end_epoch(self.clock.now_micros())
                })?);
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
                pending.extend(dataflow.watermark(input.object, live)?);
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
        let lane = lane::Lane::start(&view.def.name, dataflow, pending, self.spill_dir.as_deref())?;
        // Its first epoch is waited for (its contents are complete once it is created), with
        // the views it reads.
        let mut keep = sources.clone();
        keep.push(id);
        self.views.push(Entry {
            view,
            lane,
            event_time,
            sources,
            contents,
            behind: Default::default(),
            committed: HashMap::new(),
            read,
        });
        self.dirty = true;
        self.end_epoch(&keep)
    }

    /// Recovery: registers a view restored from a checkpoint.
    pub(super) fn restore_view(
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
        let lane = lane::Lane::start(
            &view.def.name,
            dataflow,
            Vec::new(),
            self.spill_dir.as_deref(),
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
        });
        self.mark_stale();
        Ok(())
    }
}
