//! Session windows: `GROUP BY` over `SESSION(rel, ts, gap)`'s window bounds and other keys.
//!
//! State, in [`Arrangement`]s keyed by the group values other than the window bounds (so it
//! spills past the memory budget and its checkpoints are incremental, ADR 0012): the key's
//! events (event time then input row, in arrow's row format, with their multiplicity); the
//! rows emitted for its sessions still tracked (the session's bounds then the output row);
//! its thresholds (below); and when the watermark next concerns it. Nothing is kept per row
//! outside them.
//!
//! At the end of an epoch each key that changed is looked at again: its events, sorted by
//! time, chain into sessions — events closer than the gap make one session
//! [first, last + gap). Only a session that changed is evaluated again: one whose bounds
//! were not emitted, or with a changed event time within (start − gap, end) (an event in it,
//! or one that bridged it to a neighbour or split it off). The sessions to evaluate, over
//! every key, are aggregated in one batch by the vectorized aggregate's calls
//! ([`crate::aggregate_call::Call`], one group per session); the difference with what was
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
//! plus the gap (an empty key is dropped). Each key is due under the earliest of its
//! thresholds still ahead, so a watermark that moves looks only at the keys it passes.

use std::hash::BuildHasher;
use std::ops::Range;
use std::sync::Arc;

use arrow::array::{
    ArrayRef, Int64Array, RecordBatch, TimestampMicrosecondArray, TimestampNanosecondArray,
};
use arrow::datatypes::{DataType, SchemaRef, TimeUnit};
use arrow::row::{RowConverter, Rows, SortField};
use eddy_common::{ChangeBatch, Error, Result};
use hashbrown::HashTable;

use crate::aggregate_call::{Call, GroupId, Runs};
use crate::arrangement::{Arrangement, NEVER};
use crate::event_time::{EventTime, LateEvent, micros, row_json};
use crate::graph::{Barrier, Handler, Output};
use crate::packed::{Packed, Weighted};
use crate::plan::{AggregateCall, Expr, WindowClose};
use crate::rows::{arrow_error, batch_of, eval_error, evaluate};
use crate::spill::MemoryBudget;
use crate::{OperatorState, checkpoint};

const EVENTS: &str = "session_events";
const EMITTED: &str = "session_rows";
const KEYS: &str = "session_keys";
const WAKE: &str = "session_wake";

/// Bytes of an event's time before its row, and of a session's bounds before its output row.
const TIME_BYTES: usize = 8;
const BOUNDS_BYTES: usize = 2 * TIME_BYTES;

/// Which group positions are the window bounds, and the session's time and gap.
pub struct Spec {
    pub group: Vec<Expr>,
    pub starts: Vec<usize>,
    pub ends: Vec<usize>,
    pub time: Expr,
    pub gap_micros: i64,
}

/// A key's thresholds: the latest end of its closed sessions and of its forgotten ones, and
/// the earliest watermark at which it changes without new events (it is due in `wake` then).
#[derive(Clone, Copy, Default, PartialEq, Eq)]
struct Thresholds {
    closed_end: Option<i64>,
    forgotten_end: Option<i64>,
    wake: Option<i64>,
}

impl Thresholds {
    const BYTES: usize = 3 * TIME_BYTES;

    fn encode(&self) -> [u8; Self::BYTES] {
        let mut out = [0u8; Self::BYTES];
        for (i, v) in [self.closed_end, self.forgotten_end, self.wake]
            .into_iter()
            .enumerate()
        {
            out[i * TIME_BYTES..(i + 1) * TIME_BYTES]
                .copy_from_slice(&time_bytes(v.unwrap_or(i64::MIN)));
        }
        out
    }

    fn decode(bytes: &[u8]) -> Result<Thresholds> {
        if bytes.len() != Self::BYTES {
            return Err(Error::internal("a session key's thresholds are damaged"));
        }
        let at = |i: usize| {
            let t = time_at(&bytes[i * TIME_BYTES..]);
            (t != i64::MIN).then_some(t)
        };
        Ok(Thresholds {
            closed_end: at(0),
            forgotten_end: at(1),
            wake: at(2),
        })
    }
}

/// `t` as bytes whose order is the order of the times.
fn time_bytes(t: i64) -> [u8; TIME_BYTES] {
    ((t as u64) ^ (1 << 63)).to_be_bytes()
}

fn time_at(bytes: &[u8]) -> i64 {
    let mut b = [0u8; TIME_BYTES];
    b.copy_from_slice(&bytes[..TIME_BYTES]);
    (u64::from_be_bytes(b) ^ (1 << 63)) as i64
}

