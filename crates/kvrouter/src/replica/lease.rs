//! The snapshot lease and the snapshots.
//!
//! The lease is the key `writer` of the bucket `STREAM_lease`, whose
//! entries live `--nats-lease-ttl`. A replica takes it with a create (it
//! fails while another holds it) and keeps it with an update on the
//! revision it holds, every third of the time to live; a leader that
//! stops (killed, cut off) loses it when the entry expires, and the next
//! replica to try takes it. Only the holder writes snapshots, and it
//! renews the lease just before and during each write, abandoning the
//! write if that fails: two replicas never write at once.
//!
//! Snapshots are objects `snapshot-SEQ` (SEQ the stream sequence they
//! include, 20 digits) in the bucket `STREAM_snapshots`; the two newest
//! are kept.
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::io::AsyncReadExt;

use super::Nats;
use crate::record::Snapshot;

/// The lease's key.
const KEY: &str = "writer";
/// Snapshots kept.
const KEEP: usize = 2;

/// Holds (or tries to take) the lease and writes the snapshots the apply
/// thread takes while this replica holds it.
pub async fn keep(n: Arc<Nats>, mut snaps: tokio::sync::mpsc::Receiver<(u64, Vec<u8>)>) {
    let every = (n.args.nats_lease_ttl / 3).max(Duration::from_millis(100));
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut rev: Option<u64> = None;
    loop {
        tokio::select! {
            _ = tick.tick() => rev = hold(&n, rev).await,
            s = snaps.recv() => {
                let Some((seq, bytes)) = s else { return };
                rev = hold(&n, rev).await;
                if rev.is_some() {
                    rev = write(&n, seq, bytes, rev, every).await;
                }
            }
        }
    }
}

/// Renews the lease held at `rev`, or tries to take it; the revision held
/// after.
async fn hold(n: &Nats, rev: Option<u64>) -> Option<u64> {
    let st = &n.state;
    let got = match rev {
        Some(r) => n.lease.update(KEY, n.id.clone().into(), r).await.ok(),
        None => n.lease.create(KEY, n.id.clone().into()).await.ok(),
    };
    match (rev, got) {
        (None, Some(_)) => {
            // Newly the writer: continue from the newest snapshot written.
            if let Some(seq) = newest(n).await.first().map(|(s, _)| *s) {
                st.snapshot_seq.fetch_max(seq, Relaxed);
            }
            tracing::info!(replica = %n.id, "snapshot lease taken");
        }
        (Some(_), None) => tracing::warn!(replica = %n.id, "snapshot lease lost"),
        _ => {}
    }
    st.leader.store(got.is_some(), Relaxed);
    metrics::gauge!("kvrouter_replica_snapshot_leader").set(if got.is_some() { 1.0 } else { 0.0 });
    got
}

/// Writes one snapshot, renewing the lease meanwhile; abandoned if the
/// lease is lost.
async fn write(
    n: &Nats,
    seq: u64,
    bytes: Vec<u8>,
    mut rev: Option<u64>,
    every: Duration,
) -> Option<u64> {
    let t = std::time::Instant::now();
    let size = bytes.len();
    let meta = async_nats::jetstream::object_store::ObjectMetadata {
        name: name(seq),
        description: Some(format!("written by {}", n.id)),
        chunk_size: Some(1 << 20),
        ..Default::default()
    };
    let mut data = bytes.as_slice();
    let put = n.objects.put(meta, &mut data);
    tokio::pin!(put);
    let mut renew = tokio::time::interval(every);
    renew.tick().await;
    let done = loop {
        tokio::select! {
            r = &mut put => break r,
            _ = renew.tick() => {
                rev = hold(n, rev).await;
                if rev.is_none() {
                    tracing::warn!(seq, "snapshot abandoned: the lease was lost");
                    return None;
                }
            }
        }
    };
    match done {
        Ok(_) => {
            n.state.snapshots_written.fetch_add(1, Relaxed);
            metrics::counter!("kvrouter_replica_snapshots_written_total").increment(1);
            tracing::info!(
                seq,
                bytes = size,
                ms = t.elapsed().as_millis() as u64,
                "snapshot written"
            );
            for (_, old) in newest(n).await.into_iter().skip(KEEP) {
                let _ = n.objects.delete(&old).await;
            }
        }
        Err(e) => tracing::warn!(seq, error = %e, "snapshot not written"),
    }
    rev
}

/// Gives the lease up (on shutdown), if held.
pub async fn release(n: &Nats) {
    if n.state.leader.swap(false, Relaxed) {
        let _ = n.lease.delete(KEY).await;
    }
}

fn name(seq: u64) -> String {
    format!("snapshot-{seq:020}")
}

/// The snapshots in the bucket, newest first.
async fn newest(n: &Nats) -> Vec<(u64, String)> {
    let mut out = Vec::new();
    if let Ok(mut list) = n.objects.list().await {
        while let Some(Ok(o)) = list.next().await {
            if let Some(seq) = o
                .name
                .strip_prefix("snapshot-")
                .and_then(|s| s.parse::<u64>().ok())
            {
                out.push((seq, o.name));
            }
        }
    }
    out.sort_unstable_by(|a, b| b.cmp(a));
    out
}

/// The newest snapshot that reads whole, if any.
pub async fn load_latest(n: &Nats) -> Option<Snapshot> {
    for (seq, name) in newest(n).await {
        let mut buf = Vec::new();
        let read = async {
            let mut o = n.objects.get(&name).await.map_err(|e| e.to_string())?;
            o.read_to_end(&mut buf).await.map_err(|e| e.to_string())?;
            Snapshot::decode(&buf).map_err(|e| e.to_string())
        };
        match read.await {
            Ok(s) if s.stream_seq == seq => return Some(s),
            Ok(_) => tracing::warn!(name, "snapshot's sequence differs from its name: skipped"),
            Err(e) => tracing::warn!(name, error = %e, "snapshot unreadable: skipped"),
        }
    }
    None
}
