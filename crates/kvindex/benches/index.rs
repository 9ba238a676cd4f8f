//! Criterion benchmarks, ours (`concurrent`) and the `reference` side by
//! side, over indexes populated with the events of `kvreplay`'s synthetic
//! timeline (the one `arbor kv replay --stress` replays):
//! * `apply_stored`: one event of 32 blocks extending a shared prefix (the
//!   first lookup's first 16 blocks: a system prompt);
//! * `apply_removed`: one event removing those 32 blocks;
//! * `find_matches/{32,128}blk_{8,128}w`: the timeline's lookups of at least
//!   that many blocks, cut to that many, over the index its 8 or 128
//!   simulated engines populated (64-token blocks: 32 blocks are about a
//!   system prompt, 128 a conversation several turns in).
//!
//! Run: `cargo bench -p kvindex --bench index`.

#![allow(missing_docs)]

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use kvindex::{
    next_sequence_hash, ConcurrentIndex, ExternalHash, KvEvent, KvEventData, KvIndexer, LocalHash,
    ReferenceIndex, StoredBlock, WorkerKey,
};
use kvreplay::{NoProgress, ReplayOptions};

/// The synthetic timeline's events and lookups, each in time order, on
/// `workers` engines.
struct Workload {
    events: Vec<KvEvent>,
    queries: Vec<Vec<LocalHash>>,
}

impl Workload {
    fn new(workers: usize) -> Self {
        let mut opts = ReplayOptions::default();
        opts.sim.workers = workers;
        let tl = kvreplay::timeline(&opts, &NoProgress).expect("synthetic timeline");
        let lanes = tl.lanes(1, 1);
        Self {
            events: lanes.events[0]
                .iter()
                .map(|(_, ev)| (*ev).clone())
                .collect(),
            queries: lanes.queries[0].iter().map(|(_, h)| h.to_vec()).collect(),
        }
    }
}

fn populated(ix: &dyn KvIndexer, wl: &Workload) {
    for ev in &wl.events {
        let _ = ix.apply(ev);
    }
}

fn indexes() -> Vec<Box<dyn KvIndexer>> {
    vec![
        Box::new(ConcurrentIndex::new()),
        Box::new(ReferenceIndex::new()),
    ]
}

/// A 32-block chain below the first shared prefix (which worker 0 holds
/// after `store_prefix`), with fresh locals per `n`.
fn chain_event(worker: WorkerKey, id: u64, prefix: &[LocalHash], n: u64) -> (KvEvent, KvEvent) {
    let mut seq = prefix[0].0;
    for l in &prefix[1..] {
        seq = next_sequence_hash(seq, *l);
    }
    let parent = ExternalHash(seq);
    let mut blocks = Vec::with_capacity(32);
    for i in 0..32u64 {
        let local = LocalHash(n.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (i + 1));
        seq = next_sequence_hash(seq, local);
        blocks.push(StoredBlock {
            external: ExternalHash(seq),
            local,
        });
    }
    let mut hashes: Vec<ExternalHash> = blocks.iter().map(|b| b.external).collect();
    hashes.reverse();
    (
        KvEvent {
            worker,
            event_id: id,
            data: KvEventData::Stored {
                parent: Some(parent),
                blocks,
            },
        },
        KvEvent {
            worker,
            event_id: id + 1,
            data: KvEventData::Removed { hashes },
        },
    )
}

fn store_prefix(ix: &dyn KvIndexer, w: WorkerKey, id: u64, prefix: &[LocalHash]) {
    let mut seq = None;
    let blocks = prefix
        .iter()
        .map(|l| {
            let s = match seq {
                None => l.0,
                Some(p) => next_sequence_hash(p, *l),
            };
            seq = Some(s);
            StoredBlock {
                external: ExternalHash(s),
                local: *l,
            }
        })
        .collect();
    ix.apply(&KvEvent {
        worker: w,
        event_id: id,
        data: KvEventData::Stored {
            parent: None,
            blocks,
        },
    })
    .unwrap();
}

fn bench_apply(c: &mut Criterion) {
    let wl = Workload::new(32);
    let prefix = wl.queries[0][..16].to_vec();
    let w = WorkerKey::new(1_000_000, 0);
    let mut g = c.benchmark_group("apply");
    g.warm_up_time(Duration::from_millis(500));
    g.measurement_time(Duration::from_secs(2));
    for ix in indexes() {
        populated(&*ix, &wl);
        store_prefix(&*ix, w, 0, &prefix);
        let mut id = 1u64;
        g.bench_function(BenchmarkId::new("apply_stored_32", ix.name()), |b| {
            b.iter_custom(|iters| {
                let mut t = Duration::ZERO;
                for _ in 0..iters {
                    let (s, r) = chain_event(w, id, &prefix, id);
                    id += 2;
                    let t0 = Instant::now();
                    ix.apply(black_box(&s)).unwrap();
                    t += t0.elapsed();
                    ix.apply(&r).unwrap();
                }
                t
            })
        });
        g.bench_function(BenchmarkId::new("apply_removed_32", ix.name()), |b| {
            b.iter_custom(|iters| {
                let mut t = Duration::ZERO;
                for _ in 0..iters {
                    let (s, r) = chain_event(w, id, &prefix, id);
                    id += 2;
                    ix.apply(&s).unwrap();
                    let t0 = Instant::now();
                    ix.apply(black_box(&r)).unwrap();
                    t += t0.elapsed();
                }
                t
            })
        });
    }
    g.finish();
}

fn bench_find(c: &mut Criterion) {
    let mut g = c.benchmark_group("find_matches");
    g.warm_up_time(Duration::from_millis(500));
    g.measurement_time(Duration::from_secs(2));
    for workers in [8usize, 128] {
        let wl = Workload::new(workers);
        for blocks in [32usize, 128] {
            let queries: Vec<&[LocalHash]> = wl
                .queries
                .iter()
                .filter(|q| q.len() >= blocks)
                .map(|q| &q[..blocks])
                .collect();
            assert!(queries.len() >= 1000, "{} lookups", queries.len());
            for ix in indexes() {
                populated(&*ix, &wl);
                let mut i = 0usize;
                g.bench_function(
                    BenchmarkId::new(format!("{blocks}blk_{workers}w"), ix.name()),
                    |b| {
                        b.iter(|| {
                            i = (i + 1) % queries.len();
                            black_box(ix.find_matches(queries[i]))
                        })
                    },
                );
            }
        }
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20);
    targets = bench_apply, bench_find
}
criterion_main!(benches);
