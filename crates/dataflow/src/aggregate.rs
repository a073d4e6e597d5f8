//! Hash aggregation with retractions.
//!
//! State per group: the number of input rows, and per aggregate either a DataFusion
//! accumulator that supports retraction (count, sum, avg, variance, ...) fed with `+` rows via
//! `update_batch` and `-` rows via `retract_batch`, or — for aggregates whose retraction needs
//! the whole multiset (min, max, DISTINCT, string_agg, bool_and, ...) — a multiset of argument
//! rows from which the value is recomputed when the group changes. On `end_epoch` every changed
//! group emits `-old, +new`; a group whose count drops to zero is retracted. A global aggregate
//! (no GROUP BY) always has its one row, as in PostgreSQL (count 0, sum NULL).
//!
//! A windowed aggregate (one group key is a window bound over a watermarked stream) holds back
//! open windows under `EMIT ON WINDOW CLOSE`, and forgets a window's state — without
//! retracting its row — once the watermark passes its end plus the allowed lateness (the
//! late-row filter in front of it guarantees no row for such a window arrives).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, Int64Array, RecordBatch, UInt32Array};
use arrow::datatypes::SchemaRef;
use arrow::row::{OwnedRow, RowConverter, SortField};
use datafusion::common::ScalarValue;
use datafusion::logical_expr::Accumulator;
use eddy_common::{ChangeBatch, Error, ObjectId, Result};

use crate::{Operator, OperatorState};
use crate::event_time::EventTime;
use crate::plan::{AggregateCall, Expr, WindowClose};
use crate::rows::{arrow_error, batch, evaluate, take_columns};

/// Aggregates whose DataFusion accumulators retract exactly (not FIFO-only like min/max).
const RETRACTABLE: [&str; 9] = ["count", "sum", "avg", "mean", "var", "var_samp", "var_pop", "stddev", "stddev_pop"];

enum AggState {
    Retractable(Box<dyn Accumulator>),
    /// Argument rows (in the call's row format) with their multiplicity.
    Multiset(BTreeMap<OwnedRow, i64>),
    /// Over an append-only input nothing is ever retracted: DataFusion's plain accumulator
    /// (min/max keep one value, not a multiset).
    InsertOnly(Box<dyn Accumulator>),
}

struct Group {
    key: Vec<ScalarValue>,
    count: i64,
    states: Vec<AggState>,
    /// What this group last emitted, to retract it when it changes.
    emitted: Option<Vec<ScalarValue>>,
}

impl Group {
    /// Approximate bytes held by this group beyond its struct.
    fn size(&self) -> usize {
        let scalars = |v: &[ScalarValue]| v.iter().map(ScalarValue::size).sum::<usize>();
        let states = self
            .states
            .iter()
            .map(|s| match s {
                AggState::Retractable(a) | AggState::InsertOnly(a) => a.size(),
                AggState::Multiset(m) => m.keys().map(|r| r.as_ref().len() + std::mem::size_of::<(OwnedRow, i64)>()).sum(),
            })
            .sum::<usize>();
        scalars(&self.key) + states + self.emitted.as_deref().map_or(0, scalars)
    }
}

struct Call {
    spec: AggregateCall,
    retractable: bool,
    /// Row format of the arguments, for the multiset state.
    converter: RowConverter,
}

pub struct Aggregate {
    input: Box<dyn Operator>,
    group_exprs: Vec<Expr>,
    calls: Vec<Call>,
    schema: SchemaRef,
    key_converter: Option<RowConverter>,
    groups: crate::StateMap<OwnedRow, Group>,
    global: Option<Group>,
    dirty: HashSet<OwnedRow>,
    global_dirty: bool,
    window: Option<(WindowClose, Arc<EventTime>)>,
    /// The watermark up to which windows were last evicted.
    evicted_to: Option<i64>,
    /// The input only ever inserts (a stream through filters and projections).
    append_only: bool,
}

