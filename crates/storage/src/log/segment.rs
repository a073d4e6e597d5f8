//! One partition of one object's log: a directory of segment files named by their first offset.
//!
//! Records are appended to the newest segment; once it passes
//! [`limits::LOG_SEGMENT_BYTES_TARGET`] a new one is started. Opening a partition validates every
//! frame: a torn tail of the newest segment is truncated (it was never acknowledged), a bad frame
//! anywhere else is corruption and refuses to open.
//!
//! Each segment keeps a sparse offset index in memory (built while validating and appending):
//! the byte position of a record every [`INDEX_INTERVAL_BYTES`], so that a reader starting at
//! an offset seeks near it instead of reading the segment from its start.

use std::fs::{self, File, OpenOptions};
use std::io::{BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use eddy_common::{Error, Offset, Result, SqlState, TxnId, limits};

use super::frame::{self, FRAME_HEADER_BYTES, Participant, Record};

const SEGMENT_SUFFIX: &str = "seg";

/// A segment's sparse index gets an entry once this many bytes were written since the last.
pub const INDEX_INTERVAL_BYTES: u64 = 4096;

#[derive(Debug, Clone)]
struct Segment {
    base: Offset,
    path: PathBuf,
    /// Bytes of valid frames.
    len: u64,
    records: u64,
    /// (record number within the segment, byte position of its frame), ascending; the first
    /// entry is always (0, 0).
    index: Vec<(u64, u64)>,
}

impl Segment {
    fn new(base: Offset, path: PathBuf) -> Self {
        Segment {
            base,
            path,
            len: 0,
            records: 0,
            index: vec![(0, 0)],
        }
    }

    /// Notes a frame of `frame_len` bytes appended at the end.
    fn push_frame(&mut self, frame_len: u64) {
        let last = self.index.last().map_or(0, |e| e.1);
        if self.len - last >= INDEX_INTERVAL_BYTES {
            self.index.push((self.records, self.len));
        }
        self.len += frame_len;
        self.records += 1;
    }

    /// The indexed record at or before record number `n`, and its byte position.
    fn seek_point(&self, n: u64) -> (u64, u64) {
        let at = self.index.partition_point(|e| e.0 <= n);
        self.index[at.saturating_sub(1)]
    }
}

/// A segment retention may delete (see [`PartitionLog::sealed_segments`]).
#[derive(Debug, Clone)]
pub struct SealedSegment {
    pub start: Offset,
    /// The offset after its last record.
    pub end: Offset,
    pub bytes: u64,
    pub modified: Option<std::time::SystemTime>,
}

/// A record header seen while opening: kept only for records of multi-partition transactions,
/// which recovery must cross-check.
#[derive(Debug, Clone)]
pub struct MultiPartitionRecord {
    pub offset: Offset,
    pub txn_id: TxnId,
    pub participants: Vec<Participant>,
}

pub struct PartitionLog {
    dir: PathBuf,
    segments: Vec<Segment>,
    active: Option<File>,
    /// A new segment starts once the active one holds this many bytes.
    segment_bytes: u64,
    /// Highest transaction id in this partition.
    pub txn_max: TxnId,
    /// Records of multi-partition transactions, in offset order.
    pub multi_partition_records: Vec<MultiPartitionRecord>,
}

fn io(context: &str, path: &Path, err: std::io::Error) -> Error {
    Error::io(&format!("{context} {}", path.display()), err)
}

fn segment_path(dir: &Path, base: Offset) -> PathBuf {
    dir.join(format!("{:020}.{SEGMENT_SUFFIX}", base.0))
}

/// fsync a directory so that files created or removed in it survive a crash.
pub fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|f| f.sync_all())
        .map_err(|e| io("sync directory", dir, e))
}

impl PartitionLog {
    /// Opens (creating if needed) the partition in `dir`, validating every frame.
    #[cfg(test)]
    pub fn open(dir: &Path) -> Result<Self> {
        Self::open_with(dir, limits::LOG_SEGMENT_BYTES_TARGET)
    }

