//! A stream's watermark: the largest event time read so far minus the declared delay, per
//! partition, merged by minimum, never decreasing.
//!
//! Entry point: [`StreamClock`]. Invariants: a clock raised only by the data it observes and by
//! the watermark marks of its log ([`StreamClock::mark`]) ends at the same value whatever reads
//! the log — the live runtime, a replay after a crash, a view created later. Only the live
//! runtime decides by the wall clock (a partition idle past `idle_timeout`); it records each
//! such decision as a mark in the table's log before applying it, so replays repeat it at the
//! same place among the commits.

use std::time::{Duration, Instant};

use eddy_common::{ChangeBatch, Result};

/// How a stream's watermark is computed: the largest event time in `column` read so far minus
/// `delay_micros`, per partition, merged by minimum.
#[derive(Debug, Clone, Copy)]
pub struct ClockSpec {
    pub column: usize,
    pub delay_micros: i64,
    pub partitions: u32,
    /// A partition without data for this long stops holding the watermark back (`idle_timeout`).
    pub idle_timeout: Option<Duration>,
}

/// A stream's watermark, tracked per partition from the data.
#[derive(Debug, Clone)]
pub(crate) struct StreamClock {
    pub(crate) spec: ClockSpec,
    /// Largest event time minus the delay, per partition (`None`: nothing read yet).
    pub(crate) partitions: Vec<Option<i64>>,
    /// The merged watermark; never decreases.
    pub(crate) watermark: Option<i64>,
    /// When each partition last had data (or when tracking began).
    last_data: Vec<Instant>,
    /// The value an idle decision asked the log to record and that has not come back as a mark
    /// yet: the same decision is not asked for twice.
    pub(crate) requested: Option<i64>,
}

impl StreamClock {
    /// A clock starting to track at `now` (the runtime clock's monotonic time).
    pub(crate) fn new(spec: ClockSpec, now: Instant) -> Self {
        let n = spec.partitions.max(1) as usize;
        StreamClock {
            spec,
            partitions: vec![None; n],
            watermark: None,
            last_data: vec![now; n],
            requested: None,
        }
    }

    /// A clock that reads a log: raised by its data and marks only, never by idleness (the
    /// marks hold the idle decisions the live clock made).
    pub(crate) fn replaying(spec: ClockSpec) -> Self {
        StreamClock::new(
            ClockSpec {
                idle_timeout: None,
                ..spec
            },
            Instant::now(),
        )
    }

    /// The least watermark over partitions that are not idle (`None` while one of them has
    /// none yet); when every partition is idle, the least over those that have one.
    pub(crate) fn merged(&self, now: Instant) -> Option<i64> {
        let active = |p: usize| {
            self.spec
                .idle_timeout
                .is_none_or(|t| now.duration_since(self.last_data[p]) < t)
        };
        let any_active = (0..self.partitions.len()).any(active);
        let mut merged: Option<i64> = None;
        for (p, w) in self.partitions.iter().enumerate() {
            let w = match (any_active, active(p), *w) {
                (true, false, _) | (false, _, None) => continue,
                (true, true, None) => return None,
                (_, _, Some(w)) => w,
            };
            merged = Some(merged.map_or(w, |m| m.min(w)));
        }
        merged
    }

    /// Raises the watermark to the merged value when that is higher; returns the new value.
    pub(crate) fn raise(&mut self, now: Instant) -> Option<i64> {
        match self.merged(now) {
            Some(m) => self.mark(m),
            None => None,
        }
    }

    /// Raises the watermark to `watermark` when that is higher (a mark read from the log, or
    /// an idle decision); returns the new value.
    pub(crate) fn mark(&mut self, watermark: i64) -> Option<i64> {
        if self.requested.is_some_and(|r| r <= watermark) {
            self.requested = None;
        }
        if self.watermark.is_some_and(|w| w >= watermark) {
            return None;
        }
        self.watermark = Some(watermark);
        Some(watermark)
    }

