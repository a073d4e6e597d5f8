//! Temporal filters: `WHERE ts > now() - INTERVAL '1 hour'` in a view keeps each row while the
//! wall clock is within the row's bounds, inserting it when the clock reaches its start and
//! retracting it when the clock reaches its end.
//!
//! A change row with weight `d` and bounds `[from, until)` contributes `+d` at `from` and `-d`
//! at `until`. `now` is the time the epoch ends at (the barrier's, the same for every row of
//! the epoch and every view): at the barrier, what is due is emitted and the rest scheduled.
//! Retractions follow the same rule, so they cancel what their insert scheduled.

use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Array};
use arrow::datatypes::SchemaRef;
use arrow::row::{RowConverter, SortField};
use eddy_common::{ChangeBatch, Result};

use crate::arrangement::{Arrangement, NEVER};
use crate::event_time::micros;
use crate::graph::{Barrier, Handler, Output};
use crate::plan::Expr;
use crate::rows::{arrow_error, batch, evaluate};
use crate::spill::MemoryBudget;
use crate::{OperatorState, checkpoint};

const WAITING: &str = "waiting";
const SHOWING: &str = "showing";

pub struct TemporalFilter {
    from: Vec<(Expr, i64)>,
    until: Vec<(Expr, i64)>,
    schema: SchemaRef,
    rows: RowConverter,
    /// Rows whose start the clock has not reached: each row (the key; no row bytes) expires
    /// at its start, and keeps its end as its aux count.
    waiting: Arrangement,
    /// Rows shown that will go: each expires at its end (rows with no end are not kept).
    showing: Arrangement,
    /// This epoch's rows with their bounds (from, until) and weights, judged against the
    /// epoch's time at its barrier.
    staged: Vec<(usize, i64, i64, i64)>,
    /// The bytes of the staged rows (`staged` holds their ends).
    staged_bytes: Vec<u8>,
}

impl TemporalFilter {
    pub fn new(
        schema: &SchemaRef,
        from: Vec<(Expr, i64)>,
        until: Vec<(Expr, i64)>,
    ) -> Result<Self> {
        let fields = schema
            .fields()
            .iter()
            .map(|f| SortField::new(f.data_type().clone()))
            .collect();
        Ok(TemporalFilter {
            from,
            until,
            schema: schema.clone(),
            rows: RowConverter::new(fields).map_err(arrow_error)?,
            waiting: Arrangement::new(),
            showing: Arrangement::new(),
            staged: Vec::new(),
            staged_bytes: Vec::new(),
        })
    }

    /// Per row: the bound, or `None` when a bound expression is NULL (the comparison is never
    /// true, so the row never shows).
    fn bounds(
        &self,
        exprs: &[(Expr, i64)],
        rows: &arrow::array::RecordBatch,
        pick_max: bool,
    ) -> Result<Vec<Option<Option<i64>>>> {
        let mut out: Vec<Option<Option<i64>>> = vec![Some(None); rows.num_rows()];
        for (expr, offset) in exprs {
            let values = micros(&evaluate(expr, rows)?)?;
            for (slot, v) in out.iter_mut().zip(values) {
                *slot = match (*slot, v) {
                    (None, _) | (_, None) => None,
                    (Some(current), Some(v)) => {
                        let v = v.saturating_add(*offset);
                        Some(Some(match current {
                            None => v,
                            Some(c) if pick_max => c.max(v),
                            Some(c) => c.min(v),
                        }))
                    }
                };
            }
        }
        Ok(out)
    }

    /// Stages a batch's rows that can ever show (non-NULL bounds, a non-empty interval).
    fn absorb(&mut self, changes: &ChangeBatch) -> Result<()> {
        let from = self.bounds(&self.from, changes.rows(), true)?;
        let until = self.bounds(&self.until, changes.rows(), false)?;
        let encoded = self
            .rows
            .convert_columns(changes.rows().columns())
            .map_err(arrow_error)?;
        for (i, d) in changes.diffs().values().iter().enumerate() {
            let (Some(from), Some(until)) = (from[i], until[i]) else {
                continue;
            };
            let from = from.unwrap_or(i64::MIN);
            let until = until.unwrap_or(NEVER);
            if from < until {
                let start = self.staged_bytes.len();
                self.staged_bytes.extend_from_slice(encoded.row(i).data());
                self.staged.push((start, from, until, *d));
            }
        }
        Ok(())
    }

