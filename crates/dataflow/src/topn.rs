//! Top-N: `ORDER BY ... LIMIT n [OFFSET m]` maintained under inserts and retractions.
//!
//! State: every input row with its multiplicity, ordered by (sort key, row) in arrow's row
//! format (which encodes ASC/DESC and NULLS FIRST/LAST). At the end of an epoch with changes
//! the operator walks the first `offset + limit` rows and emits the difference with what it
//! emitted before. Ties in the sort key are broken by the row's bytes, deterministically.

use std::collections::{BTreeMap, HashMap};

use arrow::array::{ArrayRef, Int64Array};
use arrow::compute::SortOptions;
use arrow::datatypes::SchemaRef;
use arrow::row::{OwnedRow, RowConverter, SortField};
use eddy_common::{ChangeBatch, ObjectId, Result};

use crate::Operator;
use crate::plan::Expr;
use crate::rows::{arrow_error, batch, evaluate};

pub struct TopN {
    input: Box<dyn Operator>,
    order: Vec<(Expr, SortOptions)>,
    offset: usize,
    limit: usize,
    schema: SchemaRef,
    keys: Option<RowConverter>,
    rows: RowConverter,
    state: BTreeMap<(OwnedRow, OwnedRow), i64>,
    emitted: HashMap<OwnedRow, i64>,
    dirty: bool,
}

impl TopN {
    pub fn new(input: Box<dyn Operator>, order: Vec<(Expr, SortOptions)>, offset: usize, limit: usize, schema: SchemaRef) -> Result<Self> {
        let fields = schema.fields().iter().map(|f| SortField::new(f.data_type().clone())).collect();
        let rows = RowConverter::new(fields).map_err(arrow_error)?;
        Ok(TopN { input, order, offset, limit, schema, keys: None, rows, state: BTreeMap::new(), emitted: HashMap::new(), dirty: false })
    }

    fn absorb(&mut self, changes: &ChangeBatch) -> Result<()> {
        if changes.is_empty() {
            return Ok(());
        }
        let keys: Vec<ArrayRef> = self.order.iter().map(|(e, _)| evaluate(e, changes.rows())).collect::<Result<_>>()?;
        if self.keys.is_none() {
            let fields = keys.iter().zip(&self.order).map(|(k, (_, o))| SortField::new_with_options(k.data_type().clone(), *o)).collect();
            self.keys = Some(RowConverter::new(fields).map_err(arrow_error)?);
        }
        let Some(converter) = self.keys.as_ref() else { return Ok(()) };
        let keys = converter.convert_columns(&keys).map_err(arrow_error)?;
        let rows = self.rows.convert_columns(changes.rows().columns()).map_err(arrow_error)?;
        for (i, d) in changes.diffs().values().iter().enumerate() {
            let entry = (keys.row(i).owned(), rows.row(i).owned());
            let count = self.state.entry(entry.clone()).or_insert(0);
            *count += d;
            if *count == 0 {
                self.state.remove(&entry);
            }
        }
        self.dirty = true;
        Ok(())
    }

    fn emit(&mut self) -> Result<Vec<ChangeBatch>> {
        if !std::mem::take(&mut self.dirty) {
            return Ok(Vec::new());
        }
        let mut now: HashMap<OwnedRow, i64> = HashMap::new();
        let (mut skip, mut take) = (self.offset, self.limit);
        for ((_, row), count) in &self.state {
            if take == 0 {
                break;
            }
            let mut n = (*count).max(0) as usize;
            let skipped = n.min(skip);
            skip -= skipped;
            n -= skipped;
            let kept = n.min(take);
            take -= kept;
            if kept > 0 {
                *now.entry(row.clone()).or_default() += kept as i64;
            }
        }
        let mut diffs: HashMap<OwnedRow, i64> = now.clone();
        for (row, count) in &self.emitted {
            *diffs.entry(row.clone()).or_default() -= count;
        }
        diffs.retain(|_, d| *d != 0);
        self.emitted = now;
        if diffs.is_empty() {
            return Ok(Vec::new());
        }
        let (rows, weights): (Vec<OwnedRow>, Vec<i64>) = diffs.into_iter().unzip();
        let columns = self.rows.convert_rows(rows.iter().map(|r| r.row())).map_err(arrow_error)?;
        Ok(vec![ChangeBatch::new(batch(&self.schema, columns)?, Int64Array::from(weights))])
    }
}

impl Operator for TopN {
    fn push(&mut self, source: ObjectId, changes: &ChangeBatch) -> Result<Vec<ChangeBatch>> {
        for b in self.input.push(source, changes)? {
            self.absorb(&b)?;
        }
        Ok(Vec::new())
    }

    fn end_epoch(&mut self) -> Result<Vec<ChangeBatch>> {
        for b in self.input.end_epoch()? {
            self.absorb(&b)?;
        }
        self.emit()
    }

    fn describe(&self) -> String {
        format!("TopN(offset {}, limit {}, {} rows held)", self.offset, self.limit, self.state.len())
    }
}
