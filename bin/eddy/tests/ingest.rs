//! Events from outside, end to end against a real server: HTTP ingest (JSON lines and CSV)
//! with poison records of several kinds, dead letters and their replay after a fix, and the
//! file connector following a growing file across a SIGKILL (nothing lost, nothing twice).

use std::io::Write;

use eddy_testkit::{EddyProcess, eventually, rows};

fn binary() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_BIN_EXE_eddy"))
}

#[tokio::test]
async fn http_ingest_keeps_good_records_and_dead_letters_the_rest() {
    let server = EddyProcess::start_fresh(&binary()).unwrap();
    server
        .connect()
        .await
        .unwrap()
        .batch_execute(
            "CREATE TABLE readings (sensor TEXT NOT NULL, value DOUBLE PRECISION, at TIMESTAMP NOT NULL) APPEND ONLY;
             CREATE MATERIALIZED VIEW per_sensor AS SELECT sensor, count(*) AS n, sum(value) AS total FROM readings GROUP BY sensor;
             CREATE TABLE strict (id INT NOT NULL) WITH (on_error = 'fail');",
        )
        .await
        .unwrap();
    let body = concat!(
        "{\"sensor\": \"a\", \"value\": 1.5, \"at\": \"2024-05-01T10:00:00\"}\n",
        "{\"sensor\": \"a\", \"value\": 2.5, \"at\": \"2024-05-01T10:00:01\"}\n",
        "{\"sensor\": \"b\", \"value\": 10, \"at\": \"2024-05-01T10:00:02\"\n", // bad JSON
        "\n",
        "{\"value\": 3, \"at\": \"2024-05-01T10:00:03\"}\n", // missing NOT NULL sensor
        "{\"sensor\": \"b\", \"value\": \"hot\", \"at\": \"2024-05-01T10:00:04\"}\n", // wrong type
        "{\"sensor\": \"b\", \"value\": 4, \"at\": \"not a time\"}\n", // bad timestamp
        "{\"sensor\": \"b\", \"value\": 7, \"at\": \"2024-05-01T10:00:05\", \"extra\": [1]}\n",
    );
    let (status, answer) = server
        .post("/ingest/readings", "application/x-ndjson", body.as_bytes())
        .unwrap();
    assert_eq!(status, 200, "{answer}");
    assert!(
        answer.starts_with("{\"accepted\":3,\"rejected\":[{\"line\":3,"),
        "{answer}"
    );
    assert!(
        answer.contains("null value in column \\\"sensor\\\" violates not-null constraint"),
        "{answer}"
    );
    eventually(
        &server,
        "SELECT sensor, n, total FROM per_sensor ORDER BY sensor",
        "a 2 4\nb 1 7",
    )
    .await;
    let letters = rows(&server, "SELECT object, \"offset\", convert_from(raw, 'UTF8') AS text, error FROM eddy_dead_letters ORDER BY received_at, text").await;
    assert_eq!(letters.len(), 4, "{letters:?}");
    assert!(
        letters
            .iter()
            .all(|l| l[0].as_deref() == Some("readings") && l[1].is_none())
    );
    assert!(
        letters
            .iter()
            .any(|l| l[2].as_deref() == Some("{\"value\": 3, \"at\": \"2024-05-01T10:00:03\"}"))
    );

    // CSV by content type; a short row lacks the NOT NULL timestamp.
    let (status, answer) = server
        .post(
            "/ingest/readings",
            "text/csv",
            b"c,1,2024-05-01 11:00:00\nc,2\n",
        )
        .unwrap();
    assert_eq!(
        (status, answer.starts_with("{\"accepted\":1,")),
        (200, true),
        "{answer}"
    );

    // on_error = 'fail': one bad record refuses the whole body.
    let (status, answer) = server
        .post(
            "/ingest/strict",
            "application/json",
            b"{\"id\": 1}\n{\"id\": null}\n",
        )
        .unwrap();
    assert_eq!(status, 400, "{answer}");
    assert!(answer.contains("\"sqlstate\":\"22000\""), "{answer}");
    assert_eq!(
        rows(&server, "SELECT count(*) FROM strict").await,
        vec![vec![Some("0".into())]]
    );
    let (status, _) = server
        .post("/ingest/nowhere", "application/json", b"{}\n")
        .unwrap();
    assert_eq!(status, 404);

    // The fix: the table takes readings without a sensor; replaying adds that record (and
    // the CSV row's sibling stays: its timestamp is still missing).
    let client = server.connect().await.unwrap();
    client.batch_execute("ALTER TABLE readings ALTER COLUMN sensor DROP NOT NULL; ALTER TABLE readings REPLAY DEAD LETTERS").await.unwrap();
    eventually(
        &server,
        "SELECT sensor, n, total FROM per_sensor ORDER BY sensor",
        "a 2 4\nb 1 7\nc 1 1\nNULL 1 3",
    )
    .await;
    assert_eq!(
        rows(
            &server,
            "SELECT count(*) FROM eddy_dead_letters WHERE object = 'readings'"
        )
        .await,
        vec![vec![Some("4".into())]]
    );
}

