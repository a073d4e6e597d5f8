//! [`TableData`] against a model: random inserts, retractions and updates of keyed and
//! unkeyed tables, through chunk compactions and transaction forks.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{AsArray, Int32Array, Int64Array, RecordBatch};
use arrow::datatypes::{Int32Type, Int64Type};
use eddy_common::{ChangeBatch, ObjectId};
use proptest::prelude::*;

use crate::catalog::{ColumnDef, TableDef};
use crate::table::TableData;

/// A table `kv (k INT, v BIGINT)` for tests: keyed by `k` or not, append-only or not.
pub(crate) fn kv_def(keyed: bool, append_only: bool, partitions: u32) -> TableDef {
    let column = |name: &str, arrow: &str, pg: &str| ColumnDef {
        name: name.into(),
        pg_type: pg.into(),
        arrow_type: arrow.into(),
        nullable: true,
        proctime: false,
        default: None,
    };
    TableDef {
        id: ObjectId(7),
        schema: "public".into(),
        name: "kv".into(),
        columns: vec![
            column("k", "Int32", "integer"),
            column("v", "Int64", "bigint"),
        ],
        primary_key: if keyed { vec![0] } else { Vec::new() },
        append_only,
        watermark: None,
        options: Vec::new(),
        partitions,
        format: None,
        includes: Vec::new(),
    }
}

fn def(keyed: bool) -> TableDef {
    kv_def(keyed, false, 1)
}

/// A budget of no bytes, spilling into a directory that lives as long as it: every key of
/// the index and every sealed chunk goes to disk at each write.
struct Spilling {
    budget: Arc<eddy_dataflow::spill::MemoryBudget>,
    _dir: tempfile::TempDir,
}

fn spilling() -> Spilling {
    let dir = tempfile::tempdir().unwrap();
    let budget = eddy_dataflow::spill::MemoryBudget::new(0, &dir.path().join("spill")).unwrap();
    Spilling { budget, _dir: dir }
}

/// An empty table `kv`, keyed or not, spilling everything when `spill` is given.
fn table(keyed: bool, spill: Option<&Spilling>) -> TableData {
    let def = def(keyed);
    TableData::new(&def, def.schema().unwrap())
        .unwrap()
        .within(spill.map(|s| &s.budget))
}

type Model = BTreeMap<(i32, i64), i64>;

fn changes(rows: &[(i32, i64, i64)]) -> ChangeBatch {
    let batch = RecordBatch::try_new(
        def(true).schema().unwrap(),
        vec![
            Arc::new(Int32Array::from_iter_values(rows.iter().map(|r| r.0))),
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.1))),
        ],
    )
    .unwrap();
    ChangeBatch::new(
        batch,
        Int64Array::from_iter_values(rows.iter().map(|r| r.2)),
    )
}

fn contents(data: &mut TableData) -> Model {
    rows_of(&data.snapshot().unwrap())
}

fn rows_of(batches: &[RecordBatch]) -> Model {
    let mut out = Model::new();
    for batch in batches {
        let k = batch.column(0).as_primitive::<Int32Type>();
        let v = batch.column(1).as_primitive::<Int64Type>();
        for i in 0..batch.num_rows() {
            *out.entry((k.value(i), v.value(i))).or_default() += 1;
        }
    }
    out
}

/// Applies `rows` to the table when it accepts them, to the model too; returns whether it did.
fn write(data: &mut TableData, model: &mut Model, rows: &[(i32, i64, i64)]) -> bool {
    let batch = [changes(rows)];
    if data.check(&batch).is_err() {
        return false;
    }
    data.apply(&batch).unwrap();
    for &(k, v, d) in rows {
        *model.entry((k, v)).or_default() += d;
    }
    model.retain(|_, n| *n != 0);
    true
}

