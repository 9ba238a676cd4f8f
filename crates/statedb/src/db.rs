//! The database: table registration, the published root vector, commit
//! and graveyard collection (reclaiming superseded versions is
//! `reclaim.rs`).

use std::any::Any;
use std::cell::OnceCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::thread::Thread;
use std::time::Duration;

use parking_lot::{Mutex, MutexGuard, RwLock};
use quanta::Instant;
use smallvec::SmallVec;

use crate::index::{AnyIndex, Index};
use crate::key::KeyLayout;
use crate::metrics::{TableMetrics, Timings};
use crate::reclaim::{new_roots, recycle, thread_tag, Mailbox, MAILBOXES};
use crate::root::RootCell;
use crate::table::{
    AnyTable, Finished, Storable, Table, TableInner, TableMeta, TableRoot, WriterState,
};
use crate::txn::{now_if_timed, Locked, ReadTxn, Reader, WriteTxn};
use crate::{Error, Result, Revision};
use crossbeam_utils::CachePadded;

/// A table's committed root (a `TableRoot<T>`), type-erased.
pub(crate) type AnyRoot = Arc<dyn Any + Send + Sync>;

/// A published root vector. A `triomphe` `Arc`: no weak count, so the
/// commit that supersedes a vector no reader holds knows it with one load
/// and reuses the allocation (see `SPARE`).
pub(crate) type SharedRoots = triomphe::Arc<Roots>;

/// Tables whose roots sit in the root vector itself.
const HEAD: usize = 2;
/// Roots per shared chunk past the first [`HEAD`].
const CHUNK: usize = 8;

/// A run of [`CHUNK`] table roots that versions share until a commit
/// writes one of its tables.
type Chunk = SmallVec<[AnyRoot; CHUNK]>;

/// The published state: one root per table, indexed by table id, and the
/// thread that published it.
///
/// The first two roots sit inline beside the reference counts: a thread
/// reading a version another core published fetches one line for them
/// where a `Vec`'s buffer made two (each ~200 ns when the other core wrote
/// it last, on the 2-vCPU Intel VM). The others lie in chunks of eight,
/// whose pointers sit inline up to three chunks (26 tables in all); a
/// commit copies only the chunks whose tables it writes and shares the
/// rest, so that it takes a reference on the first two roots, each chunk
/// and the roots of the chunks it writes, not on every table's root.
#[derive(Default)]
pub(crate) struct Roots {
    head: [Option<AnyRoot>; HEAD],
    /// Tables `HEAD..`, `CHUNK` to a chunk, every chunk but the last full.
    chunks: SmallVec<[Arc<Chunk>; 3]>,
    /// [`thread_tag`] of the publishing thread, which allocated most of
    /// what this version alone holds (its commit's copied path).
    pub(crate) by: u64,
}

// `head` first: the `Arc`'s two counts and the two inline roots are the
// allocation's first 48 bytes.
const _: () = assert!(std::mem::offset_of!(Roots, head) == 0);
const _: () = assert!(std::mem::size_of::<Roots>() <= 96);

impl Roots {
    /// Table `id`'s root.
    #[inline]
    pub(crate) fn get(&self, id: usize) -> Option<&AnyRoot> {
        match id.checked_sub(HEAD) {
            None => self.head[id].as_ref(),
            Some(i) => self.chunks.get(i / CHUNK)?.get(i % CHUNK),
        }
    }

    /// The number of tables.
    pub(crate) fn len(&self) -> usize {
        self.head.iter().flatten().count() + self.chunks.iter().map(|c| c.len()).sum::<usize>()
    }

    /// Adds the root of the next table (`id == len()`).
    pub(crate) fn push(&mut self, root: AnyRoot) {
        if let Some(slot) = self.head.iter_mut().find(|s| s.is_none()) {
            *slot = Some(root);
            return;
        }
        match self.chunks.last_mut() {
            Some(last) if last.len() < CHUNK => Arc::make_mut(last).push(root),
            _ => self.chunks.push(Arc::new(std::iter::once(root).collect())),
        }
    }

