//! Criterion benchmarks (filled in later).
fn main() {}
