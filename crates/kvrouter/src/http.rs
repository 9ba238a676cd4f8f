//! The HTTP API (axum).
//!
//! Dynamo-compatible (the request and response JSON of `dynamo-kv-router`
//! 1.6.1's standalone indexer): `POST /register`, `POST /unregister`,
//! `GET /workers`, `POST /query`, `POST /query_by_hash`, `GET /dump`,
//! `GET /health`. Ours: `POST /route`, `POST /prefill_complete` (first
//! token out: its blocks stop counting as pending prefill), `POST
//! /complete`, `GET /ready`, `GET /replica` (with `--nats`), `GET /metrics`.
//! Every error is JSON `{"error": "..."}`.
//! With `--gateway`, [`crate::gateway::routes`] are merged in (OpenAI's
//! routes and error shape).
use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, FromRequest, Query, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use kvindex::{KvEventData, KvIndexer, OverlapScores, WorkerKey};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::registry::{FeedState, WorkerSpec};
use crate::service::{Prompt, Service, ServiceError};

/// A JSON body whose rejections are JSON errors too, with the status
/// codes of axum's `Json`: 415 without a JSON content type, 413 past the
/// body limit, 400 for malformed JSON, 422 for JSON of the wrong shape.
/// Parsed by `serde_json` directly: axum's `Json` also tracks the path of
/// every element (`serde_path_to_error`), which made a 4096-token
/// `/query` body cost 100 us to read instead of 64.
pub struct Body<T>(pub T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> FromRequest<S> for Body<T> {
    type Rejection = Response;
    async fn from_request(req: Request, state: &S) -> Result<Self, Response> {
        if !json_content_type(req.headers()) {
            return Err(bad_body(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "Expected request with `Content-Type: application/json`".into(),
            ));
        }
        let bytes = match axum::body::Bytes::from_request(req, state).await {
            Ok(b) => b,
            Err(e) => return Err(bad_body(e.status(), e.body_text())),
        };
        serde_json::from_slice(&bytes)
            .map(Body)
            .map_err(|e| match e.classify() {
                serde_json::error::Category::Data => bad_body(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    format!("Failed to deserialize the JSON body into the target type: {e}"),
                ),
                _ => bad_body(
                    StatusCode::BAD_REQUEST,
                    format!("Failed to parse the request body as JSON: {e}"),
                ),
            })
    }
}

/// `application/json` or `application/*+json`, parameters allowed.
fn json_content_type(h: &axum::http::HeaderMap) -> bool {
    let Some(ct) = h
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let mime = ct.split(';').next().unwrap_or("").trim();
    let Some((ty, sub)) = mime.split_once('/') else {
        return false;
    };
    ty.eq_ignore_ascii_case("application")
        && (sub.eq_ignore_ascii_case("json")
            || sub.len() > 5 && sub.as_bytes()[sub.len() - 5..].eq_ignore_ascii_case(b"+json"))
}

fn bad_body(status: StatusCode, msg: String) -> Response {
    metrics::counter!("kvrouter_http_bad_requests_total").increment(1);
    (status, Json(json!({ "error": msg }))).into_response()
}

fn error(status: StatusCode, msg: impl ToString) -> Response {
    (status, Json(json!({ "error": msg.to_string() }))).into_response()
}

impl IntoResponse for ServiceError {
    fn into_response(self) -> Response {
        let status = match &self {
            ServiceError::UnknownModel(_) | ServiceError::NotFound(_) => StatusCode::NOT_FOUND,
            ServiceError::NoWorkers(_) | ServiceError::Busy(_) => StatusCode::SERVICE_UNAVAILABLE,
            ServiceError::Register(crate::registry::RegisterError::BadBlockSize(_))
            | ServiceError::Feed(_)
            | ServiceError::Invalid(_) => StatusCode::BAD_REQUEST,
            ServiceError::Register(_) | ServiceError::Conflict(_) => StatusCode::CONFLICT,
            ServiceError::Snapshot(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        error(status, self)
    }
}

/// The router's HTTP routes over `svc`.
pub fn router(svc: Arc<Service>, metrics: metrics_exporter_prometheus::PrometheusHandle) -> Router {
    let limit = svc.args.max_body_bytes;
    // What needs an index: refused by a relay-only router.
    let index = Router::new()
        .route("/query", post(query))
        .route("/query_by_hash", post(query_by_hash))
        .route("/dump", get(dump))
        .route("/route", post(route))
        .route("/complete", post(complete))
        .route("/prefill_complete", post(prefill_complete))
        .route_layer(axum::middleware::from_fn_with_state(
            Arc::clone(&svc),
            refuse_when_relay_only,
        ));
    Router::new()
        .route("/register", post(register))
        .route("/unregister", post(unregister))
        .route("/workers", get(workers))
        .merge(index)
        .route("/health", get(|| async { StatusCode::OK }))
        .route("/ready", get(ready))
        .route("/replica", get(replica))
        .route(
            "/metrics",
            get(move |State(s): State<Arc<Service>>| async move {
                // The scrape walks each index (bytes held): off the
                // async workers.
                let text = tokio::task::spawn_blocking(move || {
                    crate::metrics::refresh(&s);
                    metrics.render()
                })
                .await
                .unwrap_or_default();
                (
                    [(
                        axum::http::header::CONTENT_TYPE,
                        "text/plain; version=0.0.4",
                    )],
                    text,
                )
            }),
        )
        .layer(DefaultBodyLimit::max(limit))
        .with_state(svc)
}

/// 503 from a relay-only router (`--nats-relay-only`): it builds no index.
async fn refuse_when_relay_only(
    State(s): State<Arc<Service>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if s.args.nats_relay_only {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "this router only relays engine events into NATS (--nats-relay-only) and keeps no index: ask a replica",
        );
    }
    next.run(req).await
}

fn default_group() -> String {
    "default".into()
}

#[derive(Deserialize)]
struct RegisterReq {
    instance_id: u64,
    /// May be left out in approximate mode (`--no-kv-events`).
    endpoint: Option<String>,
    model_name: String,
    #[serde(default = "default_group")]
    routing_group: String,
    block_size: u64,
    dp_rank: Option<u32>,
    replay_endpoint: Option<String>,
    /// The engine's HTTP base URL, for the gateway.
    url: Option<String>,
}

async fn register(State(s): State<Arc<Service>>, Body(r): Body<RegisterReq>) -> Response {
    if r.routing_group != "default" {
        return error(
            StatusCode::BAD_REQUEST,
            format!(
                "routing_group {:?}: this router has only the default group",
                r.routing_group
            ),
        );
    }
    let spec = WorkerSpec {
        key: WorkerKey::new(r.instance_id, r.dp_rank.unwrap_or(0)),
        model: r.model_name,
        block_size: r.block_size,
        endpoint: r.endpoint,
        replay_endpoint: r.replay_endpoint,
        url: r.url.map(|u| u.trim_end_matches('/').to_string()),
    };
    if let Err(e) = s.check_spec(&spec) {
        return e.into_response();
    }
    // Off the runtime: on a NATS link, registering asks the stream where
    // the worker's history stands.
    match tokio::task::spawn_blocking(move || s.register(spec)).await {
        Ok(Ok(())) => (StatusCode::CREATED, Json(json!({"status": "ok"}))).into_response(),
        Ok(Err(e)) => e.into_response(),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e),
    }
}

#[derive(Deserialize)]
struct UnregisterReq {
    instance_id: u64,
    model_name: String,
    dp_rank: Option<u32>,
}

async fn unregister(State(s): State<Arc<Service>>, Body(r): Body<UnregisterReq>) -> Response {
    let res =
        tokio::task::spawn_blocking(move || s.unregister(&r.model_name, r.instance_id, r.dp_rank))
            .await;
    match res {
        Ok(Ok(_)) => (StatusCode::OK, Json(json!({"status": "ok"}))).into_response(),
        Ok(Err(ServiceError::UnknownModel(m))) => error(
            StatusCode::NOT_FOUND,
            format!("no workers registered for model {m:?}"),
        ),
        Ok(Err(e)) => e.into_response(),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e),
    }
}

