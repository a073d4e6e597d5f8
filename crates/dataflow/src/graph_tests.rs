use std::sync::{Arc, Mutex};

use arrow::array::{AsArray, Int64Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Int64Type, Schema};

use super::*;

fn batch(values: &[i64]) -> ChangeBatch {
    let schema = Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, false)]));
    let rows = RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(values.to_vec()))])
        .unwrap_or_else(|e| panic!("{e}"));
    ChangeBatch::inserts(rows)
}

fn values(changes: &ChangeBatch) -> Vec<i64> {
    changes
        .rows()
        .column(0)
        .as_primitive::<Int64Type>()
        .values()
        .to_vec()
}

/// Passes data on; panics on the value 13 (a fault to isolate).
struct Pass;

impl Handler for Pass {
    fn on_data(&mut self, _input: usize, changes: ChangeBatch, out: &mut Output) -> Result<()> {
        assert!(!values(&changes).contains(&13), "unlucky row");
        out.data(changes);
        Ok(())
    }
    fn on_watermark(&mut self, _input: usize, mark: Watermark, out: &mut Output) -> Result<()> {
        out.watermark(mark);
        Ok(())
    }
    fn name(&self) -> String {
        "Pass".into()
    }
}

/// Sums what an epoch brought on all inputs and emits the sum at the barrier.
#[derive(Default)]
struct SumPerEpoch {
    sum: i64,
}

impl Handler for SumPerEpoch {
    fn on_data(&mut self, _input: usize, changes: ChangeBatch, _out: &mut Output) -> Result<()> {
        self.sum += values(&changes).iter().sum::<i64>();
        Ok(())
    }
    fn on_barrier(&mut self, _barrier: &Barrier, out: &mut Output) -> Result<()> {
        out.data(batch(&[std::mem::take(&mut self.sum)]));
        Ok(())
    }
    fn name(&self) -> String {
        "SumPerEpoch".into()
    }
}

/// What reached a sink, as text: `d:1,2` for data, `b:3` for a barrier, `w:0=5` for a mark.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<String>>>);

impl Seen {
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }
    fn push(&self, s: String) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push(s);
    }
}

struct Sink(Seen);

impl Handler for Sink {
    fn on_data(&mut self, _input: usize, changes: ChangeBatch, _out: &mut Output) -> Result<()> {
        let v: Vec<String> = values(&changes).iter().map(i64::to_string).collect();
        self.0.push(format!("d:{}", v.join(",")));
        Ok(())
    }
    fn on_watermark(&mut self, _input: usize, mark: Watermark, _out: &mut Output) -> Result<()> {
        self.0.push(format!("w:{}={}", mark.source.0, mark.value));
        Ok(())
    }
    fn on_barrier(&mut self, barrier: &Barrier, _out: &mut Output) -> Result<()> {
        self.0.push(format!("b:{}", barrier.epoch));
        Ok(())
    }
    fn name(&self) -> String {
        "Sink".into()
    }
}

fn barrier(epoch: u64) -> Message {
    Message::Barrier(Barrier {
        now_micros: 0,
        epoch,
        checkpoint: false,
    })
}

#[test]
fn a_two_input_node_aligns_barriers() {
    let mut g = Graph::new();
    let left = g.add(Box::new(Pass), 1);
    let right = g.add(Box::new(Pass), 1);
    let sum = g.add(Box::new(SumPerEpoch::default()), 2);
    let seen = Seen::default();
    let sink = g.add(Box::new(Sink(seen.clone())), 1);
    g.connect(left, sum, 0).unwrap_or_else(|e| panic!("{e}"));
    g.connect(right, sum, 1).unwrap_or_else(|e| panic!("{e}"));
    g.connect(sum, sink, 0).unwrap_or_else(|e| panic!("{e}"));

    g.send(left, 0, Message::Data(batch(&[1, 2])));
    g.send(left, 0, barrier(1));
    // Epoch 2's data on the left arrives before the right side ended epoch 1: it waits.
    g.send(left, 0, Message::Data(batch(&[100])));
    g.send(right, 0, Message::Data(batch(&[10])));
    assert_eq!(seen.take(), Vec::<String>::new());
    g.send(right, 0, barrier(1));
    assert_eq!(seen.take(), ["d:13", "b:1"]);
    g.send(left, 0, barrier(2));
    g.send(right, 0, barrier(2));
    assert_eq!(seen.take(), ["d:100", "b:2"]);
}

#[test]
fn a_held_barrier_of_the_next_epoch_aligns_in_turn() {
    let mut g = Graph::new();
    let sum = g.add(Box::new(SumPerEpoch::default()), 2);
    let seen = Seen::default();
    let sink = g.add(Box::new(Sink(seen.clone())), 1);
    g.connect(sum, sink, 0).unwrap_or_else(|e| panic!("{e}"));
    // The left input runs two epochs ahead.
    for message in [
        Message::Data(batch(&[1])),
        barrier(1),
        Message::Data(batch(&[2])),
        barrier(2),
        Message::Data(batch(&[4])),
    ] {
        g.send(sum, 0, message);
    }
    g.send(sum, 1, barrier(1));
    assert_eq!(seen.take(), ["d:1", "b:1"]);
    g.send(sum, 1, Message::Data(batch(&[8])));
    g.send(sum, 1, barrier(2));
    assert_eq!(seen.take(), ["d:10", "b:2"]);
    g.send(sum, 0, barrier(3));
    g.send(sum, 1, barrier(3));
    assert_eq!(seen.take(), ["d:4", "b:3"]);
}

