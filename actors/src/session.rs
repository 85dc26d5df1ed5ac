//! The per-session actors and their supervisor.
//!
//! A [`SessionActor`] owns one session's write order: every record, recall and timeline
//! request for the session goes through its mailbox, so events are written in the order
//! they arrived and a recall sees every write acknowledged before it. It keeps nothing the
//! store does not have — the store is the session's state — so stopping it loses nothing:
//! it stops itself after [`SessionArgs::idle`] without a message (passivation), and the
//! next request spawns a fresh one.
//!
//! The [`SessionSupervisor`] spawns session actors on first use, keeps the registry that
//! the `Runtime` handle reads to reach a live actor without a hop through the supervisor,
//! and drops an actor from the registry as soon as it stops or fails. A failed session actor
//! is not restarted eagerly: the next request for the session spawns a new one, which is the
//! same recovery with no idle actor kept around.
//!
//! It also tells the Condenser when the policy's trigger fires: it counts the session's
//! uncondensed events (read from the store when it starts, then kept up to date) and checks
//! `every_events` after each write and `max_age` on its idle ticks. An idle session that
//! stops with a backlog below the trigger is condensed after its next write.
//!
//! A panic while writing (a poison input: say, an embedder plugin that crashes on some
//! text) is caught: the caller gets [`Error::Panicked`], the actor takes itself out of the
//! registry and fails, and the next request starts a fresh one. Nothing was written, so
//! the handle may send the input again; after `MAX_STRIKES` failures it quarantines it
//! (see `SessionHandle::record_batch`).
//!
//! Idle time is measured on tokio's clock, not the runtime clock: passivation manages
//! memory in this process, it decides nothing about memories (a simulation on the virtual
//! clock still wants idle actors gone in real time).

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::FutureExt;
use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use shadowbrain_runtime::policy::EvaluationMode;
use shadowbrain_runtime::{
    Error, FeedbackReport, FeedbackTarget, Idempotency, MemoryId, MemoryRecord, NewMemory, Outcome,
    RecallRequest, RecallResult, Recorded, Result, Substrate, Timestamp, panic_message,
};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::directory::Directory;
use crate::knowledge::KnowledgeMessage;

/// A session's identity: sessions of different namespaces never share an actor.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct SessionKey {
    pub namespace: String,
    pub session: String,
}

impl SessionKey {
    pub fn describe(&self) -> String {
        format!(
            "session `{}` of namespace `{}`",
            self.session, self.namespace
        )
    }
}

/// Live session actors by session, shared with the `Runtime` handle.
pub(crate) type Registry = Arc<RwLock<HashMap<SessionKey, ActorRef<SessionMessage>>>>;

/// The actor of one live session (see the module docs).
pub(crate) struct SessionActor;

/// What a session actor is started with.
pub(crate) struct SessionArgs {
    pub substrate: Substrate,
    pub key: SessionKey,
    /// Stop after this long without a request.
    pub idle: Duration,
    /// Whether idle ticks fire the `max_age` condensation trigger (see
    /// `RuntimeConfig::age_trigger`).
    pub age_trigger: bool,
    /// Where the condenser is.
    pub directory: Directory,
    /// The live actors, to leave at once when it fails.
    pub registry: Registry,
}

/// A session actor's state.
pub(crate) struct SessionState {
    args: SessionArgs,
    last_active: Instant,
    idle_ticker: Option<JoinHandle<()>>,
    /// Uncondensed episodic events, and when the oldest was written (runtime clock).
    backlog: (u64, Option<Timestamp>),
}

impl SessionState {
    /// Tells the condenser if the policy's trigger fires, and starts a new count.
    fn condense_if_due(&mut self) {
        let substrate = &self.args.substrate;
        let (events, oldest) = self.backlog;
        if !substrate
            .policy_for(&self.args.key.namespace)
            .condensation_due(events, oldest, substrate.clock().now())
        {
            return;
        }
        match self.args.directory.condense_later(&self.args.key) {
            Ok(()) => self.backlog = (0, None),
            // Kept: the next write or tick asks again.
            Err(e) => tracing::warn!(error = %e, "condensation trigger not delivered"),
        }
    }
}

