//! A delta node256's patches, which may be *lent* by the version a copy was
//! made from instead of each taking a reference.
//!
//! A write below a shared delta ([`D256`]) copies it. Cloning its patch
//! array takes one reference per patch, on children that sit on cache lines
//! of their own, and freeing the superseded delta gives each back: on random
//! single-row writes to a 100k-object statedb table these were the largest
//! single source of cache misses. A lending copy instead starts as a bitwise
//! copy of the array, holds one reference on a delta that owns the copied
//! patches (the *lender*), and marks the copied slots. A lent patch that is
//! replaced or removed is forgotten; one reached for writing, or moved into
//! another node, first takes a reference of its own (as in `slots.rs`).
//!
//! Invariants (checked by `check`):
//! * bit `i` of `lent` is set only for a non-empty patch, and `lender` is
//!   `Some` exactly when some bit is set;
//! * a lent patch holds the same pointer as the lender's patch for the same
//!   byte, and the lender owns that patch (lenders never borrow), so a delta
//!   keeps at most one older version of itself alive;
//! * a lent copy is never dropped and never handed out as `&mut`: its
//!   reference count does not count it.
//!
//! Lenders never chain, so a copy of a delta that itself borrows borrows
//! from the same lender and takes a reference on each patch the delta owns.
//! Those grow by one per generation of copies; past [`OWNED_MAX`] the copy
//! takes a reference on every patch instead and becomes the next lender.
//!
//! The lender stays immutable while lent from: it is only reachable through
//! counted references, one of them ours, so `get_mut` fails for every other
//! holder, and nothing takes `&mut` through a `lender` field.

use std::mem::{forget, ManuallyDrop};

use crate::child::NodeRc;
use crate::node::{drop_children, Child, D256, D256_MAX};
use crate::simd;

/// Patches a copy may own while still borrowing the rest from its lender
/// (see the module docs).
const OWNED_MAX: u32 = 4;

/// Calls `f` with the index of each set bit of a patch mask.
#[inline(always)]
fn each_bit(mut bits: u16, mut f: impl FnMut(usize)) {
    while bits != 0 {
        f(bits.trailing_zeros() as usize);
        bits &= bits - 1;
    }
}

/// Up to [`D256_MAX`] patched bytes of a delta: a new child, or `None` for a
/// removed one. `repr(C)`, the keys and their count first: with the
/// delta's header and base they fill its first 64 bytes, and a lookup
/// searches them without reading the map (`index`).
#[repr(C)]
pub(crate) struct Patches<V> {
    keys: [u8; D256_MAX],
    /// Patches used.
    n: u8,
    /// Bit `i` set: `children[i]` is a bitwise copy of the lender's patch,
    /// for which this array holds no reference.
    lent: u16,
    /// Bit `b` set: byte `b` is patched.
    patched: [u64; 4],
    /// Emptied by `Drop` (through `drop_children`, which bounds recursion),
    /// so the array's own drop glue would only scan the slots again.
    children: ManuallyDrop<[Option<Child<V>>; D256_MAX]>,
    /// Keeps every lent patch alive.
    lender: Option<NodeRc<D256<V>>>,
}

impl<V> Patches<V> {
    pub(crate) fn new() -> Self {
        Patches {
            patched: [0; 4],
            keys: [0; D256_MAX],
            n: 0,
            lent: 0,
            children: ManuallyDrop::new(std::array::from_fn(|_| None)),
            lender: None,
        }
    }

    /// Patches used.
    #[inline(always)]
    pub(crate) fn len(&self) -> usize {
        self.n as usize
    }

    #[inline(always)]
    pub(crate) fn is_full(&self) -> bool {
        self.len() == D256_MAX
    }

    #[inline(always)]
    pub(crate) fn is_patched(&self, b: u8) -> bool {
        self.patched[(b >> 6) as usize] & (1u64 << (b & 63)) != 0
    }

    /// Which bytes are patched.
    #[inline(always)]
    pub(crate) fn patched(&self) -> [u64; 4] {
        self.patched
    }

    /// The patch index of byte `b`.
    #[inline(always)]
    pub(crate) fn index(&self, b: u8) -> Option<usize> {
        simd::find16(&self.keys, self.len(), b)
    }

    /// The byte patch `i` is for.
    #[inline(always)]
    pub(crate) fn key(&self, i: usize) -> u8 {
        self.keys[i]
    }

    #[inline(always)]
    pub(crate) fn get(&self, i: usize) -> Option<&Child<V>> {
        self.children[i].as_ref()
    }

    /// Whether patch `i` is lent (held without a reference).
    #[inline(always)]
    pub(crate) fn is_lent(&self, i: usize) -> bool {
        self.lent & (1 << i) != 0
    }

