//! Routing policies: random, round-robin, least-loaded, Dynamo's KV-aware
//! cost (`kv-aware`) and ours (`kv-balanced`).
//!
//! # `kv-aware`: Dynamo's cost
//! For worker `w`, `cost_w = overlap_weight * prefill_w + decode_w`, where
//! `prefill_w` is the request's blocks not covered by `w`'s cached prefix
//! (its overlap score from the index) plus the prefill blocks already
//! pending on `w`, and `decode_w` is the distinct KV blocks in use by
//! requests active on `w` plus the blocks this request would add to them
//! (its blocks minus the leading ones already in use there), as Dynamo's
//! active-sequence tracking counts them.
//! Temperature 0 picks the cheapest worker (ties broken at random);
//! above 0 it samples from a softmax over the costs normalised to `[0, 1]`
//! divided by the temperature.
//!
//! # `kv-balanced`: ours
//! Cache affinity first, with a load guard, in the manner of SGLang's
//! cache-aware router, plus a cache-pressure balance for requests that
//! have no useful prefix anywhere ([`Balance`] holds the knobs):
//!
//! 1. **Guard.** A worker is overloaded when its in-flight requests
//!    (queued + running) exceed both `ratio` x the fleet mean and the
//!    least-loaded worker's by at least `abs`. Overloaded workers are not
//!    considered (the least-loaded worker never is overloaded).
//! 2. **Warm route.** When the longest cached prefix among the remaining
//!    workers covers at least `cache_threshold` of the request's blocks, the
//!    request goes to a worker holding that longest prefix.
//! 3. **Cold route.** Otherwise any remaining worker may take it.
//!
//! Among the workers a route allows, the one with the least cache pressure
//! wins, then the fewest in-flight requests, then a random one. Cache
//! pressure is the router's own record of the blocks it sent each worker to
//! compute and store (request blocks minus that worker's overlap), decayed
//! with a half-life of `half_life_s`: equal pressure means equal insertion
//! rates, so every worker's LRU keeps a conversation for about as long.
//! Pending prefill is deliberately not part of the choice: moving a
//! conversation away from its cache to dodge a short queue trades the
//! fleet's compute (the hit rate) for one request's latency; a real
//! overload shows in the in-flight count and trips the guard.
use std::fmt;
use std::str::FromStr;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

/// Which routing policy.
///
/// Its names (what `FromStr` accepts, `Display` and serde write) come from
/// one table: [`PolicyKind::ALL`] and [`PolicyKind::name`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PolicyKind {
    /// Uniformly random worker.
    Random,
    /// Workers in turn.
    RoundRobin,
    /// Fewest active requests, then fewest active blocks.
    LeastLoaded,
    /// Dynamo's KV-aware cost over the index's overlap scores.
    KvAware,
    /// Ours: longest cached prefix among workers that are not overloaded,
    /// least cache pressure for requests with no useful prefix.
    KvBalanced,
}

impl PolicyKind {
    /// All policies, in report order: every name [`FromStr`] accepts.
    pub const ALL: [PolicyKind; 5] = [
        PolicyKind::Random,
        PolicyKind::RoundRobin,
        PolicyKind::LeastLoaded,
        PolicyKind::KvAware,
        PolicyKind::KvBalanced,
    ];

    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::Random => "random",
            PolicyKind::RoundRobin => "round-robin",
            PolicyKind::LeastLoaded => "least-loaded",
            PolicyKind::KvAware => "kv-aware",
            PolicyKind::KvBalanced => "kv-balanced",
        }
    }

    /// One line on what the policy does, for help texts and listings.
    pub fn description(self) -> &'static str {
        match self {
            PolicyKind::Random => "Uniformly random worker",
            PolicyKind::RoundRobin => "Workers in turn",
            PolicyKind::LeastLoaded => "Fewest active requests, then fewest active blocks",
            PolicyKind::KvAware => "Dynamo's KV-aware cost over the index's overlap scores",
            PolicyKind::KvBalanced => {
                "Ours: longest cached prefix among workers that are not overloaded, \
                 least cache pressure for requests with no useful prefix"
            }
        }
    }

    /// Whether the policy consults the KV index.
    pub fn uses_index(self) -> bool {
        matches!(self, PolicyKind::KvAware | PolicyKind::KvBalanced)
    }
}

