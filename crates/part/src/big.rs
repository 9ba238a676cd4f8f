//! A per-thread cache of freed large node allocations (node256s, ~2 KiB).
//!
//! glibc's malloc serves a request of 1 KiB or more only after
//! consolidating its fast bins, where it keeps the small chunks freed past
//! its per-thread cache. A transaction that copies a node256 after the
//! previous version's leaves were freed (every `Modify` round of the bench,
//! every write batch of a table) paid for merging hundreds of chunks, and
//! its leaves then came from the slow path: 49 consolidations in 50 rounds
//! of 1000 modifies, a quarter of their instructions (callgrind,
//! 2026-12-02). Handing a freed node256's block to the next one skips the
//! large request; other allocators lose nothing but a thread-local lookup.
//!
//! [`alloc`] and [`dealloc`] stand for the global allocator's: blocks
//! smaller than [`MIN`] go straight to it (the test folds away for each
//! node kind's constant layout). A block enters the cache only through
//! [`give`], with the layout it was allocated with, and leaves through
//! [`take`] for that same layout or is freed when its thread exits.

use std::alloc::Layout;
use std::cell::RefCell;
use std::ptr::NonNull;

/// Allocations at least this large are cached (glibc's smallest request
/// that consolidates is 1024 bytes).
const MIN: usize = 1024;

/// `std::alloc::alloc`, served from this thread's cache when it holds a
/// freed block of `layout`.
///
/// # Safety
/// As `std::alloc::alloc`: `layout` has a non-zero size.
#[inline(always)]
pub(crate) unsafe fn alloc(layout: Layout) -> *mut u8 {
    if layout.size() >= MIN {
        if let Some(p) = take(layout) {
            return p.as_ptr();
        }
    }
    // SAFETY: forwarded.
    unsafe { std::alloc::alloc(layout) }
}

/// `std::alloc::dealloc`, keeping a large block in this thread's cache
/// when there is room.
///
/// # Safety
/// As `std::alloc::dealloc`: `p` came from [`alloc`] with `layout` and
/// holds no live value.
#[inline(always)]
pub(crate) unsafe fn dealloc(p: *mut u8, layout: Layout) {
    if layout.size() >= MIN {
        if let Some(nn) = NonNull::new(p) {
            // SAFETY: forwarded; the block, allocated with `layout` by the
            // global allocator (directly or through the cache), is the
            // caller's to give away.
            if unsafe { give(nn, layout) } {
                return;
            }
        }
    }
    // SAFETY: forwarded.
    unsafe { std::alloc::dealloc(p, layout) }
}

/// Blocks kept per thread: a write to a 100k-key tree copies up to four
/// node256s, and a 1000-key rewrite five.
const KEPT: usize = 8;

struct Cache {
    blocks: [Option<(NonNull<u8>, Layout)>; KEPT],
    len: usize,
    /// Blocks handed out again and their bytes, for the benches' allocation
    /// counts ([`reused`]).
    reused: (u64, u64),
}

impl Drop for Cache {
    fn drop(&mut self) {
        for (p, layout) in self.blocks[..self.len].iter().flatten() {
            // SAFETY: `give` took the block as allocated by the global
            // allocator with `layout`, and nothing else refers to it.
            unsafe { std::alloc::dealloc(p.as_ptr(), *layout) };
        }
    }
}

thread_local! {
    static CACHE: RefCell<Cache> = const {
        RefCell::new(Cache { blocks: [None; KEPT], len: 0, reused: (0, 0) })
    };
}

/// A cached block of exactly `layout`, if this thread has one.
#[inline]
fn take(layout: Layout) -> Option<NonNull<u8>> {
    CACHE
        .try_with(|c| {
            let mut c = c.try_borrow_mut().ok()?;
            let len = c.len;
            let i = c.blocks[..len]
                .iter()
                .position(|b| b.is_some_and(|(_, l)| l == layout))?;
            let (p, _) = c.blocks[i].take()?;
            c.blocks.swap(i, len - 1);
            c.len = len - 1;
            c.reused.0 += 1;
            c.reused.1 += layout.size() as u64;
            Some(p)
        })
        .ok()
        .flatten()
}

/// How many blocks this thread took from its cache instead of the
/// allocator, and their bytes (a counting allocator does not see them).
#[cfg(any(test, feature = "test-util"))]
pub(crate) fn reused() -> (u64, u64) {
    CACHE
        .try_with(|c| c.try_borrow().map_or((0, 0), |c| c.reused))
        .unwrap_or((0, 0))
}

/// Keeps a freed block for a later [`take`]; false (the caller frees it)
/// when the cache is full or its thread is exiting.
///
/// # Safety
/// `p` was allocated by the global allocator with `layout`, holds no live
/// value, and nothing else refers to it.
#[inline]
unsafe fn give(p: NonNull<u8>, layout: Layout) -> bool {
    CACHE
        .try_with(|c| {
            let Ok(mut c) = c.try_borrow_mut() else {
                return false;
            };
            let len = c.len;
            if len == KEPT {
                return false;
            }
            c.blocks[len] = Some((p, layout));
            c.len = len + 1;
            true
        })
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_comes_back_only_for_its_layout() {
        let big = Layout::from_size_align(2048, 8).unwrap();
        let other = Layout::from_size_align(4096, 8).unwrap();
        // SAFETY: a fresh allocation of `big`, handed over whole.
        let p = NonNull::new(unsafe { std::alloc::alloc(big) }).unwrap();
        let (n0, b0) = reused();
        assert!(unsafe { give(p, big) });
        assert_eq!(take(other), None);
        assert_eq!(take(big), Some(p));
        assert_eq!(take(big), None);
        assert_eq!(reused(), (n0 + 1, b0 + 2048));
        // SAFETY: `take` handed the block back; it is freed once.
        unsafe { std::alloc::dealloc(p.as_ptr(), big) };
    }

    #[test]
    fn a_full_cache_refuses_and_a_thread_exit_frees_what_it_kept() {
        std::thread::spawn(|| {
            let l = Layout::from_size_align(1536, 8).unwrap();
            let mut kept = 0;
            for _ in 0..KEPT + 2 {
                // SAFETY: a fresh allocation of `l`, handed over whole.
                let p = NonNull::new(unsafe { std::alloc::alloc(l) }).unwrap();
                if unsafe { give(p, l) } {
                    kept += 1;
                } else {
                    // SAFETY: refused, so still ours to free.
                    unsafe { std::alloc::dealloc(p.as_ptr(), l) };
                }
            }
            assert_eq!(kept, KEPT);
        })
        .join()
        .unwrap();
    }
}
