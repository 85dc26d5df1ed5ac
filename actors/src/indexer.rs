//! The Indexer: the single writer of the vector and keyword indexes under the runtime.
//!
//! Each pass ([`Substrate::index_pass`]) applies the store's change log to the indexes'
//! in-memory tails and, when the debounce says so (a quiet period, a maximum delay, or
//! enough staged changes), builds both indexes in one batch. Ingest never waits for it:
//! writes only append to the change log, and recall catches the tails up itself, so a
//! slow build never hides an acknowledged write. The next pass is scheduled when the
//! current one ends, so a long build never piles passes up in the mailbox.
//!
//! The index watermarks are in the indexes themselves, so a restart just resumes from
//! them; a pass that failed is retried at the next tick.

use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use shadowbrain_runtime::error::Error;
use shadowbrain_runtime::substrate::Substrate;

/// The indexer actor.
pub(crate) struct Indexer;

/// What it is started with.
pub(crate) struct IndexerArgs {
    pub substrate: Substrate,
    /// Pause between the end of one pass and the start of the next.
    pub tick: Duration,
}

/// The indexer's protocol.
pub(crate) enum IndexerMessage {
    /// Run one pass, then schedule the next.
    Pass,
    /// Fault injection for supervision tests: the handler panics.
    Panic,
}

impl Actor for Indexer {
    type Msg = IndexerMessage;
    type State = IndexerArgs;
    type Arguments = IndexerArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: IndexerArgs,
    ) -> Result<IndexerArgs, ActorProcessingErr> {
        myself.send_message(IndexerMessage::Pass)?;
        Ok(args)
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: IndexerMessage,
        state: &mut IndexerArgs,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            IndexerMessage::Pass => {
                let substrate = state.substrate.clone();
                // Builds take seconds on large batches: keep them off the async workers.
                let pass = tokio::task::spawn_blocking(move || substrate.index_pass(false))
                    .await
                    .map_err(|e| Error::Unavailable {
                        what: "an index pass".into(),
                        message: format!("it panicked: {e}"),
                    });
                match pass {
                    Ok(Ok(pass)) if pass.built => tracing::debug!(?pass, "indexes built"),
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) | Err(e) => {
                        tracing::warn!(error = %e, "index pass failed; the next tick retries");
                    }
                }
                myself.send_after(state.tick, || IndexerMessage::Pass);
            }
            IndexerMessage::Panic => panic!("fault injected into the indexer"),
        }
        Ok(())
    }
}
