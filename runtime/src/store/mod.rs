//! The store: shadowbrain's system of record, over the ordered-KV seam ([`kv`]).
//!
//! It owns records, their embeddings (and long records' passages), per-session and per-namespace listings in time order,
//! session statistics, the append-only audit log, durable work queues and the index change
//! log, plus the on-disk format version. Every write goes through [`Store::write`], which
//! returns only after the data is flushed to disk; a single commit thread gathers the
//! writes that arrive while a flush is running and commits them together (group commit), so
//! concurrent writers share one fsync. The derived indexes (vectors, keywords) are *not*
//! here: they follow the change log and can be rebuilt from the store at any time.

mod catalog;
pub(crate) mod codec;
mod commit;
mod families;
mod keys;
pub(crate) mod kv;
mod log;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, RwLock};

use serde::{Deserialize, Serialize};

pub use catalog::{Catalog, Census, Filter};
pub use codec::{RawJson, stored_embedding};
pub use commit::CommitStats;
pub use families::{
    Idempotent, QuarantineEntry, RememberedRecall, Strikes, Validity, ValidityChange,
};
pub use kv::{Backend, Op, Visit, dir_disk_bytes};
pub use log::{CommitLog, Replica, decode_entry, encode_entry};

use crate::clock::Timestamp;
use crate::error::{Error, Result};
use crate::model::{AuditEntry, Edge, MemoryId, MemoryRecord, Passage, Reinforce, Status, Tier};
use keys::{family, meta};
use kv::{Kv, Range, Visitor};

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
        let kv: Arc<dyn Kv> = Arc::from(kv::open(opts.backend, dir)?);
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
        let stored_next = read_u32(kv.as_ref(), meta::NEXT_ID)?.unwrap_or(0);
        let next_id = stored_next.max(max_id.map_or(0, |m| m + 1));
        let next_seq = read_u64(kv.as_ref(), meta::NEXT_SEQ)?.unwrap_or(1);
        // Stores from before recalls had their own counter drew recall numbers from the
        // record ids: starting at `next_id` reuses none of them.
        let next_recall = read_u32(kv.as_ref(), meta::NEXT_RECALL)?.unwrap_or(next_id);

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
                committer,
                _lock: lock,
            }),
        })
    }

    /// The backend in use.
    pub fn backend(&self) -> Backend {
        self.inner.kv.backend()
    }

    /// The directory the store lives in.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// Hands out `n` fresh record ids. Ids of writes that never commit are skipped, never
    /// reused.
    pub fn allocate_ids(&self, n: usize) -> Result<Vec<MemoryId>> {
        let n32 = u32::try_from(n).map_err(|_| Error::invalid("batch", "too many records"))?;
        let first = self
            .inner
            .next_id
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |cur| {
                cur.checked_add(n32)
            })
            .map_err(|_| Error::storage(self.backend().as_str(), "record ids exhausted (2^32)"))?;
        Ok((first..first + n32).map(MemoryId).collect())
    }

    /// Applies entries of a cluster log, (position, bytes from
    /// [`encode_entry`]), as they are: one transaction with the last position, the
    /// entries at or below the applied position skipped, the catalog and counters then
    /// brought up to date. What a standby's store does with its owner's log.
    pub fn apply_logged(&self, entries: Vec<(u64, Vec<u8>)>) -> Result<()> {
        self.inner.committer.apply_logged(entries)
    }

    /// The position of the last cluster log entry applied to this store (0: none).
    pub fn log_applied(&self) -> Result<u64> {
        log::applied(self.inner.kv.as_ref())
    }

    /// Applies `writes` atomically and returns once they are durable. Blocks the calling
    /// thread (about a millisecond); async code should prefer [`Store::write_async`].
    pub fn write(&self, writes: WriteSet) -> Result<()> {
        self.inner.committer.submit_blocking(writes)
    }

    /// Queues `writes` for the next group commit and returns at once, without waiting for
    /// the flush: for side effects nobody waits on (recall's reinforcement). Writes are
    /// committed in the order they are queued, so any later [`Store::write`] returning
    /// means these are durable too; a crash before then loses them.
    pub fn write_detached(&self, writes: WriteSet) -> Result<()> {
        self.inner.committer.submit_detached(writes)
    }

    /// Returns once every write queued before this call (detached ones included) is
    /// durable.
    pub async fn sync(&self) -> Result<()> {
        self.write_async(WriteSet::new()).await
    }

    /// [`Store::write`] for async callers: awaits the durable commit without blocking.
    pub async fn write_async(&self, writes: WriteSet) -> Result<()> {
        self.inner.committer.submit_async(writes).await
    }

    /// Reads one record with its embedding.
    pub fn get(&self, id: MemoryId) -> Result<Option<MemoryRecord>> {
        Ok(self.get_many(&[id])?.pop().flatten())
    }

    /// Reads one record without its embedding (cheaper; for listings and rendering).
    pub fn get_light(&self, id: MemoryId) -> Result<Option<MemoryRecord>> {
        Ok(self.get_many_with(&[id], false)?.pop().flatten())
    }

    /// Reads a record only if it lives in `namespace`: namespace isolation is enforced here,
    /// so no caller can read across tenants by guessing an id.
    pub fn get_in(&self, namespace: &str, id: MemoryId) -> Result<MemoryRecord> {
        match self.get(id)? {
            Some(r) if r.namespace == namespace => Ok(r),
            _ => Err(Error::NotFound {
                what: "memory",
                id: id.to_string(),
            }),
        }
    }

    /// Several records with their embeddings, as [`get`](Self::get) reads each, in one
    /// snapshot of the backend (LMDB: one read transaction, values decoded in place). sled
    /// has no read snapshots: there a record and its reinforced strength are two reads, and
    /// a write that folds the strength into the record between them can leave the read a
    /// reinforcement behind (one more reason LMDB is the default).
    pub fn get_many(&self, ids: &[MemoryId]) -> Result<Vec<Option<MemoryRecord>>> {
        self.get_many_with(ids, true)
    }

    /// [`get_many`](Self::get_many), with the embeddings or without them (`embeddings`
    /// false: [`get_light`](Self::get_light) of each, in one snapshot).
    pub fn get_many_with(
        &self,
        ids: &[MemoryId],
        embeddings: bool,
    ) -> Result<Vec<Option<MemoryRecord>>> {
        self.get_many_deferred(ids, embeddings)?
            .into_iter()
            .map(|read| {
                read.map(|(mut r, json)| {
                    json.fill(&mut r)?;
                    Ok(r)
                })
                .transpose()
            })
            .collect()
    }

    /// [`get_many_with`](Self::get_many_with), each record's `content` and `metadata` left
    /// as JSON text ([`RawJson::fill`] parses them): recall reads many candidates and
    /// returns a few, and parsing JSON it never returns would cost it for nothing.
    pub fn get_many_deferred(
        &self,
        ids: &[MemoryId],
        embeddings: bool,
    ) -> Result<Vec<Option<(MemoryRecord, RawJson)>>> {
        let per = if embeddings { 3 } else { 2 };
        let keys: Vec<[[u8; 5]; 3]> = ids
            .iter()
            .map(|&id| [keys::record(id), keys::strength(id), keys::embedding(id)])
            .collect();
        let flat: Vec<&[u8]> = keys
            .iter()
            .flat_map(|k| &k[..per])
            .map(|k| &k[..])
            .collect();
        let mut out: Vec<Option<(MemoryRecord, RawJson)>> = Vec::with_capacity(ids.len());
        // Each id's record comes first, then its reinforced strength (laid over it), then
        // (when asked for) its embedding.
        self.inner.kv.get_each(&flat, &mut |i, value| {
            let (n, key) = (i / per, flat[i]);
            match (i % per, value) {
                (0, Some(bytes)) => out.push(Some(codec::decode_deferred(ids[n], key, bytes)?)),
                (0, None) => out.push(None),
                (1, Some(bytes)) => {
                    if let Some(Some((r, _))) = out.last_mut() {
                        codec::Strength::decode_over(key, bytes, r)?;
                    }
                }
                (_, Some(bytes)) => {
                    if let Some(Some((r, _))) = out.last_mut() {
                        r.embedding = Some(codec::decode_embedding(key, bytes)?);
                    }
                }
                (_, None) => {}
            }
            Ok(())
        })?;
        Ok(out)
    }

    /// Where each of `ids` sits: its namespace, session and event time (`None` for a
    /// record that is gone), read from the headers alone, in one snapshot.
    pub fn places(&self, ids: &[MemoryId]) -> Result<Vec<Option<(String, String, Timestamp)>>> {
        let keys: Vec<[u8; 5]> = ids.iter().map(|&id| keys::record(id)).collect();
        let flat: Vec<&[u8]> = keys.iter().map(|k| &k[..]).collect();
        let mut out = Vec::with_capacity(ids.len());
        self.inner.kv.get_each(&flat, &mut |i, value| {
            out.push(
                value
                    .map(|bytes| {
                        let h = codec::decode_header(flat[i], bytes)?;
                        Ok::<_, Error>((h.namespace, h.session_id, h.event_time))
                    })
                    .transpose()?,
            );
            Ok(())
        })?;
        Ok(out)
    }

    /// The namespace a record belongs to — or belonged to, if it was purged.
    pub fn owner(&self, id: MemoryId) -> Result<Option<String>> {
        if let Some(bytes) = self.inner.kv.get(&keys::record(id))? {
            return Ok(Some(
                codec::decode_header(&keys::record(id), &bytes)?.namespace,
            ));
        }
        Ok(self
            .inner
            .kv
            .get(&keys::tombstone(id))?
            .map(|v| String::from_utf8_lossy(&v).into_owned()))
    }

    /// A long record's passages with their embeddings (empty when it has none: a text that
    /// is not long, or one not embedded yet).
    pub fn passages(&self, id: MemoryId) -> Result<Vec<Passage>> {
        let key = keys::passages(id);
        match self.inner.kv.get(&key)? {
            Some(bytes) => codec::decode(&key, &bytes),
            None => Ok(Vec::new()),
        }
    }

    /// A record's embedding, if it has one.
    pub fn embedding(&self, id: MemoryId) -> Result<Option<Vec<f32>>> {
        let key = keys::embedding(id);
        match self.inner.kv.get(&key)? {
            Some(bytes) => codec::decode_embedding(&key, &bytes).map(Some),
            None => Ok(None),
        }
    }

    fn listing(
        &self,
        prefix: &[u8],
        before: Option<(Timestamp, MemoryId)>,
        limit: usize,
    ) -> Result<Vec<MemoryId>> {
        let mut end_buf = Vec::new();
        let bound;
        let range = match before {
            Some((t, id)) => {
                bound = {
                    let mut k = keys::listing_at(prefix, t);
                    k.extend_from_slice(&id.0.to_be_bytes());
                    k
                };
                Range::between(prefix, &bound)
            }
            None => Range::prefix(prefix, &mut end_buf),
        };
        let mut ids = Vec::new();
        if limit == 0 {
            return Ok(ids);
        }
        self.inner.kv.scan(range, true, &mut |k, _| {
            if let Some((_, id)) = keys::listing_time_id(k) {
                ids.push(id);
            }
            Ok(if ids.len() >= limit {
                Visit::Stop
            } else {
                Visit::Continue
            })
        })?;
        Ok(ids)
    }

    /// A session's record ids, newest event first, optionally only those before
    /// `(time, id)` (for paging).
    pub fn session_ids(
        &self,
        namespace: &str,
        session: &str,
        before: Option<(Timestamp, MemoryId)>,
        limit: usize,
    ) -> Result<Vec<MemoryId>> {
        self.listing(&keys::session_prefix(namespace, session), before, limit)
    }

    /// The records next to `at` (a record's event time and id) in its session's listing, as
    /// (event time, id): up to `n` before it (nearest first) and up to `n` after it (nearest
    /// first), none further than `max_gap` in time from `at`. Only ids `keep` accepts
    /// count; at most `4n` entries are looked at on each side, so a session crowded with
    /// unwanted records costs a bounded scan.
    pub fn session_neighbours(
        &self,
        namespace: &str,
        session: &str,
        at: (Timestamp, MemoryId),
        n: usize,
        max_gap: Timestamp,
        keep: impl Fn(MemoryId) -> bool,
    ) -> Result<(Vec<Listed>, Vec<Listed>)> {
        use std::ops::Bound;
        let prefix = keys::session_prefix(namespace, session);
        let here = keys::session_entry(namespace, session, at.0, at.1);
        let mut end_buf = Vec::new();
        let whole = Range::prefix(&prefix, &mut end_buf);
        let side = |range: Range<'_>, reverse: bool| -> Result<Vec<Listed>> {
            let mut walk = Side::new(at.0, n, max_gap);
            if n > 0 {
                self.inner.kv.scan(range, reverse, &mut |k, _| {
                    Ok(walk.step(keys::listing_time_id(k), &keep))
                })?;
            }
            Ok(walk.found)
        };
        let before = side(
            Range {
                start: whole.start,
                end: Bound::Excluded(&here),
            },
            true,
        )?;
        let after = side(
            Range {
                start: Bound::Excluded(&here),
                end: whole.end,
            },
            false,
        )?;
        Ok((before, after))
    }

    /// A whole session's listing, oldest first, in one scan: `None` when it holds more
    /// than `limit` entries. A small session read once answers every
    /// [`neighbours_in`] of it without a scan per record.
    pub fn session_listing(
        &self,
        namespace: &str,
        session: &str,
        limit: usize,
    ) -> Result<Option<Vec<Listed>>> {
        let prefix = keys::session_prefix(namespace, session);
        let mut end_buf = Vec::new();
        let mut all = Vec::new();
        let mut over = false;
        self.inner
            .kv
            .scan(Range::prefix(&prefix, &mut end_buf), false, &mut |k, _| {
                if all.len() == limit {
                    over = true;
                    return Ok(Visit::Stop);
                }
                if let Some(entry) = keys::listing_time_id(k) {
                    all.push(entry);
                }
                Ok(Visit::Continue)
            })?;
        Ok((!over).then_some(all))
    }

    /// A namespace's record ids, newest event first.
    pub fn namespace_ids(
        &self,
        namespace: &str,
        before: Option<(Timestamp, MemoryId)>,
        limit: usize,
    ) -> Result<Vec<MemoryId>> {
        self.listing(&keys::namespace_prefix(namespace), before, limit)
    }

    /// A session's records, newest first (without embeddings).
    pub fn timeline(
        &self,
        namespace: &str,
        session: &str,
        before: Option<(Timestamp, MemoryId)>,
        limit: usize,
    ) -> Result<Vec<MemoryRecord>> {
        let ids = self.session_ids(namespace, session, before, limit)?;
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            if let Some(r) = self.get_light(id)? {
                out.push(r);
            }
        }
        Ok(out)
    }

    /// Statistics of one session.
    pub fn session_stats(&self, namespace: &str, session: &str) -> Result<Option<SessionStats>> {
        self.decoded(&keys::session_stats(namespace, session))
    }

    /// Every session of a namespace, by session id.
    pub fn sessions(&self, namespace: &str) -> Result<Vec<SessionStats>> {
        let prefix = keys::session_stats_prefix(namespace);
        let mut end = Vec::new();
        let mut out = Vec::new();
        self.inner
            .kv
            .scan(Range::prefix(&prefix, &mut end), false, &mut |k, v| {
                out.push(codec::decode(k, v)?);
                Ok(Visit::Continue)
            })?;
        Ok(out)
    }

    /// A record's audit log, oldest first. It outlives the record: purges are audited.
    ///
    /// Recall's reinforcements are kept in the log of the record's session (one entry per
    /// recall, see [`families::Reinforcements`]); they are merged in here by sequence, so
    /// the history reads as one log. Reading it scans that session's reinforcement log.
    pub fn history(&self, id: MemoryId) -> Result<Vec<AuditEntry>> {
        let mut out = self.own_audit(id)?;
        let home = match self.inner.kv.get(&keys::record(id))? {
            Some(bytes) => {
                let h = codec::decode_header(&keys::record(id), &bytes)?;
                Some((h.namespace, h.session_id))
            }
            None => match (self.tombstone(id)?, self.purged_session(id)?) {
                (Some(namespace), Some(session)) => Some((namespace, session)),
                _ => None,
            },
        };
        if let Some((namespace, session)) = home {
            let reinforced = self.reinforcements_of(&namespace, &session, id)?;
            if !reinforced.is_empty() {
                out.extend(reinforced);
                // Both parts are in sequence order already; a stable sort merges them.
                out.sort_by_key(|(seq, _)| *seq);
            }
        }
        Ok(out.into_iter().map(|(_, entry)| entry).collect())
    }

    /// A record's own audit entries, oldest first: its [`history`](Self::history) without
    /// recall's reinforcements, read without scanning its session's reinforcement log (for
    /// checks that look for an action a person or a rule took).
    pub fn audit_entries(&self, id: MemoryId) -> Result<Vec<AuditEntry>> {
        Ok(self
            .own_audit(id)?
            .into_iter()
            .map(|(_, entry)| entry)
            .collect())
    }

    /// The entries kept under the record, with their sequence numbers.
    fn own_audit(&self, id: MemoryId) -> Result<Vec<(u64, AuditEntry)>> {
        let prefix = keys::audit_prefix(id);
        let mut end = Vec::new();
        let mut out = Vec::new();
        self.inner
            .kv
            .scan(Range::prefix(&prefix, &mut end), false, &mut |k, v| {
                out.push((keys::trailing_seq(k).unwrap_or(0), codec::decode(k, v)?));
                Ok(Visit::Continue)
            })?;
        Ok(out)
    }

    /// Up to `limit` records waiting on `queue`, oldest id first.
    pub fn queued(&self, queue: Queue, limit: usize) -> Result<Vec<MemoryId>> {
        let prefix = keys::queue_prefix(queue as u8);
        let mut end = Vec::new();
        let mut out = Vec::new();
        if limit == 0 {
            return Ok(out);
        }
        self.inner
            .kv
            .scan(Range::prefix(&prefix, &mut end), false, &mut |k, _| {
                if let Some(id) = keys::id_from_key(k) {
                    out.push(id);
                }
                Ok(if out.len() >= limit {
                    Visit::Stop
                } else {
                    Visit::Continue
                })
            })?;
        Ok(out)
    }

    /// Change-log entries with a sequence above `after`, oldest first, at most `limit`.
    pub fn changes_after(&self, after: u64, limit: usize) -> Result<Vec<(u64, Change)>> {
        let start = keys::change(after.saturating_add(1));
        let end = [family::CHANGE + 1];
        let mut out = Vec::new();
        if limit == 0 {
            return Ok(out);
        }
        self.inner
            .kv
            .scan(Range::between(&start, &end), false, &mut |k, v| {
                let seq = keys::change_seq(k).ok_or_else(|| Error::Corrupt {
                    key: format!("{k:02x?}"),
                    message: "change key without a sequence".into(),
                })?;
                out.push((seq, codec::decode(k, v)?));
                Ok(if out.len() >= limit {
                    Visit::Stop
                } else {
                    Visit::Continue
                })
            })?;
        Ok(out)
    }

    /// How far the change log has been truncated (`None` for a store that never truncated
    /// it, or one written before the mark existed).
    pub fn changes_truncated(&self) -> Result<Option<u64>> {
        read_u64(self.inner.kv.as_ref(), meta::CHANGES_TRUNCATED)
    }

    /// The oldest change-log sequence still kept, if any.
    pub fn first_change(&self) -> Result<Option<u64>> {
        Ok(self.changes_after(0, 1)?.first().map(|(s, _)| *s))
    }

    /// The sequence the next change will get (so `last_seq() == next - 1`).
    pub fn next_seq(&self) -> u64 {
        self.inner.committer.next_seq()
    }

    /// Visits every record id in id order (for rebuilds and exports).
    pub fn for_each_id(&self, mut f: impl FnMut(MemoryId) -> Result<Visit>) -> Result<()> {
        let prefix = [family::RECORD];
        let mut end = Vec::new();
        self.inner
            .kv
            .scan(
                Range::prefix(&prefix, &mut end),
                false,
                &mut |k, _| match keys::id_from_key(k) {
                    Some(id) => f(id),
                    None => Ok(Visit::Continue),
                },
            )
    }

    /// Visits every stored embedding in id order.
    pub fn for_each_embedding(
        &self,
        mut f: impl FnMut(MemoryId, Vec<f32>) -> Result<Visit>,
    ) -> Result<()> {
        let prefix = [family::EMBEDDING];
        let mut end = Vec::new();
        self.inner
            .kv
            .scan(
                Range::prefix(&prefix, &mut end),
                false,
                &mut |k, v| match keys::id_from_key(k) {
                    Some(id) => f(id, codec::decode_embedding(k, v)?),
                    None => Ok(Visit::Continue),
                },
            )
    }

    /// Scans the keys under `prefix`.
    fn scan_prefix(&self, prefix: &[u8], visit: &mut Visitor<'_>) -> Result<()> {
        let mut end = Vec::new();
        self.inner
            .kv
            .scan(Range::prefix(prefix, &mut end), false, visit)
    }

    /// The ids a query may see (see [`Filter`]).
    pub fn candidates(&self, filter: &Filter<'_>) -> roaring::RoaringBitmap {
        self.inner
            .catalog
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .candidates(filter)
    }

    /// Which of `ids` a newer record superseded.
    pub fn superseded(&self, ids: &roaring::RoaringBitmap) -> roaring::RoaringBitmap {
        self.catalog().superseded() & ids
    }

    /// How many graph edges that may be `namespace`'s were written or deleted since open:
    /// that namespace's graph loaded at another count may be stale, and no other's is.
    pub fn edge_changes_in(&self, namespace: &str) -> u64 {
        self.catalog().edge_changes_in(namespace)
    }

    /// Which of `ids` are in an open conflict.
    pub fn conflicted(&self, ids: &roaring::RoaringBitmap) -> roaring::RoaringBitmap {
        self.catalog().conflicted() & ids
    }

    /// Which of `ids` have stored passages (long records, once embedded).
    pub fn with_passages(&self, ids: &roaring::RoaringBitmap) -> roaring::RoaringBitmap {
        self.catalog().with_passages() & ids
    }

    /// Records of one tier.
    pub fn tier_len(&self, tier: Tier) -> u64 {
        self.catalog().tier_len(tier)
    }

    /// Archived records (soft-deleted or faded; kept for history until purged).
    pub fn archived_len(&self) -> u64 {
        self.catalog().archived_len()
    }

    /// One namespace's records by tier and status, and its sessions (from the catalog, no
    /// record read).
    pub fn census(&self, namespace: &str) -> Census {
        self.catalog().census(namespace)
    }

    /// One namespace's records in `status`.
    pub fn with_status(&self, namespace: &str, status: Status) -> roaring::RoaringBitmap {
        self.catalog().with_status(namespace, status)
    }

    /// Write sets waiting for the commit thread (recall's reinforcement among them).
    pub fn commit_backlog(&self) -> u64 {
        self.inner.committer.backlog()
    }

    /// Items in a work queue, counted up to `cap` (a scrape must stay cheap however far
    /// behind a queue is).
    pub fn queue_depth(&self, queue: Queue, cap: usize) -> Result<usize> {
        let prefix = keys::queue_prefix(queue as u8);
        let mut end = Vec::new();
        let mut n = 0;
        self.inner
            .kv
            .scan(Range::prefix(&prefix, &mut end), false, &mut |_, _| {
                n += 1;
                Ok(if n >= cap {
                    Visit::Stop
                } else {
                    Visit::Continue
                })
            })?;
        Ok(n)
    }

    fn catalog(&self) -> std::sync::RwLockReadGuard<'_, Catalog> {
        self.inner.catalog.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Number of records in the store.
    pub fn len(&self) -> u64 {
        self.inner
            .catalog
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }

    /// Whether the store holds no records.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every namespace with records.
    pub fn namespaces(&self) -> Vec<String> {
        self.inner
            .catalog
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .namespaces()
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

    /// Makes sure ids up to and including `id` are never handed out by
    /// [`Store::allocate_ids`]: for writers that bring their own ids (an import). The next
    /// commit persists the counter.
    pub fn reserve_ids_through(&self, id: MemoryId) -> Result<()> {
        let next = id.0.checked_add(1).ok_or_else(|| {
            Error::storage(
                self.backend().as_str(),
                format!("{id} is the last possible id; no id is left after it"),
            )
        })?;
        self.inner.next_id.fetch_max(next, Ordering::SeqCst);
        Ok(())
    }

    /// Hands out a recall number (the `n` of `rcl-n`), never one handed out before: the
    /// counter is persisted with every commit, as the record ids' is.
    pub fn allocate_recall(&self) -> Result<u32> {
        self.inner
            .next_recall
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |cur| cur.checked_add(1))
            .map_err(|_| Error::storage(self.backend().as_str(), "recall numbers exhausted (2^32)"))
    }

    /// The next recall number [`Store::allocate_recall`] would hand out.
    pub fn next_recall(&self) -> u32 {
        self.inner.next_recall.load(Ordering::SeqCst)
    }

    /// Makes sure recall numbers up to and including `n` are never handed out (an import
    /// brings its own). The next commit persists the counter.
    pub fn reserve_recalls_through(&self, n: u32) -> Result<()> {
        let next = n.checked_add(1).ok_or_else(|| {
            Error::storage(
                self.backend().as_str(),
                format!("rcl-{n:08x} is the last possible recall; none is left after it"),
            )
        })?;
        self.inner.next_recall.fetch_max(next, Ordering::SeqCst);
        Ok(())
    }

    /// The next id [`Store::allocate_ids`] would hand out: every id below it was used by
    /// a record, a quarantined input or a purged record (or, in stores from before recalls
    /// were counted apart, a recall), or skipped. An export
    /// carries it so the importing store never reuses one of those ids.
    pub fn next_id(&self) -> u32 {
        self.inner.next_id.load(Ordering::SeqCst)
    }

    /// A purged record's tombstone (the namespace it belonged to), if `id` was purged.
    pub fn tombstone(&self, id: MemoryId) -> Result<Option<String>> {
        Ok(self
            .inner
            .kv
            .get(&keys::tombstone(id))?
            .map(|v| String::from_utf8_lossy(&v).into_owned()))
    }

    /// Every tombstone, in id order: the purged ids and the namespace each belonged to.
    pub fn for_each_tombstone(
        &self,
        mut f: impl FnMut(MemoryId, String) -> Result<Visit>,
    ) -> Result<()> {
        let mut end = Vec::new();
        self.inner.kv.scan(
            Range::prefix(&[family::TOMBSTONE], &mut end),
            false,
            &mut |k, v| match keys::id_from_key(k) {
                Some(id) if k.len() == 5 => f(id, String::from_utf8_lossy(v).into_owned()),
                _ => Ok(Visit::Continue),
            },
        )
    }

    /// Writes a tombstone for a record purged elsewhere (an import of its history), so its
    /// audit log stays isolated to `namespace` as after a purge here. Refuses an id that
    /// holds a live record.
    pub fn restore_tombstone(&self, id: MemoryId, namespace: &str) -> Result<()> {
        if self.inner.kv.get(&keys::record(id))?.is_some() {
            return Err(Error::invalid(
                "id",
                format!("{id} holds a live record; only a purged id gets a tombstone"),
            ));
        }
        let op = kv::Op::Put(keys::tombstone(id).to_vec(), namespace.as_bytes().to_vec());
        self.inner.kv.commit(&[&[op]])
    }

    /// Whether `id` waits on `queue`.
    pub fn is_queued(&self, queue: Queue, id: MemoryId) -> Result<bool> {
        Ok(self
            .inner
            .kv
            .get(&keys::queue_item(queue as u8, id))?
            .is_some())
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
            let op = kv::Op::Put(
                keys::meta(meta::FORMAT_VERSION),
                FORMAT_VERSION.to_be_bytes().to_vec(),
            );
            kv.commit(&[&[op]])
        }
    }
}

