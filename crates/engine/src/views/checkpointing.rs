//! Checkpoints of every view's state at one epoch, handed to the writer.
//!
//! A checkpoint is taken between two epochs: every view's lane is sent a save after the epoch
//! end (so it saves its state as of that epoch, however far behind it is), and each view's
//! contents and committed offsets are taken as of that epoch: now for a view in step, when
//! [`RuntimeState::catch_up`] applies that epoch for a view behind. The runtime thread never
//! waits for a view: the checkpoint is handed to the writer once every view has saved its part
//! ([`RuntimeState::complete_checkpoints`]), all at one epoch, so recovery is unchanged.

use super::*;
use crate::checkpoint::SavedContents;
use crate::table_chunks::ViewRows;
use eddy_dataflow::arrangement::SaveMode;

/// Rows of output a view notes besides half of the contents of its last whole save, before it
/// stops noting (and saves its contents whole next).
const OUTPUT_SLACK_ROWS: usize = 1024;

/// A view's output since its last save: a checkpoint that builds on that save writes these
/// changes of the contents rather than all of them. Noted from the first save on, until the
/// rows noted since the last whole save pass half of the contents then (a whole save is
/// cheaper from there on, and it keeps a restore's chain of changes short). While the
/// contents only ever got inserts, the output is not kept: it is the contents' rows past
/// those of the last save (which may have spilled to files).
#[derive(Default)]
pub(super) struct OutputSince {
    on: bool,
    batches: Vec<ChangeBatch>,
    /// Rows noted since the last whole save (those saved since included).
    rows: usize,
    /// Rows of the contents at the last whole save.
    whole_rows: usize,
    /// The contents only ever got inserts: rows of them at the last save.
    inserted_from: Option<usize>,
    /// The rows inserted since the last save before the first retraction (taken then, as the
    /// contents cannot tell them apart after it).
    inserted: Option<Arc<ViewRows>>,
}

impl OutputSince {
    /// An epoch's output, before it is checked against `contents`: if it is the first that
    /// does more than insert, the rows inserted since the last save are taken from the
    /// contents now (from then on, the output is kept).
    pub(super) fn before(&mut self, contents: &mut TableData, out: &[ChangeBatch]) -> Result<()> {
        let Some(from) = self.inserted_from.filter(|_| self.on) else {
            return Ok(());
        };
        if crate::table::only_inserts(out) {
            return Ok(());
        }
        match contents.inserted_since(from)? {
            Some(rows) => {
                self.inserted = Some(rows);
                self.inserted_from = None;
            }
            None => *self = OutputSince::default(),
        }
        Ok(())
    }

    /// An epoch's output, applied to the contents.
    pub(super) fn note(&mut self, out: &[ChangeBatch]) {
        if !self.on {
            return;
        }
        self.rows += out.iter().map(ChangeBatch::len).sum::<usize>();
        if self.rows > self.whole_rows / 2 + OUTPUT_SLACK_ROWS {
            *self = OutputSince::default();
            return;
        }
        if self.inserted_from.is_none() {
            self.batches
                .extend(out.iter().filter(|c| !c.is_empty()).cloned());
        }
    }

    /// Noting from a whole save of `whole_rows` rows of contents, followed by `since` rows of
    /// changes (a restore's); `inserted`: the contents' rows now, if they only ever got
    /// inserts.
    pub(super) fn restart(&mut self, whole_rows: usize, since: usize, inserted: Option<usize>) {
        *self = OutputSince {
            on: true,
            whole_rows,
            rows: since,
            batches: Vec::new(),
            inserted_from: inserted,
            inserted: None,
        };
    }
}

/// A checkpoint whose views are still saving (or catching up to its epoch).
pub(super) struct Pending {
    epoch: u64,
    started: Instant,
    started_at_micros: i64,
    /// How long the runtime thread took to ask for it.
    asked: Duration,
    clocks: Vec<ClockState>,
    views: Vec<PendingView>,
    reply: Option<oneshot::Sender<Result<u64>>>,
}

struct PendingView {
    id: ObjectId,
    name: String,
    state: Saving,
    /// The committed checkpoint the view's save builds on (asked for its changes only).
    base: Option<u64>,
    /// Contents and committed offsets as of the checkpoint's epoch, once the view has it.
    at_epoch: Option<AtEpoch>,
    watermarks: Vec<(ObjectId, i64)>,
}

