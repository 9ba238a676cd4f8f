//! `Txn`: builds the next version of a tree.
//!
//! Copy-once rule: a node reached for writing is copied only while something
//! else (an older snapshot, an iterator) still shares it; `Arc::get_mut`
//! tells. A copy belongs to the transaction alone, so later writes to it in
//! the same transaction happen in place. The superseded originals are kept in
//! a list and their watches closed after commit.

use std::ops::RangeBounds;

use smallvec::SmallVec;

use std::ptr::NonNull;

use crate::bytes::Bytes;
use crate::finger::Finger;
use crate::iter::{IntoIter, Iter, Scan, ScanRef};
use crate::node::{Child, Kind, NodeMut};
use crate::tree::{get, get_below, range_scan, Options, Tree};
use crate::watch::{Gap, Home, WatchInner};
use crate::{Error, MAX_KEY_LEN};

/// A write transaction over a [`Tree`]. Dropping it without [`Txn::commit`]
/// changes nothing.
pub struct Txn<V> {
    root: Child<V>,
    len: usize,
    opts: Options,
    rec: Recorder<V>,
    finger: Finger<V>,
}

/// What a commit must close.
struct Recorder<V> {
    /// Superseded nodes that older snapshots may still reach. Inline for
    /// small transactions: a one-key commit allocates no list.
    nodes: SmallVec<[Child<V>; 8]>,
    /// What is rarely needed (boxed to keep `Txn` small).
    extra: Option<Box<Extra<V>>>,
    /// Track every node (false: root only).
    all: bool,
}

/// The rarer things a commit closes.
struct Extra<V> {
    /// Live watches taken from nodes changed in place.
    watches: Vec<std::sync::Arc<WatchInner>>,
    /// Shared nodes a write copied keeping their contents (a leaf pushed
    /// down, an inner node whose segment changed), each with the watch its
    /// copy chains, the copy, and how many bytes the write's key shares
    /// with the node's path (`LazyWatch::close_superseded`).
    pushed: Vec<Moved<V>>,
}

/// See [`Extra::pushed`].
struct Moved<V> {
    old: Child<V>,
    chained: usize,
    copy: Child<V>,
    cut: usize,
    /// A root split off: its own watch fires, only its held prefixes move.
    root: bool,
}

impl<V> Default for Extra<V> {
    fn default() -> Self {
        Extra {
            watches: Vec::new(),
            pushed: Vec::new(),
        }
    }
}

/// Closes the watches of a committed transaction; see [`Txn::commit_only`].
/// Dropping it notifies too, so no watch is ever lost.
pub struct Notifier<V> {
    rec: Recorder<V>,
    /// The committed tree's root, kept when a superseded node was watched
    /// at commit: its missing-key watches move there (see `rehome`).
    home: Option<Child<V>>,
}

impl<V> Notifier<V> {
    /// Fires every watch the transaction invalidated.
    pub fn notify(self) {}
}

impl<V> Drop for Notifier<V> {
    fn drop(&mut self) {
        let root = self.home.take();
        let move_gap = |gap: Gap, w: std::sync::Arc<WatchInner>| {
            if let Some(root) = &root {
                crate::tree::rehome(root, gap, w);
            }
        };
        let home: Home<'_> = root.is_some().then_some(&move_gap);
        for mut n in self.rec.nodes.drain(..) {
            match n.get_mut() {
                // The last reference: no snapshot reaches the node, so no
                // reader can be installing a watch on it. Fire the one it
                // has without the slot's compare-and-swap (design.md, "The
                // lazy watch protocol").
                Some(node) => {
                    if let Some(w) = node.take_watch() {
                        w.close_with(home);
                    }
                }
                None => n.header().watch.close_with(home),
            }
        }
        if let Some(extra) = self.rec.extra.take() {
            for w in extra.watches {
                w.close_with(home);
            }
            for m in extra.pushed {
                let (old, copy) = (&m.old.header().watch, &m.copy.header().watch);
                if m.root {
                    old.close_split_root(copy, m.cut, home);
                } else {
                    old.close_superseded(m.chained, copy, m.cut, home);
                }
            }
        }
    }
}

impl<V> std::fmt::Debug for Notifier<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Notifier")
            .field("nodes", &self.rec.nodes.len())
            .field(
                "watches",
                &self.rec.extra.as_ref().map_or(0, |e| e.watches.len()),
            )
            .finish()
    }
}

impl<V> std::fmt::Debug for Txn<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Txn").field("len", &self.len).finish()
    }
}

fn check_key(key: &[u8]) -> Result<(), Error> {
    if key.len() > MAX_KEY_LEN {
        Err(Error::KeyTooLong {
            len: key.len(),
            max: MAX_KEY_LEN,
        })
    } else {
        Ok(())
    }
}

