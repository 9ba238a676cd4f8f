//! The replicas' binary formats: stream records (one per engine batch or
//! worker change, as a relay publishes them) and snapshots (every model's
//! workers and index contents at a stream sequence).
//!
//! Little-endian, fixed-width integers, strings as a `u16` length and
//! UTF-8 bytes. Records carry index events already converted (local hashes
//! computed from the engine's tokens), so a replica applies them without
//! the tokens: 16 bytes a stored block instead of the tokens' 4 each.
//! Decoding checks every length against the bytes left before it
//! allocates, so a corrupt message costs nothing and never panics.
use kvindex::{ExternalHash, KvEvent, KvEventData, LocalHash, StoredBlock, WorkerKey};

/// First byte of every record.
const RECORD_VERSION: u8 = 1;
/// First bytes of every snapshot.
const SNAPSHOT_MAGIC: &[u8; 8] = b"ARBKVSN1";

/// Why bytes are not a record or snapshot.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    /// The input ends inside a value.
    #[error("truncated at byte {0}")]
    Truncated(usize),
    /// An unknown version, kind or tag, or bytes left over.
    #[error("{0}")]
    Invalid(String),
}

/// Which worker of which model a record is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subject {
    /// The model.
    pub model: String,
    /// The worker.
    pub key: WorkerKey,
}

/// A worker's registration as the stream and snapshots carry it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct WorkerInfo {
    /// Tokens per block.
    pub block_size: u32,
    /// Event endpoint.
    pub endpoint: Option<String>,
    /// Replay endpoint.
    pub replay_endpoint: Option<String>,
    /// The engine's HTTP base URL.
    pub url: Option<String>,
}

/// Why a relay cleared a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClearReason {
    /// The engine restarted (its seq went back).
    Restart,
    /// History was lost (a gap no replay could fill).
    Resync,
}

/// One engine batch, converted.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineBatch {
    /// The engine's seq of the batch.
    pub seq: u64,
    /// The engine's timestamp of the batch.
    pub ts: f64,
    /// Its index events, in order.
    pub events: Vec<KvEventData>,
}

/// What one stream message says.
#[derive(Debug, Clone, PartialEq)]
pub enum Body {
    /// A worker was registered (again: a relay restarted).
    Register(WorkerInfo),
    /// Consecutive engine batches of the worker (one, or the run its
    /// relay read at once), converted.
    Batches {
        /// The worker's block size (a replica that never saw the
        /// registration, cut by retention, registers the worker with it).
        block_size: u32,
        /// The batches, in seq order.
        batches: Vec<EngineBatch>,
    },
    /// The worker's blocks are to be dropped.
    Clear {
        /// Why.
        reason: ClearReason,
        /// The seq of the batch that revealed it.
        seq: u64,
    },
    /// The worker was unregistered.
    Unregister,
}

/// A stream message: about whom, and what.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// Model and worker.
    pub subject: Subject,
    /// The change.
    pub body: Body,
}

impl Record {
    /// Its bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Vec::with_capacity(64);
        w.push(RECORD_VERSION);
        let kind = match &self.body {
            Body::Register(_) => 1,
            Body::Batches { .. } => 2,
            Body::Clear { .. } => 3,
            Body::Unregister => 4,
        };
        w.push(kind);
        put_str(&mut w, &self.subject.model);
        put_key(&mut w, self.subject.key);
        match &self.body {
            Body::Register(info) => put_info(&mut w, info),
            Body::Batches {
                block_size,
                batches,
            } => {
                w.extend_from_slice(&block_size.to_le_bytes());
                w.extend_from_slice(&(batches.len() as u32).to_le_bytes());
                for b in batches {
                    put_batch(&mut w, b);
                }
            }
            Body::Clear { reason, seq } => {
                w.push(match reason {
                    ClearReason::Restart => 0,
                    ClearReason::Resync => 1,
                });
                w.extend_from_slice(&seq.to_le_bytes());
            }
            Body::Unregister => {}
        }
        w
    }

    /// Reads a record; the whole input must be one.
    pub fn decode(b: &[u8]) -> Result<Self, FormatError> {
        let mut r = Reader { b, at: 0 };
        let v = r.u8()?;
        if v != RECORD_VERSION {
            return Err(FormatError::Invalid(format!("record version {v}")));
        }
        let kind = r.u8()?;
        let subject = Subject {
            model: r.str()?,
            key: r.key()?,
        };
        let body = match kind {
            1 => Body::Register(r.info()?),
            2 => {
                let block_size = r.u32()?;
                let n = r.u32()? as usize;
                // Every batch takes at least 20 bytes.
                r.need(n.saturating_mul(20))?;
                let mut batches = Vec::with_capacity(n);
                for _ in 0..n {
                    batches.push(r.batch()?);
                }
                Body::Batches {
                    block_size,
                    batches,
                }
            }
            3 => {
                let reason = match r.u8()? {
                    0 => ClearReason::Restart,
                    1 => ClearReason::Resync,
                    x => return Err(FormatError::Invalid(format!("clear reason {x}"))),
                };
                Body::Clear {
                    reason,
                    seq: r.u64()?,
                }
            }
            4 => Body::Unregister,
            k => return Err(FormatError::Invalid(format!("record kind {k}"))),
        };
        r.end()?;
        Ok(Self { subject, body })
    }
}

