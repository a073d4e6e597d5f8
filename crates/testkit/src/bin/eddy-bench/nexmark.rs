//! `eddy-bench nexmark`: each query of `examples/nexmark` over the built-in generator.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use eddy_testkit::{EddyProcess, query_text};
use tokio_postgres::Client;

use crate::views::state_of;
use crate::{Measure, exec};

/// Every query file of examples/nexmark, in numeric order.
fn nexmark_queries(dir: &std::path::Path) -> Result<Vec<String>> {
    let mut names: Vec<String> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter_map(|n| {
            n.strip_suffix(".sql")
                .filter(|q| q.starts_with('q'))
                .map(str::to_owned)
        })
        .collect();
    names.sort_by_key(|n| n[1..].parse::<u32>().unwrap_or(u32::MAX));
    Ok(names)
}

/// A SQL file without its `--` comments.
pub(crate) fn sql_file(path: &std::path::Path) -> Result<String> {
    let text = std::fs::read_to_string(path).with_context(|| path.display().to_string())?;
    Ok(text
        .lines()
        .filter(|l| !l.trim_start().starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n"))
}

/// examples/nexmark/schema.sql for `events` events split `splits` ways, as sources (read by
/// each view, nothing stored) or as tables (stored, for batch queries).
fn nexmark_schema(
    dir: &std::path::Path,
    events: u64,
    splits: u32,
    sources: bool,
) -> Result<String> {
    let schema = sql_file(&dir.join("schema.sql"))?.replace(
        "nexmark.event.num = '10000000'",
        &format!("nexmark.event.num = '{events}'"),
    );
    Ok(if sources {
        schema
            .replace("CREATE TABLE", "CREATE SOURCE")
            .replace(") APPEND ONLY WITH", ") WITH")
            .replace("partitions = 2", &format!("nexmark.split.num = '{splits}'"))
    } else {
        schema.replace("partitions = 2", &format!("partitions = {splits}"))
    })
}

const SIDE_INPUT: &str = "CREATE TABLE side_input (key BIGINT PRIMARY KEY, value VARCHAR); INSERT INTO side_input SELECT v, CAST(v AS VARCHAR) AS value FROM generate_series(0, 9999) AS t(v)";

/// Waits until view `view` has committed `events` positions of every Nexmark source it reads
/// (not counting tables such as `side_input`).
pub(crate) async fn nexmark_drained(client: &Client, view: &str, events: u64) -> Result<Instant> {
    let deadline = Instant::now() + Duration::from_secs(3 * 3600);
    loop {
        let rows = query_text(client, &format!("SELECT count(DISTINCT object) AS sources, sum(committed_offset) AS done FROM eddy_source_offsets WHERE consumer = '{view}' AND object IN ('person', 'auction', 'bid')")).await?;
        let cell = |i: usize| {
            rows.first()
                .and_then(|r| r[i].as_deref())
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        if cell(0) > 0 && cell(1) >= cell(0) * events {
            return Ok(Instant::now());
        }
        if Instant::now() > deadline {
            bail!("{view} did not drain");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// How the Nexmark queries run.
pub(crate) struct NexmarkRun {
    pub(crate) events: u64,
    pub(crate) workers: u32,
    pub(crate) splits: u32,
    pub(crate) checkpoint_interval: f64,
    pub(crate) recovery: bool,
    /// The server's `--barrier-interval` (seconds).
    pub(crate) barrier_interval: f64,
    /// The server's `--memory-limit` (`0`: none).
    pub(crate) memory_limit: String,
}

/// Takes a checkpoint and reads what `eddy_checkpoints` says of it: (duration, pause) in ms and
/// MB on disk.
pub(crate) async fn checkpoint(client: &Client) -> Result<(f64, f64, f64)> {
    exec(client, "CHECKPOINT").await?;
    let rows = query_text(client, "SELECT extract(epoch FROM duration) * 1000 AS ms, extract(epoch FROM pause) * 1000 AS pause, bytes FROM eddy_checkpoints").await?;
    let cell = |i: usize| {
        rows.first()
            .and_then(|r| r[i].as_deref())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    Ok((cell(0), cell(1), cell(2) / 1e6))
}

pub(crate) async fn nexmark(
    eddy: &std::path::Path,
    run: &NexmarkRun,
    queries: Vec<String>,
    batch: bool,
    latency_rate: u64,
    latency_seconds: u64,
) -> Result<Vec<Measure>> {
    let NexmarkRun {
        events,
        workers,
        splits,
        ..
    } = *run;
    let server_args: Vec<String> = vec![
        "--workers".into(),
        workers.to_string(),
        "--checkpoint-interval".into(),
        run.checkpoint_interval.to_string(),
        "--barrier-interval".into(),
        run.barrier_interval.to_string(),
        "--memory-limit".into(),
        run.memory_limit.clone(),
    ];
    let dir = PathBuf::from("examples/nexmark");
    let queries = if queries.is_empty() {
        nexmark_queries(&dir)?
    } else {
        queries
    };
    let mut out = Vec::new();
    for q in &queries {
        eprintln!("nexmark {q} over {events} events, {workers} worker(s) ...");
        // A fresh server per query, as nexmark-flink runs them.
        let mut server = EddyProcess::start_fresh_args(eddy, &server_args)?;
        let client = server.connect().await?;
        exec(&client, SIDE_INPUT).await?;
        exec(&client, &nexmark_schema(&dir, events, splits, true)?).await?;
        let before = server.stats()?;
        let started = Instant::now();
        // Q10's file sink writes into this run's data directory.
        exec(
            &client,
            &sql_file(&dir.join(format!("{q}.sql")))?.replace(
                "/tmp/eddy-nexmark-q10",
                &server.data_dir.join("nexmark-q10").display().to_string(),
            ),
        )
        .await?;
        let drained = nexmark_drained(&client, &format!("nexmark_{q}"), events)
            .await?
            .duration_since(started)
            .as_secs_f64();
        let after = server.stats()?;
        let cpu = after.cpu_seconds - before.cpu_seconds;
        let (state_rows, state_bytes) = state_of(&client, &format!("nexmark_{q}")).await?;
        let rows = query_text(&client, &format!("SELECT count(*) AS n FROM nexmark_{q}")).await?;
        let view_rows = rows.first().and_then(|r| r[0].clone()).unwrap_or_default();
        out.push(Measure {
            name: format!("{q}: events/s"),
            value: events as f64 / drained,
            unit: "events/s",
            note: format!("drained in {drained:.1} s; {view_rows} rows in the view"),
        });
        // A view with sinks: how long until they have committed every row of it.
        let wanted: u64 = view_rows.parse().unwrap_or(0);
        for sink in query_text(&client, "SHOW SINKS").await? {
            let name = sink[0].clone().unwrap_or_default();
            let committed = loop {
                let rows = query_text(&client, "SHOW SINKS").await?;
                let committed = rows
                    .iter()
                    .find(|r| r[0].as_deref() == Some(name.as_str()))
                    .and_then(|r| r[5].as_deref()?.parse::<u64>().ok())
                    .unwrap_or(0);
                if committed >= wanted || started.elapsed() > Duration::from_secs(3600) {
                    break committed;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            };
            let secs = started.elapsed().as_secs_f64();
            let connector = sink[2].clone().unwrap_or_default();
            out.push(Measure {
                name: format!("{q}: {connector} sink {name}"),
                value: committed as f64 / secs,
                unit: "rows/s",
                note: format!("{committed} rows committed {secs:.1} s after the view was created"),
            });
        }
        out.push(Measure {
            name: format!("{q}: events/s per core"),
            value: events as f64 / cpu.max(0.01),
            unit: "events/s",
            note: format!("{cpu:.1} CPU s ({:.2} cores)", cpu / drained),
        });
        out.push(Measure {
            name: format!("{q}: peak RSS"),
            value: after.peak_rss_bytes as f64 / 1e6,
            unit: "MB",
            note: String::new(),
        });
        out.push(Measure {
            name: format!("{q}: state"),
            value: state_bytes as f64 / 1e6,
            unit: "MB",
            note: format!("{state_rows} state rows"),
        });
        let (took, pause, size) = checkpoint(&client).await?;
        out.push(Measure {
            name: format!("{q}: checkpoint"),
            value: took,
            unit: "ms",
            note: format!(
                "{size:.1} MB on disk; the views paused {pause:.0} ms to copy their state"
            ),
        });
        if run.recovery {
            let view = format!("nexmark_{q}");
            server.kill()?;
            let started = Instant::now();
            let mut restarted = server.restart()?;
            let client = restarted.connect().await?;
            nexmark_drained(&client, &view, events).await?;
            out.push(Measure {
                name: format!("{q}: restart from the checkpoint"),
                value: started.elapsed().as_secs_f64(),
                unit: "s",
                note: format!("after {events} events, until the view is current again"),
            });
            restarted.kill()?;
            std::fs::remove_dir_all(server.data_dir.join("checkpoints"))?;
            let started = Instant::now();
            let restarted = server.restart()?;
            let client = restarted.connect().await?;
            nexmark_drained(&client, &view, events).await?;
            out.push(Measure {
                name: format!("{q}: restart without a checkpoint"),
                value: started.elapsed().as_secs_f64(),
                unit: "s",
                note: "the view read again from the sources' start".into(),
            });
        }
    }
    if batch {
        eprintln!("storing {events} events in tables for the batch queries ...");
        let server = EddyProcess::start_fresh_args(eddy, &server_args)?;
        let client = server.connect().await?;
        exec(&client, SIDE_INPUT).await?;
        let started = Instant::now();
        exec(&client, &nexmark_schema(&dir, events, splits, false)?).await?;
        loop {
            let rows = query_text(&client, "SELECT sum(committed_offset) AS done FROM eddy_source_offsets WHERE consumer = 'connector nexmark'").await?;
            if rows
                .first()
                .and_then(|r| r[0].as_deref())
                .and_then(|v| v.parse::<u64>().ok())
                >= Some(3 * events)
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let stored = started.elapsed().as_secs_f64();
        out.push(Measure {
            name: "generate + store all events in tables (for batch)".into(),
            value: 3.0 * events as f64 / stored,
            unit: "event ids/s",
            note: format!("{stored:.1} s, the three streams each walk all event ids"),
        });
        for q in &queries {
            let create = sql_file(&dir.join(format!("{q}.sql")))?;
            let Some(at) = create.find(" AS\n") else {
                continue;
            };
            let query = create[at + 4..]
                .split(';')
                .next()
                .unwrap_or_default()
                .trim()
                .replace("FOR SYSTEM_TIME AS OF PROCTIME() ", "");
            if query.contains("SESSION(") {
                out.push(Measure {
                    name: format!("{q}: DataFusion batch"),
                    value: 0.0,
                    unit: "events/s",
                    note: "SESSION windows have no batch form in DataFusion".into(),
                });
                continue;
            }
            let started = Instant::now();
            let rows = query_text(
                &client,
                &format!("SELECT count(*) AS n FROM ({query}) AS q"),
            )
            .await
            .with_context(|| format!("{q} in batch"))?;
            let secs = started.elapsed().as_secs_f64();
            let n = rows.first().and_then(|r| r[0].clone()).unwrap_or_default();
            out.push(Measure {
                name: format!("{q}: DataFusion batch"),
                value: events as f64 / secs,
                unit: "events/s",
                note: format!("{secs:.2} s over the stored events, {n} rows"),
            });
        }
    }
    if latency_seconds > 0 {
        out.extend(nexmark_latency(eddy, &dir, &server_args, latency_rate, latency_seconds).await?);
    }
    Ok(out)
}

/// The generator paced at `rate` events/s with event time advancing at the same pace: event
/// `e` is generated at `start + e / rate`, which is also its event time minus the base time.
/// A view of the bids is subscribed to; the delay of each row is its arrival minus that.
async fn nexmark_latency(
    eddy: &std::path::Path,
    dir: &std::path::Path,
    server_args: &[String],
    rate: u64,
    seconds: u64,
) -> Result<Vec<Measure>> {
    use futures::StreamExt;
    let events = rate * seconds;
    let server = EddyProcess::start_fresh_args(eddy, server_args)?;
    let client = server.connect().await?;
    let schema = nexmark_schema(dir, events, 1, true)?
        .replace("'10000'", &format!("'{rate}'"))
        .replace(
            "nexmark.rate.limited = 'false'",
            "nexmark.rate.limited = 'true'",
        );
    exec(&client, &schema).await?;
    let subscriber = server.connect().await?;
    let statement = subscriber.prepare("SUBSCRIBE (SELECT auction, CAST(extract(epoch FROM date_time) * 1000 AS BIGINT) AS ms FROM bid) WITH (SNAPSHOT = false)").await?;
    let started = Instant::now();
    let stream = subscriber
        .query_raw(&statement, std::iter::empty::<i32>())
        .await?;
    let mut stream = Box::pin(stream);
    let base_ms = 1_436_918_400_000i64;
    let bids = events * 46 / 50;
    // Per bid: a row stands for `diff` bids of one auction in the same millisecond (an epoch's
    // changes are consolidated).
    let mut delays = Vec::with_capacity(bids as usize);
    let mut rows = 0u64;
    let deadline = started + Duration::from_secs(seconds * 3 + 30);
    while (delays.len() as u64) < bids && Instant::now() < deadline {
        let Ok(Some(row)) = tokio::time::timeout(Duration::from_secs(5), stream.next()).await
        else {
            break;
        };
        let row = row?;
        let diff: i64 = row.get::<_, Option<i64>>(1).unwrap_or(1);
        let ms: i64 = row.get(3);
        let due = Duration::from_millis((ms - base_ms).max(0) as u64);
        let delay = started.elapsed().saturating_sub(due);
        delays.extend(std::iter::repeat_n(delay, diff.max(0) as usize));
        rows += 1;
    }
    delays.sort();
    let pick = |q: f64| {
        delays
            .get(((delays.len() as f64 * q) as usize).min(delays.len().saturating_sub(1)))
            .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
    };
    Ok(vec![
        Measure { name: format!("latency generation -> SUBSCRIBE p50 ({rate} events/s)"), value: pick(0.5), unit: "ms", note: format!("{} of {bids} bids received, in {rows} rows", delays.len()) },
        Measure { name: "latency generation -> SUBSCRIBE p99".into(), value: pick(0.99), unit: "ms", note: "event time is generation time at this rate (ms granularity); includes the epoch barrier (--barrier-interval)".into() },
    ])
}
