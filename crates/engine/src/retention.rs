//! Retention: an APPEND ONLY table with `retention` (time) or `retention.bytes` (per
//! partition) drops the oldest whole segments of its log past those limits — but never one that
//! a materialized view may still have to read after a restart, i.e. nothing at or after the
//! offsets that the newest checkpoint records for the views reading the table (and nothing at
//! all while a view reading it is in no checkpoint yet). The table's contents then hold the rows
//! of the segments kept; views keep what they computed from the rows dropped (an aggregate
//! still counts them), and a view created later is built from what the log keeps (it says so
//! with a NOTICE).
//!
//! Compaction: a table with a PRIMARY KEY rewrites the sealed segments of its log that no
//! checkpoint needs so that each record keeps only the rows still live at the end of them (the
//! last insert of each key not deleted since); retractions and deletes ("tombstones") vanish.
//! Offsets, transaction ids and connector positions stay; replaying the compacted prefix gives
//! the table exactly as it was at its end, and everything after it is untouched.

use std::collections::HashMap as StdHashMap;
use std::sync::Arc;

/// Keys and rows hash with foldhash: Eddy's own encodings, one per row compacted.
type HashMap<K, V> = StdHashMap<K, V, foldhash::fast::RandomState>;
use std::time::{Duration, SystemTime};

use arrow::array::{ArrayRef, AsArray, UInt32Array};
use arrow::compute::take_record_batch;
use arrow::row::{RowConverter, SortField};
use eddy_common::{ChangeBatch, Error, ObjectId, Offset, PartitionId, Result};
use eddy_storage::log::{
    LogStore, Record, SealedSegment, decode_changes, decode_positions, encode_changes_at,
};

use arrow::datatypes::SchemaRef;

use crate::catalog::TableDef;
use crate::{Engine, Table, checkpoint, concat_changes};

/// How often retention runs in the background (also after every `CHECKPOINT`).
pub const RETENTION_INTERVAL: Duration = Duration::from_secs(10);

impl Engine {
    /// Applies every table's retention, and compacts keyed tables' logs (`all`: every
    /// prefix that grew, as `CHECKPOINT` does; otherwise only those grown by half what their
    /// last compaction left, [`worth_compacting`]); returns how many segments were deleted or
    /// rewritten.
    pub(crate) async fn enforce_retention(&self, all: bool) -> Result<usize> {
        // One run at a time (the background tick and CHECKPOINT statements).
        let mut compacted = self.compacted.lock().await;
        let reads = checkpoint::latest_reads(&self.meta)?;
        let mut done = 0;
        // A table a backfill is reading is left alone until the next run.
        for table in self
            .tables()
            .into_iter()
            .filter(|t| !t.def.primary_key.is_empty())
        {
            let compact = || self.compact(&table, &reads, &mut compacted, all);
            done += self
                .backfilling
                .unless_pinned(table.def.id, compact)
                .transpose()?
                .unwrap_or(0);
        }
        let tables: Vec<Arc<Table>> = self
            .tables()
            .into_iter()
            .filter(|t| {
                t.def.append_only
                    && t.def
                        .option("retention")
                        .or(t.def.option("retention.bytes"))
                        .is_some()
            })
            .collect();
        if tables.is_empty() {
            return Ok(done);
        }
        let mut deleted = 0;
        for table in tables {
            let readers: Vec<ObjectId> = self
                .views
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .values()
                .filter(|v| v.def.dependencies.contains(&table.def.id))
                .map(|v| v.def.id)
                .collect();
            let (time, bytes) = table.def.retention()?;
            let mut trimmed = 0;
            for p in 0..table.def.partitions {
                let needed = needed_offset(&readers, &reads, table.def.id, p);
                let cut = policy_cut(
                    &self.log.sealed_segments(table.def.id, PartitionId(p))?,
                    time,
                    bytes,
                    self.clock.now_system(),
                )
                .min(needed);
                let delete = || {
                    self.log
                        .delete_segments_before(table.def.id, PartitionId(p), Offset(cut))
                };
                trimmed += self
                    .backfilling
                    .unless_pinned(table.def.id, delete)
                    .transpose()?
                    .unwrap_or(0);
            }
            if trimmed > 0 {
                // Its rows are read from the log (`table_log`), which no longer has these.
                tracing::info!(table = %table.def.name, segments = trimmed, "retention deleted old log segments");
                deleted += trimmed;
            }
        }
        Ok(deleted + done)
    }

