//! The concurrent compressed radix tree (placeholder: wraps the reference).

use crate::{
    ApplyError, IndexStats, KvEvent, KvIndexer, LocalHash, OverlapScores, ReferenceIndex, WorkerKey,
};

/// The concurrent index.
#[derive(Default)]
pub struct ConcurrentIndex {
    inner: ReferenceIndex,
}

impl ConcurrentIndex {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }
}

impl KvIndexer for ConcurrentIndex {
    fn apply(&self, ev: &KvEvent) -> Result<(), ApplyError> {
        self.inner.apply(ev)
    }
    fn find_matches(&self, hashes: &[LocalHash]) -> OverlapScores {
        self.inner.find_matches(hashes)
    }
    fn worker_block_count(&self, w: WorkerKey) -> usize {
        self.inner.worker_block_count(w)
    }
    fn remove_worker(&self, w: WorkerKey) {
        self.inner.remove_worker(w)
    }
    fn dump(&self) -> Vec<KvEvent> {
        self.inner.dump()
    }
    fn name(&self) -> &'static str {
        "concurrent"
    }
    fn stats(&self) -> IndexStats {
        self.inner.stats()
    }
    fn workers(&self) -> Vec<WorkerKey> {
        self.inner.workers()
    }
}
