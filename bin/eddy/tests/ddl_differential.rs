//! Differential test of DDL and naming: each script in `tests/differential/*.sql` runs,
//! statement by statement in one session, against Eddy and against a PostgreSQL 15 started
//! here, and every statement must give the same result: the rows (as text, with the column
//! names), or the error (SQLSTATE, message, DETAIL, HINT), and the same NOTICEs and WARNINGs
//! (severity, SQLSTATE, message and DETAIL) before it. Plain views, schemas, `search_path` and `DROP ... IF EXISTS` are covered
//! this way (materialized views, which PostgreSQL does not maintain, are in the slt files).
//! `EDDY_DIFFERENTIAL=name` runs only the scripts whose file name contains `name`.

use std::path::Path;
use std::sync::{Arc, Mutex};

use eddy_testkit::EddyProcess;
use eddy_testkit::postgres::PostgresServer;
use futures::StreamExt;
use tokio_postgres::{Client, NoTls, SimpleQueryMessage};

/// A connection that keeps the NOTICEs it receives.
async fn connect(config: &str) -> (Client, Arc<Mutex<Vec<String>>>) {
    let (client, mut connection) = tokio_postgres::connect(config, NoTls)
        .await
        .unwrap_or_else(|e| panic!("connecting to {config}: {e}"));
    let notices = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&notices);
    tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(Ok(message)) = messages.next().await {
            if let tokio_postgres::AsyncMessage::Notice(n) = message {
                let detail = n
                    .detail()
                    .map(|d| format!("\n    DETAIL: {d}"))
                    .unwrap_or_default();
                seen.lock().unwrap_or_else(|p| p.into_inner()).push(format!(
                    "{} {}: {}{detail}",
                    n.severity(),
                    n.code().code(),
                    n.message()
                ));
            }
        }
    });
    (client, notices)
}

/// What one statement gave, as text.
async fn run(client: &Client, notices: &Mutex<Vec<String>>, sql: &str) -> String {
    let mut out = Vec::new();
    match client.simple_query(sql).await {
        Ok(messages) => {
            for message in messages {
                match message {
                    SimpleQueryMessage::RowDescription(columns) => out.push(format!(
                        "columns: {}",
                        columns
                            .iter()
                            .map(|c| c.name())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )),
                    SimpleQueryMessage::Row(row) => {
                        let values: Vec<String> = (0..row.len())
                            .map(|i| row.get(i).map_or_else(|| "NULL".to_owned(), str::to_owned))
                            .collect();
                        out.push(values.join(" | "));
                    }
                    // SHOW's tag has no row count in PostgreSQL; Eddy's says SELECT n.
                    SimpleQueryMessage::CommandComplete(_)
                        if sql.trim_start().to_uppercase().starts_with("SHOW") =>
                    {
                        out.push("ok".to_owned())
                    }
                    SimpleQueryMessage::CommandComplete(n) => out.push(format!("ok {n}")),
                    _ => {}
                }
            }
        }
        Err(e) => match e.as_db_error() {
            Some(db) => {
                out.push(format!("ERROR {}: {}", db.code().code(), db.message()));
                out.extend(db.detail().map(|d| format!("DETAIL: {d}")));
                out.extend(db.hint().map(|h| format!("HINT: {h}")));
            }
            None => out.push(format!("connection error: {e}")),
        },
    }
    // The connection task records a NOTICE when it reads it, before it reads (and hands the
    // client) the statement's response that follows it, so every NOTICE is there by now.
    let mut seen: Vec<String> =
        std::mem::take(&mut *notices.lock().unwrap_or_else(|p| p.into_inner()));
    seen.extend(out);
    seen.join("\n  ")
}

/// The statements of a script: separated by `;` at the end of a line; `--` lines are comments.
fn statements(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut start = 0;
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("--") || (current.is_empty() && line.trim().is_empty()) {
            continue;
        }
        if current.is_empty() {
            start = i + 1;
        }
        current.push_str(line);
        current.push('\n');
        if line.trim_end().ends_with(';') {
            out.push((start, current.trim().trim_end_matches(';').to_owned()));
            current.clear();
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ddl_matches_postgres() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/differential");
    let only = std::env::var("EDDY_DIFFERENTIAL").ok();
    let mut scripts: Vec<_> = std::fs::read_dir(&dir)
        .expect("tests/differential")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "sql"))
        .collect();
    scripts.sort();
    let postgres = PostgresServer::start().expect("starting PostgreSQL");
    let mut failures = Vec::new();
    for script in scripts {
        let name = script
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if only.as_deref().is_some_and(|o| !name.contains(o)) {
            continue;
        }
        // A database per script on PostgreSQL, a server per script on Eddy.
        let database = name.trim_end_matches(".sql").replace('-', "_");
        postgres
            .connect()
            .await
            .expect("postgres")
            .simple_query(&format!("CREATE DATABASE {database}"))
            .await
            .expect("CREATE DATABASE");
        let (pg, pg_notices) = connect(&format!(
            "host=127.0.0.1 port={} user=eddy dbname={database}",
            postgres.port
        ))
        .await;
        let eddy_server =
            EddyProcess::start_fresh(Path::new(env!("CARGO_BIN_EXE_eddy"))).expect("starting eddy");
        let (eddy, eddy_notices) = connect(&eddy_server.connection_string()).await;
        let text = std::fs::read_to_string(&script).expect("script");
        for (line, sql) in statements(&text) {
            let want = run(&pg, &pg_notices, &sql).await;
            let got = run(&eddy, &eddy_notices, &sql).await;
            if want != got {
                failures.push(format!(
                    "{name}:{line}: {sql}\n  postgres: {want}\n  eddy:     {got}"
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} statements differ from PostgreSQL:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}
