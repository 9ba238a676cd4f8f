//! Side-by-side router service benchmark: `arbor router` (kvrouter) and
//! Dynamo's standalone KV indexer, each its own process on loopback, fed
//! identical streams in vLLM's wire format.
//!
//! The stream is the event timeline of a simulated fleet replaying a
//! Mooncake trace (`kvreplay`, `--workers` engines, KV-aware routing): each
//! engine's events become one publisher's batches (one event per batch), a
//! block's 16 tokens derived from its hash, so both routers hash the same
//! tokens. Per target:
//!
//! 1. **Ingest**: every publisher sends its whole stream as fast as ZMQ
//!    takes it (no send high-water mark: nothing is dropped, a slow router
//!    pushes back), while one thread sends `/query` at `--query-rate`
//!    (prompts of `--query-tokens`). A final marker block per publisher,
//!    polled with `/query`, says when everything is applied. Events and
//!    block operations per second over that time; `/query` latency during
//!    ingest; answers checked against a reference index.
//! 2. **Memory and apply lag**: a fresh process fed the stream at a fixed
//!    rate (`--paced-rate`, default a third of what it sustained), with a
//!    probe block sent into the next publisher's stream every 20 ms and
//!    polled with `/query` until it shows (apply lag: sent to visible);
//!    resident set before and after, per million blocks held.
//! 3. **Query latency** at fixed offered rates on the loaded index
//!    (`/query` for both, `/route` for ours).
//!
//! Usage: see `--help`; BENCHMARKS.md has the command lines.
use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use hdrhistogram::Histogram;
use kvindex::{KvEvent, KvEventData, KvIndexer, ReferenceIndex, WorkerKey};
use kvreplay::replay::{request_hashes, simulate, SimInput, TimelineEntry};
use kvrouter::wire::{encode_batch, WireEvent};
use serde_json::{json, Value};

const BS: usize = kvreplay::live::BLOCK_TOKENS;

#[derive(Parser)]
struct Args {
    /// Path to `arbor` (ours); omit to skip.
    #[arg(long)]
    ours: Option<String>,
    /// Path to `dynamo-indexer` (this crate's binary); omit to skip.
    #[arg(long)]
    dynamo: Option<String>,
    /// Ingest / indexer threads for both.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// `/query` per second during ingest.
    #[arg(long, default_value_t = 1000.0)]
    query_rate: f64,
    /// Tokens per query prompt.
    #[arg(long, default_value_t = 4096)]
    query_tokens: usize,
    /// Offered rates for the latency phase (per second).
    #[arg(long, value_delimiter = ',', default_value = "100,1000,3000")]
    rates: Vec<f64>,
    /// Seconds per offered rate.
    #[arg(long, default_value_t = 3.0)]
    rate_secs: f64,
    /// Rounds (targets alternate within each).
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// Only the memory phase, publishing at this many events per second.
    #[arg(long, value_name = "EVENTS_PER_S")]
    memory_only: Option<f64>,
    /// Events per second of the paced phase (memory and apply lag);
    /// default a third of the rate each target sustained.
    #[arg(long, value_name = "EVENTS_PER_S")]
    paced_rate: Option<f64>,
    #[command(flatten)]
    replay: arbor::ReplayArgs,
}

/// One publisher's stream, pre-encoded.
struct Stream {
    key: WorkerKey,
    batches: Vec<Vec<u8>>,
    marker: Vec<u32>,
}

use kvreplay::live::{block_tokens as tokens_of, wire_event as wire};

/// The router's view of an event: local hashes as the router computes them
/// from the tokens.
fn rehashed(ev: &KvEvent) -> KvEvent {
    let mut e = ev.clone();
    if let KvEventData::Stored { blocks, .. } = &mut e.data {
        for b in blocks {
            b.local = kvindex::local_block_hashes(&tokens_of(b.local), BS, None)[0];
        }
    }
    e
}

struct Workload {
    streams: Vec<Stream>,
    events: usize,
    block_ops: u64,
    reference: ReferenceIndex,
    queries: Vec<Vec<u32>>,
}

