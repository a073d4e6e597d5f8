//! Writes: a transaction's changes routed to partitions, appended to the logs (group commit),
//! applied to the tables and sent to the views in commit order; proctime filled at commit.

use super::*;

impl Engine {
    pub(crate) async fn lock_writes(&self) -> WriteGuard {
        Arc::clone(&self.write_lock).lock_owned().await
    }

    /// Checks, logs and applies one transaction's changes. Takes the write guard and releases
    /// it as soon as the commit is queued, so that other writers join the same group commit;
    /// returns once the commit is durable.
    ///
    /// `positions` (a connector's write to one table) are recorded with the changes: how far
    /// the connector has read each source partition, so a restart resumes exactly there. They
    /// are written even when no row changed.
    /// `partition` pins an append-only table's write to one partition (a connector keeps a
    /// source partition's records in one log partition).
    pub(crate) async fn commit(
        &self,
        guard: WriteGuard,
        writes: Vec<(Arc<Table>, Vec<ChangeBatch>)>,
        positions: &[(u32, u64)],
        partition: Option<u32>,
    ) -> Result<()> {
        let writes: Vec<_> = writes
            .into_iter()
            .filter(|(_, c)| !positions.is_empty() || c.iter().any(|b| !b.is_empty()))
            .collect();
        if writes.is_empty() {
            return Ok(());
        }
        let now = self.clock.now_micros();
        let writes = writes
            .into_iter()
            .map(|(t, c)| Ok((Arc::clone(&t), fill_proctime(&t.def, &t.schema, c, now)?)))
            .collect::<Result<Vec<_>>>()?;
        let mut log_writes = Vec::with_capacity(writes.len());
        let mut routed: Vec<Vec<(u32, ChangeBatch)>> = Vec::with_capacity(writes.len());
        for (table, changes) in &writes {
            match self.table_by_id(table.def.id) {
                None => {
                    return Err(Error::new(
                        SqlState::UNDEFINED_TABLE,
                        format!("table \"{}\" was dropped", table.def.qualified().display()),
                    ));
                }
                // ALTER TABLE replaced the table since this statement read it.
                Some(now) if !Arc::ptr_eq(&now, table) => {
                    return Err(Error::new(
                        SqlState::SERIALIZATION_FAILURE,
                        format!(
                            "table \"{}\" was altered while the statement ran; run it again",
                            table.def.name
                        ),
                    ));
                }
                Some(_) => {}
            }
            table.write().check(changes)?;
            let mut parts = table.route(concat_changes(&table.schema, changes)?, partition)?;
            if parts.is_empty() {
                parts.push((
                    0,
                    ChangeBatch::inserts(RecordBatch::new_empty(Arc::clone(&table.schema))),
                ));
            }
            for (partition, part) in &parts {
                log_writes.push(Write {
                    object: table.def.id,
                    partition: PartitionId(*partition),
                    payload: encode_changes_at(part, positions)?,
                });
            }
            routed.push(parts);
        }
        // Room in the view runtime's queue first: while views are behind, writers wait here.
        let bytes: usize = routed
            .iter()
            .flatten()
            .map(|(_, p)| p.rows().get_array_memory_size())
            .sum();
        let messages = routed.iter().map(Vec::len).sum();
        let mut budget = Some(self.runtime.reserve(bytes, messages).await?);
        let n = log_writes.len();
        let (ticket, offsets) = self.log.commit_at(log_writes);
        if offsets.len() != n {
            // Refused before it was queued (a record too large): nothing to apply.
            drop(guard);
            return ticket
                .await
                .map_err(|_| Error::internal("the log committer stopped without answering"))?
                .map(|_| ());
        }
        let mut offsets = offsets.as_slice();
        for ((table, changes), parts) in writes.iter().zip(routed) {
            let (mine, rest) = offsets.split_at(parts.len());
            offsets = rest;
            table.write().apply_committed(changes, &parts, mine)?;
            table.progress.advance(positions);
            for (partition, part) in parts {
                self.runtime.changes(
                    table.def.id,
                    partition,
                    table.clock,
                    vec![part],
                    budget.take(),
                )?;
            }
        }
        drop(guard);
        ticket
            .await
            .map_err(|_| Error::internal("the log committer stopped without answering"))?
            .map(|_| ())
    }
}

/// Sets the `AS PROCTIME()` columns of inserted rows (where they are NULL) to `now` (µs).
pub(super) fn fill_proctime(
    def: &TableDef,
    schema: &SchemaRef,
    changes: Vec<ChangeBatch>,
    now: i64,
) -> Result<Vec<ChangeBatch>> {
    let columns: Vec<usize> = def
        .columns
        .iter()
        .enumerate()
        .filter(|(_, c)| c.proctime)
        .map(|(i, _)| i)
        .collect();
    if columns.is_empty() {
        return Ok(changes);
    }
    changes
        .into_iter()
        .map(|c| {
            let (rows, diffs) = c.into_parts();
            let mut arrays = rows.columns().to_vec();
            for &i in &columns {
                let arrow::datatypes::DataType::Timestamp(_, tz) =
                    schema.field(i).data_type().clone()
                else {
                    continue;
                };
                let old = arrow::compute::cast(&arrays[i], &arrow::datatypes::DataType::Int64)
                    .map_err(|e| Error::internal(format!("proctime: {e}")))?;
                let old = old
                    .as_any()
                    .downcast_ref::<Int64Array>()
                    .ok_or_else(|| Error::internal("proctime column"))?;
                let filled: arrow::array::TimestampMicrosecondArray = old
                    .iter()
                    .zip(diffs.values())
                    .map(|(v, d)| if *d > 0 && v.is_none() { Some(now) } else { v })
                    .collect();
                arrays[i] = Arc::new(filled.with_timezone_opt(tz));
            }
            let rows = RecordBatch::try_new(rows.schema(), arrays)
                .map_err(|e| Error::internal(format!("proctime: {e}")))?;
            Ok(ChangeBatch::new(rows, diffs))
        })
        .collect()
}

pub(super) fn concat_changes(schema: &SchemaRef, changes: &[ChangeBatch]) -> Result<ChangeBatch> {
    if let [one] = changes {
        return Ok(one.clone());
    }
    let rows: Vec<&RecordBatch> = changes.iter().map(|c| c.rows()).collect();
    let rows = arrow::compute::concat_batches(schema, rows)
        .map_err(|e| Error::internal(format!("concatenating changes: {e}")))?;
    let diffs: Vec<i64> = changes
        .iter()
        .flat_map(|c| c.diffs().values().iter().copied())
        .collect();
    Ok(ChangeBatch::new(rows, Int64Array::from(diffs)))
}
