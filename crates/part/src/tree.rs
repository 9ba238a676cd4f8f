//! `Tree`: an immutable snapshot. Cloning it is one reference-count bump.

use std::ops::RangeBounds;

use crate::iter::{IntoIter, Iter, Scan, ScanRef};
use crate::node::{Child, Kind};
use crate::txn::Txn;
use crate::watch::{Gap, GapKind, Watch, WatchInner};
use crate::{bytes, Error};
use std::sync::Arc;

/// How a tree hands out watches.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Options {
    /// Keep a single watch at the root: every read watches "anything
    /// changed", and commits close one watch instead of one per copied node.
    pub root_only_watch: bool,
}

/// A persistent adaptive radix tree: an immutable snapshot of byte-string
/// keys to values.
pub struct Tree<V> {
    pub(crate) root: Child<V>,
    pub(crate) len: usize,
    pub(crate) opts: Options,
}

impl<V> Clone for Tree<V> {
    fn clone(&self) -> Self {
        Tree {
            root: self.root.clone(),
            len: self.len,
            opts: self.opts,
        }
    }
}

impl<V> Default for Tree<V> {
    fn default() -> Self {
        Self::new()
    }
}

impl<V: std::fmt::Debug> std::fmt::Debug for Tree<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(self.iter().map(|(k, v)| (k.to_vec(), v)))
            .finish()
    }
}

impl<V> Tree<V> {
    /// An empty tree with per-node watches.
    pub fn new() -> Self {
        Self::with_options(Options::default())
    }

    /// An empty tree with the given options.
    pub fn with_options(opts: Options) -> Self {
        Tree {
            root: Child::empty_inner(&[]),
            len: 0,
            opts,
        }
    }

    /// Whether both handles are the same snapshot.
    pub fn ptr_eq(&self, other: &Tree<V>) -> bool {
        self.root.ptr_eq(&other.root)
    }

    /// The options the tree was made with.
    pub fn options(&self) -> Options {
        self.opts
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the tree holds no key.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The value under `key`.
    #[inline]
    pub fn get(&self, key: &[u8]) -> Option<&V> {
        get(&self.root, key)
    }

    /// The value under `key` and a watch that fires once a later commit
    /// changes it (for a missing key: inserts it). design.md, "What fires".
    pub fn get_watch(&self, key: &[u8]) -> (Option<&V>, Watch) {
        if self.opts.root_only_watch {
            return (get(&self.root, key), self.root.header().watch.watch());
        }
        get_watched(&self.root, key)
    }

    /// Iterates the keys under `prefix` and returns a watch that fires once a
    /// later commit writes a key under it (design.md, "What fires").
    pub fn prefix_watch(&self, prefix: &[u8]) -> (Iter<'_, V>, Watch) {
        let w = if self.opts.root_only_watch {
            self.root.header().watch.watch()
        } else {
            prefix_watch_of(&self.root, prefix)
        };
        (self.prefix(prefix), w)
    }

    /// A watch that fires on the next commit that changes anything.
    pub fn root_watch(&self) -> Watch {
        self.root.header().watch.watch()
    }

    /// The smallest key and its value.
    pub fn first(&self) -> Option<(&[u8], &V)> {
        self.iter().next()
    }

    /// The largest key and its value.
    pub fn last(&self) -> Option<(&[u8], &V)> {
        self.iter_rev().next()
    }

    /// All keys in ascending order.
    pub fn iter(&self) -> Iter<'_, V> {
        Iter::new(&self.root, ScanRef::All, false)
    }

    /// All keys in descending order.
    pub fn iter_rev(&self) -> Iter<'_, V> {
        Iter::new(&self.root, ScanRef::All, true)
    }

    /// Keys starting with `prefix`, ascending.
    pub fn prefix(&self, prefix: &[u8]) -> Iter<'_, V> {
        Iter::new(&self.root, ScanRef::Prefix(prefix), false)
    }

    /// Keys starting with `prefix`, descending.
    pub fn prefix_rev(&self, prefix: &[u8]) -> Iter<'_, V> {
        Iter::new(&self.root, ScanRef::Prefix(prefix), true)
    }

    /// Keys `>= key`, ascending.
    pub fn lower_bound(&self, key: &[u8]) -> Iter<'_, V> {
        Iter::new(&self.root, ScanRef::LowerBound(key), false)
    }

    /// Keys `>= key`, descending (from the largest down to `key`).
    pub fn lower_bound_rev(&self, key: &[u8]) -> Iter<'_, V> {
        Iter::new(&self.root, ScanRef::LowerBound(key), true)
    }

    /// Keys within `range`, ascending.
    pub fn range<'k, R: RangeBounds<&'k [u8]>>(&self, range: R) -> Iter<'_, V> {
        Iter::new(&self.root, range_scan(&range), false)
    }

    /// Keys within `range`, descending.
    pub fn range_rev<'k, R: RangeBounds<&'k [u8]>>(&self, range: R) -> Iter<'_, V> {
        Iter::new(&self.root, range_scan(&range), true)
    }

    /// A borrowing iterator over any scan, in either direction.
    pub fn scan(&self, scan: &Scan, rev: bool) -> Iter<'_, V> {
        Iter::new(&self.root, scan.as_ref(), rev)
    }

    /// An owning iterator over any scan: it keeps this snapshot alive and can
    /// outlive the handle it came from.
    pub fn scan_owned(&self, scan: &Scan, rev: bool) -> IntoIter<V> {
        IntoIter::new(&self.root, scan.as_ref(), rev)
    }
}

