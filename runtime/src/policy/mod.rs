//! Policies (STUB: being written).
