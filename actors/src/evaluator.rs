//! The Evaluator: importance from a judge, in the background (`llm` / `hybrid` modes).
//!
//! The rules score every event inline when it is written — a pure function of the policy,
//! cheaper than a message hop — so in `rules` mode (the default) this actor has nothing to
//! do. In `llm` and `hybrid` modes, ingest also puts the records the judge should see on
//! the store's evaluation queue, in the same commit, and wakes this actor; it drains the
//! queue in batches of [`EvaluatorArgs::batch`] through [`Substrate::evaluate`], which
//! writes each judged score and its audit entry, or keeps the rules' score with the reason.
//! Ingest never waits for it.
//!
//! Restart: the queue is in the store, so a restarted evaluator (or a restarted process)
//! picks up where the last one stopped; a batch that was being judged is judged again.
//!
//! Poison input: a judge that panics on some record fails the actor. Before it fails, it
//! counts a strike against every record of the batch (in the store); after the restart,
//! records with strikes are judged one at a time, so the culprit is isolated, and a record
//! with [`MAX_STRIKES`] is quarantined instead of judged (see
//! `shadowbrain_runtime::quarantine`). The evaluator keeps serving the rest.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::FutureExt;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use shadowbrain_runtime::internals::{Mutation, Queue};
use shadowbrain_runtime::{
    EvaluationReport, Judge, MAX_STRIKES, MemoryId, Result, Substrate, UpdateJudge, panic_message,
};

/// How the evaluator signs its audit entries and strikes.
const ACTOR: &str = "evaluator";

/// The evaluator actor.
pub(crate) struct Evaluator;

/// What it is started with.
pub(crate) struct EvaluatorArgs {
    pub substrate: Substrate,
    /// The judge for `llm`/`hybrid` modes; `None` keeps the rules' scores (audited).
    pub judge: Option<Arc<dyn Judge>>,
    /// The judge of `[updates]` in `llm`/`hybrid` modes: each round also runs one update
    /// detection round with it (the indexer's rules-only rounds are off then).
    pub update_judge: Option<Arc<dyn UpdateJudge>>,
    /// Set while a wake-up waits in the mailbox (see `Directory::wake_evaluator`).
    pub woken: Arc<AtomicBool>,
    /// Records per judge request.
    pub batch: usize,
    /// Requests in flight at once: a round hands the judge up to `batch × concurrency`
    /// records in one call, and the judge sends them as requests together (the LLM judge
    /// first spares what its cache and reuse can answer, so its requests stay full).
    pub concurrency: usize,
    /// How long a part-filled round may wait for more records before it is sent anyway:
    /// records trickling in one by one would otherwise cost a call each.
    pub linger: Duration,
    /// How often it looks at the queue without being woken (records queued by a previous
    /// process, a wake-up lost in a restart).
    pub tick: Duration,
}

/// The evaluator's state: its arguments and what it has done.
pub(crate) struct EvaluatorState {
    args: EvaluatorArgs,
    /// Totals since this actor started.
    done: EvaluationReport,
    /// When a part-filled round was first seen waiting (see [`EvaluatorArgs::linger`]).
    partial_since: Option<std::time::Instant>,
    /// The tick period, and when the last round (or wait) ended: ticks that piled up in
    /// the mailbox during a long round are skipped, so a slow model never lets them grow.
    tick: Duration,
    last_round: Option<std::time::Instant>,
}

/// Whether a drain left work on the queue.
enum Round {
    /// The queue is empty.
    Empty,
    /// Records are still queued (a bounded drain stopped).
    More,
    /// A part-filled round waits for more records; a tick comes back for it.
    Wait,
}

/// The evaluator's protocol.
pub(crate) enum EvaluatorMessage {
    /// Records were queued: judge a round.
    Wake,
    /// The periodic look at the queue: a round, unless a wake-up is already waiting.
    Tick,
    /// Drain the queue now and answer what was done since start (tests, shutdown).
    Drain {
        reply: RpcReplyPort<Result<EvaluationReport>>,
    },
    /// Fault injection for supervision tests: the handler panics.
    #[cfg(feature = "failpoints")]
    Panic,
}

