//! Runs one benchmark workload a fixed number of times, for profilers that
//! count instructions (`valgrind --tool=callgrind`) rather than time.
//!
//! `cargo run --release -p part --example workload -- insert 200`

use part::{Options, Tree};
use rand::seq::SliceRandom;
use rand::SeedableRng;

fn key(i: u32) -> [u8; 4] {
    (1000 + i).to_be_bytes()
}

fn big_and_order() -> &'static (Tree<u64>, Vec<u64>) {
    static BIG: std::sync::OnceLock<(Tree<u64>, Vec<u64>)> = std::sync::OnceLock::new();
    BIG.get_or_init(|| {
        // Root-only watches, as the bench (and Go's) builds it.
        let ro = Options {
            root_only_watch: true,
        };
        let mut t = Tree::with_options(ro).txn();
        for k in 0..100_000u64 {
            t.insert(&k.to_be_bytes(), k).unwrap();
        }
        // The bench's order: a seeded shuffle.
        let mut order: Vec<u64> = (0..100_000).collect();
        order.shuffle(&mut rand::rngs::StdRng::seed_from_u64(1));
        (t.commit(), order)
    })
}

/// Runs the workload named by the first argument.
pub fn main() {
    let mut args = std::env::args().skip(1);
    let what = args.next().unwrap_or_else(|| "insert".into());
    let reps: u32 = args.next().and_then(|s| s.parse().ok()).unwrap_or(100);
    let ro = Options {
        root_only_watch: true,
    };
    let mut t = Tree::with_options(ro).txn();
    for i in 0..1000 {
        t.insert(&key(i), i).unwrap();
    }
    let mut base = t.commit();
    let mut single: Tree<u64> = Tree::with_options(ro);
    let mut t64 = Tree::with_options(ro).txn();
    for k in 0..1000u64 {
        t64.insert(&k.to_be_bytes(), k).unwrap();
    }
    let t64 = t64.commit();
    let (one, _) = Tree::with_options(ro)
        .insert(&0u64.to_be_bytes(), 0u64)
        .unwrap();
    let mut sink = 0u64;
    for _ in 0..reps {
        match what.as_str() {
            "insert" => {
                let mut t = Tree::new().txn();
                for i in 0..1000 {
                    t.insert(&key(i), i).unwrap();
                }
                sink += t.commit().len() as u64;
            }
            "modify" => {
                let mut t = base.txn();
                for i in 0..1000 {
                    t.modify(&key(i), |v| v.copied().unwrap_or(0)).unwrap();
                }
                base = t.commit();
            }
            "getinsert" => {
                // The bench's GetInsert: a lookup, then a write of the key.
                let mut t = base.txn();
                for i in 0..1000 {
                    let v = t.get(&key(i)).copied().unwrap_or(0);
                    t.insert(&key(i), v).unwrap();
                }
                base = t.commit();
            }
            "get" => {
                for i in 0..1000 {
                    sink += *base.get(&key(i)).unwrap() as u64;
                }
            }
            "all_big" => {
                // A scan over the 100k-key tree.
                let (big, _) = big_and_order();
                sink += big.iter().map(|(_, v)| *v).sum::<u64>();
            }
            "get64" => {
                // The bench's Get: 8-byte keys 0..1000.
                for k in 0..1000u64 {
                    sink += *t64.get(&k.to_be_bytes()).unwrap();
                }
            }
            "all" => {
                sink += base.iter().map(|(_, v)| *v as u64).sum::<u64>();
            }
            "txn1" => {
                for i in 0..1000 {
                    let mut t = base.txn();
                    t.insert(&key(i), i + 1).unwrap();
                    base = t.commit();
                }
            }
            "txn_1" => {
                // The bench's txn_1: one 8-byte key written over and over.
                for i in 0..1000u64 {
                    let mut t = single.txn();
                    t.insert(&0u64.to_be_bytes(), i).unwrap();
                    single = t.commit();
                }
            }
            "txn_delete_1000" => {
                // The bench's txn_delete_1000: every key of a 1000-key tree
                // of 8-byte keys deleted in one txn, which is dropped.
                let mut t = t64.txn();
                for k in 0..1000u64 {
                    t.delete(&k.to_be_bytes());
                }
                sink += t.len() as u64;
            }
            "txn_delete_1" => {
                // The bench's txn_delete_1, 1000 times.
                for _ in 0..1000 {
                    let mut t = one.txn();
                    t.delete(&0u64.to_be_bytes());
                    sink += t.len() as u64;
                }
            }
            "delete" => {
                let mut t = base.txn();
                for i in 0..1000 {
                    t.delete(&key(i));
                }
                sink += t.len() as u64;
            }
            "delete_random" => {
                // Delete_Random: 100k 8-byte keys deleted in one txn, in a
                // fixed pseudo-random order.
                let (big, order) = big_and_order();
                let mut t = big.txn();
                for &k in order {
                    t.delete(&k.to_be_bytes());
                }
                sink += t.len() as u64;
            }
            other => {
                eprintln!(
                    "unknown workload {other}: insert | modify | txn1 | txn_1 | get | get64 | all_big | all | delete | delete_random | txn_delete_1 | txn_delete_1000"
                );
                std::process::exit(2);
            }
        }
    }
    println!("{sink}");
}
