//! A simulated inference engine behind OpenAI's HTTP API: a stand-in for
//! vLLM that router and gateway tests (and `arbor kv engine`) can start on
//! loopback, whole fleets of it.
//!
//! Each server runs one [`Engine`](crate::engine::Engine) (prefix cache
//! with LRU eviction, FIFO prefill at `prefill_tps`, decode at `decode_tps`
//! per sequence, at most `max_running` admitted) on the wall clock, sped
//! up by [`SimEngineConfig::speedup`]. Prompts are tokenized as the gateway
//! tokenizes them (`kvrouter::tokenize::ModelTokenizer`); their full blocks
//! are the cache's blocks, keyed by the engine's own chained hashes salted
//! with its id. The engine's events go out as vLLM's `KVEventBatch`es over
//! ZeroMQ with the stored blocks' tokens, and vLLM's replay protocol serves
//! recent batches again.
//!
//! ```no_run
//! # async fn f(tok: std::sync::Arc<kvrouter::tokenize::ModelTokenizer>) -> Result<(), kvreplay::server::ServerError> {
//! use kvreplay::server::{SimEngine, SimEngineConfig};
//! let cfg = SimEngineConfig::new("my-model", tok);
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! let engine = SimEngine::start(cfg, listener).await?;
//! println!("http://{} publishing on {}", engine.http_addr(), engine.events_endpoint());
//! engine.shutdown().await;
//! # Ok(()) }
//! ```

mod core;
mod http;
mod openai;
mod publish;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use kvrouter::tokenize::ModelTokenizer;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::engine::EngineConfig;

/// Why an engine did not start.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// Settings out of range.
    #[error("{0}")]
    Config(String),
    /// A ZeroMQ socket could not be set up or bound.
    #[error("cannot bind {endpoint}: {source}")]
    Zmq {
        /// The endpoint.
        endpoint: String,
        /// The underlying error.
        source: zmq::Error,
    },
    /// Sockets or threads.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// Everything a simulated engine is set up with.
#[derive(Clone)]
pub struct SimEngineConfig {
    /// The model it serves (requests naming another get 404).
    pub model: String,
    /// How prompts become tokens.
    pub tokenizer: Arc<ModelTokenizer>,
    /// The engine's id: salts its block hashes, names its responses.
    pub engine_id: u64,
    /// Block pool and time model (`block_size`, `capacity_blocks`,
    /// `prefill_tps`, `decode_tps`, `max_running`).
    pub engine: EngineConfig,
    /// Simulated durations are divided by this.
    pub speedup: f64,
    /// Where the PUB socket binds (`tcp://127.0.0.1:*` picks a free port).
    pub events: String,
    /// Where the replay ROUTER socket binds, if anywhere.
    pub replay: Option<String>,
    /// Batches kept for replay.
    pub replay_buffer: usize,
    /// The topic frame of every batch (vLLM's default is empty).
    pub topic: String,
    /// Most tokens one request generates (larger asks are capped).
    pub max_tokens: u32,
    /// Longest prompt in tokens; `None`: the tokenizer's context, else
    /// 8192.
    pub max_model_len: Option<usize>,
    /// Largest request body, bytes (413 past it).
    pub max_body_bytes: usize,
    /// Every Nth generation request answers 503.
    pub fail_every: Option<u64>,
}

impl std::fmt::Debug for SimEngineConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimEngineConfig")
            .field("model", &self.model)
            .field("engine_id", &self.engine_id)
            .field("engine", &self.engine)
            .field("speedup", &self.speedup)
            .field("events", &self.events)
            .field("replay", &self.replay)
            .field("replay_buffer", &self.replay_buffer)
            .field("max_tokens", &self.max_tokens)
            .field("max_model_len", &self.max_model_len)
            .finish_non_exhaustive()
    }
}

/// The longest prompt when neither the settings nor the tokenizer say.
pub const DEFAULT_MAX_MODEL_LEN: usize = 8192;

/// The engine of [`SimEngineConfig::new`]: 16-token blocks, 16,384 of
/// them, prefill at 20,000 tokens/s, decode at 50 tokens/s per sequence,
/// 64 requests running.
pub const DEFAULT_ENGINE: EngineConfig = EngineConfig {
    capacity_blocks: 16_384,
    block_size: 16,
    prefill_tps: 20_000.0,
    decode_tps: 50.0,
    max_running: 64,
};

/// Batches kept for replay by default.
pub const DEFAULT_REPLAY_BUFFER: usize = 10_000;

/// Most tokens one request generates by default.
pub const DEFAULT_MAX_TOKENS_CAP: u32 = 4096;

/// The largest `max_tokens` cap [`SimEngineConfig::validate`] accepts.
pub const MAX_TOKENS_LIMIT: u32 = 1_000_000;

