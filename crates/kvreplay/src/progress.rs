//! Progress reporting through a callback, so that the caller decides how
//! (if at all) progress is shown: the `arbor` binary draws terminal bars, a
//! service might log or export it, a test records it.
//!
//! A replay runs a few long steps one after another (loading the workload,
//! one simulation per policy, one stress run per implementation and lane
//! count); each is a task started on a [`Progress`] and advanced from the
//! threads doing the work.

/// Starts progress tasks; one per long step of a replay.
pub trait Progress: Sync {
    /// Starts a task named `label` of `len` units of work; `len == 0` means
    /// the length is unknown (loading the workload).
    fn start(&self, label: &str, len: u64) -> Box<dyn ProgressTask>;
}

/// One running task; [`inc`](ProgressTask::inc) may be called from several
/// threads at once (the stress replay's lanes).
pub trait ProgressTask: Send + Sync {
    /// `n` more units of work are done.
    fn inc(&self, n: u64);
    /// The task is over (its display, if any, can go).
    fn finish(&self);
}

/// Shows nothing: the default for library callers and tests.
///
/// It is both a [`Progress`] and a [`ProgressTask`], so it can be passed
/// wherever either is taken.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoProgress;

impl Progress for NoProgress {
    fn start(&self, _label: &str, _len: u64) -> Box<dyn ProgressTask> {
        Box::new(NoProgress)
    }
}

impl ProgressTask for NoProgress {
    fn inc(&self, _n: u64) {}
    fn finish(&self) {}
}
