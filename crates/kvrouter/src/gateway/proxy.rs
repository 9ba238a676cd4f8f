//! The gateway's handlers: parse and tokenize a request, route it, send
//! the body unchanged to the chosen engine, fail over while nothing has
//! reached the client, and relay the engine's answer chunk by chunk.
//!
//! Accounting: [`Service::route`] starts the request in the model's
//! `LoadTracker`; the first body chunk from the engine marks its prefill
//! done; the end of the response, an error or the client going away
//! completes it ([`Attempt`]'s `Drop`, so no path forgets it).
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use axum::body::Body;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use futures_util::Stream;
use kvindex::WorkerKey;
use serde_json::{json, Value};

use super::error::GatewayError;
use super::limit::Slot;
use super::upstream::{Pass, Upstream};
use super::Gateway;
use crate::service::{Prompt, PromptHashes, RouteOptions, Service, ServiceError};
use crate::tokenize::{Endpoint, ModelTokenizer, Rest};

/// How a gateway request ended (`kvrouter_gateway_requests_total{outcome}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Answered by an engine (2xx), to the end.
    Ok,
    /// Refused as the client's fault (ours or the engine's 4xx).
    ClientError,
    /// No engine could answer (5xx after failover, broken stream).
    UpstreamError,
    /// Refused for load: limit and queue full, draining (429, 503).
    Overloaded,
    /// The client went away first.
    Cancelled,
    /// An engine did not answer in time.
    Timeout,
}

impl Outcome {
    fn label(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::ClientError => "client_error",
            Self::UpstreamError => "upstream_error",
            Self::Overloaded => "overloaded",
            Self::Cancelled => "cancelled",
            Self::Timeout => "timeout",
        }
    }

    fn of(e: &GatewayError) -> Self {
        match e {
            GatewayError::Overloaded(_) => Self::Overloaded,
            GatewayError::Timeout(_) => Self::Timeout,
            e if e.status().is_client_error() => Self::ClientError,
            _ => Self::UpstreamError,
        }
    }
}

/// One client request from arrival to the end of its response: counts
/// it in the gateway's active requests, holds its concurrency slot, and
/// records its outcome (cancelled unless set) and end-to-end time.
struct Admission {
    /// `None` once the admission moved on (into a response body).
    g: Option<Arc<Gateway>>,
    slot: Option<Slot>,
    outcome: Option<Outcome>,
    start: Instant,
    worker: Option<String>,
}

impl Admission {
    fn new(g: &Arc<Gateway>) -> Self {
        g.active.fetch_add(1, Relaxed);
        Self {
            g: Some(Arc::clone(g)),
            slot: None,
            outcome: None,
            start: Instant::now(),
            worker: None,
        }
    }

    /// Moves the admission out (into a response body), leaving one that
    /// counts nothing.
    fn take(&mut self) -> Self {
        Self {
            g: self.g.take(),
            slot: self.slot.take(),
            outcome: self.outcome.take(),
            start: self.start,
            worker: self.worker.take(),
        }
    }

    /// Ends the request with the gateway's own error.
    fn refuse(&mut self, e: GatewayError) -> Response {
        self.outcome = Some(Outcome::of(&e));
        e.into_response()
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        let Some(g) = self.g.take() else {
            return;
        };
        let outcome = self.outcome.unwrap_or(Outcome::Cancelled);
        metrics::counter!("kvrouter_gateway_requests_total", "outcome" => outcome.label())
            .increment(1);
        if let Some(w) = self.worker.take() {
            metrics::histogram!("kvrouter_gateway_e2e_seconds", "worker" => w)
                .record(self.start.elapsed().as_secs_f64());
        }
        self.slot = None;
        g.active.fetch_sub(1, Relaxed);
    }
}

/// What an attempt's engine proved: the breaker's input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// It answered.
    Good,
    /// It failed (connect error, 5xx, timeout, broken stream).
    Bad,
    /// Nothing learnt (the client left, or 429: busy is not broken).
    None,
}

/// One routed attempt: in flight in the model's `LoadTracker` and, for a
/// half-open breaker, its trial, until finished or dropped.
struct Attempt {
    svc: Arc<Service>,
    model: String,
    id: String,
    up: Arc<Upstream>,
    pass: Pass,
    done: bool,
}

impl Attempt {
    /// Completes the request on its worker and tells the breaker.
    fn finish(&mut self, v: Verdict) {
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        // Not in flight any more (expired, worker removed): nothing to end.
        let _ = self.svc.complete(Some(&self.model), &self.id);
        match v {
            Verdict::Good => self.up.success(),
            Verdict::Bad => {
                self.up.failure(self.pass);
            }
            Verdict::None => self.up.abandon(self.pass),
        }
    }
}

