//! The OpenAI gateway on a real router, in front of engines scripted here
//! (small axum servers on loopback): pass-through, streaming, accounting,
//! cancellation, failover, breaker, health checks, timeouts, the
//! concurrency limit, drain and every error shape.

use std::future::Future;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use test_support::tokenizer::{word_id, write_model_dir};

use crate::support::{args, Router, BS};

/// What a scripted engine does with a request.
#[derive(Debug, Clone)]
enum Mode {
    /// Answers [`ANSWER`] at once.
    Json,
    /// `n` SSE chunks `gap` apart (the first after one gap), then `[DONE]`.
    Stream { n: usize, gap: Duration },
    /// `n` chunks, then the connection breaks.
    BreakAfter { n: usize, gap: Duration },
    /// This status, with an OpenAI error body naming the engine.
    Status(u16),
    /// Never answers.
    Hang,
}

const ANSWER: &str = r#"{"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":" t1 t2","finish_reason":"length"}],"usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7}}"#;

fn chunk(i: usize) -> String {
    format!("data: {{\"id\":\"cmpl-1\",\"choices\":[{{\"index\":0,\"text\":\" t{i}\"}}]}}\n\n")
}

/// The whole SSE body of a `Stream { n, .. }` engine.
fn sse(n: usize) -> String {
    (0..n).map(chunk).collect::<String>() + "data: [DONE]\n\n"
}

/// What an engine saw.
#[derive(Default)]
struct Seen {
    requests: AtomicUsize,
    finished: AtomicUsize,
    cancelled: AtomicUsize,
    bodies: Mutex<Vec<(String, Vec<u8>)>>,
}

struct EngineState {
    mode: Mutex<Mode>,
    health: AtomicU16,
    seen: Seen,
}

/// A scripted engine on a free loopback port, from its own runtime thread.
struct Engine {
    url: String,
    st: Arc<EngineState>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Engine {
    fn start(mode: Mode) -> Self {
        let st = Arc::new(EngineState {
            mode: Mutex::new(mode),
            health: AtomicU16::new(200),
            seen: Seen::default(),
        });
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let state = Arc::clone(&st);
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .expect("a runtime");
            rt.block_on(async move {
                let l = tokio::net::TcpListener::bind("127.0.0.1:0")
                    .await
                    .expect("bind");
                addr_tx.send(l.local_addr().expect("addr")).expect("send");
                let app = axum::Router::new()
                    .route("/v1/completions", axum::routing::post(answer))
                    .route("/v1/chat/completions", axum::routing::post(answer))
                    .route("/health", axum::routing::get(health))
                    .with_state(state);
                tokio::select! {
                    _ = axum::serve(l, app) => {}
                    _ = rx => {}
                }
            });
            // Dropping the runtime ends hung handlers too.
        });
        let addr = addr_rx.recv().expect("the engine's address");
        Self {
            url: format!("http://{addr}"),
            st,
            stop: Some(tx),
            thread: Some(thread),
        }
    }

    fn set(&self, m: Mode) {
        *self.st.mode.lock().unwrap() = m;
    }

    fn requests(&self) -> usize {
        self.st.seen.requests.load(SeqCst)
    }

    fn last(&self) -> (String, Vec<u8>) {
        self.st
            .seen
            .bodies
            .lock()
            .unwrap()
            .last()
            .cloned()
            .expect("a request")
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn health(State(st): State<Arc<EngineState>>) -> StatusCode {
    StatusCode::from_u16(st.health.load(SeqCst)).unwrap_or(StatusCode::OK)
}

async fn answer(State(st): State<Arc<EngineState>>, uri: Uri, body: Bytes) -> Response {
    st.seen.requests.fetch_add(1, SeqCst);
    st.seen
        .bodies
        .lock()
        .unwrap()
        .push((uri.path().to_string(), body.to_vec()));
    let mode = st.mode.lock().unwrap().clone();
    let stream = |n, gap, broken| {
        let s = Sse {
            i: 0,
            n,
            broken,
            gap,
            sleep: Box::pin(tokio::time::sleep(gap)),
            st: Arc::clone(&st),
            done: false,
        };
        (
            [(header::CONTENT_TYPE, "text/event-stream")],
            Body::from_stream(s),
        )
            .into_response()
    };
    match mode {
        Mode::Json => {
            st.seen.finished.fetch_add(1, SeqCst);
            ([(header::CONTENT_TYPE, "application/json")], ANSWER).into_response()
        }
        Mode::Stream { n, gap } => stream(n, gap, false),
        Mode::BreakAfter { n, gap } => stream(n, gap, true),
        Mode::Status(c) => (
            StatusCode::from_u16(c).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            [(header::CONTENT_TYPE, "application/json")],
            format!(
                r#"{{"error":{{"message":"engine says {c}","type":"e","param":null,"code":{c}}}}}"#
            ),
        )
            .into_response(),
        Mode::Hang => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            StatusCode::OK.into_response()
        }
    }
}

