//! The part benchmark suite on mimalloc (`part`: on the system allocator):
//! `cargo bench -p part --bench part_mimalloc`.

#[path = "support/fast_mimalloc.rs"]
mod fast_mimalloc;
mod suite;

#[global_allocator]
static GLOBAL: suite::Counting<fast_mimalloc::FastMiMalloc> =
    suite::Counting(fast_mimalloc::FastMiMalloc);

fn main() {
    suite::main();
}
