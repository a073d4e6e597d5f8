//! Hash aggregation with retractions, vectorized.
//!
//! Groups are numbered: a hash table maps each group key (in Arrow's row format) to a group id,
//! and every piece of per-group state is a vector indexed by that id. A batch of changes is
//! absorbed column by column: its keys are encoded once, each row finds its group id, and then
//! each aggregate folds its argument column into its vectors — no per-row allocation. The
//! aggregates Eddy computes natively: `count`, `sum` and `avg` over integers (exactly, in
//! 128 bits) and floats, and `min` / `max` over integers, floats, dates and timestamps (one
//! value per group over an append-only input, a counted multiset of values otherwise). Any
//! other aggregate keeps, per group, either a DataFusion accumulator that supports retraction
//! (variance, ...) or a multiset of argument rows from which its value is recomputed when the
//! group changes (DISTINCT, string_agg, bool_and, ...).
//!
//! On `end_epoch` every changed group emits `-old, +new` (what it emitted last is kept in row
//! format); a group whose row count drops to zero is retracted and its id reused. A global
//! aggregate (no GROUP BY) always has its one row, as in PostgreSQL (count 0, sum NULL).
//!
//! A windowed aggregate (one group key is a window bound over a watermarked stream) holds back
//! open windows under `EMIT ON WINDOW CLOSE`, and forgets a window's state — without
//! retracting its row — once the watermark passes its end plus the allowed lateness (the
//! late-row filter in front of it guarantees no row for such a window arrives).

use std::collections::BTreeMap;
use std::hash::BuildHasher;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Int64Array, RecordBatch, UInt32Array};
use arrow::compute::{cast, concat};
use arrow::datatypes::{DataType, SchemaRef};
use arrow::row::{RowConverter, SortField};
use datafusion::common::ScalarValue;
use eddy_common::{ChangeBatch, Error, Result};
use hashbrown::HashTable;

use crate::event_time::EventTime;
use crate::graph::{Barrier, Handler, Output};
use crate::plan::{AggregateCall, Expr, WindowClose};
use crate::rows::{arrow_error, batch_of, eval_error, take_columns};
use crate::{OperatorState, checkpoint};

use crate::aggregate_call::{Call, GroupId, Kind, Runs};

#[path = "aggregate_save.rs"]
mod save;
#[path = "aggregate_spill.rs"]
mod spill;

pub struct Aggregate {
    /// The latest mark of each stream (in-band watermarks).
    marks: crate::event_time::Marks,
    group_exprs: Vec<Expr>,
    calls: Vec<Call>,
    schema: SchemaRef,
    /// No GROUP BY: one group (id 0) that always exists.
    global: bool,
    key_converter: Option<RowConverter>,
    /// The group keys' types (the key converter's fields).
    key_types: Vec<DataType>,
    /// The output's aggregate values in row format: what each group emitted is kept encoded,
    /// to see whether it changed and to retract it. `None` without aggregates.
    value_converter: Option<RowConverter>,
    hasher: foldhash::fast::RandomState,
    /// Group key -> group id (the key bytes live in `keys`).
    table: HashTable<GroupId>,
    keys: Vec<Box<[u8]>>,
    alive: Vec<bool>,
    /// Input rows per group (net of retractions).
    counts: Vec<i64>,
    emitted: Vec<Option<Box<[u8]>>>,
    /// Windowed aggregates: each group's window end (µs), `i64::MAX` otherwise.
    window_end: Vec<i64>,
    free: Vec<GroupId>,
    live: usize,
    dirty: Vec<GroupId>,
    is_dirty: Vec<bool>,
    window: Option<(WindowClose, Arc<EventTime>)>,
    /// Groups by the watermark at which their window's state may be dropped (ids may be stale:
    /// checked when popped).
    expiry: BTreeMap<i64, Vec<GroupId>>,
    /// The watermark up to which windows were last evicted.
    evicted_to: Option<i64>,
    /// The input only ever inserts (a stream through filters and projections).
    append_only: bool,
    /// What changed since the last save, for a checkpoint of only that (`None`: the next save
    /// is whole).
    changes: Option<save::GroupChanges>,
    /// The disk tier, once the aggregate spills past a memory budget (not a global one).
    spill: Option<Box<spill::GroupSpill>>,
}

