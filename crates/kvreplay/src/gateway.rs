//! Gateway replay: a workload sent as real OpenAI requests to a gateway in
//! front of a fleet, at the workload's arrival times, and what came back.
//!
//! Each request is a streamed `POST /v1/completions` whose prompt is text
//! derived from its blocks: `block_size` lowercase letters per block from
//! the block's prefix-chained id, so equal prefixes are equal text and,
//! with a byte-level tokenizer (the simulated engines' `builtin`), one
//! block of the workload is one block of tokens. The hit rate is what the
//! engines report (`usage.prompt_tokens_details.cached_tokens` over
//! `prompt_tokens`); TTFT and end-to-end latency are measured at the
//! client; the engine that served a request is read from its response id
//! (`PREFIX-ENGINE-N`, as `arbor kv engine` names them), so the load per
//! engine is known for simulated fleets only.
//!
//! [`LocalFleet`] starts a whole fleet on loopback for one run: simulated
//! engines and the router's gateway in front of them, routing on the
//! engines' KV events (`arbor kv replay --gateway` without a URL).
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;
use serde_json::{json, Value};

use crate::engine::EngineConfig;
use crate::policy::PolicyKind;
use crate::replay::ReplayError;
use crate::server::{SimEngine, SimEngineConfig, SimEngineHandle};
use crate::trace::{Request, Workload};

/// How a workload is sent to a gateway.
#[derive(Debug, Clone)]
pub struct GatewayOptions {
    /// The gateway's base URL (`http://127.0.0.1:8000`).
    pub url: String,
    /// The model every request names.
    pub model: String,
    /// Arrivals come this many times faster than the workload's times.
    pub speedup: f64,
    /// Cap on each request's generated tokens (`max_tokens`).
    pub max_output_tokens: u32,
    /// Most requests in flight at once; later arrivals wait (and count as
    /// late).
    pub max_in_flight: usize,
    /// Whole-request timeout.
    pub timeout: Duration,
    /// Engines in the fleet, when known: the load balance's mean counts
    /// the engines that served nothing too.
    pub engines: Option<usize>,
}

impl GatewayOptions {
    /// The defaults for a gateway at `url` serving `model`.
    pub fn new(url: impl Into<String>, model: impl Into<String>) -> Self {
        GatewayOptions {
            url: url.into(),
            model: model.into(),
            speedup: 1.0,
            max_output_tokens: 64,
            max_in_flight: 1024,
            timeout: Duration::from_secs(300),
            engines: None,
        }
    }

    /// Checks the settings ([`replay`] calls it first).
    pub fn validate(&self) -> Result<(), ReplayError> {
        let bad = |m: &str| Err(ReplayError::Config(m.into()));
        if !(1e-3..=1e6).contains(&self.speedup) {
            return bad("speedup must be a positive number from 0.001 to 1000000");
        }
        if self.max_output_tokens == 0 || self.max_in_flight == 0 {
            return bad("max output tokens and requests in flight must be at least 1");
        }
        if reqwest::Url::parse(&self.url).is_err() {
            return bad("the gateway URL does not parse");
        }
        Ok(())
    }
}

/// Latency percentiles in milliseconds.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct Millis {
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
}

impl Millis {
    fn of(h: &Histogram<u64>) -> Self {
        let ms = |q| h.value_at_quantile(q) as f64 / 1000.0;
        if h.is_empty() {
            return Millis::default();
        }
        Millis {
            p50: ms(0.5),
            p99: ms(0.99),
        }
    }
}

/// What a gateway replay measured.
#[derive(Debug, Clone, Serialize)]
pub struct GatewayReport {
    /// The gateway's base URL.
    pub url: String,
    /// Requests sent.
    pub requests: u64,
    /// Requests answered in full.
    pub ok: u64,
    /// Failures by kind (`status 429`, `connect`, `timeout`, `body`).
    pub failed: BTreeMap<String, u64>,
    /// Requests sent later than their arrival time because
    /// `max_in_flight` were already in flight.
    pub late: u64,
    /// Prompt tokens of the answered requests, as the engines counted them.
    pub prompt_tokens: u64,
    /// Of those, tokens the engines found in their prefix caches.
    pub cached_tokens: u64,
    /// Time to the first streamed chunk, at the client.
    pub ttft_ms: Millis,
    /// Time to the end of the stream, at the client.
    pub e2e_ms: Millis,
    /// Answered requests per engine id (engines that name themselves).
    pub per_engine: BTreeMap<u64, u64>,
    /// Engines in the fleet, when known ([`GatewayOptions::engines`]).
    pub engines: Option<usize>,
    /// Wall time of the whole replay, seconds.
    pub wall_s: f64,
}

