//! The reconciliation status an object carries: what the writer asks for
//! (`Pending`) and what the reconciler found (`Done`, `Error`).

use std::cell::Cell;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A point in time: nanoseconds since the Unix epoch. What [`Status`]
/// records and what a [`crate::Clock`] reads; 8 bytes, so a status stays small.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(pub u64);

impl Timestamp {
    /// The system's wall clock now.
    pub fn now() -> Timestamp {
        let d = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        Timestamp::from_duration(d)
    }

    /// `d` after the epoch, saturating at the largest timestamp.
    pub fn from_duration(d: Duration) -> Timestamp {
        Timestamp(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
    }

    /// This time plus `d`, saturating.
    pub fn plus(self, d: Duration) -> Timestamp {
        Timestamp(
            self.0
                .saturating_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
        )
    }

    /// How long after `earlier` this is (zero if it is not later).
    pub fn since(self, earlier: Timestamp) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

/// Where an object is in its reconciliation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StatusKind {
    /// The object changed and waits to be reconciled (set by writers).
    Pending,
    /// The object was reconciled a while ago and is queued to be
    /// reconciled again (set by the reconciler's refresh).
    Refreshing,
    /// The last reconciliation succeeded.
    Done,
    /// The last reconciliation failed; it is retried.
    Error,
}

/// An object's reconciliation status: its kind, when it was set, a unique
/// id and, for [`StatusKind::Error`], the message. 24 bytes (the kind is
/// kept in the id word's top two bits).
///
/// Writers mark a changed object [`Status::pending`]; the reconciler writes
/// [`StatusKind::Done`] or [`StatusKind::Error`] back.
#[derive(Clone, PartialEq, Eq)]
pub struct Status {
    /// The kind in the top two bits, the id below.
    tagged: u64,
    updated_at: Timestamp,
    error: Option<Arc<String>>,
}

const KIND_SHIFT: u32 = 62;
const ID_MASK: u64 = (1 << KIND_SHIFT) - 1;

/// Ids are unique across the process: each thread reserves a block of them
/// from one counter, so writers on several cores do not share a line.
static NEXT_ID_BLOCK: AtomicU64 = AtomicU64::new(1);
const ID_BLOCK: u64 = 1024;

thread_local! {
    static IDS: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
}

fn next_id() -> u64 {
    IDS.with(|c| {
        let (mut next, mut end) = c.get();
        if next == end {
            next = NEXT_ID_BLOCK.fetch_add(ID_BLOCK, Ordering::Relaxed);
            end = next + ID_BLOCK;
        }
        c.set((next + 1, end));
        next
    })
}

impl Status {
    fn new(kind: StatusKind, at: Timestamp, error: Option<Arc<String>>) -> Status {
        let kind_bits = match kind {
            StatusKind::Pending => 0,
            StatusKind::Refreshing => 1,
            StatusKind::Done => 2,
            StatusKind::Error => 3,
        };
        Status {
            tagged: (kind_bits << KIND_SHIFT) | (next_id() & ID_MASK),
            updated_at: at,
            error,
        }
    }

    /// Pending, set now by the system clock: what a writer stores with a
    /// changed object.
    pub fn pending() -> Status {
        Status::pending_at(Timestamp::now())
    }

    /// Pending, set at `at`.
    pub fn pending_at(at: Timestamp) -> Status {
        Status::new(StatusKind::Pending, at, None)
    }

    /// Refreshing, set at `at`.
    pub fn refreshing_at(at: Timestamp) -> Status {
        Status::new(StatusKind::Refreshing, at, None)
    }

    /// Done, set at `at`.
    pub fn done_at(at: Timestamp) -> Status {
        Status::new(StatusKind::Done, at, None)
    }

    /// Error with `message`, set at `at`.
    pub fn error_at(message: impl Into<String>, at: Timestamp) -> Status {
        Status::new(StatusKind::Error, at, Some(Arc::new(message.into())))
    }

    /// The kind.
    pub fn kind(&self) -> StatusKind {
        match self.tagged >> KIND_SHIFT {
            0 => StatusKind::Pending,
            1 => StatusKind::Refreshing,
            2 => StatusKind::Done,
            _ => StatusKind::Error,
        }
    }

    /// When it was set.
    pub fn updated_at(&self) -> Timestamp {
        self.updated_at
    }

    /// The unique id: two statuses set separately never share one.
    pub fn id(&self) -> u64 {
        self.tagged & ID_MASK
    }

    /// The error message of an [`StatusKind::Error`] status.
    pub fn error(&self) -> Option<&str> {
        self.error.as_deref().map(String::as_str)
    }

