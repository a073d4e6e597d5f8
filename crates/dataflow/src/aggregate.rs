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
use std::ops::Range;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, Decimal128Array, Float64Array, Int64Array, RecordBatch, UInt32Array};
use arrow::compute::{can_cast_types, cast, concat};
use arrow::datatypes::{DataType, Decimal128Type, Float64Type, Int64Type, SchemaRef};
use arrow::row::{OwnedRow, RowConverter, Rows, SortField};
use datafusion::common::ScalarValue;
use datafusion::logical_expr::Accumulator;
use eddy_common::{ChangeBatch, Error, ObjectId, Result};
use hashbrown::HashTable;

use crate::exact_sum::ExactFloatSum;
use crate::{Operator, OperatorState, checkpoint};
use crate::event_time::EventTime;
use crate::plan::{AggregateCall, Expr, WindowClose};
use crate::rows::{arrow_error, batch_of, eval_error, evaluate, take_columns};

/// Index of a group's slot in every per-group vector; ids of dropped groups are reused.
type GroupId = u32;

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
enum Ordered {
    /// Integers, dates and timestamps: their value.
    Int,
    /// Floats: their bits, arranged so that integer order is `f64::total_cmp` order.
    Float,
}

impl Ordered {
    fn of(t: &DataType) -> Option<Ordered> {
        use DataType::*;
        match t {
            Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32 | Date32 | Date64 | Timestamp(_, _) => Some(Ordered::Int),
            Float32 | Float64 => Some(Ordered::Float),
            _ => None,
        }
    }

    /// Flips the bits below the sign of negative floats: an involution.
    fn flip(bits: i64) -> i64 {
        bits ^ ((((bits >> 63) as u64) >> 1) as i64)
    }

    fn encode(self, array: &ArrayRef) -> Result<Int64Array> {
        Ok(match self {
            Ordered::Int => cast(array, &DataType::Int64).map_err(arrow_error)?.as_primitive::<Int64Type>().clone(),
            Ordered::Float => {
                let floats = cast(array, &DataType::Float64).map_err(arrow_error)?;
                // Every NaN is one value, above every number (PostgreSQL's order).
                floats.as_primitive::<Float64Type>().unary(|f| Self::flip(if f.is_nan() { f64::NAN } else { f }.to_bits() as i64))
            }
        })
    }

    fn decode(self, values: Int64Array, output: &DataType) -> Result<ArrayRef> {
        let array: ArrayRef = match self {
            Ordered::Int => Arc::new(values),
            Ordered::Float => Arc::new(values.unary::<_, Float64Type>(|v| f64::from_bits(Self::flip(v) as u64))),
        };
        cast(&array, output).map_err(arrow_error)
    }
}

/// What Eddy computes natively, and the rest.
#[derive(Clone, Copy)]
enum Kind {
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
    fn of(spec: &AggregateCall, input: &SchemaRef) -> Kind {
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
        let signed = |t: &DataType| matches!(t, DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64);
        let integer = |t: &DataType| signed(t) || matches!(t, DataType::UInt8 | DataType::UInt16 | DataType::UInt32);
        let float = |t: &DataType| matches!(t, DataType::Float32 | DataType::Float64);
        match (f.fun().name().to_lowercase().as_str(), arg) {
            ("count", _) if output == DataType::Int64 => Kind::Count,
            ("sum", Some(t)) if signed(&t) && output == DataType::Int64 => Kind::IntSum { avg: false },
            ("sum", Some(t)) if float(&t) && output == DataType::Float64 => Kind::FloatSum { avg: false },
            ("avg" | "mean", Some(t)) if integer(&t) && output == DataType::Float64 => Kind::IntSum { avg: true },
            ("avg" | "mean", Some(t)) if float(&t) && output == DataType::Float64 => Kind::FloatSum { avg: true },
            ("sum", Some(DataType::Decimal128(_, s))) if matches!(output, DataType::Decimal128(_, out) if out == s) => Kind::DecimalSum { avg: false, shift: 0 },
            ("avg" | "mean", Some(DataType::Decimal128(_, s))) => match output {
                DataType::Decimal128(_, out) if out >= s => Kind::DecimalSum { avg: true, shift: (out - s) as u32 },
                _ => Kind::Generic,
            },
            (name @ ("min" | "max"), Some(t)) if t == output => match Ordered::of(&t) {
                Some(ordered) if can_cast_types(&t, &DataType::Int64) && can_cast_types(&DataType::Int64, &t) => {
                    Kind::Extreme { max: name == "max", ordered }
                }
                _ => Kind::Generic,
            },
            _ => Kind::Generic,
        }
    }
}

