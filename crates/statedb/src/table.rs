//! Tables: the handle, the committed per-table root, the per-table write
//! state of a write transaction, and the writes (the queries are in
//! `read.rs`).

use std::any::Any;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use part::{Scan, Tree, Watch};
use quanta::Instant;
use smallvec::SmallVec;

use crate::changes::Tracker;
use crate::index::{AnyIndex, KeyBuf};
use crate::key::{expand, rev_key, stored, stored_len, Key, KeyLayout};
use crate::metrics::TableMetrics;
use crate::object::Object;
use crate::published::PublishedRoot;
use crate::txn::WriteTxn;
use crate::{Error, Result, Revision};
use crossbeam_utils::CachePadded;

/// A stored object as tables and snapshots share it: `triomphe`'s `Arc`,
/// which has no weak count (objects are immutable and never watched
/// through a weak reference), so the last release of a replaced object is
/// one locked instruction, not two, and each object 8 bytes smaller.
pub type Obj<T> = triomphe::Arc<Object<T>>;

/// A merge function of [`Table::modify`].
type Merge<'m, T> = &'m mut dyn FnMut(&T, T) -> T;

/// Bounds every object type stored in a table must meet.
pub trait Storable: Send + Sync + 'static {}
impl<T: Send + Sync + 'static> Storable for T {}

/// What a table's lock protects: state only writers touch. Aligned so that
/// it does not share a line with the lock word a waiting writer polls.
#[repr(align(128))]
pub struct WriterState {
    /// The table's metadata, reached through the lock guard: a write
    /// transaction holds the guard and no reference of its own (one count
    /// increment and decrement less per table per transaction).
    pub(crate) meta: Arc<TableMeta>,
    /// Change-stream consumers (dropped ones fail to upgrade).
    pub(crate) trackers: Vec<Weak<Tracker>>,
    pub(crate) next_init_id: u64,
    /// Key buffers the table's write transactions encode keys into, lent
    /// to each write through the lock guard (not moved into the
    /// transaction's state and back: two 136-byte copies per transaction),
    /// so a small transaction allocates none. Trimmed at each commit.
    pub(crate) keys: KeyScratch,
    /// Lock holds left before the next timed one (see
    /// [`crate::DbOptions::time_one_in`]).
    untimed: u32,
    /// When the current hold began, if it is timed. Kept here, under the
    /// lock, rather than in the transaction's entry for the table: 16
    /// bytes less to move with every write transaction.
    pub(crate) acquired: Option<Instant>,
    /// The table's root as last published, found by a write transaction's
    /// first write without the commit lock.
    pub(crate) published: PublishedRoot,
}

/// The key-encoding buffers of a table's write transaction.
#[derive(Default)]
pub(crate) struct KeyScratch {
    new_keys: Vec<KeyBuf>,
    old_keys: KeyBuf,
    /// The stored primary key of the object being written.
    pk: Vec<u8>,
    scratch: Vec<u8>,
}

/// Buffers larger than this are not kept between transactions: one write
/// of a huge key must not pin that much memory per table.
const KEEP_BYTES: usize = 4096;

impl KeyScratch {
    /// Drops the buffers grown past [`KEEP_BYTES`].
    fn trim(&mut self) {
        let trim = |v: &mut Vec<u8>| {
            if v.capacity() > KEEP_BYTES {
                *v = Vec::new();
            }
        };
        for k in self.new_keys.iter_mut().chain([&mut self.old_keys]) {
            trim(&mut k.bytes);
        }
        trim(&mut self.pk);
        trim(&mut self.scratch);
    }
}

impl WriterState {
    pub(crate) fn new(meta: Arc<TableMeta>) -> Self {
        WriterState {
            meta,
            trackers: Vec::new(),
            next_init_id: 0,
            keys: KeyScratch::default(),
            untimed: 0,
            acquired: None,
            published: PublishedRoot::default(),
        }
    }

    /// Whether this hold of the lock is to be timed: one in `one_in`, the
    /// first included (none if `one_in` is 0).
    pub(crate) fn timed(&mut self, one_in: u32) -> bool {
        if one_in == 0 {
            return false;
        }
        match self.untimed.checked_sub(1) {
            Some(n) => {
                self.untimed = n;
                false
            }
            None => {
                self.untimed = one_in - 1;
                true
            }
        }
    }

    /// Starts a hold of the lock: `now()` is its start if it is timed.
    pub(crate) fn begin_hold(&mut self, one_in: u32, now: impl FnOnce() -> Instant) {
        self.acquired = self.timed(one_in).then(now);
    }

    /// Whether some consumer is alive (drops the dead ones).
    pub(crate) fn has_trackers(&mut self) -> bool {
        self.trackers.retain(|t| t.strong_count() > 0);
        !self.trackers.is_empty()
    }

    /// The lowest revision every live consumer has processed, if any.
    pub(crate) fn low_watermark(&mut self) -> Option<Revision> {
        self.trackers.retain(|t| t.strong_count() > 0);
        self.trackers
            .iter()
            .filter_map(|t| t.upgrade())
            .map(|t| t.processed())
            .min()
    }
}

/// The non-generic part of a table. Aligned so that the `Arc`'s counts
/// (every write transaction clones it) sit on lines of their own, away from
/// the fields every read loads.
#[doc(hidden)]
#[repr(align(128))]
pub struct TableMeta {
    pub(crate) db_uid: u64,
    pub(crate) id: usize,
    pub(crate) name: String,
    /// Written by every write transaction: kept off the lines readers load.
    pub(crate) metrics: CachePadded<TableMetrics>,
    pub(crate) layout: KeyLayout,
    /// A reader asked for revision order from a snapshot without a
    /// revision index: the next write transaction on the table builds one.
    /// A hint only (a snapshot without the index answers from its objects),
    /// so `Relaxed`.
    pub(crate) revisions_wanted: AtomicBool,
}

