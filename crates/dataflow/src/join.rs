//! Inner equi-join with both sides arranged by key.
//!
//! Each side keeps its rows by join key in an [`Arrangement`]. A change on the left is joined with
//! the right side's current rows (weights multiply), then added to the left arrangement; a
//! change on the right likewise against the left, which already includes this push's left
//! changes — so a self-join sees ΔL⋈R + L'⋈ΔR, the exact delta of L⋈R. NULL keys never match.
//!
//! A join of two streams bounded in time (a window join, or an interval condition) forgets a
//! row once the other side's watermark shows no matching row can still arrive, and drops (and
//! records) rows too late to be matched completely.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, Int64Array, RecordBatch, UInt32Array};
use arrow::datatypes::SchemaRef;
use arrow::row::{RowConverter, Rows, SortField};
use eddy_common::{ChangeBatch, Error, Result};

use crate::arrangement::{Arrangement, NEVER};
use crate::event_time::{EventTime, micros};
use crate::graph::{Barrier, Handler, Output};
use crate::plan::{Expr, TimeBound};
use crate::rows::{arrow_error, batch, eval_error, evaluate, filter_changes, take_columns};
use crate::spill::MemoryBudget;
use crate::{OperatorState, checkpoint};

/// The names of each side's checkpointed part (an [`Arrangement`]).
const LEFT_PART: &str = "left_rows";
const RIGHT_PART: &str = "right_rows";

struct Side {
    keys: Vec<Expr>,
    /// Full rows of this side.
    rows: RowConverter,
    /// NULL keys match each other (IS NOT DISTINCT FROM).
    nulls_equal: bool,
    key_converter: RowConverter,
    /// Time-bounded joins: when rows may be forgotten (each row expires once the other side's
    /// watermark passes its time plus the horizon), and for interval joins the time range a
    /// probe reads.
    bound: Option<TimeBound>,
    /// Join key -> row -> multiplicity, with each row's event time when bounded by time.
    /// Interval joins keep only rows with a time (the others never match).
    state: Arrangement,
}

/// The join keys of a batch's rows, encoded; `None` where a key column is NULL and NULLs do
/// not match.
pub(crate) struct Keys {
    encoded: Rows,
    /// Per row, whether it has a key (`None`: all have).
    valid: Option<Vec<bool>>,
}

impl Keys {
    /// Evaluates `exprs` over `rows` and encodes them with `converter`; with `nulls_equal`
    /// (IS NOT DISTINCT FROM) a NULL key is a key like any other.
    pub(crate) fn of(
        exprs: &[Expr],
        converter: &RowConverter,
        nulls_equal: bool,
        rows: &RecordBatch,
    ) -> Result<Keys> {
        let keys = crate::rows::evaluate_keys(exprs, rows)?;
        let encoded = converter.convert_columns(&keys).map_err(arrow_error)?;
        let valid = (!nulls_equal && keys.iter().any(|k| k.null_count() > 0)).then(|| {
            (0..rows.num_rows())
                .map(|i| keys.iter().all(|k| k.is_valid(i)))
                .collect()
        });
        Ok(Keys { encoded, valid })
    }

    pub(crate) fn get(&self, i: usize) -> Option<&[u8]> {
        match &self.valid {
            Some(valid) if !valid[i] => None,
            _ => Some(self.encoded.row(i).data()),
        }
    }

