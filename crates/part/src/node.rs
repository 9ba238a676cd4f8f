//! Node layout: leaves and the four inner kinds (node4, node16, node48, node256).
//!
//! A child pointer is a [`Child`]: one word, the node's address with its
//! kind in the low bits (`child.rs`), so an inner node is a single
//! allocation holding its header, its key index and its child array, and a
//! lookup takes one dependent load per level. A leaf stores its whole key;
//! an inner node stores only its compressed path segment, whose first byte
//! is the byte its parent indexes it by (the root's segment is a prefix
//! every key shares, empty in an empty tree). A
//! value whose key ends at an inner node is that node's `terminal` leaf, so
//! it has a watch of its own.

pub(crate) use crate::child::{Child, Kind, NodeRc};
use crate::lazy::LazyWatch;
use crate::patches::Patches;
use crate::simd;
use crate::slots::Slots256;
use crate::watch::WatchInner;

pub(crate) use crate::bytes::Bytes;

/// Node kinds grow when full (4 -> 16 -> 48 -> 256) ...
pub(crate) const N4_MAX: usize = 4;
pub(crate) const N16_MAX: usize = 16;
pub(crate) const N48_MAX: usize = 48;
/// ... and shrink only below these, so an insert/delete pair at a boundary
/// never flaps between two kinds.
pub(crate) const N16_MIN: usize = 4;
pub(crate) const N48_MIN: usize = 13;
pub(crate) const N256_MIN: usize = 38;

/// What every node starts with.
#[repr(C)]
pub(crate) struct Header {
    /// Leaf: the full key. Inner: this node's path segment.
    pub(crate) bytes: Bytes,
    pub(crate) watch: LazyWatch,
}

impl Header {
    #[inline]
    fn new(bytes: &[u8]) -> Self {
        Header {
            bytes: crate::bytes::small(bytes),
            watch: LazyWatch::new(),
        }
    }

    fn copy(&self) -> Self {
        Header {
            bytes: crate::bytes::small(&self.bytes),
            watch: LazyWatch::new(),
        }
    }
}

/// The value comes first so that a leaf's key sits at another offset than
/// an inner node's segment. A lookup then reads the two with different load
/// instructions, and the CPU's per-instruction stride prefetcher can follow
/// leaves read in key order. With the header first in both, the compiler
/// merged the two reads into one load, whose addresses alternate between
/// inner nodes and leaves: point reads in key order over 100k keys ran 2.3x
/// slower (statedb `FullIteration_Get`).
#[repr(C)]
pub(crate) struct Leaf<V> {
    pub(crate) value: V,
    pub(crate) h: Header,
}

#[repr(C)]
pub(crate) struct N4<V> {
    pub(crate) h: Header,
    pub(crate) terminal: Option<Child<V>>,
    pub(crate) len: u8,
    pub(crate) keys: [u8; 4],
    pub(crate) children: [Option<Child<V>>; 4],
}

#[repr(C)]
pub(crate) struct N16<V> {
    pub(crate) h: Header,
    pub(crate) terminal: Option<Child<V>>,
    pub(crate) len: u8,
    pub(crate) keys: [u8; 16],
    pub(crate) children: [Option<Child<V>>; 16],
}

#[repr(C)]
pub(crate) struct N48<V> {
    pub(crate) h: Header,
    pub(crate) terminal: Option<Child<V>>,
    pub(crate) len: u8,
    /// Byte -> slot + 1; 0 means absent.
    pub(crate) index: [u8; 256],
    pub(crate) children: [Option<Child<V>>; 48],
}

#[repr(C)]
pub(crate) struct N256<V> {
    pub(crate) h: Header,
    pub(crate) terminal: Option<Child<V>>,
    pub(crate) len: u16,
    /// May borrow children from an older node256: see `slots.rs`.
    pub(crate) slots: Slots256<V>,
}

/// Moves the empty last slot of `children` to `pos`, shifting the children
/// from `pos` on one place up. A loop of swaps: the arrays hold at most 16,
/// and a generic `rotate_right` call costs more than the moves (callgrind).
#[inline(always)]
fn open_gap<V>(children: &mut [Option<Child<V>>], pos: usize) {
    for i in (pos + 1..children.len()).rev() {
        children.swap(i, i - 1);
    }
}

/// Moves the empty slot at `pos` to the end of `children`, shifting the
/// children after it one place down (see [`open_gap`]).
#[inline(always)]
fn close_gap<V>(children: &mut [Option<Child<V>>], pos: usize) {
    for i in pos + 1..children.len() {
        children.swap(i - 1, i);
    }
}

/// Patches a [`D256`] holds before it is flattened into a node256.
pub(crate) const D256_MAX: usize = 16;

/// A node256 that a transaction changed in a few places: a shared, flat
/// `base` and up to [`D256_MAX`] patched bytes (a new child, or `None` for a
/// removed one). Copying a node256 for a write would take a reference on
/// each of its up to 256 children (and release as many when the old version
/// is freed); a delta takes one on the base, and its patches are mostly lent
/// by the version it was copied from (`patches.rs`). Lookups search the
/// patch keys, then read the patch or the base. Once full, the delta is
/// flattened into a private node256 (taking the base's children outright
/// when nothing else shares it).
///
/// `repr(C)`: the header and terminal where every kind has them, then
/// `base` and the patch keys, so that what a lookup reads of the delta
/// lies in its first 64 bytes (see `Patches`).
#[repr(C)]
pub(crate) struct D256<V> {
    pub(crate) h: Header,
    pub(crate) terminal: Option<Child<V>>,
    /// Flat; its header and terminal are not used.
    pub(crate) base: NodeRc<N256<V>>,
    pub(crate) p: Patches<V>,
    /// Children present (patches applied).
    pub(crate) len: u16,
}

