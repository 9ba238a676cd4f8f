//! Every documented error path returns its typed error (no panic).

use crate::common::*;
use statedb::{Error, Index, IpPrefix, KeyLayout};

#[test]
fn bad_table_names() {
    let db = db_no_gc();
    for name in ["", "Upper", "1abc", "a b", "a.b", "é", &"x".repeat(65)] {
        let id = Index::unique("id", |o: &Obj| o.id);
        let e = db.create_table(name, &id, &[]).unwrap_err();
        assert!(
            matches!(e, Error::InvalidName { what: "table", .. }),
            "{name:?}: {e}"
        );
    }
    let id = Index::unique("id", |o: &Obj| o.id);
    db.create_table(&"x".repeat(64), &id, &[]).unwrap();
}

#[test]
fn bad_index_names_and_duplicates() {
    let db = db_no_gc();
    let id = Index::unique("ID", |o: &Obj| o.id);
    let e = db.create_table("t", &id, &[]).unwrap_err();
    assert!(matches!(e, Error::InvalidName { what: "index", .. }));
    let id = Index::unique("id", |o: &Obj| o.id);
    let dup = Index::unique("id", |o: &Obj| o.name.clone());
    let e = db.create_table("t", &id, &[dup.erase()]).unwrap_err();
    assert_eq!(
        e,
        Error::DuplicateIndex {
            table: "t".into(),
            index: "id".into()
        }
    );
    // A failed creation leaves the indexes free.
    db.create_table("t", &id, &[]).unwrap();
}

#[test]
fn table_exists_and_index_in_use() {
    let db = db_no_gc();
    let f = table_in(&db, "t");
    let id = Index::unique("id", |o: &Obj| o.id);
    assert_eq!(
        db.create_table("t", &id, &[]).unwrap_err(),
        Error::TableExists("t".into())
    );
    assert_eq!(
        db.create_table("u", &f.by_id, &[]).unwrap_err(),
        Error::IndexInUse("id".into())
    );
}

#[test]
fn primary_must_be_unique_single_key() {
    let db = db_no_gc();
    let nu = Index::non_unique("g", |o: &Obj| o.group);
    assert!(matches!(
        db.create_table("t", &nu, &[]).unwrap_err(),
        Error::PrimaryNotUnique(_)
    ));
    let multi = Index::unique_multi("tags", |o: &Obj| o.tags.clone());
    assert!(matches!(
        db.create_table("t", &multi, &[]).unwrap_err(),
        Error::PrimaryNotUnique(_)
    ));
}

#[test]
fn index_of_another_table() {
    let db = db_no_gc();
    let a = table_in(&db, "a");
    let b = table_in(&db, "b");
    let r = db.read_txn();
    assert_eq!(
        a.table.get(&r, &b.by_name, "x").unwrap_err(),
        Error::IndexNotInTable {
            index: "name".into(),
            table: "a".into()
        }
    );
    assert!(a.table.list(&r, &b.by_tag, "x").is_err());
    assert!(a.table.prefix_watch(&r, &b.by_tag, "x").is_err());
    // An index never added to any table.
    let loose = Index::unique("loose", |o: &Obj| o.id);
    assert!(matches!(
        a.table.lower_bound(&r, &loose, &1).unwrap_err(),
        Error::IndexNotInTable { .. }
    ));
}

#[test]
fn foreign_tables_and_old_snapshots() {
    let db1 = db_no_gc();
    let db2 = db_no_gc();
    let old = db1.read_txn();
    let a = table_in(&db1, "a");
    let b = table_in(&db2, "b");
    assert_eq!(
        db1.write_txn(&[&a.table, &b.table]).unwrap_err(),
        Error::ForeignTable("b".into())
    );
    assert_eq!(
        b.table.len(&db1.read_txn()).unwrap_err(),
        Error::ForeignTable("b".into())
    );
    assert_eq!(
        a.table.len(&old).unwrap_err(),
        Error::TableNotInSnapshot("a".into())
    );
    let mut w = db1.write_txn(&[&a.table]).unwrap();
    assert_eq!(
        b.table.insert(&mut w, obj(1, "", &[], 0)).unwrap_err(),
        Error::ForeignTable("b".into())
    );
}

