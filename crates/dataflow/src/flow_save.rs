//! A dataflow's state in a checkpoint: [`Dataflow::save`] puts every operator's parts into a
//! sink as they are made; [`Dataflow::load`] takes them back one batch at a time, so neither
//! holds more than a batch of the state besides the operators' own.

use arrow::array::RecordBatch;
use eddy_common::{Error, Result};

use super::{Dataflow, NodeId};
use crate::arrangement::SaveMode;
use crate::checkpoint::{Prefixed, Sink};

impl Dataflow {
    /// Puts every operator's state into `out` as named batches (see [`crate::checkpoint`] for
    /// the names), at the end of an epoch: an operator running in every copy saves each
    /// copy's parts under `path#worker`. With [`SaveMode::Changes`] (the caller vouches that
    /// the last save, or the load, is kept), an arrangement's part may be only its changes
    /// since then: loaded after the parts of that save, in order
    /// ([`crate::checkpoint::is_changes`]).
    pub fn save(&mut self, mode: SaveMode, out: &mut dyn Sink) -> Result<()> {
        for id in 0..self.places.len() {
            let path = self.places[id].path.clone();
            if self.places[id].shards > 1 {
                for i in 0..self.copies.len() {
                    let mut named = Prefixed {
                        prefix: format!("{path}#{i}"),
                        out: &mut *out,
                    };
                    self.handler(i, id)?.save(mode, &mut named)?;
                }
            } else {
                let mut named = Prefixed {
                    prefix: path,
                    out: &mut *out,
                };
                self.handler(0, id)?.save(mode, &mut named)?;
            }
        }
        Ok(())
    }

    /// Restores `parts` (from [`Dataflow::save`] of the same plan, each part's batches in the
    /// order they were put) into this freshly built dataflow, one batch at a time. Fails when
    /// a part has no operator to take it (a changed plan, or a checkpoint taken with another
    /// number of shards).
    pub fn load(
        &mut self,
        parts: impl IntoIterator<Item = Result<(String, RecordBatch)>>,
    ) -> Result<()> {
        for part in parts {
            let (key, batch) = part?;
            let (id, shard, name) = self.part_place(&key)?;
            let sharded = self.places[id].shards > 1;
            if sharded != shard.is_some() || shard.is_some_and(|s| s >= self.places[id].shards) {
                return Err(Error::internal(format!(
                    "checkpointed state {key} was taken with another number of shards than {}",
                    self.places[id].shards
                )));
            }
            self.handler(shard.unwrap_or(0), id)?.load(name, &batch)?;
        }
        Ok(())
    }

    /// Restores `parts` of a checkpoint of the same plan taken on another number of workers
    /// (or with another routing hash), one batch at a time: the rows of a part of an operator
    /// that runs on every worker are routed to the copy their key picks now
    /// ([`crate::graph::Handler::part_keys`]), the parts of one that runs once are put
    /// together on worker 0. Fails when an operator cannot name its rows' keys.
    pub fn load_resharded(
        &mut self,
        parts: impl IntoIterator<Item = Result<(String, RecordBatch)>>,
    ) -> Result<()> {
        let n = self.copies.len();
        for part in parts {
            let (key, batch) = part?;
            let (id, _, name) = self.part_place(&key)?;
            if self.places[id].shards <= 1 {
                self.handler(0, id)?.load(name, &batch)?;
                continue;
            }
            // Each piece loads on its own (operators add what they load to what they hold):
            // the parts of two shards need not have the same columns.
            let keys = self
                .handler(0, id)?
                .part_keys(name, &batch)?
                .ok_or_else(|| {
                    Error::internal(format!(
                        "the state {name} of operator {} cannot be re-sharded",
                        self.places[id].path
                    ))
                })?;
            let keys: Vec<_> = match &self.places[id].route_positions {
                Some(positions) => positions
                    .iter()
                    .filter_map(|p| keys.get(*p).cloned())
                    .collect(),
                None => keys,
            };
            let hashes = crate::route::hash_keys(&keys, batch.num_rows())?;
            let mut rows: Vec<Vec<u32>> = (0..n).map(|_| Vec::new()).collect();
            for (i, h) in hashes.iter().enumerate() {
                rows[(h % n as u64) as usize].push(i as u32);
            }
            for (worker, rows) in rows.into_iter().enumerate() {
                let rows = arrow::array::UInt32Array::from(rows);
                let piece = arrow::compute::take_record_batch(&batch, &rows)
                    .map_err(crate::rows::arrow_error)?;
                self.handler(worker, id)?.load(name, &piece)?;
            }
        }
        Ok(())
    }

