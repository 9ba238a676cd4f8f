//! Live replay: the simulated engines publish real ZMQ streams in vLLM's
//! wire format, and every request is routed by a running router service
//! (`kvrouter`) through `POST /route`; `POST /prefill_complete` at its first
//! token and `POST /complete` when the simulated engine finishes it.
//!
//! Each engine is one XPUB socket on loopback (it waits for the router's
//! subscription before publishing), registered with the router
//! (`POST /register`) under a model of its own per run. A block's tokens
//! are derived from its local hash ([`block_tokens`], [`BLOCK_TOKENS`] of
//! them), so the router, hashing tokens, keys blocks as consistently as the
//! simulator does. Before each decision the driver waits until the router
//! has applied every batch published so far (its `/workers` sequence
//! numbers), so the router decides on the state the in-process simulation
//! would: only the transport differs. `/route` carries the simulated clock
//! (`now_us`) and the policy, so decays and tie-breaks follow the run.
use std::time::{Duration, Instant};

use kvindex::{KvEvent, KvEventData, LocalHash, StoredBlock};
use kvrouter::wire::{encode_batch, WireEvent};
use serde_json::{json, Value};

use crate::policy::PolicyKind;
use crate::replay::{Dispatch, ReplayError};

/// Tokens per block on the wire.
pub const BLOCK_TOKENS: usize = 16;

/// The tokens standing for the block with local hash `l`.
pub fn block_tokens(l: LocalHash) -> [u32; BLOCK_TOKENS] {
    let mut t = [0u32; BLOCK_TOKENS];
    for (j, x) in t.iter_mut().enumerate() {
        let h = xxhash_rust::xxh3::xxh3_64_with_seed(&l.0.to_le_bytes(), j as u64);
        *x = (h % 150_000) as u32;
    }
    t
}

fn live(e: impl std::fmt::Display) -> ReplayError {
    ReplayError::Live(e.to_string())
}

/// A live router as a [`Dispatch`].
pub struct LiveRouter {
    http: reqwest::blocking::Client,
    base: String,
    model: String,
    policy: PolicyKind,
    _ctx: zmq::Context,
    pubs: Vec<zmq::Socket>,
    /// Next seq per engine.
    seq: Vec<u64>,
    /// True when something was published since the router was last seen
    /// caught up.
    dirty: bool,
    /// How long to wait for the router to catch up.
    timeout: Duration,
}

impl LiveRouter {
    /// Binds `workers` publishers on loopback and registers them with the
    /// router at `base` under `model`.
    pub fn connect(
        base: &str,
        model: &str,
        workers: usize,
        policy: PolicyKind,
    ) -> Result<Self, ReplayError> {
        let http = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .map_err(live)?;
        let ctx = zmq::Context::new();
        let mut pubs = Vec::with_capacity(workers);
        for w in 0..workers {
            // XPUB: a PUB that also hears subscriptions, so nothing is
            // published before the router listens.
            let p = ctx.socket(zmq::XPUB).map_err(live)?;
            p.set_sndhwm(0).map_err(live)?;
            p.set_linger(0).map_err(live)?;
            p.bind("tcp://127.0.0.1:*").map_err(live)?;
            let ep = p
                .get_last_endpoint()
                .map_err(live)?
                .map_err(|_| live("a publisher endpoint that is not UTF-8"))?;
            let r = http
                .post(format!("{base}/register"))
                .json(
                    &json!({"instance_id": w, "endpoint": ep, "model_name": model,
                              "block_size": BLOCK_TOKENS}),
                )
                .send()
                .map_err(live)?;
            if !r.status().is_success() {
                let s = r.status();
                return Err(live(format!(
                    "register: {s}: {}",
                    r.text().unwrap_or_default()
                )));
            }
            pubs.push(p);
        }
        // Wait for each router subscription before anything is published.
        for p in &pubs {
            p.set_rcvtimeo(30_000).map_err(live)?;
            let sub = p
                .recv_bytes(0)
                .map_err(|e| live(format!("the router did not subscribe within 30 s: {e}")))?;
            if sub.first() != Some(&1) {
                return Err(live("an unexpected message on a publisher socket"));
            }
        }
        Ok(Self {
            http,
            base: base.trim_end_matches('/').to_string(),
            model: model.to_string(),
            policy,
            _ctx: ctx,
            seq: vec![0; workers],
            pubs,
            dirty: false,
            timeout: Duration::from_secs(30),
        })
    }

