//! A deterministic synthetic workload shaped like a router's traffic, used
//! by benchmarks, the memory test and the peer comparison (so every index
//! is fed the identical event stream).
//!
//! Each request is one of `prefixes` shared prefixes (system prompts, few
//! documents) of `prefix_blocks` blocks followed by `unique_blocks` blocks of
//! its own, sent to a random worker. The worker stores the blocks it lacks
//! (`Stored` with the prefix's last block as parent when it already holds
//! the prefix, as engines do) and, once over `capacity_blocks` unique
//! blocks, evicts its oldest request's unique blocks leaf-first
//! (`Removed`). External ids are the blocks' chained sequence hashes, so
//! all workers agree on them, as engines with deterministic hashing do.

use std::collections::VecDeque;

use crate::event::{KvEvent, KvEventData, StoredBlock, WorkerKey};
use crate::hash::{next_sequence_hash, ExternalHash, LocalHash};

/// Workload shape.
#[derive(Clone, Copy, Debug)]
pub struct WorkloadConfig {
    /// Number of workers (dp rank 0 each).
    pub workers: usize,
    /// Number of distinct shared prefixes.
    pub prefixes: usize,
    /// Blocks per shared prefix.
    pub prefix_blocks: usize,
    /// Blocks unique to each request.
    pub unique_blocks: usize,
    /// Unique blocks a worker keeps before evicting its oldest request.
    pub capacity_blocks: usize,
    /// Requests to generate.
    pub requests: usize,
    /// Queries to generate (half repeat a stored request, half are new).
    pub queries: usize,
    /// RNG seed.
    pub seed: u64,
}

impl Default for WorkloadConfig {
    fn default() -> Self {
        Self {
            workers: 32,
            prefixes: 16,
            prefix_blocks: 16,
            unique_blocks: 16,
            capacity_blocks: 1024,
            requests: 20_000,
            queries: 10_000,
            seed: 1,
        }
    }
}

/// Generated events and queries.
#[derive(Clone, Debug, Default)]
pub struct Workload {
    /// Every event, in a valid global order (each worker's ids increase).
    pub events: Vec<KvEvent>,
    /// Lookup requests (local hashes).
    pub queries: Vec<Vec<LocalHash>>,
    /// Block operations in `events` (stored blocks plus removed hashes).
    pub block_ops: u64,
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        // splitmix64
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn chain(parent: Option<u64>, locals: &[LocalHash]) -> Vec<u64> {
    let mut out = Vec::with_capacity(locals.len());
    let mut p = parent;
    for l in locals {
        let h = match p {
            None => l.0,
            Some(p) => next_sequence_hash(p, *l),
        };
        out.push(h);
        p = Some(h);
    }
    out
}

impl Workload {
    /// Generates the workload.
    pub fn generate(cfg: WorkloadConfig) -> Self {
        let mut rng = Rng(cfg.seed);
        let prefixes: Vec<Vec<LocalHash>> = (0..cfg.prefixes.max(1))
            .map(|_| {
                (0..cfg.prefix_blocks)
                    .map(|_| LocalHash(rng.next()))
                    .collect()
            })
            .collect();
        let prefix_seq: Vec<Vec<u64>> = prefixes.iter().map(|p| chain(None, p)).collect();
        struct W {
            next_id: u64,
            has_prefix: Vec<bool>,
            requests: VecDeque<Vec<ExternalHash>>,
            unique: usize,
            recent: VecDeque<Vec<LocalHash>>,
        }
        let mut ws: Vec<W> = (0..cfg.workers.max(1))
            .map(|_| W {
                next_id: 0,
                has_prefix: vec![false; prefixes.len()],
                requests: VecDeque::new(),
                unique: 0,
                recent: VecDeque::new(),
            })
            .collect();
        let mut out = Workload::default();
        for _ in 0..cfg.requests {
            let wi = rng.below(ws.len());
            // Skewed prefix popularity: square of a uniform draw.
            let u = rng.below(1 << 16) as u64;
            let pi = (((u * u) >> 16) as usize * prefixes.len()) >> 16;
            let pi = pi.min(prefixes.len() - 1);
            let uniq: Vec<LocalHash> = (0..cfg.unique_blocks)
                .map(|_| LocalHash(rng.next()))
                .collect();
            let parent_seq = prefix_seq[pi].last().copied();
            let useq = chain(parent_seq, &uniq);
            let w = &mut ws[wi];
            let key = WorkerKey::new(wi as u64, 0);
            let mut blocks = Vec::new();
            let parent = if w.has_prefix[pi] || prefixes[pi].is_empty() {
                parent_seq.map(ExternalHash)
            } else {
                for (l, s) in prefixes[pi].iter().zip(&prefix_seq[pi]) {
                    blocks.push(StoredBlock {
                        external: ExternalHash(*s),
                        local: *l,
                    });
                }
                w.has_prefix[pi] = true;
                None
            };
            for (l, s) in uniq.iter().zip(&useq) {
                blocks.push(StoredBlock {
                    external: ExternalHash(*s),
                    local: *l,
                });
            }
            out.block_ops += blocks.len() as u64;
            out.events.push(KvEvent {
                worker: key,
                event_id: w.next_id,
                data: KvEventData::Stored { parent, blocks },
            });
            w.next_id += 1;
            w.requests
                .push_back(useq.iter().map(|s| ExternalHash(*s)).collect());
            w.unique += uniq.len();
            let mut full = prefixes[pi].clone();
            full.extend_from_slice(&uniq);
            w.recent.push_back(full);
            if w.recent.len() > 8 {
                w.recent.pop_front();
            }
            while w.unique > cfg.capacity_blocks {
                let Some(mut old) = w.requests.pop_front() else {
                    break;
                };
                w.unique -= old.len();
                old.reverse();
                out.block_ops += old.len() as u64;
                out.events.push(KvEvent {
                    worker: key,
                    event_id: w.next_id,
                    data: KvEventData::Removed { hashes: old },
                });
                w.next_id += 1;
            }
        }
        for _ in 0..cfg.queries {
            let w = &ws[rng.below(ws.len())];
            let q = if rng.below(2) == 0 && !w.recent.is_empty() {
                w.recent[rng.below(w.recent.len())].clone()
            } else {
                let pi = rng.below(prefixes.len());
                let mut q = prefixes[pi].clone();
                q.extend((0..cfg.unique_blocks).map(|_| LocalHash(rng.next())));
                q
            };
            out.queries.push(q);
        }
        out
    }

    /// Splits the events by lane (see [`crate::lanes::lane_of`]), keeping
    /// each worker's order.
    pub fn by_lane(&self, lanes: usize) -> Vec<Vec<KvEvent>> {
        let mut v = vec![Vec::new(); lanes.max(1)];
        for ev in &self.events {
            v[crate::lanes::lane_of(ev.worker, lanes)].push(ev.clone());
        }
        v
    }
}
