//! Time as the reconciler sees it: a [`Clock`] reads the time and sleeps
//! until a deadline. [`SystemClock`] is real time; [`ManualClock`] moves
//! only when told, so tests of retries, pruning and refresh never sleep.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crate::status::Timestamp;

/// A future that completes at a deadline.
pub type Sleep = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// The reconciler's source of time.
pub trait Clock: Send + Sync + 'static {
    /// The time now.
    fn now(&self) -> Timestamp;

    /// A future that completes once [`Clock::now`] reaches `deadline`
    /// (at once if it has). Works on any executor.
    fn sleep_until(&self, deadline: Timestamp) -> Sleep;
}

/// Sleeping futures by deadline, woken by whoever moves time on.
#[derive(Default)]
struct Sleepers {
    next_seq: u64,
    wakers: BTreeMap<(Timestamp, u64), Waker>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing in this module panics while holding a lock; a poisoned lock
    // still holds consistent state.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What a [`SleepFuture`] asks of its clock.
trait TimeSource: Send + Sync + 'static {
    fn now(&self) -> Timestamp;
    fn sleepers(&self) -> &Mutex<Sleepers>;
    /// Called after a sleeper was registered with this deadline.
    fn registered(&self, _deadline: Timestamp) {}
}

struct SleepFuture<S: TimeSource> {
    source: Arc<S>,
    deadline: Timestamp,
    key: Option<(Timestamp, u64)>,
}

impl<S: TimeSource> Future for SleepFuture<S> {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        if this.source.now() >= this.deadline {
            if let Some(k) = this.key.take() {
                lock(this.source.sleepers()).wakers.remove(&k);
            }
            return Poll::Ready(());
        }
        {
            let mut s = lock(this.source.sleepers());
            let key = match this.key {
                Some(k) => k,
                None => {
                    s.next_seq += 1;
                    let k = (this.deadline, s.next_seq);
                    this.key = Some(k);
                    k
                }
            };
            s.wakers.insert(key, cx.waker().clone());
        }
        this.source.registered(this.deadline);
        // Time may have passed the deadline while registering.
        if this.source.now() >= this.deadline {
            if let Some(k) = this.key.take() {
                lock(this.source.sleepers()).wakers.remove(&k);
            }
            return Poll::Ready(());
        }
        Poll::Pending
    }
}

impl<S: TimeSource> Drop for SleepFuture<S> {
    fn drop(&mut self) {
        if let Some(k) = self.key.take() {
            lock(self.source.sleepers()).wakers.remove(&k);
        }
    }
}

/// Removes and returns the wakers due at `now`.
fn due(s: &mut Sleepers, now: Timestamp) -> Vec<Waker> {
    let later = s.wakers.split_off(&(Timestamp(now.0.saturating_add(1)), 0));
    std::mem::replace(&mut s.wakers, later)
        .into_values()
        .collect()
}

// ---- the system clock -------------------------------------------------

/// Real time: the wall clock read once at creation, advanced by a
/// monotonic clock (so it never goes back). Sleeps are served by one
/// timer thread shared by every system clock of the process.
#[derive(Clone)]
pub struct SystemClock {
    inner: Arc<SystemInner>,
}

struct SystemInner {
    base: Instant,
    base_wall: Timestamp,
}

impl Default for SystemClock {
    fn default() -> Self {
        SystemClock::new()
    }
}

impl std::fmt::Debug for SystemClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SystemClock")
            .field("now", &self.now())
            .finish()
    }
}

impl SystemClock {
    /// A clock reading the system time now.
    pub fn new() -> SystemClock {
        SystemClock {
            inner: Arc::new(SystemInner {
                base: Instant::now(),
                base_wall: Timestamp::now(),
            }),
        }
    }
}

/// The process's timer thread: wakes the sleepers of system clocks.
struct Timer {
    base: Instant,
    sleepers: Mutex<Sleepers>,
    cond: Condvar,
}

impl TimeSource for Timer {
    fn now(&self) -> Timestamp {
        Timestamp::from_duration(self.base.elapsed())
    }
    fn sleepers(&self) -> &Mutex<Sleepers> {
        &self.sleepers
    }
    fn registered(&self, _deadline: Timestamp) {
        self.cond.notify_one();
    }
}

fn timer() -> &'static Arc<Timer> {
    static TIMER: OnceLock<Arc<Timer>> = OnceLock::new();
    TIMER.get_or_init(|| {
        let t = Arc::new(Timer {
            base: Instant::now(),
            sleepers: Mutex::default(),
            cond: Condvar::new(),
        });
        let t2 = t.clone();
        let spawned = std::thread::Builder::new()
            .name("reconciler-timer".into())
            .spawn(move || timer_loop(&t2));
        if let Err(e) = spawned {
            tracing::error!(error = %e, "reconciler: cannot start the timer thread");
        }
        t
    })
}

