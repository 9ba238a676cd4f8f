//! Model-based test: whole transactions over three tables (aborts
//! included) against a plain `BTreeMap` model, checking every query kind on
//! every index, inside the transaction and after it. Tables `a` and `b` have
//! a unique secondary index (writes look the old object up first); `c` has
//! only non-unique ones (a plain insert learns the old object from its
//! primary-index write).

use std::collections::BTreeMap;

use crate::common::*;
use proptest::prelude::*;
use statedb::{Error, TxnRead};

const NAMES: &[&str] = &["", "a", "a\0", "a\0b", "ab", "b", "\0", "\0\0"];
const TAGS: &[&str] = &["x", "x\0", "xy", "", "\0", "y"];

#[derive(Clone, Debug)]
enum Op {
    Insert(usize, Obj),
    Modify(usize, Obj),
    Delete(usize, u32),
    DeleteAll(usize),
    /// Compare-and-swap with the current revision (true) or a wrong one.
    Cas(usize, Obj, bool),
    CasDelete(usize, u32, bool),
}

#[derive(Clone, Debug)]
struct TxnPlan {
    lock: Vec<usize>,
    ops: Vec<Op>,
    abort: bool,
}

fn arb_obj() -> impl Strategy<Value = Obj> {
    (
        0u32..8,
        prop::sample::select(NAMES),
        prop::collection::vec(prop::sample::select(TAGS), 0..3),
        -3i16..3,
    )
        .prop_map(|(id, n, tags, g)| obj(id, n, &tags, g))
}

fn arb_op() -> impl Strategy<Value = Op> {
    let t = 0usize..3;
    prop_oneof![
        4 => (t.clone(), arb_obj()).prop_map(|(t, o)| Op::Insert(t, o)),
        2 => (t.clone(), arb_obj()).prop_map(|(t, o)| Op::Modify(t, o)),
        2 => (t.clone(), 0u32..8).prop_map(|(t, i)| Op::Delete(t, i)),
        1 => t.clone().prop_map(Op::DeleteAll),
        1 => (t.clone(), arb_obj(), any::<bool>()).prop_map(|(t, o, ok)| Op::Cas(t, o, ok)),
        1 => (t, 0u32..8, any::<bool>()).prop_map(|(t, i, ok)| Op::CasDelete(t, i, ok)),
    ]
}

fn arb_txn() -> impl Strategy<Value = TxnPlan> {
    (
        prop::sample::select(vec![
            vec![0],
            vec![1],
            vec![2],
            vec![0, 1],
            vec![1, 0, 1],
            vec![2, 0],
            vec![0, 1, 2],
        ]),
        prop::collection::vec(arb_op(), 1..10),
        prop::bool::weighted(0.2),
    )
        .prop_map(|(lock, ops, abort)| TxnPlan { lock, ops, abort })
}

#[derive(Clone, Debug)]
struct Model {
    objs: BTreeMap<u32, (Obj, u64)>,
    /// Revision at which each live object was created.
    created: BTreeMap<u32, u64>,
    rev: u64,
    /// The table has the unique `name` index.
    unique_names: bool,
}

impl Model {
    fn new(unique_names: bool) -> Self {
        Model {
            objs: BTreeMap::new(),
            created: BTreeMap::new(),
            rev: 0,
            unique_names,
        }
    }

    fn name_taken(&self, o: &Obj) -> bool {
        self.objs
            .values()
            .any(|(x, _)| x.name == o.name && x.id != o.id)
    }

    fn remove(&mut self, id: u32) -> bool {
        self.created.remove(&id);
        self.objs.remove(&id).is_some()
    }

    fn put(&mut self, o: Obj) -> Result<(), Error> {
        if self.unique_names && self.name_taken(&o) {
            return Err(Error::UniqueConflict {
                table: String::new(),
                index: "name".into(),
            });
        }
        self.rev += 1;
        self.created.entry(o.id).or_insert(self.rev);
        self.objs.insert(o.id, (o, self.rev));
        Ok(())
    }
}

fn merge(old: &Obj, mut new: Obj) -> Obj {
    let mut tags = old.tags.clone();
    tags.append(&mut new.tags);
    new.tags = tags;
    new
}