impl Aggregate {
    pub fn new(
        input: Box<dyn Operator>,
        input_schema: &SchemaRef,
        group_exprs: Vec<Expr>,
        aggregates: Vec<AggregateCall>,
        window: Option<(WindowClose, Arc<EventTime>)>,
        append_only: bool,
        schema: SchemaRef,
    ) -> Result<Self> {
        let mut calls = Vec::with_capacity(aggregates.len());
        for spec in aggregates {
            let name = spec.function.fun().name().to_lowercase();
            let retractable = RETRACTABLE.contains(&name.as_str())
                && !spec.function.is_distinct()
                && spec.function.order_bys().is_empty();
            let arg_fields = spec
                .function
                .expressions()
                .iter()
                .map(|e| e.return_field(input_schema).map(|f| SortField::new(f.data_type().clone())))
                .collect::<std::result::Result<Vec<_>, _>>();
            let converter = RowConverter::new(arg_fields.map_err(crate::rows::eval_error)?).map_err(arrow_error)?;
            calls.push(Call { spec, retractable, converter });
        }
        let global = group_exprs.is_empty();
        let mut op = Aggregate {
            input,
            group_exprs,
            calls,
            schema,
            key_converter: None,
            groups: crate::StateMap::default(),
            global: None,
            dirty: HashSet::new(),
            global_dirty: global,
            window,
            evicted_to: None,
            append_only,
        };
        if global {
            op.global = Some(op.new_group(Vec::new())?);
        }
        Ok(op)
    }

