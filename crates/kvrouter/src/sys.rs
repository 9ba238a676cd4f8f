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

/// Gives the calling thread the least priority: the `SCHED_IDLE` policy,
/// so it runs only on CPU time nothing else wants and any other thread
/// that wakes takes its CPU at once (at nice 19 under the normal policy, a
/// waking thread can wait out the background thread's time slice, about a
/// millisecond); the nice value [`BACKGROUND_NICE`] too, for where the
/// policy is refused. Linux keeps both per thread; elsewhere a no-op.
/// True if the policy was applied.
pub fn lower_thread_priority() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: `gettid` takes nothing and returns the calling thread's
        // id; `setpriority` changes that thread's nice value and
        // `sched_setscheduler` (pid 0: the calling thread) its policy,
        // reading `param`, which lives across the call. None touches
        // other memory of ours.
        let ok = unsafe {
            let tid = libc::gettid();
            libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, BACKGROUND_NICE);
            libc::sched_setscheduler(0, libc::SCHED_IDLE, &param)
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
        // SAFETY (both): as in `lower_thread_priority`; these only read.
        let nice =
            || unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) };
        let policy = || unsafe { libc::sched_getscheduler(0) };
        let before = (nice(), policy());
        let inside = std::thread::spawn(move || (super::lower_thread_priority(), nice(), policy()))
            .join()
            .unwrap();
        assert_eq!(
            inside,
            (true, super::BACKGROUND_NICE, libc::SCHED_IDLE),
            "the policy and nice value of the lowered thread"
        );
        assert_eq!((nice(), policy()), before, "the caller's are its own");
    }
}
