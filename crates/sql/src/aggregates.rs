//! Aggregate functions where DataFusion's answer differs from PostgreSQL's and Eddy's own wraps
//! it. Registered over DataFusion's under the same names, so ad-hoc queries and views (which
//! use the same function objects) agree with PostgreSQL.
//!
//! - `min` / `max` of floats: PostgreSQL orders NaN above every number (`min` skips it unless
//!   every value is NaN, `max` returns it). DataFusion's ungrouped accumulators do the same,
//!   but its grouped ones (`GROUP BY`) let a NaN win both; the wrappers keep the ungrouped
//!   accumulator for float arguments.

use std::sync::Arc;

use arrow::datatypes::{DataType, FieldRef};
use datafusion::common::Result as DfResult;
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::{Accumulator, AggregateUDF, AggregateUDFImpl, GroupsAccumulator, ReversedUDAF, Signature};
use datafusion::prelude::SessionContext;

/// An aggregate that delegates everything to DataFusion's but its grouped accumulator for
/// float arguments.
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

    fn return_type(&self, arg_types: &[DataType]) -> DfResult<DataType> {
        self.inner.return_type(arg_types)
    }

    fn return_field(&self, arg_fields: &[FieldRef]) -> DfResult<FieldRef> {
        self.inner.return_field(arg_fields)
    }

    fn accumulator(&self, acc_args: AccumulatorArgs<'_>) -> DfResult<Box<dyn Accumulator>> {
        self.inner.accumulator(acc_args)
    }

    fn state_fields(&self, args: StateFieldsArgs<'_>) -> DfResult<Vec<FieldRef>> {
        self.inner.state_fields(args)
    }

    fn groups_accumulator_supported(&self, args: AccumulatorArgs<'_>) -> bool {
        !matches!(args.return_field.data_type(), DataType::Float16 | DataType::Float32 | DataType::Float64) && self.inner.groups_accumulator_supported(args)
    }

    fn create_groups_accumulator(&self, args: AccumulatorArgs<'_>) -> DfResult<Box<dyn GroupsAccumulator>> {
        self.inner.create_groups_accumulator(args)
    }

    fn create_sliding_accumulator(&self, args: AccumulatorArgs<'_>) -> DfResult<Box<dyn Accumulator>> {
        self.inner.create_sliding_accumulator(args)
    }

    fn reverse_expr(&self) -> ReversedUDAF {
        self.inner.reverse_udf()
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> DfResult<Vec<DataType>> {
        self.inner.coerce_types(arg_types)
    }

    fn is_descending(&self) -> Option<bool> {
        self.inner.is_descending()
    }

    fn value_from_stats(&self, statistics_args: &datafusion::logical_expr::StatisticsArgs<'_>) -> Option<datafusion::common::ScalarValue> {
        self.inner.value_from_stats(statistics_args)
    }

    fn default_value(&self, data_type: &DataType) -> DfResult<datafusion::common::ScalarValue> {
        self.inner.default_value(data_type)
    }
}

/// Registers Eddy's aggregates over DataFusion's.
pub fn register(ctx: &SessionContext) {
    for inner in [datafusion::functions_aggregate::min_max::min_udaf(), datafusion::functions_aggregate::min_max::max_udaf()] {
        ctx.register_udaf(AggregateUDF::new_from_impl(FloatsUngrouped { inner }));
    }
}
