//! The sharded counting allocator counts exactly across threads: every
//! allocation and free of every thread lands in some shard, and the sums
//! agree with what the threads did (this binary's only test, so no other
//! test thread allocates meanwhile).

use std::alloc::System;

use test_support::counting::{counts, Counting, SHARDS};

#[global_allocator]
static A: Counting<System> = Counting(System);

#[test]
fn counts_add_up_over_threads() {
    let before = counts();
    // More threads than shards, so some share one; each allocates 1000
    // boxes of 40 bytes, frees half of them on its own thread and hands
    // the other half to the main thread, which frees them.
    let threads = SHARDS + 4;
    let kept: Vec<Vec<Box<[u8; 40]>>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut v: Vec<Box<[u8; 40]>> = Vec::with_capacity(1000);
                    for i in 0..1000 {
                        v.push(Box::new([i as u8; 40]));
                    }
                    let rest = v.split_off(500);
                    drop(v);
                    rest
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mid = counts();
    let boxes = kept.iter().map(Vec::len).sum::<usize>() as i64;
    assert_eq!(boxes, threads as i64 * 500);
    // At least the boxes still held are live (plus the vectors and the
    // threads' own bookkeeping, which the runtime may keep).
    assert!(mid.live_bytes - before.live_bytes >= boxes * 40);
    assert!(mid.total_allocs - before.total_allocs >= threads as u64 * 1000);
    drop(kept);
    let after = counts();
    // Freed on another thread than the one that allocated: still counted.
    let freed = mid.live_bytes - after.live_bytes;
    assert!(freed >= boxes * 40, "{freed}");
    assert_eq!(after.total_allocs, mid.total_allocs);
}