#[test]
fn watermarks_travel_with_the_data() {
    let mut g = Graph::new();
    let pass = g.add(Box::new(Pass), 1);
    let seen = Seen::default();
    let sink = g.add(Box::new(Sink(seen.clone())), 1);
    g.connect(pass, sink, 0).unwrap_or_else(|e| panic!("{e}"));
    g.send(pass, 0, Message::Data(batch(&[1])));
    g.send(
        pass,
        0,
        Message::Watermark(Watermark {
            source: eddy_common::ObjectId(0),
            value: 5,
        }),
    );
    g.send(pass, 0, Message::Data(batch(&[7])));
    g.send(pass, 0, barrier(1));
    assert_eq!(seen.take(), ["d:1", "w:0=5", "d:7", "b:1"]);
}

#[test]
fn a_failing_node_fails_alone_with_what_reads_it() {
    let mut g = Graph::new();
    let source = g.add(Box::new(Pass), 1);
    let faulty = g.add(Box::new(Pass), 1);
    let healthy = g.add(Box::new(SumPerEpoch::default()), 1);
    let (bad_seen, good_seen) = (Seen::default(), Seen::default());
    let bad_sink = g.add(Box::new(Sink(bad_seen.clone())), 1);
    let good_sink = g.add(Box::new(Sink(good_seen.clone())), 1);
    for (from, to) in [
        (source, faulty),
        (source, healthy),
        (faulty, bad_sink),
        (healthy, good_sink),
    ] {
        g.connect(from, to, 0).unwrap_or_else(|e| panic!("{e}"));
    }
    // The source itself does not see 13: only the faulty branch's operator panics on it.
    g.send(faulty, 0, Message::Data(batch(&[13])));
    g.send(source, 0, Message::Data(batch(&[2, 3])));
    g.send(source, 0, barrier(1));
    assert!(
        g.failure(faulty)
            .is_some_and(|e| e.message.contains("unlucky row"))
    );
    assert!(
        g.failure(bad_sink)
            .is_some_and(|e| e.message.contains("Pass failed"))
    );
    assert!(g.failure(healthy).is_none() && g.failure(good_sink).is_none());
    assert_eq!(bad_seen.take(), Vec::<String>::new());
    assert_eq!(good_seen.take(), ["d:5", "b:1"]);
}

#[test]
fn output_is_split_into_batches_of_at_most_batch_rows_max() {
    let mut g = Graph::new();
    let pass = g.add(Box::new(Pass), 1);
    let seen = Seen::default();
    let sink = g.add(Box::new(Sink(seen.clone())), 1);
    g.connect(pass, sink, 0).unwrap_or_else(|e| panic!("{e}"));
    let many: Vec<i64> = (100..(2 * BATCH_ROWS_MAX as i64 + 105)).collect();
    g.send(pass, 0, Message::Data(batch(&many)));
    let got = seen.take();
    assert_eq!(got.len(), 3);
    assert_eq!(g.rows_out(pass), many.len() as u64);
    let rows: usize = got
        .iter()
        .map(|s| s.trim_start_matches("d:").split(',').count())
        .sum();
    assert_eq!(rows, many.len());
}

#[test]
fn an_edge_to_a_missing_input_is_refused() {
    let mut g = Graph::new();
    let a = g.add(Box::new(Pass), 1);
    let b = g.add(Box::new(Pass), 1);
    assert!(g.connect(a, b, 1).is_err());
    assert!(g.connect(a, 7, 0).is_err());
}

fn mark(source: u64, value: i64) -> Message {
    Message::Watermark(Watermark {
        source: eddy_common::ObjectId(source),
        value,
    })
}

/// A mark reaching a node by two paths (a union of two branches of one source) is delivered
/// to it once, and a mark that does not raise its stream's is not delivered at all.
#[test]
fn a_node_receives_each_mark_once_and_only_rising() {
    let schema = Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, false)]));
    let mut g = Graph::new();
    let source = g.add(Box::new(Pass), 1);
    let (left, right) = (g.add(Box::new(Pass), 1), g.add(Box::new(Pass), 1));
    let union = g.add(Box::new(crate::stateless::Union { schema }), 2);
    let seen = Seen::default();
    let sink = g.add(Box::new(Sink(seen.clone())), 1);
    for (from, to, input) in [
        (source, left, 0),
        (source, right, 0),
        (left, union, 0),
        (right, union, 1),
        (union, sink, 0),
    ] {
        g.connect(from, to, input).unwrap_or_else(|e| panic!("{e}"));
    }
    g.send(source, 0, mark(1, 5));
    g.send(source, 0, mark(2, 3));
    g.send(source, 0, mark(1, 5));
    g.send(source, 0, mark(1, 4));
    g.send(source, 0, mark(1, 7));
    assert_eq!(seen.take(), ["w:1=5", "w:2=3", "w:1=7"]);
}
