//! Event-time property test: random event streams with bounded disorder, one INSERT per batch.
//! - `late_events = 'retract'` with lateness larger than the disorder: the view equals the
//!   batch window aggregate (DataFusion, ad hoc) over all events.
//! - `'drop'` (default): the view equals the aggregate over the rows the watermark model
//!   accepts, and every rejected row is in `eddy_late_events`.
//! - `EMIT ON WINDOW CLOSE`: the accepted rows of the closed windows only.
//! - HOP: per window, the same model.
//!
//! The model: the watermark is the largest event time of the batches before minus the delay;
//! a row is accepted for a window iff the window's end is above the watermark.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use eddy_testkit::{EddyProcess, query_sorted};
use proptest::prelude::*;

const DELAY: i64 = 2;
const SIZE: i64 = 10;
const SLIDE: i64 = 5;
const GAP: i64 = 3;

/// Batches of (key, value, event second); event seconds drift forward with bounded disorder.
fn stream() -> impl Strategy<Value = Vec<Vec<(i32, i32, i64)>>> {
    prop::collection::vec(
        prop::collection::vec((0..3i32, 0..100i32, 0..3i64, -6..2i64), 1..4),
        1..14,
    )
    .prop_map(|batches| {
        let mut now = 1000i64;
        batches
            .into_iter()
            .map(|batch| {
                batch
                    .into_iter()
                    .map(|(k, v, step, jitter)| {
                        now += step;
                        (k, v, (now + jitter).max(0))
                    })
                    .collect()
            })
            .collect()
    })
}

fn ts(second: i64) -> String {
    format!(
        "2026-01-01 {:02}:{:02}:{:02}",
        second / 3600,
        second / 60 % 60,
        second % 60
    )
}

/// Per (window start, key): count, sum, min, max.
type Groups = BTreeMap<(i64, i32), (i64, i64, i32, i32)>;

/// (accepted per window start and key: count, sum), rejected (row, window) pairs, final watermark.
fn model(
    batches: &[Vec<(i32, i32, i64)>],
    windows: impl Fn(i64) -> Vec<i64>,
) -> (Groups, usize, Option<i64>) {
    let mut groups = Groups::new();
    let mut rejected = 0;
    let mut watermark: Option<i64> = None;
    for batch in batches {
        for &(k, v, t) in batch {
            for start in windows(t) {
                if watermark.is_some_and(|w| start + SIZE <= w) {
                    rejected += 1;
                } else {
                    let g = groups
                        .entry((start, k))
                        .or_insert((0, 0, i32::MAX, i32::MIN));
                    g.0 += 1;
                    g.1 += i64::from(v);
                    g.2 = g.2.min(v);
                    g.3 = g.3.max(v);
                }
            }
        }
        let top = batch.iter().map(|r| r.2).max().unwrap_or(0) - DELAY;
        watermark = Some(watermark.map_or(top, |w: i64| w.max(top)));
    }
    (groups, rejected, watermark)
}

fn rows(groups: &Groups, keep: impl Fn(i64) -> bool) -> Vec<Vec<Option<String>>> {
    let mut out: Vec<Vec<Option<String>>> = groups
        .iter()
        .filter(|((start, _), _)| keep(*start))
        .map(|((start, k), (n, s, lo, hi))| {
            vec![
                Some(ts(*start)),
                Some(k.to_string()),
                Some(n.to_string()),
                Some(s.to_string()),
                Some(lo.to_string()),
                Some(hi.to_string()),
            ]
        })
        .collect();
    out.sort();
    out
}

static CASE: AtomicUsize = AtomicUsize::new(0);

/// Pairs of events of one key at most two seconds apart (later or equal second).
fn pairs_query(t: &str) -> String {
    format!(
        "SELECT a.k, a.v, b.v AS w FROM {t} a JOIN {t} b ON a.k = b.k AND b.ts BETWEEN a.ts AND a.ts + INTERVAL '2 seconds'"
    )
}

