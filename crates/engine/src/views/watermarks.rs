//! Streams' watermarks (idle partitions, log marks), late and failed rows, `eddy_watermarks`.

use super::*;

impl RuntimeState {
    /// Partitions idle past their stream's `idle_timeout` stop holding its watermark back. For
    /// a table, the decision goes to its log first and is applied when it comes back as a mark
    /// ([`RuntimeState::apply_mark`]); a source's reader, which has no log of Eddy's, applies it.
    pub(super) fn expire_idle_partitions(&mut self) {
        let now = self.clock.instant();
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
            self.raise(object, reader, watermark);
        }
    }

    /// The watermark of `object` (as `reader` reads it: `None`, every view) rose: each view
    /// reading it records it and gets it as a mark, after the changes sent before it. A view
    /// whose operators fail on it fails alone (at the end of the epoch).
    pub(super) fn raise(&mut self, object: ObjectId, reader: Option<ObjectId>, watermark: i64) {
        for entry in self
            .views
            .iter_mut()
            .filter(|e| receives(e, object, reader))
        {
            entry.event_time.advance(object, watermark);
            if !is_failed(&self.failures, entry.view.def.id) {
                entry.lane.watermark(object, watermark);
            }
        }
        self.dirty = true;
    }

    /// A table's watermark mark (live or replayed): it counts as the record it is in partition 0
    /// of the table's log for every view reading it, and raises the table's clock.
    pub(super) fn apply_mark(&mut self, object: ObjectId, watermark: i64) {
        for entry in self.views.iter_mut().filter(|e| receives(e, object, None)) {
            *entry.read.entry((object, 0)).or_default() += 1;
        }
        let Some(clock) = self.clocks.get_mut(&(object, None)) else {
            tracing::warn!(object = %object, "a watermark mark for a table without a clock");
            return;
        };
        if let Some(w) = clock.mark(watermark) {
            self.raise(object, None, w);
        }
        self.dirty = true;
    }

    /// [`RuntimeState::collect_late`] for every view.
    pub(super) fn collect_all_late(&mut self) {
        let late: Vec<(String, Arc<EventTime>)> = self
            .views
            .iter()
            .map(|e| (e.view.def.name.clone(), Arc::clone(&e.event_time)))
            .collect();
        for (name, event_time) in late {
            self.collect_late(&name, &event_time);
        }
    }

    /// Collects what a view's operators set aside: late rows and rows that failed to evaluate.
    pub(super) fn collect_late(&mut self, view: &str, event_time: &EventTime) {
        let failed = event_time.take_failed_rows();
        if !failed.is_empty() {
            let now = self.clock.now_system();
            tracing::warn!(
                view,
                rows = failed.len(),
                "rows a view could not evaluate went to eddy_dead_letters"
            );
            self.observed
                .add_failed(failed.into_iter().map(|(row, error)| FailedRow {
                    view: view.to_owned(),
                    row,
                    error,
                    received_at: now,
                }));
        }
        let events = event_time.take_late_events();
        if events.is_empty() {
            return;
        }
        let now = self.clock.now_system();
        self.observed
            .add_late(events.into_iter().map(|event| LateRecord {
                view: view.to_owned(),
                event,
                received_at: now,
            }));
    }

    pub(super) fn watermark_rows(&self) -> Vec<WatermarkRow> {
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
}
