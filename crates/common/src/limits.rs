//! Every limit Eddy enforces, named in one place. Hitting one is an error with a SQLSTATE
//! (54000 or 53000), never silent growth.

/// Largest statement text accepted from a client, in bytes.
pub const STATEMENT_BYTES_MAX: usize = 16 * 1024 * 1024;

/// Largest single log record (one transaction's changes to one table), in bytes.
pub const LOG_RECORD_BYTES_MAX: usize = 256 * 1024 * 1024;

/// Bytes of changes a sink may have waiting to be written before it is handed the view's
/// whole contents instead, once it catches up (`--sink-buffer-bytes`).
pub const SINK_BUFFER_BYTES: usize = 64 * 1024 * 1024;
/// Idle decisions about tables' watermarks waiting to be recorded in their logs; past it the
/// runtime asks again at its next look (one per table is in flight at most anyway).
pub const WATERMARK_MARKS_IN_FLIGHT_MAX: usize = 64;

/// A log segment is closed and a new one started once it passes this size.
pub const LOG_SEGMENT_BYTES_TARGET: u64 = 64 * 1024 * 1024;

/// Rows per Arrow batch produced by scans and COPY.
pub const BATCH_ROWS_MAX: usize = 8192;

/// Commit requests waiting for the log writer; more make writers wait (back-pressure).
pub const COMMIT_QUEUE_CAPACITY: usize = 1024;

/// Columns in one table.
pub const TABLE_COLUMNS_MAX: usize = 1600;

/// Late rows kept in `eddy_late_events` (the oldest are forgotten first).
pub const LATE_EVENTS_KEPT_MAX: usize = 100_000;
/// Epochs a subscriber may fall behind before it is dropped with 53000 (a slow subscriber
/// never stalls the dataflow).
pub const SUBSCRIBER_LAG_EPOCHS_MAX: usize = 1024;

/// Messages waiting for the view runtime before writers wait (back-pressure).
pub const RUNTIME_QUEUE_CAPACITY: usize = 1024;
/// KiB of changes waiting for the view runtime before writers (and connectors) wait: a slow
/// view makes sources pause instead of the server buffering without bound.
pub const RUNTIME_QUEUE_KIB: u32 = 256 * 1024;
/// KiB of changes handed to one view's dataflow thread and not yet handled before the runtime
/// waits for that view (its budget): memory stays bounded when a view is slower than its
/// inputs.
pub const VIEW_QUEUE_KIB: u32 = 16 * 1024;
/// MiB of changes past its in-memory budget a view may have in its spill file (on disk, in the
/// data directory) before the runtime waits for it, throttling the writers.
pub const VIEW_SPILL_MIB_MAX: u64 = 1024;
/// How long the end of an epoch waits for a view that no other view reads before it goes on
/// without it: the view is then *behind* (`eddy_views.lag_epochs`), its contents stay at the
/// last epoch it completed and it catches up on its own while the others go on.
pub const VIEW_LAG_AFTER_MS: u64 = 1000;
/// During a backfill, operators end an epoch (emitting and freeing closed windows) after this
/// many rows, so state stays bounded as it does live.
pub const BACKFILL_EPOCH_ROWS: usize = 100_000;
/// A backfill reads each partition of a table's log this many records at a time (each record
/// one commit, at most `LOG_RECORD_BYTES_MAX`): memory stays bounded by the partitions it
/// merges, not by the log, and appends to the partition wait only for one such read.
pub const BACKFILL_READ_RECORDS: u64 = 64;

/// Most partitions a table may have (and splits a Nexmark generator).
pub const PARTITIONS_MAX: u32 = 1024;
/// Bytes a connector reads per chunk (one commit) from a followed file, per worker decoding it,
/// and per Kafka fetch.
pub const CONNECTOR_CHUNK_BYTES: usize = 4 << 20;
/// Event ids a Nexmark split generates per chunk (one commit).
pub const NEXMARK_CHUNK_EVENTS: u64 = 16_384;
/// A Kafka partition's chunk for a cursor's reach: a view's reader of a partition joins the
/// views reading it together once it is within [`CURSOR_MERGE_CHUNKS`] of these behind them.
pub const CURSOR_MERGE_RECORDS: u64 = 16_384;
/// Milliseconds between asking a Kafka topic that tables and views read for partitions added
/// to it (each new one is read from its earliest record). Flink's Kafka source asks every
/// 5 minutes by default; a metadata request is cheap, and a new partition's rows should not
/// wait minutes.
pub const KAFKA_PARTITION_DISCOVERY_MS: u64 = 10_000;
/// How many chunks behind the views reading a source together a view's reader may be and
/// still join them: it reads up to their position with their reader held, which pauses them
/// meanwhile. One chunk was too few: a reader that left for want of room restarts a chunk
/// behind, and while its view catches up the others move on, so it stayed apart (and the
/// source was decoded twice) until they stopped (docs/benchmarks.md).
pub const CURSOR_MERGE_CHUNKS: u64 = 4;
/// A Kafka sink's produce request stays below this many bytes of keys and values.
pub const KAFKA_PRODUCE_BYTES_MAX: usize = 512 * 1024;
/// Largest HTTP ingest body accepted, in bytes.
pub const INGEST_BODY_BYTES_MAX: usize = 256 * 1024 * 1024;
