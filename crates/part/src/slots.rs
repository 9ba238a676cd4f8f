//! A node256's child array, which may *borrow* children from an older
//! node256 instead of taking a reference on each.
//!
//! A transaction that rewrites many children of a shared node256 must give
//! the new version a child array of its own. Cloning the array takes one
//! reference per child (an atomic increment on up to 256 cache lines), and
//! each child the transaction then replaces gives that reference back (an
//! atomic decrement), so a rewritten child costs two atomic operations
//! before the old version is even freed. A borrowing array instead starts as
//! a bitwise copy of the old array, holds one reference on the old node (the
//! *lender*) to keep every copied child alive, and marks the copied slots.
//! A borrowed child that is replaced or removed is simply forgotten; one that
//! is reached for writing, or moved to another node, first takes a reference
//! of its own. Once no slot borrows, the lender is released.
//!
//! Invariants (checked by `check`):
//! * a bit is set in `borrowed` only for a non-empty slot, and `lender` is
//!   `Some` exactly when some bit is set;
//! * a borrowed slot holds the same pointer as the lender's slot, and the
//!   lender owns that slot (lenders never borrow), so the chain of lenders is
//!   one long and a borrowing node keeps at most one older version alive;
//! * a borrowed copy is never dropped and never handed out as `&mut`: its
//!   reference count does not count it, so `NodeRc::get_mut` through it would
//!   wrongly succeed.
//!
//! The lender stays immutable while borrowed from: it is only reachable
//! through `Arc`s and one of them is ours, so `NodeRc::get_mut` fails for every
//! other holder.

use std::mem::{forget, ManuallyDrop};

use std::ptr::addr_of_mut;

use crate::child::{NodeRc, UniqueRc};

use crate::node::{Child, Header, N256};

/// Child slots of a node256, possibly borrowed from a lender.
///
/// `repr(C)` with the bitmaps first: in a node256 they then share the
/// header's cache lines, and a write (which checks `borrowed`) touches the
/// header, the slot and the child; after the 2 KiB array they straddled a
/// line of their own (a third of a miss per random delete, callgrind).
#[repr(C)]
pub(crate) struct Slots256<V> {
    /// Bit `b` set: `children[b]` is a bitwise copy of the lender's child,
    /// for which this array holds no reference.
    borrowed: [u64; 4],
    /// Bit `b` set: `children[b]` is not empty. Lets `borrow_from` mark
    /// and visit only the occupied slots.
    present: [u64; 4],
    /// Keeps every borrowed child alive.
    lender: Option<NodeRc<N256<V>>>,
    /// The lender's children this array no longer borrows (it replaced or
    /// removed them), which the lender keeps alive for it: leaves count
    /// one, subtrees [`SUBTREE_WEIGHT`]. 0 without a lender.
    stale: u32,
    /// Emptied by `Drop` (through `drop_children`, which bounds recursion),
    /// so the array's own drop glue would only scan 256 empty slots again.
    children: ManuallyDrop<[Option<Child<V>>; 256]>,
}

/// Calls `f` with the index of each set bit.
#[inline(always)]
pub(crate) fn each_bit(bits: [u64; 4], mut f: impl FnMut(usize)) {
    for (w, mut word) in bits.into_iter().enumerate() {
        while word != 0 {
            f(w * 64 + word.trailing_zeros() as usize);
            word &= word - 1;
        }
    }
}

/// A node256 allocated and written in place; `fill` writes the 256 child
/// slots it is given a pointer to.
///
/// # Safety
///
/// `fill` must initialise every slot without unwinding, and the loan
/// (`borrowed`, `lender`, `stale`) and `present` must describe the slots as
/// the module invariants say.
unsafe fn alloc_node<V>(
    h: Header,
    terminal: Option<Child<V>>,
    len: u16,
    (borrowed, lender, stale): Loan<V>,
    present: [u64; 4],
    fill: impl FnOnce(*mut Option<Child<V>>),
) -> UniqueRc<N256<V>> {
    // SAFETY: `p` points to room for an `N256` that nothing else can reach;
    // each field is written exactly once (the child array by `fill`, as the
    // caller promises), so the whole node is initialised.
    unsafe {
        NodeRc::new_in_place(|p: *mut N256<V>| {
            addr_of_mut!((*p).h).write(h);
            addr_of_mut!((*p).terminal).write(terminal);
            addr_of_mut!((*p).len).write(len);
            let s = addr_of_mut!((*p).slots);
            fill(addr_of_mut!((*s).children).cast::<Option<Child<V>>>());
            addr_of_mut!((*s).borrowed).write(borrowed);
            addr_of_mut!((*s).lender).write(lender);
            addr_of_mut!((*s).stale).write(stale);
            addr_of_mut!((*s).present).write(present);
        })
    }
}

