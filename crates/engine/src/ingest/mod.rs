//! Records from outside: HTTP ingest bodies, connector chunks and replayed dead letters into
//! a table all pass through [`Engine::ingest_records`]; the connectors (a followed file, a
//! Kafka topic) feed a table or, for a source, each view's reader ([`Feed`]).
//!
//! The path into a table: decode the chunk (bad records are set aside with their reason),
//! resolve what each row does to the table's contents under the write lock (a duplicate key or
//! a delete of a row the table does not hold is set aside too), deal with the set-aside
//! records as the table's `on_error` says — dead letters are stored durably *before* the rows
//! around them are acknowledged — and commit the rows together with the connector's source
//! positions. Into a source's reader: the same, against the reader's own copy of a keyed
//! source's rows, and handed to the one view (see `source.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use arrow::datatypes::SchemaRef;
use eddy_common::limits::{CONNECTOR_CHUNK_BYTES, NEXMARK_CHUNK_EVENTS};
use eddy_common::{Error, Result, SqlState};
use eddy_connectors::kafka::{KafkaTopic, Startup};
use eddy_connectors::nexmark::NexmarkGenerator;
use eddy_connectors::{Decoded, RawRecord, RecordDecoder};
use eddy_storage::meta::DeadLetter;

mod file;

use crate::catalog::{OnError, TableDef};
use crate::source::{Source, SourceReader};
use crate::{Engine, Table};

/// How far a connector has read, per source partition.
#[derive(Debug, Default)]
pub(crate) struct ConnectorProgress {
    partitions: std::sync::Mutex<BTreeMap<u32, PartitionProgress>>,
}

/// One source partition of a connector (a row of `eddy_source_offsets`).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct PartitionProgress {
    /// The offset of the next record to read (`None`: none read or recorded yet).
    pub next: Option<u64>,
    /// Where the partition ends, as last seen (`None`: not looked at yet).
    pub end: Option<u64>,
    /// Records dropped under `on_error = 'skip'` since the server started.
    pub skipped: u64,
}

