//! The disk tier of an [`Aggregate`] (ADR 0012): past its share of the server's
//! [`MemoryBudget`], an aggregate moves its coldest groups to the spill store and brings a
//! group back when a batch has rows for it.
//!
//! A group is stored under its key as its row of the checkpoint's `groups` part (key, count,
//! last output, window end and every accumulator's state, as [`Aggregate::save_groups`]
//! writes them), in Arrow's row format: spilling groups is saving them and freeing them,
//! bringing one back is loading it. A whole save writes the groups on disk through a job that
//! reads the store as it was at the save, off the operators' thread; a save of changes reads
//! the changed groups that went to disk since the last save the same way.
//!
//! Only groups without pending output spill: a dirty group waits for its epoch's end, an open
//! window under EMIT ON WINDOW CLOSE for its close. Eviction sweeps the groups like a clock,
//! skipping those the current epoch used (see [`Aggregate::coldest`]). A spilled group of a window is also
//! entered in the store's expiry keyspace under the watermark that frees its window, so
//! windows the watermark passed leave the disk as they leave memory. An aggregate whose state
//! has no row format (none of DataFusion's accumulators today) keeps its groups in memory.

use std::hash::BuildHasher;
use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch};
use arrow::compute::cast;
use arrow::datatypes::{Schema, SchemaRef};
use arrow::row::{RowConverter, Rows, SortField};
use eddy_common::{Error, Result};
use hashbrown::HashTable;

use super::Aggregate;
use crate::aggregate_call::GroupId;
use crate::checkpoint;
use crate::rows::arrow_error;
use crate::spill::{MemoryBudget, SpilledReader, SpilledSnapshot, Tier};

/// What a group costs in memory besides its key, its last output and its accumulators: its
/// slots in the per-group vectors and its table bucket.
const GROUP_BYTES: usize = 64;

/// Groups written to the store at once, at most (one batch of the `groups` part each).
const SPILL_GROUPS: usize = 8192;

/// No expiry.
const NEVER: i64 = i64::MAX;

/// A group's mark in [`GroupSpill::used`] once a sweep chose it (no epoch's).
const CHOSEN: u32 = u32::MAX;

/// An aggregate's link to the budget and the store, and what it knows of its groups' use.
pub(super) struct GroupSpill {
    tier: Tier,
    /// How a group is stored: made at the first spill, from its batch.
    format: Option<Format>,
    /// The state's types have no row format: the groups stay in memory.
    unsupported: bool,
    /// Bytes of the groups in memory, and each group's as last measured.
    resident: usize,
    sizes: Vec<usize>,
    /// The epoch (counted from 1, wrapping) in which each group was last used (0: none
    /// since it came to memory), and the current one.
    used: Vec<u32>,
    tick: u32,
    /// The clock hand of eviction, a group id.
    hand: u32,
}

impl GroupSpill {
    pub(super) fn new(budget: &Arc<MemoryBudget>) -> GroupSpill {
        GroupSpill {
            tier: Tier::new(budget),
            format: None,
            unsupported: false,
            resident: 0,
            sizes: Vec::new(),
            used: Vec::new(),
            tick: 1,
            hand: 0,
        }
    }

    fn slot(&mut self, g: GroupId) -> usize {
        let at = g as usize;
        if self.sizes.len() <= at {
            self.sizes.resize(at + 1, 0);
            self.used.resize(at + 1, 0);
        }
        at
    }
}

/// The `groups` part's columns in Arrow's row format: how a group is stored.
pub(super) struct Format {
    /// The part's columns (names and types; no metadata).
    schema: SchemaRef,
    converter: RowConverter,
}

impl Format {
    /// The format of batches shaped as `schema`; `None` if a column's type has no row format.
    fn of(schema: &SchemaRef) -> Result<Option<Format>> {
        let fields: Vec<SortField> = (schema.fields().iter())
            .map(|f| SortField::new(f.data_type().clone()))
            .collect();
        if !RowConverter::supports_fields(&fields) {
            return Ok(None);
        }
        Ok(Some(Format {
            schema: Arc::new(Schema::new(schema.fields().clone())),
            converter: RowConverter::new(fields).map_err(arrow_error)?,
        }))
    }

