//! What a reconciler reconciles: a table, how to find an object again by
//! its key, and where the object keeps this reconciler's status.

use std::hash::Hash;
use std::sync::Arc;

use statedb::{Index, Key, Table};

use crate::status::{Status, StatusSet};

type GetStatus<T> = dyn Fn(&T) -> &Status + Send + Sync;
type SetStatus<T> = dyn Fn(&T, Status) -> T + Send + Sync;
type KeyOf<T, K> = dyn Fn(&T) -> K + Send + Sync;

/// The table to reconcile and how to reach into its objects.
///
/// `key` must give the key `primary` indexes the object under (its
/// primary key, or that of any unique index): the reconciler finds an
/// object again through it, and keeps retries by it.
pub struct Target<T, K> {
    pub(crate) table: Table<T>,
    pub(crate) primary: Index<T, K>,
    pub(crate) key: Arc<KeyOf<T, K>>,
    pub(crate) get_status: Arc<GetStatus<T>>,
    pub(crate) set_status: Arc<SetStatus<T>>,
}

impl<T, K> Clone for Target<T, K> {
    fn clone(&self) -> Self {
        Target {
            table: self.table.clone(),
            primary: self.primary.clone(),
            key: self.key.clone(),
            get_status: self.get_status.clone(),
            set_status: self.set_status.clone(),
        }
    }
}

impl<T, K> std::fmt::Debug for Target<T, K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("table", &self.table)
            .field("primary", &self.primary)
            .finish_non_exhaustive()
    }
}

/// What the reconciler needs of a key: a statedb key it can also hash,
/// compare and print (in health reports).
pub trait ObjectKey: Key + Clone + Eq + Hash + std::fmt::Debug + Send + Sync + 'static {}
impl<K: Key + Clone + Eq + Hash + std::fmt::Debug + Send + Sync + 'static> ObjectKey for K {}

impl<T: statedb::Storable, K: ObjectKey> Target<T, K> {
    /// A table whose objects carry one [`Status`]: `status` reads it,
    /// `set_status` returns a copy of the object with it replaced.
    pub fn new(
        table: &Table<T>,
        primary: &Index<T, K>,
        key: impl Fn(&T) -> K + Send + Sync + 'static,
        status: impl Fn(&T) -> &Status + Send + Sync + 'static,
        set_status: impl Fn(&T, Status) -> T + Send + Sync + 'static,
    ) -> Self {
        Target {
            table: table.clone(),
            primary: primary.clone(),
            key: Arc::new(key),
            get_status: Arc::new(status),
            set_status: Arc::new(set_status),
        }
    }

    /// A table whose objects carry a [`StatusSet`] shared by several
    /// reconcilers; this one's entry is `name` (use the reconciler's
    /// [`crate::Config::name`]).
    pub fn with_status_set(
        table: &Table<T>,
        primary: &Index<T, K>,
        key: impl Fn(&T) -> K + Send + Sync + 'static,
        name: &str,
        statuses: fn(&T) -> &StatusSet,
        set_statuses: fn(&T, StatusSet) -> T,
    ) -> Self {
        let (n1, n2): (Arc<str>, Arc<str>) = (name.into(), name.into());
        Target {
            table: table.clone(),
            primary: primary.clone(),
            key: Arc::new(key),
            get_status: Arc::new(getter(move |o: &T| statuses(o).get(&n1))),
            set_status: Arc::new(move |o: &T, s: Status| set_statuses(o, statuses(o).set(&n2, s))),
        }
    }

    /// The table.
    pub fn table(&self) -> &Table<T> {
        &self.table
    }
}

/// Gives a closure the signature `for<'a> Fn(&'a T) -> &'a Status`.
fn getter<T, F: Fn(&T) -> &Status>(f: F) -> F {
    f
}
