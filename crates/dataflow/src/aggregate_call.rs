//! One aggregate call of a [`crate::aggregate::Aggregate`], for every group: its kind
//! (native count / sum / avg / min / max, or DataFusion's accumulator or a multiset of argument
//! rows), its per-group state in vectors indexed by group id, how a batch is folded into it,
//! how it is evaluated, and how its state is saved to a checkpoint and loaded back.
//! Invariant: a call's state holds exactly what the rows absorbed so far (with their weights)
//! determine — a retraction undoes its insert, whatever the order.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, Decimal128Array, Float64Array, Int64Array, RecordBatch,
    UInt32Array,
};
use arrow::compute::{can_cast_types, cast};
use arrow::datatypes::{DataType, Decimal128Type, Float64Type, Int64Type, SchemaRef};
use arrow::row::{OwnedRow, RowConverter, Rows, SortField};
use datafusion::common::ScalarValue;
use datafusion::logical_expr::Accumulator;
use eddy_common::{Error, Result};

use crate::checkpoint;
use crate::exact_sum::ExactFloatSum;
use crate::plan::{AggregateCall, Expr};
use crate::rows::{arrow_error, eval_error, evaluate, take_columns};
/// Index of a group's slot in every per-group vector; ids of dropped groups are reused.
pub(crate) type GroupId = u32;

#[path = "aggregate_call_save.rs"]
mod save;

/// Aggregates whose DataFusion accumulators retract exactly (not FIFO-only like min/max):
/// count, and sum / avg of integers and decimals (the native kinds take the rest). Variances
/// are not among them: their sliding accumulators retract in floating point, which drifts from
/// the value recomputed over the rows left; they recompute from a multiset instead.
const RETRACTABLE: [&str; 4] = ["count", "sum", "avg", "mean"];

/// What an aggregate's accumulator is fed per row: its arguments, then the expressions of its
/// `ORDER BY` (DataFusion's order-sensitive accumulators — `array_agg`, `string_agg`,
/// `first_value`, the `DISTINCT ON` rewrite — sort by those columns themselves, as they do in
/// its `AggregateExec`).
pub(crate) fn arguments(spec: &AggregateCall) -> Vec<Expr> {
    let f = &spec.function;
    let mut exprs = f.expressions();
    exprs.extend(f.order_bys().iter().map(|s| Arc::clone(&s.expr)));
    exprs
}

/// How a native `min` / `max` maps its argument to an `i64` with the same order.
#[derive(Clone, Copy)]
pub(crate) enum Ordered {
    /// Integers, dates and timestamps: their value.
    Int,
    /// Floats: their bits, arranged so that integer order is `f64::total_cmp` order.
    Float,
}

impl Ordered {
    pub(crate) fn of(t: &DataType) -> Option<Ordered> {
        use DataType::*;
        match t {
            Int8
            | Int16
            | Int32
            | Int64
            | UInt8
            | UInt16
            | UInt32
            | Date32
            | Date64
            | Timestamp(_, _) => Some(Ordered::Int),
            Float32 | Float64 => Some(Ordered::Float),
            _ => None,
        }
    }

    /// Flips the bits below the sign of negative floats: an involution.
    pub(crate) fn flip(bits: i64) -> i64 {
        bits ^ ((((bits >> 63) as u64) >> 1) as i64)
    }

    pub(crate) fn encode(self, array: &ArrayRef) -> Result<Int64Array> {
        Ok(match self {
            Ordered::Int => cast(array, &DataType::Int64)
                .map_err(arrow_error)?
                .as_primitive::<Int64Type>()
                .clone(),
            Ordered::Float => {
                let floats = cast(array, &DataType::Float64).map_err(arrow_error)?;
                // Every NaN is one value, above every number (PostgreSQL's order).
                floats
                    .as_primitive::<Float64Type>()
                    .unary(|f| Self::flip(if f.is_nan() { f64::NAN } else { f }.to_bits() as i64))
            }
        })
    }

    pub(crate) fn decode(self, values: Int64Array, output: &DataType) -> Result<ArrayRef> {
        let array: ArrayRef = match self {
            Ordered::Int => Arc::new(values),
            Ordered::Float => {
                Arc::new(values.unary::<_, Float64Type>(|v| f64::from_bits(Self::flip(v) as u64)))
            }
        };
        cast(&array, output).map_err(arrow_error)
    }
}

