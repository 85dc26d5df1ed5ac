//! The root of the supervision tree.
//!
//! ```text
//! RootSupervisor
//!  ├─ Evaluator            (importance from a judge in `llm`/`hybrid` modes; rules score inline)
//!  ├─ Condenser            (one for all sessions: windows → condensed records)
//!  ├─ Decay                (sweeps every policy interval of the runtime clock)
//!  ├─ KnowledgeGraph       (the namespace knowledge pools: promotion, merging, edges)
//!  ├─ Indexer              (the one writer of the vector and keyword indexes, batched)
//!  ├─ Enricher             (the one owner of embedding for embedders that do not embed inline)
//!  └─ SessionSupervisor
//!      └─ SessionActor × N (one per live session, passivated when idle)
//! ```
//!
//! The substrate's own background threads (indexer, enricher) do not run under the
//! runtime: each background job has one owner, and here it is an actor.
//!
//! Restart policy, child by child — what a restart recovers:
//! - **Condenser** → started again. Its state is the store (each session's condensation
//!   watermark moves with the condensed record); a request lost in its mailbox is made
//!   again by the session's next trigger, or fails at the handle with a clear error.
//! - **Evaluator** → started again; it drains the store's evaluation queue, so records
//!   queued before the failure are judged after it. A judge that panicked left strikes
//!   on the records it was judging; they are judged one at a time and quarantined after
//!   too many failures (see `evaluator.rs`).
//! - **KnowledgeGraph** → started again; it loads each namespace's graph from the store on
//!   first use. Knowledge records, edges and promotion markers are written in one commit,
//!   so a crash mid-promotion leaves either all of it or none; a candidate whose promotion
//!   was lost is offered again by the next success feedback on it.
//! - **Indexer** → started again; the index watermarks live in the indexes, so it resumes
//!   from the change log where the last committed build left off.
//! - **Enricher** → started again; the enrichment queue is in the store, so it resumes
//!   with the oldest record still waiting for its embedding.
//! - **Decay** → started again; it reads the time of the last sweep from the store, so it
//!   neither sweeps early nor forgets a sweep that is due.
//! - **SessionSupervisor** → started again. Its session actors died with it; the new one
//!   starts with an empty registry, and each session's next request spawns a fresh actor.
//!   Acknowledged writes are in the store; a request that was in a dead mailbox gets an
//!   error, which the handle retries once on a new actor.
//! - **SessionActor** → forgotten by its supervisor (see `session.rs`); the next request for
//!   the session starts a new one, whose state is the store.
//!
//! Every restart updates the [`Directory`], so senders reach the new actor at once. The
//! root never stops because a child ended — ractor's default would — only when the
//! `Runtime` shuts down: then it drains its children in dependency order (session actors
//! first, so their last writes and triggers reach the others; the enricher, then the
//! indexer, last) and
//! restarts nothing.

use std::time::Duration;

use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use shadowbrain_runtime::Substrate;

use crate::condenser::Condenser;
use crate::decay::{Decay, DecayArgs};
use crate::directory::Directory;
use crate::enricher::{Enricher, EnricherArgs, EnricherMessage};
use crate::evaluator::{Evaluator, EvaluatorArgs};
use crate::indexer::{Indexer, IndexerArgs, IndexerMessage};
use crate::knowledge::KnowledgeGraph;
use crate::session::{Registry, SessionSupervisor, SessionSupervisorArgs};

/// The root supervisor (see the module docs).
pub(crate) struct RootSupervisor;

/// What the root is started with.
pub(crate) struct RootArgs {
    pub substrate: Substrate,
    pub registry: Registry,
    pub directory: Directory,
    pub session_idle: Duration,
    pub age_trigger: bool,
    pub decay_check: Option<Duration>,
    pub index_tick: Duration,
    pub judge: Option<std::sync::Arc<dyn shadowbrain_runtime::Judge>>,
    pub update_judge: Option<std::sync::Arc<dyn shadowbrain_runtime::UpdateJudge>>,
    pub evaluation_batch: usize,
    pub evaluation_concurrency: usize,
    pub evaluation_wait: Duration,
    pub summarizer: Option<std::sync::Arc<dyn shadowbrain_runtime::Summarizer>>,
}

