//! Node layout: leaves and the four inner kinds (node4, node16, node48, node256).
//!
//! Every node is reached through a `triomphe::Arc`. A leaf stores its whole key;
//! an inner node stores only its compressed path segment, whose first byte is
//! the byte its parent indexes it by (the root's segment is empty). A value whose
//! key ends inside the tree at an inner node is kept as that node's `terminal`
//! leaf, so it has a watch of its own.

use smallvec::SmallVec;
use triomphe::Arc;

use crate::lazy::LazyWatch;
use crate::simd;

/// Key bytes: up to 16 bytes inline, longer keys on the heap.
pub(crate) type Bytes = SmallVec<[u8; 16]>;

/// Node kinds grow at these sizes (one past the kind's capacity) ...
pub(crate) const N4_MAX: usize = 4;
pub(crate) const N16_MAX: usize = 16;
pub(crate) const N48_MAX: usize = 48;
/// ... and shrink only when they fall to these, so that an insert/delete pair
/// at a boundary never flaps between two kinds.
pub(crate) const N16_MIN: usize = 4;
pub(crate) const N48_MIN: usize = 13;
pub(crate) const N256_MIN: usize = 38;

pub(crate) struct Node<V> {
    /// Leaf: the full key. Inner: this node's path segment.
    pub(crate) bytes: Bytes,
    pub(crate) kind: Kind<V>,
    pub(crate) watch: LazyWatch,
}

pub(crate) enum Kind<V> {
    Leaf(V),
    N4(Box<N4<V>>),
    N16(Box<N16<V>>),
    N48(Box<N48<V>>),
    N256(Box<N256<V>>),
}

pub(crate) type Child<V> = Arc<Node<V>>;

pub(crate) struct N4<V> {
    pub(crate) terminal: Option<Child<V>>,
    pub(crate) len: u8,
    pub(crate) keys: [u8; 4],
    pub(crate) children: [Option<Child<V>>; 4],
}

pub(crate) struct N16<V> {
    pub(crate) terminal: Option<Child<V>>,
    pub(crate) len: u8,
    pub(crate) keys: [u8; 16],
    pub(crate) children: [Option<Child<V>>; 16],
}

pub(crate) struct N48<V> {
    pub(crate) terminal: Option<Child<V>>,
    pub(crate) len: u8,
    /// Byte -> slot + 1; 0 means absent.
    pub(crate) index: [u8; 256],
    pub(crate) children: [Option<Child<V>>; 48],
}

pub(crate) struct N256<V> {
    pub(crate) terminal: Option<Child<V>>,
    pub(crate) len: u16,
    pub(crate) children: [Option<Child<V>>; 256],
}

impl<V: Clone> Clone for Kind<V> {
    fn clone(&self) -> Self {
        match self {
            Kind::Leaf(v) => Kind::Leaf(v.clone()),
            Kind::N4(n) => Kind::N4(Box::new(N4 {
                terminal: n.terminal.clone(),
                len: n.len,
                keys: n.keys,
                children: n.children.clone(),
            })),
            Kind::N16(n) => Kind::N16(Box::new(N16 {
                terminal: n.terminal.clone(),
                len: n.len,
                keys: n.keys,
                children: n.children.clone(),
            })),
            Kind::N48(n) => Kind::N48(Box::new(N48 {
                terminal: n.terminal.clone(),
                len: n.len,
                index: n.index,
                children: n.children.clone(),
            })),
            Kind::N256(n) => Kind::N256(Box::new(N256 {
                terminal: n.terminal.clone(),
                len: n.len,
                children: n.children.clone(),
            })),
        }
    }
}

fn none_array<T, const N: usize>() -> [Option<T>; N] {
    std::array::from_fn(|_| None)
}

impl<V> Node<V> {
    pub(crate) fn leaf(key: &[u8], value: V) -> Child<V> {
        Arc::new(Node {
            bytes: Bytes::from_slice(key),
            kind: Kind::Leaf(value),
            watch: LazyWatch::new(),
        })
    }

