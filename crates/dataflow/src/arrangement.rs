//! [`Arrangement`]: a multiset of rows by key, the state of Eddy's stateful operators (issue 19).
//!
//! Each entry is a (key, row) pair in Arrow's row format with a weight (the multiplicity, net of
//! retractions: entries whose weight reaches zero are gone), an event time, and the watermark
//! past which it may be forgotten. The bytes of keys and rows live in one arena (chunks that
//! are never reallocated, [`crate::arena`]); entries and
//! keys are fixed-size slots in vectors, found through two hashbrown [`HashTable`]s of slot
//! numbers (by key, and by key and row), the pattern the vectorized aggregate uses. The rows of
//! one key form a linked list, so a probe reads exactly the rows of its key. Nothing is
//! allocated per row: the arena, the slot vectors, the tables and the expiry heap grow
//! amortized, and freed slots are reused. The arena is rewritten once more than half of it is
//! garbage (bytes of entries and keys that are gone).
//!
//! Iteration follows slot order, so an arrangement that received the same updates in the same
//! order iterates the same way (the hash seeds play no part).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::hash::BuildHasher;

use eddy_common::{Error, Result};
use hashbrown::HashTable;

use crate::arena::Arena;

#[path = "arrangement_spill.rs"]
mod spill;
use spill::SpillSlot;

#[path = "arrangement_save.rs"]
mod save;
use save::Changes;
pub use save::{SAVE_BATCH_BYTES, SaveMode};

/// No slot (the end of a key's list).
const NONE: u32 = u32::MAX;

/// An entry's expiry when it has none.
pub const NEVER: i64 = i64::MAX;

/// The arena is rewritten once its garbage passes half of it and this many bytes.
const COMPACT_MIN_BYTES: usize = 1 << 16;

/// Slot vectors are renumbered once more than half free and at least this long.
const COMPACT_MIN_SLOTS: usize = if cfg!(test) { 4 } else { 1 << 12 };

/// A restore settles (and may spill) after this many rows.
const LOAD_SETTLE_ROWS: usize = 1 << 16;

#[derive(Clone, Copy)]
struct Span {
    start: usize,
    len: u32,
}

#[derive(Clone)]
struct KeySlot {
    bytes: Span,
    hash: u64,
    /// The first entry of this key (`NONE`: the slot is free).
    head: u32,
    /// Entries of this key (0: the slot is free).
    rows: u32,
    /// The last [`Arrangement::settle`] round that used this key (eviction takes cold keys).
    touched: u32,
    /// The key is among the changes since the last save.
    changed: bool,
}

#[derive(Clone)]
struct Entry {
    key: u32,
    row: Span,
    hash: u64,
    time: i64,
    weight: i64,
    expires: i64,
    /// The operator's own count for this entry (an outer join's matches on the other side).
    aux: i64,
    prev: u32,
    next: u32,
}

impl Entry {
    fn live(&self) -> bool {
        self.weight != 0
    }
}

/// A row of an arrangement, as a probe or an iteration sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Found<'a> {
    /// The entry, for [`Arrangement::add_aux`] (valid until the arrangement changes).
    pub id: u32,
    pub key: &'a [u8],
    pub row: &'a [u8],
    pub time: i64,
    pub weight: i64,
    pub aux: i64,
}

/// Key → row → weight (see the module documentation).
#[derive(Clone)]
pub struct Arrangement {
    hasher: foldhash::fast::RandomState,
    arena: Arena,
    garbage: usize,
    keys: Vec<KeySlot>,
    key_table: HashTable<u32>,
    free_keys: Vec<u32>,
    entries: Vec<Entry>,
    entry_table: HashTable<u32>,
    free_entries: Vec<u32>,
    /// (expires, entry): an entry is forgotten when popped if it is still there and due
    /// (a freed slot reused meanwhile is due only if its own expiry has passed too).
    expiry: BinaryHeap<Reverse<(i64, u32)>>,
    /// Entries held, in memory or spilled.
    live: usize,
    /// The current round of [`Arrangement::settle`].
    tick: u32,
    spill: SpillSlot,
    /// The keys changed since the last save, for a checkpoint of only those.
    changes: Changes,
}

impl Default for Arrangement {
    fn default() -> Self {
        Arrangement::new()
    }
}

