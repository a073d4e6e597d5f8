//! Sinks: `CREATE SINK s FROM mv WITH (connector = 'postgres' | 'kafka' | 'file', ...)` keeps
//! a PostgreSQL table, a Kafka topic or a directory of JSON-lines files equal to a materialized
//! view (ADR 0008). The connectors write (`eddy_connectors::sink`); this module decides what.
//!
//! The view runtime hands every epoch's changes of the view to the sink's task ([`SinkEpoch`])
//! together with the view's read offsets; the task consolidates them, off the view thread. Each
//! sink records how far it has written (S, as offsets): the PostgreSQL sink in the same
//! transaction as the epoch (`eddy_sink_progress`), the Kafka and file sinks in Eddy's metadata
//! store around the write (marked in flight before, done after). After a restart the runtime
//! compares S with the offsets the restored view has read (C): equal and not in flight, the
//! sink goes on; C behind S (the view replays what the sink already has), the sink waits until
//! the view has read at least S and is then handed the view's whole contents; C ahead of S, or
//! a write was in flight, it is handed them at once. Whole contents replace the PostgreSQL
//! table's in one transaction; the Kafka and file sinks read back what they hold and write only
//! the difference. So nothing is written twice as a change and nothing is missed.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use eddy_common::{ChangeBatch, Error, ObjectId, Result, SqlState};
use eddy_connectors::sink::file::{FileSink, FileTarget};
use eddy_connectors::sink::kafka::{KafkaSink, KafkaTarget};
use eddy_connectors::sink::postgres::{PostgresSink, PostgresTarget, SinkColumn};
use eddy_connectors::sink::{SinkProgress, SinkWrite};
use eddy_storage::meta::MetaStore;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

/// A sink in the catalog.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SinkDef {
    pub id: ObjectId,
    /// The schema it is in (older catalogs: `public`).
    #[serde(default = "crate::catalog::public_schema")]
    pub schema: String,
    pub name: String,
    /// The materialized view it writes out.
    pub view: ObjectId,
    pub options: Vec<(String, String)>,
    /// `FORMAT envelope ENCODE encoding` (Kafka sinks).
    #[serde(default)]
    pub format: Option<(String, String)>,
    /// The `CREATE SINK` statement as written.
    pub sql: String,
    /// Key column positions in the view (empty: the whole row).
    pub key: Vec<usize>,
    pub columns: Vec<(String, String)>,
}

/// The options each connector knows.
const POSTGRES_OPTIONS: [&str; 9] = [
    "connector",
    "hostname",
    "port",
    "username",
    "password",
    "database.name",
    "schema.name",
    "table.name",
    "primary_key",
];
const KAFKA_OPTIONS: [&str; 4] = [
    "connector",
    "topic",
    "properties.bootstrap.server",
    "primary_key",
];
const FILE_OPTIONS: [&str; 3] = ["connector", "path", "rollover_seconds"];

/// Where a sink writes, by connector.
pub enum Target {
    Postgres(PostgresTarget),
    Kafka(KafkaTarget),
    File(FileTarget),
}

impl SinkDef {
    pub fn qualified(&self) -> eddy_sql::QualifiedName {
        eddy_sql::QualifiedName::new(self.schema.clone(), self.name.clone())
    }

    pub fn option(&self, name: &str) -> Option<String> {
        self.options
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    }

