//! The report: a terminal table, JSON, and a hand-written SVG plot.

use std::fmt::Write as _;

use serde::Serialize;

use crate::policy::PolicyKind;
use crate::replay::{PolicyOutcome, SimConfig};
use crate::stress::{IndexImpl, StressResult, SweepResult};
use crate::synth::SynthConfig;
use crate::trace::TraceScaling;

/// What was replayed.
#[derive(Debug, Clone, Serialize)]
pub struct WorkloadSummary {
    /// File name or "synthetic".
    pub name: String,
    /// Requests.
    pub requests: u64,
    /// Prompt blocks over all requests.
    pub blocks: u64,
    /// Tokens per block.
    pub block_size: usize,
    /// First to last arrival, seconds.
    pub span_s: f64,
    /// Hit rate of one infinite cache shared by all workers: the bound.
    pub infinite_cache_hit_rate: f64,
    /// Malformed trace lines skipped.
    pub skipped_lines: usize,
    /// The first skipped line's error.
    pub first_skipped: Option<String>,
    /// Synthetic parameters, when synthetic.
    pub synthetic: Option<SynthConfig>,
    /// Trace scaling, when a trace.
    pub scaling: Option<TraceScaling>,
}

/// The whole result of a run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Workload.
    pub workload: WorkloadSummary,
    /// Fleet settings.
    pub fleet: SimConfig,
    /// One entry per routing policy.
    pub policies: Vec<PolicyOutcome>,
    /// The same policies routed live by a router service, when `--live`.
    pub live: Vec<PolicyOutcome>,
    /// The router the live runs used.
    pub live_router: Option<String>,
    /// The policy whose timeline the stress replay used.
    pub stress_policy: Option<PolicyKind>,
    /// Fixed-window stress runs.
    pub stress: Vec<StressResult>,
    /// Sweeps, when `--sweep`.
    pub sweeps: Vec<SweepResult>,
    /// Total wall time, seconds.
    pub wall_s: f64,
}

impl Report {
    /// A policy's hit rate over the infinite-cache bound, when both exist.
    pub fn vs_bound(&self, policy: PolicyKind) -> Option<f64> {
        let p = self.policies.iter().find(|p| p.policy == policy)?;
        let b = self.workload.infinite_cache_hit_rate;
        (b > 0.0).then(|| p.hit_rate / b)
    }

    /// Dynamo's KV-aware (`kv-aware`) hit rate over the bound.
    pub fn kv_vs_bound(&self) -> Option<f64> {
        self.vs_bound(PolicyKind::KvAware)
    }

    /// For each event-lane count swept with both implementations: ours'
    /// highest sustained rate over the reference's.
    pub fn sweep_ratios(&self) -> Vec<(usize, f64)> {
        let mut out = Vec::new();
        for s in self.sweeps.iter().filter(|s| s.index == IndexImpl::Ours) {
            let r = self
                .sweeps
                .iter()
                .find(|r| r.index == IndexImpl::Reference && r.event_lanes == s.event_lanes);
            if let (Some(a), Some(b)) = (
                s.max_sustained_ops_per_s,
                r.and_then(|r| r.max_sustained_ops_per_s),
            ) {
                out.push((s.event_lanes, a / b));
            }
        }
        out
    }
}

