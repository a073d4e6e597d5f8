//! Arrays and jsonb as drivers see them, against Eddy and a real PostgreSQL 15 alike: results
//! read in binary by tokio-postgres (`Vec<i32>`, `Vec<Option<String>>`, `Vec<f64>`, `Vec<bool>`,
//! jsonb's version byte), array parameters sent in binary (as psycopg sends Python lists and JDBC
//! `createArrayOf`) and in text, the column types drivers are told (RowDescription OIDs), and
//! COPY FROM with array columns in text and CSV.

use std::error::Error;

use bytes::Bytes;
use eddy_testkit::EddyProcess;
use eddy_testkit::postgres::PostgresServer;
use futures::SinkExt;
use tokio_postgres::Client;
use tokio_postgres::types::{FromSql, Type};

/// A jsonb value read in binary: its version byte must be 1, then the text.
#[derive(Debug, PartialEq)]
struct Jsonb(serde_json::Value);

impl<'a> FromSql<'a> for Jsonb {
    fn from_sql(ty: &Type, raw: &'a [u8]) -> Result<Self, Box<dyn Error + Sync + Send>> {
        let text = if *ty == Type::JSONB {
            match raw.split_first() {
                Some((1, rest)) => rest,
                _ => return Err("jsonb binary without version byte 1".into()),
            }
        } else {
            raw
        };
        Ok(Jsonb(serde_json::from_slice(text)?))
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::JSONB || *ty == Type::JSON
    }
}

const SETUP: &str = "CREATE TABLE items (id INT PRIMARY KEY, ints INT[], names TEXT[], scores DOUBLE PRECISION[], flags BOOLEAN[], big BIGINT[], doc JSONB)";

/// What one client sees of the statements below, compared between the two servers.
async fn observe(client: &Client) -> Vec<String> {
    let mut seen = Vec::new();
    client.batch_execute(SETUP).await.unwrap();
    client
        .batch_execute("INSERT INTO items VALUES (1, ARRAY[1, 2], ARRAY['a b', NULL], ARRAY[1.5], ARRAY[true, false], ARRAY[10000000000], '{\"b\": [1, 2], \"a\": 1}')")
        .await
        .unwrap();
    // Parameters in binary: lists as arrays, a jsonb value.
    let ints: Vec<i32> = vec![3, 4, 5];
    let names: Vec<Option<String>> = vec![Some("x,y".into()), None, Some("\"q\"".into())];
    let scores: Vec<f64> = vec![0.25, -1.0];
    let flags: Vec<bool> = vec![true];
    let big: Vec<i64> = vec![-1, i64::MAX];
    let insert = client
        .prepare("INSERT INTO items VALUES (2, $1, $2, $3, $4, $5, NULL)")
        .await
        .unwrap();
    seen.push(format!(
        "params {:?}",
        insert.params().iter().map(Type::name).collect::<Vec<_>>()
    ));
    client
        .execute(&insert, &[&ints, &names, &scores, &flags, &big])
        .await
        .unwrap();
    // An empty list and a text-format array parameter.
    let empty: Vec<i32> = Vec::new();
    client
        .execute("INSERT INTO items (id, ints) VALUES (3, $1)", &[&empty])
        .await
        .unwrap();
    client
        .execute(
            "INSERT INTO items (id, names) VALUES (4, $1::text::text[])",
            &[&"{p,\"q r\"}"],
        )
        .await
        .unwrap();
    // Results in binary.
    let rows = client
        .query(
            "SELECT id, ints, names, scores, flags, big, doc FROM items ORDER BY id",
            &[],
        )
        .await
        .unwrap();
    seen.push(format!(
        "types {:?}",
        rows[0]
            .columns()
            .iter()
            .map(|c| c.type_().name())
            .collect::<Vec<_>>()
    ));
    for row in &rows {
        let id: i32 = row.get(0);
        let ints: Option<Vec<i32>> = row.get(1);
        let names: Option<Vec<Option<String>>> = row.get(2);
        let scores: Option<Vec<f64>> = row.get(3);
        let flags: Option<Vec<bool>> = row.get(4);
        let big: Option<Vec<i64>> = row.get(5);
        let doc: Option<Jsonb> = row.get(6);
        seen.push(format!(
            "{id} {ints:?} {names:?} {scores:?} {flags:?} {big:?} {doc:?}"
        ));
    }
    // Array parameters where arrays are expected: = ANY($1), and array functions.
    let wanted: Vec<i32> = vec![1, 4];
    let rows = client
        .query(
            "SELECT id FROM items WHERE ints[1] = ANY($1::int[]) ORDER BY id",
            &[&wanted],
        )
        .await
        .unwrap();
    seen.push(format!(
        "any {:?}",
        rows.iter().map(|r| r.get::<_, i32>(0)).collect::<Vec<_>>()
    ));
    let row = client
        .query_one(
            "SELECT cardinality($1::int[]), $1::int[] || 9, ARRAY['a', NULL]",
            &[&wanted],
        )
        .await
        .unwrap();
    seen.push(format!(
        "functions {} {:?} {:?}",
        row.get::<_, i32>(0),
        row.get::<_, Vec<i32>>(1),
        row.get::<_, Vec<Option<String>>>(2)
    ));
    let row = client
        .query_one(
            "SELECT '{\"k\": [1, \"v\"]}'::jsonb -> 'k', jsonb_build_object('a', 1)",
            &[],
        )
        .await
        .unwrap();
    seen.push(format!(
        "jsonb {:?} {:?}",
        row.get::<_, Jsonb>(0),
        row.get::<_, Jsonb>(1)
    ));
    // COPY FROM with array columns, text and CSV.
    let sink = client
        .copy_in("COPY items (id, ints, names) FROM STDIN")
        .await
        .unwrap();
    futures::pin_mut!(sink);
    sink.send(Bytes::from_static(
        b"10\t{7,8}\t{\"a b\",NULL,c}\n11\t\\N\t{}\n",
    ))
    .await
    .unwrap();
    seen.push(format!("copy text {}", sink.finish().await.unwrap()));
    let sink = client
        .copy_in("COPY items (id, ints, names) FROM STDIN WITH (FORMAT csv)")
        .await
        .unwrap();
    futures::pin_mut!(sink);
    sink.send(Bytes::from_static(b"12,\"{1,2}\",\"{\"\"x, y\"\",z}\"\n"))
        .await
        .unwrap();
    seen.push(format!("copy csv {}", sink.finish().await.unwrap()));
    for row in client
        .simple_query("SELECT id, ints, names FROM items WHERE id >= 10 ORDER BY id")
        .await
        .unwrap()
    {
        if let tokio_postgres::SimpleQueryMessage::Row(row) = row {
            seen.push(format!(
                "copied {:?} {:?} {:?}",
                row.get(0),
                row.get(1),
                row.get(2)
            ));
        }
    }
    seen
}

#[tokio::test]
async fn arrays_and_jsonb_reach_drivers_as_in_postgres() {
    let pg = PostgresServer::start().expect("PostgreSQL 15 (apt-get install postgresql)");
    let eddy = EddyProcess::start_fresh(std::path::Path::new(env!("CARGO_BIN_EXE_eddy")))
        .expect("eddy starts");
    let expected = observe(&pg.connect().await.expect("connect to PostgreSQL")).await;
    let got = observe(&eddy.connect().await.expect("connect to eddy")).await;
    assert_eq!(
        got, expected,
        "\neddy:     {got:#?}\npostgres: {expected:#?}"
    );
}
