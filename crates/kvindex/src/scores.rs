//! The answer to a lookup: per worker, how many leading blocks it holds.

use std::sync::OnceLock;

use crate::event::WorkerKey;

/// Per-worker count of leading request blocks held. Workers holding none of
/// the request are absent (and [`OverlapScores::get`] returns 0 for them).
///
/// Stored as a plain vector in the order the lookup produced it (building it
/// costs a push per worker: no hashing, no sorting on the lookup path).
/// `get` scans small results and, for larger ones, builds a sorted index
/// once on first use.
#[derive(Clone, Debug, Default)]
pub struct OverlapScores {
    scores: Vec<(WorkerKey, u32)>,
    index: OnceLock<Vec<(WorkerKey, u32)>>,
}

/// Results up to this size are searched linearly by `get`.
const LINEAR_GET: usize = 16;

impl PartialEq for OverlapScores {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.sorted() == other.sorted()
    }
}

impl Eq for OverlapScores {}

impl OverlapScores {
    /// An empty result.
    pub fn new() -> Self {
        Self::default()
    }

    /// Builds scores from (worker, score) pairs of distinct workers; zero
    /// scores are dropped.
    pub(crate) fn from_pairs(mut pairs: Vec<(WorkerKey, u32)>) -> Self {
        pairs.retain(|p| p.1 > 0);
        debug_assert!({
            let mut k: Vec<_> = pairs.iter().map(|p| p.0).collect();
            k.sort_unstable();
            k.windows(2).all(|w| w[0] != w[1])
        });
        Self {
            scores: pairs,
            index: OnceLock::new(),
        }
    }

    /// Leading blocks held by `w` (0 if none).
    pub fn get(&self, w: WorkerKey) -> u32 {
        if self.scores.len() <= LINEAR_GET {
            return self.scores.iter().find(|p| p.0 == w).map_or(0, |p| p.1);
        }
        let idx = self.index.get_or_init(|| self.sorted());
        match idx.binary_search_by_key(&w, |p| p.0) {
            Ok(i) => idx[i].1,
            Err(_) => 0,
        }
    }

    /// Every worker with a non-zero score, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (WorkerKey, u32)> + '_ {
        self.scores.iter().copied()
    }

    /// Number of workers with a non-zero score.
    pub fn len(&self) -> usize {
        self.scores.len()
    }

    /// True when no worker holds the first block.
    pub fn is_empty(&self) -> bool {
        self.scores.is_empty()
    }

    /// Sets `w`'s score (a zero score removes it).
    pub fn set(&mut self, w: WorkerKey, score: u32) {
        self.index = OnceLock::new();
        match self.scores.iter().position(|p| p.0 == w) {
            Some(i) if score == 0 => {
                self.scores.swap_remove(i);
            }
            Some(i) => self.scores[i].1 = score,
            None if score == 0 => {}
            None => self.scores.push((w, score)),
        }
    }

    /// The scores sorted by worker, handy for comparisons and printing.
    pub fn sorted(&self) -> Vec<(WorkerKey, u32)> {
        let mut v = self.scores.clone();
        v.sort_unstable_by_key(|p| p.0);
        v
    }

    /// The worker with the highest score (ties: the smallest key).
    pub fn best(&self) -> Option<(WorkerKey, u32)> {
        self.iter().max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_get_and_pairs_agree() {
        let w = |i| WorkerKey::new(i, 0);
        let mut a = OverlapScores::new();
        a.set(w(3), 2);
        a.set(w(1), 5);
        a.set(w(2), 0);
        a.set(w(3), 4);
        let b = OverlapScores::from_pairs(vec![(w(3), 4), (w(2), 0), (w(1), 5)]);
        assert_eq!(a, b);
        assert_eq!(a.get(w(1)), 5);
        assert_eq!(a.get(w(2)), 0);
        assert_eq!(a.len(), 2);
        assert_eq!(a.best(), Some((w(1), 5)));
        a.set(w(1), 0);
        assert_eq!(a.len(), 1);
        assert!(!a.is_empty());
        // Large results go through the sorted index.
        let big = OverlapScores::from_pairs((0..100).rev().map(|i| (w(i), i as u32)).collect());
        assert_eq!(big.len(), 99);
        assert_eq!(big.get(w(42)), 42);
        assert_eq!(big.get(w(0)), 0);
        assert_eq!(big.get(w(500)), 0);
    }
}
