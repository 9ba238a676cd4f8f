//! The answer to a lookup: per worker, how many leading blocks it holds.

use hashbrown::HashMap;

use crate::event::WorkerKey;

/// Per-worker count of leading request blocks held. Workers holding none of
/// the request are absent (and [`OverlapScores::get`] returns 0 for them).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OverlapScores {
    scores: HashMap<WorkerKey, u32, foldhash::fast::RandomState>,
}

impl OverlapScores {
    /// An empty result.
    pub fn new() -> Self {
        Self::default()
    }

    /// Leading blocks held by `w` (0 if none).
    pub fn get(&self, w: WorkerKey) -> u32 {
        self.scores.get(&w).copied().unwrap_or(0)
    }

    /// Every worker with a non-zero score, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (WorkerKey, u32)> + '_ {
        self.scores.iter().map(|(k, v)| (*k, *v))
    }

    /// Number of workers with a non-zero score.
    pub fn len(&self) -> usize {
        self.scores.len()
    }

    /// True when no worker holds the first block.
    pub fn is_empty(&self) -> bool {
        self.scores.is_empty()
    }

    /// An empty result with room for `n` workers.
    pub fn with_capacity(n: usize) -> Self {
        Self {
            scores: HashMap::with_capacity_and_hasher(n, Default::default()),
        }
    }

    /// Sets `w`'s score (a zero score removes it).
    pub fn set(&mut self, w: WorkerKey, score: u32) {
        if score == 0 {
            self.scores.remove(&w);
        } else {
            self.scores.insert(w, score);
        }
    }

    /// The scores sorted by worker, handy for comparisons and printing.
    pub fn sorted(&self) -> Vec<(WorkerKey, u32)> {
        let mut v: Vec<_> = self.iter().collect();
        v.sort_unstable();
        v
    }

    /// The worker with the highest score (ties: the smallest key).
    pub fn best(&self) -> Option<(WorkerKey, u32)> {
        self.iter().max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)))
    }
}
