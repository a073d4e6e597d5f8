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
    // Eddy's own functions (crates/sql/src/pg) raise Eddy errors with their SQLSTATE.
    if let DataFusionError::External(e) = &err
        && let Some(ours) = e.downcast_ref::<Error>()
    {
        return ours.clone();
    }
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
    expr.evaluate(batch)
        .and_then(|v| v.into_array(batch.num_rows()))
        .map_err(eval_error)
}

/// The key columns of `batch` (group, join, partition and shard keys), with floats as
/// PostgreSQL compares them: `-0` is `0` and every NaN is one NaN, so that they group, join and
/// route together (their row encodings and hashes would otherwise differ).
pub fn evaluate_keys(exprs: &[Expr], batch: &RecordBatch) -> Result<Vec<ArrayRef>> {
    exprs
        .iter()
        .map(|e| evaluate(e, batch).map(normalize_key))
        .collect()
}

pub(crate) fn normalize_key(column: ArrayRef) -> ArrayRef {
    use arrow::array::AsArray;
    use arrow::datatypes::{Float32Type, Float64Type};
    match column.data_type() {
        arrow::datatypes::DataType::Float64 => {
            let floats = column.as_primitive::<Float64Type>();
            if floats.values().iter().all(|v| {
                v.to_bits() != (-0.0f64).to_bits()
                    && (!v.is_nan() || v.to_bits() == f64::NAN.to_bits())
            }) {
                return column;
            }
            Arc::new(floats.unary::<_, Float64Type>(|v| {
                if v == 0.0 {
                    0.0
                } else if v.is_nan() {
                    f64::NAN
                } else {
                    v
                }
            }))
        }
        arrow::datatypes::DataType::Float32 => {
            let floats = column.as_primitive::<Float32Type>();
            if floats.values().iter().all(|v| {
                v.to_bits() != (-0.0f32).to_bits()
                    && (!v.is_nan() || v.to_bits() == f32::NAN.to_bits())
            }) {
                return column;
            }
            Arc::new(floats.unary::<_, Float32Type>(|v| {
                if v == 0.0 {
                    0.0
                } else if v.is_nan() {
                    f32::NAN
                } else {
                    v
                }
            }))
        }
        _ => column,
    }
}

/// The hash that picks a keyed table's log partition for each row: DataFusion's
/// `create_hashes`, seed 0. It is persisted routing too (a key's changes must stay in one
/// partition across restarts), so it stays as the logs were written until tables record a
/// routing version; new sharded state uses [`crate::route::hash_keys`].
fn partition_hashes(keys: &[ArrayRef], rows: usize) -> Result<Vec<u64>> {
    use datafusion::common::hash_utils::{RandomState, create_hashes};
    let mut hashes = vec![0u64; rows];
    create_hashes(keys, &RandomState::with_seed(0), &mut hashes)
        .map_err(|e| Error::internal(format!("hashing keys: {e}")))?;
    Ok(hashes)
}

/// Splits changes by a hash of `key` columns into `partitions` parts (the partition index is
/// the position in the result; empty parts are empty batches). Equal keys always land in the
/// same part, so a row's retraction follows its insert; the hash is fixed (not seeded per
/// process), so routing is the same after a restart.
pub fn partition_by_key(
    changes: &ChangeBatch,
    key: &[usize],
    partitions: u32,
) -> Result<Vec<ChangeBatch>> {
    let n = partitions.max(1);
    if n == 1 {
        return Ok(vec![changes.clone()]);
    }
    let columns: Vec<ArrayRef> = key
        .iter()
        .map(|&i| Arc::clone(changes.rows().column(i)))
        .collect();
    let hashes = partition_hashes(&columns, changes.len())?;
    let part: Vec<u32> = hashes.iter().map(|h| (h % u64::from(n)) as u32).collect();
    split_by(changes, &part, n as usize)
}

/// Splits changes into `parts` batches: row i goes to part `part[i]`.
pub fn split_by(changes: &ChangeBatch, part: &[u32], parts: usize) -> Result<Vec<ChangeBatch>> {
    let mut indices: Vec<Vec<u32>> = (0..parts)
        .map(|_| Vec::with_capacity(changes.len() / parts.max(1) + 1))
        .collect();
    for (i, p) in part.iter().enumerate() {
        indices[*p as usize].push(i as u32);
    }
    indices
        .into_iter()
        .map(|rows| {
            let rows = UInt32Array::from(rows);
            let columns = take_columns(changes.rows().columns(), &rows)?;
            let diffs = take(changes.diffs(), &rows, None).map_err(arrow_error)?;
            let diffs = diffs
                .as_any()
                .downcast_ref::<Int64Array>()
                .cloned()
                .ok_or_else(|| Error::internal("diffs are not Int64"))?;
            Ok(ChangeBatch::new(
                batch_of(&changes.rows().schema(), columns, rows.len())?,
                diffs,
            ))
        })
        .collect()
}

