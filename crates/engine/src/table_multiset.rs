//! A table's rows with retractions: Arrow chunks with deletion vectors, indexed by an
//! [`Arrangement`] by primary key (or by the whole row), with the checks a commit needs.

use super::*;

/// A table's rows (or a view's contents) that may be retracted.
pub(super) struct Multiset {
    pub(super) converter: RowConverter,
    /// Key (the primary key's bytes, or the row's bytes on a table without one) -> one entry
    /// per row held: its location ([`Loc`]), then on a keyed table the row's bytes.
    pub(super) index: Arrangement,
    pub(super) chunks: Chunks,
    pub(super) primary_key: Option<PrimaryKey>,
    /// The last [`Multiset::check`]'s netted changes, for the [`Multiset::apply`] of the same
    /// changes that follows it (a commit checks before its log append and applies after).
    checked: Option<Checked>,
}

/// Changes a check encoded and netted, kept so that their apply does not do it again.
struct Checked {
    /// The index entries its retractions take, in order ([`Multiset::check_net`]).
    found: Vec<u32>,
    /// The changes checked (clones sharing their arrays: an apply of the same arrays is an
    /// apply of these changes).
    changes: Vec<ChangeBatch>,
    encoded: Vec<Encoded>,
    net: Vec<NetChange>,
    /// The index's round ([`Arrangement::round`]) when the check brought its keys back from
    /// disk: they are still in memory while it is the same.
    round: u32,
}

impl Checked {
    /// Whether `changes` are the very changes checked (the same arrays).
    fn is_of(&self, changes: &[ChangeBatch]) -> bool {
        let same = |a: &ChangeBatch, b: &ChangeBatch| {
            a.len() == b.len()
                && a.diffs().values().as_ptr() == b.diffs().values().as_ptr()
                && a.rows().num_columns() == b.rows().num_columns()
                && a.rows()
                    .columns()
                    .iter()
                    .zip(b.rows().columns())
                    .all(|(x, y)| Arc::ptr_eq(x, y))
        };
        self.changes.len() == changes.len()
            && self.changes.iter().zip(changes).all(|(a, b)| same(a, b))
    }
}

/// The net weight of one distinct row within a set of change batches.
struct NetChange {
    /// (batch, row) of its first occurrence: its bytes, and to quote it in errors.
    origin: (usize, usize),
    diff: i64,
}

pub(super) struct PrimaryKey {
    columns: Vec<usize>,
    pub(super) converter: RowConverter,
    constraint_name: String,
    column_names: Vec<String>,
}

/// A change batch's rows and primary keys in arrow's row format.
struct Encoded {
    rows: arrow::row::Rows,
    keys: Option<arrow::row::Rows>,
}

impl Multiset {
    pub(super) fn new(
        schema: &SchemaRef,
        primary_key: Option<(&[usize], &str)>,
    ) -> Result<Multiset> {
        let fields = schema
            .fields()
            .iter()
            .map(|f| SortField::new(f.data_type().clone()))
            .collect();
        let converter = RowConverter::new(fields).map_err(|e| arrow_error("row converter", e))?;
        let primary_key = match primary_key {
            None => None,
            Some((columns, table)) => {
                let fields = columns
                    .iter()
                    .map(|&i| SortField::new(schema.field(i).data_type().clone()))
                    .collect();
                Some(PrimaryKey {
                    columns: columns.to_vec(),
                    converter: RowConverter::new(fields)
                        .map_err(|e| arrow_error("key converter", e))?,
                    constraint_name: format!("{table}_pkey"),
                    column_names: columns
                        .iter()
                        .map(|&i| schema.field(i).name().clone())
                        .collect(),
                })
            }
        };
        Ok(Multiset {
            converter,
            index: Arrangement::new(),
            chunks: Chunks::new(Arc::clone(schema)),
            primary_key,
            checked: None,
        })
    }

    pub(super) fn fork(&self, schema: &SchemaRef) -> Result<Multiset> {
        let mut fork = Multiset::new(
            schema,
            self.primary_key
                .as_ref()
                .map(|pk| (pk.columns.as_slice(), "")),
        )?;
        if let (Some(new), Some(old)) = (fork.primary_key.as_mut(), &self.primary_key) {
            new.constraint_name.clone_from(&old.constraint_name);
        }
        fork.index = self.index.clone();
        fork.chunks = self.chunks.clone();
        Ok(fork)
    }

