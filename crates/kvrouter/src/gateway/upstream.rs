//! Per-engine state for the gateway: the health check's verdict and a
//! circuit breaker. An engine is identified by its HTTP base URL (ranks
//! behind one server share it). Routing skips an engine that failed its
//! last health check or whose breaker is open.
//!
//! The breaker: `--breaker-failures` consecutive failures (connect errors,
//! 5xx, timeouts, broken streams) open it for `--breaker-cooldown`; then
//! it lets one trial request through (half-open); the trial's success
//! closes it, its failure opens it again for another cooldown.
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Breaker state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Requests flow; this many consecutive failures so far.
    Closed(u32),
    /// No requests until the instant; then one trial.
    Open(Instant),
    /// A trial request is in flight.
    Trial,
}

/// What a request may do with an engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pass {
    /// An ordinary request.
    Normal,
    /// The one trial request of a half-open breaker.
    Trial,
}

/// One engine.
#[derive(Debug)]
pub struct Upstream {
    /// The engine's base URL.
    pub url: String,
    healthy: AtomicBool,
    state: Mutex<State>,
    failures: u32,
    cooldown: Duration,
}

impl Upstream {
    /// A healthy engine with a closed breaker.
    pub fn new(url: String, failures: u32, cooldown: Duration) -> Self {
        Self {
            url,
            healthy: AtomicBool::new(true),
            state: Mutex::new(State::Closed(0)),
            failures: failures.max(1),
            cooldown,
        }
    }

    /// The last health check's verdict (true before the first).
    pub fn healthy(&self) -> bool {
        self.healthy.load(Relaxed)
    }

    /// Records a health check's verdict; returns whether it changed.
    pub fn set_healthy(&self, ok: bool) -> bool {
        self.healthy.swap(ok, Relaxed) != ok
    }

    /// Whether routing may choose this engine now: healthy, and its
    /// breaker closed or ready for a trial.
    pub fn available(&self) -> bool {
        self.healthy()
            && match *self.state.lock() {
                State::Closed(_) => true,
                State::Open(until) => Instant::now() >= until,
                State::Trial => false,
            }
    }

    /// Whether the breaker is open (a trial in flight counts as open).
    pub fn open(&self) -> bool {
        !matches!(*self.state.lock(), State::Closed(_))
    }

    /// Admits a request the router chose for this engine: `None` if the
    /// breaker is open (or its one trial is taken already).
    pub fn admit(&self) -> Option<Pass> {
        let mut s = self.state.lock();
        match *s {
            State::Closed(_) => Some(Pass::Normal),
            State::Open(until) if Instant::now() >= until => {
                *s = State::Trial;
                Some(Pass::Trial)
            }
            State::Open(_) | State::Trial => None,
        }
    }

    /// The engine answered well: closes the breaker.
    pub fn success(&self) {
        *self.state.lock() = State::Closed(0);
        self.gauge();
    }

    /// The engine failed a request admitted with `pass`; returns whether
    /// this opened the breaker.
    pub fn failure(&self, pass: Pass) -> bool {
        let mut s = self.state.lock();
        let opened = match (*s, pass) {
            (State::Trial, Pass::Trial) => true,
            (State::Closed(n), _) if n + 1 >= self.failures => true,
            (State::Closed(n), _) => {
                *s = State::Closed(n + 1);
                false
            }
            // Already open: an older request failing changes nothing.
            _ => false,
        };
        if opened {
            *s = State::Open(Instant::now() + self.cooldown);
        }
        drop(s);
        if opened {
            tracing::warn!(url = %self.url, cooldown = ?self.cooldown, "circuit breaker open");
            self.gauge();
        }
        opened
    }

    /// A request admitted with `pass` ended with no verdict on the engine
    /// (the client went away): a trial's slot is given back.
    pub fn abandon(&self, pass: Pass) {
        let mut s = self.state.lock();
        if pass == Pass::Trial && *s == State::Trial {
            *s = State::Open(Instant::now());
        }
    }

    /// Sets `kvrouter_gateway_breaker_open{worker}`.
    pub fn gauge(&self) {
        metrics::gauge!("kvrouter_gateway_breaker_open", "worker" => self.url.clone())
            .set(if self.open() { 1.0 } else { 0.0 });
        metrics::gauge!("kvrouter_gateway_engine_healthy", "worker" => self.url.clone())
            .set(if self.healthy() { 1.0 } else { 0.0 });
    }
}

/// Every engine the gateway knows, by URL.
#[derive(Debug)]
pub struct Upstreams {
    map: Mutex<HashMap<String, Arc<Upstream>>>,
    failures: u32,
    cooldown: Duration,
}

impl Upstreams {
    /// None yet; breakers open after `failures` for `cooldown`.
    pub fn new(failures: u32, cooldown: Duration) -> Self {
        Self {
            map: Mutex::new(HashMap::new()),
            failures,
            cooldown,
        }
    }

    /// The engine at `url`, created on first use.
    pub fn get(&self, url: &str) -> Arc<Upstream> {
        let mut m = self.map.lock();
        if let Some(u) = m.get(url) {
            return Arc::clone(u);
        }
        let u = Arc::new(Upstream::new(url.to_string(), self.failures, self.cooldown));
        m.insert(url.to_string(), Arc::clone(&u));
        u
    }

    /// The engine at `url`, if known.
    pub fn find(&self, url: &str) -> Option<Arc<Upstream>> {
        self.map.lock().get(url).cloned()
    }

    /// Keeps only the engines at `urls` (workers that left take theirs
    /// along); returns those, created where new.
    pub fn retain(&self, urls: &[String]) -> Vec<Arc<Upstream>> {
        let mut m = self.map.lock();
        m.retain(|k, _| urls.contains(k));
        urls.iter()
            .map(|u| {
                Arc::clone(m.entry(u.clone()).or_insert_with(|| {
                    Arc::new(Upstream::new(u.clone(), self.failures, self.cooldown))
                }))
            })
            .collect()
    }

    /// Every engine known.
    pub fn all(&self) -> Vec<Arc<Upstream>> {
        self.map.lock().values().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn breaker_opens_half_opens_and_closes() {
        let u = Upstream::new("http://e".into(), 3, Duration::from_millis(50));
        assert_eq!(u.admit(), Some(Pass::Normal));
        assert!(!u.failure(Pass::Normal));
        assert!(!u.failure(Pass::Normal));
        // A success in between starts the count again.
        u.success();
        assert!(!u.failure(Pass::Normal));
        assert!(!u.failure(Pass::Normal));
        assert!(u.failure(Pass::Normal));
        assert!(u.open() && !u.available());
        assert_eq!(u.admit(), None);
        std::thread::sleep(Duration::from_millis(60));
        assert!(u.available());
        // One trial only.
        assert_eq!(u.admit(), Some(Pass::Trial));
        assert_eq!(u.admit(), None);
        assert!(!u.available());
        // The trial fails: open for another cooldown.
        assert!(u.failure(Pass::Trial));
        assert_eq!(u.admit(), None);
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(u.admit(), Some(Pass::Trial));
        // An abandoned trial gives its slot back.
        u.abandon(Pass::Trial);
        assert_eq!(u.admit(), Some(Pass::Trial));
        u.success();
        assert!(!u.open());
        assert_eq!(u.admit(), Some(Pass::Normal));
        // Health takes the engine out of routing whatever the breaker says.
        assert!(u.set_healthy(false));
        assert!(!u.available());
        assert!(!u.set_healthy(false));
    }
}
