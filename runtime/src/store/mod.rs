//! The store: shadowbrain's system of record, over the ordered-KV seam ([`kv`]).
//!
//! It owns records, their embeddings (and long records' passages), per-session and per-namespace listings in time order,
//! session statistics, the append-only audit log, durable work queues and the index change
//! log, plus the on-disk format version. Every write goes through [`Store::write`], which
//! returns only after the data is flushed to disk; a single commit thread gathers the
//! writes that arrive while a flush is running and commits them together (group commit), so
//! concurrent writers share one fsync. The derived indexes (vectors, keywords) are *not*
//! here: they follow the change log and can be rebuilt from the store at any time.
//!
//! This file holds the types, opening (locks, format checks and upgrades) and the store's
//! own settings; `Store`'s methods are split by what they do: `mutations` (ids, writes,
//! tombstones), `reads` (records, scans, the catalog), `listings` (time order, sessions)
//! and `queues` (work queues, the change log).

mod catalog;
pub(crate) mod codec;
mod commit;
mod families;
mod ids;
pub(crate) mod keys;
pub(crate) mod kv;
mod listings;
mod log;
mod mutations;
mod queues;
mod reads;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, RwLock};

use serde::{Deserialize, Serialize};

pub use catalog::{Catalog, Census, Filter};
pub use codec::{RawJson, stored_embedding};
pub use commit::CommitStats;
pub use families::{
    Idempotent, QuarantineEntry, RememberedRecall, Strikes, Validity, ValidityChange,
};
pub use ids::IdBlock;
pub use kv::{Backend, Op, Visit, dir_disk_bytes};
pub use listings::neighbours_in;
pub use log::{CommitLog, Replica, decode_entry, encode_entry};

use crate::clock::Timestamp;
use crate::error::{Error, Result};
use crate::model::{AuditEntry, Edge, MemoryId, MemoryRecord, Passage, Reinforce, Status};
use keys::{family, meta};
use kv::{Kv, Range};

/// The on-disk format this build reads and writes. 2 added long records' passages and the
/// change log's `Embedded` entries; 3 added the strength table (a record's reinforced
/// strength, laid over its bytes) and the sessions' reinforcement logs. Older directories
/// are upgraded in place on open (each step is an addition), so an older build then
/// refuses them instead of misreading them: one that ignored the strength table would read
/// stale strengths and could write them back.
pub const FORMAT_VERSION: u32 = 3;

/// Durable work queues.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[repr(u8)]
pub enum Queue {
    /// Records waiting to be embedded and indexed.
    Enrich = 1,
    /// Records waiting to be scored by an external evaluator.
    Evaluate = 2,
    /// Sessions or records waiting for condensation.
    Condense = 3,
    /// Records waiting to be compared with older ones for updates and contradictions.
    Updates = 4,
    /// Condensed records the promotion policy admitted, waiting to be promoted into the
    /// knowledge pool (most wait for their embedding; see `engine/knowledge.rs`).
    Promote = 5,
}

/// A listing entry: a record's event time and id.
pub type Listed = (Timestamp, MemoryId);

/// One change the derived indexes must follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Change {
    /// The record's text or embedding is new or changed: (re)index it.
    Upsert(MemoryId),
    /// The record is gone: drop it from the indexes.
    Remove(MemoryId),
    /// Only the record's embedding is new (the enricher's): the vector index follows, the
    /// keyword index already has its unchanged text. Re-indexing the text would leave a
    /// deleted copy in tantivy's statistics until a merge, moving every BM25 score.
    Embedded(MemoryId),
}

/// Per-session statistics.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionStats {
    /// The session id.
    pub session_id: String,
    /// Episodic records written (one per event).
    pub events: u64,
    /// Records of every tier that belong to the session.
    pub memories: u64,
    /// When the first record was written (runtime clock).
    pub first_active: Timestamp,
    /// When the latest record was written (runtime clock).
    pub last_active: Timestamp,
}

