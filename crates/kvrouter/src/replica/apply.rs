//! The replica: the stream consumed in order and applied to the indexes.
//!
//! An ordered consumer (the client recreates it from the next sequence
//! after a server restart or a missed message) hands messages to one apply
//! thread through a bounded queue; the thread decodes each record and
//! applies it, so every replica applies the same records in the same
//! order. Per worker it keeps the last engine seq: a batch at or below it
//! is a late copy (a relay's retry) and is skipped; a batch past the next
//! one means records are missing, and the worker is cleared first, so an
//! index never keeps a block it may have lost the removal of.
//!
//! A sequence skipped by the stream itself (the replica fell behind the
//! stream's retention) reloads the newest snapshot if it covers the
//! hole; otherwise every worker is cleared and the replica goes on.
use std::collections::HashMap;
use std::sync::atomic::Ordering::{Relaxed, Release};
use std::sync::Arc;

use async_nats::jetstream::consumer::{pull::OrderedConfig, DeliverPolicy};
use futures_util::StreamExt;
use kvindex::{KvIndexer, WorkerKey};

use super::Nats;
use crate::convert::EventIds;
use crate::record::{Body, Record, Snapshot, SnapshotModel, SnapshotWorker, WorkerInfo};
use crate::registry::{FeedState, WorkerSpec};
use crate::service::Service;

/// A replica's view of one worker's stream.
struct Seen {
    last_seq: Option<u64>,
    ids: EventIds,
}

impl Default for Seen {
    fn default() -> Self {
        Self {
            last_seq: None,
            ids: EventIds::starting_at(0),
        }
    }
}

/// Applies records to a service's models; owned by the apply thread.
pub struct Applier {
    svc: Option<Arc<Service>>,
    seen: HashMap<(String, WorkerKey), Seen>,
    /// The last stream sequence applied.
    pub applied: u64,
}

impl Applier {
    /// An applier that has applied nothing.
    pub fn new() -> Self {
        Self {
            svc: None,
            seen: HashMap::new(),
            applied: 0,
        }
    }

    fn svc(&self) -> &Service {
        self.svc.as_deref().expect("bound to a service")
    }

    /// Binds the service (before anything is applied).
    pub fn bind(&mut self, svc: Arc<Service>) {
        self.svc = Some(svc);
    }

    /// The worker, created (without a feed) if the stream is the first to
    /// name it.
    fn worker(
        &self,
        model: &str,
        key: WorkerKey,
        info: &WorkerInfo,
    ) -> Option<Arc<crate::registry::Model>> {
        let svc = self.svc();
        if let Some(m) = svc.models.get(model) {
            if m.workers.read().contains_key(&key) {
                return Some(m);
            }
        }
        let spec = WorkerSpec {
            key,
            model: model.to_string(),
            block_size: u64::from(info.block_size),
            endpoint: info.endpoint.clone(),
            replay_endpoint: info.replay_endpoint.clone(),
            url: info.url.clone(),
        };
        match svc.models.add(spec) {
            Ok((m, w)) => {
                w.status.set_state(FeedState::Replicated);
                Some(m)
            }
            Err(crate::registry::RegisterError::Exists { .. }) => svc.models.get(model),
            Err(e) => {
                tracing::warn!(model, worker = ?key, error = %e, "replicated worker refused");
                None
            }
        }
    }

    /// Applies the record at stream sequence `seq`.
    pub fn apply(&mut self, seq: u64, payload: &[u8], state: &super::ReplicaState) {
        self.applied = seq;
        let rec = match Record::decode(payload) {
            Ok(r) => r,
            Err(e) => {
                state.malformed.fetch_add(1, Relaxed);
                metrics::counter!("kvrouter_replica_malformed_total").increment(1);
                tracing::warn!(seq, error = %e, "undecodable stream record");
                return;
            }
        };
        let (model, key) = (rec.subject.model, rec.subject.key);
        match rec.body {
            Body::Register(info) => {
                self.worker(&model, key, &info);
            }
            Body::Unregister => {
                self.svc().models.remove(&model, &[key]);
                self.seen.remove(&(model, key));
            }
            Body::Clear { seq: s, .. } => {
                if let Some(m) = self.svc().models.get(&model) {
                    m.index.remove_worker(key);
                }
                let e = self.seen.entry((model, key)).or_default();
                e.ids.reset();
                e.last_seq = s.checked_sub(1);
            }
            Body::Batch {
                seq: s,
                block_size,
                events,
                ..
            } => {
                let info = WorkerInfo {
                    block_size,
                    ..WorkerInfo::default()
                };
                let Some(m) = self.worker(&model, key, &info) else {
                    return;
                };
                let e = self.seen.entry((model, key)).or_default();
                match e.last_seq {
                    Some(l) if s <= l => {
                        state.stale.fetch_add(1, Relaxed);
                        metrics::counter!("kvrouter_replica_stale_total").increment(1);
                        return;
                    }
                    Some(l) if s > l + 1 => {
                        // Records of this worker are missing: forget it
                        // rather than keep what it may have evicted.
                        m.index.remove_worker(key);
                        e.ids.reset();
                        metrics::counter!("kvrouter_replica_worker_gaps_total").increment(1);
                    }
                    _ => {}
                }
                for data in events {
                    let ev = e.ids.event(key, data);
                    let _ = m.index.apply(&ev);
                }
                e.last_seq = Some(s);
                let w = m.workers.read().get(&key).cloned();
                if let Some(w) = w.filter(|w| w.status.state() == FeedState::Replicated) {
                    w.status.last_seq.store(s, Release);
                }
            }
        }
    }

