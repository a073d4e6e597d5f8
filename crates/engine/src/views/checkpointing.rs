//! A checkpoint of every view's state, handed to the writer.

use super::*;

impl RuntimeState {
    /// Copies every materialized view's state (at an epoch end, when nothing is in flight) and
    /// hands it to the checkpoint writer. A periodic checkpoint is skipped while the last one
    /// is still being written; `CHECKPOINT` waits for the writer.
    pub(super) fn checkpoint(&mut self, reply: Option<oneshot::Sender<Result<u64>>>) {
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
        let started_at_micros = self.clock.now_micros();
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
                    parts: entry.lane.save()?,
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
}
