//! The same simulated fleet behind each OpenAI gateway, in one run.
//!
//! Engines are `kvreplay::server::SimEngine`s in this process (prefix
//! caching, the replay engine's time model, vLLM-format KV events over ZMQ,
//! the built-in byte-level tokenizer: one token per byte). Each target is
//! started as its own process in front of a fresh fleet:
//!
//! * `ours`: `arbor router --gateway`, workers with event endpoints (routing
//!   on the engines' events, KV-aware policy);
//! * `ours-approx`: the same with `--no-kv-events` (routing on what it sent);
//! * `sglang`: `sglang-router launch --policy cache_aware` (PyPI `sglang-router`);
//! * `vllm-router`: `vllm-router --policy cache_aware` (PyPI `vllm-router`);
//! * `vllm-router-kv`: `vllm-router --policy kv_aware` fed the engines' events;
//! * `direct` (overhead only): the client calls the engines itself.
//!
//! `quality`: a Mooncake trace replayed as `POST /v1/completions` at its
//! timestamps (divided by `--speedup`, which also speeds the engines): a
//! block of 512 trace tokens is 512 bytes of text derived from its hash id,
//! so every gateway sees the same prefixes, by text or by tokens. Hit rate
//! from the engines' `usage.prompt_tokens_details.cached_tokens`, TTFT at the
//! client (first streamed token), busiest engine over the mean (requests).
//!
//! `overhead`: fixed offered rates of short requests to fast engines,
//! streaming and not; end-to-end latency at the client through each target
//! and directly.
use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use futures_util::StreamExt;
use hdrhistogram::Histogram;
use kvreplay::engine::EngineConfig;
use kvreplay::server::{SimEngine, SimEngineConfig, SimEngineHandle};
use kvrouter::tokenize::ModelTokenizer;
use serde_json::{json, Value};

const MODEL: &str = "bench";
/// Tokens per trace block (Mooncake's hash ids).
const TRACE_BLOCK: usize = 512;

#[derive(Parser)]
struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(clap::Subcommand)]
enum Cmd {
    /// Routing quality on a Mooncake trace.
    Quality(Quality),
    /// Latency each gateway adds.
    Overhead(Overhead),
}

#[derive(clap::Args, Clone)]
struct Common {
    /// `arbor` binary (targets ours, ours-approx); omit to skip them.
    #[arg(long)]
    arbor: Option<String>,
    /// Virtualenv with `sglang-router` and `vllm-router`; omit to skip them.
    #[arg(long)]
    venv: Option<String>,
    /// Targets, comma-separated (default: every one available).
    #[arg(long, value_delimiter = ',')]
    targets: Vec<String>,
    /// Engines in the fleet.
    #[arg(long, default_value_t = 8)]
    engines: usize,
    /// Tokens per KV block.
    #[arg(long, default_value_t = 64)]
    block_size: usize,
    /// KV blocks per engine.
    #[arg(long, default_value_t = 4096)]
    capacity_blocks: usize,
    /// Prefill tokens per second per engine.
    #[arg(long, default_value_t = 20_000.0)]
    prefill_tps: f64,
    /// Decode tokens per second per sequence.
    #[arg(long, default_value_t = 50.0)]
    decode_tps: f64,
    /// Requests running at once per engine.
    #[arg(long, default_value_t = 64)]
    max_running: usize,
    /// Extra flags for ours (`arbor router`), e.g. `--policy kv-aware`.
    #[arg(long, allow_hyphen_values = true, value_delimiter = ' ')]
    ours_args: Vec<String>,
}

#[derive(clap::Args)]
struct Quality {
    #[command(flatten)]
    common: Common,
    /// Mooncake trace (JSONL).
    #[arg(long)]
    trace: String,
    /// Replay only the first N requests.
    #[arg(long)]
    requests: Option<usize>,
    /// Simulated time runs this much faster (arrivals and engines).
    #[arg(long, default_value_t = 20.0)]
    speedup: f64,
    /// Cap on each request's generated tokens.
    #[arg(long, default_value_t = 32)]
    max_output: u32,
}

