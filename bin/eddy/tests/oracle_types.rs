//! The typed batch oracle: after random inserts, updates and deletes of rows holding every type
//! Eddy stores (smallint, integer, bigint, numeric, real, double with NaN and infinities, text
//! with empty and non-ASCII strings, boolean, date, timestamp, timestamptz, interval, bytea,
//! jsonb) and NULLs, every materialized view equals its query run in batch, as text, after each
//! FLUSH — and again after the server is restarted (cleanly or by SIGKILL, after a CHECKPOINT or
//! not) at a random step, and as it goes on changing after that. Views cover every kind of
//! aggregate a view accepts (ordered ones, DISTINCT, DISTINCT ON, percentiles, string_agg,
//! array_agg, variances), joins, filters over expressions and top-N; some exist before the
//! data, the others are created mid-stream (backfill). The same statements run on a real
//! PostgreSQL 15 too, and every view PostgreSQL can run equals PostgreSQL's answer, as text.
//! Everything runs twice: without a memory limit, and with one so small that operator state
//! lives on disk (the spill store) between batches.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use eddy_testkit::{EddyProcess, query_sorted};
use proptest::prelude::*;

/// Literals per column: NULL, edge values, and values that repeat. Floats are dyadic so that a
/// sum does not depend on the order of its additions (the batch adds in its own order).
const SMALLINTS: &[&str] = &["NULL", "-32768", "-1", "0", "7", "32767"];
const INTS: &[&str] = &["NULL", "-2147483648", "-5", "0", "3", "2147483647"];
const BIGINTS: &[&str] = &["NULL", "-9007199254740993", "0", "42", "1099511627776"];
const NUMERICS: &[&str] = &[
    "NULL",
    "-123456789.125",
    "0",
    "0.001",
    "2.500",
    "99.999",
    "-0.5",
];
const DOUBLES: &[&str] = &[
    "NULL",
    "0",
    "-0.0",
    "0.5",
    "-1.25",
    "3",
    "1024",
    "'NaN'",
    "'Infinity'",
    "'-Infinity'",
];
const REALS: &[&str] = &["NULL", "0", "0.25", "-2", "'NaN'"];
const TEXTS: &[&str] = &[
    "NULL",
    "''",
    "'a'",
    "'B'",
    "'é'",
    "'日本語'",
    "'a b'",
    "'it''s'",
];
const BOOLS: &[&str] = &["NULL", "true", "false"];
const DATES: &[&str] = &[
    "NULL",
    "'1970-01-01'",
    "'2024-02-29'",
    "'2026-12-01'",
    "'0001-01-01'",
];
const TIMESTAMPS: &[&str] = &[
    "NULL",
    "'2026-03-01 00:00:00'",
    "'2026-03-01 12:34:56.789'",
    "'1999-12-31 23:59:59.999999'",
    "'2026-03-02 00:00:00'",
];
const TIMESTAMPTZS: &[&str] = &[
    "NULL",
    "'2026-03-01 00:00:00+00'",
    "'2026-03-01 02:00:00+02'",
    "'2000-01-01 00:00:00.5+00'",
];
const INTERVALS: &[&str] = &[
    "NULL",
    "'1 day'",
    "'2 hours'",
    "'-3 mons'",
    "'1 day 2 hours'",
    "'0 seconds'",
];
const BYTEAS: &[&str] = &["NULL", "'\\x'", "'\\x00ff'", "'\\x616263'"];
const JSONS: &[&str] = &[
    "NULL",
    "'{}'",
    "'{\"a\": 1}'",
    "'[1, \"x\", null]'",
    "'\"é\"'",
];
const KEYS: &[&str] = &["NULL", "'x'", "'y'", "''", "'ü'"];
const WEIGHTS: &[&str] = &["NULL", "0", "1.50", "-2", "10.25"];