/// What a keyed table must refuse: a key held twice.
fn keys_unique(model: &Model, rows: &[(i32, i64, i64)]) -> bool {
    let mut after = model.clone();
    for &(k, v, d) in rows {
        *after.entry((k, v)).or_default() += d;
    }
    after.retain(|_, n| *n != 0);
    let mut keys = std::collections::BTreeSet::new();
    after.iter().all(|((k, _), n)| *n == 1 && keys.insert(*k))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

    /// Random batches of inserts and retractions: the table holds what the model holds, and
    /// refuses exactly the batches that retract a row it does not hold or repeat a key.
    #[test]
    fn a_table_holds_what_its_changes_say(keyed: bool, spill: bool, ops in prop::collection::vec(prop::collection::vec((0..12i32, 0..4i64, prop::bool::weighted(0.6)), 1..40), 1..40)) {
        let spilling = spill.then(spilling);
        let mut data = table(keyed, spilling.as_ref());
        let mut model = Model::new();
        for (n, op) in ops.iter().enumerate() {
            let rows: Vec<(i32, i64, i64)> = op.iter().map(|&(k, v, insert)| (k, v, if insert { 1 } else { -1 })).collect();
            // Retractions of what is held, so that most batches apply.
            let mut held = model.clone();
            let rows: Vec<(i32, i64, i64)> = rows.into_iter().filter_map(|(k, v, d)| {
                if d > 0 {
                    return Some((k, v, d));
                }
                let (&(k, v), n) = held.iter_mut().find(|((hk, _), n)| *hk == k && **n > 0)?;
                *n -= 1;
                Some((k, v, -1))
            }).collect();
            if rows.is_empty() {
                continue;
            }
            let valid = !keyed || keys_unique(&model, &rows);
            let applied = write(&mut data, &mut model, &rows);
            prop_assert_eq!(applied, valid, "batch {} {:?}", n, rows);
            if n % 3 == 0 {
                prop_assert_eq!(&contents(&mut data), &model);
            }
        }
        prop_assert_eq!(&contents(&mut data), &model);
        prop_assert_eq!(data.row_count() as i64, model.values().sum::<i64>());
        if spill && !model.is_empty() {
            // A refused batch leaves the keys it checked in memory until the next write.
            data.apply(&[changes(&[])]).unwrap();
            prop_assert!(data.spilled().0 > 0, "nothing went to disk");
        }
        // A fork is the same table (its rows on disk read as they were when it was made),
        // and changes apart from it.
        let mut fork = data.fork().unwrap();
        let at_fork = model.clone();
        let all: Vec<(i32, i64, i64)> = model.iter().map(|(&(k, v), &n)| (k, v, -n)).collect();
        if let Some(&(k, v, _)) = all.first() {
            // The table goes on after the fork: a row replaced, another added.
            prop_assert!(write(&mut data, &mut model, &[(k, v, -1), (k, v + 10, 1), (100, 1, 1)]));
        }
        prop_assert_eq!(&contents(&mut fork), &at_fork);
        if !all.is_empty() {
            let mut emptied = at_fork.clone();
            prop_assert!(write(&mut fork, &mut emptied, &all[..1]));
            // Retracting what it no longer holds is refused (not read from disk again, while
            // other rows are still there).
            prop_assert!(!write(&mut fork, &mut emptied, &all[..1]));
            prop_assert!(write(&mut fork, &mut emptied, &all[1..]));
            prop_assert_eq!(contents(&mut fork), emptied);
            prop_assert_eq!(contents(&mut data), model);
        }
    }
}

/// More rows than a chunk holds, most deleted then updated: chunks are compacted (their
/// deleted rows dropped, emptied ones freed) and the index still finds the rows by position.
#[test]
fn rows_keep_their_positions_when_their_chunk_is_compacted() {
    for (keyed, spill) in [(true, false), (false, false), (true, true), (false, true)] {
        let spilling = spill.then(spilling);
        let mut data = table(keyed, spilling.as_ref());
        let mut model = Model::new();
        let n = 20_000;
        let rows: Vec<(i32, i64, i64)> = (0..n).map(|k| (k, i64::from(k), 1)).collect();
        assert!(write(&mut data, &mut model, &rows));
        let deleted: Vec<(i32, i64, i64)> = (0..n)
            .filter(|k| k % 4 != 0)
            .map(|k| (k, i64::from(k), -1))
            .collect();
        assert!(write(&mut data, &mut model, &deleted));
        assert_eq!(contents(&mut data), model);
        // Every survivor updated, one at a time for some (each a single-row write).
        for k in (0..n).filter(|k| k % 4 == 0) {
            let update = [(k, i64::from(k), -1), (k, i64::from(k) + 1, 1)];
            assert!(write(&mut data, &mut model, &update), "{k}");
        }
        assert_eq!(contents(&mut data), model);
        assert_eq!(data.row_count(), n as usize / 4);
        // A retraction of a row the table no longer holds is refused.
        assert!(!write(&mut data, &mut model, &[(0, 0, -1)]));
    }
}