impl<V> D256<V> {
    #[inline(always)]
    fn is_patched(&self, b: u8) -> bool {
        self.p.is_patched(b)
    }

    #[inline(always)]
    fn patch_index(&self, b: u8) -> Option<usize> {
        self.p.index(b)
    }

    /// Out of line: keeps the lookup loop over the flat kinds tight (a
    /// delta is a transitional state of a node256 under small writes).
    #[inline(never)]
    pub(crate) fn get(&self, b: u8) -> Option<&Child<V>> {
        match self.patch_index(b) {
            Some(i) => self.p.get(i),
            None => self.base.slots.get(b),
        }
    }

    /// The child at the first byte `>= pos`: the base's next child that no
    /// patch hides, or the next patched child, whichever comes first.
    #[inline(never)]
    fn next(&self, pos: usize) -> Option<(usize, &Child<V>)> {
        let mut from = pos;
        let base = loop {
            let hit = self
                .base
                .slots
                .array()
                .get(from..)?
                .iter()
                .enumerate()
                .find_map(|(i, c)| c.as_ref().map(|c| (from + i, c)));
            match hit {
                Some((b, _)) if self.is_patched(b as u8) => from = b + 1,
                other => break other,
            }
        };
        let patch = (0..self.p.len())
            .filter(|&i| self.p.key(i) as usize >= pos)
            .filter_map(|i| self.p.get(i).map(|c| (self.p.key(i) as usize, c)))
            .min_by_key(|(b, _)| *b);
        match (base, patch) {
            (Some(x), Some(y)) => Some(if y.0 < x.0 { y } else { x }),
            (x, y) => x.or(y),
        }
    }

    /// The child at the last byte `<= pos` (see [`D256::next`]).
    #[inline(never)]
    fn prev(&self, pos: usize) -> Option<(usize, &Child<V>)> {
        let pos = pos.min(255);
        let mut to = pos + 1;
        let base = loop {
            let hit = self.base.slots.array()[..to]
                .iter()
                .enumerate()
                .rev()
                .find_map(|(i, c)| c.as_ref().map(|c| (i, c)));
            match hit {
                Some((b, _)) if self.is_patched(b as u8) => to = b,
                other => break other,
            }
        };
        let patch = (0..self.p.len())
            .filter(|&i| self.p.key(i) as usize <= pos)
            .filter_map(|i| self.p.get(i).map(|c| (self.p.key(i) as usize, c)))
            .max_by_key(|(b, _)| *b);
        match (base, patch) {
            (Some(x), Some(y)) => Some(if y.0 > x.0 { y } else { x }),
            (x, y) => x.or(y),
        }
    }

    /// A delta with no patches over `base`, for a transaction's write.
    #[inline(never)]
    fn over(base: NodeRc<N256<V>>) -> Child<V>
    where
        V: Clone,
    {
        Child::new(NodeRc::new_with(|| D256 {
            h: base.h.copy(),
            terminal: base.terminal.clone(),
            len: base.len,
            p: Patches::new(),
            base,
        }))
    }

    /// A copy of this delta, which `this` points to.
    #[inline(never)]
    fn copy(&self, this: &Child<V>) -> Child<V>
    where
        V: Clone,
    {
        Child::new(NodeRc::new_with(|| D256 {
            h: self.h.copy(),
            terminal: self.terminal.clone(),
            len: self.len,
            p: self.p.copy(this),
            base: self.base.clone(),
        }))
    }

    /// Adds a patch for an unpatched byte; the caller checked for room.
    fn push_patch(&mut self, b: u8, c: Option<Child<V>>) -> usize {
        self.p.push(b, c)
    }

    fn is_full(&self) -> bool {
        self.p.is_full()
    }
}

