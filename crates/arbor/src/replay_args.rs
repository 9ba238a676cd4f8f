//! The flags of `arbor kv replay` (a `clap::Args` struct the binary
//! flattens), their ranges, and their translation into
//! [`kvreplay::ReplayOptions`]. Defaults come from the library's own
//! (`ReplayOptions::default()` is what no flags give).

use std::path::PathBuf;

use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use clap::Args;
use kvreplay::engine::EngineConfig;
use kvreplay::policy::{Balance, KvCost, PolicyKind};
use kvreplay::replay::SimConfig;
use kvreplay::stress::{IndexImpl, SweepConfig};
use kvreplay::synth::SynthConfig;
use kvreplay::trace::TraceScaling;
use kvreplay::{ReplayOptions, StressOptions, TraceSource, WorkloadSource};
use kvrouter::config::policy_value_parser;

pub(crate) fn positive_f64(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|e| format!("{e}"))?;
    if v.is_finite() && v > 0.0 {
        Ok(v)
    } else {
        Err(format!("must be a positive number, got {s}"))
    }
}

fn non_negative_f64(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|e| format!("{e}"))?;
    if v.is_finite() && v >= 0.0 {
        Ok(v)
    } else {
        Err(format!("must be a number >= 0, got {s}"))
    }
}

fn at_least_one_f64(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|e| format!("{e}"))?;
    if v.is_finite() && v >= 1.0 {
        Ok(v)
    } else {
        Err(format!("must be a number >= 1, got {s}"))
    }
}

fn fraction(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|e| format!("{e}"))?;
    if (0.0..=1.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("must be between 0 and 1, got {s}"))
    }
}

fn lanes(s: &str) -> Result<usize, String> {
    let v: usize = s.parse().map_err(|e| format!("{e}"))?;
    if (1..=256).contains(&v) {
        Ok(v)
    } else {
        Err(format!("must be between 1 and 256, got {s}"))
    }
}

/// An index implementation, parsed by `IndexImpl`'s `FromStr`; the names of
/// [`IndexImpl::ALL`] are clap's possible values (listed by `--help`,
/// suggested on a typo).
fn index_impl() -> impl TypedValueParser<Value = IndexImpl> {
    PossibleValuesParser::new(
        IndexImpl::ALL.map(|i| PossibleValue::new(i.name()).help(i.description())),
    )
    .try_map(|s| s.parse::<IndexImpl>())
}

/// Every knob of `arbor kv replay`.
///
/// Without `--trace`, a seeded synthetic workload (the `--synth-*` knobs) is
/// used. The run simulates a fleet of engines under each routing policy and
/// prints their prefix-cache hit rates and TTFTs, then replays one policy's
/// event and lookup timeline against the index implementations, compressed
/// into `--window-ms`, and prints the throughput and latencies they reached.
#[derive(Debug, Clone, Args)]
pub struct ReplayArgs {
    // ---- traffic ----
    /// Mooncake JSONL trace to replay (`timestamp` ms, `input_length`,
    /// `output_length`, `hash_ids`). Without it, the synthetic workload runs.
    #[arg(long, value_name = "FILE", help_heading = "Traffic")]
    pub trace: Option<PathBuf>,

    /// Skip malformed trace lines (and report how many) instead of failing.
    #[arg(long, help_heading = "Traffic")]
    pub skip_bad_lines: bool,

    /// Each trace hash id becomes this many consecutive ids (longer shared
    /// prefixes, same tree shape), as in Dynamo's mooncake_bench.
    #[arg(long, default_value_t = TraceScaling::default().length_factor as u32, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1024), help_heading = "Traffic")]
    pub trace_length_factor: u32,

    /// Disjoint copies of the trace (same shape, distinct hash ids), played
    /// at the same time.
    #[arg(long, default_value_t = TraceScaling::default().duplication_factor as u32, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1024), help_heading = "Traffic")]
    pub trace_duplication_factor: u32,

