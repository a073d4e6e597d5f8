//! Vocabulary every Eddy crate shares: errors with SQLSTATEs, identifiers, offsets, limits and
//! the clock.
//!
//! No I/O lives here. Everything is small, plain data so that `storage`, `sql`, `dataflow`,
//! `engine` and `server` can talk about the same things without depending on each other.

mod error;
mod ids;
pub mod limits;
pub mod panic;
pub mod time;

pub use error::{Error, Result, SqlState};
pub use ids::{ObjectId, Offset, PartitionId, TxnId};
mod change;
pub use change::ChangeBatch;

/// `s` as a JSON string literal, quoted and escaped as PostgreSQL's JSON output escapes it.
pub fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}
