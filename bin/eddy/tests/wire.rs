//! The wire below the drivers: start-up parameters, ParameterStatus after SET, cancel
//! requests, and malformed messages that must not hurt the server or other sessions.

use std::time::Duration;

use eddy_testkit::EddyProcess;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn server() -> EddyProcess {
    EddyProcess::start_fresh(std::path::Path::new(env!("CARGO_BIN_EXE_eddy"))).unwrap()
}

/// A bare-bones frontend: enough to send start-up and queries and read typed messages.
struct Raw {
    stream: TcpStream,
}

impl Raw {
    async fn connect(port: u16, params: &[(&str, &str)]) -> Raw {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let mut body = Vec::new();
        body.extend_from_slice(&196608i32.to_be_bytes());
        for (k, v) in params {
            body.extend_from_slice(k.as_bytes());
            body.push(0);
            body.extend_from_slice(v.as_bytes());
            body.push(0);
        }
        body.push(0);
        stream
            .write_all(&((body.len() + 4) as i32).to_be_bytes())
            .await
            .unwrap();
        stream.write_all(&body).await.unwrap();
        Raw { stream }
    }

    async fn send(&mut self, tag: u8, body: &[u8]) {
        self.stream.write_all(&[tag]).await.unwrap();
        self.stream
            .write_all(&((body.len() + 4) as i32).to_be_bytes())
            .await
            .unwrap();
        self.stream.write_all(body).await.unwrap();
    }

    async fn query(&mut self, sql: &str) {
        let mut body = sql.as_bytes().to_vec();
        body.push(0);
        self.send(b'Q', &body).await;
    }

    /// Reads messages up to and including ReadyForQuery; `None` if the server closed.
    async fn until_ready(&mut self) -> Option<Vec<(u8, Vec<u8>)>> {
        let mut out = Vec::new();
        loop {
            let mut tag = [0u8; 1];
            let read =
                tokio::time::timeout(Duration::from_secs(30), self.stream.read_exact(&mut tag))
                    .await
                    .ok()?;
            read.ok()?;
            let mut len = [0u8; 4];
            self.stream.read_exact(&mut len).await.ok()?;
            let mut body = vec![0u8; i32::from_be_bytes(len) as usize - 4];
            self.stream.read_exact(&mut body).await.ok()?;
            let done = tag[0] == b'Z';
            out.push((tag[0], body));
            if done {
                return Some(out);
            }
        }
    }
}

fn parameter_statuses(messages: &[(u8, Vec<u8>)]) -> Vec<(String, String)> {
    messages
        .iter()
        .filter(|(t, _)| *t == b'S')
        .map(|(_, body)| {
            let mut parts = body
                .split(|b| *b == 0)
                .map(|p| String::from_utf8_lossy(p).into_owned());
            (
                parts.next().unwrap_or_default(),
                parts.next().unwrap_or_default(),
            )
        })
        .collect()
}

