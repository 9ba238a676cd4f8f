//! The crate's error type.

/// Everything that can go wrong: bad names, misuse of transactions and
/// handles, oversized keys, failed compare-and-swap.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A table or index name breaks the naming rules.
    #[error("invalid {what} name {name:?}: {reason}")]
    InvalidName {
        /// "table" or "index".
        what: &'static str,
        /// The offending name.
        name: String,
        /// Which rule it breaks.
        reason: &'static str,
    },
    /// A table of this name already exists in the database.
    #[error("table {0:?} already exists")]
    TableExists(String),
    /// Two indexes of one table share a name.
    #[error("table {table:?} has two indexes named {index:?}")]
    DuplicateIndex {
        /// The table.
        table: String,
        /// The repeated index name.
        index: String,
    },
    /// The index already belongs to another table.
    #[error("index {0:?} already belongs to a table")]
    IndexInUse(String),
    /// The index does not belong to this table.
    #[error("index {index:?} does not belong to table {table:?}")]
    IndexNotInTable {
        /// The index.
        index: String,
        /// The table it was used with.
        table: String,
    },
    /// A primary index must be unique.
    #[error("primary index {0:?} must be unique")]
    PrimaryNotUnique(String),
    /// The table belongs to another database.
    #[error("table {0:?} belongs to another database")]
    ForeignTable(String),
    /// The transaction's snapshot predates the table.
    #[error("table {0:?} is not in this transaction's snapshot")]
    TableNotInSnapshot(String),
    /// A primary key of another type than the table's primary index
    /// takes, where no index names the type ([`crate::Table::delete_key`]):
    /// it would encode differently and find nothing.
    #[error("table {table:?} has primary keys of type {expected}, not {got}")]
    KeyType {
        /// The table.
        table: String,
        /// The primary index's key type.
        expected: &'static str,
        /// The key type given.
        got: &'static str,
    },
    /// Writing a table the write transaction did not lock.
    #[error("table {0:?} is not locked by this write transaction")]
    TableNotLocked(String),
    /// The write transaction was already committed or aborted: it takes no
    /// more writes and answers no reads.
    #[error("the write transaction is already committed or aborted")]
    TxnDone,
    /// A key is longer than [`part::MAX_KEY_LEN`].
    #[error("key of {len} bytes in index {index:?} is longer than the maximum of {max}")]
    KeyTooLong {
        /// The index.
        index: String,
        /// The key's length.
        len: usize,
        /// The maximum.
        max: usize,
    },
    /// Another object already holds this key of a unique secondary index.
    #[error("unique index {index:?} of table {table:?} already holds this key for another object")]
    UniqueConflict {
        /// The table.
        table: String,
        /// The index.
        index: String,
    },
    /// The object to compare-and-swap or compare-and-delete does not exist.
    #[error("object not found")]
    ObjectNotFound,
    /// Compare-and-swap or compare-and-delete saw another revision.
    #[error("revision mismatch: expected {expected}, found {found}")]
    RevisionMismatch {
        /// The revision the caller expected.
        expected: u64,
        /// The object's current revision.
        found: u64,
    },
    /// The initializer was already marked done.
    #[error("initializer {0:?} is already done")]
    InitializerDone(String),
    /// The handle belongs to another table.
    #[error("initializer {init:?} belongs to table {table:?}")]
    InitializerTable {
        /// The initializer.
        init: String,
        /// Its table.
        table: String,
    },
    /// A merge function changed the object's primary key.
    #[error("the merge function changed the object's primary key")]
    MergeChangedKey,
    /// A panic interrupted a write of this transaction; it can only abort.
    #[error("a panic interrupted a write of this transaction; it can only be aborted")]
    Poisoned,
    /// An IP prefix length past the address width.
    #[error("prefix length {len} is longer than the address ({max} bits)")]
    InvalidPrefixLen {
        /// The length asked for.
        len: u8,
        /// The address width.
        max: u8,
    },
    /// Serializing a table to JSON failed (the serializer's error is the
    /// source).
    #[error("json: {0}")]
    Json(#[source] JsonError),
}

/// A `serde_json` error, shared so that [`Error`] stays `Clone`; two are
/// equal when their messages are.
#[derive(Debug, Clone)]
pub struct JsonError(pub std::sync::Arc<serde_json::Error>);

impl std::fmt::Display for JsonError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for JsonError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}

impl PartialEq for JsonError {
    fn eq(&self, other: &Self) -> bool {
        self.0.to_string() == other.0.to_string()
    }
}

impl Eq for JsonError {}

impl From<serde_json::Error> for Error {
    fn from(e: serde_json::Error) -> Self {
        Error::Json(JsonError(std::sync::Arc::new(e)))
    }
}

impl From<part::Error> for Error {
    fn from(e: part::Error) -> Self {
        match e {
            part::Error::KeyTooLong { len, max } => Error::KeyTooLong {
                index: String::new(),
                len,
                max,
            },
        }
    }
}