    /// Tokens per trace hash id (Mooncake: 512). Must be a multiple of
    /// --block-size; each id becomes trace-block-size / block-size blocks.
    #[arg(long, default_value_t = TraceScaling::default().trace_block_size as u32, value_name = "TOKENS", value_parser = clap::value_parser!(u32).range(1..), help_heading = "Traffic")]
    pub trace_block_size: u32,

    /// Tokens per KV block in the engines and the index.
    #[arg(long, default_value_t = EngineConfig::default().block_size as u32, value_name = "TOKENS", value_parser = clap::value_parser!(u32).range(1..), help_heading = "Traffic")]
    pub block_size: u32,

    /// Keep only the first N requests (after scaling).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..), help_heading = "Traffic")]
    pub max_requests: Option<u64>,

    // ---- synthetic workload ----
    /// Seed of the synthetic workload and of the routers' random choices.
    #[arg(
        long,
        default_value_t = SynthConfig::default().seed,
        help_heading = "Synthetic workload (without --trace)"
    )]
    pub seed: u64,

    /// Seconds during which new sessions start.
    #[arg(long, default_value_t = SynthConfig::default().duration_s, value_name = "S", value_parser = positive_f64, help_heading = "Synthetic workload (without --trace)")]
    pub synth_duration_s: f64,

    /// New conversation sessions per second (Poisson arrivals).
    #[arg(long, default_value_t = SynthConfig::default().session_rate, value_name = "PER_S", value_parser = positive_f64, help_heading = "Synthetic workload (without --trace)")]
    pub synth_session_rate: f64,

    /// Mean turns per session (geometric, >= 1); each turn's prompt is the
    /// whole conversation so far.
    #[arg(long, default_value_t = SynthConfig::default().mean_turns, value_name = "N", value_parser = at_least_one_f64, help_heading = "Synthetic workload (without --trace)")]
    pub synth_mean_turns: f64,

    /// Mean seconds between turns of a session (exponential).
    #[arg(long, default_value_t = SynthConfig::default().think_time_s, value_name = "S", value_parser = positive_f64, help_heading = "Synthetic workload (without --trace)")]
    pub synth_think_time_s: f64,

    /// Distinct system prompts shared across sessions.
    #[arg(long, default_value_t = SynthConfig::default().system_prompts as u32, value_name = "N", value_parser = clap::value_parser!(u32).range(1..), help_heading = "Synthetic workload (without --trace)")]
    pub synth_system_prompts: u32,

    /// Mean system prompt length, tokens (each prompt's length is drawn once,
    /// uniform in [0.5, 1.5] x this).
    #[arg(long, default_value_t = SynthConfig::default().system_prompt_tokens, value_name = "TOKENS", help_heading = "Synthetic workload (without --trace)")]
    pub synth_system_prompt_tokens: u32,

    /// Zipf exponent of system prompt popularity (0 = uniform).
    #[arg(long, default_value_t = SynthConfig::default().zipf_s, value_name = "S", value_parser = non_negative_f64, help_heading = "Synthetic workload (without --trace)")]
    pub synth_zipf: f64,

    /// Mean user message length, tokens (uniform in [0.5, 1.5] x this).
    #[arg(long, default_value_t = SynthConfig::default().user_tokens, value_name = "TOKENS", help_heading = "Synthetic workload (without --trace)")]
    pub synth_user_tokens: u32,

    /// Mean answer length, tokens (uniform in [0.5, 1.5] x this); answers
    /// join the next turn's prompt.
    #[arg(long, default_value_t = SynthConfig::default().output_tokens, value_name = "TOKENS", help_heading = "Synthetic workload (without --trace)")]
    pub synth_output_tokens: u32,

    // ---- fleet ----
    /// Number of simulated workers (engines).
    #[arg(long, default_value_t = ReplayOptions::default().sim.workers as u32, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=100_000), help_heading = "Simulated engines")]
    pub workers: u32,

    /// KV cache capacity of each worker, in blocks.
    #[arg(long, default_value_t = EngineConfig::default().capacity_blocks as u64, value_name = "BLOCKS", value_parser = clap::value_parser!(u64).range(1..), help_heading = "Simulated engines")]
    pub kv_blocks: u64,

    /// Prefill speed of a worker, tokens per second (one prefill at a time).
    #[arg(long, default_value_t = EngineConfig::default().prefill_tps, value_name = "TOK_S", value_parser = positive_f64, help_heading = "Simulated engines")]
    pub prefill_tps: f64,

    /// Decode speed of each running sequence, tokens per second.
    #[arg(long, default_value_t = EngineConfig::default().decode_tps, value_name = "TOK_S", value_parser = positive_f64, help_heading = "Simulated engines")]
    pub decode_tps: f64,

    /// Most requests a worker runs at once; the rest queue.
    #[arg(long, default_value_t = EngineConfig::default().max_running as u32, value_name = "N", value_parser = clap::value_parser!(u32).range(1..), help_heading = "Simulated engines")]
    pub max_batch: u32,

    // ---- routing ----
    /// Routing policies to compare (comma-separated). kv-aware is Dynamo's
    /// cost (--overlap-weight, --temperature); kv-balanced is ours: the
    /// longest cached prefix among workers that are not overloaded
    /// (--balance-ratio, --balance-abs), the least cache pressure for
    /// requests without a useful prefix (--cache-threshold,
    /// --pressure-half-life-s).
    #[arg(long, value_delimiter = ',', value_parser = policy_value_parser(), default_values_t = PolicyKind::ALL, help_heading = "Routing")]
    pub policies: Vec<PolicyKind>,

    /// kv-aware (Dynamo) softmax temperature: 0 picks the cheapest worker,
    /// above 0 samples (higher = more random).
    #[arg(long, default_value_t = KvCost::default().temperature, value_parser = non_negative_f64, help_heading = "Routing")]
    pub temperature: f64,

    /// kv-aware (Dynamo) weight of prefill blocks (after overlap credit)
    /// against decode blocks in the cost; Dynamo's default is 1.
    #[arg(long, default_value_t = KvCost::default().overlap_weight, value_parser = non_negative_f64, help_heading = "Routing")]
    pub overlap_weight: f64,

    /// kv-balanced load guard: a worker whose in-flight requests exceed this
    /// multiple of the fleet mean (and the least-loaded worker's by
    /// --balance-abs) is skipped. 1.5 = the busiest worker may carry half
    /// again the mean load, the tolerance the routing target allows.
    #[arg(long, default_value_t = Balance::default().ratio, value_name = "RATIO", value_parser = at_least_one_f64, help_heading = "Routing")]
    pub balance_ratio: f64,

    /// kv-balanced load guard margin, in-flight requests over the
    /// least-loaded worker's. Default: an eighth of --max-batch (8), so a
    /// burst of arrivals (Mooncake traces arrive in whole-second bursts)
    /// does not push conversations off their cache, while a persistent hot
    /// spot still trips the guard.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..), help_heading = "Routing")]
    pub balance_abs: Option<u64>,

    /// kv-balanced: follow the longest cached prefix only when it covers at
    /// least this fraction of the request's blocks; below it (for instance a
    /// short system prompt every request shares) the request goes to the
    /// worker with the least cache pressure instead of piling onto
    /// whichever worker cached that prefix first.
    #[arg(long, default_value_t = Balance::default().cache_threshold, value_name = "FRACTION", value_parser = fraction, help_heading = "Routing")]
    pub cache_threshold: f64,

    /// kv-balanced: half-life, seconds, of each worker's cache pressure (the
    /// blocks the router sent it to compute and store). Long enough to
    /// average over bursts of arrivals, short against the minutes a full
    /// cache takes to turn over.
    #[arg(long, default_value_t = Balance::default().half_life_s, value_name = "S", value_parser = positive_f64, help_heading = "Routing")]
    pub pressure_half_life_s: f64,

    // ---- stress ----
    /// Stress mode: skip the routing comparison and run only the index stress
    /// replay (over the timeline of --stress-policy).
    #[arg(long, help_heading = "Index stress replay")]
    pub stress: bool,

    /// Skip the index stress replay.
    #[arg(long, conflicts_with_all = ["stress", "sweep"], help_heading = "Index stress replay")]
    pub no_stress: bool,

    /// Whose timeline of events and lookups the stress replay uses (Dynamo's
    /// mooncake_bench spreads requests at random).
    #[arg(long, value_parser = policy_value_parser(), default_value_t = StressOptions::default().policy, help_heading = "Index stress replay")]
    pub stress_policy: PolicyKind,

    /// The whole timeline is replayed within this window, ms (shorter =
    /// higher rate).
    #[arg(long, default_value_t = StressOptions::default().window_ms, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..=3_600_000), help_heading = "Index stress replay")]
    pub window_ms: u64,

    /// Event-applying threads to try (comma-separated list); each worker's
    /// events always go to the same lane.
    #[arg(long, value_delimiter = ',', default_values_t = StressOptions::default().event_lanes, value_parser = lanes, help_heading = "Index stress replay")]
    pub event_lanes: Vec<usize>,

    /// Lookup threads.
    #[arg(long, default_value_t = StressOptions::default().query_lanes, value_parser = lanes, help_heading = "Index stress replay")]
    pub query_lanes: usize,

    /// Index implementations to compare (comma-separated); `null` does
    /// nothing and shows the harness's own ceiling.
    #[arg(long, value_delimiter = ',', value_parser = index_impl(), default_values_t = IndexImpl::REAL, help_heading = "Index stress replay")]
    pub impls: Vec<IndexImpl>,

    /// Find the highest rate each implementation keeps up with: halve or
    /// double the window from --window-ms, then bisect.
    #[arg(long, help_heading = "Index stress replay")]
    pub sweep: bool,

    /// Shortest window the sweep tries, ms.
    #[arg(long, default_value_t = SweepConfig::default().min_window_ms, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..), help_heading = "Index stress replay")]
    pub sweep_min_ms: u64,

    /// Longest window the sweep tries, ms.
    #[arg(long, default_value_t = SweepConfig::default().max_window_ms, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..), help_heading = "Index stress replay")]
    pub sweep_max_ms: u64,

    /// Bisection steps after the sweep brackets the limit.
    #[arg(
        long,
        default_value_t = SweepConfig::default().bisect_steps as u32,
        value_name = "N",
        help_heading = "Index stress replay"
    )]
    pub sweep_steps: u32,

    // ---- output ----
    /// Also write the full report as JSON to FILE.
    #[arg(long, value_name = "FILE", help_heading = "Output")]
    pub json: Option<PathBuf>,

    /// Also write an SVG plot (lookup latency CDF per implementation, hit
    /// rate and TTFT per policy) to FILE.
    #[arg(long, value_name = "FILE.svg", help_heading = "Output")]
    pub plot: Option<PathBuf>,

    /// Also route every request of each policy through a running router
    /// service at this URL (`arbor router`): the simulated engines publish
    /// their events to it over ZMQ in vLLM's wire format, `/route` decides,
    /// `/complete` releases; the report puts both runs side by side. `arbor
    /// kv replay --live` with no URL starts a router on loopback for the run.
    #[arg(long, value_name = "URL", num_args = 0..=1, default_missing_value = "auto", help_heading = "Output")]
    pub live: Option<String>,

    /// Instead of simulating, send the workload as streamed OpenAI
    /// completions through the gateway at this URL, at the workload's
    /// arrival times, and report the engines' cache hits, TTFT and load.
    /// With no URL, a fleet of `--workers` simulated engines (the flags
    /// above) and the router's gateway start on loopback for the run.
    #[arg(long, value_name = "URL", num_args = 0..=1, default_missing_value = "auto", help_heading = "Gateway replay")]
    pub gateway: Option<String>,

    /// Model the gateway replay's requests name (a local fleet serves
    /// `sim`).
    #[arg(long, default_value = "sim", help_heading = "Gateway replay")]
    pub gateway_model: String,

    /// Gateway replay: arrivals (and a local fleet's engines) run this many
    /// times faster than the workload's times.
    #[arg(long, default_value_t = 1.0, help_heading = "Gateway replay")]
    pub speedup: f64,

    /// Gateway replay: cap on each request's generated tokens.
    #[arg(long, default_value_t = 64, help_heading = "Gateway replay")]
    pub max_output_tokens: u32,

    /// Gateway replay: most requests in flight; later arrivals wait and
    /// count as late.
    #[arg(long, default_value_t = 1024, help_heading = "Gateway replay")]
    pub max_in_flight: usize,

    /// No progress bars (they are also hidden when stderr is not a terminal).
    #[arg(long, help_heading = "Output")]
    pub no_progress: bool,
}

