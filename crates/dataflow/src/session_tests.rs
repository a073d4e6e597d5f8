//! Session windows against their exhaustive schedule: with each key queued by its own
//! thresholds, the operator emits exactly what it emits when every key is looked at again
//! whenever the watermark moves — for sessions that merge, retractions, late events dropped or
//! applied, `EMIT ON WINDOW CLOSE`, allowed lateness, and across a checkpoint and restart.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{AsArray, Int32Array, Int64Array, RecordBatch, TimestampMicrosecondArray};
use arrow::datatypes::{
    DataType, Field, Int32Type, Int64Type, Schema, SchemaRef, TimeUnit, TimestampMicrosecondType,
};
use datafusion::functions_aggregate::count::count_udaf;
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

/// (key, window start, window end, count) -> multiplicity.
type Bag = BTreeMap<(i32, i64, i64, i64), i64>;

fn timestamp() -> DataType {
    DataType::Timestamp(TimeUnit::Microsecond, None)
}

/// The session's input: a key, the event time, and the window bound placeholders.
fn input() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int32, false),
        Field::new("ts", timestamp(), false),
        Field::new("ws", timestamp(), false),
        Field::new("we", timestamp(), false),
    ]))
}

fn plan(emit_on_close: bool, lateness: Lateness) -> Node {
    let s = input();
    let col = |name: &str, i: usize| -> Expr { Arc::new(Column::new(name, i)) };
    let count = AggregateExprBuilder::new(count_udaf(), vec![col("ts", 1)])
        .schema(Arc::clone(&s))
        .alias("n")
        .build()
        .unwrap();
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int32, false),
        Field::new("window_start", timestamp(), true),
        Field::new("window_end", timestamp(), true),
        Field::new("n", DataType::Int64, true),
    ]));
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
        aggregates: vec![AggregateCall {
            function: Arc::new(count),
            filter: None,
        }],
        window: Some(WindowClose {
            key: 1,
            to_end_micros: 0,
            sources: vec![SOURCE],
            lateness,
            emit_on_close,
        }),
        schema,
    }
}

fn changes(rows: &[(i32, i64, i64)]) -> ChangeBatch {
    let ts = || TimestampMicrosecondArray::from_iter_values(rows.iter().map(|r| r.1));
    let batch = RecordBatch::try_new(
        input(),
        vec![
            Arc::new(Int32Array::from_iter_values(rows.iter().map(|r| r.0))),
            Arc::new(ts()),
            Arc::new(ts()),
            Arc::new(ts()),
        ],
    )
    .unwrap();
    ChangeBatch::new(
        batch,
        Int64Array::from_iter_values(rows.iter().map(|r| r.2)),
    )
}

fn accumulate(out: &mut Bag, batches: Vec<ChangeBatch>) {
    for c in batches {
        let rows = c.rows();
        let k = rows.column(0).as_primitive::<Int32Type>();
        let start = rows.column(1).as_primitive::<TimestampMicrosecondType>();
        let end = rows.column(2).as_primitive::<TimestampMicrosecondType>();
        let n = rows.column(3).as_primitive::<Int64Type>();
        for i in 0..c.len() {
            let row = (k.value(i), start.value(i), end.value(i), n.value(i));
            *out.entry(row).or_default() += c.diffs().value(i);
        }
    }
    out.retain(|_, n| *n != 0);
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

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, failure_persistence: None, ..ProptestConfig::default() })]

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
        let (mut got, mut want) = (Bag::new(), Bag::new());
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
                accumulate(&mut got, queued.push(SOURCE, &batch).unwrap());
                accumulate(&mut want, exhaustive.push(SOURCE, &batch).unwrap());
            }
            if step > 0 {
                watermark += step * SECOND;
                accumulate(&mut got, queued.watermark(SOURCE, watermark).unwrap());
                accumulate(&mut want, exhaustive.watermark(SOURCE, watermark).unwrap());
            }
            accumulate(&mut got, queued.end_epoch(0).unwrap());
            accumulate(&mut want, exhaustive.end_epoch(0).unwrap());
            prop_assert_eq!(&got, &want, "after epoch {} (watermark {} s)", n, watermark / SECOND);
            // The same events are held (and forgotten), as counted while they change.
            let held = |flow: &crate::Dataflow| {
                flow.stats().iter().map(|s| (s.state_rows, s.state_bytes)).collect::<Vec<_>>()
            };
            prop_assert_eq!(held(&queued), held(&exhaustive));
            if n == restart_after {
                crate::flow::restart(&mut queued, || build(false));
                // Recovery hands the restored dataflow its sources' watermarks again.
                if watermark > 0 {
                    accumulate(&mut got, queued.watermark(SOURCE, watermark).unwrap());
                }
            }
        }
    }
}
