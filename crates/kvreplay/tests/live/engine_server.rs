//! The simulated engine over real sockets on loopback: OpenAI requests in,
//! vLLM's KV event batches out (SUB and replay DEALER), timing by the time
//! model, cancellation, errors, injected faults, and a router fed by it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kvreplay::server::{Fault, SimEngine, SimEngineConfig, SimEngineHandle};
use kvrouter::tokenize::{Endpoint, ModelTokenizer};
use kvrouter::wire::{decode_batch, Batch, WireEvent};
use serde_json::{json, Value};

const MODEL: &str = "sim";
const BS: usize = 16;

/// A running engine, its tokenizer and an HTTP client.
struct Fixture {
    engine: SimEngineHandle,
    tok: Arc<ModelTokenizer>,
    http: reqwest::Client,
    _dir: tempfile::TempDir,
}

async fn start(tweak: impl FnOnce(&mut SimEngineConfig)) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let model = test_support::tokenizer::write_model_dir(&dir.path().join("model"));
    let tok = Arc::new(ModelTokenizer::from_dir(&model).unwrap());
    let mut cfg = SimEngineConfig::new(MODEL, Arc::clone(&tok));
    cfg.engine.block_size = BS;
    cfg.engine.decode_tps = 1000.0;
    cfg.engine.prefill_tps = 100_000.0;
    cfg.replay = Some("tcp://127.0.0.1:*".into());
    tweak(&mut cfg);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let engine = SimEngine::start(cfg, listener).await.unwrap();
    Fixture {
        engine,
        tok,
        http: reqwest::Client::new(),
        _dir: dir,
    }
}

