//! The concurrent compressed radix tree ("CRTC"-style) index.
//!
//! * `node.rs`: node layout, child storage, split.
//! * `write.rs`: applying events (store, remove, clear), merging, unlinking.
//! * `read.rs`: `find_matches`.
//! * `snapshot.rs`: dump.
//!
//! The protocol is described in `docs/design.md`.

mod blockmap;
mod node;
mod read;
mod snapshot;
mod sync;
mod write;

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

use arc_swap::ArcSwap;
use hashbrown::HashMap;
use parking_lot::{Mutex, RwLock};

use crate::event::{ApplyError, KvEvent, KvEventData, WorkerKey};
use crate::hash::{ExternalHash, LocalHash};
use crate::scores::OverlapScores;
use crate::stats::{admit_local, Admit, Counters, GapHandler, IndexStats};
use crate::KvIndexer;
use blockmap::BlockMap;
use node::{Node, NodeRef, Wid};

type FMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// Where a worker's block lives: a slot of the worker's node table and the
/// block's absolute depth (16 bytes with its key in the worker's map).
/// The slot's node may be stale after splits and merges; `lock_loc`
/// resolves it by following `link` (tail or forward) pointers.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Loc {
    slot: u32,
    depth: u32,
}

/// One entry of a worker's node table: a node some of the worker's map
/// entries point into, and how many do. Holding the `Arc` once per
/// (worker, node) instead of once per block keeps map entries small and
/// avoids a reference-count update per stored block.
struct Slot {
    node: Option<NodeRef>,
    refs: u32,
}

/// Writer-side state of one worker. Only the thread applying that worker's
/// event touches it (the mutex is uncontended in normal operation).
pub(crate) struct WorkerState {
    id: Wid,
    last_event_id: Option<u64>,
    blocks: BlockMap,
    slots: Vec<Slot>,
    free_slots: Vec<u32>,
    /// Node address -> slot, for reusing a slot when adding blocks to a
    /// node. An address is only present while its slot holds that node's
    /// `Arc`, so it cannot be a recycled address.
    slot_of: FMap<usize, u32>,
    /// This worker's counters (summed by `stats`; no shared atomics on the
    /// write path).
    stats: IndexStats,
    /// Set by `remove_worker` (under this state's lock, together with the
    /// removal from the worker map): an `apply` that fetched this entry
    /// before the removal retries with a fresh one instead of writing into
    /// a forgotten state.
    retired: bool,
}

impl WorkerState {
    fn new(id: Wid) -> Self {
        Self {
            id,
            last_event_id: None,
            blocks: BlockMap::default(),
            slots: Vec::new(),
            free_slots: Vec::new(),
            slot_of: FMap::default(),
            stats: IndexStats::default(),
            retired: false,
        }
    }

    /// The slot for `node`, allocated (with no references) if needed.
    fn slot_for(&mut self, node: &NodeRef) -> u32 {
        let ptr = Arc::as_ptr(node) as usize;
        if let Some(&s) = self.slot_of.get(&ptr) {
            return s;
        }
        let slot = Slot {
            node: Some(Arc::clone(node)),
            refs: 0,
        };
        let s = match self.free_slots.pop() {
            Some(s) => {
                self.slots[s as usize] = slot;
                s
            }
            None => {
                self.slots.push(slot);
                (self.slots.len() - 1) as u32
            }
        };
        self.slot_of.insert(ptr, s);
        s
    }

    /// Records `ext` at (`slot`, `depth`); false if `ext` is already known.
    /// The caller holds a node lock, so the room was reserved beforehand
    /// (the Stored event reserves for all its blocks before locking).
    #[inline(always)]
    fn insert_block(&mut self, ext: ExternalHash, slot: u32, depth: u32) -> bool {
        debug_assert!(self.blocks.has_room(), "block map filled past its reserve");
        if self.blocks.insert_new(ext, Loc { slot, depth }) {
            self.slots[slot as usize].refs += 1;
            true
        } else {
            false
        }
    }

    /// Frees `slot` if nothing references it.
    fn free_if_unused(&mut self, slot: u32) {
        let sl = &mut self.slots[slot as usize];
        if sl.refs == 0 {
            if let Some(n) = sl.node.take() {
                let ptr = Arc::as_ptr(&n) as usize;
                if self.slot_of.get(&ptr) == Some(&slot) {
                    self.slot_of.remove(&ptr);
                }
                self.free_slots.push(slot);
            }
        }
    }

    /// Drops one reference to `slot`.
    #[inline]
    fn unref(&mut self, slot: u32) {
        let sl = &mut self.slots[slot as usize];
        sl.refs -= 1;
        if sl.refs == 0 {
            self.free_if_unused(slot);
        }
    }