impl ConnectorProgress {
    /// Progress starting at `positions` (partition, next offset).
    pub(crate) fn at(positions: impl IntoIterator<Item = (u32, u64)>) -> Self {
        let progress = ConnectorProgress::default();
        progress.advance(&positions.into_iter().collect::<Vec<_>>());
        progress
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u32, PartitionProgress>> {
        self.partitions.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn next(&self, partition: u32) -> Option<u64> {
        self.lock().get(&partition).and_then(|p| p.next)
    }

    pub(crate) fn advance(&self, positions: &[(u32, u64)]) {
        let mut partitions = self.lock();
        for &(p, next) in positions {
            partitions.entry(p).or_default().next = Some(next);
        }
    }

    fn set_end(&self, partition: u32, end: u64) {
        self.lock().entry(partition).or_default().end = Some(end);
    }

    fn skip(&self, partition: u32, records: usize) {
        self.lock().entry(partition).or_default().skipped += records as u64;
    }

    /// Every partition the connector has looked at.
    pub(crate) fn partitions(&self) -> Vec<(u32, PartitionProgress)> {
        self.lock()
            .iter()
            .filter(|(_, p)| p.end.is_some())
            .map(|(n, p)| (*n, *p))
            .collect()
    }

    fn known(&self) -> BTreeSet<u32> {
        self.lock()
            .iter()
            .filter(|(_, p)| p.next.is_some())
            .map(|(n, _)| *n)
            .collect()
    }
}

/// What became of a feed's object since the connector last looked.
enum Refresh {
    Same,
    /// Altered: a new definition.
    Changed,
    /// Dropped (or, for a source, the view stopped reading).
    Gone,
}

/// Where a connector delivers the records it reads.
#[derive(Clone)]
pub(crate) enum Feed {
    /// Into a table: appended to its log together with the source positions.
    Table(Arc<Table>),
    /// To the one view a source's reader reads for (nothing is stored).
    Reader(Arc<Source>, Arc<SourceReader>),
}

impl Feed {
    fn def(&self) -> &TableDef {
        match self {
            Feed::Table(t) => &t.def,
            Feed::Reader(s, _) => &s.def,
        }
    }

    fn schema(&self) -> &SchemaRef {
        match self {
            Feed::Table(t) => &t.schema,
            Feed::Reader(s, _) => &s.schema,
        }
    }

    fn progress(&self) -> &ConnectorProgress {
        match self {
            Feed::Table(t) => &t.progress,
            Feed::Reader(_, r) => &r.progress,
        }
    }

    fn decoder(&self) -> Result<RecordDecoder> {
        self.def().decoder(self.schema(), false)
    }

    fn name(&self) -> &str {
        &self.def().name
    }

    /// A view's reader has read everything `partition` held when it started (`None`: it
    /// cannot read the source now; the view is not waited for).
    fn reached_end(&self, partition: Option<u32>) {
        if let Feed::Reader(_, reader) = self {
            reader.reached_end(partition);
        }
    }

    /// Keeps the feed on the object as it is now (an ALTER replaces its definition).
    fn refresh(&mut self, engine: &Engine) -> Refresh {
        match self {
            Feed::Table(table) => match engine.table_by_id(table.def.id) {
                None => Refresh::Gone,
                Some(now) if !Arc::ptr_eq(&now, table) => {
                    *table = now;
                    Refresh::Changed
                }
                Some(_) => Refresh::Same,
            },
            Feed::Reader(source, reader) => match engine.source_by_id(source.def.id) {
                _ if reader.stopped() => Refresh::Gone,
                None => Refresh::Gone,
                Some(now) if !Arc::ptr_eq(&now, source) => {
                    *source = now;
                    Refresh::Changed
                }
                Some(_) => Refresh::Same,
            },
        }
    }

    /// [`Feed::refresh`] for a connector that decodes: a new definition brings a new decoder.
    fn follow_changes(&mut self, engine: &Engine, decoder: &mut RecordDecoder) -> Result<Refresh> {
        let refresh = self.refresh(engine);
        if let Refresh::Changed = refresh {
            *decoder = self.decoder()?;
        }
        Ok(refresh)
    }

    fn alive(&self, engine: &Engine) -> bool {
        match self {
            Feed::Table(t) => engine.table_by_id(t.def.id).is_some(),
            Feed::Reader(s, r) => !r.stopped() && engine.source_by_id(s.def.id).is_some(),
        }
    }
}

/// How a chunk of records went.
#[derive(Debug, Default)]
pub struct IngestReport {
    /// Records whose rows were applied.
    pub accepted: usize,
    /// Records set aside: (index in the chunk, why).
    pub rejected: Vec<(usize, String)>,
}

/// How often a connector looks for new records when there were none.
const POLL_INTERVAL: Duration = Duration::from_millis(50);

impl Engine {
    /// Commits the rows decoded from `records` into `table` with `positions`; see the module
    /// doc. `partition` pins an append-only table's write to that log partition (modulo the
    /// table's partitions), so that a source partition's order is kept.
    pub(crate) async fn ingest_records(
        &self,
        table: &Arc<Table>,
        decoded: Decoded,
        records: &[RawRecord<'_>],
        positions: &[(u32, u64)],
        on_error: OnError,
        partition: Option<u32>,
    ) -> Result<IngestReport> {
        let guard = self.lock_writes().await;
        // The table as it is now (ALTER TABLE replaces its definition).
        let table = &self.table_by_id(table.def.id).ok_or_else(|| {
            Error::new(
                SqlState::UNDEFINED_TABLE,
                format!("table \"{}\" was dropped", table.def.name),
            )
        })?;
        if decoded.rows.num_columns() != table.schema.fields().len() {
            // ALTER TABLE changed the columns after this chunk was decoded: the caller reads
            // it again with the new definition.
            return Err(Error::new(
                SqlState::SERIALIZATION_FAILURE,
                format!(
                    "table \"{}\" was altered while records were decoded",
                    table.def.name
                ),
            ));
        }
        let (changes, conflicts) = table.read().resolve(&decoded.rows, &decoded.kinds)?;
        let mut rejected = decoded.rejected;
        rejected.extend(
            conflicts
                .into_iter()
                .map(|(row, why)| (decoded.origins[row], why)),
        );
        rejected.sort_by_key(|r| r.0);
        rejected.dedup_by_key(|r| r.0);
        self.set_aside(&table.def, records, &rejected, on_error)?;
        let accepted = records.len() - rejected.len();
        self.commit(
            guard,
            vec![(Arc::clone(table), vec![changes])],
            positions,
            partition,
        )
        .await?;
        Ok(IngestReport { accepted, rejected })
    }

    /// Deals with the records of a chunk that were set aside (index in `records`, why) as
    /// `on_error` says: an error for the whole chunk, nothing, or dead letters stored durably.
    pub(crate) fn set_aside(
        &self,
        def: &TableDef,
        records: &[RawRecord<'_>],
        rejected: &[(usize, String)],
        on_error: OnError,
    ) -> Result<()> {
        if rejected.is_empty() {
            return Ok(());
        }
        match on_error {
            OnError::Fail => {
                let (i, why) = &rejected[0];
                Err(Error::new(SqlState::DATA_EXCEPTION, format!("record {} of \"{}\": {why}", i + 1, def.name))
                    .with_hint("on_error = 'fail' is set; with 'dead_letter' bad records go to eddy_dead_letters and the others are kept"))
            }
            OnError::Skip => Ok(()),
            OnError::DeadLetter => {
                let received_at_micros = self.clock.now_micros();
                let letters: Vec<DeadLetter> = rejected
                    .iter()
                    .map(|(i, why)| DeadLetter {
                        object: def.id,
                        partition: records[*i].partition,
                        offset: records[*i].offset,
                        key: records[*i].key.map(<[u8]>::to_vec),
                        raw: records[*i].value.map(<[u8]>::to_vec),
                        error: why.clone(),
                        received_at_micros,
                    })
                    .collect();
                self.meta.put_dead_letters(&letters)
            }
        }
    }

    /// `POST /ingest/<table>`: one record per line (JSON, or CSV when `csv` and the table
    /// declares no format). Answers once the accepted records are durable.
    pub async fn ingest_body(&self, table: &str, body: &[u8], csv: bool) -> Result<IngestReport> {
        self.wait_recovered(None).await;
        // `schema.table`, or a table of `public`.
        let name = match table.split_once('.') {
            Some((schema, name)) => crate::QualifiedName::new(schema, name),
            None => crate::QualifiedName::public(table),
        };
        let table = self.table(&name).ok_or_else(|| {
            Error::new(
                SqlState::UNDEFINED_TABLE,
                format!("table \"{table}\" does not exist"),
            )
        })?;
        let decoder = table.def.decoder(&table.schema, csv)?;
        let (lines, joined) = eddy_connectors::file::split_lines(body);
        let records: Vec<RawRecord<'_>> = lines
            .into_iter()
            .map(|line| RawRecord {
                value: Some(&body[line]),
                ..RawRecord::default()
            })
            .collect();
        self.ingest_records(
            &table,
            decoder.decode_joined(&records, joined.then_some(body))?,
            &records,
            &[],
            table.def.on_error(),
            None,
        )
        .await
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
        let records = letter_records(&letters);
        // Failures are kept as they are (their letters stay), not stored again.
        let report = self
            .ingest_records(
                table,
                decoder.decode(&records)?,
                &records,
                &[],
                OnError::Skip,
                None,
            )
            .await?;
        self.settle_replayed(&letters, &report.rejected)
    }

    /// Removes the letters that a replay applied and records the new error of the others.
    /// Returns (replayed, left).
    pub(crate) fn settle_replayed(
        &self,
        letters: &[(eddy_storage::meta::DeadLetterKey, DeadLetter)],
        rejected: &[(usize, String)],
    ) -> Result<(usize, usize)> {
        let failed: std::collections::HashMap<usize, &String> =
            rejected.iter().map(|(i, why)| (*i, why)).collect();
        let done: Vec<_> = letters
            .iter()
            .enumerate()
            .filter(|(i, _)| !failed.contains_key(i))
            .map(|(_, (key, _))| key.clone())
            .collect();
        let updated: Vec<DeadLetter> = letters
            .iter()
            .enumerate()
            .filter_map(|(i, (_, l))| {
                failed.get(&i).map(|why| DeadLetter {
                    error: (*why).clone(),
                    ..l.clone()
                })
            })
            .filter(|l| l.offset.is_some())
            .collect();
        self.meta.delete_dead_letters(&done)?;
        self.meta.put_dead_letters(&updated)?;
        Ok((done.len(), failed.len()))
    }

    /// Every stored dead letter.
    pub(crate) fn dead_letters(&self) -> Result<Vec<DeadLetter>> {
        Ok(self
            .meta
            .dead_letters(None)?
            .into_iter()
            .map(|(_, l)| l)
            .collect())
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
    pub(crate) async fn start_connector(
        self: &Arc<Self>,
        table: &Arc<Table>,
        validate: bool,
    ) -> Result<()> {
        if table.def.option("connector").is_none() {
            return Ok(());
        }
        if table.progress.known().is_empty() {
            // Where "latest" (or a timestamp) was when the table was created is recorded at
            // once, so a restart does not move it.
            match self.start_positions(&table.def, validate).await {
                Ok(positions) => self.record_positions(table, &positions).await?,
                Err(e) if validate => return Err(e),
                Err(e) => {
                    tracing::warn!(table = %table.def.name, error = %e, "the connector's source cannot be reached; retrying")
                }
            }
        }
        self.follow(Feed::Table(Arc::clone(table)));
        Ok(())
    }

    /// Where each source partition of a connector starts, unless it is the earliest record:
    /// the end of the file or topic for `latest`, the first record at the time for
    /// `timestamp`. With `validate` a Kafka topic must be reachable (CREATE).
    pub(crate) async fn start_positions(
        &self,
        def: &TableDef,
        validate: bool,
    ) -> Result<Vec<(u32, u64)>> {
        match def.option("connector") {
            Some("file") => {
                let path = def.option("path").unwrap_or_default();
                Ok(match def.option("scan.startup.mode") {
                    Some("latest") => vec![(0, std::fs::metadata(path).map_or(0, |m| m.len()))],
                    _ => Vec::new(),
                })
            }
            Some("kafka") => {
                let spec = KafkaSpec::of(def)?;
                if !validate && spec.startup == Startup::Earliest {
                    return Ok(Vec::new());
                }
                let topic = KafkaTopic::connect(&spec.bootstrap, &spec.topic).await?;
                let mut positions = Vec::new();
                for p in topic.partitions().await? {
                    if spec.startup != Startup::Earliest {
                        positions.push((p, topic.reader(p).await?.offset_at(spec.startup).await?));
                    }
                }
                Ok(positions)
            }
            Some("nexmark") => Ok(Vec::new()),
            Some(other) => Err(Error::unsupported(format!(
                "connector '{other}' is not supported"
            ))),
            None => Ok(Vec::new()),
        }
    }

    /// Commits source positions alone (where a connector starts, before any record).
    async fn record_positions(&self, table: &Arc<Table>, positions: &[(u32, u64)]) -> Result<()> {
        if positions.is_empty() {
            return Ok(());
        }
        let guard = self.lock_writes().await;
        self.commit(
            guard,
            vec![(Arc::clone(table), Vec::new())],
            positions,
            None,
        )
        .await
    }

    /// Runs the connector of `feed` in the background until its object is dropped.
    pub(crate) fn follow(self: &Arc<Self>, feed: Feed) {
        let engine = Arc::clone(self);
        tokio::spawn(async move {
            let name = feed.name().to_owned();
            let result = match feed.def().option("connector") {
                Some("file") => engine.follow_file(feed.clone()).await,
                Some("kafka") => {
                    engine.follow_kafka(feed.clone()).await;
                    Ok(())
                }
                Some("nexmark") => engine.follow_nexmark(feed.clone()).await,
                _ => Ok(()),
            };
            if let Err(e) = result {
                tracing::error!(object = %name, error = %e, "the connector stopped");
                feed.reached_end(None);
            }
        });
    }

    /// Hands a chunk's rows (decoded from `records`) to the feed's destination; counts what
    /// `on_error = 'skip'` dropped. `pin` keeps a source partition's records in one log
    /// partition.
    async fn deliver(
        &self,
        feed: &Feed,
        decoded: Decoded,
        records: &[RawRecord<'_>],
        positions: &[(u32, u64)],
        partition: u32,
        pin: Option<u32>,
    ) -> Result<()> {
        let on_error = feed.def().on_error();
        let report = match feed {
            Feed::Table(table) => {
                self.ingest_records(table, decoded, records, positions, on_error, pin)
                    .await?
            }
            Feed::Reader(source, reader) => {
                self.read_into_view(source, reader, decoded, records, positions, on_error)
                    .await?
            }
        };
        if on_error == OnError::Skip && !report.rejected.is_empty() {
            tracing::debug!(object = %feed.name(), skipped = report.rejected.len(), "skipping undecodable records");
            feed.progress().skip(partition, report.rejected.len());
        }
        Ok(())
    }

    /// The Kafka connector: one reader per partition, reconnecting after a broker failure,
    /// until the feed's object is dropped or a record fails under `on_error = 'fail'`.
    async fn follow_kafka(self: Arc<Self>, feed: Feed) {
        let name = feed.name().to_owned();
        loop {
            let result = async {
                let spec = KafkaSpec::of(feed.def())?;
                let topic = Arc::new(KafkaTopic::connect(&spec.bootstrap, &spec.topic).await?);
                let partitions = topic.partitions().await?;
                if let Feed::Reader(_, reader) = &feed {
                    reader.set_partitions(partitions.len());
                }
                tracing::info!(object = %name, topic = spec.topic, partitions = partitions.len(), "reading a Kafka topic");
                let mut readers = tokio::task::JoinSet::new();
                for p in partitions {
                    let (engine, feed, topic) = (Arc::clone(&self), feed.clone(), Arc::clone(&topic));
                    readers.spawn(async move { engine.follow_kafka_partition(feed, &topic, p).await });
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
                    tracing::error!(object = %name, error = %e, "the Kafka connector stopped (on_error = 'fail')");
                    feed.reached_end(None);
                    return;
                }
                Err(e) => {
                    tracing::warn!(object = %name, error = %e, "the Kafka connector failed; retrying in 1 s");
                    feed.reached_end(None);
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    if !feed.alive(&self) {
                        return;
                    }
                }
            }
        }
    }

    async fn follow_kafka_partition(
        &self,
        mut feed: Feed,
        topic: &KafkaTopic,
        partition: u32,
    ) -> Result<()> {
        let reader = topic.reader(partition).await?;
        let mut offset = match feed.progress().next(partition) {
            Some(offset) => offset,
            // A partition without a recorded start begins at its earliest retained record.
            None => reader.offset_at(Startup::Earliest).await?,
        };
        let mut decoder = feed.decoder()?;
        let pin = matches!(feed, Feed::Table(_)).then_some(partition);
        loop {
            if let Refresh::Gone = feed.follow_changes(self, &mut decoder)? {
                return Ok(());
            }
            let (records, high) = reader
                .fetch(offset, CONNECTOR_CHUNK_BYTES as i32, KAFKA_WAIT)
                .await?;
            feed.progress().set_end(partition, high);
            let Some(last) = records.last() else {
                feed.reached_end(Some(partition));
                continue;
            };
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
            self.deliver(
                &feed,
                decoder.decode(&raw)?,
                &raw,
                &[(partition, next)],
                partition,
                pin,
            )
            .await?;
            offset = next;
            if next >= high {
                feed.reached_end(Some(partition));
            }
        }
    }
}

impl Engine {
    /// The Nexmark generator: one task per split, each generating its share of the event ids
    /// from where the feed got to, until a finite run ends or the object is dropped.
    async fn follow_nexmark(self: &Arc<Self>, feed: Feed) -> Result<()> {
        let Some(config) = feed.def().nexmark()? else {
            return Ok(());
        };
        if let Feed::Reader(_, reader) = &feed {
            // The stream's watermark is the least over the splits.
            reader.set_partitions(config.splits as usize);
        }
        // A generator has no backlog that a new view would wait for.
        feed.reached_end(None);
        let mut splits = tokio::task::JoinSet::new();
        for split in 0..config.splits {
            let (engine, feed) = (Arc::clone(self), feed.clone());
            splits.spawn(async move { engine.follow_nexmark_split(feed, split).await });
        }
        while let Some(done) = splits.join_next().await {
            done.map_err(|e| Error::internal(format!("nexmark generator: {e}")))??;
        }
        Ok(())
    }

    /// One split of the generator: chunks of [`NEXMARK_CHUNK_EVENTS`] event ids, paced by
    /// `nexmark.events.per.second` (shared by the splits) when it is set.
    async fn follow_nexmark_split(&self, mut feed: Feed, split: u32) -> Result<()> {
        let generator = |feed: &Feed| -> Result<NexmarkGenerator> {
            let config = feed
                .def()
                .nexmark()?
                .ok_or_else(|| Error::internal("not a nexmark connector"))?;
            NexmarkGenerator::new(config, Arc::clone(feed.schema()), split)
        };
        let mut nexmark = generator(&feed)?;
        let splits = feed.def().nexmark()?.map_or(1, |c| c.splits);
        let per_split_rate = feed.def().nexmark_rate_limit() as f64 / f64::from(splits);
        let mut position = feed.progress().next(split).unwrap_or(0);
        let (started, first) = (tokio::time::Instant::now(), position);
        // Paced: a millisecond's worth of events at a time, so that no event is generated
        // much before its time.
        let chunk = if per_split_rate > 0.0 {
            ((per_split_rate / 1000.0) as u64).clamp(1, NEXMARK_CHUNK_EVENTS)
        } else {
            NEXMARK_CHUNK_EVENTS
        };
        let pin = matches!(feed, Feed::Table(_)).then_some(split);
        tracing::info!(object = %feed.name(), split, position, "generating Nexmark events");
        loop {
            match feed.refresh(self) {
                Refresh::Gone => return Ok(()),
                Refresh::Changed => nexmark = generator(&feed)?,
                Refresh::Same => {}
            }
            if nexmark.end().is_some_and(|end| position >= end) {
                feed.progress().set_end(split, position);
                return Ok(());
            }
            if per_split_rate > 0.0 {
                let due =
                    started + Duration::from_secs_f64((position - first) as f64 / per_split_rate);
                tokio::time::sleep_until(due).await;
            }
            let (rows, next) = nexmark.generate(position, chunk)?;
            let n = rows.num_rows();
            let decoded = Decoded {
                rows,
                kinds: vec![eddy_connectors::RowKind::Insert; n],
                origins: (0..n).collect(),
                rejected: Vec::new(),
            };
            self.deliver(&feed, decoded, &[], &[(split, next)], split, pin)
                .await?;
            position = next;
            feed.progress()
                .set_end(split, nexmark.end().unwrap_or(position));
        }
    }
}

/// Dead letters as records to decode again.
pub(crate) fn letter_records(
    letters: &[(eddy_storage::meta::DeadLetterKey, DeadLetter)],
) -> Vec<RawRecord<'_>> {
    letters
        .iter()
        .map(|(_, l)| RawRecord {
            key: l.key.as_deref(),
            value: l.raw.as_deref(),
            partition: l.partition,
            offset: l.offset,
            ..RawRecord::default()
        })
        .collect()
}

/// How long a Kafka fetch waits for the first record.
const KAFKA_WAIT: Duration = Duration::from_millis(500);

/// A Kafka connector's options.
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
                let ms = def
                    .option("scan.startup.timestamp.millis")
                    .unwrap_or_default();
                Startup::Timestamp(ms.parse().map_err(|_| {
                    Error::invalid_parameter(format!(
                        "scan.startup.timestamp.millis must be a number, not '{ms}'"
                    ))
                })?)
            }
        };
        Ok(KafkaSpec {
            bootstrap: def
                .option("properties.bootstrap.server")
                .unwrap_or_default()
                .to_owned(),
            topic: def.option("topic").unwrap_or_default().to_owned(),
            startup,
        })
    }
}
