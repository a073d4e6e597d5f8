//! One partition of one object's log: a directory of segment files named by their first offset.
//!
//! Records are appended to the newest segment; once it passes
//! [`limits::LOG_SEGMENT_BYTES_TARGET`] a new one is started. Opening a partition validates every
//! frame: a torn tail of the newest segment is truncated (it was never acknowledged), a bad frame
//! anywhere else is corruption and refuses to open.

use std::fs::{self, File, OpenOptions};
use std::io::{BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use eddy_common::{Error, Offset, Result, SqlState, TxnId, limits};

use super::frame::{self, FRAME_HEADER_BYTES, Record};

const SEGMENT_SUFFIX: &str = "seg";

#[derive(Debug, Clone)]
struct Segment {
    base: Offset,
    path: PathBuf,
    /// Bytes of valid frames.
    len: u64,
    records: u64,
}

/// A record header seen while opening: kept only for records of multi-object transactions,
/// which recovery must cross-check.
#[derive(Debug, Clone)]
pub struct MultiObjectRecord {
    pub offset: Offset,
    pub txn_id: TxnId,
    pub participants: Vec<eddy_common::ObjectId>,
}

pub struct PartitionLog {
    dir: PathBuf,
    segments: Vec<Segment>,
    active: Option<File>,
    /// Highest transaction id in this partition.
    pub txn_max: TxnId,
    /// Records of multi-object transactions, in offset order.
    pub multi_object_records: Vec<MultiObjectRecord>,
}

fn io(context: &str, path: &Path, err: std::io::Error) -> Error {
    Error::io(&format!("{context} {}", path.display()), err)
}

fn segment_path(dir: &Path, base: Offset) -> PathBuf {
    dir.join(format!("{:020}.{SEGMENT_SUFFIX}", base.0))
}

/// fsync a directory so that files created or removed in it survive a crash.
pub fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir).and_then(|f| f.sync_all()).map_err(|e| io("sync directory", dir, e))
}

impl PartitionLog {
    /// Opens (creating if needed) the partition in `dir`, validating every frame.
    pub fn open(dir: &Path) -> Result<Self> {
        fs::create_dir_all(dir).map_err(|e| io("create", dir, e))?;
        let mut bases = Vec::new();
        for entry in fs::read_dir(dir).map_err(|e| io("list", dir, e))? {
            let path = entry.map_err(|e| io("list", dir, e))?.path();
            if path.extension().and_then(|e| e.to_str()) != Some(SEGMENT_SUFFIX) {
                continue;
            }
            let base = path
                .file_stem()
                .and_then(|s| s.to_str())
                .and_then(|s| s.parse::<u64>().ok())
                .ok_or_else(|| {
                    Error::new(SqlState::DATA_CORRUPTED, format!("unexpected file {}", path.display()))
                })?;
            bases.push(Offset(base));
        }
        bases.sort();
        let mut log = PartitionLog {
            dir: dir.to_path_buf(),
            segments: Vec::new(),
            active: None,
            txn_max: TxnId(0),
            multi_object_records: Vec::new(),
        };
        let count = bases.len();
        for (i, base) in bases.into_iter().enumerate() {
            let segment = log.validate_segment(base, i + 1 == count)?;
            log.segments.push(segment);
        }
        Ok(log)
    }

    /// Reads every frame of one segment; truncates a torn tail when `is_last`.
    fn validate_segment(&mut self, base: Offset, is_last: bool) -> Result<Segment> {
        let path = segment_path(&self.dir, base);
        let file = File::open(&path).map_err(|e| io("open", &path, e))?;
        let file_len = file.metadata().map_err(|e| io("stat", &path, e))?.len();
        let mut reader = BufReader::with_capacity(1 << 20, file);
        let mut pos = 0u64;
        let mut records = 0u64;
        let torn = loop {
            match read_frame(&mut reader, file_len - pos) {
                Ok(None) => break None,
                Ok(Some((record, frame_len))) => {
                    let offset = Offset(base.0 + records);
                    self.txn_max = self.txn_max.max(record.txn_id);
                    if !record.participants.is_empty() {
                        self.multi_object_records.push(MultiObjectRecord {
                            offset,
                            txn_id: record.txn_id,
                            participants: record.participants,
                        });
                    }
                    pos += frame_len;
                    records += 1;
                }
                Err(why) => break Some(why),
            }
        };
        if let Some(why) = torn {
            if !is_last {
                return Err(Error::new(
                    SqlState::DATA_CORRUPTED,
                    format!("corrupt record in {} at byte {pos}: {why}", path.display()),
                ));
            }
            tracing::warn!(segment = %path.display(), byte = pos, %why,
                "truncating the torn tail of the log (never acknowledged)");
            truncate_file(&path, pos)?;
        }
        Ok(Segment { base, path, len: pos, records })
    }

    /// The offset the next appended record gets.
    pub fn end_offset(&self) -> Offset {
        self.segments.last().map_or(Offset(0), |s| Offset(s.base.0 + s.records))
    }

