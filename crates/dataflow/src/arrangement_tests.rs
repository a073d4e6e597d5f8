//! The arrangement against a model: a map from (key, row) to (weight, time, expiry).

use std::collections::BTreeMap;

use arrow::array::{Array, RecordBatch};
use proptest::prelude::*;

use super::*;
use crate::checkpoint;

#[derive(Debug, Clone)]
enum Op {
    /// key, row, weight, time, expiry (`None`: never)
    Update(u8, u8, i64, i64, Option<i64>),
    Expire(i64),
    /// Saves (all of it, or its changes) and keeps the batches as a checkpoint's chain of
    /// them; restarts from that chain.
    Save {
        full: bool,
        restart: bool,
    },
    /// Adds to the aux count of (key, row), if held.
    Aux(u8, u8, i64),
    /// Replaces the row of (key, row) by another row, if held and the other is not.
    Replace(u8, u8, u8),
    /// Adds to the weight of (key, row) found by a probe, if held.
    AddWeight(u8, u8, i64),
}

/// (key, row) -> (weight, time, expires, aux)
type Model = BTreeMap<(Vec<u8>, Vec<u8>), (i64, i64, i64, i64)>;

/// Keys and rows of several lengths (rows long enough that the arena gets compacted).
fn key(k: u8) -> Vec<u8> {
    vec![k; 1 + (k % 3) as usize]
}

fn row(r: u8) -> Vec<u8> {
    vec![r; 1 + (r as usize % 5) * 700]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0u8..6, 0u8..12, -2i64..=3, 0i64..100, proptest::option::of(0i64..120))
            .prop_map(|(k, r, w, t, e)| Op::Update(k, r, w, t, e)),
        1 => (0i64..130).prop_map(Op::Expire),
        2 => (any::<bool>(), any::<bool>()).prop_map(|(full, restart)| Op::Save { full, restart }),
        2 => (0u8..6, 0u8..12, -3i64..=3).prop_map(|(k, r, d)| Op::Aux(k, r, d)),
        2 => (0u8..6, 0u8..12, 0u8..12).prop_map(|(k, from, to)| Op::Replace(k, from, to)),
        2 => (0u8..6, 0u8..12, -2i64..=2).prop_map(|(k, r, w)| Op::AddWeight(k, r, w)),
    ]
}

fn apply(model: &mut Model, op: &Op) {
    match op {
        Op::Update(k, r, w, t, e) => {
            let entry = model
                .entry((key(*k), row(*r)))
                .or_insert((0, *t, e.unwrap_or(NEVER), 0));
            entry.0 += w;
            if entry.0 == 0 {
                model.remove(&(key(*k), row(*r)));
            }
        }
        Op::Expire(w) => model.retain(|_, (_, _, expires, _)| *expires > *w),
        Op::Save { .. } => {}
        Op::Aux(k, r, d) => {
            if let Some(entry) = model.get_mut(&(key(*k), row(*r))) {
                entry.3 += d;
            }
        }
        Op::AddWeight(k, r, w) => {
            if let Some(entry) = model.get_mut(&(key(*k), row(*r))) {
                entry.0 += w;
                if entry.0 == 0 {
                    model.remove(&(key(*k), row(*r)));
                }
            }
        }
        Op::Replace(k, from, to) => {
            if !model.contains_key(&(key(*k), row(*to)))
                && let Some(entry) = model.remove(&(key(*k), row(*from)))
            {
                model.insert((key(*k), row(*to)), entry);
            }
        }
    }
}

fn contents(a: &Arrangement) -> Model {
    a.iter()
        .map(|f| {
            (
                (f.key.to_vec(), f.row.to_vec()),
                (f.weight, f.time, 0, f.aux),
            )
        })
        .collect()
}

/// What a checkpoint of `a` holds (spilled keys included).
fn saved(a: &Arrangement) -> Model {
    // Unit tests save in small batches, so that the state of a case takes several.
    a.saved_whole()
        .unwrap()
        .iter()
        .flat_map(saved_batch)
        .collect()
}

