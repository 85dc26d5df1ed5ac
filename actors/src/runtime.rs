//! The typed [`Runtime`] handle: the only way in. It opens the substrate, starts the
//! supervision tree, and turns every request into a message with a timeout — callers never
//! see an `ActorRef`, and every failure comes back as a [`shadowbrain_runtime::Error`].

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use ractor::rpc::CallResult;
use ractor::{Actor, ActorRef, RpcReplyPort};
use shadowbrain_runtime::llm::cost::{Llm, LlmStats};
use shadowbrain_runtime::policy::{EvaluationMode, Policy};
use shadowbrain_runtime::{
    AuditEntry, Census, Chain, Condensed, Edge, Error, EvaluationReport, FeedbackReport,
    FeedbackTarget, Idempotency, Insights, Judge, KNOWLEDGE_SESSION, MAX_STRIKES, MemoryId,
    MemoryRecord, NewMemory, Outcome, Policies, PolicyErrors, Promotion, QuarantineEntry,
    RecallRequest, RecallResult, Recorded, Resolution, Result, SessionStats, Status, Substrate,
    SubstrateOptions, Summarizer, SweepReport, Timestamp, UpdateJudge, quarantined_error,
    validate_id,
};
use tokio::task::JoinHandle;

use crate::condenser::CondenserMessage;
use crate::decay::DecayMessage;
use crate::directory::Directory;
use crate::evaluator::EvaluatorMessage;
use crate::knowledge::KnowledgeMessage;
use crate::session::{
    Registry, SessionKey, SessionMessage, SessionSupervisorMessage, live_actor, read_registry,
};
use crate::supervisor::{RootArgs, RootMessage, RootSupervisor};

/// How to open a [`Runtime`].
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// The data directory (`store/`, `vectors/`, `keywords/` inside).
    pub data_dir: PathBuf,
    /// Backend, embedder, policy, clock and index tuning.
    pub substrate: SubstrateOptions,
    /// A session actor stops after this long without a request (its state is the store,
    /// so this only bounds memory). Default 5 minutes.
    pub session_idle: Duration,
    /// Whether session actors fire the policy's `max_age` condensation trigger on their
    /// idle ticks, which run on tokio's clock. Default true. A simulation on the virtual
    /// clock turns it off and condenses aged sessions itself, so that nothing a real-time
    /// timer does decides what happens to memories (see [`Runtime::settle`]).
    pub age_trigger: bool,
    /// Every request through the handle fails with [`Error::Timeout`] after this long.
    /// Default 30 seconds.
    pub call_timeout: Duration,
    /// How often the decay actor looks at the runtime clock to see whether the policy's
    /// `forgetting.interval` has passed; `None` sweeps only on
    /// [`Runtime::decay_now`] (exact replays). Default 1 second.
    pub decay_check: Option<Duration>,
    /// Pause between index passes of the Indexer actor (which replaces the substrate's
    /// indexer thread under the runtime). Default 50 ms.
    pub index_tick: Duration,
    /// The file the policy was read from, so [`Runtime::reload_policy`] can read it
    /// again; `None` when the policy was built in code. Set by
    /// [`RuntimeConfig::with_policy_file`].
    pub policy_file: Option<PathBuf>,
    /// The files of the namespaces with a policy of their own, read again with the default
    /// one by [`Runtime::reload_policy`]. Set by
    /// [`RuntimeConfig::with_namespace_policy_file`].
    pub namespace_policy_files: BTreeMap<String, PathBuf>,
    /// The judge of `[evaluation] mode = "llm"` / `"hybrid"`. Without one, records queued
    /// for judging keep the rules' score, and their audit log says why.
    pub judge: Option<Arc<dyn Judge>>,
    /// The judge of `[updates] mode = "llm"` / `"hybrid"`: the Evaluator asks it about
    /// the pairs detection finds, about once a second. Without one, those policies' pairs
    /// are decided by the rules, and the records' histories say why.
    pub update_judge: Option<Arc<dyn UpdateJudge>>,
    /// Records per judge request. Default 16.
    pub evaluation_batch: usize,
    /// Judge requests in flight at once: the evaluator hands the judge up to
    /// `evaluation_batch × evaluation_concurrency` records per call (a slow model is then
    /// asked about several batches together). Default 1.
    pub evaluation_concurrency: usize,
    /// How long a part-filled round waits for more records before the judge is asked
    /// anyway, so records trickling in share calls. Default 0 (ask at once).
    pub evaluation_wait: Duration,
    /// The writer of condensed text in `[condensation] mode = "llm"`. Without one (or
    /// when it fails), condensation is extractive and the audit log says why.
    pub summarizer: Option<Arc<dyn Summarizer>>,
    /// The model behind `judge` and `summarizer`, when they are LLM-backed: read only for
    /// its counters ([`Runtime::llm_stats`], the server's metrics).
    pub llm: Option<Arc<Llm>>,
}