/// Compares errors by variant only (messages carry table names).
fn same_err(a: &Error, b: &Error) -> bool {
    std::mem::discriminant(a) == std::mem::discriminant(b)
}

/// The ids a query returned, in order.
fn ids<'a>(it: statedb::Result<impl Iterator<Item = &'a statedb::Obj<Obj>>>) -> Vec<u32> {
    it.unwrap().map(|o| o.id).collect()
}

/// Checks every query kind; revision order only if `revisions` (a table
/// never read in revision order has no revision index: its writes skip it).
fn check(f: &Fixture, txn: &impl TxnRead, m: &Model, revisions: bool) {
    let t = &f.table;
    assert_eq!(t.len(txn).unwrap(), m.objs.len());
    assert_eq!(t.revision(txn).unwrap(), m.rev);
    // all, primary get/list
    assert_eq!(ids(t.all(txn)), m.objs.keys().copied().collect::<Vec<_>>());
    for id in 0..8u32 {
        let got = t.get(txn, &f.by_id, &id).unwrap();
        let want = m.objs.get(&id);
        assert_eq!(
            got.map(|o| (o.value().clone(), o.revision())),
            want.cloned()
        );
        assert_eq!(
            got.map(|o| o.created_revision()),
            m.created.get(&id).copied(),
            "created revision of {id}"
        );
        assert_eq!(
            ids(t.list(txn, &f.by_id, &id)).len(),
            want.is_some() as usize
        );
    }
    // Primary lower bound.
    for id in 0..9u32 {
        let want: Vec<u32> = m.objs.range(id..).map(|(k, _)| *k).collect();
        assert_eq!(ids(t.lower_bound(txn, &f.by_id, &id)), want);
    }
    // Unique secondary: get, list, prefix, lower bound.
    if m.unique_names {
        check_names(f, txn, m);
    } else {
        assert!(matches!(
            t.get(txn, &f.by_name, ""),
            Err(Error::IndexNotInTable { .. })
        ));
    }
    check_non_unique(f, txn, m);
    if revisions {
        check_revisions(f, txn, m);
    }
}

fn check_names(f: &Fixture, txn: &impl TxnRead, m: &Model) {
    let t = &f.table;
    let mut by_name: Vec<(&str, u32)> = m
        .objs
        .values()
        .map(|(o, _)| (o.name.as_str(), o.id))
        .collect();
    by_name.sort();
    for n in NAMES {
        let want: Vec<u32> = by_name
            .iter()
            .filter(|(x, _)| x == n)
            .map(|x| x.1)
            .collect();
        assert_eq!(
            t.get(txn, &f.by_name, *n).unwrap().map(|o| o.id),
            want.first().copied()
        );
        assert_eq!(ids(t.list(txn, &f.by_name, *n)), want);
        let want: Vec<u32> = by_name
            .iter()
            .filter(|(x, _)| x.starts_with(n))
            .map(|x| x.1)
            .collect();
        assert_eq!(
            ids(t.prefix(txn, &f.by_name, *n)),
            want,
            "name prefix {n:?}"
        );
        let want: Vec<u32> = by_name
            .iter()
            .filter(|(x, _)| x >= n)
            .map(|x| x.1)
            .collect();
        assert_eq!(
            ids(t.lower_bound(txn, &f.by_name, *n)),
            want,
            "name lb {n:?}"
        );
    }
}