    pub(crate) fn empty_inner(segment: &[u8]) -> Node<V> {
        Node {
            bytes: Bytes::from_slice(segment),
            kind: Kind::N4(Box::new(N4 {
                terminal: None,
                len: 0,
                keys: [0; 4],
                children: none_array(),
            })),
            watch: LazyWatch::new(),
        }
    }

    #[inline]
    pub(crate) fn is_leaf(&self) -> bool {
        matches!(self.kind, Kind::Leaf(_))
    }

    #[inline]
    pub(crate) fn leaf_value(&self) -> Option<&V> {
        match &self.kind {
            Kind::Leaf(v) => Some(v),
            _ => None,
        }
    }

    #[inline]
    pub(crate) fn terminal(&self) -> Option<&Child<V>> {
        match &self.kind {
            Kind::Leaf(_) => None,
            Kind::N4(n) => n.terminal.as_ref(),
            Kind::N16(n) => n.terminal.as_ref(),
            Kind::N48(n) => n.terminal.as_ref(),
            Kind::N256(n) => n.terminal.as_ref(),
        }
    }

    #[inline]
    pub(crate) fn terminal_mut(&mut self) -> Option<&mut Option<Child<V>>> {
        match &mut self.kind {
            Kind::Leaf(_) => None,
            Kind::N4(n) => Some(&mut n.terminal),
            Kind::N16(n) => Some(&mut n.terminal),
            Kind::N48(n) => Some(&mut n.terminal),
            Kind::N256(n) => Some(&mut n.terminal),
        }
    }

    /// Number of children, the terminal not counted.
    #[inline]
    pub(crate) fn num_children(&self) -> usize {
        match &self.kind {
            Kind::Leaf(_) => 0,
            Kind::N4(n) => n.len as usize,
            Kind::N16(n) => n.len as usize,
            Kind::N48(n) => n.len as usize,
            Kind::N256(n) => n.len as usize,
        }
    }

    #[inline]
    pub(crate) fn find_child(&self, b: u8) -> Option<&Child<V>> {
        match &self.kind {
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
            Kind::N16(n) => {
                let i = simd::find16(&n.keys, n.len as usize, b)?;
                n.children[i].as_ref()
            }
            Kind::N48(n) => {
                let s = n.index[b as usize];
                if s == 0 {
                    None
                } else {
                    n.children[s as usize - 1].as_ref()
                }
            }
            Kind::N256(n) => n.children[b as usize].as_ref(),
        }
    }

    #[inline]
    pub(crate) fn find_child_mut(&mut self, b: u8) -> Option<&mut Child<V>> {
        match &mut self.kind {
            Kind::Leaf(_) => None,
            Kind::N4(n) => {
                let i = n.keys[..n.len as usize].iter().position(|&k| k == b)?;
                n.children[i].as_mut()
            }
            Kind::N16(n) => {
                let i = simd::find16(&n.keys, n.len as usize, b)?;
                n.children[i].as_mut()
            }
            Kind::N48(n) => {
                let s = n.index[b as usize];
                if s == 0 {
                    None
                } else {
                    n.children[s as usize - 1].as_mut()
                }
            }
            Kind::N256(n) => n.children[b as usize].as_mut(),
        }
    }

    /// Adds a child under a byte that is not present yet, growing the kind when full.
    pub(crate) fn add_child(&mut self, b: u8, child: Child<V>) {
        if self.num_children() == self.capacity() {
            self.grow();
        }
        match &mut self.kind {
            Kind::Leaf(_) => unreachable!("add_child on a leaf"),
            Kind::N4(n) => {
                let len = n.len as usize;
                let pos = n.keys[..len].iter().position(|&k| k > b).unwrap_or(len);
                n.keys.copy_within(pos..len, pos + 1);
                n.children[pos..=len].rotate_right(1);
                n.keys[pos] = b;
                n.children[pos] = Some(child);
                n.len += 1;
            }
            Kind::N16(n) => {
                let len = n.len as usize;
                let pos = simd::lower_bound16(&n.keys, len, b);
                n.keys.copy_within(pos..len, pos + 1);
                n.children[pos..=len].rotate_right(1);
                n.keys[pos] = b;
                n.children[pos] = Some(child);
                n.len += 1;
            }
            Kind::N48(n) => {
                let slot = n
                    .children
                    .iter()
                    .position(Option::is_none)
                    .expect("node48 has a free slot below capacity");
                n.children[slot] = Some(child);
                n.index[b as usize] = slot as u8 + 1;
                n.len += 1;
            }
            Kind::N256(n) => {
                n.children[b as usize] = Some(child);
                n.len += 1;
            }
        }
    }