/// A table of any object type: what [`crate::Db::write_txn`] locks.
/// Sealed: only [`Table`] implements it.
pub trait AnyTable: crate::sealed::Sealed {
    /// The table's name.
    fn name(&self) -> &str;
    #[doc(hidden)]
    fn meta(&self) -> &Arc<TableMeta>;
    #[doc(hidden)]
    fn lock(&self) -> &Arc<Mutex<WriterState>>;
}

pub(crate) struct TableInner<T> {
    pub(crate) meta: Arc<TableMeta>,
    /// The write lock, and the writer-only state it guards.
    pub(crate) lock: Arc<Mutex<WriterState>>,
    /// `[0]` is the primary index.
    pub(crate) indexes: Vec<AnyIndex<T>>,
    pub(crate) layout: KeyLayout,
    /// Some secondary index is unique: every write must look the old
    /// object up before it writes (see `TableTxn::upsert`).
    pub(crate) unique_secondary: bool,
    /// The rare parts of a table that never wrote them: what a root
    /// without any (`TableRoot::rare` of `None`) stands for, and what the
    /// first transaction to write them starts from (so that its commit
    /// fires the watches readers of such a root took here).
    pub(crate) empty_rare: Arc<Rare<T>>,
}

/// A typed handle to a table of objects `T`. Cheap to clone.
pub struct Table<T> {
    pub(crate) inner: Arc<TableInner<T>>,
}

impl<T> Clone for Table<T> {
    fn clone(&self) -> Self {
        Table {
            inner: self.inner.clone(),
        }
    }
}

impl<T> std::fmt::Debug for Table<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Table")
            .field("name", &self.inner.meta.name)
            .field("indexes", &self.inner.indexes)
            .finish()
    }
}

impl<T> crate::sealed::Sealed for Table<T> {}

impl<T> AnyTable for Table<T> {
    fn name(&self) -> &str {
        &self.inner.meta.name
    }
    fn meta(&self) -> &Arc<TableMeta> {
        &self.inner.meta
    }
    fn lock(&self) -> &Arc<Mutex<WriterState>> {
        &self.inner.lock
    }
}

/// A table's committed state: one tree per index, the revision index, the
/// graveyard and the initialization state. Immutable; cloned in O(1).
#[doc(hidden)]
pub struct TableRoot<T> {
    pub(crate) indexes: SmallVec<[Tree<Obj<T>>; 2]>,
    /// Revision (big-endian) -> live object last written at it. Built on
    /// first use (a change-stream consumer, a revision-order read) and
    /// kept from then on; until then writes skip it.
    pub(crate) revisions: Option<Tree<Obj<T>>>,
    pub(crate) revision: Revision,
    /// `None` until the table first writes a graveyard entry or an
    /// initializer (then the table's `empty_rare` stands for it): a
    /// transaction on such a table takes and releases no count for it.
    pub(crate) rare: Option<Arc<Rare<T>>>,
}

/// The parts of a table's state few transactions write, behind one count
/// (and none while the table never wrote them): a transaction that leaves
/// them alone takes and hands on at most one reference instead of three
/// (each a locked instruction on a line other writers and the freeing of
/// old roots also touch).
pub(crate) struct Rare<T> {
    /// Delete revision (big-endian) -> deleted object.
    pub(crate) graveyard: Tree<Obj<T>>,
    /// Holds the key `b""` while some initializer is pending.
    pub(crate) init: Tree<()>,
    pub(crate) pending: Vec<(u64, String)>,
}

impl<T> TableRoot<T> {
    /// A watch that fires on the table's next write: every write replaces
    /// the primary index's root (an object write is a new leaf there).
    pub(crate) fn changed_watch(&self) -> Watch {
        self.indexes[0].root_watch()
    }
}

impl<T> Clone for TableRoot<T> {
    fn clone(&self) -> Self {
        TableRoot {
            indexes: self.indexes.clone(),
            revisions: self.revisions.clone(),
            revision: self.revision,
            rare: self.rare.clone(),
        }
    }
}

fn root_only() -> part::Options {
    part::Options {
        root_only_watch: true,
    }
}

impl<T> TableRoot<T> {
    pub(crate) fn new(n_indexes: usize) -> Self {
        TableRoot {
            indexes: (0..n_indexes).map(|_| Tree::new()).collect(),
            revisions: None,
            revision: 0,
            rare: None,
        }
    }

    /// Deleted objects kept (none while the table has no rare parts).
    pub(crate) fn graveyard_len(&self) -> usize {
        self.rare.as_ref().map_or(0, |r| r.graveyard.len())
    }

    /// The rare parts, `empty` (the table's) while it has none.
    pub(crate) fn rare_or<'a>(&'a self, empty: &'a Rare<T>) -> &'a Rare<T> {
        self.rare.as_deref().unwrap_or(empty)
    }
}

impl<T> Rare<T> {
    /// A table's rare parts before it writes any.
    pub(crate) fn empty() -> Self {
        Rare {
            graveyard: Tree::with_options(root_only()),
            init: Tree::new(),
            pending: Vec::new(),
        }
    }
}

/// A read-only view of a tree: committed, or inside a write transaction.
pub(crate) enum TreeRef<'a, V> {
    Tree(&'a Tree<V>),
    Txn(&'a part::Txn<V>),
}

impl<'a, V: Clone> TreeRef<'a, V> {
    #[inline(always)]
    pub(crate) fn get(&self, k: &[u8]) -> Option<&'a V> {
        match *self {
            TreeRef::Tree(t) => t.get(k),
            TreeRef::Txn(t) => t.get(k),
        }
    }
    pub(crate) fn scan(&self, s: &Scan, rev: bool) -> part::Iter<'a, V> {
        match *self {
            TreeRef::Tree(t) => t.scan(s, rev),
            TreeRef::Txn(t) => t.scan(s, rev),
        }
    }
    pub(crate) fn len(&self) -> usize {
        match *self {
            TreeRef::Tree(t) => t.len(),
            TreeRef::Txn(t) => t.len(),
        }
    }
}

