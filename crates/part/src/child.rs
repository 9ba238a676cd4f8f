//! Reference-counted nodes and the one-word child pointer.
//!
//! Every node lives in its own allocation with an atomic strong count
//! before it ([`NodeRc`]): in the 8 bytes right before a small node, 64
//! bytes before a large one (node48, node256, delta; see [`Counted`]). A
//! [`Child`] is a pointer to a node of any kind with the kind in its three
//! low bits (nodes are 8-byte aligned, checked at compile time). Because
//! the count's place follows from the kind's tag, cloning, dropping
//! (until the last reference) and the uniqueness test of a copy-on-write
//! never branch on the kind (the distance is a select on the tag), and a
//! view of the node ([`Child::kind`]) is two bit operations. An
//! `Option<Child>` is 8 bytes, so node arrays are half the size of arrays of
//! a 16-byte enum of `Arc`s (a node256's 4 KiB -> 2 KiB).
//!
//! An enum of `triomphe::Arc`s needs no unsafe code of ours, but tagging it
//! into one word while keeping `Arc` made each of those operations a
//! dispatch on the kind: +17–25% instructions on bulk inserts (measured on
//! 2026-11-30). Hence a count of our own, with `Arc`'s memory orderings:
//! increments are `Relaxed` (a new reference is made from an existing one,
//! which keeps the node alive); the decrement is `Release` and the last one
//! is followed by an `Acquire` fence, so every use through other references
//! happens before the free. A release that finds the count at 1 (an
//! `Acquire` load) holds the only reference and frees without decrementing:
//! nothing else can touch the count, and the load orders earlier releases
//! before the free as the fence does. The uniqueness test is an `Acquire`
//! load, so writes made through references released since are visible
//! before the node is mutated in place.
//!
//! All of this module's unsafe code relies on one invariant: a `NodeRc<T>`
//! (and a `Child` tagged with `T`'s kind) points to a live `T` allocated by
//! [`alloc`] and owns one count of it.

use std::alloc::{handle_alloc_error, Layout};
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicUsize, Ordering};

use crate::node::{Leaf, NodeMut, D256, N16, N256, N4, N48};

/// Counts above this abort (as `std::sync::Arc` does): a leaked count must
/// not wrap around to zero and free a live node.
const MAX_COUNT: usize = isize::MAX as usize;

/// Where a node type keeps its count: [`FAR`] bytes before the node, or 8.
///
/// Far for the large kinds (node48, node256, delta): then the count is
/// never on the node's first cache line, which every lookup through the
/// node reads (its segment). Copying a parent, flattening a delta and
/// freeing a superseded version write the counts of the children they
/// share, and with the count on that line each such write took the line
/// from every other core reading through the child (KV95 with two
/// threads, design.md "Node layout"). Leaves and small nodes keep it
/// adjacent: 56 more bytes would double a node4 or a leaf.
pub(crate) trait Counted {
    const FAR: bool = false;
}

/// How far before a far node its count sits.
const FAR: usize = 64;

/// Tags from this one on are the far kinds ([`Child::gap`]).
const FAR_TAG: usize = 3;

/// The count's distance before a `T`.
const fn count_gap<T: Counted>() -> usize {
    if T::FAR {
        FAR
    } else {
        8
    }
}

/// The allocation for a `T`: the count at `node - count_gap`, the node at
/// `off`.
const fn layout<T: Counted>() -> (Layout, usize) {
    let align = if std::mem::align_of::<T>() > 8 {
        std::mem::align_of::<T>()
    } else {
        8
    };
    let off = count_gap::<T>().next_multiple_of(align);
    let size = (off + std::mem::size_of::<T>()).next_multiple_of(align);
    match Layout::from_size_align(size, align) {
        Ok(l) => (l, off),
        Err(_) => panic!("node layout"),
    }
}

/// Allocates a count of 1 and room for a `T` after it; returns the (not yet
/// initialised) node's address.
fn alloc<T: Counted>() -> NonNull<T> {
    let (layout, off) = layout::<T>();
    // SAFETY: the layout has a non-zero size (it holds the count).
    let base = unsafe { crate::big::alloc(layout) };
    if base.is_null() {
        handle_alloc_error(layout);
    }
    // SAFETY: `off >= count_gap` (a multiple of 8) and `off + size_of::<T>()
    // <= layout.size()`, so both the count at `off - count_gap` and the node
    // at `off` are in bounds and aligned (`off` is a multiple of both
    // alignments).
    unsafe {
        base.add(off - count_gap::<T>())
            .cast::<AtomicUsize>()
            .write(AtomicUsize::new(1));
        NonNull::new_unchecked(base.add(off).cast::<T>())
    }
}

