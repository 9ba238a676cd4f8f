//! `Object`: a stored value with the revision of its last write.

use std::ops::Deref;

use crate::Revision;

/// An object as stored in a table: the value, the revision of its last
/// write and the revision that created it. Immutable; tables and snapshots
/// share it through an `Arc`. Dereferences to the value.
#[derive(Debug, PartialEq, Eq, serde::Serialize)]
pub struct Object<T> {
    value: T,
    revision: Revision,
    created: Revision,
}

impl<T> Object<T> {
    pub(crate) fn new(value: T, revision: Revision, created: Revision) -> Self {
        Object {
            value,
            revision,
            created,
        }
    }

    /// The value.
    pub fn value(&self) -> &T {
        &self.value
    }

    /// The revision of the object's last write.
    pub fn revision(&self) -> Revision {
        self.revision
    }

    /// The revision of the write that created it (its first insert since
    /// it last did not exist).
    pub fn created_revision(&self) -> Revision {
        self.created
    }
}

impl<T> Deref for Object<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.value
    }
}
