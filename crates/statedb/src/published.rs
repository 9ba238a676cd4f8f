//! A table's published root remembered by address under its lock: the
//! crate's one unsafe type.

use std::any::Any;
use std::ptr::NonNull;

/// A table's root as it was last published, remembered by address under
/// the table's lock, so that a write transaction's first write to the
/// table finds it without the commit lock (two locked instructions and the
/// lines the last committer wrote: the lock, the cell, the vector).
///
/// Why the address stays valid while the table's lock is held: the
/// current root vector holds a reference to the table's root, and another
/// table's commit builds its successor vector (taking its own reference)
/// before the old vector can go, so the count stays above zero. Only a
/// publication of *this* table's root can release it, and every one is
/// made under this table's lock, which records the new root here
/// ([`PublishedRoot::set`]). Table handles of a dropped database are
/// refused before any lookup (`Error::ForeignTable`), and a write
/// transaction holds its database, so the vector is alive when this is read.
#[derive(Default)]
pub(crate) struct PublishedRoot(Option<NonNull<dyn Any + Send + Sync>>);

// SAFETY: only an address; it is dereferenced only by the holder of the
// table's lock, while the root it names is alive (see the type's docs),
// and the root itself is `Send + Sync`.
unsafe impl Send for PublishedRoot {}

impl PublishedRoot {
    /// Records `root` as the table's published root.
    ///
    /// # Safety
    ///
    /// The caller holds the table's lock (this is its writer state) and
    /// `root` is, or is about to be made before the lock is released, the
    /// table's root in the database's published vector.
    pub(crate) unsafe fn set(&mut self, root: &std::sync::Arc<dyn Any + Send + Sync>) {
        self.0 = Some(NonNull::from(&**root));
    }

    /// The table's published root, if one was recorded. The lock guard's
    /// borrow bounds the reference: a new root is recorded through
    /// `&mut`, before the old one can be released.
    #[inline]
    pub(crate) fn get(&self) -> Option<&(dyn Any + Send + Sync)> {
        // SAFETY: see the type's docs: the root recorded by the last `set`
        // is the table's published one, kept alive by the current vector
        // for as long as the lock that `&self` is borrowed under is held.
        self.0.map(|p| unsafe { p.as_ref() })
    }
}
