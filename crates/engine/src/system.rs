//! Eddy's own system tables, computed when a query reads them: `eddy_views`,
//! `eddy_operators`, `eddy_tables`, `eddy_watermarks`, `eddy_late_events`,
//! `eddy_source_offsets`, `eddy_dead_letters` and `eddy_checkpoints`
//! (SQL.md, "System catalogs"), in schema `eddy_catalog`, which every session's search path
//! reaches first (after `pg_catalog`), as PostgreSQL reaches `pg_catalog`.

use std::sync::Arc;

use arrow::array::{
    ArrayRef, Int64Array, IntervalMonthDayNanoArray, RecordBatch, StringArray,
    TimestampMicrosecondArray, UInt32Array, UInt64Array,
};
use arrow::datatypes::{
    DataType, Field, IntervalMonthDayNano, IntervalUnit, Schema, SchemaRef, TimeUnit,
};
use eddy_common::{Error, Result};

use crate::Engine;

/// The tables of `eddy_catalog`.
pub(crate) const NAMES: [&str; 8] = [
    "eddy_checkpoints",
    "eddy_dead_letters",
    "eddy_late_events",
    "eddy_operators",
    "eddy_source_offsets",
    "eddy_tables",
    "eddy_views",
    "eddy_watermarks",
];

/// The system table `name`: its name as [`NAMES`] spells it, and its columns.
pub(crate) fn schema(name: &str) -> Option<(&'static str, SchemaRef)> {
    let name = NAMES.into_iter().find(|n| *n == name)?;
    let schema = match name {
        "eddy_views" => views_schema(),
        "eddy_operators" => operators_schema(),
        "eddy_tables" => tables_schema(),
        "eddy_watermarks" => watermarks_schema(),
        "eddy_late_events" => late_events_schema(),
        "eddy_source_offsets" => source_offsets_schema(),
        "eddy_dead_letters" => dead_letters_schema(),
        _ => checkpoints_schema(),
    };
    Some((name, schema))
}

/// The rows of system table `name` as of now. Nothing here waits for the view runtime: it
/// reads what the runtime published.
pub(crate) fn rows(engine: &Engine, name: &str) -> Result<Vec<RecordBatch>> {
    let (_, batch) = match name {
        "eddy_views" => views(engine),
        "eddy_operators" => operators(engine),
        "eddy_tables" => tables(engine),
        "eddy_watermarks" => watermarks(engine),
        "eddy_late_events" => late_events(engine),
        "eddy_source_offsets" => source_offsets(engine),
        "eddy_dead_letters" => dead_letters(engine),
        "eddy_checkpoints" => checkpoints(engine),
        _ => return Err(Error::internal(format!("no system table {name}"))),
    }?;
    Ok(vec![batch])
}

fn batch(
    name: &str,
    schema: SchemaRef,
    columns: Vec<ArrayRef>,
) -> Result<(SchemaRef, RecordBatch)> {
    let batch = RecordBatch::try_new(Arc::clone(&schema), columns)
        .map_err(|e| Error::internal(format!("{name}: {e}")))?;
    Ok((schema, batch))
}

fn timestamp(nullable: bool, name: &str) -> Field {
    Field::new(
        name,
        DataType::Timestamp(TimeUnit::Microsecond, None),
        nullable,
    )
}

fn tables_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("table_schema", DataType::Utf8, false),
        Field::new("table_name", DataType::Utf8, false),
        Field::new("rows", DataType::Int64, false),
        Field::new("rows_on_disk", DataType::Int64, false),
        Field::new("index_entries_on_disk", DataType::Int64, false),
    ]))
}

