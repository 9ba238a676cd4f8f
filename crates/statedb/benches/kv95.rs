//! KV95: threads doing 95% point reads (a fresh read transaction from a
//! per-thread [`statedb::Reader`], and a get) and 5%
//! single-row write transactions on a 100k-object table. Prints ops/s and
//! p50/p99 latency for 1 and 2 threads, and the scaling factor, and how
//! busy the table's write lock was (its waits and holds from `Db::stats`).
//!
//! `cargo bench -p statedb --bench kv95 [-- SECONDS [PAIRS]]`: PAIRS runs of
//! 1 then 2 threads, SECONDS each, and the median scaling with a bootstrap
//! interval (this host's speed drifts between runs seconds apart, so one
//! pair says little: `-- 0.3 30` gives a narrower interval than `-- 3 3`).
//! (`STATEDB_BENCH_LAYOUT=nibbles` for a nibble-layout table)
//!
//! Two diagnostics of what the threads share: `STATEDB_BENCH_PRIVATE=1`
//! gives every thread but the first a database of its own (nothing shared
//! but the allocator: what this machine allows two threads), and
//! `STATEDB_BENCH_WRITE_ELSEWHERE=1` sends each thread's writes to a table
//! of its own in the shared database (the reads' table never changes, but
//! every commit still replaces the database's root). `STATEDB_BENCH_STALE=1`
//! has every thread read one snapshot taken before the clock starts (never
//! a version the other thread wrote: what following new versions costs).
//! `STATEDB_BENCH_ONLY=N` runs N threads alone, for a profiler.
//!
//! `STATEDB_BENCH_CEILING=1` also runs, in every pair, two threads on a
//! database each and two copies of this bench as one-thread processes at
//! once (`STATEDB_BENCH_START_AT` lines up their clocks), and prints the
//! shared table's scaling beside theirs: what the machine gives two
//! threads that share nothing. `STATEDB_BENCH_FLOOR=1|2|3` runs the same
//! operations on stand-ins instead of the database (see [`Floor`]: the
//! least a shared table can pass between threads, and a bare part tree;
//! `scripts/kv95_floor.py` sets them side by side), and
//! `STATEDB_BENCH_SPLIT=1` times apart the reads that are the first to
//! see another thread's commit, the first after the thread's own, and the
//! rest.
//!
//! Two more for the protocol itself: `STATEDB_BENCH_WARM=N` runs N random
//! single-row write transactions (in transactions of
//! `STATEDB_BENCH_WARM_BATCH` rows, default 1) on each freshly filled
//! table before the clock starts, so that both runs of a pair measure a
//! table in the state random writes leave it in (a two-thread run writes
//! twice as much in its time); `STATEDB_BENCH_TRACE=1` prints the first
//! thread's rate in every 0.1 s of each run.

mod common;

#[path = "../../part/benches/support/fast_mimalloc.rs"]
mod fast_mimalloc;

/// Same allocator as the criterion suite (see `statedb.rs`).
#[global_allocator]
static ALLOC: fast_mimalloc::FastMiMalloc = fast_mimalloc::FastMiMalloc;

use std::hint::black_box;
use std::sync::atomic::{fence, AtomicU64, Ordering::*};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use common::*;
use rand::{Rng, SeedableRng};

const OBJECTS: u64 = 100_000;

