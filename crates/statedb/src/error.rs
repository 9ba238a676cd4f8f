//! The crate's error type.

/// Everything that can go wrong, in two kinds ([`Error::is_misuse`] tells
/// them apart).
///
/// **Misuse**: the program is wrong, whatever the data. Declarations
/// ([`InvalidName`](Error::InvalidName), [`TableExists`](Error::TableExists),
/// [`DuplicateIndex`](Error::DuplicateIndex),
/// [`IndexInUse`](Error::IndexInUse),
/// [`PrimaryNotUnique`](Error::PrimaryNotUnique)); handles used where they
/// do not belong ([`IndexNotInTable`](Error::IndexNotInTable),
/// [`ForeignTable`](Error::ForeignTable),
/// [`TableNotInSnapshot`](Error::TableNotInSnapshot),
/// [`TableNotLocked`](Error::TableNotLocked),
/// [`InitializerTable`](Error::InitializerTable),
/// [`KeyType`](Error::KeyType)); transactions used after they ended or
/// broke ([`TxnDone`](Error::TxnDone), [`Poisoned`](Error::Poisoned),
/// [`InitializerDone`](Error::InitializerDone)). Retrying cannot help; a
/// read reports these once, where [`crate::Table::read`] binds a table to a
/// transaction, and its queries then return plain answers.
///
/// **Outcomes**: a correct program meets these with some data, and handles
/// them: a write refused by the table's contents or by its own value
/// ([`UniqueConflict`](Error::UniqueConflict),
/// [`ObjectNotFound`](Error::ObjectNotFound),
/// [`RevisionMismatch`](Error::RevisionMismatch),
/// [`KeyTooLong`](Error::KeyTooLong),
/// [`MergeChangedKey`](Error::MergeChangedKey)), a value out of range
/// ([`InvalidPrefixLen`](Error::InvalidPrefixLen)), a dump that could not be
/// serialized ([`Json`](Error::Json)). Queries never return one: a query
/// key too long to be stored finds nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    // ---- misuse ---------------------------------------------------------
    /// Misuse: a table or index name breaks the naming rules.
    #[error("invalid {what} name {name:?}: {reason}")]
    InvalidName {
        /// "table" or "index".
        what: &'static str,
        /// The offending name.
        name: String,
        /// Which rule it breaks.
        reason: &'static str,
    },
    /// Misuse: a table of this name already exists in the database.
    #[error("table {0:?} already exists")]
    TableExists(String),
    /// Misuse: two indexes of one table share a name.
    #[error("table {table:?} has two indexes named {index:?}")]
    DuplicateIndex {
        /// The table.
        table: String,
        /// The repeated index name.
        index: String,
    },
    /// Misuse: the index already belongs to another table.
    #[error("index {0:?} already belongs to a table")]
    IndexInUse(String),
    /// Misuse: the index does not belong to this table.
    #[error("index {index:?} does not belong to table {table:?}")]
    IndexNotInTable {
        /// The index.
        index: String,
        /// The table it was used with.
        table: String,
    },
    /// Misuse: a primary index must be unique.
    #[error("primary index {0:?} must be unique")]
    PrimaryNotUnique(String),
    /// Misuse: the table belongs to another database.
    #[error("table {0:?} belongs to another database")]
    ForeignTable(String),
    /// Misuse: the transaction's snapshot predates the table (it was taken
    /// before the table's handle was returned: take a newer one).
    #[error("table {0:?} is not in this transaction's snapshot")]
    TableNotInSnapshot(String),
    /// Misuse: a primary key of another type than the table's primary
    /// index takes, where no index names the type
    /// ([`crate::Table::delete_key`]): it would encode differently and find
    /// nothing.
    #[error("table {table:?} has primary keys of type {expected}, not {got}")]
    KeyType {
        /// The table.
        table: String,
        /// The primary index's key type.
        expected: &'static str,
        /// The key type given.
        got: &'static str,
    },
    /// Misuse: writing a table the write transaction did not lock.
    #[error("table {0:?} is not locked by this write transaction")]
    TableNotLocked(String),
    /// Misuse: the write transaction was already committed or aborted: it
    /// takes no more writes and answers no reads.
    #[error("the write transaction is already committed or aborted")]
    TxnDone,
    /// Misuse: the initializer was already marked done.
    #[error("initializer {0:?} is already done")]
    InitializerDone(String),
    /// Misuse: the handle belongs to another table.
    #[error("initializer {init:?} belongs to table {table:?}")]
    InitializerTable {
        /// The initializer.
        init: String,
        /// Its table.
        table: String,
    },
    /// Misuse: a panic interrupted a write of this transaction; it can only
    /// abort.
    #[error("a panic interrupted a write of this transaction; it can only be aborted")]
    Poisoned,

    // ---- outcomes -------------------------------------------------------
    /// Outcome: a key to write is longer than [`part::MAX_KEY_LEN`] in its
    /// stored form.
    #[error("key of {len} bytes in index {index:?} is longer than the maximum of {max}")]
    KeyTooLong {
        /// The index.
        index: String,
        /// The key's length.
        len: usize,
        /// The maximum.
        max: usize,
    },
    /// Outcome: another object already holds this key of a unique
    /// secondary index.
    #[error("unique index {index:?} of table {table:?} already holds this key for another object")]
    UniqueConflict {
        /// The table.
        table: String,
        /// The index.
        index: String,
    },
    /// Outcome: the object to compare-and-swap or compare-and-delete does
    /// not exist.
    #[error("object not found")]
    ObjectNotFound,
    /// Outcome: compare-and-swap or compare-and-delete saw another revision.
    #[error("revision mismatch: expected {expected}, found {found}")]
    RevisionMismatch {
        /// The revision the caller expected.
        expected: u64,
        /// The object's current revision.
        found: u64,
    },
    /// Outcome: a merge function changed the object's primary key.
    #[error("the merge function changed the object's primary key")]
    MergeChangedKey,
    /// Outcome: an IP prefix length past the address width.
    #[error("prefix length {len} is longer than the address ({max} bits)")]
    InvalidPrefixLen {
        /// The length asked for.
        len: u8,
        /// The address width.
        max: u8,
    },
    /// Outcome: serializing a table to JSON failed (the serializer's error
    /// is the source).
    #[error("json: {0}")]
    Json(#[source] JsonError),
    /// Outcome: the system refused a thread the database needed (a
    /// [`derive`](crate::derive)'s).
    #[error("cannot start a thread: {0}")]
    Thread(String),
}

