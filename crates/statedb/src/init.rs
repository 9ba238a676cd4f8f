//! Table initialization: a table is initialized once every registered
//! initializer has marked itself done.
//!
//! The table root keeps the pending initializers and a one-key tree holding
//! `b""` while any is pending; a watch on that key fires when the table
//! becomes initialized (or, when it was, when a new initializer makes it
//! uninitialized again).

use std::sync::Arc;

use crate::table::{Storable, Table};
use crate::txn::WriteTxn;
use crate::{Error, Result};

/// A registered initializer of one table; mark it done with
/// [`Table::initializer_done`].
#[derive(Debug)]
pub struct Initializer {
    table_uid: u64,
    table: String,
    id: u64,
    name: String,
}

impl Initializer {
    /// The initializer's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl<T: Storable> Table<T> {
    fn table_uid(&self) -> u64 {
        Arc::as_ptr(&self.inner.meta) as u64
    }

    /// Registers an initializer: the table is not initialized until it is
    /// done. A write of the table.
    pub fn register_initializer(&self, txn: &mut WriteTxn, name: &str) -> Result<Initializer> {
        let uid = self.table_uid();
        let (state, writer) = txn.writer_parts(self, true)?;
        let Some(state) = state else {
            return Err(Error::TableNotLocked(self.name().to_string()));
        };
        let id = writer.next_init_id;
        writer.next_init_id += 1;
        let empty = &self.inner.empty_rare;
        state.pending_mut(empty).push((id, name.to_string()));
        if !state.init_has(b"") && state.init_txn(empty).insert(b"", ()).is_err() {
            unreachable!("the empty key fits");
        }
        Ok(Initializer {
            table_uid: uid,
            table: self.name().to_string(),
            id,
            name: name.to_string(),
        })
    }

    /// Marks `init` done. A write of the table.
    pub fn initializer_done(&self, txn: &mut WriteTxn, init: &Initializer) -> Result<()> {
        if init.table_uid != self.table_uid() {
            return Err(Error::InitializerTable {
                init: init.name.clone(),
                table: init.table.clone(),
            });
        }
        let (state, _) = txn.writer_parts(self, true)?;
        let Some(state) = state else {
            return Err(Error::TableNotLocked(self.name().to_string()));
        };
        let Some(pos) = state.pending().iter().position(|(id, _)| *id == init.id) else {
            return Err(Error::InitializerDone(init.name.clone()));
        };
        let empty = &self.inner.empty_rare;
        state.pending_mut(empty).remove(pos);
        if state.pending().is_empty() {
            state.init_txn(empty).delete(b"");
        }
        Ok(())
    }
}