#[test]
fn write_to_unlocked_table() {
    let db = db_no_gc();
    let a = table_in(&db, "a");
    let b = table_in(&db, "b");
    let mut w = db.write_txn(&[&a.table]).unwrap();
    let e = Error::TableNotLocked("b".into());
    assert_eq!(b.table.insert(&mut w, obj(1, "", &[], 0)).unwrap_err(), e);
    assert_eq!(b.table.delete_all(&mut w).unwrap_err(), e);
    assert_eq!(b.table.delete_key(&mut w, &1u32).unwrap_err(), e);
    assert_eq!(b.table.changes(&mut w).unwrap_err(), e);
    assert_eq!(b.table.register_initializer(&mut w, "x").unwrap_err(), e);
    // Reading it is fine.
    assert_eq!(b.table.len(&w).unwrap(), 0);
}

#[test]
fn committing_twice_and_writing_after_commit() {
    let f = fixture();
    let mut w = f.db.write_txn(&[&f.table]).unwrap();
    f.table.insert(&mut w, obj(1, "a", &[], 0)).unwrap();
    w.commit().unwrap();
    assert_eq!(w.commit().unwrap_err(), Error::TxnDone);
    assert_eq!(w.abort().unwrap_err(), Error::TxnDone);
    assert_eq!(
        f.table.insert(&mut w, obj(2, "b", &[], 0)).unwrap_err(),
        Error::TxnDone
    );
    // Nor does it answer reads: the snapshot `commit` returned does.
    assert_eq!(f.table.len(&w).unwrap_err(), Error::TxnDone);
    assert_eq!(f.table.get(&w, &f.by_id, &1).unwrap_err(), Error::TxnDone);
    assert!(w.is_done());
    // An aborted one neither.
    let mut w = f.db.write_txn(&[&f.table]).unwrap();
    w.abort().unwrap();
    assert_eq!(f.table.len(&w).unwrap_err(), Error::TxnDone);
}

#[test]
fn oversized_keys() {
    let f = fixture();
    let mut w = f.db.write_txn(&[&f.table]).unwrap();
    let big = "x".repeat(part::MAX_KEY_LEN + 1);
    let e = f.table.insert(&mut w, obj(1, &big, &[], 0)).unwrap_err();
    assert!(
        matches!(&e, Error::KeyTooLong { index, .. } if index == "name"),
        "{e}"
    );
    // Non-unique: the escaped key plus the primary key must fit.
    let almost = "\0".repeat(part::MAX_KEY_LEN / 2);
    let e = f
        .table
        .insert(&mut w, obj(1, "a", &[&almost], 0))
        .unwrap_err();
    assert!(matches!(&e, Error::KeyTooLong { index, .. } if index == "tags"));
    // Nothing was written.
    assert_eq!(f.table.len(&w).unwrap(), 0);
    assert_eq!(f.table.revision(&w).unwrap(), 0);
    // Primary keys too.
    let db = db_no_gc();
    let by_bytes = Index::unique("b", |v: &Vec<u8>| v.clone());
    let t = db.create_table("bytes", &by_bytes, &[]).unwrap();
    let mut w = db.write_txn(&[&t]).unwrap();
    assert!(matches!(
        t.insert(&mut w, vec![0; part::MAX_KEY_LEN + 1])
            .unwrap_err(),
        Error::KeyTooLong { .. }
    ));
}

