//! kvreplay: how much prefill does KV-aware routing save on my traffic, and
//! can the index keep up with my event rate?
//!
//! The crate replays LLM traffic (a Mooncake JSONL trace, [`trace`], or a
//! seeded synthetic workload, [`synth`]) through a fleet of simulated
//! engines ([`engine`]) under several routing policies ([`policy`],
//! [`replay`]), and replays the resulting event and lookup timeline against
//! `kvindex`'s implementations under a compressed, deadline-driven clock
//! ([`stress`]). [`report`] renders the results; [`ReplayOptions`] says
//! what to run, [`Progress`] where progress goes, and [`run`] ties them
//! together. It is a library with no command line of its own: `arbor kv
//! replay` (crate `arbor`) builds the options from its flags and draws the
//! progress bars. With the `live` feature, [`server`] serves one simulated
//! engine over OpenAI's HTTP API with vLLM's KV events (`arbor kv engine`).
//! See `docs/design.md`.
//!
//! ```no_run
//! use kvreplay::{NoProgress, ReplayOptions};
//!
//! let report = kvreplay::run(&ReplayOptions::default(), &NoProgress)?;
//! print!("{}", kvreplay::report::render_table(&report));
//! # Ok::<(), kvreplay::Error>(())
//! ```
#![deny(missing_docs, unsafe_op_in_unsafe_fn)]
#![forbid(unsafe_code)]

pub mod engine;
#[cfg(feature = "live")]
pub mod gateway;
#[cfg(feature = "live")]
pub mod live;
pub mod options;
pub mod progress;
pub mod replay;
pub mod report;
#[cfg(feature = "live")]
pub mod server;
pub mod stress;
pub mod synth;
pub mod trace;

/// The routing policies, from `kvroute`: the simulator runs the code the
/// router service runs.
pub use kvroute::policy;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use kvindex::LocalHash;

pub use options::{ReplayOptions, StressOptions, TraceSource, WorkloadSource};
pub use progress::{NoProgress, Progress, ProgressTask};
pub use report::Report;

use crate::policy::PolicyKind;
use crate::replay::{
    request_hashes, simulate, PolicyOutcome, ReplayError, SimInput, SimRun, Timeline,
};
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

