//! Simulated inference engines: a KV block pool with prefix caching and LRU
//! eviction, a simple prefill/decode time model, and the `Stored`/`Removed`
//! events a real engine would publish.
//!
//! # Block pool
//! A pool holds at most `capacity` blocks, keyed by the block's sequence
//! hash (an [`ExternalHash`] derived from the worker and the whole prefix up
//! to and including the block). A request pins the longest cached prefix of
//! its prompt (prefix-cache hits), then allocates its remaining blocks,
//! evicting unreferenced blocks in LRU order when the pool is full. Freed
//! blocks stay cached until evicted. LRU ties are broken deepest-first, and a
//! block is always released no later than its parent, so eviction only ever
//! removes leaves: the cache stays a prefix-closed forest, exactly what a
//! radix-tree index can mirror.
//!
//! # Time model
//! One request at a time is prefilled (FIFO) at `prefill_tps` tokens per
//! second over the tokens not covered by cache hits; decode then runs at
//! `decode_tps` tokens per second per sequence, independent of batch size.
//! At most `max_running` requests are admitted at once; the rest wait in
//! FIFO order. TTFT is queueing plus prefill.
//!
//! # Events
//! Blocks are published (`Stored`) when a request is admitted and its blocks
//! allocated, and `Removed` when evicted; each event carries a per-worker
//! increasing `event_id` and the simulated time in microseconds.

use std::cmp::Reverse;
use std::collections::{BTreeSet, HashMap, VecDeque};

use kvindex::{ExternalHash, KvEvent, KvEventData, LocalHash, StoredBlock, WorkerKey};
use serde::Serialize;

use crate::trace::{chain_hash, mix64};

/// Engine parameters shared by all workers.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct EngineConfig {
    /// KV blocks per worker.
    pub capacity_blocks: usize,
    /// Tokens per block.
    pub block_size: usize,
    /// Prefill speed, tokens per second.
    pub prefill_tps: f64,
    /// Decode speed per running sequence, tokens per second.
    pub decode_tps: f64,
    /// Most requests admitted (prefilling or decoding) at once.
    pub max_running: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            capacity_blocks: 16_384,
            block_size: 64,
            prefill_tps: 20_000.0,
            decode_tps: 50.0,
            max_running: 64,
        }
    }
}

/// The local hash the router and index use for a block id.
pub fn local_hash(block_id: u64) -> LocalHash {
    LocalHash(mix64(block_id))
}

/// The sequence hashes (external hashes) a worker gives a prompt's blocks:
/// chained over the prefix and salted with the worker, as an engine would.
pub fn external_hashes(worker: WorkerKey, blocks: &[u64]) -> Vec<ExternalHash> {
    let salt = mix64(worker.worker_id ^ (u64::from(worker.dp_rank) << 48) ^ 0xA5A5);
    let mut chain = 0u64;
    blocks
        .iter()
        .map(|&b| {
            chain = chain_hash(chain, b);
            ExternalHash(mix64(chain ^ salt))
        })
        .collect()
}

#[derive(Debug, Clone)]
struct Entry {
    local: LocalHash,
    depth: u32,
    refs: u32,
    stamp: u64,
}

/// Key of an unreferenced block in LRU order: oldest release first, deepest
/// first among equals.
type LruKey = (u64, Reverse<u32>, u64);

/// Outcome of [`BlockPool::acquire`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acquired {
    /// Leading blocks found in the cache.
    pub hits: usize,
    /// Blocks pinned by this request (hits plus newly stored); release
    /// exactly these.
    pub pinned: usize,
    /// Hashes evicted to make room.
    pub evicted: Vec<ExternalHash>,
    /// Blocks newly stored, in prompt order.
    pub stored: Vec<StoredBlock>,
    /// Parent of the first stored block.
    pub parent: Option<ExternalHash>,
}

/// A fixed-capacity KV block pool with prefix caching and LRU eviction of
/// unreferenced blocks.
#[derive(Debug, Clone)]
pub struct BlockPool {
    capacity: usize,
    blocks: HashMap<u64, Entry>,
    lru: BTreeSet<LruKey>,
    clock: u64,
}

