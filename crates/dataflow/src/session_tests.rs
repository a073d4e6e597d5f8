//! Session windows against a model and against their exhaustive schedule.
//!
//! The model: with events that are never late, the view is the sessions of every event held
//! (count, sum and max of a nullable column per session; under `EMIT ON WINDOW CLOSE` only the
//! closed ones), through merges, splits, retractions, checkpoints, restarts and spilling.
//! The schedule: with each key due at its own thresholds, the operator emits exactly what it
//! emits when every key is looked at again whenever the watermark moves — for sessions that
//! merge, retractions, late events dropped or applied, `EMIT ON WINDOW CLOSE`, allowed
//! lateness, and across a checkpoint and restart.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{
    Array, AsArray, Int32Array, Int64Array, RecordBatch, TimestampMicrosecondArray,
};
use arrow::datatypes::{
    DataType, Field, Int32Type, Int64Type, Schema, SchemaRef, TimeUnit, TimestampMicrosecondType,
};
use datafusion::functions_aggregate::{count::count_udaf, min_max::max_udaf, sum::sum_udaf};
use datafusion::physical_expr::aggregate::AggregateExprBuilder;
use datafusion::physical_expr::expressions::Column;
use eddy_common::{ChangeBatch, ObjectId};
use proptest::prelude::*;

use crate::plan::{AggregateCall, Expr, Lateness, Node, WindowClose};

thread_local! {
    /// Operators built on this thread while set look at every key on each watermark move.
    pub(super) static REVISIT_ALL: Cell<bool> = const { Cell::new(false) };
}

const SOURCE: ObjectId = ObjectId(1);
const SECOND: i64 = 1_000_000;
const GAP: i64 = 10 * SECOND;

fn timestamp() -> DataType {
    DataType::Timestamp(TimeUnit::Microsecond, None)
}

/// The session's input: a key, the event time, the window bound placeholders and a value.
fn input() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int32, false),
        Field::new("ts", timestamp(), false),
        Field::new("ws", timestamp(), false),
        Field::new("we", timestamp(), false),
        Field::new("v", DataType::Int64, true),
    ]))
}

fn plan(emit_on_close: bool, lateness: Lateness) -> Node {
    plan_with(Some(WindowClose {
        key: 1,
        to_end_micros: 0,
        sources: vec![SOURCE],
        lateness,
        emit_on_close,
    }))
}

/// `SELECT k, window_start, window_end, count(ts), sum(v), max(v) FROM SESSION(..) GROUP BY ..`.
fn plan_with(window: Option<WindowClose>) -> Node {
    let s = input();
    let col = |name: &str, i: usize| -> Expr { Arc::new(Column::new(name, i)) };
    let call = |udaf, arg: Expr, alias: &str| AggregateCall {
        function: Arc::new(
            AggregateExprBuilder::new(udaf, vec![arg])
                .schema(Arc::clone(&s))
                .alias(alias)
                .build()
                .unwrap(),
        ),
        filter: None,
    };
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int32, false),
        Field::new("window_start", timestamp(), true),
        Field::new("window_end", timestamp(), true),
        Field::new("n", DataType::Int64, true),
        Field::new("total", DataType::Int64, true),
        Field::new("top", DataType::Int64, true),
    ]));
    let aggregates = vec![
        call(count_udaf(), col("ts", 1), "n"),
        call(sum_udaf(), col("v", 4), "total"),
        call(max_udaf(), col("v", 4), "top"),
    ];
    Node::SessionAggregate {
        input: Box::new(Node::Source {
            object: SOURCE,
            name: "events".into(),
            schema: s,
        }),
        group: vec![col("k", 0), col("ws", 2), col("we", 3)],
        starts: vec![1],
        ends: vec![2],
        time: col("ts", 1),
        gap_micros: GAP,
        aggregates,
        window,
        schema,
    }
}

fn changes(rows: &[(i32, i64, i64)]) -> ChangeBatch {
    let rows: Vec<_> = rows.iter().map(|&(k, t, d)| (k, t, None, d)).collect();
    valued(&rows)
}

/// Changes of (key, time µs, value, diff).
fn valued(rows: &[(i32, i64, Option<i64>, i64)]) -> ChangeBatch {
    let ts = || TimestampMicrosecondArray::from_iter_values(rows.iter().map(|r| r.1));
    let batch = RecordBatch::try_new(
        input(),
        vec![
            Arc::new(Int32Array::from_iter_values(rows.iter().map(|r| r.0))),
            Arc::new(ts()),
            Arc::new(ts()),
            Arc::new(ts()),
            Arc::new(Int64Array::from_iter(rows.iter().map(|r| r.2))),
        ],
    )
    .unwrap();
    ChangeBatch::new(
        batch,
        Int64Array::from_iter_values(rows.iter().map(|r| r.3)),
    )
}

