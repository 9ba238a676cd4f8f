//! Reads. [`Table::read`] binds a table to a transaction, checking the
//! handles once, and its [`TableRead`] answers queries with plain values;
//! the checked queries on [`Table`] check the handles (index included) on
//! every call and return `Result`s. Both run the same query bodies (the
//! `*_in` functions below), so they answer alike.
//!
//! A query never fails on its key: a key whose stored form is longer than
//! [`part::MAX_KEY_LEN`] cannot be in any index, and the trees answer it as
//! they answer any missing key (nothing found; `lower_bound` still yields
//! the keys above it).

use std::borrow::Borrow;
use std::ops::Bound;
use std::sync::Arc;

use part::{Scan, Tree, Watch};

use crate::index::Index;
use crate::key::{Key, KeyLayout};
use crate::table::{
    ByRevision, Obj, Objects, Rare, Storable, Table, TableInner, TableRoot, TreeRef, View,
};
use crate::txn::{ReadTxn, TxnRead};
use crate::{Error, Result, Revision};

impl<T> TableInner<T> {
    /// The table's identity, as its indexes record it when they join.
    #[inline]
    fn uid(&self) -> u64 {
        Arc::as_ptr(&self.meta) as u64
    }

    /// The position of `idx` in this table, if it belongs here.
    #[inline]
    fn position<K>(&self, idx: &Index<T, K>) -> Option<usize> {
        match idx.any().inner.slot.get() {
            Some(&(uid, pos, _)) if uid == self.uid() => Some(pos),
            _ => None,
        }
    }
}

/// A table bound to one transaction by [`Table::read`]: the database,
/// the snapshot and the transaction were checked once, there, so its
/// queries return plain answers (`Option`s, iterators, counts). What they
/// return borrows from the transaction for `'a` (and the view borrows the
/// table handle as long). `X` is the transaction's type: a [`ReadTxn`]
/// (the default; its view also has the watch variants) or a
/// [`crate::WriteTxn`], which sees its own writes (the view borrows it, so
/// it takes no writes while the view lives).
///
/// Index handles are fixed when a table is declared, so a query through an
/// index of another table is a bug in the program, not a condition to
/// handle: the queries that take an index panic on one (see their
/// `# Panics`). The checked queries on [`Table`] report it as
/// [`Error::IndexNotInTable`] instead.
///
/// Cheap to copy; binding costs one check of the handles, a query nothing
/// beyond finding the index's position.
pub struct TableRead<'a, T: Storable, X: TxnRead + 'a = ReadTxn> {
    table: &'a TableInner<T>,
    /// The table as the transaction holds it: for a [`ReadTxn`] its
    /// committed root, so no query dispatches on the kind of view.
    bound: X::Bound<'a, T>,
}

impl<'a, T: Storable, X: TxnRead + 'a> Clone for TableRead<'a, T, X> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<'a, T: Storable, X: TxnRead + 'a> Copy for TableRead<'a, T, X> {}

impl<'a, T: Storable, X: TxnRead + 'a> std::fmt::Debug for TableRead<'a, T, X> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TableRead")
            .field("table", &self.table.meta.name)
            .finish_non_exhaustive()
    }
}

/// The error of a checked query given an index of another table (out of
/// line: its two strings kept off the query's path).
#[cold]
#[inline(never)]
fn index_not_in_table(index: &str, table: &str) -> Error {
    Error::IndexNotInTable {
        index: index.to_string(),
        table: table.to_string(),
    }
}

/// The panic of a [`TableRead`] query given an index of another table.
#[cold]
#[inline(never)]
fn not_in_table(index: &str, table: &str) -> ! {
    panic!("index {index:?} does not belong to table {table:?}")
}