    /// Points `slot` at `live` (the node that absorbed its dead node).
    fn retarget(&mut self, slot: u32, live: NodeRef) {
        if let Some(old) = self.slots[slot as usize].node.take() {
            let ptr = Arc::as_ptr(&old) as usize;
            if self.slot_of.get(&ptr) == Some(&slot) {
                self.slot_of.remove(&ptr);
            }
        }
        self.slot_of
            .entry(Arc::as_ptr(&live) as usize)
            .or_insert(slot);
        self.slots[slot as usize].node = Some(live);
    }

    /// Forgets every block and slot.
    fn reset(&mut self) {
        self.blocks = BlockMap::default();
        self.slots = Vec::new();
        self.free_slots = Vec::new();
        self.slot_of = FMap::default();
    }
}

struct WorkerEntry {
    /// Mirror of `blocks.len()` so counts never wait for a writer.
    count: AtomicUsize,
    state: Mutex<WorkerState>,
}

/// Interned worker ids. Writers intern under the lock (once per new
/// worker); readers map ids back to keys through a lock-free snapshot.
#[derive(Default)]
struct Registry {
    ids: Mutex<FMap<WorkerKey, Wid>>,
    keys: ArcSwap<Vec<WorkerKey>>,
}

/// One shard of the worker map.
type WorkerShard = RwLock<FMap<WorkerKey, Arc<WorkerEntry>>>;

/// Shards of the worker map (lanes look their workers up concurrently).
const WORKER_SHARDS: usize = 64;

fn shard_of(w: WorkerKey) -> usize {
    (w.worker_id.wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ (w.dp_rank as u64).wrapping_mul(0xc2b2_ae3d_27d4_eb4f)) as usize
        >> 3
        & (WORKER_SHARDS - 1)
}

/// The concurrent compressed radix tree index.
///
/// Writers for different workers run in parallel (each touches only the
/// nodes on its own path, one or two node locks at a time); readers take one
/// short read lock per node visited and never overcount.
pub struct ConcurrentIndex {
    root: NodeRef,
    registry: Registry,
    workers: Box<[WorkerShard]>,
    counters: Counters,
    /// Counters of removed workers.
    retired: Mutex<IndexStats>,
}

impl Default for ConcurrentIndex {
    fn default() -> Self {
        Self::new()
    }
}

impl ConcurrentIndex {
    /// An empty index.
    pub fn new() -> Self {
        Self {
            root: Arc::new(sync::RwLock::new(Node::default())),
            registry: Registry::default(),
            workers: (0..WORKER_SHARDS)
                .map(|_| RwLock::new(FMap::default()))
                .collect(),
            counters: Counters::default(),
            retired: Mutex::new(IndexStats::default()),
        }
    }

    /// Installs (or clears) the callback invoked on every event-id gap with
    /// (worker, expected id, received id); use it to trigger recovery.
    pub fn set_gap_handler(&self, h: Option<Arc<GapHandler>>) {
        self.counters.set_gap_handler(h);
    }

    fn intern(&self, w: WorkerKey) -> Wid {
        let mut ids = self.registry.ids.lock();
        if let Some(&id) = ids.get(&w) {
            return id;
        }
        let mut keys: Vec<WorkerKey> = self.registry.keys.load().as_ref().clone();
        let id = keys.len() as Wid;
        keys.push(w);
        self.registry.keys.store(Arc::new(keys));
        ids.insert(w, id);
        id
    }

    fn shard(&self, w: WorkerKey) -> &WorkerShard {
        &self.workers[shard_of(w)]
    }

    fn all_entries(&self) -> Vec<(WorkerKey, Arc<WorkerEntry>)> {
        let mut v: Vec<_> = self
            .workers
            .iter()
            .flat_map(|s| {
                s.read()
                    .iter()
                    .map(|(k, e)| (*k, Arc::clone(e)))
                    .collect::<Vec<_>>()
            })
            .collect();
        v.sort_unstable_by_key(|(k, _)| *k);
        v
    }

    fn entry(&self, w: WorkerKey) -> Arc<WorkerEntry> {
        if let Some(e) = self.shard(w).read().get(&w) {
            return Arc::clone(e);
        }
        let id = self.intern(w);
        let mut g = self.shard(w).write();
        Arc::clone(g.entry(w).or_insert_with(|| {
            Arc::new(WorkerEntry {
                count: AtomicUsize::new(0),
                state: Mutex::new(WorkerState::new(id)),
            })
        }))
    }