async fn check(server: &EddyProcess, batches: &[Vec<(i32, i32, i64)>]) -> Result<(), String> {
    let client = server.connect().await.map_err(|e| e.to_string())?;
    let case = CASE.fetch_add(1, Ordering::Relaxed);
    let t = format!("ev{case}");
    let tumble = format!("TUMBLE({t}, ts, INTERVAL '{SIZE} seconds')");
    let hop = format!("HOP({t}, ts, INTERVAL '{SLIDE} seconds', INTERVAL '{SIZE} seconds')");
    let select = |from: &str| {
        format!(
            "SELECT window_start, k, count(*) AS n, sum(v) AS s, min(v) AS lo, max(v) AS hi FROM {from} GROUP BY 1, 2"
        )
    };
    client
        .batch_execute(&format!(
            "CREATE TABLE {t} (k INT, v INT, ts TIMESTAMP, WATERMARK FOR ts AS ts - INTERVAL '{DELAY} seconds') APPEND ONLY;
             CREATE MATERIALIZED VIEW {t}_fixed WITH (late_events = 'retract', allowed_lateness = '1 hour') AS {fixed};
             CREATE MATERIALIZED VIEW {t}_drop AS {drop};
             CREATE MATERIALIZED VIEW {t}_closed AS {drop} EMIT ON WINDOW CLOSE;
             CREATE MATERIALIZED VIEW {t}_hop AS {hopped};
             CREATE MATERIALIZED VIEW {t}_sess WITH (late_events = 'retract', allowed_lateness = '1 hour') AS
               SELECT k, window_start, window_end, count(*) AS n, sum(v) AS s FROM SESSION({t}, ts, INTERVAL '{GAP} seconds') GROUP BY 1, 2, 3;
             CREATE MATERIALIZED VIEW {t}_pairs WITH (late_events = 'retract', allowed_lateness = '1 hour') AS {pairs};",
            pairs = pairs_query(&t),
            fixed = select(&tumble),
            drop = select(&tumble),
            hopped = select(&hop),
        ))
        .await
        .map_err(|e| e.to_string())?;
    for batch in batches {
        let values: Vec<String> = batch
            .iter()
            .map(|(k, v, s)| format!("({k}, {v}, '{}')", ts(*s)))
            .collect();
        client
            .batch_execute(&format!("INSERT INTO {t} VALUES {}", values.join(", ")))
            .await
            .map_err(|e| e.to_string())?;
    }
    client
        .batch_execute("FLUSH")
        .await
        .map_err(|e| e.to_string())?;
    let read = |view: String| {
        let client = &client;
        async move {
            query_sorted(client, &format!("SELECT * FROM {view}"))
                .await
                .map_err(|e| e.to_string())
        }
    };
    let compare = |what: &str, got: Vec<Vec<Option<String>>>, want: Vec<Vec<Option<String>>>| {
        if got == want {
            Ok(())
        } else {
            Err(format!(
                "{what}:\n got:  {got:?}\n want: {want:?}\n stream: {batches:?}"
            ))
        }
    };

    // An interval self-join with ample lateness: as DataFusion computes it in batch.
    let batch_pairs = query_sorted(&client, &pairs_query(&t))
        .await
        .map_err(|e| e.to_string())?;
    compare(
        "interval join vs batch",
        read(format!("{t}_pairs")).await?,
        batch_pairs,
    )?;

    // Retract with ample lateness: everything applied, as DataFusion computes it in batch.
    let batch = query_sorted(&client, &select(&tumble))
        .await
        .map_err(|e| e.to_string())?;
    compare(
        "retract view vs batch",
        read(format!("{t}_fixed")).await?,
        batch,
    )?;

    let tumble_windows = |t: i64| vec![t - t.rem_euclid(SIZE)];
    let (accepted, rejected, watermark) = model(batches, tumble_windows);
    compare(
        "drop view vs model",
        read(format!("{t}_drop")).await?,
        rows(&accepted, |_| true),
    )?;
    let closed = |start: i64| watermark.is_some_and(|w| start + SIZE <= w);
    compare(
        "closed view vs model",
        read(format!("{t}_closed")).await?,
        rows(&accepted, closed),
    )?;

    let hop_windows = |t: i64| {
        let last = t - t.rem_euclid(SLIDE);
        (0..SIZE / SLIDE).map(|i| last - i * SLIDE).collect()
    };
    let (hop_accepted, hop_rejected, _) = model(batches, hop_windows);
    compare(
        "hop view vs model",
        read(format!("{t}_hop")).await?,
        rows(&hop_accepted, |_| true),
    )?;

    // Sessions (everything applied): per key, events closer than the gap chain together.
    let mut by_key: BTreeMap<i32, Vec<(i64, i32)>> = BTreeMap::new();
    for &(k, v, s) in batches.iter().flatten() {
        by_key.entry(k).or_default().push((s, v));
    }
    let mut sessions = Vec::new();
    for (k, mut events) in by_key {
        events.sort();
        let mut current: Option<(i64, i64, i64, i64)> = None;
        for (s, v) in events {
            current = match current {
                Some((start, end, n, sum)) if s < end => {
                    Some((start, end.max(s + GAP), n + 1, sum + i64::from(v)))
                }
                other => {
                    if let Some((start, end, n, sum)) = other {
                        sessions.push(vec![
                            Some(k.to_string()),
                            Some(ts(start)),
                            Some(ts(end)),
                            Some(n.to_string()),
                            Some(sum.to_string()),
                        ]);
                    }
                    Some((s, s + GAP, 1, i64::from(v)))
                }
            };
        }
        if let Some((start, end, n, sum)) = current {
            sessions.push(vec![
                Some(k.to_string()),
                Some(ts(start)),
                Some(ts(end)),
                Some(n.to_string()),
                Some(sum.to_string()),
            ]);
        }
    }
    sessions.sort();
    compare(
        "session view vs model",
        read(format!("{t}_sess")).await?,
        sessions,
    )?;

    let late = |view: String| {
        let client = &client;
        async move {
            let rows = query_sorted(
                client,
                &format!("SELECT count(*) FROM eddy_late_events WHERE view = '{view}'"),
            )
            .await
            .map_err(|e| e.to_string())?;
            Ok::<usize, String>(rows[0][0].as_deref().unwrap_or("0").parse().unwrap_or(0))
        }
    };
    let counts = (
        late(format!("{t}_drop")).await?,
        late(format!("{t}_closed")).await?,
        late(format!("{t}_hop")).await?,
        late(format!("{t}_fixed")).await?,
    );
    if counts != (rejected, rejected, hop_rejected, 0) {
        return Err(format!(
            "late events (drop, closed, hop, fixed) {counts:?}, model ({rejected}, {rejected}, {hop_rejected}, 0); stream {batches:?}"
        ));
    }
    client
        .batch_execute(&format!("DROP TABLE {t} CASCADE"))
        .await
        .map_err(|e| e.to_string())?;
    Ok(())
}

