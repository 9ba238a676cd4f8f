//! Throughput and memory of the reconciler, in the shape of Go statedb's
//! reconciler benchmark: objects inserted as pending in write transactions
//! of 1000, operations that only count, timed from the first insert until
//! the last object is done; then the heap and peak RSS.
//!
//! `cargo run --release -p reconciler --example bench -- [objects] [round_size] [inserts]`
//!
//! With `inserts`, no reconciler runs: a change stream is registered (so
//! the table keeps the revision index it would), the inserts are timed,
//! then a write-back of every status by compare-and-swap on one thread:
//! the work the reconciler's figure cannot go below while both serialise
//! on the table's lock.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use reconciler::{Config, OpError, Operations, Reconciler, Status, StatusKind, Target};
use statedb::{Db, Index, Objects, ReadTxn, Revision, Table};
use test_support::counting::{self, Counting};
use test_support::fast_mimalloc::FastMiMalloc;

/// mimalloc (as statedb's benches use), counted per thread: the inserting
/// thread and the reconciler both allocate for every object, and one set
/// of counters would have them take its cache line from each other on
/// every allocation.
#[global_allocator]
static ALLOC: Counting<FastMiMalloc> = Counting(FastMiMalloc);

/// (total bytes, live bytes, live allocations) so far.
fn now() -> (u64, u64, u64) {
    let c = counting::counts();
    (c.total_bytes, c.live_bytes as u64, c.live_allocs as u64)
}

/// Go's `testObject`: an id and a status.
#[derive(Clone, Debug)]
struct TestObject {
    id: u64,
    status: Status,
}

/// Operations that only count updates.
struct CountOps(Arc<AtomicUsize>);

impl Operations<TestObject> for CountOps {
    fn update(&mut self, _: &ReadTxn, _: Revision, _: &TestObject) -> Result<(), OpError> {
        self.0.fetch_add(1, Relaxed);
        Ok(())
    }
    fn delete(&mut self, _: &ReadTxn, _: Revision, _: &TestObject) -> Result<(), OpError> {
        Ok(())
    }
    fn prune(&mut self, _: &ReadTxn, _: Objects<'_, TestObject>) -> Result<(), OpError> {
        Ok(())
    }
}

/// Inserts `objects` pending objects, `batch` per write transaction.
fn insert(db: &Db, table: &Table<TestObject>, objects: u64, batch: u64) -> statedb::Result<()> {
    let mut next = 0u64;
    while next < objects {
        let mut w = db.write_txn(&[table])?;
        for _ in 0..batch.min(objects - next) {
            table.insert(
                &mut w,
                TestObject {
                    id: next,
                    status: Status::pending(),
                },
            )?;
            next += 1;
        }
        w.commit()?;
    }
    Ok(())
}

