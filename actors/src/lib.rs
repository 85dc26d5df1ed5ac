//! The actor runtime of shadowbrain: the supervision tree over the substrate, one actor
//! per live session, and the typed [`Runtime`] handle that hides every `ActorRef`.
//!
//! Built so far: the root supervisor; the session supervisor and session actors (ordered,
//! durable writes; session recall; idle passivation; condensation triggers); the condenser
//! (extractive); the decay actor (sweeps on the runtime clock); the knowledge graph
//! (promotion, merging, edges, neighbourhood queries); feedback. The evaluator for LLM
//! scoring and an indexer actor come next (see `supervisor.rs`).
#![warn(missing_docs)]

mod condenser;
mod decay;
mod directory;
mod indexer;
mod knowledge;
mod runtime;
mod session;
mod supervisor;

pub use runtime::{Fault, KnowledgeHandle, Runtime, RuntimeConfig, SessionHandle};
pub use shadowbrain_runtime as substrate;
