//! Applying events to the concurrent tree.
//!
//! Lock order is strictly top-down (a parent before its child); a writer
//! holds at most a node and one of its children at once (plus grandchildren
//! briefly while re-pointing their parent hints during a merge). Going up
//! (to a parent) always releases first and re-validates after locking.

use std::sync::Arc;

use super::sync::RwLock;
use hashbrown::HashMap;
use smallvec::SmallVec;

use super::node::{
    set_contains, set_insert, set_remove, split, Children, Node, NodeRef, Run, WGuard, Wid,
};
use super::{ConcurrentIndex, Loc, WorkerState};
use crate::event::{ApplyError, KvEvent, StoredBlock};
use crate::hash::ExternalHash;

/// Longest run a node holds. Resolving a worker's block walks at most the
/// nodes its slot's run was split into, so this bounds that walk (and an
/// event stream that splits one long run block by block stays linear).
pub(super) const MAX_RUN: usize = 256;

/// Deepest supported depth (runs are addressed with `u32` depths).
const MAX_DEPTH: u64 = u32::MAX as u64 - 2;

/// Where a Stored event's next block goes: `node` is write-locked and held
/// whole by the worker (`None`: the root, not locked); `next` is the run
/// offset past the last block matched.
struct Cursor {
    node: Option<WGuard>,
    next: usize,
}

impl Cursor {
    /// The depth of the next block.
    #[inline(always)]
    fn depth(&self) -> u64 {
        match &self.node {
            Some(x) => x.start as u64 + self.next as u64,
            None => 0,
        }
    }

    /// Whether the node's run continues with `b` (the worker holds it under
    /// another external id). When the run continues with another block the
    /// node is split there, so that `b` branches below its head.
    #[inline(always)]
    fn holds_next(&mut self, b: StoredBlock) -> bool {
        if let Some(x) = self.node.as_mut() {
            if self.next < x.blocks.len() {
                if x.blocks[self.next] == b.local {
                    return true;
                }
                split(x, self.next);
            }
        }
        false
    }
}

/// A Stored event's progress: the next block (`i`), the blocks stored so
/// far, and the nodes the worker joined (merge candidates afterwards).
struct Storing<'b> {
    blocks: &'b [StoredBlock],
    i: usize,
    stored: u64,
    touched: Vec<NodeRef>,
}

fn arc_of(g: &WGuard) -> NodeRef {
    Arc::clone(WGuard::rwlock(g))
}

impl ConcurrentIndex {
    fn is_root(&self, n: &NodeRef) -> bool {
        Arc::ptr_eq(n, &self.root)
    }

    /// Write-locks the live node that holds `depth` on the path `start`
    /// was on, following forward links (merged nodes) and tail links (split
    /// nodes). Also returns the first live node reached from `start` through
    /// forward links only, if `start` was dead: it contains every depth the
    /// dead node did, so hints to the dead node may be moved to it.
    fn resolve(&self, start: &NodeRef, depth: u32) -> Option<(WGuard, Option<NodeRef>)> {
        // Fast path: the hint is alive and holds the depth (no extra
        // reference-count traffic beyond the owned guard's).
        let g = start.write_arc();
        if !g.dead && depth >= g.start && depth < g.end() {
            return Some((g, None));
        }
        let mut n: NodeRef;
        // True while every hop so far followed a dead node's forward link.
        let mut fwd_only = true;
        let mut absorber = None;
        let mut g = g;
        loop {
            if g.dead {
                let f = g.link.clone()?;
                drop(g);
                if fwd_only {
                    absorber = Some(Arc::clone(&f));
                }
                n = f;
                g = n.write_arc();
                continue;
            }
            fwd_only = false;
            if depth < g.start {
                return None;
            }
            if depth < g.end() {
                return Some((g, absorber));
            }
            let t = g.link.clone()?;
            drop(g);
            n = t;
            g = n.write_arc();
        }
    }

    /// Write-locks the node holding a worker's block at `loc`, moving the
    /// slot off a merged-away node when one is found.
    pub(super) fn lock_loc(&self, ws: &mut WorkerState, loc: Loc) -> Option<WGuard> {
        let (g, absorber) = {
            let start = ws.slots[loc.slot as usize].node.as_ref()?;
            self.resolve(start, loc.depth)?
        };
        if let Some(a) = absorber {
            ws.retarget(loc.slot, a);
        }
        Some(g)
    }