/// One mutation inside a [`WriteSet`].
#[derive(Debug, Clone)]
pub enum Mutation {
    /// A new record: record, embedding, listings, session stats, catalog, change log.
    Insert(Box<MemoryRecord>),
    /// A changed record. `reindex` when its text or embedding changed.
    Update {
        /// The record as it is now.
        record: Box<MemoryRecord>,
        /// Whether the derived indexes must see it again.
        reindex: bool,
    },
    /// Remove a record for good (its audit log stays).
    Purge(Box<MemoryRecord>),
    /// Change some fields of a record as it is *at commit time* (read-modify-write in the
    /// commit thread), so concurrent writers never lose each other's updates.
    Patch(MemoryId, RecordPatch),
    /// A decision taken on a snapshot of the record (a decay sweep): the patch and its
    /// audit entry are applied together, and only if the record's `strength_at` is still
    /// `if_strength_at` — a reinforcement that committed meanwhile wins, and the sweep's
    /// decision, now stale, leaves no trace.
    PatchIf {
        /// The record.
        id: MemoryId,
        /// The `strength_at` the decision was taken on.
        if_strength_at: crate::clock::Timestamp,
        /// The change.
        patch: RecordPatch,
        /// Why, for the audit log.
        audit: AuditEntry,
    },
    /// Store a record's embedding (and have the indexes follow) without rewriting the
    /// record; skipped if the record was purged meanwhile.
    SetEmbedding(MemoryId, Vec<f32>),
    /// Store a long record's passages (none: delete them), beside the embedding written in
    /// the same set; skipped if the record was purged meanwhile.
    SetPassages(MemoryId, Vec<Passage>),
    /// Reinforce a record on the record as it is when the group commits, audited with its
    /// strength before and after; skipped if it was purged meanwhile. Recall's
    /// reinforcement is queued without waiting: decided at ranking time as an absolute
    /// strength, two recalls that ranked a record before either committed would both write
    /// "strength + amount", and one reinforcement would be lost (and a replay would differ
    /// with the commit timing).
    Reinforce {
        /// The record.
        id: MemoryId,
        /// By how much, when, under which policy.
        reinforcement: Reinforcement,
        /// Who, for the audit log.
        by: String,
    },
    /// Append to a record's audit log.
    Audit(MemoryId, AuditEntry),
    /// Put a record on a work queue.
    Enqueue(Queue, MemoryId),
    /// Take a record off a work queue.
    Dequeue(Queue, MemoryId),
    /// Drop change-log entries up to and including this sequence.
    TruncateChanges(u64),
    /// Remember what recall number `n` returned, for feedback on its recall id.
    RememberRecall(u32, RememberedRecall),
    /// Feedback on recall number `n`: whether it went well (kept apart from each
    /// record's utility, so that what successful recalls returned can be counted).
    RecallOutcome {
        /// The recall's number.
        recall: u32,
        /// Success (else failure).
        success: bool,
    },
    /// Remember what a write sent with an idempotency key did (written with the write).
    RememberIdempotent {
        /// The namespace the key belongs to.
        namespace: String,
        /// The key, as the client sent it.
        key: String,
        /// The write.
        entry: Idempotent,
    },
    /// Forget the idempotency keys written before this time (runtime clock).
    ExpireIdempotent(crate::clock::Timestamp),
    /// A knowledge-graph edge of a namespace (written again, it stays one edge).
    PutEdge(String, Edge),
    /// Remove a knowledge-graph edge (a conflict settled, a supersession undone by hand;
    /// the records' histories keep what it was).
    DeleteEdge(String, Edge),
    /// A condensed record was promoted (or merged) into this knowledge record.
    MarkPromoted {
        /// The condensed record.
        condensed: MemoryId,
        /// The knowledge record it went into.
        knowledge: MemoryId,
    },
    /// A record's strike count, replacing the one stored.
    SetStrikes(MemoryId, Strikes),
    /// Forget a record's strikes (processing it succeeded, or it was set aside).
    ClearStrikes(MemoryId),
    /// Set something aside (see `QuarantineEntry`).
    Quarantine(Box<QuarantineEntry>),
    /// Where a session's condensation stands: the largest record id it has covered.
    SetCondensedUpto {
        /// The namespace.
        namespace: String,
        /// The session.
        session: String,
        /// The largest record id condensed so far.
        upto: MemoryId,
    },
    /// Runtime-clock time of the decay sweep that just ran.
    SetLastDecaySweep(Timestamp),
    /// Change what is known about whether a record still holds (applied to its
    /// [`Validity`] as it is at commit time; skipped if the record was purged).
    Validity(MemoryId, ValidityChange),
}

