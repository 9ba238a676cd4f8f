//! The reference index: a plain sequential radix tree (one node per block)
//! behind a single `RwLock`. It is the oracle for the concurrent index's
//! tests and the baseline of its benchmarks.

use hashbrown::{HashMap, HashSet};
use parking_lot::RwLock;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use crate::dump::{build_snapshot, events_from_snapshot, DumpWorker, SnapNode};
use crate::event::{ApplyError, KvEvent, KvEventData, StoredBlock, WorkerKey};
use crate::hash::{ExternalHash, LocalHash};
use crate::scores::OverlapScores;
use crate::stats::{Admit, Counters, GapHandler, IndexStats};
use crate::KvIndexer;

type FMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

const ROOT: u32 = 0;

struct RNode {
    local: LocalHash,
    parent: u32,
    children: FMap<LocalHash, u32>,
    /// Sorted by worker.
    holders: Vec<(WorkerKey, ExternalHash)>,
}

#[derive(Default)]
struct RWorker {
    blocks: FMap<ExternalHash, u32>,
    last_event_id: Option<u64>,
}

struct Inner {
    nodes: Vec<Option<RNode>>,
    free: Vec<u32>,
    workers: FMap<WorkerKey, RWorker>,
}

/// A sequential radix tree (one node per block) behind one `RwLock`.
pub struct ReferenceIndex {
    inner: RwLock<Inner>,
    counters: Counters,
}

impl Default for ReferenceIndex {
    fn default() -> Self {
        Self::new()
    }
}

impl ReferenceIndex {
    /// An empty index.
    pub fn new() -> Self {
        let root = RNode {
            local: LocalHash(0),
            parent: ROOT,
            children: FMap::default(),
            holders: Vec::new(),
        };
        Self {
            inner: RwLock::new(Inner {
                nodes: vec![Some(root)],
                free: Vec::new(),
                workers: FMap::default(),
            }),
            counters: Counters::default(),
        }
    }

    /// Installs (or clears) the callback invoked on every event-id gap.
    pub fn set_gap_handler(&self, h: Option<Arc<GapHandler>>) {
        self.counters.set_gap_handler(h);
    }

    /// Number of tree nodes, root excluded (one per distinct block path).
    pub fn node_count(&self) -> usize {
        let g = self.inner.read();
        g.nodes.iter().filter(|n| n.is_some()).count() - 1
    }
}

impl Inner {
    fn node(&self, i: u32) -> &RNode {
        self.nodes[i as usize].as_ref().expect("live node")
    }
    fn node_mut(&mut self, i: u32) -> &mut RNode {
        self.nodes[i as usize].as_mut().expect("live node")
    }

    fn child_or_insert(&mut self, parent: u32, local: LocalHash) -> u32 {
        if let Some(&c) = self.node(parent).children.get(&local) {
            return c;
        }
        let n = RNode {
            local,
            parent,
            children: FMap::default(),
            holders: Vec::new(),
        };
        let idx = match self.free.pop() {
            Some(i) => {
                self.nodes[i as usize] = Some(n);
                i
            }
            None => {
                self.nodes.push(Some(n));
                (self.nodes.len() - 1) as u32
            }
        };
        self.node_mut(parent).children.insert(local, idx);
        idx
    }

    /// Drops `w` from node `n`, then prunes empty leaves upwards.
    fn unhold(&mut self, n: u32, w: WorkerKey) {
        let node = self.node_mut(n);
        if let Ok(i) = node.holders.binary_search_by_key(&w, |p| p.0) {
            node.holders.remove(i);
        }
        let mut cur = n;
        while cur != ROOT {
            let node = self.node(cur);
            if !node.holders.is_empty() || !node.children.is_empty() {
                break;
            }
            let (parent, local) = (node.parent, node.local);
            self.node_mut(parent).children.remove(&local);
            self.nodes[cur as usize] = None;
            self.free.push(cur);
            cur = parent;
        }
    }

    fn stored(
        &mut self,
        c: &Counters,
        ev: &KvEvent,
        parent: Option<ExternalHash>,
        blocks: &[StoredBlock],
    ) -> Result<(), ApplyError> {
        let w = ev.worker;
        let mut cur = match parent {
            None => ROOT,
            Some(p) => match self.workers.get(&w).and_then(|s| s.blocks.get(&p)) {
                Some(&n) => n,
                None => {
                    c.unknown_parents.fetch_add(1, Relaxed);
                    return Err(ApplyError::UnknownParent {
                        worker: w,
                        event_id: ev.event_id,
                        parent: p,
                    });
                }
            },
        };
        for b in blocks {
            if let Some(&n) = self.workers.get(&w).and_then(|s| s.blocks.get(&b.external)) {
                cur = n;
                continue;
            }
            let child = self.child_or_insert(cur, b.local);
            let node = self.node_mut(child);
            if let Err(pos) = node.holders.binary_search_by_key(&w, |p| p.0) {
                node.holders.insert(pos, (w, b.external));
                self.workers
                    .entry(w)
                    .or_default()
                    .blocks
                    .insert(b.external, child);
                c.blocks_stored.fetch_add(1, Relaxed);
            }
            cur = child;
        }
        Ok(())
    }

    fn removed(&mut self, c: &Counters, w: WorkerKey, hashes: &[ExternalHash]) {
        for h in hashes {
            match self.workers.get_mut(&w).and_then(|s| s.blocks.remove(h)) {
                Some(n) => {
                    self.unhold(n, w);
                    c.blocks_removed.fetch_add(1, Relaxed);
                }
                None => {
                    c.unknown_removes.fetch_add(1, Relaxed);
                }
            }
        }
    }