/// An actor to make fail, for supervision tests ([`Runtime::inject_panic`]). Only with the
/// `failpoints` feature, which only tests turn on: fault injection is no part of the
/// product's API.
#[cfg(feature = "failpoints")]
#[derive(Debug, Clone)]
pub enum Fault {
    /// The actor of this (namespace, session).
    Session(String, String),
    /// The session supervisor.
    SessionSupervisor,
    /// The condenser.
    Condenser,
    /// The decay actor.
    Decay,
    /// The knowledge graph.
    Knowledge,
    /// The indexer.
    Indexer,
    /// The enricher.
    Enricher,
    /// The evaluator.
    Evaluator,
}

impl RuntimeConfig {
    /// Defaults for a data directory.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        RuntimeConfig {
            data_dir: data_dir.into(),
            substrate: SubstrateOptions::default(),
            session_idle: Duration::from_secs(300),
            age_trigger: true,
            call_timeout: Duration::from_secs(30),
            decay_check: Some(Duration::from_secs(1)),
            index_tick: Duration::from_millis(50),
            policy_file: None,
            namespace_policy_files: BTreeMap::new(),
            judge: None,
            update_judge: None,
            evaluation_batch: 16,
            evaluation_concurrency: 1,
            evaluation_wait: Duration::ZERO,
            summarizer: None,
            llm: None,
        }
    }

    /// Reads the policy from `path` (every error in the file, or none) and remembers the
    /// path for [`Runtime::reload_policy`].
    pub fn with_policy_file(mut self, path: impl Into<PathBuf>) -> Result<Self> {
        let path = path.into();
        self.substrate.policy = Policy::load(&path)?;
        self.policy_file = Some(path);
        Ok(self)
    }

    /// Reads every policy file again, all or nothing: the default policy (`None` without a
    /// default file) and each namespace's own, or every error of every file. Fails when
    /// there is no file to read. What [`Runtime::reload_policy`] makes active.
    pub fn read_policy_files(&self) -> Result<(Option<Policy>, BTreeMap<String, Policy>)> {
        if self.policy_file.is_none() && self.namespace_policy_files.is_empty() {
            return Err(Error::invalid(
                "policy",
                "the runtime was opened without a policy file, so there is nothing to \
                 reload; open it with `RuntimeConfig::with_policy_file` (or `--policy`)",
            ));
        }
        let mut issues = Vec::new();
        let policy = match &self.policy_file {
            Some(path) => Policy::load(path).map_err(|e| issues.extend(e.0)).ok(),
            None => None,
        };
        let mut namespaces = BTreeMap::new();
        for (namespace, path) in &self.namespace_policy_files {
            match Policy::load(path) {
                Ok(p) => {
                    namespaces.insert(namespace.clone(), p);
                }
                Err(e) => issues.extend(e.0),
            }
        }
        if !issues.is_empty() {
            return Err(PolicyErrors(issues).into());
        }
        Ok((policy, namespaces))
    }

    /// Gives `namespace` the policy in `path` (every error in the file, or none), instead
    /// of the default one; remembers the path for [`Runtime::reload_policy`].
    pub fn with_namespace_policy_file(
        mut self,
        namespace: &str,
        path: impl Into<PathBuf>,
    ) -> Result<Self> {
        validate_id("namespace", namespace)?;
        let path = path.into();
        let policy = Policy::load(&path)?;
        self.substrate
            .namespace_policies
            .insert(namespace.to_string(), policy);
        self.namespace_policy_files
            .insert(namespace.to_string(), path);
        Ok(self)
    }
}

/// The shadowbrain runtime: a substrate and the actors over it. Cheap to clone; every
/// clone talks to the same actors. Needs a tokio runtime.
#[derive(Clone)]
pub struct Runtime {
    inner: Arc<Inner>,
}

struct Inner {
    substrate: Substrate,
    root: ActorRef<RootMessage>,
    root_task: Mutex<Option<JoinHandle<()>>>,
    registry: Registry,
    directory: Directory,
    config: RuntimeConfig,
    /// Session messages sent and not yet answered: the depth of every session mailbox
    /// together (ractor does not expose a mailbox's length).
    in_flight: AtomicU64,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("data_dir", &self.inner.config.data_dir)
            .field("live_sessions", &read_registry(&self.inner.registry).len())
            .finish_non_exhaustive()
    }
}

/// A handle that does not keep a [`Runtime`] open: tells whether any clone of it is
/// still alive (what keeps a closed runtime's data directory from being opened again).
#[derive(Clone, Debug)]
pub struct WeakRuntime {
    runtime: std::sync::Weak<Inner>,
    substrate: shadowbrain_runtime::WeakSubstrate,
}

