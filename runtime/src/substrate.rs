//! The substrate: one handle over the store, the derived indexes, the embedder, the policy
//! and the clock, with the operations every layer above needs — record, enrich, index,
//! recall, change status, archive, purge, reindex. Synchronous where the work is storage,
//! async where a provider may be remote. No actors here: the actor runtime calls these.
//!
//! Indexing model: every write appends to the store's change log; the indexer applies
//! changes to the indexes' in-memory tails (searchable at once) and builds / commits them
//! in debounced batches, recording the change sequence as the index watermark. Opening a
//! substrate replays the log from the watermarks, or rebuilds an index from the store when
//! it is missing or older than the kept log — so an index is never a second source of truth.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::clock::{Clock, SystemClock, Timestamp};
use crate::embed::Embedder;
use crate::error::{Error, Result};
use crate::keyword::KeywordIndex;
use crate::kv::{Backend, Visit};
use crate::model::{
    AuditAction, AuditEntry, Limits, MemoryId, MemoryRecord, NewMemory, Status, Tier,
    validate_embedding, validate_id,
};
use crate::policy::{EvaluationMode, Policy};
use crate::retrieval::{self, Candidates, FusionMethod, Scope};
use crate::store::{
    Change, Filter, Mutation, Queue, RecordPatch, Reinforcement, Store, StoreOptions, WriteSet,
};
use crate::vector::{VectorIndex, VectorOptions};

/// When the indexer builds.
#[derive(Debug, Clone)]
pub struct IndexingOptions {
    /// Run the indexer on a background thread (off only in tests that drive it by hand).
    pub background: bool,
    /// Changes read from the log at a time.
    pub batch: usize,
    /// Build the vector index as soon as this many changes are staged (the tail is scanned
    /// exactly, so this bounds the cost a large unbuilt tail adds to namespace-wide search).
    pub build_every: usize,
    /// Commit the keyword index as soon as this many changes are staged. Commits are cheap
    /// next to tree builds and run on their own thread, so the keyword tail (about 1.4 KB
    /// of memory per staged document) stays small however far the vector build lags.
    pub keyword_every: usize,
    /// ...or once no change has arrived for this long (a quiet period)...
    pub debounce: Duration,
    /// ...or when the oldest staged change is this old, however busy ingest is.
    pub max_delay: Duration,
}

impl Default for IndexingOptions {
    fn default() -> Self {
        IndexingOptions {
            background: true,
            batch: 2_000,
            build_every: 50_000,
            keyword_every: 50_000,
            debounce: Duration::from_millis(300),
            max_delay: Duration::from_secs(10),
        }
    }
}

/// Everything [`Substrate::open`] needs; [`SubstrateOptions::default`] is the embedded,
/// key-free setup (LMDB, hash embedder, default policy, system clock).
#[derive(Debug, Clone)]
pub struct SubstrateOptions {
    /// Store backend.
    pub backend: Backend,
    /// The active policy.
    pub policy: Policy,
    /// The embedder.
    pub embedder: Arc<dyn Embedder>,
    /// The runtime clock.
    pub clock: Arc<dyn Clock>,
    /// Input limits.
    pub limits: Limits,
    /// Vector index tuning.
    pub vector: VectorOptions,
    /// Indexer behaviour.
    pub indexing: IndexingOptions,
    /// How many of the session's newest records the recent path contributes.
    pub recent_n: usize,
}

impl Default for SubstrateOptions {
    fn default() -> Self {
        SubstrateOptions {
            backend: Backend::default(),
            policy: Policy::default_policy(),
            embedder: Arc::new(crate::embed::hash::HashEmbedder::default()),
            clock: Arc::new(SystemClock),
            limits: Limits::default(),
            vector: VectorOptions::default(),
            indexing: IndexingOptions::default(),
            recent_n: 8,
        }
    }
}

/// A recall question.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RecallRequest {
    /// Namespace (nothing crosses it).
    pub namespace: String,
    /// The asking session (scope `session`, and the recent path).
    pub session_id: String,
    /// The asking agent (scope `agent`).
    pub agent_id: Option<String>,
    /// What to remember about.
    pub query: String,
    /// A precomputed query vector (the embedder is skipped).
    pub query_embedding: Option<Vec<f32>>,
    /// How many memories to return.
    pub k: usize,
    /// Where to look.
    pub scope: Scope,
    /// Only these kinds.
    pub kinds: Option<Vec<String>>,
    /// Only events at or after this time.
    pub since: Option<Timestamp>,
    /// Only events at or before this time.
    pub until: Option<Timestamp>,
    /// Also search the namespace knowledge pool.
    pub include_knowledge: bool,
    /// Trim the result to fit this many tokens.
    pub token_budget: Option<usize>,
    /// Strengthen what is returned (the policy's `reinforce_on_recall`).
    pub reinforce: bool,
}

impl RecallRequest {
    /// A session-scoped question with defaults (k = 10, knowledge included, reinforcing).
    pub fn new(namespace: &str, session_id: &str, query: &str) -> Self {
        RecallRequest {
            namespace: namespace.into(),
            session_id: session_id.into(),
            agent_id: None,
            query: query.into(),
            query_embedding: None,
            k: 10,
            scope: Scope::Session,
            kinds: None,
            since: None,
            until: None,
            include_knowledge: true,
            token_budget: None,
            reinforce: true,
        }
    }
}

/// Why a memory ranked where it did: each policy component's weighted contribution.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Why {
    /// Query relevance (fused vector + keyword).
    pub relevance: f32,
    /// Recency.
    pub recency: f32,
    /// Importance.
    pub importance: f32,
    /// Utility.
    pub utility: f32,
}

/// One recalled memory.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Recalled {
    /// The record (without its embedding).
    pub record: MemoryRecord,
    /// Total score.
    pub score: f32,
    /// The breakdown of the score.
    pub why: Why,
}

/// What recall answers.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RecallResult {
    /// The policy that ranked the result.
    pub policy: crate::model::PolicyStamp,
    /// Best first.
    pub memories: Vec<Recalled>,
    /// The rendered context block (time-ordered).
    pub context: String,
    /// Names this recall for feedback ([`Substrate::feedback`]); `None` from
    /// [`Substrate::rank`], which remembers nothing.
    pub recall_id: Option<String>,
}

/// Neighbours further apart in time than this are not a record's context: after an hour's
/// pause a session has moved on (LoCoMo's conversations resume days later; the prototype
/// measured R@10 0.763 → 0.769 on conversations 0–4 for not reading across the pause).
const CONTEXT_GAP_MS: Timestamp = 3_600_000;

/// The keyword path's best hits read with their neighbours. Each costs a session scan and
/// the analysis of up to `4 × context_window` more texts; past the first 30, a hit and its
/// neighbours almost never reach a top 20 (LoCoMo: the same figures with 30 as with 80).
const CONTEXT_HITS: usize = 30;