#[inline]
fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl<V: Clone> Recorder<V> {
    /// Makes the node in `slot` private to the transaction, copying it if
    /// it is shared, and returns exclusive access to it.
    /// Inlined: most calls find the node already private, and a call's
    /// register saves cost more than that test.
    #[inline(always)]
    fn make_mut<'a>(&mut self, slot: &'a mut Child<V>, is_root: bool) -> NodeMut<'a, V> {
        if !slot.is_unique() {
            self.copy(slot, is_root);
        }
        match slot.get_mut() {
            Some(mut node) => {
                // Changed in place: whoever watched the old contents must hear.
                if let Some(w) = reborrow(&mut node).take_watch() {
                    self.watch(w);
                }
                node
            }
            None => unreachable!("a fresh copy is unique"),
        }
    }

    /// Replaces the shared node in `slot` with a private copy.
    #[inline(never)]
    fn copy(&mut self, slot: &mut Child<V>, is_root: bool) {
        let copy = slot.copy_for_write();
        let old = std::mem::replace(slot, copy);
        if self.all || is_root {
            self.nodes.push(old);
        }
    }

    /// Whether a node this transaction superseded holds a watch (which may
    /// hold missing-key watches to move into the new tree), while any
    /// missing-key watch exists: a hint, read at commit; a missing-key
    /// watch installed after it fires at commit.
    #[inline]
    fn watched(&self) -> bool {
        self.all
            && crate::watch::gaps_exist()
            && (self.extra.is_some() || self.nodes.iter().any(|n| n.header().watch.is_watched()))
    }

    /// Keeps a live watch taken from a node changed in place.
    #[cold]
    fn watch(&mut self, w: std::sync::Arc<WatchInner>) {
        self.extra.get_or_insert_with(Box::default).watches.push(w);
    }

    /// An insert whose key shares `cut` bytes with `leaf`'s is pushing it
    /// down under a new inner node. Its point watch must not fire (its
    /// value stays), nor its held prefix watches longer than `cut` (the new
    /// key is not under them), but the shorter ones must, and a reader of
    /// an older snapshot may be installing any. So a shared or watched
    /// leaf is copied: the old one is superseded (closed at commit, but for
    /// what the copy carries on), the copy gets a watch chaining the old
    /// one's. A private, unwatched leaf moves as it is.
    #[inline(never)]
    fn push_down(&mut self, leaf: &mut Child<V>, cut: usize) {
        if let Some(NodeMut::Leaf(l)) = leaf.get_mut() {
            if l.h.watch.is_unset() {
                return;
            }
        }
        let Kind::Leaf(l) = leaf.kind() else {
            unreachable!("pushing down a leaf")
        };
        let (copy, chained) = Child::pushed_leaf(l);
        self.hand_on(leaf, copy, chained, cut);
    }

    /// Private access to the inner node in `slot`, whose segment this
    /// write changes and nothing else: an insert whose key shares `cut`
    /// bytes with the node's path splits the segment above it, or a delete
    /// merges its parent into it (`cut` 0: the deleted key was under none
    /// of its prefixes). Its watchers must not hear of that, but for held
    /// prefixes no longer than `cut`, so a shared node's copy carries its
    /// watch on, as [`Recorder::push_down`]'s does. `seg` is the new
    /// segment.
    fn moved(&mut self, slot: &mut Child<V>, cut: usize, seg: Bytes) {
        if self.all && !slot.is_unique() {
            let (copy, chained) = slot.moved_inner(seg);
            self.hand_on(slot, copy, chained, cut);
        } else {
            self.make_mut(slot, false).header_mut().bytes = seg;
        }
    }

    /// Puts `copy` (chaining the watch at `chained`) in `slot`, and keeps
    /// the old node and a handle on the copy for the commit to close (see
    /// [`Extra::pushed`]). The handle makes a later write of the copy in
    /// this transaction copy it again, so its watch then fires.
    #[cold]
    fn hand_on(&mut self, slot: &mut Child<V>, copy: Child<V>, chained: usize, cut: usize) {
        let old = std::mem::replace(slot, copy.clone());
        self.record(Moved {
            old,
            chained,
            copy,
            cut,
            root: false,
        });
    }

    #[cold]
    fn record(&mut self, m: Moved<V>) {
        self.extra.get_or_insert_with(Box::default).pushed.push(m);
    }

    /// An insert whose key shares `cut` bytes with the root's segment
    /// splits it: the root, shared, moves below a new root as a private
    /// copy (merged into its one entry if it has one, as only a root may
    /// hold fewer than two). Its watch fires at commit, as a root's must,
    /// but its held prefixes longer than `cut` move to what took its
    /// contents (the new key is not under them).
    #[cold]
    fn split_root(&mut self, slot: &mut Child<V>, cut: usize, seg: Bytes) {
        let old = slot.clone();
        *slot = old.copy_for_write();
        if let Some(n) = slot.get_mut() {
            n.header_mut().bytes = seg;
        }
        normalize(self, slot);
        let copy = slot.clone();
        self.record(Moved {
            old,
            chained: 0,
            copy,
            cut,
            root: true,
        });
    }

    /// Records a node leaving the tree.
    #[inline]
    fn removed(&mut self, node: Child<V>) {
        if self.all {
            self.nodes.push(node);
        }
    }
}

/// A shorter-lived `NodeMut` from a longer one.
fn reborrow<'b, V>(n: &'b mut NodeMut<'_, V>) -> NodeMut<'b, V> {
    match n {
        NodeMut::Leaf(x) => NodeMut::Leaf(x),
        NodeMut::N4(x) => NodeMut::N4(x),
        NodeMut::N16(x) => NodeMut::N16(x),
        NodeMut::N48(x) => NodeMut::N48(x),
        NodeMut::N256(x) => NodeMut::N256(x),
        NodeMut::D256(x) => NodeMut::D256(x),
    }
}

