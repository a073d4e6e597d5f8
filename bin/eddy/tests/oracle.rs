//! The batch oracle: after random inserts, updates and deletes (with duplicates and NULLs),
//! every materialized view equals the same query run in batch by DataFusion over the current
//! tables (the ad-hoc SELECT path), compared as multisets after each FLUSH. Some views exist
//! before any data, others are created mid-stream (backfill), one reads another view. At a
//! random step the server restarts (after a CHECKPOINT or not, cleanly or by SIGKILL) and every
//! view is compared again.

use std::sync::atomic::{AtomicUsize, Ordering};

use eddy_testkit::{EddyProcess, query_sorted};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    InsertA(Vec<(Option<i32>, Option<i32>, Option<i32>)>),
    InsertB(i32, Option<i32>, Option<String>),
    UpdateA { k: i32, g: Option<i32> },
    UpdateB { k: i32, w: Option<i32> },
    DeleteA { v_below: i32 },
    DeleteB { k: i32 },
}

fn small() -> impl Strategy<Value = Option<i32>> {
    prop_oneof![1 => Just(None), 6 => (0..4i32).prop_map(Some)]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => prop::collection::vec((small(), small(), prop::option::of(-3..8i32)), 1..6).prop_map(Op::InsertA),
        2 => (0..5i32, prop::option::of(0..5i32), prop::option::of(prop::sample::select(vec!["x".to_owned(), "y".to_owned()])))
            .prop_map(|(k, w, s)| Op::InsertB(k, w, s)),
        1 => (0..4i32, small()).prop_map(|(k, g)| Op::UpdateA { k, g }),
        1 => (0..5i32, prop::option::of(0..5i32)).prop_map(|(k, w)| Op::UpdateB { k, w }),
        1 => (-2..6i32).prop_map(|v_below| Op::DeleteA { v_below }),
        1 => (0..5i32).prop_map(|k| Op::DeleteB { k }),
    ]
}

fn lit(v: Option<i32>) -> String {
    v.map_or("NULL".to_owned(), |v| v.to_string())
}

impl Op {
    fn sql(&self, a: &str, b: &str) -> String {
        match self {
            Op::InsertA(rows) => {
                let values: Vec<String> = rows
                    .iter()
                    .map(|(k, g, v)| format!("({}, {}, {})", lit(*k), lit(*g), lit(*v)))
                    .collect();
                format!("INSERT INTO {a} VALUES {}", values.join(", "))
            }
            Op::InsertB(k, w, s) => {
                let s = s.as_ref().map_or("NULL".to_owned(), |s| format!("'{s}'"));
                format!("INSERT INTO {b} VALUES ({k}, {}, {s})", lit(*w))
            }
            Op::UpdateA { k, g } => {
                format!("UPDATE {a} SET g = {}, v = v + 1 WHERE k = {k}", lit(*g))
            }
            Op::UpdateB { k, w } => format!("UPDATE {b} SET w = {} WHERE k = {k}", lit(*w)),
            Op::DeleteA { v_below } => format!("DELETE FROM {a} WHERE v < {v_below}"),
            Op::DeleteB { k } => format!("DELETE FROM {b} WHERE k = {k}"),
        }
    }
}

