//! The handle of a running reconciler: start it (on a thread or as a tokio
//! task), ask for a prune, read its health, wait for a revision to be
//! reconciled, stop it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use event_listener::{Event, Listener};
use statedb::{Db, Revision, Storable};

use crate::clock::{Clock, SystemClock};
use crate::config::{Config, ConfigError};
use crate::health::Health;
use crate::operations::{AsyncOperations, Blocking, Operations};
use crate::round::Worker;
use crate::target::{ObjectKey, Target};

/// Why a reconciler could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// A configuration field is out of range.
    #[error("invalid configuration: {0}")]
    Config(#[from] ConfigError),
    /// The table refused the change stream (a table of another database).
    #[error("registering the change stream: {0}")]
    Db(#[from] statedb::Error),
    /// The reconciler's thread could not be started.
    #[error("starting the reconciler's thread: {0}")]
    Thread(#[from] std::io::Error),
    /// [`Reconciler::spawn`] was called outside a tokio runtime.
    #[error("no tokio runtime to spawn the reconciler on")]
    NoRuntime,
}

/// Why [`Reconciler::wait_until_reconciled`] returned without success.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WaitError {
    /// The reconciler had not yet processed the revision when time ran
    /// out.
    #[error("revision not reached: reconciled up to {processed}")]
    Timeout {
        /// The revision up to which changes were processed.
        processed: Revision,
    },
    /// Every change up to the revision was processed, but some objects
    /// still fail (they are being retried).
    #[error("{} object(s) still failing: {}", .errors.len(), .errors.join("; "))]
    Failing {
        /// The first failures, "key: message".
        errors: Vec<String>,
    },
    /// The reconciler stopped.
    #[error("the reconciler stopped")]
    Stopped,
}

/// What the loop publishes after each round.
#[derive(Debug)]
pub(crate) struct Progress {
    /// Changes up to here were processed and their statuses committed.
    pub(crate) processed: Revision,
    /// The lowest revision whose change still fails.
    pub(crate) lowest_failing: Option<Revision>,
    pub(crate) health: Health,
    /// Rounds that reconciled at least one object.
    pub(crate) rounds: u64,
    /// Prunes run (successful or not).
    pub(crate) prunes: u64,
    pub(crate) stopped: bool,
}

/// State shared by the handle and the loop.
pub(crate) struct Shared {
    pub(crate) name: String,
    progress: Mutex<Progress>,
    /// Fires on every publication of `progress`.
    pub(crate) progressed: Event,
    /// Wakes the loop: prune requested or stop.
    pub(crate) wake: Event,
    pub(crate) prune_requested: AtomicBool,
    pub(crate) stop: AtomicBool,
}

impl Shared {
    fn new(name: String) -> Shared {
        Shared {
            name,
            progress: Mutex::new(Progress {
                processed: 0,
                lowest_failing: None,
                health: Health::Starting,
                rounds: 0,
                prunes: 0,
                stopped: false,
            }),
            progressed: Event::new(),
            wake: Event::new(),
            prune_requested: AtomicBool::new(false),
            stop: AtomicBool::new(false),
        }
    }

    pub(crate) fn progress(&self) -> MutexGuard<'_, Progress> {
        self.progress.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Publishes what `f` changes and wakes the waiters.
    pub(crate) fn publish(&self, f: impl FnOnce(&mut Progress)) {
        f(&mut self.progress());
        self.progressed.notify(usize::MAX);
    }

    /// `Ok` when done, `Err(None)` to keep waiting, `Err(Some(e))` when
    /// waiting cannot succeed.
    fn check(&self, rev: Revision) -> Result<Revision, Option<WaitError>> {
        let p = self.progress();
        if p.processed >= rev && p.lowest_failing.is_none_or(|l| l > rev) {
            return Ok(p.processed);
        }
        if p.stopped {
            return Err(Some(WaitError::Stopped));
        }
        Err(None)
    }

    fn timed_out(&self, rev: Revision) -> WaitError {
        let p = self.progress();
        if p.processed < rev {
            return WaitError::Timeout {
                processed: p.processed,
            };
        }
        let errors = match &p.health {
            Health::Degraded { errors, .. } => errors.clone(),
            _ => Vec::new(),
        };
        WaitError::Failing { errors }
    }
}

enum Driver {
    Thread(std::thread::JoinHandle<()>),
    Task(tokio::task::JoinHandle<()>),
}

/// A running reconciler: keeps the external system in step with a table.
///
/// It follows the table's change stream and, in rounds of at most
/// [`Config::round_size`] objects, runs the [`Operations`] on every deleted
/// object and every object whose [`crate::Status`] is pending (or
/// refreshing), then writes `Done` or `Error` back in one write
/// transaction. Failures are retried with backoff; once the table is
/// initialized, what is outside but not desired is pruned.
///
/// Dropping the handle stops the loop (without waiting for it).
///
/// ```
/// use std::time::Duration;
/// use reconciler::{Config, OpError, Operations, Reconciler, Status, StatusKind, Target};
/// use statedb::{Db, Index, Objects, ReadTxn, Revision, Table};
///
/// #[derive(Clone)]
/// struct Route { id: u32, status: Status }
///
/// struct Print;
/// impl Operations<Route> for Print {
///     fn update(&mut self, _: &ReadTxn, _: Revision, r: &Route) -> Result<(), OpError> {
///         println!("install route {}", r.id);
///         Ok(())
///     }
///     fn delete(&mut self, _: &ReadTxn, _: Revision, r: &Route) -> Result<(), OpError> {
///         println!("remove route {}", r.id);
///         Ok(())
///     }
///     fn prune(&mut self, _: &ReadTxn, _: Objects<'_, Route>) -> Result<(), OpError> {
///         Ok(())
///     }
/// }
///
/// let db = Db::new();
/// let id = Index::unique("id", |r: &Route| r.id);
/// let routes: Table<Route> = db.create_table("routes", &id, &[]).unwrap();
/// let target = Target::new(&routes, &id, |r| r.id, |r| &r.status,
///     |r, status| Route { status, ..r.clone() });
/// let rec = Reconciler::start(&db, target, Print, Config::default()).unwrap();
///
/// let mut w = db.write_txn(&[&routes]).unwrap();
/// routes.insert(&mut w, Route { id: 1, status: Status::pending() }).unwrap();
/// let rev = routes.revision(&w.commit().unwrap()).unwrap();
///
/// rec.wait_until_reconciled(rev, Duration::from_secs(10)).unwrap();
/// let r = db.read_txn();
/// assert_eq!(routes.get(&r, &id, &1).unwrap().unwrap().status.kind(), StatusKind::Done);
/// ```
pub struct Reconciler {
    shared: Arc<Shared>,
    driver: Mutex<Option<Driver>>,
}

impl std::fmt::Debug for Reconciler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reconciler")
            .field("name", &self.shared.name)
            .field("health", &self.health())
            .finish()
    }
}

