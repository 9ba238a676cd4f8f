//! A global allocator that counts allocations and bytes (in total and
//! live) per thread shard, then forwards to another allocator.
//!
//! For benchmarks that time several threads allocating at once: one set of
//! process-wide counters puts a cache line that every allocation and free
//! writes under all of those threads, and the benchmark then measures the
//! line moving between cores as much as the code under test. Each thread
//! here writes the counters of its own shard (a cache line of its own);
//! [`counts`] sums them. Threads past [`SHARDS`] share shards, which stays
//! exact (the counters are atomic) at some contention.

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering::Relaxed};

/// Install with `#[global_allocator]`, e.g.
/// `static A: Counting<std::alloc::System> = Counting(std::alloc::System);`;
/// read with [`counts`].
pub struct Counting<A>(pub A);

/// How many shards the counts are kept in.
pub const SHARDS: usize = 16;

/// One shard's counters, alone on its cache lines (128 bytes: adjacent
/// lines are fetched in pairs on current x86).
#[repr(align(128))]
struct Shard {
    total_bytes: AtomicU64,
    total_allocs: AtomicU64,
    live_bytes: AtomicI64,
    live_allocs: AtomicI64,
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: Shard = Shard {
    total_bytes: AtomicU64::new(0),
    total_allocs: AtomicU64::new(0),
    live_bytes: AtomicI64::new(0),
    live_allocs: AtomicI64::new(0),
};

static SHARD: [Shard; SHARDS] = [EMPTY; SHARDS];
static NEXT: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    // Const-initialised and without a destructor: reading it never
    // allocates, which matters inside an allocator.
    static MINE: Cell<usize> = const { Cell::new(usize::MAX) };
}

/// The calling thread's shard: the next one in turn at its first call.
#[inline]
fn shard() -> &'static Shard {
    let i = MINE
        .try_with(|c| {
            if c.get() == usize::MAX {
                c.set(NEXT.fetch_add(1, Relaxed) % SHARDS);
            }
            c.get()
        })
        // A thread past its thread-locals' teardown still frees.
        .unwrap_or(0);
    &SHARD[i]
}

/// The process's counts, summed over the shards.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Bytes ever requested (allocations and reallocations' new sizes).
    pub total_bytes: u64,
    /// Allocations and reallocations ever made.
    pub total_allocs: u64,
    /// Bytes allocated and not yet freed.
    pub live_bytes: i64,
    /// Allocations not yet freed.
    pub live_allocs: i64,
}

/// The counts so far (each shard read once; exact when no other thread
/// allocates meanwhile).
pub fn counts() -> Counts {
    SHARD.iter().fold(Counts::default(), |c, s| Counts {
        total_bytes: c.total_bytes + s.total_bytes.load(Relaxed),
        total_allocs: c.total_allocs + s.total_allocs.load(Relaxed),
        live_bytes: c.live_bytes + s.live_bytes.load(Relaxed),
        live_allocs: c.live_allocs + s.live_allocs.load(Relaxed),
    })
}

/// Heap bytes allocated and not yet freed, process-wide (what the memory
/// tests measure).
pub fn live() -> isize {
    counts().live_bytes as isize
}

// SAFETY: every call is forwarded unchanged to `A`, which upholds
// `GlobalAlloc`'s contract; the counters only observe sizes.
unsafe impl<A: GlobalAlloc> GlobalAlloc for Counting<A> {
    #[inline]
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let s = shard();
        s.total_bytes.fetch_add(l.size() as u64, Relaxed);
        s.total_allocs.fetch_add(1, Relaxed);
        s.live_bytes.fetch_add(l.size() as i64, Relaxed);
        s.live_allocs.fetch_add(1, Relaxed);
        // SAFETY: our caller's contract is `A`'s.
        unsafe { self.0.alloc(l) }
    }

    #[inline]
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        let s = shard();
        s.live_bytes.fetch_sub(l.size() as i64, Relaxed);
        s.live_allocs.fetch_sub(1, Relaxed);
        // SAFETY: `p` came from `A` with layout `l` (our caller's contract).
        unsafe { self.0.dealloc(p, l) }
    }

    #[inline]
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        let s = shard();
        s.total_bytes.fetch_add(new as u64, Relaxed);
        s.total_allocs.fetch_add(1, Relaxed);
        s.live_bytes
            .fetch_add(new as i64 - l.size() as i64, Relaxed);
        // SAFETY: as for `dealloc`; `new` is non-zero by contract.
        unsafe { self.0.realloc(p, l, new) }
    }
}
