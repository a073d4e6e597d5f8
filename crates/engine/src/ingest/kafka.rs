//! The Kafka connector's loops: one per topic partition, into a table or a source's cursor.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use eddy_common::limits::{
    CONNECTOR_CHUNK_BYTES, CURSOR_MERGE_RECORDS, KAFKA_PARTITION_DISCOVERY_MS,
};
use eddy_common::{Error, ObjectId, Result, SqlState};
use eddy_connectors::RawRecord;
use eddy_connectors::kafka::{KafkaTopic, Startup};

use super::{Feed, Merging, Refresh};
use crate::Engine;
use crate::catalog::TableDef;
use crate::source::SourceReader;

impl Engine {
    /// The Kafka connector of a table: one reader per partition, reconnecting after a broker
    /// failure, until the table is dropped or a record fails under `on_error = 'fail'`.
    pub(super) async fn follow_kafka(self: Arc<Self>, feed: Feed) {
        let name = feed.name().to_owned();
        loop {
            let result = async {
                let spec = KafkaSpec::of(feed.def())?;
                let topic = Arc::new(KafkaTopic::connect(&spec.bootstrap, &spec.topic).await?);
                let mut found = partitions(&topic).await?;
                tracing::info!(object = %name, topic = spec.topic, partitions = found.len(), "reading a Kafka topic");
                let mut readers = tokio::task::JoinSet::new();
                let mut known = BTreeSet::new();
                let mut discovery = tokio::time::interval(PARTITION_DISCOVERY);
                discovery.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    for p in found.drain(..).filter(|p| known.insert(*p)) {
                        let (engine, feed, topic) =
                            (Arc::clone(&self), feed.clone(), Arc::clone(&topic));
                        readers.spawn(async move { engine.follow_kafka_partition(feed, &topic, p).await });
                    }
                    tokio::select! {
                        done = readers.join_next() => match done {
                            Some(done) => done.map_err(|e| Error::internal(format!("kafka reader: {e}")))??,
                            None => return Ok(()),
                        },
                        _ = discovery.tick() => {
                            // Partitions added to the topic meanwhile, read from their start.
                            if !feed.alive(&self) {
                                return Ok(());
                            }
                            found = partitions(&topic).await?;
                            if found.iter().any(|p| !known.contains(p)) {
                                tracing::info!(object = %name, topic = spec.topic, partitions = found.len(), "the Kafka topic has new partitions");
                            }
                        }
                    }
                }
            }
            .await;
            if !self.again_after(&feed, result).await {
                return;
            }
        }
    }

    /// Partitions added to a source's topic while `reader`'s view reads it (`known`: those it
    /// reads already): asked for every [`PARTITION_DISCOVERY`], each new one is read by a
    /// cursor of its own from its earliest record (the cursors of several views at one place
    /// merge), until the view stops reading or the source is dropped. A topic that cannot be
    /// reached is asked again next time.
    pub(crate) async fn discover_kafka_partitions(
        self: Arc<Self>,
        source: ObjectId,
        reader: Arc<SourceReader>,
        mut known: BTreeSet<u32>,
    ) {
        let mut topic = None;
        loop {
            tokio::time::sleep(PARTITION_DISCOVERY).await;
            let Some(current) = self.source_by_id(source) else {
                return;
            };
            if reader.stopped() {
                return;
            }
            let listed = async {
                if topic.is_none() {
                    let spec = KafkaSpec::of(&current.def)?;
                    topic = Some(KafkaTopic::connect(&spec.bootstrap, &spec.topic).await?);
                }
                match &topic {
                    Some(t) => partitions(t).await,
                    None => Ok(Vec::new()),
                }
            }
            .await;
            let new: Vec<u32> = match listed {
                Ok(partitions) => partitions
                    .into_iter()
                    .filter(|p| !known.contains(p))
                    .collect(),
                Err(e) => {
                    tracing::debug!(source = %current.def.name, error = %e, "listing the Kafka topic's partitions failed");
                    topic = None;
                    continue;
                }
            };
            for p in new {
                let Some(t) = &topic else { break };
                let start = match reader.progress.next(p) {
                    Some(next) => Ok(next),
                    None => match t.reader(p).await {
                        Ok(r) => r.offset_at(Startup::Earliest).await,
                        Err(e) => Err(e),
                    },
                };
                let Ok(start) = start else {
                    // Asked again next time.
                    continue;
                };
                known.insert(p);
                tracing::info!(source = %current.def.name, view = %reader.view, partition = p, start, "reading a new partition of the Kafka topic");
                let cursor = current.cursors.open(p, start, vec![Arc::clone(&reader)]);
                self.follow(Feed::Cursor(Arc::clone(&current), cursor));
            }
        }
    }

    /// One partition of a Kafka topic for a cursor, reconnecting after a broker failure.
    pub(super) async fn follow_kafka_cursor(self: Arc<Self>, feed: Feed, partition: u32) {
        loop {
            let result = async {
                let spec = KafkaSpec::of(feed.def())?;
                let topic = KafkaTopic::connect(&spec.bootstrap, &spec.topic).await?;
                self.follow_kafka_partition(feed.clone(), &topic, partition)
                    .await
            }
            .await;
            if !self.again_after(&feed, result).await {
                return;
            }
        }
    }

    /// After a Kafka connector's run ended: whether to run it again. It is, a second later,
    /// when it failed (a broker went away) unless on a record under `on_error = 'fail'`, and
    /// while its object is there.
    async fn again_after(&self, feed: &Feed, result: Result<()>) -> bool {
        let name = feed.name();
        match result {
            Ok(()) => false,
            Err(e) if e.state == SqlState::UNDEFINED_TABLE => false,
            Err(e) if e.state.is_data_exception() => {
                tracing::error!(object = %name, error = %e, "the Kafka connector stopped (on_error = 'fail')");
                feed.reached_end(None);
                false
            }
            Err(e) => {
                tracing::warn!(object = %name, error = %e, "the Kafka connector failed; retrying in 1 s");
                feed.reached_end(None);
                tokio::time::sleep(Duration::from_secs(1)).await;
                feed.alive(self)
            }
        }
    }

    pub(super) async fn follow_kafka_partition(
        self: &Arc<Self>,
        mut feed: Feed,
        topic: &KafkaTopic,
        partition: u32,
    ) -> Result<()> {
        let reader = topic.reader(partition).await?;
        let mut offset = match feed.position(partition) {
            Some(offset) => offset,
            // A partition without a recorded start begins at its earliest retained record.
            None => reader.offset_at(Startup::Earliest).await?,
        };
        let mut decoder = feed.decoder()?;
        let pin = matches!(feed, Feed::Table(_)).then_some(partition);
        let mut merging = None;
        loop {
            if let Refresh::Gone = feed.follow_changes(self, &mut decoder)? {
                return Ok(());
            }
            feed.merging(&mut merging, CURSOR_MERGE_RECORDS);
            if feed.merged(&mut merging, offset).await {
                return Ok(());
            }
            let (mut records, high) = reader
                .fetch(offset, CONNECTOR_CHUNK_BYTES as i32, KAFKA_WAIT)
                .await?;
            feed.set_end(partition, high);
            if let Some(cap) = merging.as_ref().map(Merging::at) {
                // Nothing past the cursor being merged into: it hands that over.
                if let Some(past) = records.iter().position(|r| r.offset >= cap) {
                    records.truncate(past);
                    if records.is_empty() {
                        // Nothing left before it (the topic was compacted there).
                        offset = cap;
                        continue;
                    }
                }
            }
            let Some(last) = records.last() else {
                // Nothing to read up to the cursor ahead now: no merge.
                merging = None;
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
                pin,
                merging.is_some(),
            )
            .await?;
            offset = next;
            if next >= high {
                feed.reached_end(Some(partition));
            }
        }
    }
}

