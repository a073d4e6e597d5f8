//! The file connector's loop: reads complete lines of a followed file from where its feed got
//! to, decodes each chunk in one part per worker at once, and delivers the parts in order, each
//! committed with the file position after it.
//!
//! Reading the next chunk ahead while the current one is delivered was tried and measured
//! slower on two cores (the read-ahead competes with the view runtime for them;
//! docs/benchmarks.md): one chunk at a time.

use std::ops::Range;
use std::sync::Arc;

use eddy_common::limits::CONNECTOR_CHUNK_BYTES;
use eddy_common::{Error, Result, SqlState};
use eddy_connectors::file::{FileTail, Lines};
use eddy_connectors::{Decoded, RecordDecoder};
use eddy_dataflow::Workers;
use tokio::task::JoinHandle;

use super::{Feed, POLL_INTERVAL, Refresh};
use crate::Engine;

/// A chunk read and decoded.
struct Chunk {
    lines: Lines,
    /// Per part: its lines (indices into `lines`) and the file position after it.
    parts: Vec<(Range<usize>, u64)>,
    /// Per part, its rows.
    decoded: Vec<Result<Decoded>>,
    /// The file's size when the chunk was read.
    size: u64,
}

/// A read in progress, handing the tail back with what it read.
type Reading = JoinHandle<(FileTail, Result<Chunk>)>;

/// Starts reading and decoding the next chunk off the async threads: about `bytes`, cut at
/// line boundaries into one part per worker, decoded in parallel. `spare`: the lines of a
/// chunk already delivered, whose buffer the read fills again.
fn start_read(
    mut tail: FileTail,
    spare: Option<Lines>,
    decoder: &RecordDecoder,
    workers: &Workers,
    bytes: usize,
) -> Reading {
    if let Some(lines) = spare {
        tail.reuse(lines);
    }
    let (decoder, workers) = (decoder.clone(), workers.clone());
    tokio::task::spawn_blocking(move || {
        let chunk = tail.next_lines(bytes).map(|lines| {
            let parts = lines.parts(workers.count());
            let decoded = workers.run_parts(parts.len(), |i| {
                let part = parts[i].0.clone();
                decoder.decode_joined(&lines.records(part.clone()), lines.joined_part(part))
            });
            Chunk {
                size: tail.size(),
                lines,
                parts,
                decoded,
            }
        });
        (tail, chunk)
    })
}

async fn finish(reading: Reading) -> Result<(FileTail, Result<Chunk>)> {
    reading
        .await
        .map_err(|e| Error::internal(format!("file reader: {e}")))
}

impl Engine {
    /// Follows the file of `feed`'s object until the object is dropped (or, for a cursor,
    /// until it retires).
    pub(super) async fn follow_file(self: &Arc<Self>, mut feed: Feed) -> Result<()> {
        let path = feed.def().option("path").unwrap_or_default().to_owned();
        let start = feed.position(0).unwrap_or(0);
        let mut decoder = feed.decoder()?;
        tracing::info!(object = %feed.name(), path, start, "following a file");
        let mut tail = FileTail::new(&path, start);
        let mut spare = None;
        let chunk_bytes = CONNECTOR_CHUNK_BYTES * self.workers.count();
        let mut merging = None;
        loop {
            if let Refresh::Gone = feed.follow_changes(self, &mut decoder)? {
                return Ok(());
            }
            feed.merging(&mut merging, chunk_bytes as u64);
            if feed.merged(&mut merging, tail.position()).await {
                return Ok(());
            }
            // Merging: up to the cursor ahead (a line boundary) and not past it.
            let bytes = merging.as_ref().map_or(chunk_bytes, |m| {
                chunk_bytes.min((m.at() - tail.position()) as usize)
            });
            let (t, chunk) = finish(start_read(
                tail,
                spare.take(),
                &decoder,
                &self.workers,
                bytes,
            ))
            .await?;
            tail = t;
            let Chunk {
                lines,
                parts,
                decoded,
                size,
            } = chunk?;
            feed.set_end(0, size);
            if lines.is_empty() {
                merging = None;
                spare = Some(lines);
                feed.reached_end(Some(0));
                tokio::time::sleep(POLL_INTERVAL).await;
                continue;
            }
            let mut delivered = Ok(());
            for ((part, end), decoded) in parts.into_iter().zip(decoded) {
                let records = lines.records(part);
                delivered = match decoded {
                    Ok(decoded) => {
                        self.deliver(
                            &feed,
                            decoded,
                            &records,
                            &[(0, end)],
                            None,
                            merging.is_some(),
                        )
                        .await
                    }
                    Err(e) => Err(e),
                };
                if delivered.is_err() {
                    break;
                }
            }
            spare = Some(lines);
            match delivered {
                Ok(()) => {}
                Err(e) if e.state == SqlState::UNDEFINED_TABLE => return Ok(()),
                Err(e) if e.state == SqlState::SERIALIZATION_FAILURE => {
                    // Altered while decoding: read again, with the new definition, from where
                    // the feed got to.
                    tail.seek(feed.position(0).unwrap_or(start));
                }
                Err(e) => return Err(e),
            }
        }
    }
}
