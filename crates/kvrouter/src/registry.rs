//! Models, their indexes and their workers: the state the HTTP handlers
//! read and the ingest threads write.
//!
//! One [`Model`] per model name: one `kvindex::ConcurrentIndex`, one block
//! size, the workers publishing into it, and the routing state (policy and
//! in-flight accounting). Each [`Worker`] carries a [`WorkerStatus`] of
//! atomics that its ingest thread updates and everyone else reads without
//! a lock.
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

use kvindex::{ConcurrentIndex, KvIndexer, WorkerKey};
use kvroute::{LoadTracker, PolicyKind, Router};
use parking_lot::{Mutex, RwLock};

use crate::approx::Approx;

/// What a worker is, as registered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerSpec {
    /// Instance id and data-parallel rank.
    pub key: WorkerKey,
    /// The model it serves.
    pub model: String,
    /// Tokens per KV block.
    pub block_size: u64,
    /// Its ZMQ event publisher (`tcp://host:port`); `None` in approximate
    /// mode, where nothing is published.
    pub endpoint: Option<String>,
    /// Its replay endpoint, if it has one.
    pub replay_endpoint: Option<String>,
    /// The engine's HTTP base URL (`http://HOST:PORT`, no trailing slash):
    /// where the gateway sends the requests routed to it.
    pub url: Option<String>,
}

/// Where a worker's event stream stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FeedState {
    /// Nothing heard yet.
    Pending,
    /// Waiting for the engine to replay missing history.
    Replaying,
    /// Every batch up to the last one heard is applied.
    Active,
    /// No event stream (approximate mode).
    Approximate,
    /// Fed from the NATS stream by another router's relay.
    Replicated,
}

impl FeedState {
    fn from_u8(v: u8) -> Self {
        match v {
            1 => Self::Replaying,
            2 => Self::Active,
            3 => Self::Approximate,
            4 => Self::Replicated,
            _ => Self::Pending,
        }
    }
}

/// Counters and state of one worker's feed. Written by its ingest thread.
#[derive(Debug, Default)]
pub struct WorkerStatus {
    state: AtomicU8,
    /// The last seq applied; `u64::MAX` before any.
    pub last_seq: AtomicU64,
    /// The engine timestamp of the last batch applied (`f64` bits).
    pub last_ts: AtomicU64,
    /// Batches received (live and replayed).
    pub batches: AtomicU64,
    /// Events that entered the index.
    pub events_applied: AtomicU64,
    /// Events the index rejected (unknown parent, too deep).
    pub events_rejected: AtomicU64,
    /// Events with the wrong block size.
    pub block_size_mismatches: AtomicU64,
    /// Malformed events and undecodable batches or frames.
    pub decode_errors: AtomicU64,
    /// Events on tiers the index does not track.
    pub other_tier: AtomicU64,
    /// Events of unknown kinds.
    pub unknown_kinds: AtomicU64,
    /// Gaps seen (each asks for a replay, or resyncs without one).
    pub gaps: AtomicU64,
    /// Replays requested.
    pub replays: AtomicU64,
    /// Replays that timed out.
    pub replay_timeouts: AtomicU64,
    /// Times the worker was cleared because history was lost.
    pub resyncs: AtomicU64,
    /// Times the engine restarted (seq went backwards).
    pub restarts: AtomicU64,
    /// Duplicate batches dropped.
    pub duplicates: AtomicU64,
    problem: Mutex<Option<String>>,
}

impl WorkerStatus {
    fn new() -> Self {
        let s = Self::default();
        s.last_seq.store(u64::MAX, Relaxed);
        s
    }

    /// The feed's state.
    pub fn state(&self) -> FeedState {
        FeedState::from_u8(self.state.load(Relaxed))
    }

    /// Sets the feed's state.
    pub fn set_state(&self, s: FeedState) {
        self.state.store(s as u8, Relaxed);
    }

    /// The last seq applied, if any.
    pub fn last_seq(&self) -> Option<u64> {
        match self.last_seq.load(std::sync::atomic::Ordering::Acquire) {
            u64::MAX => None,
            s => Some(s),
        }
    }

