//! `eddy-bench windows`: event-time views over a generated stream, their state and latency.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use eddy_testkit::EddyProcess;

use crate::views::state_of;
use crate::{Measure, exec};

/// One event every 1 ms of event time, 1000 keys, from 2026-01-01 00:00:00 UTC.
fn events_sql(table: &str, from: u64, to: u64) -> String {
    format!(
        "INSERT INTO {table} SELECT x % 1000, x % 97, to_timestamp_micros(1767225600000000 + x * 1000) FROM generate_series({from}, {to}) AS g(x)"
    )
}

pub(crate) async fn windows(
    eddy: &std::path::Path,
    all_events: u64,
    join_events: u64,
    chunk: u64,
    latency_rate: u64,
    latency_seconds: u64,
) -> Result<Vec<Measure>> {
    let server = EddyProcess::start_fresh(eddy)?;
    let client = server.connect().await?;
    let mut out = Vec::new();
    let stream = "CREATE TABLE {t} (k BIGINT, v BIGINT, ts TIMESTAMP, WATERMARK FOR ts AS ts - INTERVAL '5 seconds') APPEND ONLY";
    let views = [
        (
            "tumble",
            "SELECT window_start, k, count(*) AS n, sum(v) AS s FROM TUMBLE({t}, ts, INTERVAL '1' MINUTE) GROUP BY 1, 2",
        ),
        (
            "hop",
            "SELECT window_start, k, count(*) AS n, max(v) AS m FROM HOP({t}, ts, INTERVAL '10 seconds', INTERVAL '1' MINUTE) GROUP BY 1, 2",
        ),
        (
            "interval_join",
            "SELECT a.k, a.v, b.v AS w FROM {t} a JOIN {t}_b b ON a.k = b.k AND b.ts BETWEEN a.ts AND a.ts + INTERVAL '2 seconds'",
        ),
    ];
    for (name, query) in views {
        let events = if name == "interval_join" {
            join_events
        } else {
            all_events
        };
        let t = format!("s_{name}");
        exec(&client, &stream.replace("{t}", &t)).await?;
        if name == "interval_join" {
            exec(&client, &stream.replace("{t}", &format!("{t}_b"))).await?;
        }
        exec(
            &client,
            &format!(
                "CREATE MATERIALIZED VIEW {name} AS {}",
                query.replace("{t}", &t)
            ),
        )
        .await?;
        eprintln!("{name}: {events} events ...");
        let before = server.stats()?;
        let start = Instant::now();
        let mut samples = Vec::new();
        let mut from = 0;
        while from < events {
            let to = (from + chunk).min(events) - 1;
            exec(&client, &events_sql(&t, from, to)).await?;
            if name == "interval_join" {
                exec(&client, &events_sql(&format!("{t}_b"), from, to)).await?;
            }
            exec(&client, "FLUSH").await?;
            if (to + 1) % 1_000_000 == 0 || to + 1 == events {
                let (rows, bytes) = state_of(&client, name).await?;
                samples.push(format!(
                    "{}M:{rows}r/{:.1}MB",
                    (to + 1) as f64 / 1e6,
                    bytes as f64 / 1e6
                ));
            }
            from = to + 1;
        }
        let elapsed = start.elapsed();
        let cpu = server.stats()?.cpu_seconds - before.cpu_seconds;
        let inputs = if name == "interval_join" {
            2 * events
        } else {
            events
        };
        out.push(Measure {
            name: format!("{name}: events/s (INSERT ... SELECT, durable, view maintained)"),
            value: inputs as f64 / elapsed.as_secs_f64(),
            unit: "events/s",
            note: format!(
                "{inputs} events in {elapsed:.1?}, {cpu:.1} CPU s, {:.0} events per CPU s",
                inputs as f64 / cpu.max(0.001)
            ),
        });
        out.push(Measure {
            name: format!("{name}: state after each chunk"),
            value: samples.len() as f64,
            unit: "samples",
            note: samples.join(" "),
        });
        // The dataflow alone: a second view over the same stream backfills from the log.
        let replay = exec(
            &client,
            &format!(
                "CREATE MATERIALIZED VIEW {name}_replay AS {}",
                query.replace("{t}", &t)
            ),
        )
        .await?;
        out.push(Measure {
            name: format!("{name}: events/s replaying the log into a new view"),
            value: inputs as f64 / replay.as_secs_f64(),
            unit: "events/s",
            note: format!("{replay:.1?}"),
        });
        exec(&client, &format!("DROP TABLE {t} CASCADE")).await?;
        if name == "interval_join" {
            exec(&client, &format!("DROP TABLE {t}_b CASCADE")).await?;
        }
    }
    out.extend(latency(&server, latency_rate, latency_seconds).await?);
    let stats = server.stats()?;
    out.push(Measure {
        name: "server peak RSS".into(),
        value: stats.peak_rss_bytes as f64 / 1e6,
        unit: "MB",
        note: format!("{:.1} CPU s in total", stats.cpu_seconds),
    });
    Ok(out)
}

