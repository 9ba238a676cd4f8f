//! The lazily allocated watch slot every node carries.
//!
//! A slot is one pointer-sized atomic with three states:
//!
//! * `EMPTY` (null): nobody has watched this node; no allocation exists.
//! * `CLOSED` (a dangling, well-aligned address no allocation can have): the node was superseded
//!   before anyone watched it. A later watcher gets an already-closed watch,
//!   again without allocating.
//! * live: a pointer from `Arc::into_raw` to a [`WatchInner`]. The slot owns
//!   that strong reference until the node is dropped (or `take`n through
//!   `&mut`), so a reader holding `&self` may always bump its count.
//!
//! Readers (`watch`) install a live watch with a CAS from `EMPTY`; the writer
//! (`close`, after the new tree is visible) CASes `EMPTY -> CLOSED` or, when a
//! live watch is there, closes it in place. Both sides go through a
//! read-modify-write of the same word, so either the reader's CAS precedes
//! the writer's (the writer sees and closes the live watch) or follows it
//! (the reader sees `CLOSED` or a closed watch): a watch asked for during a
//! commit is never lost.
//!
//! A slot also hands over: when a write moves a node without changing what
//! is under it (a leaf pushed down, an inner node whose segment is split
//! above it or joined to its parent's), the copy's slot gets a watch that
//! fires the old one's (`successor`, `close_superseded`). And a watch
//! carries a list the notifier fires, moves or hands on (missing keys,
//! empty and held prefixes: `watch.rs`). design.md, "What
//! fires", has the rules.

use crate::sync::{AtomicPtr, Ordering};
use crate::watch::{Home, Watch, WatchInner};
use std::sync::Arc;

const CLOSED: *mut WatchInner = std::ptr::dangling_mut();

pub(crate) struct LazyWatch {
    ptr: AtomicPtr<WatchInner>,
}

impl LazyWatch {
    #[inline]
    pub(crate) fn new() -> Self {
        LazyWatch {
            ptr: AtomicPtr::new(std::ptr::null_mut()),
        }
    }

    /// The node's watch, allocated on first use.
    pub(crate) fn watch(&self) -> Watch {
        self.inner().map_or_else(Watch::closed, Watch::from_inner)
    }

    /// The live watch, installed on first use; `None` once closed.
    pub(crate) fn inner(&self) -> Option<Arc<WatchInner>> {
        // Acquire pairs with the Release of the CAS that published the
        // pointer, so the pointee's initialisation is visible.
        let p = self.ptr.load(Ordering::Acquire);
        if p == CLOSED {
            return None;
        }
        if !p.is_null() {
            return Some(clone_raw(p));
        }
        let fresh = Arc::new(WatchInner::new());
        let raw = Arc::into_raw(fresh.clone()) as *mut WatchInner;
        // AcqRel: Release publishes `fresh`; Acquire on failure sees the
        // winner's pointee.
        match self.ptr.compare_exchange(
            std::ptr::null_mut(),
            raw,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => Some(fresh),
            Err(actual) => {
                // SAFETY: `raw` came from `Arc::into_raw` just above and was
                // never published, so this is its only owner.
                drop(unsafe { Arc::from_raw(raw) });
                (actual != CLOSED).then(|| clone_raw(actual))
            }
        }
    }

    /// The slot for a copy of this node that keeps its contents (an insert
    /// pushes a leaf down, or splits the segment above an inner node; a
    /// delete merges an inner node's parent into it): when the node is
    /// watched, a watch that also fires the node's, so its readers still
    /// hear of the next change. Returns the slot and the address of the
    /// watch it chains (0 when none), for [`close_superseded`].
    ///
    /// [`close_superseded`]: LazyWatch::close_superseded
    pub(crate) fn successor(&self) -> (LazyWatch, usize) {
        // Acquire: we read the pointee (its `earlier` list).
        let p = self.ptr.load(Ordering::Acquire);
        if p.is_null() || p == CLOSED {
            return (LazyWatch::new(), 0);
        }
        let prev = clone_raw(p);
        let next = Arc::into_raw(Arc::new(WatchInner::successor(&prev)));
        let slot = LazyWatch {
            ptr: AtomicPtr::new(next as *mut WatchInner),
        };
        (slot, p as usize)
    }