impl Arrangement {
    pub fn new() -> Arrangement {
        Arrangement {
            hasher: foldhash::fast::RandomState::default(),
            arena: Arena::default(),
            garbage: 0,
            keys: Vec::new(),
            key_table: HashTable::new(),
            free_keys: Vec::new(),
            entries: Vec::new(),
            entry_table: HashTable::new(),
            free_entries: Vec::new(),
            expiry: BinaryHeap::new(),
            live: 0,
            tick: 0,
            spill: SpillSlot::default(),
            changes: Changes::default(),
        }
    }

    /// Entries held (distinct (key, row) pairs with a weight), in memory or spilled.
    pub fn len(&self) -> usize {
        self.live
    }

    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// Bytes held in memory: the arena, the slots, the tables and the expiry heap, as allocated.
    pub fn size_bytes(&self) -> usize {
        self.arena.capacity()
            + self.keys.capacity() * std::mem::size_of::<KeySlot>()
            + self.entries.capacity() * std::mem::size_of::<Entry>()
            + (self.key_table.capacity() + self.entry_table.capacity())
                * (std::mem::size_of::<u32>() + 1)
            + (self.free_keys.capacity() + self.free_entries.capacity())
                * std::mem::size_of::<u32>()
            + self.expiry.capacity() * std::mem::size_of::<Reverse<(i64, u32)>>()
    }

    fn bytes(&self, span: Span) -> &[u8] {
        self.arena.get(span.start, span.len as usize)
    }

    fn store(&mut self, bytes: &[u8]) -> Result<Span> {
        let len = u32::try_from(bytes.len())
            .map_err(|_| Error::internal("a row of operator state is larger than 4 GiB"))?;
        let start = self.arena.push(bytes);
        Ok(Span { start, len })
    }

    fn hash_key(&self, key: &[u8]) -> u64 {
        self.hasher.hash_one(key)
    }

    fn hash_entry(&self, key_hash: u64, row: &[u8]) -> u64 {
        self.hasher.hash_one((key_hash, row))
    }

    fn find_key(&self, hash: u64, key: &[u8]) -> Option<u32> {
        self.key_table
            .find(hash, |&k| {
                let slot = &self.keys[k as usize];
                slot.hash == hash && self.bytes(slot.bytes) == key
            })
            .copied()
    }

    /// Adds `weight` to (`key`, `row`); a new entry takes `time` and `expires` ([`NEVER`]:
    /// kept until its weight is zero) and an aux count of zero. An entry whose weight reaches
    /// zero is gone. Returns the entry if it is still there.
    pub fn update(
        &mut self,
        key: &[u8],
        row: &[u8],
        time: i64,
        weight: i64,
        expires: i64,
    ) -> Result<Option<u32>> {
        if weight == 0 {
            return Ok(None);
        }
        let key_hash = self.hash_key(key);
        let hash = self.hash_entry(key_hash, row);
        let key_slot = match self.find_key(key_hash, key) {
            Some(k) => {
                self.keys[k as usize].touched = self.tick;
                Some(k)
            }
            None => self.recall(key, key_hash)?,
        };
        if let Some(k) = key_slot {
            let found = self
                .entry_table
                .find(hash, |&e| {
                    let entry = &self.entries[e as usize];
                    entry.hash == hash && entry.key == k && self.bytes(entry.row) == row
                })
                .copied();
            if let Some(e) = found {
                self.changed(k);
                let entry = &mut self.entries[e as usize];
                entry.weight = entry.weight.saturating_add(weight);
                if entry.weight == 0 {
                    self.remove(e);
                    return Ok(None);
                }
                return Ok(Some(e));
            }
        }
        let k = match key_slot {
            Some(k) => k,
            None => self.new_key(key, key_hash)?,
        };
        self.changed(k);
        let row = self.store(row)?;
        let head = self.keys[k as usize].head;
        let entry = Entry {
            key: k,
            row,
            hash,
            time,
            weight,
            expires,
            aux: 0,
            prev: NONE,
            next: head,
        };
        let e = place(&mut self.entries, &mut self.free_entries, entry, "rows")?;
        if head != NONE {
            self.entries[head as usize].prev = e;
        }
        let slot = &mut self.keys[k as usize];
        slot.head = e;
        slot.rows += 1;
        let entries = &self.entries;
        self.entry_table
            .insert_unique(hash, e, |&x| entries[x as usize].hash);
        if expires != NEVER {
            self.expiry.push(Reverse((expires, e)));
        }
        self.live += 1;
        Ok(Some(e))
    }