    /// Checks the options (connector, required and unknown ones) and the format.
    pub fn validate(
        options: &[(String, String)],
        format: Option<&(String, String)>,
    ) -> Result<Target> {
        let option = |name: &str| {
            options
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        };
        let connector = option("connector").ok_or_else(|| {
            Error::invalid_parameter(
                "a sink needs the option connector = 'postgres' | 'kafka' | 'file'",
            )
        })?;
        let known: &[&str] = match connector.as_str() {
            "postgres" => &POSTGRES_OPTIONS,
            "kafka" => &KAFKA_OPTIONS,
            "file" => &FILE_OPTIONS,
            c => {
                return Err(Error::invalid_parameter(format!(
                    "unknown sink connector '{c}' (available: 'postgres', 'kafka', 'file')"
                )));
            }
        };
        if let Some((k, _)) = options.iter().find(|(k, _)| !known.contains(&k.as_str())) {
            return Err(Error::invalid_parameter(format!(
                "unknown option {k} for a {connector} sink (known: {})",
                known.join(", ")
            )));
        }
        if connector != "kafka"
            && let Some((envelope, encode)) = format
        {
            return Err(Error::new(
                SqlState::SYNTAX_ERROR,
                format!(
                    "a {connector} sink takes no FORMAT {envelope} ENCODE {encode} (only kafka sinks do)"
                ),
            ));
        }
        match connector.as_str() {
            "postgres" => PostgresTarget::from_options(option).map(Target::Postgres),
            "kafka" => {
                KafkaTarget::from_options(option, format.map(|(e, c)| (e.as_str(), c.as_str())))
                    .map(Target::Kafka)
            }
            _ => FileTarget::from_options(option).map(Target::File),
        }
    }

    /// What `SHOW SINKS` shows as the target: the table, the topic or the directory.
    pub fn target_text(&self) -> String {
        match SinkDef::validate(&self.options, self.format.as_ref()) {
            Ok(Target::Postgres(t)) => format!("{}.{}", t.schema, t.table),
            Ok(Target::Kafka(t)) => t.topic,
            Ok(Target::File(t)) => t.dir.display().to_string(),
            Err(_) => String::new(),
        }
    }

    fn writer(&self, meta: Arc<MetaStore>) -> Result<Writer> {
        let progress = Progress {
            meta,
            sink: self.id,
        };
        Ok(
            match SinkDef::validate(&self.options, self.format.as_ref())? {
                Target::Postgres(target) => {
                    let columns = self
                        .columns
                        .iter()
                        .map(|(name, pg_type)| SinkColumn {
                            name: name.clone(),
                            pg_type: pg_type.clone(),
                        })
                        .collect();
                    Writer::Postgres(PostgresSink::new(
                        self.name.clone(),
                        target,
                        columns,
                        self.key.clone(),
                    ))
                }
                Target::Kafka(target) => Writer::Kafka(
                    KafkaSink::new(self.name.clone(), target, self.key.clone())?,
                    progress,
                ),
                Target::File(target) => Writer::File {
                    sink: Arc::new(Mutex::new(FileSink::new(self.name.clone(), target))),
                    progress,
                    unrolled: None,
                },
            },
        )
    }
}

/// Read offsets of a view, per (table or source, partition), as the sink records them.
pub type Offsets = BTreeMap<(ObjectId, u32), u64>;

pub fn encode_offsets(offsets: &Offsets) -> String {
    offsets
        .iter()
        .map(|((o, p), n)| format!("{}:{p}:{n}", o.0))
        .collect::<Vec<_>>()
        .join(",")
}

pub fn decode_offsets(text: &str) -> Result<Offsets> {
    let bad = || {
        Error::new(
            SqlState::DATA_CORRUPTED,
            format!("sink progress offsets do not parse: {text}"),
        )
    };
    let mut out = Offsets::new();
    for entry in text.split(',').filter(|e| !e.is_empty()) {
        let mut parts = entry.split(':').map(str::parse::<u64>);
        match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some(Ok(o)), Some(Ok(p)), Some(Ok(n)), None) => {
                out.insert((ObjectId(o), u32::try_from(p).map_err(|_| bad())?), n);
            }
            _ => return Err(bad()),
        }
    }
    Ok(out)
}

/// Whether `a` has read at least as far as `b` everywhere `b` has read.
pub fn at_least(a: &Offsets, b: &Offsets) -> bool {
    b.iter().all(|(k, n)| a.get(k).copied().unwrap_or(0) >= *n)
}

/// One epoch for a sink's task to write.
pub struct SinkEpoch {
    pub epoch: u64,
    pub offsets: Offsets,
    pub handed: Handed,
    /// Memory the changes hold (counted in the sink's backlog until written; 0 for whole
    /// contents, which are not limited).
    pub bytes: usize,
}

