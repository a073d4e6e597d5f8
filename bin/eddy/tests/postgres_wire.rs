//! The same client calls against Eddy and a PostgreSQL 15 that the test starts, compared:
//! COPY TO STDOUT in text, CSV and binary; the extended protocol's row limit (portals
//! suspended and resumed, as JDBC's setFetchSize does); SQL cursors fetched over the extended
//! protocol (psycopg's server-side cursors); savepoints and the transaction state that
//! ReadyForQuery reports after ROLLBACK TO.

use bytes::Bytes;
use eddy_testkit::EddyProcess;
use eddy_testkit::postgres::PostgresServer;
use futures::{StreamExt, TryStreamExt, pin_mut};
use tokio_postgres::Client;

const SETUP: &str = "CREATE TABLE t (id INT PRIMARY KEY, name TEXT, price NUMERIC(8,2), score DOUBLE PRECISION, at TIMESTAMP, ok BOOLEAN);
INSERT INTO t VALUES
  (1, 'plain', 1.50, 0.5, '2024-02-29 13:45:01.5', true),
  (2, NULL, NULL, NULL, NULL, NULL),
  (3, 'tab	and \\ backslash', -2.00, -0.0, '1999-12-31 23:59:59', false),
  (4, '', 0.00, 1e300, '2024-01-01 00:00:00', true),
  (5, 'quote \" comma , newline
here', 12.34, 3.25, '2000-01-01 00:00:00', false),
  (6, 'ünïcödé ✓', 99.99, 7.0, '2030-06-15 08:30:00', NULL);";

async fn both() -> (EddyProcess, PostgresServer, Client, Client) {
    let eddy = EddyProcess::start_fresh(std::path::Path::new(env!("CARGO_BIN_EXE_eddy"))).unwrap();
    let pg = PostgresServer::start().expect("start PostgreSQL 15 (bin/test installs it)");
    let e = eddy.connect().await.unwrap();
    let p = pg.connect().await.unwrap();
    for c in [&e, &p] {
        c.batch_execute(SETUP).await.unwrap();
    }
    (eddy, pg, e, p)
}

async fn copy_out(client: &Client, sql: &str) -> Vec<u8> {
    let stream = client
        .copy_out(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    pin_mut!(stream);
    let mut out = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk: Bytes = chunk.unwrap();
        out.extend_from_slice(&chunk);
    }
    out
}

#[tokio::test]
async fn copy_to_stdout_matches_postgres() {
    let (_eddy, _pg, e, p) = both().await;
    for sql in [
        "COPY t TO STDOUT",
        "COPY t (id, name) TO STDOUT WITH (FORMAT csv, HEADER)",
        "COPY t TO STDOUT WITH (FORMAT csv)",
        "COPY t TO STDOUT WITH (FORMAT text, HEADER true, DELIMITER '|', NULL 'nil')",
        "COPY (SELECT id, name, price FROM t WHERE id > 2 ORDER BY id DESC) TO STDOUT WITH CSV HEADER",
        "COPY (SELECT id, price, ok FROM t ORDER BY id) TO STDOUT WITH (FORMAT binary)",
        "COPY (SELECT name FROM t WHERE false) TO STDOUT WITH (FORMAT binary)",
    ] {
        let mut want = copy_out(&p, sql).await;
        let mut got = copy_out(&e, sql).await;
        if !sql.contains("ORDER BY") && !sql.contains("binary") {
            // A table's rows come in no particular order: compare them as sorted lines.
            let sorted = |bytes: &[u8]| {
                let text = String::from_utf8(bytes.to_vec()).unwrap();
                let mut lines: Vec<&str> = text.split_inclusive('\n').collect();
                lines.sort();
                lines.concat().into_bytes()
            };
            want = sorted(&want);
            got = sorted(&got);
        }
        assert_eq!(
            String::from_utf8_lossy(&got),
            String::from_utf8_lossy(&want),
            "{sql}"
        );
        assert_eq!(got, want, "{sql}");
    }
    // COPY to a server file is refused on both (a superuser may on PostgreSQL; Eddy never).
    let err = e
        .batch_execute("COPY t TO '/tmp/eddy-copy-out'")
        .await
        .unwrap_err();
    assert_eq!(err.code().unwrap().code(), "42501");
}

#[tokio::test]
async fn portal_row_limit_suspends_and_resumes() {
    let (_eddy, _pg, mut e, mut p) = both().await;
    for client in [&mut e, &mut p] {
        let txn = client.transaction().await.unwrap();
        let statement = txn
            .prepare("SELECT id, name FROM t WHERE id >= $1 ORDER BY id")
            .await
            .unwrap();
        let portal = txn.bind(&statement, &[&2i32]).await.unwrap();
        let mut pages = Vec::new();
        loop {
            let rows = txn.query_portal(&portal, 2).await.unwrap();
            if rows.is_empty() {
                break;
            }
            pages.push(rows.iter().map(|r| r.get::<_, i32>(0)).collect::<Vec<_>>());
        }
        assert_eq!(pages, vec![vec![2, 3], vec![4, 5], vec![6]]);
        txn.commit().await.unwrap();
    }
}

/// What psycopg's named cursors do: DECLARE over the extended protocol, FETCH FORWARD n in
/// binary, CLOSE, inside a transaction; and MOVE.
#[tokio::test]
async fn sql_cursors_over_the_extended_protocol() {
    let (_eddy, _pg, mut e, mut p) = both().await;
    let mut results = Vec::new();
    for client in [&mut e, &mut p] {
        let txn = client.transaction().await.unwrap();
        txn.execute("DECLARE \"my cursor\" NO SCROLL CURSOR FOR SELECT id, price, at FROM t WHERE id <> $1 ORDER BY id", &[&3i32]).await.unwrap();
        let mut seen = Vec::new();
        loop {
            let rows = txn
                .query("FETCH FORWARD 2 FROM \"my cursor\"", &[])
                .await
                .unwrap();
            if rows.is_empty() {
                break;
            }
            for r in &rows {
                seen.push(format!(
                    "{:?} {:?}",
                    r.get::<_, i32>(0),
                    r.get::<_, Option<chrono::NaiveDateTime>>(2)
                ));
            }
        }
        txn.execute("CLOSE \"my cursor\"", &[]).await.unwrap();
        txn.batch_execute("DECLARE m CURSOR FOR SELECT id FROM t ORDER BY id")
            .await
            .unwrap();
        let moved = txn.execute("MOVE FORWARD 4 IN m", &[]).await.unwrap();
        let rest: Vec<i32> = txn
            .query("FETCH ALL FROM m", &[])
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        seen.push(format!("moved {moved}, then {rest:?}"));
        txn.commit().await.unwrap();
        results.push(seen);
    }
    assert_eq!(results[0], results[1]);
}

/// ROLLBACK TO SAVEPOINT ends the failed state: the next statements run, in either protocol.
#[tokio::test]
async fn rollback_to_savepoint_recovers_a_failed_transaction() {
    let (_eddy, _pg, mut e, mut p) = both().await;
    let mut counts = Vec::new();
    for client in [&mut e, &mut p] {
        let mut txn = client.transaction().await.unwrap();
        txn.execute("INSERT INTO t (id, name) VALUES (10, 'ten')", &[])
            .await
            .unwrap();
        let nested = txn.savepoint("nested").await.unwrap();
        let err = nested
            .execute("INSERT INTO t (id) VALUES (1)", &[])
            .await
            .unwrap_err();
        assert_eq!(err.code().unwrap().code(), "23505");
        nested.rollback().await.unwrap();
        // Extended protocol after the rollback to the savepoint.
        let n: i64 = txn
            .query_one("SELECT count(*) FROM t WHERE id = $1", &[&10i32])
            .await
            .unwrap()
            .get(0);
        txn.batch_execute("SAVEPOINT s2; INSERT INTO t (id) VALUES (1)")
            .await
            .unwrap_err();
        txn.batch_execute(
            "ROLLBACK TO SAVEPOINT s2; INSERT INTO t (id, name) VALUES (11, 'eleven')",
        )
        .await
        .unwrap();
        txn.commit().await.unwrap();
        let total: i64 = client
            .query_one("SELECT count(*) FROM t", &[])
            .await
            .unwrap()
            .get(0);
        counts.push((n, total));
    }
    assert_eq!(counts[0], counts[1]);
    assert_eq!(counts[0], (1, 8));
}

#[tokio::test]
async fn copy_rows_stream_in_order_with_a_header_from_a_view() {
    let (_eddy, _pg, e, _p) = both().await;
    e.batch_execute(
        "CREATE MATERIALIZED VIEW priced AS SELECT id, price FROM t WHERE price IS NOT NULL; FLUSH",
    )
    .await
    .unwrap();
    let out = String::from_utf8(
        copy_out(
            &e,
            "COPY (SELECT * FROM priced ORDER BY id) TO STDOUT (FORMAT csv, HEADER)",
        )
        .await,
    )
    .unwrap();
    assert_eq!(out, "id,price\n1,1.50\n3,-2.00\n4,0.00\n5,12.34\n6,99.99\n");
    let lines: Vec<String> = e
        .copy_out("COPY priced TO STDOUT")
        .await
        .unwrap()
        .map_ok(|b| String::from_utf8(b.to_vec()).unwrap())
        .try_collect()
        .await
        .unwrap();
    assert_eq!(lines.len(), 5);
}

/// Result column names and types, as RowDescription carries them, against PostgreSQL's.
#[tokio::test]
async fn result_columns_are_named_and_typed_as_postgres_does() {
    let (_eddy, _pg, e, p) = both().await;
    for sql in [
        "SELECT count(*), count(id), sum(id), avg(price), max(name) FROM t",
        "SELECT 1, 1.5, 'x', 'x'::varchar, true, NULL::int, 2147483648",
        "SELECT id AS \"Id\", count(*) AS \"n(x)\", price * 2, upper(name) FROM t GROUP BY id, price, name",
        "SELECT t.* FROM t WHERE false",
        "SELECT CASE WHEN id > 1 THEN 'a' END, coalesce(name, '-'), now()::date AS day FROM t",
        // Columns that share a name (DBeaver's first query reads `n.oid, n.*`).
        "SELECT t.id, t.*, id, 1 AS id FROM t",
        "SELECT COUNT(*), count(*), Sum(id) FROM t",
        "SELECT a.*, b.* FROM t AS a JOIN t AS b USING (id)",
        "SELECT 1 AS x, 2 AS x UNION ALL SELECT 3, 4",
    ] {
        let columns = |s: &tokio_postgres::Statement| {
            s.columns()
                .iter()
                .map(|c| format!("{}:{}", c.name(), c.type_()))
                .collect::<Vec<_>>()
        };
        let want = columns(&p.prepare(sql).await.unwrap());
        let got = columns(
            &e.prepare(sql)
                .await
                .unwrap_or_else(|err| panic!("{sql}: {err}")),
        );
        assert_eq!(got, want, "{sql}");
    }
}

/// Sends Parse then Flush (no Sync) on a fresh connection and returns what answers the Parse:
/// `Ok(())` for ParseComplete, `Err(sqlstate)` for an ErrorResponse.
async fn parse_alone(port: u16, database: &str, sql: &str) -> Result<(), String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut socket = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let mut startup = Vec::new();
    startup.extend_from_slice(&196608u32.to_be_bytes());
    for part in ["user", "eddy", "database", database] {
        startup.extend_from_slice(part.as_bytes());
        startup.push(0);
    }
    startup.push(0);
    let mut message = ((startup.len() + 4) as u32).to_be_bytes().to_vec();
    message.extend_from_slice(&startup);
    socket.write_all(&message).await.unwrap();
    // One message: its tag and body.
    async fn read(socket: &mut tokio::net::TcpStream) -> (u8, Vec<u8>) {
        let tag = socket.read_u8().await.unwrap();
        let len = socket.read_u32().await.unwrap() as usize;
        let mut body = vec![0; len - 4];
        socket.read_exact(&mut body).await.unwrap();
        (tag, body)
    }
    while read(&mut socket).await.0 != b'Z' {}
    let mut parse = vec![0u8]; // the unnamed statement
    parse.extend_from_slice(sql.as_bytes());
    parse.push(0);
    parse.extend_from_slice(&0u16.to_be_bytes());
    let mut out = vec![b'P'];
    out.extend_from_slice(&((parse.len() + 4) as u32).to_be_bytes());
    out.extend_from_slice(&parse);
    out.extend_from_slice(&[b'H', 0, 0, 0, 4]);
    socket.write_all(&out).await.unwrap();
    loop {
        match read(&mut socket).await {
            (b'1', _) => return Ok(()),
            (b'E', body) => {
                let code = body
                    .split(|b| *b == 0)
                    .find_map(|field| field.strip_prefix(b"C"))
                    .unwrap_or_default();
                return Err(String::from_utf8_lossy(code).into_owned());
            }
            // Notices and parameter statuses may come first.
            _ => continue,
        }
    }
}