/// The batches of a save of `a`.
fn save(a: &mut Arrangement, mode: SaveMode) -> Vec<RecordBatch> {
    let mut out: Vec<(String, RecordBatch)> = Vec::new();
    a.save(mode, "part", &mut out).unwrap();
    out.into_iter().map(|(_, b)| b).collect()
}

fn saved_batch(batch: &RecordBatch) -> Model {
    let keys = checkpoint::binary_column(batch, "key").unwrap();
    let rows = checkpoint::binary_column(batch, "row").unwrap();
    let times = checkpoint::int64_column(batch, "time").unwrap();
    let counts = checkpoint::int64_column(batch, "count").unwrap();
    let aux = checkpoint::int64_column(batch, "aux").unwrap();
    (0..batch.num_rows())
        .map(|i| {
            (
                (keys.value(i).to_vec(), rows.value(i).to_vec()),
                (counts.value(i), times.value(i), 0, aux.value(i)),
            )
        })
        .collect()
}

fn without_expiry(model: &Model) -> Model {
    model
        .iter()
        .map(|(k, (w, t, _, aux))| (k.clone(), (*w, *t, 0, *aux)))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn the_arrangement_equals_a_map_of_weights(ops in proptest::collection::vec(op(), 1..300), spill in proptest::option::of(prop_oneof![Just(0usize), Just(6_000usize)])) {
        // Spilling: a budget of no bytes, so every key goes to disk at each settle; or of a
        // few rows, so some stay and the slots they are in are renumbered as others leave.
        let spilling = spill.map(crate::spill::tests::Spilling::with_limit);
        let new = || {
            let mut a = Arrangement::new();
            if let Some(s) = &spilling {
                a.spill_to(&s.budget);
            }
            a
        };
        let mut a = new();
        let mut model = Model::new();
        let mut chain: Vec<RecordBatch> = Vec::new();
        for op in &ops {
            match op {
                Op::Update(k, r, w, t, e) => {
                    a.update(&key(*k), &row(*r), *t, *w, e.unwrap_or(NEVER)).unwrap();
                }
                Op::Expire(w) => {
                    let before = model.len();
                    apply(&mut model, op);
                    prop_assert_eq!(a.expire(*w).unwrap(), before - model.len());
                    a.settle().unwrap();
                    prop_assert_eq!(saved(&a), without_expiry(&model));
                    continue;
                }
                Op::Save { full, restart } => {
                    let mode = if *full { SaveMode::Full } else { SaveMode::Changes };
                    let out = save(&mut a, mode);
                    if !out.is_empty() && out.iter().all(checkpoint::is_changes) {
                        chain.extend(out);
                    } else {
                        prop_assert!(!out.iter().any(checkpoint::is_changes));
                        chain = out;
                    }
                    if *restart {
                        let mut loaded = new();
                        for batch in &chain {
                            loaded.load(batch).unwrap();
                        }
                        a = loaded;
                    }
                }
                Op::Aux(k, r, d) => {
                    let wanted = row(*r);
                    a.prepare([key(*k).as_slice()]).unwrap();
                    let id = a.probe(&key(*k)).find(|f| f.row == wanted.as_slice()).map(|f| f.id);
                    if let Some(id) = id {
                        let (before, after) = a.add_aux(id, *d);
                        prop_assert_eq!(after, before + d);
                        prop_assert_eq!(a.row(id), wanted.as_slice());
                        prop_assert!(a.weight(id) != 0);
                    }
                }
                Op::AddWeight(k, r, w) => {
                    let wanted = row(*r);
                    a.prepare([key(*k).as_slice()]).unwrap();
                    let id = a.probe(&key(*k)).find(|f| f.row == wanted.as_slice()).map(|f| f.id);
                    if let Some(id) = id {
                        a.add_weight(id, *w);
                    }
                }
                Op::Replace(k, from, to) => {
                    let (from, to) = (row(*from), row(*to));
                    a.prepare([key(*k).as_slice()]).unwrap();
                    let id = a.probe(&key(*k)).find(|f| f.row == from.as_slice()).map(|f| f.id);
                    let taken = a.probe(&key(*k)).any(|f| f.row == to.as_slice());
                    if let Some(id) = id && !taken {
                        let (weight, aux) = (a.weight(id), a.aux(id));
                        a.replace_row(id, &to).unwrap();
                        prop_assert_eq!(a.row(id), to.as_slice());
                        prop_assert_eq!((a.weight(id), a.aux(id)), (weight, aux));
                    }
                }
            }
            apply(&mut model, op);
            if spill.is_none() {
                prop_assert_eq!(contents(&a), without_expiry(&model));
            }
            prop_assert_eq!(saved(&a), without_expiry(&model));
            a.settle().unwrap();
            prop_assert_eq!(saved(&a), without_expiry(&model));
            if let Some(s) = &spilling && spill == Some(0) && !model.is_empty() {
                prop_assert!(a.spilled_rows() > 0 && s.budget.spilled_keys() > 0);
            }
            prop_assert_eq!(a.len(), model.len());
            prop_assert_eq!(a.is_empty(), model.is_empty());
        }
        // Probes: every key's rows, and a time range of them.
        for k in 0u8..6 {
            a.prepare([key(k).as_slice()]).unwrap();
            let mut got: Vec<(Vec<u8>, i64)> =
                a.probe(&key(k)).map(|f| (f.row.to_vec(), f.weight)).collect();
            got.sort();
            let want: Vec<(Vec<u8>, i64)> = model
                .iter()
                .filter(|((mk, _), _)| *mk == key(k))
                .map(|((_, r), (w, _, _, _))| (r.clone(), *w))
                .collect();
            prop_assert_eq!(got, want);
            prop_assert_eq!(a.contains_key(&key(k)), model.keys().any(|(mk, _)| *mk == key(k)));
            let mut ranged: Vec<Vec<u8>> =
                a.probe_range(&key(k), 20, 60).map(|f| f.row.to_vec()).collect();
            ranged.sort();
            let want: Vec<Vec<u8>> = model
                .iter()
                .filter(|((mk, _), (_, t, _, _))| *mk == key(k) && (20..=60).contains(t))
                .map(|((_, r), _)| r.clone())
                .collect();
            prop_assert_eq!(ranged, want);
        }
    }
}

