//! The Decay actor: runs decay sweeps ([`Substrate::decay_sweep`]) every policy
//! `forgetting.interval` **of the runtime clock**.
//!
//! A ticker on tokio's clock (every [`DecayArgs::check`]) asks "has an interval of runtime
//! time passed since the last sweep?", so on the virtual clock a simulated month passes in
//! as many ticks as it takes to advance it, and one sweep covers any gap (decay is computed
//! from each record's `strength_at`, so one late sweep equals many punctual ones). The time
//! of the last sweep is kept in the store, so a restart neither sweeps early nor forgets
//! that one is due. Simulations that must replay exactly turn the ticker off and ask for
//! sweeps at fixed virtual times ([`DecayMessage::SweepNow`]).

use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use shadowbrain_runtime::background::{self, Priority};
use shadowbrain_runtime::internals::{Mutation, WriteSet};
use shadowbrain_runtime::{Error, Result, Substrate, SweepReport, Timestamp};
use tokio::task::JoinHandle;

/// Who the audit log names for decay.
const BY: &str = "decay";

/// The decay actor.
pub(crate) struct Decay;

/// What it is started with.
pub(crate) struct DecayArgs {
    pub substrate: Substrate,
    /// How often to look at the runtime clock; `None`: sweep only when asked.
    pub check: Option<Duration>,
}

/// Its state.
pub(crate) struct DecayState {
    substrate: Substrate,
    ticker: Option<JoinHandle<()>>,
    /// Runtime time of the last sweep (from the store on start).
    last_sweep: Timestamp,
}

/// The decay actor's protocol.
pub(crate) enum DecayMessage {
    /// From the ticker: sweep if an interval has passed on the runtime clock.
    Tick,
    /// Sweep now, whatever the interval says.
    SweepNow {
        reply: RpcReplyPort<Result<SweepReport>>,
    },
    /// Fault injection for supervision tests: the handler panics.
    #[cfg(feature = "failpoints")]
    Panic,
}

impl DecayState {
    /// Sweeps off the actor's thread (a sweep reads every record) and records when. A
    /// scheduled sweep runs at the background priority (on a busy machine it yields to
    /// writes and recalls; on an idle one it runs as fast), one asked for at the client's.
    async fn sweep(&mut self, priority: Priority) -> Result<SweepReport> {
        let substrate = self.substrate.clone();
        let now = substrate.clock().now();
        let report = background::spawn_at(priority, move || {
            let report = substrate.decay_sweep(BY)?;
            substrate
                .store()
                .write(WriteSet(vec![Mutation::SetLastDecaySweep(now)]))?;
            Ok::<_, Error>(report)
        })
        .await
        .map_err(|e| Error::Unavailable {
            what: "the decay sweep".into(),
            message: format!("it panicked: {e}"),
        })??;
        self.last_sweep = now;
        Ok(report)
    }
}

impl Actor for Decay {
    type Msg = DecayMessage;
    type State = DecayState;
    type Arguments = DecayArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: DecayArgs,
    ) -> std::result::Result<DecayState, ActorProcessingErr> {
        let last_sweep = args.substrate.store().last_decay_sweep()?;
        // A new store: the first sweep is one interval from now, and a restart keeps that.
        let last_sweep = match last_sweep {
            Some(t) => t,
            None => {
                let now = args.substrate.clock().now();
                args.substrate
                    .store()
                    .write(WriteSet(vec![Mutation::SetLastDecaySweep(now)]))?;
                now
            }
        };
        let ticker = args
            .check
            .map(|every| myself.send_interval(every, || DecayMessage::Tick));
        Ok(DecayState {
            substrate: args.substrate,
            ticker,
            last_sweep,
        })
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut DecayState,
    ) -> std::result::Result<(), ActorProcessingErr> {
        if let Some(ticker) = state.ticker.take() {
            ticker.abort();
        }
        Ok(())
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        message: DecayMessage,
        state: &mut DecayState,
    ) -> std::result::Result<(), ActorProcessingErr> {
        match message {
            DecayMessage::Tick => {
                // One sweep serves every namespace: it runs as often as the most
                // frequent of their policies asks.
                let policies = state.substrate.policies();
                let Some(interval) = policies.all().filter_map(|p| p.forgetting.interval).min()
                else {
                    return Ok(());
                };
                let now = state.substrate.clock().now();
                if now.saturating_sub(state.last_sweep) >= interval.as_millis() as i64
                    && let Err(e) = state.sweep(Priority::Background).await
                {
                    tracing::warn!(error = %e, "decay sweep failed; the next tick tries again");
                }
            }
            DecayMessage::SweepNow { reply } => {
                let _ = reply.send(state.sweep(Priority::Client).await);
            }
            #[cfg(feature = "failpoints")]
            DecayMessage::Panic => panic!("fault injected into the decay actor"),
        }
        Ok(())
    }
}
