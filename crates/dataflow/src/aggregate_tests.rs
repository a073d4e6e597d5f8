//! Oracle test for the aggregate: random inserts and deletions (NULL keys and values,
//! duplicates), accumulated output compared after each epoch with GROUP BY recomputed from
//! scratch — count, sum, min and max (retracting the current extreme), count(DISTINCT), and a
//! global aggregate that keeps its row at count 0; rows pushed one by one or an epoch per
//! batch, and insert-only inputs (min / max keep one value then); restarted from a
//! checkpoint of its state after some epoch.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use arrow::array::{Array, AsArray, Int32Array, Int64Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Int32Type, Int64Type, Schema, SchemaRef};
use datafusion::functions_aggregate::{
    count::count_udaf,
    min_max::{max_udaf, min_udaf},
    sum::sum_udaf,
};
use datafusion::physical_expr::aggregate::AggregateExprBuilder;
use datafusion::physical_expr::expressions::Column;
use eddy_common::{ChangeBatch, ObjectId};
use proptest::prelude::*;

use crate::plan::{AggregateCall, Expr, Node};

pub(crate) type Row = Vec<Option<i64>>;

pub(crate) fn input() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int32, true),
        Field::new("v", DataType::Int64, true),
    ]))
}

fn plan(grouped: bool, append_only: bool) -> Node {
    let s = input();
    let v: Expr = Arc::new(Column::new("v", 1));
    let call = |udf, distinct: bool, name: &str| {
        let mut b = AggregateExprBuilder::new(udf, vec![Arc::clone(&v)])
            .schema(Arc::clone(&s))
            .alias(name);
        if distinct {
            b = b.distinct();
        }
        AggregateCall {
            function: Arc::new(b.build().unwrap()),
            filter: None,
        }
    };
    let aggregates = vec![
        call(count_udaf(), false, "c"),
        call(sum_udaf(), false, "s"),
        call(min_udaf(), false, "lo"),
        call(max_udaf(), false, "hi"),
        call(count_udaf(), true, "d"),
    ];
    let mut fields = Vec::new();
    if grouped {
        fields.push(Field::new("k", DataType::Int32, true));
    }
    for (name, t) in [
        ("c", DataType::Int64),
        ("s", DataType::Int64),
        ("lo", DataType::Int64),
        ("hi", DataType::Int64),
        ("d", DataType::Int64),
    ] {
        fields.push(Field::new(name, t, true));
    }
    Node::Aggregate {
        input: Box::new(Node::Source {
            object: ObjectId(1),
            name: "t".into(),
            schema: Arc::clone(&s),
        }),
        group: if grouped {
            vec![Arc::new(Column::new("k", 0)) as Expr]
        } else {
            Vec::new()
        },
        aggregates,
        window: None,
        append_only,
        schema: Arc::new(Schema::new(fields)),
    }
}

fn oracle(grouped: bool, rows: &HashMap<(Option<i32>, Option<i32>), i64>) -> BTreeMap<Row, i64> {
    let mut groups: BTreeMap<Option<i32>, Vec<(Option<i32>, i64)>> = BTreeMap::new();
    if !grouped {
        groups.insert(None, Vec::new());
    }
    for ((k, v), n) in rows {
        groups
            .entry(if grouped { *k } else { None })
            .or_default()
            .push((*v, *n));
    }
    let mut out = BTreeMap::new();
    for (k, members) in groups {
        let values: Vec<i64> = members
            .iter()
            .filter_map(|(v, n)| v.map(|v| std::iter::repeat_n(i64::from(v), *n as usize)))
            .flatten()
            .collect();
        let mut distinct = values.clone();
        distinct.sort();
        distinct.dedup();
        let mut row = Vec::new();
        if grouped {
            row.push(k.map(i64::from));
        }
        row.push(Some(values.len() as i64));
        row.push(if values.is_empty() {
            None
        } else {
            Some(values.iter().sum())
        });
        row.push(values.iter().min().copied());
        row.push(values.iter().max().copied());
        row.push(Some(distinct.len() as i64));
        out.insert(row, 1);
    }
    out
}

pub(crate) fn accumulate(out: &mut BTreeMap<Row, i64>, batches: Vec<ChangeBatch>) {
    for b in batches {
        for i in 0..b.len() {
            let row: Row = b
                .rows()
                .columns()
                .iter()
                .map(|c| {
                    if c.is_null(i) {
                        None
                    } else if let Some(c) = c.as_primitive_opt::<Int64Type>() {
                        Some(c.value(i))
                    } else {
                        Some(i64::from(c.as_primitive::<Int32Type>().value(i)))
                    }
                })
                .collect();
            *out.entry(row.clone()).or_default() += b.diffs().value(i);
            if out[&row] == 0 {
                out.remove(&row);
            }
        }
    }
}

