//! In-flight accounting: what a router has sent each worker and not yet
//! heard finish.
//!
//! A request counts on its worker from [`LoadTracker::start`] until
//! [`LoadTracker::complete`] or, if the client never says, until its time
//! to live passes ([`LoadTracker::expire`]). While it counts, the worker's
//! [`WorkerLoad`] holds:
//!
//! * `active_requests`: the requests in flight;
//! * `active_blocks`: the distinct blocks their prompts occupy (requests
//!   sharing a prefix share its blocks, by sequence hash, as the engine's
//!   prefix cache shares them);
//! * `pending_prefill_blocks`: the blocks they still have to compute (their
//!   blocks minus the overlap the worker had cached when they were routed,
//!   until [`LoadTracker::prefill_done`]);
//! * `active_overlap`, per query: how many leading blocks of the new
//!   request are already in use there.
//!
//! Times are microseconds on the caller's clock.
use std::collections::{BTreeSet, HashMap};
use std::hash::Hash;

use crate::policy::WorkerLoad;

/// `start` was called with an id that is already in flight.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("request {0:?} is already in flight")]
pub struct DuplicateRequest(pub String);

#[derive(Debug, Default, Clone)]
struct Active {
    requests: u64,
    prefill: u64,
    /// Sequence hash -> number of in-flight requests using that block.
    held: HashMap<u64, u32>,
    /// Blocks of in-flight requests known only by count (see
    /// [`LoadTracker::start_with_unseen`]).
    unseen: u64,
}

#[derive(Debug, Clone)]
struct InFlight<K> {
    worker: K,
    seq_hashes: Vec<u64>,
    unseen: u64,
    prefill: u64,
    deadline_us: u64,
}

/// Requests in flight per worker. `K` names a worker.
#[derive(Debug, Clone)]
pub struct LoadTracker<K> {
    workers: HashMap<K, Active>,
    requests: HashMap<String, InFlight<K>>,
    deadlines: BTreeSet<(u64, String)>,
}

impl<K> Default for LoadTracker<K> {
    fn default() -> Self {
        Self {
            workers: HashMap::new(),
            requests: HashMap::new(),
            deadlines: BTreeSet::new(),
        }
    }
}

impl<K: Clone + Eq + Hash> LoadTracker<K> {
    /// Nothing in flight.
    pub fn new() -> Self {
        Self::default()
    }

    /// `w`'s load as seen by a new request whose blocks have sequence
    /// hashes `seq_hashes`.
    pub fn load(&self, w: &K, seq_hashes: &[u64]) -> WorkerLoad {
        let Some(a) = self.workers.get(w) else {
            return WorkerLoad::default();
        };
        let overlap = seq_hashes
            .iter()
            .take_while(|h| a.held.contains_key(h))
            .count();
        WorkerLoad {
            active_blocks: a.held.len() as u64 + a.unseen,
            pending_prefill_blocks: a.prefill,
            active_requests: a.requests,
            active_overlap: u32::try_from(overlap).unwrap_or(u32::MAX),
        }
    }

    /// Records request `id` as routed to `w` at `now_us`, with `overlap`
    /// leading blocks already cached there; it counts until completed or
    /// until `now_us + ttl_us`.
    pub fn start(
        &mut self,
        id: &str,
        w: K,
        seq_hashes: &[u64],
        overlap: u32,
        now_us: u64,
        ttl_us: u64,
    ) -> Result<(), DuplicateRequest> {
        self.start_with_unseen(id, w, seq_hashes, 0, overlap, now_us, ttl_us)
    }

    /// [`start`](Self::start) for a request whose prompt goes `unseen`
    /// blocks past `seq_hashes`, known only by count (a gateway that
    /// stopped tokenizing where no worker held the prompt): they count as
    /// new prefill and as active blocks of their own, shared with no other
    /// request.
    #[allow(clippy::too_many_arguments)]
    pub fn start_with_unseen(
        &mut self,
        id: &str,
        w: K,
        seq_hashes: &[u64],
        unseen: u64,
        overlap: u32,
        now_us: u64,
        ttl_us: u64,
    ) -> Result<(), DuplicateRequest> {
        if self.requests.contains_key(id) {
            return Err(DuplicateRequest(id.to_string()));
        }
        let prefill = (seq_hashes.len() as u64)
            .saturating_sub(u64::from(overlap))
            .saturating_add(unseen);
        let a = self.workers.entry(w.clone()).or_default();
        a.requests += 1;
        a.prefill += prefill;
        a.unseen += unseen;
        for &h in seq_hashes {
            *a.held.entry(h).or_insert(0) += 1;
        }
        let deadline_us = now_us.saturating_add(ttl_us);
        self.deadlines.insert((deadline_us, id.to_string()));
        self.requests.insert(
            id.to_string(),
            InFlight {
                worker: w,
                seq_hashes: seq_hashes.to_vec(),
                unseen,
                prefill,
                deadline_us,
            },
        );
        Ok(())
    }

