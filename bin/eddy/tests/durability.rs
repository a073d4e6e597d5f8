//! Restart and crash: a clean stop (SIGTERM) and a SIGKILL in the middle of concurrent writes
//! lose nothing that was acknowledged, and the server starts again on the same data.

use eddy_testkit::EddyProcess;

fn binary() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_BIN_EXE_eddy"))
}

async fn count(server: &EddyProcess, sql: &str) -> i64 {
    let client = server.connect().await.unwrap();
    client.query_one(sql, &[]).await.unwrap().get(0)
}

#[tokio::test]
async fn clean_restart_keeps_everything() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = EddyProcess::start(&binary(), dir.path()).unwrap();
    {
        let client = server.connect().await.unwrap();
        client
            .batch_execute(
                "CREATE TABLE kv (k INT PRIMARY KEY, v TEXT NOT NULL);
                 CREATE TABLE log (n BIGINT, at TIMESTAMP) APPEND ONLY WITH (partitions = 3);
                 INSERT INTO kv VALUES (1, 'a'), (2, 'b'), (3, 'c');
                 UPDATE kv SET v = 'bb' WHERE k = 2;
                 DELETE FROM kv WHERE k = 3;
                 INSERT INTO log SELECT generate_series, TIMESTAMP '2024-01-01 00:00:00' FROM generate_series(1, 1000);
                 BEGIN; INSERT INTO kv VALUES (4, 'd'); INSERT INTO log VALUES (-1, NULL); COMMIT;
                 BEGIN; INSERT INTO kv VALUES (5, 'never'); ROLLBACK;",
            )
            .await
            .unwrap();
    }
    server.stop().unwrap();
    let server = server.restart().unwrap();
    let client = server.connect().await.unwrap();
    let rows = client
        .query("SELECT k, v FROM kv ORDER BY k", &[])
        .await
        .unwrap();
    let got: Vec<(i32, String)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(
        got,
        vec![(1, "a".into()), (2, "bb".into()), (4, "d".into())]
    );
    assert_eq!(count(&server, "SELECT count(*) FROM log").await, 1001);
    assert_eq!(
        count(&server, "SELECT sum(n)::bigint FROM log").await,
        500_500 - 1
    );
    // Keys still hold after a restart.
    let err = client
        .execute("INSERT INTO kv VALUES (1, 'dup')", &[])
        .await
        .unwrap_err();
    assert_eq!(err.code().unwrap().code(), "23505");
}