    /// Closes a node that [`successor`] copied into `copy`, after the copy
    /// is visible. If its slot still holds the watch the copy chains
    /// (`chained`), that watch stays open (it fires with the copy's) and
    /// only its list is closed ([`WatchInner::hand_on`], with `cut`). A
    /// watch a reader installed after the copy was made is handed to `copy`
    /// the same way, if `copy` has no watch yet; else it closes, as does an
    /// unwatched slot ([`close`]).
    ///
    /// [`successor`]: LazyWatch::successor
    /// [`close`]: LazyWatch::close
    pub(crate) fn close_superseded(
        &self,
        chained: usize,
        copy: &LazyWatch,
        cut: usize,
        home: Home<'_>,
    ) {
        // Acquire: we may dereference the pointer. A live pointer never
        // changes while `&self` exists, so a slot that matched `chained`
        // still does.
        let p = self.ptr.load(Ordering::Acquire);
        if p.is_null() || p == CLOSED {
            self.close_with(home);
            return;
        }
        // SAFETY: a live pointer stays owned by this slot while `&self`
        // exists (only `take`/`drop` through `&mut` release it).
        let w = unsafe { &*p };
        if p as usize == chained || copy.adopt(p) {
            w.hand_on(cut, copy, home);
        } else {
            w.close_with(home);
        }
    }

    /// Closes the root a split pushed under a new root (its copy `copy`
    /// there, or what that merged into): its watch fires (`root_watch`
    /// promises it for every commit), but held prefixes longer than `cut`,
    /// which the new key is not under, move to `copy` (see
    /// [`WatchInner::hand_on`]).
    pub(crate) fn close_split_root(&self, copy: &LazyWatch, cut: usize, home: Home<'_>) {
        // Acquire: we may dereference the pointer.
        let p = self.ptr.load(Ordering::Acquire);
        if !p.is_null() && p != CLOSED {
            // SAFETY: a live pointer stays owned by this slot while `&self`
            // exists (only `take`/`drop` through `&mut` release it).
            unsafe { &*p }.hand_on(cut, copy, home);
        }
        self.close_with(home);
    }

    /// Installs, in a slot nobody watched yet, a watch that also fires the
    /// live watch `prev` (see [`close_superseded`]); false if the slot has
    /// a watch or is closed.
    ///
    /// [`close_superseded`]: LazyWatch::close_superseded
    fn adopt(&self, prev: *mut WatchInner) -> bool {
        if !self.ptr.load(Ordering::Acquire).is_null() {
            return false;
        }
        let next = Arc::into_raw(Arc::new(WatchInner::successor(&clone_raw(prev))));
        // Release publishes the new watch, as a reader's install does
        // (AcqRel: the success ordering of a read-modify-write); on failure
        // nothing is read through the pointer found, so Relaxed.
        match self.ptr.compare_exchange(
            std::ptr::null_mut(),
            next as *mut WatchInner,
            Ordering::AcqRel,
            Ordering::Relaxed,
        ) {
            Ok(_) => true,
            Err(_) => {
                // SAFETY: `next` came from `Arc::into_raw` just above and
                // was never published.
                drop(unsafe { Arc::from_raw(next) });
                false
            }
        }
    }

    /// Marks the node superseded: fires its watch, or makes any later one
    /// start closed.
    #[cfg(test)]
    pub(crate) fn close(&self) {
        self.close_with(None);
    }

    /// [`close`], handing missing-key watches to `home` (see
    /// [`WatchInner::close_with`]).
    ///
    /// [`close`]: LazyWatch::close
    pub(crate) fn close_with(&self, home: Home<'_>) {
        // AcqRel: on failure we dereference a pointer another thread
        // published (Acquire); on success later readers must see CLOSED.
        match self.ptr.compare_exchange(
            std::ptr::null_mut(),
            CLOSED,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => {}
            Err(p) if p == CLOSED => {}
            Err(p) => {
                // SAFETY: a live pointer stays owned by this slot while `&self`
                // exists (only `take`/`drop` through `&mut` release it).
                unsafe { &*p }.close_with(home);
            }
        }
    }

