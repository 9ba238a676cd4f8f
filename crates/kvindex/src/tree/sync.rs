//! The node lock and the reclamation epoch, from `parking_lot` and
//! `crossbeam-epoch`, or, under `--cfg loom`, stand-ins that let loom
//! explore the tree's real code (`tests/loom.rs`).
//!
//! Under loom the node lock is loom's `RwLock` behind the same owned-guard
//! API (`write_arc`, `WGuard::rwlock`), so every interleaving of node
//! critical sections is explored. Deferred releases are kept until
//! [`flush_deferred`] runs (the models call it once their threads have
//! joined): stronger than an epoch, which is the guarantee the tree relies
//! on (`Linked::pinned`); that crossbeam-epoch gives it is loom-tested in
//! crossbeam itself.

#[cfg(not(loom))]
pub(crate) use imp::*;

#[cfg(loom)]
pub(crate) use loom_imp::*;

#[cfg(not(loom))]
mod imp {
    pub(crate) use crossbeam_epoch::{pin, Guard};
    pub(crate) use parking_lot::RwLock;

    /// Owned write guard of a node lock (keeps its node alive).
    pub(crate) type ArcWriteGuard<T> = parking_lot::ArcRwLockWriteGuard<parking_lot::RawRwLock, T>;

    /// Runs the releases deferred so far, as far as pinned readers allow:
    /// each flush hands this thread's deferred releases to the global
    /// queue and tries to advance the epoch; a release runs two epochs
    /// after it was deferred, so a few rounds drain everything when nobody
    /// is pinned.
    #[cfg_attr(not(feature = "test-util"), allow(dead_code))]
    pub(crate) fn flush_deferred() {
        for _ in 0..16 {
            crossbeam_epoch::pin().flush();
        }
    }
}

#[cfg(loom)]
#[allow(unsafe_code)]
mod loom_imp {
    use std::cell::RefCell;
    use std::mem::ManuallyDrop;
    use std::ops::{Deref, DerefMut};
    use std::sync::Arc;

    type Deferred = Box<dyn FnOnce() + Send>;

    std::thread_local! {
        /// Releases deferred until the next [`flush_deferred`]. Per OS
        /// thread: a loom model runs all its threads on the thread of its
        /// test, and tests run side by side, so a process-wide list would
        /// let one model's flush free nodes another model's readers walk.
        static DEFERRED: RefCell<Vec<Deferred>> = const { RefCell::new(Vec::new()) };
    }

    /// A pinned reader (nothing to hold: nothing is released while pinned).
    pub(crate) struct Guard(());

    /// Pins the current thread.
    pub(crate) fn pin() -> Guard {
        Guard(())
    }

    impl Guard {
        /// Keeps `f` until [`flush_deferred`].
        pub(crate) fn defer<F: FnOnce() + Send + 'static>(&self, f: F) {
            DEFERRED.with(|d| d.borrow_mut().push(Box::new(f)));
        }
    }

    /// Runs every deferred release; only once no reader can be walking.
    pub(crate) fn flush_deferred() {
        let all = DEFERRED.with(|d| std::mem::take(&mut *d.borrow_mut()));
        for f in all {
            f();
        }
    }

    /// loom's reader-writer lock with `parking_lot`'s method names.
    #[derive(Debug, Default)]
    pub(crate) struct RwLock<T>(loom::sync::RwLock<T>);

    impl<T> RwLock<T> {
        pub(crate) fn new(v: T) -> Self {
            RwLock(loom::sync::RwLock::new(v))
        }

        pub(crate) fn read(&self) -> loom::sync::RwLockReadGuard<'_, T> {
            self.0.read().unwrap_or_else(|e| e.into_inner())
        }

        pub(crate) fn write(&self) -> loom::sync::RwLockWriteGuard<'_, T> {
            self.0.write().unwrap_or_else(|e| e.into_inner())
        }

        /// A write guard that owns a reference to the lock.
        pub(crate) fn write_arc(self: &Arc<Self>) -> ArcWriteGuard<T>
        where
            T: 'static,
        {
            let lock = Arc::clone(self);
            let g = lock.write();
            // SAFETY: the guard borrows the lock inside `lock`'s allocation,
            // which the returned value keeps alive through its own `Arc`
            // and does not move; `Drop` releases the guard before that
            // `Arc`, so the borrow never outlives the lock.
            let guard = unsafe {
                std::mem::transmute::<
                    loom::sync::RwLockWriteGuard<'_, T>,
                    loom::sync::RwLockWriteGuard<'static, T>,
                >(g)
            };
            ArcWriteGuard {
                guard: ManuallyDrop::new(guard),
                lock,
            }
        }
    }

    /// Owned write guard of a node lock (keeps its node alive).
    pub(crate) struct ArcWriteGuard<T: 'static> {
        guard: ManuallyDrop<loom::sync::RwLockWriteGuard<'static, T>>,
        lock: Arc<RwLock<T>>,
    }

    impl<T: 'static> ArcWriteGuard<T> {
        /// The lock this guard holds.
        pub(crate) fn rwlock(g: &Self) -> &Arc<RwLock<T>> {
            &g.lock
        }
    }

    impl<T: 'static> Deref for ArcWriteGuard<T> {
        type Target = T;
        fn deref(&self) -> &T {
            &self.guard
        }
    }

    impl<T: 'static> DerefMut for ArcWriteGuard<T> {
        fn deref_mut(&mut self) -> &mut T {
            &mut self.guard
        }
    }

    impl<T: 'static> Drop for ArcWriteGuard<T> {
        fn drop(&mut self) {
            // SAFETY: dropped once, here, before `lock` (a field dropped
            // after this body) releases the allocation the guard borrows.
            unsafe { ManuallyDrop::drop(&mut self.guard) }
        }
    }
}
