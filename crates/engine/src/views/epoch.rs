//! Changes into the views, the end of an epoch, and publishing the views' contents.

use super::*;

impl RuntimeState {
    /// Hands a table's or view's changes to every view reading it (a source's to the one view
    /// whose reader read them), without waiting: each view's lane computes on its own; one
    /// whose dataflow fails stops at the end of the epoch, the others go on. Then advances the
    /// stream's watermark: rows are judged against the watermark as it stood before their
    /// batch.
    pub(super) fn push(
        &mut self,
        object: ObjectId,
        partition: u32,
        clock: Option<ClockSpec>,
        batches: &[ChangeBatch],
        reader: Option<ObjectId>,
        mut held: Option<ReaderRoom>,
    ) {
        for entry in self
            .views
            .iter_mut()
            .filter(|e| receives(e, object, reader))
        {
            if is_failed(&self.failures, entry.view.def.id) || batches.is_empty() {
                continue;
            }
            entry.lane.push(object, batches.to_vec(), held.take());
            self.dirty = true;
        }
        self.collect_all_late();
        let Some(spec) = clock else { return };
        let now = self.clock.instant();
        let restored = &mut self.restored_clocks;
        let clock = self.clocks.entry((object, reader)).or_insert_with(|| {
            let mut clock = StreamClock::new(spec, now);
            if let Some(saved) = restored.remove(&(object, reader))
                && saved.partitions.len() == clock.partitions.len()
            {
                clock.partitions = saved.partitions;
                clock.watermark = saved.watermark;
            }
            clock
        });
        match clock.observe(partition, batches, now) {
            Ok(Some(watermark)) => self.raise(object, reader, watermark),
            Ok(None) => {}
            Err(e) => tracing::error!(error = %e, "reading event times failed"),
        }
    }

    /// The periodic end of an epoch: a slow view may be left behind.
    pub(super) fn end_epoch_logged(&mut self) {
        if let Err(e) = self.end_epoch(&[]) {
            tracing::error!(error = %e, "ending an epoch failed");
        }
    }

    /// Ends the epoch with the views `keep` in step: those behind catch up first, and the
    /// epoch waits for them (a new view's backfill waits for the views it reads). Any other
    /// view may be left behind; whoever needs it (FLUSH, CHECKPOINT) waits for it elsewhere.
    pub(super) fn end_epoch(&mut self, keep: &[ObjectId]) -> Result<()> {
        self.catch_up(keep);
        self.end_epoch_with(keep)
    }

