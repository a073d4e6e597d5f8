//! A slow view slows only itself (issue 18): while one view takes 200 ms more per batch of
//! changes (the debug build's `EDDY_FAILPOINTS=view_changes:slow:sleep`), writes are
//! acknowledged and another view over the same table is up to date (read without FLUSH) long
//! before the slow one has caught up; `eddy_views.lag_epochs` shows the slow view behind,
//! FLUSH waits for it (with a NOTICE saying so), and then both answer the same as the table.

use std::time::{Duration, Instant};

use eddy_testkit::{EddyProcess, failpoint_env, text, until};

fn binary() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_BIN_EXE_eddy"))
}

/// A server on `data` with `EDDY_FAILPOINTS=failpoints` and the gate file `block` waits for.
fn start(data: &std::path::Path, failpoints: &str, gate: &std::path::Path) -> EddyProcess {
    EddyProcess::start_env(&binary(), data, &[], &failpoint_env(failpoints, Some(gate))).unwrap()
}

/// Runs `sql` in a session of its own, in the background.
async fn in_another_session(
    server: &EddyProcess,
    sql: &'static str,
) -> tokio::task::JoinHandle<Result<(), tokio_postgres::Error>> {
    let client = server.connect().await.unwrap();
    tokio::spawn(async move { client.batch_execute(sql).await })
}

const WRITES: i64 = 12;

#[tokio::test]
async fn a_slow_view_falls_behind_without_holding_writers_or_other_views() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(
        &dir.path().join("data"),
        "view_changes:slow:sleep",
        &dir.path().join("release"),
    );
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
    eddy_testkit::assert_noticed(&notices, &["slow", "behind"]);
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

/// Eddy's system tables, the views' published contents and the writers never wait for a new
/// view's backfill (ADR 0009, steps 4 and 7): while `late` backfills (each log record it reads
/// 200 ms slower, `EDDY_FAILPOINTS=backfill:late:sleep`), another session reads every system
/// table and an existing view, writes a row and sees the existing view count it, all before the
/// backfill is done. Before, each system table was a question to the runtime thread, answered
/// after the backfill, and the backfill ran on the runtime thread, holding every view.
#[tokio::test]
async fn nothing_waits_for_a_new_views_backfill() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(
        &dir.path().join("data"),
        "backfill:late:sleep",
        &dir.path().join("release"),
    );
    let client = server.connect().await.unwrap();
    client
        .batch_execute(
            "CREATE TABLE t (id INT PRIMARY KEY, v INT);
             CREATE MATERIALIZED VIEW early AS SELECT count(*) AS n FROM t;",
        )
        .await
        .unwrap();
    // One commit per row: the backfill of `late` reads 20 records, 4 s at least.
    for i in 1..=20 {
        client
            .execute("INSERT INTO t VALUES ($1, $2)", &[&i, &i])
            .await
            .unwrap();
    }
    client.batch_execute("FLUSH").await.unwrap();
    assert_eq!(text(&server, "SELECT n FROM early").await, "20");
    let create = in_another_session(
        &server,
        "CREATE MATERIALIZED VIEW late AS SELECT sum(v) AS s FROM t",
    )
    .await;
    // The CREATE has reached the runtime once the view is in the catalog (it is added there
    // just before the runtime is handed it; the backfill then takes seconds).
    let deadline = Instant::now() + Duration::from_secs(60);
    while text(
        &server,
        "SELECT count(*) FROM eddy_views WHERE name = 'late'",
    )
    .await
        != "1"
    {
        assert!(Instant::now() < deadline, "the view was never created");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for table in [
        "eddy_operators",
        "eddy_watermarks",
        "eddy_late_events",
        "eddy_source_offsets",
        "eddy_dead_letters",
        "eddy_views",
    ] {
        client
            .query(&format!("SELECT count(*) FROM {table}"), &[])
            .await
            .unwrap();
        assert!(
            !create.is_finished(),
            "{table} answered only after the backfill was done"
        );
    }
    assert_eq!(text(&server, "SELECT n FROM early").await, "20");
    assert!(
        !create.is_finished(),
        "a view's rows waited for the backfill"
    );
    // The backfill runs in the new view's lane: writes go on and the other views see them
    // meanwhile, and the new view has no contents to read yet (an error, not an empty answer).
    client
        .execute("INSERT INTO t VALUES (21, 21)", &[])
        .await
        .unwrap();
    until(&server, "SELECT n FROM early", "21").await;
    let error = client.query("SELECT s FROM late", &[]).await.unwrap_err();
    assert_eq!(
        error.code(),
        Some(&tokio_postgres::error::SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE),
        "{error}"
    );
    assert!(
        !create.is_finished(),
        "the backfill was done before the write was seen"
    );
    create.await.unwrap().unwrap();
    // CREATE answers once the view has its backfill; the write during it comes with an epoch.
    let s = text(&server, "SELECT s FROM late").await;
    assert!(s == "210" || s == "231", "{s}");
    client.batch_execute("FLUSH").await.unwrap();
    assert_eq!(text(&server, "SELECT s FROM late").await, "231");
    assert_eq!(
        text(
            &server,
            "SELECT view, count(*) > 0 FROM eddy_operators GROUP BY view ORDER BY view"
        )
        .await,
        "early t\nlate t"
    );
}