/// Every table: its rows, and how much of them is on disk past the server's memory limit
/// (rows of its chunks spilled to files, entries of its key index in the spill store; an
/// `APPEND ONLY` table's rows are in its log, neither counted here).
fn tables(engine: &Engine) -> Result<(SchemaRef, RecordBatch)> {
    let tables = engine.tables();
    let stats: Vec<(usize, (usize, usize))> = tables
        .iter()
        .map(|t| {
            let data = t.read();
            (data.row_count(), data.spilled())
        })
        .collect();
    let count = |f: fn(&(usize, (usize, usize))) -> usize| {
        Arc::new(Int64Array::from_iter_values(
            stats.iter().map(|s| f(s) as i64),
        )) as ArrayRef
    };
    let columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from_iter_values(
            tables.iter().map(|t| t.def.schema.as_str()),
        )),
        Arc::new(StringArray::from_iter_values(
            tables.iter().map(|t| t.def.name.as_str()),
        )),
        count(|s| s.0),
        count(|s| s.1.1),
        count(|s| s.1.0),
    ];
    batch("eddy_tables", tables_schema(), columns)
}

fn views_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("name", DataType::Utf8, false),
        Field::new("status", DataType::Utf8, false),
        Field::new("error", DataType::Utf8, true),
        Field::new("restored_from", DataType::Utf8, true),
        Field::new("lag_epochs", DataType::Int64, false),
    ]))
}

/// Every materialized view: `running`, or `failed` with why (it stopped updating, or could not
/// be restored at start-up), what start-up restored it from, and how many epochs it is behind
/// the others (a slow view no other view reads is left to catch up on its own).
fn views(engine: &Engine) -> Result<(SchemaRef, RecordBatch)> {
    let rows = engine.view_statuses();
    let columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from_iter_values(rows.iter().map(|v| &v.name))),
        Arc::new(StringArray::from_iter_values(rows.iter().map(|v| v.status))),
        Arc::new(StringArray::from_iter(
            rows.iter().map(|v| v.error.as_deref()),
        )),
        Arc::new(StringArray::from_iter(
            rows.iter().map(|v| v.restored_from.as_deref()),
        )),
        Arc::new(Int64Array::from_iter_values(
            rows.iter().map(|v| v.lag_epochs as i64),
        )),
    ];
    batch("eddy_views", views_schema(), columns)
}

fn operators_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("view", DataType::Utf8, false),
        Field::new("position", DataType::Utf8, false),
        Field::new("operator", DataType::Utf8, false),
        Field::new("inputs", DataType::Utf8, false),
        Field::new("rows_in", DataType::UInt64, false),
        Field::new("rows_out", DataType::UInt64, false),
        Field::new("state_rows", DataType::UInt64, false),
        Field::new("state_bytes", DataType::UInt64, false),
        Field::new("spilled_rows", DataType::UInt64, false),
        Field::new("shards", DataType::UInt32, false),
    ]))
}

/// Per view and operator: rows in and out, the state held (rows, bytes in memory, rows spilled
/// to disk) and its shards.
fn operators(engine: &Engine) -> Result<(SchemaRef, RecordBatch)> {
    let rows = engine.runtime().operators();
    let columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from(
            rows.iter().map(|(v, _)| v.clone()).collect::<Vec<_>>(),
        )),
        Arc::new(StringArray::from(
            rows.iter().map(|(_, s)| s.path.clone()).collect::<Vec<_>>(),
        )),
        Arc::new(StringArray::from(
            rows.iter().map(|(_, s)| s.name.clone()).collect::<Vec<_>>(),
        )),
        Arc::new(StringArray::from(
            rows.iter()
                .map(|(_, s)| s.inputs.join(", "))
                .collect::<Vec<_>>(),
        )),
        Arc::new(UInt64Array::from(
            rows.iter().map(|(_, s)| s.rows_in).collect::<Vec<_>>(),
        )),
        Arc::new(UInt64Array::from(
            rows.iter().map(|(_, s)| s.rows_out).collect::<Vec<_>>(),
        )),
        Arc::new(UInt64Array::from(
            rows.iter()
                .map(|(_, s)| s.state_rows as u64)
                .collect::<Vec<_>>(),
        )),
        Arc::new(UInt64Array::from(
            rows.iter()
                .map(|(_, s)| s.state_bytes as u64)
                .collect::<Vec<_>>(),
        )),
        Arc::new(UInt64Array::from(
            rows.iter()
                .map(|(_, s)| s.spilled_rows as u64)
                .collect::<Vec<_>>(),
        )),
        Arc::new(UInt32Array::from(
            rows.iter()
                .map(|(_, s)| s.shards as u32)
                .collect::<Vec<_>>(),
        )),
    ];
    batch("eddy_operators", operators_schema(), columns)
}

