//! Inner equi-join with both sides arranged by key.
//!
//! Each side keeps a multiset of its rows per join key. A change on the left is joined with
//! the right side's current rows (weights multiply), then added to the left arrangement; a
//! change on the right likewise against the left, which already includes this push's left
//! changes — so a self-join sees ΔL⋈R + L'⋈ΔR, the exact delta of L⋈R. NULL keys never match.
//!
//! A join of two streams bounded in time (a window join, or an interval condition) forgets a
//! row once the other side's watermark shows no matching row can still arrive, and drops (and
//! records) rows too late to be matched completely.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, Int64Array, RecordBatch, UInt32Array};
use arrow::datatypes::SchemaRef;
use arrow::row::{OwnedRow, RowConverter, SortField};
use eddy_common::{ChangeBatch, Error, Result};

use crate::event_time::{EventTime, micros};
use crate::graph::{Barrier, Handler, Output};
use crate::plan::{Expr, TimeBound};
use crate::rows::{arrow_error, batch, eval_error, evaluate, filter_changes, take_columns};
use crate::{OperatorState, checkpoint};

/// The names of each side's checkpointed parts: rows, expiry, rows by time, their expiry.
const LEFT_PARTS: [&str; 4] = ["left", "left_expiry", "left_timed", "left_timed_expiry"];
const RIGHT_PARTS: [&str; 4] = ["right", "right_expiry", "right_timed", "right_timed_expiry"];

struct Side {
    keys: Vec<Expr>,
    /// Full rows of this side.
    rows: RowConverter,
    /// NULL keys match each other (IS NOT DISTINCT FROM).
    nulls_equal: bool,
    /// Join key -> row -> multiplicity.
    arrangement: crate::StateMap<OwnedRow, crate::StateMap<OwnedRow, i64>>,
    key_converter: RowConverter,
    /// Time-bounded joins: when rows may be forgotten, and the rows by the watermark (of the
    /// other side) that frees them.
    bound: Option<TimeBound>,
    expiry: BTreeMap<i64, Vec<(OwnedRow, OwnedRow)>>,
    /// Interval joins keep their rows here instead of in `arrangement`: per key, by event
    /// time, each row with its multiplicity (rarely more than one per key and microsecond), so
    /// a probe reads only the matching time range and a (key, time) slot expires whole. Rows
    /// without a time never match and are not kept.
    timed: crate::StateMap<OwnedRow, BTreeMap<i64, Vec<(OwnedRow, i64)>>>,
    /// When each (key, time) slot of `timed` may be forgotten.
    timed_expiry: BTreeMap<i64, Vec<(OwnedRow, i64)>>,
}

pub struct InnerJoin {
    /// The latest mark of each stream (in-band watermarks).
    marks: crate::event_time::Marks,
    left: Side,
    right: Side,
    filter: Option<Expr>,
    schema: SchemaRef,
    event_time: Option<Arc<EventTime>>,
    /// `FOR SYSTEM_TIME AS OF PROCTIME()`: left rows look the right side up and are not kept;
    /// with `pad`, unmatched left rows come out with NULLs (a left join).
    lookup: Option<bool>,
}

impl Side {
    fn new(schema: &SchemaRef, keys: Vec<Expr>, nulls_equal: bool) -> Result<Self> {
        let fields = schema
            .fields()
            .iter()
            .map(|f| SortField::new(f.data_type().clone()))
            .collect();
        let key_fields = keys
            .iter()
            .map(|k| k.data_type(schema).map(SortField::new))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(eval_error)?;
        Ok(Side {
            keys,
            rows: RowConverter::new(fields).map_err(arrow_error)?,
            nulls_equal,
            arrangement: crate::StateMap::default(),
            key_converter: RowConverter::new(key_fields).map_err(arrow_error)?,
            bound: None,
            expiry: BTreeMap::new(),
            timed: crate::StateMap::default(),
            timed_expiry: BTreeMap::new(),
        })
    }

    /// Whether rows are kept by time (`timed`) rather than in `arrangement`.
    fn indexed(&self) -> bool {
        self.bound.as_ref().is_some_and(|b| b.range.is_some())
    }