impl<V: Clone> Tree<V> {
    /// A write transaction starting from this snapshot.
    #[inline]
    pub fn txn(&self) -> Txn<V> {
        Txn::new(self.clone())
    }

    /// One-shot insert: the new tree and the previous value.
    pub fn insert(&self, key: &[u8], value: V) -> Result<(Tree<V>, Option<V>), Error> {
        let mut t = self.txn();
        let old = t.insert(key, value)?;
        Ok((t.commit(), old))
    }

    /// One-shot delete: the new tree and the removed value.
    pub fn delete(&self, key: &[u8]) -> (Tree<V>, Option<V>) {
        let mut t = self.txn();
        let old = t.delete(key);
        (t.commit(), old)
    }
}

impl<V> IntoIterator for Tree<V> {
    type Item = crate::iter::Entry<V>;
    type IntoIter = IntoIter<V>;
    fn into_iter(self) -> IntoIter<V> {
        IntoIter::new(&self.root, ScanRef::All, false)
    }
}

impl<'a, V> IntoIterator for &'a Tree<V> {
    type Item = (&'a [u8], &'a V);
    type IntoIter = Iter<'a, V>;
    fn into_iter(self) -> Iter<'a, V> {
        self.iter()
    }
}

pub(crate) fn range_scan<'k, R: RangeBounds<&'k [u8]>>(range: &R) -> ScanRef<'k> {
    ScanRef::Range(range.start_bound().cloned(), range.end_bound().cloned())
}

/// Lookup without watch tracking (the hot path). Inner segments are not
/// compared, only skipped: a leaf stores its full key, so the one compare at
/// the end (a leaf, or the terminal where the key runs out) decides. A key
/// that left the tree's paths somewhere above reaches a missing child or a
/// leaf with another key.
#[inline]
pub(crate) fn get<'a, V>(root: &'a Child<V>, key: &[u8]) -> Option<&'a V> {
    get_below(root, key, root.seg_len())
}

/// [`get`] from a node whose segment (a root leaf: its key) ends at `depth`
/// of `key`.
#[inline(always)]
pub(crate) fn get_below<'a, V>(node: &'a Child<V>, key: &[u8], depth: usize) -> Option<&'a V> {
    // The loop carries the view, not the `&Child` (see `Kind`'s methods).
    let mut node = node.kind();
    let mut depth = depth;
    loop {
        let Some(&b) = key.get(depth) else {
            // The key ends here: at a node's terminal, or at a one-key
            // tree's root that is its leaf (see `Txn::modify`), whose
            // length `depth` starts at. Tested here, off the path of every
            // other lookup: a test before the loop kept `get` from being
            // inlined (+33% instructions per lookup, callgrind).
            let l = match node {
                Kind::Leaf(l) => l,
                _ => match node.terminal()?.kind() {
                    Kind::Leaf(l) => l,
                    _ => return None,
                },
            };
            return l.h.bytes.eq_key(key).then_some(&l.value);
        };
        let child = node.find_child(b)?.kind();
        if let Kind::Leaf(l) = child {
            return l.h.bytes.eq_key(key).then_some(&l.value);
        }
        depth += child.seg_len();
        node = child;
    }
}

/// Lookup that also returns the watch that covers the result: the leaf's
/// when found; for a missing key, a missing-key watch kept by the node its
/// path ends at (a leaf, where only an insert that pushes the leaf down
/// can add the key), which the commit that supersedes that node moves on
/// (`rehome`).
pub(crate) fn get_watched<'a, V>(root: &'a Child<V>, key: &[u8]) -> (Option<&'a V>, Watch) {
    let (v, node) = get_with_node(root, key);
    if v.is_some() {
        return (v, node.header().watch.watch());
    }
    // The node's watch keeps the watches on missing keys whose path ends
    // there (installed if need be; none once the node is superseded).
    let at = node.header().watch.inner();
    let w = at.map_or_else(Watch::closed, |at| at.gap_watch(key, GapKind::Missing));
    (None, w)
}