const COLUMNS: &[(&str, &[&str])] = &[
    ("k", KEYS),
    ("s", SMALLINTS),
    ("i", INTS),
    ("b", BIGINTS),
    ("n", NUMERICS),
    ("f", DOUBLES),
    ("r", REALS),
    ("txt", TEXTS),
    ("flag", BOOLS),
    ("d", DATES),
    ("ts", TIMESTAMPS),
    ("tz", TIMESTAMPTZS),
    ("iv", INTERVALS),
    ("by", BYTEAS),
    ("j", JSONS),
];

#[derive(Debug, Clone)]
enum Op {
    /// Rows of value indexes per column (the id is the case's next one).
    Insert(Vec<Vec<usize>>),
    /// Sets one column of the row with this id (modulo the ids used).
    Update {
        id: usize,
        column: usize,
        value: usize,
    },
    Delete {
        id: usize,
    },
    /// Deletes the rows whose column holds a value.
    DeleteWhere {
        column: usize,
        value: usize,
    },
    /// Upserts the joined table's row for a key.
    SetLabel {
        key: usize,
        label: usize,
        weight: usize,
    },
    DropLabel {
        key: usize,
    },
    /// A CHECKPOINT (or not), then a clean restart or a SIGKILL.
    Restart {
        checkpoint: bool,
        crash: bool,
    },
}

fn values_row() -> impl Strategy<Value = Vec<usize>> {
    COLUMNS
        .iter()
        .map(|(_, values)| 0..values.len())
        .collect::<Vec<_>>()
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => prop::collection::vec(values_row(), 1..5).prop_map(Op::Insert),
        3 => (0..64usize, 1..COLUMNS.len(), 0..9usize).prop_map(|(id, column, value)| Op::Update { id, column, value }),
        2 => (0..64usize).prop_map(|id| Op::Delete { id }),
        1 => (1..COLUMNS.len(), 0..9usize).prop_map(|(column, value)| Op::DeleteWhere { column, value }),
        2 => (0..KEYS.len(), 0..TEXTS.len(), 0..WEIGHTS.len()).prop_map(|(key, label, weight)| Op::SetLabel { key, label, weight }),
        1 => (0..KEYS.len()).prop_map(|key| Op::DropLabel { key }),
    ]
}

/// The views under test: (name, query over `{t}` and the keyed `{u}`).
const VIEWS: &[(&str, &str)] = &[
    (
        "agg",
        "SELECT k, count(*) AS n, count(f) AS nf, sum(s) AS ss, sum(i) AS si, sum(b) AS sb, sum(n) AS sn, sum(f) AS sf, avg(f) AS af, sum(r) AS sr, \
         min(n) AS lo, max(n) AS hi, min(f) AS flo, max(f) AS fhi, min(txt) AS tlo, max(txt) AS thi, min(d) AS dlo, max(ts) AS tshi, min(tz) AS tzlo, max(iv) AS ivhi, \
         bool_and(flag) AS band, bool_or(flag) AS bor, count(DISTINCT d) AS dd, sum(DISTINCT i) AS sdi FROM {t} GROUP BY k",
    ),
    (
        "ordered",
        "SELECT k, string_agg(txt, ',' ORDER BY txt DESC, id) AS st, array_to_string(array_agg(id ORDER BY id DESC), ';') AS ids FROM {t} GROUP BY k",
    ),
    // DataFusion's ordered first_value / last_value (PostgreSQL has them only as window functions).
    (
        "firstlast",
        "SELECT k, first_value(n ORDER BY n DESC NULLS LAST, id) AS fn, last_value(ts ORDER BY ts, id) AS lts, first_value(iv ORDER BY d, id) AS fiv FROM {t} GROUP BY k",
    ),
    (
        "stats",
        "SELECT flag, stddev_samp(i) AS sd, var_pop(s) AS vp, percentile_cont(0.5) WITHIN GROUP (ORDER BY s) AS pc FROM {t} GROUP BY flag",
    ),
    ("median", "SELECT k, median(b) AS md FROM {t} GROUP BY k"),
    (
        "averages",
        "SELECT k, avg(n) AS an, avg(i) AS ai, avg(s) AS as_ FROM {t} GROUP BY k",
    ),
    (
        "bytime",
        "SELECT date_trunc('day', ts) AS day, d, count(*) AS n, sum(n) AS total, max(tz) AS last FROM {t} GROUP BY date_trunc('day', ts), d",
    ),
    (
        "distinct_on",
        "SELECT DISTINCT ON (k) k, id, n, txt FROM {t} ORDER BY k, n DESC NULLS LAST, id",
    ),
    (
        "filter",
        "SELECT id, txt, n * 2 AS n2, f + 1 AS f1, iv, by, j, ts + iv AS later FROM {t} WHERE (f > 0 OR f IS NULL) AND txt IS NOT NULL AND n <> 0",
    ),
    (
        "join",
        "SELECT {u}.label, count(*) AS n, sum({t}.n * {u}.weight) AS weighted, min({t}.d) AS first FROM {t} JOIN {u} ON {t}.k = {u}.k GROUP BY {u}.label",
    ),
    (
        "left",
        "SELECT {t}.id, {t}.k, {u}.label, {u}.weight FROM {t} LEFT JOIN {u} ON {t}.k = {u}.k WHERE {t}.i IS NOT NULL",
    ),
    (
        "topn",
        "SELECT id, n, txt FROM {t} ORDER BY n DESC NULLS LAST, id LIMIT 3",
    ),
    (
        "global",
        "SELECT count(*) AS n, sum(n) AS total, max(ts) AS last, string_agg(DISTINCT txt, '|' ORDER BY txt) AS texts FROM {t}",
    ),
];

