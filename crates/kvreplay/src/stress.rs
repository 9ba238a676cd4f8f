//! Index stress replay, after Dynamo's `mooncake_bench`.
//!
//! The simulated fleet's per-worker timeline of lookups and events (see
//! [`crate::replay::Timeline`]) is compressed into a window of `window_ms`
//! and replayed open-loop against a fresh index: every entry has a deadline
//! (`start + t * window / span`), a lane sleeps until the deadline of its
//! next entry (to a granularity of [`TIMER_GRANULARITY`]) and, when late,
//! runs it at once without sleeping, so lateness never slows the offered
//! rate. Events go to `event_lanes` threads, a
//! worker always to the same lane (so its events apply in order, as the
//! index requires); lookups go to `query_lanes` threads.
//!
//! Reported: block operations per second achieved (hashes looked up plus
//! hashes stored plus hashes removed, over the larger of the window and the
//! time taken), whether the run kept up (finished within 1.1 x the window),
//! `find_matches` and `apply` latency percentiles, and memory (peak RSS of
//! the run, and RSS growth while the index was alive, from
//! `/proc/self/status` on Linux).
//!
//! The sweep halves the window while the index keeps up, doubles it while it
//! does not, then bisects between the last window that kept up and the first
//! that did not: the highest rate that keeps up, within the sweep's steps.

use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use kvindex::{ConcurrentIndex, KvEvent, KvIndexer, LocalHash, ReferenceIndex};
use serde::Serialize;

use crate::progress::{Progress, ProgressTask};
use crate::replay::Timeline;

/// Index implementations to compare.
///
/// Its names (what `FromStr` accepts, `Display` and serde write) come from
/// one table: [`IndexImpl::ALL`] and [`IndexImpl::name`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IndexImpl {
    /// `kvindex::ConcurrentIndex`.
    Ours,
    /// `kvindex::ReferenceIndex` (one lock around a sequential tree).
    Reference,
    /// An index that does nothing: calibrates the harness's own ceiling.
    Null,
}

impl IndexImpl {
    /// Every implementation: every name [`FromStr`] accepts.
    pub const ALL: [IndexImpl; 3] = [IndexImpl::Ours, IndexImpl::Reference, IndexImpl::Null];

    /// The real implementations, ours first: the default comparison.
    pub const REAL: [IndexImpl; 2] = [IndexImpl::Ours, IndexImpl::Reference];

    /// CLI/report name.
    pub fn name(self) -> &'static str {
        match self {
            IndexImpl::Ours => "ours",
            IndexImpl::Reference => "reference",
            IndexImpl::Null => "null",
        }
    }

    /// One line on what the implementation is, for help texts and listings.
    pub fn description(self) -> &'static str {
        match self {
            IndexImpl::Ours => "`kvindex::ConcurrentIndex`",
            IndexImpl::Reference => "`kvindex::ReferenceIndex` (one lock around a sequential tree)",
            IndexImpl::Null => "An index that does nothing: calibrates the harness's own ceiling",
        }
    }

    /// A fresh, empty index.
    pub fn build(self) -> Arc<dyn KvIndexer> {
        match self {
            IndexImpl::Ours => Arc::new(ConcurrentIndex::new()),
            IndexImpl::Reference => Arc::new(ReferenceIndex::new()),
            IndexImpl::Null => Arc::new(NullIndex),
        }
    }
}

/// Serialized as its [`name`](IndexImpl::name).
impl Serialize for IndexImpl {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl fmt::Display for IndexImpl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Accepts every event and matches nothing.
struct NullIndex;

impl KvIndexer for NullIndex {
    fn apply(&self, _ev: &KvEvent) -> Result<(), kvindex::ApplyError> {
        Ok(())
    }
    fn find_matches(&self, _hashes: &[LocalHash]) -> kvindex::OverlapScores {
        kvindex::OverlapScores::new()
    }
    fn worker_block_count(&self, _w: kvindex::WorkerKey) -> usize {
        0
    }
    fn remove_worker(&self, _w: kvindex::WorkerKey) {}
    fn dump(&self) -> Vec<KvEvent> {
        Vec::new()
    }
    fn name(&self) -> &'static str {
        "null"
    }
}