/// The largest `max_model_len` [`SimEngineConfig::validate`] accepts.
pub const MAX_MODEL_LEN_LIMIT: usize = 1 << 24;

/// Largest request body by default, bytes.
pub const DEFAULT_MAX_BODY_BYTES: usize = 8 << 20;

impl SimEngineConfig {
    /// Defaults: engine 0 as [`DEFAULT_ENGINE`]; real time; events on a
    /// free loopback port, no replay socket (10,000 batches kept if one is
    /// set); at most 4096 generated tokens; 8 MiB bodies; no injected
    /// failures.
    pub fn new(model: impl Into<String>, tokenizer: Arc<ModelTokenizer>) -> Self {
        Self {
            model: model.into(),
            tokenizer,
            engine_id: 0,
            engine: DEFAULT_ENGINE,
            speedup: 1.0,
            events: "tcp://127.0.0.1:*".into(),
            replay: None,
            replay_buffer: DEFAULT_REPLAY_BUFFER,
            topic: String::new(),
            max_tokens: DEFAULT_MAX_TOKENS_CAP,
            max_model_len: None,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            fail_every: None,
        }
    }

    /// Checks the ranges. The bounds keep the time model's microseconds
    /// far from overflowing and a request's generated text in memory.
    pub fn validate(&self) -> Result<(), ServerError> {
        let e = &self.engine;
        let bad = |m: &str| Err(ServerError::Config(m.into()));
        let within = |x: f64, lo: f64, hi: f64| x.is_finite() && (lo..=hi).contains(&x);
        if e.block_size == 0 || e.capacity_blocks == 0 || e.max_running == 0 {
            return bad("block size, capacity and max running must be at least 1");
        }
        if !within(e.prefill_tps, 0.01, 1e12) || !within(e.decode_tps, 0.01, 1e12) {
            return bad("prefill and decode speeds must be between 0.01 and 1e12 tokens/s");
        }
        if !within(self.speedup, 1e-3, 1e6) {
            return bad("the speedup must be between 0.001 and 1e6");
        }
        if !(1..=MAX_TOKENS_LIMIT).contains(&self.max_tokens) {
            return bad("max tokens must be between 1 and 1,000,000");
        }
        if self
            .max_model_len
            .is_some_and(|n| !(1..=MAX_MODEL_LEN_LIMIT).contains(&n))
        {
            return bad("max model length must be between 1 and 2^24 tokens");
        }
        if self.fail_every == Some(0) {
            return bad("fail-every must be at least 1");
        }
        Ok(())
    }
}

/// A failure the engine can be told to inject, for failover tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fault {
    /// Serve normally.
    #[default]
    None,
    /// Answer every generation request 503.
    Unavailable,
    /// Answer every generation request 429 (with `retry-after`).
    RateLimited,
    /// Never answer a generation request (until the client gives up or
    /// the engine stops).
    Hang,
}

/// The injected faults: the one set at runtime and `fail_every`, with the
/// count of generation requests it goes by.
pub(crate) struct Faults {
    mode: AtomicU8,
    fail_every: Option<u64>,
    received: AtomicU64,
}

impl Faults {
    fn get(&self) -> Fault {
        match self.mode.load(Relaxed) {
            1 => Fault::Unavailable,
            2 => Fault::RateLimited,
            3 => Fault::Hang,
            _ => Fault::None,
        }
    }

    fn set(&self, f: Fault) {
        let v = match f {
            Fault::None => 0,
            Fault::Unavailable => 1,
            Fault::RateLimited => 2,
            Fault::Hang => 3,
        };
        self.mode.store(v, Relaxed);
    }
}

/// A snapshot of an engine's counters ([`SimEngineHandle::stats`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineStats {
    /// Generation requests received (injected failures included).
    pub received: u64,
    /// Requests served to the end.
    pub finished: u64,
    /// Requests whose client left first (or cut short by shutdown).
    pub cancelled: u64,
    /// Requests admitted and not finished.
    pub running: usize,
    /// Requests queued for admission.
    pub waiting: usize,
    /// Blocks in the prefix cache.
    pub blocks_cached: usize,
    /// Of those, blocks admitted requests use.
    pub blocks_in_use: usize,
    /// Prompt tokens of admitted requests.
    pub prompt_tokens: u64,
    /// Of those, tokens found in the cache.
    pub cached_tokens: u64,
    /// Event batches published.
    pub batches: u64,
}

/// Starts simulated engines.
#[derive(Debug)]
pub struct SimEngine(());

