//! Hand-written scenarios, run against both indexes and the model.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::common::*;
use kvindex::{
    ApplyError, ConcurrentIndex, ExternalHash, KvEvent, KvEventData, KvIndexer, LocalHash,
    ReferenceIndex,
};

fn both() -> Vec<Box<dyn KvIndexer>> {
    vec![
        Box::new(ReferenceIndex::new()),
        Box::new(ConcurrentIndex::new()),
    ]
}

fn run(events: &[KvEvent]) {
    for ix in both() {
        let mut m = Model::default();
        for ev in events {
            let a = app(&*ix, ev);
            let b = m.apply(ev);
            assert_eq!(a, b, "{} result for {:?}", ix.name(), ev);
            check_equal(&*ix, &m, &[]);
        }
        // Dump into a fresh replica of each kind.
        let dump = ix.dump();
        for replica in both() {
            for ev in &dump {
                replica.apply(ev).expect("dump events apply");
            }
            check_equal(&*replica, &m, &[]);
        }
    }
}

#[test]
fn extend_branch_share() {
    let (a, b) = (wk(1), wk(2));
    run(&[
        stored(a, 0, &[], &l(&[1, 2, 3, 4]), 0),
        stored(a, 1, &l(&[1, 2, 3, 4]), &l(&[5, 6]), 0),
        stored(b, 0, &[], &l(&[1, 2]), 0),
        stored(b, 1, &l(&[1, 2]), &l(&[7, 8]), 0),
        stored(a, 2, &l(&[1, 2]), &l(&[7]), 0),
        stored(b, 2, &l(&[1, 2, 7, 8]), &l(&[9]), 0),
    ]);
}

#[test]
fn remove_middle_then_heal() {
    let a = wk(1);
    let b = wk(2);
    let p = l(&[1, 2, 3, 4, 5]);
    run(&[
        stored(a, 0, &[], &p, 0),
        stored(b, 0, &[], &p, 7),
        removed(a, 1, &[&p[..3]], 0),
        removed(b, 1, &[&p[..5]], 7),
        // Heal: store block 3 again under its parent.
        stored(a, 2, &p[..2], &p[2..3], 0),
        removed(a, 3, &[&p[..1]], 0),
        removed(a, 4, &[&p[..2], &p[..3], &p[..4], &p[..5]], 0),
        removed(b, 2, &[&p[..1], &p[..2], &p[..3], &p[..4]], 7),
    ]);
}

#[test]
fn aliases_duplicates_and_replays() {
    let a = wk(3);
    let p = l(&[1, 2, 3]);
    let mut alias = stored(a, 1, &[], &p, 99);
    if let KvEventData::Stored { blocks, .. } = &mut alias.data {
        blocks[2].local = LocalHash(4); // diverges at the last block
    }
    run(&[
        stored(a, 0, &[], &p, 0),
        alias,
        stored(a, 2, &[], &p, 0),       // replay under the same ids
        stored(a, 0, &[], &l(&[8]), 0), // older id: ignored
        removed(a, 3, &[&p[..3]], 0),
        stored(a, 3, &p[..2], &p[2..3], 0), // same id as last: applied again
    ]);
}

#[test]
fn unknown_parent_is_typed_error_and_counted() {
    for ix in both() {
        let ev = stored(wk(1), 0, &l(&[5]), &l(&[6]), 0);
        let e = ix.apply(&ev).unwrap_err();
        assert!(matches!(e, ApplyError::UnknownParent { .. }));
        assert!(e.to_string().contains("parent"));
        assert_eq!(ix.stats().unknown_parents, 1);
        assert_eq!(ix.worker_block_count(wk(1)), 0);
        let r = KvEvent {
            worker: wk(1),
            event_id: 1,
            data: KvEventData::Removed {
                hashes: vec![ExternalHash(42)],
            },
        };
        ix.apply(&r).unwrap();
        assert_eq!(ix.stats().unknown_removes, 1);
    }
}