    /// Join keys of each row; `None` where a key column is NULL.
    fn keys_of(&mut self, rows: &RecordBatch) -> Result<Vec<Option<OwnedRow>>> {
        let keys = crate::rows::evaluate_keys(&self.keys, rows)?;
        let encoded = self
            .key_converter
            .convert_columns(&keys)
            .map_err(arrow_error)?;
        Ok((0..rows.num_rows())
            .map(|i| {
                if !self.nulls_equal && keys.iter().any(|k| k.is_null(i)) {
                    None
                } else {
                    Some(encoded.row(i).owned())
                }
            })
            .collect())
    }

    fn insert(&mut self, changes: &ChangeBatch, keys: &[Option<OwnedRow>]) -> Result<()> {
        let rows = self
            .rows
            .convert_columns(changes.rows().columns())
            .map_err(arrow_error)?;
        let expires = match &self.bound {
            Some(b) => Some((
                micros(&evaluate(&b.time, changes.rows())?)?,
                b.horizon_micros,
            )),
            None => None,
        };
        if let (true, Some((times, horizon))) = (self.indexed(), &expires) {
            return self.insert_timed(changes, keys, &rows, times, *horizon);
        }
        for (i, key) in keys.iter().enumerate() {
            let Some(key) = key else { continue };
            let bucket = self.arrangement.entry(key.clone()).or_default();
            let row = rows.row(i).owned();
            if let Some((times, horizon)) = &expires
                && let Some(t) = times[i]
                && changes.diffs().value(i) > 0
            {
                self.expiry
                    .entry(t.saturating_add(*horizon))
                    .or_default()
                    .push((key.clone(), row.clone()));
            }
            let count = bucket.entry(row.clone()).or_insert(0);
            *count += changes.diffs().value(i);
            if *count == 0 {
                bucket.remove(&row);
                if bucket.is_empty() {
                    self.arrangement.remove(key);
                }
            }
        }
        Ok(())
    }

    /// [`Side::insert`] for an interval join: rows go to their (key, time) slot.
    fn insert_timed(
        &mut self,
        changes: &ChangeBatch,
        keys: &[Option<OwnedRow>],
        rows: &arrow::row::Rows,
        times: &[Option<i64>],
        horizon: i64,
    ) -> Result<()> {
        for (i, key) in keys.iter().enumerate() {
            let (Some(key), Some(t)) = (key, times[i]) else {
                continue;
            };
            let diff = changes.diffs().value(i);
            let row = rows.row(i);
            if !self.timed.contains_key(key) {
                self.timed.insert(key.clone(), BTreeMap::new());
            }
            let slots = self
                .timed
                .get_mut(key)
                .ok_or_else(|| Error::internal("join time slots vanished"))?;
            let slot = slots.entry(t).or_default();
            if slot.is_empty() {
                self.timed_expiry
                    .entry(t.saturating_add(horizon))
                    .or_default()
                    .push((key.clone(), t));
            }
            match slot.iter().position(|(r, _)| r.row() == row) {
                Some(at) => {
                    slot[at].1 += diff;
                    if slot[at].1 == 0 {
                        slot.swap_remove(at);
                    }
                }
                None => slot.push((row.owned(), diff)),
            }
            if slot.is_empty() {
                slots.remove(&t);
                if slots.is_empty() {
                    self.timed.remove(key);
                }
            }
        }
        Ok(())
    }