/// `1234567` -> `1,234,567`.
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `27_500_000.0` -> `27.5M`.
pub fn si(v: f64) -> String {
    let a = v.abs();
    if a >= 1e9 {
        format!("{:.2}G", v / 1e9)
    } else if a >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if a >= 1e3 {
        format!("{:.1}k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

fn ms(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.1} s", v / 1000.0)
    } else if v >= 100.0 {
        format!("{v:.0} ms")
    } else {
        format!("{v:.1} ms")
    }
}

fn mib(v: Option<f64>) -> String {
    v.map_or_else(|| "n/a".into(), |v| format!("{v:.0} MiB"))
}

/// The terminal table.
pub fn render_table(r: &Report) -> String {
    let mut o = String::new();
    table_workload(&mut o, r);
    if !r.policies.is_empty() {
        table_policies(&mut o, r);
    }
    if !r.live.is_empty() {
        table_live(&mut o, r);
    }
    if !r.stress.is_empty() || !r.sweeps.is_empty() {
        table_stress(&mut o, r);
    }
    table_targets(&mut o, r);
    let _ = writeln!(o, "Done in {:.1} s.", r.wall_s);
    o
}

/// The workload (with its skipped lines and the bound) and the fleet.
fn table_workload(o: &mut String, r: &Report) {
    let w = &r.workload;
    let _ = writeln!(
        o,
        "Workload  {}: {} requests, {} blocks of {} tokens over {:.0} s",
        w.name,
        thousands(w.requests),
        thousands(w.blocks),
        w.block_size,
        w.span_s
    );
    if w.skipped_lines > 0 {
        let _ = writeln!(
            o,
            "          skipped {} malformed lines (first: {})",
            w.skipped_lines,
            w.first_skipped.as_deref().unwrap_or("?")
        );
    }
    let _ = writeln!(
        o,
        "          upper bound (one infinite cache shared by all workers): {:.1}% prefix-block hits",
        w.infinite_cache_hit_rate * 100.0
    );
    let e = &r.fleet.engine;
    let _ = writeln!(
        o,
        "Fleet     {} workers x {} KV blocks; prefill {} tok/s, decode {} tok/s per sequence, batch {}",
        r.fleet.workers,
        thousands(e.capacity_blocks as u64),
        si(e.prefill_tps),
        si(e.decode_tps),
        e.max_running
    );
}

/// The routing comparison: one row per policy.
fn table_policies(o: &mut String, r: &Report) {
    let bound = r.workload.infinite_cache_hit_rate;
    let _ = writeln!(o, "\nRouting comparison");
    let _ = writeln!(
        o,
        "  {:<13} {:>9} {:>9} {:>16} {:>10} {:>10} {:>10}",
        "policy", "hit rate", "of bound", "prefill tokens", "TTFT p50", "TTFT p99", "imbalance"
    );
    for p in &r.policies {
        let of_bound = if bound > 0.0 {
            format!("{:.1}%", p.hit_rate / bound * 100.0)
        } else {
            "-".into()
        };
        let _ = writeln!(
            o,
            "  {:<13} {:>8.1}% {:>9} {:>16} {:>10} {:>10} {:>9.2}x",
            p.policy.name(),
            p.hit_rate * 100.0,
            of_bound,
            thousands(p.prefill_tokens),
            ms(p.ttft_p50_ms),
            ms(p.ttft_p99_ms),
            p.load_imbalance
        );
    }
    let _ = writeln!(
        o,
        "  hit rate = prompt blocks reused / requested; imbalance = busiest worker's work / mean"
    );
}

/// The live runs beside their in-process hit rates.
fn table_live(o: &mut String, r: &Report) {
    let _ = writeln!(
        o,
        "\nRouted live by {} (events over ZMQ in vLLM's wire format, /route, /complete)",
        r.live_router.as_deref().unwrap_or("?")
    );
    let _ = writeln!(
        o,
        "  {:<13} {:>9} {:>11} {:>10} {:>10}",
        "policy", "hit rate", "in process", "diff (pp)", "wall"
    );
    for l in &r.live {
        let local = r.policies.iter().find(|p| p.policy == l.policy);
        let _ = writeln!(
            o,
            "  {:<13} {:>8.1}% {:>10} {:>10} {:>9.1}s",
            l.policy.name(),
            l.hit_rate * 100.0,
            local.map_or("-".into(), |p| format!("{:.1}%", p.hit_rate * 100.0)),
            local.map_or("-".into(), |p| format!(
                "{:+.2}",
                (l.hit_rate - p.hit_rate) * 100.0
            )),
            l.wall_ms / 1000.0
        );
    }
}

/// The index stress replay: the fixed-window runs, the sweeps, warnings
/// about rejected or out-of-order events, and ours / reference.
fn table_stress(o: &mut String, r: &Report) {
    let _ = writeln!(
        o,
        "\nIndex stress replay (timeline of {} routing; open loop, deadline driven)",
        r.stress_policy.map_or("?", |p| p.name())
    );
    if !r.stress.is_empty() {
        stress_rows(o, &r.stress);
    }
    if let Some(s) = r.stress.first() {
        let _ = writeln!(
            o,
            "  {} block ops per run ({} lookups, {} events); ops = hashes looked up + stored + removed",
            thousands(s.block_ops),
            thousands(s.queries),
            thousands(s.events)
        );
    }
    for sw in &r.sweeps {
        table_sweep(o, sw);
    }
    stress_warnings(o, r);
    for (lanes, ratio) in r.sweep_ratios() {
        let _ = writeln!(
            o,
            "  ours / reference sustained rate with {lanes} event lane(s): {ratio:.2}x"
        );
    }
}

/// One sweep: its result and every run.
fn table_sweep(o: &mut String, sw: &SweepResult) {
    let _ = writeln!(
        o,
        "\n  sweep {} with {} event lane(s): {}",
        sw.index.name(),
        sw.event_lanes,
        match (sw.max_sustained_ops_per_s, sw.best_window_ms) {
            (Some(v), Some(wm)) => format!("sustains {} block ops/s (window {wm} ms)", si(v)),
            _ => "kept up at no window tried".into(),
        }
    );
    stress_rows(o, &sw.steps);
}

/// The stress table's header and one row per run.
fn stress_rows(o: &mut String, runs: &[StressResult]) {
    let _ = writeln!(
        o,
        "  {:<10} {:>5} {:>9} {:>10} {:>10} {:>8} {:>15} {:>12} {:>15} {:>9}",
        "index",
        "lanes",
        "window",
        "offered/s",
        "achieved/s",
        "kept up",
        "find p50/p99",
        "queue p99",
        "apply p50/p99",
        "peak RSS"
    );
    for s in runs {
        let _ = writeln!(
            o,
            "  {:<10} {:>5} {:>9} {:>10} {:>10} {:>8} {:>15} {:>12} {:>15} {:>9}",
            s.index.name(),
            format!("{}e{}q", s.event_lanes, s.query_lanes),
            format!("{} ms", s.window_ms),
            si(s.offered_ops_per_s),
            si(s.achieved_ops_per_s),
            if s.kept_up { "yes" } else { "NO" },
            format!("{:.1}/{:.1} us", s.find_p50_us, s.find_p99_us),
            format!("{:.1} us", s.find_queue_p99_us),
            format!("{:.1}/{:.1} us", s.apply_p50_us, s.apply_p99_us),
            mib(s.peak_rss_mib)
        );
    }
}

/// A warning per run whose index rejected events or counted anomalies.
fn stress_warnings(o: &mut String, r: &Report) {
    let bad = r
        .stress
        .iter()
        .chain(r.sweeps.iter().flat_map(|s| &s.steps))
        .filter(|s| s.apply_errors > 0 || s.index_anomalies > 0);
    for s in bad {
        let _ = writeln!(
            o,
            "  WARNING: {} ({} event lanes, {} ms) rejected {} events and counted {} event-order anomalies",
            s.index.name(),
            s.event_lanes,
            s.window_ms,
            s.apply_errors,
            s.index_anomalies
        );
    }
}

/// Whether each KV-aware policy run meets the routing target.
fn table_targets(o: &mut String, r: &Report) {
    let mut first = true;
    for (kind, label) in [
        (PolicyKind::KvAware, "kv-aware (Dynamo's cost)"),
        (PolicyKind::KvBalanced, "kv-balanced (ours)"),
    ] {
        let (Some(x), Some(p)) = (
            r.vs_bound(kind),
            r.policies.iter().find(|p| p.policy == kind),
        ) else {
            continue;
        };
        if std::mem::take(&mut first) {
            let _ = writeln!(o);
        }
        let met = x >= 0.9 && p.load_imbalance <= 1.5;
        let _ = writeln!(
            o,
            "{label} reaches {:.1}% of the upper-bound hit rate with the busiest worker at {:.2}x the mean load ({} the target of >= 90% within 1.5x).",
            x * 100.0,
            p.load_imbalance,
            if met { "meets" } else { "misses" }
        );
    }
}

/// The JSON report.
pub fn render_json(r: &Report) -> String {
    serde_json::to_string_pretty(r).expect("report serialises")
}

const COLORS: [&str; 6] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A panel's plot area width.
const PW: f64 = 300.0;
/// A panel's plot area height.
const PH: f64 = 260.0;
/// Margin left of each panel's plot area.
const ML: f64 = 60.0;
/// Margin above the plot areas.
const MT: f64 = 40.0;
/// Width of the whole plot: three panels.
const SVG_WIDTH: f64 = 3.0 * (PW + ML + 20.0);
/// Height of the whole plot.
const SVG_HEIGHT: f64 = PH + MT + 80.0;

/// The SVG plot: lookup latency CDF per implementation (left), prefix hit
/// rate per policy against the bound (middle), TTFT p50/p99 per policy
/// (right).
pub fn render_svg(r: &Report) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{}" font-family="sans-serif" font-size="11">"#,
        SVG_WIDTH, SVG_HEIGHT
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    svg_cdf_panel(&mut s, r);
    svg_hit_rate_panel(&mut s, r);
    svg_ttft_panel(&mut s, r);
    let _ = writeln!(
        s,
        r#"<text x="10" y="{}" font-size="10">{}</text>"#,
        SVG_HEIGHT - 12.0,
        esc(&format!(
            "workload {}: {} requests, {} workers; solid = p50, light = p99",
            r.workload.name,
            thousands(r.workload.requests),
            r.fleet.workers
        ))
    );
    let _ = writeln!(s, "</svg>");
    s
}