impl WeakRuntime {
    /// Clones of the runtime (or of its session handles) still alive.
    pub fn runtimes(&self) -> usize {
        self.runtime.strong_count()
    }

    /// Clones of its substrate still alive (actors, blocking work, threads), the runtime's
    /// own included.
    pub fn substrates(&self) -> usize {
        self.substrate.count()
    }
}

impl Runtime {
    /// A handle that tells whether this runtime is still held, without holding it.
    pub fn downgrade(&self) -> WeakRuntime {
        WeakRuntime {
            runtime: Arc::downgrade(&self.inner),
            substrate: self.inner.substrate.downgrade(),
        }
    }

    /// Opens the data directory and starts the supervision tree.
    pub async fn open(config: RuntimeConfig) -> Result<Runtime> {
        let (dir, mut opts) = (config.data_dir.clone(), config.substrate.clone());
        // Each background job has one owner: here the Indexer actor writes the indexes and
        // the Enricher actor embeds, not the substrate's threads.
        opts.indexing.background = false;
        // Opening reads the store and reconciles the indexes: blocking work.
        let substrate = tokio::task::spawn_blocking(move || Substrate::open(&dir, opts))
            .await
            .map_err(|e| Error::Unavailable {
                what: "the store".into(),
                message: format!("opening it panicked: {e}"),
            })??;
        if config.update_judge.is_some() {
            substrate.attach_update_judge();
        }
        let registry: Registry = Arc::new(RwLock::new(Default::default()));
        let directory = Directory::default();
        let args = RootArgs {
            substrate: substrate.clone(),
            registry: registry.clone(),
            directory: directory.clone(),
            session_idle: config.session_idle,
            age_trigger: config.age_trigger,
            decay_check: config.decay_check,
            index_tick: config.index_tick,
            judge: config.judge.clone(),
            update_judge: config.update_judge.clone(),
            evaluation_batch: config.evaluation_batch,
            evaluation_concurrency: config.evaluation_concurrency,
            evaluation_wait: config.evaluation_wait,
            summarizer: config.summarizer.clone(),
        };
        let (root, root_task) = Actor::spawn(None, RootSupervisor, args)
            .await
            .map_err(|e| Error::Unavailable {
                what: "the runtime".into(),
                message: format!("its supervisor could not start: {e}"),
            })?;
        Ok(Runtime {
            inner: Arc::new(Inner {
                substrate,
                root,
                root_task: Mutex::new(Some(root_task)),
                registry,
                directory,
                config,
                in_flight: AtomicU64::new(0),
            }),
        })
    }

    /// The substrate under the actors (store, indexes, policy, clock).
    pub fn substrate(&self) -> &Substrate {
        &self.inner.substrate
    }

    /// The LLM layer's counters (calls, retries, tokens, cache and reuse hits, budget
    /// refusals), when an LLM is configured.
    pub fn llm_stats(&self) -> Option<LlmStats> {
        self.inner.config.llm.as_ref().map(|llm| llm.stats())
    }