/// The count of the node at `node`, `gap` bytes before it.
///
/// # Safety
/// `node` points to a node of a type `T` allocated by [`alloc`] that is
/// still live, and `gap` is `count_gap::<T>()`.
#[inline(always)]
unsafe fn count<'a>(node: *const u8, gap: usize) -> &'a AtomicUsize {
    // SAFETY: `alloc` put the count `count_gap` bytes before the node.
    unsafe { &*node.sub(gap).cast::<AtomicUsize>() }
}

/// Takes a new reference.
///
/// # Safety
/// As [`count`], and the caller holds a reference.
#[inline(always)]
unsafe fn incr(node: *const u8, gap: usize) {
    // SAFETY: forwarded.
    let old = unsafe { count(node, gap) }.fetch_add(1, Ordering::Relaxed);
    if old > MAX_COUNT {
        std::process::abort();
    }
}

/// Releases one reference; true when it was the last (after an `Acquire`
/// fence, so the caller may free the node).
///
/// # Safety
/// As [`count`], and the caller gives up the reference it holds.
#[inline(always)]
unsafe fn decr(node: *const u8, gap: usize) -> bool {
    // SAFETY: forwarded.
    let c = unsafe { count(node, gap) };
    // A count of 1 is the caller's own: no other reference exists to clone
    // or release it concurrently, so the last release needs no
    // read-modify-write (a locked instruction, ~20 cycles; freeing a
    // superseded version releases each of its nodes last). The `Acquire`
    // load reads the latest release, which orders every use through other
    // references before the free, as the fence below does.
    if c.load(Ordering::Acquire) == 1 {
        return true;
    }
    if c.fetch_sub(1, Ordering::Release) != 1 {
        return false;
    }
    fence(Ordering::Acquire);
    true
}

/// Drops the node at `node` and frees its allocation.
///
/// # Safety
/// `node` came from [`alloc::<T>`], is initialised, and nothing references
/// it any more.
unsafe fn free<T: Counted>(node: *mut T) {
    let (layout, off) = layout::<T>();
    // SAFETY: the caller owns the last reference to an initialised `T` in
    // an allocation of `layout` that starts `off` bytes before it.
    unsafe {
        std::ptr::drop_in_place(node);
        crate::big::dealloc(node.cast::<u8>().sub(off), layout);
    }
}

/// A counted node of a known kind (an `Arc` without a weak count, with the
/// count where [`Child`] expects it).
pub(crate) struct NodeRc<T: Counted> {
    ptr: NonNull<T>,
    _owns: PhantomData<T>,
}

// SAFETY: as `Arc<T>`: the node is shared between threads (`Sync`) and
// dropped by whichever holds the last reference (`Send`).
unsafe impl<T: Counted + Send + Sync> Send for NodeRc<T> {}
// SAFETY: as for `Send`.
unsafe impl<T: Counted + Send + Sync> Sync for NodeRc<T> {}

impl<T: Counted> NodeRc<T> {
    /// A node already built (see [`NodeRc::new_with`] to build one in
    /// place).
    pub(crate) fn new(node: T) -> Self {
        Self::new_with(|| node)
    }

    /// The node `make` returns, written straight into its allocation: the
    /// allocation comes first, so the compiler need not build the node on
    /// the stack and copy it (a delta's ~250 bytes on every copy). A panic
    /// in `make` leaks the allocation and nothing else.
    #[inline(always)]
    pub(crate) fn new_with(make: impl FnOnce() -> T) -> Self {
        let ptr = alloc::<T>();
        // SAFETY: `alloc` returned room for a `T`.
        unsafe { ptr.as_ptr().write(make()) };
        NodeRc {
            ptr,
            _owns: PhantomData,
        }
    }

    /// A node written in place by `fill` (a large node is not built on the
    /// stack and moved).
    ///
    /// # Safety
    /// `fill` initialises the whole `T` it is given, without unwinding.
    pub(crate) unsafe fn new_in_place(fill: impl FnOnce(*mut T)) -> UniqueRc<T> {
        let ptr = alloc::<T>();
        fill(ptr.as_ptr());
        UniqueRc(NodeRc {
            ptr,
            _owns: PhantomData,
        })
    }