static CASE: AtomicUsize = AtomicUsize::new(0);

struct Case {
    t: String,
    u: String,
    v: String,
    next_id: usize,
}

impl Case {
    fn sql(&mut self, op: &Op) -> Option<String> {
        let (t, u) = (&self.t, &self.u);
        let ids = self.next_id.max(1);
        Some(match op {
            Op::Insert(rows) => {
                let mut values = Vec::new();
                for row in rows {
                    let cells: Vec<&str> = row
                        .iter()
                        .zip(COLUMNS)
                        .map(|(i, (_, pool))| pool[*i])
                        .collect();
                    values.push(format!("({}, {})", self.next_id, cells.join(", ")));
                    self.next_id += 1;
                }
                let names: Vec<&str> = COLUMNS.iter().map(|(name, _)| *name).collect();
                format!(
                    "INSERT INTO {t} (id, {}) VALUES {}",
                    names.join(", "),
                    values.join(", ")
                )
            }
            Op::Update { id, column, value } => {
                let (name, pool) = COLUMNS[*column];
                format!(
                    "UPDATE {t} SET {name} = {} WHERE id = {}",
                    pool[value % pool.len()],
                    id % ids
                )
            }
            Op::Delete { id } => format!("DELETE FROM {t} WHERE id = {}", id % ids),
            Op::DeleteWhere { column, value } => {
                let (name, pool) = COLUMNS[*column];
                let literal = pool[value % pool.len()];
                if literal == "NULL" || matches!(name, "j" | "f" | "r") {
                    format!("DELETE FROM {t} WHERE {name} IS NULL")
                } else if name == "iv" {
                    // TODO(#16): `iv = '1 day'` (an unknown literal against an interval) is
                    // refused by DataFusion's coercion; PostgreSQL types the literal.
                    format!("DELETE FROM {t} WHERE {name} = CAST({literal} AS INTERVAL)")
                } else {
                    format!("DELETE FROM {t} WHERE {name} = {literal}")
                }
            }
            Op::SetLabel { key, label, weight } => {
                if KEYS[*key] == "NULL" {
                    return None;
                }
                format!(
                    "DELETE FROM {u} WHERE k = {key}; INSERT INTO {u} VALUES ({key}, {}, {})",
                    TEXTS[*label],
                    WEIGHTS[*weight],
                    key = KEYS[*key]
                )
            }
            Op::DropLabel { key } => format!("DELETE FROM {u} WHERE k = {}", KEYS[*key]),
            Op::Restart { .. } => return None,
        })
    }