/// A view stuck for good holds neither the writers nor the other views once it is past its
/// budget in memory (ADR 0009, step 4): while `stuck`'s dataflow is blocked
/// (`EDDY_FAILPOINTS=view_changes:stuck:block`), about 40 MiB of writes, 2.5 times its 16 MiB
/// budget, are acknowledged (what is past the budget goes to the view's spill file), the other
/// view is current and `stuck` is behind with its last contents; released, it catches up from
/// its spill to the same answer. Before, the write past the budget waited for the view forever.
#[tokio::test]
async fn a_stuck_view_spills_past_its_budget_instead_of_holding_writers() {
    let dir = tempfile::tempdir().unwrap();
    let gate = dir.path().join("release");
    let server = start(&dir.path().join("data"), "view_changes:stuck:block", &gate);
    let client = server.connect().await.unwrap();
    client
        .batch_execute(
            "CREATE TABLE t (id BIGINT, pad TEXT);
             CREATE MATERIALIZED VIEW other AS SELECT count(*) AS n, sum(id) AS s FROM t;
             CREATE MATERIALIZED VIEW stuck AS SELECT count(*) AS n, sum(id) AS s FROM t;",
        )
        .await
        .unwrap();
    // 20 commits of 10 000 rows of 200 bytes: 2 MiB each.
    const COMMITS: i64 = 20;
    const ROWS: i64 = 10_000;
    for k in 0..COMMITS {
        let insert = format!(
            "INSERT INTO t SELECT g, repeat('x', 200) FROM generate_series({}, {}) AS s(g)",
            k * ROWS + 1,
            (k + 1) * ROWS
        );
        tokio::time::timeout(Duration::from_secs(120), client.batch_execute(&insert))
            .await
            .unwrap_or_else(|_| panic!("commit {k} waited for the stuck view"))
            .unwrap();
    }
    let n = COMMITS * ROWS;
    let want = format!("{n} {}", n * (n + 1) / 2);
    let deadline = Instant::now() + Duration::from_secs(60);
    while text(&server, "SELECT n, s FROM other").await != want {
        assert!(Instant::now() < deadline, "the other view never caught up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(text(&server, "SELECT n FROM stuck").await, "0");
    let lag: i64 = text(
        &server,
        "SELECT lag_epochs FROM eddy_views WHERE name = 'stuck'",
    )
    .await
    .parse()
    .unwrap();
    assert!(lag > 0, "the stuck view should be behind");
    std::fs::write(&gate, b"").unwrap();
    client.batch_execute("FLUSH").await.unwrap();
    assert_eq!(text(&server, "SELECT n, s FROM stuck").await, want);
    assert_eq!(
        text(
            &server,
            "SELECT lag_epochs FROM eddy_views WHERE name = 'stuck'"
        )
        .await,
        "0"
    );
}

/// A stuck view over a `SOURCE` holds back only its own reader (ADR 0009, step 4): while
/// `stuck`'s dataflow is blocked, its reader of a 40 MB JSON-lines file waits at the file once
/// the view holds half its budget, the runtime thread goes on, and a view over a table keeps
/// answering new writes; released, the stuck view reads the whole file. Before, the runtime
/// thread waited for the stuck view once 16 MiB were in its lane, and every view stopped.
#[tokio::test]
async fn a_stuck_view_over_a_source_holds_back_only_its_reader() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("events.jsonl");
    const LINES: i64 = 200_000;
    let pad = "x".repeat(200);
    let lines: String = (1..=LINES)
        .map(|i| format!("{{\"id\": {i}, \"pad\": \"{pad}\"}}\n"))
        .collect();
    std::fs::write(&file, lines).unwrap();
    let gate = dir.path().join("release");
    let server = start(&dir.path().join("data"), "view_changes:stuck:block", &gate);
    let client = server.connect().await.unwrap();
    client
        .batch_execute(&format!(
            "CREATE TABLE t (id INT);
             CREATE MATERIALIZED VIEW live AS SELECT count(*) AS n FROM t;
             CREATE SOURCE events (id BIGINT, pad TEXT) WITH (connector = 'file', path = '{}') FORMAT PLAIN ENCODE JSON;",
            file.display()
        ))
        .await
        .unwrap();
    // A new view over a source answers once it has read the file: not while it is stuck.
    let create = in_another_session(
        &server,
        "CREATE MATERIALIZED VIEW stuck AS SELECT count(*) AS n, sum(id) AS s FROM events",
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while text(
        &server,
        "SELECT count(*) FROM eddy_views WHERE name = 'stuck'",
    )
    .await
        != "1"
    {
        assert!(
            Instant::now() < deadline,
            "the stuck view was never created"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Writes to the table over ten seconds, each seen by `live` while the file's reader is
    // held back (it fills the stuck view's budget in the first of them).
    for i in 1..=5 {
        tokio::time::sleep(Duration::from_secs(2)).await;
        client
            .execute("INSERT INTO t VALUES ($1)", &[&i])
            .await
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        while text(&server, "SELECT n FROM live").await != i.to_string() {
            assert!(Instant::now() < deadline, "live never saw write {i}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    assert!(!create.is_finished(), "the stuck view read the whole file");
    std::fs::write(&gate, b"").unwrap();
    create.await.unwrap().unwrap();
    let want = format!("{LINES} {}", LINES * (LINES + 1) / 2);
    let deadline = Instant::now() + Duration::from_secs(120);
    while text(&server, "SELECT n, s FROM stuck").await != want {
        assert!(
            Instant::now() < deadline,
            "the stuck view never read the whole file"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A view stuck for good holds only the statements that wait for it, in their own sessions
/// (ADR 0009, step 4): while `stuck`'s dataflow is blocked, a FLUSH and a CHECKPOINT wait, and
/// meanwhile writes are acknowledged, `other` answers them, a new view is created and answers,
/// and the system tables answer. Released, FLUSH says it waited for `stuck` and CHECKPOINT
/// completes, with `stuck`'s state as of the CHECKPOINT's epoch (the rows written after it are
/// replayed from the log after a SIGKILL, not counted twice). Before, both statements waited
/// on the runtime thread, and every view and writer with them.
#[tokio::test]
async fn a_stuck_view_holds_only_the_statements_that_wait_for_it() {
    let dir = tempfile::tempdir().unwrap();
    let gate = dir.path().join("release");
    let mut server = EddyProcess::start_env(
        &binary(),
        &dir.path().join("data"),
        &[],
        &[
            failpoint_env("view_changes:stuck:block", Some(&gate)),
            vec![("EDDY_CHECKPOINT_INTERVAL".to_owned(), "0".to_owned())],
        ]
        .concat(),
    )
    .unwrap();
    let client = server.connect().await.unwrap();
    client
        .batch_execute(
            "CREATE TABLE t (id BIGINT);
             CREATE MATERIALIZED VIEW other AS SELECT count(*) AS n, sum(id) AS s FROM t;
             CREATE MATERIALIZED VIEW stuck AS SELECT count(*) AS n, sum(id) AS s FROM t;
             INSERT INTO t SELECT g FROM generate_series(1, 100) AS s(g);",
        )
        .await
        .unwrap();
    until(&server, "SELECT n, s FROM other", "100 5050").await;
    let lag = "SELECT lag_epochs FROM eddy_views WHERE name = 'stuck'";
    let behind: u64 = text(&server, lag).await.parse().unwrap();
    let (flusher, notices) = server.connect_with_notices().await.unwrap();
    let flush = tokio::spawn(async move { flusher.batch_execute("FLUSH").await });
    let checkpointer = server.connect().await.unwrap();
    let checkpoint = tokio::spawn(async move { checkpointer.batch_execute("CHECKPOINT").await });
    // Both have ended their epoch (nothing else ends one meanwhile) before anything else runs.
    until(&server, lag, &(behind + 2).to_string()).await;
    // Everything else goes on while both wait.
    let quick = Duration::from_secs(30);
    tokio::time::timeout(
        quick,
        client.batch_execute(
            "INSERT INTO t SELECT g FROM generate_series(101, 200) AS s(g);
             CREATE MATERIALIZED VIEW later AS SELECT count(*) AS n FROM t;",
        ),
    )
    .await
    .expect("a write or a new view waited for the stuck view")
    .unwrap();
    until(&server, "SELECT n, s FROM other", "200 20100").await;
    until(&server, "SELECT n FROM later", "200").await;
    assert_eq!(text(&server, "SELECT n FROM stuck").await, "0");
    assert_eq!(
        text(
            &server,
            "SELECT name, lag_epochs > 0 FROM eddy_views ORDER BY name"
        )
        .await,
        "later f\nother f\nstuck t"
    );
    assert_eq!(
        text(&server, "SELECT count(*) FROM eddy_checkpoints").await,
        "0"
    );
    assert!(!flush.is_finished() && !checkpoint.is_finished());
    std::fs::write(&gate, b"").unwrap();
    tokio::time::timeout(Duration::from_secs(60), flush)
        .await
        .expect("FLUSH never ended")
        .unwrap()
        .unwrap();
    eddy_testkit::assert_noticed(&notices, &["stuck", "behind"]);
    tokio::time::timeout(Duration::from_secs(60), checkpoint)
        .await
        .expect("CHECKPOINT never ended")
        .unwrap()
        .unwrap();
    let want = "200 20100";
    assert_eq!(text(&server, "SELECT n, s FROM stuck").await, want);
    // The checkpoint holds `other` and `stuck` as of its epoch (100 rows); `later`, created
    // after it was asked for, is rebuilt from the log.
    server.restart_in_place(true).unwrap();
    assert_eq!(text(&server, "SELECT n, s FROM stuck").await, want);
    assert_eq!(text(&server, "SELECT n, s FROM other").await, want);
    assert_eq!(text(&server, "SELECT n FROM later").await, "200");
    assert_eq!(
        text(
            &server,
            "SELECT name, restored_from LIKE 'checkpoint %' FROM eddy_views ORDER BY name"
        )
        .await,
        "later f\nother t\nstuck t"
    );
}

/// A view dropped while its backfill runs stops reading at once: its CREATE answers 57014, and
/// the table it was reading is released, so retention trims the table's log at the next
/// CHECKPOINT. Before, the dropped view's lane read the log to the end (here 400 records, 200 ms
/// each with `EDDY_FAILPOINTS=backfill:late:sleep`: 80 s) and kept the table pinned meanwhile.
#[tokio::test]
async fn a_view_dropped_during_its_backfill_stops_reading() {
    let dir = tempfile::tempdir().unwrap();
    let args: Vec<String> = ["--log-segment-bytes", "4096", "--checkpoint-interval", "0"]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    let server = EddyProcess::start_env(
        &binary(),
        &dir.path().join("data"),
        &args,
        &failpoint_env("backfill:late:sleep", None),
    )
    .unwrap();
    let client = server.connect().await.unwrap();
    // `keep` is in no checkpoint yet: retention leaves the log whole until the first one.
    client
        .batch_execute(
            "CREATE TABLE events (k INT, v BIGINT) APPEND ONLY WITH (retention.bytes = '16384');
             CREATE MATERIALIZED VIEW keep AS SELECT count(*) AS n FROM events;",
        )
        .await
        .unwrap();
    for batch in 0..400i64 {
        let values: Vec<String> = (0..20)
            .map(|i| format!("({}, {})", i % 5, batch * 20 + i))
            .collect();
        client
            .batch_execute(&format!("INSERT INTO events VALUES {}", values.join(", ")))
            .await
            .unwrap();
    }
    let create = in_another_session(
        &server,
        "CREATE MATERIALIZED VIEW late AS SELECT k, sum(v) FROM events GROUP BY k",
    )
    .await;
    until(
        &server,
        "SELECT count(*) FROM eddy_views WHERE name = 'late'",
        "1",
    )
    .await;
    client
        .batch_execute("DROP MATERIALIZED VIEW late")
        .await
        .unwrap();
    let error = create.await.unwrap().unwrap_err();
    eddy_testkit::assert_error(&error, "57014", "dropped while it was being created");
    // The lane stops within the record it is reading (200 ms); a CHECKPOINT's retention run
    // skips a table a backfill still reads, so try a few.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        client.batch_execute("CHECKPOINT").await.unwrap();
        if text(&server, "SELECT count(*) < 8000 FROM events").await == "t" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the dropped view's backfill still holds the table's log"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(text(&server, "SELECT n FROM keep").await, "8000");
    assert_eq!(
        text(
            &server,
            "SELECT count(*) FROM eddy_views WHERE name = 'late'"
        )
        .await,
        "0"
    );
    // A view made now is built from what the log keeps.
    client
        .batch_execute("CREATE MATERIALIZED VIEW again AS SELECT count(*) AS n FROM events")
        .await
        .unwrap();
    assert_eq!(
        text(&server, "SELECT n FROM again").await,
        text(&server, "SELECT count(*) FROM events").await
    );
}