impl SimEngine {
    /// Binds the event sockets and serves HTTP on `listener` until
    /// [`SimEngineHandle::shutdown`]. Call inside a tokio runtime.
    pub async fn start(
        config: SimEngineConfig,
        listener: tokio::net::TcpListener,
    ) -> Result<SimEngineHandle, ServerError> {
        config.validate()?;
        let http_addr = listener.local_addr()?;
        let publisher = publish::Publisher::start(
            &config.events,
            config.replay.as_deref(),
            config.topic.clone(),
            config.replay_buffer,
        )?;
        let clock = core::Clock::new(config.speedup);
        let core = Arc::new(Mutex::new(core::Core::new(
            config.engine_id,
            config.engine,
            clock,
            publisher.sender(),
        )));
        let (stop_tx, stop_rx) = watch::channel(false);
        let faults = Arc::new(Faults {
            mode: AtomicU8::new(0),
            fail_every: config.fail_every,
            received: AtomicU64::new(0),
        });
        let max_model_len = config
            .max_model_len
            .or_else(|| config.tokenizer.max_context())
            .unwrap_or(DEFAULT_MAX_MODEL_LEN)
            .min(MAX_MODEL_LEN_LIMIT);
        let state = Arc::new(http::AppState {
            core: Arc::clone(&core),
            tokenizer: config.tokenizer,
            limits: openai::Limits {
                model: config.model,
                max_model_len,
                max_tokens: config.max_tokens,
            },
            max_body_bytes: config.max_body_bytes,
            decode_tps: config.engine.decode_tps,
            clock,
            block_size: config.engine.block_size,
            engine_id: config.engine_id,
            faults: Arc::clone(&faults),
            rendered: AtomicU64::new(0),
            stop: stop_rx.clone(),
        });
        let app = http::router(state);
        let mut stop = stop_rx;
        let server = tokio::spawn(async move {
            // Streamed chunks leave as they come: without TCP_NODELAY a small chunk
            // waits for the client's delayed ACK (40 ms on Linux) behind the last.
            let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
                let _ = tcp.set_nodelay(true);
            });
            axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = stop.wait_for(|s| *s).await;
                })
                .await
        });
        Ok(SimEngineHandle {
            http_addr,
            events_endpoint: publisher.events_endpoint.clone(),
            replay_endpoint: publisher.replay_endpoint.clone(),
            faults,
            core,
            stop: stop_tx,
            server: Some(server),
            publisher: Some(publisher),
        })
    }
}

/// A running simulated engine. Dropping it stops the engine without
/// waiting; [`SimEngineHandle::shutdown`] waits.
pub struct SimEngineHandle {
    http_addr: SocketAddr,
    events_endpoint: String,
    replay_endpoint: Option<String>,
    faults: Arc<Faults>,
    core: core::SharedCore,
    stop: watch::Sender<bool>,
    server: Option<JoinHandle<std::io::Result<()>>>,
    publisher: Option<publish::Publisher>,
}

impl std::fmt::Debug for SimEngineHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimEngineHandle")
            .field("http_addr", &self.http_addr)
            .field("events_endpoint", &self.events_endpoint)
            .field("replay_endpoint", &self.replay_endpoint)
            .finish_non_exhaustive()
    }
}

impl SimEngineHandle {
    /// The HTTP address.
    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    /// `http://ADDR`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.http_addr)
    }

    /// The PUB endpoint, as bound.
    pub fn events_endpoint(&self) -> &str {
        &self.events_endpoint
    }

    /// The replay ROUTER endpoint, as bound.
    pub fn replay_endpoint(&self) -> Option<&str> {
        self.replay_endpoint.as_deref()
    }

    /// Injects `fault` into every generation request from now on
    /// ([`Fault::None`] heals).
    pub fn set_fault(&self, fault: Fault) {
        self.faults.set(fault);
    }

    /// What the engine has done so far.
    pub fn stats(&self) -> EngineStats {
        let core = core::lock(&self.core);
        let (running, waiting) = core.load();
        let (blocks_in_use, _) = core.blocks();
        let c = core.counters();
        EngineStats {
            received: self.faults.received.load(Relaxed),
            finished: c.finished,
            cancelled: c.cancelled,
            running,
            waiting,
            blocks_cached: core.cached_blocks(),
            blocks_in_use,
            prompt_tokens: c.prompt_tokens,
            cached_tokens: c.cached_tokens,
            batches: c.batches,
        }
    }

    /// Drops the whole prefix cache, publishing `AllBlocksCleared`
    /// (`POST /reset_prefix_cache` does the same). Refused (false) while
    /// requests run.
    pub fn reset_prefix_cache(&self) -> bool {
        core::lock(&self.core).reset()
    }

    /// Stops serving: requests in flight end at once (streams cut short,
    /// waiting ones answered 503), then the event sockets close.
    pub async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        if let Some(s) = self.server.take() {
            let _ = s.await;
        }
        if let Some(mut p) = self.publisher.take() {
            let _ = tokio::task::spawn_blocking(move || p.stop()).await;
        }
    }
}

impl Drop for SimEngineHandle {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        // The publisher's own drop stops its thread.
    }
}