    /// Write-locks the parent of a node with first depth `start` and parent
    /// hint `hint`. The caller re-validates the relationship.
    fn lock_parent(&self, start: u32, hint: Option<NodeRef>) -> Option<WGuard> {
        if start == 0 {
            return Some(self.root.write_arc());
        }
        self.resolve(&hint?, start - 1).map(|(g, _)| g)
    }

    pub(super) fn stored(
        &self,
        ws: &mut WorkerState,
        ev: &KvEvent,
        parent: Option<ExternalHash>,
        blocks: &[StoredBlock],
    ) -> Result<(), ApplyError> {
        // Room in the worker's map for every block of the event, made
        // before any node is locked: a map rebuild moves every entry, and
        // below this point the map is filled while readers may be waiting
        // on the node being filled.
        ws.blocks.reserve(blocks.len());
        let mut cur = self.cursor_at_parent(ws, ev, parent)?;
        let mut st = Storing {
            blocks,
            i: 0,
            stored: 0,
            touched: Vec::new(),
        };
        while let Some(&b) = blocks.get(st.i) {
            // A block the worker already holds under this id: a replay.
            // The chain continues from where that block lives.
            if let Some(loc) = ws.blocks.get(&b.external) {
                if self.resume_at(ws, &mut cur, loc, b.external) {
                    st.i += 1;
                }
                continue;
            }
            if cur.depth() >= MAX_DEPTH {
                ws.stats.blocks_stored += st.stored;
                return Err(ApplyError::TooDeep {
                    worker: ev.worker,
                    event_id: ev.event_id,
                    max: MAX_DEPTH,
                });
            }
            if cur.holds_next(b) {
                // Already held under another external id: ignored.
                cur.next += 1;
                st.i += 1;
                continue;
            }
            // At the end of the cursor's run: find or make the child for b.
            let child = match &cur.node {
                Some(x) => x.children.get(&b.local).map(|c| NodeRef::clone(c)),
                None => self
                    .root
                    .read()
                    .children
                    .get(&b.local)
                    .map(|c| NodeRef::clone(c)),
            };
            match child {
                Some(c) => self.enter_child(ws, &mut cur, c, &mut st),
                None => self.extend_or_branch(ws, &mut cur, &mut st),
            }
        }
        drop(cur);
        ws.stats.blocks_stored += st.stored;
        for n in st.touched {
            self.try_merge(&n);
            self.try_merge_into_parent(&n);
        }
        Ok(())
    }

    /// The cursor a Stored event starts from: the root, or the node holding
    /// its parent block, which the worker must hold.
    #[inline(always)]
    fn cursor_at_parent(
        &self,
        ws: &mut WorkerState,
        ev: &KvEvent,
        parent: Option<ExternalHash>,
    ) -> Result<Cursor, ApplyError> {
        let Some(p) = parent else {
            return Ok(Cursor {
                node: None,
                next: 0,
            });
        };
        let g = ws.blocks.get(&p).and_then(|loc| {
            let d = loc.depth;
            self.lock_loc(ws, loc).map(|g| (g, d))
        });
        match g {
            Some((g, d)) if set_contains(&g.workers, ws.id) => Ok(Cursor {
                next: (d - g.start) as usize + 1,
                node: Some(g),
            }),
            _ => {
                ws.stats.unknown_parents += 1;
                Err(ApplyError::UnknownParent {
                    worker: ev.worker,
                    event_id: ev.event_id,
                    parent: p,
                })
            }
        }
    }

    /// Moves the cursor past the block the worker already holds at `loc`.
    /// False when that location no longer resolves (unreachable while the
    /// invariants hold): the entry is forgotten and the block is stored
    /// anew.
    #[inline(always)]
    fn resume_at(
        &self,
        ws: &mut WorkerState,
        cur: &mut Cursor,
        loc: Loc,
        external: ExternalHash,
    ) -> bool {
        drop(cur.node.take());
        match self.lock_loc(ws, loc) {
            Some(g) => {
                cur.next = (loc.depth - g.start) as usize + 1;
                cur.node = Some(g);
                true
            }
            None => {
                ws.blocks.remove(&external);
                ws.unref(loc.slot);
                false
            }
        }
    }

