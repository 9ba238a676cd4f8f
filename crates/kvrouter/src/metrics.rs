//! Prometheus metrics: counters recorded where things happen, and gauges
//! of each worker's feed and each index set at scrape time from the
//! workers' status atomics (no per-event label lookups).
use std::sync::atomic::Ordering::Relaxed;
use std::sync::OnceLock;

use kvindex::KvIndexer;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use metrics_util::MetricKindMask;

/// How long a gauge no scrape has set stays in the output.
const GAUGE_IDLE: std::time::Duration = std::time::Duration::from_secs(1);

use crate::ingest::unix_now;
use crate::service::Service;

/// The process's Prometheus recorder, installed on first use.
pub fn handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let latency = [
                10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3,
                100e-3,
            ];
            let ratio = [0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0];
            let b = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &latency)
                .and_then(|b| b.set_buckets_for_metric(Matcher::Suffix("_ratio".into()), &ratio))
                .unwrap_or_else(|_| PrometheusBuilder::new())
                // Every gauge is set by `refresh` just before rendering, so
                // one that was not set is of a removed worker or model:
                // its series leaves the output.
                .idle_timeout(MetricKindMask::GAUGE, Some(GAUGE_IDLE));
            let recorder = b.build_recorder();
            let h = recorder.handle();
            // Another recorder may be installed already (an embedding
            // program's); ours still renders what it records.
            let _ = metrics::set_global_recorder(recorder);
            h
        })
        .clone()
}

/// Sets the scrape-time gauges.
pub fn refresh(s: &Service) {
    s.run_scrape_hooks();
    let now = unix_now();
    for m in s.models.all() {
        let model = m.name.clone();
        metrics::gauge!("kvrouter_index_blocks", "model" => model.clone()).set(m.blocks() as f64);
        metrics::gauge!("kvrouter_index_workers", "model" => model.clone())
            .set(m.workers.read().len() as f64);
        metrics::gauge!("kvrouter_index_bytes", "model" => model.clone())
            .set(m.index.heap_bytes().total() as f64);
        let stats = m.index.stats();
        metrics::gauge!("kvrouter_index_unknown_parents", "model" => model.clone())
            .set(stats.unknown_parents as f64);
        for (k, w) in m.workers.read().iter() {
            let labels = [
                ("model", model.clone()),
                ("worker_id", k.worker_id.to_string()),
                ("dp_rank", k.dp_rank.to_string()),
            ];
            let st = &w.status;
            if let Some(seq) = st.last_seq() {
                metrics::gauge!("kvrouter_worker_last_seq", &labels).set(seq as f64);
            }
            let ts = f64::from_bits(st.last_ts.load(Relaxed));
            if ts > 0.0 {
                metrics::gauge!("kvrouter_worker_lag_seconds", &labels).set((now - ts).max(0.0));
            }
            metrics::gauge!("kvrouter_worker_blocks", &labels)
                .set(m.index.worker_block_count(*k) as f64);
            metrics::gauge!("kvrouter_worker_healthy", &labels).set(if st.problem().is_none() {
                1.0
            } else {
                0.0
            });
            metrics::gauge!("kvrouter_worker_replays", &labels)
                .set(st.replays.load(Relaxed) as f64);
            metrics::gauge!("kvrouter_worker_resyncs", &labels)
                .set(st.resyncs.load(Relaxed) as f64);
        }
    }
}