    /// This side's state as parts named `<side>…` (only those that hold something).
    fn save(&self, side: &'static [&'static str; 4], out: &mut checkpoint::Parts) -> Result<()> {
        if !self.arrangement.is_empty() {
            let entries: Vec<(&OwnedRow, &OwnedRow, i64)> = self
                .arrangement
                .iter()
                .flat_map(|(k, rows)| rows.iter().map(move |(r, n)| (k, r, *n)))
                .collect();
            let columns = vec![
                (
                    "key",
                    checkpoint::binary(entries.iter().map(|e| e.0.as_ref())),
                ),
                (
                    "row",
                    checkpoint::binary(entries.iter().map(|e| e.1.as_ref())),
                ),
                ("count", checkpoint::int64s(entries.iter().map(|e| e.2))),
            ];
            out.push((side[0], checkpoint::part(columns, &[])?));
        }
        if !self.expiry.is_empty() {
            let entries: Vec<(i64, &OwnedRow, &OwnedRow)> = self
                .expiry
                .iter()
                .flat_map(|(t, v)| v.iter().map(move |(k, r)| (*t, k, r)))
                .collect();
            let columns = vec![
                ("time", checkpoint::int64s(entries.iter().map(|e| e.0))),
                (
                    "key",
                    checkpoint::binary(entries.iter().map(|e| e.1.as_ref())),
                ),
                (
                    "row",
                    checkpoint::binary(entries.iter().map(|e| e.2.as_ref())),
                ),
            ];
            out.push((side[1], checkpoint::part(columns, &[])?));
        }
        if !self.timed.is_empty() {
            let entries: Vec<(&OwnedRow, i64, &OwnedRow, i64)> = self
                .timed
                .iter()
                .flat_map(|(k, slots)| {
                    slots
                        .iter()
                        .flat_map(move |(t, slot)| slot.iter().map(move |(r, n)| (k, *t, r, *n)))
                })
                .collect();
            let columns = vec![
                (
                    "key",
                    checkpoint::binary(entries.iter().map(|e| e.0.as_ref())),
                ),
                ("time", checkpoint::int64s(entries.iter().map(|e| e.1))),
                (
                    "row",
                    checkpoint::binary(entries.iter().map(|e| e.2.as_ref())),
                ),
                ("count", checkpoint::int64s(entries.iter().map(|e| e.3))),
            ];
            out.push((side[2], checkpoint::part(columns, &[])?));
        }
        if !self.timed_expiry.is_empty() {
            let entries: Vec<(i64, &OwnedRow, i64)> = self
                .timed_expiry
                .iter()
                .flat_map(|(e, v)| v.iter().map(move |(k, t)| (*e, k, *t)))
                .collect();
            let columns = vec![
                ("expires", checkpoint::int64s(entries.iter().map(|e| e.0))),
                (
                    "key",
                    checkpoint::binary(entries.iter().map(|e| e.1.as_ref())),
                ),
                ("time", checkpoint::int64s(entries.iter().map(|e| e.2))),
            ];
            out.push((side[3], checkpoint::part(columns, &[])?));
        }
        Ok(())
    }

    /// Takes back part `which` (0–3, as in [`Side::save`]).
    fn load(&mut self, which: usize, batch: &RecordBatch) -> Result<()> {
        let keys = || -> Result<Vec<OwnedRow>> {
            checkpoint::required_rows(
                &self.key_converter,
                checkpoint::binary_column(batch, "key")?,
            )
        };
        let rows = || -> Result<Vec<OwnedRow>> {
            checkpoint::required_rows(&self.rows, checkpoint::binary_column(batch, "row")?)
        };
        match which {
            0 => {
                let counts = checkpoint::int64_column(batch, "count")?;
                for ((key, row), n) in keys()?.into_iter().zip(rows()?).zip(counts.values()) {
                    self.arrangement.entry(key).or_default().insert(row, *n);
                }
            }
            1 => {
                let times = checkpoint::int64_column(batch, "time")?;
                for ((key, row), t) in keys()?.into_iter().zip(rows()?).zip(times.values()) {
                    self.expiry.entry(*t).or_default().push((key, row));
                }
            }
            2 => {
                let (times, counts) = (
                    checkpoint::int64_column(batch, "time")?,
                    checkpoint::int64_column(batch, "count")?,
                );
                for (i, (key, row)) in keys()?.into_iter().zip(rows()?).enumerate() {
                    self.timed
                        .entry(key)
                        .or_default()
                        .entry(times.value(i))
                        .or_default()
                        .push((row, counts.value(i)));
                }
            }
            _ => {
                let (expires, times) = (
                    checkpoint::int64_column(batch, "expires")?,
                    checkpoint::int64_column(batch, "time")?,
                );
                for (i, key) in keys()?.into_iter().enumerate() {
                    self.timed_expiry
                        .entry(expires.value(i))
                        .or_default()
                        .push((key, times.value(i)));
                }
            }
        }
        Ok(())
    }

    /// Rows and approximate bytes held, like [`crate::rows::arrangement_size`].
    fn size(&self) -> (usize, usize) {
        let (mut rows, mut bytes) = crate::rows::arrangement_size(&self.arrangement);
        for (key, slots) in &self.timed {
            bytes += key.as_ref().len()
                + std::mem::size_of::<(OwnedRow, BTreeMap<i64, Vec<(OwnedRow, i64)>>)>();
            for slot in slots.values() {
                rows += slot.len();
                bytes += std::mem::size_of::<(i64, Vec<(OwnedRow, i64)>)>()
                    + slot
                        .iter()
                        .map(|(r, _)| r.as_ref().len() + std::mem::size_of::<(OwnedRow, i64)>())
                        .sum::<usize>();
            }
        }
        (rows, bytes)
    }
}