/// (wall ops/s summed over threads, ops per on-CPU second summed over
/// threads, p50 ns, p99 ns).
fn run(threads: usize, secs: f64, private: bool) -> (f64, f64, u64, u64) {
    let b = Arc::new(new_db_layout(false, env_layout()));
    fill(&b, OBJECTS);
    warm(&b);
    start_at();
    let before = lock_figures(&b);
    let t_run = Instant::now();
    let barrier = Arc::new(Barrier::new(threads));
    let write_pct = write_pct();
    // The diagnostics in the module docs.
    let private = private || std::env::var_os("STATEDB_BENCH_PRIVATE").is_some();
    let elsewhere = std::env::var_os("STATEDB_BENCH_WRITE_ELSEWHERE").is_some();
    let stale = std::env::var_os("STATEDB_BENCH_STALE").is_some();
    let trace = std::env::var_os("STATEDB_BENCH_TRACE").is_some();
    let split = std::env::var_os("STATEDB_BENCH_SPLIT").is_some();
    let floor = env_num::<u8>("STATEDB_BENCH_FLOOR").map(|mode| Arc::new(Floor::new(mode)));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (shared, barrier, floor) = (b.clone(), barrier.clone(), floor.clone());
            std::thread::spawn(move || {
                let b = if private && t > 0 {
                    let own = Arc::new(new_db_layout(false, env_layout()));
                    fill(&own, OBJECTS);
                    own
                } else {
                    shared
                };
                // The table written.
                let wb = if elsewhere {
                    let w = Arc::new(new_db_named(&b.db, &format!("own{t}"), false));
                    fill(&w, OBJECTS);
                    w
                } else {
                    b.clone()
                };
                let mut rng = rand::rngs::StdRng::seed_from_u64(t as u64);
                let mut reader = b.db.reader();
                let stale = stale.then(|| b.db.read_txn());
                // A few KiB, allocated and touched before the clock starts:
                // a list of every latency grew by tens of MiB inside the
                // run (page faults and a copy on each doubling, both
                // threads at once).
                let mut lat = Hist::new();
                let mut marks: Vec<u64> = Vec::with_capacity(if trace { 1024 } else { 0 });
                barrier.wait();
                let cpu0 = thread_cpu_ns();
                let start = Instant::now();
                let end = start + Duration::from_secs_f64(secs);
                let mut ops = 0u64;
                let mut t0 = start;
                // (time, count) of write transactions; the rest are reads.
                let mut writes = (0u64, 0u64);
                // STATEDB_BENCH_SPLIT: (time, count) of reads that were the
                // first to see another thread's commit, of the first after
                // this thread's own, and of the rest.
                let mut kinds = [(0u64, 0u64); 3];
                let mut last_rev = b.table.revision(reader.read_txn()).unwrap();
                let mut own = false;
                let mut kind = 2;
                // STATEDB_BENCH_TRACE: ops done at every 0.1 s, printed
                // by thread 0 (does the rate drift within a run?).
                let mut next_mark = start;
                loop {
                    let id = rng.gen_range(0..OBJECTS);
                    let write = rng.gen_ratio(write_pct, 100);
                    if let Some(f) = &floor {
                        if write {
                            f.write(id);
                        } else {
                            black_box(f.read(id));
                        }
                    } else if write {
                        let mut w = wb.db.write_txn(&[&wb.table]).unwrap();
                        wb.table.insert(&mut w, obj(id)).unwrap();
                        w.commit().unwrap();
                    } else {
                        let r = match &stale {
                            Some(s) => s,
                            None => reader.read_txn(),
                        };
                        black_box(b.table.get(r, &b.by_id, &id).unwrap());
                        if split {
                            let rev = b.table.revision(r).unwrap();
                            kind = match (rev != last_rev, own) {
                                (true, false) => 0,
                                (true, true) => 1,
                                _ => 2,
                            };
                            (last_rev, own) = (rev, false);
                        }
                    }
                    ops += 1;
                    let t1 = Instant::now();
                    let ns = (t1 - t0).as_nanos() as u64;
                    lat.record(ns);
                    if write {
                        writes.0 += ns;
                        writes.1 += 1;
                        own = true;
                    } else if split {
                        kinds[kind].0 += ns;
                        kinds[kind].1 += 1;
                    }
                    t0 = t1;
                    if ops.is_multiple_of(256) {
                        if trace && t1 >= next_mark {
                            marks.push(ops);
                            next_mark += Duration::from_millis(100);
                        }
                        if t1 >= end {
                            if trace && t == 0 {
                                let rates: Vec<String> = (marks.windows(2))
                                    .map(|w| format!("{:.2}", (w[1] - w[0]) as f64 / 1e5))
                                    .collect();
                                println!("  thread 0, M ops/s per 0.1 s: {}", rates.join(" "));
                            }
                            if split {
                                let [f, o, r] = kinds.map(|(t, n)| (t / n.max(1), n));
                                println!(
                                    "  thread {t}: reads first after another thread's commit {} ns ({}), after its own {} ns ({}), the rest {} ns ({})",
                                    f.0, f.1, o.0, o.1, r.0, r.1
                                );
                            }
                            let cpu = Duration::from_nanos(thread_cpu_ns() - cpu0);
                            return (ops, t1 - start, cpu, lat, writes);
                        }
                    }
                }
            })
        })
        .collect();
    let mut total = 0.0;
    let mut per_cpu = 0.0;
    let mut all = Hist::new();
    // Summed over threads: (ops, time in ops, write txns, time in them).
    let mut split = (0u64, 0u64, 0u64, 0u64);
    for h in handles {
        let (ops, took, cpu, lat, writes) = h.join().unwrap();
        total += ops as f64 / took.as_secs_f64();
        per_cpu += ops as f64 / cpu.as_secs_f64().max(1e-9);
        all.merge(&lat);
        split.0 += ops;
        split.1 += took.as_nanos() as u64;
        split.2 += writes.1;
        split.3 += writes.0;
    }
    let reads = (split.0 - split.2).max(1);
    println!(
        "  {threads} thread(s): a read takes {:.0} ns on average, a write transaction {:.2} µs (on the wall, from the op before)",
        (split.1 - split.3) as f64 / reads as f64,
        split.3 as f64 / 1e3 / split.2.max(1) as f64,
    );
    let wall = t_run.elapsed();
    let after = lock_figures(&b);
    let (writes, waited) = (after.0 - before.0, after.1.saturating_sub(before.1));
    // Holds are timed in one transaction in `DbOptions::time_one_in`.
    let per_hold =
        after.3.saturating_sub(before.3).as_secs_f64() / (after.2 - before.2).max(1) as f64;
    println!(
        "  {threads} thread(s): {writes} write txns; the table's write lock held {:.0}% of the run ({:.2} µs per txn), waited for {:.0}% of it ({:.2} µs per txn, summed over threads)",
        100.0 * per_hold * writes as f64 / wall.as_secs_f64(),
        per_hold * 1e6,
        100.0 * waited.as_secs_f64() / wall.as_secs_f64(),
        waited.as_secs_f64() * 1e6 / writes.max(1) as f64,
    );
    (total, per_cpu, all.pct(0.5), all.pct(0.99))
}