fn build(args: &Args) -> Result<Workload> {
    let opts = args.replay.options()?;
    let (workload, _) = kvreplay::load_workload(&opts)?;
    let hashes = request_hashes(&workload);
    let sim = opts.sim;
    let index = kvindex::ConcurrentIndex::new();
    let input = SimInput {
        workload: &workload,
        hashes: &hashes,
        cfg: &sim,
    };
    let run = simulate(
        input,
        kvroute_policy(),
        Some(&index),
        true,
        &kvreplay::NoProgress,
    )?;
    let tl = run.timeline.context("a timeline")?;
    let reference = ReferenceIndex::new();
    let (mut events, mut block_ops) = (0usize, 0u64);
    let mut streams = Vec::new();
    for (w, entries) in tl.per_worker.iter().enumerate() {
        let key = WorkerKey::new(w as u64, 0);
        let mut batches = Vec::new();
        for (t, e) in entries {
            if let TimelineEntry::Event(ev) = e {
                batches.push(encode_batch(*t as f64 / 1e6, &[wire(ev)], None));
                let _ = reference.apply(&rehashed(ev));
                events += 1;
                block_ops += match &ev.data {
                    KvEventData::Stored { blocks, .. } => blocks.len() as u64,
                    KvEventData::Removed { hashes } => hashes.len() as u64,
                    KvEventData::Cleared => 0,
                };
            }
        }
        // The marker: one block no one else stores, at the root.
        let marker: Vec<u32> = (0..BS as u32)
            .map(|j| 200_000 + w as u32 * 64 + j)
            .collect();
        batches.push(encode_batch(
            0.0,
            &[WireEvent::Stored {
                block_hashes: vec![u64::MAX - w as u64],
                parent: None,
                token_ids: marker.clone(),
                block_size: BS as u64,
                medium: None,
                lora_name: None,
            }],
            None,
        ));
        streams.push(Stream {
            key,
            batches,
            marker,
        });
    }
    let per_query = args.query_tokens / BS;
    let queries = hashes
        .iter()
        .filter(|h| !h.is_empty())
        .map(|h| {
            let mut t: Vec<u32> = Vec::with_capacity(args.query_tokens);
            for i in 0..per_query {
                // Repeat the request's blocks to reach the prompt length.
                t.extend(tokens_of(h[i % h.len()]));
            }
            t
        })
        .collect();
    Ok(Workload {
        streams,
        events,
        block_ops,
        reference,
        queries,
    })
}

fn kvroute_policy() -> kvreplay::policy::PolicyKind {
    kvreplay::policy::PolicyKind::KvAware
}

fn rss_kib(pid: u32) -> u64 {
    let mut s = String::new();
    if let Ok(mut f) = std::fs::File::open(format!("/proc/{pid}/status")) {
        let _ = f.read_to_string(&mut s);
    }
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(18123)
}

