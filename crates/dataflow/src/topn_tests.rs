//! Top-N against a batch oracle: after every epoch, what the operator emitted in all equals
//! each partition's rows sorted in full (sort key, then the row's bytes, as the operator
//! breaks ties), cut at OFFSET / LIMIT or by rank — for every ranking, ASC and DESC with NULLs,
//! with and without PARTITION BY, over inputs with retractions and append-only ones, with its
//! state spilled at every batch, across a checkpoint and restart on another number of workers.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{Array, AsArray, Int32Array, RecordBatch};
use arrow::compute::SortOptions;
use arrow::datatypes::{DataType, Field, Int32Type, Schema, UInt64Type};
use arrow::row::{RowConverter, SortField};
use datafusion::physical_expr::expressions::Column;
use eddy_common::{ChangeBatch, ObjectId};
use proptest::prelude::*;

use crate::plan::{Node, Ranking};

const SOURCE: ObjectId = ObjectId(1);

/// (p, s, v), with s nullable.
type Row = (i32, Option<i32>, i32);
/// (row, rank) -> count.
type Bag = BTreeMap<(Row, u64), i64>;

fn input_schema() -> Arc<Schema> {
    Arc::new(Schema::new(vec![
        Field::new("p", DataType::Int32, false),
        Field::new("s", DataType::Int32, true),
        Field::new("v", DataType::Int32, false),
    ]))
}

#[derive(Debug, Clone, Copy)]
struct Shape {
    partitioned: bool,
    descending: bool,
    nulls_first: bool,
    offset: usize,
    limit: usize,
    rank: Option<Ranking>,
    append_only: bool,
}

impl Shape {
    fn options(&self) -> SortOptions {
        SortOptions {
            descending: self.descending,
            nulls_first: self.nulls_first,
        }
    }

    fn plan(&self) -> Node {
        let column = |name: &str, i: usize| -> crate::plan::Expr { Arc::new(Column::new(name, i)) };
        let mut fields: Vec<Field> = input_schema()
            .fields()
            .iter()
            .map(|f| f.as_ref().clone())
            .collect();
        if self.rank.is_some() {
            fields.push(Field::new("rank", DataType::UInt64, false));
        }
        Node::TopN {
            input: Box::new(Node::Source {
                object: SOURCE,
                name: "t".into(),
                schema: input_schema(),
            }),
            partition: if self.partitioned {
                vec![column("p", 0)]
            } else {
                vec![]
            },
            order: vec![(column("s", 1), self.options())],
            offset: self.offset,
            limit: self.limit,
            rank: self.rank,
            window: None,
            append_only: self.append_only,
            schema: Arc::new(Schema::new(fields)),
        }
    }

    /// What the view shows for `held`, computed from scratch.
    fn oracle(&self, held: &BTreeMap<Row, i64>) -> Bag {
        let sort = RowConverter::new(vec![SortField::new_with_options(
            DataType::Int32,
            self.options(),
        )])
        .unwrap();
        let whole = RowConverter::new(
            input_schema()
                .fields()
                .iter()
                .map(|f| SortField::new(f.data_type().clone()))
                .collect(),
        )
        .unwrap();
        let rows: Vec<(Row, i64)> = held.iter().map(|(r, c)| (*r, *c)).collect();
        let batch = batch_of(&rows);
        let sort_keys = sort.convert_columns(&[batch.column(1).clone()]).unwrap();
        let row_keys = whole.convert_columns(batch.columns()).unwrap();
        let mut by_partition: BTreeMap<i32, Vec<usize>> = BTreeMap::new();
        for (i, (row, _)) in rows.iter().enumerate() {
            by_partition
                .entry(if self.partitioned { row.0 } else { 0 })
                .or_default()
                .push(i);
        }
        let end = self.offset + self.limit;
        let mut out = Bag::new();
        for mut members in by_partition.into_values() {
            members.sort_by(|a, b| {
                sort_keys
                    .row(*a)
                    .cmp(&sort_keys.row(*b))
                    .then_with(|| row_keys.row(*a).cmp(&row_keys.row(*b)))
            });
            let (mut position, mut tie_start, mut distinct) = (0usize, 0usize, 0u64);
            let mut previous = None;
            'rows: for i in members {
                if previous != Some(sort_keys.row(i)) {
                    tie_start = position;
                    distinct += 1;
                }
                previous = Some(sort_keys.row(i));
                for _ in 0..rows[i].1 {
                    let rank = match self.rank {
                        None => 0,
                        Some(Ranking::RowNumber) => (position + 1) as u64,
                        Some(Ranking::Rank) => (tie_start + 1) as u64,
                        Some(Ranking::DenseRank) => distinct,
                    };
                    let past_end = match self.rank {
                        None | Some(Ranking::RowNumber) => position >= end,
                        Some(_) => rank > self.limit as u64,
                    };
                    if past_end {
                        break 'rows;
                    }
                    if position >= self.offset {
                        *out.entry((rows[i].0, rank)).or_default() += 1;
                    }
                    position += 1;
                }
            }
        }
        out
    }
}

