//! A real Kafka-compatible broker for tests: Tansu (an Apache Kafka compatible broker from
//! crates.io, installed by `bin/test`), started on 127.0.0.1 and a free port with in-memory
//! storage, and a small producer and reader over rskafka.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use rskafka::client::partition::{Compression, UnknownTopicHandling};
use rskafka::client::{Client, ClientBuilder};
use rskafka::record::Record;

/// A record to produce: key and value, each optional (a missing value is a tombstone).
pub type KeyValue<'a> = (Option<&'a [u8]>, Option<&'a [u8]>);

/// A running broker, killed when dropped.
pub struct KafkaBroker {
    child: Child,
    pub port: u16,
    client: Client,
}

/// Where the broker binary is: `$EDDY_TANSU`, `tansu` on the PATH, or cargo's bin directory.
fn tansu() -> Result<PathBuf> {
    if let Ok(path) = std::env::var("EDDY_TANSU") {
        return Ok(PathBuf::from(path));
    }
    let mut candidates: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).map(|d| d.join("tansu")).collect())
        .unwrap_or_default();
    if let Some(home) = std::env::var_os("CARGO_HOME").or_else(|| {
        std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo").into_os_string())
    }) {
        candidates.push(PathBuf::from(home).join("bin/tansu"));
    }
    candidates.into_iter().find(|p| p.is_file()).context("the Kafka-compatible broker `tansu` is not installed: run bin/test (it installs it), or `cargo install tansu --locked`")
}

impl KafkaBroker {
    /// Starts a broker and waits until it answers.
    pub async fn start() -> Result<KafkaBroker> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let url = format!("tcp://127.0.0.1:{port}");
        let child = Command::new(tansu()?)
            .args([
                "broker",
                "--listener-url",
                &url,
                "--advertised-listener-url",
                &url,
                "--storage-engine",
                "memory://tansu/",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting tansu")?;
        let mut broker_child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        let client = loop {
            let attempt = tokio::time::timeout(
                Duration::from_secs(5),
                ClientBuilder::new(vec![format!("127.0.0.1:{port}")]).build(),
            )
            .await;
            if let Ok(Ok(client)) = attempt
                && client.list_topics().await.is_ok()
            {
                break client;
            }
            if Instant::now() > deadline {
                if let Some(mut c) = broker_child.take() {
                    let _ = c.kill();
                }
                bail!("the Kafka broker did not answer on 127.0.0.1:{port} within 30 s");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let child = broker_child.context("broker process")?;
        Ok(KafkaBroker {
            child,
            port,
            client,
        })
    }

    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub async fn create_topic(&self, topic: &str, partitions: i32) -> Result<()> {
        self.client
            .controller_client()?
            .create_topic(topic, partitions, 1, 5_000)
            .await?;
        Ok(())
    }

    /// Produces `(key, value)` records to one partition, in order.
    pub async fn produce(
        &self,
        topic: &str,
        partition: i32,
        records: Vec<KeyValue<'_>>,
    ) -> Result<()> {
        let client = self
            .client
            .partition_client(topic, partition, UnknownTopicHandling::Retry)
            .await?;
        let records = records
            .into_iter()
            .map(|(key, value)| Record {
                key: key.map(<[u8]>::to_vec),
                value: value.map(<[u8]>::to_vec),
                headers: BTreeMap::new(),
                timestamp: chrono::Utc::now(),
            })
            .collect();
        client.produce(records, Compression::NoCompression).await?;
        Ok(())
    }
}

/// A record read back: partition, offset, key, value.
pub type ReadRecord = (i32, i64, Option<Vec<u8>>, Option<Vec<u8>>);

impl KafkaBroker {
    /// Every record of a topic's partitions `0..partitions`, per partition in offset order.
    pub async fn records(&self, topic: &str, partitions: i32) -> Result<Vec<ReadRecord>> {
        let mut out = Vec::new();
        for partition in 0..partitions {
            let client = self
                .client
                .partition_client(topic, partition, UnknownTopicHandling::Retry)
                .await?;
            let high = client
                .get_offset(rskafka::client::partition::OffsetAt::Latest)
                .await?;
            let mut offset = client
                .get_offset(rskafka::client::partition::OffsetAt::Earliest)
                .await?;
            while offset < high {
                let (records, _) = client
                    .fetch_records(offset, 1..4 * 1024 * 1024, 100)
                    .await?;
                if records.is_empty() {
                    bail!(
                        "partition {partition} of {topic} returned nothing at offset {offset} below {high}"
                    );
                }
                let from = offset;
                for r in records.into_iter().filter(|r| r.offset >= from) {
                    offset = r.offset + 1;
                    out.push((partition, r.offset, r.record.key, r.record.value));
                }
            }
        }
        Ok(out)
    }
}

impl Drop for KafkaBroker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
