//! The Enricher: the one owner of embedding under the runtime.
//!
//! Ingest never waits for an embedder that does not embed inline (a remote provider, the
//! local model): it puts each such record on the store's enrichment queue in the commit
//! that stores it, and the substrate calls the wake-up this actor registered
//! ([`Substrate::on_enrich_queued`]). The actor takes the queue oldest first,
//! [`Substrate::enrich_round`] records at a time — a remote embedder's batch size times its
//! requests in flight, so the provider transport's `max_concurrency` bounds what is on the
//! wire and its retries absorb what is worth retrying — and
//! [`Substrate::enrich_pending`] stores each embedding and removes the record from the
//! queue in one commit, then wakes the indexer. A record is therefore embedded once, and a
//! crash between rounds loses nothing: the next start drains what is left.
//!
//! A round that fails (the provider down past its retries) leaves its records queued,
//! readable and keyword-recallable. The next round waits, the wait doubling up to
//! [`MAX_BACKOFF`], so a dead provider is asked once per wait and not at every write.
//! A periodic tick looks at the queue even when nobody woke the actor: records queued by
//! an earlier process, a wake-up lost in a restart.
//!
//! Restart: the queue is in the store, so a restarted enricher resumes where the last one
//! stopped; a round cut short by the failure is embedded again, and stored once.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::FutureExt;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use shadowbrain_runtime::{Substrate, panic_message};

/// The first wait after a failed round.
const FIRST_BACKOFF: Duration = Duration::from_millis(200);
/// The longest wait between rounds while the embedder fails.
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// The enricher actor.
pub(crate) struct Enricher;

/// What it is started with.
pub(crate) struct EnricherArgs {
    pub substrate: Substrate,
    /// How often it looks at the queue without being woken.
    pub tick: Duration,
}

/// Its state.
pub(crate) struct EnricherState {
    args: EnricherArgs,
    /// Set while a wake-up waits in the mailbox, so a burst of writes sends one.
    woken: Arc<AtomicBool>,
    /// The wait after the next failure.
    backoff: Duration,
    /// While the embedder fails: no round before this (a wake-up is scheduled for it).
    resume_at: Option<Instant>,
}

/// The enricher's protocol.
pub(crate) enum EnricherMessage {
    /// Records were queued (or a round left more): run a round.
    Wake,
    /// The periodic look at the queue.
    Tick,
    /// Fault injection for supervision tests: the handler panics.
    #[cfg(feature = "failpoints")]
    Panic,
}

impl Actor for Enricher {
    type Msg = EnricherMessage;
    type State = EnricherState;
    type Arguments = EnricherArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: EnricherArgs,
    ) -> Result<EnricherState, ActorProcessingErr> {
        // Whatever an earlier process or actor left queued is embedded now.
        let woken = Arc::new(AtomicBool::new(true));
        myself.send_message(EnricherMessage::Wake)?;
        let (me, flag) = (myself.clone(), woken.clone());
        args.substrate
            .on_enrich_queued(Some(Arc::new(move || wake(&me, &flag))));
        myself.send_interval(args.tick, || EnricherMessage::Tick);
        Ok(EnricherState {
            args,
            woken,
            backoff: FIRST_BACKOFF,
            resume_at: None,
        })
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut EnricherState,
    ) -> Result<(), ActorProcessingErr> {
        state.args.substrate.on_enrich_queued(None);
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: EnricherMessage,
        state: &mut EnricherState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            // A wake-up is already on its way.
            EnricherMessage::Tick if state.woken.load(Ordering::Acquire) => {}
            EnricherMessage::Wake | EnricherMessage::Tick => {
                state.woken.store(false, Ordering::Release);
                if state.resume_at.is_some_and(|at| Instant::now() < at) {
                    // Backing off; the wake-up scheduled for the end of the wait comes.
                    return Ok(());
                }
                state.round(&myself).await;
            }
            #[cfg(feature = "failpoints")]
            EnricherMessage::Panic => panic!("fault injected into the enricher"),
        }
        Ok(())
    }
}

/// Sends the enricher a wake-up unless one already waits in its mailbox (`woken`).
fn wake(enricher: &ActorRef<EnricherMessage>, woken: &AtomicBool) {
    wake_once(enricher, woken, || EnricherMessage::Wake);
}

/// Sends `actor` the wake-up `message` unless one already waits in its mailbox (`woken`,
/// cleared by the actor when it handles it), so a burst of wake-ups sends one. An actor
/// that has stopped is not woken; its successor looks at its durable queue when it starts.
pub(crate) fn wake_once<M: ractor::Message>(
    actor: &ActorRef<M>,
    woken: &AtomicBool,
    message: impl FnOnce() -> M,
) {
    if !woken.swap(true, Ordering::AcqRel) && actor.send_message(message()).is_err() {
        woken.store(false, Ordering::Release);
    }
}

impl EnricherState {
    /// Embeds one round of the queue, then asks for the next at once if there may be more,
    /// or after the backoff if the embedder failed.
    async fn round(&mut self, myself: &ActorRef<EnricherMessage>) {
        let substrate = &self.args.substrate;
        let round = substrate.enrich_pending(substrate.enrich_round());
        let failure = match AssertUnwindSafe(round).catch_unwind().await {
            Ok(Ok(done)) => {
                self.backoff = FIRST_BACKOFF;
                self.resume_at = None;
                if done > 0 {
                    wake(myself, &self.woken);
                }
                return;
            }
            Ok(Err(e)) => e.to_string(),
            // An embedder that panics on some input must not take the actor into a restart
            // loop on the same round: it is a failure like any other, retried after a wait.
            Err(payload) => format!("the embedder panicked: {}", panic_message(payload.as_ref())),
        };
        let wait = self.backoff;
        tracing::warn!(error = %failure, retry_in = ?wait, "embedding failed; the records stay queued, readable and keyword-recallable");
        self.resume_at = Some(Instant::now() + wait);
        self.backoff = (wait * 2).min(MAX_BACKOFF);
        myself.send_after(wait, || EnricherMessage::Wake);
    }
}
