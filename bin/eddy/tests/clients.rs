//! Real PostgreSQL clients, used as their users use them (clients/README.md): each script runs
//! against Eddy and against a PostgreSQL 15 started by the test, over the same schema and data,
//! and must print the same. `bin/test` installs the clients; a missing one fails loudly.

use std::path::{Path, PathBuf};
use std::process::Command;

use eddy_testkit::EddyProcess;
use eddy_testkit::postgres::PostgresServer;

const SETUP: &str = "CREATE TABLE orders (id INT PRIMARY KEY, customer TEXT NOT NULL, amount NUMERIC(10,2));
INSERT INTO orders VALUES (1, 'ann', 1.50), (2, 'bob', 2.25), (3, 'ann', 10.00), (4, 'cy', 0.99), (5, 'bob', 3.00);
CREATE TABLE tagged (id INT PRIMARY KEY, tags TEXT[]);
INSERT INTO tagged VALUES (1, ARRAY['red', 'green']);
CREATE MATERIALIZED VIEW customer_totals AS SELECT customer, sum(amount) AS total, count(*)::int AS orders FROM orders GROUP BY customer;";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn tool(var: &str, default: PathBuf) -> PathBuf {
    let path = std::env::var_os(var).map(PathBuf::from).unwrap_or(default);
    assert!(
        path.exists(),
        "{} is missing: run bin/test, which installs the client libraries ({var})",
        path.display()
    );
    path
}

/// Eddy and PostgreSQL with the schema and data; their connection URLs (user `eddy`).
async fn servers() -> (EddyProcess, PostgresServer, String, String) {
    let eddy = EddyProcess::start_fresh(Path::new(env!("CARGO_BIN_EXE_eddy"))).unwrap();
    let pg = PostgresServer::start().expect("start PostgreSQL 15 (bin/test installs it)");
    let e = eddy.connect().await.unwrap();
    e.batch_execute(SETUP).await.unwrap();
    e.batch_execute("FLUSH").await.unwrap();
    // Eddy's own tables live in schema eddy_catalog (SQL.md): the reference has it too.
    pg.connect()
        .await
        .unwrap()
        .batch_execute(&format!("CREATE SCHEMA eddy_catalog; {SETUP}"))
        .await
        .unwrap();
    let eddy_url = format!("postgresql://eddy@127.0.0.1:{}/eddy", eddy.port);
    let pg_url = format!("postgresql://eddy@127.0.0.1:{}/postgres", pg.port);
    (eddy, pg, eddy_url, pg_url)
}

fn run(program: &Path, args: &[&str]) -> String {
    let output = Command::new(program)
        .args(args)
        .current_dir(root())
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", program.display()));
    assert!(
        output.status.success(),
        "{} {args:?} failed:\n{}\n{}",
        program.display(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// Runs `args` (with the URL last) against both servers and compares the output.
async fn compare(program: PathBuf, args: &[&str], url: impl Fn(&str) -> String) {
    let (_eddy, _pg, eddy_url, pg_url) = servers().await;
    let with = |u: &str| {
        let url = url(u);
        let mut all: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        all.extend(url.split(' ').map(str::to_owned));
        all
    };
    let want = run(
        &program,
        &with(&pg_url).iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let got = run(
        &program,
        &with(&eddy_url)
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    if got != want {
        let diff = similar_lines(&want, &got);
        panic!(
            "{} {args:?}: Eddy and PostgreSQL differ (-postgres +eddy):\n{diff}",
            program.display()
        );
    }
}

fn similar_lines(want: &str, got: &str) -> String {
    let mut out = String::new();
    let (w, g): (Vec<&str>, Vec<&str>) = (want.lines().collect(), got.lines().collect());
    for i in 0..w.len().max(g.len()) {
        match (w.get(i), g.get(i)) {
            (Some(a), Some(b)) if a == b => out.push_str(&format!("  {a}\n")),
            (a, b) => {
                if let Some(a) = a {
                    out.push_str(&format!("- {a}\n"));
                }
                if let Some(b) = b {
                    out.push_str(&format!("+ {b}\n"));
                }
            }
        }
    }
    out
}

fn python() -> PathBuf {
    let venv = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default()
        .join(".cache/eddy/clients-venv/bin/python");
    tool("EDDY_CLIENTS_PYTHON", venv)
}

#[tokio::test]
async fn psycopg() {
    compare(
        python(),
        &["clients/python/psycopg_check.py"],
        str::to_owned,
    )
    .await;
}

#[tokio::test]
async fn sqlalchemy() {
    compare(
        python(),
        &["clients/python/sqlalchemy_check.py"],
        str::to_owned,
    )
    .await;
}

#[tokio::test]
async fn node_postgres() {
    tool(
        "EDDY_CLIENTS_NODE_MODULES",
        root().join("clients/node/node_modules/pg"),
    );
    compare(
        PathBuf::from("node"),
        &["clients/node/check.js"],
        str::to_owned,
    )
    .await;
}

#[tokio::test]
async fn pgjdbc() {
    let jar = tool(
        "EDDY_PGJDBC_JAR",
        PathBuf::from("/usr/share/java/postgresql.jar"),
    );
    let classes = std::env::temp_dir().join(format!("eddy-jdbc-{}", std::process::id()));
    std::fs::create_dir_all(&classes).unwrap();
    let jar = jar.display().to_string();
    let classes_arg = classes.display().to_string();
    run(
        Path::new("javac"),
        &[
            "-d",
            &classes_arg,
            "-cp",
            &jar,
            "clients/java/JdbcCheck.java",
        ],
    );
    let classpath = format!("{classes_arg}:{jar}");
    // jdbc:postgresql://host:port/db and the user.
    compare(
        PathBuf::from("java"),
        &["-cp", &classpath, "JdbcCheck"],
        |url| {
            let rest = url.trim_start_matches("postgresql://eddy@");
            format!("jdbc:postgresql://{rest} eddy")
        },
    )
    .await;
}
