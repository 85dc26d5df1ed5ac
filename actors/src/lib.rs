//! The actor runtime of shadowbrain: the supervisor tree, per-session actors and the typed
//! `Runtime` handle. It is built in the actor-runtime issue; until then this crate only
//! re-exports the substrate so the dependency arrow runtime <- actors <- root already holds.
#![warn(missing_docs)]

pub use shadowbrain_runtime as substrate;
