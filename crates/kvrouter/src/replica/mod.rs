//! Replicas on NATS JetStream (`--nats`).
//!
//! Every router on the stream is a replica: it builds its indexes only
//! from the stream, in stream order ([`apply`]), so all replicas converge
//! on the same answers. A router that subscribes to engines is also a
//! relay ([`relay`]): its ingest threads turn each engine batch into one
//! [`Record`](crate::record::Record) on the subject
//! `kv.STREAM.MODEL.ID.RANK`, with a message id made of the worker, the
//! engine seq and the batch's timestamp, so JetStream drops the copy a
//! second relay or a restarted one publishes. One replica at a time,
//! holder of a lease in a key-value bucket, writes snapshots to the object
//! store ([`lease`]); a new replica loads the newest and consumes the
//! stream from the next sequence.
pub mod apply;
pub mod lease;
pub mod relay;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, kv, object_store, stream};

use crate::config::RouterArgs;
use crate::record::Snapshot;

pub use relay::RelaySink;

/// Why the NATS side could not start.
#[derive(Debug, thiserror::Error)]
#[error("nats: {0}")]
pub struct NatsError(pub String);

fn err<E: std::fmt::Display>(what: &'static str) -> impl Fn(E) -> NatsError {
    move |e| NatsError(format!("{what}: {e}"))
}

/// What a replica reports: where it is in the stream, whether it can
/// reach the server, whether it writes snapshots.
#[derive(Debug, Default)]
pub struct ReplicaState {
    /// The last stream sequence applied.
    pub applied: AtomicU64,
    /// The stream's last sequence, as last read.
    pub stream_last: AtomicU64,
    /// The server answered the last stream-info request.
    pub reachable: AtomicBool,
    /// Caught up once (lag within the bound) since starting.
    pub caught_up: AtomicBool,
    /// Holds the snapshot lease.
    pub leader: AtomicBool,
    /// The stream sequence of the newest snapshot written or loaded.
    pub snapshot_seq: AtomicU64,
    /// Snapshots this replica wrote.
    pub snapshots_written: AtomicU64,
    /// Times the stream skipped sequences this replica needed (retention).
    pub gaps: AtomicU64,
    /// Relay messages awaiting their acknowledgement.
    pub unacked: std::sync::atomic::AtomicUsize,
    /// Records that could not be decoded.
    pub malformed: AtomicU64,
    /// Batches older than the worker's last, skipped.
    pub stale: AtomicU64,
    /// Engine batches applied.
    pub batches: AtomicU64,
    /// Times a worker's batches skipped seqs (its blocks were cleared).
    pub worker_gaps: AtomicU64,
    /// The engine seq of each worker's last batch applied, by (model, worker).
    pub workers: parking_lot::Mutex<std::collections::BTreeMap<(String, kvindex::WorkerKey), u64>>,
}

impl ReplicaState {
    /// Stream messages not yet applied.
    pub fn lag(&self) -> u64 {
        self.stream_last
            .load(Relaxed)
            .saturating_sub(self.applied.load(Relaxed))
    }
}

/// The connection to NATS and the buckets a router uses.
pub struct Nats {
    /// The client.
    pub client: async_nats::Client,
    /// JetStream.
    pub js: jetstream::Context,
    /// The stream's name.
    pub stream: String,
    /// Subject prefix, `kv.STREAM`.
    pub prefix: String,
    /// The snapshot lease bucket.
    pub lease: kv::Store,
    /// The snapshot bucket.
    pub objects: object_store::ObjectStore,
    /// The runtime the NATS tasks run on (ingest threads block on it).
    pub rt: tokio::runtime::Handle,
    /// This replica's name.
    pub id: String,
    /// Where the replica stands.
    pub state: Arc<ReplicaState>,
    /// The relay's outgoing queue.
    pub(crate) relay: tokio::sync::mpsc::Sender<relay::Outgoing>,
    relay_rx: parking_lot::Mutex<Option<tokio::sync::mpsc::Receiver<relay::Outgoing>>>,
    /// The snapshot fetched at start, loaded by `Service::with_nats`.
    pub(crate) initial: parking_lot::Mutex<Option<Snapshot>>,
    /// The applier `Service::with_nats` prepared, taken by `start`.
    pub(crate) applier: parking_lot::Mutex<Option<apply::Applier>>,
    /// Settings.
    pub args: RouterArgs,
}

