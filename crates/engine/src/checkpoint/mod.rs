//! Checkpoints: the views' state at the end of one epoch, written to disk, and read back on
//! start-up (ADR 0007).
//!
//! At the end of an epoch each view's lane writes its operators' state as Arrow IPC files into
//! a directory of its own (`<data-dir>/checkpoints/<epoch>-v<view>/`, [`files::Staging`]) as
//! it saves it, so a save holds one batch in memory however large the state. The view runtime
//! then hands a [`Checkpoint`] (those files, each view's contents, the log offsets and source
//! positions each view has committed, the streams' watermarks) to the [`Checkpointer`] thread
//! and goes on with the next epoch. The thread writes the contents under
//! `<data-dir>/checkpoints/<epoch>/`, fsyncs every file and directory, and then commits the
//! manifest (JSON, with each file's CRC32) in the metadata store; only then is the checkpoint
//! complete. On start-up [`load_latest`] reads the newest manifest, checks every file's CRC,
//! and deletes directories that no manifest names (a checkpoint cut off half-way); a view's
//! operator state is read from its files as it loads ([`files::PartReader`]).
//!
//! Checkpoints are incremental (ADR 0012): a view whose last save is in the committed
//! checkpoint saves, for each arrangement, only the keys changed since
//! ([`eddy_dataflow::checkpoint::is_changes`]). Its part then names the files of that part in
//! the committed manifest, which may live in older checkpoints' directories, followed by the
//! new file; loading reads a part's files in order. A part saved whole starts its list anew.
//! After a commit, the files and directories the new manifest does not name are deleted.

mod files;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arrow::array::RecordBatch;
use eddy_common::{Error, ObjectId, Result, SqlState};
use eddy_storage::meta::MetaStore;
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

/// The manifest format this build writes (it reads this one and the ones before: format 1
/// had no lists of files across checkpoints).
const FORMAT: u32 = 2;

pub use files::{PartReader, Staging};

use crate::table_chunks::ViewRows;

/// One view's state at a checkpoint.
pub struct ViewState {
    pub id: ObjectId,
    /// The committed checkpoint whose parts this view's parts of changes are applied onto
    /// ([`eddy_dataflow::checkpoint::is_changes`]; `None`: every part is whole).
    pub base: Option<u64>,
    /// Every operator's state, in the files its lane wrote (and the writer finishes: what the
    /// save deferred), named by the operators' places in the dataflow.
    pub parts: Box<Staging>,
    /// The view's contents.
    pub contents: SavedContents,
    /// Per (table or source, partition): log records (or source offset) the view has committed.
    pub committed: Vec<(ObjectId, u32, u64)>,
    /// The watermark of each stream the view reads, as the view has seen it.
    pub watermarks: Vec<(ObjectId, i64)>,
}

/// A view's contents in a checkpoint.
pub enum SavedContents {
    /// All of them, as published at the checkpoint's epoch: the writer reads the rows on disk
    /// back one chunk at a time as it writes them.
    Whole {
        schema: arrow::datatypes::SchemaRef,
        rows: Arc<ViewRows>,
    },
    /// The view's output since its last save: first the rows it inserted while its contents
    /// only ever got inserts (some maybe on disk, read back by the writer one chunk at a
    /// time), then the rest as one batch of changes
    /// ([`eddy_dataflow::checkpoint::saved_changes`]).
    Changes {
        inserted: Option<Arc<ViewRows>>,
        batch: RecordBatch,
    },
}

/// A stream's watermark as tracked by the runtime (per partition).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClockState {
    pub object: ObjectId,
    /// The view reading a source at its own pace (`None`: a table, shared by every view).
    pub reader: Option<ObjectId>,
    pub partitions: Vec<Option<i64>>,
    pub watermark: Option<i64>,
}