/// An unknown implementation name.
#[derive(Debug, Clone, thiserror::Error)]
#[error("unknown index implementation {:?}; expected {}", .0, one_of(&IndexImpl::ALL.map(IndexImpl::name)))]
pub struct UnknownImpl(pub String);

/// `"a, b or c"`.
fn one_of(names: &[&str]) -> String {
    match names.split_last() {
        Some((last, [])) => (*last).to_string(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    }
}

impl FromStr for IndexImpl {
    type Err = UnknownImpl;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        IndexImpl::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| UnknownImpl(s.to_string()))
    }
}

/// Settings of one stress run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct StressConfig {
    /// The timeline is compressed into this many milliseconds.
    pub window_ms: u64,
    /// Threads applying events.
    pub event_lanes: usize,
    /// Threads running lookups.
    pub query_lanes: usize,
}

/// Results of one stress run.
#[derive(Debug, Clone, Serialize)]
pub struct StressResult {
    /// Implementation.
    pub index: IndexImpl,
    /// Settings.
    pub window_ms: u64,
    /// Event threads.
    pub event_lanes: usize,
    /// Lookup threads.
    pub query_lanes: usize,
    /// Lookups run.
    pub queries: u64,
    /// Events applied.
    pub events: u64,
    /// Block operations (looked-up + stored + removed hashes).
    pub block_ops: u64,
    /// Offered block ops per second (`block_ops / window`).
    pub offered_ops_per_s: f64,
    /// Achieved block ops per second (`block_ops / max(window, elapsed)`).
    pub achieved_ops_per_s: f64,
    /// Wall time until the last lane finished, ms.
    pub elapsed_ms: f64,
    /// Finished within 1.1 x the window.
    pub kept_up: bool,
    /// `find_matches` latency (service time: the call alone), µs.
    pub find_p50_us: f64,
    /// `find_matches` 99th percentile, µs.
    pub find_p99_us: f64,
    /// Lookups' 99th-percentile wait past their deadline before the call
    /// began (queueing behind the lane's earlier lookups), µs; as
    /// `mooncake_bench` reports it apart from the service time.
    pub find_queue_p99_us: f64,
    /// `apply` latency, µs.
    pub apply_p50_us: f64,
    /// `apply` 99th percentile, µs.
    pub apply_p99_us: f64,
    /// Events the index rejected (should be 0).
    pub apply_errors: u64,
    /// Event-order anomalies the index counted: id gaps, duplicates, unknown
    /// parents and removals of blocks not held (should be 0: every worker's
    /// events arrive complete and in order).
    pub index_anomalies: u64,
    /// Peak resident memory of the process during the run, MiB (Linux).
    pub peak_rss_mib: Option<f64>,
    /// Resident memory growth while the index was alive, MiB (Linux).
    pub index_rss_mib: Option<f64>,
    /// Lookup latency CDF: (µs, fraction at or below).
    pub find_cdf: Vec<(f64, f64)>,
}

/// Reads a `kB` field of `/proc/self/status`, in MiB.
fn proc_status_mib(field: &str) -> Option<f64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with(field))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

/// Resets the peak-RSS counter (Linux `clear_refs`); ignored elsewhere.
fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// Per-lane work, prepared before the clock starts.
struct Prepared<'a> {
    events: Vec<Vec<(Duration, &'a KvEvent)>>,
    queries: Vec<Vec<(Duration, &'a [LocalHash])>>,
    block_ops: u64,
}

fn prepare<'a>(tl: &'a Timeline, cfg: &StressConfig) -> Prepared<'a> {
    let span = tl.span_us().max(1) as u128;
    let window_ns = u128::from(cfg.window_ms) * 1_000_000;
    let at = |t: u64| Duration::from_nanos((u128::from(t) * window_ns / span) as u64);
    let lanes = tl.lanes(cfg.event_lanes, cfg.query_lanes);
    let block_ops = lanes.event_block_ops() + lanes.query_block_ops();
    Prepared {
        events: lanes.events.into_iter().map(|l| deadlines(l, at)).collect(),
        queries: lanes
            .queries
            .into_iter()
            .map(|l| deadlines(l, at))
            .collect(),
        block_ops,
    }
}