/// Takes the entries of an expiry list due at `watermark` (their time at or below it).
fn expired<T>(expiry: &mut BTreeMap<i64, Vec<T>>, watermark: i64) -> Vec<T> {
    let later = match watermark.checked_add(1) {
        Some(after) => expiry.split_off(&after),
        None => BTreeMap::new(),
    };
    std::mem::replace(expiry, later)
        .into_values()
        .flatten()
        .collect()
}

impl InnerJoin {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        nulls_equal: bool,
        left_schema: SchemaRef,
        right_schema: SchemaRef,
        left_keys: Vec<Expr>,
        right_keys: Vec<Expr>,
        filter: Option<Expr>,
        schema: SchemaRef,
    ) -> Result<Self> {
        Ok(InnerJoin {
            marks: crate::event_time::Marks::default(),
            left: Side::new(&left_schema, left_keys, nulls_equal)?,
            right: Side::new(&right_schema, right_keys, nulls_equal)?,
            filter,
            schema,
            event_time: None,
            lookup: None,
        })
    }

    /// Makes this a lookup join (`right FOR SYSTEM_TIME AS OF PROCTIME()`); `pad` for a left join.
    pub fn lookup(&mut self, pad: bool) {
        self.lookup = Some(pad);
    }

    /// Joins left changes with the right side as it is now; with `pad`, left rows that match
    /// nothing come out with NULLs for the right columns.
    fn look_up(
        &self,
        changes: &ChangeBatch,
        keys: &[Option<OwnedRow>],
        pad: bool,
    ) -> Result<Vec<ChangeBatch>> {
        let mut out = Vec::new();
        let joined = self.probe(changes, keys, true)?;
        if pad {
            let matched = self.matched_rows(changes, keys)?;
            let unmatched: Vec<u32> = (0..changes.len() as u32)
                .filter(|i| !matched[*i as usize])
                .collect();
            if !unmatched.is_empty() {
                let indices = UInt32Array::from(unmatched);
                let mut columns = take_columns(changes.rows().columns(), &indices)?;
                let left_width = columns.len();
                for field in self.schema.fields().iter().skip(left_width) {
                    columns.push(arrow::array::new_null_array(
                        field.data_type(),
                        indices.len(),
                    ));
                }
                let diffs =
                    arrow::compute::take(changes.diffs(), &indices, None).map_err(arrow_error)?;
                out.push(ChangeBatch::new(
                    batch(&self.schema, columns)?,
                    diffs.as_primitive::<arrow::datatypes::Int64Type>().clone(),
                ));
            }
        }
        out.extend(joined);
        Ok(out)
    }

    /// Per left row: whether it joins at least one right row (the filter included).
    fn matched_rows(&self, changes: &ChangeBatch, keys: &[Option<OwnedRow>]) -> Result<Vec<bool>> {
        let mut matched = vec![false; changes.len()];
        let mut mine = Vec::new();
        let mut theirs = Vec::new();
        for (i, key) in keys.iter().enumerate() {
            let Some(bucket) = key.as_ref().and_then(|k| self.right.arrangement.get(k)) else {
                continue;
            };
            if self.filter.is_none() {
                matched[i] = !bucket.is_empty();
                continue;
            }
            for row in bucket.keys() {
                mine.push(i as u32);
                theirs.push(row.row());
            }
        }
        if let (Some(filter), false) = (&self.filter, mine.is_empty()) {
            let left = take_columns(changes.rows().columns(), &UInt32Array::from(mine.clone()))?;
            let right = self.right.rows.convert_rows(theirs).map_err(arrow_error)?;
            let both = batch(&self.schema, [left, right].concat())?;
            let mask = evaluate(filter, &both)?;
            let mask = mask
                .as_boolean_opt()
                .ok_or_else(|| Error::internal("join filter is not boolean"))?;
            for (k, i) in mine.iter().enumerate() {
                if mask.is_valid(k) && mask.value(k) {
                    matched[*i as usize] = true;
                }
            }
        }
        Ok(matched)
    }

    /// Joins `changes` of one side with the other side's arrangement.
    fn probe(
        &self,
        changes: &ChangeBatch,
        keys: &[Option<OwnedRow>],
        changes_are_left: bool,
    ) -> Result<Option<ChangeBatch>> {
        let (me, other) = if changes_are_left {
            (&self.left, &self.right)
        } else {
            (&self.right, &self.left)
        };
        let mut mine = Vec::new();
        let mut theirs = Vec::new();
        let mut diffs = Vec::new();
        // Interval joins read only the other side's rows within the time range.
        let ranged = match &me.bound {
            Some(TimeBound {
                range: Some(range),
                time,
                ..
            }) => Some((*range, micros(&evaluate(time, changes.rows())?)?)),
            _ => None,
        };
        for (i, key) in keys.iter().enumerate() {
            let Some(key) = key.as_ref() else { continue };
            match &ranged {
                Some(((from, to), times)) if other.indexed() => {
                    let (Some(t), Some(slots)) = (times[i], other.timed.get(key)) else {
                        continue;
                    };
                    for (_, slot) in slots.range(t.saturating_add(*from)..=t.saturating_add(*to)) {
                        for (row, count) in slot {
                            mine.push(i as u32);
                            theirs.push(row.row());
                            diffs.push(changes.diffs().value(i) * count);
                        }
                    }
                }
                _ => {
                    let Some(bucket) = other.arrangement.get(key) else {
                        continue;
                    };
                    for (row, count) in bucket {
                        mine.push(i as u32);
                        theirs.push(row.row());
                        diffs.push(changes.diffs().value(i) * count);
                    }
                }
            }
        }
        if mine.is_empty() {
            return Ok(None);
        }
        let mine = take_columns(changes.rows().columns(), &UInt32Array::from(mine))?;
        let theirs = other.rows.convert_rows(theirs).map_err(arrow_error)?;
        let columns = if changes_are_left {
            [mine, theirs].concat()
        } else {
            [theirs, mine].concat()
        };
        let joined = ChangeBatch::new(batch(&self.schema, columns)?, Int64Array::from(diffs));
        match &self.filter {
            None => Ok(Some(joined)),
            Some(filter) => {
                let mask = evaluate(filter, joined.rows())?;
                let mask = mask
                    .as_boolean_opt()
                    .ok_or_else(|| Error::internal("join filter is not boolean"))?;
                let mask = BooleanArray::from_iter(mask.iter().map(|v| Some(v == Some(true))));
                let kept = filter_changes(&joined, &mask)?;
                Ok((!kept.is_empty()).then_some(kept))
            }
        }
    }

    /// A time-bounded join forgets rows the other side can no longer match, and drops rows
    /// that arrive too late to be matched completely.
    pub fn bound_by_time(&mut self, left: TimeBound, right: TimeBound, event_time: Arc<EventTime>) {
        self.left.bound = Some(left);
        self.right.bound = Some(right);
        self.event_time = Some(event_time);
    }

    fn drop_late(&self, side: &Side, changes: ChangeBatch) -> Result<ChangeBatch> {
        let (Some(bound), Some(event_time)) = (&side.bound, &self.event_time) else {
            return Ok(changes);
        };
        if !bound.drop_late {
            return Ok(changes);
        }
        let Some(watermark) = self.marks.min_of(&bound.own) else {
            return Ok(changes);
        };
        let times = micros(&evaluate(&bound.time, changes.rows())?)?;
        let keep: BooleanArray = times
            .iter()
            .map(|t| Some(t.is_none_or(|t| t.saturating_add(bound.allowed_micros) > watermark)))
            .collect();
        if keep.true_count() == changes.len() {
            return Ok(changes);
        }
        crate::event_time::drop_late(&changes, &keep, &times, watermark, event_time)
    }

    /// Forgets the rows of each side that the other side's watermark has passed.
    fn evict(&mut self) {
        if self.event_time.is_none() {
            return;
        }
        for side in [&mut self.left, &mut self.right] {
            let Some(bound) = &side.bound else { continue };
            let Some(watermark) = self.marks.min_of(&bound.other) else {
                continue;
            };
            for (key, row) in expired(&mut side.expiry, watermark) {
                if let Some(bucket) = side.arrangement.get_mut(&key) {
                    bucket.remove(&row);
                    if bucket.is_empty() {
                        side.arrangement.remove(&key);
                    }
                }
            }
            for (key, t) in expired(&mut side.timed_expiry, watermark) {
                if let Some(slots) = side.timed.get_mut(&key) {
                    slots.remove(&t);
                    if slots.is_empty() {
                        side.timed.remove(&key);
                    }
                }
            }
        }
    }

    fn process(
        &mut self,
        left: Vec<ChangeBatch>,
        right: Vec<ChangeBatch>,
    ) -> Result<Vec<ChangeBatch>> {
        let mut out = Vec::new();
        if let Some(pad) = self.lookup {
            for changes in right {
                let keys = self.right.keys_of(changes.rows())?;
                self.right.insert(&changes, &keys)?;
            }
            for changes in left {
                let keys = self.left.keys_of(changes.rows())?;
                out.extend(self.look_up(&changes, &keys, pad)?);
            }
            return Ok(out);
        }
        let left = left
            .into_iter()
            .map(|c| self.drop_late(&self.left, c))
            .collect::<Result<Vec<_>>>()?;
        let right = right
            .into_iter()
            .map(|c| self.drop_late(&self.right, c))
            .collect::<Result<Vec<_>>>()?;
        for changes in left {
            let keys = self.left.keys_of(changes.rows())?;
            out.extend(self.probe(&changes, &keys, true)?);
            self.left.insert(&changes, &keys)?;
        }
        for changes in right {
            let keys = self.right.keys_of(changes.rows())?;
            out.extend(self.probe(&changes, &keys, false)?);
            self.right.insert(&changes, &keys)?;
        }
        Ok(out)
    }
}