/// What the runtime hands over at the end of an epoch.
pub struct Checkpoint {
    pub epoch: u64,
    pub started_at_micros: i64,
    /// The longest a view stopped to copy its state (the pause the checkpoint caused; views
    /// copy theirs at once, each in its lane).
    pub pause: Duration,
    pub started: Instant,
    /// Shards per sharded operator: state is restored into as many.
    pub workers: usize,
    pub views: Vec<ViewState>,
    pub clocks: Vec<ClockState>,
    /// Answered once the checkpoint is committed (`CHECKPOINT;`).
    pub reply: Option<oneshot::Sender<Result<u64>>>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct FileEntry {
    /// The part's name (`contents` for the view's contents).
    part: String,
    /// The checkpoint directory that holds the file (`None`: the manifest's own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    dir: Option<String>,
    file: String,
    bytes: u64,
    crc32: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct ViewEntry {
    id: ObjectId,
    files: Vec<FileEntry>,
    committed: Vec<(ObjectId, u32, u64)>,
    watermarks: Vec<(ObjectId, i64)>,
}

/// What the metadata store holds per checkpoint.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Manifest {
    format: u32,
    epoch: u64,
    /// The directory of the files written for this checkpoint (`None`: the epoch's number).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    dir: Option<String>,
    started_at_micros: i64,
    duration_micros: u64,
    pause_micros: u64,
    /// Bytes written for this checkpoint (files of earlier ones it names not counted).
    bytes: u64,
    workers: usize,
    /// The routing hash sharded state was split by (`eddy_dataflow::route`); 0 in checkpoints
    /// from before it was recorded (DataFusion's hash).
    #[serde(default)]
    route_hash: u32,
    views: Vec<ViewEntry>,
    clocks: Vec<ClockState>,
}

/// A row of `eddy_checkpoints`.
#[derive(Debug, Clone)]
pub struct CheckpointInfo {
    pub epoch: u64,
    pub started_at_micros: i64,
    pub duration: Duration,
    pub pause: Duration,
    pub bytes: u64,
}

impl From<&Manifest> for CheckpointInfo {
    fn from(m: &Manifest) -> Self {
        CheckpointInfo {
            epoch: m.epoch,
            started_at_micros: m.started_at_micros,
            duration: Duration::from_micros(m.duration_micros),
            pause: Duration::from_micros(m.pause_micros),
            bytes: m.bytes,
        }
    }
}

/// A checkpoint read back: per view its state, the streams' clocks, the epoch to resume at.
pub struct Restored {
    pub epoch: u64,
    pub workers: usize,
    pub route_hash: u32,
    pub views: HashMap<ObjectId, RestoredView>,
    pub clocks: Vec<ClockState>,
}

/// One view's state in a checkpoint read back.
pub struct RestoredView {
    /// The checkpoint it was read from.
    pub base: u64,
    /// Each operator part's files (checked against their CRCs), in the order they load.
    files: Vec<(String, PathBuf)>,
    /// The contents' files (checked), in the order they apply.
    contents: Vec<(String, PathBuf)>,
    pub committed: Vec<(ObjectId, u32, u64)>,
    pub watermarks: Vec<(ObjectId, i64)>,
}

impl RestoredView {
    /// The operators' state, read from its files as it is taken (one batch at a time).
    pub fn parts(&mut self) -> PartReader {
        PartReader::new(std::mem::take(&mut self.files))
    }

    /// The contents (the last whole save, then the changes since), read from their files as
    /// they are taken.
    pub fn contents(&mut self) -> PartReader {
        PartReader::new(std::mem::take(&mut self.contents))
    }
}

fn io(context: &str, path: &Path, e: std::io::Error) -> Error {
    Error::io(&format!("{context} {}", path.display()), e)
}

fn checkpoints_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("checkpoints")
}

/// Writes checkpoints on its own thread, so that the runtime goes on meanwhile.
pub struct Checkpointer {
    /// The checkpoints directory.
    dir: PathBuf,
    queue: Mutex<Option<std::sync::mpsc::SyncSender<Checkpoint>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// The epoch of the newest committed checkpoint.
    committed: Arc<Mutex<Option<u64>>>,
    /// Checkpoints handed over and not yet written (or failed).
    in_flight: Arc<AtomicUsize>,
}

impl Checkpointer {
    pub fn start(data_dir: &Path, meta: Arc<MetaStore>) -> Result<Checkpointer> {
        let dir = checkpoints_dir(data_dir);
        std::fs::create_dir_all(&dir).map_err(|e| io("create", &dir, e))?;
        let root = dir.clone();
        let committed = Arc::new(Mutex::new(meta.checkpoints()?.last().map(|(e, _)| *e)));
        let newest = Arc::clone(&committed);
        let in_flight = Arc::new(AtomicUsize::new(0));
        let written = Arc::clone(&in_flight);
        // One checkpoint in flight at a time: the runtime skips one while the last is written.
        let (tx, rx) = std::sync::mpsc::sync_channel::<Checkpoint>(1);
        let thread = std::thread::Builder::new()
            .name("eddy-checkpoints".into())
            .spawn(move || {
                for checkpoint in rx {
                    let epoch = checkpoint.epoch;
                    let (reply, result) = write(&dir, &meta, checkpoint);
                    if result.is_ok() {
                        *newest.lock().unwrap_or_else(|p| p.into_inner()) = Some(epoch);
                    }
                    written.fetch_sub(1, Ordering::AcqRel);
                    match &result {
                        Ok(info) => tracing::info!(
                            epoch,
                            bytes = info.bytes,
                            duration_ms = info.duration.as_millis() as u64,
                            pause_ms = info.pause.as_millis() as u64,
                            "checkpoint committed"
                        ),
                        Err(e) => tracing::error!(epoch, error = %e, "writing a checkpoint failed"),
                    }
                    if let Some(reply) = reply {
                        let _ = reply.send(result.map(|i| i.epoch));
                    }
                }
            })
            .map_err(|e| Error::internal(format!("starting the checkpoint writer: {e}")))?;
        Ok(Checkpointer {
            dir: root,
            queue: Mutex::new(Some(tx)),
            thread: Mutex::new(Some(thread)),
            committed,
            in_flight,
        })
    }