#[test]
fn the_arena_is_compacted_as_rows_go() {
    let mut a = Arrangement::new();
    let big = vec![7u8; 4096];
    for round in 0..50i64 {
        for k in 0..64u32 {
            a.update(&k.to_le_bytes(), &big, round, 1, NEVER).unwrap();
        }
        for k in 0..64u32 {
            a.update(&k.to_le_bytes(), &big, round, -1, NEVER).unwrap();
        }
    }
    assert!(a.is_empty());
    // 50 rounds wrote 13 MB of rows; the arena never held more than about two rounds of it.
    assert!(a.arena.len() <= 2 * 64 * (4096 + 4), "{}", a.arena.len());
    assert!(
        a.arena.capacity() <= 4 * 64 * (4096 + 4),
        "{}",
        a.arena.capacity()
    );
}

#[test]
fn a_slot_reused_before_its_old_expiry_is_kept_until_its_own() {
    let mut a = Arrangement::new();
    a.update(b"k", b"old", 1, 1, 10).unwrap();
    a.update(b"k", b"old", 1, -1, 10).unwrap();
    // The freed slot goes to a row that expires later; the old heap item must not take it.
    a.update(b"k", b"new", 5, 1, 50).unwrap();
    assert_eq!(a.expire(20).unwrap(), 0);
    assert_eq!(a.len(), 1);
    assert_eq!(a.expire(50).unwrap(), 1);
    assert!(a.is_empty());
}

