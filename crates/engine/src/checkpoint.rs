//! Checkpoints: the views' state at the end of one epoch, written to disk, and read back on
//! start-up (ADR 0007).
//!
//! The view runtime hands a [`Checkpoint`] (every operator's state as Arrow batches, each
//! view's contents, the log offsets and source positions each view has committed, the streams'
//! watermarks) to the [`Checkpointer`] thread and goes on with the next epoch. The thread
//! writes one Arrow IPC file per part under `<data-dir>/checkpoints/<epoch>/`, fsyncs them and
//! the directory, and then commits the manifest (JSON, with each file's CRC32) in the metadata
//! store; only then is the checkpoint complete. Older checkpoints are deleted after that.
//! On start-up [`load_latest`] reads the newest manifest, checks every file's CRC, and deletes
//! directories that no manifest names (a checkpoint cut off half-way).

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arrow::array::RecordBatch;
use eddy_common::{Error, ObjectId, Result, SqlState};
use eddy_storage::meta::MetaStore;
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

/// The manifest format this build writes and reads.
const FORMAT: u32 = 1;

/// One view's state at a checkpoint.
pub struct ViewState {
    pub id: ObjectId,
    /// Every operator's state, named by its place in the dataflow.
    pub parts: Vec<(String, RecordBatch)>,
    /// The view's contents.
    pub contents: Vec<RecordBatch>,
    /// Per (table or source, partition): log records (or source offset) the view has committed.
    pub committed: Vec<(ObjectId, u32, u64)>,
    /// The watermark of each stream the view reads, as the view has seen it.
    pub watermarks: Vec<(ObjectId, i64)>,
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
    started_at_micros: i64,
    duration_micros: u64,
    pause_micros: u64,
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
    pub views: HashMap<ObjectId, ViewState>,
    pub clocks: Vec<ClockState>,
}

fn io(context: &str, path: &Path, e: std::io::Error) -> Error {
    Error::io(&format!("{context} {}", path.display()), e)
}

fn checkpoints_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("checkpoints")
}