/// What a node256 borrows: `borrowed`, `lender` and `stale` of
/// [`Slots256`].
type Loan<V> = ([u64; 4], Option<NodeRc<N256<V>>>, u32);

/// Children a borrowing base may own before a copy of it owns them all
/// (see [`Slots256::new_borrowing`]). A simulation of random 16-patch
/// flattens put the references taken per flatten at 214 without the cap,
/// 91 / 76 / 70 / 68 / 72 / 84 with it at 16 / 32 / 48 / 64 / 96 / 128.
const OWNED_MAX: u32 = 64;
/// The stale children (see `Slots256::stale`) a lender may keep for a
/// borrowing array before the array takes references on the rest and lets
/// the lender go: as many leaves as a borrowing base may own, so random
/// writes, whose copies reach that many after a few generations, pay about
/// what they paid before the bound.
const STALE_MAX: u32 = OWNED_MAX;

/// What a stale subtree counts for: an old version of a subtree keeps every
/// leaf rewritten under it since, so a lender may keep fewer of those.
const SUBTREE_WEIGHT: u32 = 2;

#[inline(always)]
fn bit(b: u8) -> (usize, u64) {
    ((b >> 6) as usize, 1u64 << (b & 63))
}

impl<V> Slots256<V> {
    /// An array owning each of `children`.
    pub(crate) fn from_array(children: [Option<Child<V>>; 256]) -> Self {
        let mut present = [0u64; 4];
        for (i, c) in children.iter().enumerate() {
            present[i >> 6] |= u64::from(c.is_some()) << (i & 63);
        }
        Slots256 {
            children: ManuallyDrop::new(children),
            borrowed: [0; 4],
            lender: None,
            stale: 0,
            present,
        }
    }

    /// Every slot, for reading.
    #[inline(always)]
    pub(crate) fn array(&self) -> &[Option<Child<V>>; 256] {
        &self.children
    }

    #[inline(always)]
    pub(crate) fn get(&self, b: u8) -> Option<&Child<V>> {
        self.children[b as usize].as_ref()
    }

    /// Whether the child under `b` is borrowed (held without a reference).
    #[inline(always)]
    pub(crate) fn is_borrowed(&self, b: u8) -> bool {
        let (w, m) = bit(b);
        self.borrowed[w] & m != 0
    }

    /// Marks `b` no longer borrowed: the lender's child there, a leaf or
    /// (`subtree`) an inner node, is one this array replaced or removed,
    /// which the lender keeps alive for it. Past [`STALE_MAX`] the array
    /// takes references on the rest and lets the lender go (`own_all`).
    #[inline]
    fn clear(&mut self, b: u8, subtree: bool) {
        let (w, m) = bit(b);
        self.borrowed[w] &= !m;
        // The word just changed decides most calls without the other three.
        if self.borrowed[w] == 0 && self.borrowed == [0; 4] {
            self.lender = None;
            self.stale = 0;
        } else {
            self.stale += if subtree { SUBTREE_WEIGHT } else { 1 };
            if self.stale > STALE_MAX {
                self.own_all();
            }
        }
    }

    /// Takes a reference on every borrowed child and lets go of the
    /// lender. Without it a lender whose children this node has mostly
    /// replaced stays alive as long as one child is still borrowed, and so
    /// does every child it holds: in a database, superseded objects that no
    /// snapshot can reach (statedb rewriting each of 1M objects once in
    /// batches kept 0.35 to 0.49M of them). With it a lender keeps at most
    /// [`STALE_MAX`] (weighted) children this node no longer has.
    #[cold]
    #[inline(never)]
    fn own_all(&mut self) {
        each_bit(self.borrowed, |i| {
            if let Some(c) = &self.children[i] {
                // The copy in the slot now stands for this reference.
                forget(c.clone());
            }
        });
        self.borrowed = [0; 4];
        self.lender = None;
        self.stale = 0;
    }

