//! Records from outside into a table: HTTP ingest bodies, connector chunks and replayed dead
//! letters all pass through [`Engine::ingest_records`].
//!
//! The path: decode the chunk (bad records are set aside with their reason), resolve what each
//! row does to the table's contents under the write lock (a duplicate key or a delete of a row
//! the table does not hold is set aside too), deal with the set-aside records as the table's
//! `on_error` says — dead letters are stored durably *before* the rows around them are
//! acknowledged — and commit the rows together with the connector's source positions.

use std::sync::Arc;
use std::time::Duration;

use eddy_common::{Error, Result, SqlState};
use eddy_connectors::kafka::{KafkaTopic, Startup};
use eddy_connectors::{RawRecord, RecordDecoder};
use eddy_storage::meta::DeadLetter;

use crate::catalog::OnError;
use crate::{Engine, Table};

/// How a chunk of records went.
#[derive(Debug, Default)]
pub struct IngestReport {
    /// Records whose rows were applied.
    pub accepted: usize,
    /// Records set aside: (index in the chunk, why).
    pub rejected: Vec<(usize, String)>,
}

/// Most bytes a connector reads per chunk (one commit).
const CHUNK_BYTES: usize = 4 << 20;
/// How often a connector looks for new records when there were none.
const POLL_INTERVAL: Duration = Duration::from_millis(50);

fn now_micros() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_micros() as i64)
}

