//! A table's rows as Arrow chunks with deletion vectors.
//!
//! Rows are appended to the last chunk until it holds [`CHUNK_ROWS`], then to a new one; a
//! deleted row is a bit in its chunk's deletion vector. A scan clones the chunks (reference
//! counts) and filters only the chunks with rows deleted since the last scan, so a write costs
//! its rows and one chunk, not the table. The filtered rows replace the chunk's (they are not
//! kept twice): a chunk remembers which of its rows' positions each row it holds is, so the
//! positions (and the caller's index) stay. A chunk whose rows held are more than half
//! deleted is compacted: its deleted rows are dropped the same way (a chunk on disk is read
//! back for it), and the survivors keep their positions, so no index entry moves; a chunk
//! whose rows are all deleted is freed.
//!
//! A view's contents keep their chunks within the server's memory budget: past their share,
//! the coldest sealed chunks are written to files and read back when scanned
//! ([`Chunks::spill_to`], `table_chunks_spill.rs`). Contents that only ever got inserts are
//! chunks without an index (rows are placed, never looked up).

use std::sync::Arc;

use arrow::array::{BooleanArray, RecordBatch};
use arrow::datatypes::SchemaRef;
use eddy_common::{Error, Result, limits};

/// Rows per chunk (a scan's batches are at most this long).
pub const CHUNK_ROWS: usize = limits::BATCH_ROWS_MAX;

/// Where a row is: its chunk and its index within the chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Loc {
    pub chunk: u32,
    pub row: u32,
}

impl Loc {
    pub fn to_bytes(self) -> [u8; 8] {
        let mut out = [0; 8];
        out[..4].copy_from_slice(&self.chunk.to_le_bytes());
        out[4..].copy_from_slice(&self.row.to_le_bytes());
        out
    }

    pub fn from_bytes(bytes: &[u8]) -> Loc {
        let word = |at: usize| {
            let mut b = [0; 4];
            b.copy_from_slice(&bytes[at..at + 4]);
            u32::from_le_bytes(b)
        };
        Loc {
            chunk: word(0),
            row: word(4),
        }
    }
}

#[derive(Clone)]
struct Chunk {
    /// The rows held: row `i` is at position `positions[i]` (at `i` while `positions` is
    /// empty). A scan drops the deleted rows from it.
    batch: RecordBatch,
    /// Rows appended after `batch`, merged into it when the chunk is read (so that many small
    /// appends, as a log replay makes, copy the chunk once).
    appended: Vec<RecordBatch>,
    /// Positions given out (rows held and deleted).
    rows: usize,
    /// The position of each row of `batch`, once a scan dropped rows from it.
    positions: Vec<u32>,
    /// One flag per position (empty while nothing is deleted).
    deleted: Vec<bool>,
    deleted_rows: usize,
    /// Deleted rows still in `batch`.
    unfiltered: usize,
    /// On disk: the file that holds `batch` (then empty in memory), as it was when written.
    file: Option<Arc<spill::SpilledFile>>,
    /// The [`Chunks::tick`] of its last change, for choosing which chunks to spill.
    touched: u64,
}

impl Chunk {
    fn live(&self) -> usize {
        self.rows - self.deleted_rows
    }

    fn merge(&mut self, schema: &SchemaRef) -> Result<()> {
        if self.appended.is_empty() {
            return Ok(());
        }
        let parts = std::iter::once(&self.batch).chain(&self.appended);
        self.batch = arrow::compute::concat_batches(schema, parts)
            .map_err(|e| arrow_error("append rows", e))?;
        self.appended.clear();
        Ok(())
    }

    /// Rows held in `batch` (or in its file), deleted ones included.
    fn positions_held(&self) -> usize {
        if self.positions.is_empty() {
            self.rows
        } else {
            self.positions.len()
        }
    }

    /// The position of each row of `batch` (after [`Chunk::merge`]).
    fn position(&self, i: usize) -> u32 {
        match self.positions.get(i) {
            Some(p) => *p,
            None => i as u32,
        }
    }

