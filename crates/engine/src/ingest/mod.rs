//! Records from outside: HTTP ingest bodies, connector chunks and replayed dead letters into
//! a table all pass through [`Engine::ingest_records`]; the connectors (a followed file, a
//! Kafka topic, the Nexmark generator) feed a table or, for a source, the views reading it
//! together ([`Feed`], `cursor.rs`).
//!
//! The path into a table: decode the chunk (bad records are set aside with their reason),
//! resolve what each row does to the table's contents under the write lock (a duplicate key or
//! a delete of a row the table does not hold is set aside too), deal with the set-aside
//! records as the table's `on_error` says — dead letters are stored durably *before* the rows
//! around them are acknowledged — and commit the rows together with the connector's source
//! positions. Into a source's cursor: decoded once, then the same for each member view, against
//! its own copy of a keyed source's rows (see `source.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use arrow::datatypes::SchemaRef;
use eddy_common::limits::CURSOR_MERGE_CHUNKS;
use eddy_common::{Error, Result, SqlState};
use eddy_connectors::kafka::{KafkaTopic, Startup};
use eddy_connectors::{Decoded, RawRecord, RecordDecoder};
use eddy_storage::meta::DeadLetter;

mod cursor;
mod file;
mod kafka;
mod nexmark;

pub(crate) use cursor::{Cursor, Cursors, Merging};
use kafka::KafkaSpec;
pub(crate) use kafka::kafka_starts;

use crate::catalog::{OnError, TableDef};
use crate::source::Source;
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
    /// For a view reading a source: the cursor it reads the partition with (views with the
    /// same one read it together).
    pub reader: Option<u64>,
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

    pub(crate) fn set_reader(&self, partition: u32, cursor: u64) {
        self.lock().entry(partition).or_default().reader = Some(cursor);
    }

    pub(crate) fn skip(&self, partition: u32, records: usize) {
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
    /// Dropped (or, for a source, every view reading with the cursor stopped, or they read
    /// on with another cursor).
    Gone,
}

/// Where a connector delivers the records it reads.
#[derive(Clone)]
pub(crate) enum Feed {
    /// Into a table: appended to its log together with the source positions.
    Table(Arc<Table>),
    /// To the views reading a source partition together (nothing is stored).
    Cursor(Arc<Source>, Arc<Cursor>),
}

impl Feed {
    fn def(&self) -> &TableDef {
        match self {
            Feed::Table(t) => &t.def,
            Feed::Cursor(s, _) => &s.def,
        }
    }

    fn schema(&self) -> &SchemaRef {
        match self {
            Feed::Table(t) => &t.schema,
            Feed::Cursor(s, _) => &s.schema,
        }
    }

    /// Where reading `partition` goes on: the table's recorded source position, or the
    /// cursor's.
    fn position(&self, partition: u32) -> Option<u64> {
        match self {
            Feed::Table(t) => t.progress.next(partition),
            Feed::Cursor(_, c) => Some(c.next()),
        }
    }

    /// Where the source partition ends, as just seen.
    fn set_end(&self, partition: u32, end: u64) {
        match self {
            Feed::Table(t) => t.progress.set_end(partition, end),
            Feed::Cursor(_, c) => {
                for m in c.members() {
                    m.progress.set_end(partition, end);
                }
            }
        }
    }

    /// A cursor near one ahead of it starts merging into it (see `cursor.rs`); `chunk`: the
    /// connector's chunk in its positions, the reach being [`CURSOR_MERGE_CHUNKS`] of them.
    fn merging(&self, merging: &mut Option<Merging>, chunk: u64) {
        if let (Feed::Cursor(source, cursor), None) = (self, &merging) {
            *merging = source.cursors.merging(cursor, chunk * CURSOR_MERGE_CHUNKS);
        }
    }

    /// After a read that took the cursor to `position`: when it reached the cursor it merges
    /// into, its members join that one and `true` says its task ends. Past it, the merge is
    /// given up.
    async fn merged(&self, merging: &mut Option<Merging>, position: u64) -> bool {
        let Feed::Cursor(source, cursor) = self else {
            return false;
        };
        match merging.take() {
            Some(m) if position >= m.at() => source.cursors.merge(cursor, m, position).await,
            other => {
                *merging = other;
                false
            }
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
        if let Feed::Cursor(_, cursor) = self {
            for reader in cursor.members() {
                reader.reached_end(partition);
            }
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
            Feed::Cursor(source, cursor) => match engine.source_by_id(source.def.id) {
                _ if cursor.abandoned(&source.cursors) => Refresh::Gone,
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
            Feed::Cursor(s, c) => {
                !c.abandoned(&s.cursors) && engine.source_by_id(s.def.id).is_some()
            }
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
        let (changes, conflicts) = table.write().resolve(&decoded.rows, &decoded.kinds)?;
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
                for p in kafka::partitions(&topic).await? {
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

    /// Runs the connector of `feed` in the background until its object is dropped (or, for a
    /// cursor, until it retires).
    pub(crate) fn follow(self: &Arc<Self>, feed: Feed) {
        let engine = Arc::clone(self);
        tokio::spawn(async move {
            let name = feed.name().to_owned();
            let cursor = match &feed {
                Feed::Table(_) => None,
                Feed::Cursor(_, c) => Some(c.partition),
            };
            let result = match (feed.def().option("connector"), cursor) {
                (Some("file"), _) => engine.follow_file(feed.clone()).await,
                (Some("kafka"), None) => {
                    engine.follow_kafka(feed.clone()).await;
                    Ok(())
                }
                (Some("kafka"), Some(partition)) => {
                    engine.follow_kafka_cursor(feed.clone(), partition).await;
                    Ok(())
                }
                (Some("nexmark"), None) => engine.follow_nexmark(feed.clone()).await,
                (Some("nexmark"), Some(split)) => {
                    engine.follow_nexmark_split(feed.clone(), split).await
                }
                _ => Ok(()),
            };
            if let Err(e) = result {
                tracing::error!(object = %name, error = %e, "the connector stopped");
                feed.reached_end(None);
            }
        });
    }

    /// Hands a chunk's rows (decoded from `records`, all of one source partition) to the
    /// feed's destination; counts what `on_error = 'skip'` dropped. `pin` keeps a source
    /// partition's records in one log partition. `merging`: the feed's cursor is merging into
    /// another, and waits for none of its members.
    async fn deliver(
        self: &Arc<Self>,
        feed: &Feed,
        decoded: Decoded,
        records: &[RawRecord<'_>],
        positions: &[(u32, u64)],
        pin: Option<u32>,
        merging: bool,
    ) -> Result<()> {
        match feed {
            Feed::Table(table) => {
                let on_error = table.def.on_error();
                let report = self
                    .ingest_records(table, decoded, records, positions, on_error, pin)
                    .await?;
                if on_error == OnError::Skip && !report.rejected.is_empty() {
                    tracing::debug!(object = %feed.name(), skipped = report.rejected.len(), "skipping undecodable records");
                    let partition = positions.first().map_or(0, |(p, _)| *p);
                    table.progress.skip(partition, report.rejected.len());
                }
                Ok(())
            }
            Feed::Cursor(source, cursor) => {
                self.deliver_to_members(source, cursor, decoded, records, positions, merging)
                    .await
            }
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