    #[inline(always)]
    pub(crate) fn is_unique(this: &Self) -> bool {
        // SAFETY: `this` owns a count of a live node.
        unsafe { count(this.ptr.as_ptr().cast(), count_gap::<T>()) }.load(Ordering::Acquire) == 1
    }

    #[inline(always)]
    pub(crate) fn get_mut(this: &mut Self) -> Option<&mut T> {
        if Self::is_unique(this) {
            // SAFETY: the count is 1 and `this` holds it, so nothing else
            // reaches the node; `&mut this` excludes borrows through `this`.
            Some(unsafe { this.ptr.as_mut() })
        } else {
            None
        }
    }

    #[cfg(test)]
    pub(crate) fn ptr_eq(a: &Self, b: &Self) -> bool {
        a.ptr == b.ptr
    }

    /// The strong count (tests).
    #[cfg(test)]
    pub(crate) fn count(this: &Self) -> usize {
        // SAFETY: `this` owns a count of a live node.
        unsafe { count(this.ptr.as_ptr().cast(), count_gap::<T>()) }.load(Ordering::Acquire)
    }
}

impl<T: Counted> Deref for NodeRc<T> {
    type Target = T;
    #[inline(always)]
    fn deref(&self) -> &T {
        // SAFETY: the node lives while `self` holds a count.
        unsafe { self.ptr.as_ref() }
    }
}

impl<T: Counted> Clone for NodeRc<T> {
    #[inline(always)]
    fn clone(&self) -> Self {
        // SAFETY: `self` holds a count of a live node.
        unsafe { incr(self.ptr.as_ptr().cast(), count_gap::<T>()) };
        NodeRc {
            ptr: self.ptr,
            _owns: PhantomData,
        }
    }
}

impl<T: Counted> Drop for NodeRc<T> {
    #[inline(always)]
    fn drop(&mut self) {
        // SAFETY: `self` gives up its count; after the last one nothing
        // references the node, which `alloc::<T>` allocated.
        unsafe {
            if decr(self.ptr.as_ptr().cast(), count_gap::<T>()) {
                free(self.ptr.as_ptr());
            }
        }
    }
}

/// A [`NodeRc`] known to be the only reference: mutable until shared.
pub(crate) struct UniqueRc<T: Counted>(NodeRc<T>);

impl<T: Counted> UniqueRc<T> {
    pub(crate) fn shareable(self) -> NodeRc<T> {
        self.0
    }
}

impl<T: Counted> Deref for UniqueRc<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T: Counted> DerefMut for UniqueRc<T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: a `UniqueRc` is made from a fresh allocation and never
        // cloned, so its count is 1 and it is the only reference.
        unsafe { self.0.ptr.as_mut() }
    }
}

const TAG_BITS: usize = 0b111;

/// A node type a [`Child`] can point to, with its kind's tag.
pub(crate) trait Node<V>: Sized + Counted {
    const TAG: usize;
    /// Evaluated wherever a pointer is tagged: [`Child::gap`] finds the
    /// count's distance from the tag.
    const FAR_BY_TAG: () = assert!(Self::FAR == (Self::TAG >= FAR_TAG));
    /// Evaluated wherever a pointer is tagged: the tag needs the three low
    /// bits of an 8-aligned address.
    const ALIGNED: () = assert!(std::mem::align_of::<Self>() >= 8);
}

impl<V> Counted for Leaf<V> {}
impl<V> Counted for N4<V> {}
impl<V> Counted for N16<V> {}
impl<V> Counted for N48<V> {
    const FAR: bool = true;
}
impl<V> Counted for N256<V> {
    const FAR: bool = true;
}
impl<V> Counted for D256<V> {
    const FAR: bool = true;
}

impl<V> Node<V> for Leaf<V> {
    const TAG: usize = 0;
}
impl<V> Node<V> for N4<V> {
    const TAG: usize = 1;
}
impl<V> Node<V> for N16<V> {
    const TAG: usize = 2;
}
impl<V> Node<V> for N48<V> {
    const TAG: usize = 3;
}
impl<V> Node<V> for N256<V> {
    const TAG: usize = 4;
}
impl<V> Node<V> for D256<V> {
    const TAG: usize = 5;
}

