//! `bin/bench`: measures a release `eddy` server over the wire and prints a table plus JSON.
//!
//! `eddy-bench views` — incremental views under random updates (changes/s for a GROUP BY view
//! and a two-table join view), backfill time over a large table, state bytes per group, and
//! DataFusion recomputing the same query in batch (what a user would do instead).
//! `eddy-bench windows` — event-time views over a generated stream: events/s through TUMBLE and
//! HOP aggregates and an interval join, their state as the stream grows, and the latency from
//! INSERT to the change arriving in a SUBSCRIBE.
//! `eddy-bench ingest` — records/s and MB/s into a table with a GROUP BY view on top, from a
//! followed file, HTTP ingest and a Kafka topic (JSON lines), against the speed at which
//! serde_json merely parses the same bytes.
//! `eddy-bench nexmark` — each Nexmark query of `examples/nexmark` over the built-in generator:
//! events/s, events/s per core (CPU seconds of the server), peak RSS, state, time to drain;
//! DataFusion running the same queries in batch over the same events; generation -> SUBSCRIBE
//! latency with the generator rate-limited.
//! Numbers, not assertions: this is never run by `bin/test`.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use eddy_testkit::{EddyProcess, query_text};
use tokio_postgres::Client;

#[derive(Parser)]
#[command(about = "Eddy benchmarks (release build, numbers not assertions)")]
struct Args {
    /// The eddy binary to run (default: next to this one).
    #[arg(long, global = true)]
    eddy: Option<PathBuf>,
    /// Where to write the results as JSON.
    #[arg(long, global = true, default_value = "target/bench-results.json")]
    json: PathBuf,
    #[command(subcommand)]
    bench: Bench,
}

#[derive(Subcommand)]
enum Bench {
    /// Incremental views: update throughput, backfill, state size, batch recompute baseline.
    Views {
        /// Rows in the updated table.
        #[arg(long, default_value_t = 1_000_000)]
        rows: u64,
        /// Groups of the GROUP BY view (and keys of the joined dimension table).
        #[arg(long, default_value_t = 100_000)]
        groups: u64,
        /// Rows of the table a view backfills from.
        #[arg(long, default_value_t = 10_000_000)]
        backfill_rows: u64,
        /// Update statements per measured run; each changes `batch` rows.
        #[arg(long, default_value_t = 50)]
        updates: u64,
        #[arg(long, default_value_t = 10_000)]
        batch: u64,
    },
    /// Event-time views: TUMBLE, HOP, interval join throughput, state over time, latency.
    Windows {
        /// Events in the generated stream.
        #[arg(long, default_value_t = 10_000_000)]
        events: u64,
        /// Events per side of the interval join (its probe is not yet time-indexed).
        #[arg(long, default_value_t = 1_000_000)]
        join_events: u64,
        /// Events per INSERT statement (each followed by FLUSH): 100 s of event time.
        #[arg(long, default_value_t = 100_000)]
        chunk: u64,
        /// Rows per second for the latency run, and its length in seconds.
        #[arg(long, default_value_t = 500)]
        latency_rate: u64,
        #[arg(long, default_value_t = 10)]
        latency_seconds: u64,
    },
    /// Ingest: file connector, HTTP, Kafka (JSON lines) vs serde_json's parse speed.
    Ingest {
        /// Records per source.
        #[arg(long, default_value_t = 1_000_000)]
        records: u64,
        /// Records per HTTP request.
        #[arg(long, default_value_t = 50_000)]
        http_batch: u64,
        /// Skip Kafka (no broker installed).
        #[arg(long)]
        no_kafka: bool,
    },
    /// Nexmark: each query as a view over the built-in generator (sources, nothing stored),
    /// events/s and per core, peak RSS, state, time to drain; the same queries in batch by
    /// DataFusion over the same events; the latency from generation to a SUBSCRIBE.
    Nexmark {
        /// Events of all kinds (1 person : 3 auctions : 46 bids).
        #[arg(long, default_value_t = 10_000_000)]
        events: u64,
        /// Queries to run, by file name in examples/nexmark (default: all of them).
        #[arg(long, value_delimiter = ',')]
        queries: Vec<String>,
        /// Dataflow workers (`eddy --workers`): stateful operators sharded by key across them.
        #[arg(long, default_value_t = 1)]
        workers: u32,
        /// Generator splits (partitions) of each stream.
        #[arg(long, default_value_t = 2)]
        splits: u32,
        /// Skip the batch comparison (it stores every event in tables first).
        #[arg(long)]
        no_batch: bool,
        /// Generator rate for the latency run (events/s), and its length in seconds (0: skip).
        #[arg(long, default_value_t = 100_000)]
        latency_rate: u64,
        #[arg(long, default_value_t = 10)]
        latency_seconds: u64,
        /// Seconds between the server's checkpoints (0: never, except the one taken after each
        /// query to measure its duration and size).
        #[arg(long, default_value_t = 10.0)]
        checkpoint_interval: f64,
        /// After each query: SIGKILL the server and measure the restart, from the checkpoint and
        /// (with the checkpoint deleted) by replaying from the start.
        #[arg(long)]
        recovery: bool,
    },
}

