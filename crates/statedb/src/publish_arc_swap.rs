//! The published root over `arc-swap` (feature `arc-swap-root`): the
//! interface of `publish.rs`'s `RootCell`, kept to measure the two side by
//! side (design.md, "Measurements behind the choices"). The unit tests
//! hold both cells to one contract (`publish::root_cell_contract`).
//!
//! The same guarantees, from arc-swap's own: a load is lock-free and never
//! waits for a writer; a swap, once it returns, has paid every reader still
//! taking the old value (its debt list), so the old value's count is exact
//! and it is freed when the last holder lets go. The differences: the
//! writer reads the current value through a guarded load, and the readers
//! are paid inside the swap, so [`Writer::publish`] does all of it under
//! the lock and [`Retired::settle`] has nothing left to do.

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

    /// Publishes `new`; returns the old value, which no reader can still be
    /// taking without a reference of its own.
    pub(crate) fn swap(self, new: Arc<T>) -> Arc<T> {
        self.publish(new).settle()
    }

    /// Publishes `new` (arc-swap pays the readers taking the old value
    /// before it returns) and releases the writers' lock.
    pub(crate) fn publish(self, new: Arc<T>) -> Retired<T> {
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
        Retired(old)
    }
}

/// A value replaced by [`Writer::publish`]; its readers already paid.
pub(crate) struct Retired<T>(Arc<T>);

impl<T> Retired<T> {
    /// The old value.
    #[inline]
    pub(crate) fn settle(self) -> Arc<T> {
        self.0
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    crate::publish::root_cell_contract!();
}