#[test]
fn spilled_keys_leave_memory_entirely() {
    let spilling = crate::spill::tests::Spilling::with_limit(0);
    let mut a = Arrangement::new();
    a.spill_to(&spilling.budget);
    let key = |k: u32| k.to_be_bytes();
    for k in 0..10_000u32 {
        let expires = if k % 2 == 0 { NEVER } else { i64::from(k) };
        a.update(&key(k), b"row", 0, 1, expires).unwrap();
    }
    a.settle().unwrap();
    // Nothing of a spilled key stays: no slot (the vacated ones are given back), no bucket,
    // no bytes.
    assert_eq!((a.keys.len(), a.entries.len()), (0, 0));
    assert!(a.key_table.is_empty() && a.entry_table.is_empty());
    assert_eq!(a.resident_bytes(a.spilled_rows()), 0);
    assert_eq!((a.len(), a.spilled_rows()), (10_000, 10_000));
    // A prepared key comes back with its row; a key never seen stays absent.
    a.prepare([key(4).as_slice(), key(20_000).as_slice()])
        .unwrap();
    assert_eq!(
        a.probe(&key(4)).map(|f| f.row).collect::<Vec<_>>(),
        [b"row"]
    );
    assert_eq!(a.probe(&key(20_000)).count(), 0);
    // An update of a key not prepared finds its row on disk rather than start it anew.
    a.update(&key(6), b"row", 0, -1, NEVER).unwrap();
    a.update(&key(8), b"row", 0, 1, NEVER).unwrap();
    a.settle().unwrap();
    assert_eq!(a.len(), 9_999);
    // Spilled rows expire at their watermark: odd keys up to 99.
    assert_eq!(a.expire(100).unwrap(), 50);
    assert_eq!(a.len(), 9_949);
    a.settle().unwrap();
    let saved = save(&mut a, SaveMode::Full);
    assert!(saved.len() > 10, "{} batches", saved.len());
    let rows: usize = saved.iter().map(|b| b.num_rows()).sum();
    let count: i64 = saved
        .iter()
        .flat_map(|b| {
            checkpoint::int64_column(b, "count")
                .unwrap()
                .iter()
                .flatten()
        })
        .sum();
    assert_eq!((rows, count), (9_949, 9_950));
}