    /// Moves the cursor into child `c` of its node (for the next block):
    /// the worker joins the blocks of the child's run that the event
    /// continues with, the child split after them when the event diverges
    /// inside its run.
    #[inline(always)]
    fn enter_child(&self, ws: &mut WorkerState, cur: &mut Cursor, c: NodeRef, st: &mut Storing) {
        let mut cg = c.write_arc();
        if cg.dead {
            // Only possible when the cursor is at the root (not locked):
            // the child was unlinked meanwhile. The caller retries.
            return;
        }
        drop(cur.node.take());
        if set_contains(&cg.workers, ws.id) {
            cur.next = 0;
            cur.node = Some(cg);
            return;
        }
        let (blocks, i) = (st.blocks, st.i);
        let mut m = 0usize;
        let slot = ws.slot_for(&c);
        while m < cg.blocks.len() && i + m < blocks.len() {
            let bb = blocks[i + m];
            if cg.blocks[m] != bb.local || !ws.insert_block(bb.external, slot, cg.start + m as u32)
            {
                break;
            }
            m += 1;
        }
        ws.free_if_unused(slot);
        debug_assert!(m > 0);
        if m < cg.blocks.len() {
            if cg.workers.is_empty() && cg.children.is_none() {
                // A workerless leaf (about to be unlinked by the writer that
                // emptied it): nobody holds its tail, so drop the tail
                // instead of splitting it off into a new workerless leaf
                // nobody would unlink.
                cg.blocks.truncate(m);
            } else {
                split(&mut cg, m);
            }
        }
        set_insert(&mut cg.workers, ws.id);
        st.stored += m as u64;
        st.i += m;
        st.touched.push(Arc::clone(&c));
        cur.next = m;
        cur.node = Some(cg);
    }

    /// No child for the next block: append to the cursor's run when the
    /// worker is the sole holder of that leaf, else hang a new leaf below
    /// it.
    #[inline(always)]
    fn extend_or_branch(&self, ws: &mut WorkerState, cur: &mut Cursor, st: &mut Storing) {
        let local = st.blocks[st.i].local;
        let mut x = match cur.node.take() {
            Some(x) => x,
            None => {
                let r = self.root.write_arc();
                if r.children.get(&local).is_some() {
                    return; // raced with another writer; the caller retries
                }
                r
            }
        };
        let w = ws.id;
        let x_is_root = self.is_root(&arc_of(&x));
        if !x_is_root
            && x.children.is_none()
            && x.workers.len() == 1
            && x.workers[0] == w
            && x.blocks.len() < MAX_RUN
        {
            // Sole holder of a leaf: append to its run.
            let node = arc_of(&x);
            let n = self.take_run(ws, &node, x.end(), st.blocks, st.i, &mut x.blocks);
            st.stored += n as u64;
            st.i += n;
            cur.next = x.blocks.len();
            cur.node = Some(x);
            return;
        }
        let start = x.end();
        let leaf = Arc::new(RwLock::new(Node {
            start,
            dead: false,
            blocks: Run::new(),
            workers: std::iter::once(w).collect(),
            children: Children::None,
            parent: Some(arc_of(&x)),
            link: None,
        }));
        // Publish the leaf while holding its write lock, then release the
        // (possibly shared, hot) parent before filling the run and the
        // worker's map: nobody can observe the leaf until its run is
        // complete, and the parent is locked only for the insertion.
        let mut lg = leaf.write_arc();
        x.children.insert(local, Arc::clone(&leaf));
        drop(x);
        let mut run = Run::new();
        let n = self.take_run(ws, &leaf, start, st.blocks, st.i, &mut run);
        debug_assert!(n > 0);
        lg.blocks = run;
        st.stored += n as u64;
        st.i += n;
        cur.next = lg.blocks.len();
        cur.node = Some(lg);
    }