impl Drop for Attempt {
    fn drop(&mut self) {
        self.finish(Verdict::None);
    }
}

/// Why an attempt failed before anything reached the client.
enum Failure {
    /// The engine answered 5xx or 429: its response, to pass on if no
    /// other engine does better.
    Status {
        status: StatusCode,
        content_type: Option<HeaderValue>,
        body: Bytes,
    },
    /// No connection (`connect`), or the response broke before its
    /// first byte.
    Transport {
        /// What happened.
        msg: String,
        /// Whether connecting failed (503) rather than the response (502).
        connect: bool,
    },
}

/// `POST /v1/completions`.
pub async fn completions(
    State(g): State<Arc<Gateway>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    handle(g, Endpoint::Completions, headers, body).await
}

/// `POST /v1/chat/completions`.
pub async fn chat_completions(
    State(g): State<Arc<Gateway>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    handle(g, Endpoint::ChatCompletions, headers, body).await
}

/// `GET /v1/models`: the models with a worker that has a url.
pub async fn models(State(g): State<Arc<Gateway>>) -> Response {
    let data: Vec<Value> = g
        .models()
        .into_iter()
        .map(|m| json!({"id": m, "object": "model", "created": 0, "owned_by": "arbor"}))
        .collect();
    Json(json!({"object": "list", "data": data})).into_response()
}

async fn handle(
    g: Arc<Gateway>,
    ep: Endpoint,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let mut adm = Admission::new(&g);
    let abort = g.aborted();
    tokio::select! {
        r = serve(&g, ep, &headers, body, &mut adm) => r,
        () = abort => adm.refuse(GatewayError::Unavailable("the router shut down".into())),
    }
}

async fn serve(
    g: &Arc<Gateway>,
    ep: Endpoint,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
    adm: &mut Admission,
) -> Response {
    if g.draining() {
        return adm.refuse(GatewayError::Unavailable(
            "the router is shutting down".into(),
        ));
    }
    match g.limit.acquire().await {
        Ok(s) => adm.slot = Some(s),
        Err(e) => return adm.refuse(GatewayError::Overloaded(e.to_string())),
    }
    if g.draining() {
        return adm.refuse(GatewayError::Unavailable(
            "the router is shutting down".into(),
        ));
    }
    let deadline = tokio::time::Instant::now() + g.svc.args.request_timeout;
    let bytes = match body {
        Ok(b) => b,
        Err(r) if r.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            return adm.refuse(GatewayError::TooLarge(format!(
                "the body is over {} bytes (--max-body-bytes)",
                g.svc.args.max_body_bytes
            )))
        }
        Err(r) => return adm.refuse(GatewayError::InvalidJson(r.body_text())),
    };
    let p = match prepare(g, ep, &bytes).await {
        Ok(p) => p,
        Err(e) => return adm.refuse(e),
    };
    forward(g, ep, headers, bytes, p, deadline, adm).await
}