impl Default for ReplayArgs {
    fn default() -> Self {
        #[derive(clap::Parser)]
        struct Wrapper {
            #[command(flatten)]
            args: ReplayArgs,
        }
        <Wrapper as clap::Parser>::parse_from(["kvreplay"]).args
    }
}

impl ReplayArgs {
    /// The synthetic workload's parameters.
    pub fn synth(&self) -> SynthConfig {
        SynthConfig {
            seed: self.seed,
            duration_s: self.synth_duration_s,
            session_rate: self.synth_session_rate,
            mean_turns: self.synth_mean_turns,
            think_time_s: self.synth_think_time_s,
            system_prompts: self.synth_system_prompts as usize,
            system_prompt_tokens: self.synth_system_prompt_tokens,
            zipf_s: self.synth_zipf,
            user_tokens: self.synth_user_tokens,
            output_tokens: self.synth_output_tokens,
            block_size: self.block_size as usize,
        }
    }

    /// The trace scaling knobs.
    pub fn scaling(&self) -> TraceScaling {
        TraceScaling {
            length_factor: self.trace_length_factor as usize,
            duplication_factor: self.trace_duplication_factor as usize,
            trace_block_size: self.trace_block_size as usize,
            block_size: self.block_size as usize,
        }
    }

    /// The fleet settings.
    pub fn sim(&self) -> SimConfig {
        SimConfig {
            workers: self.workers as usize,
            engine: EngineConfig {
                capacity_blocks: self.kv_blocks as usize,
                block_size: self.block_size as usize,
                prefill_tps: self.prefill_tps,
                decode_tps: self.decode_tps,
                max_running: self.max_batch as usize,
            },
            cost: KvCost {
                overlap_weight: self.overlap_weight,
                temperature: self.temperature,
            },
            balance: Balance {
                ratio: self.balance_ratio,
                abs: self
                    .balance_abs
                    .unwrap_or_else(|| Balance::default_abs(self.max_batch as usize)),
                cache_threshold: self.cache_threshold,
                half_life_s: self.pressure_half_life_s,
            },
            seed: self.seed,
        }
    }