/// What the runtime hands a sink, as the view produced it; the sink's task consolidates it
/// (off the view thread).
pub enum Handed {
    /// The epoch's changes (none: only progress).
    Changes(Vec<ChangeBatch>),
    /// The view's whole contents, to make the target equal to.
    Contents(Vec<ChangeBatch>),
}

/// An epoch ready to write: its changes or contents consolidated.
struct Ready {
    epoch: u64,
    offsets: Offsets,
    write: SinkWrite,
    bytes: usize,
}

impl Ready {
    /// Consolidates what was handed (`weighted`: a sink that writes rows with weights, where
    /// insert-only changes need no consolidation, only to be put together).
    async fn from(handed: SinkEpoch, weighted: bool) -> Result<Ready> {
        let SinkEpoch {
            epoch,
            offsets,
            handed,
            bytes,
        } = handed;
        let write = tokio::task::spawn_blocking(move || -> Result<SinkWrite> {
            let consolidate = |batches: Vec<ChangeBatch>| match batches.first() {
                Some(first) => eddy_dataflow::consolidate(&first.rows().schema(), &batches),
                None => Ok(None),
            };
            Ok(match handed {
                Handed::Changes(batches)
                    if weighted
                        && batches
                            .iter()
                            .all(|b| b.diffs().values().iter().all(|d| *d > 0)) =>
                {
                    SinkWrite::Changes(ChangeBatch::concat(&batches)?)
                }
                Handed::Changes(batches) => SinkWrite::Changes(consolidate(batches)?),
                Handed::Contents(batches) => SinkWrite::Replace(consolidate(batches)?),
            })
        })
        .await
        .map_err(|e| Error::internal(format!("consolidating a sink's changes: {e}")))??;
        Ok(Ready {
            epoch,
            offsets,
            write,
            bytes,
        })
    }
}

/// How the runtime hands a sink its epochs.
pub struct SinkFeed {
    pub epochs: mpsc::UnboundedSender<SinkEpoch>,
    /// Epochs and bytes of changes handed over and not written yet.
    pub backlog: Arc<Backlog>,
    /// Past this backlog the runtime stops handing changes; once the sink has written what it
    /// has, it gets the view's whole contents instead.
    pub limit: usize,
}

/// What a sink has been handed and has not written yet.
#[derive(Default)]
pub struct Backlog {
    epochs: AtomicUsize,
    bytes: AtomicUsize,
}

impl Backlog {
    fn written(&self, bytes: usize) {
        self.epochs.fetch_sub(1, Ordering::Relaxed);
        self.bytes.fetch_sub(bytes, Ordering::Relaxed);
    }
}

impl SinkFeed {
    /// Hands an epoch over, counting it in the backlog.
    pub fn send(&self, epoch: SinkEpoch) {
        self.backlog.epochs.fetch_add(1, Ordering::Relaxed);
        self.backlog.bytes.fetch_add(epoch.bytes, Ordering::Relaxed);
        let _ = self.epochs.send(epoch);
    }

    /// Whether `bytes` more of changes would pass the limit.
    pub fn full(&self, bytes: usize) -> bool {
        self.backlog.bytes.load(Ordering::Relaxed) + bytes > self.limit
    }

    /// Whether everything handed over has been written.
    pub fn drained(&self) -> bool {
        self.backlog.epochs.load(Ordering::Relaxed) == 0
    }
}

/// What the runtime knows of a sink.
pub struct RuntimeSink {
    pub id: ObjectId,
    pub view: ObjectId,
    /// `Some(S)`: waiting until the view has read S, then the sink gets the view's contents
    /// (`Some(None)`: at once). `None`: live.
    pub waiting: Option<Option<Offsets>>,
    pub feed: SinkFeed,
    /// The offsets of the last epoch handed over (a checkpoint sends progress when they moved).
    pub sent: Option<Offsets>,
}

/// What a sink had written when it started: the view's offsets then, and whether that write
/// is known to be complete (`false`: one was in flight, the target holds an unknown part).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resume {
    pub offsets: Offsets,
    pub clean: bool,
}

