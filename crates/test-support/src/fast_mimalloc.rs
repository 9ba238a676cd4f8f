//! mimalloc as a global allocator, with small alignments on its plain path.
//!
//! The `mimalloc` crate (0.1.52) sends every Rust allocation through
//! `mi_malloc_aligned`. When the size class's free list is empty and the
//! size is not a power of two, that function over-allocates from the next
//! size class instead of refilling the list, so every later block of that
//! size takes the slow path too (~150 instructions for a 40-byte part leaf,
//! ~25 on `mi_malloc`). `mi_malloc` already returns 16-aligned blocks (8 for
//! an 8-byte one), so a layout with `align <= min(16, size)` needs nothing
//! more; larger alignments still go through the aligned calls. This is the
//! rule mimalloc_rust's open pull request #170 proposes, and the one its
//! older releases used. Shared by part's and statedb's benches and examples.

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

use libmimalloc_sys as mi;

/// mimalloc's guaranteed alignment for any block of at least that size.
const MI_MAX_ALIGN: usize = 16;

/// The global allocator (see the module docs).
pub struct FastMiMalloc;

/// True when `mi_malloc(size)` is already aligned to `align`.
#[inline]
fn plain(align: usize, size: usize) -> bool {
    align <= MI_MAX_ALIGN && align <= size
}

// SAFETY: every pointer handed out comes from mimalloc and is released
// with `mi_free`/`mi_realloc*`, which accept blocks from either the plain
// or the aligned calls; `plain` admits a layout only when mimalloc's
// natural alignment covers it.
unsafe impl GlobalAlloc for FastMiMalloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: FFI calls without preconditions beyond a non-zero size,
        // which `GlobalAlloc` guarantees.
        unsafe {
            if plain(layout.align(), layout.size()) {
                mi::mi_malloc(layout.size()).cast()
            } else {
                mi::mi_malloc_aligned(layout.size(), layout.align()).cast()
            }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as in `alloc`.
        unsafe {
            if plain(layout.align(), layout.size()) {
                mi::mi_zalloc(layout.size()).cast()
            } else {
                mi::mi_zalloc_aligned(layout.size(), layout.align()).cast()
            }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: `ptr` came from this allocator (the caller's contract).
        unsafe { mi::mi_free(ptr.cast::<c_void>()) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from this allocator; the new block keeps the
        // layout's alignment on either path.
        unsafe {
            if plain(layout.align(), new_size) {
                mi::mi_realloc(ptr.cast::<c_void>(), new_size).cast()
            } else {
                mi::mi_realloc_aligned(ptr.cast::<c_void>(), new_size, layout.align()).cast()
            }
        }
    }
}
