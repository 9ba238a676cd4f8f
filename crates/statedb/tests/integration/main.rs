//! statedb's integration tests in one binary (one build and link of the
//! generic code they share). `memory.rs` stays a binary of its own: it
//! counts the process's allocations.

mod basic;
mod common;
mod derive;
mod errors;
mod keys;
mod metrics;
mod model;
mod read;
mod stress;
mod watch;
