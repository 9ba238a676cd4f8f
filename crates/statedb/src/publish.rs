//! The published root: one `triomphe::Arc` that readers take without a lock
//! and that one writer at a time (holding the cell's lock) replaces.
//!
//! Unlike arc-swap, whose swap walks every thread's debt node with five
//! locked instructions and ~200 others of generic machinery (a pre-paid
//! reference taken and given back, a writer reservation per node, a
//! helping slot) and whose loads take two locked instructions each, the
//! writer here reads the current value under its lock with a plain load,
//! and its swap is a store, a fence and a scan of the readers' slots.
//!
//! The protocol is arc-swap's debts, kept to what this cell needs. Each
//! thread owns a *slot* (in a global list of chunks, never freed; a
//! thread's slot goes back to the pool when the thread exits). A reader:
//!
//! 1. loads the cell's pointer `p`, writes the cell's address and then `p`
//!    into its slot, and after a `SeqCst` fence loads the pointer again;
//! 2. if it changed, withdraws (clears the slot) and starts over;
//! 3. else takes a reference on `p` and clears the slot with a
//!    compare-and-swap from `p`.
//!
//! A writer stores the new pointer and, after a `SeqCst` fence, for every
//! slot that holds its old pointer and its cell's address takes a
//! reference *for* the reader and marks the slot `PAID` (a
//! compare-and-swap from the old pointer; on failure the reader got there
//! first and the reference is given back). Only then does it let go of
//! its own reference.
//!
//! Why it is safe: the two fences are ordered one way or the other. If
//! the writer's comes first, the reader's second load (after its fence)
//! sees the new pointer and the reader withdraws. If the reader's comes
//! first, the writer's slot load (after its fence) sees the reader's slot
//! write, or a later one: `p` is there unless the reader has already
//! cleared it, which it does only after taking its reference. Either the
//! reader's reference or the writer's payment therefore exists before the
//! writer's own reference can go, and `p` stays alive while the reader
//! uses it. A reader whose slot was paid finds `PAID` in its
//! compare-and-swap and drops the payment (it holds its own reference, or,
//! when withdrawing, needs none). The cell's address in the slot keeps a
//! writer of another cell from paying for an address its own old pointer
//! happens to share with a stale slot (a freed and reused allocation); it
//! is written before the pointer, so a writer that sees the pointer sees
//! the address written with it or a later one; a later one means this
//! protection has ended (and if it names the same cell, the
//! compare-and-swap pays only a slot that still holds the old pointer,
//! which is then a protection of that same, live value).
//!
//! The store is made under the writers' lock; the fence and the walk
//! (`Retired::settle`) need not be: each walk pays only slots holding its
//! own old pointer, which its reference keeps alive (so no other live
//! value shares the address), and a slot holds one pointer at a time, so
//! walks of successive swaps may overlap.
//!
//! Readers are lock-free (a reader starts over only when a writer
//! published meanwhile); the writer never waits for a reader.

use std::any::Any;
use std::marker::PhantomData;
use std::mem::forget;
use std::ptr::null_mut;
use std::ptr::NonNull;

use std::sync::atomic::AtomicU64 as StdAtomicU64;

use parking_lot::{Mutex, MutexGuard};
use triomphe::Arc;

use crossbeam_utils::CachePadded;

#[cfg(loom)]
use loom::sync::atomic::{fence, AtomicBool, AtomicPtr, AtomicUsize, Ordering::*};
#[cfg(not(loom))]
use std::sync::atomic::{fence, AtomicBool, AtomicPtr, AtomicUsize, Ordering::*};

/// A paid slot: address 1, never an `Arc`'s (those are 8-aligned).
const PAID: *mut u8 = std::ptr::dangling_mut::<u8>();

/// One thread's protection of a pointer it is loading. Alone on its pair
/// of cache lines: its thread writes it on every load, writers read it on
/// every swap.
#[repr(align(128))]
struct Slot {
    /// The pointer being protected, `PAID`, or null.
    ptr: AtomicPtr<u8>,
    /// The address of the cell `ptr` was loaded from.
    cell: AtomicUsize,
    in_use: AtomicBool,
}

/// Slots per chunk. Small under loom, so that its models fill a chunk
/// and push the next.
#[cfg(not(loom))]
const CHUNK: usize = 16;
#[cfg(loom)]
const CHUNK: usize = 2;

/// Slots allocated together, so that a writer's walk loads them
/// independently (one list node per slot made each load wait for the
/// one before: ~10 ns per reading thread on every swap).
struct Chunk {
    slots: [Slot; CHUNK],
    /// How many slots, from the first, were handed out (only grows; may
    /// overshoot `CHUNK`).
    claimed: AtomicUsize,
    /// The next chunk; set before the chunk is published, then never
    /// changed.
    next: *const Chunk,
}

