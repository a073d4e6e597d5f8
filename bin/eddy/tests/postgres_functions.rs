//! Differential test: every expression in `tests/expressions/scalar.txt` runs as
//! `SELECT <expression>` against Eddy and a real PostgreSQL 15 started here; the result's text,
//! its column type (the RowDescription type OID) and, for errors, the SQLSTATE must agree.
//! `tests/expressions/templates.txt` sweeps to_char's patterns over values of each type and
//! to_timestamp / to_date over inputs, `tests/expressions/operators.txt` every operator over
//! every pair of numeric types; `tests/expressions/zoned.txt` runs in a session whose
//! time zone is not UTC. `tests/expressions/arrays_json.txt` covers arrays, jsonb and the
//! types PostgreSQL gives literals and aggregates.
//! `tests/expressions/columns.txt` holds expressions over a table with a column of every stored
//! type: each runs ad hoc in PostgreSQL and Eddy and inside an Eddy materialized view, and the
//! three must agree.
//!
//! A difference that cannot be fixed is marked in the data file with `-- known: <tag>`, and the
//! tag is explained in docs/sql-reference.md under "Known differences". The test fails on any
//! unmarked difference, on a marked expression that no longer differs (remove the marker), and
//! on a tag the docs do not explain. `EDDY_EXPRESSIONS=substring` runs only matching lines.

use std::fmt;
use std::path::{Path, PathBuf};

use eddy_testkit::EddyProcess;
use eddy_testkit::postgres::PostgresServer;
use tokio_postgres::{Client, SimpleQueryMessage};

fn manifest_path(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(relative)
}

/// One line of an expression file.
struct Case {
    line: usize,
    expression: String,
    /// The docs' tag for a known difference.
    known: Option<String>,
}