/// Parses the body, checks the model, tokenizes the prompt and checks
/// its length.
async fn prepare(g: &Gateway, ep: Endpoint, bytes: &Bytes) -> Result<Prepared, GatewayError> {
    let v: Value = serde_json::from_slice(bytes)
        .map_err(|e| GatewayError::InvalidJson(format!("the body is not valid JSON: {e}")))?;
    if !v.is_object() {
        return Err(GatewayError::InvalidJson(
            "the body must be a JSON object".into(),
        ));
    }
    let model = v["model"]
        .as_str()
        .ok_or_else(|| GatewayError::MissingField("`model` is required (a string)".into()))?
        .to_string();
    let field = match ep {
        Endpoint::Completions => "prompt",
        Endpoint::ChatCompletions => "messages",
    };
    if v.get(field).is_none_or(Value::is_null) {
        return Err(GatewayError::MissingField(format!("`{field}` is required")));
    }
    let tok = g.tokenizer(&model).ok_or_else(|| {
        GatewayError::ModelNotFound(format!(
            "the model `{model}` does not exist (no tokenizer for it)"
        ))
    })?;
    if !g.serves(&model) {
        return Err(GatewayError::ModelNotFound(format!(
            "the model `{model}` does not exist (no worker with a url serves it)"
        )));
    }
    let salt = v
        .get("cache_salt")
        .and_then(Value::as_str)
        .map(str::to_string);
    let limit = g.context_limit(&tok);
    // Events mode: tokenize only while some worker holds every block so
    // far. Approximate mode records the routed prompt's every block.
    let lazy = !g.svc.args.no_kv_events;
    let svc = Arc::clone(&g.svc);
    let (m, s) = (model.clone(), salt.clone());
    let t = Arc::clone(&tok);
    // Tokenizing a long prompt or rendering a template is CPU work: off
    // the async workers.
    let mut p = tokio::task::spawn_blocking(move || {
        let mut known = PromptHashes::default();
        let mut p = t.prompt_tokens_until(ep, &v, |so_far| {
            !lazy || svc.holds_all_growing(&m, so_far, s.as_deref(), &mut known)
        })?;
        if let Some(rest) = p.rest.take_if(|r| p.tokens.len() + r.max_tokens() > limit) {
            // It may be too long: count it exactly.
            t.finish(&mut p.tokens, &rest)?;
        }
        Ok::<_, crate::tokenize::TokenizeError>(p)
    })
    .await
    .map_err(|e| GatewayError::Internal(format!("tokenizer task: {e}")))?
    .map_err(|e| {
        if e.is_client_error() {
            GatewayError::InvalidPrompt(e.to_string())
        } else {
            GatewayError::Internal(format!("tokenizing the prompt: {e}"))
        }
    })?;
    if p.rest.is_none() && p.tokens.len() > limit {
        return Err(GatewayError::ContextLength(format!(
            "this model's maximum context length is {limit} tokens; the prompt has {} tokens",
            p.tokens.len()
        )));
    }
    let unseen_blocks = match (&p.rest, g.svc.block_size(&model)) {
        (Some(r), Some(bs)) if bs > 0 => {
            let (known, bs) = (p.tokens.len(), bs as usize);
            metrics::counter!("kvrouter_gateway_tokenizer_deferred_bytes_total", "model" => model.clone())
                .increment(r.bytes() as u64);
            ((known + r.estimated_tokens()) / bs - known / bs) as u64
        }
        _ => 0,
    };
    let rest = p.rest.take().map(|r| (tok, r));
    Ok(Prepared {
        model,
        prompt: Prompt::Tokens {
            token_ids: p.tokens,
            lora_name: None,
            cache_salt: salt,
        },
        unseen_blocks,
        rest,
    })
}

/// A request ready to route.
struct Prepared {
    model: String,
    prompt: Prompt,
    /// Estimated blocks past the prompt's tokens (see `RouteOptions`).
    unseen_blocks: u64,
    /// The text left untokenized, encoded into the tokenizer's prefix cache
    /// once the request is routed (a later turn resends it).
    rest: Option<(Arc<ModelTokenizer>, Rest)>,
}

/// Queues the encoding of a routed prompt's rest into the prefix cache
/// (`fill.rs`), if that would keep a chunk there.
fn fill_later(g: &Gateway, rest: Option<(Arc<ModelTokenizer>, Rest)>) {
    if let Some((tok, rest)) = rest.filter(|(_, r)| r.fills_cache()) {
        if !g.fills.offer(tok, rest) {
            metrics::counter!("kvrouter_gateway_tokenizer_fills_dropped_total").increment(1);
        }
    }
}