/// The protocol of a session actor.
pub(crate) enum SessionMessage {
    /// Validate and durably write events, in order; answers with their ids after the
    /// flush. With an idempotency key, a retry of a write already made answers its ids
    /// (one write at a time per session is what makes concurrent retries safe).
    Record {
        events: Vec<NewMemory>,
        idempotency: Option<Idempotency>,
        reply: RpcReplyPort<Result<Recorded>>,
    },
    /// Answer a recall whose asking session is this one.
    Recall {
        request: Box<RecallRequest>,
        reply: RpcReplyPort<Result<RecallResult>>,
    },
    /// The session's newest records, newest first; with `before`, those older than that
    /// record of the session (the next page).
    Timeline {
        limit: usize,
        before: Option<MemoryId>,
        reply: RpcReplyPort<Result<Vec<MemoryRecord>>>,
    },
    /// How using some memories went; answers what changed. Candidates the promotion
    /// policy now admits are offered to the knowledge graph.
    Feedback {
        target: FeedbackTarget,
        outcome: Outcome,
        reply: RpcReplyPort<Result<FeedbackReport>>,
    },
    /// Sent by the actor's own ticker: stop if idle for long enough.
    IdleCheck,
    /// Fault injection for supervision tests: the handler panics.
    #[cfg(feature = "failpoints")]
    Panic,
}

