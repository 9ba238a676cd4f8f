//! PropagationDelay: time from a write transaction on table A to a consumer
//! having written the derived rows into table B, batches of 10. Prints
//! p50/p90/p99 in µs for two shapes, one after the other in one run:
//!
//! * `PropagationDelay`: Go statedb's `BenchmarkDB_PropagationDelay`, the
//!   shape its anchor figures come from. One thread rewrites ids 0..9 in A,
//!   waits for A's revision watch, reads A's rows from the last revision it
//!   copied on, writes them into B, commits and waits for B's watch.
//! * `PropagationDelay/cross_thread`: the consumer is a second thread
//!   following A through a change stream (`Table::changes`), every row is a
//!   new object (ids counting up, both tables cleared every 100k), and the
//!   writer waits on a point watch of B for the last row. Each side pays a
//!   wake-up and the cache misses of data the other core wrote.
//!
//! `cargo bench -p statedb --bench propagation [-- ROUNDS]`; in the
//! cross-thread shape both threads spin up to 50 µs before blocking
//! (`STATEDB_BENCH_NOSPIN=1`: block at once).
//! `STATEDB_BENCH_INLINE_FREE=1`: no background collector (commits free what
//! they supersede either way; without the collector, snapshots a reader
//! drops last are freed by that reader too).
//! `STATEDB_BENCH_BREAKDOWN=1` also prints the median of each stage: the
//! writer's transaction, the consumer's wake-up, its read of the changes,
//! its transaction, and the writer's wake-up.

mod common;

use test_support::fast_mimalloc;

/// Same allocator as the criterion suite (see `statedb.rs`).
#[global_allocator]
static ALLOC: fast_mimalloc::FastMiMalloc = fast_mimalloc::FastMiMalloc;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use statedb::Db;

const BATCH: u64 = 10;

/// Both sides wait with [`statedb::wait_spin`]: poll for `spin`, then
/// block (`STATEDB_BENCH_NOSPIN=1`: block at once).
fn wait(w: &statedb::Watch, spin: Duration, timeout: Duration) -> bool {
    statedb::wait_spin(w, spin, timeout)
}

/// The writer's transaction: `ids` inserted into `a`'s table, committed.
fn write_batch(a: &Bench, ids: std::ops::Range<u64>) {
    let mut w = a.db.write_txn(&[&a.table]).unwrap();
    for id in ids {
        a.table.insert(&mut w, obj(id)).unwrap();
    }
    w.commit().unwrap();
}

/// Go's shape, in one thread: returns the sorted round times in ns.
fn same_thread(rounds: usize) -> Vec<u64> {
    let db = Db::with_options(env_db_options());
    let a = new_db_with(&db, "a", false, env_layout());
    let b = new_db_with(&db, "b", false, env_layout());
    let mut samples = Vec::with_capacity(rounds);
    // A watch on A's revision index from the last read; none yet.
    let mut watch_a: Option<statedb::Watch> = None;
    let mut revision = 0;
    let mut rows: Vec<TestObject> = Vec::with_capacity(BATCH as usize);
    let warmup = rounds / 10;
    for round in 0..rounds + warmup {
        let start = Instant::now();
        write_batch(&a, 0..BATCH);
        if let Some(watch) = watch_a.take() {
            watch.wait();
        }
        let r = db.read_txn();
        let (_, watch_b) = b.table.all_watch(&r).unwrap();
        let (changed, watch) = a.table.list_revision_watch(&r, revision).unwrap();
        watch_a = Some(watch);
        rows.clear();
        rows.extend(changed.map(|o| o.value().clone()));
        // Exactly this round's rows: the last revision copied on was
        // rewritten with the rest.
        assert_eq!(rows.len(), BATCH as usize);
        let mut w = db.write_txn(&[&b.table]).unwrap();
        for o in rows.drain(..) {
            b.table.insert(&mut w, o).unwrap();
        }
        w.commit().unwrap();
        revision = a.table.revision(&r).unwrap();
        drop(r);
        watch_b.wait();
        if round >= warmup {
            samples.push(start.elapsed().as_nanos() as u64);
        }
    }
    assert_eq!(b.table.len(&db.read_txn()).unwrap(), BATCH as usize);
    samples.sort_unstable();
    samples
}