    /// Marks the worker unhealthy, saying why (kept until re-registered).
    pub fn set_problem(&self, why: String) {
        *self.problem.lock() = Some(why);
    }

    /// Why the worker is unhealthy, if it is.
    pub fn problem(&self) -> Option<String> {
        self.problem.lock().clone()
    }
}

/// A registered worker.
#[derive(Debug)]
pub struct Worker {
    /// As registered.
    pub spec: WorkerSpec,
    /// Its feed.
    pub status: WorkerStatus,
    /// When it was registered.
    pub since: Instant,
}

/// Routing state of one model.
pub struct Routing {
    /// The router's policy (`--policy`).
    pub default: PolicyKind,
    /// One router per policy used so far (each keeps its own state: the
    /// round-robin turn, kv-balanced's cache pressure, its random stream).
    pub routers: HashMap<PolicyKind, Router>,
    /// Requests in flight, whichever policy routed them.
    pub loads: LoadTracker<WorkerKey>,
    /// The worker list the routers last saw, in order (their per-worker
    /// state is by position).
    pub last_workers: Vec<WorkerKey>,
}

/// One model: its index, block size, workers and routing state.
pub struct Model {
    /// Model name.
    pub name: String,
    /// Tokens per block, shared by all its workers.
    pub block_size: u64,
    /// The index.
    pub index: Arc<ConcurrentIndex>,
    /// Its workers.
    pub workers: RwLock<BTreeMap<WorkerKey, Arc<Worker>>>,
    /// Policy and in-flight accounting.
    pub routing: Mutex<Routing>,
    /// Blocks recorded from routing decisions (approximate mode).
    pub approx: Mutex<Approx>,
    make_router: Arc<dyn Fn(PolicyKind) -> Router + Send + Sync>,
}

impl Model {
    /// Tells every router of `r` that the worker list is now `workers`, if
    /// it changed, so that per-worker state follows its worker.
    pub fn sync_workers(r: &mut Routing, workers: &[WorkerKey]) {
        if r.last_workers == workers {
            return;
        }
        let old: HashMap<WorkerKey, usize> = r
            .last_workers
            .iter()
            .enumerate()
            .map(|(i, k)| (*k, i))
            .collect();
        let map: Vec<Option<usize>> = workers.iter().map(|k| old.get(k).copied()).collect();
        for router in r.routers.values_mut() {
            router.reorder(&map);
        }
        r.last_workers = workers.to_vec();
    }

    /// The router for `kind` (the model's default policy if `None`),
    /// created on first use.
    pub fn router<'r>(&self, r: &'r mut Routing, kind: Option<PolicyKind>) -> &'r mut Router {
        let kind = kind.unwrap_or(r.default);
        r.routers
            .entry(kind)
            .or_insert_with(|| (self.make_router)(kind))
    }

    /// Blocks the index holds, all workers.
    pub fn blocks(&self) -> usize {
        let workers = self.workers.read();
        workers
            .keys()
            .map(|&w| self.index.worker_block_count(w))
            .sum()
    }
}

/// Why a registration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegisterError {
    /// The model's workers use another block size.
    #[error("model {model:?} uses block size {existing}, not {requested}")]
    BlockSize {
        /// Model.
        model: String,
        /// Its block size.
        existing: u64,
        /// Asked for.
        requested: u64,
    },
    /// That instance and rank are registered for the model already.
    #[error("worker {id} rank {dp_rank} is already registered for model {model:?}")]
    Exists {
        /// Model.
        model: String,
        /// Instance id.
        id: u64,
        /// Data-parallel rank.
        dp_rank: u32,
    },
    /// An endpoint the router cannot connect to as given.
    #[error("endpoint {endpoint:?}: {reason}")]
    Endpoint {
        /// The endpoint.
        endpoint: String,
        /// Why.
        reason: String,
    },
    /// A block size of 0, or over the limit.
    #[error("block size {0} is out of range (1..=65536)")]
    BadBlockSize(u64),
}

