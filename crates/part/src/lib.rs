//! `part`: a persistent (copy-on-write) adaptive radix tree.
//!
//! * [`Tree`] is an immutable snapshot: clone it in O(1), read it from any
//!   number of threads, scan all keys, a prefix, a lower bound or a range,
//!   forwards or backwards. [`Tree::iter`] and friends borrow the tree (no
//!   reference counting); [`Tree::scan_owned`] and `into_iter` own their
//!   snapshot and may outlive the handle or cross threads.
//! * [`Txn`] builds the next version; each node is copied at most once per
//!   transaction, and [`Txn::commit`] leaves every older snapshot unchanged.
//! * [`Watch`]es from [`Tree::get_watch`] and [`Tree::prefix_watch`] fire once
//!   a later commit changes what the read depended on, and not for writes
//!   elsewhere: a point watch (on a present or a missing key) exactly when
//!   its key changes, an empty prefix's when a key under it comes, a prefix
//!   watch when a key under the prefix is written (design.md, "What
//!   fires"). A node that nobody watches carries no
//!   watch allocation at all. [`Options::root_only_watch`] keeps a single
//!   watch at the root instead.
//! * Memory: a node256 a transaction copies may keep the version it was
//!   copied from alive (it borrows that version's children, or its patches
//!   when it is a delta, instead of taking a reference on each), until
//!   every borrowed child is rewritten or the copy is freed. So a replaced
//!   value can outlive the last snapshot that showed it, by at most one
//!   version per node256.
//!
//! ```
//! use part::Tree;
//! let t = Tree::new();
//! let (t, _) = t.insert(b"hello", 1).unwrap();
//! let (v, watch) = t.get_watch(b"hello");
//! assert_eq!(v, Some(&1));
//! let mut txn = t.txn();
//! txn.insert(b"hello", 2).unwrap();
//! let t2 = txn.commit();
//! assert!(watch.is_closed());
//! assert_eq!(t.get(b"hello"), Some(&1)); // the old snapshot is unchanged
//! assert_eq!(t2.get(b"hello"), Some(&2));
//! ```
#![deny(missing_docs, unsafe_op_in_unsafe_fn)]

mod big;
mod bytes;
mod child;
mod finger;
mod iter;
mod lazy;
mod node;
mod patches;
mod simd;
mod slots;
mod sync;
mod tree;
mod txn;
mod watch;

/// Test hooks: the structural invariant checker and allocation counters
/// (feature `test-util`).
#[cfg(feature = "test-util")]
pub mod check;
#[cfg(all(test, not(feature = "test-util")))]
mod check;

pub use iter::{Entry, IntoIter, Iter, Scan};
pub use tree::{Options, Tree};
pub use txn::{Notifier, Txn};
pub use watch::{Changed, First, Watch, WatchSet};

/// Longest key accepted, in bytes.
pub const MAX_KEY_LEN: usize = 1 << 20;

/// Errors from tree operations.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The key is longer than [`MAX_KEY_LEN`].
    #[error("key of {len} bytes is longer than the maximum of {max}")]
    KeyTooLong {
        /// The key's length.
        len: usize,
        /// The maximum.
        max: usize,
    },
}
