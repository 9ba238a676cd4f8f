//! Node layout of the concurrent compressed radix tree.
//!
//! A node is an `Arc<parking_lot::RwLock<Node>>`. It holds a *run* of local
//! hashes (the compressed edge), the sorted set of workers that hold the
//! whole run, and its children keyed by their first local hash. Child
//! storage grows `None -> One -> Many` and worker sets stay inline up to
//! four workers, so a leaf held by a few workers makes no allocation besides
//! the node itself (and its run, past two blocks).

use std::sync::Arc;

use super::sync::{ArcWriteGuard, Guard, RwLock};
use hashbrown::HashMap;
use smallvec::SmallVec;

use crate::hash::LocalHash;

/// Shared handle to a node.
pub(crate) type NodeRef = Arc<RwLock<Node>>;
/// Owned write guard (keeps its node alive; allows hand-over-hand locking).
pub(crate) type WGuard = ArcWriteGuard<Node>;

/// Interned worker id (index into the worker registry).
pub(crate) type Wid = u32;

/// Sorted, deduplicated set of interned worker ids.
pub(crate) type WorkerSet = SmallVec<[Wid; 4]>;

/// Run of local hashes.
pub(crate) type Run = SmallVec<[LocalHash; 2]>;

pub(crate) type ChildMap = HashMap<LocalHash, Linked, foldhash::fast::RandomState>;

/// A parent's reference to a child: the reference readers follow.
///
/// Readers walk the tree without taking a reference count per node (see
/// [`Linked::pinned`]), so dropping a `Linked` does not drop its `Arc`
/// there and then: the drop is deferred through crossbeam-epoch until every
/// thread pinned at that moment has unpinned. Writers use it as a plain
/// [`NodeRef`] through `Deref`.
pub(crate) struct Linked(Option<NodeRef>);

impl Linked {
    pub(crate) fn new(n: NodeRef) -> Self {
        Linked(Some(n))
    }

    /// The reference, without deferral: only for a caller that knows no
    /// reader can be pinned on this tree (the index's `Drop`).
    pub(crate) fn into_inner(mut self) -> NodeRef {
        self.0
            .take()
            .expect("a Linked holds its node until dropped")
    }

    /// The child, valid for as long as `guard` stays pinned, without a
    /// reference count.
    #[allow(unsafe_code)]
    #[inline]
    pub(crate) fn pinned<'g>(&self, _guard: &'g Guard) -> &'g RwLock<Node> {
        let p = Arc::as_ptr(self);
        // SAFETY: `self` is alive now, so its `Arc` holds one count on the
        // node and the allocation is valid now. That count is released
        // only by `Linked`'s `Drop` (or `into_inner`, used only by the
        // index's `Drop`, which has exclusive access), which hands the
        // `Arc` to `Guard::defer`: the `Arc` is dropped only after every
        // thread that was pinned when `defer` ran has unpinned. `_guard`
        // is pinned now, before any future drop of `self`, so the count
        // (and the allocation) outlives `'g`. `RwLock<Node>` is `Sync`, so
        // sharing the reference across the lock's users is sound.
        unsafe { &*p }
    }
}

impl std::ops::Deref for Linked {
    type Target = NodeRef;

    #[inline]
    fn deref(&self) -> &NodeRef {
        match &self.0 {
            Some(n) => n,
            None => unreachable!("a Linked holds its node until dropped"),
        }
    }
}

impl Drop for Linked {
    fn drop(&mut self) {
        if let Some(n) = self.0.take() {
            super::sync::pin().defer(move || drop(n));
        }
    }
}

/// A node's children, allocated only when first needed.
#[derive(Default)]
pub(crate) enum Children {
    /// A leaf (most nodes).
    #[default]
    None,
    /// Exactly one child: no map allocated.
    One(LocalHash, Linked),
    /// Two or more children.
    Many(Box<ChildMap>),
}

impl Children {
    pub fn get(&self, k: &LocalHash) -> Option<&Linked> {
        match self {
            Children::None => None,
            Children::One(key, n) => (key == k).then_some(n),
            Children::Many(m) => m.get(k),
        }
    }

    pub fn is_none(&self) -> bool {
        matches!(self, Children::None)
    }

    /// The only child, if there is exactly one.
    pub fn single(&self) -> Option<&Linked> {
        match self {
            Children::One(_, n) => Some(n),
            Children::Many(m) if m.len() == 1 => m.values().next(),
            _ => None,
        }
    }

