//! An [`Aggregate`] in a checkpoint: all of its groups, or only those changed since its last
//! save (incremental checkpoints, ADR 0012).
//!
//! From its first save (or load) on, the aggregate notes each group that an epoch touched
//! (once per save: a flag by group id and the id in a list) and the key of each group it
//! frees. A save of the changes writes the freed keys first (a batch of `key` and `removed`),
//! then the state of every noted group still alive, whole; loading drops a removed key's group
//! and replaces a group whose key it already holds, so a whole save followed by the saves of
//! changes in order gives the state of the last. Past half of the groups (in the list, or in
//! the rows written since the last whole save) the next save is whole, so a chain stays within
//! about 1.5 times the state.

use arrow::array::BooleanArray;

use super::*;
use crate::arrangement::SaveMode;

/// Groups noted besides half of the live ones before an aggregate stops noting.
const CHANGES_SLACK: usize = 4096;

/// The column of a batch of removed keys.
const REMOVED: &str = "removed";

/// What changed since the last save (see the module documentation).
#[derive(Default)]
pub(super) struct GroupChanges {
    noted: Vec<bool>,
    groups: Vec<GroupId>,
    /// Keys of freed groups, back to back.
    removed: Vec<u8>,
    removed_ends: Vec<usize>,
    /// Keys of noted groups that went to disk since (they are read from it at the save).
    spilled: Vec<u8>,
    spilled_ends: Vec<usize>,
    /// Rows written by saves of changes since the last whole save.
    since_full: usize,
}

impl GroupChanges {
    fn after(since_full: usize) -> GroupChanges {
        GroupChanges {
            since_full,
            ..GroupChanges::default()
        }
    }

    fn len(&self) -> usize {
        self.groups.len() + self.removed_ends.len() + self.spilled_ends.len()
    }
}

impl Aggregate {
    /// Notes that group `g` changed (an epoch touched it).
    pub(super) fn note_changed(&mut self, g: GroupId) {
        let live = self.live + self.spilled_groups();
        let Some(changes) = &mut self.changes else {
            return;
        };
        let at = g as usize;
        if changes.noted.len() <= at {
            changes.noted.resize(at + 1, false);
        }
        if !changes.noted[at] {
            changes.noted[at] = true;
            changes.groups.push(g);
            self.stop_noting_past(live);
        }
    }

    /// Notes that group `g`, about to be freed, is gone.
    pub(super) fn note_removed(&mut self, g: GroupId) {
        let key = std::mem::take(&mut self.keys[g as usize]);
        self.note_removed_key(&key);
        self.keys[g as usize] = key;
    }

    /// Notes that the group of `key` is gone.
    pub(super) fn note_removed_key(&mut self, key: &[u8]) {
        let live = self.live + self.spilled_groups();
        let Some(changes) = &mut self.changes else {
            return;
        };
        changes.removed.extend_from_slice(key);
        changes.removed_ends.push(changes.removed.len());
        self.stop_noting_past(live);
    }

    /// Notes that group `g`, about to be spilled, must be read from disk if it changed.
    pub(super) fn note_spilled(&mut self, g: GroupId) {
        let key = &self.keys[g as usize];
        let Some(changes) = &mut self.changes else {
            return;
        };
        if changes.noted.get(g as usize).copied().unwrap_or(false) {
            changes.spilled.extend_from_slice(key);
            changes.spilled_ends.push(changes.spilled.len());
        }
    }

    fn stop_noting_past(&mut self, live: usize) {
        if self
            .changes
            .as_ref()
            .is_some_and(|c| c.len() > live / 2 + CHANGES_SLACK)
        {
            self.changes = None;
        }
    }

    /// One batch of the `groups` part: these groups' keys, counts and accumulators.
    pub(super) fn save_groups(&mut self, groups: &[GroupId], changes: bool) -> Result<RecordBatch> {
        let at = |g: &GroupId| *g as usize;
        let mut columns: Vec<(String, ArrayRef)> = vec![
            (
                "key".into(),
                checkpoint::binary(groups.iter().map(|g| &*self.keys[at(g)])),
            ),
            (
                "count".into(),
                checkpoint::int64s(groups.iter().map(|g| self.counts[at(g)])),
            ),
            (
                "emitted".into(),
                checkpoint::optional_binary(groups.iter().map(|g| self.emitted[at(g)].as_deref())),
            ),
            (
                "window_end".into(),
                checkpoint::int64s(groups.iter().map(|g| self.window_end[at(g)])),
            ),
            (
                "dirty".into(),
                Arc::new(BooleanArray::from_iter(
                    groups.iter().map(|g| Some(self.is_dirty[at(g)])),
                )),
            ),
        ];
        for (i, call) in self.calls.iter_mut().enumerate() {
            call.save(i, groups, &mut columns)?;
        }
        let tag = changes.then_some(1);
        checkpoint::part(
            columns,
            &[("evicted_to", self.evicted_to), (checkpoint::CHANGES, tag)],
        )
    }

