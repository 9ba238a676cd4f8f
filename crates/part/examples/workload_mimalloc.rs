//! `workload` on mimalloc, the allocator of the `part_mimalloc` bench.
//!
//! `cargo run --release -p part --example workload_mimalloc -- insert 200`

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[path = "workload.rs"]
mod workload;

fn main() {
    workload::main();
}
