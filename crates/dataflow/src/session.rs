//! Session windows: `GROUP BY` over `SESSION(rel, ts, gap)`'s window bounds and other keys.
//!
//! State per key (the group values other than the window bounds): its events ordered by time,
//! with multiplicities, and the rows it last emitted. When a key changes, its sessions are
//! recomputed — events closer than the gap chain into one session [first, last + gap) — each
//! session's aggregates are evaluated over its events, and the difference with what was
//! emitted goes out: a bridging event merges sessions, retracting the merged-away rows.
//!
//! Over a watermarked stream a session is closed once the watermark reaches its end: under
//! `EMIT ON WINDOW CLOSE` only closed sessions are emitted; a session whose end plus the
//! allowed lateness the watermark has passed is forgotten (its row stays). A row is late when
//! its own window [ts, ts + gap) is closed or it falls before the end of a closed session of its
//! key (it would change a closed session): with `late_events = 'retract'` it is still applied
//! while the sessions it touches are kept (before the end of any forgotten session, and within
//! the allowed lateness); otherwise it is dropped and recorded.
//!
//! A key changes with the watermark only at its own thresholds: a session's end (it closes),
//! its end plus the allowed lateness (it is forgotten), and the end of its closed sessions
//! plus the gap (an empty key is dropped). Each key is queued under the earliest of its
//! thresholds still ahead, so a watermark that moves revisits only the keys it passes.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use crate::graph::{Barrier, Handler, Output};
use crate::{StateMap as HashMap, StateSet as HashSet};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, Int64Array, RecordBatch};
use arrow::datatypes::{DataType, SchemaRef, TimeUnit};
use arrow::row::{OwnedRow, RowConverter, SortField};
use datafusion::common::ScalarValue;
use eddy_common::{ChangeBatch, Error, Result};

use crate::event_time::{EventTime, LateEvent, micros, row_json};
use crate::plan::{AggregateCall, Expr, WindowClose};
use crate::rows::{arrow_error, batch, eval_error, evaluate};
use crate::{OperatorState, checkpoint};

/// Which group positions are the window bounds, and the session's time and gap.
pub struct Spec {
    pub group: Vec<Expr>,
    pub starts: Vec<usize>,
    pub ends: Vec<usize>,
    pub time: Expr,
    pub gap_micros: i64,
}

/// One session: start, end (last event + gap), and its events with multiplicity.
type Session<'a> = (i64, i64, Vec<(&'a OwnedRow, i64)>);

#[derive(Default)]
struct Key {
    /// The key's group values (window bound positions hold NULL).
    values: Vec<ScalarValue>,
    /// (event time µs, input row) -> multiplicity.
    events: BTreeMap<(i64, OwnedRow), i64>,
    /// Rows emitted for sessions still tracked, with multiplicity.
    emitted: HashMap<Vec<ScalarValue>, i64>,
    /// The latest end of the key's closed sessions, and of its forgotten ones.
    closed_end: Option<i64>,
    forgotten_end: Option<i64>,
    /// The earliest watermark at which the key changes without new events (it is queued in
    /// [`SessionAggregate::wake`] under it).
    wake: Option<i64>,
}

/// Events held and their bytes (as [`crate::OperatorState`] counts them), kept as they change.
#[derive(Default)]
struct Held {
    rows: usize,
    bytes: usize,
}

impl Held {
    const EVENT: usize = std::mem::size_of::<((i64, OwnedRow), i64)>();

    fn add(&mut self, row_len: usize) {
        self.rows += 1;
        self.bytes += row_len + Self::EVENT;
    }

    fn remove(&mut self, row_len: usize) {
        self.rows -= 1;
        self.bytes -= row_len + Self::EVENT;
    }
}