impl GatewayReport {
    /// Cached over prompt tokens.
    pub fn hit_rate(&self) -> f64 {
        self.cached_tokens as f64 / self.prompt_tokens.max(1) as f64
    }

    /// The busiest engine's requests over the mean, if engines named
    /// themselves.
    pub fn busiest_over_mean(&self) -> Option<f64> {
        let n = self.engines.unwrap_or(0).max(self.per_engine.len());
        let max = *self.per_engine.values().max()?;
        let mean = self.per_engine.values().sum::<u64>() as f64 / n as f64;
        Some(max as f64 / mean)
    }

    /// A plain-text table.
    pub fn render(&self) -> String {
        let failed: u64 = self.failed.values().sum();
        let mut s = format!(
            "Gateway replay through {}: {} requests in {:.1} s\n\n",
            self.url, self.requests, self.wall_s
        );
        s += "| ok | failed | late | hit rate | TTFT p50 ms | TTFT p99 ms | e2e p50 ms | e2e p99 ms | busiest/mean |\n";
        s += "|---|---|---|---|---|---|---|---|---|\n";
        s += &format!(
            "| {} | {failed} | {} | {:.1}% | {:.1} | {:.1} | {:.1} | {:.1} | {} |\n",
            self.ok,
            self.late,
            100.0 * self.hit_rate(),
            self.ttft_ms.p50,
            self.ttft_ms.p99,
            self.e2e_ms.p50,
            self.e2e_ms.p99,
            self.busiest_over_mean()
                .map_or("-".to_string(), |b| format!("{b:.2}")),
        );
        for (kind, n) in &self.failed {
            s += &format!("failed ({kind}): {n}\n");
        }
        s
    }
}

/// The prompt standing for `req`: `block_size` letters per block (fewer in
/// a last partial block) drawn from the block's id.
pub fn prompt_text(req: &Request, block_size: usize) -> String {
    let input = req.input_tokens as usize;
    let mut out = String::with_capacity(input);
    for (k, &id) in req.blocks.iter().enumerate() {
        let len = block_size.min(input.saturating_sub(k * block_size));
        for j in 0..len {
            let h = xxhash_rust::xxh3::xxh3_64_with_seed(&id.to_le_bytes(), j as u64);
            out.push(char::from(b'a' + (h % 26) as u8));
        }
    }
    out
}

/// What one completion request saw, at the client.
#[derive(Debug, Default, Clone)]
pub struct Completion {
    /// Why it failed (`status N`, `connect`, `timeout`, `body`), if it did.
    pub error: Option<String>,
    /// Time to the first byte of the body (streamed: the first chunk;
    /// whole: the whole response), microseconds.
    pub ttft_us: u64,
    /// Time to the end of the body, microseconds.
    pub e2e_us: u64,
    /// `usage.prompt_tokens`.
    pub prompt_tokens: u64,
    /// `usage.prompt_tokens_details.cached_tokens`.
    pub cached_tokens: u64,
    /// The engine, from a response id `PREFIX-ENGINE-N`.
    pub engine: Option<u64>,
}

impl Completion {
    /// Takes `usage` and the response id from one JSON body or chunk.
    fn read(&mut self, v: &Value, id: &mut Option<String>) {
        if id.is_none() {
            *id = v["id"].as_str().map(String::from);
        }
        if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
            self.prompt_tokens = u["prompt_tokens"].as_u64().unwrap_or(0);
            self.cached_tokens = u["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap_or(0);
        }
    }
}

/// Reads a body to its end: server-sent events if `stream`, else one JSON
/// object. The error kind if it broke off (`timeout`, `body`) or did not
/// parse (`body`).
async fn read_body(
    mut r: reqwest::Response,
    stream: bool,
    t: Instant,
    out: &mut Completion,
) -> Result<(), &'static str> {
    let mut buf = Vec::new();
    let mut id = None;
    let broke = |e: reqwest::Error| if e.is_timeout() { "timeout" } else { "body" };
    while let Some(chunk) = r.chunk().await.map_err(broke)? {
        if out.ttft_us == 0 && stream {
            out.ttft_us = t.elapsed().as_micros() as u64;
        }
        buf.extend_from_slice(&chunk);
        while let Some(i) = buf.windows(2).position(|w| w == b"\n\n").filter(|_| stream) {
            let event: Vec<u8> = buf.drain(..i + 2).collect();
            let text = String::from_utf8_lossy(&event);
            let Some(data) = text.trim().strip_prefix("data:") else {
                continue;
            };
            if let Ok(v) = serde_json::from_str::<Value>(data.trim()) {
                out.read(&v, &mut id);
            }
        }
    }
    if !stream {
        out.ttft_us = t.elapsed().as_micros() as u64;
        let v = serde_json::from_slice::<Value>(&buf).map_err(|_| "body")?;
        out.read(&v, &mut id);
    }
    out.engine = id.and_then(|s| s.rsplit('-').nth(1)?.parse().ok());
    Ok(())
}

