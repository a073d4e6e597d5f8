//! Event time: the watermarks a dataflow's operators read, the late-row filter in front of
//! window computations, and the late events it records.
//!
//! The runtime owns the watermark of each source (the largest event time read minus the
//! declared delay, merged over partitions); it records it in the dataflow's [`EventTime`] (for
//! checkpoints and `eddy_watermarks`) and sends it into the dataflow as a mark after each
//! batch that raised it. Marks travel in order with the data; each operator that needs them
//! keeps its own [`Marks`], so a row is judged against the watermark as it stood before its
//! batch, whichever thread runs the operator.
//! A window is closed once the watermark reaches its end; its state is kept until the watermark
//! reaches `end + allowed_lateness`.

use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, Ordering};

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, Int64Array, RecordBatch};
use arrow::datatypes::{DataType, TimeUnit};
use eddy_common::{ChangeBatch, Error, ObjectId, Result};

use crate::OperatorState;
use crate::plan::{Expr, Lateness};
use crate::rows::{arrow_error, evaluate, filter_changes};

/// No watermark yet (nothing read, or a source without one).
const NONE: i64 = i64::MIN;

/// The [`crate::graph::Handler::on_watermark`] of an operator that keeps its marks in a
/// `marks` field ([`Marks`]): records each mark and passes it on.
macro_rules! keeps_marks {
    () => {
        fn on_watermark(
            &mut self,
            _input: usize,
            mark: crate::graph::Watermark,
            out: &mut crate::graph::Output,
        ) -> eddy_common::Result<()> {
            self.marks.pass(mark, out)
        }
    };
}
pub(crate) use keeps_marks;

/// The latest mark of each stream an operator has received.
#[derive(Debug, Clone, Default)]
pub struct Marks(Vec<(ObjectId, i64)>);

impl Marks {
    /// Records `mark`; whether it raised its stream's watermark.
    pub fn observe(&mut self, mark: crate::graph::Watermark) -> bool {
        match self.0.iter_mut().find(|(s, _)| *s == mark.source) {
            Some((_, w)) if *w >= mark.value => false,
            Some((_, w)) => {
                *w = mark.value;
                true
            }
            None => {
                self.0.push((mark.source, mark.value));
                true
            }
        }
    }

    /// What an operator that keeps marks does with one ([`crate::graph::Handler::on_watermark`]):
    /// records it and passes it on.
    pub(crate) fn pass(
        &mut self,
        mark: crate::graph::Watermark,
        out: &mut crate::graph::Output,
    ) -> Result<()> {
        self.observe(mark);
        out.watermark(mark);
        Ok(())
    }

    /// The watermark of a value derived from several streams: the least of theirs, `None`
    /// until each has one.
    pub fn min_of(&self, sources: &[ObjectId]) -> Option<i64> {
        sources.iter().try_fold(i64::MAX, |m, s| {
            let (_, w) = self.0.iter().find(|(o, _)| o == s)?;
            Some(m.min(*w))
        })
    }
}

/// One late row that was not applied (`eddy_late_events`).
#[derive(Debug, Clone)]
pub struct LateEvent {
    /// The row as the window saw it, as a JSON object.
    pub row: String,
    /// Event time of the row, µs since the Unix epoch.
    pub event_time: Option<i64>,
    /// The watermark when the row arrived, µs.
    pub watermark: i64,
    pub action: &'static str,
}

/// Watermarks of a dataflow's sources and the late events its operators recorded.
#[derive(Debug)]
pub struct EventTime {
    watermarks: Vec<(ObjectId, AtomicI64)>,
    late: Mutex<Vec<LateEvent>>,
    /// Rows whose evaluation failed (row as JSON, error): dead letters of the view.
    failed: Mutex<Vec<(String, String)>>,
    /// The dataflow's output changes with the wall clock (a temporal filter): it must see an
    /// epoch end regularly even when no data arrives.
    ticks: std::sync::atomic::AtomicBool,
}