    fn post(&self, path: &str, body: &Value) -> Result<Value, ReplayError> {
        let r = self
            .http
            .post(format!("{}{path}", self.base))
            .json(body)
            .send()
            .map_err(live)?;
        let s = r.status();
        let v: Value = r.json().unwrap_or(Value::Null);
        if !s.is_success() {
            return Err(live(format!("{path}: {s}: {v}")));
        }
        Ok(v)
    }

    /// Waits until the router applied every batch published.
    fn catch_up(&mut self) -> Result<(), ReplayError> {
        if !self.dirty {
            return Ok(());
        }
        let t0 = Instant::now();
        loop {
            let v: Value = self
                .http
                .get(format!("{}/workers?model_name={}", self.base, self.model))
                .send()
                .and_then(|r| r.json())
                .map_err(live)?;
            let mut behind = false;
            for w in v.as_array().into_iter().flatten() {
                let id = w["instance_id"].as_u64().unwrap_or(u64::MAX) as usize;
                let want = self.seq.get(id).copied().unwrap_or(0);
                let got = w["feeds"]["0"]["last_seq"].as_u64().map_or(0, |s| s + 1);
                if got < want {
                    behind = true;
                }
            }
            if !behind {
                self.dirty = false;
                return Ok(());
            }
            if t0.elapsed() > self.timeout {
                return Err(live(format!(
                    "the router did not apply the published batches within {:?}",
                    self.timeout
                )));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// Unregisters the engines.
    pub fn close(self) {
        for w in 0..self.pubs.len() {
            let _ = self.post(
                "/unregister",
                &json!({"instance_id": w, "model_name": self.model}),
            );
        }
    }
}

/// An index event as the engine publishes it, tokens from [`block_tokens`].
pub fn wire_event(ev: &KvEvent) -> WireEvent {
    to_wire(ev, BLOCK_TOKENS, |blocks| {
        blocks.iter().flat_map(|b| block_tokens(b.local)).collect()
    })
}

/// An index event in vLLM's wire form (GPU tier, no LoRA), a `Stored`
/// event's token ids given by `tokens` for its blocks.
pub(crate) fn to_wire(
    ev: &KvEvent,
    block_size: usize,
    tokens: impl FnOnce(&[StoredBlock]) -> Vec<u32>,
) -> WireEvent {
    match &ev.data {
        KvEventData::Stored { parent, blocks } => WireEvent::Stored {
            block_hashes: blocks.iter().map(|b| b.external.0).collect(),
            parent: parent.map(|p| p.0),
            token_ids: tokens(blocks),
            block_size: block_size as u64,
            medium: Some("GPU".into()),
            lora_name: None,
        },
        KvEventData::Removed { hashes } => WireEvent::Removed {
            block_hashes: hashes.iter().map(|h| h.0).collect(),
            medium: Some("GPU".into()),
        },
        KvEventData::Cleared => WireEvent::Cleared,
    }
}

impl Dispatch for LiveRouter {
    fn route(
        &mut self,
        now_us: u64,
        id: usize,
        locals: &[LocalHash],
    ) -> Result<usize, ReplayError> {
        self.catch_up()?;
        let tokens: Vec<u32> = locals.iter().flat_map(|&l| block_tokens(l)).collect();
        let v = self.post(
            "/route",
            &json!({"model_name": self.model, "token_ids": tokens, "request_id": id.to_string(),
                    "policy": self.policy.name(), "now_us": now_us}),
        )?;
        v["worker_id"]
            .as_u64()
            .map(|w| w as usize)
            .ok_or_else(|| live(format!("/route answered {v}")))
    }

    fn publish(&mut self, now_us: u64, w: usize, events: &[KvEvent]) -> Result<(), ReplayError> {
        let evs: Vec<WireEvent> = events.iter().map(wire_event).collect();
        let payload = encode_batch(now_us as f64 / 1e6, &evs, None);
        let seq = self.seq[w];
        self.seq[w] += 1;
        self.pubs[w]
            .send_multipart([&b""[..], &seq.to_be_bytes()[..], &payload[..]], 0)
            .map_err(live)?;
        self.dirty = true;
        Ok(())
    }

    fn prefilled(&mut self, _now_us: u64, id: usize) -> Result<(), ReplayError> {
        self.post(
            "/prefill_complete",
            &json!({"request_id": id.to_string(), "model_name": self.model}),
        )
        .map(|_| ())
    }

    fn complete(&mut self, _now_us: u64, id: usize) -> Result<(), ReplayError> {
        self.post(
            "/complete",
            &json!({"request_id": id.to_string(), "model_name": self.model}),
        )
        .map(|_| ())
    }
}
