//! Top-N: `ORDER BY ... LIMIT n [OFFSET m]`, and per partition (`ROW_NUMBER() | RANK() |
//! DENSE_RANK() OVER (PARTITION BY ... ORDER BY ...) <= n`), maintained under inserts and
//! retractions.
//!
//! State: an [`Arrangement`] from the partition (its key; empty without PARTITION BY) to every
//! input row with its multiplicity, each stored as its sort key then the row, in arrow's row
//! format (which encodes ASC/DESC and NULLS FIRST/LAST), the sort key's length in the entry's
//! aux count; and one from the partition to what it shows (rank then row). At the end of an
//! epoch the operator sorts each changed partition's rows, walks the first `offset + limit`
//! and emits the difference with what it showed before. Ties in the sort key are broken by the
//! row's bytes, deterministically; identical rows get consecutive row numbers. Over an
//! append-only input a row past the top of its partition can never return (rows only arrive),
//! so each partition keeps only its top rows. Top-N per window keeps each row with its
//! window's end (plus the allowed lateness) as its time and expiry: a window's partition is
//! forgotten once the watermark passes it (its rows stay in the view). Both arrangements spill
//! past the memory budget (ADR 0012).

use std::cmp::Ordering;
use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Array, RecordBatch, UInt64Array};
use arrow::compute::SortOptions;
use arrow::datatypes::SchemaRef;
use arrow::row::{RowConverter, SortField};
use eddy_common::{ChangeBatch, Result};

use crate::arrangement::{Arrangement, NEVER};
use crate::event_time::{EventTime, micros};
use crate::graph::{Barrier, Handler, Output};
use crate::packed::Weighted;
use crate::plan::{Expr, Ranking, WindowClose};
use crate::rows::{arrow_error, batch_of, eval_error, evaluate};
use crate::spill::MemoryBudget;
use crate::{OperatorState, checkpoint};

const ROWS: &str = "rows";
const EMITTED: &str = "emitted";

/// The bytes of a rank in what a partition shows (before the row).
const RANK_BYTES: usize = 8;

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
    /// Partition -> sort key and row (aux: the sort key's length) -> multiplicity.
    state: Arrangement,
    /// Partition -> rank (big-endian) and row -> multiplicity: what the view shows.
    emitted: Arrangement,
    /// The partitions changed this epoch (keys with an empty row).
    dirty: Arrangement,
    /// Top-N per window: each row's partition is forgotten once the watermark passes its
    /// window's end plus the allowed lateness.
    window: Option<(WindowClose, Arc<EventTime>)>,
    /// The input only inserts: partitions are trimmed to their top rows.
    append_only: bool,
    scratch: Vec<u8>,
}