    /// Runs `read` on the substrate off the async workers (store and index reads are
    /// synchronous), bounded by the call timeout like every other call: for a door that
    /// shows what the store holds (the dashboard's listings and insights) without an actor
    /// in the way. `what` names the read in a timeout's error.
    pub async fn inspect<T: Send + 'static>(
        &self,
        what: &str,
        read: impl FnOnce(&Substrate) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        self.blocking(what, read).await
    }

    /// The LLM layer (model, token budget, counters), when an LLM is configured.
    pub fn llm(&self) -> Option<&Llm> {
        self.inner.config.llm.as_deref()
    }

    /// A handle on one session of a namespace. The session needs no creating: its actor
    /// starts on the first request. Ids are 1–128 characters of `A-Z a-z 0-9 _ . : -`.
    pub fn session(&self, namespace: &str, session: &str) -> Result<SessionHandle> {
        validate_id("namespace", namespace)?;
        validate_id("session_id", session)?;
        Ok(SessionHandle {
            runtime: self.clone(),
            key: SessionKey {
                namespace: namespace.to_string(),
                session: session.to_string(),
            },
        })
    }

    /// Session messages sent and not yet answered, over every session: the runtime's
    /// mailbox depth.
    pub fn session_calls_in_flight(&self) -> u64 {
        self.inner.in_flight.load(Ordering::Relaxed)
    }

    /// Session actors alive now (idle ones stop by themselves).
    pub async fn live_sessions(&self) -> Result<usize> {
        let sessions = self.inner.directory.sessions()?;
        let what = "the session supervisor";
        self.answer(
            what,
            sessions
                .call(
                    |reply| SessionSupervisorMessage::Stats { reply },
                    self.timeout(),
                )
                .await,
        )
        .map(|(live, _)| live)
    }

    /// How many times a supervisor restarted a child since start.
    pub async fn restarts(&self) -> Result<u64> {
        let what = "the root supervisor";
        let root = &self.inner.root;
        self.answer(
            what,
            root.call(|reply| RootMessage::Restarts { reply }, self.timeout())
                .await,
        )
    }

    /// Stops every actor after it has finished what its mailbox holds (session actors
    /// first, the indexer last), then flushes the indexes and closes the store. Later calls
    /// on any clone fail with [`Error::Unavailable`] or [`Error::Closed`]. The data
    /// directory can be opened again once every clone of the runtime and of its session
    /// handles is dropped (another process can open it as soon as this one exits).
    pub async fn shutdown(&self) -> Result<()> {
        let task = self
            .inner
            .root_task
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(task) = task {
            let timeout = self.inner.config.call_timeout;
            let drained = self
                .inner
                .root
                .call(|reply| RootMessage::Drain { timeout, reply }, None)
                .await;
            if !matches!(drained, Ok(CallResult::Success(()))) {
                tracing::warn!("the actors did not drain; stopping them");
            }
            self.inner.root.stop(Some("shutdown".into()));
            let _ = tokio::time::timeout(timeout, task).await;
        }
        let substrate = self.inner.substrate.clone();
        tokio::task::spawn_blocking(move || substrate.close())
            .await
            .map_err(|e| Error::Unavailable {
                what: "the store".into(),
                message: format!("closing it panicked: {e}"),
            })?
    }

    /// A namespace's knowledge pool: search, graph queries, links, promotion.
    pub fn knowledge(&self, namespace: &str) -> Result<KnowledgeHandle> {
        validate_id("namespace", namespace)?;
        Ok(KnowledgeHandle {
            runtime: self.clone(),
            namespace: namespace.to_string(),
        })
    }

    /// One record of a namespace: read it, change its status, archive it, read its audit
    /// log. Another namespace's ids are not found.
    pub fn memory(&self, namespace: &str, id: MemoryId) -> Result<MemoryHandle> {
        validate_id("namespace", namespace)?;
        Ok(MemoryHandle {
            runtime: self.clone(),
            namespace: namespace.to_string(),
            id,
        })
    }

    /// Every session of a namespace that has records (live actor or not), by session id.
    pub async fn sessions(&self, namespace: &str) -> Result<Vec<SessionStats>> {
        validate_id("namespace", namespace)?;
        // In a cluster placed by session, the other partitions' sessions too.
        self.inner.substrate.sessions(namespace).await
    }

    /// [`Insights`] on `namespace` as of `now`, at most `limit` entries per list (in a
    /// cluster placed by session, gathered from every partition), bounded by the call
    /// timeout.
    pub async fn insights(
        &self,
        namespace: &str,
        now: Timestamp,
        limit: usize,
    ) -> Result<Insights> {
        validate_id("namespace", namespace)?;
        let work = self.inner.substrate.insights(namespace, now, limit);
        self.within("the insights", work).await
    }

    /// `namespace`'s records by tier and status and its sessions with records (in a
    /// cluster placed by session, over every partition), bounded by the call timeout.
    pub async fn census(&self, namespace: &str) -> Result<Census> {
        validate_id("namespace", namespace)?;
        let work = self.inner.substrate.census(namespace);
        self.within("the census", work).await
    }

    /// The active policy of the namespaces without one of their own.
    pub fn policy(&self) -> Arc<Policy> {
        self.inner.substrate.policy()
    }

    /// The policy in force for `namespace`.
    pub fn policy_for(&self, namespace: &str) -> Arc<Policy> {
        self.inner.substrate.policy_for(namespace)
    }

    /// Every active policy: the default and the namespaces' own.
    pub fn policies(&self) -> Arc<Policies> {
        self.inner.substrate.policies()
    }

    /// Reads the policy files again (the default one and every namespace's) and makes them
    /// the active policies; decisions from now on carry their names and hashes. All or
    /// nothing: when any file has errors nothing changes, and the error lists every
    /// error of every file. Fails when the runtime was opened without policy files.
    pub async fn reload_policy(&self) -> Result<Arc<Policies>> {
        // The default policy stays when it was built in code (no file): only the
        // namespaces' files are read again.
        let current = self.policy();
        let config = self.inner.config.clone();
        let (policy, namespaces) = self
            .blocking("the policy files", move |_| config.read_policy_files())
            .await?;
        let policy = policy.unwrap_or_else(|| Policy::clone(&current));
        self.inner.substrate.set_policies(policy, namespaces);
        // The active policies, with the defaults that follow the embedder filled in.
        let active = self.policies();
        for (namespace, p) in std::iter::once(("*", &active.default)).chain(
            active
                .namespaces
                .iter()
                .map(|(namespace, p)| (namespace.as_str(), p)),
        ) {
            tracing::info!(namespace, name = %p.name, hash = %p.hash, "policy reloaded");
        }
        Ok(active)
    }

    /// Records and inputs set aside because processing them kept failing (all namespaces
    /// when `namespace` is `None`).
    pub async fn quarantined(&self, namespace: Option<&str>) -> Result<Vec<QuarantineEntry>> {
        let namespace = namespace.map(str::to_string);
        self.blocking("the quarantine", move |s| {
            s.quarantined(namespace.as_deref())
        })
        .await
    }

    /// Has the evaluator judge everything queued now, and answers its totals since it
    /// (re)started.
    pub async fn evaluate_now(&self) -> Result<EvaluationReport> {
        let evaluator = self.inner.directory.evaluator()?;
        let outcome = evaluator
            .call(|reply| EvaluatorMessage::Drain { reply }, self.timeout())
            .await;
        self.answer("the evaluator", outcome)?
    }

    /// Waits until the work already sent to the background actors is done: the condenser's
    /// triggered condensations, then the promotions they and feedback offered to the
    /// knowledge graph (and, outside `rules` mode, the evaluator's queue; under an
    /// `[updates]` policy, the comparisons of every record already embedded). Writes send
    /// their triggers before they answer, so after `settle` everything caused by the
    /// answered requests has happened — what a simulation needs to run the same twice.
    pub async fn settle(&self) -> Result<()> {
        let condenser = self.inner.directory.condenser()?;
        let outcome = condenser
            .call(|reply| CondenserMessage::Sync { reply }, self.timeout())
            .await;
        self.answer("the condenser", outcome)?;
        if self.policies().all().any(|p| p.updates.on()) {
            match self.inner.config.update_judge.clone() {
                Some(judge) => {
                    let substrate = self.inner.substrate.clone();
                    self.within("update detection", async move {
                        substrate.detect_all_updates_with(judge.as_ref()).await
                    })
                    .await?;
                }
                None => {
                    self.blocking("update detection", |s| s.detect_all_updates())
                        .await?;
                }
            }
        }
        let knowledge = self.inner.directory.knowledge()?;
        let outcome = knowledge
            .call(|reply| KnowledgeMessage::Sync { reply }, self.timeout())
            .await;
        self.answer("the knowledge graph", outcome)?;
        if self
            .policies()
            .all()
            .any(|p| p.evaluation.mode != EvaluationMode::Rules)
        {
            self.evaluate_now().await?;
        }
        Ok(())
    }

    /// Runs a decay sweep now, at the runtime clock's time, whatever the policy interval
    /// says (simulations call this at fixed virtual times for exact replays).
    pub async fn decay_now(&self) -> Result<SweepReport> {
        let decay = self.inner.directory.decay()?;
        let outcome = decay
            .call(|reply| DecayMessage::SweepNow { reply }, self.timeout())
            .await;
        self.answer("the decay actor", outcome)?
    }

    /// Fault injection for supervision tests: makes an actor panic (the `failpoints`
    /// feature).
    #[cfg(feature = "failpoints")]
    pub async fn inject_panic(&self, fault: Fault) -> Result<()> {
        use crate::supervisor::Child;
        let child = match fault {
            Fault::Session(namespace, session) => {
                let key = SessionKey { namespace, session };
                let actor = self.session_actor(&key, false).await?;
                let _ = actor.send_message(SessionMessage::Panic);
                return Ok(());
            }
            Fault::SessionSupervisor => Child::Sessions,
            Fault::Condenser => Child::Condenser,
            Fault::Decay => Child::Decay,
            Fault::Knowledge => Child::Knowledge,
            Fault::Indexer => Child::Indexer,
            Fault::Enricher => Child::Enricher,
            Fault::Evaluator => Child::Evaluator,
        };
        let _ = self.inner.root.send_message(RootMessage::Panic(child));
        Ok(())
    }

    fn timeout(&self) -> Option<Duration> {
        Some(self.inner.config.call_timeout)
    }

    /// Runs blocking store work off the async workers, within the call timeout.
    async fn blocking<T: Send + 'static>(
        &self,
        what: &str,
        work: impl FnOnce(&Substrate) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let substrate = self.inner.substrate.clone();
        let task = tokio::task::spawn_blocking(move || work(&substrate));
        self.within(what, async {
            task.await.unwrap_or_else(|e| {
                Err(Error::Panicked {
                    what: what.to_string(),
                    message: e.to_string(),
                })
            })
        })
        .await
    }

    /// Awaits `work` for at most the call timeout.
    async fn within<T>(&self, what: &str, work: impl Future<Output = Result<T>>) -> Result<T> {
        tokio::time::timeout(self.inner.config.call_timeout, work)
            .await
            .unwrap_or_else(|_| Err(self.timed_out(what)))
    }

    /// The error of a call that took longer than the call timeout.
    fn timed_out(&self, what: &str) -> Error {
        Error::Timeout {
            what: what.to_string(),
            after_ms: self.inner.config.call_timeout.as_millis() as u64,
        }
    }

    /// Maps a call's outcome to the runtime's errors.
    fn answer<T, E: std::fmt::Display>(
        &self,
        what: &str,
        outcome: std::result::Result<CallResult<T>, E>,
    ) -> Result<T> {
        match outcome {
            Ok(CallResult::Success(value)) => Ok(value),
            Ok(CallResult::Timeout) => Err(self.timed_out(what)),
            Ok(CallResult::SenderError) => Err(Error::Unavailable {
                what: what.to_string(),
                message: "it stopped before answering".into(),
            }),
            Err(e) => Err(Error::Unavailable {
                what: what.to_string(),
                message: e.to_string(),
            }),
        }
    }

    /// The live actor of a session: from the registry without a hop when it is there (and
    /// `fresh` is false), else from the session supervisor, which spawns it.
    async fn session_actor(
        &self,
        key: &SessionKey,
        fresh: bool,
    ) -> Result<ActorRef<SessionMessage>> {
        if let Some(actor) = (!fresh)
            .then(|| live_actor(&self.inner.registry, key))
            .flatten()
        {
            return Ok(actor);
        }
        let sessions = self.inner.directory.sessions()?;
        let outcome = sessions
            .call(
                |reply| SessionSupervisorMessage::Get {
                    key: key.clone(),
                    reply,
                },
                self.timeout(),
            )
            .await;
        self.answer("the session supervisor", outcome)?
    }

    /// Sends a request to a session's actor. If the actor stopped before taking it (idle
    /// passivation racing the request, or a restart), the request is sent once more to a
    /// fresh actor: a request that never reached a handler has had no effect.
    async fn call_session<T: Send + 'static>(
        &self,
        key: &SessionKey,
        request: impl Fn(RpcReplyPort<Result<T>>) -> SessionMessage,
    ) -> Result<T> {
        let what = key.describe();
        let _queued = InFlight::enter(&self.inner.in_flight);
        let mut last = None;
        for attempt in 0..2 {
            let actor = self.session_actor(key, attempt > 0).await?;
            match self.answer(&what, actor.call(&request, self.timeout()).await) {
                Ok(answer) => return answer,
                // Only a request that never reached a handler is safe to send again.
                Err(e @ Error::Unavailable { .. }) => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| Error::Unavailable {
            what,
            message: "no session actor could be reached".into(),
        }))
    }
}

