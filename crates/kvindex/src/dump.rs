//! Turning an index's contents into a stream of events that rebuilds it.
//!
//! Both indexes first copy themselves into a [`SnapNode`] tree (a run of
//! blocks, the workers holding the whole run with their external hash for
//! every block, and the children); [`events_from_snapshot`] then walks it.
//! A worker that holds a block whose ancestor it does not hold (it evicted a
//! block in the middle of a chain) cannot be described by `Stored` events
//! alone, because `Stored` needs a held parent: for such a run the dump
//! stores the missing ancestors under synthetic external ids that the worker
//! does not use, then removes them again in the next event.

use hashbrown::HashSet;
use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::event::{KvEvent, KvEventData, StoredBlock, WorkerKey};
use crate::hash::{ExternalHash, LocalHash};

/// One node of an index snapshot.
#[derive(Debug, Default)]
pub(crate) struct SnapNode {
    /// The run of local hashes.
    pub blocks: Vec<LocalHash>,
    /// Workers holding the whole run, with one external hash per block.
    pub holders: Vec<(WorkerKey, Vec<ExternalHash>)>,
    /// Child nodes.
    pub children: Vec<SnapNode>,
}

impl Drop for SnapNode {
    /// Iterative: snapshots of long chains are deep.
    fn drop(&mut self) {
        let mut stack = std::mem::take(&mut self.children);
        while let Some(mut n) = stack.pop() {
            stack.append(&mut n.children);
        }
    }
}

/// Builds a snapshot forest without recursion (paths may be many thousands
/// of nodes deep): `visit` turns one node into its snapshot (children left
/// empty) and its children, in key order. Nodes are copied in pre-order into
/// an arena, then attached to their parents bottom-up.
pub(crate) fn build_snapshot<T>(
    roots: Vec<T>,
    mut visit: impl FnMut(T) -> (SnapNode, Vec<T>),
) -> Vec<SnapNode> {
    // (snapshot, index of its parent); arena[0] stands for the root.
    let mut arena: Vec<(SnapNode, usize)> = vec![(SnapNode::default(), 0)];
    let mut stack: Vec<(T, usize)> = roots.into_iter().rev().map(|t| (t, 0)).collect();
    while let Some((t, parent)) = stack.pop() {
        let (node, kids) = visit(t);
        let idx = arena.len();
        arena.push((node, parent));
        stack.extend(kids.into_iter().rev().map(|k| (k, idx)));
    }
    // Children follow their parent in pre-order, so walking the arena
    // backwards attaches every node after all of its children (in reverse).
    while arena.len() > 1 {
        let (mut node, parent) = arena.pop().expect("len > 1");
        node.children.reverse();
        arena[parent].0.children.push(node);
    }
    let (mut root, _) = arena.pop().expect("arena root");
    let mut out = std::mem::take(&mut root.children);
    out.reverse();
    out
}

/// Per-worker inputs of a dump.
pub(crate) struct DumpWorker {
    pub key: WorkerKey,
    pub last_event_id: Option<u64>,
    pub externals: HashSet<ExternalHash>,
}

struct Frame<'a> {
    node: &'a SnapNode,
    next_child: usize,
}

/// Events that rebuild the snapshot in an empty index. Every event of a
/// worker carries that worker's last applied event id (see the event-id
/// rule in `stats.rs`: an equal id is applied again), and each worker's
/// events start with `Cleared`, so the stream also resets a non-empty
/// replica's view of that worker.
pub(crate) fn events_from_snapshot(
    root_children: &[SnapNode],
    workers: &[DumpWorker],
) -> Vec<KvEvent> {
    let info: hashbrown::HashMap<WorkerKey, &DumpWorker> =
        workers.iter().map(|w| (w.key, w)).collect();
    let id_of = |w: WorkerKey| info.get(&w).and_then(|d| d.last_event_id).unwrap_or(0);
    let mut out = Vec::new();
    let mut sorted: Vec<&DumpWorker> = workers.iter().collect();
    sorted.sort_by_key(|w| w.key);
    for w in &sorted {
        out.push(KvEvent {
            worker: w.key,
            event_id: id_of(w.key),
            data: KvEventData::Cleared,
        });
    }
    let mut synth_counter: u64 = 0;
    // Explicit stack: the reference tree has one node per block, so chains
    // can be thousands of nodes deep.
    let mut path: Vec<Frame<'_>> = Vec::new();
    let mut top_next = 0usize;
    loop {
        let next: Option<&SnapNode> = match path.last_mut() {
            None => {
                let n = root_children.get(top_next);
                top_next += 1;
                n
            }
            Some(f) => {
                let n = f.node.children.get(f.next_child);
                f.next_child += 1;
                n
            }
        };
        let Some(node) = next else {
            if path.pop().is_none() {
                break;
            }
            continue;
        };
        for (w, exts) in &node.holders {
            // Nearest ancestor frame held by w.
            let mut anc = None;
            for (i, f) in path.iter().enumerate().rev() {
                if let Some((_, e)) = f.node.holders.iter().find(|(hw, _)| hw == w) {
                    anc = Some((i, *e.last().expect("snapshot runs are non-empty")));
                    break;
                }
            }
            let (parent, gap_from) = match anc {
                Some((i, e)) => (Some(e), i + 1),
                None => (None, 0),
            };
            let mut blocks = Vec::new();
            let mut synthetic = Vec::new();
            for f in &path[gap_from..] {
                for &local in &f.node.blocks {
                    let ext =
                        fresh_external(*w, &mut synth_counter, info.get(w).map(|d| &d.externals));
                    synthetic.push(ext);
                    blocks.push(StoredBlock {
                        external: ext,
                        local,
                    });
                }
            }
            for (&local, &external) in node.blocks.iter().zip(exts) {
                blocks.push(StoredBlock { external, local });
            }
            let id = id_of(*w);
            out.push(KvEvent {
                worker: *w,
                event_id: id,
                data: KvEventData::Stored { parent, blocks },
            });
            if !synthetic.is_empty() {
                out.push(KvEvent {
                    worker: *w,
                    event_id: id,
                    data: KvEventData::Removed { hashes: synthetic },
                });
            }
        }
        path.push(Frame {
            node,
            next_child: 0,
        });
    }
    out
}

fn fresh_external(
    w: WorkerKey,
    counter: &mut u64,
    used: Option<&HashSet<ExternalHash>>,
) -> ExternalHash {
    loop {
        *counter += 1;
        let mut b = [0u8; 20];
        b[..8].copy_from_slice(&counter.to_le_bytes());
        b[8..16].copy_from_slice(&w.worker_id.to_le_bytes());
        b[16..].copy_from_slice(&w.dp_rank.to_le_bytes());
        let e = ExternalHash(xxh3_64_with_seed(&b, 0x5eed_d0d0));
        if used.is_none_or(|u| !u.contains(&e)) {
            return e;
        }
    }
}
