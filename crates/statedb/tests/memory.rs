//! Memory: heap bytes per object of a 100k-object table (primary index
//! alone, after single-row rewrites, with a non-unique secondary index, with
//! the revision index), and the heap returning to the empty table's once
//! every object is deleted and every snapshot dropped. A counting global
//! allocator measures live heap bytes (as requested, before the allocator's
//! own rounding); the binary has this single test so no other test thread
//! allocates meanwhile. `cargo test -p statedb --test memory -- --nocapture`
//! prints the figures.

// The benchmark suite's fixtures: Go's `testObject`, its tables.
#[path = "../benches/common.rs"]
mod common;

use std::alloc::System;

use common::{new_db_named, obj, tagged, Bench, TestObject};
use statedb::{Db, DbOptions, Table};
use test_support::counting::{live, Counting};

#[global_allocator]
static A: Counting<System> = Counting(System);

const N: u64 = 100_000;

/// What a stored object itself takes: the value with its two revisions
/// behind the `Arc`'s count. The rest of a table's bytes are its indexes.
fn object_bytes() -> usize {
    std::mem::size_of::<statedb::Object<TestObject>>() + std::mem::size_of::<usize>()
}

/// Fills `table` with ids `0..N` in transactions of 1000; returns the heap
/// bytes per object this added (indexes and objects).
fn fill(db: &Db, table: &Table<TestObject>, secondary: bool) -> f64 {
    let before = live();
    let mut id = 0;
    while id < N {
        let mut w = db.write_txn(&[table]).unwrap();
        for _ in 0..1000 {
            let o = if secondary { tagged(id) } else { obj(id) };
            table.insert(&mut w, o).unwrap();
            id += 1;
        }
        w.commit().unwrap();
    }
    (live() - before) as f64 / N as f64
}

/// `rounds` single-row rewrites at pseudo-random ids.
fn rewrite(db: &Db, table: &Table<TestObject>, rounds: u64) {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..rounds {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let mut w = db.write_txn(&[table]).unwrap();
        table.insert(&mut w, obj(x % N)).unwrap();
        w.commit().unwrap();
    }
}

fn delete_all(db: &Db, table: &Table<TestObject>) {
    let mut w = db.write_txn(&[table]).unwrap();
    assert_eq!(table.delete_all(&mut w).unwrap(), N as usize);
    w.commit().unwrap();
}

#[test]
fn bytes_per_object_and_everything_freed_after_delete_all() {
    // No collector thread: nothing is deleted under a change stream except
    // in the last part, whose consumer is dropped before the deletes.
    let db = Db::with_options(DbOptions::default().with_gc_interval(None));
    // The tables, empty, and one transaction and one snapshot that set up
    // this thread's and the database's reusable parts (a spare root
    // vector, key buffers, the process's first chunk of reader slots).
    let before = live();
    let Bench { table: plain, .. } = new_db_named(&db, "plain", false);
    let empty_table = live() - before;
    println!("an empty table with one index: {empty_table} B");
    let Bench { table: tags, .. } = new_db_named(&db, "tagged", true);
    let Bench { table: revs, .. } = new_db_named(&db, "revisions", false);
    let mut w = db.write_txn(&[&plain]).unwrap();
    plain.insert(&mut w, obj(0)).unwrap();
    w.commit().unwrap();
    let mut w = db.write_txn(&[&plain]).unwrap();
    plain.delete_all(&mut w).unwrap();
    w.commit().unwrap();
    drop(db.read_txn());
    let empty = live();
    let obj = object_bytes() as f64;

    // Primary index only, as filled.
    let per = fill(&db, &plain, false);
    println!(
        "primary index: {per:.1} B per object ({:.1} for the index)",
        per - obj
    );
    assert!(
        per - obj < 80.0,
        "primary index: {:.1} B per object",
        per - obj
    );

    // After 100k single-row rewrites: deltas over the node256s and the
    // older node256s that newer ones borrow from stay alive.
    let before = live();
    rewrite(&db, &plain, N);
    let grown = (live() - before) as f64 / N as f64;
    println!("after {N} single-row rewrites: {grown:.1} B per object more");
    assert!(grown < 40.0, "rewrites kept {grown:.1} B per object more");
    delete_all(&db, &plain);

    // Non-unique secondary index, two tags per object.
    let per = fill(&db, &tags, true);
    println!(
        "with a two-tag secondary index: {per:.1} B per object ({:.1} for the indexes)",
        per - obj
    );
    assert!(per - obj < 250.0, "tags: {:.1} B per object", per - obj);
    delete_all(&db, &tags);

    // The revision index, built on the first write after a consumer
    // registers (statedb design.md, "Data layout").
    fill(&db, &revs, false);
    let before = live();
    let mut w = db.write_txn(&[&revs]).unwrap();
    let changes = revs.changes(&mut w).unwrap();
    w.commit().unwrap();
    rewrite(&db, &revs, 1);
    let per = (live() - before) as f64 / N as f64;
    println!("revision index: {per:.1} B per object more");
    assert!(per < 80.0, "revision index: {per:.1} B per object");
    drop(changes);
    delete_all(&db, &revs);

    // Every object and node is freed, however the trees were built: the
    // database is back to its empty tables' bytes, but for this thread's
    // cache of freed node256 blocks in `part` (at most eight, ~2.2 KiB
    // each) and key buffers the tables' writers keep.
    let left = live() - empty;
    println!("after deleting every object: {left} B more than the empty tables");
    assert!(
        left < 8 * 2304 + 2048,
        "{left} B left after deleting everything"
    );
    let r = db.read_txn();
    for t in [&plain, &tags, &revs] {
        assert_eq!(t.len(&r).unwrap(), 0);
    }
}