    /// Ends request `id`; returns the worker it was on, or `None` if it was
    /// not in flight (never started, completed or expired already).
    pub fn complete(&mut self, id: &str) -> Option<K> {
        let r = self.requests.remove(id)?;
        self.deadlines.remove(&(r.deadline_us, id.to_string()));
        self.release(&r);
        Some(r.worker)
    }

    /// Request `id` finished its prefill (its first token is out): its
    /// blocks no longer count as pending prefill. Returns false if it is
    /// not in flight.
    pub fn prefill_done(&mut self, id: &str) -> bool {
        let Some(r) = self.requests.get_mut(id) else {
            return false;
        };
        if let Some(a) = self.workers.get_mut(&r.worker) {
            a.prefill = a.prefill.saturating_sub(r.prefill);
        }
        r.prefill = 0;
        true
    }

    /// Ends every request whose time to live has passed at `now_us`;
    /// returns how many.
    pub fn expire(&mut self, now_us: u64) -> usize {
        let mut n = 0;
        while let Some((deadline, _)) = self.deadlines.first() {
            if *deadline > now_us {
                break;
            }
            let Some((_, id)) = self.deadlines.pop_first() else {
                break;
            };
            if let Some(r) = self.requests.remove(&id) {
                self.release(&r);
                n += 1;
            }
        }
        n
    }

    /// Forgets worker `w` and every request in flight on it.
    pub fn remove_worker(&mut self, w: &K) {
        self.workers.remove(w);
        let gone: Vec<(u64, String)> = self
            .requests
            .iter()
            .filter(|(_, r)| &r.worker == w)
            .map(|(id, r)| (r.deadline_us, id.clone()))
            .collect();
        for key in gone {
            self.requests.remove(&key.1);
            self.deadlines.remove(&key);
        }
    }

    /// True if request `id` is in flight.
    pub fn contains(&self, id: &str) -> bool {
        self.requests.contains_key(id)
    }

    /// Requests in flight, all workers.
    pub fn in_flight(&self) -> usize {
        self.requests.len()
    }