/// Routes and sends, failing over to the next-best worker while nothing
/// has reached the client.
#[allow(clippy::too_many_arguments)]
async fn forward(
    g: &Arc<Gateway>,
    ep: Endpoint,
    headers: &HeaderMap,
    bytes: Bytes,
    p: Prepared,
    deadline: tokio::time::Instant,
    adm: &mut Admission,
) -> Response {
    let Prepared {
        model,
        prompt,
        unseen_blocks,
        mut rest,
    } = p;
    let model = model.as_str();
    let a = &g.svc.args;
    let id = g.request_id();
    let path = match ep {
        Endpoint::Completions => "/v1/completions",
        Endpoint::ChatCompletions => "/v1/chat/completions",
    };
    let mut tried: Vec<WorkerKey> = Vec::new();
    let mut attempts = 0usize;
    let mut last: Option<Failure> = None;
    loop {
        let mut exclude = g.unroutable(model);
        exclude.extend(tried.iter().copied());
        let opts = RouteOptions {
            exclude,
            unseen_blocks,
            ..Default::default()
        };
        let d = match g.svc.route(model, &prompt, Some(id.clone()), opts) {
            Ok(d) => {
                fill_later(g, rest.take());
                d
            }
            Err(ServiceError::NoWorkers(_) | ServiceError::UnknownModel(_)) => break,
            Err(ServiceError::Busy(m)) => return adm.refuse(GatewayError::Overloaded(m)),
            Err(ServiceError::Invalid(m)) => return adm.refuse(GatewayError::ContextLength(m)),
            Err(e) => return adm.refuse(GatewayError::Internal(e.to_string())),
        };
        let key = WorkerKey::new(d.worker_id, d.dp_rank);
        tried.push(key);
        let url = g.url_of(model, key);
        let up = url.as_deref().map(|u| g.upstreams.get(u));
        let pass = up.as_ref().and_then(|u| u.admit());
        let (Some(url), Some(up), Some(pass)) = (url, up, pass) else {
            // Gone meanwhile, or its breaker's one trial is taken: not an
            // attempt, route again without it.
            let _ = g.svc.complete(Some(model), &id);
            continue;
        };
        if attempts > 0 {
            metrics::counter!("kvrouter_gateway_retries_total").increment(1);
        }
        attempts += 1;
        let mut att = Attempt {
            svc: Arc::clone(&g.svc),
            model: model.to_string(),
            id: id.clone(),
            up,
            pass,
            done: false,
        };
        let first_by = deadline.min(tokio::time::Instant::now() + a.first_byte_timeout);
        let mut req = g
            .client
            .post(format!("{url}{path}"))
            .header(header::CONTENT_TYPE, "application/json")
            .body(bytes.clone());
        if let Some(auth) = headers.get(header::AUTHORIZATION) {
            req = req.header(header::AUTHORIZATION, auth);
        }
        let sent = Instant::now();
        let resp = match tokio::time::timeout_at(first_by, req.send()).await {
            Err(_) => {
                att.finish(Verdict::Bad);
                return adm.refuse(timeout_error(&url, deadline, a.first_byte_timeout));
            }
            Ok(Err(e)) => {
                att.finish(Verdict::Bad);
                last = Some(Failure::Transport {
                    msg: format!("{url}: {e}"),
                    connect: e.is_connect(),
                });
                if attempts > a.max_retries {
                    break;
                }
                continue;
            }
            Ok(Ok(r)) => r,
        };
        let status = resp.status();
        let content_type = resp.headers().get(header::CONTENT_TYPE).cloned();
        if status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS {
            // Its error body, kept short, in case it is the last word.
            let body = tokio::time::timeout_at(first_by, read_capped(resp, 64 << 10))
                .await
                .unwrap_or_default();
            att.finish(if status.is_server_error() {
                Verdict::Bad
            } else {
                Verdict::None
            });
            tracing::debug!(%url, %status, "engine refused; failing over");
            last = Some(Failure::Status {
                status,
                content_type,
                body,
            });
            if attempts > a.max_retries {
                break;
            }
            continue;
        }
        let mut stream: Pin<Box<dyn Stream<Item = reqwest::Result<Bytes>> + Send>> =
            Box::pin(resp.bytes_stream());
        let first = tokio::time::timeout_at(
            first_by,
            std::future::poll_fn(|cx| stream.as_mut().poll_next(cx)),
        )
        .await;
        let first = match first {
            Err(_) => {
                att.finish(Verdict::Bad);
                return adm.refuse(timeout_error(&url, deadline, a.first_byte_timeout));
            }
            Ok(Some(Err(e))) => {
                att.finish(Verdict::Bad);
                last = Some(Failure::Transport {
                    msg: format!("{url}: {e}"),
                    connect: false,
                });
                if attempts > a.max_retries {
                    break;
                }
                continue;
            }
            Ok(Some(Ok(b))) => Some(b),
            Ok(None) => None,
        };
        // The first byte: prefill is over, and from here on the response
        // is the client's (no failover).
        let _ = g.svc.prefill_complete(Some(model), &id);
        metrics::histogram!("kvrouter_gateway_ttft_seconds", "worker" => url.clone())
            .record(sent.elapsed().as_secs_f64());
        adm.worker = Some(url);
        let outcome = if status.is_success() {
            Outcome::Ok
        } else {
            Outcome::ClientError
        };
        let mut b = Response::builder().status(status);
        if let Some(ct) = content_type {
            b = b.header(header::CONTENT_TYPE, ct);
        }
        let body = match first {
            None => {
                att.finish(Verdict::Good);
                adm.outcome = Some(outcome);
                Body::empty()
            }
            Some(first) => {
                // The admission moves into the body: it ends with it.
                let adm = adm.take();
                Body::from_stream(Relay {
                    first: Some(first),
                    inner: stream,
                    deadline: Box::pin(tokio::time::sleep_until(deadline)),
                    abort: Box::pin(g.aborted()),
                    attempt: att,
                    adm,
                    outcome,
                    ended: false,
                })
            }
        };
        return b
            .body(body)
            .unwrap_or_else(|e| GatewayError::Internal(e.to_string()).into_response());
    }
    let e = match last {
        Some(Failure::Status {
            status,
            content_type,
            body,
        }) => {
            adm.outcome = Some(Outcome::UpstreamError);
            let mut b = Response::builder().status(status);
            if let Some(ct) = content_type {
                b = b.header(header::CONTENT_TYPE, ct);
            }
            return b
                .body(Body::from(body))
                .unwrap_or_else(|e| GatewayError::Internal(e.to_string()).into_response());
        }
        Some(Failure::Transport { msg, connect: true }) => {
            GatewayError::Unavailable(format!("no engine could be reached; last: {msg}"))
        }
        Some(Failure::Transport { msg, .. }) => {
            GatewayError::BadGateway(format!("no engine answered whole; last: {msg}"))
        }
        None => GatewayError::Unavailable(format!(
            "no healthy engine for model `{model}` (health checks, circuit breakers)"
        )),
    };
    adm.refuse(e)
}