fn watermarks_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("object", DataType::Utf8, false),
        Field::new("partition", DataType::UInt32, true),
        timestamp(true, "watermark"),
    ]))
}

/// The watermark of each stream partition, each stream (partition NULL, the merged value) and
/// each view reading streams (partition NULL).
fn watermarks(engine: &Engine) -> Result<(SchemaRef, RecordBatch)> {
    let mut rows = engine.runtime().watermarks();
    for row in &mut rows {
        // A stream's id, with the view reading it for a source: "7 (v)".
        let (id, reader) = row
            .object
            .split_once(' ')
            .map_or((row.object.as_str(), None), |(id, r)| (id, Some(r)));
        if let Ok(id) = id.parse::<u64>() {
            let name = engine
                .object_name(eddy_common::ObjectId(id))
                .unwrap_or_else(|| format!("object {id}"));
            row.object = reader.map_or_else(|| name.clone(), |r| format!("{name} {r}"));
        }
    }
    rows.sort_by(|a, b| (&a.object, a.partition).cmp(&(&b.object, b.partition)));
    let columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from(
            rows.iter().map(|r| r.object.clone()).collect::<Vec<_>>(),
        )),
        Arc::new(UInt32Array::from(
            rows.iter().map(|r| r.partition).collect::<Vec<_>>(),
        )),
        Arc::new(TimestampMicrosecondArray::from(
            rows.iter().map(|r| r.watermark).collect::<Vec<_>>(),
        )),
    ];
    batch("eddy_watermarks", watermarks_schema(), columns)
}

fn checkpoints_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("epoch", DataType::UInt64, false),
        Field::new(
            "started_at",
            DataType::Timestamp(TimeUnit::Microsecond, Some(eddy_sql::types::UTC.into())),
            false,
        ),
        Field::new(
            "duration",
            DataType::Interval(IntervalUnit::MonthDayNano),
            false,
        ),
        Field::new(
            "pause",
            DataType::Interval(IntervalUnit::MonthDayNano),
            false,
        ),
        Field::new("bytes", DataType::UInt64, false),
    ]))
}

/// The committed checkpoints: when each started, how long writing it took, how long it
/// paused the views (copying their state), and its size on disk.
fn checkpoints(engine: &Engine) -> Result<(SchemaRef, RecordBatch)> {
    let rows = engine.checkpoint_list()?;
    let interval = |d: std::time::Duration| IntervalMonthDayNano::new(0, 0, d.as_nanos() as i64);
    let columns: Vec<ArrayRef> = vec![
        Arc::new(UInt64Array::from(
            rows.iter().map(|r| r.epoch).collect::<Vec<_>>(),
        )),
        Arc::new(
            TimestampMicrosecondArray::from(
                rows.iter().map(|r| r.started_at_micros).collect::<Vec<_>>(),
            )
            .with_timezone(eddy_sql::types::UTC),
        ),
        Arc::new(IntervalMonthDayNanoArray::from(
            rows.iter()
                .map(|r| interval(r.duration))
                .collect::<Vec<_>>(),
        )),
        Arc::new(IntervalMonthDayNanoArray::from(
            rows.iter().map(|r| interval(r.pause)).collect::<Vec<_>>(),
        )),
        Arc::new(UInt64Array::from(
            rows.iter().map(|r| r.bytes).collect::<Vec<_>>(),
        )),
    ];
    batch("eddy_checkpoints", checkpoints_schema(), columns)
}

fn late_events_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("view", DataType::Utf8, false),
        Field::new("row", DataType::Utf8, false),
        timestamp(true, "event_time"),
        timestamp(false, "watermark"),
        Field::new(
            "received_at",
            DataType::Timestamp(TimeUnit::Microsecond, Some(eddy_sql::types::UTC.into())),
            false,
        ),
        Field::new("action", DataType::Utf8, false),
    ]))
}

