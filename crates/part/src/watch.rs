//! Watches: one-shot "something you read has changed" signals.
//!
//! A [`Watch`] is closed once; it can be polled, waited on blocking (with or
//! without a timeout) or awaited from any async runtime. A [`WatchSet`] waits
//! for the first of many.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, PoisonError, Weak};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use event_listener::{Event, EventListener};
use thin_vec::ThinVec;

use crate::lazy::LazyWatch;
use crate::sync::{AtomicBool, Mutex, Ordering};

/// The shared state behind a live watch.
pub(crate) struct WatchInner {
    closed: AtomicBool,
    event: Event,
    /// Point watches of earlier versions of this leaf, or end-of-node
    /// prefix watches of earlier versions of this inner node, moved aside
    /// by a write that kept their contents (a push-down, a segment split
    /// above the node, a merge into it): they fire with this one. Weak: a
    /// watch nobody holds needs no firing. Set before the node is published.
    earlier: ThinVec<Weak<WatchInner>>,
    /// Watches kept by this watch's node for readers whose question is
    /// narrower than the node (`Gap`): when the node is superseded the
    /// commit fires, moves or hands on each (`Notifier`, design.md).
    gaps: Mutex<Gaps>,
}

/// What a watch kept in a node's list waits for.
pub(crate) struct Gap {
    pub(crate) key: Box<[u8]>,
    pub(crate) kind: GapKind,
}

/// The question behind a [`Gap`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum GapKind {
    /// `key`, missing from the tree, is inserted.
    Missing,
    /// A key under the prefix `key`, none in the tree, is inserted.
    Empty,
    /// The keys under the prefix `key`, all below this node, change: kept
    /// by a leaf (the one key under it) or an inner node whose segment the
    /// prefix ends inside. Keyed by the prefix's length, because a write
    /// that splits the path above this node reaches only the shorter
    /// prefixes (`WatchInner::hand_on`).
    Held,
}

/// A watch's listed watches. (`ThinVec`s here and in `earlier`: one word
/// each while empty, as they nearly always are.)
#[derive(Default)]
struct Gaps {
    /// Closed: later readers get a closed watch.
    done: bool,
    list: ThinVec<(Gap, Arc<WatchInner>)>,
}

/// How many watches hold missing-key watches, process-wide: while none do,
/// a commit need not look for them (`Txn::commit_only`). A hint: a list
/// filled right after the look is closed, not moved, at that commit.
/// (std's atomic under loom too: nothing is read through it.)
static WITH_GAPS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Whether any watch may hold missing-key watches (see [`WITH_GAPS`]).
#[inline]
pub(crate) fn gaps_exist() -> bool {
    // Relaxed: a hint; the gap lists themselves are read under their mutex.
    WITH_GAPS.load(std::sync::atomic::Ordering::Relaxed) != 0
}

impl Gaps {
    fn push(&mut self, gap: Gap, w: Arc<WatchInner>) {
        if self.list.is_empty() {
            // Relaxed: a count, read as a hint.
            WITH_GAPS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        self.list.push((gap, w));
    }

    fn take(&mut self) -> ThinVec<(Gap, Arc<WatchInner>)> {
        if !self.list.is_empty() {
            WITH_GAPS.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        }
        std::mem::take(&mut self.list)
    }
}

impl Drop for Gaps {
    fn drop(&mut self) {
        drop(self.take());
    }
}

/// Where a superseded node's missing-key and empty-prefix watches go
/// (`Notifier`).
pub(crate) type Home<'a> = Option<&'a dyn Fn(Gap, Arc<WatchInner>)>;

impl WatchInner {
    pub(crate) fn new() -> Self {
        WatchInner {
            closed: AtomicBool::new(false),
            event: Event::new(),
            earlier: ThinVec::new(),
            gaps: Mutex::new(Gaps::default()),
        }
    }

    fn gaps(&self) -> impl std::ops::DerefMut<Target = Gaps> + '_ {
        // The lock guards no invariant a panic could break half way.
        self.gaps.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A watch on `gap` (see [`GapKind`]) kept by this watch's node:
    /// closed if the node is.
    pub(crate) fn gap_watch(&self, key: &[u8], kind: GapKind) -> Watch {
        let mut g = self.gaps();
        if g.done {
            return Watch::closed();
        }
        let same = |(gap, _): &&(Gap, Arc<WatchInner>)| gap.kind == kind && *gap.key == *key;
        if let Some((_, w)) = g.list.iter().find(same) {
            return Watch::from_inner(w.clone());
        }
        let w = Arc::new(WatchInner::new());
        let gap = Gap {
            key: key.into(),
            kind,
        };
        g.push(gap, w.clone());
        Watch::from_inner(w)
    }

    /// Takes on the listed watch `w` on `gap`; fires it at once if this
    /// watch's node is already superseded.
    pub(crate) fn adopt_gap(&self, gap: Gap, w: Arc<WatchInner>) {
        let mut g = self.gaps();
        if g.done {
            drop(g);
            w.close();
        } else {
            g.push(gap, w);
        }
    }

