//! kvreplay: replay LLM traffic against simulated engines and a KV index.
#![deny(missing_docs, unsafe_op_in_unsafe_fn)]
#![forbid(unsafe_code)]

pub mod engine;
pub mod policy;
pub mod replay;
pub mod stress;
pub mod synth;
pub mod trace;