fn timer_loop(t: &Timer) {
    let mut s = lock(&t.sleepers);
    loop {
        let now = t.now();
        let woken = due(&mut s, now);
        if !woken.is_empty() {
            drop(s);
            woken.into_iter().for_each(Waker::wake);
            s = lock(&t.sleepers);
            continue;
        }
        let wait = s
            .wakers
            .keys()
            .next()
            .map(|(d, _)| d.since(now))
            .unwrap_or(Duration::from_secs(3600));
        s = t
            .cond
            .wait_timeout(s, wait)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        self.inner.base_wall.plus(self.inner.base.elapsed())
    }

    fn sleep_until(&self, deadline: Timestamp) -> Sleep {
        // On the timer's own monotonic scale.
        let t = timer();
        let left = deadline.since(self.now());
        Box::pin(SleepFuture {
            source: t.clone(),
            deadline: t.now().plus(left),
            key: None,
        })
    }
}

// ---- the manual clock -------------------------------------------------

/// A clock that moves only through [`ManualClock::advance`] or
/// [`ManualClock::set`], waking the sleepers it passes. For tests.
#[derive(Clone, Default)]
pub struct ManualClock {
    inner: Arc<ManualInner>,
}

#[derive(Default)]
struct ManualInner {
    now: Mutex<Timestamp>,
    sleepers: Mutex<Sleepers>,
}

impl TimeSource for ManualInner {
    fn now(&self) -> Timestamp {
        *lock(&self.now)
    }
    fn sleepers(&self) -> &Mutex<Sleepers> {
        &self.sleepers
    }
}

impl std::fmt::Debug for ManualClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManualClock")
            .field("now", &self.now())
            .finish()
    }
}

impl ManualClock {
    /// A clock at `start`.
    pub fn new(start: Timestamp) -> ManualClock {
        let c = ManualClock::default();
        *lock(&c.inner.now) = start;
        c
    }

    /// Moves the time on by `d` and wakes the sleepers due.
    pub fn advance(&self, d: Duration) {
        let to = self.now().plus(d);
        self.set(to);
    }

    /// Sets the time (never backwards) and wakes the sleepers due.
    pub fn set(&self, to: Timestamp) {
        let now = {
            let mut n = lock(&self.inner.now);
            *n = (*n).max(to);
            *n
        };
        let woken = due(&mut lock(&self.inner.sleepers), now);
        woken.into_iter().for_each(Waker::wake);
    }

    /// How many futures are sleeping on this clock.
    pub fn sleepers(&self) -> usize {
        lock(&self.inner.sleepers).wakers.len()
    }

    /// The earliest deadline anyone sleeps until.
    pub fn next_deadline(&self) -> Option<Timestamp> {
        lock(&self.inner.sleepers)
            .wakers
            .keys()
            .next()
            .map(|(d, _)| *d)
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        self.inner.now()
    }

    fn sleep_until(&self, deadline: Timestamp) -> Sleep {
        Box::pin(SleepFuture {
            source: self.inner.clone(),
            deadline,
            key: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::executor::block_on;

    #[test]
    fn manual_clock_wakes_sleepers_it_passes() {
        let c = ManualClock::new(Timestamp(100));
        let c2 = c.clone();
        let h = std::thread::spawn(move || block_on(c2.sleep_until(Timestamp(150))));
        while c.sleepers() == 0 {
            std::thread::yield_now();
        }
        assert_eq!(c.next_deadline(), Some(Timestamp(150)));
        c.advance(Duration::from_nanos(10));
        assert_eq!(c.sleepers(), 1);
        c.advance(Duration::from_nanos(40));
        h.join().unwrap();
        assert_eq!(c.sleepers(), 0);
        // A deadline already passed completes at once.
        block_on(c.sleep_until(Timestamp(10)));
    }

    #[test]
    fn dropped_sleep_unregisters() {
        let c = ManualClock::new(Timestamp(0));
        let mut s = c.sleep_until(Timestamp(5));
        let w = Waker::noop();
        assert!(s.as_mut().poll(&mut Context::from_waker(w)).is_pending());
        assert_eq!(c.sleepers(), 1);
        drop(s);
        assert_eq!(c.sleepers(), 0);
    }

    #[test]
    fn system_clock_sleeps() {
        let c = SystemClock::new();
        let t0 = c.now();
        block_on(c.sleep_until(t0.plus(Duration::from_millis(2))));
        assert!(c.now() >= t0.plus(Duration::from_millis(2)));
        assert!(c.now().since(Timestamp::now()) < Duration::from_secs(1));
    }
}
