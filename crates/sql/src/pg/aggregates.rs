//! Aggregates with PostgreSQL's result types: `avg` of integers and numerics is a numeric with
//! (at least) 16 decimals, as PostgreSQL prints `avg(x)` for values below 10,000 (DataFusion
//! gives integers a double and numerics 4 more decimals); `variance` is `var_samp`.
//!
//! The wrapper keeps DataFusion's accumulators (which retract exactly, so views maintain it
//! incrementally) and its name `avg`; the argument coercion, the result type and the rounding
//! differ: PostgreSQL rounds the last decimal half away from zero where DataFusion truncates
//! (`avg(1, 2, 2)` is 1.6666666666666667), as views do (`eddy_dataflow::decimal::average`).
//!
//! `min` / `max` of floats: PostgreSQL orders NaN above every number (`min` skips it unless
//! every value is NaN, `max` returns it). DataFusion's ungrouped accumulators do the same, but its
//! grouped ones (`GROUP BY`) let a NaN win both; the wrappers keep the ungrouped accumulator for
//! float arguments.

use std::sync::Arc;

use arrow::array::ArrayRef;
use arrow::datatypes::{DataType, FieldRef};
use datafusion::common::{Result, ScalarValue};
use datafusion::functions_aggregate::average::Avg;
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::{
    Accumulator, AggregateUDF, AggregateUDFImpl, GroupsAccumulator, ReversedUDAF, Signature,
};

/// Decimal places of `avg(integer | numeric)`.
const AVG_SCALE: i8 = 16;

#[derive(Debug, PartialEq, Eq, Hash)]
struct PgAvg {
    inner: Avg,
    signature: Signature,
}

impl PgAvg {
    fn coerce(t: &DataType) -> Result<DataType> {
        Ok(match t {
            // Integers average as numerics; 20 digits hold any bigint, and keep DataFusion's
            // running sum in 128 bits.
            DataType::Int8
            | DataType::Int16
            | DataType::Int32
            | DataType::Int64
            | DataType::UInt8
            | DataType::UInt16
            | DataType::UInt32
            | DataType::UInt64 => DataType::Decimal128(20, 0),
            DataType::Decimal128(..) | DataType::Duration(_) => t.clone(),
            DataType::Decimal32(p, s) | DataType::Decimal64(p, s) => DataType::Decimal128(*p, *s),
            DataType::Float16 | DataType::Float32 | DataType::Float64 | DataType::Null => {
                DataType::Float64
            }
            other => {
                return Err(crate::pg::udf::no_such_function(
                    "avg",
                    std::slice::from_ref(other),
                ));
            }
        })
    }
}

impl AggregateUDFImpl for PgAvg {
    fn name(&self) -> &str {
        "avg"
    }

    fn aliases(&self) -> &[String] {
        self.inner.aliases()
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        match arg_types {
            [t] => Ok(vec![PgAvg::coerce(t)?]),
            _ => Err(crate::pg::udf::no_such_function("avg", arg_types)),
        }
    }

    fn return_field(&self, arg_fields: &[FieldRef]) -> Result<FieldRef> {
        match self.return_type(
            &arg_fields
                .iter()
                .map(|f| f.data_type().clone())
                .collect::<Vec<_>>(),
        )? {
            DataType::Decimal128(_, s) => Ok(std::sync::Arc::new(
                crate::pg::text::numeric_field_at_scale(s).with_name(self.name()),
            )),
            other => Ok(std::sync::Arc::new(arrow::datatypes::Field::new(
                self.name(),
                other,
                true,
            ))),
        }
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        match arg_types.first() {
            Some(DataType::Decimal128(_, s)) => Ok(DataType::Decimal128(38, (*s).max(AVG_SCALE))),
            _ => self.inner.return_type(arg_types),
        }
    }

    fn accumulator(&self, acc_args: AccumulatorArgs<'_>) -> Result<Box<dyn Accumulator>> {
        let output = acc_args.return_field.data_type().clone();
        Ok(RoundingAvg::wrap(
            self.inner.accumulator(acc_args)?,
            &output,
        ))
    }

    fn state_fields(&self, args: StateFieldsArgs<'_>) -> Result<Vec<FieldRef>> {
        self.inner.state_fields(args)
    }

    /// Not for numeric results: DataFusion's grouped average truncates (the per-group
    /// accumulator rounds).
    fn groups_accumulator_supported(&self, args: AccumulatorArgs<'_>) -> bool {
        !matches!(args.return_field.data_type(), DataType::Decimal128(..))
            && self.inner.groups_accumulator_supported(args)
    }

    fn create_groups_accumulator(
        &self,
        args: AccumulatorArgs<'_>,
    ) -> Result<Box<dyn GroupsAccumulator>> {
        self.inner.create_groups_accumulator(args)
    }

    fn create_sliding_accumulator(
        &self,
        args: AccumulatorArgs<'_>,
    ) -> Result<Box<dyn Accumulator>> {
        let output = args.return_field.data_type().clone();
        Ok(RoundingAvg::wrap(
            self.inner.create_sliding_accumulator(args)?,
            &output,
        ))
    }

    fn reverse_expr(&self) -> ReversedUDAF {
        ReversedUDAF::Identical
    }
}

/// DataFusion's average of numerics, rounded as PostgreSQL rounds: its state is (count, sum),
/// and the value is computed from that state.
#[derive(Debug)]
struct RoundingAvg {
    inner: Box<dyn Accumulator>,
    precision: u8,
    scale: i8,
}

