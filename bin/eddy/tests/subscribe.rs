//! SUBSCRIBE through cursors: the snapshot, then each epoch's consolidated changes with
//! retractions, progress rows, subscriptions to queries and tables, and cursor errors.

use eddy_testkit::{EddyProcess, query_text};

type Rows = Vec<Vec<Option<String>>>;

/// (epoch, diff, rest) of each fetched row.
fn split(rows: Rows) -> Vec<(i64, Option<i64>, Vec<Option<String>>)> {
    rows.into_iter()
        .map(|r| {
            let epoch = r[0].as_deref().unwrap().parse().unwrap();
            let diff = r[1].as_deref().map(|d| d.parse().unwrap());
            (epoch, diff, r[2..].to_vec())
        })
        .collect()
}

fn s(v: &str) -> Option<String> {
    Some(v.to_owned())
}

#[tokio::test]
async fn cursor_over_a_view_shows_snapshot_then_changes() {
    let server =
        EddyProcess::start_fresh(std::path::Path::new(env!("CARGO_BIN_EXE_eddy"))).unwrap();
    let client = server.connect().await.unwrap();
    client
        .batch_execute(
            "CREATE TABLE t (k INT, v INT);
             INSERT INTO t VALUES (1, 10), (2, 20);
             CREATE MATERIALIZED VIEW s AS SELECT k, sum(v) AS total FROM t GROUP BY k;
             DECLARE c CURSOR FOR SUBSCRIBE TO s;",
        )
        .await
        .unwrap();
    let mut snapshot = split(
        query_text(&client, "FETCH ALL c WITH (timeout = '200ms')")
            .await
            .unwrap(),
    );
    snapshot.sort_by(|a, b| a.2.cmp(&b.2));
    assert_eq!(snapshot.len(), 2);
    assert!(
        snapshot
            .iter()
            .all(|(e, d, _)| *e == snapshot[0].0 && *d == Some(1))
    );
    assert_eq!(snapshot[0].2, vec![s("1"), s("10")]);
    let first_epoch = snapshot[0].0;

    client
        .batch_execute("UPDATE t SET v = 11 WHERE k = 1; FLUSH")
        .await
        .unwrap();
    let mut update = split(
        query_text(&client, "FETCH 10 c WITH (timeout = '1s')")
            .await
            .unwrap(),
    );
    update.sort_by_key(|r| r.1);
    assert_eq!(update.len(), 2, "{update:?}");
    assert_eq!(update[0].1, Some(-1));
    assert_eq!(update[0].2, vec![s("1"), s("10")]);
    assert_eq!(update[1].1, Some(1));
    assert_eq!(update[1].2, vec![s("1"), s("11")]);
    assert!(update[0].0 > first_epoch && update[0].0 == update[1].0);

    // A write that changes nothing visible produces no rows; FETCH with a timeout returns empty.
    client
        .batch_execute("UPDATE t SET v = v WHERE k = 2; FLUSH")
        .await
        .unwrap();
    assert!(
        query_text(&client, "FETCH ALL c WITH (timeout = '100ms')")
            .await
            .unwrap()
            .is_empty()
    );

    // FETCH n returns at most n rows; the rest stay for the next FETCH.
    client
        .batch_execute("INSERT INTO t VALUES (3, 1), (4, 1), (5, 1); FLUSH")
        .await
        .unwrap();
    assert_eq!(query_text(&client, "FETCH 2 c").await.unwrap().len(), 2);
    assert_eq!(
        query_text(&client, "FETCH 2 c WITH (timeout = '100ms')")
            .await
            .unwrap()
            .len(),
        1
    );

    client.batch_execute("CLOSE c").await.unwrap();
    let err = client.simple_query("FETCH 1 c").await.unwrap_err();
    assert_eq!(err.code().unwrap().code(), "34000");
}

