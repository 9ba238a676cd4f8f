//! part benchmarks, named after Go statedb's `part` benchmarks so figures
//! compare with its anchors, plus Rust peers side by side.
//!
//! `cargo bench -p part --bench part` runs everything; a filter argument
//! selects benchmarks (`cargo bench -p part --bench part -- Insert`). After the
//! timings it prints allocations and bytes per operation, measured with a
//! counting global allocator.

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::{BTreeMap, HashMap};
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use criterion::{BatchSize, Criterion, Throughput};
use part::{Options, Tree};
use rand::seq::SliceRandom;
use rand::SeedableRng;

struct Counting;
static ALLOCS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Relaxed);
        BYTES.fetch_add(l.size() as u64, Relaxed);
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: same contract as our caller's.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Relaxed);
        BYTES.fetch_add(n as u64, Relaxed);
        // SAFETY: same contract as our caller's.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const N: u32 = 1000;

fn key(i: u32) -> [u8; 4] {
    (1000 + i).to_be_bytes()
}

fn tree_n(n: u32, opts: Options) -> Tree<u32> {
    let mut t = Tree::with_options(opts).txn();
    for i in 0..n {
        t.insert(&key(i), i).unwrap();
    }
    t.commit()
}

/// (allocations, bytes) per `per` operations for one run of `f`, after `setup`.
fn count<S, T, F: FnOnce(S) -> T>(setup: impl FnOnce() -> S, f: F, per: u64) -> (f64, f64) {
    let s = setup();
    let a0 = ALLOCS.load(Relaxed);
    let b0 = BYTES.load(Relaxed);
    let out = f(s);
    let a = ALLOCS.load(Relaxed) - a0;
    let b = BYTES.load(Relaxed) - b0;
    drop(out);
    (a as f64 / per as f64, b as f64 / per as f64)
}

fn insert(opts: Options) -> Tree<u32> {
    let mut t = Tree::with_options(opts).txn();
    for i in 0..N {
        t.insert(&key(i), i).unwrap();
    }
    t.commit()
}