/// [`Store::session_neighbours`] of `at` in a session's whole `listing` (oldest first, as
/// [`Store::session_listing`] reads it): the same answer, found in memory.
pub fn neighbours_in(
    listing: &[Listed],
    at: Listed,
    n: usize,
    max_gap: Timestamp,
    keep: impl Fn(MemoryId) -> bool,
) -> (Vec<Listed>, Vec<Listed>) {
    let (first_after, last_before) = match listing.binary_search(&at) {
        Ok(i) => (i + 1, i),
        Err(i) => (i, i),
    };
    let side = |entries: &mut dyn Iterator<Item = &Listed>| {
        let mut walk = Side::new(at.0, n, max_gap);
        if n > 0 {
            for &entry in entries {
                if walk.step(Some(entry), &keep) == Visit::Stop {
                    break;
                }
            }
        }
        walk.found
    };
    let before = side(&mut listing[..last_before].iter().rev());
    let after = side(&mut listing[first_after..].iter());
    (before, after)
}

/// One side of a record's neighbours, walked away from it in time order: at most `n`
/// kept entries, at most `4n` looked at, none further than `max_gap` from `at`.
struct Side {
    at: Timestamp,
    n: usize,
    max_gap: Timestamp,
    looked: usize,
    found: Vec<Listed>,
}