/// Scans between deletions: a scan drops a chunk's deleted rows in place (they are not kept
/// twice), the rows keep their positions, and later deletions, appends to the chunk and its
/// compaction still find the right rows.
#[test]
fn scans_drop_deleted_rows_and_positions_stay() {
    for (keyed, spill) in [(true, false), (false, false), (true, true), (false, true)] {
        let spilling = spill.then(spilling);
        let mut data = table(keyed, spilling.as_ref());
        let mut model = Model::new();
        let n = 12_000i32;
        let rows: Vec<(i32, i64, i64)> = (0..n).map(|k| (k, i64::from(k), 1)).collect();
        assert!(write(&mut data, &mut model, &rows));
        for round in 0..6i32 {
            // A few rows of every chunk go, then a scan, then rows are added to the tail.
            let gone: Vec<(i32, i64, i64)> = model
                .keys()
                .filter(|(k, _)| (k + round) % 7 == 0)
                .map(|&(k, v)| (k, v, -1))
                .collect();
            assert!(write(&mut data, &mut model, &gone), "round {round}");
            assert_eq!(contents(&mut data), model, "round {round}");
            let added: Vec<(i32, i64, i64)> = (0..500)
                .map(|i| (n + round * 500 + i, i64::from(i), 1))
                .collect();
            assert!(write(&mut data, &mut model, &added));
            // Single-row updates land in chunks a scan filtered.
            for k in (0..n).step_by(997) {
                if let Some((&(k, v), _)) = model.iter().find(|((mk, _), _)| *mk == k) {
                    assert!(write(&mut data, &mut model, &[(k, v, -1), (k, v + 1, 1)]));
                }
            }
            assert_eq!(contents(&mut data), model, "round {round}");
        }
        assert_eq!(data.row_count() as i64, model.values().sum::<i64>());
        // Everything retracted, row by row in batches: every position is found.
        let all: Vec<(i32, i64, i64)> = model.iter().map(|(&(k, v), _)| (k, v, -1)).collect();
        for piece in all.chunks(3_000) {
            assert!(write(&mut data, &mut model, piece));
            assert_eq!(contents(&mut data), model);
        }
        assert_eq!(data.row_count(), 0);
    }
}