    /// A watch for a copy of the node whose watch is `prev`, made by a
    /// write that kept the node's contents: it fires `prev` too (and what
    /// `prev` would fire), but keeps its own list.
    pub(crate) fn successor(prev: &Arc<WatchInner>) -> Self {
        let mut earlier: ThinVec<Weak<WatchInner>> = prev
            .earlier
            .iter()
            .filter(|w| w.strong_count() > 0)
            .cloned()
            .collect();
        earlier.push(Arc::downgrade(prev));
        WatchInner {
            earlier,
            ..WatchInner::new()
        }
    }

    /// Closes the watch and wakes every waiter.
    pub(crate) fn close(&self) {
        self.close_with(None);
    }

    /// [`close`], handing this watch's missing-key and empty-prefix
    /// watches to `home` instead of firing them.
    ///
    /// [`close`]: WatchInner::close
    pub(crate) fn close_with(&self, home: Home<'_>) {
        self.close_list(home, |_, w| w.close());
        // SeqCst pairs with the SeqCst load after `listen()` in `poll_closed`:
        // either the waiter sees the flag or its listener is registered before
        // `notify` runs.
        if !self.closed.swap(true, Ordering::SeqCst) {
            self.event.notify(usize::MAX);
            for w in &self.earlier {
                if let Some(w) = w.upgrade() {
                    w.close_with(home);
                }
            }
        }
    }

    /// For a node a write copied keeping its contents: closes the list,
    /// handing missing-key and empty-prefix watches to `home` (the path to
    /// their key changed), firing the held prefixes no longer than `cut`
    /// (the write's key shares `cut` bytes with the node's path, so it is
    /// under them) and handing the longer ones to the copy's watch `to`
    /// (installed if need be; fired when the copy is already superseded).
    /// The watch itself stays open (the copy's chains it) unless the
    /// caller closes it.
    pub(crate) fn hand_on(&self, cut: usize, to: &LazyWatch, home: Home<'_>) {
        let mut copy = None;
        self.close_list(home, |gap, w| {
            if gap.key.len() <= cut {
                return w.close();
            }
            match copy.get_or_insert_with(|| to.inner()) {
                Some(to) => to.adopt_gap(gap, w),
                None => w.close(),
            }
        });
    }

    /// Marks the list closed and empties it: missing-key and empty-prefix
    /// watches go to `home` (or fire), held prefixes to `held`.
    fn close_list(&self, home: Home<'_>, mut held: impl FnMut(Gap, Arc<WatchInner>)) {
        let gaps = {
            let mut g = self.gaps();
            g.done = true;
            g.take()
        };
        for (gap, w) in gaps {
            match (gap.kind, home) {
                (GapKind::Held, _) => held(gap, w),
                (_, Some(h)) => h(gap, w),
                (_, None) => w.close(),
            }
        }
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }
}

/// A one-shot change notification.
///
/// Cloning is cheap; every clone fires together.
#[derive(Clone)]
pub struct Watch {
    /// `None`: closed from the start (no allocation).
    inner: Option<Arc<WatchInner>>,
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch")
            .field("closed", &self.is_closed())
            .finish()
    }
}

impl Watch {
    pub(crate) fn closed() -> Self {
        Watch { inner: None }
    }

    pub(crate) fn from_inner(inner: Arc<WatchInner>) -> Self {
        Watch { inner: Some(inner) }
    }

    /// Whether the watch has fired.
    pub fn is_closed(&self) -> bool {
        self.inner.as_ref().is_none_or(|i| i.is_closed())
    }

    /// Blocks the thread until the watch fires.
    pub fn wait(&self) {
        block_on(self.changed(), None);
    }

    /// Blocks until the watch fires or `timeout` passes; true if it fired.
    pub fn wait_timeout(&self, timeout: Duration) -> bool {
        block_on(self.changed(), Some(Instant::now() + timeout)).is_some()
    }

    /// A future that completes when the watch fires; works on any runtime.
    pub fn changed(&self) -> Changed {
        Changed {
            inner: self.inner.clone(),
            listener: None,
        }
    }
}

impl std::future::IntoFuture for Watch {
    type Output = ();
    type IntoFuture = Changed;
    fn into_future(self) -> Changed {
        Changed {
            inner: self.inner,
            listener: None,
        }
    }
}

/// Future returned by [`Watch::changed`].
pub struct Changed {
    inner: Option<Arc<WatchInner>>,
    listener: Option<EventListener>,
}

impl std::fmt::Debug for Changed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Changed").finish_non_exhaustive()
    }
}

impl Future for Changed {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        let Some(inner) = &this.inner else {
            return Poll::Ready(());
        };
        loop {
            if inner.is_closed() {
                return Poll::Ready(());
            }
            match &mut this.listener {
                None => this.listener = Some(inner.event.listen()),
                Some(l) => match Pin::new(l).poll(cx) {
                    Poll::Ready(()) => this.listener = None,
                    Poll::Pending => return Poll::Pending,
                },
            }
        }
    }
}

