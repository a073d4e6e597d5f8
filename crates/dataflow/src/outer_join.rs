//! Outer, semi and anti joins, maintained by recomputing each touched join key.
//!
//! Both sides are arranged by key (multisets of rows). For every key a push touches, the
//! operator computes the key's output before and after applying the changes and emits the
//! difference: matched pairs (weights multiply), NULL-padded rows of a side with no match
//! (LEFT/RIGHT/FULL), or the side's rows with/without a match (SEMI/ANTI). A match is a pair
//! with equal keys whose residual filter is true. Rows whose key is NULL never match: their
//! padded/anti output follows their own weight directly. Cost per touched key is
//! |left rows| × |right rows| of that key.
//!
//! A window join of two streams (the window bounds are among the keys) forgets a whole key —
//! both sides at once, without changing its output — once both sides' watermarks show the
//! key's window can no longer change.

use std::collections::BTreeMap;

use crate::graph::{Barrier, Handler, Output as Emitted};
use crate::{StateMap as HashMap, StateSet as HashSet};
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, Int64Array, RecordBatch, UInt32Array, new_null_array,
};
use arrow::datatypes::SchemaRef;
use arrow::row::{OwnedRow, RowConverter, SortField};
use eddy_common::{ChangeBatch, Error, Result};

use crate::event_time::{EventTime, micros};
use crate::plan::{Expr, JoinKind, TimeBound};
use crate::rows::{arrow_error, batch, eval_error, evaluate, take_columns};
use crate::{OperatorState, checkpoint};

type Bucket = HashMap<OwnedRow, i64>;

struct Side {
    schema: SchemaRef,
    keys: Vec<Expr>,
    rows: RowConverter,
    /// NULL keys match each other (IS NOT DISTINCT FROM).
    nulls_equal: bool,
    key_converter: RowConverter,
    arrangement: HashMap<OwnedRow, Bucket>,
}

pub struct OuterJoin {
    /// The latest mark of each stream (in-band watermarks).
    marks: crate::event_time::Marks,
    kind: JoinKind,
    left: Side,
    right: Side,
    filter: Option<Expr>,
    schema: SchemaRef,
    /// Window joins: per side, when a key expires; keys by expiry time.
    bounds: Option<([TimeBound; 2], Arc<EventTime>)>,
    expiry: BTreeMap<i64, Vec<OwnedRow>>,
}

impl Side {
    fn new(schema: SchemaRef, keys: Vec<Expr>, nulls_equal: bool) -> Result<Self> {
        let fields = schema
            .fields()
            .iter()
            .map(|f| SortField::new(f.data_type().clone()))
            .collect();
        let key_fields = keys
            .iter()
            .map(|k| k.data_type(&schema).map(SortField::new))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(eval_error)?;
        let key_converter = RowConverter::new(key_fields).map_err(arrow_error)?;
        Ok(Side {
            schema,
            keys,
            rows: RowConverter::new(fields).map_err(arrow_error)?,
            nulls_equal,
            key_converter,
            arrangement: HashMap::default(),
        })
    }

    /// (key or None for NULL keys, row) per changed row.
    fn encode(&mut self, changes: &ChangeBatch) -> Result<Vec<(Option<OwnedRow>, OwnedRow)>> {
        let keys = crate::rows::evaluate_keys(&self.keys, changes.rows())?;
        let encoded_keys = self
            .key_converter
            .convert_columns(&keys)
            .map_err(arrow_error)?;
        let rows = self
            .rows
            .convert_columns(changes.rows().columns())
            .map_err(arrow_error)?;
        Ok((0..changes.len())
            .map(|i| {
                let key = if !self.nulls_equal && keys.iter().any(|k| k.is_null(i)) {
                    None
                } else {
                    Some(encoded_keys.row(i).owned())
                };
                (key, rows.row(i).owned())
            })
            .collect())
    }

    fn apply(&mut self, key: &OwnedRow, row: &OwnedRow, diff: i64) {
        let bucket = self.arrangement.entry(key.clone()).or_default();
        let count = bucket.entry(row.clone()).or_insert(0);
        *count += diff;
        if *count == 0 {
            bucket.remove(row);
            if bucket.is_empty() {
                self.arrangement.remove(key);
            }
        }
    }

    /// The arrangement as (key, row, count) columns.
    fn save(&self) -> Result<RecordBatch> {
        let entries: Vec<(&OwnedRow, &OwnedRow, i64)> = self
            .arrangement
            .iter()
            .flat_map(|(k, rows)| rows.iter().map(move |(r, n)| (k, r, *n)))
            .collect();
        let columns = vec![
            (
                "key",
                checkpoint::binary(entries.iter().map(|e| e.0.as_ref())),
            ),
            (
                "row",
                checkpoint::binary(entries.iter().map(|e| e.1.as_ref())),
            ),
            ("count", checkpoint::int64s(entries.iter().map(|e| e.2))),
        ];
        checkpoint::part(columns, &[])
    }

