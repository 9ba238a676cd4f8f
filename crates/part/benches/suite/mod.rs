//! The part benchmark suite, shared by the `part` (system allocator) and
//! `part_mimalloc` bench targets. Benchmarks are named after Go statedb's
//! `part` benchmarks so figures compare with its anchors, plus Rust peers
//! side by side. After the timings it prints allocations and bytes per
//! operation, counted by the targets' global allocator ([`Counting`]).

use std::alloc::{GlobalAlloc, Layout};
use std::collections::{BTreeMap, HashMap};
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use criterion::{BatchSize, Criterion, Throughput};
use part::{Options, Tree};
use rand::seq::SliceRandom;
use rand::SeedableRng;

/// A global allocator that counts allocations and bytes, then forwards to
/// `A`. The allocator is fixed at compile time (one bench target per
/// allocator): switching at run time would free memory the runtime took
/// before the switch with the other allocator.
pub(crate) struct Counting<A>(pub(crate) A);

static ALLOCS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call is forwarded unchanged to the same allocator `A`;
// only the counters are added.
unsafe impl<A: GlobalAlloc> GlobalAlloc for Counting<A> {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Relaxed);
        BYTES.fetch_add(l.size() as u64, Relaxed);
        // SAFETY: same contract as our caller's.
        unsafe { self.0.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: same contract as our caller's; `p` came from `A`.
        unsafe { self.0.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Relaxed);
        BYTES.fetch_add(n as u64, Relaxed);
        // SAFETY: as for `dealloc`.
        unsafe { self.0.realloc(p, l, n) }
    }
}

const N: u32 = 1000;
const RO: Options = Options {
    root_only_watch: true,
};

/// Go's `uint32Key(1000 + i)`.
fn key(i: u32) -> [u8; 4] {
    (1000 + i).to_be_bytes()
}

/// Go's `uint64Key(i)`.
fn key64(i: u64) -> [u8; 8] {
    i.to_be_bytes()
}

fn tree_n(n: u32, opts: Options) -> Tree<u32> {
    let mut t = Tree::with_options(opts).txn();
    for i in 0..n {
        t.insert(&key(i), i).unwrap();
    }
    t.commit()
}

fn tree64(keys: impl Iterator<Item = u64>) -> Tree<u64> {
    let mut t = Tree::with_options(RO).txn();
    for i in keys {
        t.insert(&key64(i), i).unwrap();
    }
    t.commit()
}

/// (allocations, bytes) per `per` operations for one run of `f`, after `setup`.
fn count<S, T, F: FnOnce(S) -> T>(setup: impl FnOnce() -> S, f: F, per: u64) -> (f64, f64) {
    let s = setup();
    // node256 blocks part reuses from its own cache count as allocations.
    let (ra0, rb0) = part::check::blocks_reused();
    let a0 = ALLOCS.load(Relaxed);
    let b0 = BYTES.load(Relaxed);
    let out = f(s);
    let (ra, rb) = part::check::blocks_reused();
    let a = ALLOCS.load(Relaxed) - a0 + (ra - ra0);
    let b = BYTES.load(Relaxed) - b0 + (rb - rb0);
    drop(out);
    (a as f64 / per as f64, b as f64 / per as f64)
}

fn insert(opts: Options) -> Tree<u32> {
    let mut t = Tree::with_options(opts).txn();
    for i in 0..N {
        t.insert(&key(i), 1000 + i).unwrap();
    }
    t.commit()
}

fn modify(t: &Tree<u32>) -> Tree<u32> {
    let mut txn = t.txn();
    for i in 0..N {
        txn.modify(&key(i), |v| v.copied().unwrap_or(123)).unwrap();
    }
    txn.commit()
}

fn get_insert(t: &Tree<u32>) -> Tree<u32> {
    let mut txn = t.txn();
    for i in 0..N {
        let v = txn.get(&key(i)).copied().unwrap_or(0);
        txn.insert(&key(i), v).unwrap();
    }
    txn.commit()
}

fn watch_replace(t: &Tree<u32>) -> Tree<u32> {
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
}

fn txn_batch(tree: &mut Tree<u64>, batch: u64) {
    let mut txn = tree.txn();
    for j in 0..batch {
        txn.insert(&key64(j), j).unwrap();
    }
    *tree = txn.commit();
}

fn txn_delete_batch(tree: &Tree<u64>, batch: u64) {
    let mut txn = tree.txn();
    for j in 0..batch {
        txn.delete(&key64(j));
    }
}