/// Every late row a view did not apply.
fn late_events(engine: &Engine) -> Result<(SchemaRef, RecordBatch)> {
    let rows = engine.runtime().late_events();
    let received = rows
        .iter()
        .map(|r| {
            r.received_at
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_micros() as i64)
        })
        .collect::<Vec<_>>();
    let columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from(
            rows.iter().map(|r| r.view.clone()).collect::<Vec<_>>(),
        )),
        Arc::new(StringArray::from(
            rows.iter().map(|r| r.event.row.clone()).collect::<Vec<_>>(),
        )),
        Arc::new(TimestampMicrosecondArray::from(
            rows.iter().map(|r| r.event.event_time).collect::<Vec<_>>(),
        )),
        Arc::new(TimestampMicrosecondArray::from(
            rows.iter().map(|r| r.event.watermark).collect::<Vec<_>>(),
        )),
        Arc::new(TimestampMicrosecondArray::from(received).with_timezone(eddy_sql::types::UTC)),
        Arc::new(StringArray::from(
            rows.iter().map(|r| r.event.action).collect::<Vec<_>>(),
        )),
    ];
    batch("eddy_late_events", late_events_schema(), columns)
}

fn source_offsets_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("object", DataType::Utf8, false),
        Field::new("partition", DataType::UInt32, false),
        Field::new("consumer", DataType::Utf8, true),
        Field::new("committed_offset", DataType::UInt64, true),
        Field::new("high_watermark", DataType::UInt64, true),
        Field::new("lag", DataType::UInt64, true),
        Field::new("skipped", DataType::UInt64, true),
        Field::new("reader", DataType::UInt64, true),
    ]))
}

/// Per table partition: its log end (`high_watermark`) and, for each materialized view that
/// reads the table, the offset up to which the view has committed and its lag. A partition
/// nobody reads has one row with a NULL consumer. Per source partition read by a connector
/// (into a table, or for a view reading a source): how far it has read, where the source
/// ends, how many records `on_error = 'skip'` dropped since the server started, and for a view
/// the reader it reads the partition with (views with the same one read it together: one
/// fetch and one decode).
fn source_offsets(engine: &Engine) -> Result<(SchemaRef, RecordBatch)> {
    let consumers = engine.runtime().offsets();
    // (object, partition, consumer, committed offset, end, skipped, reader)
    type Row = (
        String,
        u32,
        Option<String>,
        Option<u64>,
        Option<u64>,
        Option<u64>,
        Option<u64>,
    );
    let mut rows: Vec<Row> = Vec::new();
    for table in engine.tables() {
        for p in 0..table.def.partitions {
            let end = engine.log_end(table.def.id, p)?;
            let readers: Vec<_> = consumers
                .iter()
                .filter(|c| c.sources.contains(&table.def.id))
                .collect();
            if readers.is_empty() {
                rows.push((
                    table.def.qualified().display(),
                    p,
                    None,
                    None,
                    Some(end),
                    None,
                    None,
                ));
            }
            for reader in readers {
                let committed = reader
                    .committed
                    .get(&(table.def.id, p))
                    .copied()
                    .unwrap_or(0);
                rows.push((
                    table.def.qualified().display(),
                    p,
                    Some(reader.view.clone()),
                    Some(committed),
                    Some(end),
                    None,
                    None,
                ));
            }
        }
        // The connector feeding the table: per source partition, how far it has read (kept in
        // the table's log) and where the source ends.
        if let Some(connector) = table.def.option("connector") {
            for (p, progress) in table.progress.partitions() {
                rows.push((
                    table.def.qualified().display(),
                    p,
                    Some(format!("connector {connector}")),
                    progress.next,
                    progress.end,
                    Some(progress.skipped),
                    None,
                ));
            }
        }
    }
    // Each view reading a source: the source offset its committed state reflects.
    for (source, view, partitions) in engine.reader_progress() {
        let Some(consumer) = consumers.iter().find(|c| c.id == view) else {
            continue;
        };
        for (p, progress) in partitions {
            let committed = consumer.committed.get(&(source.def.id, p)).copied();
            rows.push((
                source.def.qualified().display(),
                p,
                Some(consumer.view.clone()),
                committed,
                progress.end,
                Some(progress.skipped),
                progress.reader,
            ));
        }
    }
    rows.sort();
    let columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from(
            rows.iter().map(|r| r.0.clone()).collect::<Vec<_>>(),
        )),
        Arc::new(UInt32Array::from(
            rows.iter().map(|r| r.1).collect::<Vec<_>>(),
        )),
        Arc::new(StringArray::from(
            rows.iter().map(|r| r.2.clone()).collect::<Vec<_>>(),
        )),
        Arc::new(UInt64Array::from(
            rows.iter().map(|r| r.3).collect::<Vec<_>>(),
        )),
        Arc::new(UInt64Array::from(
            rows.iter().map(|r| r.4).collect::<Vec<_>>(),
        )),
        Arc::new(UInt64Array::from(
            rows.iter()
                .map(|r| Some(r.4?.saturating_sub(r.3?)))
                .collect::<Vec<_>>(),
        )),
        Arc::new(UInt64Array::from(
            rows.iter().map(|r| r.5).collect::<Vec<_>>(),
        )),
        Arc::new(UInt64Array::from(
            rows.iter().map(|r| r.6).collect::<Vec<_>>(),
        )),
    ];
    batch("eddy_source_offsets", source_offsets_schema(), columns)
}