/// One measured line of the report.
struct Measure {
    name: String,
    value: f64,
    unit: &'static str,
    note: String,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let eddy = match args.eddy {
        Some(p) => p,
        None => std::env::current_exe()?
            .parent()
            .context("no directory")?
            .join("eddy"),
    };
    if !eddy.exists() {
        bail!(
            "{} is missing; bin/bench builds it (cargo build --release -p eddy)",
            eddy.display()
        );
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let measures = match args.bench {
        Bench::Views {
            rows,
            groups,
            backfill_rows,
            updates,
            batch,
        } => runtime.block_on(views(&eddy, rows, groups, backfill_rows, updates, batch))?,
        Bench::Windows {
            events,
            join_events,
            chunk,
            latency_rate,
            latency_seconds,
        } => runtime.block_on(windows(
            &eddy,
            events,
            join_events,
            chunk,
            latency_rate,
            latency_seconds,
        ))?,
        Bench::Ingest {
            records,
            http_batch,
            no_kafka,
        } => runtime.block_on(ingest(&eddy, records, http_batch, !no_kafka))?,
        Bench::Nexmark {
            events,
            queries,
            workers,
            splits,
            no_batch,
            latency_rate,
            latency_seconds,
            checkpoint_interval,
            recovery,
        } => {
            let run = NexmarkRun {
                events,
                workers,
                splits,
                checkpoint_interval,
                recovery,
            };
            runtime.block_on(nexmark(
                &eddy,
                &run,
                queries,
                !no_batch,
                latency_rate,
                latency_seconds,
            ))?
        }
    };
    println!("\n{:<72} {:>14}  {:<10} note", "measure", "value", "unit");
    for m in &measures {
        println!(
            "{:<72} {:>14.1}  {:<10} {}",
            m.name, m.value, m.unit, m.note
        );
    }
    let json: Vec<String> = measures
        .iter()
        .map(|m| {
            format!(
                "  {{\"measure\": {:?}, \"value\": {}, \"unit\": {:?}, \"note\": {:?}}}",
                m.name, m.value, m.unit, m.note
            )
        })
        .collect();
    if let Some(dir) = args.json.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&args.json, format!("[\n{}\n]\n", json.join(",\n")))?;
    println!("\nwritten to {}", args.json.display());
    Ok(())
}

async fn exec(client: &Client, sql: &str) -> Result<Duration> {
    let start = Instant::now();
    client
        .batch_execute(sql)
        .await
        .with_context(|| sql.to_owned())?;
    Ok(start.elapsed())
}

/// Fills `table` (k, g, v) with `rows` rows in statements of at most 1M rows.
async fn fill(client: &Client, table: &str, rows: u64, groups: u64) -> Result<Duration> {
    let start = Instant::now();
    let mut from = 1;
    while from <= rows {
        let to = (from + 999_999).min(rows);
        exec(client, &format!("INSERT INTO {table} SELECT x, x % {groups}, x FROM generate_series({from}, {to}) AS s(x)")).await?;
        from = to + 1;
    }
    Ok(start.elapsed())
}

/// Runs `updates` statements that each change `batch` consecutive keys of `t` (2 change rows
/// per updated row), then FLUSH; returns change rows per second through the views.
async fn update_throughput(
    client: &Client,
    rows: u64,
    updates: u64,
    batch: u64,
    seed: &mut u64,
) -> Result<(f64, Duration)> {
    let start = Instant::now();
    for _ in 0..updates {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let first = 1 + (*seed >> 33) % (rows - batch);
        exec(
            client,
            &format!(
                "UPDATE t SET v = v + 1 WHERE k BETWEEN {first} AND {}",
                first + batch - 1
            ),
        )
        .await?;
    }
    exec(client, "FLUSH").await?;
    let elapsed = start.elapsed();
    Ok((
        (2 * updates * batch) as f64 / elapsed.as_secs_f64(),
        elapsed,
    ))
}

