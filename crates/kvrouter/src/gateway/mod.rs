//! The OpenAI-compatible gateway (`--gateway`): clients send
//! `/v1/completions` and `/v1/chat/completions` to the router, which
//! tokenizes the prompt as the engine will, routes on those tokens
//! (`Service::route`, the same scoring as `/route`) and proxies the body
//! unchanged to the chosen engine, streaming its answer back.
//!
//! * [`proxy`]: handlers, forwarding, streaming, failover and accounting.
//! * [`upstream`]: per-engine health and circuit breaker.
//! * [`limit`]: the concurrency limit and its bounded queue.
//! * [`error`]: OpenAI error shapes.
//!
//! See `docs/design.md`, "Gateway".
pub mod error;
mod fill;
pub mod limit;
pub mod proxy;
pub mod upstream;

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use kvindex::WorkerKey;

use crate::service::Service;
use crate::tokenize::ModelTokenizer;

/// Why the gateway could not start.
#[derive(Debug, thiserror::Error)]
pub enum GatewayInitError {
    /// A `--tokenizer` directory that does not load.
    #[error("--tokenizer {model}={dir}: {reason}")]
    Tokenizer {
        /// The model.
        model: String,
        /// The directory.
        dir: String,
        /// Why.
        reason: String,
    },
    /// The HTTP client.
    #[error("the gateway's HTTP client: {0}")]
    Client(String),
}

/// The gateway's state, shared by its handlers.
pub struct Gateway {
    /// The router.
    pub svc: Arc<Service>,
    /// One client for every engine (connection pool per engine).
    client: reqwest::Client,
    tokenizers: HashMap<String, Arc<ModelTokenizer>>,
    /// Engines' health and breakers.
    pub upstreams: upstream::Upstreams,
    /// Concurrency limit.
    pub limit: limit::Limit,
    draining: AtomicBool,
    /// Requests in the gateway, from arrival (queued included) to the
    /// end of their response.
    active: AtomicUsize,
    /// Set when the drain timeout passes: responses still streaming are cut.
    abort: tokio::sync::watch::Sender<bool>,
    next_id: AtomicU64,
    /// When the gateway started (ns since the Unix epoch): request ids
    /// (`gw-EPOCH-N`) do not collide with a `/route` client's.
    epoch: u128,
    /// Prefix-cache fills, off the requests' path.
    pub(crate) fills: fill::Fills,
}

impl Gateway {
    /// Loads every `--tokenizer` (on the blocking pool) and builds the
    /// client; a directory that does not load is an error.
    pub async fn new(svc: Arc<Service>) -> Result<Arc<Self>, GatewayInitError> {
        let specs = svc.args.tokenizers.clone();
        let cache = svc.args.tokenizer_cache_tokens;
        let tokenizers = tokio::task::spawn_blocking(move || {
            let mut out = HashMap::new();
            for t in specs {
                let tok = ModelTokenizer::load(&t.dir)
                    .map_err(|e| GatewayInitError::Tokenizer {
                        model: t.model.clone(),
                        dir: t.dir.display().to_string(),
                        reason: e.to_string(),
                    })?
                    .with_prefix_cache(cache);
                if cache > 0 && tok.prefix_cache_stats().is_none() {
                    tracing::info!(model = %t.model, "no tokenizer cache: its tokenizer.json does not show where text can be cut");
                }
                out.insert(t.model, Arc::new(tok));
            }
            Ok::<_, GatewayInitError>(out)
        })
        .await
        .map_err(|e| GatewayInitError::Client(e.to_string()))??;
        let a = &svc.args;
        let client = reqwest::Client::builder()
            .connect_timeout(a.upstream_connect_timeout)
            .tcp_nodelay(true)
            .no_proxy()
            .build()
            .map_err(|e| GatewayInitError::Client(e.to_string()))?;
        let g = Arc::new(Self {
            client,
            tokenizers,
            upstreams: upstream::Upstreams::new(a.breaker_failures, a.breaker_cooldown),
            limit: limit::Limit::new(
                a.max_concurrent_requests,
                a.max_queued_requests,
                a.queue_timeout,
            ),
            draining: AtomicBool::new(false),
            active: AtomicUsize::new(0),
            abort: tokio::sync::watch::channel(false).0,
            next_id: AtomicU64::new(0),
            epoch: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
            svc: Arc::clone(&svc),
            fills: fill::Fills::new(
                std::thread::available_parallelism().map_or(1, |n| n.get()),
                a.tokenizer_fill_queue,
            ),
        });
        if g.tokenizers.is_empty() {
            tracing::warn!("--gateway without --tokenizer: every request will be refused (404)");
        }
        tracing::info!(
            models = ?g.tokenizers.keys().collect::<Vec<_>>(),
            max_concurrent = a.max_concurrent_requests,
            max_retries = a.max_retries,
            "gateway ready"
        );
        let weak = Arc::downgrade(&g);
        svc.on_scrape(Box::new(move || {
            if let Some(g) = weak.upgrade() {
                g.refresh_metrics();
            }
        }));
        Ok(g)
    }

    /// The tokenizer of `model`.
    pub fn tokenizer(&self, model: &str) -> Option<Arc<ModelTokenizer>> {
        self.tokenizers.get(model).cloned()
    }

    /// A fresh request id.
    fn request_id(&self) -> String {
        format!("gw-{:x}-{}", self.epoch, self.next_id.fetch_add(1, Relaxed))
    }

