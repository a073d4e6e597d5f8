//! The file sink: a view's changes as JSON lines, one file per range of epochs.
//!
//! Each line is one changed row: the view's columns plus `eddy_epoch` (the epoch it changed in)
//! and `eddy_weight` (how many copies came, negative when they left); summing the weights per
//! row over every file gives the view. Lines go to `.<sink>-<seq>.jsonl.tmp` in the sink's
//! directory; rolling the file fsyncs it and renames it to `<sink>-<seq>-<first>-<last>.jsonl`
//! (sequence number, first and last epoch), so a reader only ever sees whole files, in sequence
//! order. When the engine hands whole contents instead of changes, the sink reads its files
//! back and writes only the difference to the view. When to roll and what was committed is the
//! engine's part (`engine/src/sink.rs`).

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::{Int64Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema};
use eddy_common::{ChangeBatch, Error, Result, SqlState};
use serde_json::Value;

use super::{json_lines, split_lines};

/// Where the sink writes: the options of `CREATE SINK ... WITH (connector = 'file', ...)`.
#[derive(Debug, Clone)]
pub struct FileTarget {
    pub dir: PathBuf,
    /// How long a file stays open before it is rolled (`rollover_seconds`, default 10).
    pub rollover: Duration,
}

impl FileTarget {
    pub fn from_options(option: impl Fn(&str) -> Option<String>) -> Result<FileTarget> {
        let dir = option("path").ok_or_else(|| {
            Error::invalid_parameter("a file sink needs the option path (a directory)")
        })?;
        let rollover = match option("rollover_seconds") {
            Some(s) => match s.trim().parse::<f64>() {
                Ok(v) if v > 0.0 && v.is_finite() => Duration::from_secs_f64(v),
                _ => {
                    return Err(Error::invalid_parameter(format!(
                        "rollover_seconds must be a positive number of seconds, not '{s}'"
                    )));
                }
            },
            None => Duration::from_secs(10),
        };
        Ok(FileTarget {
            dir: PathBuf::from(dir),
            rollover,
        })
    }
}

fn io_error(context: &str, path: &Path, e: std::io::Error) -> Error {
    Error::new(
        SqlState::IO_ERROR,
        format!("file sink: {context} {}: {e}", path.display()),
    )
}

struct OpenFile {
    file: File,
    tmp: PathBuf,
    seq: u64,
    first: u64,
    last: u64,
    len: u64,
    opened: Instant,
}

pub struct FileSink {
    name: String,
    target: FileTarget,
    next_seq: u64,
    open: Option<OpenFile>,
}

/// The weight and epoch columns each line carries besides the view's.
const WEIGHT: &str = "eddy_weight";
const EPOCH: &str = "eddy_epoch";

impl FileSink {
    pub fn new(name: String, target: FileTarget) -> FileSink {
        FileSink {
            name,
            target,
            next_seq: 1,
            open: None,
        }
    }

    pub fn target(&self) -> &FileTarget {
        &self.target
    }

