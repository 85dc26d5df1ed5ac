//! shadowbrain's substrate: the memory model, the durable store (sled or LMDB behind one
//! ordered-KV trait), the derived vector (arroy) and keyword (tantivy) indexes, policies,
//! embedders, hybrid recall, the memory lifecycle (decay, condensation, feedback), the
//! knowledge pool and the runtime clock. A plain library: no actors, no HTTP —
//! those live in `shadowbrain-actors` and the root package and call down into this crate.
//!
//! The modules are private; what an application needs is re-exported here (the way arroy's
//! `lib.rs` curates its surface): the [`Substrate`] handle and its requests and answers,
//! the memory model, the clock, the one [`Error`]. Families with many parts keep a module
//! of their own: [`policy`] (the policy schema, compiled), [`embed`] (embedders),
//! [`llm`] (the judge and condenser over an OpenAI-compatible endpoint), [`eval`]
//! (retrieval benchmarks), [`transfer`] (export and import), [`updates`] (whether a newer
//! record supersedes, contradicts or repeats an older one). [`internals`] is for the few
//! that need more — the store, the indexes, text analysis — such as benchmarks and tests.
//!
//! Layers, lowest first (each uses only those before it): `clock`, `error`, `background`
//! (threads for work nobody waits on), `model` →
//! `store` (the system of record; no other module builds a key) and `index` (derived) →
//! `policy`, `retrieval`, `updates` (pure decisions) → `provider` (the one OpenAI-compatible
//! transport) → `embed` → `engine` (the [`Substrate`] handle over all of them, and the
//! seams a judge or summarizer plugs into) → `llm` (the LLM-backed judge and condenser),
//! `transfer`, `eval`.
#![warn(missing_docs)]

pub mod background;
mod clock;
pub mod embed;
mod engine;
mod error;
pub mod eval;
mod index;
pub mod llm;
mod model;
mod pages;
pub mod policy;
mod provider;
mod retrieval;
mod store;
pub mod transfer;
pub mod updates;

pub use clock::{
    Clock, DAY_MS, SystemClock, Timestamp, VirtualClock, parse_rfc3339, to_human, to_rfc3339,
};
pub use engine::{
    CLOSE_BUILD_LIMIT, Chain, Condensed, Counted, EnrichWake, EvaluationReport, Fading,
    FeedbackReport, FeedbackTarget, Graph, IDEMPOTENCY_WINDOW, Idempotency, IndexKind, IndexPass,
    IndexingOptions, Insights, Judge, JudgeBatch, JudgeItem, Judgement, KNOWLEDGE_SESSION, Lent,
    MAX_REASON_BYTES, MAX_STRIKES, Outcome, PROMOTE_ROUND, PairBatch, PairItem, PairVerdict,
    PartAsk, PartFuture, PartHits, PartLink, PartRecord, PartScope, PassageHit, PathHit, Plan,
    Policies, Promotion, RecallPart, RecallRequest, RecallResult, Recalled, Recorded, Resolution,
    Spread, Substrate, SubstrateOptions, Summarizer, Summary, SummaryRequest, Superseded,
    SweepReport, UpdateJudge, UpdateMark, UpdateProbe, UpdatesRound, Verdict, WeakSubstrate, Why,
    panic_message, quarantined_error, recall_across,
};
pub use error::{Error, PolicyErrors, PolicyIssue, Result};
pub use index::CorpusStats;
pub use model::{
    AuditAction, AuditEntry, Edge, Kind, Limits, MemoryId, MemoryRecord, NewMemory, Passage,
    PolicyStamp, Relation, Status, Tier, Utility, validate_id,
};
pub use policy::Policy;
pub use retrieval::Scope;
pub use store::{
    Backend, Census, CommitLog, IdBlock, QuarantineEntry, Replica, SessionStats, Strikes, Validity,
    ValidityChange,
};

/// The parts under the [`Substrate`], for benchmarks, tests and tools that work on them
/// directly: the store and its write sets, the indexes, text analysis, the pure recall
/// functions. An application should not need them.
pub mod internals {
    pub use crate::index::passage::{OVERLAP_CHARS, PASSAGE_CHARS, is_long, split};
    pub use crate::index::text::{analyze, estimate_tokens};
    pub use crate::index::{
        BuildStats, KeywordIndex, QueryStats, VectorIndex, VectorOptions, VectorSource, cosine,
    };
    pub use crate::model::{Reinforce, ValidMemory, text_from_content, validate_embedding};
    pub use crate::store::{
        Catalog, Change, CommitStats, Filter, Listed, Mutation, Op, Queue, RecordPatch,
        Reinforcement, RememberedRecall, Store, StoreOptions, Visit, WriteSet, decode_entry,
        dir_disk_bytes, encode_entry, neighbours_in, stored_embedding,
    };
}
