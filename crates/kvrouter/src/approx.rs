//! Approximate mode, for engines that publish no KV events: the router
//! assumes each routed request's blocks are cached on the worker it chose
//! for a time to live, and forgets them when it passes.
//!
//! Blocks are recorded in the model's index as that worker's, with their
//! sequence hash as the engine id. A block routed again before it expires
//! lives on; expiry removes a block only if it was not refreshed since.
//! A chain's blocks are refreshed together and a child is never refreshed
//! without its parent, so children never outlive their parents.
use std::collections::{BTreeSet, HashMap};

use kvindex::{
    ConcurrentIndex, ExternalHash, KvEventData, KvIndexer, LocalHash, StoredBlock, WorkerKey,
};

use crate::convert::EventIds;

/// Blocks recorded from routing decisions, with their deadlines.
#[derive(Debug, Default)]
pub struct Approx {
    /// (worker, sequence hash) -> deadline, µs.
    held: HashMap<(WorkerKey, u64), u64>,
    expiries: BTreeSet<(u64, WorkerKey, u64)>,
    ids: HashMap<WorkerKey, EventIds>,
}

impl Approx {
    /// Records `locals` (sequence hashes `seqs`) as cached on `w` until
    /// `now_us + ttl_us`.
    pub fn record(
        &mut self,
        index: &ConcurrentIndex,
        w: WorkerKey,
        locals: &[LocalHash],
        seqs: &[u64],
        now_us: u64,
        ttl_us: u64,
    ) {
        if locals.is_empty() {
            return;
        }
        let deadline = now_us.saturating_add(ttl_us);
        for &s in seqs {
            if let Some(old) = self.held.insert((w, s), deadline) {
                self.expiries.remove(&(old, w, s));
            }
            self.expiries.insert((deadline, w, s));
        }
        let blocks = locals
            .iter()
            .zip(seqs)
            .map(|(&local, &s)| StoredBlock {
                external: ExternalHash(s),
                local,
            })
            .collect();
        let ev = self.ids.entry(w).or_default().event(
            w,
            KvEventData::Stored {
                parent: None,
                blocks,
            },
        );
        // A chain from the root has no parent to miss.
        let _ = index.apply(&ev);
    }

    /// Removes every block whose deadline passed at `now_us`; returns how
    /// many.
    pub fn expire(&mut self, index: &ConcurrentIndex, now_us: u64) -> usize {
        let mut gone: HashMap<WorkerKey, Vec<ExternalHash>> = HashMap::new();
        while let Some(&(d, w, s)) = self.expiries.first() {
            if d > now_us {
                break;
            }
            self.expiries.pop_first();
            self.held.remove(&(w, s));
            gone.entry(w).or_default().push(ExternalHash(s));
        }
        let mut n = 0;
        for (w, mut hashes) in gone {
            n += hashes.len();
            // Children first: a chain's later blocks were inserted after
            // their parents with the same deadline; order does not matter to
            // the index, which removes each block it holds.
            hashes.reverse();
            let ev = self
                .ids
                .entry(w)
                .or_default()
                .event(w, KvEventData::Removed { hashes });
            let _ = index.apply(&ev);
        }
        n
    }

    /// Forgets `w` (the caller drops it from the index).
    pub fn remove_worker(&mut self, w: WorkerKey) {
        self.held.retain(|k, _| k.0 != w);
        self.expiries.retain(|e| e.1 != w);
        self.ids.remove(&w);
    }

    /// Blocks recorded, all workers.
    pub fn len(&self) -> usize {
        self.held.len()
    }

    /// True when nothing is recorded.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvindex::{local_block_hashes, sequence_hashes};

    #[test]
    fn blocks_expire_unless_refreshed() {
        let index = ConcurrentIndex::new();
        let mut a = Approx::default();
        let w = WorkerKey::new(1, 0);
        let toks: Vec<u32> = (0..8).collect();
        let l = local_block_hashes(&toks, 2, None);
        let s = sequence_hashes(&l);
        a.record(&index, w, &l, &s, 0, 10);
        assert_eq!(index.find_matches(&l).get(w), 4);
        // The first two blocks are routed again at t=5.
        a.record(&index, w, &l[..2], &s[..2], 5, 10);
        assert_eq!(a.expire(&index, 9), 0);
        assert_eq!(a.expire(&index, 10), 2);
        assert_eq!(index.find_matches(&l).get(w), 2);
        assert_eq!(a.expire(&index, 15), 2);
        assert_eq!(index.find_matches(&l).get(w), 0);
        assert!(a.is_empty());
    }
}