#[test]
fn gaps_are_counted_and_reported() {
    let seen = Arc::new(AtomicU64::new(0));
    let s2 = Arc::clone(&seen);
    let ix = ConcurrentIndex::new();
    ix.set_gap_handler(Some(Arc::new(move |_w, expected, got| {
        assert_eq!((expected, got), (1, 5));
        s2.fetch_add(1, Ordering::SeqCst);
    })));
    ix.apply(&stored(wk(1), 0, &[], &l(&[1]), 0)).unwrap();
    ix.apply(&stored(wk(1), 5, &l(&[1]), &l(&[2]), 0)).unwrap();
    assert_eq!(ix.stats().gaps, 1);
    assert_eq!(seen.load(Ordering::SeqCst), 1);
    ix.apply(&stored(wk(1), 3, &[], &l(&[9]), 0)).unwrap();
    assert_eq!(ix.stats().duplicates, 1);
    assert_eq!(ix.worker_block_count(wk(1)), 2);

    let r = ReferenceIndex::new();
    r.apply(&stored(wk(1), 0, &[], &l(&[1]), 0)).unwrap();
    r.apply(&stored(wk(1), 2, &l(&[1]), &l(&[2]), 0)).unwrap();
    assert_eq!(r.stats().gaps, 1);
}

#[test]
fn clear_and_remove_worker() {
    for ix in both() {
        let p = l(&[1, 2, 3]);
        ix.apply(&stored(wk(1), 0, &[], &p, 0)).unwrap();
        ix.apply(&stored(wk(2), 0, &[], &p[..2], 0)).unwrap();
        assert_eq!(ix.find_matches(&p).get(wk(1)), 3);
        assert_eq!(ix.find_matches(&p).get(wk(2)), 2);
        ix.apply(&KvEvent {
            worker: wk(1),
            event_id: 1,
            data: KvEventData::Cleared,
        })
        .unwrap();
        assert_eq!(ix.find_matches(&p).get(wk(1)), 0);
        assert_eq!(ix.worker_block_count(wk(1)), 0);
        ix.remove_worker(wk(2));
        assert!(ix.find_matches(&p).is_empty());
        assert_eq!(ix.workers(), vec![wk(1)]);
    }
}

#[test]
fn compressed_nodes_split_and_merge_back() {
    let ix = ConcurrentIndex::new();
    let p: Vec<LocalHash> = l(&(1..=32).collect::<Vec<_>>());
    ix.apply(&stored(wk(1), 0, &[], &p, 0)).unwrap();
    let s = ix.tree_shape();
    assert_eq!((s.nodes, s.blocks), (1, 32));
    ix.apply(&stored(wk(2), 0, &[], &p[..10], 0)).unwrap();
    assert_eq!(ix.tree_shape().nodes, 2);
    ix.apply(&stored(wk(2), 1, &p[..10], &p[10..], 0)).unwrap();
    // Worker sets equal again along the whole run: merged back to one node.
    assert_eq!(ix.tree_shape().nodes, 1);
    ix.apply(&removed(wk(1), 1, &[&p[..16]], 0)).unwrap();
    assert_eq!(ix.tree_shape().nodes, 3);
    ix.apply(&stored(wk(1), 2, &p[..15], &p[15..16], 0))
        .unwrap();
    assert_eq!(ix.tree_shape().nodes, 1);
    assert_eq!(ix.find_matches(&p).get(wk(1)), 32);
}

#[test]
fn extreme_event_ids_do_not_panic() {
    for ix in both() {
        let w = wk(9);
        ix.apply(&stored(w, u64::MAX - 1, &[], &l(&[1]), 0))
            .unwrap();
        ix.apply(&stored(w, u64::MAX, &l(&[1]), &l(&[2]), 0))
            .unwrap();
        // Same id as the last one: applied again (idempotent), not a gap.
        ix.apply(&stored(w, u64::MAX, &l(&[1, 2]), &l(&[3]), 0))
            .unwrap();
        assert_eq!(ix.stats().gaps, 0);
        assert_eq!(ix.find_matches(&l(&[1, 2, 3])).get(w), 3);
        ix.apply(&stored(w, 0, &[], &l(&[7]), 0)).unwrap();
        assert_eq!(ix.stats().duplicates, 1);
        // Empty events are fine too.
        ix.apply(&KvEvent {
            worker: w,
            event_id: u64::MAX,
            data: KvEventData::Stored {
                parent: None,
                blocks: vec![],
            },
        })
        .unwrap();
        ix.apply(&KvEvent {
            worker: w,
            event_id: u64::MAX,
            data: KvEventData::Removed { hashes: vec![] },
        })
        .unwrap();
        assert!(ix.find_matches(&[]).is_empty());
        assert_eq!(ix.worker_block_count(w), 3);
        ix.remove_worker(wk(12345)); // unknown worker: no-op
    }
}

