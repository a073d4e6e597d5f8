//! Record formats: `FORMAT PLAIN | UPSERT | DEBEZIUM ENCODE JSON | CSV`, decoded straight into
//! Arrow batches (arrow-json's and arrow-csv's decoders, never through a generic JSON value).
//!
//! Entry point: [`RecordDecoder::decode`] turns a chunk of raw records into one batch of rows in
//! the table's schema, a [`RowKind`] per row (what the row does to the table), and the records
//! that could not be decoded or converted, with the reason — those become dead letters; all
//! other records flow on, in order. The fast path decodes the whole chunk at once; only a
//! chunk holding a bad record is decoded again record by record to find it.

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, BinaryArray, Int32Array, Int64Array, RecordBatch, RecordBatchOptions,
    StringArray, StructArray, TimestampMicrosecondArray, new_null_array,
};
use arrow::compute::{cast, interleave, take};
use arrow::datatypes::{DataType, Field, Fields, Schema, SchemaRef};
use eddy_common::{Error, Result, SqlState};

/// What a record means: a plain event, the new value of a key, or a change event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Envelope {
    Plain,
    Upsert,
    Debezium,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Json,
    Csv,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Format {
    pub envelope: Envelope,
    pub encoding: Encoding,
}

impl Format {
    pub const PLAIN_JSON: Format = Format {
        envelope: Envelope::Plain,
        encoding: Encoding::Json,
    };
    pub const PLAIN_CSV: Format = Format {
        envelope: Envelope::Plain,
        encoding: Encoding::Csv,
    };

    /// `FORMAT envelope ENCODE encoding`, as written (case-insensitive).
    pub fn parse(envelope: &str, encoding: &str) -> Result<Format> {
        let envelope = match envelope.to_ascii_lowercase().as_str() {
            "plain" => Envelope::Plain,
            "upsert" => Envelope::Upsert,
            "debezium" => Envelope::Debezium,
            other => {
                return Err(Error::unsupported(format!(
                    "FORMAT {other} is not supported (PLAIN, UPSERT or DEBEZIUM)"
                )));
            }
        };
        let encoding = match encoding.to_ascii_lowercase().as_str() {
            "json" => Encoding::Json,
            "csv" => Encoding::Csv,
            other => {
                return Err(Error::unsupported(format!(
                    "ENCODE {other} is not supported (JSON or CSV)"
                )));
            }
        };
        if envelope != Envelope::Plain && encoding == Encoding::Csv {
            return Err(Error::unsupported(
                "FORMAT UPSERT and DEBEZIUM need ENCODE JSON",
            ));
        }
        Ok(Format { envelope, encoding })
    }

    pub fn envelope_name(&self) -> &'static str {
        match self.envelope {
            Envelope::Plain => "PLAIN",
            Envelope::Upsert => "UPSERT",
            Envelope::Debezium => "DEBEZIUM",
        }
    }

    pub fn encoding_name(&self) -> &'static str {
        match self.encoding {
            Encoding::Json => "JSON",
            Encoding::Csv => "CSV",
        }
    }
}

/// Connector metadata a table may expose as a column (`INCLUDE key | offset | partition |
/// timestamp [AS name]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Include {
    Key,
    Offset,
    Partition,
    Timestamp,
}

impl Include {
    pub fn parse(what: &str) -> Result<Include> {
        match what.to_ascii_lowercase().as_str() {
            "key" => Ok(Include::Key),
            "offset" => Ok(Include::Offset),
            "partition" => Ok(Include::Partition),
            "timestamp" => Ok(Include::Timestamp),
            other => Err(Error::unsupported(format!(
                "INCLUDE {other} is not supported (key, offset, partition or timestamp)"
            ))),
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Include::Key => "key",
            Include::Offset => "offset",
            Include::Partition => "partition",
            Include::Timestamp => "timestamp",
        }
    }

