//! Warm restart: the router's state as one JSON document, written to a
//! file and served as `GET /dump`.
//!
//! The document is Dynamo's dump (`{"MODEL:default": {"block_size": N,
//! "events": [RouterEvent, ..]}}`, which a Dynamo client reads unchanged)
//! plus, per model, `"workers"`: each worker's endpoints and the last seq
//! applied. A router started from it (`--snapshot FILE` on start, or
//! `--peer URL` for a new replica) loads the events into fresh indexes,
//! then subscribes to each worker asking the engine to replay from that
//! seq + 1.
//!
//! Each worker's seq is read before the index is dumped, so the dump holds
//! at least the batches up to it (possibly a few more, which the replay
//! then applies again: stores and removes are idempotent, in order).
//!
//! Files are written atomically: to `FILE.tmp`, fsync, rename, fsync the
//! directory.
use std::collections::HashMap;
use std::io::Write;
use std::path::Path;

use kvindex::{ExternalHash, KvEvent, KvEventData, KvIndexer, LocalHash, StoredBlock, WorkerKey};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::http::router_event_json;
use crate::registry::WorkerSpec;
use crate::service::{Service, ServiceError};

/// A worker as the snapshot records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerRecord {
    /// Instance id.
    pub instance_id: u64,
    /// Data-parallel rank.
    pub dp_rank: u32,
    /// Event endpoint (absent in approximate mode).
    pub endpoint: Option<String>,
    /// Replay endpoint.
    pub replay_endpoint: Option<String>,
    /// The last seq applied.
    pub last_seq: Option<u64>,
    /// The engine's HTTP base URL, for the gateway.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
}

/// Why a snapshot could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// Reading or writing the file.
    #[error("snapshot {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// Fetching a peer's dump.
    #[error("peer {url}: {reason}")]
    Peer {
        /// The peer.
        url: String,
        /// Why.
        reason: String,
    },
    /// Not a dump document.
    #[error("not a router dump: {0}")]
    Format(String),
    /// Registering a recorded worker.
    #[error(transparent)]
    Service(#[from] ServiceError),
}

/// The dump document of `svc`.
pub fn take(svc: &Service) -> Value {
    let mut out = serde_json::Map::new();
    for m in svc.models.all() {
        // Seqs first: the dump then holds at least what they say.
        let workers: Vec<WorkerRecord> = m
            .workers
            .read()
            .values()
            .map(|w| WorkerRecord {
                instance_id: w.spec.key.worker_id,
                dp_rank: w.spec.key.dp_rank,
                endpoint: w.spec.endpoint.clone(),
                replay_endpoint: w.spec.replay_endpoint.clone(),
                last_seq: w.status.last_seq(),
                url: w.spec.url.clone(),
            })
            .collect();
        let events: Vec<Value> = m.index.dump().iter().map(router_event_json).collect();
        out.insert(
            format!("{}:default", m.name),
            json!({ "block_size": m.block_size, "events": events, "workers": workers }),
        );
    }
    Value::Object(out)
}

/// Writes `doc` to `path` atomically.
pub fn write(path: &Path, doc: &Value) -> Result<(), SnapshotError> {
    let io = |source| SnapshotError::Io {
        path: path.display().to_string(),
        source,
    };
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp);
    let mut f = std::fs::File::create(&tmp).map_err(io)?;
    serde_json::to_writer(std::io::BufWriter::new(&mut f), doc)
        .map_err(|e| io(std::io::Error::other(e)))?;
    f.flush().map_err(io)?;
    f.sync_all().map_err(io)?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(io)?;
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Reads a snapshot file; `None` if there is none.
pub fn read(path: &Path) -> Result<Option<Value>, SnapshotError> {
    match std::fs::read(path) {
        Ok(b) => serde_json::from_slice(&b)
            .map(Some)
            .map_err(|e| SnapshotError::Format(e.to_string())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(SnapshotError::Io {
            path: path.display().to_string(),
            source,
        }),
    }
}

/// A peer router's `GET /dump`, for a new replica to start from.
pub fn fetch(base: &str) -> Result<Value, SnapshotError> {
    let url = format!("{}/dump", base.trim_end_matches('/'));
    let err = |reason: String| SnapshotError::Peer {
        url: url.clone(),
        reason,
    };
    let client = reqwest::blocking::Client::builder()
        .timeout(std::time::Duration::from_secs(60))
        .build()
        .map_err(|e| err(e.to_string()))?;
    let resp = client.get(&url).send().map_err(|e| err(e.to_string()))?;
    if !resp.status().is_success() {
        return Err(err(format!("status {}", resp.status())));
    }
    resp.json().map_err(|e| err(e.to_string()))
}

fn hash(v: &Value, what: &str) -> Result<u64, SnapshotError> {
    v.as_u64()
        .or_else(|| v.as_i64().map(|x| x as u64))
        .ok_or_else(|| SnapshotError::Format(format!("{what} is not a 64-bit integer: {v}")))
}

/// One `RouterEvent` back into an index event.
pub fn parse_event(v: &Value) -> Result<KvEvent, SnapshotError> {
    let bad = |m: &str| SnapshotError::Format(format!("{m}: {v}"));
    let worker_id = v["worker_id"].as_u64().ok_or_else(|| bad("no worker_id"))?;
    let ev = &v["event"];
    let dp_rank = ev["dp_rank"].as_u64().unwrap_or(0);
    let dp_rank = u32::try_from(dp_rank).map_err(|_| bad("dp_rank out of range"))?;
    let event_id = ev["event_id"].as_u64().ok_or_else(|| bad("no event_id"))?;
    let d = &ev["data"];
    let data = if d == "cleared" {
        KvEventData::Cleared
    } else if let Some(s) = d.get("stored") {
        let parent = match &s["parent_hash"] {
            Value::Null => None,
            p => Some(ExternalHash(hash(p, "parent_hash")?)),
        };
        let blocks = s["blocks"]
            .as_array()
            .ok_or_else(|| bad("stored without blocks"))?
            .iter()
            .map(|b| {
                Ok(StoredBlock {
                    external: ExternalHash(hash(&b["block_hash"], "block_hash")?),
                    local: LocalHash(hash(&b["tokens_hash"], "tokens_hash")?),
                })
            })
            .collect::<Result<_, SnapshotError>>()?;
        KvEventData::Stored { parent, blocks }
    } else if let Some(r) = d.get("removed") {
        let hashes = r["block_hashes"]
            .as_array()
            .ok_or_else(|| bad("removed without block_hashes"))?
            .iter()
            .map(|h| hash(h, "block_hash").map(ExternalHash))
            .collect::<Result<_, _>>()?;
        KvEventData::Removed { hashes }
    } else {
        return Err(bad("unknown event data"));
    };
    Ok(KvEvent {
        worker: WorkerKey::new(worker_id, dp_rank),
        event_id,
        data,
    })
}

/// What a restore loaded.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Restored {
    /// Models.
    pub models: usize,
    /// Events applied.
    pub events: usize,
    /// Workers registered from the document.
    pub workers: usize,
}