/// Loads the trace or generates the synthetic workload.
pub fn load_workload(opts: &ReplayOptions) -> Result<(Workload, WorkloadSummary), Error> {
    let (mut workload, skipped, first_skipped, synthetic, scaling) = match &opts.workload {
        WorkloadSource::Trace(t) => {
            let parsed = trace::read_trace(&t.path, t.skip_bad_lines)?;
            let name = t.path.file_name().map_or_else(
                || t.path.display().to_string(),
                |n| n.to_string_lossy().into(),
            );
            let w = t.scaling.apply(&name, &parsed.records)?;
            (
                w,
                parsed.skipped,
                parsed.first_skipped,
                None,
                Some(t.scaling),
            )
        }
        WorkloadSource::Synthetic(cfg) => {
            let s = synth::generate(cfg)?;
            (s.workload, 0, None, Some(cfg.clone()), None)
        }
    };
    if let Some(n) = opts.max_requests {
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

/// Each request's local hashes, from [`request_hashes`].
type RequestHashes = Vec<Arc<[LocalHash]>>;

/// [`load_workload`] as one progress task, with the requests' local hashes.
fn load_hashed(
    opts: &ReplayOptions,
    progress: &dyn Progress,
) -> Result<(Workload, WorkloadSummary, RequestHashes), Error> {
    let loading = progress.start("loading workload", 0);
    let (workload, summary) = load_workload(opts)?;
    let hashes = request_hashes(&workload);
    loading.finish();
    Ok((workload, summary, hashes))
}

/// Simulates `input` routed by `policy` (the KV-aware policies over a fresh
/// `ConcurrentIndex`) as a progress task `routing: {policy}`, recording the
/// timeline when `record`.
fn route(
    input: SimInput<'_>,
    policy: PolicyKind,
    record: bool,
    progress: &dyn Progress,
) -> Result<SimRun, Error> {
    let task = progress.start(
        &format!("routing: {}", policy.name()),
        input.workload.requests.len() as u64,
    );
    let index = kvindex::ConcurrentIndex::new();
    let run = simulate(input, policy, Some(&index), record, &*task)?;
    task.finish();
    Ok(run)
}

/// The event and lookup timeline that `arbor kv replay --stress` replays
/// for `opts`: its workload (the trace, scaled, or the synthetic workload;
/// at most `max_requests` requests) routed through its fleet (`opts.sim`) by
/// the stress policy (`opts.stress`'s; random without), recorded. Every
/// index fed [`Timeline::lanes`] gets the identical events and lookups.
pub fn timeline(opts: &ReplayOptions, progress: &dyn Progress) -> Result<Timeline, Error> {
    opts.validate()?;
    let (workload, _, hashes) = load_hashed(opts, progress)?;
    let input = SimInput {
        workload: &workload,
        hashes: &hashes,
        cfg: &opts.sim,
    };
    let policy = opts
        .stress
        .as_ref()
        .map_or(StressOptions::default().policy, |s| s.policy);
    route(input, policy, true, progress)?
        .timeline
        .ok_or_else(|| Error::Config("the simulation recorded no timeline".into()))
}

/// Runs the routing comparison and the stress replay as `opts` asks,
/// reporting each long step to `progress`.
pub fn run(opts: &ReplayOptions, progress: &dyn Progress) -> Result<Report, Error> {
    let started = Instant::now();
    opts.validate()?;
    let sim = opts.sim;
    // Fail before the run, not after it, when an output cannot be written.
    for p in [&opts.json, &opts.plot].into_iter().flatten() {
        std::fs::File::create(p).map_err(|source| Error::Output {
            path: p.clone(),
            source,
        })?;
    }
    let (workload, summary, hashes) = load_hashed(opts, progress)?;
    let input = SimInput {
        workload: &workload,
        hashes: &hashes,
        cfg: &sim,
    };

    let stress_opts = opts.stress.as_ref().filter(|s| !s.impls.is_empty());
    let mut policies = opts.policies.clone();
    policies.sort();
    policies.dedup();
    // The stress policy is simulated too (its timeline is needed); it joins
    // the comparison only if asked for.
    let mut sims = policies.clone();
    if let Some(s) = stress_opts {
        if !sims.contains(&s.policy) {
            sims.push(s.policy);
        }
    }

    let mut outcomes = Vec::new();
    let mut live = Vec::new();
    let mut timeline = None;
    for p in sims {
        let record = stress_opts.is_some_and(|s| s.policy == p);
        let run = route(input, p, record, progress)?;
        if record {
            timeline = run.timeline;
        }
        outcomes.push(run.outcome);
    }
    if let Some(url) = &opts.live {
        for &p in &policies {
            live.push(run_live(url, input, p, progress)?);
        }
    }
    outcomes.retain(|o| policies.contains(&o.policy));

    let mut stress = Vec::new();
    let mut sweeps = Vec::new();
    if let (Some(tl), Some(s)) = (timeline.as_ref(), stress_opts) {
        let mut lanes = s.event_lanes.clone();
        lanes.dedup();
        for &el in &lanes {
            for &ix in &s.impls {
                let cfg = StressConfig {
                    window_ms: s.window_ms,
                    event_lanes: el,
                    query_lanes: s.query_lanes,
                };
                match &s.sweep {
                    Some(sc) => sweeps.push(sweep(tl, ix, &cfg, sc, progress)),
                    None => stress.push(run_stress(tl, ix, &cfg, progress)),
                }
            }
        }
    }

    Ok(Report {
        workload: summary,
        fleet: sim,
        policies: outcomes,
        live,
        live_router: opts.live.clone(),
        stress_policy: stress_opts.map(|s| s.policy),
        stress,
        sweeps,
        wall_s: started.elapsed().as_secs_f64(),
    })
}

/// One policy routed live by the router at `url`.
#[cfg(feature = "live")]
fn run_live(
    url: &str,
    input: SimInput<'_>,
    p: PolicyKind,
    progress: &dyn Progress,
) -> Result<PolicyOutcome, Error> {
    static RUN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = RUN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let model = format!("kvreplay-{}-{}-{n}", std::process::id(), p.name());
    let mut d = live::LiveRouter::connect(url, &model, input.cfg.workers, p)?;
    let task = progress.start(
        &format!("live: {}", p.name()),
        input.workload.requests.len() as u64,
    );
    let run = replay::simulate_with(input, p, &mut d, false, &*task);
    task.finish();
    d.close();
    Ok(run?.outcome)
}

/// Without the `live` feature there is no live router.
#[cfg(not(feature = "live"))]
fn run_live(
    _url: &str,
    _input: SimInput<'_>,
    _p: PolicyKind,
    _progress: &dyn Progress,
) -> Result<PolicyOutcome, Error> {
    Err(Error::Config(
        "--live needs kvreplay built with its `live` feature".into(),
    ))
}

/// Writes the JSON and SVG outputs `opts` asks for.
pub fn write_outputs(opts: &ReplayOptions, report: &Report) -> Result<(), Error> {
    let write = |path: &PathBuf, text: String| {
        std::fs::write(path, text).map_err(|source| Error::Output {
            path: path.clone(),
            source,
        })
    };
    if let Some(p) = &opts.json {
        write(p, report::render_json(report))?;
    }
    if let Some(p) = &opts.plot {
        write(p, report::render_svg(report))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use kvindex::KvEvent;

    use super::*;
    use crate::replay::TimelineEntry;
    use crate::stress::{IndexImpl, SweepConfig};
    use crate::synth::SynthConfig;

    /// What a [`Recorder`] saw: per task, its label, length, units done and
    /// whether it finished.
    #[derive(Debug, Default)]
    struct Seen {
        tasks: Vec<(String, u64, u64, bool)>,
    }

    /// A progress callback that records every call.
    #[derive(Default)]
    struct Recorder(Arc<Mutex<Seen>>);

    struct RecordedTask(Arc<Mutex<Seen>>, usize);

    impl Progress for Recorder {
        fn start(&self, label: &str, len: u64) -> Box<dyn ProgressTask> {
            let mut seen = self.0.lock().unwrap();
            seen.tasks.push((label.to_string(), len, 0, false));
            Box::new(RecordedTask(self.0.clone(), seen.tasks.len() - 1))
        }
    }

    impl ProgressTask for RecordedTask {
        fn inc(&self, n: u64) {
            self.0.lock().unwrap().tasks[self.1].2 += n;
        }
        fn finish(&self) {
            self.0.lock().unwrap().tasks[self.1].3 = true;
        }
    }

    /// The default options on a few seconds of synthetic traffic and four
    /// workers, without the stress replay.
    fn tiny() -> ReplayOptions {
        let mut opts = ReplayOptions {
            workload: WorkloadSource::Synthetic(SynthConfig {
                duration_s: 20.0,
                session_rate: 2.0,
                ..SynthConfig::default()
            }),
            stress: None,
            ..ReplayOptions::default()
        };
        opts.sim.workers = 4;
        opts.sim.engine.capacity_blocks = 2000;
        opts
    }

    #[test]
    fn a_library_caller_runs_a_replay_with_its_own_progress() {
        let rec = Recorder::default();
        let report = run(&tiny(), &rec).unwrap();
        assert_eq!(report.policies.len(), PolicyKind::ALL.len());
        assert!(report.stress.is_empty() && report.stress_policy.is_none());
        let requests = report.workload.requests;
        assert!(requests > 0);

        let seen = rec.0.lock().unwrap();
        assert!(!seen.tasks.is_empty(), "at least one task started");
        assert!(seen.tasks.iter().all(|t| t.3), "every task finished");
        assert_eq!(seen.tasks[0].0, "loading workload");
        for p in PolicyKind::ALL {
            let label = format!("routing: {p}");
            let t = seen.tasks.iter().find(|t| t.0 == label).unwrap();
            assert_eq!((t.1, t.2), (requests, requests), "{label}");
        }
    }

    #[test]
    fn stress_tasks_count_every_entry() {
        let mut opts = tiny();
        opts.policies.clear();
        opts.stress = Some(StressOptions {
            impls: vec![IndexImpl::Null],
            window_ms: 20,
            event_lanes: vec![1],
            ..StressOptions::default()
        });
        let rec = Recorder::default();
        let report = run(&opts, &rec).unwrap();
        assert!(report.policies.is_empty(), "stress only");
        assert_eq!(report.stress.len(), 1);
        let seen = rec.0.lock().unwrap();
        let t = seen.tasks.iter().find(|t| t.0 == "stress: null 1e/1q");
        let t = t.unwrap();
        let r = &report.stress[0];
        assert_eq!(
            (t.1, t.2, t.3),
            (r.queries + r.events, r.queries + r.events, true)
        );
    }

    /// `timeline` records what the stress replay replays (the stress
    /// policy's simulation), and its lanes hold every entry once, each
    /// worker's events on one lane in publication order.
    #[test]
    fn the_timeline_is_the_stress_policy_s_and_its_lanes_keep_each_worker_s_order() {
        let mut opts = tiny();
        opts.stress = Some(StressOptions {
            policy: PolicyKind::KvAware,
            ..StressOptions::default()
        });
        let tl = timeline(&opts, &NoProgress).unwrap();
        let (workload, _) = load_workload(&opts).unwrap();
        let hashes = request_hashes(&workload);
        let input = SimInput {
            workload: &workload,
            hashes: &hashes,
            cfg: &opts.sim,
        };
        let index = kvindex::ConcurrentIndex::new();
        let direct = simulate(input, PolicyKind::KvAware, Some(&index), true, &NoProgress)
            .unwrap()
            .timeline
            .unwrap();
        let flat = |t: &Timeline| -> Vec<(u64, Option<KvEvent>, Option<Vec<LocalHash>>)> {
            t.in_time_order()
                .into_iter()
                .map(|(at, e)| match e {
                    TimelineEntry::Event(ev) => (at, Some(ev.clone()), None),
                    TimelineEntry::Query(h) => (at, None, Some(h.to_vec())),
                })
                .collect()
        };
        let all = flat(&tl);
        assert_eq!(all, flat(&direct), "the stress policy's simulation");
        assert!(all.windows(2).all(|w| w[0].0 <= w[1].0), "in time order");
        let events: Vec<&KvEvent> = all.iter().filter_map(|e| e.1.as_ref()).collect();
        let queries = all.iter().filter(|e| e.2.is_some()).count();
        assert!(
            events.len() > 100 && queries > 100,
            "{} {queries}",
            events.len()
        );

        // Without stress options the policy is random's, as `run`'s default.
        opts.stress = None;
        let random = timeline(&opts, &NoProgress).unwrap();
        assert_ne!(flat(&random), all, "random routing differs from kv-aware");

        for (el, ql) in [(1, 1), (3, 2), (8, 3)] {
            let lanes = tl.lanes(el, ql);
            assert_eq!((lanes.events.len(), lanes.queries.len()), (el, ql));
            assert_eq!(
                lanes.event_block_ops() + lanes.query_block_ops(),
                tl.block_ops()
            );
            assert_eq!(
                lanes.events.iter().map(Vec::len).sum::<usize>(),
                events.len()
            );
            assert_eq!(lanes.queries.iter().map(Vec::len).sum::<usize>(), queries);
            for (i, lane) in lanes.events.iter().enumerate() {
                assert!(lane.windows(2).all(|w| w[0].0 <= w[1].0));
                assert!(lane
                    .iter()
                    .all(|(_, ev)| kvindex::lane_of(ev.worker, el) == i));
            }
            for lane in &lanes.queries {
                assert!(lane.windows(2).all(|w| w[0].0 <= w[1].0));
            }
            // Each worker's events, lane by lane, are its events in
            // publication order (ids 0, 1, 2, ...).
            for (w, entries) in tl.per_worker.iter().enumerate() {
                let key = crate::replay::worker_key(w);
                let published: Vec<&KvEvent> = entries
                    .iter()
                    .filter_map(|(_, e)| match e {
                        TimelineEntry::Event(ev) => Some(ev),
                        TimelineEntry::Query(_) => None,
                    })
                    .collect();
                let laned: Vec<&KvEvent> = lanes.events[kvindex::lane_of(key, el)]
                    .iter()
                    .filter(|(_, ev)| ev.worker == key)
                    .map(|(_, ev)| *ev)
                    .collect();
                assert_eq!(laned, published, "worker {w}, {el} lanes");
                assert!(laned
                    .iter()
                    .enumerate()
                    .all(|(i, ev)| ev.event_id == i as u64));
            }
        }
        // One lane of each: the events and the lookups in global time order.
        let one = tl.lanes(1, 1);
        let evs: Vec<&KvEvent> = one.events[0].iter().map(|(_, ev)| *ev).collect();
        assert_eq!(evs, events);
    }

    #[test]
    fn library_validation_is_typed() {
        let mut opts = tiny();
        opts.stress = Some(StressOptions {
            sweep: Some(SweepConfig {
                min_window_ms: 100,
                max_window_ms: 50,
                bisect_steps: 1,
            }),
            ..StressOptions::default()
        });
        let e = run(&opts, &NoProgress).unwrap_err();
        assert!(matches!(e, Error::Config(_)), "{e}");
        assert_eq!(
            e.to_string(),
            "--sweep-min-ms 100 exceeds --sweep-max-ms 50"
        );

        let mut opts = tiny();
        opts.sim.workers = 0;
        assert!(matches!(run(&opts, &NoProgress), Err(Error::Replay(_))));

        let mut opts = ReplayOptions::for_trace("t.jsonl");
        opts.sim.engine.block_size = 16;
        let e = opts.validate().unwrap_err().to_string();
        assert!(
            e.contains("block size 64 differs from the engines' 16"),
            "{e}"
        );
    }

    #[test]
    fn every_name_round_trips_through_from_str_and_display() {
        for p in PolicyKind::ALL {
            assert_eq!(p.to_string().parse::<PolicyKind>().unwrap(), p);
            assert_eq!(p.to_string(), p.name());
            assert_eq!(serde_json::to_value(p).unwrap(), p.name());
        }
        for i in IndexImpl::ALL {
            assert_eq!(i.to_string().parse::<IndexImpl>().unwrap(), i);
            assert_eq!(i.to_string(), i.name());
            assert_eq!(serde_json::to_value(i).unwrap(), i.name());
            assert!(!i.description().is_empty());
        }
        assert!(IndexImpl::REAL.iter().all(|i| IndexImpl::ALL.contains(i)));
        assert_eq!(
            "btree".parse::<IndexImpl>().unwrap_err().to_string(),
            "unknown index implementation \"btree\"; expected ours, reference or null"
        );
        assert!("fastest".parse::<PolicyKind>().is_err());
    }
}
