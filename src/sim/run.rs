//! Runs one policy over a [`Workload`] through the real actor runtime on the virtual
//! clock, and measures what happened to the planted items.
//!
//! Exact replays need every decision to follow from the workload alone, so nothing a
//! real-time timer does may decide what happens to a memory. The runner therefore drives
//! what the runtime would otherwise do on its own timers, at fixed *simulated* times:
//! - decay sweeps at the `[forgetting] interval`, but at most once per simulated day (the
//!   lab's resolution: a sweep reads every record, and strength is computed from elapsed
//!   time, so a coarser sweep archives up to a day later, never differently);
//!   `Runtime::decay_now`, the decay actor's own ticker being off;
//! - index builds once per simulated day (`Substrate::index_pass`; the indexer's ticker is
//!   off — until a build, new records are searched exactly in the index tails);
//! - the `max_age` condensation trigger when a session's last event gets that old
//!   (`age_trigger` off), while the `every_events` trigger stays with the session actors;
//! - and after every write, `Runtime::settle` waits for the condensations and promotions it
//!   triggered.
//!
//! Session actors still passivate in real time, which bounds memory and decides nothing.
//!
//! What the agents do beside writing:
//! - a lesson told again is first *used*: the agent recalls what to do in its situation,
//!   namespace-wide with the knowledge pool, and when the lesson came back it reports the
//!   memories that held it a success (good lesson) or a failure (misleading one) — which
//!   is what promotion learns from. Agents are lesson-conscious: they write a lesson down
//!   with importance 10;
//! - a probe recalls the planted item's question in the asking agent's memory (scope
//!   `agent`) and checks for the plant's code in the top `k`. Like any recall it
//!   reinforces what it returns, so a fact asked about twice was practised once — which is
//!   what separates a forgetting curve from a deletion policy.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::policy::Policy;
use crate::{FeedbackTarget, NewMemory, Outcome, Result, Status, Tier, Timestamp, VirtualClock};
use crate::{RecallRequest, Scope};
use crate::{Runtime, RuntimeConfig};

use super::workload::{PlantKind, START, Step, Workload};

/// The namespace every simulated agent shares.
pub const NAMESPACE: &str = "lab";

const DAY: i64 = 86_400_000;

/// Importance an agent gives a lesson it writes down (agents flag what they learned).
const LESSON_IMPORTANCE: f32 = 10.0;

/// How a run is done.
#[derive(Debug, Clone, Copy)]
pub struct RunOptions {
    /// Memories each probe looks at.
    pub k: usize,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions { k: 10 }
    }
}

/// One probe's outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeOutcome {
    /// When it was asked.
    pub at: Timestamp,
    /// The plant asked about.
    pub plant: usize,
    /// The expected memory was in the top `k` (for trivia: it was still there).
    pub hit: bool,
    /// A superseded fact's old value ranked above its newer one, or came back alone.
    pub stale: bool,
}

/// The store at the end of a simulated day.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DaySample {
    /// Days since the start.
    pub day: u32,
    /// Records in the store (every tier and status).
    pub records: u64,
    /// Archived records among them.
    pub archived: u64,
    /// Knowledge records.
    pub knowledge: u64,
}

/// Everything one policy's run produced. The measured times are apart from the rest, which
/// follows from the workload and the policy alone.
#[derive(Debug, Clone)]
pub struct PolicyRun {
    /// The policy's name.
    pub name: String,
    /// Its content hash.
    pub hash: String,
    /// Every probe, in time order.
    pub probes: Vec<ProbeOutcome>,
    /// One sample per simulated day.
    pub days: Vec<DaySample>,
    /// Lesson plants whose code a knowledge record holds.
    pub promoted: BTreeSet<usize>,
    /// Events written.
    pub events: u64,
    /// Wall time of each probe's recall, in milliseconds (measured).
    pub recall_ms: Vec<f64>,
    /// Wall time of the whole run, in seconds (measured).
    pub wall_s: f64,
}