    /// Replaces the row of entry `id` (live: a probe or update just returned it) by `row`,
    /// keeping its key, weight, time, expiry and aux count: a keyed table's row replaced by
    /// an update, without taking its key out and putting it back. `row` must not be the row
    /// of another entry of the same key (a table's entries begin with the row's location).
    pub fn replace_row(&mut self, id: u32, row: &[u8]) -> Result<()> {
        let (k, old_hash, old_len) = {
            let entry = &self.entries[id as usize];
            (entry.key, entry.hash, entry.row.len)
        };
        let hash = self.hash_entry(self.keys[k as usize].hash, row);
        if let Ok(found) = self.entry_table.find_entry(old_hash, |&x| x == id) {
            found.remove();
        }
        let span = self.store(row)?;
        let entry = &mut self.entries[id as usize];
        (entry.row, entry.hash) = (span, hash);
        let entries = &self.entries;
        self.entry_table
            .insert_unique(hash, id, |&x| entries[x as usize].hash);
        self.garbage += old_len as usize;
        self.keys[k as usize].touched = self.tick;
        self.changed(k);
        self.compact_if_wasteful();
        Ok(())
    }

    /// Adds `weight` to entry `id` (live: a probe just returned it): [`Arrangement::update`]
    /// of its key and row without finding them again. The entry is gone once its weight is
    /// zero (and the ids of other entries stay).
    pub fn add_weight(&mut self, id: u32, weight: i64) {
        if weight == 0 {
            return;
        }
        let k = self.entries[id as usize].key;
        self.keys[k as usize].touched = self.tick;
        self.changed(k);
        let entry = &mut self.entries[id as usize];
        entry.weight = entry.weight.saturating_add(weight);
        if entry.weight == 0 {
            self.remove(id);
        }
    }

    /// The current round of [`Arrangement::settle`]: keys brought back from disk stay in
    /// memory until the round changes.
    pub fn round(&self) -> u32 {
        self.tick
    }

    /// Entry `id`'s weight (an entry a probe or update just returned).
    pub fn weight(&self, id: u32) -> i64 {
        self.entries[id as usize].weight
    }

    /// Adds `delta` to entry `id`'s aux count; returns it before and after.
    pub fn add_aux(&mut self, id: u32, delta: i64) -> (i64, i64) {
        if delta != 0 {
            self.changed(self.entries[id as usize].key);
        }
        let entry = &mut self.entries[id as usize];
        let before = entry.aux;
        entry.aux = before.saturating_add(delta);
        (before, entry.aux)
    }

    /// Sets entry `id`'s aux count.
    pub fn set_aux(&mut self, id: u32, aux: i64) {
        if self.entries[id as usize].aux != aux {
            self.changed(self.entries[id as usize].key);
        }
        self.entries[id as usize].aux = aux;
    }

    /// Entry `id`'s aux count.
    pub fn aux(&self, id: u32) -> i64 {
        self.entries[id as usize].aux
    }

    /// Entry `id`'s time.
    pub fn time_of(&self, id: u32) -> i64 {
        self.entries[id as usize].time
    }

    /// Entry `id`'s row.
    pub fn row(&self, id: u32) -> &[u8] {
        self.bytes(self.entries[id as usize].row)
    }

    fn new_key(&mut self, key: &[u8], hash: u64) -> Result<u32> {
        let bytes = self.store(key)?;
        let slot = KeySlot {
            bytes,
            hash,
            head: NONE,
            rows: 0,
            touched: self.tick,
            changed: false,
        };
        let k = place(&mut self.keys, &mut self.free_keys, slot, "keys")?;
        let keys = &self.keys;
        self.key_table
            .insert_unique(hash, k, |&x| keys[x as usize].hash);
        Ok(k)
    }

