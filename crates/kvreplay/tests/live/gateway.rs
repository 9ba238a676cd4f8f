//! A fleet of simulated engines behind the router's gateway, all on
//! loopback: the gateway tokenizes as the engines do, so the blocks it
//! routes on are the blocks the engines store and report; streams,
//! cancellation and failover reach real engines.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kvindex::local_block_hashes;
use kvreplay::server::{Fault, SimEngine, SimEngineConfig, SimEngineHandle};
use kvrouter::tokenize::{Endpoint, ModelTokenizer};
use kvrouter::wire::{decode_batch, WireEvent};
use serde_json::{json, Value};

const MODEL: &str = "sim";
const BS: usize = 16;

struct Fleet {
    engines: Vec<SimEngineHandle>,
    tok: Arc<ModelTokenizer>,
    router: String,
    http: reqwest::Client,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    served: Option<tokio::task::JoinHandle<Result<(), Box<dyn std::error::Error + Send + Sync>>>>,
    _dir: tempfile::TempDir,
}

/// `n` engines (ids 0..n) with the word-level test model, and a router
/// with the gateway in front of them.
async fn fleet(n: usize) -> Fleet {
    fleet_with(n, false, 200.0).await
}

/// `fleet`, with the built-in byte-level tokenizer (`--tokenizer
/// MODEL=builtin`) if `builtin`, decoding `decode_tps` tokens a second.
async fn fleet_with(n: usize, builtin: bool, decode_tps: f64) -> Fleet {
    let dir = tempfile::tempdir().unwrap();
    let model = if builtin {
        std::path::PathBuf::from("builtin")
    } else {
        test_support::tokenizer::write_model_dir(&dir.path().join("model"))
    };
    let tok = Arc::new(if builtin {
        ModelTokenizer::builtin()
    } else {
        ModelTokenizer::from_dir(&model).unwrap()
    });
    let mut engines = Vec::new();
    for i in 0..n {
        let mut cfg = SimEngineConfig::new(MODEL, Arc::clone(&tok));
        cfg.engine_id = i as u64;
        cfg.engine.block_size = BS;
        cfg.engine.prefill_tps = 200_000.0;
        cfg.engine.decode_tps = decode_tps;
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        engines.push(SimEngine::start(cfg, l).await.unwrap());
    }
    let mut args = kvrouter::RouterArgs::defaults();
    args.model = MODEL.into();
    args.block_size = BS as u64;
    args.gateway = true;
    args.policy = kvroute::PolicyKind::KvAware;
    args.health_interval = Duration::from_millis(200);
    // The engines publish nothing until asked: a feed counts as current
    // this soon after it was subscribed.
    args.connect_timeout = Duration::from_millis(200);
    args.tokenizers = vec![format!("{MODEL}={}", model.display()).parse().unwrap()];
    args.workers = engines
        .iter()
        .enumerate()
        .map(|(i, e)| {
            format!("{i}={},url={}", e.events_endpoint(), e.base_url())
                .parse()
                .unwrap()
        })
        .collect();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let router = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(kvrouter::serve(args, listener, async {
        let _ = stopped.await;
    }));
    let f = Fleet {
        engines,
        tok,
        router,
        http: reqwest::Client::new(),
        stop: Some(stop),
        served: Some(served),
        _dir: dir,
    };
    let t = Instant::now();
    while f.get("/ready").await.0 != 200 {
        assert!(t.elapsed() < Duration::from_secs(10), "router not ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    f
}

impl Fleet {
    async fn get(&self, path: &str) -> (u16, Value) {
        match self.http.get(format!("{}{path}", self.router)).send().await {
            Ok(r) => (r.status().as_u16(), r.json().await.unwrap_or(Value::Null)),
            Err(_) => (0, Value::Null),
        }
    }

    async fn post(&self, path: &str, body: &Value) -> reqwest::Response {
        self.http
            .post(format!("{}{path}", self.router))
            .json(body)
            .send()
            .await
            .unwrap()
    }

    /// A non-streamed gateway request that must succeed: the engine that
    /// served it and the prompt tokens it found cached.
    async fn ok(&self, path: &str, body: &Value) -> (u64, u64) {
        let r = self.post(path, body).await;
        assert_eq!(r.status(), 200);
        let v: Value = r.json().await.unwrap();
        (engine_of(&v), cached(&v))
    }

    /// Leading blocks of `tokens` the router's index holds on `engine`
    /// (`/query` scores in tokens).
    async fn overlap(&self, engine: u64, tokens: &[u32]) -> u64 {
        let v: Value = self
            .post("/query", &json!({"model_name": MODEL, "token_ids": tokens}))
            .await
            .json()
            .await
            .unwrap();
        v["scores"][engine.to_string()]["0"].as_u64().unwrap_or(0) / BS as u64
    }

    async fn wait_overlap(&self, engine: u64, tokens: &[u32], want: u64) {
        let t = Instant::now();
        loop {
            let got = self.overlap(engine, tokens).await;
            if got == want {
                return;
            }
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "engine {engine}: {got} blocks indexed, want {want}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(s) = self.served.take() {
            s.await.unwrap().unwrap();
        }
        for e in self.engines.drain(..) {
            e.shutdown().await;
        }
    }
}

/// The simulated engine names itself in the response id: `PREFIX-ENGINE-N`.
fn engine_of(v: &Value) -> u64 {
    let id = v["id"].as_str().unwrap();
    id.rsplit('-').nth(1).unwrap().parse().unwrap()
}

fn cached(v: &Value) -> u64 {
    v["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap()
}

fn words(seed: usize, n: usize) -> String {
    (seed..seed + n)
        .map(|i| format!("t{i}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn chat(turns: &[(&str, String)], max_tokens: u32) -> Value {
    let messages: Vec<Value> = turns
        .iter()
        .map(|(role, content)| json!({"role": role, "content": content}))
        .collect();
    json!({"model": MODEL, "messages": messages, "max_tokens": max_tokens})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_gateway_routes_on_the_blocks_the_engine_stores() {
    let f = fleet(3).await;
    // What the engine will publish: subscribe to all three.
    let ctx = zmq::Context::new();
    let subs: Vec<zmq::Socket> = f
        .engines
        .iter()
        .map(|e| {
            let s = ctx.socket(zmq::SUB).unwrap();
            s.set_subscribe(b"").unwrap();
            s.connect(e.events_endpoint()).unwrap();
            s
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;

    let first = chat(&[("user", words(0, 70))], 4);
    let tokens = f
        .tok
        .prompt_tokens(Endpoint::ChatCompletions, &first)
        .unwrap();
    let full = (tokens.len() / BS) as u64;
    assert!(full >= 4, "{} tokens", tokens.len());
    let (e, hit) = f.ok("/v1/chat/completions", &first).await;
    assert_eq!(hit, 0, "a cold fleet has nothing cached");

    // The engine's stored blocks, recomputed from the token ids it
    // published, are the blocks of the tokens the gateway computed.
    let sub = &subs[e as usize];
    let mut published = Vec::new();
    let t = Instant::now();
    while published.len() < full as usize {
        assert!(t.elapsed() < Duration::from_secs(5), "no Stored event");
        if let Ok(frames) = sub.recv_multipart(zmq::DONTWAIT) {
            let batch = decode_batch(&frames[2]).unwrap();
            for ev in batch.events {
                if let WireEvent::Stored { token_ids, .. } = ev {
                    published.extend(token_ids);
                }
            }
        } else {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    assert_eq!(
        local_block_hashes(&published, BS, None),
        local_block_hashes(&tokens, BS, None),
        "the engine stored other blocks than the gateway hashed"
    );
    // The router's index, fed by those events, holds them on that engine
    // and nowhere else.
    f.wait_overlap(e, &tokens, full).await;
    for other in (0..3).filter(|&o| o != e) {
        assert_eq!(f.overlap(other, &tokens).await, 0);
    }

    // The next turn of the conversation goes where its prefix is cached,
    // and the engine reports the hit the router counted on.
    let second = chat(
        &[
            ("user", words(0, 70)),
            ("assistant", words(4000, 5)),
            ("user", words(200, 30)),
        ],
        4,
    );
    let (e2, hit2) = f.ok("/v1/chat/completions", &second).await;
    assert_eq!(e2, e, "the second turn left its cache");
    assert_eq!(hit2, full * BS as u64);

    // Other conversations spread over the other engines, and each one's
    // turns stay where their prefix is.
    let mut homes = Vec::new();
    for c in 1..4 {
        let opening = chat(&[("user", words(c * 1000, 64))], 2);
        let (home, _) = f.ok("/v1/chat/completions", &opening).await;
        let toks = f
            .tok
            .prompt_tokens(Endpoint::ChatCompletions, &opening)
            .unwrap();
        f.wait_overlap(home, &toks, (toks.len() / BS) as u64).await;
        let next = chat(
            &[
                ("user", words(c * 1000, 64)),
                ("assistant", words(4000, 3)),
                ("user", words(c * 1000 + 500, 8)),
            ],
            2,
        );
        let (again, hit) = f.ok("/v1/chat/completions", &next).await;
        assert_eq!(again, home, "conversation {c} moved");
        assert!(
            hit >= (toks.len() / BS * BS) as u64,
            "conversation {c}: {hit} cached"
        );
        homes.push(home);
    }
    homes.sort_unstable();
    homes.dedup();
    assert!(
        homes.len() >= 2,
        "every conversation on one engine: {homes:?}"
    );
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn streams_and_cancellation_reach_the_engine() {
    let f = fleet(2).await;
    let mut body = chat(&[("user", words(0, 40))], 40);
    body["stream"] = json!(true);
    // 40 tokens at 200 per second: about 200 ms of stream.
    let r = f.post("/v1/chat/completions", &body).await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.headers()["content-type"].to_str().unwrap(),
        "text/event-stream"
    );
    let mut stream = r.bytes_stream();
    use futures_util::StreamExt;
    let first = stream.next().await.unwrap().unwrap();
    assert!(first.starts_with(b"data: "), "{first:?}");
    // The engine is still generating when the first chunk is here.
    let running: usize = f.engines.iter().map(|e| e.stats().running).sum();
    assert_eq!(running, 1);
    // The client leaves: the engine's request ends as cancelled, and the
    // router no longer counts it in flight.
    drop(stream);
    let t = Instant::now();
    loop {
        let cancelled: u64 = f.engines.iter().map(|e| e.stats().cancelled).sum();
        let (_, workers) = f.get(&format!("/workers?model_name={MODEL}")).await;
        let active: u64 = workers
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w["feeds"]["0"]["active_requests"].as_u64().unwrap())
            .sum();
        if cancelled == 1 && active == 0 {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "cancelled {cancelled}, in flight {active}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A whole stream, read to the end: one chunk per token, then [DONE].
    body["max_tokens"] = json!(5);
    let text = f
        .post("/v1/chat/completions", &body)
        .await
        .text()
        .await
        .unwrap();
    let chunks = text.matches("data: ").count();
    assert!(chunks >= 6, "{text}");
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn requests_fail_over_from_an_engine_that_refuses_them() {
    let f = fleet(2).await;
    // Each conversation's cache is on its home engine, which then answers
    // 503 (or 429): the gateway sends the next request to the other one.
    for (c, fault) in [Fault::Unavailable, Fault::RateLimited]
        .into_iter()
        .enumerate()
    {
        let opening = chat(&[("user", words(c * 1000, 64))], 2);
        let (home, _) = f.ok("/v1/chat/completions", &opening).await;
        let toks = f
            .tok
            .prompt_tokens(Endpoint::ChatCompletions, &opening)
            .unwrap();
        f.wait_overlap(home, &toks, (toks.len() / BS) as u64).await;
        f.engines[home as usize].set_fault(fault);
        let (served, _) = f.ok("/v1/chat/completions", &opening).await;
        assert_ne!(served, home, "{fault:?}");
        f.engines[home as usize].set_fault(Fault::None);
    }
    let (_, metrics) = (0, f.http.get(format!("{}/metrics", f.router)).send().await);
    let text = metrics.unwrap().text().await.unwrap();
    let retries: f64 = text
        .lines()
        .find(|l| l.starts_with("kvrouter_gateway_retries_total"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    assert!(retries >= 2.0, "retries {retries}");
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_builtin_tokenizer_needs_no_files() {
    let f = fleet_with(2, true, 200.0).await;
    let body = json!({"model": MODEL, "prompt": "x".repeat(100), "max_tokens": 2});
    let toks = f.tok.prompt_tokens(Endpoint::Completions, &body).unwrap();
    assert_eq!(toks.len(), 100, "one token per byte");
    let (home, hit) = f.ok("/v1/completions", &body).await;
    assert_eq!(hit, 0);
    f.wait_overlap(home, &toks, (100 / BS) as u64).await;
    let (again, hit) = f.ok("/v1/completions", &body).await;
    assert_eq!((again, hit), (home, (100 / BS * BS) as u64));
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_conversations_history_is_tokenized_once() {
    let f = fleet_with(2, true, 200.0).await;
    let metrics = || async {
        let text = (f.http.get(format!("{}/metrics", f.router)).send().await)
            .unwrap()
            .text()
            .await
            .unwrap();
        let count = |name: &str| -> f64 {
            text.lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.rsplit(' ').next())
                .and_then(|v| v.parse().ok())
                .unwrap_or(0.0)
        };
        (
            count("kvrouter_gateway_tokenizer_cache_hit_tokens_total"),
            count("kvrouter_gateway_tokenizer_cache_miss_tokens_total"),
            count("kvrouter_gateway_tokenizer_deferred_bytes_total"),
            text.clone(),
        )
    };
    // Turn one: 5,000 bytes (past the cache's 1 KiB chunks) no engine
    // holds: routed on the first quarter of its first chunk, the rest
    // tokenized after routing, into the cache. Turn two resends it with more text, which the
    // gateway takes from its cache for all but the last chunk.
    let history: String = (0..5000)
        .map(|i| (b'a' + (i * 7 % 26) as u8) as char)
        .collect();
    let first = json!({"model": MODEL, "prompt": history, "max_tokens": 2});
    let toks = f.tok.prompt_tokens(Endpoint::Completions, &first).unwrap();
    let (home, _) = f.ok("/v1/completions", &first).await;
    let mut filled = metrics().await;
    for _ in 0..200 {
        if filled.0 + filled.1 >= 5000.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        filled = metrics().await;
    }
    let (hits, misses, deferred, text) = filled;
    assert_eq!((hits, misses), (0.0, 5000.0), "{text}");
    assert!(
        (4500.0..4800.0).contains(&deferred),
        "{deferred} bytes left for after routing:\n{text}"
    );
    f.wait_overlap(home, &toks, (toks.len() / BS) as u64).await;
    let second =
        json!({"model": MODEL, "prompt": format!("{history} and then more"), "max_tokens": 2});
    let (again, hit) = f.ok("/v1/completions", &second).await;
    // Routed on the same blocks the engine stored: where the history is.
    assert_eq!((again, hit), (home, (toks.len() / BS * BS) as u64));
    let (hits, misses, _, text) = metrics().await;
    assert!(hits >= 3000.0, "{hits} tokens from the cache:\n{text}");
    assert_eq!(hits + misses, (5000 + 5000 + 14) as f64, "{text}");
    f.stop().await;
}