impl<V: Clone> Txn<V> {
    #[inline]
    pub(crate) fn new(tree: Tree<V>) -> Self {
        Txn {
            rec: Recorder {
                nodes: SmallVec::new(),
                extra: None,
                all: !tree.opts.root_only_watch,
            },
            root: tree.root,
            len: tree.len,
            opts: tree.opts,
            finger: Finger::new(),
        }
    }

    /// Inserts `value` under `key`; returns the previous value.
    pub fn insert(&mut self, key: &[u8], value: V) -> Result<Option<V>, Error> {
        self.modify(key, |_| value)
    }

    /// Sets `key` to `f(current value)`; returns the previous value.
    // Inlined: the closure and the call fold into the caller (design.md,
    // "The copy-once rule").
    #[inline]
    pub fn modify<F: FnOnce(Option<&V>) -> V>(
        &mut self,
        key: &[u8],
        f: F,
    ) -> Result<Option<V>, Error> {
        check_key(key)?;
        let rec = &mut self.rec;
        let finger = &mut self.finger;
        // SAFETY: the slot is borrowed for no longer than `&mut self`.
        let (mut slot, mut depth, mut is_root) = match unsafe { finger.take(key) } {
            Some((slot, depth)) => (slot, depth, false),
            None => (&mut self.root, 0usize, true),
        };
        // The slot of the last inner node passed (for a key that ends in a
        // leaf below it).
        let mut parent: Option<(NonNull<Child<V>>, usize)> = None;
        loop {
            // The usual node of a large transaction first, in one step.
            if let Some((step, d)) = flat_step(slot, key, depth) {
                let b = key[d];
                match step {
                    Flat::Descend => {
                        let (here, node) = crate::finger::pin(slot);
                        parent = (!is_root).then_some((here, depth));
                        is_root = false;
                        depth = d;
                        slot = child_slot(node, b);
                        continue;
                    }
                    Flat::Add => {
                        add_flat(slot, b, key, f);
                        self.len += 1;
                        if !is_root {
                            finger.set(NonNull::from(slot), key, depth);
                        }
                        return Ok(None);
                    }
                    Flat::Replace => {
                        let (here, node) = crate::finger::pin(slot);
                        let old = replace_flat(rec, node, b, key, f);
                        if !is_root {
                            finger.set(here, key, depth);
                        }
                        return Ok(Some(old));
                    }
                    Flat::ReplaceBorrowed => {
                        let old = replace_flat_borrowed(rec, slot, b, key, f);
                        if !is_root {
                            finger.set(NonNull::from(slot), key, depth);
                        }
                        return Ok(Some(old));
                    }
                }
            }
            // Where does the key leave the path through this node?
            let split = match slot.kind() {
                Kind::Leaf(l) => {
                    if l.h.bytes.eq_key(key) {
                        let old = replace_leaf(rec, slot, key, f, is_root);
                        if let Some((p, d)) = parent {
                            finger.set(p, key, d);
                        }
                        return Ok(Some(old));
                    }
                    Some(common_prefix(&l.h.bytes[depth..], &key[depth..]))
                }
                _ if crate::bytes::starts_with(&key[depth..], slot.bytes()) => None,
                _ => Some(common_prefix(slot.bytes(), &key[depth..])),
            };
            if let Some(cp) = split {
                // A new inner node takes the common part; the old node and
                // the new leaf hang below it.
                let mut inner = Child::empty_inner(&key[depth..depth + cp]);
                inner.place(depth + cp, Child::leaf(key, f(None)));
                let old = std::mem::replace(slot, inner);
                hang_split_off(rec, slot, old, depth + cp, cp, is_root);
                self.len += 1;
                if !is_root {
                    finger.set(NonNull::from(slot), key, depth);
                }
                return Ok(None);
            }
            if is_root && self.len == 0 && !rec.all {
                first_key_as_root(rec, slot, key, f);
                // The old root leaves the tree: no finger may point into it.
                finger.clear();
                self.len = 1;
                return Ok(None);
            }
            rec.make_mut(slot, is_root);
            let top = depth;
            depth += slot.seg_len();
            if depth == key.len() {
                return Ok(write_terminal(rec, &mut self.len, slot, key, f));
            }
            let b = key[depth];
            if slot.find_child(b).is_none() {
                slot.add_child(b, Child::leaf(key, f(None)));
                self.len += 1;
                if !is_root {
                    finger.set(NonNull::from(slot), key, top);
                }
                return Ok(None);
            }
            slot.room_for_patch(b);
            if borrows_leaf_of(slot, b, key) {
                let (old, new) = borrowed_leaf_replacement(rec, slot, b, key, f);
                slot.replace_borrowed(b, Some(new));
                if !is_root {
                    finger.set(NonNull::from(slot), key, top);
                }
                return Ok(Some(old));
            }
            // Descend through a raw pointer, which the finger may keep.
            let (here, node) = crate::finger::pin(slot);
            parent = (!is_root).then_some((here, top));
            is_root = false;
            slot = child_slot(node, b);
        }
    }

