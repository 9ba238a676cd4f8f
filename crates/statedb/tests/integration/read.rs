//! The bound view of `Table::read`: every query answers as the checked
//! query on `Table` does (the same objects, by address), in snapshots and
//! in write transactions, on both key layouts; misuse is reported when
//! binding; a key too long to be stored finds nothing; an index of another
//! table panics.

use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::common::*;
use proptest::prelude::*;
use statedb::{Error, Index, KeyLayout, ReadTxn, Table, TableRead, TxnRead};

type Found<'a> = Option<&'a statedb::Obj<Obj>>;

/// Addresses of the objects a query returned, in order: two queries agree
/// only if they return the very same stored objects.
fn addrs<'a>(it: impl Iterator<Item = &'a statedb::Obj<Obj>>) -> Vec<usize> {
    it.map(|o| &**o as *const _ as usize).collect()
}

fn addr(o: Found<'_>) -> Option<usize> {
    o.map(|o| &**o as *const _ as usize)
}

/// Query keys for every index of the fixture.
#[derive(Clone, Debug)]
struct Keys {
    ids: Vec<u32>,
    names: Vec<String>,
    tags: Vec<String>,
    groups: Vec<i16>,
}

/// Short strings over a small alphabet (with 0x00, which non-unique
/// indexes escape), so queries often hit, share prefixes and miss.
fn arb_str() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(vec!['a', 'b', '\0']), 0..4)
        .prop_map(String::from_iter)
}

fn arb_obj() -> impl Strategy<Value = Obj> {
    (
        0u32..40,
        arb_str(),
        prop::collection::vec(arb_str(), 0..3),
        -3i16..3,
    )
        .prop_map(|(id, name, tags, group)| Obj {
            id,
            name,
            tags,
            group,
        })
}

fn arb_keys() -> impl Strategy<Value = Keys> {
    (
        prop::collection::vec(0u32..48, 0..8),
        prop::collection::vec(arb_str(), 0..8),
        prop::collection::vec(arb_str(), 0..8),
        prop::collection::vec(-4i16..4, 0..4),
    )
        .prop_map(|(ids, names, tags, groups)| Keys {
            ids,
            names,
            tags,
            groups,
        })
}

/// Every query of the view of `f.table` in `txn` against the checked one.
fn same_answers<X: TxnRead>(f: &Fixture, txn: &X, keys: &Keys) {
    let t = &f.table;
    let v = t.read(txn).unwrap();
    assert_eq!(v.name(), t.name());
    assert_eq!(v.len(), t.len(txn).unwrap());
    assert_eq!(v.is_empty(), t.is_empty(txn).unwrap());
    assert_eq!(v.revision(), t.revision(txn).unwrap());
    assert_eq!(v.graveyard_len(), t.graveyard_len(txn).unwrap());
    assert_eq!(v.initialized(), t.initialized(txn).unwrap());
    assert_eq!(addrs(v.all()), addrs(t.all(txn).unwrap()));
    for from in [0, 1, v.revision() / 2, v.revision() + 1] {
        assert_eq!(
            addrs(v.list_revision(from)),
            addrs(t.list_revision(txn, from).unwrap())
        );
    }
    fn index<X: TxnRead, K, Q>(
        t: &Table<Obj>,
        v: &TableRead<'_, Obj, X>,
        txn: &X,
        idx: &Index<Obj, K>,
        key: &Q,
    ) where
        K: std::borrow::Borrow<Q>,
        Q: statedb::Key + ?Sized,
    {
        let name = idx.name();
        assert_eq!(
            addr(v.get(idx, key)),
            addr(t.get(txn, idx, key).unwrap()),
            "get {name}"
        );
        assert_eq!(
            addrs(v.list(idx, key)),
            addrs(t.list(txn, idx, key).unwrap()),
            "list {name}"
        );
        assert_eq!(
            addrs(v.prefix(idx, key)),
            addrs(t.prefix(txn, idx, key).unwrap()),
            "prefix {name}"
        );
        assert_eq!(
            addrs(v.lower_bound(idx, key)),
            addrs(t.lower_bound(txn, idx, key).unwrap()),
            "lower_bound {name}"
        );
    }
    for id in &keys.ids {
        index(t, &v, txn, &f.by_id, id);
    }
    for n in &keys.names {
        index(t, &v, txn, &f.by_name, n.as_str());
    }
    for tag in &keys.tags {
        index(t, &v, txn, &f.by_tag, tag.as_str());
    }
    for g in &keys.groups {
        index(t, &v, txn, &f.by_group, g);
    }
}