/// One worker in a snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotWorker {
    /// The worker.
    pub key: WorkerKey,
    /// Its registration.
    pub info: WorkerInfo,
    /// The engine seq of its last batch applied.
    pub last_seq: Option<u64>,
}

/// One model in a snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotModel {
    /// Its name.
    pub name: String,
    /// Tokens per block.
    pub block_size: u32,
    /// Its workers.
    pub workers: Vec<SnapshotWorker>,
    /// Events that rebuild its index (the index's dump).
    pub events: Vec<KvEvent>,
}

/// Every model at one stream sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// The last stream sequence the contents include.
    pub stream_seq: u64,
    /// The models.
    pub models: Vec<SnapshotModel>,
}

impl Snapshot {
    /// Its bytes.
    pub fn encode(&self) -> Vec<u8> {
        let blocks: usize = self
            .models
            .iter()
            .flat_map(|m| &m.events)
            .map(|e| match &e.data {
                KvEventData::Stored { blocks, .. } => blocks.len(),
                KvEventData::Removed { hashes } => hashes.len(),
                KvEventData::Cleared => 0,
            })
            .sum();
        let mut w = Vec::with_capacity(64 + blocks * 16);
        w.extend_from_slice(SNAPSHOT_MAGIC);
        w.extend_from_slice(&self.stream_seq.to_le_bytes());
        w.extend_from_slice(&(self.models.len() as u32).to_le_bytes());
        for m in &self.models {
            put_str(&mut w, &m.name);
            w.extend_from_slice(&m.block_size.to_le_bytes());
            w.extend_from_slice(&(m.workers.len() as u32).to_le_bytes());
            for sw in &m.workers {
                put_key(&mut w, sw.key);
                put_info(&mut w, &sw.info);
                put_opt_u64(&mut w, sw.last_seq);
            }
            w.extend_from_slice(&(m.events.len() as u64).to_le_bytes());
            for e in &m.events {
                put_key(&mut w, e.worker);
                put_event(&mut w, &e.data);
            }
        }
        w
    }

    /// Reads a snapshot; event ids come out 0 (the loader numbers them).
    pub fn decode(b: &[u8]) -> Result<Self, FormatError> {
        let mut r = Reader { b, at: 0 };
        if r.take(8)? != SNAPSHOT_MAGIC {
            return Err(FormatError::Invalid("not a snapshot".into()));
        }
        let stream_seq = r.u64()?;
        let n = r.u32()? as usize;
        r.need(n)?;
        let mut models = Vec::with_capacity(n);
        for _ in 0..n {
            let name = r.str()?;
            let block_size = r.u32()?;
            let nw = r.u32()? as usize;
            r.need(nw)?;
            let mut workers = Vec::with_capacity(nw);
            for _ in 0..nw {
                workers.push(SnapshotWorker {
                    key: r.key()?,
                    info: r.info()?,
                    last_seq: r.opt_u64()?,
                });
            }
            let ne = r.u64()?;
            let ne =
                usize::try_from(ne).map_err(|_| FormatError::Invalid(format!("{ne} events")))?;
            // Every event takes at least its worker key and tag.
            r.need(ne.saturating_mul(13))?;
            let mut events = Vec::with_capacity(ne);
            for _ in 0..ne {
                let worker = r.key()?;
                events.push(KvEvent {
                    worker,
                    event_id: 0,
                    data: r.event()?,
                });
            }
            models.push(SnapshotModel {
                name,
                block_size,
                workers,
                events,
            });
        }
        r.end()?;
        Ok(Self { stream_seq, models })
    }
}

