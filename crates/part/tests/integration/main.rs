//! part's integration tests in one binary (one build and link of the
//! generic code they share): behaviour by example, the model-based property
//! tests, and the benches' allocator shim.

mod behaviour;
mod fast_mimalloc;
mod model;