    /// Whether a live watch is here (a hint: a reader may install one
    /// right after).
    #[inline]
    pub(crate) fn is_watched(&self) -> bool {
        // Relaxed: a hint, and nothing is read through the pointer.
        let p = self.ptr.load(Ordering::Relaxed);
        !p.is_null() && p != CLOSED
    }

    /// Whether nothing was ever allocated here.
    #[cfg(all(test, not(loom)))]
    pub(crate) fn is_empty(&self) -> bool {
        self.ptr.load(Ordering::Acquire).is_null()
    }

    /// Whether the slot is empty (never watched, or emptied by [`take`]):
    /// a node changed in place then has no watch to hand on. Read through
    /// `&mut`, so no reader can be installing one.
    ///
    /// [`take`]: LazyWatch::take
    #[inline]
    pub(crate) fn is_unset(&mut self) -> bool {
        #[cfg(not(loom))]
        let p = *self.ptr.get_mut();
        #[cfg(loom)]
        let p = self.ptr.load(Ordering::Acquire);
        p.is_null()
    }

    /// Takes the live watch out of a node being mutated in place, leaving the
    /// slot empty for the node's new contents.
    pub(crate) fn take(&mut self) -> Option<Arc<WatchInner>> {
        #[cfg(not(loom))]
        let p = std::mem::replace(self.ptr.get_mut(), std::ptr::null_mut());
        #[cfg(loom)]
        let p = self.ptr.swap(std::ptr::null_mut(), Ordering::Acquire);
        if p.is_null() || p == CLOSED {
            None
        } else {
            // SAFETY: the slot owned this strong reference, and `&mut self`
            // means no reader can be cloning it.
            Some(unsafe { Arc::from_raw(p) })
        }
    }
}

/// A new strong reference to a live pointer held by some slot.
fn clone_raw(p: *mut WatchInner) -> Arc<WatchInner> {
    // SAFETY: `p` is a live pointer owned by a slot we hold `&` to; the slot
    // keeps its reference until `&mut` access, so the count is at least one
    // for the whole call.
    unsafe {
        Arc::increment_strong_count(p);
        Arc::from_raw(p)
    }
}