fn read_cases(file: &str) -> Vec<Case> {
    let text =
        std::fs::read_to_string(manifest_path(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
    let only = std::env::var("EDDY_EXPRESSIONS").ok();
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        .map(|(i, l)| {
            let (expression, known) = match l.split_once(" -- known: ") {
                Some((e, tag)) => (e.trim().to_owned(), Some(tag.trim().to_owned())),
                None => (l.trim().to_owned(), None),
            };
            Case {
                line: i + 1,
                expression,
                known,
            }
        })
        .filter(|c| only.as_deref().is_none_or(|o| c.expression.contains(o)))
        .collect()
}

/// What a statement gave: its column types and rows as text, or an error's SQLSTATE.
#[derive(PartialEq, Eq)]
enum Outcome {
    Rows {
        types: Vec<u32>,
        rows: Vec<Vec<Option<String>>>,
    },
    Error {
        sqlstate: String,
        message: String,
    },
}

impl Outcome {
    fn same_as(&self, other: &Outcome) -> bool {
        match (self, other) {
            (Outcome::Error { sqlstate: a, .. }, Outcome::Error { sqlstate: b, .. }) => a == b,
            (a, b) => a == b,
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Rows { types, rows } => {
                let types: Vec<String> = types
                    .iter()
                    .map(|t| {
                        tokio_postgres::types::Type::from_oid(*t)
                            .map_or_else(|| t.to_string(), |t| t.name().to_owned())
                    })
                    .collect();
                let rows: Vec<String> = rows
                    .iter()
                    .map(|r| {
                        r.iter()
                            .map(|c| {
                                c.as_deref()
                                    .map_or_else(|| "NULL".to_owned(), |v| format!("{v:?}"))
                            })
                            .collect::<Vec<_>>()
                            .join(" | ")
                    })
                    .collect();
                write!(f, "[{}] {}", types.join(", "), rows.join("; "))
            }
            Outcome::Error { sqlstate, message } => write!(f, "ERROR {sqlstate}: {message}"),
        }
    }
}

fn error_outcome(e: &tokio_postgres::Error) -> Outcome {
    match e.as_db_error() {
        Some(db) => Outcome::Error {
            sqlstate: db.code().code().to_owned(),
            message: db.message().to_owned(),
        },
        None => Outcome::Error {
            sqlstate: "connection".into(),
            message: e.to_string(),
        },
    }
}

/// Describes `sql` (for the column types) and runs it with the simple protocol (for the text).
async fn run(client: &Client, sql: &str) -> Outcome {
    let statement = match client.prepare(sql).await {
        Ok(s) => s,
        Err(e) => return error_outcome(&e),
    };
    let types = statement
        .columns()
        .iter()
        .map(|c| c.type_().oid())
        .collect();
    match client.simple_query(sql).await {
        Ok(messages) => {
            let rows = messages
                .iter()
                .filter_map(|m| match m {
                    SimpleQueryMessage::Row(row) => Some(
                        (0..row.len())
                            .map(|i| row.get(i).map(str::to_owned))
                            .collect(),
                    ),
                    _ => None,
                })
                .collect();
            Outcome::Rows { types, rows }
        }
        Err(e) => error_outcome(&e),
    }
}

/// The tags docs/sql-reference.md explains under "Known differences" (each as `` `tag` ``).
fn documented_tags() -> Vec<String> {
    let docs = std::fs::read_to_string(manifest_path("../../docs/sql-reference.md"))
        .expect("docs/sql-reference.md");
    let section = docs.split("## Known differences").nth(1).unwrap_or("");
    let section = section.split("\n## ").next().unwrap_or("");
    section
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// Collects what disagrees, per case, and reports it all at once.
#[derive(Default)]
struct Report {
    compared: usize,
    known: usize,
    failures: Vec<String>,
}

impl Report {
    /// `outcomes` are (who, outcome) pairs; the first is the reference (PostgreSQL).
    fn check(&mut self, file: &str, case: &Case, outcomes: &[(&str, Outcome)]) {
        self.compared += 1;
        let differs = outcomes.windows(2).any(|w| !w[0].1.same_as(&w[1].1));
        let describe = || {
            outcomes
                .iter()
                .map(|(who, o)| format!("\n    {who:<10} {o}"))
                .collect::<String>()
        };
        match (&case.known, differs) {
            (None, true) => self.failures.push(format!(
                "{file}:{}: {}{}",
                case.line,
                case.expression,
                describe()
            )),
            (Some(tag), false) => self.failures.push(format!(
                "{file}:{}: {} is marked `known: {tag}` but no longer differs: remove the marker{}",
                case.line,
                case.expression,
                describe()
            )),
            (Some(_), true) => self.known += 1,
            (None, false) => {}
        }
    }

    fn finish(self, what: &str) {
        eprintln!(
            "{what}: {} compared, {} known differences, {} failures",
            self.compared,
            self.known,
            self.failures.len()
        );
        assert!(
            self.failures.is_empty(),
            "{what}: {} differences from PostgreSQL:\n{}",
            self.failures.len(),
            self.failures.join("\n")
        );
    }
}

fn check_tags(cases: &[Case], file: &str) {
    let tags = documented_tags();
    for case in cases {
        if let Some(tag) = &case.known {
            assert!(
                tags.contains(tag),
                "{file}:{}: tag `{tag}` is not explained in docs/sql-reference.md \"Known differences\"",
                case.line
            );
        }
    }
}

async fn postgres_client(pg: &PostgresServer) -> Client {
    let client = pg.connect().await.expect("connect to PostgreSQL");
    // Eddy's session defaults, spelled out: the comparison must not depend on the machine.
    client.batch_execute("SET TimeZone = 'UTC'; SET DateStyle = 'ISO, MDY'; SET IntervalStyle = 'postgres'; SET extra_float_digits = 1").await.expect("session settings");
    client
}

fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_eddy"))
}

/// Runs every line of `file` as `SELECT <line>` in both databases, after `setup` in each.
async fn compare_scalar_file(file: &str, setup: &str) {
    let cases = read_cases(file);
    check_tags(&cases, file);
    let pg = PostgresServer::start().expect("PostgreSQL 15 (apt-get install postgresql)");
    let eddy = EddyProcess::start_fresh(&binary()).expect("eddy starts");
    let (pg_client, eddy_client) = (
        postgres_client(&pg).await,
        eddy.connect().await.expect("connect to eddy"),
    );
    for client in [&pg_client, &eddy_client] {
        client.batch_execute(setup).await.expect("session setup");
    }
    let mut report = Report::default();
    for case in &cases {
        let sql = format!("SELECT {}", case.expression);
        let expected = run(&pg_client, &sql).await;
        let got = run(&eddy_client, &sql).await;
        report.check(file, case, &[("postgres", expected), ("eddy", got)]);
    }
    report.finish(file);
}

#[tokio::test]
async fn scalar_expressions_match_postgres() {
    compare_scalar_file("tests/expressions/scalar.txt", "SET TimeZone = 'UTC'").await;
}

#[tokio::test]
async fn operators_over_every_numeric_type_match_postgres() {
    compare_scalar_file("tests/expressions/operators.txt", "SET TimeZone = 'UTC'").await;
}

#[tokio::test]
async fn to_char_and_to_timestamp_templates_match_postgres() {
    compare_scalar_file("tests/expressions/templates.txt", "SET TimeZone = 'UTC'").await;
}

#[tokio::test]
async fn arrays_jsonb_and_literal_types_match_postgres() {
    compare_scalar_file("tests/expressions/arrays_json.txt", "SET TimeZone = 'UTC'").await;
}

#[tokio::test]
async fn expressions_in_a_session_time_zone_match_postgres() {
    compare_scalar_file(
        "tests/expressions/zoned.txt",
        "SET TimeZone = 'America/New_York'",
    )
    .await;
}

/// A column of every type Eddy stores, with edge values and NULLs; the same in both databases.
const TABLE: &str = "CREATE TABLE vals (id INT PRIMARY KEY, s SMALLINT, i INT, b BIGINT, n NUMERIC(10,2), \
    f DOUBLE PRECISION, r REAL, t TEXT, v VARCHAR(10), ok BOOLEAN, d DATE, ts TIMESTAMP, tz TIMESTAMPTZ, \
    iv INTERVAL, bin BYTEA, j JSONB)";
const ROWS: &str = "INSERT INTO vals VALUES \
    (1, 1, 7, 9000000000, 1234.50, 2.5, 0.1, 'Hello World', 'abc', true, '2026-03-05', '2026-03-05 14:07:09.5', '2026-03-05 14:07:09+00', '1 day 02:03:04', NULL, '{\"a\": 1}'), \
    (2, -3, -2, -1, -0.05, -0.0, 1e10, '', 'x', false, '2024-02-29', '2024-02-29 00:00:00', '2024-02-29 23:59:59.999999+00', '-1 mon', NULL, '[1, 2]'), \
    (3, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL), \
    (4, 0, 2147483647, 0, 0.00, 1e100, 3.5, 'héllo, wörld', 'émoji', true, '1999-12-31', '1999-12-31 23:59:59', '2000-01-01 00:00:00+00', '00:00:00.001', NULL, '\"s\"')";

#[tokio::test]
async fn column_expressions_match_postgres_ad_hoc_and_in_views() {
    const FILE: &str = "tests/expressions/columns.txt";
    let cases = read_cases(FILE);
    check_tags(&cases, FILE);
    let pg = PostgresServer::start().expect("PostgreSQL 15 (apt-get install postgresql)");
    let eddy = EddyProcess::start_fresh(&binary()).expect("eddy starts");
    let (pg_client, eddy_client) = (
        postgres_client(&pg).await,
        eddy.connect().await.expect("connect to eddy"),
    );
    for client in [&pg_client, &eddy_client] {
        client
            .batch_execute(&format!("{TABLE}; {ROWS}"))
            .await
            .expect("create and fill vals");
    }
    let mut report = Report::default();
    for (k, case) in cases.iter().enumerate() {
        let sql = format!("SELECT id, {} FROM vals ORDER BY id", case.expression);
        let expected = run(&pg_client, &sql).await;
        let ad_hoc = run(&eddy_client, &sql).await;
        let view = format!("mv_{k}");
        let in_view = match eddy_client
            .batch_execute(&format!(
                "CREATE MATERIALIZED VIEW {view} AS SELECT id, {} AS v FROM vals; FLUSH",
                case.expression
            ))
            .await
        {
            Ok(()) => run(&eddy_client, &format!("SELECT * FROM {view} ORDER BY id")).await,
            Err(e) => error_outcome(&e),
        };
        report.check(
            FILE,
            case,
            &[
                ("postgres", expected),
                ("eddy", ad_hoc),
                ("eddy view", in_view),
            ],
        );
    }
    report.finish(FILE);
}
