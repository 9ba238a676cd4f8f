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
use hdrhistogram::Histogram;
use kvreplay::engine::EngineConfig;
use kvreplay::gateway::{complete, prompt_text, replay, GatewayOptions};
use kvreplay::server::{SimEngine, SimEngineConfig, SimEngineHandle};
use kvreplay::trace::{read_trace, Request, TraceScaling, Workload};
use kvrouter::tokenize::ModelTokenizer;
use serde_json::json;

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
    /// Between requests through a target, send as many straight to the
    /// engines (half a period after each), and report the added latency against
    /// those (the same minutes of the machine) instead of the `direct`
    /// target's own run.
    #[arg(long)]
    paired: bool,
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

/// The Mooncake trace at `path` as a workload of `block_size`-token blocks
/// (512-token trace blocks), its first `limit` requests.
fn load_trace(path: &str, block_size: usize, limit: Option<usize>) -> Result<Workload> {
    let parsed = read_trace(std::path::Path::new(path), false)?;
    let scaling = TraceScaling {
        trace_block_size: TRACE_BLOCK,
        block_size,
        ..TraceScaling::default()
    };
    let mut w = scaling.apply(path, &parsed.records)?;
    if let Some(n) = limit {
        w.requests.truncate(n);
    }
    Ok(w)
}

/// `len` lowercase letters drawn from `id`.
fn random_text(id: u64, len: usize) -> String {
    let req = Request {
        arrival_us: 0,
        input_tokens: len as u32,
        output_tokens: 1,
        blocks: vec![id],
    };
    prompt_text(&req, len)
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
    let w = load_trace(&q.trace, q.common.block_size, q.requests)?;
    let tok = Arc::new(ModelTokenizer::builtin());
    let tokdir = tempfile::tempdir()?;
    ModelTokenizer::write_builtin(tokdir.path())?;
    let span_s = w.span_us() as f64 / 1e6;
    println!(
        "trace {}: {} requests over {:.0} s, replayed over {:.0} s; {} engines, block {} tokens, {} blocks each",
        q.trace,
        w.requests.len(),
        span_s,
        span_s / q.speedup,
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
        let mut g = GatewayOptions::new(base, MODEL);
        g.speedup = q.speedup;
        g.max_output_tokens = q.max_output;
        g.max_in_flight = 1 << 16;
        g.engines = Some(q.common.engines);
        let r = replay(&w, &g).await?;
        drop(proc);
        fleet.stop().await;
        println!(
            "| {target} | {}/{} | {:.1}% | {:.0} | {:.0} | {:.2} |",
            r.ok,
            r.requests,
            100.0 * r.hit_rate(),
            r.ttft_ms.p50,
            r.ttft_ms.p99,
            r.busiest_over_mean().unwrap_or(0.0),
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
                let mut twins = Vec::new();
                let paired = o.paired && target != "direct";
                for i in 0..n {
                    let due = Duration::from_secs_f64(i as f64 / rate);
                    if let Some(wait) = due.checked_sub(start.elapsed()) {
                        tokio::time::sleep(wait).await;
                    }
                    let id = (rate as u64) << 40 | (stream as u64) << 39 | i as u64;
                    let prompt = random_text(id, o.prompt);
                    let body = json!({
                        "model": MODEL, "prompt": prompt, "max_tokens": o.max_tokens,
                        "stream": stream
                    });
                    if paired {
                        let fleet_urls = fleet.urls();
                        let url = format!("{}/v1/completions", fleet_urls[i % fleet_urls.len()]);
                        let (http, body) = (http.clone(), body.clone());
                        // Half a period later: the twins share the
                        // machine's minutes, not each other's moment.
                        let half = Duration::from_secs_f64(0.5 / rate);
                        twins.push(tokio::spawn(async move {
                            tokio::time::sleep(half).await;
                            complete(&http, &url, &body).await
                        }));
                    }
                    let (http, url) = (http.clone(), urls[i % urls.len()].clone());
                    tasks.push(tokio::spawn(
                        async move { complete(&http, &url, &body).await },
                    ));
                }
                let (h, ok) = latencies(tasks).await?;
                let (p50, p99) = (h.value_at_quantile(0.5), h.value_at_quantile(0.99));
                let key = (stream, rate as u64);
                if target == "direct" {
                    direct.insert(key, (p50, p99));
                }
                let twin = if paired {
                    let (t, _) = latencies(twins).await?;
                    Some((t.value_at_quantile(0.5), t.value_at_quantile(0.99)))
                } else {
                    None
                };
                let (a50, a99) = twin
                    .as_ref()
                    .or(direct.get(&key))
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

/// The end-to-end latencies of the requests that succeeded, and how many.
async fn latencies(
    tasks: Vec<tokio::task::JoinHandle<kvreplay::gateway::Completion>>,
) -> Result<(Histogram<u64>, usize)> {
    let mut h = Histogram::<u64>::new(3)?;
    let mut ok = 0;
    for t in tasks {
        let r = t.await.unwrap_or_default();
        if r.error.is_none() {
            ok += 1;
            h.record(r.e2e_us.max(1))?;
        }
    }
    Ok((h, ok))
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