pub struct SessionAggregate {
    /// The latest mark of each stream (in-band watermarks).
    marks: crate::event_time::Marks,
    input_schema: SchemaRef,
    spec: Spec,
    calls: Vec<AggregateCall>,
    schema: SchemaRef,
    window: Option<(WindowClose, Arc<EventTime>)>,
    rows: RowConverter,
    key_converter: RowConverter,
    keys: HashMap<OwnedRow, Key>,
    dirty: HashSet<OwnedRow>,
    /// Keys by the watermark at which they are due to be looked at again (an item whose
    /// time is not its key's `wake` any more is stale and skipped).
    wake: BinaryHeap<Reverse<(i64, OwnedRow)>>,
    /// The events held, over every key.
    held: Held,
    /// Tests only: look at every key whenever the watermark moves (the schedule `wake`
    /// replaces, kept as the oracle of it).
    #[cfg(test)]
    revisit_all: bool,
    /// The type of the window bound columns (the time column's).
    bound_type: DataType,
    last_watermark: Option<i64>,
}

impl SessionAggregate {
    pub fn new(
        input_schema: &SchemaRef,
        spec: Spec,
        calls: Vec<AggregateCall>,
        window: Option<(WindowClose, Arc<EventTime>)>,
        schema: SchemaRef,
    ) -> Result<Self> {
        let fields = input_schema
            .fields()
            .iter()
            .map(|f| SortField::new(f.data_type().clone()))
            .collect();
        let bound_type = spec.time.data_type(input_schema).map_err(eval_error)?;
        let key_fields = (spec.group.iter().enumerate())
            .filter(|(i, _)| !spec.starts.contains(i) && !spec.ends.contains(i))
            .map(|(_, e)| e.data_type(input_schema).map(SortField::new))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(eval_error)?;
        Ok(SessionAggregate {
            marks: crate::event_time::Marks::default(),
            input_schema: input_schema.clone(),
            spec,
            calls,
            schema,
            window,
            rows: RowConverter::new(fields).map_err(arrow_error)?,
            key_converter: RowConverter::new(key_fields).map_err(arrow_error)?,
            keys: HashMap::default(),
            dirty: HashSet::default(),
            wake: BinaryHeap::new(),
            held: Held::default(),
            #[cfg(test)]
            revisit_all: tests::REVISIT_ALL.get(),
            bound_type,
            last_watermark: None,
        })
    }

    /// The input rows without the window bound placeholders (each is the row's own time).
    fn without_bounds(&self, rows: &RecordBatch) -> Result<RecordBatch> {
        let placeholders: Vec<usize> = self
            .spec
            .starts
            .iter()
            .chain(&self.spec.ends)
            .filter_map(|&g| {
                let any: &dyn std::any::Any = self.spec.group[g].as_ref();
                any.downcast_ref::<datafusion::physical_expr::expressions::Column>()
                    .map(|c| c.index())
            })
            .collect();
        let keep: Vec<usize> = (0..rows.num_columns())
            .filter(|c| !placeholders.contains(c))
            .collect();
        rows.project(&keep).map_err(arrow_error)
    }

    /// A key's group values from row `i` of its key columns (window bound positions: NULL).
    fn group_values(&self, key_columns: &[ArrayRef], i: usize) -> Result<Vec<ScalarValue>> {
        let mut values = Vec::with_capacity(self.spec.group.len());
        let mut k = 0;
        for g in 0..self.spec.group.len() {
            if self.is_bound(g) {
                values.push(ScalarValue::Null);
            } else {
                values.push(ScalarValue::try_from_array(&key_columns[k], i).map_err(eval_error)?);
                k += 1;
            }
        }
        Ok(values)
    }

    fn is_bound(&self, i: usize) -> bool {
        self.spec.starts.contains(&i) || self.spec.ends.contains(&i)
    }

    fn watermark(&self) -> Option<i64> {
        let (w, _) = self.window.as_ref()?;
        self.marks.min_of(&w.sources)
    }

