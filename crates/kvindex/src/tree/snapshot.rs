//! Dump: copy the tree into a snapshot and turn it into events.

use std::sync::Arc;

use hashbrown::{HashMap, HashSet};

use super::node::{NodeRef, WGuard};
use super::ConcurrentIndex;
use crate::dump::{build_snapshot, events_from_snapshot, DumpWorker, SnapNode};
use crate::event::{KvEvent, WorkerKey};
use crate::hash::{ExternalHash, LocalHash};

type Rev = HashMap<(usize, u32), ExternalHash, foldhash::fast::RandomState>;

impl ConcurrentIndex {
    /// Builds the dump. Meant for a quiescent index; under concurrent
    /// writes it is a best-effort (per-node consistent) picture.
    pub(super) fn dump_events(&self) -> Vec<KvEvent> {
        let entries = self.all_entries();
        let mut workers = Vec::new();
        // Per interned worker id: (node ptr, depth) -> external id.
        let mut rev: HashMap<u32, Rev> = HashMap::new();
        for (key, e) in &entries {
            let mut st = e.state.lock();
            let st = &mut *st;
            if st.retired {
                continue;
            }
            let mut r = Rev::default();
            let locs: Vec<(ExternalHash, super::Loc)> = st.blocks.iter().collect();
            for (ext, loc) in locs {
                if let Some(g) = self.lock_loc(st, loc) {
                    let ptr = Arc::as_ptr(WGuard::rwlock(&g)) as usize;
                    r.insert((ptr, loc.depth), ext);
                }
            }
            workers.push(DumpWorker {
                key: *key,
                last_event_id: st.last_event_id,
                externals: st.blocks.iter().map(|(e, _)| e).collect::<HashSet<_>>(),
            });
            rev.insert(st.id, r);
        }
        let keys: Vec<WorkerKey> = self.registry.keys.load().as_ref().clone();
        let roots = self.snap_children(&self.root, &rev, &keys);
        events_from_snapshot(&roots, &workers)
    }

    /// Copies the tree below the root into [`SnapNode`]s, children in
    /// key order (iteratively: see [`build_snapshot`]).
    fn snap_children(
        &self,
        root: &NodeRef,
        rev: &HashMap<u32, Rev>,
        keys: &[WorkerKey],
    ) -> Vec<SnapNode> {
        let sorted_kids = |n: &NodeRef| {
            let mut kids: Vec<(LocalHash, NodeRef)> = n
                .read()
                .children
                .iter()
                .map(|(k, c)| (*k, Arc::clone(c)))
                .collect();
            kids.sort_unstable_by_key(|(k, _)| *k);
            kids.into_iter().map(|(_, c)| c).collect::<Vec<_>>()
        };
        build_snapshot(sorted_kids(root), |c| {
            let (start, blocks, ws) = {
                let g = c.read();
                (g.start, g.blocks.to_vec(), g.workers.clone())
            };
            let ptr = Arc::as_ptr(&c) as usize;
            let mut holders = Vec::new();
            for w in ws {
                let Some(r) = rev.get(&w) else { continue };
                let exts: Option<Vec<ExternalHash>> = (0..blocks.len() as u32)
                    .map(|j| r.get(&(ptr, start + j)).copied())
                    .collect();
                if let Some(exts) = exts {
                    holders.push((keys[w as usize], exts));
                }
            }
            holders.sort_by_key(|(k, _)| *k);
            let node = SnapNode {
                blocks,
                holders,
                children: Vec::new(),
            };
            (node, sorted_kids(&c))
        })
    }
}