#[derive(Deserialize)]
struct WorkersQuery {
    model_name: Option<String>,
    routing_group: Option<String>,
}

#[derive(Serialize)]
struct Listener {
    endpoint: String,
    status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    last_error: Option<String>,
}

/// Our per-rank detail, beside Dynamo's fields.
#[derive(Serialize)]
struct Feed {
    state: FeedState,
    replay_endpoint: Option<String>,
    last_seq: Option<u64>,
    blocks: usize,
    batches: u64,
    events_applied: u64,
    events_rejected: u64,
    block_size_mismatches: u64,
    decode_errors: u64,
    gaps: u64,
    replays: u64,
    resyncs: u64,
    restarts: u64,
    healthy: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    problem: Option<String>,
    /// Requests routed to it and not yet complete.
    active_requests: u64,
    /// Blocks those requests still have to prefill.
    pending_prefill_blocks: u64,
}

#[derive(Serialize)]
struct WorkerInfo {
    instance_id: u64,
    source: &'static str,
    status: &'static str,
    model_name: String,
    routing_group: String,
    block_size: u64,
    endpoints: BTreeMap<u32, String>,
    /// The engines' HTTP base URLs, by rank (ranks registered with one).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    urls: BTreeMap<u32, String>,
    listeners: BTreeMap<u32, Listener>,
    feeds: BTreeMap<u32, Feed>,
}

