//! A table's current contents (or a view's), rebuilt from its log on start-up.
//!
//! Append-only tables keep their rows in their log, not in memory ([`LogRows`]); a view's
//! contents that only ever got inserts keep their batches as written, in chunks without an
//! index. Other tables (and views once they retract) keep their rows in Arrow chunks indexed
//! by primary key, or by the whole row without one (`table_multiset.rs`), so that retractions
//! find their rows. Past the server's memory budget the chunks and the index spill to disk
//! (ADR 0012). Invariant: applying a change batch is all-or-nothing — [`TableData::check`]
//! validates it against the current contents before [`TableData::apply`] changes anything;
//! the apply of the changes a check accepted reuses their encoding, and an update of a keyed
//! table's row keeps the key's index entry, pointed at the new row.

/// Rows and keys hash with foldhash: they are Eddy's own encodings, hashed on every change.
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
type HashSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, RecordBatch};
use arrow::datatypes::SchemaRef;
use arrow::row::{RowConverter, SortField};
use eddy_common::{ChangeBatch, Error, Result, SqlState};
use eddy_connectors::RowKind;

use eddy_dataflow::arrangement::{Arrangement, NEVER};
use eddy_dataflow::spill::MemoryBudget;

use crate::catalog::TableDef;
use crate::table_chunks::{Chunks, Loc, ViewRows};
use crate::table_log::{LogRows, LogScan};

#[path = "table_multiset.rs"]
mod multiset;
use multiset::{Multiset, duplicate_key};

pub struct TableData {
    schema: SchemaRef,
    rows: Rows,
    /// Changes with every write (unique across tables and their copies): a statement's
    /// snapshot is still the contents while this is the version it was taken at.
    version: u64,
    /// The contents as batches, built on demand and dropped on every change.
    snapshot: Option<Arc<Vec<RecordBatch>>>,
    /// The memory budget the rows spill past (ADR 0012), when the server has one.
    spill: Option<Arc<MemoryBudget>>,
}

enum Rows {
    /// Rows that only ever got inserts, as written (no index).
    AppendOnly(Chunks),
    Log(LogRows),
    Multiset(Box<Multiset>),
}

/// What a scan of a table reads: rows in memory (as of `version`, see
/// [`TableData::lookup`]), or an append-only table's log.
pub enum TableScan {
    /// In memory, or some chunks on disk (read as the scan goes).
    Rows {
        rows: Arc<ViewRows>,
        version: u64,
    },
    Log(Arc<LogScan>),
}