impl RoundingAvg {
    fn wrap(inner: Box<dyn Accumulator>, output: &DataType) -> Box<dyn Accumulator> {
        match output {
            DataType::Decimal128(precision, scale) => Box::new(RoundingAvg {
                inner,
                precision: *precision,
                scale: *scale,
            }),
            _ => inner,
        }
    }
}

impl Accumulator for RoundingAvg {
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        self.inner.update_batch(values)
    }

    fn evaluate(&mut self) -> Result<ScalarValue> {
        let state = self.inner.state()?;
        let (count, sum, sum_scale) = match state.as_slice() {
            [
                ScalarValue::UInt64(count),
                ScalarValue::Decimal128(sum, _, s),
            ] => (count.unwrap_or(0), *sum, *s),
            [
                ScalarValue::UInt64(count),
                ScalarValue::Decimal256(sum, _, s),
            ] => {
                let sum = sum
                    .map(|v| {
                        v.to_i128()
                            .ok_or_else(|| overflow(self.precision, self.scale))
                    })
                    .transpose()?;
                (count.unwrap_or(0), sum, *s)
            }
            _ => return self.inner.evaluate(),
        };
        let value = match sum {
            Some(sum) if count > 0 => {
                let shift = u32::try_from(self.scale - sum_scale)
                    .map_err(|_| overflow(self.precision, self.scale))?;
                let count =
                    i64::try_from(count).map_err(|_| overflow(self.precision, self.scale))?;
                let value = eddy_dataflow::decimal::average(sum, count, shift)
                    .ok_or_else(|| overflow(self.precision, self.scale))?;
                if value.unsigned_abs() >= 10u128.pow(u32::from(self.precision)) {
                    return Err(overflow(self.precision, self.scale));
                }
                Some(value)
            }
            _ => None,
        };
        Ok(ScalarValue::Decimal128(value, self.precision, self.scale))
    }

    fn size(&self) -> usize {
        self.inner.size() + std::mem::size_of::<Self>()
    }

    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        self.inner.state()
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> Result<()> {
        self.inner.merge_batch(states)
    }

    fn retract_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        self.inner.retract_batch(values)
    }

    fn supports_retract_batch(&self) -> bool {
        self.inner.supports_retract_batch()
    }
}

fn overflow(precision: u8, scale: i8) -> datafusion::error::DataFusionError {
    datafusion::error::DataFusionError::External(Box::new(eddy_common::Error::new(
        eddy_common::SqlState::NUMERIC_VALUE_OUT_OF_RANGE,
        format!("numeric field overflow: an average does not fit numeric({precision},{scale})"),
    )))
}

/// An aggregate that delegates everything to DataFusion's but its grouped accumulator for
/// float arguments (`min`, `max`: see the module's comment).
#[derive(Debug, PartialEq, Eq, Hash)]
struct FloatsUngrouped {
    inner: Arc<AggregateUDF>,
}

impl AggregateUDFImpl for FloatsUngrouped {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn aliases(&self) -> &[String] {
        self.inner.aliases()
    }

    fn signature(&self) -> &Signature {
        self.inner.signature()
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        self.inner.return_type(arg_types)
    }

    fn return_field(&self, arg_fields: &[FieldRef]) -> Result<FieldRef> {
        self.inner.return_field(arg_fields)
    }

    fn accumulator(&self, acc_args: AccumulatorArgs<'_>) -> Result<Box<dyn Accumulator>> {
        self.inner.accumulator(acc_args)
    }

    fn state_fields(&self, args: StateFieldsArgs<'_>) -> Result<Vec<FieldRef>> {
        self.inner.state_fields(args)
    }

    fn groups_accumulator_supported(&self, args: AccumulatorArgs<'_>) -> bool {
        !matches!(
            args.return_field.data_type(),
            DataType::Float16 | DataType::Float32 | DataType::Float64
        ) && self.inner.groups_accumulator_supported(args)
    }

    fn create_groups_accumulator(
        &self,
        args: AccumulatorArgs<'_>,
    ) -> Result<Box<dyn GroupsAccumulator>> {
        self.inner.create_groups_accumulator(args)
    }

    fn create_sliding_accumulator(
        &self,
        args: AccumulatorArgs<'_>,
    ) -> Result<Box<dyn Accumulator>> {
        self.inner.create_sliding_accumulator(args)
    }

    fn reverse_expr(&self) -> ReversedUDAF {
        self.inner.reverse_udf()
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        self.inner.coerce_types(arg_types)
    }

    fn is_descending(&self) -> Option<bool> {
        self.inner.is_descending()
    }

    fn value_from_stats(
        &self,
        statistics_args: &datafusion::logical_expr::StatisticsArgs<'_>,
    ) -> Option<ScalarValue> {
        self.inner.value_from_stats(statistics_args)
    }

    fn default_value(&self, data_type: &DataType) -> Result<ScalarValue> {
        self.inner.default_value(data_type)
    }
}

pub fn functions() -> Vec<Arc<AggregateUDF>> {
    let variance = datafusion::functions_aggregate::variance::var_samp_udaf()
        .as_ref()
        .clone()
        .with_aliases(["variance"]);
    let mut out = vec![
        Arc::new(AggregateUDF::new_from_impl(PgAvg {
            inner: Avg::new(),
            signature: Signature::user_defined(datafusion::logical_expr::Volatility::Immutable),
        })),
        Arc::new(variance),
    ];
    for inner in [
        datafusion::functions_aggregate::min_max::min_udaf(),
        datafusion::functions_aggregate::min_max::max_udaf(),
    ] {
        out.push(Arc::new(AggregateUDF::new_from_impl(FloatsUngrouped {
            inner,
        })));
    }
    out
}
