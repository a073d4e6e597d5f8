//! The disk tier of an [`Arrangement`] (ADR 0012): past its share of the server's
//! [`MemoryBudget`], an arrangement moves the rows of its coldest keys to the spill store and
//! brings a key back when a batch uses it.
//!
//! A spilled key keeps its slot (its bytes, hash and row count) in memory, so the key tables
//! still find it and `contains_key` needs no disk read; only its entries leave. Operators make
//! the keys of a batch resident with [`Arrangement::prepare`] before probing, and call
//! [`Arrangement::settle`] once the batch is applied: the only point where keys are evicted,
//! so no entry id an operator holds during a batch goes stale. Eviction sweeps the key slots
//! like a clock, first skipping the keys used since the last settle, then taking any.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use eddy_common::{Error, Result};

use super::{Arrangement, Entry, KeySlot, NEVER, NONE, place};
use crate::spill::{Batch, MemoryBudget, SpilledRow, Store, decode_rows, encode_row};

/// What an arrangement costs in memory besides its row bytes: its slot and a table bucket.
const ENTRY_BYTES: usize = std::mem::size_of::<Entry>() + 5;
const KEY_BYTES: usize = std::mem::size_of::<KeySlot>() + 5;

/// An arrangement's link to the budget and the store.
pub(super) struct Spill {
    budget: Arc<MemoryBudget>,
    store: Option<Arc<Store>>,
    /// This arrangement's prefix in the store.
    prefix: [u8; 8],
    /// Bytes last reported to the budget.
    reported: usize,
    /// The clock hand of eviction, a key slot.
    hand: u32,
    keys: usize,
    rows: usize,
    /// Spilled keys by the earliest expiry of their rows.
    expiry: BinaryHeap<Reverse<(i64, u32)>>,
    store_key: Vec<u8>,
    value: Vec<u8>,
    /// A spilled key was probed without being prepared (see [`SpillSlot::missed_prepare`]).
    missed: AtomicBool,
}

impl Spill {
    fn store(&mut self) -> Result<Arc<Store>> {
        if let Some(s) = &self.store {
            return Ok(s.clone());
        }
        let store = self.budget.store()?;
        self.store = Some(store.clone());
        Ok(store)
    }

    /// The store's key of `key`: this arrangement's prefix, then the key's bytes.
    fn store_key(&mut self, key: &[u8]) -> &[u8] {
        self.store_key.clear();
        self.store_key.extend_from_slice(&self.prefix);
        self.store_key.extend_from_slice(key);
        &self.store_key
    }
}

impl Drop for Spill {
    fn drop(&mut self) {
        self.budget.report(self.reported, 0);
        self.budget.count_spilled(0, self.keys);
        if let Some(store) = &self.store {
            // A failure leaves dead keys in the store, which the next start empties.
            if let Err(e) = store.clear(&self.prefix) {
                tracing::warn!("could not clear spilled operator state: {e}");
            }
        }
    }
}

/// An arrangement's spill link, if it has one. A copy of an arrangement (table contents, for
/// a transaction's private copy) never spills, so a clone starts without one.
#[derive(Default)]
pub(super) struct SpillSlot(Option<Box<Spill>>);

impl SpillSlot {
    /// Records that a probe read a spilled key that was not brought back: the operator's
    /// answer for that key would be wrong, so its next settle fails.
    pub(super) fn missed_prepare(&self) {
        if let Some(spill) = &self.0 {
            spill.missed.store(true, Ordering::Relaxed);
        }
    }
}

impl Clone for SpillSlot {
    fn clone(&self) -> Self {
        debug_assert!(
            self.0.as_ref().is_none_or(|s| s.keys == 0),
            "a clone of an arrangement with spilled keys"
        );
        SpillSlot(None)
    }
}

impl Arrangement {
    /// Makes this arrangement hold its rows within its share of `budget`, spilling the rest.
    pub fn spill_to(&mut self, budget: &Arc<MemoryBudget>) {
        let id = budget.next_id();
        self.spill = SpillSlot(Some(Box::new(Spill {
            budget: budget.clone(),
            store: None,
            prefix: id.to_be_bytes(),
            reported: 0,
            hand: 0,
            keys: 0,
            rows: 0,
            expiry: BinaryHeap::new(),
            store_key: Vec::new(),
            value: Vec::new(),
            missed: AtomicBool::new(false),
        })));
    }

    /// Rows on disk now.
    pub fn spilled_rows(&self) -> usize {
        self.spill.0.as_ref().map_or(0, |s| s.rows)
    }