/// The next [`TableData::version`].
fn next_version() -> u64 {
    static VERSION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    VERSION.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

fn arrow_error(context: &str, err: arrow::error::ArrowError) -> Error {
    Error::internal(format!("{context}: {err}"))
}

/// Whether `changes` only insert rows, once each (contents that only ever got such changes
/// keep them as written, [`Rows::AppendOnly`]).
pub fn only_inserts(changes: &[ChangeBatch]) -> bool {
    changes
        .iter()
        .all(|c| c.diffs().values().iter().all(|d| *d == 1))
}

impl TableData {
    pub fn new(def: &TableDef, schema: SchemaRef) -> Result<Self> {
        let rows = if def.append_only {
            Rows::AppendOnly(Chunks::new(Arc::clone(&schema)))
        } else {
            let primary_key = (!def.primary_key.is_empty())
                .then_some((def.primary_key.as_slice(), def.name.as_str()));
            Rows::Multiset(Box::new(Multiset::new(&schema, primary_key)?))
        };
        Ok(TableData {
            schema,
            rows,
            version: next_version(),
            snapshot: None,
            spill: None,
        })
    }

    /// An append-only table whose log holds `rows` rows up to its partitions' current ends.
    pub fn logged(
        def: &TableDef,
        schema: SchemaRef,
        log: &Arc<eddy_storage::log::LogStore>,
        rows: usize,
    ) -> Result<Self> {
        let log = LogRows::at_end(log, def.id, def.partitions, Arc::clone(&schema), rows)?;
        Ok(TableData {
            schema,
            rows: Rows::Log(log),
            version: next_version(),
            snapshot: None,
            spill: None,
        })
    }

    /// The same contents kept within their share of `budget` (when the server has one) from
    /// now on: a table's index of rows and its chunks spill past it (ADR 0012). An
    /// append-only table's rows are in its log, not in memory.
    pub fn within(mut self, budget: Option<&Arc<MemoryBudget>>) -> Self {
        if let (Rows::Multiset(m), Some(budget)) = (&mut self.rows, budget) {
            m.spill_to(budget);
            self.spill = Some(Arc::clone(budget));
        }
        self
    }

    /// The contents of a materialized view: its output batches as they come while it only
    /// inserts (no row encoding, no hashing: a pass-through or filter view costs a copy of
    /// pointers), a multiset of rows from its first retraction on; either keeps within its
    /// share of `spill` (the server's memory budget, when it has one), spilling its coldest
    /// chunks (and the multiset its index of rows).
    pub fn for_view(schema: SchemaRef, spill: Option<&Arc<MemoryBudget>>) -> Self {
        let mut chunks = Chunks::new(Arc::clone(&schema));
        if let Some(budget) = spill {
            chunks.spill_to(budget);
        }
        TableData {
            schema,
            rows: Rows::AppendOnly(chunks),
            version: next_version(),
            snapshot: None,
            spill: spill.cloned(),
        }
    }

    /// Checks a view's epoch output against its contents: a retraction of a row the view does
    /// not hold is a bug in the dataflow, never a user error.
    pub fn check_view_output(&mut self, changes: &[ChangeBatch]) -> Result<()> {
        if matches!(self.rows, Rows::AppendOnly(_)) && !only_inserts(changes) {
            self.make_multiset()?;
        }
        // Its index may have spilled: the check brings the rows retracted back first.
        self.check(changes).map_err(|e| {
            Error::internal(format!(
                "a view's dataflow retracted a row the view does not hold ({})",
                e.message
            ))
        })
    }

    /// [`TableData::check_view_output`] then [`TableData::apply`] of a non-empty output, the
    /// changes encoded and netted once.
    pub fn apply_view_output(&mut self, changes: &[ChangeBatch]) -> Result<()> {
        if changes.iter().all(|c| c.is_empty()) {
            return self.check_view_output(changes);
        }
        if matches!(self.rows, Rows::AppendOnly(_)) && !only_inserts(changes) {
            self.make_multiset()?;
        }
        let Rows::Multiset(m) = &mut self.rows else {
            self.check_view_output(changes)?;
            return self.apply(changes);
        };
        self.snapshot = None;
        self.version = next_version();
        m.check_and_apply(changes, |e| {
            Error::internal(format!(
                "a view's dataflow retracted a row the view does not hold ({})",
                e.message
            ))
        })
    }

    /// Turns batches of inserted rows into a multiset (a view's first retraction or repeat),
    /// a chunk at a time (those on disk read back one by one).
    fn make_multiset(&mut self) -> Result<()> {
        let Rows::AppendOnly(chunks) = &mut self.rows else {
            return Ok(());
        };
        let mut multiset = Multiset::new(&self.schema, None)?;
        if let Some(budget) = &self.spill {
            multiset.index.spill_to(budget);
            multiset.chunks.spill_to(budget);
        }
        chunks.for_each_batch(|batch| multiset.apply(&[ChangeBatch::inserts(batch)]))?;
        self.rows = Rows::Multiset(Box::new(multiset));
        self.version = next_version();
        self.snapshot = None;
        Ok(())
    }

    /// Rows held in memory by an append-only table (its tail not yet read back from the log).
    #[cfg(test)]
    pub fn held_in_memory(&self) -> usize {
        match &self.rows {
            Rows::Log(l) => l.held_in_memory(),
            _ => self.row_count(),
        }
    }

    /// What is on disk past the memory budget: (entries of the index of rows, rows of
    /// chunks).
    pub fn spilled(&self) -> (usize, usize) {
        match &self.rows {
            Rows::Multiset(m) => (m.index.spilled_rows(), m.chunks.spilled_rows()),
            Rows::AppendOnly(chunks) => (0, chunks.spilled_rows()),
            Rows::Log(_) => (0, 0),
        }
    }

    pub fn row_count(&self) -> usize {
        match &self.rows {
            Rows::AppendOnly(chunks) => chunks.len(),
            Rows::Log(l) => l.row_count(),
            Rows::Multiset(m) => m.chunks.len(),
        }
    }

    /// The current contents as a scan reads them: frozen, an append-only table's read from
    /// its log as the scan goes.
    pub fn scan(&mut self) -> Result<TableScan> {
        match &mut self.rows {
            Rows::Log(l) => Ok(TableScan::Log(l.scan()?)),
            _ => Ok(TableScan::Rows {
                rows: self.view_rows()?,
                version: self.version,
            }),
        }
    }

    /// The current contents, as an immutable snapshot in memory.
    pub fn snapshot(&mut self) -> Result<Arc<Vec<RecordBatch>>> {
        if let Some(s) = &self.snapshot {
            return Ok(Arc::clone(s));
        }
        if let Rows::Log(l) = &mut self.rows {
            // Not cached: the rows are not to be held.
            return Ok(Arc::new(l.scan()?.collect()?));
        }
        let Some(chunks) = self.chunks() else {
            return Err(Error::internal(
                "a table's rows are neither in its log nor chunks",
            ));
        };
        if chunks.spilled() {
            return Ok(Arc::new(chunks.scan()?));
        }
        let batches = chunks.scan()?;
        let snapshot = Arc::new(batches);
        self.snapshot = Some(Arc::clone(&snapshot));
        Ok(snapshot)
    }

    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// The chunks that hold the rows, unless they are in the log.
    fn chunks(&mut self) -> Option<&mut Chunks> {
        match &mut self.rows {
            Rows::AppendOnly(chunks) => Some(chunks),
            Rows::Multiset(m) => Some(&mut m.chunks),
            Rows::Log(_) => None,
        }
    }

    /// The contents as published for queries (a view's) or frozen for a statement (a
    /// table's): its rows, or where some are on disk, what a query reads them from (not read
    /// now).
    pub fn view_rows(&mut self) -> Result<Arc<ViewRows>> {
        if let Some(chunks) = self.chunks()
            && chunks.spilled()
        {
            return Ok(Arc::new(chunks.pieces()?));
        }
        Ok(Arc::new(ViewRows::Rows(self.snapshot()?)))
    }

    /// A view's contents from row `start` on while they only ever got inserts (the rows
    /// inserted since a save of `start` rows); `None` once they took a retraction.
    pub fn inserted_since(&mut self, start: usize) -> Result<Option<Arc<ViewRows>>> {
        match &mut self.rows {
            Rows::AppendOnly(chunks) => Ok(Some(Arc::new(chunks.pieces_from(start)?))),
            _ => Ok(None),
        }
    }

    /// The contents only ever got inserts.
    pub fn only_inserted(&self) -> bool {
        matches!(self.rows, Rows::AppendOnly(_))
    }

    /// The rows of a keyed table whose primary key is `key` (one array per key column, of
    /// its type), found by the index, if the table is still as it was at `version`; `None`
    /// otherwise (or without a primary key): the caller scans its snapshot instead.
    pub fn lookup(&mut self, version: u64, key: &[ArrayRef]) -> Result<Option<Vec<RecordBatch>>> {
        let Rows::Multiset(m) = &mut self.rows else {
            return Ok(None);
        };
        let Some(pk) = &m.primary_key else {
            return Ok(None);
        };
        if version != self.version {
            return Ok(None);
        }
        let keys = pk
            .converter
            .convert_columns(key)
            .map_err(|e| arrow_error("encode keys", e))?;
        m.prepare_keys(&keys)?;
        let rows = Self::found_rows(&self.schema, m, &keys);
        // The keys brought back from disk may go again (the contents did not change).
        m.settle()?;
        rows.map(Some)
    }

    /// The rows `m` holds under the (prepared) primary keys `keys`.
    fn found_rows(
        schema: &SchemaRef,
        m: &Multiset,
        keys: &arrow::row::Rows,
    ) -> Result<Vec<RecordBatch>> {
        let parser = m.converter.parser();
        let found: Vec<_> = (0..keys.num_rows())
            .filter_map(|i| m.current(keys.row(i).data()))
            .map(|row| parser.parse(row))
            .collect();
        let options = arrow::array::RecordBatchOptions::new().with_row_count(Some(found.len()));
        let columns = m
            .converter
            .convert_rows(found)
            .map_err(|e| arrow_error("decode rows", e))?;
        let rows = RecordBatch::try_new_with_options(Arc::clone(schema), columns, &options)
            .map_err(|e| arrow_error("looked-up rows", e))?;
        Ok(vec![rows])
    }

    /// Checks that `changes` can be applied: retracted rows exist, no primary key repeats.
    /// (The index keys it reads are brought back from disk, for the apply that follows.)
    pub fn check(&mut self, changes: &[ChangeBatch]) -> Result<()> {
        match &mut self.rows {
            Rows::AppendOnly(_) | Rows::Log(_) => {
                if changes
                    .iter()
                    .any(|c| c.diffs().values().iter().any(|d| *d < 0))
                {
                    return Err(Error::unsupported(
                        "an APPEND ONLY table accepts only inserts",
                    ));
                }
                Ok(())
            }
            Rows::Multiset(m) => m.check(changes),
        }
    }

    /// Applies a commit's changes that [`TableData::check`] accepted, as routed to the log's
    /// partitions (`parts`) whose records were promised `offsets`.
    pub fn apply_committed(
        &mut self,
        changes: &[ChangeBatch],
        parts: &[(u32, ChangeBatch)],
        offsets: &[eddy_common::Offset],
    ) -> Result<()> {
        match &mut self.rows {
            Rows::Log(l) => l.append(parts, Some(offsets)),
            _ => self.apply(changes),
        }
    }

    /// Applies changes that [`TableData::check`] accepted.
    pub fn apply(&mut self, changes: &[ChangeBatch]) -> Result<()> {
        self.snapshot = None;
        self.version = next_version();
        match &mut self.rows {
            Rows::Log(l) => {
                let parts: Vec<(u32, ChangeBatch)> =
                    changes.iter().map(|c| (0, c.clone())).collect();
                l.append(&parts, None)
            }
            Rows::AppendOnly(chunks) => {
                for rows in changes
                    .iter()
                    .filter(|c| !c.is_empty())
                    .map(ChangeBatch::rows)
                {
                    // Under this table's (or view's) column names.
                    let options = arrow::array::RecordBatchOptions::new()
                        .with_row_count(Some(rows.num_rows()));
                    let rows = RecordBatch::try_new_with_options(
                        Arc::clone(&self.schema),
                        rows.columns().to_vec(),
                        &options,
                    )
                    .map_err(|e| arrow_error("appended rows", e))?;
                    chunks.append(&rows, None)?;
                }
                chunks.settle()
            }
            Rows::Multiset(m) => m.apply(changes),
        }
    }

    /// Turns decoded connector rows into changes against the current contents: inserts add
    /// rows; on a keyed table an upsert replaces the row holding its key and a delete removes
    /// it (the last record of a key within the chunk wins); a retraction removes one copy of
    /// its exact row. Rows that cannot apply (a duplicate key, a retraction of a row the table
    /// does not hold) are returned as (row, why) and left out.
    pub fn resolve(
        &mut self,
        rows: &RecordBatch,
        kinds: &[RowKind],
    ) -> Result<(ChangeBatch, Vec<(usize, String)>)> {
        let labelled = |columns: Vec<ArrayRef>, diffs: Vec<i64>| -> Result<ChangeBatch> {
            let options = arrow::array::RecordBatchOptions::new().with_row_count(Some(diffs.len()));
            let rows =
                RecordBatch::try_new_with_options(Arc::clone(&self.schema), columns, &options)
                    .map_err(|e| arrow_error("connector rows", e))?;
            Ok(ChangeBatch::new(
                rows,
                arrow::array::Int64Array::from(diffs),
            ))
        };
        let m = match &mut self.rows {
            Rows::AppendOnly(_) | Rows::Log(_) => {
                if kinds.iter().any(|k| *k != RowKind::Insert) {
                    return Err(Error::internal(
                        "an append-only table got a change that is not an insert",
                    ));
                }
                return Ok((
                    labelled(rows.columns().to_vec(), vec![1; rows.num_rows()])?,
                    Vec::new(),
                ));
            }
            Rows::Multiset(m) => m,
        };
        let encoded = m
            .converter
            .convert_columns(rows.columns())
            .map_err(|e| arrow_error("encode rows", e))?;
        let keys = match &m.primary_key {
            Some(pk) => Some(pk.encode(rows)?),
            None => None,
        };
        m.prepare_keys(keys.as_ref().unwrap_or(&encoded))?;
        let m = &**m;
        let mut rejected = Vec::new();
        let mut inserts: Vec<u32> = Vec::new();
        let mut retracts: Vec<&[u8]> = Vec::new();
        match &m.primary_key {
            None => {
                // Copies of a row available to retract: held, plus inserted earlier in the chunk.
                let mut available: HashMap<&[u8], i64> = HashMap::default();
                for (i, kind) in kinds.iter().enumerate() {
                    let row = encoded.row(i).data();
                    let count = available.entry(row).or_insert_with(|| m.held(row, None));
                    match kind {
                        RowKind::Retract if *count > 0 => {
                            *count -= 1;
                            retracts.push(row);
                        }
                        RowKind::Retract | RowKind::Delete => rejected
                            .push((i, "a delete of a row the table does not hold".to_owned())),
                        RowKind::Insert | RowKind::Upsert => {
                            *count += 1;
                            inserts.push(i as u32);
                        }
                    }
                }
            }
            Some(pk) => {
                let Some(keys) = &keys else {
                    return Err(Error::internal("a keyed table's keys were not encoded"));
                };
                // Final value per key (None: deleted), in order of first appearance.
                let mut state: HashMap<&[u8], Option<usize>> = HashMap::default();
                let mut order: Vec<&[u8]> = Vec::new();
                for (i, kind) in kinds.iter().enumerate() {
                    let key = keys.row(i).data();
                    let held = state
                        .get(key)
                        .map_or_else(|| m.index.contains_key(key), |s| s.is_some());
                    let value = match kind {
                        RowKind::Insert if held => {
                            rejected.push((i, duplicate_key(pk, rows, i).message));
                            continue;
                        }
                        RowKind::Insert | RowKind::Upsert => Some(i),
                        RowKind::Delete | RowKind::Retract => None,
                    };
                    if state.insert(key, value).is_none() {
                        order.push(key);
                    }
                }
                for key in order {
                    let current = m.current(key);
                    let new = state.get(key).copied().flatten();
                    if let (Some(current), Some(new)) = (current, new)
                        && current == encoded.row(new).data()
                    {
                        continue;
                    }
                    if let Some(current) = current {
                        retracts.push(current);
                    }
                    if let Some(new) = new {
                        inserts.push(new as u32);
                    }
                }
            }
        }
        let parser = m.converter.parser();
        let old = m
            .converter
            .convert_rows(retracts.iter().map(|r| parser.parse(r)))
            .map_err(|e| arrow_error("decode rows", e))?;
        let new =
            arrow::compute::take_record_batch(rows, &arrow::array::UInt32Array::from(inserts))
                .map_err(|e| arrow_error("take rows", e))?;
        let columns = old
            .iter()
            .zip(new.columns())
            .map(|(a, b)| {
                arrow::compute::concat(&[a.as_ref(), b.as_ref()])
                    .map_err(|e| arrow_error("concat rows", e))
            })
            .collect::<Result<Vec<_>>>()?;
        let mut diffs = vec![-1; retracts.len()];
        diffs.resize(retracts.len() + new.num_rows(), 1);
        Ok((labelled(columns, diffs)?, rejected))
    }

    /// Of the rows an `UPDATE ... FROM` matched (`old`, one per matching FROM row), the ones
    /// to update: each held row once (the first match), as PostgreSQL updates it once.
    pub fn first_matches(&mut self, old: &RecordBatch) -> Result<Vec<u32>> {
        let Rows::Multiset(m) = &mut self.rows else {
            return Ok((0..old.num_rows() as u32).collect());
        };
        let mut keep = Vec::with_capacity(old.num_rows());
        match &m.primary_key {
            Some(pk) => {
                let keys = pk.encode(old)?;
                let mut seen: HashSet<&[u8]> = HashSet::default();
                for i in 0..old.num_rows() {
                    if seen.insert(keys.row(i).data()) {
                        keep.push(i as u32);
                    }
                }
            }
            None => {
                let rows = m
                    .converter
                    .convert_columns(old.columns())
                    .map_err(|e| arrow_error("encode rows", e))?;
                m.prepare_keys(&rows)?;
                let mut taken: HashMap<&[u8], i64> = HashMap::default();
                for i in 0..old.num_rows() {
                    let row = rows.row(i).data();
                    let held = m.held(row, None);
                    let n = taken.entry(row).or_insert(0);
                    if *n < held {
                        *n += 1;
                        keep.push(i as u32);
                    }
                }
            }
        }
        Ok(keep)
    }

    /// The same contents under a changed schema (a column's nullability changed).
    pub fn relabel(mut self, schema: SchemaRef) -> Result<TableData> {
        match &mut self.rows {
            Rows::AppendOnly(chunks) => chunks.relabel(Arc::clone(&schema))?,
            Rows::Log(l) => l.relabel(Arc::clone(&schema))?,
            Rows::Multiset(m) => m.chunks.relabel(Arc::clone(&schema))?,
        }
        Ok(TableData {
            schema,
            rows: self.rows,
            version: next_version(),
            snapshot: None,
            spill: self.spill,
        })
    }

    /// A private copy for an open transaction.
    pub fn fork(&self) -> Result<TableData> {
        let rows = match &self.rows {
            Rows::AppendOnly(b) => Rows::AppendOnly(b.clone()),
            Rows::Log(l) => Rows::Log(l.clone()),
            Rows::Multiset(m) => Rows::Multiset(Box::new(m.fork(&self.schema)?)),
        };
        Ok(TableData {
            schema: Arc::clone(&self.schema),
            rows,
            version: next_version(),
            snapshot: self.snapshot.clone(),
            spill: None,
        })
    }
}
