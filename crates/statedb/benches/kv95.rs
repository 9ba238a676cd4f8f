//! KV95: threads doing 95% point reads (a fresh read transaction from a
//! per-thread [`statedb::Reader`], and a get) and 5%
//! single-row write transactions on a 100k-object table. Prints ops/s and
//! p50/p99 latency for 1 and 2 threads, and the scaling factor, and how
//! busy the table's write lock was (its waits and holds from `Db::stats`).
//!
//! `cargo bench -p statedb --bench kv95 [-- SECONDS [PAIRS]]`: PAIRS runs of
//! 1 then 2 threads, SECONDS each, and the median scaling with a bootstrap
//! interval (a VM's speed drifts between runs seconds apart, so one pair
//! says little: `-- 0.3 30` gives a narrower interval than `-- 3 3`).
//! (`STATEDB_BENCH_LAYOUT=nibbles` for a nibble-layout table)
//!
//! `STATEDB_BENCH_PRIVATE=1` gives every thread but the first a database of
//! its own (nothing shared but the allocator: what the machine allows two
//! threads). `STATEDB_BENCH_ONLY=N` runs N threads alone, for a profiler or
//! for thread counts above two (`scripts/kv95_scaling.sh`).

mod common;

use test_support::fast_mimalloc;

/// Same allocator as the criterion suite (see `statedb.rs`).
#[global_allocator]
static ALLOC: fast_mimalloc::FastMiMalloc = fast_mimalloc::FastMiMalloc;

use std::hint::black_box;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use common::*;
use rand::{Rng, SeedableRng};

const OBJECTS: u64 = 100_000;

/// The share of write transactions, in percent.
const WRITE_PCT: u32 = 5;