    /// Removes and returns the child under `b`, shrinking the kind when it falls
    /// to the lower threshold.
    pub(crate) fn remove_child(&mut self, b: u8) -> Option<Child<V>> {
        let removed = match &mut self.kind {
            Kind::Leaf(_) => None,
            Kind::N4(n) => {
                let len = n.len as usize;
                let pos = n.keys[..len].iter().position(|&k| k == b)?;
                let c = n.children[pos].take();
                n.keys.copy_within(pos + 1..len, pos);
                n.children[pos..len].rotate_left(1);
                n.len -= 1;
                c
            }
            Kind::N16(n) => {
                let len = n.len as usize;
                let pos = simd::find16(&n.keys, len, b)?;
                let c = n.children[pos].take();
                n.keys.copy_within(pos + 1..len, pos);
                n.children[pos..len].rotate_left(1);
                n.len -= 1;
                c
            }
            Kind::N48(n) => {
                let s = n.index[b as usize];
                if s == 0 {
                    return None;
                }
                n.index[b as usize] = 0;
                n.len -= 1;
                n.children[s as usize - 1].take()
            }
            Kind::N256(n) => {
                let c = n.children[b as usize].take()?;
                n.len -= 1;
                Some(c)
            }
        };
        if removed.is_some() {
            self.maybe_shrink();
        }
        removed
    }

    fn capacity(&self) -> usize {
        match &self.kind {
            Kind::Leaf(_) => 0,
            Kind::N4(_) => N4_MAX,
            Kind::N16(_) => N16_MAX,
            Kind::N48(_) => N48_MAX,
            Kind::N256(_) => 256,
        }
    }

    /// Moves to the next larger kind, transferring children directly.
    fn grow(&mut self) {
        let kind = match &mut self.kind {
            Kind::N4(n) => {
                let mut m = Box::new(N16 {
                    terminal: n.terminal.take(),
                    len: n.len,
                    keys: [0; 16],
                    children: none_array(),
                });
                let len = n.len as usize;
                m.keys[..len].copy_from_slice(&n.keys[..len]);
                for i in 0..len {
                    m.children[i] = n.children[i].take();
                }
                Kind::N16(m)
            }
            Kind::N16(n) => {
                let mut m = Box::new(N48 {
                    terminal: n.terminal.take(),
                    len: n.len,
                    index: [0; 256],
                    children: none_array(),
                });
                for i in 0..n.len as usize {
                    m.index[n.keys[i] as usize] = i as u8 + 1;
                    m.children[i] = n.children[i].take();
                }
                Kind::N48(m)
            }
            Kind::N48(n) => {
                let mut m = Box::new(N256 {
                    terminal: n.terminal.take(),
                    len: n.len as u16,
                    children: none_array(),
                });
                for b in 0..256 {
                    let s = n.index[b];
                    if s != 0 {
                        m.children[b] = n.children[s as usize - 1].take();
                    }
                }
                Kind::N256(m)
            }
            _ => unreachable!("grow on a leaf or node256"),
        };
        self.kind = kind;
    }

