//! Crash recovery from checkpoints: a server that checkpoints every 0.3 s is SIGKILLed ten
//! times at random moments — while rows are being inserted, right after a `CHECKPOINT`, and
//! while it is still recovering from the previous kill — with views over an append-only table
//! (aggregates, windows, an interval join, a top-N, a join with a keyed table that is
//! updated) and over a Nexmark source read at its own pace. After the last recovery every view
//! equals its query computed in batch over what the tables hold (the source's view: over a
//! table fed by the same generator), so nothing is counted twice and nothing is missing; a
//! PostgreSQL sink of the aggregate holds exactly the view, and a file sink of the top-N view
//! holds it too (its lines' weights summed per row).

use std::time::Duration;

use eddy_testkit::postgres::PostgresServer;
use eddy_testkit::{EddyProcess, eventually, query_text};
use tokio_postgres::Client;

fn binary() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_BIN_EXE_eddy"))
}

/// (view, query): each view is `CREATE MATERIALIZED VIEW <view> AS <query>`, and after the
/// crashes its contents equal the query run in batch.
const VIEWS: [(&str, &str); 6] = [
    (
        "per_key",
        "SELECT k, count(*) AS n, sum(v) AS s, min(v) AS lo, max(v) AS hi FROM events GROUP BY k",
    ),
    (
        "windows",
        "SELECT window_start, k, count(*) AS n, max(v) AS hi FROM TUMBLE(events, ts, INTERVAL '1' SECOND) GROUP BY window_start, k",
    ),
    (
        "named",
        "SELECT d.name, count(*) AS n, sum(e.v) AS s FROM events e JOIN dims d ON e.k = d.k GROUP BY d.name",
    ),
    (
        "pairs",
        "SELECT a.k, count(*) AS n FROM events a JOIN events b ON a.k = b.k AND b.ts BETWEEN a.ts - INTERVAL '50' MILLISECOND AND a.ts GROUP BY a.k",
    ),
    (
        "top",
        "SELECT k, v FROM (SELECT k, v, ROW_NUMBER() OVER (PARTITION BY k ORDER BY v DESC) AS r FROM events) AS t WHERE r <= 3",
    ),
    (
        "bids",
        "SELECT auction % 10 AS a, count(*) AS n, sum(price) AS s, max(price) AS top FROM bid_src GROUP BY auction % 10",
    ),
];

const BID_COLUMNS: &str = "auction BIGINT, bidder BIGINT, price BIGINT, channel VARCHAR, url VARCHAR, date_time TIMESTAMP, extra VARCHAR,
    WATERMARK FOR date_time AS date_time - INTERVAL '4' SECOND";
/// 60 000 events generated at 15 000 per second: the source is still being read during the
/// first crashes.
const NEXMARK: &str = "connector = 'nexmark', nexmark.table.type = 'bid', nexmark.event.num = '60000', nexmark.events.per.second = '15000'";

fn canonical(rows: Vec<Vec<Option<String>>>) -> Vec<Vec<Option<String>>> {
    let mut rows = rows;
    rows.sort();
    rows
}

/// Inserts batches of 40 rows (k = i % 7, v = i, ts = i * 10 ms: event time only moves on, so
/// no row is late) and now and then renames a key, until the server goes away.
async fn write(client: Client, first: i64) {
    let mut i = first;
    loop {
        let values: Vec<String> = (i..i + 40)
            .map(|n| {
                format!(
                    "({}, {n}, TIMESTAMP '2026-01-01' + INTERVAL '{}' MILLISECOND)",
                    n % 7,
                    n * 10
                )
            })
            .collect();
        if client
            .batch_execute(&format!("INSERT INTO events VALUES {}", values.join(", ")))
            .await
            .is_err()
        {
            return;
        }
        if i % 400 == 0
            && client
                .batch_execute(&format!(
                    "UPDATE dims SET name = 'name {}' WHERE k = {}",
                    i % 3,
                    (i / 40) % 7
                ))
                .await
                .is_err()
        {
            return;
        }
        i += 40;
    }
}

/// Where the writer goes on after a crash: past every row the table holds.
async fn next_row(client: &Client) -> i64 {
    let row = client
        .query_one("SELECT coalesce(max(v), -1) + 1 FROM events", &[])
        .await
        .unwrap();
    row.get(0)
}