fn status_word(state: FeedState, problem: bool) -> &'static str {
    match (state, problem) {
        (_, true) => "failed",
        (FeedState::Active | FeedState::Approximate, _) => "active",
        (FeedState::Replicated, _) => "replicated",
        (FeedState::Pending | FeedState::Replaying, _) => "pending",
    }
}

async fn workers(State(s): State<Arc<Service>>, Query(q): Query<WorkersQuery>) -> Response {
    use std::sync::atomic::Ordering::Relaxed;
    if q.routing_group.as_deref().is_some_and(|g| g != "default") {
        return Json(Vec::<WorkerInfo>::new()).into_response();
    }
    let mut out: Vec<WorkerInfo> = Vec::new();
    for m in s.models.all() {
        if q.model_name.as_deref().is_some_and(|n| n != m.name) {
            continue;
        }
        let mut by_id: BTreeMap<u64, WorkerInfo> = BTreeMap::new();
        let workers = m.workers.read();
        let loads: Vec<kvroute::WorkerLoad> = {
            let r = m.routing.lock();
            workers.keys().map(|k| r.loads.load(k, &[])).collect()
        };
        for ((k, w), load) in workers.iter().zip(loads) {
            let st = &w.status;
            let problem = st.problem();
            let word = status_word(st.state(), problem.is_some());
            let info = by_id.entry(k.worker_id).or_insert_with(|| WorkerInfo {
                instance_id: k.worker_id,
                source: "zmq",
                status: word,
                model_name: m.name.clone(),
                routing_group: "default".into(),
                block_size: m.block_size,
                endpoints: BTreeMap::new(),
                urls: BTreeMap::new(),
                listeners: BTreeMap::new(),
                feeds: BTreeMap::new(),
            });
            let ep = w.spec.endpoint.clone().unwrap_or_default();
            info.endpoints.insert(k.dp_rank, ep.clone());
            if let Some(u) = &w.spec.url {
                info.urls.insert(k.dp_rank, u.clone());
            }
            info.listeners.insert(
                k.dp_rank,
                Listener {
                    endpoint: ep,
                    status: word,
                    last_error: problem.clone(),
                },
            );
            // The instance is as good as its worst rank.
            if word == "failed" || (word == "pending" && info.status == "active") {
                info.status = word;
            }
            info.feeds.insert(
                k.dp_rank,
                Feed {
                    state: st.state(),
                    replay_endpoint: w.spec.replay_endpoint.clone(),
                    last_seq: st.last_seq(),
                    blocks: m.index.worker_block_count(*k),
                    batches: st.batches.load(Relaxed),
                    events_applied: st.events_applied.load(Relaxed),
                    events_rejected: st.events_rejected.load(Relaxed),
                    block_size_mismatches: st.block_size_mismatches.load(Relaxed),
                    decode_errors: st.decode_errors.load(Relaxed),
                    gaps: st.gaps.load(Relaxed),
                    replays: st.replays.load(Relaxed),
                    resyncs: st.resyncs.load(Relaxed),
                    restarts: st.restarts.load(Relaxed),
                    healthy: problem.is_none(),
                    problem,
                    active_requests: load.active_requests,
                    pending_prefill_blocks: load.pending_prefill_blocks,
                },
            );
        }
        out.extend(by_id.into_values());
    }
    Json(out).into_response()
}

#[derive(Deserialize)]
struct QueryReq {
    token_ids: Vec<u32>,
    model_name: String,
    lora_name: Option<String>,
    cache_salt: Option<String>,
    routing_group: Option<String>,
}

#[derive(Deserialize)]
struct QueryByHashReq {
    block_hashes: Vec<i64>,
    model_name: String,
    cache_salt: Option<serde_json::Value>,
    routing_group: Option<String>,
}

/// Only the default routing group exists: another is a model with no
/// index (404, as Dynamo answers for a group it does not hold).
fn other_group(model: &str, group: Option<&str>) -> Option<Response> {
    match group {
        None | Some("default") => None,
        Some(g) => Some(error(
            StatusCode::NOT_FOUND,
            format!("no index for model={model} routing_group={g}"),
        )),
    }
}

