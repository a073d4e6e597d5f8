//! A table's current contents, kept in memory and rebuilt from its log on start-up.
//!
//! Append-only tables keep their rows in their log, not in memory ([`LogRows`]); a view's
//! contents that only ever got inserts keep their batches as written. Other tables keep a
//! multiset of rows in arrow's row format (plus a primary-key index when they have one), so
//! that retractions find their rows. Invariant: applying a change batch is all-or-nothing — [`TableData::check`]
//! validates it against the current contents before [`TableData::apply`] changes anything.

use std::collections::HashSet;

/// Rows and keys hash with foldhash: they are Eddy's own encodings, hashed on every change.
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, RecordBatch};
use arrow::datatypes::SchemaRef;
use arrow::row::{RowConverter, SortField};
use eddy_common::{ChangeBatch, Error, Result, SqlState};
use eddy_connectors::RowKind;

use eddy_dataflow::arrangement::{Arrangement, NEVER};

use crate::catalog::TableDef;
use crate::table_chunks::{Chunks, Loc, Moved};
use crate::table_log::{LogRows, LogScan};

pub struct TableData {
    schema: SchemaRef,
    rows: Rows,
    /// Changes with every write (unique across tables and their copies): a statement's
    /// snapshot is still the contents while this is the version it was taken at.
    version: u64,
    /// The contents as batches, built on demand and dropped on every change.
    snapshot: Option<Arc<Vec<RecordBatch>>>,
}

enum Rows {
    AppendOnly(Vec<RecordBatch>),
    Log(LogRows),
    Multiset(Box<Multiset>),
}

/// What a scan of a table reads: rows in memory (as of `version`, see
/// [`TableData::lookup`]), or an append-only table's log.
pub enum TableScan {
    Rows {
        rows: Arc<Vec<RecordBatch>>,
        version: u64,
    },
    Log(Arc<LogScan>),
}

