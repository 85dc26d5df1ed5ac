//! The substrate: one handle over the store, the derived indexes, the embedder, the policy
//! and the clock, with the operations every layer above needs — record, enrich, index,
//! recall, change status, archive, purge, reindex, promote. Synchronous where the work is
//! storage, async where a provider may be remote. No actors here: the actor runtime calls
//! these, and decides *when*; this handle decides *what*.
//!
//! [`Substrate`] is one type split by family, one file each (as neon splits its `Timeline`):
//! this file holds the handle, its options, opening and closing; [`ingest`](self::ingest)
//! validates and writes events and embeds queued ones; [`indexing`](self::indexing) keeps
//! the derived indexes following the store; [`recall`](self::recall) ranks and remembers
//! recalls; [`lifecycle`](self::lifecycle) holds decay, condensation, feedback and status
//! changes; [`knowledge`](self::knowledge) the knowledge pool; [`evaluate`](self::evaluate)
//! the judge's importance scores; [`quarantine`](self::quarantine) poison inputs;
//! [`updates`](self::updates) facts that change (supersession, contradiction, repeats).
//!
//! Indexing model: every write appends to the store's change log; the indexer applies
//! changes to the indexes' in-memory tails (searchable at once) and builds / commits them
//! in debounced batches, recording the change sequence as the index watermark. Opening a
//! substrate replays the log from the watermarks, or rebuilds an index from the store when
//! it is missing or older than the kept log — so an index is never a second source of truth.

mod evaluate;
mod indexing;
mod ingest;
mod insights;
mod knowledge;
mod lifecycle;
mod quarantine;
mod recall;
mod updates;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

pub use evaluate::{EvaluationReport, Judge, JudgeBatch, JudgeItem, Judgement, Verdict};
pub use indexing::{IndexKind, IndexPass};
pub use ingest::{IDEMPOTENCY_WINDOW, Idempotency, Recorded};
pub use insights::{Counted, Fading, Insights, Superseded};
pub use knowledge::{Graph, KNOWLEDGE_SESSION, PROMOTE_ROUND, Promotion};
pub use lifecycle::{
    Condensed, FeedbackReport, FeedbackTarget, MAX_REASON_BYTES, Outcome, Summarizer, Summary,
    SummaryRequest, SweepReport,
};
pub use quarantine::{MAX_STRIKES, panic_message, quarantined_error};
pub use recall::{
    PartAsk, PartFuture, PartHits, PartLink, PartRecord, PartScope, PassageHit, PathHit, Plan,
    RecallPart, RecallRequest, RecallResult, Recalled, Spread, Why, recall_across,
};
pub(crate) use recall::{recall_id, recall_number};
pub use updates::{
    Chain, PairBatch, PairItem, PairVerdict, Resolution, UpdateJudge, UpdateMark, UpdateProbe,
    UpdatesRound,
};

use crate::clock::{Clock, SystemClock};
use crate::embed::Embedder;
use crate::error::Result;
use crate::index::{KeywordIndex, VectorIndex, VectorOptions, VectorSource};
use crate::model::{Limits, MemoryId};
use crate::policy::Policy;
use crate::store::{Backend, CommitLog, IdBlock, Store, StoreOptions};
use indexing::StagedTimes;

/// When the indexer builds.
#[derive(Debug, Clone)]
pub struct IndexingOptions {
    /// Run the substrate's own background threads: the indexer and the enricher (which
    /// embeds the records a non-inline embedder left queued). Off in tests that drive them
    /// by hand, and under the actor runtime, whose Indexer and Enricher actors own that work.
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
    /// The active policy: every namespace's, unless `namespace_policies` names it.
    pub policy: Policy,
    /// Policies the operator assigned to single namespaces (`[[namespaces]]`), by
    /// namespace: those namespaces never fall back on `policy`.
    pub namespace_policies: BTreeMap<String, Policy>,
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
    /// In a cluster, the log the store appends every commit group to before committing it
    /// (see the store's `log.rs`); `None` on a single node.
    pub log: Option<Arc<dyn CommitLog>>,
    /// A cluster standby: the store takes writes only from its owner's log
    /// ([`Substrate::apply_logged`]), and the background threads keep the indexes up with
    /// it (no enricher, no update detection: the owner's log carries their results).
    pub standby: bool,
    /// The ids the store hands out ([`StoreOptions::ids`]): a cluster partition's block;
    /// `None` on a single node.
    pub ids: Option<IdBlock>,
    /// In a cluster placed by session, the other stores holding the namespaces' records:
    /// recall asks them too ([`Spread`]); `None` when this store holds them all.
    pub spread: Option<Arc<dyn Spread>>,
}

