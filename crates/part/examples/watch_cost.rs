//! What taking a watch costs a reader, on 1000 string keys (`obj-000000`
//! ...): a point watch (`get_watch` of a key: the leaf's lazy slot), a
//! prefix watch that ends where an inner node does (`obj-00012`: the node's
//! slot) and one that reaches a lone leaf (`obj-000123`: a held prefix
//! watch in the leaf's list, behind its mutex; design.md, "Writes that keep
//! a node's contents"). Each is timed over every key twice: the first pass
//! allocates the watches, the second finds them.
//!
//! `cargo run --release -p part --example watch_cost -- [KEYS] [ROUNDS]`
//! prints the best of ROUNDS in ns per call (default 1000 keys, 300 rounds).

use std::time::Instant;

#[path = "support/args.rs"]
mod args;

fn main() {
    let (n, rounds) = args::keys_and_rounds(
        "cargo run --release -p part --example watch_cost -- [KEYS] [ROUNDS]",
    );
    let keys: Vec<Vec<u8>> = (0..n).map(|i| format!("obj-{i:06}").into_bytes()).collect();
    let nodes: Vec<Vec<u8>> = keys.iter().map(|k| k[..k.len() - 1].to_vec()).collect();
    // [kind][pass]
    let mut best = [[f64::MAX; 2]; 3];
    let mut watches = Vec::with_capacity(n);
    for _ in 0..rounds {
        let mut txn = part::Tree::new().txn();
        for (i, k) in keys.iter().enumerate() {
            txn.insert(k, i).expect("short key");
        }
        let t = txn.commit();
        for (kind, row) in best.iter_mut().enumerate() {
            for slot in row.iter_mut() {
                watches.clear();
                let start = Instant::now();
                for i in 0..n {
                    watches.push(match kind {
                        0 => t.get_watch(&keys[i]).1,
                        1 => t.prefix_watch(&nodes[i]).1,
                        _ => t.prefix_watch(&keys[i]).1,
                    });
                }
                *slot = slot.min(start.elapsed().as_nanos() as f64 / n as f64);
            }
        }
        assert!(watches.iter().all(|w| !w.is_closed()));
    }
    for (name, [first, again]) in [
        "point watch (leaf slot)",
        "prefix watch, end of a node (node slot)",
        "prefix watch, a lone leaf (held, in its list)",
    ]
    .iter()
    .zip(best)
    {
        println!("{name}: {first:.1} ns first, {again:.1} ns again (best of {rounds})");
    }
}
