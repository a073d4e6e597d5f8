//! Start-up recovery: every stored materialized view comes back, from the newest checkpoint or
//! rebuilt from the logs, and sessions wait (with a NOTICE per step) until it is done.
//!
//! Invariants: recovery never hangs and never loses a view silently. A view whose restore from
//! the checkpoint fails — an error or a panic — is rebuilt from its inputs' logs instead (with
//! a WARN naming the cause), and so is every view after it in creation order (they may read
//! it). A view that cannot be rebuilt either is marked failed: it keeps its catalog entry,
//! `SHOW MATERIALIZED VIEWS` and `eddy_views` show its error, a query of it fails with that
//! error, and every other object serves. Periodic checkpoints start only once recovery is over,
//! so no checkpoint lacks a view that was still being restored.

use std::collections::{BTreeMap, HashMap};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::datatypes::Schema;
use eddy_common::panic::{catch_panic, panic_error};
use eddy_common::{ChangeBatch, Error, ObjectId, Offset, PartitionId, Result, SqlState};
use futures::FutureExt;

use crate::catalog::ViewDef;
use crate::failpoints::failpoint;
use crate::session::Session;
use crate::views::{LogRecord, View};
use crate::{Engine, Table, checkpoint};

/// How long one recovery step may run before sessions waiting on it are told it is still
/// running (and the log says which step), and again every time this passes.
const RECOVERY_STEP_REPORT_INTERVAL: Duration = Duration::from_secs(30);

/// One row of `SHOW MATERIALIZED VIEWS` / `eddy_views`.
pub(crate) struct ViewStatus {
    pub name: String,
    pub status: &'static str,
    pub error: Option<String>,
    pub restored_from: Option<String>,
    /// Epochs the view has still to complete to be in step with the others (0: in step).
    pub lag_epochs: u64,
}

/// What a waiting session is told: the step, and since when it runs.
#[derive(Clone)]
pub(crate) struct RecoveryStep {
    what: String,
    since: Instant,
}

impl Engine {
    /// Start-up: restores the views stored in the catalog. Views in the newest checkpoint get
    /// their state from it and read the logs on from the offsets it recorded; the others (and
    /// every view after the first that cannot be restored so, which may read it) are planned
    /// again and backfilled from the start of the logs. Fails only when the logs cannot be
    /// replayed; a view that cannot be restored is marked failed instead.
    pub async fn restore_views(self: &Arc<Self>) -> Result<()> {
        let defs =
            std::mem::take(&mut *self.stored_views.lock().unwrap_or_else(|p| p.into_inner()));
        if defs.is_empty() {
            return Ok(());
        }
        let mut session = self.stored_views_session()?;
        let from_checkpoint = self.restore_from_checkpoint(&mut session, &defs).await?;
        self.rebuild_views(&mut session, &defs[from_checkpoint..], true)
            .await;
        self.start_stored_sinks(|_| true).await
    }

    /// The server's own session that plans stored views: they name what is not in `public`
    /// by its schema.
    fn stored_views_session(self: &Arc<Self>) -> Result<Session> {
        let info = eddy_sql::SessionInfo {
            database: "eddy".into(),
            user: "eddy".into(),
            version: crate::version_string(),
            backend_pid: 0,
        };
        let mut session = Session::new(Arc::clone(self), &info)?;
        session.set_variable("search_path", eddy_sql::PUBLIC_SCHEMA)?;
        Ok(session)
    }

