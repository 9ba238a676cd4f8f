//! kvrouter's integration tests in one binary (one build and link of the
//! service they start): the HTTP API, the OpenAI gateway against scripted
//! engines, and ingest from an independent Python publisher.

mod gateway;
mod http;
mod ingest;
mod publisher;
mod replicas;
mod support;
