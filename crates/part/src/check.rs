//! Structural invariant checker, for tests.
//!
//! Checks that the concatenated segments on every path equal the leaf keys
//! below them, that each node kind holds at least its minimum number of
//! children, that no inner node (but the root) is empty or a lone pass-through,
//! that node4/node16 keys are sorted and the node48 index is consistent, and
//! that the tree's length equals its leaf count.

use crate::node::{Child, Kind, N16_MIN, N256_MIN, N48_MIN};
use crate::Tree;

/// Checks every structural invariant; returns a description of the first
/// violation.
pub fn check<V>(tree: &Tree<V>) -> Result<(), String> {
    check_root(&tree.root, tree.len)
}

pub(crate) fn check_root<V>(root: &Child<V>, len: usize) -> Result<(), String> {
    if root.is_leaf() {
        // A one-key tree's root may be its leaf.
        return match len {
            1 => Ok(()),
            _ => Err(format!("a leaf root in a tree of {len} keys")),
        };
    }
    if !root.bytes().is_empty() && root.num_children() == 0 && root.terminal().is_none() {
        return Err("an empty root must have an empty segment".into());
    }
    let mut leaves = 0usize;
    // (node, path before its segment, is_root)
    let mut stack: Vec<(&Child<V>, Vec<u8>, bool)> = vec![(root, Vec::new(), true)];
    while let Some((n, before, is_root)) = stack.pop() {
        let mut path = before.clone();
        path.extend_from_slice(n.bytes());
        let children = n.num_children();
        let term = n.terminal();
        if !is_root {
            if n.bytes().is_empty() {
                return Err(format!("inner node at {before:?} has an empty segment"));
            }
            if children + usize::from(term.is_some()) < 2 {
                return Err(format!("inner node at {path:?} has fewer than two entries"));
            }
        }
        let (min, counted) = match n.kind() {
            Kind::Leaf(_) => return Err(format!("leaf on the inner-node stack at {path:?}")),
            Kind::N4(x) => {
                if !x.keys[..x.len as usize].windows(2).all(|w| w[0] < w[1]) {
                    return Err(format!("node4 keys unsorted at {path:?}"));
                }
                (0, x.children.iter().filter(|c| c.is_some()).count())
            }
            Kind::N16(x) => {
                if !x.keys[..x.len as usize].windows(2).all(|w| w[0] < w[1]) {
                    return Err(format!("node16 keys unsorted at {path:?}"));
                }
                (N16_MIN, x.children.iter().filter(|c| c.is_some()).count())
            }
            Kind::N48(x) => {
                let used = x.index.iter().filter(|&&s| s != 0).count();
                for &s in x.index.iter().filter(|&&s| s != 0) {
                    if x.children[s as usize - 1].is_none() {
                        return Err(format!("node48 index points at an empty slot at {path:?}"));
                    }
                }
                let filled = x.children.iter().filter(|c| c.is_some()).count();
                if used != filled {
                    return Err(format!("node48 index/slot mismatch at {path:?}"));
                }
                (N48_MIN, filled)
            }
            Kind::N256(x) => {
                x.slots.check().map_err(|e| format!("{e} at {path:?}"))?;
                (
                    N256_MIN,
                    x.slots.array().iter().filter(|c| c.is_some()).count(),
                )
            }
            Kind::D256(x) => {
                x.p.check().map_err(|e| format!("{e} at {path:?}"))?;
                (
                    N256_MIN,
                    (0..=255u8).filter(|&b| n.find_child(b).is_some()).count(),
                )
            }
        };
        if counted != children {
            return Err(format!("child count {children} != {counted} at {path:?}"));
        }
        if !is_root && children < min {
            return Err(format!(
                "{children} children below the kind's minimum {min} at {path:?}"
            ));
        }
        if let Some(t) = term {
            if !t.is_leaf() || t.bytes() != path.as_slice() {
                return Err(format!("terminal at {path:?} has key {:?}", t.bytes()));
            }
            leaves += 1;
        }
        let mut pos = 0;
        while let Some((p, c)) = n.next_child(pos) {
            pos = p + 1;
            let b = c.index_byte(path.len());
            if n.find_child(b).map(|x| x.ptr_eq(c)) != Some(true) {
                return Err(format!("child under byte {b} at {path:?} is misindexed"));
            }
            if c.is_leaf() {
                if c.bytes().len() <= path.len() || !c.bytes().starts_with(&path) {
                    return Err(format!(
                        "leaf {:?} does not extend path {path:?}",
                        c.bytes()
                    ));
                }
                leaves += 1;
            } else {
                stack.push((c, path.clone(), false));
            }
        }
    }
    if leaves != len {
        return Err(format!("len {len} but {leaves} leaves"));
    }
    Ok(())
}

/// Allocations this thread's node256 copies took from the per-thread
/// cache of freed blocks instead of the global allocator, and their bytes:
/// a counting allocator must add them to count what the tree allocated.
pub fn blocks_reused() -> (u64, u64) {
    crate::big::reused()
}

/// Node counts by kind: `[leaf, node4, node16, node48, node256]`.
pub fn kinds<V>(tree: &Tree<V>) -> [usize; 5] {
    let mut out = [0usize; 5];
    let mut stack: Vec<&Child<V>> = vec![&tree.root];
    while let Some(n) = stack.pop() {
        let i = match n.kind() {
            Kind::Leaf(_) => 0,
            Kind::N4(_) => 1,
            Kind::N16(_) => 2,
            Kind::N48(_) => 3,
            Kind::N256(_) | Kind::D256(_) => 4,
        };
        out[i] += 1;
        if let Some(t) = n.terminal() {
            stack.push(t);
        }
        let mut pos = 0;
        while let Some((p, c)) = n.next_child(pos) {
            pos = p + 1;
            stack.push(c);
        }
    }
    out
}
