//! Read and write transactions.
//!
//! A [`ReadTxn`] is one load of the database root: an immutable vector of
//! table roots. A [`WriteTxn`] holds the locks of the tables it may write,
//! taken in table-id order; the per-table write state is created on the
//! table's first write only.

use std::any::Any;
use std::cell::OnceCell;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use parking_lot::MutexGuard;
use quanta::Instant;
use smallvec::SmallVec;

use crate::db::{DbInner, Roots, SharedRoots};
use crate::table::{
    Failure, KeyScratch, Storable, Table, TableMeta, TableRoot, TableTxn, TableTxnDyn, View,
    WriterState,
};
use crate::{Error, Result};

/// Something tables can be read through: a [`ReadTxn`] or a [`WriteTxn`]
/// (which sees its own writes). Sealed: only those two implement it.
pub trait TxnRead: crate::sealed::Sealed {
    /// What a table bound to the transaction keeps ([`crate::TableRead`]):
    /// a snapshot's committed root, or a write transaction's [`View`].
    #[doc(hidden)]
    type Bound<'a, T: Storable>: Copy
    where
        Self: 'a;
    /// Checks that `table` can be read through the transaction and binds
    /// it.
    #[doc(hidden)]
    fn bind<'a, T: Storable>(&'a self, table: &Table<T>) -> Result<Self::Bound<'a, T>>;
    /// The view a bound table reads.
    #[doc(hidden)]
    fn bound_view<'a, T: Storable>(bound: Self::Bound<'a, T>) -> View<'a, T>
    where
        Self: 'a;
    /// [`TxnRead::bind`], as a view.
    #[doc(hidden)]
    fn view<'a, T: Storable>(&'a self, table: &Table<T>) -> Result<View<'a, T>>;
}

/// A consistent snapshot of every table. Taking one is O(1) and lock-free;
/// it never blocks a writer nor is blocked by one. `Send + Sync`, cheap to
/// clone.
#[derive(Clone)]
pub struct ReadTxn {
    pub(crate) db_uid: u64,
    pub(crate) roots: SharedRoots,
}

impl std::fmt::Debug for ReadTxn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadTxn")
            .field("tables", &self.roots.len())
            .finish()
    }
}

#[inline]
pub(crate) fn root_of<'a, T: Storable>(
    db_uid: u64,
    roots: &'a Roots,
    meta: &TableMeta,
) -> Result<&'a TableRoot<T>> {
    if meta.db_uid != db_uid {
        return Err(foreign_table(meta));
    }
    match roots
        .get(meta.id)
        .and_then(|r| r.downcast_ref::<TableRoot<T>>())
    {
        Some(r) => Ok(r),
        None => Err(table_not_in_snapshot(meta)),
    }
}

/// The errors of a table handle a transaction cannot read or write, out
/// of line: their strings kept off every query's and write's path.
#[cold]
#[inline(never)]
fn foreign_table(meta: &TableMeta) -> Error {
    Error::ForeignTable(meta.name.clone())
}

#[cold]
#[inline(never)]
fn table_not_in_snapshot(meta: &TableMeta) -> Error {
    Error::TableNotInSnapshot(meta.name.clone())
}

#[cold]
#[inline(never)]
fn table_not_locked(meta: &TableMeta) -> Error {
    Error::TableNotLocked(meta.name.clone())
}

/// A per-thread source of read transactions for hot loops: each
/// [`Reader::read_txn`] is a fresh snapshot of the latest committed state,
/// like [`crate::Db::read_txn`], but reuses the previous snapshot's handle
/// while nothing was committed, so readers on different threads do not
/// contend on one reference count.
pub struct Reader {
    pub(crate) db: Arc<DbInner>,
    /// The root count read before `txn` was loaded.
    pub(crate) version: u64,
    pub(crate) txn: ReadTxn,
}

impl std::fmt::Debug for Reader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reader").finish_non_exhaustive()
    }
}