impl EventTime {
    pub fn new(sources: &[ObjectId]) -> Self {
        EventTime {
            watermarks: sources.iter().map(|s| (*s, AtomicI64::new(NONE))).collect(),
            late: Mutex::new(Vec::new()),
            failed: Mutex::new(Vec::new()),
            ticks: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The watermark of every source that has one (for checkpoints; [`EventTime::advance`]
    /// puts them back).
    pub fn watermarks(&self) -> Vec<(ObjectId, i64)> {
        self.watermarks
            .iter()
            .filter_map(|(s, w)| {
                let w = w.load(Ordering::Acquire);
                (w != NONE).then_some((*s, w))
            })
            .collect()
    }

    pub fn needs_ticks(&self) {
        self.ticks.store(true, Ordering::Relaxed);
    }

    /// Whether epochs must end regularly for this dataflow even without new data.
    pub fn wants_ticks(&self) -> bool {
        self.ticks.load(Ordering::Relaxed)
    }

    /// Raises the watermark of `source` (it never goes back).
    pub fn advance(&self, source: ObjectId, watermark: i64) {
        if let Some((_, w)) = self.watermarks.iter().find(|(s, _)| *s == source) {
            w.fetch_max(watermark, Ordering::Relaxed);
        }
    }

    pub fn watermark(&self, source: ObjectId) -> Option<i64> {
        let w = self
            .watermarks
            .iter()
            .find(|(s, _)| *s == source)?
            .1
            .load(Ordering::Relaxed);
        (w != NONE).then_some(w)
    }

    /// The watermark of a value derived from several sources: the least of theirs, `None`
    /// until each has one.
    pub fn min_of(&self, sources: &[ObjectId]) -> Option<i64> {
        sources
            .iter()
            .map(|s| self.watermark(*s))
            .try_fold(i64::MAX, |m, w| w.map(|w| m.min(w)))
    }

    /// The late events recorded since the last call.
    pub fn take_late_events(&self) -> Vec<LateEvent> {
        std::mem::take(&mut *self.late.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Rows set aside because evaluating them failed, since the last call: (row JSON, error).
    pub fn take_failed_rows(&self) -> Vec<(String, String)> {
        std::mem::take(&mut *self.failed.lock().unwrap_or_else(|p| p.into_inner()))
    }

    pub(crate) fn record_failed(&self, rows: Vec<(String, String)>) {
        self.failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(rows);
    }

    pub(crate) fn record(&self, events: Vec<LateEvent>) {
        self.late
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(events);
    }
}

/// Event-time values of a timestamp array in µs (`None` for NULL).
pub fn micros(array: &ArrayRef) -> Result<Vec<Option<i64>>> {
    let per_micro = match array.data_type() {
        DataType::Timestamp(TimeUnit::Microsecond, _) => 1,
        DataType::Timestamp(TimeUnit::Nanosecond, _) => -1000,
        DataType::Timestamp(TimeUnit::Millisecond, _) => 1000,
        DataType::Timestamp(TimeUnit::Second, _) => 1_000_000,
        other => return Err(Error::internal(format!("event time of type {other}"))),
    };
    let raw = arrow::compute::cast(array, &DataType::Int64).map_err(arrow_error)?;
    let raw: &Int64Array = raw.as_primitive();
    Ok(raw
        .iter()
        .map(|v| {
            v.map(|v| {
                if per_micro > 0 {
                    v * per_micro
                } else {
                    v.div_euclid(-per_micro)
                }
            })
        })
        .collect())
}

/// The rows of `changes` that `keep` keeps; the others are recorded as late events dropped at
/// `watermark` (`times` are the rows' event times).
pub(crate) fn drop_late(
    changes: &ChangeBatch,
    keep: &BooleanArray,
    times: &[Option<i64>],
    watermark: i64,
    event_time: &EventTime,
) -> Result<ChangeBatch> {
    let late = (0..changes.len())
        .filter(|&i| !keep.value(i))
        .map(|i| LateEvent {
            row: row_json(changes.rows(), i),
            event_time: times[i],
            watermark,
            action: "dropped",
        })
        .collect();
    event_time.record(late);
    filter_changes(changes, keep)
}

/// Drops the rows whose window is closed (its end at or below the watermark before the
/// batch), unless the view applies late rows (`late_events = 'retract'`) and the window's
/// state is still kept; records every dropped row.
pub struct LateFilter {
    /// The window end of each row, and its event time, over the input.
    pub end: Expr,
    pub time: Expr,
    pub sources: Vec<ObjectId>,
    pub lateness: Lateness,
    pub event_time: std::sync::Arc<EventTime>,
    pub marks: Marks,
}

impl crate::graph::Handler for LateFilter {
    fn on_data(
        &mut self,
        _input: usize,
        changes: ChangeBatch,
        out: &mut crate::graph::Output,
    ) -> Result<()> {
        let Some(watermark) = self.marks.min_of(&self.sources) else {
            out.data(changes);
            return Ok(());
        };
        let ends = micros(&evaluate(&self.end, changes.rows())?)?;
        let keep: BooleanArray = ends
            .iter()
            .map(|end| {
                Some(match end {
                    None => true,
                    Some(end) if *end > watermark => true,
                    Some(end) => {
                        self.lateness.retract
                            && end.saturating_add(self.lateness.allowed_micros) > watermark
                    }
                })
            })
            .collect();
        if keep.true_count() == changes.len() {
            out.data(changes);
            return Ok(());
        }
        let times = micros(&evaluate(&self.time, changes.rows())?)?;
        out.data(drop_late(
            &changes,
            &keep,
            &times,
            watermark,
            &self.event_time,
        )?);
        Ok(())
    }

    crate::event_time::keeps_marks!();

    fn name(&self) -> String {
        let policy = if self.lateness.retract {
            "retract"
        } else {
            "drop"
        };
        format!("LateFilter {policy} end={}", self.end)
    }
}

/// Holds rows back until the watermark passes their event time, then releases them in
/// event-time order (`EMIT ON WINDOW CLOSE` over plain rows). A row already at or behind the
/// watermark when it arrives is late: released at once under `late_events = 'retract'` within
/// the allowed lateness, dropped and recorded otherwise.
pub struct Release {
    time: Expr,
    sources: Vec<ObjectId>,
    lateness: Lateness,
    event_time: std::sync::Arc<EventTime>,
    marks: Marks,
    held: Vec<ChangeBatch>,
    ready: Vec<ChangeBatch>,
}

impl Release {
    pub fn new(
        time: Expr,
        sources: Vec<ObjectId>,
        lateness: Lateness,
        event_time: std::sync::Arc<EventTime>,
    ) -> Self {
        Release {
            time,
            sources,
            lateness,
            event_time,
            marks: Marks::default(),
            held: Vec::new(),
            ready: Vec::new(),
        }
    }

    fn absorb(&mut self, batches: Vec<ChangeBatch>) -> Result<()> {
        let watermark = self.marks.min_of(&self.sources);
        for changes in batches {
            let Some(watermark) = watermark else {
                self.held.push(changes);
                continue;
            };
            let times = micros(&evaluate(&self.time, changes.rows())?)?;
            let late: BooleanArray = times
                .iter()
                .map(|t| Some(t.is_some_and(|t| t <= watermark)))
                .collect();
            if late.true_count() == 0 {
                self.held.push(changes);
                continue;
            }
            let applied: BooleanArray = times
                .iter()
                .map(|t| {
                    Some(t.is_some_and(|t| {
                        t <= watermark
                            && self.lateness.retract
                            && t.saturating_add(self.lateness.allowed_micros) > watermark
                    }))
                })
                .collect();
            let on_time = arrow::compute::not(&late).map_err(arrow_error)?;
            let dropped = (0..changes.len())
                .filter(|&i| late.value(i) && !applied.value(i))
                .map(|i| LateEvent {
                    row: row_json(changes.rows(), i),
                    event_time: times[i],
                    watermark,
                    action: "dropped",
                })
                .collect::<Vec<_>>();
            self.event_time.record(dropped);
            self.ready.push(filter_changes(&changes, &applied)?);
            self.held.push(filter_changes(&changes, &on_time)?);
        }
        Ok(())
    }

    /// The held rows at or behind the watermark, in event-time order.
    fn release(&mut self) -> Result<Vec<ChangeBatch>> {
        let mut out: Vec<ChangeBatch> = std::mem::take(&mut self.ready)
            .into_iter()
            .filter(|c| !c.is_empty())
            .collect();
        let Some(watermark) = self.marks.min_of(&self.sources) else {
            return Ok(out);
        };
        let mut due: Vec<ChangeBatch> = Vec::new();
        let mut kept = Vec::new();
        for changes in std::mem::take(&mut self.held) {
            let times = micros(&evaluate(&self.time, changes.rows())?)?;
            let ready: BooleanArray = times
                .iter()
                .map(|t| Some(t.is_none_or(|t| t <= watermark)))
                .collect();
            match ready.true_count() {
                0 => kept.push(changes),
                n if n == changes.len() => due.push(changes),
                _ => {
                    due.push(filter_changes(&changes, &ready)?);
                    kept.push(filter_changes(
                        &changes,
                        &arrow::compute::not(&ready).map_err(arrow_error)?,
                    )?);
                }
            }
        }
        self.held = kept;
        if due.is_empty() {
            return Ok(out);
        }
        let Some((rows, diffs)) = ChangeBatch::concat(&due)?.map(ChangeBatch::into_parts) else {
            return Ok(out);
        };
        let times = evaluate(&self.time, &rows)?;
        let order = arrow::compute::sort_to_indices(&times, None, None).map_err(arrow_error)?;
        let rows = arrow::compute::take_record_batch(&rows, &order).map_err(arrow_error)?;
        let diffs = arrow::compute::take(&diffs, &order, None).map_err(arrow_error)?;
        out.push(ChangeBatch::new(
            rows,
            diffs.as_primitive::<arrow::datatypes::Int64Type>().clone(),
        ));
        Ok(out)
    }
}

impl crate::graph::Handler for Release {
    fn on_data(
        &mut self,
        _input: usize,
        changes: ChangeBatch,
        _out: &mut crate::graph::Output,
    ) -> Result<()> {
        self.absorb(vec![changes])
    }

    crate::event_time::keeps_marks!();

    fn on_barrier(
        &mut self,
        _barrier: &crate::graph::Barrier,
        out: &mut crate::graph::Output,
    ) -> Result<()> {
        for changes in self.release()? {
            out.data(changes);
        }
        Ok(())
    }

    fn name(&self) -> String {
        format!("Release by {}", self.time)
    }

    fn state(&self) -> OperatorState {
        let rows = self.held.iter().map(|c| c.len()).sum();
        let bytes = self
            .held
            .iter()
            .map(|c| c.rows().get_array_memory_size())
            .sum();
        OperatorState {
            name: format!("Release by {}", self.time),
            rows,
            bytes,
        }
    }

    fn save(
        &mut self,
        _mode: crate::arrangement::SaveMode,
        out: &mut dyn crate::checkpoint::Sink,
    ) -> Result<()> {
        match crate::checkpoint::changes_part(&self.held)? {
            Some(batch) => out.put("held", batch),
            None => Ok(()),
        }
    }

    fn load(&mut self, name: &str, batch: &RecordBatch) -> Result<()> {
        match name {
            "held" => {
                self.held.push(crate::checkpoint::changes_of(batch)?);
                Ok(())
            }
            _ => Err(crate::checkpoint::unknown_part("Release", name)),
        }
    }
}

/// Row `i` of `batch` as a JSON object (numbers and booleans bare, everything else as text).
pub fn row_json(batch: &RecordBatch, i: usize) -> String {
    use std::fmt::Write;
    let options = arrow::util::display::FormatOptions::default();
    let mut out = String::from("{");
    for (c, field) in batch.schema().fields().iter().enumerate() {
        if c > 0 {
            out.push_str(", ");
        }
        let _ = write!(out, "{}: ", eddy_common::json_string(field.name()));
        let column = batch.column(c);
        if column.is_null(i) {
            out.push_str("null");
            continue;
        }
        let text = arrow::util::display::ArrayFormatter::try_new(column.as_ref(), &options)
            .map(|f| f.value(i).to_string())
            .unwrap_or_default();
        let bare =
            column.data_type().is_numeric() || matches!(column.data_type(), DataType::Boolean);
        if bare && (text.parse::<f64>().is_ok() || matches!(text.as_str(), "true" | "false")) {
            out.push_str(&text);
        } else {
            out.push_str(&eddy_common::json_string(&text));
        }
    }
    out.push('}');
    out
}