    /// Whether the object waits to be reconciled (pending or refreshing).
    pub fn is_pending_or_refreshing(&self) -> bool {
        self.tagged >> KIND_SHIFT <= 1
    }
}

impl Default for Status {
    /// [`Status::pending`].
    fn default() -> Status {
        Status::pending()
    }
}

impl fmt::Debug for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}#{}", self.kind(), self.id())?;
        if let Some(e) = self.error() {
            write!(f, "({e:?})")?;
        }
        Ok(())
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.error() {
            Some(e) => write!(f, "error: {e}"),
            None => write!(f, "{}", format!("{:?}", self.kind()).to_lowercase()),
        }
    }
}

/// The statuses of one object under several reconcilers, by reconciler
/// name, so that each reconciles the same object independently.
///
/// A writer marks the object changed with [`StatusSet::pending`], which
/// makes every reconciler's entry pending (one new id for all).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatusSet {
    /// What a reconciler without an entry sees.
    pending: Status,
    entries: Vec<(Arc<str>, Status)>,
}

impl Default for StatusSet {
    fn default() -> Self {
        StatusSet::new()
    }
}

impl StatusSet {
    /// A set pending for every reconciler.
    pub fn new() -> StatusSet {
        StatusSet {
            pending: Status::pending(),
            entries: Vec::new(),
        }
    }

    /// The same set pending again for every reconciler: what a writer
    /// stores with a changed object.
    pub fn pending(&self) -> StatusSet {
        let pending = Status::pending();
        StatusSet {
            entries: self
                .entries
                .iter()
                .map(|(n, _)| (n.clone(), pending.clone()))
                .collect(),
            pending,
        }
    }

    /// Reconciler `name`'s status (pending if it has none yet).
    pub fn get(&self, name: &str) -> &Status {
        self.entries
            .iter()
            .find(|(n, _)| &**n == name)
            .map_or(&self.pending, |(_, s)| s)
    }

    /// The set with reconciler `name`'s status replaced.
    pub fn set(&self, name: &str, status: Status) -> StatusSet {
        let mut out = self.clone();
        match out.entries.iter_mut().find(|(n, _)| &**n == name) {
            Some((_, s)) => *s = status,
            None => out.entries.push((name.into(), status)),
        }
        out
    }

    /// Each reconciler's name and status.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Status)> {
        self.entries.iter().map(|(n, s)| (&**n, s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_across_threads() {
        let mut ids: Vec<u64> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|_| {
                    s.spawn(|| {
                        (0..3000)
                            .map(|_| Status::pending().id())
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
        });
        let n = ids.len();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), n);
    }

    #[test]
    fn status_is_small() {
        assert_eq!(std::mem::size_of::<Status>(), 24);
    }

    #[test]
    fn kinds_and_messages() {
        let t = Timestamp(5);
        assert!(Status::pending_at(t).is_pending_or_refreshing());
        assert!(Status::refreshing_at(t).is_pending_or_refreshing());
        assert!(!Status::done_at(t).is_pending_or_refreshing());
        let e = Status::error_at("boom", t);
        assert_eq!(
            (e.kind(), e.error(), e.updated_at()),
            (StatusKind::Error, Some("boom"), t)
        );
        assert_eq!(e.to_string(), "error: boom");
        assert_eq!(Status::done_at(t).to_string(), "done");
    }

    #[test]
    fn status_set_per_reconciler() {
        let s = StatusSet::new();
        assert_eq!(s.get("a").kind(), StatusKind::Pending);
        let s = s.set("a", Status::done_at(Timestamp(1)));
        assert_eq!(s.get("a").kind(), StatusKind::Done);
        assert_eq!(s.get("b").kind(), StatusKind::Pending);
        let s = s.set("b", Status::error_at("x", Timestamp(2)));
        let p = s.pending();
        assert_eq!(p.get("a").kind(), StatusKind::Pending);
        assert_eq!(p.get("a").id(), p.get("b").id());
        assert_eq!(p.get("c").id(), p.get("a").id());
        assert_eq!(p.iter().count(), 2);
    }

    #[test]
    fn timestamps_saturate() {
        let t = Timestamp(u64::MAX - 1);
        assert_eq!(t.plus(Duration::from_secs(1)), Timestamp(u64::MAX));
        assert_eq!(Timestamp(1).since(Timestamp(5)), Duration::ZERO);
        assert_eq!(Timestamp::from_duration(Duration::MAX), Timestamp(u64::MAX));
    }
}