/// What a sink's task reports (`SHOW SINKS`).
#[derive(Debug, Clone, Default)]
pub struct SinkStatus {
    pub committed_epoch: Option<u64>,
    /// Rows committed since the server started (changed rows; whole contents count theirs).
    pub rows: u64,
    pub error: Option<String>,
}

/// A sink: its definition, the status its task keeps, and the task (writing epochs, or, for
/// a stored sink whose target could not be reached at start-up, trying to start it).
pub struct Sink {
    pub def: SinkDef,
    pub status: Arc<Mutex<SinkStatus>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Drop for Sink {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

/// How long to wait before writing again after the target failed, at most.
const RETRY_MAX: Duration = Duration::from_secs(30);

/// How often a stored sink that could not start is tried again.
pub const START_RETRY: Duration = Duration::from_secs(5);

impl Sink {
    /// Connects, creates the target when missing and reads the sink's progress (`fresh`:
    /// forgets it: a new sink starts over). Then starts the task that writes epochs; returns the
    /// sink, what it had written and the sender the runtime hands epochs to.
    pub async fn start(
        def: SinkDef,
        fresh: bool,
        meta: Arc<MetaStore>,
        buffer_bytes: usize,
    ) -> Result<(Sink, Option<Resume>, SinkFeed)> {
        let mut writer = def.writer(meta)?;
        let (resume, committed_epoch) =
            tokio::time::timeout(Duration::from_secs(15), writer.prepare(fresh))
                .await
                .map_err(|_| {
                    Error::new(
                        SqlState::CONNECTION_EXCEPTION,
                        format!(
                            "sink \"{}\": its target did not answer within 15 s",
                            def.name
                        ),
                    )
                })??;
        let (tx, rx) = mpsc::unbounded_channel();
        let status = Arc::new(Mutex::new(SinkStatus {
            committed_epoch,
            rows: 0,
            error: None,
        }));
        let backlog = Arc::new(Backlog::default());
        let task = tokio::spawn(run(
            def.name.clone(),
            writer,
            rx,
            Arc::clone(&status),
            Arc::clone(&backlog),
        ));
        Ok((
            Sink {
                def,
                status,
                task: Some(task),
            },
            resume,
            SinkFeed {
                epochs: tx,
                backlog,
                limit: buffer_bytes,
            },
        ))
    }

    /// A stored sink not started yet: `error` is why, `retry` the task trying again.
    pub fn waiting(def: SinkDef, error: String, retry: tokio::task::JoinHandle<()>) -> Sink {
        Sink {
            def,
            status: Arc::new(Mutex::new(SinkStatus {
                committed_epoch: None,
                rows: 0,
                error: Some(error),
            })),
            task: Some(retry),
        }
    }

    /// Lets the task run on after the sink is dropped.
    pub fn detach(mut self) {
        self.task = None;
    }
}

/// Writes epochs in order (and rolls files when due); a failed write is retried, with growing
/// pauses, until it succeeds.
async fn run(
    name: String,
    mut writer: Writer,
    mut epochs: mpsc::UnboundedReceiver<SinkEpoch>,
    status: Arc<Mutex<SinkStatus>>,
    backlog: Arc<Backlog>,
) {
    loop {
        let due = writer.roll_due();
        let next = tokio::select! {
            epoch = epochs.recv() => match epoch {
                Some(epoch) => Some(epoch),
                None => break,
            },
            () = tokio::time::sleep_until(due.unwrap_or_else(|| tokio::time::Instant::now() + RETRY_MAX)), if due.is_some() => None,
        };
        let next = match next {
            Some(handed) => {
                let (number, bytes) = (handed.epoch, handed.bytes);
                match Ready::from(handed, matches!(writer, Writer::File { .. })).await {
                    Ok(ready) => Some(ready),
                    Err(e) => {
                        // A bug, not the target's fault: the epoch cannot be written.
                        tracing::error!(sink = %name, epoch = number, error = %e, "consolidating an epoch for the sink failed");
                        status.lock().unwrap_or_else(|p| p.into_inner()).error =
                            Some(e.message.clone());
                        backlog.written(bytes);
                        continue;
                    }
                }
            }
            None => None,
        };
        let mut pause = Duration::from_millis(100);
        loop {
            let result = match &next {
                Some(epoch) => writer.write(epoch).await,
                None => writer.roll().await,
            };
            match result {
                Ok(committed) => {
                    if let Some(epoch) = &next {
                        backlog.written(epoch.bytes);
                    }
                    let mut s = status.lock().unwrap_or_else(|p| p.into_inner());
                    if let Some((epoch, rows)) = committed {
                        s.committed_epoch = Some(epoch);
                        s.rows += rows;
                    }
                    s.error = None;
                    break;
                }
                Err(e) => {
                    tracing::warn!(sink = %name, epoch = next.as_ref().map(|e| e.epoch), error = %e, "writing to the sink failed; retrying");
                    status.lock().unwrap_or_else(|p| p.into_inner()).error =
                        Some(e.message.clone());
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(RETRY_MAX);
                }
            }
        }
    }
}

/// A Kafka or file sink's progress in Eddy's metadata store.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Stored {
    epoch: u64,
    offsets: String,
    /// `false` while the write is in flight.
    done: bool,
    /// The file sink's file being committed.
    file: Option<String>,
}

struct Progress {
    meta: Arc<MetaStore>,
    sink: ObjectId,
}

impl Progress {
    fn get(&self) -> Result<Option<Stored>> {
        match self.meta.sink_progress(self.sink)? {
            Some(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| {
                Error::new(
                    SqlState::DATA_CORRUPTED,
                    format!("sink progress does not parse: {e}"),
                )
            }),
            None => Ok(None),
        }
    }

