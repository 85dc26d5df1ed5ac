//! The Condenser: turns a session's window of episodic records into a condensed record.
//!
//! One actor serves every session, so two condensations of the same session never run at
//! once (each would quote the same window). Session actors *tell* it when their policy
//! trigger fires; the handle *asks* it on an explicit request. The work itself is
//! [`Substrate::condense`] (extractive, no LLM); the `llm` mode of a later issue plugs in
//! here. Its state is the store — the per-session watermark moves with each condensed
//! record — so a restart loses only requests still in the mailbox, and those are asked
//! again by the next trigger. Each condensed record is offered to the knowledge graph at
//! once (a policy may admit condensed records without feedback).

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use shadowbrain_runtime::error::Result;
use shadowbrain_runtime::lifecycle::Condensed;
use shadowbrain_runtime::substrate::Substrate;

use crate::directory::Directory;
use crate::knowledge::KnowledgeMessage;
use crate::session::SessionKey;

/// Who the audit log names for condensations.
const BY: &str = "condenser";

/// The condenser actor.
pub(crate) struct Condenser;

/// Its state: the substrate it writes to.
pub(crate) struct CondenserState {
    substrate: Substrate,
    directory: Directory,
}

/// The condenser's protocol.
pub(crate) enum CondenserMessage {
    /// Condense the session's uncondensed events (if there are at least the policy's
    /// `min_events`); the answer, when asked for, is the condensed record or `None`.
    Condense {
        key: SessionKey,
        reply: Option<RpcReplyPort<Result<Option<Condensed>>>>,
    },
    /// Fault injection for supervision tests: the handler panics.
    Panic,
}

impl Actor for Condenser {
    type Msg = CondenserMessage;
    type State = CondenserState;
    type Arguments = (Substrate, Directory);

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        (substrate, directory): (Substrate, Directory),
    ) -> std::result::Result<CondenserState, ActorProcessingErr> {
        Ok(CondenserState {
            substrate,
            directory,
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        message: CondenserMessage,
        state: &mut CondenserState,
    ) -> std::result::Result<(), ActorProcessingErr> {
        match message {
            CondenserMessage::Condense { key, reply } => {
                let result = state
                    .substrate
                    .condense(&key.namespace, &key.session, BY)
                    .await;
                if let Ok(Some(condensed)) = &result {
                    let offer = state.directory.knowledge().map(|kg| {
                        kg.send_message(KnowledgeMessage::Promote {
                            namespace: key.namespace.clone(),
                            ids: vec![condensed.id],
                            reply: None,
                        })
                    });
                    if !matches!(offer, Ok(Ok(()))) {
                        tracing::warn!(id = %condensed.id, "could not offer a condensed record for promotion");
                    }
                }
                match (reply, result) {
                    (Some(reply), result) => {
                        let _ = reply.send(result);
                    }
                    (None, Err(e)) => {
                        tracing::warn!(session = %key.session, namespace = %key.namespace, error = %e, "condensation failed; the next trigger tries again");
                    }
                    (None, Ok(_)) => {}
                }
            }
            CondenserMessage::Panic => panic!("fault injected into the condenser"),
        }
        Ok(())
    }
}
