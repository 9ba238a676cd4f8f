//! The part benchmark suite on mimalloc (`part`: on the system allocator):
//! `cargo bench -p part --bench part_mimalloc`.

use test_support::fast_mimalloc;
mod suite;

#[global_allocator]
static GLOBAL: suite::Counting<fast_mimalloc::FastMiMalloc> =
    suite::Counting(fast_mimalloc::FastMiMalloc);

fn main() {
    suite::main();
}
