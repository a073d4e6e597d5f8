//! `eddy-bench spill`: a join view over a keyed table under random updates, on a server with no
//! memory limit and on one whose limit is far below the join's state (ADR 0012), side by side
//! in one run: the rate of each, the share spilled, and the ratio.

use std::time::Instant;

use anyhow::Result;
use eddy_testkit::{EddyProcess, query_text};

use crate::views::{create_tables, fill, state_of, update_throughput};
use crate::{Measure, exec};

/// What `eddy-bench spill` measures.
#[derive(clap::Args, Debug)]
pub(crate) struct SpillRun {
    /// Rows in the updated table (the join's big side).
    #[arg(long, default_value_t = 1_000_000)]
    pub rows: u64,
    /// Keys of the joined dimension table.
    #[arg(long, default_value_t = 100_000)]
    pub groups: u64,
    /// Update statements per run; each changes `batch` rows.
    #[arg(long, default_value_t = 50)]
    pub updates: u64,
    #[arg(long, default_value_t = 10_000)]
    pub batch: u64,
    /// The limited server's `--memory-limit` (operator state keeps half of it in memory).
    #[arg(long, default_value = "64MB")]
    pub memory_limit: String,
}

const JOIN: &str = "SELECT t.k, t.v, d.name FROM t JOIN d ON t.g = d.g";

pub(crate) async fn spill(eddy: &std::path::Path, run: &SpillRun) -> Result<Vec<Measure>> {
    let mut out = Vec::new();
    let mut rates = Vec::new();
    for limit in ["0", run.memory_limit.as_str()] {
        let label = if limit == "0" {
            "no memory limit".to_owned()
        } else {
            format!("--memory-limit {limit}")
        };
        let args = ["--memory-limit".to_owned(), limit.to_owned()];
        let server = EddyProcess::start_fresh_args(eddy, &args)?;
        let client = server.connect().await?;
        create_tables(&client).await?;
        eprintln!("{label}: loading {} rows ...", run.rows);
        fill(&client, "t", run.rows, run.groups).await?;
        exec(
            &client,
            &format!(
                "INSERT INTO d SELECT x, 'name ' || (x % 1000) FROM generate_series(0, {}) AS s(x)",
                run.groups - 1
            ),
        )
        .await?;
        let started = Instant::now();
        exec(&client, &format!("CREATE MATERIALIZED VIEW j AS {JOIN}")).await?;
        let backfill = started.elapsed();
        let (state_rows, state_bytes) = state_of(&client, "j").await?;
        let spilled = spilled_rows(&client).await?;
        out.push(Measure {
            name: format!("join, {label}: backfill over {} rows", run.rows),
            value: backfill.as_secs_f64() * 1000.0,
            unit: "ms",
            note: format!(
                "{state_rows} state rows, {:.1} MB in memory, {spilled} rows spilled",
                state_bytes as f64 / 1e6
            ),
        });
        let mut seed = 42u64;
        let before = server.stats()?;
        let (rate, elapsed) =
            update_throughput(&client, run.rows, run.updates, run.batch, &mut seed).await?;
        let after = server.stats()?;
        rates.push(rate);
        out.push(Measure {
            name: format!("join, {label}: changes/s under random updates"),
            value: rate,
            unit: "changes/s",
            note: format!(
                "{} UPDATEs x {} rows in {elapsed:.1?}, {:.1} CPU s, peak RSS {:.0} MB, {} rows spilled after; table t: {}",
                run.updates,
                run.batch,
                after.cpu_seconds - before.cpu_seconds,
                after.peak_rss_bytes as f64 / 1e6,
                spilled_rows(&client).await?,
                table_on_disk(&client).await
            ),
        });
    }
    out.push(Measure {
        name: format!(
            "join: rate with --memory-limit {} / without",
            run.memory_limit
        ),
        value: rates[1] / rates[0],
        unit: "x",
        note: String::new(),
    });
    Ok(out)
}

/// What of table `t` is on disk (`eddy_tables`; a server without it says so).
async fn table_on_disk(client: &tokio_postgres::Client) -> String {
    let rows = query_text(
        client,
        "SELECT rows_on_disk, index_entries_on_disk FROM eddy_tables WHERE table_name = 't'",
    )
    .await;
    match rows.as_deref() {
        Ok([row]) => format!(
            "{} rows and {} index entries on disk",
            row[0].as_deref().unwrap_or("?"),
            row[1].as_deref().unwrap_or("?")
        ),
        _ => "rows on disk not reported".to_owned(),
    }
}

async fn spilled_rows(client: &tokio_postgres::Client) -> Result<u64> {
    let rows = query_text(
        client,
        "SELECT coalesce(sum(spilled_rows), 0) FROM eddy_operators",
    )
    .await?;
    Ok(rows
        .first()
        .and_then(|r| r[0].as_deref())
        .unwrap_or("0")
        .parse()
        .unwrap_or(0))
}
