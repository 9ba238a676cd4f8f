//! The transaction's finger: where its last write ended, so that the next
//! write to a nearby key starts there instead of at the root.
//!
//! Batches usually write keys in order (a bulk load, statedb's rows and
//! revisions), so consecutive writes share every node above the leaves' parent.
//! Walking those levels again costs each write a segment compare, a
//! copy-on-write test and a child search per level. The finger remembers the
//! *slot* (the word in the parent node) of the inner node that took the last
//! write's leaf, and the key bytes that lead to it.
//!
//! Validity: the finger is set as the last step of a write, after every
//! change that write made, and taken (cleared) as the first step of the next
//! one. Between the two nothing can change the tree: every other `&mut`
//! method of `Txn` clears it first, and `Txn::scan_owned`, the one `&self`
//! method that shares the transaction's nodes, marks it stale. While it is
//! set, every node from the root down to the slot's node is private to the
//! transaction (a write makes the nodes it passes private), so none of them
//! is copied again: the slot stays in the same allocation at the same place,
//! and the walk from the root for any key with the same leading bytes would
//! arrive at that slot with the same depth.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::node::Child;

/// Longest `key[..=depth]` a finger keeps.
const PREFIX_MAX: usize = 64;

pub(crate) struct Finger<V> {
    /// Allocated by the third write of a transaction: a transaction of one
    /// or two writes (most single-row statedb commits) never needs one, and
    /// keeping it out of line keeps `Txn` small enough to move with a few
    /// vector moves (statedb moves its per-table transactions around).
    place: Option<Box<Place<V>>>,
    /// Writes that ended before `place` existed (up to 2).
    writes: u8,
}

struct Place<V> {
    /// The slot of the inner node the last write ended in (never the root).
    slot: Option<NonNull<Child<V>>>,
    /// Key bytes above the slot's node (below `PREFIX_MAX`).
    depth: usize,
    /// `key[..=depth]`: the bytes above the node and the byte its parent
    /// indexes it by. Deeper nodes are not remembered.
    prefix: [u8; PREFIX_MAX],
    /// The slot the current write started from, if it took the finger:
    /// its `depth` and `prefix` are still those of the walk to it, so a
    /// write that ends in the same slot at the same depth leaves them be.
    /// Cleared by every `take`, `set` and `clear`, so it never outlives the
    /// write that took it.
    taken: Option<NonNull<Child<V>>>,
    /// Set by `scan_owned`: an owning iterator shares the nodes, so the next
    /// write copies them and the slot may no longer be in the tree. Only
    /// `&mut` methods read it, so ordering comes from whatever handed them
    /// the `&mut Txn`: `Relaxed`.
    stale: AtomicBool,
}

// SAFETY: the pointer refers to memory owned by the same `Txn` (a slot in
// one of its private nodes), written only through `&mut Txn` and read
// through `&Txn`, so sending or sharing the finger is sending or sharing
// that `Txn`'s nodes.
unsafe impl<V> Send for Finger<V> where Child<V>: Send {}
// SAFETY: as above: `&Finger` only reads through the slot (`peek`), which
// is sound from any thread when `Child<V>` is `Sync`.
unsafe impl<V> Sync for Finger<V> where Child<V>: Sync {}

impl<V> Finger<V> {
    pub(crate) fn new() -> Self {
        Finger {
            place: None,
            writes: 0,
        }
    }

    /// Forgets the slot.
    #[inline]
    pub(crate) fn clear(&mut self) {
        if let Some(p) = &mut self.place {
            p.slot = None;
            p.taken = None;
        }
    }

    /// Marks the finger stale through a shared reference.
    pub(crate) fn invalidate(&self) {
        if let Some(p) = &self.place {
            p.stale.store(true, Ordering::Relaxed);
        }
    }

