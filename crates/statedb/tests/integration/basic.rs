//! Queries, writes, revisions, initialization, JSON and stats.

use crate::common::*;
use statedb::{Change, ChangeKind, Db, DbOptions, Index};

/// No table or snapshot holds the object any more: the test's own
/// reference is its last (objects are `triomphe` `Arc`s, without weak
/// references to watch them go).
fn only_held_here<T>(held: &statedb::Obj<T>) -> bool {
    statedb::triomphe::Arc::count(held) == 1
}

fn ids<'a, T: 'a + std::ops::Deref<Target = statedb::Object<Obj>>>(
    it: impl Iterator<Item = &'a T>,
) -> Vec<u32> {
    it.map(|o| o.id).collect()
}

/// Each change as (object id, revision, kind).
fn id_rev_kind(batch: &[Change<Obj>]) -> Vec<(u32, u64, ChangeKind)> {
    batch
        .iter()
        .map(|c| (c.object.id, c.revision, c.kind))
        .collect()
}

#[test]
fn insert_and_query_every_index() {
    let f = fixture();
    let mut w = f.db.write_txn(&[&f.table]).unwrap();
    f.table
        .insert(&mut w, obj(1, "a", &["x", "y"], -1))
        .unwrap();
    f.table.insert(&mut w, obj(2, "b", &["y"], 0)).unwrap();
    f.table.insert(&mut w, obj(3, "ab", &[], -1)).unwrap();
    // The txn sees its own writes.
    assert_eq!(f.table.len(&w).unwrap(), 3);
    assert_eq!(f.table.get(&w, &f.by_id, &2).unwrap().unwrap().name, "b");
    // Readers do not.
    assert_eq!(f.table.len(&f.db.read_txn()).unwrap(), 0);
    let r = w.commit().unwrap();

    let t = &f.table;
    assert_eq!(t.get(&r, &f.by_name, "ab").unwrap().unwrap().id, 3);
    assert!(t.get(&r, &f.by_name, "zz").unwrap().is_none());
    assert_eq!(ids(t.list(&r, &f.by_tag, "y").unwrap()), vec![1, 2]);
    assert_eq!(ids(t.list(&r, &f.by_group, &-1).unwrap()), vec![1, 3]);
    assert_eq!(t.get(&r, &f.by_group, &-1).unwrap().unwrap().id, 1);
    assert_eq!(ids(t.prefix(&r, &f.by_name, "a").unwrap()), vec![1, 3]);
    assert_eq!(ids(t.lower_bound(&r, &f.by_group, &0).unwrap()), vec![2]);
    assert_eq!(
        ids(t.lower_bound(&r, &f.by_group, &i16::MIN).unwrap()),
        vec![1, 3, 2]
    );
    assert_eq!(ids(t.all(&r).unwrap()), vec![1, 2, 3]);
    assert_eq!(ids(t.list(&r, &f.by_id, &2).unwrap()), vec![2]);
    assert_eq!(t.revision(&r).unwrap(), 3);
}

#[test]
fn update_moves_secondary_keys_and_revisions() {
    let f = fixture();
    let t = &f.table;
    let mut w = f.db.write_txn(&[t]).unwrap();
    t.insert(&mut w, obj(1, "a", &["x"], 1)).unwrap();
    t.insert(&mut w, obj(2, "b", &[], 1)).unwrap();
    w.commit().unwrap();
    let mut w = f.db.write_txn(&[t]).unwrap();
    let old = t.insert(&mut w, obj(1, "c", &["z"], 2)).unwrap().unwrap();
    assert_eq!(old.revision(), 1);
    let r = w.commit().unwrap();
    assert!(t.get(&r, &f.by_name, "a").unwrap().is_none());
    assert_eq!(t.list(&r, &f.by_tag, "x").unwrap().count(), 0);
    assert_eq!(ids(t.list(&r, &f.by_tag, "z").unwrap()), vec![1]);
    assert_eq!(ids(t.list(&r, &f.by_group, &1).unwrap()), vec![2]);
    let o = t.get(&r, &f.by_id, &1).unwrap().unwrap();
    assert_eq!((o.revision(), o.created_revision()), (3, 1));
    // Revision order: 2 (rev 2), 1 (rev 3).
    assert_eq!(ids(t.list_revision(&r, 0).unwrap()), vec![2, 1]);
    assert_eq!(ids(t.list_revision(&r, 3).unwrap()), vec![1]);
    assert_eq!(t.list_revision(&r, 4).unwrap().count(), 0);
}

#[test]
fn modify_merges() {
    let f = fixture();
    let t = &f.table;
    let mut w = f.db.write_txn(&[t]).unwrap();
    t.modify(&mut w, obj(1, "a", &["x"], 1), |_, n| n).unwrap();
    t.modify(&mut w, obj(1, "a", &["y"], 1), |old, mut n| {
        n.tags.extend(old.tags.iter().cloned());
        n
    })
    .unwrap();
    let r = w.commit().unwrap();
    let o = t.get(&r, &f.by_id, &1).unwrap().unwrap();
    assert_eq!(o.tags, vec!["y".to_string(), "x".to_string()]);
    assert_eq!(ids(t.list(&r, &f.by_tag, "x").unwrap()), vec![1]);
}

#[test]
fn compare_and_swap_and_delete() {
    let f = fixture();
    let t = &f.table;
    let mut w = f.db.write_txn(&[t]).unwrap();
    t.insert(&mut w, obj(1, "a", &[], 0)).unwrap();
    assert_eq!(
        t.compare_and_swap(&mut w, 7, obj(1, "b", &[], 0))
            .unwrap_err(),
        statedb::Error::RevisionMismatch {
            expected: 7,
            found: 1
        }
    );
    assert_eq!(
        t.compare_and_swap(&mut w, 1, obj(9, "b", &[], 0))
            .unwrap_err(),
        statedb::Error::ObjectNotFound
    );
    let old = t.compare_and_swap(&mut w, 1, obj(1, "b", &[], 0)).unwrap();
    assert_eq!(old.name, "a");
    assert!(t
        .compare_and_delete(&mut w, 1, &obj(1, "", &[], 0))
        .is_err());
    assert_eq!(
        t.compare_and_delete(&mut w, 1, &obj(5, "", &[], 0))
            .unwrap_err(),
        statedb::Error::ObjectNotFound
    );
    let gone = t
        .compare_and_delete(&mut w, 2, &obj(1, "", &[], 0))
        .unwrap();
    assert_eq!(gone.name, "b");
    assert_eq!(t.len(&w).unwrap(), 0);
    let r = w.commit().unwrap();
    assert!(t.get(&r, &f.by_name, "b").unwrap().is_none());
    assert_eq!(t.revision(&r).unwrap(), 3);
}