    /// The groups (all of them, or with [`SaveMode::Changes`] possibly those changed since the
    /// last save) into `out` as part `groups`, in batches of about
    /// [`crate::arrangement::SAVE_BATCH_BYTES`] (a binary column holds less than 2 GiB).
    pub(super) fn save_state(
        &mut self,
        mode: SaveMode,
        out: &mut dyn checkpoint::Sink,
    ) -> Result<()> {
        let live = self.live + self.spilled_groups();
        let incremental = mode == SaveMode::Changes
            && self
                .changes
                .as_ref()
                .is_some_and(|c| c.since_full + c.len() <= live / 2);
        let changes = std::mem::take(&mut self.changes);
        let (groups, since_full) = match (incremental, changes) {
            (true, Some(changes)) => {
                if !changes.removed_ends.is_empty() {
                    let starts = std::iter::once(0).chain(changes.removed_ends.iter().copied());
                    let keys = starts
                        .zip(&changes.removed_ends)
                        .map(|(start, end)| &changes.removed[start..*end]);
                    let columns: Vec<(&str, ArrayRef)> = vec![
                        ("key", checkpoint::binary(keys)),
                        (
                            REMOVED,
                            Arc::new(BooleanArray::from(vec![true; changes.removed_ends.len()])),
                        ),
                    ];
                    out.put(
                        "groups",
                        checkpoint::part(columns, &[(checkpoint::CHANGES, Some(1))])?,
                    )?;
                }
                let groups: Vec<GroupId> = (changes.groups.iter().copied())
                    .filter(|&g| self.alive[g as usize])
                    .collect();
                self.defer_spilled_changes(&changes, out)?;
                (groups, changes.since_full + changes.len())
            }
            _ => (
                (0..self.keys.len() as GroupId)
                    .filter(|&g| self.alive[g as usize])
                    .collect(),
                0,
            ),
        };
        let mut put = false;
        let mut batch: Vec<GroupId> = Vec::new();
        let mut bytes = 0;
        for g in groups {
            batch.push(g);
            bytes += self.keys[g as usize].len()
                + self.emitted[g as usize].as_ref().map_or(0, |e| e.len())
                + self.calls.iter().map(|c| c.size(g)).sum::<usize>();
            if bytes >= crate::arrangement::SAVE_BATCH_BYTES {
                out.put("groups", self.save_groups(&batch, incremental)?)?;
                put = true;
                batch.clear();
                bytes = 0;
            }
        }
        if !batch.is_empty() || !put {
            out.put("groups", self.save_groups(&batch, incremental)?)?;
        }
        if !incremental && let Some(spilled) = self.spilled_part() {
            out.defer(Box::new(move |sink| spilled.write(sink)))?;
        }
        // Past half of the groups since the last whole save, the next save is whole.
        self.changes = (since_full <= live / 2).then(|| GroupChanges::after(since_full));
        Ok(())
    }

    /// Takes back a batch of what [`Aggregate::save_state`] wrote.
    pub(super) fn load_state(&mut self, name: &str, batch: &RecordBatch) -> Result<()> {
        if name != "groups" {
            return Err(checkpoint::unknown_part("Aggregate", name));
        }
        let changes = checkpoint::is_changes(batch);
        let since_full = self.changes.take().map_or(0, |c| c.since_full)
            + if changes { batch.num_rows() } else { 0 };
        self.key_converter()?;
        let keys = checkpoint::binary_column(batch, "key")?;
        if changes {
            // A group a save of changes replaces or removes may be on disk by now.
            self.recall(keys.iter().flatten())?;
        }
        if batch.column_by_name(REMOVED).is_some() {
            for i in 0..batch.num_rows() {
                if let Some(g) = self.find_group(keys.value(i)) {
                    self.free_group(g)?;
                }
            }
        } else {
            self.load_groups(batch, changes)?;
        }
        self.changes = Some(GroupChanges::after(since_full));
        self.settle(false)
    }

