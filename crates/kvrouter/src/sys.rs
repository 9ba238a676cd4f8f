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

/// The nice value [`lower_thread_priority`] sets: the least priority.
pub const BACKGROUND_NICE: i32 = 19;

/// Gives the calling thread the least priority ([`BACKGROUND_NICE`]), so
/// work on it takes CPU time the rest of the process and the machine leave
/// over. Linux keeps a nice value per thread; elsewhere a no-op. True if
/// it was applied.
pub fn lower_thread_priority() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: `gettid` takes nothing and returns the calling thread's
        // id; `setpriority` changes that thread's nice value. Neither
        // touches memory of ours.
        let ok = unsafe {
            let tid = libc::gettid();
            libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, BACKGROUND_NICE)
        };
        ok == 0
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

    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn a_thread_lowers_its_own_priority_only() {
        let nice = || {
            // SAFETY: as in `lower_thread_priority`; `getpriority` reads.
            unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) }
        };
        let before = nice();
        let inside = std::thread::spawn(move || (super::lower_thread_priority(), nice()))
            .join()
            .unwrap();
        assert_eq!(inside, (true, super::BACKGROUND_NICE));
        assert_eq!(nice(), before);
    }
}
