//! The HTTP routes: `POST /v1/completions`, `POST /v1/chat/completions`
//! (streamed as server-sent events or answered whole), `GET /v1/models`,
//! `GET /health`, `GET /metrics`, `POST /reset_prefix_cache`.
//!
//! A generation request is tokenized, queued on the engine and held until
//! the time model says its first token is due: a streamed response's first
//! byte leaves then, one chunk per token follows at the decode pace. A
//! non-streamed response leaves when its last token is due. Dropping the
//! handler or the stream (the client went away) ends the request on the
//! engine through its [`RequestGuard`].

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use kvrouter::tokenize::ModelTokenizer;
use serde_json::{json, Value};
use tokio::sync::watch;

use super::core::{lock, Clock, RequestGuard, SharedCore};
use super::openai::{self, Api, ApiError, Head, Limits};
use super::{Fault, Faults};

/// What the handlers share.
pub(crate) struct AppState {
    pub(crate) core: SharedCore,
    pub(crate) tokenizer: Arc<ModelTokenizer>,
    pub(crate) limits: Limits,
    pub(crate) max_body_bytes: usize,
    pub(crate) decode_tps: f64,
    /// The engine's clock (fixed at start).
    pub(crate) clock: Clock,
    /// Tokens per block.
    pub(crate) block_size: usize,
    pub(crate) engine_id: u64,
    pub(crate) faults: Arc<Faults>,
    /// Render requests answered (names their ids).
    pub(crate) rendered: AtomicU64,
    /// Turns true at shutdown.
    pub(crate) stop: watch::Receiver<bool>,
}

/// The routes over `state`.
pub(crate) fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions/render", post(render_completion))
        .route("/v1/chat/completions/render", post(render_chat))
        .route("/v1/models", get(models))
        .route("/health", get(|| async { StatusCode::OK }))
        .route("/metrics", get(metrics))
        .route("/reset_prefix_cache", post(reset_prefix_cache))
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "no such route") })
        // The body limit is ours (413 in OpenAI's shape), not axum's.
        .layer(DefaultBodyLimit::disable())
        .with_state(state)
}

/// Resolves once shutdown began.
async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

async fn models(State(s): State<Arc<AppState>>) -> Json<Value> {
    Json(json!({"object": "list", "data": [{
        "id": s.limits.model, "object": "model", "created": unix_now(),
        "owned_by": "arbor", "root": s.limits.model, "parent": null,
        "max_model_len": s.limits.max_model_len,
    }]}))
}

/// A few of vLLM's gauges and counters, in Prometheus' text format.
async fn metrics(State(s): State<Arc<AppState>>) -> Response {
    let (running, waiting, (in_use, capacity), c) = {
        let core = lock(&s.core);
        let (r, w) = core.load();
        (r, w, core.blocks(), core.counters())
    };
    let m = format!(
        "model_name=\"{}\"",
        s.limits.model.replace(['"', '\\', '\n'], "_")
    );
    let usage = if capacity == 0 {
        0.0
    } else {
        in_use as f64 / capacity as f64
    };
    let text = format!(
        "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{{m}}} {running}\n\
         # TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{{{m}}} {waiting}\n\
         # TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{{{m}}} {usage}\n\
         # TYPE vllm:prefix_cache_queries_total counter\nvllm:prefix_cache_queries_total{{{m}}} {}\n\
         # TYPE vllm:prefix_cache_hits_total counter\nvllm:prefix_cache_hits_total{{{m}}} {}\n\
         # TYPE vllm:request_success_total counter\nvllm:request_success_total{{{m}}} {}\n\
         # TYPE arbor_engine_requests_cancelled_total counter\narbor_engine_requests_cancelled_total{{{m}}} {}\n\
         # TYPE arbor_engine_event_batches_total counter\narbor_engine_event_batches_total{{{m}}} {}\n",
        c.prompt_tokens, c.cached_tokens, c.finished, c.cancelled, c.batches,
    );
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

/// vLLM's prefix-cache reset: 200 when the cache was dropped, 409 while
/// requests run.
async fn reset_prefix_cache(State(s): State<Arc<AppState>>) -> Response {
    if lock(&s.core).reset() {
        StatusCode::OK.into_response()
    } else {
        ApiError::new(
            StatusCode::CONFLICT,
            "requests are running: the cache is in use",
        )
        .into_response()
    }
}

async fn completions(State(s): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    generate(s, Api::Completions, &headers, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn chat(State(s): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    generate(s, Api::Chat, &headers, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

/// The injected fault for this request, if any.
async fn fault(s: &AppState) -> Result<(), ApiError> {
    let n = s.faults.received.fetch_add(1, Relaxed) + 1;
    if let Some(every) = s.faults.fail_every {
        if n.is_multiple_of(every) {
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("injected failure (every {every}th request)"),
            ));
        }
    }
    match s.faults.get() {
        Fault::None => Ok(()),
        Fault::Unavailable => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "injected failure: unavailable",
        )),
        Fault::RateLimited => Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "injected failure: rate limited",
        )),
        Fault::Hang => {
            // Until the client goes away (this future is dropped) or the
            // engine stops.
            stopped(s.stop.clone()).await;
            Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "shutting down",
            ))
        }
    }
}

/// Reads the body, at most `limit` bytes (413 past it).
async fn read_body(headers: &HeaderMap, body: Body, limit: usize) -> Result<Bytes, ApiError> {
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the request body is larger than {limit} bytes"),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    // Past the limit or broken off: either way nothing to answer but this.
    axum::body::to_bytes(body, limit)
        .await
        .map_err(|_| too_large())
}

