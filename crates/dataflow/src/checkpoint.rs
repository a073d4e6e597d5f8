//! Operator state as Arrow batches, for checkpoints: [`crate::Dataflow::save`] hands every
//! operator's state as named batches to a [`Sink`] as it makes them (the engine's writes each
//! to a file at once, so a save holds about one batch however large the state);
//! [`crate::Dataflow::load`] puts them back into a freshly built copy of the same dataflow.
//! The engine writes and reads the batches; this crate never touches disk. This module holds
//! the helpers operators build their parts with.
//!
//! A part is named `<path>:<part>`, where the path is the operator's place in the plan (`0`,
//! `0.1`, as in `eddy_operators`) and, for a sharded operator, `<path>#<shard>:<part>`. Keys and rows are
//! stored in the operator's own row format (binary columns) next to plain columns for counts,
//! times and sums; scalars of an operator sit in the batch's schema metadata. Saving happens at
//! the end of an epoch, when nothing is held back in flight.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BinaryArray, Int64Array, RecordBatch};
use arrow::datatypes::{Field, Int64Type, Schema};
use arrow::row::{OwnedRow, RowConverter};
use eddy_common::{ChangeBatch, Error, Result};

use crate::rows::arrow_error;

/// Where a save puts the batches of state it makes, each under its part's name.
pub trait Sink {
    fn put(&mut self, part: &str, batch: RecordBatch) -> Result<()>;

    /// Takes work the save leaves to be done after it returned, off the thread that runs the
    /// operators (an arrangement's spilled rows, read from a snapshot of the spill store taken
    /// at the save): `job` puts more batches, after those of the same part the save put. The
    /// save is complete once every deferred job ran.
    fn defer(&mut self, job: Deferred) -> Result<()>;
}

/// Work a save leaves to be done after it returned ([`Sink::defer`]).
pub type Deferred = Box<dyn FnOnce(&mut dyn Sink) -> Result<()> + Send>;

/// Collected in memory (tests, and small saves); deferred work runs at once.
impl Sink for Vec<(String, RecordBatch)> {
    fn put(&mut self, part: &str, batch: RecordBatch) -> Result<()> {
        self.push((part.to_owned(), batch));
        Ok(())
    }

    fn defer(&mut self, job: Deferred) -> Result<()> {
        job(self)
    }
}

/// Tests' sink that keeps what a save defers, to run it later (as the engine's checkpoint
/// writer does, while the operators go on).
#[cfg(test)]
#[derive(Default)]
pub(crate) struct Later {
    put: Vec<(String, RecordBatch)>,
    pub(crate) deferred: Vec<Deferred>,
}

#[cfg(test)]
impl Sink for Later {
    fn put(&mut self, part: &str, batch: RecordBatch) -> Result<()> {
        self.put.push((part.to_owned(), batch));
        Ok(())
    }

    fn defer(&mut self, job: Deferred) -> Result<()> {
        self.deferred.push(job);
        Ok(())
    }
}

#[cfg(test)]
impl Later {
    /// Runs what was deferred; every batch of the save, with its part's name.
    pub(crate) fn finish(mut self) -> Vec<(String, RecordBatch)> {
        for job in std::mem::take(&mut self.deferred) {
            job(&mut self.put).unwrap();
        }
        self.put
    }
}

/// A sink that names each part `<prefix>:<part>` (an operator's place in the dataflow).
pub(crate) struct Prefixed<'a> {
    pub prefix: String,
    pub out: &'a mut dyn Sink,
}

impl Sink for Prefixed<'_> {
    fn put(&mut self, part: &str, batch: RecordBatch) -> Result<()> {
        self.out.put(&format!("{}:{part}", self.prefix), batch)
    }

    fn defer(&mut self, job: Deferred) -> Result<()> {
        let prefix = self.prefix.clone();
        self.out
            .defer(Box::new(move |out| job(&mut Prefixed { prefix, out })))
    }
}

/// The schema metadata that marks a batch of an arrangement's changes since its last save
/// ([`crate::arrangement::SaveMode::Changes`]).
pub const CHANGES: &str = "eddy_changes";

/// Whether `batch` holds an arrangement's changes since its last save, to be loaded after the
/// batches of that save (rather than all of its state).
pub fn is_changes(batch: &RecordBatch) -> bool {
    batch.schema().metadata().contains_key(CHANGES)
}

/// The column of a saved change batch that holds each row's weight.
const DIFF: &str = "eddy_diff";

/// The error of an operator handed a part it does not have.
pub(crate) fn unknown_part(operator: &str, name: &str) -> Error {
    Error::internal(format!("{operator} has no checkpointed state named {name}"))
}

/// A batch of nullable columns, with scalars in its schema metadata.
pub(crate) fn part<S: AsRef<str>>(
    columns: Vec<(S, ArrayRef)>,
    scalars: &[(&str, Option<i64>)],
) -> Result<RecordBatch> {
    let fields: Vec<Field> = columns
        .iter()
        .map(|(name, a)| Field::new(name.as_ref(), a.data_type().clone(), true))
        .collect();
    let metadata = scalars
        .iter()
        .filter_map(|(k, v)| Some(((*k).to_owned(), (*v)?.to_string())))
        .collect();
    let schema = Arc::new(Schema::new(fields).with_metadata(metadata));
    let arrays = columns.into_iter().map(|(_, a)| a).collect();
    RecordBatch::try_new(schema, arrays).map_err(arrow_error)
}