/// A secondary-index key too long to store is refused naming that index
/// (not the primary, nor an empty name), with its stored length, in both
/// layouts, unique and non-unique, and as one key of several.
#[test]
fn oversized_secondary_keys_name_their_index() {
    let max = part::MAX_KEY_LEN;
    for (layout, scale) in [(KeyLayout::Bytes, 1), (KeyLayout::Nibbles, 2)] {
        let f = table_with(&db_no_gc(), "objs", layout);
        let mut w = f.db.write_txn(&[&f.table]).unwrap();
        let too_long = |index: &str, len: usize| Error::KeyTooLong {
            index: index.into(),
            len,
            max,
        };
        // Unique: the key alone, `scale` bytes per byte.
        let name = "n".repeat(max / scale + 1);
        assert_eq!(
            f.table.insert(&mut w, obj(1, &name, &[], 0)).unwrap_err(),
            too_long("name", (max / scale + 1) * scale)
        );
        // Non-unique: the key, its two-byte terminator and the 4-byte
        // primary key, one past the limit; the second of two tags.
        let tag = "t".repeat(max / scale - 5);
        let e = f
            .table
            .insert(&mut w, obj(1, "a", &["ok", &tag], 0))
            .unwrap_err();
        assert_eq!(e, too_long("tags", (max / scale + 1) * scale));
        assert!(!e.is_misuse());
        // Nothing was written; one byte shorter fits.
        assert_eq!(f.table.len(&w).unwrap(), 0);
        let tag = "t".repeat(max / scale - 6);
        f.table
            .insert(&mut w, obj(1, "a", &["ok", &tag], 0))
            .unwrap();
    }
}

#[test]
fn unique_conflict_changes_nothing() {
    let f = fixture();
    let mut w = f.db.write_txn(&[&f.table]).unwrap();
    f.table.insert(&mut w, obj(1, "a", &["t"], 0)).unwrap();
    let e = f.table.insert(&mut w, obj(2, "a", &["u"], 0)).unwrap_err();
    assert!(matches!(e, Error::UniqueConflict { .. }));
    assert_eq!(f.table.len(&w).unwrap(), 1);
    assert_eq!(f.table.list(&w, &f.by_tag, "u").unwrap().count(), 0);
    // Re-inserting the same object under its own key is fine.
    f.table.insert(&mut w, obj(1, "a", &["v"], 0)).unwrap();
}

#[test]
fn merge_must_keep_the_primary_key() {
    let f = fixture();
    let mut w = f.db.write_txn(&[&f.table]).unwrap();
    f.table.insert(&mut w, obj(1, "a", &[], 0)).unwrap();
    let e = f
        .table
        .modify(&mut w, obj(1, "a", &[], 0), |_, mut n| {
            n.id = 2;
            n
        })
        .unwrap_err();
    assert_eq!(e, Error::MergeChangedKey);
}

#[test]
fn initializer_of_another_table() {
    let db = db_no_gc();
    let a = table_in(&db, "a");
    let b = table_in(&db, "b");
    let mut w = db.write_txn(&[&a.table, &b.table]).unwrap();
    let i = a.table.register_initializer(&mut w, "x").unwrap();
    assert_eq!(
        b.table.initializer_done(&mut w, &i).unwrap_err(),
        Error::InitializerTable {
            init: "x".into(),
            table: "a".into()
        }
    );
    assert_eq!(i.name(), "x");
}

#[test]
fn bad_prefix_length() {
    assert_eq!(
        IpPrefix::new("1.2.3.4".parse().unwrap(), 40).unwrap_err(),
        Error::InvalidPrefixLen { len: 40, max: 32 }
    );
}

#[test]
fn errors_display() {
    let e = Error::TableNotLocked("t".into());
    assert_eq!(
        e.to_string(),
        "table \"t\" is not locked by this write transaction"
    );
}

#[test]
fn oversized_keys_nibble_layout() {
    // Nibble-expanded keys take twice the space: the limit halves.
    let db = db_no_gc();
    let by_bytes = Index::unique("b", |v: &Vec<u8>| v.clone());
    let t = db
        .create_table_with(
            "bytes",
            &by_bytes,
            &[],
            statedb::TableOptions::default().with_key_layout(statedb::KeyLayout::Nibbles),
        )
        .unwrap();
    assert_eq!(t.key_layout(), statedb::KeyLayout::Nibbles);
    let mut w = db.write_txn(&[&t]).unwrap();
    assert!(matches!(
        t.insert(&mut w, vec![0; part::MAX_KEY_LEN / 2 + 1])
            .unwrap_err(),
        Error::KeyTooLong { .. }
    ));
    t.insert(&mut w, vec![0; part::MAX_KEY_LEN / 2]).unwrap();
}

