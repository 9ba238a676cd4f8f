//! The reconciler's figures, through the `metrics` facade. Every metric has
//! the label `reconciler` (the configured name); the reconciliation ones
//! also `op` (`update` or `delete`).

use std::time::Duration;

use ::metrics::{Counter, Gauge, Histogram, Label};

/// Counter: objects an operation was run on.
pub const RECONCILIATIONS: &str = "reconciler_reconciliations_total";
/// Histogram: seconds one batch of an operation took (one round's updates
/// or deletes).
pub const RECONCILIATION_DURATION: &str = "reconciler_reconciliation_duration_seconds";
/// Counter: objects an operation failed on.
pub const RECONCILIATION_ERRORS: &str = "reconciler_reconciliation_errors_total";
/// Gauge: objects whose last operation of this kind failed, now.
pub const RECONCILIATION_CURRENT_ERRORS: &str = "reconciler_reconciliation_current_errors";
/// Counter: prunes run.
pub const PRUNES: &str = "reconciler_prunes_total";
/// Histogram: seconds a prune took.
pub const PRUNE_DURATION: &str = "reconciler_prune_duration_seconds";
/// Counter: prunes that failed.
pub const PRUNE_ERRORS: &str = "reconciler_prune_errors_total";
/// Gauge: 1 while the last prune failed, else 0.
pub const PRUNE_CURRENT_ERRORS: &str = "reconciler_prune_current_errors";

/// One operation's handles.
pub(crate) struct OpMetrics {
    count: Counter,
    duration: Histogram,
    errors: Counter,
    current: Gauge,
}

impl OpMetrics {
    fn new(name: &str, op: &'static str) -> OpMetrics {
        let labels = || {
            vec![
                Label::new("reconciler", name.to_string()),
                Label::new("op", op),
            ]
        };
        OpMetrics {
            count: ::metrics::counter!(RECONCILIATIONS, labels()),
            duration: ::metrics::histogram!(RECONCILIATION_DURATION, labels()),
            errors: ::metrics::counter!(RECONCILIATION_ERRORS, labels()),
            current: ::metrics::gauge!(RECONCILIATION_CURRENT_ERRORS, labels()),
        }
    }

    /// A batch of `n` objects took `took`, `failed` of them failed.
    pub(crate) fn batch(&self, n: usize, failed: usize, took: Duration) {
        self.count.increment(n as u64);
        self.duration.record(took.as_secs_f64());
        if failed > 0 {
            self.errors.increment(failed as u64);
        }
    }

    pub(crate) fn current_errors(&self, n: usize) {
        self.current.set(n as f64);
    }
}

/// Every handle of one reconciler, registered once at start with the
/// recorder installed then.
pub(crate) struct Metrics {
    pub(crate) update: OpMetrics,
    pub(crate) delete: OpMetrics,
    prunes: Counter,
    prune_duration: Histogram,
    prune_errors: Counter,
    prune_current: Gauge,
}

impl Metrics {
    pub(crate) fn new(name: &str) -> Metrics {
        let labels = || vec![Label::new("reconciler", name.to_string())];
        Metrics {
            update: OpMetrics::new(name, "update"),
            delete: OpMetrics::new(name, "delete"),
            prunes: ::metrics::counter!(PRUNES, labels()),
            prune_duration: ::metrics::histogram!(PRUNE_DURATION, labels()),
            prune_errors: ::metrics::counter!(PRUNE_ERRORS, labels()),
            prune_current: ::metrics::gauge!(PRUNE_CURRENT_ERRORS, labels()),
        }
    }

    pub(crate) fn prune(&self, ok: bool, took: Duration) {
        self.prunes.increment(1);
        self.prune_duration.record(took.as_secs_f64());
        if !ok {
            self.prune_errors.increment(1);
        }
        self.prune_current.set(if ok { 0.0 } else { 1.0 });
    }
}