/// A table as one transaction sees it.
#[doc(hidden)]
pub enum View<'a, T> {
    /// Committed state.
    Root(&'a TableRoot<T>),
    /// The write transaction's own state.
    Txn(&'a TableTxn<T>),
}

impl<T> Clone for View<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for View<'_, T> {}

impl<'a, T> View<'a, T> {
    #[inline]
    pub(crate) fn index(&self, i: usize) -> TreeRef<'a, Obj<T>> {
        match *self {
            View::Root(r) => TreeRef::Tree(&r.indexes[i]),
            View::Txn(t) => TreeRef::Txn(&t.indexes[i]),
        }
    }
    /// The revision index, if the table has one yet.
    pub(crate) fn revisions(&self) -> Option<TreeRef<'a, Obj<T>>> {
        match *self {
            View::Root(r) => r.revisions.as_ref().map(TreeRef::Tree),
            View::Txn(t) => t.revisions.as_deref().map(TreeRef::Txn),
        }
    }

    /// Live objects last written at revision `>= from`, in revision order:
    /// from the revision index, or, without one, the objects sorted (and
    /// `meta` asks the next writer to build the index).
    pub(crate) fn by_revision(&self, from: Revision, meta: &TableMeta) -> ByRevision<'a, T> {
        let it = match self.revisions() {
            Some(tree) => {
                RevSource::Index(tree.scan(&Scan::LowerBound(rev_key(from).to_vec()), false))
            }
            None => {
                meta.revisions_wanted.store(true, Ordering::Relaxed);
                let objects = self.index(0).scan(&Scan::All, false);
                RevSource::Sorted(sorted_by_revision(objects, from).into_iter())
            }
        };
        ByRevision { it }
    }
    /// The graveyard (`None`: the table never had one, so it is empty).
    pub(crate) fn graveyard(&self) -> Option<TreeRef<'a, Obj<T>>> {
        match *self {
            View::Root(r) => r.rare.as_ref().map(|x| TreeRef::Tree(&x.graveyard)),
            View::Txn(t) => t.rare.as_ref().map(|x| t.graveyard.view(&x.graveyard)),
        }
    }
    pub(crate) fn revision(&self) -> Revision {
        match *self {
            View::Root(r) => r.revision,
            View::Txn(t) => t.revision,
        }
    }
    pub(crate) fn pending(&self) -> &'a [(u64, String)] {
        match *self {
            View::Root(r) => r.rare.as_ref().map_or(&[], |x| &x.pending),
            View::Txn(t) => t.pending(),
        }
    }
}

/// A write transaction's state for one table, created on its first write.
/// Its commit turns it, in place, into the notifier of what it superseded
/// (see [`TreeTxn`]).
#[doc(hidden)]
pub struct TableTxn<T> {
    pub(crate) indexes: SmallVec<[TreeTxn<Obj<T>>; 2]>,
    /// `None` while the table has no revision index.
    pub(crate) revisions: Option<TreeTxn<Obj<T>>>,
    pub(crate) revision: Revision,
    /// The committed rare parts: `None` while the table has none, until
    /// this transaction first writes one (then the table's empty ones);
    /// taken by the commit.
    rare: Option<Arc<Rare<T>>>,
    pub(crate) graveyard: LazyTxn<Obj<T>>,
    pub(crate) init: LazyTxn<()>,
    /// The initializers, once this transaction changed them.
    pending: Option<Vec<(u64, String)>>,
    /// Some consumer follows the table: deleted objects go to the graveyard.
    pub(crate) track_deletes: bool,
    layout: KeyLayout,
}

/// The committed rare parts a transaction writes over (its `rare`): the
/// table's empty ones (`empty`) if it has none yet.
fn rare_to_write<'a, T>(rare: &'a mut Option<Arc<Rare<T>>>, empty: &Arc<Rare<T>>) -> &'a Rare<T> {
    rare.get_or_insert_with(|| empty.clone())
}

impl<T> TableTxn<T> {
    /// The initializers pending as of this transaction's writes.
    pub(crate) fn pending(&self) -> &[(u64, String)] {
        match (&self.pending, &self.rare) {
            (Some(p), _) => p,
            (None, Some(r)) => &r.pending,
            (None, None) => &[],
        }
    }

    /// The pending initializers, to change.
    pub(crate) fn pending_mut(&mut self, empty: &Arc<Rare<T>>) -> &mut Vec<(u64, String)> {
        let rare = &mut self.rare;
        (self.pending).get_or_insert_with(|| rare_to_write(rare, empty).pending.clone())
    }

    /// Whether the initialization tree holds `key`.
    pub(crate) fn init_has(&self, key: &[u8]) -> bool {
        match &self.rare {
            Some(r) => self.init.get(&r.init, key).is_some(),
            None => false,
        }
    }
}

impl<T> Rare<T> {
    /// These parts with the given ones in place of theirs.
    pub(crate) fn replaced(
        &self,
        graveyard: Option<Tree<Obj<T>>>,
        init: Option<Tree<()>>,
        pending: Option<Vec<(u64, String)>>,
    ) -> Rare<T> {
        Rare {
            graveyard: graveyard.unwrap_or_else(|| self.graveyard.clone()),
            init: init.unwrap_or_else(|| self.init.clone()),
            pending: pending.unwrap_or_else(|| self.pending.clone()),
        }
    }
}