#[test]
fn delete_and_delete_all() {
    let f = fixture();
    let t = &f.table;
    let mut w = f.db.write_txn(&[t]).unwrap();
    for i in 0..10 {
        t.insert(&mut w, obj(i, &format!("n{i}"), &["all"], (i % 3) as i16))
            .unwrap();
    }
    w.commit().unwrap();
    let mut w = f.db.write_txn(&[t]).unwrap();
    assert!(t.delete(&mut w, &obj(3, "", &[], 0)).unwrap().is_some());
    assert!(t.delete(&mut w, &obj(3, "", &[], 0)).unwrap().is_none());
    assert!(t.delete_key(&mut w, &4u32).unwrap().is_some());
    let r = w.commit().unwrap();
    assert_eq!(t.len(&r).unwrap(), 8);
    assert_eq!(t.list(&r, &f.by_tag, "all").unwrap().count(), 8);
    assert!(t.get(&r, &f.by_name, "n3").unwrap().is_none());
    let mut w = f.db.write_txn(&[t]).unwrap();
    assert_eq!(t.delete_all(&mut w).unwrap(), 8);
    let r = w.commit().unwrap();
    assert_eq!(t.len(&r).unwrap(), 0);
    assert_eq!(t.list(&r, &f.by_tag, "all").unwrap().count(), 0);
    assert_eq!(t.list_revision(&r, 0).unwrap().count(), 0);
    assert_eq!(t.revision(&r).unwrap(), 10 + 2 + 8);
}

#[test]
fn abort_and_drop_change_nothing() {
    let f = fixture();
    let t = &f.table;
    let mut w = f.db.write_txn(&[t]).unwrap();
    t.insert(&mut w, obj(1, "a", &[], 0)).unwrap();
    w.abort().unwrap();
    assert_eq!(w.abort(), Err(statedb::Error::TxnDone));
    {
        let mut w = f.db.write_txn(&[t]).unwrap();
        t.insert(&mut w, obj(2, "b", &[], 0)).unwrap();
    }
    let r = f.db.read_txn();
    assert_eq!(t.len(&r).unwrap(), 0);
    assert_eq!(t.revision(&r).unwrap(), 0);
}

#[test]
fn panic_inside_txn_leaves_db_unchanged() {
    let f = fixture();
    let t = f.table.clone();
    let db = f.db.clone();
    let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut w = db.write_txn(&[&t]).unwrap();
        t.insert(&mut w, obj(1, "a", &[], 0)).unwrap();
        panic!("boom");
    }));
    assert!(res.is_err());
    assert_eq!(t.len(&db.read_txn()).unwrap(), 0);
    // The lock was released.
    let mut w = db.write_txn(&[&t]).unwrap();
    // A panic inside a merge function poisons the txn if caught.
    t.insert(&mut w, obj(1, "a", &[], 0)).unwrap();
    let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = t.modify(&mut w, obj(1, "a", &[], 0), |_, _| panic!("merge"));
    }));
    assert!(res.is_err());
    assert_eq!(w.commit().unwrap_err(), statedb::Error::Poisoned);
    assert_eq!(
        t.insert(&mut w, obj(2, "b", &[], 0)).unwrap_err(),
        statedb::Error::Poisoned
    );
    w.abort().unwrap();
    assert_eq!(t.len(&db.read_txn()).unwrap(), 0);
}

#[test]
fn multi_table_commit_is_atomic() {
    let db = db_no_gc();
    let a = table_in(&db, "a");
    let b = table_in(&db, "b");
    let before = db.read_txn();
    // Order and repetitions do not matter.
    let mut w = db.write_txn(&[&b.table, &a.table, &b.table]).unwrap();
    a.table.insert(&mut w, obj(1, "a", &[], 0)).unwrap();
    b.table.insert(&mut w, obj(1, "b", &[], 0)).unwrap();
    let after = w.commit().unwrap();
    assert_eq!(a.table.len(&before).unwrap(), 0);
    assert_eq!(b.table.len(&before).unwrap(), 0);
    assert_eq!(a.table.len(&after).unwrap(), 1);
    assert_eq!(b.table.len(&after).unwrap(), 1);
    let r = db.read_txn();
    assert_eq!(a.table.len(&r).unwrap() + b.table.len(&r).unwrap(), 2);
}

/// A write transaction's snapshot of the tables it did not lock is loaded
/// at its first read of one and kept; the tables it locked read as the
/// lock froze them, whether it wrote them first or not.
#[test]
fn write_txn_snapshot_is_taken_at_its_first_read() {
    let db = db_no_gc();
    let a = table_in(&db, "a");
    let b = table_in(&db, "b");
    let c = table_in(&db, "c");
    let put = |f: &crate::common::Fixture, id: u32| {
        let mut w = db.write_txn(&[&f.table]).unwrap();
        f.table
            .insert(&mut w, obj(id, &format!("n{id}"), &[], 0))
            .unwrap();
        w.commit().unwrap();
    };
    put(&c, 1);
    let mut w = db.write_txn(&[&a.table, &c.table]).unwrap();
    a.table.insert(&mut w, obj(1, "a", &[], 0)).unwrap();
    // `b` is not locked: a commit to it before the first read is seen...
    put(&b, 1);
    assert_eq!(b.table.len(&w).unwrap(), 1);
    // ...and one after it is not.
    put(&b, 2);
    assert_eq!(b.table.len(&w).unwrap(), 1);
    // Locked tables: `a` with the txn's write, `c` (read, then written) as
    // locked.
    assert_eq!(a.table.len(&w).unwrap(), 1);
    assert_eq!(c.table.len(&w).unwrap(), 1);
    c.table.insert(&mut w, obj(2, "c2", &[], 0)).unwrap();
    assert_eq!(c.table.len(&w).unwrap(), 2);
    let r = w.commit().unwrap();
    // A done transaction answers no reads; the commit's snapshot does.
    assert!(matches!(c.table.len(&w), Err(statedb::Error::TxnDone)));
    assert!(matches!(b.table.len(&w), Err(statedb::Error::TxnDone)));
    assert_eq!(c.table.len(&r).unwrap(), 2);
    assert_eq!(b.table.len(&r).unwrap(), 2);
    assert_eq!(a.table.len(&r).unwrap(), 1);
}

