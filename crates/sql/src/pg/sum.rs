//! `sum` with PostgreSQL's result types: `sum(smallint | integer)` is a bigint and
//! `sum(bigint)` a numeric, which never overflows. DataFusion's `sum(bigint)` is a bigint that
//! wraps around past 2^63, silently (issue found by the typed PostgreSQL oracle).
//!
//! The argument coercion must give the same type when applied again (DataFusion's analyzer may
//! run over a plan it already coerced): so a small integer is not cast to a bigint (a second
//! pass would take that bigint for a numeric); its accumulators cast each batch instead.

use std::sync::Arc;

use arrow::array::{ArrayRef, BooleanArray};
use arrow::compute::cast;
use arrow::datatypes::{DataType, FieldRef};
use datafusion::common::{Result, ScalarValue};
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::{
    Accumulator, AggregateUDF, AggregateUDFImpl, EmitTo, GroupsAccumulator, ReversedUDAF,
    Signature, Volatility,
};

/// What a bigint argument sums as: 20 digits hold any bigint, and DataFusion's sum of them is
/// a numeric of 30.
const BIGINT_AS: DataType = DataType::Decimal128(20, 0);

#[derive(Debug, PartialEq, Eq, Hash)]
struct PgSum {
    inner: Arc<AggregateUDF>,
    signature: Signature,
}

/// The type a small integer argument is summed in (`None`: the argument's own).
fn widened(t: &DataType) -> Option<DataType> {
    match t {
        DataType::Int8 | DataType::Int16 | DataType::Int32 => Some(DataType::Int64),
        DataType::UInt8 | DataType::UInt16 | DataType::UInt32 => Some(DataType::UInt64),
        _ => None,
    }
}

impl PgSum {
    /// The argument's type in `args`, and the type its batches are cast to, if any.
    fn input(args: &AccumulatorArgs<'_>) -> Result<Option<DataType>> {
        let [expr] = args.exprs else {
            return Ok(None);
        };
        Ok(widened(&expr.data_type(args.schema)?))
    }
}

impl AggregateUDFImpl for PgSum {
    fn name(&self) -> &str {
        "sum"
    }

    fn aliases(&self) -> &[String] {
        self.inner.aliases()
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        let [t] = arg_types else {
            return Err(crate::pg::udf::no_such_function("sum", arg_types));
        };
        Ok(vec![match t {
            DataType::Null | DataType::Int64 | DataType::UInt64 => BIGINT_AS,
            DataType::Float16 | DataType::Float32 => DataType::Float64,
            DataType::Int8
            | DataType::Int16
            | DataType::Int32
            | DataType::UInt8
            | DataType::UInt16
            | DataType::UInt32
            | DataType::Float64
            | DataType::Decimal32(..)
            | DataType::Decimal64(..)
            | DataType::Decimal128(..)
            | DataType::Decimal256(..)
            | DataType::Duration(_)
            | DataType::Interval(_) => t.clone(),
            _ => return Err(crate::pg::udf::no_such_function("sum", arg_types)),
        }])
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        match arg_types.first().and_then(widened) {
            Some(t) => Ok(t),
            None => self.inner.return_type(arg_types),
        }
    }

    fn accumulator(&self, args: AccumulatorArgs<'_>) -> Result<Box<dyn Accumulator>> {
        let to = PgSum::input(&args)?;
        Ok(Casting::wrap(self.inner.accumulator(args)?, to))
    }

    fn create_sliding_accumulator(
        &self,
        args: AccumulatorArgs<'_>,
    ) -> Result<Box<dyn Accumulator>> {
        let to = PgSum::input(&args)?;
        Ok(Casting::wrap(
            self.inner.create_sliding_accumulator(args)?,
            to,
        ))
    }

    fn groups_accumulator_supported(&self, args: AccumulatorArgs<'_>) -> bool {
        self.inner.groups_accumulator_supported(args)
    }

    fn create_groups_accumulator(
        &self,
        args: AccumulatorArgs<'_>,
    ) -> Result<Box<dyn GroupsAccumulator>> {
        let to = PgSum::input(&args)?;
        let inner = self.inner.create_groups_accumulator(args)?;
        Ok(match to {
            Some(to) => Box::new(CastingGroups { inner, to }),
            None => inner,
        })
    }

    fn state_fields(&self, args: StateFieldsArgs<'_>) -> Result<Vec<FieldRef>> {
        self.inner.state_fields(args)
    }

    fn reverse_expr(&self) -> ReversedUDAF {
        ReversedUDAF::Identical
    }

    fn default_value(&self, data_type: &DataType) -> Result<ScalarValue> {
        self.inner.default_value(data_type)
    }
}

/// An accumulator fed its argument cast to the type it sums in.
#[derive(Debug)]
struct Casting {
    inner: Box<dyn Accumulator>,
    to: DataType,
}

impl Casting {
    fn wrap(inner: Box<dyn Accumulator>, to: Option<DataType>) -> Box<dyn Accumulator> {
        match to {
            Some(to) => Box::new(Casting { inner, to }),
            None => inner,
        }
    }
}

fn cast_all(values: &[ArrayRef], to: &DataType) -> Result<Vec<ArrayRef>> {
    values
        .iter()
        .map(|v| cast(v, to).map_err(Into::into))
        .collect()
}

impl Accumulator for Casting {
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        self.inner.update_batch(&cast_all(values, &self.to)?)
    }

    fn retract_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        self.inner.retract_batch(&cast_all(values, &self.to)?)
    }

    fn supports_retract_batch(&self) -> bool {
        self.inner.supports_retract_batch()
    }

    fn evaluate(&mut self) -> Result<ScalarValue> {
        self.inner.evaluate()
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
}

/// A groups accumulator fed its argument cast to the type it sums in.
struct CastingGroups {
    inner: Box<dyn GroupsAccumulator>,
    to: DataType,
}

impl GroupsAccumulator for CastingGroups {
    fn update_batch(
        &mut self,
        values: &[ArrayRef],
        group_indices: &[usize],
        opt_filter: Option<&BooleanArray>,
        total_num_groups: usize,
    ) -> Result<()> {
        let values = cast_all(values, &self.to)?;
        self.inner
            .update_batch(&values, group_indices, opt_filter, total_num_groups)
    }

    fn evaluate(&mut self, emit_to: EmitTo) -> Result<ArrayRef> {
        self.inner.evaluate(emit_to)
    }

    fn state(&mut self, emit_to: EmitTo) -> Result<Vec<ArrayRef>> {
        self.inner.state(emit_to)
    }

    fn merge_batch(
        &mut self,
        values: &[ArrayRef],
        group_indices: &[usize],
        total_num_groups: usize,
    ) -> Result<()> {
        self.inner
            .merge_batch(values, group_indices, total_num_groups)
    }

    fn convert_to_state(
        &self,
        values: &[ArrayRef],
        opt_filter: Option<&BooleanArray>,
    ) -> Result<Vec<ArrayRef>> {
        self.inner
            .convert_to_state(&cast_all(values, &self.to)?, opt_filter)
    }

    fn size(&self) -> usize {
        self.inner.size()
    }
}

/// `sum`, replacing DataFusion's.
pub fn function() -> Arc<AggregateUDF> {
    Arc::new(AggregateUDF::new_from_impl(PgSum {
        inner: datafusion::functions_aggregate::sum::sum_udaf(),
        signature: Signature::user_defined(Volatility::Immutable),
    }))
}
