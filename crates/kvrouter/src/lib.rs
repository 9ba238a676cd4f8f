//! `kvrouter`: the KV-cache-aware router service.
//!
//! Inference engines (vLLM, SGLang) publish "blocks stored / removed /
//! cleared" events over ZeroMQ; the router subscribes to each ([`ingest`]),
//! decodes them ([`wire`]), keeps their order and fills gaps by replay
//! ([`seq`]), maps them to index events ([`convert`]) and applies them to
//! one `kvindex` per model ([`registry`]). Over HTTP ([`http`]) it answers
//! which worker holds how much of a prompt (Dynamo's standalone-indexer
//! API) and where to send a request (`/route`, with the policies of
//! `kvroute`). [`approx`] covers engines that publish nothing.
//!
//! Without the default `service` feature the crate is its pure parts:
//! the wire decoders, sequencing, conversion and the tokenizer.
//!
//! See `docs/design.md`.
#![deny(missing_docs, unsafe_op_in_unsafe_fn)]
#![deny(unsafe_code)]

#[cfg(feature = "service")]
pub mod approx;
#[cfg(feature = "service")]
pub mod config;
pub mod convert;
#[cfg(feature = "service")]
pub mod gateway;
#[cfg(feature = "service")]
pub mod http;
#[cfg(feature = "service")]
pub mod ingest;
#[cfg(feature = "service")]
pub mod metrics;
pub mod record;
#[cfg(feature = "service")]
pub mod registry;
#[cfg(feature = "service")]
pub mod replica;
pub mod seq;
#[cfg(feature = "service")]
pub mod service;
#[cfg(feature = "service")]
pub mod snapshot;
#[cfg(feature = "service")]
pub mod sys;
pub mod tokenize;
pub mod wire;

#[cfg(feature = "service")]
mod serve;
#[cfg(feature = "service")]
pub use config::{RouterArgs, WorkerArg};
#[cfg(feature = "service")]
pub use serve::{serve, shutdown_signal};
#[cfg(feature = "service")]
pub use service::{PromptHashes, Service, ServiceError};