/// A scalar saved by [`part`].
pub(crate) fn scalar(batch: &RecordBatch, name: &str) -> Result<Option<i64>> {
    match batch.schema().metadata().get(name) {
        None => Ok(None),
        Some(v) => v.parse().map(Some).map_err(|_| {
            Error::internal(format!("checkpointed scalar {name} is not a number: {v}"))
        }),
    }
}

pub(crate) fn binary<'a>(values: impl IntoIterator<Item = &'a [u8]>) -> ArrayRef {
    Arc::new(BinaryArray::from_iter_values(values))
}

pub(crate) fn optional_binary<'a>(values: impl IntoIterator<Item = Option<&'a [u8]>>) -> ArrayRef {
    Arc::new(BinaryArray::from_iter(values))
}

pub(crate) fn int64s(values: impl IntoIterator<Item = i64>) -> ArrayRef {
    Arc::new(Int64Array::from_iter_values(values))
}

pub(crate) fn column<'a>(batch: &'a RecordBatch, name: &str) -> Result<&'a ArrayRef> {
    batch
        .column_by_name(name)
        .ok_or_else(|| Error::internal(format!("checkpointed state lacks column {name}")))
}

pub(crate) fn binary_column<'a>(batch: &'a RecordBatch, name: &str) -> Result<&'a BinaryArray> {
    column(batch, name)?
        .as_binary_opt::<i32>()
        .ok_or_else(|| Error::internal(format!("checkpointed column {name} is not binary")))
}

pub(crate) fn int64_column<'a>(batch: &'a RecordBatch, name: &str) -> Result<&'a Int64Array> {
    column(batch, name)?
        .as_primitive_opt::<Int64Type>()
        .ok_or_else(|| Error::internal(format!("checkpointed column {name} is not BIGINT")))
}

/// The rows of a binary column in `converter`'s row format (NULL: `None`).
pub(crate) fn rows_of(converter: &RowConverter, values: &BinaryArray) -> Vec<Option<OwnedRow>> {
    let parser = converter.parser();
    values
        .iter()
        .map(|v| v.map(|bytes| parser.parse(bytes).owned()))
        .collect()
}

/// The values whose row format a binary column `column` of `batch` holds (in `converter`'s
/// format, no NULLs), as columns: a part's keys, to route its rows ([`crate::graph::Handler::part_keys`]).
pub(crate) fn key_columns(
    converter: &RowConverter,
    batch: &RecordBatch,
    column: &str,
) -> Result<Option<Vec<ArrayRef>>> {
    let rows = required_rows(converter, binary_column(batch, column)?)?;
    converter
        .convert_rows(rows.iter().map(OwnedRow::row))
        .map(Some)
        .map_err(arrow_error)
}

/// The rows of a binary column that has no NULLs.
pub(crate) fn required_rows(
    converter: &RowConverter,
    values: &BinaryArray,
) -> Result<Vec<OwnedRow>> {
    rows_of(converter, values)
        .into_iter()
        .map(|r| r.ok_or_else(|| Error::internal("a checkpointed row is NULL")))
        .collect()
}

/// Change batches (non-empty, of one schema) as one batch: their columns and `eddy_diff`.
pub(crate) fn changes_part(changes: &[ChangeBatch]) -> Result<Option<RecordBatch>> {
    let Some((rows, diffs)) = ChangeBatch::concat(changes)?.map(ChangeBatch::into_parts) else {
        return Ok(None);
    };
    let mut columns = rows.columns().to_vec();
    columns.push(Arc::new(diffs));
    RecordBatch::try_new(with_diff(&rows.schema()), columns)
        .map(Some)
        .map_err(arrow_error)
}

/// `schema` and the weight column of a saved change batch.
fn with_diff(schema: &arrow::datatypes::SchemaRef) -> arrow::datatypes::SchemaRef {
    let mut fields: Vec<Arc<Field>> = schema.fields().iter().cloned().collect();
    fields.push(Arc::new(Field::new(
        DIFF,
        arrow::datatypes::DataType::Int64,
        false,
    )));
    Arc::new(Schema::new(fields))
}

/// Change batches of rows of `schema` as one batch tagged as changes since the last save
/// ([`is_changes`]; a view's contents, [`changes_of`] reads it back); one without rows when
/// there are none.
pub fn saved_changes(
    schema: &arrow::datatypes::SchemaRef,
    changes: &[ChangeBatch],
) -> Result<RecordBatch> {
    let batch = match changes_part(changes)? {
        Some(batch) => batch,
        None => RecordBatch::new_empty(with_diff(schema)),
    };
    let tag = [(CHANGES.to_owned(), "1".to_owned())].into_iter().collect();
    let schema = Arc::new(batch.schema().as_ref().clone().with_metadata(tag));
    batch.with_schema(schema).map_err(arrow_error)
}

/// The change batch saved by [`changes_part`] or [`saved_changes`].
pub fn changes_of(batch: &RecordBatch) -> Result<ChangeBatch> {
    let diffs = int64_column(batch, DIFF)?.clone();
    let n = batch.num_columns().saturating_sub(1);
    let schema = Arc::new(Schema::new(batch.schema().fields()[..n].to_vec()));
    let rows = RecordBatch::try_new_with_options(
        schema,
        batch.columns()[..n].to_vec(),
        &arrow::array::RecordBatchOptions::new().with_row_count(Some(batch.num_rows())),
    )
    .map_err(arrow_error)?;
    Ok(ChangeBatch::new(rows, diffs))
}

/// Whether a column holds a value at `i` (the column may be absent from older parts).
pub(crate) fn value_at(values: &Int64Array, i: usize) -> Option<i64> {
    values.is_valid(i).then(|| values.value(i))
}
