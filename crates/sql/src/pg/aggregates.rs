//! Aggregates with PostgreSQL's result types: `avg` of integers and numerics is a numeric with
//! (at least) 16 decimals, as PostgreSQL prints `avg(x)` for values below 10,000 (DataFusion
//! gives integers a double and numerics 4 more decimals); `variance` is `var_samp`.
//!
//! The wrapper keeps DataFusion's accumulators (which retract exactly, so views maintain it
//! incrementally) and its name `avg`; only the argument coercion and the result type differ.

use std::sync::Arc;

use arrow::datatypes::{DataType, FieldRef};
use datafusion::common::Result;
use datafusion::functions_aggregate::average::Avg;
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::{Accumulator, AggregateUDF, AggregateUDFImpl, GroupsAccumulator, ReversedUDAF, Signature};

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
            DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64 | DataType::UInt8 | DataType::UInt16 | DataType::UInt32 | DataType::UInt64 => {
                DataType::Decimal128(20, 0)
            }
            DataType::Decimal128(..) | DataType::Duration(_) => t.clone(),
            DataType::Decimal32(p, s) | DataType::Decimal64(p, s) => DataType::Decimal128(*p, *s),
            DataType::Float16 | DataType::Float32 | DataType::Float64 | DataType::Null => DataType::Float64,
            other => return Err(crate::pg::udf::no_such_function("avg", std::slice::from_ref(other))),
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
        match self.return_type(&arg_fields.iter().map(|f| f.data_type().clone()).collect::<Vec<_>>())? {
            DataType::Decimal128(_, s) => Ok(std::sync::Arc::new(crate::pg::text::numeric_field_at_scale(s).with_name(self.name()))),
            other => Ok(std::sync::Arc::new(arrow::datatypes::Field::new(self.name(), other, true))),
        }
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        match arg_types.first() {
            Some(DataType::Decimal128(_, s)) => Ok(DataType::Decimal128(38, (*s).max(AVG_SCALE))),
            _ => self.inner.return_type(arg_types),
        }
    }

    fn accumulator(&self, acc_args: AccumulatorArgs<'_>) -> Result<Box<dyn Accumulator>> {
        self.inner.accumulator(acc_args)
    }

    fn state_fields(&self, args: StateFieldsArgs<'_>) -> Result<Vec<FieldRef>> {
        self.inner.state_fields(args)
    }

    fn groups_accumulator_supported(&self, args: AccumulatorArgs<'_>) -> bool {
        self.inner.groups_accumulator_supported(args)
    }

    fn create_groups_accumulator(&self, args: AccumulatorArgs<'_>) -> Result<Box<dyn GroupsAccumulator>> {
        self.inner.create_groups_accumulator(args)
    }

    fn create_sliding_accumulator(&self, args: AccumulatorArgs<'_>) -> Result<Box<dyn Accumulator>> {
        self.inner.create_sliding_accumulator(args)
    }

    fn reverse_expr(&self) -> ReversedUDAF {
        ReversedUDAF::Identical
    }
}

pub fn functions() -> Vec<Arc<AggregateUDF>> {
    let variance = datafusion::functions_aggregate::variance::var_samp_udaf().as_ref().clone().with_aliases(["variance"]);
    vec![Arc::new(AggregateUDF::new_from_impl(PgAvg { inner: Avg::new(), signature: Signature::user_defined(datafusion::logical_expr::Volatility::Immutable) })), Arc::new(variance)]
}
