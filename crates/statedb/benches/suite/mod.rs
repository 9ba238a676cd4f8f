//! The benchmark suite shared by the `statedb` (mimalloc) and
//! `statedb_sysalloc` (system allocator) bench targets.

use std::cell::Cell;

thread_local! {
    static GROUP: Cell<&'static str> = const { Cell::new("statedb") };
}

use std::hint::black_box;
use std::time::Duration;

use crate::common::*;
use criterion::measurement::Measurement;
use criterion::{BatchSize, Criterion, Throughput};
use statedb::KeyLayout;

const N: u64 = 1000;

/// How a `WriteTxn_N` benchmark writes its 1000 objects per iteration.
#[derive(Clone, Copy, PartialEq)]
enum Shape {
    /// Ids `0..1000` in turn (a table of 1000 objects); two tags per object
    /// with the secondary index.
    Ours,
    /// Go statedb's: every transaction rewrites ids `0..batch` (a table of
    /// `batch` objects; `WriteTxn_1` rewrites one), one tag per object.
    Go,
}

fn write_txn_batch<M: Measurement>(
    c: &mut Criterion<M>,
    name: &str,
    batch: u64,
    secondary: bool,
    layout: KeyLayout,
    shape: Shape,
) {
    let b = new_db_layout(secondary, layout);
    let mk = match (secondary, shape) {
        (false, _) => obj,
        (true, Shape::Ours) => tagged,
        (true, Shape::Go) => tagged_test,
    };
    let mut g = c.benchmark_group(GROUP.with(|g| g.get()));
    g.throughput(Throughput::Elements(N));
    g.bench_function(name, |bn| {
        bn.iter(|| {
            let mut id = 0;
            while id < N {
                let mut w = b.db.write_txn(&[&b.table]).unwrap();
                for _ in 0..batch {
                    let key = if shape == Shape::Go { id % batch } else { id };
                    b.table.insert(&mut w, mk(key)).unwrap();
                    id += 1;
                }
                w.commit().unwrap();
            }
        })
    });
    g.finish();
}

/// Go statedb's `RandomInsert`, `RandomReplace` and `SequentialInsert`: one
/// table across iterations, 1000 objects written in `ids` order and
/// committed, so after the first iteration every write replaces an object
/// (`RandomReplace`: with the tags index, one tag "odd"/"even" per object,
/// the table filled first).
fn go_shape_rewrites<M: Measurement>(c: &mut Criterion<M>, ids: &[u64]) {
    let mut g = c.benchmark_group(GROUP.with(|g| g.get()));
    g.throughput(Throughput::Elements(N));
    let sequential: Vec<u64> = (0..N).collect();
    for (name, order, secondary) in [
        ("GoShape/RandomInsert", ids, false),
        ("GoShape/RandomReplace", ids, true),
        ("GoShape/SequentialInsert", &sequential[..], false),
    ] {
        let b = new_db(secondary);
        let mk = if secondary { odd_even } else { obj };
        if secondary {
            let mut w = b.db.write_txn(&[&b.table]).unwrap();
            for id in 0..N {
                b.table.insert(&mut w, mk(id)).unwrap();
            }
            w.commit().unwrap();
        }
        g.bench_function(name, |bn| {
            bn.iter(|| {
                let mut w = b.db.write_txn(&[&b.table]).unwrap();
                for &id in order {
                    b.table.insert(&mut w, mk(id)).unwrap();
                }
                w.commit().unwrap();
            })
        });
    }
    g.finish();
}