/// Draws panel `i`'s title and frame; returns its plot area's top-left
/// corner.
fn svg_panel(s: &mut String, i: f64, title: &str) -> (f64, f64) {
    let x0 = i * (PW + ML + 20.0) + ML;
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle" font-size="13" font-weight="bold">{}</text>"#,
        x0 + PW / 2.0,
        MT - 15.0,
        esc(title)
    );
    let _ = writeln!(
        s,
        r##"<rect x="{x0}" y="{MT}" width="{PW}" height="{PH}" fill="none" stroke="#444"/>"##
    );
    (x0, MT)
}

/// Panel 1: the lookup latency CDF of each stress run (of each sweep's
/// best run without fixed-window runs), log-x.
fn svg_cdf_panel(s: &mut String, r: &Report) {
    let (x0, y0) = svg_panel(s, 0.0, "find_matches latency CDF");
    let runs = cdf_runs(r);
    let all: Vec<f64> = runs
        .iter()
        .flat_map(|x| x.find_cdf.iter().map(|p| p.0.max(0.01)))
        .collect();
    if all.is_empty() {
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle">no stress run</text>"#,
            x0 + PW / 2.0,
            y0 + PH / 2.0
        );
        return;
    }
    let lo = all
        .iter()
        .copied()
        .fold(f64::INFINITY, f64::min)
        .log10()
        .floor();
    let hi = all
        .iter()
        .copied()
        .fold(f64::NEG_INFINITY, f64::max)
        .log10()
        .ceil()
        .max(lo + 1.0);
    let axes = CdfAxes { x0, y0, lo, hi };
    cdf_grid(s, &axes);
    for (i, run) in runs.iter().enumerate() {
        cdf_curve(s, &axes, i, run);
    }
}