    /// Plans `defs` (creation order) again and backfills them from their inputs; one that
    /// cannot be rebuilt is marked failed, and so is every view after it that reads it. At
    /// start-up each step is a recovery step sessions wait through. Returns how many failed.
    async fn rebuild_views(
        self: &Arc<Self>,
        session: &mut Session,
        defs: &[ViewDef],
        at_startup: bool,
    ) -> usize {
        let mut failed = 0;
        for (i, def) in defs.iter().enumerate() {
            if at_startup {
                self.recovering(format!(
                    "rebuilding materialized view \"{}\" from the log ({} of {})",
                    def.name,
                    i + 1,
                    defs.len()
                ));
            }
            if let Some(upstream) = defs[..i].iter().find(|d| {
                def.dependencies.contains(&d.id)
                    && self
                        .view(&d.qualified())
                        .is_some_and(|v| self.view_failure(&v).is_some())
            }) {
                let e = Error::new(
                    SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE,
                    format!(
                        "it reads materialized view \"{}\", which failed",
                        upstream.name
                    ),
                );
                let schema = self.view(&def.qualified()).map(|v| Arc::clone(&v.schema));
                self.mark_view_failed(def, schema, e);
                failed += 1;
                continue;
            }
            let rebuilt = AssertUnwindSafe(async {
                failpoint("rebuild_view", &def.name)?;
                session.restore_view(def).await
            })
            .catch_unwind()
            .await;
            match rebuilt
                .unwrap_or_else(|panic| Err(panic_error("rebuilding the view", panic.as_ref())))
            {
                Ok(()) => {
                    self.set_restored_from(def.id, "log".to_owned());
                    tracing::info!(view = %def.name, "materialized view rebuilt from the log");
                }
                Err(e) => {
                    let schema = session.plan_stored_view(def).await.ok().map(|p| p.schema);
                    self.mark_view_failed(def, schema, e);
                    failed += 1;
                }
            }
        }
        failed
    }

    /// `ALTER MATERIALIZED VIEW name RESTART`: takes the view and every view reading it
    /// (directly or not) out of the runtime and rebuilds them from their inputs, in creation
    /// order, as a restart without their checkpoint would. Readers of them meanwhile get an
    /// error saying so (never an empty or stale answer); their subscriptions end; their sinks
    /// are handed the rebuilt contents. Returns the views rebuilt and how many failed.
    pub(crate) async fn restart_view(
        self: &Arc<Self>,
        view: &View,
    ) -> Result<(Vec<String>, usize)> {
        let mut session = self.stored_views_session()?;
        let all: Vec<Arc<View>> = self
            .views
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        let mut ids = vec![view.def.id];
        loop {
            let before = ids.len();
            for v in &all {
                if !ids.contains(&v.def.id) && v.def.dependencies.iter().any(|d| ids.contains(d)) {
                    ids.push(v.def.id);
                }
            }
            if ids.len() == before {
                break;
            }
        }
        let mut defs: Vec<ViewDef> = all
            .iter()
            .filter(|v| ids.contains(&v.def.id))
            .map(|v| v.def.clone())
            .collect();
        defs.sort_by_key(|d| d.id);
        let why = Error::new(
            SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!(
                "materialized view \"{}\" is being rebuilt (ALTER MATERIALIZED VIEW ... RESTART)",
                view.def.name
            ),
        )
        .with_hint("it answers again once the rebuild is done");
        {
            // Under the write lock: no change is in flight between the old dataflow and the
            // log the new one is backfilled from.
            let _guard = self.lock_writes().await;
            for def in &defs {
                self.stop_readers(def.id);
            }
            self.runtime.stop_views(ids, why).await?;
        }
        tracing::info!(view = %view.def.name, views = defs.len(), "restarting materialized views");
        let failed = self.rebuild_views(&mut session, &defs, false).await;
        Ok((
            defs.iter().map(|d| d.qualified().display()).collect(),
            failed,
        ))
    }