/// The children, to tell which one ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Child {
    Sessions,
    Evaluator,
    Condenser,
    Decay,
    Knowledge,
    Indexer,
    Enricher,
}

/// The root's state.
pub(crate) struct RootState {
    args: RootArgs,
    children: Vec<(ActorCell, Child)>,
    /// The actors outside the directory.
    background: Background,
    /// Children restarted since start.
    restarts: u64,
    /// Set by [`RootMessage::Drain`]: children that end are not restarted.
    draining: bool,
}

/// The indexer and the enricher, which nobody sends to but the root (the enricher is woken
/// through the substrate).
#[derive(Default)]
pub(crate) struct Background {
    indexer: Option<ActorRef<IndexerMessage>>,
    enricher: Option<ActorRef<EnricherMessage>>,
}

/// The protocol of the root supervisor.
pub(crate) enum RootMessage {
    /// How many children were restarted since start (session actors not counted: they
    /// are replaced on demand).
    Restarts { reply: RpcReplyPort<u64> },
    /// Fault injection for supervision tests: the child panics.
    #[cfg(feature = "failpoints")]
    Panic(Child),
    /// Shutdown: every child finishes what its mailbox holds and stops, in dependency
    /// order; answers when all have stopped (or `timeout` passed for one of them).
    Drain {
        timeout: Duration,
        reply: RpcReplyPort<()>,
    },
}

impl RootSupervisor {
    async fn start(
        myself: &ActorRef<RootMessage>,
        args: &RootArgs,
        background: &mut Background,
        child: Child,
    ) -> Result<ActorCell, ActorProcessingErr> {
        let parent = myself.get_cell();
        Ok(match child {
            Child::Indexer => {
                let child_args = IndexerArgs {
                    substrate: args.substrate.clone(),
                    tick: args.index_tick,
                };
                let (actor, _) = Actor::spawn_linked(None, Indexer, child_args, parent).await?;
                background.indexer = Some(actor.clone());
                actor.get_cell()
            }
            Child::Enricher => {
                let child_args = EnricherArgs {
                    substrate: args.substrate.clone(),
                    tick: Duration::from_secs(1),
                };
                let (actor, _) = Actor::spawn_linked(None, Enricher, child_args, parent).await?;
                background.enricher = Some(actor.clone());
                actor.get_cell()
            }
            Child::Sessions => {
                let child_args = SessionSupervisorArgs {
                    substrate: args.substrate.clone(),
                    registry: args.registry.clone(),
                    directory: args.directory.clone(),
                    idle: args.session_idle,
                    age_trigger: args.age_trigger,
                };
                let (actor, _) =
                    Actor::spawn_linked(None, SessionSupervisor, child_args, parent).await?;
                args.directory.set_sessions(actor.clone());
                actor.get_cell()
            }
            Child::Evaluator => {
                let child_args = EvaluatorArgs {
                    substrate: args.substrate.clone(),
                    woken: args.directory.evaluator_woken(),
                    judge: args.judge.clone(),
                    update_judge: args.update_judge.clone(),
                    batch: args.evaluation_batch,
                    concurrency: args.evaluation_concurrency,
                    linger: args.evaluation_wait,
                    tick: Duration::from_secs(1),
                };
                let (actor, _) = Actor::spawn_linked(None, Evaluator, child_args, parent).await?;
                args.directory.set_evaluator(actor.clone());
                actor.get_cell()
            }
            Child::Condenser => {
                let child_args = (
                    args.substrate.clone(),
                    args.directory.clone(),
                    args.summarizer.clone(),
                );
                let (actor, _) = Actor::spawn_linked(None, Condenser, child_args, parent).await?;
                args.directory.set_condenser(actor.clone());
                actor.get_cell()
            }
            Child::Knowledge => {
                let (actor, _) =
                    Actor::spawn_linked(None, KnowledgeGraph, args.substrate.clone(), parent)
                        .await?;
                args.directory.set_knowledge(actor.clone());
                actor.get_cell()
            }
            Child::Decay => {
                let child_args = DecayArgs {
                    substrate: args.substrate.clone(),
                    check: args.decay_check,
                };
                let (actor, _) = Actor::spawn_linked(None, Decay, child_args, parent).await?;
                args.directory.set_decay(actor.clone());
                actor.get_cell()
            }
        })
    }
}

