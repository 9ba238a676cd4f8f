//! The command line of `arbor kv replay` as a library, for the `arbor`
//! binary and for other tools that take the same flags (they flatten
//! [`ReplayArgs`] into their own `clap` parser, e.g.
//! `benches-peers/router-peer`): the flags and their translation into
//! [`kvreplay::ReplayOptions`], and the progress bars. The replay itself is
//! the `kvreplay` library. [`db_cmd`] is `arbor db`, a client of statedb's
//! HTTP API. [`engine_args`] holds the flags of `arbor kv engine`, a
//! simulated engine (`kvreplay::server`).
#![deny(missing_docs, unsafe_op_in_unsafe_fn)]
#![forbid(unsafe_code)]

pub mod db_cmd;
pub mod engine_args;
pub mod progress;
pub mod replay_args;

pub use engine_args::EngineArgs;
pub use replay_args::ReplayArgs;