    fn new_group(&self, key: Vec<ScalarValue>) -> Result<Group> {
        let states = self
            .calls
            .iter()
            .map(|c| {
                Ok(if c.retractable {
                    AggState::Retractable(c.spec.function.create_sliding_accumulator().map_err(crate::rows::eval_error)?)
                } else {
                    if self.append_only {
                        AggState::InsertOnly(c.spec.function.create_accumulator().map_err(crate::rows::eval_error)?)
                    } else {
                        AggState::Multiset(BTreeMap::new())
                    }
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Group { key, count: 0, states, emitted: None })
    }

    fn absorb(&mut self, changes: &ChangeBatch) -> Result<()> {
        let rows = changes.rows();
        let diffs = changes.diffs().values();
        let keys: Vec<ArrayRef> = self.group_exprs.iter().map(|e| evaluate(e, rows)).collect::<Result<_>>()?;
        // Per call: argument arrays (with FILTER applied as a mask), and argument rows.
        let mut call_args: Vec<(Vec<ArrayRef>, Option<BooleanArray>, Option<arrow::row::Rows>)> = Vec::with_capacity(self.calls.len());
        for call in &self.calls {
            let args: Vec<ArrayRef> = call.spec.function.expressions().iter().map(|e| evaluate(e, rows)).collect::<Result<_>>()?;
            let mask = match &call.spec.filter {
                Some(f) => Some(evaluate(f, rows)?.as_boolean_opt().cloned().ok_or_else(|| Error::internal("FILTER is not boolean"))?),
                None => None,
            };
            // Multiset state keys argument rows: encode the batch once, not once per group.
            let encoded = if call.retractable || self.append_only { None } else { Some(call.converter.convert_columns(&args).map_err(arrow_error)?) };
            call_args.push((args, mask, encoded));
        }
        // Group the rows: key -> (row indices with their diffs).
        let mut by_group: Vec<(Option<OwnedRow>, Vec<(u32, i64)>)> = Vec::new();
        if self.group_exprs.is_empty() {
            by_group.push((None, diffs.iter().enumerate().map(|(i, d)| (i as u32, *d)).collect()));
        } else {
            if self.key_converter.is_none() {
                let fields = keys.iter().map(|k| SortField::new(k.data_type().clone())).collect();
                self.key_converter = Some(RowConverter::new(fields).map_err(arrow_error)?);
            }
            let converter = self.key_converter.as_ref().ok_or_else(|| Error::internal("no key converter"))?;
            let encoded = converter.convert_columns(&keys).map_err(arrow_error)?;
            let mut index: crate::StateMap<OwnedRow, usize> = crate::StateMap::default();
            for (i, d) in diffs.iter().enumerate() {
                let key = encoded.row(i).owned();
                let slot = *index.entry(key.clone()).or_insert_with(|| {
                    by_group.push((Some(key), Vec::new()));
                    by_group.len() - 1
                });
                by_group[slot].1.push((i as u32, *d));
            }
        }
        for (key, members) in by_group {
            let first = members.first().map_or(0, |m| m.0 as usize);
            let group = match &key {
                None => self.global.as_mut().ok_or_else(|| Error::internal("no global group"))?,
                Some(key) => {
                    if !self.groups.contains_key(key) {
                        let values = keys.iter().map(|k| ScalarValue::try_from_array(k, first)).collect::<std::result::Result<Vec<_>, _>>().map_err(crate::rows::eval_error)?;
                        let group = self.new_group(values)?;
                        self.groups.insert(key.clone(), group);
                    }
                    self.groups.get_mut(key).ok_or_else(|| Error::internal("group vanished"))?
                }
            };
            match &key {
                None => self.global_dirty = true,
                Some(key) => {
                    self.dirty.insert(key.clone());
                }
            }
            group.count += members.iter().map(|m| m.1).sum::<i64>();
            for (c, (args, mask, encoded)) in call_args.iter().enumerate() {
                let selected: Vec<(u32, i64)> = members
                    .iter()
                    .copied()
                    .filter(|(i, _)| mask.as_ref().is_none_or(|m| m.is_valid(*i as usize) && m.value(*i as usize)))
                    .collect();
                if selected.is_empty() {
                    continue;
                }
                match &mut group.states[c] {
                    AggState::Retractable(acc) => {
                        let (plus, minus) = expand(&selected);
                        if !plus.is_empty() {
                            acc.update_batch(&take_columns(args, &plus)?).map_err(crate::rows::eval_error)?;
                        }
                        if !minus.is_empty() {
                            acc.retract_batch(&take_columns(args, &minus)?).map_err(crate::rows::eval_error)?;
                        }
                    }
                    AggState::InsertOnly(acc) => {
                        let (plus, minus) = expand(&selected);
                        if !minus.is_empty() {
                            return Err(Error::internal("a retraction reached an aggregate over an append-only input"));
                        }
                        acc.update_batch(&take_columns(args, &plus)?).map_err(crate::rows::eval_error)?;
                    }
                    AggState::Multiset(values) => {
                        let encoded = encoded.as_ref().ok_or_else(|| Error::internal("multiset arguments not encoded"))?;
                        for (i, d) in selected {
                            let row = encoded.row(i as usize).owned();
                            let entry = values.entry(row.clone()).or_insert(0);
                            *entry += d;
                            if *entry == 0 {
                                values.remove(&row);
                            }
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// The aggregate values of a group as it is now.
    fn evaluate_group(calls: &[Call], group: &mut Group) -> Result<Vec<ScalarValue>> {
        let mut out = group.key.clone();
        for (c, call) in calls.iter().enumerate() {
            let value = match &mut group.states[c] {
                AggState::Retractable(acc) | AggState::InsertOnly(acc) => acc.evaluate().map_err(crate::rows::eval_error)?,
                AggState::Multiset(values) => {
                    let mut acc = call.spec.function.create_accumulator().map_err(crate::rows::eval_error)?;
                    if !values.is_empty() {
                        let rows: Vec<_> = values.iter().flat_map(|(r, n)| std::iter::repeat_n(r.row(), (*n).max(0) as usize)).collect();
                        let columns = call.converter.convert_rows(rows).map_err(arrow_error)?;
                        acc.update_batch(&columns).map_err(crate::rows::eval_error)?;
                    }
                    acc.evaluate().map_err(crate::rows::eval_error)?
                }
            };
            out.push(value);
        }
        Ok(out)
    }

    /// The end of a group's window, µs (windowed aggregates only).
    fn window_end(&self, key: &[ScalarValue]) -> Option<i64> {
        let (w, _) = self.window.as_ref()?;
        let micros = match key.get(w.key)? {
            ScalarValue::TimestampMicrosecond(Some(v), _) => *v,
            ScalarValue::TimestampNanosecond(Some(v), _) => v.div_euclid(1000),
            ScalarValue::TimestampMillisecond(Some(v), _) => v * 1000,
            ScalarValue::TimestampSecond(Some(v), _) => v * 1_000_000,
            _ => return None,
        };
        Some(micros.saturating_add(w.to_end_micros))
    }

    fn watermark(&self) -> Option<i64> {
        let (w, event_time) = self.window.as_ref()?;
        event_time.min_of(&w.sources)
    }

    /// Frees the state of windows the watermark has passed by more than the allowed lateness;
    /// their rows stay in the view.
    fn evict(&mut self) {
        let (Some(watermark), Some((w, _))) = (self.watermark(), self.window.as_ref()) else { return };
        if self.evicted_to == Some(watermark) {
            return;
        }
        let allowed = w.lateness.allowed_micros;
        let expired: Vec<OwnedRow> = self
            .groups
            .iter()
            .filter(|(_, g)| self.window_end(&g.key).is_some_and(|end| end.saturating_add(allowed) <= watermark))
            .map(|(k, _)| k.clone())
            .collect();
        for key in expired {
            if !self.dirty.contains(&key) {
                self.groups.remove(&key);
            }
        }
        self.evicted_to = Some(watermark);
    }

    fn emit(&mut self) -> Result<Vec<ChangeBatch>> {
        let mut rows: Vec<Vec<ScalarValue>> = Vec::new();
        let mut diffs: Vec<i64> = Vec::new();
        let mut changed: Vec<&mut Group> = Vec::new();
        let mut dirty = std::mem::take(&mut self.dirty);
        // EMIT ON WINDOW CLOSE: open windows stay dirty until the watermark closes them.
        if self.window.as_ref().is_some_and(|(w, _)| w.emit_on_close) {
            let watermark = self.watermark();
            let open: Vec<OwnedRow> = dirty
                .iter()
                .filter(|k| {
                    let Some(group) = self.groups.get(*k) else { return false };
                    match (self.window_end(&group.key), watermark) {
                        (Some(end), Some(w)) => end > w,
                        _ => true,
                    }
                })
                .cloned()
                .collect();
            for key in open {
                dirty.remove(&key);
                self.dirty.insert(key);
            }
        }
        let mut dead = Vec::new();
        for key in &dirty {
            if self.groups.get(key).is_some_and(|g| g.count == 0) {
                dead.push(key.clone());
            }
        }
        let mut removed: Vec<Group> = dead.iter().filter_map(|k| self.groups.remove(k)).collect();
        for group in &mut removed {
            if let Some(old) = group.emitted.take() {
                rows.push(old);
                diffs.push(-1);
            }
        }
        for (key, group) in self.groups.iter_mut() {
            if dirty.contains(key) {
                changed.push(group);
            }
        }
        if std::mem::take(&mut self.global_dirty)
            && let Some(g) = self.global.as_mut()
        {
            changed.push(g);
        }
        for group in changed {
            if group.count < 0 {
                return Err(Error::internal("a group's row count went negative"));
            }
            let new = Self::evaluate_group(&self.calls, group)?;
            if group.emitted.as_ref() == Some(&new) {
                continue;
            }
            if let Some(old) = group.emitted.take() {
                rows.push(old);
                diffs.push(-1);
            }
            rows.push(new.clone());
            diffs.push(1);
            group.emitted = Some(new);
        }
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let mut columns = Vec::with_capacity(self.schema.fields().len());
        for (c, field) in self.schema.fields().iter().enumerate() {
            let values = rows.iter().map(|r| r[c].clone());
            let array = ScalarValue::iter_to_array(values).map_err(crate::rows::eval_error)?;
            let array = if array.data_type() == field.data_type() {
                array
            } else {
                arrow::compute::cast(&array, field.data_type()).map_err(arrow_error)?
            };
            columns.push(array);
        }
        let out: RecordBatch = batch(&self.schema, columns)?;
        Ok(vec![ChangeBatch::new(out, Int64Array::from(diffs))])
    }
}

/// Indices repeated by their weights: inserts and retractions separately.
fn expand(members: &[(u32, i64)]) -> (UInt32Array, UInt32Array) {
    let mut plus = Vec::new();
    let mut minus = Vec::new();
    for &(i, d) in members {
        let target = if d > 0 { &mut plus } else { &mut minus };
        target.extend(std::iter::repeat_n(i, d.unsigned_abs() as usize));
    }
    (UInt32Array::from(plus), UInt32Array::from(minus))
}

impl Operator for Aggregate {
    fn push(&mut self, source: ObjectId, changes: &ChangeBatch) -> Result<Vec<ChangeBatch>> {
        for batch in self.input.push(source, changes)? {
            self.absorb(&batch)?;
        }
        Ok(Vec::new())
    }

    fn end_epoch(&mut self) -> Result<Vec<ChangeBatch>> {
        for batch in self.input.end_epoch()? {
            self.absorb(&batch)?;
        }
        let out = self.emit()?;
        self.evict();
        Ok(out)
    }

    fn state(&self) -> OperatorState {
        let rows = self.groups.len() + usize::from(self.global.is_some());
        let keyed = self.groups.iter().map(|(k, g)| k.as_ref().len() + std::mem::size_of::<(OwnedRow, Group)>() + g.size()).sum::<usize>();
        let bytes = keyed + self.global.as_ref().map_or(0, Group::size);
        OperatorState { name: "Aggregate".to_owned(), rows, bytes }
    }

    fn children(&self) -> Vec<&dyn Operator> {
        vec![self.input.as_ref()]
    }
}