/// `STATEDB_BENCH_FLOOR=1`: the least any shared table must pass between
/// threads, for comparison: each object in a cache line of its own,
/// written in place under a sequence count (no tree, no snapshot, no
/// allocation), so a read moves a line only when it reads an object the
/// other thread wrote. `=2` adds what one published version costs at the
/// least: a write takes one lock and bumps one version word, which every
/// read loads. `=3` is a persistent tree without the database: part's
/// tree of the objects, its root in an `ArcSwap` that a write replaces
/// under one lock and a read loads (no tables, revisions, root vector or
/// watches taken).
enum Floor {
    /// `=1` and `=2` (`published`).
    Slots {
        slots: Vec<FloorSlot>,
        published: Option<Box<Published>>,
    },
    /// `=3`.
    Tree {
        lock: parking_lot::Mutex<()>,
        root: CacheLinePad<arc_swap::ArcSwap<part::Tree<triomphe::Arc<TestObject>>>>,
    },
}

/// Floor 2's one lock and one version word, on lines of their own.
struct Published {
    lock: CacheLinePad<parking_lot::Mutex<()>>,
    version: CacheLinePad<AtomicU64>,
}

#[repr(align(128))]
struct CacheLinePad<T>(T);

#[repr(align(64))]
#[derive(Default)]
struct FloorSlot {
    seq: AtomicU64,
    id: AtomicU64,
    tags: AtomicU64,
}