    /// Removes `key`; returns its value.
    pub fn delete(&mut self, key: &[u8]) -> Option<V> {
        if self.root.is_leaf() {
            return self.delete_root_leaf(key);
        }
        let rec = &mut self.rec;
        let finger = &mut self.finger;
        // SAFETY: the slot is borrowed for no longer than `&mut self`.
        // (A finger on a leaf, left by a delete that merged its node away,
        // is not a place this loop can start from.)
        let (mut slot, mut depth, mut is_root) = match unsafe { finger.take(key) } {
            Some((slot, depth)) if !slot.is_leaf() => (slot, depth, false),
            _ => (&mut self.root, 0usize, true),
        };
        // One walk when the whole path is already private (most deletes of a
        // large transaction); it changes nothing before it finds the key.
        if let Some(done) = delete_in_place(rec, finger, slot, key, depth, is_root) {
            self.len -= usize::from(done.is_some());
            return done;
        }
        // Look before copying: deleting a missing key must copy no node and
        // fire no watch. The second walk finds its nodes in cache.
        get_below(slot, key, depth + slot.seg_len())?;
        loop {
            let top = depth;
            // Some((value, leaf to record)) once the key's leaf is unlinked
            // from this node; None to descend.
            let unlinked = {
                rec.make_mut(slot, is_root);
                depth += slot.seg_len();
                if depth == key.len() {
                    let leaf = slot
                        .get_mut()
                        .and_then(NodeMut::terminal_mut)
                        .and_then(Option::take);
                    Some(leaf.and_then(|l| Some((l.leaf_value()?.clone(), Some(l)))))
                } else if slot.find_child(key[depth]).is_some_and(|c| !c.is_leaf()) {
                    None
                } else {
                    Some(slot.remove_leaf(key[depth], rec.all))
                }
            };
            match unlinked {
                None => {
                    slot = child_slot(slot, key[depth]);
                    is_root = false;
                }
                Some(removed) => {
                    let (value, leaf) = removed?;
                    if let Some(leaf) = leaf {
                        rec.removed(leaf);
                    }
                    if !is_root {
                        normalize(rec, slot);
                        finger.set(NonNull::from(slot), key, top);
                    } else if !slot.bytes().is_empty()
                        && slot.num_children() == 0
                        && slot.terminal().is_none()
                    {
                        // An empty tree's root keeps no path: a later key
                        // would otherwise split it into an empty inner node.
                        if let Some(n) = slot.get_mut() {
                            n.header_mut().bytes = Default::default();
                        }
                    }
                    self.len -= 1;
                    return Some(value);
                }
            }
        }
    }

    /// [`Txn::delete`] in a one-key tree whose root is its leaf: the tree
    /// becomes empty.
    #[cold]
    fn delete_root_leaf(&mut self, key: &[u8]) -> Option<V> {
        if !crate::bytes::eq(self.root.bytes(), key) {
            return None;
        }
        let old = std::mem::replace(&mut self.root, Child::empty_inner(&[]));
        let value = leaf_value(&old);
        self.rec.nodes.push(old);
        self.finger.clear();
        self.len = 0;
        Some(value)
    }

    /// The value under `key`, this transaction's writes included.
    pub fn get(&self, key: &[u8]) -> Option<&V> {
        // SAFETY: the node is borrowed for no longer than `&self`.
        match unsafe { self.finger.peek(key) } {
            // From the last write's leaf parent, as a write would start.
            Some((node, depth)) if !node.is_leaf() => get_below(node, key, depth + node.seg_len()),
            _ => get(&self.root, key),
        }
    }

