//! Change streams and the graveyard.
//!
//! A consumer ([`Changes`]) registers a [`Tracker`] with the table (under the
//! table's write lock, through a write transaction). While any tracker is
//! alive, deleting an object also stores it in the table's graveyard under
//! its delete revision. A consumer reads, from a snapshot, the revision
//! index (live objects by last-write revision) merged with the graveyard,
//! both from its position on; then it records the snapshot's table
//! revision as processed. The collector drops graveyard entries at or below
//! the lowest processed revision of the live trackers (all of them when none
//! is left).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use part::{Scan, Watch};

use crate::object::Object;
use crate::table::{Storable, Table};
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
    pub object: Arc<Object<T>>,
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
        if let Some(s) = state {
            s.track_deletes = true;
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
    /// returned).
    pub fn next(&mut self, txn: &ReadTxn) -> Result<(Vec<Change<T>>, Watch)> {
        let root = txn.root(&self.table)?;
        let watch = root.revisions.root_watch();
        if root.revision <= self.pos {
            return Ok((Vec::new(), watch));
        }
        let from = Scan::LowerBound(crate::key::rev_key(self.pos + 1).to_vec());
        let mut live = root.revisions.scan(&from, false).peekable();
        let mut dead = root.graveyard.scan(&from, false).peekable();
        let mut out = Vec::new();
        loop {
            let take_live = match (live.peek(), dead.peek()) {
                (None, None) => break,
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (Some((a, _)), Some((b, _))) => a < b,
            };
            if take_live {
                if let Some((k, o)) = live.next() {
                    let revision = decode_rev(k);
                    let kind = if o.created_revision() == o.revision() {
                        ChangeKind::Insert
                    } else {
                        ChangeKind::Update
                    };
                    out.push(Change {
                        object: o.clone(),
                        revision,
                        kind,
                    });
                }
            } else if let Some((k, o)) = dead.next() {
                out.push(Change {
                    object: o.clone(),
                    revision: decode_rev(k),
                    kind: ChangeKind::Delete,
                });
            }
        }
        self.pos = root.revision;
        self.tracker
            .processed
            .fetch_max(root.revision, Ordering::AcqRel);
        Ok((out, watch))
    }

    /// The revision up to which changes were returned.
    pub fn position(&self) -> Revision {
        self.pos
    }
}