    pub fn insert(&mut self, k: LocalHash, n: NodeRef) {
        let n = Linked::new(n);
        match std::mem::take(self) {
            Children::None => *self = Children::One(k, n),
            Children::One(k0, n0) => {
                let mut m = ChildMap::default();
                m.insert(k0, n0);
                m.insert(k, n);
                *self = Children::Many(Box::new(m));
            }
            Children::Many(mut m) => {
                m.insert(k, n);
                *self = Children::Many(m);
            }
        }
    }

    /// Removes the child keyed `k`; shrinks `Many` back to `One`/`None`.
    /// Dropping the result defers the node's release past current readers.
    pub fn remove(&mut self, k: &LocalHash) -> Option<Linked> {
        match std::mem::take(self) {
            Children::None => None,
            Children::One(k0, n0) => {
                if &k0 == k {
                    Some(n0)
                } else {
                    *self = Children::One(k0, n0);
                    None
                }
            }
            Children::Many(mut m) => {
                let r = m.remove(k);
                *self = match m.len() {
                    0 => Children::None,
                    1 => {
                        let (k1, n1) = m.drain().next().expect("one entry");
                        Children::One(k1, n1)
                    }
                    _ => Children::Many(m),
                };
                r
            }
        }
    }

    /// Empties the storage, returning every child.
    /// Only for a caller with exclusive access to the tree (no deferral).
    pub fn take_all(&mut self) -> Vec<NodeRef> {
        match std::mem::take(self) {
            Children::None => Vec::new(),
            Children::One(_, n) => vec![n.into_inner()],
            Children::Many(m) => m.into_values().map(Linked::into_inner).collect(),
        }
    }

    pub fn iter(&self) -> Box<dyn Iterator<Item = (&LocalHash, &Linked)> + '_> {
        match self {
            Children::None => Box::new(std::iter::empty()),
            Children::One(k, n) => Box::new(std::iter::once((k, n))),
            Children::Many(m) => Box::new(m.iter()),
        }
    }
}

/// One node. Every field is guarded by the node's `RwLock`.
#[derive(Default)]
pub(crate) struct Node {
    /// Depth (0-based block index from the root) of the run's first block.
    /// Never changes while the node is alive.
    pub start: u32,
    /// Set once the node is unlinked (killed) or merged into its parent.
    pub dead: bool,
    /// The compressed run. Non-empty for every live node but the root.
    pub blocks: Run,
    /// Workers holding the whole run, sorted.
    pub workers: WorkerSet,
    /// Children keyed by their first block.
    pub children: Children,
    /// Hint to the parent: the node that held depth `start - 1` when this
    /// node was linked (resolve it with the `link` chain). `None` for the
    /// root and for dead nodes.
    pub parent: Option<NodeRef>,
    /// Alive: the node that received this node's tail in its last split
    /// (the continuation for depths past `start + blocks.len()`).
    /// Dead after a merge: the node that absorbed this one (forward).
    /// Dead after an unlink: `None`.
    pub link: Option<NodeRef>,
}

impl Node {
    pub fn end(&self) -> u32 {
        self.start + self.blocks.len() as u32
    }
}

pub(crate) fn set_contains(s: &WorkerSet, w: Wid) -> bool {
    s.binary_search(&w).is_ok()
}

pub(crate) fn set_insert(s: &mut WorkerSet, w: Wid) -> bool {
    match s.binary_search(&w) {
        Ok(_) => false,
        Err(i) => {
            s.insert(i, w);
            true
        }
    }
}

pub(crate) fn set_remove(s: &mut WorkerSet, w: Wid) -> bool {
    match s.binary_search(&w) {
        Ok(i) => {
            s.remove(i);
            true
        }
        Err(_) => false,
    }
}

/// Splits `x` (alive, write-locked) at run offset `k` (0 < k < len): `x`
/// keeps `[0, k)`, a new node `t` gets `[k, len)`, `x`'s workers, children
/// and tail link; `t` becomes `x`'s only child and its tail link.
///
/// Readers see either the whole old run or the head with `t` below it: the
/// new node is fully built before it is published, and both changes happen
/// inside `x`'s write critical section.
pub(crate) fn split(x: &mut WGuard, k: usize) -> NodeRef {
    debug_assert!(k > 0 && k < x.blocks.len());
    let this = Arc::clone(WGuard::rwlock(x));
    let tail: Run = x.blocks[k..].iter().copied().collect();
    x.blocks.truncate(k);
    let first = tail[0];
    let t = Arc::new(RwLock::new(Node {
        start: x.start + k as u32,
        dead: false,
        blocks: tail,
        workers: x.workers.clone(),
        children: std::mem::take(&mut x.children),
        parent: Some(this),
        link: x.link.take(),
    }));
    x.children = Children::One(first, Linked::new(Arc::clone(&t)));
    x.link = Some(Arc::clone(&t));
    t
}