    fn clear(&mut self, c: &Counters, w: WorkerKey) {
        let Some(s) = self.workers.get_mut(&w) else {
            return;
        };
        let nodes: Vec<u32> = s.blocks.drain().map(|(_, n)| n).collect();
        c.blocks_removed.fetch_add(nodes.len() as u64, Relaxed);
        for n in nodes {
            self.unhold(n, w);
        }
    }

    /// Node `n` and the chain of single children held by the same workers
    /// below it as one snapshot node (children left empty), and the
    /// children of the chain's last node in key order.
    fn snapshot(&self, n: u32) -> (SnapNode, Vec<u32>) {
        let node = self.node(n);
        let mut snap = SnapNode {
            blocks: vec![node.local],
            holders: node.holders.iter().map(|(w, e)| (*w, vec![*e])).collect(),
            children: Vec::new(),
        };
        snap.holders.sort_by_key(|(w, _)| *w);
        let mut cur = node;
        // Compress a chain of single children held by the same workers.
        while cur.children.len() == 1 {
            let &c = cur.children.values().next().expect("one child");
            let child = self.node(c);
            let mut hs: Vec<_> = child.holders.clone();
            hs.sort_by_key(|(w, _)| *w);
            if hs.len() != snap.holders.len()
                || hs.iter().zip(&snap.holders).any(|(a, b)| a.0 != b.0)
            {
                break;
            }
            snap.blocks.push(child.local);
            for ((_, e), (_, v)) in hs.iter().zip(snap.holders.iter_mut()) {
                v.push(*e);
            }
            cur = child;
        }
        let mut kids: Vec<(LocalHash, u32)> = cur.children.iter().map(|(k, v)| (*k, *v)).collect();
        kids.sort_unstable();
        (snap, kids.into_iter().map(|(_, c)| c).collect())
    }
}

impl KvIndexer for ReferenceIndex {
    fn apply(&self, ev: &KvEvent) -> Result<(), ApplyError> {
        let (r, gap) = {
            let mut g = self.inner.write();
            let inner = &mut *g;
            let st = inner.workers.entry(ev.worker).or_default();
            let (admit, gap) = self.counters.admit(&mut st.last_event_id, ev.event_id);
            if admit == Admit::Duplicate {
                return Ok(());
            }
            let r = match &ev.data {
                KvEventData::Stored { parent, blocks } => {
                    inner.stored(&self.counters, ev, *parent, blocks)
                }
                KvEventData::Removed { hashes } => {
                    inner.removed(&self.counters, ev.worker, hashes);
                    Ok(())
                }
                KvEventData::Cleared => {
                    inner.clear(&self.counters, ev.worker);
                    Ok(())
                }
            };
            (r, gap)
        };
        if let Some(expected) = gap {
            self.counters.report_gap(ev.worker, expected, ev.event_id);
        }
        r
    }

    fn find_matches(&self, hashes: &[LocalHash]) -> OverlapScores {
        let g = self.inner.read();
        let mut out: Vec<(WorkerKey, u32)> = Vec::new();
        let mut cur = ROOT;
        let mut active: Vec<WorkerKey> = Vec::new();
        let mut matched = 0u32;
        for h in hashes {
            let Some(&c) = g.node(cur).children.get(h) else {
                break;
            };
            let node = g.node(c);
            if matched == 0 {
                active = node.holders.iter().map(|(w, _)| *w).collect();
            } else {
                // Both lists are sorted: one merge pass.
                let hs = &node.holders;
                let mut j = 0;
                active.retain(|w| {
                    while j < hs.len() && hs[j].0 < *w {
                        j += 1;
                    }
                    let keep = j < hs.len() && hs[j].0 == *w;
                    if !keep {
                        out.push((*w, matched));
                    }
                    keep
                });
            }
            if active.is_empty() {
                break;
            }
            matched += 1;
            cur = c;
        }
        out.extend(active.iter().map(|w| (*w, matched)));
        OverlapScores::from_pairs(out)
    }

    fn worker_block_count(&self, w: WorkerKey) -> usize {
        self.inner
            .read()
            .workers
            .get(&w)
            .map_or(0, |s| s.blocks.len())
    }

    fn remove_worker(&self, w: WorkerKey) {
        let mut g = self.inner.write();
        g.clear(&self.counters, w);
        g.workers.remove(&w);
    }

    fn dump(&self) -> Vec<KvEvent> {
        let g = self.inner.read();
        let mut kids: Vec<(LocalHash, u32)> = g
            .node(ROOT)
            .children
            .iter()
            .map(|(k, v)| (*k, *v))
            .collect();
        kids.sort_unstable();
        let roots: Vec<u32> = kids.into_iter().map(|(_, c)| c).collect();
        let snaps = build_snapshot(roots, |n| g.snapshot(n));
        let workers: Vec<DumpWorker> = g
            .workers
            .iter()
            .map(|(k, s)| DumpWorker {
                key: *k,
                last_event_id: s.last_event_id,
                externals: s.blocks.keys().copied().collect::<HashSet<_>>(),
            })
            .collect();
        events_from_snapshot(&snaps, &workers)
    }

    fn name(&self) -> &'static str {
        "reference"
    }

    fn stats(&self) -> IndexStats {
        self.counters.snapshot()
    }

    fn workers(&self) -> Vec<WorkerKey> {
        let mut v: Vec<_> = self.inner.read().workers.keys().copied().collect();
        v.sort_unstable();
        v
    }
}