impl Default for SubstrateOptions {
    fn default() -> Self {
        SubstrateOptions {
            backend: Backend::default(),
            policy: Policy::default_policy(),
            namespace_policies: BTreeMap::new(),
            embedder: Arc::new(crate::embed::HashEmbedder::default()),
            clock: Arc::new(SystemClock),
            limits: Limits::default(),
            vector: VectorOptions::default(),
            indexing: IndexingOptions::default(),
            recent_n: 8,
            log: None,
            standby: false,
            ids: None,
            spread: None,
        }
    }
}

/// Staged vector changes a close still builds into the trees; a larger tail is left to the
/// next open (a build of 18,000 staged vectors takes seconds, and the stop would wait for it).
pub const CLOSE_BUILD_LIMIT: usize = 4096;

/// The active policies: the default, and those the operator assigned to single
/// namespaces. Each is compiled with the defaults that follow the embedder.
#[derive(Debug, Clone)]
pub struct Policies {
    /// The policy of every namespace not in `namespaces`.
    pub default: Arc<Policy>,
    /// Namespaces with a policy of their own.
    pub namespaces: BTreeMap<String, Arc<Policy>>,
}

impl Policies {
    fn new(default: Policy, namespaces: BTreeMap<String, Policy>, semantic: bool) -> Policies {
        Policies {
            default: Arc::new(default.for_embedder(semantic)),
            namespaces: namespaces
                .into_iter()
                .map(|(ns, p)| (ns, Arc::new(p.for_embedder(semantic))))
                .collect(),
        }
    }

    /// The policy in force for `namespace`.
    pub fn get(&self, namespace: &str) -> &Arc<Policy> {
        self.namespaces.get(namespace).unwrap_or(&self.default)
    }

    /// Every active policy, the default first.
    pub fn all(&self) -> impl Iterator<Item = &Arc<Policy>> {
        std::iter::once(&self.default).chain(self.namespaces.values())
    }
}

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
    policy: RwLock<Arc<Policies>>,
    clock: Arc<dyn Clock>,
    limits: Limits,
    indexing: IndexingOptions,
    recent_n: usize,
    /// The other stores recall asks ([`SubstrateOptions::spread`]).
    spread: Option<Arc<dyn Spread>>,
    /// With a spread, the runtime the store was opened in: synchronous work that asks the
    /// other stores (update detection on an indexer thread) waits for them on it.
    runtime: Option<tokio::runtime::Handle>,
    /// Highest change sequence applied to both indexes' tails.
    applied: AtomicU64,
    /// When the oldest and the newest change not yet built were applied, per index.
    staged_times: Mutex<[StagedTimes; 2]>,
    /// Serialises applying changes to the tails.
    apply_lock: Mutex<()>,
    /// Serialises update-detection rounds (each reads what the one before it wrote).
    updates_lock: Mutex<()>,
    /// Serialises the rounds that ask a judge (held across its call, so not `updates_lock`).
    updates_round: tokio::sync::Mutex<()>,
    /// Set when a runtime asks an LLM judge about updates: the scheduled rules-only
    /// rounds stop, so records of `llm`/`hybrid` policies wait for the judge's rounds.
    update_judge: std::sync::atomic::AtomicBool,
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
    /// Called when records are queued for their embedding: the substrate's enricher thread,
    /// or the actor runtime's Enricher, whichever owns enrichment (see
    /// [`Substrate::on_enrich_queued`]).
    enrich_wake: Hook,
    /// Called when the enricher stores the embedding of a candidate waiting on the
    /// promotion queue (see [`Substrate::on_promotion_ready`]).
    promotion_wake: Hook,
    /// Held across a promotion: one at a time (see [`Substrate::promote`]).
    promoting: tokio::sync::Mutex<()>,
    enricher: Mutex<Option<JoinHandle<()>>>,
    closed: AtomicBool,
    /// Handles lent to work on another runtime's threads ([`Substrate::lend`]), counted
    /// apart from the handle so the count falls only once the handle is gone.
    lent: Arc<AtomicUsize>,
    /// A cluster standby (see [`SubstrateOptions::standby`]).
    standby: bool,
    /// Recalls ranking at once: two per core. Without a bound, 32 concurrent recalls would be
    /// 32 blocking threads time-sliced on 2 cores, and an unlucky one would wait for all the
    /// others (p99 five times p50); with it they queue first in, first out. One per core
    /// would leave a core idle while a ranking thread waits on a page fault (a quarter less
    /// throughput).
    ranking: tokio::sync::Semaphore,
}

/// What wakes the owner of enrichment.
pub type EnrichWake = Arc<dyn Fn() + Send + Sync>;

/// Where a wake-up ([`EnrichWake`]) is registered in the substrate's state: set by its
/// owner, called by the substrate; it prints (a closure does not).
#[derive(Default)]
pub(crate) struct Hook(Mutex<Option<EnrichWake>>);

