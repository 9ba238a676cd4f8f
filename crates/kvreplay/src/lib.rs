//! kvreplay: how much prefill does KV-aware routing save on my traffic, and
//! can the index keep up with my event rate?
//!
//! The crate replays LLM traffic (a Mooncake JSONL trace, [`trace`], or a
//! seeded synthetic workload, [`synth`]) through a fleet of simulated
//! engines ([`engine`]) under several routing policies ([`policy`],
//! [`replay`]), and replays the resulting event and lookup timeline against
//! `kvindex`'s implementations under a compressed, deadline-driven clock
//! ([`stress`]). [`report`] renders the results; [`config`] holds the
//! command-line knobs; [`run`] ties them together. See `docs/design.md`.
#![deny(missing_docs, unsafe_op_in_unsafe_fn)]
#![forbid(unsafe_code)]

pub mod config;
pub mod engine;
#[cfg(feature = "live")]
pub mod live;
pub mod replay;
pub mod report;
pub mod stress;
pub mod synth;
pub mod trace;

/// The routing policies, from `kvroute`: the simulator runs the code the
/// router service runs.
pub use kvroute::policy;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

pub use config::ReplayArgs;
pub use report::Report;

use crate::policy::PolicyKind;
use crate::replay::{request_hashes, simulate, PolicyOutcome, ReplayError};
use crate::report::WorkloadSummary;
use crate::stress::{run_stress, sweep, StressConfig};
use crate::synth::SynthError;
use crate::trace::{TraceError, Workload};

