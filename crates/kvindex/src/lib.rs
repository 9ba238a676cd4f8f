//! `kvindex`: the index a KV-cache-aware LLM router consults.
//!
//! Inference workers publish [`KvEvent`]s as their KV caches change; the
//! router asks, for a request's block hashes, how many leading blocks each
//! worker already holds ([`KvIndexer::find_matches`]).
//!
//! * [`ConcurrentIndex`]: a concurrent compressed radix tree. Writers for
//!   different workers run in parallel, readers never wait for more than one
//!   short per-node critical section, and lookups never overcount.
//! * [`ReferenceIndex`]: a sequential radix tree behind one `RwLock`; the
//!   test oracle and benchmark baseline.
//! * [`Lanes`]: N writer threads in front of any index, each worker pinned
//!   to one lane so its events apply in order.
//! * [`local_block_hashes`] / [`sequence_hashes`]: Dynamo-compatible hashing.
//! * Feature `test-util`: the test hooks `ConcurrentIndex::tree_shape` and
//!   `reclaim_deferred`. The benchmarks, the memory test and the Dynamo
//!   peer comparison take their events and lookups from `kvreplay`'s
//!   timeline (`kvreplay::timeline`: simulated engines under a synthetic
//!   workload or a trace), the one `arbor kv replay --stress` replays.
//!
//! See `docs/design.md` for the node layout and the concurrency protocol, and
//! the repository's `BENCHMARKS.md` for measurements.
//!
//! ```
//! use kvindex::{ConcurrentIndex, KvEvent, KvEventData, KvIndexer, StoredBlock, WorkerKey,
//!               ExternalHash, local_block_hashes, sequence_hashes};
//! let tokens: Vec<u32> = (0..64).collect();
//! let locals = local_block_hashes(&tokens, 16, None);
//! let seqs = sequence_hashes(&locals);
//! let index = ConcurrentIndex::new();
//! let w = WorkerKey::new(7, 0);
//! let blocks = locals.iter().zip(&seqs)
//!     .map(|(l, s)| StoredBlock { external: ExternalHash(*s), local: *l })
//!     .collect();
//! index.apply(&KvEvent { worker: w, event_id: 0,
//!     data: KvEventData::Stored { parent: None, blocks } }).unwrap();
//! assert_eq!(index.find_matches(&locals[..3]).get(w), 3);
//! ```
#![deny(missing_docs, unsafe_op_in_unsafe_fn)]
#![deny(unsafe_code)]

mod dump;
mod event;
mod hash;
mod lanes;
mod reference;
mod scores;
mod stats;
mod tree;

pub use event::{ApplyError, KvEvent, KvEventData, StoredBlock, WorkerKey};
pub use hash::{
    hash_block, local_block_hashes, local_block_hashes_salted, next_sequence_hash, sequence_hashes,
    BlockSalt, ExternalHash, LocalHash, XXH3_SEED,
};
pub use lanes::{lane_of, ErrorHandler, Full, Lanes, LanesConfig, DEFAULT_QUEUE};
pub use reference::ReferenceIndex;
pub use scores::OverlapScores;
pub use stats::{GapHandler, IndexStats};
#[cfg(feature = "test-util")]
pub use tree::{reclaim_deferred, TreeShape};
pub use tree::{ConcurrentIndex, HeapBytes};

/// The operations every index provides. Both [`ConcurrentIndex`] and
/// [`ReferenceIndex`] implement it.
pub trait KvIndexer: Send + Sync {
    /// Applies one event. Callers guarantee one worker's events are applied
    /// by one thread at a time, in order.
    ///
    /// Event ids: an id below the worker's last one is a replayed duplicate
    /// and is ignored; an id equal to it is applied again (events are
    /// idempotent); an id past last + 1 is a gap: counted, applied, then
    /// reported to the gap handler (with no index lock held).
    fn apply(&self, ev: &KvEvent) -> Result<(), ApplyError>;
    /// For each worker, the number of leading `hashes` it holds.
    fn find_matches(&self, hashes: &[LocalHash]) -> OverlapScores;
    /// Number of blocks `w` holds.
    fn worker_block_count(&self, w: WorkerKey) -> usize;
    /// Forgets `w` entirely (its blocks and its event-id state).
    fn remove_worker(&self, w: WorkerKey);
    /// Events that rebuild an equal index when applied to a new one.
    fn dump(&self) -> Vec<KvEvent>;
    /// A short name for reports.
    fn name(&self) -> &'static str;
    /// Event counters.
    fn stats(&self) -> IndexStats {
        IndexStats::default()
    }
    /// The workers the index knows, sorted.
    fn workers(&self) -> Vec<WorkerKey> {
        Vec::new()
    }
}
