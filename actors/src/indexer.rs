//! The Indexer: the single writer of the vector and keyword indexes under the runtime.
//!
//! Each tick runs a keyword pass ([`Substrate::index_step`]): it applies a bounded share
//! of the store's change log to both indexes' in-memory tails and commits the keyword index
//! when enough is staged or the debounce says so. Vector passes build the arroy trees,
//! which takes minutes on a busy two-core machine; they run as a task of their own, one at
//! a time, so keyword commits (and with them the keyword tail's memory) never wait for a
//! tree build. Ingest never waits for either: writes only append to the change log, and
//! recall catches the tails up itself, so a slow build never hides an acknowledged write.
//! The next tick is scheduled when the current one ends (at once when the pass stopped at
//! its bound with more of the log to apply), so passes never pile up in the mailbox.
//!
//! The index watermarks are in the indexes themselves, so a restart just resumes from
//! them; a pass that failed is retried at the next tick. A vector build still running when
//! the actor restarts finishes on its own; the new actor's build waits for it on the
//! index's build lock.

use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use shadowbrain_runtime::{IndexKind, Result, Substrate};
use tokio::task::JoinHandle;

/// The indexer actor.
pub(crate) struct Indexer;

/// What it is started with.
pub(crate) struct IndexerArgs {
    pub substrate: Substrate,
    /// Pause between the end of one pass and the start of the next.
    pub tick: Duration,
}

/// Its state: the arguments and the vector build in flight, if any.
pub(crate) struct IndexerState {
    args: IndexerArgs,
    vector_pass: Option<JoinHandle<bool>>,
}

/// The indexer's protocol.
pub(crate) enum IndexerMessage {
    /// Run one pass, then schedule the next.
    Pass,
    /// Fault injection for supervision tests: the handler panics.
    #[cfg(feature = "failpoints")]
    Panic,
}

/// Runs one pass of `kind` off the async workers (builds and commits block for seconds);
/// answers whether the log holds more (see [`Substrate::index_step`]).
fn spawn_pass(substrate: &Substrate, kind: IndexKind) -> JoinHandle<bool> {
    // Lent: closing waits for the pass to let go of the store and the indexes.
    let substrate = substrate.lend();
    // At a lower CPU priority: nobody waits on a pass (recall catches the tails up itself).
    shadowbrain_runtime::background::spawn(move || substrate.index_step(kind))
}

/// Whether a finished pass asks for the next one at once; a pass that panicked is logged
/// and retried at the next tick.
fn more(kind: IndexKind, pass: std::result::Result<bool, tokio::task::JoinError>) -> bool {
    pass.unwrap_or_else(|e| {
        tracing::warn!(?kind, error = %e, "index pass panicked; the next tick retries");
        false
    })
}

impl Actor for Indexer {
    type Msg = IndexerMessage;
    type State = IndexerState;
    type Arguments = IndexerArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: IndexerArgs,
    ) -> Result<IndexerState, ActorProcessingErr> {
        myself.send_message(IndexerMessage::Pass)?;
        Ok(IndexerState {
            args,
            vector_pass: None,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: IndexerMessage,
        state: &mut IndexerState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            IndexerMessage::Pass => {
                let substrate = &state.args.substrate;
                let keyword_pass = spawn_pass(substrate, IndexKind::Keywords).await;
                let again = more(IndexKind::Keywords, keyword_pass);
                if let Some(done) = state.vector_pass.take_if(|t| t.is_finished()) {
                    more(IndexKind::Vectors, done.await);
                }
                if state.vector_pass.is_none() {
                    state.vector_pass = Some(spawn_pass(substrate, IndexKind::Vectors));
                }
                if again {
                    myself.send_message(IndexerMessage::Pass)?;
                } else {
                    myself.send_after(state.args.tick, || IndexerMessage::Pass);
                }
            }
            #[cfg(feature = "failpoints")]
            IndexerMessage::Panic => panic!("fault injected into the indexer"),
        }
        Ok(())
    }
}
