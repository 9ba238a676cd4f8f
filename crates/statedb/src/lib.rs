//! `statedb`: an in-memory transactional database of immutable tables, built
//! on the persistent radix tree [`part`].
//!
//! A control plane keeps its desired and observed state here and reacts to
//! it:
//!
//! * a [`Db`] holds [`Table`]s; each table has a unique primary [`Index`] and
//!   any number of secondary indexes (unique or not);
//! * [`Db::read_txn`] is a consistent snapshot of every table, taken in O(1)
//!   without locks;
//! * [`Db::write_txn`] locks the tables it will write (deadlock-free, in table
//!   order) and commits them atomically; it reads its own writes, the
//!   tables it locked as of the lock and the others as of its first read
//!   of one;
//! * every query has a watch variant returning a [`Watch`] that fires when
//!   its result may have changed;
//! * every object carries the revision of its last write; [`Table::changes`]
//!   follows inserts, updates and deletes in revision order, keeping deleted
//!   objects in a graveyard only while some consumer still needs them
//!   ([`Changes::next`] copies a batch out, [`Changes::iter`] borrows it
//!   from the snapshot and may stop after any change);
//! * tables become initialized once every registered [`Initializer`] is
//!   done ([`Table::initialized_watch`]);
//! * per-table metrics go to the `metrics` facade ([`Db::stats`] has the same
//!   figures; lock holds and commits are timed in one write transaction in
//!   [`DbOptions::time_one_in`], 16 by default) and [`Table::to_json`]
//!   dumps a table.
//!
//! Reads go through [`Table::read`], which binds a table to a snapshot
//! (or a write transaction) and reports misuse there, once (a handle of
//! another database, a finished transaction: see [`Error::is_misuse`]);
//! its [`TableRead`] then answers every query with a plain `Option` or
//! iterator. The same queries on [`Table`] check their handles on every
//! call. Hot read loops can use a per-thread [`Reader`]; tables with small,
//! frequent writes on dense keys can choose [`KeyLayout::Nibbles`].
//! `docs/design.md` explains key encoding, locking, commit order and
//! graveyard collection.
//!
//! ```
//! use statedb::{Db, Index, Table};
//!
//! #[derive(Clone, Debug, PartialEq)]
//! struct Node { id: u64, name: String }
//!
//! # fn main() -> statedb::Result<()> {
//! let db = Db::new();
//! let by_id = Index::unique("id", |n: &Node| n.id);
//! let by_name = Index::unique("name", |n: &Node| n.name.clone());
//! let nodes: Table<Node> = db.create_table("nodes", &by_id, &[by_name.erase()])?;
//!
//! let mut txn = db.write_txn(&[&nodes])?;
//! nodes.insert(&mut txn, Node { id: 1, name: "a".into() })?;
//! let rtxn = txn.commit()?;
//!
//! let nodes_now = nodes.read(&rtxn)?; // the one check of the handles
//! let n = nodes_now.get(&by_name, "a").expect("inserted above");
//! assert_eq!(n.id, 1);
//! assert_eq!(n.revision(), 1);
//! assert!(nodes_now.get(&by_id, &2).is_none());
//! # Ok(())
//! # }
//! ```
#![deny(missing_docs, unsafe_op_in_unsafe_fn)]
#![deny(unsafe_code)]

mod changes;
mod db;
mod derive;
mod error;
#[cfg(feature = "http")]
pub mod http;
mod index;
mod init;
mod key;
mod metrics;
mod object;
// A table's published root by address: the crate's only unsafe type (its
// `set` is called, under the table's lock, in db.rs and txn.rs).
#[allow(unsafe_code)]
mod published;
mod read;
mod reclaim;
mod root;
mod table;
mod txn;
mod wait;

/// Traits users call but must not implement: the database relies on the
/// implementations it has (a table's locks and views, a snapshot's roots).
mod sealed {
    /// Implemented only inside this crate.
    pub trait Sealed {}
}

pub use changes::{Change, ChangeKind, ChangeRef, Changes, ChangesIter};
pub use db::{Db, DbOptions, TableOptions, TableStats};
pub use derive::{derive, Derivation, DeriveResult};
pub use error::{Error, JsonError};
pub use index::{AnyIndex, Index};
pub use init::Initializer;
pub use key::{escape_nonunique, key_family, IpPrefix, Key, KeyLayout};
pub use metrics::Timings;
pub use object::Object;
pub use part::{Watch, WatchSet};
pub use read::TableRead;
pub use table::{AnyTable, ByRevision, Obj, Objects, Storable, Table};
pub use triomphe;
pub use txn::{ReadTxn, Reader, TxnRead, WriteTxn};
pub use wait::wait_spin;

/// A table's revision counter: each write takes the next value.
pub type Revision = u64;

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
