//! shadowbrain, the library: the actor runtime's [`Runtime`] handle and the substrate under
//! it, re-exported so an embedding application depends on one crate
//! (`shadowbrain::Runtime`), and the HTTP server ([`server`]) the binary runs.
#![warn(missing_docs)]

pub use shadowbrain_actors::{Fault, KnowledgeHandle, Runtime, RuntimeConfig, SessionHandle};
pub use shadowbrain_runtime as substrate;

pub mod api;
pub mod config;
pub mod metrics;
pub mod server;
pub mod sim;