    /// The sweep settings.
    pub fn sweep_config(&self) -> SweepConfig {
        SweepConfig {
            min_window_ms: self.sweep_min_ms,
            max_window_ms: self.sweep_max_ms,
            bisect_steps: self.sweep_steps as usize,
        }
    }

    /// What the flags ask the library to run. The sweep bounds are checked
    /// even without `--sweep`, as every flag is.
    pub fn options(&self) -> Result<ReplayOptions, kvreplay::Error> {
        let sweep = self.sweep_config();
        sweep.validate()?;
        let workload = match &self.trace {
            Some(path) => WorkloadSource::Trace(TraceSource {
                path: path.clone(),
                skip_bad_lines: self.skip_bad_lines,
                scaling: self.scaling(),
            }),
            None => WorkloadSource::Synthetic(self.synth()),
        };
        Ok(ReplayOptions {
            workload,
            max_requests: self.max_requests,
            sim: self.sim(),
            // `--stress`: the stress replay only.
            policies: if self.stress {
                Vec::new()
            } else {
                self.policies.clone()
            },
            stress: (!self.no_stress).then(|| StressOptions {
                policy: self.stress_policy,
                impls: self.impls.clone(),
                window_ms: self.window_ms,
                event_lanes: self.event_lanes.clone(),
                query_lanes: self.query_lanes,
                sweep: self.sweep.then_some(sweep),
            }),
            live: self.live.clone(),
            json: self.json.clone(),
            plot: self.plot.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: ReplayArgs,
    }

    fn parse(flags: &[&str]) -> Result<ReplayArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("replay").chain(flags.iter().copied())).map(|c| c.args)
    }