impl Floor {
    fn new(mode: u8) -> Self {
        if mode == 3 {
            let mut t = part::Tree::new().txn();
            for id in 0..OBJECTS {
                t.insert(&id.to_be_bytes(), triomphe::Arc::new(obj(id)))
                    .unwrap();
            }
            return Floor::Tree {
                lock: parking_lot::Mutex::new(()),
                root: CacheLinePad(arc_swap::ArcSwap::from_pointee(t.commit())),
            };
        }
        let slots: Vec<FloorSlot> = (0..OBJECTS).map(|_| FloorSlot::default()).collect();
        for (i, s) in slots.iter().enumerate() {
            s.id.store(i as u64, Relaxed);
        }
        Floor::Slots {
            slots,
            published: (mode == 2).then(|| {
                Box::new(Published {
                    lock: CacheLinePad(parking_lot::Mutex::new(())),
                    version: CacheLinePad(AtomicU64::new(0)),
                })
            }),
        }
    }

    fn read(&self, id: u64) -> (u64, u64) {
        let (slots, published) = match self {
            Floor::Tree { root, .. } => {
                return (root.0.load().get(&id.to_be_bytes()))
                    .map_or((0, 0), |o| (o.id, o.tags.len() as u64));
            }
            Floor::Slots { slots, published } => (slots, published),
        };
        if let Some(p) = published {
            black_box(p.version.0.load(Acquire));
        }
        let s = &slots[id as usize];
        loop {
            let a = s.seq.load(Acquire);
            let v = (s.id.load(Relaxed), s.tags.load(Relaxed));
            fence(Acquire);
            if a & 1 == 0 && s.seq.load(Relaxed) == a {
                return v;
            }
        }
    }

    fn write(&self, id: u64) {
        let (slots, published) = match self {
            Floor::Tree { lock, root } => {
                let _g = lock.lock();
                let (new, old) = (root.0.load())
                    .insert(&id.to_be_bytes(), triomphe::Arc::new(obj(id)))
                    .unwrap();
                root.0.store(Arc::new(new));
                drop(old);
                return;
            }
            Floor::Slots { slots, published } => (slots, published),
        };
        let _g = published.as_ref().map(|p| p.lock.0.lock());
        let s = &slots[id as usize];
        let mut a = s.seq.load(Relaxed);
        loop {
            if a & 1 == 0 {
                match s.seq.compare_exchange_weak(a, a + 1, Acquire, Relaxed) {
                    Ok(_) => break,
                    Err(x) => a = x,
                }
            } else {
                a = s.seq.load(Relaxed);
            }
        }
        fence(Release);
        s.id.store(id, Relaxed);
        s.tags.fetch_add(1, Relaxed);
        s.seq.store(a + 2, Release);
        if let Some(p) = published {
            p.version.0.fetch_add(1, Release);
        }
    }
}

/// Latencies in log-linear buckets: each power of two of nanoseconds split
/// into 32 steps, so a percentile is read to within about 3% (the bucket's
/// middle is reported).
struct Hist {
    counts: Vec<u64>,
}

const SUB: u32 = 5;

impl Hist {
    fn new() -> Self {
        Hist {
            counts: vec![0; (64 << SUB) as usize],
        }
    }

    fn bucket(ns: u64) -> usize {
        if ns < 1 << SUB {
            return ns as usize;
        }
        let k = 63 - ns.leading_zeros();
        let sub = (ns >> (k - SUB)) & ((1 << SUB) - 1);
        (((k - SUB + 1) << SUB) as u64 + sub) as usize
    }

