//! The runtime thread: its loop, the messages it handles, and views that fail or are taken out to
//! be rebuilt.

use super::*;

impl RuntimeState {
    pub(super) fn run(mut self, queue: &Receiver<Message>) {
        let mut last_epoch = Instant::now();
        loop {
            // Idle, wait for work; with changes pending, wait only until the barrier is due.
            // Lanes wake this thread when they answer (views behind, checkpoints being saved).
            let wait = if self.dirty {
                self.barrier_interval.saturating_sub(last_epoch.elapsed())
            } else {
                self.barrier_interval
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
            self.catch_up(&[]);
            self.complete_checkpoints();
            self.take_deferred_checkpoint(&mut last_epoch);
            self.answer_snapshot_requests();
            self.expire_idle_partitions();
            // Views whose output moves with the wall clock (temporal filters) see every epoch.
            if !self.dirty && self.views.iter().any(|e| e.event_time.wants_ticks()) {
                self.dirty = true;
            }
            if self.dirty && last_epoch.elapsed() >= self.barrier_interval {
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
                self.feed_sinks(self.epoch, &HashMap::new());
            }
            let due = self.checkpoints.as_ref().is_some_and(|c| {
                c.interval
                    .is_some_and(|i| self.last_checkpoint.elapsed() >= i)
                    && !c.writer.busy()
            });
            // A periodic checkpoint is taken between epochs, once the last one is written (its
            // views then save only their changes since); views behind complete their part of
            // it when they reach its epoch.
            if due
                && self.recovered
                && self.changed_since_checkpoint
                && !self.dirty
                && self.pending_checkpoints.is_empty()
            {
                self.checkpoint(None);
            }
        }
    }

    /// Takes the oldest `CHECKPOINT` asked for once no checkpoint is in flight (one taken
    /// meanwhile would have to save every view whole: their last saves are not committed yet).
    fn take_deferred_checkpoint(&mut self, last_epoch: &mut Instant) {
        let busy = self.checkpoints.as_ref().is_some_and(|c| c.writer.busy());
        if busy || !self.pending_checkpoints.is_empty() {
            return;
        }
        let Some(reply) = self.deferred_checkpoints.pop_front() else {
            return;
        };
        let ended = self.end_epoch(&[]);
        *last_epoch = Instant::now();
        match ended {
            Ok(()) => self.checkpoint(Some(reply)),
            Err(e) => {
                let _ = reply.send(Err(e));
            }
        }
    }

    pub(super) fn handle(&mut self, message: Message, last_epoch: &mut Instant) {
        // What reads a view's contents or output as of now (a new view or sink over it) waits
        // for that view if it is behind, and only for it. Nothing waits for the other views
        // behind: FLUSH and CHECKPOINT wait for them outside the runtime thread.
        let wait: &[ObjectId] = match &message {
            Message::AddView { sources, .. } | Message::RestoreView { sources, .. } => sources,
            Message::AddSink { view, .. } => std::slice::from_ref(view),
            _ => &[],
        };
        if !wait.is_empty() {
            let wait = wait.to_vec();
            self.catch_up(&wait);
        }
        let views_change = matches!(
            message,
            Message::AddView { .. }
                | Message::DropView { .. }
                | Message::StopViews { .. }
                | Message::RestoreView { .. }
                | Message::RestoreClocks { .. }
                | Message::SeedClocks { .. }
        );
        self.handle_message(message, last_epoch);
        if views_change {
            self.publish_status();
            self.publish_lag();
        }
    }

    fn handle_message(&mut self, message: Message, last_epoch: &mut Instant) {
        match message {
            Message::Changes {
                object,
                partition,
                clock,
                batches,
                budget,
                reader,
                held,
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
                self.push(object, partition, clock, &batches, view, held);
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
                self.add_view(view, dataflow, event_time, sources, tables, progress, reply);
                *last_epoch = Instant::now();
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
                let gone: Vec<(ObjectId, String)> = self
                    .views
                    .iter()
                    .filter(|v| v.view.def.id == id || v.sources.contains(&id))
                    .map(|v| (v.view.def.id, v.view.def.name.clone()))
                    .collect();
                for pending in &mut self.pending_checkpoints {
                    pending.forget(gone.iter().map(|(id, _)| *id));
                }
                let gone: Vec<String> = gone.into_iter().map(|(_, name)| name).collect();
                self.observed.forget(&gone);
                for entry in &mut self.views {
                    if (entry.view.def.id == id || entry.sources.contains(&id))
                        && let Some(created) = entry.created.take()
                    {
                        created.failed(backfill::dropped_while_created(&entry.view.def.name));
                    }
                }
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
            Message::Recovered => self.recovered = true,
            Message::Wake => self.waker.woken(),
            Message::Barrier { reply } => {
                let _ = reply.send(());
            }
            Message::Checkpoint { reply } => {
                self.deferred_checkpoints.push_back(reply);
                self.take_deferred_checkpoint(last_epoch);
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
                        self.feed_sinks(self.epoch, &HashMap::new());
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
                state,
                reply,
            } => {
                let _ = reply.send(self.restore_view(view, dataflow, event_time, sources, *state));
            }
            Message::Flush { reply } => {
                // Failed views do not hold FLUSH (nor writers) back: the session reports them.
                // Views behind do: the session waits until they answered this epoch too
                // ([`ViewRuntime::flush`]), the runtime goes on.
                let result = self.end_epoch(&[]).map(|()| self.epoch);
                *last_epoch = Instant::now();
                let _ = reply.send(result);
            }
        }
    }

    pub(super) fn name_of(&self, id: ObjectId) -> String {
        self.views
            .iter()
            .find(|v| v.view.def.id == id)
            .map_or_else(|| id.to_string(), |v| v.view.def.qualified().display())
    }

    /// Marks `view` failed, and every view reading it (they would go stale silently); their
    /// subscriptions end. The other views and every writer go on.
    pub(super) fn fail(&mut self, view: ObjectId, error: Error) {
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
            failures.entry(id).or_insert(error);
        }
    }

    /// Takes views out to rebuild them ([`Message::StopViews`]), with the subscriptions'
    /// temporary views reading them.
    pub(super) fn stop_views(&mut self, ids: &[ObjectId], why: &Error) {
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
        // A checkpoint being saved leaves them out: a restart rebuilds them from the log.
        for pending in &mut self.pending_checkpoints {
            pending.forget(gone.iter().copied());
        }
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
}