/// Posts one completion request (`body`; streamed if its `stream` is
/// true) to `url` and reads the answer to its end.
pub async fn complete(http: &reqwest::Client, url: &str, body: &Value) -> Completion {
    let t = Instant::now();
    let mut out = Completion::default();
    let r = match http.post(url).json(body).send().await {
        Ok(r) => r,
        Err(e) => {
            out.error = Some(if e.is_timeout() { "timeout" } else { "connect" }.into());
            return out;
        }
    };
    if !r.status().is_success() {
        out.error = Some(format!("status {}", r.status().as_u16()));
        return out;
    }
    let stream = body["stream"].as_bool().unwrap_or(false);
    if let Err(kind) = read_body(r, stream, t, &mut out).await {
        out.error = Some(kind.into());
    }
    out.e2e_us = t.elapsed().as_micros() as u64;
    out
}

/// Sends every request of `w` to the gateway at its arrival time (divided
/// by the speedup), streamed, and gathers what came back. Needs a tokio
/// runtime.
pub async fn replay(w: &Workload, opts: &GatewayOptions) -> Result<GatewayReport, ReplayError> {
    opts.validate()?;
    let http = reqwest::Client::builder()
        .timeout(opts.timeout)
        .tcp_nodelay(true)
        .build()
        .map_err(|e| ReplayError::Live(e.to_string()))?;
    let url = format!("{}/v1/completions", opts.url.trim_end_matches('/'));
    let slots = Arc::new(tokio::sync::Semaphore::new(opts.max_in_flight));
    let first = w.requests.first().map_or(0, |r| r.arrival_us);
    let start = tokio::time::Instant::now();
    let mut tasks = Vec::with_capacity(w.requests.len());
    for req in &w.requests {
        // Capped far past any run (2^64 us over the least speedup is more)
        // so the deadline stays an `Instant`.
        let at = (req.arrival_us.saturating_sub(first) as f64 / 1e6 / opts.speedup).min(1e15);
        let at = Duration::from_secs_f64(at);
        tokio::time::sleep_until(start + at).await;
        let late = slots.available_permits() == 0;
        let permit = Arc::clone(&slots)
            .acquire_owned()
            .await
            .map_err(|e| ReplayError::Live(e.to_string()))?;
        let body = json!({
            "model": opts.model,
            "prompt": prompt_text(req, w.block_size),
            "max_tokens": req.output_tokens.clamp(1, opts.max_output_tokens),
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        let (http, url) = (http.clone(), url.clone());
        tasks.push(tokio::spawn(async move {
            let o = complete(&http, &url, &body).await;
            drop(permit);
            (o, late)
        }));
    }
    let mut report = GatewayReport {
        url: opts.url.clone(),
        requests: w.requests.len() as u64,
        ok: 0,
        failed: BTreeMap::new(),
        late: 0,
        prompt_tokens: 0,
        cached_tokens: 0,
        ttft_ms: Millis::default(),
        e2e_ms: Millis::default(),
        per_engine: BTreeMap::new(),
        engines: opts.engines,
        wall_s: 0.0,
    };
    // 1 us to an hour, three significant figures.
    let hist = || Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3).expect("valid bounds");
    let (mut ttft, mut e2e) = (hist(), hist());
    for t in tasks {
        let (o, late) = t.await.map_err(|e| ReplayError::Live(e.to_string()))?;
        report.late += u64::from(late);
        if let Some(kind) = o.error {
            *report.failed.entry(kind).or_default() += 1;
            continue;
        }
        report.ok += 1;
        report.prompt_tokens += o.prompt_tokens;
        report.cached_tokens += o.cached_tokens;
        ttft.saturating_record(o.ttft_us);
        e2e.saturating_record(o.e2e_us);
        if let Some(e) = o.engine {
            *report.per_engine.entry(e).or_default() += 1;
        }
    }
    report.ttft_ms = Millis::of(&ttft);
    report.e2e_ms = Millis::of(&e2e);
    report.wall_s = start.elapsed().as_secs_f64();
    Ok(report)
}

/// The model a [`LocalFleet`] serves.
pub const FLEET_MODEL: &str = "sim";

/// Simulated engines and the router's gateway in front of them, on
/// loopback, for one run; stopped by [`LocalFleet::stop`].
pub struct LocalFleet {
    engines: Vec<SimEngineHandle>,
    url: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    served: tokio::task::JoinHandle<Result<(), Box<dyn std::error::Error + Send + Sync>>>,
}

impl LocalFleet {
    /// Starts `workers` engines (ids 0..workers) with `engine`'s pool and
    /// time model, `speedup` times faster than simulated time, each with
    /// the built-in byte-level tokenizer, and a gateway routing on their
    /// KV events with `policy`. Needs a tokio runtime.
    pub async fn start(
        workers: usize,
        engine: EngineConfig,
        speedup: f64,
        policy: PolicyKind,
    ) -> Result<LocalFleet, ReplayError> {
        let live = |e: &dyn std::fmt::Display| ReplayError::Live(e.to_string());
        let tok = Arc::new(kvrouter::tokenize::ModelTokenizer::builtin());
        let mut engines = Vec::with_capacity(workers);
        for i in 0..workers {
            let mut cfg = SimEngineConfig::new(FLEET_MODEL, Arc::clone(&tok));
            cfg.engine_id = i as u64;
            cfg.engine = engine;
            cfg.speedup = speedup;
            cfg.max_model_len = Some(1 << 20);
            cfg.max_body_bytes = 64 << 20;
            let l = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .map_err(|e| live(&e))?;
            engines.push(SimEngine::start(cfg, l).await.map_err(|e| live(&e))?);
        }
        let mut args = kvrouter::RouterArgs::defaults();
        args.model = FLEET_MODEL.into();
        args.block_size = engine.block_size as u64;
        args.gateway = true;
        args.policy = policy;
        args.max_request_tokens = 1 << 20;
        args.max_context_tokens = Some(1 << 20);
        args.max_body_bytes = 64 << 20;
        args.tokenizers = vec![format!("{FLEET_MODEL}=builtin")
            .parse()
            .map_err(|e| live(&e))?];
        args.workers = engines
            .iter()
            .enumerate()
            .map(|(i, e)| format!("{i}={},url={}", e.events_endpoint(), e.base_url()).parse())
            .collect::<Result<_, _>>()
            .map_err(|e| live(&e))?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| live(&e))?;
        let url = format!("http://{}", listener.local_addr().map_err(|e| live(&e))?);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let served = tokio::spawn(kvrouter::serve(args, listener, async {
            let _ = stopped.await;
        }));
        let fleet = LocalFleet {
            engines,
            url,
            stop: Some(stop),
            served,
        };
        fleet.wait_ready().await?;
        Ok(fleet)
    }

    /// Waits until the gateway serves a completion (its engines healthy).
    async fn wait_ready(&self) -> Result<(), ReplayError> {
        let http = reqwest::Client::new();
        let url = format!("{}/v1/completions", self.url);
        let t = Instant::now();
        loop {
            let r = http
                .post(&url)
                .json(&json!({"model": FLEET_MODEL, "prompt": "ready", "max_tokens": 1}))
                .send()
                .await;
            if r.is_ok_and(|r| r.status().is_success()) {
                return Ok(());
            }
            if t.elapsed() > Duration::from_secs(30) {
                return Err(ReplayError::Live(
                    "the local gateway served no completion within 30 s".into(),
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The gateway's base URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The engines, in id order.
    pub fn engines(&self) -> &[SimEngineHandle] {
        &self.engines
    }

    /// Stops the gateway, then the engines.
    pub async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        let _ = (&mut self.served).await;
        for e in self.engines {
            e.shutdown().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(blocks: &[u64], input: u32) -> Request {
        Request {
            arrival_us: 0,
            input_tokens: input,
            output_tokens: 1,
            blocks: blocks.to_vec(),
        }
    }

    #[test]
    fn equal_blocks_give_equal_text_and_a_partial_block_is_cut() {
        let a = prompt_text(&req(&[7, 8], 32), 16);
        let b = prompt_text(&req(&[7, 9, 10], 40), 16);
        assert_eq!((a.len(), b.len()), (32, 40));
        assert_eq!(a[..16], b[..16]);
        assert_ne!(a[16..32], b[16..32]);
        assert!(a.bytes().all(|c| c.is_ascii_lowercase()));
    }

    #[test]
    fn the_busiest_engine_is_over_the_mean() {
        let mut r = GatewayReport {
            url: String::new(),
            requests: 4,
            ok: 4,
            failed: BTreeMap::new(),
            late: 0,
            prompt_tokens: 100,
            cached_tokens: 25,
            ttft_ms: Millis::default(),
            e2e_ms: Millis::default(),
            per_engine: BTreeMap::from([(0, 3), (1, 1)]),
            engines: None,
            wall_s: 1.0,
        };
        assert_eq!((r.hit_rate(), r.busiest_over_mean()), (0.25, Some(1.5)));
        // A third engine that served nothing counts in the mean.
        r.engines = Some(3);
        assert_eq!(r.busiest_over_mean(), Some(2.25));
        r.per_engine.clear();
        assert_eq!(r.busiest_over_mean(), None);
        assert!(
            r.render().contains("| 4 | 0 | 0 | 25.0% |"),
            "{}",
            r.render()
        );
    }
}
