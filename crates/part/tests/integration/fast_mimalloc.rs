//! The benches' allocator shim (`test-support/src/fast_mimalloc.rs`) honours
//! every layout: alignment on both paths, zeroing, and contents kept across
//! `realloc` when a block moves between the plain and the aligned calls.

use test_support::fast_mimalloc;

use std::alloc::{GlobalAlloc, Layout};

use fast_mimalloc::FastMiMalloc;

const SIZES: [usize; 14] = [1, 3, 4, 7, 8, 15, 16, 24, 40, 48, 100, 256, 1000, 5000];

fn fill(p: *mut u8, len: usize) {
    // SAFETY: the callers pass a live block of at least `len` bytes.
    let bytes = unsafe { std::slice::from_raw_parts_mut(p, len) };
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = i as u8;
    }
}

fn holds_pattern(p: *const u8, len: usize) -> bool {
    // SAFETY: as in `fill`.
    let bytes = unsafe { std::slice::from_raw_parts(p, len) };
    bytes.iter().enumerate().all(|(i, &b)| b == i as u8)
}

#[test]
fn every_layout_is_aligned_zeroed_and_kept_by_realloc() {
    let a = FastMiMalloc;
    for align in (0..13).map(|s| 1usize << s) {
        for size in SIZES {
            let layout = Layout::from_size_align(size, align).unwrap();
            // SAFETY: non-zero sizes; each block is used within its size and
            // freed once with the layout it currently has.
            unsafe {
                let p = a.alloc(layout);
                assert!(!p.is_null());
                assert_eq!(p as usize % align, 0, "alloc size {size} align {align}");
                fill(p, size);
                a.dealloc(p, layout);

                let z = a.alloc_zeroed(layout);
                assert_eq!(z as usize % align, 0, "zeroed size {size} align {align}");
                assert!(std::slice::from_raw_parts(z, size).iter().all(|&b| b == 0));
                a.dealloc(z, layout);

                let (mut p, mut len) = (a.alloc(layout), size);
                fill(p, len);
                for new_len in SIZES {
                    let old = Layout::from_size_align(len, align).unwrap();
                    p = a.realloc(p, old, new_len);
                    assert_eq!(
                        p as usize % align,
                        0,
                        "realloc {len}->{new_len} align {align}"
                    );
                    assert!(
                        holds_pattern(p, len.min(new_len)),
                        "realloc {len}->{new_len}"
                    );
                    len = new_len;
                    fill(p, len);
                }
                a.dealloc(p, Layout::from_size_align(len, align).unwrap());
            }
        }
    }
}
