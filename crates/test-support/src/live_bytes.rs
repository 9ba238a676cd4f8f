//! A global allocator that keeps a count of live heap bytes (as requested,
//! before the allocator's rounding) and forwards to the system allocator.
//! Shared by the memory tests of kvindex and statedb, each a test binary
//! of its own so that no other test thread allocates meanwhile.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering::Relaxed};

/// Install with `#[global_allocator]`; read with [`live`].
pub struct LiveBytes;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: forwards every call to `System` unchanged; only counts sizes.
unsafe impl GlobalAlloc for LiveBytes {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, Relaxed);
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as isize, Relaxed);
        // SAFETY: same contract as our caller's.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        LIVE.fetch_add(new as isize - l.size() as isize, Relaxed);
        // SAFETY: same contract as our caller's.
        unsafe { System.realloc(p, l, new) }
    }
}

/// Heap bytes allocated and not yet freed, process-wide.
pub fn live() -> isize {
    LIVE.load(Relaxed)
}