/// A session's row: key, window start, window end, count, sum, max.
type SessionRow = (i32, i64, i64, i64, Option<i64>, Option<i64>);

/// Session rows -> multiplicity.
type Shown = BTreeMap<SessionRow, i64>;

fn accumulate_shown(out: &mut Shown, batches: Vec<ChangeBatch>) {
    for c in batches {
        let rows = c.rows();
        let k = rows.column(0).as_primitive::<Int32Type>();
        let start = rows.column(1).as_primitive::<TimestampMicrosecondType>();
        let end = rows.column(2).as_primitive::<TimestampMicrosecondType>();
        let n = rows.column(3).as_primitive::<Int64Type>();
        let value = |c: usize, i: usize| {
            let a = rows.column(c).as_primitive::<Int64Type>();
            a.is_valid(i).then(|| a.value(i))
        };
        for i in 0..c.len() {
            let row = (
                k.value(i),
                start.value(i),
                end.value(i),
                n.value(i),
                value(4, i),
                value(5, i),
            );
            *out.entry(row).or_default() += c.diffs().value(i);
        }
    }
    out.retain(|_, n| *n != 0);
}

/// The sessions of the events held ((key, time s, value) -> copies), each key's events
/// chained while closer than the gap; under `EMIT ON WINDOW CLOSE` only those the watermark
/// closed.
fn sessions_of(held: &BTreeMap<(i32, i64, Option<i64>), i64>, closed_by: Option<i64>) -> Shown {
    let mut out = Shown::new();
    let mut current: Option<SessionRow> = None;
    let close = |s: SessionRow, out: &mut Shown| {
        if closed_by.is_none_or(|w| s.2 <= w) {
            *out.entry(s).or_default() += 1;
        }
    };
    for (&(k, t, v), &n) in held.iter().filter(|(_, n)| **n > 0) {
        let t = t * SECOND;
        let plus = |a: Option<i64>, b: Option<i64>| match (a, b) {
            (Some(a), Some(b)) => Some(a + b),
            (a, b) => a.or(b),
        };
        match &mut current {
            Some(s) if s.0 == k && t < s.2 => {
                s.2 = s.2.max(t + GAP);
                s.3 += n;
                s.4 = plus(s.4, v.map(|v| v * n));
                s.5 = s.5.max(v);
            }
            _ => {
                if let Some(s) = current.take() {
                    close(s, &mut out);
                }
                current = Some((k, t, t + GAP, n, v.map(|v| v * n), v));
            }
        }
    }
    if let Some(s) = current {
        close(s, &mut out);
    }
    out
}

/// Epochs: events (key, time in seconds, insert or delete a held copy), then the watermark's
/// step (seconds; 0: it stays).
type Epochs = Vec<(Vec<(i32, i64, bool)>, i64)>;

fn epochs() -> impl Strategy<Value = Epochs> {
    let event = (0i32..4, 0i64..200, prop::bool::weighted(0.75));
    prop::collection::vec(
        (
            prop::collection::vec(event, 0..6),
            prop_oneof![0i64..1, 1i64..25],
        ),
        1..16,
    )
}

/// Epochs of on-time events: (key, seconds past the watermark, value, insert or delete a
/// held copy), then the watermark's step (seconds; 0: it stays).
type OnTime = Vec<(Vec<(i32, i64, Option<i64>, bool)>, i64)>;