impl<'a, T: Storable, X: TxnRead + 'a> TableRead<'a, T, X> {
    #[inline(always)]
    fn view(&self) -> View<'a, T> {
        X::bound_view(self.bound)
    }

    /// The position of `idx`; panics if it belongs elsewhere.
    #[inline(always)]
    fn pos<K>(&self, idx: &Index<T, K>) -> usize {
        match self.table.position(idx) {
            Some(pos) => pos,
            None => not_in_table(idx.name(), &self.table.meta.name),
        }
    }

    #[inline(always)]
    fn tree<K>(&self, idx: &Index<T, K>) -> TreeRef<'a, Obj<T>> {
        self.view().index(self.pos(idx))
    }

    /// The table's name.
    pub fn name(&self) -> &'a str {
        &self.table.meta.name
    }

    /// Number of objects.
    pub fn len(&self) -> usize {
        self.view().index(0).len()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The table's revision: that of its last write.
    pub fn revision(&self) -> Revision {
        self.view().revision()
    }

    /// The object under `key` (the first one, by primary key, on a
    /// non-unique index); `None` also for a key too long to be stored.
    ///
    /// # Panics
    ///
    /// If `idx` is not an index of this table.
    #[inline(always)]
    pub fn get<K, Q>(&self, idx: &Index<T, K>, key: &Q) -> Option<&'a Obj<T>>
    where
        K: Borrow<Q>,
        Q: Key + ?Sized,
    {
        get_in(self.tree(idx), idx, self.table.layout, key)
    }

    /// Every object under `key`, by primary key (at most one on a unique
    /// index).
    ///
    /// # Panics
    ///
    /// If `idx` is not an index of this table.
    pub fn list<K, Q>(&self, idx: &Index<T, K>, key: &Q) -> Objects<'a, T>
    where
        K: Borrow<Q>,
        Q: Key + ?Sized,
    {
        list_in(self.tree(idx), idx, self.table.layout, key)
    }

    /// Objects whose key in `idx` starts with `prefix`, in key order. On a
    /// multi-key index an object appears once per matching key.
    ///
    /// # Panics
    ///
    /// If `idx` is not an index of this table.
    pub fn prefix<K, Q>(&self, idx: &Index<T, K>, prefix: &Q) -> Objects<'a, T>
    where
        K: Borrow<Q>,
        Q: Key + ?Sized,
    {
        prefix_in(self.tree(idx), idx, self.table.layout, prefix)
    }

    /// Objects whose key in `idx` is `>= key`, in key order.
    ///
    /// # Panics
    ///
    /// If `idx` is not an index of this table.
    pub fn lower_bound<K, Q>(&self, idx: &Index<T, K>, key: &Q) -> Objects<'a, T>
    where
        K: Borrow<Q>,
        Q: Key + ?Sized,
    {
        lower_bound_in(self.tree(idx), idx, self.table.layout, key)
    }

    /// Every object, in primary-key order.
    pub fn all(&self) -> Objects<'a, T> {
        all_in(self.view().index(0))
    }

    /// Objects last written at revision `>= from`, in revision order (see
    /// [`Table::list_revision`]).
    pub fn list_revision(&self, from: Revision) -> ByRevision<'a, T> {
        self.view().by_revision(from, &self.table.meta)
    }

    /// Number of deleted objects kept for change-stream consumers.
    pub fn graveyard_len(&self) -> usize {
        graveyard_len_in(self.view())
    }

    /// Whether every registered initializer is done.
    pub fn initialized(&self) -> bool {
        self.view().pending().is_empty()
    }
}