impl Reconciler {
    /// Starts a reconciler with blocking operations on a thread of its
    /// own, on the system clock.
    pub fn start<T, K, O>(
        db: &Db,
        target: Target<T, K>,
        ops: O,
        config: Config,
    ) -> Result<Reconciler, StartError>
    where
        T: Storable + Clone,
        K: ObjectKey,
        O: Operations<T>,
    {
        Self::start_with_clock(db, target, ops, config, SystemClock::new())
    }

    /// [`Reconciler::start`] on the given clock.
    pub fn start_with_clock<T, K, O>(
        db: &Db,
        target: Target<T, K>,
        ops: O,
        config: Config,
        clock: impl Clock,
    ) -> Result<Reconciler, StartError>
    where
        T: Storable + Clone,
        K: ObjectKey,
        O: Operations<T>,
    {
        let (shared, worker) = prepare(db, target, Blocking(ops), config, clock)?;
        let handle = std::thread::Builder::new()
            .name(format!("reconciler-{}", shared.name))
            .spawn(move || crate::executor::block_on(worker.run()))?;
        Ok(Reconciler {
            shared,
            driver: Mutex::new(Some(Driver::Thread(handle))),
        })
    }

    /// Starts a reconciler with async operations as a task of the current
    /// tokio runtime, on the system clock.
    pub fn spawn<T, K, O>(
        db: &Db,
        target: Target<T, K>,
        ops: O,
        config: Config,
    ) -> Result<Reconciler, StartError>
    where
        T: Storable + Clone,
        K: ObjectKey,
        O: AsyncOperations<T>,
    {
        Self::spawn_with_clock(db, target, ops, config, SystemClock::new())
    }

    /// [`Reconciler::spawn`] on the given clock.
    pub fn spawn_with_clock<T, K, O>(
        db: &Db,
        target: Target<T, K>,
        ops: O,
        config: Config,
        clock: impl Clock,
    ) -> Result<Reconciler, StartError>
    where
        T: Storable + Clone,
        K: ObjectKey,
        O: AsyncOperations<T>,
    {
        let rt = tokio::runtime::Handle::try_current().map_err(|_| StartError::NoRuntime)?;
        let (shared, worker) = prepare(db, target, ops, config, clock)?;
        let task = rt.spawn(worker.run());
        Ok(Reconciler {
            shared,
            driver: Mutex::new(Some(Driver::Task(task))),
        })
    }

