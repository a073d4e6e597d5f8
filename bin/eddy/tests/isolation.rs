//! A view's dataflow fails alone (issue 18): when one view's operators panic, that view and
//! the views reading it are marked failed (SHOW MATERIALIZED VIEWS, eddy_views, and every read
//! of them answer with the cause), their subscriptions end with it, while writes are
//! acknowledged, FLUSH returns (warning about them) and every other view keeps updating.
//! `ALTER MATERIALIZED VIEW v RESTART` rebuilds the failed view and its readers from their
//! inputs; the answers then equal those of views that never failed, also after a crash.
//! The panic is injected with the debug build's `EDDY_FAILPOINTS` (`once`: the rebuild works).

use eddy_testkit::{EddyProcess, failpoint_env, text};

fn binary() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_BIN_EXE_eddy"))
}

const STATUS: &str = "SELECT name, status FROM eddy_views ORDER BY name";

/// The table, and the views over it: `above` reads `bad`, the view a failpoint fails.
const SETUP: &str = "CREATE TABLE t (id INT PRIMARY KEY, g TEXT, v INT);
     INSERT INTO t VALUES (1, 'a', 10), (2, 'a', 20), (3, 'b', 5);
     CREATE MATERIALIZED VIEW good AS SELECT g, sum(v) AS total FROM t GROUP BY g;
     CREATE MATERIALIZED VIEW bad AS SELECT g, count(*) AS n FROM t GROUP BY g;
     CREATE MATERIALIZED VIEW above AS SELECT g, n FROM bad WHERE n > 1;";

/// A server with the failpoints of `spec` (and their gate file), with [`SETUP`] done.
async fn start(data: &std::path::Path, spec: &str, gate: Option<&std::path::Path>) -> EddyProcess {
    let server = EddyProcess::start_env(&binary(), data, &[], &failpoint_env(spec, gate)).unwrap();
    let client = server.connect().await.unwrap();
    client.batch_execute(SETUP).await.unwrap();
    assert_views_agree(&server).await;
    server
}

/// With `bad` failed, writes are acknowledged and `good` shows them.
async fn others_go_on(server: &EddyProcess) {
    let client = server.connect().await.unwrap();
    client
        .batch_execute("INSERT INTO t VALUES (5, 'c', 1); UPDATE t SET v = 11 WHERE id = 1; FLUSH")
        .await
        .unwrap();
    assert_eq!(
        text(server, "SELECT * FROM good ORDER BY g").await,
        "a 31\nb 12\nc 1"
    );
}

/// Every view runs, and answers as its query over the table.
async fn all_running_and_agree(server: &EddyProcess) {
    assert_eq!(
        text(server, STATUS).await,
        "above running\nbad running\ngood running"
    );
    assert_views_agree(server).await;
}

/// Every view's answer next to the same query over the table, which never fails.
async fn assert_views_agree(server: &EddyProcess) {
    for (view, query) in [
        ("good", "SELECT g, sum(v) FROM t GROUP BY g"),
        ("bad", "SELECT g, count(*) FROM t GROUP BY g"),
        (
            "above",
            "SELECT g, count(*) FROM t GROUP BY g HAVING count(*) > 1",
        ),
    ] {
        assert_eq!(
            text(server, &format!("SELECT * FROM {view} ORDER BY 1")).await,
            text(server, &format!("{query} ORDER BY 1")).await,
            "{view}"
        );
    }
}

