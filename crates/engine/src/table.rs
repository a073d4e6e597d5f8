//! A table's current contents, kept in memory and rebuilt from its log on start-up.
//!
//! Append-only tables keep their batches as written. Other tables keep a multiset of rows in
//! arrow's row format (plus a primary-key index when they have one), so that retractions find
//! their rows. Invariant: applying a change batch is all-or-nothing — [`TableData::check`]
//! validates it against the current contents before [`TableData::apply`] changes anything.

use std::collections::HashSet;

/// Rows and keys hash with foldhash: they are Eddy's own encodings, hashed on every change.
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, RecordBatch};
use arrow::datatypes::SchemaRef;
use arrow::row::{RowConverter, SortField};
use eddy_common::{ChangeBatch, Error, Result, SqlState, limits};
use eddy_connectors::RowKind;

use crate::catalog::TableDef;

pub struct TableData {
    schema: SchemaRef,
    rows: Rows,
    /// The contents as batches, built on demand and dropped on every change.
    snapshot: Option<Arc<Vec<RecordBatch>>>,
}

enum Rows {
    AppendOnly(Vec<RecordBatch>),
    Multiset(Box<Multiset>),
}

struct Multiset {
    converter: RowConverter,
    /// Row bytes -> multiplicity (always > 0).
    counts: HashMap<Box<[u8]>, i64>,
    primary_key: Option<PrimaryKey>,
}

/// The net weight of one distinct row within a set of change batches.
struct NetChange {
    row: Box<[u8]>,
    key: Option<Box<[u8]>>,
    diff: i64,
    /// (batch, row) of its first occurrence, to quote it in errors.
    origin: (usize, usize),
}