impl Drop for LazyWatch {
    fn drop(&mut self) {
        drop(self.take());
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::watch::GapKind;

    #[test]
    fn unwatched_slot_allocates_nothing_and_closes_to_sentinel() {
        let s = LazyWatch::new();
        assert!(s.is_empty());
        s.close();
        assert!(!s.is_empty());
        assert!(s.watch().is_closed());
    }

    #[test]
    fn live_watch_fires_on_close_and_is_shared() {
        let s = LazyWatch::new();
        let a = s.watch();
        let b = s.watch();
        assert!(!a.is_closed() && !b.is_closed());
        s.close();
        assert!(a.is_closed() && b.is_closed());
        assert!(s.watch().is_closed());
    }

    /// A held prefix watch (see `GapKind::Held`) kept by the node in `s`.
    fn held(s: &LazyWatch, prefix: &[u8]) -> Watch {
        s.inner()
            .map_or_else(Watch::closed, |w| w.gap_watch(prefix, GapKind::Held))
    }

    #[test]
    fn a_pushed_down_leaf_hands_on_its_point_watch_and_its_longer_prefixes() {
        let s = LazyWatch::new();
        let point = s.watch();
        let (short, long) = (held(&s, b"a"), held(&s, b"abc"));
        let (next, chained) = s.successor();
        assert_ne!(chained, 0);
        // The new key shares two bytes with the leaf's: it is under "a",
        // not under "abc".
        s.close_superseded(chained, &next, 2, None);
        assert!(short.is_closed() && !long.is_closed() && !point.is_closed());
        assert!(held(&s, b"abc").is_closed(), "the old leaf's list is done");
        let later = s.watch();
        let fresh = held(&next, b"ab");
        assert!(!later.is_closed() && !fresh.is_closed());
        // A second push, sharing one byte: the chain reaches back to the
        // first leaf's watch, and both held prefixes move on.
        let (third, chained) = next.successor();
        next.close_superseded(chained, &third, 1, None);
        assert!(!fresh.is_closed() && !long.is_closed() && !point.is_closed());
        third.close();
        assert!(point.is_closed() && later.is_closed());
        assert!(fresh.is_closed() && long.is_closed());
    }

    /// A reader of the old snapshot installs a point watch between the
    /// copy and the commit: the copy adopts it, so the key's next change
    /// fires it, and nothing else does.
    #[test]
    fn a_point_watch_installed_after_the_copy_carries_on() {
        let s = LazyWatch::new();
        let (next, chained) = s.successor();
        let point = s.watch();
        let prefix = held(&s, b"ab");
        s.close_superseded(chained, &next, 0, None);
        assert!(!prefix.is_closed() && !point.is_closed());
        next.close();
        assert!(point.is_closed() && prefix.is_closed());
        // A copy already watched cannot adopt: the late watch closes.
        let s = LazyWatch::new();
        let (next, chained) = s.successor();
        let late = s.watch();
        let _new_reader = next.watch();
        s.close_superseded(chained, &next, 0, None);
        assert!(late.is_closed());
    }

    #[test]
    fn an_unwatched_node_moved_closes_whole() {
        let s = LazyWatch::new();
        let (next, chained) = s.successor();
        assert_eq!(chained, 0);
        assert!(next.is_empty());
        s.close_superseded(chained, &next, 0, None);
        assert!(s.watch().is_closed() && held(&s, b"a").is_closed());
        assert!(next.is_empty());
    }

    #[test]
    fn take_resets_slot() {
        let mut s = LazyWatch::new();
        let a = s.watch();
        let inner = s.take().expect("live");
        assert!(s.is_empty());
        inner.close();
        assert!(a.is_closed());
        assert!(!s.watch().is_closed());
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use crate::watch::{Gap, GapKind};

    /// A reader asking for a watch races the writer closing the slot: the
    /// reader's watch must end up closed in every interleaving.
    #[test]
    fn watch_racing_close_is_never_lost() {
        loom::model(|| {
            let slot = std::sync::Arc::new(LazyWatch::new());
            let s2 = slot.clone();
            let reader = loom::thread::spawn(move || s2.watch());
            slot.close();
            let w = reader.join().unwrap();
            assert!(w.is_closed());
        });
    }

    /// A reader of the old snapshot asks for a leaf's held prefix watch
    /// while an insert pushes the leaf down (copy, publish, close): with
    /// the new key under the prefix (`cut` 2) the watch ends up closed;
    /// with it outside (`cut` 0) the watch is closed or handed to the copy,
    /// and closed once the copy's fires. A point watch taken beforehand
    /// stays live until the copy's fires.
    #[test]
    fn prefix_watch_racing_a_push_down_is_never_lost() {
        for (watched, cut) in [(false, 2), (true, 2), (false, 0), (true, 0)] {
            loom::model(move || {
                let slot = std::sync::Arc::new(LazyWatch::new());
                let point = watched.then(|| slot.watch());
                let s2 = slot.clone();
                let reader = loom::thread::spawn(move || {
                    s2.inner()
                        .map_or_else(Watch::closed, |w| w.gap_watch(b"ab", GapKind::Held))
                });
                let (next, chained) = slot.successor();
                slot.close_superseded(chained, &next, cut, None);
                let w = reader.join().unwrap();
                if cut >= 2 {
                    assert!(w.is_closed());
                }
                if let Some(p) = &point {
                    assert!(!p.is_closed());
                }
                next.close();
                assert!(w.is_closed());
                assert!(point.is_none_or(|p| p.is_closed()));
            });
        }
    }

    /// A reader of the old snapshot asks for a held prefix watch on a root
    /// while the commit of a split closes it: the root's own watch fires;
    /// the reader's is closed (the new key under its prefix, `cut` 2) or,
    /// for a prefix the key is not under (`cut` 0), closed or moved to the
    /// copy, and closed once the copy's fires.
    #[test]
    fn held_watch_racing_a_root_split_is_never_lost() {
        for cut in [0, 2] {
            loom::model(move || {
                let slot = std::sync::Arc::new(LazyWatch::new());
                let root = slot.watch();
                let s2 = slot.clone();
                let reader = loom::thread::spawn(move || {
                    s2.inner()
                        .map_or_else(Watch::closed, |w| w.gap_watch(b"ab", GapKind::Held))
                });
                let copy = LazyWatch::new();
                slot.close_split_root(&copy, cut, None);
                let w = reader.join().unwrap();
                assert!(root.is_closed());
                if cut >= 2 {
                    assert!(w.is_closed());
                }
                copy.close();
                assert!(w.is_closed());
            });
        }
    }

    /// A reader installs a point watch on an unwatched leaf while an insert
    /// pushes it down: the watch is either closed at once or chained to the
    /// copy's, so it fires by the time the copy's does.
    #[test]
    fn point_watch_racing_a_push_down_is_never_lost() {
        loom::model(|| {
            let slot = std::sync::Arc::new(LazyWatch::new());
            let s2 = slot.clone();
            let reader = loom::thread::spawn(move || s2.watch());
            let (next, chained) = slot.successor();
            slot.close_superseded(chained, &next, 0, None);
            let w = reader.join().unwrap();
            next.close();
            assert!(w.is_closed());
        });
    }

    /// A point watch installed on the old leaf after the copy was made is
    /// handed to the copy while a reader of the new tree installs one on
    /// the copy: whichever wins, the reader's watch stays live and both
    /// fire once the copy's watch does.
    #[test]
    fn adopting_races_a_reader_of_the_copy() {
        loom::model(|| {
            let slot = LazyWatch::new();
            let (next, chained) = slot.successor();
            let late = slot.watch();
            let next = std::sync::Arc::new(next);
            let n2 = next.clone();
            let reader = loom::thread::spawn(move || n2.watch());
            slot.close_superseded(chained, &next, 0, None);
            let fresh = reader.join().unwrap();
            assert!(!fresh.is_closed());
            next.close();
            assert!(late.is_closed() && fresh.is_closed());
        });
    }

    /// A reader asks for a missing-key watch on a node while the commit
    /// that superseded the node closes it, moving its missing-key watches
    /// to the new tree: the reader's watch is closed at once, or moved
    /// (and still open, for the new tree's node to fire).
    #[test]
    fn gap_watch_racing_a_commit_is_moved_or_closed() {
        loom::model(|| {
            let slot = std::sync::Arc::new(LazyWatch::new());
            let s2 = slot.clone();
            let reader = loom::thread::spawn(move || {
                s2.inner()
                    .map_or_else(Watch::closed, |w| w.gap_watch(b"k", GapKind::Missing))
            });
            let moved = std::sync::Mutex::new(Vec::new());
            let home = |g: Gap, w: Arc<WatchInner>| moved.lock().unwrap().push((g.key, w));
            slot.close_with(Some(&home));
            let w = reader.join().unwrap();
            let moved = moved.into_inner().unwrap();
            assert!(moved.len() <= 1 && moved.iter().all(|(k, _)| &**k == b"k"));
            assert_eq!(w.is_closed(), moved.is_empty());
            for (_, m) in moved {
                m.close();
            }
            assert!(w.is_closed());
        });
    }

    /// Two readers racing to install: both get the same (single) allocation,
    /// and a close afterwards fires both.
    #[test]
    fn racing_installs_share_one_watch() {
        loom::model(|| {
            let slot = std::sync::Arc::new(LazyWatch::new());
            let s2 = slot.clone();
            let t = loom::thread::spawn(move || s2.watch());
            let a = slot.watch();
            let b = t.join().unwrap();
            assert!(!a.is_closed() && !b.is_closed());
            slot.close();
            assert!(a.is_closed() && b.is_closed());
        });
    }
}