/// The watch variants: a watch comes from committed state, so these need
/// the view of a [`ReadTxn`].
impl<'a, T: Storable> TableRead<'a, T, ReadTxn> {
    #[inline(always)]
    fn committed<K>(&self, idx: &Index<T, K>) -> &'a Tree<Obj<T>> {
        &self.bound.indexes[self.pos(idx)]
    }

    /// [`TableRead::get`] and a watch that fires when its result may
    /// change.
    ///
    /// # Panics
    ///
    /// If `idx` is not an index of this table.
    pub fn get_watch<K, Q>(&self, idx: &Index<T, K>, key: &Q) -> (Option<&'a Obj<T>>, Watch)
    where
        K: Borrow<Q>,
        Q: Key + ?Sized,
    {
        get_watch_in(self.committed(idx), idx, self.table.layout, key)
    }

    /// [`TableRead::list`] and a watch that fires when its result may
    /// change.
    ///
    /// # Panics
    ///
    /// If `idx` is not an index of this table.
    pub fn list_watch<K, Q>(&self, idx: &Index<T, K>, key: &Q) -> (Objects<'a, T>, Watch)
    where
        K: Borrow<Q>,
        Q: Key + ?Sized,
    {
        list_watch_in(self.committed(idx), idx, self.table.layout, key)
    }

    /// [`TableRead::prefix`] and a watch that fires when its result may
    /// change.
    ///
    /// # Panics
    ///
    /// If `idx` is not an index of this table.
    pub fn prefix_watch<K, Q>(&self, idx: &Index<T, K>, prefix: &Q) -> (Objects<'a, T>, Watch)
    where
        K: Borrow<Q>,
        Q: Key + ?Sized,
    {
        prefix_watch_in(self.committed(idx), idx, self.table.layout, prefix)
    }

    /// [`TableRead::lower_bound`] and a watch that fires on any change to
    /// the index.
    ///
    /// # Panics
    ///
    /// If `idx` is not an index of this table.
    pub fn lower_bound_watch<K, Q>(&self, idx: &Index<T, K>, key: &Q) -> (Objects<'a, T>, Watch)
    where
        K: Borrow<Q>,
        Q: Key + ?Sized,
    {
        lower_bound_watch_in(self.committed(idx), idx, self.table.layout, key)
    }

    /// [`TableRead::all`] and a watch that fires on any change to the
    /// table.
    pub fn all_watch(&self) -> (Objects<'a, T>, Watch) {
        all_watch_in(&self.bound.indexes[0])
    }

    /// [`TableRead::list_revision`] and a watch that fires on the table's
    /// next write.
    pub fn list_revision_watch(&self, from: Revision) -> (ByRevision<'a, T>, Watch) {
        list_revision_watch_in(self.bound, from, self.table)
    }

    /// [`TableRead::initialized`] and a watch that fires when it may
    /// change.
    pub fn initialized_watch(&self) -> (bool, Watch) {
        initialized_watch_in(self.bound, &self.table.empty_rare)
    }
}

impl<T: Storable> Table<T> {
    /// Binds the table to `txn`: checks once that the table belongs to the
    /// transaction's database and snapshot and that the transaction is
    /// still open, and returns a view whose queries answer without
    /// `Result`s ([`TableRead`]). The checked queries below (`Table::get`
    /// and the rest) do the same checks on every call.
    ///
    /// # Errors
    ///
    /// Misuse only ([`Error::is_misuse`]): [`Error::ForeignTable`] (the
    /// table belongs to another database), [`Error::TableNotInSnapshot`]
    /// (the snapshot was taken before the table was created),
    /// [`Error::TxnDone`] (a committed or aborted write transaction).
    ///
    /// ```
    /// use statedb::{Db, Index, Table};
    ///
    /// # fn main() -> statedb::Result<()> {
    /// let db = Db::new();
    /// let id = Index::unique("id", |p: &(u32, &'static str)| p.0);
    /// let name = Index::non_unique("name", |p: &(u32, &'static str)| p.1);
    /// let pods: Table<(u32, &'static str)> = db.create_table("pods", &id, &[name.erase()])?;
    /// let mut w = db.write_txn(&[&pods])?;
    /// for p in [(1, "web"), (2, "web"), (3, "db")] {
    ///     pods.insert(&mut w, p)?;
    /// }
    /// let snapshot = w.commit()?;
    ///
    /// let view = pods.read(&snapshot)?;
    /// assert_eq!(view.get(&id, &3).map(|p| p.1), Some("db"));
    /// assert!(view.get(&id, &4).is_none());
    /// assert_eq!(view.list(&name, "web").map(|p| p.0).collect::<Vec<_>>(), [1, 2]);
    /// assert_eq!((view.len(), view.revision()), (3, 3));
    /// // With a watch that fires once the answer may have changed.
    /// let (db_pod, watch) = view.get_watch(&name, "db");
    /// assert!(db_pod.is_some() && !watch.is_closed());
    /// # Ok(())
    /// # }
    /// ```
    #[inline(always)]
    pub fn read<'a, X: TxnRead>(&'a self, txn: &'a X) -> Result<TableRead<'a, T, X>> {
        Ok(TableRead {
            table: &self.inner,
            bound: txn.bind(self)?,
        })
    }

    /// The position of `idx` in this table, or an error if it belongs
    /// elsewhere.
    #[inline]
    fn pos<K>(&self, idx: &Index<T, K>) -> Result<usize> {
        match idx.any().inner.slot.get() {
            Some(&(uid, pos, _)) if uid == self.inner.uid() => Ok(pos),
            _ => Err(index_not_in_table(idx.name(), self.name())),
        }
    }

    // ---- checked queries: each checks its handles ---------------------

    /// Number of objects.
    pub fn len(&self, txn: &impl TxnRead) -> Result<usize> {
        Ok(txn.view(self)?.index(0).len())
    }

    /// Whether the table is empty.
    pub fn is_empty(&self, txn: &impl TxnRead) -> Result<bool> {
        Ok(self.len(txn)? == 0)
    }

    /// The table's revision: that of its last write.
    pub fn revision(&self, txn: &impl TxnRead) -> Result<Revision> {
        Ok(txn.view(self)?.revision())
    }

    /// The object under `key` (the first one, by primary key, on a
    /// non-unique index).
    #[inline(always)]
    pub fn get<'a, K, Q>(
        &self,
        txn: &'a impl TxnRead,
        idx: &Index<T, K>,
        key: &Q,
    ) -> Result<Option<&'a Obj<T>>>
    where
        K: Borrow<Q>,
        Q: Key + ?Sized,
    {
        let pos = self.pos(idx)?;
        let tree = txn.view(self)?.index(pos);
        Ok(get_in(tree, idx, self.inner.layout, key))
    }

    /// [`Table::get`] and a watch that fires when its result may change.
    pub fn get_watch<'a, K, Q>(
        &self,
        txn: &'a ReadTxn,
        idx: &Index<T, K>,
        key: &Q,
    ) -> Result<(Option<&'a Obj<T>>, Watch)>
    where
        K: Borrow<Q>,
        Q: Key + ?Sized,
    {
        let pos = self.pos(idx)?;
        let tree = &txn.root(self)?.indexes[pos];
        Ok(get_watch_in(tree, idx, self.inner.layout, key))
    }

    /// Every object under `key`, by primary key (at most one on a unique
    /// index).
    pub fn list<'a, K, Q>(
        &self,
        txn: &'a impl TxnRead,
        idx: &Index<T, K>,
        key: &Q,
    ) -> Result<Objects<'a, T>>
    where
        K: Borrow<Q>,
        Q: Key + ?Sized,
    {
        let pos = self.pos(idx)?;
        let tree = txn.view(self)?.index(pos);
        Ok(list_in(tree, idx, self.inner.layout, key))
    }

    /// [`Table::list`] and a watch that fires when its result may change.
    pub fn list_watch<'a, K, Q>(
        &self,
        txn: &'a ReadTxn,
        idx: &Index<T, K>,
        key: &Q,
    ) -> Result<(Objects<'a, T>, Watch)>
    where
        K: Borrow<Q>,
        Q: Key + ?Sized,
    {
        let pos = self.pos(idx)?;
        let tree = &txn.root(self)?.indexes[pos];
        Ok(list_watch_in(tree, idx, self.inner.layout, key))
    }

    /// Objects whose key in `idx` starts with `prefix`, in key order. On a
    /// multi-key index an object appears once per matching key.
    pub fn prefix<'a, K, Q>(
        &self,
        txn: &'a impl TxnRead,
        idx: &Index<T, K>,
        prefix: &Q,
    ) -> Result<Objects<'a, T>>
    where
        K: Borrow<Q>,
        Q: Key + ?Sized,
    {
        let pos = self.pos(idx)?;
        let tree = txn.view(self)?.index(pos);
        Ok(prefix_in(tree, idx, self.inner.layout, prefix))
    }

    /// [`Table::prefix`] and a watch that fires when its result may change.
    pub fn prefix_watch<'a, K, Q>(
        &self,
        txn: &'a ReadTxn,
        idx: &Index<T, K>,
        prefix: &Q,
    ) -> Result<(Objects<'a, T>, Watch)>
    where
        K: Borrow<Q>,
        Q: Key + ?Sized,
    {
        let pos = self.pos(idx)?;
        let tree = &txn.root(self)?.indexes[pos];
        Ok(prefix_watch_in(tree, idx, self.inner.layout, prefix))
    }

    /// Objects whose key in `idx` is `>= key`, in key order.
    pub fn lower_bound<'a, K, Q>(
        &self,
        txn: &'a impl TxnRead,
        idx: &Index<T, K>,
        key: &Q,
    ) -> Result<Objects<'a, T>>
    where
        K: Borrow<Q>,
        Q: Key + ?Sized,
    {
        let pos = self.pos(idx)?;
        let tree = txn.view(self)?.index(pos);
        Ok(lower_bound_in(tree, idx, self.inner.layout, key))
    }

    /// [`Table::lower_bound`] and a watch that fires on any change to the
    /// index.
    pub fn lower_bound_watch<'a, K, Q>(
        &self,
        txn: &'a ReadTxn,
        idx: &Index<T, K>,
        key: &Q,
    ) -> Result<(Objects<'a, T>, Watch)>
    where
        K: Borrow<Q>,
        Q: Key + ?Sized,
    {
        let pos = self.pos(idx)?;
        let tree = &txn.root(self)?.indexes[pos];
        Ok(lower_bound_watch_in(tree, idx, self.inner.layout, key))
    }

    /// Every object, in primary-key order.
    pub fn all<'a>(&self, txn: &'a impl TxnRead) -> Result<Objects<'a, T>> {
        Ok(all_in(txn.view(self)?.index(0)))
    }

    /// [`Table::all`] and a watch that fires on any change to the table.
    pub fn all_watch<'a>(&self, txn: &'a ReadTxn) -> Result<(Objects<'a, T>, Watch)> {
        Ok(all_watch_in(&txn.root(self)?.indexes[0]))
    }

    /// Objects last written at revision `>= from`, in revision order.
    ///
    /// A table gets its revision index on first use: the first such read
    /// of a table without one sorts its objects (O(n log n)), and the next
    /// write transaction builds the index, which every later write keeps.
    pub fn list_revision<'a>(
        &self,
        txn: &'a impl TxnRead,
        from: Revision,
    ) -> Result<ByRevision<'a, T>> {
        Ok(txn.view(self)?.by_revision(from, &self.inner.meta))
    }

    /// [`Table::list_revision`] and a watch that fires on the table's next
    /// write.
    pub fn list_revision_watch<'a>(
        &self,
        txn: &'a ReadTxn,
        from: Revision,
    ) -> Result<(ByRevision<'a, T>, Watch)> {
        Ok(list_revision_watch_in(txn.root(self)?, from, &self.inner))
    }

    /// Number of deleted objects kept for change-stream consumers.
    pub fn graveyard_len(&self, txn: &impl TxnRead) -> Result<usize> {
        Ok(graveyard_len_in(txn.view(self)?))
    }

    /// Whether every registered initializer is done.
    pub fn initialized(&self, txn: &impl TxnRead) -> Result<bool> {
        Ok(txn.view(self)?.pending().is_empty())
    }

    /// Names of the initializers not yet done.
    pub fn pending_initializers(&self, txn: &impl TxnRead) -> Result<Vec<String>> {
        Ok(txn
            .view(self)?
            .pending()
            .iter()
            .map(|(_, n)| n.clone())
            .collect())
    }

    /// [`Table::initialized`] and a watch that fires when it may change.
    pub fn initialized_watch(&self, txn: &ReadTxn) -> Result<(bool, Watch)> {
        Ok(initialized_watch_in(
            txn.root(self)?,
            &self.inner.empty_rare,
        ))
    }

    /// Writes the table as JSON: `{"table", "revision", "objects": [{"revision",
    /// "object"}]}` in primary-key order.
    pub fn write_json(&self, txn: &impl TxnRead, w: impl std::io::Write) -> Result<()>
    where
        T: serde::Serialize,
    {
        #[derive(serde::Serialize)]
        struct Row<'a, T> {
            revision: Revision,
            object: &'a T,
        }
        #[derive(serde::Serialize)]
        struct Dump<'a, T> {
            table: &'a str,
            revision: Revision,
            objects: Vec<Row<'a, T>>,
        }
        let view = txn.view(self)?;
        let dump = Dump {
            table: self.name(),
            revision: view.revision(),
            objects: view
                .index(0)
                .scan(&Scan::All, false)
                .map(|(_, o)| Row {
                    revision: o.revision(),
                    object: o.value(),
                })
                .collect(),
        };
        serde_json::to_writer(w, &dump).map_err(Error::from)
    }

    /// The table as a JSON string; see [`Table::write_json`].
    pub fn to_json(&self, txn: &impl TxnRead) -> Result<String>
    where
        T: serde::Serialize,
    {
        let mut out = Vec::new();
        self.write_json(txn, &mut out)?;
        // serde_json writes UTF-8 only.
        Ok(String::from_utf8(out)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()))
    }
}