    /// The middle of bucket `b`'s range.
    fn value(b: usize) -> u64 {
        let b = b as u64;
        if b < 1 << SUB {
            return b;
        }
        let k = (b >> SUB) + u64::from(SUB) - 1;
        let sub = b & ((1 << SUB) - 1);
        let width = 1u64 << (k - u64::from(SUB));
        (1u64 << k) + sub * width + width / 2
    }

    fn record(&mut self, ns: u64) {
        if let Some(c) = self.counts.get_mut(Self::bucket(ns)) {
            *c += 1;
        }
    }

    fn merge(&mut self, other: &Hist) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
    }

    fn pct(&self, p: f64) -> u64 {
        let total: u64 = self.counts.iter().sum();
        let want = ((total as f64 - 1.0) * p).round() as u64;
        let mut seen = 0;
        for (b, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen > want {
                return Self::value(b);
            }
        }
        0
    }
}

/// Checked on every run (a bench target's tests do not run).
fn check_hist() {
    for ns in [0u64, 1, 31, 32, 33, 100, 1_000, 123_456, 10_000_000_000] {
        let mut h = Hist::new();
        h.record(ns);
        let got = h.pct(0.5) as f64;
        assert!(
            (got - ns as f64).abs() <= ns as f64 * 0.04 + 0.5,
            "{ns} -> {got}"
        );
    }
    let mut h = Hist::new();
    for ns in 1..=1000u64 {
        h.record(ns);
    }
    assert!((h.pct(0.99) as f64 - 990.0).abs() < 990.0 * 0.04);
}

/// (write-lock acquisitions, total wait, timed holds, their total) of the
/// bench's table.
fn lock_figures(b: &Bench) -> (u64, Duration, u64, Duration) {
    b.db.stats()
        .into_iter()
        .find(|s| s.name == b.table.name())
        .map(|s| {
            let (w, h) = (s.lock_wait, s.lock_hold);
            (w.count, w.total, h.timed, h.total)
        })
        .unwrap_or_default()
}

/// `STATEDB_BENCH_WARM=N`: N random writes on the filled table, in
/// transactions of `STATEDB_BENCH_WARM_BATCH` rows (default 1), before
/// the clock starts.
fn warm(b: &Bench) {
    let n: u64 = env_num("STATEDB_BENCH_WARM").unwrap_or(0);
    let batch: u64 = env_num("STATEDB_BENCH_WARM_BATCH")
        .filter(|&b| b > 0)
        .unwrap_or(1);
    let mut rng = rand::rngs::StdRng::seed_from_u64(u64::MAX);
    for _ in 0..n / batch {
        let mut w = b.db.write_txn(&[&b.table]).unwrap();
        for _ in 0..batch {
            b.table
                .insert(&mut w, obj(rng.gen_range(0..OBJECTS)))
                .unwrap();
        }
        w.commit().unwrap();
    }
}

/// The environment variable `name` as a number, if set and well formed.
fn env_num<T: std::str::FromStr>(name: &str) -> Option<T> {
    std::env::var(name).ok()?.parse().ok()
}

/// `STATEDB_BENCH_WRITE_PCT` (default 5): the share of write transactions.
fn write_pct() -> u32 {
    env_num("STATEDB_BENCH_WRITE_PCT")
        .filter(|&p| p <= 100)
        .unwrap_or(5)
}

