//! Reclamation of superseded database versions, and the collector thread.
//!
//! What it reclaims: a root vector (one version of every table's root) that
//! a commit superseded, with what only it holds (mostly the path its commit
//! copied). The committer frees it when no reader holds it and keeps the
//! allocation as its thread's spare for its next commit (`SPARE`);
//! otherwise the last reader to let go frees it: on its own thread if that
//! thread published it, else through the publisher's mailbox, emptied at
//! the publisher's next commit or snapshot refresh, or by the collector
//! thread (`gc_loop`), which also drops graveyard entries no change
//! consumer needs.
//!
//! Why it is safe: nothing here frees memory by hand. Versions are
//! reference-counted (`triomphe::Arc`); a vector is emptied in place only
//! through `try_unique`, which succeeds only while no other reference
//! exists, and the swap that superseded it has by then paid every reader
//! that had loaded it (`root.rs`), so no reader can take a new
//! reference. Thread tags and mailboxes choose only which thread drops the
//! last reference, never whether it is the last.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use smallvec::SmallVec;
use triomphe::UniqueArc;

use crate::db::{DbInner, Roots, SharedRoots, TableOps};

static NEXT_THREAD_TAG: AtomicU64 = AtomicU64::new(1);

thread_local! {
    static THREAD_TAG: Cell<u64> = const { Cell::new(0) };
}

/// A number for the calling thread, unique in the process (0 is never
/// one): one thread-local load where `std::thread::current()` would clone
/// an `Arc`.
pub(crate) fn thread_tag() -> u64 {
    THREAD_TAG.with(|t| match t.get() {
        0 => {
            let tag = NEXT_THREAD_TAG.fetch_add(1, Ordering::Relaxed);
            t.set(tag);
            tag
        }
        tag => tag,
    })
}

/// Retired roots in one mailbox past which a reader frees what it retires
/// itself (the background thread is behind).
const RETIRE_MAX: usize = 4096;
/// Retired roots in one mailbox at which the background thread is woken
/// (its owner does not empty it: it stopped writing and reading, or left).
const RETIRE_WAKE: usize = 64;
thread_local! {
    /// The allocation of the last root vector this thread superseded or let
    /// go of while no reader held it, emptied, for its next commit to build
    /// a vector in (any database's: the allocation is all that is kept). A
    /// write transaction then allocates and frees one thing less, and lets
    /// go of the old vector with a load instead of two locked decrements.
    /// Per thread rather than under the commit lock: the reuse then needs
    /// no lock, and the old contents are dropped in place after the locks.
    static SPARE: Cell<Option<UniqueArc<Roots>>> = const { Cell::new(None) };
}

/// A root vector to publish, filled in this thread's spare allocation if
/// it has one.
pub(crate) fn new_roots(fill: impl FnOnce(&mut Roots)) -> SharedRoots {
    // `try_with`: from a thread-local destructor the spare may be gone.
    let mut u = (SPARE.try_with(Cell::take).ok().flatten())
        .unwrap_or_else(|| UniqueArc::new(Roots::default()));
    fill(&mut u);
    u.shareable()
}

/// Lets go of a superseded root vector: when no reader holds it, its
/// contents are dropped here and the allocation kept as this thread's
/// spare; else the last reader frees it.
pub(crate) fn recycle(old: SharedRoots) {
    // `try_unique` loads the count with Acquire: the readers' releases
    // (Release decrements) happen before the contents are dropped. The
    // swap that superseded it paid the readers' slots that held it
    // (`root.rs`), so no reader can still be between its load and its
    // increment.
    if let Ok(mut u) = triomphe::Arc::try_unique(old) {
        *u = Roots::default();
        // Dropped with the closure if the spare is gone (see `new_roots`).
        let _ = SPARE.try_with(move |s| s.set(Some(u)));
    }
}

/// Mailboxes per database; threads whose tags share a remainder share one.
pub(crate) const MAILBOXES: usize = 8;

/// Snapshots waiting to be freed by the thread that published them.
#[derive(Default)]
pub(crate) struct Mailbox {
    /// Set (under the lock) when something is pushed, cleared when the
    /// box is emptied: its owner looks at this alone while it is empty.
    full: AtomicBool,
    list: Mutex<Vec<SharedRoots>>,
}

impl Mailbox {
    /// Empties the box (keeping its buffer, which another thread would
    /// otherwise allocate again at its next push); the caller drops what
    /// it held, outside the lock.
    fn take(&self) -> SmallVec<[SharedRoots; 8]> {
        let mut l = self.list.lock();
        self.full.store(false, Ordering::Relaxed);
        l.drain(..).collect()
    }
}

