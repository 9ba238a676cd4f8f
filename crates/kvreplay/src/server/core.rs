//! The scheduler core: one [`Engine`] driven on the wall clock. Requests
//! are enqueued as they arrive and the engine schedules on every arrival
//! and every end (a finished or abandoned request frees its slot and
//! blocks); each admitted request learns its first-token and finish times
//! from the time model, and each step's events go to the publisher as one
//! batch with the stored blocks' tokens.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use kvindex::{ExternalHash, KvEvent, WorkerKey};
use kvrouter::wire::{encode_batch, WireEvent};
use tokio::sync::oneshot;

use super::publish::BatchSender;
use crate::engine::{external_hashes, Admitted, Engine, EngineConfig, EngineRequest};

/// The simulated clock: wall time since start, sped up by a factor.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clock {
    start: Instant,
    speedup: f64,
}

impl Clock {
    /// A clock starting now.
    pub(crate) fn new(speedup: f64) -> Self {
        Self {
            start: Instant::now(),
            speedup,
        }
    }

    /// Simulated µs since start.
    pub(crate) fn now_us(&self) -> u64 {
        (self.start.elapsed().as_secs_f64() * self.speedup * 1e6) as u64
    }

    /// The wall instant of simulated time `us`.
    pub(crate) fn instant_at(&self, us: u64) -> Instant {
        // Past what an Instant holds: a year from start, never reached.
        let far = || self.start + Duration::from_secs(365 * 86_400);
        Duration::try_from_secs_f64(us as f64 / 1e6 / self.speedup)
            .ok()
            .and_then(|d| self.start.checked_add(d))
            .unwrap_or_else(far)
    }
}

/// What an admitted request learns: its cache hits and when its tokens are
/// due, in simulated µs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Admission {
    /// Prompt blocks found in the cache.
    pub(crate) hit_blocks: usize,
    /// When the first token is due.
    pub(crate) first_token_us: u64,
}

/// A queued request: its prompt (for the stored blocks' tokens) and
/// whom to tell when it is admitted.
struct Waiter {
    arrival_us: u64,
    tokens: Arc<[u32]>,
    exts: Vec<ExternalHash>,
    tx: oneshot::Sender<Admission>,
}

/// Counters for `/metrics`.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Counters {
    /// Prompt tokens of admitted requests.
    pub(crate) prompt_tokens: u64,
    /// Of those, tokens found in the cache.
    pub(crate) cached_tokens: u64,
    /// Requests that ran to the end.
    pub(crate) finished: u64,
    /// Requests abandoned by their client.
    pub(crate) cancelled: u64,
    /// Batches published.
    pub(crate) batches: u64,
}

/// The engine and what it needs to run on the wall clock.
pub(crate) struct Core {
    engine: Engine,
    block_size: usize,
    clock: Clock,
    next_id: usize,
    waiting: HashMap<usize, Waiter>,
    events: BatchSender,
    counters: Counters,
}

/// The core behind its lock.
pub(crate) type SharedCore = Arc<Mutex<Core>>;

/// Locks the core; a panic elsewhere does not stop the engine.
pub(crate) fn lock(core: &SharedCore) -> MutexGuard<'_, Core> {
    core.lock().unwrap_or_else(|e| e.into_inner())
}

impl Core {
    /// An idle engine `engine_id` publishing through `events`.
    pub(crate) fn new(
        engine_id: u64,
        cfg: EngineConfig,
        clock: Clock,
        events: BatchSender,
    ) -> Self {
        let key = WorkerKey {
            worker_id: engine_id,
            dp_rank: 0,
        };
        Self {
            engine: Engine::new(key, cfg),
            block_size: cfg.block_size,
            clock,
            next_id: 0,
            waiting: HashMap::new(),
            events,
            counters: Counters::default(),
        }
    }

    /// Queues a prompt generating `output_tokens` and schedules. Returns
    /// the request's id and where its admission will be told.
    pub(crate) fn submit(
        &mut self,
        tokens: Arc<[u32]>,
        output_tokens: u32,
    ) -> (usize, oneshot::Receiver<Admission>) {
        let id = self.next_id;
        self.next_id += 1;
        let locals = kvindex::local_block_hashes(&tokens, self.block_size, None);
        let ids: Vec<u64> = locals.iter().map(|l| l.0).collect();
        let exts = external_hashes(self.engine.key(), &ids);
        let (tx, rx) = oneshot::channel();
        let arrival_us = self.clock.now_us();
        self.engine.enqueue(EngineRequest {
            id,
            arrival_us,
            input_tokens: u32::try_from(tokens.len()).unwrap_or(u32::MAX),
            output_tokens,
            locals,
            exts: exts.clone(),
        });
        self.waiting.insert(
            id,
            Waiter {
                arrival_us,
                tokens,
                exts,
                tx,
            },
        );
        self.schedule();
        (id, rx)
    }