impl Reader {
    /// The latest committed snapshot.
    #[inline]
    pub fn read_txn(&mut self) -> &ReadTxn {
        // Acquire, paired with the Release after each swap: a count that
        // moved is followed by a load that finds those roots or newer. An
        // unchanged count means no commit finished since `txn` was loaded
        // (one still publishing has not returned to its caller yet).
        let v = self.db.root.version();
        if v != self.version {
            self.refresh(v);
        }
        &self.txn
    }

    #[inline(never)]
    fn refresh(&mut self, v: u64) {
        let cur = self.db.root.load_full();
        self.version = v;
        if !SharedRoots::ptr_eq(&cur, &self.txn.roots) {
            let old = std::mem::replace(&mut self.txn.roots, cur);
            // If this reader was the last holder, the old snapshot is freed
            // here when this thread published it, else by the thread that
            // did (`DbInner::retire`).
            self.db.retire(old);
        }
    }
}

impl ReadTxn {
    #[inline]
    pub(crate) fn root<T: Storable>(&self, table: &Table<T>) -> Result<&TableRoot<T>> {
        root_of(self.db_uid, &self.roots, &table.inner.meta)
    }
}

impl crate::sealed::Sealed for ReadTxn {}

impl TxnRead for ReadTxn {
    type Bound<'a, T: Storable>
        = &'a TableRoot<T>
    where
        Self: 'a;
    #[inline]
    fn bind<'a, T: Storable>(&'a self, table: &Table<T>) -> Result<&'a TableRoot<T>> {
        self.root(table)
    }
    #[inline(always)]
    fn bound_view<'a, T: Storable>(bound: &'a TableRoot<T>) -> View<'a, T>
    where
        Self: 'a,
    {
        View::Root(bound)
    }
    #[inline]
    fn view<'a, T: Storable>(&'a self, table: &Table<T>) -> Result<View<'a, T>> {
        self.root(table).map(View::Root)
    }
}

/// One table locked by a write transaction.
pub(crate) struct Locked<'a> {
    /// Also holds when the lock was taken, if this hold is timed
    /// ([`WriterState::acquired`]).
    pub(crate) guard: MutexGuard<'a, WriterState>,
    /// Created on the table's first write.
    pub(crate) state: Option<Box<dyn TableTxnDyn>>,
}

impl Locked<'_> {
    /// The table's metadata (through the guard; see [`WriterState::meta`]).
    #[inline]
    pub(crate) fn meta(&self) -> &TableMeta {
        &self.guard.meta
    }

    /// Releases the lock, recording the hold (its length if it is timed,
    /// `now` being the clock read by [`now_if_timed`]).
    pub(crate) fn release(self, now: Option<Instant>) {
        let held = self.guard.acquired.zip(now).map(|(a, n)| n - a);
        self.meta().metrics.lock_held(held);
    }
}

/// The clock, read only if some hold in `locked` is timed (see
/// [`crate::DbOptions::time_one_in`]).
pub(crate) fn now_if_timed(locked: &[Locked<'_>]) -> Option<Instant> {
    locked
        .iter()
        .any(|l| l.guard.acquired.is_some())
        .then(Instant::now)
}

/// A write transaction over the tables it locked.
///
/// Writes are visible to the transaction itself at once and to everyone else
/// after [`WriteTxn::commit`], atomically across its tables. Dropping it
/// uncommitted (a panic included) aborts: nothing changes.
pub struct WriteTxn<'db> {
    /// Borrowed, as are the tables' locks: a transaction takes no
    /// reference count of its own (four locked instructions per
    /// transaction when it held the database and each lock by `Arc`).
    pub(crate) db: &'db DbInner,
    /// The snapshot reads of tables this transaction has not written go
    /// to, loaded on the first such read: the tables it locked cannot
    /// change before it commits, so a later load reads them as they were
    /// when locked (and others as of that first read). Most single-row
    /// transactions never load it (a root-cell load and the reference
    /// count traffic of holding it: ~15 ns of a 615 ns transaction when
    /// it was an `ArcSwap` load, 2026-12-03).
    pub(crate) base: OnceCell<SharedRoots>,
    /// Sorted by table id, no repetitions.
    pub(crate) locked: SmallVec<[Locked<'db>; 4]>,
    pub(crate) done: bool,
    /// A write was interrupted by a panic: only abort is allowed.
    pub(crate) poisoned: bool,
}

impl std::fmt::Debug for WriteTxn<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteTxn")
            .field(
                "tables",
                &self
                    .locked
                    .iter()
                    .map(|l| l.meta().name.as_str())
                    .collect::<Vec<_>>(),
            )
            .field("done", &self.done)
            .finish()
    }
}