    fn unlend(&mut self, i: usize) {
        self.lent &= !(1 << i);
        if self.lent == 0 {
            self.lender = None;
        }
    }

    /// Makes patch `i` own its child (one reference taken).
    #[inline]
    fn own(&mut self, i: usize) {
        if self.is_lent(i) {
            if let Some(c) = &self.children[i] {
                // The copy in the slot now stands for this reference.
                forget(c.clone());
            }
            self.unlend(i);
        }
    }

    /// Adds a patch for an unpatched byte; the caller checked for room.
    pub(crate) fn push(&mut self, b: u8, c: Option<Child<V>>) -> usize {
        let i = self.len();
        self.keys[i] = b;
        self.children[i] = c;
        self.patched[(b >> 6) as usize] |= 1u64 << (b & 63);
        self.n += 1;
        i
    }

    /// Stores `c` as patch `i`. A lent child there is forgotten (the lender
    /// keeps its reference); an owned one is dropped.
    #[inline]
    pub(crate) fn set(&mut self, i: usize, c: Option<Child<V>>) {
        let old = std::mem::replace(&mut self.children[i], c);
        if self.is_lent(i) {
            forget(old);
            self.unlend(i);
        }
    }

    /// Takes patch `i`'s child out, as an owned reference.
    #[inline]
    pub(crate) fn take(&mut self, i: usize) -> Option<Child<V>> {
        self.own(i);
        self.children[i].take()
    }

    /// Exclusive access to patch `i`'s child, which the patch owns first.
    #[inline]
    pub(crate) fn get_mut(&mut self, i: usize) -> Option<&mut Child<V>> {
        self.own(i);
        self.children[i].as_mut()
    }

    /// Exclusive access to patch `i`'s child if the patch owns it; `None`
    /// for a lent or empty patch. Changes nothing.
    #[inline]
    pub(crate) fn get_mut_owned(&mut self, i: usize) -> Option<&mut Child<V>> {
        if self.is_lent(i) {
            return None;
        }
        self.children[i].as_mut()
    }

    /// Bit `i` set: patch `i` holds a child.
    fn live(&self) -> u16 {
        let mut m = 0u16;
        for (i, c) in self.children[..self.len()].iter().enumerate() {
            m |= u16::from(c.is_some()) << i;
        }
        m
    }

    /// The patches of a copy of the delta `this`, whose patches these are:
    /// lent from `this` when it owns them all, from its lender when it
    /// borrows some and owns at most [`OWNED_MAX`] (those get a reference
    /// each), and otherwise all owned by the copy.
    pub(crate) fn copy(&self, this: &Child<V>) -> Patches<V> {
        let live = self.live();
        let owned = live & !self.lent;
        let (lent, lender, counted) = match &self.lender {
            None if live != 0 => match this.d256() {
                Some(rc) => (live, Some(rc), 0),
                None => (0, None, live),
            },
            None => (0, None, 0),
            Some(l) if owned.count_ones() <= OWNED_MAX => (self.lent, Some(l.clone()), owned),
            Some(_) => (0, None, live),
        };
        each_bit(counted, |i| {
            if let Some(c) = &self.children[i] {
                // The bitwise copy made below stands for this reference.
                forget(c.clone());
            }
        });
        Patches {
            patched: self.patched,
            keys: self.keys,
            n: self.n,
            lent,
            // SAFETY: a bitwise copy of the array. Each non-empty copy is
            // either in `counted`, and was given a reference of its own
            // above, or in `lent`: then `lender` (`this`, which owns all its
            // patches, or `this`'s lender, which owns the ones `this`
            // borrows) holds a reference that keeps it alive, and the module
            // invariants keep the copy from being dropped or written through.
            // Every live patch is in exactly one of the two, so the counts
            // stay exact.
            children: unsafe { std::ptr::read(&self.children) },
            lender,
        }
    }

    /// Forgets every lent copy (those patches become empty) and returns the
    /// patches, now holding only owned children: for dropping.
    pub(crate) fn for_drop(&mut self) -> &mut [Option<Child<V>>] {
        let children = &mut self.children;
        each_bit(self.lent, |i| forget(children[i].take()));
        self.lent = 0;
        let n = self.len();
        &mut self.children[..n]
    }