/// A reinforcement to apply at commit time ([`Mutation::Reinforce`]).
#[derive(Clone)]
pub struct Reinforcement {
    /// What decides the new strength (the policy's forgetting curve and bounds).
    pub curve: Arc<dyn Reinforce>,
    /// When (the new `strength_at`).
    pub at: Timestamp,
    /// Strength added to the decayed strength.
    pub amount: f32,
}

impl std::fmt::Debug for Reinforcement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reinforcement")
            .field("curve", &self.curve.stamp())
            .field("at", &self.at)
            .field("amount", &self.amount)
            .finish()
    }
}

/// Field changes applied to a record at commit time ([`Mutation::Patch`]). Unset fields are
/// left alone; counters are added to.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RecordPatch {
    /// New status, and when it changed.
    pub status: Option<(Status, Timestamp)>,
    /// New strength, and the time it holds at.
    pub strength: Option<(f32, Timestamp)>,
    /// Reinforcements to add.
    pub add_reinforcements: u32,
    /// Successes to add to utility.
    pub add_successes: u32,
    /// Failures to add to utility.
    pub add_failures: u32,
    /// New importance.
    pub importance: Option<f32>,
    /// The policy that made this decision.
    pub policy: Option<crate::model::PolicyStamp>,
}

impl RecordPatch {
    /// Applies the patch to `r`.
    pub fn apply(&self, r: &mut MemoryRecord) {
        if let Some((s, at)) = self.status {
            r.status = s;
            r.status_at = at;
        }
        if let Some((s, at)) = self.strength {
            r.strength = s;
            r.strength_at = at;
        }
        r.reinforcements = r.reinforcements.saturating_add(self.add_reinforcements);
        r.utility.successes = r.utility.successes.saturating_add(self.add_successes);
        r.utility.failures = r.utility.failures.saturating_add(self.add_failures);
        if let Some(i) = self.importance {
            r.importance = i;
        }
        if let Some(p) = &self.policy {
            r.policy = p.clone();
        }
    }
}

/// Mutations that become durable together, atomically.
#[derive(Debug, Clone, Default)]
pub struct WriteSet(pub Vec<Mutation>);

impl WriteSet {
    /// An empty write set.
    pub fn new() -> Self {
        WriteSet(Vec::new())
    }

    /// Adds a mutation.
    pub fn push(&mut self, m: Mutation) -> &mut Self {
        self.0.push(m);
        self
    }

    /// Whether there is nothing to write.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Options for [`Store::open`].
#[derive(Debug, Clone, Default)]
pub struct StoreOptions {
    /// Which ordered-KV backend.
    pub backend: Backend,
    /// In a cluster, the log every commit group is appended to before it is committed
    /// here (see `store/log.rs`); `None` (single node) commits locally only.
    pub log: Option<Arc<dyn CommitLog>>,
    /// A cluster standby's copy: written only through [`Store::apply_logged`] (its
    /// owner's log) and its own indexes' bookkeeping; any other write is refused.
    pub standby: bool,
    /// The ids and recall numbers the store hands out: a cluster partition's block
    /// ([`IdBlock::of_partition`]), recorded on first open and refused if it differs
    /// later. `None`: the recorded block, else every id.
    pub ids: Option<IdBlock>,
}

impl StoreOptions {
    /// A cluster's copy (a log, or a standby of one) is durable in its log: a machine crash
    /// may undo its last commits, which it reads from the log again.
    fn durability(&self) -> kv::Durability {
        if self.log.is_some() || self.standby {
            kv::Durability::Logged
        } else {
            kv::Durability::Full
        }
    }
}

/// The system of record. Cheap to clone; every clone talks to the same commit thread.
#[derive(Debug, Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    kv: Arc<dyn Kv>,
    dir: PathBuf,
    catalog: Arc<RwLock<Catalog>>,
    next_id: Arc<AtomicU32>,
    next_recall: Arc<AtomicU32>,
    ids: IdBlock,
    committer: commit::Committer,
    _lock: File,
}

const LOCK_FILE: &str = "LOCK";