    /// Number of keys, this transaction's writes included.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the transaction's tree is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Ascending iteration over this transaction's current state.
    pub fn iter(&self) -> Iter<'_, V> {
        Iter::new(&self.root, ScanRef::All, false)
    }

    /// Keys under `prefix`, ascending, this transaction's writes included.
    pub fn prefix(&self, prefix: &[u8]) -> Iter<'_, V> {
        Iter::new(&self.root, ScanRef::Prefix(prefix), false)
    }

    /// Keys within `range`, ascending, this transaction's writes included.
    pub fn range<'k, R: RangeBounds<&'k [u8]>>(&self, range: R) -> Iter<'_, V> {
        Iter::new(&self.root, range_scan(&range), false)
    }

    /// A borrowing iterator over any scan of the transaction's state.
    pub fn scan(&self, scan: &Scan, rev: bool) -> Iter<'_, V> {
        Iter::new(&self.root, scan.as_ref(), rev)
    }

    /// An owning iterator over the transaction's current state. It shares
    /// nodes with the transaction, so later writes copy them again.
    pub fn scan_owned(&self, scan: &Scan, rev: bool) -> IntoIter<V> {
        self.finger.invalidate();
        IntoIter::new(&self.root, scan.as_ref(), rev)
    }

    /// Checks the structural invariants of the transaction's current tree.
    /// A test hook (feature `test-util`).
    #[cfg(feature = "test-util")]
    pub fn check_invariants(&self) -> Result<(), String> {
        crate::check::check_root(&self.root, self.len)
    }

    /// Removes every key.
    pub fn clear(&mut self) {
        self.finger.clear();
        let empty = Child::empty_inner(&[]);
        let old = std::mem::replace(&mut self.root, empty);
        self.len = 0;
        if !self.rec.all {
            self.rec.nodes.push(old);
            return;
        }
        // Every watcher of the old contents must hear: close every node.
        let mut stack = vec![old];
        while let Some(n) = stack.pop() {
            if let Some(t) = n.terminal() {
                stack.push(t.clone());
            }
            let mut pos = 0;
            while let Some((p, c)) = n.next_child(pos) {
                pos = p + 1;
                stack.push(c.clone());
            }
            self.rec.nodes.push(n);
        }
    }

    /// Commits: returns the new tree and closes the watches of everything it
    /// changed (after the tree exists, never before).
    pub fn commit(self) -> Tree<V> {
        let (tree, notifier) = self.commit_only();
        notifier.notify();
        tree
    }

    /// Commits without notifying: publish the tree first, then call
    /// [`Notifier::notify`] (or drop it) so watchers see the new state.
    ///
    /// ```
    /// use std::sync::RwLock;
    /// use part::Tree;
    ///
    /// // Where readers find the current tree.
    /// let current = RwLock::new(Tree::<u32>::new());
    /// let (_, changed) = current.read().unwrap().get_watch(b"k");
    ///
    /// let mut txn = current.read().unwrap().txn();
    /// txn.insert(b"k", 7).unwrap();
    /// let (tree, notifier) = txn.commit_only();
    /// assert!(!changed.is_closed()); // not yet: the new tree is not published
    /// *current.write().unwrap() = tree;
    /// notifier.notify(); // a woken watcher now reads the new tree
    /// assert!(changed.is_closed());
    /// assert_eq!(current.read().unwrap().get(b"k"), Some(&7));
    /// ```
    pub fn commit_only(mut self) -> (Tree<V>, Notifier<V>) {
        compress_root(&mut self.rec, &mut self.root);
        let home = self.rec.watched().then(|| self.root.clone());
        let tree = Tree {
            root: self.root,
            len: self.len,
            opts: self.opts,
        };
        (
            tree,
            Notifier {
                rec: self.rec,
                home,
            },
        )
    }
}

/// Path compression at the root: a root this transaction changed whose
/// only entry is an inner child it owns takes that child's place, the
/// root's segment joined in front of the child's. Keys that all share a
/// prefix (integers below 2^56, say) then cost one level less on every
/// lookup and one node less to copy and free on every write. A shared child
/// is left where it is: copying it would fire its watches for a change
/// outside it.
#[inline]
fn compress_root<V: Clone>(rec: &mut Recorder<V>, root: &mut Child<V>) {
    if let Some(b) = root.lone_inner_child() {
        absorb_child(rec, root, b);
    }
}

#[inline(never)]
fn absorb_child<V: Clone>(rec: &mut Recorder<V>, root: &mut Child<V>, b: u8) {
    if !root.is_unique() || !root.find_child(b).is_some_and(Child::is_unique) {
        return;
    }
    // A root unique from the start (its snapshot dropped) may carry a live
    // watch that no write took yet: it goes away, so it must fire.
    rec.make_mut(root, true);
    pass_to_child(rec, root, b);
}

/// What [`Txn::modify`] does at a private flat node256 (see [`flat_step`]).
enum Flat {
    /// The child under the key's byte is an inner node.
    Descend,
    /// No child there: a new leaf.
    Add,
    /// The key's leaf, owned by the node.
    Replace,
    /// The key's leaf, borrowed from the node's lender.
    ReplaceBorrowed,
}

/// The step at `slot` in one test of its kind, when it holds a private flat
/// node256 without a watch whose segment `key` continues past `depth`, and
/// the step needs neither a split nor the node's terminal: the step and the
/// depth below the segment. `None` sends the caller down its general path,
/// which dispatches on the kind at each of the same tests (design.md).
#[inline(always)]
fn flat_step<V>(slot: &mut Child<V>, key: &[u8], depth: usize) -> Option<(Flat, usize)> {
    let n = slot.flat256_mut()?;
    let d = depth + n.h.bytes.len();
    if d >= key.len()
        || !n.h.watch.is_unset()
        || !crate::bytes::starts_with(&key[depth..], &n.h.bytes)
    {
        return None;
    }
    let b = key[d];
    let step = match n.slots.get(b).map(|c| c.kind()) {
        None => Flat::Add,
        Some(Kind::Leaf(l)) if l.h.bytes.eq_key(key) => {
            if n.slots.is_borrowed(b) {
                Flat::ReplaceBorrowed
            } else {
                Flat::Replace
            }
        }
        Some(Kind::Leaf(_)) => return None,
        Some(_) => Flat::Descend,
    };
    Some((step, d))
}

/// Adds the leaf of `key` under byte `b` of the private flat node256 in
/// `slot` ([`Flat::Add`]).
#[inline(always)]
fn add_flat<V: Clone, F: FnOnce(Option<&V>) -> V>(slot: &mut Child<V>, b: u8, key: &[u8], f: F) {
    let Some(n) = slot.flat256_mut() else {
        unreachable!("a private flat node256")
    };
    n.slots.put_empty(b, Child::leaf(key, f(None)));
    n.len += 1;
}