    /// Every model's workers and index contents, as of the last sequence
    /// applied.
    pub fn snapshot(&self) -> Snapshot {
        let svc = self.svc();
        let mut models = Vec::new();
        for m in svc.models.all() {
            let workers = m
                .workers
                .read()
                .values()
                .map(|w| SnapshotWorker {
                    key: w.spec.key,
                    info: WorkerInfo {
                        block_size: m.block_size as u32,
                        endpoint: w.spec.endpoint.clone(),
                        replay_endpoint: w.spec.replay_endpoint.clone(),
                        url: w.spec.url.clone(),
                    },
                    last_seq: self
                        .seen
                        .get(&(m.name.clone(), w.spec.key))
                        .and_then(|s| s.last_seq),
                })
                .collect();
            models.push(SnapshotModel {
                name: m.name.clone(),
                block_size: m.block_size as u32,
                workers,
                events: m.index.dump(),
            });
        }
        Snapshot {
            stream_seq: self.applied,
            models,
        }
    }

    /// Replaces what the indexes hold with `snap`: every known worker is
    /// cleared, the snapshot's workers are created and their events
    /// applied. Returns the blocks stored.
    pub fn load(&mut self, snap: Snapshot) -> usize {
        let svc = Arc::clone(self.svc.as_ref().expect("bound to a service"));
        for m in svc.models.all() {
            for k in m.workers.read().keys() {
                m.index.remove_worker(*k);
            }
        }
        self.seen.clear();
        let mut blocks = 0;
        for sm in snap.models {
            for w in &sm.workers {
                self.worker(&sm.name, w.key, &w.info);
                let e = self.seen.entry((sm.name.clone(), w.key)).or_default();
                e.last_seq = w.last_seq;
            }
            let Some(m) = svc.models.get(&sm.name) else {
                continue;
            };
            if m.block_size != u64::from(sm.block_size) {
                tracing::warn!(model = %sm.name, "snapshot block size differs from the model's: skipped");
                continue;
            }
            for ev in sm.events {
                if let kvindex::KvEventData::Stored { blocks: b, .. } = &ev.data {
                    blocks += b.len();
                }
                let e = self.seen.entry((sm.name.clone(), ev.worker)).or_default();
                let ev = e.ids.event(ev.worker, ev.data);
                let _ = m.index.apply(&ev);
            }
        }
        self.applied = snap.stream_seq;
        blocks
    }
}

impl Default for Applier {
    fn default() -> Self {
        Self::new()
    }
}

/// One message for the apply thread.
struct Delivered {
    seq: u64,
    payload: bytes::Bytes,
}

/// Starts the consumer task (from the sequence after what `applier`
/// holds) and the apply thread.
pub fn start(
    n: Arc<Nats>,
    svc: Arc<Service>,
    mut applier: Applier,
    snapshots: tokio::sync::mpsc::Sender<(u64, Vec<u8>)>,
) -> Vec<tokio::task::JoinHandle<()>> {
    applier.bind(svc);
    n.state.applied.store(applier.applied, Relaxed);
    let (tx, rx) = tokio::sync::mpsc::channel::<Delivered>(n.args.nats_apply_queue.max(1));
    // Restarting the consumer from another sequence (after a snapshot
    // reload) goes through this channel.
    let (restart_tx, restart_rx) = tokio::sync::mpsc::unbounded_channel::<u64>();
    let consumer = tokio::spawn(consume(Arc::clone(&n), applier.applied + 1, tx, restart_rx));
    let nn = Arc::clone(&n);
    std::thread::Builder::new()
        .name("kvrouter-replica".into())
        .spawn(move || apply_loop(nn, applier, rx, restart_tx, snapshots))
        .expect("spawn the replica thread");
    vec![consumer]
}

