//! The disk tier of an [`Arrangement`] (ADR 0012): past its share of the server's
//! [`MemoryBudget`], an arrangement moves its coldest keys, with all their rows, to the spill
//! store and brings a key back when a batch uses it.
//!
//! A spilled key leaves memory entirely: its slot, its bytes and its table bucket are freed, so
//! what stays in memory does not grow with what is on disk. Any key absent from memory may
//! therefore be on disk while anything is spilled. Operators make the keys of a batch resident
//! with [`Arrangement::prepare`] before probing; a key `prepare` looked up and did not find is
//! remembered as absent until the batch ends, so probes and updates of it cost no second
//! lookup. An update of a key that was not prepared looks it up itself; a probe of one that
//! was not prepared and is on disk is an operator's bug, and fails the view at its next settle
//! rather than answer without the key's rows. [`Arrangement::settle`] ends a batch: the only
//! point where keys are evicted, so no entry id an operator holds during a batch goes stale.
//! Eviction sweeps the key slots like a clock, first skipping the keys used since the last
//! settle, then taking any.
//!
//! Rows that expire at a watermark are found on disk through the store's expiry keyspace: a
//! spilled key is entered there under the earliest expiry of its rows. A key brought back
//! leaves its entry behind; when that comes due and the key is not on disk, it is dropped.
//!
//! A copy of an arrangement (a transaction's private copy of a table, ADR 0002) holds what was
//! in memory and reads the keys that were on disk from a snapshot of the store taken with
//! it ([`Behind`]): a key is read from the snapshot the first time the copy prepares it, then
//! lives in the copy's memory. A copy never spills; what it holds grows with the keys it
//! touches, not with the table.

use std::cmp::Reverse;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use eddy_common::{Error, Result};
use hashbrown::HashTable;

use super::{Arrangement, Entry, KeySlot, NEVER, NONE, place};
use crate::spill::{
    Batch, MemoryBudget, SpilledReader, SpilledRow, SpilledSnapshot, Tier, decode_rows, encode_row,
};

/// What an arrangement costs in memory besides its row bytes: its slot and a table bucket.
const ENTRY_BYTES: usize = std::mem::size_of::<Entry>() + 5;
const KEY_BYTES: usize = std::mem::size_of::<KeySlot>() + 5;

/// An arrangement's link to the budget and the store.
pub(super) struct Spill {
    tier: Tier,
    /// The clock hand of eviction, a key slot.
    hand: u32,
    /// Rows on disk (`tier.keys`: keys).
    rows: usize,
    value: Vec<u8>,
    /// Keys looked up since the last settle and not found on disk.
    absent: KeySet,
    /// A spilled key was probed without being prepared (see [`Arrangement::probe`]).
    missed: AtomicBool,
}

/// What a copy of an arrangement did not copy: the keys the original had on disk, read from a
/// snapshot of the store taken with the copy.
#[derive(Clone)]
pub(super) struct Behind {
    reader: SpilledReader,
    /// Rows of the snapshot not brought into the copy yet.
    rows: usize,
    /// Keys looked up in the snapshot (found or not): never looked up again, as the copy's
    /// memory holds what it has of them (their rows may have been retracted since).
    seen: KeySet,
    /// The original had rows on disk due to expire (a copy cannot expire them).
    due: bool,
}

/// A set of keys' bytes without an allocation per key.
#[derive(Clone, Default)]
struct KeySet {
    table: HashTable<(u64, usize, u32)>,
    bytes: Vec<u8>,
}

impl KeySet {
    fn contains(&self, hash: u64, key: &[u8]) -> bool {
        self.table
            .find(hash, |&(h, start, len)| {
                h == hash && &self.bytes[start..start + len as usize] == key
            })
            .is_some()
    }

    fn insert(&mut self, hash: u64, key: &[u8]) {
        let start = self.bytes.len();
        self.bytes.extend_from_slice(key);
        self.table
            .insert_unique(hash, (hash, start, key.len() as u32), |&(h, _, _)| h);
    }