fn benches<M: Measurement>(c: &mut Criterion<M>) {
    use KeyLayout::{Bytes, Nibbles};
    use Shape::{Go, Ours};
    for (name, batch, secondary, shape) in [
        ("WriteTxn_1", 1, false, Ours),
        ("WriteTxn_10", 10, false, Ours),
        ("WriteTxn_100", 100, false, Ours),
        ("WriteTxn_1000", 1000, false, Ours),
        ("WriteTxn_100_SecondaryIndex", 100, true, Ours),
        ("GoShape/WriteTxn_1", 1, false, Go),
        ("GoShape/WriteTxn_10", 10, false, Go),
        ("GoShape/WriteTxn_100", 100, false, Go),
        ("GoShape/WriteTxn_100_SecondaryIndex", 100, true, Go),
    ] {
        write_txn_batch(c, name, batch, secondary, Bytes, shape);
    }
    go_shape_rewrites(c, &shuffled(N));

    let mut g = c.benchmark_group(GROUP.with(|g| g.get()));
    g.throughput(Throughput::Elements(N));

    // Insert 1000 objects in random order into an empty table; abort.
    let b = new_db(false);
    let ids = shuffled(N);
    g.bench_function("RandomInsert", |bn| {
        bn.iter(|| {
            let mut w = b.db.write_txn(&[&b.table]).unwrap();
            for &id in &ids {
                b.table.insert(&mut w, obj(id)).unwrap();
            }
            w.abort().unwrap();
        })
    });

    // Replace 1000 existing objects in random order; abort.
    let b = new_db(false);
    fill(&b, N);
    g.bench_function("RandomReplace", |bn| {
        bn.iter(|| {
            let mut w = b.db.write_txn(&[&b.table]).unwrap();
            for &id in &ids {
                b.table.insert(&mut w, obj(id)).unwrap();
            }
            w.abort().unwrap();
        })
    });

    // Insert 1000 objects in key order into an empty table; commit.
    g.bench_function("SequentialInsert", |bn| {
        bn.iter_batched(
            || new_db(false),
            |b| {
                {
                    let mut w = b.db.write_txn(&[&b.table]).unwrap();
                    for id in 0..N {
                        b.table.insert(&mut w, obj(id)).unwrap();
                    }
                    w.commit().unwrap();
                }
                b
            },
            BatchSize::SmallInput,
        )
    });

    // 1000 inserts, then delete-all; without and with a change consumer.
    let b = new_db(false);
    g.bench_function("Changes_Baseline", |bn| {
        bn.iter(|| {
            let mut w = b.db.write_txn(&[&b.table]).unwrap();
            for id in 0..N {
                b.table.insert(&mut w, obj(id)).unwrap();
            }
            w.commit().unwrap();
            let mut w = b.db.write_txn(&[&b.table]).unwrap();
            b.table.delete_all(&mut w).unwrap();
            w.commit().unwrap();
        })
    });
    let b = new_db(false);
    let mut w = b.db.write_txn(&[&b.table]).unwrap();
    let mut changes = b.table.changes(&mut w).unwrap();
    w.commit().unwrap();
    g.bench_function("Changes", |bn| {
        bn.iter(|| {
            let mut w = b.db.write_txn(&[&b.table]).unwrap();
            for id in 0..N {
                b.table.insert(&mut w, obj(id)).unwrap();
            }
            let r = w.commit().unwrap();
            let (batch, _) = changes.next(&r).unwrap();
            assert_eq!(batch.len(), N as usize);
            let mut w = b.db.write_txn(&[&b.table]).unwrap();
            b.table.delete_all(&mut w).unwrap();
            let r = w.commit().unwrap();
            let (batch, _) = changes.next(&r).unwrap();
            assert_eq!(batch.len(), N as usize);
        })
    });

    // Lookups of 1000 objects, random and sequential order.
    let b = new_db(false);
    fill(&b, N);
    let r = b.db.read_txn();
    g.bench_function("RandomLookup", |bn| {
        bn.iter(|| {
            for &id in &ids {
                black_box(b.table.get(&r, &b.by_id, &id).unwrap());
            }
        })
    });
    g.bench_function("SequentialLookup", |bn| {
        bn.iter(|| {
            for id in 0..N {
                black_box(b.table.get(&r, &b.by_id, &id).unwrap());
            }
        })
    });
    // The same through a view bound once per pass (`Table::read`): the
    // handles are checked once, not at every lookup.
    g.bench_function("View/RandomLookup", |bn| {
        bn.iter(|| {
            let v = b.table.read(&r).unwrap();
            for &id in &ids {
                black_box(v.get(&b.by_id, &id));
            }
        })
    });
    g.bench_function("View/SequentialLookup", |bn| {
        bn.iter(|| {
            let v = b.table.read(&r).unwrap();
            for id in 0..N {
                black_box(v.get(&b.by_id, &id));
            }
        })
    });
    g.finish();

    // The same on nibble-layout tables (write-optimised; see KeyLayout).
    for (name, batch, secondary) in [
        ("Nibbles/WriteTxn_1", 1, false),
        ("Nibbles/WriteTxn_100", 100, false),
        ("Nibbles/WriteTxn_100_SecondaryIndex", 100, true),
    ] {
        write_txn_batch(c, name, batch, secondary, Nibbles, Ours);
    }
    let mut g = c.benchmark_group(GROUP.with(|g| g.get()));
    g.throughput(Throughput::Elements(N));
    let b = new_db_layout(false, KeyLayout::Nibbles);
    fill(&b, N);
    let r = b.db.read_txn();
    g.bench_function("Nibbles/RandomLookup", |bn| {
        bn.iter(|| {
            for &id in &ids {
                black_box(b.table.get(&r, &b.by_id, &id).unwrap());
            }
        })
    });
    g.finish();

    // Iterating 100k objects.
    let mut g = c.benchmark_group(GROUP.with(|g| g.get()));
    const BIG: u64 = 100_000;
    g.throughput(Throughput::Elements(BIG));
    let b = new_db(false);
    fill(&b, BIG);
    let r = b.db.read_txn();
    g.bench_function("FullIteration_All", |bn| {
        bn.iter(|| {
            let mut n = 0;
            for o in b.table.all(&r).unwrap() {
                n += black_box(o).id & 1;
            }
            n
        })
    });
    g.bench_function("FullIteration_Get", |bn| {
        bn.iter(|| {
            for id in 0..BIG {
                black_box(b.table.get(&r, &b.by_id, &id).unwrap());
            }
        })
    });
    g.finish();
}

/// Runs the suite with criterion groups named `group`.
pub(crate) fn main(group: &'static str) {
    GROUP.with(|g| g.set(group));
    let c = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(20);
    if std::env::var_os("STATEDB_BENCH_CPU").is_some_and(|v| v == "1") {
        let mut c = c.with_measurement(CpuTime::new()).configure_from_args();
        benches(&mut c);
        c.final_summary();
    } else {
        let mut c = c.configure_from_args();
        benches(&mut c);
        c.final_summary();
    }
}