    /// [`PartitionLog::open`] with a segment size of its own (tests roll segments quickly).
    pub fn open_with(dir: &Path, segment_bytes: u64) -> Result<Self> {
        fs::create_dir_all(dir).map_err(|e| io("create", dir, e))?;
        let mut bases = Vec::new();
        for entry in fs::read_dir(dir).map_err(|e| io("list", dir, e))? {
            let path = entry.map_err(|e| io("list", dir, e))?.path();
            if path.extension().and_then(|e| e.to_str()) == Some("new") {
                // A compaction cut off before its rename: the old segment is still whole.
                fs::remove_file(&path).map_err(|e| io("remove", &path, e))?;
                continue;
            }
            if path.extension().and_then(|e| e.to_str()) != Some(SEGMENT_SUFFIX) {
                continue;
            }
            let base = path
                .file_stem()
                .and_then(|s| s.to_str())
                .and_then(|s| s.parse::<u64>().ok())
                .ok_or_else(|| {
                    Error::new(
                        SqlState::DATA_CORRUPTED,
                        format!("unexpected file {}", path.display()),
                    )
                })?;
            bases.push(Offset(base));
        }
        bases.sort();
        let mut log = PartitionLog {
            dir: dir.to_path_buf(),
            segments: Vec::new(),
            active: None,
            segment_bytes,
            txn_max: TxnId(0),
            multi_partition_records: Vec::new(),
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
        let mut segment = Segment::new(base, path.clone());
        let torn = loop {
            match read_frame(&mut reader, file_len - segment.len) {
                Ok(None) => break None,
                Ok(Some((record, frame_len))) => {
                    let offset = Offset(base.0 + segment.records);
                    self.txn_max = self.txn_max.max(record.txn_id);
                    if !record.participants.is_empty() {
                        self.multi_partition_records.push(MultiPartitionRecord {
                            offset,
                            txn_id: record.txn_id,
                            participants: record.participants,
                        });
                    }
                    segment.push_frame(frame_len);
                }
                Err(why) => break Some(why),
            }
        };
        let pos = segment.len;
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
        Ok(segment)
    }

    /// The offset the next appended record gets.
    pub fn end_offset(&self) -> Offset {
        self.segments
            .last()
            .map_or(Offset(0), |s| Offset(s.base.0 + s.records))
    }

    /// Appends one record (not yet durable: call [`PartitionLog::sync`]). Returns its offset.
    pub fn append(&mut self, record: &Record, scratch: &mut Vec<u8>) -> Result<Offset> {
        scratch.clear();
        frame::encode(record, scratch)?;
        let needs_new = match self.segments.last() {
            None => true,
            Some(s) => s.len >= self.segment_bytes,
        };
        if needs_new {
            self.roll()?;
        }
        let offset = self.end_offset();
        let file = self.active_file()?;
        file.write_all(scratch)
            .map_err(|e| Error::io("append to the log", e))?;
        if let Some(segment) = self.segments.last_mut() {
            segment.push_frame(scratch.len() as u64);
        }
        self.txn_max = self.txn_max.max(record.txn_id);
        if !record.participants.is_empty() {
            self.multi_partition_records.push(MultiPartitionRecord {
                offset,
                txn_id: record.txn_id,
                participants: record.participants.clone(),
            });
        }
        Ok(offset)
    }

    fn roll(&mut self) -> Result<()> {
        if let Some(file) = self.active.take() {
            file.sync_data()
                .map_err(|e| Error::io("sync a full log segment", e))?;
        }
        let base = self.end_offset();
        let path = segment_path(&self.dir, base);
        File::create(&path).map_err(|e| io("create", &path, e))?;
        sync_dir(&self.dir)?;
        self.segments.push(Segment::new(base, path));
        Ok(())
    }

    fn active_file(&mut self) -> Result<&mut File> {
        if self.active.is_none() {
            let segment = self
                .segments
                .last()
                .ok_or_else(|| Error::internal("no active segment"))?;
            let file = OpenOptions::new()
                .append(true)
                .open(&segment.path)
                .map_err(|e| io("open", &segment.path, e))?;
            self.active = Some(file);
        }
        self.active
            .as_mut()
            .ok_or_else(|| Error::internal("no active segment file"))
    }

    /// Makes every appended record durable.
    pub fn sync(&mut self) -> Result<()> {
        if let Some(file) = self.active.as_mut() {
            file.sync_data()
                .map_err(|e| Error::io("fsync the log", e))?;
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
                let mut reader =
                    BufReader::new(File::open(&last.path).map_err(|e| io("open", &last.path, e))?);
                let mut pos = 0u64;
                for _ in 0..keep {
                    let (_, frame_len) = read_frame(&mut reader, u64::MAX)
                        .map_err(|why| {
                            Error::internal(format!("re-reading a validated frame: {why}"))
                        })?
                        .ok_or_else(|| Error::internal("validated frame vanished"))?;
                    pos += frame_len;
                }
                truncate_file(&last.path, pos)?;
                last.len = pos;
                last.records = keep;
                last.index.retain(|e| e.0 < keep.max(1));
            }
        }
        self.multi_partition_records.retain(|r| r.offset < offset);
        sync_dir(&self.dir)
    }