    /// [`Roots::successor_into`] a new vector (for tests).
    #[cfg(test)]
    fn successor(&self, new: impl IntoIterator<Item = (usize, AnyRoot)>) -> Roots {
        let mut out = Roots::default();
        self.successor_into(&mut out, new);
        out
    }

    /// Writes into `out` (empty) a copy to be published by this thread,
    /// with the roots `new` gives (table id, root; ids ascending) in place
    /// of the tables' old ones (not cloned and then replaced: a count
    /// increment and decrement on a line the previous committer wrote). A
    /// chunk holding none of those tables is shared; the work is per chunk
    /// and per new root, not per table. Field by field, into a reused
    /// allocation: no 96-byte copy through the stack.
    fn successor_into(&self, out: &mut Roots, new: impl IntoIterator<Item = (usize, AnyRoot)>) {
        let mut new = new.into_iter().peekable();
        out.head = std::array::from_fn(|i| {
            let r = self.head[i].as_ref()?;
            Some(match new.next_if(|(id, _)| *id == i) {
                Some((_, n)) => n,
                None => r.clone(),
            })
        });
        // `out` is empty: with no chunks (two tables or fewer) there is
        // nothing to collect (an empty `collect` still cost ~20
        // instructions per commit).
        if !self.chunks.is_empty() {
            out.chunks = self.successor_chunks(new);
        }
        out.by = thread_tag();
    }

    /// The chunks of [`Roots::successor_into`]: shared unless `new` (the
    /// roots left after the head's) replaces a root in them.
    fn successor_chunks(
        &self,
        mut new: std::iter::Peekable<impl Iterator<Item = (usize, AnyRoot)>>,
    ) -> SmallVec<[Arc<Chunk>; 3]> {
        (self.chunks.iter().enumerate())
            .map(|(c, chunk)| {
                let first = HEAD + c * CHUNK;
                if new.peek().is_none_or(|(id, _)| *id >= first + chunk.len()) {
                    return chunk.clone();
                }
                Arc::new(
                    (chunk.iter().enumerate())
                        .map(|(k, r)| match new.next_if(|(id, _)| *id == first + k) {
                            Some((_, n)) => n,
                            None => r.clone(),
                        })
                        .collect(),
                )
            })
            .collect()
    }
}

static NEXT_DB: AtomicU64 = AtomicU64::new(1);

/// Database options: `DbOptions::default()` and the `with_` setters (new
/// options may come, so it is not built field by field).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct DbOptions {
    /// How often the background collector looks for graveyard entries every
    /// consumer has processed (and frees old snapshots that readers handed
    /// back to a thread that has not freed them since). The thread starts
    /// with the first such work: a commit that leaves a graveyard entry, or
    /// a snapshot handed back. `None`: no background thread, readers free
    /// what they let go of last; call [`Db::collect_garbage`].
    pub gc_interval: Option<Duration>,
    /// Time one write transaction in this many per table (its lock hold
    /// and its commit, for [`Db::stats`] and the `metrics` histograms); 1
    /// times every one, 0 none. Lock waits are always timed, and every
    /// hold and commit is counted. Three clock reads were 9% of a
    /// single-row transaction (~60 of 675 ns on the 2-vCPU Intel VM).
    pub time_one_in: u32,
}

impl Default for DbOptions {
    fn default() -> Self {
        DbOptions {
            gc_interval: Some(Duration::from_millis(100)),
            time_one_in: 16,
        }
    }
}

impl DbOptions {
    /// Sets [`DbOptions::gc_interval`].
    pub fn with_gc_interval(mut self, every: Option<Duration>) -> Self {
        self.gc_interval = every;
        self
    }

    /// Sets [`DbOptions::time_one_in`].
    pub fn with_time_one_in(mut self, n: u32) -> Self {
        self.time_one_in = n;
        self
    }
}

/// Table options: `TableOptions::default()` and the `with_` setters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TableOptions {
    /// How index keys are stored (see [`KeyLayout`]).
    pub key_layout: KeyLayout,
}

impl TableOptions {
    /// Sets [`TableOptions::key_layout`].
    pub fn with_key_layout(mut self, layout: KeyLayout) -> Self {
        self.key_layout = layout;
        self
    }
}

