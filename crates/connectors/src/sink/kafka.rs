//! The Kafka sink: a view's changes as records keyed by the view's key, JSON encoded.
//!
//! `FORMAT UPSERT ENCODE JSON`: the key's row as the value, a tombstone (no value) when the key
//! left the view — a compacted topic converges to the view. `FORMAT DEBEZIUM ENCODE JSON`:
//! `{"before", "after", "op": "c" | "u" | "d", "ts_ms", "source"}` per key that changed. Every
//! record carries the headers `eddy-sink` and `eddy-epoch`. A key always goes to the same
//! partition (Kafka's default partitioner: murmur2 of the key bytes), so per key the records
//! are in order.
//!
//! Exactly once, idempotent by key (ADR 0008): an epoch's records are staged per partition and
//! produced until every partition has acknowledged them (a failed partition is retried alone,
//! the others are not produced twice). When the engine hands whole contents instead of changes
//! (a new sink, or a restart that found the sink not exactly at the view's checkpoint), the
//! sink reads the topic back, takes the last state of every key, and produces only the keys
//! whose state differs from the view's — nothing twice, nothing missed, and a consumer never
//! sees a key go back to an older value.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use arrow::array::RecordBatch;
use eddy_common::{ChangeBatch, Error, Result, SqlState};
use rskafka::client::partition::{Compression, PartitionClient};
use rskafka::record::Record;
use serde_json::Value;

use super::{SinkWrite, json_lines, split_lines};
use crate::kafka::{KafkaTopic, Startup, kafka_error};

/// `FORMAT UPSERT | DEBEZIUM` of a Kafka sink (always `ENCODE JSON`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KafkaEnvelope {
    Upsert,
    Debezium,
}

/// Where and how the sink writes: the options of `CREATE SINK ... WITH (connector = 'kafka')`.
#[derive(Debug, Clone)]
pub struct KafkaTarget {
    pub bootstrap: String,
    pub topic: String,
    pub envelope: KafkaEnvelope,
}

impl KafkaTarget {
    /// Reads the connector options and `FORMAT ... ENCODE ...`; unknown options are the
    /// caller's to reject.
    pub fn from_options(
        option: impl Fn(&str) -> Option<String>,
        format: Option<(&str, &str)>,
    ) -> Result<KafkaTarget> {
        let required = |name: &str| {
            option(name).ok_or_else(|| {
                Error::invalid_parameter(format!("a kafka sink needs the option {name}"))
            })
        };
        let envelope = match format {
            Some((envelope, encode)) => {
                if !encode.eq_ignore_ascii_case("json") {
                    return Err(Error::unsupported(format!(
                        "a kafka sink encodes JSON only, not {encode}"
                    )));
                }
                match envelope.to_ascii_lowercase().as_str() {
                    "upsert" => KafkaEnvelope::Upsert,
                    "debezium" => KafkaEnvelope::Debezium,
                    "plain" => {
                        return Err(Error::unsupported(
                            "FORMAT PLAIN would lose a view's retractions; a kafka sink takes FORMAT UPSERT or FORMAT DEBEZIUM",
                        ));
                    }
                    other => {
                        return Err(Error::invalid_parameter(format!(
                            "unknown format {other} (a kafka sink takes FORMAT UPSERT or FORMAT DEBEZIUM ENCODE JSON)"
                        )));
                    }
                }
            }
            None => {
                return Err(Error::invalid_parameter(
                    "a kafka sink needs FORMAT UPSERT ENCODE JSON or FORMAT DEBEZIUM ENCODE JSON",
                ));
            }
        };
        Ok(KafkaTarget {
            bootstrap: required("properties.bootstrap.server")?,
            topic: required("topic")?,
            envelope,
        })
    }
}

/// A record before routing: key and value (`None`: a tombstone).
type Keyed = (Vec<u8>, Option<Vec<u8>>);

pub struct KafkaSink {
    name: String,
    target: KafkaTarget,
    /// Key column positions in the view (never empty: a kafka sink needs a key).
    key: Vec<usize>,
    connection: Option<(KafkaTopic, Vec<PartitionClient>)>,
    /// The epoch being written and its records per partition not yet acknowledged.
    pending: Option<(u64, Vec<VecDeque<Vec<Record>>>)>,
}

