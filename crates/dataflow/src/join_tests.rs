//! Oracle tests for every join kind: random insertions and deletions on both sides (NULL keys,
//! duplicates, a residual filter), the accumulated output compared after every epoch with the
//! join recomputed from scratch by nested loops. Keys are of every type Eddy stores that has
//! three distinct values (integer, text with non-ASCII, numeric, double with NaN, timestamp,
//! date, bytea, interval): the oracle works on the values' indexes, the join on the values.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Int32Array, Int64Array, RecordBatch};
use arrow::datatypes::{
    DataType, Field, Int32Type, IntervalMonthDayNano, IntervalUnit, Schema, SchemaRef, TimeUnit,
};
use datafusion::common::ScalarValue;
use datafusion::logical_expr::Operator as BinaryOp;
use datafusion::physical_expr::expressions::{BinaryExpr, Column};
use eddy_common::{ChangeBatch, ObjectId};
use proptest::prelude::*;

use crate::plan::{Expr, JoinKind, Node};

type Row = Vec<Option<i32>>;
type Bag = HashMap<Row, i64>;

const LEFT: ObjectId = ObjectId(1);
const RIGHT: ObjectId = ObjectId(2);

/// The type of the join key (column 0 of each side); the values of the rows are indexes 0..3
/// into its pool of three distinct values.
#[derive(Debug, Clone, Copy)]
enum KeyType {
    Int,
    Text,
    Numeric,
    Double,
    Timestamp,
    Date,
    Bytea,
    Interval,
}

const KEY_TYPES: [KeyType; 8] = [
    KeyType::Int,
    KeyType::Text,
    KeyType::Numeric,
    KeyType::Double,
    KeyType::Timestamp,
    KeyType::Date,
    KeyType::Bytea,
    KeyType::Interval,
];

impl KeyType {
    fn data_type(self) -> DataType {
        match self {
            KeyType::Int => DataType::Int32,
            KeyType::Text => DataType::Utf8,
            KeyType::Numeric => DataType::Decimal128(20, 4),
            KeyType::Double => DataType::Float64,
            KeyType::Timestamp => DataType::Timestamp(TimeUnit::Microsecond, None),
            KeyType::Date => DataType::Date32,
            KeyType::Bytea => DataType::Binary,
            KeyType::Interval => DataType::Interval(IntervalUnit::MonthDayNano),
        }
    }

    /// The key column for these indexes.
    fn array(self, indexes: &[Option<i32>]) -> ArrayRef {
        use arrow::array::*;
        let at = |i: &Option<i32>| i.map(|i| i as usize);
        match self {
            KeyType::Int => Arc::new(Int32Array::from(indexes.to_vec())),
            KeyType::Text => Arc::new(StringArray::from_iter(
                indexes
                    .iter()
                    .map(|i| at(i).map(|i| ["", "é", "日本語"][i])),
            )),
            KeyType::Numeric => Arc::new(
                Decimal128Array::from_iter(
                    indexes
                        .iter()
                        .map(|i| at(i).map(|i| [-15_000i128, 0, 999_999_999][i])),
                )
                .with_precision_and_scale(20, 4)
                .unwrap(),
            ),
            KeyType::Double => Arc::new(Float64Array::from_iter(
                indexes
                    .iter()
                    .map(|i| at(i).map(|i| [f64::NAN, -1.5, 1e300][i])),
            )),
            KeyType::Timestamp => Arc::new(TimestampMicrosecondArray::from_iter(
                indexes
                    .iter()
                    .map(|i| at(i).map(|i| [-1i64, 0, 1_700_000_000_000_000][i])),
            )),
            KeyType::Date => Arc::new(Date32Array::from_iter(
                indexes
                    .iter()
                    .map(|i| at(i).map(|i| [-719_162, 0, 20_000][i])),
            )),
            KeyType::Bytea => Arc::new(BinaryArray::from_iter(
                indexes
                    .iter()
                    .map(|i| at(i).map(|i| [&b""[..], b"\x00", b"\xff\x00"][i])),
            )),
            KeyType::Interval => Arc::new(IntervalMonthDayNanoArray::from_iter(
                indexes.iter().map(|i| {
                    at(i).map(|i| {
                        [
                            IntervalMonthDayNano::new(0, 0, 0),
                            IntervalMonthDayNano::new(0, 1, 0),
                            IntervalMonthDayNano::new(0, 0, 7_200_000_000_000),
                        ][i]
                    })
                }),
            )),
        }
    }

