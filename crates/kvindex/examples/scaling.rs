//! Write-capacity scaling: N writer lanes (threads, each worker pinned to
//! one lane) apply a synthetic router workload while R reader threads run
//! lookups; reports block operations per second and lookup latency, for our
//! index and the reference side by side.
//!
//! ```sh
//! cargo run --release -p kvindex --example scaling -- --lanes 1,2,4,8 --readers 4
//! cargo run --release -p kvindex --example scaling -- --lanes 1,2,4,8,16 --readers 4 --requests 200000
//! ```

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use kvindex::workload::{Workload, WorkloadConfig};
use kvindex::{ConcurrentIndex, KvIndexer, ReferenceIndex};

struct Args {
    lanes: Vec<usize>,
    readers: usize,
    workers: usize,
    requests: usize,
    repeats: usize,
    index: Vec<String>,
}

fn parse() -> Args {
    let mut a = Args {
        lanes: vec![1, 2, 4, 8],
        readers: 4,
        workers: 128,
        requests: 100_000,
        repeats: 3,
        index: vec!["concurrent".into(), "reference".into()],
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < argv.len() {
        let v = argv.get(i + 1).cloned().unwrap_or_default();
        match argv[i].as_str() {
            "--lanes" | "--threads" => {
                a.lanes = v.split(',').filter_map(|x| x.parse().ok()).collect()
            }
            "--readers" => a.readers = v.parse().unwrap_or(4),
            "--workers" => a.workers = v.parse().unwrap_or(128),
            "--requests" => a.requests = v.parse().unwrap_or(100_000),
            "--repeats" => a.repeats = v.parse().unwrap_or(3),
            "--index" => a.index = v.split(',').map(String::from).collect(),
            other => {
                eprintln!("unknown argument {other}");
                std::process::exit(2);
            }
        }
        i += 2;
    }
    a
}

/// One run: returns (block ops/s, lookup p50 µs, lookup p99 µs, lookups).
fn run_once(
    ix: Arc<dyn KvIndexer>,
    wl: &Workload,
    lanes: usize,
    readers: usize,
) -> (f64, f64, f64, usize) {
    let by_lane = wl.by_lane(lanes);
    let stop = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(lanes + readers + 1));
    let queries = Arc::new(wl.queries.clone());
    let mut rh = Vec::new();
    for r in 0..readers {
        let (ix, stop, start, queries) = (
            Arc::clone(&ix),
            Arc::clone(&stop),
            Arc::clone(&start),
            Arc::clone(&queries),
        );
        rh.push(std::thread::spawn(move || {
            let mut lat: Vec<u32> = Vec::with_capacity(1 << 20);
            let mut i = r * 7919;
            start.wait();
            while !stop.load(Ordering::Relaxed) {
                i = (i + 1) % queries.len();
                let t = Instant::now();
                std::hint::black_box(ix.find_matches(&queries[i]));
                if lat.len() < (1 << 22) {
                    lat.push(t.elapsed().as_nanos().min(u32::MAX as u128) as u32);
                }
            }
            lat
        }));
    }
    let mut wh = Vec::new();
    for evs in by_lane {
        let (ix, start) = (Arc::clone(&ix), Arc::clone(&start));
        wh.push(std::thread::spawn(move || {
            start.wait();
            for ev in &evs {
                let _ = ix.apply(ev);
            }
        }));
    }
    start.wait();
    let t0 = Instant::now();
    for h in wh {
        h.join().expect("writer");
    }
    let secs = t0.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let mut lat: Vec<u32> = Vec::new();
    for h in rh {
        lat.extend(h.join().expect("reader"));
    }
    lat.sort_unstable();
    let pct = |p: f64| {
        if lat.is_empty() {
            0.0
        } else {
            lat[((lat.len() - 1) as f64 * p) as usize] as f64 / 1000.0
        }
    };
    (wl.block_ops as f64 / secs, pct(0.50), pct(0.99), lat.len())
}

fn main() {
    let a = parse();
    let wl = Workload::generate(WorkloadConfig {
        workers: a.workers,
        requests: a.requests,
        queries: 4096,
        ..WorkloadConfig::default()
    });
    println!(
        "workload: {} workers, {} events, {} block ops, {} readers, median of {} runs",
        a.workers,
        wl.events.len(),
        wl.block_ops,
        a.readers,
        a.repeats
    );
    println!(
        "{:<11} {:>5} {:>14} {:>10} {:>10} {:>10}",
        "index", "lanes", "block ops/s", "p50 µs", "p99 µs", "lookups"
    );
    let mut table: Vec<(String, usize, f64)> = Vec::new();
    for name in &a.index {
        for &lanes in &a.lanes {
            let mut runs = Vec::new();
            for _ in 0..a.repeats.max(1) {
                let ix: Arc<dyn KvIndexer> = match name.as_str() {
                    "reference" => Arc::new(ReferenceIndex::new()),
                    _ => Arc::new(ConcurrentIndex::new()),
                };
                runs.push(run_once(ix, &wl, lanes, a.readers));
                std::thread::sleep(Duration::from_millis(20));
            }
            runs.sort_by(|x, y| x.0.total_cmp(&y.0));
            let m = runs[runs.len() / 2];
            println!(
                "{:<11} {:>5} {:>14.0} {:>10.2} {:>10.2} {:>10}",
                name, lanes, m.0, m.1, m.2, m.3
            );
            table.push((name.clone(), lanes, m.0));
        }
    }
    for &lanes in &a.lanes {
        let get = |n: &str| {
            table
                .iter()
                .find(|(x, l, _)| x == n && *l == lanes)
                .map(|t| t.2)
        };
        if let (Some(o), Some(r)) = (get("concurrent"), get("reference")) {
            println!("lanes {lanes}: concurrent / reference = {:.2}x", o / r);
        }
    }
}