    /// Each row of `batch` (a batch of the `groups` part) in this format.
    fn rows(&self, batch: &RecordBatch) -> Result<Rows> {
        let fields = self.schema.fields();
        if batch.num_columns() != fields.len() {
            return Err(Error::internal(
                "an aggregate's state changed shape between two spills",
            ));
        }
        let columns = (batch.columns().iter().zip(fields.iter()))
            .map(|(c, f)| match c.data_type() == f.data_type() {
                true => Ok(Arc::clone(c)),
                false => cast(c, f.data_type()).map_err(arrow_error),
            })
            .collect::<Result<Vec<ArrayRef>>>()?;
        self.converter
            .convert_columns(&columns)
            .map_err(arrow_error)
    }

    /// A batch of the `groups` part of stored groups, with `scalars` in its metadata.
    fn batch<'a>(
        &self,
        stored: impl IntoIterator<Item = &'a [u8]>,
        scalars: &[(&str, Option<i64>)],
    ) -> Result<RecordBatch> {
        let parser = self.converter.parser();
        let columns = (self.converter)
            .convert_rows(stored.into_iter().map(|v| parser.parse(v)))
            .map_err(arrow_error)?;
        let names = self.schema.fields().iter().map(|f| f.name().clone());
        checkpoint::part(names.zip(columns).collect(), scalars)
    }
}

impl Aggregate {
    /// Groups on disk now.
    pub(super) fn spilled_groups(&self) -> usize {
        self.spill.as_ref().map_or(0, |s| s.tier.keys)
    }

    /// Approximate bytes group `g` holds in memory.
    pub(super) fn group_bytes(&self, g: GroupId) -> usize {
        let at = g as usize;
        GROUP_BYTES
            + self.keys[at].len()
            + self.emitted[at].as_ref().map_or(0, |e| e.len())
            + self.calls.iter().map(|c| c.size(g)).sum::<usize>()
    }

    /// Measures live group `g` again (made, changed, brought back).
    pub(super) fn measure(&mut self, g: GroupId) {
        if self.spill.is_none() {
            return;
        }
        let bytes = self.group_bytes(g);
        if let Some(spill) = &mut self.spill {
            let at = spill.slot(g);
            spill.resident = spill.resident + bytes - spill.sizes[at];
            spill.sizes[at] = bytes;
        }
    }

    /// Group `g` leaves memory.
    pub(super) fn forget(&mut self, g: GroupId) {
        if let Some(spill) = &mut self.spill {
            let at = spill.slot(g);
            spill.resident -= spill.sizes[at];
            spill.sizes[at] = 0;
            spill.used[at] = 0;
        }
    }

    /// Group `g` is used by the batch at hand.
    pub(super) fn touch(&mut self, g: GroupId) {
        if let Some(spill) = &mut self.spill {
            let at = spill.slot(g);
            spill.used[at] = spill.tick;
        }
    }

