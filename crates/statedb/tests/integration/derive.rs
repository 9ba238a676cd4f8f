//! Derived tables: an output table kept as a function of an input's changes.

use std::time::{Duration, Instant};

use statedb::{derive, Db, DeriveResult, Index, Table};

/// Polls `f` until it holds, for at most five seconds.
fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let until = Instant::now() + Duration::from_secs(5);
    while !f() {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

type Pod = (u32, i64);

struct Fixture {
    db: Db,
    pods: Table<Pod>,
    doubled: Table<Pod>,
}

fn fixture(unique_value: bool) -> Fixture {
    let db = Db::new();
    let by_id = Index::unique("id", |p: &Pod| p.0);
    let pods = db.create_table("pods", &by_id, &[]).unwrap();
    let out_id = Index::unique("id", |p: &Pod| p.0);
    let by_value = Index::unique("value", |p: &Pod| p.1);
    let secondary = if unique_value {
        vec![by_value.erase()]
    } else {
        vec![]
    };
    let doubled = db.create_table("doubled", &out_id, &secondary).unwrap();
    Fixture { db, pods, doubled }
}

/// Positive values doubled, zero skipped, negative ones and deletes removed.
fn double(p: &Pod, deleted: bool) -> DeriveResult<Pod> {
    match p.1 {
        _ if deleted => DeriveResult::Delete(*p),
        0 => DeriveResult::Skip,
        v if v < 0 => DeriveResult::Delete(*p),
        v => DeriveResult::Upsert((p.0, v * 2)),
    }
}

fn contents(f: &Fixture) -> Vec<Pod> {
    let txn = f.db.read_txn();
    f.doubled
        .read(&txn)
        .unwrap()
        .all()
        .map(|o| *o.value())
        .collect()
}

fn write(f: &Fixture, ops: &[(u32, Option<i64>)]) {
    let mut txn = f.db.write_txn(&[&f.pods]).unwrap();
    for &(id, v) in ops {
        match v {
            Some(v) => drop(f.pods.insert(&mut txn, (id, v)).unwrap()),
            None => drop(f.pods.delete_key(&mut txn, &id).unwrap()),
        }
    }
    txn.commit().unwrap();
}

#[test]
fn output_follows_inserts_updates_deletes_and_skips() {
    let f = fixture(false);
    // Objects present before the derivation starts come first, as inserts.
    write(&f, &[(1, Some(10)), (2, Some(0))]);
    let d = derive(&f.db, &f.pods, &f.doubled, double).unwrap();
    eventually("the existing objects", || contents(&f) == vec![(1, 20)]);
    write(&f, &[(2, Some(5)), (3, Some(7))]);
    eventually("inserts", || {
        contents(&f) == vec![(1, 20), (2, 10), (3, 14)]
    });
    write(&f, &[(1, Some(-1)), (3, None), (2, Some(6))]);
    eventually("an update, a delete by value and a delete", || {
        contents(&f) == vec![(2, 12)]
    });
    assert_eq!(d.processed(), 7);
    assert_eq!(d.errors(), (0, None));
    // Stopped: later changes stay in the input.
    d.stop();
    write(&f, &[(9, Some(1))]);
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(contents(&f), vec![(2, 12)]);
}

#[test]
fn output_is_initialized_only_after_its_input() {
    let f = fixture(false);
    let mut txn = f.db.write_txn(&[&f.pods]).unwrap();
    let loading = f.pods.register_initializer(&mut txn, "loader").unwrap();
    f.pods.insert(&mut txn, (1, 1)).unwrap();
    txn.commit().unwrap();
    let _d = derive(&f.db, &f.pods, &f.doubled, double).unwrap();
    eventually("the first object", || contents(&f) == vec![(1, 2)]);
    let pending = f.doubled.pending_initializers(&f.db.read_txn()).unwrap();
    assert_eq!(pending, vec!["derive:pods".to_string()]);
    std::thread::sleep(Duration::from_millis(30));
    assert!(!f.doubled.initialized(&f.db.read_txn()).unwrap());

    // The input's last load and its initialization in one transaction: the
    // output is initialized with that object in it.
    let mut txn = f.db.write_txn(&[&f.pods]).unwrap();
    f.pods.insert(&mut txn, (2, 2)).unwrap();
    f.pods.initializer_done(&mut txn, &loading).unwrap();
    txn.commit().unwrap();
    eventually("the output initialized", || {
        f.doubled.initialized(&f.db.read_txn()).unwrap()
    });
    assert_eq!(contents(&f), vec![(1, 2), (2, 4)]);
}

#[test]
fn a_refused_write_is_counted_and_the_rest_go_on() {
    let f = fixture(true);
    let d = derive(&f.db, &f.pods, &f.doubled, double).unwrap();
    // Both double to 8: the unique `value` index refuses the second.
    write(&f, &[(1, Some(4)), (2, Some(4)), (3, Some(5))]);
    eventually("the batch", || d.processed() == 3);
    assert_eq!(contents(&f), vec![(1, 8), (3, 10)]);
    let (n, last) = d.errors();
    assert_eq!(n, 1);
    assert!(last.unwrap().contains("value"), "names the index");
    write(&f, &[(1, None), (2, Some(4))]);
    eventually("the retry by a later change", || {
        contents(&f) == vec![(2, 8), (3, 10)]
    });
}