/// Counts one message in flight until dropped (answered, failed or cancelled alike).
struct InFlight<'a>(&'a AtomicU64);

impl<'a> InFlight<'a> {
    fn enter(counter: &'a AtomicU64) -> Self {
        counter.fetch_add(1, Ordering::Relaxed);
        InFlight(counter)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One session of one namespace, as seen by an agent. Cheap to clone.
#[derive(Clone)]
pub struct SessionHandle {
    runtime: Runtime,
    key: SessionKey,
}

impl std::fmt::Debug for SessionHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionHandle")
            .field("namespace", &self.key.namespace)
            .field("session", &self.key.session)
            .finish()
    }
}

impl SessionHandle {
    /// The session id.
    pub fn id(&self) -> &str {
        &self.key.session
    }

    /// The namespace.
    pub fn namespace(&self) -> &str {
        &self.key.namespace
    }

    /// Records one event; returns its id once it is durable.
    pub async fn record(&self, event: NewMemory) -> Result<MemoryId> {
        let ids = self.record_batch(vec![event]).await?;
        ids.into_iter().next().ok_or_else(|| Error::Unavailable {
            what: self.key.describe(),
            message: "the write returned no id".into(),
        })
    }

    /// Records events in order; returns their ids, in the same order, once all are durable.
    /// Invalid input rejects the whole batch with an error naming the event and the field.
    ///
    /// Input that makes the session actor fail (panic) is tried again on a fresh actor, up
    /// to `MAX_STRIKES` times; then it is quarantined — kept, with the error, under an id
    /// of its own — and the call fails with [`Error::Quarantined`] naming that id.
    pub async fn record_batch(&self, events: Vec<NewMemory>) -> Result<Vec<MemoryId>> {
        Ok(self.record_idempotent(events, None).await?.ids)
    }