fn main() {
    let mut args = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse::<f64>().ok());
    let secs = args.next().unwrap_or(3.0);
    check_hist();
    let pairs = args.next().map_or(1, |p| p.max(1.0) as usize);
    println!("KV95 key layout: {:?}", env_layout());
    let mut wall = Vec::new();
    let mut cpu = Vec::new();
    let only: Option<usize> = env_num("STATEDB_BENCH_ONLY").filter(|&n| n > 0);
    let ceiling = std::env::var_os("STATEDB_BENCH_CEILING").is_some();
    // Per pair: (wall scaling, the slower of the probes around it).
    let mut placed = Vec::new();
    // STATEDB_BENCH_CEILING, per pair: (two processes, a database per
    // thread), each over the same one-thread run.
    let mut beside: Vec<(f64, f64)> = Vec::new();
    for pair in 1..=pairs {
        if let Some(n) = only {
            let (x, _, p50, p99) = run(n, secs, false);
            println!("KV95 {n} thread(s) only: {x:>10.0} ops/s  p50 {p50} ns  p99 {p99} ns");
            continue;
        }
        let before = transfer_ns();
        let (one, one_cpu, p50_1, p99_1) = run(1, secs, false);
        println!(
            "KV95 1 thread : {one:>10.0} ops/s  ({one_cpu:>10.0} ops per CPU-second)  p50 {p50_1} ns  p99 {p99_1} ns"
        );
        let (two, two_cpu, p50_2, p99_2) = run(2, secs, false);
        println!(
            "KV95 2 threads: {two:>10.0} ops/s  ({two_cpu:>10.0} ops per CPU-second)  p50 {p50_2} ns  p99 {p99_2} ns"
        );
        if ceiling {
            let (private, ..) = run(2, secs, true);
            let procs = two_processes(secs);
            println!(
                "KV95 sharing nothing (pair {pair}): two one-thread processes at once {procs:>10.0} ops/s ({:.2}x one thread), a database per thread {private:>10.0} ops/s ({:.2}x); the shared table reached {:.0}% and {:.0}% of them",
                procs / one,
                private / one,
                100.0 * two / procs,
                100.0 * two / private,
            );
            beside.push((procs / one, private / one));
        }
        let apart = before.max(transfer_ns());
        println!(
            "KV95 scaling 1 -> 2 threads (pair {pair}): {:.2}x wall, {:.2}x per CPU-second (the latter discounts other load on the machine); CPUs {apart:.0} ns apart",
            two / one,
            two_cpu / one_cpu
        );
        placed.push((two / one, apart));
        wall.push(two / one);
        cpu.push(two_cpu / one_cpu);
    }
    if pairs > 1 {
        let (lo, hi) = median_interval(&wall);
        println!(
            "KV95 scaling, median of {pairs} alternating pairs: {:.2}x wall, {:.2}x per CPU-second",
            median(&mut wall.clone()),
            median(&mut cpu)
        );
        println!(
            "KV95 scaling, 95% bootstrap interval of that median (wall): {lo:.2}x to {hi:.2}x"
        );
        if !beside.is_empty() {
            let mut procs: Vec<f64> = beside.iter().map(|b| b.0).collect();
            let mut private: Vec<f64> = beside.iter().map(|b| b.1).collect();
            let mut share: Vec<f64> = wall.iter().zip(&beside).map(|(w, b)| w / b.0).collect();
            let (plo, phi) = median_interval(&procs);
            println!(
                "KV95 sharing nothing, medians of the same pairs: two processes {:.2}x (95% interval {plo:.2}x to {phi:.2}x), a database per thread {:.2}x; the shared table's scaling over the two processes' {:.2}",
                median(&mut procs),
                median(&mut private),
                median(&mut share),
            );
        }
        for (name, near) in [("near", true), ("far", false)] {
            let mut v: Vec<f64> = (placed.iter())
                .filter(|p| (p.1 < FAR_NS) == near)
                .map(|p| p.0)
                .collect();
            if !v.is_empty() {
                println!(
                    "KV95 scaling, median of the {} pairs run with the CPUs {name} (a cache line crossed in {} {FAR_NS} ns): {:.2}x wall",
                    v.len(),
                    if near { "under" } else { "at least" },
                    median(&mut v)
                );
            }
        }
    }
}