    /// Takes entry `e` out (its weight is zero or it expired).
    fn remove(&mut self, e: u32) {
        self.changed(self.entries[e as usize].key);
        let (key, prev, next, hash, len) = {
            let entry = &mut self.entries[e as usize];
            entry.weight = 0;
            (entry.key, entry.prev, entry.next, entry.hash, entry.row.len)
        };
        if prev != NONE {
            self.entries[prev as usize].next = next;
        } else {
            self.keys[key as usize].head = next;
        }
        if next != NONE {
            self.entries[next as usize].prev = prev;
        }
        if let Ok(found) = self.entry_table.find_entry(hash, |&x| x == e) {
            found.remove();
        }
        self.free_entries.push(e);
        self.garbage += len as usize;
        self.live -= 1;
        let slot = &mut self.keys[key as usize];
        slot.rows -= 1;
        if slot.rows == 0 {
            let (hash, len) = (slot.hash, slot.bytes.len);
            if let Ok(found) = self.key_table.find_entry(hash, |&x| x == key) {
                found.remove();
            }
            self.free_keys.push(key);
            self.garbage += len as usize;
        }
        self.compact_if_wasteful();
    }

    fn compact_if_wasteful(&mut self) {
        if self.garbage > COMPACT_MIN_BYTES && self.garbage * 2 > self.arena.len() {
            self.compact();
        }
    }

    /// Rewrites the arena with only the bytes of live keys and entries.
    fn compact(&mut self) {
        let mut arena = Arena::default();
        let old = std::mem::take(&mut self.arena);
        let mut moved = |span: &mut Span| {
            span.start = arena.push(old.get(span.start, span.len as usize));
        };
        for slot in self.keys.iter_mut().filter(|k| k.rows > 0) {
            moved(&mut slot.bytes);
        }
        for entry in self.entries.iter_mut().filter(|e| e.live()) {
            moved(&mut entry.row);
        }
        self.arena = arena;
        self.garbage = 0;
    }

    /// Renumbers the key and entry slots in use into vectors without the free ones, once
    /// most slots are free (keys gone to disk leave their slots behind: without this, what
    /// stays in memory would grow with what is on disk). Slot order, hence iteration order,
    /// is kept. Only between batches: entry ids given out before are stale after.
    fn compact_slots_if_sparse(&mut self) -> bool {
        let sparse = |len: usize, free: usize| len >= COMPACT_MIN_SLOTS && free * 2 > len;
        if !sparse(self.keys.len(), self.free_keys.len())
            && !sparse(self.entries.len(), self.free_entries.len())
        {
            return false;
        }
        let mut key_ids = vec![NONE; self.keys.len()];
        let mut keys = Vec::with_capacity(self.keys.len() - self.free_keys.len());
        for (old, slot) in self.keys.iter().enumerate() {
            if slot.rows > 0 {
                key_ids[old] = keys.len() as u32;
                keys.push(slot.clone());
            }
        }
        let mut entry_ids = vec![NONE; self.entries.len()];
        let mut entries = Vec::with_capacity(self.entries.len() - self.free_entries.len());
        for (old, entry) in self.entries.iter().enumerate() {
            if entry.live() {
                entry_ids[old] = entries.len() as u32;
                entries.push(entry.clone());
            }
        }
        let moved = |ids: &[u32], id: u32| if id == NONE { NONE } else { ids[id as usize] };
        for slot in &mut keys {
            slot.head = moved(&entry_ids, slot.head);
        }
        self.expiry.clear();
        for (e, entry) in entries.iter_mut().enumerate() {
            entry.key = key_ids[entry.key as usize];
            entry.prev = moved(&entry_ids, entry.prev);
            entry.next = moved(&entry_ids, entry.next);
            if entry.expires != NEVER {
                self.expiry.push(Reverse((entry.expires, e as u32)));
            }
        }
        let mut entry_table = HashTable::with_capacity(entries.len());
        for (e, entry) in entries.iter().enumerate() {
            entry_table.insert_unique(entry.hash, e as u32, |&x| entries[x as usize].hash);
        }
        let mut key_table = HashTable::with_capacity(keys.len());
        for (k, slot) in keys.iter().enumerate() {
            key_table.insert_unique(slot.hash, k as u32, |&x| keys[x as usize].hash);
        }
        self.expiry.shrink_to_fit();
        (self.keys, self.entries) = (keys, entries);
        (self.key_table, self.entry_table) = (key_table, entry_table);
        self.free_keys = Vec::new();
        self.free_entries = Vec::new();
        true
    }