    fn release(&mut self, r: &InFlight<K>) {
        let Some(a) = self.workers.get_mut(&r.worker) else {
            return;
        };
        a.requests = a.requests.saturating_sub(1);
        a.prefill = a.prefill.saturating_sub(r.prefill);
        a.unseen = a.unseen.saturating_sub(r.unseen);
        for h in &r.seq_hashes {
            if let Some(c) = a.held.get_mut(h) {
                *c -= 1;
                if *c == 0 {
                    a.held.remove(h);
                }
            }
        }
        if a.requests == 0 {
            self.workers.remove(&r.worker);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn shared_prefixes_count_once_and_overlap_is_leading() {
        let mut t = LoadTracker::new();
        t.start("a", 0u8, &[1, 2, 3], 1, 0, 10).unwrap();
        t.start("b", 0u8, &[1, 2, 9], 0, 0, 10).unwrap();
        let l = t.load(&0, &[1, 2, 3, 4]);
        assert_eq!(l.active_requests, 2);
        assert_eq!(l.active_blocks, 4); // 1, 2, 3, 9
        assert_eq!(l.pending_prefill_blocks, 2 + 3);
        assert_eq!(l.active_overlap, 3);
        assert_eq!(t.load(&0, &[2, 7, 1]).active_overlap, 1);
        assert_eq!(t.load(&1, &[1]), WorkerLoad::default());
        assert_eq!(
            t.start("a", 1, &[], 0, 0, 10),
            Err(DuplicateRequest("a".into()))
        );
        assert_eq!(t.complete("a"), Some(0));
        assert_eq!(t.complete("a"), None);
        assert_eq!(t.load(&0, &[1, 2, 3]).active_overlap, 2);
        assert_eq!(t.expire(9), 0);
        assert_eq!(t.expire(10), 1);
        assert_eq!(t.load(&0, &[1]), WorkerLoad::default());
        assert_eq!(t.in_flight(), 0);
    }

    #[test]
    fn removing_a_worker_drops_its_requests() {
        let mut t = LoadTracker::new();
        t.start("a", 0u8, &[1], 0, 0, 10).unwrap();
        t.start("b", 1u8, &[1], 0, 0, 10).unwrap();
        t.remove_worker(&0);
        assert_eq!(t.in_flight(), 1);
        assert_eq!(t.complete("a"), None);
        assert_eq!(t.expire(100), 1);
    }

    #[derive(Debug, Clone)]
    enum Op {
        /// id, worker, sequence hashes, overlap, unseen blocks.
        Start(u8, u8, Vec<u8>, u8, u8),
        Complete(u8),
        PrefillDone(u8),
        Expire(u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (
                0..8u8,
                0..3u8,
                proptest::collection::vec(0..6u8, 0..5),
                0..4u8,
                prop_oneof![Just(0u8), 1..3u8],
            )
                .prop_map(|(id, w, s, o, u)| Op::Start(id, w, s, o, u)),
            (0..8u8).prop_map(Op::Complete),
            (0..8u8).prop_map(Op::PrefillDone),
            (0..50u8).prop_map(Op::Expire),
        ]
    }

    proptest! {
        /// Against a list of live requests: every worker's load is the sum
        /// over its live requests.
        #[test]
        fn matches_a_list_of_live_requests(ops in proptest::collection::vec(op(), 0..60)) {
            let mut t = LoadTracker::new();
            // (id, worker, seq, prefill, deadline, unseen)
            let mut live: Vec<(String, u8, Vec<u64>, u64, u64, u64)> = Vec::new();
            let mut now = 0u64;
            for o in ops {
                match o {
                    Op::Start(id, w, s, ov, u) => {
                        let id = id.to_string();
                        let s: Vec<u64> = s.into_iter().map(u64::from).collect();
                        let u = u64::from(u);
                        let dup = live.iter().any(|r| r.0 == id);
                        let r = t.start_with_unseen(&id, w, &s, u, u32::from(ov), now, 10);
                        prop_assert_eq!(r.is_err(), dup);
                        if !dup {
                            let p = (s.len() as u64).saturating_sub(u64::from(ov)) + u;
                            live.push((id, w, s, p, now + 10, u));
                        }
                    }
                    Op::Complete(id) => {
                        let id = id.to_string();
                        let pos = live.iter().position(|r| r.0 == id);
                        prop_assert_eq!(t.complete(&id), pos.map(|i| live[i].1));
                        if let Some(i) = pos { live.remove(i); }
                    }
                    Op::PrefillDone(id) => {
                        let id = id.to_string();
                        let pos = live.iter().position(|r| r.0 == id);
                        prop_assert_eq!(t.prefill_done(&id), pos.is_some());
                        if let Some(i) = pos { live[i].3 = 0; }
                    }
                    Op::Expire(dt) => {
                        now += u64::from(dt);
                        let before = live.len();
                        live.retain(|r| r.4 > now);
                        prop_assert_eq!(t.expire(now), before - live.len());
                    }
                }
                for w in 0..3u8 {
                    let q = [0u64, 1, 2];
                    let mine: Vec<_> = live.iter().filter(|r| r.1 == w).collect();
                    let mut blocks: Vec<u64> = mine.iter().flat_map(|r| r.2.clone()).collect();
                    blocks.sort_unstable();
                    blocks.dedup();
                    let overlap = q.iter().take_while(|h| blocks.contains(h)).count() as u32;
                    let want = WorkerLoad {
                        active_blocks: blocks.len() as u64 + mine.iter().map(|r| r.5).sum::<u64>(),
                        pending_prefill_blocks: mine.iter().map(|r| r.3).sum(),
                        active_requests: mine.len() as u64,
                        active_overlap: overlap,
                    };
                    prop_assert_eq!(t.load(&w, &q), want);
                }
                prop_assert_eq!(t.in_flight(), live.len());
            }
        }
    }
}