/// The models.
pub struct Models {
    models: RwLock<HashMap<String, Arc<Model>>>,
    policy: Arc<dyn Fn(PolicyKind) -> Router + Send + Sync>,
    default: PolicyKind,
}

impl Models {
    /// No models yet; `policy` makes a model's router for a policy, and
    /// `default` is the policy of requests that name none.
    pub fn new(
        default: PolicyKind,
        policy: impl Fn(PolicyKind) -> Router + Send + Sync + 'static,
    ) -> Self {
        Self {
            models: RwLock::new(HashMap::new()),
            policy: Arc::new(policy),
            default,
        }
    }

    /// The model called `name`.
    pub fn get(&self, name: &str) -> Option<Arc<Model>> {
        self.models.read().get(name).cloned()
    }

    /// Every model, by name.
    pub fn all(&self) -> Vec<Arc<Model>> {
        let mut v: Vec<_> = self.models.read().values().cloned().collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    /// Adds a worker (creating its model on first use).
    pub fn add(&self, spec: WorkerSpec) -> Result<(Arc<Model>, Arc<Worker>), RegisterError> {
        if spec.block_size == 0 || spec.block_size > 65536 {
            return Err(RegisterError::BadBlockSize(spec.block_size));
        }
        // Under the models lock, so a concurrent removal of the model's
        // last worker cannot drop the model between finding and joining it.
        let mut models = self.models.write();
        let model = self.ensure_locked(&mut models, &spec.model, spec.block_size);
        if model.block_size != spec.block_size {
            return Err(RegisterError::BlockSize {
                model: spec.model,
                existing: model.block_size,
                requested: spec.block_size,
            });
        }
        let mut workers = model.workers.write();
        if workers.contains_key(&spec.key) {
            return Err(RegisterError::Exists {
                model: spec.model,
                id: spec.key.worker_id,
                dp_rank: spec.key.dp_rank,
            });
        }
        let w = Arc::new(Worker {
            status: WorkerStatus::new(),
            since: Instant::now(),
            spec,
        });
        if w.spec.endpoint.is_none() {
            w.status.set_state(FeedState::Approximate);
        }
        workers.insert(w.spec.key, Arc::clone(&w));
        drop(workers);
        drop(models);
        Ok((model, w))
    }

    /// The model called `name`, created with `block_size` if new.
    pub fn ensure(&self, name: &str, block_size: u64) -> Arc<Model> {
        let mut models = self.models.write();
        self.ensure_locked(&mut models, name, block_size)
    }

    fn ensure_locked(
        &self,
        models: &mut HashMap<String, Arc<Model>>,
        name: &str,
        block_size: u64,
    ) -> Arc<Model> {
        models
            .entry(name.to_string())
            .or_insert_with(|| {
                Arc::new(Model {
                    name: name.to_string(),
                    block_size,
                    index: Arc::new(ConcurrentIndex::new()),
                    workers: RwLock::new(BTreeMap::new()),
                    routing: Mutex::new(Routing {
                        default: self.default,
                        routers: HashMap::new(),
                        loads: LoadTracker::new(),
                        last_workers: Vec::new(),
                    }),
                    make_router: Arc::clone(&self.policy),
                    approx: Mutex::new(Approx::default()),
                })
            })
            .clone()
    }

    /// Removes the workers `keys` of `model`; returns them. A model left
    /// without workers is dropped. The index, loads and approximate blocks
    /// are cleared after the models lock is released.
    pub fn remove(&self, model: &str, keys: &[WorkerKey]) -> Vec<Arc<Worker>> {
        let mut models = self.models.write();
        let Some(m) = models.get(model).cloned() else {
            return Vec::new();
        };
        let mut workers = m.workers.write();
        let out: Vec<Arc<Worker>> = keys.iter().filter_map(|k| workers.remove(k)).collect();
        if workers.is_empty() {
            drop(workers);
            models.remove(model);
        } else {
            drop(workers);
        }
        drop(models);
        for w in &out {
            let k = w.spec.key;
            m.index.remove_worker(k);
            m.routing.lock().loads.remove_worker(&k);
            m.approx.lock().remove_worker(k);
        }
        out
    }
}