    /// Appends one record (not yet durable: call [`PartitionLog::sync`]). Returns its offset.
    pub fn append(&mut self, record: &Record, scratch: &mut Vec<u8>) -> Result<Offset> {
        scratch.clear();
        frame::encode(record, scratch)?;
        let needs_new = match self.segments.last() {
            None => true,
            Some(s) => s.len >= limits::LOG_SEGMENT_BYTES_TARGET,
        };
        if needs_new {
            self.roll()?;
        }
        let offset = self.end_offset();
        let file = self.active_file()?;
        file.write_all(scratch).map_err(|e| Error::io("append to the log", e))?;
        if let Some(segment) = self.segments.last_mut() {
            segment.len += scratch.len() as u64;
            segment.records += 1;
        }
        self.txn_max = self.txn_max.max(record.txn_id);
        if !record.participants.is_empty() {
            self.multi_object_records.push(MultiObjectRecord {
                offset,
                txn_id: record.txn_id,
                participants: record.participants.clone(),
            });
        }
        Ok(offset)
    }

    fn roll(&mut self) -> Result<()> {
        if let Some(file) = self.active.take() {
            file.sync_data().map_err(|e| Error::io("sync a full log segment", e))?;
        }
        let base = self.end_offset();
        let path = segment_path(&self.dir, base);
        File::create(&path).map_err(|e| io("create", &path, e))?;
        sync_dir(&self.dir)?;
        self.segments.push(Segment { base, path, len: 0, records: 0 });
        Ok(())
    }

    fn active_file(&mut self) -> Result<&mut File> {
        if self.active.is_none() {
            let segment = self.segments.last().ok_or_else(|| Error::internal("no active segment"))?;
            let file = OpenOptions::new()
                .append(true)
                .open(&segment.path)
                .map_err(|e| io("open", &segment.path, e))?;
            self.active = Some(file);
        }
        self.active.as_mut().ok_or_else(|| Error::internal("no active segment file"))
    }

    /// Makes every appended record durable.
    pub fn sync(&mut self) -> Result<()> {
        if let Some(file) = self.active.as_mut() {
            file.sync_data().map_err(|e| Error::io("fsync the log", e))?;
        }
        Ok(())
    }

    /// Drops every record at or after `offset` (recovery of torn multi-object transactions).
    pub fn truncate_from(&mut self, offset: Offset) -> Result<()> {
        self.active = None;
        while let Some(last) = self.segments.last() {
            if last.base < offset || (last.base == offset && self.segments.len() == 1) {
                break;
            }
            fs::remove_file(&last.path).map_err(|e| io("remove", &last.path, e))?;
            self.segments.pop();
        }
        if let Some(last) = self.segments.last_mut() {
            let keep = offset.0.saturating_sub(last.base.0);
            if keep < last.records {
                let mut reader = BufReader::new(
                    File::open(&last.path).map_err(|e| io("open", &last.path, e))?,
                );
                let mut pos = 0u64;
                for _ in 0..keep {
                    let (_, frame_len) = read_frame(&mut reader, u64::MAX)
                        .map_err(|why| Error::internal(format!("re-reading a validated frame: {why}")))?
                        .ok_or_else(|| Error::internal("validated frame vanished"))?;
                    pos += frame_len;
                }
                truncate_file(&last.path, pos)?;
                last.len = pos;
                last.records = keep;
            }
        }
        self.multi_object_records.retain(|r| r.offset < offset);
        sync_dir(&self.dir)
    }

    /// Calls `f` for every record from `from` up to the end as it is now.
    pub fn scan(&self, from: Offset, mut f: impl FnMut(Offset, Record) -> Result<()>) -> Result<()> {
        for segment in &self.segments {
            let end = segment.base.0 + segment.records;
            if end <= from.0 {
                continue;
            }
            let mut file = File::open(&segment.path).map_err(|e| io("open", &segment.path, e))?;
            file.seek(SeekFrom::Start(0)).map_err(|e| io("seek", &segment.path, e))?;
            let mut reader = BufReader::with_capacity(1 << 20, file.take(segment.len));
            let mut remaining = segment.len;
            for i in 0..segment.records {
                let (record, frame_len) = read_frame(&mut reader, remaining)
                    .map_err(|why| Error::new(SqlState::DATA_CORRUPTED, format!(
                        "corrupt record in {}: {why}", segment.path.display())))?
                    .ok_or_else(|| Error::new(SqlState::DATA_CORRUPTED, format!(
                        "log segment {} is shorter than its index", segment.path.display())))?;
                remaining -= frame_len;
                let offset = Offset(segment.base.0 + i);
                if offset >= from {
                    f(offset, record)?;
                }
            }
        }
        Ok(())
    }
}

fn truncate_file(path: &Path, len: u64) -> Result<()> {
    let file = OpenOptions::new().write(true).open(path).map_err(|e| io("open", path, e))?;
    file.set_len(len).map_err(|e| io("truncate", path, e))?;
    file.sync_all().map_err(|e| io("sync", path, e))
}