/// Pushes rows (key, value, weight) as one batch.
pub(crate) fn push(
    op: &mut crate::Dataflow,
    out: &mut BTreeMap<Row, i64>,
    rows: Vec<(Option<i32>, Option<i64>, i64)>,
) {
    if rows.is_empty() {
        return;
    }
    let keys = Int32Array::from_iter(rows.iter().map(|r| r.0));
    let values = Int64Array::from_iter(rows.iter().map(|r| r.1));
    let diffs = Int64Array::from_iter_values(rows.iter().map(|r| r.2));
    let batch = RecordBatch::try_new(input(), vec![Arc::new(keys), Arc::new(values)]).unwrap();
    accumulate(
        out,
        op.push(ObjectId(1), &ChangeBatch::new(batch, diffs))
            .unwrap(),
    );
}

pub(crate) fn value() -> impl Strategy<Value = Option<i32>> {
    prop_oneof![1 => Just(None), 5 => (0..4i32).prop_map(Some)]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn aggregate_matches_group_by_from_scratch(
        epochs in prop::collection::vec(prop::collection::vec((value(), value(), prop::bool::weighted(0.65)), 1..8), 1..8),
        grouped in any::<bool>(),
        append_only in any::<bool>(),
        batched in any::<bool>(),
        workers in prop::sample::select(vec![1usize, 2, 4]), restored_on in 1usize..5,
        restart_after in 0..8usize,
        spill in any::<bool>(),
    ) {
        let (workers, restored_on) = (crate::Workers::new(workers).unwrap(), crate::Workers::new(restored_on).unwrap());
        // Spilling: a budget of no bytes, so every group without pending output goes to disk
        // whenever a batch or an epoch ends (a global aggregate's one group stays).
        let spilling = spill.then(|| crate::spill::tests::Spilling::with_limit(0));
        let build = |workers: &crate::Workers| {
            let mut flow = crate::build(&plan(grouped, append_only), &std::sync::Arc::new(crate::EventTime::new(&[])), workers).unwrap();
            if let Some(s) = &spilling {
                flow.spill_to(&s.budget);
            }
            flow
        };
        let mut op = build(&workers);
        let mut checkpoints = crate::flow::TestCheckpoints::default();
        let mut rows: HashMap<(Option<i32>, Option<i32>), i64> = HashMap::new();
        let mut out = BTreeMap::new();
        for (epoch_index, epoch) in epochs.into_iter().enumerate() {
            let mut pending: Vec<(Option<i32>, Option<i64>, i64)> = Vec::new();
            for (k, v, insert) in epoch {
                let present = rows.get(&(k, v)).copied().unwrap_or(0);
                let diff = if insert || append_only { 1 } else if present > 0 { -1 } else { continue };
                *rows.entry((k, v)).or_default() += diff;
                rows.retain(|_, n| *n != 0);
                pending.push((k, v.map(i64::from), diff));
                if !batched {
                    push(&mut op, &mut out, std::mem::take(&mut pending));
                }
            }
            push(&mut op, &mut out, pending);
            accumulate(&mut out, op.end_epoch(0).unwrap());
            prop_assert_eq!(&out, &oracle(grouped, &rows));
            if let Some(s) = &spilling {
                // An epoch without rows: the groups the last one used go to disk.
                accumulate(&mut out, op.end_epoch(0).unwrap());
                prop_assert!(!grouped || rows.is_empty() || s.budget.spilled_keys() > 0, "no group went to disk");
            }
            // A checkpoint each epoch (after the first, of the changes since the last), and
            // restarts from the chain of them.
            checkpoints.save(&mut op);
            if epoch_index == restart_after || epoch_index == restart_after + 2 {
                checkpoints.restart(&mut op, || build(&restored_on));
            }
        }
    }
}