/// What Eddy computes natively, and the rest.
#[derive(Clone, Copy)]
pub(crate) enum Kind {
    /// `count(*)`, `count(x)`: rows (with a non-NULL argument).
    Count,
    /// `sum` / `avg` of integers, exact in 128 bits.
    IntSum { avg: bool },
    /// `sum` / `avg` of floats.
    FloatSum { avg: bool },
    /// `sum` / `avg` of numerics (and of integers, which `avg` takes as numerics), exact in
    /// 128 bits; an average is `shift` decimal places finer than its argument, rounded half
    /// away from zero.
    DecimalSum { avg: bool, shift: u32 },
    /// `min` / `max`.
    Extreme { max: bool, ordered: Ordered },
    /// DataFusion's accumulator per group, or a multiset of argument rows.
    Generic,
}

impl Kind {
    pub(crate) fn of(spec: &AggregateCall, input: &SchemaRef) -> Kind {
        let f = &spec.function;
        if f.is_distinct() || !f.order_bys().is_empty() {
            return Kind::Generic;
        }
        let output = f.field().data_type().clone();
        let args = f.expressions();
        let arg = match args.as_slice() {
            [] => None,
            [a] => match a.data_type(input) {
                Ok(t) => Some(t),
                Err(_) => return Kind::Generic,
            },
            _ => return Kind::Generic,
        };
        let signed = |t: &DataType| {
            matches!(
                t,
                DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64
            )
        };
        let integer = |t: &DataType| {
            signed(t) || matches!(t, DataType::UInt8 | DataType::UInt16 | DataType::UInt32)
        };
        let float = |t: &DataType| matches!(t, DataType::Float32 | DataType::Float64);
        match (f.fun().name().to_lowercase().as_str(), arg) {
            ("count", _) if output == DataType::Int64 => Kind::Count,
            ("sum", Some(t)) if signed(&t) && output == DataType::Int64 => {
                Kind::IntSum { avg: false }
            }
            ("sum", Some(t)) if float(&t) && output == DataType::Float64 => {
                Kind::FloatSum { avg: false }
            }
            ("avg" | "mean", Some(t)) if integer(&t) && output == DataType::Float64 => {
                Kind::IntSum { avg: true }
            }
            ("avg" | "mean", Some(t)) if float(&t) && output == DataType::Float64 => {
                Kind::FloatSum { avg: true }
            }
            ("sum", Some(DataType::Decimal128(_, s))) if matches!(output, DataType::Decimal128(_, out) if out == s) => {
                Kind::DecimalSum {
                    avg: false,
                    shift: 0,
                }
            }
            ("avg" | "mean", Some(DataType::Decimal128(_, s))) => match output {
                DataType::Decimal128(_, out) if out >= s => Kind::DecimalSum {
                    avg: true,
                    shift: (out - s) as u32,
                },
                _ => Kind::Generic,
            },
            (name @ ("min" | "max"), Some(t)) if t == output => match Ordered::of(&t) {
                Some(ordered)
                    if can_cast_types(&t, &DataType::Int64)
                        && can_cast_types(&DataType::Int64, &t) =>
                {
                    Kind::Extreme {
                        max: name == "max",
                        ordered,
                    }
                }
                _ => Kind::Generic,
            },
            _ => Kind::Generic,
        }
    }
}

/// Per-group state of an aggregate the native kinds do not cover.
pub(crate) enum AggState {
    Retractable(Box<dyn Accumulator>),
    /// Argument rows (in the call's row format) with their multiplicity.
    Multiset(BTreeMap<OwnedRow, i64>),
    /// Over an append-only input nothing is ever retracted: DataFusion's plain accumulator.
    InsertOnly(Box<dyn Accumulator>),
}

/// One aggregate's state for every group, indexed by group id.
pub(crate) enum CallState {
    Count(Vec<i64>),
    /// Sum and number of non-NULL values.
    IntSum(Vec<i128>, Vec<i64>),
    FloatSum(Vec<f64>, Vec<i64>),
    /// Sums of floats that rows can be retracted from: exact, rounded when read.
    ExactFloatSum(Vec<ExactFloatSum>, Vec<i64>),
    /// The extreme so far, over an append-only input.
    Extreme(Vec<Option<i64>>),
    /// Every value with its multiplicity, when values can be retracted.
    ExtremeSet(Vec<BTreeMap<i64, i64>>),
    Generic(Vec<Option<AggState>>),
}