/// Moves the watch `w` on a missing key or an empty prefix (`gap`), whose
/// node a commit superseded, to where its path ends in the committed tree
/// `root`; fires it if the commit inserted the key (a key under the
/// prefix).
pub(crate) fn rehome<V>(root: &Child<V>, gap: Gap, w: Arc<WatchInner>) {
    let at = if gap.kind != GapKind::Missing {
        let end = prefix_end(root, &gap.key);
        end.empty.then_some(end.node)
    } else {
        match get_with_node(root, &gap.key) {
            (None, node) => Some(node),
            (Some(_), _) => None,
        }
    };
    match at.and_then(|n| n.header().watch.inner()) {
        Some(at) => at.adopt_gap(gap, w),
        None => w.close(),
    }
}

/// Where the path of a prefix ends ([`prefix_end`]).
struct End<'a, V> {
    /// With keys under the prefix: the leaf that is the only one, or the
    /// inner node whose segment the prefix ends in. Without: the inner
    /// node it leaves (a missing child, a segment it departs from) or the
    /// leaf with another key it reaches.
    node: &'a Child<V>,
    /// No key starts with the prefix.
    empty: bool,
    /// The prefix ends before the end of `node`'s segment (or key).
    inside: bool,
}

/// Where the path of `prefix` ends (see [`End`]).
fn prefix_end<'a, V>(root: &'a Child<V>, prefix: &[u8]) -> End<'a, V> {
    let mut node = root;
    let mut depth = 0;
    let end = |node, empty, inside| End {
        node,
        empty,
        inside,
    };
    loop {
        if let Kind::Leaf(l) = node.kind() {
            let empty = !l.h.bytes.starts_with(prefix);
            return end(node, empty, true);
        }
        let seg = node.bytes();
        let r = &prefix[depth..];
        if r.len() <= seg.len() {
            // Every key below starts with the node's path (an inner node
            // holds keys, but for an empty tree's root, whose path is empty).
            let empty = node.num_children() == 0 && node.terminal().is_none();
            return end(node, !seg.starts_with(r) || empty, r.len() < seg.len());
        }
        if !bytes::starts_with(r, seg) {
            return end(node, true, false);
        }
        depth += seg.len();
        match node.find_child(prefix[depth]) {
            Some(c) => node = c,
            None => return end(node, true, false),
        }
    }
}

/// [`get_watched`]'s walk: the value and the node whose watch covers it.
fn get_with_node<'a, V>(root: &'a Child<V>, key: &[u8]) -> (Option<&'a V>, &'a Child<V>) {
    if let Kind::Leaf(l) = root.kind() {
        return (l.h.bytes.eq_key(key).then_some(&l.value), root);
    }
    let mut node = root;
    let mut depth = 0;
    loop {
        let seg = node.bytes();
        if !bytes::starts_with(&key[depth..], seg) {
            return (None, node);
        }
        depth += seg.len();
        let child = if depth == key.len() {
            node.terminal()
        } else {
            node.find_child(key[depth])
        };
        let Some(child) = child else {
            return (None, node);
        };
        if let Kind::Leaf(l) = child.kind() {
            return (l.h.bytes.eq_key(key).then_some(&l.value), child);
        }
        node = child;
    }
}

/// The watch that covers every key under `prefix`: with no such key, a
/// missing-key watch on the prefix; else that of the inner node whose
/// segment the prefix ends at the end of, or a held prefix watch kept by
/// the leaf its path reaches (the only key under it: any other would push
/// that leaf down) or by the inner node whose segment it ends inside
/// (design.md, "What fires").
pub(crate) fn prefix_watch_of<V>(root: &Child<V>, prefix: &[u8]) -> Watch {
    if root.is_leaf() {
        return root.header().watch.watch();
    }
    let end = prefix_end(root, prefix);
    let kind = match end {
        // No key under the prefix: a watch that fires once one is inserted
        // (design.md, "Missing-key watches").
        End { empty: true, .. } => GapKind::Empty,
        End { inside: true, .. } => GapKind::Held,
        // The root's own watch fires at every commit (`root_watch`).
        End { node, .. } if std::ptr::eq(node, root) => GapKind::Held,
        // The prefix ends where this node's segment does: every key under
        // it lives here, and every key here is under it.
        End { node, .. } => return node.header().watch.watch(),
    };
    let at = end.node.header().watch.inner();
    at.map_or_else(Watch::closed, |at| at.gap_watch(prefix, kind))
}
