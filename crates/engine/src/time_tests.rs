//! The engine reads time from its clock: `AS PROCTIME()` columns, and temporal filters
//! (`now()` in a view), driven here by a [`ManualClock`] instead of sleeping.

use std::sync::Arc;
use std::time::Duration;

use arrow::util::display::array_value_to_string;
use eddy_common::time::{Clock, ManualClock};

use crate::{Engine, EngineConfig, Outcome, Session};

/// 2026-01-01 00:00:00 UTC, µs.
const T0: i64 = 1_767_225_600_000_000;

/// Runs `sql`; the rows of its queries as text, sorted.
pub(crate) async fn run(session: &mut Session, sql: &str) -> Vec<Vec<String>> {
    let mut rows = Vec::new();
    for parsed in eddy_sql::parse_statements(sql).unwrap_or_else(|e| panic!("{sql}: {e}")) {
        let outcome = session
            .execute(&parsed.statement, &[])
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        if let Outcome::Rows { batches, .. } = outcome {
            for b in batches {
                for i in 0..b.num_rows() {
                    rows.push(
                        b.columns()
                            .iter()
                            .map(|c| array_value_to_string(c, i).unwrap_or_else(|e| panic!("{e}")))
                            .collect(),
                    );
                }
            }
        }
    }
    rows.sort();
    rows
}

/// An engine over `dir` with `workers` and `clock`, opened as the server opens it but for
/// `between` (run after opening, before views are restored), and a session on it.
pub(crate) async fn open(
    dir: &std::path::Path,
    workers: usize,
    clock: Arc<dyn Clock>,
    between: impl FnOnce(&Engine),
) -> (Arc<Engine>, Session) {
    let config = EngineConfig {
        data_dir: dir.to_path_buf(),
        workers,
        checkpoint_interval: None,
        log_segment_bytes: None,
        sink_buffer_bytes: None,
        clock,
        barrier_interval: crate::BARRIER_INTERVAL,
        max_state_rows: Some(crate::MAX_STATE_ROWS),
        memory_limit: None,
        max_connections: crate::MAX_CONNECTIONS,
    };
    let engine = Engine::open(&config).unwrap_or_else(|e| panic!("{e}"));
    between(&engine);
    engine
        .restore_views()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    engine.start_background();
    engine.recovered();
    let info = eddy_sql::SessionInfo {
        database: "eddy".into(),
        user: "eddy".into(),
        version: crate::version_string(),
        backend_pid: 1,
    };
    let session = Session::new(Arc::clone(&engine), &info).unwrap_or_else(|e| panic!("{e}"));
    (engine, session)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proctime_and_temporal_filters_follow_the_engine_clock() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let clock = ManualClock::starting_at(T0);
    let (engine, mut s) = open(dir.path(), 1, Arc::clone(&clock) as Arc<dyn Clock>, |_| {}).await;
    run(&mut s, "SET TIME ZONE 'UTC'").await;
    run(
        &mut s,
        "CREATE TABLE pings (id INT, at TIMESTAMPTZ AS PROCTIME());
         CREATE MATERIALIZED VIEW recent AS SELECT id FROM pings WHERE at > now() - INTERVAL '1 minute'",
    )
    .await;
    run(&mut s, "INSERT INTO pings (id) VALUES (1); FLUSH").await;
    assert_eq!(
        run(&mut s, "SELECT id, at FROM pings").await,
        [["1", "2026-01-01T00:00:00Z"]],
        "proctime is the clock's time at commit"
    );
    assert_eq!(run(&mut s, "SELECT id FROM recent").await, [["1"]]);
    clock.advance(Duration::from_secs(30));
    run(&mut s, "INSERT INTO pings (id) VALUES (2); FLUSH").await;
    assert_eq!(run(&mut s, "SELECT id FROM recent").await, [["1"], ["2"]]);
    // Just before ping 1's minute is up, then just after: the epoch FLUSH ends judges it.
    clock.advance(Duration::from_secs(30) - Duration::from_micros(1));
    run(&mut s, "FLUSH").await;
    assert_eq!(run(&mut s, "SELECT id FROM recent").await, [["1"], ["2"]]);
    clock.advance(Duration::from_micros(1));
    run(&mut s, "FLUSH").await;
    assert_eq!(run(&mut s, "SELECT id FROM recent").await, [["2"]]);
    clock.advance(Duration::from_secs(30));
    run(&mut s, "FLUSH").await;
    assert!(run(&mut s, "SELECT id FROM recent").await.is_empty());
    engine.shutdown();
}
