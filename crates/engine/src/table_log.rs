//! An append-only table's rows where they are kept durably: in its log, not in memory.
//!
//! A stream with no retention grows without bound, so its rows are never all held: the table
//! remembers, per log partition, up to which offset its rows are read back from the log, plus
//! a short tail of the latest writes (applied when their commit is queued, before the log has
//! appended them). A tail entry knows the offset its record was promised
//! ([`LogStore::commit_at`]) and leaves the tail once the log has appended that record; a scan
//! freezes the bounds and the tail, then reads the log's records below the bounds in chunks,
//! off the async workers. Records between two tail entries of a partition that are not in the
//! tail carry no rows (watermark marks, a connector's positions), so reading them adds nothing.
//!
//! Retention deletes a partition's oldest segments: a scan reads what the log keeps.

use std::sync::Arc;

use arrow::array::{RecordBatch, RecordBatchOptions};
use arrow::datatypes::SchemaRef;
use datafusion::physical_plan::SendableRecordBatchStream;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use eddy_common::{ChangeBatch, Error, ObjectId, Offset, PartitionId, Result};
use eddy_storage::log::{LogStore, decode_rows};

/// Records read from the log at a time (the partition is locked while they are read).
const READ_RECORDS: u64 = 16;

#[derive(Clone)]
pub(crate) struct LogRows {
    log: Arc<LogStore>,
    object: ObjectId,
    schema: SchemaRef,
    /// Per partition: records below this offset are read from the log.
    bounds: Vec<u64>,
    tail: Vec<Tail>,
    /// Rows held when the table was loaded, plus the rows written since.
    rows: usize,
}

#[derive(Clone)]
struct Tail {
    partition: u32,
    /// The offset the log promised this write; `None` for a transaction's private writes,
    /// which never reach the log as such.
    offset: Option<u64>,
    rows: RecordBatch,
}

impl LogRows {
    /// The table's rows as the log holds them now (its partitions' ends), with `rows` of them.
    pub(crate) fn at_end(
        log: &Arc<LogStore>,
        object: ObjectId,
        partitions: u32,
        schema: SchemaRef,
        rows: usize,
    ) -> Result<LogRows> {
        let bounds = (0..partitions.max(1))
            .map(|p| log.end_offset(object, PartitionId(p)).map(|o| o.0))
            .collect::<Result<Vec<_>>>()?;
        Ok(LogRows {
            log: Arc::clone(log),
            object,
            schema,
            bounds,
            tail: Vec::new(),
            rows,
        })
    }

    pub(crate) fn row_count(&self) -> usize {
        self.rows
    }

    #[cfg(test)]
    pub(crate) fn held_in_memory(&self) -> usize {
        self.tail.iter().map(|t| t.rows.num_rows()).sum()
    }

    pub(crate) fn relabel(&mut self, schema: SchemaRef) -> Result<()> {
        for t in &mut self.tail {
            t.rows = labelled(&schema, &t.rows)?;
        }
        self.schema = schema;
        Ok(())
    }

    /// Adds inserted rows: `parts` as routed to the log's partitions, with the offsets their
    /// records were promised (none: a transaction's private copy).
    pub(crate) fn append(
        &mut self,
        parts: &[(u32, ChangeBatch)],
        offsets: Option<&[Offset]>,
    ) -> Result<()> {
        for (i, (partition, part)) in parts.iter().enumerate() {
            let offset = offsets.and_then(|o| o.get(i)).map(|o| o.0);
            self.rows += part.len();
            if part.is_empty() && offset.is_none() {
                continue;
            }
            self.tail.push(Tail {
                partition: *partition,
                offset,
                rows: labelled(&self.schema, part.rows())?,
            });
        }
        self.evict()
    }

    /// Drops from the tail the writes the log has appended, raising the bounds over them.
    pub(crate) fn evict(&mut self) -> Result<()> {
        if self.tail.iter().all(|t| t.offset.is_none()) {
            return Ok(());
        }
        let ends = (0..self.bounds.len() as u32)
            .map(|p| {
                self.log
                    .end_offset(self.object, PartitionId(p))
                    .map(|o| o.0)
            })
            .collect::<Result<Vec<_>>>()?;
        let bounds = &mut self.bounds;
        self.tail.retain(|t| match t.offset {
            Some(offset) if offset < ends[t.partition as usize] => {
                let bound = &mut bounds[t.partition as usize];
                *bound = (*bound).max(offset + 1);
                false
            }
            _ => true,
        });
        Ok(())
    }