    fn load(&mut self, batch: &RecordBatch) -> Result<()> {
        let keys = checkpoint::required_rows(
            &self.key_converter,
            checkpoint::binary_column(batch, "key")?,
        )?;
        let rows = checkpoint::required_rows(&self.rows, checkpoint::binary_column(batch, "row")?)?;
        for ((key, row), n) in keys
            .into_iter()
            .zip(rows)
            .zip(checkpoint::int64_column(batch, "count")?.values())
        {
            self.arrangement.entry(key).or_default().insert(row, *n);
        }
        Ok(())
    }

    fn bucket(&self, key: &OwnedRow) -> Vec<(OwnedRow, i64)> {
        self.arrangement
            .get(key)
            .map(|b| b.iter().map(|(r, c)| (r.clone(), *c)).collect())
            .unwrap_or_default()
    }

    fn columns(&self, rows: &[(OwnedRow, i64)]) -> Result<Vec<ArrayRef>> {
        if rows.is_empty() {
            return Ok(self
                .schema
                .fields()
                .iter()
                .map(|f| new_null_array(f.data_type(), 0))
                .collect());
        }
        self.rows
            .convert_rows(rows.iter().map(|(r, _)| r.row()))
            .map_err(arrow_error)
    }

    fn nulls(&self, n: usize) -> Vec<ArrayRef> {
        self.schema
            .fields()
            .iter()
            .map(|f| new_null_array(f.data_type(), n))
            .collect()
    }
}

/// Output rows under construction: column chunks plus weights.
struct Output {
    chunks: Vec<(Vec<ArrayRef>, Vec<i64>)>,
}

impl Output {
    fn push(&mut self, columns: Vec<ArrayRef>, diffs: Vec<i64>) {
        if !diffs.is_empty() {
            self.chunks.push((columns, diffs));
        }
    }
}