fn sleep_until(t: Instant) -> tokio::time::Sleep {
    tokio::time::sleep_until(tokio::time::Instant::from_std(t))
}

/// vLLM's render API: the token ids a completion (a list, one per
/// prompt; the simulated engine takes one) or a chat would be served on,
/// without generating. Routers that route on tokens (vLLM's router under
/// its `kv_aware` policy) ask the engine this first.
async fn render_completion(
    State(s): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let rendered = render(&s, Api::Completions, &headers, body).await?;
    Ok(Json(json!([rendered])).into_response())
}

/// vLLM's render API for a chat: one object.
async fn render_chat(
    State(s): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    Ok(Json(render(&s, Api::Chat, &headers, body).await?).into_response())
}

async fn render(
    s: &AppState,
    api: Api,
    headers: &HeaderMap,
    body: Body,
) -> Result<Value, ApiError> {
    let bytes = read_body(headers, body, s.max_body_bytes).await?;
    let p = openai::parse(api, &s.limits, &s.tokenizer, &bytes)?;
    let n = s.rendered.fetch_add(1, Relaxed);
    Ok(json!({"request_id": format!("render-{}-{n}", s.engine_id), "token_ids": p.tokens}))
}

async fn generate(
    s: Arc<AppState>,
    api: Api,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    fault(&s).await?;
    let bytes = read_body(headers, body, s.max_body_bytes).await?;
    let p = openai::parse(api, &s.limits, &s.tokenizer, &bytes)?;
    let tokens: Arc<[u32]> = p.tokens.into();
    let (id, admitted) = lock(&s.core).submit(Arc::clone(&tokens), p.max_tokens);
    let mut guard = RequestGuard::new(Arc::clone(&s.core), id);
    let shutting_down = || ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "shutting down");
    let adm = tokio::select! {
        a = admitted => a.map_err(|_| shutting_down())?,
        () = stopped(s.stop.clone()) => return Err(shutting_down()),
    };
    let n = p.max_tokens as usize;
    let pace = Pace {
        clock: s.clock,
        first_us: adm.first_token_us,
        step_us: 1e6 / s.decode_tps,
    };
    let head = Head {
        api,
        id: format!("{}-{}-{}", api.id_prefix(), s.engine_id, guard.id()),
        created: unix_now(),
        model: s.limits.model.clone(),
    };
    let (pieces, text) = openai::generate(&s.tokenizer, &tokens, n);
    let usage = openai::usage(tokens.len(), n, adm.hit_blocks * s.block_size);
    if !p.stream {
        tokio::select! {
            () = sleep_until(pace.due(n)) => {}
            () = stopped(s.stop.clone()) => return Err(shutting_down()),
        }
        guard.complete();
        drop(guard);
        return Ok(Json(openai::full(&head, &text, usage)).into_response());
    }
    tokio::select! {
        () = sleep_until(pace.due(0)) => {}
        () = stopped(s.stop.clone()) => return Err(shutting_down()),
    }
    let st = Streamer {
        guard,
        head,
        pieces,
        usage: p.include_usage.then_some(usage),
        next: 0,
        pace,
        stop: s.stop.clone(),
    };
    let stream = futures_util::stream::unfold(st, |mut st| async move {
        let bytes = st.next_chunk().await?;
        Some((Ok::<_, Infallible>(bytes), st))
    });
    Ok((
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(stream),
    )
        .into_response())
}

/// When a request's tokens are due: the first at the time model's first
/// token, then one every `1 / decode_tps`, all in simulated µs.
#[derive(Debug, Clone, Copy)]
struct Pace {
    clock: Clock,
    first_us: u64,
    step_us: f64,
}

impl Pace {
    /// The wall instant of token `i` (`n`: the end of a response of `n`).
    fn due(&self, i: usize) -> Instant {
        let us = self
            .first_us
            .saturating_add((i as f64 * self.step_us) as u64);
        self.clock.instant_at(us)
    }
}

/// A streamed response in progress: one chunk per token when it is due,
/// then the usage chunk if asked for, then `[DONE]`.
struct Streamer {
    guard: RequestGuard,
    head: Head,
    pieces: Vec<String>,
    usage: Option<Value>,
    /// Chunks sent so far.
    next: usize,
    pace: Pace,
    stop: watch::Receiver<bool>,
}

fn sse(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

impl Streamer {
    async fn next_chunk(&mut self) -> Option<Bytes> {
        let n = self.pieces.len();
        let i = self.next;
        self.next += 1;
        if i < n {
            if i > 0 {
                tokio::select! {
                    () = sleep_until(self.pace.due(i)) => {}
                    // Shutdown ends the stream early, without [DONE].
                    () = stopped(self.stop.clone()) => return None,
                }
            }
            let usage_null = self.usage.is_some();
            return Some(sse(&openai::chunk(
                &self.head,
                &self.pieces[i],
                i == 0,
                i + 1 == n,
                usage_null,
            )));
        }
        if i == n {
            self.guard.complete();
            if let Some(u) = self.usage.take() {
                return Some(sse(&openai::usage_chunk(&self.head, u)));
            }
            self.next += 1;
        }
        if self.next == n + 2 {
            return Some(Bytes::from_static(b"data: [DONE]\n\n"));
        }
        None
    }
}