    fn query(&self, q: &str) -> String {
        q.replace("{t}", &self.t).replace("{u}", &self.u)
    }
}

/// Rows equal as text, but for floating-point results (variances, averages of floats) that
/// differ only past their 12th significant digit: the view and the batch add in different orders.
fn same_rows(view: &[Vec<Option<String>>], batch: &[Vec<Option<String>>]) -> bool {
    let close = |a: &str, b: &str| match (a.parse::<f64>(), b.parse::<f64>()) {
        (Ok(x), Ok(y))
            if x.is_finite() && y.is_finite() && (a.contains('.') || b.contains('.')) =>
        {
            (x - y).abs() <= 1e-12 * x.abs().max(y.abs())
        }
        _ => false,
    };
    view.len() == batch.len()
        && view.iter().zip(batch).all(|(v, b)| {
            v.len() == b.len()
                && v.iter().zip(b).all(|(x, y)| match (x, y) {
                    (Some(x), Some(y)) => x == y || close(x, y),
                    (x, y) => x == y,
                })
        })
}

/// Views PostgreSQL cannot run as they are (`median` and ordered `first_value` are DataFusion's),
/// or whose answers differ from PostgreSQL's in ways docs/sql-reference.md lists under "Known
/// differences" (`stats`: variances are double precision, PostgreSQL's numeric; `averages`:
/// averages of numerics keep 16 decimals, PostgreSQL's scale depends on the value).
const NOT_IN_POSTGRES: &[&str] = &["median", "firstlast", "stats", "averages"];

async fn compare(
    client: &tokio_postgres::Client,
    pg: &tokio_postgres::Client,
    case: &Case,
    views: &[usize],
    when: &str,
) -> Result<(), String> {
    client
        .batch_execute("FLUSH")
        .await
        .map_err(|e| format!("FLUSH {when}: {e}"))?;
    for &i in views {
        let (name, q) = VIEWS[i];
        let view = query_sorted(client, &format!("SELECT * FROM {}_{name}", case.v))
            .await
            .map_err(|e| format!("view {name} {when}: {e:#}"))?;
        let batch = query_sorted(client, &case.query(q))
            .await
            .map_err(|e| format!("query {name} {when}: {e:#}"))?;
        if !same_rows(&view, &batch) {
            return Err(format!(
                "view {name} {when}:\n view:  {view:?}\n batch: {batch:?}"
            ));
        }
        if NOT_IN_POSTGRES.contains(&name) {
            continue;
        }
        let postgres = query_sorted(pg, &case.query(q))
            .await
            .map_err(|e| format!("PostgreSQL, query {name} {when}: {e:#}"))?;
        if view != postgres {
            return Err(format!(
                "view {name} {when} differs from PostgreSQL:\n view:       {view:?}\n PostgreSQL: {postgres:?}"
            ));
        }
    }
    Ok(())
}

