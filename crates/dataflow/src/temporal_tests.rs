//! The temporal filter against an oracle: after every epoch, what it emitted in all equals
//! the rows held whose `[ts, ts + 60 s)` contains the epoch's time; with its state spilled at
//! every batch, and across a checkpoint and restart.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{AsArray, Int32Array, RecordBatch, TimestampMicrosecondArray};
use arrow::datatypes::{DataType, Field, Int32Type, Schema, TimeUnit, TimestampMicrosecondType};
use datafusion::physical_expr::expressions::Column;
use eddy_common::{ChangeBatch, ObjectId};
use proptest::prelude::*;

use crate::plan::Node;

const SECOND: i64 = 1_000_000;
const SOURCE: ObjectId = ObjectId(1);

type Bag = BTreeMap<(i64, i32), i64>;

fn schema() -> Arc<Schema> {
    Arc::new(Schema::new(vec![
        Field::new(
            "ts",
            DataType::Timestamp(TimeUnit::Microsecond, None),
            false,
        ),
        Field::new("v", DataType::Int32, false),
    ]))
}

fn plan() -> Node {
    let ts = || -> crate::plan::Expr { Arc::new(Column::new("ts", 0)) };
    Node::TemporalFilter {
        input: Box::new(Node::Source {
            object: SOURCE,
            name: "t".into(),
            schema: schema(),
        }),
        from: vec![(ts(), 0)],
        until: vec![(ts(), 60 * SECOND)],
    }
}

fn changes(rows: &[((i64, i32), i64)]) -> ChangeBatch {
    let ts = TimestampMicrosecondArray::from_iter_values(rows.iter().map(|((t, _), _)| *t));
    let v = Int32Array::from_iter_values(rows.iter().map(|((_, v), _)| *v));
    let batch = RecordBatch::try_new(schema(), vec![Arc::new(ts), Arc::new(v)]).unwrap();
    ChangeBatch::new(
        batch,
        arrow::array::Int64Array::from_iter_values(rows.iter().map(|(_, d)| *d)),
    )
}

fn accumulate(out: &mut Bag, batches: Vec<ChangeBatch>) {
    for c in batches {
        let ts = c
            .rows()
            .column(0)
            .as_primitive::<TimestampMicrosecondType>();
        let v = c.rows().column(1).as_primitive::<Int32Type>();
        for i in 0..c.len() {
            *out.entry((ts.value(i), v.value(i))).or_default() += c.diffs().value(i);
        }
    }
    out.retain(|_, n| *n != 0);
}

/// Epochs: rows written (time in seconds, value, insert or delete), then how far the clock
/// moves (seconds) before the epoch ends.
type Epochs = Vec<(Vec<(i64, i32, bool)>, i64)>;

fn epochs() -> impl Strategy<Value = Epochs> {
    let row = (0i64..240, 0i32..3, prop::bool::weighted(0.7));
    prop::collection::vec((prop::collection::vec(row, 0..6), 0i64..40), 1..14)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn the_temporal_filter_shows_exactly_the_rows_in_their_interval(epochs in epochs(), spill in any::<bool>(), restart_after in 0usize..14) {
        let spilling = spill.then(|| crate::spill::tests::Spilling::with_limit(0));
        let build = || {
            let event_time = Arc::new(crate::EventTime::new(&[]));
            let mut flow = crate::build(&plan(), &event_time, &crate::Workers::single()).unwrap();
            if let Some(s) = &spilling {
                flow.spill_to(&s.budget);
            }
            flow
        };
        let mut flow = build();
        let mut checkpoints = crate::flow::TestCheckpoints::default();
        let (mut held, mut out) = (Bag::new(), Bag::new());
        let mut now = 0i64;
        for (n, (rows, advance)) in epochs.into_iter().enumerate() {
            for (t, v, insert) in rows {
                let row = (t * SECOND, v);
                let diff = if insert {
                    1
                } else if held.get(&row).copied().unwrap_or(0) > 0 {
                    -1
                } else {
                    continue;
                };
                *held.entry(row).or_default() += diff;
                held.retain(|_, c| *c != 0);
                accumulate(&mut out, flow.push(SOURCE, &changes(&[(row, diff)])).unwrap());
            }
            now += advance * SECOND;
            accumulate(&mut out, flow.end_epoch(now).unwrap());
            let want: Bag = held
                .iter()
                .filter(|((t, _), _)| *t <= now && now < t + 60 * SECOND)
                .map(|(r, c)| (*r, *c))
                .collect();
            prop_assert_eq!(&out, &want, "at {} s", now / SECOND);
            // A checkpoint at every epoch (their changes after the first), restored from once.
            checkpoints.save(&mut flow);
            if n == restart_after {
                checkpoints.restart(&mut flow, build);
            }
        }
    }
}