/// What a committed table write hands back to the database.
pub(crate) struct Finished {
    /// Taken (moved into the new root vector) by the commit.
    pub(crate) root: Option<Arc<dyn Any + Send + Sync>>,
    /// Fires the write's watches when dropped (after publication).
    #[allow(dead_code, reason = "held for its drop, which notifies")]
    pub(crate) notify: Box<dyn Send>,
    pub(crate) objects: usize,
    pub(crate) revision: Revision,
    pub(crate) graveyard: usize,
}

/// The type-erased write state stored in a write transaction.
pub(crate) trait TableTxnDyn: Send {
    fn as_any(&self) -> &dyn Any;
    fn as_any_mut(&mut self) -> &mut dyn Any;
    /// Builds the table's new root; trims the key buffers in `ws`.
    fn finish(self: Box<Self>, ws: &mut WriterState) -> Finished;
}

impl<T: Storable> TableTxnDyn for TableTxn<T> {
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
    fn finish(mut self: Box<Self>, ws: &mut WriterState) -> Finished {
        // Committed in place: the box, now holding the notifiers, is
        // handed on as the commit's notifier. Moving the transaction out of
        // its box and boxing the notifiers anew copied ~1 KiB per commit.
        let this = &mut *self;
        ws.keys.trim();
        let old = this.rare.take();
        let (graveyard, init) = (this.graveyard.commit(), this.init.commit());
        // Written parts were opened over `old` (`rare_to_write`), so a
        // change implies `Some`.
        let rare = match old {
            Some(old) if graveyard.is_some() || init.is_some() || this.pending.is_some() => {
                Some(Arc::new(old.replaced(graveyard, init, this.pending.take())))
            }
            old => old,
        };
        // Pushed, not collected: `collect`'s reserve-then-fill took ~45
        // instructions for a one-index table.
        let mut indexes = SmallVec::new();
        for t in this.indexes.iter_mut() {
            indexes.push(t.commit());
        }
        let root = TableRoot {
            indexes,
            revisions: this.revisions.as_mut().map(TreeTxn::commit),
            revision: this.revision,
            rare,
        };
        let graveyard = root.graveyard_len();
        // Before the roots holding it are published (see
        // `TableMetrics::set_graveyard_len`).
        ws.meta.metrics.set_graveyard_len(graveyard);
        Finished {
            objects: root.indexes[0].len(),
            revision: root.revision,
            graveyard,
            root: Some(Arc::new(root)),
            notify: self,
        }
    }
}

/// One tree's transaction within a [`TableTxn`]: open until the commit
/// turns it, in place, into the [`part::Notifier`] that closes the watches
/// it superseded once the new root is published (dropping it notifies).
pub(crate) enum TreeTxn<V> {
    Open(part::Txn<V>),
    Committed(#[allow(dead_code, reason = "held for its drop, which notifies")] part::Notifier<V>),
    /// Only inside [`TreeTxn::commit`].
    Moving,
}

impl<V: Clone> TreeTxn<V> {
    /// The new tree; `self` becomes its notifier.
    fn commit(&mut self) -> Tree<V> {
        let TreeTxn::Open(t) = std::mem::replace(self, TreeTxn::Moving) else {
            unreachable!("a table transaction commits once")
        };
        let (tree, n) = t.commit_only();
        *self = TreeTxn::Committed(n);
        tree
    }
}

impl<V> std::ops::Deref for TreeTxn<V> {
    type Target = part::Txn<V>;
    #[inline]
    fn deref(&self) -> &part::Txn<V> {
        match self {
            TreeTxn::Open(t) => t,
            _ => unreachable!("a committed table transaction is not used again"),
        }
    }
}

impl<V> std::ops::DerefMut for TreeTxn<V> {
    #[inline]
    fn deref_mut(&mut self) -> &mut part::Txn<V> {
        match self {
            TreeTxn::Open(t) => t,
            _ => unreachable!("a committed table transaction is not used again"),
        }
    }
}

/// A tree few transactions write (the graveyard, the initialization
/// state): nothing until the first write opens a boxed [`part::Txn`] on the
/// committed tree (`base`, in the table's [`Rare`] parts), so a transaction
/// that leaves it alone builds, commits and notifies nothing for it.
pub(crate) struct LazyTxn<V> {
    txn: Option<Box<TreeTxn<V>>>,
}

impl<V: Clone> LazyTxn<V> {
    fn new() -> Self {
        LazyTxn { txn: None }
    }

    /// The transaction, opened on `base` on first use.
    pub(crate) fn txn(&mut self, base: &Tree<V>) -> &mut part::Txn<V> {
        self.txn
            .get_or_insert_with(|| Box::new(TreeTxn::Open(base.txn())))
    }

    pub(crate) fn get<'a>(&'a self, base: &'a Tree<V>, key: &[u8]) -> Option<&'a V> {
        self.view(base).get(key)
    }

    fn view<'a>(&'a self, base: &'a Tree<V>) -> TreeRef<'a, V> {
        match &self.txn {
            Some(t) => TreeRef::Txn(t),
            None => TreeRef::Tree(base),
        }
    }

    /// The new tree if written (its transaction becomes its notifier).
    fn commit(&mut self) -> Option<Tree<V>> {
        self.txn.as_mut().map(|t| t.commit())
    }
}

/// The objects of a primary index's scan last written at revision
/// `>= from`, in revision order.
fn sorted_by_revision<'a, T: 'a>(
    objects: impl Iterator<Item = (&'a [u8], &'a Obj<T>)>,
    from: Revision,
) -> Vec<&'a Obj<T>> {
    let mut v: Vec<&Obj<T>> = objects
        .map(|(_, o)| o)
        .filter(|o| o.revision() >= from)
        .collect();
    v.sort_unstable_by_key(|o| o.revision());
    v
}

