//! A checkpoint's files: Arrow IPC, written as they are encoded with their size and CRC32
//! counted on the way, and read back as they decode.
//!
//! A view's lane writes its operators' state itself as it saves ([`Staging`], a sink of
//! [`eddy_dataflow::Dataflow::save`]), into a directory of its own under the checkpoints
//! directory, `<epoch>-v<view>`: a save of any size then holds one batch in memory. What the
//! save deferred (an arrangement's spilled rows, read from a snapshot of the spill store) the
//! writer thread writes, while the view goes on; then it syncs the files and names them in the
//! manifest.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use arrow::ipc::writer::FileWriter;
use eddy_common::{Error, ObjectId, Result};

use super::{corrupted, io};

/// A file of one part that a view's lane wrote for a checkpoint (not synced yet).
pub struct StagedFile {
    pub part: String,
    /// The directory under the checkpoints directory that holds it.
    pub dir: String,
    pub file: String,
    pub bytes: u64,
    pub crc32: u32,
    /// Its batches are an arrangement's changes since its last save
    /// ([`eddy_dataflow::checkpoint::is_changes`]).
    pub changes: bool,
    pub rows: usize,
}

/// Writes a view's operator state to files as its lane saves it: each run of batches of one
/// part (and one schema) to one file.
pub struct Staging {
    /// The checkpoints directory.
    root: PathBuf,
    epoch: u64,
    view: ObjectId,
    /// The directory, once the first batch came.
    dir: Option<String>,
    open: Option<Open>,
    files: Vec<StagedFile>,
    /// What the save left to do after it returned (spilled state, read from a snapshot).
    deferred: Vec<eddy_dataflow::checkpoint::Deferred>,
}

/// The file being written.
struct Open {
    part: String,
    schema: SchemaRef,
    file: String,
    out: FileOut,
    changes: bool,
    rows: usize,
}

impl Staging {
    pub(super) fn new(root: &Path, epoch: u64, view: ObjectId) -> Staging {
        Staging {
            root: root.to_path_buf(),
            epoch,
            view,
            dir: None,
            open: None,
            files: Vec::new(),
            deferred: Vec::new(),
        }
    }

    /// Does what the save deferred (the checkpoint writer calls this, while the view goes
    /// on), then closes the last file; the files written, in the order their batches came.
    pub fn finish(mut self) -> Result<Vec<StagedFile>> {
        for job in std::mem::take(&mut self.deferred) {
            job(&mut self)?;
        }
        self.close()?;
        Ok(self.files)
    }

    fn close(&mut self) -> Result<()> {
        if let (Some(open), Some(dir)) = (self.open.take(), &self.dir) {
            let (bytes, crc32) = open.out.finish()?;
            self.files.push(StagedFile {
                part: open.part,
                dir: dir.clone(),
                file: open.file,
                bytes,
                crc32,
                changes: open.changes,
                rows: open.rows,
            });
        }
        Ok(())
    }

    /// The directory, created on first use: `<epoch>-v<view>`, or with `.1`, `.2` after it
    /// when that exists (a committed checkpoint of the same epoch may name it).
    fn dir(&mut self) -> Result<String> {
        if let Some(dir) = &self.dir {
            return Ok(dir.clone());
        }
        let base = staging_name(self.epoch, self.view);
        let mut name = base.clone();
        let mut n = 0;
        while self.root.join(&name).exists() {
            n += 1;
            name = format!("{base}.{n}");
        }
        let path = self.root.join(&name);
        std::fs::create_dir_all(&path).map_err(|e| io("create", &path, e))?;
        self.dir = Some(name.clone());
        Ok(name)
    }
}

impl eddy_dataflow::checkpoint::Sink for Staging {
    fn put(&mut self, part: &str, batch: RecordBatch) -> Result<()> {
        let same = self
            .open
            .as_ref()
            .is_some_and(|o| o.part == part && o.schema == batch.schema());
        if !same {
            self.close()?;
            let dir = self.dir()?;
            let file = format!("{}.arrow", self.files.len());
            let path = self.root.join(&dir).join(&file);
            self.open = Some(Open {
                part: part.to_owned(),
                schema: batch.schema(),
                file,
                out: FileOut::create(&path, &batch.schema())?,
                changes: eddy_dataflow::checkpoint::is_changes(&batch),
                rows: 0,
            });
        }
        if let Some(open) = &mut self.open {
            open.rows += batch.num_rows();
            open.out.write(&batch)?;
        }
        Ok(())
    }

    fn defer(&mut self, job: eddy_dataflow::checkpoint::Deferred) -> Result<()> {
        self.deferred.push(job);
        Ok(())
    }
}

/// The name of the directory a view's lane writes its part of checkpoint `epoch` into.
fn staging_name(epoch: u64, view: ObjectId) -> String {
    format!("{epoch}-v{}", view.0)
}

/// The epoch of a directory [`Staging`] made (`None`: not one of those).
pub(super) fn staging_epoch(name: &str) -> Option<u64> {
    let (epoch, _) = name.split_once("-v")?;
    epoch.parse().ok()
}

/// An Arrow IPC file being written, counted and checksummed as it goes.
struct FileOut {
    path: PathBuf,
    schema: SchemaRef,
    writer: FileWriter<Crc32Writer<std::io::BufWriter<std::fs::File>>>,
}

impl FileOut {
    fn create(path: &Path, schema: &SchemaRef) -> Result<FileOut> {
        let file = std::fs::File::create(path).map_err(|e| io("create", path, e))?;
        let out = Crc32Writer {
            inner: std::io::BufWriter::with_capacity(1 << 20, file),
            crc: crc32fast::Hasher::new(),
            bytes: 0,
        };
        let writer = FileWriter::try_new(out, schema).map_err(|e| write_error(path, e))?;
        Ok(FileOut {
            path: path.to_path_buf(),
            schema: Arc::clone(schema),
            writer,
        })
    }

    fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        self.writer
            .write(batch)
            .map_err(|e| write_error(&self.path, e))
    }

    /// Ends the file (not synced); its size and CRC32.
    fn finish(mut self) -> Result<(u64, u32)> {
        self.writer
            .finish()
            .map_err(|e| write_error(&self.path, e))?;
        let out = self
            .writer
            .into_inner()
            .map_err(|e| write_error(&self.path, e))?;
        let Crc32Writer {
            mut inner,
            crc,
            bytes,
        } = out;
        inner.flush().map_err(|e| io("write", &self.path, e))?;
        Ok((bytes, crc.finalize()))
    }
}

fn write_error(path: &Path, e: arrow::error::ArrowError) -> Error {
    Error::internal(format!("writing checkpoint file {}: {e}", path.display()))
}

/// Writes a view's contents `rows` (of `schema`) as one Arrow IPC file at `path`, the rows on
/// disk read back one chunk at a time, and syncs it; returns its size and CRC32.
pub(super) fn write_rows(
    path: &Path,
    schema: &SchemaRef,
    rows: &crate::table_chunks::ViewRows,
) -> Result<(u64, u32)> {
    let mut out = FileOut::create(path, schema)?;
    rows.for_each(|batch| out.write(&batch))?;
    let written = out.finish()?;
    sync(path)?;
    Ok(written)
}

/// Writes a view's contents' changes since a save to a file at `path` and syncs it: the rows
/// `inserted` first (as inserts, read and written one chunk at a time), then `changes` (a
/// batch of [`eddy_dataflow::checkpoint::saved_changes`]); its size and CRC32, or `None` (no
/// file) without rows.
pub(super) fn write_changes(
    path: &Path,
    inserted: Option<&crate::table_chunks::ViewRows>,
    changes: &RecordBatch,
) -> Result<Option<(u64, u32)>> {
    let mut out: Option<FileOut> = None;
    let mut put = |batch: RecordBatch| -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        match &mut out {
            Some(file) => {
                // Under the file's column names (the dataflow's output may name them apart).
                let options =
                    arrow::array::RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
                let batch = RecordBatch::try_new_with_options(
                    Arc::clone(&file.schema),
                    batch.columns().to_vec(),
                    &options,
                )
                .map_err(|e| write_error(path, e))?;
                file.write(&batch)
            }
            None => out
                .insert(FileOut::create(path, &batch.schema())?)
                .write(&batch),
        }
    };
    if let Some(rows) = inserted {
        rows.for_each(|batch| {
            let schema = batch.schema();
            let inserts = [eddy_common::ChangeBatch::inserts(batch)];
            put(eddy_dataflow::checkpoint::saved_changes(&schema, &inserts)?)
        })?;
    }
    put(changes.clone())?;
    let Some(out) = out else {
        return Ok(None);
    };
    let written = out.finish()?;
    sync(path)?;
    Ok(Some(written))
}

/// Syncs the file or directory at `path` to disk.
pub(super) fn sync(path: &Path) -> Result<()> {
    std::fs::File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(|e| io("sync", path, e))
}

/// The size and CRC32 of the file at `path`, read in pieces.
pub(super) fn checksum(path: &Path) -> Result<(u64, u32)> {
    let mut file = std::fs::File::open(path).map_err(|e| io("open", path, e))?;
    let mut out = Crc32Writer {
        inner: std::io::sink(),
        crc: crc32fast::Hasher::new(),
        bytes: 0,
    };
    std::io::copy(&mut file, &mut out).map_err(|e| io("read", path, e))?;
    Ok((out.bytes, out.crc.finalize()))
}

/// The batches of checkpoint files, read as they decode, each with its part's name.
pub struct PartReader {
    files: std::vec::IntoIter<(String, PathBuf)>,
    current: Option<(String, PathBuf, BatchFile)>,
}

type BatchFile = arrow::ipc::reader::FileReader<std::io::BufReader<std::fs::File>>;

impl PartReader {
    pub(super) fn new(files: Vec<(String, PathBuf)>) -> PartReader {
        PartReader {
            files: files.into_iter(),
            current: None,
        }
    }
}

/// Opens the checkpoint file at `path` to read its batches.
pub(super) fn open(path: &Path) -> Result<BatchFile> {
    let opened = std::fs::File::open(path).map_err(|e| io("open", path, e))?;
    BatchFile::try_new(std::io::BufReader::with_capacity(1 << 20, opened), None)
        .map_err(|e| corrupted(format!("checkpoint file {}: {e}", path.display())))
}

impl Iterator for PartReader {
    type Item = Result<(String, RecordBatch)>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some((part, path, reader)) = &mut self.current {
                match reader.next() {
                    Some(Ok(batch)) => return Some(Ok((part.clone(), batch))),
                    Some(Err(e)) => {
                        let e = corrupted(format!("checkpoint file {}: {e}", path.display()));
                        self.current = None;
                        return Some(Err(e));
                    }
                    None => self.current = None,
                }
            }
            let (part, path) = self.files.next()?;
            match open(&path) {
                Ok(reader) => self.current = Some((part, path, reader)),
                Err(e) => return Some(Err(e)),
            }
        }
    }
}

/// A writer that counts and checksums what passes through it.
struct Crc32Writer<W> {
    inner: W,
    crc: crc32fast::Hasher,
    bytes: u64,
}

impl<W: Write> Write for Crc32Writer<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.crc.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}
