//! Sharded state follows the workers: a checkpoint taken on 2 workers restores into 3, into 1
//! and back into 2 (each operator's state routed by its keys to the shard they pick now), and
//! one recorded with another `ROUTE_HASH_VERSION` (here: one from before it was recorded) is
//! re-sharded by the current hash. Every restart restores from the checkpoint (not the log)
//! and answers the same, before and after more writes.

use crate::time_tests::{open, run};

const SETUP: &str = "CREATE TABLE t (k INT, v INT);
    CREATE TABLE d (k INT PRIMARY KEY, name TEXT);
    INSERT INTO t SELECT x % 7, x FROM generate_series(1, 1000) AS s(x);
    INSERT INTO d SELECT x, 'k' || x FROM generate_series(0, 5) AS s(x);
    CREATE MATERIALIZED VIEW per_k AS SELECT k, count(*) AS n, sum(v) AS s FROM t GROUP BY k;
    CREATE MATERIALIZED VIEW named AS SELECT d.name, t.v FROM t JOIN d ON t.k = d.k WHERE t.v % 50 = 0;
    CREATE MATERIALIZED VIEW top2 AS SELECT k, v FROM (SELECT k, v, row_number() OVER (PARTITION BY k ORDER BY v DESC) AS r FROM t) WHERE r <= 2;
    FLUSH";
const ANSWERS: [&str; 3] = [
    "SELECT k, n, s FROM per_k ORDER BY k",
    "SELECT name, v FROM named ORDER BY name, v",
    "SELECT k, v FROM top2 ORDER BY k, v",
];
const MORE: &str = "INSERT INTO t SELECT x % 9, x FROM generate_series(1001, 1300) AS s(x);
    DELETE FROM t WHERE v % 3 = 0 AND v > 900;
    UPDATE d SET name = 'renamed' WHERE k = 2;
    FLUSH";
const RESTORED: &str = "SELECT DISTINCT restored_from LIKE 'checkpoint%' FROM eddy_views WHERE name IN ('per_k', 'named', 'top2')";

/// Rewrites the newest checkpoint manifest with its routing hash set to `version`.
fn set_route_hash(engine: &crate::Engine, version: u64) {
    let (epoch, bytes) = engine
        .meta
        .checkpoints()
        .unwrap_or_else(|e| panic!("{e}"))
        .pop()
        .unwrap_or_else(|| panic!("no checkpoint"));
    let mut manifest: serde_json::Value =
        serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{e}"));
    manifest["route_hash"] = serde_json::Value::from(version);
    let bytes = serde_json::to_vec(&manifest).unwrap_or_else(|e| panic!("{e}"));
    engine
        .meta
        .commit_checkpoint(epoch, &bytes, &[])
        .unwrap_or_else(|e| panic!("{e}"));
}

async fn answers(s: &mut crate::Session) -> Vec<Vec<Vec<String>>> {
    let mut out = Vec::new();
    for q in ANSWERS {
        out.push(run(s, q).await);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_is_re_sharded_onto_another_number_of_workers_and_hash() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let clock = eddy_common::time::system_clock;
    let (engine, mut s) = open(dir.path(), 2, clock(), |_| {}).await;
    run(&mut s, SETUP).await;
    let want = answers(&mut s).await;
    assert_eq!(want[0].len(), 7);
    run(&mut s, "CHECKPOINT").await;
    // What the views answer after more writes, from the log alone (a fresh engine on one
    // worker rebuilds them in the same order of writes).
    let (later_engine, mut later) = open(&dir.path().join("oracle"), 1, clock(), |_| {}).await;
    run(&mut later, SETUP).await;
    run(&mut later, MORE).await;
    let want_later = answers(&mut later).await;
    drop(later);
    later_engine.shutdown();
    drop(s);
    engine.shutdown();
    drop(engine);
    // 2 -> 3 -> 1 -> 2 workers, the last with another routing hash in the manifest.
    for (workers, hash) in [(3, None), (1, None), (2, Some(0))] {
        let (engine, mut s) = open(dir.path(), workers, clock(), |e| {
            if let Some(v) = hash {
                set_route_hash(e, v);
            }
        })
        .await;
        assert_eq!(
            run(&mut s, RESTORED).await,
            [["true"]],
            "on {workers} workers"
        );
        assert_eq!(answers(&mut s).await, want, "on {workers} workers");
        run(&mut s, "CHECKPOINT").await;
        drop(s);
        engine.shutdown();
        drop(engine);
    }
    let (engine, mut s) = open(dir.path(), 3, clock(), |_| {}).await;
    run(&mut s, MORE).await;
    assert_eq!(answers(&mut s).await, want_later);
    drop(s);
    engine.shutdown();
}