    /// Brings the groups of `keys` (encoded) that are on disk back into memory.
    pub(super) fn recall<'k>(&mut self, keys: impl IntoIterator<Item = &'k [u8]>) -> Result<()> {
        let Some(spill) = self.spill.as_deref_mut().filter(|s| s.tier.keys > 0) else {
            return Ok(());
        };
        let store = spill.tier.store()?;
        let (mut looked_up, mut bytes) = (HashTable::<(u64, usize, usize)>::new(), Vec::new());
        let (mut found, mut values) = (Vec::new(), Vec::new());
        for key in keys {
            let hash = self.hasher.hash_one(key);
            let resident = |&g: &GroupId| &*self.keys[g as usize] == key;
            if self.table.find(hash, resident).is_some() {
                continue;
            }
            let seen =
                |&(h, at, len): &(u64, usize, usize)| h == hash && &bytes[at..at + len] == key;
            if looked_up.find(hash, seen).is_some() {
                continue;
            }
            looked_up.insert_unique(hash, (hash, bytes.len(), key.len()), |e| e.0);
            bytes.extend_from_slice(key);
            if let Some(value) = store.get(spill.tier.store_key(key))? {
                found.push((bytes.len() - key.len(), key.len()));
                values.push(value);
            }
        }
        if values.is_empty() {
            return Ok(());
        }
        let format = (spill.format.as_ref())
            .ok_or_else(|| Error::internal("an aggregate's groups are on disk without a format"))?;
        let batch = format.batch(values.iter().map(|v| &v[..]), &[])?;
        let mut removed = store.batch();
        for &(at, len) in &found {
            removed.remove(spill.tier.store_key(&bytes[at..at + len]));
        }
        removed.commit()?;
        spill.tier.count(0, found.len());
        self.add_groups(&batch, false)?;
        Ok(())
    }

    /// Ends a batch (`epoch_end`: an epoch): reports the groups in memory to the budget and,
    /// past it, spills the coldest groups until the aggregate is back within its share.
    pub(super) fn settle(&mut self, epoch_end: bool) -> Result<()> {
        let Some(spill) = self.spill.as_deref_mut() else {
            return Ok(());
        };
        let now = spill.resident;
        let total = spill.tier.report(now);
        let target = spill.tier.share(now, total).filter(|_| !spill.unsupported);
        if let Some(target) = target {
            let chosen = self.coldest(target);
            self.spill_groups(&chosen)?;
        }
        if let Some(spill) = self.spill.as_deref_mut() {
            spill.tier.report(spill.resident);
            if epoch_end {
                spill.tick = (spill.tick % (CHOSEN - 1)) + 1;
            }
        }
        Ok(())
    }

    /// Groups to spill to hold at most `target` bytes, sweeping from the clock hand: those
    /// without pending output and not used in this epoch. A group the epoch used is never
    /// taken, even past the share: it was in memory for the epoch anyway, and one used by
    /// every epoch (q16's few channels) would go to disk and come back each time.
    fn coldest(&mut self, target: usize) -> Vec<GroupId> {
        let mut chosen = Vec::new();
        let Some(spill) = self.spill.as_deref_mut() else {
            return chosen;
        };
        let n = self.keys.len() as u32;
        let mut resident = spill.resident;
        for _ in 0..n {
            if resident <= target {
                break;
            }
            let g = spill.hand % n;
            spill.hand = (g + 1) % n;
            let at = spill.slot(g);
            let used = spill.used[at];
            if !self.alive[at] || self.is_dirty[at] || used == CHOSEN || used == spill.tick {
                continue;
            }
            spill.used[at] = CHOSEN;
            resident = resident.saturating_sub(spill.sizes[at]);
            chosen.push(g);
        }
        chosen
    }

    /// Writes `groups` to the store and frees them.
    fn spill_groups(&mut self, groups: &[GroupId]) -> Result<()> {
        let allowed = self
            .window
            .as_ref()
            .map_or(0, |(w, _)| w.lateness.allowed_micros);
        for chunk in groups.chunks(SPILL_GROUPS) {
            let batch = self.save_groups(chunk, false)?;
            let Some(spill) = self.spill.as_deref_mut() else {
                return Ok(());
            };
            if spill.format.is_none() {
                spill.format = Format::of(&batch.schema())?;
                if spill.format.is_none() {
                    spill.unsupported = true;
                    tracing::warn!("an aggregate's state has no row format: it stays in memory");
                    return Ok(());
                }
            }
            let rows = (spill.format.as_ref())
                .ok_or_else(|| Error::internal("no format to spill an aggregate's groups"))?
                .rows(&batch)?;
            let store = spill.tier.store()?;
            let mut written = store.batch();
            for (j, &g) in chunk.iter().enumerate() {
                let key = &self.keys[g as usize];
                written.insert(spill.tier.store_key(key), rows.row(j).data());
                let end = self.window_end[g as usize];
                if end != NEVER {
                    spill
                        .tier
                        .enter_due(&mut written, end.saturating_add(allowed), key);
                }
            }
            written.commit()?;
            spill.tier.count(chunk.len(), 0);
            for &g in chunk {
                self.note_spilled(g);
                self.unload(g)?;
            }
        }
        Ok(())
    }

    /// Drops the spilled groups of windows the watermark passed by more than the allowed
    /// lateness (those in memory leave it by [`Aggregate::evict`]).
    pub(super) fn expire_spilled(&mut self, watermark: i64) -> Result<()> {
        let Some(spill) = self.spill.as_deref_mut() else {
            return Ok(());
        };
        if !spill.tier.due_by(watermark) {
            return Ok(());
        }
        let store = spill.tier.store()?;
        let mut batch = store.batch();
        let mut gone: Vec<Vec<u8>> = Vec::new();
        for key in spill.tier.take_due(&store, &mut batch, watermark)? {
            // A group brought back since is in memory, or gone.
            let hash = self.hasher.hash_one(&key);
            let resident = |&g: &GroupId| *self.keys[g as usize] == *key;
            if self.table.find(hash, resident).is_some() {
                continue;
            }
            if store.get(spill.tier.store_key(&key))?.is_some() {
                batch.remove(spill.tier.store_key(&key));
                gone.push(key);
            }
        }
        batch.commit()?;
        spill.tier.count(0, gone.len());
        for key in gone {
            self.note_removed_key(&key);
        }
        Ok(())
    }

    /// A job writing the groups on disk now (a whole save's spilled part), to run later.
    pub(super) fn spilled_part(&self) -> Option<SpilledGroups> {
        let spill = self.spill.as_deref()?;
        Some(SpilledGroups {
            schema: Arc::clone(&spill.format.as_ref()?.schema),
            evicted_to: self.evicted_to,
            snapshot: spill.tier.snapshot()?,
        })
    }

    /// A reader of the groups on disk now (a save of changes' spilled groups), with their
    /// format, to read later.
    pub(super) fn spilled_reader(&self) -> Option<(SpilledReader, SchemaRef)> {
        let spill = self.spill.as_deref()?;
        let schema = Arc::clone(&spill.format.as_ref()?.schema);
        Some((spill.tier.reader()?, schema))
    }
}