/// The next [`TableData::version`].
fn next_version() -> u64 {
    static VERSION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    VERSION.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

struct Multiset {
    converter: RowConverter,
    /// Key (the primary key's bytes, or the row's bytes on a table without one) -> one entry
    /// per row held: its location ([`Loc`]), then on a keyed table the row's bytes.
    index: Arrangement,
    chunks: Chunks,
    primary_key: Option<PrimaryKey>,
}

/// The net weight of one distinct row within a set of change batches.
struct NetChange {
    /// (batch, row) of its first occurrence: its bytes, and to quote it in errors.
    origin: (usize, usize),
    diff: i64,
}

struct PrimaryKey {
    columns: Vec<usize>,
    converter: RowConverter,
    constraint_name: String,
    column_names: Vec<String>,
}

fn arrow_error(context: &str, err: arrow::error::ArrowError) -> Error {
    Error::internal(format!("{context}: {err}"))
}

impl TableData {
    pub fn new(def: &TableDef, schema: SchemaRef) -> Result<Self> {
        let rows = if def.append_only {
            Rows::AppendOnly(Vec::new())
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
        })
    }

    /// The contents of a materialized view: its output batches as they come while it only
    /// inserts (no row encoding, no hashing: a pass-through or filter view costs a copy of
    /// pointers), a multiset of rows from its first retraction on.
    pub fn for_view(schema: SchemaRef) -> Self {
        TableData {
            schema,
            rows: Rows::AppendOnly(Vec::new()),
            version: next_version(),
            snapshot: None,
        }
    }

    /// Checks a view's epoch output against its contents: a retraction of a row the view does
    /// not hold is a bug in the dataflow, never a user error.
    pub fn check_view_output(&mut self, changes: &[ChangeBatch]) -> Result<()> {
        if matches!(self.rows, Rows::AppendOnly(_))
            && changes
                .iter()
                .any(|c| c.diffs().values().iter().any(|d| *d != 1))
        {
            self.make_multiset()?;
        }
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
        if matches!(self.rows, Rows::AppendOnly(_))
            && changes
                .iter()
                .any(|c| c.diffs().values().iter().any(|d| *d != 1))
        {
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

    /// Turns batches of inserted rows into a multiset (a view's first retraction or repeat).
    fn make_multiset(&mut self) -> Result<()> {
        let Rows::AppendOnly(batches) = &self.rows else {
            return Ok(());
        };
        let mut multiset = Multiset::new(&self.schema, None)?;
        let inserts: Vec<ChangeBatch> = batches.iter().cloned().map(ChangeBatch::inserts).collect();
        multiset.apply(&inserts)?;
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

    pub fn row_count(&self) -> usize {
        match &self.rows {
            Rows::AppendOnly(batches) => batches.iter().map(|b| b.num_rows()).sum(),
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
                rows: self.snapshot()?,
                version: self.version,
            }),
        }
    }

    /// The current contents, as an immutable snapshot in memory.
    pub fn snapshot(&mut self) -> Result<Arc<Vec<RecordBatch>>> {
        if let Some(s) = &self.snapshot {
            return Ok(Arc::clone(s));
        }
        let batches = match &mut self.rows {
            Rows::AppendOnly(batches) => batches.clone(),
            // Not cached: the rows are not to be held.
            Rows::Log(l) => return Ok(Arc::new(l.scan()?.collect()?)),
            Rows::Multiset(m) => m.chunks.scan()?,
        };
        let snapshot = Arc::new(batches);
        self.snapshot = Some(Arc::clone(&snapshot));
        Ok(snapshot)
    }

    /// The rows of a keyed table whose primary key is `key` (one array per key column, of
    /// its type), found by the index, if the table is still as it was at `version`; `None`
    /// otherwise (or without a primary key): the caller scans its snapshot instead.
    pub fn lookup(&self, version: u64, key: &[ArrayRef]) -> Result<Option<Vec<RecordBatch>>> {
        let Rows::Multiset(m) = &self.rows else {
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
        let rows = RecordBatch::try_new_with_options(Arc::clone(&self.schema), columns, &options)
            .map_err(|e| arrow_error("looked-up rows", e))?;
        Ok(Some(vec![rows]))
    }

    /// Checks that `changes` can be applied: retracted rows exist, no primary key repeats.
    pub fn check(&self, changes: &[ChangeBatch]) -> Result<()> {
        match &self.rows {
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
            Rows::AppendOnly(batches) => {
                for rows in changes
                    .iter()
                    .filter(|c| !c.is_empty())
                    .map(ChangeBatch::rows)
                {
                    // Under this table's (or view's) column names.
                    let options = arrow::array::RecordBatchOptions::new()
                        .with_row_count(Some(rows.num_rows()));
                    batches.push(
                        RecordBatch::try_new_with_options(
                            Arc::clone(&self.schema),
                            rows.columns().to_vec(),
                            &options,
                        )
                        .map_err(|e| arrow_error("appended rows", e))?,
                    );
                }
                Ok(())
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
        &self,
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
        let m = match &self.rows {
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
                let keys = pk.encode(rows)?;
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
    pub fn first_matches(&self, old: &RecordBatch) -> Result<Vec<u32>> {
        let Rows::Multiset(m) = &self.rows else {
            return Ok((0..old.num_rows() as u32).collect());
        };
        let mut keep = Vec::with_capacity(old.num_rows());
        match &m.primary_key {
            Some(pk) => {
                let keys = pk.encode(old)?;
                let mut seen: HashSet<&[u8]> = HashSet::new();
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
            Rows::AppendOnly(batches) => {
                for b in batches.iter_mut() {
                    *b = RecordBatch::try_new(Arc::clone(&schema), b.columns().to_vec())
                        .map_err(|e| arrow_error("relabel rows", e))?;
                }
            }
            Rows::Log(l) => l.relabel(Arc::clone(&schema))?,
            Rows::Multiset(m) => m.chunks.relabel(Arc::clone(&schema))?,
        }
        Ok(TableData {
            schema,
            rows: self.rows,
            version: next_version(),
            snapshot: None,
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
        })
    }
}

/// A change batch's rows and primary keys in arrow's row format.
struct Encoded {
    rows: arrow::row::Rows,
    keys: Option<arrow::row::Rows>,
}

impl Multiset {
    fn new(schema: &SchemaRef, primary_key: Option<(&[usize], &str)>) -> Result<Multiset> {
        let fields = schema
            .fields()
            .iter()
            .map(|f| SortField::new(f.data_type().clone()))
            .collect();
        let converter = RowConverter::new(fields).map_err(|e| arrow_error("row converter", e))?;
        let primary_key = match primary_key {
            None => None,
            Some((columns, table)) => {
                let fields = columns
                    .iter()
                    .map(|&i| SortField::new(schema.field(i).data_type().clone()))
                    .collect();
                Some(PrimaryKey {
                    columns: columns.to_vec(),
                    converter: RowConverter::new(fields)
                        .map_err(|e| arrow_error("key converter", e))?,
                    constraint_name: format!("{table}_pkey"),
                    column_names: columns
                        .iter()
                        .map(|&i| schema.field(i).name().clone())
                        .collect(),
                })
            }
        };
        Ok(Multiset {
            converter,
            index: Arrangement::new(),
            chunks: Chunks::new(Arc::clone(schema)),
            primary_key,
        })
    }

    fn fork(&self, schema: &SchemaRef) -> Result<Multiset> {
        let mut fork = Multiset::new(
            schema,
            self.primary_key
                .as_ref()
                .map(|pk| (pk.columns.as_slice(), "")),
        )?;
        if let (Some(new), Some(old)) = (fork.primary_key.as_mut(), &self.primary_key) {
            new.constraint_name.clone_from(&old.constraint_name);
        }
        fork.index = self.index.clone();
        fork.chunks = self.chunks.clone();
        Ok(fork)
    }

    /// Copies of `row` held (its primary key `key` on a keyed table).
    fn held(&self, row: &[u8], key: Option<&[u8]>) -> i64 {
        match key {
            Some(key) => self
                .index
                .probe(key)
                .filter(|f| &f.row[LOC..] == row)
                .count() as i64,
            None => self.index.probe(row).count() as i64,
        }
    }

    /// The row a keyed table holds under `key`.
    fn current(&self, key: &[u8]) -> Option<&[u8]> {
        self.index.probe(key).next().map(|f| &f.row[LOC..])
    }

    fn encode(&self, batch: &RecordBatch) -> Result<Encoded> {
        let rows = self
            .converter
            .convert_columns(batch.columns())
            .map_err(|e| arrow_error("encode rows", e))?;
        let keys = match &self.primary_key {
            None => None,
            Some(pk) => Some(pk.encode(batch)?),
        };
        Ok(Encoded { rows, keys })
    }

    /// Sums the weights per distinct row, so that a transaction's insert-then-delete of one row
    /// nets to nothing whatever the order of its statements.
    fn net(&self, changes: &[ChangeBatch]) -> Result<(Vec<Encoded>, Vec<NetChange>)> {
        let encoded = changes
            .iter()
            .map(|c| self.encode(c.rows()))
            .collect::<Result<Vec<_>>>()?;
        let mut by_row: HashMap<&[u8], usize> = HashMap::default();
        let mut out: Vec<NetChange> = Vec::new();
        for (b, batch) in changes.iter().enumerate() {
            for (i, diff) in batch.diffs().values().iter().enumerate() {
                let row = encoded[b].rows.row(i).data();
                match by_row.get(row) {
                    Some(&at) => out[at].diff += diff,
                    None => {
                        by_row.insert(row, out.len());
                        out.push(NetChange {
                            origin: (b, i),
                            diff: *diff,
                        });
                    }
                }
            }
        }
        drop(by_row);
        out.retain(|c| c.diff != 0);
        Ok((encoded, out))
    }

    fn check(&self, changes: &[ChangeBatch]) -> Result<()> {
        let (encoded, net) = self.net(changes)?;
        self.check_net(changes, &encoded, &net)
    }

    /// [`Multiset::check`] then [`Multiset::apply`], netting the changes once; a failed check
    /// (mapped by `on_check`) leaves the multiset as it was.
    fn check_and_apply(
        &mut self,
        changes: &[ChangeBatch],
        on_check: impl FnOnce(Error) -> Error,
    ) -> Result<()> {
        let (encoded, net) = self.net(changes)?;
        self.check_net(changes, &encoded, &net).map_err(on_check)?;
        self.apply_net(&encoded, &net)
    }

    fn check_net(
        &self,
        changes: &[ChangeBatch],
        encoded: &[Encoded],
        net: &[NetChange],
    ) -> Result<()> {
        for change in net.iter().filter(|c| c.diff < 0) {
            if self.held(change.row(encoded), change.key(encoded)) < -change.diff {
                return Err(Error::new(
                    SqlState::SERIALIZATION_FAILURE,
                    "could not serialize access due to concurrent update",
                ));
            }
        }
        let Some(pk) = &self.primary_key else {
            return Ok(());
        };
        // Retractions first, so that an update may move a row onto a key it frees.
        let freed: HashSet<&[u8]> = net
            .iter()
            .filter(|c| c.diff < 0)
            .filter_map(|c| c.key(encoded))
            .collect();
        let mut added: HashSet<&[u8]> = HashSet::new();
        for change in net.iter().filter(|c| c.diff > 0) {
            let Some(key) = change.key(encoded) else {
                continue;
            };
            let taken = self.index.contains_key(key) && !freed.contains(key);
            if change.diff > 1 || taken || !added.insert(key) {
                let (b, i) = change.origin;
                return Err(duplicate_key(pk, changes[b].rows(), i));
            }
        }
        Ok(())
    }

    fn apply(&mut self, changes: &[ChangeBatch]) -> Result<()> {
        let (encoded, net) = self.net(changes)?;
        self.apply_net(&encoded, &net)
    }

    fn apply_net(&mut self, encoded: &[Encoded], net: &[NetChange]) -> Result<()> {
        let mut entry = Vec::new();
        let mut rewrite = Vec::new();
        for change in net.iter().filter(|c| c.diff < 0) {
            let row = change.row(encoded);
            let key = change.key(encoded).unwrap_or(row);
            for _ in 0..-change.diff {
                let found = self
                    .index
                    .probe(key)
                    .find(|f| self.primary_key.is_none() || &f.row[LOC..] == row)
                    .map(|f| Loc::from_bytes(f.row));
                let Some(loc) = found else {
                    return Err(Error::new(
                        SqlState::DATA_CORRUPTED,
                        "the log retracts a row the table does not hold",
                    ));
                };
                self.index_update(key, loc, row, -1, &mut entry)?;
                rewrite.extend(self.chunks.delete(loc)?);
            }
        }
        let parser = self.converter.parser();
        let inserted: Vec<&NetChange> = net
            .iter()
            .filter(|c| c.diff > 0)
            .flat_map(|c| std::iter::repeat_n(c, c.diff as usize))
            .collect();
        if !inserted.is_empty() {
            let columns = self
                .converter
                .convert_rows(inserted.iter().map(|c| parser.parse(c.row(encoded))))
                .map_err(|e| arrow_error("decode rows", e))?;
            let batch = RecordBatch::try_new(Arc::clone(self.chunks.schema()), columns)
                .map_err(|e| arrow_error("inserted rows", e))?;
            let mut placed = Vec::with_capacity(inserted.len());
            self.chunks.append(&batch, &mut placed)?;
            for (change, loc) in inserted.iter().zip(placed) {
                let row = change.row(encoded);
                let key = change.key(encoded).unwrap_or(row);
                self.index_update(key, loc, row, 1, &mut entry)?;
            }
        }
        rewrite.sort_unstable();
        rewrite.dedup();
        for chunk in rewrite {
            if let Some(moved) = self.chunks.rewrite(chunk)? {
                self.repoint(&moved, &mut entry)?;
            }
        }
        Ok(())
    }

    /// Adds `weight` to the index entry of `row` (under `key`) at `loc`.
    fn index_update(
        &mut self,
        key: &[u8],
        loc: Loc,
        row: &[u8],
        weight: i64,
        entry: &mut Vec<u8>,
    ) -> Result<()> {
        entry.clear();
        entry.extend_from_slice(&loc.to_bytes());
        if self.primary_key.is_some() {
            entry.extend_from_slice(row);
        }
        self.index.update(key, entry, 0, weight, NEVER)?;
        Ok(())
    }

    /// Points the index at the rows of a rewritten chunk.
    fn repoint(&mut self, moved: &Moved, entry: &mut Vec<u8>) -> Result<()> {
        let encoded = self.encode(&moved.batch)?;
        for (to, &from) in moved.from.iter().enumerate() {
            if to as u32 == from {
                continue;
            }
            let row = encoded.rows.row(to);
            let row = row.data();
            let key = encoded.keys.as_ref().map(|k| k.row(to));
            let key = key.as_ref().map_or(row, |k| k.data());
            let (old, new) = (
                Loc {
                    chunk: moved.chunk,
                    row: from,
                },
                Loc {
                    chunk: moved.chunk,
                    row: to as u32,
                },
            );
            self.index_update(key, old, row, -1, entry)?;
            self.index_update(key, new, row, 1, entry)?;
        }
        Ok(())
    }
}

/// Bytes of a location at the start of an index entry.
const LOC: usize = 8;

impl PrimaryKey {
    fn encode(&self, batch: &RecordBatch) -> Result<arrow::row::Rows> {
        let columns: Vec<ArrayRef> = self
            .columns
            .iter()
            .map(|&i| Arc::clone(batch.column(i)))
            .collect();
        self.converter
            .convert_columns(&columns)
            .map_err(|e| arrow_error("encode keys", e))
    }
}

impl NetChange {
    fn row<'a>(&self, encoded: &'a [Encoded]) -> &'a [u8] {
        encoded[self.origin.0].rows.row(self.origin.1).data()
    }

    fn key<'a>(&self, encoded: &'a [Encoded]) -> Option<&'a [u8]> {
        encoded[self.origin.0]
            .keys
            .as_ref()
            .map(|k| k.row(self.origin.1).data())
    }
}

fn duplicate_key(pk: &PrimaryKey, rows: &RecordBatch, row: usize) -> Error {
    let values: Vec<String> = pk
        .columns
        .iter()
        .map(|&c| {
            let column = rows.column(c);
            if column.is_null(row) {
                "null".to_owned()
            } else {
                arrow::util::display::array_value_to_string(column, row)
                    .unwrap_or_else(|_| "?".into())
            }
        })
        .collect();
    Error::new(
        SqlState::UNIQUE_VIOLATION,
        format!(
            "duplicate key value violates unique constraint \"{}\"",
            pk.constraint_name
        ),
    )
    .with_detail(format!(
        "Key ({})=({}) already exists.",
        pk.column_names.join(", "),
        values.join(", ")
    ))
}