    /// Keeps the index and the chunks within their share of `budget` from now on.
    pub(super) fn spill_to(&mut self, budget: &Arc<MemoryBudget>) {
        self.index.spill_to(budget);
        self.chunks.spill_to(budget);
    }

    /// Brings back from disk the index entries of `keys` (primary keys, or whole rows on a
    /// table without one) for the probes that follow.
    pub(super) fn prepare_keys(&mut self, keys: &arrow::row::Rows) -> Result<()> {
        self.index.prepare(keys.iter().map(|k| k.data()))
    }

    /// Copies of `row` held (its primary key `key` on a keyed table); the key prepared.
    pub(super) fn held(&self, row: &[u8], key: Option<&[u8]>) -> i64 {
        self.copies(row, key).count() as i64
    }

    /// The index entries of the copies of `row` held (see [`Multiset::held`]).
    fn copies<'a>(
        &'a self,
        row: &'a [u8],
        key: Option<&'a [u8]>,
    ) -> impl Iterator<Item = u32> + 'a {
        self.index
            .probe(key.unwrap_or(row))
            .filter(move |f| key.is_none() || &f.row[LOC..] == row)
            .map(|f| f.id)
    }

    /// The row a keyed table holds under `key` (prepared).
    pub(super) fn current(&self, key: &[u8]) -> Option<&[u8]> {
        self.index.probe(key).next().map(|f| &f.row[LOC..])
    }

    fn encode(&self, batch: &RecordBatch) -> Result<Encoded> {
        let rows = self
            .converter
            .convert_columns(batch.columns())
            .map_err(|e| arrow_error("encode rows", e))?;
        let keys = match &self.primary_key {
            None => None,
            Some(pk) => Some(pk.encode(batch)?),
        };
        Ok(Encoded { rows, keys })
    }

    /// Sums the weights per distinct row, so that a transaction's insert-then-delete of one row
    /// nets to nothing whatever the order of its statements.
    fn net(&self, changes: &[ChangeBatch]) -> Result<(Vec<Encoded>, Vec<NetChange>)> {
        let encoded = changes
            .iter()
            .map(|c| self.encode(c.rows()))
            .collect::<Result<Vec<_>>>()?;
        let rows = changes.iter().map(ChangeBatch::len).sum();
        let mut by_row: HashMap<&[u8], usize> =
            HashMap::with_capacity_and_hasher(rows, Default::default());
        let mut out: Vec<NetChange> = Vec::with_capacity(rows);
        for (b, batch) in changes.iter().enumerate() {
            for (i, diff) in batch.diffs().values().iter().enumerate() {
                let row = encoded[b].rows.row(i).data();
                match by_row.get(row) {
                    Some(&at) => out[at].diff += diff,
                    None => {
                        by_row.insert(row, out.len());
                        out.push(NetChange {
                            origin: (b, i),
                            diff: *diff,
                        });
                    }
                }
            }
        }
        drop(by_row);
        out.retain(|c| c.diff != 0);
        Ok((encoded, out))
    }

    /// Checks `changes` against what is held. The index keys it probes are brought back from
    /// disk first (when the index spills) and stay in memory for the apply that follows (its
    /// settle may spill them again); the netted changes are kept for that apply.
    pub(super) fn check(&mut self, changes: &[ChangeBatch]) -> Result<()> {
        self.checked = None;
        let (encoded, net) = self.net(changes)?;
        self.prepare(&encoded, &net)?;
        let found = self.check_net(changes, &encoded, &net)?;
        self.checked = Some(Checked {
            found,
            changes: changes.to_vec(),
            encoded,
            net,
            round: self.index.round(),
        });
        Ok(())
    }

    /// [`Multiset::check`] then [`Multiset::apply`], netting the changes once; a failed check
    /// (mapped by `on_check`) leaves the multiset as it was.
    pub(super) fn check_and_apply(
        &mut self,
        changes: &[ChangeBatch],
        on_check: impl FnOnce(Error) -> Error,
    ) -> Result<()> {
        self.checked = None;
        let (encoded, net) = self.net(changes)?;
        self.prepare(&encoded, &net)?;
        let found = self.check_net(changes, &encoded, &net).map_err(on_check)?;
        self.apply_net(&encoded, &net, Some(&found[..]))?;
        self.settle()
    }

    /// Ends a write (or a read that brought index keys back): the index and the chunks within
    /// their share of the memory budget, when they spill.
    pub(super) fn settle(&mut self) -> Result<()> {
        self.index.settle()?;
        self.chunks.settle()
    }

    /// Brings back from disk the index keys that checking and applying `net` probe (when the
    /// index spills): the retracted rows', and on a keyed table the inserted rows' keys (once
    /// per key: an update retracts and inserts the same key).
    fn prepare(&mut self, encoded: &[Encoded], net: &[NetChange]) -> Result<()> {
        let freed = self.freed_keys(encoded, net);
        let keys = net.iter().filter_map(|c| match c.key(encoded) {
            None if c.diff < 0 => Some(c.row(encoded)),
            None => None,
            Some(key) if c.diff < 0 || !freed.contains(key) => Some(key),
            Some(_) => None,
        });
        self.index.prepare(keys)
    }

    /// On a keyed table, the keys `net` retracts a row of.
    fn freed_keys<'a>(&self, encoded: &'a [Encoded], net: &[NetChange]) -> HashSet<&'a [u8]> {
        match self.primary_key {
            None => HashSet::default(),
            Some(_) => keys_where(encoded, net, |diff| diff < 0),
        }
    }

    /// Checks `net` against what is held; returns the index entries its retractions take
    /// (as many as each retracts, in order), for its apply while nothing else changed.
    fn check_net(
        &self,
        changes: &[ChangeBatch],
        encoded: &[Encoded],
        net: &[NetChange],
    ) -> Result<Vec<u32>> {
        let mut found = Vec::new();
        for change in net.iter().filter(|c| c.diff < 0) {
            let wanted = change.diff.unsigned_abs() as usize;
            let before = found.len();
            found.extend(
                self.copies(change.row(encoded), change.key(encoded))
                    .take(wanted),
            );
            if found.len() - before < wanted {
                return Err(Error::new(
                    SqlState::SERIALIZATION_FAILURE,
                    "could not serialize access due to concurrent update",
                ));
            }
        }
        let Some(pk) = &self.primary_key else {
            return Ok(found);
        };
        // Retractions first, so that an update may move a row onto a key it frees.
        let freed = self.freed_keys(encoded, net);
        let mut added: HashSet<&[u8]> = HashSet::default();
        for change in net.iter().filter(|c| c.diff > 0) {
            let Some(key) = change.key(encoded) else {
                continue;
            };
            let taken = !freed.contains(key) && self.index.contains_key(key);
            if change.diff > 1 || taken || !added.insert(key) {
                let (b, i) = change.origin;
                return Err(duplicate_key(pk, changes[b].rows(), i));
            }
        }
        Ok(found)
    }

    /// Applies changes that a check accepted (netted again unless they are the last check's).
    pub(super) fn apply(&mut self, changes: &[ChangeBatch]) -> Result<()> {
        let (encoded, net, found) = match self.checked.take().filter(|c| c.is_of(changes)) {
            // The entries the check found are still them while no settle came between.
            Some(checked) if checked.round == self.index.round() => {
                (checked.encoded, checked.net, Some(checked.found))
            }
            Some(checked) => {
                self.prepare(&checked.encoded, &checked.net)?;
                (checked.encoded, checked.net, None)
            }
            None => {
                let (encoded, net) = self.net(changes)?;
                self.prepare(&encoded, &net)?;
                (encoded, net, None)
            }
        };
        self.apply_net(&encoded, &net, found.as_deref())?;
        self.settle()
    }

    /// Applies `net`; `found`: the entries its retractions take, as its check found them.
    fn apply_net(
        &mut self,
        encoded: &[Encoded],
        net: &[NetChange],
        found: Option<&[u32]>,
    ) -> Result<()> {
        let mut entry = Vec::new();
        let mut compact = Vec::new();
        // On a keyed table a key whose row is replaced (an UPDATE) keeps its index entry,
        // pointed at the new row: one probe instead of taking the key out and putting it back.
        let inserted: HashSet<&[u8]> = match self.primary_key {
            None => HashSet::default(),
            Some(_) => keys_where(encoded, net, |diff| diff > 0),
        };
        let mut replaced: HashMap<&[u8], u32> =
            HashMap::with_capacity_and_hasher(inserted.len(), Default::default());
        let mut found = found.map(|ids| ids.iter().copied());
        for change in net.iter().filter(|c| c.diff < 0) {
            let row = change.row(encoded);
            let key = change.key(encoded).unwrap_or(row);
            for _ in 0..-change.diff {
                let id = match &mut found {
                    Some(ids) => ids.next(),
                    None => self.copies(row, change.key(encoded)).next(),
                };
                let Some(id) = id else {
                    return Err(Error::new(
                        SqlState::DATA_CORRUPTED,
                        "the log retracts a row the table does not hold",
                    ));
                };
                let loc = Loc::from_bytes(self.index.row(id));
                if change.diff == -1 && inserted.contains(key) {
                    replaced.insert(key, id);
                } else {
                    self.index.add_weight(id, -1);
                }
                compact.extend(self.chunks.delete(loc)?);
            }
        }
        let parser = self.converter.parser();
        let inserted: Vec<&NetChange> = net
            .iter()
            .filter(|c| c.diff > 0)
            .flat_map(|c| std::iter::repeat_n(c, c.diff as usize))
            .collect();
        if !inserted.is_empty() {
            let columns = self
                .converter
                .convert_rows(inserted.iter().map(|c| parser.parse(c.row(encoded))))
                .map_err(|e| arrow_error("decode rows", e))?;
            let batch = RecordBatch::try_new(Arc::clone(self.chunks.schema()), columns)
                .map_err(|e| arrow_error("inserted rows", e))?;
            let mut placed = Vec::with_capacity(inserted.len());
            self.chunks.append(&batch, Some(&mut placed))?;
            for (change, loc) in inserted.iter().zip(placed) {
                let row = change.row(encoded);
                let key = change.key(encoded).unwrap_or(row);
                match replaced.remove(key) {
                    Some(id) => {
                        entry.clear();
                        entry.extend_from_slice(&loc.to_bytes());
                        entry.extend_from_slice(row);
                        self.index.replace_row(id, &entry)?;
                    }
                    None => self.index_update(key, loc, row, 1, &mut entry)?,
                }
            }
        }
        if !replaced.is_empty() {
            return Err(Error::internal(
                "an update of a keyed table retracted a row whose key it did not insert",
            ));
        }
        compact.sort_unstable();
        compact.dedup();
        for chunk in compact {
            self.chunks.compact(chunk)?;
        }
        Ok(())
    }

    /// Adds `weight` to the index entry of `row` (under `key`) at `loc`.
    fn index_update(
        &mut self,
        key: &[u8],
        loc: Loc,
        row: &[u8],
        weight: i64,
        entry: &mut Vec<u8>,
    ) -> Result<()> {
        entry.clear();
        entry.extend_from_slice(&loc.to_bytes());
        if self.primary_key.is_some() {
            entry.extend_from_slice(row);
        }
        self.index.update(key, entry, 0, weight, NEVER)?;
        Ok(())
    }
}

