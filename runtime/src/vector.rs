//! The vector index (STUB: being written).