#[tokio::test]
async fn file_connector_follows_appends_across_a_crash() {
    follows_appends_across_a_crash(None).await;
}

/// With two workers each chunk is cut into two parts decoded at once and committed one after
/// the other, each with the position after it.
#[tokio::test]
async fn file_connector_with_two_workers_follows_appends_across_a_crash() {
    follows_appends_across_a_crash(Some(2)).await;
}

async fn follows_appends_across_a_crash(workers: Option<u32>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("clicks.jsonl");
    let mut file = std::fs::File::create(&path).unwrap();
    let line = |i: usize| format!("{{\"user_id\": {}, \"url\": \"/p{i}\"}}\n", i % 5);
    for i in 0..100 {
        file.write_all(line(i).as_bytes()).unwrap();
    }
    // A poison pill and a torn last line (its writer has not finished it yet).
    file.write_all(b"{\"user_id\": \"x\"}\n{\"user_id\": 1, \"url\"")
        .unwrap();
    file.flush().unwrap();
    let data = dir.path().join("data");
    let mut server = EddyProcess::start_with(&binary(), &data, workers).unwrap();
    server
        .connect()
        .await
        .unwrap()
        .batch_execute(&format!(
            "CREATE TABLE clicks (user_id INT, url TEXT) INCLUDE offset AS pos APPEND ONLY
               WITH (connector = 'file', path = '{}') FORMAT PLAIN ENCODE JSON;
             CREATE MATERIALIZED VIEW per_user AS SELECT user_id, count(*) AS n FROM clicks GROUP BY user_id;
             CREATE MATERIALIZED VIEW total AS SELECT count(*) AS n, count(DISTINCT pos) AS positions FROM clicks;",
            path.display()
        ))
        .await
        .unwrap();
    eventually(&server, "SELECT n, positions FROM total", "100 100").await;
    let letters = rows(
        &server,
        "SELECT object, partition, \"offset\", convert_from(raw, 'UTF8') FROM eddy_dead_letters",
    )
    .await;
    let poison_at = (0..100).map(|i| line(i).len()).sum::<usize>();
    assert_eq!(
        letters,
        vec![vec![
            Some("clicks".into()),
            Some("0".into()),
            Some(poison_at.to_string()),
            Some("{\"user_id\": \"x\"}".into())
        ]]
    );

    // The torn line is finished; more lines arrive; then a crash in the middle of the stream.
    file.write_all(b": \"/torn\"}\n").unwrap();
    for i in 100..150 {
        file.write_all(line(i).as_bytes()).unwrap();
    }
    file.flush().unwrap();
    eventually(&server, "SELECT n FROM total", "151").await;
    for i in 150..400 {
        file.write_all(line(i).as_bytes()).unwrap();
    }
    file.flush().unwrap();
    server.kill().unwrap();
    for i in 400..500 {
        file.write_all(line(i).as_bytes()).unwrap();
    }
    file.flush().unwrap();
    let server = server.restart().unwrap();
    // Every line exactly once: 500 lines plus the finished torn one.
    eventually(&server, "SELECT n, positions FROM total", "501 501").await;
    eventually(
        &server,
        "SELECT user_id, n FROM per_user ORDER BY user_id",
        "0 100\n1 101\n2 100\n3 100\n4 100",
    )
    .await;
    let offsets = rows(&server, "SELECT consumer, committed_offset = high_watermark FROM eddy_source_offsets WHERE consumer LIKE 'connector%'").await;
    assert_eq!(
        offsets,
        vec![vec![Some("connector file".into()), Some("t".into())]]
    );
    assert_eq!(
        rows(&server, "SELECT count(*) FROM eddy_dead_letters").await,
        vec![vec![Some("1".into())]],
        "a letter read again after the crash is not stored twice"
    );
}