/// Runs `policy` over `workload` in a fresh store under `dir`; `progress` is told how many
/// steps are done now and then.
pub async fn run(
    workload: &Workload,
    policy: Policy,
    dir: &Path,
    options: RunOptions,
    mut progress: impl FnMut(u64),
) -> Result<PolicyRun> {
    let started = Instant::now();
    let clock = Arc::new(VirtualClock::new(START));
    let mut config = RuntimeConfig::new(dir);
    config.substrate.clock = clock.clone();
    config.substrate.policy = policy.clone();
    config.decay_check = None;
    config.index_tick = Duration::from_secs(365 * 86_400);
    config.age_trigger = false;
    config.session_idle = Duration::from_secs(2);
    config.call_timeout = Duration::from_secs(300);
    let rt = Runtime::open(config).await?;

    let interval = policy
        .forgetting
        .interval
        .map(|d| (d.as_millis() as i64).max(DAY));
    let max_age = policy.condensation.max_age.map(|d| d.as_millis() as i64);
    let mut next_decay = interval.map(|i| START + i.max(1));
    let mut next_day = START + DAY;
    let mut aged: BinaryHeap<Reverse<(Timestamp, usize)>> = BinaryHeap::new();
    let mut told: Vec<u32> = vec![0; workload.plants.len()];
    let mut run = PolicyRun {
        name: policy.name.clone(),
        hash: policy.hash.clone(),
        probes: Vec::with_capacity(workload.probes.len()),
        days: Vec::new(),
        promoted: BTreeSet::new(),
        events: 0,
        recall_ms: Vec::with_capacity(workload.probes.len()),
        wall_s: 0.0,
    };
    let mut steps = 0u64;
    let mut now = START;
    for step in workload.timeline() {
        let at = step.at(workload).max(now);
        // What falls due before this step, in time order.
        loop {
            let due_aged = aged.peek().map(|Reverse((t, _))| *t);
            let next = [Some(next_day), next_decay, due_aged]
                .into_iter()
                .flatten()
                .min()
                .unwrap_or(i64::MAX);
            if next > at {
                break;
            }
            now = next;
            clock.set(now);
            if next == next_day {
                let day = ((next_day - START) / DAY) as u32;
                run.days.push(end_of_day(&rt, day).await?);
                next_day += DAY;
            } else if Some(next) == next_decay {
                rt.decay_now().await?;
                next_decay = interval.map(|i| next + i.max(1));
            } else if let Some(Reverse((_, session))) = aged.pop() {
                let id = &workload.sessions[session].id;
                rt.session(NAMESPACE, id)?.condense().await?;
                rt.settle().await?;
            }
        }
        now = at;
        clock.set(now);
        match step {
            Step::Event {
                session,
                event,
                last,
            } => {
                let plan = &workload.sessions[session];
                let handle = rt.session(NAMESPACE, &plan.id)?;
                let agent = format!("agent-{}", plan.agent);
                let mut memory = NewMemory::new(event.kind, event.text.clone());
                memory.agent_id = Some(agent.clone());
                if let Some(p) = event.plant {
                    let plant = &workload.plants[p];
                    let lesson = matches!(plant.kind, PlantKind::GoodLesson | PlantKind::BadLesson);
                    if lesson {
                        memory.importance = Some(LESSON_IMPORTANCE);
                        if told[p] > 0 {
                            // The agent meets the situation again: it uses what it remembers,
                            // and says how that went.
                            let mut ask = RecallRequest::new(NAMESPACE, &plan.id, &plant.query);
                            ask.agent_id = Some(agent.clone());
                            ask.scope = Scope::Namespace;
                            ask.k = options.k;
                            let found = handle.recall_with(ask).await?;
                            // It credits (or blames) what it used: the memories that
                            // held the lesson, not everything the recall returned.
                            let used: Vec<_> = found
                                .memories
                                .iter()
                                .filter(|m| m.record.text.contains(&plant.code))
                                .map(|m| m.record.id)
                                .collect();
                            if !used.is_empty() {
                                let outcome = if plant.kind == PlantKind::GoodLesson {
                                    Outcome::Success
                                } else {
                                    Outcome::Failure
                                };
                                handle
                                    .feedback(FeedbackTarget::Memories(used), outcome)
                                    .await?;
                            }
                        }
                    }
                    told[p] += 1;
                }
                handle.record(memory).await?;
                rt.settle().await?;
                run.events += 1;
                if last && let Some(age) = max_age {
                    aged.push(Reverse((now + age, session)));
                }
            }
            Step::Probe(i) => {
                let probe = &workload.probes[i];
                let plant = &workload.plants[probe.plant];
                let mut ask =
                    RecallRequest::new(NAMESPACE, &format!("prober-{}", probe.agent), &plant.query);
                ask.agent_id = Some(format!("agent-{}", probe.agent));
                ask.scope = Scope::Agent;
                ask.k = options.k;
                let t = Instant::now();
                let found = rt.substrate().recall(&ask).await?;
                run.recall_ms.push(t.elapsed().as_secs_f64() * 1e3);
                let rank = |code: &str| {
                    found
                        .memories
                        .iter()
                        .position(|m| m.record.text.contains(code))
                };
                let (hit, stale) = match plant.kind {
                    PlantKind::Superseded { newer } => {
                        let new = rank(&workload.plants[newer].code);
                        let old = rank(&plant.code);
                        let stale = match (old, new) {
                            (Some(o), Some(n)) => o < n,
                            (Some(_), None) => true,
                            _ => false,
                        };
                        (new.is_some(), stale)
                    }
                    _ => (rank(&plant.code).is_some(), false),
                };
                run.probes.push(ProbeOutcome {
                    at: probe.at,
                    plant: probe.plant,
                    hit,
                    stale,
                });
            }
        }
        steps += 1;
        if steps.is_multiple_of(1_000) {
            progress(steps);
        }
    }
    progress(steps);
    // The last day, then which lessons the knowledge pool holds.
    let day = ((now - START) / DAY) as u32 + 1;
    run.days.push(end_of_day(&rt, day).await?);
    run.promoted = promoted_lessons(&rt, workload)?;
    rt.shutdown().await?;
    run.wall_s = started.elapsed().as_secs_f64();
    Ok(run)
}