    /// Restores the longest prefix of `defs` (creation order) that the newest checkpoint can
    /// restore, then replays the logs past it; returns how many views it restored.
    async fn restore_from_checkpoint(
        self: &Arc<Self>,
        session: &mut Session,
        defs: &[ViewDef],
    ) -> Result<usize> {
        let started = Instant::now();
        let mut restored = match checkpoint::load_latest(&self.data_dir, &self.meta) {
            Ok(Some(r)) => r,
            Ok(None) => return Ok(0),
            Err(e) => {
                tracing::error!(error = %e, "the checkpoint cannot be read: views are rebuilt from the log");
                return Ok(0);
            }
        };
        // The prefix of views (in creation order) that the checkpoint holds and that read no
        // source keeping per-reader state (an upsert source's reader is not saved).
        let restorable = defs
            .iter()
            .take_while(|d| {
                restored.views.contains_key(&d.id)
                    && d.dependencies
                        .iter()
                        .all(|s| self.source_by_id(*s).is_none_or(|src| src.def.append_only))
            })
            .count();
        if restorable == 0 {
            return Ok(0);
        }
        // Taken on another number of workers, or (sharded) with another routing hash: every
        // sharded operator's state is routed to the shards its keys pick now.
        let reshard = restored.workers != self.workers.count()
            || (restored.workers > 1
                && restored.route_hash != eddy_dataflow::route::ROUTE_HASH_VERSION);
        tracing::info!(
            epoch = restored.epoch,
            views = restorable,
            checkpoint_workers = restored.workers,
            workers = self.workers.count(),
            reshard,
            "restoring views from the checkpoint"
        );
        self.recovering(format!(
            "restoring {restorable} materialized views from checkpoint {}",
            restored.epoch
        ));
        let mut done = 0;
        let mut committed_by_view = Vec::new();
        for def in &defs[..restorable] {
            let state = restored
                .views
                .remove(&def.id)
                .ok_or_else(|| Error::internal("a restored view vanished"))?;
            committed_by_view.push(state.committed.clone());
            let attempt = AssertUnwindSafe(self.restore_one(session, def, state, reshard))
                .catch_unwind()
                .await;
            match attempt.unwrap_or_else(|panic| {
                Err(panic_error(
                    "restoring the view from the checkpoint",
                    panic.as_ref(),
                ))
            }) {
                Ok(()) => {
                    self.set_restored_from(def.id, format!("checkpoint {}", restored.epoch));
                    done += 1;
                }
                Err(e) => {
                    let later = restorable - done - 1;
                    tracing::warn!(view = %def.name, error = %e, later, "restoring a materialized view from the checkpoint failed: it and the views after it are rebuilt from the log");
                    break;
                }
            }
        }
        let from_checkpoint = &defs[..done];
        // The streams the restored views read go back to the checkpoint's watermarks, which
        // the replay raises again; the others keep theirs as their logs end.
        let read: Vec<ObjectId> = from_checkpoint
            .iter()
            .flat_map(|d| d.dependencies.iter().copied())
            .collect();
        let clocks = std::mem::take(&mut restored.clocks)
            .into_iter()
            .filter(|c| c.reader.is_some() || read.contains(&c.object))
            .collect();
        self.runtime.restore_clocks(restored.epoch, clocks)?;
        // Every view that reads a table has read every partition of it to the same place:
        // the checkpoint's (a partition it has read nothing of: offset 0).
        let mut replay: BTreeMap<(ObjectId, u32), u64> = BTreeMap::new();
        for (def, committed) in from_checkpoint.iter().zip(&committed_by_view) {
            for table in def.dependencies.iter().filter_map(|d| self.table_by_id(*d)) {
                for partition in 0..table.def.partitions {
                    let offset = committed
                        .iter()
                        .find(|(o, p, _)| *o == table.def.id && *p == partition)
                        .map_or(0, |(_, _, n)| *n);
                    if *replay.entry((table.def.id, partition)).or_insert(offset) != offset {
                        return Err(Error::new(
                            SqlState::DATA_CORRUPTED,
                            format!(
                                "checkpoint {}: views read table {} to different offsets",
                                restored.epoch, table.def.name
                            ),
                        ));
                    }
                }
            }
        }
        // Sinks of the restored views wait through the replay (or replace their tables).
        let restored_ids: Vec<ObjectId> = from_checkpoint.iter().map(|d| d.id).collect();
        self.start_stored_sinks(|view| restored_ids.contains(&view))
            .await?;
        self.replay_tables(&replay).await?;
        self.flush_restored().await?;
        tracing::info!(
            epoch = restored.epoch,
            views = done,
            seconds = started.elapsed().as_secs_f64(),
            "views restored from the checkpoint"
        );
        Ok(done)
    }