impl OuterJoin {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        kind: JoinKind,
        nulls_equal: bool,
        left_schema: SchemaRef,
        right_schema: SchemaRef,
        left_keys: Vec<Expr>,
        right_keys: Vec<Expr>,
        filter: Option<Expr>,
        schema: SchemaRef,
    ) -> Result<Self> {
        Ok(OuterJoin {
            marks: crate::event_time::Marks::default(),
            kind,
            left: Side::new(left_schema, left_keys, nulls_equal)?,
            right: Side::new(right_schema, right_keys, nulls_equal)?,
            filter,
            schema,
            bounds: None,
            expiry: BTreeMap::new(),
        })
    }

    /// The output of one key, multiplied by `sign`.
    fn key_output(&self, key: &OwnedRow, sign: i64, out: &mut Output) -> Result<()> {
        let left = self.left.bucket(key);
        let right = self.right.bucket(key);
        let left_columns = self.left.columns(&left)?;
        let right_columns = self.right.columns(&right)?;
        // Every pair, and which pairs satisfy the residual filter.
        let (mut li, mut ri) = (Vec::new(), Vec::new());
        for i in 0..left.len() {
            for j in 0..right.len() {
                li.push(i as u32);
                ri.push(j as u32);
            }
        }
        let li = UInt32Array::from(li);
        let ri = UInt32Array::from(ri);
        let pairs = [
            take_columns(&left_columns, &li)?,
            take_columns(&right_columns, &ri)?,
        ]
        .concat();
        let matched: Vec<bool> = match &self.filter {
            None => vec![true; li.len()],
            Some(filter) if !li.is_empty() => {
                let pair_schema = Arc::new(arrow::datatypes::Schema::new(
                    self.left
                        .schema
                        .fields()
                        .iter()
                        .chain(self.right.schema.fields().iter())
                        .cloned()
                        .collect::<Vec<_>>(),
                ));
                let joined = batch(&pair_schema, pairs.clone())?;
                let mask = evaluate(filter, &joined)?;
                let mask = mask
                    .as_boolean_opt()
                    .ok_or_else(|| Error::internal("join filter is not boolean"))?;
                (0..mask.len())
                    .map(|k| mask.is_valid(k) && mask.value(k))
                    .collect()
            }
            Some(_) => Vec::new(),
        };
        let mut left_matched = vec![false; left.len()];
        let mut right_matched = vec![false; right.len()];
        let mut keep = Vec::new();
        let mut diffs = Vec::new();
        for (p, m) in matched.iter().enumerate() {
            if *m {
                let (i, j) = (li.value(p) as usize, ri.value(p) as usize);
                left_matched[i] = true;
                right_matched[j] = true;
                keep.push(p as u32);
                diffs.push(sign * left[i].1 * right[j].1);
            }
        }
        match self.kind {
            JoinKind::Left | JoinKind::Right | JoinKind::Full => {
                out.push(take_columns(&pairs, &UInt32Array::from(keep))?, diffs);
            }
            _ => {}
        }
        let unmatched = |flags: &[bool], want_matched: bool| -> Vec<u32> {
            flags
                .iter()
                .enumerate()
                .filter(|(_, m)| **m == want_matched)
                .map(|(i, _)| i as u32)
                .collect()
        };
        match self.kind {
            JoinKind::Left | JoinKind::Full => {
                let idx = unmatched(&left_matched, false);
                let d = idx.iter().map(|&i| sign * left[i as usize].1).collect();
                let cols = [
                    take_columns(&left_columns, &UInt32Array::from(idx.clone()))?,
                    self.right.nulls(idx.len()),
                ]
                .concat();
                out.push(cols, d);
            }
            _ => {}
        }
        match self.kind {
            JoinKind::Right | JoinKind::Full => {
                let idx = unmatched(&right_matched, false);
                let d = idx.iter().map(|&i| sign * right[i as usize].1).collect();
                let cols = [
                    self.left.nulls(idx.len()),
                    take_columns(&right_columns, &UInt32Array::from(idx.clone()))?,
                ]
                .concat();
                out.push(cols, d);
            }
            _ => {}
        }
        let side_rows = |columns: &[ArrayRef],
                         rows: &[(OwnedRow, i64)],
                         flags: &[bool],
                         want: bool,
                         out: &mut Output|
         -> Result<()> {
            let idx = unmatched(flags, want);
            let d = idx.iter().map(|&i| sign * rows[i as usize].1).collect();
            out.push(take_columns(columns, &UInt32Array::from(idx))?, d);
            Ok(())
        };
        match self.kind {
            JoinKind::LeftSemi => side_rows(&left_columns, &left, &left_matched, true, out)?,
            JoinKind::LeftAnti => side_rows(&left_columns, &left, &left_matched, false, out)?,
            JoinKind::RightSemi => side_rows(&right_columns, &right, &right_matched, true, out)?,
            JoinKind::RightAnti => side_rows(&right_columns, &right, &right_matched, false, out)?,
            _ => {}
        }
        Ok(())
    }

    /// Output of rows whose key is NULL: they never match.
    fn null_key_output(
        &self,
        left_side: bool,
        changes: &ChangeBatch,
        rows: &[usize],
        out: &mut Output,
    ) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        let idx = UInt32Array::from(rows.iter().map(|&i| i as u32).collect::<Vec<_>>());
        let cols = take_columns(changes.rows().columns(), &idx)?;
        let diffs: Vec<i64> = rows.iter().map(|&i| changes.diffs().value(i)).collect();
        let n = rows.len();
        match (self.kind, left_side) {
            (JoinKind::Left | JoinKind::Full, true) => {
                out.push([cols, self.right.nulls(n)].concat(), diffs)
            }
            (JoinKind::Right | JoinKind::Full, false) => {
                out.push([self.left.nulls(n), cols].concat(), diffs)
            }
            (JoinKind::LeftAnti, true) | (JoinKind::RightAnti, false) => out.push(cols, diffs),
            _ => {}
        }
        Ok(())
    }

    fn process(
        &mut self,
        left: Vec<ChangeBatch>,
        right: Vec<ChangeBatch>,
    ) -> Result<Vec<ChangeBatch>> {
        let mut out = Output { chunks: Vec::new() };
        let mut encoded = Vec::new();
        let mut touched: HashSet<OwnedRow> = HashSet::default();
        for (is_left, batches) in [(true, left), (false, right)] {
            for changes in batches {
                let side = if is_left {
                    &mut self.left
                } else {
                    &mut self.right
                };
                let rows = side.encode(&changes)?;
                let mut null_keyed = Vec::new();
                for (i, (key, _)) in rows.iter().enumerate() {
                    match key {
                        Some(k) => {
                            touched.insert(k.clone());
                        }
                        None => null_keyed.push(i),
                    }
                }
                self.null_key_output(is_left, &changes, &null_keyed, &mut out)?;
                encoded.push((is_left, changes, rows));
            }
        }
        for key in &touched {
            self.key_output(key, -1, &mut out)?;
        }
        for (is_left, changes, rows) in &encoded {
            let side = if *is_left {
                &mut self.left
            } else {
                &mut self.right
            };
            for (i, (key, row)) in rows.iter().enumerate() {
                if let Some(key) = key {
                    side.apply(key, row, changes.diffs().value(i));
                }
            }
        }
        for key in &touched {
            self.key_output(key, 1, &mut out)?;
        }
        if let Some((bounds, _)) = &self.bounds {
            for (is_left, changes, rows) in &encoded {
                let bound = &bounds[usize::from(!*is_left)];
                let times = micros(&evaluate(&bound.time, changes.rows())?)?;
                for (i, (key, _)) in rows.iter().enumerate() {
                    if let (Some(key), Some(t)) = (key, times[i]) {
                        self.expiry
                            .entry(t.saturating_add(bound.horizon_micros))
                            .or_default()
                            .push(key.clone());
                    }
                }
            }
        }
        out.chunks
            .into_iter()
            .map(|(columns, diffs)| {
                Ok(ChangeBatch::new(
                    batch(&self.schema, columns)?,
                    Int64Array::from(diffs),
                ))
            })
            .collect()
    }
}