fn bench_part(c: &mut Criterion, allocs: &mut Vec<(String, f64, f64)>) {
    let mut g = c.benchmark_group("part");
    g.throughput(Throughput::Elements(N as u64));

    g.bench_function("Insert", |b| b.iter(|| insert(Options::default())));
    let ro = Options {
        root_only_watch: true,
    };
    g.bench_function("Insert_RootOnlyWatch", |b| b.iter(|| insert(ro)));

    let base = tree_n(N, Options::default());
    let modify = |t: &Tree<u32>| {
        let mut txn = t.txn();
        for i in 0..N {
            txn.modify(&key(i), |v| v.copied().unwrap_or(0) + 1)
                .unwrap();
        }
        txn.commit()
    };
    g.bench_function("Modify", |b| b.iter(|| modify(&base)));

    let get_insert = |t: &Tree<u32>| {
        let mut txn = t.txn();
        for i in 0..N {
            let v = txn.get(&key(i)).copied().unwrap_or(0);
            txn.insert(&key(i), v + 1).unwrap();
        }
        txn.commit()
    };
    g.bench_function("GetInsert", |b| b.iter(|| get_insert(&base)));

    g.bench_function("Get", |b| {
        b.iter(|| {
            let mut s = 0u32;
            for i in 0..N {
                s = s.wrapping_add(*base.get(&key(i)).unwrap());
            }
            s
        })
    });
    g.bench_function("All", |b| {
        b.iter(|| base.iter().fold(0u32, |s, (_, v)| s.wrapping_add(*v)))
    });
    g.bench_function("All_Owned", |b| {
        b.iter(|| {
            base.clone()
                .into_iter()
                .fold(0u32, |s, e| s.wrapping_add(*e.value()))
        })
    });
    g.bench_function("GetWatch", |b| {
        b.iter(|| {
            for i in 0..N {
                black_box(base.get_watch(&key(i)));
            }
        })
    });
    let watch_replace = |t: &Tree<u32>| {
        let watches: Vec<_> = (0..N).map(|i| t.get_watch(&key(i)).1).collect();
        let mut txn = t.txn();
        for i in 0..N {
            txn.insert(&key(i), i + 1).unwrap();
        }
        let t2 = txn.commit();
        for w in &watches {
            w.wait();
        }
        t2
    };
    g.bench_function("WatchReplace", |b| {
        b.iter_batched(
            || tree_n(N, Options::default()),
            |t| watch_replace(&t),
            BatchSize::SmallInput,
        )
    });
    g.throughput(Throughput::Elements(1));
    g.bench_function("Replace", |b| {
        let mut txn = base.txn();
        let k = key(7);
        let mut i = 0;
        b.iter(|| {
            i += 1;
            txn.insert(&k, i).unwrap()
        })
    });
    g.finish();

    allocs.push((
        "Insert".into(),
        count(|| (), |_| insert(Options::default()), N as u64).0,
        count(|| (), |_| insert(Options::default()), N as u64).1,
    ));
    let (a, b) = count(|| (), |_| insert(ro), N as u64);
    allocs.push(("Insert_RootOnlyWatch".into(), a, b));
    let (a, b) = count(|| (), |_| modify(&base), N as u64);
    allocs.push(("Modify".into(), a, b));
    let (a, b) = count(|| (), |_| get_insert(&base), N as u64);
    allocs.push(("GetInsert".into(), a, b));
    let (a, b) = count(
        || (),
        |_| {
            for i in 0..N {
                black_box(base.get_watch(&key(i)));
            }
        },
        N as u64,
    );
    allocs.push(("GetWatch (watches exist)".into(), a, b));
    let fresh = tree_n(N, Options::default());
    let (a, b) = count(
        || (),
        |_| {
            for i in 0..N {
                black_box(fresh.get_watch(&key(i)));
            }
        },
        N as u64,
    );
    allocs.push(("GetWatch (first watch)".into(), a, b));
    let (a, b) = count(
        || tree_n(N, Options::default()),
        |t| watch_replace(&t),
        N as u64,
    );
    allocs.push(("WatchReplace".into(), a, b));

    // Transactions of N keys, time per key.
    for batch in [1u32, 10, 100, 1000] {
        let mut g = c.benchmark_group("part");
        g.throughput(Throughput::Elements(batch as u64));
        let name = format!("txn_{batch}");
        let mut tree = tree_n(N, Options::default());
        let mut next = 0u32;
        let run = move |tree: &mut Tree<u32>, next: &mut u32| {
            let mut txn = tree.txn();
            for _ in 0..batch {
                *next = (*next + 1) % N;
                txn.insert(&key(*next), *next).unwrap();
            }
            *tree = txn.commit();
        };
        g.bench_function(&name, |b| b.iter(|| run(&mut tree, &mut next)));
        let mut t2 = tree_n(N, Options::default());
        let mut n2 = 0;
        let (a, by) = count(|| (), |_| run(&mut t2, &mut n2), batch as u64);
        allocs.push((name, a, by));

        let name = format!("txn_delete_{batch}");
        let del = move |t: Tree<u32>| {
            let mut txn = t.txn();
            for i in 0..batch {
                txn.delete(&key(i));
            }
            txn.commit()
        };
        g.bench_function(&name, |b| {
            b.iter_batched(
                || tree_n(batch, Options::default()),
                del,
                BatchSize::SmallInput,
            )
        });
        let (a, by) = count(|| tree_n(batch, Options::default()), del, batch as u64);
        allocs.push((name, a, by));
        g.finish();
    }

    let mut g = c.benchmark_group("part");
    g.sample_size(10);
    g.throughput(Throughput::Elements(100_000));
    let mut order: Vec<u32> = (0..100_000).collect();
    order.shuffle(&mut rand::rngs::StdRng::seed_from_u64(1));
    let big = tree_n(100_000, Options::default());
    g.bench_function("Delete_Random", |b| {
        b.iter_batched(
            || big.clone(),
            |t| {
                let mut txn = t.txn();
                drop(t);
                for &i in &order {
                    txn.delete(&key(i));
                }
                txn.commit()
            },
            BatchSize::PerIteration,
        )
    });
    g.finish();
}