impl Hook {
    /// Makes `wake` the one called (`None`: nobody).
    pub(crate) fn set(&self, wake: Option<EnrichWake>) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = wake;
    }

    /// Calls the registered wake-up, if any (outside the lock).
    pub(crate) fn fire(&self) {
        let wake = self.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(wake) = wake {
            wake();
        }
    }
}

impl std::fmt::Debug for Hook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Hook")
    }
}

/// The vector index reads the vectors it staged past its memory budget back from here.
struct StoreVectors(Store);

impl VectorSource for StoreVectors {
    fn vector(&self, id: u32) -> Result<Option<Vec<f32>>> {
        self.0.embedding(MemoryId(id))
    }
}

/// A handle that does not keep a [`Substrate`] open: counts the clones still alive.
#[derive(Clone, Debug)]
pub struct WeakSubstrate(std::sync::Weak<Inner>);

impl WeakSubstrate {
    /// Clones of the substrate still alive.
    pub fn count(&self) -> usize {
        self.0.strong_count()
    }
}

impl Substrate {
    /// A handle that counts this substrate's clones without holding it.
    pub fn downgrade(&self) -> WeakSubstrate {
        WeakSubstrate(Arc::downgrade(&self.inner))
    }

    /// Opens the data directory `dir` (store in `dir/store`, vectors in `dir/vectors`,
    /// keywords in `dir/keywords`), checks the embedder's dimension against the store's,
    /// reconciles the indexes with the store and starts the indexer.
    pub fn open(dir: &Path, opts: SubstrateOptions) -> Result<Substrate> {
        // Compiles the time-cue patterns now: the first recalls would otherwise pay a few
        // milliseconds each for them while the requests behind them wait for a slot.
        crate::retrieval::time_cues("");
        let store = Store::open(
            &dir.join("store"),
            StoreOptions {
                backend: opts.backend,
                log: opts.log.clone(),
                standby: opts.standby,
                ids: opts.ids,
            },
        )?;
        let dims = opts.embedder.dimensions();
        store.ensure_dimension(dims, opts.embedder.name())?;
        let vectors = VectorIndex::open(&dir.join("vectors"), dims, opts.vector.clone())?;
        vectors.read_back_from(Arc::new(StoreVectors(store.clone())));
        let keywords = KeywordIndex::open(&dir.join("keywords"))?;
        let semantic = opts.embedder.is_semantic();
        let policy = Policies::new(opts.policy, opts.namespace_policies, semantic);
        let inner = Arc::new(Inner {
            dir: dir.to_path_buf(),
            store,
            vectors,
            keywords,
            embedder: opts.embedder,
            policy: RwLock::new(Arc::new(policy)),
            clock: opts.clock,
            limits: opts.limits,
            indexing: opts.indexing,
            recent_n: opts.recent_n,
            runtime: opts
                .spread
                .as_ref()
                .and_then(|_| tokio::runtime::Handle::try_current().ok()),
            spread: opts.spread,
            applied: AtomicU64::new(0),
            staged_times: Mutex::new([StagedTimes::default(); 2]),
            apply_lock: Mutex::new(()),
            updates_lock: Mutex::new(()),
            updates_round: tokio::sync::Mutex::new(()),
            update_judge: std::sync::atomic::AtomicBool::new(false),
            build_locks: [Mutex::new(()), Mutex::new(())],
            truncated: AtomicU64::new(0),
            rebuilds: AtomicU64::new(0),
            provider_errors: AtomicU64::new(0),
            promotions: AtomicU64::new(0),
            wake: Mutex::new(Vec::new()),
            indexer: Mutex::new(Vec::new()),
            enrich_wake: Hook::default(),
            promotion_wake: Hook::default(),
            promoting: tokio::sync::Mutex::new(()),
            enricher: Mutex::new(None),
            closed: AtomicBool::new(false),
            lent: Arc::new(AtomicUsize::new(0)),
            standby: opts.standby,
            ranking: tokio::sync::Semaphore::new(
                std::thread::available_parallelism().map_or(2, |n| n.get()) * 2,
            ),
        });
        let sub = Substrate { inner };
        sub.check_analyzer()?;
        sub.reconcile()?;
        if sub.inner.indexing.background {
            sub.start_indexer()?;
            if !sub.inner.standby {
                sub.start_enricher()?;
            }
        }
        Ok(sub)
    }

