//! The reconciler's integration tests, one binary (one build and link):
//! scenarios against a scripted fake external system on a manual clock, and
//! the model test.

mod common;
mod model;
mod scenarios;