#[test]
fn a_save_of_changes_holds_only_the_changed_keys() {
    for spill in [false, true] {
        let spilling = crate::spill::tests::Spilling::with_limit(0);
        let mut a = Arrangement::new();
        if spill {
            a.spill_to(&spilling.budget);
        }
        let key = |k: u32| k.to_be_bytes();
        for k in 0..10_000u32 {
            a.update(&key(k), b"row", 0, 1, NEVER).unwrap();
        }
        a.settle().unwrap();
        let full = save(&mut a, SaveMode::Changes);
        assert!(
            !full.iter().any(checkpoint::is_changes),
            "a first save is whole"
        );
        assert_eq!(full.iter().map(|b| b.num_rows()).sum::<usize>(), 10_000);
        // Nothing changed: one batch of changes without rows.
        let none = save(&mut a, SaveMode::Changes);
        assert!(none.iter().all(checkpoint::is_changes));
        assert_eq!(none.iter().map(|b| b.num_rows()).sum::<usize>(), 0);
        // Three keys change (one twice, one removed, one new): three markers, two rows.
        for k in [1, 2] {
            a.prepare([key(k).as_slice()]).unwrap();
        }
        a.update(&key(1), b"other", 0, 1, NEVER).unwrap();
        a.update(&key(1), b"other", 0, -1, NEVER).unwrap();
        a.update(&key(2), b"row", 0, -1, NEVER).unwrap();
        a.update(&key(20_000), b"row", 0, 1, NEVER).unwrap();
        a.settle().unwrap();
        let changes = save(&mut a, SaveMode::Changes);
        assert!(changes.iter().all(checkpoint::is_changes));
        let mut rows: Vec<(Vec<u8>, Option<Vec<u8>>)> = changes
            .iter()
            .flat_map(|b| {
                let keys = checkpoint::binary_column(b, "key").unwrap();
                let rows = checkpoint::binary_column(b, "row").unwrap();
                (0..b.num_rows())
                    .map(|i| {
                        (
                            keys.value(i).to_vec(),
                            rows.is_valid(i).then(|| rows.value(i).to_vec()),
                        )
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        // Keys in any order (those not in memory come last), each key's marker first.
        rows.sort_by(|a, b| a.0.cmp(&b.0));
        let marker = |k: u32| (key(k).to_vec(), None);
        let kept = |k: u32| (key(k).to_vec(), Some(b"row".to_vec()));
        assert_eq!(
            rows,
            [marker(1), kept(1), marker(2), marker(20_000), kept(20_000)],
            "spill: {spill}"
        );
        // The chain loads to the state.
        let mut loaded = Arrangement::new();
        for batch in full.iter().chain(&none).chain(&changes) {
            loaded.load(batch).unwrap();
        }
        assert_eq!(loaded.len(), 10_000);
        loaded
            .prepare([key(2).as_slice(), key(20_000).as_slice()])
            .unwrap();
        assert_eq!(loaded.probe(&key(2)).count(), 0);
        assert_eq!(loaded.probe(&key(20_000)).count(), 1);
        // Changing most keys makes the next save whole again.
        for k in 3..9_000u32 {
            a.prepare([key(k).as_slice()]).unwrap();
            a.update(&key(k), b"row", 0, 1, NEVER).unwrap();
        }
        a.settle().unwrap();
        let whole = save(&mut a, SaveMode::Changes);
        assert!(!whole.iter().any(checkpoint::is_changes));
    }
}

/// What a save leaves to a job (spilled keys, of a whole save and of a save of changes) is
/// read as the spill store was at the save, though the arrangement changed, faulted keys in
/// and spilled them again before the job ran.
#[test]
fn deferred_saves_read_the_spill_store_as_it_was_at_the_save() {
    let spilling = crate::spill::tests::Spilling::with_limit(0);
    let mut a = Arrangement::new();
    a.spill_to(&spilling.budget);
    let key = |k: u32| k.to_be_bytes();
    let set = |a: &mut Arrangement, keys: std::ops::Range<u32>, old: &[u8], new: &[u8]| {
        for k in keys {
            a.prepare([key(k).as_slice()]).unwrap();
            a.update(&key(k), old, 0, -1, NEVER).unwrap();
            a.update(&key(k), new, 0, 1, NEVER).unwrap();
        }
        a.settle().unwrap();
    };
    for k in 0..1000u32 {
        a.update(&key(k), b"v1", 0, 1, NEVER).unwrap();
    }
    a.settle().unwrap();
    let mut whole = checkpoint::Later::default();
    a.save(SaveMode::Full, "part", &mut whole).unwrap();
    assert!(
        !whole.deferred.is_empty(),
        "no spilled key was left to a job"
    );
    set(&mut a, 0..10, b"v1", b"v2");
    let mut changes = checkpoint::Later::default();
    a.save(SaveMode::Changes, "part", &mut changes).unwrap();
    assert!(
        !changes.deferred.is_empty(),
        "no changed key was left to a job"
    );
    // The arrangement goes on before the jobs run.
    set(&mut a, 0..10, b"v2", b"v3");
    set(&mut a, 500..600, b"v1", b"v3");
    let mut loaded = Arrangement::new();
    for (_, batch) in whole.finish().iter().chain(&changes.finish()) {
        loaded.load(batch).unwrap();
    }
    assert_eq!(loaded.len(), 1000);
    for k in 0..1000u32 {
        let rows: Vec<Vec<u8>> = loaded.probe(&key(k)).map(|f| f.row.to_vec()).collect();
        let want: &[u8] = if k < 10 { b"v2" } else { b"v1" };
        assert_eq!(rows, [want.to_vec()], "key {k}");
    }
}

/// A copy of an arrangement with keys on disk (a transaction's copy of a table) reads them as
/// they were when it was made, whatever its original does after (even dropped), and keeps its
/// own changes to them.
#[test]
fn a_copy_reads_the_keys_its_original_had_on_disk() {
    let spilling = crate::spill::tests::Spilling::with_limit(0);
    let mut a = Arrangement::new();
    a.spill_to(&spilling.budget);
    let key = |k: u32| k.to_be_bytes();
    let rows = |a: &Arrangement, k: u32| -> Vec<Vec<u8>> {
        let mut rows: Vec<Vec<u8>> = a.probe(&key(k)).map(|f| f.row.to_vec()).collect();
        rows.sort();
        rows
    };
    for k in 0..1000u32 {
        a.update(&key(k), b"v1", 0, 1, NEVER).unwrap();
    }
    a.settle().unwrap();
    assert_eq!(a.spilled_rows(), 1000);
    let mut copy = a.clone();
    assert_eq!((copy.len(), copy.spilled_rows()), (1000, 1000));
    // A key that was never held may be probed unprepared: nothing of it is on disk.
    assert_eq!(copy.probe(&key(5_000)).count(), 0);
    copy.settle().unwrap();
    // The original goes on: keys come back, change and go to disk again.
    for k in 0..100u32 {
        a.prepare([key(k).as_slice()]).unwrap();
        a.update(&key(k), b"v1", 0, -1, NEVER).unwrap();
        a.update(&key(k), b"v2", 0, 1, NEVER).unwrap();
    }
    a.settle().unwrap();
    // The copy sees the rows as they were, brought into its memory as it asks for them.
    let asked: Vec<[u8; 4]> = (0..200u32).map(key).collect();
    copy.prepare(asked.iter().map(|k| k.as_slice())).unwrap();
    for k in 0..200u32 {
        assert_eq!(rows(&copy, k), [b"v1".to_vec()], "key {k}");
    }
    assert_eq!(copy.spilled_rows(), 800);
    // Its own changes: a key emptied stays empty (not read from disk again); an update of a
    // key not prepared brings the key first.
    copy.update(&key(5), b"v1", 0, -1, NEVER).unwrap();
    copy.prepare([key(5).as_slice()]).unwrap();
    assert!(rows(&copy, 5).is_empty());
    copy.update(&key(600), b"mine", 0, 1, NEVER).unwrap();
    copy.settle().unwrap();
    assert_eq!(rows(&copy, 600), [b"mine".to_vec(), b"v1".to_vec()]);
    assert_eq!(copy.len(), 1000);
    // The original is untouched by the copy.
    a.prepare(asked.iter().map(|k| k.as_slice())).unwrap();
    for k in 0..200u32 {
        let want: &[u8] = if k < 100 { b"v2" } else { b"v1" };
        assert_eq!(rows(&a, k), [want.to_vec()], "key {k}");
    }
    a.prepare([key(600).as_slice()]).unwrap();
    assert_eq!(rows(&a, 600), [b"v1".to_vec()]);
    // A copy of the copy, after the original (and its keys on disk) is gone.
    drop(a);
    let mut second = copy.clone();
    second
        .prepare([key(5).as_slice(), key(600).as_slice(), key(700).as_slice()])
        .unwrap();
    assert!(rows(&second, 5).is_empty());
    assert_eq!(rows(&second, 600), [b"mine".to_vec(), b"v1".to_vec()]);
    assert_eq!(rows(&second, 700), [b"v1".to_vec()]);
    // A copy missing rows of its original's disk is never saved as if it were whole.
    let mut out = checkpoint::Later::default();
    assert!(second.save(SaveMode::Full, "part", &mut out).is_err());
}