#[tokio::test]
async fn sigkill_mid_stream_loses_nothing_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = EddyProcess::start(&binary(), dir.path()).unwrap();
    server
        .connect()
        .await
        .unwrap()
        .batch_execute(
            "CREATE TABLE events (writer INT NOT NULL, seq INT NOT NULL) APPEND ONLY;
             CREATE TABLE totals (writer INT PRIMARY KEY, seq INT);
             CREATE MATERIALIZED VIEW per_writer AS SELECT writer, count(*) AS n, max(seq) AS last FROM events GROUP BY writer;
             CREATE MATERIALIZED VIEW joined AS SELECT e.writer, count(*) AS n FROM events e JOIN totals t ON e.writer = t.writer AND e.seq <= t.seq GROUP BY e.writer",
        )
        .await
        .unwrap();
    // Four writers insert as fast as they can and remember what was acknowledged.
    let mut writers = Vec::new();
    for writer in 0..4 {
        let client = server.connect().await.unwrap();
        writers.push(tokio::spawn(async move {
            let insert = client
                .prepare("INSERT INTO events VALUES ($1, $2)")
                .await
                .unwrap();
            client
                .execute("INSERT INTO totals VALUES ($1, 0)", &[&writer])
                .await
                .unwrap();
            let mut acknowledged = 0;
            for seq in 1..i32::MAX {
                let ok = client.execute(&insert, &[&writer, &seq]).await.is_ok()
                    && client
                        .execute(
                            "UPDATE totals SET seq = $2 WHERE writer = $1",
                            &[&writer, &seq],
                        )
                        .await
                        .is_ok();
                if !ok {
                    break;
                }
                acknowledged = seq;
            }
            acknowledged
        }));
    }
    // Let them write for a while, then kill the server without warning.
    let watcher = server.connect().await.unwrap();
    loop {
        let n: i64 = watcher
            .query_one("SELECT count(*) FROM events", &[])
            .await
            .unwrap()
            .get(0);
        if n >= 400 {
            break;
        }
        tokio::task::yield_now().await;
    }
    server.kill().unwrap();
    let mut acknowledged = Vec::new();
    for w in writers {
        acknowledged.push(w.await.unwrap());
    }
    let server = server.restart().unwrap();
    let client = server.connect().await.unwrap();
    for (writer, acked) in acknowledged.iter().enumerate() {
        let writer = writer as i32;
        let row = client
            .query_one(
                "SELECT count(*), max(seq), count(DISTINCT seq) FROM events WHERE writer = $1",
                &[&writer],
            )
            .await
            .unwrap();
        let (n, max, distinct): (i64, Option<i32>, i64) = (row.get(0), row.get(1), row.get(2));
        let max = max.unwrap_or(0);
        // Everything acknowledged is there, at most one more (in flight when killed), no gaps.
        assert!(
            max >= *acked && max <= acked + 1,
            "writer {writer}: max {max}, acknowledged {acked}"
        );
        assert_eq!(n, i64::from(max), "writer {writer} has gaps or duplicates");
        assert_eq!(distinct, n);
        let total: i32 = client
            .query_one("SELECT seq FROM totals WHERE writer = $1", &[&writer])
            .await
            .unwrap()
            .get(0);
        assert!(
            total >= *acked && total <= acked + 1,
            "writer {writer}: total {total}, acknowledged {acked}"
        );
    }
    // Views are rebuilt and equal their queries over the recovered tables.
    client.batch_execute("FLUSH").await.unwrap();
    for (view, query) in [
        (
            "SELECT * FROM per_writer ORDER BY writer",
            "SELECT writer, count(*) AS n, max(seq) AS last FROM events GROUP BY writer ORDER BY writer",
        ),
        (
            "SELECT * FROM joined ORDER BY writer",
            "SELECT e.writer, count(*) AS n FROM events e JOIN totals t ON e.writer = t.writer AND e.seq <= t.seq GROUP BY e.writer ORDER BY writer",
        ),
    ] {
        let a = eddy_testkit::query_text(&client, view).await.unwrap();
        let b = eddy_testkit::query_text(&client, query).await.unwrap();
        assert_eq!(a.len(), 4, "{view}");
        assert_eq!(a, b, "{view}");
    }
    // The server keeps working after recovery, views included.
    client
        .execute("INSERT INTO events VALUES (9, 1)", &[])
        .await
        .unwrap();
    client.batch_execute("FLUSH").await.unwrap();
    let n: i64 = client
        .query_one("SELECT n FROM per_writer WHERE writer = 9", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 1);
}

#[tokio::test]
async fn statements_during_recovery_wait_with_notices() {
    let dir = tempfile::tempdir().unwrap();
    let args: Vec<String> = ["--checkpoint-interval", "0"]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    let mut server = EddyProcess::start_args(&binary(), dir.path(), &args).unwrap();
    {
        let client = server.connect().await.unwrap();
        client
            .batch_execute(
                "CREATE TABLE events (k BIGINT, v BIGINT) APPEND ONLY;
                 INSERT INTO events SELECT g % 1000, g FROM generate_series(1, 400000) g;
                 CREATE MATERIALIZED VIEW per_k AS SELECT k, count(*) AS n, sum(v) AS s FROM events GROUP BY k;
                 FLUSH",
            )
            .await
            .unwrap();
    }
    server.kill().unwrap();
    // Without a checkpoint the view is rebuilt from the log at start-up: the server listens
    // at once, and a statement sent meanwhile waits, told why, then sees the rebuilt view.
    let server = server.restart().unwrap();
    let (client, notices) = server.connect_with_notices().await.unwrap();
    let row = client
        .query_one("SELECT count(*), sum(n)::bigint FROM per_k", &[])
        .await
        .unwrap();
    assert_eq!(
        (row.get::<_, i64>(0), row.get::<_, i64>(1)),
        (1000, 400_000)
    );
    let notices = notices.lock().unwrap().clone();
    assert!(
        notices
            .iter()
            .any(|n| n.starts_with("waiting for recovery: rebuilding materialized view \"per_k\"")),
        "{notices:?}"
    );
    assert!(
        notices
            .last()
            .is_some_and(|n| n.starts_with("recovery finished after")),
        "{notices:?}"
    );
}