/// A row a partition shows: its rank, and its entry in the state.
struct Shown {
    rank: u64,
    entry: u32,
    count: i64,
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
            state: Arrangement::new(),
            emitted: Arrangement::new(),
            dirty: Arrangement::new(),
            window,
            append_only,
            scratch: Vec::new(),
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
        let part = |i: usize| parts.as_ref().map_or(&[][..], |p| p.row(i).data());
        let rows = self
            .rows
            .convert_columns(rows_in.columns())
            .map_err(arrow_error)?;
        // A windowed partition's rows expire with it.
        let expiry = match &self.window {
            Some((w, _)) => Some((
                micros(&evaluate(&self.partition[w.key], rows_in)?)?,
                w.to_end_micros.saturating_add(w.lateness.allowed_micros),
            )),
            None => None,
        };
        self.state.prepare((0..changes.len()).map(part))?;
        for (i, d) in changes.diffs().values().iter().enumerate() {
            let expires = match &expiry {
                Some((starts, horizon)) => starts[i].map_or(NEVER, |s| s.saturating_add(*horizon)),
                None => NEVER,
            };
            let sort = sort.row(i);
            self.scratch.clear();
            self.scratch.extend_from_slice(sort.data());
            self.scratch.extend_from_slice(rows.row(i).data());
            let time = if expires == NEVER { 0 } else { expires };
            if let Some(e) = self
                .state
                .update(part(i), &self.scratch, time, *d, expires)?
            {
                self.state.set_aux(e, sort.data().len() as i64);
            }
            self.dirty.update(part(i), &[], 0, 1, NEVER)?;
        }
        Ok(())
    }

    /// The rows `partition` shows now, in order, with their ranks (0 when not ranking). With
    /// `trim`, the partition forgets its rows past the top (rows with a copy in the top stay).
    fn top(&mut self, partition: &[u8], trim: bool) -> Result<Vec<Shown>> {
        let state = &self.state;
        let mut ids: Vec<u32> = state.probe(partition).map(|f| f.id).collect();
        let split = |id: u32| {
            let bytes = state.row(id);
            let sort_len = (state.aux(id) as usize).min(bytes.len());
            bytes.split_at(sort_len)
        };
        ids.sort_unstable_by(|a, b| {
            let ((sa, ra), (sb, rb)) = (split(*a), split(*b));
            sa.cmp(sb).then_with(|| ra.cmp(rb))
        });
        let end = self.offset.saturating_add(self.limit);
        let mut now = Vec::new();
        // `position` counts rows (with multiplicity); ties share the sort key.
        let (mut position, mut tie_start, mut distinct) = (0usize, 0usize, 0u64);
        let mut previous: Option<&[u8]> = None;
        // The first entry with no copy in the top, once the walk got past the top.
        let (mut cut, mut full) = (None, false);
        'rows: for (n, id) in ids.iter().enumerate() {
            if full {
                cut = Some(n);
                break;
            }
            let sort = split(*id).0;
            if previous != Some(sort) {
                tie_start = position;
                distinct += 1;
            }
            previous = Some(sort);
            for copy in 0..state.weight(*id).max(0) {
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
                        cut = Some(n);
                        break 'rows;
                    }
                    full = true;
                    continue 'rows;
                }
                if position >= self.offset {
                    match now.last_mut() {
                        Some(Shown {
                            rank: r,
                            entry,
                            count,
                        }) if *r == rank && *entry == *id => *count += 1,
                        _ => now.push(Shown {
                            rank,
                            entry: *id,
                            count: 1,
                        }),
                    }
                }
                position += 1;
            }
        }
        if let (true, Some(cut)) = (trim, cut) {
            // Copies first: the updates move the arena.
            let mut gone = Vec::new();
            self.scratch.clear();
            for id in &ids[cut..] {
                let bytes = self.state.row(*id);
                self.scratch.extend_from_slice(bytes);
                gone.push((
                    self.scratch.len(),
                    self.state.time_of(*id),
                    self.state.weight(*id),
                ));
            }
            let mut start = 0;
            for (end, time, weight) in gone {
                let expires = if time == 0 { NEVER } else { time };
                self.state
                    .update(partition, &self.scratch[start..end], time, -weight, expires)?;
                start = end;
            }
        }
        Ok(now)
    }

    /// Emits, for every partition changed this epoch, what it shows now less what it showed.
    fn emit(&mut self) -> Result<Vec<ChangeBatch>> {
        let dirty = std::mem::take(&mut self.dirty);
        let partitions = || dirty.iter().map(|f| f.key);
        self.state.prepare(partitions())?;
        self.emitted.prepare(partitions())?;
        let mut out = Weighted::default();
        for partition in partitions() {
            self.emit_partition(partition, &mut out)?;
        }
        if out.diffs.is_empty() {
            return Ok(Vec::new());
        }
        let parser = self.rows.parser();
        let mut columns = self
            .rows
            .convert_rows(out.iter().map(|(b, _)| parser.parse(&b[RANK_BYTES..])))
            .map_err(arrow_error)?;
        if self.rank.is_some() {
            columns.push(Arc::new(UInt64Array::from_iter_values(
                out.iter().map(|(b, _)| rank_of(b)),
            )));
        }
        Ok(vec![ChangeBatch::new(
            batch_of(&self.schema, columns, out.diffs.len())?,
            Int64Array::from(out.diffs),
        )])
    }

    /// What `partition` shows now against what it showed: the changes go to `out` and into
    /// `emitted`.
    fn emit_partition(&mut self, partition: &[u8], out: &mut Weighted) -> Result<()> {
        // Every row of a partition has the same time: its window's expiry, or 0.
        let time = self.state.probe(partition).next().map_or(0, |f| f.time);
        let expires = if time == 0 { NEVER } else { time };
        let shown = self.top(partition, self.append_only)?;
        // Before and now, each in (rank, row) order, merged.
        let mut before: Vec<u32> = self.emitted.probe(partition).map(|f| f.id).collect();
        before.sort_unstable_by(|a, b| self.emitted.row(*a).cmp(self.emitted.row(*b)));
        let row_of = |s: &Shown| {
            let bytes = self.state.row(s.entry);
            &bytes[(self.state.aux(s.entry) as usize).min(bytes.len())..]
        };
        // What the partition shows, changed: (rank, row) bytes.
        let mut changes = Weighted::default();
        let (mut b, mut n) = (0, 0);
        while b < before.len() || n < shown.len() {
            let order = match (before.get(b), shown.get(n)) {
                (Some(id), Some(s)) => {
                    let was = self.emitted.row(*id);
                    (rank_of(was), &was[RANK_BYTES..]).cmp(&(s.rank, row_of(s)))
                }
                (Some(_), None) => Ordering::Less,
                _ => Ordering::Greater,
            };
            match order {
                Ordering::Less => {
                    let was = self.emitted.row(before[b]);
                    changes.push(&[was], -self.emitted.weight(before[b]));
                    b += 1;
                }
                Ordering::Greater => {
                    changes.push(
                        &[&shown[n].rank.to_be_bytes(), row_of(&shown[n])],
                        shown[n].count,
                    );
                    n += 1;
                }
                Ordering::Equal => {
                    let d = shown[n].count - self.emitted.weight(before[b]);
                    if d != 0 {
                        changes.push(&[&shown[n].rank.to_be_bytes(), row_of(&shown[n])], d);
                    }
                    b += 1;
                    n += 1;
                }
            }
        }
        for (bytes, d) in changes.iter() {
            self.emitted.update(partition, bytes, time, d, expires)?;
            out.push(&[bytes], d);
        }
        Ok(())
    }

    /// Forgets windows' partitions the watermark has passed (their rows stay in the view).
    fn evict(&mut self) -> Result<()> {
        let Some((w, _)) = &self.window else {
            return Ok(());
        };
        let Some(watermark) = self.marks.min_of(&w.sources) else {
            return Ok(());
        };
        self.state.expire(watermark)?;
        self.emitted.expire(watermark)?;
        Ok(())
    }
}

