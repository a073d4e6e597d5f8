//! The exchange: a stateful operator sharded by key across workers.
//!
//! A [`Sharded`] operator runs its inputs (the operators upstream of it) on the calling thread,
//! routes their output by a fixed hash of the operator's key (group keys, join keys, top-N
//! partition) to one of `n` shards — copies of the operator, each holding the state of its
//! keys only — and runs the shards in parallel on the [`Workers`] pool. Equal keys always reach
//! the same shard, so a retraction meets its insert, and each shard's output is the unsharded
//! operator's output for its keys: the shards' outputs together are the operator's output.
//! Shards read the same [`crate::EventTime`], so they close windows at the same watermark.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::RecordBatch;
use eddy_common::{ChangeBatch, Error, ObjectId, Result};

use crate::plan::Expr;
use crate::rows::{hash_keys, split_by};
use crate::{Operator, OperatorState};

/// Below this many input rows a push runs its shards one after another on the calling thread:
/// handing a small batch to another thread costs more than it saves.
const PARALLEL_ROWS: usize = 2048;

/// The ids a shard's inputs are pushed under (no table or view has them).
pub(crate) const SHARD_INPUTS: [ObjectId; 2] = [ObjectId(u64::MAX), ObjectId(u64::MAX - 1)];

/// The threads sharded operators run on: `count` workers, being the thread that pushes changes
/// into a dataflow plus a pool of `count - 1`. One pool serves every view.
#[derive(Clone)]
pub struct Workers {
    pool: Option<Arc<rayon::ThreadPool>>,
    count: usize,
}

impl Workers {
    pub fn new(count: usize) -> Result<Workers> {
        if count <= 1 {
            return Ok(Workers::single());
        }
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(count - 1)
            .thread_name(|i| format!("eddy-worker-{}", i + 1))
            .build()
            .map_err(|e| Error::internal(format!("starting {count} dataflow workers: {e}")))?;
        Ok(Workers {
            pool: Some(Arc::new(pool)),
            count,
        })
    }

    /// Everything on the calling thread; operators are not sharded.
    pub fn single() -> Workers {
        Workers {
            pool: None,
            count: 1,
        }
    }

    pub fn count(&self) -> usize {
        self.count
    }

    /// Runs `f(0)` on the calling thread and `f(1)` .. `f(n - 1)` on the pool, all at once;
    /// their results in order (on one worker, one after another).
    pub fn run_parts<T: Send>(&self, n: usize, f: impl Fn(usize) -> T + Sync) -> Vec<T> {
        let Some(pool) = &self.pool else {
            return (0..n).map(f).collect();
        };
        let mut results: Vec<Option<T>> = (0..n).map(|_| None).collect();
        if let Some((first, rest)) = results.split_first_mut() {
            let f = &f;
            pool.in_place_scope(|scope| {
                for (i, slot) in rest.iter_mut().enumerate() {
                    scope.spawn(move |_| *slot = Some(f(i + 1)));
                }
                *first = Some(f(0));
            });
        }
        results.into_iter().flatten().collect()
    }

    pub(crate) fn pool(&self) -> Option<&Arc<rayon::ThreadPool>> {
        self.pool.as_ref()
    }
}

/// What one shard is handed: (input side, changes) in arrival order.
type Work = Vec<(usize, ChangeBatch)>;

pub(crate) struct Sharded {
    /// The operators feeding this one (one, or a join's two sides).
    inputs: Vec<Box<dyn Operator>>,
    /// Per input, the expressions (over its output) whose values pick a row's shard; a join's
    /// sides list their keys in the same order, so matching rows meet.
    keys: Vec<Vec<Expr>>,
    /// Copies of the operator reading input `i` as [`SHARD_INPUTS`]`[i]`.
    shards: Vec<Box<dyn Operator>>,
    pool: Arc<rayon::ThreadPool>,
}

impl Sharded {
    pub fn new(
        inputs: Vec<Box<dyn Operator>>,
        keys: Vec<Vec<Expr>>,
        shards: Vec<Box<dyn Operator>>,
        pool: Arc<rayon::ThreadPool>,
    ) -> Result<Self> {
        if shards.is_empty()
            || inputs.len() != keys.len()
            || inputs.len() > SHARD_INPUTS.len()
            || keys.iter().any(Vec::is_empty)
        {
            return Err(Error::internal(
                "a sharded operator needs shards and a key per input",
            ));
        }
        Ok(Sharded {
            inputs,
            keys,
            shards,
            pool,
        })
    }

    /// Splits the inputs' output by shard.
    fn route(&self, outputs: Vec<Vec<ChangeBatch>>) -> Result<Vec<Work>> {
        let n = self.shards.len();
        let mut work: Vec<Work> = (0..n).map(|_| Vec::new()).collect();
        for (side, batches) in outputs.into_iter().enumerate() {
            for batch in batches.into_iter().filter(|b| !b.is_empty()) {
                let part = shard_of(&batch, &self.keys[side], n)?;
                for (shard, changes) in split_by(&batch, &part, n)?.into_iter().enumerate() {
                    if !changes.is_empty() {
                        work[shard].push((side, changes));
                    }
                }
            }
        }
        Ok(work)
    }