// SAFETY: `next` is written only before the chunk is published (by a
// Release compare-and-swap, which every walk of the list reads with
// Acquire), and the chunks it points to live for the rest of the process.
unsafe impl Sync for Chunk {}

/// The registry of slots: a list of chunks that only grows.
struct Slots {
    head: AtomicPtr<Chunk>,
}

impl Slots {
    /// Each slot handed out so far.
    #[inline]
    fn each(&self, mut f: impl FnMut(&'static Slot)) {
        let mut c = self.head.load(Acquire);
        // SAFETY: chunks are leaked, never freed, and `next` is immutable
        // once published (see `Chunk`).
        while let Some(chunk) = unsafe { c.as_ref() } {
            // Acquire: a slot handed out before a reader's fence is seen
            // by a walk after a later writer fence (module docs).
            let n = chunk.claimed.load(Acquire).min(CHUNK);
            for slot in &chunk.slots[..n] {
                f(slot);
            }
            c = chunk.next.cast_mut();
        }
    }

    /// A free slot, marked in use: a released one, else the next of the
    /// newest chunk, else the first of a new chunk.
    fn claim(&'static self) -> &'static Slot {
        let mut found = None;
        self.each(|slot| {
            if found.is_none()
                && !slot.in_use.load(Relaxed)
                && slot
                    .in_use
                    .compare_exchange(false, true, Acquire, Relaxed)
                    .is_ok()
            {
                found = Some(slot);
            }
        });
        if let Some(slot) = found {
            return slot;
        }
        loop {
            let head = self.head.load(Acquire);
            // SAFETY: as in `each`.
            if let Some(chunk) = unsafe { head.as_ref() } {
                // AcqRel: see `each`. Slots start in use, so a slot is
                // never taken both here and by a reuse.
                let i = chunk.claimed.fetch_add(1, AcqRel);
                if i < CHUNK {
                    return &chunk.slots[i];
                }
            }
            let new = Box::into_raw(Box::new(Chunk {
                slots: std::array::from_fn(|_| Slot {
                    ptr: AtomicPtr::new(null_mut()),
                    cell: AtomicUsize::new(0),
                    in_use: AtomicBool::new(true),
                }),
                claimed: AtomicUsize::new(1),
                next: head,
            }));
            // AcqRel: publishes the chunk (see `each`).
            match self.head.compare_exchange(head, new, AcqRel, Acquire) {
                // SAFETY: leaked: chunks live for the rest of the process.
                Ok(_) => return unsafe { &(*new).slots[0] },
                // SAFETY: not published: ours alone.
                Err(_) => drop(unsafe { Box::from_raw(new) }),
            }
        }
    }
}

#[cfg(not(loom))]
static SLOTS: Slots = Slots {
    head: AtomicPtr::new(null_mut()),
};

// Loom's atomics are not `const`-constructible.
#[cfg(loom)]
loom::lazy_static! {
    static ref SLOTS: Slots = Slots {
        head: AtomicPtr::new(null_mut()),
    };
}

/// This thread's slot, given back when the thread exits.
struct Mine(&'static Slot);

impl Drop for Mine {
    fn drop(&mut self) {
        // Release: the slot's last clear happens before its next owner's
        // use.
        self.0.in_use.store(false, Release);
    }
}

#[cfg(not(loom))]
thread_local! {
    static MINE: Mine = Mine(SLOTS.claim());
}

#[cfg(loom)]
loom::thread_local! {
    static MINE: Mine = Mine(SLOTS.claim());
}

/// Runs `f` with this thread's slot (or, while the thread is exiting, one
/// claimed for the call).
#[inline]
fn with_slot<R>(f: impl FnOnce(&'static Slot) -> R) -> R {
    match MINE.try_with(|m| m.0) {
        Ok(slot) => f(slot),
        Err(_) => {
            let slot = SLOTS.claim();
            let r = f(slot);
            slot.in_use.store(false, Release);
            r
        }
    }
}

/// A new reference to the `Arc` at `p`.
///
/// # Safety
/// `p` came from `Arc::into_raw` and the `Arc` is alive for the call.
#[inline]
unsafe fn clone_raw<T>(p: *const T) -> Arc<T> {
    // SAFETY: the caller's; the borrowed `Arc` is not dropped.
    let borrowed = std::mem::ManuallyDrop::new(unsafe { Arc::from_raw(p) });
    Arc::clone(&borrowed)
}

/// An atomically replaced `Arc<T>`: readers load it lock-free, writers
/// replace it one at a time (see the module docs), and count the swaps.
///
/// `repr(C)`: the pointer and the count, which readers load, share the
/// first line pair; the writers' lock has the second to itself.
#[repr(C)]
pub(crate) struct RootCell<T> {
    /// From `Arc::into_raw`; the cell owns that reference.
    ptr: AtomicPtr<T>,
    /// Bumped after every publication's store (see [`RootCell::version`]). `std`'s even
    /// under loom: the models do not follow it.
    version: StdAtomicU64,
    /// Held by the one writer.
    lock: CachePadded<Mutex<()>>,
    _owns: PhantomData<Arc<T>>,
}

// SAFETY: the cell hands out `Arc<T>`s to any thread, as `Arc<T>` does.
unsafe impl<T: Send + Sync> Send for RootCell<T> {}
// SAFETY: as above.
unsafe impl<T: Send + Sync> Sync for RootCell<T> {}

impl<T> RootCell<T> {
    pub(crate) fn new(v: Arc<T>) -> Self {
        RootCell {
            ptr: AtomicPtr::new(Arc::into_raw(v).cast_mut()),
            version: StdAtomicU64::new(0),
            lock: CachePadded::new(Mutex::new(())),
            _owns: PhantomData,
        }
    }

    fn id(&self) -> usize {
        self as *const Self as usize
    }

    /// The current value.
    pub(crate) fn load_full(&self) -> Arc<T> {
        let id = self.id();
        with_slot(|slot| loop {
            let p = self.ptr.load(Acquire);
            slot.cell.store(id, Relaxed);
            // Release: a writer that sees `p` here sees `id` above.
            slot.ptr.store(p.cast(), Release);
            // The slot write before the second load (module docs).
            fence(SeqCst);
            let still = self.ptr.load(Acquire) == p;
            // SAFETY (both uses of `p` below): a slot that still holds
            // `p` when the second load saw `p` keeps it alive until
            // cleared (module docs), and the payment a writer left is a
            // reference on `p`, which is this cell's `T`.
            let got = still.then(|| unsafe { clone_raw(p) });
            if slot
                .ptr
                .compare_exchange(p.cast(), null_mut(), AcqRel, Relaxed)
                .is_err()
            {
                // Paid: drop the writer's reference.
                slot.ptr.store(null_mut(), Release);
                drop(unsafe { Arc::from_raw(p) });
            }
            if let Some(v) = got {
                return v;
            }
        })
    }

    /// How many times the value was replaced. A reader that loads this
    /// (Acquire) and then the value finds the value that publication
    /// stored, or a newer one: an unchanged count tells a reader holding a
    /// value that nothing was published since, with one plain load.
    #[inline]
    pub(crate) fn version(&self) -> u64 {
        self.version.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The writer's access: the lock, the current value, the swap.
    #[inline]
    pub(crate) fn write(&self) -> Writer<'_, T> {
        Writer {
            cell: self,
            _lock: self.lock.lock(),
        }
    }
}

impl<T> Drop for RootCell<T> {
    fn drop(&mut self) {
        // SAFETY: the cell's own reference; `&mut self`: no reader is
        // loading.
        drop(unsafe { Arc::from_raw(self.ptr.load(Acquire)) });
    }
}

/// The one writer of a [`RootCell`].
pub(crate) struct Writer<'a, T> {
    cell: &'a RootCell<T>,
    _lock: MutexGuard<'a, ()>,
}

impl<T> Writer<'_, T> {
    /// The current value, which only this writer can replace.
    #[inline]
    pub(crate) fn current(&self) -> &T {
        // SAFETY: the pointer changes only by `publish`, which takes
        // `self`, and the cell's reference keeps it alive until then.
        // Relaxed: the last swap was made under the lock we hold.
        unsafe { &*self.cell.ptr.load(Relaxed) }
    }

    /// Publishes `new`; returns the old value once no reader can still be
    /// taking it without a reference of its own.
    pub(crate) fn swap(self, new: Arc<T>) -> Arc<T> {
        self.publish(new).settle()
    }

    /// Publishes `new` and releases the writers' lock. The old value comes
    /// back through [`Retired::settle`], which pays the readers still
    /// taking it: a walk of every reader's slot that the lock (and a
    /// commit's table locks) need not cover. Settling is independent of
    /// later swaps (each pays only slots holding its own old value, which
    /// its reference keeps alive and so distinct from any other), so the
    /// next writer may publish while this one settles.
    pub(crate) fn publish(self, new: Arc<T>) -> Retired<T> {
        // Relaxed: only writers change the pointer, and we hold their lock.
        let old = self.cell.ptr.load(Relaxed);
        // Release: a reader that loads the new pointer (Acquire) sees the
        // value it points to.
        (self.cell.ptr).store(Arc::into_raw(new).cast_mut(), Release);
        // Release: pairs with `version`'s Acquire; a reader that sees the
        // new count then loads the new pointer or a newer one. The lock
        // orders the writers, so a load and a store make the increment.
        let v = self.cell.version.load(std::sync::atomic::Ordering::Relaxed);
        (self.cell.version).store(v.wrapping_add(1), std::sync::atomic::Ordering::Release);
        Retired {
            old,
            cell: self.cell.id(),
        }
    }
}

/// A value replaced by [`Writer::publish`], with the cell's reference to
/// it, not yet safe to let go: [`Retired::settle`] first pays the readers
/// that may be taking it. Dropping it settles too.
pub(crate) struct Retired<T> {
    /// From `Arc::into_raw`: the cell's reference, now ours; null once
    /// settled.
    old: *const T,
    /// The cell's address (see [`Slot`]).
    cell: usize,
}

// SAFETY: a reference to an `Arc<T>`'s value, settled (and released) by
// whichever thread holds this, as an `Arc<T>` is.
unsafe impl<T: Send + Sync> Send for Retired<T> {}

impl<T> Retired<T> {
    /// Pays every reader slot that holds the old value and returns it.
    pub(crate) fn settle(mut self) -> Arc<T> {
        let old = std::mem::replace(&mut self.old, std::ptr::null());
        // The pointer write (in `publish`) before the slot loads (module
        // docs).
        fence(SeqCst);
        let id = self.cell;
        SLOTS.each(|slot| {
            // Acquire: the cell address written before the pointer.
            if slot.ptr.load(Acquire) == old.cast_mut().cast() && slot.cell.load(Relaxed) == id {
                // SAFETY: `old` is alive: the cell's reference is ours
                // until this returns.
                let payment = unsafe { clone_raw(old) };
                match (slot.ptr).compare_exchange(old.cast_mut().cast(), PAID, AcqRel, Relaxed) {
                    Ok(_) => forget(payment),
                    Err(_) => drop(payment),
                }
            }
        });
        // SAFETY: the cell's reference to `old`, now ours.
        unsafe { Arc::from_raw(old) }
    }
}

impl<T> Drop for Retired<T> {
    fn drop(&mut self) {
        if !self.old.is_null() {
            let r = Retired {
                old: std::mem::replace(&mut self.old, std::ptr::null()),
                cell: self.cell,
            };
            drop(r.settle());
        }
    }
}

/// A table's root as it was last published, remembered by address under
/// the table's lock, so that a write transaction's first write to the
/// table finds it without the commit lock (two locked instructions and the
/// lines the last committer wrote: the lock, the cell, the vector).
///
/// Why the address stays valid while the table's lock is held: the
/// current root vector holds a reference to the table's root, and another
/// table's commit builds its successor vector (taking its own reference)
/// before the old vector can go, so the count stays above zero. Only a
/// publication of *this* table's root can release it, and every one is
/// made under this table's lock, which records the new root here
/// ([`PublishedRoot::set`]). Table handles of a dropped database are
/// refused before any lookup (`Error::ForeignTable`), and a write
/// transaction holds its database, so the vector is alive when this is read.
#[derive(Default)]
pub(crate) struct PublishedRoot(Option<NonNull<dyn Any + Send + Sync>>);

// SAFETY: only an address; it is dereferenced only by the holder of the
// table's lock, while the root it names is alive (see the type's docs),
// and the root itself is `Send + Sync`.
unsafe impl Send for PublishedRoot {}

impl PublishedRoot {
    /// Records `root` as the table's published root.
    ///
    /// # Safety
    ///
    /// The caller holds the table's lock (this is its writer state) and
    /// `root` is, or is about to be made before the lock is released, the
    /// table's root in the database's published vector.
    pub(crate) unsafe fn set(&mut self, root: &std::sync::Arc<dyn Any + Send + Sync>) {
        self.0 = Some(NonNull::from(&**root));
    }

    /// The table's published root, if one was recorded. The lock guard's
    /// borrow bounds the reference: a new root is recorded through
    /// `&mut`, before the old one can be released.
    #[inline]
    pub(crate) fn get(&self) -> Option<&(dyn Any + Send + Sync)> {
        // SAFETY: see the type's docs: the root recorded by the last `set`
        // is the table's published one, kept alive by the current vector
        // for as long as the lock that `&self` is borrowed under is held.
        self.0.map(|p| unsafe { p.as_ref() })
    }
}

/// The contract every root cell keeps (this one and, with its tests,
/// `publish_arc_swap.rs`'s), as tests over the `RootCell` and `Arc` in scope
/// where it is invoked.
#[cfg(all(test, not(loom)))]
macro_rules! root_cell_contract {
    () => {
        /// The next writer may publish (and settle) before the last one
        /// settles; each returns its own old value with exact counts, and one
        /// dropped unsettled settles.
        #[test]
        fn a_publish_before_the_last_settles() {
            let cell = RootCell::new(Arc::new(0u64));
            let held = cell.load_full();
            let first = cell.write().publish(Arc::new(1));
            let second = cell.write().publish(Arc::new(2));
            assert_eq!(*cell.load_full(), 2);
            let one = second.settle();
            assert_eq!(*one, 1);
            assert!(Arc::try_unique(one).is_ok());
            let zero = first.settle();
            assert_eq!(*zero, 0);
            assert_eq!(Arc::count(&zero), 2);
            drop(held);
            assert!(Arc::try_unique(zero).is_ok());
            assert_eq!(cell.version(), 2);
            drop(cell.write().publish(Arc::new(3)));
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
    };
}
#[cfg(all(test, not(loom)))]
pub(crate) use root_cell_contract;

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    root_cell_contract!();

    /// More live reader threads than a chunk has slots, twice over (the
    /// second wave reuses the slots the first gave back), against a writer.
    #[test]
    fn readers_spanning_several_chunks() {
        let cell = std::sync::Arc::new(RootCell::new(Arc::new(0u64)));
        for _wave in 0..2 {
            let start = std::sync::Arc::new(std::sync::Barrier::new(3 * CHUNK + 1));
            let readers: Vec<_> = (0..3 * CHUNK)
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

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::thread;

    /// A model explored up to `n` preemptions per run (every interleaving
    /// of the one-reader model has at most a few; the bound keeps the
    /// models, also run under AddressSanitizer, to seconds).
    fn bounded(n: usize) -> loom::model::Builder {
        let mut b = loom::model::Builder::new();
        b.preemption_bound = Some(n);
        b
    }

    /// A reader racing two swaps whose old values are dropped at once: it
    /// reads one of the three values, and every reference is given back.
    /// A missing payment or a reader that skips its second load lets a
    /// value be freed while the reader takes it (a use after free, which
    /// the AddressSanitizer run of this model reports); a payment kept or
    /// dropped twice leaves a count off by one.
    #[test]
    fn loom_reader_against_swaps() {
        bounded(3).check(|| {
            let cell = std::sync::Arc::new(RootCell::new(Arc::new(0u64)));
            let c = cell.clone();
            let reader = thread::spawn(move || *c.load_full());
            drop(cell.write().swap(Arc::new(1)));
            drop(cell.write().swap(Arc::new(2)));
            assert!(reader.join().unwrap() <= 2);
            assert_eq!(Arc::count(&cell.load_full()), 2);
            assert_eq!(cell.version(), 2);
        });
    }

    /// A writer settles its old value on another thread while the next
    /// writer publishes and settles its own, a reader racing both: what
    /// a commit does now that it settles after its locks.
    #[test]
    fn loom_settles_overlap() {
        bounded(3).check(|| {
            let cell = std::sync::Arc::new(RootCell::new(Arc::new(0u64)));
            let c = cell.clone();
            let reader = thread::spawn(move || *c.load_full());
            let first = cell.write().publish(Arc::new(1));
            let settler = thread::spawn(move || *first.settle());
            drop(cell.write().swap(Arc::new(2)));
            assert_eq!(settler.join().unwrap(), 0);
            assert!(reader.join().unwrap() <= 2);
            assert_eq!(Arc::count(&cell.load_full()), 2);
            assert_eq!(cell.version(), 2);
        });
    }

    /// Two readers (two slots) against one swap, the old value dropped at
    /// once.
    #[test]
    fn loom_two_readers_against_a_swap() {
        bounded(2).check(|| {
            let cell = std::sync::Arc::new(RootCell::new(Arc::new(0u64)));
            let readers: Vec<_> = (0..2)
                .map(|_| {
                    let c = cell.clone();
                    thread::spawn(move || *c.load_full())
                })
                .collect();
            drop(cell.write().swap(Arc::new(1)));
            for r in readers {
                assert!(r.join().unwrap() <= 1);
            }
            assert_eq!(Arc::count(&cell.load_full()), 2);
        });
    }
}
