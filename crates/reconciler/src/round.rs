//! The reconciler's loop: rounds of changes and retries, status
//! write-back, prune and refresh, then a wait for the next thing to do.

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::Poll;
use std::time::Instant;

use statedb::{ChangeKind, Changes, Db, Error, Obj, ReadTxn, Revision, Storable};

use crate::clock::Clock;
use crate::config::Config;
use crate::executor::first_of;
use crate::health::Health;
use crate::limiter::Limiter;
use crate::metrics::Metrics;
use crate::operations::{AsyncOperations, BatchEntry};
use crate::reconciler::Shared;
use crate::retry::{Backoff, RetryQueue};
use crate::status::{Status, StatusKind, Timestamp};
use crate::target::{ObjectKey, Target};

/// Where an entry of a round's batch came from.
struct Origin<K> {
    /// Its key, when already known (retries).
    key: Option<K>,
    /// The revision of the change that made it due.
    since: Revision,
}

/// The loop's state. Runs as one future: on its own thread
/// (`block_on`) or as a tokio task.
pub(crate) struct Worker<T, K, O> {
    db: Db,
    target: Target<T, K>,
    changes: Changes<T>,
    ops: O,
    cfg: Config,
    clock: Arc<dyn Clock>,
    shared: Arc<Shared>,
    metrics: Metrics,
    retries: RetryQueue<K, T>,
    round_limiter: Option<Limiter>,
    refresh_limiter: Limiter,
    prune_backoff: Backoff,
    initialized: bool,
    /// When to prune next (`None`: only on request).
    next_prune: Option<Timestamp>,
    prune_failures: u32,
    prune_error: Option<String>,
    next_refresh: Timestamp,
    /// Refresh resumes at this revision.
    refresh_from: Revision,
    // Buffers kept between rounds.
    updates: Vec<BatchEntry<T>>,
    update_origins: Vec<Origin<K>>,
    deletes: Vec<BatchEntry<T>>,
    delete_origins: Vec<Origin<K>>,
}

/// What one pass of the loop leaves to do.
struct Pass {
    /// The round was cut at `round_size`: more is waiting now.
    more: bool,
    /// The changes watch of the snapshot the pass read.
    watch: statedb::Watch,
    init_watch: Option<statedb::Watch>,
}