impl BlockPool {
    /// An empty pool of `capacity` blocks.
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            blocks: HashMap::new(),
            lru: BTreeSet::new(),
            clock: 0,
        }
    }

    /// Capacity in blocks.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Cached blocks.
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    /// No block cached.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// Whether a block is cached.
    pub fn contains(&self, h: ExternalHash) -> bool {
        self.blocks.contains_key(&h.0)
    }

    /// Cached blocks nobody references.
    pub fn evictable(&self) -> usize {
        self.lru.len()
    }

    /// Reference count of a cached block.
    pub fn refs(&self, h: ExternalHash) -> Option<u32> {
        self.blocks.get(&h.0).map(|e| e.refs)
    }

    /// Length of the cached prefix of `exts`.
    pub fn cached_prefix(&self, exts: &[ExternalHash]) -> usize {
        exts.iter()
            .take_while(|h| self.blocks.contains_key(&h.0))
            .count()
    }

    /// Length of the prefix of `exts` that is cached and pinned by running
    /// requests.
    pub fn pinned_prefix(&self, exts: &[ExternalHash]) -> usize {
        exts.iter()
            .take_while(|h| self.blocks.get(&h.0).is_some_and(|e| e.refs > 0))
            .count()
    }

    /// All cached `(external, local)` pairs.
    pub fn contents(&self) -> BTreeSet<(u64, u64)> {
        self.blocks.iter().map(|(k, e)| (*k, e.local.0)).collect()
    }

    /// Blocks that could be made available for a request whose first
    /// `hits` blocks are cached: free slots plus evictable blocks not among
    /// those hits.
    pub fn available_for(&self, exts: &[ExternalHash], hits: usize) -> usize {
        let pinned_idle = exts[..hits]
            .iter()
            .filter(|h| self.blocks.get(&h.0).is_some_and(|e| e.refs == 0))
            .count();
        self.capacity - self.blocks.len() + self.lru.len() - pinned_idle
    }

    /// Pins the cached prefix of the prompt and stores up to `max_new` of its
    /// remaining blocks (all of them when room allows), evicting LRU blocks
    /// as needed. `locals` and `exts` are the prompt's local and sequence
    /// hashes. Returns `None`, changing nothing, when even `min_new` blocks
    /// cannot be stored.
    pub fn acquire(
        &mut self,
        locals: &[LocalHash],
        exts: &[ExternalHash],
        min_new: usize,
    ) -> Option<Acquired> {
        debug_assert_eq!(locals.len(), exts.len());
        let hits = self.cached_prefix(exts);
        let want = exts.len() - hits;
        let avail = self.available_for(exts, hits);
        if avail < min_new.min(want) {
            return None;
        }
        let new = want.min(avail);
        for h in &exts[..hits] {
            let e = self.blocks.get_mut(&h.0).expect("cached prefix");
            if e.refs == 0 {
                self.lru.remove(&(e.stamp, Reverse(e.depth), h.0));
            }
            e.refs += 1;
        }
        let mut evicted = Vec::new();
        while self.blocks.len() + new > self.capacity {
            let key = self.lru.pop_first().expect("room was checked");
            self.blocks.remove(&key.2);
            evicted.push(ExternalHash(key.2));
        }
        let mut stored = Vec::with_capacity(new);
        for i in hits..hits + new {
            self.blocks.insert(
                exts[i].0,
                Entry {
                    local: locals[i],
                    depth: i as u32,
                    refs: 1,
                    stamp: 0,
                },
            );
            stored.push(StoredBlock {
                external: exts[i],
                local: locals[i],
            });
        }
        Some(Acquired {
            hits,
            pinned: hits + new,
            evicted,
            stored,
            parent: if hits > 0 { Some(exts[hits - 1]) } else { None },
        })
    }

    /// Unpins the first `pinned` blocks of a prompt; blocks whose count drops
    /// to zero become evictable, most recently used.
    pub fn release(&mut self, exts: &[ExternalHash]) {
        self.clock += 1;
        for h in exts {
            let e = self.blocks.get_mut(&h.0).expect("released block is cached");
            debug_assert!(e.refs > 0);
            e.refs -= 1;
            if e.refs == 0 {
                e.stamp = self.clock;
                self.lru.insert((e.stamp, Reverse(e.depth), h.0));
            }
        }
    }
}

/// A request handed to an engine.
#[derive(Debug, Clone)]
pub struct EngineRequest {
    /// Caller's id for the request.
    pub id: usize,
    /// Arrival time, µs.
    pub arrival_us: u64,
    /// Prompt tokens.
    pub input_tokens: u32,
    /// Tokens to generate.
    pub output_tokens: u32,
    /// Local hashes of the prompt's blocks.
    pub locals: Vec<LocalHash>,
    /// This worker's sequence hashes of the prompt's blocks.
    pub exts: Vec<ExternalHash>,
}

