//! What Eddy's system tables show of the runtime (`eddy_late_events`, `eddy_dead_letters`,
//! `eddy_watermarks`, `eddy_source_offsets`, `eddy_operators`), published by the runtime thread
//! as it changes. A reader takes a lock for a copy and never waits for the runtime, which may be
//! busy for long (a backfill, a burst of epochs, a view it waits for).
//!
//! Invariants: late and failed rows are kept in arrival order, at most
//! [`limits::LATE_EVENTS_KEPT_MAX`] of each (the oldest go first); watermarks and offsets are
//! those of the last epoch end (or change of views), never of a half-ended epoch.

use std::collections::VecDeque;

use super::*;

/// The runtime's published observations; shared by [`ViewRuntime`] and its thread.
#[derive(Default)]
pub(super) struct Observed {
    late: Mutex<VecDeque<LateRecord>>,
    failed: Mutex<VecDeque<FailedRow>>,
    status: RwLock<Status>,
}

/// What is replaced whole at each epoch end.
#[derive(Default)]
pub(super) struct Status {
    pub(super) watermarks: Vec<WatermarkRow>,
    pub(super) offsets: Vec<ConsumerOffsets>,
    /// Each materialized view's name and its lane's operators (read when asked: a lane
    /// publishes them itself at each epoch end it answers).
    pub(super) operators: Vec<(String, lane::Stats)>,
}

impl Observed {
    pub(super) fn add_late(&self, rows: impl IntoIterator<Item = LateRecord>) {
        keep_last(&self.late, rows);
    }

    pub(super) fn add_failed(&self, rows: impl IntoIterator<Item = FailedRow>) {
        keep_last(&self.failed, rows);
    }

    /// Forgets the late and failed rows of the views named `gone` (dropped).
    pub(super) fn forget(&self, gone: &[String]) {
        lock(&self.late).retain(|r| !gone.contains(&r.view));
        lock(&self.failed).retain(|r| !gone.contains(&r.view));
    }

    pub(super) fn publish(&self, status: Status) {
        *self.status.write().unwrap_or_else(|p| p.into_inner()) = status;
    }

    pub(super) fn late(&self) -> Vec<LateRecord> {
        lock(&self.late).iter().cloned().collect()
    }

    pub(super) fn failed(&self) -> Vec<FailedRow> {
        lock(&self.failed).iter().cloned().collect()
    }

    pub(super) fn watermarks(&self) -> Vec<WatermarkRow> {
        self.status().watermarks.clone()
    }

    pub(super) fn offsets(&self) -> Vec<ConsumerOffsets> {
        self.status().offsets.clone()
    }

    pub(super) fn operators(&self) -> Vec<(String, eddy_dataflow::OperatorStats)> {
        self.status()
            .operators
            .iter()
            .flat_map(|(view, stats)| stats.read().into_iter().map(|s| (view.clone(), s)))
            .collect()
    }

    fn status(&self) -> std::sync::RwLockReadGuard<'_, Status> {
        self.status.read().unwrap_or_else(|p| p.into_inner())
    }
}

fn lock<T>(rows: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    rows.lock().unwrap_or_else(|p| p.into_inner())
}

/// Appends `rows`, then forgets the oldest past [`limits::LATE_EVENTS_KEPT_MAX`].
fn keep_last<T>(kept: &Mutex<VecDeque<T>>, rows: impl IntoIterator<Item = T>) {
    let mut kept = lock(kept);
    kept.extend(rows);
    let excess = kept.len().saturating_sub(limits::LATE_EVENTS_KEPT_MAX);
    kept.drain(..excess);
}

impl RuntimeState {
    /// Publishes what the system tables show as of now: called at the end of each epoch and
    /// whenever the set of views changes.
    pub(super) fn publish_status(&self) {
        let views = || self.views.iter().filter(|v| !v.view.def.sql.is_empty());
        self.observed.publish(Status {
            watermarks: self.watermark_rows(),
            offsets: views()
                .map(|v| ConsumerOffsets {
                    id: v.view.def.id,
                    view: v.view.def.qualified().display(),
                    sources: v.sources.clone(),
                    committed: v.committed.clone(),
                })
                .collect(),
            operators: views()
                .map(|v| (v.view.def.qualified().display(), v.lane.stats()))
                .collect(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failed(n: usize) -> FailedRow {
        FailedRow {
            view: format!("v{}", n % 2),
            row: n.to_string(),
            error: String::new(),
            received_at: std::time::SystemTime::UNIX_EPOCH,
        }
    }

    #[test]
    fn the_oldest_rows_go_first_past_the_limit() {
        let observed = Observed::default();
        let max = limits::LATE_EVENTS_KEPT_MAX;
        observed.add_failed((0..max).map(failed));
        observed.add_failed((max..max + 3).map(failed));
        let kept = observed.failed();
        assert_eq!(kept.len(), max);
        assert_eq!(kept[0].row, "3");
        assert_eq!(kept[max - 1].row, (max + 2).to_string());
        observed.forget(&["v0".to_owned()]);
        assert!(observed.failed().iter().all(|r| r.view == "v1"));
    }
}