fn check_non_unique(f: &Fixture, txn: &impl TxnRead, m: &Model) {
    let t = &f.table;
    // Non-unique multi-key: entries (tag, id), each tag once per object.
    let mut by_tag: Vec<(&str, u32)> = Vec::new();
    for (o, _) in m.objs.values() {
        let mut tags: Vec<&str> = o.tags.iter().map(|s| s.as_str()).collect();
        tags.sort();
        tags.dedup();
        by_tag.extend(tags.into_iter().map(|tg| (tg, o.id)));
    }
    by_tag.sort();
    for tg in TAGS {
        let want: Vec<u32> = by_tag
            .iter()
            .filter(|(x, _)| x == tg)
            .map(|x| x.1)
            .collect();
        assert_eq!(ids(t.list(txn, &f.by_tag, *tg)), want, "tag list {tg:?}");
        assert_eq!(
            t.get(txn, &f.by_tag, *tg).unwrap().map(|o| o.id),
            want.first().copied()
        );
        let want: Vec<u32> = by_tag
            .iter()
            .filter(|(x, _)| x.starts_with(tg))
            .map(|x| x.1)
            .collect();
        assert_eq!(
            ids(t.prefix(txn, &f.by_tag, *tg)),
            want,
            "tag prefix {tg:?}"
        );
        let want: Vec<u32> = by_tag
            .iter()
            .filter(|(x, _)| x >= tg)
            .map(|x| x.1)
            .collect();
        assert_eq!(
            ids(t.lower_bound(txn, &f.by_tag, *tg)),
            want,
            "tag lb {tg:?}"
        );
    }
    // Non-unique single-key with signed keys.
    let mut by_group: Vec<(i16, u32)> = m.objs.values().map(|(o, _)| (o.group, o.id)).collect();
    by_group.sort();
    for g in -4i16..4 {
        let want: Vec<u32> = by_group
            .iter()
            .filter(|(x, _)| *x == g)
            .map(|x| x.1)
            .collect();
        assert_eq!(ids(t.list(txn, &f.by_group, &g)), want);
        let want: Vec<u32> = by_group
            .iter()
            .filter(|(x, _)| *x >= g)
            .map(|x| x.1)
            .collect();
        assert_eq!(
            ids(t.lower_bound(txn, &f.by_group, &g)),
            want,
            "group lb {g}"
        );
    }
}

fn check_revisions(f: &Fixture, txn: &impl TxnRead, m: &Model) {
    let t = &f.table;
    let mut by_rev: Vec<(u64, u32)> = m.objs.values().map(|(o, r)| (*r, o.id)).collect();
    by_rev.sort();
    for from in [0, 1, m.rev / 2, m.rev, m.rev + 1] {
        let want: Vec<u32> = by_rev
            .iter()
            .filter(|(r, _)| *r >= from)
            .map(|x| x.1)
            .collect();
        assert_eq!(ids(t.list_revision(txn, from)), want);
    }
}

fn apply(f: &Fixture, w: &mut statedb::WriteTxn, m: &mut Model, op: &Op, locked: bool) {
    let t = &f.table;
    let (res, want): (Result<(), Error>, Result<(), Error>) = match op {
        Op::Insert(_, o) => (t.insert(w, o.clone()).map(|_| ()), m.put(o.clone())),
        Op::Modify(_, o) => {
            let merged = match m.objs.get(&o.id) {
                Some((old, _)) => merge(old, o.clone()),
                None => o.clone(),
            };
            (t.modify(w, o.clone(), merge).map(|_| ()), m.put(merged))
        }
        Op::Delete(_, id) => {
            let r = t.delete(w, &obj(*id, "", &[], 0)).map(|_| ());
            if m.remove(*id) {
                m.rev += 1;
            }
            (r, Ok(()))
        }
        Op::DeleteAll(_) => {
            let r = t.delete_all(w).map(|_| ());
            m.rev += m.objs.len() as u64;
            m.objs.clear();
            m.created.clear();
            (r, Ok(()))
        }
        Op::Cas(_, o, ok) => {
            let cur = m.objs.get(&o.id).map(|x| x.1);
            let rev = match (cur, ok) {
                (Some(r), true) => r,
                (Some(r), false) => r + 100,
                (None, _) => 1,
            };
            let want = match cur {
                None => Err(Error::ObjectNotFound),
                Some(r) if r != rev => Err(Error::RevisionMismatch {
                    expected: rev,
                    found: r,
                }),
                Some(_) => m.put(o.clone()),
            };
            (t.compare_and_swap(w, rev, o.clone()).map(|_| ()), want)
        }
        Op::CasDelete(_, id, ok) => {
            let cur = m.objs.get(id).map(|x| x.1);
            let rev = match (cur, ok) {
                (Some(r), true) => r,
                (Some(r), false) => r + 100,
                (None, _) => 1,
            };
            let want = match cur {
                None => Err(Error::ObjectNotFound),
                Some(r) if r != rev => Err(Error::RevisionMismatch {
                    expected: rev,
                    found: r,
                }),
                Some(_) => {
                    m.remove(*id);
                    m.rev += 1;
                    Ok(())
                }
            };
            (
                t.compare_and_delete(w, rev, &obj(*id, "", &[], 0))
                    .map(|_| ()),
                want,
            )
        }
    };
    match (&res, &want) {
        (Ok(()), Ok(())) => {}
        (Err(a), Err(b)) if same_err(a, b) => {}
        _ => panic!("op {op:?} (locked {locked}): got {res:?}, model {want:?}"),
    }
}

