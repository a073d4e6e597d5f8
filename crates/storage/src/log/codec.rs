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
/// Schema metadata naming where in its source a connector-fed record ends: `p:o,p:o,...`
/// (source partition, next offset). Written in the same record as the rows, so the log says
/// exactly how far a connector got.
const POSITIONS_KEY: &str = "eddy.source_positions";
/// Schema metadata of a watermark mark: a record without rows saying that the stream's
/// watermark rose to this value (µs) here, for a reason the data does not show (a partition went
/// idle). Replays and backfills read it where it stands among the commits, so they judge every
/// row as the live views did.
const WATERMARK_KEY: &str = "eddy.watermark";

fn codec_error(context: &str, err: impl std::fmt::Display) -> Error {
    Error::new(
        SqlState::DATA_CORRUPTED,
        format!("log payload {context}: {err}"),
    )
}

/// Serializes changes into a payload.
pub fn encode_changes(changes: &ChangeBatch) -> Result<Vec<u8>> {
    encode_changes_at(changes, &[])
}

/// Serializes changes read by a connector, with the source positions they reach.
pub fn encode_changes_at(changes: &ChangeBatch, positions: &[(u32, u64)]) -> Result<Vec<u8>> {
    let mut metadata = std::collections::HashMap::new();
    if !positions.is_empty() {
        let text: Vec<String> = positions.iter().map(|(p, o)| format!("{p}:{o}")).collect();
        metadata.insert(POSITIONS_KEY.to_owned(), text.join(","));
    }
    encode_with(changes, metadata)
}

/// A watermark mark for a stream with rows of `schema` ([`WATERMARK_KEY`]).
pub fn encode_watermark(schema: &SchemaRef, watermark_micros: i64) -> Result<Vec<u8>> {
    let metadata =
        std::collections::HashMap::from([(WATERMARK_KEY.to_owned(), watermark_micros.to_string())]);
    encode_with(
        &ChangeBatch::inserts(RecordBatch::new_empty(Arc::clone(schema))),
        metadata,
    )
}

/// The watermark a mark record carries (`None` for a record of changes).
pub fn decode_watermark(payload: &[u8]) -> Result<Option<i64>> {
    let reader = StreamReader::try_new(payload, None).map_err(|e| codec_error("header", e))?;
    match reader.schema().metadata().get(WATERMARK_KEY) {
        Some(text) => text
            .parse()
            .map(Some)
            .map_err(|e| codec_error("watermark", e)),
        None => Ok(None),
    }
}

fn encode_with(
    changes: &ChangeBatch,
    metadata: std::collections::HashMap<String, String>,
) -> Result<Vec<u8>> {
    let rows = changes.rows();
    let mut fields: Vec<Arc<Field>> = rows.schema().fields().iter().cloned().collect();
    fields.push(Arc::new(Field::new(DIFF_COLUMN, DataType::Int64, false)));
    let schema = Arc::new(Schema::new(fields).with_metadata(metadata));
    let mut columns: Vec<ArrayRef> = rows.columns().to_vec();
    columns.push(Arc::new(changes.diffs().clone()));
    let batch = RecordBatch::try_new(Arc::clone(&schema), columns)
        .map_err(|e| Error::internal(format!("building log batch: {e}")))?;
    let mut out = Vec::new();
    let mut writer = StreamWriter::try_new(&mut out, &schema)
        .map_err(|e| Error::internal(format!("IPC writer: {e}")))?;
    writer
        .write(&batch)
        .map_err(|e| Error::internal(format!("IPC write: {e}")))?;
    writer
        .finish()
        .map_err(|e| Error::internal(format!("IPC finish: {e}")))?;
    drop(writer);
    Ok(out)
}

/// The source positions a record reaches (empty for records not written by a connector).
pub fn decode_positions(payload: &[u8]) -> Result<Vec<(u32, u64)>> {
    let reader = StreamReader::try_new(payload, None).map_err(|e| codec_error("header", e))?;
    let Some(text) = reader.schema().metadata().get(POSITIONS_KEY).cloned() else {
        return Ok(Vec::new());
    };
    text.split(',')
        .map(|pair| {
            let (p, o) = pair
                .split_once(':')
                .ok_or_else(|| codec_error("positions", pair))?;
            Ok((
                p.parse().map_err(|e| codec_error("positions", e))?,
                o.parse().map_err(|e| codec_error("positions", e))?,
            ))
        })
        .collect()
}

/// Deserializes a payload, labelling the rows with `schema` (the table's current schema,
/// whose column names and types must match what was written; columns added since read as NULL).
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
        let mut columns = batch.columns()[..n - 1].to_vec();
        // Columns added to the table after this record was written read as NULL.
        for field in schema.fields().iter().skip(columns.len()) {
            columns.push(arrow::array::new_null_array(
                field.data_type(),
                batch.num_rows(),
            ));
        }
        let rows = RecordBatch::try_new(Arc::clone(schema), columns)
            .map_err(|e| codec_error("rows do not match the table's schema", e))?;
        out.push(ChangeBatch::new(rows, diffs));
    }
    Ok(out)
}