/// Each partition of a source's Kafka topic, and where reading it starts: `from` it, or its
/// earliest retained record.
pub(crate) async fn kafka_starts(
    def: &TableDef,
    from: impl Fn(u32) -> Option<u64>,
) -> Result<Vec<(u32, u64)>> {
    let spec = KafkaSpec::of(def)?;
    let topic = KafkaTopic::connect(&spec.bootstrap, &spec.topic).await?;
    let mut starts = Vec::new();
    for p in partitions(&topic).await? {
        let start = match from(p) {
            Some(next) => next,
            None => topic.reader(p).await?.offset_at(Startup::Earliest).await?,
        };
        starts.push((p, start));
    }
    Ok(starts)
}

/// The topic's partitions (the `kafka_partitions:topic:hide` failpoint shows only the first).
pub(super) async fn partitions(topic: &KafkaTopic) -> Result<Vec<u32>> {
    let mut partitions = topic.partitions().await?;
    if crate::failpoints::hidden("kafka_partitions", topic.topic()) {
        partitions.sort_unstable();
        partitions.truncate(1);
    }
    Ok(partitions)
}

/// How often a Kafka topic being read is asked for partitions added to it.
const PARTITION_DISCOVERY: Duration = Duration::from_millis(KAFKA_PARTITION_DISCOVERY_MS);

/// How long a Kafka fetch waits for the first record.
const KAFKA_WAIT: Duration = Duration::from_millis(500);

/// A Kafka connector's options.
pub(super) struct KafkaSpec {
    pub(super) bootstrap: String,
    pub(super) topic: String,
    pub(super) startup: Startup,
}

impl KafkaSpec {
    pub(super) fn of(def: &crate::catalog::TableDef) -> Result<KafkaSpec> {
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