impl Aggregate {
    pub fn new(
        input_schema: &SchemaRef,
        group_exprs: Vec<Expr>,
        aggregates: Vec<AggregateCall>,
        window: Option<(WindowClose, Arc<EventTime>)>,
        append_only: bool,
        schema: SchemaRef,
    ) -> Result<Self> {
        let calls = aggregates
            .into_iter()
            .map(|spec| Call::new(spec, input_schema, append_only))
            .collect::<Result<Vec<_>>>()?;
        let value_fields: Vec<SortField> = schema
            .fields()
            .iter()
            .skip(group_exprs.len())
            .map(|f| SortField::new(f.data_type().clone()))
            .collect();
        let value_converter = if value_fields.is_empty() {
            None
        } else {
            Some(RowConverter::new(value_fields).map_err(arrow_error)?)
        };
        let global = group_exprs.is_empty();
        let key_types = group_exprs
            .iter()
            .map(|e| e.data_type(input_schema))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(eval_error)?;
        let mut op = Aggregate {
            marks: crate::event_time::Marks::default(),
            group_exprs,
            calls,
            schema,
            global,
            key_converter: None,
            key_types,
            value_converter,
            hasher: foldhash::fast::RandomState::default(),
            table: HashTable::new(),
            keys: Vec::new(),
            alive: Vec::new(),
            counts: Vec::new(),
            emitted: Vec::new(),
            window_end: Vec::new(),
            free: Vec::new(),
            live: 0,
            dirty: Vec::new(),
            is_dirty: Vec::new(),
            window,
            expiry: BTreeMap::new(),
            evicted_to: None,
            append_only,
            changes: None,
            spill: None,
        };
        if global {
            // The global group's row exists before any input: emitted at the first epoch.
            let g = op.new_group(Box::default(), i64::MAX)?;
            op.mark_dirty(g);
        }
        Ok(op)
    }

    fn new_group(&mut self, key: Box<[u8]>, window_end: i64) -> Result<GroupId> {
        let g = match self.free.pop() {
            Some(g) => g,
            None => {
                let g = GroupId::try_from(self.keys.len())
                    .map_err(|_| Error::internal("more than 2^32 groups"))?;
                self.keys.push(Box::default());
                self.alive.push(false);
                self.counts.push(0);
                self.emitted.push(None);
                self.window_end.push(i64::MAX);
                self.is_dirty.push(false);
                g
            }
        };
        let at = g as usize;
        self.keys[at] = key;
        self.alive[at] = true;
        self.counts[at] = 0;
        self.emitted[at] = None;
        self.window_end[at] = window_end;
        for call in &mut self.calls {
            call.reset(g, true, self.append_only)?;
        }
        if let Some((w, _)) = &self.window
            && window_end != i64::MAX
        {
            self.expiry
                .entry(window_end.saturating_add(w.lateness.allowed_micros))
                .or_default()
                .push(g);
        }
        self.live += 1;
        self.measure(g);
        Ok(g)
    }

    fn free_group(&mut self, g: GroupId) -> Result<()> {
        if !self.alive[g as usize] {
            return Ok(());
        }
        self.note_removed(g);
        self.unload(g)
    }

    /// Takes live group `g` out of memory (freed, or spilled).
    fn unload(&mut self, g: GroupId) -> Result<()> {
        let at = g as usize;
        self.forget(g);
        let hash = self.hasher.hash_one(&*self.keys[at]);
        if let Ok(entry) = self.table.find_entry(hash, |&x| x == g) {
            entry.remove();
        }
        self.keys[at] = Box::default();
        self.alive[at] = false;
        self.emitted[at] = None;
        for call in &mut self.calls {
            call.reset(g, false, self.append_only)?;
        }
        self.free.push(g);
        self.live -= 1;
        Ok(())
    }

    fn mark_dirty(&mut self, g: GroupId) {
        let flag = &mut self.is_dirty[g as usize];
        if !*flag {
            *flag = true;
            self.dirty.push(g);
        }
    }

    /// The window end (µs) of the group key at row `i` of `keys`.
    fn window_end_of(&self, keys: &[ArrayRef], i: usize) -> Result<i64> {
        let Some((w, _)) = &self.window else {
            return Ok(i64::MAX);
        };
        let Some(column) = keys.get(w.key) else {
            return Ok(i64::MAX);
        };
        let micros = match ScalarValue::try_from_array(column, i).map_err(eval_error)? {
            ScalarValue::TimestampMicrosecond(Some(v), _) => v,
            ScalarValue::TimestampNanosecond(Some(v), _) => v.div_euclid(1000),
            ScalarValue::TimestampMillisecond(Some(v), _) => v * 1000,
            ScalarValue::TimestampSecond(Some(v), _) => v * 1_000_000,
            _ => return Ok(i64::MAX),
        };
        Ok(micros.saturating_add(w.to_end_micros))
    }