impl DbInner {
    /// Lets go of a snapshot on a reader's behalf: if others still hold
    /// it the last one frees it; if this was the last reference and this
    /// thread published it, it is freed here (where most of what only it
    /// holds was allocated: its commit's copied path); else it goes to the
    /// mailbox of the thread that published it, which frees it at its next
    /// commit or snapshot refresh (freed here when the options want no
    /// collector thread to fall back on, or the box is full). The first
    /// push starts the collector (`start_collector`).
    pub(crate) fn retire(&self, old: SharedRoots) {
        if SharedRoots::strong_count(&old) > 1 {
            return;
        }
        if self.gc_every.is_none() {
            recycle(old);
            return;
        }
        if old.by == thread_tag() {
            recycle(old);
            self.free_own();
            return;
        }
        let mb = &self.mailboxes[old.by as usize % MAILBOXES];
        let wake = {
            let mut l = mb.list.lock();
            if l.len() >= RETIRE_MAX {
                drop(l);
                drop(old);
                return;
            }
            l.push(old);
            mb.full.store(true, Ordering::Relaxed);
            l.len() == RETIRE_WAKE
        };
        self.start_collector();
        if wake {
            if let Some(t) = self.gc_thread.lock().clone() {
                t.unpark();
            }
        }
    }

    /// Starts the collector thread if the options want one and it is not
    /// running yet: a database that never has anything to collect (no
    /// deletes under a change stream, no snapshot handed between threads)
    /// starts no thread, and a single-threaded program stays one (glibc's
    /// allocator then skips its atomic paths).
    #[inline]
    pub(crate) fn start_collector(&self) {
        // Relaxed: a stale `false` only leads to the check under the lock.
        if self.collector_started.load(Ordering::Relaxed) {
            return;
        }
        self.spawn_collector();
    }

    #[cold]
    fn spawn_collector(&self) {
        let Some(every) = self.gc_every else { return };
        let mut slot = self.gc_thread.lock();
        if slot.is_some() || self.closing.load(Ordering::SeqCst) {
            return;
        }
        let weak = self.me.clone();
        if let Ok(h) = std::thread::Builder::new()
            .name("statedb-gc".into())
            .spawn(move || gc_loop(weak, every))
        {
            *slot = Some(h.thread().clone());
        }
        // Also when the spawn failed: not tried again; the mailboxes are
        // then emptied by their owners, or inline once full.
        self.collector_started.store(true, Ordering::Relaxed);
    }

    /// Frees what other threads left in this thread's mailbox.
    #[inline]
    pub(crate) fn free_own(&self) {
        let mb = &self.mailboxes[thread_tag() as usize % MAILBOXES];
        // Relaxed: a push this misses is freed next time, or by the
        // background thread; the lock orders the list itself.
        if mb.full.load(Ordering::Relaxed) {
            drop(mb.take());
        }
    }

    /// Frees what waits in every mailbox (the collector's round, and
    /// `Db::collect_garbage`).
    pub(crate) fn free_mailboxes(&self) {
        for mb in self.mailboxes.iter() {
            drop(mb.take());
        }
    }

    /// One collection round over every table's graveyard (see
    /// [`TableOps::collect`]); returns how many entries were dropped.
    pub(crate) fn collect_garbage(&self) -> usize {
        let tables: Vec<Arc<dyn TableOps>> = self.tables.read().clone();
        tables.iter().map(|t| t.collect(self)).sum()
    }
}

/// The collector thread: every `every`, or when woken, empties every
/// mailbox and collects graveyards, until the database is dropped.
fn gc_loop(weak: Weak<DbInner>, every: Duration) {
    loop {
        std::thread::park_timeout(every);
        let Some(db) = weak.upgrade() else { return };
        if db.closing.load(Ordering::SeqCst) {
            return;
        }
        db.free_mailboxes();
        db.collect_garbage();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::AnyRoot;

    fn root(v: usize) -> AnyRoot {
        Arc::new(v)
    }

    fn value(r: &Roots, id: usize) -> Option<usize> {
        r.get(id).and_then(|a| a.downcast_ref::<usize>()).copied()
    }

    /// A thread builds its next vector in the allocation of one it let go
    /// of only if no reader held that one, and the old contents are
    /// dropped when it is taken back.
    #[test]
    fn a_thread_reuses_only_a_vector_no_reader_holds() {
        drop(SPARE.with(Cell::take));
        let one = root(1);
        let first = new_roots(|r| r.push(one.clone()));
        let addr = |r: &SharedRoots| &**r as *const Roots;
        let at = addr(&first);
        let reader = first.clone();
        recycle(first);
        let spare_is_empty = || {
            let s = SPARE.with(Cell::take);
            let empty = s.is_none();
            SPARE.with(|c| c.set(s));
            empty
        };
        assert!(spare_is_empty(), "taken back under a reader");
        assert_eq!(value(&reader, 0), Some(1));
        recycle(reader);
        assert!(!spare_is_empty());
        assert_eq!(Arc::strong_count(&one), 1, "the old contents were dropped");
        let second = new_roots(|r| r.push(root(2)));
        assert_eq!(addr(&second), at);
        assert_eq!((value(&second, 0), second.len()), (Some(2), 1));
        assert!(spare_is_empty());
    }
}