/// Exclusive access to a node the transaction owns. `repr(usize)` with the
/// tags of `child.rs` as discriminants: a `Child` becomes one without a
/// branch.
#[repr(usize)]
#[allow(dead_code, reason = "built by `Child::get_mut` from a tagged pointer")]
pub(crate) enum NodeMut<'a, V> {
    Leaf(&'a mut Leaf<V>) = 0,
    N4(&'a mut N4<V>) = 1,
    N16(&'a mut N16<V>) = 2,
    N48(&'a mut N48<V>) = 3,
    N256(&'a mut N256<V>) = 4,
    D256(&'a mut D256<V>) = 5,
}

fn none_array<T, const N: usize>() -> [Option<T>; N] {
    std::array::from_fn(|_| None)
}

/// Clones the first `used` slots of a child array (the rest stay empty).
/// A plain loop: the array's own `clone` went through a per-element call.
#[inline(always)]
fn clone_slots<V, const N: usize>(
    src: &[Option<Child<V>>; N],
    used: usize,
) -> [Option<Child<V>>; N] {
    let mut out = none_array();
    for (o, s) in out[..used].iter_mut().zip(&src[..used]) {
        *o = s.clone();
    }
    out
}

macro_rules! each {
    ($self:expr, $n:ident => $e:expr) => {
        match $self.kind() {
            Kind::Leaf($n) => $e,
            Kind::N4($n) => $e,
            Kind::N16($n) => $e,
            Kind::N48($n) => $e,
            Kind::N256($n) => $e,
            Kind::D256($n) => $e,
        }
    };
}

macro_rules! each_inner {
    ($self:expr, $leaf:expr, $n:ident => $e:expr) => {
        match $self.kind() {
            Kind::Leaf(_) => $leaf,
            Kind::N4($n) => $e,
            Kind::N16($n) => $e,
            Kind::N48($n) => $e,
            Kind::N256($n) => $e,
            Kind::D256($n) => $e,
        }
    };
}

/// Reads through a view whose node word was loaded once: a lookup loop
/// that carries a `Kind` keeps the node in registers, where one that
/// carries a `&Child` may load the slot again at each level (fat LTO
/// compiled `Tree::get` that way: a second dependent load per level).
impl<'a, V> Kind<'a, V> {
    /// Lets `each!` and `each_inner!` take a view as they take a `Child`.
    #[inline(always)]
    fn kind(self) -> Self {
        self
    }

    #[inline(always)]
    pub(crate) fn header(self) -> &'a Header {
        each!(self, n => &n.h)
    }

    /// `bytes().len()`, without building the slice.
    #[inline(always)]
    pub(crate) fn seg_len(self) -> usize {
        self.header().bytes.len()
    }

    #[inline]
    pub(crate) fn terminal(self) -> Option<&'a Child<V>> {
        each_inner!(self, None, n => n.terminal.as_ref())
    }

    #[inline(always)]
    pub(crate) fn find_child(self, b: u8) -> Option<&'a Child<V>> {
        match self {
            Kind::Leaf(_) => None,
            Kind::N4(n) => {
                let len = n.len as usize;
                let mut i = 0;
                while i < len {
                    if n.keys[i] == b {
                        return n.children[i].as_ref();
                    }
                    i += 1;
                }
                None
            }
            Kind::N16(n) => n.children[simd::find16(&n.keys, n.len as usize, b)?].as_ref(),
            Kind::N48(n) => match n.index[b as usize] {
                0 => None,
                s => n.children[s as usize - 1].as_ref(),
            },
            Kind::N256(n) => n.slots.get(b),
            Kind::D256(n) => n.get(b),
        }
    }
}

impl<V> Child<V> {
    #[inline]
    pub(crate) fn leaf(key: &[u8], value: V) -> Self {
        Child::new(NodeRc::new_with(|| Leaf {
            h: Header::new(key),
            value,
        }))
    }

    /// A copy of the leaf `l` for an insert that pushes it down: same key
    /// and value, and a watch slot from [`LazyWatch::successor`]; also
    /// returns what that chained.
    pub(crate) fn pushed_leaf(l: &Leaf<V>) -> (Self, usize)
    where
        V: Clone,
    {
        let (watch, chained) = l.h.watch.successor();
        let leaf = Child::new(NodeRc::new_with(|| Leaf {
            h: Header {
                bytes: crate::bytes::small(&l.h.bytes),
                watch,
            },
            value: l.value.clone(),
        }));
        (leaf, chained)
    }

    /// A private copy of this shared inner node for a write that keeps
    /// its contents and changes only its segment, to `seg`: its watch
    /// chains this node's (`LazyWatch::successor`); also returns the
    /// chained watch's address, as [`Child::pushed_leaf`] does.
    pub(crate) fn moved_inner(&self, seg: Bytes) -> (Self, usize)
    where
        V: Clone,
    {
        let (watch, chained) = self.header().watch.successor();
        let mut copy = self.copy_for_write();
        if let Some(n) = copy.get_mut() {
            *n.header_mut() = Header { bytes: seg, watch };
        }
        (copy, chained)
    }

    pub(crate) fn empty_inner(segment: &[u8]) -> Self {
        Child::new(NodeRc::new_with(|| N4 {
            h: Header::new(segment),
            terminal: None,
            len: 0,
            keys: [0; 4],
            children: none_array(),
        }))
    }

    #[inline(always)]
    pub(crate) fn header(&self) -> &Header {
        self.kind().header()
    }

    // Not `self.kind().bytes()`, though it reads the same: under fat LTO
    // that form took `get` from 74.2k to 98.1k instructions per 1000
    // lookups (callgrind, 2026-12-02).
    #[inline(always)]
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.header().bytes
    }

    /// `bytes().len()`, without building the slice.
    #[inline(always)]
    pub(crate) fn seg_len(&self) -> usize {
        self.header().bytes.len()
    }

    /// Whether this node's key (a leaf) or segment equals `key`.
    #[inline(always)]
    pub(crate) fn bytes_eq(&self, key: &[u8]) -> bool {
        self.header().bytes.eq_key(key)
    }

    #[inline(always)]
    pub(crate) fn leaf_value(&self) -> Option<&V> {
        match self.kind() {
            Kind::Leaf(l) => Some(&l.value),
            _ => None,
        }
    }

    #[inline]
    pub(crate) fn terminal(&self) -> Option<&Child<V>> {
        self.kind().terminal()
    }

    /// Number of children, the terminal not counted.
    #[inline]
    pub(crate) fn num_children(&self) -> usize {
        each_inner!(self, 0, n => n.len as usize)
    }

    #[inline(always)]
    pub(crate) fn find_child(&self, b: u8) -> Option<&Child<V>> {
        self.kind().find_child(b)
    }

    /// The child at the first position `>= pos` (positions are array slots
    /// for node4/node16 and bytes for node48/node256), with that position.
    #[inline]
    pub(crate) fn next_child(&self, pos: usize) -> Option<(usize, &Child<V>)> {
        match self.kind() {
            Kind::Leaf(_) => None,
            Kind::N4(n) => n.children[..n.len as usize]
                .get(pos)
                .and_then(Option::as_ref)
                .map(|c| (pos, c)),
            Kind::N16(n) => n.children[..n.len as usize]
                .get(pos)
                .and_then(Option::as_ref)
                .map(|c| (pos, c)),
            Kind::N48(n) => (pos..256).find_map(|b| match n.index[b] {
                0 => None,
                s => n.children[s as usize - 1].as_ref().map(|c| (b, c)),
            }),
            Kind::N256(n) => n
                .slots
                .array()
                .get(pos..)?
                .iter()
                .enumerate()
                .find_map(|(i, c)| c.as_ref().map(|c| (pos + i, c))),
            Kind::D256(n) => n.next(pos),
        }
    }

    /// The child at the last position `<= pos`, with that position.
    #[inline]
    pub(crate) fn prev_child(&self, pos: usize) -> Option<(usize, &Child<V>)> {
        match self.kind() {
            Kind::Leaf(_) => None,
            Kind::N4(n) => {
                let p = pos.min((n.len as usize).checked_sub(1)?);
                n.children[p].as_ref().map(|c| (p, c))
            }
            Kind::N16(n) => {
                let p = pos.min((n.len as usize).checked_sub(1)?);
                n.children[p].as_ref().map(|c| (p, c))
            }
            Kind::N48(n) => (0..=pos.min(255)).rev().find_map(|b| match n.index[b] {
                0 => None,
                s => n.children[s as usize - 1].as_ref().map(|c| (b, c)),
            }),
            Kind::N256(n) => (0..=pos.min(255))
                .rev()
                .find_map(|b| n.slots.array()[b].as_ref().map(|c| (b, c))),
            Kind::D256(n) => n.prev(pos),
        }
    }

    /// The position of the first child whose byte is `>= b`, or one past the end.
    #[inline]
    pub(crate) fn position_ge(&self, b: u8) -> usize {
        match self.kind() {
            Kind::Leaf(_) => 0,
            Kind::N4(n) => n.keys[..n.len as usize]
                .iter()
                .position(|&k| k >= b)
                .unwrap_or(n.len as usize),
            Kind::N16(n) => simd::lower_bound16(&n.keys, n.len as usize, b),
            Kind::N48(_) | Kind::N256(_) | Kind::D256(_) => b as usize,
        }
    }

    /// The first position holding a child whose byte is `> b`.
    #[inline]
    pub(crate) fn position_after(&self, b: u8) -> usize {
        match self.kind() {
            Kind::N48(_) | Kind::N256(_) | Kind::D256(_) => b as usize + 1,
            _ => self.position_ge(b) + usize::from(self.find_child(b).is_some()),
        }
    }

    /// The last position that can hold a child whose byte is `< b`.
    #[inline]
    pub(crate) fn position_before(&self, b: u8) -> Option<usize> {
        match self.kind() {
            Kind::N48(_) | Kind::N256(_) | Kind::D256(_) => (b as usize).checked_sub(1),
            _ => self.position_ge(b).checked_sub(1),
        }
    }

    /// Largest possible position; `prev_child(last_position())` is the last child.
    #[inline]
    pub(crate) fn last_position(&self) -> usize {
        match self.kind() {
            Kind::N48(_) | Kind::N256(_) | Kind::D256(_) => 255,
            _ => self.num_children().saturating_sub(1),
        }
    }

    /// The smallest byte that has a child.
    pub(crate) fn first_child_byte(&self) -> Option<u8> {
        match self.kind() {
            Kind::Leaf(_) => None,
            Kind::N4(n) => (n.len > 0).then(|| n.keys[0]),
            Kind::N16(n) => (n.len > 0).then(|| n.keys[0]),
            Kind::N48(n) => n.index.iter().position(|&s| s != 0).map(|b| b as u8),
            Kind::N256(n) => n
                .slots
                .array()
                .iter()
                .position(Option::is_some)
                .map(|b| b as u8),
            Kind::D256(_) => self.next_child(0).map(|(b, _)| b as u8),
        }
    }

    /// The key byte this node is indexed by in its parent, at depth `depth`.
    #[inline]
    pub(crate) fn index_byte(&self, depth: usize) -> u8 {
        match self.kind() {
            Kind::Leaf(l) => l.h.bytes[depth],
            _ => self.bytes()[0],
        }
    }

    /// The node's segment when it sits at `depth`.
    #[inline]
    pub(crate) fn segment(&self, depth: usize) -> &[u8] {
        match self.kind() {
            Kind::Leaf(l) => &l.h.bytes[depth..],
            _ => self.bytes(),
        }
    }

    /// A shallow copy: children are shared, the watch slot is fresh. Out of
    /// line: inlined into `make_mut`, the child-array clones compiled to a
    /// generic per-element loop (+24% on a one-key transaction).
    #[inline(never)]
    pub(crate) fn copy(&self) -> Child<V>
    where
        V: Clone,
    {
        match self.kind() {
            Kind::Leaf(n) => Child::new(NodeRc::new_with(|| Leaf {
                h: n.h.copy(),
                value: n.value.clone(),
            })),
            Kind::N4(n) => Child::new(NodeRc::new_with(|| N4 {
                h: n.h.copy(),
                terminal: n.terminal.clone(),
                len: n.len,
                keys: n.keys,
                children: clone_slots(&n.children, n.len as usize),
            })),
            Kind::N16(n) => Child::new(NodeRc::new_with(|| N16 {
                h: n.h.copy(),
                terminal: n.terminal.clone(),
                len: n.len,
                keys: n.keys,
                children: clone_slots(&n.children, n.len as usize),
            })),
            Kind::N48(n) => Child::new(NodeRc::new_with(|| N48 {
                h: n.h.copy(),
                terminal: n.terminal.clone(),
                len: n.len,
                index: n.index,
                children: clone_slots(&n.children, N48_MAX),
            })),
            Kind::N256(n) => Child::new(NodeRc::new_with(|| N256 {
                h: n.h.copy(),
                terminal: n.terminal.clone(),
                len: n.len,
                slots: Slots256::from_array(n.slots.clone_owned()),
            })),
            Kind::D256(n) => n.copy(self),
        }
    }

    /// The private copy a transaction writes into: as [`Child::copy`], but
    /// a node256 becomes a delta over the shared original (one reference
    /// taken instead of one per child).
    pub(crate) fn copy_for_write(&self) -> Child<V>
    where
        V: Clone,
    {
        match self.n256() {
            Some(base) => D256::over(base),
            None => self.copy(),
        }
    }

    /// Turns a private delta into a private flat node256 (no-op for other
    /// kinds).
    #[inline(never)]
    pub(crate) fn flatten(&mut self) {
        let Some(NodeMut::D256(d)) = self.get_mut() else {
            return;
        };
        let h = Header {
            bytes: std::mem::take(&mut d.h.bytes),
            watch: LazyWatch::new(),
        };
        let (terminal, len) = (d.terminal.take(), d.len);
        let flat = match NodeRc::get_mut(&mut d.base) {
            // Nothing else shares the base: it becomes the flat node, in place.
            Some(base) => {
                base.h = h;
                base.terminal = terminal;
                base.len = len;
                for i in 0..d.p.len() {
                    base.slots.put(d.p.key(i), d.p.take(i));
                }
                d.base.clone()
            }
            // Filled in its own allocation (a filled 4 KiB array built on
            // the stack was copied twice), borrowing the base's children
            // rather than taking a reference on each (see `slots.rs`).
            None => {
                let mut flat = Slots256::new_borrowing(h, terminal, len, &d.base);
                for i in 0..d.p.len() {
                    flat.slots.put(d.p.key(i), d.p.take(i));
                }
                flat.shareable()
            }
        };
        *self = Child::new(flat);
    }

    /// The byte of a node4's only entry when that is an inner node (no
    /// terminal, one child that is not a leaf).
    #[inline]
    pub(crate) fn lone_inner_child(&self) -> Option<u8> {
        match self.kind() {
            Kind::N4(n) if n.len == 1 && n.terminal.is_none() => {
                n.children[0].as_ref().filter(|c| !c.is_leaf())?;
                Some(n.keys[0])
            }
            _ => None,
        }
    }

    /// Flattens a private delta that has no room left to patch byte `b`
    /// (no-op for other kinds, or when `b` is already patched).
    pub(crate) fn room_for_patch(&mut self, b: u8) {
        if let Kind::D256(d) = self.kind() {
            if d.is_full() && !d.is_patched(b) {
                self.flatten();
            }
        }
    }

    /// Whether this private node holds the child under `b` without a
    /// reference of its own: a node256's borrowed slot (see `slots.rs`), a
    /// delta's unpatched byte (the base's child) or lent patch (see
    /// `patches.rs`). Such a child can be replaced or removed without
    /// touching its count. Call after [`Child::room_for_patch`], which may
    /// turn a delta into a node256.
    #[inline]
    pub(crate) fn borrows_child(&self, b: u8) -> bool {
        match self.kind() {
            Kind::N256(n) => n.slots.is_borrowed(b),
            Kind::D256(d) => d.patch_index(b).is_none_or(|i| d.p.is_lent(i)),
            _ => false,
        }
    }

    /// Stores `c` (a replacement, or `None` to unlink) under `b`, whose
    /// child this private node borrows ([`Child::borrows_child`]); the old
    /// child stays with its owner.
    #[inline]
    pub(crate) fn replace_borrowed(&mut self, b: u8, c: Option<Child<V>>) {
        let unlink = c.is_none();
        match self.get_mut() {
            Some(NodeMut::N256(n)) => {
                n.len -= u16::from(unlink);
                n.slots.put(b, c);
            }
            Some(NodeMut::D256(d)) => {
                d.len -= u16::from(unlink);
                match d.patch_index(b) {
                    Some(i) => d.p.set(i, c),
                    None => {
                        d.push_patch(b, c);
                    }
                }
            }
            _ => {}
        }
    }

    /// Unlinks the leaf under `b` from this private node, shrinking the
    /// kind below its threshold. Returns a clone of its value, and the leaf
    /// itself when the node owned it or `keep` asks for it (to close its
    /// watch after commit). A leaf the node borrows
    /// ([`Child::borrows_child`]) is unlinked without touching its count.
    pub(crate) fn remove_leaf(&mut self, b: u8, keep: bool) -> Option<(V, Option<Child<V>>)>
    where
        V: Clone,
    {
        self.room_for_patch(b);
        let out = if self.borrows_child(b) {
            let c = self.find_child(b)?;
            let out = (c.leaf_value()?.clone(), keep.then(|| c.clone()));
            self.replace_borrowed(b, None);
            out
        } else {
            let c = self.get_mut()?.remove_child(b)?;
            let value = match c.leaf_value() {
                Some(v) => v.clone(),
                None => unreachable!("callers unlink leaves only"),
            };
            (value, Some(c))
        };
        self.maybe_shrink();
        Some(out)
    }

    /// [`Child::remove_leaf`] in one step for its common case: a private
    /// flat node256 that keeps at least its minimum of children (no shrink,
    /// and no merge for the caller's `normalize`). `None`, changing
    /// nothing, otherwise. A random delete's miss on the leaf overlaps the
    /// next delete's walk only if the instructions between the two fit the
    /// CPU's reorder window: the general path's repeated dispatch on the
    /// kind took ~135 instructions here.
    #[inline]
    pub(crate) fn remove_leaf_flat(&mut self, b: u8, keep: bool) -> Option<(V, Option<Child<V>>)>
    where
        V: Clone,
    {
        let n = self.flat256_mut()?;
        if usize::from(n.len) <= N256_MIN {
            return None;
        }
        let out = n.slots.unlink_leaf(b, keep)?;
        n.len -= 1;
        Some(out)
    }

    /// The node as a flat node256, if it is one and private.
    #[inline(always)]
    pub(crate) fn flat256_mut(&mut self) -> Option<&mut N256<V>> {
        match self.get_mut() {
            Some(NodeMut::N256(n)) => Some(n),
            _ => None,
        }
    }

    /// Exclusive access to the child under `b` of this private node (a
    /// delta gets a patch for it, flattening first when full).
    pub(crate) fn child_mut(&mut self, b: u8) -> Option<&mut Child<V>> {
        self.room_for_patch(b);
        self.get_mut()?.child_mut(b)
    }

    fn capacity(&self) -> usize {
        match self.kind() {
            Kind::Leaf(_) => 0,
            Kind::N4(_) => N4_MAX,
            Kind::N16(_) => N16_MAX,
            Kind::N48(_) => N48_MAX,
            Kind::N256(_) | Kind::D256(_) => 256,
        }
    }

    /// Adds a child under a byte that is not present yet, growing the kind
    /// when full. The node must be private to the caller.
    #[inline]
    pub(crate) fn add_child(&mut self, b: u8, child: Child<V>) {
        self.room_for_patch(b);
        if self.num_children() == self.capacity() {
            self.grow();
        }
        if let Some(n) = self.get_mut() {
            n.add_child(b, child);
        }
    }

    /// Removes the child under `b`, shrinking the kind below its threshold.
    /// The node must be private to the caller.
    pub(crate) fn remove_child(&mut self, b: u8) -> Option<Child<V>>
    where
        V: Clone,
    {
        self.room_for_patch(b);
        let removed = self.get_mut()?.remove_child(b)?;
        self.maybe_shrink();
        Some(removed)
    }

    /// Places `child` under this (private) node whose children start at
    /// `depth`: as the terminal when its key ends there, else under its byte.
    pub(crate) fn place(&mut self, depth: usize, child: Child<V>) {
        if child.is_leaf() && child.seg_len() == depth {
            if let Some(t) = self.get_mut().and_then(NodeMut::terminal_mut) {
                *t = Some(child);
            }
        } else {
            let b = child.index_byte(depth);
            self.add_child(b, child);
        }
    }

    /// Moves to the next larger kind, transferring children directly.
    #[inline(never)]
    fn grow(&mut self) {
        let new = match self.get_mut() {
            Some(NodeMut::N4(n)) => {
                let mut m = N16 {
                    h: Header {
                        bytes: std::mem::take(&mut n.h.bytes),
                        watch: LazyWatch::new(),
                    },
                    terminal: n.terminal.take(),
                    len: n.len,
                    keys: [0; 16],
                    children: none_array(),
                };
                let len = n.len as usize;
                m.keys[..len].copy_from_slice(&n.keys[..len]);
                for i in 0..len {
                    m.children[i] = n.children[i].take();
                }
                Child::new(NodeRc::new(m))
            }
            Some(NodeMut::N16(n)) => {
                let mut m = N48 {
                    h: Header {
                        bytes: std::mem::take(&mut n.h.bytes),
                        watch: LazyWatch::new(),
                    },
                    terminal: n.terminal.take(),
                    len: n.len,
                    index: [0; 256],
                    children: none_array(),
                };
                for i in 0..n.len as usize {
                    m.index[n.keys[i] as usize] = i as u8 + 1;
                    m.children[i] = n.children[i].take();
                }
                Child::new(NodeRc::new(m))
            }
            Some(NodeMut::N48(n)) => {
                let h = Header {
                    bytes: std::mem::take(&mut n.h.bytes),
                    watch: LazyWatch::new(),
                };
                let mut m = Slots256::new_node(h, n.terminal.take(), n.len as u16);
                for b in 0..=255u8 {
                    let s = n.index[b as usize];
                    if s != 0 {
                        if let Some(c) = n.children[s as usize - 1].take() {
                            m.slots.put_empty(b, c);
                        }
                    }
                }
                Child::new(m.shareable())
            }
            _ => return,
        };
        *self = new;
    }

    /// Moves to the next smaller kind once the count falls below the
    /// hysteresis threshold. The test is inlined and the work is not: most
    /// removals leave the node above its kind's minimum.
    #[inline]
    fn maybe_shrink(&mut self) {
        let n = self.num_children();
        let below = match self.kind() {
            Kind::N16(_) => n < N16_MIN,
            Kind::N48(_) => n < N48_MIN,
            Kind::N256(_) | Kind::D256(_) => n < N256_MIN,
            Kind::Leaf(_) | Kind::N4(_) => false,
        };
        if below {
            self.shrink(n);
        }
    }

    /// Replaces this private node, which holds `n` children, fewer than its
    /// kind's minimum, by one of the next smaller kind.
    #[inline(never)]
    fn shrink(&mut self, n: usize) {
        let new = match self.get_mut() {
            Some(NodeMut::N16(x)) => {
                let mut m = N4 {
                    h: Header {
                        bytes: std::mem::take(&mut x.h.bytes),
                        watch: LazyWatch::new(),
                    },
                    terminal: x.terminal.take(),
                    len: x.len,
                    keys: [0; 4],
                    children: none_array(),
                };
                m.keys[..n].copy_from_slice(&x.keys[..n]);
                for i in 0..n {
                    m.children[i] = x.children[i].take();
                }
                Child::new(NodeRc::new(m))
            }
            Some(NodeMut::N48(x)) => {
                let mut m = N16 {
                    h: Header {
                        bytes: std::mem::take(&mut x.h.bytes),
                        watch: LazyWatch::new(),
                    },
                    terminal: x.terminal.take(),
                    len: 0,
                    keys: [0; 16],
                    children: none_array(),
                };
                for b in 0..256 {
                    let s = x.index[b];
                    if s != 0 {
                        let i = m.len as usize;
                        m.keys[i] = b as u8;
                        m.children[i] = x.children[s as usize - 1].take();
                        m.len += 1;
                    }
                }
                Child::new(NodeRc::new(m))
            }
            // Both visit only the bytes that may hold a child (the presence
            // map, and a delta's patches), in byte order.
            Some(NodeMut::D256(x)) => {
                let mut m = n48_empty(&mut x.h, x.terminal.take());
                let base = x.base.slots.present();
                let patched = x.p.patched();
                let bits: [u64; 4] = std::array::from_fn(|w| base[w] | patched[w]);
                crate::slots::each_bit(bits, |b| {
                    let b = b as u8;
                    let c = match x.patch_index(b) {
                        Some(i) => x.p.take(i),
                        None => x.base.slots.get(b).cloned(),
                    };
                    if let Some(c) = c {
                        n48_push(&mut m, b, c);
                    }
                });
                Child::new(NodeRc::new(m))
            }
            Some(NodeMut::N256(x)) => {
                let mut m = n48_empty(&mut x.h, x.terminal.take());
                let slots = &mut x.slots;
                crate::slots::each_bit(slots.present(), |b| {
                    if let Some(c) = slots.take(b as u8) {
                        n48_push(&mut m, b as u8, c);
                    }
                });
                Child::new(NodeRc::new(m))
            }
            _ => return,
        };
        *self = new;
    }
}

/// An empty node48 under the segment taken from `h` (a node256 or delta
/// shrinking); [`n48_push`] fills it in byte order.
fn n48_empty<V>(h: &mut Header, terminal: Option<Child<V>>) -> N48<V> {
    N48 {
        h: Header {
            bytes: std::mem::take(&mut h.bytes),
            watch: LazyWatch::new(),
        },
        terminal,
        len: 0,
        index: [0; 256],
        children: none_array(),
    }
}

/// Appends child `c` under byte `b` (the caller has fewer than 48).
fn n48_push<V>(m: &mut N48<V>, b: u8, c: Child<V>) {
    let i = m.len as usize;
    m.children[i] = Some(c);
    m.index[b as usize] = i as u8 + 1;
    m.len += 1;
}

impl<'a, V> NodeMut<'a, V> {
    pub(crate) fn header_mut(self) -> &'a mut Header {
        match self {
            NodeMut::Leaf(n) => &mut n.h,
            NodeMut::N4(n) => &mut n.h,
            NodeMut::N16(n) => &mut n.h,
            NodeMut::N48(n) => &mut n.h,
            NodeMut::N256(n) => &mut n.h,
            NodeMut::D256(n) => &mut n.h,
        }
    }

    pub(crate) fn take_watch(self) -> Option<std::sync::Arc<WatchInner>> {
        self.header_mut().watch.take()
    }

    pub(crate) fn terminal_mut(self) -> Option<&'a mut Option<Child<V>>> {
        match self {
            NodeMut::Leaf(_) => None,
            NodeMut::N4(n) => Some(&mut n.terminal),
            NodeMut::N16(n) => Some(&mut n.terminal),
            NodeMut::N48(n) => Some(&mut n.terminal),
            NodeMut::N256(n) => Some(&mut n.terminal),
            NodeMut::D256(n) => Some(&mut n.terminal),
        }
    }

    pub(crate) fn child_mut(self, b: u8) -> Option<&'a mut Child<V>> {
        match self {
            NodeMut::Leaf(_) => None,
            NodeMut::N4(n) => {
                let i = n.keys[..n.len as usize].iter().position(|&k| k == b)?;
                n.children[i].as_mut()
            }
            NodeMut::N16(n) => {
                let i = simd::find16(&n.keys, n.len as usize, b)?;
                n.children[i].as_mut()
            }
            NodeMut::N48(n) => match n.index[b as usize] {
                0 => None,
                s => n.children[s as usize - 1].as_mut(),
            },
            NodeMut::N256(n) => n.slots.get_mut(b),
            NodeMut::D256(n) => {
                let i = match n.patch_index(b) {
                    Some(i) => i,
                    None => {
                        let c = n.base.slots.get(b).cloned()?;
                        if n.is_full() {
                            return None; // `Child::child_mut` flattens first
                        }
                        n.push_patch(b, Some(c))
                    }
                };
                n.p.get_mut(i)
            }
        }
    }

    /// Exclusive access to the child under `b` when the node can give it
    /// without changing: `None` when there is none, when a node256 borrows
    /// it, or when a delta has no patch for it (both would first take a
    /// reference of their own, as [`NodeMut::child_mut`] does).
    #[inline]
    pub(crate) fn owned_child_mut(self, b: u8) -> Option<&'a mut Child<V>> {
        match self {
            NodeMut::N256(n) => n.slots.get_mut_owned(b),
            NodeMut::D256(n) => {
                let i = n.patch_index(b)?;
                n.p.get_mut_owned(i)
            }
            other => other.child_mut(b),
        }
    }

    /// Adds a child to a node with room for it.
    fn add_child(self, b: u8, child: Child<V>) {
        match self {
            NodeMut::Leaf(_) => {}
            NodeMut::N4(n) => {
                let len = n.len as usize;
                let pos = n.keys[..len].iter().position(|&k| k > b).unwrap_or(len);
                n.keys.copy_within(pos..len, pos + 1);
                open_gap(&mut n.children[..=len], pos);
                n.keys[pos] = b;
                n.children[pos] = Some(child);
                n.len += 1;
            }
            NodeMut::N16(n) => {
                let len = n.len as usize;
                let pos = simd::lower_bound16(&n.keys, len, b);
                n.keys.copy_within(pos..len, pos + 1);
                open_gap(&mut n.children[..=len], pos);
                n.keys[pos] = b;
                n.children[pos] = Some(child);
                n.len += 1;
            }
            NodeMut::N48(n) => {
                // Slots fill in order until a removal frees one: try `len`
                // before scanning.
                let len = n.len as usize;
                let free = if n.children.get(len).is_some_and(Option::is_none) {
                    Some(len)
                } else {
                    n.children.iter().position(Option::is_none)
                };
                if let Some(slot) = free {
                    n.children[slot] = Some(child);
                    n.index[b as usize] = slot as u8 + 1;
                    n.len += 1;
                }
            }
            NodeMut::N256(n) => {
                n.slots.put_empty(b, child);
                n.len += 1;
            }
            NodeMut::D256(n) => {
                match n.patch_index(b) {
                    Some(i) => n.p.set(i, Some(child)),
                    // `Child::add_child` flattened a full delta first.
                    None => {
                        n.push_patch(b, Some(child));
                    }
                }
                n.len += 1;
            }
        }
    }

    fn remove_child(self, b: u8) -> Option<Child<V>>
    where
        V: Clone,
    {
        match self {
            NodeMut::Leaf(_) => None,
            NodeMut::N4(n) => {
                let len = n.len as usize;
                let pos = n.keys[..len].iter().position(|&k| k == b)?;
                let c = n.children[pos].take();
                n.keys.copy_within(pos + 1..len, pos);
                close_gap(&mut n.children[..len], pos);
                n.len -= 1;
                c
            }
            NodeMut::N16(n) => {
                let len = n.len as usize;
                let pos = simd::find16(&n.keys, len, b)?;
                let c = n.children[pos].take();
                n.keys.copy_within(pos + 1..len, pos);
                close_gap(&mut n.children[..len], pos);
                n.len -= 1;
                c
            }
            NodeMut::N48(n) => {
                let s = std::mem::take(&mut n.index[b as usize]);
                if s == 0 {
                    return None;
                }
                n.len -= 1;
                n.children[s as usize - 1].take()
            }
            NodeMut::N256(n) => {
                let c = n.slots.take(b)?;
                n.len -= 1;
                Some(c)
            }
            NodeMut::D256(n) => {
                let c = match n.patch_index(b) {
                    Some(i) => n.p.take(i)?,
                    None => {
                        // A tombstone hides the base's child; `Child::
                        // remove_child` flattened a full delta first.
                        let c = n.base.slots.get(b).cloned()?;
                        n.push_patch(b, None);
                        c
                    }
                };
                n.len -= 1;
                Some(c)
            }
        }
    }
}