impl Actor for SessionActor {
    type Msg = SessionMessage;
    type State = SessionState;
    type Arguments = SessionArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: SessionArgs,
    ) -> std::result::Result<SessionState, ActorProcessingErr> {
        // Check a few times per idle period, so an idle actor lives at most 1.25 × idle.
        let period = (args.idle / 4).max(Duration::from_millis(10));
        let backlog = args
            .substrate
            .condensation_backlog(&args.key.namespace, &args.key.session)?;
        let ticker = myself.send_interval(period, || SessionMessage::IdleCheck);
        Ok(SessionState {
            args,
            last_active: Instant::now(),
            idle_ticker: Some(ticker),
            backlog,
        })
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut SessionState,
    ) -> std::result::Result<(), ActorProcessingErr> {
        if let Some(ticker) = state.idle_ticker.take() {
            ticker.abort();
        }
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: SessionMessage,
        state: &mut SessionState,
    ) -> std::result::Result<(), ActorProcessingErr> {
        let key = &state.args.key;
        let substrate = &state.args.substrate;
        match message {
            SessionMessage::Record {
                events,
                idempotency,
                reply,
            } => {
                state.last_active = Instant::now();
                let write = substrate.record_once(
                    &key.namespace,
                    &key.session,
                    events,
                    idempotency.as_ref(),
                );
                let result = match AssertUnwindSafe(write).catch_unwind().await {
                    Ok(result) => result,
                    Err(payload) => {
                        // Leave the registry before answering, so a retry reaches a fresh
                        // actor and not this failing one.
                        let message = panic_message(payload.as_ref());
                        {
                            let mut registry = write_registry(&state.args.registry);
                            if registry
                                .get(key)
                                .is_some_and(|a| a.get_id() == myself.get_id())
                            {
                                registry.remove(key);
                            }
                        }
                        let _ = reply.send(Err(Error::Panicked {
                            what: key.describe(),
                            message: message.clone(),
                        }));
                        return Err(
                            format!("writing to {} panicked: {message}", key.describe()).into()
                        );
                    }
                };
                let written = match &result {
                    Ok(r) if !r.replayed => r.ids.len() as u64,
                    _ => 0,
                };
                let now = substrate.clock().now();
                // Triggers go out before the answer, so a caller that has its answer and
                // then waits on the condenser (`Runtime::settle`) waits for this one too.
                if written > 0 {
                    state.backlog.0 += written;
                    state.backlog.1.get_or_insert(now);
                    let judged = substrate.policy_for(&key.namespace).evaluation.mode
                        != EvaluationMode::Rules;
                    state.condense_if_due();
                    if judged {
                        // The records are on the evaluation queue already; a lost wake-up
                        // only delays them until the evaluator's next tick.
                        state.args.directory.wake_evaluator();
                    }
                }
                // The caller may have timed out and gone; the write stands either way.
                let _ = reply.send(result);
            }
            SessionMessage::Recall { request, reply } => {
                state.last_active = Instant::now();
                let _ = reply.send(substrate.recall(&request).await);
            }
            SessionMessage::Timeline {
                limit,
                before,
                reply,
            } => {
                state.last_active = Instant::now();
                let store = substrate.store();
                let result = match before {
                    None => Ok(None),
                    // The cursor is a record of this session: its place in the listing.
                    Some(id) => match store.get_light(id) {
                        Ok(Some(r))
                            if r.namespace == key.namespace && r.session_id == key.session =>
                        {
                            Ok(Some((r.event_time, id)))
                        }
                        Ok(_) => Err(Error::Invalid {
                            field: "before".into(),
                            reason: format!(
                                "`{id}` is not a record of session `{}`; pass the id of the last \
                                 record of the previous page",
                                key.session
                            ),
                        }),
                        Err(e) => Err(e),
                    },
                }
                .and_then(|before| store.timeline(&key.namespace, &key.session, before, limit));
                let _ = reply.send(result);
            }
            SessionMessage::Feedback {
                target,
                outcome,
                reply,
            } => {
                state.last_active = Instant::now();
                let result = substrate
                    .feedback(&key.namespace, &target, outcome, &key.session)
                    .await;
                if let Ok(report) = &result
                    && !report.promotable.is_empty()
                {
                    // They are on the store's promotion queue already (the feedback's
                    // commit put them there): a wake-up that does not arrive loses nothing,
                    // the knowledge actor's next start or wake-up takes them.
                    let offer = state
                        .args
                        .directory
                        .knowledge()
                        .map(|kg| kg.send_message(KnowledgeMessage::Drain));
                    if !matches!(offer, Ok(Ok(()))) {
                        tracing::warn!(
                            "could not wake the knowledge graph; the promotable memories stay queued"
                        );
                    }
                }
                let _ = reply.send(result);
            }
            SessionMessage::IdleCheck => {
                if state.args.age_trigger {
                    state.condense_if_due();
                }
                if state.last_active.elapsed() >= state.args.idle {
                    let key = &state.args.key;
                    tracing::debug!(session = %key.session, namespace = %key.namespace, "session actor idle, stopping");
                    myself.stop(Some("idle".into()));
                }
            }
            #[cfg(feature = "failpoints")]
            SessionMessage::Panic => panic!("fault injected into {}", key.describe()),
        }
        Ok(())
    }
}

/// Spawns, finds and forgets session actors (see the module docs).
pub(crate) struct SessionSupervisor;

/// What the session supervisor is started with.
pub(crate) struct SessionSupervisorArgs {
    pub substrate: Substrate,
    pub registry: Registry,
    pub directory: Directory,
    pub idle: Duration,
    pub age_trigger: bool,
}

/// The session supervisor's state.
pub(crate) struct SessionSupervisorState {
    args: SessionSupervisorArgs,
    /// The session of each live child, to forget it when it stops.
    children: HashMap<ActorId, SessionKey>,
    /// Children that failed (panicked) since start; reported in the metrics later.
    failures: u64,
}

/// The protocol of the session supervisor.
pub(crate) enum SessionSupervisorMessage {
    /// The live actor of a session, spawned if there is none (or only a stopping one).
    Get {
        key: SessionKey,
        reply: RpcReplyPort<Result<ActorRef<SessionMessage>>>,
    },
    /// How many session actors are live, and how many failed since start.
    Stats { reply: RpcReplyPort<(usize, u64)> },
    /// Fault injection for supervision tests: the handler panics.
    #[cfg(feature = "failpoints")]
    Panic,
}

