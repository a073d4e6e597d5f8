//! The file connector's loop: reads complete lines of a followed file from where its feed got
//! to, decodes each chunk in one part per worker at once, and delivers the parts in order, each
//! committed with the file position after it. The next chunk is read and decoded while the
//! current one is delivered; what was read ahead is dropped and read again when the object's
//! definition changes or a delivery must be retried.

use std::ops::Range;

use eddy_common::{Error, Result, SqlState};
use eddy_connectors::file::{FileTail, Lines};
use eddy_connectors::{Decoded, RecordDecoder};
use eddy_dataflow::Workers;
use tokio::task::JoinHandle;

use super::{CHUNK_BYTES, Feed, POLL_INTERVAL, Refresh};
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

/// Starts reading and decoding the next chunk off the async threads: about [`CHUNK_BYTES`] per
/// worker, cut at line boundaries into one part per worker, decoded in parallel. `spare`: the
/// lines of a chunk already delivered, whose buffer the read fills again.
fn start_read(
    mut tail: FileTail,
    spare: Option<Lines>,
    decoder: &RecordDecoder,
    workers: &Workers,
) -> Reading {
    if let Some(lines) = spare {
        tail.reuse(lines);
    }
    let (decoder, workers) = (decoder.clone(), workers.clone());
    tokio::task::spawn_blocking(move || {
        let chunk = tail.next_lines(CHUNK_BYTES * workers.count()).map(|lines| {
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
    /// Follows the file of `feed`'s object until the object is dropped (or the view stops
    /// reading it).
    pub(super) async fn follow_file(&self, mut feed: Feed) -> Result<()> {
        let path = feed.def().option("path").unwrap_or_default().to_owned();
        let start = feed.progress().next(0).unwrap_or(0);
        let mut decoder = feed.decoder()?;
        tracing::info!(object = %feed.name(), path, start, "following a file");
        let mut reading = start_read(FileTail::new(&path, start), None, &decoder, &self.workers);
        let mut spare = None;
        loop {
            let refresh = feed.follow_changes(self, &mut decoder)?;
            let (mut tail, chunk) = finish(reading).await?;
            match refresh {
                Refresh::Gone => return Ok(()),
                Refresh::Changed => {
                    // Read again, with the new definition, from where the feed got to.
                    tail.seek(feed.progress().next(0).unwrap_or(start));
                    reading = start_read(tail, spare.take(), &decoder, &self.workers);
                    continue;
                }
                Refresh::Same => {}
            }
            let Chunk {
                lines,
                parts,
                decoded,
                size,
            } = chunk?;
            feed.progress().set_end(0, size);
            if lines.is_empty() {
                feed.reached_end(Some(0));
                tokio::time::sleep(POLL_INTERVAL).await;
                reading = start_read(tail, Some(lines), &decoder, &self.workers);
                continue;
            }
            reading = start_read(tail, spare.take(), &decoder, &self.workers);
            let mut delivered = Ok(());
            for ((part, end), decoded) in parts.into_iter().zip(decoded) {
                let records = lines.records(part);
                delivered = match decoded {
                    Ok(decoded) => {
                        self.deliver(&feed, decoded, &records, &[(0, end)], 0, None)
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
                    // Altered while decoding: what was read ahead goes too; the next turn
                    // reads again from where the feed got to.
                    let (mut tail, _) = finish(reading).await?;
                    tail.seek(feed.progress().next(0).unwrap_or(start));
                    reading = start_read(tail, spare.take(), &decoder, &self.workers);
                }
                Err(e) => return Err(e),
            }
        }
    }
}
