//! Changes, not rows: a batch of rows with a signed weight per row.
//!
//! `+1` inserts a row, `-1` retracts one; an update is `-old, +new`. A relation is the sum of
//! its changes. Invariant: `diffs.len() == rows.num_rows()` and no diff is zero.

use arrow::array::{Array, Int64Array, RecordBatch};
use arrow::datatypes::SchemaRef;

/// Rows plus one i64 weight per row.
#[derive(Debug, Clone)]
pub struct ChangeBatch {
    rows: RecordBatch,
    diffs: Int64Array,
}

impl ChangeBatch {
    /// Pairs rows with weights. Panics in debug builds if the lengths differ or a weight is 0.
    pub fn new(rows: RecordBatch, diffs: Int64Array) -> Self {
        assert_eq!(rows.num_rows(), diffs.len(), "one diff per row");
        debug_assert!(diffs.null_count() == 0 && diffs.values().iter().all(|d| *d != 0));
        ChangeBatch { rows, diffs }
    }

    /// Every row inserted once.
    pub fn inserts(rows: RecordBatch) -> Self {
        let diffs = Int64Array::from(vec![1; rows.num_rows()]);
        ChangeBatch { rows, diffs }
    }

    /// Every row retracted once.
    pub fn retractions(rows: RecordBatch) -> Self {
        let diffs = Int64Array::from(vec![-1; rows.num_rows()]);
        ChangeBatch { rows, diffs }
    }

    pub fn rows(&self) -> &RecordBatch {
        &self.rows
    }

    pub fn diffs(&self) -> &Int64Array {
        &self.diffs
    }

    pub fn schema(&self) -> SchemaRef {
        self.rows.schema()
    }

    pub fn len(&self) -> usize {
        self.rows.num_rows()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.num_rows() == 0
    }

    pub fn into_parts(self) -> (RecordBatch, Int64Array) {
        (self.rows, self.diffs)
    }

    /// Batches of one schema as one batch, in order (`None`: there are none).
    pub fn concat(batches: &[ChangeBatch]) -> crate::Result<Option<ChangeBatch>> {
        let Some(first) = batches.first() else {
            return Ok(None);
        };
        if batches.len() == 1 {
            return Ok(Some(first.clone()));
        }
        let rows =
            arrow::compute::concat_batches(&first.schema(), batches.iter().map(ChangeBatch::rows))
                .map_err(|e| crate::Error::internal(format!("concatenating changes: {e}")))?;
        let diffs: Int64Array = batches
            .iter()
            .flat_map(|b| b.diffs.values().iter().copied())
            .collect();
        Ok(Some(ChangeBatch { rows, diffs }))
    }
}