/// Everything that can go wrong in a replay.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading or scaling the trace.
    #[error(transparent)]
    Trace(#[from] TraceError),
    /// Synthetic workload parameters.
    #[error(transparent)]
    Synth(#[from] SynthError),
    /// Simulation.
    #[error(transparent)]
    Replay(#[from] ReplayError),
    /// Writing an output file.
    #[error("cannot write {path}: {source}")]
    Output {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// Inconsistent options.
    #[error("{0}")]
    Config(String),
}

fn bar(len: u64, msg: String, show: bool) -> ProgressBar {
    let target = if show {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    };
    let pb = ProgressBar::with_draw_target(Some(len), target);
    pb.set_style(
        ProgressStyle::with_template("{msg:32} [{elapsed_precise}] {wide_bar} {pos}/{len}")
            .expect("valid template"),
    );
    pb.set_message(msg);
    pb.enable_steady_tick(Duration::from_millis(200));
    pb
}

/// Loads the trace or generates the synthetic workload.
pub fn load_workload(args: &ReplayArgs) -> Result<(Workload, WorkloadSummary), Error> {
    let (mut workload, skipped, first_skipped, synthetic, scaling) = match &args.trace {
        Some(path) => {
            let parsed = trace::read_trace(path, args.skip_bad_lines)?;
            let scaling = args.scaling();
            let name = path.file_name().map_or_else(
                || path.display().to_string(),
                |n| n.to_string_lossy().into(),
            );
            let w = scaling.apply(&name, &parsed.records)?;
            (w, parsed.skipped, parsed.first_skipped, None, Some(scaling))
        }
        None => {
            let cfg = args.synth();
            let s = synth::generate(&cfg)?;
            (s.workload, 0, None, Some(cfg), None)
        }
    };
    if let Some(n) = args.max_requests {
        workload.requests.truncate(n as usize);
    }
    if workload.requests.is_empty() {
        return Err(Error::Config("the workload has no requests".into()));
    }
    let summary = WorkloadSummary {
        name: workload.name.clone(),
        requests: workload.requests.len() as u64,
        blocks: workload.total_blocks(),
        block_size: workload.block_size,
        span_s: workload.span_us() as f64 / 1e6,
        infinite_cache_hit_rate: workload.infinite_cache_hit_rate(),
        skipped_lines: skipped,
        first_skipped,
        synthetic,
        scaling,
    };
    Ok((workload, summary))
}

/// Runs the routing comparison and the stress replay as `args` asks.
pub fn run(args: &ReplayArgs) -> Result<Report, Error> {
    let started = Instant::now();
    let show = !args.no_progress;
    let sim = args.sim();
    sim.validate()?;
    if args.sweep_min_ms > args.sweep_max_ms {
        return Err(Error::Config(format!(
            "--sweep-min-ms {} exceeds --sweep-max-ms {}",
            args.sweep_min_ms, args.sweep_max_ms
        )));
    }
    // Fail before the run, not after it, when an output cannot be written.
    for p in [&args.json, &args.plot].into_iter().flatten() {
        std::fs::File::create(p).map_err(|source| Error::Output {
            path: p.clone(),
            source,
        })?;
    }
    let spinner = bar(0, "loading workload".into(), show);
    spinner.set_style(
        ProgressStyle::with_template("{spinner} {msg} [{elapsed_precise}]")
            .expect("valid template"),
    );
    let (workload, summary) = load_workload(args)?;
    let hashes = request_hashes(&workload);
    spinner.finish_and_clear();

    let do_stress = !args.no_stress && !args.impls.is_empty();
    let mut policies: Vec<PolicyKind> = if args.stress {
        Vec::new()
    } else {
        let mut p = args.policies.clone();
        p.sort();
        p.dedup();
        p
    };
    // The stress policy is simulated too (its timeline is needed); it joins
    // the comparison unless in stress-only mode.
    let mut sims = policies.clone();
    if do_stress && !sims.contains(&args.stress_policy) {
        sims.push(args.stress_policy);
    }

    let mut outcomes = Vec::new();
    let mut live = Vec::new();
    let mut timeline = None;
    for p in sims.clone() {
        let record = do_stress && p == args.stress_policy;
        let pb = bar(
            workload.requests.len() as u64,
            format!("routing: {}", p.name()),
            show,
        );
        let index = kvindex::ConcurrentIndex::new();
        let run = simulate(&workload, &hashes, &sim, p, Some(&index), record, &pb)?;
        pb.finish_and_clear();
        if record {
            timeline = run.timeline;
        }
        outcomes.push(run.outcome);
    }
    if let Some(url) = &args.live {
        for &p in &policies {
            live.push(run_live(url, &workload, &hashes, &sim, p, show)?);
        }
    }
    if args.stress {
        outcomes.clear();
        policies.clear();
    }
    outcomes.retain(|o| policies.contains(&o.policy));

    let mut stress = Vec::new();
    let mut sweeps = Vec::new();
    if let Some(tl) = timeline.as_ref().filter(|_| do_stress) {
        let mut lanes = args.event_lanes.clone();
        lanes.dedup();
        for &el in &lanes {
            for &ix in &args.impls {
                let cfg = StressConfig {
                    window_ms: args.window_ms,
                    event_lanes: el,
                    query_lanes: args.query_lanes,
                };
                let pb = bar(0, format!("stress: {ix} {el}e/{}q", args.query_lanes), show);
                if args.sweep {
                    sweeps.push(sweep(tl, ix, &cfg, &args.sweep_config(), &pb));
                } else {
                    stress.push(run_stress(tl, ix, &cfg, &pb));
                }
                pb.finish_and_clear();
            }
        }
    }

    Ok(Report {
        workload: summary,
        fleet: sim,
        policies: outcomes,
        live,
        live_router: args.live.clone(),
        stress_policy: do_stress.then_some(args.stress_policy),
        stress,
        sweeps,
        wall_s: started.elapsed().as_secs_f64(),
    })
}

/// One policy routed live by the router at `url`.
#[cfg(feature = "live")]
fn run_live(
    url: &str,
    workload: &Workload,
    hashes: &[std::sync::Arc<[kvindex::LocalHash]>],
    sim: &replay::SimConfig,
    p: PolicyKind,
    show: bool,
) -> Result<PolicyOutcome, Error> {
    static RUN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = RUN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let model = format!("kvreplay-{}-{}-{n}", std::process::id(), p.name());
    let mut d = live::LiveRouter::connect(url, &model, sim.workers, p)?;
    let pb = bar(
        workload.requests.len() as u64,
        format!("live: {}", p.name()),
        show,
    );
    let run = replay::simulate_with(workload, hashes, sim, p, &mut d, false, &pb);
    pb.finish_and_clear();
    d.close();
    Ok(run?.outcome)
}

/// Without the `live` feature there is no live router.
#[cfg(not(feature = "live"))]
fn run_live(
    _url: &str,
    _workload: &Workload,
    _hashes: &[std::sync::Arc<[kvindex::LocalHash]>],
    _sim: &replay::SimConfig,
    _p: PolicyKind,
    _show: bool,
) -> Result<PolicyOutcome, Error> {
    Err(Error::Config(
        "--live needs kvreplay built with its `live` feature".into(),
    ))
}

/// Writes the JSON and SVG outputs `args` asks for.
pub fn write_outputs(args: &ReplayArgs, report: &Report) -> Result<(), Error> {
    let write = |path: &PathBuf, text: String| {
        std::fs::write(path, text).map_err(|source| Error::Output {
            path: path.clone(),
            source,
        })
    };
    if let Some(p) = &args.json {
        write(p, report::render_json(report))?;
    }
    if let Some(p) = &args.plot {
        write(p, report::render_svg(report))?;
    }
    Ok(())
}