    /// The epoch ends at `now`: its rows that show now are emitted, the others wait for their
    /// start; every waiting row whose start `now` reached shows, and every shown row whose
    /// end it reached goes.
    fn emit(&mut self, now: i64) -> Result<Vec<ChangeBatch>> {
        let mut out = Emitted::default();
        let staged = std::mem::take(&mut self.staged);
        let bytes = std::mem::take(&mut self.staged_bytes);
        let keys = staged.iter().enumerate().map(|(n, (start, ..))| {
            let end = staged.get(n + 1).map_or(bytes.len(), |s| s.0);
            &bytes[*start..end]
        });
        self.waiting.prepare(keys.clone())?;
        self.showing.prepare(keys.clone())?;
        for (row, (_, from, until, d)) in keys.zip(&staged) {
            if *until <= now {
                continue;
            }
            if *from <= now {
                out.push(row, *d);
                if *until != NEVER {
                    self.showing.update(row, &[], *from, *d, *until)?;
                }
            } else if let Some(e) = self.waiting.update(row, &[], *from, *d, *from)? {
                self.waiting.set_aux(e, *until);
            }
        }
        let TemporalFilter {
            waiting, showing, ..
        } = self;
        // Rows that start showing and will end: their bytes, then (end of bytes, start,
        // weight, end) each.
        let (mut moved_bytes, mut moved) = (Vec::new(), Vec::new());
        waiting.drain_due(now, |found| {
            let until = found.aux;
            if until > now {
                out.push(found.key, found.weight);
                if until != NEVER {
                    moved_bytes.extend_from_slice(found.key);
                    moved.push((moved_bytes.len(), found.time, found.weight, until));
                }
            }
        })?;
        let mut start = 0;
        for (end, from, d, until) in moved {
            showing.update(&moved_bytes[start..end], &[], from, d, until)?;
            start = end;
        }
        showing.drain_due(now, |found| out.push(found.key, -found.weight))?;
        self.staged = staged;
        self.staged.clear();
        self.staged_bytes = bytes;
        self.staged_bytes.clear();
        self.waiting.settle()?;
        self.showing.settle()?;
        if out.diffs.is_empty() {
            return Ok(Vec::new());
        }
        let parser = self.rows.parser();
        let columns: Vec<ArrayRef> = self
            .rows
            .convert_rows(out.starts.iter().enumerate().map(|(n, start)| {
                let end = out.starts.get(n + 1).copied().unwrap_or(out.bytes.len());
                parser.parse(&out.bytes[*start..end])
            }))
            .map_err(arrow_error)?;
        Ok(vec![ChangeBatch::new(
            batch(&self.schema, columns)?,
            Int64Array::from(out.diffs),
        )])
    }
}

/// Rows going out: their bytes back to back, and weights.
#[derive(Default)]
struct Emitted {
    bytes: Vec<u8>,
    starts: Vec<usize>,
    diffs: Vec<i64>,
}

impl Emitted {
    fn push(&mut self, row: &[u8], diff: i64) {
        self.starts.push(self.bytes.len());
        self.bytes.extend_from_slice(row);
        self.diffs.push(diff);
    }
}

impl Handler for TemporalFilter {
    fn on_data(&mut self, _input: usize, changes: ChangeBatch, _out: &mut Output) -> Result<()> {
        self.absorb(&changes)
    }

    fn on_barrier(&mut self, barrier: &Barrier, out: &mut Output) -> Result<()> {
        for changes in self.emit(barrier.now_micros)? {
            out.data(changes);
        }
        Ok(())
    }

    fn name(&self) -> String {
        "TemporalFilter".to_owned()
    }

    fn state(&self) -> OperatorState {
        OperatorState {
            name: "TemporalFilter".to_owned(),
            rows: self.waiting.len() + self.showing.len(),
            bytes: self.waiting.size_bytes() + self.showing.size_bytes(),
        }
    }

    fn spill_to(&mut self, budget: &Arc<MemoryBudget>) {
        self.waiting.spill_to(budget);
        self.showing.spill_to(budget);
    }

    fn spilled_rows(&self) -> usize {
        self.waiting.spilled_rows() + self.showing.spilled_rows()
    }