/// The rows of a batch ordered by group id, and each group's run in that order.
pub(crate) struct Runs {
    pub(crate) order: Vec<u32>,
    pub(crate) runs: Vec<(GroupId, Range<usize>)>,
}

impl Runs {
    pub(crate) fn of(ids: &[GroupId]) -> Runs {
        let mut order: Vec<u32> = (0..ids.len() as u32).collect();
        order.sort_by_key(|&i| ids[i as usize]);
        let mut runs: Vec<(GroupId, Range<usize>)> = Vec::new();
        for (at, &i) in order.iter().enumerate() {
            let g = ids[i as usize];
            match runs.last_mut() {
                Some((last, range)) if *last == g => range.end = at + 1,
                _ => runs.push((g, at..at + 1)),
            }
        }
        Runs { order, runs }
    }
}

pub(crate) struct Call {
    pub(crate) spec: AggregateCall,
    pub(crate) kind: Kind,
    /// Generic only: DataFusion's accumulator retracts exactly.
    pub(crate) retractable: bool,
    /// Row format of the arguments, for the generic multiset state.
    pub(crate) converter: RowConverter,
    pub(crate) output: DataType,
    /// Over an append-only input: generic aggregates keep DataFusion's plain accumulator.
    pub(crate) append_only: bool,
    pub(crate) state: CallState,
}

impl Call {
    pub(crate) fn new(spec: AggregateCall, input: &SchemaRef, append_only: bool) -> Result<Call> {
        let name = spec.function.fun().name().to_lowercase();
        let retractable = RETRACTABLE.contains(&name.as_str())
            && !spec.function.is_distinct()
            && spec.function.order_bys().is_empty();
        let arg_fields = arguments(&spec)
            .iter()
            .map(|e| {
                e.return_field(input)
                    .map(|f| SortField::new(f.data_type().clone()))
            })
            .collect::<std::result::Result<Vec<_>, _>>();
        let converter = RowConverter::new(arg_fields.map_err(eval_error)?).map_err(arrow_error)?;
        let kind = Kind::of(&spec, input);
        let state = match kind {
            Kind::Count => CallState::Count(Vec::new()),
            Kind::IntSum { .. } | Kind::DecimalSum { .. } => {
                CallState::IntSum(Vec::new(), Vec::new())
            }
            Kind::FloatSum { .. } if append_only => CallState::FloatSum(Vec::new(), Vec::new()),
            Kind::FloatSum { .. } => CallState::ExactFloatSum(Vec::new(), Vec::new()),
            Kind::Extreme { .. } if append_only => CallState::Extreme(Vec::new()),
            Kind::Extreme { .. } => CallState::ExtremeSet(Vec::new()),
            Kind::Generic => CallState::Generic(Vec::new()),
        };
        let output = spec.function.field().data_type().clone();
        Ok(Call {
            spec,
            kind,
            retractable,
            converter,
            output,
            append_only,
            state,
        })
    }

    /// Empties the slot of group `g` (growing the vectors to hold it); `fresh` gives a generic
    /// aggregate a new accumulator, otherwise its slot only frees its memory.
    pub(crate) fn reset(&mut self, g: GroupId, fresh: bool, append_only: bool) -> Result<()> {
        let g = g as usize;
        fn slot<T: Default>(v: &mut Vec<T>, g: usize) -> &mut T {
            if v.len() <= g {
                v.resize_with(g + 1, T::default);
            }
            &mut v[g]
        }
        match &mut self.state {
            CallState::Count(counts) => *slot(counts, g) = 0,
            CallState::IntSum(sums, counts) => {
                *slot(sums, g) = 0;
                *slot(counts, g) = 0;
            }
            CallState::FloatSum(sums, counts) => {
                *slot(sums, g) = 0.0;
                *slot(counts, g) = 0;
            }
            CallState::ExactFloatSum(sums, counts) => {
                *slot(sums, g) = ExactFloatSum::default();
                *slot(counts, g) = 0;
            }
            CallState::Extreme(values) => *slot(values, g) = None,
            CallState::ExtremeSet(sets) => *slot(sets, g) = BTreeMap::new(),
            CallState::Generic(states) => {
                let f = &self.spec.function;
                *slot(states, g) = match fresh {
                    false => None,
                    true if self.retractable => Some(AggState::Retractable(
                        f.create_sliding_accumulator().map_err(eval_error)?,
                    )),
                    true if append_only => Some(AggState::InsertOnly(
                        f.create_accumulator().map_err(eval_error)?,
                    )),
                    true => Some(AggState::Multiset(BTreeMap::new())),
                };
            }
        }
        Ok(())
    }