    fn absorb(&mut self, changes: ChangeBatch) -> Result<()> {
        if changes.is_empty() {
            return Ok(());
        }
        let watermark = self.watermark();
        let lateness = self
            .window
            .as_ref()
            .map(|(w, _)| w.lateness)
            .unwrap_or_default();
        let gap = self.spec.gap_micros;
        let mut late = Vec::new();
        // The rows as late events show them (placeholders removed), built once per batch.
        let mut shown: Option<RecordBatch> = None;
        let rows = changes.rows();
        let key_columns: Vec<ArrayRef> = self
            .spec
            .group
            .iter()
            .enumerate()
            .filter(|(i, _)| !self.is_bound(*i))
            .map(|(_, e)| evaluate(e, rows).map(crate::rows::normalize_key))
            .collect::<Result<_>>()?;
        let keys = self
            .key_converter
            .convert_columns(&key_columns)
            .map_err(arrow_error)?;
        let encoded = self
            .rows
            .convert_columns(rows.columns())
            .map_err(arrow_error)?;
        let times = micros(&evaluate(&self.spec.time, rows)?)?;
        for (i, d) in changes.diffs().values().iter().enumerate() {
            // A NULL time belongs to no session.
            let Some(t) = times[i] else { continue };
            let key = keys.row(i).owned();
            if let Some(w) = watermark {
                let state = self.keys.get(&key);
                let on_time =
                    t + gap > w && state.and_then(|s| s.closed_end).is_none_or(|end| t >= end);
                let applied = lateness.retract
                    && t + gap + lateness.allowed_micros > w
                    && state
                        .and_then(|s| s.forgotten_end)
                        .is_none_or(|end| t >= end);
                if !on_time && !applied {
                    if shown.is_none() {
                        shown = Some(self.without_bounds(rows)?);
                    }
                    let row = shown.as_ref().map(|r| row_json(r, i)).unwrap_or_default();
                    late.push(LateEvent {
                        row,
                        event_time: Some(t),
                        watermark: w,
                        action: "dropped",
                    });
                    continue;
                }
            }
            let state = match self.keys.get_mut(&key) {
                Some(s) => s,
                None => {
                    let values = self.group_values(&key_columns, i)?;
                    self.keys.entry(key.clone()).or_insert(Key {
                        values,
                        ..Key::default()
                    })
                }
            };
            let row = encoded.row(i);
            match state.events.entry((t, row.owned())) {
                std::collections::btree_map::Entry::Vacant(v) if *d != 0 => {
                    v.insert(*d);
                    self.held.add(row.as_ref().len());
                }
                std::collections::btree_map::Entry::Vacant(_) => {}
                std::collections::btree_map::Entry::Occupied(mut o) => {
                    *o.get_mut() += d;
                    if *o.get() == 0 {
                        o.remove();
                        self.held.remove(row.as_ref().len());
                    }
                }
            }
            self.dirty.insert(key);
        }
        if !late.is_empty()
            && let Some((_, event_time)) = &self.window
        {
            event_time.record(late);
        }
        Ok(())
    }

