//! Temporal filters: `WHERE ts > now() - INTERVAL '1 hour'` in a view keeps each row while the
//! wall clock is within the row's bounds, inserting it when the clock reaches its start and
//! retracting it when the clock reaches its end.
//!
//! A change row with weight `d` and bounds `[from, until)` contributes `+d` at `from` and `-d`
//! at `until`. `now` is the time the epoch ends at (the barrier's, the same for every row of
//! the epoch and every view): at the barrier, what is due is emitted and the rest scheduled.
//! Retractions follow the same rule, so they cancel what their insert scheduled.

use std::collections::BTreeMap;

use arrow::array::{ArrayRef, Int64Array};
use arrow::datatypes::SchemaRef;
use arrow::row::{OwnedRow, RowConverter, SortField};
use eddy_common::{ChangeBatch, Result};

use crate::event_time::micros;
use crate::graph::{Barrier, Handler, Output};
use crate::plan::Expr;
use crate::rows::{arrow_error, batch, evaluate};
use crate::{OperatorState, checkpoint};

pub struct TemporalFilter {
    from: Vec<(Expr, i64)>,
    until: Vec<(Expr, i64)>,
    schema: SchemaRef,
    rows: RowConverter,
    /// Clock time (µs) -> rows whose weight changes then.
    scheduled: BTreeMap<i64, Vec<(OwnedRow, i64)>>,
    /// This epoch's rows with their bounds (from, until) and weights, judged against the
    /// epoch's time at its barrier.
    staged: Vec<(OwnedRow, i64, i64, i64)>,
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
            scheduled: BTreeMap::new(),
            staged: Vec::new(),
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
            let until = until.unwrap_or(i64::MAX);
            if from < until {
                self.staged.push((encoded.row(i).owned(), from, until, *d));
            }
        }
        Ok(())
    }

    /// The epoch ends at `now`: its rows that show now are emitted, the others scheduled, and
    /// every scheduled change due by `now` is emitted.
    fn emit(&mut self, now: i64) -> Result<Vec<ChangeBatch>> {
        let mut out = Vec::new();
        for (row, from, until, d) in std::mem::take(&mut self.staged) {
            if until <= now {
                continue;
            }
            if until != i64::MAX {
                self.scheduled
                    .entry(until)
                    .or_default()
                    .push((row.clone(), -d));
            }
            if from <= now {
                out.push((row, d));
            } else {
                self.scheduled.entry(from).or_default().push((row, d));
            }
        }
        while let Some(entry) = self.scheduled.first_entry() {
            if *entry.key() > now {
                break;
            }
            out.extend(entry.remove());
        }
        if out.is_empty() {
            return Ok(Vec::new());
        }
        let columns: Vec<ArrayRef> = self
            .rows
            .convert_rows(out.iter().map(|(r, _)| r.row()))
            .map_err(arrow_error)?;
        let diffs = Int64Array::from(out.iter().map(|(_, d)| *d).collect::<Vec<_>>());
        Ok(vec![ChangeBatch::new(batch(&self.schema, columns)?, diffs)])
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
        let entries = self.scheduled.values().map(Vec::len).sum();
        let bytes = self
            .scheduled
            .values()
            .flatten()
            .map(|(r, _)| r.as_ref().len() + std::mem::size_of::<(OwnedRow, i64)>())
            .sum();
        OperatorState {
            name: "TemporalFilter".to_owned(),
            rows: entries,
            bytes,
        }
    }

    fn save(&mut self) -> Result<checkpoint::Parts> {
        let entries: Vec<(i64, &OwnedRow, i64)> = self
            .scheduled
            .iter()
            .flat_map(|(t, rows)| rows.iter().map(move |(r, d)| (*t, r, *d)))
            .collect();
        let columns = vec![
            ("time", checkpoint::int64s(entries.iter().map(|e| e.0))),
            (
                "row",
                checkpoint::binary(entries.iter().map(|e| e.1.as_ref())),
            ),
            ("diff", checkpoint::int64s(entries.iter().map(|e| e.2))),
        ];
        Ok(vec![("scheduled", checkpoint::part(columns, &[])?)])
    }

    fn load(&mut self, name: &str, batch: &arrow::array::RecordBatch) -> Result<()> {
        if name != "scheduled" {
            return Err(checkpoint::unknown_part("TemporalFilter", name));
        }
        let rows = checkpoint::required_rows(&self.rows, checkpoint::binary_column(batch, "row")?)?;
        let (times, diffs) = (
            checkpoint::int64_column(batch, "time")?,
            checkpoint::int64_column(batch, "diff")?,
        );
        for (i, row) in rows.into_iter().enumerate() {
            self.scheduled
                .entry(times.value(i))
                .or_default()
                .push((row, diffs.value(i)));
        }
        Ok(())
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