    /// Drops the deleted rows from `batch` (after [`Chunk::merge`]; in memory).
    fn filter(&mut self) -> Result<()> {
        if self.unfiltered == 0 {
            return Ok(());
        }
        let held = self.batch.num_rows();
        let positions = (0..held)
            .map(|i| self.position(i))
            .filter(|p| !self.deleted[*p as usize])
            .collect();
        self.batch = self.without_deleted(&self.batch)?;
        self.positions = positions;
        self.unfiltered = 0;
        Ok(())
    }

    /// `batch` (the chunk's rows, in memory or read back) without the rows deleted since.
    fn without_deleted(&self, batch: &RecordBatch) -> Result<RecordBatch> {
        if self.unfiltered == 0 {
            return Ok(batch.clone());
        }
        let keep: BooleanArray = (0..batch.num_rows())
            .map(|i| Some(!self.deleted[self.position(i) as usize]))
            .collect();
        arrow::compute::filter_record_batch(batch, &keep).map_err(|e| arrow_error("filter rows", e))
    }
}

#[derive(Clone)]
pub struct Chunks {
    schema: SchemaRef,
    chunks: Vec<Chunk>,
    /// Chunks with no rows, to reuse.
    free: Vec<u32>,
    /// The chunk appends go to.
    tail: Option<u32>,
    live: usize,
    /// Where chunks past the memory budget go (a view's contents only). After `chunks`: it is
    /// dropped after them, once their files are deleted.
    spill: spill::SpillSlot,
    /// Counts changes, to date each chunk's last one.
    tick: u64,
}

#[path = "table_chunks_spill.rs"]
mod spill;
pub use spill::{ViewRows, stream_pieces};

fn arrow_error(context: &str, err: arrow::error::ArrowError) -> Error {
    Error::internal(format!("{context}: {err}"))
}

impl Chunks {
    pub fn new(schema: SchemaRef) -> Chunks {
        Chunks {
            schema,
            chunks: Vec::new(),
            free: Vec::new(),
            tail: None,
            live: 0,
            spill: spill::SpillSlot::default(),
            tick: 0,
        }
    }

    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// Rows held (not deleted).
    pub fn len(&self) -> usize {
        self.live
    }

    /// Appends `batch` (of this table's schema); `placed` gets each row's location, in order
    /// (for an index; `None`: rows nobody looks up, a view's contents that only insert).
    pub fn append(&mut self, batch: &RecordBatch, mut placed: Option<&mut Vec<Loc>>) -> Result<()> {
        // A batch larger than a chunk is cut into pieces. Where chunks spill, each piece gets
        // buffers of its own: a slice keeps the whole batch's buffers alive while any other
        // piece is in memory, so a piece written to disk would free nothing.
        let own = self.spills() && batch.num_rows() > CHUNK_ROWS;
        let mut at = 0;
        while at < batch.num_rows() {
            let tail = match self.tail {
                Some(t) if self.chunks[t as usize].rows < CHUNK_ROWS => t,
                _ => self.new_chunk()?,
            };
            let chunk = &mut self.chunks[tail as usize];
            let start = chunk.rows;
            let n = (CHUNK_ROWS - start).min(batch.num_rows() - at);
            let mut piece = batch.slice(at, n);
            if own {
                let rows = arrow::array::UInt32Array::from_iter_values(0..n as u32);
                piece = arrow::compute::take_record_batch(&piece, &rows)
                    .map_err(|e| arrow_error("copy appended rows", e))?;
            }
            if start == 0 {
                chunk.batch = piece;
            } else {
                chunk.appended.push(piece);
            }
            chunk.rows += n;
            if !chunk.deleted.is_empty() {
                chunk.deleted.resize(start + n, false);
            }
            if !chunk.positions.is_empty() {
                chunk.positions.extend(start as u32..(start + n) as u32);
            }
            chunk.touched = self.tick;
            if let Some(placed) = placed.as_deref_mut() {
                placed.extend((start..start + n).map(|row| Loc {
                    chunk: tail,
                    row: row as u32,
                }));
            }
            self.live += n;
            at += n;
        }
        Ok(())
    }