/// Serialized as its [`name`](PolicyKind::name).
impl Serialize for PolicyKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An unknown policy name.
#[derive(Debug, Clone, thiserror::Error)]
#[error("unknown policy {:?}; expected {}", .0, one_of(&PolicyKind::ALL.map(PolicyKind::name)))]
pub struct UnknownPolicy(pub String);

/// `"a, b or c"`.
fn one_of(names: &[&str]) -> String {
    match names.split_last() {
        Some((last, [])) => (*last).to_string(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    }
}

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

/// Knobs of our `kv-balanced` policy (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Balance {
    /// A worker is overloaded when its in-flight requests exceed this
    /// multiple of the fleet mean (and the `abs` margin below).
    pub ratio: f64,
    /// ... and exceed the least-loaded worker's by at least this many.
    pub abs: u64,
    /// Fraction of the request's blocks the longest cached prefix must
    /// cover for the request to follow it.
    pub cache_threshold: f64,
    /// Half-life of the cache-pressure record, seconds.
    pub half_life_s: f64,
}

impl Balance {
    /// The default guard margin for engines of `max_batch` slots: an
    /// eighth of a batch (8 for the default batch of 64).
    pub fn default_abs(max_batch: usize) -> u64 {
        (max_batch as u64 / 8).max(1)
    }
}

impl Default for Balance {
    fn default() -> Self {
        Self {
            ratio: 1.5,
            abs: Balance::default_abs(64),
            cache_threshold: 0.1,
            half_life_s: 60.0,
        }
    }
}

/// A stateful router for one policy.
#[derive(Debug, Clone)]
pub struct Router {
    kind: PolicyKind,
    cost: KvCost,
    balance: Balance,
    rng: ChaCha8Rng,
    next: usize,
    /// Reused per-worker keys: (pressure, in flight) for `kv-balanced`.
    scratch: Vec<(f64, u64)>,
    /// (in flight, active blocks) for `least-loaded`.
    scratch_loads: Vec<(u64, u64)>,
    /// Per worker: cache pressure (decayed blocks sent to store) and when
    /// it was last updated, µs.
    pressure: Vec<(f64, u64)>,
}

impl Router {
    /// A router with its own seeded RNG.
    pub fn new(kind: PolicyKind, cost: KvCost, balance: Balance, seed: u64) -> Self {
        Self {
            kind,
            cost,
            balance,
            rng: ChaCha8Rng::seed_from_u64(seed),
            next: 0,
            scratch: Vec::new(),
            scratch_loads: Vec::new(),
            pressure: Vec::new(),
        }
    }

    /// `kv-balanced`'s cache pressure of worker `w` at `now_us`: the blocks
    /// it was sent to compute and store, each weighted by
    /// `2^(-age / half_life)`.
    pub fn pressure(&self, w: usize, now_us: u64) -> f64 {
        self.pressure.get(w).map_or(0.0, |&(v, t)| {
            let age_s = now_us.saturating_sub(t) as f64 / 1e6;
            v * (-age_s / self.balance.half_life_s).exp2()
        })
    }

    fn add_pressure(&mut self, w: usize, blocks: u64, now_us: u64) {
        if self.pressure.len() <= w {
            self.pressure.resize(w + 1, (0.0, 0));
        }
        let v = self.pressure(w, now_us) + blocks as f64;
        self.pressure[w] = (v, now_us.max(self.pressure[w].1));
    }