/// Rewrites the leaf the private flat node256 in `slot` owns under byte `b`
/// ([`Flat::Replace`]): the old value.
#[inline(always)]
fn replace_flat<V: Clone, F: FnOnce(Option<&V>) -> V>(
    rec: &mut Recorder<V>,
    slot: &mut Child<V>,
    b: u8,
    key: &[u8],
    f: F,
) -> V {
    match slot.flat256_mut().and_then(|n| n.slots.get_mut_owned(b)) {
        Some(leaf) => replace_leaf(rec, leaf, key, f, false),
        None => unreachable!("an owned leaf"),
    }
}

/// Replaces the leaf the private flat node256 in `slot` borrows under byte
/// `b` ([`Flat::ReplaceBorrowed`]): the old value.
#[inline(always)]
fn replace_flat_borrowed<V: Clone, F: FnOnce(Option<&V>) -> V>(
    rec: &mut Recorder<V>,
    slot: &mut Child<V>,
    b: u8,
    key: &[u8],
    f: F,
) -> V {
    let (old, new) = borrowed_leaf_replacement(rec, slot, b, key, f);
    let Some(n) = slot.flat256_mut() else {
        unreachable!("a private flat node256")
    };
    n.slots.put(b, Some(new));
    old
}

/// Hangs `old`, the node a split at `at` (`cp` bytes into its segment)
/// took out of `slot`, below the new inner node now in `slot`.
#[inline(never)]
fn hang_split_off<V: Clone>(
    rec: &mut Recorder<V>,
    slot: &mut Child<V>,
    mut old: Child<V>,
    at: usize,
    cp: usize,
    is_root: bool,
) {
    if !old.is_leaf() {
        // A root split off is superseded: its watch must fire even when
        // only the root is watched. Any other keeps its contents: its watch
        // carries on.
        let below = crate::bytes::small(old.bytes().get(cp..).unwrap_or_default());
        if !is_root {
            rec.moved(&mut old, at, below);
        } else if rec.all && !old.is_unique() {
            rec.split_root(&mut old, cp, below);
        } else {
            rec.make_mut(&mut old, true).header_mut().bytes = below;
            // Only a root may hold fewer than two entries (a delete left it
            // so): below the new root it merges into its one entry.
            normalize(rec, &mut old);
        }
    } else if is_root {
        // A one-key root (only with root-only watches): its watch is the
        // tree's, and it stays as the new root's child, unchanged, so
        // closing the watch is enough.
        rec.nodes.push(old.clone());
    } else if rec.all {
        rec.push_down(&mut old, at);
    }
    slot.place(at, old);
}

/// The first key of a tree with root-only watches becomes its root: a
/// one-key tree is one leaf, and a transaction that rewrites its key copies
/// and frees no inner node. (With per-node watches the root stays an inner
/// node, whose watch must not fire for a change to that key.)
#[inline(never)]
fn first_key_as_root<V: Clone, F: FnOnce(Option<&V>) -> V>(
    rec: &mut Recorder<V>,
    root: &mut Child<V>,
    key: &[u8],
    f: F,
) {
    let leaf = Child::leaf(key, f(None));
    rec.nodes.push(std::mem::replace(root, leaf));
}

/// Writes `key`'s value as the terminal of the private inner node in
/// `slot`, whose segment ends where the key does: the old value, if any
/// (`len` counts a new key).
#[inline(always)]
fn write_terminal<V: Clone, F: FnOnce(Option<&V>) -> V>(
    rec: &mut Recorder<V>,
    len: &mut usize,
    slot: &mut Child<V>,
    key: &[u8],
    f: F,
) -> Option<V> {
    let term = slot.get_mut().and_then(NodeMut::terminal_mut);
    let Some(term) = term else {
        unreachable!("a private inner node")
    };
    match term {
        Some(leaf) => Some(replace_leaf(rec, leaf, key, f, false)),
        None => {
            *term = Some(Child::leaf(key, f(None)));
            *len += 1;
            None
        }
    }
}

/// Whether the private node in `slot` borrows, under `b`, the leaf of
/// `key` (written in place by [`borrowed_leaf_replacement`]).
#[inline(always)]
fn borrows_leaf_of<V>(slot: &Child<V>, b: u8, key: &[u8]) -> bool {
    slot.borrows_child(b)
        && matches!(slot.find_child(b).map(|c| c.kind()),
            Some(Kind::Leaf(l)) if l.h.bytes.eq_key(key))
}

/// The slot of the child under `b` of the (private) node in `slot`.
fn child_slot<V>(slot: &mut Child<V>, b: u8) -> &mut Child<V> {
    match slot.child_mut(b) {
        Some(c) => c,
        None => unreachable!("descending into a private node's existing child"),
    }
}