fn timeout_error(
    url: &str,
    deadline: tokio::time::Instant,
    first_byte: std::time::Duration,
) -> GatewayError {
    if tokio::time::Instant::now() >= deadline {
        GatewayError::Timeout(format!("{url} did not answer within --request-timeout"))
    } else {
        GatewayError::Timeout(format!(
            "{url} sent no response within {first_byte:?} (--first-byte-timeout)"
        ))
    }
}

/// Up to `cap` bytes of a response body.
async fn read_capped(mut r: reqwest::Response, cap: usize) -> Bytes {
    let mut out = Vec::new();
    while let Ok(Some(c)) = r.chunk().await {
        let room = cap.saturating_sub(out.len());
        out.extend_from_slice(&c[..c.len().min(room)]);
        if out.len() >= cap {
            break;
        }
    }
    out.into()
}

/// Why a relayed response was cut.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// The engine's stream broke.
    #[error("the engine's response broke off: {0}")]
    Upstream(#[from] reqwest::Error),
    /// `--request-timeout` passed.
    #[error("the response took longer than --request-timeout")]
    Timeout,
    /// The drain timeout passed during shutdown.
    #[error("the router shut down")]
    Shutdown,
}

/// The engine's body on its way to the client: the first chunk (already
/// read), then the rest as it comes, cut at the request deadline or the
/// drain timeout. Dropping it (the client left) drops the engine's
/// response, which closes that connection, and ends the accounting.
struct Relay {
    first: Option<Bytes>,
    inner: Pin<Box<dyn Stream<Item = reqwest::Result<Bytes>> + Send>>,
    deadline: Pin<Box<tokio::time::Sleep>>,
    abort: Pin<Box<dyn Future<Output = ()> + Send>>,
    attempt: Attempt,
    adm: Admission,
    outcome: Outcome,
    ended: bool,
}

impl Relay {
    fn end(&mut self, v: Verdict, o: Outcome) {
        self.ended = true;
        self.attempt.finish(v);
        self.adm.outcome = Some(o);
    }
}

impl Stream for Relay {
    type Item = Result<Bytes, RelayError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if let Some(b) = this.first.take() {
            return Poll::Ready(Some(Ok(b)));
        }
        if this.ended {
            return Poll::Ready(None);
        }
        if this.deadline.as_mut().poll(cx).is_ready() {
            this.end(Verdict::Bad, Outcome::Timeout);
            return Poll::Ready(Some(Err(RelayError::Timeout)));
        }
        if this.abort.as_mut().poll(cx).is_ready() {
            this.end(Verdict::None, Outcome::Cancelled);
            return Poll::Ready(Some(Err(RelayError::Shutdown)));
        }
        match this.inner.as_mut().poll_next(cx) {
            Poll::Ready(Some(Ok(b))) => Poll::Ready(Some(Ok(b))),
            Poll::Ready(Some(Err(e))) => {
                this.end(Verdict::Bad, Outcome::UpstreamError);
                Poll::Ready(Some(Err(RelayError::Upstream(e))))
            }
            Poll::Ready(None) => {
                let o = this.outcome;
                this.end(Verdict::Good, o);
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }
}