    /// Appends to `run` the blocks from `blocks[i..]` up to the first whose
    /// external id is already known, recording their locations in `node`
    /// starting at depth `start + run.len()`. Returns how many were taken
    /// (at least one: the caller checked `blocks[i]`).
    fn take_run(
        &self,
        ws: &mut WorkerState,
        node: &NodeRef,
        start: u32,
        blocks: &[StoredBlock],
        i: usize,
        run: &mut Run,
    ) -> usize {
        let mut n = 0;
        let mut depth = start;
        let room = MAX_RUN - run.len();
        let want = (blocks.len() - i).min(room);
        run.reserve(want);
        let slot = ws.slot_for(node);
        while let Some(bb) = blocks.get(i + n) {
            if n == room
                || (depth as u64) >= MAX_DEPTH
                || !ws.insert_block(bb.external, slot, depth)
            {
                break;
            }
            run.push(bb.local);
            n += 1;
            depth += 1;
        }
        ws.free_if_unused(slot);
        n
    }

    pub(super) fn removed(&self, ws: &mut WorkerState, hashes: &[ExternalHash]) {
        // Two passes: the map removals are independent of each other, so
        // the CPU overlaps their cache misses; the tree work follows.
        let locs: SmallVec<[Option<Loc>; 32]> =
            hashes.iter().map(|h| ws.blocks.remove(h)).collect();
        let mut i = 0;
        while i < locs.len() {
            let Some(loc) = locs[i] else {
                ws.stats.unknown_removes += 1;
                i += 1;
                continue;
            };
            let Some(g) = self.lock_loc(ws, loc) else {
                ws.stats.unknown_removes += 1;
                ws.unref(loc.slot);
                i += 1;
                continue;
            };
            // Engines evict a request's blocks leaf-first, so the next
            // hashes are usually the blocks just above in the same node:
            // gather the longest run of them at consecutive depths (either
            // direction) and remove the worker from the whole range at once,
            // one split and one merge instead of one per block. Blocks of
            // the same slot whose depth lies in `g`'s range are in `g` (a
            // slot's blocks lie on one chain of nodes, and resolution stops
            // at the first node of the chain holding the depth).
            let (mut lo, mut hi) = (loc.depth, loc.depth);
            let mut j = i + 1;
            while let Some(Some(l)) = locs.get(j) {
                let adjacent = (l.depth.checked_add(1) == Some(lo)) || (l.depth == hi + 1);
                if l.slot != loc.slot || !adjacent || l.depth < g.start || l.depth >= g.end() {
                    break;
                }
                lo = lo.min(l.depth);
                hi = hi.max(l.depth);
                j += 1;
            }
            let n = (j - i) as u64;
            let (a, b) = ((lo - g.start) as usize, (hi - g.start) as usize);
            if self.remove_range(ws.id, g, a, b) {
                ws.stats.blocks_removed += n;
            } else {
                ws.stats.unknown_removes += n;
            }
            for l in locs[i..j].iter().flatten() {
                ws.unref(l.slot);
            }
            i = j;
        }
        ws.blocks.shrink_if_sparse();
    }

    /// Removes worker `w` from run offsets `lo..=hi` of the locked node `g`
    /// (false if `w` does not hold it).
    fn remove_range(&self, w: Wid, mut g: WGuard, lo: usize, hi: usize) -> bool {
        if !set_contains(&g.workers, w) {
            return false;
        }
        let len = g.blocks.len();
        if lo > 0 && hi == len - 1 && g.workers.len() == 1 && g.children.is_none() {
            // Sole holder dropping a leaf's tail: shrink in place.
            g.blocks.truncate(lo);
            return true;
        }
        if hi + 1 < len {
            split(&mut g, hi + 1);
        }
        let mut target = if lo > 0 {
            let t = split(&mut g, lo);
            let tg = t.write_arc();
            drop(g);
            tg
        } else {
            g
        };
        set_remove(&mut target.workers, w);
        let t = arc_of(&target);
        let empty = target.workers.is_empty() && target.children.is_none();
        drop(target);
        if empty {
            self.try_kill(t);
        } else {
            self.try_merge(&t);
            self.try_merge_into_parent(&t);
        }
        true
    }

    pub(super) fn clear(&self, ws: &mut WorkerState) {
        let w = ws.id;
        let mut nodes: HashMap<usize, NodeRef, foldhash::fast::RandomState> = HashMap::default();
        let mut removed = 0u64;
        let locs: Vec<Loc> = ws.blocks.iter().map(|(_, l)| l).collect();
        for loc in locs {
            removed += 1;
            let Some(mut g) = self.lock_loc(ws, loc) else {
                continue;
            };
            if set_remove(&mut g.workers, w) {
                let n = arc_of(&g);
                nodes.insert(Arc::as_ptr(&n) as usize, n);
            }
        }
        ws.reset();
        ws.stats.blocks_removed += removed;
        for (_, n) in nodes {
            let empty = {
                let g = n.read();
                !g.dead && g.workers.is_empty() && g.children.is_none()
            };
            if empty {
                self.try_kill(n);
            } else {
                self.try_merge(&n);
                self.try_merge_into_parent(&n);
            }
        }
    }

