//! Applies the synthetic default's event and lookup timeline to each index
//! on one thread, in time order, and prints the time per block operation.
//! For profiling the index write path without the stress harness around it
//! (`perf record` or `valgrind --tool=callgrind` on this example).
//!
//! `cargo run --release -p kvreplay --example apply_profile [ours|reference] [rounds]`

use std::time::Instant;

use kvindex::KvEventData;
use kvreplay::replay::{entry_block_ops, TimelineEntry};
use kvreplay::stress::IndexImpl;
use kvreplay::{NoProgress, ReplayOptions};

fn main() {
    let mut argv = std::env::args().skip(1);
    let which = argv.next().unwrap_or_else(|| "both".into());
    let rounds: usize = argv.next().and_then(|s| s.parse().ok()).unwrap_or(3);
    let tl = kvreplay::timeline(&ReplayOptions::default(), &NoProgress).expect("timeline");
    let all = tl.in_time_order();
    let ops: u64 = all.iter().map(|(_, e)| entry_block_ops(e)).sum();
    let impls: Vec<IndexImpl> = match which.as_str() {
        "ours" => vec![IndexImpl::Ours],
        "reference" => vec![IndexImpl::Reference],
        _ => vec![IndexImpl::Ours, IndexImpl::Reference],
    };
    for imp in impls {
        for _ in 0..rounds {
            let idx = imp.build();
            let t0 = Instant::now();
            let mut matched = 0u64;
            // (time, block ops) per kind: lookups, stores, removals, clears.
            let mut by_kind = [(std::time::Duration::ZERO, 0u64); 4];
            for (_, e) in &all {
                let t = Instant::now();
                let k = match e {
                    TimelineEntry::Query(h) => {
                        matched += idx
                            .find_matches(h)
                            .iter()
                            .map(|(_, s)| s as u64)
                            .sum::<u64>();
                        0
                    }
                    TimelineEntry::Event(ev) => {
                        let _ = idx.apply(ev);
                        match ev.data {
                            KvEventData::Stored { .. } => 1,
                            KvEventData::Removed { .. } => 2,
                            KvEventData::Cleared => 3,
                        }
                    }
                };
                by_kind[k].0 += t.elapsed();
                by_kind[k].1 += entry_block_ops(e);
            }
            let el = t0.elapsed();
            for (name, (d, n)) in ["lookup", "stored", "removed", "cleared"]
                .iter()
                .zip(by_kind)
            {
                if n > 0 {
                    println!(
                        "  {name:8} {n:9} ops {:8.1} ms {:6.1} ns/op",
                        d.as_secs_f64() * 1e3,
                        d.as_nanos() as f64 / n as f64
                    );
                }
            }
            println!(
                "{:9} {} block ops in {:?}: {:.1} ns/op ({:.2}M ops/s), matched {}",
                imp.name(),
                ops,
                el,
                el.as_nanos() as f64 / ops as f64,
                ops as f64 / el.as_secs_f64() / 1e6,
                matched
            );
        }
    }
}