    /// Moves to the next smaller kind once the count falls below the
    /// hysteresis threshold.
    fn maybe_shrink(&mut self) {
        let n = self.num_children();
        let kind = match &mut self.kind {
            Kind::N16(x) if n < N16_MIN => {
                let mut m = Box::new(N4 {
                    terminal: x.terminal.take(),
                    len: x.len,
                    keys: [0; 4],
                    children: none_array(),
                });
                m.keys[..n].copy_from_slice(&x.keys[..n]);
                for i in 0..n {
                    m.children[i] = x.children[i].take();
                }
                Kind::N4(m)
            }
            Kind::N48(x) if n < N48_MIN => {
                let mut m = Box::new(N16 {
                    terminal: x.terminal.take(),
                    len: 0,
                    keys: [0; 16],
                    children: none_array(),
                });
                for b in 0..256 {
                    let s = x.index[b];
                    if s != 0 {
                        let i = m.len as usize;
                        m.keys[i] = b as u8;
                        m.children[i] = x.children[s as usize - 1].take();
                        m.len += 1;
                    }
                }
                Kind::N16(m)
            }
            Kind::N256(x) if n < N256_MIN => {
                let mut m = Box::new(N48 {
                    terminal: x.terminal.take(),
                    len: 0,
                    index: [0; 256],
                    children: none_array(),
                });
                for b in 0..256 {
                    if let Some(c) = x.children[b].take() {
                        let i = m.len as usize;
                        m.children[i] = Some(c);
                        m.index[b] = i as u8 + 1;
                        m.len += 1;
                    }
                }
                Kind::N48(m)
            }
            _ => return,
        };
        self.kind = kind;
    }

    /// The child at the first position `>= pos` (positions are array slots for
    /// node4/node16 and bytes for node48/node256), with that position.
    #[inline]
    pub(crate) fn next_child(&self, pos: usize) -> Option<(usize, &Child<V>)> {
        match &self.kind {
            Kind::Leaf(_) => None,
            Kind::N4(n) => n.children[..n.len as usize]
                .get(pos)
                .and_then(Option::as_ref)
                .map(|c| (pos, c)),
            Kind::N16(n) => n.children[..n.len as usize]
                .get(pos)
                .and_then(Option::as_ref)
                .map(|c| (pos, c)),
            Kind::N48(n) => (pos..256).find_map(|b| {
                let s = n.index[b];
                (s != 0)
                    .then(|| (b, n.children[s as usize - 1].as_ref()))?
                    .1
                    .map(|c| (b, c))
            }),
            Kind::N256(n) => (pos..256).find_map(|b| n.children[b].as_ref().map(|c| (b, c))),
        }
    }

    /// The child at the last position `<= pos`, with that position.
    #[inline]
    pub(crate) fn prev_child(&self, pos: usize) -> Option<(usize, &Child<V>)> {
        match &self.kind {
            Kind::Leaf(_) => None,
            Kind::N4(n) => {
                let len = n.len as usize;
                if len == 0 {
                    return None;
                }
                let p = pos.min(len - 1);
                n.children[p].as_ref().map(|c| (p, c))
            }
            Kind::N16(n) => {
                let len = n.len as usize;
                if len == 0 {
                    return None;
                }
                let p = pos.min(len - 1);
                n.children[p].as_ref().map(|c| (p, c))
            }
            Kind::N48(n) => (0..=pos.min(255)).rev().find_map(|b| {
                let s = n.index[b];
                (s != 0)
                    .then(|| (b, n.children[s as usize - 1].as_ref()))?
                    .1
                    .map(|c| (b, c))
            }),
            Kind::N256(n) => (0..=pos.min(255))
                .rev()
                .find_map(|b| n.children[b].as_ref().map(|c| (b, c))),
        }
    }

    /// The position of the first child whose byte is `>= b`, or one past the end.
    #[inline]
    pub(crate) fn position_ge(&self, b: u8) -> usize {
        match &self.kind {
            Kind::Leaf(_) => 0,
            Kind::N4(n) => n.keys[..n.len as usize]
                .iter()
                .position(|&k| k >= b)
                .unwrap_or(n.len as usize),
            Kind::N16(n) => simd::lower_bound16(&n.keys, n.len as usize, b),
            Kind::N48(_) | Kind::N256(_) => b as usize,
        }
    }