/// The runs the CDF panel draws: the fixed-window runs, or without them
/// each sweep's run at its best window.
fn cdf_runs(r: &Report) -> Vec<&StressResult> {
    if r.stress.is_empty() {
        r.sweeps
            .iter()
            .filter_map(|sw| {
                sw.best_window_ms
                    .and_then(|w| sw.steps.iter().find(|x| x.window_ms == w))
            })
            .collect()
    } else {
        r.stress.iter().collect()
    }
}

/// The CDF panel's scales: its plot area's corner and the decades its
/// latency axis spans.
struct CdfAxes {
    x0: f64,
    y0: f64,
    /// Lowest decade (log10 µs).
    lo: f64,
    /// Highest decade (log10 µs).
    hi: f64,
}

impl CdfAxes {
    /// The x of latency `v` µs.
    fn x(&self, v: f64) -> f64 {
        self.x0 + (v.max(0.01).log10() - self.lo) / (self.hi - self.lo) * PW
    }

    /// The y of fraction `q`.
    fn y(&self, q: f64) -> f64 {
        self.y0 + PH - q * PH
    }
}

/// The CDF panel's decade grid lines, fraction ticks and axis label.
fn cdf_grid(s: &mut String, a: &CdfAxes) {
    let (x0, y0) = (a.x0, a.y0);
    let mut d = a.lo;
    while d <= a.hi {
        let x = a.x(10f64.powf(d));
        let _ = writeln!(
            s,
            r##"<line x1="{x}" y1="{y0}" x2="{x}" y2="{}" stroke="#ddd"/><text x="{x}" y="{}" text-anchor="middle">{} us</text>"##,
            y0 + PH,
            y0 + PH + 14.0,
            10f64.powf(d)
        );
        d += 1.0;
    }
    for q in [0.0, 0.5, 0.9, 1.0] {
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="end">{q}</text>"#,
            x0 - 4.0,
            a.y(q) + 4.0
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">latency (log scale); y = fraction of lookups</text>"#,
        x0 + PW / 2.0,
        y0 + PH + 30.0
    );
}

