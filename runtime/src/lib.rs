//! shadowbrain's substrate: the memory model, the durable store (sled or LMDB behind one
//! ordered-KV trait), the derived vector (arroy) and keyword (tantivy) indexes, policies,
//! embedders, hybrid recall, the memory lifecycle (decay, condensation, feedback), the
//! knowledge pool and the runtime clock. A plain library: no actors, no HTTP —
//! those live in `shadowbrain-actors` and the root package and call down into this crate.
#![warn(missing_docs)]

pub mod clock;
pub mod embed;
pub mod error;
pub mod eval;
pub mod evaluate;
pub mod keys;
pub mod keyword;
pub mod knowledge;
pub mod kv;
pub mod lifecycle;
pub mod llm;
pub mod model;
pub mod policy;
pub mod quarantine;
pub mod retrieval;
pub mod store;
pub mod substrate;
pub mod text;
pub mod transfer;
pub mod vector;

pub use clock::{Clock, SystemClock, Timestamp, VirtualClock};
pub use error::{Error, PolicyErrors, PolicyIssue, Result};
pub use model::{
    AuditAction, AuditEntry, Kind, Limits, MemoryId, MemoryRecord, NewMemory, PolicyStamp, Status,
    Tier, Utility,
};