#[tokio::test]
async fn a_view_that_panics_fails_alone_and_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = start(dir.path(), "view_changes:bad:panic:once", None).await;
    let client = server.connect().await.unwrap();
    let subscriber = server.connect().await.unwrap();
    subscriber
        .batch_execute("BEGIN; DECLARE c CURSOR FOR SUBSCRIBE bad")
        .await
        .unwrap();

    // The first change `bad` is handed panics in its operators: the write is acknowledged
    // and FLUSH returns, warning about `bad` and `above`, which reads it.
    client
        .batch_execute("INSERT INTO t VALUES (4, 'b', 7)")
        .await
        .unwrap();
    let (flusher, notices) = server.connect_with_notices().await.unwrap();
    flusher.batch_execute("FLUSH").await.unwrap();
    let warned = notices.lock().unwrap().join("\n");
    assert!(
        warned.contains("materialized view bad failed")
            && warned.contains("failpoint view_changes of view bad")
            && warned.contains("above reads materialized view bad, which failed"),
        "{warned}"
    );
    assert_eq!(
        text(&server, STATUS).await,
        "above failed\nbad failed\ngood running"
    );
    let e = client.simple_query("SELECT * FROM bad").await.unwrap_err();
    assert_eq!(e.code().map(|c| c.code()), Some("XX000"), "{e:?}");
    let e = client
        .simple_query("SELECT * FROM above")
        .await
        .unwrap_err();
    assert_eq!(e.code().map(|c| c.code()), Some("55000"), "{e:?}");
    assert!(
        e.as_db_error()
            .unwrap()
            .hint()
            .is_some_and(|h| h.contains("ALTER MATERIALIZED VIEW bad RESTART")),
        "{e:?}"
    );
    // Its subscription ends with the cause, not silently.
    let mut fetched = Vec::new();
    let e = loop {
        match subscriber
            .simple_query("FETCH ALL c WITH (timeout = '5s')")
            .await
        {
            Ok(rows) => fetched.push(rows.len()),
            Err(e) => break e,
        }
        assert!(fetched.len() < 5, "the subscription goes on: {fetched:?}");
    };
    eddy_testkit::assert_error(&e, "XX000", "materialized view bad failed");

    // Everything else goes on.
    others_go_on(&server).await;

    // RESTART rebuilds `bad` and `above` from the table.
    let (restarter, notices) = server.connect_with_notices().await.unwrap();
    restarter
        .batch_execute("ALTER MATERIALIZED VIEW bad RESTART")
        .await
        .unwrap();
    eddy_testkit::assert_noticed(&notices, &["materialized view bad, above"]);
    all_running_and_agree(&server).await;
    client
        .batch_execute("INSERT INTO t VALUES (6, 'c', 2); DELETE FROM t WHERE id = 3; FLUSH")
        .await
        .unwrap();
    assert_views_agree(&server).await;

    // A running view restarts too; and the rebuilt views survive a checkpoint and a crash.
    client
        .batch_execute("ALTER MATERIALIZED VIEW good RESTART; CHECKPOINT")
        .await
        .unwrap();
    client
        .batch_execute("INSERT INTO t VALUES (7, 'a', 3)")
        .await
        .unwrap();
    server.set_envs(&[]);
    server.restart_in_place(true).unwrap();
    server
        .connect()
        .await
        .unwrap()
        .batch_execute("FLUSH")
        .await
        .unwrap();
    all_running_and_agree(&server).await;

    // What RESTART refuses.
    let client = server.connect().await.unwrap();
    let e = client
        .simple_query("ALTER MATERIALIZED VIEW nope RESTART")
        .await
        .unwrap_err();
    assert_eq!(e.code().map(|c| c.code()), Some("42P01"), "{e:?}");
    let e = client
        .simple_query("ALTER MATERIALIZED VIEW t RESTART")
        .await
        .unwrap_err();
    assert_eq!(e.code().map(|c| c.code()), Some("42809"), "{e:?}");
    let e = client
        .simple_query("ALTER MATERIALIZED VIEW good RENAME TO better")
        .await
        .unwrap_err();
    assert_eq!(e.code().map(|c| c.code()), Some("0A000"), "{e:?}");
}

/// A view whose contents cannot take an epoch's output (a disk error spilling its rows, here
/// the `view_contents` failpoint, armed by a gate file once the views run) fails alone with
/// its readers: the epoch ends for every other view, which shows the write; before, the epoch
/// stopped half applied and every later one failed the same way.
#[tokio::test]
async fn a_view_whose_contents_fail_fails_alone_and_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let gate = dir.path().join("armed");
    let data = dir.path().join("data");
    let server = start(&data, "view_contents:bad:error:gated:once", Some(&gate)).await;
    let client = server.connect().await.unwrap();
    std::fs::write(&gate, b"").unwrap();
    client
        .batch_execute("INSERT INTO t VALUES (4, 'b', 7); FLUSH")
        .await
        .unwrap();
    assert_eq!(
        text(&server, STATUS).await,
        "above failed\nbad failed\ngood running"
    );
    let e = client.simple_query("SELECT * FROM bad").await.unwrap_err();
    eddy_testkit::assert_error(&e, "XX000", "failpoint view_contents of view bad");
    others_go_on(&server).await;
    // The failpoint fired once: RESTART rebuilds the view and its reader.
    client
        .batch_execute("ALTER MATERIALIZED VIEW bad RESTART; FLUSH")
        .await
        .unwrap();
    all_running_and_agree(&server).await;
}