fn detect_backend(dir: &Path) -> Option<Backend> {
    if dir.join("data.mdb").exists() {
        Some(Backend::Lmdb)
    } else if dir.join("conf").exists() || dir.join("db").exists() {
        Some(Backend::Sled)
    } else {
        None
    }
}

impl Store {
    /// Opens (or creates) the store in `dir`. Refuses a directory held by another process, a
    /// directory made with the other backend, and another on-disk format version.
    pub fn open(dir: &Path, opts: StoreOptions) -> Result<Store> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let lock_path = dir.join(LOCK_FILE);
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| Error::io(&lock_path, e))?;
        if !take_lock(&lock) {
            return Err(Error::invalid(
                "data directory",
                format!(
                    "{} is in use by another shadowbrain process; stop it (or point this one \
                     at another --data directory) and try again",
                    dir.display()
                ),
            ));
        }
        if let Some(found) = detect_backend(dir)
            && found != opts.backend
        {
            return Err(Error::invalid(
                "backend",
                format!(
                    "{} holds a {} store but {} was asked for; open it with --backend {}",
                    dir.display(),
                    found.as_str(),
                    opts.backend.as_str(),
                    found.as_str()
                ),
            ));
        }
        let kv: Arc<dyn Kv> = Arc::from(kv::open(opts.backend, dir, opts.durability())?);
        check_format(kv.as_ref())?;

        let mut catalog = Catalog::default();
        let mut max_id: Option<u32> = None;
        let prefix = [family::RECORD];
        let mut end = Vec::new();
        kv.scan(Range::prefix(&prefix, &mut end), false, &mut |k, v| {
            let id = keys::id_from_key(k).ok_or_else(|| Error::Corrupt {
                key: format!("{k:02x?}"),
                message: "record key without an id".into(),
            })?;
            let header = codec::decode_header(k, v)?;
            catalog.insert(id, &header);
            max_id = Some(id.0);
            Ok(Visit::Continue)
        })?;
        // Which records are superseded or in conflict: few, so decoded at open.
        let prefix = [keys::layer::VALIDITY];
        let mut end = Vec::new();
        kv.scan(Range::prefix(&prefix, &mut end), false, &mut |k, v| {
            if let Some(id) = keys::id_from_key(k) {
                let validity: Validity = codec::decode(k, v)?;
                catalog.set_validity(id, validity.superseded(), !validity.conflicts.is_empty());
            }
            Ok(Visit::Continue)
        })?;
        // Keys only: which records have passages.
        let prefix = [family::PASSAGES];
        let mut end = Vec::new();
        kv.scan(Range::prefix(&prefix, &mut end), false, &mut |k, _| {
            if let Some(id) = keys::id_from_key(k) {
                catalog.set_passages(id, true);
            }
            Ok(Visit::Continue)
        })?;
        let ids = ids::settle(kv.as_ref(), dir, opts.ids)?;
        let stored_next = read_u32(kv.as_ref(), meta::NEXT_ID)?.unwrap_or(0);
        // A cluster store from before blocks keeps the ids it gave out and hands out new
        // ones from its block.
        let next_id = stored_next
            .max(max_id.map_or(0, |m| m.saturating_add(1)))
            .max(ids.first);
        let next_seq = read_u64(kv.as_ref(), meta::NEXT_SEQ)?.unwrap_or(1);
        // Stores from before recalls had their own counter drew recall numbers from the
        // record ids: starting at `next_id` reuses none of them.
        let next_recall = read_u32(kv.as_ref(), meta::NEXT_RECALL)?
            .unwrap_or(next_id)
            .max(ids.first);

        let catalog = Arc::new(RwLock::new(catalog));
        let next_id = Arc::new(AtomicU32::new(next_id));
        let next_recall = Arc::new(AtomicU32::new(next_recall));
        let committer = commit::Committer::start(
            kv.clone(),
            catalog.clone(),
            commit::Counters {
                next_id: next_id.clone(),
                next_recall: next_recall.clone(),
            },
            next_seq,
            dir.to_path_buf(),
            opts.log.clone(),
            opts.standby,
        )?;
        Ok(Store {
            inner: Arc::new(Inner {
                kv,
                dir: dir.to_path_buf(),
                catalog,
                next_id,
                next_recall,
                ids,
                committer,
                _lock: lock,
            }),
        })
    }

    /// The ids and recall numbers this store hands out.
    pub fn id_block(&self) -> IdBlock {
        self.inner.ids
    }

    /// The backend in use.
    pub fn backend(&self) -> Backend {
        self.inner.kv.backend()
    }

    /// The directory the store lives in.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// The embedding dimension recorded in the store, if any embedding was ever stored.
    pub fn dimension(&self) -> Result<Option<usize>> {
        Ok(read_u32(self.inner.kv.as_ref(), meta::DIMENSION)?.map(|d| d as usize))
    }

    /// The name of the embedder recorded in the store.
    pub fn embedder_name(&self) -> Result<Option<String>> {
        Ok(self
            .inner
            .kv
            .get(&keys::meta(meta::EMBEDDER))?
            .map(|v| String::from_utf8_lossy(&v).into_owned()))
    }

    /// Records the embedder's name and dimension on first use, and refuses a different
    /// dimension — or, at the same dimension, another embedder, whose vectors cannot be
    /// compared with the stored ones — later (the errors name `shadowbrain reindex`).
    pub fn ensure_dimension(&self, dimension: usize, embedder: &str) -> Result<()> {
        match self.dimension()? {
            Some(d) if d == dimension => match self.embedder_name()? {
                Some(stored) if stored != embedder => Err(Error::invalid(
                    "embedder",
                    format!(
                        "this store's embeddings were made by `{stored}` but `{embedder}` is \
                         configured, and vectors of different models cannot be compared; \
                         configure `{stored}` again, or run `shadowbrain reindex` to re-embed \
                         every record with `{embedder}`"
                    ),
                )),
                _ => Ok(()),
            },
            Some(d) => Err(Error::DimensionMismatch {
                got: dimension,
                expected: d,
            }),
            None => self.reset_dimension(dimension, embedder),
        }
    }

    /// The text-analyzer version the keyword index was built with, if recorded.
    pub fn analyzer_version(&self) -> Result<Option<u32>> {
        read_u32(self.inner.kv.as_ref(), meta::ANALYZER)
    }

    /// Records the text-analyzer version (after the keyword index was rebuilt with it).
    pub fn set_analyzer_version(&self, version: u32) -> Result<()> {
        let op = kv::Op::Put(keys::meta(meta::ANALYZER), version.to_be_bytes().to_vec());
        self.inner.kv.commit(&[&[op]])
    }

    /// Records the dimension and embedder, replacing what was there (first use, and
    /// `reindex` after it re-embedded every record).
    pub fn reset_dimension(&self, dimension: usize, embedder: &str) -> Result<()> {
        let ops = vec![
            kv::Op::Put(
                keys::meta(meta::DIMENSION),
                (dimension as u32).to_be_bytes().to_vec(),
            ),
            kv::Op::Put(keys::meta(meta::EMBEDDER), embedder.as_bytes().to_vec()),
        ];
        self.inner.kv.commit(&[&ops])
    }

    /// Bytes on disk (the store's files only).
    pub fn disk_bytes(&self) -> Result<u64> {
        self.inner.kv.disk_bytes()
    }

    /// Group-commit counters: commits and writes so far.
    pub fn commit_stats(&self) -> CommitStats {
        self.inner.committer.stats()
    }

    /// The backend a store directory was created with, or `None` when it holds no store
    /// yet; lets a tool open a directory without being told its backend.
    pub fn detect_backend(dir: &Path) -> Option<Backend> {
        detect_backend(dir)
    }

    /// Whether another process (or another open [`Store`]) holds the directory's lock right
    /// now. Creates nothing: a missing directory or lock file is not in use. Only a hint for
    /// a friendlier message before opening — [`Store::open`] takes the lock itself.
    pub fn in_use(dir: &Path) -> Result<bool> {
        let lock_path = dir.join(LOCK_FILE);
        let lock = match File::options().write(true).open(&lock_path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(Error::io(&lock_path, e)),
        };
        match lock.try_lock() {
            // Dropping the file releases the lock at once.
            Ok(()) => Ok(false),
            Err(std::fs::TryLockError::WouldBlock) => Ok(true),
            Err(std::fs::TryLockError::Error(e)) => Err(Error::io(&lock_path, e)),
        }
    }
}

