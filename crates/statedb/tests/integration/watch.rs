//! Watch semantics both ways: a watch fires on writes that may change its
//! result and not on writes that cannot (point gets and prefixes).

use std::future::Future;
use std::time::Duration;

use crate::common::*;

fn populated() -> Fixture {
    let f = fixture();
    let mut w = f.db.write_txn(&[&f.table]).unwrap();
    for i in 0..200u32 {
        let tag = if i % 2 == 0 { "even" } else { "odd" };
        f.table
            .insert(&mut w, obj(i, &format!("n{i}"), &[tag], (i % 5) as i16))
            .unwrap();
    }
    w.commit().unwrap();
    drop(w);
    f
}

fn write(f: &Fixture, o: Obj) {
    let mut w = f.db.write_txn(&[&f.table]).unwrap();
    f.table.insert(&mut w, o).unwrap();
    w.commit().unwrap();
}

#[test]
fn point_get_fires_only_for_its_key() {
    let f = populated();
    let r = f.db.read_txn();
    let (o, w_id) = f.table.get_watch(&r, &f.by_id, &10).unwrap();
    assert_eq!(o.unwrap().name, "n10");
    let (_, w_name) = f.table.get_watch(&r, &f.by_name, "n10").unwrap();
    write(&f, obj(11, "n11", &["odd"], 1));
    write(&f, obj(300, "n300", &[], 1));
    assert!(!w_id.is_closed(), "other keys must not fire a point get");
    assert!(!w_name.is_closed());
    write(&f, obj(10, "n10", &["even"], 0));
    assert!(w_id.is_closed());
    assert!(w_name.is_closed());
}

/// Watches taken from a snapshot nobody holds any more: the commit frees
/// the version it replaced before it notifies, so the superseded nodes'
/// watches are fired by their last holder (without the slot's
/// compare-and-swap). They still fire, for their keys only.
#[test]
fn watches_of_a_dropped_snapshot_fire() {
    let f = populated();
    let r = f.db.read_txn();
    let (_, w_id) = f.table.get_watch(&r, &f.by_id, &10).unwrap();
    let (_, w_missing) = f.table.get_watch(&r, &f.by_id, &1000).unwrap();
    let (_, w_other) = f.table.get_watch(&r, &f.by_id, &150).unwrap();
    drop(r);
    write(&f, obj(10, "n10b", &["even"], 0));
    assert!(w_id.is_closed());
    assert!(!w_other.is_closed(), "another key's watch must not fire");
    write(&f, obj(1000, "new", &[], 0));
    assert!(w_missing.is_closed());
    assert!(!w_other.is_closed());
}

/// A missing key's watch fires when the key is inserted, and not for the
/// writes beside it (ids 199, 150 and 1001 share its node or its parent;
/// a transaction that inserts it and deletes it again leaves it missing).
#[test]
fn missing_key_fires_on_insert() {
    let f = populated();
    let r = f.db.read_txn();
    let (o, w) = f.table.get_watch(&r, &f.by_id, &1000).unwrap();
    assert!(o.is_none());
    let (_, w_name) = f.table.get_watch(&r, &f.by_name, "n1000").unwrap();
    write(&f, obj(199, "n199", &["odd"], 4));
    write(&f, obj(150, "n150b", &["even"], 0));
    write(&f, obj(1001, "n1001", &[], 0));
    let mut t = f.db.write_txn(&[&f.table]).unwrap();
    f.table.insert(&mut t, obj(1000, "n1000", &[], 0)).unwrap();
    f.table.delete_key(&mut t, &1000u32).unwrap();
    t.commit().unwrap();
    assert!(
        !w.is_closed(),
        "writes beside a missing key fired its watch"
    );
    assert!(!w_name.is_closed());
    write(&f, obj(1000, "n1000", &[], 0));
    assert!(w.is_closed() && w_name.is_closed());
}

#[test]
fn delete_fires_point_get() {
    let f = populated();
    let (_, w) = f.table.get_watch(&f.db.read_txn(), &f.by_id, &5).unwrap();
    let mut t = f.db.write_txn(&[&f.table]).unwrap();
    f.table.delete_key(&mut t, &6u32).unwrap();
    t.commit().unwrap();
    assert!(!w.is_closed());
    let mut t = f.db.write_txn(&[&f.table]).unwrap();
    f.table.delete_key(&mut t, &5u32).unwrap();
    t.commit().unwrap();
    assert!(w.is_closed());
}