    /// The offset of the oldest record kept (the log end when there is none).
    pub fn start_offset(&self) -> Offset {
        self.segments.first().map_or(Offset(0), |s| s.base)
    }

    /// Every segment but the one being appended to: (first offset, end offset, bytes, when it
    /// was last written), oldest first. These are what retention may delete.
    pub fn sealed_segments(&self) -> Vec<SealedSegment> {
        let sealed = self.segments.len().saturating_sub(1);
        self.segments[..sealed]
            .iter()
            .map(|s| SealedSegment {
                start: s.base,
                end: Offset(s.base.0 + s.records),
                bytes: s.len,
                modified: fs::metadata(&s.path).and_then(|m| m.modified()).ok(),
            })
            .collect()
    }

    /// Deletes the oldest segments whose records all lie before `before` (never the one being
    /// appended to). Offsets do not change; a scan from an offset that was deleted starts at
    /// the oldest record kept. Returns how many segments went.
    pub fn delete_segments_before(&mut self, before: Offset) -> Result<usize> {
        let sealed = self.segments.len().saturating_sub(1);
        let n = self.segments[..sealed]
            .iter()
            .take_while(|s| s.base.0 + s.records <= before.0)
            .count();
        for segment in &self.segments[..n] {
            fs::remove_file(&segment.path).map_err(|e| io("remove", &segment.path, e))?;
        }
        if n > 0 {
            self.segments.drain(..n);
            let start = self.start_offset();
            self.multi_partition_records.retain(|r| r.offset >= start);
            sync_dir(&self.dir)?;
        }
        Ok(n)
    }

    /// Replaces the records of the sealed segment that starts at `base` with `records` (as many
    /// as it holds, so offsets do not change): written to a new file, fsync'd, renamed over the
    /// old one. Compaction uses it; a reader holding this log's lock sees either version whole.
    pub fn rewrite_segment(&mut self, base: Offset, records: &[Record]) -> Result<()> {
        let sealed = self.segments.len().saturating_sub(1);
        let at = self.segments[..sealed]
            .iter()
            .position(|s| s.base == base)
            .ok_or_else(|| {
                Error::internal(format!("no sealed log segment starts at offset {}", base.0))
            })?;
        let old = &self.segments[at];
        if records.len() as u64 != old.records {
            return Err(Error::internal(format!(
                "rewriting segment {} with {} records instead of {}",
                old.path.display(),
                records.len(),
                old.records
            )));
        }
        let mut segment = Segment::new(base, old.path.clone());
        let mut bytes = Vec::new();
        let mut frame = Vec::new();
        for record in records {
            frame.clear();
            frame::encode(record, &mut frame)?;
            bytes.extend_from_slice(&frame);
            segment.push_frame(frame.len() as u64);
        }
        let temp = old.path.with_extension("seg.new");
        let mut file = File::create(&temp).map_err(|e| io("create", &temp, e))?;
        file.write_all(&bytes).map_err(|e| io("write", &temp, e))?;
        file.sync_all().map_err(|e| io("sync", &temp, e))?;
        fs::rename(&temp, &old.path).map_err(|e| io("rename", &temp, e))?;
        sync_dir(&self.dir)?;
        self.segments[at] = segment;
        Ok(())
    }