/// The substrate handle. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Substrate {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    dir: PathBuf,
    store: Store,
    vectors: VectorIndex,
    keywords: KeywordIndex,
    embedder: Arc<dyn Embedder>,
    policy: RwLock<Arc<Policy>>,
    clock: Arc<dyn Clock>,
    limits: Limits,
    indexing: IndexingOptions,
    recent_n: usize,
    /// Highest change sequence applied to both indexes' tails.
    applied: AtomicU64,
    /// When the oldest and the newest change not yet built were applied, per index.
    staged_times: Mutex<[StagedTimes; 2]>,
    /// Serialises applying changes to the tails.
    apply_lock: Mutex<()>,
    /// Serialise the builds of each index (one writer per index; the two run side by side).
    build_locks: [Mutex<()>; 2],
    /// The change log is truncated up to here (both indexes have built it).
    truncated: AtomicU64,
    /// Index rebuilds since open (reconcile, `reindex`): a restart should cause none.
    rebuilds: AtomicU64,
    /// Embedder calls that failed since open (each retried later, or the caller told).
    provider_errors: AtomicU64,
    /// Condensed records promoted into (or merged with) knowledge since open.
    promotions: AtomicU64,
    wake: Mutex<Vec<mpsc::Sender<()>>>,
    /// The keyword committer and the vector builder: a tree build takes minutes on a busy
    /// machine, and keyword commits must not wait for it.
    indexer: Mutex<Vec<JoinHandle<()>>>,
    enrich_wake: Mutex<Option<mpsc::Sender<()>>>,
    enricher: Mutex<Option<JoinHandle<()>>>,
    closed: AtomicBool,
    /// Recalls ranking at once: two per core. Without a bound, 32 concurrent recalls were 32
    /// blocking threads time-sliced on 2 cores, and an unlucky one waited for all the
    /// others (p99 five times p50); with it they queue first in, first out. One per core
    /// left cores idle while a ranking thread waited on a page fault (measured: a quarter
    /// less throughput).
    ranking: tokio::sync::Semaphore,
}

/// The vector index reads the vectors it staged past its memory budget back from here.
struct StoreVectors(Store);

impl crate::vector::VectorSource for StoreVectors {
    fn vector(&self, id: u32) -> Result<Option<Vec<f32>>> {
        self.0.embedding(MemoryId(id))
    }
}

/// Which index an indexing pass works on ([`Substrate::index_pass_for`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IndexKind {
    /// The BM25 keyword index: commits are cheap and frequent.
    Keywords = 0,
    /// The vector index: tree builds are slow and may lag behind ingest.
    Vectors = 1,
}

/// When the oldest and the newest change an index has not built yet were applied.
#[derive(Debug, Clone, Copy, Default)]
struct StagedTimes {
    oldest: Option<Instant>,
    newest: Option<Instant>,
}

/// Counts from one indexing pass.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IndexPass {
    /// Changes applied to the tails.
    pub applied: usize,
    /// Whether the indexes were built / committed.
    pub built: bool,
    /// The pass stopped applying at its bound: the log holds more, run the next one now.
    pub more: bool,
}

impl Substrate {
    /// Opens the data directory `dir` (store in `dir/store`, vectors in `dir/vectors`,
    /// keywords in `dir/keywords`), checks the embedder's dimension against the store's,
    /// reconciles the indexes with the store and starts the indexer.
    pub fn open(dir: &Path, opts: SubstrateOptions) -> Result<Substrate> {
        let store = Store::open(
            &dir.join("store"),
            StoreOptions {
                backend: opts.backend,
            },
        )?;
        let dims = opts.embedder.dimensions();
        store.ensure_dimension(dims, opts.embedder.name())?;
        let vectors = VectorIndex::open(&dir.join("vectors"), dims, opts.vector.clone())?;
        vectors.read_back_from(Arc::new(StoreVectors(store.clone())));
        let keywords = KeywordIndex::open(&dir.join("keywords"))?;
        let inner = Arc::new(Inner {
            dir: dir.to_path_buf(),
            store,
            vectors,
            keywords,
            embedder: opts.embedder,
            policy: RwLock::new(Arc::new(opts.policy)),
            clock: opts.clock,
            limits: opts.limits,
            indexing: opts.indexing,
            recent_n: opts.recent_n,
            applied: AtomicU64::new(0),
            staged_times: Mutex::new([StagedTimes::default(); 2]),
            apply_lock: Mutex::new(()),
            build_locks: [Mutex::new(()), Mutex::new(())],
            truncated: AtomicU64::new(0),
            rebuilds: AtomicU64::new(0),
            provider_errors: AtomicU64::new(0),
            promotions: AtomicU64::new(0),
            wake: Mutex::new(Vec::new()),
            indexer: Mutex::new(Vec::new()),
            enrich_wake: Mutex::new(None),
            enricher: Mutex::new(None),
            closed: AtomicBool::new(false),
            ranking: tokio::sync::Semaphore::new(
                std::thread::available_parallelism().map_or(2, |n| n.get()) * 2,
            ),
        });
        let sub = Substrate { inner };
        sub.check_analyzer()?;
        sub.reconcile()?;
        if sub.inner.indexing.background {
            sub.start_indexer()?;
            sub.start_enricher()?;
        }
        Ok(sub)
    }

    /// The store (system of record).
    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    /// The vector index.
    pub fn vectors(&self) -> &VectorIndex {
        &self.inner.vectors
    }

    /// The keyword index.
    pub fn keywords(&self) -> &KeywordIndex {
        &self.inner.keywords
    }

    /// The embedder.
    pub fn embedder(&self) -> &Arc<dyn Embedder> {
        &self.inner.embedder
    }