/// The views under test: (name suffix, query with {a}, {b} and {v} placeholders).
const VIEWS: &[(&str, &str)] = &[
    (
        "agg",
        "SELECT g, count(*) AS n, sum(v) AS s, min(v) AS lo, max(v) AS hi, count(DISTINCT v) AS d, avg(v) AS m FROM {a} GROUP BY g",
    ),
    (
        "join",
        "SELECT {a}.g, {b}.s, count(*) AS n, sum({a}.v * {b}.w) AS x FROM {a} JOIN {b} ON {a}.k = {b}.k GROUP BY {a}.g, {b}.s",
    ),
    (
        "filter",
        "SELECT k, v, v * 2 AS w FROM {a} WHERE v > 2 AND g IS NOT NULL",
    ),
    (
        "global",
        "SELECT count(*) AS n, sum(w) AS s, max(s) AS top FROM {b}",
    ),
    ("distinct", "SELECT DISTINCT g, k FROM {a}"),
    (
        "having",
        "SELECT k, sum(v) AS s FROM {a} GROUP BY k HAVING count(*) > 1",
    ),
    (
        "joinfilter",
        "SELECT {a}.k, {a}.v, {b}.w FROM {a} JOIN {b} ON {a}.k = {b}.k AND {a}.v < {b}.w",
    ),
    (
        "union",
        "SELECT k FROM {a} WHERE g = 1 UNION ALL SELECT k FROM {b} WHERE w > 1",
    ),
    (
        "left",
        "SELECT {a}.k, {a}.v, {b}.w, {b}.s FROM {a} LEFT JOIN {b} ON {a}.k = {b}.k AND {b}.w > 1",
    ),
    (
        "right",
        "SELECT {a}.g, {b}.k, {b}.w FROM {a} RIGHT JOIN {b} ON {a}.k = {b}.k",
    ),
    (
        "full",
        "SELECT {a}.k AS ak, {b}.k AS bk, {a}.v, {b}.w FROM {a} FULL JOIN {b} ON {a}.k = {b}.k AND {a}.v <= {b}.w",
    ),
    (
        "semi",
        "SELECT k, g FROM {a} WHERE k IN (SELECT k FROM {b} WHERE w IS NOT NULL)",
    ),
    (
        "anti",
        "SELECT k, v FROM {a} WHERE NOT EXISTS (SELECT 1 FROM {b} WHERE {b}.k = {a}.k AND {b}.w >= {a}.v)",
    ),
    (
        "leftagg",
        "SELECT {b}.k, count({a}.v) AS n, sum({a}.v) AS s FROM {b} LEFT JOIN {a} ON {a}.k = {b}.k GROUP BY {b}.k",
    ),
    ("except", "SELECT k FROM {a} EXCEPT SELECT k FROM {b}"),
    (
        "intersect",
        "SELECT k, g FROM {a} INTERSECT SELECT k, w FROM {b}",
    ),
    (
        "scalar",
        "SELECT k, (SELECT max(w) FROM {b} WHERE {b}.k = {a}.k) AS mw FROM {a}",
    ),
    ("topn", "SELECT k, v FROM {a} ORDER BY v DESC, k LIMIT 3"),
    (
        "topnoffset",
        "SELECT k, g, v FROM {a} ORDER BY k NULLS FIRST, g, v LIMIT 2 OFFSET 1",
    ),
    (
        "ranked",
        "SELECT k, v, rn FROM (SELECT k, v, row_number() OVER (PARTITION BY k ORDER BY v DESC, g) AS rn FROM {a}) t WHERE rn <= 2",
    ),
    (
        "rank",
        "SELECT k, v, r FROM (SELECT k, v, rank() OVER (PARTITION BY k ORDER BY v DESC NULLS LAST) AS r FROM {a}) t WHERE r <= 2",
    ),
    (
        "denserank",
        "SELECT g, v, r FROM (SELECT g, v, dense_rank() OVER (ORDER BY v) AS r FROM {a}) t WHERE r < 3",
    ),
    ("countstar", "SELECT count(*) AS n FROM {a}"),
    (
        "countjoin",
        "SELECT count(*) AS n FROM {a} JOIN {b} ON {a}.k = {b}.k",
    ),
    (
        "onview",
        "SELECT count(*) AS groups, sum(n) AS rows FROM {v}_agg",
    ),
    // Joins of a keyed table with a grouped subquery (each row meets at most one), a filter of
    // a keyed table, and a view on one of them.
    (
        "keyedjoin",
        "SELECT x.k, x.n, x.s, {b}.w, {b}.s AS bs FROM (SELECT k, count(*) AS n, sum(v) AS s FROM {a} GROUP BY k) x JOIN {b} ON x.k = {b}.k",
    ),
    (
        "keyedleft",
        "SELECT {b}.k, {b}.w, x.n FROM {b} LEFT JOIN (SELECT k, count(*) AS n FROM {a} GROUP BY k) x ON x.k = {b}.k",
    ),
    ("keyedfilter", "SELECT k, w, s FROM {b} WHERE w > 0"),
    (
        "onkeyed",
        "SELECT k, n, w FROM {v}_keyedjoin WHERE w IS NOT NULL",
    ),
];

static CASE: AtomicUsize = AtomicUsize::new(0);