    /// [`SessionHandle::record_batch`] with an optional idempotency key (see
    /// [`shadowbrain_runtime::Substrate::record_once`]): a retry of a write already made
    /// answers that write's ids, marked `replayed`, and stores nothing.
    pub async fn record_idempotent(
        &self,
        events: Vec<NewMemory>,
        idempotency: Option<Idempotency>,
    ) -> Result<Recorded> {
        let mut strikes = 0;
        loop {
            let outcome = self
                .runtime
                .call_session(&self.key, |reply| SessionMessage::Record {
                    events: events.clone(),
                    idempotency: idempotency.clone(),
                    reply,
                })
                .await;
            match outcome {
                Err(Error::Panicked { message, .. }) => {
                    strikes += 1;
                    if strikes < MAX_STRIKES {
                        continue;
                    }
                    let input = serde_json::to_string(&events).unwrap_or_default();
                    let entry = self
                        .runtime
                        .substrate()
                        .quarantine_input(
                            &self.key.namespace,
                            &self.key.session,
                            "session actor",
                            &message,
                            strikes,
                            input,
                        )
                        .await?;
                    return Err(quarantined_error(&entry));
                }
                other => return other,
            }
        }
    }

    /// What this session should remember about `query`: session scope, the policy's
    /// defaults (k = 10, knowledge included).
    pub async fn recall(&self, query: &str) -> Result<RecallResult> {
        let request = RecallRequest::new(&self.key.namespace, &self.key.session, query);
        self.recall_with(request).await
    }

