//! The Condenser: turns a session's window of episodic records into a condensed record.
//!
//! One actor serves every session, so two condensations of the same session never run at
//! once (each would quote the same window). Session actors *tell* it when their policy
//! trigger fires; the handle *asks* it on an explicit request. The work itself is
//! [`Substrate::condense_with`]: extractive, or written by the configured [`Summarizer`] in
//! the policy's `llm` mode. A summarizer that panics on a window is caught, and that window
//! is condensed extractively instead (with the panic in the audit log), so a poison window
//! can never crash the condenser over and over. Its state is the store — the per-session watermark moves with each condensed
//! record — so a restart loses only requests still in the mailbox, and those are asked
//! again by the next trigger. Each condensed record is offered to the knowledge graph at
//! once (a policy may admit condensed records without feedback).

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::FutureExt;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use shadowbrain_runtime::background::Priority;
use shadowbrain_runtime::{Condensed, Result, Substrate, Summarizer, panic_message};

use crate::directory::Directory;
use crate::knowledge::KnowledgeMessage;
use crate::session::SessionKey;

/// Who the audit log names for condensations.
const BY: &str = "condenser";

/// The condenser actor.
pub(crate) struct Condenser;

/// Its state: the substrate it writes to, where the knowledge graph is, the summarizer.
pub(crate) struct CondenserState {
    substrate: Substrate,
    directory: Directory,
    summarizer: Option<Arc<dyn Summarizer>>,
}

/// What the condenser is started with.
pub(crate) type CondenserArgs = (Substrate, Directory, Option<Arc<dyn Summarizer>>);

/// The condenser's protocol.
pub(crate) enum CondenserMessage {
    /// Condense the session's uncondensed events (if there are at least the policy's
    /// `min_events`); the answer, when asked for, is the condensed record or `None`.
    Condense {
        key: SessionKey,
        reply: Option<RpcReplyPort<Result<Option<Condensed>>>>,
    },
    /// Answers once every message sent before it is handled (`Runtime::settle`).
    Sync { reply: RpcReplyPort<()> },
    /// Fault injection for supervision tests: the handler panics.
    #[cfg(feature = "failpoints")]
    Panic,
}

impl Actor for Condenser {
    type Msg = CondenserMessage;
    type State = CondenserState;
    type Arguments = CondenserArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        (substrate, directory, summarizer): CondenserArgs,
    ) -> std::result::Result<CondenserState, ActorProcessingErr> {
        Ok(CondenserState {
            substrate,
            directory,
            summarizer,
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
                let (ns, session) = (&key.namespace, &key.session);
                let summarizer = state.summarizer.as_deref();
                // Asked for, a client waits on it; triggered, nobody does.
                let priority = match reply {
                    Some(_) => Priority::Client,
                    None => Priority::Background,
                };
                let written = state
                    .substrate
                    .condense_at(ns, session, BY, summarizer, priority);
                let result = match AssertUnwindSafe(written).catch_unwind().await {
                    Ok(result) => result,
                    Err(payload) => {
                        let panicked = PanickedSummarizer(panic_message(payload.as_ref()));
                        tracing::error!(session = %session, namespace = %ns, error = %panicked.0, "the summarizer panicked; condensing extractively");
                        state
                            .substrate
                            .condense_with(ns, session, BY, Some(&panicked))
                            .await
                    }
                };
                if let Ok(Some(condensed)) = &result {
                    // Queued for promotion in its own commit when the policy admits it as
                    // written; the wake-up only saves waiting for the next one.
                    let offer = state
                        .directory
                        .knowledge()
                        .map(|kg| kg.send_message(KnowledgeMessage::Drain));
                    if !matches!(offer, Ok(Ok(()))) {
                        tracing::warn!(id = %condensed.id, "could not wake the knowledge graph; a queued promotion waits for its next start");
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
            CondenserMessage::Sync { reply } => {
                let _ = reply.send(());
            }
            #[cfg(feature = "failpoints")]
            CondenserMessage::Panic => panic!("fault injected into the condenser"),
        }
        Ok(())
    }
}

/// Stands in for a summarizer that panicked on a window: it fails with the panic message,
/// so the window is condensed extractively and the audit entry says why.
#[derive(Debug)]
struct PanickedSummarizer(String);

#[async_trait::async_trait]
impl Summarizer for PanickedSummarizer {
    fn name(&self) -> &str {
        "the summarizer"
    }

    async fn summarize(
        &self,
        _request: shadowbrain_runtime::SummaryRequest<'_>,
    ) -> Result<shadowbrain_runtime::Summary> {
        Err(shadowbrain_runtime::Error::Provider {
            provider: "summarizer".into(),
            message: format!("it panicked: {}", self.0),
        })
    }
}