#[derive(clap::Args)]
struct Overhead {
    #[command(flatten)]
    common: Common,
    /// Offered rates, requests per second.
    #[arg(long, value_delimiter = ',', default_value = "20,100")]
    rates: Vec<f64>,
    /// Seconds per rate.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// Prompt bytes (tokens) per request.
    #[arg(long, default_value_t = 1024)]
    prompt: usize,
    /// Tokens generated per request.
    #[arg(long, default_value_t = 8)]
    max_tokens: u32,
}

/// A fleet of simulated engines.
struct Fleet {
    engines: Vec<SimEngineHandle>,
}

impl Fleet {
    async fn start(c: &Common, speedup: f64, tok: &Arc<ModelTokenizer>) -> Result<Self> {
        let mut engines = Vec::new();
        for i in 0..c.engines {
            let mut cfg = SimEngineConfig::new(MODEL, Arc::clone(tok));
            cfg.engine_id = i as u64;
            cfg.engine = EngineConfig {
                capacity_blocks: c.capacity_blocks,
                block_size: c.block_size,
                prefill_tps: c.prefill_tps,
                decode_tps: c.decode_tps,
                max_running: c.max_running,
            };
            cfg.speedup = speedup;
            cfg.max_model_len = Some(1 << 20);
            cfg.max_body_bytes = 64 << 20;
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
            engines.push(SimEngine::start(cfg, l).await?);
        }
        Ok(Self { engines })
    }

    fn urls(&self) -> Vec<String> {
        self.engines.iter().map(|e| e.base_url()).collect()
    }

    async fn stop(self) {
        for e in self.engines {
            e.shutdown().await;
        }
    }
}