impl Nats {
    /// Connects, creates (or opens) the stream and the buckets, and fetches
    /// the newest snapshot.
    pub async fn connect(args: &RouterArgs) -> Result<Arc<Self>, NatsError> {
        let url = args.nats.clone().unwrap_or_default();
        check_name(&args.nats_stream)?;
        // Pings every second: a server that stops answering is noticed in
        // seconds, not the default two minutes.
        let client = async_nats::ConnectOptions::new()
            .ping_interval(Duration::from_secs(1))
            .connection_timeout(Duration::from_secs(5))
            .retry_on_initial_connect()
            .connect(url.as_str())
            .await
            .map_err(err("connect"))?;
        let js = jetstream::new(client.clone());
        let prefix = format!("kv.{}", args.nats_stream);
        let storage = if args.nats_memory {
            stream::StorageType::Memory
        } else {
            stream::StorageType::File
        };
        let mut cfg = stream::Config {
            name: args.nats_stream.clone(),
            subjects: vec![format!("{prefix}.>")],
            max_age: args.nats_max_age,
            max_bytes: args.nats_max_bytes,
            storage,
            duplicate_window: Duration::from_secs(120).min(args.nats_max_age),
            discard: stream::DiscardPolicy::Old,
            ..Default::default()
        };
        if cfg.max_age.is_zero() {
            cfg.duplicate_window = Duration::from_secs(120);
        }
        wait_for(|| js.get_or_create_stream(cfg.clone()), "stream").await?;
        // The lease bucket's stream made here as the client's key-value
        // API makes it (that API first asks for account details that a
        // 2.9 server words differently), then opened as a bucket.
        let bucket = format!("{}_lease", args.nats_stream);
        let ttl = args.nats_lease_ttl.max(Duration::from_secs(1));
        let kv_stream = stream::Config {
            name: format!("KV_{bucket}"),
            subjects: vec![format!("$KV.{bucket}.>")],
            max_messages_per_subject: 1,
            max_age: ttl,
            duplicate_window: ttl.min(Duration::from_secs(120)),
            storage,
            allow_rollup: true,
            deny_delete: true,
            allow_direct: true,
            discard: stream::DiscardPolicy::New,
            num_replicas: 1,
            ..Default::default()
        };
        wait_for(
            || js.get_or_create_stream(kv_stream.clone()),
            "lease bucket",
        )
        .await?;
        let lease = wait_for(|| js.get_key_value(bucket.clone()), "lease bucket").await?;
        let objects = wait_for(
            || {
                js.create_object_store(object_store::Config {
                    bucket: format!("{}_snapshots", args.nats_stream),
                    storage,
                    ..Default::default()
                })
            },
            "snapshot bucket",
        )
        .await?;
        let (tx, rx) = tokio::sync::mpsc::channel(args.nats_relay_queue.max(1));
        let id = args
            .replica_id
            .clone()
            .unwrap_or_else(|| format!("{}-{}", hostname(), std::process::id()));
        let n = Arc::new(Self {
            client,
            js,
            stream: args.nats_stream.clone(),
            prefix,
            lease,
            objects,
            rt: tokio::runtime::Handle::current(),
            id,
            state: Arc::new(ReplicaState::default()),
            relay: tx,
            relay_rx: parking_lot::Mutex::new(Some(rx)),
            initial: parking_lot::Mutex::new(None),
            applier: parking_lot::Mutex::new(None),
            args: args.clone(),
        });
        // A relay that builds no index has no use for a snapshot.
        let snapshot = if args.nats_relay_only {
            None
        } else {
            lease::load_latest(&n).await
        };
        if let Some(s) = snapshot {
            tracing::info!(stream_seq = s.stream_seq, "snapshot fetched");
            n.state.snapshot_seq.store(s.stream_seq, Relaxed);
            *n.initial.lock() = Some(s);
        }
        Ok(n)
    }

    /// The subject of a model's worker.
    pub fn subject(&self, model: &str, key: kvindex::WorkerKey) -> String {
        format!(
            "{}.{}.{}.{}",
            self.prefix,
            escape(model),
            key.worker_id,
            key.dp_rank
        )
    }

