//! Change streams and the graveyard.
//!
//! A consumer ([`Changes`]) registers a [`Tracker`] with the table (under the
//! table's write lock, through a write transaction). While any tracker is
//! alive, deleting an object also stores it in the table's graveyard under
//! its delete revision. A consumer reads, from a snapshot, the live objects
//! by last-write revision (the revision index, which registering makes the
//! table build, or the objects sorted in a snapshot from before it had one)
//! merged with the graveyard, both from its position on; then it records
//! the snapshot's table revision as processed. The collector drops
//! graveyard entries at or below the lowest processed revision of the live
//! trackers (all of them when none is left).

use std::iter::Peekable;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use part::Watch;

use crate::table::{ByRevision, Obj, Storable, Table, View};
use crate::txn::{ReadTxn, WriteTxn};
use crate::{Result, Revision};

/// A consumer's progress, seen by the collector.
#[derive(Debug)]
pub(crate) struct Tracker {
    processed: AtomicU64,
}

impl Tracker {
    pub(crate) fn processed(&self) -> Revision {
        self.processed.load(Ordering::Acquire)
    }
}

pub(crate) use crate::key::decode_rev;

/// What happened to an object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum ChangeKind {
    /// The write created the object (no version existed before it).
    Insert,
    /// The write replaced an existing version. A consumer may see an update
    /// as the first event of an object whose earlier versions were replaced
    /// before it read them.
    Update,
    /// The object was deleted.
    Delete,
}

/// One change: the object as written (or as it was when deleted) and the
/// change's revision.
#[derive(Debug)]
pub struct Change<T> {
    /// The object (for a delete, its last version).
    pub object: Obj<T>,
    /// The revision of the change (for a delete, the delete's revision).
    pub revision: Revision,
    /// Insert, update or delete.
    pub kind: ChangeKind,
}

impl<T> Clone for Change<T> {
    fn clone(&self) -> Self {
        Change {
            object: self.object.clone(),
            revision: self.revision,
            kind: self.kind,
        }
    }
}

impl<T> Change<T> {
    /// Whether the change is a delete.
    pub fn is_delete(&self) -> bool {
        self.kind == ChangeKind::Delete
    }
}

/// One change borrowed from a read transaction: what [`Changes::iter`]
/// yields. No reference count moves; [`ChangeRef::to_owned`] makes a
/// [`Change`] that outlives the snapshot.
#[derive(Debug)]
pub struct ChangeRef<'a, T> {
    /// The object (for a delete, its last version).
    pub object: &'a Obj<T>,
    /// The revision of the change (for a delete, the delete's revision).
    pub revision: Revision,
    /// Insert, update or delete.
    pub kind: ChangeKind,
}

impl<T> Clone for ChangeRef<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for ChangeRef<'_, T> {}

impl<T> ChangeRef<'_, T> {
    /// Whether the change is a delete.
    pub fn is_delete(&self) -> bool {
        self.kind == ChangeKind::Delete
    }

    /// The change with its own reference to the object.
    pub fn to_owned(&self) -> Change<T> {
        Change {
            object: self.object.clone(),
            revision: self.revision,
            kind: self.kind,
        }
    }
}

/// The changes a consumer has not seen yet, up to one snapshot, borrowed
/// from it ([`Changes::iter`]). Each change yielded advances the consumer;
/// dropped before the end, it leaves the consumer after the last change it
/// yielded, so the next call resumes there and nothing is lost.
pub struct ChangesIter<'a, T> {
    /// The live objects in revision order and the graveyard, from the
    /// position on; `None` when the snapshot holds nothing new.
    scans: Option<(Peekable<ByRevision<'a, T>>, Scan<'a, T>)>,
    pos: &'a mut Revision,
    tracker: &'a Tracker,
    /// The snapshot's table revision: the position once every change is out.
    end: Revision,
}

type Scan<'a, T> = Peekable<part::Iter<'a, Obj<T>>>;

impl<T> std::fmt::Debug for ChangesIter<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChangesIter")
            .field("pos", &*self.pos)
            .field("end", &self.end)
            .finish_non_exhaustive()
    }
}

impl<'a, T> Iterator for ChangesIter<'a, T> {
    type Item = ChangeRef<'a, T>;

    fn next(&mut self) -> Option<ChangeRef<'a, T>> {
        let Some((live, dead)) = &mut self.scans else {
            *self.pos = self.end;
            return None;
        };
        let take_live = match (live.peek(), dead.peek()) {
            (None, None) => {
                *self.pos = self.end;
                return None;
            }
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some(a), Some((b, _))) => a.revision() < decode_rev(b),
        };
        let change = if take_live {
            let object = live.next()?;
            let kind = if object.created_revision() == object.revision() {
                ChangeKind::Insert
            } else {
                ChangeKind::Update
            };
            ChangeRef {
                object,
                revision: object.revision(),
                kind,
            }
        } else {
            let (k, object) = dead.next()?;
            ChangeRef {
                object,
                revision: decode_rev(k),
                kind: ChangeKind::Delete,
            }
        };
        *self.pos = change.revision;
        Some(change)
    }
}