    fn put(&self, stored: &Stored, durable: bool) -> Result<()> {
        let bytes = serde_json::to_vec(stored)
            .map_err(|e| Error::internal(format!("encoding sink progress: {e}")))?;
        self.meta.put_sink_progress(self.sink, &bytes, durable)
    }

    /// Stored progress as the runtime weighs it, and the epoch last committed; `committed`:
    /// whether the write it marks in flight is known to have completed after all; `fresh`:
    /// forgets it instead.
    fn resume(
        &self,
        fresh: bool,
        committed: impl Fn(&Stored) -> bool,
    ) -> Result<(Option<Resume>, Option<u64>)> {
        if fresh {
            self.meta.delete_sink_progress(self.sink)?;
            return Ok((None, None));
        }
        Ok(match self.get()? {
            Some(s) => {
                let clean = s.done || committed(&s);
                (
                    Some(Resume {
                        offsets: decode_offsets(&s.offsets)?,
                        clean,
                    }),
                    clean.then_some(s.epoch),
                )
            }
            None => (None, None),
        })
    }
}

/// A sink's connector with what it needs to record progress.
enum Writer {
    /// Progress goes in the same PostgreSQL transaction as each epoch.
    Postgres(PostgresSink),
    /// Each epoch is marked in flight (durably) before it is produced and done after.
    Kafka(KafkaSink, Progress),
    /// Epochs go to the open file; rolling it marks the file in flight (durably), renames it,
    /// and marks it done. `unrolled`: the last epoch and offsets not yet rolled, and the rows
    /// written since the last roll.
    File {
        sink: Arc<Mutex<FileSink>>,
        progress: Progress,
        unrolled: Option<(u64, Offsets, u64)>,
    },
}

/// Runs file-system work off the async threads.
async fn blocking<T: Send + 'static>(
    sink: &Arc<Mutex<FileSink>>,
    work: impl FnOnce(&mut FileSink) -> Result<T> + Send + 'static,
) -> Result<T> {
    let sink = Arc::clone(sink);
    tokio::task::spawn_blocking(move || work(&mut sink.lock().unwrap_or_else(|p| p.into_inner())))
        .await
        .map_err(|e| Error::internal(format!("file sink task: {e}")))?
}

