//! The `statedb` benchmark suite on the system allocator (group
//! `statedb-sysalloc`); see `statedb.rs`.

mod common;
mod suite;

fn main() {
    suite::main("statedb-sysalloc");
}
