//! Single-row write transactions at random ids on a 100k-object table (the
//! write side of the KV95 bench), or with `seq` at ids `0, 1, 2, ...` modulo
//! the table size (the suite's `WriteTxn_1` on 1000 objects), in a fresh
//! process, for profilers.
//!
//! `cargo run --release -p statedb --example single_writes -- [TXNS] [OBJECTS] [seq|new|perm] [ROWS]`
//! (`new`: every row is a new object, ids counting up from `OBJECTS`)
//! (`ROWS` per transaction, default 1; `perm`: each transaction rewrites
//! the whole table in one shuffled order; `STATEDB_EXTRA_TABLES=N`: N more
//! tables in the database, created before the written one with
//! `STATEDB_EXTRA_BEFORE=1`; `STATEDB_IDLE_READERS=N`: N threads that
//! each took one read transaction and then sleep through the run)

// The benchmark suite's fixtures: `TestObject`, tables, `fill`.
#[path = "../benches/common.rs"]
mod common;

use common::{fill, new_db_named, obj, shuffled};
use statedb::Db;

// The suite's allocator.
use test_support::fast_mimalloc;

#[global_allocator]
static ALLOC: fast_mimalloc::FastMiMalloc = fast_mimalloc::FastMiMalloc;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let txns: u64 = args.first().and_then(|s| s.parse().ok()).unwrap_or(200_000);
    let objects: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(100_000);
    let seq = args.get(2).is_some_and(|s| s == "seq");
    // `new`: ids OBJECTS, OBJECTS + 1, ...: every row is a new object (the
    // PropagationDelay writers' transactions).
    let fresh = args.get(2).is_some_and(|s| s == "new");
    // `perm`: every transaction rewrites the whole table in one shuffled
    // order (the suite's `GoShape/RandomInsert` on 1000 objects).
    let perm = args.get(2).is_some_and(|s| s == "perm");
    let batch: u64 = if perm {
        objects
    } else {
        args.get(3).and_then(|s| s.parse().ok()).unwrap_or(1)
    };
    // STATEDB_BENCH_INLINE_FREE=1: no background thread (commits free what
    // they supersede either way).
    let db = Db::with_options(common::env_db_options());
    // STATEDB_EXTRA_TABLES=N: N more (empty) tables in the database, which
    // every commit's new root vector carries along; created before the
    // written table with STATEDB_EXTRA_BEFORE=1 (which then has the last
    // id: its root lies in the root vector's last chunk, not its head).
    let extra: usize = std::env::var("STATEDB_EXTRA_TABLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let before = std::env::var_os("STATEDB_EXTRA_BEFORE").is_some();
    let others = |from: usize, n: usize| -> Vec<_> {
        (from..from + n)
            .map(|i| new_db_named(&db, &format!("other{i}"), false))
            .collect()
    };
    let _first = others(0, if before { extra } else { 0 });
    let b = new_db_named(&db, "test", false);
    fill(&b, objects);
    let _after = others(extra, if before { 0 } else { extra });
    let table = &b.table;
    // STATEDB_IDLE_READERS=N: threads that read once, then sleep until
    // the writes are done (what a commit pays per thread that ever read).
    let idle: usize = std::env::var("STATEDB_IDLE_READERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let stop = std::sync::Arc::new(std::sync::Barrier::new(idle + 1));
    let ready = std::sync::Arc::new(std::sync::Barrier::new(idle + 1));
    let sleepers: Vec<_> = (0..idle)
        .map(|_| {
            let (db, stop, ready) = (db.clone(), stop.clone(), ready.clone());
            std::thread::spawn(move || {
                drop(db.read_txn());
                ready.wait();
                stop.wait();
            })
        })
        .collect();
    ready.wait();
    // The suite's shuffled order (`perm`), and a fixed pseudo-random
    // sequence of ids (xorshift), the same in every run.
    let order = if perm { shuffled(objects) } else { Vec::new() };
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let t0 = std::time::Instant::now();
    for i in 0..txns {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let mut w = db.write_txn(&[table]).expect("table is in the db");
        for j in 0..batch {
            let id = if perm {
                order[j as usize]
            } else if fresh {
                objects + i * batch + j
            } else if seq {
                (i * batch + j) % objects
            } else {
                (x + j) % objects
            };
            table.insert(&mut w, obj(id)).expect("locked table");
        }
        w.commit().expect("commit");
    }
    let ns = t0.elapsed().as_nanos() as f64 / txns as f64;
    stop.wait();
    for t in sleepers {
        t.join().expect("idle reader");
    }
    println!("{ns:.0} ns per write txn of {batch} rows");
}