    /// Whether `model` has a worker with a url (a gateway target).
    pub fn serves(&self, model: &str) -> bool {
        self.svc
            .models
            .get(model)
            .is_some_and(|m| m.workers.read().values().any(|w| w.spec.url.is_some()))
    }

    /// Models with at least one worker with a url, by name.
    pub fn models(&self) -> Vec<String> {
        self.svc
            .models
            .all()
            .into_iter()
            .filter(|m| m.workers.read().values().any(|w| w.spec.url.is_some()))
            .map(|m| m.name.clone())
            .collect()
    }

    /// Workers of `model` routing must skip: no url, a failed health
    /// check, an open breaker.
    fn unroutable(&self, model: &str) -> Vec<WorkerKey> {
        let Some(m) = self.svc.models.get(model) else {
            return Vec::new();
        };
        let workers = m.workers.read();
        workers
            .iter()
            .filter(|(_, w)| {
                w.spec
                    .url
                    .as_deref()
                    .is_none_or(|u| !self.upstreams.get(u).available())
            })
            .map(|(k, _)| *k)
            .collect()
    }

    /// The url of worker `key` of `model`.
    fn url_of(&self, model: &str, key: WorkerKey) -> Option<String> {
        let m = self.svc.models.get(model)?;
        let w = m.workers.read();
        w.get(&key).and_then(|w| w.spec.url.clone())
    }

    /// The longest prompt forwarded for `model`.
    fn context_limit(&self, tok: &ModelTokenizer) -> usize {
        let a = &self.svc.args;
        a.max_context_tokens
            .or(tok.max_context())
            .unwrap_or(a.max_request_tokens)
            .min(a.max_request_tokens)
    }

    /// True once draining has begun.
    pub fn draining(&self) -> bool {
        self.draining.load(Relaxed)
    }

    /// Requests in the gateway (queued, waiting, streaming).
    pub fn active(&self) -> usize {
        self.active.load(Relaxed)
    }

    /// Starts draining: new requests get 503; waits until the requests in
    /// flight are done or `--drain-timeout` passes, then cuts the rest.
    pub async fn drain(&self) {
        self.draining.store(true, Relaxed);
        let timeout = self.svc.args.drain_timeout;
        let t = tokio::time::Instant::now();
        tracing::info!(active = self.active(), "draining gateway requests");
        while self.active() > 0 && t.elapsed() < timeout {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if self.active() > 0 {
            tracing::warn!(
                active = self.active(),
                "drain timeout: cutting the requests still in flight"
            );
            let _ = self.abort.send(true);
        }
    }

    /// A future that resolves when requests in flight must be cut.
    fn aborted(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut rx = self.abort.subscribe();
        async move {
            if rx.wait_for(|&v| v).await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// Checks every engine's `/health` every `--health-interval`, until
    /// the task is aborted; engines of workers that left are forgotten.
    pub fn spawn_health(self: &Arc<Self>) -> Option<tokio::task::JoinHandle<()>> {
        let every = self.svc.args.health_interval;
        if every.is_zero() {
            return None;
        }
        let g = Arc::clone(self);
        Some(tokio::spawn(async move {
            let mut t = tokio::time::interval(every);
            t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                t.tick().await;
                g.check_health().await;
            }
        }))
    }

    /// One round of health checks, all engines at once.
    pub async fn check_health(&self) {
        let urls: Vec<String> = self
            .svc
            .models
            .all()
            .iter()
            .flat_map(|m| {
                m.workers
                    .read()
                    .values()
                    .filter_map(|w| w.spec.url.clone())
                    .collect::<Vec<_>>()
            })
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let timeout = self.svc.args.health_timeout;
        let mut set = tokio::task::JoinSet::new();
        for u in self.upstreams.retain(&urls) {
            let c = self.client.clone();
            set.spawn(async move {
                let ok = c
                    .get(format!("{}/health", u.url))
                    .timeout(timeout)
                    .send()
                    .await
                    .is_ok_and(|r| r.status().is_success());
                if u.set_healthy(ok) {
                    if ok {
                        tracing::info!(url = %u.url, "engine healthy again");
                    } else {
                        tracing::warn!(url = %u.url, "engine failed its health check");
                    }
                    u.gauge();
                }
            });
        }
        while set.join_next().await.is_some() {}
    }

    /// Sets the gateway's gauges (at scrape time).
    pub fn refresh_metrics(&self) {
        metrics::gauge!("kvrouter_gateway_in_flight").set(self.limit.running() as f64);
        metrics::gauge!("kvrouter_gateway_queued").set(self.limit.queued() as f64);
        for u in self.upstreams.all() {
            u.gauge();
        }
        for (model, t) in &self.tokenizers {
            if let Some(s) = t.prefix_cache_stats() {
                metrics::counter!("kvrouter_gateway_tokenizer_cache_hit_tokens_total", "model" => model.clone())
                    .absolute(s.hit_tokens);
                metrics::counter!("kvrouter_gateway_tokenizer_cache_miss_tokens_total", "model" => model.clone())
                    .absolute(s.encoded_tokens);
            }
        }
    }
}

/// The gateway's routes: `POST /v1/completions`, `POST
/// /v1/chat/completions`, `GET /v1/models` (`/health` is the router's).
pub fn routes(g: Arc<Gateway>) -> axum::Router {
    let limit = g.svc.args.max_body_bytes;
    axum::Router::new()
        .route("/v1/completions", post(proxy::completions))
        .route("/v1/chat/completions", post(proxy::chat_completions))
        .route("/v1/models", get(proxy::models))
        .layer(DefaultBodyLimit::max(limit))
        .with_state(g)
}
