//! kvindex (placeholder).
