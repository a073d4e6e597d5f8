//! Where events come from and where views go: record formats (JSON, CSV, upsert, Debezium)
//! decoded into Arrow batches, the connectors that read them (a file followed like `tail -f`;
//! Kafka; the Nexmark generator), and the sinks that write views out ([`sink`]: PostgreSQL,
//! Kafka, files).
//!
//! This crate decodes and reads; it never writes Eddy's log or catalog. A connector hands
//! the engine chunks of [`format::RawRecord`]s with their source positions, and the engine
//! appends the decoded rows together with the position, so that a restart resumes exactly.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod file;
pub mod format;
pub mod kafka;
pub mod nexmark;
pub mod sink;

pub use format::{Decoded, Encoding, Envelope, Format, Include, RawRecord, RecordDecoder, RowKind};