/// Runs one case; returns the rows its views' operators held on disk at the end, and the
/// files of views' contents spilled then.
async fn check_case(
    server: &mut EddyProcess,
    pg: &tokio_postgres::Client,
    ops: &[Op],
    late_from: usize,
) -> Result<(u64, usize), String> {
    let n = CASE.fetch_add(1, Ordering::Relaxed);
    let mut case = Case {
        t: format!("t{n}"),
        u: format!("u{n}"),
        v: format!("v{n}"),
        next_id: 0,
    };
    let mut client = server.connect().await.map_err(|e| e.to_string())?;
    let ddl = format!(
        "CREATE TABLE {} (id INT PRIMARY KEY, k TEXT, s SMALLINT, i INT, b BIGINT, n NUMERIC(20,3), f DOUBLE PRECISION, r REAL, txt TEXT, flag BOOLEAN, \
         d DATE, ts TIMESTAMP, tz TIMESTAMPTZ, iv INTERVAL, by BYTEA, j JSONB); CREATE TABLE {} (k TEXT PRIMARY KEY, label TEXT, weight NUMERIC(6,2))",
        case.t, case.u
    );
    client
        .batch_execute(&ddl)
        .await
        .map_err(|e| e.to_string())?;
    pg.batch_execute(&ddl)
        .await
        .map_err(|e| format!("PostgreSQL: {e}"))?;
    let create = |case: &Case, i: usize| {
        format!(
            "CREATE MATERIALIZED VIEW {}_{} AS {}",
            case.v,
            VIEWS[i].0,
            case.query(VIEWS[i].1)
        )
    };
    let mut created: Vec<usize> = Vec::new();
    for i in 0..late_from.min(VIEWS.len()) {
        client
            .batch_execute(&create(&case, i))
            .await
            .map_err(|e| format!("{}: {e}", create(&case, i)))?;
        created.push(i);
    }
    for (step, op) in ops.iter().enumerate() {
        if let Op::Restart { checkpoint, crash } = op {
            if *checkpoint {
                client
                    .batch_execute("CHECKPOINT")
                    .await
                    .map_err(|e| format!("CHECKPOINT: {e}"))?;
            }
            server
                .restart_in_place(*crash)
                .map_err(|e| format!("restart: {e:#}"))?;
            client = server.connect().await.map_err(|e| e.to_string())?;
            compare(
                &client,
                pg,
                &case,
                &created,
                &format!("after the restart at step {step} ({op:?})"),
            )
            .await?;
            continue;
        }
        let Some(sql) = case.sql(op) else { continue };
        if let Err(e) = client.batch_execute(&sql).await {
            return Err(format!("{sql}: {e}"));
        }
        pg.batch_execute(&sql)
            .await
            .map_err(|e| format!("PostgreSQL, {sql}: {e}"))?;
        if step == ops.len() / 2 {
            for i in 0..VIEWS.len() {
                if !created.contains(&i) {
                    client
                        .batch_execute(&create(&case, i))
                        .await
                        .map_err(|e| format!("{}: {e}", create(&case, i)))?;
                    created.push(i);
                }
            }
        }
        compare(
            &client,
            pg,
            &case,
            &created,
            &format!("after step {step} ({sql})"),
        )
        .await?;
    }
    let spilled = eddy_testkit::query_text(
        &client,
        "SELECT coalesce(sum(spilled_rows), 0)::text FROM eddy_operators",
    )
    .await
    .map_err(|e| e.to_string())?;
    let spilled = spilled
        .first()
        .and_then(|r| r.first().cloned().flatten())
        .and_then(|v| v.parse::<u64>().ok())
        .ok_or("eddy_operators.spilled_rows is not a number")?;
    let contents_files = server.contents_spill_files();
    // Each case leaves the server as it found it: later restarts rebuild only their own views.
    client
        .batch_execute(&format!("DROP TABLE {}, {} CASCADE", case.t, case.u))
        .await
        .map_err(|e| e.to_string())?;
    pg.batch_execute(&format!("DROP TABLE {}, {}", case.t, case.u))
        .await
        .map_err(|e| format!("PostgreSQL: {e}"))?;
    Ok((spilled, contents_files))
}

#[test]
fn typed_views_equal_their_queries_through_restarts() {
    let spilled = typed_views_equal_postgres(&[], 12);
    assert_eq!(spilled, 0, "no limit was given, yet state spilled");
}

/// The same with a memory limit so small that every key of operator state goes to disk when
/// each batch ends: joins and top-N read their state back from the spill store, and a restart
/// rebuilds it from the checkpoint and the log (the spill store is emptied at start).
#[test]
fn typed_views_equal_their_queries_while_spilling() {
    let spilled = typed_views_equal_postgres(&["--memory-limit".to_owned(), "1kB".to_owned()], 6);
    assert!(spilled > 0, "nothing spilled under a 1kB memory limit");
}

