//! Event-order bookkeeping shared by every index: counters, per-worker
//! event-id clocks, gap detection and the gap callback.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use parking_lot::RwLock;

use crate::event::WorkerKey;

/// Counters of what an index has seen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IndexStats {
    /// Events applied (including those that only partly changed state).
    pub events_applied: u64,
    /// Events whose id skipped ahead of the worker's last id + 1.
    pub gaps: u64,
    /// `Stored` events rejected because their parent was not held.
    pub unknown_parents: u64,
    /// Removals of blocks the worker did not hold (no-ops).
    pub unknown_removes: u64,
    /// Replayed events (id below the worker's last id), ignored.
    pub duplicates: u64,
    /// Block insertions performed (new (worker, block) pairs).
    pub blocks_stored: u64,
    /// Block removals performed.
    pub blocks_removed: u64,
}

/// A gap report: the worker, the id it expected, the id that arrived.
pub type GapHandler = dyn Fn(WorkerKey, u64, u64) + Send + Sync;

/// Atomic counters plus the optional gap handler.
#[derive(Default)]
pub(crate) struct Counters {
    pub events_applied: AtomicU64,
    pub gaps: AtomicU64,
    pub unknown_parents: AtomicU64,
    pub unknown_removes: AtomicU64,
    pub duplicates: AtomicU64,
    pub blocks_stored: AtomicU64,
    pub blocks_removed: AtomicU64,
    gap_handler: RwLock<Option<Arc<GapHandler>>>,
}

impl IndexStats {
    /// Adds `o` into `self`, field by field.
    pub fn accumulate(&mut self, o: &IndexStats) {
        self.events_applied += o.events_applied;
        self.gaps += o.gaps;
        self.unknown_parents += o.unknown_parents;
        self.unknown_removes += o.unknown_removes;
        self.duplicates += o.duplicates;
        self.blocks_stored += o.blocks_stored;
        self.blocks_removed += o.blocks_removed;
    }
}

/// The event-id rule on plain per-worker counters. `last` is the worker's
/// last admitted id and is updated.
///
/// * first event of a worker, or `id == last + 1`: apply;
/// * `id == last`: apply again (every event kind is idempotent, and this
///   lets a dump carry one id for all of a worker's events);
/// * `id < last`: a replayed duplicate, ignored and counted;
/// * `id > last + 1`: a gap, counted, then applied; the caller reports it.
///
/// Returns the decision and, on a gap, the expected id.
pub(crate) fn admit_local(
    st: &mut IndexStats,
    last: &mut Option<u64>,
    id: u64,
) -> (Admit, Option<u64>) {
    let mut gap = None;
    match *last {
        Some(l) if id < l => {
            st.duplicates += 1;
            return (Admit::Duplicate, None);
        }
        Some(l) if l.checked_add(1).is_some_and(|next| id > next) => {
            st.gaps += 1;
            gap = Some(l.saturating_add(1));
        }
        _ => {}
    }
    *last = Some(id);
    st.events_applied += 1;
    (Admit::Apply, gap)
}

/// What to do with an event given the worker's last applied id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Admit {
    /// Apply it.
    Apply,
    /// Ignore it: an older id was replayed.
    Duplicate,
}

impl Counters {
    pub fn snapshot(&self) -> IndexStats {
        IndexStats {
            events_applied: self.events_applied.load(Relaxed),
            gaps: self.gaps.load(Relaxed),
            unknown_parents: self.unknown_parents.load(Relaxed),
            unknown_removes: self.unknown_removes.load(Relaxed),
            duplicates: self.duplicates.load(Relaxed),
            blocks_stored: self.blocks_stored.load(Relaxed),
            blocks_removed: self.blocks_removed.load(Relaxed),
        }
    }

    pub fn set_gap_handler(&self, h: Option<Arc<GapHandler>>) {
        *self.gap_handler.write() = h;
    }

    /// Calls the gap handler, if any.
    pub fn report_gap(&self, w: WorkerKey, expected: u64, got: u64) {
        let h = self.gap_handler.read().clone();
        if let Some(h) = h {
            h(w, expected, got);
        }
    }

    /// The event-id rule (see `admit_local`) on the shared counters.
    /// Returns the decision and, on a gap, the expected id; the caller
    /// reports the gap with [`Counters::report_gap`] once it holds no locks.
    pub fn admit(&self, last: &mut Option<u64>, id: u64) -> (Admit, Option<u64>) {
        let mut local = IndexStats::default();
        let r = admit_local(&mut local, last, id);
        self.duplicates.fetch_add(local.duplicates, Relaxed);
        self.gaps.fetch_add(local.gaps, Relaxed);
        self.events_applied.fetch_add(local.events_applied, Relaxed);
        r
    }
}