std::thread_local! {
    /// How many inner-node drops are running on this thread's stack.
    static DROP_DEPTH: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Inner-node drops nest at most this deep before switching to a work list.
const DROP_RECURSION: u32 = 64;

/// Drops a node's children. Shallow trees (the usual case) drop
/// recursively with no extra pass; past `DROP_RECURSION` nested drops, inner
/// children that nothing else references move to a work list and are taken
/// apart one by one, so a tree as deep as its longest key cannot overflow
/// the stack. Every slot is empty afterwards.
pub(crate) fn drop_children<V>(slots: &mut [Option<Child<V>>]) {
    drop_children_with(
        slots,
        |s| {
            for slot in s.iter_mut() {
                drop(slot.take());
            }
        },
        |_| {},
    );
}

/// [`drop_children`] for a node256 array that holds a reference for the
/// set bits of `owned` and bitwise copies it must not drop for those of
/// `borrowed` (see `slots.rs`). The usual, shallow case visits only the
/// owned slots and leaves the copies where they are (the array is never
/// dropped as a whole): forgetting them one by one wrote up to 2 KiB per
/// node freed, once per flattened delta.
pub(crate) fn drop_slots256<V>(
    slots: &mut [Option<Child<V>>; 256],
    owned: [u64; 4],
    borrowed: [u64; 4],
) {
    use crate::slots::each_bit;
    drop_children_with(
        slots,
        |s| each_bit(owned, |i| drop(s[i].take())),
        |s| each_bit(borrowed, |i| std::mem::forget(s[i].take())),
    );
}

/// `shallow` drops every child when the nesting allows recursion; else
/// `forget` first empties the slots that must not be dropped, and the
/// rest go through a work list.
fn drop_children_with<V>(
    slots: &mut [Option<Child<V>>],
    shallow: impl FnOnce(&mut [Option<Child<V>>]),
    forget: impl FnOnce(&mut [Option<Child<V>>]),
) {
    // During thread teardown the counter may be gone: use the work list.
    let depth = DROP_DEPTH.try_with(|d| d.get()).unwrap_or(DROP_RECURSION);
    if depth < DROP_RECURSION {
        let _ = DROP_DEPTH.try_with(|d| d.set(depth + 1));
        shallow(slots);
        let _ = DROP_DEPTH.try_with(|d| d.set(depth));
        return;
    }
    forget(slots);
    let mut work: Vec<Child<V>> = Vec::new();
    collect_unique(slots, &mut work);
    while let Some(mut c) = work.pop() {
        match c.get_mut() {
            Some(NodeMut::N4(n)) => collect_unique(&mut n.children, &mut work),
            Some(NodeMut::N16(n)) => collect_unique(&mut n.children, &mut work),
            Some(NodeMut::N48(n)) => collect_unique(&mut n.children, &mut work),
            Some(NodeMut::N256(n)) => collect_unique(n.slots.for_drop(), &mut work),
            Some(NodeMut::D256(n)) => {
                collect_unique(n.p.for_drop(), &mut work);
                if let Some(base) = NodeRc::get_mut(&mut n.base) {
                    collect_unique(base.slots.for_drop(), &mut work);
                }
            }
            _ => {}
        }
    }
    for slot in slots {
        drop(slot.take());
    }
}

fn collect_unique<V>(slots: &mut [Option<Child<V>>], work: &mut Vec<Child<V>>) {
    for slot in slots {
        if slot.as_ref().is_some_and(|c| !c.is_leaf() && c.is_unique()) {
            work.extend(slot.take());
        }
    }
}

impl<V> Drop for N4<V> {
    fn drop(&mut self) {
        drop_children(&mut self.children);
    }
}

impl<V> Drop for N16<V> {
    fn drop(&mut self) {
        drop_children(&mut self.children);
    }
}

impl<V> Drop for N48<V> {
    fn drop(&mut self) {
        drop_children(&mut self.children);
    }
}