/// An engine's SSE body; counts itself cancelled if dropped unfinished.
struct Sse {
    i: usize,
    n: usize,
    broken: bool,
    gap: Duration,
    sleep: Pin<Box<tokio::time::Sleep>>,
    st: Arc<EngineState>,
    done: bool,
}

impl futures_util::Stream for Sse {
    type Item = Result<Bytes, std::io::Error>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        if self.sleep.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        let gap = self.gap;
        self.sleep.as_mut().reset(tokio::time::Instant::now() + gap);
        let i = self.i;
        self.i += 1;
        if i < self.n {
            return Poll::Ready(Some(Ok(Bytes::from(chunk(i)))));
        }
        self.done = true;
        if self.broken {
            self.st.seen.cancelled.fetch_add(1, SeqCst);
            return Poll::Ready(Some(Err(std::io::Error::other("engine crashed"))));
        }
        self.st.seen.finished.fetch_add(1, SeqCst);
        Poll::Ready(Some(Ok(Bytes::from("data: [DONE]\n\n"))))
    }
}

impl Drop for Sse {
    fn drop(&mut self) {
        if !self.done {
            self.st.seen.cancelled.fetch_add(1, SeqCst);
        }
    }
}

/// A url nothing listens on.
fn refused_url() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let a = l.local_addr().unwrap();
    drop(l);
    format!("http://{a}")
}

/// Router settings for the gateway: approximate mode (the engines here
/// publish no events), model "m" with the test tokenizer, no health checks.
fn gw_args(tok: &Path) -> kvrouter::RouterArgs {
    let mut a = args();
    a.no_kv_events = true;
    a.gateway = true;
    a.tokenizers = vec![format!("m={}", tok.display()).parse().unwrap()];
    a.health_interval = Duration::ZERO;
    a.first_byte_timeout = Duration::from_secs(10);
    a.request_timeout = Duration::from_secs(30);
    a
}

fn model_dir() -> (tempfile::TempDir, PathBuf) {
    let d = tempfile::tempdir().unwrap();
    let p = write_model_dir(&d.path().join("model"));
    (d, p)
}

fn register(r: &Router, id: u64, url: &str) {
    let (s, v) = r.post(
        "/register",
        &json!({"instance_id": id, "model_name": "m", "block_size": BS, "url": url}),
    );
    assert_eq!(s, 201, "{v}");
}

/// A gateway (flags from [`gw_args`], then `edit`) with a worker per
/// engine URL, ids 1, 2, ... in order.
fn gateway(
    tok: &Path,
    urls: &[impl AsRef<str>],
    edit: impl FnOnce(&mut kvrouter::RouterArgs),
) -> Router {
    let mut a = gw_args(tok);
    edit(&mut a);
    let r = Router::start(a);
    for (i, url) in urls.iter().enumerate() {
        register(&r, i as u64 + 1, url.as_ref());
    }
    r
}

fn client() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// POSTs raw bytes: (status, content type, body).
fn post(r: &Router, path: &str, body: impl Into<Vec<u8>>) -> (u16, String, Vec<u8>) {
    let resp = client()
        .post(r.url(path))
        .header("content-type", "application/json")
        .body(body.into())
        .send()
        .expect("the gateway answers");
    let s = resp.status().as_u16();
    let ct = resp
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap_or("").to_string())
        .unwrap_or_default();
    (s, ct, resp.bytes().map(|b| b.to_vec()).unwrap_or_default())
}

fn completion(r: &Router, body: &Value) -> (u16, Value) {
    let (s, _, b) = post(r, "/v1/completions", body.to_string());
    (s, serde_json::from_slice(&b).unwrap_or(Value::Null))
}