    /// Remembers `slot`, reached at `depth` on the walk for `key`. Call it
    /// after the write's last change through the tree.
    #[inline(always)]
    pub(crate) fn set(&mut self, slot: NonNull<Child<V>>, key: &[u8], depth: usize) {
        let n = depth + 1;
        if n > key.len() || n > PREFIX_MAX {
            if let Some(p) = &mut self.place {
                p.taken = None;
            }
            return;
        }
        let p = match &mut self.place {
            Some(p) => p,
            None if self.writes < 2 => {
                self.writes += 1;
                return;
            }
            None => self.place.insert(Place::boxed()),
        };
        if p.taken.take() == Some(slot) && p.depth == depth {
            // The slot this write started from: same walk, same bytes.
            p.slot = Some(slot);
            return;
        }
        if n <= 16 {
            // Word moves, not a `memcpy` call, for the usual short prefix.
            p.prefix[..16].copy_from_slice(&crate::bytes::pad16(&key[..n]));
        } else {
            p.prefix[..n].copy_from_slice(&key[..n]);
        }
        p.depth = depth;
        p.slot = Some(slot);
    }

    /// Takes the finger if `key` runs through its slot: the slot, borrowed
    /// for as long as the transaction's `&mut`, and the depth of its node.
    ///
    /// # Safety
    ///
    /// `'a` must not outlive the exclusive borrow of the transaction that
    /// owns this finger, and the finger must have been set by a write of
    /// that transaction and kept by the rules in the module docs.
    #[inline(always)]
    pub(crate) unsafe fn take<'a>(&mut self, key: &[u8]) -> Option<(&'a mut Child<V>, usize)> {
        let p = self.place.as_deref_mut()?;
        p.taken = None;
        let slot = p.slot.take()?;
        if p.stale.load(Ordering::Relaxed) {
            p.stale.store(false, Ordering::Relaxed);
            return None;
        }
        if !p.leads_to(key) {
            return None;
        }
        p.taken = Some(slot);
        // SAFETY: by the validity rule in the module docs the slot is a live
        // word inside a node that this transaction alone owns, and nothing
        // else refers to it: the caller holds the transaction exclusively
        // for `'a`.
        Some((unsafe { &mut *slot.as_ptr() }, p.depth))
    }

    /// The node in the finger's slot, for a lookup of `key` that runs
    /// through it, and the depth of its segment. Reading needs no `&mut`:
    /// even a stale finger (an owning iterator shares the nodes) points into
    /// the transaction's current tree until its next write.
    ///
    /// # Safety
    ///
    /// `'a` must not outlive the shared borrow of the transaction that owns
    /// this finger.
    #[inline(always)]
    pub(crate) unsafe fn peek<'a>(&self, key: &[u8]) -> Option<(&'a Child<V>, usize)> {
        let p = self.place.as_deref()?;
        let slot = p.slot?;
        if !p.leads_to(key) {
            return None;
        }
        // SAFETY: by the validity rule in the module docs the slot is a live
        // word in the transaction's tree; the caller's shared borrow of the
        // transaction excludes every write until `'a` ends.
        Some((unsafe { &*slot.as_ptr() }, p.depth))
    }
}

impl<V> Place<V> {
    /// Whether the walk for `key` passes through the slot: `key` starts
    /// with the remembered `key[..=depth]`. The last of those bytes, the one
    /// that picks the slot's node in its parent, is tested first: writes
    /// that miss the finger (random keys) mostly differ there.
    #[inline(always)]
    fn leads_to(&self, key: &[u8]) -> bool {
        let n = self.depth + 1;
        key.len() >= n
            && key[n - 1] == self.prefix[n - 1]
            && crate::bytes::eq(&key[..n - 1], &self.prefix[..n - 1])
    }

    #[cold]
    fn boxed() -> Box<Self> {
        Box::new(Place {
            slot: None,
            taken: None,
            depth: 0,
            prefix: [0; PREFIX_MAX],
            stale: AtomicBool::new(false),
        })
    }
}

/// A raw pointer to `slot` that a finger may keep, and the borrow to go on
/// with, made from that pointer: the `&mut` it came from is consumed, so no
/// use of it can invalidate the pointer.
#[inline(always)]
pub(crate) fn pin<V>(slot: &mut Child<V>) -> (NonNull<Child<V>>, &mut Child<V>) {
    let p = NonNull::from(slot);
    // SAFETY: `p` comes from a unique borrow that this call consumes, so the
    // returned borrow (same lifetime) is the only way to reach the slot.
    (p, unsafe { &mut *p.as_ptr() })
}
