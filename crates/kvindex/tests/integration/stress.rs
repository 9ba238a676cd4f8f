//! Concurrency stress: writer lanes and reader threads together, asserting
//! no query ever overcounts relative to what was ever stored, and that the
//! final state equals the reference after the same events.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::stream::{make_stream, Rng};
use crate::common::*;
use kvindex::{ConcurrentIndex, KvIndexer, Lanes, LocalHash, ReferenceIndex, WorkerKey};

fn stress(seed: u64, workers: u64, per_worker: usize, alphabet: u64, lanes: usize, readers: usize) {
    let s = Arc::new(make_stream(seed, workers, per_worker, alphabet));
    let index = Arc::new(ConcurrentIndex::new());
    let lanes = Lanes::new(Arc::clone(&index), lanes);
    let stop = Arc::new(AtomicBool::new(false));
    let queries = Arc::new(AtomicU64::new(0));
    // Query pool: every path ever held, plus each extended by one block.
    let mut pool: HashSet<Vec<LocalHash>> = HashSet::new();
    for set in s.ever.values() {
        for p in set {
            pool.insert(p.clone());
            let mut q = p.clone();
            q.push(LocalHash(1));
            pool.insert(q);
        }
    }
    let pool: Arc<Vec<Vec<LocalHash>>> = Arc::new(pool.into_iter().collect());
    let mut handles = Vec::new();
    for r in 0..readers {
        let (index, stop, s, pool, queries) = (
            Arc::clone(&index),
            Arc::clone(&stop),
            Arc::clone(&s),
            Arc::clone(&pool),
            Arc::clone(&queries),
        );
        handles.push(std::thread::spawn(move || {
            let mut rng = Rng(0x9e37_79b9 + r as u64);
            while !stop.load(Ordering::Relaxed) {
                let q = &pool[rng.below(pool.len() as u64) as usize];
                let scores = index.find_matches(q);
                for (w, n) in scores.iter() {
                    assert!(n as usize <= q.len());
                    let ever = &s.ever[&w];
                    for i in 0..n as usize {
                        assert!(
                            ever.contains(&q[..=i]),
                            "overcount: {w:?} credited {n} on {q:?}, never held {:?}",
                            &q[..=i]
                        );
                    }
                }
                queries.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    // A maintenance thread: dumps, counts and stats while writers run (must
    // neither deadlock nor panic; a dump is per-node consistent only).
    {
        let (index, stop) = (Arc::clone(&index), Arc::clone(&stop));
        handles.push(std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let d = index.dump();
                let _ = index.stats();
                for w in index.workers() {
                    let _ = index.worker_block_count(w);
                }
                assert!(d.iter().all(|e| e.worker.worker_id < 1 << 20));
                std::thread::sleep(Duration::from_millis(5));
            }
        }));
    }
    // Interleave workers' events round-robin so lanes stay busy together.
    let mut keys: Vec<WorkerKey> = s.events.keys().copied().collect();
    keys.sort();
    let t0 = Instant::now();
    for i in 0..per_worker {
        for w in &keys {
            lanes.submit(s.events[w][i].clone());
        }
    }
    lanes.flush();
    let write_time = t0.elapsed();
    // Let readers run a little on the final state too.
    std::thread::sleep(Duration::from_millis(50));
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.join().expect("reader panicked");
    }
    assert!(queries.load(Ordering::Relaxed) > 0);
    eprintln!(
        "stress seed={seed}: {} events in {write_time:?}, {} queries",
        keys.len() * per_worker,
        queries.load(Ordering::Relaxed)
    );

    // Final state equals the model and the sequentially-fed reference.
    check_equal(&*index, &s.model, &[]);
    let reference = ReferenceIndex::new();
    for w in &keys {
        for ev in &s.events[w] {
            let _ = reference.apply(ev);
        }
    }
    check_equal(&reference, &s.model, &[]);
    // The quiescent dump rebuilds an equal index.
    let replica = ConcurrentIndex::new();
    for ev in index.dump() {
        replica.apply(&ev).expect("dump applies");
    }
    check_equal(&replica, &s.model, &[]);
    let st = lanes.stats();
    assert_eq!(st.events_applied, (keys.len() * per_worker) as u64);
    let shape = index.tree_shape();
    eprintln!("stress seed={seed}: final shape {shape:?}");
    assert_eq!(shape.empty_leaves, 0, "{shape:?}");
    let held: usize = s.model.workers.values().map(|w| w.held.len()).sum();
    assert_eq!(shape.holder_blocks, held);
}

#[test]
fn stress_shared_prefixes_small_alphabet() {
    // Tiny alphabet: heavy sharing, constant splitting and merging.
    stress(1, 16, 1500, 3, 4, 3);
}

#[test]
fn stress_many_workers_two_lanes() {
    stress(7, 64, 300, 5, 2, 2);
}

#[test]
fn stress_eight_lanes() {
    stress(42, 32, 600, 4, 8, 4);
}

/// `remove_worker` racing with that worker's own writes must not leave
/// blocks in the tree that no worker state accounts for.
#[test]
fn remove_worker_racing_apply_leaves_no_orphans() {
    for round in 0..20u64 {
        let index = Arc::new(ConcurrentIndex::new());
        let w = wk(1);
        let writer = {
            let index = Arc::clone(&index);
            std::thread::spawn(move || {
                for i in 0..2000u64 {
                    let locals: Vec<LocalHash> = (0..4)
                        .map(|j| LocalHash(1 + (i * 7 + j + round) % 5))
                        .collect();
                    let _ = index.apply(&stored(w, i, &[], &locals, i));
                }
            })
        };
        let done = Arc::new(AtomicBool::new(false));
        let remover = {
            let (index, done) = (Arc::clone(&index), Arc::clone(&done));
            std::thread::spawn(move || {
                while !done.load(Ordering::Relaxed) {
                    index.remove_worker(w);
                }
            })
        };
        writer.join().unwrap();
        done.store(true, Ordering::Relaxed);
        remover.join().unwrap();
        let shape = index.tree_shape();
        let counted: usize = index
            .workers()
            .iter()
            .map(|w| index.worker_block_count(*w))
            .sum();
        assert_eq!(shape.holder_blocks, counted, "round {round}: {shape:?}");
        index.remove_worker(w);
        assert_eq!(index.tree_shape().nodes, 0);
    }
}