    /// The sessions of a key: (start, end, events in the session with multiplicity).
    fn sessions(events: &BTreeMap<(i64, OwnedRow), i64>, gap: i64) -> Vec<Session<'_>> {
        let mut out: Vec<Session<'_>> = Vec::new();
        for ((t, row), n) in events {
            if *n <= 0 {
                continue;
            }
            match out.last_mut() {
                Some((_, end, members)) if *t < *end => {
                    *end = (*end).max(t + gap);
                    members.push((row, *n));
                }
                _ => out.push((*t, t + gap, vec![(row, *n)])),
            }
        }
        out
    }

    /// One session's output row: the key's values with the bounds filled, then the aggregates.
    fn session_row(
        &self,
        values: &[ScalarValue],
        start: i64,
        end: i64,
        members: &[(&OwnedRow, i64)],
    ) -> Result<Vec<ScalarValue>> {
        let mut out: Vec<ScalarValue> = values.to_vec();
        for &i in &self.spec.starts {
            out[i] = bound(&self.bound_type, start);
        }
        for &i in &self.spec.ends {
            out[i] = bound(&self.bound_type, end);
        }
        let repeated: Vec<arrow::row::Row<'_>> = members
            .iter()
            .flat_map(|(r, n)| std::iter::repeat_n(r.row(), *n as usize))
            .collect();
        let columns = self.rows.convert_rows(repeated).map_err(arrow_error)?;
        let events =
            RecordBatch::try_new(self.input_schema.clone(), columns).map_err(arrow_error)?;
        for call in &self.calls {
            let mut args: Vec<ArrayRef> = crate::aggregate_call::arguments(call)
                .iter()
                .map(|e| evaluate(e, &events))
                .collect::<Result<_>>()?;
            if let Some(filter) = &call.filter {
                let mask = evaluate(filter, &events)?;
                let mask = mask
                    .as_boolean_opt()
                    .ok_or_else(|| Error::internal("FILTER is not boolean"))?;
                let mask: BooleanArray = mask.iter().map(|v| Some(v == Some(true))).collect();
                args = args
                    .iter()
                    .map(|a| arrow::compute::filter(a, &mask).map_err(arrow_error))
                    .collect::<Result<_>>()?;
            }
            let mut acc = call.function.create_accumulator().map_err(eval_error)?;
            acc.update_batch(&args).map_err(eval_error)?;
            out.push(acc.evaluate().map_err(eval_error)?);
        }
        Ok(out)
    }

    fn emit(&mut self) -> Result<Vec<ChangeBatch>> {
        let watermark = self.watermark();
        let (emit_on_close, allowed) = self.window.as_ref().map_or((false, 0), |(w, _)| {
            (w.emit_on_close, w.lateness.allowed_micros)
        });
        // Keys that changed, and keys whose thresholds the watermark passed: sessions may
        // have closed (emitted under EMIT ON WINDOW CLOSE) or expired (forgotten).
        let mut todo = std::mem::take(&mut self.dirty);
        if let Some(w) = watermark {
            while let Some(Reverse((t, _))) = self.wake.peek()
                && *t <= w
            {
                let Some(Reverse((t, key))) = self.wake.pop() else {
                    break;
                };
                if self.keys.get(&key).is_some_and(|s| s.wake == Some(t)) {
                    todo.insert(key);
                }
            }
        }
        #[cfg(test)]
        if self.revisit_all && watermark.is_some() && watermark != self.last_watermark {
            todo = self.keys.keys().cloned().collect();
        }
        self.last_watermark = watermark.or(self.last_watermark);
        let is_ahead = |t: i64| watermark.is_none_or(|w| t > w);
        let mut rows: Vec<Vec<ScalarValue>> = Vec::new();
        let mut diffs: Vec<i64> = Vec::new();
        for key in todo {
            let Some(state) = self.keys.get(&key) else {
                continue;
            };
            let mut now: HashMap<Vec<ScalarValue>, i64> = HashMap::default();
            let mut expired: Vec<(i64, i64)> = Vec::new();
            let mut closed_end = state.closed_end;
            // The earliest threshold of a session still ahead of the watermark.
            let mut wake: Option<i64> = None;
            let mut ahead = |t: i64| {
                if is_ahead(t) {
                    wake = Some(wake.map_or(t, |w| w.min(t)));
                }
            };
            for (start, end, members) in Self::sessions(&state.events, self.spec.gap_micros) {
                let closed = watermark.is_some_and(|w| end <= w);
                ahead(end);
                ahead(end.saturating_add(allowed));
                if closed {
                    closed_end = Some(closed_end.map_or(end, |c| c.max(end)));
                }
                if emit_on_close && !closed {
                    continue;
                }
                *now.entry(self.session_row(&state.values, start, end, &members)?)
                    .or_default() += 1;
                if watermark.is_some_and(|w| end.saturating_add(allowed) <= w) {
                    expired.push((start, end));
                }
            }
            let state = self
                .keys
                .get_mut(&key)
                .ok_or_else(|| Error::internal("session key vanished"))?;
            for (row, n) in &now {
                let before = state.emitted.get(row).copied().unwrap_or(0);
                if *n != before {
                    rows.push(row.clone());
                    diffs.push(n - before);
                }
            }
            for (row, before) in &state.emitted {
                if !now.contains_key(row) {
                    rows.push(row.clone());
                    diffs.push(-before);
                }
            }
            state.emitted = now;
            state.closed_end = closed_end;
            // Forget sessions past the allowed lateness: their events and rows (the rows stay
            // in the view).
            for (start, end) in expired {
                state.forgotten_end = Some(state.forgotten_end.map_or(end, |f| f.max(end)));
                let held = &mut self.held;
                state.events.retain(|(t, row), _| {
                    let keep = *t < start || *t >= end;
                    if !keep {
                        held.remove(row.as_ref().len());
                    }
                    keep
                });
                state.emitted.retain(|row, _| {
                    let bounds_of = |i: &usize| row.get(*i).cloned();
                    let is_this = self
                        .spec
                        .starts
                        .iter()
                        .all(|i| bounds_of(i) == Some(bound(&self.bound_type, start)))
                        && self
                            .spec
                            .ends
                            .iter()
                            .all(|i| bounds_of(i) == Some(bound(&self.bound_type, end)));
                    !is_this
                });
            }
            // A key with nothing tracked is forgotten once every row that could still touch
            // its closed sessions is late by its own window anyway.
            let settled = match (state.closed_end, watermark) {
                (None, _) => true,
                (Some(end), Some(w)) => end + self.spec.gap_micros <= w,
                (Some(_), None) => false,
            };
            if state.events.is_empty() && state.emitted.is_empty() && settled {
                self.keys.remove(&key);
                continue;
            }
            if let Some(end) = state.closed_end {
                ahead(end.saturating_add(self.spec.gap_micros));
            }
            if wake != state.wake {
                state.wake = wake;
                if let Some(t) = wake {
                    self.wake.push(Reverse((t, key)));
                }
            }
        }
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let mut columns = Vec::with_capacity(self.schema.fields().len());
        for (c, field) in self.schema.fields().iter().enumerate() {
            let array = ScalarValue::iter_to_array(rows.iter().map(|r| r[c].clone()))
                .map_err(eval_error)?;
            let array = if array.data_type() == field.data_type() {
                array
            } else {
                arrow::compute::cast(&array, field.data_type()).map_err(arrow_error)?
            };
            columns.push(array);
        }
        Ok(vec![ChangeBatch::new(
            batch(&self.schema, columns)?,
            Int64Array::from(diffs),
        )])
    }
}