    fn clear(&mut self) {
        self.table.clear();
        self.bytes.clear();
    }
}

/// An arrangement's spill link, if it has one: its own tier (`live`), or, in a copy, the
/// original's keys on disk when it was copied (`behind`).
#[derive(Default)]
pub(super) struct SpillSlot {
    live: Option<Box<Spill>>,
    behind: Option<Box<Behind>>,
    /// A copy probed a key it had not prepared, which may be in `behind`.
    unprepared_copy: AtomicBool,
}

impl Clone for SpillSlot {
    /// A copy never spills; it reads what the original had on disk from a snapshot.
    fn clone(&self) -> Self {
        let behind = match (&self.live, &self.behind) {
            (Some(spill), _) => spill.tier.reader().map(|reader| {
                Box::new(Behind {
                    reader,
                    rows: spill.rows,
                    seen: KeySet::default(),
                    due: spill.tier.due_by(i64::MAX),
                })
            }),
            (None, behind) => behind.clone(),
        };
        SpillSlot {
            live: None,
            behind,
            unprepared_copy: AtomicBool::new(false),
        }
    }
}

impl Arrangement {
    /// Makes this arrangement hold its rows within its share of `budget`, spilling the rest.
    pub fn spill_to(&mut self, budget: &Arc<MemoryBudget>) {
        self.spill.live = Some(Box::new(Spill {
            tier: Tier::new(budget),
            hand: 0,
            rows: 0,
            value: Vec::new(),
            absent: KeySet::default(),
            missed: AtomicBool::new(false),
        }));
    }

    /// Rows on disk now (in a copy: rows of the original's disk not brought into it).
    pub fn spilled_rows(&self) -> usize {
        match (&self.spill.live, &self.spill.behind) {
            (Some(spill), _) => spill.rows,
            (None, Some(behind)) => behind.rows,
            (None, None) => 0,
        }
    }

    /// Bytes this arrangement counts against its budget: live row and key bytes, and the slots
    /// and buckets of what is in memory.
    pub(super) fn resident_bytes(&self, spilled: usize) -> usize {
        (self.arena.len() - self.garbage)
            + (self.live - spilled) * ENTRY_BYTES
            + (self.keys.len() - self.free_keys.len()) * KEY_BYTES
    }