impl KafkaSink {
    pub fn new(name: String, target: KafkaTarget, key: Vec<usize>) -> Result<KafkaSink> {
        if key.is_empty() {
            return Err(Error::invalid_parameter(
                "a kafka sink needs a key: the view has no unique key (GROUP BY columns); name one with primary_key = 'column, ...'",
            ));
        }
        Ok(KafkaSink {
            name,
            target,
            key,
            connection: None,
            pending: None,
        })
    }

    pub fn target(&self) -> &KafkaTarget {
        &self.target
    }

    /// Connects (once) and checks that the topic exists.
    pub async fn prepare(&mut self) -> Result<()> {
        self.connection().await.map(|_| ())
    }

    async fn connection(&mut self) -> Result<&(KafkaTopic, Vec<PartitionClient>)> {
        if self.connection.is_none() {
            let topic = KafkaTopic::connect(&self.target.bootstrap, &self.target.topic).await?;
            let mut partitions = topic.partitions().await?;
            partitions.sort_unstable();
            if partitions.is_empty() || partitions.iter().enumerate().any(|(i, p)| *p as usize != i)
            {
                return Err(Error::new(
                    SqlState::UNDEFINED_OBJECT,
                    format!(
                        "kafka topic \"{}\" has partitions {partitions:?}, not 0..n",
                        self.target.topic
                    ),
                ));
            }
            let mut clients = Vec::with_capacity(partitions.len());
            for p in partitions {
                clients.push(topic.partition_client(p).await?);
            }
            self.connection = Some((topic, clients));
        }
        self.connection
            .as_ref()
            .ok_or_else(|| Error::internal("kafka sink without a connection"))
    }

    /// Writes one epoch: stages its records (once; a retry of the same epoch goes on with what
    /// is left) and produces them until every partition has them. After an error the
    /// connection is dropped; calling again with the same epoch is safe.
    pub async fn write(&mut self, epoch: u64, write: &SinkWrite) -> Result<()> {
        let result = self.write_inner(epoch, write).await;
        if result.is_err() {
            self.connection = None;
        }
        result
    }

    async fn write_inner(&mut self, epoch: u64, write: &SinkWrite) -> Result<()> {
        if self.pending.as_ref().is_none_or(|(e, _)| *e != epoch) {
            let records = match write {
                SinkWrite::Changes(None) => Vec::new(),
                SinkWrite::Changes(Some(changes)) => self.changes(epoch, changes)?,
                SinkWrite::Replace(contents) => {
                    let current = self.read_topic().await?;
                    self.reconcile(epoch, current, contents.as_ref())?
                }
            };
            let partitions = self.connection().await?.1.len();
            self.pending = Some((epoch, self.route(epoch, records, partitions)));
        }
        let Some((_, mut pending)) = self.pending.take() else {
            return Ok(());
        };
        let clients = match self.connection().await {
            Ok((_, clients)) => clients,
            Err(e) => {
                self.pending = Some((epoch, pending));
                return Err(e);
            }
        };
        let results = futures::future::join_all(clients.iter().zip(pending.iter_mut()).map(
            |(client, chunks)| async move {
                while let Some(chunk) = chunks.pop_front() {
                    if let Err(e) = client
                        .produce(chunk.clone(), Compression::NoCompression)
                        .await
                    {
                        chunks.push_front(chunk);
                        return Err(kafka_error(
                            &format!("producing to partition {}", client.partition()),
                            e,
                        ));
                    }
                }
                Ok(())
            },
        ))
        .await;
        if let Some(Err(e)) = results.into_iter().find(Result::is_err) {
            self.pending = Some((epoch, pending));
            return Err(e);
        }
        Ok(())
    }

    /// The records for an epoch's consolidated changes: per key, its new row (or a delete).
    /// The key columns and the whole rows of `rows`, each as JSON lines.
    fn key_and_row_lines(&self, rows: &RecordBatch) -> Result<(Vec<u8>, Vec<u8>)> {
        let keys = rows
            .project(&self.key)
            .map_err(|e| Error::internal(format!("kafka sink key: {e}")))?;
        Ok((json_lines(&keys)?, json_lines(rows)?))
    }