    /// Makes the slot under `b` own its child (one reference taken).
    #[inline]
    fn own(&mut self, b: u8) {
        if self.is_borrowed(b) {
            let subtree = match &self.children[b as usize] {
                Some(c) => {
                    // The copy in the slot now stands for this reference.
                    forget(c.clone());
                    !c.is_leaf()
                }
                None => false,
            };
            self.clear(b, subtree);
        }
    }

    /// Exclusive access to the child under `b`, which the slot owns first.
    #[inline]
    pub(crate) fn get_mut(&mut self, b: u8) -> Option<&mut Child<V>> {
        self.own(b);
        self.children[b as usize].as_mut()
    }

    /// Exclusive access to the child under `b` if the slot owns it; `None`
    /// for a borrowed or empty slot. Changes nothing (see [`Slots256::get_mut`]).
    #[inline]
    pub(crate) fn get_mut_owned(&mut self, b: u8) -> Option<&mut Child<V>> {
        if self.is_borrowed(b) {
            return None;
        }
        self.children[b as usize].as_mut()
    }

    /// Which bytes hold a child.
    #[inline]
    pub(crate) fn present(&self) -> [u64; 4] {
        self.present
    }

    /// Takes the child under `b` out, as an owned reference.
    #[inline]
    pub(crate) fn take(&mut self, b: u8) -> Option<Child<V>> {
        self.own(b);
        let (w, m) = bit(b);
        self.present[w] &= !m;
        self.children[b as usize].take()
    }

    /// Unlinks the leaf under `b`: a clone of its value, and the leaf when
    /// this array owned it or `keep` asks for it (a borrowed one then gets
    /// a reference of its own). `None`, changing nothing, when no leaf is
    /// there.
    #[inline]
    pub(crate) fn unlink_leaf(&mut self, b: u8, keep: bool) -> Option<(V, Option<Child<V>>)>
    where
        V: Clone,
    {
        let value = self.children[b as usize].as_ref()?.leaf_value()?.clone();
        let (w, m) = bit(b);
        self.present[w] &= !m;
        let c = self.children[b as usize].take();
        if self.borrowed[w] & m == 0 {
            return Some((value, c));
        }
        let kept = if keep { c.clone() } else { None };
        forget(c);
        self.clear(b, false);
        Some((value, kept))
    }

    /// Stores `c` under `b`. A borrowed child there is forgotten (the lender
    /// keeps its reference); an owned one is dropped.
    #[inline]
    pub(crate) fn put(&mut self, b: u8, c: Option<Child<V>>) {
        let (w, m) = bit(b);
        if c.is_some() {
            self.present[w] |= m;
        } else {
            self.present[w] &= !m;
        }
        let old = std::mem::replace(&mut self.children[b as usize], c);
        if self.is_borrowed(b) {
            let subtree = old.as_ref().is_some_and(|c| !c.is_leaf());
            forget(old);
            self.clear(b, subtree);
        }
    }

    /// Stores `c` under `b`, which is empty.
    #[inline]
    pub(crate) fn put_empty(&mut self, b: u8, c: Child<V>) {
        debug_assert!(self.children[b as usize].is_none());
        let (w, m) = bit(b);
        self.present[w] |= m;
        // An empty slot is never borrowed: nothing to forget or drop.
        forget(self.children[b as usize].replace(c));
    }

    /// A copy owning a reference on each child (for a shallow node copy).
    pub(crate) fn clone_owned(&self) -> [Option<Child<V>>; 256] {
        let mut out: [Option<Child<V>>; 256] = std::array::from_fn(|_| None);
        for (o, s) in out.iter_mut().zip(self.children.iter()) {
            *o = s.clone();
        }
        out
    }

