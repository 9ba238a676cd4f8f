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
                state.workers.lock().remove(&(model.clone(), key));
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
            Body::Batches {
                block_size,
                batches,
            } => {
                let info = WorkerInfo {
                    block_size,
                    ..WorkerInfo::default()
                };
                let Some(m) = self.worker(&model, key, &info) else {
                    return;
                };
                let e = self.seen.entry((model.clone(), key)).or_default();
                for b in batches {
                    match e.last_seq {
                        Some(l) if b.seq <= l => {
                            state.stale.fetch_add(1, Relaxed);
                            metrics::counter!("kvrouter_replica_stale_total").increment(1);
                            continue;
                        }
                        Some(l) if b.seq > l + 1 => {
                            // Records of this worker are missing: forget
                            // it rather than keep what it may have evicted.
                            m.index.remove_worker(key);
                            e.ids.reset();
                            state.worker_gaps.fetch_add(1, Relaxed);
                            metrics::counter!("kvrouter_replica_worker_gaps_total").increment(1);
                        }
                        _ => {}
                    }
                    for data in b.events {
                        let ev = e.ids.event(key, data);
                        let _ = m.index.apply(&ev);
                    }
                    e.last_seq = Some(b.seq);
                    state.batches.fetch_add(1, Relaxed);
                }
                if let Some(s) = e.last_seq {
                    state.workers.lock().insert((model, key), s);
                }
                let w = m.workers.read().get(&key).cloned();
                if let (Some(w), Some(s)) = (
                    w.filter(|w| w.status.state() == FeedState::Replicated),
                    e.last_seq,
                ) {
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

    /// Drops every worker's blocks and what the applier knew of its
    /// stream (the workers stay registered).
    fn forget_all(&mut self) {
        for m in self.svc().models.all() {
            for k in m.workers.read().keys() {
                m.index.remove_worker(*k);
            }
        }
        self.seen.clear();
        self.report();
    }

    /// Rewrites what the replica reports of each worker's stream (its
    /// last engine seq) from what the applier knows, after a load or a
    /// forget.
    fn report(&self) {
        let svc = self.svc();
        let Some(n) = &svc.nats else { return };
        let seqs: Vec<_> = self
            .seen
            .iter()
            .filter_map(|(mk, seen)| Some((mk, seen.last_seq?)))
            .collect();
        *n.state.workers.lock() = seqs
            .iter()
            .map(|((m, k), s)| ((m.clone(), *k), *s))
            .collect();
        for ((model, key), s) in seqs {
            let w = svc
                .models
                .get(model)
                .and_then(|m| m.workers.read().get(key).cloned());
            if let Some(w) = w.filter(|w| w.status.state() == FeedState::Replicated) {
                w.status.last_seq.store(s, Release);
            }
        }
    }

    /// Replaces what the indexes hold with `snap`: every known worker is
    /// cleared, the snapshot's workers are created and their events
    /// applied. Returns the blocks stored.
    pub fn load(&mut self, snap: Snapshot) -> usize {
        self.forget_all();
        let svc = Arc::clone(self.svc.as_ref().expect("bound to a service"));
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
        self.report();
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
                    st.snapshot_seq.store(s.stream_seq, Relaxed);
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
                    a.forget_all();
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{EngineBatch, Subject};
    use kvindex::{ExternalHash, KvEvent, KvEventData, LocalHash, ReferenceIndex, StoredBlock};
    use proptest::prelude::*;

    const W: WorkerKey = WorkerKey {
        worker_id: 1,
        dp_rank: 0,
    };

    /// Engine batches from `ops` (store a new root chain, or evict a
    /// stored block), and each chain's local hashes.
    fn batches(ops: &[(bool, u8)]) -> (Vec<EngineBatch>, Vec<Vec<LocalHash>>) {
        let (mut out, mut chains, mut held) = (Vec::new(), Vec::new(), Vec::new());
        let mut next = 1u64;
        for (i, &(store, x)) in ops.iter().enumerate() {
            let ev = if store || held.is_empty() {
                let blocks: Vec<StoredBlock> = (0..1 + x % 3)
                    .map(|_| {
                        next += 1;
                        held.push(next);
                        StoredBlock {
                            local: LocalHash(next.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
                            external: ExternalHash(next),
                        }
                    })
                    .collect();
                chains.push(blocks.iter().map(|b| b.local).collect());
                KvEventData::Stored {
                    parent: None,
                    blocks,
                }
            } else {
                let id = held.swap_remove(x as usize % held.len());
                KvEventData::Removed {
                    hashes: vec![ExternalHash(id)],
                }
            };
            out.push(EngineBatch {
                seq: i as u64,
                ts: 1.0,
                events: vec![ev],
            });
        }
        (out, chains)
    }

    fn record(body: Body) -> Vec<u8> {
        Record {
            subject: Subject {
                model: "m".into(),
                key: W,
            },
            body,
        }
        .encode()
    }

    /// `bs` cut into runs where `cut` says.
    fn runs(bs: &[EngineBatch], cut: &[bool]) -> Vec<Vec<EngineBatch>> {
        let mut out: Vec<Vec<EngineBatch>> = vec![Vec::new()];
        for (i, b) in bs.iter().enumerate() {
            if cut[i % cut.len()] && !out.last().is_some_and(Vec::is_empty) {
                out.push(Vec::new());
            }
            out.last_mut().expect("a run").push(b.clone());
        }
        out
    }

    /// Applies the messages (a registration first) to a fresh replica and
    /// compares every chain's overlap with the reference fed `bs` in order:
    /// equal if `exact`, else never more.
    fn check(
        msgs: &[Vec<EngineBatch>],
        bs: &[EngineBatch],
        chains: &[Vec<LocalHash>],
        exact: bool,
    ) -> Result<super::super::ReplicaState, TestCaseError> {
        let svc = Service::new(crate::RouterArgs::defaults()).expect("a service");
        let mut a = Applier::new();
        a.bind(Arc::clone(&svc));
        let st = super::super::ReplicaState::default();
        a.apply(
            1,
            &record(Body::Register(WorkerInfo {
                block_size: 16,
                ..Default::default()
            })),
            &st,
        );
        for (i, m) in msgs.iter().enumerate() {
            let body = Body::Batches {
                block_size: 16,
                batches: m.clone(),
            };
            a.apply(i as u64 + 2, &record(body), &st);
        }
        let reference = ReferenceIndex::new();
        for (i, b) in bs.iter().enumerate() {
            for data in &b.events {
                let _ = reference.apply(&KvEvent {
                    worker: W,
                    event_id: i as u64,
                    data: data.clone(),
                });
            }
        }
        let index = &svc.models.get("m").expect("the model").index;
        for c in chains {
            let (got, want) = (
                index.find_matches(c).get(W),
                reference.find_matches(c).get(W),
            );
            if exact {
                prop_assert_eq!(got, want);
            } else {
                prop_assert!(got <= want, "{} > {}", got, want);
            }
        }
        let (got, want) = (index.worker_block_count(W), reference.worker_block_count(W));
        if exact {
            prop_assert_eq!(got, want);
        } else {
            prop_assert!(got <= want);
        }
        Ok(st)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// One relay: runs cut anywhere, a suffix published again after a
        /// failed acknowledgement (cut differently): every batch applies
        /// exactly once.
        #[test]
        fn runs_and_republished_suffixes_apply_exactly_once(
            ops in proptest::collection::vec((any::<bool>(), any::<u8>()), 1..40),
            cut in proptest::collection::vec(any::<bool>(), 1..8),
            recut in proptest::collection::vec(any::<bool>(), 1..8),
            fail_at in any::<u8>(),
            back in any::<u8>(),
        ) {
            let (bs, chains) = batches(&ops);
            let first = runs(&bs, &cut);
            let k = fail_at as usize % (first.len() + 1);
            let from: usize = first[..k].iter().map(Vec::len).sum();
            let from = from.saturating_sub(back as usize % 4);
            let mut msgs: Vec<Vec<EngineBatch>> = first[..k].to_vec();
            msgs.extend(runs(&bs[from..], &recut));
            let st = check(&msgs, &bs, &chains, true)?;
            prop_assert_eq!(st.worker_gaps.load(Relaxed), 0);
            prop_assert_eq!(st.batches.load(Relaxed), bs.len() as u64);
        }

        /// Two relays cutting differently, their messages interleaved in any
        /// order and deduplicated by first-batch id as JetStream does: the
        /// replica may lose history (a hole clears the worker) but never
        /// holds a block the engine does not.
        #[test]
        fn two_relays_in_any_order_never_overcount(
            ops in proptest::collection::vec((any::<bool>(), any::<u8>()), 1..40),
            cut_a in proptest::collection::vec(any::<bool>(), 1..8),
            cut_b in proptest::collection::vec(any::<bool>(), 1..8),
            order in proptest::collection::vec(any::<bool>(), 1..80),
        ) {
            let (bs, chains) = batches(&ops);
            let (mut a, mut b) = (runs(&bs, &cut_a).into_iter(), runs(&bs, &cut_b).into_iter());
            let mut ids = std::collections::HashSet::new();
            let mut msgs = Vec::new();
            let mut i = 0;
            loop {
                let pick = order[i % order.len()];
                i += 1;
                let m = match (pick, a.len() > 0, b.len() > 0) {
                    (_, false, false) => break,
                    (true, true, _) | (_, true, false) => a.next(),
                    _ => b.next(),
                };
                let m = m.expect("a run");
                if ids.insert(m[0].seq) {
                    msgs.push(m);
                }
            }
            check(&msgs, &bs, &chains, false)?;
        }
    }
}
