//! `COPY table FROM STDIN` in PostgreSQL's text and CSV formats.
//!
//! The data arrives in chunks over the wire; [`CopyIn::rows`] parses it all into one batch of
//! the table's columns once the client says it is done (a COPY is one atomic insert). Fields are
//! parsed as text and cast to the column types with arrow's casts, so values are read the same
//! way as string literals in `INSERT`.

use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch, StringBuilder, new_null_array};
use arrow::compute::{CastOptions, cast_with_options};
use arrow::datatypes::{DataType, SchemaRef};
use eddy_common::{Error, Result, SqlState};

#[derive(Debug, Clone, PartialEq)]
pub enum CopyFormat {
    Text {
        delimiter: char,
        null: String,
        header: bool,
    },
    Csv {
        delimiter: char,
        quote: char,
        null: String,
        header: bool,
    },
    /// PostgreSQL's binary COPY format (`PGCOPY` signature, binary values).
    Binary,
}

/// A `COPY ... FROM STDIN` waiting for its data.
#[derive(Debug, Clone)]
pub struct CopyIn {
    pub table: eddy_sql::QualifiedName,
    /// Indexes of the table's columns the data holds, in order.
    pub columns: Vec<usize>,
    pub schema: SchemaRef,
    pub format: CopyFormat,
    /// The value each column the data leaves out takes (its DEFAULT; the others are NULL).
    pub defaults: Vec<(usize, ArrayRef)>,
}

impl CopyIn {
    /// Parses the whole data stream into rows of the table.
    pub fn rows(&self, data: &[u8]) -> Result<RecordBatch> {
        let text = std::str::from_utf8(data).map_err(|e| {
            Error::new(
                SqlState::CHARACTER_NOT_IN_REPERTOIRE,
                format!("invalid byte sequence for encoding \"UTF8\": {e}"),
            )
        })?;
        let records = match &self.format {
            CopyFormat::Text {
                delimiter,
                null,
                header,
            } => parse_text(text, *delimiter, null, *header)?,
            CopyFormat::Csv {
                delimiter,
                quote,
                null,
                header,
            } => parse_csv(text, *delimiter, *quote, null, *header)?,
            CopyFormat::Binary => {
                return Err(Error::internal(
                    "binary COPY data is decoded by the server (CopyIn::assemble)",
                ));
            }
        };
        for (line, record) in records.iter().enumerate() {
            if record.len() != self.columns.len() {
                let what = if record.len() < self.columns.len() {
                    "missing data for a column"
                } else {
                    "extra data after last expected column"
                };
                return Err(Error::new(
                    SqlState::BAD_COPY_FILE_FORMAT,
                    format!("{what} (line {})", line + 1),
                ));
            }
        }
        let n = records.len();
        let mut decoded = Vec::with_capacity(self.columns.len());
        for (position, &column) in self.columns.iter().enumerate() {
            let field = self.schema.field(column);
            let values = records.iter().map(|r| r[position].as_deref());
            decoded.push(text_to_array(values, field.data_type(), n).map_err(|e| {
                Error::new(e.state, format!("{} (column {})", e.message, field.name()))
            })?);
        }
        self.assemble(decoded, n)
    }

