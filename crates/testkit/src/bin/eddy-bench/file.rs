//! `eddy-bench file`: Nexmark bids written to a JSON-lines file, read by a file `SOURCE`, and
//! the Nexmark queries over bids as views — against arrow-json decoding the same file on one
//! core (the decode limit), in the same run.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use arrow::datatypes::Schema;
use eddy_connectors::nexmark::{
    DEFAULT_BASE_TIME_MS, DEFAULT_EVENT_RATE, EventKind, NexmarkConfig, NexmarkGenerator,
    standard_fields,
};
use eddy_testkit::{EddyProcess, query_text};
use tokio_postgres::Client;

use crate::nexmark::sql_file;
use crate::{Measure, exec};

/// The queries over bids only, by name: a file of `examples/nexmark`, or `tumble`.
const DEFAULT_QUERIES: &[&str] = &["q0", "q1", "q2", "tumble", "q5", "q7"];

/// A 10-second TUMBLE count per auction (not a numbered Nexmark query).
const TUMBLE: &str = "CREATE MATERIALIZED VIEW nexmark_tumble AS SELECT auction, window_start, count(*) AS bids FROM TUMBLE(bid, date_time, INTERVAL '10' SECOND) GROUP BY auction, window_start";

/// Bytes per read of the decode baseline, as the file connector reads.
const CHUNK_BYTES: usize = 4 << 20;

pub(crate) async fn file(
    eddy: &Path,
    bids: u64,
    queries: Vec<String>,
    workers: &[u32],
    path: Option<PathBuf>,
) -> Result<Vec<Measure>> {
    let dir = tempfile::tempdir()?;
    let path = path.unwrap_or_else(|| dir.path().join("bids.jsonl"));
    eprintln!("writing {bids} Nexmark bids to {} ...", path.display());
    let bytes = write_bids(&path, bids)?;
    let mb = bytes as f64 / 1e6;
    let note = format!("{bids} bids, {mb:.0} MB of JSON lines");
    let mut out = Vec::new();

    let decode = decode_rate(&path, false)?;
    out.push(Measure {
        name: "arrow-json decoding the file, one core (the decode limit)".into(),
        value: decode,
        unit: "events/s",
        note: format!("a decoder per 4 MiB chunk, into the bid schema; {note}"),
    });
    let streaming = decode_rate(&path, true)?;
    out.push(Measure {
        name: "arrow-json decoding the file, one decoder streaming through it".into(),
        value: streaming,
        unit: "events/s",
        note: format!("{:.2}x a decoder per chunk", streaming / decode),
    });

    let simd = simd_json_rate(&path)?;
    out.push(Measure {
        name: "simd-json parsing the file into typed bids, one core (no Arrow)".into(),
        value: simd,
        unit: "events/s",
        note: format!(
            "{:.2}x arrow-json; serde into a struct of borrowed strings, each line copied first (simd-json parses in place)",
            simd / decode
        ),
    });

    let queries = if queries.is_empty() {
        DEFAULT_QUERIES.iter().map(|q| (*q).to_owned()).collect()
    } else {
        queries
    };
    let examples = Path::new("examples/nexmark");
    for q in &queries {
        // `q0+q1`: the views are created at once, from a connection each, and read the file
        // together; the measure is the time until the last has read it all.
        let names: Vec<&str> = q.split('+').collect();
        let mut views = Vec::new();
        for name in &names {
            views.push(if *name == "tumble" {
                TUMBLE.to_owned()
            } else {
                sql_file(&examples.join(format!("{name}.sql")))?
            });
        }
        let mut wall_1 = None;
        for &w in workers {
            eprintln!("file {q}, {w} worker(s) ...");
            let server = EddyProcess::start_fresh_args(eddy, &["--workers".into(), w.to_string()])?;
            let client = server.connect().await?;
            exec(&client, &source_sql(&path)).await?;
            let mut clients = Vec::new();
            for _ in &views {
                clients.push(server.connect().await?);
            }
            let before = server.stats()?;
            let started = Instant::now();
            let creates = clients.iter().zip(&views).map(|(c, sql)| exec(c, sql));
            for created in futures::future::join_all(creates).await {
                created?;
            }
            let mut last = started;
            for name in &names {
                last = last.max(drained(&client, &format!("nexmark_{name}"), bytes).await?);
            }
            let drained = last.duration_since(started).as_secs_f64();
            let after = server.stats()?;
            let cpu = after.cpu_seconds - before.cpu_seconds;
            let mut view_rows = Vec::new();
            for name in &names {
                let rows = query_text(
                    &client,
                    &format!("SELECT count(*) AS n FROM nexmark_{name}"),
                )
                .await?;
                view_rows.push(rows.first().and_then(|r| r[0].clone()).unwrap_or_default());
            }
            let view_rows = view_rows.join(" + ");
            out.push(Measure {
                name: format!("{q}, {w} worker(s): events/s (wall)"),
                value: bids as f64 / drained,
                unit: "events/s",
                note: format!(
                    "drained in {drained:.2} s{}; {view_rows} rows in the view",
                    match wall_1 {
                        Some(one) => format!(", {:.2}x the wall time of 1 worker", drained / one),
                        None => String::new(),
                    }
                ),
            });
            out.push(Measure {
                name: format!("{q}, {w} worker(s): events per CPU-second"),
                value: bids as f64 / cpu.max(0.01),
                unit: "events/s",
                note: format!(
                    "{cpu:.2} CPU s ({:.2} cores), {:.0}% of the decode limit; peak RSS {:.0} MB",
                    cpu / drained,
                    100.0 * bids as f64 / cpu.max(0.01) / decode,
                    after.peak_rss_bytes as f64 / 1e6
                ),
            });
            if w == 1 {
                wall_1 = Some(drained);
            }
        }
    }
    Ok(out)
}