    /// A recall with every option. Its namespace and session are this handle's, whatever
    /// the request says: a session only asks as itself.
    pub async fn recall_with(&self, mut request: RecallRequest) -> Result<RecallResult> {
        request.namespace = self.key.namespace.clone();
        request.session_id = self.key.session.clone();
        let request = Box::new(request);
        self.runtime
            .call_session(&self.key, |reply| SessionMessage::Recall {
                request: request.clone(),
                reply,
            })
            .await
    }

    /// Records how using memories went — every memory of a recall (its `recall_id`), or
    /// the memories named — and offers what the promotion policy now admits to the
    /// knowledge graph.
    pub async fn feedback(
        &self,
        target: FeedbackTarget,
        outcome: Outcome,
    ) -> Result<FeedbackReport> {
        self.runtime
            .call_session(&self.key, |reply| SessionMessage::Feedback {
                target: target.clone(),
                outcome,
                reply,
            })
            .await
    }

    /// Condenses the session's uncondensed events now (at least the policy's
    /// `min_events`), whatever the trigger says; `None` when there are too few.
    pub async fn condense(&self) -> Result<Option<Condensed>> {
        let condenser = self.runtime.inner.directory.condenser()?;
        let outcome = condenser
            .call(
                |reply| CondenserMessage::Condense {
                    key: self.key.clone(),
                    reply: Some(reply),
                },
                self.runtime.timeout(),
            )
            .await;
        self.runtime.answer("the condenser", outcome)?
    }

    /// Asks the condenser to condense the session's recent window and returns at once: for
    /// a caller that must not wait for an LLM summarizer (MCP's `condense`). The condensed
    /// record appears in the timeline when it is written.
    pub fn condense_in_background(&self) -> Result<()> {
        self.runtime.inner.directory.condense_later(&self.key)
    }

    /// The session's newest `limit` records, newest first.
    pub async fn timeline(&self, limit: usize) -> Result<Vec<MemoryRecord>> {
        self.timeline_before(limit, None).await
    }

    /// [`SessionHandle::timeline`] from a cursor: the `limit` records older than `before`
    /// (a record of this session: the last one of the previous page), newest first.
    pub async fn timeline_before(
        &self,
        limit: usize,
        before: Option<MemoryId>,
    ) -> Result<Vec<MemoryRecord>> {
        self.runtime
            .call_session(&self.key, |reply| SessionMessage::Timeline {
                limit,
                before,
                reply,
            })
            .await
    }
}

/// One record of a namespace ([`Runtime::memory`]). Cheap to clone.
#[derive(Clone)]
pub struct MemoryHandle {
    runtime: Runtime,
    namespace: String,
    id: MemoryId,
}

impl std::fmt::Debug for MemoryHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryHandle")
            .field("namespace", &self.namespace)
            .field("id", &self.id)
            .finish()
    }
}

impl MemoryHandle {
    /// The record's id.
    pub fn id(&self) -> MemoryId {
        self.id
    }

    /// The record, with every field, its status, strength, utility and sources.
    pub async fn get(&self) -> Result<MemoryRecord> {
        let (namespace, id) = (self.namespace.clone(), self.id);
        self.runtime
            .blocking("the memory", move |s| s.get(&namespace, id))
            .await
    }

    /// Sets its status (`active`, `pinned`, `obsolete`, `archived`, `wrong`), audited as
    /// done by `by`; answers the record as it is now.
    pub async fn set_status(&self, status: Status, by: &str) -> Result<MemoryRecord> {
        self.set_status_because(status, None, by).await
    }