/// p50/p99 from an INSERT being sent to its row arriving in a SUBSCRIBE (one row per INSERT).
async fn latency(server: &EddyProcess, rate: u64, seconds: u64) -> Result<Vec<Measure>> {
    use futures::StreamExt;
    let setup = server.connect().await?;
    exec(
        &setup,
        "CREATE TABLE lat (id BIGINT, ts TIMESTAMP, WATERMARK FOR ts AS ts) APPEND ONLY",
    )
    .await?;
    exec(
        &setup,
        "CREATE MATERIALIZED VIEW lat_view AS SELECT id, ts FROM lat WHERE id >= 0",
    )
    .await?;
    let subscriber = server.connect().await?;
    let statement = subscriber
        .prepare("SUBSCRIBE TO lat_view WITH (SNAPSHOT = false)")
        .await?;
    let total = rate * seconds;
    let sent: std::sync::Arc<std::sync::Mutex<Vec<Option<Instant>>>> =
        std::sync::Arc::new(std::sync::Mutex::new(vec![None; total as usize]));
    let receiver = {
        let sent = std::sync::Arc::clone(&sent);
        tokio::spawn(async move {
            let mut delays = Vec::with_capacity(total as usize);
            let Ok(stream) = subscriber
                .query_raw(&statement, std::iter::empty::<i32>())
                .await
            else {
                return delays;
            };
            let mut stream = Box::pin(stream);
            while let Some(Ok(row)) = stream.next().await {
                let id: i64 = row.get(2);
                let at = Instant::now();
                if let Some(Some(t)) = sent
                    .lock()
                    .map(|s| s.get(id as usize).copied())
                    .ok()
                    .flatten()
                {
                    delays.push(at.duration_since(t));
                }
                if delays.len() as u64 >= total {
                    break;
                }
            }
            delays
        })
    };
    let writer = server.connect().await?;
    let insert = writer
        .prepare("INSERT INTO lat VALUES ($1, now()::timestamp)")
        .await?;
    let interval = Duration::from_secs_f64(1.0 / rate as f64);
    let start = Instant::now();
    for id in 0..total {
        let due = start + interval * id as u32;
        tokio::time::sleep_until(due.into()).await;
        if let Ok(mut s) = sent.lock() {
            s[id as usize] = Some(Instant::now());
        }
        writer.execute(&insert, &[&(id as i64)]).await?;
    }
    let mut delays = tokio::time::timeout(Duration::from_secs(30), receiver)
        .await
        .context("subscriber timed out")??;
    delays.sort();
    let pick = |q: f64| {
        delays
            .get(((delays.len() as f64 * q) as usize).min(delays.len().saturating_sub(1)))
            .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
    };
    Ok(vec![
        Measure {
            name: format!("latency INSERT -> SUBSCRIBE p50 ({rate} rows/s, one per INSERT)"),
            value: pick(0.5),
            unit: "ms",
            note: format!("{} rows", delays.len()),
        },
        Measure {
            name: "latency INSERT -> SUBSCRIBE p99".into(),
            value: pick(0.99),
            unit: "ms",
            note: "includes the fsync and the 100 ms epoch barrier".into(),
        },
    ])
}
