//! part (placeholder).
