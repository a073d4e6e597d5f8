//! The extended protocol as drivers (psycopg, JDBC, node-postgres) use it: named prepared
//! statements, binary parameters and results, inferred parameter types, pipelining, COPY, and
//! errors that leave the connection usable.

use eddy_testkit::EddyProcess;
use futures::{SinkExt, future::try_join_all};

async fn server() -> EddyProcess {
    EddyProcess::start_fresh(std::path::Path::new(env!("CARGO_BIN_EXE_eddy"))).unwrap()
}

#[tokio::test]
async fn prepared_statements_with_binary_parameters() {
    let server = server().await;
    let client = server.connect().await.unwrap();
    client
        .batch_execute("CREATE TABLE t (id BIGINT PRIMARY KEY, name TEXT, score DOUBLE PRECISION, ok BOOLEAN, small SMALLINT, at TIMESTAMP, day DATE, raw BYTEA)")
        .await
        .unwrap();
    // tokio-postgres sends no parameter types: Eddy infers them from the target columns.
    let insert = client
        .prepare("INSERT INTO t VALUES ($1, $2, $3, $4, $5, $6, $7, $8)")
        .await
        .unwrap();
    assert_eq!(insert.params().len(), 8);
    assert_eq!(insert.params()[0], tokio_postgres::types::Type::INT8);
    let at = chrono::NaiveDate::from_ymd_opt(2024, 2, 29)
        .unwrap()
        .and_hms_micro_opt(13, 45, 1, 500)
        .unwrap();
    let day = chrono::NaiveDate::from_ymd_opt(2024, 2, 29).unwrap();
    for i in 0..5i64 {
        let name = format!("n{i}");
        let score = i as f64 / 2.0;
        let small = i as i16;
        let raw = vec![i as u8, 255];
        client
            .execute(
                &insert,
                &[&i, &name, &score, &(i % 2 == 0), &small, &at, &day, &raw],
            )
            .await
            .unwrap();
    }
    let select = client.prepare("SELECT id, name, score, ok, small, at, day, raw FROM t WHERE id >= $1 AND name <> $2 ORDER BY id").await.unwrap();
    assert_eq!(select.columns().len(), 8);
    let rows = client.query(&select, &[&2i64, &"n3"]).await.unwrap();
    let ids: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
    assert_eq!(ids, vec![2, 4]);
    let row = &rows[0];
    assert_eq!(row.get::<_, String>(1), "n2");
    assert_eq!(row.get::<_, f64>(2), 1.0);
    assert!(row.get::<_, bool>(3));
    assert_eq!(row.get::<_, i16>(4), 2);
    assert_eq!(row.get::<_, chrono::NaiveDateTime>(5), at);
    assert_eq!(row.get::<_, chrono::NaiveDate>(6), day);
    assert_eq!(row.get::<_, Vec<u8>>(7), vec![2u8, 255]);
    // A named statement is reusable, and parameters flow into UPDATE and DELETE.
    let update = client
        .prepare("UPDATE t SET name = $1 WHERE id = $2")
        .await
        .unwrap();
    assert_eq!(
        client.execute(&update, &[&"renamed", &1i64]).await.unwrap(),
        1
    );
    assert_eq!(
        client.execute(&update, &[&"again", &1i64]).await.unwrap(),
        1
    );
    assert_eq!(
        client
            .execute("DELETE FROM t WHERE id = $1", &[&0i64])
            .await
            .unwrap(),
        1
    );
    let name: String = client
        .query_one("SELECT name FROM t WHERE id = $1", &[&1i64])
        .await
        .unwrap()
        .get(0);
    assert_eq!(name, "again");
}

