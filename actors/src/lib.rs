//! The actor runtime of shadowbrain: the supervision tree over the substrate, one actor
//! per live session, and the typed [`Runtime`] handle that hides every `ActorRef`.
//!
//! The tree (drawn in `supervisor.rs`): the root supervisor; the session supervisor and
//! session actors (ordered, durable writes; session recall; idle passivation; condensation
//! triggers; feedback); the evaluator (a judge's importance scores in `llm`/`hybrid` modes,
//! with poison records quarantined); the condenser (extractive); the decay actor (sweeps on
//! the runtime clock); the knowledge graph (promotion, merging, edges, neighbourhood
//! queries); the indexer (the one writer of the derived indexes); the enricher (the one
//! owner of embedding when the embedder does not embed inline).
#![warn(missing_docs)]

mod condenser;
mod decay;
mod directory;
mod enricher;
mod evaluator;
mod indexer;
mod knowledge;
mod runtime;
mod session;
mod supervisor;

#[cfg(feature = "failpoints")]
pub use runtime::Fault;
pub use runtime::{
    KnowledgeHandle, MemoryHandle, Runtime, RuntimeConfig, SessionHandle, WeakRuntime,
};