#[derive(Serialize)]
struct Summary {
    longest_matched: u32,
    gpu: u32,
    dp: BTreeMap<u32, u32>,
    cpu: u32,
    disk: u32,
}

/// Dynamo's score shape: tokens matched per instance and rank, how many
/// workers hold each depth, and a per-instance summary. Serialized as it
/// stands (integer keys become JSON strings), with no `Value` in between.
#[derive(Serialize)]
struct ScoreBody {
    scores: BTreeMap<u64, BTreeMap<u32, u32>>,
    frequencies: Vec<usize>,
    instances: BTreeMap<u64, Summary>,
}

fn score_json(scores: &OverlapScores, block_size: u64) -> ScoreBody {
    let bs = u32::try_from(block_size).unwrap_or(u32::MAX);
    let mut flat: BTreeMap<u64, BTreeMap<u32, u32>> = BTreeMap::new();
    let mut inst: BTreeMap<u64, Summary> = BTreeMap::new();
    let mut deepest = 0u32;
    for (w, n) in scores.iter() {
        let tokens = n.saturating_mul(bs);
        deepest = deepest.max(n);
        flat.entry(w.worker_id)
            .or_default()
            .insert(w.dp_rank, tokens);
        let e = inst.entry(w.worker_id).or_insert(Summary {
            longest_matched: 0,
            gpu: 0,
            dp: BTreeMap::new(),
            cpu: 0,
            disk: 0,
        });
        e.gpu = e.gpu.max(tokens);
        // Tiers are cumulative in Dynamo's summary; this index tracks one.
        e.cpu = e.gpu;
        e.disk = e.gpu;
        e.longest_matched = e.gpu;
        e.dp.insert(w.dp_rank, tokens);
    }
    // Workers holding each depth: one pass over the scores sorted deepest
    // first, not depth x workers.
    let mut depths: Vec<u32> = scores.iter().map(|(_, n)| n).collect();
    depths.sort_unstable_by(|a, b| b.cmp(a));
    let mut frequencies = vec![0usize; deepest as usize];
    let mut holding = 0usize;
    for d in (0..deepest).rev() {
        while holding < depths.len() && depths[holding] > d {
            holding += 1;
        }
        frequencies[d as usize] = holding;
    }
    ScoreBody {
        scores: flat,
        frequencies,
        instances: inst,
    }
}

