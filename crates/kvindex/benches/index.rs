//! Criterion benchmarks, ours (`concurrent`) and the `reference` side by
//! side:
//! * `apply_stored`: one event of 32 blocks extending a shared prefix;
//! * `apply_removed`: one event removing those 32 blocks;
//! * `find_matches/{32,128}blk/{8,128}w`: lookups over a populated index.
//!
//! Run: `cargo bench -p kvindex --bench index`.

#![allow(missing_docs)]

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use kvindex::workload::{Workload, WorkloadConfig};
use kvindex::{
    next_sequence_hash, ConcurrentIndex, ExternalHash, KvEvent, KvEventData, KvIndexer, LocalHash,
    ReferenceIndex, StoredBlock, WorkerKey,
};

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
    let wl = Workload::generate(WorkloadConfig {
        workers: 32,
        requests: 20_000,
        queries: 1,
        ..WorkloadConfig::default()
    });
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
    for (blocks, workers) in [(32usize, 8usize), (32, 128), (128, 8), (128, 128)] {
        let wl = Workload::generate(WorkloadConfig {
            workers,
            prefixes: 16,
            prefix_blocks: blocks / 2,
            unique_blocks: blocks / 2,
            capacity_blocks: 64 * blocks,
            requests: workers * 100,
            queries: 4096,
            seed: 7,
        });
        for ix in indexes() {
            populated(&*ix, &wl);
            let mut i = 0usize;
            g.bench_function(
                BenchmarkId::new(format!("{blocks}blk_{workers}w"), ix.name()),
                |b| {
                    b.iter(|| {
                        i = (i + 1) % wl.queries.len();
                        black_box(ix.find_matches(&wl.queries[i]))
                    })
                },
            );
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
