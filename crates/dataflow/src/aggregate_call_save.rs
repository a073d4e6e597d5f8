//! How a [`Call`]'s state of some groups is saved as checkpoint columns and loaded back.

use super::*;

impl Call {
    /// Columns `c<i>…` holding this call's state of `groups` (a checkpoint).
    pub(crate) fn save(
        &mut self,
        i: usize,
        groups: &[GroupId],
        out: &mut Vec<(String, ArrayRef)>,
    ) -> Result<()> {
        let at = |g: &GroupId| *g as usize;
        let accumulates = self.accumulates();
        let (function, retractable) = (&self.spec.function, self.retractable);
        match &mut self.state {
            CallState::Count(counts) => out.push((
                format!("c{i}"),
                checkpoint::int64s(groups.iter().map(|g| counts[at(g)])),
            )),
            CallState::IntSum(sums, counts) => {
                let sums = Decimal128Array::from_iter_values(groups.iter().map(|g| sums[at(g)]));
                out.push((
                    format!("c{i}_sum"),
                    Arc::new(sums.with_precision_and_scale(38, 0).map_err(arrow_error)?),
                ));
                out.push((
                    format!("c{i}_n"),
                    checkpoint::int64s(groups.iter().map(|g| counts[at(g)])),
                ));
            }
            CallState::FloatSum(sums, counts) => {
                out.push((
                    format!("c{i}_sum"),
                    Arc::new(Float64Array::from_iter_values(
                        groups.iter().map(|g| sums[at(g)]),
                    )),
                ));
                out.push((
                    format!("c{i}_n"),
                    checkpoint::int64s(groups.iter().map(|g| counts[at(g)])),
                ));
            }
            CallState::ExactFloatSum(sums, counts) => {
                let encoded: Vec<Vec<u8>> = groups
                    .iter()
                    .map(|g| {
                        let mut bytes = Vec::new();
                        sums[at(g)].encode(&mut bytes);
                        bytes
                    })
                    .collect();
                out.push((
                    format!("c{i}_exact"),
                    checkpoint::binary(encoded.iter().map(Vec::as_slice)),
                ));
                out.push((
                    format!("c{i}_n"),
                    checkpoint::int64s(groups.iter().map(|g| counts[at(g)])),
                ));
            }
            CallState::Extreme(values) => out.push((
                format!("c{i}"),
                Arc::new(Int64Array::from_iter(groups.iter().map(|g| values[at(g)]))),
            )),
            CallState::ExtremeSet(sets) => {
                // Per group: (value, multiplicity) pairs, little-endian.
                let encoded: Vec<Vec<u8>> = groups
                    .iter()
                    .map(|g| {
                        sets[at(g)]
                            .iter()
                            .flat_map(|(v, n)| v.to_le_bytes().into_iter().chain(n.to_le_bytes()))
                            .collect()
                    })
                    .collect();
                out.push((
                    format!("c{i}"),
                    checkpoint::binary(encoded.iter().map(Vec::as_slice)),
                ));
            }
            CallState::Generic(states) => {
                let mut multisets: Vec<Vec<u8>> = Vec::new();
                // An accumulator's state is as wide as its own `state()` says: a sliding
                // accumulator keeps more than `state_fields` declares (sum of decimals: the
                // sum and a count), so the width comes from the values, never the fields.
                let mut scalars: Vec<Vec<ScalarValue>> = Vec::new();
                for (k, g) in groups.iter().enumerate() {
                    match states
                        .get_mut(at(g))
                        .and_then(Option::as_mut)
                        .ok_or_else(|| Error::internal("a group without its aggregate state"))?
                    {
                        AggState::Retractable(acc) | AggState::InsertOnly(acc) => {
                            // DataFusion's `state` consumes what the accumulator holds
                            // (`string_agg`'s string, `count(DISTINCT ..)`'s set): the live
                            // accumulator is made again from it, as a restore makes it.
                            let state = acc.state().map_err(eval_error)?;
                            let mut again = if retractable {
                                function.create_sliding_accumulator()
                            } else {
                                function.create_accumulator()
                            }
                            .map_err(eval_error)?;
                            let arrays = (state.iter())
                                .map(|v| v.to_array().map_err(eval_error))
                                .collect::<Result<Vec<_>>>()?;
                            again.merge_batch(&arrays).map_err(eval_error)?;
                            *acc = again;
                            if k == 0 {
                                scalars = vec![Vec::with_capacity(groups.len()); state.len()];
                            }
                            if state.len() != scalars.len() {
                                return Err(Error::internal(
                                    "accumulators of one aggregate keep states of different widths",
                                ));
                            }
                            for (column, value) in scalars.iter_mut().zip(state) {
                                column.push(value);
                            }
                        }
                        // Per group: (row length u32, row, multiplicity i64), little-endian.
                        AggState::Multiset(rows) => multisets.push(
                            rows.iter()
                                .flat_map(|(r, n)| {
                                    (r.as_ref().len() as u32)
                                        .to_le_bytes()
                                        .into_iter()
                                        .chain(r.as_ref().iter().copied())
                                        .chain(n.to_le_bytes())
                                })
                                .collect(),
                        ),
                    }
                }
                if !accumulates {
                    out.push((
                        format!("c{i}"),
                        checkpoint::binary(multisets.iter().map(Vec::as_slice)),
                    ));
                } else {
                    for (j, column) in scalars.into_iter().enumerate() {
                        out.push((
                            format!("c{i}_s{j}"),
                            ScalarValue::iter_to_array(column).map_err(eval_error)?,
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// Whether each group of this generic aggregate keeps a DataFusion accumulator (not a
    /// multiset of argument rows).
    pub(crate) fn accumulates(&self) -> bool {
        self.retractable || self.append_only
    }

    /// Sets the state of `groups` (fresh ones) from the columns [`Call::save`] wrote.
    pub(crate) fn load(&mut self, i: usize, batch: &RecordBatch, groups: &[GroupId]) -> Result<()> {
        let at = |g: &GroupId| *g as usize;
        let accumulates = self.accumulates();
        match &mut self.state {
            CallState::Count(counts) => {
                let values = checkpoint::int64_column(batch, &format!("c{i}"))?;
                for (g, v) in groups.iter().zip(values.values()) {
                    counts[at(g)] = *v;
                }
            }
            CallState::IntSum(sums, counts) => {
                let saved = checkpoint::column(batch, &format!("c{i}_sum"))?
                    .as_primitive_opt::<Decimal128Type>()
                    .ok_or_else(|| Error::internal("a checkpointed sum is not a decimal"))?;
                let n = checkpoint::int64_column(batch, &format!("c{i}_n"))?;
                for (k, g) in groups.iter().enumerate() {
                    sums[at(g)] = saved.value(k);
                    counts[at(g)] = n.value(k);
                }
            }
            CallState::FloatSum(sums, counts) => {
                let saved = checkpoint::column(batch, &format!("c{i}_sum"))?
                    .as_primitive_opt::<Float64Type>()
                    .ok_or_else(|| Error::internal("a checkpointed sum is not a double"))?;
                let n = checkpoint::int64_column(batch, &format!("c{i}_n"))?;
                for (k, g) in groups.iter().enumerate() {
                    sums[at(g)] = saved.value(k);
                    counts[at(g)] = n.value(k);
                }
            }
            CallState::ExactFloatSum(sums, counts) => {
                let saved = checkpoint::binary_column(batch, &format!("c{i}_exact"))?;
                let n = checkpoint::int64_column(batch, &format!("c{i}_n"))?;
                for (k, g) in groups.iter().enumerate() {
                    sums[at(g)] = ExactFloatSum::decode(saved.value(k)).ok_or_else(truncated)?;
                    counts[at(g)] = n.value(k);
                }
            }
            CallState::Extreme(values) => {
                let saved = checkpoint::int64_column(batch, &format!("c{i}"))?;
                for (k, g) in groups.iter().enumerate() {
                    values[at(g)] = checkpoint::value_at(saved, k);
                }
            }
            CallState::ExtremeSet(sets) => {
                let saved = checkpoint::binary_column(batch, &format!("c{i}"))?;
                for (k, g) in groups.iter().enumerate() {
                    let set = &mut sets[at(g)];
                    for pair in saved.value(k).chunks_exact(16) {
                        let (v, n) = pair.split_at(8);
                        set.insert(i64::from_le_bytes(le8(v)?), i64::from_le_bytes(le8(n)?));
                    }
                }
            }
            CallState::Generic(states) if accumulates => {
                // As many state columns as `save` wrote (none when it saved no group).
                let width = (0..)
                    .take_while(|j| {
                        batch
                            .schema()
                            .column_with_name(&format!("c{i}_s{j}"))
                            .is_some()
                    })
                    .count();
                if width == 0 && !groups.is_empty() {
                    return Err(Error::new(
                        eddy_common::SqlState::DATA_CORRUPTED,
                        format!(
                            "the checkpoint holds no state for aggregate {}",
                            self.spec.function.name()
                        ),
                    ));
                }
                let columns = (0..width)
                    .map(|j| checkpoint::column(batch, &format!("c{i}_s{j}")).cloned())
                    .collect::<Result<Vec<_>>>()?;
                for (k, g) in groups.iter().enumerate() {
                    let acc = match states.get_mut(at(g)).and_then(Option::as_mut) {
                        Some(AggState::Retractable(acc) | AggState::InsertOnly(acc)) => acc,
                        _ => return Err(Error::internal("a group without its accumulator")),
                    };
                    let row: Vec<ArrayRef> = columns.iter().map(|c| c.slice(k, 1)).collect();
                    acc.merge_batch(&row).map_err(eval_error)?;
                }
            }
            CallState::Generic(states) => {
                let saved = checkpoint::binary_column(batch, &format!("c{i}"))?;
                let parser = self.converter.parser();
                for (k, g) in groups.iter().enumerate() {
                    let Some(AggState::Multiset(rows)) =
                        states.get_mut(at(g)).and_then(Option::as_mut)
                    else {
                        return Err(Error::internal("a group without its multiset"));
                    };
                    let mut bytes = saved.value(k);
                    while !bytes.is_empty() {
                        let (len, rest) = bytes.split_at_checked(4).ok_or_else(truncated)?;
                        let len =
                            u32::from_le_bytes(len.try_into().map_err(|_| truncated())?) as usize;
                        let (row, rest) = rest.split_at_checked(len).ok_or_else(truncated)?;
                        let (n, rest) = rest.split_at_checked(8).ok_or_else(truncated)?;
                        rows.insert(parser.parse(row).owned(), i64::from_le_bytes(le8(n)?));
                        bytes = rest;
                    }
                }
            }
        }
        Ok(())
    }
}

fn le8(bytes: &[u8]) -> Result<[u8; 8]> {
    bytes.try_into().map_err(|_| truncated())
}

fn truncated() -> Error {
    Error::internal("checkpointed aggregate state is truncated")
}