    /// Structural statistics: (live nodes excluding the root, total run
    /// length, nodes with children allocated as a map). Walks the tree.
    /// A test hook (feature `test-util`).
    #[cfg(feature = "test-util")]
    pub fn tree_shape(&self) -> TreeShape {
        let mut shape = TreeShape::default();
        let mut stack = vec![Arc::clone(&self.root)];
        while let Some(n) = stack.pop() {
            let g = n.read();
            if !Arc::ptr_eq(&n, &self.root) {
                shape.nodes += 1;
                shape.blocks += g.blocks.len();
                shape.holder_blocks += g.blocks.len() * g.workers.len();
                if g.workers.is_empty() && g.children.is_none() {
                    shape.empty_leaves += 1;
                }
                if let Some(c) = g.children.single() {
                    let cg = c.read();
                    if cg.workers == g.workers && g.blocks.len() + cg.blocks.len() <= write::MAX_RUN
                    {
                        shape.mergeable += 1;
                    }
                }
            }
            if matches!(g.children, node::Children::Many(_)) {
                shape.map_children += 1;
            }
            for (_, c) in g.children.iter() {
                stack.push(Arc::clone(c));
            }
        }
        shape
    }
}

impl ConcurrentIndex {
    /// Heap bytes the index holds, as requested from the allocator
    /// (allocator headers and fragmentation not included), by part. Walks
    /// the tree under one read lock per node, so it costs about a `dump`
    /// without the copying; call it at scrape intervals, not per request.
    /// Dead nodes (unlinked or merged away) count while a worker's slot or
    /// a live node's hint still holds them; nodes waiting for an epoch
    /// release do not.
    pub fn heap_bytes(&self) -> HeapBytes {
        use std::mem::size_of;
        // An `Arc`'s allocation: two counts and the value.
        let arc = |t: usize| 2 * size_of::<usize>() + t;
        let mut h = HeapBytes::default();
        // Every node still allocated: those reachable from the root, and
        // the dead ones (unlinked or merged away) that a worker's slot or
        // another node's `parent` / `link` hint still holds. Each once.
        let mut stack = vec![Arc::clone(&self.root)];
        for shard in self.workers.iter() {
            let entries: Vec<Arc<WorkerEntry>> = shard.read().values().cloned().collect();
            for e in entries {
                let st = e.state.lock();
                stack.extend(st.slots.iter().filter_map(|s| s.node.clone()));
            }
        }
        let mut seen = std::collections::HashSet::new();
        while let Some(n) = stack.pop() {
            if !seen.insert(Arc::as_ptr(&n) as usize) {
                continue;
            }
            let g = n.read();
            stack.extend(g.parent.iter().chain(g.link.iter()).cloned());
            h.nodes += arc(size_of::<sync::RwLock<Node>>());
            if g.blocks.spilled() {
                h.runs += g.blocks.capacity() * size_of::<LocalHash>();
            }
            if g.workers.spilled() {
                h.worker_sets += g.workers.capacity() * size_of::<Wid>();
            }
            if let node::Children::Many(m) = &g.children {
                h.child_maps += size_of::<node::ChildMap>() + m.allocation_size();
            }
            for (_, c) in g.children.iter() {
                stack.push(Arc::clone(c));
            }
        }
        for shard in self.workers.iter() {
            // Copied out, so no worker's state is locked under the shard's.
            let entries: Vec<Arc<WorkerEntry>> = {
                let g = shard.read();
                h.workers += g.allocation_size();
                g.values().cloned().collect()
            };
            for e in entries {
                let st = e.state.lock();
                h.workers += arc(size_of::<WorkerEntry>());
                h.block_maps += st.blocks.allocation_size();
                h.node_tables += st.slots.capacity() * size_of::<Slot>()
                    + st.free_slots.capacity() * size_of::<u32>()
                    + st.slot_of.allocation_size();
            }
        }
        h
    }
}

/// Heap bytes of a [`ConcurrentIndex`] by part (see
/// [`ConcurrentIndex::heap_bytes`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeapBytes {
    /// Tree nodes (the `Arc<RwLock<Node>>` allocations).
    pub nodes: usize,
    /// Runs longer than the inline two blocks.
    pub runs: usize,
    /// Worker sets longer than the inline four.
    pub worker_sets: usize,
    /// Child maps of nodes with two or more children.
    pub child_maps: usize,
    /// Per-worker maps from external hash to location.
    pub block_maps: usize,
    /// Per-worker node tables (slots, free list, address map).
    pub node_tables: usize,
    /// The worker map and per-worker entries.
    pub workers: usize,
}

