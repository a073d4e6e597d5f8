//! Top-N: `ORDER BY ... LIMIT n [OFFSET m]`, and per partition (`ROW_NUMBER() | RANK() |
//! DENSE_RANK() OVER (PARTITION BY ... ORDER BY ...) <= n`), maintained under inserts and
//! retractions.
//!
//! State: per partition, every input row with its multiplicity, ordered by (sort key, row) in
//! arrow's row format (which encodes ASC/DESC and NULLS FIRST/LAST). At the end of an epoch the
//! operator walks the first `offset + limit` rows of each changed partition and emits the
//! difference with what it emitted before. Ties in the sort key are broken by the row's bytes,
//! deterministically; identical rows get consecutive row numbers. Over an append-only input a
//! row past the top of its partition can never return (rows only arrive), so each partition
//! keeps only its top rows.

use std::collections::BTreeMap;

use crate::graph::{Barrier, Handler, Output};
use crate::{StateMap as HashMap, StateSet as HashSet};
use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Array, RecordBatch, UInt64Array};
use arrow::compute::SortOptions;
use arrow::datatypes::SchemaRef;
use arrow::row::{OwnedRow, RowConverter, SortField};
use eddy_common::{ChangeBatch, Result};

use crate::event_time::{EventTime, micros};
use crate::plan::{Expr, Ranking, WindowClose};
use crate::rows::{arrow_error, batch_of, eval_error, evaluate};
use crate::{OperatorState, checkpoint};

type Ranked = HashMap<(OwnedRow, u64), i64>;

pub struct TopN {
    /// The latest mark of each stream (in-band watermarks).
    marks: crate::event_time::Marks,
    partition: Vec<Expr>,
    order: Vec<(Expr, SortOptions)>,
    offset: usize,
    limit: usize,
    rank: Option<Ranking>,
    schema: SchemaRef,
    partition_keys: Option<RowConverter>,
    sort_keys: RowConverter,
    rows: RowConverter,
    state: HashMap<Option<OwnedRow>, BTreeMap<(OwnedRow, OwnedRow), i64>>,
    emitted: HashMap<Option<OwnedRow>, Ranked>,
    dirty: HashSet<Option<OwnedRow>>,
    /// Top-N per window: partitions by the watermark that frees them.
    window: Option<(WindowClose, Arc<EventTime>)>,
    expiry: BTreeMap<i64, Vec<Option<OwnedRow>>>,
    /// The input only inserts: partitions are trimmed to their top rows.
    append_only: bool,
}