#[test]
fn read_only_lock_creates_no_write_state() {
    let db = db_no_gc();
    let a = table_in(&db, "a");
    let b = table_in(&db, "b");
    let mut w = db.write_txn(&[&a.table, &b.table]).unwrap();
    b.table.insert(&mut w, obj(1, "x", &[], 0)).unwrap();
    // Reading `a` through the txn does not create its write state: its
    // published root is unchanged by the commit.
    assert_eq!(a.table.len(&w).unwrap(), 0);
    let before = db.read_txn();
    let after = w.commit().unwrap();
    assert_eq!(a.table.revision(&after).unwrap(), 0);
    assert!(format!("{w:?}").contains("done: true"));
    // Same root object for the unwritten table (the per-table state is
    // shared, not rebuilt).
    assert_eq!(
        a.table.to_json(&before).unwrap(),
        a.table.to_json(&after).unwrap()
    );
}

#[test]
fn changes_stream_inserts_updates_deletes() {
    let f = fixture();
    let t = &f.table;
    let mut w = f.db.write_txn(&[t]).unwrap();
    t.insert(&mut w, obj(1, "a", &[], 0)).unwrap();
    let mut ch = t.changes(&mut w).unwrap();
    t.insert(&mut w, obj(2, "b", &[], 0)).unwrap();
    let r = w.commit().unwrap();
    let (batch, watch) = ch.next(&r).unwrap();
    let kinds = id_rev_kind(&batch);
    assert_eq!(
        kinds,
        vec![(1, 1, ChangeKind::Insert), (2, 2, ChangeKind::Insert)]
    );
    assert!(!watch.is_closed());
    let (batch, _) = ch.next(&r).unwrap();
    assert!(batch.is_empty());

    let mut w = f.db.write_txn(&[t]).unwrap();
    t.insert(&mut w, obj(1, "a2", &[], 0)).unwrap();
    t.delete(&mut w, &obj(2, "", &[], 0)).unwrap();
    let r = w.commit().unwrap();
    assert!(watch.is_closed());
    assert_eq!(t.graveyard_len(&r).unwrap(), 1);
    let (batch, _) = ch.next(&r).unwrap();
    let kinds = id_rev_kind(&batch);
    assert_eq!(
        kinds,
        vec![(1, 3, ChangeKind::Update), (2, 4, ChangeKind::Delete)]
    );
    // The consumer processed the delete: the collector drops it.
    assert_eq!(f.db.collect_garbage(), 1);
    assert_eq!(t.graveyard_len(&f.db.read_txn()).unwrap(), 0);
}

fn has_revision_index(db: &Db, table: &str) -> bool {
    db.stats()
        .iter()
        .find(|s| s.name == table)
        .expect("table exists")
        .revision_index
}

/// Writes ids 0..5, then rewrites 3 and 1: revision order 0, 2, 4, 3, 1.
fn write_out_of_order(f: &Fixture) {
    let t = &f.table;
    let mut w = f.db.write_txn(&[t]).unwrap();
    for i in 0..5 {
        t.insert(&mut w, obj(i, &format!("{i}"), &[], 0)).unwrap();
    }
    w.commit().unwrap();
    let mut w = f.db.write_txn(&[t]).unwrap();
    t.insert(&mut w, obj(3, "3b", &[], 0)).unwrap();
    t.insert(&mut w, obj(1, "1b", &[], 0)).unwrap();
    w.commit().unwrap();
}

#[test]
fn revision_index_is_built_on_first_use() {
    let f = fixture();
    let t = &f.table;
    write_out_of_order(&f);
    // Nobody read revision order: the writes kept no revision index.
    assert!(!has_revision_index(&f.db, "objs"));
    // A snapshot without one answers from its objects, sorted.
    let r = f.db.read_txn();
    assert_eq!(ids(t.list_revision(&r, 0).unwrap()), vec![0, 2, 4, 3, 1]);
    assert_eq!(ids(t.list_revision(&r, 5).unwrap()), vec![4, 3, 1]);
    let (objs, watch) = t.list_revision_watch(&r, 7).unwrap();
    assert_eq!(ids(objs), vec![1]);
    // Inside a write transaction too, with its own writes.
    let mut w = f.db.write_txn(&[t]).unwrap();
    t.insert(&mut w, obj(0, "0b", &[], 0)).unwrap();
    assert_eq!(ids(t.list_revision(&w, 6).unwrap()), vec![3, 1, 0]);
    assert!(!watch.is_closed(), "nothing committed yet");
    let r = w.commit().unwrap();
    // The read asked for the index: that write built it, and the watch
    // fired.
    assert!(watch.is_closed());
    assert!(has_revision_index(&f.db, "objs"));
    assert_eq!(ids(t.list_revision(&r, 0).unwrap()), vec![2, 4, 3, 1, 0]);
    // Later writes keep it.
    let (_, watch) = t.list_revision_watch(&r, 0).unwrap();
    let mut w = f.db.write_txn(&[t]).unwrap();
    t.insert(&mut w, obj(2, "2b", &[], 0)).unwrap();
    t.delete_key(&mut w, &4u32).unwrap();
    let r = w.commit().unwrap();
    assert!(watch.is_closed());
    assert_eq!(ids(t.list_revision(&r, 0).unwrap()), vec![3, 1, 0, 2]);
    let mut w = f.db.write_txn(&[t]).unwrap();
    t.delete_all(&mut w).unwrap();
    t.insert(&mut w, obj(9, "9", &[], 0)).unwrap();
    let r = w.commit().unwrap();
    assert_eq!(ids(t.list_revision(&r, 0).unwrap()), vec![9]);
}

#[test]
fn consumer_registered_on_a_table_without_revision_index() {
    let f = fixture();
    let t = &f.table;
    write_out_of_order(&f);
    // Registered by a transaction that does not write the table: the
    // first read sorts the objects; the next write builds the index.
    let mut w = f.db.write_txn(&[t]).unwrap();
    let mut ch = t.changes(&mut w).unwrap();
    let r = w.commit().unwrap();
    assert!(!has_revision_index(&f.db, "objs"));
    let (batch, watch) = ch.next(&r).unwrap();
    let got = id_rev_kind(&batch);
    assert_eq!(
        got,
        vec![
            (0, 1, ChangeKind::Insert),
            (2, 3, ChangeKind::Insert),
            (4, 5, ChangeKind::Insert),
            (3, 6, ChangeKind::Update),
            (1, 7, ChangeKind::Update),
        ]
    );
    let mut w = f.db.write_txn(&[t]).unwrap();
    t.insert(&mut w, obj(0, "0b", &[], 0)).unwrap();
    t.delete_key(&mut w, &2u32).unwrap();
    let r = w.commit().unwrap();
    assert!(watch.is_closed());
    assert!(has_revision_index(&f.db, "objs"));
    let (batch, _) = ch.next(&r).unwrap();
    let got = id_rev_kind(&batch);
    assert_eq!(
        got,
        vec![(0, 8, ChangeKind::Update), (2, 9, ChangeKind::Delete)]
    );
}