#[test]
fn windows_follow_the_watermark_model() {
    let server =
        EddyProcess::start_fresh(std::path::Path::new(env!("CARGO_BIN_EXE_eddy"))).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let config = ProptestConfig {
        cases: 32,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    let mut runner = proptest::test_runner::TestRunner::new(config);
    let result = runner.run(&stream(), |batches| {
        runtime
            .block_on(check(&server, &batches))
            .map_err(TestCaseError::fail)
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// A long stream through a one-minute tumbling aggregate: the aggregate's state stays at the
/// open windows however many events pass (closed windows are freed by the watermark), and the
/// view still counts every event.
#[tokio::test]
async fn tumbling_state_stays_flat() {
    let server =
        EddyProcess::start_fresh(std::path::Path::new(env!("CARGO_BIN_EXE_eddy"))).unwrap();
    let client = server.connect().await.unwrap();
    client
        .batch_execute(
            "CREATE TABLE s (k INT, ts TIMESTAMP, WATERMARK FOR ts AS ts - INTERVAL '5 seconds') APPEND ONLY;
             CREATE MATERIALIZED VIEW per_minute AS
               SELECT window_start, k, count(*) AS n FROM TUMBLE(s, ts, INTERVAL '1' MINUTE) GROUP BY 1, 2",
        )
        .await
        .unwrap();
    const BATCH: i64 = 10_000;
    const BATCHES: i64 = 30;
    let mut peak = 0u64;
    for b in 0..BATCHES {
        // One event every 10 ms from 2026-01-01 00:00:00 UTC, ten keys.
        let sql = format!(
            "INSERT INTO s SELECT x % 10, to_timestamp_micros(1767225600000000 + x * 10000) FROM generate_series({}, {}) AS g(x)",
            b * BATCH,
            (b + 1) * BATCH - 1
        );
        client.batch_execute(&sql).await.unwrap();
        client.batch_execute("FLUSH").await.unwrap();
        let state = query_sorted(&client, "SELECT state_rows FROM eddy_operators WHERE view = 'per_minute' AND operator = 'Aggregate'").await.unwrap();
        peak = peak.max(state[0][0].as_deref().unwrap().parse().unwrap());
    }
    // 300 000 events over 50 minutes; at most two windows are open at a time (10 keys each).
    assert!(peak <= 20, "aggregate state grew to {peak} rows");
    let total = query_sorted(&client, "SELECT sum(n), count(*) FROM per_minute")
        .await
        .unwrap();
    assert_eq!(
        total[0],
        vec![Some((BATCH * BATCHES).to_string()), Some("500".to_owned())]
    );
}
