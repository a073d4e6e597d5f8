//! Small batch helpers shared by operators.

use std::sync::Arc;

use arrow::array::{ArrayRef, BooleanArray, Int64Array, RecordBatch, UInt32Array};
use arrow::compute::{filter_record_batch, take};
use arrow::datatypes::SchemaRef;
use datafusion::error::DataFusionError;
use eddy_common::{ChangeBatch, Error, Result, SqlState};

use crate::plan::Expr;

/// Classifies an evaluation error: a bad value in a row (division by zero, failed cast) is a
/// data exception; anything else is a bug.
pub fn eval_error(err: DataFusionError) -> Error {
    let message = err.to_string();
    let lower = message.to_lowercase();
    if lower.contains("divide by zero") || lower.contains("division by zero") {
        Error::new(SqlState::DIVISION_BY_ZERO, "division by zero")
    } else if lower.contains("cast") || lower.contains("overflow") || lower.contains("parse") {
        Error::new(SqlState::DATA_EXCEPTION, message)
    } else {
        Error::internal(format!("evaluating a view expression: {message}"))
    }
}

pub fn arrow_error(err: arrow::error::ArrowError) -> Error {
    Error::internal(format!("arrow: {err}"))
}

/// Evaluates an expression to an array over every row of `batch`.
pub fn evaluate(expr: &Expr, batch: &RecordBatch) -> Result<ArrayRef> {
    expr.evaluate(batch).and_then(|v| v.into_array(batch.num_rows())).map_err(eval_error)
}

/// Keeps the rows (and their weights) where `mask` is true.
pub fn filter_changes(changes: &ChangeBatch, mask: &BooleanArray) -> Result<ChangeBatch> {
    let rows = filter_record_batch(changes.rows(), mask).map_err(arrow_error)?;
    let diffs = arrow::compute::filter(changes.diffs(), mask).map_err(arrow_error)?;
    let diffs = diffs.as_any().downcast_ref::<Int64Array>().cloned().ok_or_else(|| Error::internal("diffs are not Int64"))?;
    Ok(ChangeBatch::new(rows, diffs))
}

/// Gathers the rows at `indices` of `columns`.
pub fn take_columns(columns: &[ArrayRef], indices: &UInt32Array) -> Result<Vec<ArrayRef>> {
    columns.iter().map(|c| take(c.as_ref(), indices, None).map_err(arrow_error)).collect()
}

/// A batch with every field nullable, so that operators never trip over nullability claims a
/// logical plan made about values that retractions may still carry.
pub fn batch(schema: &SchemaRef, columns: Vec<ArrayRef>) -> Result<RecordBatch> {
    RecordBatch::try_new(Arc::clone(schema), columns).map_err(arrow_error)
}