// ---- the query bodies, shared by both APIs ----------------------------

/// A point lookup. The common case, a unique index and a fixed-width key:
/// the stored key is built on the stack and the whole lookup inlines into
/// the caller (out of line, the call and the closure behind it cost ~35 of
/// a point read's ~240 instructions).
#[inline(always)]
fn get_in<'a, T, K, Q>(
    tree: TreeRef<'a, Obj<T>>,
    idx: &Index<T, K>,
    layout: KeyLayout,
    key: &Q,
) -> Option<&'a Obj<T>>
where
    K: Borrow<Q>,
    Q: Key + ?Sized,
{
    if let Some(k) = idx.fixed_point(layout, key, &mut [0u8; 32]) {
        return tree.get(k);
    }
    get_encoded(tree, idx, layout, key)
}

/// [`get_in`] for the keys [`Index::fixed_point`] does not build: encoded
/// through the per-thread scratch buffer, a non-unique index's first entry
/// by prefix.
#[inline(never)]
fn get_encoded<'a, T, K, Q>(
    tree: TreeRef<'a, Obj<T>>,
    idx: &Index<T, K>,
    layout: KeyLayout,
    key: &Q,
) -> Option<&'a Obj<T>>
where
    K: Borrow<Q>,
    Q: Key + ?Sized,
{
    idx.with_encoded_point(layout, key, |k| {
        if idx.is_unique() {
            tree.get(k)
        } else {
            tree.scan(&Scan::Prefix(k.to_vec()), false)
                .next()
                .map(|(_, v)| v)
        }
    })
}