    /// An empty private node256, built in its own allocation (see
    /// [`Slots256::new_borrowing`]).
    pub(crate) fn new_node(h: Header, terminal: Option<Child<V>>, len: u16) -> UniqueRc<N256<V>> {
        // SAFETY: every slot is written (empty), and an array with no
        // children borrows nothing.
        unsafe {
            alloc_node(h, terminal, len, ([0; 4], None, 0), [0; 4], |children| {
                for i in 0..256 {
                    children.add(i).write(None);
                }
            })
        }
    }

    /// A private node256 whose children are `base`'s, without a reference
    /// per child: the children `base` owns are borrowed from `base`; those
    /// `base` itself borrows are borrowed from its lender instead, so lenders
    /// never chain (the children `base` owns then get a reference each).
    /// A base that owns more than [`OWNED_MAX`] is copied with a reference
    /// on every child instead, and lends to the copies after it: what a
    /// borrowing base owns grows with each generation of copies, and under
    /// random writes it reaches all 256 children only after hundreds of
    /// generations (every byte rewritten once), so without the cap nearly
    /// every flatten took a reference on nearly every child (see the
    /// design doc). Built in its own allocation: a 4 KiB array built on the
    /// stack and moved in is copied several times over.
    pub(crate) fn new_borrowing(
        h: Header,
        terminal: Option<Child<V>>,
        len: u16,
        base: &NodeRc<N256<V>>,
    ) -> UniqueRc<N256<V>> {
        let src = &base.slots;
        let loan: Loan<V> = match &src.lender {
            None => (
                src.present,
                (src.present != [0; 4]).then(|| base.clone()),
                0,
            ),
            Some(lender) => {
                let owned: [u64; 4] = std::array::from_fn(|w| src.present[w] & !src.borrowed[w]);
                let many = owned.iter().map(|w| w.count_ones()).sum::<u32>() > OWNED_MAX;
                each_bit(if many { src.present } else { owned }, |i| {
                    if let Some(c) = &src.children[i] {
                        // The bitwise copy made below stands for this reference.
                        forget(c.clone());
                    }
                });
                if many {
                    ([0; 4], None, 0)
                } else {
                    // `base` has a lender, so it borrows some slot; what the
                    // lender keeps for `base` it keeps for the copy.
                    (src.borrowed, Some(lender.clone()), src.stale)
                }
            }
        };
        // SAFETY: the child array is a bitwise copy of `base`'s. Each
        // non-empty copy is either marked borrowed, with `lender` (a
        // reference on its owner, `base` or `base`'s lender) keeping it alive
        // and immutable while it is never dropped (module invariants), or
        // was given a reference of its own above (all of them when `base`
        // owned many); `present` is `base`'s. The counts therefore stay
        // exact.
        unsafe {
            alloc_node(h, terminal, len, loan, src.present, |children| {
                children.copy_from_nonoverlapping(src.children.as_ptr(), 256);
            })
        }
    }

    /// Forgets every borrowed copy (the slots become empty) and returns the
    /// array, now holding only owned children: for dropping. The caller may
    /// empty slots directly, so afterwards `present` is only a superset of
    /// the occupied slots (enough for `Drop`, which skips empty ones).
    pub(crate) fn for_drop(&mut self) -> &mut [Option<Child<V>>; 256] {
        if self.lender.is_some() {
            let children = &mut self.children;
            each_bit(self.borrowed, |i| forget(children[i].take()));
            for (p, b) in self.present.iter_mut().zip(self.borrowed) {
                *p &= !b;
            }
            self.borrowed = [0; 4];
        }
        &mut self.children
    }

