//! statedb benchmarks, named after Go statedb's `BenchmarkDB_*` so figures
//! compare with its anchors. Throughput is objects (or lookups) per second;
//! 1000 objects unless the name says otherwise.
//!
//! This target runs on mimalloc (Go's figures come from its own allocator;
//! the system allocator scatters objects, which costs full iteration ~3x);
//! `--bench statedb_sysalloc` runs the same suite on the system allocator
//! (group `statedb-sysalloc`).
//!
//! `cargo bench -p statedb --bench statedb` runs all; add `-- WriteTxn` to
//! filter. `STATEDB_BENCH_CPU=1` measures the bench thread's on-CPU time
//! instead of wall time (for a machine shared with other work).
//! PropagationDelay and KV95 are custom mains: `--bench propagation`,
//! `--bench kv95`.

mod common;
mod suite;

use test_support::fast_mimalloc;

#[global_allocator]
static ALLOC: fast_mimalloc::FastMiMalloc = fast_mimalloc::FastMiMalloc;

fn main() {
    suite::main("statedb");
}
