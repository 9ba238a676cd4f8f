//! A seeded synthetic workload with a Mooncake-like shape.
//!
//! The model, all of whose parameters live in [`SynthConfig`]:
//! * **Sessions** start as a Poisson process of rate `session_rate` per
//!   second over `duration_s` seconds.
//! * Each session picks one of `system_prompts` shared system prompts with a
//!   Zipf(`zipf_s`) popularity; prompt `p` has a fixed length drawn once,
//!   uniform in `[0.5, 1.5] x system_prompt_tokens`.
//! * A session has `1 + Geometric` turns with mean `mean_turns`. Turn `k`
//!   arrives an exponential think time (mean `think_time_s`) after turn
//!   `k - 1`'s arrival.
//! * Turn `k`'s prompt is the whole conversation so far: system prompt, every
//!   earlier user message and answer, then the new user message. User
//!   messages and answers are uniform in `[0.5, 1.5] x` their means
//!   (`user_tokens`, `output_tokens`).
//! * Blocks: the prompt is cut into `block_size`-token blocks; only full
//!   blocks count (an engine caches full blocks only). A block inside the
//!   system prompt carries that prompt's shared id; every other block is
//!   unique to its session, so later turns re-use earlier turns' blocks.
//!
//! Expected statistics (checked by the tests): `session_rate x duration_s`
//! sessions, `mean_turns` turns per session, requests about
//! `sessions x mean_turns`, and a mean prompt of turn `k` of
//! `system_prompt_tokens + k x user_tokens + (k - 1) x output_tokens`.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use crate::trace::{Request, Workload, MAX_SCALED_BLOCKS};

/// Parameters of the synthetic generator.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SynthConfig {
    /// RNG seed; the same seed gives the same workload.
    pub seed: u64,
    /// Window in which sessions start, in seconds.
    pub duration_s: f64,
    /// New sessions per second (Poisson).
    pub session_rate: f64,
    /// Mean turns per session (>= 1; geometric).
    pub mean_turns: f64,
    /// Mean gap between turns of a session, in seconds (exponential).
    pub think_time_s: f64,
    /// Distinct shared system prompts.
    pub system_prompts: usize,
    /// Mean system prompt length in tokens.
    pub system_prompt_tokens: u32,
    /// Zipf exponent of system prompt popularity (0 = uniform).
    pub zipf_s: f64,
    /// Mean user message length in tokens.
    pub user_tokens: u32,
    /// Mean answer length in tokens.
    pub output_tokens: u32,
    /// Tokens per block.
    pub block_size: usize,
}

impl Default for SynthConfig {
    fn default() -> Self {
        Self {
            seed: 42,
            duration_s: 600.0,
            session_rate: 8.0,
            mean_turns: 4.0,
            think_time_s: 30.0,
            system_prompts: 32,
            system_prompt_tokens: 2048,
            zipf_s: 1.0,
            user_tokens: 384,
            output_tokens: 256,
            block_size: 64,
        }
    }
}

/// System prompts a synthetic workload may draw from, at most.
pub const MAX_SYSTEM_PROMPTS: usize = 1 << 24;

/// The configuration is unusable.
#[derive(Debug, thiserror::Error)]
#[error("invalid synthetic workload parameter: {0}")]
pub struct SynthError(pub String);

impl SynthConfig {
    /// Checks that every parameter is in range.
    pub fn validate(&self) -> Result<(), SynthError> {
        let pos = |v: f64, n: &str| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(SynthError(format!(
                    "{n} must be a positive number, got {v}"
                )))
            }
        };
        pos(self.duration_s, "duration_s")?;
        pos(self.session_rate, "session_rate")?;
        pos(self.think_time_s, "think_time_s")?;
        if !(self.mean_turns.is_finite() && self.mean_turns >= 1.0) {
            return Err(SynthError(format!(
                "mean_turns must be >= 1, got {}",
                self.mean_turns
            )));
        }
        if !(self.zipf_s.is_finite() && self.zipf_s >= 0.0) {
            return Err(SynthError(format!(
                "zipf_s must be >= 0, got {}",
                self.zipf_s
            )));
        }
        if self.system_prompts == 0 || self.block_size == 0 {
            return Err(SynthError(
                "system_prompts and block_size must be at least 1".into(),
            ));
        }
        if self.session_rate * self.duration_s * self.mean_turns > 5e7 {
            return Err(SynthError("more than 50M requests requested".into()));
        }
        // Sizes past any memory are refused before generating.
        if self.system_prompts > MAX_SYSTEM_PROMPTS {
            return Err(SynthError(format!(
                "more than {MAX_SYSTEM_PROMPTS} system prompts requested"
            )));
        }
        let blocks = self.estimated_blocks();
        if blocks > MAX_SCALED_BLOCKS as f64 {
            return Err(SynthError(format!(
                "the workload would hold about {blocks:.2e} blocks, more than {MAX_SCALED_BLOCKS}"
            )));
        }
        Ok(())
    }
}