/// Bytes [`put_batch`] writes for `b`.
pub fn batch_len(b: &EngineBatch) -> usize {
    20 + b
        .events
        .iter()
        .map(|e| match e {
            KvEventData::Stored { parent, blocks } => {
                6 + if parent.is_some() { 8 } else { 0 } + 16 * blocks.len()
            }
            KvEventData::Removed { hashes } => 5 + 8 * hashes.len(),
            KvEventData::Cleared => 1,
        })
        .sum::<usize>()
}

fn put_batch(w: &mut Vec<u8>, b: &EngineBatch) {
    w.extend_from_slice(&b.seq.to_le_bytes());
    w.extend_from_slice(&b.ts.to_le_bytes());
    w.extend_from_slice(&(b.events.len() as u32).to_le_bytes());
    for e in &b.events {
        put_event(w, e);
    }
}

fn put_str(w: &mut Vec<u8>, s: &str) {
    // Names and endpoints are bounded where they enter (flags, requests);
    // a longer one is cut at a character boundary rather than refused here.
    let mut n = s.len().min(u16::MAX as usize);
    while !s.is_char_boundary(n) {
        n -= 1;
    }
    w.extend_from_slice(&(n as u16).to_le_bytes());
    w.extend_from_slice(&s.as_bytes()[..n]);
}

fn put_opt_str(w: &mut Vec<u8>, s: &Option<String>) {
    match s {
        None => w.push(0),
        Some(s) => {
            w.push(1);
            put_str(w, s);
        }
    }
}

fn put_opt_u64(w: &mut Vec<u8>, v: Option<u64>) {
    match v {
        None => w.push(0),
        Some(v) => {
            w.push(1);
            w.extend_from_slice(&v.to_le_bytes());
        }
    }
}

fn put_key(w: &mut Vec<u8>, k: WorkerKey) {
    w.extend_from_slice(&k.worker_id.to_le_bytes());
    w.extend_from_slice(&k.dp_rank.to_le_bytes());
}

fn put_info(w: &mut Vec<u8>, i: &WorkerInfo) {
    w.extend_from_slice(&i.block_size.to_le_bytes());
    put_opt_str(w, &i.endpoint);
    put_opt_str(w, &i.replay_endpoint);
    put_opt_str(w, &i.url);
}

