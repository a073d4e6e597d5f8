//! Routing at the sources: an aggregate grouped by (a column computed per branch, k) over the
//! union of two projections of one source — a HOP's shape — routes the source's rows by `k`
//! on 2 and 4 workers, and answers exactly as on one worker after every epoch of random
//! inserts and deletions, also after a restart from its checkpoint on another number of
//! workers (the state re-sharded by `k`).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema};
use datafusion::common::ScalarValue;
use datafusion::functions_aggregate::{count::count_udaf, sum::sum_udaf};
use datafusion::physical_expr::aggregate::AggregateExprBuilder;
use datafusion::physical_expr::expressions::{Column, Literal};
use eddy_common::ObjectId;
use proptest::prelude::*;

use crate::aggregate_tests::{accumulate, input, push, value};
use crate::plan::{AggregateCall, Expr, Node};

/// `SELECT v, k, count(v), sum(v) FROM (SELECT k, v FROM t UNION ALL SELECT k, 7 FROM t)
/// GROUP BY v, k`.
fn hop_like() -> Node {
    let s = input();
    let col = |name: &str, i: usize| Arc::new(Column::new(name, i)) as Expr;
    let source = || {
        Box::new(Node::Source {
            object: ObjectId(1),
            name: "t".into(),
            schema: Arc::clone(&s),
        })
    };
    let seven: Expr = Arc::new(Literal::new(ScalarValue::Int64(Some(7))));
    let branch = |v: Expr| Node::Project {
        input: source(),
        exprs: vec![col("k", 0), v],
        schema: Arc::clone(&s),
    };
    let call = |udf, name: &str| AggregateCall {
        function: Arc::new(
            AggregateExprBuilder::new(udf, vec![col("v", 1)])
                .schema(Arc::clone(&s))
                .alias(name)
                .build()
                .unwrap(),
        ),
        filter: None,
    };
    Node::Aggregate {
        input: Box::new(Node::Union {
            inputs: vec![branch(col("v", 1)), branch(seven)],
            schema: Arc::clone(&s),
        }),
        group: vec![col("v", 1), col("k", 0)],
        aggregates: vec![call(count_udaf(), "c"), call(sum_udaf(), "s")],
        window: None,
        append_only: false,
        schema: Arc::new(Schema::new(vec![
            Field::new("v", DataType::Int64, true),
            Field::new("k", DataType::Int32, true),
            Field::new("c", DataType::Int64, true),
            Field::new("s", DataType::Int64, true),
        ])),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn routing_at_the_sources_answers_as_one_worker(
        epochs in prop::collection::vec(prop::collection::vec((value(), value(), prop::bool::weighted(0.65)), 1..10), 1..7),
        workers in prop::sample::select(vec![2usize, 4]), restored_on in 1usize..5,
        restart_after in 0..7usize,
    ) {
        let plan = hop_like();
        let build = |n: usize| crate::build(&plan, &Arc::new(crate::EventTime::new(&[])), &crate::Workers::new(n).unwrap()).unwrap();
        let mut one = build(1);
        let mut many = build(workers);
        prop_assert_eq!(many.routed_at_sources(), 1, "the source is routed by k");
        let mut rows: HashMap<(Option<i32>, Option<i32>), i64> = HashMap::new();
        let (mut want, mut got) = (BTreeMap::new(), BTreeMap::new());
        for (epoch_index, epoch) in epochs.into_iter().enumerate() {
            let mut pending = Vec::new();
            for (k, v, insert) in epoch {
                let present = rows.get(&(k, v)).copied().unwrap_or(0);
                let diff = if insert { 1 } else if present > 0 { -1 } else { continue };
                *rows.entry((k, v)).or_default() += diff;
                rows.retain(|_, n| *n != 0);
                pending.push((k, v.map(i64::from), diff));
            }
            push(&mut one, &mut want, pending.clone());
            push(&mut many, &mut got, pending);
            accumulate(&mut want, one.end_epoch(0).unwrap());
            accumulate(&mut got, many.end_epoch(0).unwrap());
            prop_assert_eq!(&got, &want);
            if epoch_index == restart_after {
                crate::flow::restart(&mut many, || build(restored_on));
            }
        }
    }
}