    #[test]
    fn no_flags_are_the_library_defaults() {
        let opts = ReplayArgs::default().options().unwrap();
        assert_eq!(opts, ReplayOptions::default());
    }

    #[test]
    fn flags_reach_the_options() {
        let a = parse(&[
            "--trace",
            "t.jsonl",
            "--skip-bad-lines",
            "--block-size",
            "16",
            "--stress",
            "--stress-policy",
            "kv-aware",
            "--impls",
            "null,ours",
            "--sweep",
            "--sweep-min-ms",
            "5",
            "--max-batch",
            "32",
        ])
        .unwrap();
        let o = a.options().unwrap();
        let WorkloadSource::Trace(t) = &o.workload else {
            panic!("{:?}", o.workload)
        };
        assert!(t.skip_bad_lines);
        assert_eq!((t.scaling.block_size, o.sim.engine.block_size), (16, 16));
        assert!(o.policies.is_empty(), "--stress: no routing comparison");
        assert_eq!(o.sim.balance.abs, 4, "an eighth of --max-batch");
        let s = o.stress.as_ref().unwrap();
        assert_eq!(s.policy, PolicyKind::KvAware);
        assert_eq!(s.impls, [IndexImpl::Null, IndexImpl::Ours]);
        assert_eq!(s.sweep.map(|s| s.min_window_ms), Some(5));
        assert_eq!(o.validate().map_err(|e| e.to_string()), Ok(()));

        let o = parse(&["--no-stress", "--policies", "random,kv-balanced"])
            .unwrap()
            .options()
            .unwrap();
        assert!(o.stress.is_none());
        assert_eq!(o.policies, [PolicyKind::Random, PolicyKind::KvBalanced]);
    }