/// `n` words of the test vocabulary, from `t{from}`.
fn words(from: usize, n: usize) -> String {
    (from..from + n)
        .map(|i| format!("t{i}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Asserts an OpenAI error of `status` and `code`.
fn openai_error(got: (u16, Value), status: u16, code: &str) {
    let (s, v) = got;
    assert_eq!(s, status, "{v}");
    let e = &v["error"];
    assert_eq!(e["code"], code, "{v}");
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    assert!(e["param"].is_null(), "{v}");
    let kind = if status < 500 {
        "invalid_request_error"
    } else {
        "server_error"
    };
    assert_eq!(e["type"], kind, "{v}");
}

fn wait_until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn in_flight(r: &Router, id: u64) -> (u64, u64) {
    let f = r.feed("m", id, 0);
    (
        f["active_requests"].as_u64().expect("active_requests"),
        f["pending_prefill_blocks"].as_u64().expect("pending"),
    )
}

/// The value of the series starting with `prefix` in `/metrics`.
fn metric(r: &Router, prefix: &str) -> Option<f64> {
    r.text("/metrics")
        .lines()
        .find_map(|l| l.strip_prefix(prefix)?.trim().parse().ok())
}

#[test]
fn completions_and_chat_pass_through_unchanged_and_route_on_the_engines_tokens() {
    let (_d, tok) = model_dir();
    let e = Engine::start(Mode::Json);
    let r = gateway(&tok, &[&e.url], |_| {});
    // Spacing, key order and number forms as the client wrote them.
    let body = format!(
        r#"{{ "model":"m",  "prompt": "{}", "max_tokens": 2, "extra": {{"x": [1, 2.50]}} }}"#,
        words(1, 11)
    );
    let (s, ct, got) = post(&r, "/v1/completions", body.clone());
    assert_eq!(s, 200, "{}", String::from_utf8_lossy(&got));
    assert_eq!(ct, "application/json");
    assert_eq!(got, ANSWER.as_bytes());
    assert_eq!(e.last(), ("/v1/completions".to_string(), body.into_bytes()));
    // Routed on the tokens the engine sees: BOS, then the 11 words: 3
    // blocks, recorded on the worker (approximate mode).
    let ids: Vec<u32> = std::iter::once(1).chain((1..=11).map(word_id)).collect();
    let (_, q) = r.post("/query", &json!({"token_ids": ids, "model_name": "m"}));
    assert_eq!(q["scores"]["1"]["0"], 12, "{q}");
    // Chat: the rendered conversation, `<s>[user] t5 t6 [assistant] `.
    let chat = json!({"model": "m", "messages": [{"role": "user", "content": "t5 t6 t7"}]});
    let (s, _, got) = post(&r, "/v1/chat/completions", chat.to_string());
    assert_eq!(s, 200);
    assert_eq!(got, ANSWER.as_bytes());
    assert_eq!(
        e.last(),
        ("/v1/chat/completions".into(), chat.to_string().into_bytes())
    );
    let (_, q) = r.post(
        "/query",
        &json!({"token_ids": [1, 4, word_id(5), word_id(6), word_id(7), 5], "model_name": "m"}),
    );
    assert_eq!(q["scores"]["1"]["0"], 4, "{q}");
    // The models that have a worker with a url.
    let (s, m) = r.get("/v1/models");
    assert_eq!(s, 200);
    assert_eq!(m["object"], "list");
    assert_eq!(m["data"][0]["id"], "m", "{m}");
    assert_eq!(m["data"].as_array().unwrap().len(), 1);
    assert_eq!(r.get("/health").0, 200);
    assert_eq!(in_flight(&r, 1), (0, 0));
    assert_eq!(e.st.seen.finished.load(SeqCst), 2);
}

#[test]
fn approximate_mode_records_every_block_of_a_long_prompt() {
    // The built-in tokenizer has a prefix cache, so a prompt past its
    // first chunk could be routed before it is all tokenized; with no
    // events to say what engines hold, it must not be.
    let e = Engine::start(Mode::Json);
    let r = gateway(Path::new("builtin"), &[&e.url], |_| {});
    let prompt: String = (0..5000).map(|i| (b'a' + (i % 23) as u8) as char).collect();
    let body = json!({"model": "m", "prompt": prompt, "max_tokens": 2});
    let (s, _) = completion(&r, &body);
    assert_eq!(s, 200);
    let ids = kvrouter::tokenize::ModelTokenizer::builtin()
        .prompt_tokens(kvrouter::tokenize::Endpoint::Completions, &body)
        .unwrap();
    let (_, q) = r.post("/query", &json!({"token_ids": ids, "model_name": "m"}));
    // Scores count tokens of full blocks.
    let full = ids.len() / BS * BS;
    assert_eq!(q["scores"]["1"]["0"], full, "{q}");
    assert_eq!(
        metric(
            &r,
            "kvrouter_gateway_tokenizer_deferred_bytes_total{model=\"m\"}"
        )
        .unwrap_or(0.0),
        0.0
    );
}

#[test]
fn streams_are_relayed_as_they_come_and_accounted_from_route_to_end() {
    let (_d, tok) = model_dir();
    let e = Engine::start(Mode::Stream {
        n: 6,
        gap: Duration::from_millis(300),
    });
    let r = gateway(&tok, &[&e.url], |_| {});
    let url = r.url("/v1/completions");
    // 1 + 39 tokens: 10 blocks to prefill.
    let body = json!({"model": "m", "prompt": words(100, 39), "stream": true});
    let st = Arc::clone(&e.st);
    let client_thread = std::thread::spawn(move || {
        let t = Instant::now();
        let mut resp = client().post(url).json(&body).send().unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers()["content-type"], "text/event-stream");
        let mut buf = vec![0u8; 1 << 16];
        let n = resp.read(&mut buf).unwrap();
        let first_at = t.elapsed();
        // The first chunk is here while the engine is still generating.
        assert_eq!(st.seen.finished.load(SeqCst), 0, "buffered to the end");
        let mut all = buf[..n].to_vec();
        resp.read_to_end(&mut all).unwrap();
        (first_at, all, t.elapsed())
    });
    // Routed and waiting for its first token: in flight, prefill pending.
    wait_until("the request in flight", Duration::from_secs(5), || {
        in_flight(&r, 1).0 == 1
    });
    assert_eq!(in_flight(&r, 1), (1, 10));
    // After the first chunk: still in flight, prefill done.
    wait_until("the first chunk", Duration::from_secs(5), || {
        in_flight(&r, 1).1 == 0
    });
    assert_eq!(in_flight(&r, 1).0, 1);
    let (first_at, all, total) = client_thread.join().unwrap();
    assert_eq!(String::from_utf8(all).unwrap(), sse(6));
    assert!(
        total >= first_at + Duration::from_millis(1200),
        "the first chunk came at {first_at:?}, the end at {total:?}: buffered?"
    );
    wait_until("the request completed", Duration::from_secs(2), || {
        in_flight(&r, 1).0 == 0
    });
    let label = format!("{{worker=\"{}\"}}", e.url);
    assert_eq!(
        metric(&r, &format!("kvrouter_gateway_ttft_seconds_count{label}")),
        Some(1.0)
    );
    assert_eq!(
        metric(&r, &format!("kvrouter_gateway_e2e_seconds_count{label}")),
        Some(1.0)
    );
    assert!(metric(&r, "kvrouter_gateway_requests_total{outcome=\"ok\"}").is_some());
}

#[test]
fn a_client_that_leaves_cancels_the_engines_request() {
    let (_d, tok) = model_dir();
    let e = Engine::start(Mode::Stream {
        n: 200,
        gap: Duration::from_millis(30),
    });
    let r = gateway(&tok, &[&e.url], |_| {});
    let mut resp = client()
        .post(r.url("/v1/completions"))
        .json(&json!({"model": "m", "prompt": words(0, 9), "stream": true}))
        .send()
        .unwrap();
    let mut buf = [0u8; 256];
    assert!(resp.read(&mut buf).unwrap() > 0);
    assert_eq!(in_flight(&r, 1).0, 1);
    drop(resp);
    wait_until(
        "the engine to see the cancellation",
        Duration::from_secs(5),
        || e.st.seen.cancelled.load(SeqCst) == 1,
    );
    assert_eq!(e.st.seen.finished.load(SeqCst), 0);
    wait_until("the request completed", Duration::from_secs(2), || {
        in_flight(&r, 1) == (0, 0)
    });
    assert!(metric(&r, "kvrouter_gateway_requests_total{outcome=\"cancelled\"}").is_some());
}

#[test]
fn failover_past_refused_503_and_429_engines() {
    let (_d, tok) = model_dir();
    let e503 = Engine::start(Mode::Status(503));
    let e429 = Engine::start(Mode::Status(429));
    let ok = Engine::start(Mode::Json);
    let r = gateway(
        &tok,
        &[&refused_url(), &e503.url, &e429.url, &ok.url],
        |a| {
            a.max_retries = 3;
            a.breaker_failures = 100;
        },
    );
    let before = metric(&r, "kvrouter_gateway_retries_total").unwrap_or(0.0);
    for i in 0..6 {
        let (s, v) = completion(&r, &json!({"model": "m", "prompt": words(10 * i, 8)}));
        assert_eq!(s, 200, "{v}");
        assert_eq!(v, serde_json::from_str::<Value>(ANSWER).unwrap());
    }
    assert_eq!(ok.requests(), 6);
    // Each failing engine at most once per request (it is excluded).
    assert!(e503.requests() <= 6 && e429.requests() <= 6);
    let after = metric(&r, "kvrouter_gateway_retries_total").unwrap_or(0.0);
    assert!(after > before, "no retries counted");
    for id in 1..=4 {
        assert_eq!(in_flight(&r, id), (0, 0), "worker {id}");
    }
}

#[test]
fn retries_are_bounded_and_the_last_engine_error_goes_back() {
    let (_d, tok) = model_dir();
    let bad: Vec<Engine> = (0..3).map(|_| Engine::start(Mode::Status(503))).collect();
    let urls: Vec<&str> = bad.iter().map(|e| e.url.as_str()).collect();
    let r = gateway(&tok, &urls, |a| a.max_retries = 1);
    let (s, v) = completion(&r, &json!({"model": "m", "prompt": "t1 t2"}));
    assert_eq!(s, 503, "{v}");
    assert_eq!(
        v["error"]["message"], "engine says 503",
        "the engine's own error: {v}"
    );
    assert_eq!(bad.iter().map(Engine::requests).sum::<usize>(), 2);
    // Nothing reachable at all: the gateway's own 503, after one try each.
    let refused: Vec<String> = (0..3).map(|_| refused_url()).collect();
    let r = gateway(&tok, &refused, |a| a.max_retries = 5);
    let t = Instant::now();
    openai_error(
        completion(&r, &json!({"model": "m", "prompt": "t1 t2"})),
        503,
        "service_unavailable",
    );
    assert!(t.elapsed() < Duration::from_secs(5));
    for id in 1..=3 {
        assert_eq!(in_flight(&r, id), (0, 0));
    }
    // Engines whose responses break before their first byte: 502.
    let broken = Engine::start(Mode::BreakAfter {
        n: 0,
        gap: Duration::from_millis(10),
    });
    let r = gateway(&tok, &[&broken.url], |a| {
        a.max_retries = 0;
    });
    openai_error(
        completion(&r, &json!({"model": "m", "prompt": "t1"})),
        502,
        "bad_gateway",
    );
    // An engine's 4xx is the client's answer: passed on, no failover.
    let e400 = Engine::start(Mode::Status(400));
    let ok = Engine::start(Mode::Json);
    let r = gateway(&tok, &[&e400.url, &ok.url], |a| {
        a.policy = kvroute::PolicyKind::RoundRobin;
    });
    let (s, v) = completion(&r, &json!({"model": "m", "prompt": "t1"}));
    assert_eq!(
        (s, &v["error"]["message"]),
        (400, &json!("engine says 400"))
    );
    assert_eq!((e400.requests(), ok.requests()), (1, 0));
}

#[test]
fn no_failover_once_the_first_byte_went_out() {
    let (_d, tok) = model_dir();
    let broken = Engine::start(Mode::BreakAfter {
        n: 2,
        gap: Duration::from_millis(50),
    });
    let ok = Engine::start(Mode::Json);
    let r = gateway(&tok, &[&broken.url, &ok.url], |a| {
        // Round robin starts at the first worker: the broken engine.
        a.policy = kvroute::PolicyKind::RoundRobin;
    });
    let mut resp = client()
        .post(r.url("/v1/completions"))
        .json(&json!({"model": "m", "prompt": "t1", "stream": true}))
        .send()
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut got = Vec::new();
    let res = resp.read_to_end(&mut got);
    let text = String::from_utf8_lossy(&got);
    assert!(
        res.is_err() || !text.contains("[DONE]"),
        "a broken stream arrived whole: {text}"
    );
    assert!(text.starts_with(&chunk(0)), "{text}");
    assert_eq!(broken.requests(), 1);
    assert_eq!(ok.requests(), 0, "retried after the first byte");
    wait_until("the request completed", Duration::from_secs(2), || {
        in_flight(&r, 1).0 == 0
    });
    assert!(metric(
        &r,
        "kvrouter_gateway_requests_total{outcome=\"upstream_error\"}"
    )
    .is_some());
}

#[test]
fn the_breaker_opens_after_failures_and_half_opens_after_the_cooldown() {
    let (_d, tok) = model_dir();
    let e = Engine::start(Mode::Status(500));
    let r = gateway(&tok, &[&e.url], |a| {
        a.max_retries = 0;
        a.breaker_failures = 2;
        a.breaker_cooldown = Duration::from_millis(1500);
    });
    let req = || completion(&r, &json!({"model": "m", "prompt": "t1 t2 t3"}));
    let gauge = format!("kvrouter_gateway_breaker_open{{worker=\"{}\"}}", e.url);
    for _ in 0..2 {
        let (s, v) = req();
        assert_eq!(
            (s, &v["error"]["message"]),
            (500, &json!("engine says 500"))
        );
    }
    // Open: the engine gets nothing.
    openai_error(req(), 503, "service_unavailable");
    assert_eq!(e.requests(), 2);
    assert_eq!(metric(&r, &gauge), Some(1.0));
    // Half open after the cooldown: one trial, which fails: open again.
    std::thread::sleep(Duration::from_millis(1600));
    assert_eq!(req().0, 500);
    assert_eq!(e.requests(), 3);
    openai_error(req(), 503, "service_unavailable");
    assert_eq!(e.requests(), 3);
    // The next trial succeeds: closed.
    e.set(Mode::Json);
    std::thread::sleep(Duration::from_millis(1600));
    assert_eq!(req().0, 200);
    assert_eq!(metric(&r, &gauge), Some(0.0));
    assert_eq!(req().0, 200);
    assert_eq!(e.requests(), 5);
}

#[test]
fn health_checks_take_a_sick_engine_out_until_it_recovers() {
    let (_d, tok) = model_dir();
    let sick = Engine::start(Mode::Json);
    let well = Engine::start(Mode::Json);
    sick.st.health.store(503, SeqCst);
    let r = gateway(&tok, &[&sick.url, &well.url], |a| {
        a.health_interval = Duration::from_millis(100);
        a.policy = kvroute::PolicyKind::RoundRobin;
    });
    let healthy = format!("kvrouter_gateway_engine_healthy{{worker=\"{}\"}}", sick.url);
    wait_until("the health check", Duration::from_secs(5), || {
        metric(&r, &healthy) == Some(0.0)
    });
    for i in 0..6 {
        assert_eq!(
            completion(&r, &json!({"model": "m", "prompt": words(i, 3)})).0,
            200
        );
    }
    assert_eq!((sick.requests(), well.requests()), (0, 6));
    sick.st.health.store(200, SeqCst);
    wait_until("the engine back", Duration::from_secs(5), || {
        metric(&r, &healthy) == Some(1.0)
    });
    for i in 0..6 {
        assert_eq!(
            completion(&r, &json!({"model": "m", "prompt": words(i, 3)})).0,
            200
        );
    }
    assert!(sick.requests() >= 2, "{}", sick.requests());
}

#[test]
fn first_byte_and_whole_request_timeouts() {
    let (_d, tok) = model_dir();
    let hang = Engine::start(Mode::Hang);
    let r = gateway(&tok, &[&hang.url], |a| {
        a.first_byte_timeout = Duration::from_millis(400);
        a.max_retries = 0;
    });
    let t = Instant::now();
    openai_error(
        completion(&r, &json!({"model": "m", "prompt": "t1"})),
        504,
        "timeout",
    );
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(400) && took < Duration::from_secs(3),
        "{took:?}"
    );
    assert_eq!(in_flight(&r, 1), (0, 0));
    // The whole request: cut mid-stream at the deadline.
    let slow = Engine::start(Mode::Stream {
        n: 40,
        gap: Duration::from_millis(100),
    });
    let r = gateway(&tok, &[&slow.url], |a| {
        a.request_timeout = Duration::from_millis(700);
    });
    let t = Instant::now();
    let mut resp = client()
        .post(r.url("/v1/completions"))
        .json(&json!({"model": "m", "prompt": "t1", "stream": true}))
        .send()
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut got = Vec::new();
    let _ = resp.read_to_end(&mut got);
    let took = t.elapsed();
    let text = String::from_utf8_lossy(&got);
    assert!(
        text.starts_with(&chunk(0)) && !text.contains("[DONE]"),
        "{text}"
    );
    assert!(took < Duration::from_secs(3), "{took:?}");
    wait_until("the request completed", Duration::from_secs(2), || {
        in_flight(&r, 1).0 == 0
    });
    wait_until(
        "the engine's request cancelled",
        Duration::from_secs(3),
        || slow.st.seen.cancelled.load(SeqCst) == 1,
    );
    assert!(metric(&r, "kvrouter_gateway_requests_total{outcome=\"timeout\"}").is_some());
}

#[test]
fn the_concurrency_limit_queues_then_refuses_with_429() {
    let (_d, tok) = model_dir();
    let e = Engine::start(Mode::Stream {
        n: 4,
        gap: Duration::from_millis(250),
    });
    let r = gateway(&tok, &[&e.url], |a| {
        a.max_concurrent_requests = 1;
        a.max_queued_requests = 1;
        a.queue_timeout = Duration::from_secs(5);
    });
    let url = r.url("/v1/completions");
    let spawn = |url: String| {
        std::thread::spawn(move || {
            let resp = client()
                .post(url)
                .json(&json!({"model": "m", "prompt": "t1", "stream": true}))
                .send()
                .unwrap();
            (resp.status().as_u16(), resp.text().unwrap_or_default())
        })
    };
    let first = spawn(url.clone());
    wait_until("the first request running", Duration::from_secs(5), || {
        e.requests() == 1
    });
    let queued = spawn(url.clone());
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(e.requests(), 1, "the second request did not wait");
    // A third finds the slot and the queue full: refused at once.
    let t = Instant::now();
    let resp = client()
        .post(url.clone())
        .json(&json!({"model": "m", "prompt": "t1"}))
        .send()
        .unwrap();
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    assert_eq!(resp.status(), 429);
    assert_eq!(resp.headers()["retry-after"], "1");
    openai_error((429, resp.json().unwrap()), 429, "rate_limit_exceeded");
    let m = r.text("/metrics");
    assert!(m.contains("kvrouter_gateway_in_flight"), "{m}");
    assert!(m.contains("kvrouter_gateway_queued"), "{m}");
    // Both others are served, one after the other.
    for h in [first, queued] {
        let (s, body) = h.join().unwrap();
        assert_eq!((s, body.as_str()), (200, sse(4).as_str()));
    }
    assert_eq!(e.requests(), 2);
    // Waiting longer than the queue timeout: 429 too.
    let r = gateway(&tok, &[&e.url], |a| {
        a.max_concurrent_requests = 1;
        a.queue_timeout = Duration::from_millis(300);
    });
    let url = r.url("/v1/completions");
    let first = spawn(url.clone());
    wait_until("the first request running", Duration::from_secs(5), || {
        e.requests() == 3
    });
    let t = Instant::now();
    openai_error(
        completion(&r, &json!({"model": "m", "prompt": "t1"})),
        429,
        "rate_limit_exceeded",
    );
    assert!(t.elapsed() >= Duration::from_millis(300));
    assert_eq!(first.join().unwrap().0, 200);
}

#[test]
fn shutdown_drains_streams_in_flight_and_refuses_new_requests() {
    let (_d, tok) = model_dir();
    let e = Engine::start(Mode::Stream {
        n: 8,
        gap: Duration::from_millis(150),
    });
    let mut r = Router::start(gw_args(&tok));
    register(&r, 1, &e.url);
    let url = r.url("/v1/completions");
    let streaming = std::thread::spawn(move || {
        let resp = client()
            .post(url)
            .json(&json!({"model": "m", "prompt": "t1", "stream": true}))
            .send()
            .unwrap();
        (resp.status().as_u16(), resp.text().unwrap_or_default())
    });
    wait_until("the stream started", Duration::from_secs(5), || {
        e.requests() == 1
    });
    r.begin_shutdown();
    std::thread::sleep(Duration::from_millis(100));
    openai_error(
        completion(&r, &json!({"model": "m", "prompt": "t1"})),
        503,
        "service_unavailable",
    );
    assert!(!r.stopped(), "stopped with a stream in flight");
    let (s, body) = streaming.join().unwrap();
    assert_eq!((s, body.as_str()), (200, sse(8).as_str()));
    assert_eq!(e.requests(), 1);
    wait_until("the router stopped", Duration::from_secs(5), || r.stopped());
}

#[test]
fn bad_requests_get_openai_errors() {
    let (_d, tok) = model_dir();
    let e = Engine::start(Mode::Json);
    let r = gateway(&tok, &[&e.url], |a| {
        a.max_context_tokens = Some(8);
        a.max_body_bytes = 4096;
        a.tokenizers
            .push(format!("other={}", tok.display()).parse().unwrap());
    });
    let raw = |path: &str, body: &str| {
        let (s, _, b) = post(&r, path, body.to_string());
        (s, serde_json::from_slice(&b).unwrap_or(Value::Null))
    };
    let c = "/v1/completions";
    openai_error(raw(c, "{not json"), 400, "invalid_json");
    openai_error(raw(c, "[1, 2]"), 400, "invalid_json");
    openai_error(
        raw(c, r#"{"prompt": "t1"}"#),
        400,
        "missing_required_parameter",
    );
    openai_error(
        raw(c, r#"{"model": 7, "prompt": "t1"}"#),
        400,
        "missing_required_parameter",
    );
    openai_error(
        raw(c, r#"{"model": "m"}"#),
        400,
        "missing_required_parameter",
    );
    openai_error(
        raw("/v1/chat/completions", r#"{"model": "m"}"#),
        400,
        "missing_required_parameter",
    );
    openai_error(
        raw(c, r#"{"model": "m", "prompt": 12}"#),
        400,
        "invalid_prompt",
    );
    openai_error(
        raw(c, r#"{"model": "zz", "prompt": "t1"}"#),
        404,
        "model_not_found",
    );
    // A tokenizer but no engine serving the model.
    openai_error(
        raw(c, r#"{"model": "other", "prompt": "t1"}"#),
        404,
        "model_not_found",
    );
    // BOS + 8 words: 9 tokens, over the 8 allowed.
    openai_error(
        completion(&r, &json!({"model": "m", "prompt": words(0, 8)})),
        400,
        "context_length_exceeded",
    );
    assert_eq!(
        completion(&r, &json!({"model": "m", "prompt": words(0, 7)})).0,
        200
    );
    let big = format!(r#"{{"model": "m", "prompt": "{}"}}"#, "t1 ".repeat(2000));
    openai_error(raw(c, &big), 413, "request_too_large");
    assert_eq!(e.requests(), 1, "a bad request reached the engine");
    assert!(metric(
        &r,
        "kvrouter_gateway_requests_total{outcome=\"client_error\"}"
    )
    .is_some());
}

#[test]
fn workers_register_with_their_engines_urls() {
    let (_d, tok) = model_dir();
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("workers.json");
    std::fs::write(
        &f,
        r#"[{"instance_id": 2, "url": "http://127.0.0.1:8002"}]"#,
    )
    .unwrap();
    let mut a = gw_args(&tok);
    a.workers = vec!["1=url=http://127.0.0.1:8001/".parse().unwrap()];
    a.workers_file = Some(f);
    let r = Router::start(a);
    let (_, ws) = r.get("/workers");
    let urls: Vec<&Value> = ws
        .as_array()
        .unwrap()
        .iter()
        .map(|w| &w["urls"]["0"])
        .collect();
    assert_eq!(
        urls,
        [
            &json!("http://127.0.0.1:8001"),
            &json!("http://127.0.0.1:8002")
        ],
        "{ws}"
    );
    for url in [
        "https://127.0.0.1:1",
        "http://127.0.0.1:1/v1",
        "127.0.0.1:1",
    ] {
        let (s, v) = r.post(
            "/register",
            &json!({"instance_id": 5, "model_name": "m", "block_size": BS, "url": url}),
        );
        assert_eq!(s, 400, "{url}: {v}");
    }
    // With events, a worker needs its event endpoint; the url rides along.
    let mut a = args();
    a.gateway = true;
    let r = Router::start(a);
    let (s, v) = r.post(
        "/register",
        &json!({"instance_id": 1, "model_name": "m", "block_size": BS, "url": "http://127.0.0.1:1"}),
    );
    assert_eq!(s, 400, "{v}");
    let (s, _) = r.post(
        "/register",
        &json!({"instance_id": 1, "model_name": "m", "block_size": BS,
                "endpoint": "tcp://127.0.0.1:1", "url": "http://127.0.0.1:1"}),
    );
    assert_eq!(s, 201);
    assert_eq!(r.feed("m", 1, 0)["active_requests"], 0);
    let (_, ws) = r.get("/workers");
    assert_eq!(ws[0]["urls"]["0"], "http://127.0.0.1:1");
    // A tokenizer directory that does not load stops the start.
    let mut a = gw_args(&tok);
    a.tokenizers = vec!["m=/nonexistent/model".parse().unwrap()];
    let svc = kvrouter::Service::new(a).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let err = match rt.block_on(kvrouter::gateway::Gateway::new(svc)) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("a missing tokenizer was accepted"),
    };
    assert!(err.contains("--tokenizer m=/nonexistent/model"), "{err}");
}