    /// The configured name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// Asks for a prune in the next round (once the table is initialized).
    pub fn trigger_prune(&self) {
        self.shared.prune_requested.store(true, Ordering::SeqCst);
        self.shared.wake.notify(usize::MAX);
    }

    /// The health as of the last round.
    pub fn health(&self) -> Health {
        self.shared.progress().health.clone()
    }

    /// The revision up to which changes were processed.
    pub fn processed(&self) -> Revision {
        self.shared.progress().processed
    }

    /// Rounds that reconciled at least one object, and prunes run.
    pub fn counts(&self) -> (u64, u64) {
        let p = self.shared.progress();
        (p.rounds, p.prunes)
    }

    /// Blocks until every change up to `revision` is reconciled (its
    /// object done, or its delete done) and returns the revision processed;
    /// or, after `timeout`, says what stands in the way. Blocks the thread:
    /// in async code use [`Reconciler::wait_until_reconciled_async`].
    pub fn wait_until_reconciled(
        &self,
        revision: Revision,
        timeout: Duration,
    ) -> Result<Revision, WaitError> {
        // A timeout past what `Instant` can hold waits without one.
        let deadline = Instant::now().checked_add(timeout);
        loop {
            let l = self.shared.progressed.listen();
            match self.shared.check(revision) {
                Ok(r) => return Ok(r),
                Err(Some(e)) => return Err(e),
                Err(None) => {}
            }
            let Some(deadline) = deadline else {
                l.wait();
                continue;
            };
            if l.wait_deadline(deadline).is_none() && Instant::now() >= deadline {
                return match self.shared.check(revision) {
                    Ok(r) => Ok(r),
                    Err(Some(e)) => Err(e),
                    Err(None) => Err(self.shared.timed_out(revision)),
                };
            }
        }
    }

    /// [`Reconciler::wait_until_reconciled`] as a future, on any executor.
    /// Without a timeout it waits until done or stopped; drop it to cancel.
    pub async fn wait_until_reconciled_async(
        &self,
        revision: Revision,
        timeout: Option<Duration>,
    ) -> Result<Revision, WaitError> {
        let clock = SystemClock::new();
        let mut sleep = match timeout {
            Some(t) => clock.sleep_until(clock.now().plus(t)),
            None => Box::pin(std::future::pending()),
        };
        loop {
            let mut l = std::pin::pin!(self.shared.progressed.listen());
            match self.shared.check(revision) {
                Ok(r) => return Ok(r),
                Err(Some(e)) => return Err(e),
                Err(None) => {}
            }
            let which = crate::executor::first_of(&mut [l.as_mut(), sleep.as_mut()]).await;
            if which == 1 {
                return match self.shared.check(revision) {
                    Ok(r) => Ok(r),
                    Err(Some(e)) => Err(e),
                    Err(None) => Err(self.shared.timed_out(revision)),
                };
            }
        }
    }

    /// Stops the loop after its current round, and waits for a loop
    /// running on its own thread to end (a tokio task is only told; so is
    /// the loop when this is called from one of its operations).
    pub fn stop(&self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.wake.notify(usize::MAX);
        let driver = self.driver.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(Driver::Thread(h)) = driver {
            // Called from an operation, on the loop's own thread: it ends
            // after this round; joining itself would never return.
            if h.thread().id() == std::thread::current().id() {
                return;
            }
            if h.join().is_err() {
                tracing::error!(reconciler = %self.shared.name, "reconciler thread panicked");
            }
        }
    }
}

impl Drop for Reconciler {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.wake.notify(usize::MAX);
        if let Some(Driver::Task(t)) = self
            .driver
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            // The task ends on its own at the next wake-up; nothing to await.
            drop(t);
        }
    }
}

/// The handle's shared state and the loop that runs it.
type Prepared<T, K, O> = (Arc<Shared>, Worker<T, K, O>);

/// Checks the configuration, registers the change stream and builds the
/// loop.
fn prepare<T, K, O>(
    db: &Db,
    target: Target<T, K>,
    ops: O,
    config: Config,
    clock: impl Clock,
) -> Result<Prepared<T, K, O>, StartError>
where
    T: Storable + Clone,
    K: ObjectKey,
    O: AsyncOperations<T>,
{
    config.validate()?;
    let changes = {
        let mut w = db.write_txn(&[&target.table])?;
        let changes = target.table.changes(&mut w)?;
        w.commit()?;
        changes
    };
    let shared = Arc::new(Shared::new(config.name.clone()));
    let worker = Worker::new(
        db.clone(),
        target,
        changes,
        ops,
        config,
        Arc::new(clock),
        shared.clone(),
    );
    Ok((shared, worker))
}
