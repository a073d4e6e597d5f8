//! The worker pool and the rounds that run a dataflow's copies on it (ADR 0009, step 3).
//!
//! A dataflow on `n` workers is `n` copies of its graph, one per worker (DBSP's shape:
//! every worker runs the whole circuit on its share of the data, and exchanges move rows
//! between workers by key). Entry points: [`Workers`] (the threads) and [`run_rounds`]: it
//! hands each copy its messages, runs the copies at once until each is quiet, then moves what
//! crossed an exchange to the copies it is for — in the order of the sending workers, so the
//! result does not depend on which thread ran first — and repeats until no message is left.
//! Each call of the engine (a batch, a watermark, a barrier) is such a run to quiet, so marks
//! and barriers stay ordered with the data on every worker.

use std::sync::Arc;

use eddy_common::{Error, Result};

use crate::graph::{Delivery, Graph, Message};

/// Below this many rows in flight a round runs its copies one after another on the calling
/// thread: handing a small batch to another thread costs more than it saves. (Tests cut
/// every batch, so that their small ones cross exchanges from every worker.)
pub(crate) const PARALLEL_ROWS: usize = if cfg!(test) { 2 } else { 2048 };

/// The threads dataflows run on: `count` workers, being the thread that drives a dataflow
/// plus a pool of `count - 1`. One pool serves every view.
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

    /// Everything on the calling thread; dataflows run as one copy.
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

    /// Runs `step` on every copy with its inbox, at once when `parallel`.
    fn each(&self, copies: &mut [Graph], inboxes: Vec<Vec<Delivery>>, parallel: bool) {
        let step = |copy: &mut Graph, inbox: Vec<Delivery>| {
            if !inbox.is_empty() {
                copy.run_all(inbox);
            }
        };
        match &self.pool {
            Some(pool) if parallel => pool.in_place_scope(|scope| {
                let mut jobs = copies.iter_mut().zip(inboxes);
                let here = jobs.next();
                for (copy, inbox) in jobs {
                    scope.spawn(move |_| step(copy, inbox));
                }
                if let Some((copy, inbox)) = here {
                    step(copy, inbox);
                }
            }),
            _ => {
                for (copy, inbox) in copies.iter_mut().zip(inboxes) {
                    step(copy, inbox);
                }
            }
        }
    }
}

/// Delivers `inboxes` (one per copy) and everything they cause, across exchanges, until every
/// copy is quiet. A round with a barrier in it, or at least [`PARALLEL_ROWS`] rows, runs its
/// copies in parallel (ending an epoch is work even without rows: windows close).
pub(crate) fn run_rounds(workers: &Workers, copies: &mut [Graph], mut inboxes: Vec<Vec<Delivery>>) {
    let n = copies.len();
    loop {
        let busy = inboxes.iter().filter(|i| !i.is_empty()).count();
        if busy == 0 {
            return;
        }
        let mut rows = 0;
        let mut barrier = false;
        for d in inboxes.iter().flatten() {
            match &d.message {
                Message::Data(changes) => rows += changes.len(),
                Message::Barrier(_) => barrier = true,
                Message::Watermark(_) => {}
            }
        }
        let parallel = busy > 1 && (barrier || rows >= PARALLEL_ROWS);
        workers.each(copies, inboxes, parallel);
        inboxes = (0..n).map(|_| Vec::new()).collect();
        for copy in copies.iter_mut() {
            for (worker, d) in copy.take_outbox() {
                if let Some(inbox) = inboxes.get_mut(worker) {
                    inbox.push(d);
                }
            }
        }
    }
}