/// A keyed table finds a row by its primary key while it is at the version a snapshot was
/// taken at; after a write it answers `None` (the caller scans its snapshot instead).
#[test]
fn a_key_lookup_finds_the_row_of_the_snapshot_or_declines() {
    for spill in [false, true] {
        let spilling = spill.then(spilling);
        let mut data = table(true, spilling.as_ref());
        let mut model = Model::new();
        let rows: Vec<(i32, i64, i64)> = (0..5000).map(|k| (k, i64::from(k) * 10, 1)).collect();
        assert!(write(&mut data, &mut model, &rows));
        assert!(write(
            &mut data,
            &mut model,
            &[(7, 70, -1), (7, 71, 1), (8, 80, -1)]
        ));
        assert_eq!(data.spilled().0 > 0, spill);
        let crate::table::TableScan::Rows { version, .. } = data.scan().unwrap() else {
            panic!("a keyed table's rows are in memory");
        };
        let key =
            |k: i32| -> Vec<arrow::array::ArrayRef> { vec![Arc::new(Int32Array::from(vec![k]))] };
        let found = |data: &mut TableData, k: i32| -> Option<Vec<(i32, i64)>> {
            data.lookup(version, &key(k)).unwrap().map(|batches| {
                batches
                    .iter()
                    .flat_map(|b| {
                        let ks = b.column(0).as_primitive::<Int32Type>().clone();
                        let vs = b.column(1).as_primitive::<Int64Type>().clone();
                        (0..b.num_rows()).map(move |i| (ks.value(i), vs.value(i)))
                    })
                    .collect()
            })
        };
        assert_eq!(found(&mut data, 7), Some(vec![(7, 71)]));
        assert_eq!(found(&mut data, 4999), Some(vec![(4999, 49990)]));
        assert_eq!(found(&mut data, 8), Some(vec![]), "deleted");
        assert_eq!(found(&mut data, 5000), Some(vec![]), "never held");
        assert!(write(&mut data, &mut model, &[(9, 90, -1)]));
        assert_eq!(
            found(&mut data, 7),
            None,
            "the table changed since the snapshot"
        );
        // A copy (a transaction's) has a version of its own; an unkeyed table never looks up.
        let mut fork = data.fork().unwrap();
        assert_eq!(fork.lookup(version, &key(7)).unwrap().map(|_| ()), None);
        let mut unkeyed = table(false, None);
        assert!(unkeyed.lookup(version, &key(7)).unwrap().is_none());
    }
}

/// A view's contents held to a memory budget of nothing: their index of rows and their sealed
/// chunks spill to disk at every apply, and the retractions of later epochs (through both of
/// the runtime's paths: check then apply, and the two at once) still find their rows,
/// including rows repeated, in chunks on disk that scans read back and compactions bring back.
#[test]
fn a_views_contents_spill_their_index_and_stay_exact() {
    let dir = tempfile::tempdir().unwrap();
    let budget = eddy_dataflow::spill::MemoryBudget::new(0, &dir.path().join("spill")).unwrap();
    let mut data = TableData::for_view(def(false).schema().unwrap(), Some(&budget));
    let mut model = Model::new();
    let apply = |data: &mut TableData, model: &mut Model, rows: &[(i32, i64, i64)], n: i32| {
        let batch = [changes(rows)];
        if n % 2 == 0 {
            data.check_view_output(&batch).unwrap();
            data.apply(&batch).unwrap();
        } else {
            data.apply_view_output(&batch).unwrap();
        }
        for &(k, v, d) in rows {
            *model.entry((k, v)).or_default() += d;
        }
        model.retain(|_, n| *n != 0);
    };
    let rows: Vec<(i32, i64, i64)> = (0..30_000).map(|k| (k, i64::from(k % 7), 1)).collect();
    apply(&mut data, &mut model, &rows, 0);
    let spilled_files = || {
        std::fs::read_dir(budget.files_dir())
            .into_iter()
            .flatten()
            .flatten()
            .flat_map(|d| std::fs::read_dir(d.path()).into_iter().flatten().flatten())
            .count()
    };
    for round in 1..12i32 {
        // Retract a spread of rows held (every row once, some twice: repeats) and insert others.
        let mut batch: Vec<(i32, i64, i64)> = model
            .iter()
            .filter(|((k, _), _)| (k + round) % 5 == 0)
            .map(|(&(k, v), _)| (k, v, -1))
            .collect();
        batch.extend((0..300).map(|i| (i * 13 % 30_000, i64::from(round), 1)));
        batch.extend((0..50).map(|i| (i, i64::from(i % 7), 1)));
        // What a query was published before the write still reads the rows of then, though
        // chunks it names on disk come back into memory or are freed meanwhile.
        let published = data.view_rows().unwrap();
        let before = model.clone();
        apply(&mut data, &mut model, &batch, round);
        assert_eq!(
            rows_of(&published.batches().unwrap()),
            before,
            "round {round}"
        );
        assert_eq!(contents(&mut data), model, "round {round}");
        assert_eq!(
            rows_of(&data.view_rows().unwrap().batches().unwrap()),
            model
        );
        assert!(
            budget.spilled_keys() > 0,
            "nothing spilled by round {round}"
        );
        // The first retraction made the rows a multiset: its sealed chunks are on disk
        // (until most of their rows are retracted and they are rewritten).
        let files = spilled_files();
        assert!(
            files >= if round == 1 { 3 } else { 1 },
            "{files} chunks on disk"
        );
    }
    // A retraction of a row the view does not hold is still refused.
    assert!(data.check_view_output(&[changes(&[(1, 99, -1)])]).is_err());
    // Everything retracted: chunks on disk are freed with their files.
    let all: Vec<(i32, i64, i64)> = model.iter().map(|(&(k, v), n)| (k, v, -n)).collect();
    apply(&mut data, &mut model, &all, 1);
    assert_eq!(contents(&mut data), model);
    assert_eq!(spilled_files(), 0);
}