    /// Creates the directory, deletes this sink's unfinished temporary files and finds the
    /// next sequence number.
    pub fn prepare(&mut self) -> Result<()> {
        fs::create_dir_all(&self.target.dir)
            .map_err(|e| io_error("creating", &self.target.dir, e))?;
        let tmp_prefix = format!(".{}-", self.name);
        for entry in
            fs::read_dir(&self.target.dir).map_err(|e| io_error("listing", &self.target.dir, e))?
        {
            let entry = entry.map_err(|e| io_error("listing", &self.target.dir, e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with(&tmp_prefix) && name.ends_with(".jsonl.tmp") {
                fs::remove_file(entry.path())
                    .map_err(|e| io_error("deleting", &entry.path(), e))?;
            }
        }
        self.next_seq = self.files()?.last().map_or(1, |(seq, _)| seq + 1);
        self.open = None;
        Ok(())
    }

    /// This sink's committed files, in sequence order.
    pub fn files(&self) -> Result<Vec<(u64, PathBuf)>> {
        let mut out = Vec::new();
        for entry in
            fs::read_dir(&self.target.dir).map_err(|e| io_error("listing", &self.target.dir, e))?
        {
            let entry = entry.map_err(|e| io_error("listing", &self.target.dir, e))?;
            if let Some(seq) = self.sequence_of(&entry.file_name().to_string_lossy()) {
                out.push((seq, entry.path()));
            }
        }
        out.sort();
        Ok(out)
    }

    /// The sequence number of a committed file of this sink named `file`.
    fn sequence_of(&self, file: &str) -> Option<u64> {
        let rest = file
            .strip_prefix(&self.name)?
            .strip_prefix('-')?
            .strip_suffix(".jsonl")?;
        let mut parts = rest.split('-');
        let seq = parts.next()?.parse().ok()?;
        let (_first, _last): (u64, u64) =
            (parts.next()?.parse().ok()?, parts.next()?.parse().ok()?);
        parts.next().is_none().then_some(seq)
    }

    /// Whether a committed file of that name exists.
    pub fn committed(&self, file: &str) -> bool {
        self.sequence_of(file).is_some() && self.target.dir.join(file).is_file()
    }

    /// When the open file was opened (`None`: none is open).
    pub fn opened_at(&self) -> Option<Instant> {
        self.open.as_ref().map(|o| o.opened)
    }

    /// Appends an epoch's changes to the open file (opening one). A failed write leaves the
    /// file as it was, so writing the same changes again is safe.
    pub fn append(&mut self, epoch: u64, changes: &ChangeBatch) -> Result<()> {
        let rows = changes.rows();
        let mut fields: Vec<Arc<Field>> = rows.schema().fields().iter().cloned().collect();
        fields.push(Arc::new(Field::new(EPOCH, DataType::Int64, false)));
        fields.push(Arc::new(Field::new(WEIGHT, DataType::Int64, false)));
        let mut columns = rows.columns().to_vec();
        columns.push(Arc::new(Int64Array::from_value(
            epoch as i64,
            rows.num_rows(),
        )));
        columns.push(Arc::new(changes.diffs().clone()));
        let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
            .map_err(|e| Error::internal(format!("file sink: {e}")))?;
        let lines = json_lines(&batch)?;
        self.write_lines(epoch, &lines)
    }

    fn write_lines(&mut self, epoch: u64, lines: &[u8]) -> Result<()> {
        if lines.is_empty() {
            return Ok(());
        }
        if self.open.is_none() {
            let tmp = self
                .target
                .dir
                .join(format!(".{}-{:010}.jsonl.tmp", self.name, self.next_seq));
            let file = OpenOptions::new()
                .create(true)
                .write(true)
                .truncate(true)
                .open(&tmp)
                .map_err(|e| io_error("creating", &tmp, e))?;
            self.open = Some(OpenFile {
                file,
                tmp,
                seq: self.next_seq,
                first: epoch,
                last: epoch,
                len: 0,
                opened: Instant::now(),
            });
        }
        let Some(open) = self.open.as_mut() else {
            return Ok(());
        };
        if let Err(e) = open.file.write_all(lines) {
            // Cut off what part of the lines made it, so that a retry does not repeat them.
            let _ = open.file.set_len(open.len);
            let _ = std::io::Seek::seek(&mut open.file, std::io::SeekFrom::Start(open.len));
            return Err(io_error("writing", &open.tmp, e));
        }
        open.len += lines.len() as u64;
        open.last = epoch;
        Ok(())
    }

    /// The name the open file gets when it is committed (`None`: nothing is open).
    pub fn pending_name(&self) -> Option<String> {
        self.open
            .as_ref()
            .map(|o| format!("{}-{:010}-{}-{}.jsonl", self.name, o.seq, o.first, o.last))
    }

    /// Makes the open file durable and visible under its final name.
    pub fn commit(&mut self) -> Result<()> {
        let (Some(open), Some(name)) = (self.open.as_ref(), self.pending_name()) else {
            return Ok(());
        };
        open.file
            .sync_all()
            .map_err(|e| io_error("syncing", &open.tmp, e))?;
        let path = self.target.dir.join(name);
        fs::rename(&open.tmp, &path).map_err(|e| io_error("renaming", &open.tmp, e))?;
        File::open(&self.target.dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| io_error("syncing", &self.target.dir, e))?;
        self.next_seq = open.seq + 1;
        self.open = None;
        Ok(())
    }

    /// Writes (to the open file) what makes the files, summed, equal to `contents` (rows with
    /// their multiplicity as weights): the difference to what the files hold now.
    pub fn reconcile(&mut self, epoch: u64, contents: Option<&ChangeBatch>) -> Result<()> {
        let mut held = self.read_back()?;
        let mut lines = Vec::new();
        if let Some(contents) = contents {
            let rows = json_lines(contents.rows())?;
            let mut keep = Vec::new();
            let mut weights = Vec::new();
            for (i, (row, wanted)) in split_lines(&rows)
                .zip(contents.diffs().values())
                .enumerate()
            {
                let row: Value = serde_json::from_slice(row)
                    .map_err(|e| Error::internal(format!("file sink: {e}")))?;
                let have = held.remove(&row.to_string()).map_or(0, |(_, w)| w);
                if have != *wanted {
                    keep.push(i as u64);
                    weights.push(wanted - have);
                }
            }
            if !keep.is_empty() {
                let indices = arrow::array::UInt64Array::from(keep);
                let rows = arrow::compute::take_record_batch(contents.rows(), &indices)
                    .map_err(|e| Error::internal(format!("file sink: {e}")))?;
                let changes = ChangeBatch::new(rows, Int64Array::from(weights));
                self.append(epoch, &changes)?;
            }
        }
        // Rows the files hold that the view does not: take them back.
        let mut gone: Vec<(String, (Value, i64))> = held.into_iter().collect();
        gone.sort_by(|a, b| a.0.cmp(&b.0));
        for (_, (mut row, weight)) in gone {
            if let Value::Object(map) = &mut row {
                map.insert(EPOCH.into(), Value::from(epoch));
                map.insert(WEIGHT.into(), Value::from(-weight));
            }
            lines.extend_from_slice(row.to_string().as_bytes());
            lines.push(b'\n');
        }
        self.write_lines(epoch, &lines)
    }

    /// Every row the files (committed and open) hold with a weight other than zero: by its
    /// JSON text without the epoch and weight, the row and its summed weight.
    fn read_back(&self) -> Result<HashMap<String, (Value, i64)>> {
        let mut paths: Vec<PathBuf> = self.files()?.into_iter().map(|(_, p)| p).collect();
        paths.extend(self.open.as_ref().map(|o| o.tmp.clone()));
        let mut held: HashMap<String, (Value, i64)> = HashMap::new();
        for path in paths {
            let file = File::open(&path).map_err(|e| io_error("opening", &path, e))?;
            for line in BufReader::new(file).lines() {
                let line = line.map_err(|e| io_error("reading", &path, e))?;
                if line.is_empty() {
                    continue;
                }
                let Ok(Value::Object(mut row)) = serde_json::from_str::<Value>(&line) else {
                    return Err(Error::new(
                        SqlState::DATA_CORRUPTED,
                        format!(
                            "file sink: a line of {} is not a JSON object",
                            path.display()
                        ),
                    ));
                };
                let weight = row.remove(WEIGHT).and_then(|w| w.as_i64()).unwrap_or(0);
                row.remove(EPOCH);
                let row = Value::Object(row);
                let entry = held.entry(row.to_string()).or_insert((row, 0));
                entry.1 += weight;
            }
        }
        held.retain(|_, (_, w)| *w != 0);
        Ok(held)
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::StringArray;

    use super::*;

    fn changes(rows: &[(&str, i64)]) -> ChangeBatch {
        let schema = Arc::new(Schema::new(vec![Field::new("s", DataType::Utf8, true)]));
        let batch = RecordBatch::try_new(
            schema,
            vec![Arc::new(StringArray::from_iter_values(
                rows.iter().map(|r| r.0),
            ))],
        )
        .unwrap();
        ChangeBatch::new(
            batch,
            Int64Array::from_iter_values(rows.iter().map(|r| r.1)),
        )
    }

    fn sink(dir: &Path) -> FileSink {
        let mut s = FileSink::new(
            "out".into(),
            FileTarget {
                dir: dir.to_owned(),
                rollover: Duration::from_secs(1),
            },
        );
        s.prepare().unwrap();
        s
    }

    fn summed(s: &FileSink) -> Vec<(String, i64)> {
        let mut out: Vec<(String, i64)> = s
            .read_back()
            .unwrap()
            .into_values()
            .map(|(v, w)| (v["s"].as_str().unwrap().to_owned(), w))
            .collect();
        out.sort();
        out
    }

    #[test]
    fn files_are_renamed_whole_and_numbered_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = sink(dir.path());
        s.append(3, &changes(&[("a", 1), ("b", 2)])).unwrap();
        s.append(4, &changes(&[("b", -1)])).unwrap();
        assert_eq!(
            s.pending_name().as_deref(),
            Some("out-0000000001-3-4.jsonl")
        );
        assert!(
            s.files().unwrap().is_empty(),
            "nothing is visible before the commit"
        );
        s.commit().unwrap();
        assert!(s.committed("out-0000000001-3-4.jsonl"));
        s.append(5, &changes(&[("c", 1)])).unwrap();
        // A restart drops the open file and goes on after the last committed one.
        let mut s = sink(dir.path());
        assert_eq!(summed(&s), vec![("a".into(), 1), ("b".into(), 1)]);
        s.append(9, &changes(&[("d", 1)])).unwrap();
        assert_eq!(
            s.pending_name().as_deref(),
            Some("out-0000000002-9-9.jsonl")
        );
        let text = fs::read_to_string(dir.path().join("out-0000000001-3-4.jsonl")).unwrap();
        assert_eq!(
            text,
            "{\"s\":\"a\",\"eddy_epoch\":3,\"eddy_weight\":1}\n{\"s\":\"b\",\"eddy_epoch\":3,\"eddy_weight\":2}\n{\"s\":\"b\",\"eddy_epoch\":4,\"eddy_weight\":-1}\n"
        );
    }

    #[test]
    fn reconciling_writes_only_the_difference() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = sink(dir.path());
        s.append(1, &changes(&[("a", 1), ("b", 2), ("gone", 1)]))
            .unwrap();
        s.commit().unwrap();
        s.append(2, &changes(&[("b", -1)])).unwrap();
        // Open and committed files both count; the view now holds a ×1, b ×3, c ×1.
        s.reconcile(3, Some(&changes(&[("a", 1), ("b", 3), ("c", 1)])))
            .unwrap();
        assert_eq!(
            summed(&s),
            vec![("a".into(), 1), ("b".into(), 3), ("c".into(), 1)]
        );
        s.commit().unwrap();
        let before = s.files().unwrap().len();
        // Reconciling again writes nothing.
        s.reconcile(4, Some(&changes(&[("a", 1), ("b", 3), ("c", 1)])))
            .unwrap();
        assert_eq!(s.pending_name(), None);
        assert_eq!(s.files().unwrap().len(), before);
        s.reconcile(5, None).unwrap();
        assert_eq!(summed(&s), vec![]);
    }
}