    /// Folds a batch into the groups: row `i` belongs to group `ids[i]` with weight `diffs[i]`.
    pub(crate) fn absorb(
        &mut self,
        rows: &arrow::array::RecordBatch,
        ids: &[GroupId],
        diffs: &[i64],
        runs: Option<&Runs>,
    ) -> Result<()> {
        let args: Vec<ArrayRef> = arguments(&self.spec)
            .iter()
            .map(|e| evaluate(e, rows))
            .collect::<Result<_>>()?;
        let mask: Option<BooleanArray> = match &self.spec.filter {
            Some(f) => Some(
                evaluate(f, rows)?
                    .as_boolean_opt()
                    .cloned()
                    .ok_or_else(|| Error::internal("FILTER is not boolean"))?,
            ),
            None => None,
        };
        // A row counts when FILTER passes and (for the native kinds) its argument is not NULL.
        let passes = |i: usize| {
            mask.as_ref().is_none_or(|m| m.is_valid(i) && m.value(i))
                && args.first().is_none_or(|a| a.is_valid(i))
        };
        let rows_of = ids.iter().zip(diffs).enumerate();
        match (&mut self.state, self.kind) {
            (CallState::Count(counts), _) => {
                for (i, (&g, &d)) in rows_of {
                    if passes(i) {
                        counts[g as usize] += d;
                    }
                }
            }
            (CallState::IntSum(sums, counts), Kind::DecimalSum { .. }) => {
                let values = args[0]
                    .as_primitive_opt::<Decimal128Type>()
                    .ok_or_else(|| {
                        Error::internal("a numeric sum over a column that is not numeric")
                    })?
                    .values();
                let overflow = || {
                    Error::new(
                        eddy_common::SqlState::NUMERIC_VALUE_OUT_OF_RANGE,
                        "numeric field overflow in a sum",
                    )
                };
                for (i, (&g, &d)) in rows_of {
                    if passes(i) {
                        let term = values[i].checked_mul(i128::from(d)).ok_or_else(overflow)?;
                        sums[g as usize] =
                            sums[g as usize].checked_add(term).ok_or_else(overflow)?;
                        counts[g as usize] += d;
                    }
                }
            }
            (CallState::IntSum(sums, counts), _) => {
                let values = cast(&args[0], &DataType::Int64).map_err(arrow_error)?;
                let values = values.as_primitive::<Int64Type>().values();
                for (i, (&g, &d)) in rows_of {
                    if passes(i) {
                        sums[g as usize] += i128::from(values[i]) * i128::from(d);
                        counts[g as usize] += d;
                    }
                }
            }
            (CallState::FloatSum(sums, counts), _) => {
                let values = cast(&args[0], &DataType::Float64).map_err(arrow_error)?;
                let values = values.as_primitive::<Float64Type>().values();
                for (i, (&g, &d)) in rows_of {
                    if passes(i) {
                        sums[g as usize] += values[i] * d as f64;
                        counts[g as usize] += d;
                    }
                }
            }
            (CallState::ExactFloatSum(sums, counts), _) => {
                let values = cast(&args[0], &DataType::Float64).map_err(arrow_error)?;
                let values = values.as_primitive::<Float64Type>().values();
                for (i, (&g, &d)) in rows_of {
                    if passes(i) {
                        sums[g as usize].add(values[i], d);
                        counts[g as usize] += d;
                    }
                }
            }
            (CallState::Extreme(extremes), Kind::Extreme { max, ordered }) => {
                let values = ordered.encode(&args[0])?;
                let values = values.values();
                for (i, (&g, &d)) in rows_of {
                    if !passes(i) {
                        continue;
                    }
                    if d < 0 {
                        return Err(Error::internal(
                            "a retraction reached an aggregate over an append-only input",
                        ));
                    }
                    let v = values[i];
                    let slot = &mut extremes[g as usize];
                    *slot = Some(match *slot {
                        None => v,
                        Some(x) if max => x.max(v),
                        Some(x) => x.min(v),
                    });
                }
            }
            (CallState::ExtremeSet(sets), Kind::Extreme { ordered, .. }) => {
                let values = ordered.encode(&args[0])?;
                let values = values.values();
                for (i, (&g, &d)) in rows_of {
                    if !passes(i) {
                        continue;
                    }
                    let set = &mut sets[g as usize];
                    let n = set.entry(values[i]).or_insert(0);
                    *n += d;
                    if *n == 0 {
                        set.remove(&values[i]);
                    }
                }
            }
            (CallState::Generic(states), _) => {
                let runs =
                    runs.ok_or_else(|| Error::internal("generic aggregate without group runs"))?;
                Self::absorb_generic(states, &self.converter, &args, mask.as_ref(), diffs, runs)?;
            }
            _ => return Err(Error::internal("aggregate state does not match its kind")),
        }
        Ok(())
    }