    /// Applies entries of a cluster log to a standby's store ([`Store::apply_logged`]) and
    /// wakes the indexer to build what they changed; returns the position applied.
    pub fn apply_logged(&self, entries: Vec<(u64, Vec<u8>)>) -> Result<u64> {
        self.inner.store.apply_logged(entries)?;
        self.wake_indexer();
        self.inner.store.log_applied()
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

    /// The active policy of the namespaces that have none of their own.
    pub fn policy(&self) -> Arc<Policy> {
        self.policies().default.clone()
    }

    /// The policy in force for `namespace`.
    pub fn policy_for(&self, namespace: &str) -> Arc<Policy> {
        self.policies().get(namespace).clone()
    }

    /// Every active policy at once (one consistent view, for work across namespaces).
    pub fn policies(&self) -> Arc<Policies> {
        self.inner
            .policy
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Makes `policy` the active one of the namespaces without their own (later decisions
    /// carry its name and hash), with the defaults that follow the embedder filled in
    /// ([`Policy::for_embedder`]).
    pub fn set_policy(&self, policy: Policy) {
        let namespaces = self.policies().namespaces.clone();
        let semantic = self.inner.embedder.is_semantic();
        self.install(Policies {
            default: Arc::new(policy.for_embedder(semantic)),
            namespaces,
        });
    }

    /// Replaces every active policy at once: `policy` for the namespaces without their own,
    /// `namespaces` for those assigned one.
    pub fn set_policies(&self, policy: Policy, namespaces: BTreeMap<String, Policy>) {
        self.install(Policies::new(
            policy,
            namespaces,
            self.inner.embedder.is_semantic(),
        ));
    }

    fn install(&self, policies: Policies) {
        *self.inner.policy.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(policies);
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

    /// How many times an index was rebuilt from the store since open.
    pub fn rebuilds(&self) -> u64 {
        self.inner.rebuilds.load(Ordering::Relaxed)
    }

    /// A handle for work that runs where closing does not reach (the background threads'
    /// index passes): [`Substrate::close`] waits until every lent handle is dropped, since
    /// one still alive keeps the store and the indexes open and the directory could not be
    /// opened again in this process.
    pub fn lend(&self) -> Lent {
        self.inner.lent.fetch_add(1, Ordering::SeqCst);
        Lent {
            substrate: Some(self.clone()),
            count: self.inner.lent.clone(),
        }
    }

    /// Stops the background threads and commits the keyword index; the vector trees are
    /// built too when little is staged ([`CLOSE_BUILD_LIMIT`]). Whatever is left (a large
    /// vector tail, or what a full disk kept the indexes from saving) stays in the store's
    /// change log and is replayed at the next open, where the indexer builds it in the
    /// background: a stop's time does not grow with the tail. Records still waiting for
    /// enrichment stay queued.
    pub fn close(&self) -> Result<()> {
        self.inner.closed.store(true, Ordering::SeqCst);
        self.inner
            .wake
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        self.inner.enrich_wake.set(None);
        let mut threads =
            std::mem::take(&mut *self.inner.indexer.lock().unwrap_or_else(|p| p.into_inner()));
        threads.extend(
            self.inner
                .enricher
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take(),
        );
        // A tree build running (minutes on a busy machine) gives up first, or joining the
        // indexer thread running it would wait for it; then every build has ended, also
        // one that another scheduler (the runtime's Indexer actor) started.
        self.inner.vectors.stop_builds();
        for h in threads {
            let _ = h.join();
        }
        // A lent handle's work sees `closed` and stops soon; a minute covers a pass starved
        // at the background priority on a loaded machine.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while self.inner.lent.load(Ordering::SeqCst) > 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        self.inner.vectors.cancel_builds();
        // Nothing acknowledged depends on the indexes (they are derived), so failing to
        // save them does not fail the close.
        let mut saved = self.index_pass_for(IndexKind::Keywords, true).map(|_| ());
        if saved.is_ok() && self.inner.vectors.pending() <= CLOSE_BUILD_LIMIT {
            saved = self.index_pass_for(IndexKind::Vectors, true).map(|_| ());
        }
        if let Err(e) = saved {
            tracing::warn!(
                error = %e,
                "the indexes could not save their last changes; the next open builds them \
                 from the store"
            );
        }
        Ok(())
    }

    /// Disk use of the whole data directory.
    pub fn disk_bytes(&self) -> Result<u64> {
        crate::store::dir_disk_bytes(&self.inner.dir)
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Closing the wake channels ends the background threads.
        self.wake.lock().unwrap_or_else(|p| p.into_inner()).clear();
        self.enrich_wake.set(None);
    }
}

/// A [`Substrate`] lent to background work ([`Substrate::lend`]); dereferences to it.
pub struct Lent {
    substrate: Option<Substrate>,
    count: Arc<AtomicUsize>,
}

impl std::ops::Deref for Lent {
    type Target = Substrate;

    fn deref(&self) -> &Substrate {
        // Present until the drop.
        self.substrate
            .as_ref()
            .expect("a lent handle until it is dropped")
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        // The handle first: the count says it is gone only once it is.
        drop(self.substrate.take());
        self.count.fetch_sub(1, Ordering::SeqCst);
    }
}