    /// The table's rows from the decoded values of the columns the data holds (in
    /// [`CopyIn::columns`] order): each checked against its declared type, the other columns
    /// their DEFAULT or NULL. (`COPY ... FROM STDIN (FORMAT binary)` is decoded by the server,
    /// which knows PostgreSQL's binary forms.)
    pub fn assemble(&self, decoded: Vec<ArrayRef>, n: usize) -> Result<RecordBatch> {
        let mut columns: Vec<ArrayRef> = self
            .schema
            .fields()
            .iter()
            .map(|f| new_null_array(f.data_type(), n))
            .collect();
        for (column, value) in &self.defaults {
            let repeat = arrow::array::UInt32Array::from(vec![0u32; n]);
            columns[*column] = arrow::compute::take(value, &repeat, None)
                .and_then(|c| arrow::compute::cast(&c, self.schema.field(*column).data_type()))
                .map_err(|e| Error::internal(format!("COPY default: {e}")))?;
        }
        if decoded.len() != self.columns.len() {
            return Err(Error::internal("COPY decoded the wrong number of columns"));
        }
        for (values, &column) in decoded.into_iter().zip(&self.columns) {
            let field = self.schema.field(column);
            columns[column] = eddy_sql::pg::assign::to_declared(&values, field).map_err(|e| {
                Error::new(e.state, format!("{} (column {})", e.message, field.name()))
            })?;
        }
        RecordBatch::try_new(Arc::clone(&self.schema), columns)
            .map_err(|e| Error::internal(format!("COPY batch: {e}")))
    }
}

/// Builds a column of `data_type` from PostgreSQL text values, read with PostgreSQL's input
/// syntax (the one a cast from text uses; timestamps without a zone are in UTC).
pub fn text_to_array<'a>(
    values: impl Iterator<Item = Option<&'a str>>,
    data_type: &DataType,
    n: usize,
) -> Result<ArrayRef> {
    let mut builder = StringBuilder::with_capacity(n, 0);
    for v in values {
        builder.append_option(v);
    }
    let strings = builder.finish();
    if let Some(parsed) =
        eddy_sql::pg::cast::parse_text(&strings, data_type, eddy_sql::pg::TimeZone::UTC)
    {
        return parsed;
    }
    let strings: ArrayRef = Arc::new(strings);
    if *data_type == DataType::Utf8 {
        return Ok(strings);
    }
    let options = CastOptions {
        safe: false,
        ..Default::default()
    };
    cast_with_options(&strings, data_type, &options).map_err(|e| {
        Error::new(
            SqlState::INVALID_TEXT_REPRESENTATION,
            format!(
                "invalid input for type {data_type}: {}",
                strip_arrow(&e.to_string())
            ),
        )
    })
}

fn strip_arrow(message: &str) -> &str {
    message
        .strip_prefix("Cast error: ")
        .or_else(|| message.strip_prefix("Parser error: "))
        .unwrap_or(message)
}

fn parse_text(
    text: &str,
    delimiter: char,
    null: &str,
    header: bool,
) -> Result<Vec<Vec<Option<String>>>> {
    let mut records = Vec::new();
    // With HEADER the first line names the columns and is skipped.
    for line in text.split('\n').skip(usize::from(header)) {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line == "\\." {
            break;
        }
        if line.is_empty() {
            continue;
        }
        let record = line
            .split(delimiter)
            .map(|field| {
                if field == null {
                    Ok(None)
                } else {
                    unescape_text(field).map(Some)
                }
            })
            .collect::<Result<Vec<_>>>()?;
        records.push(record);
    }
    Ok(records)
}

fn unescape_text(field: &str) -> Result<String> {
    if !field.contains('\\') {
        return Ok(field.to_owned());
    }
    let mut out = String::with_capacity(field.len());
    let mut chars = field.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('b') => out.push('\u{8}'),
            Some('f') => out.push('\u{c}'),
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            Some('t') => out.push('\t'),
            Some('v') => out.push('\u{b}'),
            Some(d @ '0'..='7') => {
                let mut value = d.to_digit(8).unwrap_or(0);
                for _ in 0..2 {
                    match chars.peek().and_then(|c| c.to_digit(8)) {
                        Some(v) => {
                            value = value * 8 + v;
                            chars.next();
                        }
                        None => break,
                    }
                }
                out.push(char::from_u32(value).unwrap_or('\u{fffd}'));
            }
            Some(other) => out.push(other),
            None => {
                return Err(Error::new(
                    SqlState::BAD_COPY_FILE_FORMAT,
                    "end-of-copy marker corrupt: a field ends in a backslash",
                ));
            }
        }
    }
    Ok(out)
}

