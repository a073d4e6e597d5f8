//! Durable storage: the append-only log (`log`) and the metadata store (`meta`).
//!
//! Entry points: [`log::LogStore`] for table data, [`meta::MetaStore`] for the catalog.
//! Invariants: a write is acknowledged only after it is fsync'd; a torn tail (a frame whose
//! length or CRC does not check out) is truncated at start-up and never served; this is the
//! only crate that names sled trees or keys.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod log;
pub mod meta;