    /// The noted groups of `changes` that went to disk and are still there: a job `out` runs
    /// later reads them from the store as it is now.
    fn defer_spilled_changes(
        &self,
        changes: &GroupChanges,
        out: &mut dyn checkpoint::Sink,
    ) -> Result<()> {
        if changes.spilled_ends.is_empty() {
            return Ok(());
        }
        let Some((mut reader, schema)) = self.spilled_reader() else {
            return Ok(()); // nothing on disk: each was brought back or is gone
        };
        let starts = std::iter::once(0).chain(changes.spilled_ends.iter().copied());
        let mut keys: Vec<u8> = Vec::new();
        let mut ends: Vec<usize> = Vec::new();
        for (start, &end) in starts.zip(&changes.spilled_ends) {
            let key = &changes.spilled[start..end];
            // One brought back is in memory, noted again when its epoch touched it.
            if self.find_group(key).is_none() {
                keys.extend_from_slice(key);
                ends.push(keys.len());
            }
        }
        let evicted_to = self.evicted_to;
        out.defer(Box::new(move |sink| {
            let mut batches = spill::StoredBatches::new(&schema, evicted_to, true)?;
            let starts = std::iter::once(0).chain(ends.iter().copied());
            for (start, &end) in starts.zip(&ends) {
                if let Some(stored) = reader.get(&keys[start..end])? {
                    batches.push(&stored, sink)?;
                }
            }
            batches.flush(sink)
        }))
    }

    fn load_groups(&mut self, batch: &RecordBatch, changes: bool) -> Result<()> {
        // A global aggregate made its group already: start empty, then add the saved group.
        // A grouped one adds the groups to those it has (the parts of several shards load one
        // after another when a checkpoint is re-sharded); a save of changes replaces them.
        if self.global && !changes {
            let alive: Vec<GroupId> = (0..self.keys.len() as GroupId)
                .filter(|&g| self.alive[g as usize])
                .collect();
            for g in alive {
                self.free_group(g)?;
            }
            self.dirty.clear();
            self.is_dirty.iter_mut().for_each(|d| *d = false);
            self.expiry.clear();
        }
        self.add_groups(batch, changes)?;
        self.evicted_to = checkpoint::scalar(batch, "evicted_to")?;
        Ok(())
    }

    /// Makes the groups of a batch of the `groups` part (`replace`: in place of those of the
    /// same keys in memory); returns their ids.
    pub(super) fn add_groups(
        &mut self,
        batch: &RecordBatch,
        replace: bool,
    ) -> Result<Vec<GroupId>> {
        let keys = checkpoint::binary_column(batch, "key")?;
        let counts = checkpoint::int64_column(batch, "count")?;
        let emitted = checkpoint::binary_column(batch, "emitted")?;
        let ends = checkpoint::int64_column(batch, "window_end")?;
        let dirty = checkpoint::column(batch, "dirty")?
            .as_boolean_opt()
            .ok_or_else(|| Error::internal("checkpointed dirty flags are not boolean"))?
            .clone();
        let mut groups = Vec::with_capacity(batch.num_rows());
        for i in 0..batch.num_rows() {
            if replace && let Some(g) = self.find_group(keys.value(i)) {
                self.free_group(g)?;
            }
            let key: Box<[u8]> = keys.value(i).into();
            let hash = self.hasher.hash_one(&*key);
            let g = self.new_group(key, ends.value(i))?;
            if !self.global {
                let (keys, hasher) = (&self.keys, &self.hasher);
                self.table
                    .insert_unique(hash, g, |&x| hasher.hash_one(&*keys[x as usize]));
            }
            self.counts[g as usize] = counts.value(i);
            self.emitted[g as usize] = emitted.is_valid(i).then(|| emitted.value(i).into());
            if dirty.value(i) {
                self.mark_dirty(g);
            }
            groups.push(g);
        }
        for (i, call) in self.calls.iter_mut().enumerate() {
            call.load(i, batch, &groups)?;
        }
        for &g in &groups {
            self.measure(g);
        }
        Ok(groups)
    }

    /// The live group of `key`.
    fn find_group(&self, key: &[u8]) -> Option<GroupId> {
        if self.global {
            return (0..self.keys.len() as GroupId).find(|&g| self.alive[g as usize]);
        }
        let hash = self.hasher.hash_one(key);
        self.table
            .find(hash, |&g| &*self.keys[g as usize] == key)
            .copied()
    }
}