impl Writer {
    /// Connects and prepares the target; returns what was written before (`None`: nothing,
    /// or `fresh`: forgotten) and the epoch last committed.
    async fn prepare(&mut self, fresh: bool) -> Result<(Option<Resume>, Option<u64>)> {
        match self {
            Writer::Postgres(sink) => {
                let progress = sink.prepare().await?;
                if fresh {
                    sink.reset_progress().await?;
                    return Ok((None, None));
                }
                Ok(match progress {
                    Some(p) => (
                        Some(Resume {
                            offsets: decode_offsets(&p.offsets)?,
                            clean: true,
                        }),
                        Some(p.epoch),
                    ),
                    None => (None, None),
                })
            }
            Writer::Kafka(sink, progress) => {
                sink.prepare().await?;
                progress.resume(fresh, |_| false)
            }
            Writer::File { sink, progress, .. } => {
                blocking(sink, FileSink::prepare).await?;
                let files = Arc::clone(sink);
                progress.resume(fresh, move |s| {
                    s.file.as_deref().is_some_and(|f| {
                        files.lock().unwrap_or_else(|p| p.into_inner()).committed(f)
                    })
                })
            }
        }
    }

    /// Writes one epoch (the same epoch again after an error is safe); returns the epoch now
    /// committed and the rows that committed with it, if this made one so.
    async fn write(&mut self, epoch: &Ready) -> Result<Option<(u64, u64)>> {
        let offsets = encode_offsets(&epoch.offsets);
        let rows = match &epoch.write {
            SinkWrite::Changes(Some(c)) | SinkWrite::Replace(Some(c)) => c.len() as u64,
            _ => 0,
        };
        match self {
            Writer::Postgres(sink) => {
                sink.write(
                    &epoch.write,
                    &SinkProgress {
                        epoch: epoch.epoch,
                        offsets,
                    },
                )
                .await?;
                Ok(Some((epoch.epoch, rows)))
            }
            Writer::Kafka(sink, progress) => {
                let mut stored = Stored {
                    epoch: epoch.epoch,
                    offsets,
                    done: false,
                    file: None,
                };
                if !matches!(epoch.write, SinkWrite::Changes(None)) {
                    progress.put(&stored, true)?;
                    sink.write(epoch.epoch, &epoch.write).await?;
                }
                stored.done = true;
                progress.put(&stored, false)?;
                Ok(Some((epoch.epoch, rows)))
            }
            Writer::File { sink, unrolled, .. } => {
                let (number, write) = (epoch.epoch, epoch.write.clone());
                blocking(sink, move |s| match &write {
                    SinkWrite::Changes(Some(changes)) => s.append(number, changes),
                    SinkWrite::Changes(None) => Ok(()),
                    SinkWrite::Replace(contents) => s.reconcile(number, contents.as_ref()),
                })
                .await?;
                let before = unrolled.as_ref().map_or(0, |u| u.2);
                *unrolled = Some((epoch.epoch, epoch.offsets.clone(), before + rows));
                Ok(None)
            }
        }
    }

    /// When the open file is due to be rolled (file sinks).
    fn roll_due(&self) -> Option<tokio::time::Instant> {
        match self {
            Writer::File {
                sink,
                unrolled: Some(_),
                ..
            } => {
                let sink = sink.lock().unwrap_or_else(|p| p.into_inner());
                let due = sink
                    .opened_at()
                    .map_or_else(std::time::Instant::now, |at| at + sink.target().rollover);
                Some(tokio::time::Instant::from_std(due))
            }
            _ => None,
        }
    }

    /// Commits the open file (file sinks) and records the progress it carries.
    async fn roll(&mut self) -> Result<Option<(u64, u64)>> {
        let Writer::File {
            sink,
            progress,
            unrolled,
        } = self
        else {
            return Ok(None);
        };
        let Some((epoch, offsets, rows)) = unrolled.clone() else {
            return Ok(None);
        };
        let file = sink
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pending_name();
        let mut stored = Stored {
            epoch,
            offsets: encode_offsets(&offsets),
            done: false,
            file,
        };
        if stored.file.is_some() {
            progress.put(&stored, true)?;
            blocking(sink, FileSink::commit).await?;
        }
        stored.done = true;
        progress.put(&stored, false)?;
        *unrolled = None;
        Ok(Some((epoch, rows)))
    }
}