impl Actor for SessionSupervisor {
    type Msg = SessionSupervisorMessage;
    type State = SessionSupervisorState;
    type Arguments = SessionSupervisorArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: SessionSupervisorArgs,
    ) -> std::result::Result<SessionSupervisorState, ActorProcessingErr> {
        // A restarted supervisor starts with no children: whatever the registry still
        // names belonged to its predecessor, whose children died with it.
        write_registry(&args.registry).clear();
        Ok(SessionSupervisorState {
            args,
            children: HashMap::new(),
            failures: 0,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: SessionSupervisorMessage,
        state: &mut SessionSupervisorState,
    ) -> std::result::Result<(), ActorProcessingErr> {
        match message {
            SessionSupervisorMessage::Get { key, reply } => {
                let _ = reply.send(state.get_or_spawn(&myself, key).await);
            }
            SessionSupervisorMessage::Stats { reply } => {
                let _ = reply.send((state.children.len(), state.failures));
            }
            #[cfg(feature = "failpoints")]
            SessionSupervisorMessage::Panic => panic!("fault injected into the session supervisor"),
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        _myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        state: &mut SessionSupervisorState,
    ) -> std::result::Result<(), ActorProcessingErr> {
        // Never stop on a child's end (ractor's default): forget it; the next request for
        // its session spawns a new one.
        let (cell, failure) = match event {
            SupervisionEvent::ActorTerminated(cell, _, _) => (cell, None),
            SupervisionEvent::ActorFailed(cell, err) => (cell, Some(err)),
            _ => return Ok(()),
        };
        if let Some(key) = state.children.remove(&cell.get_id()) {
            let mut registry = write_registry(&state.args.registry);
            if registry
                .get(&key)
                .is_some_and(|a| a.get_id() == cell.get_id())
            {
                registry.remove(&key);
            }
            if let Some(err) = failure {
                state.failures += 1;
                tracing::warn!(session = %key.session, namespace = %key.namespace, error = %err, "session actor failed; the next request starts a new one");
            }
        }
        Ok(())
    }
}

impl SessionSupervisorState {
    async fn get_or_spawn(
        &mut self,
        myself: &ActorRef<SessionSupervisorMessage>,
        key: SessionKey,
    ) -> Result<ActorRef<SessionMessage>> {
        if let Some(actor) = live_actor(&self.args.registry, &key) {
            return Ok(actor);
        }
        let args = SessionArgs {
            substrate: self.args.substrate.clone(),
            key: key.clone(),
            idle: self.args.idle,
            age_trigger: self.args.age_trigger,
            directory: self.args.directory.clone(),
            registry: self.args.registry.clone(),
        };
        let (actor, _) = Actor::spawn_linked(None, SessionActor, args, myself.get_cell())
            .await
            .map_err(|e| Error::Unavailable {
                what: key.describe(),
                message: format!("its actor could not start: {e}"),
            })?;
        self.children.insert(actor.get_id(), key.clone());
        write_registry(&self.args.registry).insert(key, actor.clone());
        Ok(actor)
    }
}

/// The registered actor of a session, if it still takes messages (a stopping one is
/// replaced, not used).
pub(crate) fn live_actor(
    registry: &Registry,
    key: &SessionKey,
) -> Option<ActorRef<SessionMessage>> {
    use ractor::ActorStatus::{Running, Starting, Unstarted};
    read_registry(registry)
        .get(key)
        .filter(|actor| matches!(actor.get_status(), Running | Starting | Unstarted))
        .cloned()
}

pub(crate) fn read_registry(
    registry: &Registry,
) -> std::sync::RwLockReadGuard<'_, HashMap<SessionKey, ActorRef<SessionMessage>>> {
    registry.read().unwrap_or_else(|p| p.into_inner())
}

fn write_registry(
    registry: &Registry,
) -> std::sync::RwLockWriteGuard<'_, HashMap<SessionKey, ActorRef<SessionMessage>>> {
    registry.write().unwrap_or_else(|p| p.into_inner())
}
