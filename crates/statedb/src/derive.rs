//! Derived tables: an output table kept as a function of an input table's
//! changes ([`derive`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::{Changes, Db, Initializer, Result, Storable, Table, WatchSet};

/// What an input change does to the output table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeriveResult<O> {
    /// Insert or replace this object.
    Upsert(O),
    /// Delete this object (nothing happens if it is absent).
    Delete(O),
    /// Leave the output as it is.
    Skip,
}

/// How often a derivation with nothing to do looks at its stop flag.
const STOP_POLL: Duration = Duration::from_millis(20);

/// A running derivation ([`derive`]); stops when dropped.
#[derive(Debug)]
pub struct Derivation {
    stop: Arc<AtomicBool>,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

#[derive(Debug, Default)]
struct Shared {
    /// Input changes processed.
    processed: AtomicU64,
    /// Output writes refused (the error kept in `last_error`).
    errors: AtomicU64,
    last_error: Mutex<Option<String>>,
}

impl Derivation {
    /// Input changes processed so far (inserts, updates and deletes).
    pub fn processed(&self) -> u64 {
        self.shared.processed.load(Ordering::Acquire)
    }

    /// Output writes the output table refused, and the last refusal; each
    /// is skipped, the derivation goes on.
    pub fn errors(&self) -> (u64, Option<String>) {
        let last = self
            .shared
            .last_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        (self.shared.errors.load(Ordering::Acquire), last)
    }

    /// Stops the derivation and waits for its thread.
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Derivation {
    fn drop(&mut self) {
        self.halt();
    }
}

/// Keeps `output` a function of `input`: every change of `input` (each
/// existing object first, as an insert) goes through `transform` with
/// whether it is a delete, and its result is written to `output`, one
/// write transaction per batch of changes. `output` gets an initializer
/// named `derive:{input}` that is done once `input` is initialized and
/// every change up to then is written, so readers of `output` can tell a
/// complete table from one still filling.
///
/// Runs on a thread of its own until the returned [`Derivation`] stops or
/// drops. A derivation stopped before its input is initialized leaves the
/// output uninitialized (its initializer stays pending).
///
/// ```
/// use statedb::{derive, Db, DeriveResult, Index, Table};
///
/// # fn main() -> statedb::Result<()> {
/// let db = Db::new();
/// let by_id = Index::unique("id", |p: &(u32, bool)| p.0);
/// let pods: Table<(u32, bool)> = db.create_table("pods", &by_id, &[])?;
/// let ready_by_id = Index::unique("id", |id: &u32| *id);
/// let ready: Table<u32> = db.create_table("ready", &ready_by_id, &[])?;
///
/// let d = derive(&db, &pods, &ready, |p: &(u32, bool), deleted| {
///     if deleted || !p.1 { DeriveResult::Delete(p.0) } else { DeriveResult::Upsert(p.0) }
/// })?;
/// let mut txn = db.write_txn(&[&pods])?;
/// pods.insert(&mut txn, (7, true))?;
/// txn.commit()?;
/// while ready.len(&db.read_txn())? == 0 {
///     std::thread::yield_now();
/// }
/// d.stop();
/// # Ok(())
/// # }
/// ```
pub fn derive<I, O, F>(
    db: &Db,
    input: &Table<I>,
    output: &Table<O>,
    transform: F,
) -> Result<Derivation>
where
    I: Storable,
    O: Storable,
    F: FnMut(&I, bool) -> DeriveResult<O> + Send + 'static,
{
    let (changes, init) = {
        let mut txn = db.write_txn(&[input, output])?;
        let changes = input.changes(&mut txn)?;
        let init = output.register_initializer(&mut txn, &format!("derive:{}", input.name()))?;
        txn.commit()?;
        (changes, init)
    };
    let stop = Arc::new(AtomicBool::new(false));
    let shared = Arc::new(Shared::default());
    let job = Job {
        db: db.clone(),
        input: input.clone(),
        output: output.clone(),
        changes,
        init: Some(init),
        transform,
        stop: stop.clone(),
        shared: shared.clone(),
    };
    let thread = std::thread::Builder::new()
        .name(format!("derive {} -> {}", input.name(), output.name()))
        .spawn(move || job.run())
        .map_err(|e| crate::Error::Thread(e.to_string()))?;
    Ok(Derivation {
        stop,
        shared,
        thread: Some(thread),
    })
}

struct Job<I, O, F> {
    db: Db,
    input: Table<I>,
    output: Table<O>,
    changes: Changes<I>,
    /// Until done: the output's initializer.
    init: Option<Initializer>,
    transform: F,
    stop: Arc<AtomicBool>,
    shared: Arc<Shared>,
}

impl<I, O, F> Job<I, O, F>
where
    I: Storable,
    O: Storable,
    F: FnMut(&I, bool) -> DeriveResult<O>,
{
    fn run(mut self) {
        while !self.stop.load(Ordering::Acquire) {
            let mut watches = WatchSet::new();
            match self.step(&mut watches) {
                Ok(()) => {}
                Err(e) => {
                    // The tables or the database went away: nothing more
                    // can be derived.
                    self.refused(e.to_string());
                    return;
                }
            }
            while !self.stop.load(Ordering::Acquire) && watches.wait_timeout(STOP_POLL).is_none() {}
        }
    }

    fn refused(&self, e: String) {
        self.shared.errors.fetch_add(1, Ordering::AcqRel);
        *self
            .shared
            .last_error
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(e);
    }

    /// Writes the changes committed so far; adds to `watches` what to wait
    /// for next.
    fn step(&mut self, watches: &mut WatchSet) -> Result<()> {
        let rtxn = self.db.read_txn();
        let (changes, more) = self.changes.iter(&rtxn)?;
        watches.add(more);
        // Read before the changes are written: the input was initialized
        // at this snapshot, and every change up to it is in the batch.
        let (input_ready, init_watch) = self.input.initialized_watch(&rtxn)?;
        if self.init.is_some() && !input_ready {
            watches.add(init_watch);
        }
        let mut results = Vec::new();
        let mut n = 0u64;
        for c in changes {
            n += 1;
            results.push((self.transform)(c.object.value(), c.is_delete()));
        }
        let finish = input_ready && self.init.is_some();
        if results.iter().all(|r| matches!(r, DeriveResult::Skip)) && !finish {
            self.shared.processed.fetch_add(n, Ordering::AcqRel);
            return Ok(());
        }
        let mut txn = self.db.write_txn(&[&self.output])?;
        for r in results {
            let res = match r {
                DeriveResult::Upsert(o) => self.output.insert(&mut txn, o).map(drop),
                DeriveResult::Delete(o) => self.output.delete(&mut txn, &o).map(drop),
                DeriveResult::Skip => Ok(()),
            };
            match res {
                Ok(()) => {}
                // A bad handle or a poisoned transaction: the batch cannot
                // be written.
                Err(e) if e.is_misuse() => return Err(e),
                // A conflict or a key too long: that object is skipped.
                Err(e) => self.refused(e.to_string()),
            }
        }
        if finish {
            if let Some(init) = self.init.take() {
                self.output.initializer_done(&mut txn, &init)?;
            }
        }
        txn.commit()?;
        self.shared.processed.fetch_add(n, Ordering::AcqRel);
        Ok(())
    }
}
