//! Outer, semi and anti joins, maintained row by row with match counts.
//!
//! Both sides are [`Arrangement`]s by join key. Each row held keeps, as its aux count, its
//! *degree*: the summed weight of the other side's rows it matches (equal keys, residual filter
//! true). A change of a row on one side is joined with the other side's rows of its key as in
//! the inner join (matched pairs, weights multiply), and:
//!
//! - its own padded (LEFT/RIGHT/FULL), anti or semi output follows its weight when its degree
//!   is zero (padded, anti) or not (semi);
//! - each matched row of the other side has its degree moved by the change's weight; one whose
//!   degree goes from zero to not zero (or back) retracts (or emits) its padded or anti output,
//!   and the reverse for semi.
//!
//! So the cost of a change is the rows of its key on the other side, as for an inner join: no
//! key's output is recomputed. Left changes of a push are applied before right ones (the right
//! ones see them), which gives the exact delta of the join. Rows whose key is NULL never match:
//! their padded or anti output follows their own weight, and they are not kept.
//!
//! A window join of two streams (the window bounds are among the keys) forgets each row once
//! both sides' watermarks are past its time plus its side's horizon: its key's window can no
//! longer change, so nothing is retracted.

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, Int64Array, RecordBatch, UInt32Array, new_null_array,
};
use arrow::datatypes::SchemaRef;
use arrow::row::{RowConverter, SortField};
use eddy_common::{ChangeBatch, Error, Result};

use crate::arrangement::{Arrangement, NEVER};
use crate::event_time::{EventTime, micros};
use crate::graph::{Barrier, Handler, Output as Emitted};
use crate::join::Keys;
use crate::plan::{Expr, JoinKind, TimeBound};
use crate::rows::{arrow_error, batch, eval_error, evaluate, take_columns};
use crate::spill::MemoryBudget;
use crate::{OperatorState, checkpoint};

const LEFT_PART: &str = "left_rows";
const RIGHT_PART: &str = "right_rows";

struct Side {
    schema: SchemaRef,
    keys: Vec<Expr>,
    rows: RowConverter,
    /// NULL keys match each other (IS NOT DISTINCT FROM).
    nulls_equal: bool,
    key_converter: RowConverter,
    /// Join key -> row -> weight, each row's degree as its aux count.
    state: Arrangement,
    /// What this side's rows contribute besides matched pairs.
    alone: Alone,
}

/// The output a side's row gives by itself.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Alone {
    Nothing,
    /// The row with the other side's columns NULL, while it matches nothing (LEFT/RIGHT/FULL).
    Padded,
    /// The row by itself while it matches nothing (anti join).
    Anti,
    /// The row by itself while it matches something (semi join).
    Semi,
}

impl Alone {
    /// Whether a row with this degree is in the output by itself.
    fn shows(self, degree: i64) -> bool {
        match self {
            Alone::Nothing => false,
            Alone::Padded | Alone::Anti => degree == 0,
            Alone::Semi => degree != 0,
        }
    }
}

pub struct OuterJoin {
    /// The latest mark of each stream (in-band watermarks).
    marks: crate::event_time::Marks,
    kind: JoinKind,
    left: Side,
    right: Side,
    filter: Option<Expr>,
    /// The left and right columns side by side, what the filter reads.
    pair_schema: SchemaRef,
    schema: SchemaRef,
    /// Window joins: each side's time bound, and the watermarks' sources.
    bounds: Option<([TimeBound; 2], Arc<EventTime>)>,
}