impl TopN {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        input_schema: SchemaRef,
        partition: Vec<Expr>,
        order: Vec<(Expr, SortOptions)>,
        (offset, limit): (usize, usize),
        rank: Option<Ranking>,
        window: Option<(WindowClose, Arc<EventTime>)>,
        append_only: bool,
        schema: SchemaRef,
    ) -> Result<Self> {
        let fields = input_schema
            .fields()
            .iter()
            .map(|f| SortField::new(f.data_type().clone()))
            .collect();
        let rows = RowConverter::new(fields).map_err(arrow_error)?;
        let sort_fields = order
            .iter()
            .map(|(e, o)| {
                e.data_type(&input_schema)
                    .map(|t| SortField::new_with_options(t, *o))
            })
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(eval_error)?;
        let partition_fields = partition
            .iter()
            .map(|e| e.data_type(&input_schema).map(SortField::new))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(eval_error)?;
        let partition_keys = if partition_fields.is_empty() {
            None
        } else {
            Some(RowConverter::new(partition_fields).map_err(arrow_error)?)
        };
        Ok(TopN {
            marks: crate::event_time::Marks::default(),
            partition,
            order,
            offset,
            limit,
            rank,
            schema,
            partition_keys,
            sort_keys: RowConverter::new(sort_fields).map_err(arrow_error)?,
            rows,
            state: HashMap::default(),
            emitted: HashMap::default(),
            dirty: HashSet::default(),
            window,
            expiry: BTreeMap::new(),
            append_only,
        })
    }

    fn absorb(&mut self, changes: &ChangeBatch) -> Result<()> {
        if changes.is_empty() {
            return Ok(());
        }
        let rows_in = changes.rows();
        let sort: Vec<ArrayRef> = self
            .order
            .iter()
            .map(|(e, _)| evaluate(e, rows_in))
            .collect::<Result<_>>()?;
        let parts = crate::rows::evaluate_keys(&self.partition, rows_in)?;
        let sort = self.sort_keys.convert_columns(&sort).map_err(arrow_error)?;
        let parts = match &self.partition_keys {
            Some(c) => Some(c.convert_columns(&parts).map_err(arrow_error)?),
            None => None,
        };
        let rows = self
            .rows
            .convert_columns(rows_in.columns())
            .map_err(arrow_error)?;
        let ends = match &self.window {
            Some((w, _)) => Some((
                micros(&evaluate(&self.partition[w.key], rows_in)?)?,
                w.to_end_micros + w.lateness.allowed_micros,
            )),
            None => None,
        };
        for (i, d) in changes.diffs().values().iter().enumerate() {
            let part = parts.as_ref().map(|p| p.row(i).owned());
            if let Some((ends, horizon)) = &ends
                && let Some(end) = ends[i]
                && !self.state.contains_key(&part)
            {
                self.expiry
                    .entry(end.saturating_add(*horizon))
                    .or_default()
                    .push(part.clone());
            }
            let ordered = self.state.entry(part.clone()).or_default();
            let entry = (sort.row(i).owned(), rows.row(i).owned());
            let count = ordered.entry(entry.clone()).or_insert(0);
            *count += d;
            if *count == 0 {
                ordered.remove(&entry);
                if ordered.is_empty() {
                    self.state.remove(&part);
                }
            }
            self.dirty.insert(part);
        }
        Ok(())
    }

    /// The rows a partition shows now, with their ranks (0 when not ranking). With `trim`, the
    /// partition forgets its rows past the top (rows with a copy in the top stay whole).
    fn top(&mut self, partition: &Option<OwnedRow>, trim: bool) -> Ranked {
        let mut now = Ranked::default();
        let Some(ordered) = self.state.get_mut(partition) else {
            return now;
        };
        let end = self.offset.saturating_add(self.limit);
        // `position` counts rows (with multiplicity); ties share the sort key.
        let (mut position, mut tie_start, mut distinct) = (0usize, 0usize, 0u64);
        let mut previous: Option<&OwnedRow> = None;
        // The first row with no copy in the top, and whether the walk got past the top.
        let (mut cut, mut full) = (None, false);
        'rows: for ((sort, row), count) in ordered.iter() {
            if full {
                cut = trim.then(|| (sort.clone(), row.clone()));
                break;
            }
            if previous != Some(sort) {
                tie_start = position;
                distinct += 1;
            }
            previous = Some(sort);
            for copy in 0..(*count).max(0) {
                let rank = match self.rank {
                    None => 0,
                    Some(Ranking::RowNumber) => (position + 1) as u64,
                    Some(Ranking::Rank) => (tie_start + 1) as u64,
                    Some(Ranking::DenseRank) => distinct,
                };
                let past_end = match self.rank {
                    None | Some(Ranking::RowNumber) => position >= end,
                    Some(_) => rank > self.limit as u64,
                };
                if past_end {
                    if copy == 0 {
                        cut = trim.then(|| (sort.clone(), row.clone()));
                        break 'rows;
                    }
                    full = true;
                    continue 'rows;
                }
                if position >= self.offset {
                    *now.entry((row.clone(), rank)).or_default() += 1;
                }
                position += 1;
            }
        }
        if let Some(cut) = cut {
            drop(ordered.split_off(&cut));
        }
        now
    }

    fn emit(&mut self) -> Result<Vec<ChangeBatch>> {
        let mut diffs: Ranked = Ranked::default();
        for partition in std::mem::take(&mut self.dirty) {
            let now = self.top(&partition, self.append_only);
            for (key, n) in &now {
                *diffs.entry(key.clone()).or_default() += n;
            }
            let before = if now.is_empty() {
                self.emitted.remove(&partition)
            } else {
                self.emitted.insert(partition, now)
            };
            for (key, n) in before.unwrap_or_default() {
                *diffs.entry(key).or_default() -= n;
            }
        }
        diffs.retain(|_, d| *d != 0);
        if diffs.is_empty() {
            return Ok(Vec::new());
        }
        let (keys, weights): (Vec<(OwnedRow, u64)>, Vec<i64>) = diffs.into_iter().unzip();
        let mut columns = self
            .rows
            .convert_rows(keys.iter().map(|(r, _)| r.row()))
            .map_err(arrow_error)?;
        if self.rank.is_some() {
            columns.push(Arc::new(UInt64Array::from(
                keys.iter().map(|(_, rank)| *rank).collect::<Vec<_>>(),
            )));
        }
        Ok(vec![ChangeBatch::new(
            batch_of(&self.schema, columns, weights.len())?,
            Int64Array::from(weights),
        )])
    }
}

/// A partition key's bytes (`None`: no PARTITION BY).
fn bytes(partition: &Option<OwnedRow>) -> Option<&[u8]> {
    partition.as_ref().map(|r| r.as_ref())
}

impl TopN {
    /// Forgets windows' partitions the watermark has passed (their rows stay in the view).
    fn evict(&mut self) {
        let Some((w, _)) = &self.window else {
            return;
        };
        let Some(watermark) = self.marks.min_of(&w.sources) else {
            return;
        };
        while let Some(entry) = self.expiry.first_entry() {
            if *entry.key() > watermark {
                break;
            }
            for part in entry.remove() {
                self.state.remove(&part);
                self.emitted.remove(&part);
            }
        }
    }
}

impl Handler for TopN {
    crate::event_time::keeps_marks!();

    fn on_data(&mut self, _input: usize, changes: ChangeBatch, _out: &mut Output) -> Result<()> {
        self.absorb(&changes)
    }

    fn on_barrier(&mut self, _barrier: &Barrier, out: &mut Output) -> Result<()> {
        for changes in self.emit()? {
            out.data(changes);
        }
        self.evict();
        Ok(())
    }

