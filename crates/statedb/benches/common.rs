//! Shared benchmark fixtures: Go statedb's `testObject` (an id and a set of
//! tags) with the id as primary index and optionally the tags as a
//! non-unique secondary index.

#![allow(dead_code)]

use statedb::{Db, DbOptions, Index, KeyLayout, Table, TableOptions};

#[derive(Clone, Debug)]
pub(crate) struct TestObject {
    pub(crate) id: u64,
    pub(crate) tags: &'static [&'static str],
}

pub(crate) struct Bench {
    pub(crate) db: Db,
    pub(crate) table: Table<TestObject>,
    pub(crate) by_id: Index<TestObject, u64>,
    pub(crate) by_tag: Index<TestObject, &'static str>,
}

pub(crate) fn new_db(secondary: bool) -> Bench {
    new_db_named(&Db::with_options(env_db_options()), "test", secondary)
}

pub(crate) fn new_db_layout(secondary: bool, key_layout: KeyLayout) -> Bench {
    new_db_with(
        &Db::with_options(env_db_options()),
        "test",
        secondary,
        key_layout,
    )
}

/// `STATEDB_BENCH_REVISIONS=1`: every bench table keeps a revision index
/// from its first write (by default only tables read in revision order do,
/// see statedb's design, "Data layout").
///
/// `STATEDB_BENCH_INLINE_FREE=1`: no background collector (snapshots a
/// reader drops last are freed by that reader; commits free what they
/// supersede either way).
///
/// `STATEDB_BENCH_TIME_ONE_IN=N`: time one write transaction in N per
/// table (`DbOptions::time_one_in`; 1: every one).
pub(crate) fn env_db_options() -> DbOptions {
    let mut o = DbOptions::default();
    if std::env::var_os("STATEDB_BENCH_INLINE_FREE").is_some() {
        o.gc_interval = None;
    }
    if let Some(n) = std::env::var("STATEDB_BENCH_TIME_ONE_IN")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        o.time_one_in = n;
    }
    o
}

pub(crate) fn new_db_named(db: &Db, name: &str, secondary: bool) -> Bench {
    new_db_with(db, name, secondary, KeyLayout::Bytes)
}

pub(crate) fn new_db_with(db: &Db, name: &str, secondary: bool, key_layout: KeyLayout) -> Bench {
    let by_id = Index::unique("id", |o: &TestObject| o.id);
    let by_tag = Index::non_unique_multi("tags", |o: &TestObject| o.tags.iter().copied());
    let sec = if secondary {
        vec![by_tag.erase()]
    } else {
        vec![]
    };
    let table = db
        .create_table_with(
            name,
            &by_id,
            &sec,
            TableOptions::default().with_key_layout(key_layout),
        )
        .unwrap();
    if std::env::var_os("STATEDB_BENCH_REVISIONS").is_some_and(|v| v == "1") {
        // One revision-order read: the first write builds the table's
        // revision index and every later one keeps it, as in Go statedb
        // (whose tables always have one).
        drop(table.list_revision(&db.read_txn(), 0).unwrap());
    }
    Bench {
        db: db.clone(),
        table,
        by_id,
        by_tag,
    }
}

pub(crate) fn obj(id: u64) -> TestObject {
    TestObject { id, tags: &[] }
}

pub(crate) fn tagged(id: u64) -> TestObject {
    const TAGS: [&[&str]; 2] = [&["foo", "bar"], &["foo", "baz"]];
    TestObject {
        id,
        tags: TAGS[(id % 2) as usize],
    }
}

/// One tag, "test", as Go's `WriteTxn_100_SecondaryIndex` writes.
pub(crate) fn tagged_test(id: u64) -> TestObject {
    TestObject {
        id,
        tags: &["test"],
    }
}

/// One tag, "odd" or "even", as Go's `RandomReplace` writes.
pub(crate) fn odd_even(id: u64) -> TestObject {
    const TAGS: [&[&str]; 2] = [&["even"], &["odd"]];
    TestObject {
        id,
        tags: TAGS[(id % 2) as usize],
    }
}

/// Inserts ids `0..n` in batches of 1000.
pub(crate) fn fill(b: &Bench, n: u64) {
    let mut id = 0;
    while id < n {
        let mut w = b.db.write_txn(&[&b.table]).unwrap();
        for _ in 0..1000.min(n - id) {
            b.table.insert(&mut w, obj(id)).unwrap();
            id += 1;
        }
        w.commit().unwrap();
    }
}

/// The ids `0..n` in the suite's one shuffled order (seeded: the same in
/// every run).
pub(crate) fn shuffled(n: u64) -> Vec<u64> {
    use rand::seq::SliceRandom;
    use rand::SeedableRng;
    let mut ids: Vec<u64> = (0..n).collect();
    ids.shuffle(&mut rand::rngs::StdRng::seed_from_u64(1));
    ids
}

/// Percentile of sorted samples.
pub(crate) fn pct(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

/// On-CPU time of the calling thread (from `/proc/thread-self/schedstat`), so
/// figures hold up on a machine shared with other work: time spent
/// descheduled is not counted. Selected with `STATEDB_BENCH_CPU=1`.
pub(crate) struct CpuTime {
    wall: criterion::measurement::WallTime,
}

impl CpuTime {
    pub(crate) fn new() -> Self {
        CpuTime {
            wall: criterion::measurement::WallTime,
        }
    }
}

/// Nanoseconds the calling thread has run.
pub(crate) fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|x| x.parse().ok()))
        .unwrap_or(0)
}

impl criterion::measurement::Measurement for CpuTime {
    type Intermediate = u64;
    type Value = std::time::Duration;
    fn start(&self) -> u64 {
        thread_cpu_ns()
    }
    fn end(&self, i: u64) -> std::time::Duration {
        std::time::Duration::from_nanos(thread_cpu_ns().saturating_sub(i))
    }
    fn add(&self, a: &std::time::Duration, b: &std::time::Duration) -> std::time::Duration {
        *a + *b
    }
    fn zero(&self) -> std::time::Duration {
        std::time::Duration::ZERO
    }
    fn to_f64(&self, v: &std::time::Duration) -> f64 {
        v.as_nanos() as f64
    }
    fn formatter(&self) -> &dyn criterion::measurement::ValueFormatter {
        self.wall.formatter()
    }
}

/// The key layout chosen by `STATEDB_BENCH_LAYOUT` (`bytes`, the default, or
/// `nibbles`), for the custom-main benches.
pub(crate) fn env_layout() -> KeyLayout {
    match std::env::var("STATEDB_BENCH_LAYOUT").as_deref() {
        Ok("nibbles") => KeyLayout::Nibbles,
        _ => KeyLayout::Bytes,
    }
}
