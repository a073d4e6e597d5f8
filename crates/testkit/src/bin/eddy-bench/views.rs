//! `eddy-bench views`: incremental views under random updates against DataFusion recomputing.

use std::time::{Duration, Instant};

use anyhow::Result;
use eddy_testkit::{EddyProcess, query_text};
use tokio_postgres::Client;

use crate::{Measure, exec};

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

pub(crate) async fn views(
    eddy: &std::path::Path,
    rows: u64,
    groups: u64,
    backfill_rows: u64,
    updates: u64,
    batch: u64,
    which: &[String],
) -> Result<Vec<Measure>> {
    let server = EddyProcess::start_fresh(eddy)?;
    let client = server.connect().await?;
    let mut out = Vec::new();
    let mut seed = 42u64;
    let agg =
        "SELECT g, count(*) AS n, sum(v) AS total, min(v) AS lo, max(v) AS hi FROM t GROUP BY g";
    let join = "SELECT t.k, t.v, d.name FROM t JOIN d ON t.g = d.g";
    let left_join = "SELECT t.k, t.v, d.name FROM t LEFT JOIN d ON t.g = d.g";
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