    fn readers_of(&self, table: ObjectId) -> Vec<ObjectId> {
        self.views
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .filter(|v| v.def.dependencies.contains(&table))
            .map(|v| v.def.id)
            .collect()
    }

    /// Compacts the sealed segments of a keyed table's partitions that lie before what the
    /// newest checkpoint needs, when new ones got there since the last compaction (`all`) or
    /// enough of them ([`worth_compacting`]).
    fn compact(
        &self,
        table: &Table,
        reads: &StdHashMap<ObjectId, Vec<(ObjectId, u32, u64)>>,
        compacted: &mut StdHashMap<(ObjectId, u32), u64>,
        all: bool,
    ) -> Result<usize> {
        let readers = self.readers_of(table.def.id);
        let mut rewritten = 0;
        for p in 0..table.def.partitions {
            let needed = needed_offset(&readers, reads, table.def.id, p);
            let sealed = self.log.sealed_segments(table.def.id, PartitionId(p))?;
            let prefix: Vec<&SealedSegment> =
                sealed.iter().take_while(|s| s.end.0 <= needed).collect();
            let Some(last) = prefix.last() else { continue };
            let done = compacted.get(&(table.def.id, p)).copied();
            if done.is_some_and(|done| done >= last.end.0)
                || !(all || worth_compacting(&prefix, done))
            {
                continue;
            }
            rewritten += compact_partition(&self.log, &table.def, &table.schema, p, &prefix)?;
            compacted.insert((table.def.id, p), last.end.0);
        }
        if rewritten > 0 {
            tracing::info!(table = %table.def.name, segments = rewritten, "compacted the log to the last row of each key");
        }
        Ok(rewritten)
    }
}

/// Whether a partition's compactable prefix (`prefix`, compacted up to offset `done`) has
/// grown by at least half the bytes its compacted part holds. A compaction reads the whole
/// prefix again (the rows live at its end depend on all of it), so compacting at every new
/// segment would read the table once per segment; past a ratio, the bytes read stay within a
/// small multiple of the bytes written, and the log holds at most 1.5 times its compacted size
/// plus the tail a checkpoint still needs.
fn worth_compacting(prefix: &[&SealedSegment], done: Option<u64>) -> bool {
    let Some(done) = done else {
        return true;
    };
    let (old, new) = prefix.iter().fold((0, 0), |(old, new), s| {
        if s.end.0 <= done {
            (old + s.bytes, new)
        } else {
            (old, new + s.bytes)
        }
    });
    new * 2 >= old
}

