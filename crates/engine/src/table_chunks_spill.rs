//! A view's contents' chunks past the memory budget (ADR 0012): at the end of a write, the
//! chunks in memory report their bytes to the server's budget and, past their share, the
//! coldest sealed chunks (not the one appends go to) are written to Arrow IPC files, their
//! deleted rows dropped first. A scan reads a chunk on disk back for the scan only; a compaction
//! or a relabel brings it back into memory. Deletions of rows on disk are bits in memory, as
//! for any chunk. Like spilled operator state, the files are a cache of the contents: nothing
//! is synced, and the directory is emptied at every start.
//!
//! The runtime publishes a view's contents for queries as [`ViewRows`]: the chunks in memory
//! (shared) and, for chunks on disk, their open files and which rows are deleted; a query
//! reads the files of the views it scans, on its own task. A file stays readable while a
//! published snapshot holds it, after its chunk came back into memory (it is deleted when
//! the last holder lets go); it is not held open between reads.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use eddy_dataflow::spill::MemoryBudget;

use super::*;

/// Where one view's chunks spill.
pub(super) struct ChunkSpill {
    budget: Arc<MemoryBudget>,
    dir: PathBuf,
    /// Bytes last reported to the budget.
    reported: usize,
    next_file: u64,
}

impl Drop for ChunkSpill {
    fn drop(&mut self) {
        self.budget.report(self.reported, 0);
        // The chunks were dropped first (a field before this one), deleting their files but
        // those a published snapshot still reads: the directory goes once empty; one left
        // behind goes at the next start, which empties the spill directory.
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// The chunks' spill link, if they have one. A copy of chunks (a transaction's private copy
/// of a table) never spills, so a clone starts without one; a view's contents, the only
/// chunks that spill, are never copied.
#[derive(Default)]
pub(super) struct SpillSlot(Option<Box<ChunkSpill>>);

impl Clone for SpillSlot {
    fn clone(&self) -> Self {
        SpillSlot(None)
    }
}

impl Chunks {
    /// Keeps the chunks within their share of `budget` from now on, spilling the rest.
    pub fn spill_to(&mut self, budget: &Arc<MemoryBudget>) {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let dir = budget
            .files_dir()
            .join(format!("contents-{}", NEXT.fetch_add(1, Ordering::Relaxed)));
        self.spill = SpillSlot(Some(Box::new(ChunkSpill {
            budget: Arc::clone(budget),
            dir,
            reported: 0,
            next_file: 0,
        })));
    }

    /// Ends a write: reports the chunks in memory to the budget and, past it, writes the
    /// coldest sealed ones to files until the chunks are within their share.
    pub fn settle(&mut self) -> Result<()> {
        self.tick += 1;
        let Some(mut spill) = self.spill.0.take() else {
            return Ok(());
        };
        let result = self.settle_with(&mut spill);
        self.spill.0 = Some(spill);
        result
    }

    fn settle_with(&mut self, spill: &mut ChunkSpill) -> Result<()> {
        let mut now = self.resident_bytes();
        let total = spill.budget.report(spill.reported, now);
        spill.reported = now;
        let limit = spill.budget.limit();
        if total > limit {
            let target = (now as u128 * limit as u128 / total.max(1) as u128) as usize;
            let mut cold: Vec<u32> = (0..self.chunks.len() as u32)
                .filter(|&id| {
                    let chunk = &self.chunks[id as usize];
                    Some(id) != self.tail && chunk.file.is_none() && chunk.live() > 0
                })
                .collect();
            cold.sort_unstable_by_key(|&id| self.chunks[id as usize].touched);
            for id in cold {
                if now <= target {
                    break;
                }
                now = now.saturating_sub(bytes(&self.chunks[id as usize]));
                self.write_out(spill, id)?;
            }
            let after = self.resident_bytes();
            spill.budget.report(spill.reported, after);
            spill.reported = after;
        }
        Ok(())
    }

    /// Writes chunk `id` (in memory, sealed) to a file and drops its rows from memory.
    fn write_out(&mut self, spill: &mut ChunkSpill, id: u32) -> Result<()> {
        let chunk = &mut self.chunks[id as usize];
        chunk.merge(&self.schema)?;
        chunk.filter()?;
        std::fs::create_dir_all(&spill.dir).map_err(|e| Error::io("spilling a view's rows", e))?;
        let path = spill.dir.join(format!("{}.arrow", spill.next_file));
        spill.next_file += 1;
        chunk.file = Some(SpilledFile::create(path, &chunk.batch)?);
        chunk.batch = RecordBatch::new_empty(Arc::clone(&self.schema));
        Ok(())
    }

    /// Whether the chunks spill past a budget.
    pub(super) fn spills(&self) -> bool {
        self.spill.0.is_some()
    }

    /// Whether a chunk is on disk.
    pub fn spilled(&self) -> bool {
        self.chunks.iter().any(|c| c.file.is_some())
    }

    /// Rows held in chunks on disk.
    pub fn spilled_rows(&self) -> usize {
        self.chunks
            .iter()
            .filter(|c| c.file.is_some())
            .map(Chunk::live)
            .sum()
    }

    /// The rows as [`ViewRows`]: chunks in memory shared (their deleted rows dropped first),
    /// chunks on disk as their files and which of their rows are deleted since.
    pub fn pieces(&mut self) -> Result<ViewRows> {
        let mut pieces = Vec::with_capacity(self.chunks.len());
        for chunk in self.chunks.iter_mut().filter(|c| c.live() > 0) {
            if let Some(file) = &chunk.file {
                let keep = (chunk.unfiltered > 0).then(|| {
                    (0..chunk.positions_held())
                        .map(|i| Some(!chunk.deleted[chunk.position(i) as usize]))
                        .collect()
                });
                pieces.push(Piece::Spilled {
                    file: Arc::clone(file),
                    keep,
                });
                continue;
            }
            chunk.merge(&self.schema)?;
            chunk.filter()?;
            pieces.push(Piece::Rows(chunk.batch.clone()));
        }
        Ok(ViewRows::Pieces {
            schema: Arc::clone(&self.schema),
            pieces,
        })
    }

    /// The rows from position `start` on, in the order they were appended, as [`ViewRows`]
    /// (chunks that only ever got appends: a view's contents since a save that held `start`
    /// rows).
    pub fn pieces_from(&mut self, start: usize) -> Result<ViewRows> {
        let mut pieces = Vec::new();
        let mut end = 0;
        for chunk in &mut self.chunks {
            let first = end;
            end += chunk.rows;
            if end <= start {
                continue;
            }
            if chunk.deleted_rows > 0 || !chunk.positions.is_empty() {
                return Err(Error::internal(
                    "rows appended to a view's contents since a save were deleted",
                ));
            }
            let skip = start.saturating_sub(first);
            if let Some(file) = &chunk.file {
                let keep = (skip > 0).then(|| (0..chunk.rows).map(|i| Some(i >= skip)).collect());
                pieces.push(Piece::Spilled {
                    file: Arc::clone(file),
                    keep,
                });
                continue;
            }
            chunk.merge(&self.schema)?;
            pieces.push(Piece::Rows(chunk.batch.slice(skip, chunk.rows - skip)));
        }
        Ok(ViewRows::Pieces {
            schema: Arc::clone(&self.schema),
            pieces,
        })
    }

    /// Bytes of the chunks' rows in memory.
    fn resident_bytes(&self) -> usize {
        self.chunks
            .iter()
            .filter(|c| c.file.is_none())
            .map(bytes)
            .sum()
    }

    /// Brings chunk `id` back into memory if it is on disk (its file is deleted).
    pub(super) fn load(&mut self, id: u32) -> Result<()> {
        let chunk = &mut self.chunks[id as usize];
        let Some(file) = chunk.file.take() else {
            return Ok(());
        };
        chunk.batch = file.read(&self.schema)?;
        Ok(())
    }

    /// Lets go of chunk `id`'s file, if it has one (its rows are all deleted).
    pub(super) fn forget_file(&mut self, id: u32) {
        self.chunks[id as usize].file = None;
    }
}

/// A view's contents as published for queries (see the module documentation).
pub enum ViewRows {
    /// All in memory.
    Rows(Arc<Vec<RecordBatch>>),
    /// Some chunks on disk.
    Pieces {
        schema: SchemaRef,
        pieces: Vec<Piece>,
    },
}

pub enum Piece {
    Rows(RecordBatch),
    /// A chunk on disk, and which of its rows are kept (`None`: all).
    Spilled {
        file: Arc<SpilledFile>,
        keep: Option<BooleanArray>,
    },
}

impl std::fmt::Debug for ViewRows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ViewRows::Rows(rows) => write!(f, "ViewRows({} batches)", rows.len()),
            ViewRows::Pieces { pieces, .. } => write!(f, "ViewRows({} pieces)", pieces.len()),
        }
    }
}