/// A lane's entries with their simulated times turned into deadlines.
fn deadlines<T>(lane: Vec<(u64, T)>, at: impl Fn(u64) -> Duration) -> Vec<(Duration, T)> {
    lane.into_iter().map(|(t, x)| (at(t), x)).collect()
}

fn new_hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 1 << 40, 3).expect("histogram bounds")
}

/// A lane runs an entry at once when its deadline is less than this far
/// away, and sleeps otherwise: the timer granularity of the replay (like a
/// 1 ms timer wheel), which keeps sleep calls to about one per millisecond
/// per lane instead of one per entry.
pub const TIMER_GRANULARITY: Duration = Duration::from_millis(1);

/// What a lane measured: each call's time, each entry's wait past its
/// deadline (ns), and when the lane finished.
struct Driven {
    service: Histogram<u64>,
    /// Empty unless lateness was asked for.
    queued: Histogram<u64>,
    end: Instant,
}

/// Runs entries at their deadlines, timing each call and, with `late`,
/// how long after its deadline it began (nanoseconds).
fn drive<T: Copy>(
    start: Instant,
    entries: &[(Duration, T)],
    progress: &dyn ProgressTask,
    late: bool,
    mut op: impl FnMut(T),
) -> Driven {
    let (mut h, mut q) = (new_hist(), new_hist());
    // Lanes begin together at `start`, never within the granularity
    // before it: a lane released late from the barrier would otherwise
    // run its first entries early and show them as not late at all.
    let now = Instant::now();
    if start > now {
        std::thread::sleep(start - now);
    }
    for (i, (at, item)) in entries.iter().enumerate() {
        let target = start + *at;
        let now = Instant::now();
        if target > now + TIMER_GRANULARITY {
            std::thread::sleep(target - now);
        }
        let t0 = Instant::now();
        op(*item);
        h.saturating_record(t0.elapsed().as_nanos().max(1) as u64);
        if late {
            q.saturating_record(t0.saturating_duration_since(target).as_nanos().max(1) as u64);
        }
        if i % 4096 == 4095 {
            progress.inc(4096);
        }
    }
    progress.inc((entries.len() % 4096) as u64);
    Driven {
        service: h,
        queued: q,
        end: Instant::now(),
    }
}

fn us(h: &Histogram<u64>, q: f64) -> f64 {
    if h.is_empty() {
        0.0
    } else {
        h.value_at_quantile(q) as f64 / 1000.0
    }
}

/// Replays `timeline` against a fresh `index` under `cfg`, reporting the
/// entries run as a task labelled `stress: {index} {event_lanes}e/{query_lanes}q`.
pub fn run_stress(
    timeline: &Timeline,
    index: IndexImpl,
    cfg: &StressConfig,
    progress: &dyn Progress,
) -> StressResult {
    let label = format!("stress: {index} {}e/{}q", cfg.event_lanes, cfg.query_lanes);
    run_stress_as(timeline, index, cfg, progress, &label)
}