/// A view's contents, and the offsets (object, partition, next) it has committed.
type AtEpoch = (SavedContents, Vec<(ObjectId, u32, u64)>);

enum Saving {
    Asked(lane::Answer<lane::Saved>),
    Saved(lane::Saved),
}

impl Pending {
    /// View `entry` has applied `epoch`'s output: if it is this checkpoint's, its contents
    /// and offsets are the ones to save.
    pub(super) fn reached(&mut self, entry: &mut Entry, epoch: u64) {
        if epoch != self.epoch {
            return;
        }
        let id = entry.view.def.id;
        let Some(view) = self
            .views
            .iter_mut()
            .find(|v| v.id == id && v.at_epoch.is_none())
        else {
            return;
        };
        match at_epoch(entry, view.base.is_some()) {
            Ok(state) => view.at_epoch = Some(state),
            Err(e) => {
                tracing::error!(view = %entry.view.def.name, error = %e, "copying a view's contents for a checkpoint failed: the checkpoint leaves it out");
                self.views.retain(|v| v.id != id);
            }
        }
    }

    /// Views dropped or taken out to be rebuilt: left out (a restart rebuilds them from the
    /// log, with the views created after them).
    pub(super) fn forget(&mut self, gone: impl IntoIterator<Item = ObjectId>) {
        let gone: Vec<ObjectId> = gone.into_iter().collect();
        self.views.retain(|v| !gone.contains(&v.id));
    }
}

/// A view's contents and committed offsets as of now: with `changes`, only the output since
/// its last save if it noted it.
fn at_epoch(entry: &mut Entry, changes: bool) -> Result<AtEpoch> {
    let since = &mut entry.output_since;
    let rows = entry.contents.row_count();
    let contents = match since.inserted_from {
        Some(from) if changes && since.on => {
            let inserted = entry.contents.inserted_since(from)?.ok_or_else(|| {
                Error::internal("a view's contents noted as inserted-only took a retraction")
            })?;
            since.inserted_from = Some(rows);
            SavedContents::Changes {
                inserted: Some(inserted),
                batch: eddy_dataflow::checkpoint::saved_changes(&entry.view.schema, &[])?,
            }
        }
        _ if changes && since.on => {
            let batches = std::mem::take(&mut since.batches);
            SavedContents::Changes {
                inserted: since.inserted.take(),
                batch: eddy_dataflow::checkpoint::saved_changes(&entry.view.schema, &batches)?,
            }
        }
        _ => {
            // Rows on disk are read back by the writer as it writes them.
            let only_inserted = entry.contents.only_inserted();
            since.restart(rows, 0, only_inserted.then_some(rows));
            SavedContents::Whole {
                schema: Arc::clone(entry.contents.schema()),
                rows: entry.contents.view_rows()?,
            }
        }
    };
    let committed = entry
        .committed
        .iter()
        .map(|((o, p), n)| (*o, *p, *n))
        .collect();
    Ok((contents, committed))
}

