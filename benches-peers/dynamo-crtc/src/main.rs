//! kvindex vs Dynamo's CRTC (`dynamo-kv-router` 1.6.1,
//! `ThreadPoolIndexer<ConcurrentRadixTreeCompressed>`), and the kvindex
//! reference, fed the identical synthetic event stream through the same
//! shape of harness: one producer enqueues every event onto per-worker
//! lanes (N lane threads), then waits for a flush; R reader threads run
//! lookups meanwhile. Reports block ops/s, lookup p50/p99 and bytes per
//! stored block, and checks that the indexes agree on every query.
//!
//! ```sh
//! cd benches-peers/dynamo-crtc
//! cargo run --release -- --lanes 1,2,4,8 --readers 4
//! ```

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicIsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Instant;

use dynamo_kv_router::concurrent_radix_tree_compressed::ConcurrentRadixTreeCompressed;
use dynamo_kv_router::indexer::{SyncIndexer, ThreadPoolIndexer};
use dynamo_kv_router::protocols::{
    ExternalSequenceBlockHash, KvCacheEvent, KvCacheEventData, KvCacheRemoveData, KvCacheStoreData,
    KvCacheStoredBlockData, LocalBlockHash, RouterEvent,
};
use kvindex::workload::{Workload, WorkloadConfig};
use kvindex::{ConcurrentIndex, KvEvent, KvEventData, KvIndexer, Lanes, LocalHash, ReferenceIndex};

struct Counting;
static LIVE: AtomicIsize = AtomicIsize::new(0);
// SAFETY: forwards to `System` unchanged; only counts bytes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        // SAFETY: caller's contract.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as isize, Ordering::Relaxed);
        // SAFETY: caller's contract.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        LIVE.fetch_add(n as isize - l.size() as isize, Ordering::Relaxed);
        // SAFETY: caller's contract.
        unsafe { System.realloc(p, l, n) }
    }
}
#[global_allocator]
static A: Counting = Counting;

fn to_dynamo(ev: &KvEvent) -> RouterEvent {
    let data = match &ev.data {
        KvEventData::Stored { parent, blocks } => KvCacheEventData::Stored(KvCacheStoreData {
            parent_hash: parent.map(|p| ExternalSequenceBlockHash(p.0)),
            start_position: None,
            blocks: blocks
                .iter()
                .map(|b| KvCacheStoredBlockData {
                    block_hash: ExternalSequenceBlockHash(b.external.0),
                    tokens_hash: LocalBlockHash(b.local.0),
                    mm_extra_info: None,
                })
                .collect(),
        }),
        KvEventData::Removed { hashes } => KvCacheEventData::Removed(KvCacheRemoveData {
            block_hashes: hashes
                .iter()
                .map(|h| ExternalSequenceBlockHash(h.0))
                .collect(),
        }),
        KvEventData::Cleared => KvCacheEventData::Cleared,
    };
    RouterEvent::new(
        ev.worker.worker_id,
        KvCacheEvent {
            event_id: ev.event_id,
            data,
            dp_rank: ev.worker.dp_rank,
        },
    )
}

/// Runs the lookup for query number `i`.
type Lookup = Arc<dyn Fn(usize) -> usize + Send + Sync>;

/// Runs `write` (which must apply every event and return when flushed)
/// while `readers` threads call `lookup`. Returns (secs, p50 µs, p99 µs).
fn timed(
    write: impl FnOnce(),
    lookup: Lookup,
    queries: &Arc<Vec<Vec<LocalHash>>>,
    readers: usize,
) -> (f64, f64, f64) {
    let stop = Arc::new(AtomicBool::new(false));
    let bar = Arc::new(Barrier::new(readers + 1));
    let hs: Vec<_> = (0..readers)
        .map(|r| {
            let (stop, bar, q, f) = (stop.clone(), bar.clone(), queries.clone(), lookup.clone());
            std::thread::spawn(move || {
                let mut lat = Vec::with_capacity(1 << 20);
                let mut i = r * 7919;
                bar.wait();
                while !stop.load(Ordering::Relaxed) {
                    i = (i + 1) % q.len();
                    let t = Instant::now();
                    std::hint::black_box(f(i));
                    lat.push(t.elapsed().as_nanos() as u64);
                }
                lat
            })
        })
        .collect();
    bar.wait();
    let t0 = Instant::now();
    write();
    let secs = t0.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let mut lat: Vec<u64> = hs.into_iter().flat_map(|h| h.join().unwrap()).collect();
    lat.sort_unstable();
    let p = |x: f64| {
        if lat.is_empty() {
            0.0
        } else {
            lat[((lat.len() - 1) as f64 * x) as usize] as f64 / 1e3
        }
    };
    (secs, p(0.5), p(0.99))
}