/// [`run_stress`] with the progress task labelled `label`.
fn run_stress_as(
    timeline: &Timeline,
    index: IndexImpl,
    cfg: &StressConfig,
    progress: &dyn Progress,
    label: &str,
) -> StressResult {
    let prepared = prepare(timeline, cfg);
    let total_entries: u64 = prepared.events.iter().map(|l| l.len() as u64).sum::<u64>()
        + prepared.queries.iter().map(|l| l.len() as u64).sum::<u64>();
    let task = progress.start(label, total_entries);
    let progress: &dyn ProgressTask = &*task;
    reset_peak_rss();
    let rss_before = proc_status_mib("VmRSS:");
    let ix = index.build();
    let lanes = prepared.events.len() + prepared.queries.len();
    let barrier = Barrier::new(lanes + 1);
    let errors = std::sync::atomic::AtomicU64::new(0);
    let mut start = Instant::now();
    let (mut apply_h, mut find_h, mut queue_h) = (new_hist(), new_hist(), new_hist());
    let mut finished = start;
    let start_cell = std::sync::OnceLock::new();
    std::thread::scope(|s| {
        let mut handles = Vec::new();
        for lane in &prepared.events {
            let (ix, barrier, start_cell, errors) = (&ix, &barrier, &start_cell, &errors);
            handles.push(s.spawn(move || {
                barrier.wait();
                let start: Instant = *start_cell.get().expect("start set before barrier");
                drive(start, lane, progress, false, |ev: &KvEvent| {
                    if ix.apply(ev).is_err() {
                        errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                })
            }));
        }
        let mut qhandles = Vec::new();
        for lane in &prepared.queries {
            let (ix, barrier, start_cell) = (&ix, &barrier, &start_cell);
            qhandles.push(s.spawn(move || {
                barrier.wait();
                let start: Instant = *start_cell.get().expect("start set before barrier");
                drive(start, lane, progress, true, |h: &[LocalHash]| {
                    std::hint::black_box(ix.find_matches(h));
                })
            }));
        }
        start = Instant::now() + Duration::from_millis(2);
        start_cell.set(start).expect("set once");
        barrier.wait();
        for h in handles {
            let d = h.join().expect("event lane panicked");
            apply_h.add(d.service).expect("same bounds");
            finished = finished.max(d.end);
        }
        for h in qhandles {
            let d = h.join().expect("query lane panicked");
            find_h.add(d.service).expect("same bounds");
            queue_h.add(d.queued).expect("same bounds");
            finished = finished.max(d.end);
        }
    });
    let rss_after = proc_status_mib("VmRSS:");
    let peak = proc_status_mib("VmHWM:");
    task.finish();
    let st = ix.stats();
    let index_anomalies = st.gaps + st.duplicates + st.unknown_parents + st.unknown_removes;
    drop(ix);
    let elapsed = finished.saturating_duration_since(start).as_secs_f64();
    let window = cfg.window_ms as f64 / 1000.0;
    let mut find_cdf = Vec::new();
    if !find_h.is_empty() {
        for q in [
            0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99, 0.995, 0.999,
            1.0,
        ] {
            find_cdf.push((find_h.value_at_quantile(q) as f64 / 1000.0, q));
        }
    }
    StressResult {
        index,
        window_ms: cfg.window_ms,
        event_lanes: prepared.events.len(),
        query_lanes: prepared.queries.len(),
        queries: find_h.len(),
        events: apply_h.len(),
        block_ops: prepared.block_ops,
        offered_ops_per_s: prepared.block_ops as f64 / window,
        achieved_ops_per_s: prepared.block_ops as f64 / window.max(elapsed),
        elapsed_ms: elapsed * 1000.0,
        kept_up: elapsed <= window * 1.1,
        find_p50_us: us(&find_h, 0.5),
        find_p99_us: us(&find_h, 0.99),
        find_queue_p99_us: if queue_h.is_empty() {
            0.0
        } else {
            // 1 ns recorded for "not late at all".
            (queue_h.value_at_quantile(0.99).saturating_sub(1)) as f64 / 1000.0
        },
        apply_p50_us: us(&apply_h, 0.5),
        apply_p99_us: us(&apply_h, 0.99),
        apply_errors: errors.into_inner(),
        index_anomalies,
        peak_rss_mib: peak,
        index_rss_mib: match (rss_before, rss_after) {
            (Some(a), Some(b)) => Some((b - a).max(0.0)),
            _ => None,
        },
        find_cdf,
    }
}

/// Sweep settings (`--sweep-min-ms`, `--sweep-max-ms`, `--sweep-steps`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct SweepConfig {
    /// Smallest window tried, ms.
    pub min_window_ms: u64,
    /// Largest window tried, ms.
    pub max_window_ms: u64,
    /// Bisection steps after bracketing.
    pub bisect_steps: usize,
}