fn dead_letters_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("object", DataType::Utf8, false),
        Field::new("partition", DataType::UInt32, true),
        Field::new("offset", DataType::UInt64, true),
        Field::new("raw", DataType::Binary, true),
        Field::new("error", DataType::Utf8, false),
        Field::new(
            "received_at",
            DataType::Timestamp(TimeUnit::Microsecond, Some(eddy_sql::types::UTC.into())),
            false,
        ),
        Field::new("key", DataType::Binary, true),
    ]))
}

/// Records a table or source could not take (stored, until replayed) and rows a view could
/// not evaluate (kept by the view runtime, rebuilt when the view replays). `raw` is the
/// record's value (NULL for a Kafka tombstone), `key` its key.
fn dead_letters(engine: &Engine) -> Result<(SchemaRef, RecordBatch)> {
    // (object, partition, offset, raw, error, received at, key)
    type Row = (
        String,
        Option<u32>,
        Option<u64>,
        Option<Vec<u8>>,
        String,
        i64,
        Option<Vec<u8>>,
    );
    let mut rows: Vec<Row> = engine
        .dead_letters()?
        .into_iter()
        .map(|l| {
            (
                engine
                    .object_name(l.object)
                    .unwrap_or_else(|| format!("object {}", l.object)),
                l.partition,
                l.offset,
                l.raw,
                l.error,
                l.received_at_micros,
                l.key,
            )
        })
        .collect();
    for l in engine.runtime().dead_letters() {
        let at = l
            .received_at
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as i64);
        rows.push((
            l.view,
            None,
            None,
            Some(l.row.into_bytes()),
            l.error,
            at,
            None,
        ));
    }
    let columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from(
            rows.iter().map(|r| r.0.clone()).collect::<Vec<_>>(),
        )),
        Arc::new(UInt32Array::from(
            rows.iter().map(|r| r.1).collect::<Vec<_>>(),
        )),
        Arc::new(UInt64Array::from(
            rows.iter().map(|r| r.2).collect::<Vec<_>>(),
        )),
        Arc::new(arrow::array::BinaryArray::from(
            rows.iter().map(|r| r.3.as_deref()).collect::<Vec<_>>(),
        )),
        Arc::new(StringArray::from(
            rows.iter().map(|r| r.4.clone()).collect::<Vec<_>>(),
        )),
        Arc::new(
            TimestampMicrosecondArray::from(rows.iter().map(|r| r.5).collect::<Vec<_>>())
                .with_timezone(eddy_sql::types::UTC),
        ),
        Arc::new(arrow::array::BinaryArray::from(
            rows.iter().map(|r| r.6.as_deref()).collect::<Vec<_>>(),
        )),
    ];
    batch("eddy_dead_letters", dead_letters_schema(), columns)
}
