//! What a replay runs: [`ReplayOptions`], plain data a library caller fills
//! in (its `Default` is `arbor kv replay` with no flags) and the `arbor`
//! binary builds from its flags.

use std::path::PathBuf;

use crate::engine::EngineConfig;
use crate::policy::{Balance, KvCost, PolicyKind};
use crate::replay::SimConfig;
use crate::stress::{IndexImpl, SweepConfig};
use crate::synth::SynthConfig;
use crate::trace::TraceScaling;
use crate::Error;

/// Where the requests come from.
#[derive(Debug, Clone, PartialEq)]
pub enum WorkloadSource {
    /// The seeded synthetic generator.
    Synthetic(SynthConfig),
    /// A Mooncake JSONL trace.
    Trace(TraceSource),
}

/// A Mooncake JSONL trace file and how to scale it.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceSource {
    /// The file (`timestamp` ms, `input_length`, `output_length`,
    /// `hash_ids` per line).
    pub path: PathBuf,
    /// Skip malformed lines (the report counts them) instead of failing.
    pub skip_bad_lines: bool,
    /// Mooncake-bench scaling; its `block_size` must be the engines'.
    pub scaling: TraceScaling,
}

/// The index stress replay: one policy's timeline of events and lookups
/// replayed against each implementation at each event-lane count.
#[derive(Debug, Clone, PartialEq)]
pub struct StressOptions {
    /// Whose timeline is replayed (Dynamo's `mooncake_bench` routes at
    /// random).
    pub policy: PolicyKind,
    /// Implementations to compare, in order; empty: no stress replay.
    pub impls: Vec<IndexImpl>,
    /// The whole timeline is replayed within this window, ms.
    pub window_ms: u64,
    /// Event-applying thread counts to try, in order.
    pub event_lanes: Vec<usize>,
    /// Lookup threads.
    pub query_lanes: usize,
    /// Instead of one run per window, find the highest rate each
    /// implementation keeps up with, starting from `window_ms`.
    pub sweep: Option<SweepConfig>,
}

impl Default for StressOptions {
    fn default() -> Self {
        Self {
            policy: PolicyKind::Random,
            impls: IndexImpl::REAL.to_vec(),
            window_ms: 2500,
            event_lanes: vec![1, 2],
            query_lanes: 1,
            sweep: None,
        }
    }
}

/// Everything a replay does: the workload, the simulated fleet, the
/// policies compared, the stress replay and the outputs.
///
/// `Default` is what `arbor kv replay` runs without flags: the synthetic
/// default workload, 16 engines, every policy, the stress replay of the
/// random policy's timeline against ours and the reference.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayOptions {
    /// The requests.
    pub workload: WorkloadSource,
    /// Keep only the first N requests (after scaling).
    pub max_requests: Option<u64>,
    /// The simulated engines and the routers' knobs; `engine.block_size`
    /// must be the workload's.
    pub sim: SimConfig,
    /// Policies to compare (sorted and deduplicated before the run); empty:
    /// only the stress replay.
    pub policies: Vec<PolicyKind>,
    /// The index stress replay; `None` skips it.
    pub stress: Option<StressOptions>,
    /// Also route each policy through the router service at this URL
    /// (needs the `live` feature).
    pub live: Option<String>,
    /// Write the report as JSON here ([`crate::write_outputs`]).
    pub json: Option<PathBuf>,
    /// Write an SVG plot here ([`crate::write_outputs`]).
    pub plot: Option<PathBuf>,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        let engine = EngineConfig::default();
        let synth = SynthConfig {
            block_size: engine.block_size,
            ..SynthConfig::default()
        };
        Self {
            max_requests: None,
            sim: SimConfig {
                workers: 16,
                engine,
                cost: KvCost::default(),
                balance: Balance {
                    abs: Balance::default_abs(engine.max_running),
                    ..Balance::default()
                },
                seed: synth.seed,
            },
            workload: WorkloadSource::Synthetic(synth),
            policies: PolicyKind::ALL.to_vec(),
            stress: Some(StressOptions::default()),
            live: None,
            json: None,
            plot: None,
        }
    }
}

impl ReplayOptions {
    /// The default options on the trace at `path` (`arbor kv replay --trace
    /// PATH`): no scaling, the engines' block size.
    pub fn for_trace(path: impl Into<PathBuf>) -> Self {
        let mut opts = Self::default();
        opts.workload = WorkloadSource::Trace(TraceSource {
            path: path.into(),
            skip_bad_lines: false,
            scaling: TraceScaling {
                block_size: opts.sim.engine.block_size,
                ..TraceScaling::default()
            },
        });
        opts
    }

    /// Tokens per block of the workload (the synthetic generator's or the
    /// trace scaling's).
    pub fn workload_block_size(&self) -> usize {
        match &self.workload {
            WorkloadSource::Synthetic(s) => s.block_size,
            WorkloadSource::Trace(t) => t.scaling.block_size,
        }
    }

    /// Checks the settings that do not depend on the workload's contents;
    /// [`crate::run`] calls it first.
    pub fn validate(&self) -> Result<(), Error> {
        self.sim.validate()?;
        if let Some(sc) = self.stress.as_ref().and_then(|s| s.sweep.as_ref()) {
            sc.validate()?;
        }
        let (workload, engines) = (self.workload_block_size(), self.sim.engine.block_size);
        if workload != engines {
            return Err(Error::Config(format!(
                "the workload's block size {workload} differs from the engines' {engines}"
            )));
        }
        Ok(())
    }
}
