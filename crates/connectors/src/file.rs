//! The `'file'` connector: a file of JSON lines or CSV records, followed like `tail -f`.
//!
//! Entry point: [`FileTail::next_lines`]. The byte position of a line's start is its offset;
//! a reader hands out only complete lines (a line still being written, without its newline,
//! waits for the next call), so a position is always at a line boundary. A file that shrank
//! was truncated or replaced: reading starts again from its beginning.

use std::io::{Read, Seek, SeekFrom};
use std::ops::Range;
use std::path::PathBuf;

use eddy_common::{Error, Result};

use crate::RawRecord;

/// Complete lines read from a file, in the one buffer they were read into.
#[derive(Debug, Default)]
pub struct Lines {
    /// The bytes read: whole lines, each ending in a newline.
    bytes: Vec<u8>,
    /// The lines that are not blank: their file offset and where they are in `bytes` (without
    /// the newline or a carriage return before it).
    spans: Vec<(u64, Range<usize>)>,
    /// `bytes` holds nothing but the spanned lines, each followed by a bare `\n`.
    clean: bool,
    /// The position after the last line (where the next read starts).
    pub end: u64,
}

impl Lines {
    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    pub fn len(&self) -> usize {
        self.spans.len()
    }

    /// Each line that is not blank, with the offset of its first byte.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &[u8])> {
        self.spans
            .iter()
            .map(|(offset, range)| (*offset, &self.bytes[range.clone()]))
    }

    /// The lines joined by newlines (each followed by one), when that is what was read: no
    /// blank lines and no carriage returns. Decoders read this instead of joining the lines
    /// again.
    pub fn joined(&self) -> Option<&[u8]> {
        self.joined_part(0..self.spans.len())
    }

    /// [`Lines::joined`] of the lines `part` (indices).
    pub fn joined_part(&self, part: Range<usize>) -> Option<&[u8]> {
        let (first, last) = (
            self.spans.get(part.start)?,
            self.spans.get(part.end.checked_sub(1)?)?,
        );
        self.clean
            .then_some(&self.bytes[first.1.start..last.1.end + 1])
    }

    /// The lines `part` as records of partition 0, their offsets in the file.
    pub fn records(&self, part: Range<usize>) -> Vec<RawRecord<'_>> {
        self.spans[part]
            .iter()
            .map(|(offset, range)| RawRecord {
                value: Some(&self.bytes[range.clone()]),
                partition: Some(0),
                offset: Some(*offset),
                ..RawRecord::default()
            })
            .collect()
    }

    /// The lines cut into at most `n` parts of about equal bytes, in order: per part, its
    /// lines (indices) and the file position after it (where reading would go on).
    pub fn parts(&self, n: usize) -> Vec<(Range<usize>, u64)> {
        let n = n.clamp(1, self.spans.len().max(1));
        let per_part = self.bytes.len().div_ceil(n);
        let mut parts = Vec::with_capacity(n);
        let mut start = 0;
        for i in 1..n {
            // The first line starting at or after the i-th cut.
            let cut = self.spans.partition_point(|(_, r)| r.start < i * per_part);
            if cut > start && cut < self.spans.len() {
                parts.push((start..cut, self.spans[cut].0));
                start = cut;
            }
        }
        parts.push((start..self.spans.len(), self.end));
        parts
    }
}

/// The lines of `bytes` that are not blank, as ranges without their line end (`\n` or `\r\n`;
/// the last line needs none), and whether `bytes` is exactly those lines each followed by `\n`.
pub fn split_lines(bytes: &[u8]) -> (Vec<Range<usize>>, bool) {
    let mut spans = Vec::with_capacity(bytes.len() / 64 + 1);
    let mut clean = bytes.last().is_none_or(|b| *b == b'\n');
    let mut start = 0usize;
    let mut push = |start: usize, mut end: usize| {
        if end > start && bytes[end - 1] == b'\r' {
            end -= 1;
            clean = false;
        }
        if bytes[start..end].iter().all(u8::is_ascii_whitespace) {
            clean = false;
        } else {
            spans.push(start..end);
        }
    };
    for newline in memchr::memchr_iter(b'\n', bytes) {
        push(start, newline);
        start = newline + 1;
    }
    if start < bytes.len() {
        push(start, bytes.len());
    }
    (spans, clean)
}

pub struct FileTail {
    path: PathBuf,
    position: u64,
    /// The buffer of the last [`Lines`] handed back by [`FileTail::reuse`].
    spare: Vec<u8>,
}

impl FileTail {
    /// Follows `path` from byte `position` (0 for the start of the file).
    pub fn new(path: impl Into<PathBuf>, position: u64) -> Self {
        FileTail {
            path: path.into(),
            position,
            spare: Vec::new(),
        }
    }

    pub fn position(&self) -> u64 {
        self.position
    }

    /// Reads from `position` on from the next call.
    pub fn seek(&mut self, position: u64) {
        self.position = position;
    }

    /// The file's current size (0 while it does not exist).
    pub fn size(&self) -> u64 {
        std::fs::metadata(&self.path).map_or(0, |m| m.len())
    }

    /// Gives the buffer of lines already dealt with back, for the next read to fill.
    pub fn reuse(&mut self, lines: Lines) {
        self.spare = lines.bytes;
    }

    fn nothing(&mut self) -> Lines {
        Lines {
            end: self.position,
            ..Lines::default()
        }
    }