async fn state_of(client: &Client, view: &str) -> Result<(u64, u64)> {
    let rows = query_text(
        client,
        &format!(
            "SELECT sum(state_rows), sum(state_bytes) FROM eddy_operators WHERE view = '{view}'"
        ),
    )
    .await?;
    let cell = |i: usize| {
        rows.first()
            .and_then(|r| r[i].as_deref())
            .unwrap_or("0")
            .parse::<u64>()
            .unwrap_or(0)
    };
    Ok((cell(0), cell(1)))
}

async fn views(
    eddy: &std::path::Path,
    rows: u64,
    groups: u64,
    backfill_rows: u64,
    updates: u64,
    batch: u64,
) -> Result<Vec<Measure>> {
    let server = EddyProcess::start_fresh(eddy)?;
    let client = server.connect().await?;
    let mut out = Vec::new();
    let mut seed = 42u64;
    let agg =
        "SELECT g, count(*) AS n, sum(v) AS total, min(v) AS lo, max(v) AS hi FROM t GROUP BY g";
    let join = "SELECT t.k, t.v, d.name FROM t JOIN d ON t.g = d.g";
    let join_agg = "SELECT d.name, count(*) AS n, sum(t.v) AS total FROM t JOIN d ON t.g = d.g GROUP BY d.name";

    exec(
        &client,
        "CREATE TABLE t (k BIGINT PRIMARY KEY, g BIGINT NOT NULL, v BIGINT NOT NULL)",
    )
    .await?;
    exec(
        &client,
        "CREATE TABLE d (g BIGINT PRIMARY KEY, name TEXT NOT NULL)",
    )
    .await?;
    eprintln!("loading {rows} rows into t ...");
    let load = fill(&client, "t", rows, groups).await?;
    out.push(Measure {
        name: format!("load t ({rows} rows, INSERT ... SELECT, durable)"),
        value: rows as f64 / load.as_secs_f64(),
        unit: "rows/s",
        note: format!("{load:.1?}"),
    });
    exec(
        &client,
        &format!(
            "INSERT INTO d SELECT x, 'name ' || (x % 1000) FROM generate_series(0, {}) AS s(x)",
            groups - 1
        ),
    )
    .await?;

    for (name, query) in [("agg", agg), ("join", join), ("join_agg", join_agg)] {
        eprintln!("view {name} ...");
        let backfill = exec(
            &client,
            &format!("CREATE MATERIALIZED VIEW {name} AS {query}"),
        )
        .await?;
        out.push(Measure {
            name: format!("{name}: backfill over {rows} rows"),
            value: backfill.as_secs_f64() * 1000.0,
            unit: "ms",
            note: String::new(),
        });
        let before = server.stats()?;
        let (rate, elapsed) = update_throughput(&client, rows, updates, batch, &mut seed).await?;
        let after = server.stats()?;
        let cpu = after.cpu_seconds - before.cpu_seconds;
        out.push(Measure {
            name: format!("{name}: changes/s under random updates"),
            value: rate,
            unit: "changes/s",
            note: format!("{updates} UPDATEs x {batch} rows in {elapsed:.1?}, {cpu:.1} CPU s (incl. log + table upkeep)"),
        });
        let (state_rows, state_bytes) = state_of(&client, name).await?;
        out.push(Measure {
            name: format!("{name}: state"),
            value: state_bytes as f64 / 1e6,
            unit: "MB",
            note: format!(
                "{state_rows} state rows, {} B/row",
                state_bytes / state_rows.max(1)
            ),
        });
        // What a user would do instead: recompute the query in batch after each epoch.
        let mut best = Duration::MAX;
        for _ in 0..3 {
            best = best.min(exec(&client, &format!("SELECT count(*) FROM ({query}) q")).await?);
        }
        let per_epoch_rate = (2 * batch) as f64 / best.as_secs_f64();
        out.push(Measure {
            name: format!("{name}: DataFusion batch recompute"),
            value: best.as_secs_f64() * 1000.0,
            unit: "ms",
            note: format!(
                "= {per_epoch_rate:.0} changes/s if recomputed once per {batch}-row update"
            ),
        });
        exec(&client, &format!("DROP MATERIALIZED VIEW {name}")).await?;
    }
    let (groups_state_rows, groups_state_bytes) = {
        exec(&client, "CREATE MATERIALIZED VIEW per_group AS SELECT g, count(*) AS n, sum(v) AS total FROM t GROUP BY g").await?;
        let s = state_of(&client, "per_group").await?;
        exec(&client, "DROP MATERIALIZED VIEW per_group").await?;
        s
    };
    out.push(Measure {
        name: "state bytes per group (count + sum)".into(),
        value: groups_state_bytes as f64 / groups_state_rows.max(1) as f64,
        unit: "B/group",
        note: format!("{groups_state_rows} groups"),
    });

    eprintln!("loading {backfill_rows} rows into big ...");
    exec(
        &client,
        "CREATE TABLE big (k BIGINT, g BIGINT, v BIGINT) APPEND ONLY",
    )
    .await?;
    let load = fill(&client, "big", backfill_rows, groups).await?;
    out.push(Measure {
        name: format!("load big ({backfill_rows} rows, append only)"),
        value: backfill_rows as f64 / load.as_secs_f64(),
        unit: "rows/s",
        note: format!("{load:.1?}"),
    });
    let backfill = exec(&client, "CREATE MATERIALIZED VIEW big_agg AS SELECT g, count(*) AS n, sum(v) AS total FROM big GROUP BY g").await?;
    out.push(Measure {
        name: format!("backfill GROUP BY view over {backfill_rows} rows"),
        value: backfill_rows as f64 / backfill.as_secs_f64(),
        unit: "rows/s",
        note: format!("{backfill:.1?}"),
    });
    let batch_time = exec(
        &client,
        "SELECT count(*) FROM (SELECT g, count(*) AS n, sum(v) AS total FROM big GROUP BY g) q",
    )
    .await?;
    out.push(Measure {
        name: format!("DataFusion batch GROUP BY over {backfill_rows} rows"),
        value: batch_time.as_secs_f64() * 1000.0,
        unit: "ms",
        note: String::new(),
    });
    let stats = server.stats()?;
    out.push(Measure {
        name: "server peak RSS".into(),
        value: stats.peak_rss_bytes as f64 / 1e6,
        unit: "MB",
        note: format!("{:.1} CPU s in total", stats.cpu_seconds),
    });
    Ok(out)
}