async fn consume(
    n: Arc<Nats>,
    mut from: u64,
    tx: tokio::sync::mpsc::Sender<Delivered>,
    mut restart: tokio::sync::mpsc::UnboundedReceiver<u64>,
) {
    loop {
        let messages = async {
            let stream = n.js.get_stream(&n.stream).await.ok()?;
            let c = stream
                .create_consumer(OrderedConfig {
                    deliver_policy: DeliverPolicy::ByStartSequence {
                        start_sequence: from.max(1),
                    },
                    ..Default::default()
                })
                .await
                .ok()?;
            c.messages().await.ok()
        }
        .await;
        let Some(mut messages) = messages else {
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            continue;
        };
        loop {
            tokio::select! {
                m = messages.next() => {
                    let m = match m {
                        Some(Ok(m)) => m,
                        Some(Err(e)) => {
                            tracing::warn!(error = %e, "stream consumer error");
                            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                            break;
                        }
                        None => break,
                    };
                    let Ok(info) = m.info() else { continue };
                    let seq = info.stream_sequence;
                    from = seq + 1;
                    let d = Delivered { seq, payload: m.message.payload.clone() };
                    // The apply thread keeps up or the queue fills.
                    if tx.send(d).await.is_err() {
                        return;
                    }
                }
                r = restart.recv() => {
                    match r {
                        Some(s) => { from = s; break; }
                        None => return,
                    }
                }
            }
        }
    }
}

fn apply_loop(
    n: Arc<Nats>,
    mut a: Applier,
    mut rx: tokio::sync::mpsc::Receiver<Delivered>,
    restart: tokio::sync::mpsc::UnboundedSender<u64>,
    snapshots: tokio::sync::mpsc::Sender<(u64, Vec<u8>)>,
) {
    let st = Arc::clone(&n.state);
    let every = n.args.nats_snapshot_every;
    // Messages below this were covered by a reloaded snapshot.
    let mut skip_below = 0;
    while let Some(d) = rx.blocking_recv() {
        if d.seq < skip_below || d.seq <= a.applied && a.applied > 0 {
            continue;
        }
        if d.seq > a.applied + 1 && a.applied + 1 >= skip_below {
            // The stream no longer holds what this replica needs.
            st.gaps.fetch_add(1, Relaxed);
            metrics::counter!("kvrouter_replica_gaps_total").increment(1);
            let snap = n.rt.block_on(super::lease::load_latest(&n));
            match snap {
                Some(s) if s.stream_seq + 1 >= d.seq => {
                    tracing::warn!(
                        from = a.applied,
                        to = d.seq,
                        snapshot = s.stream_seq,
                        "fell behind the stream's retention: snapshot reloaded"
                    );
                    let next = s.stream_seq + 1;
                    a.load(s);
                    st.applied.store(a.applied, Relaxed);
                    if next > d.seq {
                        skip_below = next;
                        let _ = restart.send(next);
                        continue;
                    }
                }
                _ => {
                    tracing::warn!(
                        from = a.applied,
                        to = d.seq,
                        "fell behind the stream's retention: every worker cleared"
                    );
                    let svc = Arc::clone(a.svc.as_ref().expect("bound"));
                    for m in svc.models.all() {
                        for k in m.workers.read().keys() {
                            m.index.remove_worker(*k);
                        }
                    }
                    for s in a.seen.values_mut() {
                        s.ids.reset();
                        s.last_seq = None;
                    }
                }
            }
        }
        a.apply(d.seq, &d.payload, &st);
        st.applied.store(d.seq, Relaxed);
        let due = every > 0
            && st.leader.load(Relaxed)
            && d.seq >= st.snapshot_seq.load(Relaxed) + every
            && snapshots.capacity() > 0;
        if due {
            let t = std::time::Instant::now();
            let bytes = a.snapshot().encode();
            tracing::debug!(
                seq = d.seq,
                bytes = bytes.len(),
                ms = t.elapsed().as_millis() as u64,
                "snapshot taken"
            );
            // Marked now so the next is not taken while this uploads.
            st.snapshot_seq.store(d.seq, Relaxed);
            let _ = snapshots.try_send((d.seq, bytes));
        }
    }
}
