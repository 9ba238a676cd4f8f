//! part benchmarks on the system allocator (`part_mimalloc`: the same
//! suite on mimalloc). `cargo bench -p part --bench part` runs everything; a
//! filter argument selects benchmarks (`cargo bench -p part --bench part --
//! Insert`).

mod suite;

#[global_allocator]
static GLOBAL: suite::Counting<std::alloc::System> = suite::Counting(std::alloc::System);

fn main() {
    suite::main();
}
