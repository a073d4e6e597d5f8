//! `COPY ... TO STDOUT` on the wire: rows as PostgreSQL's text, CSV and binary COPY formats
//! (the same value renderings as DataRows), and the messages that carry them.

use std::fmt::Debug;

use arrow::array::RecordBatch;
use arrow::datatypes::Schema;
use bytes::{BufMut, BytesMut};
use eddy_common::Result;
use eddy_engine::{CopyFormat, TimeZone};
use futures::{Sink, SinkExt};
use pgwire::api::ClientInfo;
use pgwire::api::results::FieldFormat;
use pgwire::error::{PgWireError, PgWireResult};
use pgwire::messages::PgWireBackendMessage;
use pgwire::messages::copy::{CopyData, CopyDone, CopyOutResponse};

use crate::encode::encode_column;

/// Sends a whole COPY TO STDOUT: CopyOutResponse, the data, CopyDone. Returns the row count
/// (the caller sends CommandComplete `COPY n`).
pub async fn send<C>(
    client: &mut C,
    schema: &Schema,
    batches: &[RecordBatch],
    format: &CopyFormat,
    tz: TimeZone,
) -> PgWireResult<usize>
where
    C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send,
    C::Error: Debug,
    PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
{
    let columns = schema.fields().len();
    let code = i8::from(matches!(format, CopyFormat::Binary));
    client
        .send(PgWireBackendMessage::CopyOutResponse(CopyOutResponse::new(
            code,
            columns as i16,
            vec![i16::from(code); columns],
        )))
        .await?;
    if let Some(header) = header(schema, format) {
        client
            .feed(PgWireBackendMessage::CopyData(CopyData::new(header.into())))
            .await?;
    }
    let mut rows = 0;
    for batch in batches {
        for line in lines(batch, format, tz).map_err(crate::handler::to_pgwire)? {
            client
                .feed(PgWireBackendMessage::CopyData(CopyData::new(line.into())))
                .await?;
        }
        rows += batch.num_rows();
    }
    if matches!(format, CopyFormat::Binary) {
        client
            .feed(PgWireBackendMessage::CopyData(CopyData::new(
                bytes::Bytes::from_static(&[0xFF, 0xFF]),
            )))
            .await?;
    }
    client
        .send(PgWireBackendMessage::CopyDone(CopyDone::new()))
        .await?;
    Ok(rows)
}

/// What precedes the rows: the column names (HEADER) or the binary signature.
fn header(schema: &Schema, format: &CopyFormat) -> Option<Vec<u8>> {
    let names = || schema.fields().iter().map(|f| f.name().as_str());
    match format {
        CopyFormat::Text { header: false, .. } | CopyFormat::Csv { header: false, .. } => None,
        CopyFormat::Text {
            delimiter, null, ..
        } => {
            let mut line = Vec::new();
            for (i, name) in names().enumerate() {
                if i > 0 {
                    push_char(&mut line, *delimiter);
                }
                text_field(&mut line, name, *delimiter, null);
            }
            line.push(b'\n');
            Some(line)
        }
        CopyFormat::Csv {
            delimiter,
            quote,
            null,
            ..
        } => {
            let mut line = Vec::new();
            for (i, name) in names().enumerate() {
                if i > 0 {
                    push_char(&mut line, *delimiter);
                }
                csv_field(&mut line, name, *delimiter, *quote, null);
            }
            line.push(b'\n');
            Some(line)
        }
        CopyFormat::Binary => {
            let mut out = b"PGCOPY\n\xFF\r\n\0".to_vec();
            out.extend_from_slice(&0i32.to_be_bytes());
            out.extend_from_slice(&0i32.to_be_bytes());
            Some(out)
        }
    }
}

/// The rows of `batch`, one COPY data message each.
pub fn lines(batch: &RecordBatch, format: &CopyFormat, tz: TimeZone) -> Result<Vec<Vec<u8>>> {
    let n = batch.num_rows();
    let schema = batch.schema();
    let value_format = if matches!(format, CopyFormat::Binary) {
        FieldFormat::Binary
    } else {
        FieldFormat::Text
    };
    let mut out = vec![Vec::new(); n];
    if matches!(format, CopyFormat::Binary) {
        for line in &mut out {
            line.extend_from_slice(&(batch.num_columns() as i16).to_be_bytes());
        }
    }
    for (c, column) in batch.columns().iter().enumerate() {
        let values = encode_column(column, schema.field(c), value_format, tz)?;
        for (line, value) in out.iter_mut().zip(values) {
            match format {
                CopyFormat::Binary => match value {
                    None => line.extend_from_slice(&(-1i32).to_be_bytes()),
                    Some(bytes) => {
                        line.extend_from_slice(&(bytes.len() as i32).to_be_bytes());
                        line.extend_from_slice(&bytes);
                    }
                },
                CopyFormat::Text {
                    delimiter, null, ..
                } => {
                    if c > 0 {
                        push_char(line, *delimiter);
                    }
                    match value {
                        None => line.extend_from_slice(null.as_bytes()),
                        Some(bytes) => {
                            text_field(line, &String::from_utf8_lossy(&bytes), *delimiter, null)
                        }
                    }
                }
                CopyFormat::Csv {
                    delimiter,
                    quote,
                    null,
                    ..
                } => {
                    if c > 0 {
                        push_char(line, *delimiter);
                    }
                    match value {
                        None => line.extend_from_slice(null.as_bytes()),
                        Some(bytes) => csv_field(
                            line,
                            &String::from_utf8_lossy(&bytes),
                            *delimiter,
                            *quote,
                            null,
                        ),
                    }
                }
            }
        }
    }
    if !matches!(format, CopyFormat::Binary) {
        for line in &mut out {
            line.push(b'\n');
        }
    }
    Ok(out)
}

