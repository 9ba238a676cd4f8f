//! Simulated engines as real services on loopback (one test binary: fewer
//! links): the engine alone over HTTP and ZMQ, and a fleet of them behind
//! the router's gateway.
mod engine_server;
mod gateway;
mod gateway_replay;
