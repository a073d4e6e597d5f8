//! Where events come from: record formats (JSON, CSV, upsert, Debezium) decoded into Arrow
//! batches, and the connectors that read them (a file followed like `tail -f`; Kafka).
//!
//! This crate decodes and reads; it never writes Eddy's log or catalog. A connector hands
//! the engine chunks of [`format::RawRecord`]s with their source positions, and the engine
//! appends the decoded rows together with the position, so that a restart resumes exactly.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod file;
pub mod format;
pub mod kafka;
pub mod nexmark;
pub mod postgres_sink;

pub use format::{Decoded, Encoding, Envelope, Format, Include, RawRecord, RecordDecoder, RowKind};
