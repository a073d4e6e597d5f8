//! Vocabulary every Eddy crate shares: errors with SQLSTATEs, identifiers, offsets and limits.
//!
//! No I/O lives here. Everything is small, plain data so that `storage`, `sql`, `dataflow`,
//! `engine` and `server` can talk about the same things without depending on each other.

mod error;
mod ids;
pub mod limits;

pub use error::{Error, Result, SqlState};
pub use ids::{ObjectId, Offset, PartitionId, TxnId};
mod change;
pub use change::ChangeBatch;