    /// Each row's group id, creating the groups not seen before.
    fn assign_groups(&mut self, rows: &arrow::array::RecordBatch) -> Result<Vec<GroupId>> {
        if self.global {
            return Ok(vec![0; rows.num_rows()]);
        }
        let keys = crate::rows::evaluate_keys(&self.group_exprs, rows)?;
        let converter = self.key_converter()?;
        let encoded = converter.convert_columns(&keys).map_err(arrow_error)?;
        self.recall(encoded.iter().map(|row| row.data()))?;
        let mut ids = Vec::with_capacity(rows.num_rows());
        for (i, row) in encoded.iter().enumerate() {
            let bytes: &[u8] = row.as_ref();
            let hash = self.hasher.hash_one(bytes);
            let found = self
                .table
                .find(hash, |&g| &*self.keys[g as usize] == bytes)
                .copied();
            let g = match found {
                Some(g) => g,
                None => {
                    let end = self.window_end_of(&keys, i)?;
                    let g = self.new_group(bytes.into(), end)?;
                    let (keys, hasher) = (&self.keys, &self.hasher);
                    self.table
                        .insert_unique(hash, g, |&x| hasher.hash_one(&*keys[x as usize]));
                    g
                }
            };
            self.touch(g);
            ids.push(g);
        }
        Ok(ids)
    }

    /// The group keys' row format (made on first use: most aggregates are never restored).
    fn key_converter(&mut self) -> Result<&RowConverter> {
        if self.key_converter.is_none() {
            let fields = self
                .key_types
                .iter()
                .map(|t| SortField::new(t.clone()))
                .collect();
            self.key_converter = Some(RowConverter::new(fields).map_err(arrow_error)?);
        }
        self.key_converter
            .as_ref()
            .ok_or_else(|| Error::internal("no key converter"))
    }

    fn absorb(&mut self, changes: &ChangeBatch) -> Result<()> {
        if changes.is_empty() {
            return Ok(());
        }
        let rows = changes.rows();
        let diffs = changes.diffs().values();
        let ids = self.assign_groups(rows)?;
        for (&g, &d) in ids.iter().zip(diffs.iter()) {
            self.counts[g as usize] += d;
            self.mark_dirty(g);
        }
        let runs = self
            .calls
            .iter()
            .any(|c| matches!(c.kind, Kind::Generic))
            .then(|| Runs::of(&ids));
        for call in &mut self.calls {
            call.absorb(rows, &ids, diffs, runs.as_ref())?;
        }
        Ok(())
    }

    fn watermark(&self) -> Option<i64> {
        let (w, _) = self.window.as_ref()?;
        self.marks.min_of(&w.sources)
    }

    /// Frees the state of windows the watermark has passed by more than the allowed lateness;
    /// their rows stay in the view.
    fn evict(&mut self) -> Result<()> {
        let (Some(watermark), Some((w, _))) = (self.watermark(), self.window.as_ref()) else {
            return Ok(());
        };
        if self.evicted_to == Some(watermark) {
            return Ok(());
        }
        let allowed = w.lateness.allowed_micros;
        let mut held = Vec::new();
        while let Some(entry) = self.expiry.first_entry() {
            if *entry.key() > watermark {
                break;
            }
            for g in entry.remove() {
                let at = g as usize;
                if !self.alive[at] || self.window_end[at].saturating_add(allowed) > watermark {
                    continue; // a stale id, reused by a later window
                }
                if self.is_dirty[at] {
                    held.push(g);
                } else {
                    self.free_group(g)?;
                }
            }
        }
        if !held.is_empty() {
            self.expiry.insert(watermark, held);
        }
        self.evicted_to = Some(watermark);
        self.expire_spilled(watermark)
    }

    /// The group key columns of `groups`, as the output's types.
    fn key_columns(&self, groups: &[GroupId]) -> Result<Vec<ArrayRef>> {
        if self.global {
            return Ok(Vec::new());
        }
        let converter = self
            .key_converter
            .as_ref()
            .ok_or_else(|| Error::internal("no key converter"))?;
        let parser = converter.parser();
        let columns = converter
            .convert_rows(groups.iter().map(|&g| parser.parse(&self.keys[g as usize])))
            .map_err(arrow_error)?;
        columns
            .iter()
            .zip(self.schema.fields().iter())
            .map(|(c, f)| cast_to(c, f.data_type()))
            .collect()
    }

