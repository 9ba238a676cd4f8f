//! Write-capacity scaling: N writer lanes (threads, each worker pinned to
//! one lane) apply the events of `kvreplay`'s timeline (the one `arbor kv
//! replay --stress` replays: the synthetic default, or a trace with
//! `--trace`) while R reader threads run its lookups; reports block
//! operations per second (hashes stored and removed) and lookup latency,
//! for our index and the reference side by side.
//!
//! ```sh
//! cargo run --release -p kvindex --example scaling -- --lanes 1,2,4,8 --readers 4
//! cargo run --release -p kvindex --example scaling -- --lanes 1,2,4,8,16 --readers 4 --workers 128
//! cargo run --release -p kvindex --example scaling -- --trace ../shared/data/mooncake/mooncake_trace_1000.jsonl
//! ```
//!
//! `--workers` and `--trace` set the simulated fleet and the requests as
//! `arbor kv replay` does (the trace unscaled, the engines' block size);
//! every other setting is `kvreplay`'s default.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use kvindex::{ConcurrentIndex, KvEvent, KvIndexer, LocalHash, ReferenceIndex};
use kvreplay::{NoProgress, ReplayOptions};

struct Args {
    lanes: Vec<usize>,
    readers: usize,
    workers: Option<usize>,
    trace: Option<String>,
    repeats: usize,
    index: Vec<String>,
}

fn parse() -> Args {
    let mut a = Args {
        lanes: vec![1, 2, 4, 8],
        readers: 4,
        workers: None,
        trace: None,
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
            "--workers" => a.workers = v.parse().ok(),
            "--trace" => a.trace = Some(v),
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

/// The timeline's events split by lane and its lookups, owned.
struct Workload {
    /// Every event in time order.
    events: Vec<KvEvent>,
    /// Every lookup in time order.
    queries: Vec<Vec<LocalHash>>,
    /// Hashes stored plus hashes removed.
    block_ops: u64,
}

impl Workload {
    /// Splits the events by lane (see [`kvindex::lane_of`]), keeping each
    /// worker's order.
    fn by_lane(&self, lanes: usize) -> Vec<Vec<KvEvent>> {
        let mut v = vec![Vec::new(); lanes.max(1)];
        for ev in &self.events {
            v[kvindex::lane_of(ev.worker, lanes)].push(ev.clone());
        }
        v
    }
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
    let mut opts = match &a.trace {
        Some(path) => ReplayOptions::for_trace(path),
        None => ReplayOptions::default(),
    };
    if let Some(w) = a.workers {
        opts.sim.workers = w;
    }
    let tl = kvreplay::timeline(&opts, &NoProgress).unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(2);
    });
    let lanes = tl.lanes(1, 1);
    let wl = Workload {
        events: lanes.events[0]
            .iter()
            .map(|(_, ev)| (*ev).clone())
            .collect(),
        queries: lanes.queries[0].iter().map(|(_, h)| h.to_vec()).collect(),
        block_ops: lanes.event_block_ops(),
    };
    println!(
        "workload: {} ({} workers), {} events, {} block ops, {} lookups; {} readers, median of {} runs",
        a.trace.as_deref().unwrap_or("synthetic default"),
        opts.sim.workers,
        wl.events.len(),
        wl.block_ops,
        wl.queries.len(),
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
