//! The `'file'` connector: a file of JSON lines or CSV records, followed like `tail -f`.
//!
//! Entry point: [`FileTail::next_lines`]. The byte position of a line's start is its offset;
//! a reader hands out only complete lines (a line still being written, without its newline,
//! waits for the next call), so a position is always at a line boundary. A file that shrank
//! was truncated or replaced: reading starts again from its beginning.

use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;

use eddy_common::{Error, Result};

/// Complete lines read from a file: each with the offset of its first byte.
#[derive(Debug, Default)]
pub struct Lines {
    pub lines: Vec<(u64, Vec<u8>)>,
    /// The position after the last line (where the next read starts).
    pub end: u64,
}

pub struct FileTail {
    path: PathBuf,
    position: u64,
}

impl FileTail {
    /// Follows `path` from byte `position` (0 for the start of the file).
    pub fn new(path: impl Into<PathBuf>, position: u64) -> Self {
        FileTail {
            path: path.into(),
            position,
        }
    }

    pub fn position(&self) -> u64 {
        self.position
    }

    /// The file's current size (0 while it does not exist).
    pub fn size(&self) -> u64 {
        std::fs::metadata(&self.path).map_or(0, |m| m.len())
    }

    /// Reads up to about `max_bytes` of complete lines from the current position. Returns no
    /// lines when nothing new is there yet (or the file does not exist yet).
    pub fn next_lines(&mut self, max_bytes: usize) -> Result<Lines> {
        let mut file = match std::fs::File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Lines {
                    lines: Vec::new(),
                    end: self.position,
                });
            }
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
            return Ok(Lines {
                lines: Vec::new(),
                end: self.position,
            });
        }
        file.seek(SeekFrom::Start(self.position))
            .map_err(|e| Error::io("seek the followed file", e))?;
        let want = ((len - self.position) as usize).min(max_bytes.max(1));
        let mut buf = Vec::with_capacity(want);
        (&mut file)
            .take(want as u64)
            .read_to_end(&mut buf)
            .map_err(|e| Error::io("read the followed file", e))?;
        // A line longer than `max_bytes` is read whole.
        while !buf.contains(&b'\n') && self.position + (buf.len() as u64) < len {
            let more = ((len - self.position) as usize - buf.len()).min(max_bytes.max(1));
            let start = buf.len();
            buf.resize(start + more, 0);
            file.read_exact(&mut buf[start..])
                .map_err(|e| Error::io("read the followed file", e))?;
        }
        let Some(last) = buf.iter().rposition(|b| *b == b'\n') else {
            return Ok(Lines {
                lines: Vec::new(),
                end: self.position,
            });
        };
        let mut lines = Vec::new();
        let mut start = 0usize;
        for (i, b) in buf[..=last].iter().enumerate() {
            if *b == b'\n' {
                let mut line = &buf[start..i];
                if line.last() == Some(&b'\r') {
                    line = &line[..line.len() - 1];
                }
                if !line.iter().all(u8::is_ascii_whitespace) {
                    lines.push((self.position + start as u64, line.to_vec()));
                }
                start = i + 1;
            }
        }
        self.position += (last + 1) as u64;
        Ok(Lines {
            lines,
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
            tail.next_lines(1024).unwrap().lines.is_empty(),
            "a missing file is not an error"
        );
        let mut f = std::fs::File::create(&path).unwrap();
        f.write_all(b"{\"a\": 1}\n\n{\"a\": 2}\r\n{\"a\": ")
            .unwrap();
        let got = tail.next_lines(1024).unwrap();
        assert_eq!(
            got.lines,
            vec![(0, b"{\"a\": 1}".to_vec()), (10, b"{\"a\": 2}".to_vec())]
        );
        assert_eq!(got.end, 20);
        assert!(
            tail.next_lines(1024).unwrap().lines.is_empty(),
            "the torn last line waits"
        );
        f.write_all(b"3}\n").unwrap();
        let got = tail.next_lines(1024).unwrap();
        assert_eq!(got.lines, vec![(20, b"{\"a\": 3}".to_vec())]);
        // Resuming at a recorded position reads on from there.
        let mut again = FileTail::new(&path, 10);
        assert_eq!(
            again.next_lines(4).unwrap().lines.len(),
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
        assert_eq!(tail.next_lines(1024).unwrap().lines.len(), 2);
        std::fs::write(&path, b"3,c\n").unwrap();
        assert_eq!(
            tail.next_lines(1024).unwrap().lines,
            vec![(0, b"3,c".to_vec())]
        );
    }
}