impl<T> Drop for ChangesIter<'_, T> {
    fn drop(&mut self) {
        // Everything up to the position was handed out: the collector may
        // drop those deletes.
        self.tracker
            .processed
            .fetch_max(*self.pos, Ordering::AcqRel);
    }
}

/// A change-stream consumer: yields every insert, update and delete of a
/// table in revision order. Consumers are independent; dropping one
/// releases the graveyard entries it was holding.
pub struct Changes<T> {
    table: Table<T>,
    tracker: Arc<Tracker>,
    pos: Revision,
}

impl<T> std::fmt::Debug for Changes<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Changes")
            .field("table", &self.table)
            .field("pos", &self.pos)
            .finish()
    }
}

impl<T: Storable> Table<T> {
    /// A consumer of every change from the beginning: first the objects
    /// that exist (as inserts or updates), then every later change.
    /// Registered through a write transaction that locked the table, so no
    /// delete can slip between registration and the first read.
    pub fn changes(&self, txn: &mut WriteTxn) -> Result<Changes<T>> {
        self.changes_since(txn, 0)
    }

    /// A consumer of the changes with revision `> since`. Deletes with
    /// revisions before the registration may already be collected.
    pub fn changes_since(&self, txn: &mut WriteTxn, since: Revision) -> Result<Changes<T>> {
        let (state, writer) = txn.writer_parts(self, false)?;
        let tracker = Arc::new(Tracker {
            processed: AtomicU64::new(since),
        });
        writer.trackers.push(Arc::downgrade(&tracker));
        // The consumer reads in revision order: a table state opened
        // before it builds its revision index now; one opened later does
        // (see `TableTxn::new_boxed`), and until then reads sort the objects.
        if let Some(s) = state {
            s.track_deletes = true;
            s.ensure_revisions();
        }
        Ok(Changes {
            table: self.clone(),
            tracker,
            pos: since,
        })
    }
}

impl<T: Storable> Changes<T> {
    /// The changes after the consumer's position up to the snapshot `txn`,
    /// in revision order, and a watch that fires when more are committed.
    /// Advances the position (and lets the collector drop the deletes
    /// returned). [`Changes::iter`] yields the same without copying.
    pub fn next(&mut self, txn: &ReadTxn) -> Result<(Vec<Change<T>>, Watch)> {
        let (it, watch) = self.iter(txn)?;
        Ok((it.map(|c| c.to_owned()).collect(), watch))
    }

    /// [`Changes::next`] borrowed from `txn`: the changes as they are read,
    /// with no reference count moved and no list built. Each change yielded
    /// advances the consumer; stopping early loses nothing (see
    /// [`ChangesIter`]).
    ///
    /// ```
    /// use statedb::{ChangeKind, Db, Index, Table};
    ///
    /// let db = Db::new();
    /// let id = Index::unique("id", |x: &u32| *x);
    /// let t: Table<u32> = db.create_table("t", &id, &[]).unwrap();
    /// let mut w = db.write_txn(&[&t]).unwrap();
    /// let mut changes = t.changes(&mut w).unwrap();
    /// t.insert(&mut w, 1).unwrap();
    /// t.insert(&mut w, 2).unwrap();
    /// t.delete(&mut w, &1).unwrap();
    /// let r = w.commit().unwrap();
    ///
    /// let (it, watch) = changes.iter(&r).unwrap();
    /// let seen: Vec<(u32, bool)> = it.map(|c| (*c.object.value(), c.kind == ChangeKind::Delete)).collect();
    /// assert_eq!(seen, [(2, false), (1, true)]);
    /// assert!(!watch.is_closed()); // fires on the next commit to `t`
    /// ```
    pub fn iter<'a>(&'a mut self, txn: &'a ReadTxn) -> Result<(ChangesIter<'a, T>, Watch)> {
        let root = txn.root(&self.table)?;
        let watch = root.changed_watch();
        let scans = (root.revision > self.pos).then(|| {
            let from = crate::key::rev_key(self.pos + 1);
            let from: &[u8] = &from;
            (
                View::Root(root)
                    .by_revision(self.pos + 1, &self.table.inner.meta)
                    .peekable(),
                (root.rare_or(&self.table.inner.empty_rare).graveyard)
                    .range(from..)
                    .peekable(),
            )
        });
        let end = root.revision.max(self.pos);
        Ok((
            ChangesIter {
                scans,
                pos: &mut self.pos,
                tracker: &self.tracker,
                end,
            },
            watch,
        ))
    }

    /// The revision up to which changes were returned.
    pub fn position(&self) -> Revision {
        self.pos
    }
}
