//! A source read by several views is read once: per source partition, the views' readers that
//! are at the same position read it together, as one [`Cursor`]. The cursor reads a chunk of
//! the topic, file or generator, decodes it once and hands the rows to every member (a keyed
//! source's rows are resolved against each member's own copy). ADR 0009, step 6.
//!
//! - A new or restored view reads each partition with a cursor of its own, from its position.
//!   Before each read a cursor looks for one of its partition a little ahead of it (within
//!   `reach`: a few chunks, `limits::CURSOR_MERGE_CHUNKS`); if that one's gate is free, the cursor holds it (the one ahead
//!   cannot move meanwhile), reads up to exactly its position, and hands it its members: raw
//!   records are cut at the position, decoded batches never are. Two cursors at one position
//!   merge into the one with the lower id, so a restart, where every view starts at the same
//!   place, reads once from the start.
//! - A slow view holds back only itself: a member without room in its lane leaves the cursor
//!   for a new one of its own at its position (the source is the buffer), which waits for its
//!   room and merges again once it has caught up. A cursor waits for the room of the member with
//!   the most (so it never splits into one cursor per member at once).
//!
//! Locks: a cursor's gate is held while a chunk is handed to its members and by a cursor
//! merging into it; a cursor takes another's gate only with `try_lock`, and only of one ahead
//! of it (by position, then id), so gates never wait on each other in a cycle.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use eddy_common::limits;
use tokio::sync::{Mutex as Gate, OwnedMutexGuard};

use crate::source::SourceReader;

/// The readers of one source partition reading it together.
pub(crate) struct Cursor {
    pub(crate) id: u64,
    pub(crate) partition: u32,
    /// Held while a chunk is handed to the members (and while another cursor merges into this
    /// one): `next` and `members` change only under it.
    gate: Arc<Gate<()>>,
    /// Where the next chunk starts: every member has been handed everything before it.
    next: AtomicU64,
    members: Mutex<Vec<Arc<SourceReader>>>,
    /// Merged into another cursor, or left without members: its task ends.
    retired: AtomicBool,
}

impl Cursor {
    pub(crate) fn next(&self) -> u64 {
        self.next.load(Ordering::Acquire)
    }

    pub(crate) fn retired(&self) -> bool {
        self.retired.load(Ordering::Acquire)
    }

    pub(crate) fn members(&self) -> Vec<Arc<SourceReader>> {
        self.members
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Holds the gate to hand a chunk to the members.
    pub(crate) async fn hold(&self) -> OwnedMutexGuard<()> {
        Arc::clone(&self.gate).lock_owned().await
    }

    /// The members still reading (under the gate); a cursor whose members all stopped
    /// retires.
    pub(crate) fn live_members(&self, cursors: &Cursors) -> Vec<Arc<SourceReader>> {
        let mut members = self.members.lock().unwrap_or_else(|p| p.into_inner());
        members.retain(|m| !m.stopped());
        if members.is_empty() {
            self.retire(cursors);
        }
        members.clone()
    }

    /// Every member got what comes before `next` (under the gate).
    pub(crate) fn advance(&self, next: u64) {
        self.next.store(next, Ordering::Release);
    }

    /// Takes `member` out (under the gate): it goes on in a cursor of its own.
    pub(crate) fn remove(&self, member: &Arc<SourceReader>) {
        self.members
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|m| !Arc::ptr_eq(m, member));
    }

    /// Whether the cursor is done because its members all stopped; checked without waiting
    /// for the gate (a busy gate means it is not done).
    pub(crate) fn abandoned(&self, cursors: &Cursors) -> bool {
        if self.retired() {
            return true;
        }
        match self.gate.try_lock() {
            Ok(_gate) => self.live_members(cursors).is_empty(),
            Err(_) => false,
        }
    }

    fn retire(&self, cursors: &Cursors) {
        self.retired.store(true, Ordering::Release);
        cursors.close(self.id);
    }

    /// Every member has room for at least half of its lane's budget: the cursor keeps up, and
    /// may merge (a merge hands chunks without waiting for room).
    fn keeping_up(&self) -> bool {
        self.members()
            .iter()
            .all(|m| m.room_left() >= limits::VIEW_QUEUE_KIB as usize / 2)
    }
}

/// A merge under way: the cursor ahead, held (it cannot move) until this one has read up to
/// its position.
pub(crate) struct Merging {
    into: Arc<Cursor>,
    _gate: OwnedMutexGuard<()>,
}

impl Merging {
    /// The position to read up to (and not past).
    pub(crate) fn at(&self) -> u64 {
        self.into.next()
    }
}

/// The cursors of one source; shared by the definitions an ALTER SOURCE replaces.
#[derive(Default)]
pub(crate) struct Cursors {
    open: Mutex<Vec<Arc<Cursor>>>,
    ids: AtomicU64,
}

impl Cursors {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Arc<Cursor>>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A cursor of `partition` at `next` for `members`.
    pub(crate) fn open(
        &self,
        partition: u32,
        next: u64,
        members: Vec<Arc<SourceReader>>,
    ) -> Arc<Cursor> {
        let id = self.ids.fetch_add(1, Ordering::Relaxed) + 1;
        for m in &members {
            m.progress.set_reader(partition, id);
        }
        let cursor = Arc::new(Cursor {
            id,
            partition,
            gate: Arc::new(Gate::new(())),
            next: AtomicU64::new(next),
            members: Mutex::new(members),
            retired: AtomicBool::new(false),
        });
        self.lock().push(Arc::clone(&cursor));
        cursor
    }

    fn close(&self, id: u64) {
        self.lock().retain(|c| c.id != id);
    }

    /// Starts merging `cursor` into the nearest cursor of its partition ahead of it, at most
    /// `reach` ahead, if that one's gate is free and `cursor`'s members keep up.
    pub(crate) fn merging(&self, cursor: &Cursor, reach: u64) -> Option<Merging> {
        let here = cursor.next();
        let ahead = |c: &Cursor| {
            let there = c.next();
            there > here || (there == here && c.id < cursor.id)
        };
        let into = self
            .lock()
            .iter()
            .filter(|c| c.partition == cursor.partition && c.id != cursor.id && !c.retired())
            .filter(|c| ahead(c) && c.next() - here <= reach)
            .min_by_key(|c| (c.next(), c.id))
            .cloned()?;
        if !cursor.keeping_up() {
            return None;
        }
        let gate = Arc::clone(&into.gate).try_lock_owned().ok()?;
        // It may have moved or retired before its gate was taken.
        (!into.retired() && ahead(&into) && into.next() - here <= reach)
            .then_some(Merging { into, _gate: gate })
    }

    /// `cursor` has read up to where `merging` is: its members join the cursor ahead and it
    /// retires. `false` (and the merge is given up) when it went past it instead (a file
    /// replaced meanwhile); the caller goes on alone.
    pub(crate) async fn merge(&self, cursor: &Cursor, merging: Merging, position: u64) -> bool {
        if position != merging.at() {
            return false;
        }
        let _own = cursor.hold().await;
        let members =
            std::mem::take(&mut *cursor.members.lock().unwrap_or_else(|p| p.into_inner()));
        for m in &members {
            m.progress.set_reader(cursor.partition, merging.into.id);
        }
        merging
            .into
            .members
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(members);
        tracing::debug!(
            from = cursor.id,
            into = merging.into.id,
            at = position,
            "a cursor merges into the one ahead"
        );
        cursor.retire(self);
        true
    }
}