#[tokio::test]
async fn subscribe_to_a_query_and_a_table_with_progress() {
    let server =
        EddyProcess::start_fresh(std::path::Path::new(env!("CARGO_BIN_EXE_eddy"))).unwrap();
    let client = server.connect().await.unwrap();
    client
        .batch_execute(
            "CREATE TABLE t (k INT, v INT);
             INSERT INTO t VALUES (1, 10), (2, 20);
             DECLARE q CURSOR FOR SUBSCRIBE (SELECT k FROM t WHERE v > 15) WITH (SNAPSHOT = false, PROGRESS);
             DECLARE whole CURSOR FOR SUBSCRIBE t WITH (snapshot = true);",
        )
        .await
        .unwrap();
    client
        .batch_execute("DELETE FROM t WHERE k = 2; FLUSH")
        .await
        .unwrap();
    let rows = split(
        query_text(&client, "FETCH ALL q WITH (timeout = '300ms')")
            .await
            .unwrap(),
    );
    // The deletion, then a progress row (diff NULL, eddy_progressed true) for its epoch.
    let changes: Vec<_> = rows.iter().filter(|r| r.2[0] == s("f")).collect();
    assert_eq!(changes.len(), 1, "{rows:?}");
    assert_eq!(changes[0].1, Some(-1));
    assert_eq!(changes[0].2, vec![s("f"), s("2")]);
    assert!(
        rows.iter()
            .any(|r| r.1.is_none() && r.2[0] == s("t") && r.0 == changes[0].0)
    );
    let epochs: Vec<i64> = rows.iter().map(|r| r.0).collect();
    assert!(
        epochs.windows(2).all(|w| w[0] <= w[1]),
        "epochs never decrease: {epochs:?}"
    );

    let table = split(
        query_text(&client, "FETCH ALL whole WITH (timeout = '300ms')")
            .await
            .unwrap(),
    );
    let net: i64 = table.iter().map(|r| r.1.unwrap()).sum();
    assert_eq!(net, 1, "two inserts then one delete: {table:?}");

    // Errors: unknown cursor, duplicate cursor, a query cursor outside a transaction block,
    // unknown relation.
    for (sql, code) in [
        ("FETCH 1 nope", "34000"),
        ("DECLARE q CURSOR FOR SUBSCRIBE t", "42P03"),
        ("DECLARE x CURSOR FOR SELECT 1", "25P01"),
        ("DECLARE y CURSOR FOR SUBSCRIBE missing", "42P01"),
        ("COPY (SUBSCRIBE missing) TO STDOUT", "42P01"),
        ("CLOSE nope", "34000"),
    ] {
        let err = client.simple_query(sql).await.unwrap_err();
        assert_eq!(err.code().unwrap().code(), code, "{sql}: {err}");
    }
    client.batch_execute("CLOSE ALL").await.unwrap();
}

#[tokio::test]
async fn copy_subscribe_streams_each_epoch_until_cancelled() {
    use futures::StreamExt;
    let server =
        EddyProcess::start_fresh(std::path::Path::new(env!("CARGO_BIN_EXE_eddy"))).unwrap();
    let writer = server.connect().await.unwrap();
    writer.batch_execute("CREATE TABLE t (k INT, v TEXT); INSERT INTO t VALUES (1, 'a'); CREATE MATERIALIZED VIEW s AS SELECT k, v FROM t").await.unwrap();
    let reader = server.connect().await.unwrap();
    let cancel = reader.cancel_token();
    let stream = reader
        .copy_out("COPY (SUBSCRIBE TO s) TO STDOUT")
        .await
        .unwrap();
    futures::pin_mut!(stream);
    let mut text = String::new();
    let mut next_line = async || {
        while !text.contains('\n') {
            let chunk = stream.next().await.unwrap().unwrap();
            text.push_str(std::str::from_utf8(&chunk).unwrap());
        }
        let (line, rest) = text.split_once('\n').unwrap();
        let line = line.to_owned();
        text = rest.to_owned();
        line
    };
    let snapshot = next_line().await;
    assert!(snapshot.ends_with("\t1\t1\ta"), "{snapshot}");
    writer
        .batch_execute("INSERT INTO t VALUES (2, 'tab\there'); FLUSH")
        .await
        .unwrap();
    let change = next_line().await;
    assert!(change.ends_with("\t1\t2\ttab\\there"), "{change}");
    cancel.cancel_query(tokio_postgres::NoTls).await.unwrap();
    let _ = next_line;
    // The subscription's resources are released: the writer and views go on.
    writer
        .batch_execute("INSERT INTO t VALUES (3, 'c'); FLUSH")
        .await
        .unwrap();
    let n = query_text(&writer, "SELECT count(*) FROM s").await.unwrap();
    assert_eq!(n, vec![vec![s("3")]]);
}