/// Views whose contents pass a chunk of rows (8 192), under a limit so small that their
/// sealed chunks go to files (`spill-files/`): still equal to PostgreSQL after updates and
/// deletes that land in spilled chunks, a checkpoint and a clean restart, and a crash.
#[test]
fn typed_view_contents_past_a_chunk_equal_postgres_while_spilling() {
    // Rows cycling through every column's values at a different stride each.
    let rows = |n: usize, shift: usize| {
        Op::Insert(
            (0..n)
                .map(|r| {
                    (COLUMNS.iter().enumerate())
                        .map(|(c, (_, pool))| (r * (c + 1) + r / 7 + shift) % pool.len())
                        .collect()
                })
                .collect(),
        )
    };
    let ops = vec![
        rows(10_000, 0),
        rows(10_000, 3),
        Op::Update {
            id: 17,
            column: 4,
            value: 3,
        },
        Op::DeleteWhere {
            column: 1,
            value: 2,
        },
        Op::Restart {
            checkpoint: true,
            crash: false,
        },
        Op::Update {
            id: 15_001,
            column: 8,
            value: 4,
        },
        Op::Delete { id: 19_999 },
        rows(300, 5),
        Op::Restart {
            checkpoint: false,
            crash: true,
        },
        Op::DeleteWhere {
            column: 9,
            value: 1,
        },
    ];
    let binary = std::path::Path::new(env!("CARGO_BIN_EXE_eddy"));
    let args = ["--memory-limit", "1kB", "--workers"].map(str::to_owned);
    let args = [&args[..], &[eddy_testkit::TEST_WORKERS.to_string()]].concat();
    let mut server = EddyProcess::start_fresh_args(binary, &args).unwrap();
    let postgres = eddy_testkit::postgres::PostgresServer::start()
        .expect("PostgreSQL 15 (bin/test installs it)");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (_, files) = runtime.block_on(async {
        let pg = postgres.connect().await.unwrap();
        pg.batch_execute("SET TimeZone = 'UTC'; SET extra_float_digits = 1")
            .await
            .unwrap();
        check_case(&mut server, &pg, &ops, VIEWS.len())
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    });
    assert!(files > 0, "no view's contents went to files");
}

/// Runs `cases` random cases on a server started with `args`; returns the rows spilled at the
/// end of each case, summed.
fn typed_views_equal_postgres(args: &[String], cases: u32) -> u64 {
    let binary = std::path::Path::new(env!("CARGO_BIN_EXE_eddy"));
    let mut args = args.to_vec();
    args.extend([
        "--workers".to_owned(),
        eddy_testkit::TEST_WORKERS.to_string(),
    ]);
    let server = std::cell::RefCell::new(EddyProcess::start_fresh_args(binary, &args).unwrap());
    let spilled = AtomicU64::new(0);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let postgres = eddy_testkit::postgres::PostgresServer::start()
        .expect("PostgreSQL 15 (bin/test installs it)");
    let pg = runtime.block_on(async {
        let pg = postgres.connect().await.unwrap();
        pg.batch_execute("SET TimeZone = 'UTC'; SET extra_float_digits = 1")
            .await
            .unwrap();
        pg
    });
    let config = ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    let mut runner = proptest::test_runner::TestRunner::new(config);
    // Every case restarts the server once, at a random step.
    let strategy = (
        prop::collection::vec(op(), 2..14),
        0..VIEWS.len() + 1,
        0usize..14,
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(mut ops, late_from, at, checkpoint, crash)| {
            let at = at.min(ops.len());
            ops.insert(at, Op::Restart { checkpoint, crash });
            (ops, late_from)
        });
    let result = runner.run(&strategy, |(ops, late_from)| {
        runtime
            .block_on(check_case(&mut server.borrow_mut(), &pg, &ops, late_from))
            .map(|(rows, _)| {
                spilled.fetch_add(rows, Ordering::Relaxed);
            })
            .map_err(TestCaseError::fail)
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    spilled.into_inner()
}