/// (wall ops/s summed over threads, ops per on-CPU second summed over
/// threads, p50 ns, p99 ns).
fn run(threads: usize, secs: f64) -> (f64, f64, u64, u64) {
    let b = Arc::new(new_db_layout(false, env_layout()));
    fill(&b, OBJECTS);
    let before = lock_figures(&b);
    let t_run = Instant::now();
    let barrier = Arc::new(Barrier::new(threads));
    let private = std::env::var_os("STATEDB_BENCH_PRIVATE").is_some();
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (shared, barrier) = (b.clone(), barrier.clone());
            std::thread::spawn(move || {
                let b = if private && t > 0 {
                    let own = Arc::new(new_db_layout(false, env_layout()));
                    fill(&own, OBJECTS);
                    own
                } else {
                    shared
                };
                let mut rng = rand::rngs::StdRng::seed_from_u64(t as u64);
                let mut reader = b.db.reader();
                // A few KiB, allocated and touched before the clock starts:
                // a list of every latency grew by tens of MiB inside the
                // run (page faults and a copy on each doubling, both
                // threads at once).
                let mut lat = Hist::new();
                barrier.wait();
                let cpu0 = thread_cpu_ns();
                let start = Instant::now();
                let end = start + Duration::from_secs_f64(secs);
                let mut ops = 0u64;
                let mut t0 = start;
                // (time, count) of write transactions; the rest are reads.
                let mut writes = (0u64, 0u64);
                loop {
                    let id = rng.random_range(0..OBJECTS);
                    let write = rng.random_ratio(WRITE_PCT, 100);
                    if write {
                        let mut w = b.db.write_txn(&[&b.table]).unwrap();
                        b.table.insert(&mut w, obj(id)).unwrap();
                        w.commit().unwrap();
                    } else {
                        let r = reader.read_txn();
                        black_box(b.table.get(r, &b.by_id, &id).unwrap());
                    }
                    ops += 1;
                    let t1 = Instant::now();
                    let ns = (t1 - t0).as_nanos() as u64;
                    lat.record(ns);
                    if write {
                        writes.0 += ns;
                        writes.1 += 1;
                    }
                    t0 = t1;
                    if ops.is_multiple_of(256) && t1 >= end {
                        let cpu = Duration::from_nanos(thread_cpu_ns() - cpu0);
                        return (ops, t1 - start, cpu, lat, writes);
                    }
                }
            })
        })
        .collect();
    let mut total = 0.0;
    let mut per_cpu = 0.0;
    let mut all = Hist::new();
    // Summed over threads: (ops, time in ops, write txns, time in them).
    let mut sums = (0u64, 0u64, 0u64, 0u64);
    for h in handles {
        let (ops, took, cpu, lat, writes) = h.join().unwrap();
        total += ops as f64 / took.as_secs_f64();
        per_cpu += ops as f64 / cpu.as_secs_f64().max(1e-9);
        all.merge(&lat);
        sums.0 += ops;
        sums.1 += took.as_nanos() as u64;
        sums.2 += writes.1;
        sums.3 += writes.0;
    }
    let reads = (sums.0 - sums.2).max(1);
    println!(
        "  {threads} thread(s): a read takes {:.0} ns on average, a write transaction {:.2} µs (on the wall, from the op before)",
        (sums.1 - sums.3) as f64 / reads as f64,
        sums.3 as f64 / 1e3 / sums.2.max(1) as f64,
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

/// Latencies in nanoseconds, to 3 significant digits (a few KiB; merged
/// over threads after the run).
struct Hist(hdrhistogram::Histogram<u64>);

impl Hist {
    fn new() -> Self {
        Hist(hdrhistogram::Histogram::new(3).expect("3 significant digits is valid"))
    }

    fn record(&mut self, ns: u64) {
        // Auto-resizing: any value fits.
        self.0.saturating_record(ns);
    }

    fn merge(&mut self, other: &Hist) {
        let _ = self.0.add(&other.0);
    }

    fn pct(&self, p: f64) -> u64 {
        self.0.value_at_quantile(p)
    }
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

/// The environment variable `name` as a number, if set and well formed.
fn env_num<T: std::str::FromStr>(name: &str) -> Option<T> {
    std::env::var(name).ok()?.parse().ok()
}

fn main() {
    let mut args = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse::<f64>().ok());
    let secs = args.next().unwrap_or(3.0);
    let pairs = args.next().map_or(1, |p| p.max(1.0) as usize);
    println!("KV95 key layout: {:?}", env_layout());
    let mut wall = Vec::new();
    let mut cpu = Vec::new();
    let only: Option<usize> = env_num("STATEDB_BENCH_ONLY").filter(|&n| n > 0);
    for pair in 1..=pairs {
        if let Some(n) = only {
            let (x, _, p50, p99) = run(n, secs);
            println!("KV95 {n} thread(s) only: {x:>10.0} ops/s  p50 {p50} ns  p99 {p99} ns");
            continue;
        }
        let (one, one_cpu, p50_1, p99_1) = run(1, secs);
        println!(
            "KV95 1 thread : {one:>10.0} ops/s  ({one_cpu:>10.0} ops per CPU-second)  p50 {p50_1} ns  p99 {p99_1} ns"
        );
        let (two, two_cpu, p50_2, p99_2) = run(2, secs);
        println!(
            "KV95 2 threads: {two:>10.0} ops/s  ({two_cpu:>10.0} ops per CPU-second)  p50 {p50_2} ns  p99 {p99_2} ns"
        );
        println!(
            "KV95 scaling 1 -> 2 threads (pair {pair}): {:.2}x wall, {:.2}x per CPU-second (the latter discounts other load on the machine)",
            two / one,
            two_cpu / one_cpu
        );
        wall.push(two / one);
        cpu.push(two_cpu / one_cpu);
    }
    if pairs > 1 && only.is_none() {
        let (lo, hi) = median_interval(&wall);
        println!(
            "KV95 scaling, median of {pairs} alternating pairs: {:.2}x wall, {:.2}x per CPU-second",
            median(&mut wall),
            median(&mut cpu)
        );
        println!(
            "KV95 scaling, 95% bootstrap interval of that median (wall): {lo:.2}x to {hi:.2}x"
        );
    }
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
            let mut s: Vec<f64> = (0..v.len())
                .map(|_| v[rng.random_range(0..v.len())])
                .collect();
            median(&mut s)
        })
        .collect();
    medians.sort_by(f64::total_cmp);
    (medians[50], medians[1949])
}
