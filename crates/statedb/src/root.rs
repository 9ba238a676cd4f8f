//! The published root: a `triomphe::Arc` in an `arc-swap` cell, which
//! readers load without a lock and one writer at a time (holding the
//! cell's lock) replaces, with a version count beside it.
//!
//! arc-swap's guarantees carry over: a load is lock-free and never waits
//! for a writer; a swap, once it returns, has paid every reader still
//! taking the old value (its debt list), so the old value's count is exact
//! and it is freed when the last holder lets go. The writer reads the
//! current value through a guarded load and the readers are paid inside
//! the swap, so [`Writer::swap`] does all of it under the lock.
//!
//! The cost, measured (design.md, "Measurements behind the choices"): a
//! swap walks every thread's debt node, so a write beside many threads
//! that once read pays for each of them.

use std::sync::atomic::{AtomicU64, Ordering};

use arc_swap::{ArcSwapAny, Guard};
use crossbeam_utils::CachePadded;
use parking_lot::{Mutex, MutexGuard};
use triomphe::Arc;

/// An atomically replaced `Arc<T>`: readers load it lock-free, writers
/// replace it one at a time, and count the swaps.
///
/// `repr(C)`: the value and the count, which readers load, share the first
/// line pair; the writers' lock has the second to itself.
#[repr(C)]
pub(crate) struct RootCell<T> {
    value: ArcSwapAny<Arc<T>>,
    /// Bumped after every publication's store (see [`RootCell::version`]).
    version: AtomicU64,
    /// Held by the one writer.
    lock: CachePadded<Mutex<()>>,
}

impl<T> RootCell<T> {
    pub(crate) fn new(v: Arc<T>) -> Self {
        RootCell {
            value: ArcSwapAny::new(v),
            version: AtomicU64::new(0),
            lock: CachePadded::new(Mutex::new(())),
        }
    }

    /// The current value.
    #[inline]
    pub(crate) fn load_full(&self) -> Arc<T> {
        self.value.load_full()
    }

    /// How many times the value was replaced. A reader that loads this
    /// (Acquire) and then the value finds the value that publication
    /// stored, or a newer one.
    #[inline]
    pub(crate) fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// The writer's access: the lock, the current value, the swap.
    #[inline]
    pub(crate) fn write(&self) -> Writer<'_, T> {
        let lock = self.lock.lock();
        Writer {
            cell: self,
            current: self.value.load(),
            _lock: lock,
        }
    }
}

/// The one writer of a [`RootCell`].
pub(crate) struct Writer<'a, T> {
    cell: &'a RootCell<T>,
    /// The current value, guarded (only this writer can replace it).
    current: Guard<Arc<T>>,
    _lock: MutexGuard<'a, ()>,
}

impl<T> Writer<'_, T> {
    /// The current value, which only this writer can replace.
    #[inline]
    pub(crate) fn current(&self) -> &T {
        &self.current
    }

    /// Publishes `new` and releases the writers' lock; returns the old
    /// value, which no reader can still be taking without a reference of
    /// its own (arc-swap pays them before its swap returns).
    pub(crate) fn swap(self, new: Arc<T>) -> Arc<T> {
        let Writer {
            cell,
            current,
            _lock,
        } = self;
        // Its debt given back first: the swap would otherwise pay it.
        drop(current);
        let old = cell.value.swap(new);
        // Release: pairs with `version`'s Acquire; a reader that sees the
        // new count then loads the new value or a newer one. The lock
        // orders the writers, so a load and a store make the increment.
        let v = cell.version.load(Ordering::Relaxed);
        cell.version.store(v.wrapping_add(1), Ordering::Release);
        old
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Old values kept past the next swap keep exact counts: each is
    /// freed when its last holder lets go, and one dropped at once frees.
    #[test]
    fn old_values_kept_past_the_next_swap_keep_exact_counts() {
        let cell = RootCell::new(Arc::new(0u64));
        let held = cell.load_full();
        let zero = cell.write().swap(Arc::new(1));
        let one = cell.write().swap(Arc::new(2));
        assert_eq!(*cell.load_full(), 2);
        assert_eq!(*one, 1);
        assert!(Arc::try_unique(one).is_ok());
        assert_eq!(*zero, 0);
        assert_eq!(Arc::count(&zero), 2);
        drop(held);
        assert!(Arc::try_unique(zero).is_ok());
        assert_eq!(cell.version(), 2);
        drop(cell.write().swap(Arc::new(3)));
        let three = cell.load_full();
        assert_eq!((*three, Arc::count(&three)), (3, 2));
    }

    #[test]
    fn loads_see_the_latest_swap_and_counts_stay_exact() {
        let cell = RootCell::new(Arc::new(1u64));
        let a = cell.load_full();
        assert_eq!(*a, 1);
        let old = cell.write().swap(Arc::new(2));
        assert_eq!(*old, 1);
        // `a` and `old` hold the first value; the cell the second.
        assert_eq!(Arc::count(&old), 2);
        drop(a);
        assert!(Arc::try_unique(old).is_ok());
        let b = cell.load_full();
        assert_eq!(*b, 2);
        assert_eq!(Arc::count(&b), 2);
        assert_eq!(*cell.write().current(), 2);
    }

    #[test]
    fn readers_and_a_writer_on_threads() {
        let cell = std::sync::Arc::new(RootCell::new(Arc::new(0u64)));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let readers: Vec<_> = (0..3)
            .map(|_| {
                let (cell, stop) = (cell.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut last = 0;
                    let mut n = 0u64;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) || n < 1000 {
                        let v = cell.load_full();
                        assert!(*v >= last, "values only grow");
                        last = *v;
                        n += 1;
                    }
                })
            })
            .collect();
        let mut kept = Vec::new();
        for i in 1..=20_000u64 {
            let old = cell.write().swap(Arc::new(i));
            assert_eq!(*old, i - 1);
            if i % 1000 == 0 {
                kept.push(old);
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for r in readers {
            r.join().unwrap();
        }
        // Every reference a reader took was given back.
        for k in kept {
            assert_eq!(Arc::count(&k), 1);
        }
        assert_eq!(Arc::count(&cell.load_full()), 2);
    }

    /// Many more reader threads than a debt list node serves, twice over
    /// (the second wave reuses the nodes the first gave back), against a
    /// writer.
    #[test]
    fn many_reader_threads_against_a_writer() {
        let cell = std::sync::Arc::new(RootCell::new(Arc::new(0u64)));
        for _wave in 0..2 {
            let start = std::sync::Arc::new(std::sync::Barrier::new(49));
            let readers: Vec<_> = (0..48)
                .map(|_| {
                    let (cell, start) = (cell.clone(), start.clone());
                    std::thread::spawn(move || {
                        start.wait();
                        let mut last = 0;
                        for _ in 0..200 {
                            let v = cell.load_full();
                            assert!(*v >= last);
                            last = *v;
                        }
                    })
                })
                .collect();
            start.wait();
            let first = *cell.load_full();
            for i in 1..=2000u64 {
                let old = cell.write().swap(Arc::new(first + i));
                assert_eq!(*old, first + i - 1);
            }
            for r in readers {
                r.join().unwrap();
            }
        }
        assert_eq!(Arc::count(&cell.load_full()), 2);
    }
}