#[tokio::test]
async fn pipelined_queries_and_errors_keep_the_connection() {
    let server = server().await;
    let client = server.connect().await.unwrap();
    client
        .batch_execute("CREATE TABLE p (x INT PRIMARY KEY)")
        .await
        .unwrap();
    let statement = client.prepare("INSERT INTO p VALUES ($1)").await.unwrap();
    // tokio-postgres pipelines these: several Bind/Execute before reading any answer.
    let futures = (0..50).map(|i: i32| {
        let client = &client;
        let statement = &statement;
        async move { client.execute(statement, &[&i]).await }
    });
    try_join_all(futures).await.unwrap();
    let n: i64 = client
        .query_one("SELECT count(*) FROM p", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 50);
    let err = client.execute(&statement, &[&1i32]).await.unwrap_err();
    assert_eq!(err.code().unwrap().code(), "23505");
    let err = client.prepare("SELECT * FROM missing").await.unwrap_err();
    assert_eq!(err.code().unwrap().code(), "42P01");
    let err = client.prepare("SELEC 1").await.unwrap_err();
    assert_eq!(err.code().unwrap().code(), "42601");
    let one: i64 = client
        .query_one("SELECT 1::bigint", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(one, 1);
}

#[tokio::test]
async fn copy_from_stdin_text_and_csv() {
    let server = server().await;
    let client = server.connect().await.unwrap();
    client
        .batch_execute("CREATE TABLE c (id INT NOT NULL, name TEXT, raw BYTEA)")
        .await
        .unwrap();
    let sink = client.copy_in("COPY c FROM STDIN").await.unwrap();
    futures::pin_mut!(sink);
    sink.send(bytes::Bytes::from_static(
        b"1\tone\t\\\\x0aff\n2\t\\N\t\\N\n",
    ))
    .await
    .unwrap();
    assert_eq!(sink.finish().await.unwrap(), 2);
    let sink = client
        .copy_in("COPY c (id, name) FROM STDIN WITH (FORMAT csv, HEADER true)")
        .await
        .unwrap();
    futures::pin_mut!(sink);
    sink.send(bytes::Bytes::from_static(b"id,name\n3,\"x, y\"\n"))
        .await
        .unwrap();
    assert_eq!(sink.finish().await.unwrap(), 1);
    // A bad row rejects the whole COPY, with the right SQLSTATE, and the connection goes on.
    let sink = client.copy_in("COPY c FROM STDIN").await.unwrap();
    futures::pin_mut!(sink);
    sink.send(bytes::Bytes::from_static(
        b"4\tok\t\\N\nnot-a-number\tbad\t\\N\n",
    ))
    .await
    .unwrap();
    let err = sink.finish().await.unwrap_err();
    assert_eq!(err.code().unwrap().code(), "22P02");
    let rows = client
        .query("SELECT id, name, raw FROM c ORDER BY id", &[])
        .await
        .unwrap();
    assert_eq!(rows.len(), 3);
    assert_eq!(rows[0].get::<_, Option<Vec<u8>>>(2), Some(vec![10u8, 255]));
    assert_eq!(rows[2].get::<_, String>(1), "x, y");
}

/// `--max-connections` bounds the clients connected at once: the next one is refused as
/// PostgreSQL refuses it (FATAL 53300), the connected ones go on, and a closed connection's
/// slot is free again.
#[tokio::test]
async fn connections_past_max_connections_are_refused_with_53300() {
    let binary = std::path::Path::new(env!("CARGO_BIN_EXE_eddy"));
    let server =
        EddyProcess::start_fresh_args(binary, &["--max-connections".into(), "2".into()]).unwrap();
    let first = server.connect().await.unwrap();
    let second = server.connect().await.unwrap();
    let Err(refused) = server.connect().await else {
        panic!("a third connection was let in");
    };
    let refused = refused
        .downcast_ref::<tokio_postgres::Error>()
        .and_then(|e| e.as_db_error())
        .unwrap_or_else(|| panic!("not a database error: {refused:#}"));
    assert_eq!(refused.code().code(), "53300");
    assert_eq!(refused.severity(), "FATAL");
    assert_eq!(refused.message(), "sorry, too many clients already");
    for client in [&first, &second] {
        assert_eq!(
            client
                .query_one("SELECT 1 + 1", &[])
                .await
                .unwrap()
                .get::<_, i32>(0),
            2
        );
    }
    // The server learns that a connection closed when its socket does: ask until it has.
    drop(first);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let third = loop {
        match server.connect().await {
            Ok(client) => break client,
            Err(e) => {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the closed connection's slot was never freed: {e:#}"
                );
                tokio::task::yield_now().await;
            }
        }
    };
    third.batch_execute("SELECT 1").await.unwrap();
}