impl Error {
    /// Whether the error is misuse (the program is wrong: a bad
    /// declaration, a handle of another table or database, a snapshot
    /// older than the table, a finished or poisoned transaction), not an
    /// outcome a correct program meets with some data (a conflict, a key
    /// too long, a revision mismatch); see [`Error`].
    pub fn is_misuse(&self) -> bool {
        // No wildcard: a new variant must be put in one kind.
        match self {
            Error::InvalidName { .. }
            | Error::TableExists(_)
            | Error::DuplicateIndex { .. }
            | Error::IndexInUse(_)
            | Error::IndexNotInTable { .. }
            | Error::PrimaryNotUnique(_)
            | Error::ForeignTable(_)
            | Error::TableNotInSnapshot(_)
            | Error::KeyType { .. }
            | Error::TableNotLocked(_)
            | Error::TxnDone
            | Error::InitializerDone(_)
            | Error::InitializerTable { .. }
            | Error::Poisoned => true,
            Error::KeyTooLong { .. }
            | Error::UniqueConflict { .. }
            | Error::ObjectNotFound
            | Error::RevisionMismatch { .. }
            | Error::MergeChangedKey
            | Error::InvalidPrefixLen { .. }
            | Error::Json(_)
            | Error::Thread(_) => false,
        }
    }

