//! Byte strings back to back — keys or encoded rows an operator collects in an epoch — with
//! no allocation per string, optionally with a weight each.

/// Byte strings back to back.
#[derive(Default)]
pub(crate) struct Packed {
    bytes: Vec<u8>,
    ends: Vec<usize>,
}

impl Packed {
    /// Appends one string made of `parts`.
    pub(crate) fn push(&mut self, parts: &[&[u8]]) {
        for part in parts {
            self.bytes.extend_from_slice(part);
        }
        self.ends.push(self.bytes.len());
    }

    pub(crate) fn len(&self) -> usize {
        self.ends.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    pub(crate) fn get(&self, i: usize) -> &[u8] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.bytes[start..self.ends[i]]
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &[u8]> {
        (0..self.len()).map(|i| self.get(i))
    }
}

/// Byte strings (rows of changes) with a weight each.
#[derive(Default)]
pub(crate) struct Weighted {
    pub(crate) rows: Packed,
    pub(crate) diffs: Vec<i64>,
}

impl Weighted {
    pub(crate) fn push(&mut self, parts: &[&[u8]], diff: i64) {
        self.rows.push(parts);
        self.diffs.push(diff);
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (&[u8], i64)> {
        self.rows.iter().zip(self.diffs.iter().copied())
    }
}