/// One event every 1 ms of event time, 1000 keys, from 2026-01-01 00:00:00 UTC.
fn events_sql(table: &str, from: u64, to: u64) -> String {
    format!(
        "INSERT INTO {table} SELECT x % 1000, x % 97, to_timestamp_micros(1767225600000000 + x * 1000) FROM generate_series({from}, {to}) AS g(x)"
    )
}

async fn windows(
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

async fn ingest(
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
fn sql_file(path: &std::path::Path) -> Result<String> {
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
async fn nexmark_drained(client: &Client, view: &str, events: u64) -> Result<Instant> {
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
struct NexmarkRun {
    events: u64,
    workers: u32,
    splits: u32,
    checkpoint_interval: f64,
    recovery: bool,
}

/// Takes a checkpoint and reads what `eddy_checkpoints` says of it: (duration, pause) in ms and
/// MB on disk.
async fn checkpoint(client: &Client) -> Result<(f64, f64, f64)> {
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

async fn nexmark(
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
        out.extend(nexmark_latency(eddy, &dir, workers, latency_rate, latency_seconds).await?);
    }
    Ok(out)
}

/// The generator paced at `rate` events/s with event time advancing at the same pace: event
/// `e` is generated at `start + e / rate`, which is also its event time minus the base time.
/// A view of the bids is subscribed to; the delay of each row is its arrival minus that.
async fn nexmark_latency(
    eddy: &std::path::Path,
    dir: &std::path::Path,
    workers: u32,
    rate: u64,
    seconds: u64,
) -> Result<Vec<Measure>> {
    use futures::StreamExt;
    let events = rate * seconds;
    let server = EddyProcess::start_fresh_with(eddy, Some(workers))?;
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
    let mut delays = Vec::with_capacity(bids as usize);
    let deadline = started + Duration::from_secs(seconds * 3 + 30);
    while (delays.len() as u64) < bids && Instant::now() < deadline {
        let Ok(Some(row)) = tokio::time::timeout(Duration::from_secs(5), stream.next()).await
        else {
            break;
        };
        let row = row?;
        let ms: i64 = row.get(3);
        let due = Duration::from_millis((ms - base_ms).max(0) as u64);
        delays.push(started.elapsed().saturating_sub(due));
    }
    delays.sort();
    let pick = |q: f64| {
        delays
            .get(((delays.len() as f64 * q) as usize).min(delays.len().saturating_sub(1)))
            .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
    };
    Ok(vec![
        Measure { name: format!("latency generation -> SUBSCRIBE p50 ({rate} events/s)"), value: pick(0.5), unit: "ms", note: format!("{} bids received", delays.len()) },
        Measure { name: "latency generation -> SUBSCRIBE p99".into(), value: pick(0.99), unit: "ms", note: "event time is generation time at this rate (ms granularity); includes the 100 ms epoch barrier".into() },
    ])
}
