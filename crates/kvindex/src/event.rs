//! Workers, KV-cache events and the errors applying them can produce.

use serde::{Deserialize, Serialize};

use crate::hash::{ExternalHash, LocalHash};

/// One inference engine instance and its data-parallel rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct WorkerKey {
    /// Engine instance id.
    pub worker_id: u64,
    /// Data-parallel rank inside that instance.
    pub dp_rank: u32,
}

impl WorkerKey {
    /// Shorthand constructor.
    pub const fn new(worker_id: u64, dp_rank: u32) -> Self {
        Self { worker_id, dp_rank }
    }
}

/// A stored block: the engine's opaque id and the router's content hash.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct StoredBlock {
    /// Engine block id.
    pub external: ExternalHash,
    /// Local (content) hash of the block's tokens.
    pub local: LocalHash,
}

/// What happened in a worker's KV cache.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum KvEventData {
    /// A chain of blocks was stored; the first block's parent is `parent`
    /// (`None`: the chain starts at the root), each later block's parent is
    /// the block before it.
    Stored {
        /// The engine id of the first block's parent, if any.
        parent: Option<ExternalHash>,
        /// The blocks, parent first.
        blocks: Vec<StoredBlock>,
    },
    /// Blocks were evicted.
    Removed {
        /// Engine ids of the evicted blocks.
        hashes: Vec<ExternalHash>,
    },
    /// The worker's whole cache was dropped.
    Cleared,
}

/// One event of one worker. A worker's event ids increase by one per event.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvEvent {
    /// The publishing worker.
    pub worker: WorkerKey,
    /// Per-worker sequence number.
    pub event_id: u64,
    /// The change.
    pub data: KvEventData,
}

/// Why an event was rejected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ApplyError {
    /// A `Stored` event named a parent block the worker does not hold.
    #[error("worker {worker:?} event {event_id}: stored chain's parent {parent:?} is not held by the worker")]
    UnknownParent {
        /// The worker.
        worker: WorkerKey,
        /// The rejected event's id.
        event_id: u64,
        /// The unknown parent.
        parent: ExternalHash,
    },
    /// A `Stored` chain is deeper than the index supports (2^32 - 2 blocks).
    #[error("worker {worker:?} event {event_id}: chain deeper than {max} blocks")]
    TooDeep {
        /// The worker.
        worker: WorkerKey,
        /// The rejected event's id.
        event_id: u64,
        /// The maximum supported depth.
        max: u64,
    },
}