    fn changes(&self, epoch: u64, changes: &ChangeBatch) -> Result<Vec<Keyed>> {
        let rows = changes.rows();
        let (key_lines, row_lines) = self.key_and_row_lines(rows)?;
        let keys: Vec<&[u8]> = split_lines(&key_lines).collect();
        let values: Vec<&[u8]> = split_lines(&row_lines).collect();
        if keys.len() != rows.num_rows() || values.len() != rows.num_rows() {
            return Err(Error::internal(
                "kafka sink: JSON lines do not match the rows",
            ));
        }
        // Per key (in order of first appearance): the row retracted and the row inserted.
        let mut order: Vec<&[u8]> = Vec::new();
        let mut by_key: HashMap<&[u8], (Option<usize>, Option<usize>)> =
            HashMap::with_capacity(keys.len());
        for (i, diff) in changes.diffs().values().iter().enumerate() {
            let entry = by_key.entry(keys[i]).or_insert_with(|| {
                order.push(keys[i]);
                (None, None)
            });
            if *diff > 0 {
                entry.1 = Some(i);
            } else {
                entry.0 = Some(i);
            }
        }
        let mut out = Vec::with_capacity(order.len());
        for key in order {
            let (old, new) = by_key[key];
            if let Some(value) = self.value(epoch, old.map(|i| values[i]), new.map(|i| values[i])) {
                out.push((key.to_vec(), value));
            }
        }
        Ok(out)
    }

    /// The records that make the topic hold `contents`, given the state it holds (`current`:
    /// each key's last row): only keys whose row differs.
    fn reconcile(
        &self,
        epoch: u64,
        mut current: HashMap<Vec<u8>, Value>,
        contents: Option<&ChangeBatch>,
    ) -> Result<Vec<Keyed>> {
        let mut out = Vec::new();
        if let Some(contents) = contents {
            let (key_lines, row_lines) = self.key_and_row_lines(contents.rows())?;
            for (key, row) in split_lines(&key_lines).zip(split_lines(&row_lines)) {
                let wanted: Value = serde_json::from_slice(row)
                    .map_err(|e| Error::internal(format!("kafka sink: {e}")))?;
                let before = current.remove(key);
                if before.as_ref() == Some(&wanted) {
                    continue;
                }
                let before = before.map(|b| b.to_string());
                if let Some(value) =
                    self.value(epoch, before.as_deref().map(str::as_bytes), Some(row))
                {
                    out.push((key.to_vec(), value));
                }
            }
        }
        let mut gone: Vec<(Vec<u8>, Value)> = current.into_iter().collect();
        gone.sort_by(|a, b| a.0.cmp(&b.0));
        for (key, before) in gone {
            let before = before.to_string();
            if let Some(value) = self.value(epoch, Some(before.as_bytes()), None) {
                out.push((key, value));
            }
        }
        Ok(out)
    }

