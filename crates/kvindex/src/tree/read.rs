//! Lookups.

use smallvec::SmallVec;

use super::node::Wid;
use super::ConcurrentIndex;
use crate::hash::LocalHash;
use crate::scores::OverlapScores;

impl ConcurrentIndex {
    /// Walks from the root, one short read lock per node. Within one node's
    /// critical section the run, the worker set and the next child pointer
    /// are a consistent snapshot, so every block credited to a worker was
    /// held by it at the instant that node was read. A child reached through
    /// a stale pointer is recognised by `dead` or by a `start` that is not
    /// the depth matched so far, and ends the walk (an undercount, never an
    /// overcount).
    pub(super) fn find(&self, q: &[LocalHash]) -> OverlapScores {
        let out = OverlapScores::new();
        let Some(first) = q.first() else {
            return out;
        };
        // Pinned for the whole walk: nodes are followed by plain reference
        // (`Linked::pinned`), with no reference count per node visited.
        let guard = super::sync::pin();
        let mut next = self
            .root
            .read()
            .children
            .get(first)
            .map(|c| c.pinned(&guard));
        let mut active: SmallVec<[Wid; 128]> = SmallVec::new();
        let mut done: SmallVec<[(Wid, u32); 64]> = SmallVec::new();
        let mut depth = 0usize;
        let mut started = false;
        while let Some(c) = next.take() {
            let g = c.read();
            if g.dead || g.start as usize != depth {
                break;
            }
            let run = &g.blocks;
            let mut k = 0;
            while k < run.len() && depth + k < q.len() && run[k] == q[depth + k] {
                k += 1;
            }
            if k == 0 {
                break;
            }
            if !started {
                active.extend_from_slice(&g.workers);
                started = true;
            } else {
                // Sorted merge: keep workers present in this node too.
                let ws = &g.workers;
                let mut j = 0;
                let mut kept = 0;
                for idx in 0..active.len() {
                    let a = active[idx];
                    while j < ws.len() && ws[j] < a {
                        j += 1;
                    }
                    if j < ws.len() && ws[j] == a {
                        active[kept] = a;
                        kept += 1;
                    } else {
                        done.push((a, depth as u32));
                    }
                }
                active.truncate(kept);
            }
            depth += k;
            if active.is_empty() || k < run.len() || depth == q.len() {
                break;
            }
            next = g.children.get(&q[depth]).map(|c| c.pinned(&guard));
        }
        if done.is_empty() && active.is_empty() {
            return out;
        }
        let keys = self.registry.keys.load();
        let mut pairs = Vec::with_capacity(done.len() + active.len());
        pairs.extend(done.iter().map(|&(w, s)| (keys[w as usize], s)));
        pairs.extend(active.iter().map(|&w| (keys[w as usize], depth as u32)));
        OverlapScores::from_pairs(pairs)
    }
}