#[test]
fn non_unique_list_fires_only_for_its_key() {
    let f = populated();
    let r = f.db.read_txn();
    let (it, w_even) = f.table.list_watch(&r, &f.by_tag, "even").unwrap();
    assert_eq!(it.count(), 100);
    let (it, w_g0) = f.table.list_watch(&r, &f.by_group, &0).unwrap();
    assert_eq!(it.count(), 40);
    let (_, w_get) = f.table.get_watch(&r, &f.by_tag, "odd").unwrap();
    // An odd object in group 1 changes: "even" and group 0 cannot change.
    write(&f, obj(1, "n1", &["odd"], 1));
    assert!(!w_even.is_closed());
    assert!(!w_g0.is_closed());
    assert!(w_get.is_closed(), "the first odd object changed");
    // An object gains the tag: fires.
    write(&f, obj(3, "n3", &["odd", "even"], 3));
    assert!(w_even.is_closed());
    assert!(!w_g0.is_closed());
}

#[test]
fn prefix_fires_only_under_its_prefix() {
    let f = populated();
    let r = f.db.read_txn();
    let (it, w) = f.table.prefix_watch(&r, &f.by_name, "n1").unwrap();
    assert_eq!(it.count(), 111); // n1, n10..n19, n100..n199
    write(&f, obj(25, "n25", &[], 0));
    write(&f, obj(500, "m500", &[], 0));
    assert!(!w.is_closed());
    write(&f, obj(500, "n1x", &[], 0));
    assert!(w.is_closed());
    // Non-unique prefix.
    let (_, w) = f
        .table
        .prefix_watch(&f.db.read_txn(), &f.by_tag, "ev")
        .unwrap();
    write(&f, obj(7, "n7", &["odd"], 2));
    assert!(!w.is_closed());
    write(&f, obj(7, "n7", &["evil"], 2));
    assert!(w.is_closed());
}

/// Queries whose result is one object beside many siblings (a tag only one
/// object has, the name `n199` among `n190`..`n198`), or nothing (a missing
/// name whose path ends at `n199`, a prefix no name has): the siblings'
/// writes leave them quiet, a write that changes the result fires them.
#[test]
fn narrow_queries_ignore_their_siblings() {
    let f = fixture();
    let mut w = f.db.write_txn(&[&f.table]).unwrap();
    for i in 0..200u32 {
        let tag = format!("node-{}", 50 + i % 10);
        f.table
            .insert(&mut w, obj(i, &format!("n{i}"), &[tag.as_str()], 0))
            .unwrap();
    }
    // The one object tagged `node-60`, beside `node-50`..`node-59`.
    f.table
        .insert(&mut w, obj(500, "m500", &["node-60"], 0))
        .unwrap();
    w.commit().unwrap();
    drop(w);
    let r = f.db.read_txn();
    let (it, w_tag) = f.table.list_watch(&r, &f.by_tag, "node-60").unwrap();
    assert_eq!(it.count(), 1);
    let (it, w_name) = f.table.prefix_watch(&r, &f.by_name, "n199").unwrap();
    assert_eq!(it.count(), 1);
    let (o, w_missing) = f.table.get_watch(&r, &f.by_name, "n1999").unwrap();
    assert!(o.is_none());
    let (it, w_empty) = f.table.prefix_watch(&r, &f.by_name, "n1999").unwrap();
    assert_eq!(it.count(), 0);
    write(&f, obj(195, "n195", &["node-55"], 1));
    write(&f, obj(600, "n198x", &["node-59"], 0));
    write(&f, obj(601, "n1x", &["node-5"], 0));
    assert!(
        !w_tag.is_closed(),
        "a sibling tag's write fired node-60's list"
    );
    assert!(
        !w_name.is_closed(),
        "a sibling name's write fired n199's prefix"
    );
    assert!(
        !w_missing.is_closed(),
        "a sibling name's write fired n1999's get"
    );
    assert!(
        !w_empty.is_closed(),
        "a sibling name's write fired an empty prefix"
    );
    write(&f, obj(602, "n19990", &["node-60"], 0));
    assert!(w_tag.is_closed() && w_name.is_closed() && w_empty.is_closed());
    assert!(!w_missing.is_closed(), "n19990 is not n1999");
    write(&f, obj(603, "n1999", &[], 0));
    assert!(w_missing.is_closed());
}