/// Rewrites `segments` (the oldest of a partition, contiguous) so that they keep only the rows
/// live at their end; returns how many changed.
fn compact_partition(
    log: &LogStore,
    def: &TableDef,
    schema: &SchemaRef,
    partition: u32,
    segments: &[&SealedSegment],
) -> Result<usize> {
    let (Some(first), Some(last)) = (segments.first(), segments.last()) else {
        return Ok(0);
    };
    let key_fields = def
        .primary_key
        .iter()
        .map(|k| SortField::new(schema.field(*k).data_type().clone()))
        .collect();
    let converter =
        RowConverter::new(key_fields).map_err(|e| Error::internal(format!("compaction: {e}")))?;
    let whole = RowConverter::new(
        schema
            .fields()
            .iter()
            .map(|f| SortField::new(f.data_type().clone()))
            .collect(),
    )
    .map_err(|e| Error::internal(format!("compaction: {e}")))?;
    // The records, decoded, with their rows' keys and whole rows encoded; then which (record,
    // row) holds each key's live row at the end (a retraction removes it only if it names that
    // very row).
    let mut records: Vec<(Record, ChangeBatch)> = Vec::new();
    let mut encoded: Vec<(arrow::row::Rows, arrow::row::Rows)> = Vec::new();
    log.scan(
        def.id,
        PartitionId(partition),
        first.start,
        |offset, record| {
            if offset >= last.end {
                return Ok(());
            }
            let batches = decode_changes(&record.payload, schema)?;
            let changes = match batches.len() {
                1 => batches
                    .into_iter()
                    .next()
                    .ok_or_else(|| Error::internal("a decoded batch vanished"))?,
                _ => concat_changes(schema, &batches)?,
            };
            let keys: Vec<ArrayRef> = def
                .primary_key
                .iter()
                .map(|k| Arc::clone(changes.rows().column(*k)))
                .collect();
            let keys = converter
                .convert_columns(&keys)
                .map_err(|e| Error::internal(format!("compaction: {e}")))?;
            let rows = whole
                .convert_columns(changes.rows().columns())
                .map_err(|e| Error::internal(format!("compaction: {e}")))?;
            encoded.push((keys, rows));
            records.push((record, changes));
            Ok(())
        },
    )?;
    let total = records.iter().map(|(_, c)| c.len()).sum();
    let mut live: HashMap<&[u8], (usize, usize)> =
        HashMap::with_capacity_and_hasher(total, Default::default());
    for (at, ((_, changes), (keys, rows))) in records.iter().zip(&encoded).enumerate() {
        for (i, d) in changes.diffs().values().iter().enumerate() {
            let key = keys.row(i).data();
            if *d > 0 {
                live.insert(key, (at, i));
            } else if live
                .get(key)
                .is_some_and(|&(r, j)| encoded[r].1.row(j).data() == rows.row(i).data())
            {
                live.remove(key);
            }
        }
    }
    let mut keep: Vec<Vec<u32>> = vec![Vec::new(); records.len()];
    for (r, i) in live.into_values() {
        keep[r].push(i as u32);
    }
    let mut rewritten = 0;
    let mut at = 0;
    for segment in segments {
        let n = (segment.end.0 - segment.start.0) as usize;
        let slice = &mut records[at..at + n];
        let kept = &mut keep[at..at + n];
        at += n;
        if slice
            .iter()
            .zip(kept.iter())
            .all(|((_, c), k)| k.len() == c.len() && c.diffs().values().iter().all(|d| *d > 0))
        {
            continue; // nothing in this segment is superseded
        }
        let mut new = Vec::with_capacity(n);
        for ((record, changes), kept) in slice.iter().zip(kept.iter_mut()) {
            kept.sort_unstable();
            let rows = take_record_batch(changes.rows(), &UInt32Array::from(kept.clone()))
                .map_err(|e| Error::internal(format!("compaction: {e}")))?;
            let diffs =
                arrow::compute::take(changes.diffs(), &UInt32Array::from(kept.clone()), None)
                    .map_err(|e| Error::internal(format!("compaction: {e}")))?;
            let kept_changes = ChangeBatch::new(
                rows,
                diffs.as_primitive::<arrow::datatypes::Int64Type>().clone(),
            );
            let payload = encode_changes_at(&kept_changes, &decode_positions(&record.payload)?)?;
            new.push(Record {
                txn_id: record.txn_id,
                participants: record.participants.clone(),
                payload,
            });
        }
        log.rewrite_segment(def.id, PartitionId(partition), segment.start, &new)?;
        rewritten += 1;
    }
    Ok(rewritten)
}