/// A request the engine admitted.
#[derive(Debug, Clone, PartialEq)]
pub struct Admitted {
    /// Caller's id.
    pub id: usize,
    /// Prompt blocks found in cache.
    pub hit_blocks: usize,
    /// Prompt blocks.
    pub prompt_blocks: usize,
    /// Prompt tokens computed (not covered by the cache).
    pub prefill_tokens: u64,
    /// Time to first token, µs.
    pub ttft_us: u64,
    /// When the request finishes, µs.
    pub done_us: u64,
}

#[derive(Debug)]
struct Running {
    exts: Vec<ExternalHash>,
    blocks: u64,
}

/// One simulated worker.
#[derive(Debug)]
pub struct Engine {
    key: WorkerKey,
    cfg: EngineConfig,
    pool: BlockPool,
    waiting: VecDeque<EngineRequest>,
    running: HashMap<usize, Running>,
    prefill_free_us: u64,
    next_event_id: u64,
    /// Output blocks of admitted, unfinished requests.
    active_blocks: u64,
    /// Prompt blocks of queued requests.
    queued_prefill_blocks: u64,
    /// Tokens of work done: prefill computed plus decoded.
    pub work_tokens: u64,
    /// Requests served.
    pub served: u64,
}

impl Engine {
    /// A fresh worker.
    pub fn new(key: WorkerKey, cfg: EngineConfig) -> Self {
        Self {
            key,
            cfg,
            pool: BlockPool::new(cfg.capacity_blocks),
            waiting: VecDeque::new(),
            running: HashMap::new(),
            prefill_free_us: 0,
            next_event_id: 0,
            active_blocks: 0,
            queued_prefill_blocks: 0,
            work_tokens: 0,
            served: 0,
        }
    }

    /// The worker's key.
    pub fn key(&self) -> WorkerKey {
        self.key
    }

    /// The block pool.
    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// KV blocks in use by admitted, unfinished requests: the distinct
    /// cached prompt blocks they pin (shared prefixes count once, as in
    /// Dynamo's active-sequence tracking) plus their output blocks.
    pub fn active_blocks(&self) -> u64 {
        (self.pool.len() - self.pool.evictable()) as u64 + self.active_blocks
    }

    /// Blocks still to prefill at `now_us`: the whole prompts of queued
    /// requests plus what remains of admitted prefills.
    pub fn pending_prefill_blocks(&self, now_us: u64) -> u64 {
        let backlog_us = self.prefill_free_us.saturating_sub(now_us);
        let backlog_tokens = backlog_us as f64 * self.cfg.prefill_tps / 1e6;
        self.queued_prefill_blocks + (backlog_tokens / self.cfg.block_size as f64).ceil() as u64
    }

    /// Requests queued or running.
    pub fn active_requests(&self) -> usize {
        self.waiting.len() + self.running.len()
    }

    fn blocks_of(&self, tokens: u32) -> u64 {
        (u64::from(tokens)).div_ceil(self.cfg.block_size as u64)
    }

    /// Queues a request; call [`Engine::schedule`] afterwards.
    pub fn enqueue(&mut self, req: EngineRequest) {
        self.queued_prefill_blocks += req.locals.len() as u64;
        self.waiting.push_back(req);
    }

    fn event(&mut self, now_us: u64, data: KvEventData, out: &mut Vec<(u64, KvEvent)>) {
        let ev = KvEvent {
            worker: self.key,
            event_id: self.next_event_id,
            data,
        };
        self.next_event_id += 1;
        out.push((now_us, ev));
    }

