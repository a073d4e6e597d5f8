//! PostgreSQL sinks against a real PostgreSQL (started here on a free port): the target table
//! follows the view through inserts, updates and deletes (by the view's GROUP BY key, by a
//! declared primary_key, and by whole rows with their count); the progress table records the
//! epochs; a SIGKILL in the middle of a stream of writes and a restart leave the table equal to
//! the view. Error cases of CREATE SINK are in sql-tests/sinks.slt.

use std::time::{Duration, Instant};

use eddy_testkit::postgres::PostgresServer;
use eddy_testkit::{EddyProcess, query_text};

fn binary() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_BIN_EXE_eddy"))
}

fn sorted(mut rows: Vec<Vec<Option<String>>>) -> Vec<Vec<Option<String>>> {
    rows.sort();
    rows
}

/// Waits (up to 30 s) until PostgreSQL's `pg_query` returns what Eddy's `eddy_query` does.
async fn converges(eddy: &tokio_postgres::Client, pg: &tokio_postgres::Client, eddy_query: &str, pg_query: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let want = sorted(query_text(eddy, eddy_query).await.unwrap());
        let got = sorted(query_text(pg, pg_query).await.unwrap());
        if got == want {
            assert!(!want.is_empty(), "{eddy_query} is empty, which checks nothing");
            return;
        }
        if Instant::now() > deadline {
            panic!("PostgreSQL has {got:?}, the view {want:?} ({pg_query})");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn postgres_sinks_follow_their_views() {
    let pg = PostgresServer::start().unwrap();
    let server = EddyProcess::start_fresh(&binary()).unwrap();
    let eddy = server.connect().await.unwrap();
    let target = pg.connect().await.unwrap();
    eddy.batch_execute(&format!(
        "CREATE TABLE orders (id INT PRIMARY KEY, customer VARCHAR, amount BIGINT, placed TIMESTAMP);
         INSERT INTO orders VALUES (1, 'ann', 10, TIMESTAMP '2026-01-01 10:00:00'), (2, 'bob', 20, TIMESTAMP '2026-01-01 11:00:00'), (3, 'ann', 5, NULL);
         CREATE MATERIALIZED VIEW totals AS SELECT customer, count(*) AS n, sum(amount) AS total, max(placed) AS last FROM orders GROUP BY customer;
         CREATE MATERIALIZED VIEW big AS SELECT customer, amount FROM orders WHERE amount >= 10;
         CREATE SINK totals_pg FROM totals WITH ({});
         CREATE SINK big_pg FROM big WITH ({});
         CREATE SINK orders_pg FROM big WITH ({}, primary_key = 'customer, amount');",
        pg.sink_options("totals"),
        pg.sink_options("big"),
        pg.sink_options("big_keyed"),
    ))
    .await
    .unwrap();
    // The current contents arrive first.
    converges(&eddy, &target, "SELECT customer, n, total FROM totals", "SELECT customer, n::text, total::text FROM totals").await;
    // Updates, deletes, a key that goes away, NULL keys and timestamps.
    eddy.batch_execute(
        "UPDATE orders SET amount = 30 WHERE id = 2;
         DELETE FROM orders WHERE id = 1;
         INSERT INTO orders VALUES (4, NULL, 7, TIMESTAMP '2026-01-02 00:00:00'), (5, 'cy', 10, NULL), (6, 'cy', 10, NULL);
         DELETE FROM orders WHERE customer = 'ann';
         FLUSH",
    )
    .await
    .unwrap();
    converges(&eddy, &target, "SELECT customer, n, total, last FROM totals", "SELECT customer, n::text, total::text, to_char(last, 'YYYY-MM-DD HH24:MI:SS') FROM totals").await;
    // Whole rows with their count: two orders of cy for 10 are one row counted twice.
    converges(&eddy, &target, "SELECT customer, amount, count(*) AS n FROM big GROUP BY customer, amount", "SELECT customer, amount::text, eddy_count::text FROM big").await;
    converges(&eddy, &target, "SELECT DISTINCT customer, amount FROM big", "SELECT customer, amount::text FROM big_keyed").await;
    let progress: i64 = target.query_one("SELECT count(*) FROM eddy_sink_progress WHERE epoch > 0", &[]).await.unwrap().get(0);
    assert_eq!(progress, 3, "every sink records its progress");
    let shown = query_text(&eddy, "SHOW SINKS").await.unwrap();
    assert_eq!(shown.len(), 3);
    assert!(shown.iter().all(|r| r[5].as_deref() == Some("")), "no sink reports an error: {shown:?}");
    // The view cannot go while sinks write it out; DROP SINK stops a sink.
    let err = eddy.batch_execute("DROP MATERIALIZED VIEW totals").await.unwrap_err();
    assert_eq!(err.code().unwrap().code(), "2BP01");
    eddy.batch_execute("DROP SINK totals_pg; DROP MATERIALIZED VIEW totals").await.unwrap();
    assert_eq!(query_text(&eddy, "SHOW SINKS").await.unwrap().len(), 2);
}

#[tokio::test]
async fn a_postgres_sink_is_exact_after_sigkill() {
    let pg = PostgresServer::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let args: Vec<String> = ["--checkpoint-interval", "0.2"].iter().map(|s| (*s).to_owned()).collect();
    let mut server = EddyProcess::start_args(&binary(), dir.path(), &args).unwrap();
    let eddy = server.connect().await.unwrap();
    eddy.batch_execute(&format!(
        "CREATE TABLE accounts (id INT PRIMARY KEY, balance BIGINT);
         CREATE MATERIALIZED VIEW buckets AS SELECT id % 13 AS bucket, count(*) AS n, sum(balance) AS total FROM accounts GROUP BY id % 13;
         CREATE SINK buckets_pg FROM buckets WITH ({});",
        pg.sink_options("buckets")
    ))
    .await
    .unwrap();
    for round in 0..3 {
        // Upserts of changing balances while the server is killed.
        let writer = {
            let client = server.connect().await.unwrap();
            tokio::spawn(async move {
                for i in 0.. {
                    let id = (i * 7 + round) % 200;
                    let sql = if i % 5 == 4 { format!("DELETE FROM accounts WHERE id = {id}") } else { format!("BEGIN; DELETE FROM accounts WHERE id = {id}; INSERT INTO accounts VALUES ({id}, {i}); COMMIT") };
                    if client.batch_execute(&sql).await.is_err() {
                        return;
                    }
                }
            })
        };
        tokio::time::sleep(Duration::from_millis(400 + 300 * round as u64)).await;
        server.kill().unwrap();
        let _ = writer.await;
        server = server.restart().unwrap();
    }
    let eddy = server.connect().await.unwrap();
    eddy.batch_execute("FLUSH").await.unwrap();
    let target = pg.connect().await.unwrap();
    converges(&eddy, &target, "SELECT bucket, n, total FROM buckets", "SELECT bucket::text, n::text, total::text FROM buckets").await;
    // The batch answer over the recovered table, too.
    converges(&eddy, &target, "SELECT id % 13 AS bucket, count(*) AS n, sum(balance) AS total FROM accounts GROUP BY id % 13", "SELECT bucket::text, n::text, total::text FROM buckets").await;
}