    fn save(
        &mut self,
        mode: crate::arrangement::SaveMode,
        out: &mut dyn checkpoint::Sink,
    ) -> Result<()> {
        for (name, rows) in [(WAITING, &mut self.waiting), (SHOWING, &mut self.showing)] {
            rows.save(mode, name, out)?;
        }
        Ok(())
    }

    fn load(&mut self, name: &str, batch: &arrow::array::RecordBatch) -> Result<()> {
        match name {
            WAITING => self.waiting.load(batch),
            SHOWING => self.showing.load(batch),
            _ => Err(checkpoint::unknown_part("TemporalFilter", name)),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Array, RecordBatch, TimestampMicrosecondArray};
    use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
    use datafusion::physical_expr::expressions::Column;
    use eddy_common::{ChangeBatch, ObjectId};

    use crate::plan::Node;

    const SECOND: i64 = 1_000_000;

    /// `WHERE now() >= ts AND now() < ts + INTERVAL '60 seconds'`: each row shows for the
    /// minute after its time, judged at the times the epochs end (no wall clock involved).
    #[test]
    fn rows_show_and_go_at_the_times_epochs_end() {
        let schema = Arc::new(Schema::new(vec![Field::new(
            "ts",
            DataType::Timestamp(TimeUnit::Microsecond, None),
            false,
        )]));
        let ts = || -> crate::plan::Expr { Arc::new(Column::new("ts", 0)) };
        let plan = Node::TemporalFilter {
            input: Box::new(Node::Source {
                object: ObjectId(1),
                name: "t".into(),
                schema: Arc::clone(&schema),
            }),
            from: vec![(ts(), 0)],
            until: vec![(ts(), 60 * SECOND)],
        };
        let et = Arc::new(crate::EventTime::new(&[]));
        let mut flow = crate::build(&plan, &et, &crate::Workers::single()).unwrap();
        let rows = |times: &[i64]| {
            let array = TimestampMicrosecondArray::from(times.to_vec());
            ChangeBatch::inserts(
                RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(array)]).unwrap(),
            )
        };
        let weights = |out: Vec<ChangeBatch>| -> Vec<(i64, i64)> {
            let mut seen: Vec<(i64, i64)> = out
                .iter()
                .flat_map(|c| {
                    let t = c
                        .rows()
                        .column(0)
                        .as_any()
                        .downcast_ref::<TimestampMicrosecondArray>()
                        .unwrap()
                        .clone();
                    (0..c.len()).map(move |i| (t.value(i), c.diffs().value(i)))
                })
                .collect();
            seen.sort();
            seen
        };
        // Written at 50 s: the 100 s row is in the future, the -20 s row past its minute.
        assert!(
            flow.push(
                ObjectId(1),
                &rows(&[100 * SECOND, -20 * SECOND, 30 * SECOND])
            )
            .unwrap()
            .is_empty()
        );
        assert_eq!(
            weights(flow.end_epoch(50 * SECOND).unwrap()),
            [(30 * SECOND, 1)]
        );
        assert_eq!(weights(flow.end_epoch(90 * SECOND - 1).unwrap()), []);
        assert_eq!(
            weights(flow.end_epoch(100 * SECOND).unwrap()),
            [(30 * SECOND, -1), (100 * SECOND, 1)],
            "the 30 s row goes at 90 s, the 100 s row shows at 100 s"
        );
        assert_eq!(weights(flow.end_epoch(160 * SECOND - 1).unwrap()), []);
        assert_eq!(
            weights(flow.end_epoch(160 * SECOND).unwrap()),
            [(100 * SECOND, -1)]
        );
        // A row and its retraction in one epoch never show.
        let mut both = rows(&[170 * SECOND, 170 * SECOND]);
        both = ChangeBatch::new(
            both.rows().clone(),
            arrow::array::Int64Array::from(vec![1, -1]),
        );
        flow.push(ObjectId(1), &both).unwrap();
        let out = weights(flow.end_epoch(175 * SECOND).unwrap());
        assert_eq!(out.iter().map(|(_, d)| d).sum::<i64>(), 0, "{out:?}");
        assert_eq!(
            weights(flow.end_epoch(300 * SECOND).unwrap())
                .iter()
                .map(|(_, d)| d)
                .sum::<i64>(),
            0
        );
    }
}
