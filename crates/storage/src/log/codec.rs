//! Encoding of a [`ChangeBatch`] as a log payload: one Arrow IPC stream holding the rows plus a
//! trailing `eddy_diff` Int64 column. The schema travels with every record so that a record
//! stays readable after the table's definition changes.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, Int64Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::ipc::reader::StreamReader;
use arrow::ipc::writer::StreamWriter;
use eddy_common::{ChangeBatch, Error, Result, SqlState};

const DIFF_COLUMN: &str = "eddy_diff";

fn codec_error(context: &str, err: impl std::fmt::Display) -> Error {
    Error::new(SqlState::DATA_CORRUPTED, format!("log payload {context}: {err}"))
}

/// Serializes changes into a payload.
pub fn encode_changes(changes: &ChangeBatch) -> Result<Vec<u8>> {
    let rows = changes.rows();
    let mut fields: Vec<Arc<Field>> = rows.schema().fields().iter().cloned().collect();
    fields.push(Arc::new(Field::new(DIFF_COLUMN, DataType::Int64, false)));
    let schema = Arc::new(Schema::new(fields));
    let mut columns: Vec<ArrayRef> = rows.columns().to_vec();
    columns.push(Arc::new(changes.diffs().clone()));
    let batch = RecordBatch::try_new(Arc::clone(&schema), columns)
        .map_err(|e| Error::internal(format!("building log batch: {e}")))?;
    let mut out = Vec::new();
    let mut writer = StreamWriter::try_new(&mut out, &schema)
        .map_err(|e| Error::internal(format!("IPC writer: {e}")))?;
    writer.write(&batch).map_err(|e| Error::internal(format!("IPC write: {e}")))?;
    writer.finish().map_err(|e| Error::internal(format!("IPC finish: {e}")))?;
    drop(writer);
    Ok(out)
}

/// Deserializes a payload, labelling the rows with `schema` (the table's current schema,
/// whose column names and types must match what was written).
pub fn decode_changes(payload: &[u8], schema: &SchemaRef) -> Result<Vec<ChangeBatch>> {
    let reader = StreamReader::try_new(payload, None).map_err(|e| codec_error("header", e))?;
    let mut out = Vec::new();
    for batch in reader {
        let batch = batch.map_err(|e| codec_error("batch", e))?;
        let n = batch.num_columns();
        if n == 0 {
            return Err(codec_error("batch", "no diff column"));
        }
        let diffs = batch
            .column(n - 1)
            .as_any()
            .downcast_ref::<Int64Array>()
            .ok_or_else(|| codec_error("batch", "diff column is not Int64"))?
            .clone();
        if diffs.null_count() > 0 || diffs.values().contains(&0) {
            return Err(codec_error("batch", "diff column holds a null or a zero"));
        }
        let rows = RecordBatch::try_new(Arc::clone(schema), batch.columns()[..n - 1].to_vec())
            .map_err(|e| codec_error("rows do not match the table's schema", e))?;
        out.push(ChangeBatch::new(rows, diffs));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::StringArray;

    #[test]
    fn changes_round_trip() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Utf8, true),
        ]));
        let rows = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![
                Arc::new(Int64Array::from(vec![1, 2])),
                Arc::new(StringArray::from(vec![Some("a"), None])),
            ],
        )
        .unwrap();
        let changes = ChangeBatch::new(rows.clone(), Int64Array::from(vec![1, -1]));
        let payload = encode_changes(&changes).unwrap();
        let back = decode_changes(&payload, &schema).unwrap();
        assert_eq!(back.len(), 1);
        assert_eq!(back[0].rows(), &rows);
        assert_eq!(back[0].diffs(), &Int64Array::from(vec![1, -1]));
    }
}