    /// The record value for a key whose row went from `before` to `after` (JSON objects);
    /// the outer `None` when there is nothing to write.
    fn value(
        &self,
        epoch: u64,
        before: Option<&[u8]>,
        after: Option<&[u8]>,
    ) -> Option<Option<Vec<u8>>> {
        match self.target.envelope {
            KafkaEnvelope::Upsert => match (before, after) {
                (None, None) => None,
                (_, after) => Some(after.map(<[u8]>::to_vec)),
            },
            KafkaEnvelope::Debezium => {
                let op = match (before, after) {
                    (None, None) => return None,
                    (None, Some(_)) => "c",
                    (Some(_), Some(_)) => "u",
                    (Some(_), None) => "d",
                };
                fn text(row: Option<&[u8]>) -> std::borrow::Cow<'_, str> {
                    row.map_or("null".into(), String::from_utf8_lossy)
                }
                let name = Value::String(self.name.clone());
                Some(Some(
                    format!(
                        r#"{{"before":{},"after":{},"op":"{op}","ts_ms":{},"source":{{"connector":"eddy","sink":{name},"epoch":{epoch}}}}}"#,
                        text(before),
                        text(after),
                        chrono::Utc::now().timestamp_millis()
                    )
                    .into_bytes(),
                ))
            }
        }
    }

    /// Records per partition (murmur2 of the key, as Kafka's default partitioner), cut into
    /// produce requests.
    fn route(
        &self,
        epoch: u64,
        records: Vec<Keyed>,
        partitions: usize,
    ) -> Vec<VecDeque<Vec<Record>>> {
        let mut out: Vec<VecDeque<Vec<Record>>> =
            (0..partitions).map(|_| VecDeque::new()).collect();
        let mut sizes = vec![0usize; partitions];
        let now = chrono::Utc::now();
        let headers = std::collections::BTreeMap::from([
            ("eddy-sink".to_owned(), self.name.clone().into_bytes()),
            ("eddy-epoch".to_owned(), epoch.to_string().into_bytes()),
        ]);
        for (key, value) in records {
            let p = (murmur2(&key) & 0x7fff_ffff) as usize % partitions;
            let size = key.len() + value.as_ref().map_or(0, Vec::len);
            if out[p].is_empty() || sizes[p] + size > eddy_common::limits::KAFKA_PRODUCE_BYTES_MAX {
                out[p].push_back(Vec::new());
                sizes[p] = 0;
            }
            sizes[p] += size;
            if let Some(chunk) = out[p].back_mut() {
                chunk.push(Record {
                    key: Some(key),
                    value,
                    headers: headers.clone(),
                    timestamp: now,
                });
            }
        }
        out
    }

    /// Every key's last state in the topic (its row; keys deleted last are absent).
    async fn read_topic(&mut self) -> Result<HashMap<Vec<u8>, Value>> {
        let envelope = self.target.envelope;
        let (topic, clients) = self.connection().await?;
        let mut state: HashMap<Vec<u8>, Value> = HashMap::new();
        for p in 0..clients.len() as u32 {
            let reader = topic.reader(p).await?;
            let mut offset = reader.offset_at(Startup::Earliest).await?;
            loop {
                let (records, high) = reader
                    .fetch(offset, 4 * 1024 * 1024, Duration::from_millis(50))
                    .await?;
                if offset >= high {
                    break;
                }
                if records.is_empty() {
                    tracing::warn!(
                        topic = topic.topic(),
                        partition = p,
                        offset,
                        high,
                        "reading a kafka sink's topic back found nothing below its high watermark"
                    );
                    break;
                }
                for r in records {
                    offset = r.offset + 1;
                    let Some(key) = r.key else { continue };
                    let row = r
                        .value
                        .and_then(|v| serde_json::from_slice::<Value>(&v).ok())
                        .and_then(|v| match envelope {
                            KafkaEnvelope::Upsert => Some(v),
                            KafkaEnvelope::Debezium => {
                                v.get("after").filter(|a| !a.is_null()).cloned()
                            }
                        });
                    match row {
                        Some(row) => state.insert(key, row),
                        None => state.remove(&key),
                    };
                }
            }
        }
        Ok(state)
    }
}

