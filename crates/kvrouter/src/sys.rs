//! Process-level settings for a long-running router.
#![allow(unsafe_code)]

/// The trim threshold glibc is pinned at (its documented default).
pub const MALLOC_TRIM_THRESHOLD: usize = 128 << 10;

/// Pins glibc's trim threshold at [`MALLOC_TRIM_THRESHOLD`]. Left alone,
/// glibc raises it to twice the largest block it has freed from an mmap,
/// so memory the router frees as per-worker maps are rebuilt (hundreds of
/// KiB each) stays resident. Pinning it also stops glibc's dynamic mmap
/// threshold. Call it once at start, before other threads run. A no-op
/// elsewhere than Linux with glibc, and under another global allocator
/// it only tunes the unused system one. True if it was applied.
pub fn pin_malloc_trim_threshold() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let v = libc::c_int::try_from(MALLOC_TRIM_THRESHOLD).unwrap_or(libc::c_int::MAX);
        // SAFETY: `mallopt` takes two integers and changes one allocator
        // parameter under glibc's own lock; it touches no memory of ours.
        let ok = unsafe { libc::mallopt(libc::M_TRIM_THRESHOLD, v) };
        ok == 1
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    false
}

#[cfg(test)]
mod tests {
    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn glibc_takes_the_setting() {
        assert!(super::pin_malloc_trim_threshold());
    }
}
