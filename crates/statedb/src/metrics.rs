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
//! | `statedb_commits_total` | counter |
//!
//! Every lock acquisition is timed (an uncontended one reads no clock: it
//! waited zero). Lock holds and commits are timed in one transaction in
//! [`crate::DbOptions::time_one_in`] per table: the two histograms hold
//! those samples, while the commit counter and [`Timings::count`] count
//! every one.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use metrics::{Counter, Gauge, Histogram};

/// How many times something happened, and how long the timed ones took,
/// as [`crate::Db::stats`] reports it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Timings {
    /// Events.
    pub count: u64,
    /// Events timed (all lock waits; one hold and one commit in
    /// [`crate::DbOptions::time_one_in`]).
    pub timed: u64,
    /// Their total duration.
    pub total: Duration,
    /// The longest of them.
    pub max: Duration,
}

impl Timings {
    /// The mean duration of the timed events.
    pub fn mean(&self) -> Option<Duration> {
        if self.timed == 0 {
            return None;
        }
        let nanos = self.total.as_nanos() / u128::from(self.timed);
        Some(Duration::from_nanos(nanos as u64))
    }
}

/// A running count and total of durations.
#[derive(Default, Debug)]
pub(crate) struct Timing {
    count: AtomicU64,
    timed: AtomicU64,
    nanos: AtomicU64,
    max_nanos: AtomicU64,
}

impl Timing {
    /// Only the holder of the table's write lock records, so each update
    /// is a plain load and store (no read-modify-write: three of those per
    /// figure were ~3% of a single-row commit). Readers of
    /// [`Timing::snapshot`] may see the fields from different commits;
    /// each is still a true figure.
    fn record(&self, d: Option<Duration>) {
        let add = |a: &AtomicU64, v: u64| {
            a.store(a.load(Ordering::Relaxed).wrapping_add(v), Ordering::Relaxed)
        };
        add(&self.count, 1);
        let Some(d) = d else { return };
        let n = d.as_nanos().min(u64::MAX as u128) as u64;
        add(&self.timed, 1);
        add(&self.nanos, n);
        if n > self.max_nanos.load(Ordering::Relaxed) {
            self.max_nanos.store(n, Ordering::Relaxed);
        }
    }

    pub(crate) fn snapshot(&self) -> Timings {
        Timings {
            count: self.count.load(Ordering::Relaxed),
            timed: self.timed.load(Ordering::Relaxed),
            total: Duration::from_nanos(self.nanos.load(Ordering::Relaxed)),
            max: Duration::from_nanos(self.max_nanos.load(Ordering::Relaxed)),
        }
    }
}

pub(crate) struct TableMetrics {
    objects: Gauge,
    revision: Gauge,
    graveyard: Gauge,
    lock_wait_h: Histogram,
    lock_hold_h: Histogram,
    commit_h: Histogram,
    commits: Counter,
    pub(crate) lock_wait: Timing,
    pub(crate) lock_hold: Timing,
    pub(crate) commit: Timing,
    /// The graveyard's size as of the table's last commit or collection.
    /// The background collector reads it and leaves a table with an
    /// empty graveyard alone without loading the published roots: a
    /// thread that never loads them costs commits nothing (every thread
    /// that ever loaded adds a node to the list each swap walks).
    graveyard_len: AtomicU64,
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
            commit_h: metrics::histogram!("statedb_commit_seconds", "table" => t.clone()),
            commits: metrics::counter!("statedb_commits_total", "table" => t),
            lock_wait: Timing::default(),
            lock_hold: Timing::default(),
            commit: Timing::default(),
            graveyard_len: AtomicU64::new(0),
        }
    }

    /// Called by the new holder of the table's write lock.
    pub(crate) fn lock_waited(&self, d: Duration) {
        self.lock_wait.record(Some(d));
        self.lock_wait_h.record(d.as_secs_f64());
    }

    /// Called before the holder releases the table's write lock (`d`: the
    /// hold, if it was timed).
    pub(crate) fn lock_held(&self, d: Option<Duration>) {
        self.lock_hold.record(d);
        if let Some(d) = d {
            self.lock_hold_h.record(d.as_secs_f64());
        }
    }

    /// Called by the committing holder of the table's write lock (`d`: the
    /// commit's duration, if it was timed).
    pub(crate) fn committed(
        &self,
        d: Option<Duration>,
        objects: usize,
        revision: u64,
        graveyard: usize,
    ) {
        self.commit.record(d);
        self.commits.increment(1);
        if let Some(d) = d {
            self.commit_h.record(d.as_secs_f64());
        }
        self.objects.set(objects as f64);
        self.revision.set(revision as f64);
        self.graveyard_size(graveyard);
    }

    /// Called by the holder of the table's write lock after it published a
    /// graveyard of `n` entries (the gauge).
    pub(crate) fn graveyard_size(&self, n: usize) {
        self.graveyard.set(n as f64);
    }

    /// Called by the holder of the table's write lock before it publishes
    /// a graveyard of `n` entries. Relaxed: the publication's swap orders
    /// it, so whoever loads those roots or newer reads this size or a
    /// newer one; the periodic collector may read it a round early (it
    /// then finds the old roots' graveyard) or late.
    pub(crate) fn set_graveyard_len(&self, n: usize) {
        (self.graveyard_len).store(n as u64, Ordering::Relaxed);
    }

    /// The graveyard's size as of the last commit or collection.
    pub(crate) fn graveyard_len(&self) -> u64 {
        self.graveyard_len.load(Ordering::Relaxed)
    }
}