fn bound(data_type: &DataType, micros: i64) -> ScalarValue {
    match data_type {
        DataType::Timestamp(TimeUnit::Nanosecond, tz) => {
            ScalarValue::TimestampNanosecond(Some(micros * 1000), tz.clone())
        }
        DataType::Timestamp(_, tz) => ScalarValue::TimestampMicrosecond(Some(micros), tz.clone()),
        _ => ScalarValue::Int64(Some(micros)),
    }
}

impl Handler for SessionAggregate {
    crate::event_time::keeps_marks!();

    fn on_data(&mut self, _input: usize, changes: ChangeBatch, _out: &mut Output) -> Result<()> {
        self.absorb(changes)
    }

    fn on_barrier(&mut self, _barrier: &Barrier, out: &mut Output) -> Result<()> {
        for changes in self.emit()? {
            out.data(changes);
        }
        Ok(())
    }

    fn name(&self) -> String {
        "SessionAggregate".to_owned()
    }

    fn state_rows(&self) -> usize {
        self.held.rows
    }

    fn state(&self) -> OperatorState {
        OperatorState {
            name: "SessionAggregate".to_owned(),
            rows: self.held.rows,
            bytes: self.held.bytes,
        }
    }

    fn save(
        &mut self,
        _mode: crate::arrangement::SaveMode,
        out: &mut dyn checkpoint::Sink,
    ) -> Result<()> {
        let keys: Vec<(&OwnedRow, &Key)> = self.keys.iter().collect();
        let columns = vec![
            (
                "key",
                checkpoint::binary(keys.iter().map(|(k, _)| k.as_ref())),
            ),
            (
                "closed_end",
                Arc::new(Int64Array::from_iter(
                    keys.iter().map(|(_, s)| s.closed_end),
                )) as ArrayRef,
            ),
            (
                "forgotten_end",
                Arc::new(Int64Array::from_iter(
                    keys.iter().map(|(_, s)| s.forgotten_end),
                )),
            ),
        ];
        let key_part = checkpoint::part(columns, &[("last_watermark", self.last_watermark)])?;
        let events: Vec<(&OwnedRow, i64, &OwnedRow, i64)> = keys
            .iter()
            .flat_map(|(k, s)| s.events.iter().map(move |((t, r), n)| (*k, *t, r, *n)))
            .collect();
        let columns = vec![
            (
                "key",
                checkpoint::binary(events.iter().map(|e| e.0.as_ref())),
            ),
            ("time", checkpoint::int64s(events.iter().map(|e| e.1))),
            (
                "row",
                checkpoint::binary(events.iter().map(|e| e.2.as_ref())),
            ),
            ("count", checkpoint::int64s(events.iter().map(|e| e.3))),
        ];
        let events_part = checkpoint::part(columns, &[])?;
        // Emitted rows as computed (not cast to the output types), so they compare equal again.
        let emitted: Vec<(&OwnedRow, &Vec<ScalarValue>, i64)> = keys
            .iter()
            .flat_map(|(k, s)| s.emitted.iter().map(move |(row, n)| (*k, row, *n)))
            .collect();
        let mut columns: Vec<(String, ArrayRef)> = vec![
            (
                "key".into(),
                checkpoint::binary(emitted.iter().map(|e| e.0.as_ref())),
            ),
            (
                "count".into(),
                checkpoint::int64s(emitted.iter().map(|e| e.2)),
            ),
        ];
        for (c, field) in self.schema.fields().iter().enumerate() {
            let array = if emitted.is_empty() {
                arrow::array::new_empty_array(field.data_type())
            } else {
                ScalarValue::iter_to_array(emitted.iter().map(|e| e.1[c].clone()))
                    .map_err(eval_error)?
            };
            columns.push((format!("o{c}"), array));
        }
        out.put("keys", key_part)?;
        out.put("events", events_part)?;
        out.put("emitted", checkpoint::part(columns, &[])?)
    }

