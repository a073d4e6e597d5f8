//! An [`Arrangement`] in a checkpoint: all of it, or only the keys changed since its last
//! save (incremental checkpoints, ADR 0012).
//!
//! From its first save (or load) on, an arrangement notes each key whose rows change (an
//! insert, a retraction, an expiry, an aux count) the first time it changes after a save: a
//! flag on the key's slot and the key's bytes in a list, which outlives the slot (a key may be
//! removed or spilled before the next save). A save of the changes writes, per changed key, a
//! reset marker (the key with a NULL row) and then the key's rows now: from memory, or for a
//! key on disk through a job the sink runs later, off the operators' thread, reading a
//! snapshot of the spill store taken at the save; loading applies the markers in order (each
//! key's once per save), so a full save followed by the saves of changes in order gives the
//! state of the last. Such a save is taken only when the caller vouches that the last save
//! was kept ([`SaveMode::Changes`]); the arrangement writes
//! all of itself instead when its changes since its last full save pass half of its rows, so
//! a chain of saves stays within about 1.5 times the state. When the list would pass half of
//! the keys, the arrangement stops noting and its next save is a full one.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, BinaryBuilder, RecordBatch};
use eddy_common::{Error, Result};
use hashbrown::HashTable;

use super::{Arrangement, LOAD_SETTLE_ROWS, NONE};
use crate::checkpoint::{self, Sink};
use crate::spill::{SpilledRow, decode_rows};

/// Bytes of keys and rows per batch of a checkpoint part ([`Arrangement::save`]; unit tests
/// use small batches, so their restarts load parts of several).
pub const SAVE_BATCH_BYTES: usize = if cfg!(test) { 4096 } else { 64 << 20 };

/// Keys an arrangement notes as changed besides half of its rows before it stops noting.
const CHANGES_SLACK: usize = 4096;

/// What a save writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SaveMode {
    /// Everything held.
    Full,
    /// The keys changed since the last save, if cheaper: the caller vouches that the last save
    /// (or the load) is what the new one is applied onto.
    Changes,
}

/// The keys changed since the last save (see the module documentation).
#[derive(Clone, Default)]
pub(super) struct Changes {
    /// Noting: the arrangement was saved or loaded, and the list did not overflow.
    on: bool,
    /// The list overflowed since the last save: the next one is full.
    overflowed: bool,
    /// (start, len) of each noted key's bytes in `bytes`; a key may repeat (noted again after
    /// its slot was freed).
    keys: Vec<(usize, u32)>,
    bytes: Vec<u8>,
    /// Rows written by saves of changes since the last full save.
    since_full: usize,
}

impl Changes {
    fn clear(&mut self) {
        self.keys = Vec::new();
        self.bytes = Vec::new();
        self.overflowed = false;
    }
}

impl Arrangement {
    /// Notes that key slot `k` changed.
    pub(super) fn changed(&mut self, k: u32) {
        if !self.changes.on {
            return;
        }
        let slot = &mut self.keys[k as usize];
        if slot.changed {
            return;
        }
        slot.changed = true;
        let span = slot.bytes;
        let changes = &mut self.changes;
        if changes.keys.len() > self.live / 2 + CHANGES_SLACK {
            changes.clear();
            changes.on = false;
            changes.overflowed = true;
            return;
        }
        let start = changes.bytes.len();
        changes
            .bytes
            .extend_from_slice(self.arena.get(span.start, span.len as usize));
        changes.keys.push((start, span.len));
    }

    /// The entries as batches (key, row, time, weight, expires, aux) of at most about
    /// [`SAVE_BATCH_BYTES`] of keys and rows each (a binary column holds less than 2 GiB),
    /// spilled ones included, put into `out` as part `part` as they fill, for a checkpoint:
    /// all of them (none when empty), or with [`SaveMode::Changes`] possibly only the changes
    /// since the last save (batches [`checkpoint::is_changes`] says so of; at least one, maybe
    /// without rows).
    pub fn save(&mut self, mode: SaveMode, part: &str, out: &mut dyn Sink) -> Result<()> {
        if self.is_partial_copy() {
            return Err(Error::internal(
                "a copy of operator state without its original's rows on disk was saved",
            ));
        }
        let changes = &self.changes;
        let mut whole_next = false;
        if mode == SaveMode::Changes
            && changes.on
            && !changes.overflowed
            && changes.since_full + changes.keys.len() <= self.live / 2
            && self.changed_rows() <= self.live / 2
        {
            let mut saved = SavedBatches::new(part, out, true);
            let deferred = self.save_changes(&mut saved)?;
            let rows = saved.finish()?;
            // Past half of the state since the last whole save (a spilled key counts its
            // marker and a row: its rows are only known once read), the next save is whole:
            // that keeps the chain short.
            self.changes.since_full += rows + 2 * deferred;
            whole_next = self.changes.since_full > self.live / 2;
        } else {
            for slot in &mut self.keys {
                slot.changed = false;
            }
            self.changes.since_full = 0;
            let mut saved = SavedBatches::new(part, out, false);
            self.save_all(&mut saved)?;
            saved.finish()?;
        }
        self.changes.clear();
        self.changes.on = true;
        self.changes.overflowed = whole_next;
        Ok(())
    }

