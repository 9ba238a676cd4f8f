//! Routing policies: random, round-robin, least-loaded and KV-aware.
//!
//! The KV-aware cost follows Dynamo's router: for worker `w`,
//! `cost_w = overlap_weight * prefill_w + decode_w`, where `prefill_w` is the
//! request's blocks not covered by `w`'s cached prefix (its overlap score
//! from the index) plus the prefill blocks already pending on `w`, and
//! `decode_w` is the distinct KV blocks in use by requests active on `w`
//! plus the blocks this request would add to them (its blocks minus the
//! leading ones already in use there), as Dynamo's active-sequence
//! tracking counts them.
//! Temperature 0 picks the cheapest worker (ties broken at random);
//! above 0 it samples from a softmax over the costs normalised to `[0, 1]`
//! divided by the temperature.

use std::fmt;
use std::str::FromStr;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

/// Which routing policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, PartialOrd, Ord, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyKind {
    /// Uniformly random worker.
    Random,
    /// Workers in turn.
    RoundRobin,
    /// Fewest active requests, then fewest active blocks.
    LeastLoaded,
    /// Dynamo's KV-aware cost over the index's overlap scores.
    KvAware,
}

impl PolicyKind {
    /// All policies, in report order.
    pub const ALL: [PolicyKind; 4] = [
        PolicyKind::Random,
        PolicyKind::RoundRobin,
        PolicyKind::LeastLoaded,
        PolicyKind::KvAware,
    ];

    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::Random => "random",
            PolicyKind::RoundRobin => "round-robin",
            PolicyKind::LeastLoaded => "least-loaded",
            PolicyKind::KvAware => "kv-aware",
        }
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An unknown policy name.
#[derive(Debug, Clone, thiserror::Error)]
#[error("unknown policy {0:?}; expected random, round-robin, least-loaded or kv-aware")]
pub struct UnknownPolicy(pub String);

impl FromStr for PolicyKind {
    type Err = UnknownPolicy;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        PolicyKind::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| UnknownPolicy(s.to_string()))
    }
}

/// What a router knows about a worker when a request arrives.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkerLoad {
    /// Blocks of admitted, unfinished requests.
    pub active_blocks: u64,
    /// Blocks still to prefill (queued prompts plus admitted prefill work).
    pub pending_prefill_blocks: u64,
    /// Requests queued or running.
    pub active_requests: u64,
    /// Leading blocks of the request already in use by active requests on
    /// the worker (at most its overlap score).
    pub active_overlap: u32,
}

/// KV-aware cost knobs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct KvCost {
    /// Weight of prefill blocks against decode blocks (Dynamo default 1).
    pub overlap_weight: f64,
    /// Softmax temperature; 0 = argmin.
    pub temperature: f64,
}

impl Default for KvCost {
    fn default() -> Self {
        Self {
            overlap_weight: 1.0,
            temperature: 0.0,
        }
    }
}

/// A stateful router for one policy.
#[derive(Debug, Clone)]
pub struct Router {
    kind: PolicyKind,
    cost: KvCost,
    rng: ChaCha8Rng,
    next: usize,
    scratch: Vec<f64>,
}

impl Router {
    /// A router with its own seeded RNG.
    pub fn new(kind: PolicyKind, cost: KvCost, seed: u64) -> Self {
        Self {
            kind,
            cost,
            rng: ChaCha8Rng::seed_from_u64(seed),
            next: 0,
            scratch: Vec::new(),
        }
    }

    /// The policy.
    pub fn kind(&self) -> PolicyKind {
        self.kind
    }

    /// The KV-aware costs of each worker for a request of `request_blocks`
    /// blocks, given each worker's overlap (cached leading blocks).
    pub fn kv_costs(
        &self,
        request_blocks: u64,
        loads: &[WorkerLoad],
        overlaps: &[u32],
    ) -> Vec<f64> {
        loads
            .iter()
            .zip(overlaps)
            .map(|(l, &o)| {
                let prefill =
                    request_blocks.saturating_sub(u64::from(o)) + l.pending_prefill_blocks;
                let decode =
                    l.active_blocks + request_blocks.saturating_sub(u64::from(l.active_overlap));
                self.cost.overlap_weight * prefill as f64 + decode as f64
            })
            .collect()
    }

    /// Index of the minimum, ties broken uniformly at random.
    fn argmin_random(&mut self, values: &[f64]) -> usize {
        let min = values.iter().copied().fold(f64::INFINITY, f64::min);
        let ties = values.iter().filter(|&&v| v == min).count();
        let mut pick = self.rng.random_range(0..ties);
        for (i, &v) in values.iter().enumerate() {
            if v == min {
                if pick == 0 {
                    return i;
                }
                pick -= 1;
            }
        }
        0
    }

