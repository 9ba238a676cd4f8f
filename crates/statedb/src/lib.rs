//! statedb (placeholder).