/// The rank at the front of a row of what a partition shows.
fn rank_of(bytes: &[u8]) -> u64 {
    let mut rank = [0u8; RANK_BYTES];
    rank.copy_from_slice(&bytes[..RANK_BYTES]);
    u64::from_be_bytes(rank)
}

impl Handler for TopN {
    crate::event_time::keeps_marks!();

    fn on_data(&mut self, _input: usize, changes: ChangeBatch, _out: &mut Output) -> Result<()> {
        self.absorb(&changes)?;
        self.state.settle()
    }

    fn on_barrier(&mut self, _barrier: &Barrier, out: &mut Output) -> Result<()> {
        for changes in self.emit()? {
            out.data(changes);
        }
        self.evict()?;
        self.state.settle()?;
        self.emitted.settle()
    }

    fn name(&self) -> String {
        format!("TopN limit {}", self.limit)
    }

    fn state_rows(&self) -> usize {
        self.state.len()
    }

    fn state(&self) -> OperatorState {
        OperatorState {
            name: format!("TopN limit {}", self.limit),
            rows: self.state.len(),
            bytes: self.state.size_bytes() + self.emitted.size_bytes(),
        }
    }

    fn spill_to(&mut self, budget: &Arc<MemoryBudget>) {
        self.state.spill_to(budget);
        self.emitted.spill_to(budget);
    }

    fn spilled_rows(&self) -> usize {
        self.state.spilled_rows() + self.emitted.spilled_rows()
    }

    fn save(
        &mut self,
        mode: crate::arrangement::SaveMode,
        out: &mut dyn checkpoint::Sink,
    ) -> Result<()> {
        for (name, rows) in [(ROWS, &mut self.state), (EMITTED, &mut self.emitted)] {
            rows.save(mode, name, out)?;
        }
        Ok(())
    }

    fn part_keys(&mut self, _name: &str, batch: &RecordBatch) -> Result<Option<Vec<ArrayRef>>> {
        match &self.partition_keys {
            Some(c) => checkpoint::key_columns(c, batch, "key"),
            None => Ok(None),
        }
    }

    fn load(&mut self, name: &str, batch: &RecordBatch) -> Result<()> {
        match name {
            ROWS => self.state.load(batch),
            EMITTED => self.emitted.load(batch),
            _ => Err(checkpoint::unknown_part("TopN", name)),
        }
    }
}