    /// The index of the key value at row `i` of `column`.
    fn index(self, column: &dyn Array, i: usize) -> Option<i32> {
        if column.is_null(i) {
            return None;
        }
        let value = ScalarValue::try_from_array(column, i).unwrap();
        let pool = self.array(&[Some(0), Some(1), Some(2)]);
        (0..3)
            .find(|&k| ScalarValue::try_from_array(&pool, k).unwrap() == value)
            .map(|k| k as i32)
    }
}

fn schema(a: &str, b: &str) -> SchemaRef {
    typed_schema(a, b, KeyType::Int)
}

fn typed_schema(a: &str, b: &str, key: KeyType) -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new(a, key.data_type(), true),
        Field::new(b, DataType::Int32, true),
    ]))
}

fn column(name: &str, index: usize) -> Expr {
    Arc::new(Column::new(name, index))
}

fn plan(kind: JoinKind, filtered: bool, nulls_equal: bool, key: KeyType) -> Node {
    let (ls, rs) = (typed_schema("k", "a", key), typed_schema("k2", "b", key));
    let both: Vec<Field> = ls
        .fields()
        .iter()
        .chain(rs.fields().iter())
        .map(|f| f.as_ref().clone())
        .collect();
    let out = match kind {
        JoinKind::LeftSemi | JoinKind::LeftAnti => ls.clone(),
        JoinKind::RightSemi | JoinKind::RightAnti => rs.clone(),
        _ => Arc::new(Schema::new(both)),
    };
    let filter = filtered.then(|| {
        Arc::new(BinaryExpr::new(
            column("a", 1),
            BinaryOp::LtEq,
            column("b", 3),
        )) as Expr
    });
    Node::Join {
        kind,
        left: Box::new(Node::Source {
            object: LEFT,
            name: "l".into(),
            schema: ls,
        }),
        right: Box::new(Node::Source {
            object: RIGHT,
            name: "r".into(),
            schema: rs,
        }),
        left_keys: vec![column("k", 0)],
        right_keys: vec![column("k2", 0)],
        filter,
        nulls_equal,
        bounds: None,
        lookup: false,
        schema: out,
    }
}

fn batch(rows: &[(Row, i64)], key: KeyType) -> ChangeBatch {
    let s = typed_schema("x", "y", key);
    let a = key.array(&rows.iter().map(|r| r.0[0]).collect::<Vec<_>>());
    let b = Int32Array::from(rows.iter().map(|r| r.0[1]).collect::<Vec<_>>());
    let rb = RecordBatch::try_new(s, vec![a, Arc::new(b)]).unwrap();
    ChangeBatch::new(
        rb,
        Int64Array::from(rows.iter().map(|r| r.1).collect::<Vec<_>>()),
    )
}

fn accumulate(out: &mut Bag, batches: Vec<ChangeBatch>, key: KeyType) {
    for b in batches {
        for i in 0..b.len() {
            let row: Row = b
                .rows()
                .columns()
                .iter()
                .map(|c| {
                    if c.data_type() != &DataType::Int32 {
                        return key.index(c.as_ref(), i);
                    }
                    let c = c.as_primitive::<Int32Type>();
                    if c.is_null(i) { None } else { Some(c.value(i)) }
                })
                .collect();
            *out.entry(row.clone()).or_default() += b.diffs().value(i);
            if out[&row] == 0 {
                out.remove(&row);
            }
        }
    }
}