    /// Plans one stored view and registers it with the state the checkpoint saved; its source
    /// readers start where the view had read to. Nothing of it is kept when this fails.
    async fn restore_one(
        self: &Arc<Self>,
        session: &mut Session,
        def: &ViewDef,
        mut state: checkpoint::RestoredView,
        reshard: bool,
    ) -> Result<()> {
        failpoint("restore_view", &def.name)?;
        let plan = session.plan_stored_view(def).await?;
        let sources = plan.node.sources();
        let event_time = Arc::new(eddy_dataflow::EventTime::new(&sources));
        for (source, watermark) in &state.watermarks {
            event_time.advance(*source, *watermark);
        }
        let dataflow = catch_panic("loading the view's state", || {
            let mut dataflow = self.view_dataflow(&plan, &event_time)?;
            if reshard {
                dataflow.load_resharded(state.parts())?;
            } else {
                dataflow.load(state.parts())?;
            }
            // The operators' marks travel in-band: they get the checkpoint's again.
            for (source, watermark) in &state.watermarks {
                if !dataflow.watermark(*source, *watermark)?.is_empty() {
                    return Err(Error::internal(
                        "a watermark made a restored view emit changes",
                    ));
                }
            }
            Ok(dataflow)
        })
        .map_err(|e| {
            Error::new(
                e.state,
                format!(
                    "restoring materialized view \"{}\" from the checkpoint: {}",
                    def.name, e.message
                ),
            )
        })?;
        let committed: HashMap<(ObjectId, u32), u64> = state
            .committed
            .iter()
            .map(|(o, p, n)| ((*o, *p), *n))
            .collect();
        let readers = self.new_readers(def.id, &sources, Some(&committed))?;
        let view = Arc::new(View {
            def: def.clone(),
            schema: plan.schema,
            watermark: plan.watermark,
        });
        let done = self.runtime.restore_view(
            Arc::clone(&view),
            dataflow,
            event_time,
            sources,
            crate::views::Restoring {
                contents: state.contents(),
                committed,
                checkpoint: (!reshard).then_some(state.base),
            },
        )?;
        done.await
            .map_err(|_| Error::internal("the view runtime stopped"))??;
        self.views
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(def.qualified(), view);
        self.start_readers(readers);
        Ok(())
    }

    /// Ends the epoch the replay filled. A view that failed on the replayed changes is marked
    /// failed (FLUSH reports it); the others go on.
    async fn flush_restored(&self) -> Result<()> {
        match self.flush().await {
            Err(e)
                if !self
                    .runtime
                    .failures()
                    .read()
                    .unwrap_or_else(|p| p.into_inner())
                    .is_empty() =>
            {
                tracing::error!(error = %e, "a restored view failed on the changes past the checkpoint");
                Ok(())
            }
            other => other.map(|_| ()),
        }
    }

    /// Recovery: sends the views what the tables' logs hold past the checkpoint's offsets, in
    /// commit order, as if it arrived now.
    async fn replay_tables(self: &Arc<Self>, from: &BTreeMap<(ObjectId, u32), u64>) -> Result<()> {
        let mut records: Vec<(Arc<Table>, LogRecord)> = Vec::new();
        for ((object, partition), offset) in from {
            let Some(table) = self.table_by_id(*object) else {
                continue;
            };
            self.log.scan(
                *object,
                PartitionId(*partition),
                Offset(*offset),
                |_, record| {
                    records.push((
                        Arc::clone(&table),
                        LogRecord::decode(&record, *partition, &table.schema)?,
                    ));
                    Ok(())
                },
            )?;
        }
        records.sort_by_key(|(table, r)| (r.txn, table.def.id, r.partition));
        let rows: usize = records
            .iter()
            .flat_map(|(_, r)| r.changes.iter())
            .map(ChangeBatch::len)
            .sum();
        tracing::info!(
            records = records.len(),
            rows,
            "replaying the logs past the checkpoint"
        );
        self.recovering(format!(
            "replaying {} records ({rows} rows) of the logs past the checkpoint",
            records.len()
        ));
        let engine = Arc::clone(self);
        tokio::task::spawn_blocking(move || -> Result<()> {
            for (table, record) in records {
                match record.watermark {
                    Some(w) => engine.runtime.watermark(table.def.id, w)?,
                    None => engine.runtime.changes(
                        table.def.id,
                        record.partition,
                        table.clock,
                        record.changes,
                        None,
                    )?,
                }
            }
            Ok(())
        })
        .await
        .map_err(|e| Error::internal(format!("replaying the logs: {e}")))?
    }