#[test]
fn graveyard_kept_until_every_consumer_is_past() {
    let f = fixture();
    let t = &f.table;
    let mut w = f.db.write_txn(&[t]).unwrap();
    let mut c1 = t.changes(&mut w).unwrap();
    let c2 = t.changes(&mut w).unwrap();
    t.insert(&mut w, obj(1, "a", &[], 0)).unwrap();
    t.insert(&mut w, obj(2, "b", &[], 0)).unwrap();
    w.commit().unwrap();
    let mut w = f.db.write_txn(&[t]).unwrap();
    t.delete_all(&mut w).unwrap();
    let r = w.commit().unwrap();
    assert_eq!(t.graveyard_len(&r).unwrap(), 2);
    c1.next(&r).unwrap();
    assert_eq!(f.db.collect_garbage(), 0, "c2 still needs them");
    drop(c2);
    assert_eq!(f.db.collect_garbage(), 2);
    // No consumer left: deletes are no longer kept.
    drop(c1);
    let mut w = f.db.write_txn(&[t]).unwrap();
    t.insert(&mut w, obj(3, "c", &[], 0)).unwrap();
    t.delete_key(&mut w, &3u32).unwrap();
    let r = w.commit().unwrap();
    assert_eq!(t.graveyard_len(&r).unwrap(), 0);
}

#[test]
fn background_gc_collects() {
    let db = Db::with_options(
        DbOptions::default().with_gc_interval(Some(std::time::Duration::from_millis(5))),
    );
    let f = table_in(&db, "objs");
    let t = &f.table;
    let mut w = db.write_txn(&[t]).unwrap();
    let mut ch = t.changes(&mut w).unwrap();
    t.insert(&mut w, obj(1, "a", &[], 0)).unwrap();
    w.commit().unwrap();
    let mut w = db.write_txn(&[t]).unwrap();
    t.delete_key(&mut w, &1u32).unwrap();
    let r = w.commit().unwrap();
    assert_eq!(t.graveyard_len(&r).unwrap(), 1);
    ch.next(&r).unwrap();
    wait_until_collected(&db, t);
}

/// A collection asked for on another thread than the commit's, once that
/// thread has seen the commit's roots, finds the graveyard (the collector
/// learns its size from the table's figures, stored before the roots are
/// published, not from the roots).
#[test]
fn collect_garbage_sees_a_commit_made_on_another_thread() {
    let db = db_no_gc();
    let f = table_in(&db, "objs");
    let t = &f.table;
    let mut w = db.write_txn(&[t]).unwrap();
    let mut ch = t.changes(&mut w).unwrap();
    for (id, name) in [(0, "a"), (1, "b"), (2, "c")] {
        t.insert(&mut w, obj(id, name, &[], 0)).unwrap();
    }
    w.commit().unwrap();
    for round in 0..3u32 {
        let (db2, t2) = (db.clone(), t.clone());
        let r = std::thread::spawn(move || {
            let mut w = db2.write_txn(&[&t2]).unwrap();
            t2.delete_key(&mut w, &round).unwrap();
            w.commit().unwrap()
        })
        .join()
        .unwrap();
        assert_eq!(t.graveyard_len(&r).unwrap(), 1);
        ch.next(&r).unwrap();
        let seen = db.read_txn();
        assert_eq!(t.graveyard_len(&seen).unwrap(), 1);
        assert_eq!(db.collect_garbage(), 1, "round {round}");
        assert_eq!(t.graveyard_len(&db.read_txn()).unwrap(), 0);
        assert_eq!(db.collect_garbage(), 0);
    }
}

/// A write transaction starts from the table's root as last published
/// under its lock, whoever published it: here the collector (a stale
/// root would bring the collected delete back into the graveyard), with
/// another table's commits replacing the root vector in between.
#[test]
fn a_write_after_collection_starts_from_the_collected_root() {
    let db = db_no_gc();
    let f = table_in(&db, "objs");
    let other = table_in(&db, "other");
    let t = &f.table;
    let mut w = db.write_txn(&[t]).unwrap();
    let mut ch = t.changes(&mut w).unwrap();
    t.insert(&mut w, obj(1, "a", &[], 0)).unwrap();
    t.insert(&mut w, obj(2, "b", &[], 0)).unwrap();
    let r = w.commit().unwrap();
    // Seen: the consumer then needs the delete kept.
    ch.next(&r).unwrap();
    for round in 0..3u32 {
        let mut w = db.write_txn(&[t]).unwrap();
        assert!(t.delete_key(&mut w, &1u32).unwrap().is_some());
        let r = w.commit().unwrap();
        assert_eq!(t.graveyard_len(&r).unwrap(), 1);
        ch.next(&r).unwrap();
        insert_committed(&db, &other.table, obj(round, &format!("o{round}"), &[], 0));
        assert_eq!(db.collect_garbage(), 1, "round {round}");
        insert_committed(
            &db,
            &other.table,
            obj(round + 10, &format!("p{round}"), &[], 0),
        );
        let r = insert_committed(&db, t, obj(1, "a", &[], 0));
        assert_eq!(t.graveyard_len(&r).unwrap(), 0, "round {round}");
        assert_eq!(t.len(&r).unwrap(), 2);
        assert_eq!(other.table.len(&r).unwrap(), 2 * (round as usize + 1));
        ch.next(&r).unwrap();
    }
}

/// Collection publishes a new root for the collected table only: here the
/// database's second table, between two others that keep theirs.
#[test]
fn collecting_one_table_of_several() {
    let db = db_no_gc();
    let a = table_in(&db, "a");
    let b = table_in(&db, "b");
    let c = table_in(&db, "c");
    let mut w = db.write_txn(&[&a.table, &b.table, &c.table]).unwrap();
    let mut ch = b.table.changes(&mut w).unwrap();
    for f in [&a, &b, &c] {
        f.table.insert(&mut w, obj(1, "x", &[], 0)).unwrap();
    }
    w.commit().unwrap();
    let mut w = db.write_txn(&[&b.table]).unwrap();
    b.table.delete_key(&mut w, &1u32).unwrap();
    let r = w.commit().unwrap();
    assert_eq!(b.table.graveyard_len(&r).unwrap(), 1);
    ch.next(&r).unwrap();
    assert_eq!(db.collect_garbage(), 1);
    let r = db.read_txn();
    assert_eq!(b.table.graveyard_len(&r).unwrap(), 0);
    assert_eq!(b.table.len(&r).unwrap(), 0);
    for f in [&a, &c] {
        assert_eq!(name_of_one(f, &r), "x");
    }
}

