//! Sharded state is restored only into shards split by the same routing hash: a checkpoint
//! taken with another `ROUTE_HASH_VERSION` (here: one from before it was recorded) is not
//! restored, the views are rebuilt from the log, and they answer the same.

use crate::time_tests::{open, run};

const SETUP: &str = "CREATE TABLE t (k INT, v INT);
    INSERT INTO t SELECT x % 7, x FROM generate_series(1, 1000) AS s(x);
    CREATE MATERIALIZED VIEW per_k AS SELECT k, count(*) AS n, sum(v) AS s FROM t GROUP BY k;
    FLUSH";
const ANSWER: &str = "SELECT k, n, s FROM per_k";
const RESTORED: &str = "SELECT restored_from FROM eddy_views WHERE name = 'per_k'";

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_of_another_routing_hash_is_rebuilt_from_the_log() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let clock = eddy_common::time::system_clock;
    let (engine, mut s) = open(dir.path(), 2, clock(), |_| {}).await;
    run(&mut s, SETUP).await;
    let want = run(&mut s, ANSWER).await;
    assert_eq!(want.len(), 7);
    run(&mut s, "CHECKPOINT").await;
    drop(s);
    engine.shutdown();
    drop(engine);
    // The same routing hash: restored from the checkpoint.
    let (engine, mut s) = open(dir.path(), 2, clock(), |_| {}).await;
    assert_eq!(run(&mut s, ANSWER).await, want);
    assert!(run(&mut s, RESTORED).await[0][0].starts_with("checkpoint"));
    drop(s);
    engine.shutdown();
    drop(engine);
    // Another one: rebuilt from the log, with the same answer.
    let (engine, mut s) = open(dir.path(), 2, clock(), |e| set_route_hash(e, 0)).await;
    assert_eq!(run(&mut s, RESTORED).await, [["log"]]);
    assert_eq!(run(&mut s, ANSWER).await, want);
    drop(s);
    engine.shutdown();
}