fn on_time() -> impl Strategy<Value = OnTime> {
    let value = prop_oneof![Just(None), (0i64..3).prop_map(Some)];
    let event = (0i32..3, 0i64..40, value, prop::bool::weighted(0.7));
    prop::collection::vec(
        (
            prop::collection::vec(event, 0..8),
            prop_oneof![0i64..1, 1i64..25],
        ),
        1..16,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn sessions_equal_the_sessions_of_the_events_held(
        epochs in on_time(),
        watermarked in any::<bool>(),
        emit_on_close in any::<bool>(),
        allowed in prop_oneof![Just(0i64), 1i64..30],
        restart_after in 0usize..16,
        spill in any::<bool>(),
    ) {
        let emit_on_close = watermarked && emit_on_close;
        let window = watermarked.then(|| WindowClose {
            key: 1,
            to_end_micros: 0,
            sources: vec![SOURCE],
            lateness: Lateness { retract: false, allowed_micros: allowed * SECOND },
            emit_on_close,
        });
        let plan = plan_with(window);
        let spilling = spill.then(|| crate::spill::tests::Spilling::with_limit(0));
        let build = || {
            let event_time = Arc::new(crate::EventTime::new(&[SOURCE]));
            let mut flow = crate::build(&plan, &event_time, &crate::Workers::single()).unwrap();
            if let Some(s) = &spilling {
                flow.spill_to(&s.budget);
            }
            flow
        };
        let mut flow = build();
        let mut got = Shown::new();
        let mut held: BTreeMap<(i32, i64, Option<i64>), i64> = BTreeMap::new();
        let mut watermark = 0i64;
        let mut checkpoints = crate::flow::TestCheckpoints::default();
        let mut spilled = 0;
        let mut inserted = false;
        for (n, (events, step)) in epochs.into_iter().enumerate() {
            let mut batch = Vec::new();
            for (k, dt, v, insert) in events {
                let t = watermark + dt;
                let copies = held.entry((k, t, v)).or_default();
                let diff = match (insert, *copies > 0) {
                    (true, _) => 1,
                    (false, true) => -1,
                    (false, false) => continue,
                };
                *copies += diff;
                inserted |= diff > 0;
                batch.push((k, t * SECOND, v, diff));
            }
            accumulate_shown(&mut got, flow.push(SOURCE, &valued(&batch)).unwrap());
            if step > 0 && watermarked {
                watermark += step;
                accumulate_shown(&mut got, flow.watermark(SOURCE, watermark * SECOND).unwrap());
            }
            accumulate_shown(&mut got, flow.end_epoch(0).unwrap());
            let want = sessions_of(&held, emit_on_close.then_some(watermark * SECOND));
            spilled += flow.stats().iter().map(|s| s.spilled_rows).sum::<usize>();
            prop_assert_eq!(&got, &want, "after epoch {} (watermark {} s)", n, watermark);
            if n % 3 == 0 {
                checkpoints.save(&mut flow);
            }
            if n == restart_after {
                checkpoints.save(&mut flow);
                checkpoints.restart(&mut flow, build);
                if watermarked && watermark > 0 {
                    accumulate_shown(&mut got, flow.watermark(SOURCE, watermark * SECOND).unwrap());
                }
            }
        }
        // With a budget of no bytes the state went to disk and came back.
        prop_assert!(!spill || !inserted || spilled > 0);
    }

    #[test]
    fn sessions_queued_by_their_thresholds_emit_what_revisiting_every_key_emits(
        epochs in epochs(),
        emit_on_close in any::<bool>(),
        retract in any::<bool>(),
        allowed in prop_oneof![Just(0i64), 1i64..30],
        restart_after in 0usize..16,
    ) {
        let plan = plan(emit_on_close, Lateness { retract, allowed_micros: allowed * SECOND });
        let build = |revisit_all: bool| {
            REVISIT_ALL.set(revisit_all);
            let event_time = Arc::new(crate::EventTime::new(&[SOURCE]));
            let flow = crate::build(&plan, &event_time, &crate::Workers::single()).unwrap();
            REVISIT_ALL.set(false);
            flow
        };
        let (mut queued, mut exhaustive) = (build(false), build(true));
        let (mut got, mut want) = (Shown::new(), Shown::new());
        let mut held: BTreeMap<(i32, i64), i64> = BTreeMap::new();
        let mut watermark = 0i64;
        for (n, (events, step)) in epochs.into_iter().enumerate() {
            for (k, t, insert) in events {
                let diff = if insert {
                    1
                } else if held.get(&(k, t)).copied().unwrap_or(0) > 0 {
                    -1
                } else {
                    continue;
                };
                *held.entry((k, t)).or_default() += diff;
                let batch = changes(&[(k, t * SECOND, diff)]);
                accumulate_shown(&mut got, queued.push(SOURCE, &batch).unwrap());
                accumulate_shown(&mut want, exhaustive.push(SOURCE, &batch).unwrap());
            }
            if step > 0 {
                watermark += step * SECOND;
                accumulate_shown(&mut got, queued.watermark(SOURCE, watermark).unwrap());
                accumulate_shown(&mut want, exhaustive.watermark(SOURCE, watermark).unwrap());
            }
            accumulate_shown(&mut got, queued.end_epoch(0).unwrap());
            accumulate_shown(&mut want, exhaustive.end_epoch(0).unwrap());
            prop_assert_eq!(&got, &want, "after epoch {} (watermark {} s)", n, watermark / SECOND);
            // The same events are held (and forgotten). Bytes are capacities, which differ
            // once one of them restarted.
            let held = |flow: &crate::Dataflow| {
                flow.stats().iter().map(|s| s.state_rows).collect::<Vec<_>>()
            };
            prop_assert_eq!(held(&queued), held(&exhaustive));
            if n == restart_after {
                crate::flow::restart(&mut queued, || build(false));
                // Recovery hands the restored dataflow its sources' watermarks again.
                if watermark > 0 {
                    accumulate_shown(&mut got, queued.watermark(SOURCE, watermark).unwrap());
                }
            }
        }
    }
}