impl ViewRows {
    /// The rows as batches, spilled ones read back.
    pub fn batches(&self) -> Result<Arc<Vec<RecordBatch>>> {
        if let ViewRows::Rows(rows) = self {
            return Ok(Arc::clone(rows));
        }
        let mut out = Vec::new();
        self.for_each(|batch| {
            out.push(batch);
            Ok(())
        })?;
        Ok(Arc::new(out))
    }

    /// Hands each batch of the rows to `f` in turn, spilled ones read back one at a time.
    pub fn for_each(&self, mut f: impl FnMut(RecordBatch) -> Result<()>) -> Result<()> {
        let (schema, pieces) = match self {
            ViewRows::Rows(rows) => return rows.iter().cloned().try_for_each(f),
            ViewRows::Pieces { schema, pieces } => (schema, pieces),
        };
        for piece in pieces {
            f(match piece {
                Piece::Rows(batch) => batch.clone(),
                Piece::Spilled { file, keep: None } => file.read(schema)?,
                Piece::Spilled {
                    file,
                    keep: Some(keep),
                } => arrow::compute::filter_record_batch(&file.read(schema)?, keep)
                    .map_err(|e| arrow_error("filter rows", e))?,
            })?;
        }
        Ok(())
    }
}

/// The rows of the [`ViewRows`] `rows` yields (with the columns it names, all when `None`) as
/// a stream labelled `schema`: read on a blocking thread a couple of pieces ahead of the
/// consumer, those on disk from their files; dropping the stream stops the read at its next
/// piece.
pub fn stream_pieces(
    schema: SchemaRef,
    rows: impl std::future::Future<Output = Result<(Arc<ViewRows>, Option<Vec<usize>>)>>
    + Send
    + 'static,
) -> datafusion::physical_plan::SendableRecordBatchStream {
    use datafusion::error::DataFusionError;
    let (tx, rx) = tokio::sync::mpsc::channel::<datafusion::error::Result<RecordBatch>>(2);
    let target = Arc::clone(&schema);
    tokio::spawn(async move {
        let (rows, projection) = match rows.await {
            Ok(found) => found,
            Err(e) => {
                let _ = tx.send(Err(DataFusionError::External(Box::new(e)))).await;
                return;
            }
        };
        tokio::task::spawn_blocking(move || {
            let result = rows.for_each(|batch| {
                let batch = match &projection {
                    Some(p) => batch
                        .project(p)
                        .map_err(|e| arrow_error("project a view's rows", e))?,
                    None => batch,
                };
                let batch = crate::table_log::labelled(&target, &batch)?;
                tx.blocking_send(Ok(batch))
                    .map_err(|_| Error::internal("the scan's reader went away"))
            });
            if let Err(e) = result {
                let _ = tx.blocking_send(Err(DataFusionError::External(Box::new(e))));
            }
        });
    });
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    Box::pin(datafusion::physical_plan::stream::RecordBatchStreamAdapter::new(schema, stream))
}