/// Builds the indexes (deterministically: the builder's seed follows the content) and
/// samples the store.
async fn end_of_day(rt: &Runtime, day: u32) -> Result<DaySample> {
    let substrate = rt.substrate().clone();
    tokio::task::spawn_blocking(move || substrate.index_pass(true))
        .await
        .map_err(|e| crate::Error::Unavailable {
            what: "the index build".into(),
            message: e.to_string(),
        })??;
    let store = rt.substrate().store();
    Ok(DaySample {
        day,
        records: store.len(),
        archived: store.archived_len(),
        knowledge: store.tier_len(Tier::Knowledge),
    })
}

/// Lesson plants whose code is in an active knowledge record.
fn promoted_lessons(rt: &Runtime, workload: &Workload) -> Result<BTreeSet<usize>> {
    let store = rt.substrate().store();
    let mut texts = Vec::new();
    store.for_each_id(|id| {
        if let Some(r) = store.get_light(id)?
            && r.tier == Tier::Knowledge
            && r.status == Status::Active
        {
            texts.push(r.text);
        }
        Ok(crate::internals::Visit::Continue)
    })?;
    Ok(workload
        .plants
        .iter()
        .enumerate()
        .filter(|(_, p)| matches!(p.kind, PlantKind::GoodLesson | PlantKind::BadLesson))
        .filter(|(_, p)| texts.iter().any(|t| t.contains(&p.code)))
        .map(|(i, _)| i)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::workload::WorkloadSpec;

    fn small() -> Workload {
        Workload::generate(WorkloadSpec {
            agents: 3,
            sessions: 60,
            days: 20,
            events_per_session: 12,
            seed: 42,
        })
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_run_replays_exactly_and_finds_what_was_planted() {
        let w = small();
        let policy = Policy::default_policy();
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let first = run(&w, policy.clone(), a.path(), RunOptions::default(), |_| {})
            .await
            .unwrap();
        let second = run(&w, policy, b.path(), RunOptions::default(), |_| {})
            .await
            .unwrap();
        assert_eq!(first.probes, second.probes);
        assert_eq!(first.days, second.days);
        assert_eq!(first.promoted, second.promoted);
        assert_eq!(first.events, 60 * 12);
        let hits = first.probes.iter().filter(|p| p.hit).count();
        assert!(
            hits * 2 > first.probes.len(),
            "{hits} of {}",
            first.probes.len()
        );
        assert!(first.days.len() >= 20);
    }
}
