//! Recovery never hangs and never loses a view silently (issue 16): a view whose restore from
//! the checkpoint fails (a panic) is rebuilt from the log, with the views after it; one that
//! cannot be rebuilt either is marked failed — visible in SHOW MATERIALIZED VIEWS and
//! eddy_views, its queries fail with its error — while every other object serves; dropping it
//! ends FLUSH's warnings; the next checkpoint holds every view. Failures are injected with
//! the debug build's `EDDY_FAILPOINTS`.

use eddy_testkit::{EddyProcess, query_text, text};

fn binary() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_BIN_EXE_eddy"))
}

const TOTALS: &str = "a 3.75\nb 3.00";
const STATUS: &str = "SELECT name, status, restored_from FROM eddy_views ORDER BY name";

#[tokio::test]
async fn a_failed_restore_is_rebuilt_and_a_failed_rebuild_is_marked_failed() {
    let dir = tempfile::tempdir().unwrap();
    let args = ["--checkpoint-interval".to_owned(), "0".to_owned()];
    let mut server = EddyProcess::start_args(&binary(), dir.path(), &args).unwrap();
    server
        .connect()
        .await
        .unwrap()
        .batch_execute(
            "CREATE TABLE t (id INT PRIMARY KEY, g TEXT, amount NUMERIC(10,2));
             INSERT INTO t VALUES (1, 'a', 1.50), (2, 'a', 2.25), (3, 'b', 3.00);
             CREATE MATERIALIZED VIEW first AS SELECT g, count(*) AS n FROM t GROUP BY g;
             CREATE MATERIALIZED VIEW totals AS SELECT g, sum(amount) AS total FROM t GROUP BY g;
             CREATE MATERIALIZED VIEW big AS SELECT g, total FROM totals WHERE total > 3.5;
             CREATE MATERIALIZED VIEW other AS SELECT count(*) AS n FROM t;
             CHECKPOINT;",
        )
        .await
        .unwrap();

    // The restore of `totals` panics: it and every view after it come from the log instead.
    server.set_envs(&[("EDDY_FAILPOINTS", "restore_view:totals:panic")]);
    server.restart_in_place(false).unwrap();
    assert_eq!(
        text(&server, "SELECT g, total FROM totals ORDER BY g").await,
        TOTALS
    );
    assert_eq!(text(&server, "SELECT * FROM big").await, "a 3.75");
    assert_eq!(
        text(&server, STATUS).await,
        "big running log\nfirst running checkpoint 1\nother running log\ntotals running log"
            .replace("checkpoint 1", &checkpoint_of(&server, "first").await)
    );

    // Now its rebuild fails too: it is marked failed, with what reads it; the rest serve.
    server.set_envs(&[(
        "EDDY_FAILPOINTS",
        "restore_view:totals:panic,rebuild_view:totals:error",
    )]);
    server.restart_in_place(true).unwrap();
    let client = server.connect().await.unwrap();
    let views = query_text(&client, "SHOW MATERIALIZED VIEWS")
        .await
        .unwrap();
    let status: Vec<(String, String)> = views
        .iter()
        .map(|r| (r[0].clone().unwrap(), r[1].clone().unwrap()))
        .collect();
    assert_eq!(
        status,
        [
            ("big", "failed"),
            ("first", "running"),
            ("other", "running"),
            ("totals", "failed")
        ]
        .map(|(a, b)| (a.to_owned(), b.to_owned()))
    );
    let error = views
        .iter()
        .find(|r| r[0].as_deref() == Some("totals"))
        .and_then(|r| r[2].clone())
        .unwrap();
    assert!(
        error.contains("could not be restored") && error.contains("failpoint rebuild_view"),
        "{error}"
    );
    let big = views
        .iter()
        .find(|r| r[0].as_deref() == Some("big"))
        .and_then(|r| r[2].clone())
        .unwrap();
    assert!(
        big.contains("reads materialized view \"totals\", which failed"),
        "{big}"
    );
    let e = client
        .simple_query("SELECT * FROM totals")
        .await
        .unwrap_err();
    eddy_testkit::assert_error(&e, "XX000", "could not be restored");
    // Every other object serves, and keeps up with writes.
    client
        .batch_execute("INSERT INTO t VALUES (4, 'c', 1)")
        .await
        .unwrap();
    // FLUSH is not held back by the failed views: it warns about each.
    let (flusher, notices) = server.connect_with_notices().await.unwrap();
    flusher.batch_execute("FLUSH").await.unwrap();
    let warned = notices.lock().unwrap().join("\n");
    assert!(
        warned.contains("\"totals\" could not be restored") && warned.contains("not up to date"),
        "FLUSH names the failed view: {warned}"
    );
    assert_eq!(
        text(&server, "SELECT g, n FROM first ORDER BY g").await,
        "a 2\nb 1\nc 1"
    );
    assert_eq!(text(&server, "SELECT n FROM other").await, "4");
    assert_eq!(text(&server, "SELECT count(*) FROM t").await, "4");
    // A failed view is dropped like any other: its dependents need CASCADE.
    let e = client
        .batch_execute("DROP MATERIALIZED VIEW totals")
        .await
        .unwrap_err();
    assert_eq!(e.code().map(|c| c.code()), Some("2BP01"), "{e:?}");
    client
        .batch_execute("DROP MATERIALIZED VIEW totals CASCADE; FLUSH")
        .await
        .unwrap();
    client.batch_execute("CREATE MATERIALIZED VIEW totals AS SELECT g, sum(amount) AS total FROM t GROUP BY g; CHECKPOINT").await.unwrap();

    // Without failpoints, the new checkpoint restores every view.
    server.set_envs(&[]);
    server.restart_in_place(false).unwrap();
    let epoch = checkpoint_of(&server, "first").await;
    assert_eq!(
        text(&server, STATUS).await,
        format!("first running {epoch}\nother running {epoch}\ntotals running {epoch}")
    );
    assert_eq!(
        text(&server, "SELECT g, total FROM totals ORDER BY g").await,
        format!("{TOTALS}\nc 1.00")
    );
}

/// What start-up restored `view` from (`checkpoint N`).
async fn checkpoint_of(server: &EddyProcess, view: &str) -> String {
    text(
        server,
        &format!("SELECT restored_from FROM eddy_views WHERE name = '{view}'"),
    )
    .await
}
