//! Support shared by the workspace's tests, benches and examples: global
//! allocators that count allocations and live bytes per thread shard
//! ([`counting`]) or run mimalloc with
//! small alignments on its plain path ([`fast_mimalloc`]); a word-level
//! tokenizer and chat template written in code ([`tokenizer`]). Not published.
#![deny(missing_docs, unsafe_op_in_unsafe_fn)]

pub mod counting;
pub mod fast_mimalloc;
pub mod tokenizer;