/// Per-table figures, as [`Db::stats`] reports them.
#[derive(Clone, Debug, serde::Serialize)]
pub struct TableStats {
    /// Table name.
    pub name: String,
    /// Live objects.
    pub objects: usize,
    /// Current revision.
    pub revision: Revision,
    /// Deleted objects kept for change-stream consumers.
    pub graveyard: usize,
    /// The table keeps a revision index: built on first use (a change
    /// stream, a revision-order read), kept by every write from then on.
    pub revision_index: bool,
    /// Write-lock acquisitions and their waits (every one timed).
    pub lock_wait: Timings,
    /// Write-lock holds (aborts included) and the timed ones' durations.
    pub lock_hold: Timings,
    /// Commits that wrote the table and the timed ones' durations.
    pub commit: Timings,
}

/// The type-erased table operations the database runs itself.
pub(crate) trait TableOps: Send + Sync {
    fn meta(&self) -> &Arc<TableMeta>;
    /// (objects, revision, graveyard size, has a revision index) in `roots`.
    fn sizes(&self, roots: &Roots) -> (usize, Revision, usize, bool);
    /// Drops graveyard entries every consumer has processed; returns how
    /// many.
    fn collect(&self, db: &DbInner) -> usize;
}

/// Aligned so that the `Arc`'s counts (written by every write transaction)
/// do not share a line with the fields readers load on every read.
#[repr(align(128))]
pub(crate) struct DbInner {
    pub(crate) uid: u64,
    /// The latest committed roots and their swap count, on lines of their
    /// own (the retired list and the counts beside them are written far
    /// more often than they change); the lock that orders commits (the
    /// cell's writer) on the next pair.
    pub(crate) root: RootCell<Roots>,
    pub(crate) tables: RwLock<Vec<Arc<dyn TableOps>>>,
    pub(crate) gc_thread: Mutex<Option<Thread>>,
    pub(crate) closing: AtomicBool,
    /// Old snapshots a reader let go of last that another thread
    /// published, by publishing thread ([`thread_tag`] modulo their
    /// number): that thread frees them, or the background thread when a
    /// box fills and on its rounds (see `retire`).
    pub(crate) mailboxes: Box<[CachePadded<Mailbox>]>,
    /// [`DbOptions::gc_interval`]: a collector is wanted (else everything is
    /// freed inline).
    pub(crate) gc_every: Option<Duration>,
    /// `start_collector` ran (the collector thread runs, unless it could
    /// not be spawned).
    pub(crate) collector_started: AtomicBool,
    /// This database, for the collector thread `start_collector` spawns.
    pub(crate) me: Weak<DbInner>,
    /// [`DbOptions::time_one_in`].
    time_one_in: u32,
}

impl Drop for DbInner {
    fn drop(&mut self) {
        self.closing.store(true, Ordering::SeqCst);
        if let Some(t) = self.gc_thread.lock().take() {
            t.unpark();
        }
    }
}

/// The database: a set of tables with atomic multi-table writes and
/// lock-free snapshot reads. Cheap to clone; clones share the database.
#[derive(Clone)]
pub struct Db {
    pub(crate) inner: Arc<DbInner>,
}

impl std::fmt::Debug for Db {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<String> = self
            .inner
            .tables
            .read()
            .iter()
            .map(|t| t.meta().name.clone())
            .collect();
        f.debug_struct("Db").field("tables", &names).finish()
    }
}

impl Default for Db {
    fn default() -> Self {
        Self::new()
    }
}