/// Prepared statements (the extended protocol, as drivers use it): SUBSCRIBE streams typed rows
/// epoch by epoch, binary or text; FETCH from a cursor is described like a query.
#[tokio::test]
async fn subscribe_streams_over_the_extended_protocol() {
    use futures::StreamExt;
    let server =
        EddyProcess::start_fresh(std::path::Path::new(env!("CARGO_BIN_EXE_eddy"))).unwrap();
    let client = server.connect().await.unwrap();
    client
        .batch_execute("CREATE TABLE t (k INT, v TEXT); INSERT INTO t VALUES (1, 'a'); CREATE MATERIALIZED VIEW m AS SELECT k, v FROM t")
        .await
        .unwrap();
    let statement = client.prepare("SUBSCRIBE TO m").await.unwrap();
    let names: Vec<&str> = statement.columns().iter().map(|c| c.name()).collect();
    assert_eq!(names, ["eddy_epoch", "eddy_diff", "k", "v"]);
    let stream = client
        .query_raw(&statement, std::iter::empty::<i32>())
        .await
        .unwrap();
    let mut stream = Box::pin(stream);
    let first = stream.next().await.unwrap().unwrap();
    assert_eq!(
        (
            first.get::<_, i64>(1),
            first.get::<_, i32>(2),
            first.get::<_, String>(3)
        ),
        (1, 1, "a".to_owned())
    );

    // A second connection changes the table; the change arrives on the open stream.
    let writer = server.connect().await.unwrap();
    writer
        .batch_execute("UPDATE t SET v = 'b'; FLUSH")
        .await
        .unwrap();
    let mut changes = Vec::new();
    for _ in 0..2 {
        let row = stream.next().await.unwrap().unwrap();
        changes.push((row.get::<_, i64>(1), row.get::<_, String>(3)));
    }
    changes.sort();
    assert_eq!(changes, [(-1, "a".to_owned()), (1, "b".to_owned())]);
    drop(stream);

    // Dropping what a subscription reads ends its stream normally.
    let second = server.connect().await.unwrap();
    let statement = second
        .prepare("SUBSCRIBE (SELECT count(*) AS n FROM t)")
        .await
        .unwrap();
    let (opened, is_open) = tokio::sync::oneshot::channel();
    let ended = tokio::spawn(async move {
        let mut stream = Box::pin(
            second
                .query_raw(&statement, std::iter::empty::<i32>())
                .await
                .unwrap(),
        );
        let snapshot = stream.next().await.unwrap().unwrap();
        opened.send(snapshot.get::<_, i64>(2)).unwrap();
        stream
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .map(|r| r.map(|_| ()).map_err(|e| format!("{e:?}")))
            .collect::<Vec<_>>()
    });
    assert_eq!(is_open.await.unwrap(), 1);
    writer
        .batch_execute("DECLARE c CURSOR FOR SUBSCRIBE TO m")
        .await
        .unwrap();
    let fetched = writer
        .query("FETCH ALL c WITH (timeout = '200ms')", &[])
        .await
        .unwrap();
    assert_eq!(fetched.len(), 1);
    assert_eq!(fetched[0].get::<_, String>("v"), "b");
    writer
        .batch_execute("CLOSE c; DROP TABLE t CASCADE")
        .await
        .unwrap();
    let rows = tokio::time::timeout(std::time::Duration::from_secs(10), ended)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rows, vec![], "{rows:?}");
}

/// A late row applied by a `late_events = 'retract'` view reaches subscribers as a correction:
/// the window's old row retracted and its new row inserted, in one epoch.
#[tokio::test]
async fn late_row_correction_is_subscribed() {
    let server =
        EddyProcess::start_fresh(std::path::Path::new(env!("CARGO_BIN_EXE_eddy"))).unwrap();
    let client = server.connect().await.unwrap();
    client
        .batch_execute(
            "CREATE TABLE c (u INT, ts TIMESTAMP, WATERMARK FOR ts AS ts) APPEND ONLY;
             CREATE MATERIALIZED VIEW m WITH (late_events = 'retract', allowed_lateness = '1 hour') AS
               SELECT window_start, count(*) AS n FROM TUMBLE(c, ts, INTERVAL '1' MINUTE) GROUP BY 1;
             INSERT INTO c VALUES (1, '2026-01-01 00:00:10');
             INSERT INTO c VALUES (1, '2026-01-01 00:05:00');
             FLUSH;
             DECLARE s CURSOR FOR SUBSCRIBE TO m WITH (SNAPSHOT = false);
             INSERT INTO c VALUES (1, '2026-01-01 00:00:20');
             FLUSH;",
        )
        .await
        .unwrap();
    let mut rows = split(
        query_text(&client, "FETCH ALL s WITH (timeout = '500ms')")
            .await
            .unwrap(),
    );
    rows.sort_by_key(|r| r.1);
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(rows[0].0, rows[1].0, "one epoch");
    assert_eq!(
        (rows[0].1, rows[0].2.clone()),
        (Some(-1), vec![s("2026-01-01 00:00:00"), s("1")])
    );
    assert_eq!(
        (rows[1].1, rows[1].2.clone()),
        (Some(1), vec![s("2026-01-01 00:00:00"), s("2")])
    );
}