/// A session's bounds, from the front of a row of `emitted`.
fn bounds_at(bytes: &[u8]) -> (i64, i64) {
    (time_at(bytes), time_at(&bytes[TIME_BYTES..]))
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
    out_rows: RowConverter,
    /// Key -> event time and input row -> multiplicity (the entry's time: the event time).
    events: Arrangement,
    /// Key -> session bounds and output row -> multiplicity: what its sessions show.
    emitted: Arrangement,
    /// Key -> its [`Thresholds`], one row per key tracked.
    keys: Arrangement,
    /// Key -> a watermark at which it is due, expiring then (an entry left by a threshold that
    /// moved since only makes the key looked at once more).
    wake: Arrangement,
    /// The keys changed this epoch (with an empty row), and by the entry of each the range of
    /// event times changed.
    dirty: Arrangement,
    changed: Vec<(i64, i64)>,
    /// Tests only: look at every key whenever the watermark moves (the schedule `wake`
    /// replaces, kept as the oracle of it).
    #[cfg(test)]
    revisit_all: bool,
    #[cfg(test)]
    last_watermark: Option<i64>,
    /// The type of the window bound columns (the time column's).
    bound_type: DataType,
    hasher: foldhash::fast::RandomState,
    scratch: Vec<u8>,
}

/// No event time changed (a key looked at again for its thresholds).
const UNCHANGED: (i64, i64) = (i64::MAX, i64::MIN);