impl Side {
    fn new(at: Timestamp, n: usize, max_gap: Timestamp) -> Self {
        Side {
            at,
            n,
            max_gap,
            looked: 0,
            found: Vec::with_capacity(n),
        }
    }

    /// Takes the next entry (`None`: a key that is not a listing entry); says whether to
    /// go on.
    fn step(&mut self, entry: Option<Listed>, keep: impl Fn(MemoryId) -> bool) -> Visit {
        self.looked += 1;
        match entry {
            // Listings are time-ordered: everything further is further still.
            Some((t, _)) if t.abs_diff(self.at) > self.max_gap.unsigned_abs() => {
                return Visit::Stop;
            }
            Some((t, id)) if keep(id) => self.found.push((t, id)),
            _ => {}
        }
        if self.found.len() >= self.n || self.looked >= 4 * self.n {
            Visit::Stop
        } else {
            Visit::Continue
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set_format(dir: &Path, version: u32) {
        let kv = kv::open(Backend::default(), dir).unwrap();
        let op = kv::Op::Put(
            keys::meta(meta::FORMAT_VERSION),
            version.to_be_bytes().to_vec(),
        );
        kv.commit(&[&[op]]).unwrap();
    }

    #[test]
    fn older_format_directories_are_upgraded_and_an_unknown_format_refused() {
        let dir = tempfile::tempdir().unwrap();
        drop(Store::open(dir.path(), StoreOptions::default()).unwrap());
        for older in 1..FORMAT_VERSION {
            set_format(dir.path(), older);
            drop(Store::open(dir.path(), StoreOptions::default()).unwrap());
            let kv = kv::open(Backend::default(), dir.path()).unwrap();
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