    /// The rows of `key`, newest entry first. In an arrangement that spills, the key must be
    /// in memory: operators [`Arrangement::prepare`] the keys of each batch before probing.
    pub fn probe<'a>(&'a self, key: &[u8]) -> Rows<'a> {
        let head = self
            .resident_key(key)
            .map_or(NONE, |k| self.keys[k as usize].head);
        Rows {
            arrangement: self,
            next: head,
        }
    }

    /// The rows of `key` whose time is within `from..=to`.
    pub fn probe_range<'a>(
        &'a self,
        key: &[u8],
        from: i64,
        to: i64,
    ) -> impl Iterator<Item = Found<'a>> + 'a {
        self.probe(key)
            .filter(move |f| f.time >= from && f.time <= to)
    }

    /// Forgets the rows of `key` (in memory: prepared) that `which` picks, walking only that
    /// key's rows; returns how many.
    pub fn forget_where(&mut self, key: &[u8], which: impl Fn(Found<'_>) -> bool) -> usize {
        let Some(k) = self.resident_key(key) else {
            return 0;
        };
        let (mut e, mut forgotten) = (self.keys[k as usize].head, 0);
        while e != NONE {
            let next = self.entries[e as usize].next;
            if which(self.found(e)) {
                self.remove(e);
                forgotten += 1;
            }
            e = next;
        }
        forgotten
    }

    /// Whether `key` has any row.
    pub fn contains_key(&self, key: &[u8]) -> bool {
        self.resident_key(key).is_some()
    }

    /// The slot of `key` for a probe. A key absent from memory may be on disk only if the
    /// operator did not prepare it: a bug the next settle reports, rather than let the view
    /// answer without the key's rows.
    fn resident_key(&self, key: &[u8]) -> Option<u32> {
        let hash = self.hash_key(key);
        let found = self.find_key(hash, key);
        if found.is_none() {
            self.check_unprepared(key, hash);
        }
        found
    }

    /// Every entry in memory, in slot order (all of them in an arrangement that never spills,
    /// as table contents; [`Arrangement::save`] reads spilled keys too).
    pub fn iter(&self) -> impl Iterator<Item = Found<'_>> + '_ {
        (0..self.entries.len() as u32)
            .filter(|&e| self.entries[e as usize].live())
            .map(|e| self.found(e))
    }

    fn found(&self, id: u32) -> Found<'_> {
        let entry = &self.entries[id as usize];
        Found {
            id,
            key: self.bytes(self.keys[entry.key as usize].bytes),
            row: self.bytes(entry.row),
            time: entry.time,
            weight: entry.weight,
            aux: entry.aux,
        }
    }

    /// Forgets every entry whose expiry is at or below `watermark`; returns how many.
    pub fn expire(&mut self, watermark: i64) -> Result<usize> {
        self.drain_due(watermark, |_| {})
    }

    /// [`Arrangement::expire`], handing each entry to `f` as it goes, in order of expiry.
    pub fn drain_due(&mut self, watermark: i64, mut f: impl FnMut(Found<'_>)) -> Result<usize> {
        self.fault_in_due(watermark)?;
        let mut forgotten = 0;
        while let Some(Reverse((expires, e))) = self.expiry.peek().copied() {
            if expires > watermark {
                break;
            }
            self.expiry.pop();
            let entry = &self.entries[e as usize];
            if entry.live() && entry.expires <= watermark {
                f(self.found(e));
                self.remove(e);
                forgotten += 1;
            }
        }
        Ok(forgotten)
    }
}

/// The rows of one key ([`Arrangement::probe`]).
pub struct Rows<'a> {
    arrangement: &'a Arrangement,
    next: u32,
}

impl<'a> Iterator for Rows<'a> {
    type Item = Found<'a>;

    fn next(&mut self) -> Option<Found<'a>> {
        if self.next == NONE {
            return None;
        }
        let id = self.next;
        self.next = self.arrangement.entries[id as usize].next;
        Some(self.arrangement.found(id))
    }
}

/// Stores `value` in a freed slot of `slots` if there is one, else at the end; returns its
/// index (`what` names the slots in the error when the `u32` index space is used up).
fn place<T>(slots: &mut Vec<T>, free: &mut Vec<u32>, value: T, what: &str) -> Result<u32> {
    if let Some(i) = free.pop() {
        slots[i as usize] = value;
        return Ok(i);
    }
    let i = u32::try_from(slots.len())
        .ok()
        .filter(|i| *i != NONE)
        .ok_or_else(|| Error::internal(format!("an operator holds 4 G {what}")))?;
    slots.push(value);
    Ok(i)
}

#[cfg(test)]
#[path = "arrangement_tests.rs"]
mod tests;