    /// `part`'s error for a key of index `index`: every conversion names
    /// the index the key was meant for.
    pub(crate) fn from_part(e: part::Error, index: &str) -> Self {
        match e {
            part::Error::KeyTooLong { len, max } => Error::KeyTooLong {
                index: index.to_string(),
                len,
                max,
            },
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// One of every variant.
    fn every_variant() -> Vec<Error> {
        let s = || "x".to_string();
        let json = serde_json::from_str::<u8>("x").unwrap_err();
        vec![
            Error::InvalidName {
                what: "table",
                name: s(),
                reason: "r",
            },
            Error::TableExists(s()),
            Error::DuplicateIndex {
                table: s(),
                index: s(),
            },
            Error::IndexInUse(s()),
            Error::IndexNotInTable {
                index: s(),
                table: s(),
            },
            Error::PrimaryNotUnique(s()),
            Error::ForeignTable(s()),
            Error::TableNotInSnapshot(s()),
            Error::KeyType {
                table: s(),
                expected: "u32",
                got: "i32",
            },
            Error::TableNotLocked(s()),
            Error::TxnDone,
            Error::InitializerDone(s()),
            Error::InitializerTable {
                init: s(),
                table: s(),
            },
            Error::Poisoned,
            Error::KeyTooLong {
                index: s(),
                len: 2,
                max: 1,
            },
            Error::UniqueConflict {
                table: s(),
                index: s(),
            },
            Error::ObjectNotFound,
            Error::RevisionMismatch {
                expected: 1,
                found: 2,
            },
            Error::MergeChangedKey,
            Error::InvalidPrefixLen { len: 33, max: 32 },
            Error::from(json),
            Error::Thread("no memory".into()),
        ]
    }

    /// Each variant's kind, stated here apart from `is_misuse`; the match
    /// has no wildcard and each arm a number, so a variant added to the
    /// enum but not to `every_variant` fails the coverage check below.
    fn expected(e: &Error) -> (usize, bool) {
        match e {
            Error::InvalidName { .. } => (0, true),
            Error::TableExists(_) => (1, true),
            Error::DuplicateIndex { .. } => (2, true),
            Error::IndexInUse(_) => (3, true),
            Error::IndexNotInTable { .. } => (4, true),
            Error::PrimaryNotUnique(_) => (5, true),
            Error::ForeignTable(_) => (6, true),
            Error::TableNotInSnapshot(_) => (7, true),
            Error::KeyType { .. } => (8, true),
            Error::TableNotLocked(_) => (9, true),
            Error::TxnDone => (10, true),
            Error::InitializerDone(_) => (11, true),
            Error::InitializerTable { .. } => (12, true),
            Error::Poisoned => (13, true),
            Error::KeyTooLong { .. } => (14, false),
            Error::UniqueConflict { .. } => (15, false),
            Error::ObjectNotFound => (16, false),
            Error::RevisionMismatch { .. } => (17, false),
            Error::MergeChangedKey => (18, false),
            Error::InvalidPrefixLen { .. } => (19, false),
            Error::Json(_) => (20, false),
            Error::Thread(_) => (21, false),
        }
    }

    #[test]
    fn every_variant_is_misuse_or_outcome() {
        let all = every_variant();
        let mut seen = [false; 22];
        for e in &all {
            let (arm, misuse) = expected(e);
            assert!(!seen[arm], "{e:?} listed twice");
            seen[arm] = true;
            assert_eq!(e.is_misuse(), misuse, "{e:?}");
        }
        assert!(seen.iter().all(|&s| s), "a variant is missing: {seen:?}");
    }

    #[test]
    fn part_errors_name_their_index() {
        let e = Error::from_part(part::Error::KeyTooLong { len: 9, max: 8 }, "tags");
        assert_eq!(
            e,
            Error::KeyTooLong {
                index: "tags".into(),
                len: 9,
                max: 8
            }
        );
    }
}