fn put_event(w: &mut Vec<u8>, e: &KvEventData) {
    match e {
        KvEventData::Stored { parent, blocks } => {
            w.push(0);
            put_opt_u64(w, parent.map(|p| p.0));
            w.extend_from_slice(&(blocks.len() as u32).to_le_bytes());
            for b in blocks {
                w.extend_from_slice(&b.local.0.to_le_bytes());
                w.extend_from_slice(&b.external.0.to_le_bytes());
            }
        }
        KvEventData::Removed { hashes } => {
            w.push(1);
            w.extend_from_slice(&(hashes.len() as u32).to_le_bytes());
            for h in hashes {
                w.extend_from_slice(&h.0.to_le_bytes());
            }
        }
        KvEventData::Cleared => w.push(2),
    }
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn need(&self, n: usize) -> Result<(), FormatError> {
        if self.b.len() - self.at < n {
            Err(FormatError::Truncated(self.b.len()))
        } else {
            Ok(())
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], FormatError> {
        self.need(n)?;
        let s = &self.b[self.at..self.at + n];
        self.at += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], FormatError> {
        let mut a = [0; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    fn u8(&mut self) -> Result<u8, FormatError> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32, FormatError> {
        self.array().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Result<u64, FormatError> {
        self.array().map(u64::from_le_bytes)
    }

    fn flag(&mut self) -> Result<bool, FormatError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            x => Err(FormatError::Invalid(format!(
                "flag {x} at byte {}",
                self.at - 1
            ))),
        }
    }

    fn opt_u64(&mut self) -> Result<Option<u64>, FormatError> {
        Ok(if self.flag()? {
            Some(self.u64()?)
        } else {
            None
        })
    }

    fn str(&mut self) -> Result<String, FormatError> {
        let n = u16::from_le_bytes(self.array()?) as usize;
        let at = self.at;
        std::str::from_utf8(self.take(n)?)
            .map(str::to_owned)
            .map_err(|_| FormatError::Invalid(format!("a string at byte {at} is not UTF-8")))
    }

    fn opt_str(&mut self) -> Result<Option<String>, FormatError> {
        Ok(if self.flag()? {
            Some(self.str()?)
        } else {
            None
        })
    }

    fn key(&mut self) -> Result<WorkerKey, FormatError> {
        Ok(WorkerKey::new(self.u64()?, self.u32()?))
    }

    fn info(&mut self) -> Result<WorkerInfo, FormatError> {
        Ok(WorkerInfo {
            block_size: self.u32()?,
            endpoint: self.opt_str()?,
            replay_endpoint: self.opt_str()?,
            url: self.opt_str()?,
        })
    }

    fn batch(&mut self) -> Result<EngineBatch, FormatError> {
        let seq = self.u64()?;
        let ts = f64::from_bits(self.u64()?);
        let n = self.u32()? as usize;
        // Every event takes at least its tag byte.
        self.need(n)?;
        let mut events = Vec::with_capacity(n);
        for _ in 0..n {
            events.push(self.event()?);
        }
        Ok(EngineBatch { seq, ts, events })
    }

    fn event(&mut self) -> Result<KvEventData, FormatError> {
        match self.u8()? {
            0 => {
                let parent = self.opt_u64()?.map(ExternalHash);
                let n = self.u32()? as usize;
                let bytes = self.take(n.checked_mul(16).ok_or(FormatError::Truncated(0))?)?;
                let blocks = bytes
                    .chunks_exact(16)
                    .map(|c| StoredBlock {
                        local: LocalHash(u64::from_le_bytes(c[..8].try_into().unwrap_or_default())),
                        external: ExternalHash(u64::from_le_bytes(
                            c[8..].try_into().unwrap_or_default(),
                        )),
                    })
                    .collect();
                Ok(KvEventData::Stored { parent, blocks })
            }
            1 => {
                let n = self.u32()? as usize;
                let bytes = self.take(n.checked_mul(8).ok_or(FormatError::Truncated(0))?)?;
                let hashes = bytes
                    .chunks_exact(8)
                    .map(|c| ExternalHash(u64::from_le_bytes(c.try_into().unwrap_or_default())))
                    .collect();
                Ok(KvEventData::Removed { hashes })
            }
            2 => Ok(KvEventData::Cleared),
            t => Err(FormatError::Invalid(format!(
                "event tag {t} at byte {}",
                self.at - 1
            ))),
        }
    }

    fn end(&self) -> Result<(), FormatError> {
        if self.at == self.b.len() {
            Ok(())
        } else {
            Err(FormatError::Invalid(format!(
                "{} bytes after the end",
                self.b.len() - self.at
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn data() -> impl Strategy<Value = KvEventData> {
        prop_oneof![
            (
                proptest::option::of(any::<u64>()),
                proptest::collection::vec((any::<u64>(), any::<u64>()), 0..8)
            )
                .prop_map(|(p, b)| KvEventData::Stored {
                    parent: p.map(ExternalHash),
                    blocks: b
                        .into_iter()
                        .map(|(l, e)| StoredBlock {
                            local: LocalHash(l),
                            external: ExternalHash(e)
                        })
                        .collect()
                }),
            proptest::collection::vec(any::<u64>(), 0..8).prop_map(|h| KvEventData::Removed {
                hashes: h.into_iter().map(ExternalHash).collect()
            }),
            Just(KvEventData::Cleared),
        ]
    }

    fn info() -> impl Strategy<Value = WorkerInfo> {
        (
            any::<u32>(),
            proptest::option::of(".{0,12}"),
            proptest::option::of(".{0,12}"),
            proptest::option::of(".{0,12}"),
        )
            .prop_map(|(block_size, endpoint, replay_endpoint, url)| WorkerInfo {
                block_size,
                endpoint,
                replay_endpoint,
                url,
            })
    }

    fn record() -> impl Strategy<Value = Record> {
        let body = prop_oneof![
            info().prop_map(Body::Register),
            (
                any::<u32>(),
                proptest::collection::vec(
                    (
                        any::<u64>(),
                        -1e12f64..1e12,
                        proptest::collection::vec(data(), 0..4)
                    ),
                    0..4
                )
            )
                .prop_map(|(block_size, bs)| Body::Batches {
                    block_size,
                    batches: bs
                        .into_iter()
                        .map(|(seq, ts, events)| EngineBatch { seq, ts, events })
                        .collect()
                }),
            (any::<bool>(), any::<u64>()).prop_map(|(r, seq)| Body::Clear {
                reason: if r {
                    ClearReason::Restart
                } else {
                    ClearReason::Resync
                },
                seq
            }),
            Just(Body::Unregister),
        ];
        (".{0,16}", any::<u64>(), any::<u32>(), body).prop_map(|(model, id, rank, body)| Record {
            subject: Subject {
                model,
                key: WorkerKey::new(id, rank),
            },
            body,
        })
    }

    proptest! {
        #[test]
        fn records_round_trip_and_every_cut_is_an_error(r in record()) {
            let b = r.encode();
            if let Body::Batches { batches, .. } = &r.body {
                let n: usize = batches.iter().map(batch_len).sum();
                prop_assert_eq!(b.len(), 2 + 2 + r.subject.model.len() + 12 + 8 + n);
            }
            prop_assert_eq!(Record::decode(&b).unwrap(), r);
            for cut in 0..b.len() {
                prop_assert!(Record::decode(&b[..cut]).is_err());
            }
            let mut longer = b.clone();
            longer.push(0);
            prop_assert!(Record::decode(&longer).is_err());
        }

        #[test]
        fn snapshots_round_trip(
            seq in any::<u64>(),
            models in proptest::collection::vec(
                (".{0,8}", any::<u32>(),
                 proptest::collection::vec((any::<u64>(), any::<u32>(), info(), proptest::option::of(any::<u64>())), 0..4),
                 proptest::collection::vec((any::<u64>(), any::<u32>(), data()), 0..8)),
                0..3)
        ) {
            let s = Snapshot {
                stream_seq: seq,
                models: models.into_iter().map(|(name, block_size, ws, es)| SnapshotModel {
                    name,
                    block_size,
                    workers: ws.into_iter().map(|(id, r, info, last_seq)| SnapshotWorker {
                        key: WorkerKey::new(id, r), info, last_seq,
                    }).collect(),
                    events: es.into_iter().map(|(id, r, data)| KvEvent {
                        worker: WorkerKey::new(id, r), event_id: 0, data,
                    }).collect(),
                }).collect(),
            };
            let b = s.encode();
            prop_assert_eq!(Snapshot::decode(&b).unwrap(), s);
            for cut in (0..b.len()).step_by(7) {
                prop_assert!(Snapshot::decode(&b[..cut]).is_err());
            }
        }
    }

    #[test]
    fn claimed_lengths_past_the_input_cost_nothing() {
        // A batch claiming 4G events and a stored event claiming 4G blocks.
        let mut b = Record {
            subject: Subject {
                model: "m".into(),
                key: WorkerKey::new(1, 0),
            },
            body: Body::Batches {
                block_size: 16,
                batches: vec![EngineBatch {
                    seq: 1,
                    ts: 0.0,
                    events: vec![],
                }],
            },
        }
        .encode();
        let n = b.len() - 4;
        b[n..].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(Record::decode(&b), Err(FormatError::Truncated(_))));
        b[n..].copy_from_slice(&1u32.to_le_bytes());
        b.extend_from_slice(&[0, 0]);
        b.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(Record::decode(&b), Err(FormatError::Truncated(_))));
        assert!(matches!(Record::decode(&[9]), Err(FormatError::Invalid(_))));
        assert!(Snapshot::decode(b"ARBKVSN0").is_err());
    }
}
