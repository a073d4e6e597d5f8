//! Sinks against real targets, started here on free ports. PostgreSQL: the target table
//! follows the view through inserts, updates and deletes (by the view's GROUP BY key, by a
//! declared primary_key, and by whole rows with their count); the progress table records the
//! epochs; a SIGKILL in the middle of a stream of writes and a restart leave the table equal to
//! the view. Kafka (UPSERT and DEBEZIUM) and files, through SIGKILLs: the topic's last record per
//! key and the files' summed weights equal the view, and nothing was written twice (per key,
//! every Debezium event's `before` is the previous event's `after`; no upsert repeats a value).
//! Error cases of CREATE SINK are in sql-tests/sinks.slt.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use eddy_testkit::kafka::KafkaBroker;
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
async fn converges(
    eddy: &tokio_postgres::Client,
    pg: &tokio_postgres::Client,
    eddy_query: &str,
    pg_query: &str,
) {
    sink_converges(eddy, eddy_query, pg_query, || async {
        query_text(pg, pg_query).await.unwrap()
    })
    .await;
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
    converges(
        &eddy,
        &target,
        "SELECT customer, n, total FROM totals",
        "SELECT customer, n::text, total::text FROM totals",
    )
    .await;
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
    converges(
        &eddy,
        &target,
        "SELECT customer, n, total, last FROM totals",
        "SELECT customer, n::text, total::text, to_char(last, 'YYYY-MM-DD HH24:MI:SS') FROM totals",
    )
    .await;
    // A restarted view hands its sink the rebuilt contents, and goes on from there.
    eddy.batch_execute(
        "ALTER MATERIALIZED VIEW totals RESTART;
         INSERT INTO orders VALUES (7, 'dee', 1, NULL);
         UPDATE orders SET amount = 31 WHERE id = 2;
         FLUSH",
    )
    .await
    .unwrap();
    converges(
        &eddy,
        &target,
        "SELECT customer, n, total, last FROM totals",
        "SELECT customer, n::text, total::text, to_char(last, 'YYYY-MM-DD HH24:MI:SS') FROM totals",
    )
    .await;
    // Whole rows with their count: two orders of cy for 10 are one row counted twice.
    converges(
        &eddy,
        &target,
        "SELECT customer, amount, count(*) AS n FROM big GROUP BY customer, amount",
        "SELECT customer, amount::text, eddy_count::text FROM big",
    )
    .await;
    converges(
        &eddy,
        &target,
        "SELECT DISTINCT customer, amount FROM big",
        "SELECT customer, amount::text FROM big_keyed",
    )
    .await;
    let progress: i64 = target
        .query_one(
            "SELECT count(*) FROM eddy_sink_progress WHERE epoch > 0",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(progress, 3, "every sink records its progress");
    let shown = query_text(&eddy, "SHOW SINKS").await.unwrap();
    assert_eq!(shown.len(), 3);
    assert!(
        shown.iter().all(|r| r[6].as_deref() == Some("")),
        "no sink reports an error: {shown:?}"
    );
    assert!(
        shown.iter().all(|r| r[5]
            .as_deref()
            .and_then(|n| n.parse::<u64>().ok())
            .is_some_and(|n| n > 0)),
        "every sink counts the rows it wrote: {shown:?}"
    );
    // The view cannot go while sinks write it out; DROP SINK stops a sink.
    let err = eddy
        .batch_execute("DROP MATERIALIZED VIEW totals")
        .await
        .unwrap_err();
    assert_eq!(err.code().unwrap().code(), "2BP01");
    eddy.batch_execute("DROP SINK totals_pg; DROP MATERIALIZED VIEW totals")
        .await
        .unwrap();
    assert_eq!(query_text(&eddy, "SHOW SINKS").await.unwrap().len(), 2);
}

#[tokio::test]
async fn a_postgres_sink_is_exact_after_sigkill() {
    let pg = PostgresServer::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let args: Vec<String> = ["--checkpoint-interval", "0.2"]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
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
                    let sql = if i % 5 == 4 {
                        format!("DELETE FROM accounts WHERE id = {id}")
                    } else {
                        format!(
                            "BEGIN; DELETE FROM accounts WHERE id = {id}; INSERT INTO accounts VALUES ({id}, {i}); COMMIT"
                        )
                    };
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
    converges(
        &eddy,
        &target,
        "SELECT bucket, n, total FROM buckets",
        "SELECT bucket::text, n::text, total::text FROM buckets",
    )
    .await;
    // The batch answer over the recovered table, too.
    converges(&eddy, &target, "SELECT id % 13 AS bucket, count(*) AS n, sum(balance) AS total FROM accounts GROUP BY id % 13", "SELECT bucket::text, n::text, total::text FROM buckets").await;
}

/// A JSON object's fields as the text Eddy shows for `columns` (NULL as `None`).
fn json_row(value: &serde_json::Value, columns: &[&str]) -> Vec<Option<String>> {
    columns
        .iter()
        .map(|c| match &value[*c] {
            serde_json::Value::Null => None,
            serde_json::Value::String(s) => Some(s.clone()),
            v => Some(v.to_string()),
        })
        .collect()
}

fn parse(bytes: &[u8]) -> serde_json::Value {
    serde_json::from_slice(bytes).unwrap()
}

const COLUMNS: [&str; 3] = ["bucket", "n", "total"];

/// What the upsert topic says the view is, after checking that no key got the same value twice
/// in a row (a change written twice).
async fn upsert_topic(
    broker: &KafkaBroker,
    topic: &str,
    partitions: i32,
) -> Vec<Vec<Option<String>>> {
    let mut last: HashMap<Vec<u8>, Option<Vec<u8>>> = HashMap::new();
    for (partition, offset, key, value) in broker.records(topic, partitions).await.unwrap() {
        let key = key.expect("every record has a key");
        if let Some(previous) = last.get(&key) {
            let same = match (previous, &value) {
                (Some(a), Some(b)) => parse(a) == parse(b),
                (None, None) => true,
                _ => false,
            };
            assert!(
                !same,
                "{topic}: key {} written twice in a row (partition {partition}, offset {offset})",
                String::from_utf8_lossy(&key)
            );
        }
        last.insert(key, value);
    }
    last.into_values()
        .flatten()
        .map(|v| json_row(&parse(&v), &COLUMNS))
        .collect()
}

/// What the Debezium topic says the view is, after checking every key's events form one chain:
/// each `before` is the previous `after` (so no change is missing or repeated).
async fn debezium_topic(
    broker: &KafkaBroker,
    topic: &str,
    partitions: i32,
) -> Vec<Vec<Option<String>>> {
    let mut last: HashMap<Vec<u8>, serde_json::Value> = HashMap::new();
    for (partition, offset, key, value) in broker.records(topic, partitions).await.unwrap() {
        let key = key.expect("every record has a key");
        let event = parse(&value.expect("a Debezium record has a value"));
        let previous = last.get(&key).cloned().unwrap_or(serde_json::Value::Null);
        assert_eq!(
            event["before"], previous,
            "{topic}: partition {partition} offset {offset}: before is not the key's last after ({event})"
        );
        let op = event["op"].as_str().unwrap();
        assert_eq!(
            op,
            match (event["before"].is_null(), event["after"].is_null()) {
                (true, false) => "c",
                (false, false) => "u",
                (false, true) => "d",
                _ => panic!("an event with neither before nor after: {event}"),
            }
        );
        last.insert(key, event["after"].clone());
    }
    last.into_values()
        .filter(|v| !v.is_null())
        .map(|v| json_row(&v, &COLUMNS))
        .collect()
}

/// What the file sink's files say the view is, after checking they are numbered 1, 2, ... and
/// that the summed weights never go negative along the way.
fn files_say(dir: &std::path::Path, sink: &str) -> Vec<Vec<Option<String>>> {
    let mut files: Vec<(u64, std::path::PathBuf)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter_map(|p| {
            let name = p.file_name()?.to_str()?.to_owned();
            let seq = name
                .strip_prefix(&format!("{sink}-"))?
                .strip_suffix(".jsonl")?
                .split('-')
                .next()?
                .parse()
                .ok()?;
            Some((seq, p))
        })
        .collect();
    files.sort();
    let mut weights: BTreeMap<Vec<Option<String>>, i64> = BTreeMap::new();
    for (i, (seq, path)) in files.iter().enumerate() {
        assert_eq!(
            *seq,
            i as u64 + 1,
            "files are numbered without gaps: {files:?}"
        );
        for line in std::fs::read_to_string(path).unwrap().lines() {
            let row = parse(line.as_bytes());
            *weights.entry(json_row(&row, &COLUMNS)).or_default() +=
                row["eddy_weight"].as_i64().unwrap();
        }
        assert!(
            weights.values().all(|w| *w >= 0),
            "{}: a row's summed weight went below zero",
            path.display()
        );
    }
    weights
        .into_iter()
        .flat_map(|(row, w)| std::iter::repeat_n(row, w as usize))
        .collect()
}

/// Waits (up to 30 s) until `target` (re-read each time) equals what `view_query` returns.
async fn sink_converges<F, Fut>(
    eddy: &tokio_postgres::Client,
    view_query: &str,
    what: &str,
    mut target: F,
) where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Vec<Vec<Option<String>>>>,
{
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let want = sorted(query_text(eddy, view_query).await.unwrap());
        let got = sorted(target().await);
        if got == want {
            assert!(
                !want.is_empty(),
                "{view_query} is empty, which checks nothing"
            );
            return;
        }
        if Instant::now() > deadline {
            panic!("{what} has {got:?}, the view {want:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn kafka_and_file_sinks_are_exact_after_sigkill() {
    let broker = KafkaBroker::start().await.unwrap();
    broker.create_topic("upserts", 3).await.unwrap();
    broker.create_topic("changes", 2).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    let args: Vec<String> = ["--checkpoint-interval", "0.2"]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    let mut server = EddyProcess::start_args(&binary(), dir.path(), &args).unwrap();
    let eddy = server.connect().await.unwrap();
    let kafka = format!(
        "connector = 'kafka', properties.bootstrap.server = '{}'",
        broker.bootstrap()
    );
    eddy.batch_execute(&format!(
        "CREATE TABLE accounts (id INT PRIMARY KEY, balance BIGINT);
         INSERT INTO accounts SELECT g, g * 10 FROM generate_series(1, 50) AS t(g);
         CREATE MATERIALIZED VIEW buckets AS SELECT id % 13 AS bucket, count(*) AS n, sum(balance) AS total FROM accounts GROUP BY id % 13;
         CREATE SINK up FROM buckets WITH ({kafka}, topic = 'upserts') FORMAT UPSERT ENCODE JSON;
         CREATE SINK cdc FROM buckets WITH ({kafka}, topic = 'changes') FORMAT DEBEZIUM ENCODE JSON;
         CREATE SINK files FROM buckets WITH (connector = 'file', path = '{}', rollover_seconds = '0.3');",
        out.path().display()
    ))
    .await
    .unwrap();
    let shown = query_text(&eddy, "SHOW SINKS").await.unwrap();
    let targets: Vec<(String, String)> = sorted(shown)
        .into_iter()
        .map(|r| (r[0].clone().unwrap(), r[3].clone().unwrap()))
        .collect();
    assert_eq!(
        targets,
        vec![
            ("cdc".into(), "changes".into()),
            ("files".into(), out.path().display().to_string()),
            ("up".into(), "upserts".into())
        ]
    );
    let missing = eddy.batch_execute(&format!("CREATE SINK lost FROM buckets WITH ({kafka}, topic = 'no_such_topic') FORMAT UPSERT ENCODE JSON")).await.unwrap_err();
    assert_eq!(missing.code().unwrap().code(), "42704", "{missing:?}");
    let create = query_text(&eddy, "SHOW CREATE SINK cdc").await.unwrap();
    assert_eq!(
        create[0][1].as_deref(),
        Some(format!("CREATE SINK cdc FROM buckets WITH (connector = 'kafka', properties.bootstrap.server = '{}', topic = 'changes') FORMAT DEBEZIUM ENCODE JSON", broker.bootstrap()).as_str())
    );
    for round in 0..4u64 {
        // Killed once the writer has had a different number of statements acknowledged each
        // round (under load, whatever the machine's speed).
        let acknowledged = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let writer = {
            let client = server.connect().await.unwrap();
            let acknowledged = std::sync::Arc::clone(&acknowledged);
            tokio::spawn(async move {
                for i in 0u64.. {
                    let id = (i * 7 + round) % 120;
                    let sql = if i % 5 == 4 {
                        format!("DELETE FROM accounts WHERE id = {id}")
                    } else {
                        format!(
                            "BEGIN; DELETE FROM accounts WHERE id = {id}; INSERT INTO accounts VALUES ({id}, {i}); COMMIT"
                        )
                    };
                    if client.batch_execute(&sql).await.is_err() {
                        return;
                    }
                    acknowledged.store(i + 1, std::sync::atomic::Ordering::Relaxed);
                }
            })
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while acknowledged.load(std::sync::atomic::Ordering::Relaxed) < 40 + 60 * round {
            assert!(Instant::now() < deadline, "the writer made no progress");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        server.kill().unwrap();
        let _ = writer.await;
        server = server.restart().unwrap();
    }
    let eddy = server.connect().await.unwrap();
    eddy.batch_execute("INSERT INTO accounts VALUES (1000, 1); FLUSH")
        .await
        .unwrap();
    let view = "SELECT bucket, n, total FROM buckets";
    sink_converges(&eddy, view, "the upsert topic", || {
        upsert_topic(&broker, "upserts", 3)
    })
    .await;
    sink_converges(&eddy, view, "the Debezium topic", || {
        debezium_topic(&broker, "changes", 2)
    })
    .await;
    sink_converges(&eddy, view, "the files", || {
        std::future::ready(files_say(out.path(), "files"))
    })
    .await;
    // Eddy reads its own Debezium output back as a table equal to the view.
    eddy.batch_execute(&format!(
        "CREATE TABLE mirror (bucket INT PRIMARY KEY, n BIGINT, total BIGINT) WITH ({kafka}, topic = 'changes') FORMAT DEBEZIUM ENCODE JSON"
    ))
    .await
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        eddy.batch_execute("FLUSH").await.unwrap();
        let want = sorted(
            query_text(&eddy, "SELECT bucket, n, total FROM buckets")
                .await
                .unwrap(),
        );
        let got = sorted(
            query_text(&eddy, "SELECT bucket, n, total FROM mirror")
                .await
                .unwrap(),
        );
        if got == want {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the Debezium mirror has {got:?}, the view {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The batch answer over the recovered table, too.
    let batch = sorted(query_text(&eddy, "SELECT id % 13 AS bucket, count(*) AS n, sum(balance) AS total FROM accounts GROUP BY id % 13").await.unwrap());
    assert_eq!(sorted(upsert_topic(&broker, "upserts", 3).await), batch);
}

#[tokio::test]
async fn a_sink_whose_target_is_down_at_start_up_starts_once_it_is_back() {
    let mut pg = PostgresServer::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut server = EddyProcess::start_args(&binary(), dir.path(), &[]).unwrap();
    let eddy = server.connect().await.unwrap();
    eddy.batch_execute(&format!(
        "CREATE TABLE orders (id INT PRIMARY KEY, customer VARCHAR, amount BIGINT);
         INSERT INTO orders VALUES (1, 'ann', 10), (2, 'bob', 20);
         CREATE MATERIALIZED VIEW totals AS SELECT customer, sum(amount) AS total FROM orders GROUP BY customer;
         CREATE SINK totals_pg FROM totals WITH ({});
         CREATE SINK spare_pg FROM totals WITH ({});",
        pg.sink_options("totals"),
        pg.sink_options("spare"),
    ))
    .await
    .unwrap();
    let target = pg.connect().await.unwrap();
    converges(
        &eddy,
        &target,
        "SELECT customer, total FROM totals",
        "SELECT customer, total::text FROM totals",
    )
    .await;
    drop(target);
    server.kill().unwrap();
    pg.stop();
    server = server.restart().unwrap();
    let eddy = server.connect().await.unwrap();
    // Listed, with why it is not running; writes go on meanwhile.
    let shown = query_text(&eddy, "SHOW SINKS").await.unwrap();
    assert_eq!(shown.len(), 2);
    assert!(
        shown
            .iter()
            .all(|r| !r[6].as_deref().unwrap_or_default().is_empty()),
        "the sinks say why they wait: {shown:?}"
    );
    eddy.batch_execute("INSERT INTO orders VALUES (3, 'ann', 5), (4, 'cy', 1); DELETE FROM orders WHERE id = 2; FLUSH").await.unwrap();
    // A waiting sink can be dropped.
    eddy.batch_execute("DROP SINK spare_pg").await.unwrap();
    pg.restart().unwrap();
    let target = pg.connect().await.unwrap();
    converges(
        &eddy,
        &target,
        "SELECT customer, total FROM totals",
        "SELECT customer, total::text FROM totals",
    )
    .await;
    let shown = query_text(&eddy, "SHOW SINKS").await.unwrap();
    assert_eq!(shown.len(), 1);
    assert_eq!(shown[0][6].as_deref(), Some(""), "the sink runs: {shown:?}");
}

#[tokio::test]
async fn a_sink_that_falls_behind_its_buffer_catches_up_with_the_view() {
    let mut pg = PostgresServer::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    // A 4 KiB buffer: a few epochs of changes while PostgreSQL is down overflow it.
    let args: Vec<String> = ["--sink-buffer-bytes", "4096"]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    let server = EddyProcess::start_args(&binary(), dir.path(), &args).unwrap();
    let eddy = server.connect().await.unwrap();
    eddy.batch_execute(&format!(
        "CREATE TABLE accounts (id INT PRIMARY KEY, balance BIGINT);
         CREATE MATERIALIZED VIEW buckets AS SELECT id % 13 AS bucket, count(*) AS n, sum(balance) AS total FROM accounts GROUP BY id % 13;
         CREATE SINK buckets_pg FROM buckets WITH ({});
         INSERT INTO accounts SELECT g, g FROM generate_series(1, 100) AS t(g);
         FLUSH;",
        pg.sink_options("buckets")
    ))
    .await
    .unwrap();
    let target = pg.connect().await.unwrap();
    converges(
        &eddy,
        &target,
        "SELECT bucket, n, total FROM buckets",
        "SELECT bucket::text, n::text, total::text FROM buckets",
    )
    .await;
    drop(target);
    pg.stop();
    for i in 0..40 {
        eddy.batch_execute(&format!(
            "UPDATE accounts SET balance = balance + {i} WHERE id % 3 = {}; FLUSH",
            i % 3
        ))
        .await
        .unwrap();
    }
    pg.restart().unwrap();
    let target = pg.connect().await.unwrap();
    converges(
        &eddy,
        &target,
        "SELECT bucket, n, total FROM buckets",
        "SELECT bucket::text, n::text, total::text FROM buckets",
    )
    .await;
    let shown = query_text(&eddy, "SHOW SINKS").await.unwrap();
    assert_eq!(shown[0][6].as_deref(), Some(""), "the sink runs: {shown:?}");
}
