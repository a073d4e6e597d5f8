//! [`Arena`]: the bytes of an arrangement's keys and rows, in chunks that are never
//! reallocated. One growing `Vec` would copy all of it each time it doubles, so at that moment
//! the process holds the old and the new copy (a 4 GB state peaking at 8 GB of RSS); chunks
//! only ever add. Chunks grow with the arena, from 4 KiB (many arrangements stay tiny) to
//! 1 MiB; a row larger than that gets a chunk of its own.

/// Where bytes were stored: the chunk in the high 32 bits, the offset in the low 32.
pub(crate) type Place = usize;

const SMALLEST: usize = 4 << 10;
const LARGEST: usize = 1 << 20;

#[derive(Clone, Default)]
pub(crate) struct Arena {
    chunks: Vec<Vec<u8>>,
    len: usize,
}

impl Arena {
    /// Bytes stored (live and garbage).
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Bytes allocated.
    pub(crate) fn capacity(&self) -> usize {
        self.chunks.iter().map(Vec::capacity).sum::<usize>()
            + self.chunks.capacity() * std::mem::size_of::<Vec<u8>>()
    }

    /// Stores `bytes` (at most 4 GiB); returns where.
    pub(crate) fn push(&mut self, bytes: &[u8]) -> Place {
        if bytes.is_empty() {
            return 0;
        }
        let fits = self
            .chunks
            .last()
            .is_some_and(|c| c.capacity() - c.len() >= bytes.len());
        if !fits {
            let size = self.len.clamp(SMALLEST, LARGEST).max(bytes.len());
            self.chunks.push(Vec::with_capacity(size));
        }
        let index = self.chunks.len() - 1;
        let chunk = &mut self.chunks[index];
        let offset = chunk.len();
        chunk.extend_from_slice(bytes);
        self.len += bytes.len();
        (index << 32) | offset
    }

    /// The `len` bytes stored at `place`.
    pub(crate) fn get(&self, place: Place, len: usize) -> &[u8] {
        if len == 0 {
            return &[];
        }
        let offset = place & 0xFFFF_FFFF;
        &self.chunks[place >> 32][offset..offset + len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_come_back_from_chunks_that_never_move() {
        let mut arena = Arena::default();
        let mut stored = Vec::new();
        for i in 0..5000usize {
            let bytes = vec![(i % 251) as u8; i % 700];
            stored.push((arena.push(&bytes), bytes));
        }
        let big = vec![9u8; 3 * LARGEST];
        stored.push((arena.push(&big), big));
        stored.push((arena.push(b"after"), b"after".to_vec()));
        for (place, bytes) in &stored {
            assert_eq!(arena.get(*place, bytes.len()), bytes.as_slice());
        }
        assert_eq!(
            arena.len(),
            stored.iter().map(|(_, b)| b.len()).sum::<usize>()
        );
        // Chunks stay within 1 MiB but for the row larger than that.
        assert!(arena.chunks.iter().all(|c| c.capacity() <= 3 * LARGEST));
        assert!(arena.capacity() < 2 * arena.len() + LARGEST);
    }
}