    /// The rows as they are now, frozen.
    pub(crate) fn scan(&mut self) -> Result<Arc<LogScan>> {
        self.evict()?;
        Ok(Arc::new(LogScan {
            log: Arc::clone(&self.log),
            object: self.object,
            schema: Arc::clone(&self.schema),
            bounds: self.bounds.clone(),
            tail: self.tail.iter().map(|t| t.rows.clone()).collect(),
        }))
    }
}

/// An append-only table's rows at one moment: its log's records below `bounds`, then `tail`.
#[derive(Clone)]
pub(crate) struct LogScan {
    log: Arc<LogStore>,
    object: ObjectId,
    schema: SchemaRef,
    bounds: Vec<u64>,
    tail: Vec<RecordBatch>,
}

impl std::fmt::Debug for LogScan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogScan")
            .field("object", &self.object)
            .field("bounds", &self.bounds)
            .field("tail", &self.tail.len())
            .finish()
    }
}

impl LogScan {
    /// Calls `f` with every batch of rows, the columns `projection` picks (all when `None`)
    /// labelled with `target`, in log order per partition then the tail; stops at the first
    /// error `f` returns. Columns not picked are not decoded.
    pub(crate) fn read(
        &self,
        projection: Option<&[usize]>,
        target: &SchemaRef,
        mut f: impl FnMut(RecordBatch) -> Result<()>,
    ) -> Result<()> {
        for (p, &end) in self.bounds.iter().enumerate() {
            let partition = PartitionId(p as u32);
            let mut from = 0;
            while from < end {
                let until = (from + READ_RECORDS).min(end);
                let records =
                    self.log
                        .read_range(self.object, partition, Offset(from), Offset(until))?;
                // Retention may have deleted what came before: the next record read is later.
                from = records.last().map_or(until, |(o, _)| o.0 + 1);
                for (_, record) in records {
                    for rows in decode_rows(&record.payload, &self.schema, projection, target)? {
                        if rows.num_rows() > 0 {
                            f(rows)?;
                        }
                    }
                }
            }
        }
        for rows in &self.tail {
            let rows = match projection {
                Some(p) => rows
                    .project(p)
                    .map_err(|e| Error::internal(format!("project a stream's rows: {e}")))?,
                None => rows.clone(),
            };
            f(labelled(target, &rows)?)?;
        }
        Ok(())
    }

    /// Every row, in memory (for callers that need them all at once).
    pub(crate) fn collect(&self) -> Result<Vec<RecordBatch>> {
        let mut out = Vec::new();
        self.read(None, &self.schema, |b| {
            out.push(b);
            Ok(())
        })?;
        Ok(out)
    }
}

impl eddy_sql::StreamSource for LogScan {
    /// Reads on a blocking thread, a few batches ahead of the consumer; dropping the stream
    /// stops the read at its next batch.
    fn open(&self, projection: Option<&[usize]>, schema: SchemaRef) -> SendableRecordBatchStream {
        let (tx, rx) = tokio::sync::mpsc::channel::<datafusion::error::Result<RecordBatch>>(2);
        let scan = self.clone();
        let target = Arc::clone(&schema);
        let projection = projection.map(<[usize]>::to_vec);
        tokio::task::spawn_blocking(move || {
            let result = scan.read(projection.as_deref(), &target, |batch| {
                tx.blocking_send(Ok(batch))
                    .map_err(|_| Error::internal("the scan's reader went away"))
            });
            if let Err(e) = result {
                let _ = tx.blocking_send(Err(datafusion::error::DataFusionError::External(
                    Box::new(e),
                )));
            }
        });
        let stream = futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        });
        Box::pin(RecordBatchStreamAdapter::new(schema, stream))
    }
}

