//! The `arbor` command-line tool.
fn main() {}
