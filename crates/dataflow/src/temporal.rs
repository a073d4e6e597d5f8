//! Temporal filters: `WHERE ts > now() - INTERVAL '1 hour'` in a view keeps each row while the
//! wall clock is within the row's bounds, inserting it when the clock reaches its start and
//! retracting it when the clock reaches its end.
//!
//! A change row with weight `d` and bounds `[from, until)` contributes `+d` at `from` and `-d`
//! at `until`; what is due when it arrives is emitted at once, the rest is scheduled by time.
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
    /// Changes due now, emitted at the end of the epoch.
    due: Vec<(OwnedRow, i64)>,
}

fn now_micros() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
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
            due: Vec::new(),
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

    fn absorb(&mut self, batches: Vec<ChangeBatch>) -> Result<()> {
        let now = now_micros();
        for changes in batches {
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
                if from >= until || until <= now {
                    continue;
                }
                let row = encoded.row(i).owned();
                if from <= now {
                    self.due.push((row.clone(), *d));
                } else {
                    self.scheduled
                        .entry(from)
                        .or_default()
                        .push((row.clone(), *d));
                }
                if until != i64::MAX {
                    self.scheduled.entry(until).or_default().push((row, -*d));
                }
            }
        }
        Ok(())
    }

    fn emit(&mut self) -> Result<Vec<ChangeBatch>> {
        let now = now_micros();
        let mut out = std::mem::take(&mut self.due);
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
        self.absorb(vec![changes])
    }

    fn on_barrier(&mut self, _barrier: &Barrier, out: &mut Output) -> Result<()> {
        for changes in self.emit()? {
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
