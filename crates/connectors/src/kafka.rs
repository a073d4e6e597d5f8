//! The `'kafka'` connector: reads every partition of a topic at offsets Eddy keeps (in its own
//! log, with the rows), never through consumer-group commits.
//!
//! Entry points: [`KafkaTopic::connect`], then a [`PartitionReader`] per partition whose
//! [`PartitionReader::fetch`] returns records from an offset with the partition's high
//! watermark. rskafka speaks the protocol in pure Rust (ADR 0005).

use std::time::Duration;

use eddy_common::{Error, Result, SqlState};
use rskafka::client::partition::{OffsetAt, PartitionClient, UnknownTopicHandling};
use rskafka::client::{Client, ClientBuilder};

/// Where a partition is read from when Eddy has no recorded offset for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Startup {
    Earliest,
    Latest,
    /// The first record at or after this time (ms since the epoch).
    Timestamp(i64),
}

/// One record of a partition.
#[derive(Debug, Clone)]
pub struct KafkaRecord {
    pub offset: u64,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub timestamp_micros: i64,
}

pub(crate) fn kafka_error(context: &str, err: impl std::fmt::Display) -> Error {
    Error::new(
        SqlState::CONNECTION_EXCEPTION,
        format!("kafka: {context}: {err}"),
    )
}

pub struct KafkaTopic {
    client: Client,
    topic: String,
}

impl KafkaTopic {
    /// Connects to the brokers listed in `bootstrap` (comma-separated `host:port`).
    pub async fn connect(bootstrap: &str, topic: &str) -> Result<KafkaTopic> {
        let brokers: Vec<String> = bootstrap
            .split(',')
            .map(|b| b.trim().to_owned())
            .filter(|b| !b.is_empty())
            .collect();
        let backoff = rskafka::BackoffConfig {
            deadline: Some(Duration::from_secs(10)),
            ..Default::default()
        };
        let client = tokio::time::timeout(
            Duration::from_secs(10),
            ClientBuilder::new(brokers)
                .client_id("eddy")
                .backoff_config(backoff)
                .build(),
        )
        .await
        .map_err(|_| {
            kafka_error(
                &format!("connecting to {bootstrap}"),
                "timed out after 10 s",
            )
        })?
        .map_err(|e| kafka_error(&format!("connecting to {bootstrap}"), e))?;
        Ok(KafkaTopic {
            client,
            topic: topic.to_owned(),
        })
    }

    /// The topic's partitions; an error when the topic does not exist.
    pub async fn partitions(&self) -> Result<Vec<u32>> {
        let topics = self
            .client
            .list_topics()
            .await
            .map_err(|e| kafka_error("listing topics", e))?;
        let topic = topics
            .into_iter()
            .find(|t| t.name == self.topic)
            .ok_or_else(|| {
                Error::new(
                    SqlState::UNDEFINED_OBJECT,
                    format!("kafka topic \"{}\" does not exist", self.topic),
                )
            })?;
        Ok(topic
            .partitions
            .into_iter()
            .filter_map(|p| u32::try_from(p).ok())
            .collect())
    }

    pub async fn reader(&self, partition: u32) -> Result<PartitionReader> {
        Ok(PartitionReader {
            client: self.partition_client(partition).await?,
            partition,
        })
    }

    /// A client for one partition (to produce to it; the sink's part).
    pub(crate) async fn partition_client(&self, partition: u32) -> Result<PartitionClient> {
        self.client
            .partition_client(
                self.topic.clone(),
                partition as i32,
                UnknownTopicHandling::Error,
            )
            .await
            .map_err(|e| kafka_error(&format!("partition {partition} of {}", self.topic), e))
    }

    pub fn topic(&self) -> &str {
        &self.topic
    }
}

pub struct PartitionReader {
    client: PartitionClient,
    partition: u32,
}

impl PartitionReader {
    pub fn partition(&self) -> u32 {
        self.partition
    }

    /// The offset reading starts at under `startup`.
    pub async fn offset_at(&self, startup: Startup) -> Result<u64> {
        let at = match startup {
            Startup::Earliest => OffsetAt::Earliest,
            Startup::Latest => OffsetAt::Latest,
            Startup::Timestamp(ms) => {
                OffsetAt::Timestamp(chrono::DateTime::from_timestamp_millis(ms).ok_or_else(
                    || Error::invalid_parameter(format!("timestamp {ms} ms is out of range")),
                )?)
            }
        };
        let offset = self
            .client
            .get_offset(at)
            .await
            .map_err(|e| kafka_error("looking up an offset", e))?;
        Ok(offset.max(0) as u64)
    }

    /// Records from `offset` (up to about `max_bytes`, waiting up to `max_wait` for the first)
    /// and the partition's high watermark (the offset after its last record).
    pub async fn fetch(
        &self,
        offset: u64,
        max_bytes: i32,
        max_wait: Duration,
    ) -> Result<(Vec<KafkaRecord>, u64)> {
        let (records, high) = self
            .client
            .fetch_records(
                offset as i64,
                1..max_bytes.max(2),
                max_wait.as_millis() as i32,
            )
            .await
            .map_err(|e| {
                kafka_error(
                    &format!("fetching partition {} from offset {offset}", self.partition),
                    e,
                )
            })?;
        let records = records
            .into_iter()
            // A fetch may start at the batch holding `offset`: skip what lies before it.
            .filter(|r| r.offset >= offset as i64)
            .map(|r| KafkaRecord {
                offset: r.offset as u64,
                key: r.record.key,
                value: r.record.value,
                timestamp_micros: r.record.timestamp.timestamp_micros(),
            })
            .collect();
        Ok((records, high.max(0) as u64))
    }
}