fn table_of(op: &Op) -> usize {
    match op {
        Op::Insert(t, _)
        | Op::Modify(t, _)
        | Op::Delete(t, _)
        | Op::DeleteAll(t)
        | Op::Cas(t, _, _)
        | Op::CasDelete(t, _, _) => *t,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn transactions_match_model(txns in prop::collection::vec(arb_txn(), 1..8)) {
        let db = db_no_gc();
        // Same operations on both key layouts.
        let fs = [
            table_with(&db, "a", statedb::KeyLayout::Bytes),
            table_with(&db, "b", statedb::KeyLayout::Nibbles),
            table_without_unique(&db, "c"),
        ];
        let mut models = [Model::new(true), Model::new(true), Model::new(false)];
        for plan in &txns {
            let locks: Vec<&dyn statedb::AnyTable> =
                plan.lock.iter().map(|&i| &fs[i].table as &dyn statedb::AnyTable).collect();
            let snap = db.read_txn();
            let watches: Vec<Vec<(u32, statedb::Watch)>> = fs
                .iter()
                .map(|f| {
                    (0..8u32)
                        .map(|id| (id, f.table.get_watch(&snap, &f.by_id, &id).unwrap().1))
                        .collect()
                })
                .collect();
            let mut w = db.write_txn(&locks).unwrap();
            let mut working = models.clone();
            for op in &plan.ops {
                let ti = table_of(op);
                if !plan.lock.contains(&ti) {
                    let e = fs[ti].table.insert(&mut w, obj(0, "", &[], 0)).unwrap_err();
                    prop_assert!(matches!(e, Error::TableNotLocked(_)));
                    continue;
                }
                apply(&fs[ti], &mut w, &mut working[ti], op, true);
            }
            // The transaction sees its own writes.
            for i in 0..fs.len() {
                check(&fs[i], &w, &working[i], i != 2);
            }
            let before = db.read_txn();
            if plan.abort {
                drop(w);
                for (i, ws) in watches.iter().enumerate() {
                    for (id, w) in ws {
                        prop_assert!(!w.is_closed(), "abort fired table {} id {}", i, id);
                    }
                }
            } else {
                let r = w.commit().unwrap();
                // Point-get watches fire exactly for the objects whose value or
                // revision changed (and for every missing key that appeared).
                for (i, ws) in watches.iter().enumerate() {
                    for (id, w) in ws {
                        let old = models[i].objs.get(id);
                        let new = working[i].objs.get(id);
                        if old != new {
                            prop_assert!(w.is_closed(), "table {} id {} changed, no fire", i, id);
                        } else if old.is_some() {
                            prop_assert!(!w.is_closed(), "table {} id {} unchanged, fired", i, id);
                        }
                    }
                }
                models = working;
                for i in 0..fs.len() {
                    check(&fs[i], &r, &models[i], i != 2);
                }
            }
            let r = db.read_txn();
            for i in 0..fs.len() {
                check(&fs[i], &r, &models[i], i != 2);
            }
            drop(before);
        }
        // Table c was never read in revision order: read it (from its
        // objects, sorted), then write it once (which builds its revision
        // index) and read it again (from the index).
        check(&fs[2], &db.read_txn(), &models[2], true);
        let mut w = db.write_txn(&[&fs[2].table]).unwrap();
        apply(&fs[2], &mut w, &mut models[2], &Op::Delete(2, 0), true);
        check(&fs[2], &w, &models[2], true);
        w.commit().unwrap();
        check(&fs[2], &db.read_txn(), &models[2], true);
    }
}