/// The rows of a record of inserts, only the columns of `schema` (the table's) that
/// `projection` picks, in its order (all when `None`), labelled with `target`; columns the
/// record predates read as NULL. The other columns are skipped, not decoded. Weights are not
/// read: this is for an append-only table, whose records hold inserts only.
pub fn decode_rows(
    payload: &[u8],
    schema: &SchemaRef,
    projection: Option<&[usize]>,
    target: &SchemaRef,
) -> Result<Vec<RecordBatch>> {
    let header = StreamReader::try_new(payload, None).map_err(|e| codec_error("header", e))?;
    // The record's own columns, without its trailing diff column.
    let stored = header.schema().fields().len().saturating_sub(1);
    drop(header);
    let wanted: Vec<usize> = match projection {
        Some(p) => p.to_vec(),
        None => (0..schema.fields().len()).collect(),
    };
    if let Some(&i) = wanted.iter().find(|&&i| i >= schema.fields().len()) {
        return Err(Error::internal(format!(
            "no column {i} to read from the log"
        )));
    }
    // Decode each stored column once, in the record's order; an empty projection still
    // decodes the diff column to learn how many rows there are.
    let mut read: Vec<usize> = wanted.iter().copied().filter(|&i| i < stored).collect();
    read.sort_unstable();
    read.dedup();
    let counted = read.is_empty();
    if counted {
        read.push(stored);
    }
    let reader =
        StreamReader::try_new(payload, Some(read.clone())).map_err(|e| codec_error("header", e))?;
    let mut out = Vec::new();
    for batch in reader {
        let batch = batch.map_err(|e| codec_error("batch", e))?;
        let rows = batch.num_rows();
        let columns = wanted
            .iter()
            .map(|&i| match read.binary_search(&i) {
                Ok(at) if !counted => Arc::clone(batch.column(at)),
                _ => arrow::array::new_null_array(schema.field(i).data_type(), rows),
            })
            .collect::<Vec<_>>();
        let options = arrow::array::RecordBatchOptions::new().with_row_count(Some(rows));
        out.push(
            RecordBatch::try_new_with_options(Arc::clone(target), columns, &options)
                .map_err(|e| codec_error("rows do not match the table's schema", e))?,
        );
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
        assert!(decode_positions(&payload).unwrap().is_empty());
        let payload = encode_changes_at(&changes, &[(0, 42), (3, 7)]).unwrap();
        assert_eq!(decode_positions(&payload).unwrap(), vec![(0, 42), (3, 7)]);
        assert_eq!(decode_changes(&payload, &schema).unwrap()[0].rows(), &rows);
        assert_eq!(decode_watermark(&payload).unwrap(), None);
        let mark = encode_watermark(&schema, -17).unwrap();
        assert_eq!(decode_watermark(&mark).unwrap(), Some(-17));
        assert!(
            decode_changes(&mark, &schema)
                .unwrap()
                .iter()
                .all(ChangeBatch::is_empty)
        );
        assert!(decode_positions(&mark).unwrap().is_empty());
    }
    #[test]
    fn rows_decode_only_the_columns_asked_for() {
        let old = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Utf8, true),
        ]));
        let rows = RecordBatch::try_new(
            Arc::clone(&old),
            vec![
                Arc::new(Int64Array::from(vec![1, 2])),
                Arc::new(StringArray::from(vec![Some("a"), None])),
            ],
        )
        .unwrap();
        let payload = encode_changes(&ChangeBatch::inserts(rows.clone())).unwrap();
        // The table gained a column after this record was written.
        let mut fields = old.fields().to_vec();
        fields.push(Arc::new(Field::new("added", DataType::Int64, true)));
        let table = Arc::new(Schema::new(fields));
        let read = |projection: Option<&[usize]>| {
            let target = Arc::new(match projection {
                Some(p) => table.project(p).unwrap(),
                None => table.as_ref().clone(),
            });
            let out = decode_rows(&payload, &table, projection, &target).unwrap();
            assert_eq!(out.len(), 1);
            assert_eq!(out[0].schema(), target);
            out.into_iter().next().unwrap()
        };
        let all = read(None);
        assert_eq!(all.columns()[..2], rows.columns()[..]);
        assert_eq!(all.column(2).null_count(), 2);
        let picked = read(Some(&[1, 2, 0, 1]));
        assert_eq!(picked.column(0), rows.column(1));
        assert_eq!(picked.column(2), rows.column(0));
        assert_eq!(picked.column(3), rows.column(1));
        assert_eq!(picked.column(1).null_count(), 2);
        let none = read(Some(&[]));
        assert_eq!((none.num_rows(), none.num_columns()), (2, 0));
        assert_eq!(read(Some(&[2])).column(0).null_count(), 2);
        assert!(decode_rows(&payload, &table, Some(&[3]), &table).is_err());
        let mark = encode_watermark(&old, 5).unwrap();
        assert!(
            decode_rows(
                &mark,
                &table,
                Some(&[0]),
                &Arc::new(table.project(&[0]).unwrap())
            )
            .unwrap()
            .iter()
            .all(|b| b.num_rows() == 0)
        );
    }
}
