//! The relay: engine batches, converted on the ingest threads, published
//! into the stream in order.
//!
//! Message ids: `MODEL.ID.RANK.SEQ.TS` (TS the batch timestamp's bits), the
//! same from every relay that hears the batch and different for a
//! restarted engine's batch of the same seq, so JetStream keeps one copy
//! within its duplicate window. A relay starting on a worker asks the
//! stream for the worker's last record and wants the engine's history from
//! the seq after it: a restarted relay neither repeats nor skips.
//!
//! Publishing is pipelined (up to `WINDOW` acknowledgements outstanding).
//! If one fails, that message and every later one are published again,
//! in order, until acknowledged; replicas skip what arrives out of order
//! for a worker (see `apply`), so a failure costs at most a clear, never a
//! wrong block.
use std::collections::VecDeque;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::context::PublishAckFuture;
use async_nats::HeaderMap;
use bytes::Bytes;
use kvindex::{KvEventData, WorkerKey};

use super::Nats;
use crate::record::{batch_len, Body, ClearReason, EngineBatch, Record, Subject, WorkerInfo};

/// Acknowledgements awaited at once (the client allows 5,000).
const WINDOW: usize = 512;
/// Largest run of batches in one message, bytes (NATS takes 1 MiB by default).
const MAX_RUN_BYTES: usize = 256 << 10;

/// One message for the stream.
#[derive(Debug, Clone)]
pub struct Outgoing {
    /// Subject.
    pub subject: String,
    /// `Nats-Msg-Id`.
    pub id: String,
    /// The record.
    pub payload: Bytes,
}

/// One worker's side of the relay, owned by its feed on an ingest thread.
pub struct RelaySink {
    tx: tokio::sync::mpsc::Sender<Outgoing>,
    subject: String,
    id_base: String,
    model: String,
    key: WorkerKey,
    block_size: u32,
    /// A clear waiting for the batch that revealed it, whose id it takes.
    pending_clear: Option<ClearReason>,
    last_seq: Option<u64>,
    /// Batches read but not yet published, and the id of the first.
    run: Vec<EngineBatch>,
    run_id: String,
    run_bytes: usize,
}

impl RelaySink {
    /// The sink of `model`'s worker `key`.
    pub fn new(n: &Nats, model: &str, key: WorkerKey, block_size: u32) -> Self {
        Self {
            tx: n.relay.clone(),
            subject: n.subject(model, key),
            id_base: format!("{}.{}.{}", super::escape(model), key.worker_id, key.dp_rank),
            model: model.to_string(),
            key,
            block_size,
            pending_clear: None,
            last_seq: None,
            run: Vec::new(),
            run_id: String::new(),
            run_bytes: 0,
        }
    }

    fn send(&self, id: String, body: Body) {
        let rec = Record {
            subject: Subject {
                model: self.model.clone(),
                key: self.key,
            },
            body,
        };
        let out = Outgoing {
            subject: self.subject.clone(),
            id,
            payload: Bytes::from(rec.encode()),
        };
        // Waits while the publisher is behind: the ingest thread then
        // stops reading, and ZMQ's queues and replays take the strain.
        if self.tx.blocking_send(out).is_err() {
            tracing::warn!(worker = ?self.key, "relay stopped: batch not published");
        }
    }

    /// Adds one engine batch, converted, to the run published at the
    /// next [`flush`](Self::flush) (after a pending clear).
    pub fn batch(&mut self, seq: u64, ts: f64, events: Vec<KvEventData>) {
        // The id is written only where a message takes it: a clear, or the
        // first batch of a run.
        let id = |base: &str| format!("{base}.{seq}.{:x}", ts.to_bits());
        if let Some(reason) = self.pending_clear.take() {
            self.publish_run();
            self.send(
                format!("{}.c", id(&self.id_base)),
                Body::Clear { reason, seq },
            );
        }
        if self.run.is_empty() {
            self.run_id = id(&self.id_base);
        }
        let b = EngineBatch { seq, ts, events };
        self.run_bytes += batch_len(&b);
        self.run.push(b);
        self.last_seq = Some(seq);
        if self.run_bytes >= MAX_RUN_BYTES {
            self.publish_run();
        }
    }

    /// The worker's blocks are to be cleared before its next batch.
    pub fn clear(&mut self, why: ClearReason) {
        self.pending_clear = Some(why);
    }

    /// Publishes the run, and a clear that no batch followed: the ingest
    /// thread calls it once it has read what its sockets held.
    pub fn flush(&mut self) {
        self.publish_run();
        if let Some(reason) = self.pending_clear.take() {
            let seq = self.last_seq.map_or(0, |s| s + 1);
            self.send(
                format!("{}.{seq}.x.c", self.id_base),
                Body::Clear { reason, seq },
            );
        }
    }

