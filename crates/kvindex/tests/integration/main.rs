//! kvindex's integration tests in one binary (one build and link of the
//! code they share): behaviour by example, the differential property test
//! against the reference and a per-worker model, and the concurrent stress
//! test. `memory.rs` (it counts the process's allocations) and `loom.rs`
//! (built under `--cfg loom`) stay binaries of their own.

mod basic;
mod common;
mod differential;
mod stress;