fn get_watch_in<'a, T, K, Q>(
    tree: &'a Tree<Obj<T>>,
    idx: &Index<T, K>,
    layout: KeyLayout,
    key: &Q,
) -> (Option<&'a Obj<T>>, Watch)
where
    K: Borrow<Q>,
    Q: Key + ?Sized,
{
    idx.with_point(layout, key, |k| {
        if idx.is_unique() {
            tree.get_watch(k)
        } else {
            let (mut it, w) = tree.prefix_watch(k);
            (it.next().map(|(_, v)| v), w)
        }
    })
}

fn exact(k: Vec<u8>) -> Scan {
    Scan::Range(Bound::Included(k.clone()), Bound::Included(k))
}

fn list_in<'a, T, K, Q>(
    tree: TreeRef<'a, Obj<T>>,
    idx: &Index<T, K>,
    layout: KeyLayout,
    key: &Q,
) -> Objects<'a, T>
where
    K: Borrow<Q>,
    Q: Key + ?Sized,
{
    let k = idx.point(layout, key);
    let scan = if idx.is_unique() {
        exact(k)
    } else {
        Scan::Prefix(k)
    };
    Objects::new(tree.scan(&scan, false))
}

fn list_watch_in<'a, T, K, Q>(
    tree: &'a Tree<Obj<T>>,
    idx: &Index<T, K>,
    layout: KeyLayout,
    key: &Q,
) -> (Objects<'a, T>, Watch)
where
    K: Borrow<Q>,
    Q: Key + ?Sized,
{
    let k = idx.point(layout, key);
    if idx.is_unique() {
        let (_, w) = tree.get_watch(&k);
        (Objects::new(tree.scan(&exact(k), false)), w)
    } else {
        let (it, w) = tree.prefix_watch(&k);
        (Objects::new(it), w)
    }
}

fn prefix_in<'a, T, K, Q>(
    tree: TreeRef<'a, Obj<T>>,
    idx: &Index<T, K>,
    layout: KeyLayout,
    prefix: &Q,
) -> Objects<'a, T>
where
    K: Borrow<Q>,
    Q: Key + ?Sized,
{
    Objects::new(tree.scan(&Scan::Prefix(idx.prefix(layout, prefix)), false))
}

