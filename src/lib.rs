//! shadowbrain, the library: the actor runtime's [`Runtime`] handle and the substrate under
//! it, re-exported so an embedding application depends on one crate
//! (`shadowbrain::Runtime`). The HTTP server and the CLI are the binary's edges.
#![warn(missing_docs)]

pub use shadowbrain_actors::{Fault, KnowledgeHandle, Runtime, RuntimeConfig, SessionHandle};
pub use shadowbrain_runtime as substrate;
