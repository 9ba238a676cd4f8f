//! kvrouter's integration tests in one binary (one build and link of the
//! service they start): the HTTP API, and ingest from an independent
//! Python publisher.

mod http;
mod publisher;
mod support;