    /// The worker list changed: new position `i` was old position
    /// `old_of_new[i]` (`None`: a new worker). Per-worker state (cache
    /// pressure) follows its worker; departed workers' is dropped.
    pub fn reorder(&mut self, old_of_new: &[Option<usize>]) {
        let old = std::mem::take(&mut self.pressure);
        self.pressure = old_of_new
            .iter()
            .map(|o| o.and_then(|j| old.get(j).copied()).unwrap_or((0.0, 0)))
            .collect();
    }

    /// Which workers `kv-balanced`'s guard leaves in play (not overloaded).
    pub fn eligible(&self, loads: &[WorkerLoad]) -> Vec<bool> {
        let n = loads.len().max(1) as f64;
        let mean = loads.iter().map(|l| l.active_requests as f64).sum::<f64>() / n;
        let min = loads.iter().map(|l| l.active_requests).min().unwrap_or(0);
        loads
            .iter()
            .map(|l| {
                let r = l.active_requests;
                !(r as f64 > self.balance.ratio * mean && r - min >= self.balance.abs.max(1))
            })
            .collect()
    }

    /// `kv-balanced`'s choice.
    fn balanced(
        &mut self,
        now_us: u64,
        request_blocks: u64,
        loads: &[WorkerLoad],
        overlaps: &[u32],
    ) -> usize {
        let eligible = self.eligible(loads);
        let best = (0..loads.len())
            .filter(|&w| eligible[w])
            .map(|w| overlaps[w])
            .max()
            .unwrap_or(0);
        let warm =
            best > 0 && f64::from(best) >= self.balance.cache_threshold * request_blocks as f64;
        let mut s = std::mem::take(&mut self.scratch);
        s.clear();
        for (w, l) in loads.iter().enumerate() {
            let allowed = eligible[w] && (!warm || overlaps[w] == best);
            s.push(if allowed {
                // Pressure decides; in-flight requests break exact ties
                // (workers that were never sent anything to store).
                (self.pressure(w, now_us), l.active_requests)
            } else {
                (f64::INFINITY, u64::MAX)
            });
        }
        let w = self.argmin_random_by(&s, |a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        self.scratch = s;
        let stored = request_blocks.saturating_sub(u64::from(overlaps[w]));
        self.add_pressure(w, stored, now_us);
        w
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

    /// Index of the least key under `cmp`, ties (keys comparing equal)
    /// broken uniformly at random; 0 for no keys.
    fn argmin_random_by<K>(
        &mut self,
        keys: &[K],
        cmp: impl Fn(&K, &K) -> std::cmp::Ordering,
    ) -> usize {
        let Some(min) = keys.iter().min_by(|a, b| cmp(a, b)) else {
            return 0;
        };
        let ties = keys.iter().filter(|k| cmp(k, min).is_eq()).count();
        let mut pick = self.rng.random_range(0..ties);
        for (i, k) in keys.iter().enumerate() {
            if cmp(k, min).is_eq() {
                if pick == 0 {
                    return i;
                }
                pick -= 1;
            }
        }
        0
    }

    /// Chooses a worker for a request of `request_blocks` blocks arriving
    /// at `now_us`. `overlaps` is needed by the KV-aware policies only (one
    /// score per worker, in worker order). `loads` is never empty.
    pub fn choose(
        &mut self,
        now_us: u64,
        request_blocks: u64,
        loads: &[WorkerLoad],
        overlaps: &[u32],
    ) -> usize {
        let n = loads.len();
        debug_assert!(n > 0);
        match self.kind {
            PolicyKind::KvBalanced => self.balanced(now_us, request_blocks, loads, overlaps),
            PolicyKind::Random => self.rng.random_range(0..n),
            PolicyKind::RoundRobin => {
                let w = self.next % n;
                self.next = (self.next + 1) % n;
                w
            }
            PolicyKind::LeastLoaded => {
                let mut s = std::mem::take(&mut self.scratch_loads);
                s.clear();
                s.extend(loads.iter().map(|l| (l.active_requests, l.active_blocks)));
                let w = self.argmin_random_by(&s, |a, b| a.cmp(b));
                self.scratch_loads = s;
                w
            }
            PolicyKind::KvAware => {
                let costs = self.kv_costs(request_blocks, loads, overlaps);
                if self.cost.temperature <= 0.0 {
                    return self.argmin_random_by(&costs, |a, b| a.total_cmp(b));
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
            assert_eq!(p.to_string().parse::<PolicyKind>().unwrap(), p);
            assert_eq!(p.to_string(), p.name());
            assert!(!p.description().is_empty());
        }
        let err = "fastest".parse::<PolicyKind>().unwrap_err().to_string();
        assert_eq!(
            err,
            "unknown policy \"fastest\"; expected random, round-robin, least-loaded, \
             kv-aware or kv-balanced"
        );
    }

    #[test]
    fn ties_are_exact_and_broken_at_random() {
        let mut r = Router::new(
            PolicyKind::KvBalanced,
            KvCost::default(),
            Balance::default(),
            1,
        );
        let by = |a: &(f64, u64), b: &(f64, u64)| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1));
        // Pressure decides before in-flight requests, however close (a key
        // packed as pressure x 1e6 + requests read these two as a tie).
        let keys = [(1.0, 5), (1.0 + 1e-6, 4)];
        assert!((0..50).all(|_| r.argmin_random_by(&keys, by) == 0));
        let keys = [(1.0, 3), (1.0, 3), (2.0, 0)];
        let mut seen = [0; 3];
        for _ in 0..200 {
            seen[r.argmin_random_by(&keys, by)] += 1;
        }
        assert!(seen[0] > 50 && seen[1] > 50 && seen[2] == 0, "{seen:?}");
        assert_eq!(r.argmin_random_by(&[] as &[(f64, u64)], by), 0);
    }

    #[test]
    fn round_robin_cycles() {
        let mut r = Router::new(
            PolicyKind::RoundRobin,
            KvCost::default(),
            Balance::default(),
            1,
        );
        let got: Vec<usize> = (0..7).map(|_| r.choose(0, 1, &idle(3), &[0; 3])).collect();
        assert_eq!(got, vec![0, 1, 2, 0, 1, 2, 0]);
    }

    #[test]
    fn random_covers_all_workers() {
        let mut r = Router::new(PolicyKind::Random, KvCost::default(), Balance::default(), 1);
        let mut seen = [0; 4];
        for _ in 0..400 {
            seen[r.choose(0, 1, &idle(4), &[0; 4])] += 1;
        }
        assert!(seen.iter().all(|&c| c > 60), "{seen:?}");
    }

    #[test]
    fn least_loaded_prefers_fewest_requests() {
        let mut r = Router::new(
            PolicyKind::LeastLoaded,
            KvCost::default(),
            Balance::default(),
            1,
        );
        let mut loads = idle(3);
        loads[0].active_requests = 2;
        loads[1].active_requests = 1;
        loads[2].active_requests = 1;
        loads[2].active_blocks = 10;
        assert_eq!(r.choose(0, 1, &loads, &[0; 3]), 1);
    }

    #[test]
    fn kv_aware_trades_overlap_against_load() {
        let mut r = Router::new(
            PolicyKind::KvAware,
            KvCost::default(),
            Balance::default(),
            1,
        );
        let loads = idle(3);
        assert_eq!(r.choose(0, 10, &loads, &[0, 8, 3]), 1);
        // a heavily loaded worker loses its overlap advantage
        let mut loads = idle(3);
        loads[1].active_blocks = 100;
        assert_eq!(r.choose(0, 10, &loads, &[0, 8, 3]), 2);
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
            Balance::default(),
            3,
        );
        let mut seen = [0; 3];
        for _ in 0..1000 {
            seen[r.choose(0, 10, &idle(3), &[0, 10, 5])] += 1;
        }
        assert!(
            seen[1] > seen[2] && seen[2] > seen[0] && seen[0] > 0,
            "{seen:?}"
        );
    }

    fn balanced(seed: u64) -> Router {
        Router::new(
            PolicyKind::KvBalanced,
            KvCost::default(),
            Balance::default(),
            seed,
        )
    }

    #[test]
    fn kv_balanced_prefers_the_longest_cached_prefix() {
        let mut r = balanced(1);
        assert_eq!(r.choose(0, 10, &idle(3), &[0, 8, 3]), 1);
        // Load differences below the guard's margin (8 in-flight requests
        // over the least-loaded worker) do not move a conversation off its
        // cache, whatever its queue: pending prefill is not a criterion.
        let mut loads = idle(3);
        loads[1].active_requests = 7;
        loads[1].pending_prefill_blocks = 10_000;
        loads[1].active_blocks = 10_000;
        assert_eq!(r.choose(0, 10, &loads, &[0, 8, 3]), 1);
        assert_eq!(r.eligible(&loads), vec![true; 3]);
    }

    #[test]
    fn kv_balanced_falls_back_under_imbalance() {
        let mut r = balanced(1);
        let mut loads = idle(3);
        loads[0].active_requests = 1;
        loads[1].active_requests = 9;
        loads[2].active_requests = 2;
        // 9 > 1.5 x mean 4 and 9 - 0 >= 8: worker 1 is overloaded and
        // skipped; the next longest prefix (3 of 10 blocks) wins.
        assert_eq!(r.eligible(&loads), vec![true, false, true]);
        assert_eq!(r.choose(0, 10, &loads, &[0, 8, 3]), 2);
        // With no useful prefix left (1 block < 10% of 100), the request is
        // cold and goes to the least cache pressure: worker 2 was just sent
        // 7 blocks to store, worker 0 nothing.
        assert_eq!(r.choose(0, 100, &loads, &[0, 90, 1]), 0);
        // The least-loaded worker is never overloaded.
        let mut all = idle(2);
        all[0].active_requests = 100;
        all[1].active_requests = 100;
        assert_eq!(r.eligible(&all), vec![true, true]);
    }

    #[test]
    fn pressure_follows_its_worker_when_the_list_changes() {
        let mut r = balanced(3);
        // Worker 1 of three holds 10 of 50 blocks: it is sent 40 to store.
        assert_eq!(r.choose(0, 50, &idle(3), &[0, 10, 0]), 1);
        let p = r.pressure(1, 0);
        assert!(p > 0.0);
        // Worker 0 leaves and a new one joins at the end: old 1 is now 0.
        r.reorder(&[Some(1), Some(2), None]);
        assert_eq!(r.pressure(0, 0), p);
        assert_eq!(r.pressure(1, 0), 0.0);
        assert_eq!(r.pressure(2, 0), 0.0);
    }

    #[test]
    fn kv_balanced_spreads_cold_requests_by_cache_pressure() {
        let mut r = balanced(7);
        // A prefix every worker shares a little of (a short common system
        // prompt, here 5 of 100 blocks) is below the cache threshold: cold
        // requests spread instead of piling onto worker 0, which holds a
        // block more of it.
        let overlaps = [6, 5, 5, 5];
        let mut seen = [0; 4];
        for _ in 0..8 {
            seen[r.choose(0, 100, &idle(4), &overlaps)] += 1;
        }
        assert_eq!(seen, [2; 4]);
        // Pressure decays with the half-life: after 60 s a worker's record
        // counts half.
        let p = r.pressure(1, 0);
        assert!(p > 0.0);
        assert!((r.pressure(1, 60_000_000) - p / 2.0).abs() < 1e-9);
        // A warm request still follows its prefix regardless of pressure.
        assert_eq!(r.choose(0, 100, &idle(4), &[5, 5, 60, 5]), 2);
    }
}