    /// One message for the run, under its first batch's id: a relay that
    /// cut its runs elsewhere makes other ids for the later ones, and
    /// replicas skip the batches they already have.
    fn publish_run(&mut self) {
        if self.run.is_empty() {
            return;
        }
        let batches = std::mem::take(&mut self.run);
        self.run_bytes = 0;
        let id = std::mem::take(&mut self.run_id);
        self.send(
            id,
            Body::Batches {
                block_size: self.block_size,
                batches,
            },
        );
    }

    /// Publishes the worker's registration.
    pub fn register(&self, info: WorkerInfo) {
        self.send(
            format!("{}.r.{}", self.id_base, nuid()),
            Body::Register(info),
        );
    }

    /// Publishes the worker's removal.
    pub fn unregister(&self) {
        self.send(format!("{}.u.{}", self.id_base, nuid()), Body::Unregister);
    }
}

/// A unique suffix for records that are not to be deduplicated.
fn nuid() -> String {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "{t:x}-{}-{}",
        std::process::id(),
        N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    )
}

/// The engine seq a relay starting on `model`'s worker `key` wants first:
/// one past the last batch the stream holds for it (0 if none).
pub async fn start_seq(n: &Nats, model: &str, key: WorkerKey) -> u64 {
    let Ok(stream) = n.js.get_stream(&n.stream).await else {
        return 0;
    };
    match stream
        .get_last_raw_message_by_subject(&n.subject(model, key))
        .await
    {
        Ok(m) => match Record::decode(&m.payload).map(|r| r.body) {
            Ok(Body::Batches { batches, .. }) => batches.last().map_or(0, |b| b.seq + 1),
            Ok(Body::Clear { seq, .. }) => seq,
            _ => 0,
        },
        Err(_) => 0,
    }
}

async fn publish(n: &Nats, m: &Outgoing) -> Result<PublishAckFuture, async_nats::Error> {
    let mut h = HeaderMap::new();
    h.insert("Nats-Msg-Id", m.id.as_str());
    Ok(n.js
        .publish_with_headers(m.subject.clone(), h, m.payload.clone())
        .await?)
}

/// Publishes the relay's queue in order until the channel closes.
pub async fn publish_loop(n: Arc<Nats>, mut rx: tokio::sync::mpsc::Receiver<Outgoing>) {
    let mut window: VecDeque<(Outgoing, PublishAckFuture)> = VecDeque::new();
    loop {
        let next = if window.is_empty() {
            rx.recv().await
        } else {
            match rx.try_recv() {
                Ok(m) => Some(m),
                Err(tokio::sync::mpsc::error::TryRecvError::Empty) => {
                    settle(&n, &mut window, 1).await;
                    n.state.unacked.store(window.len(), Relaxed);
                    continue;
                }
                Err(tokio::sync::mpsc::error::TryRecvError::Disconnected) => None,
            }
        };
        let Some(m) = next else {
            settle(&n, &mut window, usize::MAX).await;
            return;
        };
        match publish(&n, &m).await {
            Ok(f) => window.push_back((m, f)),
            Err(e) => {
                tracing::warn!(error = %e, "publish failed; retrying in order");
                let mut redo: Vec<Outgoing> = window.drain(..).map(|(m, _)| m).collect();
                redo.push(m);
                republish(&n, redo).await;
            }
        }
        if window.len() >= WINDOW {
            settle(&n, &mut window, WINDOW / 2).await;
        }
        n.state.unacked.store(window.len(), Relaxed);
    }
}

/// Awaits up to `k` acknowledgements from the front of the window.
async fn settle(n: &Nats, window: &mut VecDeque<(Outgoing, PublishAckFuture)>, k: usize) {
    for _ in 0..k {
        let Some((m, f)) = window.pop_front() else {
            return;
        };
        match f.await {
            Ok(ack) => count(ack.duplicate),
            Err(e) => {
                tracing::warn!(error = %e, subject = %m.subject, "publish not acknowledged; retrying in order");
                let mut redo = vec![m];
                redo.extend(window.drain(..).map(|(m, _)| m));
                republish(n, redo).await;
                return;
            }
        }
    }
}

/// Publishes `msgs` one by one, each acknowledged before the next, until
/// all are: the slow path after a failure.
async fn republish(n: &Nats, msgs: Vec<Outgoing>) {
    for m in msgs {
        let mut wait = Duration::from_millis(50);
        loop {
            metrics::counter!("kvrouter_nats_publish_retries_total").increment(1);
            let r = match publish(n, &m).await {
                Ok(f) => f.await.map_err(async_nats::Error::from),
                Err(e) => Err(e),
            };
            match r {
                Ok(ack) => {
                    count(ack.duplicate);
                    break;
                }
                Err(e) => {
                    tracing::debug!(error = %e, "publish retry failed");
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(2));
                }
            }
        }
    }
}

fn count(duplicate: bool) {
    if duplicate {
        metrics::counter!("kvrouter_nats_duplicates_total").increment(1);
    } else {
        metrics::counter!("kvrouter_nats_published_total").increment(1);
    }
}
