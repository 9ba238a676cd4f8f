//! Memory: bytes per stored block, and resident bytes returning to the
//! empty index's after every worker clears. A counting global allocator
//! measures live heap bytes; the test binary has this single test so no
//! other thread allocates meanwhile.

use kvindex::workload::{Workload, WorkloadConfig};
use kvindex::{ConcurrentIndex, KvEvent, KvEventData, KvIndexer, ReferenceIndex, WorkerKey};

use live_bytes::live;
use test_support::live_bytes;

#[global_allocator]
static A: live_bytes::LiveBytes = live_bytes::LiveBytes;

/// What crossbeam-epoch's collector may keep between collections.
const EPOCH_ALLOWANCE: isize = 16 * 1024;

/// The allocator's count is process-wide: tests that read it run one at a
/// time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn measure(
    ix: &dyn KvIndexer,
    events: &[KvEvent],
    workers: &[WorkerKey],
    held: usize,
) -> (f64, isize) {
    // Registers this thread with the epoch collector (a one-off allocation)
    // before counting.
    kvindex::reclaim_deferred();
    let before = live();
    for ev in events {
        let _ = ix.apply(ev);
    }
    let full = live() - before;
    for (i, w) in workers.iter().enumerate() {
        ix.apply(&KvEvent {
            worker: *w,
            event_id: 1_000_000 + i as u64,
            data: KvEventData::Cleared,
        })
        .unwrap();
    }
    kvindex::reclaim_deferred();
    let after = live() - before;
    (full as f64 / held as f64, after)
}

/// The synthetic workload's events for `workers` workers and `requests`
/// requests (no lookups), and the workers that appear in them, sorted.
fn workload(workers: usize, requests: usize) -> (Workload, Vec<WorkerKey>) {
    let wl = Workload::generate(WorkloadConfig {
        workers,
        requests,
        queries: 0,
        ..WorkloadConfig::default()
    });
    let mut keys: Vec<WorkerKey> = wl.events.iter().map(|e| e.worker).collect();
    keys.sort();
    keys.dedup();
    (wl, keys)
}

/// Live heap the allocator counts for a fresh index fed every event of
/// `wl` (deferred releases reclaimed first), and the index.
fn populated(wl: &Workload) -> (isize, ConcurrentIndex) {
    kvindex::reclaim_deferred();
    let before = live();
    let ours = ConcurrentIndex::new();
    for ev in &wl.events {
        let _ = ours.apply(ev);
    }
    kvindex::reclaim_deferred();
    (live() - before, ours)
}

#[test]
fn memory_returns_to_empty_and_bytes_per_block() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (wl, workers) = workload(32, 8_000);
    // Held (worker, block) pairs at the end, counted with the reference.
    let probe = ReferenceIndex::new();
    for ev in &wl.events {
        probe.apply(ev).unwrap();
    }
    let held: usize = workers.iter().map(|w| probe.worker_block_count(*w)).sum();
    drop(probe);
    assert!(held > 20_000, "workload too small: {held}");

    let ours = ConcurrentIndex::new();
    let (ours_bpb, ours_after) = measure(&ours, &wl.events, &workers, held);
    let reference = ReferenceIndex::new();
    let (ref_bpb, ref_after) = measure(&reference, &wl.events, &workers, held);
    eprintln!(
        "memory: {held} held (worker, block) pairs; bytes per stored block: ours {ours_bpb:.1}, reference {ref_bpb:.1}; \
         residue after clearing every worker: ours {ours_after} B, reference {ref_after} B"
    );
    // After clearing, what remains is per-worker bookkeeping (event-id
    // clock, counters, interned id, empty maps): under 512 bytes per worker,
    // plus the epoch collector's own bags (a few KiB: freeing a bag of
    // deferred releases defers the queue node that carried it).
    assert!(
        ours_after < 512 * workers.len() as isize + EPOCH_ALLOWANCE,
        "ours residue {ours_after}"
    );
    assert_eq!(ours.tree_shape().nodes, 0);
    assert!(ours_bpb < ref_bpb, "ours {ours_bpb} vs reference {ref_bpb}");
}

/// Dropping a populated index frees all of it: live nodes reference their
/// parents and tail continuations, cycles that the index's `Drop` breaks.
#[test]
fn dropping_a_populated_index_frees_everything() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (wl, _) = workload(16, 4_000);
    kvindex::reclaim_deferred();
    let before = live();
    let (full, ours) = populated(&wl);
    assert!(full > 100_000, "populated: {full} B");
    drop(ours);
    kvindex::reclaim_deferred();
    let after = live() - before;
    assert!(
        after < EPOCH_ALLOWANCE,
        "{after} B of {full} B left after drop"
    );
}

/// `heap_bytes` (the index's own account, what a service exports) agrees
/// with the allocator's count of what the index holds.
#[test]
fn heap_bytes_agrees_with_the_allocator() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (wl, workers) = workload(24, 6_000);
    let (counted, ours) = populated(&wl);
    let counted = counted as f64;
    let own = ours.heap_bytes().total() as f64;
    eprintln!("heap bytes: allocator {counted}, heap_bytes {own}");
    assert!(
        (own - counted).abs() < 0.05 * counted,
        "heap_bytes {own} vs allocator {counted}"
    );
    // Empty again after every worker clears: only per-worker bookkeeping.
    for (i, w) in workers.iter().enumerate() {
        ours.apply(&KvEvent {
            worker: *w,
            event_id: 1_000_000 + i as u64,
            data: KvEventData::Cleared,
        })
        .unwrap();
    }
    assert!(ours.heap_bytes().total() < 512 * workers.len() + 8192);
}

/// A worker whose cache churns at a steady size keeps its block map near
/// that size: removals leave tombstones, and a map that doubled whenever
/// they filled it would hold two to four buckets (17 bytes each) per
/// block.
#[test]
fn a_churning_worker_keeps_its_block_map_small() {
    use kvindex::{ExternalHash, LocalHash, StoredBlock};
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let ix = ConcurrentIndex::new();
    let w = WorkerKey::new(1, 0);
    // 20,000 live blocks: the tightest table has 32,768 buckets (about
    // 28 bytes per block); growing whenever tombstones fill it doubles that
    // to 65,536 (about 56). Stored as chains of 8 under the root, the
    // oldest chain removed as each new one is stored.
    let (live, chain) = (20_000u64, 8u64);
    let mut id = 0;
    for c in 0..1_000_000 / chain {
        let base = c * chain;
        let blocks = (base..base + chain)
            .map(|b| StoredBlock {
                external: ExternalHash(b),
                local: LocalHash(b.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
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
        id += 1;
        if base >= live {
            let old = base - live;
            ix.apply(&KvEvent {
                worker: w,
                event_id: id,
                data: KvEventData::Removed {
                    hashes: (old..old + chain).map(ExternalHash).collect(),
                },
            })
            .unwrap();
            id += 1;
        }
    }
    let held = ix.worker_block_count(w) as f64;
    assert!((held - live as f64).abs() <= chain as f64, "{held}");
    let per_block = ix.heap_bytes().block_maps as f64 / held;
    eprintln!("block map: {per_block:.1} bytes per held block");
    assert!(per_block < 40.0, "{per_block:.1} bytes per held block");
}