    /// Makes the rows of `keys` resident (for the probes of a batch), and marks them used.
    pub fn prepare<'k>(&mut self, keys: impl IntoIterator<Item = &'k [u8]>) -> Result<()> {
        if let Some(mut behind) = self.spill.behind.take() {
            let result = keys
                .into_iter()
                .try_for_each(|key| self.bring_from(&mut behind, key).map(|_| ()));
            self.spill.behind = Some(behind);
            return result;
        }
        let Some(mut spill) = self.spill.live.take() else {
            return Ok(());
        };
        let result = self.prepare_with(&mut spill, keys);
        self.spill.live = Some(spill);
        result
    }

    /// In a copy: brings `key` from the original's snapshot the first time it is asked for
    /// (marking it used); returns its slot if the copy holds it.
    fn bring_from(&mut self, behind: &mut Behind, key: &[u8]) -> Result<Option<u32>> {
        let hash = self.hash_key(key);
        if let Some(k) = self.find_key(hash, key) {
            self.keys[k as usize].touched = self.tick;
            return Ok(Some(k));
        }
        if behind.rows == 0 || behind.seen.contains(hash, key) {
            return Ok(None);
        }
        behind.seen.insert(hash, key);
        let Some(value) = behind.reader.get(key)? else {
            return Ok(None);
        };
        let (k, rows) = self.restore_key(key, hash, &value)?;
        behind.rows -= rows as usize;
        Ok(Some(k))
    }

    fn prepare_with<'k>(
        &mut self,
        spill: &mut Spill,
        keys: impl IntoIterator<Item = &'k [u8]>,
    ) -> Result<()> {
        let store = match spill.tier.keys {
            0 => None,
            _ => Some(spill.tier.store()?),
        };
        let mut batch = None;
        for key in keys {
            let hash = self.hash_key(key);
            if let Some(k) = self.find_key(hash, key) {
                self.keys[k as usize].touched = self.tick;
                continue;
            }
            let Some(store) = &store else { continue };
            if spill.absent.contains(hash, key) {
                continue;
            }
            match store.get(spill.tier.store_key(key))? {
                Some(value) => {
                    let batch = batch.get_or_insert_with(|| store.batch());
                    self.fault_in(spill, batch, key, hash, &value)?;
                }
                None => spill.absent.insert(hash, key),
            }
        }
        batch.map_or(Ok(()), Batch::commit)
    }

    /// Brings `key` back from disk for an update of it, if it is there; returns its slot.
    pub(super) fn recall(&mut self, key: &[u8], hash: u64) -> Result<Option<u32>> {
        // The common case, checked before moving the spill state out: no key on disk.
        if self.spill.behind.is_none() && self.spill.live.as_ref().is_none_or(|s| s.tier.keys == 0)
        {
            return Ok(None);
        }
        if let Some(mut behind) = self.spill.behind.take() {
            let result = self.bring_from(&mut behind, key);
            self.spill.behind = Some(behind);
            return result;
        }
        let Some(mut spill) = self.spill.live.take() else {
            return Ok(None);
        };
        let result = self.recall_with(&mut spill, key, hash);
        self.spill.live = Some(spill);
        result
    }

    fn recall_with(&mut self, spill: &mut Spill, key: &[u8], hash: u64) -> Result<Option<u32>> {
        if spill.tier.keys == 0 || spill.absent.contains(hash, key) {
            return Ok(None);
        }
        let store = spill.tier.store()?;
        let Some(value) = store.get(spill.tier.store_key(key))? else {
            spill.absent.insert(hash, key);
            return Ok(None);
        };
        let mut batch = store.batch();
        let k = self.fault_in(spill, &mut batch, key, hash, &value)?;
        batch.commit()?;
        Ok(Some(k))
    }

    /// Records a probe of `key`, absent from memory, that was not prepared: if the key is on
    /// disk, the operator's answer for it would be wrong, so its next settle fails.
    pub(super) fn check_unprepared(&self, key: &[u8], hash: u64) {
        if let Some(behind) = &self.spill.behind {
            if behind.rows > 0 && !behind.seen.contains(hash, key) && behind.reader.may_hold(key) {
                debug_assert!(false, "a probe of a copy's key that was not prepared");
                // Recorded at the next settle (a copy's probes take `&self`).
                self.spill.unprepared_copy.store(true, Ordering::Relaxed);
            }
            return;
        }
        let Some(spill) = &self.spill.live else {
            return;
        };
        if spill.tier.keys == 0 || spill.absent.contains(hash, key) {
            return;
        }
        let Some(store) = spill.tier.opened() else {
            return;
        };
        let mut store_key = spill.tier.prefix.to_vec();
        store_key.extend_from_slice(key);
        // A store that cannot answer cannot vouch for the probe either.
        if !matches!(store.get(&store_key), Ok(None)) {
            debug_assert!(false, "a probe of a spilled key that was not prepared");
            spill.missed.store(true, Ordering::Relaxed);
        }
    }

    /// Puts spilled `key`'s rows (`value`, as [`Arrangement::spill_key`] wrote them) back in
    /// memory, in their order, under a new key slot; drops them from the store (in `batch`).
    fn fault_in(
        &mut self,
        spill: &mut Spill,
        batch: &mut Batch<'_>,
        key: &[u8],
        hash: u64,
        value: &[u8],
    ) -> Result<u32> {
        let (k, count) = self.restore_key(key, hash, value)?;
        spill.tier.count(0, 1);
        spill.rows -= count as usize;
        batch.remove(spill.tier.store_key(key));
        Ok(k)
    }

    /// Puts `key`'s stored rows (`value`) in memory, in their order, under a new key slot;
    /// returns the slot and how many rows.
    fn restore_key(&mut self, key: &[u8], hash: u64, value: &[u8]) -> Result<(u32, u32)> {
        let k = self.new_key(key, hash)?;
        let (mut head, mut tail, mut count) = (NONE, NONE, 0u32);
        for row in decode_rows(value) {
            let row = row?;
            let span = self.store(row.row)?;
            let row_hash = self.hash_entry(hash, row.row);
            let entry = Entry {
                key: k,
                row: span,
                hash: row_hash,
                time: row.time,
                weight: row.weight,
                expires: row.expires,
                aux: row.aux,
                prev: tail,
                next: NONE,
            };
            let e = place(&mut self.entries, &mut self.free_entries, entry, "rows")?;
            if tail == NONE {
                head = e;
            } else {
                self.entries[tail as usize].next = e;
            }
            tail = e;
            let entries = &self.entries;
            self.entry_table
                .insert_unique(row_hash, e, |&x| entries[x as usize].hash);
            if row.expires != NEVER {
                self.expiry.push(Reverse((row.expires, e)));
            }
            count += 1;
        }
        if count == 0 {
            return Err(Error::internal(
                "a spilled key of operator state has no rows",
            ));
        }
        let slot = &mut self.keys[k as usize];
        slot.head = head;
        slot.rows = count;
        Ok((k, count))
    }

    /// Brings back the spilled keys holding rows due to expire at `watermark`.
    pub(super) fn fault_in_due(&mut self, watermark: i64) -> Result<()> {
        if self.spill.behind.as_ref().is_some_and(|b| b.due) {
            return Err(Error::internal(
                "a copy of operator state cannot expire the rows its original had on disk",
            ));
        }
        let Some(mut spill) = self.spill.live.take() else {
            return Ok(());
        };
        let result = self.fault_in_due_with(&mut spill, watermark);
        self.spill.live = Some(spill);
        result
    }

    fn fault_in_due_with(&mut self, spill: &mut Spill, watermark: i64) -> Result<()> {
        if !spill.tier.due_by(watermark) {
            return Ok(());
        }
        let store = spill.tier.store()?;
        let mut batch = store.batch();
        for key in spill.tier.take_due(&store, &mut batch, watermark)? {
            // A key brought back since (in memory now, or gone) leaves its entry behind.
            let hash = self.hash_key(&key);
            if self.find_key(hash, &key).is_some() {
                continue;
            }
            if let Some(value) = store.get(spill.tier.store_key(&key))? {
                self.fault_in(spill, &mut batch, &key, hash, &value)?;
            }
        }
        batch.commit()
    }

    /// Ends a batch: reports what this arrangement holds to its budget and, when the budget is
    /// exceeded, spills its coldest keys until it is back within its share (its part of the
    /// limit, in proportion to what it holds among all arrangements).
    pub fn settle(&mut self) -> Result<()> {
        let result = match self.spill.live.take() {
            None if self.spill.unprepared_copy.load(Ordering::Relaxed) => Err(Error::internal(
                "a copy of a table probed a key it had not brought back from disk",
            )),
            None => Ok(()),
            Some(mut spill) => {
                let result = self.settle_with(&mut spill);
                spill.absent.clear();
                self.spill.live = Some(spill);
                result
            }
        };
        self.tick = self.tick.wrapping_add(1);
        result
    }

    fn settle_with(&mut self, spill: &mut Spill) -> Result<()> {
        if spill.missed.load(Ordering::Relaxed) {
            return Err(Error::internal(
                "an operator probed a spilled key of its state without bringing it back",
            ));
        }
        let now = self.resident_bytes(spill.rows);
        let total = spill.tier.report(now);
        let Some(target) = spill.tier.share(now, total) else {
            return Ok(());
        };
        self.evict_to(spill, target)?;
        if self.compact_slots_if_sparse() {
            // The clock's slots were renumbered.
            spill.hand = 0;
        }
        spill.tier.report(self.resident_bytes(spill.rows));
        Ok(())
    }

    /// Spills keys, sweeping from the clock hand, until at most `target` bytes are resident:
    /// first the keys not used since the last settle, then any.
    fn evict_to(&mut self, spill: &mut Spill, target: usize) -> Result<()> {
        let n = self.keys.len() as u32;
        let mut resident = self.resident_bytes(spill.rows);
        if n == 0 || resident <= target || self.live == spill.rows {
            return Ok(());
        }
        let store = spill.tier.store()?;
        let mut batch = store.batch();
        let mut spilled = 0;
        'sweeps: for pass in 0..2 {
            for _ in 0..n {
                if resident <= target {
                    break 'sweeps;
                }
                let k = spill.hand % n;
                spill.hand = (k + 1) % n;
                let slot = &self.keys[k as usize];
                if slot.rows == 0 || (pass == 0 && slot.touched == self.tick) {
                    continue;
                }
                resident = resident.saturating_sub(self.spill_key(spill, &mut batch, k));
                batch.commit_if_large()?;
                spilled += 1;
            }
        }
        batch.commit()?;
        spill.tier.count(spilled, 0);
        self.compact_if_wasteful();
        Ok(())
    }

    /// Writes key slot `k`'s rows to the store (in `batch`) and frees the slot and its
    /// entries; returns the bytes that frees.
    fn spill_key(&mut self, spill: &mut Spill, batch: &mut Batch<'_>, k: u32) -> usize {
        let slot = self.keys[k as usize].clone();
        spill.value.clear();
        let (mut e, mut earliest, mut freed) = (slot.head, NEVER, 0);
        while e != NONE {
            let entry = self.entries[e as usize].clone();
            encode_row(&mut spill.value, &self.spilled_row(&entry));
            earliest = earliest.min(entry.expires);
            if let Ok(found) = self.entry_table.find_entry(entry.hash, |&x| x == e) {
                found.remove();
            }
            self.entries[e as usize].weight = 0;
            self.free_entries.push(e);
            self.garbage += entry.row.len as usize;
            freed += entry.row.len as usize + ENTRY_BYTES;
            e = entry.next;
        }
        let key = self.bytes(slot.bytes);
        batch.insert(spill.tier.store_key(key), &spill.value);
        if earliest != NEVER {
            spill.tier.enter_due(batch, earliest, key);
        }
        spill.rows += slot.rows as usize;
        if let Ok(found) = self.key_table.find_entry(slot.hash, |&x| x == k) {
            found.remove();
        }
        let slot = &mut self.keys[k as usize];
        slot.head = NONE;
        slot.rows = 0;
        self.free_keys.push(k);
        self.garbage += slot.bytes.len as usize;
        freed + slot.bytes.len as usize + KEY_BYTES
    }

    /// Entry `entry` as the store (and a checkpoint) holds it.
    pub(super) fn spilled_row(&self, entry: &Entry) -> SpilledRow<'_> {
        SpilledRow {
            row: self.bytes(entry.row),
            time: entry.time,
            weight: entry.weight,
            expires: entry.expires,
            aux: entry.aux,
        }
    }

    /// Reads of the keys on disk as they are now, to be made later, off the operators' thread
    /// (a save of changes' spilled keys); `None` when nothing is on disk.
    pub(super) fn spilled_reader(&self) -> Option<SpilledReader> {
        self.spill.live.as_ref()?.tier.reader()
    }

    /// Every key on disk now with its stored rows, to be read later, off the operators'
    /// thread (a whole save's spilled part); `None` when nothing is on disk.
    pub(super) fn spilled_snapshot(&self) -> Option<SpilledSnapshot> {
        self.spill.live.as_ref()?.tier.snapshot()
    }

    /// A copy still missing rows of its original's disk: it cannot be saved whole.
    pub(super) fn is_partial_copy(&self) -> bool {
        self.spill.behind.as_ref().is_some_and(|b| b.rows > 0)
    }
}