#[tokio::test]
async fn startup_parameters_and_parameter_status_after_set() {
    let server = server().await;
    let mut raw = Raw::connect(
        server.port,
        &[
            ("user", "alice"),
            ("database", "shop"),
            ("TimeZone", "Europe/Paris"),
            ("application_name", "raw-test"),
        ],
    )
    .await;
    let startup = raw.until_ready().await.expect("start-up completes");
    let params = parameter_statuses(&startup);
    let get = |name: &str| {
        params
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(get("server_version").as_deref(), Some("15.0 (Eddy 0.1.0)"));
    assert_eq!(get("client_encoding").as_deref(), Some("UTF8"));
    assert_eq!(get("DateStyle").as_deref(), Some("ISO, MDY"));
    assert_eq!(get("integer_datetimes").as_deref(), Some("on"));
    assert_eq!(get("standard_conforming_strings").as_deref(), Some("on"));
    assert_eq!(get("IntervalStyle").as_deref(), Some("postgres"));
    assert_eq!(get("TimeZone").as_deref(), Some("Europe/Paris"));
    assert_eq!(get("application_name").as_deref(), Some("raw-test"));
    assert!(
        startup.iter().any(|(t, _)| *t == b'K'),
        "BackendKeyData for cancel requests"
    );
    raw.query("SET TimeZone = 'Asia/Tokyo'; SET application_name = 'renamed'")
        .await;
    let reply = raw.until_ready().await.unwrap();
    let changed = parameter_statuses(&reply);
    assert!(
        changed.contains(&("TimeZone".into(), "Asia/Tokyo".into())),
        "{changed:?}"
    );
    assert!(
        changed.contains(&("application_name".into(), "renamed".into())),
        "{changed:?}"
    );
    raw.query("SELECT current_database(), current_user").await;
    let reply = raw.until_ready().await.unwrap();
    let row = reply.iter().find(|(t, _)| *t == b'D').expect("a data row");
    let text = String::from_utf8_lossy(&row.1);
    assert!(text.contains("shop") && text.contains("alice"), "{text}");
}

#[tokio::test]
async fn cancel_request_stops_a_running_query() {
    let server = server().await;
    let client = server.connect().await.unwrap();
    let token = client.cancel_token();
    // Keep cancelling until the query ends, so the test does not depend on when it started.
    let keep_cancelling = async {
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let _ = token.cancel_query(tokio_postgres::NoTls).await;
        }
    };
    let query = client.query_one("SELECT count(*) FROM generate_series(1, 100000000000)", &[]);
    let err = tokio::select! {
        result = query => result.unwrap_err(),
        _ = keep_cancelling => unreachable!("the cancel loop never ends"),
    };
    assert_eq!(err.code().unwrap().code(), "57014", "{err}");
    let n: i32 = client.query_one("SELECT 41 + 1", &[]).await.unwrap().get(0);
    assert_eq!(n, 42, "the connection is usable after a cancel");
}

#[tokio::test]
async fn malformed_messages_do_not_hurt_the_server() {
    let server = server().await;
    let healthy = server.connect().await.unwrap();
    healthy
        .batch_execute("CREATE TABLE t (x INT); INSERT INTO t VALUES (1)")
        .await
        .unwrap();

    // An unknown message type after start-up.
    let mut raw = Raw::connect(server.port, &[("user", "eddy")]).await;
    raw.until_ready().await.unwrap();
    raw.send(b'@', b"garbage").await;
    let _ = raw.until_ready().await;

    // A length that lies (claims far more than is sent), then a hang-up.
    let mut raw = Raw::connect(server.port, &[("user", "eddy")]).await;
    raw.until_ready().await.unwrap();
    raw.stream
        .write_all(&[b'Q', 0x7f, 0xff, 0xff, 0xff, b'S'])
        .await
        .unwrap();
    drop(raw);

    // Bind to a statement that does not exist, and Execute of a missing portal.
    let mut raw = Raw::connect(server.port, &[("user", "eddy")]).await;
    raw.until_ready().await.unwrap();
    raw.send(b'B', b"\0nope\0\0\0\0\0\0\0").await;
    raw.send(b'S', b"").await;
    let reply = raw
        .until_ready()
        .await
        .expect("an error, then ReadyForQuery");
    assert!(reply.iter().any(|(t, _)| *t == b'E'));
    raw.query("SELECT 1").await;
    let reply = raw.until_ready().await.expect("the session goes on");
    assert!(reply.iter().any(|(t, _)| *t == b'D'));

    // Random bytes instead of a start-up packet.
    let mut stream = TcpStream::connect(("127.0.0.1", server.port))
        .await
        .unwrap();
    stream
        .write_all(b"\x00\x00\x00\x09\x12\x34\x56\x78\x00")
        .await
        .unwrap();
    drop(stream);

    // Everyone else is unaffected.
    let n: i64 = healthy
        .query_one("SELECT count(*) FROM t", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 1);
    let fresh = server.connect().await.unwrap();
    let n: i64 = fresh
        .query_one("SELECT count(*) FROM t", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 1);
}