    /// What an idle partition would raise the watermark to now, unless that was asked for
    /// already (the live runtime records it as a mark first).
    pub(crate) fn idle_raise(&self, now: Instant) -> Option<i64> {
        self.spec.idle_timeout?;
        let m = self.merged(now)?;
        (self.watermark.is_none_or(|w| m > w) && self.requested.is_none_or(|r| m > r)).then_some(m)
    }

    /// Advances with a batch read from `partition` at `now`; returns the watermark when it
    /// moved.
    pub(crate) fn observe(
        &mut self,
        partition: u32,
        batches: &[ChangeBatch],
        now: Instant,
    ) -> Result<Option<i64>> {
        let mut top: Option<i64> = None;
        for changes in batches {
            let times = eddy_dataflow::event_time::micros(changes.rows().column(self.spec.column))?;
            for (t, d) in times.iter().zip(changes.diffs().values()) {
                if let (Some(t), true) = (t, *d > 0) {
                    top = Some(top.map_or(*t, |m: i64| m.max(*t)));
                }
            }
        }
        let p = partition as usize;
        if p >= self.partitions.len() {
            // A partition the spec did not announce holds the watermark back like the others
            // rather than being ignored.
            self.partitions.resize(p + 1, None);
            self.last_data.resize(p + 1, now);
        }
        self.last_data[p] = now;
        let Some(top) = top else { return Ok(None) };
        let candidate = top.saturating_sub(self.spec.delay_micros);
        self.partitions[p] = Some(self.partitions[p].map_or(candidate, |s| s.max(candidate)));
        Ok(self.raise(now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use eddy_common::time::Clock;

    fn spec(idle: Option<Duration>) -> ClockSpec {
        ClockSpec {
            column: 0,
            delay_micros: 10,
            partitions: 2,
            idle_timeout: idle,
        }
    }

    fn rows(times: &[i64]) -> Vec<ChangeBatch> {
        use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
        let schema = std::sync::Arc::new(Schema::new(vec![Field::new(
            "t",
            DataType::Timestamp(TimeUnit::Microsecond, None),
            true,
        )]));
        let times = arrow::array::TimestampMicrosecondArray::from(times.to_vec());
        let batch =
            arrow::array::RecordBatch::try_new(schema, vec![std::sync::Arc::new(times)]).unwrap();
        vec![ChangeBatch::inserts(batch)]
    }

    #[test]
    fn marks_make_a_replay_end_where_the_live_clock_did() {
        // Live: partition 1 never has data; once idle, partition 0 alone sets the watermark.
        // (An idle timeout long enough that partition 1 is not idle yet when partition 0 reads.)
        let clock = eddy_common::time::ManualClock::starting_at(0);
        let mut live = StreamClock::new(spec(Some(Duration::from_millis(400))), clock.instant());
        assert_eq!(
            live.observe(0, &rows(&[100]), clock.instant()).unwrap(),
            None
        );
        clock.advance(Duration::from_millis(300));
        assert_eq!(live.idle_raise(clock.instant()), None, "not idle yet");
        clock.advance(Duration::from_millis(200));
        let decided = live.idle_raise(clock.instant()).unwrap();
        assert_eq!(decided, 90);
        live.requested = Some(decided);
        assert_eq!(live.idle_raise(clock.instant()), None, "asked for once");
        assert_eq!(live.mark(decided), Some(90));
        assert_eq!(live.requested, None);
        // A replay of the log (the data, then the mark) ends at the same watermark, without
        // deciding anything by the wall clock.
        let mut replay = StreamClock::replaying(spec(Some(Duration::from_millis(1))));
        assert_eq!(
            replay.observe(0, &rows(&[100]), clock.instant()).unwrap(),
            None
        );
        clock.advance(Duration::from_millis(5));
        assert_eq!(replay.idle_raise(clock.instant()), None);
        assert_eq!(replay.mark(90), Some(90));
        assert_eq!(replay.watermark, live.watermark);
        // Marks never lower it.
        assert_eq!(replay.mark(50), None);
        assert_eq!(replay.watermark, Some(90));
    }
}
