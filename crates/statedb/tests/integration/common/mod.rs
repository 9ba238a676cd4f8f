//! Shared test fixtures.
#![allow(dead_code)]

use statedb::{Db, DbOptions, Index, KeyLayout, ReadTxn, Table, TableOptions};

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Obj {
    pub id: u32,
    pub name: String,
    pub tags: Vec<String>,
    pub group: i16,
}

pub fn obj(id: u32, name: &str, tags: &[&str], group: i16) -> Obj {
    Obj {
        id,
        name: name.to_string(),
        tags: tags.iter().map(|s| s.to_string()).collect(),
        group,
    }
}

pub struct Fixture {
    pub db: Db,
    pub table: Table<Obj>,
    pub by_id: Index<Obj, u32>,
    pub by_name: Index<Obj, String>,
    pub by_tag: Index<Obj, String>,
    pub by_group: Index<Obj, i16>,
}

pub type Indexes = (
    Index<Obj, u32>,
    Index<Obj, String>,
    Index<Obj, String>,
    Index<Obj, i16>,
);

pub fn indexes() -> Indexes {
    (
        Index::unique("id", |o: &Obj| o.id),
        Index::unique("name", |o: &Obj| o.name.clone()),
        Index::non_unique_multi("tags", |o: &Obj| o.tags.clone()),
        Index::non_unique("group", |o: &Obj| o.group),
    )
}

pub fn table_in(db: &Db, name: &str) -> Fixture {
    table_with(db, name, KeyLayout::Bytes)
}

pub fn table_with(db: &Db, name: &str, layout: KeyLayout) -> Fixture {
    build(db, name, layout, true)
}

/// A table without the unique `name` index (`by_name` is not in it).
pub fn table_without_unique(db: &Db, name: &str) -> Fixture {
    build(db, name, KeyLayout::Bytes, false)
}

fn build(db: &Db, name: &str, layout: KeyLayout, unique_name: bool) -> Fixture {
    let (by_id, by_name, by_tag, by_group) = indexes();
    let mut secondary = vec![by_tag.erase(), by_group.erase()];
    if unique_name {
        secondary.insert(0, by_name.erase());
    }
    let table = db
        .create_table_with(
            name,
            &by_id,
            &secondary,
            TableOptions::default().with_key_layout(layout),
        )
        .unwrap();
    Fixture {
        db: db.clone(),
        table,
        by_id,
        by_name,
        by_tag,
        by_group,
    }
}

/// A database without the background collector (tests collect when they
/// say so).
pub fn db_no_gc() -> Db {
    Db::with_options(DbOptions::default().with_gc_interval(None))
}

pub fn fixture() -> Fixture {
    table_in(&db_no_gc(), "objs")
}

/// Inserts `o` into `t` in a write transaction of its own; its snapshot.
pub fn insert_committed(db: &Db, t: &Table<Obj>, o: Obj) -> ReadTxn {
    let mut w = db.write_txn(&[t]).unwrap();
    t.insert(&mut w, o).unwrap();
    w.commit().unwrap()
}

/// Waits (up to 10 s) until the background collector has emptied `t`'s
/// graveyard.
pub fn wait_until_collected(db: &Db, t: &Table<Obj>) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while t.graveyard_len(&db.read_txn()).unwrap() != 0 {
        assert!(std::time::Instant::now() < deadline, "never collected");
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}