    /// Starts the relay publisher, the consumer and the lease keeper for
    /// `svc` (built with this link). Returns their tasks.
    pub fn start(self: &Arc<Self>, svc: &Arc<crate::Service>) -> Vec<tokio::task::JoinHandle<()>> {
        let mut tasks = Vec::new();
        if let Some(rx) = self.relay_rx.lock().take() {
            tasks.push(tokio::spawn(relay::publish_loop(Arc::clone(self), rx)));
        }
        tasks.push(tokio::spawn(watch_stream(Arc::clone(self))));
        if self.args.nats_relay_only {
            return tasks;
        }
        let applier = self.applier.lock().take().unwrap_or_default();
        let (snap_tx, snap_rx) = tokio::sync::mpsc::channel(1);
        // A replica that writes no snapshots does not compete for the lease.
        if self.args.nats_snapshot_every > 0 {
            tasks.push(tokio::spawn(lease::keep(Arc::clone(self), snap_rx)));
        }
        tasks.extend(apply::start(
            Arc::clone(self),
            Arc::clone(svc),
            applier,
            snap_tx,
        ));
        tasks
    }

    /// Waits (up to 5 s) until the relay has published and had
    /// acknowledged everything queued so far.
    pub async fn flush_relay(&self) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while tokio::time::Instant::now() < deadline {
            let idle = self.relay.capacity() == self.relay.max_capacity()
                && self.state.unacked.load(Relaxed) == 0;
            if idle {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tracing::warn!("relay queue not flushed within 5 s");
    }

    /// True when the replica can serve: the server answers, and the
    /// stream messages not yet applied are within `--nats-max-lag` (a
    /// relay-only router: the server answers).
    pub fn ready(&self) -> bool {
        let s = &self.state;
        let reachable = s.reachable.load(Relaxed)
            && self.client.connection_state() == async_nats::connection::State::Connected;
        reachable
            && (self.args.nats_relay_only
                || s.caught_up.load(Relaxed) && s.lag() <= self.args.nats_max_lag)
    }
}

/// Reads the stream's last sequence every 250 ms: the replica's lag and
/// whether the server answers.
async fn watch_stream(n: Arc<Nats>) {
    let mut t = tokio::time::interval(Duration::from_millis(250));
    t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        t.tick().await;
        let info = tokio::time::timeout(Duration::from_secs(1), async {
            // One request: the stream's info comes with it.
            let s = n.js.get_stream(&n.stream).await.ok()?;
            Some(s.cached_info().state.last_sequence)
        })
        .await
        .ok()
        .flatten();
        let st = &n.state;
        match info {
            Some(last) => {
                st.stream_last.store(last, Relaxed);
                st.reachable.store(true, Relaxed);
                if st.lag() <= n.args.nats_max_lag {
                    st.caught_up.store(true, Relaxed);
                }
            }
            None => st.reachable.store(false, Relaxed),
        }
        metrics::gauge!("kvrouter_replica_lag").set(st.lag() as f64);
        metrics::gauge!("kvrouter_replica_applied_seq").set(st.applied.load(Relaxed) as f64);
        metrics::gauge!("kvrouter_replica_ready").set(if n.ready() { 1.0 } else { 0.0 });
    }
}

/// Retries `f` for up to 10 s (a server just started may not have
/// JetStream ready yet).
async fn wait_for<T, E: std::fmt::Display, F: std::future::Future<Output = Result<T, E>>>(
    f: impl Fn() -> F,
    what: &'static str,
) -> Result<T, NatsError> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match f().await {
            Ok(v) => return Ok(v),
            Err(e) if tokio::time::Instant::now() >= deadline => {
                return Err(NatsError(format!("{what}: {e}")))
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

fn check_name(s: &str) -> Result<(), NatsError> {
    let ok = !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(NatsError(format!(
            "--nats-stream {s:?}: letters, digits, '_' and '-' only, at most 64"
        )))
    }
}

/// A model name as one subject token: letters, digits, `_` and `-` kept,
/// every other byte `~XX`.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' {
            out.push(b as char);
        } else {
            out.push_str(&format!("~{b:02x}"));
        }
    }
    if out.is_empty() {
        out.push('~');
    }
    out
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "router".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_names_become_one_token() {
        assert_eq!(
            escape("meta-llama/Llama-3.1_8B"),
            "meta-llama~2fLlama-3~2e1_8B"
        );
        assert_eq!(escape(""), "~");
        assert_eq!(escape("a b*>"), "a~20b~2a~3e");
        assert!(check_name("ARBOR_KV").is_ok());
        assert!(check_name("a.b").is_err());
        assert!(check_name("").is_err());
    }
}
