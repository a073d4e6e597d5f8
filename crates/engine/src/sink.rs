//! Sinks: `CREATE SINK s FROM mv WITH (connector = 'postgres', ...)` keeps a PostgreSQL table
//! equal to a materialized view (ADR 0008).
//!
//! The view runtime hands every epoch's consolidated changes of the view to the sink's task
//! ([`SinkEpoch`]), which writes them and the view's read offsets in one PostgreSQL transaction
//! (`eddy_sink_progress`). After a restart the runtime compares the offsets the sink last
//! committed (S) with the offsets the restored view has read (C): equal, the sink goes on; C
//! behind S (the view replays what the sink already has), the sink waits until the view has
//! read at least S and then replaces the table's contents with the view's in one transaction;
//! C ahead of S (the sink had not written everything the checkpoint holds), it replaces them at
//! once. So nothing is written twice as a change and nothing is missed.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use eddy_common::{Error, ObjectId, Result, SqlState};
use eddy_connectors::postgres_sink::{PostgresSink, PostgresTarget, SinkColumn, SinkProgress, SinkWrite};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

/// A sink in the catalog.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SinkDef {
    pub id: ObjectId,
    pub name: String,
    /// The materialized view it writes out.
    pub view: ObjectId,
    pub options: Vec<(String, String)>,
    /// The `CREATE SINK` statement as written.
    pub sql: String,
    /// Key column positions in the view (empty: the whole row).
    pub key: Vec<usize>,
    pub columns: Vec<(String, String)>,
}

/// The options a postgres sink knows.
const OPTIONS: [&str; 9] = ["connector", "hostname", "port", "username", "password", "database.name", "schema.name", "table.name", "primary_key"];

impl SinkDef {
    pub fn option(&self, name: &str) -> Option<String> {
        self.options.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
    }

    /// Checks the options (connector, required and unknown ones).
    pub fn validate(options: &[(String, String)]) -> Result<PostgresTarget> {
        let option = |name: &str| options.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
        match option("connector").as_deref() {
            Some("postgres") => {}
            Some(c @ ("kafka" | "file")) => return Err(Error::unsupported(format!("sink connector '{c}' is not available yet; 'postgres' is"))),
            Some(c) => return Err(Error::invalid_parameter(format!("unknown sink connector '{c}' (available: 'postgres')"))),
            None => return Err(Error::invalid_parameter("a sink needs the option connector = 'postgres'")),
        }
        if let Some((k, _)) = options.iter().find(|(k, _)| !OPTIONS.contains(&k.as_str())) {
            return Err(Error::invalid_parameter(format!("unknown option {k} for a postgres sink (known: {})", OPTIONS.join(", "))));
        }
        PostgresTarget::from_options(option)
    }

    fn writer(&self) -> Result<PostgresSink> {
        let target = SinkDef::validate(&self.options)?;
        let columns = self.columns.iter().map(|(name, pg_type)| SinkColumn { name: name.clone(), pg_type: pg_type.clone() }).collect();
        Ok(PostgresSink::new(self.name.clone(), target, columns, self.key.clone()))
    }
}

/// Read offsets of a view, per (table or source, partition), as the sink records them.
pub type Offsets = BTreeMap<(ObjectId, u32), u64>;

pub fn encode_offsets(offsets: &Offsets) -> String {
    offsets.iter().map(|((o, p), n)| format!("{}:{p}:{n}", o.0)).collect::<Vec<_>>().join(",")
}

pub fn decode_offsets(text: &str) -> Result<Offsets> {
    let bad = || Error::new(SqlState::DATA_CORRUPTED, format!("sink progress offsets do not parse: {text}"));
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
    pub write: SinkWrite,
}

/// What the runtime knows of a sink.
pub struct RuntimeSink {
    pub id: ObjectId,
    pub view: ObjectId,
    /// `Some(S)`: waiting until the view has read S, then the table is replaced. `None`: live.
    pub waiting: Option<Option<Offsets>>,
    pub epochs: mpsc::UnboundedSender<SinkEpoch>,
    /// The offsets of the last epoch handed over (a checkpoint sends progress when they moved).
    pub sent: Option<Offsets>,
}

/// What a sink's task reports (`SHOW SINKS`).
#[derive(Debug, Clone, Default)]
pub struct SinkStatus {
    pub committed_epoch: Option<u64>,
    pub error: Option<String>,
}

/// A running sink: its definition, the status its task keeps, and the task.
pub struct Sink {
    pub def: SinkDef,
    pub status: Arc<Mutex<SinkStatus>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Sink {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// How long to wait before writing again after PostgreSQL failed, at most.
const RETRY_MAX: Duration = Duration::from_secs(30);

impl Sink {
    /// Connects, creates the target table when missing and reads the sink's progress (`fresh`:
    /// forgets it: a new sink starts over). Then starts the task that writes epochs; returns the
    /// sink, its progress and the sender the runtime hands epochs to.
    pub async fn start(def: SinkDef, fresh: bool) -> Result<(Sink, Option<SinkProgress>, mpsc::UnboundedSender<SinkEpoch>)> {
        let mut writer = def.writer()?;
        let progress = tokio::time::timeout(Duration::from_secs(15), async {
            if fresh {
                writer.prepare().await?;
                writer.reset_progress().await?;
                return Ok(None);
            }
            writer.prepare().await
        })
        .await
        .map_err(|_| Error::new(SqlState::CONNECTION_EXCEPTION, format!("postgres sink \"{}\": PostgreSQL did not answer within 15 s", def.name)))??;
        let (tx, rx) = mpsc::unbounded_channel();
        let status = Arc::new(Mutex::new(SinkStatus { committed_epoch: progress.as_ref().map(|p| p.epoch), error: None }));
        let task = tokio::spawn(run(def.name.clone(), writer, rx, Arc::clone(&status)));
        Ok((Sink { def, status, task }, progress, tx))
    }
}

/// Writes epochs in order; a failed write is retried (with growing pauses) until it succeeds.
async fn run(name: String, mut writer: PostgresSink, mut epochs: mpsc::UnboundedReceiver<SinkEpoch>, status: Arc<Mutex<SinkStatus>>) {
    while let Some(epoch) = epochs.recv().await {
        let progress = SinkProgress { epoch: epoch.epoch, offsets: encode_offsets(&epoch.offsets) };
        let mut pause = Duration::from_millis(100);
        loop {
            match writer.write(&epoch.write, &progress).await {
                Ok(()) => {
                    let mut s = status.lock().unwrap_or_else(|p| p.into_inner());
                    s.committed_epoch = Some(epoch.epoch);
                    s.error = None;
                    break;
                }
                Err(e) => {
                    tracing::warn!(sink = %name, epoch = epoch.epoch, error = %e, "writing to the sink failed; retrying");
                    status.lock().unwrap_or_else(|p| p.into_inner()).error = Some(e.message.clone());
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(RETRY_MAX);
                }
            }
        }
    }
}
