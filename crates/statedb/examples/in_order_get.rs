//! Point reads in key order over a 100k-object table (the suite's
//! `FullIteration_Get`), or with `all` a full scan (`FullIteration_All`), in
//! a fresh process, for profilers; with `LAYOUT=1` it also prints how far
//! apart consecutive keys' leaves lie in memory.
//!
//! `cargo run --release -p statedb --example in_order_get -- [get|all] [PASSES]`
//! (`SCATTER=1`: the table is filled into a heap whose free blocks of the
//! leaves' and objects' sizes lie in random order, as after other work, so
//! consecutive keys' leaves and objects are far apart)

// The benchmark suite's fixtures: `TestObject`, tables, `fill`.
#[path = "../benches/common.rs"]
mod common;

use common::{fill, new_db};

// The suite's allocator: placement differs between allocators.
use test_support::fast_mimalloc;

#[global_allocator]
static ALLOC: fast_mimalloc::FastMiMalloc = fast_mimalloc::FastMiMalloc;

const BIG: u64 = 100_000;

fn main() {
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_else(|| "get".into());
    let passes: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(50);
    let b = new_db(false);
    // Blocks of the leaves' and objects' sizes, a third of them kept (and
    // leaked) so the rest are free in random order when the fill runs.
    if std::env::var_os("SCATTER").is_some() {
        let mut blocks: Vec<Box<[u64; 6]>> = (0..6 * BIG).map(|i| Box::new([i; 6])).collect();
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for i in (1..blocks.len()).rev() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            blocks.swap(i, (x % (i as u64 + 1)) as usize);
        }
        for (i, blk) in blocks.into_iter().enumerate() {
            if i % 3 == 0 {
                std::mem::forget(blk);
            }
        }
    }
    fill(&b, BIG);
    let (db, table, by_id) = (&b.db, &b.table, &b.by_id);
    let r = db.read_txn();
    if std::env::var_os("LAYOUT").is_some() {
        // Distance between consecutive keys' values (inside their leaves):
        // the most common distances, far jumps folded into +-99999.
        let mut hist = std::collections::BTreeMap::<i64, u64>::new();
        let mut prev = 0i64;
        for id in 0..BIG {
            let Ok(Some(o)) = table.get(&r, by_id, &id) else {
                unreachable!("id {id} was inserted")
            };
            let a = o as *const _ as i64;
            let d = a - prev;
            let k = if d.abs() < 1024 {
                d
            } else {
                99999 * d.signum()
            };
            *hist.entry(k).or_default() += 1;
            prev = a;
        }
        let mut v: Vec<_> = hist.into_iter().collect();
        v.sort_by_key(|x| std::cmp::Reverse(x.1));
        println!("distance: count {:?}", &v[..v.len().min(8)]);
    }
    let t0 = std::time::Instant::now();
    let mut found = 0;
    for _ in 0..passes {
        if mode == "allptr" {
            for o in table.all(&r).expect("table is in the db") {
                found += std::hint::black_box(o) as *const _ as u64 & 1;
            }
        } else if mode == "all" {
            for o in table.all(&r).expect("table is in the db") {
                found += std::hint::black_box(o).id & 1;
            }
        } else {
            for id in 0..BIG {
                found += std::hint::black_box(table.get(&r, by_id, &id)).is_ok_and(|o| o.is_some())
                    as u64;
            }
        }
    }
    let ns = t0.elapsed().as_nanos() as f64 / (passes * BIG) as f64;
    println!("{mode}: {ns:.1} ns per object ({found})");
}