/// Reads one frame. `Ok(None)` at a clean end; `Err` for a short or bad frame.
fn read_frame(reader: &mut impl Read, remaining: u64) -> std::result::Result<Option<(Record, u64)>, String> {
    if remaining == 0 {
        return Ok(None);
    }
    let mut header = [0u8; FRAME_HEADER_BYTES];
    reader.read_exact(&mut header).map_err(|e| format!("short frame header: {e}"))?;
    let header = frame::decode_header(&header);
    let frame_len = (FRAME_HEADER_BYTES + header.body_len) as u64;
    if header.body_len > limits::LOG_RECORD_BYTES_MAX || frame_len > remaining {
        return Err(format!("frame length {} runs past the end of the segment", header.body_len));
    }
    let mut body = vec![0u8; header.body_len];
    reader.read_exact(&mut body).map_err(|e| format!("short frame body: {e}"))?;
    let record = frame::decode_body(&header, &body).map_err(|frame::FrameError::Torn(why)| why)?;
    Ok(Some((record, frame_len)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(txn: u64, payload: &[u8]) -> Record {
        Record { txn_id: TxnId(txn), participants: vec![], payload: payload.to_vec() }
    }

    fn collect(log: &PartitionLog, from: u64) -> Vec<(u64, Vec<u8>)> {
        let mut out = Vec::new();
        log.scan(Offset(from), |o, r| {
            out.push((o.0, r.payload));
            Ok(())
        })
        .unwrap();
        out
    }

    #[test]
    fn append_sync_reopen_scan() {
        let dir = tempfile::tempdir().unwrap();
        let mut scratch = Vec::new();
        {
            let mut log = PartitionLog::open(dir.path()).unwrap();
            for i in 0..5u64 {
                assert_eq!(log.append(&record(i + 1, &[i as u8]), &mut scratch).unwrap(), Offset(i));
            }
            log.sync().unwrap();
        }
        let log = PartitionLog::open(dir.path()).unwrap();
        assert_eq!(log.end_offset(), Offset(5));
        assert_eq!(log.txn_max, TxnId(5));
        assert_eq!(collect(&log, 3), vec![(3, vec![3]), (4, vec![4])]);
    }

    #[test]
    fn torn_tail_is_truncated_and_never_served() {
        let dir = tempfile::tempdir().unwrap();
        let mut scratch = Vec::new();
        {
            let mut log = PartitionLog::open(dir.path()).unwrap();
            log.append(&record(1, b"kept"), &mut scratch).unwrap();
            log.append(&record(2, b"torn"), &mut scratch).unwrap();
            log.sync().unwrap();
        }
        // Cut the second frame in half, as a crash during the write would.
        let path = segment_path(dir.path(), Offset(0));
        let len = fs::metadata(&path).unwrap().len();
        truncate_file(&path, len - 3).unwrap();
        let mut log = PartitionLog::open(dir.path()).unwrap();
        assert_eq!(collect(&log, 0), vec![(0, b"kept".to_vec())]);
        // Appending after recovery continues at the right offset.
        assert_eq!(log.append(&record(3, b"next"), &mut scratch).unwrap(), Offset(1));
        log.sync().unwrap();
        let log = PartitionLog::open(dir.path()).unwrap();
        assert_eq!(collect(&log, 0), vec![(0, b"kept".to_vec()), (1, b"next".to_vec())]);
    }

    #[test]
    fn flipped_bit_in_tail_is_detected_by_crc() {
        let dir = tempfile::tempdir().unwrap();
        let mut scratch = Vec::new();
        {
            let mut log = PartitionLog::open(dir.path()).unwrap();
            log.append(&record(1, b"aaaa"), &mut scratch).unwrap();
            log.append(&record(2, b"bbbb"), &mut scratch).unwrap();
            log.sync().unwrap();
        }
        let path = segment_path(dir.path(), Offset(0));
        let mut bytes = fs::read(&path).unwrap();
        let n = bytes.len();
        bytes[n - 1] ^= 0xff;
        fs::write(&path, bytes).unwrap();
        let log = PartitionLog::open(dir.path()).unwrap();
        assert_eq!(collect(&log, 0), vec![(0, b"aaaa".to_vec())]);
    }

    #[test]
    fn truncate_from_drops_later_records() {
        let dir = tempfile::tempdir().unwrap();
        let mut scratch = Vec::new();
        let mut log = PartitionLog::open(dir.path()).unwrap();
        for i in 0..4u64 {
            log.append(&record(i + 1, &[i as u8]), &mut scratch).unwrap();
        }
        log.sync().unwrap();
        log.truncate_from(Offset(2)).unwrap();
        assert_eq!(log.end_offset(), Offset(2));
        drop(log);
        let log = PartitionLog::open(dir.path()).unwrap();
        assert_eq!(collect(&log, 0), vec![(0, vec![0]), (1, vec![1])]);
    }
}