    /// Reads up to about `max_bytes` of complete lines from the current position. Returns no
    /// lines when nothing new is there yet (or the file does not exist yet).
    pub fn next_lines(&mut self, max_bytes: usize) -> Result<Lines> {
        let mut file = match std::fs::File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(self.nothing()),
            Err(e) => return Err(Error::io(&format!("open {}", self.path.display()), e)),
        };
        let len = file
            .metadata()
            .map_err(|e| Error::io("stat the followed file", e))?
            .len();
        if len < self.position {
            tracing::warn!(path = %self.path.display(), "the followed file shrank (truncated or replaced); reading it from the start");
            self.position = 0;
        }
        if len == self.position {
            return Ok(self.nothing());
        }
        file.seek(SeekFrom::Start(self.position))
            .map_err(|e| Error::io("seek the followed file", e))?;
        let want = ((len - self.position) as usize).min(max_bytes.max(1));
        let mut buf = std::mem::take(&mut self.spare);
        buf.clear();
        buf.reserve(want);
        (&mut file)
            .take(want as u64)
            .read_to_end(&mut buf)
            .map_err(|e| Error::io("read the followed file", e))?;
        // A line longer than `max_bytes` is read whole.
        let mut searched = 0;
        let last = loop {
            if let Some(i) = memchr::memrchr(b'\n', &buf[searched..]) {
                break Some(searched + i);
            }
            searched = buf.len();
            if self.position + (buf.len() as u64) >= len {
                break None;
            }
            let more = ((len - self.position) as usize - buf.len()).min(max_bytes.max(1));
            buf.resize(searched + more, 0);
            file.read_exact(&mut buf[searched..])
                .map_err(|e| Error::io("read the followed file", e))?;
        };
        let Some(last) = last else {
            self.spare = buf;
            return Ok(self.nothing());
        };
        // The torn last line waits for the next read.
        buf.truncate(last + 1);
        let (ranges, clean) = split_lines(&buf);
        let spans = ranges
            .into_iter()
            .map(|r| (self.position + r.start as u64, r))
            .collect();
        self.position += buf.len() as u64;
        Ok(Lines {
            bytes: buf,
            spans,
            clean,
            end: self.position,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn follows_complete_lines_and_waits_for_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        let mut tail = FileTail::new(&path, 0);
        assert!(
            tail.next_lines(1024).unwrap().is_empty(),
            "a missing file is not an error"
        );
        let mut f = std::fs::File::create(&path).unwrap();
        f.write_all(b"{\"a\": 1}\n\n{\"a\": 2}\r\n{\"a\": ")
            .unwrap();
        let got = tail.next_lines(1024).unwrap();
        assert_eq!(
            got.iter().collect::<Vec<_>>(),
            vec![(0, &b"{\"a\": 1}"[..]), (10, &b"{\"a\": 2}"[..])]
        );
        assert_eq!(got.end, 20);
        assert_eq!(
            got.joined(),
            None,
            "a blank line and a CR: not the lines joined"
        );
        tail.reuse(got);
        assert!(
            tail.next_lines(1024).unwrap().is_empty(),
            "the torn last line waits"
        );
        f.write_all(b"3}\n").unwrap();
        let got = tail.next_lines(1024).unwrap();
        assert_eq!(
            got.iter().collect::<Vec<_>>(),
            vec![(20, &b"{\"a\": 3}"[..])]
        );
        assert_eq!(got.joined(), Some(&b"{\"a\": 3}\n"[..]));
        // Resuming at a recorded position reads on from there.
        let mut again = FileTail::new(&path, 10);
        assert_eq!(
            again.next_lines(4).unwrap().len(),
            1,
            "a line longer than the read size is read whole"
        );
    }

    #[test]
    fn a_truncated_file_is_read_from_the_start() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.csv");
        std::fs::write(&path, b"1,a\n2,b\n").unwrap();
        let mut tail = FileTail::new(&path, 0);
        assert_eq!(tail.next_lines(1024).unwrap().len(), 2);
        std::fs::write(&path, b"3,c\n").unwrap();
        assert_eq!(
            tail.next_lines(1024).unwrap().iter().collect::<Vec<_>>(),
            vec![(0, &b"3,c"[..])]
        );
    }

    #[test]
    fn parts_cut_at_lines_and_resume_where_the_next_begins() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("parts.jsonl");
        std::fs::write(&path, b"aaaa\nbbbb\ncccc\ndddd\neeee\n").unwrap();
        let lines = FileTail::new(&path, 0).next_lines(1024).unwrap();
        let parts = lines.parts(2);
        assert_eq!(parts, vec![(0..3, 15), (3..5, 25)]);
        assert_eq!(lines.joined_part(3..5), Some(&b"dddd\neeee\n"[..]));
        let records = lines.records(parts[1].0.clone());
        assert_eq!(records[0].offset, Some(15));
        assert_eq!(records[1].value, Some(&b"eeee"[..]));
        assert_eq!(lines.parts(9).len(), 5, "no more parts than lines");
        let all: Vec<usize> = lines.parts(3).into_iter().flat_map(|(r, _)| r).collect();
        assert_eq!(all, vec![0, 1, 2, 3, 4]);
    }

    #[test]
    fn splits_lines_and_says_when_they_are_already_joined() {
        assert_eq!(split_lines(b"a\nbb\n"), (vec![0..1, 2..4], true));
        assert_eq!(split_lines(b""), (vec![], true));
        assert_eq!(split_lines(b"a\r\nb"), (vec![0..1, 3..4], false));
        assert_eq!(split_lines(b"a\n \n\nb\n"), (vec![0..1, 5..6], false));
        assert_eq!(
            split_lines(b"a\nb"),
            (vec![0..1, 2..3], false),
            "no newline at the end"
        );
    }
}
