//! The actor runtime of shadowbrain: the supervision tree over the substrate, one actor
//! per live session, and the typed [`Runtime`] handle that hides every `ActorRef`.
//!
//! Built so far: the root supervisor, the session supervisor and session actors (ordered,
//! durable writes; session recall; idle passivation; restart on failure). The evaluator,
//! condenser, decay, knowledge-graph and indexer actors come next (see `supervisor.rs`).
#![warn(missing_docs)]

mod runtime;
mod session;
mod supervisor;

pub use runtime::{Runtime, RuntimeConfig, SessionHandle};
pub use shadowbrain_runtime as substrate;