impl Default for SweepConfig {
    fn default() -> Self {
        Self {
            min_window_ms: 20,
            max_window_ms: 16_000,
            bisect_steps: 3,
        }
    }
}

impl SweepConfig {
    /// Checks that the shortest window does not exceed the longest.
    pub fn validate(&self) -> Result<(), crate::Error> {
        if self.min_window_ms > self.max_window_ms {
            return Err(crate::Error::Config(format!(
                "--sweep-min-ms {} exceeds --sweep-max-ms {}",
                self.min_window_ms, self.max_window_ms
            )));
        }
        Ok(())
    }
}

/// Outcome of a sweep.
#[derive(Debug, Clone, Serialize)]
pub struct SweepResult {
    /// Implementation.
    pub index: IndexImpl,
    /// Event lanes.
    pub event_lanes: usize,
    /// Every run, in the order run.
    pub steps: Vec<StressResult>,
    /// The highest achieved rate among runs that kept up (block ops/s).
    pub max_sustained_ops_per_s: Option<f64>,
    /// Its window, ms.
    pub best_window_ms: Option<u64>,
}

/// Finds the smallest window (highest rate) at which `index` keeps up,
/// each run a progress task labelled `{index} sweep: window {w} ms`.
pub fn sweep(
    timeline: &Timeline,
    index: IndexImpl,
    base: &StressConfig,
    sc: &SweepConfig,
    progress: &dyn Progress,
) -> SweepResult {
    let mut steps = Vec::new();
    let run = |w: u64, steps: &mut Vec<StressResult>| {
        let cfg = StressConfig {
            window_ms: w,
            ..*base
        };
        let label = format!("{index} sweep: window {w} ms");
        let r = run_stress_as(timeline, index, &cfg, progress, &label);
        let ok = r.kept_up && r.apply_errors == 0;
        steps.push(r);
        ok
    };
    let min = sc.min_window_ms.max(1);
    let max = sc.max_window_ms.max(min);
    let mut w = base.window_ms.clamp(min, max);
    // Bracket: ok = largest-rate window that kept up, fail = one that did not.
    let (mut ok, mut fail): (Option<u64>, Option<u64>) = (None, None);
    if run(w, &mut steps) {
        ok = Some(w);
        while w > min {
            w = (w / 2).max(min);
            if run(w, &mut steps) {
                ok = Some(w);
            } else {
                fail = Some(w);
                break;
            }
        }
    } else {
        fail = Some(w);
        while w < max {
            w = (w * 2).min(max);
            if run(w, &mut steps) {
                ok = Some(w);
                break;
            }
            fail = Some(w);
        }
    }
    if let (Some(mut lo_ok), Some(mut hi_fail)) = (ok, fail) {
        // lo_ok > hi_fail in window terms (ok is the longer window).
        for _ in 0..sc.bisect_steps {
            let mid = ((lo_ok as f64 * hi_fail as f64).sqrt()).round() as u64;
            if mid >= lo_ok || mid <= hi_fail {
                break;
            }
            if run(mid, &mut steps) {
                lo_ok = mid;
            } else {
                hi_fail = mid;
            }
        }
    }
    let best = steps
        .iter()
        .filter(|r| r.kept_up && r.apply_errors == 0)
        .max_by(|a, b| a.achieved_ops_per_s.total_cmp(&b.achieved_ops_per_s));
    SweepResult {
        index,
        event_lanes: base.event_lanes,
        max_sustained_ops_per_s: best.map(|r| r.achieved_ops_per_s),
        best_window_ms: best.map(|r| r.window_ms),
        steps,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::EngineConfig;
    use crate::policy::{Balance, KvCost, PolicyKind};
    use crate::progress::NoProgress;
    use crate::replay::{request_hashes, simulate, SimConfig, SimInput, TimelineEntry};
    use crate::synth::{generate, SynthConfig};

    fn timeline() -> Timeline {
        let w = generate(&SynthConfig {
            duration_s: 30.0,
            session_rate: 4.0,
            ..Default::default()
        })
        .unwrap()
        .workload;
        let cfg = SimConfig {
            workers: 8,
            engine: EngineConfig {
                capacity_blocks: 500,
                ..Default::default()
            },
            cost: KvCost::default(),
            balance: Balance::default(),
            seed: 3,
        };
        let h = request_hashes(&w);
        let input = SimInput {
            workload: &w,
            hashes: &h,
            cfg: &cfg,
        };
        simulate(input, PolicyKind::Random, None, true, &NoProgress)
            .unwrap()
            .timeline
            .unwrap()
    }

    #[test]
    fn stress_counts_every_operation_and_keeps_up_at_a_slow_rate() {
        let tl = timeline();
        let (mut q, mut e) = (0u64, 0u64);
        for (_, x) in tl.per_worker.iter().flatten() {
            match x {
                TimelineEntry::Query(_) => q += 1,
                TimelineEntry::Event(_) => e += 1,
            }
        }
        for index in [IndexImpl::Ours, IndexImpl::Reference, IndexImpl::Null] {
            let cfg = StressConfig {
                window_ms: 200,
                event_lanes: 2,
                query_lanes: 1,
            };
            let r = run_stress(&tl, index, &cfg, &NoProgress);
            assert_eq!(r.queries, q);
            assert_eq!(r.events, e);
            assert_eq!(r.apply_errors, 0, "{index}: events must apply cleanly");
            assert_eq!(
                r.index_anomalies, 0,
                "{index}: events complete and in order"
            );
            assert_eq!(r.block_ops, tl.block_ops());
            assert!(r.kept_up, "{index} {r:?}");
            assert!(r.elapsed_ms >= 195.0, "deadline-driven: {}", r.elapsed_ms);
            assert!(r.find_p99_us >= r.find_p50_us);
            assert!(r.achieved_ops_per_s <= r.offered_ops_per_s * 1.0001);
        }
    }

    #[test]
    fn lookups_behind_their_deadlines_show_as_queueing_not_service_time() {
        let tl = timeline();
        // No window: every entry is due at the start, so each lookup
        // waits for all before it; the calls themselves stay short.
        let cfg = StressConfig {
            window_ms: 0,
            event_lanes: 1,
            query_lanes: 1,
        };
        let r = run_stress(&tl, IndexImpl::Ours, &cfg, &NoProgress);
        assert!(r.queries > 100, "{}", r.queries);
        assert!(
            r.find_queue_p99_us > r.find_p99_us,
            "queueing {} us vs service {} us",
            r.find_queue_p99_us,
            r.find_p99_us
        );
    }

    #[test]
    fn sweep_brackets_and_reports_a_sustained_rate() {
        let tl = timeline();
        let base = StressConfig {
            window_ms: 64,
            event_lanes: 1,
            query_lanes: 1,
        };
        let sc = SweepConfig {
            min_window_ms: 8,
            max_window_ms: 256,
            bisect_steps: 1,
        };
        let r = sweep(&tl, IndexImpl::Ours, &base, &sc, &NoProgress);
        assert!(!r.steps.is_empty());
        let best = r.max_sustained_ops_per_s.expect("keeps up at some window");
        assert!(r
            .steps
            .iter()
            .all(|s| !s.kept_up || s.achieved_ops_per_s <= best));
    }

    #[test]
    fn impl_names_parse() {
        assert_eq!("ours".parse::<IndexImpl>().unwrap(), IndexImpl::Ours);
        assert!("btree".parse::<IndexImpl>().is_err());
    }
}
