//! Where views' epochs go besides their contents: subscribers and sinks.

use super::*;

impl RuntimeState {
    pub(super) fn subscribe(
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
            // A view behind: its contents are as of the epoch it has got to, and its
            // subscribers get the epochs after it as it catches up.
            let _ = events.try_send(EpochChanges {
                epoch: entry.committed_epoch(self.epoch),
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

    /// Hands each subscriber its view's consolidated changes of `epoch`: at the end of an
    /// epoch every subscriber of a view that is not behind (`outputs` has the views with
    /// changes), when a view behind catches up only its subscribers (`outputs` has that view);
    /// drops subscribers that are gone or too far behind.
    pub(super) fn notify(
        &mut self,
        epoch: u64,
        outputs: &HashMap<ObjectId, Vec<ChangeBatch>>,
        caught_up: bool,
    ) {
        let views = &self.views;
        self.subscribers.retain(|s| {
            let Some(entry) = views.iter().find(|e| e.view.def.id == s.view) else { return false };
            let skip = if caught_up {
                !outputs.contains_key(&s.view)
            } else {
                !entry.behind.is_empty()
            };
            if skip {
                return true;
            }
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

    /// Hands each sink its view's changes of the epoch that just ended (`outputs`); a sink
    /// waiting for its view to catch up gets the view's whole contents once it has (and once
    /// it has written what it was handed before). A sink whose backlog would pass its limit
    /// gets no more changes and waits for its contents the same way.
    pub(super) fn feed_sinks(&mut self, epoch: u64, outputs: &HashMap<ObjectId, Vec<ChangeBatch>>) {
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
    pub(super) fn sink_progress(&mut self) {
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
}
