//! KV95 benchmark (placeholder).
fn main() {}
