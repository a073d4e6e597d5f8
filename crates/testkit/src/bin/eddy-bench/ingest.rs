//! `eddy-bench ingest`: a file, HTTP and Kafka into a table with a view, against serde_json.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use eddy_testkit::{EddyProcess, query_text};
use tokio_postgres::Client;

use crate::Measure;

/// One JSON line of the ingest benchmark (about 120 bytes, like a click event).
fn event_line(i: u64) -> String {
    format!(
        "{{\"user_id\": {}, \"url\": \"https://example.com/products/{}\", \"amount\": {}.{:02}, \"ts\": \"2024-05-01T10:{:02}:{:02}\"}}\n",
        i % 10_000,
        i % 997,
        i % 500,
        i % 100,
        (i / 60) % 60,
        i % 60
    )
}

const INGEST_TABLE: &str =
    "(user_id BIGINT, url TEXT, amount DOUBLE PRECISION, ts TIMESTAMP) APPEND ONLY";

/// Waits until `view` counts `n` records; returns when it did.
async fn wait_count(client: &Client, view: &str, n: u64) -> Result<Instant> {
    let deadline = Instant::now() + Duration::from_secs(3600);
    loop {
        client.batch_execute("FLUSH").await?;
        let got = query_text(client, &format!("SELECT coalesce(sum(n), 0) FROM {view}")).await?;
        if got[0][0].as_deref().and_then(|v| v.parse::<u64>().ok()) == Some(n) {
            return Ok(Instant::now());
        }
        if Instant::now() > deadline {
            bail!("{view} did not reach {n} records");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub(crate) async fn ingest(
    eddy: &std::path::Path,
    records: u64,
    http_batch: u64,
    kafka: bool,
) -> Result<Vec<Measure>> {
    let mut out = Vec::new();
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("events.jsonl");
    let mut bytes = Vec::with_capacity(records as usize * 130);
    for i in 0..records {
        bytes.extend_from_slice(event_line(i).as_bytes());
    }
    std::fs::write(&path, &bytes)?;
    let mb = bytes.len() as f64 / 1e6;
    let note = format!("{records} records, {mb:.0} MB of JSON lines");

    // The practical limit: serde_json parsing the same lines into a typed record.
    #[derive(serde::Deserialize)]
    #[allow(dead_code)]
    struct Event {
        user_id: i64,
        url: String,
        amount: f64,
        ts: String,
    }
    let started = Instant::now();
    let mut parsed = 0u64;
    for line in bytes.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        let _event: Event = serde_json::from_slice(line)?;
        parsed += 1;
    }
    let secs = started.elapsed().as_secs_f64();
    out.push(Measure {
        name: "serde_json parse only (one core)".into(),
        value: parsed as f64 / secs,
        unit: "records/s",
        note: format!("{:.0} MB/s; {note}", mb / secs),
    });

    let server = EddyProcess::start_fresh(eddy)?;
    let client = server.connect().await?;
    let view = |t: &str| {
        format!(
            "CREATE MATERIALIZED VIEW {t}_per_user AS SELECT user_id, count(*) AS n, sum(amount) AS total FROM {t} GROUP BY user_id"
        )
    };

    // File connector: the file is there when the table is created.
    let cpu0 = server.stats()?.cpu_seconds;
    let started = Instant::now();
    client.batch_execute(&format!("CREATE TABLE from_file {INGEST_TABLE} WITH (connector = 'file', path = '{}') FORMAT PLAIN ENCODE JSON; {}", path.display(), view("from_file"))).await?;
    let secs = wait_count(&client, "from_file_per_user", records)
        .await?
        .duration_since(started)
        .as_secs_f64();
    let cpu = server.stats()?.cpu_seconds - cpu0;
    out.push(Measure {
        name: "file connector -> table + GROUP BY view".into(),
        value: records as f64 / secs,
        unit: "records/s",
        note: format!(
            "{:.1} MB/s, {:.2} CPU s per s; {note}",
            mb / secs,
            cpu / secs
        ),
    });

    // HTTP ingest: sequential POSTs of `http_batch` lines.
    client
        .batch_execute(&format!(
            "CREATE TABLE from_http {INGEST_TABLE}; {}",
            view("from_http")
        ))
        .await?;
    let lines: Vec<&[u8]> = bytes.split_inclusive(|b| *b == b'\n').collect();
    let cpu0 = server.stats()?.cpu_seconds;
    let started = Instant::now();
    for chunk in lines.chunks(http_batch as usize) {
        let body = chunk.concat();
        let (status, answer) = server.post("/ingest/from_http", "application/x-ndjson", &body)?;
        if status != 200 {
            bail!("HTTP ingest answered {status}: {answer}");
        }
    }
    let acked = started.elapsed().as_secs_f64();
    let secs = wait_count(&client, "from_http_per_user", records)
        .await?
        .duration_since(started)
        .as_secs_f64();
    let cpu = server.stats()?.cpu_seconds - cpu0;
    out.push(Measure {
        name: format!("HTTP ingest ({http_batch} lines per POST) -> table + view"),
        value: records as f64 / secs,
        unit: "records/s",
        note: format!(
            "{:.1} MB/s; all acknowledged (durable) after {acked:.1} s; {:.2} CPU s per s; {note}",
            mb / secs,
            cpu / secs
        ),
    });

    if kafka {
        let broker = eddy_testkit::kafka::KafkaBroker::start().await?;
        broker.create_topic("events", 3).await?;
        for (p, part) in lines.chunks(lines.len().div_ceil(3)).enumerate() {
            for chunk in part.chunks(5_000) {
                broker
                    .produce(
                        "events",
                        p as i32,
                        chunk
                            .iter()
                            .map(|l| (None, Some(&l[..l.len() - 1])))
                            .collect(),
                    )
                    .await?;
            }
        }
        let cpu0 = server.stats()?.cpu_seconds;
        let started = Instant::now();
        client
            .batch_execute(&format!(
                "CREATE TABLE from_kafka {INGEST_TABLE} WITH (connector = 'kafka', topic = 'events', properties.bootstrap.server = '{}', partitions = 3) FORMAT PLAIN ENCODE JSON; {}",
                broker.bootstrap(),
                view("from_kafka")
            ))
            .await?;
        let secs = wait_count(&client, "from_kafka_per_user", records)
            .await?
            .duration_since(started)
            .as_secs_f64();
        let cpu = server.stats()?.cpu_seconds - cpu0;
        out.push(Measure {
            name: "Kafka (3 partitions, Tansu on the same machine) -> table + view".into(),
            value: records as f64 / secs,
            unit: "records/s",
            note: format!(
                "{:.1} MB/s, {:.2} CPU s per s; {note}",
                mb / secs,
                cpu / secs
            ),
        });
    }
    out.push(Measure {
        name: "peak RSS of the server".into(),
        value: server.stats()?.peak_rss_bytes as f64 / 1e6,
        unit: "MB",
        note: String::new(),
    });
    Ok(out)
}