impl WriteTxn<'_> {
    fn find(&self, meta: &TableMeta) -> Option<usize> {
        self.locked
            .binary_search_by_key(&meta.id, |l| l.meta().id)
            .ok()
            .filter(|&i| std::ptr::eq(self.locked[i].meta(), meta))
    }

    /// Runs `f` on the table's write state, creating it on first use.
    pub(crate) fn with_table<T: Storable, R>(
        &mut self,
        table: &Table<T>,
        f: impl FnOnce(&mut TableTxn<T>, &mut KeyScratch) -> std::result::Result<R, Failure>,
    ) -> Result<R> {
        let i = self.locked_index(&table.inner.meta)?;
        self.ensure_state::<T>(i)?;
        // A panic inside `f` leaves `poisoned` set (the txn is dropped while
        // unwinding, or refuses to commit if the panic was caught), and so
        // does a write that failed part-way.
        self.poisoned = true;
        let (state, keys) = state_cast(&mut self.locked, i)?;
        match f(state, keys) {
            Ok(r) => {
                self.poisoned = false;
                Ok(r)
            }
            Err(Failure::Refused(e)) => {
                self.poisoned = false;
                Err(e)
            }
            Err(Failure::PartWay(e)) => Err(e),
        }
    }

    /// Index of the table's entry in `locked`, after checking the
    /// transaction may write it.
    fn locked_index(&self, meta: &TableMeta) -> Result<usize> {
        if self.done {
            return Err(Error::TxnDone);
        }
        if self.poisoned {
            return Err(Error::Poisoned);
        }
        if meta.db_uid != self.db.uid {
            return Err(foreign_table(meta));
        }
        match self.find(meta) {
            Some(i) => Ok(i),
            None => Err(table_not_locked(meta)),
        }
    }

    /// Creates the write state of `locked[i]` if this is its first write.
    fn ensure_state<T: Storable>(&mut self, i: usize) -> Result<()> {
        if self.locked[i].state.is_some() {
            return Ok(());
        }
        // The table's root as its lock froze it: from the snapshot if one
        // is loaded, else as the last publication recorded it under the
        // lock we hold (design.md, "The published root").
        let db = &self.db;
        let ws = &mut *self.locked[i].guard;
        if self.base.get().is_none() && ws.published.get().is_none() {
            // None recorded yet (the table's first write transaction): read
            // with a plain load under the commit lock, the root cell's
            // writer.
            let w = db.root.write();
            if let Some(r) = w.current().get(ws.meta.id) {
                // SAFETY: `r` is the table's published root and we hold
                // the table's lock.
                #[allow(unsafe_code)]
                unsafe {
                    ws.published.set(r)
                };
            }
        }
        let track_deletes = ws.has_trackers();
        let WriterState {
            meta,
            published,
            keys,
            ..
        } = ws;
        let root = match self.base.get() {
            Some(b) => root_of::<T>(db.uid, b, meta)?,
            None => (published.get())
                .and_then(|r| r.downcast_ref::<TableRoot<T>>())
                .ok_or_else(|| table_not_in_snapshot(meta))?,
        };
        let mut state = TableTxn::<T>::new_boxed(root, keys, track_deletes, meta.layout);
        // A wanted revision index the table lacks is built from the whole
        // table: not under the lock every commit takes.
        if meta.revisions_wanted.load(Ordering::Relaxed) || state.track_deletes {
            state.ensure_revisions();
        }
        self.locked[i].state = Some(state);
        Ok(())
    }

    /// The table's write state (created if `create`, else only if it
    /// exists) and its writer-only state.
    pub(crate) fn writer_parts<T: Storable>(
        &mut self,
        table: &Table<T>,
        create: bool,
    ) -> Result<(Option<&mut TableTxn<T>>, &mut WriterState)> {
        let i = self.locked_index(&table.inner.meta)?;
        if create {
            self.ensure_state::<T>(i)?;
        }
        let l = &mut self.locked[i];
        let st = l
            .state
            .as_mut()
            .and_then(|s| s.as_any_mut().downcast_mut::<TableTxn<T>>());
        Ok((st, &mut l.guard))
    }

    /// Commits every written table atomically and returns a snapshot that
    /// includes the commit. Watches fire after the new state is published.
    pub fn commit(&mut self) -> Result<ReadTxn> {
        if self.done {
            return Err(Error::TxnDone);
        }
        if self.poisoned {
            return Err(Error::Poisoned);
        }
        self.done = true;
        let roots = DbInner::commit(self.db, &mut self.locked);
        // A done transaction answers no reads: the returned snapshot is
        // the commit.
        self.base = OnceCell::new();
        Ok(ReadTxn {
            db_uid: self.db.uid,
            roots,
        })
    }

    /// Drops every write and releases the locks. Also what dropping does.
    pub fn abort(&mut self) -> Result<()> {
        if self.done {
            return Err(Error::TxnDone);
        }
        self.done = true;
        self.release();
        self.base = OnceCell::new();
        Ok(())
    }

    /// Whether the transaction was committed or aborted.
    pub fn is_done(&self) -> bool {
        self.done
    }

    fn release(&mut self) {
        let now = now_if_timed(&self.locked);
        for l in self.locked.drain(..) {
            l.release(now);
        }
    }
}