    /// Checks the invariants above.
    #[cfg(any(test, feature = "test-util"))]
    pub(crate) fn check(&self) -> Result<(), String> {
        for (i, c) in self.children.iter().enumerate() {
            if c.is_some() != (self.present[i >> 6] & (1u64 << (i & 63)) != 0) {
                return Err(format!("presence bit {i} disagrees with the slot"));
            }
        }
        let any = self.borrowed != [0; 4];
        if any != self.lender.is_some() {
            return Err("borrowed bits and lender disagree".into());
        }
        for b in 0..=255u8 {
            if !self.is_borrowed(b) {
                continue;
            }
            let (Some(mine), Some(lender)) = (self.get(b), &self.lender) else {
                return Err(format!("slot {b} is borrowed but empty"));
            };
            if lender.slots.lender.is_some()
                || lender.slots.get(b).map(|c| c.ptr_eq(mine)) != Some(true)
            {
                return Err(format!("slot {b} is not the lender's own child"));
            }
        }
        let stale: u32 = match &self.lender {
            None => 0,
            Some(lender) => (0..=255u8)
                .filter(|&b| !self.is_borrowed(b))
                .filter_map(|b| lender.slots.get(b))
                .map(|c| if c.is_leaf() { 1 } else { SUBTREE_WEIGHT })
                .sum(),
        };
        if stale != self.stale || stale > STALE_MAX {
            return Err(format!("stale is {} for {stale} kept", self.stale));
        }
        Ok(())
    }
}

