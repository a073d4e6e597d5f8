//! `eddy-bench views`: incremental views under random updates against DataFusion recomputing.

use std::time::{Duration, Instant};

use anyhow::Result;
use eddy_testkit::{EddyProcess, query_text};
use tokio_postgres::Client;

use crate::{Measure, exec};

/// Fills `table` (k, g, v) with `rows` rows in statements of at most 1M rows.
pub(crate) async fn fill(client: &Client, table: &str, rows: u64, groups: u64) -> Result<Duration> {
    let start = Instant::now();
    let mut from = 1;
    while from <= rows {
        let to = (from + 999_999).min(rows);
        exec(client, &format!("INSERT INTO {table} SELECT x, x % {groups}, x FROM generate_series({from}, {to}) AS s(x)")).await?;
        from = to + 1;
    }
    Ok(start.elapsed())
}

/// The updated table `t` (k, g, v) and the dimension table `d` (g, name) it joins.
pub(crate) async fn create_tables(client: &Client) -> Result<()> {
    exec(
        client,
        "CREATE TABLE t (k BIGINT PRIMARY KEY, g BIGINT NOT NULL, v BIGINT NOT NULL)",
    )
    .await?;
    exec(
        client,
        "CREATE TABLE d (g BIGINT PRIMARY KEY, name TEXT NOT NULL)",
    )
    .await?;
    Ok(())
}

/// Runs `updates` statements that each change `batch` consecutive keys of `t` (2 change rows
/// per updated row), then FLUSH; returns change rows per second through the views.
pub(crate) async fn update_throughput(
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

pub(crate) async fn state_of(client: &Client, view: &str) -> Result<(u64, u64)> {
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

/// What `eddy-bench views` measures.
#[derive(clap::Args, Debug)]
pub(crate) struct ViewsRun {
    /// Rows in the updated table.
    #[arg(long, default_value_t = 1_000_000)]
    pub rows: u64,
    /// Groups of the GROUP BY view (and keys of the joined dimension table).
    #[arg(long, default_value_t = 100_000)]
    pub groups: u64,
    /// Rows of the table a view backfills from.
    #[arg(long, default_value_t = 10_000_000)]
    pub backfill_rows: u64,
    /// Update statements per measured run; each changes `batch` rows.
    #[arg(long, default_value_t = 50)]
    pub updates: u64,
    #[arg(long, default_value_t = 10_000)]
    pub batch: u64,
    /// Rows of the keyed table whose single-row UPDATE + FLUSH latency is measured (with a
    /// GROUP BY view over it); 0 skips that run.
    #[arg(long, default_value_t = 10_000_000)]
    pub latency_rows: u64,
    /// Rows streamed into an APPEND ONLY table with no retention while the server's RSS
    /// is sampled every 10M rows; 0 skips that run.
    #[arg(long, default_value_t = 100_000_000)]
    pub stream_rows: u64,
    /// Which views to measure: agg, join, left_join, join_agg (comma-separated).
    #[arg(
        long,
        default_value = "agg,join,left_join,join_agg",
        value_delimiter = ','
    )]
    pub views: Vec<String>,
}

/// Single-row `UPDATE` of `table` (keys 1..=rows) then `FLUSH`, `n` times at random keys:
/// the time until every view over the table shows the change, as (p50, p99). `key` is the
/// expression the key is compared with: `k` (answered by the primary-key index) or `k + 0`
/// (the same rows, but a scan of the table: the baseline).
async fn single_row_latency(
    client: &Client,
    table: &str,
    key: &str,
    rows: u64,
    n: usize,
    seed: &mut u64,
) -> Result<(Duration, Duration)> {
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let k = 1 + (*seed >> 33) % rows;
        let start = Instant::now();
        exec(
            client,
            &format!("UPDATE {table} SET v = v + 1 WHERE {key} = {k}"),
        )
        .await?;
        exec(client, "FLUSH").await?;
        times.push(start.elapsed());
    }
    times.sort();
    let at = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize];
    Ok((at(0.5), at(0.99)))
}

fn latency_measure(name: String, (p50, p99): (Duration, Duration)) -> Measure {
    Measure {
        name,
        value: p50.as_secs_f64() * 1000.0,
        unit: "ms p50",
        note: format!("p99 {:.2} ms", p99.as_secs_f64() * 1000.0),
    }
}