    fn name(&self) -> String {
        format!("TopN limit {}", self.limit)
    }

    fn state_rows(&self) -> usize {
        self.state.values().map(|o| o.len()).sum()
    }

    fn state(&self) -> OperatorState {
        let entry = std::mem::size_of::<((OwnedRow, OwnedRow), i64)>();
        let (mut rows, mut bytes) = (0, 0);
        for ordered in self.state.values() {
            rows += ordered.len();
            bytes += ordered
                .keys()
                .map(|(s, r)| entry + s.as_ref().len() + r.as_ref().len())
                .sum::<usize>();
        }
        for emitted in self.emitted.values() {
            bytes += emitted
                .keys()
                .map(|(r, _)| std::mem::size_of::<((OwnedRow, u64), i64)>() + r.as_ref().len())
                .sum::<usize>();
        }
        OperatorState {
            name: format!("TopN limit {}", self.limit),
            rows,
            bytes,
        }
    }

    fn save(&mut self) -> Result<checkpoint::Parts> {
        let rows: Vec<(&Option<OwnedRow>, &OwnedRow, &OwnedRow, i64)> = self
            .state
            .iter()
            .flat_map(|(p, ordered)| ordered.iter().map(move |((s, r), n)| (p, s, r, *n)))
            .collect();
        let rows = vec![
            (
                "partition",
                checkpoint::optional_binary(rows.iter().map(|e| bytes(e.0))),
            ),
            (
                "sort",
                checkpoint::binary(rows.iter().map(|e| e.1.as_ref())),
            ),
            ("row", checkpoint::binary(rows.iter().map(|e| e.2.as_ref()))),
            ("count", checkpoint::int64s(rows.iter().map(|e| e.3))),
        ];
        let emitted: Vec<(&Option<OwnedRow>, &OwnedRow, u64, i64)> = self
            .emitted
            .iter()
            .flat_map(|(p, ranked)| ranked.iter().map(move |((r, rank), n)| (p, r, *rank, *n)))
            .collect();
        let emitted = vec![
            (
                "partition",
                checkpoint::optional_binary(emitted.iter().map(|e| bytes(e.0))),
            ),
            (
                "row",
                checkpoint::binary(emitted.iter().map(|e| e.1.as_ref())),
            ),
            (
                "rank",
                checkpoint::int64s(emitted.iter().map(|e| e.2 as i64)),
            ),
            ("count", checkpoint::int64s(emitted.iter().map(|e| e.3))),
        ];
        let expiry: Vec<(i64, &Option<OwnedRow>)> = self
            .expiry
            .iter()
            .flat_map(|(t, parts)| parts.iter().map(move |p| (*t, p)))
            .collect();
        let expiry = vec![
            ("time", checkpoint::int64s(expiry.iter().map(|e| e.0))),
            (
                "partition",
                checkpoint::optional_binary(expiry.iter().map(|e| bytes(e.1))),
            ),
        ];
        Ok(vec![
            ("rows", checkpoint::part(rows, &[])?),
            ("emitted", checkpoint::part(emitted, &[])?),
            ("expiry", checkpoint::part(expiry, &[])?),
        ])
    }

    fn part_keys(&mut self, _name: &str, batch: &RecordBatch) -> Result<Option<Vec<ArrayRef>>> {
        match &self.partition_keys {
            Some(c) => checkpoint::key_columns(c, batch, "partition"),
            None => Ok(None),
        }
    }

    fn load(&mut self, name: &str, batch: &RecordBatch) -> Result<()> {
        let partitions = match &self.partition_keys {
            Some(c) => checkpoint::rows_of(c, checkpoint::binary_column(batch, "partition")?),
            None => vec![None; batch.num_rows()],
        };
        match name {
            "rows" => {
                let sort = checkpoint::required_rows(
                    &self.sort_keys,
                    checkpoint::binary_column(batch, "sort")?,
                )?;
                let rows = checkpoint::required_rows(
                    &self.rows,
                    checkpoint::binary_column(batch, "row")?,
                )?;
                let counts = checkpoint::int64_column(batch, "count")?;
                for (((p, s), r), n) in partitions
                    .into_iter()
                    .zip(sort)
                    .zip(rows)
                    .zip(counts.values())
                {
                    self.state.entry(p).or_default().insert((s, r), *n);
                }
            }
            "emitted" => {
                let rows = checkpoint::required_rows(
                    &self.rows,
                    checkpoint::binary_column(batch, "row")?,
                )?;
                let (ranks, counts) = (
                    checkpoint::int64_column(batch, "rank")?,
                    checkpoint::int64_column(batch, "count")?,
                );
                for (i, (p, r)) in partitions.into_iter().zip(rows).enumerate() {
                    self.emitted
                        .entry(p)
                        .or_default()
                        .insert((r, ranks.value(i) as u64), counts.value(i));
                }
            }
            "expiry" => {
                for (p, t) in partitions
                    .into_iter()
                    .zip(checkpoint::int64_column(batch, "time")?.values())
                {
                    self.expiry.entry(*t).or_default().push(p);
                }
            }
            _ => return Err(checkpoint::unknown_part("TopN", name)),
        }
        Ok(())
    }
}