    /// The runtime clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.inner.clock
    }

    /// The input limits.
    pub fn limits(&self) -> &Limits {
        &self.inner.limits
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// The active policy.
    pub fn policy(&self) -> Arc<Policy> {
        self.inner
            .policy
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Makes `policy` the active one (later decisions carry its name and hash).
    pub fn set_policy(&self, policy: Policy) {
        *self.inner.policy.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(policy);
    }

    // ----- ingest -------------------------------------------------------------------------

    /// Validates `events`, writes them as episodic records of `session` and returns their ids
    /// once they are durable. Importance comes from the event or the policy's rules; events
    /// without an embedding are embedded inline by a local embedder, or queued for
    /// enrichment. An invalid event rejects the whole call before anything is written.
    pub async fn record(
        &self,
        namespace: &str,
        session: &str,
        events: Vec<NewMemory>,
    ) -> Result<Vec<MemoryId>> {
        let (ids, queued, writes) = self.prepare(namespace, session, events).await?;
        self.inner.store.write_async(writes).await?;
        self.after_write(queued);
        Ok(ids)
    }

    /// [`Substrate::record`] for synchronous callers with a local embedder or precomputed
    /// embeddings (benchmarks, the crash-test writer). Must not be called inside an async
    /// runtime.
    pub fn record_blocking(
        &self,
        namespace: &str,
        session: &str,
        events: Vec<NewMemory>,
    ) -> Result<Vec<MemoryId>> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .map_err(|e| Error::io("tokio runtime", e))?;
        let (ids, queued, writes) = rt.block_on(self.prepare(namespace, session, events))?;
        self.inner.store.write(writes)?;
        self.after_write(queued);
        Ok(ids)
    }

    async fn prepare(
        &self,
        namespace: &str,
        session: &str,
        events: Vec<NewMemory>,
    ) -> Result<(Vec<MemoryId>, bool, WriteSet)> {
        validate_id("namespace", namespace)?;
        validate_id("session_id", session)?;
        let limits = &self.inner.limits;
        if events.is_empty() {
            return Err(Error::invalid(
                "events",
                "no events sent; send at least one",
            ));
        }
        if events.len() > limits.max_events_per_call {
            return Err(Error::TooLarge {
                field: "events".into(),
                size: events.len(),
                limit: limits.max_events_per_call,
                hint: "send them in several calls".into(),
            });
        }
        let dims = self.inner.embedder.dimensions();
        let mut valid = Vec::with_capacity(events.len());
        for (i, e) in events.into_iter().enumerate() {
            valid.push(
                e.validate(limits, Some(dims))
                    .map_err(|err| at_event(i, err))?,
            );
        }
        // A local embedder costs microseconds: embed now so the acknowledged record is
        // complete. A remote one would make ingest wait on the network: queue instead.
        let mut embeddings: Vec<Option<Vec<f32>>> =
            valid.iter_mut().map(|v| v.embedding.take()).collect();
        if self.inner.embedder.is_local() {
            let missing: Vec<usize> = (0..valid.len())
                .filter(|i| embeddings[*i].is_none())
                .collect();
            if !missing.is_empty() {
                let texts: Vec<String> = missing.iter().map(|i| valid[*i].text.clone()).collect();
                let vecs = self.embed(&texts).await?;
                for (i, v) in missing.into_iter().zip(vecs) {
                    embeddings[i] = Some(v);
                }
            }
        }
        let policy = self.policy();
        let stamp = policy.stamp();
        let now = self.inner.clock.now();
        let ids = self.inner.store.allocate_ids(valid.len())?;
        let mut out = Vec::with_capacity(valid.len());
        let mut queued = false;
        let mut writes = WriteSet::new();
        for ((v, id), embedding) in valid.into_iter().zip(ids).zip(embeddings) {
            // The rules score every event now; in `llm` mode (every event) and `hybrid`
            // mode (events no rule matched) that score is provisional, and the record
            // waits on the evaluation queue for the judge (see `crate::evaluate`).
            let (importance, scored_by, judge) = match v.importance {
                Some(i) => (i, "client".to_string(), false),
                None => {
                    let d = policy.importance(v.kind.as_str(), &v.text);
                    let by = match d.rule {
                        Some(r) => format!("rule {}", r + 1),
                        None => "default_importance".to_string(),
                    };
                    let judge = match policy.evaluation.mode {
                        EvaluationMode::Rules => false,
                        EvaluationMode::Llm => true,
                        EvaluationMode::Hybrid => d.defaulted,
                    };
                    (d.importance, by, judge)
                }
            };
            let provisional = if judge {
                "; provisional, queued for the judge"
            } else {
                ""
            };
            let record = MemoryRecord {
                agent_id: v.agent_id,
                content: v.content,
                metadata: v.metadata,
                parent_id: v.parent_id,
                event_time: v.timestamp.unwrap_or(now),
                importance,
                strength: policy.initial_strength(importance),
                policy: stamp.clone(),
                embedding,
                ..MemoryRecord::episodic(id, namespace, session, v.kind, v.text, now)
            };
            let by = record.agent_id.clone().unwrap_or_else(|| "client".into());
            writes.push(Mutation::Audit(
                id,
                AuditEntry {
                    at: now,
                    action: AuditAction::Created,
                    by,
                    detail: format!("{} in session {}", record.kind, record.session_id),
                },
            ));
            writes.push(Mutation::Audit(
                id,
                AuditEntry {
                    at: now,
                    action: AuditAction::Scored,
                    by: stamp.name.clone(),
                    detail: format!("importance {importance} ({scored_by}{provisional})"),
                },
            ));
            if judge {
                writes.push(Mutation::Enqueue(Queue::Evaluate, id));
            }
            if record.embedding.is_none() {
                writes.push(Mutation::Enqueue(Queue::Enrich, id));
            }
            queued |= record.embedding.is_none();
            out.push(record.id);
            writes.push(Mutation::Insert(Box::new(record)));
        }
        Ok((out, queued, writes))
    }

    /// Wakes the indexer (and the enricher when some records wait for their embedding).
    /// The write is already in the change log, so recall's catch-up sees it even before the
    /// indexer does; ingest does no index work itself.
    pub(crate) fn after_write(&self, queued: bool) {
        if queued {
            self.wake_enricher();
        }
        self.wake_indexer();
    }

    /// Embeds up to `max` queued records (oldest first) and hands them to the indexes.
    /// Returns how many were enriched. A crash in the middle loses nothing: the queue items
    /// are removed in the same write that stores the embeddings.
    pub async fn enrich_pending(&self, max: usize) -> Result<usize> {
        let ids = self.inner.store.queued(Queue::Enrich, max)?;
        if ids.is_empty() {
            return Ok(0);
        }
        let mut records = Vec::with_capacity(ids.len());
        let mut writes = WriteSet::new();
        for id in ids {
            match self.inner.store.get_light(id)? {
                Some(r) => records.push(r),
                // Purged while queued.
                None => {
                    writes.push(Mutation::Dequeue(Queue::Enrich, id));
                }
            }
        }
        let texts: Vec<String> = records.iter().map(|r| r.text.clone()).collect();
        let vecs = if texts.is_empty() {
            Vec::new()
        } else {
            self.embed(&texts).await?
        };
        let now = self.inner.clock.now();
        for (r, v) in records.iter().zip(vecs) {
            validate_embedding(&v, Some(self.inner.embedder.dimensions()))?;
            writes.push(Mutation::Audit(
                r.id,
                AuditEntry {
                    at: now,
                    action: AuditAction::Embedded,
                    by: self.inner.embedder.name().to_string(),
                    detail: format!("{} dimensions", self.inner.embedder.dimensions()),
                },
            ));
            writes.push(Mutation::Dequeue(Queue::Enrich, r.id));
            // Only the embedding is written: the record may have changed while the provider
            // was answering, and rewriting it would undo that.
            writes.push(Mutation::SetEmbedding(r.id, v));
        }
        let n = records.len();
        self.inner.store.write_async(writes).await?;
        self.wake_indexer();
        Ok(n)
    }

    // ----- indexing -----------------------------------------------------------------------

    fn reconcile(&self) -> Result<()> {
        let store = &self.inner.store;
        let vec_wm = self.inner.vectors.watermark()?;
        let kw_wm = self.inner.keywords.watermark()?;
        let first = store.first_change()?;
        let last = store.next_seq().saturating_sub(1);
        // An index older than the oldest kept change (lost, or from before a truncation)
        // cannot be caught up from the log: rebuild it from the store. The truncation mark
        // says exactly how far the log was dropped; sequences are shared with the audit
        // log, so without it (stores from before the mark) an index is judged by the first
        // kept change, and an empty log after audits looked stale on every start.
        let truncated = store.changes_truncated()?;
        let stale = |wm: u64| match truncated {
            Some(t) => wm < t,
            None => wm < last && first.is_none_or(|f| wm + 1 < f),
        };
        let vec_stale = stale(vec_wm)
            || (vec_wm == 0
                && !store.is_empty()
                && self.inner.vectors.len()? == 0
                && first != Some(1));
        let kw_stale = stale(kw_wm)
            || (kw_wm == 0
                && !store.is_empty()
                && self.inner.keywords.len()? == 0
                && first != Some(1));
        if vec_stale || kw_stale {
            tracing::warn!(
                vec_wm,
                kw_wm,
                ?first,
                last,
                "an index is behind the kept change log; rebuilding it from the store"
            );
            self.rebuild(vec_stale, kw_stale)?;
        }
        let from = self
            .inner
            .vectors
            .watermark()?
            .min(self.inner.keywords.watermark()?);
        self.inner.applied.store(from, Ordering::SeqCst);
        self.index_pass(true)?;
        Ok(())
    }

    /// Re-embeds every record with `opts.embedder`, records its dimension in the store and
    /// rebuilds both indexes — the way out of a dimension mismatch after changing embedders.
    /// `progress(done, total)` is called as records are re-embedded.
    pub async fn reindex(
        dir: &Path,
        opts: SubstrateOptions,
        mut progress: impl FnMut(u64, u64),
    ) -> Result<Substrate> {
        let embedder = opts.embedder.clone();
        {
            let store = Store::open(
                &dir.join("store"),
                StoreOptions {
                    backend: opts.backend,
                },
            )?;
            let total = store.len();
            let mut ids = Vec::with_capacity(total as usize);
            store.for_each_id(|id| {
                ids.push(id);
                Ok(Visit::Continue)
            })?;
            let mut done = 0u64;
            for chunk in ids.chunks(256) {
                let mut records = Vec::with_capacity(chunk.len());
                for id in chunk {
                    if let Some(r) = store.get_light(*id)? {
                        records.push(r);
                    }
                }
                let texts: Vec<String> = records.iter().map(|r| r.text.clone()).collect();
                let vecs = embedder.embed(&texts).await?;
                let mut writes = WriteSet::new();
                for (mut r, v) in records.into_iter().zip(vecs) {
                    r.embedding = Some(v);
                    writes.push(Mutation::Dequeue(Queue::Enrich, r.id));
                    writes.push(Mutation::Update {
                        record: Box::new(r),
                        reindex: true,
                    });
                }
                store.write_async(writes).await?;
                done += chunk.len() as u64;
                progress(done, total);
            }
            store.reset_dimension(embedder.dimensions(), embedder.name())?;
        }
        for sub in ["vectors", "keywords"] {
            let p = dir.join(sub);
            if p.exists() {
                std::fs::remove_dir_all(&p).map_err(|e| Error::io(&p, e))?;
            }
        }
        // Opening finds both indexes missing and rebuilds them from the store.
        Substrate::open(dir, opts)
    }

    /// Rebuilds the keyword index when it was built by another analyzer version.
    fn check_analyzer(&self) -> Result<()> {
        let store = &self.inner.store;
        match store.analyzer_version()? {
            Some(v) if v == crate::text::ANALYZER_VERSION => return Ok(()),
            Some(v) => {
                tracing::warn!(
                    from = v,
                    to = crate::text::ANALYZER_VERSION,
                    "the text analyzer changed; rebuilding the keyword index from the store"
                );
                self.rebuild(false, true)?;
            }
            None if !store.is_empty() => self.rebuild(false, true)?,
            None => {}
        }
        store.set_analyzer_version(crate::text::ANALYZER_VERSION)
    }

    /// Embedder calls that failed since open.
    pub fn provider_errors(&self) -> u64 {
        self.inner.provider_errors.load(Ordering::Relaxed)
    }

    /// Promotions into the knowledge pool (new records or merges) since open.
    pub fn promotions(&self) -> u64 {
        self.inner.promotions.load(Ordering::Relaxed)
    }

    pub(crate) fn count_promotion(&self) {
        self.inner.promotions.fetch_add(1, Ordering::Relaxed);
    }

    /// The embedder, with its failures counted for the metrics.
    async fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>> {
        let embedded = self.inner.embedder.embed(texts).await;
        if embedded.is_err() {
            self.inner.provider_errors.fetch_add(1, Ordering::Relaxed);
        }
        embedded
    }

    /// How many times an index was rebuilt from the store since open.
    pub fn rebuilds(&self) -> u64 {
        self.inner.rebuilds.load(Ordering::Relaxed)
    }

    /// Rebuilds the chosen indexes from the store (what `shadowbrain reindex` runs).
    pub fn rebuild(&self, vectors: bool, keywords: bool) -> Result<()> {
        // Nothing may apply or build meanwhile (same lock order as `index_pass`).
        let _no_applier = self
            .inner
            .apply_lock
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let _builders = self
            .inner
            .build_locks
            .each_ref()
            .map(|l| l.lock().unwrap_or_else(|p| p.into_inner()));
        self.inner.rebuilds.fetch_add(1, Ordering::Relaxed);
        let store = &self.inner.store;
        // Changes written from here on are replayed on top of the rebuild.
        let upto = store.next_seq().saturating_sub(1);
        if vectors {
            self.inner.vectors.clear()?;
            let mut batch = Vec::with_capacity(10_000);
            store.for_each_embedding(|id, v| {
                batch.push((id.0, v));
                if batch.len() >= 10_000 {
                    self.inner.vectors.upsert(&batch);
                    batch.clear();
                }
                Ok(Visit::Continue)
            })?;
            self.inner.vectors.upsert(&batch);
            self.inner.vectors.build_at_once(upto)?;
        }
        if keywords {
            self.inner.keywords.clear()?;
            let mut batch = Vec::with_capacity(10_000);
            store.for_each_id(|id| {
                if let Some(r) = store.get_light(id)? {
                    batch.push((id.0, r.text));
                }
                if batch.len() >= 10_000 {
                    self.inner.keywords.upsert(&batch);
                    batch.clear();
                }
                Ok(Visit::Continue)
            })?;
            self.inner.keywords.upsert(&batch);
            self.inner.keywords.commit(upto)?;
        }
        Ok(())
    }

    /// Applies every change the store has logged since the last call to the indexes'
    /// in-memory tails, where search sees them at once. Recall calls this first, so it
    /// never misses an acknowledged write even if the indexer thread is behind.
    pub fn catch_up(&self) -> Result<usize> {
        self.apply_changes(usize::MAX)
    }

    /// Applies logged changes to the tails, about `max` at most (whole log batches). The
    /// indexer threads apply a bounded share per pass: under sustained ingest, catching up
    /// completely may take longer than ingest takes to log more, and their commits must
    /// not wait for that.
    fn apply_changes(&self, max: usize) -> Result<usize> {
        let _one_applier = self
            .inner
            .apply_lock
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let store = &self.inner.store;
        let mut total = 0;
        while total < max {
            let from = self.inner.applied.load(Ordering::SeqCst);
            let changes = store.changes_after(from, self.inner.indexing.batch)?;
            let Some((last, _)) = changes.last() else {
                return Ok(total);
            };
            let mut docs = Vec::new();
            let mut vecs = Vec::new();
            let mut stored = Vec::new();
            let mut removed = Vec::new();
            // Past its memory budget the vector tail stages ids only: do not even read the
            // embeddings then (1.5 KB each at 384 dimensions); builds read them once.
            let spill = self.inner.vectors.spilling();
            for (_, change) in &changes {
                match change {
                    Change::Upsert(id) if spill => match store.get_light(*id)? {
                        Some(r) => {
                            stored.push(id.0);
                            docs.push((id.0, r.text));
                        }
                        None => removed.push(id.0),
                    },
                    Change::Upsert(id) => match store.get(*id)? {
                        Some(r) => {
                            if let Some(e) = r.embedding {
                                vecs.push((id.0, e));
                            }
                            docs.push((id.0, r.text));
                        }
                        None => removed.push(id.0),
                    },
                    Change::Remove(id) => removed.push(id.0),
                }
            }
            self.inner.keywords.upsert(&docs);
            self.inner.vectors.upsert(&vecs);
            self.inner.vectors.stage_stored(&stored);
            if !removed.is_empty() {
                self.inner.keywords.remove(&removed);
                self.inner.vectors.remove(&removed);
            }
            self.inner.applied.store(*last, Ordering::SeqCst);
            total += changes.len();
            let now = Instant::now();
            let mut times = self.staged_times();
            for t in times.iter_mut() {
                t.oldest.get_or_insert(now);
                t.newest = Some(now);
            }
        }
        Ok(total)
    }

    /// Catches the tails up, then commits the keyword index and builds the vector index
    /// when each is due — its count of staged changes reached, or a quiet period after the
    /// last change, or the oldest staged change too old — or at once when `force`.
    pub fn index_pass(&self, force: bool) -> Result<IndexPass> {
        let keywords = self.index_pass_for(IndexKind::Keywords, force)?;
        let vectors = self.index_pass_for(IndexKind::Vectors, force)?;
        Ok(IndexPass {
            applied: keywords.applied + vectors.applied,
            built: keywords.built || vectors.built,
            more: keywords.more || vectors.more,
        })
    }

    /// One index's share of [`Substrate::index_pass`]. Indexers run one loop per index, so
    /// keyword commits never wait for a tree build (which takes minutes on a busy machine);
    /// without `force` a pass applies a bounded share of the change log, so a pass ends
    /// even while ingest logs changes faster than they are applied.
    pub fn index_pass_for(&self, kind: IndexKind, force: bool) -> Result<IndexPass> {
        let opts = &self.inner.indexing;
        let share = opts.keyword_every.min(opts.build_every);
        let applied = if force {
            self.catch_up()?
        } else {
            self.apply_changes(share)?
        };
        let _one_builder = self.inner.build_locks[kind as usize]
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let mut pass = IndexPass {
            applied,
            built: false,
            more: !force && applied >= share,
        };
        let (staged, every, watermark) = match kind {
            IndexKind::Keywords => (
                self.inner.keywords.pending(),
                opts.keyword_every,
                self.inner.keywords.watermark()?,
            ),
            IndexKind::Vectors => (
                self.inner.vectors.pending(),
                opts.build_every,
                self.inner.vectors.watermark()?,
            ),
        };
        let times = self.staged_times()[kind as usize];
        let due = staged >= every
            || times.newest.is_some_and(|t| t.elapsed() >= opts.debounce)
            || times.oldest.is_some_and(|t| t.elapsed() >= opts.max_delay);
        let upto = self.inner.applied.load(Ordering::SeqCst);
        if (force || due) && (staged > 0 || watermark < upto) {
            // Changes applied after `upto` was read may be built too; their watermark stays
            // lower, so a restart replays them (applying a change twice is harmless).
            self.staged_times()[kind as usize] = StagedTimes::default();
            match kind {
                IndexKind::Keywords => self.inner.keywords.commit(upto)?,
                IndexKind::Vectors if force => {
                    self.inner.vectors.build(upto)?;
                }
                // Builds may wait for ingest and recall (lower CPU priority): on a busy
                // machine the trees lag behind, and acknowledged writes are searchable
                // meanwhile through the tail, whose vectors past its memory budget are
                // read back from the store. One bounded transaction per pass; what it
                // left is due at once.
                IndexKind::Vectors => {
                    let stats = self.inner.vectors.build_with(upto, true)?;
                    if stats.remaining > 0 {
                        pass.more = true;
                        let now = Instant::now();
                        let mut times = self.staged_times();
                        let t = &mut times[kind as usize];
                        // As old as `max_delay`: due at the next pass.
                        t.oldest = Some(now.checked_sub(opts.max_delay).unwrap_or(now));
                        t.newest.get_or_insert(now);
                    }
                }
            }
            self.truncate_changes()?;
            pass.built = true;
        }
        Ok(pass)
    }

    /// When each index's oldest and newest unbuilt change were applied.
    fn staged_times(&self) -> std::sync::MutexGuard<'_, [StagedTimes; 2]> {
        self.inner
            .staged_times
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Drops the change-log entries both indexes have built.
    fn truncate_changes(&self) -> Result<()> {
        let upto = self
            .inner
            .vectors
            .watermark()?
            .min(self.inner.keywords.watermark()?);
        if self.inner.truncated.fetch_max(upto, Ordering::SeqCst) < upto {
            self.inner
                .store
                .write(WriteSet(vec![Mutation::TruncateChanges(upto)]))?;
        }
        Ok(())
    }

    /// Applies every waiting change and builds both indexes now (one build).
    pub fn flush_indexes(&self) -> Result<()> {
        self.index_pass(true)?;
        Ok(())
    }

    /// Whether both indexes have built everything the store has logged.
    pub fn indexes_caught_up(&self) -> Result<bool> {
        let last = self.inner.store.next_seq().saturating_sub(1);
        Ok(self.inner.vectors.watermark()? >= last && self.inner.keywords.watermark()? >= last)
    }

    fn wake_indexer(&self) {
        for tx in self
            .inner
            .wake
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            let _ = tx.send(());
        }
    }

    fn start_indexer(&self) -> Result<()> {
        let mut senders = Vec::new();
        let mut handles = Vec::new();
        for (kind, name) in [
            (IndexKind::Keywords, "keyword-indexer"),
            (IndexKind::Vectors, "vector-indexer"),
        ] {
            let (tx, rx) = mpsc::channel::<()>();
            senders.push(tx);
            // The thread holds only a weak handle, so dropping every Substrate ends it.
            let weak = Arc::downgrade(&self.inner);
            let debounce = self.inner.indexing.debounce;
            let handle = std::thread::Builder::new()
                .name(name.into())
                .spawn(move || {
                    loop {
                        match rx.recv_timeout(debounce) {
                            Ok(()) => while rx.try_recv().is_ok() {},
                            Err(mpsc::RecvTimeoutError::Timeout) => {}
                            Err(mpsc::RecvTimeoutError::Disconnected) => return,
                        }
                        let Some(inner) = weak.upgrade() else { return };
                        if inner.closed.load(Ordering::SeqCst) {
                            return;
                        }
                        let sub = Substrate { inner };
                        loop {
                            match sub.index_pass_for(kind, false) {
                                Ok(p) if p.more => continue,
                                Ok(_) => break,
                                Err(e) => {
                                    tracing::error!(error = %e, index = ?kind, "indexing pass failed; will retry");
                                    break;
                                }
                            }
                        }
                    }
                })
                .map_err(|e| Error::io("indexer thread", e))?;
            handles.push(handle);
        }
        *self.inner.wake.lock().unwrap_or_else(|p| p.into_inner()) = senders;
        *self.inner.indexer.lock().unwrap_or_else(|p| p.into_inner()) = handles;
        Ok(())
    }

    fn wake_enricher(&self) {
        if let Some(tx) = self
            .inner
            .enrich_wake
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            let _ = tx.send(());
        }
    }

    /// Embeds queued records in the background with the substrate's embedder, on its own
    /// thread and runtime, backing off while the provider fails. Records wait in the durable
    /// queue meanwhile, so nothing is lost when it is down or the process dies.
    fn start_enricher(&self) -> Result<()> {
        let (tx, rx) = mpsc::channel::<()>();
        // Work left from a previous run starts at once.
        let _ = tx.send(());
        *self
            .inner
            .enrich_wake
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(tx);
        let weak = Arc::downgrade(&self.inner);
        let handle = std::thread::Builder::new()
            .name("enricher".into())
            .spawn(move || {
                let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build()
                else {
                    tracing::error!("the enricher could not start a runtime; queued records wait");
                    return;
                };
                let mut backoff = Duration::from_millis(100);
                loop {
                    match rx.recv_timeout(Duration::from_secs(1)) {
                        Ok(()) => while rx.try_recv().is_ok() {},
                        Err(mpsc::RecvTimeoutError::Timeout) => {}
                        Err(mpsc::RecvTimeoutError::Disconnected) => return,
                    }
                    loop {
                        let Some(inner) = weak.upgrade() else { return };
                        if inner.closed.load(Ordering::SeqCst) {
                            return;
                        }
                        let sub = Substrate { inner };
                        match rt.block_on(sub.enrich_pending(64)) {
                            Ok(0) => {
                                backoff = Duration::from_millis(100);
                                break;
                            }
                            Ok(_) => continue,
                            Err(e) => {
                                tracing::warn!(error = %e, retry_in = ?backoff, "enrichment failed; records stay queued");
                                drop(sub);
                                std::thread::sleep(backoff);
                                backoff = (backoff * 2).min(Duration::from_secs(30));
                                break;
                            }
                        }
                    }
                }
            })
            .map_err(|e| Error::io("enricher thread", e))?;
        *self
            .inner
            .enricher
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(handle);
        Ok(())
    }

    /// Stops the background threads and builds everything that is staged, so the next open
    /// starts with nothing to replay. Records still waiting for enrichment stay queued.
    pub fn close(&self) -> Result<()> {
        self.inner.closed.store(true, Ordering::SeqCst);
        self.inner
            .wake
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        self.inner
            .enrich_wake
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let mut threads =
            std::mem::take(&mut *self.inner.indexer.lock().unwrap_or_else(|p| p.into_inner()));
        threads.extend(
            self.inner
                .enricher
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take(),
        );
        for h in threads {
            let _ = h.join();
        }
        self.flush_indexes()
    }

    // ----- recall ---------------------------------------------------------------------------

    /// Answers "what should I remember now?": candidates from the vector, keyword, recent and
    /// knowledge paths, fused and ranked by the policy, diversified, trimmed to the token
    /// budget and rendered. Obsolete and archived records are never returned.
    pub async fn recall(&self, req: &RecallRequest) -> Result<RecallResult> {
        validate_id("namespace", &req.namespace)?;
        validate_id("session_id", &req.session_id)?;
        if let Some(a) = &req.agent_id {
            validate_id("agent_id", a)?;
        }
        if req.k == 0 || req.k > 200 {
            return Err(Error::invalid(
                "k",
                format!("{} is out of range; ask for 1 to 200 memories", req.k),
            ));
        }
        if req.query.len() > self.inner.limits.max_text_bytes {
            return Err(Error::TooLarge {
                field: "query".into(),
                size: req.query.len(),
                limit: self.inner.limits.max_text_bytes,
                hint: "ask a shorter question".into(),
            });
        }
        if let (Some(s), Some(u)) = (req.since, req.until)
            && s > u
        {
            return Err(Error::invalid("since", "is after `until`; swap them"));
        }
        let query_vec = match &req.query_embedding {
            Some(v) => {
                validate_embedding(v, Some(self.inner.embedder.dimensions()))?;
                Some(v.clone())
            }
            None if req.query.trim().is_empty() => None,
            None => self.embed(std::slice::from_ref(&req.query)).await?.pop(),
        };
        let policy = self.policy();
        let sub = self.clone();
        let req2 = req.clone();
        let _turn = self
            .inner
            .ranking
            .acquire()
            .await
            .map_err(|_| Error::Closed)?;
        let (mut result, mut writes) =
            tokio::task::spawn_blocking(move || sub.rank(&req2, query_vec.as_deref(), &policy))
                .await
                .map_err(|e| Error::invalid("recall", format!("recall task failed: {e}")))??;
        if !req.reinforce {
            writes.0.clear();
        }
        let (recall_id, remember) = crate::lifecycle::remember_recall(self, req, &result)?;
        result.recall_id = Some(recall_id);
        writes.push(remember);
        // Nothing the caller sees depends on these writes (reinforcement, the recall's
        // memory for feedback): queue them for the next group commit and answer now. A
        // crash before the flush costs a reinforcement and makes feedback on this recall
        // unknown; it never loses an event.
        self.inner.store.write_detached(writes)?;
        Ok(result)
    }

    /// The synchronous core of recall; also returns the reinforcement writes to make.
    pub fn rank(
        &self,
        req: &RecallRequest,
        query_vec: Option<&[f32]>,
        policy: &Arc<Policy>,
    ) -> Result<(RecallResult, WriteSet)> {
        // Read-your-writes: whatever was acknowledged is in the tails before we search.
        self.catch_up()?;
        let store = &self.inner.store;
        let episodic = [Tier::Episodic, Tier::Condensed];
        let (session, agent) = match req.scope {
            Scope::Session => (Some(req.session_id.as_str()), None),
            Scope::Agent => (
                None,
                Some(req.agent_id.as_deref().ok_or_else(|| {
                    Error::invalid(
                        "scope",
                        "`agent` scope needs an agent_id; send one or use `session`",
                    )
                })?),
            ),
            Scope::Namespace => (None, None),
        };
        let mut allowed = store.candidates(&Filter {
            namespace: &req.namespace,
            session,
            agent,
            tiers: Some(&episodic),
            kinds: req.kinds.as_deref(),
            recallable_only: true,
        });
        if req.include_knowledge {
            allowed |= store.candidates(&Filter {
                namespace: &req.namespace,
                tiers: Some(&[Tier::Knowledge]),
                kinds: req.kinds.as_deref(),
                recallable_only: true,
                ..Default::default()
            });
        }
        if req.since.is_some() || req.until.is_some() {
            allowed &= self.window_ids(req, session)?;
        }
        let depth = (req.k * 4).max(50);
        let mut cands = Candidates::default();
        if !allowed.is_empty() {
            if let Some(q) = query_vec {
                cands.add_vector(&self.inner.vectors.search(q, depth, Some(&allowed))?);
            }
            let hits = self
                .inner
                .keywords
                .search(&req.query, depth, Some(&allowed))?;
            let window = policy.scoring.context_window as usize;
            let weight = policy.scoring.context_weight;
            if window > 0 && weight > 0.0 && !hits.is_empty() {
                cands.add_keyword(
                    &self.keyword_in_context(&req.query, &hits, &allowed, window, weight, depth)?,
                );
            } else {
                cands.add_keyword(&hits);
            }
            if req.scope == Scope::Session {
                let recent: Vec<MemoryId> = store
                    .session_ids(
                        &req.namespace,
                        &req.session_id,
                        None,
                        self.inner.recent_n * 4,
                    )?
                    .into_iter()
                    .filter(|id| allowed.contains(id.0))
                    .take(self.inner.recent_n)
                    .collect();
                cands.add_recent(&recent);
            }
        }
        // Load the candidates and their exact similarity to the query, always computed here
        // from the stored embedding: the vector path's own cosine depends on where it found
        // the vector (tail, cache or store read-back differ in the last bits), and a replay
        // must rank identically whatever the indexes had built by then.
        let lambda = policy.scoring.mmr_lambda;
        let mut loaded: Vec<(MemoryRecord, Option<Vec<f32>>)> =
            Vec::with_capacity(cands.by_id.len());
        for (id, ev) in cands.by_id.iter_mut() {
            let Some(mut r) = store.get(*id)? else {
                continue;
            };
            if !r.recallable() || r.namespace != req.namespace {
                continue;
            }
            let emb = r.embedding.take();
            if let (Some(q), Some(e)) = (query_vec, emb.as_deref()) {
                ev.similarity = Some(retrieval::cosine(q, e));
            }
            loaded.push((r, emb));
        }
        let fusion = match policy.scoring.fusion {
            crate::policy::Fusion::Rrf => FusionMethod::Rrf,
            crate::policy::Fusion::Weighted => FusionMethod::Weighted,
        };
        let mut relevance = retrieval::fuse(&cands, fusion, policy.scoring.vector_weight);
        // When the query names a speaker or a time, what that speaker said and what happened
        // then come first: the others' relevance is divided by 1 + boost (dividing keeps
        // relevance within 0..=1). A query naming nothing any candidate fits changes nothing.
        let mut prefer = |boost: f32, fits: &dyn Fn(&MemoryRecord) -> bool| {
            let fitting: std::collections::HashSet<MemoryId> = loaded
                .iter()
                .filter(|(r, _)| fits(r))
                .map(|(r, _)| r.id)
                .collect();
            if boost > 0.0 && !fitting.is_empty() {
                for (id, v) in relevance.iter_mut() {
                    if !fitting.contains(id) {
                        *v /= 1.0 + boost;
                    }
                }
            }
        };
        if policy.scoring.speaker_boost > 0.0 {
            let query = crate::text::analyze(&req.query);
            prefer(policy.scoring.speaker_boost, &|r| {
                retrieval::speaker_terms(&r.text)
                    .is_some_and(|s| retrieval::names_speaker(&query, &s))
            });
        }
        if policy.scoring.time_boost > 0.0 {
            let cues = retrieval::time_cues(&req.query);
            if !cues.is_empty() {
                prefer(policy.scoring.time_boost, &|r| {
                    cues.iter().any(|c| c.fits(r.event_time))
                });
            }
        }
        let now = self.inner.clock.now();
        let mut scored: Vec<(f32, Why, usize)> = loaded
            .iter()
            .enumerate()
            .map(|(i, (r, _))| {
                let b = policy.score(&crate::policy::ScoreInput {
                    relevance: relevance.get(&r.id).copied().unwrap_or(0.0),
                    age_ms: now - r.event_time,
                    importance: r.importance,
                    utility: r.utility.mean(),
                    strength: policy.strength_at(r, now),
                });
                let why = Why {
                    relevance: b.relevance,
                    recency: b.recency,
                    importance: b.importance,
                    utility: b.utility,
                };
                (b.total, why, i)
            })
            .collect();
        scored.sort_by(|a, b| {
            b.0.total_cmp(&a.0)
                .then_with(|| loaded[b.2].0.event_time.cmp(&loaded[a.2].0.event_time))
                .then_with(|| loaded[a.2].0.id.cmp(&loaded[b.2].0.id))
        });
        let order: Vec<usize> = if lambda < 1.0 {
            let pool = &scored[..scored.len().min(req.k * 4)];
            let scores: Vec<f32> = pool.iter().map(|s| s.0).collect();
            let embs: Vec<Option<&[f32]>> = pool.iter().map(|s| loaded[s.2].1.as_deref()).collect();
            retrieval::mmr(&scores, &embs, lambda, req.k)
                .into_iter()
                .map(|i| pool[i].2)
                .collect()
        } else {
            scored.iter().take(req.k).map(|s| s.2).collect()
        };
        let ranked: Vec<&MemoryRecord> = order.iter().map(|&i| &loaded[i].0).collect();
        let keep = retrieval::fit_budget(&ranked, req.token_budget);
        let context = retrieval::render_context(&ranked[..keep]);
        let why_of = |i: usize| scored.iter().find(|s| s.2 == i).map(|s| (s.0, s.1));
        let mut memories = Vec::with_capacity(keep);
        let mut reinforce = WriteSet::new();
        let amount = policy.scoring.reinforce_on_recall;
        for &i in order.iter().take(keep) {
            let (score, why) = why_of(i).expect("ordered from scored");
            let record = loaded[i].0.clone();
            if amount > 0.0 {
                reinforce.push(Mutation::Reinforce {
                    id: record.id,
                    reinforcement: Reinforcement {
                        policy: Arc::clone(policy),
                        at: now,
                        amount,
                    },
                    by: "recall".into(),
                });
            }
            memories.push(Recalled { record, score, why });
        }
        Ok((
            RecallResult {
                policy: policy.stamp(),
                memories,
                context,
                recall_id: None,
            },
            reinforce,
        ))
    }

    /// Re-scores the best [`CONTEXT_HITS`] of the keyword path's `hits` with each record's
    /// neighbours in its session (`window` each side, within [`CONTEXT_GAP_MS`]) counted at
    /// `weight` ([`retrieval::context_bm25`]), and brings in the neighbours themselves,
    /// scored the same way: the turn that answers a question is often the one after the
    /// turn that matches it. Only `allowed` records are read or counted. The other hits keep
    /// their scores. Returns the best `depth`, best first, as the keyword path's new ranking.
    fn keyword_in_context(
        &self,
        query: &str,
        hits: &[(u32, f32)],
        allowed: &roaring::RoaringBitmap,
        window: usize,
        weight: f32,
        depth: usize,
    ) -> Result<Vec<(u32, f32)>> {
        let store = &self.inner.store;
        let stats = self.inner.keywords.query_stats(query)?;
        // Analysed text per record, each read once however many runs it appears in.
        let mut terms: HashMap<MemoryId, Vec<String>> = HashMap::new();
        let mut scores: HashMap<MemoryId, f32> = HashMap::new();
        for &(hit, _) in hits.iter().take(CONTEXT_HITS) {
            let hit = MemoryId(hit);
            let Some(r) = store.get_light(hit)? else {
                continue;
            };
            terms
                .entry(hit)
                .or_insert_with(|| crate::text::analyze(&r.text));
            // One run of the session around the hit, `2 × window` each side, holds every
            // member within `window` of it together with that member's own neighbours.
            let (before, after) = store.session_neighbours(
                &r.namespace,
                &r.session_id,
                (r.event_time, r.id),
                2 * window,
                CONTEXT_GAP_MS,
                |n| allowed.contains(n.0),
            )?;
            let at = before.len();
            let run: Vec<(Timestamp, MemoryId)> = before
                .into_iter()
                .rev()
                .chain(std::iter::once((r.event_time, hit)))
                .chain(after)
                .collect();
            for &(_, id) in &run {
                if !terms.contains_key(&id)
                    && let Some(n) = store.get_light(id)?
                {
                    terms.insert(id, crate::text::analyze(&n.text));
                }
            }
            for q in at.saturating_sub(window)..=(at + window).min(run.len() - 1) {
                let (t, id) = run[q];
                if scores.contains_key(&id) {
                    continue;
                }
                let neighbours: Vec<&[String]> = run
                    [q.saturating_sub(window)..=(q + window).min(run.len() - 1)]
                    .iter()
                    .filter(|(tn, n)| *n != id && tn.abs_diff(t) <= CONTEXT_GAP_MS.unsigned_abs())
                    .filter_map(|(_, n)| terms.get(n).map(Vec::as_slice))
                    .collect();
                let own = terms.get(&id).map_or(&[][..], Vec::as_slice);
                let score =
                    retrieval::context_bm25(&stats, own, &neighbours, weight, window as u32);
                scores.insert(id, score);
            }
        }
        // Hits past the first CONTEXT_HITS keep their own BM25 score, so a recall asking for
        // many memories still gets every keyword hit.
        for &(id, score) in hits.iter().skip(CONTEXT_HITS) {
            scores.entry(MemoryId(id)).or_insert(score);
        }
        let mut scored: Vec<(u32, f32)> = scores
            .into_iter()
            .filter(|(_, s)| *s > 0.0)
            .map(|(id, s)| (id.0, s))
            .collect();
        scored.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        scored.truncate(depth);
        Ok(scored)
    }

    fn window_ids(
        &self,
        req: &RecallRequest,
        session: Option<&str>,
    ) -> Result<roaring::RoaringBitmap> {
        let store = &self.inner.store;
        let mut ids = roaring::RoaringBitmap::new();
        // Listings are time-ordered: walk back from `until` and stop at `since`.
        let before = req.until.map(|u| (u.saturating_add(1), MemoryId(0)));
        let mut cursor = before;
        loop {
            let page = match session {
                Some(s) => store.session_ids(&req.namespace, s, cursor, 4096)?,
                None => store.namespace_ids(&req.namespace, cursor, 4096)?,
            };
            if page.is_empty() {
                break;
            }
            let mut done = false;
            let mut last = None;
            for id in &page {
                let Some(r) = store.get_light(*id)? else {
                    continue;
                };
                last = Some((r.event_time, r.id));
                if req.since.is_some_and(|s| r.event_time < s) {
                    done = true;
                    break;
                }
                ids.insert(id.0);
            }
            if done || page.len() < 4096 {
                break;
            }
            cursor = last;
        }
        // Knowledge records are namespace-wide: their own window check.
        if req.include_knowledge {
            let k = store.candidates(&Filter {
                namespace: &req.namespace,
                tiers: Some(&[Tier::Knowledge]),
                ..Default::default()
            });
            for id in k {
                if let Some(r) = store.get_light(MemoryId(id))?
                    && retrieval::in_window(r.event_time, req.since, req.until)
                {
                    ids.insert(id);
                }
            }
        }
        Ok(ids)
    }

    // ----- lifecycle ------------------------------------------------------------------------

    /// Reads a record of `namespace` (another namespace's ids are not found).
    pub fn get(&self, namespace: &str, id: MemoryId) -> Result<MemoryRecord> {
        self.inner.store.get_in(namespace, id)
    }

    /// Changes a record's status (`active`, `pinned`, `obsolete`, `archived`), audited.
    pub fn set_status(
        &self,
        namespace: &str,
        id: MemoryId,
        status: Status,
        by: &str,
    ) -> Result<MemoryRecord> {
        let r = self.inner.store.get_in(namespace, id)?;
        if r.status == status {
            return Ok(r);
        }
        let now = self.inner.clock.now();
        let action = if status == Status::Archived {
            AuditAction::Archived
        } else {
            AuditAction::StatusChanged
        };
        self.inner.store.write(WriteSet(vec![
            Mutation::Audit(
                id,
                AuditEntry {
                    at: now,
                    action,
                    by: by.into(),
                    detail: format!("{} -> {}", r.status.as_str(), status.as_str()),
                },
            ),
            Mutation::Patch(
                id,
                RecordPatch {
                    status: Some((status, now)),
                    ..RecordPatch::default()
                },
            ),
        ]))?;
        self.inner.store.get_in(namespace, id)
    }

    /// Archives a record (soft delete: never recalled, recoverable until purged).
    pub fn archive(&self, namespace: &str, id: MemoryId, by: &str) -> Result<MemoryRecord> {
        self.set_status(namespace, id, Status::Archived, by)
    }

    /// Removes a record for good; its audit log keeps a `purged` entry.
    pub fn purge(&self, namespace: &str, id: MemoryId, by: &str) -> Result<()> {
        let r = self.inner.store.get_in(namespace, id)?;
        let now = self.inner.clock.now();
        self.inner.store.write(WriteSet(vec![
            Mutation::Audit(
                id,
                AuditEntry {
                    at: now,
                    action: AuditAction::Purged,
                    by: by.into(),
                    detail: format!("purged after {} as {}", r.status.as_str(), r.kind),
                },
            ),
            Mutation::Purge(Box::new(r)),
        ]))?;
        self.wake_indexer();
        Ok(())
    }

    /// A record's audit log (namespace-checked; kept after a purge).
    pub fn history(&self, namespace: &str, id: MemoryId) -> Result<Vec<AuditEntry>> {
        // Purged records keep a tombstone naming their namespace, so history stays isolated.
        // So does a quarantined input that never became a record.
        let owner = match self.inner.store.owner(id)? {
            Some(owner) => Some(owner),
            None => self.quarantine_entry(id)?.map(|q| q.namespace),
        };
        match owner {
            Some(owner) if owner == namespace => self.inner.store.history(id),
            _ => Err(Error::NotFound {
                what: "memory",
                id: id.to_string(),
            }),
        }
    }

    /// Disk use of the whole data directory.
    pub fn disk_bytes(&self) -> Result<u64> {
        crate::kv::dir_disk_bytes(&self.inner.dir)
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Closing the wake channels ends the background threads.
        self.wake.lock().unwrap_or_else(|p| p.into_inner()).clear();
        self.enrich_wake
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
    }
}

fn at_event(i: usize, err: Error) -> Error {
    match err {
        Error::Invalid { field, reason } => Error::Invalid {
            field: format!("events[{i}].{field}"),
            reason,
        },
        Error::TooLarge {
            field,
            size,
            limit,
            hint,
        } => Error::TooLarge {
            field: format!("events[{i}].{field}"),
            size,
            limit,
            hint,
        },
        other => other,
    }
}
