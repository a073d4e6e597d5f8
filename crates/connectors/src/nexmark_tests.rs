//! The Nexmark generator against the standard: proportions and ids, event time by the rate,
//! splits and positions that do not change the events, tables declaring some of the columns.

use super::*;
use arrow::array::{AsArray, Int64Array};
use arrow::datatypes::{Int64Type, Schema, TimestampMicrosecondType};

fn config(kind: EventKind, splits: u32) -> NexmarkConfig {
    NexmarkConfig {
        kind,
        seed: 7,
        event_rate: 10_000,
        event_num: Some(10_000),
        base_time_ms: 0,
        splits,
    }
}

fn all(kind: EventKind, splits: u32) -> Vec<RecordBatch> {
    let schema = Arc::new(Schema::new(standard_fields(kind)));
    (0..splits)
        .map(|s| {
            let g = NexmarkGenerator::new(config(kind, splits), Arc::clone(&schema), s).unwrap();
            let end = g.end().unwrap();
            g.generate(0, end).unwrap().0
        })
        .collect()
}

fn ints(batches: &[RecordBatch], column: &str) -> Vec<i64> {
    let mut out: Vec<i64> = batches
        .iter()
        .flat_map(|b| {
            b.column_by_name(column)
                .unwrap()
                .as_primitive::<Int64Type>()
                .values()
                .to_vec()
        })
        .collect();
    out.sort();
    out
}

#[test]
fn proportions_and_ids_follow_the_standard() {
    let people = all(EventKind::Person, 1);
    let auctions = all(EventKind::Auction, 1);
    let bids = all(EventKind::Bid, 1);
    let count = |b: &[RecordBatch]| b.iter().map(RecordBatch::num_rows).sum::<usize>();
    assert_eq!(
        (count(&people), count(&auctions), count(&bids)),
        (200, 600, 9200)
    );
    assert_eq!(ints(&people, "id"), (1000..1200).collect::<Vec<_>>());
    assert_eq!(ints(&auctions, "id"), (1000..1600).collect::<Vec<_>>());
    let categories = ints(&auctions, "category");
    assert!(categories.iter().all(|c| (10..15).contains(c)));
    // Sellers and bidders are people that exist (or a few ahead), auctions too.
    assert!(
        ints(&auctions, "seller")
            .iter()
            .all(|s| (1000..1210).contains(s))
    );
    assert!(
        ints(&bids, "bidder")
            .iter()
            .all(|b| (1000..1210).contains(b))
    );
    assert!(
        ints(&bids, "auction")
            .iter()
            .all(|a| (1000..1600).contains(a))
    );
    // Hot auctions: about half the bids go to the first of the last 100 auctions.
    let hot = ints(&bids, "auction")
        .iter()
        .filter(|a| (**a - 1000) % 100 == 0)
        .count();
    assert!((4000..5500).contains(&hot), "{hot}");
    let prices = ints(&bids, "price");
    assert!(prices[0] >= 100 && *prices.last().unwrap() <= 100_000_000);
}

#[test]
fn event_time_advances_with_the_rate_not_the_clock() {
    let bids = all(EventKind::Bid, 1);
    let times: Vec<i64> = bids
        .iter()
        .flat_map(|b| {
            b.column_by_name("date_time")
                .unwrap()
                .as_primitive::<TimestampMicrosecondType>()
                .values()
                .to_vec()
        })
        .collect();
    // 10 000 events per second: event 9999 is at 999.9 ms, truncated to ms.
    assert_eq!(*times.last().unwrap(), 999_000);
    assert!(times.windows(2).all(|w| w[0] <= w[1]));
    // Sizes average the standard ones.
    let extra: usize = bids
        .iter()
        .map(|b| {
            b.column_by_name("extra")
                .unwrap()
                .as_string::<i32>()
                .values()
                .len()
        })
        .sum();
    let average = extra as f64 / 9200.0 + 32.0;
    assert!((95.0..105.0).contains(&average), "{average}");
}

#[test]
fn splits_and_positions_do_not_change_the_events() {
    // The same events whether generated in one piece, in four partitions, or resumed.
    let one = all(EventKind::Bid, 1);
    let four = all(EventKind::Bid, 4);
    for column in ["auction", "bidder", "price"] {
        assert_eq!(ints(&one, column), ints(&four, column));
    }
    let schema = Arc::new(Schema::new(standard_fields(EventKind::Bid)));
    let g = NexmarkGenerator::new(config(EventKind::Bid, 1), schema, 0).unwrap();
    let (first, next) = g.generate(0, 5000).unwrap();
    let (second, end) = g.generate(next, 100_000).unwrap();
    assert_eq!((next, end), (5000, 10_000));
    assert_eq!(ints(&[first, second], "price"), ints(&one, "price"));
    assert_eq!(g.generate(end, 10).unwrap().0.num_rows(), 0);
}

#[test]
fn a_table_may_declare_some_of_the_columns_in_any_order() {
    let schema = Arc::new(Schema::new(vec![
        Field::new("price", DataType::Int64, true),
        Field::new("auction", DataType::Int64, true),
    ]));
    let g = NexmarkGenerator::new(config(EventKind::Bid, 1), schema, 0).unwrap();
    let (batch, _) = g.generate(0, 100).unwrap();
    assert_eq!(batch.num_columns(), 2);
    assert_eq!(batch.num_rows(), 92);
    let prices = batch
        .column(0)
        .as_any()
        .downcast_ref::<Int64Array>()
        .unwrap();
    assert_eq!(prices.len(), 92);
    let wrong = Arc::new(Schema::new(vec![Field::new(
        "price",
        DataType::Int32,
        true,
    )]));
    assert_eq!(
        NexmarkGenerator::new(config(EventKind::Bid, 1), wrong, 0)
            .err()
            .unwrap()
            .state,
        SqlState::DATATYPE_MISMATCH
    );
    let unknown = Arc::new(Schema::new(vec![Field::new("nope", DataType::Int64, true)]));
    assert!(NexmarkGenerator::new(config(EventKind::Bid, 1), unknown, 0).is_err());
}