fn main() {
    let rounds: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(20_000);
    let go = same_thread(rounds);
    let us = |s: &[u64], p| pct(s, p) as f64 / 1000.0;
    println!(
        "PropagationDelay (Go's shape: one thread, ids 0..9; {} rounds, batch {BATCH}): p50 {:.1} µs  p90 {:.1} µs  p99 {:.1} µs",
        go.len(),
        us(&go, 0.50),
        us(&go, 0.90),
        us(&go, 0.99)
    );
    let spin = if std::env::var_os("STATEDB_BENCH_NOSPIN").is_some() {
        Duration::ZERO
    } else {
        Duration::from_micros(50)
    };
    let db = Db::with_options(env_db_options());
    let a = new_db_with(&db, "a", false, env_layout());
    let b = new_db_with(&db, "b", false, env_layout());
    let stop = Arc::new(AtomicBool::new(false));
    // Stage stamps of the consumer's last batch (ns since `epoch`): woke,
    // opened its read transaction, read the changes, about to commit.
    // Published by the commit's Release store.
    let epoch = Instant::now();
    let stamps: Arc<[AtomicU64; 4]> = Arc::new(Default::default());

    let mut w = db.write_txn(&[&a.table]).unwrap();
    let mut changes = a.table.changes(&mut w).unwrap();
    w.commit().unwrap();
    let consumer = {
        let (db, ta, tb, stop) = (db.clone(), a.table.clone(), b.table.clone(), stop.clone());
        let stamps = stamps.clone();
        std::thread::spawn(move || {
            let _ = ta;
            let mut woke = 0u64;
            let ns = || epoch.elapsed().as_nanos() as u64;
            // (id, deleted) of each change: the changes are borrowed from
            // the snapshot (`Changes::iter`), no object reference taken.
            let mut batch: Vec<(u64, bool)> = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let r = db.read_txn();
                let opened = ns();
                batch.clear();
                let (it, watch) = changes.iter(&r).unwrap();
                batch.extend(it.map(|c| (c.object.id, c.is_delete())));
                if !batch.is_empty() {
                    let read = ns();
                    let mut w = db.write_txn(&[&tb]).unwrap();
                    for &(id, deleted) in &batch {
                        if deleted {
                            tb.delete_key(&mut w, &id).unwrap();
                        } else {
                            tb.insert(&mut w, obj(id)).unwrap();
                        }
                    }
                    stamps[0].store(woke, Ordering::Relaxed);
                    stamps[1].store(opened, Ordering::Relaxed);
                    stamps[2].store(read, Ordering::Relaxed);
                    // Before the commit: the writer reads these once it
                    // sees B's rows, i.e. after the commit (which publishes
                    // with Release; the writer's read transaction acquires).
                    stamps[3].store(ns(), Ordering::Relaxed);
                    w.commit().unwrap();
                }
                // Let go of the snapshot before waiting: a snapshot held
                // across the wait keeps its version alive, and whoever drops
                // a version last frees it.
                drop(r);
                wait(&watch, spin, Duration::from_millis(50));
                woke = ns();
            }
        })
    };

    let mut samples = Vec::with_capacity(rounds);
    // The first transaction alone (write A, commit, notify).
    let mut own = Vec::with_capacity(rounds);
    let breakdown = std::env::var_os("STATEDB_BENCH_BREAKDOWN").is_some();
    // Per round: consumer wake-up, its read transaction, its read of the
    // changes, its inserts, the rest (its commit and the writer's wake-up).
    let mut stages: [Vec<u64>; 5] = Default::default();
    let mut id = 0u64;
    let warmup = rounds / 10;
    for round in 0..rounds + warmup {
        let start = Instant::now();
        write_batch(&a, id..id + BATCH);
        id += BATCH;
        let written = start.elapsed();
        loop {
            let r = db.read_txn();
            let (o, watch) = b.table.get_watch(&r, &b.by_id, &(id - 1)).unwrap();
            if o.is_some() {
                break;
            }
            // As the consumer: no snapshot held while waiting.
            drop(r);
            wait(&watch, spin, Duration::from_secs(10));
        }
        if round >= warmup {
            let end = epoch.elapsed().as_nanos() as u64;
            samples.push(start.elapsed().as_nanos() as u64);
            own.push(written.as_nanos() as u64);
            if breakdown {
                let committed = (start + written).duration_since(epoch).as_nanos() as u64;
                let [woke, opened, read, wrote] =
                    [0, 1, 2, 3].map(|i| stamps[i].load(Ordering::Relaxed));
                // The consumer's wake-up is measured only in rounds where it
                // woke after the writer's `commit` returned (the watch fires
                // inside it); the other stages in every round.
                if woke >= committed {
                    stages[0].push(woke - committed);
                }
                stages[1].push(opened.saturating_sub(woke));
                stages[2].push(read.saturating_sub(opened));
                stages[3].push(wrote.saturating_sub(read));
                stages[4].push(end.saturating_sub(wrote));
            }
        }
        if id > 100_000 {
            // Keep the tables small: clear both (the consumer follows).
            let mut w = db.write_txn(&[&a.table]).unwrap();
            a.table.delete_all(&mut w).unwrap();
            w.commit().unwrap();
            id = 0;
            loop {
                let r = db.read_txn();
                let (_, watch) = b.table.all_watch(&r).unwrap();
                if b.table.len(&r).unwrap() == 0 {
                    break;
                }
                watch.wait();
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    consumer.join().unwrap();
    samples.sort_unstable();
    own.sort_unstable();
    let us = |p| pct(&samples, p) as f64 / 1000.0;
    println!(
        "PropagationDelay/cross_thread (spin {} µs, key layout {:?})",
        spin.as_micros(),
        env_layout()
    );
    println!(
        "PropagationDelay/cross_thread ({} rounds, batch {BATCH}): p50 {:.1} µs  p90 {:.1} µs  p99 {:.1} µs",
        samples.len(),
        us(0.50),
        us(0.90),
        us(0.99)
    );
    println!(
        "  of which the writer's own transaction (10 inserts, commit): p50 {:.1} µs  p90 {:.1} µs",
        pct(&own, 0.50) as f64 / 1000.0,
        pct(&own, 0.90) as f64 / 1000.0
    );
    if breakdown {
        for (s, name) in stages.iter_mut().zip([
            "consumer wakes",
            "consumer opens a read transaction",
            "consumer reads the changes",
            "consumer's 10 inserts",
            "consumer's commit + writer wakes",
        ]) {
            s.sort_unstable();
            println!(
                "  {name}: p50 {:.2} µs ({} of {} rounds)",
                pct(s, 0.50) as f64 / 1000.0,
                s.len(),
                samples.len()
            );
        }
    }
}