/// The primary keys of the changes in `net` whose weight `which` picks.
fn keys_where<'a>(
    encoded: &'a [Encoded],
    net: &[NetChange],
    which: impl Fn(i64) -> bool,
) -> HashSet<&'a [u8]> {
    let mut keys = HashSet::with_capacity_and_hasher(net.len(), Default::default());
    keys.extend(
        net.iter()
            .filter(|c| which(c.diff))
            .filter_map(|c| c.key(encoded)),
    );
    keys
}

/// Bytes of a location at the start of an index entry.
const LOC: usize = 8;

impl PrimaryKey {
    pub(super) fn encode(&self, batch: &RecordBatch) -> Result<arrow::row::Rows> {
        let columns: Vec<ArrayRef> = self
            .columns
            .iter()
            .map(|&i| Arc::clone(batch.column(i)))
            .collect();
        self.converter
            .convert_columns(&columns)
            .map_err(|e| arrow_error("encode keys", e))
    }
}

impl NetChange {
    fn row<'a>(&self, encoded: &'a [Encoded]) -> &'a [u8] {
        encoded[self.origin.0].rows.row(self.origin.1).data()
    }

    fn key<'a>(&self, encoded: &'a [Encoded]) -> Option<&'a [u8]> {
        encoded[self.origin.0]
            .keys
            .as_ref()
            .map(|k| k.row(self.origin.1).data())
    }
}

pub(super) fn duplicate_key(pk: &PrimaryKey, rows: &RecordBatch, row: usize) -> Error {
    let values: Vec<String> = pk
        .columns
        .iter()
        .map(|&c| {
            let column = rows.column(c);
            if column.is_null(row) {
                "null".to_owned()
            } else {
                arrow::util::display::array_value_to_string(column, row)
                    .unwrap_or_else(|_| "?".into())
            }
        })
        .collect();
    Error::new(
        SqlState::UNIQUE_VIOLATION,
        format!(
            "duplicate key value violates unique constraint \"{}\"",
            pk.constraint_name
        ),
    )
    .with_detail(format!(
        "Key ({})=({}) already exists.",
        pk.column_names.join(", "),
        values.join(", ")
    ))
}