impl Side {
    fn new(schema: SchemaRef, keys: Vec<Expr>, nulls_equal: bool, alone: Alone) -> Result<Self> {
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
            state: Arrangement::new(),
            alone,
        })
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
        let (left_alone, right_alone) = match kind {
            JoinKind::Inner => (Alone::Nothing, Alone::Nothing),
            JoinKind::Left => (Alone::Padded, Alone::Nothing),
            JoinKind::Right => (Alone::Nothing, Alone::Padded),
            JoinKind::Full => (Alone::Padded, Alone::Padded),
            JoinKind::LeftSemi => (Alone::Semi, Alone::Nothing),
            JoinKind::LeftAnti => (Alone::Anti, Alone::Nothing),
            JoinKind::RightSemi => (Alone::Nothing, Alone::Semi),
            JoinKind::RightAnti => (Alone::Nothing, Alone::Anti),
        };
        let pair_schema = Arc::new(arrow::datatypes::Schema::new(
            left_schema
                .fields()
                .iter()
                .chain(right_schema.fields().iter())
                .cloned()
                .collect::<Vec<_>>(),
        ));
        Ok(OuterJoin {
            marks: crate::event_time::Marks::default(),
            kind,
            left: Side::new(left_schema, left_keys, nulls_equal, left_alone)?,
            right: Side::new(right_schema, right_keys, nulls_equal, right_alone)?,
            filter,
            pair_schema,
            schema,
            bounds: None,
        })
    }

    /// Whether matched pairs are output (not for semi and anti joins).
    fn pairs_out(&self) -> bool {
        matches!(
            self.kind,
            JoinKind::Inner | JoinKind::Left | JoinKind::Right | JoinKind::Full
        )
    }

    /// A row of a side by itself, as the output has it: padded with NULLs, or alone.
    fn alone_columns(&self, is_left: bool, columns: Vec<ArrayRef>, n: usize) -> Vec<ArrayRef> {
        let side = if is_left { &self.left } else { &self.right };
        match (side.alone, is_left) {
            (Alone::Padded, true) => [columns, self.right.nulls(n)].concat(),
            (Alone::Padded, false) => [self.left.nulls(n), columns].concat(),
            _ => columns,
        }
    }

    /// Applies one batch of changes of one side (see the module documentation).
    fn apply(&mut self, is_left: bool, changes: &ChangeBatch, out: &mut Output) -> Result<()> {
        let pairs_out = self.pairs_out();
        let (me, other) = if is_left {
            (&mut self.left, &mut self.right)
        } else {
            (&mut self.right, &mut self.left)
        };
        let keys = Keys::of(&me.keys, &me.key_converter, me.nulls_equal, changes.rows())?;
        other.state.prepare(keys.iter())?;
        me.state.prepare(keys.iter())?;
        let diffs = changes.diffs().values();
        // Candidate pairs: each changed row with the other side's rows of its key.
        let (mut mine, mut theirs) = (Vec::new(), Vec::new());
        for i in 0..changes.len() {
            if let Some(key) = keys.get(i) {
                for found in other.state.probe(key) {
                    mine.push(i as u32);
                    theirs.push(found.id);
                }
            }
        }
        // The pairs' columns (left first), and which pass the residual filter.
        let parser = other.rows.parser();
        let pair_columns = if mine.is_empty() {
            None
        } else {
            let my_columns =
                take_columns(changes.rows().columns(), &UInt32Array::from(mine.clone()))?;
            let their_columns = other
                .rows
                .convert_rows(theirs.iter().map(|&e| parser.parse(other.state.row(e))))
                .map_err(arrow_error)?;
            Some(if is_left {
                [my_columns, their_columns].concat()
            } else {
                [their_columns, my_columns].concat()
            })
        };
        let passed: Option<Vec<bool>> = match (&self.filter, &pair_columns) {
            (Some(filter), Some(columns)) => {
                let pairs = batch(&self.pair_schema, columns.clone())?;
                let mask = evaluate(filter, &pairs)?;
                let mask = mask
                    .as_boolean_opt()
                    .ok_or_else(|| Error::internal("join filter is not boolean"))?;
                Some(
                    (0..mask.len())
                        .map(|k| mask.is_valid(k) && mask.value(k))
                        .collect(),
                )
            }
            _ => None,
        };
        let passes = |p: usize| passed.as_ref().is_none_or(|m| m[p]);
        // Matched pairs, my rows' degrees, and the other side's rows whose degree crosses zero.
        let mut degree = vec![0i64; changes.len()];
        let (mut kept, mut kept_diffs) = (Vec::new(), Vec::new());
        let (mut flipped, mut flipped_diffs) = (Vec::new(), Vec::new());
        for (p, (&i, &e)) in mine.iter().zip(&theirs).enumerate() {
            if !passes(p) {
                continue;
            }
            let (i, their_weight) = (i as usize, other.state.weight(e));
            degree[i] += their_weight;
            if pairs_out {
                kept.push(p as u32);
                kept_diffs.push(diffs[i] * their_weight);
            }
            if other.alone != Alone::Nothing {
                let (before, after) = other.state.add_aux(e, diffs[i]);
                let (was, is) = (other.alone.shows(before), other.alone.shows(after));
                if was != is {
                    flipped.push(e);
                    flipped_diffs.push(if is { their_weight } else { -their_weight });
                }
            }
        }
        if let (Some(columns), false) = (&pair_columns, kept.is_empty()) {
            out.push(take_columns(columns, &UInt32Array::from(kept))?, kept_diffs);
        }
        if !flipped.is_empty() {
            let columns = other
                .rows
                .convert_rows(flipped.iter().map(|&e| parser.parse(other.state.row(e))))
                .map_err(arrow_error)?;
            let n = flipped.len();
            out.push(self.alone_columns(!is_left, columns, n), flipped_diffs);
        }
        // My rows by themselves (a NULL key matches nothing), then into my arrangement.
        let me = if is_left {
            &mut self.left
        } else {
            &mut self.right
        };
        let (mut alone, mut alone_diffs) = (Vec::new(), Vec::new());
        for (i, d) in diffs.iter().enumerate() {
            if me.alone.shows(degree[i]) {
                alone.push(i as u32);
                alone_diffs.push(*d);
            }
        }
        let times = match &self.bounds {
            Some((bounds, _)) => {
                let bound = &bounds[usize::from(!is_left)];
                Some((
                    micros(&evaluate(&bound.time, changes.rows())?)?,
                    bound.horizon_micros,
                ))
            }
            None => None,
        };
        let rows = me
            .rows
            .convert_columns(changes.rows().columns())
            .map_err(arrow_error)?;
        for (i, d) in diffs.iter().enumerate() {
            let Some(key) = keys.get(i) else { continue };
            let (time, expires) = match &times {
                Some((times, horizon)) => match times[i] {
                    Some(t) => (t, t.saturating_add(*horizon)),
                    None => (0, NEVER),
                },
                None => (0, NEVER),
            };
            if let Some(e) = me
                .state
                .update(key, rows.row(i).data(), time, *d, expires)?
            {
                me.state.set_aux(e, degree[i]);
            }
        }
        if !alone.is_empty() {
            let n = alone.len();
            let columns = take_columns(changes.rows().columns(), &UInt32Array::from(alone))?;
            out.push(self.alone_columns(is_left, columns, n), alone_diffs);
        }
        Ok(())
    }

    fn process(
        &mut self,
        left: Vec<ChangeBatch>,
        right: Vec<ChangeBatch>,
    ) -> Result<Vec<ChangeBatch>> {
        let mut out = Output { chunks: Vec::new() };
        for changes in &left {
            self.apply(true, changes, &mut out)?;
        }
        for changes in &right {
            self.apply(false, changes, &mut out)?;
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

    /// Makes this a window join of two streams whose rows expire by the watermarks.
    pub fn bound_by_time(&mut self, bounds: [TimeBound; 2], event_time: Arc<EventTime>) {
        self.bounds = Some((bounds, event_time));
    }

    /// Forgets rows whose window both sides' watermarks have passed (plus the lateness).
    fn evict(&mut self) -> Result<()> {
        let Some(([l, r], _)) = &self.bounds else {
            return Ok(());
        };
        let mut sources = l.own.clone();
        sources.extend(r.own.iter().copied());
        let Some(watermark) = self.marks.min_of(&sources) else {
            return Ok(());
        };
        self.left.state.expire(watermark)?;
        self.right.state.expire(watermark)?;
        Ok(())
    }

    /// Ends a batch or an epoch: each side settles within its memory budget.
    fn settle(&mut self) -> Result<()> {
        self.left.state.settle()?;
        self.right.state.settle()
    }
}

impl Handler for OuterJoin {
    crate::event_time::keeps_marks!();

    fn on_data(&mut self, input: usize, changes: ChangeBatch, out: &mut Emitted) -> Result<()> {
        let (left, right) = crate::graph::by_side(input, changes);
        for changes in self.process(left, right)? {
            out.data(changes);
        }
        self.settle()
    }

    fn on_barrier(&mut self, _barrier: &Barrier, _out: &mut Emitted) -> Result<()> {
        self.evict()?;
        self.settle()
    }

    fn name(&self) -> String {
        "OuterJoin".to_owned()
    }

    fn spill_to(&mut self, budget: &Arc<MemoryBudget>) {
        self.left.state.spill_to(budget);
        self.right.state.spill_to(budget);
    }

    fn spilled_rows(&self) -> usize {
        self.left.state.spilled_rows() + self.right.state.spilled_rows()
    }

    fn state(&self) -> OperatorState {
        let (left, right) = (&self.left.state, &self.right.state);
        OperatorState {
            name: format!("{:?}Join", self.kind),
            rows: left.len() + right.len(),
            bytes: left.size_bytes() + right.size_bytes(),
        }
    }

    fn save(
        &mut self,
        mode: crate::arrangement::SaveMode,
        out: &mut dyn checkpoint::Sink,
    ) -> Result<()> {
        for (name, side) in [(LEFT_PART, &mut self.left), (RIGHT_PART, &mut self.right)] {
            side.state.save(mode, name, out)?;
        }
        Ok(())
    }

    fn part_keys(&mut self, name: &str, batch: &RecordBatch) -> Result<Option<Vec<ArrayRef>>> {
        let side = if name == RIGHT_PART {
            &self.right
        } else {
            &self.left
        };
        checkpoint::key_columns(&side.key_converter, batch, "key")
    }

    fn load(&mut self, name: &str, batch: &RecordBatch) -> Result<()> {
        match name {
            LEFT_PART => self.left.state.load(batch),
            RIGHT_PART => self.right.state.load(batch),
            _ => Err(checkpoint::unknown_part("OuterJoin", name)),
        }
    }
}