/// The table's write state and the key buffers it writes with (the table's
/// own, lent by the lock guard rather than moved in and out of the state).
fn state_cast<'a, T: Storable>(
    locked: &'a mut [Locked<'_>],
    i: usize,
) -> Result<(&'a mut TableTxn<T>, &'a mut KeyScratch)> {
    let Locked { guard, state } = &mut locked[i];
    // The error is built only on failure: it clones the name.
    match state
        .as_mut()
        .and_then(|s| s.as_any_mut().downcast_mut::<TableTxn<T>>())
    {
        Some(s) => Ok((s, &mut guard.keys)),
        None => Err(Error::TableNotLocked(guard.meta.name.clone())),
    }
}

impl Drop for WriteTxn<'_> {
    fn drop(&mut self) {
        self.release();
    }
}

impl crate::sealed::Sealed for WriteTxn<'_> {}

impl TxnRead for WriteTxn<'_> {
    type Bound<'a, T: Storable>
        = View<'a, T>
    where
        Self: 'a;
    fn bind<'a, T: Storable>(&'a self, table: &Table<T>) -> Result<View<'a, T>> {
        self.view(table)
    }
    #[inline(always)]
    fn bound_view<'a, T: Storable>(bound: View<'a, T>) -> View<'a, T>
    where
        Self: 'a,
    {
        bound
    }
    fn view<'a, T: Storable>(&'a self, table: &Table<T>) -> Result<View<'a, T>> {
        if self.done {
            return Err(Error::TxnDone);
        }
        let meta = &table.inner.meta;
        if let Some(i) = self.find(meta) {
            if let Some(s) = &self.locked[i].state {
                let any: &dyn Any = s.as_any();
                if let Some(t) = any.downcast_ref::<TableTxn<T>>() {
                    return Ok(View::Txn(t));
                }
            }
        }
        let base = self.base.get_or_init(|| self.db.root.load_full());
        root_of(self.db.uid, base, meta).map(View::Root)
    }
}