    /// Keeps a stored view that could not be restored: its name stays taken, its catalog entry
    /// stays (a restart tries again), and `error` is what reading it answers until it is dropped.
    fn mark_view_failed(
        &self,
        def: &ViewDef,
        schema: Option<arrow::datatypes::SchemaRef>,
        error: Error,
    ) {
        tracing::error!(view = %def.name, error = %error, "a materialized view could not be restored; it is marked failed, the other objects serve");
        let error = Error::new(
            error.state,
            format!(
                "materialized view \"{}\" could not be restored: {}",
                def.name, error.message
            ),
        )
        .with_hint(format!(
            "DROP MATERIALIZED VIEW {} and create it again; a restart tries to restore it again",
            def.qualified().display()
        ));
        self.runtime
            .failures()
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(def.id, error);
        let schema = schema.unwrap_or_else(|| Arc::new(Schema::empty()));
        let view = Arc::new(View {
            def: def.clone(),
            schema,
            watermark: None,
        });
        self.views
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(def.qualified(), view);
    }

    fn set_restored_from(&self, view: ObjectId, from: String) {
        self.restored_from
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(view, from);
    }

    /// Why `view` cannot answer, if it failed (at start-up or since).
    pub(crate) fn view_failure(&self, view: &View) -> Option<Error> {
        self.runtime
            .failures()
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&view.def.id)
            .cloned()
    }

    /// Every materialized view by name: its status (`running` or `failed`), its error, and
    /// what this run of the server restored it from (`checkpoint N`, `log`; `None`: created
    /// since it started, or not restored).
    pub(crate) fn view_statuses(&self) -> Vec<ViewStatus> {
        let failures = self.runtime.failures();
        let failures = failures.read().unwrap_or_else(|p| p.into_inner());
        let restored = self.restored_from.read().unwrap_or_else(|p| p.into_inner());
        let lag = self.runtime.lag();
        let views = self.views.read().unwrap_or_else(|p| p.into_inner());
        views
            .values()
            .map(|v| {
                let failure = failures.get(&v.def.id);
                ViewStatus {
                    name: v.def.qualified().display(),
                    status: if failure.is_some() {
                        "failed"
                    } else {
                        "running"
                    },
                    error: failure.map(|e| e.message.clone()),
                    restored_from: restored.get(&v.def.id).cloned(),
                    lag_epochs: lag.get(&v.def.id).copied().unwrap_or(0),
                }
            })
            .collect()
    }

    /// Marks the server as recovering (`what`: the step it is at): statements wait until
    /// [`Engine::recovered`], with NOTICEs of each step.
    pub fn recovering(&self, what: impl Into<String>) {
        let what = what.into();
        self.recovery.send_replace(Some(RecoveryStep {
            what,
            since: Instant::now(),
        }));
    }

    /// Lets statements run, and periodic checkpoints start.
    pub fn recovered(&self) {
        if let Err(e) = self.runtime.recovered() {
            tracing::error!(error = %e, "the view runtime stopped during recovery");
        }
        self.recovery.send_replace(None);
    }

    /// Waits until the server has recovered, telling `notices` each step it waits through, and
    /// again every [`RECOVERY_STEP_REPORT_INTERVAL`] a step runs on.
    pub(crate) async fn wait_recovered(
        &self,
        notices: Option<&tokio::sync::mpsc::UnboundedSender<String>>,
    ) {
        let mut state = self.recovery.subscribe();
        let mut waited: Option<Instant> = None;
        loop {
            let step = state.borrow_and_update().clone();
            let Some(step) = step else {
                if let (Some(started), Some(notices)) = (waited, notices) {
                    let _ = notices.send(format!(
                        "recovery finished after {:.1} s",
                        started.elapsed().as_secs_f64()
                    ));
                }
                return;
            };
            waited.get_or_insert_with(Instant::now);
            if let Some(notices) = notices {
                let _ = notices.send(format!("waiting for recovery: {}", step.what));
            }
            loop {
                match tokio::time::timeout(RECOVERY_STEP_REPORT_INTERVAL, state.changed()).await {
                    Ok(Ok(())) => break,
                    Ok(Err(_)) => return,
                    Err(_) => {
                        let seconds = step.since.elapsed().as_secs();
                        tracing::warn!(step = %step.what, seconds, "a recovery step is still running");
                        if let Some(notices) = notices {
                            let _ = notices.send(format!(
                                "still waiting for recovery after {seconds} s: {}",
                                step.what
                            ));
                        }
                    }
                }
            }
        }
    }
}