    /// About the markers and rows a save of the changes would write, with those written
    /// since the last whole save: a spilled key counts one row (its rows are known once read).
    fn changed_rows(&self) -> usize {
        let mut rows = self.changes.since_full;
        for &(start, len) in &self.changes.keys {
            let key = &self.changes.bytes[start..start + len as usize];
            let held = self.find_key(self.hash_key(key), key);
            rows += 1 + held.map_or(1, |k| self.keys[k as usize].rows as usize);
        }
        rows
    }

    /// Every entry into `out`: those in memory now, and the spilled ones through a job the
    /// sink runs later ([`Sink::defer`]: the operators go on meanwhile; it reads the spill
    /// store as it was now).
    fn save_all(&self, out: &mut SavedBatches<'_>) -> Result<()> {
        for e in self.entries.iter().filter(|e| e.live()) {
            out.push(
                self.bytes(self.keys[e.key as usize].bytes),
                &self.spilled_row(e),
            )?;
        }
        let Some(spilled) = self.spilled_snapshot() else {
            return Ok(());
        };
        let part = out.part.to_owned();
        out.out.defer(Box::new(move |sink| {
            let mut saved = SavedBatches::new(&part, sink, false);
            spilled.for_each(|key, value| {
                for row in decode_rows(value) {
                    saved.push(key, &row?)?;
                }
                Ok(())
            })?;
            saved.finish().map(drop)
        }))
    }

    /// Every entry, as [`Arrangement::save`] writes them (the unit tests' view of a checkpoint).
    #[cfg(test)]
    pub(super) fn saved_whole(&self) -> Result<Vec<RecordBatch>> {
        let mut batches: Vec<(String, RecordBatch)> = Vec::new();
        let mut out = SavedBatches::new("", &mut batches, false);
        self.save_all(&mut out)?;
        out.finish()?;
        Ok(batches.into_iter().map(|(_, b)| b).collect())
    }

    /// Each key changed since the last save, once, into `out`: a reset marker, then its rows.
    /// Returns how many keys it left to a deferred job (not in memory: spilled or gone).
    fn save_changes(&mut self, out: &mut SavedBatches<'_>) -> Result<usize> {
        let Changes {
            keys,
            bytes,
            since_full,
            ..
        } = std::mem::take(&mut self.changes);
        let mut seen: HashTable<(u64, usize, u32)> = HashTable::with_capacity(keys.len());
        let mut absent: Vec<(usize, u32)> = Vec::new();
        for &(start, len) in &keys {
            let key = &bytes[start..start + len as usize];
            let hash = self.hash_key(key);
            let same =
                |&(h, s, l): &(u64, usize, u32)| h == hash && &bytes[s..s + l as usize] == key;
            if seen.find(hash, same).is_some() {
                continue;
            }
            seen.insert_unique(hash, (hash, start, len), |&(h, _, _)| h);
            let Some(k) = self.find_key(hash, key) else {
                absent.push((start, len));
                continue;
            };
            out.reset(key)?;
            self.keys[k as usize].changed = false;
            let mut e = self.keys[k as usize].head;
            while e != NONE {
                let entry = &self.entries[e as usize];
                out.push(key, &self.spilled_row(entry))?;
                e = entry.next;
            }
        }
        self.changes = Changes {
            since_full,
            ..Changes::default()
        };
        self.save_absent(out, bytes, absent)
    }

    /// Changed keys not in memory (spans of `bytes`): gone, or spilled. With anything on disk,
    /// a job the sink runs later ([`Sink::defer`]) writes each one's reset marker and the rows
    /// the spill store held at this save; otherwise the markers go now. Returns the keys left
    /// to the job.
    fn save_absent(
        &self,
        out: &mut SavedBatches<'_>,
        bytes: Vec<u8>,
        absent: Vec<(usize, u32)>,
    ) -> Result<usize> {
        let key = |&(start, len): &(usize, u32)| start..start + len as usize;
        let reader = self.spilled_reader().filter(|_| !absent.is_empty());
        let Some(mut reader) = reader else {
            for span in &absent {
                out.reset(&bytes[key(span)])?;
            }
            return Ok(0);
        };
        let deferred = absent.len();
        let part = out.part.to_owned();
        out.out.defer(Box::new(move |sink| {
            let mut saved = SavedBatches::new(&part, sink, true);
            for span in &absent {
                let key = &bytes[key(span)];
                saved.reset(key)?;
                if let Some(value) = reader.get(key)? {
                    for row in decode_rows(&value) {
                        saved.push(key, &row?)?;
                    }
                }
            }
            saved.finish().map(drop)
        }))?;
        Ok(deferred)
    }