/// `STATEDB_BENCH_CEILING`: the summed ops/s of two copies of this bench
/// run as one-thread processes at once, their clocks started together
/// (`STATEDB_BENCH_START_AT`): what this machine gives two KV95 threads
/// that share no memory at all. 0 if a copy could not run.
fn two_processes(secs: f64) -> f64 {
    use std::process::{Command, Stdio};
    let Ok(exe) = std::env::current_exe() else {
        return 0.0;
    };
    // Far enough ahead for both copies to start and fill their tables.
    let at = unix_ns() + 1_500_000_000;
    let children: Vec<_> = (0..2)
        .filter_map(|_| {
            Command::new(&exe)
                .args([secs.to_string(), "1".into()])
                .env("STATEDB_BENCH_ONLY", "1")
                .env("STATEDB_BENCH_START_AT", at.to_string())
                .env_remove("STATEDB_BENCH_CEILING")
                .stdout(Stdio::piped())
                .spawn()
                .ok()
        })
        .collect();
    let mut sum = 0.0;
    for c in children {
        let Ok(out) = c.wait_with_output() else {
            continue;
        };
        let text = String::from_utf8_lossy(&out.stdout);
        let rate = (text.lines())
            .find_map(|l| l.strip_prefix("KV95 1 thread(s) only:"))
            .and_then(|r| r.split_whitespace().next()?.parse::<f64>().ok());
        sum += rate.unwrap_or(0.0);
    }
    sum
}

fn unix_ns() -> u128 {
    (std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)).map_or(0, |d| d.as_nanos())
}

/// `STATEDB_BENCH_START_AT` (ns since the Unix epoch): waits for that
/// instant before the clock starts, so that processes started apart run
/// their timed parts together.
fn start_at() {
    let Some(at) = env_num::<u128>("STATEDB_BENCH_START_AT") else {
        return;
    };
    let now = unix_ns();
    if at > now {
        std::thread::sleep(Duration::from_nanos((at - now) as u64));
    }
}

/// One-way cache-line transfer time, in ns, at or past which two CPUs count
/// as far apart. This host's VMs move their two vCPUs between placements
/// about 45 ns apart and about 200 ns apart for seconds at a time; at 200
/// ns the shared table's 1 -> 2 thread scaling falls to about 1.0x while a
/// database per thread (`STATEDB_BENCH_PRIVATE`) still scales (BENCHMARKS.md).
const FAR_NS: f64 = 100.0;

/// How far apart the CPUs that two busy threads get are: the one-way time
/// of a cache line passed back and forth between them, in ns: the fastest
/// of 20 rounds of 1000 round trips, since a round the scheduler or another
/// thread interrupts only reads slower. On a two-CPU machine the two
/// threads have one CPU each. The waits spin without `spin_loop`, whose
/// pause would add its own delay to what is timed.
fn transfer_ns() -> f64 {
    const TRIPS: u64 = 1000;
    const ROUNDS: u64 = 20;
    let ball = Arc::new(AtomicU64::new(0));
    let other = ball.clone();
    let echo = std::thread::spawn(move || {
        for i in 0..TRIPS * ROUNDS {
            while other.load(Acquire) != 2 * i + 1 {}
            other.store(2 * i + 2, Release);
        }
    });
    let mut best = f64::MAX;
    for r in 0..ROUNDS {
        let t = Instant::now();
        for i in r * TRIPS..(r + 1) * TRIPS {
            ball.store(2 * i + 1, Release);
            while ball.load(Acquire) != 2 * i + 2 {}
        }
        best = best.min(t.elapsed().as_nanos() as f64 / (2 * TRIPS) as f64);
    }
    echo.join().unwrap();
    best
}

/// The upper median (sorts `v`).
fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The 2.5th and 97.5th percentiles of the median of `v` over 2000
/// resamples with replacement (fixed seed: the same pairs give the same
/// interval).
fn median_interval(v: &[f64]) -> (f64, f64) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let mut medians: Vec<f64> = (0..2000)
        .map(|_| {
            let mut s: Vec<f64> = (0..v.len()).map(|_| v[rng.gen_range(0..v.len())]).collect();
            median(&mut s)
        })
        .collect();
    medians.sort_by(f64::total_cmp);
    (medians[50], medians[1949])
}