impl Engine {
    /// Decodes `records` into `table` and commits them with `positions`; see the module doc.
    /// `partition` pins an append-only table's write to that log partition (modulo the
    /// table's partitions), so that a source partition's order is kept.
    pub(crate) async fn ingest_records(
        &self,
        table: &Arc<Table>,
        decoder: &RecordDecoder,
        records: &[RawRecord<'_>],
        positions: &[(u32, u64)],
        on_error: OnError,
        partition: Option<u32>,
    ) -> Result<IngestReport> {
        let decoded = decoder.decode(records)?;
        let guard = self.lock_writes().await;
        // The table as it is now (ALTER TABLE replaces its definition).
        let table = &self.table_by_id(table.def.id).ok_or_else(|| Error::new(SqlState::UNDEFINED_TABLE, format!("table \"{}\" was dropped", table.def.name)))?;
        if decoded.rows.num_columns() != table.schema.fields().len() {
            // ALTER TABLE changed the columns after this chunk was decoded: the caller reads
            // it again with the new definition.
            return Err(Error::new(SqlState::SERIALIZATION_FAILURE, format!("table \"{}\" was altered while records were decoded", table.def.name)));
        }
        let (changes, conflicts) = table.read().resolve(&decoded.rows, &decoded.kinds)?;
        let mut rejected = decoded.rejected;
        rejected.extend(conflicts.into_iter().map(|(row, why)| (decoded.origins[row], why)));
        rejected.sort_by_key(|r| r.0);
        rejected.dedup_by_key(|r| r.0);
        if !rejected.is_empty() {
            match on_error {
                OnError::Fail => {
                    let (i, why) = &rejected[0];
                    return Err(Error::new(SqlState::DATA_EXCEPTION, format!("record {} of table \"{}\": {why}", i + 1, table.def.name))
                        .with_hint("the table has on_error = 'fail'; with 'dead_letter' bad records go to eddy_dead_letters and the others are kept"));
                }
                OnError::Skip => tracing::debug!(table = %table.def.name, skipped = rejected.len(), "skipping undecodable records"),
                OnError::DeadLetter => {
                    let received_at_micros = now_micros();
                    let letters: Vec<DeadLetter> = rejected
                        .iter()
                        .map(|(i, why)| DeadLetter {
                            object: table.def.id,
                            partition: records[*i].partition,
                            offset: records[*i].offset,
                            raw: records[*i].value.or(records[*i].key).unwrap_or_default().to_vec(),
                            error: why.clone(),
                            received_at_micros,
                        })
                        .collect();
                    self.meta.put_dead_letters(&letters)?;
                }
            }
        }
        let accepted = records.len() - rejected.len();
        self.commit(guard, vec![(Arc::clone(table), vec![changes])], positions, partition).await?;
        Ok(IngestReport { accepted, rejected })
    }

    /// `POST /ingest/<table>`: one record per line (JSON, or CSV when `csv` and the table
    /// declares no format). Answers once the accepted records are durable.
    pub async fn ingest_body(&self, table: &str, body: &[u8], csv: bool) -> Result<IngestReport> {
        let table = self.table(table).ok_or_else(|| Error::new(SqlState::UNDEFINED_TABLE, format!("table \"{table}\" does not exist")))?;
        let decoder = table.def.decoder(&table.schema, csv)?;
        let records: Vec<RawRecord<'_>> = body
            .split(|b| *b == b'\n')
            .map(|line| line.strip_suffix(b"\r").unwrap_or(line))
            .filter(|line| !line.iter().all(u8::is_ascii_whitespace))
            .map(|line| RawRecord { value: Some(line), ..RawRecord::default() })
            .collect();
        self.ingest_records(&table, &decoder, &records, &[], table.def.on_error(), None).await
    }

    /// `ALTER TABLE t REPLAY DEAD LETTERS`: decodes the table's dead letters again with its
    /// current definition; those that now succeed are applied and removed, the others stay
    /// (with their new error). Returns (replayed, left).
    pub(crate) async fn replay_dead_letters(&self, table: &Arc<Table>) -> Result<(usize, usize)> {
        let letters = self.meta.dead_letters(Some(table.def.id))?;
        if letters.is_empty() {
            return Ok((0, 0));
        }
        let decoder = table.def.decoder(&table.schema, false)?;
        let records: Vec<RawRecord<'_>> = letters
            .iter()
            .map(|(_, l)| RawRecord { value: Some(l.raw.as_slice()), partition: l.partition, offset: l.offset, ..RawRecord::default() })
            .collect();
        // Failures are kept as they are (their letters stay), not stored again.
        let report = self.ingest_records(table, &decoder, &records, &[], OnError::Skip, None).await?;
        let failed: std::collections::HashMap<usize, &String> = report.rejected.iter().map(|(i, why)| (*i, why)).collect();
        let done: Vec<_> = letters.iter().enumerate().filter(|(i, _)| !failed.contains_key(i)).map(|(_, (key, _))| key.clone()).collect();
        let updated: Vec<DeadLetter> = letters
            .iter()
            .enumerate()
            .filter_map(|(i, (_, l))| failed.get(&i).map(|why| DeadLetter { error: (*why).clone(), ..l.clone() }))
            .filter(|l| l.offset.is_some())
            .collect();
        self.meta.delete_dead_letters(&done)?;
        self.meta.put_dead_letters(&updated)?;
        Ok((done.len(), failed.len()))
    }

    /// Every stored dead letter.
    pub(crate) fn dead_letters(&self) -> Result<Vec<DeadLetter>> {
        Ok(self.meta.dead_letters(None)?.into_iter().map(|(_, l)| l).collect())
    }

    /// Starts the connector of every table that has one (start-up). A broker that cannot be
    /// reached does not stop the server: its connector retries.
    pub async fn start_connectors(self: &Arc<Self>) -> Result<()> {
        for table in self.tables() {
            self.start_connector(&table, false).await?;
        }
        Ok(())
    }

    /// Starts `table`'s connector, if it has one, resuming where the log says it got to. With
    /// `validate` (CREATE TABLE) the source must be reachable now.
    pub(crate) async fn start_connector(self: &Arc<Self>, table: &Arc<Table>, validate: bool) -> Result<()> {
        match table.def.option("connector") {
            Some("file") => {
                let path = table.def.option("path").unwrap_or_default().to_owned();
                let recorded = table.positions.lock().unwrap_or_else(|p| p.into_inner()).get(&0).copied();
                let start = match recorded {
                    Some(p) => p,
                    None if table.def.option("scan.startup.mode") == Some("latest") => {
                        // Where "latest" was when the table was created is recorded at once, so a
                        // restart does not move it.
                        let end = std::fs::metadata(&path).map_or(0, |m| m.len());
                        self.record_positions(table, &[(0, end)]).await?;
                        end
                    }
                    None => 0,
                };
                let engine = Arc::clone(self);
                let table = Arc::clone(table);
                tokio::spawn(async move {
                    if let Err(e) = engine.follow_file(&table, path, start).await {
                        tracing::error!(table = %table.def.name, error = %e, "the file connector stopped");
                    }
                });
                Ok(())
            }
            Some("kafka") => {
                let spec = KafkaSpec::of(&table.def)?;
                if validate {
                    let topic = KafkaTopic::connect(&spec.bootstrap, &spec.topic).await?;
                    let partitions = topic.partitions().await?;
                    self.kafka_start_offsets(table, &topic, &partitions, spec.startup).await?;
                }
                let engine = Arc::clone(self);
                let table = Arc::clone(table);
                tokio::spawn(async move { engine.follow_kafka(&table, &spec).await });
                Ok(())
            }
            Some(other) => Err(Error::unsupported(format!("connector '{other}' is not supported"))),
            None => Ok(()),
        }
    }

    /// Commits source positions alone (where a connector starts, before any record).
    async fn record_positions(&self, table: &Arc<Table>, positions: &[(u32, u64)]) -> Result<()> {
        if positions.is_empty() {
            return Ok(());
        }
        let guard = self.lock_writes().await;
        self.commit(guard, vec![(Arc::clone(table), Vec::new())], positions, None).await
    }

    /// Resolves and records the start offset of every partition that has none yet, so that
    /// `latest` or a timestamp means the moment the table was created, also after a restart.
    async fn kafka_start_offsets(&self, table: &Arc<Table>, topic: &KafkaTopic, partitions: &[u32], startup: Startup) -> Result<()> {
        let known = table.positions.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let mut new = Vec::new();
        for &p in partitions.iter().filter(|p| !known.contains_key(p)) {
            let offset = topic.reader(p).await?.offset_at(startup).await?;
            new.push((p, offset));
        }
        self.record_positions(table, &new).await
    }

    /// The file connector's loop: reads complete lines from `start` and ingests them, until
    /// the table is dropped.
    async fn follow_file(&self, table: &Arc<Table>, path: String, start: u64) -> Result<()> {
        let decoder = table.def.decoder(&table.schema, false)?;
        let on_error = table.def.on_error();
        let mut tail = eddy_connectors::file::FileTail::new(&path, start);
        tracing::info!(table = %table.def.name, path, start, "following a file");
        let mut table = Arc::clone(table);
        let mut decoder = decoder;
        loop {
            if !self.follow_changes(&mut table, &mut decoder)? {
                return Ok(());
            }
            let lines = {
                let mut t = std::mem::replace(&mut tail, eddy_connectors::file::FileTail::new(&path, 0));
                let (t, lines) = tokio::task::spawn_blocking(move || {
                    let lines = t.next_lines(CHUNK_BYTES);
                    let size = t.size();
                    (t, lines.map(|l| (l, size)))
                })
                .await
                .map_err(|e| Error::internal(format!("file reader: {e}")))?;
                tail = t;
                let (lines, size) = lines?;
                table.source_ends.lock().unwrap_or_else(|p| p.into_inner()).insert(0, size);
                lines
            };
            if lines.lines.is_empty() {
                tokio::time::sleep(POLL_INTERVAL).await;
                continue;
            }
            let records: Vec<RawRecord<'_>> = lines
                .lines
                .iter()
                .map(|(offset, line)| RawRecord { value: Some(line), partition: Some(0), offset: Some(*offset), ..RawRecord::default() })
                .collect();
            match self.ingest_records(&table, &decoder, &records, &[(0, lines.end)], on_error, None).await {
                Ok(_) => {}
                Err(e) if e.state == SqlState::UNDEFINED_TABLE => return Ok(()),
                Err(e) if e.state == SqlState::SERIALIZATION_FAILURE => {
                    // Read the chunk again (with the table's new definition).
                    let recorded = table.positions.lock().unwrap_or_else(|p| p.into_inner()).get(&0).copied().unwrap_or(start);
                    tail = eddy_connectors::file::FileTail::new(&path, recorded);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The Kafka connector: one reader per partition, reconnecting after a broker failure,
    /// until the table is dropped or a record fails under `on_error = 'fail'`.
    async fn follow_kafka(self: Arc<Self>, table: &Arc<Table>, spec: &KafkaSpec) {
        loop {
            let result = async {
                let topic = Arc::new(KafkaTopic::connect(&spec.bootstrap, &spec.topic).await?);
                let partitions = topic.partitions().await?;
                self.kafka_start_offsets(table, &topic, &partitions, spec.startup).await?;
                tracing::info!(table = %table.def.name, topic = spec.topic, partitions = partitions.len(), "reading a Kafka topic");
                let mut readers = tokio::task::JoinSet::new();
                for p in partitions {
                    let (engine, table, topic) = (Arc::clone(&self), Arc::clone(table), Arc::clone(&topic));
                    readers.spawn(async move { engine.follow_kafka_partition(table, &topic, p).await });
                }
                while let Some(done) = readers.join_next().await {
                    done.map_err(|e| Error::internal(format!("kafka reader: {e}")))??;
                }
                Ok::<(), Error>(())
            }
            .await;
            match result {
                Ok(()) => return,
                Err(e) if e.state == SqlState::UNDEFINED_TABLE => return,
                Err(e) if e.state.is_data_exception() => {
                    tracing::error!(table = %table.def.name, error = %e, "the Kafka connector stopped (on_error = 'fail')");
                    return;
                }
                Err(e) => {
                    tracing::warn!(table = %table.def.name, error = %e, "the Kafka connector failed; retrying in 1 s");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    if self.table_by_id(table.def.id).is_none() {
                        return;
                    }
                }
            }
        }
    }

    async fn follow_kafka_partition(&self, table: Arc<Table>, topic: &KafkaTopic, partition: u32) -> Result<()> {
        let reader = topic.reader(partition).await?;
        let mut offset = table.positions.lock().unwrap_or_else(|p| p.into_inner()).get(&partition).copied().unwrap_or(0);
        let mut table = table;
        let mut decoder = table.def.decoder(&table.schema, false)?;
        loop {
            if !self.follow_changes(&mut table, &mut decoder)? {
                return Ok(());
            }
            let (records, high) = reader.fetch(offset, CHUNK_BYTES as i32, KAFKA_WAIT).await?;
            table.source_ends.lock().unwrap_or_else(|p| p.into_inner()).insert(partition, high);
            let Some(last) = records.last() else { continue };
            let next = last.offset + 1;
            let raw: Vec<RawRecord<'_>> = records
                .iter()
                .map(|r| RawRecord {
                    key: r.key.as_deref(),
                    value: r.value.as_deref(),
                    partition: Some(partition),
                    offset: Some(r.offset),
                    timestamp_micros: Some(r.timestamp_micros),
                })
                .collect();
            self.ingest_records(&table, &decoder, &raw, &[(partition, next)], table.def.on_error(), Some(partition)).await?;
            offset = next;
        }
    }

    /// Keeps a connector on the table as it is now: after an ALTER TABLE, its new definition
    /// and decoder. False once the table was dropped.
    fn follow_changes(&self, table: &mut Arc<Table>, decoder: &mut RecordDecoder) -> Result<bool> {
        match self.table_by_id(table.def.id) {
            None => Ok(false),
            Some(now) if !Arc::ptr_eq(&now, table) => {
                *decoder = now.def.decoder(&now.schema, false)?;
                *table = now;
                Ok(true)
            }
            Some(_) => Ok(true),
        }
    }

    /// How far a table's connector has read and where its source ends, per source partition:
    /// (partition, read up to, end).
    pub(crate) fn connector_progress(&self, table: &Table) -> Vec<(u32, Option<u64>, u64)> {
        let positions = table.positions.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let ends = table.source_ends.lock().unwrap_or_else(|p| p.into_inner()).clone();
        ends.into_iter().map(|(p, end)| (p, positions.get(&p).copied(), end)).collect()
    }
}

/// How long a Kafka fetch waits for the first record.
const KAFKA_WAIT: Duration = Duration::from_millis(500);

/// A Kafka table's options.
struct KafkaSpec {
    bootstrap: String,
    topic: String,
    startup: Startup,
}

impl KafkaSpec {
    fn of(def: &crate::catalog::TableDef) -> Result<KafkaSpec> {
        let startup = match def.option("scan.startup.mode") {
            None | Some("earliest") => Startup::Earliest,
            Some("latest") => Startup::Latest,
            Some(_) => {
                let ms = def.option("scan.startup.timestamp.millis").unwrap_or_default();
                Startup::Timestamp(ms.parse().map_err(|_| Error::invalid_parameter(format!("scan.startup.timestamp.millis must be a number, not '{ms}'")))?)
            }
        };
        Ok(KafkaSpec {
            bootstrap: def.option("properties.bootstrap.server").unwrap_or_default().to_owned(),
            topic: def.option("topic").unwrap_or_default().to_owned(),
            startup,
        })
    }
}