/// Takes the directory's lock, waiting a moment for it. A process that forks (a test
/// harness starting the binary, a tool running a command) gives its child a copy of every
/// descriptor until the child execs, and a `flock` lasts while any copy is open: a store
/// closed and reopened during that window would be refused as "in use" although nobody
/// uses it. A real holder keeps the lock far longer than the wait.
fn take_lock(lock: &File) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(250);
    loop {
        if lock.try_lock().is_ok() {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// The fixed-width value under `key` (a counter, an id, a time), if any; `what` names it
/// in the corruption error of a value of another width.
fn read_fixed<const N: usize>(kv: &dyn Kv, key: &[u8], what: &str) -> Result<Option<[u8; N]>> {
    match kv.get(key)? {
        Some(v) => v
            .as_slice()
            .try_into()
            .map(Some)
            .map_err(|_| Error::Corrupt {
                key: what.into(),
                message: format!("expected {N} bytes, found {}", v.len()),
            }),
        None => Ok(None),
    }
}

fn read_u32(kv: &dyn Kv, name: &str) -> Result<Option<u32>> {
    Ok(read_fixed(kv, &keys::meta(name), name)?.map(u32::from_be_bytes))
}

fn read_u64(kv: &dyn Kv, name: &str) -> Result<Option<u64>> {
    Ok(read_fixed(kv, &keys::meta(name), name)?.map(u64::from_be_bytes))
}

fn check_format(kv: &dyn Kv) -> Result<()> {
    match read_u32(kv, meta::FORMAT_VERSION)? {
        Some(FORMAT_VERSION) => Ok(()),
        Some(found) if !(1..FORMAT_VERSION).contains(&found) => Err(Error::FormatVersion {
            found,
            expected: FORMAT_VERSION,
        }),
        Some(_) | None => {
            let mut ops = vec![kv::Op::Put(
                keys::meta(meta::FORMAT_VERSION),
                FORMAT_VERSION.to_be_bytes().to_vec(),
            )];
            if read_u64(kv, meta::NEXT_SEQ)?.is_none()
                && read_u64(kv, meta::CHANGES_TRUNCATED)?.is_none()
            {
                // A new store: its change log is whole, as the truncation mark says, so an
                // index it opens with can always be caught up from it (see `reconcile`).
                ops.push(kv::Op::Put(
                    keys::meta(meta::CHANGES_TRUNCATED),
                    0u64.to_be_bytes().to_vec(),
                ));
            }
            kv.commit(&[&ops])
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only a cluster's copies — durable in their log — give up the meta page's flush.
    #[test]
    fn only_a_copy_of_a_log_gives_up_a_flush() {
        let standby = StoreOptions {
            standby: true,
            ..StoreOptions::default()
        };
        assert_eq!(standby.durability(), kv::Durability::Logged);
        assert_eq!(StoreOptions::default().durability(), kv::Durability::Full);
    }

    fn with(ids: Option<IdBlock>) -> StoreOptions {
        StoreOptions {
            ids,
            ..StoreOptions::default()
        }
    }

    fn ids_of(store: &Store, n: usize) -> Vec<u32> {
        store
            .allocate_ids(n)
            .unwrap()
            .into_iter()
            .map(|id| id.0)
            .collect()
    }

    /// A partition's store hands out ids and recall numbers from its block only, keeps the
    /// block across reopens (asked for again or not), and refuses another block.
    #[test]
    fn a_store_hands_out_ids_from_its_block_and_keeps_it() {
        let dir = tempfile::tempdir().unwrap();
        let block = IdBlock::of_partition(5, 8);
        let store = Store::open(dir.path(), with(Some(block))).unwrap();
        assert_eq!(
            ids_of(&store, 3),
            [block.first, block.first + 1, block.first + 2]
        );
        assert_eq!(store.allocate_recall().unwrap(), block.first);
        store.write(WriteSet::new()).unwrap();
        drop(store);
        let store = Store::open(dir.path(), with(None)).unwrap();
        assert_eq!(store.id_block(), block, "the recorded block, unasked");
        assert_eq!(ids_of(&store, 1), [block.first + 3]);
        assert_eq!(store.allocate_recall().unwrap(), block.first + 1);
        drop(store);
        let err = Store::open(dir.path(), with(Some(IdBlock::of_partition(5, 16)))).unwrap_err();
        assert!(err.to_string().contains("partition count"), "{err}");
        assert_eq!(
            Store::open(dir.path(), with(Some(block)))
                .unwrap()
                .id_block(),
            block
        );
    }

    /// The block's end is a hard end: a batch that would cross it is refused whole, and an
    /// id outside the block is never reserved (an import of another partition's ids).
    #[test]
    fn a_block_ends_where_it_says() {
        let dir = tempfile::tempdir().unwrap();
        let block = IdBlock {
            first: 10,
            last: 12,
        };
        let store = Store::open(
            dir.path(),
            StoreOptions {
                ids: Some(block),
                ..StoreOptions::default()
            },
        )
        .unwrap();
        assert_eq!(ids_of(&store, 2), [10, 11]);
        let err = store.allocate_ids(2).unwrap_err();
        assert!(err.to_string().contains("0000000a…0000000c"), "{err}");
        assert_eq!(ids_of(&store, 1), [12]);
        assert!(store.allocate_ids(1).is_err());
        assert!(store.reserve_ids_through(MemoryId(9)).is_err());
        assert!(store.reserve_recalls_through(13).is_err());
        store.reserve_recalls_through(11).unwrap();
        assert_eq!(store.allocate_recall().unwrap(), 12);
        assert!(store.allocate_recall().is_err());
    }

    /// A cluster store from before blocks keeps the ids it handed out and hands out new
    /// ones from the block it is given.
    #[test]
    fn a_store_from_before_blocks_takes_its_block_for_new_ids() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
        assert_eq!(store.id_block(), IdBlock::WHOLE);
        assert_eq!(ids_of(&store, 2), [0, 1]);
        store.write(WriteSet::new()).unwrap();
        drop(store);
        let block = IdBlock::of_partition(1, 4);
        let store = Store::open(dir.path(), with(Some(block))).unwrap();
        assert_eq!(ids_of(&store, 1), [block.first]);
        assert_eq!(store.allocate_recall().unwrap(), block.first);
    }

    fn set_format(dir: &Path, version: u32) {
        let kv = kv::open(Backend::default(), dir, kv::Durability::Full).unwrap();
        let op = kv::Op::Put(
            keys::meta(meta::FORMAT_VERSION),
            version.to_be_bytes().to_vec(),
        );
        kv.commit(&[&[op]]).unwrap();
    }

    #[test]
    fn a_new_store_marks_its_change_log_whole_and_an_old_one_is_left_unmarked() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
        assert_eq!(store.changes_truncated().unwrap(), Some(0));
        drop(store);
        // A store from before the mark (it has written, nothing says how far its log was
        // truncated): opening it does not claim a whole log.
        let old = tempfile::tempdir().unwrap();
        let kv = kv::open(Backend::default(), old.path(), kv::Durability::Full).unwrap();
        let op = kv::Op::Put(keys::meta(meta::NEXT_SEQ), 40u64.to_be_bytes().to_vec());
        kv.commit(&[&[op]]).unwrap();
        drop(kv);
        let store = Store::open(old.path(), StoreOptions::default()).unwrap();
        assert_eq!(store.changes_truncated().unwrap(), None);
    }

    #[test]
    fn older_format_directories_are_upgraded_and_an_unknown_format_refused() {
        let dir = tempfile::tempdir().unwrap();
        drop(Store::open(dir.path(), StoreOptions::default()).unwrap());
        for older in 1..FORMAT_VERSION {
            set_format(dir.path(), older);
            drop(Store::open(dir.path(), StoreOptions::default()).unwrap());
            let kv = kv::open(Backend::default(), dir.path(), kv::Durability::Full).unwrap();
            assert_eq!(
                read_u32(kv.as_ref(), meta::FORMAT_VERSION).unwrap(),
                Some(FORMAT_VERSION)
            );
        }
        set_format(dir.path(), 99);
        let err = Store::open(dir.path(), StoreOptions::default()).unwrap_err();
        assert!(
            matches!(err, Error::FormatVersion { found: 99, .. }),
            "{err}"
        );
    }
}
