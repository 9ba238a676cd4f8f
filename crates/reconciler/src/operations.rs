//! What the reconciler does to the external system: update an object,
//! delete one, prune what should not be there. Blocking ([`Operations`],
//! run on the reconciler's own thread) or async ([`AsyncOperations`], run
//! as a tokio task).

use std::future::Future;

use statedb::{Obj, Objects, ReadTxn, Revision};

/// An operation's failure: any error, kept as its message in the object's
/// [`crate::Status`].
pub type OpError = Box<dyn std::error::Error + Send + Sync>;

/// One object of a batch: the object, the revision of its change, and the
/// result the operation sets (`Ok` until it does).
#[derive(Debug)]
pub struct BatchEntry<T> {
    /// The object to update, or the last version of the deleted object.
    pub object: Obj<T>,
    /// The revision of the change (for a delete, the delete's).
    pub revision: Revision,
    /// What the operation did to this object.
    pub result: Result<(), OpError>,
}

impl<T> BatchEntry<T> {
    /// An entry whose result is `Ok` until set.
    pub fn new(object: Obj<T>, revision: Revision) -> Self {
        BatchEntry {
            object,
            revision,
            result: Ok(()),
        }
    }
}

/// Blocking operations on the external system. Each is called from the
/// reconciler's thread, one at a time, without any table lock held; `txn`
/// is the snapshot the objects come from (for reading other tables).
///
/// `update` and `delete` must be idempotent: the reconciler may repeat
/// them (after a failure, on refresh), and deleting what is gone succeeds.
pub trait Operations<T>: Send + 'static {
    /// Makes the external system hold `obj` as of `revision`.
    fn update(&mut self, txn: &ReadTxn, revision: Revision, obj: &T) -> Result<(), OpError>;

    /// Removes `obj` (its last version; `revision` is the delete's).
    fn delete(&mut self, txn: &ReadTxn, revision: Revision, obj: &T) -> Result<(), OpError>;

    /// Removes from the external system whatever is there but not among
    /// `desired` (every object of the table).
    fn prune(&mut self, txn: &ReadTxn, desired: Objects<'_, T>) -> Result<(), OpError>;

    /// Updates a batch, setting each entry's result. The default calls
    /// [`Operations::update`] per entry; override to batch.
    fn update_batch(&mut self, txn: &ReadTxn, batch: &mut [BatchEntry<T>]) {
        for e in batch {
            e.result = self.update(txn, e.revision, &e.object);
        }
    }

    /// Deletes a batch (run before a round's updates), setting each
    /// entry's result. The default calls [`Operations::delete`] per entry.
    fn delete_batch(&mut self, txn: &ReadTxn, batch: &mut [BatchEntry<T>]) {
        for e in batch {
            e.result = self.delete(txn, e.revision, &e.object);
        }
    }
}

/// [`Operations`] as futures, for a reconciler running as a tokio task
/// ([`crate::Reconciler::spawn`]). The same contract; implement with
/// `async fn`.
pub trait AsyncOperations<T: Sync>: Send + 'static {
    /// Makes the external system hold `obj` as of `revision`.
    fn update(
        &mut self,
        txn: &ReadTxn,
        revision: Revision,
        obj: &T,
    ) -> impl Future<Output = Result<(), OpError>> + Send;

    /// Removes `obj` (its last version; `revision` is the delete's).
    fn delete(
        &mut self,
        txn: &ReadTxn,
        revision: Revision,
        obj: &T,
    ) -> impl Future<Output = Result<(), OpError>> + Send;

    /// Removes whatever is there but not among `desired`.
    fn prune(
        &mut self,
        txn: &ReadTxn,
        desired: Objects<'_, T>,
    ) -> impl Future<Output = Result<(), OpError>> + Send;

    /// Updates a batch, setting each entry's result; by default one
    /// [`AsyncOperations::update`] after the other.
    fn update_batch(
        &mut self,
        txn: &ReadTxn,
        batch: &mut [BatchEntry<T>],
    ) -> impl Future<Output = ()> + Send
    where
        Self: Sized,
        T: Send,
    {
        async move {
            for e in batch {
                e.result = self.update(txn, e.revision, &e.object).await;
            }
        }
    }

    /// Deletes a batch, setting each entry's result; by default one
    /// [`AsyncOperations::delete`] after the other.
    fn delete_batch(
        &mut self,
        txn: &ReadTxn,
        batch: &mut [BatchEntry<T>],
    ) -> impl Future<Output = ()> + Send
    where
        Self: Sized,
        T: Send,
    {
        async move {
            for e in batch {
                e.result = self.delete(txn, e.revision, &e.object).await;
            }
        }
    }
}

/// Blocking operations seen as async ones: each future is ready when
/// made. Only for the reconciler's own thread, where blocking is fine.
pub(crate) struct Blocking<O>(pub(crate) O);

impl<T: Send + Sync, O: Operations<T>> AsyncOperations<T> for Blocking<O> {
    fn update(
        &mut self,
        txn: &ReadTxn,
        revision: Revision,
        obj: &T,
    ) -> impl Future<Output = Result<(), OpError>> + Send {
        std::future::ready(self.0.update(txn, revision, obj))
    }

    fn delete(
        &mut self,
        txn: &ReadTxn,
        revision: Revision,
        obj: &T,
    ) -> impl Future<Output = Result<(), OpError>> + Send {
        std::future::ready(self.0.delete(txn, revision, obj))
    }

    fn prune(
        &mut self,
        txn: &ReadTxn,
        desired: Objects<'_, T>,
    ) -> impl Future<Output = Result<(), OpError>> + Send {
        std::future::ready(self.0.prune(txn, desired))
    }

    fn update_batch(
        &mut self,
        txn: &ReadTxn,
        batch: &mut [BatchEntry<T>],
    ) -> impl Future<Output = ()> + Send {
        self.0.update_batch(txn, batch);
        std::future::ready(())
    }

    fn delete_batch(
        &mut self,
        txn: &ReadTxn,
        batch: &mut [BatchEntry<T>],
    ) -> impl Future<Output = ()> + Send {
        self.0.delete_batch(txn, batch);
        std::future::ready(())
    }
}