/// An error in a query or DML statement arrives at Parse, as PostgreSQL reports it there (not
/// at Describe or Execute); a utility statement is checked when it runs.
#[tokio::test]
async fn errors_in_a_query_arrive_at_parse() {
    let (eddy, pg, _e, _p) = both().await;
    for sql in [
        "SELECT * FROM no_such_table",
        "SELECT no_such_column FROM t",
        "SELECT no_such_function(id) FROM t",
        "INSERT INTO no_such_table VALUES (1)",
        "UPDATE t SET no_such_column = 1",
        "DELETE FROM t WHERE no_such_column = 1",
        "SELECT id FROM t WHERE id = $1",
        "CREATE TABLE later (a INT)",
        "DROP TABLE no_such_table",
    ] {
        let want = parse_alone(pg.port, "postgres", sql).await;
        let got = parse_alone(eddy.port, "eddy", sql).await;
        assert_eq!(got, want, "{sql}");
    }
}

/// `COPY t (columns) FROM STDIN` fills the columns it leaves out with their DEFAULT.
#[tokio::test]
async fn copy_from_fills_defaults() {
    use futures::SinkExt;
    let (_eddy, _pg, e, p) = both().await;
    let mut answers = Vec::new();
    for c in [&e, &p] {
        c.batch_execute("CREATE TABLE d (id INT PRIMARY KEY, status VARCHAR(10) DEFAULT 'new', qty INT DEFAULT 1 + 1, note TEXT)")
            .await
            .unwrap();
        let sink = c.copy_in("COPY d (id, note) FROM STDIN").await.unwrap();
        pin_mut!(sink);
        sink.send(Bytes::from_static(b"1\tone\n2\t\\N\n"))
            .await
            .unwrap();
        sink.finish().await.unwrap();
        let rows = c
            .simple_query("SELECT id, status, qty, note FROM d ORDER BY id")
            .await
            .unwrap();
        let text: Vec<Vec<Option<String>>> = rows
            .iter()
            .filter_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) => {
                    Some((0..4).map(|i| r.get(i).map(str::to_owned)).collect())
                }
                _ => None,
            })
            .collect();
        answers.push(text);
    }
    assert_eq!(answers[0], answers[1]);
    assert_eq!(answers[0][0][1].as_deref(), Some("new"));
}