/// Run `i`'s CDF curve and its legend entry.
fn cdf_curve(s: &mut String, a: &CdfAxes, i: usize, run: &StressResult) {
    let c = COLORS[i % COLORS.len()];
    let pts: Vec<String> = run
        .find_cdf
        .iter()
        .map(|(v, q)| format!("{:.1},{:.1}", a.x(*v), a.y(*q)))
        .collect();
    let _ = writeln!(
        s,
        r#"<polyline fill="none" stroke="{c}" stroke-width="2" points="{}"/>"#,
        pts.join(" ")
    );
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" fill="{c}">{} {}e/{}q</text>"#,
        a.x0 + 8.0,
        a.y0 + 14.0 + 13.0 * i as f64,
        run.index.name(),
        run.event_lanes,
        run.query_lanes
    );
}

/// The width of each policy's slot in the bar panels.
fn policy_slot(r: &Report) -> f64 {
    PW / r.policies.len().max(1) as f64
}

/// The font size of the policy names under the bars: they alternate
/// between two rows so that neighbours never overlap, smaller when many.
fn policy_label_size(r: &Report) -> u32 {
    if r.policies.len() > 4 {
        10
    } else {
        11
    }
}

/// Panel 2: the hit rate of each policy, with the bound as a dashed line.
fn svg_hit_rate_panel(s: &mut String, r: &Report) {
    let (x0, y0) = svg_panel(s, 1.0, "prefix-cache hit rate");
    let bw = policy_slot(r);
    let label_size = policy_label_size(r);
    let bound = r.workload.infinite_cache_hit_rate;
    for (i, p) in r.policies.iter().enumerate() {
        let h = p.hit_rate * PH;
        let x = x0 + i as f64 * bw + bw * 0.15;
        let _ = writeln!(
            s,
            r#"<rect x="{x:.1}" y="{:.1}" width="{:.1}" height="{h:.1}" fill="{}"/><text x="{:.1}" y="{:.1}" text-anchor="middle">{:.1}%</text><text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="{}">{}</text>"#,
            y0 + PH - h,
            bw * 0.7,
            COLORS[i % COLORS.len()],
            x + bw * 0.35,
            y0 + PH - h - 4.0,
            p.hit_rate * 100.0,
            x + bw * 0.35,
            y0 + PH + 14.0 + 11.0 * (i % 2) as f64,
            label_size,
            p.policy.name()
        );
    }
    let by = y0 + PH - bound * PH;
    let _ = writeln!(
        s,
        r#"<line x1="{x0}" y1="{by:.1}" x2="{}" y2="{by:.1}" stroke="black" stroke-dasharray="5,3"/><text x="{}" y="{:.1}" text-anchor="start">bound {:.1}%</text>"#,
        x0 + PW,
        // On the left, above the weakest policy (the KV-aware bars on the
        // right reach up to the line).
        x0 + 2.0,
        by - 3.0,
        bound * 100.0
    );
}

/// Panel 3: TTFT p50 (solid) and p99 (light) of each policy, linear scale.
fn svg_ttft_panel(s: &mut String, r: &Report) {
    let (x0, y0) = svg_panel(s, 2.0, "TTFT p50 / p99 (ms)");
    let bw = policy_slot(r);
    let label_size = policy_label_size(r);
    let top = r
        .policies
        .iter()
        .map(|p| p.ttft_p99_ms)
        .fold(0.0, f64::max)
        .max(1e-3)
        * 1.1;
    for (i, p) in r.policies.iter().enumerate() {
        let x = x0 + i as f64 * bw + bw * 0.1;
        for (j, (v, op)) in [(p.ttft_p50_ms, "1.0"), (p.ttft_p99_ms, "0.45")]
            .into_iter()
            .enumerate()
        {
            let h = v / top * PH;
            let bx = x + j as f64 * bw * 0.4;
            let _ = writeln!(
                s,
                r#"<rect x="{bx:.1}" y="{:.1}" width="{:.1}" height="{h:.1}" fill="{}" fill-opacity="{op}"/><text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="9">{}</text>"#,
                y0 + PH - h,
                bw * 0.38,
                COLORS[i % COLORS.len()],
                bx + bw * 0.19,
                y0 + PH - h - 3.0,
                esc(&ms(v))
            );
        }
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="{}">{}</text>"#,
            x + bw * 0.4,
            y0 + PH + 14.0 + 11.0 * (i % 2) as f64,
            label_size,
            p.policy.name()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn number_formatting() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(1234567), "1,234,567");
        assert_eq!(si(27_500_000.0), "27.50M");
        assert_eq!(si(1500.0), "1.5k");
        assert_eq!(si(12.0), "12");
    }
}
