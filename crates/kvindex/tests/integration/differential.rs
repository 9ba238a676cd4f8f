//! Differential property test: random event streams from several workers
//! (stores that extend, branch and share prefixes; removals; clears;
//! unknown parents; gaps; replays), interleaved with queries, applied to the
//! concurrent index, the reference index and a per-worker HashSet model.

use crate::common::*;
use kvindex::{
    ConcurrentIndex, ExternalHash, KvEvent, KvEventData, KvIndexer, LocalHash, ReferenceIndex,
};
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Op {
    /// Store `locals` below a held block of the worker (`parent` picks one;
    /// `None` or no held block: from the root).
    Store {
        w: u8,
        parent: Option<u16>,
        locals: Vec<u8>,
    },
    /// Store with a parent the worker does not hold.
    StoreUnknownParent {
        w: u8,
    },
    /// Remove some held blocks (picked by index) and maybe an unknown one.
    Remove {
        w: u8,
        picks: Vec<u16>,
        unknown: bool,
    },
    /// Remove a held path's deepest `len` held blocks, in one event, deepest
    /// first (as engines evict) or shallowest first: consecutive blocks of
    /// one node, removed as a range.
    RemoveChain {
        w: u8,
        pick: u16,
        len: u8,
        deepest_first: bool,
    },
    Clear {
        w: u8,
    },
    RemoveWorker {
        w: u8,
    },
    /// Skip event ids before the worker's next event.
    Gap {
        w: u8,
    },
    /// Replay an old event id (must be ignored).
    Replay {
        w: u8,
        locals: Vec<u8>,
    },
    /// Query a held path of the worker, extended by `tail`, or a random one.
    Query {
        w: u8,
        pick: u16,
        tail: Vec<u8>,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let w = 0u8..5;
    let locals = prop::collection::vec(0u8..4, 1..7);
    prop_oneof![
        6 => (w.clone(), prop::option::weighted(0.8, any::<u16>()), locals.clone())
            .prop_map(|(w, parent, locals)| Op::Store { w, parent, locals }),
        1 => w.clone().prop_map(|w| Op::StoreUnknownParent { w }),
        3 => (w.clone(), prop::collection::vec(any::<u16>(), 1..4), prop::bool::weighted(0.1))
            .prop_map(|(w, picks, unknown)| Op::Remove { w, picks, unknown }),
        3 => (w.clone(), any::<u16>(), 1u8..8, any::<bool>())
            .prop_map(|(w, pick, len, deepest_first)| Op::RemoveChain { w, pick, len, deepest_first }),
        1 => w.clone().prop_map(|w| Op::Clear { w }),
        1 => w.clone().prop_map(|w| Op::RemoveWorker { w }),
        1 => w.clone().prop_map(|w| Op::Gap { w }),
        1 => (w.clone(), locals.clone()).prop_map(|(w, locals)| Op::Replay { w, locals }),
        4 => (w, any::<u16>(), prop::collection::vec(0u8..4, 0..3))
            .prop_map(|(w, pick, tail)| Op::Query { w, pick, tail }),
    ]
}

struct Harness {
    ours: ConcurrentIndex,
    reference: ReferenceIndex,
    model: Model,
    next_id: Vec<u64>,
}

fn salt(w: u8) -> u64 {
    // Workers 0-2 share engine ids (same hashing), 3-4 use their own.
    if w < 3 {
        0
    } else {
        w as u64 * 1000
    }
}

fn held_paths(m: &Model, w: u8) -> Vec<Vec<LocalHash>> {
    let mut v: Vec<_> = m
        .workers
        .get(&wk(w as u64))
        .map(|s| s.held.keys().cloned().collect())
        .unwrap_or_default();
    v.sort();
    v
}

impl Harness {
    fn new() -> Self {
        Self {
            ours: ConcurrentIndex::new(),
            reference: ReferenceIndex::new(),
            model: Model::default(),
            next_id: vec![0; 8],
        }
    }

    fn id(&mut self, w: u8) -> u64 {
        let i = self.next_id[w as usize];
        self.next_id[w as usize] += 1;
        i
    }

    fn send(&mut self, ev: KvEvent) {
        let a = app(&self.ours, &ev);
        let b = app(&self.reference, &ev);
        let c = self.model.apply(&ev);
        assert_eq!(a, c, "ours vs model on {ev:?}");
        assert_eq!(b, c, "reference vs model on {ev:?}");
    }

    fn query(&self, q: &[LocalHash]) {
        let want = self.model.scores(q);
        assert_eq!(sorted(&self.ours.find_matches(q)), want, "ours on {q:?}");
        assert_eq!(
            sorted(&self.reference.find_matches(q)),
            want,
            "reference on {q:?}"
        );
    }

    fn run(&mut self, op: Op) {
        match op {
            Op::Store { w, parent, locals } => {
                let held = held_paths(&self.model, w);
                let pp = match parent {
                    Some(i) if !held.is_empty() => held[i as usize % held.len()].clone(),
                    _ => Vec::new(),
                };
                let id = self.id(w);
                let locals: Vec<LocalHash> =
                    locals.iter().map(|x| LocalHash(*x as u64 + 1)).collect();
                self.send(stored(wk(w as u64), id, &pp, &locals, salt(w)));
            }
            Op::StoreUnknownParent { w } => {
                let id = self.id(w);
                let mut ev = stored(wk(w as u64), id, &[], &[LocalHash(1)], salt(w));
                if let KvEventData::Stored { parent, .. } = &mut ev.data {
                    *parent = Some(ExternalHash(0xdead_beef));
                }
                self.send(ev);
            }
            Op::Remove { w, picks, unknown } => {
                let held = held_paths(&self.model, w);
                let mut hashes: Vec<ExternalHash> = Vec::new();
                if !held.is_empty() {
                    for p in picks {
                        let path = &held[p as usize % held.len()];
                        hashes.push(self.model.workers[&wk(w as u64)].held[path]);
                    }
                }
                if unknown {
                    hashes.push(ExternalHash(0xfeed));
                }
                let id = self.id(w);
                self.send(KvEvent {
                    worker: wk(w as u64),
                    event_id: id,
                    data: KvEventData::Removed { hashes },
                });
            }
            Op::RemoveChain {
                w,
                pick,
                len,
                deepest_first,
            } => {
                let held = held_paths(&self.model, w);
                if held.is_empty() {
                    return;
                }
                let path = &held[pick as usize % held.len()];
                let map = &self.model.workers[&wk(w as u64)].held;
                let mut hashes: Vec<ExternalHash> = (1..=path.len())
                    .rev()
                    .map_while(|k| map.get(&path[..k]).copied())
                    .take(len as usize)
                    .collect();
                if !deepest_first {
                    hashes.reverse();
                }
                let id = self.id(w);
                self.send(KvEvent {
                    worker: wk(w as u64),
                    event_id: id,
                    data: KvEventData::Removed { hashes },
                });
            }
            Op::Clear { w } => {
                let id = self.id(w);
                self.send(KvEvent {
                    worker: wk(w as u64),
                    event_id: id,
                    data: KvEventData::Cleared,
                });
            }
            Op::RemoveWorker { w } => {
                self.ours.remove_worker(wk(w as u64));
                self.reference.remove_worker(wk(w as u64));
                self.model.remove_worker(wk(w as u64));
            }
            Op::Gap { w } => {
                self.next_id[w as usize] += 3;
            }
            Op::Replay { w, locals } => {
                if self.next_id[w as usize] >= 2 {
                    let id = self.next_id[w as usize] - 2;
                    let locals: Vec<LocalHash> =
                        locals.iter().map(|x| LocalHash(*x as u64 + 1)).collect();
                    self.send(stored(wk(w as u64), id, &[], &locals, salt(w)));
                }
            }
            Op::Query { w, pick, tail } => {
                let held = held_paths(&self.model, w);
                let mut q = if held.is_empty() {
                    Vec::new()
                } else {
                    held[pick as usize % held.len()].clone()
                };
                q.extend(tail.iter().map(|x| LocalHash(*x as u64 + 1)));
                self.query(&q);
            }
        }
    }

    fn finish(&self) {
        check_equal(&self.ours, &self.model, &[]);
        check_equal(&self.reference, &self.model, &[]);
        assert_eq!(self.ours.workers(), self.reference.workers());
        let s = (self.ours.stats(), self.reference.stats());
        assert_eq!(s.0.gaps, s.1.gaps);
        assert_eq!(s.0.duplicates, s.1.duplicates);
        assert_eq!(s.0.unknown_parents, s.1.unknown_parents);
        assert_eq!(s.0.events_applied, s.1.events_applied);
        // Dumps rebuild equal indexes, in either kind of replica.
        for dump in [self.ours.dump(), self.reference.dump()] {
            let (r1, r2) = (ConcurrentIndex::new(), ReferenceIndex::new());
            for ev in &dump {
                r1.apply(ev).expect("dump applies");
                r2.apply(ev).expect("dump applies");
            }
            check_equal(&r1, &self.model, &[]);
            check_equal(&r2, &self.model, &[]);
        }
        // Memory stays proportional: (worker, block) pairs in the compressed
        // tree equal the model's held blocks.
        let held: usize = self.model.workers.values().map(|s| s.held.len()).sum();
        let shape = self.ours.tree_shape();
        assert_eq!(shape.holder_blocks, held);
        assert_eq!(shape.empty_leaves, 0, "{shape:?}");
        assert_eq!(shape.mergeable, 0, "{shape:?}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, max_shrink_iters: 4000, ..ProptestConfig::default() })]

    #[test]
    fn differential(ops in prop::collection::vec(op(), 1..80)) {
        let mut h = Harness::new();
        for op in ops {
            h.run(op);
        }
        h.finish();
    }
}

/// After every worker clears, the tree is empty again (no dead nodes or
/// runs left behind), whatever the history.
#[test]
fn clearing_everything_empties_the_tree() {
    let mut h = Harness::new();
    let mut rng = 12345u64;
    for _ in 0..3000 {
        rng = rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let w = (rng >> 33) as u8 % 5;
        let locals: Vec<u8> = (0..1 + (rng >> 40) % 6)
            .map(|i| ((rng >> (i * 3)) % 4) as u8)
            .collect();
        let op = match (rng >> 20) % 4 {
            0 | 1 => Op::Store {
                w,
                parent: Some((rng >> 8) as u16),
                locals,
            },
            2 => Op::Remove {
                w,
                picks: vec![(rng >> 5) as u16],
                unknown: false,
            },
            _ => Op::Query {
                w,
                pick: (rng >> 7) as u16,
                tail: vec![],
            },
        };
        h.run(op);
    }
    h.finish();
    for w in 0..5u8 {
        h.run(Op::Clear { w });
    }
    let s = h.ours.tree_shape();
    assert_eq!(s.holder_blocks, 0, "{s:?}");
    assert_eq!((s.nodes, s.blocks), (0, 0), "{s:?}");
    assert_eq!(h.reference.node_count(), 0);
}

fn arbitrary_event() -> impl Strategy<Value = KvEvent> {
    let w = 0u64..3;
    let block = (0u64..24, 0u64..4).prop_map(|(e, l)| kvindex::StoredBlock {
        external: ExternalHash(e),
        local: LocalHash(l + 1),
    });
    let data = prop_oneof![
        6 => (prop::option::of(0u64..24), prop::collection::vec(block, 0..6)).prop_map(|(p, blocks)| {
            KvEventData::Stored { parent: p.map(ExternalHash), blocks }
        }),
        3 => prop::collection::vec(0u64..24, 0..5)
            .prop_map(|h| KvEventData::Removed { hashes: h.into_iter().map(ExternalHash).collect() }),
        1 => Just(KvEventData::Cleared),
    ];
    (w, 0u64..12, data).prop_map(|(w, event_id, data)| KvEvent {
        worker: wk(w),
        event_id,
        data,
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 600, ..ProptestConfig::default() })]

    /// Fully arbitrary events (colliding external ids, aliases, repeated ids
    /// inside one event, unknown parents, out-of-order event ids): no panic,
    /// both indexes agree with the model after every event.
    #[test]
    fn arbitrary_events(events in prop::collection::vec(arbitrary_event(), 1..60)) {
        let ours = ConcurrentIndex::new();
        let reference = ReferenceIndex::new();
        let mut model = Model::default();
        for ev in &events {
            let c = model.apply(ev);
            prop_assert_eq!(app(&ours, ev), c, "ours on {:?}", ev);
            prop_assert_eq!(app(&reference, ev), c, "reference on {:?}", ev);
        }
        check_equal(&ours, &model, &[]);
        check_equal(&reference, &model, &[]);
        let dump = ours.dump();
        let replica = ConcurrentIndex::new();
        for ev in &dump {
            replica.apply(ev).expect("dump applies");
        }
        check_equal(&replica, &model, &[]);
        let shape = ours.tree_shape();
        prop_assert_eq!(shape.empty_leaves, 0);
        prop_assert_eq!(shape.mergeable, 0);
    }
}