/// Checks our hashing against Dynamo's own functions on random inputs.
fn check_hashing() -> usize {
    use dynamo_kv_router::protocols::{
        compute_block_hash_for_seq, compute_seq_hash_for_block, BlockHashOptions,
    };
    let mut x = 0x1234_5678_9abc_def0u64;
    let mut cases = 0;
    for bs in [1usize, 4, 16, 32, 64, 100] {
        for salt in [
            (None, None),
            (Some("lora-a"), None),
            (None, Some("tenant")),
            (Some("l"), Some("s")),
            (Some(""), Some("")),
        ] {
            let tokens: Vec<u32> = (0..bs * 5 + 3)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u32
                })
                .collect();
            let ours = kvindex::local_block_hashes_salted(
                &tokens,
                bs,
                kvindex::BlockSalt {
                    lora_name: salt.0,
                    cache_salt: salt.1,
                },
            );
            let theirs = compute_block_hash_for_seq(
                &tokens,
                bs as u32,
                BlockHashOptions {
                    lora_name: salt.0,
                    cache_namespace: salt.1,
                    ..Default::default()
                },
            );
            assert_eq!(
                ours.iter().map(|h| h.0).collect::<Vec<_>>(),
                theirs.iter().map(|h| h.0).collect::<Vec<_>>(),
                "block hashes differ: bs={bs} salt={salt:?}"
            );
            assert_eq!(
                kvindex::sequence_hashes(&ours),
                compute_seq_hash_for_block(&theirs),
                "sequence hashes differ"
            );
            if salt.0.is_none() && salt.1.is_none() {
                assert_eq!(ours, kvindex::local_block_hashes(&tokens, bs, None));
            }
            if salt.1.is_none() {
                assert_eq!(ours, kvindex::local_block_hashes(&tokens, bs, salt.0));
            }
            cases += 1;
        }
    }
    cases
}