    /// Where view `view`'s lane writes its operators' state for checkpoint `epoch`.
    pub fn staging(&self, epoch: u64, view: ObjectId) -> Staging {
        Staging::new(&self.dir, epoch, view)
    }

    /// Whether a checkpoint handed over is still being written (a periodic one waits).
    pub fn busy(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) > 0
    }

    /// The epoch of the newest committed checkpoint: a view whose last save went into it may
    /// save only its changes since.
    pub fn committed(&self) -> Option<u64> {
        *self.committed.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Hands a checkpoint to the writer. Unless `wait`, gives it back when one is still
    /// being written; also when the writer stopped.
    pub fn submit(
        &self,
        checkpoint: Checkpoint,
        wait: bool,
    ) -> std::result::Result<(), Checkpoint> {
        let queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        let sent = match queue.as_ref() {
            Some(tx) if wait => tx.send(checkpoint).map_err(|e| e.0),
            Some(tx) => tx.try_send(checkpoint).map_err(|e| match e {
                std::sync::mpsc::TrySendError::Full(c)
                | std::sync::mpsc::TrySendError::Disconnected(c) => c,
            }),
            None => Err(checkpoint),
        };
        if sent.is_err() {
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
        }
        sent
    }

    /// Finishes the checkpoint being written, then stops.
    pub fn shutdown(&self) {
        self.queue.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(thread) = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = thread.join();
        }
    }
}

/// Writes one checkpoint; returns the reply to send and the outcome.
fn write(
    dir: &Path,
    meta: &MetaStore,
    checkpoint: Checkpoint,
) -> (Option<oneshot::Sender<Result<u64>>>, Result<CheckpointInfo>) {
    let reply = checkpoint.reply;
    let checkpoint = Checkpoint {
        reply: None,
        ..checkpoint
    };
    (reply, write_files(dir, meta, checkpoint))
}

fn write_files(dir: &Path, meta: &MetaStore, checkpoint: Checkpoint) -> Result<CheckpointInfo> {
    let Checkpoint {
        epoch,
        started_at_micros,
        pause,
        started,
        workers,
        views,
        clocks,
        reply: _,
    } = checkpoint;
    let previous = match meta.checkpoints()?.pop() {
        Some((e, bytes)) => Some(decode(e, &bytes)?),
        None => None,
    };
    let own = fresh_dir(dir, previous.as_ref(), epoch)?;
    let target = dir.join(&own);
    std::fs::create_dir_all(&target).map_err(|e| io("create", &target, e))?;
    let mut entries = Vec::with_capacity(views.len());
    let mut total = 0u64;
    let mut staged_dirs = HashSet::new();
    for view in views {
        let prior = prior_files(previous.as_ref(), &view)?;
        let mut files: Vec<FileEntry> = Vec::new();
        let parts = view.parts;
        let staged =
            eddy_common::panic::catch_panic("writing a view's spilled state", || parts.finish())?;
        for staged in staged {
            if staged.changes {
                // Changes since the base: after the part's files there, unless none.
                if !files.iter().any(|f| f.part == staged.part) {
                    files.extend(prior.iter().filter(|f| f.part == staged.part).cloned());
                }
                if staged.rows == 0 {
                    continue;
                }
            }
            let path = dir.join(&staged.dir).join(&staged.file);
            files::sync(&path)?;
            staged_dirs.insert(staged.dir.clone());
            total += staged.bytes;
            files.push(FileEntry {
                part: staged.part,
                dir: Some(staged.dir),
                file: staged.file,
                bytes: staged.bytes,
                crc32: staged.crc32,
            });
        }
        // The contents: whole (a file of their own, read as they are written), or the changes
        // since the base (after the contents' files there, unless none).
        let file = format!("v{}-0.arrow", view.id.0);
        let written = match view.contents {
            SavedContents::Whole { schema, rows } => {
                Some(files::write_rows(&target.join(&file), &schema, &rows)?)
            }
            SavedContents::Changes { inserted, batch } => {
                files.extend(prior.iter().filter(|f| f.part == CONTENTS).cloned());
                files::write_changes(&target.join(&file), inserted.as_deref(), &batch)?
            }
        };
        if let Some((bytes, crc32)) = written {
            total += bytes;
            files.push(FileEntry {
                part: CONTENTS.to_owned(),
                dir: None,
                file,
                bytes,
                crc32,
            });
        }
        entries.push(ViewEntry {
            id: view.id,
            files,
            committed: view.committed,
            watermarks: view.watermarks,
        });
    }
    for staged in staged_dirs {
        files::sync(&dir.join(staged))?;
    }
    files::sync(&target)?;
    let manifest = Manifest {
        format: FORMAT,
        epoch,
        dir: (own != epoch.to_string()).then_some(own),
        started_at_micros,
        duration_micros: started.elapsed().as_micros() as u64,
        pause_micros: pause.as_micros() as u64,
        bytes: total,
        workers,
        route_hash: eddy_dataflow::route::ROUTE_HASH_VERSION,
        views: entries,
        clocks,
    };
    let encoded = serde_json::to_vec(&manifest)
        .map_err(|e| Error::internal(format!("encoding a checkpoint manifest: {e}")))?;
    crate::failpoints::failpoint("checkpoint_commit", "writer")?;
    // The commit point: one write of the metadata store, which also drops older manifests.
    let older: Vec<u64> = meta
        .checkpoints()?
        .into_iter()
        .map(|(e, _)| e)
        .filter(|e| *e != epoch)
        .collect();
    meta.commit_checkpoint(epoch, &encoded, &older)?;
    crate::failpoints::failpoint("checkpoint_cleanup", "writer")?;
    delete_unnamed(dir, &manifest);
    Ok(CheckpointInfo::from(&manifest))
}