    /// Hands each shard its work (and ends its epoch when `end_epoch`), in parallel unless the
    /// work is small; returns the shards' output.
    fn run(&mut self, work: Vec<Work>, end_epoch: bool) -> Result<Vec<ChangeBatch>> {
        let step = |shard: &mut Box<dyn Operator>, work: Work| -> Result<Vec<ChangeBatch>> {
            let mut out = Vec::new();
            for (side, changes) in work {
                out.extend(shard.push(SHARD_INPUTS[side], &changes)?);
            }
            if end_epoch {
                out.extend(shard.end_epoch()?);
            }
            Ok(out)
        };
        let rows: usize = work.iter().flatten().map(|(_, b)| b.len()).sum();
        let mut results: Vec<Result<Vec<ChangeBatch>>> = Vec::with_capacity(self.shards.len());
        if !end_epoch && rows < PARALLEL_ROWS {
            for (shard, w) in self.shards.iter_mut().zip(work) {
                results.push(step(shard, w));
            }
        } else {
            // Epoch ends always go parallel: closing windows is work even without input.
            results.resize_with(self.shards.len(), || Ok(Vec::new()));
            let step = &step;
            self.pool.in_place_scope(|scope| {
                let mut jobs = self.shards.iter_mut().zip(work).zip(results.iter_mut());
                let here = jobs.next();
                for ((shard, w), slot) in jobs {
                    scope.spawn(move |_| *slot = step(shard, w));
                }
                if let Some(((shard, w), slot)) = here {
                    *slot = step(shard, w);
                }
            });
        }
        let mut out = Vec::new();
        for result in results {
            out.extend(result?);
        }
        Ok(out)
    }
}

/// Each row's shard: a fixed hash of its key values. A row whose key cannot be evaluated (a
/// data exception such as division by zero) fails the same way in any shard; it goes to shard
/// 0, which sets it aside as the unsharded operator would.
fn shard_of(batch: &ChangeBatch, keys: &[Expr], n: usize) -> Result<Vec<u32>> {
    let of = |hash: u64| (hash % n as u64) as u32;
    match crate::rows::evaluate_keys(keys, batch.rows()) {
        Ok(values) => Ok(hash_keys(&values, batch.len())?
            .into_iter()
            .map(of)
            .collect()),
        Err(e) if e.state.is_data_exception() => (0..batch.len())
            .map(|i| {
                let row = batch.rows().slice(i, 1);
                match crate::rows::evaluate_keys(keys, &row) {
                    Ok(values) => Ok(hash_keys(&values, 1)?.first().map_or(0, |h| of(*h))),
                    Err(e) if e.state.is_data_exception() => Ok(0),
                    Err(e) => Err(e),
                }
            })
            .collect(),
        Err(e) => Err(e),
    }
}

impl Operator for Sharded {
    fn push(&mut self, source: ObjectId, changes: &ChangeBatch) -> Result<Vec<ChangeBatch>> {
        let outputs = self
            .inputs
            .iter_mut()
            .map(|i| i.push(source, changes))
            .collect::<Result<Vec<_>>>()?;
        if outputs.iter().all(Vec::is_empty) {
            return Ok(Vec::new());
        }
        let work = self.route(outputs)?;
        self.run(work, false)
    }

    fn end_epoch(&mut self) -> Result<Vec<ChangeBatch>> {
        let outputs = self
            .inputs
            .iter_mut()
            .map(|i| i.end_epoch())
            .collect::<Result<Vec<_>>>()?;
        let work = self.route(outputs)?;
        self.run(work, true)
    }

    fn state(&self) -> OperatorState {
        let mut total = OperatorState::default();
        for (i, shard) in self.shards.iter().enumerate() {
            let state = shard.state();
            if i == 0 {
                total.name = state.name;
            }
            total.rows += state.rows;
            total.bytes += state.bytes;
        }
        total
    }

    fn children(&self) -> Vec<&dyn Operator> {
        crate::inputs_of(&self.inputs)
    }

    fn children_mut(&mut self) -> Vec<&mut dyn Operator> {
        crate::inputs_of_mut(&mut self.inputs)
    }

    fn shards(&self) -> usize {
        self.shards.len()
    }

    /// The inputs' state, then each shard's under `<path>#<shard>` (a checkpoint restores
    /// into as many shards as it was taken with).
    fn save_tree(&mut self, path: &str, out: &mut Vec<(String, RecordBatch)>) -> Result<()> {
        crate::checkpoint::save_walk(self, path, out)?;
        for (i, shard) in self.shards.iter_mut().enumerate() {
            shard.save_tree(&format!("{path}#{i}"), out)?;
        }
        Ok(())
    }

    fn load_tree(&mut self, path: &str, parts: &mut HashMap<String, RecordBatch>) -> Result<()> {
        crate::checkpoint::load_walk(self, path, parts)?;
        for (i, shard) in self.shards.iter_mut().enumerate() {
            shard.load_tree(&format!("{path}#{i}"), parts)?;
        }
        let shards = self.shards.len();
        if parts.keys().any(|k| {
            k.strip_prefix(path)
                .and_then(|rest| rest.strip_prefix('#'))
                .and_then(|rest| rest.split([':', '.', '#']).next()?.parse::<usize>().ok())
                .is_some_and(|i| i >= shards)
        }) {
            return Err(Error::internal(format!(
                "the checkpoint was taken with more than {shards} shards"
            )));
        }
        Ok(())
    }
}