    /// Bytes this arrangement counts against its budget, with `spilled` of its rows on disk:
    /// live row and key bytes, and the slots and buckets of what is in memory.
    fn resident_bytes(&self, spilled: usize) -> usize {
        (self.arena.len() - self.garbage)
            + (self.live - spilled) * ENTRY_BYTES
            + (self.keys.len() - self.free_keys.len()) * KEY_BYTES
    }

    /// Makes the rows of `keys` resident (for the probes of a batch), and marks them used.
    pub fn prepare<'k>(&mut self, keys: impl IntoIterator<Item = &'k [u8]>) -> Result<()> {
        let Some(mut spill) = self.spill.0.take() else {
            return Ok(());
        };
        let result = self.prepare_with(&mut spill, keys);
        self.spill.0 = Some(spill);
        result
    }

    fn prepare_with<'k>(
        &mut self,
        spill: &mut Spill,
        keys: impl IntoIterator<Item = &'k [u8]>,
    ) -> Result<()> {
        let mut batch = None;
        let store = match spill.keys {
            0 => None,
            _ => Some(spill.store()?),
        };
        for key in keys {
            let Some(k) = self.find_key(self.hash_key(key), key) else {
                continue;
            };
            self.keys[k as usize].touched = self.tick;
            if let (true, Some(store)) = (self.keys[k as usize].spilled, &store) {
                let batch = batch.get_or_insert_with(|| store.batch());
                self.fault_in(spill, store, batch, k)?;
            }
        }
        batch.map_or(Ok(()), Batch::commit)
    }

    /// Marks key slot `k` used, bringing its rows back if it is spilled (an update of it).
    pub(super) fn use_key(&mut self, k: u32) -> Result<()> {
        self.keys[k as usize].touched = self.tick;
        if !self.keys[k as usize].spilled {
            return Ok(());
        }
        let Some(mut spill) = self.spill.0.take() else {
            return Err(Error::internal(
                "a spilled key in an arrangement that does not spill",
            ));
        };
        let result = spill.store().and_then(|store| {
            let mut batch = store.batch();
            self.fault_in(&mut spill, &store, &mut batch, k)?;
            batch.commit()
        });
        self.spill.0 = Some(spill);
        result
    }

    /// Reads spilled key `k`'s rows back into memory, in their order, and drops them from the
    /// store (in `batch`).
    fn fault_in(
        &mut self,
        spill: &mut Spill,
        store: &Store,
        batch: &mut Batch<'_>,
        k: u32,
    ) -> Result<()> {
        let slot = self.keys[k as usize].clone();
        let key = self.bytes(slot.bytes).to_vec();
        let store_key = spill.store_key(&key).to_vec();
        let value = store.get(&store_key)?.ok_or_else(|| {
            Error::internal("a spilled key of operator state is not in the store")
        })?;
        let (mut head, mut tail, mut count) = (NONE, NONE, 0u32);
        for row in decode_rows(&value) {
            let row = row?;
            let span = self.store(row.row)?;
            let hash = self.hash_entry(slot.hash, row.row);
            let entry = Entry {
                key: k,
                row: span,
                hash,
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
                .insert_unique(hash, e, |&x| entries[x as usize].hash);
            if row.expires != NEVER {
                self.expiry.push(Reverse((row.expires, e)));
            }
            count += 1;
        }
        if count != slot.rows {
            return Err(Error::internal(format!(
                "a spilled key of operator state came back with {count} rows of {}",
                slot.rows
            )));
        }
        let slot = &mut self.keys[k as usize];
        slot.head = head;
        slot.spilled = false;
        spill.keys -= 1;
        spill.rows -= count as usize;
        spill.budget.count_spilled(0, 1);
        batch.remove(&store_key);
        Ok(())
    }

    /// Brings back the spilled keys holding rows due to expire at `watermark`.
    pub(super) fn fault_in_due(&mut self, watermark: i64) -> Result<()> {
        let Some(mut spill) = self.spill.0.take() else {
            return Ok(());
        };
        let result = self.fault_in_due_with(&mut spill, watermark);
        self.spill.0 = Some(spill);
        result
    }

    fn fault_in_due_with(&mut self, spill: &mut Spill, watermark: i64) -> Result<()> {
        if spill
            .expiry
            .peek()
            .is_none_or(|Reverse((t, _))| *t > watermark)
        {
            return Ok(());
        }
        let store = spill.store()?;
        let mut batch = store.batch();
        while let Some(Reverse((expires, k))) = spill.expiry.peek().copied() {
            if expires > watermark {
                break;
            }
            spill.expiry.pop();
            // A key brought back since, or a slot reused by a key spilled again, is harmless
            // to bring back (its own heap entry stays).
            if self.keys[k as usize].spilled {
                self.fault_in(spill, &store, &mut batch, k)?;
            }
        }
        batch.commit()
    }

    /// Ends a batch: reports what this arrangement holds to its budget and, when the budget is
    /// exceeded, spills its coldest keys until it is back within its share (its part of the
    /// limit, in proportion to what it holds among all arrangements).
    pub fn settle(&mut self) -> Result<()> {
        let result = match self.spill.0.take() {
            None => Ok(()),
            Some(mut spill) => {
                let result = self.settle_with(&mut spill);
                self.spill.0 = Some(spill);
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
        let total = spill.budget.report(spill.reported, now);
        spill.reported = now;
        let limit = spill.budget.limit();
        if total <= limit {
            return Ok(());
        }
        let target = (now as u128 * limit as u128 / total.max(1) as u128) as usize;
        self.evict_to(spill, target)?;
        let after = self.resident_bytes(spill.rows);
        spill.budget.report(spill.reported, after);
        spill.reported = after;
        Ok(())
    }

    /// Spills keys, sweeping from the clock hand, until at most `target` bytes are resident:
    /// first the keys not used since the last settle, then any.
    fn evict_to(&mut self, spill: &mut Spill, target: usize) -> Result<()> {
        let n = self.keys.len() as u32;
        let mut resident = self.resident_bytes(spill.rows);
        // With every row on disk already, what stays is the key slots: nothing to sweep.
        if n == 0 || resident <= target || self.live == spill.rows {
            return Ok(());
        }
        let store = spill.store()?;
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
                if slot.rows == 0 || slot.spilled || (pass == 0 && slot.touched == self.tick) {
                    continue;
                }
                resident = resident.saturating_sub(self.spill_key(spill, &mut batch, k));
                spilled += 1;
            }
        }
        batch.commit()?;
        spill.budget.count_spilled(spilled, 0);
        self.compact_if_wasteful();
        Ok(())
    }

    /// Writes key slot `k`'s rows to the store (in `batch`) and frees their entries; returns
    /// the bytes that frees.
    fn spill_key(&mut self, spill: &mut Spill, batch: &mut Batch<'_>, k: u32) -> usize {
        let slot = self.keys[k as usize].clone();
        spill.value.clear();
        let (mut e, mut earliest, mut freed) = (slot.head, NEVER, 0);
        while e != NONE {
            let entry = self.entries[e as usize].clone();
            encode_row(
                &mut spill.value,
                &SpilledRow {
                    row: self.bytes(entry.row),
                    time: entry.time,
                    weight: entry.weight,
                    expires: entry.expires,
                    aux: entry.aux,
                },
            );
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
        let value = std::mem::take(&mut spill.value);
        let key = self.bytes(slot.bytes);
        batch.insert(spill.store_key(key), &value);
        spill.value = value;
        let slot = &mut self.keys[k as usize];
        slot.head = NONE;
        slot.spilled = true;
        spill.keys += 1;
        spill.rows += slot.rows as usize;
        if earliest != NEVER {
            spill.expiry.push(Reverse((earliest, k)));
        }
        freed
    }

    /// The stored rows of every spilled key, for a checkpoint.
    pub(super) fn spilled_values(&self) -> Result<Vec<(u32, fjall::Slice)>> {
        let Some(spill) = &self.spill.0 else {
            return Ok(Vec::new());
        };
        if spill.keys == 0 {
            return Ok(Vec::new());
        }
        let store = spill
            .store
            .as_ref()
            .ok_or_else(|| Error::internal("spilled keys without a spill store"))?;
        let mut values = Vec::with_capacity(spill.keys);
        let mut store_key = Vec::new();
        for (k, slot) in self.keys.iter().enumerate() {
            if slot.rows == 0 || !slot.spilled {
                continue;
            }
            store_key.clear();
            store_key.extend_from_slice(&spill.prefix);
            store_key.extend_from_slice(self.bytes(slot.bytes));
            let value = store.get(&store_key)?.ok_or_else(|| {
                Error::internal("a spilled key of operator state is not in the store")
            })?;
            values.push((k as u32, value));
        }
        Ok(values)
    }
}