/// A shared view of the node a [`Child`] points to. `repr(usize)` with the
/// tags as discriminants (RFC 2195 layout: the tag, then the reference), so
/// [`Child::kind`] is two bit operations, not a branch per kind.
#[repr(usize)]
#[allow(dead_code, reason = "built by `Child::kind` from a tagged pointer")]
pub(crate) enum Kind<'a, V> {
    Leaf(&'a Leaf<V>) = 0,
    N4(&'a N4<V>) = 1,
    N16(&'a N16<V>) = 2,
    N48(&'a N48<V>) = 3,
    N256(&'a N256<V>) = 4,
    D256(&'a D256<V>) = 5,
}

impl<V> Clone for Kind<'_, V> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<V> Copy for Kind<'_, V> {}

/// The layout of a `repr(usize)` enum whose variants each hold one
/// reference ([`Kind`], [`NodeMut`]).
#[repr(C)]
struct TagAndPtr {
    tag: usize,
    ptr: *const u8,
}

/// The counted nodes a [`Child`] stands for. It is the `PhantomData` of
/// `Child`, so `Child` is drop-checked, and `Send` and `Sync`, as this enum.
#[allow(dead_code)]
pub(crate) enum Owned<V> {
    Leaf(NodeRc<Leaf<V>>),
    N4(NodeRc<N4<V>>),
    N16(NodeRc<N16<V>>),
    N48(NodeRc<N48<V>>),
    N256(NodeRc<N256<V>>),
    D256(NodeRc<D256<V>>),
}

/// A counted pointer to a node of any kind (see the module docs).
///
/// Invariant: `ptr` is a [`NodeRc<T>`]'s node address, with `T::TAG` or-ed
/// into its low bits; the `Child` owns that count.
pub(crate) struct Child<V> {
    ptr: NonNull<u8>,
    _owns: PhantomData<Owned<V>>,
}

// SAFETY: a `Child` is one of the `NodeRc`s of `Owned` in another form; it
// is sent and shared only as they could be.
unsafe impl<V> Send for Child<V> where Owned<V>: Send {}
// SAFETY: as for `Send`.
unsafe impl<V> Sync for Child<V> where Owned<V>: Sync {}

impl<V> Child<V> {
    /// Takes over `rc`'s count.
    #[inline(always)]
    pub(crate) fn new<T: Node<V>>(rc: NodeRc<T>) -> Self {
        #[allow(clippy::let_unit_value)]
        let () = T::ALIGNED;
        #[allow(clippy::let_unit_value)]
        let () = T::FAR_BY_TAG;
        let raw = rc.ptr.as_ptr().cast::<u8>();
        std::mem::forget(rc);
        Child {
            // SAFETY: `raw` is non-null (a node address) and or-ing bits
            // into its address keeps it non-null.
            ptr: unsafe { NonNull::new_unchecked(raw.map_addr(|a| a | T::TAG)) },
            _owns: PhantomData,
        }
    }

    /// `count_gap` of the node's type (one compare: the far kinds have the
    /// highest tags, checked by `Node::FAR_BY_TAG`).
    #[inline(always)]
    fn gap(&self) -> usize {
        if self.tag() >= FAR_TAG {
            FAR
        } else {
            8
        }
    }

    #[inline(always)]
    fn tag(&self) -> usize {
        self.ptr.as_ptr().addr() & TAG_BITS
    }

    /// The node's address.
    #[inline(always)]
    fn node(&self) -> *const u8 {
        self.ptr.as_ptr().map_addr(|a| a & !TAG_BITS).cast_const()
    }

    /// A shared view of the node.
    #[inline(always)]
    pub(crate) fn kind(&self) -> Kind<'_, V> {
        let raw = TagAndPtr {
            tag: self.tag(),
            ptr: self.node(),
        };
        // SAFETY: `Kind` is `repr(usize)` with one reference per variant, so
        // its layout is `TagAndPtr` (RFC 2195); the tag is a discriminant of
        // `Kind` naming the type of the node at `ptr` (type invariant), which
        // lives while `self` holds its count: a shared borrow tied to
        // `&self` is valid.
        unsafe { std::mem::transmute::<TagAndPtr, Kind<'_, V>>(raw) }
    }

    #[inline(always)]
    pub(crate) fn is_leaf(&self) -> bool {
        self.tag() == <Leaf<V> as Node<V>>::TAG
    }

    /// Whether this is the only counted reference to the node.
    #[inline(always)]
    pub(crate) fn is_unique(&self) -> bool {
        // SAFETY: `self` holds a count of a live node.
        unsafe { count(self.node(), self.gap()) }.load(Ordering::Acquire) == 1
    }

    /// Exclusive access when nothing else counts a reference to the node.
    #[inline(always)]
    pub(crate) fn get_mut(&mut self) -> Option<NodeMut<'_, V>> {
        if !self.is_unique() {
            return None;
        }
        let raw = TagAndPtr {
            tag: self.tag(),
            ptr: self.node(),
        };
        // SAFETY: as in `kind` for the layout and the tag. The reference may
        // be exclusive: the count is 1 and `self` holds it (no other
        // `NodeRc`/`Child` reaches the node) and `&mut self` excludes
        // borrows through this one for the returned lifetime. (A node256
        // slot or a delta's patch may hold an uncounted copy of a child;
        // `slots.rs` and `patches.rs` take a count before such a child is
        // written, so it is never unique here.)
        Some(unsafe { std::mem::transmute::<TagAndPtr, NodeMut<'_, V>>(raw) })
    }

    /// A new reference to the node, if it is a node256.
    pub(crate) fn n256(&self) -> Option<NodeRc<N256<V>>> {
        self.rc()
    }

    /// A new reference to the node, if it is a delta node256.
    pub(crate) fn d256(&self) -> Option<NodeRc<D256<V>>> {
        self.rc()
    }

    fn rc<T: Node<V>>(&self) -> Option<NodeRc<T>> {
        if self.tag() != T::TAG {
            return None;
        }
        // SAFETY: the tag says the node is a `T` from a `NodeRc`; the count
        // taken here is the returned handle's.
        unsafe {
            incr(self.node(), self.gap());
            Some(NodeRc {
                ptr: NonNull::new_unchecked(self.node().cast::<T>().cast_mut()),
                _owns: PhantomData,
            })
        }
    }

    /// Both point to the same node.
    #[inline(always)]
    pub(crate) fn ptr_eq(&self, other: &Child<V>) -> bool {
        self.ptr == other.ptr
    }

    /// The node's strong count (tests).
    #[cfg(test)]
    pub(crate) fn strong_count(&self) -> usize {
        // SAFETY: `self` holds a count of a live node.
        unsafe { count(self.node(), self.gap()) }.load(Ordering::Acquire)
    }

    /// Frees the node once its last reference is gone.
    #[inline(never)]
    fn free(&mut self) {
        let p = self.node().cast_mut();
        // SAFETY (every arm): the caller released the last count, the tag
        // names the node's type, and `alloc` allocated it.
        unsafe {
            match self.tag() {
                0 => free(p.cast::<Leaf<V>>()),
                1 => free(p.cast::<N4<V>>()),
                2 => free(p.cast::<N16<V>>()),
                3 => free(p.cast::<N48<V>>()),
                4 => free(p.cast::<N256<V>>()),
                _ => free(p.cast::<D256<V>>()),
            }
        }
    }
}

impl<V> Clone for Child<V> {
    #[inline(always)]
    fn clone(&self) -> Self {
        // SAFETY: `self` holds a count of a live node; the new count is the
        // returned copy's.
        unsafe { incr(self.node(), self.gap()) };
        Child {
            ptr: self.ptr,
            _owns: PhantomData,
        }
    }
}

impl<V> Drop for Child<V> {
    #[inline(always)]
    fn drop(&mut self) {
        // SAFETY: `self` gives up its count.
        if unsafe { decr(self.node(), self.gap()) } {
            self.free();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_word_and_a_niche() {
        assert_eq!(std::mem::size_of::<Child<u64>>(), 8);
        assert_eq!(std::mem::size_of::<Option<Child<u64>>>(), 8);
        assert_eq!(std::mem::size_of::<Option<Child<[u8; 3]>>>(), 8);
    }

    #[test]
    fn clone_drop_and_uniqueness_track_the_count() {
        let mut a = Child::leaf(b"key", 7u8);
        assert!(a.is_unique());
        assert!(matches!(a.kind(), Kind::Leaf(l) if l.value == 7));
        let b = a.clone();
        assert!(a.ptr_eq(&b));
        assert_eq!(a.strong_count(), 2);
        assert!(!a.is_unique() && a.get_mut().is_none());
        drop(b);
        assert!(a.is_unique());
        match a.get_mut() {
            Some(NodeMut::Leaf(l)) => l.value = 9,
            _ => panic!("a unique leaf"),
        }
        assert!(matches!(a.kind(), Kind::Leaf(l) if l.value == 9 && &l.h.bytes[..] == b"key"));
        let inner = Child::<u8>::empty_inner(b"");
        assert!(matches!(inner.kind(), Kind::N4(_)));
        assert!(inner.n256().is_none());
    }

    /// Values aligned above 8 bytes: the count still sits right before the
    /// node, whose offset in its allocation grows to the alignment.
    #[test]
    fn overaligned_values() {
        #[derive(Clone, Debug, PartialEq)]
        #[repr(align(64))]
        struct Wide(u8);
        let a = Child::leaf(b"k", Wide(3));
        let b = a.clone();
        assert!(matches!(b.kind(), Kind::Leaf(l) if l.value == Wide(3)));
        assert_eq!(a.kind_addr() % 64, 0);
        drop(a);
        assert!(b.is_unique());
    }

    /// Counts `FAR` bytes before a node: clones, releases and the
    /// uniqueness test find them (ASan in `.ci/run` checks the addresses),
    /// also past a larger alignment; a `Child` of a far kind looks there.
    #[test]
    fn far_counts() {
        struct Big([u8; 300]);
        impl Counted for Big {
            const FAR: bool = true;
        }
        let a = NodeRc::new(Big([3; 300]));
        let b = a.clone();
        assert_eq!(NodeRc::count(&a), 2);
        assert!(!NodeRc::is_unique(&a));
        drop(b);
        assert!(NodeRc::is_unique(&a) && a.0[299] == 3);
        #[repr(align(128))]
        struct Wider([u8; 200]);
        impl Counted for Wider {
            const FAR: bool = true;
        }
        assert_eq!(layout::<Wider>().1, 128);
        let w = NodeRc::new(Wider([1; 200]));
        assert_eq!(w.ptr.as_ptr().addr() % 128, 0);
        let w2 = w.clone();
        assert_eq!(NodeRc::count(&w2), 2);
        drop(w);
        assert!(NodeRc::is_unique(&w2) && w2.0[199] == 1);
        // Every kind's tag agrees with where its count is.
        let n4 = Child::<u8>::empty_inner(b"");
        assert_eq!(n4.gap(), 8);
        assert_eq!(Child::leaf(b"k", [7u64; 32]).gap(), 8);
        for (tag, far) in [
            (<Leaf<u8> as Node<u8>>::TAG, <Leaf<u8> as Counted>::FAR),
            (<N4<u8> as Node<u8>>::TAG, <N4<u8> as Counted>::FAR),
            (<N16<u8> as Node<u8>>::TAG, <N16<u8> as Counted>::FAR),
            (<N48<u8> as Node<u8>>::TAG, <N48<u8> as Counted>::FAR),
            (<N256<u8> as Node<u8>>::TAG, <N256<u8> as Counted>::FAR),
            (<D256<u8> as Node<u8>>::TAG, <D256<u8> as Counted>::FAR),
        ] {
            assert_eq!(far, tag >= FAR_TAG, "tag {tag}");
        }
    }

    impl Counted for u64 {}

    #[test]
    fn node_rc_counts() {
        let mut a = NodeRc::new(5u64);
        assert_eq!(NodeRc::get_mut(&mut a).map(|v| *v), Some(5));
        let b = a.clone();
        assert!(NodeRc::ptr_eq(&a, &b));
        assert_eq!(NodeRc::count(&a), 2);
        assert!(NodeRc::get_mut(&mut a).is_none());
        drop(b);
        assert_eq!(NodeRc::count(&a), 1);
    }

    /// Counts drops of a value.
    struct Tracked(std::sync::Arc<AtomicUsize>);
    impl Drop for Tracked {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Clones and drops racing on one node from several threads: the count
    /// ends exact and the node (and its value) is freed exactly once.
    #[test]
    fn concurrent_clones_and_drops_free_once() {
        let drops = std::sync::Arc::new(AtomicUsize::new(0));
        let root = Child::leaf(b"k", Tracked(drops.clone()));
        std::thread::scope(|s| {
            for _ in 0..4 {
                let r = &root;
                s.spawn(move || {
                    let mut held = Vec::new();
                    for i in 0..20_000 {
                        held.push(r.clone());
                        if i % 3 == 0 {
                            held.clear();
                        }
                    }
                });
            }
        });
        assert_eq!(root.strong_count(), 1);
        assert_eq!(drops.load(Ordering::SeqCst), 0);
        drop(root);
        assert_eq!(drops.load(Ordering::SeqCst), 1);
    }

    impl<V> Child<V> {
        fn kind_addr(&self) -> usize {
            self.node().addr()
        }
    }
}