/// A directory for checkpoint `epoch`'s files that the committed checkpoint does not use (the
/// epoch's number, unless that one holds files of the committed checkpoint of the same epoch).
fn fresh_dir(dir: &Path, previous: Option<&Manifest>, epoch: u64) -> Result<String> {
    let used: HashSet<String> = previous.map(Manifest::dirs).unwrap_or_default();
    let own = (0..)
        .map(|n| match n {
            0 => epoch.to_string(),
            n => format!("{epoch}.{n}"),
        })
        .find(|d| !used.contains(d))
        .unwrap_or_else(|| epoch.to_string());
    let target = dir.join(&own);
    if target.exists() {
        std::fs::remove_dir_all(&target).map_err(|e| io("remove", &target, e))?;
    }
    Ok(own)
}

/// The files of `view`'s parts in the committed checkpoint that its parts of changes build on,
/// each with its directory.
fn prior_files(previous: Option<&Manifest>, view: &ViewState) -> Result<Vec<FileEntry>> {
    let Some(base) = view.base else {
        return Ok(Vec::new());
    };
    let entry = previous
        .filter(|m| m.epoch == base)
        .and_then(|m| Some((m, m.views.iter().find(|v| v.id == view.id)?)));
    let Some((manifest, entry)) = entry else {
        return Err(Error::internal(format!(
            "the changes of view {} build on checkpoint {base}, which is not the committed one",
            view.id.0
        )));
    };
    Ok(entry
        .files
        .iter()
        .map(|f| FileEntry {
            dir: Some(manifest.file_dir(f)),
            ..f.clone()
        })
        .collect())
}

impl Manifest {
    fn own_dir(&self) -> String {
        self.dir.clone().unwrap_or_else(|| self.epoch.to_string())
    }

    fn file_dir(&self, file: &FileEntry) -> String {
        file.dir.clone().unwrap_or_else(|| self.own_dir())
    }

    /// Every directory whose files this manifest names (and its own).
    fn dirs(&self) -> HashSet<String> {
        let mut dirs: HashSet<String> = self
            .views
            .iter()
            .flat_map(|v| &v.files)
            .filter_map(|f| f.dir.clone())
            .collect();
        dirs.insert(self.own_dir());
        dirs
    }

    /// The path of `file` under the checkpoints directory `dir`.
    fn path(&self, dir: &Path, file: &FileEntry) -> PathBuf {
        dir.join(self.file_dir(file)).join(&file.file)
    }
}