fn main() {
    println!("hashing: {} cases identical to dynamo-kv-router 1.6.1 (block and sequence hashes, LoRA and cache salt)", check_hashing());
    let mut lanes_list = vec![1usize, 2, 4, 8];
    let mut readers = 4usize;
    let mut requests = 100_000usize;
    let mut workers = 128usize;
    let mut repeats = 5usize;
    let argv: Vec<String> = std::env::args().skip(1).collect();
    for w in argv.chunks(2) {
        let v = w.get(1).cloned().unwrap_or_default();
        match w[0].as_str() {
            "--lanes" | "--threads" => {
                lanes_list = v.split(',').filter_map(|x| x.parse().ok()).collect()
            }
            "--readers" => readers = v.parse().unwrap(),
            "--requests" => requests = v.parse().unwrap(),
            "--workers" => workers = v.parse().unwrap(),
            "--repeats" => repeats = v.parse().unwrap(),
            o => panic!("unknown argument {o}"),
        }
    }
    let wl = Workload::generate(WorkloadConfig {
        workers,
        requests,
        queries: 4096,
        ..WorkloadConfig::default()
    });
    let dyn_events: Vec<RouterEvent> = wl.events.iter().map(to_dynamo).collect();
    let queries = Arc::new(wl.queries.clone());
    let dyn_queries: Arc<Vec<Vec<LocalBlockHash>>> = Arc::new(
        wl.queries
            .iter()
            .map(|q| q.iter().map(|h| LocalBlockHash(h.0)).collect())
            .collect(),
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    println!(
        "workload: {workers} workers, {} events, {} block ops; {readers} readers; medians of {repeats} interleaved runs; {}",
        wl.events.len(),
        wl.block_ops,
        std::env::var("BENCH_DATE").unwrap_or_default()
    );
    println!(
        "{:<12} {:>5} {:>14} {:>9} {:>9}",
        "index", "lanes", "block ops/s", "p50 µs", "p99 µs"
    );
    let names = ["dynamo-crtc", "concurrent", "reference"];
    let run_one = |name: &str, lanes: usize| -> (f64, f64, f64) {
        let (secs, p50, p99) = if name == "dynamo-crtc" {
            // Dynamo CRTC through its ThreadPoolIndexer.
            let idx = Arc::new(ThreadPoolIndexer::new(
                ConcurrentRadixTreeCompressed::new(),
                lanes,
                16,
            ));
            let evs = dyn_events.clone();
            let i2 = idx.clone();
            let dq = dyn_queries.clone();
            let lookup: Lookup =
                Arc::new(move |i: usize| i2.backend().find_matches(&dq[i], false).scores.len());
            timed(
                || {
                    for ev in evs {
                        idx.enqueue_event(ev).unwrap();
                    }
                    rt.block_on(idx.flush_and_wait()).unwrap();
                },
                lookup,
                &queries,
                readers,
            )
        } else {
            let ix: Arc<dyn KvIndexer> = if name == "concurrent" {
                Arc::new(ConcurrentIndex::new())
            } else {
                Arc::new(ReferenceIndex::new())
            };
            let l = Lanes::new(ix.clone(), lanes);
            let evs = wl.events.clone();
            let i2 = ix.clone();
            let q2 = queries.clone();
            let lookup: Lookup = Arc::new(move |i: usize| i2.find_matches(&q2[i]).len());
            timed(
                || {
                    for ev in evs {
                        l.submit(ev);
                    }
                    l.flush();
                },
                lookup,
                &queries,
                readers,
            )
        };
        (wl.block_ops as f64 / secs, p50, p99)
    };
    let median = |mut v: Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    };
    for &lanes in &lanes_list {
        let mut res: Vec<Vec<(f64, f64, f64)>> = vec![Vec::new(); names.len()];
        // Interleave the indexes so load changes on a shared machine hit all.
        for _ in 0..repeats.max(1) {
            for (i, name) in names.iter().enumerate() {
                res[i].push(run_one(name, lanes));
            }
        }
        let mut ops = Vec::new();
        for (i, name) in names.iter().enumerate() {
            let o = median(res[i].iter().map(|r| r.0).collect());
            let p50 = median(res[i].iter().map(|r| r.1).collect());
            let p99 = median(res[i].iter().map(|r| r.2).collect());
            ops.push(o);
            println!(
                "{:<12} {:>5} {:>14.0} {:>9.2} {:>9.2}",
                name, lanes, o, p50, p99
            );
        }
        println!(
            "lanes {lanes}: concurrent / dynamo-crtc = {:.2}x, concurrent / reference = {:.2}x",
            ops[1] / ops[0],
            ops[1] / ops[2]
        );
    }

    // Memory and agreement: populate each index on one lane, no readers.
    let held: usize;
    {
        let ours = ConcurrentIndex::new();
        for ev in &wl.events {
            let _ = ours.apply(ev);
        }
        held = ours
            .workers()
            .iter()
            .map(|w| ours.worker_block_count(*w))
            .sum();
    }
    let before = LIVE.load(Ordering::Relaxed);
    let crtc = ThreadPoolIndexer::new(ConcurrentRadixTreeCompressed::new(), 1, 16);
    for ev in dyn_events.iter().cloned() {
        crtc.enqueue_event(ev).unwrap();
    }
    rt.block_on(crtc.flush_and_wait()).unwrap();
    let dyn_bytes = LIVE.load(Ordering::Relaxed) - before;
    let before = LIVE.load(Ordering::Relaxed);
    let ours = ConcurrentIndex::new();
    for ev in &wl.events {
        let _ = ours.apply(ev);
    }
    let our_bytes = LIVE.load(Ordering::Relaxed) - before;
    let mut mismatches = 0;
    for (q, dq) in wl.queries.iter().zip(dyn_queries.iter()) {
        let a = ours.find_matches(q);
        let b = crtc.backend().find_matches(dq, false);
        let mut bs: Vec<(u64, u32, u32)> = b
            .scores
            .iter()
            .map(|(w, s)| (w.worker_id, w.dp_rank, *s))
            .filter(|x| x.2 > 0)
            .collect();
        bs.sort_unstable();
        let mut as_: Vec<(u64, u32, u32)> =
            a.iter().map(|(w, s)| (w.worker_id, w.dp_rank, s)).collect();
        as_.sort_unstable();
        if as_ != bs {
            mismatches += 1;
        }
    }
    // Steady-state lookups (no writers), one thread, every query 5 times.
    let lat = |f: &dyn Fn(usize) -> usize| {
        let mut v = Vec::new();
        for _ in 0..5 {
            for i in 0..wl.queries.len() {
                let t = Instant::now();
                std::hint::black_box(f(i));
                v.push(t.elapsed().as_nanos() as f64 / 1e3);
            }
        }
        v.sort_by(|a, b| a.total_cmp(b));
        (v[v.len() / 2], v[v.len() * 99 / 100])
    };
    let (d50, d99) = lat(&|i| {
        crtc.backend()
            .find_matches(&dyn_queries[i], false)
            .scores
            .len()
    });
    let (o50, o99) = lat(&|i| ours.find_matches(&wl.queries[i]).len());
    println!(
        "steady-state lookup p50/p99 µs (populated, no writers): dynamo-crtc {d50:.2}/{d99:.2}, concurrent {o50:.2}/{o99:.2}"
    );
    println!(
        "memory: {held} held blocks; bytes per stored block: dynamo-crtc {:.1}, concurrent {:.1} (includes the 1-lane ThreadPoolIndexer's own state)",
        dyn_bytes as f64 / held as f64,
        our_bytes as f64 / held as f64
    );
    println!(
        "agreement: {mismatches} of {} queries differ between dynamo-crtc and concurrent",
        wl.queries.len()
    );
}