impl HeapBytes {
    /// All parts together.
    pub fn total(&self) -> usize {
        self.nodes
            + self.runs
            + self.worker_sets
            + self.child_maps
            + self.block_maps
            + self.node_tables
            + self.workers
    }
}

/// Releases the nodes whose release was deferred (unlinked while readers
/// may have been walking them), as far as the readers pinned right now
/// allow. Reclamation also runs on its own as threads pin and unpin; call
/// this at a quiescent point, e.g. before measuring memory. A test hook
/// (feature `test-util`).
#[cfg(feature = "test-util")]
pub fn reclaim_deferred() {
    sync::flush_deferred();
}

impl Drop for ConcurrentIndex {
    /// Tears the tree down iteratively (a path may be many thousands of
    /// nodes deep) and breaks the parent / tail-link cycles between live
    /// nodes, which reference counting alone would leak.
    fn drop(&mut self) {
        // Worker slots hold node references; without them every node is
        // reachable only from the tree.
        for shard in self.workers.iter() {
            shard.write().clear();
        }
        let mut stack = vec![Arc::clone(&self.root)];
        while let Some(n) = stack.pop() {
            let mut g = n.write();
            g.parent = None;
            stack.extend(g.link.take());
            stack.extend(g.children.take_all());
        }
    }
}

/// Shape of a [`ConcurrentIndex`] tree (see [`ConcurrentIndex::tree_shape`]).
#[cfg(feature = "test-util")]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TreeShape {
    /// Live nodes, root excluded.
    pub nodes: usize,
    /// Blocks in all runs (distinct block paths).
    pub blocks: usize,
    /// Sum over nodes of run length times holders ((worker, block) pairs).
    pub holder_blocks: usize,
    /// Nodes whose children live in a hash map (two or more children).
    pub map_children: usize,
    /// Workerless leaves (should be unlinked: always 0 when quiescent).
    pub empty_leaves: usize,
    /// Nodes with a single child held by the same workers whose runs fit in
    /// one node (should have been merged: 0 when quiescent).
    pub mergeable: usize,
}

impl KvIndexer for ConcurrentIndex {
    fn apply(&self, ev: &KvEvent) -> Result<(), ApplyError> {
        let (r, gap) = loop {
            let entry = self.entry(ev.worker);
            let mut st = entry.state.lock();
            let st = &mut *st;
            if st.retired {
                continue; // removed concurrently: use the fresh entry
            }
            let (admit, gap) = admit_local(&mut st.stats, &mut st.last_event_id, ev.event_id);
            if admit == Admit::Duplicate {
                return Ok(());
            }
            let r = match &ev.data {
                KvEventData::Stored { parent, blocks } => self.stored(st, ev, *parent, blocks),
                KvEventData::Removed { hashes } => {
                    self.removed(st, hashes);
                    Ok(())
                }
                KvEventData::Cleared => {
                    self.clear(st);
                    Ok(())
                }
            };
            entry.count.store(st.blocks.len(), Relaxed);
            break (r, gap);
        };
        // Reported after the event is applied and the worker's state is
        // unlocked, so the handler may call back into the index.
        if let Some(expected) = gap {
            self.counters.report_gap(ev.worker, expected, ev.event_id);
        }
        r
    }

    fn find_matches(&self, hashes: &[LocalHash]) -> OverlapScores {
        self.find(hashes)
    }

    fn worker_block_count(&self, w: WorkerKey) -> usize {
        self.shard(w)
            .read()
            .get(&w)
            .map_or(0, |e| e.count.load(Relaxed))
    }

    fn remove_worker(&self, w: WorkerKey) {
        let Some(entry) = self.shard(w).read().get(&w).cloned() else {
            return;
        };
        let mut st = entry.state.lock();
        if st.retired {
            return;
        }
        self.clear(&mut st);
        entry.count.store(0, Relaxed);
        self.retired.lock().accumulate(&st.stats);
        st.retired = true;
        // Lock order: worker state, then shard (`entry` never holds a shard
        // lock while taking a state lock).
        self.shard(w).write().remove(&w);
    }

    fn dump(&self) -> Vec<KvEvent> {
        self.dump_events()
    }

    fn name(&self) -> &'static str {
        "concurrent"
    }

    fn stats(&self) -> IndexStats {
        let mut total = *self.retired.lock();
        for (_, e) in self.all_entries() {
            total.accumulate(&e.state.lock().stats);
        }
        total
    }

    fn workers(&self) -> Vec<WorkerKey> {
        self.all_entries().into_iter().map(|(k, _)| k).collect()
    }
}
