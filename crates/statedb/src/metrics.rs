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
    /// Only the holder of the table's write lock records, so each update
    /// is a plain load and store (no read-modify-write: three of those per
    /// figure were ~3% of a single-row commit). Readers of
    /// [`Timing::snapshot`] may see the three fields from different
    /// commits; each is still a true figure.
    fn record(&self, d: Duration) {
        let n = d.as_nanos().min(u64::MAX as u128) as u64;
        let add = |a: &AtomicU64, v: u64| {
            a.store(a.load(Ordering::Relaxed).wrapping_add(v), Ordering::Relaxed)
        };
        add(&self.count, 1);
        add(&self.nanos, n);
        if n > self.max_nanos.load(Ordering::Relaxed) {
            self.max_nanos.store(n, Ordering::Relaxed);
        }
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

    /// Called by the new holder of the table's write lock.
    pub(crate) fn lock_waited(&self, d: Duration) {
        self.lock_wait.record(d);
        self.lock_wait_h.record(d.as_secs_f64());
    }

    /// Called before the holder releases the table's write lock.
    pub(crate) fn lock_held(&self, d: Duration) {
        self.lock_hold.record(d);
        self.lock_hold_h.record(d.as_secs_f64());
    }

    /// Called by the committing holder of the table's write lock.
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