pub(crate) async fn views(eddy: &std::path::Path, run: &ViewsRun) -> Result<Vec<Measure>> {
    let &ViewsRun {
        rows,
        groups,
        backfill_rows,
        updates,
        batch,
        latency_rows,
        stream_rows,
        views: ref which,
    } = run;
    let server = EddyProcess::start_fresh(eddy)?;
    let client = server.connect().await?;
    let mut out = Vec::new();
    let mut seed = 42u64;
    let agg =
        "SELECT g, count(*) AS n, sum(v) AS total, min(v) AS lo, max(v) AS hi FROM t GROUP BY g";
    let join = "SELECT t.k, t.v, d.name FROM t JOIN d ON t.g = d.g";
    let left_join = "SELECT t.k, t.v, d.name FROM t LEFT JOIN d ON t.g = d.g";
    let join_agg = "SELECT d.name, count(*) AS n, sum(t.v) AS total FROM t JOIN d ON t.g = d.g GROUP BY d.name";

    create_tables(&client).await?;
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

    let all = [
        ("agg", agg),
        ("join", join),
        ("left_join", left_join),
        ("join_agg", join_agg),
    ];
    for (name, query) in all
        .into_iter()
        .filter(|(n, _)| which.iter().any(|w| w == n))
    {
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
        let latency = single_row_latency(&client, "t", "k", rows, 200, &mut seed).await?;
        out.push(latency_measure(
            format!("{name}: single-row UPDATE + FLUSH ({rows}-row table)"),
            latency,
        ));
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

    if latency_rows > 0 {
        eprintln!("loading {latency_rows} rows into lt ...");
        exec(
            &client,
            "CREATE TABLE lt (k BIGINT PRIMARY KEY, g BIGINT NOT NULL, v BIGINT NOT NULL)",
        )
        .await?;
        fill(&client, "lt", latency_rows, groups).await?;
        let latency =
            single_row_latency(&client, "lt", "k + 0", latency_rows, 50, &mut seed).await?;
        out.push(latency_measure(
            format!("baseline: the same by a scan (k + 0 = x), {latency_rows}-row table"),
            latency,
        ));
        let latency = single_row_latency(&client, "lt", "k", latency_rows, 200, &mut seed).await?;
        out.push(latency_measure(
            format!("single-row UPDATE + FLUSH, {latency_rows}-row table, no view"),
            latency,
        ));
        exec(&client, "CREATE MATERIALIZED VIEW lt_agg AS SELECT g, count(*) AS n, sum(v) AS total, min(v) AS lo, max(v) AS hi FROM lt GROUP BY g").await?;
        let latency = single_row_latency(&client, "lt", "k", latency_rows, 200, &mut seed).await?;
        out.push(latency_measure(
            format!("single-row UPDATE + FLUSH, {latency_rows}-row table, GROUP BY view"),
            latency,
        ));
        exec(&client, "DROP MATERIALIZED VIEW lt_agg").await?;
        exec(&client, "DROP TABLE lt").await?;
    }

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
    if stream_rows > 0 {
        out.extend(stream_rss(&server, &client, stream_rows).await?);
    }
    let stats = server.stats()?;
    out.push(Measure {
        name: "server peak RSS".into(),
        value: stats.peak_rss_bytes as f64 / 1e6,
        unit: "MB",
        note: format!("{:.1} CPU s in total", stats.cpu_seconds),
    });
    Ok(out)
}

/// Streams `rows` rows into an APPEND ONLY table with no retention, 10M at a time, sampling
/// the server's RSS after each step: an append-only table's rows stay in its log, so the RSS
/// should not follow the stream. The table is dropped after (its log is large).
async fn stream_rss(server: &EddyProcess, client: &Client, rows: u64) -> Result<Vec<Measure>> {
    const STEP: u64 = 10_000_000;
    eprintln!("streaming {rows} rows into s, RSS every {STEP} ...");
    exec(
        client,
        "CREATE TABLE s (k BIGINT, g BIGINT, v BIGINT) APPEND ONLY WITH (partitions = 2)",
    )
    .await?;
    let start = Instant::now();
    let mut samples = Vec::new();
    let mut from = 1;
    while from <= rows {
        let to = (from + STEP - 1).min(rows);
        let mut at = from;
        while at <= to {
            let end = (at + 999_999).min(to);
            exec(
                client,
                &format!(
                    "INSERT INTO s SELECT x, x % 1000, x FROM generate_series({at}, {end}) AS s(x)"
                ),
            )
            .await?;
            at = end + 1;
        }
        samples.push((to, server.stats()?.rss_bytes));
        from = to + 1;
    }
    let elapsed = start.elapsed();
    let scan = exec(client, "SELECT count(*), sum(v) FROM s").await?;
    exec(client, "DROP TABLE s").await?;
    let mb = |b: u64| b as f64 / 1e6;
    let (first_rows, first) = samples[0];
    let &(last_rows, last) = samples.last().unwrap_or(&samples[0]);
    Ok(vec![
        Measure {
            name: format!("stream s: RSS after {first_rows} rows"),
            value: mb(first),
            unit: "MB",
            note: String::new(),
        },
        Measure {
            name: format!("stream s: RSS after {last_rows} rows"),
            value: mb(last),
            unit: "MB",
            note: format!(
                "{:.2}x of the first sample; samples (M rows: MB): {}; {:.0} rows/s",
                last as f64 / first.max(1) as f64,
                samples
                    .iter()
                    .map(|(r, b)| format!("{}: {:.0}", r / 1_000_000, mb(*b)))
                    .collect::<Vec<_>>()
                    .join(", "),
                rows as f64 / elapsed.as_secs_f64()
            ),
        },
        Measure {
            name: format!("stream s: SELECT count(*), sum(v) over {rows} rows (read from the log)"),
            value: scan.as_secs_f64() * 1000.0,
            unit: "ms",
            note: String::new(),
        },
    ])
}