    /// Admits waiting requests in FIFO order while batch and pool allow,
    /// publishing events into `events` and returning the admitted requests.
    pub fn schedule(&mut self, now_us: u64, events: &mut Vec<(u64, KvEvent)>) -> Vec<Admitted> {
        let mut admitted = Vec::new();
        while let Some(req) = self.waiting.front() {
            if self.running.len() >= self.cfg.max_running {
                break;
            }
            // With nothing running, store what fits rather than wait forever.
            let min_new = if self.running.is_empty() {
                0
            } else {
                usize::MAX
            };
            let Some(acq) = self.pool.acquire(&req.locals, &req.exts, min_new) else {
                break;
            };
            let req = self.waiting.pop_front().expect("front exists");
            if !acq.evicted.is_empty() {
                self.event(
                    now_us,
                    KvEventData::Removed {
                        hashes: acq.evicted.clone(),
                    },
                    events,
                );
            }
            if !acq.stored.is_empty() {
                self.event(
                    now_us,
                    KvEventData::Stored {
                        parent: acq.parent,
                        blocks: acq.stored.clone(),
                    },
                    events,
                );
            }
            let bs = self.cfg.block_size as u64;
            let cached_tokens = acq.hits as u64 * bs;
            let prefill_tokens = u64::from(req.input_tokens)
                .saturating_sub(cached_tokens)
                .max(1);
            let start = now_us.max(self.prefill_free_us);
            let prefill_us = (prefill_tokens as f64 / self.cfg.prefill_tps * 1e6).ceil() as u64;
            let first_token = start + prefill_us.max(1);
            self.prefill_free_us = first_token;
            let decode_us =
                (f64::from(req.output_tokens) / self.cfg.decode_tps * 1e6).ceil() as u64;
            let blocks = self.blocks_of(req.output_tokens);
            self.queued_prefill_blocks -= req.locals.len() as u64;
            self.active_blocks += blocks;
            self.work_tokens += prefill_tokens + u64::from(req.output_tokens);
            self.served += 1;
            let mut exts = req.exts;
            exts.truncate(acq.pinned);
            self.running.insert(req.id, Running { exts, blocks });
            admitted.push(Admitted {
                id: req.id,
                hit_blocks: acq.hits,
                prompt_blocks: req.locals.len(),
                prefill_tokens,
                ttft_us: first_token - req.arrival_us,
                done_us: first_token + decode_us,
            });
        }
        admitted
    }

    /// Removes a request that is still waiting (a client that gave up
    /// before admission). Returns whether it was waiting; a running
    /// request ends with [`Engine::finish`] instead.
    pub fn cancel(&mut self, id: usize) -> bool {
        let Some(i) = self.waiting.iter().position(|r| r.id == id) else {
            return false;
        };
        if let Some(r) = self.waiting.remove(i) {
            self.queued_prefill_blocks -= r.locals.len() as u64;
        }
        true
    }

    /// Drops every cached block (vLLM's prefix-cache reset), publishing
    /// `Cleared`. Refused (false) while a request is admitted, as vLLM
    /// refuses while blocks are in use.
    pub fn reset_cache(&mut self, now_us: u64, events: &mut Vec<(u64, KvEvent)>) -> bool {
        if !self.running.is_empty() {
            return false;
        }
        self.pool = BlockPool::new(self.pool.capacity());
        self.event(now_us, KvEventData::Cleared, events);
        true
    }

    /// Whether a request is admitted and not yet finished.
    pub fn is_running(&self, id: usize) -> bool {
        self.running.contains_key(&id)
    }