/// A revision index of `objects` (the live objects of a primary index),
/// inserted in revision order.
fn build_revisions<'a, T: 'a>(
    objects: impl Iterator<Item = (&'a [u8], &'a Obj<T>)>,
) -> TreeTxn<Obj<T>> {
    let mut t = Tree::with_options(root_only()).txn();
    for o in sorted_by_revision(objects, 0) {
        insert_rev(&mut t, o.revision(), o.clone());
    }
    TreeTxn::Open(t)
}

fn check_len(index: &AnyIndex<impl Sized>, len: usize) -> Result<()> {
    if len > part::MAX_KEY_LEN {
        Err(Error::KeyTooLong {
            index: index.name().to_string(),
            len,
            max: part::MAX_KEY_LEN,
        })
    } else {
        Ok(())
    }
}

/// Refuses a revision-checked write (`cas`) unless the object it replaces,
/// `old`, exists at the expected revision.
#[inline(always)]
fn check_revision<T>(
    old: Option<&Obj<T>>,
    cas: Option<Revision>,
) -> std::result::Result<(), Failure> {
    if let Some(expected) = cas {
        match old {
            None => return Err(Failure::Refused(Error::ObjectNotFound)),
            Some(o) if o.revision() != expected => {
                return Err(Failure::Refused(Error::RevisionMismatch {
                    expected,
                    found: o.revision(),
                }))
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// `value` merged into the object it replaces, `old`, by `merge`; refused
/// if the result's primary key is not `pk`, the written value's.
#[inline(always)]
fn merged<T>(
    primary: &AnyIndex<T>,
    pk: &KeyBuf,
    old: &Obj<T>,
    value: T,
    merge: Merge<'_, T>,
) -> std::result::Result<T, Failure> {
    let value = merge(old.value(), value);
    let mut k = KeyBuf::default();
    primary.keys_of(&value, &mut k);
    if k.get(0) != pk.get(0) {
        return Err(Failure::Refused(Error::MergeChangedKey));
    }
    Ok(value)
}

/// Why a table write failed: refused before anything changed (the
/// transaction goes on), or failed part-way, after its checks passed (the
/// transaction may hold half of the write, so it is poisoned: it refuses
/// further use and to commit). Only part's key-length error can fail a
/// tree write, and every key is checked against [`stored_len`] first, so
/// `PartWay` means a bug; it is not let through as a plain error.
pub(crate) enum Failure {
    /// Nothing was written.
    Refused(Error),
    /// Something may have been written.
    PartWay(Error),
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        Failure::Refused(e)
    }
}

/// A tree write's error past the checks, naming the index written.
fn part_way(index: &str) -> impl Fn(part::Error) -> Failure + '_ {
    move |e| Failure::PartWay(Error::from_part(e, index))
}

/// Writes `v` under revision `rev`'s key (the revision index, the
/// graveyard): 8 bytes, so no length limit refuses it.
fn insert_rev<V: Clone>(t: &mut part::Txn<V>, rev: Revision, v: V) {
    if t.insert(&rev_key(rev), v).is_err() {
        unreachable!("a revision key is 8 bytes");
    }
}

impl<T: Storable> TableTxn<T> {
    /// The table's write state on `root`, in its own allocation. The
    /// revision index is opened if the table has one; one that a consumer
    /// or a reader wants is built by [`TableTxn::ensure_revisions`], left
    /// to the caller (which holds the commit lock here).
    /// `keys`: the table's key buffers; `track_deletes`: whether some
    /// change consumer is alive ([`WriterState::has_trackers`]).
    pub(crate) fn new_boxed(
        root: &TableRoot<T>,
        keys: &mut KeyScratch,
        track_deletes: bool,
        layout: KeyLayout,
    ) -> Box<Self> {
        keys.new_keys
            .resize_with(root.indexes.len(), KeyBuf::default);
        // Written into the allocation, the trees' transactions pushed in
        // place: assembled on the stack and boxed, the state (456 bytes)
        // was copied twice per transaction, its index vector once more.
        let mut b = Box::write(
            Box::new_uninit(),
            TableTxn {
                indexes: SmallVec::new(),
                revisions: None,
                revision: root.revision,
                rare: root.rare.clone(),
                graveyard: LazyTxn::new(),
                init: LazyTxn::new(),
                pending: None,
                track_deletes,
                layout,
            },
        );
        for t in root.indexes.iter() {
            b.indexes.push(TreeTxn::Open(t.txn()));
        }
        b.revisions = root.revisions.as_ref().map(|t| TreeTxn::Open(t.txn()));
        b
    }

    /// The initialization tree's transaction, opened on first use.
    pub(crate) fn init_txn(&mut self, empty: &Arc<Rare<T>>) -> &mut part::Txn<()> {
        self.init.txn(&rare_to_write(&mut self.rare, empty).init)
    }

    /// The graveyard's transaction, opened on first use.
    fn graveyard_txn(&mut self, empty: &Arc<Rare<T>>) -> &mut part::Txn<Obj<T>> {
        self.graveyard
            .txn(&rare_to_write(&mut self.rare, empty).graveyard)
    }

    /// Builds the revision index from the transaction's objects if the
    /// table has none yet.
    pub(crate) fn ensure_revisions(&mut self) {
        if self.revisions.is_none() {
            self.revisions = Some(build_revisions(self.indexes[0].iter()));
        }
    }

    /// Inserts or replaces `value`; `merge` combines an existing object with
    /// it; `cas` requires the existing object's revision.
    ///
    /// Every check precedes the first tree change: the primary key
    /// ([`Self::primary_key`]), the old object's revision
    /// ([`check_revision`]), the merge ([`merged`]), the secondary keys and
    /// unique conflicts ([`Self::check_secondaries`]). Then the writes: the
    /// primary index ([`Self::write_primary`]), the revision index
    /// ([`Self::write_revision`]) and the secondary indexes
    /// ([`Self::write_secondaries`]). There is no graveyard step: only
    /// deletes write the graveyard.
    pub(crate) fn upsert(
        &mut self,
        keys: &mut KeyScratch,
        t: &TableInner<T>,
        mut value: T,
        merge: Option<Merge<'_, T>>,
        cas: Option<Revision>,
    ) -> std::result::Result<Option<Obj<T>>, Failure> {
        let idx = &t.indexes;
        self.primary_key(keys, &idx[0], &value)?;
        // A merge, a revision check or a unique secondary index needs the
        // old object before anything is written; a plain upsert learns it
        // from the primary index's write (one walk instead of two).
        let look_first = merge.is_some() || cas.is_some() || t.unique_secondary;
        let mut old = None;
        if look_first {
            old = self.indexes[0].get(&keys.pk).cloned();
            check_revision(old.as_ref(), cas)?;
            if let (Some(f), Some(o)) = (merge, &old) {
                value = merged(&idx[0], &keys.new_keys[0], o, value, f)?;
            }
        }
        self.check_secondaries(keys, t, &value, old.as_ref())?;
        // Past the checks: a tree write cannot fail (every key was checked
        // against `stored_len`); if one did, `Failure::PartWay` poisons the
        // transaction rather than leave half a write to commit.
        let rev = self.revision + 1;
        let kept = self.write_primary(keys, t, value, rev, look_first, &mut old)?;
        self.revision = rev;
        let Some(obj) = kept else {
            return Ok(old);
        };
        self.write_revision(old.as_ref(), rev, &obj);
        self.write_secondaries(keys, t, old.as_ref(), &obj)?;
        Ok(old)
    }

    /// Encodes `value`'s primary key into `keys.new_keys[0]`, checks its
    /// stored length and expands it into `keys.pk`.
    #[inline(always)]
    fn primary_key(
        &self,
        keys: &mut KeyScratch,
        primary: &AnyIndex<T>,
        value: &T,
    ) -> std::result::Result<(), Failure> {
        primary.keys_of(value, &mut keys.new_keys[0]);
        let pk = keys.new_keys[0].get(0);
        check_len(primary, stored_len(self.layout, true, pk, 0))?;
        keys.pk.clear();
        expand(self.layout, pk, &mut keys.pk);
        Ok(())
    }

    /// Encodes `value`'s secondary keys into `keys.new_keys[1..]` and checks
    /// each: its stored length, and for a unique index that no object but
    /// `old` (the one being replaced) holds it.
    #[inline(always)]
    fn check_secondaries(
        &self,
        keys: &mut KeyScratch,
        t: &TableInner<T>,
        value: &T,
        old: Option<&Obj<T>>,
    ) -> std::result::Result<(), Failure> {
        let pk_len = keys.new_keys[0].get(0).len();
        for (i, ix) in t.indexes.iter().enumerate().skip(1) {
            ix.keys_of(value, &mut keys.new_keys[i]);
            for k in keys.new_keys[i].iter() {
                check_len(ix, stored_len(self.layout, ix.is_unique(), k, pk_len))?;
                if ix.is_unique() {
                    let s = stored(self.layout, true, k, &[], &mut keys.scratch);
                    if let Some(e) = self.indexes[i].get(s) {
                        if old.is_none_or(|o| !triomphe::Arc::ptr_eq(e, o)) {
                            return Err(Failure::Refused(Error::UniqueConflict {
                                table: t.meta.name.clone(),
                                index: ix.name().to_string(),
                            }));
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Writes the new object of `value` at revision `rev` into the primary
    /// index under `keys.pk`; `old` is the object it replaces, looked up
    /// first if `looked_up`, else learned here from the primary index's
    /// write. Returns a handle on the new object for the other trees, if
    /// any takes it.
    #[inline(always)]
    fn write_primary(
        &mut self,
        keys: &KeyScratch,
        t: &TableInner<T>,
        value: T,
        rev: Revision,
        looked_up: bool,
        old: &mut Option<Obj<T>>,
    ) -> std::result::Result<Option<Obj<T>>, Failure> {
        let new = |old: Option<&Obj<T>>| {
            let created = old.map_or(rev, |o| o.created_revision());
            triomphe::Arc::new(Object::new(value, rev, created))
        };
        // A handle on the new object beside the primary index's only when
        // another tree takes it too: the clone and its drop were two
        // locked instructions of every primary-only write.
        let fan_out = self.revisions.is_some() || t.indexes.len() > 1;
        let name = t.indexes[0].name();
        if looked_up {
            let obj = new(old.as_ref());
            let kept = fan_out.then(|| obj.clone());
            self.indexes[0]
                .insert(&keys.pk, obj)
                .map_err(part_way(name))?;
            Ok(kept)
        } else {
            let mut kept = None;
            *old = self.indexes[0]
                .modify(&keys.pk, |o| {
                    let obj = new(o);
                    if fan_out {
                        kept = Some(obj.clone());
                    }
                    obj
                })
                .map_err(part_way(name))?;
            Ok(kept)
        }
    }

    /// Moves the object in the revision index, if the table has one: `old`'s
    /// entry out, `obj`'s in under `rev`.
    #[inline(always)]
    fn write_revision(&mut self, old: Option<&Obj<T>>, rev: Revision, obj: &Obj<T>) {
        if let Some(r) = &mut self.revisions {
            if let Some(o) = old {
                r.delete(&rev_key(o.revision()));
            }
            insert_rev(r, rev, obj.clone());
        }
    }

    /// Writes `obj` into each secondary index under the keys in
    /// `keys.new_keys[1..]`, deleting `old`'s keys that are not among them.
    #[inline(always)]
    fn write_secondaries(
        &mut self,
        keys: &mut KeyScratch,
        t: &TableInner<T>,
        old: Option<&Obj<T>>,
        obj: &Obj<T>,
    ) -> std::result::Result<(), Failure> {
        let pk = keys.new_keys[0].get(0);
        for (i, ix) in t.indexes.iter().enumerate().skip(1) {
            let unique = ix.is_unique();
            if let Some(o) = old {
                ix.keys_of(o.value(), &mut keys.old_keys);
                for k in keys.old_keys.iter() {
                    if !keys.new_keys[i].contains(k) {
                        let s = stored(self.layout, unique, k, pk, &mut keys.scratch);
                        self.indexes[i].delete(s);
                    }
                }
            }
            for k in keys.new_keys[i].iter() {
                let s = stored(self.layout, unique, k, pk, &mut keys.scratch);
                self.indexes[i]
                    .insert(s, obj.clone())
                    .map_err(part_way(ix.name()))?;
            }
        }
        Ok(())
    }

    /// Deletes the object with primary key `pk`.
    pub(crate) fn delete_pk(
        &mut self,
        keys: &mut KeyScratch,
        t: &TableInner<T>,
        pk: &[u8],
        cas: Option<Revision>,
    ) -> std::result::Result<Option<Obj<T>>, Failure> {
        keys.pk.clear();
        expand(self.layout, pk, &mut keys.pk);
        let Some(old) = self.indexes[0].get(&keys.pk).cloned() else {
            return match cas {
                Some(_) => Err(Failure::Refused(Error::ObjectNotFound)),
                None => Ok(None),
            };
        };
        if let Some(expected) = cas {
            if old.revision() != expected {
                return Err(Failure::Refused(Error::RevisionMismatch {
                    expected,
                    found: old.revision(),
                }));
            }
        }
        self.indexes[0].delete(&keys.pk);
        if let Some(r) = &mut self.revisions {
            r.delete(&rev_key(old.revision()));
        }
        for (i, ix) in t.indexes.iter().enumerate().skip(1) {
            ix.keys_of(old.value(), &mut keys.old_keys);
            for k in keys.old_keys.iter() {
                let s = stored(self.layout, ix.is_unique(), k, pk, &mut keys.scratch);
                self.indexes[i].delete(s);
            }
        }
        self.revision += 1;
        if self.track_deletes {
            let rev = self.revision;
            insert_rev(self.graveyard_txn(&t.empty_rare), rev, old.clone());
        }
        Ok(Some(old))
    }

    /// Deletes every object; returns how many.
    pub(crate) fn delete_all(&mut self, t: &TableInner<T>) -> std::result::Result<usize, Failure> {
        let n = self.indexes[0].len();
        if n == 0 {
            return Ok(0);
        }
        if self.track_deletes {
            let all: Vec<Obj<T>> = self.indexes[0].iter().map(|(_, v)| v.clone()).collect();
            for o in all {
                self.revision += 1;
                let rev = self.revision;
                insert_rev(self.graveyard_txn(&t.empty_rare), rev, o);
            }
        } else {
            self.revision += n as u64;
        }
        for t in self.indexes.iter_mut() {
            t.clear();
        }
        if let Some(r) = &mut self.revisions {
            r.clear();
        }
        Ok(n)
    }
}

/// Objects in revision order ([`Table::list_revision`]), borrowed from the
/// transaction: read from the table's revision index, or, in a snapshot
/// taken before the table had one, from its objects sorted by revision.
pub struct ByRevision<'a, T> {
    it: RevSource<'a, T>,
}

enum RevSource<'a, T> {
    Index(part::Iter<'a, Obj<T>>),
    Sorted(std::vec::IntoIter<&'a Obj<T>>),
}

impl<'a, T> Iterator for ByRevision<'a, T> {
    type Item = &'a Obj<T>;
    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        match &mut self.it {
            RevSource::Index(it) => it.next().map(|(_, v)| v),
            RevSource::Sorted(it) => it.next(),
        }
    }
}

impl<T> std::fmt::Debug for ByRevision<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ByRevision").finish_non_exhaustive()
    }
}

/// Objects yielded by a query, borrowed from the transaction.
pub struct Objects<'a, T> {
    it: part::Iter<'a, Obj<T>>,
}

impl<'a, T> Objects<'a, T> {
    /// Forward scans walk leaf runs (see [`part::Iter::stepwise`] for the
    /// measurements).
    pub(crate) fn new(it: part::Iter<'a, Obj<T>>) -> Self {
        Objects { it }
    }
}

impl<'a, T> Iterator for Objects<'a, T> {
    type Item = &'a Obj<T>;
    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        self.it.next().map(|(_, v)| v)
    }
}

impl<T> std::fmt::Debug for Objects<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Objects").finish_non_exhaustive()
    }
}

impl<T: Storable> Table<T> {
    /// The table's name.
    pub fn name(&self) -> &str {
        &self.inner.meta.name
    }

    /// How the table stores its index keys.
    pub fn key_layout(&self) -> KeyLayout {
        self.inner.layout
    }

    /// The table's indexes, the primary first.
    pub fn indexes(&self) -> &[AnyIndex<T>] {
        &self.inner.indexes
    }

    // ---- writes -------------------------------------------------------

    /// Inserts `obj`, replacing the object with the same primary key;
    /// returns the replaced object.
    pub fn insert(&self, txn: &mut WriteTxn, obj: T) -> Result<Option<Obj<T>>> {
        txn.with_table(self, |s, k| s.upsert(k, &self.inner, obj, None, None))
    }

    /// Inserts `obj`, or, if an object with its primary key exists, stores
    /// `merge(&existing, obj)` instead (it must keep the primary key).
    ///
    /// ```
    /// use statedb::{Db, Index, Table};
    ///
    /// let db = Db::new();
    /// let id = Index::unique("id", |c: &(u32, u32)| c.0);
    /// let counters: Table<(u32, u32)> = db.create_table("counters", &id, &[]).unwrap();
    /// let mut w = db.write_txn(&[&counters]).unwrap();
    /// for _ in 0..3 {
    ///     // Inserts (7, 1) the first time, then adds to the count.
    ///     counters.modify(&mut w, (7, 1), |old, new| (old.0, old.1 + new.1)).unwrap();
    /// }
    /// let r = w.commit().unwrap();
    /// assert_eq!(counters.get(&r, &id, &7).unwrap().unwrap().value(), &(7, 3));
    /// ```
    pub fn modify(
        &self,
        txn: &mut WriteTxn,
        obj: T,
        mut merge: impl FnMut(&T, T) -> T,
    ) -> Result<Option<Obj<T>>> {
        txn.with_table(self, |s, k| {
            s.upsert(k, &self.inner, obj, Some(&mut merge), None)
        })
    }

    /// Replaces the object with `obj`'s primary key only if its revision is
    /// `revision`.
    ///
    /// ```
    /// use statedb::{Db, Error, Index, Table};
    ///
    /// let db = Db::new();
    /// let id = Index::unique("id", |c: &(u32, &'static str)| c.0);
    /// let t: Table<(u32, &'static str)> = db.create_table("t", &id, &[]).unwrap();
    /// let mut w = db.write_txn(&[&t]).unwrap();
    /// t.insert(&mut w, (1, "a")).unwrap();
    /// let r = w.commit().unwrap();
    /// let seen = t.get(&r, &id, &1).unwrap().unwrap().revision();
    ///
    /// let mut w = db.write_txn(&[&t]).unwrap();
    /// t.compare_and_swap(&mut w, seen, (1, "b")).unwrap();
    /// // The object changed since `seen` was read: refused, nothing written.
    /// let e = t.compare_and_swap(&mut w, seen, (1, "c")).unwrap_err();
    /// assert!(matches!(e, Error::RevisionMismatch { .. }));
    /// let r = w.commit().unwrap();
    /// assert_eq!(t.get(&r, &id, &1).unwrap().unwrap().value().1, "b");
    /// ```
    pub fn compare_and_swap(
        &self,
        txn: &mut WriteTxn,
        revision: Revision,
        obj: T,
    ) -> Result<Obj<T>> {
        txn.with_table(self, |s, k| {
            s.upsert(k, &self.inner, obj, None, Some(revision))
                .and_then(|o| o.ok_or(Failure::Refused(Error::ObjectNotFound)))
        })
    }

    /// Deletes the object with `obj`'s primary key; returns it.
    pub fn delete(&self, txn: &mut WriteTxn, obj: &T) -> Result<Option<Obj<T>>> {
        let mut pk = KeyBuf::default();
        self.inner.indexes[0].keys_of(obj, &mut pk);
        txn.with_table(self, |s, k| s.delete_pk(k, &self.inner, pk.get(0), None))
    }

    /// Deletes the object with primary key `key`; returns it. `key` must
    /// encode like the primary index's key type (a `u64` for a `u64`
    /// index, a `&str` or `String` for a `String` index): a key of another
    /// built-in type is [`Error::KeyType`] (`delete_key(&mut w, &1)` on a
    /// `u32` index passes an `i32`), where a lookup through the index would
    /// not have compiled.
    pub fn delete_key<Q: Key + ?Sized>(
        &self,
        txn: &mut WriteTxn,
        key: &Q,
    ) -> Result<Option<Obj<T>>> {
        let (family, name) = self.inner.indexes[0].inner.key_type;
        if Q::FAMILY != family && Q::FAMILY != 0 && family != 0 {
            return Err(Error::KeyType {
                table: self.inner.meta.name.clone(),
                expected: name,
                got: std::any::type_name::<Q>(),
            });
        }
        let pk = key.to_key();
        txn.with_table(self, |s, k| s.delete_pk(k, &self.inner, &pk, None))
    }

    /// Deletes the object with `obj`'s primary key only if its revision is
    /// `revision`.
    pub fn compare_and_delete(
        &self,
        txn: &mut WriteTxn,
        revision: Revision,
        obj: &T,
    ) -> Result<Obj<T>> {
        let mut pk = KeyBuf::default();
        self.inner.indexes[0].keys_of(obj, &mut pk);
        txn.with_table(self, |s, k| {
            s.delete_pk(k, &self.inner, pk.get(0), Some(revision))
                .and_then(|o| o.ok_or(Failure::Refused(Error::ObjectNotFound)))
        })
    }

    /// Deletes every object; returns how many.
    pub fn delete_all(&self, txn: &mut WriteTxn) -> Result<usize> {
        txn.with_table(self, |s, _| s.delete_all(&self.inner))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scratch_keeps_small_buffers_and_drops_huge_ones() {
        let mut k = KeyScratch {
            new_keys: vec![KeyBuf::default(), KeyBuf::default()],
            ..KeyScratch::default()
        };
        k.new_keys[0].bytes.reserve(64);
        k.new_keys[1].bytes.reserve(KEEP_BYTES + 1);
        k.old_keys.bytes.reserve(KEEP_BYTES * 4);
        k.pk.reserve(32);
        k.scratch.reserve(1 << 20);
        k.trim();
        assert!(k.new_keys[0].bytes.capacity() >= 64);
        assert_eq!(k.new_keys[1].bytes.capacity(), 0);
        assert_eq!(k.old_keys.bytes.capacity(), 0);
        assert!(k.pk.capacity() >= 32);
        assert_eq!(k.scratch.capacity(), 0);
    }
}