/// The oldest offset of table partition (table, p) that a view reading the table may read
/// again after a restart: what the newest checkpoint says it had read (0 when it is not in it).
fn needed_offset(
    readers: &[ObjectId],
    reads: &StdHashMap<ObjectId, Vec<(ObjectId, u32, u64)>>,
    table: ObjectId,
    p: u32,
) -> u64 {
    readers
        .iter()
        .map(|v| {
            reads
                .get(v)
                .and_then(|r| r.iter().find(|(o, q, _)| *o == table && *q == p))
                .map_or(0, |(_, _, n)| *n)
        })
        .min()
        .unwrap_or(u64::MAX)
}

/// The offset before which the policy lets segments go: the end of the longest prefix of
/// sealed segments older than `time` (µs) or beyond the newest `bytes`.
fn policy_cut(
    sealed: &[SealedSegment],
    time: Option<i64>,
    bytes: Option<u64>,
    now: SystemTime,
) -> u64 {
    let Some(first) = sealed.first() else {
        return 0;
    };
    let old = |s: &SealedSegment| {
        time.is_some_and(|t| {
            s.modified
                .and_then(|m| now.duration_since(m).ok())
                .is_some_and(|age| age.as_micros() as i64 > t)
        })
    };
    let by_time = sealed.iter().take_while(|s| old(s)).count();
    let by_bytes = match bytes {
        Some(limit) => {
            // Drop the oldest while the sealed segments after them still hold more than `limit`.
            let mut total: u64 = sealed.iter().map(|s| s.bytes).sum();
            sealed
                .iter()
                .take_while(|s| {
                    let over = total > limit;
                    total -= s.bytes;
                    over
                })
                .count()
        }
        None => 0,
    };
    match by_time.max(by_bytes) {
        0 => first.start.0,
        n => sealed[n - 1].end.0,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use arrow::array::{Int32Array, Int64Array, RecordBatch};
    use eddy_storage::log::Write;
    use proptest::prelude::*;

    use super::*;
    use crate::load_contents;

    fn def() -> TableDef {
        crate::table_tests::kv_def(true, false, 1)
    }

    /// The background compacts a prefix again once its new segments hold half the bytes its
    /// last compaction left; a prefix never compacted, at once.
    #[test]
    fn a_prefix_is_compacted_again_once_it_grew_by_half() {
        let segment = |start: u64, end: u64, bytes: u64| SealedSegment {
            start: Offset(start),
            end: Offset(end),
            bytes,
            modified: None,
        };
        let (a, b, c) = (
            segment(0, 10, 1000),
            segment(10, 20, 300),
            segment(20, 30, 250),
        );
        assert!(worth_compacting(&[&a], None));
        // Compacted up to 10 (1000 bytes left): 300 new bytes are not enough, 550 are.
        assert!(!worth_compacting(&[&a, &b], Some(10)));
        assert!(worth_compacting(&[&a, &b, &c], Some(10)));
        // Compacted up to 20: 250 new bytes next to 1300.
        assert!(!worth_compacting(&[&a, &b, &c], Some(20)));
    }

    /// A record: (offset, its changes as (k, v, diff)).
    type Record = (u64, Vec<(i32, i64, i64)>);

    /// Every record of the partition.
    fn records(log: &LogStore, schema: &SchemaRef) -> Vec<Record> {
        let mut out = Vec::new();
        log.scan(ObjectId(7), PartitionId(0), Offset(0), |offset, record| {
            let mut rows = Vec::new();
            for c in decode_changes(&record.payload, schema)? {
                let (k, v) = (
                    c.rows()
                        .column(0)
                        .as_primitive::<arrow::datatypes::Int32Type>(),
                    c.rows()
                        .column(1)
                        .as_primitive::<arrow::datatypes::Int64Type>(),
                );
                for i in 0..c.len() {
                    rows.push((k.value(i), v.value(i), c.diffs().value(i)));
                }
            }
            out.push((offset.0, rows));
            Ok(())
        })
        .unwrap();
        out
    }

    fn apply(state: &mut BTreeMap<i32, i64>, rows: &[(i32, i64, i64)]) {
        for (k, v, d) in rows {
            if *d > 0 {
                state.insert(*k, *v);
            } else if state.get(k) == Some(v) {
                state.remove(k);
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, failure_persistence: None, ..ProptestConfig::default() })]

        /// Upserts and deletes of a few keys, a compaction of the segments before a random
        /// offset: the compacted prefix holds exactly each key's last row live at its end (no
        /// retraction, no deleted key), offsets and everything after the prefix are unchanged,
        /// and replaying the whole log gives the same table. A record may carry a key's new row
        /// before the retraction of its old one.
        #[test]
        fn compaction_keeps_exactly_the_last_row_of_each_key(ops in prop::collection::vec((0..6i32, any::<bool>(), any::<bool>()), 1..120), cut in 0u64..130, segment_bytes in 200u64..2000) {
            let dir = tempfile::tempdir().unwrap();
            let def = def();
            let schema = def.schema().unwrap();
            let log = LogStore::open_with(dir.path(), &[(def.id, 1)], segment_bytes).unwrap();
            let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let mut state: BTreeMap<i32, i64> = BTreeMap::new();
            for (n, (k, upsert, new_first)) in ops.iter().enumerate() {
                // One record per op: the retraction of the key's current row and the new row,
                // in either order.
                let mut rows: Vec<(i32, i64, i64)> = state.get(k).map(|v| vec![(*k, *v, -1)]).unwrap_or_default();
                if *upsert {
                    rows.push((*k, n as i64, 1));
                }
                if *new_first {
                    rows.reverse();
                }
                if rows.is_empty() {
                    continue;
                }
                apply(&mut state, &rows);
                let batch = RecordBatch::try_new(Arc::clone(&schema), vec![
                    Arc::new(Int32Array::from_iter_values(rows.iter().map(|r| r.0))),
                    Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.1))),
                ]).unwrap();
                let changes = ChangeBatch::new(batch, Int64Array::from_iter_values(rows.iter().map(|r| r.2)));
                let payload = encode_changes_at(&changes, &[]).unwrap();
                runtime.block_on(log.commit(vec![Write { object: def.id, partition: PartitionId(0), payload }])).unwrap().unwrap();
            }
            let before = records(&log, &schema);
            let sealed = log.sealed_segments(def.id, PartitionId(0)).unwrap();
            let prefix: Vec<&SealedSegment> = sealed.iter().take_while(|s| s.end.0 <= cut).collect();
            let end = prefix.last().map_or(0, |s| s.end.0);
            compact_partition(&log, &def, &schema, 0, &prefix).unwrap();
            let after = records(&log, &schema);
            // Same offsets; the suffix untouched.
            prop_assert_eq!(after.iter().map(|r| r.0).collect::<Vec<_>>(), before.iter().map(|r| r.0).collect::<Vec<_>>());
            prop_assert_eq!(&after[end as usize..], &before[end as usize..]);
            // The prefix: exactly the rows live at its end, each once, as inserts.
            let mut at_end = BTreeMap::new();
            for (_, rows) in &before[..end as usize] {
                apply(&mut at_end, rows);
            }
            let mut kept: Vec<(i32, i64)> = Vec::new();
            for (_, rows) in &after[..end as usize] {
                for (k, v, d) in rows {
                    prop_assert_eq!(*d, 1, "only inserts stay");
                    kept.push((*k, *v));
                }
            }
            kept.sort();
            prop_assert_eq!(kept, at_end.into_iter().collect::<Vec<_>>());
            // The table replayed from the compacted log is the table.
            let mut replayed = BTreeMap::new();
            for (_, rows) in &after {
                apply(&mut replayed, rows);
            }
            prop_assert_eq!(&replayed, &state);
            let (data, _) = load_contents(&log, &def, &schema).unwrap();
            prop_assert_eq!(data.row_count(), state.len());
            log.shutdown();
        }
    }
}