/// Connector rows resolved against a table whose rows are on disk (a budget of nothing):
/// upserts replace the rows their keys hold, deletes remove them, inserts of a held key are
/// rejected, retractions find their exact rows — as against the same table in memory.
#[test]
fn connector_rows_resolve_against_rows_on_disk() {
    use eddy_connectors::RowKind;
    for keyed in [true, false] {
        let spilling = spilling();
        let mut outcomes = Vec::new();
        for spill in [None, Some(&spilling)] {
            let mut data = table(keyed, spill);
            let mut model = Model::new();
            let rows: Vec<(i32, i64, i64)> = (0..5_000).map(|k| (k, i64::from(k), 1)).collect();
            assert!(write(&mut data, &mut model, &rows));
            assert_eq!(data.spilled().0 > 0, spill.is_some());
            let incoming = changes(&[
                (7, 700, 1),
                (8, 8, 1),
                (9, 0, 1),
                (10, 10, 1),
                (6_000, 1, 1),
                (4_000, 4_000, 1),
            ]);
            let kinds = [
                RowKind::Upsert,
                RowKind::Delete,
                RowKind::Insert,
                RowKind::Retract,
                RowKind::Insert,
                RowKind::Upsert,
            ];
            let (resolved, rejected) = data.resolve(incoming.rows(), &kinds).unwrap();
            data.check(std::slice::from_ref(&resolved)).unwrap();
            data.apply(std::slice::from_ref(&resolved)).unwrap();
            let rejected: Vec<usize> = rejected.into_iter().map(|(i, _)| i).collect();
            outcomes.push((contents(&mut data), rejected));
        }
        assert!(outcomes[0] == outcomes[1], "keyed: {keyed}");
        let (contents, rejected) = &outcomes[0];
        if keyed {
            // Key 9 is held: its insert is rejected; key 8 deleted, 7 replaced.
            assert_eq!(rejected, &[2]);
            assert_eq!(contents.get(&(7, 700)), Some(&1));
            assert!(!contents.keys().any(|(k, _)| *k == 8));
        }
        assert_eq!(contents.get(&(6_000, 1)), Some(&1));
        assert!(!contents.contains_key(&(10, 10)));
    }
}

/// A commit checks its changes, then applies them without encoding them again; an apply of
/// other changes (a checked commit that never applied, then a replay) applies its own.
#[test]
fn an_apply_after_a_check_of_other_changes_applies_its_own() {
    for keyed in [true, false] {
        let mut data = table(keyed, None);
        let mut model = Model::new();
        assert!(write(&mut data, &mut model, &[(1, 10, 1), (2, 20, 1)]));
        let checked = [changes(&[(1, 10, -1), (1, 11, 1)])];
        data.check(&checked).unwrap();
        let other = [changes(&[(2, 20, -1), (2, 21, 1), (3, 30, 1)])];
        data.apply(&other).unwrap();
        model = Model::from([((1, 10), 1), ((2, 21), 1), ((3, 30), 1)]);
        assert_eq!(contents(&mut data), model);
        // The same changes as arrays of their own: checked again by the apply's own netting.
        let same = [changes(&[(1, 10, -1), (1, 11, 1)])];
        data.check(&same).unwrap();
        data.apply(&same).unwrap();
        model = Model::from([((1, 11), 1), ((2, 21), 1), ((3, 30), 1)]);
        assert_eq!(contents(&mut data), model);
    }
}