    /// Calls `f` for every record from `from` up to the end as it is now.
    pub fn scan(&self, from: Offset, f: impl FnMut(Offset, Record) -> Result<()>) -> Result<()> {
        self.scan_range(from, Offset(u64::MAX), f)
    }

    /// Calls `f` for every record from `from` up to `until` (exclusive) or the end.
    pub fn scan_range(
        &self,
        from: Offset,
        until: Offset,
        mut f: impl FnMut(Offset, Record) -> Result<()>,
    ) -> Result<()> {
        // The first segment that holds `from` (or any later record).
        let first = self
            .segments
            .partition_point(|s| s.base.0 + s.records <= from.0);
        for segment in self.segments[first..].iter().take_while(|s| s.base < until) {
            let (start, pos) = segment.seek_point(from.0.saturating_sub(segment.base.0));
            let mut file = File::open(&segment.path).map_err(|e| io("open", &segment.path, e))?;
            file.seek(SeekFrom::Start(pos))
                .map_err(|e| io("seek", &segment.path, e))?;
            let mut reader = BufReader::with_capacity(1 << 20, file.take(segment.len - pos));
            let mut remaining = segment.len - pos;
            for i in start..segment.records {
                let (record, frame_len) = read_frame(&mut reader, remaining)
                    .map_err(|why| {
                        Error::new(
                            SqlState::DATA_CORRUPTED,
                            format!("corrupt record in {}: {why}", segment.path.display()),
                        )
                    })?
                    .ok_or_else(|| {
                        Error::new(
                            SqlState::DATA_CORRUPTED,
                            format!(
                                "log segment {} is shorter than its index",
                                segment.path.display()
                            ),
                        )
                    })?;
                remaining -= frame_len;
                let offset = Offset(segment.base.0 + i);
                if offset >= until {
                    break;
                }
                if offset >= from {
                    f(offset, record)?;
                }
            }
        }
        Ok(())
    }
}

fn truncate_file(path: &Path, len: u64) -> Result<()> {
    let file = OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| io("open", path, e))?;
    file.set_len(len).map_err(|e| io("truncate", path, e))?;
    file.sync_all().map_err(|e| io("sync", path, e))
}