impl SessionAggregate {
    pub fn new(
        input_schema: &SchemaRef,
        spec: Spec,
        calls: Vec<AggregateCall>,
        window: Option<(WindowClose, Arc<EventTime>)>,
        schema: SchemaRef,
    ) -> Result<Self> {
        let fields = |types: Vec<DataType>| types.into_iter().map(SortField::new).collect();
        let bound_type = spec.time.data_type(input_schema).map_err(eval_error)?;
        let key_types = (spec.group.iter().enumerate())
            .filter(|(i, _)| !spec.starts.contains(i) && !spec.ends.contains(i))
            .map(|(_, e)| e.data_type(input_schema))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(eval_error)?;
        let types = |s: &SchemaRef| s.fields().iter().map(|f| f.data_type().clone()).collect();
        Ok(SessionAggregate {
            marks: crate::event_time::Marks::default(),
            input_schema: input_schema.clone(),
            rows: RowConverter::new(fields(types(input_schema))).map_err(arrow_error)?,
            key_converter: RowConverter::new(fields(key_types)).map_err(arrow_error)?,
            out_rows: RowConverter::new(fields(types(&schema))).map_err(arrow_error)?,
            spec,
            calls,
            schema,
            window,
            events: Arrangement::new(),
            emitted: Arrangement::new(),
            keys: Arrangement::new(),
            wake: Arrangement::new(),
            dirty: Arrangement::new(),
            changed: Vec::new(),
            #[cfg(test)]
            revisit_all: tests::REVISIT_ALL.get(),
            #[cfg(test)]
            last_watermark: None,
            bound_type,
            hasher: foldhash::fast::RandomState::default(),
            scratch: Vec::new(),
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

    fn is_bound(&self, i: usize) -> bool {
        self.spec.starts.contains(&i) || self.spec.ends.contains(&i)
    }

    fn watermark(&self) -> Option<i64> {
        let (w, _) = self.window.as_ref()?;
        self.marks.min_of(&w.sources)
    }

    /// The thresholds of `key` (prepared), if it is tracked.
    fn thresholds(&self, key: &[u8]) -> Result<Option<Thresholds>> {
        self.keys
            .probe(key)
            .next()
            .map(|f| Thresholds::decode(f.row))
            .transpose()
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
        // The batch's distinct keys (each row's among them): their thresholds are read, and
        // they are noted as changed, once per batch.
        let (distinct, of_row) = distinct_keys(&self.hasher, &keys);
        let mut thresholds = Vec::new();
        if watermark.is_some() {
            self.keys
                .prepare(distinct.iter().map(|&i| keys.row(i).data()))?;
            for &i in &distinct {
                thresholds.push(self.thresholds(keys.row(i).data())?.unwrap_or_default());
            }
        }
        let mut ranges = vec![UNCHANGED; distinct.len()];
        for (i, d) in changes.diffs().values().iter().enumerate() {
            // A NULL time belongs to no session.
            let Some(t) = times[i] else { continue };
            let k = of_row[i] as usize;
            if let Some(w) = watermark {
                let state = thresholds[k];
                let on_time = t + gap > w && state.closed_end.is_none_or(|end| t >= end);
                let applied = lateness.retract
                    && t + gap + lateness.allowed_micros > w
                    && state.forgotten_end.is_none_or(|end| t >= end);
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
            self.scratch.clear();
            self.scratch.extend_from_slice(&time_bytes(t));
            self.scratch.extend_from_slice(encoded.row(i).data());
            self.events
                .update(keys.row(i).data(), &self.scratch, t, *d, NEVER)?;
            let (lo, hi) = &mut ranges[k];
            (*lo, *hi) = ((*lo).min(t), (*hi).max(t));
        }
        for (&i, (lo, hi)) in distinct.iter().zip(ranges) {
            if lo > hi {
                continue;
            }
            if let Some(id) = self.dirty.update(keys.row(i).data(), &[], 0, 1, NEVER)? {
                let id = id as usize;
                if self.changed.len() <= id {
                    self.changed.resize(id + 1, UNCHANGED);
                }
                let range = &mut self.changed[id];
                *range = (range.0.min(lo), range.1.max(hi));
            }
        }
        if !late.is_empty()
            && let Some((_, event_time)) = &self.window
        {
            event_time.record(late);
        }
        Ok(())
    }
}

/// The distinct keys of a batch (the first row of each), and each row's index among them.
fn distinct_keys(hasher: &foldhash::fast::RandomState, keys: &Rows) -> (Vec<usize>, Vec<u32>) {
    let mut firsts: Vec<usize> = Vec::new();
    let mut of_row: Vec<u32> = Vec::with_capacity(keys.num_rows());
    let mut table: HashTable<(u64, u32)> = HashTable::new();
    for i in 0..keys.num_rows() {
        let key = keys.row(i).data();
        let hash = hasher.hash_one(key);
        let same = |&(h, d): &(u64, u32)| h == hash && keys.row(firsts[d as usize]).data() == key;
        let d = match table.find(hash, same) {
            Some(&(_, d)) => d,
            None => {
                let d = firsts.len() as u32;
                firsts.push(i);
                table.insert_unique(hash, (hash, d), |&(h, _)| h);
                d
            }
        };
        of_row.push(d);
    }
    (firsts, of_row)
}

impl Handler for SessionAggregate {
    crate::event_time::keeps_marks!();

    fn on_data(&mut self, _input: usize, changes: ChangeBatch, _out: &mut Output) -> Result<()> {
        self.absorb(changes)?;
        self.events.settle()?;
        self.keys.settle()
    }

    fn on_barrier(&mut self, _barrier: &Barrier, out: &mut Output) -> Result<()> {
        for changes in self.emit()? {
            out.data(changes);
        }
        for a in [
            &mut self.events,
            &mut self.emitted,
            &mut self.keys,
            &mut self.wake,
        ] {
            a.settle()?;
        }
        Ok(())
    }

    fn name(&self) -> String {
        "SessionAggregate".to_owned()
    }

    fn state_rows(&self) -> usize {
        self.events.len()
    }

    fn state(&self) -> OperatorState {
        OperatorState {
            name: "SessionAggregate".to_owned(),
            rows: self.events.len(),
            bytes: self.events.size_bytes()
                + self.emitted.size_bytes()
                + self.keys.size_bytes()
                + self.wake.size_bytes(),
        }
    }

    fn spill_to(&mut self, budget: &Arc<MemoryBudget>) {
        self.events.spill_to(budget);
        self.emitted.spill_to(budget);
        self.keys.spill_to(budget);
        self.wake.spill_to(budget);
    }

    fn spilled_rows(&self) -> usize {
        self.events.spilled_rows()
            + self.emitted.spilled_rows()
            + self.keys.spilled_rows()
            + self.wake.spilled_rows()
    }

    fn save(
        &mut self,
        mode: crate::arrangement::SaveMode,
        out: &mut dyn checkpoint::Sink,
    ) -> Result<()> {
        self.events.save(mode, EVENTS, out)?;
        self.emitted.save(mode, EMITTED, out)?;
        self.keys.save(mode, KEYS, out)?;
        self.wake.save(mode, WAKE, out)
    }

    fn part_keys(&mut self, _name: &str, batch: &RecordBatch) -> Result<Option<Vec<ArrayRef>>> {
        checkpoint::key_columns(&self.key_converter, batch, "key")
    }

    fn load(&mut self, name: &str, batch: &RecordBatch) -> Result<()> {
        match name {
            EVENTS => self.events.load(batch),
            EMITTED => self.emitted.load(batch),
            KEYS => self.keys.load(batch),
            WAKE => self.wake.load(batch),
            _ => Err(checkpoint::unknown_part("SessionAggregate", name)),
        }
    }
}

#[path = "session_emit.rs"]
mod emit;

#[cfg(test)]
#[path = "session_tests.rs"]
mod tests;