    fn emit(&mut self) -> Result<Vec<ChangeBatch>> {
        let mut dirty = std::mem::take(&mut self.dirty);
        for &g in &dirty {
            self.is_dirty[g as usize] = false;
            self.note_changed(g);
        }
        // EMIT ON WINDOW CLOSE: open windows stay dirty until the watermark closes them.
        if self.window.as_ref().is_some_and(|(w, _)| w.emit_on_close) {
            let watermark = self.watermark();
            let (open, closed): (Vec<GroupId>, Vec<GroupId>) = dirty.into_iter().partition(|&g| {
                let end = self.window_end[g as usize];
                end == i64::MAX || watermark.is_none_or(|w| end > w)
            });
            for g in open {
                self.mark_dirty(g);
            }
            dirty = closed;
        }
        let (mut dead, mut live) = (Vec::new(), Vec::new());
        for g in dirty {
            let at = g as usize;
            if !self.alive[at] {
                continue;
            }
            match self.counts[at] {
                n if n < 0 => return Err(Error::internal("a group's row count went negative")),
                0 if !self.global => dead.push(g),
                _ => live.push(g),
            }
        }
        let values = self
            .calls
            .iter_mut()
            .zip(self.schema.fields().iter().skip(self.group_exprs.len()))
            .map(|(call, field)| cast_to(&call.evaluate(&live)?, field.data_type()))
            .collect::<Result<Vec<_>>>()?;
        let encoded = match &self.value_converter {
            Some(converter) => Some(converter.convert_columns(&values).map_err(arrow_error)?),
            None => None,
        };
        let mut retract: Vec<GroupId> = dead
            .iter()
            .copied()
            .filter(|&g| self.emitted[g as usize].is_some())
            .collect();
        let mut insert: Vec<GroupId> = Vec::new();
        let mut insert_at: Vec<u32> = Vec::new();
        for (j, &g) in live.iter().enumerate() {
            let new: &[u8] = encoded.as_ref().map_or(&[], |e| e.row(j).data());
            match self.emitted[g as usize].as_deref() {
                Some(old) if old == new => continue,
                Some(_) => retract.push(g),
                None => {}
            }
            insert.push(g);
            insert_at.push(j as u32);
        }
        let changed = retract.len() + insert.len();
        let out = if changed == 0 {
            Vec::new()
        } else {
            let mut old = self.key_columns(&retract)?;
            let mut new = self.key_columns(&insert)?;
            if let Some(converter) = &self.value_converter {
                let parser = converter.parser();
                let rows = retract.iter().map(|&g| {
                    parser.parse(self.emitted[g as usize].as_deref().unwrap_or_default())
                });
                old.extend(converter.convert_rows(rows).map_err(arrow_error)?);
                new.extend(take_columns(
                    &values,
                    &UInt32Array::from(insert_at.clone()),
                )?);
            }
            let columns = old
                .iter()
                .zip(&new)
                .map(|(a, b)| concat(&[a.as_ref(), b.as_ref()]).map_err(arrow_error))
                .collect::<Result<Vec<_>>>()?;
            let diffs: Int64Array = std::iter::repeat_n(-1, retract.len())
                .chain(std::iter::repeat_n(1, insert.len()))
                .collect();
            vec![ChangeBatch::new(
                batch_of(&self.schema, columns, changed)?,
                diffs,
            )]
        };
        for (&g, &j) in insert.iter().zip(&insert_at) {
            self.emitted[g as usize] = Some(
                encoded
                    .as_ref()
                    .map_or(&[][..], |e| e.row(j as usize).data())
                    .into(),
            );
        }
        for &g in &live {
            self.measure(g);
        }
        for g in dead {
            self.free_group(g)?;
        }
        Ok(out)
    }
}

fn cast_to(array: &ArrayRef, t: &DataType) -> Result<ArrayRef> {
    if array.data_type() == t {
        Ok(Arc::clone(array))
    } else {
        cast(array, t).map_err(arrow_error)
    }
}

impl Handler for Aggregate {
    crate::event_time::keeps_marks!();

    fn on_data(&mut self, _input: usize, changes: ChangeBatch, _out: &mut Output) -> Result<()> {
        self.absorb(&changes)?;
        self.settle(false)
    }

    fn on_barrier(&mut self, _barrier: &Barrier, out: &mut Output) -> Result<()> {
        for changes in self.emit()? {
            out.data(changes);
        }
        self.evict()?;
        self.settle(true)
    }

    fn name(&self) -> String {
        "Aggregate".to_owned()
    }

    fn state_rows(&self) -> usize {
        self.live + self.spilled_groups()
    }

    fn state(&self) -> OperatorState {
        let bytes = (0..self.keys.len() as GroupId)
            .filter(|&g| self.alive[g as usize])
            .map(|g| self.group_bytes(g))
            .sum();
        OperatorState {
            name: "Aggregate".to_owned(),
            rows: self.state_rows(),
            bytes,
        }
    }

    fn spill_to(&mut self, budget: &Arc<crate::spill::MemoryBudget>) {
        if !self.global {
            self.spill = Some(Box::new(spill::GroupSpill::new(budget)));
        }
    }

    fn spilled_rows(&self) -> usize {
        self.spilled_groups()
    }

    fn save(
        &mut self,
        mode: crate::arrangement::SaveMode,
        out: &mut dyn checkpoint::Sink,
    ) -> Result<()> {
        self.save_state(mode, out)
    }

    fn part_keys(&mut self, _name: &str, batch: &RecordBatch) -> Result<Option<Vec<ArrayRef>>> {
        checkpoint::key_columns(self.key_converter()?, batch, "key")
    }

    fn load(&mut self, name: &str, batch: &RecordBatch) -> Result<()> {
        self.load_state(name, batch)
    }
}