    /// Every row's key, skipping the rows without one.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &[u8]> {
        (0..self.encoded.num_rows()).filter_map(|i| self.get(i))
    }
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
            key_converter: RowConverter::new(key_fields).map_err(arrow_error)?,
            bound: None,
            state: Arrangement::new(),
        })
    }

    /// Whether probes read a time range of the rows (an interval join).
    fn indexed(&self) -> bool {
        self.bound.as_ref().is_some_and(|b| b.range.is_some())
    }

    /// Join keys of each row.
    fn keys_of(&self, rows: &RecordBatch) -> Result<Keys> {
        Keys::of(&self.keys, &self.key_converter, self.nulls_equal, rows)
    }

    /// Each row's event time (a time-bounded join).
    fn times(&self, changes: &ChangeBatch) -> Result<Option<Vec<Option<i64>>>> {
        match &self.bound {
            Some(b) => Ok(Some(micros(&evaluate(&b.time, changes.rows())?)?)),
            None => Ok(None),
        }
    }

    fn insert(&mut self, changes: &ChangeBatch, keys: &Keys) -> Result<()> {
        let rows = self
            .rows
            .convert_columns(changes.rows().columns())
            .map_err(arrow_error)?;
        let times = self.times(changes)?;
        let horizon = self.bound.as_ref().map(|b| b.horizon_micros);
        let indexed = self.indexed();
        let diffs = changes.diffs().values();
        for (i, diff) in diffs.iter().enumerate() {
            let Some(key) = keys.get(i) else { continue };
            let time = times.as_ref().and_then(|t| t[i]);
            if indexed && time.is_none() {
                continue;
            }
            let expires = match (time, horizon) {
                (Some(t), Some(h)) => t.saturating_add(h),
                _ => NEVER,
            };
            self.state
                .update(key, rows.row(i).data(), time.unwrap_or(0), *diff, expires)?;
        }
        Ok(())
    }
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
    fn look_up(&self, changes: &ChangeBatch, keys: &Keys, pad: bool) -> Result<Vec<ChangeBatch>> {
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
    fn matched_rows(&self, changes: &ChangeBatch, keys: &Keys) -> Result<Vec<bool>> {
        let mut matched = vec![false; changes.len()];
        let parser = self.right.rows.parser();
        let mut mine = Vec::new();
        let mut theirs = Vec::new();
        for (i, matched) in matched.iter_mut().enumerate() {
            let Some(key) = keys.get(i) else { continue };
            if self.filter.is_none() {
                *matched = self.right.state.contains_key(key);
                continue;
            }
            for found in self.right.state.probe(key) {
                mine.push(i as u32);
                theirs.push(parser.parse(found.row));
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
        keys: &Keys,
        changes_are_left: bool,
    ) -> Result<Option<ChangeBatch>> {
        let (me, other) = if changes_are_left {
            (&self.left, &self.right)
        } else {
            (&self.right, &self.left)
        };
        let parser = other.rows.parser();
        let mut mine = Vec::new();
        let mut theirs = Vec::new();
        let mut diffs = Vec::new();
        // Interval joins read only the other side's rows within the time range.
        let ranged = match &me.bound {
            Some(TimeBound {
                range: Some(range),
                time,
                ..
            }) if other.indexed() => Some((*range, micros(&evaluate(time, changes.rows())?)?)),
            _ => None,
        };
        for (i, diff) in changes.diffs().values().iter().enumerate() {
            let Some(key) = keys.get(i) else { continue };
            let (from, to) = match &ranged {
                Some(((from, to), times)) => {
                    let Some(t) = times[i] else { continue };
                    (t.saturating_add(*from), t.saturating_add(*to))
                }
                None => (i64::MIN, i64::MAX),
            };
            for found in other.state.probe_range(key, from, to) {
                mine.push(i as u32);
                theirs.push(parser.parse(found.row));
                diffs.push(diff * found.weight);
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
    fn evict(&mut self) -> Result<()> {
        if self.event_time.is_none() {
            return Ok(());
        }
        for side in [&mut self.left, &mut self.right] {
            let Some(bound) = &side.bound else { continue };
            let Some(watermark) = self.marks.min_of(&bound.other) else {
                continue;
            };
            side.state.expire(watermark)?;
        }
        Ok(())
    }

    /// Ends a batch or an epoch: each side settles within its memory budget.
    fn settle(&mut self) -> Result<()> {
        self.left.state.settle()?;
        self.right.state.settle()
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
                self.right.state.prepare(keys.iter())?;
                self.right.insert(&changes, &keys)?;
            }
            for changes in left {
                let keys = self.left.keys_of(changes.rows())?;
                self.right.state.prepare(keys.iter())?;
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
            self.right.state.prepare(keys.iter())?;
            out.extend(self.probe(&changes, &keys, true)?);
            self.left.state.prepare(keys.iter())?;
            self.left.insert(&changes, &keys)?;
        }
        for changes in right {
            let keys = self.right.keys_of(changes.rows())?;
            self.left.state.prepare(keys.iter())?;
            out.extend(self.probe(&changes, &keys, false)?);
            self.right.state.prepare(keys.iter())?;
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
        self.settle()
    }

    fn on_barrier(&mut self, _barrier: &Barrier, _out: &mut Output) -> Result<()> {
        self.evict()?;
        self.settle()
    }

    fn name(&self) -> String {
        "InnerJoin".to_owned()
    }

    fn spill_to(&mut self, budget: &Arc<MemoryBudget>) {
        self.left.state.spill_to(budget);
        self.right.state.spill_to(budget);
    }

    fn spilled_rows(&self) -> usize {
        self.left.state.spilled_rows() + self.right.state.spilled_rows()
    }

    fn state(&self) -> OperatorState {
        let (left, right) = (&self.left.state, &self.right.state);
        OperatorState {
            name: "InnerJoin".to_owned(),
            rows: left.len() + right.len(),
            bytes: left.size_bytes() + right.size_bytes(),
        }
    }

    fn save(
        &mut self,
        mode: crate::arrangement::SaveMode,
        out: &mut dyn checkpoint::Sink,
    ) -> Result<()> {
        for (name, side) in [(LEFT_PART, &mut self.left), (RIGHT_PART, &mut self.right)] {
            side.state.save(mode, name, out)?;
        }
        Ok(())
    }

    fn part_keys(&mut self, name: &str, batch: &RecordBatch) -> Result<Option<Vec<ArrayRef>>> {
        let side = if name == LEFT_PART {
            &self.left
        } else {
            &self.right
        };
        checkpoint::key_columns(&side.key_converter, batch, "key")
    }

    fn load(&mut self, name: &str, batch: &RecordBatch) -> Result<()> {
        match name {
            LEFT_PART => self.left.state.load(batch),
            RIGHT_PART => self.right.state.load(batch),
            _ => Err(checkpoint::unknown_part("InnerJoin", name)),
        }
    }
}