/// The old value and the new leaf for the leaf under `b`, whose key is
/// `key` and which the private node in `slot` borrows
/// ([`Child::borrows_child`]); the caller stores the new leaf in its place.
/// The old leaf's count is left alone (see `slots.rs`); a watched one is
/// kept to be closed at commit.
#[inline(always)]
fn borrowed_leaf_replacement<V: Clone, F: FnOnce(Option<&V>) -> V>(
    rec: &mut Recorder<V>,
    slot: &Child<V>,
    b: u8,
    key: &[u8],
    f: F,
) -> (V, Child<V>) {
    let Some(c) = slot.find_child(b) else {
        unreachable!("a borrowed leaf")
    };
    let Kind::Leaf(l) = c.kind() else {
        unreachable!("a borrowed leaf")
    };
    let old = l.value.clone();
    let gone = rec.all.then(|| c.clone());
    let new = Child::leaf(key, f(Some(&l.value)));
    if let Some(g) = gone {
        rec.nodes.push(g);
    }
    (old, new)
}

/// Replaces the value of the leaf in `slot` (the tree's root when
/// `is_root`); returns the old value.
fn replace_leaf<V: Clone, F: FnOnce(Option<&V>) -> V>(
    rec: &mut Recorder<V>,
    slot: &mut Child<V>,
    key: &[u8],
    f: F,
    is_root: bool,
) -> V {
    if let Some(NodeMut::Leaf(leaf)) = slot.get_mut() {
        if let Some(w) = leaf.h.watch.take() {
            rec.watch(w);
        }
        let new = f(Some(&leaf.value));
        return std::mem::replace(&mut leaf.value, new);
    }
    let new = f(slot.leaf_value());
    let old = std::mem::replace(slot, Child::leaf(key, new));
    if is_root {
        // A superseded root's watch fires even when only the root is watched.
        let value = leaf_value(&old);
        rec.nodes.push(old);
        return value;
    }
    take_value(old, rec)
}

fn leaf_value<V: Clone>(leaf: &Child<V>) -> V {
    match leaf.leaf_value() {
        Some(v) => v.clone(),
        None => unreachable!("removed entries are leaves"),
    }
}

/// The value of a leaf leaving the tree (cloned: older snapshots may share it).
fn take_value<V: Clone>(leaf: Child<V>, rec: &mut Recorder<V>) -> V {
    let value = leaf_value(&leaf);
    rec.removed(leaf);
    value
}

/// [`Txn::delete`] in one walk from `slot` (its node starting at `depth`),
/// for a path the transaction may change in place as it stands: every node
/// unique and holding no watch, every child reached one the node owns.
/// `make_mut` would then copy nothing and hand on no watch, so nothing needs
/// looking at before the walk, and a missing key leaves everything as it
/// was. Returns `None` (having changed nothing) when the walk meets a node
/// that needs [`Txn::delete`]'s careful path: a shared or watched node, a
/// child borrowed or unpatched, a key that ends at a terminal, or a leaf
/// whose parent is the root.
#[inline]
fn delete_in_place<V: Clone>(
    rec: &mut Recorder<V>,
    finger: &mut Finger<V>,
    mut slot: &mut Child<V>,
    key: &[u8],
    mut depth: usize,
    mut is_root: bool,
) -> Option<Option<V>> {
    loop {
        let top = depth;
        // `get_mut` is `make_mut`'s uniqueness test, without its copy.
        if !slot.get_mut()?.header_mut().watch.is_unset() {
            return None;
        }
        depth += slot.seg_len();
        let &b = key.get(depth)?;
        let Some(child) = slot.find_child(b) else {
            return Some(None);
        };
        if child.is_leaf() {
            if !child.bytes_eq(key) {
                return Some(None);
            }
            if is_root {
                return None;
            }
            if let Some((value, leaf)) = slot.remove_leaf_flat(b, rec.all) {
                if let Some(leaf) = leaf {
                    rec.removed(leaf);
                }
                finger.set(NonNull::from(slot), key, top);
                return Some(Some(value));
            }
            let (value, leaf) = slot.remove_leaf(b, rec.all)?;
            if let Some(leaf) = leaf {
                rec.removed(leaf);
            }
            normalize(rec, slot);
            finger.set(NonNull::from(slot), key, top);
            return Some(Some(value));
        }
        slot = slot.get_mut()?.owned_child_mut(b)?;
        is_root = false;
    }
}

/// Restores the inner-node invariants of the (already private) node in
/// `slot` after a removal: a node left with only a terminal becomes that
/// leaf; a node left with one child and no terminal merges into it.
fn normalize<V: Clone>(rec: &mut Recorder<V>, slot: &mut Child<V>) {
    match (slot.num_children(), slot.terminal().is_some()) {
        (0, true) => {
            if let Some(leaf) = slot
                .get_mut()
                .and_then(NodeMut::terminal_mut)
                .and_then(Option::take)
            {
                *slot = leaf;
            }
        }
        (1, false) => {
            let Some(b) = slot.first_child_byte() else {
                unreachable!("one child")
            };
            pass_to_child(rec, slot, b);
        }
        _ => {}
    }
}