impl RuntimeState {
    /// Starts a checkpoint of every materialized view as of the epoch that just ended (call
    /// between epochs). A periodic checkpoint is skipped while the last one is still being
    /// written; `CHECKPOINT` waits for the writer.
    pub(super) fn checkpoint(&mut self, reply: Option<oneshot::Sender<Result<u64>>>) {
        self.sink_progress();
        if self.checkpoints.is_none() {
            if let Some(reply) = reply {
                let _ = reply.send(Err(Error::unsupported(
                    "this server does not write checkpoints",
                )));
            }
            return;
        }
        let started = Instant::now();
        let started_at_micros = self.clock.now_micros();
        let Some(writer) = self.checkpoints.as_ref().map(|c| Arc::clone(&c.writer)) else {
            return;
        };
        let committed = writer.committed();
        let mut views = Vec::new();
        for entry in self.views.iter_mut().filter(|e| !e.view.def.sql.is_empty()) {
            if is_failed(&self.failures, entry.view.def.id) {
                // Its state stopped at the failure; the next start rebuilds it from the log.
                tracing::warn!(view = %entry.view.def.name, "the checkpoint leaves out a failed view: a restart rebuilds it from the log");
                continue;
            }
            // Only the changes since the view's last save, when that one is committed.
            let base = entry.saved_in.take().filter(|s| Some(*s) == committed);
            let mode = match base {
                Some(_) => SaveMode::Changes,
                None => SaveMode::Full,
            };
            let at_epoch = if entry.behind.is_empty() {
                match at_epoch(entry, base.is_some()) {
                    Ok(state) => Some(state),
                    Err(e) => {
                        fail_checkpoint(reply, &entry.view.def.name, e);
                        return;
                    }
                }
            } else {
                tracing::info!(view = %entry.view.def.name, epoch = self.epoch, "a view behind saves its part of the checkpoint when it gets to its epoch");
                None
            };
            views.push(PendingView {
                id: entry.view.def.id,
                name: entry.view.def.name.clone(),
                base,
                state: Saving::Asked(
                    entry
                        .lane
                        .save(mode, writer.staging(self.epoch, entry.view.def.id)),
                ),
                at_epoch,
                watermarks: entry.event_time.watermarks(),
            });
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
        self.pending_checkpoints.push_back(Pending {
            epoch: self.epoch,
            started,
            started_at_micros,
            asked: started.elapsed(),
            clocks,
            views,
            reply,
        });
        self.last_checkpoint = Instant::now();
        self.changed_since_checkpoint = false;
        self.complete_checkpoints();
    }

    /// Hands every pending checkpoint whose views have all saved their part to the writer,
    /// oldest first.
    pub(super) fn complete_checkpoints(&mut self) {
        while let Some(pending) = self.pending_checkpoints.front_mut() {
            let failures = Arc::clone(&self.failures);
            // A view that failed meanwhile is left out.
            pending.views.retain(|v| !is_failed(&failures, v.id));
            let mut error = None;
            for view in &mut pending.views {
                if let Saving::Asked(answer) = &view.state
                    && let Some(saved) = answer.try_take()
                {
                    match saved {
                        Ok(saved) => view.state = Saving::Saved(saved),
                        Err(e) => {
                            error = Some((view.name.clone(), e));
                            break;
                        }
                    }
                }
            }
            if let Some((name, e)) = error {
                if let Some(pending) = self.pending_checkpoints.pop_front() {
                    fail_checkpoint(pending.reply, &name, e);
                }
                continue;
            }
            let complete = pending
                .views
                .iter()
                .all(|v| matches!(v.state, Saving::Saved(_)) && v.at_epoch.is_some());
            if !complete {
                return;
            }
            let Some(pending) = self.pending_checkpoints.pop_front() else {
                return;
            };
            self.submit(pending);
        }
    }

    fn submit(&mut self, pending: Pending) {
        let Some(checkpoints) = &self.checkpoints else {
            return;
        };
        let mut pause = pending.asked;
        let mut views = Vec::with_capacity(pending.views.len());
        for view in pending.views {
            let (Saving::Saved(saved), Some((contents, committed))) = (view.state, view.at_epoch)
            else {
                continue;
            };
            // The views stood still from the start (the runtime thread was asking them) until
            // this one's lane had copied its state (it may have begun before the asking ended).
            pause = pause.max(saved.done.saturating_duration_since(pending.started));
            if let Some(entry) = self.views.iter_mut().find(|e| e.view.def.id == view.id) {
                entry.saved_in = Some(pending.epoch);
            }
            views.push(ViewState {
                id: view.id,
                base: view.base,
                parts: saved.parts,
                contents,
                committed,
                watermarks: view.watermarks,
            });
        }
        let wait = pending.reply.is_some();
        let checkpoint = Checkpoint {
            epoch: pending.epoch,
            started_at_micros: pending.started_at_micros,
            pause,
            started: pending.started,
            workers: checkpoints.workers,
            views,
            clocks: pending.clocks,
            reply: pending.reply,
        };
        if let Err(c) = checkpoints.writer.submit(checkpoint, wait) {
            match c.reply {
                Some(reply) => {
                    let _ = reply.send(Err(Error::new(
                        SqlState::ADMIN_SHUTDOWN,
                        "the checkpoint writer stopped",
                    )));
                }
                // The writer is busy with the last one: the next interval tries again.
                None => self.changed_since_checkpoint = true,
            }
        }
    }
}

/// A checkpoint that cannot be taken: `CHECKPOINT` gets the error, a periodic one logs it.
fn fail_checkpoint(reply: Option<oneshot::Sender<Result<u64>>>, view: &str, e: Error) {
    match reply {
        Some(reply) => {
            let _ = reply.send(Err(e));
        }
        None => {
            tracing::error!(view = %view, error = %e, "copying a view's state for a checkpoint failed")
        }
    }
}