/// Per-group state of an aggregate the native kinds do not cover.
enum AggState {
    Retractable(Box<dyn Accumulator>),
    /// Argument rows (in the call's row format) with their multiplicity.
    Multiset(BTreeMap<OwnedRow, i64>),
    /// Over an append-only input nothing is ever retracted: DataFusion's plain accumulator.
    InsertOnly(Box<dyn Accumulator>),
}

/// One aggregate's state for every group, indexed by group id.
enum CallState {
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
struct Runs {
    order: Vec<u32>,
    runs: Vec<(GroupId, Range<usize>)>,
}

impl Runs {
    fn of(ids: &[GroupId]) -> Runs {
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

struct Call {
    spec: AggregateCall,
    kind: Kind,
    /// Generic only: DataFusion's accumulator retracts exactly.
    retractable: bool,
    /// Row format of the arguments, for the generic multiset state.
    converter: RowConverter,
    output: DataType,
    /// Over an append-only input: generic aggregates keep DataFusion's plain accumulator.
    append_only: bool,
    state: CallState,
}

impl Call {
    fn new(spec: AggregateCall, input: &SchemaRef, append_only: bool) -> Result<Call> {
        let name = spec.function.fun().name().to_lowercase();
        let retractable = RETRACTABLE.contains(&name.as_str()) && !spec.function.is_distinct() && spec.function.order_bys().is_empty();
        let arg_fields = arguments(&spec)
            .iter()
            .map(|e| e.return_field(input).map(|f| SortField::new(f.data_type().clone())))
            .collect::<std::result::Result<Vec<_>, _>>();
        let converter = RowConverter::new(arg_fields.map_err(eval_error)?).map_err(arrow_error)?;
        let kind = Kind::of(&spec, input);
        let state = match kind {
            Kind::Count => CallState::Count(Vec::new()),
            Kind::IntSum { .. } | Kind::DecimalSum { .. } => CallState::IntSum(Vec::new(), Vec::new()),
            Kind::FloatSum { .. } if append_only => CallState::FloatSum(Vec::new(), Vec::new()),
            Kind::FloatSum { .. } => CallState::ExactFloatSum(Vec::new(), Vec::new()),
            Kind::Extreme { .. } if append_only => CallState::Extreme(Vec::new()),
            Kind::Extreme { .. } => CallState::ExtremeSet(Vec::new()),
            Kind::Generic => CallState::Generic(Vec::new()),
        };
        let output = spec.function.field().data_type().clone();
        Ok(Call { spec, kind, retractable, converter, output, append_only, state })
    }

    /// Empties the slot of group `g` (growing the vectors to hold it); `fresh` gives a generic
    /// aggregate a new accumulator, otherwise its slot only frees its memory.
    fn reset(&mut self, g: GroupId, fresh: bool, append_only: bool) -> Result<()> {
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
                    true if self.retractable => Some(AggState::Retractable(f.create_sliding_accumulator().map_err(eval_error)?)),
                    true if append_only => Some(AggState::InsertOnly(f.create_accumulator().map_err(eval_error)?)),
                    true => Some(AggState::Multiset(BTreeMap::new())),
                };
            }
        }
        Ok(())
    }

    /// Folds a batch into the groups: row `i` belongs to group `ids[i]` with weight `diffs[i]`.
    fn absorb(&mut self, rows: &arrow::array::RecordBatch, ids: &[GroupId], diffs: &[i64], runs: Option<&Runs>) -> Result<()> {
        let args: Vec<ArrayRef> = arguments(&self.spec).iter().map(|e| evaluate(e, rows)).collect::<Result<_>>()?;
        let mask: Option<BooleanArray> = match &self.spec.filter {
            Some(f) => Some(evaluate(f, rows)?.as_boolean_opt().cloned().ok_or_else(|| Error::internal("FILTER is not boolean"))?),
            None => None,
        };
        // A row counts when FILTER passes and (for the native kinds) its argument is not NULL.
        let passes = |i: usize| mask.as_ref().is_none_or(|m| m.is_valid(i) && m.value(i)) && args.first().is_none_or(|a| a.is_valid(i));
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
                let values = args[0].as_primitive_opt::<Decimal128Type>().ok_or_else(|| Error::internal("a numeric sum over a column that is not numeric"))?.values();
                let overflow = || Error::new(eddy_common::SqlState::NUMERIC_VALUE_OUT_OF_RANGE, "numeric field overflow in a sum");
                for (i, (&g, &d)) in rows_of {
                    if passes(i) {
                        let term = values[i].checked_mul(i128::from(d)).ok_or_else(overflow)?;
                        sums[g as usize] = sums[g as usize].checked_add(term).ok_or_else(overflow)?;
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
                        return Err(Error::internal("a retraction reached an aggregate over an append-only input"));
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
                let runs = runs.ok_or_else(|| Error::internal("generic aggregate without group runs"))?;
                Self::absorb_generic(states, &self.converter, &args, mask.as_ref(), diffs, runs)?;
            }
            _ => return Err(Error::internal("aggregate state does not match its kind")),
        }
        Ok(())
    }