struct Target {
    name: &'static str,
    child: Child,
    base: String,
    http: reqwest::blocking::Client,
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(name: &'static str, bin: &str, threads: usize) -> Result<Target> {
    let port = free_port();
    let mut cmd = Command::new(bin);
    if name == "ours" {
        cmd.args([
            "router",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--ingest-threads",
            &threads.to_string(),
        ]);
        cmd.env("RUST_LOG", "warn");
    } else {
        cmd.args([port.to_string(), threads.to_string()]);
    }
    let child = cmd
        .stdout(Stdio::null())
        .spawn()
        .with_context(|| bin.to_string())?;
    let t = Target {
        name,
        child,
        base: format!("http://127.0.0.1:{port}"),
        http: reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()?,
    };
    let t0 = Instant::now();
    while t.http.get(format!("{}/health", t.base)).send().is_err() {
        if t0.elapsed() > Duration::from_secs(20) {
            bail!("{name} never answered");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(t)
}

fn query(
    http: &reqwest::blocking::Client,
    base: &str,
    path: &str,
    tokens: &[u32],
) -> Result<Value> {
    let r = http
        .post(format!("{base}{path}"))
        .json(&json!({"model_name": "bench", "token_ids": tokens}))
        .send()?;
    if !r.status().is_success() {
        bail!("{path}: {}", r.status());
    }
    Ok(r.json()?)
}

/// Sends requests at `rate` per second until `stop`; returns latencies (µs).
fn load(
    base: String,
    path: &'static str,
    queries: Arc<Vec<Vec<u32>>>,
    rate: f64,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<(Histogram<u64>, u64)> {
    std::thread::spawn(move || {
        let http = reqwest::blocking::Client::new();
        let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("bounds");
        let mut errors = 0;
        let gap = Duration::from_secs_f64(1.0 / rate);
        let t0 = Instant::now();
        let mut i = 0usize;
        while !stop.load(Ordering::Relaxed) {
            // Open loop: each request is due at t0 + i * gap; latency counts
            // from when it was due, so a stalled server shows as latency.
            let due = t0 + gap * i as u32;
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
            let q = &queries[i % queries.len()];
            match query(&http, &base, path, q) {
                Ok(_) => h.saturating_record(due.elapsed().as_micros().max(1) as u64),
                Err(_) => errors += 1,
            }
            i += 1;
        }
        (h, errors)
    })
}

fn ms(h: &Histogram<u64>, q: f64) -> f64 {
    h.value_at_quantile(q) as f64 / 1000.0
}

/// Binds one PUB per stream and registers it with `t`.
fn connect(t: &Target, w: &Workload, ctx: &zmq::Context) -> Result<Vec<zmq::Socket>> {
    let mut socks = Vec::new();
    for s in &w.streams {
        let p = ctx.socket(zmq::PUB)?;
        p.set_sndhwm(0)?;
        p.bind("tcp://127.0.0.1:*")?;
        let ep = p
            .get_last_endpoint()?
            .map_err(|_| anyhow::anyhow!("endpoint"))?;
        let r = t
            .http
            .post(format!("{}/register", t.base))
            .json(&json!({"instance_id": s.key.worker_id, "endpoint": ep,
                          "model_name": "bench", "block_size": BS}))
            .send()?;
        if !r.status().is_success() {
            bail!("register: {} {}", r.status(), r.text()?);
        }
        socks.push(p);
    }
    std::thread::sleep(Duration::from_millis(1000));
    Ok(socks)
}

/// Apply-lag probes: while a paced stream runs, a probe (one block at the
/// root that nothing else stores) goes into the next publisher's stream
/// every `PROBE_GAP`; a poller queries each until it shows.
const PROBE_GAP: Duration = Duration::from_millis(20);

/// A probe sent and not yet seen.
struct Probe {
    worker: u64,
    tokens: Vec<u32>,
    sent: Instant,
}

type Probes = Arc<std::sync::Mutex<Vec<Probe>>>;

/// Publishes every stream round-robin, at most `rate` batches per second
/// (`None`: as fast as ZMQ takes them); returns when all are sent. With
/// `probes`, sends apply-lag probes between the batches (each publisher's
/// sequence numbers stay consecutive).
fn publish(
    w: &Workload,
    socks: &[zmq::Socket],
    rate: Option<f64>,
    probes: Option<&Probes>,
) -> Result<Duration> {
    let t0 = Instant::now();
    let longest = w.streams.iter().map(|s| s.batches.len()).max().unwrap_or(0);
    let mut seqs = vec![0u64; socks.len()];
    let mut send = |k: usize, b: &[u8]| -> Result<()> {
        socks[k].send_multipart([&b""[..], &seqs[k].to_be_bytes()[..], b], 0)?;
        seqs[k] += 1;
        Ok(())
    };
    let (mut sent, mut probed) = (0u64, 0u32);
    let mut next_probe = t0 + PROBE_GAP;
    for (i, k) in (0..longest).flat_map(|i| (0..socks.len()).map(move |k| (i, k))) {
        let Some(b) = w.streams[k].batches.get(i) else {
            continue;
        };
        // Paced per batch, not per round of all publishers: a probe must
        // not queue behind a burst the pacing itself made.
        if let Some(r) = rate {
            let due = t0 + Duration::from_secs_f64(sent as f64 / r);
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
        }
        send(k, b)?;
        sent += 1;
        if let Some(pending) = probes.filter(|_| Instant::now() >= next_probe) {
            let k = probed as usize % socks.len();
            let tokens = probe_tokens(probed);
            let b = encode_batch(
                0.0,
                &[WireEvent::Stored {
                    block_hashes: vec![u64::MAX - (1 << 20) - u64::from(probed)],
                    parent: None,
                    token_ids: tokens.clone(),
                    block_size: BS as u64,
                    medium: None,
                    lora_name: None,
                }],
                None,
            );
            let sent_at = Instant::now();
            send(k, &b)?;
            pending.lock().expect("probes").push(Probe {
                worker: w.streams[k].key.worker_id,
                tokens,
                sent: sent_at,
            });
            probed += 1;
            next_probe += PROBE_GAP;
        }
    }
    Ok(t0.elapsed())
}

/// Probe `p`'s tokens: above every token the streams and markers use.
fn probe_tokens(p: u32) -> Vec<u32> {
    (0..BS as u32)
        .map(|j| 400_000 + p * BS as u32 + j)
        .collect()
}

/// Queries every pending probe in turn until `stop`, then until none is
/// left; returns each probe's apply lag (µs) and how many it saw.
fn poll_probes(
    base: String,
    pending: Probes,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Result<(Histogram<u64>, u32)>> {
    std::thread::spawn(move || {
        let http = reqwest::blocking::Client::new();
        let mut h = Histogram::<u64>::new_with_bounds(1, 600_000_000, 3).expect("bounds");
        let mut seen = 0;
        let t0 = Instant::now();
        loop {
            let now: Vec<(u64, Vec<u32>, Instant)> = pending
                .lock()
                .expect("probes")
                .iter()
                .map(|p| (p.worker, p.tokens.clone(), p.sent))
                .collect();
            if now.is_empty() && stop.load(Ordering::Relaxed) {
                return Ok((h, seen));
            }
            if t0.elapsed() > Duration::from_secs(600) {
                bail!("probes not seen after 600 s");
            }
            for (worker, tokens, sent) in now {
                let v = query(&http, &base, "/query", &tokens)?;
                if v["scores"][worker.to_string()]["0"].as_u64() == Some(BS as u64) {
                    h.saturating_record(sent.elapsed().as_micros().max(1) as u64);
                    seen += 1;
                    pending.lock().expect("probes").retain(|p| p.sent != sent);
                }
            }
            std::thread::sleep(Duration::from_micros(500));
        }
    })
}

/// Waits until every stream's marker is visible (everything applied).
fn wait_applied(t: &Target, w: &Workload, t0: Instant) -> Result<Duration> {
    let mut pending: Vec<&Stream> = w.streams.iter().collect();
    while !pending.is_empty() {
        let mut still = Vec::new();
        for s in pending {
            let v = query(&t.http, &t.base, "/query", &s.marker)?;
            if v["scores"][s.key.worker_id.to_string()]["0"].as_u64() != Some(BS as u64) {
                still.push(s);
            }
        }
        pending = still;
        if t0.elapsed() > Duration::from_secs(600) {
            bail!("{}: not all applied after 600 s", t.name);
        }
        if !pending.is_empty() {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    Ok(t0.elapsed())
}

fn run_target(
    name: &'static str,
    bin: &str,
    w: &Workload,
    args: &Args,
    queries: &Arc<Vec<Vec<u32>>>,
) -> Result<()> {
    if let Some(rate) = args.memory_only {
        return memory(name, bin, w, args, rate);
    }
    let t = start(name, bin, args.threads)?;
    let ctx = zmq::Context::new();
    let socks = connect(&t, w, &ctx)?;
    let stop = Arc::new(AtomicBool::new(false));
    let loader = load(
        t.base.clone(),
        "/query",
        Arc::clone(queries),
        args.query_rate,
        Arc::clone(&stop),
    );
    let t0 = Instant::now();
    let published = publish(w, &socks, None, None)?;
    let applied = wait_applied(&t, w, t0)?;
    stop.store(true, Ordering::Relaxed);
    let (during, errors) = loader.join().map_err(|_| anyhow::anyhow!("loader"))?;
    // Check answers against the reference.
    let mut wrong = 0;
    for q in queries.iter().step_by(queries.len().div_ceil(200).max(1)) {
        let want = w
            .reference
            .find_matches(&kvindex::local_block_hashes(q, BS, None));
        let got = query(&t.http, &t.base, "/query", q)?;
        for s in &w.streams {
            let g = got["scores"][s.key.worker_id.to_string()]["0"]
                .as_u64()
                .unwrap_or(0);
            if g != u64::from(want.get(s.key)) * BS as u64 {
                wrong += 1;
            }
        }
    }
    let secs = applied.as_secs_f64();
    let events_per_s = w.events as f64 / secs;
    println!(
        "{:6} ingest: {} publishers, {} events, {} block ops in {:.2} s (published in {:.2} s): {:.0} events/s, {:.0} block ops/s; /query during ingest p50 {:.2} ms p99 {:.2} ms ({} sent, {} errors); wrong answers {}",
        t.name,
        w.streams.len(),
        w.events,
        w.block_ops,
        secs,
        published.as_secs_f64(),
        events_per_s,
        w.block_ops as f64 / secs,
        ms(&during, 0.5),
        ms(&during, 0.99),
        during.len(),
        errors,
        wrong
    );
    let paths: &[&'static str] = if t.name == "ours" {
        &["/query", "/route"]
    } else {
        &["/query"]
    };
    for &rate in &args.rates {
        for &path in paths {
            let stop = Arc::new(AtomicBool::new(false));
            let h = load(
                t.base.clone(),
                path,
                Arc::clone(queries),
                rate,
                Arc::clone(&stop),
            );
            std::thread::sleep(Duration::from_secs_f64(args.rate_secs));
            stop.store(true, Ordering::Relaxed);
            let (h, errors) = h.join().map_err(|_| anyhow::anyhow!("loader"))?;
            println!(
                "{:6} {path:7} at {rate:>6.0}/s: p50 {:.3} ms p99 {:.3} ms ({} sent, {} errors)",
                t.name,
                ms(&h, 0.5),
                ms(&h, 0.99),
                h.len(),
                errors
            );
        }
    }
    drop(socks);
    drop(t);
    let paced = args.paced_rate.unwrap_or(events_per_s / 3.0);
    memory(name, bin, w, args, paced)
}

/// Memory and apply lag: a fresh process fed at `events_per_s` (below
/// what it sustains, so that no backlog of queued messages counts as
/// index memory), with apply-lag probes.
fn memory(
    name: &'static str,
    bin: &str,
    w: &Workload,
    args: &Args,
    events_per_s: f64,
) -> Result<()> {
    let ctx = zmq::Context::new();
    let t = start(name, bin, args.threads)?;
    let socks = connect(&t, w, &ctx)?;
    let rss0 = rss_kib(t.child.id());
    let t0 = Instant::now();
    let pending = Probes::default();
    let stop = Arc::new(AtomicBool::new(false));
    let poller = poll_probes(t.base.clone(), Arc::clone(&pending), Arc::clone(&stop));
    publish(w, &socks, Some(events_per_s), Some(&pending))?;
    wait_applied(&t, w, t0)?;
    stop.store(true, Ordering::Relaxed);
    let (lag, probes) = poller.join().map_err(|_| anyhow::anyhow!("poller"))??;
    println!(
        "{:6} apply lag at {:.0} events/s: p50 {:.2} ms p99 {:.2} ms max {:.2} ms ({} probes)",
        t.name,
        events_per_s,
        ms(&lag, 0.5),
        ms(&lag, 0.99),
        lag.max() as f64 / 1000.0,
        probes
    );
    std::thread::sleep(Duration::from_millis(500));
    let rss1 = rss_kib(t.child.id());
    let blocks: usize = w
        .streams
        .iter()
        .map(|s| w.reference.worker_block_count(s.key) + 1)
        .sum::<usize>()
        + probes as usize;
    println!(
        "{:6} memory: RSS {} -> {} KiB, {} blocks held: {:.1} MiB per million blocks ({:.0} bytes per block)",
        t.name,
        rss0,
        rss1,
        blocks,
        (rss1.saturating_sub(rss0)) as f64 / 1024.0 / blocks as f64 * 1e6,
        (rss1.saturating_sub(rss0)) as f64 * 1024.0 / blocks as f64
    );
    if t.name == "ours" {
        // The index's own account of its heap, beside the resident set.
        let text = t.http.get(format!("{}/metrics", t.base)).send()?.text()?;
        let bytes: f64 = text
            .lines()
            .filter(|l| l.starts_with("kvrouter_index_bytes{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        println!(
            "{:6} memory: index heap {:.1} MiB ({:.0} bytes per block)",
            t.name,
            bytes / (1 << 20) as f64,
            bytes / blocks as f64
        );
    }
    Ok(())
}

fn main() -> Result<()> {
    let args = Args::parse();
    let t = Instant::now();
    let w = build(&args)?;
    println!(
        "workload: {} publishers, {} events, {} block ops, {} queries of {} tokens (built in {:.1} s)",
        w.streams.len(),
        w.events,
        w.block_ops,
        w.queries.len(),
        args.query_tokens,
        t.elapsed().as_secs_f64()
    );
    let st = w.reference.stats();
    println!(
        "workload: the reference index saw {} stores whose parent the worker did not hold, {} removals of blocks it did not hold",
        st.unknown_parents, st.unknown_removes
    );
    let queries = Arc::new(w.queries.clone());
    for round in 0..args.rounds {
        let mut order: Vec<(&'static str, &String)> = Vec::new();
        if let Some(o) = &args.ours {
            order.push(("ours", o));
        }
        if let Some(d) = &args.dynamo {
            order.push(("dynamo", d));
        }
        if round % 2 == 1 {
            order.reverse();
        }
        for (name, bin) in order {
            run_target(name, bin, &w, &args, &queries)?;
        }
    }
    Ok(())
}