struct PrimaryKey {
    columns: Vec<usize>,
    converter: RowConverter,
    /// Key bytes -> row bytes.
    index: HashMap<Box<[u8]>, Box<[u8]>>,
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
            let fields = schema
                .fields()
                .iter()
                .map(|f| SortField::new(f.data_type().clone()))
                .collect();
            let converter =
                RowConverter::new(fields).map_err(|e| arrow_error("row converter", e))?;
            let primary_key = if def.primary_key.is_empty() {
                None
            } else {
                let fields = def
                    .primary_key
                    .iter()
                    .map(|&i| SortField::new(schema.field(i).data_type().clone()))
                    .collect();
                Some(PrimaryKey {
                    columns: def.primary_key.clone(),
                    converter: RowConverter::new(fields)
                        .map_err(|e| arrow_error("key converter", e))?,
                    index: HashMap::default(),
                    constraint_name: format!("{}_pkey", def.name),
                    column_names: def
                        .primary_key
                        .iter()
                        .map(|&i| schema.field(i).name().clone())
                        .collect(),
                })
            };
            Rows::Multiset(Box::new(Multiset {
                converter,
                counts: HashMap::default(),
                primary_key,
            }))
        };
        Ok(TableData {
            schema,
            rows,
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

    /// Turns batches of inserted rows into a multiset (a view's first retraction or repeat).
    fn make_multiset(&mut self) -> Result<()> {
        let Rows::AppendOnly(batches) = &self.rows else {
            return Ok(());
        };
        let fields = self
            .schema
            .fields()
            .iter()
            .map(|f| SortField::new(f.data_type().clone()))
            .collect();
        let converter = RowConverter::new(fields).map_err(|e| arrow_error("row converter", e))?;
        let mut multiset = Multiset {
            converter,
            counts: HashMap::default(),
            primary_key: None,
        };
        let inserts: Vec<ChangeBatch> = batches.iter().cloned().map(ChangeBatch::inserts).collect();
        multiset.apply(&inserts)?;
        self.rows = Rows::Multiset(Box::new(multiset));
        self.snapshot = None;
        Ok(())
    }

    pub fn row_count(&self) -> usize {
        match &self.rows {
            Rows::AppendOnly(batches) => batches.iter().map(|b| b.num_rows()).sum(),
            Rows::Multiset(m) => m.counts.values().map(|c| *c as usize).sum(),
        }
    }

    /// The current contents, as an immutable snapshot.
    pub fn snapshot(&mut self) -> Result<Arc<Vec<RecordBatch>>> {
        if let Some(s) = &self.snapshot {
            return Ok(Arc::clone(s));
        }
        let batches = match &self.rows {
            Rows::AppendOnly(batches) => batches.clone(),
            Rows::Multiset(m) => m.to_batches(&self.schema)?,
        };
        let snapshot = Arc::new(batches);
        self.snapshot = Some(Arc::clone(&snapshot));
        Ok(snapshot)
    }

    /// Checks that `changes` can be applied: retracted rows exist, no primary key repeats.
    pub fn check(&self, changes: &[ChangeBatch]) -> Result<()> {
        match &self.rows {
            Rows::AppendOnly(_) => {
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

    /// Applies changes that [`TableData::check`] accepted.
    pub fn apply(&mut self, changes: &[ChangeBatch]) -> Result<()> {
        self.snapshot = None;
        match &mut self.rows {
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
            Rows::AppendOnly(_) => {
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
        let mut retracts: Vec<Box<[u8]>> = Vec::new();
        match &m.primary_key {
            None => {
                // Copies of a row available to retract: held, plus inserted earlier in the chunk.
                let mut available: HashMap<&[u8], i64> = HashMap::default();
                for (i, kind) in kinds.iter().enumerate() {
                    let row = encoded.row(i).data();
                    let count = available
                        .entry(row)
                        .or_insert_with(|| m.counts.get(row).copied().unwrap_or(0));
                    match kind {
                        RowKind::Retract if *count > 0 => {
                            *count -= 1;
                            retracts.push(row.into());
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
                let keys: Vec<ArrayRef> = pk
                    .columns
                    .iter()
                    .map(|&c| Arc::clone(rows.column(c)))
                    .collect();
                let keys = pk
                    .converter
                    .convert_columns(&keys)
                    .map_err(|e| arrow_error("encode keys", e))?;
                // Final value per key (None: deleted), in order of first appearance.
                let mut state: HashMap<&[u8], Option<usize>> = HashMap::default();
                let mut order: Vec<&[u8]> = Vec::new();
                for (i, kind) in kinds.iter().enumerate() {
                    let key = keys.row(i).data();
                    let held = state
                        .get(key)
                        .map_or_else(|| pk.index.contains_key(key), |s| s.is_some());
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
                    let current = pk.index.get(key);
                    let new = state.get(key).copied().flatten();
                    if let (Some(current), Some(new)) = (current, new)
                        && current.as_ref() == encoded.row(new).data()
                    {
                        continue;
                    }
                    if let Some(current) = current {
                        retracts.push(current.clone());
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
                let keys: Vec<ArrayRef> = pk
                    .columns
                    .iter()
                    .map(|&c| Arc::clone(old.column(c)))
                    .collect();
                let keys = pk
                    .converter
                    .convert_columns(&keys)
                    .map_err(|e| arrow_error("encode keys", e))?;
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
                    let held = m.counts.get(row).copied().unwrap_or(0);
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
    pub fn relabel(mut self, schema: SchemaRef) -> TableData {
        if let Rows::AppendOnly(batches) = &mut self.rows {
            for b in batches.iter_mut() {
                if let Ok(relabelled) =
                    RecordBatch::try_new(Arc::clone(&schema), b.columns().to_vec())
                {
                    *b = relabelled;
                }
            }
        }
        TableData {
            schema,
            rows: self.rows,
            snapshot: None,
        }
    }

    /// A private copy for an open transaction.
    pub fn fork(&self) -> Result<TableData> {
        let rows = match &self.rows {
            Rows::AppendOnly(b) => Rows::AppendOnly(b.clone()),
            Rows::Multiset(m) => Rows::Multiset(Box::new(m.fork(&self.schema)?)),
        };
        Ok(TableData {
            schema: Arc::clone(&self.schema),
            rows,
            snapshot: self.snapshot.clone(),
        })
    }
}

impl Multiset {
    fn fork(&self, schema: &SchemaRef) -> Result<Multiset> {
        let fields = schema
            .fields()
            .iter()
            .map(|f| SortField::new(f.data_type().clone()))
            .collect();
        let converter = RowConverter::new(fields).map_err(|e| arrow_error("row converter", e))?;
        let primary_key = match &self.primary_key {
            None => None,
            Some(pk) => {
                let fields = pk
                    .columns
                    .iter()
                    .map(|&i| SortField::new(schema.field(i).data_type().clone()))
                    .collect();
                Some(PrimaryKey {
                    columns: pk.columns.clone(),
                    converter: RowConverter::new(fields)
                        .map_err(|e| arrow_error("key converter", e))?,
                    index: pk.index.clone(),
                    constraint_name: pk.constraint_name.clone(),
                    column_names: pk.column_names.clone(),
                })
            }
        };
        Ok(Multiset {
            converter,
            counts: self.counts.clone(),
            primary_key,
        })
    }

    fn encode(&self, batch: &ChangeBatch) -> Result<(arrow::row::Rows, Option<arrow::row::Rows>)> {
        let rows = self
            .converter
            .convert_columns(batch.rows().columns())
            .map_err(|e| arrow_error("encode rows", e))?;
        let keys = match &self.primary_key {
            None => None,
            Some(pk) => {
                let columns: Vec<ArrayRef> = pk
                    .columns
                    .iter()
                    .map(|&i| Arc::clone(batch.rows().column(i)))
                    .collect();
                Some(
                    pk.converter
                        .convert_columns(&columns)
                        .map_err(|e| arrow_error("encode keys", e))?,
                )
            }
        };
        Ok((rows, keys))
    }

    /// Sums the weights per distinct row, so that a transaction's insert-then-delete of one row
    /// nets to nothing whatever the order of its statements.
    fn net(&self, changes: &[ChangeBatch]) -> Result<Vec<NetChange>> {
        let mut by_row: HashMap<Box<[u8]>, usize> = HashMap::default();
        let mut out: Vec<NetChange> = Vec::new();
        for (b, batch) in changes.iter().enumerate() {
            let (rows, keys) = self.encode(batch)?;
            for (i, diff) in batch.diffs().values().iter().enumerate() {
                let row = rows.row(i).data();
                match by_row.get(row) {
                    Some(&at) => out[at].diff += diff,
                    None => {
                        by_row.insert(row.into(), out.len());
                        out.push(NetChange {
                            row: row.into(),
                            key: keys.as_ref().map(|k| k.row(i).data().into()),
                            diff: *diff,
                            origin: (b, i),
                        });
                    }
                }
            }
        }
        out.retain(|c| c.diff != 0);
        Ok(out)
    }

    fn check(&self, changes: &[ChangeBatch]) -> Result<()> {
        let net = self.net(changes)?;
        for change in net.iter().filter(|c| c.diff < 0) {
            if self.counts.get(&change.row).copied().unwrap_or(0) < -change.diff {
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
            .filter_map(|c| c.key.as_deref())
            .collect();
        let mut added: HashSet<&[u8]> = HashSet::new();
        for change in net.iter().filter(|c| c.diff > 0) {
            let Some(key) = change.key.as_deref() else {
                continue;
            };
            let taken = pk.index.contains_key(key) && !freed.contains(key);
            if change.diff > 1 || taken || !added.insert(key) {
                let (b, i) = change.origin;
                return Err(duplicate_key(pk, changes[b].rows(), i));
            }
        }
        Ok(())
    }

    fn apply(&mut self, changes: &[ChangeBatch]) -> Result<()> {
        let net = self.net(changes)?;
        for change in net.iter().filter(|c| c.diff < 0) {
            self.retract(&change.row, -change.diff, change.key.as_deref())?;
        }
        for change in net.into_iter().filter(|c| c.diff > 0) {
            if let (Some(pk), Some(key)) = (self.primary_key.as_mut(), change.key) {
                pk.index.insert(key, change.row.clone());
            }
            *self.counts.entry(change.row).or_default() += change.diff;
        }
        Ok(())
    }

    fn retract(&mut self, row: &[u8], count: i64, key: Option<&[u8]>) -> Result<()> {
        let Some(current) = self.counts.get_mut(row) else {
            return Err(Error::new(
                SqlState::DATA_CORRUPTED,
                "the log retracts a row the table does not hold",
            ));
        };
        *current -= count;
        if *current < 0 {
            return Err(Error::new(
                SqlState::DATA_CORRUPTED,
                "the log retracts a row more often than it was inserted",
            ));
        }
        if *current == 0 {
            self.counts.remove(row);
        }
        if let (Some(pk), Some(key)) = (self.primary_key.as_mut(), key) {
            pk.index.remove(key);
        }
        Ok(())
    }

    fn to_batches(&self, schema: &SchemaRef) -> Result<Vec<RecordBatch>> {
        let parser = self.converter.parser();
        let mut out = Vec::new();
        let mut pending = Vec::with_capacity(limits::BATCH_ROWS_MAX.min(self.counts.len()));
        let mut flush = |pending: &mut Vec<arrow::row::Row<'_>>| -> Result<()> {
            if pending.is_empty() {
                return Ok(());
            }
            let columns = self
                .converter
                .convert_rows(pending.drain(..))
                .map_err(|e| arrow_error("decode rows", e))?;
            out.push(
                RecordBatch::try_new(Arc::clone(schema), columns)
                    .map_err(|e| arrow_error("snapshot batch", e))?,
            );
            Ok(())
        };
        for (bytes, count) in &self.counts {
            for _ in 0..*count {
                pending.push(parser.parse(bytes));
                if pending.len() >= limits::BATCH_ROWS_MAX {
                    flush(&mut pending)?;
                }
            }
        }
        flush(&mut pending)?;
        Ok(out)
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