fn bench_peers(c: &mut Criterion, allocs: &mut Vec<(String, f64, f64)>) {
    let mut g = c.benchmark_group("peers");
    g.throughput(Throughput::Elements(N as u64));
    let ins_btree = || {
        let mut m = BTreeMap::new();
        for i in 0..N {
            m.insert(key(i), i);
        }
        m
    };
    let ins_hash = || {
        let mut m = HashMap::new();
        for i in 0..N {
            m.insert(key(i), i);
        }
        m
    };
    let ins_imbl = || {
        let mut m = imbl::OrdMap::new();
        for i in 0..N {
            m.insert(key(i), i);
        }
        m
    };
    let ins_rpds = || {
        let mut m = rpds::RedBlackTreeMapSync::new_sync();
        for i in 0..N {
            m.insert_mut(key(i), i);
        }
        m
    };
    type Rart = rart::VersionedAdaptiveRadixTree<rart::ArrayKey<16>, u32>;
    let ins_rart = || {
        let mut m = Rart::new();
        for i in 0..N {
            m.insert(rart::ArrayKey::<16>::new_from_array(key(i)), i);
        }
        m
    };
    g.bench_function("Insert/BTreeMap", |b| b.iter(ins_btree));
    g.bench_function("Insert/HashMap", |b| b.iter(ins_hash));
    g.bench_function("Insert/imbl_OrdMap", |b| b.iter(ins_imbl));
    g.bench_function("Insert/rpds_RedBlackTreeMapSync", |b| b.iter(ins_rpds));
    g.bench_function("Insert/rart_Versioned", |b| b.iter(ins_rart));
    for (name, (a, by)) in [
        ("Insert/BTreeMap", count(|| (), |_| ins_btree(), N as u64)),
        ("Insert/HashMap", count(|| (), |_| ins_hash(), N as u64)),
        ("Insert/imbl_OrdMap", count(|| (), |_| ins_imbl(), N as u64)),
        (
            "Insert/rpds_RedBlackTreeMapSync",
            count(|| (), |_| ins_rpds(), N as u64),
        ),
        (
            "Insert/rart_Versioned",
            count(|| (), |_| ins_rart(), N as u64),
        ),
    ] {
        allocs.push((name.into(), a, by));
    }

    let (bt, hm, im, rp, ra) = (ins_btree(), ins_hash(), ins_imbl(), ins_rpds(), ins_rart());
    g.bench_function("Get/BTreeMap", |b| {
        b.iter(|| (0..N).fold(0u32, |s, i| s.wrapping_add(bt[&key(i)])))
    });
    g.bench_function("Get/HashMap", |b| {
        b.iter(|| (0..N).fold(0u32, |s, i| s.wrapping_add(hm[&key(i)])))
    });
    g.bench_function("Get/imbl_OrdMap", |b| {
        b.iter(|| (0..N).fold(0u32, |s, i| s.wrapping_add(im[&key(i)])))
    });
    g.bench_function("Get/rpds_RedBlackTreeMapSync", |b| {
        b.iter(|| (0..N).fold(0u32, |s, i| s.wrapping_add(rp[&key(i)])))
    });
    g.bench_function("Get/rart_Versioned", |b| {
        b.iter(|| {
            (0..N).fold(0u32, |s, i| {
                s.wrapping_add(
                    *ra.get(rart::ArrayKey::<16>::new_from_array(key(i)))
                        .unwrap(),
                )
            })
        })
    });
    g.finish();
}

fn main() {
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30)
        .configure_from_args();
    let mut allocs = Vec::new();
    bench_part(&mut c, &mut allocs);
    bench_peers(&mut c, &mut allocs);
    c.final_summary();
    println!(
        "\n{:<36} {:>12} {:>12}",
        "allocations per op", "allocs/op", "bytes/op"
    );
    for (name, a, b) in allocs {
        println!("{name:<36} {a:>12.2} {b:>12.1}");
    }
}