/// Kafka's murmur2 (the Java client's default partitioner hashes keys with it).
fn murmur2(data: &[u8]) -> i32 {
    const M: u32 = 0x5bd1_e995;
    let mut h: u32 = 0x9747_b28c ^ data.len() as u32;
    let chunks = data.chunks_exact(4);
    let tail = chunks.remainder();
    for chunk in chunks {
        let mut k = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> 24;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M) ^ k;
    }
    if tail.len() >= 3 {
        h ^= u32::from(tail[2]) << 16;
    }
    if tail.len() >= 2 {
        h ^= u32::from(tail[1]) << 8;
    }
    if !tail.is_empty() {
        h ^= u32::from(tail[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Int64Array, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};

    use super::*;

    #[test]
    fn murmur2_matches_the_java_client() {
        // Kafka's own test vectors (clients/src/test/java/org/apache/kafka/common/utils/UtilsTest.java).
        assert_eq!(murmur2(b"21"), -973932308);
        assert_eq!(murmur2(b"foobar"), -790332482);
        assert_eq!(murmur2(b"a-little-bit-long-string"), -985981536);
        assert_eq!(murmur2(b"a-little-bit-longer-string"), -1486304829);
        assert_eq!(
            murmur2(b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8"),
            -58897971
        );
        assert_eq!(murmur2(b"abc"), 479470107);
    }

    fn sink(envelope: KafkaEnvelope) -> KafkaSink {
        let target = KafkaTarget {
            bootstrap: "127.0.0.1:1".into(),
            topic: "t".into(),
            envelope,
        };
        KafkaSink::new("s".into(), target, vec![0]).unwrap()
    }

    fn changes(rows: &[(i64, &str, i64)]) -> ChangeBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("v", DataType::Utf8, true),
        ]));
        let batch = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0))),
                Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.1))),
            ],
        )
        .unwrap();
        ChangeBatch::new(
            batch,
            Int64Array::from_iter_values(rows.iter().map(|r| r.2)),
        )
    }

    fn text(records: &[(Vec<u8>, Option<Vec<u8>>)]) -> Vec<(String, Option<String>)> {
        records
            .iter()
            .map(|(k, v)| {
                (
                    String::from_utf8(k.clone()).unwrap(),
                    v.as_ref().map(|v| String::from_utf8(v.clone()).unwrap()),
                )
            })
            .collect()
    }

    #[test]
    fn upserts_and_tombstones_per_key() {
        let s = sink(KafkaEnvelope::Upsert);
        let out = s
            .changes(
                7,
                &changes(&[(1, "a", -1), (1, "b", 1), (2, "x", -1), (3, "n", 1)]),
            )
            .unwrap();
        assert_eq!(
            text(&out),
            vec![
                (r#"{"k":1}"#.into(), Some(r#"{"k":1,"v":"b"}"#.into())),
                (r#"{"k":2}"#.into(), None),
                (r#"{"k":3}"#.into(), Some(r#"{"k":3,"v":"n"}"#.into())),
            ]
        );
    }

    #[test]
    fn debezium_pairs_before_and_after() {
        let s = sink(KafkaEnvelope::Debezium);
        let out = s
            .changes(
                7,
                &changes(&[(1, "a", -1), (1, "b", 1), (2, "x", -1), (3, "n", 1)]),
            )
            .unwrap();
        let values: Vec<Value> = out
            .iter()
            .map(|(_, v)| serde_json::from_slice(v.as_ref().unwrap()).unwrap())
            .collect();
        assert_eq!(values[0]["op"], "u");
        assert_eq!(values[0]["before"], serde_json::json!({"k": 1, "v": "a"}));
        assert_eq!(values[0]["after"], serde_json::json!({"k": 1, "v": "b"}));
        assert_eq!(values[1]["op"], "d");
        assert_eq!(values[1]["after"], Value::Null);
        assert_eq!(values[2]["op"], "c");
        assert_eq!(values[2]["source"]["epoch"], 7);
    }

    #[test]
    fn reconciling_writes_only_keys_that_differ() {
        for envelope in [KafkaEnvelope::Upsert, KafkaEnvelope::Debezium] {
            let s = sink(envelope);
            let current: HashMap<Vec<u8>, Value> = HashMap::from([
                (
                    br#"{"k":1}"#.to_vec(),
                    serde_json::json!({"k": 1, "v": "a"}),
                ),
                (
                    br#"{"k":2}"#.to_vec(),
                    serde_json::json!({"k": 2, "v": "old"}),
                ),
                (
                    br#"{"k":9}"#.to_vec(),
                    serde_json::json!({"k": 9, "v": "gone"}),
                ),
            ]);
            let out = s
                .reconcile(
                    3,
                    current,
                    Some(&changes(&[(1, "a", 1), (2, "new", 1), (4, "added", 1)])),
                )
                .unwrap();
            let keys: Vec<String> = text(&out).into_iter().map(|(k, _)| k).collect();
            assert_eq!(
                keys,
                vec![r#"{"k":2}"#, r#"{"k":4}"#, r#"{"k":9}"#],
                "{envelope:?}"
            );
            if envelope == KafkaEnvelope::Upsert {
                assert_eq!(out[2].1, None);
            } else {
                let ops: Vec<Value> = out
                    .iter()
                    .map(|(_, v)| {
                        serde_json::from_slice::<Value>(v.as_ref().unwrap()).unwrap()["op"].clone()
                    })
                    .collect();
                assert_eq!(ops, vec!["u", "c", "d"]);
            }
        }
    }

    #[test]
    fn a_key_always_lands_in_the_same_partition() {
        let s = sink(KafkaEnvelope::Upsert);
        let records = s
            .changes(
                1,
                &changes(&[(1, "a", 1), (2, "b", 1), (3, "c", 1), (4, "d", 1)]),
            )
            .unwrap();
        let again = records.clone();
        let a = s.route(1, records, 3);
        let b = s.route(2, again, 3);
        let keys = |r: &Vec<VecDeque<Vec<Record>>>| {
            r.iter()
                .map(|p| {
                    p.iter()
                        .flatten()
                        .map(|r| r.key.clone().unwrap())
                        .collect::<Vec<_>>()
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(keys(&a), keys(&b));
        assert_eq!(keys(&a).iter().map(Vec::len).sum::<usize>(), 4);
    }
}