/// Groups that changed and then went to disk between two checkpoints are read from the disk
/// by the save of those changes (off the operators' thread), and restore exactly: many groups,
/// a few touched per epoch (so each save after the first is of changes), a budget of no bytes
/// (every group an epoch did not use spills), restarts from the chain.
#[test]
fn saves_of_changes_read_the_groups_that_went_to_disk() {
    let spilling = crate::spill::tests::Spilling::with_limit(0);
    let build = || {
        let mut flow = crate::build(
            &plan(true, false),
            &Arc::new(crate::EventTime::new(&[])),
            &crate::Workers::single(),
        )
        .unwrap();
        flow.spill_to(&spilling.budget);
        flow
    };
    let mut flow = build();
    let mut checkpoints = crate::flow::TestCheckpoints::default();
    let mut rows = HashMap::new();
    let mut out = BTreeMap::new();
    type Held = HashMap<(Option<i32>, Option<i32>), i64>;
    fn write(
        flow: &mut crate::Dataflow,
        out: &mut BTreeMap<Row, i64>,
        rows: &mut Held,
        batch: &[(i32, i32, i64)],
    ) {
        for &(k, v, d) in batch {
            *rows.entry((Some(k), Some(v))).or_default() += d;
        }
        rows.retain(|_, n| *n != 0);
        let batch = batch
            .iter()
            .map(|&(k, v, d)| (Some(k), Some(i64::from(v)), d))
            .collect();
        push(flow, out, batch);
        accumulate(out, flow.end_epoch(0).unwrap());
        assert_eq!(*out, oracle(true, rows));
    }
    write(
        &mut flow,
        &mut out,
        &mut rows,
        &(0..300).map(|k| (k, k % 7, 1)).collect::<Vec<_>>(),
    );
    // An epoch without rows: the groups the first one used go to disk.
    accumulate(&mut out, flow.end_epoch(0).unwrap());
    checkpoints.save(&mut flow);
    assert_eq!(
        spilling.budget.spilled_keys(),
        300,
        "every group went to disk"
    );
    for epoch in 0..8 {
        // Two groups change, one of them to nothing (a removal), one is new. A save every
        // other epoch: the groups the first changed went to disk during the second.
        let k = epoch * 11;
        write(
            &mut flow,
            &mut out,
            &mut rows,
            &[(k, 100 + k, 1), (k + 1, (k + 1) % 7, -1), (1000 + k, 1, 1)],
        );
        if epoch % 2 == 0 {
            continue;
        }
        checkpoints.save(&mut flow);
        assert!(checkpoints.changed_rows() > 0, "no save was of changes");
        if epoch % 4 == 3 {
            checkpoints.restart(&mut flow, build);
            // Every group is touched after the restart: a stale or missing one shows.
            let all: Vec<(i32, i32, i64)> = rows.keys().map(|&(k, _)| (k.unwrap(), 5, 1)).collect();
            write(&mut flow, &mut out, &mut rows, &all);
            checkpoints.save(&mut flow);
        }
    }
}

/// `GROUP BY k, v` and `GROUP BY v, k` of the same input (as q5's two HOP counts) run as one
/// aggregate: the second reads the first through a projection that reorders its columns.
#[test]
fn an_aggregate_grouped_in_another_order_is_computed_once() {
    let s = input();
    let count = || AggregateCall {
        function: Arc::new(
            AggregateExprBuilder::new(count_udaf(), vec![Arc::new(Column::new("v", 1)) as Expr])
                .schema(Arc::clone(&s))
                .alias("c")
                .build()
                .unwrap(),
        ),
        filter: None,
    };
    let source = || {
        Box::new(Node::Source {
            object: ObjectId(1),
            name: "t".into(),
            schema: Arc::clone(&s),
        })
    };
    let field = |name: &str, t: DataType| Field::new(name, t, true);
    let (k, v, c) = (
        field("k", DataType::Int32),
        field("v", DataType::Int64),
        field("c", DataType::Int64),
    );
    let kvc = Arc::new(Schema::new(vec![k.clone(), v.clone(), c.clone()]));
    let col = |name: &str, i: usize| Arc::new(Column::new(name, i)) as Expr;
    let by_k_v = Node::Aggregate {
        input: source(),
        group: vec![col("k", 0), col("v", 1)],
        aggregates: vec![count()],
        window: None,
        append_only: false,
        schema: Arc::clone(&kvc),
    };
    let by_v_k = Node::Project {
        input: Box::new(Node::Aggregate {
            input: source(),
            group: vec![col("v", 1), col("k", 0)],
            aggregates: vec![count()],
            window: None,
            append_only: false,
            schema: Arc::new(Schema::new(vec![v, k, c])),
        }),
        exprs: vec![col("k", 1), col("v", 0), col("c", 2)],
        schema: Arc::clone(&kvc),
    };
    let plan = Node::Union {
        inputs: vec![by_k_v, by_v_k],
        schema: kvc,
    };
    let mut flow = crate::build(
        &plan,
        &Arc::new(crate::EventTime::new(&[])),
        &crate::Workers::single(),
    )
    .unwrap();
    let names: Vec<String> = flow.stats().into_iter().map(|s| s.name).collect();
    assert_eq!(
        names.iter().filter(|n| n.starts_with("Aggregate")).count(),
        1,
        "{names:?}"
    );
    let batch = RecordBatch::try_new(
        input(),
        vec![
            Arc::new(Int32Array::from(vec![1, 1, 2, 2])),
            Arc::new(Int64Array::from(vec![10, 10, 20, 30])),
        ],
    )
    .unwrap();
    let mut out = BTreeMap::new();
    accumulate(
        &mut out,
        flow.push(ObjectId(1), &ChangeBatch::inserts(batch))
            .unwrap(),
    );
    accumulate(&mut out, flow.end_epoch(0).unwrap());
    let row = |k: i64, v: i64, n: i64| vec![Some(k), Some(v), Some(n)];
    assert_eq!(
        out,
        BTreeMap::from([(row(1, 10, 2), 2), (row(2, 20, 1), 2), (row(2, 30, 1), 2)]),
        "each group from both readers"
    );
}