    /// Largest possible position; `prev_child(last_position())` is the last child.
    #[inline]
    pub(crate) fn last_position(&self) -> usize {
        match &self.kind {
            Kind::N48(_) | Kind::N256(_) => 255,
            _ => self.num_children().saturating_sub(1),
        }
    }

    /// A shallow copy: children are shared, the watch slot is fresh.
    pub(crate) fn shallow_clone(&self) -> Node<V>
    where
        V: Clone,
    {
        Node {
            bytes: self.bytes.clone(),
            kind: self.kind.clone(),
            watch: LazyWatch::new(),
        }
    }

    /// The key byte this node is indexed by in its parent, at depth `depth`.
    #[inline]
    pub(crate) fn index_byte(&self, depth: usize) -> u8 {
        if self.is_leaf() {
            self.bytes[depth]
        } else {
            self.bytes[0]
        }
    }

    /// The node's segment when it sits at `depth`.
    #[inline]
    pub(crate) fn segment(&self, depth: usize) -> &[u8] {
        if self.is_leaf() {
            &self.bytes[depth..]
        } else {
            &self.bytes
        }
    }
}

impl<V> Drop for Node<V> {
    /// Drops a deep tree without deep recursion: children whose last reference
    /// is this node are moved to a work list and taken apart one by one.
    fn drop(&mut self) {
        if self.is_leaf() {
            return;
        }
        let mut work: Vec<Child<V>> = Vec::new();
        collect_unique(self, &mut work);
        while let Some(child) = work.pop() {
            if let Some(mut node) = Arc::into_unique(child) {
                collect_unique(&mut node, &mut work);
            }
        }
    }
}

/// Moves the inner children of `node` that nothing else references into
/// `work`, so dropping `node` itself recurses no further.
fn collect_unique<V>(node: &mut Node<V>, work: &mut Vec<Child<V>>) {
    let slots: &mut [Option<Child<V>>] = match &mut node.kind {
        Kind::Leaf(_) => return,
        Kind::N4(n) => &mut n.children,
        Kind::N16(n) => &mut n.children,
        Kind::N48(n) => &mut n.children,
        Kind::N256(n) => &mut n.children,
    };
    for slot in slots {
        if slot.as_ref().is_some_and(|c| !c.is_leaf() && c.is_unique()) {
            work.extend(slot.take());
        }
    }
}

impl<V> Node<V> {
    /// The first position holding a child whose byte is `> b`.
    #[inline]
    pub(crate) fn position_after(&self, b: u8) -> usize {
        match &self.kind {
            Kind::N48(_) | Kind::N256(_) => b as usize + 1,
            _ => {
                let p = self.position_ge(b);
                p + usize::from(self.find_child(b).is_some())
            }
        }
    }

    /// The last position that can hold a child whose byte is `< b`.
    #[inline]
    pub(crate) fn position_before(&self, b: u8) -> Option<usize> {
        match &self.kind {
            Kind::N48(_) | Kind::N256(_) => (b as usize).checked_sub(1),
            _ => self.position_ge(b).checked_sub(1),
        }
    }

    /// Places `child` under this node at `depth` (the depth where this node's
    /// children start): as the terminal when its key ends there, else under
    /// its index byte.
    pub(crate) fn place(&mut self, depth: usize, child: Child<V>) {
        if child.is_leaf() && child.bytes.len() == depth {
            if let Some(t) = self.terminal_mut() {
                *t = Some(child);
            }
        } else {
            let b = child.index_byte(depth);
            self.add_child(b, child);
        }
    }
}

impl<V> Node<V> {
    /// The smallest byte that has a child.
    pub(crate) fn first_child_byte(&self) -> Option<u8> {
        match &self.kind {
            Kind::Leaf(_) => None,
            Kind::N4(n) => (n.len > 0).then(|| n.keys[0]),
            Kind::N16(n) => (n.len > 0).then(|| n.keys[0]),
            Kind::N48(n) => n.index.iter().position(|&s| s != 0).map(|b| b as u8),
            Kind::N256(n) => n.children.iter().position(Option::is_some).map(|b| b as u8),
        }
    }
}