/// Twenty-one tables: two whose roots sit in the root vector and nineteen
/// in shared chunks of eight. Transactions write tables in the head, in one
/// chunk and across chunks, some abort, and every snapshot taken on the way
/// keeps reading what was committed before it.
#[test]
fn many_tables_keep_their_rows_in_every_snapshot() {
    let db = db_no_gc();
    let tables: Vec<Fixture> = (0..21).map(|i| table_in(&db, &format!("t{i}"))).collect();
    let mut model: Vec<Vec<u32>> = vec![Vec::new(); tables.len()];
    let mut snapshots: Vec<(statedb::ReadTxn, Vec<Vec<u32>>)> = Vec::new();
    let writes: [&[usize]; 8] = [
        &[0],
        &[5],
        &[1, 9, 20],
        &[10, 11],
        &[2, 3, 17, 18],
        &[20],
        &[0, 1],
        &[4, 12, 19],
    ];
    for (round, set) in writes.iter().cycle().take(24).enumerate() {
        let locked: Vec<&dyn statedb::AnyTable> = set
            .iter()
            .map(|&i| &tables[i].table as &dyn statedb::AnyTable)
            .collect();
        let mut w = db.write_txn(&locked).unwrap();
        for &i in set.iter() {
            let id = round as u32;
            tables[i]
                .table
                .insert(&mut w, obj(id, &format!("{i}-{id}"), &[], 0))
                .unwrap();
        }
        if round % 5 == 4 {
            drop(w);
        } else {
            w.commit().unwrap();
            for &i in set.iter() {
                model[i].push(round as u32);
            }
        }
        snapshots.push((db.read_txn(), model.clone()));
    }
    for (r, want) in &snapshots {
        for (i, f) in tables.iter().enumerate() {
            let got: Vec<u32> = f.table.all(r).unwrap().map(|o| o.id).collect();
            assert_eq!(got, want[i], "table {i}");
        }
    }
}

#[test]
fn changes_since_skips_older() {
    let f = fixture();
    let t = &f.table;
    let mut w = f.db.write_txn(&[t]).unwrap();
    for i in 0..5 {
        t.insert(&mut w, obj(i, &format!("{i}"), &[], 0)).unwrap();
    }
    let mut ch = t.changes_since(&mut w, 3).unwrap();
    let r = w.commit().unwrap();
    let (b, _) = ch.next(&r).unwrap();
    assert_eq!(b.iter().map(|c| c.revision).collect::<Vec<_>>(), vec![4, 5]);
    assert_eq!(ch.position(), 5);
}

#[test]
fn initialization() {
    let f = fixture();
    let t = &f.table;
    let (init, w0) = t.initialized_watch(&f.db.read_txn()).unwrap();
    assert!(init);
    let mut w = f.db.write_txn(&[t]).unwrap();
    let i1 = t.register_initializer(&mut w, "k8s").unwrap();
    let i2 = t.register_initializer(&mut w, "file").unwrap();
    let r = w.commit().unwrap();
    assert!(w0.is_closed(), "registering makes it uninitialized");
    let (init, watch) = t.initialized_watch(&r).unwrap();
    assert!(!init);
    assert_eq!(t.pending_initializers(&r).unwrap(), vec!["k8s", "file"]);
    let mut w = f.db.write_txn(&[t]).unwrap();
    t.initializer_done(&mut w, &i1).unwrap();
    assert_eq!(
        t.initializer_done(&mut w, &i1).unwrap_err(),
        statedb::Error::InitializerDone("k8s".into())
    );
    let r = w.commit().unwrap();
    assert!(!watch.is_closed(), "still pending: no fire");
    assert!(!t.initialized(&r).unwrap());
    let mut w = f.db.write_txn(&[t]).unwrap();
    t.initializer_done(&mut w, &i2).unwrap();
    let r = w.commit().unwrap();
    assert!(watch.is_closed());
    assert!(t.initialized(&r).unwrap());
}

/// A table that never wrote an initializer or a graveyard entry keeps no
/// rare parts (its roots share the table's empty ones): watches on its
/// initialization still fire when the first initializer is registered,
/// not when one is registered and aborted, and a snapshot from before
/// answers with a watch that has already fired.
#[test]
fn initialization_of_a_table_that_never_had_an_initializer() {
    let f = fixture();
    let t = &f.table;
    write_one(&f, "a");
    let before = f.db.read_txn();
    let (init, w0) = t.initialized_watch(&before).unwrap();
    assert!(init);
    write_one(&f, "b");
    assert!(!w0.is_closed(), "object writes leave initialization alone");
    let mut w = f.db.write_txn(&[t]).unwrap();
    t.register_initializer(&mut w, "aborted").unwrap();
    drop(w);
    assert!(!w0.is_closed(), "an aborted registration changes nothing");
    let mut w = f.db.write_txn(&[t]).unwrap();
    let i = t.register_initializer(&mut w, "k8s").unwrap();
    let r = w.commit().unwrap();
    assert!(w0.is_closed());
    assert!(!t.initialized(&r).unwrap());
    assert!(t.initialized(&before).unwrap());
    assert!(t.initialized_watch(&before).unwrap().1.is_closed());
    let (_, w1) = t.initialized_watch(&r).unwrap();
    let mut w = f.db.write_txn(&[t]).unwrap();
    t.initializer_done(&mut w, &i).unwrap();
    let r = w.commit().unwrap();
    assert!(w1.is_closed());
    assert!(t.initialized(&r).unwrap());
    assert_eq!(t.graveyard_len(&r).unwrap(), 0);
}

#[test]
fn json_dump_and_stats() {
    let f = fixture();
    let t = &f.table;
    let mut w = f.db.write_txn(&[t]).unwrap();
    t.insert(&mut w, obj(1, "a", &["x"], -2)).unwrap();
    let r = w.commit().unwrap();
    let v: serde_json::Value = serde_json::from_str(&t.to_json(&r).unwrap()).unwrap();
    assert_eq!(v["table"], "objs");
    assert_eq!(v["revision"], 1);
    assert_eq!(v["objects"][0]["revision"], 1);
    assert_eq!(v["objects"][0]["object"]["name"], "a");
    assert_eq!(v["objects"][0]["object"]["group"], -2);
    let s = f.db.stats();
    assert_eq!(s.len(), 1);
    assert_eq!((s[0].objects, s[0].revision, s[0].graveyard), (1, 1, 0));
    assert_eq!(s[0].commit.count, 1);
    assert_eq!(s[0].lock_wait.count, 1);
    assert_eq!(s[0].lock_hold.count, 1);
    // The first hold of a table is timed.
    assert_eq!((s[0].commit.timed, s[0].lock_hold.timed), (1, 1));
}

