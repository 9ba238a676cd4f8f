//! `workload` on mimalloc, the allocator of the `part_mimalloc` bench.
//!
//! `cargo run --release -p part --example workload_mimalloc -- insert 200`

use test_support::fast_mimalloc;

#[global_allocator]
static ALLOC: fast_mimalloc::FastMiMalloc = fast_mimalloc::FastMiMalloc;

#[path = "workload.rs"]
mod workload;

fn main() {
    workload::main();
}