/// Replaces the private inner node in `slot`, whose only entry is the child
/// under `b`, by that child; an inner child gets the node's segment joined
/// in front of its own.
fn pass_to_child<V: Clone>(rec: &mut Recorder<V>, slot: &mut Child<V>, b: u8) {
    let Some(mut child) = slot.remove_child(b) else {
        unreachable!("child present")
    };
    if !child.is_leaf() {
        let Some(node) = slot.get_mut() else {
            unreachable!("a private node")
        };
        let front = std::mem::take(&mut node.header_mut().bytes);
        // What was removed beside the child was under none of its prefixes.
        let seg = Bytes::concat(&front, child.bytes());
        rec.moved(&mut child, 0, seg);
    }
    *slot = child;
}
/// `Txn` is moved around by value (statedb keeps one per index in each
/// table transaction): past 128 bytes those moves became `memcpy` calls.
#[cfg(all(test, target_pointer_width = "64"))]
#[test]
fn txn_stays_small() {
    assert!(std::mem::size_of::<Txn<u32>>() <= 128);
}

#[cfg(test)]
mod tests {
    use crate::check::check;
    use crate::Tree;

    fn keys(t: &Tree<u32>) -> Vec<Vec<u8>> {
        t.iter().map(|(k, _)| k.to_vec()).collect()
    }

    #[test]
    fn the_root_takes_the_prefix_every_key_shares() {
        let mut txn = Tree::<u32>::new().txn();
        for i in 0..300u32 {
            txn.insert(&i.to_be_bytes(), i).unwrap();
        }
        let t = txn.commit();
        check(&t).unwrap();
        assert_eq!(t.root.bytes(), &[0, 0]);
        assert_eq!(t.get(&299u32.to_be_bytes()), Some(&299));
        assert_eq!(t.get(&[0, 0]), None);
        assert_eq!(t.get(&[]), None);

        // A key leaving the prefix splits the root.
        let (t2, _) = t.insert(&[0, 1], 7).unwrap();
        check(&t2).unwrap();
        assert_eq!(t2.root.bytes(), &[0]);
        assert_eq!(t2.get(&[0, 1]), Some(&7));
        assert_eq!(t2.len(), 301);

        // Deleting it leaves the root one child, shared with `t`: it stays
        // where it is (copying it would fire its watches).
        let (t3, old) = t2.delete(&[0, 1]);
        assert_eq!(old, Some(7));
        check(&t3).unwrap();
        assert_eq!(t3.root.bytes(), &[0]);
        assert_eq!(t3.root.num_children(), 1);
        assert_eq!(keys(&t3), keys(&t));

        // Emptied, the root keeps no path: the next key may differ anywhere.
        let mut txn = t3.txn();
        for i in 0..300u32 {
            txn.delete(&i.to_be_bytes());
        }
        assert!(txn.root.bytes().is_empty());
        txn.insert(&[9], 1).unwrap();
        txn.check_invariants().unwrap();
        let t4 = txn.commit();
        check(&t4).unwrap();
        assert_eq!(keys(&t4), vec![vec![9]]);
    }

    /// Deleting every leaf right under the root, one by one in one
    /// transaction (the first copies the shared root, the rest find it
    /// private): the root keeps its kind's invariants as it shrinks, drops
    /// its path once empty, and every deleted key's watch fires at commit.
    #[test]
    fn deletes_under_the_root_until_it_is_empty() {
        for root_only_watch in [false, true] {
            let opts = crate::Options { root_only_watch };
            let mut txn = Tree::<u32>::with_options(opts).txn();
            for i in 0..20u8 {
                txn.insert(&[b'a', b'b', i], u32::from(i)).unwrap();
            }
            let t = txn.commit();
            assert_eq!(t.root.bytes(), b"ab");
            let watches: Vec<_> = (0..20u8).map(|i| t.get_watch(&[b'a', b'b', i]).1).collect();
            let mut txn = t.txn();
            for i in 0..20u8 {
                assert_eq!(txn.delete(&[b'a', b'b', i]), Some(u32::from(i)));
                assert_eq!(txn.delete(&[b'a', b'b', i]), None);
                txn.check_invariants().unwrap();
                assert_eq!(txn.len(), usize::from(19 - i));
            }
            assert!(txn.root.bytes().is_empty());
            assert!(watches.iter().all(|w| !w.is_closed()));
            txn.insert(b"x", 1).unwrap();
            let t2 = txn.commit();
            check(&t2).unwrap();
            assert_eq!(keys(&t2), vec![b"x".to_vec()]);
            assert!(watches.iter().all(|w| w.is_closed()));
            assert_eq!(t.len(), 20);
            assert_eq!(t.get(&[b'a', b'b', 7]), Some(&7));
        }
    }

    #[test]
    fn a_key_shorter_than_the_root_prefix() {
        let mut txn = Tree::<u32>::new().txn();
        txn.insert(b"abcd1", 1).unwrap();
        txn.insert(b"abcd2", 2).unwrap();
        let t = txn.commit();
        assert_eq!(t.root.bytes(), b"abcd");
        assert_eq!(t.get(b"ab"), None);
        assert!(t.get_watch(b"ab").0.is_none());
        let (t2, _) = t.insert(b"ab", 3).unwrap();
        check(&t2).unwrap();
        assert_eq!(t2.root.bytes(), b"ab");
        assert_eq!(
            keys(&t2),
            vec![b"ab".to_vec(), b"abcd1".to_vec(), b"abcd2".to_vec()]
        );
        assert_eq!(t2.delete(b"ab").0.get(b"abcd2"), Some(&2));
    }
}