/// Checks a table or index name: 1 to 64 characters, a lowercase ASCII
/// letter first, then lowercase letters, digits, `_` or `-`.
pub(crate) fn validate_name(what: &'static str, name: &str) -> Result<()> {
    let err = |reason| {
        Err(Error::InvalidName {
            what,
            name: name.to_string(),
            reason,
        })
    };
    if name.is_empty() {
        return err("empty");
    }
    if name.len() > 64 {
        return err("longer than 64 bytes");
    }
    if !name.as_bytes()[0].is_ascii_lowercase() {
        return err("must start with a lowercase ASCII letter");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
    {
        return err("only lowercase ASCII letters, digits, '_' and '-' are allowed");
    }
    Ok(())
}

impl Db {
    /// A database with default options (a background collector every
    /// 100 ms).
    pub fn new() -> Self {
        Self::with_options(DbOptions::default())
    }

    /// A database with the given options.
    pub fn with_options(opts: DbOptions) -> Self {
        // The figures' clock calibrates itself once per process (~0.6 ms
        // here): on the first database, not inside its first write.
        let _ = Instant::now();
        let inner = Arc::new_cyclic(|me| DbInner {
            uid: NEXT_DB.fetch_add(1, Ordering::Relaxed),
            root: RootCell::new(SharedRoots::new(Roots::default())),
            tables: RwLock::new(Vec::new()),
            gc_thread: Mutex::new(None),
            closing: AtomicBool::new(false),
            mailboxes: (0..MAILBOXES)
                .map(|_| CachePadded::new(Mailbox::default()))
                .collect(),
            gc_every: opts.gc_interval,
            collector_started: AtomicBool::new(false),
            me: me.clone(),
            time_one_in: opts.time_one_in,
        });
        Db { inner }
    }

    /// Creates a table with a primary index (unique, one key per object) and
    /// secondary indexes. Names are checked (see the crate docs); each index
    /// joins exactly one table.
    pub fn create_table<T: Storable, K>(
        &self,
        name: &str,
        primary: &Index<T, K>,
        secondary: &[AnyIndex<T>],
    ) -> Result<Table<T>> {
        self.create_table_with(name, primary, secondary, TableOptions::default())
    }

    /// [`Db::create_table`] with options.
    pub fn create_table_with<T: Storable, K>(
        &self,
        name: &str,
        primary: &Index<T, K>,
        secondary: &[AnyIndex<T>],
        opts: TableOptions,
    ) -> Result<Table<T>> {
        validate_name("table", name)?;
        let p = primary.erase();
        if !p.inner.unique || !p.inner.single {
            return Err(Error::PrimaryNotUnique(p.name().to_string()));
        }
        let mut indexes = vec![p];
        indexes.extend(secondary.iter().cloned());
        for (i, ix) in indexes.iter().enumerate() {
            validate_name("index", ix.name())?;
            if indexes[..i].iter().any(|o| o.name() == ix.name()) {
                return Err(Error::DuplicateIndex {
                    table: name.to_string(),
                    index: ix.name().to_string(),
                });
            }
            if ix.inner.slot.get().is_some() {
                return Err(Error::IndexInUse(ix.name().to_string()));
            }
        }
        let mut tables = self.inner.tables.write();
        if tables.iter().any(|t| t.meta().name == name) {
            return Err(Error::TableExists(name.to_string()));
        }
        let meta = Arc::new(TableMeta {
            db_uid: self.inner.uid,
            id: tables.len(),
            name: name.to_string(),
            metrics: CachePadded::new(TableMetrics::new(name)),
            layout: opts.key_layout,
            revisions_wanted: Default::default(),
        });
        let uid = Arc::as_ptr(&meta) as u64;
        for (pos, ix) in indexes.iter().enumerate() {
            if ix.inner.slot.set((uid, pos, opts.key_layout)).is_err() {
                return Err(Error::IndexInUse(ix.name().to_string()));
            }
        }
        let n = indexes.len();
        let unique_secondary = indexes.iter().skip(1).any(|ix| ix.is_unique());
        let inner = Arc::new(TableInner {
            lock: Arc::new(Mutex::new(WriterState::new(meta.clone()))),
            meta,
            indexes,
            layout: opts.key_layout,
            unique_secondary,
            empty_rare: Arc::new(crate::table::Rare::empty()),
        });
        {
            let w = self.inner.root.write();
            let roots = new_roots(|r| {
                w.current().successor_into(r, []);
                r.push(Arc::new(TableRoot::<T>::new(n)));
            });
            drop(w.swap(roots));
        }
        tables.push(inner.clone());
        Ok(Table { inner })
    }

    /// A consistent snapshot of every table: one atomic load, no lock.
    #[inline]
    pub fn read_txn(&self) -> ReadTxn {
        ReadTxn {
            db_uid: self.inner.uid,
            roots: self.inner.root.load_full(),
        }
    }

    /// A per-thread [`Reader`]: fresh snapshots without shared
    /// reference-count traffic while nothing is committed.
    pub fn reader(&self) -> Reader {
        // The count first: the snapshot is then at least as new as it.
        let version = self.inner.root.version();
        Reader {
            db: self.inner.clone(),
            version,
            txn: self.read_txn(),
        }
    }

    /// A write transaction locking `tables` (in table-id order, repetitions
    /// ignored: deadlock-free whatever the order). Blocks while another
    /// write transaction holds one of them. Do not open a second write
    /// transaction on a table from the thread already holding one. The
    /// transaction borrows the database and the table handles (it takes
    /// no reference count of its own); to finish it on another thread,
    /// use `std::thread::scope`.
    pub fn write_txn<'a>(&'a self, tables: &[&'a dyn AnyTable]) -> Result<WriteTxn<'a>> {
        let mut metas: SmallVec<[&'a dyn AnyTable; 4]> = SmallVec::new();
        for &t in tables {
            let m = t.meta();
            if m.db_uid != self.inner.uid {
                return Err(Error::ForeignTable(m.name.clone()));
            }
            metas.push(t);
        }
        metas.sort_unstable_by_key(|t| t.meta().id);
        metas.dedup_by_key(|t| t.meta().id);
        // Pushed into, not sized ahead: `with_capacity` builds the inline
        // vector apart and copies it.
        let mut locked = SmallVec::new();
        // By reference: the owning iterator moved the vector and checked
        // each step (~30 instructions for one table).
        for &t in metas.iter() {
            let (m, lock) = (t.meta(), t.lock());
            // Uncontended: no clock read for the wait. The hold's start is
            // read only when this hold is timed.
            let one_in = self.inner.time_one_in;
            let guard = match lock.try_lock() {
                Some(mut g) => {
                    m.metrics.lock_waited(Duration::ZERO);
                    g.begin_hold(one_in, Instant::now);
                    g
                }
                None => {
                    let t0 = Instant::now();
                    let mut g = lock_spinning(lock, t0);
                    let now = Instant::now();
                    m.metrics.lock_waited(now - t0);
                    g.begin_hold(one_in, || now);
                    g
                }
            };
            locked.push(Locked { guard, state: None });
        }
        Ok(WriteTxn {
            db: &self.inner,
            base: OnceCell::new(),
            locked,
            done: false,
            poisoned: false,
        })
    }

    /// Runs collection now, on this thread: frees the superseded versions
    /// waiting in every thread's mailbox (no reader holds them) and
    /// collects graveyards; returns how many deleted objects were dropped.
    pub fn collect_garbage(&self) -> usize {
        self.inner.free_mailboxes();
        self.inner.collect_garbage()
    }

    /// Whether the background collector thread was started: it starts
    /// with its first work (see [`DbOptions::gc_interval`]), so a database
    /// that never has anything to collect runs no thread of its own.
    pub fn collector_started(&self) -> bool {
        self.inner.collector_started.load(Ordering::Relaxed)
    }

    /// Figures for every table.
    pub fn stats(&self) -> Vec<TableStats> {
        let roots = self.inner.root.load_full();
        self.inner
            .tables
            .read()
            .iter()
            .map(|t| {
                let (objects, revision, graveyard, revision_index) = t.sizes(&roots);
                let m = &t.meta().metrics;
                TableStats {
                    name: t.meta().name.clone(),
                    objects,
                    revision,
                    graveyard,
                    revision_index,
                    lock_wait: m.lock_wait.snapshot(),
                    lock_hold: m.lock_hold.snapshot(),
                    commit: m.commit.snapshot(),
                }
            })
            .collect()
    }
}

/// Takes a table lock another writer holds: spins on it for about as long
/// as a few write transactions hold it, then parks. Parking and being woken
/// cost a futex call each and, on a virtual machine, an interprocessor
/// interrupt (several µs) while a single-row transaction holds the lock for
/// 1–2 µs; parking_lot's own spin gives up after a few dozen `pause`s.
fn lock_spinning(lock: &Mutex<WriterState>, since: Instant) -> MutexGuard<'_, WriterState> {
    let mut spins = 0u32;
    loop {
        // Read-only until it looks free, so spinning does not take the
        // holder's cache line away from it.
        if !lock.is_locked() {
            if let Some(g) = lock.try_lock() {
                return g;
            }
        }
        std::hint::spin_loop();
        spins += 1;
        if spins.is_multiple_of(32) && Instant::now() - since >= LOCK_SPIN {
            return lock.lock();
        }
    }
}

/// How long a waiting writer spins before it parks.
const LOCK_SPIN: Duration = Duration::from_micros(20);

impl DbInner {
    /// Publishes one table's new root (the caller holds its lock).
    pub(crate) fn publish_one(&self, id: usize, root: Arc<dyn Any + Send + Sync>) {
        let old = {
            let w = self.root.write();
            let roots = new_roots(|r| w.current().successor_into(r, [(id, root)]));
            w.swap(roots)
        };
        self.retire(old);
    }

    /// Commits the written tables of a write transaction: builds their new
    /// roots, swaps the root vector in under the commit lock, releases the
    /// table locks, then fires the watches.
    pub(crate) fn commit(db: &DbInner, locked: &mut SmallVec<[Locked<'_>; 4]>) -> SharedRoots {
        // Clock reads only for a timed hold (see `DbOptions::time_one_in`).
        let start = (locked.iter())
            .any(|l| l.guard.acquired.is_some() && l.state.is_some())
            .then(Instant::now);
        let mut done: SmallVec<[(usize, Finished); 4]> = SmallVec::new();
        for (i, l) in locked.iter_mut().enumerate() {
            if let Some(s) = l.state.take() {
                done.push((i, s.finish(&mut l.guard)));
            }
        }
        let (roots, old) = if done.is_empty() {
            (db.root.load_full(), None)
        } else {
            let w = db.root.write();
            for (i, f) in done.iter() {
                if let Some(r) = &f.root {
                    // SAFETY: published below, before the table's lock
                    // is released.
                    #[allow(unsafe_code)]
                    unsafe {
                        locked[*i].guard.published.set(r)
                    };
                }
            }
            // `locked` is in table-id order, and so is `done`.
            let new =
                (done.iter_mut()).filter_map(|(i, f)| Some((locked[*i].meta().id, f.root.take()?)));
            let roots = new_roots(|r| w.current().successor_into(r, new));
            // Freed or recycled below, after the locks.
            let old = w.swap(roots.clone());
            (roots, Some(old))
        };
        let released = now_if_timed(locked);
        // Figures first, while the locks are held (see `metrics.rs`).
        for (i, f) in done.iter() {
            let l = &locked[*i];
            let took = start.zip(released).filter(|_| l.guard.acquired.is_some());
            (l.meta().metrics).committed(
                took.map(|(s, r)| r - s),
                f.objects,
                f.revision,
                f.graveyard,
            );
        }
        for l in locked.drain(..) {
            l.release(released);
        }
        if done.iter().any(|(_, f)| f.graveyard > 0) {
            db.start_collector();
        }
        // The writer frees the superseded version itself when no reader
        // holds it: a few small nodes, cheaper here than handed to the
        // background thread (design.md, "Commit order", step 4). A reader
        // that lets go of an old snapshot last hands it to the thread that
        // published it (`retire`). Before the watches: the superseded nodes
        // are then the notifiers' alone, which fire them without a
        // compare-and-swap each.
        if let Some(old) = old {
            recycle(old);
        }
        db.free_own();
        // `done` is dropped here, in place (`drop(done)` first moved its
        // 264 bytes through `memcpy`): each `Finished` drops its notifier,
        // in table order.
        roots
    }
}

impl<T: Storable> TableOps for TableInner<T> {
    fn meta(&self) -> &Arc<TableMeta> {
        &self.meta
    }

    fn sizes(&self, roots: &Roots) -> (usize, Revision, usize, bool) {
        match roots
            .get(self.meta.id)
            .and_then(|r| r.downcast_ref::<TableRoot<T>>())
        {
            Some(r) => (
                r.indexes[0].len(),
                r.revision,
                r.graveyard_len(),
                r.revisions.is_some(),
            ),
            None => (0, 0, 0, false),
        }
    }

    fn collect(&self, db: &DbInner) -> usize {
        let id = self.meta.id;
        // Not from the roots: the collector thread then never loads them
        // while nothing is deleted (see `TableMetrics::graveyard_len`).
        if self.meta.metrics.graveyard_len() == 0 {
            return 0;
        }
        let mut guard = self.lock.lock();
        let low = guard.low_watermark();
        let roots = db.root.load_full();
        let Some(root) = roots.get(id).and_then(|r| r.downcast_ref::<TableRoot<T>>()) else {
            return 0;
        };
        let Some(rare) = &root.rare else {
            return 0;
        };
        let mut txn = rare.graveyard.txn();
        let mut n = 0;
        for (k, _) in rare.graveyard.iter() {
            let rev = crate::changes::decode_rev(k);
            if low.is_some_and(|l| rev > l) {
                break;
            }
            txn.delete(k);
            n += 1;
        }
        if n == 0 {
            return 0;
        }
        let (graveyard, notifier) = txn.commit_only();
        let left = graveyard.len();
        let mut new_root = root.clone();
        new_root.rare = Some(Arc::new(rare.replaced(Some(graveyard), None, None)));
        // Under the lock, as commits store theirs.
        self.meta.metrics.set_graveyard_len(left);
        let new_root: AnyRoot = Arc::new(new_root);
        // SAFETY: published next, under the table's lock (`guard`).
        #[allow(unsafe_code)]
        unsafe {
            guard.published.set(&new_root)
        };
        db.publish_one(id, new_root);
        self.meta.metrics.graveyard_size(left);
        drop(guard);
        drop(notifier);
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root(v: usize) -> AnyRoot {
        Arc::new(v)
    }

    fn value(r: &Roots, id: usize) -> Option<usize> {
        r.get(id).and_then(|a| a.downcast_ref::<usize>()).copied()
    }

    /// A successor copies the head and the chunks it writes; every other
    /// chunk is the same allocation.
    #[test]
    fn successor_shares_unwritten_chunks() {
        let mut r = Roots::default();
        for v in 0..40 {
            assert_eq!(r.len(), v);
            r.push(root(v));
        }
        assert_eq!(r.len(), 40);
        assert!((0..40).all(|v| value(&r, v) == Some(v)));
        assert_eq!(value(&r, 40), None);
        let same = |a: &Roots, b: &Roots, c: usize| Arc::ptr_eq(&a.chunks[c], &b.chunks[c]);
        // Head only: every chunk is shared.
        let s = r.successor([(1, root(100))]);
        assert!((0..4).all(|c| same(&r, &s, c)));
        assert_eq!((value(&s, 0), value(&s, 1)), (Some(0), Some(100)));
        // Table 12 lies in the second chunk (tables 10..18).
        let t = s.successor([(12, root(112))]);
        assert!(same(&s, &t, 0) && !same(&s, &t, 1) && same(&s, &t, 2) && same(&s, &t, 3));
        let want: Vec<usize> = (0..40)
            .map(|v| match v {
                1 => 100,
                12 => 112,
                v => v,
            })
            .collect();
        assert!((0..40).all(|v| value(&t, v) == Some(want[v])));
        // Several new roots: the head, two in one chunk, one in another.
        let u = t.successor([
            (0, root(200)),
            (12, root(212)),
            (13, root(213)),
            (30, root(230)),
        ]);
        assert!(same(&t, &u, 0) && !same(&t, &u, 1) && same(&t, &u, 2) && !same(&t, &u, 3));
        let mut want = want;
        for (id, v) in [(0, 200), (12, 212), (13, 213), (30, 230)] {
            want[id] = v;
        }
        assert!((0..40).all(|v| value(&u, v) == Some(want[v])));
        // The old versions are untouched.
        assert_eq!(value(&t, 13), Some(13));
        assert_eq!(value(&s, 12), Some(12));
        assert_eq!(value(&r, 1), Some(1));
    }
}
