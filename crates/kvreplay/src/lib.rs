//! kvreplay (placeholder).