impl Handler for InnerJoin {
    crate::event_time::keeps_marks!();

    fn on_data(&mut self, input: usize, changes: ChangeBatch, out: &mut Output) -> Result<()> {
        let (left, right) = crate::graph::by_side(input, changes);
        for changes in self.process(left, right)? {
            out.data(changes);
        }
        Ok(())
    }

    fn on_barrier(&mut self, _barrier: &Barrier, _out: &mut Output) -> Result<()> {
        self.evict();
        Ok(())
    }

    fn name(&self) -> String {
        "InnerJoin".to_owned()
    }

    fn state(&self) -> OperatorState {
        let (left, right) = (self.left.size(), self.right.size());
        OperatorState {
            name: "InnerJoin".to_owned(),
            rows: left.0 + right.0,
            bytes: left.1 + right.1,
        }
    }

    fn save(&mut self) -> Result<checkpoint::Parts> {
        let mut out = Vec::new();
        self.left.save(&LEFT_PARTS, &mut out)?;
        self.right.save(&RIGHT_PARTS, &mut out)?;
        Ok(out)
    }

    fn part_keys(&mut self, name: &str, batch: &RecordBatch) -> Result<Option<Vec<ArrayRef>>> {
        let side = if LEFT_PARTS.contains(&name) {
            &self.left
        } else {
            &self.right
        };
        checkpoint::key_columns(&side.key_converter, batch, "key")
    }

    fn load(&mut self, name: &str, batch: &RecordBatch) -> Result<()> {
        if let Some(i) = LEFT_PARTS.iter().position(|p| *p == name) {
            self.left.load(i, batch)
        } else if let Some(i) = RIGHT_PARTS.iter().position(|p| *p == name) {
            self.right.load(i, batch)
        } else {
            Err(checkpoint::unknown_part("InnerJoin", name))
        }
    }
}