    /// Unlinks `n` if it is a workerless leaf, then walks up doing the same
    /// for parents that became workerless leaves; finally tries to merge the
    /// first surviving ancestor with its (now maybe single) child.
    fn try_kill(&self, mut n: NodeRef) {
        loop {
            if self.is_root(&n) {
                return;
            }
            let (start, hint, first) = {
                let g = n.read();
                if g.dead || !g.workers.is_empty() || !g.children.is_none() {
                    return;
                }
                (g.start, g.parent.clone(), g.blocks[0])
            };
            let Some(mut pg) = self.lock_parent(start, hint) else {
                return;
            };
            let mut g = n.write_arc();
            if g.dead || !g.workers.is_empty() || !g.children.is_none() {
                return;
            }
            if !pg.children.get(&first).is_some_and(|c| Arc::ptr_eq(c, &n)) {
                return;
            }
            pg.children.remove(&first);
            if pg.link.as_ref().is_some_and(|l| Arc::ptr_eq(l, &n)) {
                pg.link = None;
            }
            g.dead = true;
            g.parent = None;
            g.link = None;
            g.blocks = Run::new();
            g.workers = Default::default();
            drop(g);
            let p = arc_of(&pg);
            let p_dead_leaf = !self.is_root(&p) && pg.workers.is_empty() && pg.children.is_none();
            // Only a parent left with a single child can merge; checking
            // here avoids re-locking busy shared parents for nothing.
            let p_may_merge = pg.children.single().is_some();
            drop(pg);
            if p_dead_leaf {
                n = p;
            } else {
                if p_may_merge {
                    self.try_merge(&p);
                }
                return;
            }
        }
    }

    /// If `n` (not the root) has exactly one child with the same worker
    /// set, absorbs it: appends its run, adopts its children and tail link,
    /// and marks it dead with a forward link to `n`. Repeats while possible.
    pub(super) fn try_merge(&self, n: &NodeRef) {
        if self.is_root(n) {
            return;
        }
        loop {
            let mut g = n.write_arc();
            if g.dead {
                return;
            }
            let Some(c) = g.children.single().map(|c| NodeRef::clone(c)) else {
                return;
            };
            let mut cg = c.write_arc();
            if cg.dead
                || cg.workers != g.workers
                || cg.start != g.end()
                || g.blocks.len() + cg.blocks.len() > MAX_RUN
            {
                return;
            }
            if cg.workers.is_empty() && cg.children.is_none() {
                // A workerless leaf is unlinked, not absorbed (absorbing it
                // would leave a workerless leaf behind).
                drop(cg);
                drop(g);
                self.try_kill(c);
                continue;
            }
            let run = std::mem::take(&mut cg.blocks);
            g.blocks.extend(run);
            g.children = std::mem::take(&mut cg.children);
            g.link = cg.link.take();
            cg.dead = true;
            cg.link = Some(Arc::clone(n));
            cg.parent = None;
            cg.workers = Default::default();
            drop(cg);
            // Re-point the adopted children's parent hints (top-down order:
            // n, then its new children) so the dead node is not kept alive.
            for (_, gc) in g.children.iter() {
                gc.write().parent = Some(Arc::clone(n));
            }
        }
    }

    fn try_merge_into_parent(&self, n: &NodeRef) {
        if self.is_root(n) {
            return;
        }
        let (start, hint) = {
            let g = n.read();
            if g.dead {
                return;
            }
            (g.start, g.parent.clone())
        };
        if start == 0 {
            return;
        }
        let (p, may_merge) = {
            let Some(pg) = self.lock_parent(start, hint) else {
                return;
            };
            let single = pg.children.single().is_some_and(|c| Arc::ptr_eq(c, n));
            (arc_of(&pg), single)
        };
        if may_merge {
            self.try_merge(&p);
        }
    }
}
