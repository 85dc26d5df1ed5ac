//! The root of the supervision tree.
//!
//! ```text
//! RootSupervisor
//!  └─ SessionSupervisor ─ SessionActor × N   (one per live session, passivated when idle)
//!     (to come, each a child of the root: Evaluator, Condenser, Decay, KnowledgeGraph,
//!      Indexer — today the substrate's own threads index and enrich)
//! ```
//!
//! Restart policy, child by child — what a restart recovers:
//! - **SessionSupervisor** fails → the root starts a new one. Its session actors died with
//!   it; the new one starts with an empty registry, and every session's next request spawns
//!   a fresh actor. Nothing is lost: acknowledged writes are in the store, and a request
//!   that was in a dead mailbox gets an error (the handle retries it once on a new actor).
//! - **SessionActor** fails → its supervisor forgets it (see `session.rs`); the next request
//!   for the session starts a new one, whose state is the store.
//!
//! The root never stops because a child ended — ractor's default would — only when the
//! `Runtime` shuts down.

use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use shadowbrain_runtime::substrate::Substrate;

use crate::session::{
    Registry, SessionSupervisor, SessionSupervisorArgs, SessionSupervisorMessage,
};

/// The root supervisor (see the module docs).
pub(crate) struct RootSupervisor;

/// What the root is started with.
pub(crate) struct RootArgs {
    pub substrate: Substrate,
    pub registry: Registry,
    pub session_idle: Duration,
}

/// The root's state.
pub(crate) struct RootState {
    args: RootArgs,
    sessions: ActorRef<SessionSupervisorMessage>,
    /// Children restarted since start.
    restarts: u64,
}

/// The protocol of the root supervisor.
pub(crate) enum RootMessage {
    /// The current session supervisor (it changes when it is restarted).
    Sessions {
        reply: RpcReplyPort<ActorRef<SessionSupervisorMessage>>,
    },
    /// How many children were restarted since start.
    Restarts { reply: RpcReplyPort<u64> },
    /// Fault injection for supervision tests: the session supervisor panics.
    PanicSessions,
}

impl RootSupervisor {
    async fn spawn_sessions(
        myself: &ActorRef<RootMessage>,
        args: &RootArgs,
    ) -> Result<ActorRef<SessionSupervisorMessage>, ActorProcessingErr> {
        let child = SessionSupervisorArgs {
            substrate: args.substrate.clone(),
            registry: args.registry.clone(),
            idle: args.session_idle,
        };
        let (sessions, _) =
            Actor::spawn_linked(None, SessionSupervisor, child, myself.get_cell()).await?;
        Ok(sessions)
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
        let sessions = Self::spawn_sessions(&myself, &args).await?;
        Ok(RootState {
            args,
            sessions,
            restarts: 0,
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        message: RootMessage,
        state: &mut RootState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            RootMessage::Sessions { reply } => {
                let _ = reply.send(state.sessions.clone());
            }
            RootMessage::Restarts { reply } => {
                let _ = reply.send(state.restarts);
            }
            RootMessage::PanicSessions => {
                state
                    .sessions
                    .send_message(SessionSupervisorMessage::Panic)?;
            }
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
        if cell.get_id() == state.sessions.get_id() {
            tracing::warn!(reason = %why, "session supervisor ended; starting a new one");
            state.sessions = Self::spawn_sessions(&myself, &state.args).await?;
            state.restarts += 1;
        }
        Ok(())
    }
}