/// `EMIT ON WINDOW CLOSE` over plain rows: a subscriber sees rows once the watermark passes
/// them, in event-time order, whatever order they arrived in.
#[tokio::test]
async fn rows_released_in_event_time_order() {
    let server =
        EddyProcess::start_fresh(std::path::Path::new(env!("CARGO_BIN_EXE_eddy"))).unwrap();
    let client = server.connect().await.unwrap();
    client
        .batch_execute(
            "CREATE TABLE r (id INT, ts TIMESTAMP, WATERMARK FOR ts AS ts) APPEND ONLY;
             CREATE MATERIALIZED VIEW m AS SELECT id, ts FROM r EMIT ON WINDOW CLOSE;
             DECLARE s CURSOR FOR SUBSCRIBE TO m WITH (SNAPSHOT = false);
             INSERT INTO r VALUES (3, '2026-01-01 00:00:03'), (1, '2026-01-01 00:00:01'), (2, '2026-01-01 00:00:02');
             INSERT INTO r VALUES (9, '2026-01-01 00:00:09');
             FLUSH;",
        )
        .await
        .unwrap();
    let rows = split(
        query_text(&client, "FETCH ALL s WITH (timeout = '500ms')")
            .await
            .unwrap(),
    );
    let ids: Vec<Option<String>> = rows.iter().map(|r| r.2[0].clone()).collect();
    assert_eq!(ids, vec![s("1"), s("2"), s("3"), s("9")], "{rows:?}");
}

/// `--barrier-interval` sets how often epochs end while changes flow: with 3 s a write is not
/// in a view half a second later (until FLUSH ends the epoch), with 10 ms it is there almost at
/// once; out of range is refused at start.
#[tokio::test]
async fn the_barrier_interval_sets_how_soon_views_see_writes() {
    let binary = std::path::Path::new(env!("CARGO_BIN_EXE_eddy"));
    let view = "CREATE TABLE t (v INT); CREATE MATERIALIZED VIEW n AS SELECT count(*) AS n FROM t";
    let slow =
        EddyProcess::start_fresh_args(binary, &["--barrier-interval".into(), "3".into()]).unwrap();
    let client = slow.connect().await.unwrap();
    client.batch_execute(view).await.unwrap();
    client
        .batch_execute("INSERT INTO t VALUES (1)")
        .await
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert_eq!(count(&client).await, s("0"), "no epoch ended yet");
    client.batch_execute("FLUSH").await.unwrap();
    assert_eq!(count(&client).await, s("1"));

    let fast = EddyProcess::start_fresh_args(binary, &["--barrier-interval".into(), "0.01".into()])
        .unwrap();
    let client = fast.connect().await.unwrap();
    client.batch_execute(view).await.unwrap();
    client
        .batch_execute("INSERT INTO t VALUES (1)")
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while count(&client).await != s("1") {
        assert!(
            std::time::Instant::now() < deadline,
            "the write never reached the view"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }

    let dir = tempfile::tempdir().unwrap();
    let refused = std::process::Command::new(binary)
        .args(["--data-dir"])
        .arg(dir.path())
        .args([
            "--listen",
            "127.0.0.1:0",
            "--http-listen",
            "127.0.0.1:0",
            "--barrier-interval",
            "0",
        ])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("--barrier-interval must be between"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
}

async fn count(client: &tokio_postgres::Client) -> Option<String> {
    query_text(client, "SELECT n FROM n").await.unwrap()[0][0].clone()
}
