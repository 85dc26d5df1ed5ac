//! The keyword index (STUB: being written).
