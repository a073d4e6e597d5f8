//! The Kafka connector against a real Kafka-compatible broker (Tansu, started by the test on
//! 127.0.0.1 and a free port): JSON, upsert and Debezium records across several partitions
//! with poison pills; views, dead letters and offsets; a SIGKILL of Eddy mid-stream loses
//! nothing and counts nothing twice (offsets live in Eddy's log, not in a consumer group).
//! Sources: each view reads the topic itself, at its own offsets, from the source's start.

use eddy_testkit::kafka::KafkaBroker;
use eddy_testkit::{EddyProcess, eventually, failpoint_env, rows};

fn binary() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_BIN_EXE_eddy"))
}

fn order(i: usize) -> String {
    format!(
        "{{\"id\": {i}, \"customer\": \"c{}\", \"amount\": {}}}",
        i % 4,
        i % 10
    )
}

#[tokio::test]
async fn json_records_across_partitions_survive_a_crash() {
    let broker = KafkaBroker::start().await.unwrap();
    broker.create_topic("orders", 3).await.unwrap();
    // 300 good records spread over three partitions, and poison pills among them.
    for p in 0..3 {
        let mut batch: Vec<String> = (0..100).filter(|i| i % 3 == p).map(order).collect();
        batch.insert(5, "{\"id\": \"not a number\"}".into());
        batch.insert(10, "{\"id\": 1, ".into());
        let records = batch.iter().map(|v| (None, Some(v.as_bytes()))).collect();
        broker.produce("orders", p as i32, records).await.unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let mut server = EddyProcess::start(&binary(), dir.path()).unwrap();
    server
        .connect()
        .await
        .unwrap()
        .batch_execute(&format!(
            "CREATE TABLE orders (id BIGINT NOT NULL, customer TEXT, amount BIGINT)
               INCLUDE partition AS kp INCLUDE offset AS ko INCLUDE timestamp AS kt APPEND ONLY
               WITH (connector = 'kafka', topic = 'orders', properties.bootstrap.server = '{}', partitions = 3)
               FORMAT PLAIN ENCODE JSON;
             CREATE MATERIALIZED VIEW per_customer AS SELECT customer, count(*) AS n, sum(amount) AS total FROM orders GROUP BY customer;
             CREATE MATERIALIZED VIEW totals AS SELECT count(*) AS n, count(DISTINCT id) AS ids, count(DISTINCT kp * 1000000 + ko) AS positions FROM orders;",
            broker.bootstrap()
        ))
        .await
        .unwrap();
    eventually(
        &server,
        "SELECT n, ids, positions FROM totals",
        "100 100 100",
    )
    .await;
    eventually(
        &server,
        "SELECT count(*) FROM eddy_dead_letters WHERE object = 'orders'",
        "6",
    )
    .await;
    let letters = rows(
        &server,
        "SELECT partition, \"offset\" FROM eddy_dead_letters ORDER BY partition, \"offset\"",
    )
    .await;
    assert_eq!(letters[0], vec![Some("0".into()), Some("5".into())]);
    assert_eq!(letters[1], vec![Some("0".into()), Some("10".into())]);
    eventually(
        &server,
        "SELECT partition, committed_offset, high_watermark, lag FROM eddy_source_offsets WHERE consumer = 'connector kafka' ORDER BY partition",
        "0 36 36 0\n1 35 35 0\n2 35 35 0",
    )
    .await;
    assert_eq!(
        rows(&server, "SELECT count(*) FROM orders WHERE kt IS NULL").await,
        vec![vec![Some("0".into())]]
    );

    // More records while Eddy runs, a crash in the middle, more while it is down.
    for p in 0..3 {
        let batch: Vec<String> = (100..400).filter(|i| i % 3 == p).map(order).collect();
        broker
            .produce(
                "orders",
                p as i32,
                batch.iter().map(|v| (None, Some(v.as_bytes()))).collect(),
            )
            .await
            .unwrap();
    }
    server.kill().unwrap();
    for p in 0..3 {
        let batch: Vec<String> = (400..500).filter(|i| i % 3 == p).map(order).collect();
        broker
            .produce(
                "orders",
                p as i32,
                batch.iter().map(|v| (None, Some(v.as_bytes()))).collect(),
            )
            .await
            .unwrap();
    }
    let server = server.restart().unwrap();
    eventually(
        &server,
        "SELECT n, ids, positions FROM totals",
        "500 500 500",
    )
    .await;
    let expected: Vec<String> = (0..4)
        .map(|c| {
            let ids: Vec<usize> = (0..500).filter(|i| i % 4 == c).collect();
            format!(
                "c{c} {} {}",
                ids.len(),
                ids.iter().map(|i| i % 10).sum::<usize>()
            )
        })
        .collect();
    eventually(
        &server,
        "SELECT customer, n, total FROM per_customer ORDER BY customer",
        &expected.join("\n"),
    )
    .await;
    assert_eq!(
        rows(&server, "SELECT count(*) FROM eddy_dead_letters").await,
        vec![vec![Some("6".into())]]
    );
}

#[tokio::test]
async fn upsert_and_debezium_topics_keep_a_keyed_table_current() {
    let broker = KafkaBroker::start().await.unwrap();
    broker.create_topic("accounts", 2).await.unwrap();
    broker.create_topic("cdc", 2).await.unwrap();
    // Upsert: a key's records stay in one partition; a null value deletes the key.
    broker
        .produce(
            "accounts",
            0,
            vec![
                (
                    Some(b"1"),
                    Some(br#"{"id": 1, "owner": "ann", "balance": 10}"#),
                ),
                (
                    Some(b"1"),
                    Some(br#"{"id": 1, "owner": "ann", "balance": 15}"#),
                ),
                (
                    Some(br#"{"id": 3}"#),
                    Some(br#"{"id": 3, "owner": "cid", "balance": 7}"#),
                ),
                (Some(br#"{"id": 3}"#), None),
                (Some(b"garbage"), None),
            ],
        )
        .await
        .unwrap();
    broker
        .produce(
            "accounts",
            1,
            vec![
                (
                    Some(b"2"),
                    Some(br#"{"id": 2, "owner": "bob", "balance": 5}"#),
                ),
                (None, Some(br#"{"owner": "no id"}"#)),
            ],
        )
        .await
        .unwrap();
    broker
        .produce(
            "cdc",
            0,
            vec![
                (None, Some(br#"{"op": "r", "after": {"id": 1, "owner": "ann", "balance": 1}}"#)),
                (None, Some(br#"{"payload": {"op": "u", "before": {"id": 1}, "after": {"id": 1, "owner": "ann", "balance": 2}}}"#)),
                (None, Some(br#"{"op": "c", "after": {"id": 2, "owner": "bob", "balance": 3}}"#)),
                (None, Some(br#"{"op": "d", "before": {"id": 2}}"#)),
                (None, None),
            ],
        )
        .await
        .unwrap();
    let server = EddyProcess::start_fresh(&binary()).unwrap();
    server
        .connect()
        .await
        .unwrap()
        .batch_execute(&format!(
            "CREATE TABLE accounts (id INT PRIMARY KEY, owner TEXT, balance BIGINT)
               WITH (connector = 'kafka', topic = 'accounts', properties.bootstrap.server = '{0}') FORMAT UPSERT ENCODE JSON;
             CREATE TABLE mirror (id INT PRIMARY KEY, owner TEXT, balance BIGINT)
               WITH (connector = 'kafka', topic = 'cdc', properties.bootstrap.server = '{0}', scan.startup.mode = 'earliest') FORMAT DEBEZIUM ENCODE JSON;
             CREATE MATERIALIZED VIEW money AS SELECT sum(balance) AS total, count(*) AS n FROM accounts;",
            broker.bootstrap()
        ))
        .await
        .unwrap();
    eventually(
        &server,
        "SELECT id, owner, balance FROM accounts ORDER BY id",
        "1 ann 15\n2 bob 5",
    )
    .await;
    eventually(&server, "SELECT total, n FROM money", "20 2").await;
    eventually(
        &server,
        "SELECT id, owner, balance FROM mirror ORDER BY id",
        "1 ann 2",
    )
    .await;
    eventually(
        &server,
        "SELECT count(*) FROM eddy_dead_letters WHERE object = 'accounts'",
        "2",
    )
    .await;
    // A tombstone whose key is bad keeps its key apart from its (absent) value, and a replay
    // reads it as the tombstone it is.
    let tombstone = "SELECT encode(key, 'hex'), raw IS NULL, error FROM eddy_dead_letters WHERE object = 'accounts' AND partition = 0";
    let before = rows(&server, tombstone).await;
    assert_eq!(before[0][0].as_deref(), Some(hex(b"garbage").as_str()));
    assert_eq!(before[0][1].as_deref(), Some("t"));
    server
        .connect()
        .await
        .unwrap()
        .batch_execute("ALTER TABLE accounts REPLAY DEAD LETTERS")
        .await
        .unwrap();
    assert_eq!(rows(&server, tombstone).await, before);

    // An unreachable broker or a missing topic refuses CREATE TABLE and leaves nothing behind.
    let client = server.connect().await.unwrap();
    let err = client
        .batch_execute(&format!("CREATE TABLE t (a INT) WITH (connector = 'kafka', topic = 'nope', properties.bootstrap.server = '{}') FORMAT PLAIN ENCODE JSON", broker.bootstrap()))
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("does not exist") || format!("{err:?}").contains("does not exist"),
        "{err:?}"
    );
    assert!(
        rows(&server, "SHOW TABLES")
            .await
            .iter()
            .all(|r| r[0].as_deref() != Some("t"))
    );
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn click(i: usize) -> String {
    format!(
        "{{\"id\": {i}, \"page\": \"p{}\", \"ms\": {}}}",
        i % 3,
        i % 7
    )
}

async fn produce_clicks(broker: &KafkaBroker, ids: std::ops::Range<usize>) {
    for p in 0..2 {
        let batch: Vec<String> = ids.clone().filter(|i| i % 2 == p).map(click).collect();
        broker
            .produce(
                "clicks",
                p as i32,
                batch.iter().map(|v| (None, Some(v.as_bytes()))).collect(),
            )
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn a_source_is_read_by_each_view_at_its_own_offsets() {
    let broker = KafkaBroker::start().await.unwrap();
    broker.create_topic("clicks", 2).await.unwrap();
    produce_clicks(&broker, 0..100).await;
    broker
        .produce("clicks", 1, vec![(None, Some(b"{\"id\": \"x\"}"))])
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut server = EddyProcess::start(&binary(), dir.path()).unwrap();
    let client = server.connect().await.unwrap();
    client
        .batch_execute(&format!(
            "CREATE SOURCE clicks (id BIGINT NOT NULL, page TEXT, ms BIGINT)
               WITH (connector = 'kafka', topic = 'clicks', properties.bootstrap.server = '{0}') FORMAT PLAIN ENCODE JSON;
             CREATE SOURCE recent (id BIGINT NOT NULL, page TEXT, ms BIGINT)
               WITH (connector = 'kafka', topic = 'clicks', properties.bootstrap.server = '{0}', scan.startup.mode = 'latest') FORMAT PLAIN ENCODE JSON;
             CREATE MATERIALIZED VIEW per_page AS SELECT page, count(*) AS n, sum(ms) AS ms FROM clicks GROUP BY page;
             CREATE MATERIALIZED VIEW since_created AS SELECT count(*) AS n FROM recent;",
            broker.bootstrap()
        ))
        .await
        .unwrap();
    // CREATE MATERIALIZED VIEW answers once the view has read what the topic held.
    let expected = |n: usize| -> String {
        (0..3)
            .map(|p| {
                let ids: Vec<usize> = (0..n).filter(|i| i % 3 == p).collect();
                format!(
                    "p{p} {} {}",
                    ids.len(),
                    ids.iter().map(|i| i % 7).sum::<usize>()
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    let per_page = "SELECT page, n, ms FROM per_page ORDER BY page";
    let text = |rows: Vec<Vec<Option<String>>>| {
        rows.iter()
            .map(|r| {
                r.iter()
                    .map(|c| c.clone().unwrap_or_default())
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(text(rows(&server, per_page).await), expected(100));
    assert_eq!(
        text(rows(&server, "SELECT n FROM since_created").await),
        "0"
    );
    let err = client
        .simple_query("SELECT * FROM clicks")
        .await
        .unwrap_err();
    assert_eq!(err.code().map(|c| c.code()), Some("0A000"), "{err:?}");
    let err = client
        .simple_query("INSERT INTO clicks VALUES (1, 'p', 1)")
        .await
        .unwrap_err();
    assert_eq!(err.code().map(|c| c.code()), Some("42809"), "{err:?}");

    // A view created later reads the source from its start too; each view has its offsets.
    produce_clicks(&broker, 100..200).await;
    client.batch_execute("CREATE MATERIALIZED VIEW everything AS SELECT count(*) AS n, count(DISTINCT id) AS ids FROM clicks").await.unwrap();
    assert_eq!(
        text(rows(&server, "SELECT n, ids FROM everything").await),
        "200 200"
    );
    eventually(&server, per_page, &expected(200)).await;
    eventually(&server, "SELECT n FROM since_created", "100").await;
    eventually(
        &server,
        "SELECT consumer, partition, committed_offset, high_watermark, lag FROM eddy_source_offsets WHERE object = 'clicks' ORDER BY consumer, partition",
        "everything 0 100 100 0\neverything 1 101 101 0\nper_page 0 100 100 0\nper_page 1 101 101 0",
    )
    .await;
    // The poison pill is one dead letter, however many views read it.
    assert_eq!(
        text(
            rows(
                &server,
                "SELECT object, partition, \"offset\" FROM eddy_dead_letters"
            )
            .await
        ),
        "clicks 1 50"
    );

    // A checkpoint, then a crash: every view comes back from the checkpoint and reads its
    // sources on from the offsets it records (not from their start, nor from consumer groups).
    client.batch_execute("CHECKPOINT").await.unwrap();
    produce_clicks(&broker, 200..300).await;
    server.kill().unwrap();
    produce_clicks(&broker, 300..400).await;
    let server = server.restart().unwrap();
    eventually(&server, "SELECT n, ids FROM everything", "400 400").await;
    eventually(&server, per_page, &expected(400)).await;
    eventually(&server, "SELECT n FROM since_created", "300").await;
    assert_eq!(
        text(rows(&server, "SELECT count(*) FROM eddy_dead_letters").await),
        "1"
    );

    // Dropping a source needs its views gone (or CASCADE).
    let client = server.connect().await.unwrap();
    let err = client.simple_query("DROP SOURCE clicks").await.unwrap_err();
    assert_eq!(err.code().map(|c| c.code()), Some("2BP01"), "{err:?}");
    client
        .batch_execute("DROP SOURCE clicks CASCADE")
        .await
        .unwrap();
    assert_eq!(text(rows(&server, "SHOW SOURCES").await), "recent");
    assert_eq!(
        text(rows(&server, "SELECT name FROM eddy_views").await),
        "since_created"
    );
}

/// A topic that gains a partition while a table and views read it: the new partition is read
/// from its start, by the table and by each view's reader of a source, within the discovery
/// interval; after a SIGKILL its offsets are Eddy's like the others' (nothing twice). Tansu
/// cannot add partitions, so the topic has two from the start and the
/// `kafka_partitions:grows:hide` failpoint shows Eddy only the first until the test opens the
/// gate.
#[tokio::test]
async fn a_partition_added_to_a_topic_is_read_while_views_run() {
    let broker = KafkaBroker::start().await.unwrap();
    broker.create_topic("grows", 2).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let gate = dir.path().join("added");
    let produce = |partition: i32, ids: std::ops::Range<usize>| {
        let values: Vec<String> = ids.map(|i| format!("{{\"id\": {i}}}")).collect();
        let broker = &broker;
        async move {
            let records = values.iter().map(|v| (None, Some(v.as_bytes()))).collect();
            broker.produce("grows", partition, records).await.unwrap();
        }
    };
    produce(0, 0..50).await;
    produce(1, 50..100).await;
    let mut server = EddyProcess::start_env(
        &binary(),
        &dir.path().join("data"),
        &[],
        &failpoint_env("kafka_partitions:grows:hide", Some(&gate)),
    )
    .unwrap();
    server
        .connect()
        .await
        .unwrap()
        .batch_execute(&format!(
            "CREATE TABLE t (id BIGINT) APPEND ONLY
               WITH (connector = 'kafka', topic = 'grows', properties.bootstrap.server = '{0}')
               FORMAT PLAIN ENCODE JSON;
             CREATE SOURCE s (id BIGINT)
               WITH (connector = 'kafka', topic = 'grows', properties.bootstrap.server = '{0}')
               FORMAT PLAIN ENCODE JSON;
             CREATE MATERIALIZED VIEW from_table AS SELECT count(*) AS n, count(DISTINCT id) AS ids, sum(id) AS s FROM t;
             CREATE MATERIALIZED VIEW from_source AS SELECT count(*) AS n, count(DISTINCT id) AS ids, sum(id) AS s FROM s;
             CREATE MATERIALIZED VIEW also_from_source AS SELECT id % 2 AS k, count(*) AS n FROM s GROUP BY 1;",
            broker.bootstrap()
        ))
        .await
        .unwrap();
    // Only the first partition is known: ids 0..50.
    let sums = |n: usize, from: usize| format!("{n} {n} {}", (from..from + n).sum::<usize>());
    eventually(&server, "SELECT n, ids, s FROM from_table", &sums(50, 0)).await;
    eventually(&server, "SELECT n, ids, s FROM from_source", &sums(50, 0)).await;
    eventually(&server, "SELECT sum(n) FROM also_from_source", "50").await;

    // The partition is "added": everything in it is read, and what comes after.
    std::fs::write(&gate, b"").unwrap();
    produce(1, 100..120).await;
    eventually(&server, "SELECT n, ids, s FROM from_table", &sums(120, 0)).await;
    eventually(&server, "SELECT n, ids, s FROM from_source", &sums(120, 0)).await;
    eventually(&server, "SELECT sum(n) FROM also_from_source", "120").await;
    eventually(
        &server,
        "SELECT consumer, committed_offset FROM eddy_source_offsets WHERE object = 's' AND partition = 1 ORDER BY consumer",
        "also_from_source 70\nfrom_source 70",
    )
    .await;

    // After a crash, every partition from Eddy's own offsets: nothing lost, nothing twice.
    server.restart_in_place(true).unwrap();
    produce(0, 120..130).await;
    produce(1, 130..140).await;
    eventually(&server, "SELECT n, ids, s FROM from_table", &sums(140, 0)).await;
    eventually(&server, "SELECT n, ids, s FROM from_source", &sums(140, 0)).await;
    eventually(&server, "SELECT sum(n) FROM also_from_source", "140").await;
}