/// The groups an aggregate had on disk at a save ([`Aggregate::spilled_part`]).
pub(super) struct SpilledGroups {
    schema: SchemaRef,
    evicted_to: Option<i64>,
    snapshot: SpilledSnapshot,
}

impl SpilledGroups {
    /// Puts every group into `out` as part `groups`, in batches of about
    /// [`crate::arrangement::SAVE_BATCH_BYTES`].
    pub(super) fn write(self, out: &mut dyn checkpoint::Sink) -> Result<()> {
        let mut batches = StoredBatches::new(&self.schema, self.evicted_to, false)?;
        self.snapshot
            .for_each(|_, value| batches.push(value, out))?;
        batches.flush(out)
    }
}

/// Stored groups gathered into batches of the `groups` part.
pub(super) struct StoredBatches {
    format: Format,
    evicted_to: Option<i64>,
    changes: bool,
    bytes: Vec<u8>,
    ends: Vec<usize>,
}

impl StoredBatches {
    pub(super) fn new(
        schema: &SchemaRef,
        evicted_to: Option<i64>,
        changes: bool,
    ) -> Result<StoredBatches> {
        let format = Format::of(schema)?
            .ok_or_else(|| Error::internal("spilled groups without a row format"))?;
        Ok(StoredBatches {
            format,
            evicted_to,
            changes,
            bytes: Vec::new(),
            ends: Vec::new(),
        })
    }

    pub(super) fn push(&mut self, stored: &[u8], out: &mut dyn checkpoint::Sink) -> Result<()> {
        self.bytes.extend_from_slice(stored);
        self.ends.push(self.bytes.len());
        if self.bytes.len() >= crate::arrangement::SAVE_BATCH_BYTES {
            self.flush(out)?;
        }
        Ok(())
    }

    pub(super) fn flush(&mut self, out: &mut dyn checkpoint::Sink) -> Result<()> {
        if self.ends.is_empty() {
            return Ok(());
        }
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        let stored = starts.zip(&self.ends).map(|(s, &e)| &self.bytes[s..e]);
        let tag = self.changes.then_some(1);
        let scalars = [("evicted_to", self.evicted_to), (checkpoint::CHANGES, tag)];
        out.put("groups", self.format.batch(stored, &scalars)?)?;
        self.bytes.clear();
        self.ends.clear();
        Ok(())
    }
}