impl Actor for Evaluator {
    type Msg = EvaluatorMessage;
    type State = EvaluatorState;
    type Arguments = EvaluatorArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: EvaluatorArgs,
    ) -> std::result::Result<EvaluatorState, ActorProcessingErr> {
        // Whatever a predecessor left on the queue is judged now, not at the next write.
        args.woken.store(true, Ordering::Release);
        myself.send_message(EvaluatorMessage::Wake)?;
        // A lingering batch is looked at again soon after its wait is over.
        let tick = match args.linger {
            Duration::ZERO => args.tick,
            linger => args.tick.min(linger / 4).max(Duration::from_millis(20)),
        };
        myself.send_interval(tick, || EvaluatorMessage::Tick);
        Ok(EvaluatorState {
            args,
            done: EvaluationReport::default(),
            partial_since: None,
            tick,
            last_round: None,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: EvaluatorMessage,
        state: &mut EvaluatorState,
    ) -> std::result::Result<(), ActorProcessingErr> {
        match message {
            EvaluatorMessage::Tick
                if state.args.woken.load(Ordering::Acquire)
                    || state
                        .last_round
                        .is_some_and(|t| t.elapsed() < state.tick / 2) => {}
            EvaluatorMessage::Wake | EvaluatorMessage::Tick => {
                state.args.woken.store(false, Ordering::Release);
                let more_updates = state.detect_updates().await;
                let round = match state.drain(Some(1)).await? {
                    Ok(Round::Empty | Round::Wait) if more_updates => Ok(Round::More),
                    other => other,
                };
                state.last_round = Some(std::time::Instant::now());
                match round {
                    Err(e) => {
                        tracing::warn!(error = %e, "evaluation pass failed; the next tick retries");
                    }
                    // One round per message, then the rest later: a shutdown (which lets
                    // the mailbox drain, then stops) waits for one round of calls, not for
                    // a slow model to get through the whole queue, which stays in the
                    // store anyway.
                    Ok(Round::More) => {
                        if !state.args.woken.swap(true, Ordering::AcqRel)
                            && myself.send_message(EvaluatorMessage::Wake).is_err()
                        {
                            state.args.woken.store(false, Ordering::Release);
                        }
                    }
                    Ok(Round::Empty | Round::Wait) => {}
                }
            }
            EvaluatorMessage::Drain { reply } => {
                while state.detect_updates().await {}
                let result = state.drain(None).await?.map(|_| ());
                let _ = reply.send(result.map(|()| state.done));
            }
            #[cfg(feature = "failpoints")]
            EvaluatorMessage::Panic => panic!("fault injected into the evaluator"),
        }
        Ok(())
    }
}

impl EvaluatorState {
    /// One update detection round with the update judge, if there is one; whether more
    /// records wait to be compared. A failed round is logged and retried next tick (the
    /// queue is in the store).
    async fn detect_updates(&mut self) -> bool {
        const ROUND: usize = 256;
        let Some(judge) = self.args.update_judge.clone() else {
            return false;
        };
        match self
            .args
            .substrate
            .detect_updates_with(judge.as_ref(), ROUND)
            .await
        {
            Ok(r) => {
                if r.superseded + r.contradicted + r.repeated + r.fell_back > 0 {
                    tracing::debug!(?r, "updates detected");
                }
                r.compared == ROUND
            }
            Err(e) => {
                tracing::warn!(error = %e, "update detection failed; the next tick retries");
                false
            }
        }
    }

    /// Judges what is queued: `rounds` rounds of up to `concurrency` batches, or (`None`)
    /// until the queue is empty. The outer error fails the actor (a panic in the judge,
    /// after its strikes are counted); the inner one is a store or judge error to report.
    async fn drain(
        &mut self,
        rounds: Option<usize>,
    ) -> std::result::Result<Result<Round>, ActorProcessingErr> {
        let substrate = self.args.substrate.clone();
        let batch = self.args.batch.max(1);
        let width = self.args.concurrency.max(1);
        let mut round = 0;
        loop {
            let queued = match substrate.evaluation_queue(batch * width) {
                Ok(q) => q,
                Err(e) => return Ok(Err(e)),
            };
            if queued.is_empty() {
                return Ok(Ok(Round::Empty));
            }
            if rounds.is_some_and(|r| round >= r) {
                return Ok(Ok(Round::More));
            }
            // A background round lets a part-filled round wait a little for company; an
            // explicit drain (tests, `evaluate_now`) judges at once.
            if rounds.is_some() && queued.len() < batch * width && !self.args.linger.is_zero() {
                let since = *self
                    .partial_since
                    .get_or_insert_with(std::time::Instant::now);
                if since.elapsed() < self.args.linger {
                    return Ok(Ok(Round::Wait));
                }
            }
            self.partial_since = None;
            round += 1;
            // Records that made a judge fail before go alone, and are set aside when
            // they have failed too often.
            let mut clean = Vec::with_capacity(queued.len());
            for id in queued {
                let strikes = match substrate.strikes(id) {
                    Ok(s) => s,
                    Err(e) => return Ok(Err(e)),
                };
                match strikes {
                    None => clean.push(id),
                    Some(s) if s.count >= MAX_STRIKES => {
                        if let Err(e) = self.quarantine(id, &s).await {
                            return Ok(Err(e));
                        }
                    }
                    Some(_) => {
                        if let Err(e) = self.judge(&[id]).await? {
                            return Ok(Err(e));
                        }
                    }
                }
            }
            if !clean.is_empty()
                && let Err(e) = self.judge(&clean).await?
            {
                return Ok(Err(e));
            }
        }
    }

    /// One judge call over `ids`. A panic inside it counts a strike against each id and
    /// fails the actor (outer error).
    async fn judge(
        &mut self,
        ids: &[MemoryId],
    ) -> std::result::Result<Result<()>, ActorProcessingErr> {
        let substrate = &self.args.substrate;
        let judge = self.args.judge.as_deref();
        let outcome = AssertUnwindSafe(substrate.evaluate(ids, judge))
            .catch_unwind()
            .await;
        match outcome {
            Ok(Ok(report)) => {
                self.done.judged += report.judged;
                self.done.kept_rules += report.kept_rules;
                self.done.gone += report.gone;
                Ok(Ok(()))
            }
            Ok(Err(e)) => Ok(Err(e)),
            Err(payload) => {
                let message = panic_message(payload.as_ref());
                tracing::error!(records = ids.len(), error = %message, "the judge panicked; counting strikes and restarting");
                substrate.add_strikes(ids, ACTOR, &message).await?;
                Err(format!("the judge panicked: {message}").into())
            }
        }
    }

    async fn quarantine(
        &mut self,
        id: MemoryId,
        strikes: &shadowbrain_runtime::Strikes,
    ) -> Result<()> {
        let substrate = &self.args.substrate;
        let namespace = match substrate.store().owner(id)? {
            Some(ns) => ns,
            None => {
                // Purged meanwhile: nothing to set aside, just take it off the queue.
                let also = vec![
                    Mutation::Dequeue(Queue::Evaluate, id),
                    Substrate::clear_strikes(id),
                ];
                return substrate
                    .store()
                    .write_async(shadowbrain_runtime::internals::WriteSet(also))
                    .await;
            }
        };
        substrate
            .quarantine_record(
                &namespace,
                id,
                ACTOR,
                strikes,
                vec![Mutation::Dequeue(Queue::Evaluate, id)],
            )
            .await?;
        self.done.quarantined += 1;
        Ok(())
    }
}