    /// The node, shard (`None`: an operator that runs once) and part name a saved part's
    /// key `<path>[#<shard>]:<name>` names.
    fn part_place<'k>(&self, key: &'k str) -> Result<(NodeId, Option<usize>, &'k str)> {
        let no_operator = || {
            Error::internal(format!(
                "checkpointed state {key} has no operator in the dataflow"
            ))
        };
        let (place, name) = key.split_once(':').ok_or_else(no_operator)?;
        let (path, shard) = match place.split_once('#') {
            Some((path, shard)) => (
                path,
                Some(shard.parse::<usize>().map_err(|_| no_operator())?),
            ),
            None => (place, None),
        };
        let id = self
            .places
            .iter()
            .position(|p| p.path == path)
            .ok_or_else(no_operator)?;
        Ok((id, shard, name))
    }
}

/// Tests' restart: saves `flow`'s state, sends every part through an Arrow IPC file (as the
/// engine's checkpoints do), and loads it into the dataflow `rebuild` makes.
#[cfg(test)]
pub(crate) fn restart(flow: &mut Dataflow, rebuild: impl FnOnce() -> Dataflow) {
    let mut checkpoints = TestCheckpoints::default();
    checkpoints.save(flow);
    checkpoints.restart(flow, rebuild);
}

/// Tests' checkpoints as the engine keeps them: after the first, each save writes only the
/// changes of arrangements, which follow that part's earlier batches (a part saved whole
/// replaces them; a part absent is empty); every batch goes through an Arrow IPC file. What a
/// save defers runs as the engine's writer runs it: after the flow went on (at the next save
/// or restart).
#[cfg(test)]
#[derive(Default)]
pub(crate) struct TestCheckpoints {
    /// Each part's batches, in the order a restart loads them.
    parts: Vec<(String, Vec<RecordBatch>)>,
    /// The flow's last save is in `parts`: the next may be only its changes.
    saved: bool,
    /// The last save, while what it deferred has not run.
    pending: Option<crate::checkpoint::Later>,
}

#[cfg(test)]
impl TestCheckpoints {
    /// Takes a checkpoint of `flow` (complete once what it deferred ran).
    pub(crate) fn save(&mut self, flow: &mut Dataflow) {
        self.complete();
        let mode = if self.saved {
            SaveMode::Changes
        } else {
            SaveMode::Full
        };
        let mut sink = crate::checkpoint::Later::default();
        flow.save(mode, &mut sink).unwrap();
        self.pending = Some(sink);
        self.saved = true;
    }

    /// Runs what the last save deferred and makes its batches the checkpoint's.
    fn complete(&mut self) {
        let Some(pending) = self.pending.take() else {
            return;
        };
        let mut saved: Vec<(String, Vec<RecordBatch>)> = Vec::new();
        for (name, batch) in pending.finish() {
            let batch = ipc_round_trip(&batch);
            match saved.iter_mut().find(|(n, _)| *n == name) {
                Some((_, batches)) => batches.push(batch),
                None => saved.push((name, vec![batch])),
            }
        }
        let before = std::mem::take(&mut self.parts);
        for (name, batches) in saved {
            let mut list = Vec::new();
            if batches.iter().all(crate::checkpoint::is_changes) {
                if let Some((_, earlier)) = before.iter().find(|(n, _)| *n == name) {
                    list.extend(earlier.iter().cloned());
                }
                list.extend(batches.into_iter().filter(|b| b.num_rows() > 0));
            } else {
                list = batches;
            }
            if !list.is_empty() {
                self.parts.push((name, list));
            }
        }
    }

    /// Restarts `flow` from the last checkpoint into the dataflow `rebuild` makes (on another
    /// number of workers: re-sharded, and the next save is whole).
    pub(crate) fn restart(&mut self, flow: &mut Dataflow, rebuild: impl FnOnce() -> Dataflow) {
        self.complete();
        let parts = self
            .parts
            .iter()
            .flat_map(|(name, batches)| batches.iter().map(move |b| Ok((name.clone(), b.clone()))));
        let mut fresh = rebuild();
        if fresh.copies.len() == flow.copies.len() {
            fresh.load(parts).unwrap();
        } else {
            fresh.load_resharded(parts).unwrap();
            self.saved = false;
        }
        *flow = fresh;
    }

    /// Rows of the checkpoint's batches that saves of changes wrote (after what they defer
    /// ran).
    pub(crate) fn changed_rows(&mut self) -> usize {
        self.complete();
        (self.parts.iter().flat_map(|(_, batches)| batches))
            .filter(|b| crate::checkpoint::is_changes(b))
            .map(RecordBatch::num_rows)
            .sum()
    }
}

#[cfg(test)]
fn ipc_round_trip(batch: &RecordBatch) -> RecordBatch {
    let mut file = Vec::new();
    let mut writer = arrow::ipc::writer::FileWriter::try_new(&mut file, &batch.schema()).unwrap();
    writer.write(batch).unwrap();
    writer.finish().unwrap();
    drop(writer);
    let mut reader =
        arrow::ipc::reader::FileReader::try_new(std::io::Cursor::new(file), None).unwrap();
    reader.next().unwrap().unwrap()
}