    /// Marks a request finished, unpinning its blocks. Call
    /// [`Engine::schedule`] afterwards.
    pub fn finish(&mut self, id: usize) {
        if let Some(r) = self.running.remove(&id) {
            self.pool.release(&r.exts);
            self.active_blocks -= r.blocks;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn w(id: u64) -> WorkerKey {
        WorkerKey {
            worker_id: id,
            dp_rank: 0,
        }
    }

    fn prompt(blocks: &[u64]) -> (Vec<LocalHash>, Vec<ExternalHash>) {
        (
            blocks.iter().map(|&b| local_hash(b)).collect(),
            external_hashes(w(0), blocks),
        )
    }

    #[test]
    fn external_hashes_depend_on_prefix_and_worker() {
        let a = external_hashes(w(0), &[1, 2, 3]);
        let b = external_hashes(w(0), &[9, 2, 3]);
        let c = external_hashes(w(1), &[1, 2, 3]);
        assert_ne!(a[1], b[1]);
        assert_ne!(a[0], c[0]);
        assert_eq!(a[..2], external_hashes(w(0), &[1, 2])[..]);
    }

    #[test]
    fn prefix_hits_and_lru_eviction() {
        let mut p = BlockPool::new(4);
        let (l, e) = prompt(&[1, 2, 3]);
        let a = p.acquire(&l, &e, usize::MAX).unwrap();
        assert_eq!((a.hits, a.stored.len(), a.parent), (0, 3, None));
        p.release(&e);
        let (l2, e2) = prompt(&[1, 2, 4, 5]);
        let b = p.acquire(&l2, &e2, usize::MAX).unwrap();
        assert_eq!(b.hits, 2);
        assert_eq!(b.parent, Some(e[1]));
        // block 3 (a leaf, unreferenced) made room
        assert_eq!(b.evicted, vec![e[2]]);
        assert_eq!(p.len(), 4);
        // everything pinned: a new prompt cannot get room
        let (l3, e3) = prompt(&[7]);
        assert!(p.acquire(&l3, &e3, usize::MAX).is_none());
        assert_eq!(p.acquire(&l3, &e3, 0).unwrap().stored.len(), 0);
    }

    /// Operations for the model-based test.
    #[derive(Debug, Clone)]
    enum Op {
        Acquire(Vec<u64>),
        Release(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            // prompts over a small alphabet so that prefixes collide
            prop::collection::vec(0u64..4, 1..6).prop_map(Op::Acquire),
            (0usize..8).prop_map(Op::Release),
        ]
    }

    proptest! {
        /// The pool against a simple model: a map from sequence hash to
        /// (refs, parent, last-release time). Checks capacity, hits, that
        /// every eviction is a reported, unreferenced leaf, and that the
        /// stored/removed stream reproduces the contents.
        #[test]
        fn pool_matches_model(cap in 1usize..10, ops in prop::collection::vec(op(), 1..80)) {
            let mut pool = BlockPool::new(cap);
            let mut model: BTreeMap<u64, (u32, Option<u64>)> = BTreeMap::new();
            let mut from_events: BTreeMap<u64, u64> = BTreeMap::new();
            let mut held: Vec<Vec<ExternalHash>> = Vec::new();
            for op in ops {
                match op {
                    Op::Acquire(blocks) => {
                        let (l, e) = prompt(&blocks);
                        let hits = e.iter().take_while(|h| model.contains_key(&h.0)).count();
                        let min_new = if held.is_empty() { 0 } else { usize::MAX };
                        match pool.acquire(&l, &e, min_new) {
                            None => {
                                let idle = model.values().filter(|v| v.0 == 0).count()
                                    - e[..hits].iter().filter(|h| model[&h.0].0 == 0).count();
                                prop_assert!(cap - model.len() + idle < e.len() - hits);
                            }
                            Some(a) => {
                                prop_assert_eq!(a.hits, hits);
                                for h in &a.evicted {
                                    let (refs, _) = model.remove(&h.0).expect("evicted a cached block");
                                    prop_assert_eq!(refs, 0);
                                    prop_assert!(!model.values().any(|v| v.1 == Some(h.0)), "evicted a non-leaf");
                                    prop_assert!(from_events.remove(&h.0).is_some());
                                }
                                for h in &e[..hits] {
                                    model.get_mut(&h.0).unwrap().0 += 1;
                                }
                                for (i, sb) in a.stored.iter().enumerate() {
                                    let idx = hits + i;
                                    prop_assert_eq!(sb.external, e[idx]);
                                    let parent = if idx == 0 { None } else { Some(e[idx - 1].0) };
                                    model.insert(sb.external.0, (1, parent));
                                    from_events.insert(sb.external.0, sb.local.0);
                                }
                                held.push(e[..a.pinned].to_vec());
                            }
                        }
                    }
                    Op::Release(i) => {
                        if !held.is_empty() {
                            let e = held.remove(i % held.len());
                            pool.release(&e);
                            for h in &e {
                                model.get_mut(&h.0).unwrap().0 -= 1;
                            }
                        }
                    }
                }
                prop_assert!(pool.len() <= cap);
                prop_assert_eq!(pool.len(), model.len());
                prop_assert_eq!(pool.evictable(), model.values().filter(|v| v.0 == 0).count());
                for (h, (refs, _)) in &model {
                    prop_assert_eq!(pool.refs(ExternalHash(*h)), Some(*refs));
                }
                let contents: BTreeSet<(u64, u64)> = from_events.iter().map(|(a, b)| (*a, *b)).collect();
                prop_assert_eq!(pool.contents(), contents);
            }
        }
    }

    #[test]
    fn engine_time_model_and_batch_limit() {
        let cfg = EngineConfig {
            capacity_blocks: 100,
            block_size: 10,
            prefill_tps: 1000.0,
            decode_tps: 100.0,
            max_running: 1,
        };
        let mut eng = Engine::new(w(3), cfg);
        let mk = |id: usize, blocks: &[u64]| {
            let (locals, _) = prompt(blocks);
            EngineRequest {
                id,
                arrival_us: 0,
                input_tokens: 10 * blocks.len() as u32,
                output_tokens: 10,
                locals,
                exts: external_hashes(w(3), blocks),
            }
        };
        eng.enqueue(mk(0, &[1, 2]));
        eng.enqueue(mk(1, &[1, 2, 3]));
        let mut ev = Vec::new();
        let a = eng.schedule(0, &mut ev);
        assert_eq!(a.len(), 1, "batch limit 1");
        assert_eq!(a[0].ttft_us, 20_000); // 20 tokens at 1000 tok/s
        assert_eq!(a[0].done_us, 120_000); // + 10 tokens at 100 tok/s
        assert_eq!(eng.active_requests(), 2);
        eng.finish(0);
        let b = eng.schedule(120_000, &mut ev);
        assert_eq!(b[0].hit_blocks, 2);
        assert_eq!(b[0].prefill_tokens, 10);
        assert_eq!(b[0].ttft_us, 130_000);
        assert_eq!(ev.len(), 2);
        assert!(ev.windows(2).all(|p| p[0].1.event_id < p[1].1.event_id));
        assert!(ev.iter().all(|(_, e)| e.worker == w(3)));
    }

    /// A cancelled waiting request leaves the queue (and its pending
    /// prefill); the next one is admitted in its place. Running requests
    /// are not cancelled, only finished.
    #[test]
    fn cancel_removes_a_waiting_request_only() {
        let cfg = EngineConfig {
            capacity_blocks: 100,
            block_size: 10,
            prefill_tps: 1000.0,
            decode_tps: 100.0,
            max_running: 1,
        };
        let mut eng = Engine::new(w(1), cfg);
        for (id, blocks) in [(0usize, &[1u64, 2][..]), (1, &[3, 4, 5]), (2, &[6])] {
            let (locals, exts) = prompt(blocks);
            eng.enqueue(EngineRequest {
                id,
                arrival_us: 0,
                input_tokens: 10 * blocks.len() as u32,
                output_tokens: 1,
                locals,
                exts,
            });
        }
        let mut ev = Vec::new();
        assert_eq!(eng.schedule(0, &mut ev)[0].id, 0);
        assert_eq!(
            eng.pending_prefill_blocks(0),
            4 + 2,
            "two queued prompts, 2 blocks in flight"
        );
        assert!(eng.cancel(1));
        assert!(!eng.cancel(1), "already gone");
        assert!(!eng.cancel(0), "running, not waiting");
        assert!(eng.is_running(0));
        assert_eq!(eng.active_requests(), 2);
        eng.finish(0);
        let next = eng.schedule(1_000_000, &mut ev);
        assert_eq!(next.iter().map(|a| a.id).collect::<Vec<_>>(), vec![2]);
        assert_eq!(eng.pending_prefill_blocks(1_010_000), 0);
    }

    /// A reset waits for running requests, then empties the pool with one
    /// `Cleared`; the same prompt misses afterwards.
    #[test]
    fn reset_cache_clears_an_idle_pool() {
        let cfg = EngineConfig {
            capacity_blocks: 10,
            block_size: 10,
            prefill_tps: 1000.0,
            decode_tps: 100.0,
            max_running: 4,
        };
        let mut eng = Engine::new(w(2), cfg);
        let req = |id| EngineRequest {
            id,
            arrival_us: 0,
            input_tokens: 30,
            output_tokens: 1,
            locals: prompt(&[1, 2, 3]).0,
            exts: external_hashes(w(2), &[1, 2, 3]),
        };
        let mut ev = Vec::new();
        eng.enqueue(req(0));
        assert_eq!(eng.schedule(0, &mut ev)[0].hit_blocks, 0);
        assert!(!eng.reset_cache(1, &mut ev), "blocks in use");
        eng.finish(0);
        ev.clear();
        assert!(eng.reset_cache(2, &mut ev));
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].1.data, KvEventData::Cleared);
        assert!(eng.pool().is_empty());
        eng.enqueue(req(1));
        assert_eq!(eng.schedule(3, &mut ev)[0].hit_blocks, 0);
        assert_eq!(eng.pool().len(), 3);
    }
}