/// Evaluates `exprs` over every row of `changes`. When a row's values make an expression fail
/// (division by zero, a failed cast: a data exception), that row is set aside — recorded in
/// `failures` with its error, as a dead letter of the view — and the others are evaluated
/// again; other errors are bugs and fail the batch. Returns the rows kept and the values.
pub fn evaluate_or_set_aside(
    exprs: &[&Expr],
    changes: ChangeBatch,
    failures: &crate::EventTime,
) -> Result<(ChangeBatch, Vec<ArrayRef>)> {
    let all = exprs
        .iter()
        .map(|e| evaluate(e, changes.rows()))
        .collect::<Result<Vec<_>>>();
    match all {
        Ok(values) => return Ok((changes, values)),
        Err(e) if !e.state.is_data_exception() => return Err(e),
        Err(_) => {}
    }
    let mut keep = Vec::with_capacity(changes.len());
    let mut failed = Vec::new();
    for i in 0..changes.len() {
        let row = changes.rows().slice(i, 1);
        match exprs.iter().try_for_each(|e| evaluate(e, &row).map(|_| ())) {
            Ok(()) => keep.push(true),
            Err(e) if e.state.is_data_exception() => {
                keep.push(false);
                failed.push((crate::event_time::row_json(changes.rows(), i), e.message));
            }
            Err(e) => return Err(e),
        }
    }
    failures.record_failed(failed);
    let kept = filter_changes(&changes, &BooleanArray::from(keep))?;
    let values = exprs
        .iter()
        .map(|e| evaluate(e, kept.rows()))
        .collect::<Result<Vec<_>>>()?;
    Ok((kept, values))
}

/// Keeps the rows (and their weights) where `mask` is true.
pub fn filter_changes(changes: &ChangeBatch, mask: &BooleanArray) -> Result<ChangeBatch> {
    let rows = filter_record_batch(changes.rows(), mask).map_err(arrow_error)?;
    let diffs = arrow::compute::filter(changes.diffs(), mask).map_err(arrow_error)?;
    let diffs = diffs
        .as_any()
        .downcast_ref::<Int64Array>()
        .cloned()
        .ok_or_else(|| Error::internal("diffs are not Int64"))?;
    Ok(ChangeBatch::new(rows, diffs))
}

/// Gathers the rows at `indices` of `columns`.
pub fn take_columns(columns: &[ArrayRef], indices: &UInt32Array) -> Result<Vec<ArrayRef>> {
    columns
        .iter()
        .map(|c| take(c.as_ref(), indices, None).map_err(arrow_error))
        .collect()
}

/// Like [`batch`], for operators whose output may have no columns at all (`count(*)` reads no
/// column), where the row count cannot be inferred.
pub fn batch_of(schema: &SchemaRef, columns: Vec<ArrayRef>, rows: usize) -> Result<RecordBatch> {
    let options = arrow::array::RecordBatchOptions::new().with_row_count(Some(rows));
    RecordBatch::try_new_with_options(Arc::clone(schema), columns, &options).map_err(arrow_error)
}

/// A batch with every field nullable, so that operators never trip over nullability claims a
/// logical plan made about values that retractions may still carry.
pub fn batch(schema: &SchemaRef, columns: Vec<ArrayRef>) -> Result<RecordBatch> {
    RecordBatch::try_new(Arc::clone(schema), columns).map_err(arrow_error)
}