    /// The column's PostgreSQL type.
    pub fn pg_type(&self) -> &'static str {
        match self {
            Include::Key => "bytea",
            Include::Offset => "bigint",
            Include::Partition => "integer",
            Include::Timestamp => "timestamptz",
        }
    }

    /// The column name when no `AS name` is given.
    pub fn default_column(&self) -> String {
        format!("_eddy_{}", self.name())
    }
}

/// One record as a connector read it. `offset` and `partition` locate it in its source.
#[derive(Debug, Clone, Copy, Default)]
pub struct RawRecord<'a> {
    pub key: Option<&'a [u8]>,
    /// `None` is a tombstone (Kafka's null value).
    pub value: Option<&'a [u8]>,
    pub partition: Option<u32>,
    pub offset: Option<u64>,
    pub timestamp_micros: Option<i64>,
}

/// What a decoded row does to the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowKind {
    /// A new row (+1).
    Insert,
    /// Remove this exact row (-1): Debezium's `before` on a table without a primary key.
    Retract,
    /// The row is the new value of its primary key (replacing the one held, if any).
    Upsert,
    /// Remove whatever row holds this primary key; only key columns are set.
    Delete,
}

/// A decoded chunk of records.
#[derive(Debug)]
pub struct Decoded {
    /// Rows in the table's schema, in record order.
    pub rows: RecordBatch,
    pub kinds: Vec<RowKind>,
    /// The record (index in the chunk) each row came from.
    pub origins: Vec<usize>,
    /// Records that could not be decoded: (index in the chunk, why).
    pub rejected: Vec<(usize, String)>,
}

/// Decodes records of one format into rows of one table.
#[derive(Clone)]
pub struct RecordDecoder {
    format: Format,
    table: SchemaRef,
    /// The declared columns (all nullable: NOT NULL is checked after decoding, per row).
    value: SchemaRef,
    includes: Vec<(Include, usize)>,
    not_null: Vec<usize>,
    primary_key: Vec<usize>,
    /// What a Debezium record is decoded as: `op`, `before`, `after`, maybe under `payload`.
    envelope: Option<SchemaRef>,
}

fn data_error(message: impl Into<String>) -> Error {
    Error::new(SqlState::DATA_EXCEPTION, message)
}

fn arrow_error(context: &str, err: arrow::error::ArrowError) -> Error {
    Error::internal(format!("{context}: {err}"))
}

impl RecordDecoder {
    /// `table` is the table's schema: its declared columns first, then `includes` in order.
    /// Fails with 0A000 when a column's type cannot be decoded from the format.
    pub fn new(
        table: SchemaRef,
        includes: &[Include],
        primary_key: &[usize],
        format: Format,
    ) -> Result<Self> {
        let declared = table
            .fields()
            .len()
            .checked_sub(includes.len())
            .ok_or_else(|| Error::internal("more INCLUDE columns than columns"))?;
        let value_fields: Vec<Field> = table.fields()[..declared]
            .iter()
            .map(|f| f.as_ref().clone().with_nullable(true))
            .collect();
        let value = Arc::new(Schema::new(value_fields));
        let not_null = (0..declared)
            .filter(|&i| !table.field(i).is_nullable())
            .collect();
        if format.envelope == Envelope::Upsert && primary_key.is_empty() {
            return Err(Error::new(
                SqlState::INVALID_TABLE_DEFINITION,
                "FORMAT UPSERT needs a PRIMARY KEY (a record's key says which row it replaces)",
            ));
        }
        let envelope = (format.envelope == Envelope::Debezium).then(|| {
            let row = DataType::Struct(value.fields().clone());
            let change = vec![
                Field::new("op", DataType::Utf8, true),
                Field::new("before", row.clone(), true),
                Field::new("after", row, true),
            ];
            let mut fields = change.clone();
            fields.push(Field::new(
                "payload",
                DataType::Struct(Fields::from(change)),
                true,
            ));
            Arc::new(Schema::new(fields))
        });
        let decoder = RecordDecoder {
            format,
            includes: includes
                .iter()
                .enumerate()
                .map(|(i, inc)| (*inc, declared + i))
                .collect(),
            table,
            value,
            not_null,
            primary_key: primary_key.to_vec(),
            envelope,
        };
        // Every column type must be decodable: find out now, not at the first record.
        decoder.parse(&[], decoder.body_schema()).map_err(|e| {
            Error::unsupported(format!(
                "a column type cannot be read from {}: {}",
                format.encoding_name(),
                e.message
            ))
        })?;
        Ok(decoder)
    }