/// Writes checkpoints on its own thread, so that the runtime goes on meanwhile.
pub struct Checkpointer {
    queue: Mutex<Option<std::sync::mpsc::SyncSender<Checkpoint>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Checkpointer {
    pub fn start(data_dir: &Path, meta: Arc<MetaStore>) -> Result<Checkpointer> {
        let dir = checkpoints_dir(data_dir);
        std::fs::create_dir_all(&dir).map_err(|e| io("create", &dir, e))?;
        // One checkpoint in flight at a time: the runtime skips one while the last is written.
        let (tx, rx) = std::sync::mpsc::sync_channel::<Checkpoint>(1);
        let thread = std::thread::Builder::new()
            .name("eddy-checkpoints".into())
            .spawn(move || {
                for checkpoint in rx {
                    let epoch = checkpoint.epoch;
                    let (reply, result) = write(&dir, &meta, checkpoint);
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
            queue: Mutex::new(Some(tx)),
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Hands a checkpoint to the writer. Unless `wait`, gives it back when one is still
    /// being written; also when the writer stopped.
    pub fn submit(
        &self,
        checkpoint: Checkpoint,
        wait: bool,
    ) -> std::result::Result<(), Checkpoint> {
        let queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        match queue.as_ref() {
            Some(tx) if wait => tx.send(checkpoint).map_err(|e| e.0),
            Some(tx) => tx.try_send(checkpoint).map_err(|e| match e {
                std::sync::mpsc::TrySendError::Full(c)
                | std::sync::mpsc::TrySendError::Disconnected(c) => c,
            }),
            None => Err(checkpoint),
        }
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
    let Checkpoint {
        epoch,
        started_at_micros,
        pause,
        started,
        workers,
        views,
        clocks,
        reply,
    } = checkpoint;
    let result = (|| -> Result<CheckpointInfo> {
        let target = dir.join(epoch.to_string());
        if target.exists() {
            std::fs::remove_dir_all(&target).map_err(|e| io("remove", &target, e))?;
        }
        std::fs::create_dir_all(&target).map_err(|e| io("create", &target, e))?;
        let mut entries = Vec::with_capacity(views.len());
        let mut total = 0u64;
        for view in views {
            let mut files = Vec::new();
            let contents = view
                .contents
                .into_iter()
                .map(|b| ("contents".to_owned(), b));
            // Parts of one name (view contents in several batches) go to one file.
            let mut named: Vec<(String, Vec<RecordBatch>)> = Vec::new();
            for (part, batch) in view.parts.into_iter().chain(contents) {
                match named
                    .iter_mut()
                    .find(|(p, b)| *p == part && b[0].schema() == batch.schema())
                {
                    Some((_, batches)) => batches.push(batch),
                    None => named.push((part, vec![batch])),
                }
            }
            for (n, (part, batches)) in named.into_iter().enumerate() {
                let file = format!("v{}-{n}.arrow", view.id.0);
                let bytes = encode(&batches)?;
                let path = target.join(&file);
                let mut f = std::fs::File::create(&path).map_err(|e| io("create", &path, e))?;
                f.write_all(&bytes).map_err(|e| io("write", &path, e))?;
                f.sync_all().map_err(|e| io("sync", &path, e))?;
                total += bytes.len() as u64;
                files.push(FileEntry {
                    part,
                    file,
                    bytes: bytes.len() as u64,
                    crc32: crc32fast::hash(&bytes),
                });
            }
            entries.push(ViewEntry {
                id: view.id,
                files,
                committed: view.committed,
                watermarks: view.watermarks,
            });
        }
        std::fs::File::open(&target)
            .and_then(|d| d.sync_all())
            .map_err(|e| io("sync", &target, e))?;
        let manifest = Manifest {
            format: FORMAT,
            epoch,
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
        // The commit point: one write of the metadata store, which also drops older manifests.
        let older: Vec<u64> = meta
            .checkpoints()?
            .into_iter()
            .map(|(e, _)| e)
            .filter(|e| *e != epoch)
            .collect();
        meta.commit_checkpoint(epoch, &encoded, &older)?;
        for e in older {
            let old = dir.join(e.to_string());
            if let Err(err) = std::fs::remove_dir_all(&old)
                && err.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!(path = %old.display(), error = %err, "deleting an old checkpoint failed");
            }
        }
        Ok(CheckpointInfo::from(&manifest))
    })();
    (reply, result)
}

fn encode(batches: &[RecordBatch]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    let schema = batches
        .first()
        .map(|b| b.schema())
        .ok_or_else(|| Error::internal("an empty checkpoint part"))?;
    let mut writer = arrow::ipc::writer::FileWriter::try_new(&mut out, &schema)
        .map_err(|e| Error::internal(format!("writing a checkpoint file: {e}")))?;
    for batch in batches {
        writer
            .write(batch)
            .map_err(|e| Error::internal(format!("writing a checkpoint file: {e}")))?;
    }
    writer
        .finish()
        .map_err(|e| Error::internal(format!("writing a checkpoint file: {e}")))?;
    drop(writer);
    Ok(out)
}

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
    let manifest: Manifest = serde_json::from_slice(&bytes).map_err(|e| {
        corrupted(format!(
            "checkpoint {epoch}: the manifest does not decode: {e}"
        ))
    })?;
    Ok(manifest
        .views
        .into_iter()
        .map(|v| (v.id, v.committed))
        .collect())
}

/// Reads the newest complete checkpoint (`None` when there is none) and deletes checkpoint
/// directories no manifest names.
pub fn load_latest(data_dir: &Path, meta: &MetaStore) -> Result<Option<Restored>> {
    let dir = checkpoints_dir(data_dir);
    let manifests = meta.checkpoints()?;
    if let Ok(entries) = std::fs::read_dir(&dir) {
        for entry in entries.flatten() {
            let named = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u64>().ok())
                .is_some_and(|e| manifests.iter().any(|(m, _)| *m == e));
            if !named {
                tracing::info!(path = %entry.path().display(), "deleting an incomplete checkpoint");
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
    let Some((epoch, bytes)) = manifests.last() else {
        return Ok(None);
    };
    let manifest: Manifest = serde_json::from_slice(bytes).map_err(|e| {
        corrupted(format!(
            "checkpoint {epoch}: the manifest does not decode: {e}"
        ))
    })?;
    if manifest.format != FORMAT {
        return Err(corrupted(format!(
            "checkpoint {epoch} has format {}, this build reads {FORMAT}",
            manifest.format
        )));
    }
    let target = dir.join(epoch.to_string());
    let mut views = HashMap::new();
    for view in manifest.views {
        let mut parts = Vec::new();
        let mut contents = Vec::new();
        for file in &view.files {
            let path = target.join(&file.file);
            let bytes = std::fs::read(&path).map_err(|e| io("read", &path, e))?;
            if bytes.len() as u64 != file.bytes || crc32fast::hash(&bytes) != file.crc32 {
                return Err(corrupted(format!(
                    "checkpoint file {} does not match its checksum",
                    path.display()
                )));
            }
            let reader = arrow::ipc::reader::FileReader::try_new(std::io::Cursor::new(bytes), None)
                .map_err(|e| corrupted(format!("checkpoint file {}: {e}", path.display())))?;
            for batch in reader {
                let batch = batch
                    .map_err(|e| corrupted(format!("checkpoint file {}: {e}", path.display())))?;
                if file.part == "contents" {
                    contents.push(batch);
                } else {
                    parts.push((file.part.clone(), batch));
                }
            }
        }
        views.insert(
            view.id,
            ViewState {
                id: view.id,
                parts,
                contents,
                committed: view.committed,
                watermarks: view.watermarks,
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