impl<T, K, O> Worker<T, K, O>
where
    T: Storable + Clone,
    K: ObjectKey,
    O: AsyncOperations<T>,
{
    pub(crate) fn new(
        db: Db,
        target: Target<T, K>,
        changes: Changes<T>,
        ops: O,
        cfg: Config,
        clock: Arc<dyn Clock>,
        shared: Arc<Shared>,
    ) -> Self {
        let backoff = Backoff {
            min: cfg.retry_min,
            max: cfg.retry_max,
            jitter: cfg.retry_jitter,
        };
        Worker {
            db,
            target,
            changes,
            ops,
            metrics: Metrics::new(&cfg.name),
            retries: RetryQueue::new(backoff.clone()),
            round_limiter: cfg.round_rate.map(Limiter::new),
            refresh_limiter: Limiter::new(cfg.refresh_rate),
            prune_backoff: backoff,
            initialized: false,
            next_prune: None,
            prune_failures: 0,
            prune_error: None,
            next_refresh: Timestamp(0),
            refresh_from: 0,
            updates: Vec::new(),
            update_origins: Vec::new(),
            deletes: Vec::new(),
            delete_origins: Vec::new(),
            cfg,
            clock,
            shared,
        }
    }

    /// Runs until stopped (or a database error, which is a bug).
    pub(crate) async fn run(mut self) {
        let mut guard = Ended {
            shared: self.shared.clone(),
            error: Some("the reconciler's operations panicked".into()),
        };
        let end = self.run_inner().await;
        guard.error = end.err().map(|e| e.to_string());
        if let Some(e) = &guard.error {
            tracing::error!(reconciler = %self.cfg.name, error = %e, "reconciler stopped");
        }
    }

    async fn run_inner(&mut self) -> Result<(), Error> {
        loop {
            // Listen before looking, so that no wake-up is lost.
            let wake = self.shared.wake.listen();
            if self.shared.stop.load(Ordering::SeqCst) {
                return Ok(());
            }
            // Rate limit: wait for a round's token before reading.
            if let Some(l) = &self.round_limiter {
                if let Err(at) = l.peek(self.clock.now()) {
                    let mut sleep = self.clock.sleep_until(at);
                    let mut wake = pin!(wake);
                    first_of(&mut [sleep.as_mut(), wake.as_mut()]).await;
                    continue;
                }
            }
            let pass = self.pass().await?;
            if pass.more {
                yield_now().await;
                continue;
            }
            let now = self.clock.now();
            if self.retries.next_due().is_some_and(|d| d <= now) {
                yield_now().await;
                continue;
            }
            self.wait(pass, wake).await;
        }
    }

    /// Waits for a change, a deadline, or a wake-up.
    async fn wait(&mut self, pass: Pass, wake: event_listener::EventListener) {
        let deadline = [
            self.retries.next_due(),
            self.next_prune.filter(|_| self.initialized),
            self.cfg.refresh_interval.map(|_| self.next_refresh),
        ]
        .into_iter()
        .flatten()
        .min();
        let mut sleep = match deadline {
            Some(d) => self.clock.sleep_until(d),
            None => Box::pin(std::future::pending()),
        };
        let mut changed = pin!(pass.watch.changed());
        let mut init: std::pin::Pin<Box<dyn Future<Output = ()> + Send>> = match pass.init_watch {
            Some(w) => Box::pin(w.changed()),
            None => Box::pin(std::future::pending()),
        };
        let mut wake = pin!(wake);
        first_of(&mut [
            changed.as_mut(),
            sleep.as_mut(),
            init.as_mut(),
            wake.as_mut(),
        ])
        .await;
    }

    /// One round: take changes and due retries, run the operations, write
    /// the statuses, then prune and refresh when due.
    async fn pass(&mut self) -> Result<Pass, Error> {
        let now = self.clock.now();
        let txn = self.db.read_txn();
        let (more, watch, init_watch, objects, position) = self.collect(&txn, now)?;
        let worked = !self.updates.is_empty() || !self.deletes.is_empty();
        if worked {
            if let Some(l) = &mut self.round_limiter {
                let _ = l.take(now);
            }
        }
        if !self.deletes.is_empty() {
            self.run_deletes(&txn, now).await;
        }
        if !self.updates.is_empty() {
            self.run_updates(&txn, now).await?;
        }
        drop(txn);
        let pruned = self.prune_if_due(now).await?;
        self.refresh_if_due(now)?;
        self.publish(position, objects, worked, pruned);
        Ok(Pass {
            more,
            watch,
            init_watch,
        })
    }

    /// Reads the round's work from the change stream and the retry queue.
    #[allow(clippy::type_complexity)]
    fn collect(
        &mut self,
        txn: &ReadTxn,
        now: Timestamp,
    ) -> Result<
        (
            bool,
            statedb::Watch,
            Option<statedb::Watch>,
            usize,
            Revision,
        ),
        Error,
    > {
        let view = self.target.table.read(txn)?;
        let init_watch = if self.initialized {
            None
        } else {
            let (done, w) = view.initialized_watch();
            if done {
                self.initialized = true;
                if self.cfg.prune_interval.is_some() {
                    self.next_prune = Some(now);
                }
                None
            } else {
                Some(w)
            }
        };
        if self.initialized && self.shared.prune_requested.swap(false, Ordering::SeqCst) {
            self.next_prune = Some(now);
        }
        let objects = view.len();
        let limit = self.cfg.round_size;
        let mut n = 0;
        let (iter, watch) = self.changes.iter(txn)?;
        let get_status = &*self.target.get_status;
        let key = &*self.target.key;
        let retries = &mut self.retries;
        for c in iter {
            let deleted = c.kind == ChangeKind::Delete;
            if !deleted && !get_status(c.object).is_pending_or_refreshing() {
                // Our own write-back, or written done elsewhere: failures
                // come back through the retry queue, not the stream.
                continue;
            }
            if !retries.is_empty() {
                // A new version replaces whatever was being retried.
                retries.clear(&key(c.object));
            }
            let origin = Origin {
                key: None,
                since: c.revision,
            };
            let entry = BatchEntry::new(c.object.clone(), c.revision);
            if deleted {
                self.deletes.push(entry);
                self.delete_origins.push(origin);
            } else {
                self.updates.push(entry);
                self.update_origins.push(origin);
            }
            n += 1;
            if n >= limit {
                break;
            }
        }
        let more = n >= limit;
        let position = self.changes.position();
        while n < limit {
            let Some(due) = self.retries.pop_due(now) else {
                break;
            };
            let origin = Origin {
                key: Some(due.key),
                since: due.rev,
            };
            let entry = BatchEntry::new(due.obj, due.rev);
            if due.delete {
                self.deletes.push(entry);
                self.delete_origins.push(origin);
            } else {
                self.updates.push(entry);
                self.update_origins.push(origin);
            }
            n += 1;
        }
        Ok((more, watch, init_watch, objects, position))
    }

    async fn run_deletes(&mut self, txn: &ReadTxn, now: Timestamp) {
        let start = Instant::now();
        self.ops.delete_batch(txn, &mut self.deletes).await;
        let took = start.elapsed();
        let n = self.deletes.len();
        let mut failed = 0;
        for (e, o) in self.deletes.drain(..).zip(self.delete_origins.drain(..)) {
            let key = o.key.unwrap_or_else(|| (self.target.key)(&e.object));
            match e.result {
                Ok(()) => self.retries.clear(&key),
                Err(err) => {
                    failed += 1;
                    tracing::debug!(reconciler = %self.cfg.name, key = ?key, error = %err, "delete failed");
                    let msg = Arc::new(err.to_string());
                    self.retries
                        .fail(key, e.object, e.revision, o.since, true, msg, now);
                }
            }
        }
        self.metrics.delete.batch(n, failed, took);
    }

    async fn run_updates(&mut self, txn: &ReadTxn, now: Timestamp) -> Result<(), Error> {
        let start = Instant::now();
        self.ops.update_batch(txn, &mut self.updates).await;
        let took = start.elapsed();
        let n = self.updates.len();
        let failed = self.updates.iter().filter(|e| e.result.is_err()).count();
        self.metrics.update.batch(n, failed, took);
        self.commit_statuses(now)
    }

    /// Writes each update's outcome back, in one write transaction: by
    /// compare-and-swap on the revision reconciled; if the object changed
    /// since, only onto an object whose status still has the id reconciled
    /// (pending with the same id: another reconciler's status changed it).
    fn commit_statuses(&mut self, now: Timestamp) -> Result<(), Error> {
        let table = &self.target.table;
        let get_status = &*self.target.get_status;
        let set_status = &*self.target.set_status;
        let mut w = self.db.write_txn(&[table])?;
        let done = Status::done_at(now);
        for (e, o) in self.updates.drain(..).zip(self.update_origins.drain(..)) {
            let (status, error) = match e.result {
                Ok(()) => (done.clone(), None),
                Err(err) => {
                    let msg = Arc::new(err.to_string());
                    (Status::error_at(msg.to_string(), now), Some(msg))
                }
            };
            let pending_id = get_status(&e.object).id();
            // Whether the status was written (`compare_and_swap` returns
            // the replaced version).
            let written = match table.compare_and_swap(
                &mut w,
                e.revision,
                set_status(&e.object, status.clone()),
            ) {
                Ok(_) => true,
                Err(Error::RevisionMismatch { .. }) => {
                    let key = o
                        .key
                        .clone()
                        .unwrap_or_else(|| (self.target.key)(&e.object));
                    let current: Option<Obj<T>> =
                        table.get(&w, &self.target.primary, &key)?.cloned();
                    match current {
                        // Our status untouched: only another
                        // reconciler's status (or nothing we follow)
                        // changed.
                        Some(cur) if get_status(&cur).id() == pending_id => {
                            table.compare_and_swap(
                                &mut w,
                                cur.revision(),
                                set_status(&cur, status),
                            )?;
                            true
                        }
                        // Changed: the new version comes as a change.
                        _ => false,
                    }
                }
                // Deleted meanwhile: the delete comes as a change.
                Err(Error::ObjectNotFound) => false,
                Err(other) => return Err(other),
            };
            match (written, error) {
                (true, Some(msg)) => {
                    // Retried from the version just written.
                    let key = o.key.unwrap_or_else(|| (self.target.key)(&e.object));
                    tracing::debug!(reconciler = %self.cfg.name, key = ?key, error = %msg, "update failed");
                    if let Some(obj) = table.get(&w, &self.target.primary, &key)?.cloned() {
                        let rev = obj.revision();
                        self.retries.fail(key, obj, rev, o.since, false, msg, now);
                    }
                }
                (true, None) => {
                    // Done: nothing of this key is left to retry (also not
                    // a delete of an earlier version that failed in this
                    // round, before this update ran).
                    if let Some(k) = o.key {
                        self.retries.clear(&k);
                    } else if !self.retries.is_empty() {
                        self.retries.clear(&(self.target.key)(&e.object));
                    }
                }
                // Not written: a newer version (or the delete) is on its
                // way and is reconciled afresh.
                (false, _) => {
                    if let Some(k) = o.key {
                        self.retries.clear(&k);
                    }
                }
            }
        }
        w.commit()?;
        Ok(())
    }

    /// Prunes when due (only once the table is initialized). True if it ran.
    async fn prune_if_due(&mut self, now: Timestamp) -> Result<bool, Error> {
        if !self.initialized || self.next_prune.is_none_or(|t| t > now) {
            return Ok(false);
        }
        let txn = self.db.read_txn();
        let desired = self.target.table.all(&txn)?;
        let start = Instant::now();
        let result = self.ops.prune(&txn, desired).await;
        self.metrics.prune(result.is_ok(), start.elapsed());
        match result {
            Ok(()) => {
                self.prune_failures = 0;
                self.prune_error = None;
                self.next_prune = self.cfg.prune_interval.map(|i| now.plus(i));
            }
            Err(e) => {
                tracing::warn!(reconciler = %self.cfg.name, error = %e, "prune failed");
                self.prune_failures = self.prune_failures.saturating_add(1);
                self.prune_error = Some(e.to_string());
                self.next_prune = Some(now.plus(self.prune_backoff.base(self.prune_failures)));
            }
        }
        Ok(true)
    }

    /// Marks done objects older than the refresh interval as refreshing, in
    /// revision order (oldest write first), as fast as the refresh rate
    /// allows.
    fn refresh_if_due(&mut self, now: Timestamp) -> Result<(), Error> {
        let Some(interval) = self.cfg.refresh_interval else {
            return Ok(());
        };
        if now < self.next_refresh {
            return Ok(());
        }
        let get_status = &*self.target.get_status;
        let txn = self.db.read_txn();
        let view = self.target.table.read(&txn)?;
        let mut marked: Vec<Obj<T>> = Vec::new();
        self.next_refresh = now.plus(interval);
        for obj in view.list_revision(self.refresh_from) {
            let st = get_status(obj);
            let due = st.updated_at().plus(interval);
            if due > now {
                self.next_refresh = due;
                break;
            }
            if st.kind() == StatusKind::Done {
                if let Err(at) = self.refresh_limiter.take(now) {
                    self.next_refresh = at;
                    break;
                }
                marked.push(obj.clone());
            }
            self.refresh_from = obj.revision() + 1;
        }
        if marked.is_empty() {
            return Ok(());
        }
        let table = &self.target.table;
        let mut w = self.db.write_txn(&[table])?;
        for obj in marked {
            let refreshed = (self.target.set_status)(&obj, Status::refreshing_at(now));
            match table.compare_and_swap(&mut w, obj.revision(), refreshed) {
                Ok(_) | Err(Error::RevisionMismatch { .. } | Error::ObjectNotFound) => {}
                Err(e) => return Err(e),
            }
        }
        w.commit()?;
        Ok(())
    }

    /// Publishes progress and health after a pass.
    fn publish(&mut self, position: Revision, objects: usize, worked: bool, pruned: bool) {
        let failing = self.retries.len() + usize::from(self.prune_error.is_some());
        let failing_deletes = self.retries.failing_deletes();
        self.metrics
            .update
            .current_errors(self.retries.len() - failing_deletes);
        self.metrics.delete.current_errors(failing_deletes);
        let health = if failing == 0 {
            Health::Ok { objects }
        } else {
            let mut errors = Vec::new();
            if let Some(e) = &self.prune_error {
                errors.push(format!("prune: {e}"));
            }
            let room = self.cfg.health_errors.saturating_sub(errors.len());
            errors.extend(self.retries.errors(room));
            Health::Degraded { failing, errors }
        };
        let lowest = self.retries.lowest_since();
        self.shared.publish(|p| {
            p.processed = p.processed.max(position);
            p.lowest_failing = lowest;
            p.health = health;
            p.rounds += u64::from(worked);
            p.prunes += u64::from(pruned);
        });
    }
}

/// Publishes the end of the loop however it ends: returning, or unwinding
/// from a panic in an operation (then with that as the error), so that
/// waiters learn of it.
struct Ended {
    shared: Arc<Shared>,
    error: Option<String>,
}

impl Drop for Ended {
    fn drop(&mut self) {
        let error = self.error.take();
        self.shared.publish(|p| {
            p.stopped = true;
            p.health = Health::Stopped { error };
        });
    }
}

/// Gives the executor a turn (a tokio worker, other tasks).
async fn yield_now() {
    let mut yielded = false;
    std::future::poll_fn(|cx| {
        if yielded {
            return Poll::Ready(());
        }
        yielded = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    })
    .await
}
