//! A backfill's reader: every input's records in commit order — by (transaction, object,
//! partition), as they were committed — each partition of a table's log read a few records at
//! a time ([`limits::BACKFILL_READ_RECORDS`]), so memory holds a chunk per partition, not the
//! log.

use std::collections::VecDeque;

use eddy_common::{Offset, PartitionId};

use super::*;

pub(super) struct Commits {
    cursors: Vec<Cursor>,
    /// Records in all, for progress.
    pub(super) total: u64,
    /// Keep retention and compaction off the logs until the backfill is done.
    _pins: Vec<BackfillPin>,
}

/// One partition of an input.
struct Cursor {
    object: ObjectId,
    name: String,
    partition: u32,
    buffered: VecDeque<LogRecord>,
    /// Where the rest is: a table's log, from `next` to `end`.
    log: Option<(Arc<eddy_storage::log::LogStore>, SchemaRef)>,
    next: u64,
    end: u64,
}

impl Cursor {
    /// Reads the next chunk when nothing is buffered and the partition has more.
    fn fill(&mut self) -> Result<()> {
        let Some((log, schema)) = &self.log else {
            return Ok(());
        };
        if !self.buffered.is_empty() || self.next >= self.end {
            return Ok(());
        }
        let until = self
            .end
            .min(self.next.saturating_add(limits::BACKFILL_READ_RECORDS));
        let records = log.read_range(
            self.object,
            PartitionId(self.partition),
            Offset(self.next),
            Offset(until),
        )?;
        if records.first().map(|(o, _)| o.0) != Some(self.next) {
            return Err(Error::new(
                SqlState::DATA_CORRUPTED,
                format!(
                    "the log of table {} has no record at offset {} of partition {} (it ended at {} when the view was created)",
                    self.name, self.next, self.partition, self.end
                ),
            ));
        }
        for (_, record) in records {
            self.buffered
                .push_back(LogRecord::decode(&record, self.partition, schema)?);
            self.next += 1;
        }
        Ok(())
    }
}

impl Commits {
    pub(super) fn new(inputs: Vec<Backfill>) -> Commits {
        let mut cursors = Vec::new();
        let mut pins = Vec::new();
        let mut total = 0;
        for input in inputs {
            match input.input {
                BackfillInput::Rows(records) => {
                    total += records.len() as u64;
                    cursors.push(Cursor {
                        object: input.object,
                        name: input.name,
                        partition: 0,
                        buffered: records.into(),
                        log: None,
                        next: 0,
                        end: 0,
                    });
                }
                BackfillInput::Log {
                    log,
                    schema,
                    ranges,
                    pin,
                } => {
                    pins.push(pin);
                    for (partition, start, end) in ranges {
                        total += end.saturating_sub(start);
                        cursors.push(Cursor {
                            object: input.object,
                            name: input.name.clone(),
                            partition,
                            buffered: VecDeque::new(),
                            log: Some((Arc::clone(&log), Arc::clone(&schema))),
                            next: start,
                            end,
                        });
                    }
                }
            }
        }
        Commits {
            cursors,
            total,
            _pins: pins,
        }
    }

    /// The next record in commit order, with the object it belongs to.
    pub(super) fn next(&mut self) -> Result<Option<(ObjectId, LogRecord)>> {
        for cursor in &mut self.cursors {
            cursor.fill()?;
        }
        let first = self
            .cursors
            .iter()
            .enumerate()
            .filter_map(|(i, c)| Some(((c.buffered.front()?.txn, c.object, c.partition), i)))
            .min();
        Ok(first.and_then(|(_, i)| {
            let cursor = &mut self.cursors[i];
            Some((cursor.object, cursor.buffered.pop_front()?))
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int64Array, RecordBatch};
    use arrow::datatypes::{DataType, Field, Schema};
    use eddy_storage::log::{LogStore, Write, encode_changes};

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, false)]))
    }

    fn batch(v: i64) -> ChangeBatch {
        ChangeBatch::inserts(
            RecordBatch::try_new(schema(), vec![Arc::new(Int64Array::from(vec![v]))]).unwrap(),
        )
    }

    /// Two partitions written in alternation, far more records than one read: the reader
    /// yields them in commit order, each once, and stops at the ends taken when it started
    /// (a later commit is not backfilled: the runtime sends it live).
    #[tokio::test]
    async fn commits_come_in_commit_order_a_chunk_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let table = ObjectId(7);
        let log = LogStore::open(dir.path(), &[(table, 2)]).unwrap();
        let n = 5 * limits::BACKFILL_READ_RECORDS as i64;
        for v in 0..n {
            let partition = PartitionId(if v % 3 == 0 { 1 } else { 0 });
            log.commit(vec![Write {
                object: table,
                partition,
                payload: encode_changes(&batch(v)).unwrap(),
            }])
            .await
            .unwrap()
            .unwrap();
        }
        let ranges = (0..2)
            .map(|p| (p, 0, log.end_offset(table, PartitionId(p)).unwrap().0))
            .collect();
        log.commit(vec![Write {
            object: table,
            partition: PartitionId(0),
            payload: encode_changes(&batch(n)).unwrap(),
        }])
        .await
        .unwrap()
        .unwrap();
        let backfilling = Backfilling::default();
        let mut commits = Commits::new(vec![Backfill {
            object: table,
            name: "t".into(),
            clock: None,
            input: BackfillInput::Log {
                log: Arc::clone(&log),
                schema: schema(),
                ranges,
                pin: backfilling.pin(table),
            },
        }]);
        assert_eq!(commits.total, n as u64);
        let mut seen = Vec::new();
        let mut txns = Vec::new();
        while let Some((object, record)) = commits.next().unwrap() {
            assert_eq!(object, table);
            txns.push(record.txn);
            let rows = record.changes[0].rows();
            let values = rows
                .column(0)
                .as_any()
                .downcast_ref::<Int64Array>()
                .unwrap();
            seen.push(values.value(0));
            // Never more than a chunk per partition in memory.
            assert!(
                commits
                    .cursors
                    .iter()
                    .all(|c| c.buffered.len() as u64 <= limits::BACKFILL_READ_RECORDS)
            );
        }
        assert_eq!(seen, (0..n).collect::<Vec<_>>());
        assert!(txns.windows(2).all(|w| w[0] < w[1]));
        assert!(
            backfilling.unless_pinned(table, || Ok(())).is_none(),
            "retention must wait while the backfill reads"
        );
        drop(commits);
        assert!(backfilling.unless_pinned(table, || Ok(())).is_some());
    }
}
