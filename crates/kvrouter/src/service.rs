//! The router's operations, apart from HTTP: register and unregister
//! workers, score a request against a model's index, route it, and account
//! for it until it completes.
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvindex::{
    local_block_hashes_salted, sequence_hashes, BlockSalt, KvIndexer, LocalHash, OverlapScores,
    WorkerKey,
};
use kvroute::{KvCost, PolicyKind, Router, WorkerLoad};

use crate::config::RouterArgs;
use crate::ingest::{FeedError, Ingest};
use crate::registry::{FeedState, Model, Models, RegisterError, Worker, WorkerSpec};

/// Why an operation failed; each maps to one HTTP status.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// No index for that model (404).
    #[error("no index for model {0:?}")]
    UnknownModel(String),
    /// The model has no workers to route to (503).
    #[error("model {0:?} has no workers")]
    NoWorkers(String),
    /// Registration refused (409, or 400 for bad input).
    #[error(transparent)]
    Register(#[from] RegisterError),
    /// The worker's feed could not start (400).
    #[error(transparent)]
    Feed(#[from] FeedError),
    /// A snapshot or peer dump that cannot be loaded.
    #[error(transparent)]
    Snapshot(#[from] Box<crate::snapshot::SnapshotError>),
    /// Bad request fields (400).
    #[error("{0}")]
    Invalid(String),
    /// No such worker or request (404).
    #[error("{0}")]
    NotFound(String),
    /// Too much in flight (503).
    #[error("{0}")]
    Busy(String),
    /// A request id already in flight (409).
    #[error("{0}")]
    Conflict(String),
}

/// What a request carries to be scored.
#[derive(Debug, Clone)]
pub enum Prompt {
    /// Token ids, hashed with the model's block size (and LoRA name).
    Tokens {
        /// The tokens.
        token_ids: Vec<u32>,
        /// LoRA adapter, if any.
        lora_name: Option<String>,
        /// Cache salt (Dynamo's `cache_salt`), if any.
        cache_salt: Option<String>,
    },
    /// Local block hashes the client computed.
    Hashes(Vec<u64>),
}

/// Per-request routing options.
#[derive(Debug, Clone, Default)]
pub struct RouteOptions {
    /// The policy, instead of the router's `--policy`.
    pub policy: Option<PolicyKind>,
    /// The caller's clock, microseconds, instead of the router's: for
    /// replays that run faster than real time on a router of their own
    /// (the policies' decay and the request's time to live follow it, and
    /// nothing expires on the router's clock).
    pub now_us: Option<u64>,
    /// Workers not to choose (the gateway's failed attempts, sick engines,
    /// open breakers): scoring and the policy run over the others.
    pub exclude: Vec<WorkerKey>,
    /// Blocks the prompt goes on past its given tokens, counted but not
    /// tokenized (the gateway's estimate of text no worker holds): new
    /// prefill on whichever worker is chosen.
    pub unseen_blocks: u64,
}

/// One worker's numbers behind a routing decision.
#[derive(Debug, Clone, serde::Serialize)]
pub struct WorkerScore {
    /// Instance id.
    pub worker_id: u64,
    /// Data-parallel rank.
    pub dp_rank: u32,
    /// Leading blocks of the request it holds.
    pub overlap_blocks: u32,
    /// Requests in flight on it.
    pub active_requests: u64,
    /// Distinct blocks those requests occupy.
    pub active_blocks: u64,
    /// Blocks they had to compute.
    pub pending_prefill_blocks: u64,
    /// The kv-aware cost (lower is better), for that policy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost: Option<f64>,
}

/// A routing decision.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Decision {
    /// Chosen instance.
    pub worker_id: u64,
    /// Chosen rank.
    pub dp_rank: u32,
    /// Its cached leading blocks.
    pub overlap_blocks: u32,
    /// The request's full blocks (the unseen ones included).
    pub request_blocks: usize,
    /// The policy.
    pub policy: PolicyKind,
    /// Why this worker, in words.
    pub reason: String,
    /// The id it is accounted under until /complete.
    pub request_id: String,
    /// Every worker's numbers, in worker order.
    pub scores: Vec<WorkerScore>,
}

/// The router: models, their indexes and workers, ingest threads.
pub struct Service {
    /// Settings.
    pub args: RouterArgs,
    /// Models and workers.
    pub models: Models,
    ingest: Ingest,
    /// The NATS link (`--nats`): the indexes follow the stream, the
    /// engines' batches go to it.
    pub nats: Option<Arc<crate::replica::Nats>>,
    start: Instant,
    next_request: std::sync::atomic::AtomicU64,
    scrape_hooks: parking_lot::Mutex<Vec<ScrapeHook>>,
}

/// Sets gauges of a part outside the service (the gateway) at scrape time.
pub type ScrapeHook = Box<dyn Fn() + Send + Sync>;

impl Service {
    /// Starts the ingest threads and registers the workers given in `args`.
    pub fn new(args: RouterArgs) -> Result<Arc<Self>, ServiceError> {
        Self::with_nats(args, None)
    }

    /// As [`Service::new`], on a NATS link: the snapshot it fetched is
    /// loaded, and the configured workers are relayed into the stream.
    /// Blocks on the link's runtime: call it off the runtime's threads.
    pub fn with_nats(
        args: RouterArgs,
        nats: Option<Arc<crate::replica::Nats>>,
    ) -> Result<Arc<Self>, ServiceError> {
        if nats.is_some() {
            let clash = if args.snapshot.is_some() {
                Some("--snapshot")
            } else if args.peer.is_some() {
                Some("--peer")
            } else if args.no_kv_events {
                Some("--no-kv-events")
            } else {
                None
            };
            if let Some(flag) = clash {
                return Err(ServiceError::Invalid(format!(
                    "{flag} does not go with --nats (replicas take their state from the stream and its snapshots)"
                )));
            }
            if args.nats_relay_only && args.gateway {
                return Err(ServiceError::Invalid(
                    "--gateway does not go with --nats-relay-only (a relay keeps no index to route by)"
                        .into(),
                ));
            }
        } else if args.nats_relay_only {
            return Err(ServiceError::Invalid(
                "--nats-relay-only needs --nats".into(),
            ));
        }
        if !(args.overlap_weight.is_finite() && args.overlap_weight >= 0.0) {
            return Err(ServiceError::Invalid(format!(
                "--overlap-weight {} must be a finite number >= 0",
                args.overlap_weight
            )));
        }
        let seed = args.seed;
        let cost = args.cost.unwrap_or(KvCost {
            overlap_weight: args.overlap_weight,
            ..KvCost::default()
        });
        let balance = args.balance.unwrap_or_default();
        // Every (model, policy) router starts from the same seed, so a
        // replay that seeds its own routers alike sees the same tie-breaks.
        let models = Models::new(args.policy, move |kind| {
            Router::new(kind, cost, balance, seed)
        });
        let svc = Arc::new(Self {
            ingest: Ingest::start(args.ingest()),
            models,
            start: Instant::now(),
            next_request: std::sync::atomic::AtomicU64::new(0),
            scrape_hooks: parking_lot::Mutex::new(Vec::new()),
            nats,
            args,
        });
        // A relay-only router applies nothing: no applier, no snapshot.
        if let Some(n) = svc.nats.as_ref().filter(|_| !svc.args.nats_relay_only) {
            let mut a = crate::replica::apply::Applier::new();
            a.bind(Arc::clone(&svc));
            if let Some(snap) = n.initial.lock().take() {
                let t = Instant::now();
                let blocks = a.load(snap);
                tracing::info!(
                    blocks,
                    stream_seq = a.applied,
                    ms = t.elapsed().as_millis() as u64,
                    "snapshot loaded"
                );
            }
            *n.applier.lock() = Some(a);
        }
        // Workers from the flags and the file, first: a worker the
        // snapshot also holds takes its endpoints from here.
        let configured = svc.configured_workers()?;
        let doc = match (&svc.args.snapshot, &svc.args.peer) {
            (Some(path), _) if path.exists() => crate::snapshot::read(path).map_err(Box::new)?,
            (_, Some(url)) => Some(crate::snapshot::fetch(url).map_err(Box::new)?),
            _ => None,
        };
        if let Some(doc) = doc {
            let r = crate::snapshot::restore(&svc, &doc, &configured).map_err(Box::new)?;
            tracing::info!(
                models = r.models,
                events = r.events,
                workers = r.workers,
                "state restored"
            );
        }
        for spec in configured {
            if svc.nats.is_some() {
                svc.register(spec)?;
                continue;
            }
            let known = svc
                .models
                .get(&spec.model)
                .is_some_and(|m| m.workers.read().contains_key(&spec.key));
            if !known {
                svc.register(spec)?;
            }
        }
        Ok(svc)
    }

    /// The workers `--worker` and `--workers-file` name, in that order.
    fn configured_workers(&self) -> Result<Vec<WorkerSpec>, ServiceError> {
        let a = &self.args;
        let mut out: Vec<WorkerSpec> = a
            .workers
            .iter()
            .map(|w| WorkerSpec {
                key: WorkerKey::new(w.id, w.dp_rank),
                model: a.model.clone(),
                block_size: a.block_size,
                endpoint: w.endpoint.clone(),
                replay_endpoint: w.replay.clone(),
                url: w.url.clone(),
            })
            .collect();
        if let Some(path) = &a.workers_file {
            let entries = crate::config::read_workers_file(path).map_err(ServiceError::Invalid)?;
            out.extend(entries.into_iter().map(|e| WorkerSpec {
                key: WorkerKey::new(e.instance_id, e.dp_rank),
                model: e.model_name.unwrap_or_else(|| a.model.clone()),
                block_size: e.block_size.unwrap_or(a.block_size),
                endpoint: e.endpoint,
                replay_endpoint: e.replay_endpoint,
                url: e.url.map(|u| u.trim_end_matches('/').to_string()),
            }));
        }
        for s in &out {
            self.check_spec(s)?;
        }
        Ok(out)
    }

    /// Refuses a new worker without an event endpoint (unless in
    /// approximate mode) or with a url that is not `http://HOST:PORT`.
    pub fn check_spec(&self, s: &WorkerSpec) -> Result<(), ServiceError> {
        if s.endpoint.is_none() && !self.args.no_kv_events {
            return Err(ServiceError::Invalid(format!(
                "worker {} has no event endpoint (only --no-kv-events workers may leave it out)",
                s.key.worker_id
            )));
        }
        if let Some(u) = &s.url {
            crate::config::check_url(u).map_err(ServiceError::Invalid)?;
        }
        Ok(())
    }

    /// Adds a hook that `/metrics` runs before rendering.
    pub fn on_scrape(&self, hook: ScrapeHook) {
        self.scrape_hooks.lock().push(hook);
    }

    /// Runs the scrape hooks.
    pub fn run_scrape_hooks(&self) {
        for h in self.scrape_hooks.lock().iter() {
            h();
        }
    }

    /// Stops applying events (the ingest threads end); for shutdown.
    pub fn stop_ingest(&self) {
        self.ingest.stop();
    }

    /// Microseconds since the service started (the policies' clock).
    pub fn now_us(&self) -> u64 {
        self.start.elapsed().as_micros() as u64
    }

    /// Registers a worker and starts its feed (none in approximate mode).
    pub fn register(&self, spec: WorkerSpec) -> Result<(), ServiceError> {
        self.register_from(spec, 0, 0).map(|_| ())
    }

    /// Registers a worker whose history is wanted from seq `start`, its
    /// index events numbered from `first_id` (after a snapshot).
    pub fn register_from(
        &self,
        mut spec: WorkerSpec,
        start: u64,
        first_id: u64,
    ) -> Result<Arc<Worker>, ServiceError> {
        if self.args.no_kv_events {
            spec.endpoint = None;
            spec.replay_endpoint = None;
        }
        // Refused before the worker is added, by the rule the feed uses.
        for e in [&spec.endpoint, &spec.replay_endpoint]
            .into_iter()
            .flatten()
        {
            crate::ingest::check_endpoint(e)?;
        }
        if let Some(n) = &self.nats {
            return self.relay(n, spec, start);
        }
        let (model, worker) = self.models.add(spec)?;
        if start == 0 && first_id == 0 {
            // A fresh worker: whatever a loaded dump held under its key is
            // stale, and would also hold event ids the feed would repeat.
            model.index.remove_worker(worker.spec.key);
        } else if let Some(last) = start.checked_sub(1) {
            // Restored: its last seq shows until the feed applies a newer.
            worker
                .status
                .last_seq
                .store(last, std::sync::atomic::Ordering::Release);
        }
        let fed = self.ingest.add(
            Arc::clone(&model),
            Arc::clone(&worker),
            start,
            first_id,
            None,
        );
        if let Err(e) = fed {
            self.models.remove(&model.name, &[worker.spec.key]);
            return Err(e.into());
        }
        tracing::info!(model = %model.name, worker = ?worker.spec.key, endpoint = ?worker.spec.endpoint, start, "worker registered");
        Ok(worker)
    }

    /// Registers a worker on a NATS link: its registration and batches go
    /// to the stream (from the seq after the last the stream holds); the
    /// index takes them from there, as every replica's does.
    fn relay(
        &self,
        n: &Arc<crate::replica::Nats>,
        spec: WorkerSpec,
        start: u64,
    ) -> Result<Arc<Worker>, ServiceError> {
        let (key, name) = (spec.key, spec.model.clone());
        if self.ingest.feeds(&name, key) {
            return Err(RegisterError::Exists {
                model: name,
                id: key.worker_id,
                dp_rank: key.dp_rank,
            }
            .into());
        }
        let info = crate::record::WorkerInfo {
            block_size: spec.block_size as u32,
            endpoint: spec.endpoint.clone(),
            replay_endpoint: spec.replay_endpoint.clone(),
            url: spec.url.clone(),
        };
        // Known already when the stream or a snapshot named it.
        let (model, worker) = match self.models.add(spec) {
            Ok(x) => x,
            Err(RegisterError::Exists { .. }) => {
                let m = self.model(&name)?;
                let w = m.workers.read().get(&key).cloned();
                let w = w.ok_or_else(|| ServiceError::NotFound(format!("worker {key:?}")))?;
                (m, w)
            }
            Err(e) => return Err(e.into()),
        };
        let start = if start == 0 {
            n.rt.block_on(crate::replica::relay::start_seq(n, &name, key))
        } else {
            start
        };
        let sink = crate::replica::RelaySink::new(n, &name, key, info.block_size);
        sink.register(info);
        self.ingest.add(
            Arc::clone(&model),
            Arc::clone(&worker),
            start,
            0,
            Some(sink),
        )?;
        tracing::info!(model = %name, worker = ?key, start, "worker relayed");
        Ok(worker)
    }

    /// Unregisters instance `id` of `model` (one rank or all): its feed
    /// stops before its blocks leave the index. Returns how many ranks.
    pub fn unregister(
        &self,
        model: &str,
        id: u64,
        dp_rank: Option<u32>,
    ) -> Result<usize, ServiceError> {
        let m = self
            .models
            .get(model)
            .ok_or_else(|| ServiceError::UnknownModel(model.to_string()))?;
        let keys: Vec<WorkerKey> = m
            .workers
            .read()
            .keys()
            .filter(|k| k.worker_id == id && dp_rank.is_none_or(|r| r == k.dp_rank))
            .copied()
            .collect();
        if keys.is_empty() {
            return Err(ServiceError::NotFound(format!(
                "worker {id} is not registered for model {model:?}"
            )));
        }
        let waits: Vec<_> = keys.iter().map(|&k| self.ingest.remove(k, model)).collect();
        for (w, k) in waits.into_iter().zip(&keys) {
            if w.recv_timeout(Duration::from_secs(5)).is_err() {
                tracing::warn!(worker = ?k, "ingest did not confirm the feed stopped within 5 s");
            }
        }
        if let Some(n) = &self.nats {
            // Every replica (this one too) removes it when the record
            // comes back from the stream.
            for &k in &keys {
                crate::replica::RelaySink::new(n, model, k, m.block_size as u32).unregister();
            }
            tracing::info!(
                model,
                id,
                ranks = keys.len(),
                "worker unregistered (through the stream)"
            );
            return Ok(keys.len());
        }
        let gone = self.models.remove(model, &keys);
        tracing::info!(model, id, ranks = gone.len(), "worker unregistered");
        Ok(gone.len())
    }

    fn model(&self, name: &str) -> Result<Arc<Model>, ServiceError> {
        self.models
            .get(name)
            .ok_or_else(|| ServiceError::UnknownModel(name.to_string()))
    }

    /// The local block hashes of a prompt under `model`'s block size.
    pub fn hashes(&self, model: &Model, p: &Prompt) -> Result<Vec<LocalHash>, ServiceError> {
        let limit = self.args.max_request_tokens;
        match p {
            Prompt::Tokens {
                token_ids,
                lora_name,
                cache_salt,
            } => {
                if token_ids.len() > limit {
                    return Err(ServiceError::Invalid(format!(
                        "{} token ids, over the limit of {limit} (--max-request-tokens)",
                        token_ids.len()
                    )));
                }
                Ok(token_hashes(
                    model,
                    token_ids,
                    lora_name.as_deref(),
                    cache_salt.as_deref(),
                ))
            }
            Prompt::Hashes(h) => {
                if h.len() > limit {
                    return Err(ServiceError::Invalid(format!(
                        "{} block hashes, over the limit of {limit} (--max-request-tokens)",
                        h.len()
                    )));
                }
                Ok(h.iter().map(|&x| LocalHash(x)).collect())
            }
        }
    }

    /// Tokens per block of `model`.
    pub fn block_size(&self, model: &str) -> Option<u64> {
        self.model(model).ok().map(|m| m.block_size)
    }

    /// Whether some worker of `model` holds every full block of
    /// `token_ids` (true when there is none, or the model is unknown):
    /// while it does, more of the prompt's tokens may raise an overlap.
    pub fn holds_all(&self, model: &str, token_ids: &[u32], cache_salt: Option<&str>) -> bool {
        self.holds_all_growing(model, token_ids, cache_salt, &mut PromptHashes::default())
    }

    /// [`Service::holds_all`] for a prompt asked about as it grows:
    /// `known` keeps the hashes of the blocks asked about before, so each
    /// question hashes only the blocks added since (a long history asked
    /// about chunk by chunk is hashed once, not once per question).
    /// `token_ids` must extend the tokens of the earlier questions with the
    /// same `known`; a last known block that no longer matches starts over.
    pub fn holds_all_growing(
        &self,
        model: &str,
        token_ids: &[u32],
        cache_salt: Option<&str>,
        known: &mut PromptHashes,
    ) -> bool {
        let Ok(m) = self.model(model) else {
            return true;
        };
        let bs = m.block_size as usize;
        let full = token_ids.len() / bs;
        if full == 0 {
            return true;
        }
        let h = &mut known.0;
        h.truncate(full);
        if let Some(&last) = h.last() {
            let at = (h.len() - 1) * bs;
            if token_hashes(&m, &token_ids[at..at + bs], None, cache_salt)[0] != last {
                h.clear();
            }
        }
        let from = h.len() * bs;
        h.extend(token_hashes(
            &m,
            &token_ids[from..full * bs],
            None,
            cache_salt,
        ));
        let best = m.index.find_matches(h).best().map_or(0, |(_, s)| s);
        best as usize >= full
    }

    /// Each worker's overlap with a prompt, and the model's block size.
    pub fn query(&self, model: &str, p: &Prompt) -> Result<(OverlapScores, u64), ServiceError> {
        let m = self.model(model)?;
        let h = self.hashes(&m, p)?;
        let t = Instant::now();
        let s = m.index.find_matches(&h);
        metrics::histogram!("kvrouter_query_seconds").record(t.elapsed().as_secs_f64());
        Ok((s, m.block_size))
    }

    /// Chooses a worker for a prompt and counts the request in flight there
    /// until [`Service::complete`] or the request TTL.
    pub fn route(
        &self,
        model: &str,
        p: &Prompt,
        request_id: Option<String>,
        opts: RouteOptions,
    ) -> Result<Decision, ServiceError> {
        let t = Instant::now();
        let m = self.model(model)?;
        let locals = self.hashes(&m, p)?;
        let seqs = sequence_hashes(&locals);
        let all: Vec<WorkerKey> = m.workers.read().keys().copied().collect();
        if all.is_empty() {
            return Err(ServiceError::NoWorkers(model.to_string()));
        }
        // Positions in `all` of the workers in play, then of the excluded:
        // the routers see them in this order and choose among the first.
        let (mut perm, out): (Vec<usize>, Vec<usize>) =
            (0..all.len()).partition(|&i| !opts.exclude.contains(&all[i]));
        let k = perm.len();
        if k == 0 {
            return Err(ServiceError::NoWorkers(model.to_string()));
        }
        perm.extend(out);
        let workers: Vec<WorkerKey> = perm[..k].iter().map(|&i| all[i]).collect();
        let scores = m.index.find_matches(&locals);
        let overlaps: Vec<u32> = workers.iter().map(|&w| scores.get(w)).collect();
        let now = opts.now_us.unwrap_or_else(|| self.now_us());
        let id = request_id.unwrap_or_else(|| {
            let n = self
                .next_request
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            format!("kvr-{n}")
        });
        let ttl = if opts.now_us.is_some() {
            // On the caller's clock only /complete ends a request.
            u64::MAX
        } else {
            self.args.request_ttl.as_micros() as u64
        };
        let mut guard = m.routing.lock();
        let r = &mut *guard;
        Model::sync_workers(r, &all);
        if opts.now_us.is_none() {
            r.loads.expire(now);
        }
        if r.loads.contains(&id) {
            return Err(ServiceError::Conflict(format!(
                "request {id:?} is already in flight"
            )));
        }
        if r.loads.in_flight() >= self.args.max_in_flight {
            return Err(ServiceError::Busy(format!(
                "{} requests in flight for model {model:?} (--max-in-flight): complete some first",
                r.loads.in_flight()
            )));
        }
        let loads: Vec<WorkerLoad> = workers.iter().map(|w| r.loads.load(w, &seqs)).collect();
        let n_blocks = locals.len() as u64 + opts.unseen_blocks;
        let router = m.router(r, opts.policy);
        let kind = router.kind();
        let costs =
            (kind == PolicyKind::KvAware).then(|| router.kv_costs(n_blocks, &loads, &overlaps));
        let permuted = k < all.len();
        if permuted {
            // Per-worker policy state follows its worker through the
            // permutation and back: the excluded keep theirs.
            router.reorder(&perm.iter().map(|&i| Some(i)).collect::<Vec<_>>());
        }
        let i = router.choose(now, n_blocks, &loads, &overlaps);
        if permuted {
            let mut back = vec![None; all.len()];
            for (pos, &i) in perm.iter().enumerate() {
                back[i] = Some(pos);
            }
            router.reorder(&back);
        }
        let w = workers[i];
        r.loads
            .start_with_unseen(&id, w, &seqs, opts.unseen_blocks, overlaps[i], now, ttl)
            .map_err(|e| ServiceError::Conflict(e.to_string()))?;
        drop(guard);
        if self.args.no_kv_events {
            // The router's clock: approximate blocks expire on its ticks.
            m.approx.lock().record(
                &m.index,
                w,
                &locals,
                &seqs,
                self.now_us(),
                self.args.approx_ttl.as_micros() as u64,
            );
        }
        let best = overlaps.iter().copied().max().unwrap_or(0);
        let reason = reason(
            kind,
            overlaps[i],
            best,
            n_blocks,
            &loads[i],
            costs.as_ref().map(|c| c[i]),
        );
        let scores = workers
            .iter()
            .enumerate()
            .map(|(j, w)| WorkerScore {
                worker_id: w.worker_id,
                dp_rank: w.dp_rank,
                overlap_blocks: overlaps[j],
                active_requests: loads[j].active_requests,
                active_blocks: loads[j].active_blocks,
                pending_prefill_blocks: loads[j].pending_prefill_blocks,
                cost: costs.as_ref().map(|c| c[j]),
            })
            .collect();
        metrics::histogram!("kvrouter_route_seconds").record(t.elapsed().as_secs_f64());
        metrics::histogram!("kvrouter_route_overlap_ratio").record(if n_blocks == 0 {
            0.0
        } else {
            f64::from(overlaps[i]) / n_blocks as f64
        });
        metrics::counter!("kvrouter_routed_total").increment(1);
        Ok(Decision {
            worker_id: w.worker_id,
            dp_rank: w.dp_rank,
            overlap_blocks: overlaps[i],
            request_blocks: n_blocks as usize,
            policy: kind,
            reason,
            request_id: id,
            scores,
        })
    }

    /// Ends request `id` of `model` (it no longer counts on its worker).
    pub fn complete(&self, model: Option<&str>, id: &str) -> Result<WorkerKey, ServiceError> {
        self.in_flight(model, id, |loads| loads.complete(id))
    }

    /// Request `id` of `model` produced its first token: its blocks no
    /// longer count as pending prefill on its worker.
    pub fn prefill_complete(&self, model: Option<&str>, id: &str) -> Result<(), ServiceError> {
        self.in_flight(model, id, |loads| loads.prefill_done(id).then_some(()))
    }

    /// `f` on the in-flight table of `model` (or of each model in turn,
    /// until one knows request `id`).
    fn in_flight<T>(
        &self,
        model: Option<&str>,
        id: &str,
        mut f: impl FnMut(&mut kvroute::LoadTracker<WorkerKey>) -> Option<T>,
    ) -> Result<T, ServiceError> {
        let models = match model {
            Some(name) => vec![self.model(name)?],
            None => self.models.all(),
        };
        for m in models {
            if let Some(t) = f(&mut m.routing.lock().loads) {
                return Ok(t);
            }
        }
        Err(ServiceError::NotFound(format!(
            "request {id:?} is not in flight (never routed, completed, or past --request-ttl)"
        )))
    }

    /// Expires in-flight requests and approximate-mode blocks past their
    /// time to live. Run every second or so.
    pub fn tick(&self) {
        let now = self.now_us();
        for m in self.models.all() {
            m.routing.lock().loads.expire(now);
            if self.args.no_kv_events {
                m.approx.lock().expire(&m.index, now);
            }
        }
    }

    /// True when every worker has been heard from or waited for long
    /// enough; otherwise the ones still awaited.
    pub fn ready(&self) -> (bool, Vec<(String, WorkerKey)>) {
        let mut waiting = Vec::new();
        for m in self.models.all() {
            for w in m.workers.read().values() {
                if !self.worker_ready(w) {
                    waiting.push((m.name.clone(), w.spec.key));
                }
            }
        }
        let replica = self.nats.as_ref().is_none_or(|n| n.ready());
        (replica && waiting.is_empty(), waiting)
    }

    fn worker_ready(&self, w: &Worker) -> bool {
        match w.status.state() {
            FeedState::Active | FeedState::Approximate | FeedState::Replicated => true,
            FeedState::Replaying => false,
            FeedState::Pending => w.since.elapsed() >= self.args.connect_timeout,
        }
    }
}

fn reason(
    kind: PolicyKind,
    overlap: u32,
    best: u32,
    blocks: u64,
    load: &WorkerLoad,
    cost: Option<f64>,
) -> String {
    let cached = format!("{overlap} of {blocks} blocks cached");
    match kind {
        PolicyKind::Random => format!("random choice ({cached})"),
        PolicyKind::RoundRobin => format!("next in turn ({cached})"),
        PolicyKind::LeastLoaded => format!(
            "fewest requests in flight: {} ({cached})",
            load.active_requests
        ),
        PolicyKind::KvAware => format!(
            "lowest prefill+decode cost {:.1} ({cached}, {} active blocks)",
            cost.unwrap_or(0.0),
            load.active_blocks
        ),
        PolicyKind::KvBalanced if overlap > 0 && overlap == best => format!(
            "longest cached prefix among workers not overloaded ({cached}, {} in flight)",
            load.active_requests
        ),
        PolicyKind::KvBalanced => format!(
            "no useful cached prefix among workers not overloaded: least cache pressure ({cached}, {} in flight)",
            load.active_requests
        ),
    }
}

/// The hashes of a growing prompt's full blocks, kept between questions
/// about it ([`Service::holds_all_growing`]).
#[derive(Debug, Default)]
pub struct PromptHashes(Vec<LocalHash>);

/// The salted local hashes of `token_ids`' full blocks for `model`.
fn token_hashes(
    model: &Model,
    token_ids: &[u32],
    lora_name: Option<&str>,
    cache_salt: Option<&str>,
) -> Vec<LocalHash> {
    let salt = BlockSalt {
        lora_name,
        cache_salt,
    };
    local_block_hashes_salted(token_ids, model.block_size as usize, salt)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::WorkerSpec;

    fn approx(n: u64, policy: PolicyKind) -> Arc<Service> {
        let mut a = RouterArgs::defaults();
        a.no_kv_events = true;
        a.block_size = 4;
        a.policy = policy;
        let s = Service::new(a).unwrap();
        for id in 1..=n {
            s.register(WorkerSpec {
                key: WorkerKey::new(id, 0),
                model: "m".into(),
                block_size: 4,
                endpoint: None,
                replay_endpoint: None,
                url: None,
            })
            .unwrap();
        }
        s
    }

    fn tokens(i: u32) -> Prompt {
        Prompt::Tokens {
            token_ids: (0..16).map(|t| i * 100 + t).collect(),
            lora_name: None,
            cache_salt: None,
        }
    }

    fn excluding(keys: &[u64]) -> RouteOptions {
        RouteOptions {
            exclude: keys.iter().map(|&k| WorkerKey::new(k, 0)).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn excluded_workers_are_not_chosen_and_keep_their_policy_state() {
        let s = approx(3, PolicyKind::KvBalanced);
        // Cold prompts spread by cache pressure: each worker gets one.
        let mut first = Vec::new();
        for i in 0..3 {
            let d = s.route("m", &tokens(i), None, RouteOptions::default());
            first.push(d.unwrap().worker_id);
        }
        first.sort_unstable();
        assert_eq!(first, [1, 2, 3]);
        let pressure = |s: &Service| {
            let m = s.models.get("m").unwrap();
            let r = m.routing.lock();
            let now = s.now_us();
            (0..3)
                .map(|i| r.routers[&PolicyKind::KvBalanced].pressure(i, now))
                .collect::<Vec<f64>>()
        };
        let before = pressure(&s);
        // Worker 2 excluded: never chosen; its pressure stays its own.
        for i in 10..16 {
            let d = s.route("m", &tokens(i), None, excluding(&[2])).unwrap();
            assert_ne!(d.worker_id, 2);
            assert_eq!(d.scores.len(), 2);
        }
        let after = pressure(&s);
        assert!((after[1] - before[1]).abs() < 0.01, "{before:?} {after:?}");
        assert!(after[0] > before[0] && after[2] > before[2], "{after:?}");
        assert!(matches!(
            s.route("m", &tokens(1), None, excluding(&[1, 2, 3])),
            Err(ServiceError::NoWorkers(_))
        ));
    }

    #[test]
    fn unseen_blocks_are_new_prefill_on_the_chosen_worker() {
        let s = approx(2, PolicyKind::KvBalanced);
        let opts = RouteOptions {
            unseen_blocks: 5,
            ..Default::default()
        };
        let d = s.route("m", &tokens(0), Some("a".into()), opts).unwrap();
        assert_eq!(d.request_blocks, 4 + 5);
        let w = WorkerKey::new(d.worker_id, d.dp_rank);
        let m = s.models.get("m").unwrap();
        let load = m.routing.lock().loads.load(&w, &[]);
        assert_eq!((load.pending_prefill_blocks, load.active_blocks), (9, 9));
        s.complete(Some("m"), "a").unwrap();
        let load = m.routing.lock().loads.load(&w, &[]);
        assert_eq!((load.pending_prefill_blocks, load.active_blocks), (0, 0));
    }

    #[test]
    fn holds_all_asks_whether_any_worker_has_every_full_block() {
        let s = approx(2, PolicyKind::KvBalanced);
        let ids = |p: Prompt| match p {
            Prompt::Tokens { token_ids, .. } => token_ids,
            Prompt::Hashes(_) => unreachable!(),
        };
        let t = ids(tokens(0));
        // Nothing cached: a partial block decides nothing, a full one
        // is held by no one.
        assert!(s.holds_all("m", &t[..3], None));
        assert!(!s.holds_all("m", &t[..4], None));
        s.route("m", &tokens(0), None, RouteOptions::default())
            .unwrap();
        assert!(s.holds_all("m", &t, None));
        assert!(s.holds_all("m", &t[..9], None));
        let mut longer = t.clone();
        longer.extend([7, 7, 7, 7]);
        assert!(!s.holds_all("m", &longer, None));
        assert!(!s.holds_all("m", &t, Some("salted")));
        assert!(s.holds_all("nope", &t, None));
    }

    #[test]
    fn growing_questions_hash_each_block_once_and_answer_as_fresh_ones() {
        let s = approx(2, PolicyKind::KvBalanced);
        // 16 tokens (4 blocks of 4) routed, so held; then 12 more no one
        // holds.
        s.route("m", &tokens(0), None, RouteOptions::default())
            .unwrap();
        let mut t: Vec<u32> = (0..16).collect();
        t.extend(500..512);
        let mut known = PromptHashes::default();
        for n in 0..=t.len() {
            let fresh = s.holds_all("m", &t[..n], None);
            assert_eq!(
                s.holds_all_growing("m", &t[..n], None, &mut known),
                fresh,
                "{n} tokens"
            );
            assert_eq!(fresh, n < 20, "{n} tokens");
            if n >= 4 {
                assert_eq!(known.0.len(), n / 4, "{n} tokens");
            }
        }
        // Another prompt whose last block differs: hashed afresh.
        let other: Vec<u32> = (0..16).map(|x| x + 1000).collect();
        assert!(!s.holds_all_growing("m", &other, None, &mut known));
        assert!(s.holds_all_growing("m", &t[..16], None, &mut PromptHashes::default()));
        assert!(s.holds_all_growing("m", &t[..16], None, &mut known));
    }

    #[test]
    fn round_robin_skips_the_excluded() {
        let s = approx(3, PolicyKind::RoundRobin);
        let got: Vec<u64> = (0..4)
            .map(|i| {
                s.route("m", &tokens(i), None, excluding(&[2]))
                    .unwrap()
                    .worker_id
            })
            .collect();
        assert_eq!(got, [1, 3, 1, 3]);
    }
}