impl SynthConfig {
    /// About how many block ids the workload holds in all, from the means
    /// (an upper estimate: 1.5 x the mean prompt of a mean-length session
    /// per request). Each request holds its prompt's block ids, and a
    /// session's prompt grows by a turn's tokens per turn, at least one of
    /// each kind (`around`).
    pub fn estimated_blocks(&self) -> f64 {
        let turn = f64::from(self.user_tokens.max(1)) + f64::from(self.output_tokens.max(1));
        let tokens = 1.5 * (f64::from(self.system_prompt_tokens) + self.mean_turns * turn);
        self.session_rate * self.duration_s * self.mean_turns * tokens / self.block_size as f64
    }
}

/// Uniform in `[0.5, 1.5] x mean`, at least 1.
fn around(rng: &mut ChaCha8Rng, mean: u32) -> u32 {
    let m = f64::from(mean.max(1));
    (m * rng.random_range(0.5..1.5)).round().max(1.0) as u32
}

fn exponential(rng: &mut ChaCha8Rng, mean: f64) -> f64 {
    let u: f64 = rng.random();
    -(1.0 - u).ln() * mean
}

/// Generated workload plus per-session facts the tests check.
#[derive(Debug, Clone)]
pub struct Synthetic {
    /// The requests.
    pub workload: Workload,
    /// Number of sessions.
    pub sessions: usize,
    /// System prompt chosen by each session.
    pub session_prompt: Vec<usize>,
    /// For each request: (session, turn index from 0).
    pub request_session: Vec<(usize, usize)>,
}