async fn check_case(
    server: &mut EddyProcess,
    ops: &[Op],
    late_from: usize,
    restart: (usize, bool, bool),
) -> Result<(), String> {
    let mut client = server.connect().await.map_err(|e| e.to_string())?;
    let case = CASE.fetch_add(1, Ordering::Relaxed);
    let (a, b, v) = (format!("a{case}"), format!("b{case}"), format!("v{case}"));
    client
        .batch_execute(&format!("CREATE TABLE {a} (k INT, g INT, v INT); CREATE TABLE {b} (k INT PRIMARY KEY, w INT, s TEXT)"))
        .await
        .map_err(|e| e.to_string())?;
    let query = |q: &str| q.replace("{a}", &a).replace("{b}", &b).replace("{v}", &v);
    let mut created = Vec::new();
    let create = |i: usize| {
        format!(
            "CREATE MATERIALIZED VIEW {v}_{} AS {}",
            VIEWS[i].0,
            query(VIEWS[i].1)
        )
    };
    // Views before the data: all but those from `late_from` on (and the view on a view needs agg).
    for i in 0..late_from.min(VIEWS.len() - 1) {
        client
            .batch_execute(&create(i))
            .await
            .map_err(|e| format!("{}: {e}", create(i)))?;
        created.push(i);
    }
    for (step, op) in ops.iter().enumerate() {
        // Key conflicts on b are expected and rejected atomically; everything else must work.
        if let Err(e) = client.batch_execute(&op.sql(&a, &b)).await
            && e.code().map(|c| c.code()) != Some("23505")
        {
            return Err(format!("{}: {e}", op.sql(&a, &b)));
        }
        if step == ops.len() / 2 {
            for (i, view) in VIEWS.iter().enumerate() {
                if !created.contains(&i) && (view.0 != "onview" || created.contains(&0)) {
                    client
                        .batch_execute(&create(i))
                        .await
                        .map_err(|e| format!("{}: {e}", create(i)))?;
                    created.push(i);
                }
            }
        }
        if step == restart.0 {
            let (_, checkpoint, crash) = restart;
            if checkpoint {
                client
                    .batch_execute("CHECKPOINT")
                    .await
                    .map_err(|e| format!("CHECKPOINT: {e}"))?;
            }
            server
                .restart_in_place(crash)
                .map_err(|e| format!("restart: {e:#}"))?;
            client = server.connect().await.map_err(|e| e.to_string())?;
        }
        client
            .batch_execute("FLUSH")
            .await
            .map_err(|e| e.to_string())?;
        for &i in &created {
            let view = query_sorted(&client, &format!("SELECT * FROM {v}_{}", VIEWS[i].0))
                .await
                .map_err(|e| e.to_string())?;
            let batch = query_sorted(&client, &query(VIEWS[i].1))
                .await
                .map_err(|e| e.to_string())?;
            if view != batch {
                return Err(format!(
                    "view {} after step {step} ({}):\n view:  {view:?}\n batch: {batch:?}",
                    VIEWS[i].0,
                    op.sql(&a, &b)
                ));
            }
        }
    }
    // Each case leaves the server as it found it: later restarts rebuild only their own views.
    client
        .batch_execute(&format!("DROP TABLE {a}, {b} CASCADE"))
        .await
        .map_err(|e| e.to_string())?;
    Ok(())
}

#[test]
fn views_equal_their_queries_in_batch() {
    // One server for every case (each case uses its own tables and views); dropped, and so
    // killed, when the test ends.
    let server = std::cell::RefCell::new(
        EddyProcess::start_fresh_with(
            std::path::Path::new(env!("CARGO_BIN_EXE_eddy")),
            Some(eddy_testkit::TEST_WORKERS),
        )
        .unwrap(),
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let config = ProptestConfig {
        cases: 24,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    let mut runner = proptest::test_runner::TestRunner::new(config);
    let strategy = (
        prop::collection::vec(op(), 1..12),
        0usize..VIEWS.len(),
        (0usize..12, any::<bool>(), any::<bool>()),
    );
    let result = runner.run(&strategy, |(ops, late_from, restart)| {
        runtime
            .block_on(check_case(
                &mut server.borrow_mut(),
                &ops,
                late_from,
                restart,
            ))
            .map_err(TestCaseError::fail)
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}