fn oracle(kind: JoinKind, filtered: bool, nulls_equal: bool, left: &Bag, right: &Bag) -> Bag {
    let matches = |l: &Row, r: &Row| {
        (nulls_equal || l[0].is_some())
            && l[0] == r[0]
            && (!filtered || matches!((l[1], r[1]), (Some(a), Some(b)) if a <= b))
    };
    let mut out = Bag::new();
    let mut add = |row: Row, n: i64| *out.entry(row).or_default() += n;
    for (l, cl) in left {
        let hits: Vec<_> = right.iter().filter(|(r, _)| matches(l, r)).collect();
        for (r, cr) in &hits {
            if matches!(
                kind,
                JoinKind::Inner | JoinKind::Left | JoinKind::Right | JoinKind::Full
            ) {
                add([l.clone(), (*r).clone()].concat(), cl * *cr);
            }
        }
        match kind {
            JoinKind::Left | JoinKind::Full if hits.is_empty() => {
                add(vec![l[0], l[1], None, None], *cl)
            }
            JoinKind::LeftSemi if !hits.is_empty() => add(l.clone(), *cl),
            JoinKind::LeftAnti if hits.is_empty() => add(l.clone(), *cl),
            _ => {}
        }
    }
    for (r, cr) in right {
        let hit = left.keys().any(|l| matches(l, r));
        match kind {
            JoinKind::Right | JoinKind::Full if !hit => add(vec![None, None, r[0], r[1]], *cr),
            JoinKind::RightSemi if hit => add(r.clone(), *cr),
            JoinKind::RightAnti if !hit => add(r.clone(), *cr),
            _ => {}
        }
    }
    out.retain(|_, n| *n != 0);
    out
}

fn value() -> impl Strategy<Value = Option<i32>> {
    prop_oneof![1 => Just(None), 5 => (0..3i32).prop_map(Some)]
}

/// (left side?, row, insert?) — deletions remove a present copy when there is one.
fn steps() -> impl Strategy<Value = Vec<Vec<(bool, Row, bool)>>> {
    let step = (
        any::<bool>(),
        (value(), value()).prop_map(|(a, b)| vec![a, b]),
        prop::bool::weighted(0.7),
    );
    prop::collection::vec(prop::collection::vec(step, 1..6), 1..8)
}

#[allow(clippy::too_many_arguments)]
fn run(
    kind: JoinKind,
    filtered: bool,
    nulls_equal: bool,
    key: KeyType,
    workers: &[crate::Workers; 2],
    epochs: Vec<Vec<(bool, Row, bool)>>,
    restart_after: usize,
    spill: Option<&crate::spill::tests::Spilling>,
) -> Result<(), TestCaseError> {
    let build = |workers: &crate::Workers| {
        let mut dataflow = crate::build(
            &plan(kind, filtered, nulls_equal, key),
            &std::sync::Arc::new(crate::EventTime::new(&[])),
            workers,
        )
        .unwrap();
        if let Some(spill) = spill {
            dataflow.spill_to(&spill.budget);
        }
        dataflow
    };
    drive(
        &build,
        workers,
        restart_after,
        key,
        epochs,
        |left, right| oracle(kind, filtered, nulls_equal, left, right),
    )
    .map_err(|e| TestCaseError::fail(format!("{kind:?} {key:?} filtered={filtered}: {e}")))
}