/// Generates the synthetic workload.
pub fn generate(cfg: &SynthConfig) -> Result<Synthetic, SynthError> {
    cfg.validate()?;
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
    let bs = cfg.block_size;
    // Shared system prompts: fixed lengths and id ranges.
    let mut next_id: u64 = 0;
    let mut prompts: Vec<(u32, u64)> = Vec::with_capacity(cfg.system_prompts);
    for _ in 0..cfg.system_prompts {
        let len = around(&mut rng, cfg.system_prompt_tokens);
        prompts.push((len, next_id));
        next_id += (len as usize / bs) as u64;
    }
    // Zipf CDF over prompts.
    let weights: Vec<f64> = (1..=cfg.system_prompts)
        .map(|r| 1.0 / (r as f64).powf(cfg.zipf_s))
        .collect();
    let total: f64 = weights.iter().sum();
    let mut cdf = Vec::with_capacity(weights.len());
    let mut acc = 0.0;
    for w in &weights {
        acc += w / total;
        cdf.push(acc);
    }
    let p_continue = 1.0 - 1.0 / cfg.mean_turns;

    // (arrival_us, session, turn, request)
    let mut out: Vec<(u64, usize, usize, Request)> = Vec::new();
    let mut session_prompt = Vec::new();
    let mut t = exponential(&mut rng, 1.0 / cfg.session_rate);
    let mut session = 0usize;
    while t < cfg.duration_s {
        let u: f64 = rng.random();
        let p = cdf.partition_point(|&c| c < u).min(cfg.system_prompts - 1);
        session_prompt.push(p);
        let (sys_len, sys_base) = prompts[p];
        let sys_full = sys_len as usize / bs;
        let mut tokens = sys_len as usize;
        let mut ids: Vec<u64> = (0..sys_full as u64).map(|j| sys_base + j).collect();
        let mut at = t;
        let mut turn = 0usize;
        loop {
            tokens += around(&mut rng, cfg.user_tokens) as usize;
            let full = tokens / bs;
            while ids.len() < full {
                ids.push(next_id);
                next_id += 1;
            }
            let output = around(&mut rng, cfg.output_tokens);
            out.push((
                (at * 1e6) as u64,
                session,
                turn,
                Request {
                    arrival_us: (at * 1e6) as u64,
                    input_tokens: tokens.min(u32::MAX as usize) as u32,
                    output_tokens: output,
                    blocks: ids.clone(),
                },
            ));
            tokens += output as usize;
            turn += 1;
            if rng.random::<f64>() >= p_continue {
                break;
            }
            at += exponential(&mut rng, cfg.think_time_s);
        }
        session += 1;
        t += exponential(&mut rng, 1.0 / cfg.session_rate);
    }
    out.sort_by_key(|e| e.0);
    let request_session = out.iter().map(|e| (e.1, e.2)).collect();
    Ok(Synthetic {
        workload: Workload {
            name: "synthetic".into(),
            block_size: bs,
            requests: out.into_iter().map(|e| e.3).collect(),
        },
        sessions: session,
        session_prompt,
        request_session,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> SynthConfig {
        SynthConfig {
            duration_s: 200.0,
            session_rate: 10.0,
            ..Default::default()
        }
    }

    /// Sizes within the CLI's flag ranges that would generate more than
    /// any memory holds are refused before generating (a 2^32-token system
    /// prompt made every request hold 10^8 block ids).
    #[test]
    fn oversized_workloads_are_refused() {
        let huge_prompt = SynthConfig {
            system_prompt_tokens: u32::MAX,
            ..small()
        };
        let e = generate(&huge_prompt).unwrap_err();
        assert!(e.0.contains("blocks"), "{e}");
        let many_prompts = SynthConfig {
            system_prompts: usize::MAX,
            ..small()
        };
        assert!(generate(&many_prompts)
            .unwrap_err()
            .0
            .contains("system prompts"));
        // Empty turns still add a token each way: a million-turn session of
        // one-token blocks is 10^12 block ids, not none.
        let long_session = SynthConfig {
            duration_s: 1.0,
            session_rate: 1.0,
            mean_turns: 1e6,
            system_prompt_tokens: 0,
            user_tokens: 0,
            output_tokens: 0,
            block_size: 1,
            ..small()
        };
        assert!(generate(&long_session).unwrap_err().0.contains("blocks"));
        assert!(generate(&SynthConfig::default()).is_ok());
    }

    #[test]
    fn deterministic_per_seed() {
        let a = generate(&small()).unwrap();
        let b = generate(&small()).unwrap();
        assert_eq!(a.workload, b.workload);
        let c = generate(&SynthConfig { seed: 7, ..small() }).unwrap();
        assert_ne!(a.workload, c.workload);
    }

    #[test]
    fn matches_documented_statistics() {
        let cfg = small();
        let s = generate(&cfg).unwrap();
        let expected_sessions = cfg.session_rate * cfg.duration_s; // 2000
        let sd = expected_sessions.sqrt();
        assert!(
            (s.sessions as f64 - expected_sessions).abs() < 5.0 * sd,
            "sessions {}",
            s.sessions
        );
        let turns = s.workload.requests.len() as f64 / s.sessions as f64;
        assert!((turns - cfg.mean_turns).abs() < 0.25, "mean turns {turns}");
        // Mean prompt length of first turns.
        let first: Vec<&Request> = s
            .workload
            .requests
            .iter()
            .zip(&s.request_session)
            .filter(|(_, (_, t))| *t == 0)
            .map(|(r, _)| r)
            .collect();
        let mean_first =
            first.iter().map(|r| f64::from(r.input_tokens)).sum::<f64>() / first.len() as f64;
        let want = f64::from(cfg.system_prompt_tokens + cfg.user_tokens);
        assert!(
            (mean_first - want).abs() < 0.1 * want,
            "first-turn {mean_first}"
        );
        // Zipf: the most popular prompt is the first.
        let mut counts = vec![0usize; cfg.system_prompts];
        for &p in &s.session_prompt {
            counts[p] += 1;
        }
        assert_eq!(counts.iter().enumerate().max_by_key(|c| c.1).unwrap().0, 0);
        // Arrivals sorted, within span.
        assert!(s
            .workload
            .requests
            .windows(2)
            .all(|w| w[0].arrival_us <= w[1].arrival_us));
    }

    #[test]
    fn turns_extend_their_session_prefix_and_sessions_share_system_prompts() {
        let s = generate(&small()).unwrap();
        let mut last: std::collections::HashMap<usize, &Request> = Default::default();
        for (r, &(sess, turn)) in s.workload.requests.iter().zip(&s.request_session) {
            assert_eq!(r.blocks.len(), r.input_tokens as usize / 64);
            if turn > 0 {
                let prev = last[&sess];
                assert!(r.blocks.len() > prev.blocks.len());
                assert_eq!(&r.blocks[..prev.blocks.len()], &prev.blocks[..]);
            }
            last.insert(sess, r);
        }
        // Two sessions with the same prompt share their first block.
        let mut by_prompt: std::collections::HashMap<usize, u64> = Default::default();
        let mut shared = 0;
        for (r, &(sess, turn)) in s.workload.requests.iter().zip(&s.request_session) {
            if turn == 0 {
                let p = s.session_prompt[sess];
                if let Some(&b) = by_prompt.get(&p) {
                    assert_eq!(b, r.blocks[0]);
                    shared += 1;
                }
                by_prompt.insert(p, r.blocks[0]);
            }
        }
        assert!(shared > 100);
        let bound = s.workload.infinite_cache_hit_rate();
        assert!(bound > 0.5 && bound < 0.95, "bound {bound}");
    }

    #[test]
    fn rejects_bad_parameters() {
        for cfg in [
            SynthConfig {
                mean_turns: 0.5,
                ..Default::default()
            },
            SynthConfig {
                session_rate: -1.0,
                ..Default::default()
            },
            SynthConfig {
                duration_s: f64::NAN,
                ..Default::default()
            },
            SynthConfig {
                system_prompts: 0,
                ..Default::default()
            },
        ] {
            assert!(generate(&cfg).is_err());
        }
    }
}