async fn query(State(s): State<Arc<Service>>, Body(r): Body<QueryReq>) -> Response {
    if let Some(resp) = other_group(&r.model_name, r.routing_group.as_deref()) {
        return resp;
    }
    let p = Prompt::Tokens {
        token_ids: r.token_ids,
        lora_name: r.lora_name,
        cache_salt: r.cache_salt,
    };
    match s.query(&r.model_name, &p) {
        Ok((sc, bs)) => Json(score_json(&sc, bs)).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn query_by_hash(State(s): State<Arc<Service>>, Body(r): Body<QueryByHashReq>) -> Response {
    if let Some(resp) = other_group(&r.model_name, r.routing_group.as_deref()) {
        return resp;
    }
    if r.cache_salt.as_ref().is_some_and(|v| !v.is_null()) {
        return error(
            StatusCode::BAD_REQUEST,
            "cache_salt is not accepted by /query_by_hash: block_hashes must already include it",
        );
    }
    let p = Prompt::Hashes(r.block_hashes.iter().map(|&h| h as u64).collect());
    match s.query(&r.model_name, &p) {
        Ok((sc, bs)) => Json(score_json(&sc, bs)).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `/dump`: per model, events that rebuild its index, in Dynamo's
/// `RouterEvent` JSON, and its workers' last seqs (see [`crate::snapshot`]).
async fn dump(State(s): State<Arc<Service>>) -> Response {
    match tokio::task::spawn_blocking(move || crate::snapshot::take(&s)).await {
        Ok(v) => Json(v).into_response(),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e),
    }
}

/// One index event as Dynamo's `RouterEvent` JSON.
pub fn router_event_json(ev: &kvindex::KvEvent) -> serde_json::Value {
    let data = match &ev.data {
        KvEventData::Stored { parent, blocks } => json!({ "stored": {
            "parent_hash": parent.map(|p| p.0),
            "start_position": null,
            "blocks": blocks.iter().map(|b| json!({
                "block_hash": b.external.0,
                "tokens_hash": b.local.0,
                "mm_extra_info": null,
            })).collect::<Vec<_>>(),
        }}),
        KvEventData::Removed { hashes } => json!({ "removed": {
            "block_hashes": hashes.iter().map(|h| h.0).collect::<Vec<_>>(),
        }}),
        KvEventData::Cleared => json!("cleared"),
    };
    json!({
        "worker_id": ev.worker.worker_id,
        "storage_tier": "device",
        "event": { "event_id": ev.event_id, "data": data, "dp_rank": ev.worker.dp_rank },
    })
}

async fn replica(State(s): State<Arc<Service>>) -> Response {
    use std::sync::atomic::Ordering::Relaxed;
    let Some(n) = &s.nats else {
        return error(StatusCode::NOT_FOUND, "not a replica (no --nats)");
    };
    let st = &n.state;
    Json(json!({
        "replica_id": n.id,
        "stream": n.stream,
        "relay_only": n.args.nats_relay_only,
        "ready": n.ready(),
        "reachable": st.reachable.load(Relaxed),
        "applied_seq": st.applied.load(Relaxed),
        "stream_last_seq": st.stream_last.load(Relaxed),
        "lag": st.lag(),
        "snapshot_leader": st.leader.load(Relaxed),
        "snapshot_seq": st.snapshot_seq.load(Relaxed),
        "snapshots_written": st.snapshots_written.load(Relaxed),
        "gaps": st.gaps.load(Relaxed),
        "stale": st.stale.load(Relaxed),
        "batches": st.batches.load(Relaxed),
        "worker_gaps": st.worker_gaps.load(Relaxed),
        "workers": st.workers.lock().iter().map(|((m, k), seq)| json!({
            "model_name": m, "instance_id": k.worker_id, "dp_rank": k.dp_rank, "last_seq": seq,
        })).collect::<Vec<_>>(),
        "malformed": st.malformed.load(Relaxed),
    }))
    .into_response()
}

async fn ready(State(s): State<Arc<Service>>) -> Response {
    let (ok, waiting) = s.ready();
    let waiting: Vec<_> = waiting
        .iter()
        .map(|(m, k)| json!({"model_name": m, "instance_id": k.worker_id, "dp_rank": k.dp_rank}))
        .collect();
    let status = if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(json!({ "ready": ok, "waiting": waiting }))).into_response()
}

#[derive(Deserialize)]
struct RouteReq {
    model_name: String,
    token_ids: Option<Vec<u32>>,
    block_hashes: Option<Vec<i64>>,
    lora_name: Option<String>,
    cache_salt: Option<String>,
    request_id: Option<String>,
    /// A policy other than the router's default.
    policy: Option<String>,
    /// The caller's clock (replays); see `RouteOptions`.
    now_us: Option<u64>,
}

async fn route(State(s): State<Arc<Service>>, Body(r): Body<RouteReq>) -> Response {
    let p = match (r.token_ids, r.block_hashes) {
        (Some(t), None) => Prompt::Tokens {
            token_ids: t,
            lora_name: r.lora_name,
            cache_salt: r.cache_salt,
        },
        (None, Some(h)) => Prompt::Hashes(h.iter().map(|&x| x as u64).collect()),
        _ => {
            return error(
                StatusCode::BAD_REQUEST,
                "give exactly one of token_ids and block_hashes",
            )
        }
    };
    if r.request_id
        .as_ref()
        .is_some_and(|id| id.is_empty() || id.len() > 256)
    {
        return error(StatusCode::BAD_REQUEST, "request_id must be 1 to 256 bytes");
    }
    let policy = match r.policy.as_deref().map(str::parse::<kvroute::PolicyKind>) {
        None => None,
        Some(Ok(k)) => Some(k),
        Some(Err(e)) => return error(StatusCode::BAD_REQUEST, e),
    };
    let opts = crate::service::RouteOptions {
        policy,
        now_us: r.now_us,
        ..Default::default()
    };
    match s.route(&r.model_name, &p, r.request_id, opts) {
        Ok(d) => Json(d).into_response(),
        Err(e) => e.into_response(),
    }
}

#[derive(Deserialize)]
struct CompleteReq {
    request_id: String,
    model_name: Option<String>,
}

async fn complete(State(s): State<Arc<Service>>, Body(r): Body<CompleteReq>) -> Response {
    match s.complete(r.model_name.as_deref(), &r.request_id) {
        Ok(w) => Json(json!({"status": "ok", "worker_id": w.worker_id, "dp_rank": w.dp_rank}))
            .into_response(),
        Err(e) => e.into_response(),
    }
}

async fn prefill_complete(State(s): State<Arc<Service>>, Body(r): Body<CompleteReq>) -> Response {
    match s.prefill_complete(r.model_name.as_deref(), &r.request_id) {
        Ok(()) => Json(json!({"status": "ok"})).into_response(),
        Err(e) => e.into_response(),
    }
}