    /// [`MemoryHandle::set_status`] with the reason given, kept in its history (see
    /// [`shadowbrain_runtime::Substrate::set_status_because`]: `wrong` also counts a
    /// failure).
    pub async fn set_status_because(
        &self,
        status: Status,
        reason: Option<String>,
        by: &str,
    ) -> Result<MemoryRecord> {
        let (namespace, id, by) = (self.namespace.clone(), self.id, by.to_string());
        self.runtime
            .blocking("the memory", move |s| {
                s.set_status_because(&namespace, id, status, reason.as_deref(), &by)
            })
            .await
    }

    /// Its validity and its place among the values of its fact (see
    /// [`shadowbrain_runtime::Substrate::chain`]).
    pub async fn chain(&self) -> Result<Chain> {
        let (namespace, id) = (self.namespace.clone(), self.id);
        self.runtime
            .blocking("the memory's chain", move |s| s.chain(&namespace, id))
            .await
    }

    /// Settles a conflict or undoes a supersession by hand, audited as done by `by` (see
    /// [`shadowbrain_runtime::Substrate::resolve`]); answers the chain as it is now.
    pub async fn resolve(
        &self,
        resolution: Resolution,
        reason: Option<String>,
        by: &str,
    ) -> Result<Chain> {
        let (namespace, id, by) = (self.namespace.clone(), self.id, by.to_string());
        self.runtime
            .blocking("the memory", move |s| {
                s.resolve(&namespace, id, resolution, reason.as_deref(), &by)
            })
            .await
    }

    /// Archives it (soft delete: never recalled, recoverable until purged).
    pub async fn archive(&self, by: &str) -> Result<MemoryRecord> {
        self.set_status(Status::Archived, by).await
    }

    /// Its audit log, oldest first (kept after a purge).
    pub async fn history(&self) -> Result<Vec<AuditEntry>> {
        let (namespace, id) = (self.namespace.clone(), self.id);
        self.runtime
            .blocking("the memory's history", move |s| s.history(&namespace, id))
            .await
    }
}

/// A namespace's knowledge pool, as seen by an agent. Cheap to clone.
#[derive(Clone)]
pub struct KnowledgeHandle {
    runtime: Runtime,
    namespace: String,
}

impl std::fmt::Debug for KnowledgeHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KnowledgeHandle")
            .field("namespace", &self.namespace)
            .finish()
    }
}

impl KnowledgeHandle {
    /// Recall over the knowledge tier only (like a session's recall, ranked by the same
    /// policy).
    pub async fn search(&self, query: &str, k: usize) -> Result<RecallResult> {
        // The knowledge session holds only knowledge records, so a recall asked as that
        // session, with the knowledge path on, sees the knowledge tier and nothing else.
        let mut request = RecallRequest::new(&self.namespace, KNOWLEDGE_SESSION, query);
        request.k = k;
        request.include_knowledge = true;
        let what = format!("the knowledge search of namespace `{}`", self.namespace);
        self.runtime
            .within(&what, self.runtime.substrate().recall(&request))
            .await
    }

    /// The records within `depth` edges of `around`, and the edges among them.
    pub async fn graph(
        &self,
        around: MemoryId,
        depth: usize,
    ) -> Result<(Vec<MemoryId>, Vec<Edge>)> {
        let kg = self.runtime.inner.directory.knowledge()?;
        let outcome = kg
            .call(
                |reply| KnowledgeMessage::Neighbourhood {
                    namespace: self.namespace.clone(),
                    around,
                    depth,
                    reply,
                },
                self.runtime.timeout(),
            )
            .await;
        self.runtime.answer("the knowledge graph", outcome)?
    }

    /// Adds an edge between two records of the namespace.
    pub async fn link(&self, edge: Edge) -> Result<()> {
        let kg = self.runtime.inner.directory.knowledge()?;
        let outcome = kg
            .call(
                |reply| KnowledgeMessage::Link {
                    namespace: self.namespace.clone(),
                    edge,
                    reply,
                },
                self.runtime.timeout(),
            )
            .await;
        self.runtime.answer("the knowledge graph", outcome)?
    }

    /// Promotes condensed records now (each admitted by the policy, merged, queued until
    /// its embedding is stored, or refused with the reason).
    pub async fn promote(&self, ids: Vec<MemoryId>) -> Result<Vec<Promotion>> {
        let kg = self.runtime.inner.directory.knowledge()?;
        let outcome = kg
            .call(
                |reply| KnowledgeMessage::Promote {
                    namespace: self.namespace.clone(),
                    ids: ids.clone(),
                    reply,
                },
                self.runtime.timeout(),
            )
            .await;
        self.runtime.answer("the knowledge graph", outcome)?
    }
}