/// Reads one frame. `Ok(None)` at a clean end; `Err` for a short or bad frame.
fn read_frame(
    reader: &mut impl Read,
    remaining: u64,
) -> std::result::Result<Option<(Record, u64)>, String> {
    if remaining == 0 {
        return Ok(None);
    }
    let mut header = [0u8; FRAME_HEADER_BYTES];
    reader
        .read_exact(&mut header)
        .map_err(|e| format!("short frame header: {e}"))?;
    let header = frame::decode_header(&header);
    let frame_len = (FRAME_HEADER_BYTES + header.body_len) as u64;
    if header.body_len > limits::LOG_RECORD_BYTES_MAX || frame_len > remaining {
        return Err(format!(
            "frame length {} runs past the end of the segment",
            header.body_len
        ));
    }
    let mut body = vec![0u8; header.body_len];
    reader
        .read_exact(&mut body)
        .map_err(|e| format!("short frame body: {e}"))?;
    let record = frame::decode_body(&header, &body).map_err(|frame::FrameError::Torn(why)| why)?;
    Ok(Some((record, frame_len)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(txn: u64, payload: &[u8]) -> Record {
        Record {
            txn_id: TxnId(txn),
            participants: vec![],
            payload: payload.to_vec(),
        }
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
                assert_eq!(
                    log.append(&record(i + 1, &[i as u8]), &mut scratch)
                        .unwrap(),
                    Offset(i)
                );
            }
            log.sync().unwrap();
        }
        let log = PartitionLog::open(dir.path()).unwrap();
        assert_eq!(log.end_offset(), Offset(5));
        assert_eq!(log.txn_max, TxnId(5));
        assert_eq!(collect(&log, 3), vec![(3, vec![3]), (4, vec![4])]);
    }

    /// A range read across segments stops at `until` and serves what lies between.
    #[test]
    fn scan_range_stops_at_its_end_across_segments() {
        let dir = tempfile::tempdir().unwrap();
        let mut scratch = Vec::new();
        // Tiny segments: a few records each.
        let mut log = PartitionLog::open_with(dir.path(), 64).unwrap();
        for i in 0..20u64 {
            log.append(&record(i + 1, &[i as u8; 8]), &mut scratch)
                .unwrap();
        }
        assert!(log.segments.len() > 3, "{} segments", log.segments.len());
        let range = |from: u64, until: u64| {
            let mut out = Vec::new();
            log.scan_range(Offset(from), Offset(until), |o, r| {
                out.push((o.0, r.txn_id.0));
                Ok(())
            })
            .unwrap();
            out
        };
        assert_eq!(range(3, 7), (3..7).map(|o| (o, o + 1)).collect::<Vec<_>>());
        assert_eq!(range(0, 20).len(), 20);
        assert_eq!(range(18, 100), vec![(18, 19), (19, 20)]);
        assert!(range(5, 5).is_empty());
        assert!(range(20, 30).is_empty());
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
        assert_eq!(
            log.append(&record(3, b"next"), &mut scratch).unwrap(),
            Offset(1)
        );
        log.sync().unwrap();
        let log = PartitionLog::open(dir.path()).unwrap();
        assert_eq!(
            collect(&log, 0),
            vec![(0, b"kept".to_vec()), (1, b"next".to_vec())]
        );
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
            log.append(&record(i + 1, &[i as u8]), &mut scratch)
                .unwrap();
        }
        log.sync().unwrap();
        log.truncate_from(Offset(2)).unwrap();
        assert_eq!(log.end_offset(), Offset(2));
        drop(log);
        let log = PartitionLog::open(dir.path()).unwrap();
        assert_eq!(collect(&log, 0), vec![(0, vec![0]), (1, vec![1])]);
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        fn payloads() -> impl Strategy<Value = Vec<Vec<u8>>> {
            prop::collection::vec(prop::collection::vec(any::<u8>(), 0..3000), 1..40)
        }

        /// A partition in `dir` holding `records` (transaction ids 1, 2, ...), synced.
        fn filled(dir: &Path, segment_bytes: u64, records: &[Vec<u8>]) -> PartitionLog {
            let mut scratch = Vec::new();
            let mut log = PartitionLog::open_with(dir, segment_bytes).unwrap();
            for (i, p) in records.iter().enumerate() {
                log.append(&record(i as u64 + 1, p), &mut scratch).unwrap();
            }
            log.sync().unwrap();
            log
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

            /// A crash may cut the newest segment anywhere: reopening keeps exactly the
            /// records whose frames are whole, serves nothing torn, and appends go on at the
            /// next offset.
            #[test]
            fn a_cut_anywhere_keeps_the_whole_frames(records in payloads(), cut in any::<prop::sample::Index>()) {
                let dir = tempfile::tempdir().unwrap();
                let mut scratch = Vec::new();
                let mut ends = Vec::new();
                {
                    let mut log = PartitionLog::open_with(dir.path(), u64::MAX).unwrap();
                    let mut end = 0u64;
                    for (i, p) in records.iter().enumerate() {
                        log.append(&record(i as u64 + 1, p), &mut scratch).unwrap();
                        end += (FRAME_HEADER_BYTES + 11 + p.len()) as u64;
                        ends.push(end);
                    }
                    log.sync().unwrap();
                }
                let path = segment_path(dir.path(), Offset(0));
                let total = fs::metadata(&path).unwrap().len();
                prop_assert_eq!(total, *ends.last().unwrap());
                let at = cut.index(total as usize + 1) as u64;
                truncate_file(&path, at).unwrap();
                let whole = ends.iter().filter(|e| **e <= at).count();
                let mut log = PartitionLog::open_with(dir.path(), u64::MAX).unwrap();
                let got = collect(&log, 0);
                prop_assert_eq!(got.len(), whole);
                for (i, (offset, payload)) in got.iter().enumerate() {
                    prop_assert_eq!(*offset, i as u64);
                    prop_assert_eq!(payload, &records[i]);
                }
                prop_assert_eq!(log.append(&record(999, b"after"), &mut scratch).unwrap(), Offset(whole as u64));
            }


            /// Reading from any offset through the sparse index, across rolled segments and
            /// after a reopen, yields exactly the suffix of the log from that offset.
            #[test]
            fn the_offset_index_finds_every_suffix(records in payloads(), segment_bytes in 1u64..20_000, from in 0u64..45) {
                let dir = tempfile::tempdir().unwrap();
                let log = filled(dir.path(), segment_bytes, &records);
                let expected: Vec<(u64, Vec<u8>)> =
                    records.iter().cloned().enumerate().map(|(i, p)| (i as u64, p)).skip(from as usize).collect();
                prop_assert_eq!(&collect(&log, from), &expected);
                drop(log);
                let log = PartitionLog::open_with(dir.path(), segment_bytes).unwrap();
                prop_assert_eq!(log.end_offset(), Offset(records.len() as u64));
                prop_assert_eq!(&collect(&log, from), &expected);
            }

            /// Retention deletes only whole segments, only before the offset still needed (a
            /// checkpoint's), never the one being appended to; offsets stay as they were, a
            /// reader from any kept offset sees exactly what it saw before, and a reopen agrees.
            #[test]
            fn retention_deletes_only_whole_segments_nothing_needs(records in payloads(), segment_bytes in 1u64..20_000, needed in 0u64..45, reader in 0u64..45) {
                let dir = tempfile::tempdir().unwrap();
                let mut log = filled(dir.path(), segment_bytes, &records);
                let bases: Vec<u64> = log.segments.iter().map(|s| s.base.0).collect();
                let last_base = log.segments.last().map(|s| s.base.0);
                let reader = reader.max(needed);
                let before = collect(&log, reader);
                log.delete_segments_before(Offset(needed)).unwrap();
                let start = log.start_offset().0;
                prop_assert!(start <= needed, "nothing needed was deleted");
                prop_assert!(records.is_empty() || bases.contains(&start), "the log starts at a segment boundary");
                prop_assert!(log.segments.last().map(|s| s.base.0) == last_base, "the active segment stays");
                // The kept segments are exactly the old ones from the first one that reaches `needed`.
                let kept: Vec<u64> = log.segments.iter().map(|s| s.base.0).collect();
                prop_assert_eq!(&kept[..], &bases[bases.len() - kept.len()..]);
                prop_assert_eq!(log.end_offset(), Offset(records.len() as u64));
                prop_assert_eq!(&collect(&log, reader), &before);
                let all: Vec<(u64, Vec<u8>)> = records.iter().cloned().enumerate().map(|(i, p)| (i as u64, p)).skip(start as usize).collect();
                prop_assert_eq!(&collect(&log, 0), &all);
                drop(log);
                let log = PartitionLog::open_with(dir.path(), segment_bytes).unwrap();
                prop_assert_eq!(log.start_offset().0, start);
                prop_assert_eq!(log.end_offset(), Offset(records.len() as u64));
                prop_assert_eq!(&collect(&log, reader), &before);
            }
        }
    }
}