fn parse_csv(
    text: &str,
    delimiter: char,
    quote: char,
    null: &str,
    header: bool,
) -> Result<Vec<Vec<Option<String>>>> {
    let one_byte = |c: char, what: &str| {
        u8::try_from(u32::from(c)).map_err(|_| {
            Error::invalid_parameter(format!("COPY {what} must be a single one-byte character"))
        })
    };
    let text = match text.find("\n\\.") {
        Some(end) => &text[..end + 1],
        None => text.strip_prefix("\\.").map_or(text, |_| ""),
    };
    let mut reader = csv::ReaderBuilder::new()
        .delimiter(one_byte(delimiter, "delimiter")?)
        .quote(one_byte(quote, "quote")?)
        .has_headers(header)
        .flexible(true)
        .from_reader(text.as_bytes());
    let mut records = Vec::new();
    for record in reader.records() {
        let record = record.map_err(|e| {
            Error::new(
                SqlState::BAD_COPY_FILE_FORMAT,
                format!("malformed CSV: {e}"),
            )
        })?;
        // csv does not tell quoted from unquoted fields; PostgreSQL's default NULL is the
        // unquoted empty string, and `""` (a quoted empty string) is rare enough in practice
        // that we read every empty field as NULL when NULL is ''.
        records.push(
            record
                .iter()
                .map(|f| if f == null { None } else { Some(f.to_owned()) })
                .collect(),
        );
    }
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::datatypes::{Field, Schema};

    fn copy(format: CopyFormat) -> CopyIn {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Utf8, true),
            Field::new("ok", DataType::Boolean, true),
        ]));
        CopyIn {
            table: eddy_sql::QualifiedName::public("t"),
            columns: vec![0, 1, 2],
            schema,
            format,
            defaults: Vec::new(),
        }
    }

    #[test]
    fn text_format_with_nulls_and_escapes() {
        let c = copy(CopyFormat::Text {
            delimiter: '\t',
            null: "\\N".into(),
            header: false,
        });
        let batch = c.rows(b"1\ta\\tb\tt\n2\t\\N\tf\n\\.\n").unwrap();
        assert_eq!(batch.num_rows(), 2);
        let names = batch
            .column(1)
            .as_any()
            .downcast_ref::<arrow::array::StringArray>()
            .unwrap();
        assert_eq!(names.value(0), "a\tb");
        assert!(arrow::array::Array::is_null(names, 1));
    }

    #[test]
    fn csv_with_header_and_bad_value() {
        let c = copy(CopyFormat::Csv {
            delimiter: ',',
            quote: '"',
            null: String::new(),
            header: true,
        });
        let batch = c.rows(b"id,name,ok\n1,\"x, y\",true\n2,,false\n").unwrap();
        assert_eq!(batch.num_rows(), 2);
        let err = c.rows(b"id,name,ok\nnope,a,true\n").unwrap_err();
        assert_eq!(err.state, SqlState::INVALID_TEXT_REPRESENTATION);
        let err = c.rows(b"id,name,ok\n1,a\n").unwrap_err();
        assert_eq!(err.state, SqlState::BAD_COPY_FILE_FORMAT);
    }

    #[test]
    fn text_values_read_like_postgres() {
        use arrow::array::AsArray;
        let bytes = text_to_array(
            ["\\x0aff", "a\\\\b\\001"].into_iter().map(Some),
            &DataType::Binary,
            2,
        )
        .unwrap();
        assert_eq!(bytes.as_binary::<i32>().value(0), [10, 255]);
        assert_eq!(bytes.as_binary::<i32>().value(1), b"a\\b\x01");
        assert!(text_to_array(std::iter::once(Some("\\x0")), &DataType::Binary, 1).is_err());
        let interval = text_to_array(
            std::iter::once(Some("1 day 02:03:04")),
            &DataType::Interval(arrow::datatypes::IntervalUnit::MonthDayNano),
            1,
        )
        .unwrap();
        assert_eq!(interval.len(), 1);
    }
}