/// Deletes what `manifest` (just committed) does not name under the checkpoints directory
/// `dir`: other directories, and files of earlier checkpoints it does not name.
fn delete_unnamed(dir: &Path, manifest: &Manifest) {
    let named: HashSet<PathBuf> = manifest
        .views
        .iter()
        .flat_map(|v| &v.files)
        .map(|f| manifest.path(dir, f))
        .collect();
    let dirs = manifest.dirs();
    let own = manifest.own_dir();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        // A lane may be writing its part of a later checkpoint.
        let later = files::staging_epoch(&name).is_some_and(|e| e > manifest.epoch);
        let result = if name == own || later {
            Ok(())
        } else if !dirs.contains(&name) {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::read_dir(&path).and_then(|files| {
                for file in files.flatten() {
                    if !named.contains(&file.path()) {
                        std::fs::remove_file(file.path())?;
                    }
                }
                Ok(())
            })
        };
        if let Err(err) = result
            && err.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(path = %path.display(), error = %err, "deleting an old checkpoint failed");
        }
    }
}

/// The part name of a view's contents in a manifest.
const CONTENTS: &str = "contents";

fn corrupted(message: String) -> Error {
    Error::new(SqlState::DATA_CORRUPTED, message)
}

/// The checkpoints committed in `meta` (normally one), oldest first, for `eddy_checkpoints`.
pub fn list(meta: &MetaStore) -> Result<Vec<CheckpointInfo>> {
    let mut out = Vec::new();
    for (_, bytes) in meta.checkpoints()? {
        let manifest: Manifest = serde_json::from_slice(&bytes)
            .map_err(|e| corrupted(format!("a checkpoint manifest does not decode: {e}")))?;
        out.push(CheckpointInfo::from(&manifest));
    }
    Ok(out)
}

/// (table or source, partition, offset) a view had read to.
pub type Reads = Vec<(ObjectId, u32, u64)>;

/// What each view in the newest checkpoint had read: view -> (table or source, partition,
/// offset). Empty when there is no checkpoint.
pub fn latest_reads(meta: &MetaStore) -> Result<HashMap<ObjectId, Reads>> {
    let Some((epoch, bytes)) = meta.checkpoints()?.pop() else {
        return Ok(HashMap::new());
    };
    Ok(decode(epoch, &bytes)?
        .views
        .into_iter()
        .map(|v| (v.id, v.committed))
        .collect())
}

/// A committed manifest, of this build's format or an earlier one.
fn decode(epoch: u64, bytes: &[u8]) -> Result<Manifest> {
    let manifest: Manifest = serde_json::from_slice(bytes).map_err(|e| {
        corrupted(format!(
            "checkpoint {epoch}: the manifest does not decode: {e}"
        ))
    })?;
    if manifest.format == 0 || manifest.format > FORMAT {
        return Err(corrupted(format!(
            "checkpoint {epoch} has format {}, this build reads 1 to {FORMAT}",
            manifest.format
        )));
    }
    Ok(manifest)
}

/// Reads the newest complete checkpoint (`None` when there is none) and deletes checkpoint
/// directories no manifest names.
pub fn load_latest(data_dir: &Path, meta: &MetaStore) -> Result<Option<Restored>> {
    let dir = checkpoints_dir(data_dir);
    let manifests = meta
        .checkpoints()?
        .into_iter()
        .map(|(epoch, bytes)| decode(epoch, &bytes))
        .collect::<Result<Vec<Manifest>>>()?;
    let named: HashSet<String> = manifests.iter().flat_map(Manifest::dirs).collect();
    if let Ok(entries) = std::fs::read_dir(&dir) {
        for entry in entries.flatten() {
            if !named.contains(entry.file_name().to_string_lossy().as_ref()) {
                tracing::info!(path = %entry.path().display(), "deleting an incomplete checkpoint");
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
    let Some(manifest) = manifests.into_iter().last() else {
        return Ok(None);
    };
    let mut views = HashMap::new();
    for view in &manifest.views {
        let mut parts = Vec::new();
        let mut contents = Vec::new();
        for file in &view.files {
            let path = manifest.path(&dir, file);
            if files::checksum(&path)? != (file.bytes, file.crc32) {
                return Err(corrupted(format!(
                    "checkpoint file {} does not match its checksum",
                    path.display()
                )));
            }
            if file.part == CONTENTS {
                contents.push((file.part.clone(), path));
            } else {
                parts.push((file.part.clone(), path));
            }
        }
        views.insert(
            view.id,
            RestoredView {
                base: manifest.epoch,
                files: parts,
                contents,
                committed: view.committed.clone(),
                watermarks: view.watermarks.clone(),
            },
        );
    }
    Ok(Some(Restored {
        epoch: manifest.epoch,
        workers: manifest.workers,
        route_hash: manifest.route_hash,
        views,
        clocks: manifest.clocks,
    }))
}