impl Actor for RootSupervisor {
    type Msg = RootMessage;
    type State = RootState;
    type Arguments = RootArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: RootArgs,
    ) -> Result<RootState, ActorProcessingErr> {
        // Receivers before senders: sessions send to the condenser, which sends to the
        // knowledge graph.
        let mut children = Vec::new();
        let mut background = Background::default();
        for child in [
            Child::Indexer,
            Child::Enricher,
            Child::Knowledge,
            Child::Condenser,
            Child::Evaluator,
            Child::Decay,
            Child::Sessions,
        ] {
            children.push((
                Self::start(&myself, &args, &mut background, child).await?,
                child,
            ));
        }
        Ok(RootState {
            args,
            children,
            background,
            restarts: 0,
            draining: false,
        })
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut RootState,
    ) -> Result<(), ActorProcessingErr> {
        state.args.directory.clear();
        Ok(())
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        message: RootMessage,
        state: &mut RootState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            RootMessage::Restarts { reply } => {
                let _ = reply.send(state.restarts);
            }
            RootMessage::Drain { timeout, reply } => {
                state.draining = true;
                for child in [
                    Child::Sessions,
                    Child::Evaluator,
                    Child::Condenser,
                    Child::Knowledge,
                    Child::Decay,
                    Child::Enricher,
                    Child::Indexer,
                ] {
                    let Some((cell, _)) = state.children.iter().find(|(_, c)| *c == child) else {
                        continue;
                    };
                    if child == Child::Sessions {
                        cell.drain_children_and_wait(Some(timeout)).await;
                    }
                    if let Err(e) = cell.drain_and_wait(Some(timeout)).await {
                        tracing::warn!(?child, error = %e, "did not drain in time; stopping it");
                        cell.stop(Some("shutdown".into()));
                    }
                }
                state.args.directory.clear();
                let _ = reply.send(());
            }
            #[cfg(feature = "failpoints")]
            RootMessage::Panic(child) => inject_panic(state, child)?,
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        state: &mut RootState,
    ) -> Result<(), ActorProcessingErr> {
        let (cell, why) = match event {
            SupervisionEvent::ActorTerminated(cell, _, reason) => {
                (cell, reason.unwrap_or_else(|| "stopped".into()))
            }
            SupervisionEvent::ActorFailed(cell, err) => (cell, err.to_string()),
            _ => return Ok(()),
        };
        let Some(i) = state
            .children
            .iter()
            .position(|(c, _)| c.get_id() == cell.get_id())
        else {
            return Ok(());
        };
        if state.draining {
            return Ok(());
        }
        let child = state.children[i].1;
        tracing::warn!(?child, reason = %why, "child ended; starting a new one");
        state.children[i].0 =
            Self::start(&myself, &state.args, &mut state.background, child).await?;
        state.restarts += 1;
        Ok(())
    }
}

/// Makes `child` panic (fault injection for the supervision tests).
#[cfg(feature = "failpoints")]
fn inject_panic(state: &RootState, child: Child) -> Result<(), ActorProcessingErr> {
    use crate::condenser::CondenserMessage;
    use crate::decay::DecayMessage;
    use crate::evaluator::EvaluatorMessage;
    use crate::knowledge::KnowledgeMessage;
    use crate::session::SessionSupervisorMessage;
    let directory = &state.args.directory;
    match child {
        Child::Sessions => directory
            .sessions()?
            .send_message(SessionSupervisorMessage::Panic)?,
        Child::Evaluator => directory
            .evaluator()?
            .send_message(EvaluatorMessage::Panic)?,
        Child::Condenser => directory
            .condenser()?
            .send_message(CondenserMessage::Panic)?,
        Child::Decay => directory.decay()?.send_message(DecayMessage::Panic)?,
        Child::Knowledge => directory
            .knowledge()?
            .send_message(KnowledgeMessage::Panic)?,
        Child::Indexer => {
            if let Some(indexer) = &state.background.indexer {
                indexer.send_message(IndexerMessage::Panic)?;
            }
        }
        Child::Enricher => {
            if let Some(enricher) = &state.background.enricher {
                enricher.send_message(EnricherMessage::Panic)?;
            }
        }
    }
    Ok(())
}