#[test]
fn ip_and_tuple_keys() {
    use statedb::IpPrefix;
    use std::net::IpAddr;
    #[derive(Clone, Debug)]
    struct Route {
        prefix: IpPrefix,
        dev: String,
        metric: i32,
    }
    let db = db_no_gc();
    let by_prefix = Index::unique("prefix", |r: &Route| r.prefix);
    let by_dev = Index::non_unique("dev-metric", |r: &Route| (r.dev.clone(), r.metric));
    let t = db
        .create_table("routes", &by_prefix, &[by_dev.erase()])
        .unwrap();
    let p = |s: &str, l| IpPrefix::new(s.parse::<IpAddr>().unwrap(), l).unwrap();
    let mut w = db.write_txn(&[&t]).unwrap();
    for (pre, l, dev, m) in [
        ("10.0.0.0", 8, "eth0", 5),
        ("10.1.0.0", 16, "eth0", -5),
        ("::", 0, "eth1", 0),
        ("192.168.0.0", 16, "eth0\0x", 1),
    ] {
        t.insert(
            &mut w,
            Route {
                prefix: p(pre, l),
                dev: dev.into(),
                metric: m,
            },
        )
        .unwrap();
    }
    let r = w.commit().unwrap();
    let got: Vec<i32> = t
        .prefix(&r, &by_dev, &("eth0".to_string(), 0i32))
        .unwrap()
        .map(|o| o.metric)
        .collect();
    assert!(got.is_empty(), "a full tuple prefix matches only itself");
    let got: Vec<i32> = t
        .lower_bound(&r, &by_dev, &("eth0".to_string(), i32::MIN))
        .unwrap()
        .map(|o| o.metric)
        .collect();
    assert_eq!(
        got,
        vec![-5, 5, 1, 0],
        "negatives first, eth0 < eth0\\0x < eth1"
    );
    assert_eq!(
        t.get(&r, &by_dev, &("eth0".to_string(), -5))
            .unwrap()
            .unwrap()
            .prefix,
        p("10.1.0.0", 16)
    );
    let all: Vec<IpPrefix> = t.all(&r).unwrap().map(|o| o.prefix).collect();
    assert_eq!(all[3], p("::", 0), "IPv6 after IPv4");
}

#[test]
fn handles_cross_threads() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<statedb::Db>();
    send_sync::<statedb::ReadTxn>();
    send_sync::<statedb::Table<Obj>>();
    send_sync::<statedb::Index<Obj, u32>>();
    send_sync::<statedb::Watch>();
    send::<statedb::WriteTxn>();
    send::<statedb::Changes<Obj>>();
    send::<statedb::Reader>();
    // A write transaction opened on one thread commits on another.
    let f = fixture();
    let mut w = f.db.write_txn(&[&f.table]).unwrap();
    f.table.insert(&mut w, obj(1, "a", &[], 0)).unwrap();
    let r = std::thread::scope(|s| s.spawn(move || w.commit().unwrap()).join().unwrap());
    assert_eq!(f.table.len(&r).unwrap(), 1);
}

#[test]
fn reader_follows_commits() {
    let f = fixture();
    let mut reader = f.db.reader();
    assert_eq!(f.table.len(reader.read_txn()).unwrap(), 0);
    let mut w = f.db.write_txn(&[&f.table]).unwrap();
    f.table.insert(&mut w, obj(1, "a", &[], 0)).unwrap();
    w.commit().unwrap();
    let r = reader.read_txn();
    assert_eq!(f.table.len(r).unwrap(), 1);
    let (_, watch) = f.table.all_watch(r).unwrap();
    assert!(!watch.is_closed());
}

/// A reader learns of new roots from a count bumped after each swap: a
/// commit that returned before another thread was told of it is in that
/// thread's next snapshot, and so is a table created after the reader.
#[test]
fn reader_sees_every_commit_made_before_it_was_told() {
    let f = std::sync::Arc::new(fixture());
    let (tx, rx) = std::sync::mpsc::sync_channel::<usize>(0);
    let follower = {
        let f = f.clone();
        std::thread::spawn(move || {
            let mut reader = f.db.reader();
            for n in rx {
                // The writer may have committed more since it said so.
                assert!(f.table.len(reader.read_txn()).unwrap() >= n);
            }
            let later = table_in(&f.db, "later");
            assert_eq!(later.table.len(reader.read_txn()).unwrap(), 0);
        })
    };
    for i in 1..=300u32 {
        let mut w = f.db.write_txn(&[&f.table]).unwrap();
        f.table
            .insert(&mut w, obj(i, &format!("o{i}"), &[], 0))
            .unwrap();
        w.commit().unwrap();
        tx.send(i as usize).unwrap();
    }
    drop(tx);
    follower.join().unwrap();
}

#[test]
fn delete_then_reinsert_streams_in_order() {
    let f = fixture();
    let t = &f.table;
    let mut w = f.db.write_txn(&[t]).unwrap();
    let mut ch = t.changes(&mut w).unwrap();
    t.insert(&mut w, obj(1, "a", &[], 0)).unwrap(); // 1
    t.delete_key(&mut w, &1u32).unwrap(); // 2
    t.insert(&mut w, obj(1, "b", &[], 0)).unwrap(); // 3
    t.delete_key(&mut w, &1u32).unwrap(); // 4
    t.insert(&mut w, obj(1, "c", &[], 0)).unwrap(); // 5
    let r = w.commit().unwrap();
    let (batch, _) = ch.next(&r).unwrap();
    let got: Vec<(u64, ChangeKind, String)> = batch
        .iter()
        .map(|c| (c.revision, c.kind, c.object.name.clone()))
        .collect();
    assert_eq!(
        got,
        vec![
            (2, ChangeKind::Delete, "a".into()),
            (4, ChangeKind::Delete, "b".into()),
            (5, ChangeKind::Insert, "c".into()),
        ]
    );
}