    /// Ends the epoch: every view emits what it held back, downstream views receive upstream
    /// output, then all contents are applied and published together. The epoch ends at one
    /// wall-clock time for every view (`now()` of temporal filters). Every view's lane gets
    /// the epoch end at once, except that a view reading views waits for their output (views
    /// are in creation order: what a view reads comes before it). A view that no other view
    /// reads, not in `keep`, and that does not answer within [`limits::VIEW_LAG_AFTER_MS`] (or
    /// is behind already) is left behind: the epoch goes on without it and
    /// [`RuntimeState::catch_up`] takes its answers as they come.
    fn end_epoch_with(&mut self, keep: &[ObjectId]) -> Result<()> {
        let now = self.clock.now_micros();
        let epoch = self.epoch + 1;
        let mut outputs: HashMap<ObjectId, Vec<ChangeBatch>> = HashMap::new();
        let mut answers: Vec<Option<lane::Answer>> = (0..self.views.len()).map(|_| None).collect();
        for i in 0..self.views.len() {
            let read: Vec<usize> = (0..i)
                .filter(|j| self.views[i].sources.contains(&self.views[*j].view.def.id))
                .collect();
            for j in read {
                self.settle(j, &mut answers, &mut outputs);
            }
            // Watermarks of the views this one reads: they advance once their rows were pushed.
            let marks: Vec<(ObjectId, i64)> = self.views[i]
                .sources
                .iter()
                .filter_map(|s| {
                    self.views[..i]
                        .iter()
                        .find(|e| e.view.def.id == *s)
                        .and_then(|e| Some((*s, e.watermark()?)))
                })
                .collect();
            let entry = &self.views[i];
            if is_failed(&self.failures, entry.view.def.id) {
                continue;
            }
            for (source, watermark) in &marks {
                entry.event_time.advance(*source, *watermark);
            }
            let upstream = entry
                .sources
                .iter()
                .filter_map(|s| Some((*s, outputs.get(s)?.clone())))
                .collect();
            let answer = entry.lane.end_epoch(lane::EpochEnd {
                now_micros: now,
                upstream,
                marks,
            });
            if entry.behind.is_empty() {
                answers[i] = Some(answer);
            } else {
                let read = entry.read.clone();
                self.views[i].behind.push_back(Behind {
                    epoch,
                    answer,
                    read,
                });
            }
        }
        let read_by_views: std::collections::HashSet<ObjectId> = self
            .views
            .iter()
            .flat_map(|e| e.sources.iter().copied())
            .collect();
        for i in 0..self.views.len() {
            let id = self.views[i].view.def.id;
            let may_lag = !read_by_views.contains(&id) && !keep.contains(&id);
            self.settle_or_leave(i, epoch, may_lag, &mut answers, &mut outputs);
        }
        let mut changed = false;
        let mut failed = Vec::new();
        for entry in &mut self.views {
            if let Some(out) = outputs.get(&entry.view.def.id)
                && !out.is_empty()
            {
                // A view whose contents cannot take its output (its rows could not spill)
                // fails alone; the epoch goes on for the others.
                let name = &entry.view.def.name;
                let applied = crate::failpoints::failpoint("view_contents", name)
                    .and_then(|()| entry.contents.apply(out));
                if let Err(e) = applied {
                    failed.push((entry.view.def.id, e));
                    continue;
                }
                entry.output_since.note(out);
                changed = true;
            }
            // A new view that answered at once: created.
            if entry.behind.is_empty()
                && outputs.contains_key(&entry.view.def.id)
                && let Some(created) = entry.created.take()
            {
                // Stale first: a reader that the answer lets in must not take the snapshots
                // published without this view.
                self.published
                    .write()
                    .unwrap_or_else(|p| p.into_inner())
                    .stale = true;
                created.done();
            }
        }
        for (id, e) in failed {
            outputs.remove(&id);
            if let Some(created) = self
                .views
                .iter_mut()
                .find(|v| v.view.def.id == id)
                .and_then(|v| v.created.take())
            {
                created.failed(e.clone());
            }
            self.fail(id, e);
        }
        self.collect_all_late();
        self.dirty = false;
        self.changed_since_checkpoint |= changed;
        self.epoch += 1;
        if !self.subscribers.is_empty() {
            self.notify(self.epoch, &outputs, false);
        }
        if !self.sinks.is_empty() {
            self.feed_sinks(self.epoch, &outputs);
        }
        self.publish_lag();
        self.publish_status();
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

    /// Waits for view `i`'s answer to the epoch end (if it was sent one): its output goes to
    /// `outputs` and it has committed what it read; a failure fails it with its readers.
    fn settle(
        &mut self,
        i: usize,
        answers: &mut [Option<lane::Answer>],
        outputs: &mut HashMap<ObjectId, Vec<ChangeBatch>>,
    ) {
        self.settle_or_leave(i, 0, false, answers, outputs);
    }

    /// [`RuntimeState::settle`], but when `may_lag` waits only [`limits::VIEW_LAG_AFTER_MS`]:
    /// a view that has not answered by then is left behind with the answer of `epoch` to come.
    fn settle_or_leave(
        &mut self,
        i: usize,
        epoch: u64,
        may_lag: bool,
        answers: &mut [Option<lane::Answer>],
        outputs: &mut HashMap<ObjectId, Vec<ChangeBatch>>,
    ) {
        let Some(answer) = answers.get_mut(i).and_then(Option::take) else {
            return;
        };
        let answer = if may_lag {
            // A view being created answers once its lane has backfilled it: not waited for.
            let patience = if self.views[i].created.is_some() {
                Duration::ZERO
            } else {
                Duration::from_millis(limits::VIEW_LAG_AFTER_MS)
            };
            match answer.wait_for(patience) {
                Ok(answer) => answer,
                Err(answer) => {
                    let entry = &mut self.views[i];
                    if entry.created.is_none() {
                        tracing::info!(view = %entry.view.def.name, epoch, "a view falls behind: the epoch goes on without it");
                    }
                    let read = entry.read.clone();
                    entry.behind.push_back(Behind {
                        epoch,
                        answer,
                        read,
                    });
                    return;
                }
            }
        } else {
            answer.wait()
        };
        let entry = &mut self.views[i];
        let result = answer.and_then(|out| {
            entry.output_since.before(&mut entry.contents, &out)?;
            entry.contents.check_view_output(&out)?;
            Ok(out)
        });
        match result {
            Ok(out) => {
                outputs.insert(entry.view.def.id, out);
                entry.committed.clone_from(&entry.read);
            }
            Err(e) => {
                let id = entry.view.def.id;
                if let Some(created) = entry.created.take() {
                    created.failed(e.clone());
                }
                self.fail(id, e);
            }
        }
    }

    /// Takes the answers of views that are behind, oldest first, as far as they have come
    /// (all of them for the views in `wait`): each is applied to the view's contents as the
    /// epoch it answers, and the view's subscribers and sinks get it as that epoch; a pending
    /// checkpoint of that epoch takes the view's contents then.
    pub(super) fn catch_up(&mut self, wait: &[ObjectId]) {
        if self.views.iter().all(|e| e.behind.is_empty()) {
            return;
        }
        let mut done: Vec<(u64, ObjectId, Vec<ChangeBatch>)> = Vec::new();
        let mut created_any = false;
        let mut failed = Vec::new();
        for entry in &mut self.views {
            while let Some(Behind {
                epoch,
                answer,
                read,
            }) = entry.behind.pop_front()
            {
                let answer = if wait.contains(&entry.view.def.id) {
                    answer.wait()
                } else {
                    match answer.ready() {
                        Ok(answer) => answer,
                        Err(answer) => {
                            entry.behind.push_front(Behind {
                                epoch,
                                answer,
                                read,
                            });
                            break;
                        }
                    }
                };
                let applied = answer.and_then(|out| {
                    entry.output_since.before(&mut entry.contents, &out)?;
                    crate::failpoints::failpoint("view_contents", &entry.view.def.name)?;
                    entry.contents.apply_view_output(&out)?;
                    entry.output_since.note(&out);
                    Ok(out)
                });
                match applied {
                    Ok(out) => {
                        entry.committed = read;
                        if let Some(created) = entry.created.take() {
                            // Its contents are published from now on, empty or not: stale
                            // before the answer lets a reader in.
                            self.published
                                .write()
                                .unwrap_or_else(|p| p.into_inner())
                                .stale = true;
                            created.done();
                            created_any = true;
                        }
                        for pending in &mut self.pending_checkpoints {
                            pending.reached(entry, epoch);
                        }
                        done.push((epoch, entry.view.def.id, out));
                    }
                    Err(e) => {
                        if let Some(created) = entry.created.take() {
                            created.failed(e.clone());
                        }
                        entry.behind.clear();
                        failed.push((entry.view.def.id, e));
                        break;
                    }
                }
            }
        }
        for (view, e) in failed {
            self.fail(view, e);
        }
        let changed = created_any || done.iter().any(|(_, _, out)| !out.is_empty());
        for (epoch, view, out) in done {
            let outputs = HashMap::from([(view, out)]);
            self.notify(epoch, &outputs, true);
            self.feed_sinks(epoch, &outputs);
        }
        self.collect_all_late();
        if changed {
            self.changed_since_checkpoint = true;
            self.mark_stale();
        }
        self.publish_lag();
        self.publish_status();
    }

    /// Publishes which views are behind, by how many epochs, and where they are (failed
    /// views are not: nothing waits for them).
    pub(super) fn publish_lag(&self) {
        let lag: BTreeMap<ObjectId, Lag> = self
            .views
            .iter()
            .filter(|e| !e.behind.is_empty() && !is_failed(&self.failures, e.view.def.id))
            .map(|e| {
                let lag = Lag {
                    epochs: e.behind.len() as u64,
                    oldest: e.behind.front().map_or(0, |b| b.epoch),
                };
                (e.view.def.id, lag)
            })
            .collect();
        self.lag.send_if_modified(|published| {
            let changed = *published != lag;
            if changed {
                *published = lag;
            }
            changed
        });
    }

    /// Some view's contents changed: the next reader has snapshots built.
    pub(super) fn mark_stale(&self) {
        self.published
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .stale = true;
    }

    /// When readers wait for snapshots: publishes fresh ones (if an epoch changed something)
    /// and hands them to every waiting reader.
    pub(super) fn answer_snapshot_requests(&mut self) {
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

    pub(super) fn publish(&mut self) {
        let mut map = HashMap::with_capacity(self.views.len());
        // A view being created has no contents to read yet (not "empty").
        for entry in self.views.iter_mut().filter(|e| e.created.is_none()) {
            let snapshot = entry.contents.view_rows();
            if let Err(e) = &snapshot {
                tracing::error!(view = %entry.view.def.name, error = %e, "building a view snapshot failed");
            }
            map.insert(entry.view.def.id, snapshot);
        }
        *self.published.write().unwrap_or_else(|p| p.into_inner()) = Published {
            snapshots: Arc::new(map),
            stale: false,
        };
    }
}