/// Loads `doc` into `svc` before any worker is subscribed: each model's
/// events into its index, then each recorded worker subscribed from its
/// seq + 1, with the endpoints of `configured` (the `--worker` flags and
/// the workers file) where they name the worker too.
pub fn restore(
    svc: &Service,
    doc: &Value,
    configured: &[WorkerSpec],
) -> Result<Restored, SnapshotError> {
    let models = doc
        .as_object()
        .ok_or_else(|| SnapshotError::Format("the document is not an object".into()))?;
    let mut r = Restored::default();
    for (key, m) in models {
        let name = key.strip_suffix(":default").unwrap_or(key);
        let block_size = m["block_size"]
            .as_u64()
            .ok_or_else(|| SnapshotError::Format(format!("{key}: no block_size")))?;
        let events = m["events"]
            .as_array()
            .ok_or_else(|| SnapshotError::Format(format!("{key}: no events")))?
            .iter()
            .map(parse_event)
            .collect::<Result<Vec<_>, _>>()?;
        let records: Vec<WorkerRecord> = match m.get("workers") {
            Some(w) => serde_json::from_value(w.clone())
                .map_err(|e| SnapshotError::Format(format!("{key}: workers: {e}")))?,
            None => Vec::new(),
        };
        let model = svc.models.ensure(name, block_size);
        if model.block_size != block_size {
            return Err(SnapshotError::Format(format!(
                "{key}: block size {block_size}, but the model runs {}",
                model.block_size
            )));
        }
        let mut first_ids: HashMap<WorkerKey, u64> = HashMap::new();
        for mut ev in events {
            let n = first_ids.entry(ev.worker).or_insert(0);
            ev.event_id = *n;
            *n += 1;
            let _ = model.index.apply(&ev);
            r.events += 1;
        }
        for rec in records {
            let k = WorkerKey::new(rec.instance_id, rec.dp_rank);
            // A worker also given by `--worker` or `--workers-file` takes
            // its endpoints from there.
            let spec = match configured.iter().find(|c| c.model == name && c.key == k) {
                Some(c) if c.block_size != block_size => {
                    return Err(SnapshotError::Format(format!(
                        "{key}: worker {k:?} is configured with block size {}, the snapshot holds {block_size}",
                        c.block_size
                    )))
                }
                Some(c) => c.clone(),
                None => WorkerSpec {
                    key: k,
                    model: name.to_string(),
                    block_size,
                    endpoint: rec.endpoint.clone(),
                    replay_endpoint: rec.replay_endpoint.clone(),
                    url: rec.url.clone(),
                },
            };
            let start = rec.last_seq.map_or(0, |s| s.saturating_add(1));
            svc.register_from(spec, start, first_ids.get(&k).copied().unwrap_or(0))?;
            r.workers += 1;
        }
        r.models += 1;
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn router_events_round_trip() {
        let evs = [
            KvEvent {
                worker: WorkerKey::new(3, 1),
                event_id: 9,
                data: KvEventData::Stored {
                    parent: Some(ExternalHash(u64::MAX)),
                    blocks: vec![StoredBlock {
                        external: ExternalHash(5),
                        local: LocalHash(6),
                    }],
                },
            },
            KvEvent {
                worker: WorkerKey::new(3, 0),
                event_id: 1,
                data: KvEventData::Removed {
                    hashes: vec![ExternalHash(5)],
                },
            },
            KvEvent {
                worker: WorkerKey::new(0, 0),
                event_id: 0,
                data: KvEventData::Cleared,
            },
        ];
        for e in evs {
            assert_eq!(parse_event(&router_event_json(&e)).unwrap(), e);
        }
        assert!(parse_event(&json!({"worker_id": 1})).is_err());
        assert!(
            parse_event(&json!({"worker_id": 1, "event": {"event_id": 0, "data": "x"}})).is_err()
        );
    }

    #[test]
    fn files_are_replaced_whole() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("snap.json");
        assert!(read(&p).unwrap().is_none());
        write(&p, &json!({"a": 1})).unwrap();
        write(&p, &json!({"b": 2})).unwrap();
        assert_eq!(read(&p).unwrap(), Some(json!({"b": 2})));
        assert!(!dir.path().join("snap.json.tmp").exists());
        std::fs::write(&p, b"{").unwrap();
        assert!(matches!(read(&p), Err(SnapshotError::Format(_))));
    }
}