#[tokio::test]
async fn debezium_and_upsert_records_update_a_keyed_table() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cdc.jsonl");
    std::fs::write(
        &path,
        concat!(
            "{\"op\": \"r\", \"after\": {\"id\": 1, \"name\": \"ann\", \"city\": \"Oslo\"}}\n",
            "{\"op\": \"c\", \"after\": {\"id\": 2, \"name\": \"bob\", \"city\": \"Rome\"}}\n",
            "{\"schema\": {}, \"payload\": {\"op\": \"u\", \"before\": {\"id\": 1}, \"after\": {\"id\": 1, \"name\": \"ann\", \"city\": \"Paris\"}}}\n",
            "{\"op\": \"d\", \"before\": {\"id\": 2}}\n",
            "{\"op\": \"c\", \"after\": {\"id\": 3, \"name\": \"cid\", \"city\": \"Oslo\"}}\n",
            "{\"op\": \"z\"}\n",
        ),
    )
    .unwrap();
    let server = EddyProcess::start_fresh(&binary()).unwrap();
    server
        .connect()
        .await
        .unwrap()
        .batch_execute(&format!(
            "CREATE TABLE people (id INT PRIMARY KEY, name TEXT, city TEXT) WITH (connector = 'file', path = '{}', partitions = 2) FORMAT DEBEZIUM ENCODE JSON;
             CREATE MATERIALIZED VIEW per_city AS SELECT city, count(*) AS n FROM people GROUP BY city;",
            path.display()
        ))
        .await
        .unwrap();
    eventually(
        &server,
        "SELECT city, n FROM per_city ORDER BY city",
        "Oslo 1\nParis 1",
    )
    .await;
    assert_eq!(
        rows(&server, "SELECT error FROM eddy_dead_letters").await,
        vec![vec![Some("unknown Debezium op \"z\"".into())]]
    );
    // HTTP ingest into the same table speaks its format too: a snapshot record read again
    // replaces the row (idempotent).
    let (status, answer) = server.post("/ingest/people", "application/json", b"{\"op\": \"r\", \"after\": {\"id\": 3, \"name\": \"cid\", \"city\": \"Oslo\"}}\n{\"op\": \"u\", \"after\": {\"id\": 1, \"name\": \"ann\", \"city\": \"Oslo\"}}\n").unwrap();
    assert_eq!(status, 200, "{answer}");
    eventually(
        &server,
        "SELECT city, n FROM per_city ORDER BY city",
        "Oslo 2",
    )
    .await;
    eventually(
        &server,
        "SELECT id, name, city FROM people ORDER BY id",
        "1 ann Oslo\n3 cid Oslo",
    )
    .await;
}