impl Fixture {
    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.engine.base_url())
    }

    async fn post(&self, path: &str, body: &Value) -> reqwest::Response {
        self.http
            .post(self.url(path))
            .json(body)
            .send()
            .await
            .unwrap()
    }

    /// A non-streamed request that must succeed; its JSON.
    async fn ok(&self, path: &str, body: &Value) -> Value {
        let r = self.post(path, body).await;
        let s = r.status();
        let v: Value = r.json().await.unwrap();
        assert_eq!(s, 200, "{v}");
        v
    }

    fn tokens(&self, ep: Endpoint, body: &Value) -> Vec<u32> {
        self.tok.prompt_tokens(ep, body).unwrap()
    }

    /// A SUB socket on the engine's events, given time to connect.
    fn subscribe(&self) -> Sub {
        let ctx = zmq::Context::new();
        let s = ctx.socket(zmq::SUB).unwrap();
        s.set_subscribe(b"").unwrap();
        s.set_rcvtimeo(3000).unwrap();
        s.connect(self.engine.events_endpoint()).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        Sub { _ctx: ctx, s }
    }

    async fn metric(&self, name: &str) -> f64 {
        let text = self
            .http
            .get(self.url("/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        text.lines()
            .find(|l| l.starts_with(&format!("{name}{{")))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {text}"))
    }
}

/// A subscriber on an engine's events.
struct Sub {
    _ctx: zmq::Context,
    s: zmq::Socket,
}

/// One live message: topic, seq, payload and its decoding.
struct Live {
    topic: Vec<u8>,
    seq: u64,
    payload: Vec<u8>,
    batch: Batch,
}

impl Sub {
    fn next(&self) -> Live {
        let f = self.s.recv_multipart(0).expect("a batch within 3 s");
        assert_eq!(f.len(), 3, "[topic, seq, payload]");
        let seq = u64::from_be_bytes(f[1].as_slice().try_into().expect("an 8-byte seq"));
        let batch = decode_batch(&f[2]).unwrap();
        Live {
            topic: f[0].clone(),
            seq,
            payload: f[2].clone(),
            batch,
        }
    }

    /// Nothing more arrives within `ms`.
    fn quiet(&self, ms: i32) -> bool {
        self.s.poll(zmq::POLLIN, i64::from(ms)).unwrap() == 0
    }
}

/// A prompt of `n` words (`t{seed}`, `t{seed+1}`, ...).
fn words(seed: usize, n: usize) -> String {
    (seed..seed + n)
        .map(|i| format!("t{i}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn completion(prompt: &str, max_tokens: u32) -> Value {
    json!({"model": MODEL, "prompt": prompt, "max_tokens": max_tokens})
}

fn stored(b: &Batch) -> Vec<(Vec<u64>, Option<u64>, Vec<u32>)> {
    b.events
        .iter()
        .filter_map(|e| match e {
            WireEvent::Stored {
                block_hashes,
                parent,
                token_ids,
                block_size,
                medium,
                lora_name,
            } => {
                assert_eq!(*block_size, BS as u64);
                assert_eq!(medium.as_deref(), Some("GPU"));
                assert!(lora_name.is_none());
                Some((block_hashes.clone(), *parent, token_ids.clone()))
            }
            _ => None,
        })
        .collect()
}

fn removed(b: &Batch) -> Vec<u64> {
    b.events
        .iter()
        .flat_map(|e| match e {
            WireEvent::Removed { block_hashes, .. } => block_hashes.clone(),
            _ => Vec::new(),
        })
        .collect()
}

fn cached(v: &Value) -> u64 {
    v["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap()
}

/// Reads a server-sent event stream: each `data:` payload and when it
/// arrived.
async fn read_sse(mut r: reqwest::Response) -> Vec<(Instant, String)> {
    let mut buf = String::new();
    let mut out = Vec::new();
    while let Some(c) = r.chunk().await.unwrap() {
        buf.push_str(std::str::from_utf8(&c).unwrap());
        while let Some(end) = buf.find("\n\n") {
            let ev: String = buf.drain(..end + 2).collect();
            let data = ev.trim_end().strip_prefix("data: ").expect("a data line");
            out.push((Instant::now(), data.to_string()));
        }
    }
    assert!(buf.is_empty(), "a partial event at the end: {buf:?}");
    out
}

/// Time to the response's headers (the first token, when streamed), and
/// the response.
async fn timed(f: &Fixture, path: &str, body: &Value) -> (Duration, reqwest::Response) {
    let t = Instant::now();
    let r = f.post(path, body).await;
    (t.elapsed(), r)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stored_blocks_are_the_prompt_blocks_and_a_repeat_hits_them_sooner() {
    // 2,000 tokens/s: a 170-token prompt takes 85 ms to prefill cold.
    let f = start(|c| c.engine.prefill_tps = 2000.0).await;
    let sub = f.subscribe();
    let mut body = completion(&words(0, 169), 4);
    let tokens = f.tokens(Endpoint::Completions, &body);
    assert_eq!(tokens.len(), 170, "BOS and 169 words");
    body["stream"] = json!(true);

    let (cold, r) = timed(&f, "/v1/completions", &body).await;
    assert_eq!(r.status(), 200);
    read_sse(r).await;
    let live = sub.next();
    assert_eq!((live.seq, live.topic.as_slice()), (0, &b""[..]));
    let s = stored(&live.batch);
    assert_eq!(s.len(), 1, "{:?}", live.batch);
    let (hashes, parent, toks) = &s[0];
    // Ten full blocks; the six-token tail is not cached.
    assert_eq!((hashes.len(), *parent), (10, None));
    assert_eq!(toks[..], tokens[..160]);
    assert_eq!(
        kvindex::local_block_hashes(toks, BS, None),
        kvindex::local_block_hashes(&tokens, BS, None)
    );

    let (warm, r) = timed(&f, "/v1/completions", &body).await;
    let events = read_sse(r).await;
    assert!(cold >= Duration::from_millis(75), "cold TTFT {cold:?}");
    assert!(warm * 2 < cold, "warm {warm:?} against cold {cold:?}");
    assert_eq!(events.len(), 4 + 1, "four tokens and [DONE]");
    assert!(sub.quiet(200), "a full hit stores nothing");

    // Non-streamed: the usage says what was cached.
    body["stream"] = json!(false);
    let v = f.ok("/v1/completions", &body).await;
    assert_eq!(cached(&v), 160);
    assert_eq!(v["usage"]["prompt_tokens"], 170);
    assert_eq!(v["usage"]["completion_tokens"], 4);
    assert_eq!(v["usage"]["total_tokens"], 174);
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    let other = f
        .ok("/v1/completions", &completion(&words(500, 40), 2))
        .await;
    assert_eq!(cached(&other), 0);
    f.engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chat_turns_extend_the_cached_conversation() {
    let f = start(|_| {}).await;
    let sub = f.subscribe();
    let first = json!({"model": MODEL, "max_tokens": 3,
        "messages": [{"role": "user", "content": words(0, 40)}]});
    let t1 = f.tokens(Endpoint::ChatCompletions, &first);
    let v = f.ok("/v1/chat/completions", &first).await;
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    let answer = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert_eq!(answer.split(' ').count(), 3, "{answer:?}");
    assert_eq!(v["usage"]["prompt_tokens"], t1.len());
    let b1 = stored(&sub.next().batch);
    assert_eq!(b1[0].2[..], t1[..t1.len() / BS * BS]);

    let second = json!({"model": MODEL, "max_completion_tokens": 2, "max_tokens": 50,
        "messages": [{"role": "user", "content": words(0, 40)},
                     {"role": "assistant", "content": answer},
                     {"role": "user", "content": words(100, 60)}]});
    let t2 = f.tokens(Endpoint::ChatCompletions, &second);
    let v = f.ok("/v1/chat/completions", &second).await;
    assert_eq!(
        v["usage"]["completion_tokens"], 2,
        "max_completion_tokens wins"
    );
    let hits = t1.len() / BS;
    assert_eq!(cached(&v), (hits * BS) as u64);
    let b2 = stored(&sub.next().batch);
    let (hashes, parent, toks) = &b2[0];
    assert_eq!(
        *parent,
        b1[0].0.last().copied(),
        "chained onto the first turn"
    );
    assert_eq!(toks[..], t2[hits * BS..(hits + hashes.len()) * BS]);
    assert_eq!(hits + hashes.len(), t2.len() / BS);
    f.engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn streams_one_chunk_per_token_at_the_decode_pace() {
    // 50 tokens/s: a chunk every 20 ms.
    let f = start(|c| c.engine.decode_tps = 50.0).await;
    for (path, body) in [
        (
            "/v1/completions",
            json!({"model": MODEL, "prompt": words(0, 30), "max_tokens": 8, "stream": true,
                   "stream_options": {"include_usage": true}}),
        ),
        (
            "/v1/chat/completions",
            json!({"model": MODEL, "max_tokens": 8, "stream": true,
                   "stream_options": {"include_usage": true},
                   "messages": [{"role": "user", "content": words(0, 30)}]}),
        ),
    ] {
        let r = f.post(path, &body).await;
        assert_eq!(r.status(), 200);
        let ct = r.headers()["content-type"].to_str().unwrap().to_string();
        assert!(ct.starts_with("text/event-stream"), "{ct}");
        let events = read_sse(r).await;
        assert_eq!(events.last().unwrap().1, "[DONE]");
        let chunks: Vec<(Instant, Value)> = events[..events.len() - 1]
            .iter()
            .map(|(t, d)| (*t, serde_json::from_str(d).unwrap()))
            .collect();
        let (tokens, usage): (Vec<_>, Vec<_>) = chunks
            .iter()
            .partition(|(_, c)| !c["choices"].as_array().unwrap().is_empty());
        assert_eq!(tokens.len(), 8, "{path}: one chunk per token");
        assert_eq!(usage.len(), 1, "{path}: one usage chunk, last");
        assert_eq!(usage[0].1["usage"]["completion_tokens"], 8);
        assert_eq!(chunks.last().unwrap().1["usage"]["completion_tokens"], 8);
        let spread = tokens[7].0 - tokens[0].0;
        assert!(spread >= Duration::from_millis(100), "{path}: {spread:?}");
        for (i, (_, c)) in tokens.iter().enumerate() {
            let ch = &c["choices"][0];
            let want = if i == 7 { json!("length") } else { Value::Null };
            assert_eq!(ch["finish_reason"], want, "{path} chunk {i}");
            if path.contains("chat") {
                assert_eq!(c["object"], "chat.completion.chunk");
                assert!(ch["delta"]["content"].is_string());
                assert_eq!(ch["delta"].get("role").is_some(), i == 0);
            } else {
                assert_eq!(c["object"], "text_completion");
            }
        }
        // The streamed text is the whole response's.
        let text: String = tokens
            .iter()
            .map(|(_, c)| {
                let ch = &c["choices"][0];
                ch["text"]
                    .as_str()
                    .or(ch["delta"]["content"].as_str())
                    .unwrap()
                    .to_string()
            })
            .collect();
        let mut whole = body.clone();
        whole["stream"] = json!(false);
        let v = f.ok(path, &whole).await;
        let want = &v["choices"][0];
        let want = want["text"]
            .as_str()
            .or(want["message"]["content"].as_str());
        assert_eq!(Some(text.as_str()), want);
    }
    f.engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn speedup_divides_every_duration() {
    // 10 tokens at 10 tokens/s: 1 s of decode, 50 ms at 20x.
    let f = start(|c| {
        c.engine.decode_tps = 10.0;
        c.speedup = 20.0;
    })
    .await;
    let t = Instant::now();
    f.ok("/v1/completions", &completion(&words(0, 20), 10))
        .await;
    let took = t.elapsed();
    assert!(took >= Duration::from_millis(45), "{took:?}");
    assert!(took < Duration::from_millis(500), "{took:?}");
    f.engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn seqs_are_consecutive_and_replay_resends_the_ring() {
    let f = start(|c| c.replay_buffer = 3).await;
    let sub = f.subscribe();
    let mut live = Vec::new();
    for i in 0..5 {
        f.ok("/v1/completions", &completion(&words(i * 100, 40), 1))
            .await;
        live.push(sub.next());
    }
    let seqs: Vec<u64> = live.iter().map(|l| l.seq).collect();
    assert_eq!(seqs, vec![0, 1, 2, 3, 4]);

    let ctx = zmq::Context::new();
    let d = ctx.socket(zmq::DEALER).unwrap();
    d.set_rcvtimeo(3000).unwrap();
    d.connect(f.engine.replay_endpoint().unwrap()).unwrap();
    for (from, want) in [(3u64, vec![3u64, 4]), (0, vec![2, 3, 4]), (9, vec![])] {
        d.send_multipart([&b""[..], &from.to_be_bytes()[..]], 0)
            .unwrap();
        let mut got = Vec::new();
        loop {
            let fr = d.recv_multipart(0).expect("a reply within 3 s");
            assert_eq!(fr.len(), 3);
            assert!(fr[0].is_empty());
            let seq = i64::from_be_bytes(fr[1].as_slice().try_into().unwrap());
            if seq == -1 {
                assert!(fr[2].is_empty());
                break;
            }
            assert_eq!(fr[2], live[seq as usize].payload, "seq {seq}");
            got.push(seq as u64);
        }
        assert_eq!(got, want, "from {from}");
    }
    f.engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_full_pool_evicts_and_publishes_removed() {
    let f = start(|c| c.engine.capacity_blocks = 8).await;
    let sub = f.subscribe();
    let mut hashes = Vec::new();
    for i in 0..3 {
        // BOS + 63 words: four blocks each.
        let v = f
            .ok("/v1/completions", &completion(&words(i * 100, 63), 1))
            .await;
        assert_eq!(cached(&v), 0);
        let b = sub.next().batch;
        let s = stored(&b);
        assert_eq!(s[0].0.len(), 4);
        hashes.push(s[0].0.clone());
        if i < 2 {
            assert!(removed(&b).is_empty());
        } else {
            // The least recently used prompt's blocks make room.
            let mut r = removed(&b);
            r.sort_unstable();
            let mut want = hashes[0].clone();
            want.sort_unstable();
            assert_eq!(r, want);
        }
    }
    // The others still hit; the evicted prompt misses.
    let v = f
        .ok("/v1/completions", &completion(&words(200, 63), 1))
        .await;
    assert_eq!(cached(&v), 64);
    let v = f.ok("/v1/completions", &completion(&words(0, 63), 1)).await;
    assert_eq!(cached(&v), 0);
    assert_eq!(stored(&sub.next().batch)[0].0, hashes[0], "stored again");

    // A reset drops everything with one AllBlocksCleared.
    let r = f.http.post(f.url("/reset_prefix_cache")).send().await;
    assert_eq!(r.unwrap().status(), 200);
    assert_eq!(sub.next().batch.events, vec![WireEvent::Cleared]);
    let v = f.ok("/v1/completions", &completion(&words(0, 63), 1)).await;
    assert_eq!(cached(&v), 0);
    f.engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_that_leaves_frees_its_request() {
    // Eight blocks, one request at a time, 10 tokens/s: a 100-token answer
    // would hold the pool for 10 s.
    let f = start(|c| {
        c.engine.capacity_blocks = 8;
        c.engine.max_running = 1;
        c.engine.decode_tps = 10.0;
    })
    .await;
    let sub = f.subscribe();
    let mut long = completion(&words(0, 127), 100);
    long["stream"] = json!(true);
    let mut r = f.post("/v1/completions", &long).await;
    assert!(r.chunk().await.unwrap().is_some(), "the first token");
    let a = stored(&sub.next().batch);
    assert_eq!(a[0].0.len(), 8);
    assert_eq!(f.metric("vllm:kv_cache_usage_perc").await, 1.0);
    assert!(!f.engine.reset_prefix_cache(), "blocks in use");
    let busy = f.http.post(f.url("/reset_prefix_cache")).send().await;
    error(busy.unwrap(), 409).await;

    // Queued behind it; its client gives up while it waits.
    let waiting = f
        .http
        .post(f.url("/v1/completions"))
        .json(&completion(&words(300, 10), 1))
        .timeout(Duration::from_millis(300))
        .send()
        .await;
    assert!(waiting.unwrap_err().is_timeout());
    assert_eq!(f.metric("vllm:num_requests_running").await, 1.0);
    let t = Instant::now();
    while f.metric("vllm:num_requests_waiting").await != 0.0 {
        assert!(t.elapsed() < Duration::from_secs(3), "still queued");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // The streaming client leaves mid-stream: another prefix of eight
    // blocks fits at once.
    drop(r);
    let t = Instant::now();
    let v = f
        .ok("/v1/completions", &completion(&words(1000, 127), 1))
        .await;
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    assert_eq!(cached(&v), 0);
    let b = sub.next().batch;
    let mut r = removed(&b);
    r.sort_unstable();
    let mut want = a[0].0.clone();
    want.sort_unstable();
    assert_eq!(r, want, "the abandoned prompt's blocks were evicted");
    assert_eq!(f.metric("arbor_engine_requests_cancelled_total").await, 2.0);
    let st = f.engine.stats();
    assert_eq!((st.received, st.finished, st.cancelled), (3, 1, 2));
    assert_eq!((st.running, st.waiting, st.blocks_in_use), (0, 0, 0));
    assert_eq!(st.blocks_cached, 8);
    f.engine.shutdown().await;
}

/// An error response: its status and OpenAI's error shape.
async fn error(r: reqwest::Response, status: u16) -> Value {
    assert_eq!(r.status(), status);
    let v: Value = r.json().await.unwrap();
    let e = &v["error"];
    assert!(!e["message"].as_str().unwrap().is_empty(), "{v}");
    assert!(e["type"].is_string() && e["param"].is_null(), "{v}");
    assert_eq!(e["code"], status, "{v}");
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_requests_get_openai_errors_and_nothing_breaks() {
    let f = start(|c| {
        c.max_model_len = Some(32);
        c.max_body_bytes = 1024;
        c.max_tokens = 5;
    })
    .await;
    let raw = |path: &'static str, body: Vec<u8>| {
        f.http
            .post(f.url(path))
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    let v = error(
        raw("/v1/completions", b"{not json".to_vec()).await.unwrap(),
        400,
    )
    .await;
    assert_eq!(v["error"]["type"], "invalid_request_error");
    error(
        raw("/v1/chat/completions", b"[1,2]".to_vec())
            .await
            .unwrap(),
        400,
    )
    .await;
    error(raw("/v1/completions", vec![b' '; 2000]).await.unwrap(), 413).await;
    let other = json!({"model": "other", "prompt": "t1"});
    error(f.post("/v1/completions", &other).await, 404).await;
    let long = completion(&words(0, 40), 1);
    let v = error(f.post("/v1/completions", &long).await, 400).await;
    assert!(
        v["error"]["message"].as_str().unwrap().contains("32"),
        "{v}"
    );
    for bad in [
        json!({"model": MODEL}),
        json!({"model": MODEL, "prompt": 7}),
        json!({"model": MODEL, "prompt": "t1", "max_tokens": 0}),
        json!({"model": MODEL, "prompt": "t1", "max_tokens": -3}),
        json!({"model": MODEL, "prompt": "t1", "max_tokens": "9"}),
        json!({"model": MODEL, "prompt": "t1", "stream": "yes"}),
        json!({"model": MODEL, "prompt": "t1", "stream_options": 1}),
    ] {
        error(f.post("/v1/completions", &bad).await, 400).await;
    }
    for bad in [
        json!({"model": MODEL}),
        json!({"model": MODEL, "messages": []}),
        json!({"model": MODEL, "messages": "hi"}),
    ] {
        error(f.post("/v1/chat/completions", &bad).await, 400).await;
    }
    error(f.http.get(f.url("/nope")).send().await.unwrap(), 404).await;
    // Odd but valid: no model field, more tokens than the cap.
    let v = f
        .ok(
            "/v1/completions",
            &json!({"prompt": "t1 t2", "max_tokens": 1000}),
        )
        .await;
    assert_eq!(v["usage"]["completion_tokens"], 5, "capped");
    // Arbitrary bytes never take the server down.
    for junk in [
        &b"\xff\xfe"[..],
        b"",
        b"null",
        b"{\"prompt\": [[[[[[1]]]]]]}",
        b"{\"prompt\": [4294967296]}",
        b"{\"messages\": [{\"role\": 1}]}",
    ] {
        let path = if junk.starts_with(b"{\"messages") {
            "/v1/chat/completions"
        } else {
            "/v1/completions"
        };
        let r = raw(path, junk.to_vec()).await.unwrap();
        assert!(!r.status().is_server_error(), "{junk:?}: {}", r.status());
    }
    let models: Value = f
        .http
        .get(f.url("/v1/models"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["data"][0]["id"], MODEL);
    assert_eq!(models["data"][0]["max_model_len"], 32);
    let health = f.http.get(f.url("/health")).send().await.unwrap();
    assert_eq!(health.status(), 200);
    f.engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn injected_faults() {
    let f = start(|c| c.fail_every = Some(3)).await;
    let body = completion("t1 t2 t3", 1);
    let mut statuses = Vec::new();
    for _ in 0..6 {
        statuses.push(f.post("/v1/completions", &body).await.status().as_u16());
    }
    assert_eq!(statuses, [200, 200, 503, 200, 200, 503]);

    f.engine.set_fault(Fault::RateLimited);
    let r = f.post("/v1/completions", &body).await;
    assert_eq!(r.headers()["retry-after"], "1");
    error(r, 429).await;
    f.engine.set_fault(Fault::Unavailable);
    for _ in 0..2 {
        error(f.post("/v1/chat/completions", &json!({})).await, 503).await;
    }
    // The 10th request.
    f.engine.set_fault(Fault::Hang);
    let hung = f
        .http
        .post(f.url("/v1/completions"))
        .json(&body)
        .timeout(Duration::from_millis(300))
        .send()
        .await;
    assert!(hung.unwrap_err().is_timeout());
    f.engine.set_fault(Fault::None);
    // --fail-every still counts: the 12th fails.
    assert_eq!(f.post("/v1/completions", &body).await.status(), 200);
    assert_eq!(f.post("/v1/completions", &body).await.status(), 503);
    assert_eq!(f.post("/v1/completions", &body).await.status(), 200);

    // Shutdown does not wait for a hung request.
    f.engine.set_fault(Fault::Hang);
    let pending = tokio::spawn({
        let (http, url) = (f.http.clone(), f.url("/v1/completions"));
        let body = body.clone();
        async move { http.post(url).json(&body).send().await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let t = Instant::now();
    f.engine.shutdown().await;
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    let r = pending.await.unwrap().unwrap();
    assert_eq!(r.status(), 503);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_router_fed_by_the_engine_scores_what_it_cached() {
    let f = start(|c| {
        c.engine_id = 7;
        c.engine.capacity_blocks = 8;
    })
    .await;
    // Three four-block prompts into an eight-block pool: the third evicts
    // the first. The router subscribes after the first two: the third's
    // seq shows it the gap, and it replays the first two batches.
    let prompts: Vec<Value> = (0..3).map(|i| completion(&words(i * 100, 63), 1)).collect();
    for p in &prompts[..2] {
        f.ok("/v1/completions", p).await;
    }
    let mut args = kvrouter::RouterArgs::defaults();
    args.model = MODEL.into();
    args.block_size = BS as u64;
    let spec = format!(
        "7={},replay={}",
        f.engine.events_endpoint(),
        f.engine.replay_endpoint().unwrap()
    );
    args.workers = vec![spec.parse().unwrap()];
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let router = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(kvrouter::serve(args, listener, async {
        let _ = stopped.await;
    }));
    // Subscribed before the third batch is published.
    tokio::time::sleep(Duration::from_millis(500)).await;
    f.ok("/v1/completions", &prompts[2]).await;
    let score = |tokens: Vec<u32>| {
        let (http, url) = (f.http.clone(), format!("{router}/query"));
        async move {
            let v: Value = http
                .post(url)
                .json(&json!({"model_name": MODEL, "token_ids": tokens}))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            v["scores"]["7"]["0"].as_u64().unwrap_or(0)
        }
    };
    let want: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| f.tokens(Endpoint::Completions, p))
        .collect();
    let expected = [0u64, 64, 64];
    let t = Instant::now();
    loop {
        let mut got = Vec::new();
        for toks in &want {
            got.push(score(toks.clone()).await);
        }
        if got == expected {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "router scores {got:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let workers: Value = f
        .http
        .get(format!("{router}/workers?model_name={MODEL}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let feed = &workers[0]["feeds"]["0"];
    assert_eq!(feed["last_seq"], 2, "{workers}");
    assert!(feed["replays"].as_u64().unwrap() >= 1, "{workers}");
    // The engine agrees: the last two hit, in full.
    for (p, w) in prompts.iter().zip(expected).skip(1).rev() {
        assert_eq!(cached(&f.ok("/v1/completions", p).await), w);
    }
    // A reset empties the router's view of the engine too.
    assert!(f.engine.reset_prefix_cache());
    let t = Instant::now();
    for toks in &want {
        while score(toks.clone()).await != 0 {
            assert!(t.elapsed() < Duration::from_secs(10), "not cleared");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let _ = stop.send(());
    served.await.unwrap().unwrap();
    f.engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn render_gives_the_tokens_a_request_would_be_served_on() {
    let f = start(|_| {}).await;
    let body = completion(&words(5, 40), 4);
    let v = f.ok("/v1/completions/render", &body).await;
    assert_eq!(
        v[0]["token_ids"],
        json!(f.tokens(Endpoint::Completions, &body))
    );
    let chat = json!({"model": MODEL, "messages": [{"role": "user", "content": words(9, 20)}]});
    let v = f.ok("/v1/chat/completions/render", &chat).await;
    assert_eq!(
        v["token_ids"],
        json!(f.tokens(Endpoint::ChatCompletions, &chat))
    );
    // Nothing was generated or cached.
    assert_eq!(f.engine.stats().received, 0);
    assert_eq!(f.engine.stats().blocks_cached, 0);
    let r = f
        .post(
            "/v1/completions/render",
            &json!({"model": "other", "prompt": "t1"}),
        )
        .await;
    assert_eq!(r.status(), 404);
    f.engine.shutdown().await;
}