/// Applies the epochs' steps to the join `build` makes (deletions remove a present copy),
/// comparing its accumulated output with `oracle` over both sides after every epoch; after
/// epoch `restart_after` the join restarts from a checkpoint of its state, on the second
/// of `workers` (another number of workers: the state is re-sharded).
fn drive(
    build: &dyn Fn(&crate::Workers) -> crate::Dataflow,
    workers: &[crate::Workers; 2],
    restart_after: usize,
    key: KeyType,
    epochs: Vec<Vec<(bool, Row, bool)>>,
    oracle: impl Fn(&Bag, &Bag) -> Bag,
) -> Result<(), TestCaseError> {
    let mut op = build(&workers[0]);
    let mut checkpoints = crate::flow::TestCheckpoints::default();
    let (mut left, mut right, mut out) = (Bag::new(), Bag::new(), Bag::new());
    for (epoch_index, epoch) in epochs.into_iter().enumerate() {
        for (is_left, row, insert) in epoch {
            let side = if is_left { &mut left } else { &mut right };
            let diff = if insert {
                1
            } else if side.get(&row).copied().unwrap_or(0) > 0 {
                -1
            } else {
                continue;
            };
            *side.entry(row.clone()).or_default() += diff;
            side.retain(|_, n| *n != 0);
            accumulate(
                &mut out,
                op.push(
                    if is_left { LEFT } else { RIGHT },
                    &batch(&[(row, diff)], key),
                )
                .unwrap(),
                key,
            );
        }
        accumulate(&mut out, op.end_epoch(0).unwrap(), key);
        prop_assert_eq!(&out, &oracle(&left, &right));
        // A checkpoint at every epoch (their changes after the first), restored from once.
        checkpoints.save(&mut op);
        if epoch_index == restart_after {
            checkpoints.restart(&mut op, || build(&workers[1]));
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn every_join_kind_matches_its_oracle(epochs in steps(), filtered in any::<bool>(), nulls_equal in any::<bool>(), workers in prop::sample::select(vec![1usize, 2, 4]), restored_on in 1usize..5, restart_after in 0..8usize, key in prop::sample::select(KEY_TYPES.to_vec()), spill in any::<bool>()) {
        // On several workers each side is routed by its key to one of the join's copies.
        let workers = [crate::Workers::new(workers).unwrap(), crate::Workers::new(restored_on).unwrap()];
        // A budget of no bytes: every key is spilled when each batch ends, and read back by
        // the next batch that uses it.
        let spill = spill.then(|| crate::spill::tests::Spilling::with_limit(0));
        for kind in [JoinKind::Inner, JoinKind::Left, JoinKind::Right, JoinKind::Full, JoinKind::LeftSemi, JoinKind::LeftAnti, JoinKind::RightSemi, JoinKind::RightAnti] {
            run(kind, filtered, nulls_equal, key, &workers, epochs.clone(), restart_after, spill.as_ref())?;
        }
        // Rows with a NULL key (unless NULLs are equal) are never held, so never spilled.
        let held = |row: &Row| nulls_equal || row[0].is_some();
        if let Some(spill) = &spill && epochs.iter().flatten().any(|(_, row, insert)| *insert && held(row)) {
            prop_assert!(spill.budget.spills() > 0, "nothing was spilled");
        }
    }
}

/// An interval join: `k = k2 AND b BETWEEN a - 1 AND a + 2`, with `a` and `b` as event times
/// (µs), so each side keeps its rows by time and probes only the matching range.
fn interval_plan() -> Node {
    use arrow::datatypes::TimeUnit;
    use datafusion::physical_expr::expressions::{CastExpr, lit};
    let (ls, rs) = (schema("k", "a"), schema("k2", "b"));
    let both: Vec<Field> = ls
        .fields()
        .iter()
        .chain(rs.fields().iter())
        .map(|f| f.as_ref().clone())
        .collect();
    let time = |name: &str, index: usize| {
        Arc::new(CastExpr::new(
            column(name, index),
            DataType::Timestamp(TimeUnit::Microsecond, None),
            None,
        )) as Expr
    };
    let offset = |name: &str, index: usize, op: BinaryOp, n: i32| {
        Arc::new(BinaryExpr::new(column(name, index), op, lit(n))) as Expr
    };
    let above = Arc::new(BinaryExpr::new(
        column("b", 3),
        BinaryOp::GtEq,
        offset("a", 1, BinaryOp::Minus, 1),
    )) as Expr;
    let below = Arc::new(BinaryExpr::new(
        column("b", 3),
        BinaryOp::LtEq,
        offset("a", 1, BinaryOp::Plus, 2),
    )) as Expr;
    // No watermark ever arrives: nothing is forgotten or dropped.
    let bound =
        |time: Expr, range: (i64, i64), own: ObjectId, other: ObjectId| crate::plan::TimeBound {
            time,
            horizon_micros: 0,
            range: Some(range),
            own: vec![own],
            other: vec![other],
            allowed_micros: 0,
            drop_late: false,
        };
    Node::Join {
        kind: JoinKind::Inner,
        left: Box::new(Node::Source {
            object: LEFT,
            name: "l".into(),
            schema: ls,
        }),
        right: Box::new(Node::Source {
            object: RIGHT,
            name: "r".into(),
            schema: rs,
        }),
        left_keys: vec![column("k", 0)],
        right_keys: vec![column("k2", 0)],
        filter: Some(Arc::new(BinaryExpr::new(above, BinaryOp::And, below))),
        nulls_equal: false,
        bounds: Some(Box::new([
            bound(time("a", 1), (-1, 2), LEFT, RIGHT),
            bound(time("b", 1), (-2, 1), RIGHT, LEFT),
        ])),
        lookup: false,
        schema: Arc::new(Schema::new(both)),
    }
}

fn interval_oracle(left: &Bag, right: &Bag) -> Bag {
    let mut out = Bag::new();
    for (l, cl) in left {
        for (r, cr) in right {
            if let (Some(k), Some(a), Some(b)) = (l[0], l[1], r[1])
                && r[0] == Some(k)
                && b >= a - 1
                && b <= a + 2
            {
                *out.entry([l.clone(), r.clone()].concat()).or_default() += cl * cr;
            }
        }
    }
    out.retain(|_, n| *n != 0);
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn interval_join_matches_its_oracle(epochs in steps(), workers in prop::sample::select(vec![1usize, 2, 4]), restored_on in 1usize..5, restart_after in 0..8usize, spill in any::<bool>()) {
        let workers = [crate::Workers::new(workers).unwrap(), crate::Workers::new(restored_on).unwrap()];
        let spill = spill.then(|| crate::spill::tests::Spilling::with_limit(0));
        let build = |workers: &crate::Workers| {
            let mut dataflow = crate::build(&interval_plan(), &std::sync::Arc::new(crate::EventTime::new(&[LEFT, RIGHT])), workers).unwrap();
            if let Some(spill) = &spill {
                dataflow.spill_to(&spill.budget);
            }
            dataflow
        };
        drive(&build, &workers, restart_after, KeyType::Int, epochs, interval_oracle)?;
    }
}

/// [`plan`] joining the left table with itself: the two sources are one shared node, whose
/// every batch reaches the join on both inputs (left first).
fn self_join_plan(kind: JoinKind, filtered: bool, nulls_equal: bool, key: KeyType) -> Node {
    let mut node = plan(kind, filtered, nulls_equal, key);
    if let Node::Join { left, right, .. } = &mut node {
        *right = left.clone();
    }
    node
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn a_self_join_over_a_shared_source_matches_its_oracle(epochs in steps(), filtered in any::<bool>(), nulls_equal in any::<bool>(), workers in prop::sample::select(vec![1usize, 2, 4]), restored_on in 1usize..5, restart_after in 0..8usize, key in prop::sample::select(KEY_TYPES.to_vec())) {
        let workers = [crate::Workers::new(workers).unwrap(), crate::Workers::new(restored_on).unwrap()];
        let epochs: Vec<Vec<(bool, Row, bool)>> = epochs.into_iter().map(|e| e.into_iter().map(|(_, row, insert)| (true, row, insert)).collect()).collect();
        for kind in [JoinKind::Inner, JoinKind::Left, JoinKind::Full, JoinKind::LeftSemi, JoinKind::LeftAnti] {
            let node = self_join_plan(kind, filtered, nulls_equal, key);
            let build = |workers: &crate::Workers| crate::build(&node, &std::sync::Arc::new(crate::EventTime::new(&[])), workers).unwrap();
            prop_assert_eq!(build(&workers[0]).stats().len(), 2, "one source node and the join");
            drive(&build, &workers, restart_after, key, epochs.clone(), |left, _| oracle(kind, filtered, nulls_equal, left, left))
                .map_err(|e| TestCaseError::fail(format!("{kind:?} {key:?} filtered={filtered}: {e}")))?;
        }
    }
}