fn prefix_watch_in<'a, T, K, Q>(
    tree: &'a Tree<Obj<T>>,
    idx: &Index<T, K>,
    layout: KeyLayout,
    prefix: &Q,
) -> (Objects<'a, T>, Watch)
where
    K: Borrow<Q>,
    Q: Key + ?Sized,
{
    let (it, w) = tree.prefix_watch(&idx.prefix(layout, prefix));
    (Objects::new(it), w)
}

fn lower_bound_in<'a, T, K, Q>(
    tree: TreeRef<'a, Obj<T>>,
    idx: &Index<T, K>,
    layout: KeyLayout,
    key: &Q,
) -> Objects<'a, T>
where
    K: Borrow<Q>,
    Q: Key + ?Sized,
{
    Objects::new(tree.scan(&Scan::LowerBound(idx.prefix(layout, key)), false))
}

fn lower_bound_watch_in<'a, T, K, Q>(
    tree: &'a Tree<Obj<T>>,
    idx: &Index<T, K>,
    layout: KeyLayout,
    key: &Q,
) -> (Objects<'a, T>, Watch)
where
    K: Borrow<Q>,
    Q: Key + ?Sized,
{
    (
        Objects::new(tree.scan(&Scan::LowerBound(idx.prefix(layout, key)), false)),
        tree.root_watch(),
    )
}

fn all_in<T>(primary: TreeRef<'_, Obj<T>>) -> Objects<'_, T> {
    Objects::new(primary.scan(&Scan::All, false))
}

fn all_watch_in<T>(primary: &Tree<Obj<T>>) -> (Objects<'_, T>, Watch) {
    (
        Objects::new(primary.scan(&Scan::All, false)),
        primary.root_watch(),
    )
}

fn list_revision_watch_in<'a, T>(
    root: &'a TableRoot<T>,
    from: Revision,
    table: &TableInner<T>,
) -> (ByRevision<'a, T>, Watch) {
    (
        View::Root(root).by_revision(from, &table.meta),
        root.changed_watch(),
    )
}

fn graveyard_len_in<T>(view: View<'_, T>) -> usize {
    view.graveyard().map_or(0, |g| g.len())
}

fn initialized_watch_in<T>(root: &TableRoot<T>, empty: &Rare<T>) -> (bool, Watch) {
    let rare = root.rare_or(empty);
    let (_, w) = rare.init.get_watch(b"");
    (rare.pending.is_empty(), w)
}