    fn part_keys(&mut self, _name: &str, batch: &RecordBatch) -> Result<Option<Vec<ArrayRef>>> {
        checkpoint::key_columns(&self.key_converter, batch, "key")
    }

    fn load(&mut self, name: &str, batch: &RecordBatch) -> Result<()> {
        let keys = checkpoint::required_rows(
            &self.key_converter,
            checkpoint::binary_column(batch, "key")?,
        )?;
        match name {
            "keys" => {
                let columns = self
                    .key_converter
                    .convert_rows(keys.iter().map(|k| k.row()))
                    .map_err(arrow_error)?;
                let (closed, forgotten) = (
                    checkpoint::int64_column(batch, "closed_end")?,
                    checkpoint::int64_column(batch, "forgotten_end")?,
                );
                for (i, key) in keys.into_iter().enumerate() {
                    let values = self.group_values(&columns, i)?;
                    // Looked at again by the next barrier, which queues it by its thresholds.
                    self.dirty.insert(key.clone());
                    let state = self.keys.entry(key).or_default();
                    state.values = values;
                    state.closed_end = checkpoint::value_at(closed, i);
                    state.forgotten_end = checkpoint::value_at(forgotten, i);
                }
                self.last_watermark = checkpoint::scalar(batch, "last_watermark")?;
            }
            "events" => {
                let rows = checkpoint::required_rows(
                    &self.rows,
                    checkpoint::binary_column(batch, "row")?,
                )?;
                let (times, counts) = (
                    checkpoint::int64_column(batch, "time")?,
                    checkpoint::int64_column(batch, "count")?,
                );
                for (i, (key, row)) in keys.into_iter().zip(rows).enumerate() {
                    let len = row.as_ref().len();
                    let events = &mut self.keys.entry(key).or_default().events;
                    if events
                        .insert((times.value(i), row), counts.value(i))
                        .is_none()
                    {
                        self.held.add(len);
                    }
                }
            }
            "emitted" => {
                let counts = checkpoint::int64_column(batch, "count")?;
                let columns = (0..self.schema.fields().len())
                    .map(|c| checkpoint::column(batch, &format!("o{c}")).cloned())
                    .collect::<Result<Vec<_>>>()?;
                for (i, key) in keys.into_iter().enumerate() {
                    let row = columns
                        .iter()
                        .map(|c| ScalarValue::try_from_array(c, i))
                        .collect::<std::result::Result<Vec<_>, _>>()
                        .map_err(eval_error)?;
                    self.keys
                        .entry(key)
                        .or_default()
                        .emitted
                        .insert(row, counts.value(i));
                }
            }
            _ => return Err(checkpoint::unknown_part("SessionAggregate", name)),
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "session_tests.rs"]
mod tests;