    /// Checks the invariants above and the patch map.
    #[cfg(any(test, feature = "test-util"))]
    pub(crate) fn check(&self) -> Result<(), String> {
        let bits: u32 = self.patched.iter().map(|w| w.count_ones()).sum();
        let keys = &self.keys[..self.len()];
        let distinct = keys.iter().collect::<std::collections::BTreeSet<_>>().len();
        if bits as usize != keys.len() || distinct != keys.len() {
            return Err("delta256 patch bitmap/keys mismatch".into());
        }
        if self.children[self.len()..].iter().any(Option::is_some) {
            return Err("delta256 holds a child past its patches".into());
        }
        if (self.lent != 0) != self.lender.is_some() {
            return Err("lent bits and lender disagree".into());
        }
        for i in 0..self.len() {
            if !self.is_lent(i) {
                continue;
            }
            let (Some(mine), Some(lender)) = (&self.children[i], &self.lender) else {
                return Err(format!("patch {i} is lent but empty"));
            };
            let theirs = lender.p.index(self.keys[i]);
            if lender.p.lender.is_some()
                || theirs.is_none_or(|j| lender.p.is_lent(j))
                || theirs.and_then(|j| lender.p.get(j)).map(|c| c.ptr_eq(mine)) != Some(true)
            {
                return Err(format!("patch {i} is not the lender's own child"));
            }
        }
        Ok(())
    }
}

impl<V> Drop for Patches<V> {
    fn drop(&mut self) {
        drop_children(self.for_drop());
    }
}

#[cfg(test)]
mod tests {
    use crate::node::Kind;
    use crate::slots::tests::{reads, wide};
    use crate::Tree;

    fn delta(t: &Tree<u32>) -> &super::D256<u32> {
        match t.root.kind() {
            Kind::D256(d) => d,
            _ => panic!("the root is not a delta"),
        }
    }

    /// (patches used, lent patches, whether the lender is `of`'s root).
    fn shape(t: &Tree<u32>, of: &Tree<u32>) -> (usize, u32, bool) {
        let d = delta(t);
        let lender =
            d.p.lender
                .as_ref()
                .is_some_and(|l| std::ptr::eq(&**l, delta(of)));
        (d.p.len(), d.p.lent.count_ones(), lender)
    }

    fn write(t: &Tree<u32>, b: u8, v: u32) -> Tree<u32> {
        let mut txn = t.txn();
        txn.insert(&[b], v).unwrap();
        txn.commit()
    }

    #[test]
    fn copies_borrow_patches_from_one_lender_until_they_own_too_many() {
        let t0 = wide();
        let mut t1 = t0.txn();
        for b in 0..3u8 {
            t1.insert(&[b], 1000).unwrap();
        }
        let t1 = t1.commit();
        assert_eq!(delta(&t1).p.lent, 0);
        // A copy of a delta that owns its patches borrows them all.
        let t2 = write(&t1, 10, 2000);
        assert_eq!(shape(&t2, &t1), (4, 3, true));
        // A copy of a borrowing delta borrows from the same lender and owns
        // what its source owned, plus its own write.
        let mut gens = vec![t1.clone(), t2];
        for i in 0..super::OWNED_MAX as u8 {
            let t = write(gens.last().unwrap(), 20 + i, 3000);
            assert_eq!(shape(&t, &t1), (5 + i as usize, 3, true));
            gens.push(t);
        }
        // The next copy would own more than `OWNED_MAX`: it owns everything
        // and becomes the lender of the copy after it.
        let plain = write(gens.last().unwrap(), 40, 4000);
        assert!(delta(&plain).p.lender.is_none());
        let next = write(&plain, 41, 5000);
        assert_eq!(shape(&next, &plain).1, 9);
        assert!(shape(&next, &plain).2);
        // Old versions dropped: the lenders are held by their borrowers alone.
        drop((t0, t1, gens, plain));
        reads(&next, |b| match b {
            0..3 => 1000,
            10 => 2000,
            20..24 => 3000,
            40 => 4000,
            41 => 5000,
            _ => u32::from(b),
        });
    }

    #[test]
    fn a_lent_patch_written_below_is_owned_first() {
        // Two-byte keys under byte 5 make its child an inner node.
        let mut t = wide().txn();
        t.insert(&[5, 1], 51).unwrap();
        let t = t.commit();
        let mut t1 = t.txn();
        t1.insert(&[5, 2], 52).unwrap();
        let t1 = t1.commit();
        let t2 = write(&t1, 9, 9);
        let i = delta(&t2).p.index(5).unwrap();
        assert!(delta(&t2).p.is_lent(i));
        // Writing below the lent child copies it rather than changing it in
        // place: `t1`, its lender's tree, still reads the old value.
        let mut t3 = t2.txn();
        t3.insert(&[5, 2], 520).unwrap();
        let t3 = t3.commit();
        drop(t2);
        assert_eq!(t1.get(&[5, 2]), Some(&52));
        assert_eq!(t3.get(&[5, 2]), Some(&520));
        crate::check::check(&t1).unwrap();
        crate::check::check(&t3).unwrap();
    }
}