    #[test]
    fn enum_flags_parse_every_name_and_list_them_on_a_typo() {
        for p in PolicyKind::ALL {
            let a = parse(&["--stress-policy", p.name(), "--policies", p.name()]).unwrap();
            assert_eq!((a.stress_policy, &a.policies[..]), (p, &[p][..]));
        }
        for i in IndexImpl::ALL {
            assert_eq!(parse(&["--impls", i.name()]).unwrap().impls, [i]);
        }
        let e = parse(&["--impls", "btree"]).unwrap_err().to_string();
        assert!(
            e.contains("[possible values: ours, reference, null]"),
            "{e}"
        );
        let e = parse(&["--policies", "kv"]).unwrap_err().to_string();
        assert!(
            e.contains(
                "[possible values: random, round-robin, least-loaded, kv-aware, kv-balanced]"
            ),
            "{e}"
        );
    }

    #[test]
    fn sweep_bounds_are_checked_even_without_sweep() {
        let a = parse(&[
            "--no-stress",
            "--sweep-min-ms",
            "100",
            "--sweep-max-ms",
            "50",
        ])
        .unwrap();
        let e = a.options().unwrap_err().to_string();
        assert_eq!(e, "--sweep-min-ms 100 exceeds --sweep-max-ms 50");
    }
}
