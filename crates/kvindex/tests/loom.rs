//! loom models of the concurrent tree, running its real code.
//!
//! Under `--cfg loom` the tree's node lock is loom's `RwLock` behind the
//! API the tree uses (`src/tree/sync.rs`), so loom explores every
//! interleaving of node critical sections: child storage growing (empty ->
//! one -> many), splits, merges (a node absorbing its single child, which
//! dies with a forward link) and unlinks, each under concurrent lookups.
//! Every model asserts that a lookup never overcounts: a worker is never
//! credited a block it did not hold at some instant of the walk, and never
//! credited a block whose removal finished before the lookup started.
//! After the threads join, the index must answer exactly as
//! [`ReferenceIndex`] fed the same events.
//!
//! Deferred node releases are kept until the model's end (an epoch would
//! free them once readers unpin; that crossbeam-epoch does so safely is
//! loom-tested in crossbeam, and the AddressSanitizer run of
//! `tests/stress.rs` checks that our code relies on nothing more).
//!
//! Each writer thread applies one worker's events, as `Lanes` does: a
//! worker's state is behind a `parking_lot` mutex that loom cannot switch
//! inside.
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test -p kvindex --release --test loom`
//! (add `--target-dir target/loom` to keep the normal build cache).
#![cfg(loom)]

use loom::sync::atomic::{AtomicBool, Ordering::SeqCst};
use loom::sync::Arc;
use loom::thread;

use kvindex::{
    reclaim_deferred, ConcurrentIndex, ExternalHash, KvEvent, KvEventData, KvIndexer, LocalHash,
    ReferenceIndex, StoredBlock, WorkerKey,
};

/// Preemptions per execution that loom explores.
const PREEMPTIONS: usize = 2;

fn wk(id: u64) -> WorkerKey {
    WorkerKey::new(id, 0)
}

/// The external id of the block ending `path` (as an engine with chained
/// hashing names it).
fn ext(path: &[u64]) -> ExternalHash {
    ExternalHash(path.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, x| {
        (h ^ x).wrapping_mul(0x0100_0000_01b3)
    }))
}

/// `w` stores `blocks` below the block ending `parent`.
fn stored(w: u64, id: u64, parent: &[u64], blocks: &[u64]) -> KvEvent {
    let mut path = parent.to_vec();
    let blocks = blocks
        .iter()
        .map(|&b| {
            path.push(b);
            StoredBlock {
                external: ext(&path),
                local: LocalHash(b),
            }
        })
        .collect();
    KvEvent {
        worker: wk(w),
        event_id: id,
        data: KvEventData::Stored {
            parent: (!parent.is_empty()).then(|| ext(parent)),
            blocks,
        },
    }
}

/// `w` removes the blocks ending each of `paths`.
fn removed(w: u64, id: u64, paths: &[&[u64]]) -> KvEvent {
    KvEvent {
        worker: wk(w),
        event_id: id,
        data: KvEventData::Removed {
            hashes: paths.iter().map(|p| ext(p)).collect(),
        },
    }
}

fn q(v: &[u64]) -> Vec<LocalHash> {
    v.iter().map(|&x| LocalHash(x)).collect()
}

/// Worker `w`'s score for query `v`.
fn score(ix: &ConcurrentIndex, v: &[u64], w: u64) -> u32 {
    ix.find_matches(&q(v)).get(wk(w))
}

/// Applies `setup`, then runs each writer's events on its own thread while
/// a reader thread runs `read`; then checks the index against the
/// reference on `queries` and releases what was deferred.
fn model(
    setup: Vec<KvEvent>,
    writers: Vec<Vec<KvEvent>>,
    read: fn(&ConcurrentIndex, bool),
    queries: &'static [&'static [u64]],
) {
    let (setup, writers) = (std::sync::Arc::new(setup), std::sync::Arc::new(writers));
    let mut b = loom::model::Builder::new();
    // Every interleaving with up to this many preemptions (loom's default
    // is unbounded; the trees' lock sequences make that too many to run).
    b.preemption_bound = Some(PREEMPTIONS);
    b.check(move || {
        let ix = Arc::new(ConcurrentIndex::new());
        let reference = ReferenceIndex::new();
        for ev in setup.iter() {
            ix.apply(ev).unwrap();
            reference.apply(ev).unwrap();
        }
        let done = Arc::new(AtomicBool::new(false));
        let n = writers.len();
        let hs: Vec<_> = (0..n)
            .map(|i| {
                let (ix, done, writers) = (ix.clone(), done.clone(), writers.clone());
                thread::spawn(move || {
                    for ev in &writers[i] {
                        ix.apply(ev).unwrap();
                    }
                    if i == 0 {
                        done.store(true, SeqCst);
                    }
                })
            })
            .collect();
        let r = {
            let (ix, done) = (ix.clone(), done.clone());
            thread::spawn(move || {
                let before = done.load(SeqCst);
                read(&ix, before);
            })
        };
        for h in hs {
            h.join().unwrap();
        }
        r.join().unwrap();
        for evs in writers.iter() {
            for ev in evs {
                reference.apply(ev).unwrap();
            }
        }
        for v in queries {
            assert_eq!(
                ix.find_matches(&q(v)),
                reference.find_matches(&q(v)),
                "after the threads joined, query {v:?}"
            );
        }
        drop(ix);
        reclaim_deferred();
    });
}

/// Child storage: two workers hang leaves below the root (empty -> one ->
/// many) while a reader looks one up: it sees nothing or the whole leaf.
#[test]
fn children_none_one_many() {
    model(
        vec![],
        vec![
            vec![stored(1, 0, &[], &[1, 11])],
            vec![stored(2, 0, &[], &[2, 12])],
        ],
        |ix, _| {
            let s = score(ix, &[2, 12], 2);
            assert!(s == 0 || s == 2, "{s}");
            assert_eq!(score(ix, &[2, 12], 1), 0);
        },
        &[&[1, 11], &[2, 12]],
    );
}

/// Splits: worker 1 holds [1, 2, 3, 4]; workers 2 and 3 branch off it at
/// different depths at once (two splits of one run) while a reader walks
/// the run. Worker 1 is credited at most its 4 blocks, the others at most
/// the blocks they share with the query.
#[test]
fn concurrent_splits_never_overcount() {
    model(
        vec![stored(1, 0, &[], &[1, 2, 3, 4])],
        vec![
            vec![stored(2, 0, &[], &[1, 2, 9])],
            vec![stored(3, 0, &[], &[1, 7])],
        ],
        |ix, _| {
            let s = ix.find_matches(&q(&[1, 2, 3, 4]));
            assert!(s.get(wk(1)) <= 4, "{:?}", s.sorted());
            assert!(s.get(wk(2)) <= 2, "{:?}", s.sorted());
            assert!(s.get(wk(3)) <= 1, "{:?}", s.sorted());
        },
        &[&[1, 2, 3, 4], &[1, 2, 9], &[1, 7]],
    );
}

/// Split, removal and unlink: worker 1 evicts the tail of its run (split
/// at 2, the tail left workerless and unlinked) while worker 2 extends the
/// shared head. A lookup that starts after the eviction finished never
/// credits worker 1 the tail.
#[test]
fn evicted_tail_never_counted() {
    model(
        vec![stored(1, 0, &[], &[1, 2, 3, 4]), stored(2, 0, &[], &[1, 2])],
        vec![
            vec![removed(1, 1, &[&[1, 2, 3, 4], &[1, 2, 3]])],
            vec![stored(2, 1, &[1, 2], &[5])],
        ],
        |ix, evicted| {
            // Blocks 4 then 3 go (leaf first); a stale pointer may end the
            // walk early (an undercount).
            let s = score(ix, &[1, 2, 3, 4], 1);
            assert!(s <= 4, "{s}");
            if evicted {
                assert!(s <= 2, "{s}: overcount after the removal finished");
            }
        },
        &[&[1, 2, 3, 4], &[1, 2, 5]],
    );
}

/// Merge: worker 2 leaves the head it shared with worker 1, whose node
/// then absorbs its single child (dead, forward link); a reader sees the
/// old pair, the merged node or a dead child (an undercount), never more,
/// and never credits worker 2 once its removal finished.
#[test]
fn merge_never_overcounts() {
    model(
        vec![stored(1, 0, &[], &[1, 2, 3, 4]), stored(2, 0, &[], &[1, 2])],
        vec![vec![removed(2, 1, &[&[1, 2], &[1]])]],
        |ix, removed| {
            let s = ix.find_matches(&q(&[1, 2, 3, 4]));
            assert!(s.get(wk(1)) <= 4, "{:?}", s.sorted());
            assert!(s.get(wk(2)) <= 2, "{:?}", s.sorted());
            if removed {
                assert_eq!(s.get(wk(2)), 0, "{:?}", s.sorted());
            }
        },
        &[&[1, 2, 3, 4], &[1, 2]],
    );
}

/// A stale pointer into a merged-away node: worker 2 leaves the middle
/// node [7] (worker 1 holds [1, 7] and worker 3 holds [1, 7, 7] through
/// it), so [1] absorbs [7], whose child starts with the same hash. A
/// reader that reached the absorbed node must not enter the grandchild at
/// the wrong depth: no worker is credited more than it holds, and a query
/// that starts at the grandchild's hash finds nothing.
#[test]
fn stale_pointer_after_merge() {
    model(
        vec![
            stored(1, 0, &[], &[1, 7]),
            stored(2, 0, &[], &[1]),
            stored(3, 0, &[], &[1, 7, 7]),
        ],
        vec![vec![removed(2, 1, &[&[1]])]],
        |ix, _| {
            let s = ix.find_matches(&q(&[1, 7, 7]));
            assert!(s.get(wk(1)) <= 2, "{:?}", s.sorted());
            assert!(s.get(wk(3)) <= 3, "{:?}", s.sorted());
            assert!(ix.find_matches(&q(&[1, 7, 9])).get(wk(3)) <= 2);
            assert_eq!(ix.find_matches(&q(&[7, 7])).get(wk(3)), 0);
        },
        &[&[1, 7, 7], &[1, 7], &[1]],
    );
}

/// A new leaf is published while write-locked and filled before it is
/// released: a reader sees no block of it or all of them.
#[test]
fn leaf_published_whole() {
    model(
        vec![stored(1, 0, &[], &[1])],
        vec![vec![stored(2, 0, &[], &[1, 2, 3, 4])]],
        |ix, _| {
            let s = score(ix, &[1, 2, 3, 4], 2);
            assert!(s == 0 || s == 1 || s == 4, "{s}");
        },
        &[&[1, 2, 3, 4], &[1]],
    );
}