    /// Chooses a worker. `overlaps` is needed by the KV-aware policy only
    /// (one score per worker, in worker order). `loads` is never empty.
    pub fn choose(&mut self, request_blocks: u64, loads: &[WorkerLoad], overlaps: &[u32]) -> usize {
        let n = loads.len();
        debug_assert!(n > 0);
        match self.kind {
            PolicyKind::Random => self.rng.random_range(0..n),
            PolicyKind::RoundRobin => {
                let w = self.next % n;
                self.next = (self.next + 1) % n;
                w
            }
            PolicyKind::LeastLoaded => {
                let mut s = std::mem::take(&mut self.scratch);
                s.clear();
                s.extend(
                    loads
                        .iter()
                        .map(|l| l.active_requests as f64 * 1e12 + l.active_blocks as f64),
                );
                let w = self.argmin_random(&s);
                self.scratch = s;
                w
            }
            PolicyKind::KvAware => {
                let costs = self.kv_costs(request_blocks, loads, overlaps);
                if self.cost.temperature <= 0.0 {
                    return self.argmin_random(&costs);
                }
                let min = costs.iter().copied().fold(f64::INFINITY, f64::min);
                let max = costs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let range = if max > min { max - min } else { 1.0 };
                let weights: Vec<f64> = costs
                    .iter()
                    .map(|c| (-(c - min) / range / self.cost.temperature).exp())
                    .collect();
                let total: f64 = weights.iter().sum();
                let mut u = self.rng.random::<f64>() * total;
                for (i, w) in weights.iter().enumerate() {
                    if u < *w {
                        return i;
                    }
                    u -= w;
                }
                n - 1
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idle(n: usize) -> Vec<WorkerLoad> {
        vec![WorkerLoad::default(); n]
    }

    #[test]
    fn names_round_trip() {
        for p in PolicyKind::ALL {
            assert_eq!(p.name().parse::<PolicyKind>().unwrap(), p);
        }
        assert!("fastest".parse::<PolicyKind>().is_err());
    }

    #[test]
    fn round_robin_cycles() {
        let mut r = Router::new(PolicyKind::RoundRobin, KvCost::default(), 1);
        let got: Vec<usize> = (0..7).map(|_| r.choose(1, &idle(3), &[0; 3])).collect();
        assert_eq!(got, vec![0, 1, 2, 0, 1, 2, 0]);
    }

    #[test]
    fn random_covers_all_workers() {
        let mut r = Router::new(PolicyKind::Random, KvCost::default(), 1);
        let mut seen = [0; 4];
        for _ in 0..400 {
            seen[r.choose(1, &idle(4), &[0; 4])] += 1;
        }
        assert!(seen.iter().all(|&c| c > 60), "{seen:?}");
    }

    #[test]
    fn least_loaded_prefers_fewest_requests() {
        let mut r = Router::new(PolicyKind::LeastLoaded, KvCost::default(), 1);
        let mut loads = idle(3);
        loads[0].active_requests = 2;
        loads[1].active_requests = 1;
        loads[2].active_requests = 1;
        loads[2].active_blocks = 10;
        assert_eq!(r.choose(1, &loads, &[0; 3]), 1);
    }

    #[test]
    fn kv_aware_trades_overlap_against_load() {
        let mut r = Router::new(PolicyKind::KvAware, KvCost::default(), 1);
        let loads = idle(3);
        assert_eq!(r.choose(10, &loads, &[0, 8, 3]), 1);
        // a heavily loaded worker loses its overlap advantage
        let mut loads = idle(3);
        loads[1].active_blocks = 100;
        assert_eq!(r.choose(10, &loads, &[0, 8, 3]), 2);
        let c = r.kv_costs(10, &loads, &[0, 8, 3]);
        assert_eq!(c, vec![20.0, 112.0, 17.0]);
    }

    #[test]
    fn temperature_spreads_choices_but_prefers_cheap() {
        let mut r = Router::new(
            PolicyKind::KvAware,
            KvCost {
                temperature: 0.5,
                ..KvCost::default()
            },
            3,
        );
        let mut seen = [0; 3];
        for _ in 0..1000 {
            seen[r.choose(10, &idle(3), &[0, 10, 5])] += 1;
        }
        assert!(
            seen[1] > seen[2] && seen[2] > seen[0] && seen[0] > 0,
            "{seen:?}"
        );
    }
}