fn batch_of(rows: &[(Row, i64)]) -> RecordBatch {
    RecordBatch::try_new(
        input_schema(),
        vec![
            Arc::new(Int32Array::from_iter_values(
                rows.iter().map(|((p, _, _), _)| *p),
            )),
            Arc::new(Int32Array::from_iter(rows.iter().map(|((_, s, _), _)| *s))),
            Arc::new(Int32Array::from_iter_values(
                rows.iter().map(|((_, _, v), _)| *v),
            )),
        ],
    )
    .unwrap()
}

fn accumulate(out: &mut Bag, batches: Vec<ChangeBatch>, ranked: bool) {
    for c in batches {
        let rows = c.rows();
        let p = rows.column(0).as_primitive::<Int32Type>();
        let s = rows.column(1).as_primitive::<Int32Type>();
        let v = rows.column(2).as_primitive::<Int32Type>();
        for i in 0..c.len() {
            let rank = if ranked {
                rows.column(3).as_primitive::<UInt64Type>().value(i)
            } else {
                0
            };
            let row = (p.value(i), s.is_valid(i).then(|| s.value(i)), v.value(i));
            *out.entry((row, rank)).or_default() += c.diffs().value(i);
        }
    }
    out.retain(|_, n| *n != 0);
}

fn shape() -> impl Strategy<Value = Shape> {
    (
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        0usize..3,
        1usize..4,
        prop::sample::select(vec![
            None,
            Some(Ranking::RowNumber),
            Some(Ranking::Rank),
            Some(Ranking::DenseRank),
        ]),
        any::<bool>(),
    )
        .prop_map(
            |(partitioned, descending, nulls_first, offset, limit, rank, append_only)| Shape {
                partitioned,
                descending,
                nulls_first,
                // Ranking filters by rank alone (`rank <= n`), with no offset.
                offset: if rank.is_some() { 0 } else { offset },
                limit,
                rank,
                append_only,
            },
        )
}

/// Epochs of writes: (p, s, v, insert or delete).
type Epochs = Vec<Vec<(i32, Option<i32>, i32, bool)>>;

fn epochs() -> impl Strategy<Value = Epochs> {
    let write = (
        0i32..3,
        proptest::option::weighted(0.85, 0i32..5),
        0i32..3,
        prop::bool::weighted(0.7),
    );
    prop::collection::vec(prop::collection::vec(write, 1..7), 1..10)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn top_n_matches_its_batch_oracle(shape in shape(), epochs in epochs(), spill in any::<bool>(), workers in prop::sample::select(vec![1usize, 2]), restored_on in 1usize..3, restart_after in 0usize..10) {
        let spilling = spill.then(|| crate::spill::tests::Spilling::with_limit(0));
        let workers = [crate::Workers::new(workers).unwrap(), crate::Workers::new(restored_on).unwrap()];
        let build = |w: &crate::Workers| {
            let mut flow = crate::build(&shape.plan(), &Arc::new(crate::EventTime::new(&[])), w).unwrap();
            if let Some(s) = &spilling {
                flow.spill_to(&s.budget);
            }
            flow
        };
        let mut flow = build(&workers[0]);
        let mut checkpoints = crate::flow::TestCheckpoints::default();
        let (mut held, mut out) = (BTreeMap::<Row, i64>::new(), Bag::new());
        for (n, epoch) in epochs.into_iter().enumerate() {
            for (p, s, v, insert) in epoch {
                let row = (p, s, v);
                let diff = if insert {
                    1
                } else if !shape.append_only && held.get(&row).copied().unwrap_or(0) > 0 {
                    -1
                } else {
                    continue;
                };
                *held.entry(row).or_default() += diff;
                held.retain(|_, c| *c != 0);
                let changes = ChangeBatch::new(batch_of(&[(row, diff)]), arrow::array::Int64Array::from(vec![diff]));
                accumulate(&mut out, flow.push(SOURCE, &changes).unwrap(), shape.rank.is_some());
            }
            accumulate(&mut out, flow.end_epoch(0).unwrap(), shape.rank.is_some());
            prop_assert_eq!(&out, &shape.oracle(&held), "{:?} after epoch {}", shape, n);
            // A checkpoint at every epoch (their changes after the first), restored from once.
            checkpoints.save(&mut flow);
            if n == restart_after {
                checkpoints.restart(&mut flow, || build(&workers[1]));
            }
        }
    }
}