#[tokio::test]
async fn views_survive_sigkill_at_random_moments() {
    let pg = PostgresServer::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let args: Vec<String> = ["--workers", "2", "--checkpoint-interval", "0.3"]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    let mut server = EddyProcess::start_args(&binary(), dir.path(), &args).unwrap();
    let client = server.connect().await.unwrap();
    client
        .batch_execute(&format!(
            "CREATE TABLE events (k INT, v BIGINT, ts TIMESTAMP, WATERMARK FOR ts AS ts - INTERVAL '100' MILLISECOND) APPEND ONLY WITH (partitions = 2);
             CREATE TABLE dims (k INT PRIMARY KEY, name VARCHAR);
             INSERT INTO dims SELECT v, 'name ' || CAST(v % 3 AS VARCHAR) FROM generate_series(0, 6) AS t(v);
             CREATE SOURCE bid_src ({BID_COLUMNS}) WITH ({NEXMARK});
             CREATE TABLE bid ({BID_COLUMNS}) APPEND ONLY WITH ({NEXMARK});"
        ))
        .await
        .unwrap();
    for (view, query) in VIEWS {
        client
            .batch_execute(&format!("CREATE MATERIALIZED VIEW {view} AS {query}"))
            .await
            .unwrap();
    }
    client
        .batch_execute(&format!(
            "CREATE SINK per_key_pg FROM per_key WITH ({})",
            pg.sink_options("per_key")
        ))
        .await
        .unwrap();
    let files = tempfile::tempdir().unwrap();
    client.batch_execute(&format!("CREATE SINK top_files FROM top WITH (connector = 'file', path = '{}', rollover_seconds = '0.2')", files.path().display())).await.unwrap();
    // A deterministic schedule of random-looking moments (xorshift).
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut random = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let mut writer = tokio::spawn(write(client, 0));
    for crash in 0..10 {
        let watcher = server.connect().await.unwrap();
        match crash % 3 {
            // Right after a checkpoint was committed.
            0 => watcher.batch_execute("CHECKPOINT").await.unwrap(),
            // At a random moment of ingest (possibly while a checkpoint is being written).
            _ => tokio::time::sleep(Duration::from_millis(200 + random(1200))).await,
        }
        server.kill().unwrap();
        let _ = writer.await;
        if crash % 3 == 2 {
            // Once more while recovering from that kill.
            server
                .crash_while_starting(Duration::from_millis(100 + random(600)))
                .unwrap();
        }
        server = server.restart().unwrap();
        let client = server.connect().await.unwrap();
        let first = next_row(&client).await;
        writer = tokio::spawn(write(client, first));
    }
    // Stop the last writer and let everything settle.
    writer.abort();
    let _ = writer.await;
    eventually(
        &server,
        "SELECT sum(committed_offset) AS done FROM eddy_source_offsets WHERE consumer = 'bids'",
        "60000",
    )
    .await;
    eventually(&server, "SELECT count(*) AS n FROM bid", "55200").await;
    let client = server.connect().await.unwrap();
    client.batch_execute("FLUSH").await.unwrap();
    let checkpoints = query_text(&client, "SELECT count(*) AS n FROM eddy_checkpoints")
        .await
        .unwrap();
    assert_eq!(
        checkpoints,
        vec![vec![Some("1".to_owned())]],
        "one committed checkpoint is kept"
    );
    for (view, query) in VIEWS {
        let batch = query.replace("bid_src", "bid");
        let got = canonical(
            query_text(&client, &format!("SELECT * FROM {view}"))
                .await
                .unwrap(),
        );
        let want = canonical(query_text(&client, &batch).await.unwrap());
        assert!(
            !want.is_empty(),
            "{view}: the batch answer is empty, which checks nothing"
        );
        assert_eq!(
            got.len(),
            want.len(),
            "{view}: {} rows in the view, {} in batch",
            got.len(),
            want.len()
        );
        if let Some((g, w)) = got.iter().zip(&want).find(|(g, w)| g != w) {
            panic!("{view}: the view has {g:?} where the batch answer has {w:?}");
        }
    }
    // The sink's table equals the view once the sink has written the last epoch.
    let target = pg.connect().await.unwrap();
    let want = canonical(
        query_text(&client, "SELECT k, n, s, lo, hi FROM per_key")
            .await
            .unwrap(),
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let got = canonical(
            query_text(
                &target,
                "SELECT k::text, n::text, s::text, lo::text, hi::text FROM per_key",
            )
            .await
            .unwrap(),
        );
        if got == want {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the sink's table has {got:?}, the view {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The file sink's lines, weights summed per row, equal the top-N view.
    let want = canonical(query_text(&client, "SELECT k, v FROM top").await.unwrap());
    loop {
        let mut weights: std::collections::BTreeMap<Vec<Option<String>>, i64> =
            std::collections::BTreeMap::new();
        for entry in std::fs::read_dir(files.path()).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "jsonl") {
                for line in std::fs::read_to_string(&path).unwrap().lines() {
                    let row: serde_json::Value = serde_json::from_str(line).unwrap();
                    *weights
                        .entry(vec![Some(row["k"].to_string()), Some(row["v"].to_string())])
                        .or_default() += row["eddy_weight"].as_i64().unwrap();
                }
            }
        }
        assert!(
            weights.values().all(|w| *w >= 0),
            "a row's weight in the files is below zero"
        );
        let got = canonical(
            weights
                .into_iter()
                .flat_map(|(row, w)| std::iter::repeat_n(row, w as usize))
                .collect(),
        );
        if got == want {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the sink's files hold {got:?}, the view {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let late = query_text(&client, "SELECT count(*) AS n FROM eddy_late_events")
        .await
        .unwrap();
    assert_eq!(late, vec![vec![Some("0".to_owned())]], "no row was late");
}