fn bench_part(c: &mut Criterion, allocs: &mut Vec<(String, f64, f64)>) {
    let mut g = c.benchmark_group("part");
    g.throughput(Throughput::Elements(N as u64));

    g.bench_function("Insert", |b| b.iter(|| insert(Options::default())));
    g.bench_function("Insert_RootOnlyWatch", |b| b.iter(|| insert(RO)));
    let mut tree = tree_n(N, RO);
    g.bench_function("Modify", |b| b.iter(|| tree = modify(&tree)));
    g.bench_function("GetInsert", |b| b.iter(|| tree = get_insert(&tree)));

    let t64 = tree64(0..N as u64);
    g.bench_function("Get", |b| {
        b.iter(|| {
            for j in 0..N as u64 {
                assert_eq!(t64.get(&key64(j)), Some(&j));
            }
        })
    });
    let all = tree64(1..=N as u64);
    g.bench_function("All", |b| {
        b.iter(|| all.iter().fold(0u64, |s, (_, v)| s.wrapping_add(*v)))
    });
    g.bench_function("All_Owned", |b| {
        b.iter(|| {
            all.clone()
                .into_iter()
                .fold(0u64, |s, e| s.wrapping_add(*e.value()))
        })
    });
    let watched = tree_n(N, Options::default());
    g.bench_function("GetWatch", |b| {
        b.iter(|| {
            for i in 0..N {
                black_box(watched.get_watch(&key(i)));
            }
        })
    });
    g.bench_function("WatchReplace", |b| {
        b.iter_batched(
            || tree_n(N, Options::default()),
            |t| watch_replace(&t),
            BatchSize::SmallInput,
        )
    });
    g.throughput(Throughput::Elements(1));
    g.bench_function("Replace", |b| {
        let mut txn = tree_n(N, RO).txn();
        let k = 0u32.to_be_bytes();
        b.iter(|| txn.insert(&k, 0).unwrap())
    });
    g.finish();

    let mut t = tree_n(N, RO);
    for (name, (a, by)) in [
        (
            "Insert",
            count(|| (), |_| insert(Options::default()), N as u64),
        ),
        (
            "Insert_RootOnlyWatch",
            count(|| (), |_| insert(RO), N as u64),
        ),
        ("Modify", count(|| (), |_| t = modify(&t), N as u64)),
        ("GetInsert", count(|| (), |_| t = get_insert(&t), N as u64)),
        (
            "GetWatch (watches exist)",
            count(
                || (),
                |_| (0..N).for_each(|i| drop(watched.get_watch(&key(i)))),
                N as u64,
            ),
        ),
        (
            "GetWatch (first watch)",
            count(
                || tree_n(N, Options::default()),
                |t| (0..N).for_each(|i| drop(t.get_watch(&key(i)))),
                N as u64,
            ),
        ),
        (
            "WatchReplace",
            count(
                || tree_n(N, Options::default()),
                |t| watch_replace(&t),
                N as u64,
            ),
        ),
    ] {
        allocs.push((name.into(), a, by));
    }

    // Go's benchmark_txn_batch / benchmark_txn_delete_batch: time per key.
    for batch in [1u64, 10, 100, 1000] {
        let mut g = c.benchmark_group("part");
        g.throughput(Throughput::Elements(batch));
        let name = format!("txn_{batch}");
        let mut tree = tree64(0..0);
        g.bench_function(&name, |b| b.iter(|| txn_batch(&mut tree, batch)));
        let mut t2 = tree64(0..batch);
        let (a, by) = count(|| (), |_| txn_batch(&mut t2, batch), batch);
        allocs.push((name, a, by));

        let name = format!("txn_delete_{batch}");
        let full = tree64(0..batch);
        g.bench_function(&name, |b| b.iter(|| txn_delete_batch(&full, batch)));
        let (a, by) = count(|| (), |_| txn_delete_batch(&full, batch), batch);
        allocs.push((name, a, by));
        g.finish();
    }

    let mut g = c.benchmark_group("part");
    g.sample_size(10);
    g.throughput(Throughput::Elements(100_000));
    let mut order: Vec<u64> = (0..100_000).collect();
    order.shuffle(&mut rand::rngs::StdRng::seed_from_u64(1));
    let big = tree64(0..100_000);
    g.bench_function("Delete_Random", |b| {
        b.iter(|| {
            let mut txn = big.txn();
            for &k in &order {
                txn.delete(&key64(k));
            }
        })
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

/// Runs the whole suite, then prints allocations per operation.
pub(crate) fn main() {
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