/// `rows` under `schema`'s column names and nullability (same types).
pub(crate) fn labelled(schema: &SchemaRef, rows: &RecordBatch) -> Result<RecordBatch> {
    let options = RecordBatchOptions::new().with_row_count(Some(rows.num_rows()));
    RecordBatch::try_new_with_options(Arc::clone(schema), rows.columns().to_vec(), &options)
        .map_err(|e| Error::internal(format!("label a stream's rows: {e}")))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use arrow::array::{AsArray, Int32Array, Int64Array};
    use arrow::datatypes::{Int32Type, Int64Type};
    use eddy_storage::log::{Write, encode_changes, encode_watermark};
    use proptest::prelude::*;

    use super::*;
    use crate::catalog::TableDef;
    use crate::table::TableData;

    const PARTITIONS: u32 = 3;

    fn def() -> TableDef {
        crate::table_tests::kv_def(false, true, PARTITIONS)
    }

    fn inserts(schema: &SchemaRef, rows: &[(i32, i64)]) -> ChangeBatch {
        ChangeBatch::inserts(
            RecordBatch::try_new(
                Arc::clone(schema),
                vec![
                    Arc::new(Int32Array::from_iter_values(rows.iter().map(|r| r.0))),
                    Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.1))),
                ],
            )
            .unwrap(),
        )
    }

    fn contents(data: &mut TableData) -> BTreeMap<(i32, i64), usize> {
        let mut out = BTreeMap::new();
        for batch in data.snapshot().unwrap().iter() {
            let k = batch.column(0).as_primitive::<Int32Type>();
            let v = batch.column(1).as_primitive::<Int64Type>();
            for i in 0..batch.num_rows() {
                *out.entry((k.value(i), v.value(i))).or_default() += 1;
            }
        }
        out
    }

    fn held(data: &TableData) -> usize {
        data.held_in_memory()
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 24, failure_persistence: None, ..ProptestConfig::default() })]

        /// Commits to random partitions, some still queued when the table is read, watermark
        /// marks in between, a transaction's private copy: every read holds exactly the rows
        /// applied, once; once the log has everything, memory holds none of them; a restart
        /// reads the same rows.
        #[test]
        fn an_append_only_table_reads_its_rows_back_from_its_log(
            ops in prop::collection::vec((0..PARTITIONS, prop::collection::vec((0..50i32, 0..5i64), 0..20), prop::bool::weighted(0.3), prop::bool::weighted(0.2)), 1..30)
        ) {
            let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let dir = tempfile::tempdir().unwrap();
            let def = def();
            let schema = def.schema().unwrap();
            let log = LogStore::open(dir.path(), &[(def.id, PARTITIONS)]).unwrap();
            let mut data = TableData::logged(&def, Arc::clone(&schema), &log, 0).unwrap();
            let mut model: BTreeMap<(i32, i64), usize> = BTreeMap::new();
            let mut queued = Vec::new();
            for (partition, rows, mark, wait) in &ops {
                if *mark {
                    queued.push(log.commit(vec![Write { object: def.id, partition: PartitionId(0), payload: encode_watermark(&schema, 1).unwrap() }]));
                }
                let change = inserts(&schema, rows);
                let parts = vec![(*partition, change.clone())];
                let (ticket, offsets) = log.commit_at(vec![Write { object: def.id, partition: PartitionId(*partition), payload: encode_changes(&change).unwrap() }]);
                queued.push(ticket);
                data.apply_committed(std::slice::from_ref(&change), &parts, &offsets).unwrap();
                for r in rows {
                    *model.entry(*r).or_default() += 1;
                }
                if *wait {
                    for t in queued.drain(..) {
                        runtime.block_on(t).unwrap().unwrap();
                    }
                }
                prop_assert_eq!(&contents(&mut data), &model);
            }
            // A transaction's private copy sees its own rows; the table does not.
            let mut fork = data.fork().unwrap();
            fork.apply(&[inserts(&schema, &[(99, 99)])]).unwrap();
            let mut forked = model.clone();
            forked.insert((99, 99), 1);
            prop_assert_eq!(contents(&mut fork), forked);
            for t in queued.drain(..) {
                runtime.block_on(t).unwrap().unwrap();
            }
            prop_assert_eq!(&contents(&mut data), &model);
            prop_assert_eq!(held(&data), 0, "rows the log has are not held in memory");
            prop_assert_eq!(data.row_count(), model.values().sum::<usize>());
            let (mut reloaded, _) = crate::load_contents(&log, &def, &schema).unwrap();
            prop_assert_eq!(contents(&mut reloaded), model);
            log.shutdown();
        }
    }
}