    fn new_chunk(&mut self) -> Result<u32> {
        let empty = Chunk {
            batch: RecordBatch::new_empty(Arc::clone(&self.schema)),
            appended: Vec::new(),
            rows: 0,
            positions: Vec::new(),
            deleted: Vec::new(),
            deleted_rows: 0,
            unfiltered: 0,
            file: None,
            touched: self.tick,
        };
        let id = match self.free.pop() {
            Some(id) => {
                self.chunks[id as usize] = empty;
                id
            }
            None => {
                let id = u32::try_from(self.chunks.len())
                    .map_err(|_| Error::internal("a table holds 4 G chunks"))?;
                self.chunks.push(empty);
                id
            }
        };
        self.tail = Some(id);
        Ok(id)
    }

    /// Deletes the row at `loc`; returns the chunk if it should now be compacted
    /// ([`Chunks::compact`]).
    pub fn delete(&mut self, loc: Loc) -> Result<Option<u32>> {
        let chunk = self
            .chunks
            .get_mut(loc.chunk as usize)
            .filter(|c| (loc.row as usize) < c.rows)
            .ok_or_else(|| Error::internal("a table's index points past its rows"))?;
        if chunk.deleted.is_empty() {
            chunk.deleted = vec![false; chunk.rows];
        }
        let flag = &mut chunk.deleted[loc.row as usize];
        if *flag {
            return Err(Error::internal("a table's index points at a deleted row"));
        }
        *flag = true;
        chunk.deleted_rows += 1;
        chunk.unfiltered += 1;
        chunk.touched = self.tick;
        self.live -= 1;
        let compact = chunk.live() == 0 || chunk.unfiltered * 2 > chunk.positions_held();
        Ok(compact.then_some(loc.chunk))
    }

    /// Drops chunk `id`'s deleted rows (reading it back if it is on disk); its rows keep their
    /// positions. A chunk with no rows left is freed.
    pub fn compact(&mut self, id: u32) -> Result<()> {
        if self.chunks[id as usize].unfiltered == 0 {
            return Ok(());
        }
        if self.chunks[id as usize].live() > 0 {
            self.load(id)?;
            let chunk = &mut self.chunks[id as usize];
            chunk.merge(&self.schema)?;
            return chunk.filter();
        }
        self.forget_file(id);
        let chunk = &mut self.chunks[id as usize];
        chunk.batch = RecordBatch::new_empty(Arc::clone(&self.schema));
        chunk.appended.clear();
        chunk.rows = 0;
        chunk.positions = Vec::new();
        chunk.deleted = Vec::new();
        chunk.deleted_rows = 0;
        chunk.unfiltered = 0;
        if self.tail != Some(id) {
            self.free.push(id);
        }
        Ok(())
    }

    /// The rows as batches, shared with the chunks in memory (whose deleted rows are dropped
    /// first); chunks on disk are read back for the scan (and stay on disk).
    pub fn scan(&mut self) -> Result<Vec<RecordBatch>> {
        let mut out = Vec::with_capacity(self.chunks.len());
        self.for_each_batch(|batch| {
            out.push(batch);
            Ok(())
        })?;
        Ok(out)
    }

    /// Hands `f` the rows a chunk at a time, as [`Chunks::scan`] returns them (chunks on disk
    /// read back one at a time).
    pub fn for_each_batch(&mut self, mut f: impl FnMut(RecordBatch) -> Result<()>) -> Result<()> {
        for chunk in self.chunks.iter_mut().filter(|c| c.live() > 0) {
            if let Some(file) = &chunk.file {
                f(chunk.without_deleted(&file.read(&self.schema)?)?)?;
                continue;
            }
            chunk.merge(&self.schema)?;
            chunk.filter()?;
            f(chunk.batch.clone())?;
        }
        Ok(())
    }

    /// The same rows under a schema that differs only in names or nullability.
    pub fn relabel(&mut self, schema: SchemaRef) -> Result<()> {
        // Chunks on disk are read under the schema of the time (files hold only columns).
        for chunk in self.chunks.iter_mut().filter(|c| c.file.is_none()) {
            chunk.merge(&self.schema)?;
            let relabel = |b: &RecordBatch| {
                RecordBatch::try_new_with_options(
                    Arc::clone(&schema),
                    b.columns().to_vec(),
                    &arrow::array::RecordBatchOptions::new().with_row_count(Some(b.num_rows())),
                )
                .map_err(|e| arrow_error("relabel rows", e))
            };
            chunk.batch = relabel(&chunk.batch)?;
        }
        self.schema = schema;
        Ok(())
    }
}