/// Sums the weights of equal rows and drops rows whose weight is zero (first-seen order).
/// Rows stay in their batches' row format; a hash table of (batch, row) slots finds equal
/// ones, so nothing is allocated per row.
pub fn consolidate(schema: &SchemaRef, batches: &[ChangeBatch]) -> Result<Option<ChangeBatch>> {
    use arrow::row::{RowConverter, SortField};
    use std::hash::BuildHasher;
    if batches.iter().all(|b| b.is_empty()) {
        return Ok(None);
    }
    let fields = schema
        .fields()
        .iter()
        .map(|f| SortField::new(f.data_type().clone()))
        .collect();
    let converter = RowConverter::new(fields).map_err(arrow_error)?;
    let converted = batches
        .iter()
        .map(|b| converter.convert_columns(b.rows().columns()))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(arrow_error)?;
    let row = |(b, r): (u32, u32)| converted[b as usize].row(r as usize);
    let hasher = foldhash::fast::RandomState::default();
    let mut table: hashbrown::HashTable<usize> = hashbrown::HashTable::new();
    // First-seen (batch, row) of each distinct row, and its summed weight.
    let mut slots: Vec<(u32, u32)> = Vec::new();
    let mut weights: Vec<i64> = Vec::new();
    for (b, batch) in batches.iter().enumerate() {
        for (r, d) in batch.diffs().values().iter().enumerate() {
            let at = (b as u32, r as u32);
            let bytes = row(at);
            let hash = hasher.hash_one(bytes.as_ref());
            match table.find(hash, |&slot| row(slots[slot]) == bytes) {
                Some(&slot) => weights[slot] += d,
                None => {
                    let slot = slots.len();
                    slots.push(at);
                    weights.push(*d);
                    table.insert_unique(hash, slot, |&s| hasher.hash_one(row(slots[s]).as_ref()));
                }
            }
        }
    }
    let kept: Vec<usize> = (0..slots.len()).filter(|s| weights[*s] != 0).collect();
    if kept.is_empty() {
        return Ok(None);
    }
    let diffs: Vec<i64> = kept.iter().map(|s| weights[*s]).collect();
    let columns = converter
        .convert_rows(kept.iter().map(|s| row(slots[*s])))
        .map_err(arrow_error)?;
    Ok(Some(ChangeBatch::new(
        batch(schema, columns)?,
        Int64Array::from(diffs),
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Array, Int32Array};
    use arrow::datatypes::{DataType, Field, Schema};

    #[test]
    fn consolidation_nets_weights() {
        let schema: SchemaRef = Arc::new(Schema::new(vec![Field::new("x", DataType::Int32, true)]));
        let b = |xs: Vec<Option<i32>>, ds: Vec<i64>| {
            ChangeBatch::new(
                batch(&schema, vec![Arc::new(Int32Array::from(xs))]).unwrap(),
                Int64Array::from(ds),
            )
        };
        let out = consolidate(
            &schema,
            &[
                b(vec![Some(1), Some(2), None], vec![1, 1, 2]),
                b(vec![Some(1), None], vec![-1, 1]),
            ],
        )
        .unwrap()
        .unwrap();
        assert_eq!(out.len(), 2);
        assert_eq!(out.diffs().values().to_vec(), vec![1, 3]);
        assert!(
            consolidate(
                &schema,
                &[b(vec![Some(1)], vec![1]), b(vec![Some(1)], vec![-1])]
            )
            .unwrap()
            .is_none()
        );
    }

    /// A row of the consolidation test and its weight.
    type Weighted = ((Option<i32>, Option<String>), i64);

    proptest::proptest! {
        /// Consolidation equals a map from rows to summed weights (rows as (Option<i32>,
        /// Option<String>), weights that cancel out included), in first-seen order.
        #[test]
        fn consolidation_equals_a_map_of_weights(
            batches in proptest::collection::vec(
                proptest::collection::vec(
                    (proptest::option::of(0..4i32), proptest::option::of("[ab]{0,2}"), proptest::prop_oneof![-2..0i64, 1..3i64]),
                    0..20,
                ),
                1..5,
            )
        ) {
            let schema: SchemaRef = Arc::new(Schema::new(vec![
                Field::new("x", DataType::Int32, true),
                Field::new("s", DataType::Utf8, true),
            ]));
            let changes: Vec<ChangeBatch> = batches
                .iter()
                .map(|rows| {
                    let xs: Vec<Option<i32>> = rows.iter().map(|r| r.0).collect();
                    let ss: Vec<Option<&str>> = rows.iter().map(|r| r.1.as_deref()).collect();
                    let ds: Vec<i64> = rows.iter().map(|r| r.2).collect();
                    ChangeBatch::new(
                        batch(
                            &schema,
                            vec![
                                Arc::new(Int32Array::from(xs)),
                                Arc::new(arrow::array::StringArray::from(ss)),
                            ],
                        )
                        .unwrap(),
                        Int64Array::from(ds),
                    )
                })
                .collect();
            let mut order = Vec::new();
            let mut model = std::collections::HashMap::new();
            for (x, s, d) in batches.iter().flatten() {
                let key = (*x, s.clone());
                if !model.contains_key(&key) {
                    order.push(key.clone());
                }
                *model.entry(key).or_insert(0i64) += d;
            }
            let want: Vec<Weighted> = order
                .into_iter()
                .filter_map(|k| {
                    let d = model[&k];
                    (d != 0).then_some((k, d))
                })
                .collect();
            let got: Vec<Weighted> = match consolidate(&schema, &changes).unwrap() {
                None => Vec::new(),
                Some(out) => {
                    let rows = out.rows();
                    let xs = rows.column(0).as_any().downcast_ref::<Int32Array>().unwrap();
                    let ss = rows
                        .column(1)
                        .as_any()
                        .downcast_ref::<arrow::array::StringArray>()
                        .unwrap();
                    (0..out.len())
                        .map(|i| {
                            let x = (!xs.is_null(i)).then(|| xs.value(i));
                            let s = (!ss.is_null(i)).then(|| ss.value(i).to_owned());
                            ((x, s), out.diffs().value(i))
                        })
                        .collect()
                }
            };
            proptest::prop_assert_eq!(got, want);
        }
    }
}