#[test]
fn superseded_objects_are_freed() {
    use std::time::{Duration, Instant};
    for gc in [None, Some(Duration::from_millis(5))] {
        let db = Db::with_options(DbOptions::default().with_gc_interval(gc));
        let f = table_in(&db, "objs");
        let t = &f.table;
        let mut w = db.write_txn(&[t]).unwrap();
        t.insert(&mut w, obj(1, "a", &[], 0)).unwrap();
        let r = w.commit().unwrap();
        let held = t.get(&r, &f.by_id, &1).unwrap().unwrap().clone();
        // A committed write transaction answers no reads (and holds no
        // snapshot): the returned one is the commit.
        assert!(matches!(t.len(&w), Err(statedb::Error::TxnDone)));
        drop((r, w));
        // Replace it, many times (retired roots pile up, then get freed).
        for i in 0..200 {
            let mut w = db.write_txn(&[t]).unwrap();
            t.insert(&mut w, obj(1, &format!("b{i}"), &[], 0)).unwrap();
            w.commit().unwrap();
        }
        if gc.is_none() {
            assert!(
                only_held_here(&held),
                "freed inline without a background thread"
            );
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while !only_held_here(&held) {
            assert!(
                Instant::now() < deadline,
                "superseded object never freed ({gc:?})"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// A table whose database's collector wakes only after 64 retired
/// versions or an hour (so, not within a test).
fn idle_collector_table() -> Fixture {
    let db = Db::with_options(
        DbOptions::default().with_gc_interval(Some(std::time::Duration::from_secs(3600))),
    );
    table_in(&db, "objs")
}

/// Commits object 1 under `name`.
fn write_one(f: &Fixture, name: &str) -> statedb::ReadTxn {
    let mut w = f.db.write_txn(&[&f.table]).unwrap();
    f.table.insert(&mut w, obj(1, name, &[], 0)).unwrap();
    w.commit().unwrap()
}

/// Object 1's name in `r`.
fn name_of_one(f: &Fixture, r: &statedb::ReadTxn) -> String {
    f.table.get(r, &f.by_id, &1).unwrap().unwrap().name.clone()
}

/// A `Reader` that lets go last of a version its own thread published frees
/// it at once (its nodes were allocated there); one published by another
/// thread (here one that has exited) waits in that thread's mailbox, for it
/// or the background thread, which has not run yet here.
#[test]
fn reader_frees_its_own_threads_versions_and_hands_on_others() {
    let f = idle_collector_table();
    let mut reader = f.db.reader();
    for (other_thread, freed) in [(false, true), (true, false)] {
        let r = if other_thread {
            std::thread::scope(|s| s.spawn(|| write_one(&f, "old")).join().unwrap())
        } else {
            write_one(&f, "old")
        };
        let held = f.table.get(&r, &f.by_id, &1).unwrap().unwrap().clone();
        drop(r);
        // The reader now holds the only snapshot with "old" in it.
        assert_eq!(name_of_one(&f, reader.read_txn()), "old");
        write_one(&f, "new");
        assert!(!only_held_here(&held), "the reader's snapshot holds it");
        assert_eq!(name_of_one(&f, reader.read_txn()), "new");
        assert_eq!(
            only_held_here(&held),
            freed,
            "published by another thread: {other_thread}"
        );
    }
}

/// `Db::collect_garbage` frees what waits in a mailbox (here that of a
/// thread that has exited), as the background thread would.
#[test]
fn collect_garbage_empties_the_mailboxes() {
    let f = idle_collector_table();
    let mut reader = f.db.reader();
    let r = std::thread::scope(|s| s.spawn(|| write_one(&f, "old")).join().unwrap());
    let held = f.table.get(&r, &f.by_id, &1).unwrap().unwrap().clone();
    drop(r);
    assert_eq!(name_of_one(&f, reader.read_txn()), "old");
    write_one(&f, "new");
    assert_eq!(name_of_one(&f, reader.read_txn()), "new");
    assert!(
        !only_held_here(&held),
        "waits in the exited thread's mailbox"
    );
    f.db.collect_garbage();
    assert!(only_held_here(&held));
}

/// A version another thread published, let go of last by a reader, is
/// freed by the publishing thread at its next commit.
#[test]
fn the_publishing_thread_frees_what_readers_hand_back() {
    use std::sync::mpsc;
    let f = idle_collector_table();
    let mut reader = f.db.reader();
    std::thread::scope(|s| {
        let (to_writer, writes) = mpsc::channel::<&str>();
        let (wrote, done) = mpsc::channel::<()>();
        let f = &f;
        s.spawn(move || {
            for n in writes {
                write_one(f, n);
                wrote.send(()).unwrap();
            }
        });
        let write = |n| {
            to_writer.send(n).unwrap();
            done.recv().unwrap();
        };
        write("old");
        let held = {
            let r = f.db.read_txn();
            f.table.get(&r, &f.by_id, &1).unwrap().unwrap().clone()
        };
        assert_eq!(name_of_one(f, reader.read_txn()), "old");
        write("new");
        // The reader lets go of the last snapshot holding "old".
        assert_eq!(name_of_one(f, reader.read_txn()), "new");
        assert!(!only_held_here(&held), "waits for its publisher");
        write("newer");
        assert!(only_held_here(&held), "freed at the publisher's commit");
    });
}

/// The timing figures are updated with plain loads and stores by the holder
/// of the table's lock: concurrent writers (commits and aborts) must still
/// be counted exactly.
#[test]
fn stats_count_every_concurrent_commit() {
    let f = fixture();
    let (threads, per) = (4u32, 300u32);
    std::thread::scope(|s| {
        for t in 0..threads {
            let f = &f;
            s.spawn(move || {
                for i in 0..per {
                    let mut w = f.db.write_txn(&[&f.table]).unwrap();
                    let id = t * per + i;
                    f.table
                        .insert(&mut w, obj(id, &format!("n{id}"), &[], 0))
                        .unwrap();
                    if i % 10 == 9 {
                        w.abort().unwrap();
                    } else {
                        w.commit().unwrap();
                    }
                }
            });
        }
    });
    let s = f.db.stats();
    let total = threads * per;
    let aborted = threads * (per / 10);
    assert_eq!(s[0].commit.count, u64::from(total - aborted));
    assert_eq!(s[0].lock_wait.count, u64::from(total));
    assert_eq!(s[0].lock_wait.timed, u64::from(total));
    assert_eq!(s[0].lock_hold.count, u64::from(total));
    // One hold in 16 timed, the first included.
    assert_eq!(s[0].lock_hold.timed, u64::from(total.div_ceil(16)));
    assert!(s[0].commit.timed > 0 && s[0].commit.timed <= s[0].lock_hold.timed);
    assert_eq!(s[0].objects as u64, u64::from(total - aborted));
    assert!(s[0].lock_hold.max >= s[0].commit.max);
}

/// A writer waiting longer than the table lock's spin parks, and the
/// holder's commit wakes it; it then sees the holder's write.
#[test]
fn a_writer_waiting_past_the_spin_parks_and_is_woken() {
    let f = fixture();
    let hold = std::time::Duration::from_millis(30);
    let mut w = f.db.write_txn(&[&f.table]).unwrap();
    f.table.insert(&mut w, obj(1, "first", &[], 0)).unwrap();
    std::thread::scope(|s| {
        let waiter = s.spawn(|| {
            let mut w2 = f.db.write_txn(&[&f.table]).unwrap();
            let seen = f
                .table
                .get(&w2, &f.by_id, &1)
                .unwrap()
                .map(|o| o.name.clone());
            f.table.insert(&mut w2, obj(2, "second", &[], 0)).unwrap();
            w2.commit().unwrap();
            seen
        });
        std::thread::sleep(hold);
        w.commit().unwrap();
        assert_eq!(waiter.join().unwrap().as_deref(), Some("first"));
    });
    let s = f.db.stats();
    assert_eq!(s[0].objects, 2);
    assert_eq!(s[0].lock_wait.count, 2);
    // The waiter's wait is the longest and covers most of the hold.
    assert!(s[0].lock_wait.max >= hold / 2, "{:?}", s[0].lock_wait);
}

#[test]
fn changes_iter_borrows_what_next_copies_and_resumes_after_a_partial_read() {
    let f = fixture();
    let t = &f.table;
    let mut w = f.db.write_txn(&[t]).unwrap();
    let mut copied = t.changes(&mut w).unwrap();
    let mut borrowed = t.changes(&mut w).unwrap();
    for (id, name) in (1..=6).zip(["a", "b", "c", "d", "e", "f"]) {
        t.insert(&mut w, obj(id, name, &[], 0)).unwrap();
    }
    w.commit().unwrap();
    let mut w = f.db.write_txn(&[t]).unwrap();
    t.insert(&mut w, obj(2, "b2", &[], 0)).unwrap();
    t.delete_key(&mut w, &4u32).unwrap();
    t.delete_key(&mut w, &5u32).unwrap();
    let r = w.commit().unwrap();
    let key = |c: &Change<Obj>| (c.object.id, c.revision, c.kind);

    let (batch, _) = copied.next(&r).unwrap();
    let expected: Vec<_> = batch.iter().map(key).collect();
    // 1, 3 and 6 as inserted, 2 as updated (its first version is not
    // replayed), then the two deletes.
    assert_eq!(expected.len(), 6);
    assert_eq!(expected[3].2, ChangeKind::Update);

    // Three, then the iterator is dropped: the consumer sits after them.
    let (it, watch) = borrowed.iter(&r).unwrap();
    let first: Vec<_> = it.take(3).map(|c| key(&c.to_owned())).collect();
    assert_eq!(first, expected[..3]);
    assert_eq!(borrowed.position(), expected[2].1);
    assert!(!watch.is_closed());
    // `copied` is past both deletes, `borrowed` before them: kept.
    assert_eq!(f.db.collect_garbage(), 0);

    // A later snapshot: the rest, then what came after.
    let mut w = f.db.write_txn(&[t]).unwrap();
    t.delete_key(&mut w, &1u32).unwrap();
    let r2 = w.commit().unwrap();
    assert!(watch.is_closed());
    let (it, _) = borrowed.iter(&r2).unwrap();
    let rest: Vec<_> = it
        .map(|c| {
            assert_eq!(c.is_delete(), c.kind == ChangeKind::Delete);
            key(&c.to_owned())
        })
        .collect();
    assert_eq!(rest[..3], expected[3..]);
    assert_eq!(rest.len(), 4);
    assert_eq!((rest[3].0, rest[3].2), (1, ChangeKind::Delete));
    assert_eq!(borrowed.position(), t.revision(&r2).unwrap());
    // Nothing new: an empty iterator that leaves the position alone.
    let (mut it, _) = borrowed.iter(&r2).unwrap();
    assert!(it.next().is_none());
    drop(it);
    assert_eq!(borrowed.position(), t.revision(&r2).unwrap());
    // Both consumers are past the first two deletes; the third waits for
    // `copied`.
    assert_eq!(f.db.collect_garbage(), 2);
    copied.next(&r2).unwrap();
    assert_eq!(f.db.collect_garbage(), 1);
}

/// The background collector starts with its first work: inserts, updates
/// and deletes no consumer follows start no thread; a delete under a change
/// stream does, and the thread then frees what the consumer has processed.
#[test]
fn collector_starts_with_the_first_garbage() {
    let db = Db::with_options(
        DbOptions::default().with_gc_interval(Some(std::time::Duration::from_millis(5))),
    );
    let f = table_in(&db, "objs");
    let t = &f.table;
    for id in 0..4 {
        insert_committed(&db, t, obj(id, &format!("n{id}"), &[], 0));
    }
    let mut w = db.write_txn(&[t]).unwrap();
    assert!(t.delete_key(&mut w, &0u32).unwrap().is_some());
    w.commit().unwrap();
    assert!(!db.collector_started(), "nothing to collect yet");
    let mut w = db.write_txn(&[t]).unwrap();
    let mut ch = t.changes(&mut w).unwrap();
    w.commit().unwrap();
    assert!(!db.collector_started(), "a consumer alone is no garbage");
    let mut w = db.write_txn(&[t]).unwrap();
    assert!(t.delete_key(&mut w, &1u32).unwrap().is_some());
    let r = w.commit().unwrap();
    assert!(db.collector_started());
    assert_eq!(t.graveyard_len(&r).unwrap(), 1);
    let (batch, _) = ch.next(&r).unwrap();
    assert!(batch.iter().any(|c| c.is_delete()));
    // Processed: the thread collects it within a few of its rounds.
    wait_until_collected(&db, t);
}

/// A reader that lets go last of a snapshot another thread published hands
/// it back to that thread, and the collector (its fallback) starts then.
#[test]
fn collector_starts_when_a_snapshot_is_handed_back() {
    let db = Db::new();
    let f = table_in(&db, "objs");
    let t = &f.table;
    insert_committed(&db, t, obj(1, "n1", &[], 0));
    let db2 = db.clone();
    let (go, wait) = std::sync::mpsc::channel::<()>();
    let (held, holding) = std::sync::mpsc::channel::<()>();
    let reader = std::thread::spawn(move || {
        let mut r = db2.reader();
        r.read_txn();
        held.send(()).unwrap();
        wait.recv().unwrap();
        r.read_txn();
    });
    holding.recv().unwrap();
    insert_committed(&db, t, obj(2, "n2", &[], 0));
    assert!(
        !db.collector_started(),
        "the reader still holds the old snapshot"
    );
    go.send(()).unwrap();
    reader.join().unwrap();
    assert!(db.collector_started());
}