/// A chunk's rows in a file: readable by whoever holds it, deleted when the last holder lets
/// go. It is opened for each read (a view of a billion rows has 120 000 such files; holding
/// them open would pass the process's limit of open files).
pub struct SpilledFile {
    path: PathBuf,
}

impl SpilledFile {
    fn create(path: PathBuf, batch: &RecordBatch) -> Result<Arc<SpilledFile>> {
        write(&path, batch)?;
        Ok(Arc::new(SpilledFile { path }))
    }

    /// The rows, under `schema`.
    pub(super) fn read(&self, schema: &SchemaRef) -> Result<RecordBatch> {
        let bytes =
            std::fs::read(&self.path).map_err(|e| Error::io("reading a view's spilled rows", e))?;
        let reader = arrow::ipc::reader::FileReader::try_new(std::io::Cursor::new(bytes), None)
            .map_err(|e| arrow_error("reading a view's spilled rows", e))?;
        let batches = reader
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| arrow_error("reading a view's spilled rows", e))?;
        arrow::compute::concat_batches(schema, &batches)
            .map_err(|e| arrow_error("reading a view's spilled rows", e))
    }
}

impl Drop for SpilledFile {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_file(&self.path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(file = %self.path.display(), error = %e, "could not delete a view's spilled rows");
        }
    }
}

/// Bytes of a chunk's rows in memory (of their slices of shared buffers).
fn bytes(chunk: &Chunk) -> usize {
    let size = |b: &RecordBatch| -> usize {
        b.columns()
            .iter()
            .map(|a| a.to_data().get_slice_memory_size().unwrap_or(0))
            .sum()
    };
    size(&chunk.batch) + chunk.appended.iter().map(size).sum::<usize>()
}

fn write(path: &Path, batch: &RecordBatch) -> Result<()> {
    let io = |e: std::io::Error| Error::io("spilling a view's rows", e);
    let file = std::fs::File::create(path).map_err(io)?;
    let mut writer =
        arrow::ipc::writer::FileWriter::try_new(std::io::BufWriter::new(file), &batch.schema())
            .map_err(|e| arrow_error("spilling a view's rows", e))?;
    writer
        .write(batch)
        .and_then(|()| writer.finish())
        .map_err(|e| arrow_error("spilling a view's rows", e))
}
