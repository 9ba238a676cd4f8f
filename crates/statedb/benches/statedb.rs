//! statedb benchmarks (placeholder).
fn main() {}
