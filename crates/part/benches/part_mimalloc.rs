//! The part benchmark suite on mimalloc (`part`: on the system allocator):
//! `cargo bench -p part --bench part_mimalloc`.

mod suite;

#[global_allocator]
static GLOBAL: suite::Counting<mimalloc::MiMalloc> = suite::Counting(mimalloc::MiMalloc);

fn main() {
    suite::main();
}