/// The `bid` source over the file, with the watermark of `examples/nexmark/schema.sql`.
fn source_sql(path: &Path) -> String {
    format!(
        "CREATE SOURCE bid (auction BIGINT, bidder BIGINT, price BIGINT, channel VARCHAR, url VARCHAR, date_time TIMESTAMP, extra VARCHAR, WATERMARK FOR date_time AS date_time - INTERVAL '4' SECOND) WITH (connector = 'file', path = '{}') FORMAT PLAIN ENCODE JSON",
        path.display()
    )
}

/// Writes `bids` bids of the standard generator (one split, default rate) as JSON lines;
/// returns the file's size.
fn write_bids(path: &Path, bids: u64) -> Result<u64> {
    let schema = Arc::new(Schema::new(standard_fields(EventKind::Bid)));
    // 46 of every 50 events are bids.
    let events = bids.div_ceil(46) * 50;
    let generator = NexmarkGenerator::new(
        NexmarkConfig {
            kind: EventKind::Bid,
            seed: 0,
            event_rate: DEFAULT_EVENT_RATE,
            event_num: Some(events),
            base_time_ms: DEFAULT_BASE_TIME_MS,
            splits: 1,
        },
        schema,
        0,
    )?;
    let file = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(path)?);
    let mut writer = arrow_json::LineDelimitedWriter::new(file);
    let (mut position, mut written) = (0u64, 0u64);
    while written < bids {
        let (batch, next) = generator.generate(position, 100_000)?;
        if next == position {
            break;
        }
        position = next;
        let batch = batch.slice(0, batch.num_rows().min((bids - written) as usize));
        written += batch.num_rows() as u64;
        writer.write(&batch)?;
    }
    writer.finish()?;
    let mut file = writer.into_inner();
    std::io::Write::flush(&mut file)?;
    if written < bids {
        bail!("the generator made {written} bids, not {bids}");
    }
    Ok(std::fs::metadata(path)?.len())
}

/// arrow-json decoding the whole file in chunks of whole lines, on this thread: events/s. With
/// `reuse`, one decoder streams through the file (its buffers kept from batch to batch);
/// otherwise a decoder per chunk, as the server decodes each part of a chunk.
fn decode_rate(path: &Path, reuse: bool) -> Result<f64> {
    let bytes = std::fs::read(path)?;
    let schema = Arc::new(Schema::new(standard_fields(EventKind::Bid)));
    let builder = || {
        arrow_json::ReaderBuilder::new(Arc::clone(&schema))
            .with_batch_size(16_384)
            .with_coerce_primitive(true)
            .build_decoder()
    };
    let started = Instant::now();
    let mut rows = 0usize;
    let mut rest = &bytes[..];
    let mut decoder = builder()?;
    while !rest.is_empty() {
        let cut = match rest.len() <= CHUNK_BYTES {
            true => rest.len(),
            false => memchr::memrchr(b'\n', &rest[..CHUNK_BYTES]).map_or(rest.len(), |i| i + 1),
        };
        if !reuse {
            decoder = builder()?;
        }
        let mut chunk = &rest[..cut];
        while !chunk.is_empty() {
            let used = decoder.decode(chunk)?;
            chunk = &chunk[used..];
            rows += decoder.flush()?.map_or(0, |b| b.num_rows());
        }
        rest = &rest[cut..];
    }
    Ok(rows as f64 / started.elapsed().as_secs_f64())
}

/// simd-json parsing each line of the file into a typed bid (borrowed strings): events/s.
fn simd_json_rate(path: &Path) -> Result<f64> {
    #[derive(serde::Deserialize)]
    #[allow(dead_code)]
    struct Bid<'a> {
        auction: i64,
        bidder: i64,
        price: i64,
        channel: &'a str,
        url: &'a str,
        date_time: &'a str,
        extra: &'a str,
    }
    let bytes = std::fs::read(path)?;
    let started = Instant::now();
    let (mut rows, mut scratch) = (0usize, Vec::new());
    let mut buffers = simd_json::Buffers::default();
    for line in bytes.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        scratch.clear();
        scratch.extend_from_slice(line);
        let bid: Bid<'_> = simd_json::serde::from_slice_with_buffers(&mut scratch, &mut buffers)?;
        std::hint::black_box(&bid);
        rows += 1;
    }
    Ok(rows as f64 / started.elapsed().as_secs_f64())
}

/// Waits until `view` has committed every byte of the file (`bytes`) from `bid`.
async fn drained(client: &Client, view: &str, bytes: u64) -> Result<Instant> {
    let deadline = Instant::now() + Duration::from_secs(3600);
    loop {
        let rows = query_text(client, &format!("SELECT committed_offset FROM eddy_source_offsets WHERE consumer = '{view}' AND object = 'bid'")).await?;
        let done = rows
            .first()
            .and_then(|r| r[0].as_deref())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
        if done >= bytes {
            return Ok(Instant::now());
        }
        if Instant::now() > deadline {
            bail!("{view} did not drain");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
