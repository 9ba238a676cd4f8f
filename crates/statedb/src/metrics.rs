//! Per-table metrics, exported through the `metrics` facade and kept as
//! plain counters for [`crate::Db::stats`].
//!
//! Handles are registered when the table is created, so install the
//! recorder before creating tables. Names (label `table`):
//!
//! | name | kind |
//! |---|---|
//! | `statedb_table_objects` | gauge |
//! | `statedb_table_revision` | gauge |
//! | `statedb_table_graveyard_objects` | gauge |
//! | `statedb_write_lock_wait_seconds` | histogram |
//! | `statedb_write_lock_hold_seconds` | histogram |
//! | `statedb_commit_seconds` | histogram |

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use metrics::{Gauge, Histogram};

/// A running total of durations.
#[derive(Default, Debug)]
pub(crate) struct Timing {
    count: AtomicU64,
    nanos: AtomicU64,
    max_nanos: AtomicU64,
}

impl Timing {
    fn record(&self, d: Duration) {
        let n = d.as_nanos().min(u64::MAX as u128) as u64;
        self.count.fetch_add(1, Ordering::Relaxed);
        self.nanos.fetch_add(n, Ordering::Relaxed);
        self.max_nanos.fetch_max(n, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> (u64, Duration, Duration) {
        (
            self.count.load(Ordering::Relaxed),
            Duration::from_nanos(self.nanos.load(Ordering::Relaxed)),
            Duration::from_nanos(self.max_nanos.load(Ordering::Relaxed)),
        )
    }
}

pub(crate) struct TableMetrics {
    objects: Gauge,
    revision: Gauge,
    graveyard: Gauge,
    lock_wait_h: Histogram,
    lock_hold_h: Histogram,
    commit_h: Histogram,
    pub(crate) lock_wait: Timing,
    pub(crate) lock_hold: Timing,
    pub(crate) commit: Timing,
}

impl TableMetrics {
    pub(crate) fn new(table: &str) -> Self {
        let t = table.to_string();
        TableMetrics {
            objects: metrics::gauge!("statedb_table_objects", "table" => t.clone()),
            revision: metrics::gauge!("statedb_table_revision", "table" => t.clone()),
            graveyard: metrics::gauge!("statedb_table_graveyard_objects", "table" => t.clone()),
            lock_wait_h: metrics::histogram!("statedb_write_lock_wait_seconds", "table" => t.clone()),
            lock_hold_h: metrics::histogram!("statedb_write_lock_hold_seconds", "table" => t.clone()),
            commit_h: metrics::histogram!("statedb_commit_seconds", "table" => t),
            lock_wait: Timing::default(),
            lock_hold: Timing::default(),
            commit: Timing::default(),
        }
    }

    pub(crate) fn lock_waited(&self, d: Duration) {
        self.lock_wait.record(d);
        self.lock_wait_h.record(d.as_secs_f64());
    }

    pub(crate) fn lock_held(&self, d: Duration) {
        self.lock_hold.record(d);
        self.lock_hold_h.record(d.as_secs_f64());
    }

    pub(crate) fn committed(&self, d: Duration, objects: usize, revision: u64, graveyard: usize) {
        self.commit.record(d);
        self.commit_h.record(d.as_secs_f64());
        self.objects.set(objects as f64);
        self.revision.set(revision as f64);
        self.graveyard.set(graveyard as f64);
    }

    pub(crate) fn graveyard_size(&self, n: usize) {
        self.graveyard.set(n as f64);
    }
}