fn peak_rss_kib() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn mb(bytes: u64) -> f64 {
    bytes as f64 / 1e6
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let objects: u64 = args
        .next()
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(1_000_000);
    let round_size: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(1000);
    let inserts_only = args.next().is_some_and(|a| a == "inserts");
    const BATCH: u64 = 1000;

    let (total0, bytes0, objects0) = now();

    let db = Db::new();
    let id = Index::unique("id", |o: &TestObject| o.id);
    let table: Table<TestObject> = db.create_table("test-objects", &id, &[])?;
    let target = Target::new(
        &table,
        &id,
        |o| o.id,
        |o| &o.status,
        |o, status| TestObject {
            status,
            ..o.clone()
        },
    );
    let updates = Arc::new(AtomicUsize::new(0));
    let config = Config {
        round_size,
        // Go's benchmark allows 1000 rounds a second (burst 10), which
        // caps it at 1M objects/s; here rounds are not limited.
        round_rate: None,
        ..Config::default()
    };
    if inserts_only {
        let mut w = db.write_txn(&[&table])?;
        let _changes = table.changes(&mut w)?;
        w.commit()?;
        let start = Instant::now();
        insert(&db, &table, objects, BATCH)?;
        let took = start.elapsed().as_secs_f64();
        println!(
            "{objects} objects inserted in {took:.3} s: {:.0} objects/s; in use {} objects, {:.1} MB",
            objects as f64 / took,
            now().2 - objects0,
            mb(now().1 - bytes0),
        );
        print_lock(&db);
        // The write-back alone: every object's status set done by
        // compare-and-swap, in transactions of 1000, on one thread.
        let start = Instant::now();
        let done = Status::done_at(reconciler::Timestamp::now());
        let mut next = 0u64;
        while next < objects {
            let r = db.read_txn();
            let view = table.read(&r)?;
            let mut w = db.write_txn(&[&table])?;
            for i in next..(next + BATCH).min(objects) {
                let o = view.get(&id, &i).ok_or("missing")?;
                let new = TestObject {
                    status: done.clone(),
                    ..o.value().clone()
                };
                table.compare_and_swap(&mut w, o.revision(), new)?;
            }
            w.commit()?;
            next += BATCH;
        }
        let took = start.elapsed().as_secs_f64();
        db.collect_garbage();
        println!(
            "{objects} statuses written back in {took:.3} s: {:.0} objects/s; in use {} objects, {:.1} MB",
            objects as f64 / took,
            now().2 - objects0,
            mb(now().1 - bytes0),
        );
        print_lock(&db);
        return Ok(());
    }
    let rec = Reconciler::start(&db, target, CountOps(updates.clone()), config)?;

    let start = Instant::now();
    let mut next = 0u64;
    while next < objects {
        let mut w = db.write_txn(&[&table])?;
        for _ in 0..BATCH.min(objects - next) {
            table.insert(
                &mut w,
                TestObject {
                    id: next,
                    status: Status::pending(),
                },
            )?;
            next += 1;
        }
        w.commit()?;
    }
    let inserted = start.elapsed();
    // Wait for the last object to be done.
    loop {
        let r = db.read_txn();
        let (obj, watch) = table.read(&r)?.get_watch(&id, &(objects - 1));
        if obj.is_some_and(|o| o.status.kind() == StatusKind::Done) {
            break;
        }
        drop(r);
        watch.wait_timeout(Duration::from_secs(10));
    }
    let took = start.elapsed();

    let r = db.read_txn();
    let done = table
        .all(&r)?
        .filter(|o| o.status.kind() == StatusKind::Done)
        .count();
    assert_eq!(
        updates.load(Relaxed) as u64,
        objects,
        "every object updated once"
    );
    assert_eq!(done as u64, objects, "every object done");
    drop(r);
    db.collect_garbage();

    let (total, live_bytes, live_objects) = now();
    let (total, live_bytes, live_objects) =
        (total - total0, live_bytes - bytes0, live_objects - objects0);
    let secs = took.as_secs_f64();
    println!(
        "{objects} objects reconciled in {secs:.3} s (inserts done at {:.3} s; round size {round_size}, write batches of {BATCH})",
        inserted.as_secs_f64()
    );
    println!("throughput {:.0} objects/s", objects as f64 / secs);
    println!(
        "allocated {:.1} MB in total; in use {live_objects} objects, {:.1} MB ({:.0} B per object)",
        mb(total),
        mb(live_bytes),
        live_bytes as f64 / objects as f64
    );
    if let Some(kib) = peak_rss_kib() {
        println!("peak RSS {:.1} MB", kib as f64 * 1024.0 / 1e6);
    }
    let (rounds, _) = rec.counts();
    println!("{rounds} rounds");
    print_lock(&db);
    rec.stop();
    Ok(())
}

/// The table lock's figures so far: waits and the mean hold.
fn print_lock(db: &Db) {
    for t in db.stats() {
        let per = |total: Duration, timed: u64| total.as_secs_f64() * 1e3 / timed.max(1) as f64;
        println!(
            "table lock: {} waits, {:.1} ms waiting in all; held {:.3} ms per transaction (of {} timed)",
            t.lock_wait.count,
            t.lock_wait.total.as_secs_f64() * 1e3,
            per(t.lock_hold.total, t.lock_hold.timed),
            t.lock_hold.timed
        );
    }
}