    pub(crate) fn absorb_generic(
        states: &mut [Option<AggState>],
        converter: &RowConverter,
        args: &[ArrayRef],
        mask: Option<&BooleanArray>,
        diffs: &[i64],
        runs: &Runs,
    ) -> Result<()> {
        // Multiset state keys argument rows: encode the batch once, not once per group.
        let mut encoded: Option<Rows> = None;
        for (g, range) in &runs.runs {
            let selected: Vec<(u32, i64)> = runs.order[range.clone()]
                .iter()
                .filter(|&&i| mask.is_none_or(|m| m.is_valid(i as usize) && m.value(i as usize)))
                .map(|&i| (i, diffs[i as usize]))
                .collect();
            if selected.is_empty() {
                continue;
            }
            let state = states
                .get_mut(*g as usize)
                .and_then(Option::as_mut)
                .ok_or_else(|| Error::internal("a group without its aggregate state"))?;
            match state {
                AggState::Retractable(acc) => {
                    let (plus, minus) = expand(&selected);
                    if !plus.is_empty() {
                        acc.update_batch(&take_columns(args, &plus)?)
                            .map_err(eval_error)?;
                    }
                    if !minus.is_empty() {
                        acc.retract_batch(&take_columns(args, &minus)?)
                            .map_err(eval_error)?;
                    }
                }
                AggState::InsertOnly(acc) => {
                    let (plus, minus) = expand(&selected);
                    if !minus.is_empty() {
                        return Err(Error::internal(
                            "a retraction reached an aggregate over an append-only input",
                        ));
                    }
                    acc.update_batch(&take_columns(args, &plus)?)
                        .map_err(eval_error)?;
                }
                AggState::Multiset(values) => {
                    if encoded.is_none() {
                        encoded = Some(converter.convert_columns(args).map_err(arrow_error)?);
                    }
                    let encoded = encoded
                        .as_ref()
                        .ok_or_else(|| Error::internal("multiset arguments not encoded"))?;
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
        Ok(())
    }

    /// The aggregate's current value for each of `groups`, as the output type.
    pub(crate) fn evaluate(&mut self, groups: &[GroupId]) -> Result<ArrayRef> {
        let at = |g: &GroupId| *g as usize;
        let array: ArrayRef = match (&mut self.state, self.kind) {
            (CallState::Count(counts), _) => Arc::new(Int64Array::from_iter_values(
                groups.iter().map(|g| counts[at(g)]),
            )),
            (CallState::IntSum(sums, counts), Kind::DecimalSum { avg, shift }) => {
                let DataType::Decimal128(precision, scale) = self.output else {
                    return Err(Error::internal("a numeric sum with another output type"));
                };
                let value = |g: &GroupId| match counts[at(g)] {
                    n if n <= 0 => Ok(None),
                    n if avg => crate::decimal::average(sums[at(g)], n, shift)
                        .map(Some)
                        .ok_or(()),
                    _ => Ok(Some(sums[at(g)])),
                };
                let values = groups
                    .iter()
                    .map(value)
                    .collect::<std::result::Result<Decimal128Array, ()>>();
                let overflow = || {
                    Error::new(
                        eddy_common::SqlState::NUMERIC_VALUE_OUT_OF_RANGE,
                        format!(
                            "numeric field overflow: the {} does not fit numeric({precision},{scale})",
                            if avg { "average" } else { "sum" }
                        ),
                    )
                };
                let values = values
                    .map_err(|()| overflow())?
                    .with_precision_and_scale(precision, scale)
                    .map_err(arrow_error)?;
                values
                    .validate_decimal_precision(precision)
                    .map_err(|_| overflow())?;
                Arc::new(values)
            }
            (CallState::IntSum(sums, counts), Kind::IntSum { avg }) => {
                if avg {
                    let values = groups.iter().map(|g| {
                        (counts[at(g)] > 0).then(|| sums[at(g)] as f64 / counts[at(g)] as f64)
                    });
                    Arc::new(Float64Array::from_iter(values))
                } else {
                    // Wraps like DataFusion's sum of Int64.
                    Arc::new(Int64Array::from_iter(
                        groups
                            .iter()
                            .map(|g| (counts[at(g)] > 0).then(|| sums[at(g)] as i64)),
                    ))
                }
            }
            (CallState::FloatSum(sums, counts), Kind::FloatSum { avg }) => {
                let values = groups.iter().map(|g| {
                    (counts[at(g)] > 0).then(|| {
                        if avg {
                            sums[at(g)] / counts[at(g)] as f64
                        } else {
                            sums[at(g)]
                        }
                    })
                });
                Arc::new(Float64Array::from_iter(values))
            }
            (CallState::ExactFloatSum(sums, counts), Kind::FloatSum { avg }) => {
                let values = groups.iter().map(|g| {
                    let (sum, n) = (sums[at(g)].value(), counts[at(g)]);
                    (n > 0).then(|| if avg { sum / n as f64 } else { sum })
                });
                Arc::new(Float64Array::from_iter(values))
            }
            (CallState::Extreme(extremes), Kind::Extreme { ordered, .. }) => ordered.decode(
                Int64Array::from_iter(groups.iter().map(|g| extremes[at(g)])),
                &self.output,
            )?,
            (CallState::ExtremeSet(sets), Kind::Extreme { ordered, max }) => {
                let value = |set: &BTreeMap<i64, i64>| {
                    if max {
                        set.last_key_value()
                    } else {
                        set.first_key_value()
                    }
                    .map(|(v, _)| *v)
                };
                ordered.decode(
                    Int64Array::from_iter(groups.iter().map(|g| value(&sets[at(g)]))),
                    &self.output,
                )?
            }
            (CallState::Generic(states), _) => {
                let mut values = Vec::with_capacity(groups.len());
                for g in groups {
                    let state = states
                        .get_mut(at(g))
                        .and_then(Option::as_mut)
                        .ok_or_else(|| Error::internal("a group without its aggregate state"))?;
                    values.push(match state {
                        AggState::Retractable(acc) | AggState::InsertOnly(acc) => {
                            acc.evaluate().map_err(eval_error)?
                        }
                        AggState::Multiset(rows) => {
                            let mut acc = self
                                .spec
                                .function
                                .create_accumulator()
                                .map_err(eval_error)?;
                            if !rows.is_empty() {
                                let rows: Vec<_> = rows
                                    .iter()
                                    .flat_map(|(r, n)| {
                                        std::iter::repeat_n(r.row(), (*n).max(0) as usize)
                                    })
                                    .collect();
                                let columns =
                                    self.converter.convert_rows(rows).map_err(arrow_error)?;
                                acc.update_batch(&columns).map_err(eval_error)?;
                            }
                            acc.evaluate().map_err(eval_error)?
                        }
                    });
                }
                if values.is_empty() {
                    arrow::array::new_empty_array(&self.output)
                } else {
                    ScalarValue::iter_to_array(values).map_err(eval_error)?
                }
            }
            _ => return Err(Error::internal("aggregate state does not match its kind")),
        };
        Ok(array)
    }

    /// Approximate bytes of group `g`'s state.
    pub(crate) fn size(&self, g: GroupId) -> usize {
        let g = g as usize;
        let entry = std::mem::size_of::<(i64, i64)>() + 2 * std::mem::size_of::<usize>();
        match &self.state {
            CallState::Count(_) => 8,
            CallState::IntSum(..) => 24,
            CallState::FloatSum(..) => 16,
            CallState::ExactFloatSum(sums, _) => 8 + sums.get(g).map_or(0, ExactFloatSum::size),
            CallState::Extreme(_) => 16,
            CallState::ExtremeSet(sets) => sets.get(g).map_or(0, |s| {
                std::mem::size_of::<BTreeMap<i64, i64>>() + s.len() * entry
            }),
            CallState::Generic(states) => match states.get(g).and_then(Option::as_ref) {
                Some(AggState::Retractable(a) | AggState::InsertOnly(a)) => a.size(),
                // Measured without a walk (a group is measured after every epoch that changed
                // it): its distinct rows as long as its first.
                Some(AggState::Multiset(m)) => m.first_key_value().map_or(0, |(r, _)| {
                    m.len() * (r.as_ref().len() + std::mem::size_of::<(OwnedRow, i64)>())
                }),
                None => 0,
            },
        }
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
