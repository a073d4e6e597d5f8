//! Retention of APPEND ONLY tables: old log segments go once no checkpoint needs them (never
//! before the views reading the table are in a checkpoint), the table keeps the rows of the
//! segments kept, views keep what they computed, a view created afterwards is built from what
//! the log keeps and says so, and a SIGKILL and restart change none of it. Compaction of a keyed
//! table's log keeps the last row of each key: the table, its views and a new view agree after
//! a restart.

use eddy_testkit::{EddyProcess, query_text};
use tokio_postgres::Client;

fn binary() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_BIN_EXE_eddy"))
}

async fn one(client: &Client, sql: &str) -> String {
    query_text(client, sql).await.unwrap()[0][0]
        .clone()
        .unwrap_or_default()
}

/// A server with 4 KiB log segments that checkpoints only on `CHECKPOINT`.
async fn start(dir: &std::path::Path) -> (EddyProcess, Client) {
    let args: Vec<String> = ["--log-segment-bytes", "4096", "--checkpoint-interval", "0"]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    let server = EddyProcess::start_args(&binary(), dir, &args).unwrap();
    let client = server.connect().await.unwrap();
    (server, client)
}

/// 200 inserts of 20 rows each (one log record each, about 0.5 KiB): with 4 KiB segments,
/// dozens of segments per partition.
async fn fill(client: &Client, from: i64) {
    for batch in 0..200 {
        let values: Vec<String> = (0..20)
            .map(|i| {
                format!(
                    "({}, {})",
                    (from + batch * 20 + i) % 5,
                    from + batch * 20 + i
                )
            })
            .collect();
        client
            .batch_execute(&format!("INSERT INTO events VALUES {}", values.join(", ")))
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn retention_deletes_only_what_no_checkpoint_needs() {
    let dir = tempfile::tempdir().unwrap();
    let (mut server, client) = start(dir.path()).await;
    client
        .batch_execute(
            "CREATE TABLE events (k INT, v BIGINT) APPEND ONLY WITH (partitions = 2, retention.bytes = '16384');
             CREATE MATERIALIZED VIEW totals AS SELECT k, count(*) AS n, sum(v) AS s FROM events GROUP BY k;",
        )
        .await
        .unwrap();
    fill(&client, 0).await;
    client.batch_execute("FLUSH").await.unwrap();
    // No checkpoint holds the view yet: a restart would replay the whole log, so none of it goes
    // (retention ran at start-up and runs again on CHECKPOINT below, which first makes one).
    assert_eq!(one(&client, "SELECT count(*) FROM events").await, "4000");
    // After a checkpoint, segments beyond the newest 16 KiB per partition go.
    client.batch_execute("CHECKPOINT").await.unwrap();
    let kept: i64 = one(&client, "SELECT count(*) FROM events")
        .await
        .parse()
        .unwrap();
    assert!(
        kept < 4000 && kept > 0,
        "the table keeps the rows of the newest segments, not {kept}"
    );
    // Views keep what they counted.
    assert_eq!(one(&client, "SELECT sum(n) FROM totals").await, "4000");
    // A view created now is built from what the log keeps, and says so.
    let (listener, notices) = server.connect_with_notices().await.unwrap();
    listener
        .batch_execute("CREATE MATERIALIZED VIEW late_totals AS SELECT count(*) AS n FROM events")
        .await
        .unwrap();
    assert_eq!(
        one(&client, "SELECT n FROM late_totals").await,
        kept.to_string()
    );
    eddy_testkit::assert_noticed(&notices, &["retention deleted what came before"]);
    // More rows, then a crash: the views come back from the checkpoint plus what the log kept.
    fill(&client, 4000).await;
    client.batch_execute("FLUSH; CHECKPOINT").await.unwrap();
    fill(&client, 8000).await;
    client.batch_execute("FLUSH").await.unwrap();
    let late = one(&client, "SELECT n FROM late_totals").await;
    server.kill().unwrap();
    let server = server.restart().unwrap();
    let client = server.connect().await.unwrap();
    client.batch_execute("FLUSH").await.unwrap();
    assert_eq!(one(&client, "SELECT sum(n) FROM totals").await, "12000");
    assert_eq!(
        one(&client, "SELECT sum(s) FROM totals").await,
        (0..12000i64).sum::<i64>().to_string()
    );
    assert_eq!(one(&client, "SELECT n FROM late_totals").await, late);
    // The table holds what its log keeps, as does a view built from it now (after a
    // CHECKPOINT, whose retention run waits for any background one: nothing moves meanwhile).
    client.batch_execute("CHECKPOINT").await.unwrap();
    let table: i64 = one(&client, "SELECT count(*) FROM events")
        .await
        .parse()
        .unwrap();
    assert!(
        table < 12000,
        "retention kept the table bounded ({table} rows)"
    );
    client
        .batch_execute("CREATE MATERIALIZED VIEW again AS SELECT count(*) AS n FROM events")
        .await
        .unwrap();
    assert_eq!(one(&client, "SELECT n FROM again").await, table.to_string());
}

/// Bytes of every log segment under a data directory.
fn log_bytes(dir: &std::path::Path) -> u64 {
    fn walk(path: &std::path::Path) -> u64 {
        std::fs::read_dir(path)
            .map(|entries| {
                entries
                    .flatten()
                    .map(|e| {
                        if e.path().is_dir() {
                            walk(&e.path())
                        } else {
                            e.metadata().map_or(0, |m| m.len())
                        }
                    })
                    .sum()
            })
            .unwrap_or(0)
    }
    walk(&dir.join("log"))
}

#[tokio::test]
async fn compaction_keeps_the_last_row_of_each_key() {
    let dir = tempfile::tempdir().unwrap();
    let (mut server, client) = start(dir.path()).await;
    client
        .batch_execute(
            "CREATE TABLE balances (account INT PRIMARY KEY, amount BIGINT) WITH (partitions = 2);
             CREATE MATERIALIZED VIEW total AS SELECT count(*) AS accounts, sum(amount) AS amount FROM balances;",
        )
        .await
        .unwrap();
    // 20 accounts updated 100 times each, some deleted and created again.
    for round in 0..100i64 {
        let values: Vec<String> = (0..20)
            .map(|a| format!("({a}, {})", round * 100 + a))
            .collect();
        client.batch_execute(&format!("BEGIN; DELETE FROM balances WHERE account < 20; INSERT INTO balances VALUES {}; COMMIT", values.join(", "))).await.unwrap();
        if round % 10 == 9 {
            client
                .batch_execute(&format!(
                    "DELETE FROM balances WHERE account = {}",
                    round / 10
                ))
                .await
                .unwrap();
        }
    }
    client.batch_execute("FLUSH").await.unwrap();
    let grown = log_bytes(dir.path());
    client.batch_execute("CHECKPOINT").await.unwrap();
    let compacted = log_bytes(dir.path());
    eprintln!("log: {grown} bytes, {compacted} after compaction");
    // Records stay (offsets do not change), each with its Arrow IPC header; the rows go.
    assert!(
        compacted * 10 < grown * 7,
        "compaction shrank the log from {grown} to {compacted} bytes"
    );
    let expected = "19 188281";
    assert_eq!(
        query_text(
            &client,
            "SELECT count(*) AS n, sum(amount) AS s FROM balances"
        )
        .await
        .unwrap()[0]
            .iter()
            .map(|c| c.clone().unwrap())
            .collect::<Vec<_>>()
            .join(" "),
        expected
    );
    server.kill().unwrap();
    let server = server.restart().unwrap();
    let client = server.connect().await.unwrap();
    client.batch_execute("FLUSH; CREATE MATERIALIZED VIEW again AS SELECT count(*) AS accounts, sum(amount) AS amount FROM balances").await.unwrap();
    for query in [
        "SELECT count(*) AS n, sum(amount) AS s FROM balances",
        "SELECT accounts, amount FROM total",
        "SELECT accounts, amount FROM again",
    ] {
        let got = query_text(&client, query).await.unwrap()[0]
            .iter()
            .map(|c| c.clone().unwrap())
            .collect::<Vec<_>>()
            .join(" ");
        assert_eq!(got, expected, "{query}");
    }
}