/// The watch variants of the view of a snapshot against the checked ones:
/// the same objects, and watches alike open or closed.
fn same_watch_answers(f: &Fixture, r: &ReadTxn, keys: &Keys) {
    let t = &f.table;
    let v = t.read(r).unwrap();
    let (a, wa) = v.all_watch();
    let (b, wb) = t.all_watch(r).unwrap();
    assert_eq!((addrs(a), wa.is_closed()), (addrs(b), wb.is_closed()));
    let (a, wa) = v.list_revision_watch(1);
    let (b, wb) = t.list_revision_watch(r, 1).unwrap();
    assert_eq!((addrs(a), wa.is_closed()), (addrs(b), wb.is_closed()));
    let (a, wa) = v.initialized_watch();
    let (b, wb) = t.initialized_watch(r).unwrap();
    assert_eq!((a, wa.is_closed()), (b, wb.is_closed()));
    fn index<K, Q>(
        t: &Table<Obj>,
        v: &TableRead<'_, Obj>,
        r: &ReadTxn,
        idx: &Index<Obj, K>,
        key: &Q,
    ) where
        K: std::borrow::Borrow<Q>,
        Q: statedb::Key + ?Sized,
    {
        let name = idx.name();
        let (a, wa) = v.get_watch(idx, key);
        let (b, wb) = t.get_watch(r, idx, key).unwrap();
        assert_eq!(
            (addr(a), wa.is_closed()),
            (addr(b), wb.is_closed()),
            "{name}"
        );
        let (a, wa) = v.list_watch(idx, key);
        let (b, wb) = t.list_watch(r, idx, key).unwrap();
        assert_eq!((addrs(a), wa.is_closed()), (addrs(b), wb.is_closed()));
        let (a, wa) = v.prefix_watch(idx, key);
        let (b, wb) = t.prefix_watch(r, idx, key).unwrap();
        assert_eq!((addrs(a), wa.is_closed()), (addrs(b), wb.is_closed()));
        let (a, wa) = v.lower_bound_watch(idx, key);
        let (b, wb) = t.lower_bound_watch(r, idx, key).unwrap();
        assert_eq!((addrs(a), wa.is_closed()), (addrs(b), wb.is_closed()));
    }
    for id in &keys.ids {
        index(t, &v, r, &f.by_id, id);
    }
    for n in &keys.names {
        index(t, &v, r, &f.by_name, n.as_str());
    }
    for tag in &keys.tags {
        index(t, &v, r, &f.by_tag, tag.as_str());
    }
    for g in &keys.groups {
        index(t, &v, r, &f.by_group, g);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// A populated table (some writes refused by the unique name index),
    /// then a write transaction with more writes and deletes, uncommitted:
    /// the view and the checked queries agree in the snapshot, in the
    /// write transaction and, with watches, in the snapshot again.
    #[test]
    fn view_answers_as_checked_queries(
        nibbles in any::<bool>(),
        objs in prop::collection::vec(arb_obj(), 0..40),
        more in prop::collection::vec(arb_obj(), 0..8),
        deleted in prop::collection::vec(0u32..40, 0..6),
        keys in arb_keys(),
    ) {
        let layout = if nibbles { KeyLayout::Nibbles } else { KeyLayout::Bytes };
        let f = table_with(&db_no_gc(), "objs", layout);
        let mut w = f.db.write_txn(&[&f.table]).unwrap();
        for o in objs {
            // A name another object holds is refused; the rest is written.
            let _ = f.table.insert(&mut w, o);
        }
        let r = w.commit().unwrap();
        same_answers(&f, &r, &keys);

        let mut w = f.db.write_txn(&[&f.table]).unwrap();
        for o in more {
            let _ = f.table.insert(&mut w, o);
        }
        for id in deleted {
            f.table.delete_key(&mut w, &id).unwrap();
        }
        same_answers(&f, &w, &keys);
        drop(w);
        same_watch_answers(&f, &r, &keys);
    }
}

#[test]
fn misuse_is_reported_when_binding() {
    let db1 = db_no_gc();
    let db2 = db_no_gc();
    let before = db1.read_txn();
    let a = table_in(&db1, "a");
    let b = table_in(&db2, "b");

    // A table of another database.
    let e = b.table.read(&db1.read_txn()).unwrap_err();
    assert_eq!(e, Error::ForeignTable("b".into()));
    let mut w = db1.write_txn(&[&a.table]).unwrap();
    assert_eq!(
        b.table.read(&w).unwrap_err(),
        Error::ForeignTable("b".into())
    );
    // A snapshot taken before the table was created.
    assert_eq!(
        a.table.read(&before).unwrap_err(),
        Error::TableNotInSnapshot("a".into())
    );
    // A finished write transaction, committed or aborted.
    a.table.insert(&mut w, obj(1, "x", &[], 0)).unwrap();
    let r = w.commit().unwrap();
    assert_eq!(a.table.read(&w).unwrap_err(), Error::TxnDone);
    let mut w = db1.write_txn(&[&a.table]).unwrap();
    w.abort().unwrap();
    assert_eq!(a.table.read(&w).unwrap_err(), Error::TxnDone);
    for e in [
        Error::ForeignTable("b".into()),
        Error::TableNotInSnapshot("a".into()),
        Error::TxnDone,
    ] {
        assert!(e.is_misuse(), "{e}");
    }
    // Bound where everything is in order: plain answers.
    let v = a.table.read(&r).unwrap();
    assert_eq!(v.get(&a.by_name, "x").map(|o| o.id), Some(1));
}

#[test]
fn a_write_transaction_view_sees_its_own_writes() {
    let f = fixture();
    let r = insert_committed(&f.db, &f.table, obj(1, "a", &["t"], 0));
    let mut w = f.db.write_txn(&[&f.table]).unwrap();
    f.table.insert(&mut w, obj(2, "b", &["t"], 0)).unwrap();
    f.table.delete_key(&mut w, &1u32).unwrap();
    let v = f.table.read(&w).unwrap();
    assert!(v.get(&f.by_id, &1).is_none());
    assert_eq!(v.get(&f.by_name, "b").map(|o| o.id), Some(2));
    assert_eq!(
        v.list(&f.by_tag, "t").map(|o| o.id).collect::<Vec<_>>(),
        [2]
    );
    assert_eq!((v.len(), v.revision()), (1, 3));
    // The snapshot is unchanged.
    let v = f.table.read(&r).unwrap();
    assert_eq!(v.all().map(|o| o.id).collect::<Vec<_>>(), [1]);
}

/// A query key whose stored form is past `part::MAX_KEY_LEN` cannot be in
/// any index: reads answer nothing for it (no `KeyTooLong`), through the
/// view and the checked queries alike, on both layouts; `lower_bound`
/// still yields the keys above it.
#[test]
fn too_long_query_keys_find_nothing() {
    let max = part::MAX_KEY_LEN;
    for (layout, long) in [
        (KeyLayout::Bytes, max + 1),
        (KeyLayout::Nibbles, max / 2 + 1),
    ] {
        let f = table_with(&db_no_gc(), "objs", layout);
        let mut w = f.db.write_txn(&[&f.table]).unwrap();
        f.table.insert(&mut w, obj(1, "x", &["x"], 0)).unwrap();
        f.table.insert(&mut w, obj(2, "y", &["y"], 0)).unwrap();
        let r = w.commit().unwrap();
        let w = f.db.write_txn(&[&f.table]).unwrap();
        let key = "x".repeat(long);
        // Non-unique keys are escaped: each 0x00 takes two bytes.
        let zeros = "\0".repeat(long / 2 + 1);
        fn check<X: TxnRead>(f: &Fixture, txn: &X, key: &str, zeros: &str) {
            let (t, v) = (&f.table, f.table.read(txn).unwrap());
            let ids = |it: statedb::Objects<'_, Obj>| it.map(|o| o.id).collect::<Vec<_>>();
            assert!(v.get(&f.by_name, key).is_none());
            assert!(t.get(txn, &f.by_name, key).unwrap().is_none());
            assert!(ids(v.list(&f.by_name, key)).is_empty());
            assert!(ids(t.list(txn, &f.by_name, key).unwrap()).is_empty());
            assert!(ids(v.prefix(&f.by_name, key)).is_empty());
            assert!(ids(t.prefix(txn, &f.by_name, key).unwrap()).is_empty());
            assert_eq!(ids(v.lower_bound(&f.by_name, key)), [2]);
            assert_eq!(ids(t.lower_bound(txn, &f.by_name, key).unwrap()), [2]);
            for k in [key, zeros] {
                assert!(v.get(&f.by_tag, k).is_none());
                assert!(t.get(txn, &f.by_tag, k).unwrap().is_none());
                assert!(ids(v.list(&f.by_tag, k)).is_empty());
                assert!(ids(t.list(txn, &f.by_tag, k).unwrap()).is_empty());
                assert!(ids(v.prefix(&f.by_tag, k)).is_empty());
                assert!(ids(t.prefix(txn, &f.by_tag, k).unwrap()).is_empty());
            }
            assert_eq!(ids(v.lower_bound(&f.by_tag, key)), [2]);
        }
        check(&f, &r, &key, &zeros);
        check(&f, &w, &key, &zeros);
        let v = f.table.read(&r).unwrap();
        assert!(v.get_watch(&f.by_name, key.as_str()).0.is_none());
        assert!(f
            .table
            .get_watch(&r, &f.by_tag, key.as_str())
            .unwrap()
            .0
            .is_none());
        assert_eq!(v.list_watch(&f.by_tag, zeros.as_str()).0.count(), 0);
        assert_eq!(v.prefix_watch(&f.by_name, key.as_str()).0.count(), 0);
    }
}

/// The view's queries panic on an index of another table, naming both;
/// the checked queries return `IndexNotInTable` for the same call.
#[test]
#[should_panic(expected = "index \"name\" does not belong to table \"a\"")]
fn foreign_index_on_the_view_panics() {
    let db = db_no_gc();
    let a = table_in(&db, "a");
    let b = table_in(&db, "b");
    let r = db.read_txn();
    assert!(matches!(
        a.table.get(&r, &b.by_name, "x"),
        Err(Error::IndexNotInTable { .. })
    ));
    let _ = a.table.read(&r).unwrap().get(&b.by_name, "x");
}

#[test]
fn every_view_query_panics_on_a_foreign_index() {
    let db = db_no_gc();
    let a = table_in(&db, "a");
    let b = table_in(&db, "b");
    let loose = Index::unique("loose", |o: &Obj| o.id);
    let r = db.read_txn();
    let w = db.write_txn(&[&a.table]).unwrap();
    let v = a.table.read(&r).unwrap();
    let vw = a.table.read(&w).unwrap();
    let expect = |what: &str, index: &str, f: &dyn Fn()| {
        let e = catch_unwind(AssertUnwindSafe(f)).expect_err(what);
        let msg = e
            .downcast_ref::<String>()
            .cloned()
            .unwrap_or_else(|| e.downcast_ref::<&str>().unwrap().to_string());
        assert_eq!(
            msg,
            format!("index {index:?} does not belong to table \"a\""),
            "{what}"
        );
    };
    expect("get", "tags", &|| {
        let _ = v.get(&b.by_tag, "x");
    });
    expect("list", "tags", &|| {
        let _ = v.list(&b.by_tag, "x");
    });
    expect("prefix", "name", &|| {
        let _ = v.prefix(&b.by_name, "x");
    });
    expect("lower_bound", "group", &|| {
        let _ = v.lower_bound(&b.by_group, &1);
    });
    expect("get_watch", "id", &|| {
        let _ = v.get_watch(&b.by_id, &1);
    });
    expect("list_watch", "id", &|| {
        let _ = v.list_watch(&b.by_id, &1);
    });
    expect("prefix_watch", "name", &|| {
        let _ = v.prefix_watch(&b.by_name, "x");
    });
    expect("lower_bound_watch", "loose", &|| {
        let _ = v.lower_bound_watch(&loose, &1);
    });
    expect("write view get", "id", &|| {
        let _ = vw.get(&b.by_id, &1);
    });
    expect("write view list", "loose", &|| {
        let _ = vw.list(&loose, &1);
    });
}
