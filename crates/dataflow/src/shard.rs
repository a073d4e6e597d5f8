//! The exchange: a stateful operator sharded by key across workers.
//!
//! A [`Sharded`] node routes the changes arriving on each input by a fixed hash of the
//! operator's key (group keys, join keys, top-N partition) to one of `n` shards — copies of the
//! operator, each holding the state of its keys only — and runs the shards in parallel on the
//! [`Workers`] pool. Equal keys always reach the same shard, so a retraction meets its insert,
//! and each shard's output is the unsharded operator's output for its keys: the shards'
//! outputs together are the operator's output. Every shard sees every watermark and barrier, so
//! they close windows at the same watermark; shard 0's watermarks stand for all of them.
//!
//! Until the worker pool of ADR 0009 step 3, the nodes upstream of an exchange run on the
//! thread that drives the graph.

use std::sync::Arc;

use eddy_common::{ChangeBatch, Error, Result};

use crate::OperatorState;
use crate::graph::{Barrier, Handler, Output, Watermark};
use crate::plan::Expr;
use crate::route::hash_keys;
use crate::rows::split_by;

/// Below this many input rows a push runs its shards one after another on the calling thread:
/// handing a small batch to another thread costs more than it saves.
const PARALLEL_ROWS: usize = 2048;

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

pub(crate) struct Sharded {
    /// Per input, the expressions (over its rows) whose values pick a row's shard; a join's
    /// sides list their keys in the same order, so matching rows meet.
    keys: Vec<Vec<Expr>>,
    shards: Vec<Box<dyn Handler>>,
    pool: Arc<rayon::ThreadPool>,
}

impl Sharded {
    pub(crate) fn new(
        keys: Vec<Vec<Expr>>,
        shards: Vec<Box<dyn Handler>>,
        pool: Arc<rayon::ThreadPool>,
    ) -> Result<Self> {
        if shards.is_empty() || keys.is_empty() || keys.iter().any(Vec::is_empty) {
            return Err(Error::internal(
                "a sharded operator needs shards and a key per input",
            ));
        }
        Ok(Sharded { keys, shards, pool })
    }

    /// Calls every shard with its share of the work (`None`: nothing), in parallel when
    /// `parallel`; appends their output in shard order (watermarks: shard 0's).
    fn run<W: Send>(
        &mut self,
        work: Vec<W>,
        parallel: bool,
        call: impl Fn(&mut dyn Handler, W, &mut Output) -> Result<()> + Sync,
        out: &mut Output,
    ) -> Result<()> {
        let step = |shard: &mut Box<dyn Handler>, w: W| {
            let mut o = Output::default();
            call(shard.as_mut(), w, &mut o).map(|()| o)
        };
        let mut results: Vec<Result<Output>> = Vec::with_capacity(self.shards.len());
        if parallel {
            results.resize_with(self.shards.len(), || Ok(Output::default()));
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
        } else {
            for (shard, w) in self.shards.iter_mut().zip(work) {
                results.push(step(shard, w));
            }
        }
        for (i, result) in results.into_iter().enumerate() {
            out.append(result?, i == 0);
        }
        Ok(())
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

impl Handler for Sharded {
    fn on_data(&mut self, input: usize, changes: ChangeBatch, out: &mut Output) -> Result<()> {
        let keys = self
            .keys
            .get(input)
            .ok_or_else(|| Error::internal(format!("a sharded operator has no input {input}")))?;
        let n = self.shards.len();
        let part = shard_of(&changes, keys, n)?;
        let work = split_by(&changes, &part, n)?;
        let parallel = changes.len() >= PARALLEL_ROWS;
        self.run(
            work,
            parallel,
            |shard, changes, out| {
                if changes.is_empty() {
                    return Ok(());
                }
                shard.on_data(input, changes, out)
            },
            out,
        )
    }

    fn on_watermark(&mut self, input: usize, mark: Watermark, out: &mut Output) -> Result<()> {
        let work = vec![(); self.shards.len()];
        self.run(
            work,
            false,
            |shard, (), out| shard.on_watermark(input, mark, out),
            out,
        )
    }

    /// Epoch ends always go parallel: closing windows is work even without input.
    fn on_barrier(&mut self, barrier: &Barrier, out: &mut Output) -> Result<()> {
        let work = vec![(); self.shards.len()];
        self.run(
            work,
            true,
            |shard, (), out| shard.on_barrier(barrier, out),
            out,
        )
    }

    fn name(&self) -> String {
        self.shards.first().map(|s| s.name()).unwrap_or_default()
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

    /// Each shard saves its own parts ([`Handler::shards`]); the node itself has none.
    fn save(&mut self) -> Result<crate::checkpoint::Parts> {
        Err(Error::internal(
            "a sharded operator's state is saved per shard",
        ))
    }

    fn shards(&mut self) -> Option<&mut [Box<dyn Handler>]> {
        Some(&mut self.shards)
    }
}