    pub fn format(&self) -> Format {
        self.format
    }

    fn body_schema(&self) -> &SchemaRef {
        self.envelope.as_ref().unwrap_or(&self.value)
    }

    /// Decodes `records` (in order); see [`Decoded`].
    pub fn decode(&self, records: &[RawRecord<'_>]) -> Result<Decoded> {
        self.decode_joined(records, None)
    }

    /// [`RecordDecoder::decode`] of records read as lines, with `joined`: their values each
    /// followed by a newline, in one buffer (see `file::Lines::joined`), so that a chunk that
    /// decodes whole is not joined again.
    pub fn decode_joined(
        &self,
        records: &[RawRecord<'_>],
        joined: Option<&[u8]>,
    ) -> Result<Decoded> {
        let mut rejected = Vec::new();
        // Records with a value, and (UPSERT) tombstones that delete their key.
        let mut valued = Vec::new();
        let mut tombstones = Vec::new();
        for (i, r) in records.iter().enumerate() {
            match r.value {
                Some(v) if !is_blank(v) => valued.push((i, v)),
                _ if self.format.envelope == Envelope::Upsert => tombstones.push(i),
                // A PLAIN or DEBEZIUM tombstone (Kafka compaction marker) carries no change.
                _ => {}
            }
        }
        let bodies: Vec<&[u8]> = valued.iter().map(|(_, v)| *v).collect();
        let joined = joined.filter(|_| valued.len() == records.len());
        let (batch, errors) = self.parse_each(&bodies, joined, self.body_schema())?;
        let mut good: Vec<usize> = Vec::with_capacity(bodies.len());
        for (j, error) in errors.into_iter().enumerate() {
            match error {
                Some(e) => rejected.push((valued[j].0, e)),
                None => good.push(valued[j].0),
            }
        }
        let (columns, kinds, origin) = match self.format.envelope {
            // The parsed rows are the records' rows, in order: the batch is used as it is.
            Envelope::Plain => (
                batch.columns().to_vec(),
                vec![RowKind::Insert; good.len()],
                good,
            ),
            _ => self.interleave_changes(batch, &good, records, &tombstones, &mut rejected)?,
        };
        // NOT NULL, per row: a delete by key needs only its key.
        let mut keep = vec![true; kinds.len()];
        for &c in &self.not_null {
            let column = &columns[c];
            if column.null_count() == 0 {
                continue;
            }
            for (row, kind) in kinds.iter().enumerate() {
                let needed = *kind != RowKind::Delete || self.primary_key.contains(&c);
                if keep[row] && needed && column.is_null(row) {
                    keep[row] = false;
                    rejected.push((
                        origin[row],
                        format!(
                            "null value in column \"{}\" violates not-null constraint",
                            self.table.field(c).name()
                        ),
                    ));
                }
            }
        }
        let (mut columns, kinds, origin) = if keep.iter().all(|k| *k) {
            (columns, kinds, origin)
        } else {
            let kept: Vec<u32> = (0..kinds.len())
                .filter(|&r| keep[r])
                .map(|r| r as u32)
                .collect();
            let kept_array = arrow::array::UInt32Array::from(kept.clone());
            let columns = columns
                .iter()
                .map(|c| {
                    take(c.as_ref(), &kept_array, None)
                        .map_err(|e| arrow_error("dropping rejected rows", e))
                })
                .collect::<Result<Vec<ArrayRef>>>()?;
            let kinds: Vec<RowKind> = kept.iter().map(|&r| kinds[r as usize]).collect();
            let origin: Vec<usize> = kept.iter().map(|&r| origin[r as usize]).collect();
            (columns, kinds, origin)
        };
        for &(include, c) in &self.includes {
            let array: ArrayRef = match include {
                Include::Key => Arc::new(BinaryArray::from(
                    origin.iter().map(|&i| records[i].key).collect::<Vec<_>>(),
                )),
                Include::Offset => Arc::new(Int64Array::from(
                    origin
                        .iter()
                        .map(|&i| records[i].offset.map(|o| o as i64))
                        .collect::<Vec<_>>(),
                )),
                Include::Partition => Arc::new(Int32Array::from(
                    origin
                        .iter()
                        .map(|&i| records[i].partition.map(|p| p as i32))
                        .collect::<Vec<_>>(),
                )),
                Include::Timestamp => Arc::new(
                    TimestampMicrosecondArray::from(
                        origin
                            .iter()
                            .map(|&i| records[i].timestamp_micros)
                            .collect::<Vec<_>>(),
                    )
                    .with_timezone("+00:00"),
                ),
            };
            columns.push(
                cast(&array, self.table.field(c).data_type())
                    .map_err(|e| arrow_error("INCLUDE column", e))?,
            );
        }
        let options = RecordBatchOptions::new().with_row_count(Some(kinds.len()));
        // Labelled nullable: NOT NULL was checked above, but deletes by key leave other columns null.
        let fields: Vec<Field> = self
            .table
            .fields()
            .iter()
            .map(|f| f.as_ref().clone().with_nullable(true))
            .collect();
        let rows =
            RecordBatch::try_new_with_options(Arc::new(Schema::new(fields)), columns, &options)
                .map_err(|e| arrow_error("decoded rows", e))?;
        rejected.sort_by_key(|r| r.0);
        Ok(Decoded {
            rows,
            kinds,
            origins: origin,
            rejected,
        })
    }

    /// UPSERT and DEBEZIUM: the rows of each record's change (an upsert, a delete by key, the
    /// before and after of an update), interleaved into record order, with each row's kind
    /// and record.
    #[allow(clippy::type_complexity)]
    fn interleave_changes(
        &self,
        batch: RecordBatch,
        good: &[usize],
        records: &[RawRecord<'_>],
        tombstones: &[usize],
        rejected: &mut Vec<(usize, String)>,
    ) -> Result<(Vec<ArrayRef>, Vec<RowKind>, Vec<usize>)> {
        // Pieces to interleave into record order: (source batch, row) per output row.
        let mut sources: Vec<RecordBatch> = Vec::new();
        let mut picks: Vec<(usize, usize, usize, RowKind)> = Vec::new(); // (record, batch, row, kind)
        match self.format.envelope {
            Envelope::Plain => unreachable!("PLAIN rows need no interleaving"),
            Envelope::Upsert => {
                sources.push(batch);
                picks.extend(
                    good.iter()
                        .enumerate()
                        .map(|(row, &rec)| (rec, 0, row, RowKind::Upsert)),
                );
                let (keys, key_errors) = self.parse_keys(records, tombstones)?;
                sources.push(keys);
                let mut row = 0;
                for (&rec, error) in tombstones.iter().zip(key_errors) {
                    match error {
                        Some(e) => rejected.push((rec, e)),
                        None => {
                            picks.push((rec, 1, row, RowKind::Delete));
                            row += 1;
                        }
                    }
                }
            }
            Envelope::Debezium => {
                self.debezium_picks(&batch, good, &mut sources, &mut picks, rejected)?
            }
        }
        picks.sort_by_key(|p| p.0);
        let indices: Vec<(usize, usize)> = picks.iter().map(|p| (p.1, p.2)).collect();
        // PLAIN picks every parsed row in order: the batch is used as it is, not copied.
        let identity = sources.len() == 1
            && indices
                .iter()
                .enumerate()
                .all(|(i, &(b, r))| b == 0 && r == i)
            && indices.len() == sources[0].num_rows();
        let columns = (0..self.value.fields().len())
            .map(|c| {
                if identity {
                    return Ok(Arc::clone(sources[0].column(c)));
                }
                let arrays: Vec<&dyn Array> =
                    sources.iter().map(|b| b.column(c).as_ref()).collect();
                interleave(&arrays, &indices).map_err(|e| arrow_error("interleaving rows", e))
            })
            .collect::<Result<Vec<ArrayRef>>>()?;
        let kinds: Vec<RowKind> = picks.iter().map(|p| p.3).collect();
        let origin: Vec<usize> = picks.iter().map(|p| p.0).collect();
        Ok((columns, kinds, origin))
    }

    /// Parses each body into one row of `schema`; returns the rows of the bodies that parsed
    /// and, per body, why it did not. `joined`: the bodies already joined by newlines.
    fn parse_each(
        &self,
        bodies: &[&[u8]],
        joined: Option<&[u8]>,
        schema: &SchemaRef,
    ) -> Result<(RecordBatch, Vec<Option<String>>)> {
        let whole = match joined {
            Some(joined) => self.parse_joined(joined, bodies.len(), schema),
            None => self.parse(bodies, schema),
        };
        if let Ok(batch) = whole {
            return Ok((batch, vec![None; bodies.len()]));
        }
        let mut errors = Vec::with_capacity(bodies.len());
        let mut good = Vec::with_capacity(bodies.len());
        for body in bodies {
            match self.parse(std::slice::from_ref(body), schema) {
                Ok(_) => {
                    errors.push(None);
                    good.push(*body);
                }
                Err(e) => errors.push(Some(e.message)),
            }
        }
        let batch = self.parse(&good, schema)?;
        Ok((batch, errors))
    }

    /// Parses bodies that must each hold exactly one record.
    fn parse(&self, bodies: &[&[u8]], schema: &SchemaRef) -> Result<RecordBatch> {
        let mut joined = Vec::with_capacity(bodies.iter().map(|b| b.len() + 1).sum());
        for body in bodies {
            joined.extend_from_slice(body);
            joined.push(b'\n');
        }
        self.parse_joined(&joined, bodies.len(), schema)
    }

    /// Parses `n` bodies joined by newlines (each followed by one).
    fn parse_joined(&self, joined: &[u8], n: usize, schema: &SchemaRef) -> Result<RecordBatch> {
        let batch = match self.format.encoding {
            Encoding::Json => {
                let mut decoder = arrow_json::ReaderBuilder::new(Arc::clone(schema))
                    .with_batch_size(n + 1)
                    .with_coerce_primitive(true)
                    .build_decoder()
                    .map_err(|e| data_error(e.to_string()))?;
                let used = decoder
                    .decode(joined)
                    .map_err(|e| data_error(json_message(&e)))?;
                if used != joined.len() {
                    return Err(data_error("more than one JSON value in a record"));
                }
                decoder.flush().map_err(|e| data_error(json_message(&e)))?
            }
            Encoding::Csv => {
                let mut decoder = arrow_csv::ReaderBuilder::new(Arc::clone(schema))
                    .with_header(false)
                    .with_batch_size(n + 1)
                    .build_decoder();
                let used = decoder
                    .decode(joined)
                    .map_err(|e| data_error(e.to_string()))?;
                if used != joined.len() {
                    return Err(data_error("a CSV record spans more than one line"));
                }
                decoder.flush().map_err(|e| data_error(e.to_string()))?
            }
        };
        let batch = batch.unwrap_or_else(|| RecordBatch::new_empty(Arc::clone(schema)));
        if batch.num_rows() != n {
            return Err(data_error(format!(
                "expected one record per line, found {} in {n}",
                batch.num_rows()
            )));
        }
        Ok(batch)
    }

    /// The keys of UPSERT tombstones, as rows with only the primary key set.
    fn parse_keys(
        &self,
        records: &[RawRecord<'_>],
        tombstones: &[usize],
    ) -> Result<(RecordBatch, Vec<Option<String>>)> {
        let key_fields: Vec<Field> = self
            .primary_key
            .iter()
            .map(|&c| self.value.field(c).clone())
            .collect();
        let key_schema = Arc::new(Schema::new(key_fields));
        let mut owned: Vec<Vec<u8>> = Vec::with_capacity(tombstones.len());
        for &i in tombstones {
            let key = records[i].key.unwrap_or_default();
            let trimmed = key.trim_ascii_start();
            // A bare value is the key of a one-column primary key.
            if !trimmed.starts_with(b"{") && self.primary_key.len() == 1 {
                let mut wrapped = format!(
                    "{{{}:",
                    eddy_common::json_string(key_schema.field(0).name())
                )
                .into_bytes();
                wrapped.extend_from_slice(key);
                wrapped.push(b'}');
                owned.push(wrapped);
            } else {
                owned.push(key.to_vec());
            }
        }
        let bodies: Vec<&[u8]> = owned.iter().map(|b| b.as_slice()).collect();
        let json = RecordDecoder {
            format: Format::PLAIN_JSON,
            ..self.shallow()
        };
        let (keys, mut errors) = json.parse_each(&bodies, None, &key_schema)?;
        for (i, e) in errors.iter_mut().enumerate() {
            if records[tombstones[i]].key.is_none_or(is_blank) {
                *e = Some("a record with neither key nor value".into());
            } else if let Some(e) = e {
                *e = format!("bad key: {e}");
            }
        }
        let good_rows = keys.num_rows();
        let columns: Vec<ArrayRef> = (0..self.value.fields().len())
            .map(|c| match self.primary_key.iter().position(|&k| k == c) {
                Some(k) => Arc::clone(keys.column(k)),
                None => new_null_array(self.value.field(c).data_type(), good_rows),
            })
            .collect();
        // Keys that parsed but hold a null are not keys.
        let options = RecordBatchOptions::new().with_row_count(Some(good_rows));
        let batch = RecordBatch::try_new_with_options(Arc::clone(&self.value), columns, &options)
            .map_err(|e| arrow_error("key rows", e))?;
        Ok((batch, errors))
    }

    fn shallow(&self) -> RecordDecoder {
        RecordDecoder {
            format: self.format,
            table: Arc::clone(&self.table),
            value: Arc::clone(&self.value),
            includes: self.includes.clone(),
            not_null: self.not_null.clone(),
            primary_key: self.primary_key.clone(),
            envelope: self.envelope.clone(),
        }
    }

    /// Turns decoded Debezium envelopes into rows: `c`/`r` insert `after`, `u` replaces
    /// `before` with `after`, `d` removes `before` (by key when the table has a primary key).
    fn debezium_picks(
        &self,
        batch: &RecordBatch,
        good: &[usize],
        sources: &mut Vec<RecordBatch>,
        picks: &mut Vec<(usize, usize, usize, RowKind)>,
        rejected: &mut Vec<(usize, String)>,
    ) -> Result<()> {
        let column = |name: &str| -> Result<ArrayRef> {
            let top = batch
                .column_by_name(name)
                .ok_or_else(|| Error::internal("Debezium field missing"))?;
            let payload = batch
                .column_by_name("payload")
                .and_then(|p| p.as_any().downcast_ref::<StructArray>())
                .ok_or_else(|| Error::internal("payload"))?;
            let nested = payload
                .column_by_name(name)
                .ok_or_else(|| Error::internal("Debezium payload field missing"))?;
            // `{"schema": ..., "payload": {...}}` (schemas enabled) or the bare change event.
            let mask = arrow::array::BooleanArray::from(
                (0..batch.num_rows())
                    .map(|i| Some(payload.is_valid(i)))
                    .collect::<Vec<_>>(),
            );
            arrow::compute::kernels::zip::zip(&mask, nested, top)
                .map_err(|e| arrow_error("Debezium payload", e))
        };
        let op = column("op")?;
        let op = op
            .as_any()
            .downcast_ref::<StringArray>()
            .ok_or_else(|| Error::internal("op is not text"))?
            .clone();
        let image = |name: &str| -> Result<RecordBatch> {
            let array = column(name)?;
            let image = array
                .as_any()
                .downcast_ref::<StructArray>()
                .ok_or_else(|| Error::internal("image is not a struct"))?;
            let options = RecordBatchOptions::new().with_row_count(Some(image.len()));
            let valid = image.nulls().cloned();
            let columns: Vec<ArrayRef> = image
                .columns()
                .iter()
                .map(|c| match &valid {
                    // A null image nulls its fields.
                    Some(v) => arrow::compute::nullif(
                        c,
                        &arrow::array::BooleanArray::new(!v.inner(), None),
                    )
                    .map_err(|e| arrow_error("image", e)),
                    None => Ok(Arc::clone(c)),
                })
                .collect::<Result<_>>()?;
            RecordBatch::try_new_with_options(Arc::clone(&self.value), columns, &options)
                .map_err(|e| arrow_error("Debezium image", e))
        };
        let before = image("before")?;
        let after = image("after")?;
        let (before_valid, after_valid): (Vec<bool>, Vec<bool>) = {
            let b = column("before")?;
            let a = column("after")?;
            (
                (0..b.len()).map(|i| b.is_valid(i)).collect(),
                (0..a.len()).map(|i| a.is_valid(i)).collect(),
            )
        };
        let base = sources.len();
        sources.push(before);
        sources.push(after);
        let keyed = !self.primary_key.is_empty();
        for (row, &rec) in good.iter().enumerate() {
            let has_before = before_valid[row];
            let has_after = after_valid[row];
            let (remove, add) = match (op.is_valid(row).then(|| op.value(row)), keyed) {
                (Some("c" | "r"), _) => (false, true),
                (Some("u"), true) => (has_before, true),
                (Some("u"), false) => (true, true),
                (Some("d"), _) => (true, false),
                (Some(other), _) => {
                    rejected.push((rec, format!("unknown Debezium op \"{other}\"")));
                    continue;
                }
                (None, _) => {
                    rejected.push((rec, "a Debezium record without \"op\"".into()));
                    continue;
                }
            };
            if (add && !has_after) || (remove && !has_before) {
                let missing = if add && !has_after { "after" } else { "before" };
                let why = if keyed {
                    ""
                } else {
                    " (a table without a primary key needs full before images)"
                };
                rejected.push((
                    rec,
                    format!(
                        "Debezium op \"{}\" without \"{missing}\"{why}",
                        op.value(row)
                    ),
                ));
                continue;
            }
            if remove {
                picks.push((
                    rec,
                    base,
                    row,
                    if keyed {
                        RowKind::Delete
                    } else {
                        RowKind::Retract
                    },
                ));
            }
            if add {
                picks.push((
                    rec,
                    base + 1,
                    row,
                    if keyed {
                        RowKind::Upsert
                    } else {
                        RowKind::Insert
                    },
                ));
            }
        }
        Ok(())
    }
}

fn is_blank(bytes: &[u8]) -> bool {
    bytes.iter().all(u8::is_ascii_whitespace)
}

/// arrow-json's messages, without the "Json error: " prefix that tells a user nothing.
fn json_message(err: &arrow::error::ArrowError) -> String {
    let text = err.to_string();
    text.strip_prefix("Json error: ")
        .map(str::to_owned)
        .unwrap_or(text)
}

#[cfg(test)]
#[path = "format_tests.rs"]
mod tests;