#[test]
fn gap_handler_may_call_back_into_the_index() {
    // Recovery typically re-reads or drops the worker: that must not
    // deadlock, so the handler runs after the event, with no lock held.
    let ours = Arc::new(ConcurrentIndex::new());
    let weak = Arc::downgrade(&ours);
    ours.set_gap_handler(Some(Arc::new(move |w, _, _| {
        if let Some(ix) = weak.upgrade() {
            assert_eq!(ix.worker_block_count(w), 2);
            ix.remove_worker(w);
        }
    })));
    ours.apply(&stored(wk(1), 0, &[], &l(&[1]), 0)).unwrap();
    ours.apply(&stored(wk(1), 9, &l(&[1]), &l(&[2]), 0))
        .unwrap();
    assert_eq!(ours.worker_block_count(wk(1)), 0);
    assert!(ours.find_matches(&l(&[1, 2])).is_empty());

    let reference = Arc::new(ReferenceIndex::new());
    let weak = Arc::downgrade(&reference);
    reference.set_gap_handler(Some(Arc::new(move |w, _, _| {
        if let Some(ix) = weak.upgrade() {
            ix.remove_worker(w);
        }
    })));
    reference
        .apply(&stored(wk(1), 0, &[], &l(&[1]), 0))
        .unwrap();
    reference
        .apply(&stored(wk(1), 9, &l(&[1]), &l(&[2]), 0))
        .unwrap();
    assert_eq!(reference.worker_block_count(wk(1)), 0);
}

/// A chain of 20,000 nodes (every other block of a long run removed, so
/// no two neighbours can merge) is queried, dumped and dropped on a test
/// thread's small stack without overflowing it: every walk is iterative.
#[test]
fn deep_chain_walks_and_drops_iteratively() {
    let handle = std::thread::Builder::new()
        .stack_size(256 * 1024)
        .spawn(|| {
            const N: u64 = 20_000;
            let a = wk(1);
            let locals: Vec<LocalHash> = (1..=N).map(LocalHash).collect();
            let ix = ConcurrentIndex::new();
            let ev = stored(a, 0, &[], &locals, 0);
            let KvEventData::Stored { blocks, .. } = &ev.data else {
                unreachable!()
            };
            let evens: Vec<ExternalHash> = blocks.iter().step_by(2).map(|b| b.external).collect();
            ix.apply(&ev).unwrap();
            ix.apply(&KvEvent {
                worker: a,
                event_id: 1,
                data: KvEventData::Removed { hashes: evens },
            })
            .unwrap();
            assert_eq!(ix.worker_block_count(a), (N / 2) as usize);
            let shape = ix.tree_shape();
            assert!(shape.nodes >= N as usize - 1, "{shape:?}");
            // The first block is gone, so nothing matches from the root.
            assert_eq!(ix.find_matches(&locals).len(), 0);
            let dump = ix.dump();
            let replica = ConcurrentIndex::new();
            for ev in &dump {
                replica.apply(ev).unwrap();
            }
            assert_eq!(replica.worker_block_count(a), (N / 2) as usize);
            drop(replica);
            drop(ix);
        })
        .unwrap();
    handle.join().expect("no stack overflow");
}

/// Runs longer than a node's cap (256 blocks) span several nodes; sharing,
/// branching, leaf-first eviction and re-extension across those node
/// boundaries agree with the model, and no cap-sized pieces are left
/// unmerged or over-merged.
#[test]
fn long_runs_span_capped_nodes() {
    let (a, b) = (wk(1), wk(2));
    let all: Vec<u64> = (1..=520).collect();
    let p = l(&all);
    let tail: Vec<&[LocalHash]> = (300..520).rev().map(|k| &p[..=k]).collect();
    run(&[
        stored(a, 0, &[], &p, 0),
        stored(b, 0, &[], &p[..280], 0),
        stored(b, 1, &p[..280], &l(&[5000, 5001]), 0),
        removed(a, 1, &tail, 0),
        stored(a, 2, &p[..300], &p[300..400], 0),
        removed(b, 2, &[&p[..1]], 0),
    ]);
    let ix = ConcurrentIndex::new();
    ix.apply(&stored(a, 0, &[], &p, 0)).unwrap();
    let shape = ix.tree_shape();
    assert_eq!((shape.nodes, shape.blocks, shape.mergeable), (3, 520, 0));
    assert_eq!(ix.find_matches(&p).get(a), 520);
}
