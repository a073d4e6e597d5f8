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
//! `eddy-bench file` — Nexmark bids in a JSON-lines file read by a file SOURCE, the queries over
//! bids as views with 1 and 2 workers, against arrow-json decoding the same file on one core.
//! `eddy-bench nexmark` — each Nexmark query of `examples/nexmark` over the built-in generator:
//! events/s, events/s per core (CPU seconds of the server), peak RSS, state, time to drain;
//! DataFusion running the same queries in batch over the same events; generation -> SUBSCRIBE
//! latency with the generator rate-limited.
//! Numbers, not assertions: this is never run by `bin/test`.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use tokio_postgres::Client;

mod file;
mod ingest;
mod nexmark;
mod spill;
mod views;
mod windows;

use file::file;
use ingest::ingest;
use nexmark::{NexmarkRun, nexmark};
use spill::{SpillRun, spill};
use views::{ViewsRun, views};
use windows::windows;

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
    Views(ViewsRun),
    /// A join view under updates with and without a memory limit below its state (spilling).
    Spill(SpillRun),
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
    /// JSON-lines file source: Nexmark bids written to a file, read by a file SOURCE, the
    /// queries over bids as views with each worker count; arrow-json's decode rate alongside.
    File {
        /// Bids in the file.
        #[arg(long, default_value_t = 5_000_000)]
        bids: u64,
        /// Queries: files of examples/nexmark over bids, or `tumble` (default: q0, q1, q2,
        /// tumble, q5, q7); `q0+q1` creates those views at once, reading the file together.
        #[arg(long, value_delimiter = ',')]
        queries: Vec<String>,
        /// Worker counts to run each query with (`eddy --workers`).
        #[arg(long, value_delimiter = ',', default_values_t = [1, 2])]
        workers: Vec<u32>,
        /// Where to write the bids (default: a temporary file, deleted after the run); the
        /// file is kept, for profiling by hand.
        #[arg(long)]
        path: Option<PathBuf>,
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
        /// The server's `--barrier-interval` in seconds (how often epochs end; the latency run
        /// measures what it costs).
        #[arg(long, default_value_t = 0.1)]
        barrier_interval: f64,
        /// The server's `--memory-limit` (`2GB`; `0`: none): operator state past half of it
        /// spills to disk.
        #[arg(long, default_value = "0")]
        memory_limit: String,
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
        Bench::Views(run) => runtime.block_on(views(&eddy, &run))?,
        Bench::Spill(run) => runtime.block_on(spill(&eddy, &run))?,
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
        Bench::File {
            bids,
            queries,
            workers,
            path,
        } => runtime.block_on(file(&eddy, bids, queries, &workers, path))?,
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
            barrier_interval,
            memory_limit,
        } => {
            let run = NexmarkRun {
                events,
                workers,
                splits,
                checkpoint_interval,
                recovery,
                barrier_interval,
                memory_limit,
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
