//! A slow view slows only itself (issue 18): while one view takes 200 ms more per batch of
//! changes (the debug build's `EDDY_FAILPOINTS=view_changes:slow:sleep`), writes are
//! acknowledged and another view over the same table is up to date (read without FLUSH) long
//! before the slow one has caught up; `eddy_views.lag_epochs` shows the slow view behind,
//! FLUSH waits for it (with a NOTICE saying so), and then both answer the same as the table.

use std::time::{Duration, Instant};

use eddy_testkit::{EddyProcess, text};

fn binary() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_BIN_EXE_eddy"))
}

const WRITES: i64 = 12;

#[tokio::test]
async fn a_slow_view_falls_behind_without_holding_writers_or_other_views() {
    let dir = tempfile::tempdir().unwrap();
    let server = EddyProcess::start_env(
        &binary(),
        dir.path(),
        &[],
        &[(
            "EDDY_FAILPOINTS".to_owned(),
            "view_changes:slow:sleep".to_owned(),
        )],
    )
    .unwrap();
    let client = server.connect().await.unwrap();
    client
        .batch_execute(
            "CREATE TABLE t (id INT PRIMARY KEY, v INT);
             CREATE MATERIALIZED VIEW fast AS SELECT count(*) AS n, sum(v) AS s FROM t;
             CREATE MATERIALIZED VIEW slow AS SELECT count(*) AS n, sum(v) AS s FROM t;",
        )
        .await
        .unwrap();
    // One commit per row: the slow view sleeps on each, 2.4 s in all.
    let started = Instant::now();
    for i in 1..=WRITES {
        client
            .execute(
                "INSERT INTO t VALUES ($1, $2)",
                &[&(i as i32), &(i as i32 * 10)],
            )
            .await
            .unwrap();
    }
    let written = started.elapsed();
    let want = format!("{WRITES} {}", (1..=WRITES).map(|i| i * 10).sum::<i64>());
    // The fast view catches up while the slow one is still behind.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if text(&server, "SELECT n, s FROM fast").await == want {
            break;
        }
        assert!(Instant::now() < deadline, "the fast view never caught up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let slow_then = text(&server, "SELECT n FROM slow").await;
    let lag: i64 = text(
        &server,
        "SELECT lag_epochs FROM eddy_views WHERE name = 'slow'",
    )
    .await
    .parse()
    .unwrap();
    assert!(
        slow_then != WRITES.to_string() && lag > 0,
        "the slow view should be behind when the fast one is done (slow: {slow_then}, lag {lag}; writes took {written:?})"
    );
    assert_eq!(
        text(
            &server,
            "SELECT lag_epochs FROM eddy_views WHERE name = 'fast'"
        )
        .await,
        "0"
    );
    // FLUSH waits for the slow view and says so.
    let (flusher, notices) = server.connect_with_notices().await.unwrap();
    flusher.batch_execute("FLUSH").await.unwrap();
    assert!(
        notices
            .lock()
            .unwrap()
            .iter()
            .any(|n| n.contains("slow") && n.contains("behind")),
        "{:?}",
        notices.lock().unwrap()
    );
    assert_eq!(text(&server, "SELECT n, s FROM slow").await, want);
    assert_eq!(text(&server, "SELECT n, s FROM fast").await, want);
    assert_eq!(
        text(
            &server,
            "SELECT name, lag_epochs FROM eddy_views ORDER BY name"
        )
        .await,
        "fast 0\nslow 0"
    );
}