    /// Takes back a batch of what [`Arrangement::save`] wrote: rows are added to what is
    /// held; a reset marker first drops every row of its key. Loading the batches of a full
    /// save and then those of each later save in order gives the state of the last save.
    pub fn load(&mut self, batch: &RecordBatch) -> Result<()> {
        let keys = checkpoint::binary_column(batch, "key")?;
        let rows = checkpoint::binary_column(batch, "row")?;
        let times = checkpoint::int64_column(batch, "time")?;
        let counts = checkpoint::int64_column(batch, "count")?;
        let expires = checkpoint::int64_column(batch, "expires")?;
        let aux = checkpoint::int64_column(batch, "aux")?;
        let mut since_full = self.changes.since_full;
        if checkpoint::is_changes(batch) {
            since_full += batch.num_rows();
        }
        self.changes.on = false;
        for i in 0..batch.num_rows() {
            if keys.is_null(i) {
                return Err(Error::internal("a checkpointed arrangement has a NULL key"));
            }
            if rows.is_null(i) {
                self.clear_key(keys.value(i))?;
                continue;
            }
            let entry = self.update(
                keys.value(i),
                rows.value(i),
                times.value(i),
                counts.value(i),
                expires.value(i),
            )?;
            if let Some(e) = entry {
                self.add_aux(e, aux.value(i));
            }
            if i % LOAD_SETTLE_ROWS == LOAD_SETTLE_ROWS - 1 {
                self.settle()?;
            }
        }
        self.changes.clear();
        self.changes.on = true;
        self.changes.since_full = since_full;
        self.settle()
    }

    /// Drops every row of `key`, in memory or spilled.
    fn clear_key(&mut self, key: &[u8]) -> Result<()> {
        let hash = self.hash_key(key);
        let slot = match self.find_key(hash, key) {
            Some(k) => Some(k),
            None => self.recall(key, hash)?,
        };
        if let Some(k) = slot {
            while self.keys[k as usize].rows > 0 {
                let head = self.keys[k as usize].head;
                self.remove(head);
            }
        }
        Ok(())
    }
}

/// The batches [`Arrangement::save`] builds, put into a sink as they fill.
struct SavedBatches<'a> {
    part: &'a str,
    out: &'a mut dyn Sink,
    /// Batches of changes (tagged so, [`checkpoint::is_changes`]; at least one is put).
    changes: bool,
    keys: BinaryBuilder,
    rows: BinaryBuilder,
    times: Vec<i64>,
    counts: Vec<i64>,
    expires: Vec<i64>,
    aux: Vec<i64>,
    bytes: usize,
    /// Rows put so far (markers included).
    rows_put: usize,
    /// Batches put so far.
    batches: usize,
}

impl<'a> SavedBatches<'a> {
    fn new(part: &'a str, out: &'a mut dyn Sink, changes: bool) -> SavedBatches<'a> {
        SavedBatches {
            part,
            out,
            changes,
            keys: BinaryBuilder::new(),
            rows: BinaryBuilder::new(),
            times: Vec::new(),
            counts: Vec::new(),
            expires: Vec::new(),
            aux: Vec::new(),
            bytes: 0,
            rows_put: 0,
            batches: 0,
        }
    }

    fn push(&mut self, key: &[u8], row: &SpilledRow<'_>) -> Result<()> {
        self.keys.append_value(key);
        self.rows.append_value(row.row);
        self.times.push(row.time);
        self.counts.push(row.weight);
        self.expires.push(row.expires);
        self.aux.push(row.aux);
        self.bytes += key.len() + row.row.len();
        if self.bytes >= SAVE_BATCH_BYTES {
            self.flush()?;
        }
        Ok(())
    }

    /// A reset marker: the key with a NULL row.
    fn reset(&mut self, key: &[u8]) -> Result<()> {
        self.keys.append_value(key);
        self.rows.append_null();
        for column in [
            &mut self.times,
            &mut self.counts,
            &mut self.expires,
            &mut self.aux,
        ] {
            column.push(0);
        }
        self.bytes += key.len();
        if self.bytes >= SAVE_BATCH_BYTES {
            self.flush()?;
        }
        Ok(())
    }

    /// Puts what is built as a batch (one without rows only if `empty` and none was put).
    fn flush_batch(&mut self, empty: bool) -> Result<()> {
        if self.times.is_empty() && !(empty && self.batches == 0) {
            return Ok(());
        }
        let ints = |v: &mut Vec<i64>| checkpoint::int64s(std::mem::take(v));
        let columns: Vec<(&str, ArrayRef)> = vec![
            ("key", Arc::new(self.keys.finish())),
            ("row", Arc::new(self.rows.finish())),
            ("time", ints(&mut self.times)),
            ("count", ints(&mut self.counts)),
            ("expires", ints(&mut self.expires)),
            ("aux", ints(&mut self.aux)),
        ];
        let tag = [(checkpoint::CHANGES, Some(1))];
        let tags: &[(&str, Option<i64>)] = if self.changes { &tag } else { &[] };
        let batch = checkpoint::part(columns, tags)?;
        self.rows_put += batch.num_rows();
        self.batches += 1;
        self.bytes = 0;
        self.out.put(self.part, batch)
    }

    fn flush(&mut self) -> Result<()> {
        self.flush_batch(false)
    }

    /// Puts the last batch (a save of changes puts one even without rows); returns the rows
    /// put in all.
    fn finish(mut self) -> Result<usize> {
        let changes = self.changes;
        self.flush_batch(changes)?;
        Ok(self.rows_put)
    }
}