#[test]
fn json_errors_are_typed() {
    struct Bad(u32);
    impl serde::Serialize for Bad {
        fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
            Err(serde::ser::Error::custom("cannot serialize"))
        }
    }
    let db = db_no_gc();
    let id = Index::unique("id", |b: &Bad| b.0);
    let t = db.create_table("bad", &id, &[]).unwrap();
    let mut w = db.write_txn(&[&t]).unwrap();
    t.insert(&mut w, Bad(1)).unwrap();
    let r = w.commit().unwrap();
    let e = t.to_json(&r).unwrap_err();
    assert!(matches!(&e, Error::Json(_)), "{e:?}");
    assert!(e.to_string().contains("cannot serialize"), "{e}");
    // The serializer's own error is kept as the source.
    let source = std::error::Error::source(&e).expect("a source");
    assert!(source.to_string().contains("cannot serialize"), "{source}");
}

/// Regression: `delete_key(&mut w, &1)` on a `u32` primary index passed an
/// `i32`, which encodes differently, and silently deleted nothing.
#[test]
fn delete_key_of_another_type_is_refused() {
    let f = fixture();
    insert_committed(&f.db, &f.table, obj(1, "a", &[], 0));
    let mut w = f.db.write_txn(&[&f.table]).unwrap();
    let e = Error::KeyType {
        table: "objs".into(),
        expected: "u32",
        got: "i32",
    };
    assert_eq!(f.table.delete_key(&mut w, &1).unwrap_err(), e);
    assert_eq!(f.table.delete_key(&mut w, &1i32).unwrap_err(), e);
    assert!(matches!(
        f.table.delete_key(&mut w, &1u64).unwrap_err(),
        Error::KeyType { got: "u64", .. }
    ));
    assert!(matches!(
        f.table.delete_key(&mut w, "1").unwrap_err(),
        Error::KeyType { got: "str", .. }
    ));
    // Refused without touching the table: the object is still there.
    assert_eq!(f.table.len(&w).unwrap(), 1);
    assert!(f.table.delete_key(&mut w, &1u32).unwrap().is_some());
    assert!(f.table.delete_key(&mut w, &&1u32).unwrap().is_none());
    w.commit().unwrap();

    // Types that encode alike are accepted for each other.
    let db = db_no_gc();
    let by_name = Index::unique("name", |o: &Obj| o.name.clone());
    let t = db.create_table("named", &by_name, &[]).unwrap();
    let mut w = db.write_txn(&[&t]).unwrap();
    for n in ["a", "b", "c"] {
        t.insert(&mut w, obj(0, n, &[], 0)).unwrap();
    }
    assert!(t.delete_key(&mut w, "a").unwrap().is_some());
    assert!(t.delete_key(&mut w, &"b".to_string()).unwrap().is_some());
    assert!(t.delete_key(&mut w, &b"c"[..]).unwrap().is_some());
    assert!(matches!(
        t.delete_key(&mut w, &7u8).unwrap_err(),
        Error::KeyType {
            expected: "alloc::string::String",
            got: "u8",
            ..
        }
    ));

    // Tuples compare part by part.
    let by_pair = Index::unique("pair", |o: &Obj| (o.group, o.id));
    let t = db.create_table("pairs", &by_pair, &[]).unwrap();
    let mut w = db.write_txn(&[&t]).unwrap();
    t.insert(&mut w, obj(5, "", &[], -2)).unwrap();
    assert!(matches!(
        t.delete_key(&mut w, &(-2i32, 5u32)).unwrap_err(),
        Error::KeyType { .. }
    ));
    assert!(t.delete_key(&mut w, &(-2i16, 5u32)).unwrap().is_some());
}