#[tokio::test]
async fn a_file_source_is_read_again_by_every_view_it_feeds() {
    let dir = tempfile::tempdir().unwrap();
    let cdc = dir.path().join("cdc.jsonl");
    let events = dir.path().join("events.csv");
    std::fs::write(
        &cdc,
        concat!(
            "{\"op\": \"c\", \"after\": {\"id\": 1, \"name\": \"ann\", \"city\": \"Oslo\"}}\n",
            "{\"op\": \"c\", \"after\": {\"id\": 2, \"name\": \"bob\", \"city\": \"Rome\"}}\n",
            "{\"op\": \"u\", \"before\": {\"id\": 1}, \"after\": {\"id\": 1, \"name\": \"ann\", \"city\": \"Rome\"}}\n",
            "{\"op\": \"c\", \"after\": {\"id\": 3, \"name\": \"cid\"}}\n",
        ),
    )
    .unwrap();
    std::fs::write(&events, "1,10\n2,x\n3,30\n").unwrap();
    let data = dir.path().join("data");
    let mut server = EddyProcess::start(&binary(), &data).unwrap();
    let client = server.connect().await.unwrap();
    client
        .batch_execute(&format!(
            "CREATE SOURCE people (id INT PRIMARY KEY, name TEXT, city TEXT NOT NULL) WITH (connector = 'file', path = '{}') FORMAT DEBEZIUM ENCODE JSON;
             CREATE SOURCE events (id INT, amount BIGINT) WITH (connector = 'file', path = '{}', on_error = 'skip') FORMAT PLAIN ENCODE CSV;
             CREATE MATERIALIZED VIEW per_city AS SELECT city, count(*) AS n FROM people GROUP BY city;
             CREATE MATERIALIZED VIEW spent AS SELECT p.name, sum(e.amount) AS total FROM events e JOIN people p ON p.id = e.id GROUP BY p.name;",
            cdc.display(),
            events.display()
        ))
        .await
        .unwrap();
    // Each view reads every source it names itself, to the end, before CREATE returns.
    assert_eq!(
        rows(&server, "SELECT city, n FROM per_city ORDER BY city").await,
        vec![vec![Some("Rome".into()), Some("2".into())]]
    );
    assert_eq!(
        rows(&server, "SELECT name, total FROM spent ORDER BY name").await,
        vec![vec![Some("ann".into()), Some("10".into())]]
    );
    // The record without a city is a dead letter (once, though two views read it); the bad
    // CSV line is skipped and counted.
    assert_eq!(
        rows(&server, "SELECT object, error FROM eddy_dead_letters")
            .await
            .len(),
        1
    );
    let skipped = rows(
        &server,
        "SELECT consumer, skipped FROM eddy_source_offsets WHERE object = 'events'",
    )
    .await;
    assert_eq!(skipped, vec![vec![Some("spent".into()), Some("1".into())]]);
    assert_eq!(rows(&server, "SHOW CREATE SOURCE events").await[0][1].as_deref(), Some(format!("CREATE SOURCE events (id integer, amount bigint) WITH (connector = 'file', path = '{}', on_error = 'skip') FORMAT PLAIN ENCODE CSV", events.display()).as_str()));

    // The fix, then a replay into the views reading the source now.
    client.batch_execute("ALTER SOURCE people ALTER COLUMN city DROP NOT NULL; ALTER SOURCE people REPLAY DEAD LETTERS").await.unwrap();
    eventually(
        &server,
        "SELECT city, n FROM per_city ORDER BY city",
        "Rome 2\nNULL 1",
    )
    .await;
    eventually(
        &server,
        "SELECT name, total FROM spent ORDER BY name",
        "ann 10\ncid 30",
    )
    .await;
    assert_eq!(
        rows(&server, "SELECT count(*) FROM eddy_dead_letters").await,
        vec![vec![Some("0".into())]]
    );

    // More records, a crash, more records: the views read their sources again from the start
    // with the fixed definition and arrive at the same state, plus what came since.
    std::fs::OpenOptions::new()
        .append(true)
        .open(&cdc)
        .unwrap()
        .write_all(b"{\"op\": \"d\", \"before\": {\"id\": 2}}\n")
        .unwrap();
    eventually(
        &server,
        "SELECT city, n FROM per_city ORDER BY city",
        "Rome 1\nNULL 1",
    )
    .await;
    server.kill().unwrap();
    std::fs::OpenOptions::new()
        .append(true)
        .open(&events)
        .unwrap()
        .write_all(b"1,5\n")
        .unwrap();
    let server = server.restart().unwrap();
    eventually(
        &server,
        "SELECT city, n FROM per_city ORDER BY city",
        "Rome 1\nNULL 1",
    )
    .await;
    eventually(
        &server,
        "SELECT name, total FROM spent ORDER BY name",
        "ann 15\ncid 30",
    )
    .await;
    assert_eq!(
        rows(&server, "SELECT count(*) FROM eddy_dead_letters").await,
        vec![vec![Some("0".into())]]
    );
}
