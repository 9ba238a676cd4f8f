//! One-insert transactions on 1000 string keys, timed per insert: inserts
//! that push a shared leaf down under a new inner node (`obj-000123x`
//! beside `obj-000123`), which copy the leaf (design.md, "Writes that keep
//! a node's contents"), and inserts of new keys beside them (`obj-001000`,
//! ...).
//!
//! `cargo run --release -p part --example push_down -- [KEYS] [ROUNDS]`
//! prints the best of ROUNDS (default 1000 keys, 300 rounds).

use std::sync::Arc;
use std::time::Instant;

#[path = "support/args.rs"]
mod args;

fn main() {
    let (n, rounds) =
        args::keys_and_rounds("cargo run --release -p part --example push_down -- [KEYS] [ROUNDS]");
    let key = |i: usize, push: bool| {
        if push {
            format!("obj-{i:06}x").into_bytes()
        } else {
            format!("obj-{:06}", n + i).into_bytes()
        }
    };
    let mut best = [f64::MAX; 2];
    for _ in 0..rounds {
        let mut txn = part::Tree::new().txn();
        for i in 0..n {
            txn.insert(format!("obj-{i:06}").as_bytes(), Arc::new(i))
                .expect("short key");
        }
        let base = txn.commit();
        for (j, push) in [true, false].into_iter().enumerate() {
            let keys: Vec<Vec<u8>> = (0..n).map(|i| key(i, push)).collect();
            let mut t = base.clone();
            let start = Instant::now();
            for k in &keys {
                let mut txn = t.txn();
                txn.insert(k, Arc::new(0)).expect("short key");
                t = txn.commit();
            }
            let ns = start.elapsed().as_nanos() as f64 / n as f64;
            best[j] = best[j].min(ns);
        }
    }
    println!(
        "push-down insert {:.1} ns, plain insert {:.1} ns (best of {rounds})",
        best[0], best[1]
    );
}