impl OuterJoin {
    /// Makes this a window join of two streams whose keys expire by the watermarks.
    pub fn bound_by_time(&mut self, bounds: [TimeBound; 2], event_time: Arc<EventTime>) {
        self.bounds = Some((bounds, event_time));
    }

    /// Forgets keys whose window both sides' watermarks have passed (plus the lateness).
    fn evict(&mut self) {
        let Some(([l, r], _)) = &self.bounds else {
            return;
        };
        let mut sources = l.own.clone();
        sources.extend(r.own.iter().copied());
        let Some(watermark) = self.marks.min_of(&sources) else {
            return;
        };
        while let Some(entry) = self.expiry.first_entry() {
            if *entry.key() > watermark {
                break;
            }
            for key in entry.remove() {
                self.left.arrangement.remove(&key);
                self.right.arrangement.remove(&key);
            }
        }
    }
}

impl Handler for OuterJoin {
    crate::event_time::keeps_marks!();

    fn on_data(&mut self, input: usize, changes: ChangeBatch, out: &mut Emitted) -> Result<()> {
        let (left, right) = crate::graph::by_side(input, changes);
        for changes in self.process(left, right)? {
            out.data(changes);
        }
        Ok(())
    }

    fn on_barrier(&mut self, _barrier: &Barrier, _out: &mut Emitted) -> Result<()> {
        self.evict();
        Ok(())
    }

    fn name(&self) -> String {
        "OuterJoin".to_owned()
    }

    fn state(&self) -> OperatorState {
        let (left, right) = (
            crate::rows::arrangement_size(&self.left.arrangement),
            crate::rows::arrangement_size(&self.right.arrangement),
        );
        OperatorState {
            name: format!("{:?}Join", self.kind),
            rows: left.0 + right.0,
            bytes: left.1 + right.1,
        }
    }

    fn save(&mut self) -> Result<checkpoint::Parts> {
        let entries: Vec<(i64, &OwnedRow)> = self
            .expiry
            .iter()
            .flat_map(|(t, keys)| keys.iter().map(move |k| (*t, k)))
            .collect();
        let expiry = vec![
            ("time", checkpoint::int64s(entries.iter().map(|e| e.0))),
            (
                "key",
                checkpoint::binary(entries.iter().map(|e| e.1.as_ref())),
            ),
        ];
        Ok(vec![
            ("left", self.left.save()?),
            ("right", self.right.save()?),
            ("expiry", checkpoint::part(expiry, &[])?),
        ])
    }

    /// The expiry part holds join keys in the left side's format, as its load reads them.
    fn part_keys(&mut self, name: &str, batch: &RecordBatch) -> Result<Option<Vec<ArrayRef>>> {
        let side = if name == "right" {
            &self.right
        } else {
            &self.left
        };
        checkpoint::key_columns(&side.key_converter, batch, "key")
    }

    fn load(&mut self, name: &str, batch: &RecordBatch) -> Result<()> {
        match name {
            "left" => self.left.load(batch),
            "right" => self.right.load(batch),
            "expiry" => {
                let keys = checkpoint::required_rows(
                    &self.left.key_converter,
                    checkpoint::binary_column(batch, "key")?,
                )?;
                for (key, t) in keys
                    .into_iter()
                    .zip(checkpoint::int64_column(batch, "time")?.values())
                {
                    self.expiry.entry(*t).or_default().push(key);
                }
                Ok(())
            }
            _ => Err(checkpoint::unknown_part("OuterJoin", name)),
        }
    }
}