/// A gateway process (dropped: killed).
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Starts `target` in front of `fleet`; returns its base URL and process
/// (`None` for `direct`).
async fn start_target(
    target: &str,
    c: &Common,
    fleet: &Fleet,
    tokdir: &std::path::Path,
) -> Result<(String, Option<Proc>)> {
    if target == "direct" {
        return Ok((String::new(), None));
    }
    let port = free_port()?;
    let base = format!("http://127.0.0.1:{port}");
    let urls = fleet.urls();
    let venv_bin = |name: &str| -> Result<String> {
        let v = c
            .venv
            .as_deref()
            .context("--venv is needed for the peers")?;
        Ok(format!("{v}/bin/{name}"))
    };
    let mut cmd;
    match target {
        "ours" | "ours-approx" => {
            let arbor = c.arbor.as_deref().context("--arbor is needed for ours")?;
            cmd = Command::new(arbor);
            cmd.args(["router", "--gateway", "--listen"])
                .arg(format!("127.0.0.1:{port}"))
                .args(["--model", MODEL, "--block-size"])
                .arg(c.block_size.to_string())
                .arg("--tokenizer")
                .arg(format!("{MODEL}={}", tokdir.display()))
                .args([
                    "--max-request-tokens",
                    "1048576",
                    "--max-context-tokens",
                    "1048576",
                ])
                .args(["--max-body-bytes", "67108864"]);
            for (i, (e, u)) in fleet.engines.iter().zip(&urls).enumerate() {
                let spec = if target == "ours" {
                    format!("{i}={},url={u}", e.events_endpoint())
                } else {
                    format!("{i}=url={u}")
                };
                cmd.arg("--worker").arg(spec);
            }
            if target == "ours-approx" {
                cmd.arg("--no-kv-events");
            }
            cmd.args(&c.ours_args);
        }
        "sglang" => {
            cmd = Command::new(venv_bin("sglang-router")?);
            cmd.args(["launch", "--host", "127.0.0.1", "--port"])
                .arg(port.to_string())
                .args(["--policy", "cache_aware", "--prometheus-port"])
                .arg(free_port()?.to_string())
                .args(["--max-payload-size", "67108864", "--log-level", "warn"])
                .arg("--worker-urls")
                .args(&urls);
        }
        "vllm-router" | "vllm-router-kv" => {
            cmd = Command::new(venv_bin("vllm-router")?);
            cmd.args(["--host", "127.0.0.1", "--port"])
                .arg(port.to_string())
                .args(["--max-payload-size", "67108864", "--log-level", "warning"])
                .arg("--prometheus-port")
                .arg(free_port()?.to_string())
                .arg("--worker-urls")
                .args(&urls);
            if target == "vllm-router" {
                cmd.args(["--policy", "cache_aware"]);
            } else {
                cmd.args(["--policy", "kv_aware", "--kv-event-model", MODEL])
                    .arg("--kv-event-block-size")
                    .arg(c.block_size.to_string());
                for (e, u) in fleet.engines.iter().zip(&urls) {
                    cmd.arg("--kv-event-source")
                        .arg(format!("{u}={}", e.events_endpoint()));
                }
            }
        }
        other => bail!("unknown target {other:?}"),
    }
    let child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("starting {target}"))?;
    let proc = Proc(child);
    // Ready once it serves a completion (models listed is not enough for
    // every peer: workers are probed in the background).
    let http = reqwest::Client::new();
    let t = Instant::now();
    loop {
        let r = http
            .post(format!("{base}/v1/completions"))
            .json(&json!({"model": MODEL, "prompt": "warm up", "max_tokens": 1}))
            .send()
            .await;
        if let Ok(r) = r {
            if r.status().is_success() {
                break;
            }
        }
        if t.elapsed() > Duration::from_secs(60) {
            bail!("{target} did not serve a completion within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok((base, Some(proc)))
}

/// What one request saw.
#[derive(Default, Clone)]
struct Outcome {
    ok: bool,
    ttft_us: u64,
    e2e_us: u64,
    prompt_tokens: u64,
    cached_tokens: u64,
    engine: Option<u64>,
}

/// Sends one completion and reads it to the end.
async fn send(http: &reqwest::Client, url: &str, body: Value, stream: bool) -> Outcome {
    let t = Instant::now();
    let mut out = Outcome::default();
    let Ok(r) = http.post(url).json(&body).send().await else {
        return out;
    };
    if !r.status().is_success() {
        return out;
    }
    let mut usage = None;
    let mut id = None;
    if stream {
        let mut s = r.bytes_stream();
        let mut buf = Vec::new();
        while let Some(chunk) = s.next().await {
            let Ok(chunk) = chunk else { return out };
            if out.ttft_us == 0 {
                out.ttft_us = t.elapsed().as_micros() as u64;
            }
            buf.extend_from_slice(&chunk);
            while let Some(i) = buf.windows(2).position(|w| w == b"\n\n") {
                let ev: Vec<u8> = buf.drain(..i + 2).collect();
                let line = String::from_utf8_lossy(&ev);
                let Some(data) = line.trim().strip_prefix("data:") else {
                    continue;
                };
                if let Ok(v) = serde_json::from_str::<Value>(data.trim()) {
                    if id.is_none() {
                        id = v["id"].as_str().map(String::from);
                    }
                    if v["usage"].is_object() {
                        usage = Some(v["usage"].clone());
                    }
                }
            }
        }
    } else {
        let Ok(v) = r.json::<Value>().await else {
            return out;
        };
        out.ttft_us = t.elapsed().as_micros() as u64;
        id = v["id"].as_str().map(String::from);
        usage = Some(v["usage"].clone());
    }
    out.e2e_us = t.elapsed().as_micros() as u64;
    out.ok = true;
    if let Some(u) = usage {
        out.prompt_tokens = u["prompt_tokens"].as_u64().unwrap_or(0);
        out.cached_tokens = u["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0);
    }
    // The simulated engine names itself in the id: `PREFIX-ENGINE-N`.
    out.engine = id.and_then(|s| s.rsplit('-').nth(1).and_then(|e| e.parse().ok()));
    out
}

/// The text of one trace block: 512 lowercase letters from its hash id.
fn block_text(id: u64, out: &mut String, len: usize) {
    for j in 0..len {
        let h = xxhash_rust::xxh3::xxh3_64_with_seed(&id.to_le_bytes(), j as u64);
        out.push((b'a' + (h % 26) as u8) as char);
    }
}

struct TraceReq {
    at_ms: u64,
    prompt: String,
    output: u32,
}

fn load_trace(path: &str, limit: Option<usize>) -> Result<Vec<TraceReq>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        if limit.is_some_and(|n| out.len() >= n) {
            break;
        }
        let v: Value = serde_json::from_str(line)?;
        let input = v["input_length"].as_u64().context("input_length")? as usize;
        let ids: Vec<u64> = v["hash_ids"]
            .as_array()
            .context("hash_ids")?
            .iter()
            .filter_map(Value::as_u64)
            .collect();
        let mut prompt = String::with_capacity(input);
        for (k, &id) in ids.iter().enumerate() {
            let len = TRACE_BLOCK.min(input.saturating_sub(k * TRACE_BLOCK));
            block_text(id, &mut prompt, len);
        }
        out.push(TraceReq {
            at_ms: v["timestamp"].as_u64().unwrap_or(0),
            prompt,
            output: v["output_length"].as_u64().unwrap_or(1).max(1) as u32,
        });
    }
    Ok(out)
}

fn targets(c: &Common, with_direct: bool) -> Vec<String> {
    if !c.targets.is_empty() {
        return c.targets.clone();
    }
    let mut t = Vec::new();
    if with_direct {
        t.push("direct".to_string());
    }
    if c.arbor.is_some() {
        t.extend(["ours".to_string(), "ours-approx".to_string()]);
    }
    if c.venv.is_some() {
        t.extend(["sglang", "vllm-router", "vllm-router-kv"].map(String::from));
    }
    t
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

async fn quality(q: Quality) -> Result<()> {
    let reqs = Arc::new(load_trace(&q.trace, q.requests)?);
    let tok = Arc::new(ModelTokenizer::builtin());
    let tokdir = tempfile::tempdir()?;
    ModelTokenizer::write_builtin(tokdir.path())?;
    let span_ms = reqs.iter().map(|r| r.at_ms).max().unwrap_or(0);
    println!(
        "trace {}: {} requests over {:.0} s, replayed over {:.0} s; {} engines, block {} tokens, {} blocks each",
        q.trace,
        reqs.len(),
        span_ms as f64 / 1e3,
        span_ms as f64 / 1e3 / q.speedup,
        q.common.engines,
        q.common.block_size,
        q.common.capacity_blocks
    );
    println!("| target | requests ok | hit rate | TTFT p50 ms | TTFT p99 ms | busiest/mean |");
    println!("|---|---:|---:|---:|---:|---:|");
    for target in targets(&q.common, false) {
        let fleet = Fleet::start(&q.common, q.speedup, &tok).await?;
        let (base, proc) = match start_target(&target, &q.common, &fleet, tokdir.path()).await {
            Ok(x) => x,
            Err(e) => {
                println!("| {target} | failed to start: {e:#} | | | | |");
                fleet.stop().await;
                continue;
            }
        };
        let url = format!("{base}/v1/completions");
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(1024)
            .build()?;
        let start = Instant::now();
        let mut tasks = Vec::with_capacity(reqs.len());
        for i in 0..reqs.len() {
            let due = Duration::from_secs_f64(reqs[i].at_ms as f64 / 1e3 / q.speedup);
            if let Some(wait) = due.checked_sub(start.elapsed()) {
                tokio::time::sleep(wait).await;
            }
            let (http, url, reqs) = (http.clone(), url.clone(), Arc::clone(&reqs));
            let max_tokens = reqs[i].output.min(q.max_output);
            tasks.push(tokio::spawn(async move {
                let r = &reqs[i];
                let body = json!({
                    "model": MODEL, "prompt": r.prompt, "max_tokens": max_tokens,
                    "stream": true, "stream_options": {"include_usage": true}
                });
                send(&http, &url, body, true).await
            }));
        }
        let mut outs = Vec::with_capacity(tasks.len());
        for t in tasks {
            outs.push(t.await.unwrap_or_default());
        }
        drop(proc);
        fleet.stop().await;
        let ok: Vec<&Outcome> = outs.iter().filter(|o| o.ok).collect();
        let mut ttft = Histogram::<u64>::new(3)?;
        let (mut prompt, mut cached) = (0u64, 0u64);
        let mut per_engine: BTreeMap<u64, u64> = BTreeMap::new();
        for o in &ok {
            ttft.record(o.ttft_us.max(1))?;
            prompt += o.prompt_tokens;
            cached += o.cached_tokens;
            if let Some(e) = o.engine {
                *per_engine.entry(e).or_default() += 1;
            }
        }
        let mean = ok.len() as f64 / q.common.engines as f64;
        let busiest = per_engine.values().copied().max().unwrap_or(0) as f64;
        println!(
            "| {target} | {}/{} | {:.1}% | {:.0} | {:.0} | {:.2} |",
            ok.len(),
            outs.len(),
            100.0 * cached as f64 / prompt.max(1) as f64,
            ms(ttft.value_at_quantile(0.5)),
            ms(ttft.value_at_quantile(0.99)),
            if mean > 0.0 { busiest / mean } else { 0.0 },
        );
    }
    Ok(())
}

async fn overhead(o: Overhead) -> Result<()> {
    let tok = Arc::new(ModelTokenizer::builtin());
    let tokdir = tempfile::tempdir()?;
    ModelTokenizer::write_builtin(tokdir.path())?;
    println!(
        "{} engines, prompts of {} tokens (random), {} generated tokens; {} s per rate",
        o.common.engines, o.prompt, o.max_tokens, o.seconds
    );
    println!(
        "| target | mode | offered req/s | ok | p50 ms | p99 ms | added p50 ms | added p99 ms |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    let mut direct: BTreeMap<(bool, u64), (u64, u64)> = BTreeMap::new();
    let mut ts = targets(&o.common, true);
    if let Some(i) = ts.iter().position(|t| t == "direct") {
        let d = ts.remove(i);
        ts.insert(0, d);
    }
    for target in ts {
        let fleet = Fleet::start(&o.common, 1.0, &tok).await?;
        let (base, proc) = match start_target(&target, &o.common, &fleet, tokdir.path()).await {
            Ok(x) => x,
            Err(e) => {
                println!("| {target} | failed to start: {e:#} | | | | | | |");
                fleet.stop().await;
                continue;
            }
        };
        let urls: Vec<String> = if target == "direct" {
            fleet
                .urls()
                .iter()
                .map(|u| format!("{u}/v1/completions"))
                .collect()
        } else {
            vec![format!("{base}/v1/completions")]
        };
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(1024)
            .build()?;
        for stream in [false, true] {
            for &rate in &o.rates {
                let n = (rate * o.seconds) as usize;
                let start = Instant::now();
                let mut tasks = Vec::with_capacity(n);
                for i in 0..n {
                    let due = Duration::from_secs_f64(i as f64 / rate);
                    if let Some(wait) = due.checked_sub(start.elapsed()) {
                        tokio::time::sleep(wait).await;
                    }
                    let mut prompt = String::with_capacity(o.prompt);
                    block_text(
                        (rate as u64) << 40 | (stream as u64) << 39 | i as u64,
                        &mut prompt,
                        o.prompt,
                    );
                    let body = json!({
                        "model": MODEL, "prompt": prompt, "max_tokens": o.max_tokens,
                        "stream": stream
                    });
                    let (http, url) = (http.clone(), urls[i % urls.len()].clone());
                    tasks.push(tokio::spawn(async move {
                        send(&http, &url, body, stream).await
                    }));
                }
                let mut h = Histogram::<u64>::new(3)?;
                let mut ok = 0;
                for t in tasks {
                    let r = t.await.unwrap_or_default();
                    if r.ok {
                        ok += 1;
                        h.record(r.e2e_us.max(1))?;
                    }
                }
                let (p50, p99) = (h.value_at_quantile(0.5), h.value_at_quantile(0.99));
                let key = (stream, rate as u64);
                if target == "direct" {
                    direct.insert(key, (p50, p99));
                }
                let (a50, a99) = direct
                    .get(&key)
                    .map(|&(d50, d99)| {
                        (
                            format!("{:.2}", ms(p50) - ms(d50)),
                            format!("{:.2}", ms(p99) - ms(d99)),
                        )
                    })
                    .unwrap_or_default();
                println!(
                    "| {target} | {} | {rate} | {ok}/{n} | {:.2} | {:.2} | {a50} | {a99} |",
                    if stream { "stream" } else { "whole" },
                    ms(p50),
                    ms(p99),
                );
            }
        }
        drop(proc);
        fleet.stop().await;
    }
    Ok(())
}

fn main() -> Result<()> {
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        match args.cmd {
            Cmd::Quality(q) => quality(q).await,
            Cmd::Overhead(o) => overhead(o).await,
        }
    })
}