impl<V> Drop for Slots256<V> {
    fn drop(&mut self) {
        let owned: [u64; 4] = std::array::from_fn(|w| self.present[w] & !self.borrowed[w]);
        crate::node::drop_slots256(&mut self.children, owned, self.borrowed);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::node::Kind;
    use crate::Tree;

    /// A tree whose root is a node256 over the one-byte keys `0..=255`.
    pub(crate) fn wide() -> Tree<u32> {
        let mut t = Tree::new().txn();
        for b in 0..=255u8 {
            t.insert(&[b], u32::from(b)).unwrap();
        }
        t.commit()
    }

    fn root(t: &Tree<u32>) -> &N256<u32> {
        match t.root.kind() {
            Kind::N256(n) => n,
            _ => panic!("the root is not a flat node256"),
        }
    }

    fn borrowed(t: &Tree<u32>) -> u32 {
        root(t).slots.borrowed.iter().map(|w| w.count_ones()).sum()
    }

    /// Checks `t`'s structure, and that it maps each byte `b` to `want(b)`.
    pub(crate) fn reads(t: &Tree<u32>, want: impl Fn(u8) -> u32) {
        crate::check::check(t).unwrap();
        for b in 0..=255u8 {
            assert_eq!(t.get(&[b]), Some(&want(b)), "byte {b}");
        }
    }

    fn rewrite(t: &Tree<u32>, keys: std::ops::Range<u16>, add: u32) -> Tree<u32> {
        let mut txn = t.txn();
        for b in keys {
            txn.insert(&[b as u8], u32::from(b) + add).unwrap();
        }
        txn.commit()
    }

    #[test]
    fn the_lender_is_released_once_every_slot_is_rewritten() {
        let t0 = wide();
        let t1 = rewrite(&t0, 0..256, 1000);
        assert!(root(&t1).slots.lender.is_none());
        assert_eq!(borrowed(&t1), 0);
        // Only `t0` holds its root again.
        assert_eq!(t0.root.strong_count(), 1);
        assert_eq!((t0.get(&[7]), t1.get(&[7])), (Some(&7), Some(&1007)));
    }

    #[test]
    fn a_partial_rewrite_borrows_the_rest_and_lenders_never_chain() {
        let t0 = wide();
        // More than a delta holds: the delta is flattened into a borrowing node.
        let t1 = rewrite(&t0, 0..20, 1000);
        assert_eq!(borrowed(&t1), 236);
        let lender = root(&t1).slots.lender.clone().unwrap();
        assert!(std::ptr::eq(&*lender, root(&t0)));
        // A delta over the borrowing node is flattened by borrowing from
        // `t0`'s root directly, and the slots `t1` owns get references.
        let t2 = rewrite(&t1, 100..130, 2000);
        assert_eq!(borrowed(&t2), 206);
        assert!(std::ptr::eq(
            &**root(&t2).slots.lender.as_ref().unwrap(),
            root(&t0)
        ));
        drop(lender);
        drop((t0, t1));
        reads(&t2, |b| {
            u32::from(b)
                + match b {
                    0..20 => 1000,
                    100..130 => 2000,
                    _ => 0,
                }
        });
    }

    #[test]
    fn a_base_owning_many_is_copied_owning_all_and_lends_after() {
        // A node256 over the bytes 0..128 only.
        let mut txn = Tree::new().txn();
        for b in 0..128u8 {
            txn.insert(&[b], u32::from(b)).unwrap();
        }
        let t0 = txn.commit();
        let t1 = rewrite(&t0, 0..20, 1000);
        // `t1` owns 20: a copy borrows from `t0` and owns 20 rewritten and
        // 60 new children (in empty slots: nothing left stale in `t0`).
        let t2 = rewrite(&t1, 128..188, 2000);
        assert_eq!(borrowed(&t2), 108);
        assert_eq!(root(&t2).slots.stale, 20);
        // `t2` owns more than `OWNED_MAX`: its copy owns every child ...
        let t3 = rewrite(&t2, 200..220, 3000);
        assert!(root(&t3).slots.lender.is_none());
        assert_eq!(borrowed(&t3), 0);
        // ... and lends them to the next copy.
        let t4 = rewrite(&t3, 230..250, 4000);
        assert_eq!(borrowed(&t4), 208);
        assert!(std::ptr::eq(
            &**root(&t4).slots.lender.as_ref().unwrap(),
            root(&t3)
        ));
        // `t0` is no one's lender any more.
        drop((t1, t2));
        assert_eq!(t0.root.strong_count(), 1);
        drop((t0, t3));
        crate::check::check(&t4).unwrap();
        for b in 0..=255u8 {
            let want = match b {
                0..20 => Some(u32::from(b) + 1000),
                20..128 => Some(u32::from(b)),
                128..188 => Some(u32::from(b) + 2000),
                200..220 => Some(u32::from(b) + 3000),
                230..250 => Some(u32::from(b) + 4000),
                _ => None,
            };
            assert_eq!(t4.get(&[b]).copied(), want, "byte {b}");
        }
    }

    /// A lender keeps at most `STALE_MAX` leaves a borrower replaced or
    /// removed: past that the borrower takes references on the rest and
    /// lets it go, and once the old version is dropped, so are the leaves.
    #[test]
    fn a_lender_keeps_few_leaves_its_borrower_replaced() {
        let t0 = wide();
        let t1 = rewrite(&t0, 0..64, 1000);
        assert_eq!((borrowed(&t1), root(&t1).slots.stale), (192, 64));
        let t2 = rewrite(&t0, 0..65, 1000);
        assert!(root(&t2).slots.lender.is_none());
        assert_eq!((borrowed(&t2), root(&t2).slots.stale), (0, 0));
        // Removals count as replacements.
        let mut txn = t0.txn();
        for b in 100..170u8 {
            txn.delete(&[b]).unwrap();
        }
        let t3 = txn.commit();
        assert!(root(&t3).slots.lender.is_none());
        drop(t1);
        assert_eq!(t0.root.strong_count(), 1, "no borrower holds t0");
        reads(&t2, |b| u32::from(b) + if b < 65 { 1000 } else { 0 });
        assert_eq!((t3.get(&[99]), t3.get(&[100])), (Some(&99), None));
    }

    /// A replaced subtree counts double: an old version of an inner node
    /// keeps every leaf rewritten under it since.
    #[test]
    fn a_lender_keeps_fewer_subtrees_than_leaves() {
        let mut txn = Tree::new().txn();
        for x in 0..=255u8 {
            for b in 0..2u8 {
                txn.insert(&[x, b], 0).unwrap();
            }
        }
        let t0 = txn.commit();
        let under = |t: &Tree<u32>, xs: std::ops::Range<u16>| {
            let mut txn = t.txn();
            for x in xs {
                txn.insert(&[x as u8, 0], 1).unwrap();
            }
            txn.commit()
        };
        let t1 = under(&t0, 0..32);
        assert_eq!((borrowed(&t1), root(&t1).slots.stale), (224, 64));
        let t2 = under(&t0, 0..33);
        assert!(root(&t2).slots.lender.is_none());
        drop((t0, t1));
        crate::check::check(&t2).unwrap();
        for x in 0..=255u8 {
            assert_eq!(t2.get(&[x, 0]), Some(&u32::from(x < 33)), "byte {x}");
        }
    }

    /// The node256 under `[x]` in a tree of the keys `[x, b]`.
    fn inner(t: &Tree<u32>, x: u8) -> &N256<u32> {
        match t.root.find_child(x).map(|c| c.kind()) {
            Some(Kind::N256(n)) => n,
            _ => panic!("no flat node256 under {x}"),
        }
    }

    /// The key `[x, b]`.
    fn key(x: u8, b: u8) -> [u8; 2] {
        [x, b]
    }

    /// `t0`: the keys `[x, b]` for `x` in 0..2 and every byte `b` but 60,
    /// valued `b`, and `[0, 70, 1]` (an inner node under `[0, 70]`);
    /// `t1`: `t0` with `[0, 0..20]` rewritten (+1000), so its node under 0
    /// owns those and borrows the rest from `t0`'s.
    fn two_generations(opts: crate::Options) -> (Tree<u32>, Tree<u32>) {
        let mut txn = Tree::with_options(opts).txn();
        for x in 0..2u8 {
            for b in (0..=255u8).filter(|&b| b != 60) {
                txn.insert(&key(x, b), u32::from(b)).unwrap();
            }
        }
        txn.insert(&[0, 70, 1], 7001).unwrap();
        let t0 = txn.commit();
        let mut txn = t0.txn();
        for b in 0..20u8 {
            txn.insert(&key(0, b), u32::from(b) + 1000).unwrap();
        }
        let t1 = txn.commit();
        assert!(std::ptr::eq(
            &**inner(&t1, 0).slots.lender.as_ref().unwrap(),
            inner(&t0, 0)
        ));
        assert_eq!((count(&t0, 100), count(&t1, 5)), (1, 1));
        (t0, t1)
    }

    /// The count of the leaf `[0, b]` of `t`.
    fn count(t: &Tree<u32>, b: u8) -> usize {
        inner(t, 0).slots.get(b).unwrap().strong_count()
    }

    /// What `t0` and `t1` read (`t1`'s rewrite included).
    fn reads_two_generations(t0: &Tree<u32>, t1: &Tree<u32>) {
        for b in 0..=255u8 {
            let was = (b != 60).then_some(u32::from(b));
            assert_eq!(t0.get(&key(0, b)).copied(), was, "byte {b}");
            let one = was.map(|v| v + if b < 20 { 1000 } else { 0 });
            assert_eq!(t1.get(&key(0, b)).copied(), one, "byte {b}");
        }
    }

    /// Every count `t1` and `t2`'s transaction took is back once the
    /// notifier is gone, and nothing lends from `t0`'s node after them.
    fn released(t0: &Tree<u32>, t1: Tree<u32>, t2: Tree<u32>) {
        assert_eq!((count(t0, 100), count(&t1, 5)), (1, 1));
        drop((t1, t2));
        assert_eq!(t0.root.find_child(0).unwrap().strong_count(), 1);
        crate::check::check(t0).unwrap();
    }

    /// `delete`'s one-step path (`Slots256::unlink_leaf`): below the root,
    /// from a private flat node256 that borrows some leaves and owns
    /// others. A borrowed leaf's count is left alone (or taken once, to
    /// close its watch), an owned one is released; every watch on a
    /// removed key fires, older snapshots stay as they were.
    #[test]
    fn deletes_from_a_borrowing_node256_below_the_root() {
        for root_only_watch in [false, true] {
            deletes_below_the_root(crate::Options { root_only_watch });
        }
    }

    fn deletes_below_the_root(opts: crate::Options) {
        let (t0, t1) = two_generations(opts);
        let watches: Vec<_> = [5u8, 100, 200]
            .iter()
            .map(|&b| t1.get_watch(&key(0, b)).1)
            .collect();
        let mut txn = t1.txn();
        // Enough deletes to flatten the transaction's delta into a flat
        // node256 (owning `t1`'s 0..20 with a reference each, borrowing the
        // rest from `t0`), then an owned and a borrowed leaf through the
        // one-step path.
        for b in 30..50u8 {
            assert_eq!(txn.delete(&key(0, b)), Some(u32::from(b)));
        }
        assert_eq!(count(&t1, 5), 2);
        assert_eq!(txn.delete(&key(0, 5)), Some(1005));
        assert_eq!(txn.delete(&key(0, 100)), Some(100));
        assert_eq!(txn.delete(&key(0, 100)), None);
        if opts.root_only_watch {
            // Nothing kept for a watch: the owned leaf's reference is gone
            // at once, the borrowed one's count never moved.
            assert_eq!((count(&t0, 100), count(&t1, 5)), (1, 1));
        }
        assert!(watches.iter().all(|w| !w.is_closed()));
        let t2 = txn.commit();
        assert!(watches[0].is_closed() && watches[1].is_closed());
        assert_eq!(watches[2].is_closed(), opts.root_only_watch);
        crate::check::check(&t2).unwrap();
        reads_two_generations(&t0, &t1);
        for b in 0..=255u8 {
            let gone = b == 5 || b == 100 || b == 60 || (30..50).contains(&b);
            let want = u32::from(b) + if b < 20 { 1000 } else { 0 };
            assert_eq!(t2.get(&key(0, b)), (!gone).then_some(&want), "byte {b}");
        }
        released(&t0, t1, t2);
    }

    /// `modify`'s one-step path (`flat_step` in `txn.rs`) at a private flat
    /// node256 below the root: a new key, an owned leaf (shared with the
    /// older tree, then private), a borrowed one, and a descent into an
    /// inner child; watches fire for exactly the keys written.
    #[test]
    fn writes_into_a_borrowing_node256_below_the_root() {
        for root_only_watch in [false, true] {
            writes_below_the_root(crate::Options { root_only_watch });
        }
    }

    fn writes_below_the_root(opts: crate::Options) {
        let (t0, t1) = two_generations(opts);
        let watches: Vec<_> = [5u8, 100, 60, 200]
            .iter()
            .map(|&b| t1.get_watch(&key(0, b)).1)
            .collect();
        let deep = t1.get_watch(&[0, 70, 1]).1;
        let mut txn = t1.txn();
        // Flatten the transaction's delta first (borrowing from `t0`).
        for b in 20..40u8 {
            txn.insert(&key(0, b), u32::from(b) + 2000).unwrap();
        }
        assert_eq!(txn.insert(&key(0, 5), 3005).unwrap(), Some(1005));
        assert_eq!(txn.insert(&key(0, 5), 4005).unwrap(), Some(3005));
        assert_eq!(txn.insert(&key(0, 100), 3100).unwrap(), Some(100));
        assert_eq!(
            txn.modify(&key(0, 100), |v| v.unwrap() + 1).unwrap(),
            Some(3100)
        );
        assert_eq!(txn.insert(&key(0, 60), 3060).unwrap(), None);
        assert_eq!(txn.insert(&[0, 70, 1], 7002).unwrap(), Some(7001));
        assert_eq!(txn.get(&key(0, 100)), Some(&3101));
        assert!(watches.iter().all(|w| !w.is_closed()) && !deep.is_closed());
        let t2 = txn.commit();
        assert!(watches[..3].iter().all(|w| w.is_closed()) && deep.is_closed());
        assert_eq!(watches[3].is_closed(), opts.root_only_watch);
        crate::check::check(&t2).unwrap();
        reads_two_generations(&t0, &t1);
        for b in 0..=255u8 {
            let want = match b {
                5 => 4005,
                100 => 3101,
                60 => 3060,
                0..20 => u32::from(b) + 1000,
                20..40 => u32::from(b) + 2000,
                _ => u32::from(b),
            };
            assert_eq!(t2.get(&key(0, b)), Some(&want), "byte {b}");
        }
        assert_eq!(
            (t1.get(&[0, 70, 1]), t2.get(&[0, 70, 1])),
            (Some(&7001), Some(&7002))
        );
        released(&t0, t1, t2);
    }

    /// A write reads the header and `borrowed`: both in the node's first
    /// two cache lines, before the 2 KiB array.
    #[test]
    fn the_bitmaps_sit_next_to_the_header() {
        use std::mem::offset_of;
        type S = Slots256<u32>;
        let slots = offset_of!(N256<u32>, slots);
        assert!(slots + offset_of!(S, present) + 32 <= 128);
        assert!(slots + offset_of!(S, borrowed) + 32 <= 128);
        assert_eq!(offset_of!(S, children), 80);
    }
}