    /// Ends a request: a waiting one leaves the queue, a running one
    /// finishes and unpins its blocks; then the engine schedules.
    pub(crate) fn end(&mut self, id: usize, completed: bool) {
        if self.engine.cancel(id) {
            self.waiting.remove(&id);
        } else {
            self.engine.finish(id);
        }
        if completed {
            self.counters.finished += 1;
        } else {
            self.counters.cancelled += 1;
        }
        self.schedule();
    }

    /// Drops the whole cache (one `AllBlocksCleared` batch); refused while
    /// a request runs.
    pub(crate) fn reset(&mut self) -> bool {
        let mut events = Vec::new();
        let done = self.engine.reset_cache(self.clock.now_us(), &mut events);
        self.publish(&events, &[]);
        done
    }

    /// Publishes a step's events as one batch, if there are any.
    fn publish(&mut self, events: &[(u64, KvEvent)], admitted: &[Admitted]) {
        if events.is_empty() {
            return;
        }
        let wire: Vec<WireEvent> = events
            .iter()
            .map(|(_, ev)| self.wire_event(ev, admitted))
            .collect();
        let ts = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        self.events.send(encode_batch(ts, &wire, None));
        self.counters.batches += 1;
    }

    /// Admits what the engine can, publishes the step's events as one
    /// batch and tells the admitted requests their times.
    fn schedule(&mut self) {
        let mut events = Vec::new();
        let admitted = self.engine.schedule(self.clock.now_us(), &mut events);
        self.publish(&events, &admitted);
        for a in admitted {
            let Some(w) = self.waiting.remove(&a.id) else {
                continue;
            };
            self.counters.prompt_tokens += w.tokens.len() as u64;
            self.counters.cached_tokens += (a.hit_blocks * self.block_size) as u64;
            let first_token_us = w.arrival_us + a.ttft_us;
            // A dropped receiver is a client gone; its guard ends it.
            let _ = w.tx.send(Admission {
                hit_blocks: a.hit_blocks,
                first_token_us,
            });
        }
    }

    /// An engine event in vLLM's form; a `Stored` event carries the tokens
    /// of the blocks it stores, found through the admitted request whose
    /// first new block it starts with.
    fn wire_event(&self, ev: &KvEvent, admitted: &[Admitted]) -> WireEvent {
        let bs = self.block_size;
        crate::live::to_wire(ev, bs, |blocks| {
            let first = blocks.first().map(|b| b.external);
            admitted
                .iter()
                .filter_map(|a| self.waiting.get(&a.id).map(|w| (a, w)))
                .find(|(a, w)| w.exts.get(a.hit_blocks).copied() == first)
                .and_then(|(a, w)| {
                    let from = a.hit_blocks * bs;
                    w.tokens.get(from..from + blocks.len() * bs)
                })
                .map(<[u32]>::to_vec)
                .unwrap_or_default()
        })
    }

    /// Requests running and waiting.
    pub(crate) fn load(&self) -> (usize, usize) {
        let waiting = self.waiting.len();
        (
            self.engine.active_requests().saturating_sub(waiting),
            waiting,
        )
    }

    /// Blocks in use by admitted requests (cached blocks nobody uses do
    /// not count, as in vLLM's KV-cache usage) and the pool's capacity.
    pub(crate) fn blocks(&self) -> (usize, usize) {
        let p = self.engine.pool();
        (p.len() - p.evictable(), p.capacity())
    }

    /// Blocks in the prefix cache.
    pub(crate) fn cached_blocks(&self) -> usize {
        self.engine.pool().len()
    }

    /// The counters.
    pub(crate) fn counters(&self) -> Counters {
        self.counters
    }
}

/// Ends its request when dropped: on completion, or when the client goes
/// away (the handler's future or the response stream is dropped).
pub(crate) struct RequestGuard {
    core: SharedCore,
    id: usize,
    completed: bool,
}

impl RequestGuard {
    /// Guards request `id`.
    pub(crate) fn new(core: SharedCore, id: usize) -> Self {
        Self {
            core,
            id,
            completed: false,
        }
    }

    /// The request's id.
    pub(crate) fn id(&self) -> usize {
        self.id
    }

    /// Marks the request as run to the end (counted as finished, not
    /// cancelled, when the guard drops).
    pub(crate) fn complete(&mut self) {
        self.completed = true;
    }
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        lock(&self.core).end(self.id, self.completed);
    }
}