fn push_char(out: &mut Vec<u8>, c: char) {
    let mut buf = [0u8; 4];
    out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
}

/// A value in the text format, escaped as PostgreSQL's `CopyAttributeOutText` does.
fn text_field(out: &mut Vec<u8>, value: &str, delimiter: char, _null: &str) {
    let mut buf = BytesMut::with_capacity(value.len());
    for ch in value.chars() {
        match ch {
            '\\' => buf.put_slice(b"\\\\"),
            '\u{8}' => buf.put_slice(b"\\b"),
            '\u{c}' => buf.put_slice(b"\\f"),
            '\n' => buf.put_slice(b"\\n"),
            '\r' => buf.put_slice(b"\\r"),
            '\t' => buf.put_slice(b"\\t"),
            '\u{b}' => buf.put_slice(b"\\v"),
            c if c == delimiter => {
                buf.put_u8(b'\\');
                let mut b = [0u8; 4];
                buf.put_slice(c.encode_utf8(&mut b).as_bytes());
            }
            c => {
                let mut b = [0u8; 4];
                buf.put_slice(c.encode_utf8(&mut b).as_bytes());
            }
        }
    }
    out.extend_from_slice(&buf);
}

/// A value in CSV, quoted as PostgreSQL's `CopyAttributeOutCSV` does: when it holds the
/// delimiter, the quote, a line break, is the NULL string, or is the end-of-data marker.
fn csv_field(out: &mut Vec<u8>, value: &str, delimiter: char, quote: char, null: &str) {
    let needs_quotes = value == null
        || value == "\\."
        || value
            .chars()
            .any(|c| c == delimiter || c == quote || c == '\n' || c == '\r');
    if !needs_quotes {
        out.extend_from_slice(value.as_bytes());
        return;
    }
    push_char(out, quote);
    for c in value.chars() {
        if c == quote {
            push_char(out, quote);
        }
        push_char(out, c);
    }
    push_char(out, quote);
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Int32Array, StringArray};
    use arrow::datatypes::{DataType, Field};

    use super::*;

    fn batch() -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int32, true),
            Field::new("t", DataType::Utf8, true),
        ]));
        let ids = Int32Array::from(vec![Some(1), None, Some(3)]);
        let texts = StringArray::from(vec![Some("a\tb\\c"), Some(""), Some("x,\"y\"")]);
        RecordBatch::try_new(schema, vec![Arc::new(ids), Arc::new(texts)]).unwrap()
    }

    #[test]
    fn text_and_csv_as_postgres_writes_them() {
        let text = CopyFormat::Text {
            delimiter: '\t',
            null: "\\N".into(),
            header: false,
        };
        let rendered: Vec<String> = lines(&batch(), &text, TimeZone::Named(chrono_tz::UTC))
            .unwrap()
            .into_iter()
            .map(|l| String::from_utf8(l).unwrap())
            .collect();
        assert_eq!(rendered, ["1\ta\\tb\\\\c\n", "\\N\t\n", "3\tx,\"y\"\n"]);
        let csv = CopyFormat::Csv {
            delimiter: ',',
            quote: '"',
            null: String::new(),
            header: true,
        };
        let rendered: Vec<String> = lines(&batch(), &csv, TimeZone::Named(chrono_tz::UTC))
            .unwrap()
            .into_iter()
            .map(|l| String::from_utf8(l).unwrap())
            .collect();
        assert_eq!(rendered, ["1,a\tb\\c\n", ",\"\"\n", "3,\"x,\"\"y\"\"\"\n"]);
        assert_eq!(header(&batch().schema(), &csv).unwrap(), b"id,t\n");
    }

    #[test]
    fn binary_rows_carry_lengths() {
        let rows = lines(
            &batch(),
            &CopyFormat::Binary,
            TimeZone::Named(chrono_tz::UTC),
        )
        .unwrap();
        assert_eq!(rows[1], [0, 2, 255, 255, 255, 255, 0, 0, 0, 0]);
        assert_eq!(&rows[0][..10], [0, 2, 0, 0, 0, 4, 0, 0, 0, 1]);
    }
}