/// Waits for the first of several watches.
///
/// ```
/// use std::time::Duration;
/// use part::{Tree, WatchSet};
///
/// let tree: Tree<u32> = Tree::new();
/// let (_, on_a) = tree.get_watch(b"a");
/// let (_, on_b) = tree.get_watch(b"b");
/// let mut set = WatchSet::new();
/// set.add(on_a);
/// let b = set.add(on_b);
/// assert_eq!(set.wait_timeout(Duration::from_millis(1)), None); // nothing changed
///
/// let mut txn = tree.txn();
/// txn.insert(b"b", 1).unwrap();
/// let _tree = txn.commit();
/// assert_eq!(set.wait(), Some(b));
/// assert_eq!(set.closed(), [b]);
/// ```
#[derive(Default, Debug)]
pub struct WatchSet {
    watches: Vec<Watch>,
}

impl WatchSet {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a watch; returns its index in the set.
    pub fn add(&mut self, w: Watch) -> usize {
        self.watches.push(w);
        self.watches.len() - 1
    }

    /// Number of watches in the set.
    pub fn len(&self) -> usize {
        self.watches.len()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.watches.is_empty()
    }

    /// Removes every watch.
    pub fn clear(&mut self) {
        self.watches.clear();
    }

    /// Indices of the watches that have fired.
    pub fn closed(&self) -> Vec<usize> {
        (0..self.watches.len())
            .filter(|&i| self.watches[i].is_closed())
            .collect()
    }

    /// A future yielding the index of the first watch to fire; pending
    /// forever on an empty set.
    pub fn first(&self) -> First {
        First {
            futs: self.watches.iter().map(Watch::changed).collect(),
        }
    }

    /// Blocks until one watch fires or the timeout passes; returns its index.
    pub fn wait_timeout(&self, timeout: Duration) -> Option<usize> {
        block_on(self.first(), Some(Instant::now() + timeout))
    }

    /// Blocks until one watch fires; returns its index (`None` on an empty set).
    pub fn wait(&self) -> Option<usize> {
        if self.is_empty() {
            return None;
        }
        block_on(self.first(), None)
    }
}

/// Future returned by [`WatchSet::first`].
#[derive(Debug)]
pub struct First {
    futs: Vec<Changed>,
}

impl Future for First {
    type Output = usize;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<usize> {
        let this = self.get_mut();
        for (i, f) in this.futs.iter_mut().enumerate() {
            if Pin::new(f).poll(cx).is_ready() {
                return Poll::Ready(i);
            }
        }
        Poll::Pending
    }
}

struct ThreadWaker(std::thread::Thread);

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// Runs a future to completion on this thread, parking between polls.
fn block_on<F: Future>(fut: F, deadline: Option<Instant>) -> Option<F::Output> {
    let mut fut = std::pin::pin!(fut);
    let waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return Some(v);
        }
        match deadline {
            None => std::thread::park(),
            Some(d) => {
                let now = Instant::now();
                if now >= d {
                    return None;
                }
                std::thread::park_timeout(d - now);
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn live() -> (Arc<WatchInner>, Watch) {
        let i = Arc::new(WatchInner::new());
        (i.clone(), Watch::from_inner(i))
    }

    #[test]
    fn a_live_watch_stays_small() {
        assert!(
            std::mem::size_of::<WatchInner>() <= 56,
            "{}",
            std::mem::size_of::<WatchInner>()
        );
    }

    #[test]
    fn closed_watch_is_ready() {
        let w = Watch::closed();
        assert!(w.is_closed());
        assert!(w.wait_timeout(Duration::from_millis(1)));
    }

    #[test]
    fn timeout_without_close() {
        let (_i, w) = live();
        assert!(!w.wait_timeout(Duration::from_millis(20)));
    }

    #[test]
    fn wakes_blocked_thread() {
        let (i, w) = live();
        let t = std::thread::spawn(move || w.wait_timeout(Duration::from_secs(10)));
        std::thread::sleep(Duration::from_millis(20));
        i.close();
        assert!(t.join().unwrap());
    }

    #[test]
    fn set_returns_first_fired() {
        let (_a, wa) = live();
        let (b, wb) = live();
        let mut set = WatchSet::new();
        set.add(wa);
        set.add(wb);
        assert_eq!(set.wait_timeout(Duration::from_millis(5)), None);
        let t = std::thread::spawn(move || set.wait_timeout(Duration::from_secs(10)));
        std::thread::sleep(Duration::from_millis(20));
        b.close();
        assert_eq!(t.join().unwrap(), Some(1));
    }

    #[test]
    fn awaitable() {
        let (i, w) = live();
        let t = std::thread::spawn(move || block_on(w.into_future(), None));
        std::thread::sleep(Duration::from_millis(10));
        i.close();
        assert_eq!(t.join().unwrap(), Some(()));
    }
    use std::future::IntoFuture;
}
