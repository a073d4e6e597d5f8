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