    fn absorb_generic(states: &mut [Option<AggState>], converter: &RowConverter, args: &[ArrayRef], mask: Option<&BooleanArray>, diffs: &[i64], runs: &Runs) -> Result<()> {
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
            let state = states.get_mut(*g as usize).and_then(Option::as_mut).ok_or_else(|| Error::internal("a group without its aggregate state"))?;
            match state {
                AggState::Retractable(acc) => {
                    let (plus, minus) = expand(&selected);
                    if !plus.is_empty() {
                        acc.update_batch(&take_columns(args, &plus)?).map_err(eval_error)?;
                    }
                    if !minus.is_empty() {
                        acc.retract_batch(&take_columns(args, &minus)?).map_err(eval_error)?;
                    }
                }
                AggState::InsertOnly(acc) => {
                    let (plus, minus) = expand(&selected);
                    if !minus.is_empty() {
                        return Err(Error::internal("a retraction reached an aggregate over an append-only input"));
                    }
                    acc.update_batch(&take_columns(args, &plus)?).map_err(eval_error)?;
                }
                AggState::Multiset(values) => {
                    if encoded.is_none() {
                        encoded = Some(converter.convert_columns(args).map_err(arrow_error)?);
                    }
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
        Ok(())
    }

    /// The aggregate's current value for each of `groups`, as the output type.
    fn evaluate(&mut self, groups: &[GroupId]) -> Result<ArrayRef> {
        let at = |g: &GroupId| *g as usize;
        let array: ArrayRef = match (&mut self.state, self.kind) {
            (CallState::Count(counts), _) => Arc::new(Int64Array::from_iter_values(groups.iter().map(|g| counts[at(g)]))),
            (CallState::IntSum(sums, counts), Kind::DecimalSum { avg, shift }) => {
                let DataType::Decimal128(precision, scale) = self.output else { return Err(Error::internal("a numeric sum with another output type")) };
                let value = |g: &GroupId| match counts[at(g)] {
                    n if n <= 0 => Ok(None),
                    n if avg => crate::decimal::average(sums[at(g)], n, shift).map(Some).ok_or(()),
                    _ => Ok(Some(sums[at(g)])),
                };
                let values = groups.iter().map(value).collect::<std::result::Result<Decimal128Array, ()>>();
                let overflow = || Error::new(eddy_common::SqlState::NUMERIC_VALUE_OUT_OF_RANGE, format!("numeric field overflow: the {} does not fit numeric({precision},{scale})", if avg { "average" } else { "sum" }));
                let values = values.map_err(|()| overflow())?.with_precision_and_scale(precision, scale).map_err(arrow_error)?;
                values.validate_decimal_precision(precision).map_err(|_| overflow())?;
                Arc::new(values)
            }
            (CallState::IntSum(sums, counts), Kind::IntSum { avg }) => {
                if avg {
                    let values = groups.iter().map(|g| (counts[at(g)] > 0).then(|| sums[at(g)] as f64 / counts[at(g)] as f64));
                    Arc::new(Float64Array::from_iter(values))
                } else {
                    // Wraps like DataFusion's sum of Int64.
                    Arc::new(Int64Array::from_iter(groups.iter().map(|g| (counts[at(g)] > 0).then(|| sums[at(g)] as i64))))
                }
            }
            (CallState::FloatSum(sums, counts), Kind::FloatSum { avg }) => {
                let values = groups.iter().map(|g| (counts[at(g)] > 0).then(|| if avg { sums[at(g)] / counts[at(g)] as f64 } else { sums[at(g)] }));
                Arc::new(Float64Array::from_iter(values))
            }
            (CallState::ExactFloatSum(sums, counts), Kind::FloatSum { avg }) => {
                let values = groups.iter().map(|g| {
                    let (sum, n) = (sums[at(g)].value(), counts[at(g)]);
                    (n > 0).then(|| if avg { sum / n as f64 } else { sum })
                });
                Arc::new(Float64Array::from_iter(values))
            }
            (CallState::Extreme(extremes), Kind::Extreme { ordered, .. }) => {
                ordered.decode(Int64Array::from_iter(groups.iter().map(|g| extremes[at(g)])), &self.output)?
            }
            (CallState::ExtremeSet(sets), Kind::Extreme { ordered, max }) => {
                let value = |set: &BTreeMap<i64, i64>| if max { set.last_key_value() } else { set.first_key_value() }.map(|(v, _)| *v);
                ordered.decode(Int64Array::from_iter(groups.iter().map(|g| value(&sets[at(g)]))), &self.output)?
            }
            (CallState::Generic(states), _) => {
                let mut values = Vec::with_capacity(groups.len());
                for g in groups {
                    let state = states.get_mut(at(g)).and_then(Option::as_mut).ok_or_else(|| Error::internal("a group without its aggregate state"))?;
                    values.push(match state {
                        AggState::Retractable(acc) | AggState::InsertOnly(acc) => acc.evaluate().map_err(eval_error)?,
                        AggState::Multiset(rows) => {
                            let mut acc = self.spec.function.create_accumulator().map_err(eval_error)?;
                            if !rows.is_empty() {
                                let rows: Vec<_> = rows.iter().flat_map(|(r, n)| std::iter::repeat_n(r.row(), (*n).max(0) as usize)).collect();
                                let columns = self.converter.convert_rows(rows).map_err(arrow_error)?;
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
    fn size(&self, g: GroupId) -> usize {
        let g = g as usize;
        let entry = std::mem::size_of::<(i64, i64)>() + 2 * std::mem::size_of::<usize>();
        match &self.state {
            CallState::Count(_) => 8,
            CallState::IntSum(..) => 24,
            CallState::FloatSum(..) => 16,
            CallState::ExactFloatSum(sums, _) => 8 + sums.get(g).map_or(0, ExactFloatSum::size),
            CallState::Extreme(_) => 16,
            CallState::ExtremeSet(sets) => sets.get(g).map_or(0, |s| std::mem::size_of::<BTreeMap<i64, i64>>() + s.len() * entry),
            CallState::Generic(states) => match states.get(g).and_then(Option::as_ref) {
                Some(AggState::Retractable(a) | AggState::InsertOnly(a)) => a.size(),
                Some(AggState::Multiset(m)) => m.keys().map(|r| r.as_ref().len() + std::mem::size_of::<(OwnedRow, i64)>()).sum(),
                None => 0,
            },
        }
    }
}

impl Call {
    /// Columns `c<i>…` holding this call's state of `groups` (a checkpoint).
    fn save(&mut self, i: usize, groups: &[GroupId], out: &mut Vec<(String, ArrayRef)>) -> Result<()> {
        let at = |g: &GroupId| *g as usize;
        let accumulates = self.accumulates();
        match &mut self.state {
            CallState::Count(counts) => out.push((format!("c{i}"), checkpoint::int64s(groups.iter().map(|g| counts[at(g)])))),
            CallState::IntSum(sums, counts) => {
                let sums = Decimal128Array::from_iter_values(groups.iter().map(|g| sums[at(g)]));
                out.push((format!("c{i}_sum"), Arc::new(sums.with_precision_and_scale(38, 0).map_err(arrow_error)?)));
                out.push((format!("c{i}_n"), checkpoint::int64s(groups.iter().map(|g| counts[at(g)]))));
            }
            CallState::FloatSum(sums, counts) => {
                out.push((format!("c{i}_sum"), Arc::new(Float64Array::from_iter_values(groups.iter().map(|g| sums[at(g)])))));
                out.push((format!("c{i}_n"), checkpoint::int64s(groups.iter().map(|g| counts[at(g)]))));
            }
            CallState::ExactFloatSum(sums, counts) => {
                let encoded: Vec<Vec<u8>> = groups.iter().map(|g| {
                    let mut bytes = Vec::new();
                    sums[at(g)].encode(&mut bytes);
                    bytes
                }).collect();
                out.push((format!("c{i}_exact"), checkpoint::binary(encoded.iter().map(Vec::as_slice))));
                out.push((format!("c{i}_n"), checkpoint::int64s(groups.iter().map(|g| counts[at(g)]))));
            }
            CallState::Extreme(values) => out.push((format!("c{i}"), Arc::new(Int64Array::from_iter(groups.iter().map(|g| values[at(g)]))))),
            CallState::ExtremeSet(sets) => {
                // Per group: (value, multiplicity) pairs, little-endian.
                let encoded: Vec<Vec<u8>> = groups.iter().map(|g| sets[at(g)].iter().flat_map(|(v, n)| v.to_le_bytes().into_iter().chain(n.to_le_bytes())).collect()).collect();
                out.push((format!("c{i}"), checkpoint::binary(encoded.iter().map(Vec::as_slice))));
            }
            CallState::Generic(states) => {
                let mut multisets: Vec<Vec<u8>> = Vec::new();
                // An accumulator's state is as wide as its own `state()` says: a sliding
                // accumulator keeps more than `state_fields` declares (sum of decimals: the
                // sum and a count), so the width comes from the values, never the fields.
                let mut scalars: Vec<Vec<ScalarValue>> = Vec::new();
                for (k, g) in groups.iter().enumerate() {
                    match states.get_mut(at(g)).and_then(Option::as_mut).ok_or_else(|| Error::internal("a group without its aggregate state"))? {
                        AggState::Retractable(acc) | AggState::InsertOnly(acc) => {
                            let state = acc.state().map_err(eval_error)?;
                            if k == 0 {
                                scalars = vec![Vec::with_capacity(groups.len()); state.len()];
                            }
                            if state.len() != scalars.len() {
                                return Err(Error::internal("accumulators of one aggregate keep states of different widths"));
                            }
                            for (column, value) in scalars.iter_mut().zip(state) {
                                column.push(value);
                            }
                        }
                        // Per group: (row length u32, row, multiplicity i64), little-endian.
                        AggState::Multiset(rows) => multisets.push(
                            rows.iter()
                                .flat_map(|(r, n)| (r.as_ref().len() as u32).to_le_bytes().into_iter().chain(r.as_ref().iter().copied()).chain(n.to_le_bytes()))
                                .collect(),
                        ),
                    }
                }
                if !accumulates {
                    out.push((format!("c{i}"), checkpoint::binary(multisets.iter().map(Vec::as_slice))));
                } else {
                    for (j, column) in scalars.into_iter().enumerate() {
                        out.push((format!("c{i}_s{j}"), ScalarValue::iter_to_array(column).map_err(eval_error)?));
                    }
                }
            }
        }
        Ok(())
    }

    /// Whether each group of this generic aggregate keeps a DataFusion accumulator (not a
    /// multiset of argument rows).
    fn accumulates(&self) -> bool {
        self.retractable || self.append_only
    }

    /// Sets the state of `groups` (fresh ones) from the columns [`Call::save`] wrote.
    fn load(&mut self, i: usize, batch: &RecordBatch, groups: &[GroupId]) -> Result<()> {
        let at = |g: &GroupId| *g as usize;
        let accumulates = self.accumulates();
        match &mut self.state {
            CallState::Count(counts) => {
                let values = checkpoint::int64_column(batch, &format!("c{i}"))?;
                for (g, v) in groups.iter().zip(values.values()) {
                    counts[at(g)] = *v;
                }
            }
            CallState::IntSum(sums, counts) => {
                let saved = checkpoint::column(batch, &format!("c{i}_sum"))?.as_primitive_opt::<Decimal128Type>().ok_or_else(|| Error::internal("a checkpointed sum is not a decimal"))?;
                let n = checkpoint::int64_column(batch, &format!("c{i}_n"))?;
                for (k, g) in groups.iter().enumerate() {
                    sums[at(g)] = saved.value(k);
                    counts[at(g)] = n.value(k);
                }
            }
            CallState::FloatSum(sums, counts) => {
                let saved = checkpoint::column(batch, &format!("c{i}_sum"))?.as_primitive_opt::<Float64Type>().ok_or_else(|| Error::internal("a checkpointed sum is not a double"))?;
                let n = checkpoint::int64_column(batch, &format!("c{i}_n"))?;
                for (k, g) in groups.iter().enumerate() {
                    sums[at(g)] = saved.value(k);
                    counts[at(g)] = n.value(k);
                }
            }
            CallState::ExactFloatSum(sums, counts) => {
                let saved = checkpoint::binary_column(batch, &format!("c{i}_exact"))?;
                let n = checkpoint::int64_column(batch, &format!("c{i}_n"))?;
                for (k, g) in groups.iter().enumerate() {
                    sums[at(g)] = ExactFloatSum::decode(saved.value(k)).ok_or_else(truncated)?;
                    counts[at(g)] = n.value(k);
                }
            }
            CallState::Extreme(values) => {
                let saved = checkpoint::int64_column(batch, &format!("c{i}"))?;
                for (k, g) in groups.iter().enumerate() {
                    values[at(g)] = checkpoint::value_at(saved, k);
                }
            }
            CallState::ExtremeSet(sets) => {
                let saved = checkpoint::binary_column(batch, &format!("c{i}"))?;
                for (k, g) in groups.iter().enumerate() {
                    let set = &mut sets[at(g)];
                    for pair in saved.value(k).chunks_exact(16) {
                        let (v, n) = pair.split_at(8);
                        set.insert(i64::from_le_bytes(le8(v)?), i64::from_le_bytes(le8(n)?));
                    }
                }
            }
            CallState::Generic(states) if accumulates => {
                // As many state columns as `save` wrote (none when it saved no group).
                let width = (0..).take_while(|j| batch.schema().column_with_name(&format!("c{i}_s{j}")).is_some()).count();
                if width == 0 && !groups.is_empty() {
                    return Err(Error::new(eddy_common::SqlState::DATA_CORRUPTED, format!("the checkpoint holds no state for aggregate {}", self.spec.function.name())));
                }
                let columns = (0..width).map(|j| checkpoint::column(batch, &format!("c{i}_s{j}")).cloned()).collect::<Result<Vec<_>>>()?;
                for (k, g) in groups.iter().enumerate() {
                    let acc = match states.get_mut(at(g)).and_then(Option::as_mut) {
                        Some(AggState::Retractable(acc) | AggState::InsertOnly(acc)) => acc,
                        _ => return Err(Error::internal("a group without its accumulator")),
                    };
                    let row: Vec<ArrayRef> = columns.iter().map(|c| c.slice(k, 1)).collect();
                    acc.merge_batch(&row).map_err(eval_error)?;
                }
            }
            CallState::Generic(states) => {
                let saved = checkpoint::binary_column(batch, &format!("c{i}"))?;
                let parser = self.converter.parser();
                for (k, g) in groups.iter().enumerate() {
                    let Some(AggState::Multiset(rows)) = states.get_mut(at(g)).and_then(Option::as_mut) else {
                        return Err(Error::internal("a group without its multiset"));
                    };
                    let mut bytes = saved.value(k);
                    while !bytes.is_empty() {
                        let (len, rest) = bytes.split_at_checked(4).ok_or_else(truncated)?;
                        let len = u32::from_le_bytes(len.try_into().map_err(|_| truncated())?) as usize;
                        let (row, rest) = rest.split_at_checked(len).ok_or_else(truncated)?;
                        let (n, rest) = rest.split_at_checked(8).ok_or_else(truncated)?;
                        rows.insert(parser.parse(row).owned(), i64::from_le_bytes(le8(n)?));
                        bytes = rest;
                    }
                }
            }
        }
        Ok(())
    }
}

fn le8(bytes: &[u8]) -> Result<[u8; 8]> {
    bytes.try_into().map_err(|_| truncated())
}

fn truncated() -> Error {
    Error::internal("checkpointed aggregate state is truncated")
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

pub struct Aggregate {
    input: Box<dyn Operator>,
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
        let calls = aggregates.into_iter().map(|spec| Call::new(spec, input_schema, append_only)).collect::<Result<Vec<_>>>()?;
        let value_fields: Vec<SortField> = schema.fields().iter().skip(group_exprs.len()).map(|f| SortField::new(f.data_type().clone())).collect();
        let value_converter = if value_fields.is_empty() { None } else { Some(RowConverter::new(value_fields).map_err(arrow_error)?) };
        let global = group_exprs.is_empty();
        let key_types = group_exprs.iter().map(|e| e.data_type(input_schema)).collect::<std::result::Result<Vec<_>, _>>().map_err(eval_error)?;
        let mut op = Aggregate {
            input,
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
                let g = GroupId::try_from(self.keys.len()).map_err(|_| Error::internal("more than 2^32 groups"))?;
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
            self.expiry.entry(window_end.saturating_add(w.lateness.allowed_micros)).or_default().push(g);
        }
        self.live += 1;
        Ok(g)
    }

    fn free_group(&mut self, g: GroupId) -> Result<()> {
        let at = g as usize;
        if !self.alive[at] {
            return Ok(());
        }
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
        let Some((w, _)) = &self.window else { return Ok(i64::MAX) };
        let Some(column) = keys.get(w.key) else { return Ok(i64::MAX) };
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
        let mut ids = Vec::with_capacity(rows.num_rows());
        for (i, row) in encoded.iter().enumerate() {
            let bytes: &[u8] = row.as_ref();
            let hash = self.hasher.hash_one(bytes);
            let found = self.table.find(hash, |&g| &*self.keys[g as usize] == bytes).copied();
            let g = match found {
                Some(g) => g,
                None => {
                    let end = self.window_end_of(&keys, i)?;
                    let g = self.new_group(bytes.into(), end)?;
                    let (keys, hasher) = (&self.keys, &self.hasher);
                    self.table.insert_unique(hash, g, |&x| hasher.hash_one(&*keys[x as usize]));
                    g
                }
            };
            ids.push(g);
        }
        Ok(ids)
    }

    /// The group keys' row format (made on first use: most aggregates are never restored).
    fn key_converter(&mut self) -> Result<&RowConverter> {
        if self.key_converter.is_none() {
            let fields = self.key_types.iter().map(|t| SortField::new(t.clone())).collect();
            self.key_converter = Some(RowConverter::new(fields).map_err(arrow_error)?);
        }
        self.key_converter.as_ref().ok_or_else(|| Error::internal("no key converter"))
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
        let runs = self.calls.iter().any(|c| matches!(c.kind, Kind::Generic)).then(|| Runs::of(&ids));
        for call in &mut self.calls {
            call.absorb(rows, &ids, diffs, runs.as_ref())?;
        }
        Ok(())
    }

    fn watermark(&self) -> Option<i64> {
        let (w, event_time) = self.window.as_ref()?;
        event_time.min_of(&w.sources)
    }

    /// Frees the state of windows the watermark has passed by more than the allowed lateness;
    /// their rows stay in the view.
    fn evict(&mut self) -> Result<()> {
        let (Some(watermark), Some((w, _))) = (self.watermark(), self.window.as_ref()) else { return Ok(()) };
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
        Ok(())
    }

    /// The group key columns of `groups`, as the output's types.
    fn key_columns(&self, groups: &[GroupId]) -> Result<Vec<ArrayRef>> {
        if self.global {
            return Ok(Vec::new());
        }
        let converter = self.key_converter.as_ref().ok_or_else(|| Error::internal("no key converter"))?;
        let parser = converter.parser();
        let columns = converter.convert_rows(groups.iter().map(|&g| parser.parse(&self.keys[g as usize]))).map_err(arrow_error)?;
        columns.iter().zip(self.schema.fields().iter()).map(|(c, f)| cast_to(c, f.data_type())).collect()
    }

    fn emit(&mut self) -> Result<Vec<ChangeBatch>> {
        let mut dirty = std::mem::take(&mut self.dirty);
        for &g in &dirty {
            self.is_dirty[g as usize] = false;
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
        let mut retract: Vec<GroupId> = dead.iter().copied().filter(|&g| self.emitted[g as usize].is_some()).collect();
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
                let rows = retract.iter().map(|&g| parser.parse(self.emitted[g as usize].as_deref().unwrap_or_default()));
                old.extend(converter.convert_rows(rows).map_err(arrow_error)?);
                new.extend(take_columns(&values, &UInt32Array::from(insert_at.clone()))?);
            }
            let columns = old.iter().zip(&new).map(|(a, b)| concat(&[a.as_ref(), b.as_ref()]).map_err(arrow_error)).collect::<Result<Vec<_>>>()?;
            let diffs: Int64Array = std::iter::repeat_n(-1, retract.len()).chain(std::iter::repeat_n(1, insert.len())).collect();
            vec![ChangeBatch::new(batch_of(&self.schema, columns, changed)?, diffs)]
        };
        for (&g, &j) in insert.iter().zip(&insert_at) {
            self.emitted[g as usize] = Some(encoded.as_ref().map_or(&[][..], |e| e.row(j as usize).data()).into());
        }
        for g in dead {
            self.free_group(g)?;
        }
        Ok(out)
    }
}

fn cast_to(array: &ArrayRef, t: &DataType) -> Result<ArrayRef> {
    if array.data_type() == t { Ok(Arc::clone(array)) } else { cast(array, t).map_err(arrow_error) }
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
        self.evict()?;
        Ok(out)
    }

    fn state(&self) -> OperatorState {
        let mut bytes = 0;
        for (g, key) in self.keys.iter().enumerate() {
            if !self.alive[g] {
                continue;
            }
            let g = g as GroupId;
            bytes += key.len() + self.emitted[g as usize].as_ref().map_or(0, |e| e.len()) + 48;
            bytes += self.calls.iter().map(|c| c.size(g)).sum::<usize>();
        }
        OperatorState { name: "Aggregate".to_owned(), rows: self.live, bytes }
    }

    fn save_state(&mut self) -> Result<checkpoint::Parts> {
        let groups: Vec<GroupId> = (0..self.keys.len() as GroupId).filter(|&g| self.alive[g as usize]).collect();
        let at = |g: &GroupId| *g as usize;
        let mut columns: Vec<(String, ArrayRef)> = vec![
            ("key".into(), checkpoint::binary(groups.iter().map(|g| &*self.keys[at(g)]))),
            ("count".into(), checkpoint::int64s(groups.iter().map(|g| self.counts[at(g)]))),
            ("emitted".into(), checkpoint::optional_binary(groups.iter().map(|g| self.emitted[at(g)].as_deref()))),
            ("window_end".into(), checkpoint::int64s(groups.iter().map(|g| self.window_end[at(g)]))),
            ("dirty".into(), Arc::new(BooleanArray::from_iter(groups.iter().map(|g| Some(self.is_dirty[at(g)]))))),
        ];
        for (i, call) in self.calls.iter_mut().enumerate() {
            call.save(i, &groups, &mut columns)?;
        }
        Ok(vec![("groups", checkpoint::part(columns, &[("evicted_to", self.evicted_to)])?)])
    }

    fn load_state(&mut self, name: &str, batch: &RecordBatch) -> Result<()> {
        if name != "groups" {
            return Err(checkpoint::unknown_part("Aggregate", name));
        }
        // Start empty (a global aggregate made its group already), then add the saved groups.
        let alive: Vec<GroupId> = (0..self.keys.len() as GroupId).filter(|&g| self.alive[g as usize]).collect();
        for g in alive {
            self.free_group(g)?;
        }
        self.dirty.clear();
        self.is_dirty.iter_mut().for_each(|d| *d = false);
        self.expiry.clear();
        let keys = checkpoint::binary_column(batch, "key")?;
        let counts = checkpoint::int64_column(batch, "count")?;
        let emitted = checkpoint::binary_column(batch, "emitted")?;
        let ends = checkpoint::int64_column(batch, "window_end")?;
        let dirty = checkpoint::column(batch, "dirty")?.as_boolean_opt().ok_or_else(|| Error::internal("checkpointed dirty flags are not boolean"))?.clone();
        self.key_converter()?;
        let mut groups = Vec::with_capacity(batch.num_rows());
        for i in 0..batch.num_rows() {
            let key: Box<[u8]> = keys.value(i).into();
            let hash = self.hasher.hash_one(&*key);
            let g = self.new_group(key, ends.value(i))?;
            if !self.global {
                let (keys, hasher) = (&self.keys, &self.hasher);
                self.table.insert_unique(hash, g, |&x| hasher.hash_one(&*keys[x as usize]));
            }
            self.counts[g as usize] = counts.value(i);
            self.emitted[g as usize] = emitted.is_valid(i).then(|| emitted.value(i).into());
            if dirty.value(i) {
                self.mark_dirty(g);
            }
            groups.push(g);
        }
        for (i, call) in self.calls.iter_mut().enumerate() {
            call.load(i, batch, &groups)?;
        }
        self.evicted_to = checkpoint::scalar(batch, "evicted_to")?;
        Ok(())
    }

    fn children(&self) -> Vec<&dyn Operator> {
        vec![self.input.as_ref()]
    }

    fn children_mut(&mut self) -> Vec<&mut dyn Operator> {
        vec![self.input.as_mut()]
    }
}
