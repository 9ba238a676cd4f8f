//! Memory latency on this machine: a dependent pointer chase over a random
//! cycle through N MiB (one 64-byte line per step). `Delete_Random` walks a
//! 100k-key tree (about 8 MiB of nodes and leaves) in random order and waits
//! on two such loads per delete; this puts a floor under it.
//!
//! `cargo run --release -p part --example latency -- [MIB...]` (default 1 4 8 32)

use std::time::Instant;

/// Steps of the chase per size.
const STEPS: usize = 10_000_000;
/// One cache line, in `usize` slots.
const LINE: usize = 8;

fn chase(mib: usize) -> f64 {
    let lines = (mib << 20) / 64;
    // A random cyclic order of the lines (xorshift-driven Fisher-Yates).
    let mut order: Vec<usize> = (0..lines).collect();
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for i in (1..lines).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        order.swap(i, (x % (i as u64 + 1)) as usize);
    }
    let mut next = vec![0usize; lines * LINE];
    for w in 0..lines {
        next[order[w] * LINE] = order[(w + 1) % lines] * LINE;
    }
    let mut p = order[0] * LINE;
    let t = Instant::now();
    for _ in 0..STEPS {
        p = next[p];
    }
    let ns = t.elapsed().as_nanos() as f64 / STEPS as f64;
    std::hint::black_box(p);
    ns
}

fn main() {
    let sizes: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let sizes = if sizes.is_empty() {
        vec![1, 4, 8, 32]
    } else {
        sizes
    };
    for mib in sizes {
        println!("{mib:>4} MiB: {:.1} ns per dependent load", chase(mib));
    }
}
