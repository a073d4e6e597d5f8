//! Sinks: where a materialized view's changes go (ADR 0008).
//!
//! The engine hands a sink one [`SinkWrite`] per epoch: the epoch's consolidated changes, or,
//! after a restart or for a new sink, the view's whole contents to make the target equal to.
//! Each connector makes both exactly-once in its own way:
//! - [`postgres`]: each epoch and the sink's progress in one PostgreSQL transaction; whole
//!   contents replace the table's in one transaction.
//! - [`kafka`]: records keyed by the view's key (`FORMAT UPSERT | DEBEZIUM ENCODE JSON`); whole
//!   contents are reconciled with what the topic holds (read back), producing only the keys
//!   that differ.
//! - [`file`]: JSON lines with a weight per row, one file per range of epochs, written under a
//!   temporary name and renamed; whole contents are reconciled with what the files hold.
//!
//! Deciding *when* whole contents are needed (the progress a sink recorded against the
//! checkpoint the view restarted from) is the engine's part (`engine/src/sink.rs`).

pub mod file;
pub mod kafka;
pub mod postgres;

use arrow::array::RecordBatch;
use arrow_json::writer::{LineDelimited, WriterBuilder};
use eddy_common::{ChangeBatch, Error, Result};

/// What to write for one epoch.
#[derive(Debug, Clone)]
pub enum SinkWrite {
    /// The epoch's consolidated changes (`None`: nothing changed, only progress).
    Changes(Option<ChangeBatch>),
    /// Make the target equal to the view's contents (rows with their multiplicity as weights).
    Replace(Option<ChangeBatch>),
}

/// The progress a sink recorded with its last committed epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SinkProgress {
    pub epoch: u64,
    /// The view's read offsets then, as the engine encoded them.
    pub offsets: String,
}

/// `batch` as JSON lines: one object per row, nulls written out, each ending in `\n`.
pub(crate) fn json_lines(batch: &RecordBatch) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(batch.num_rows() * 64);
    let mut writer = WriterBuilder::new()
        .with_explicit_nulls(true)
        .build::<_, LineDelimited>(&mut out);
    writer
        .write(batch)
        .map_err(|e| Error::internal(format!("encoding rows as JSON: {e}")))?;
    writer
        .finish()
        .map_err(|e| Error::internal(format!("encoding rows as JSON: {e}")))?;
    drop(writer);
    Ok(out)
}

/// The lines of [`json_lines`] output, without their `\n` (JSON escapes newlines in strings).
pub(crate) fn split_lines(lines: &[u8]) -> impl Iterator<Item = &[u8]> {
    lines.split(|b| *b == b'\n').filter(|l| !l.is_empty())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Int64Array, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};

    use super::*;

    #[test]
    fn json_lines_write_nulls_and_escape_newlines() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, true),
            Field::new("s", DataType::Utf8, true),
        ]));
        let batch = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from(vec![Some(1), None])),
                Arc::new(StringArray::from(vec![Some("a\nb"), None])),
            ],
        )
        .unwrap();
        let out = json_lines(&batch).unwrap();
        let lines: Vec<&[u8]> = split_lines(&out).collect();
        assert_eq!(
            lines,
            vec![
                &br#"{"k":1,"s":"a\nb"}"#[..],
                &br#"{"k":null,"s":null}"#[..]
            ]
        );
    }
}