/// A name that leaves the path of a watched prefix's node inside its
/// segment (`user/alx` beside `user/alice/*`) splits the segment above
/// the node; deleting it again merges the node back. Neither changes the
/// result of `user/alice/` (which ends where the node does) or of
/// `user/ali` (which ends inside it), so both stay quiet, until a write
/// under them.
#[test]
fn writes_beside_a_prefix_that_move_its_node_leave_it_quiet() {
    let f = fixture();
    let mut w = f.db.write_txn(&[&f.table]).unwrap();
    for (i, n) in ["user/alice/1", "user/alice/2", "user/ann", "zed"]
        .iter()
        .enumerate()
    {
        f.table.insert(&mut w, obj(i as u32, n, &[], 0)).unwrap();
    }
    w.commit().unwrap();
    drop(w);
    let r = f.db.read_txn();
    let (it, w_alice) = f.table.prefix_watch(&r, &f.by_name, "user/alice/").unwrap();
    assert_eq!(it.count(), 2);
    let (it, w_ali) = f.table.prefix_watch(&r, &f.by_name, "user/ali").unwrap();
    assert_eq!(it.count(), 2);
    write(&f, obj(10, "user/bob", &[], 0));
    let alx = obj(11, "user/alx", &[], 0);
    write(&f, alx.clone());
    let mut w = f.db.write_txn(&[&f.table]).unwrap();
    f.table.delete(&mut w, &alx).unwrap();
    w.commit().unwrap();
    drop(w);
    assert!(!w_alice.is_closed() && !w_ali.is_closed());
    write(&f, obj(12, "user/alice/3", &[], 0));
    assert!(w_alice.is_closed() && w_ali.is_closed());
}

#[test]
fn table_wide_watches_fire_on_any_write() {
    let f = populated();
    let r = f.db.read_txn();
    let (_, w_all) = f.table.all_watch(&r).unwrap();
    let (_, w_lb) = f.table.lower_bound_watch(&r, &f.by_group, &4).unwrap();
    let (_, w_rev) = f.table.list_revision_watch(&r, 1000).unwrap();
    write(&f, obj(0, "n0", &[], 0));
    assert!(w_all.is_closed());
    assert!(w_lb.is_closed());
    assert!(w_rev.is_closed());
}

#[test]
fn abort_fires_nothing() {
    let f = populated();
    let r = f.db.read_txn();
    let (_, w_all) = f.table.all_watch(&r).unwrap();
    let (_, w_id) = f.table.get_watch(&r, &f.by_id, &1).unwrap();
    let mut t = f.db.write_txn(&[&f.table]).unwrap();
    f.table.insert(&mut t, obj(1, "zz", &[], 0)).unwrap();
    f.table.delete_all(&mut t).unwrap();
    drop(t);
    assert!(!w_all.is_closed());
    assert!(!w_id.is_closed());
}

#[test]
fn watch_on_stale_snapshot_is_closed() {
    let f = populated();
    let old = f.db.read_txn();
    write(&f, obj(1, "n1", &["new"], 0));
    let (o, w) = f.table.get_watch(&old, &f.by_id, &1).unwrap();
    assert_eq!(o.unwrap().tags, vec!["odd"]);
    assert!(w.is_closed(), "the value changed since this snapshot");
}

#[test]
fn wakes_a_blocked_reader_after_publish() {
    let f = populated();
    let (_, w) = f.table.get_watch(&f.db.read_txn(), &f.by_id, &42).unwrap();
    let db = f.db.clone();
    let table = f.table.clone();
    let by_id = f.by_id.clone();
    let h = std::thread::spawn(move || {
        assert!(w.wait_timeout(Duration::from_secs(10)));
        // The new state is visible once the watch fired.
        let r = db.read_txn();
        table.get(&r, &by_id, &42).unwrap().unwrap().name.clone()
    });
    std::thread::sleep(Duration::from_millis(20));
    write(&f, obj(42, "changed", &[], 0));
    assert_eq!(h.join().unwrap(), "changed");
}

#[test]
fn watch_set_and_async() {
    let f = populated();
    let r = f.db.read_txn();
    let mut set = statedb::WatchSet::new();
    set.add(f.table.get_watch(&r, &f.by_id, &1).unwrap().1);
    set.add(f.table.get_watch(&r, &f.by_id, &2).unwrap().1);
    assert_eq!(set.wait_timeout(Duration::from_millis(5)), None);
    write(&f, obj(2, "n2", &["x"], 0));
    assert_eq!(set.wait_timeout(Duration::from_secs(5)), Some(1));
    // Awaitable on any executor: poll it by hand once closed.
    let (_, w) = f.table.get_watch(&f.db.read_txn(), &f.by_id, &3).unwrap();
    write(&f, obj(3, "n3", &["x"], 0));
    let mut fut = std::pin::pin!(w.changed());
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    assert!(fut.as_mut().poll(&mut cx).is_ready());
}
