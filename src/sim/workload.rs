//! The policy lab's synthetic workload: agents × sessions over a simulated span,
//! each session a stream of typed events with noise, plus **planted items** whose fate is
//! known — facts asked about later, facts superseded by newer ones, lessons that recur and
//! succeed, misleading lessons that recur and fail, and trivia that should fade — and the
//! **probes** (recall queries with expected answers) scheduled through simulated time.
//!
//! Everything follows from [`WorkloadSpec::seed`] through [`SplitMix`], a fixed generator
//! written here (not a crate's), so a seed gives the same workload on every machine and
//! after every dependency upgrade. Only the plan is kept in memory (who, when, which planted
//! items where); a session's noise is generated when the session starts, from its own
//! derived seed, so 10,000 sessions cost the plan, not the events.
//!
//! Planted values carry codes (`KX-4821`) that noise never contains, so whether a recall
//! returned a planted item is a substring test, with no judgement involved.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::Timestamp;

/// What to generate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkloadSpec {
    /// Agents; each session belongs to one (round robin), and probes ask as an agent.
    pub agents: usize,
    /// Sessions in all, spread over the span.
    pub sessions: usize,
    /// The simulated span, in days.
    pub days: u32,
    /// Events per session, planted ones included.
    pub events_per_session: usize,
    /// Everything follows from this.
    pub seed: u64,
}

/// The simulated clock's start: 2026-01-01T00:00:00Z.
pub const START: Timestamp = 1_767_225_600_000;

const MINUTE: i64 = 60_000;
const HOUR: i64 = 60 * MINUTE;
const DAY: i64 = 24 * HOUR;

/// SplitMix64: a tiny, well-known generator with a fixed output for a fixed seed.
#[derive(Debug, Clone)]
pub struct SplitMix(u64);

impl SplitMix {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }

    /// A number in `lo..=hi`.
    pub fn between(&mut self, lo: i64, hi: i64) -> i64 {
        lo + self.below((hi - lo + 1).max(1) as u64) as i64
    }

    /// One of `items`.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }

    /// A generator for a sub-stream (a session's noise), independent of this one's order.
    pub fn derive(seed: u64, stream: u64) -> Self {
        let mut g = SplitMix(seed ^ stream.wrapping_mul(0xD6E8_FEB8_6659_FD93));
        g.next_u64();
        g
    }
}

/// What a planted item is, and so what its probes expect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlantKind {
    /// A fact told once and asked about later: recall should bring it back.
    Fact,
    /// A fact replaced by a newer value (`plants[newer]`): recall should rank the newer
    /// one, and bringing back this one alone is a superseded-fact error.
    Superseded {
        /// Index of the plant holding the newer value.
        newer: usize,
    },
    /// A lesson told in several sessions that works each time: promotion should admit it.
    GoodLesson,
    /// A lesson told in several sessions that fails each time: promotion should refuse it.
    BadLesson,
    /// Chit-chat nobody asks about again on purpose: forgetting may drop it.
    Trivia,
}

/// A planted item: its text, its unique code, where it is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plant {
    /// What it is.
    pub kind: PlantKind,
    /// The event text as written.
    pub text: String,
    /// The code only this plant's text contains (how a recall is checked).
    pub code: String,
    /// The query a probe for it asks.
    pub query: String,
    /// The sessions it is told in (one, or several for lessons), by index.
    pub sessions: Vec<usize>,
}

/// A recall with a known answer, at a simulated time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    /// When it is asked.
    pub at: Timestamp,
    /// The agent asking (its recall is namespace-wide, as an agent's memory is).
    pub agent: usize,
    /// The plant asked about.
    pub plant: usize,
}

/// One planned session: who, when, and which planted items it tells.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionPlan {
    /// `agent-{a}-s{i}`.
    pub id: String,
    /// The agent.
    pub agent: usize,
    /// When its first event happens.
    pub start: Timestamp,
    /// Planted items it tells, by plant index.
    pub plants: Vec<usize>,
}

/// One event as the runner sends it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimEvent {
    /// Its event time.
    pub at: Timestamp,
    /// `goal`, `action`, `observation`, `thought` or `user_message`.
    pub kind: &'static str,
    /// Its text.
    pub text: String,
    /// The plant it tells, if any.
    pub plant: Option<usize>,
}

/// The whole plan of a run.
#[derive(Debug, Clone)]
pub struct Workload {
    /// What was asked for.
    pub spec: WorkloadSpec,
    /// Sessions, in start order.
    pub sessions: Vec<SessionPlan>,
    /// Planted items.
    pub plants: Vec<Plant>,
    /// Probes, in time order.
    pub probes: Vec<Probe>,
}

/// Minutes between a session's events: 1 to 6.
const EVENT_GAP: (i64, i64) = (MINUTE, 6 * MINUTE);

const COMPONENTS: [&str; 16] = [
    "billing API",
    "search index",
    "payment gateway",
    "login page",
    "nightly backup",
    "report builder",
    "mobile app",
    "data warehouse",
    "message queue",
    "cache cluster",
    "invoice service",
    "admin console",
    "email sender",
    "web frontend",
    "auth proxy",
    "export job",
];
const ACTIONS: [&str; 10] = [
    "restarted",
    "redeployed",
    "profiled",
    "rolled back",
    "scaled up",
    "patched",
    "reconfigured",
    "inspected",
    "load-tested",
    "migrated",
];
const OBSERVATIONS: [&str; 10] = [
    "returned 200 in {n} ms",
    "logged {n} warnings",
    "used {n} MB of memory",
    "answered {n} requests per second",
    "queued {n} jobs",
    "dropped {n} connections",
    "took {n} seconds to start",
    "retried {n} times",
    "reported {n} errors",
    "served {n} users",
];
const THOUGHTS: [&str; 8] = [
    "maybe the {c} is the bottleneck",
    "I should compare the {c} with last week",
    "the {c} looks healthy for now",
    "next I will look at the {c} metrics",
    "the {c} change can wait until tomorrow",
    "I wonder whether the {c} needs more replicas",
    "the {c} dashboard is confusing",
    "let me write down what I did to the {c}",
];
const ASKS: [&str; 8] = [
    "can you check the {c}?",
    "is the {c} back up?",
    "please summarise the {c} incident",
    "why is the {c} slow today?",
    "what changed in the {c}?",
    "can we ship the {c} fix?",
    "who owns the {c}?",
    "how busy was the {c} yesterday?",
];
const ENTITIES: [&str; 12] = [
    "Acme account",
    "Globex contract",
    "Initech project",
    "Umbrella order",
    "Hooli renewal",
    "Stark invoice",
    "Wayne ticket",
    "Wonka shipment",
    "Tyrell audit",
    "Cyberdyne lease",
    "Soylent pilot",
    "Vandelay import",
];
const ATTRIBUTES: [&str; 6] = [
    "reference code",
    "billing contact code",
    "delivery slot",
    "budget code",
    "room code",
    "escalation code",
];
const SITUATIONS: [&str; 8] = [
    "a deploy fails on a cold cache",
    "the report builder times out",
    "the payment gateway returns 502",
    "the search index lags behind",
    "the login page loops",
    "the nightly backup overruns",
    "the message queue backs up",
    "the export job runs out of memory",
];
const REMEDIES: [&str; 8] = [
    "warm the cache first",
    "split the report by month",
    "retry with exponential backoff",
    "rebuild the index from the store",
    "clear the session cookies",
    "move the backup to the replica",
    "add a consumer",
    "stream the rows in batches",
];
const DECOYS: [&str; 8] = [
    "restart every server at once",
    "disable the timeout",
    "call the vendor hotline",
    "delete the index",
    "turn off authentication",
    "skip the backup",
    "purge the queue",
    "double the memory limit",
];
const TRIVIA: [&str; 6] = [
    "the cafeteria served {x} soup",
    "someone brought {x} cookies",
    "the office plant is called {x}",
    "the meeting room smelled of {x}",
    "the coffee machine played {x}",
    "a courier left a {x} umbrella",
];

/// A plant's code: two letters and four digits, drawn so no two plants share one.
fn code(rng: &mut SplitMix, taken: &mut std::collections::HashSet<String>) -> String {
    loop {
        let c = format!(
            "{}{}-{:04}",
            (b'A' + rng.below(26) as u8) as char,
            (b'A' + rng.below(26) as u8) as char,
            rng.below(10_000)
        );
        if taken.insert(c.clone()) {
            return c;
        }
    }
}

impl Workload {
    /// Plans a run. Counts scale with the spec: one fact per 4 sessions, a quarter of them
    /// superseded later, one trivia item per 4 sessions, and (with at least 6 sessions)
    /// lessons that recur in 3 to 5 sessions each — half good, half misleading.
    pub fn generate(spec: WorkloadSpec) -> Workload {
        let mut rng = SplitMix::new(spec.seed);
        let span = i64::from(spec.days.max(1)) * DAY;
        let agents = spec.agents.max(1);
        let mut starts: Vec<Timestamp> = (0..spec.sessions)
            .map(|_| START + rng.below(span as u64) as i64)
            .collect();
        starts.sort_unstable();
        let mut sessions: Vec<SessionPlan> = starts
            .into_iter()
            .enumerate()
            .map(|(i, start)| {
                let agent = i % agents;
                SessionPlan {
                    id: format!("agent-{agent}-s{i}"),
                    agent,
                    start,
                    plants: Vec::new(),
                }
            })
            .collect();
        let room = spec.events_per_session.saturating_sub(2).max(1);
        let mut plants = Vec::new();
        let mut probes = Vec::new();
        let mut taken = std::collections::HashSet::new();
        let n = sessions.len();
        let has_room = |s: &SessionPlan| s.plants.len() < room;

        // Facts, each asked about once or twice at delays from an hour to a month.
        for _ in 0..n / 4 {
            let s = rng.below(n as u64) as usize;
            if !has_room(&sessions[s]) {
                continue;
            }
            let c = code(&mut rng, &mut taken);
            let entity = rng.pick(&ENTITIES);
            let attribute = rng.pick(&ATTRIBUTES);
            let index = plants.len();
            plants.push(Plant {
                kind: PlantKind::Fact,
                text: format!("note: the {entity} {attribute} is {c}"),
                code: c,
                query: format!("what is the {entity} {attribute}?"),
                sessions: vec![s],
            });
            sessions[s].plants.push(index);
            let told = sessions[s].start + (spec.events_per_session as i64) * EVENT_GAP.1;
            for _ in 0..1 + rng.below(2) {
                let delay = [HOUR, DAY, 7 * DAY, 30 * DAY][rng.below(4) as usize];
                probes.push(Probe {
                    at: told + delay,
                    agent: sessions[s].agent,
                    plant: index,
                });
            }
        }
        // A quarter of the facts get a newer value in a later session of the same agent;
        // the probe comes after the newer one.
        let facts: Vec<usize> = (0..plants.len()).collect();
        for &old in facts.iter().step_by(4) {
            let s_old = plants[old].sessions[0];
            let agent = sessions[s_old].agent;
            let later: Vec<usize> = (s_old + 1..n)
                .filter(|&s| sessions[s].agent == agent && has_room(&sessions[s]))
                .collect();
            if later.is_empty() {
                continue;
            }
            let s_new = later[rng.below(later.len() as u64) as usize];
            let c = code(&mut rng, &mut taken);
            let subject = plants[old]
                .text
                .trim_start_matches("note: the ")
                .rsplit_once(" is ")
                .map_or_else(String::new, |(s, _)| s.to_string());
            let newer = plants.len();
            plants.push(Plant {
                kind: PlantKind::Fact,
                text: format!("update: the {subject} is now {c}"),
                code: c,
                query: plants[old].query.clone(),
                sessions: vec![s_new],
            });
            sessions[s_new].plants.push(newer);
            plants[old].kind = PlantKind::Superseded { newer };
            // Its own probes now expect the newer value, asked after it was told.
            let told = sessions[s_new].start + (spec.events_per_session as i64) * EVENT_GAP.1;
            for p in probes.iter_mut().filter(|p| p.plant == old) {
                p.at = p.at.max(told + HOUR);
            }
        }
        // Lessons: each told in 3–5 sessions of different agents where possible.
        if n >= 6 {
            for l in 0..(n / 20).clamp(2, 16) {
                let good = l % 2 == 0;
                let situation = SITUATIONS[l % SITUATIONS.len()];
                let remedy = if good {
                    REMEDIES[l % REMEDIES.len()]
                } else {
                    DECOYS[l % DECOYS.len()]
                };
                let c = code(&mut rng, &mut taken);
                let want = 3 + rng.below(3) as usize;
                let mut told_in = Vec::new();
                for _ in 0..want * 20 {
                    let s = rng.below(n as u64) as usize;
                    // A session learns at most one lesson: one condensed record must not
                    // mix a good lesson with a misleading one.
                    let learned = sessions[s].plants.iter().any(|&q| {
                        matches!(plants[q].kind, PlantKind::GoodLesson | PlantKind::BadLesson)
                    });
                    if has_room(&sessions[s]) && !learned && !told_in.contains(&s) {
                        told_in.push(s);
                        if told_in.len() == want {
                            break;
                        }
                    }
                }
                told_in.sort_unstable();
                let index = plants.len();
                plants.push(Plant {
                    kind: if good {
                        PlantKind::GoodLesson
                    } else {
                        PlantKind::BadLesson
                    },
                    text: format!("when {situation}, {remedy} (runbook {c})"),
                    code: c,
                    query: format!("what to do when {situation}?"),
                    sessions: told_in.clone(),
                });
                for s in told_in {
                    sessions[s].plants.push(index);
                }
            }
        }
        // Trivia, asked about once much later (a forgetting policy may have dropped it).
        for _ in 0..n / 4 {
            let s = rng.below(n as u64) as usize;
            if !has_room(&sessions[s]) {
                continue;
            }
            let c = code(&mut rng, &mut taken);
            let template = rng.pick(&TRIVIA);
            let index = plants.len();
            plants.push(Plant {
                kind: PlantKind::Trivia,
                text: template.replace("{x}", &c),
                code: c,
                query: template.replace("{x}", "what"),
                sessions: vec![s],
            });
            sessions[s].plants.push(index);
            probes.push(Probe {
                at: sessions[s].start + 30 * DAY,
                agent: sessions[s].agent,
                plant: index,
            });
        }
        probes.sort_by_key(|p| (p.at, p.plant));
        Workload {
            spec,
            sessions,
            plants,
            probes,
        }
    }

    /// The events of session `index`, in time order: a goal first, then noise with the
    /// session's planted items at positions drawn from its own seed.
    pub fn events(&self, index: usize) -> Vec<SimEvent> {
        let plan = &self.sessions[index];
        let mut rng = SplitMix::derive(self.spec.seed, index as u64 + 1);
        let n = self.spec.events_per_session.max(1);
        let focus = *rng.pick(&COMPONENTS);
        let mut slots: Vec<Option<usize>> = vec![None; n];
        for &p in &plan.plants {
            // Slot 0 is the goal; a planted item takes a free slot after it.
            let free: Vec<usize> = (1..n).filter(|&i| slots[i].is_none()).collect();
            if let Some(&i) = free.get(rng.below(free.len() as u64) as usize) {
                slots[i] = Some(p);
            }
        }
        let mut at = plan.start;
        let mut events = Vec::with_capacity(n);
        for (i, slot) in slots.into_iter().enumerate() {
            if i > 0 {
                at += rng.between(EVENT_GAP.0, EVENT_GAP.1);
            }
            let (kind, text) = match slot {
                Some(p) => {
                    let kind = match self.plants[p].kind {
                        PlantKind::Trivia => "user_message",
                        PlantKind::GoodLesson | PlantKind::BadLesson => "thought",
                        _ => "observation",
                    };
                    (kind, self.plants[p].text.clone())
                }
                None if i == 0 => ("goal", format!("keep the {focus} healthy this week")),
                None => noise(&mut rng, focus),
            };
            events.push(SimEvent {
                at,
                kind,
                text,
                plant: slot,
            });
        }
        events
    }
}

/// One noise event about the session's focus (or, now and then, another component).
fn noise(rng: &mut SplitMix, focus: &str) -> (&'static str, String) {
    let c = if rng.below(4) == 0 {
        *rng.pick(&COMPONENTS)
    } else {
        focus
    };
    let n = rng.between(2, 990).to_string();
    match rng.below(4) {
        0 => ("action", format!("{} the {c}", rng.pick(&ACTIONS))),
        1 => (
            "observation",
            format!("the {c} {}", rng.pick(&OBSERVATIONS).replace("{n}", &n)),
        ),
        2 => ("thought", rng.pick(&THOUGHTS).replace("{c}", c)),
        _ => ("user_message", rng.pick(&ASKS).replace("{c}", c)),
    }
}

/// What happens next in a run, in time order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Session `session`'s event.
    Event {
        /// The session's index.
        session: usize,
        /// The event.
        event: SimEvent,
        /// The session's last event: the runner may condense it now.
        last: bool,
    },
    /// Probe `index` of [`Workload::probes`].
    Probe(usize),
}

impl Step {
    /// When it happens.
    pub fn at(&self, w: &Workload) -> Timestamp {
        match self {
            Step::Event { event, .. } => event.at,
            Step::Probe(i) => w.probes[*i].at,
        }
    }
}

/// Every event and probe of a workload in time order, with sessions generated as they
/// start and dropped as they end (ties: events before probes, then by session index).
pub struct Timeline<'w> {
    workload: &'w Workload,
    next_session: usize,
    next_probe: usize,
    /// Running sessions by the time of their next event: (time, session, position).
    running: BinaryHeap<Reverse<(Timestamp, usize, usize)>>,
    events: std::collections::HashMap<usize, Vec<SimEvent>>,
}

impl Workload {
    /// The run's steps in time order.
    pub fn timeline(&self) -> Timeline<'_> {
        Timeline {
            workload: self,
            next_session: 0,
            next_probe: 0,
            running: BinaryHeap::new(),
            events: std::collections::HashMap::new(),
        }
    }
}

impl Iterator for Timeline<'_> {
    type Item = Step;

    fn next(&mut self) -> Option<Step> {
        let w = self.workload;
        // Start every session whose first event is due before the earliest running one.
        loop {
            let running = self.running.peek().map(|Reverse((t, _, _))| *t);
            let Some(plan) = w.sessions.get(self.next_session) else {
                break;
            };
            if running.is_some_and(|t| t < plan.start) {
                break;
            }
            let events = w.events(self.next_session);
            if let Some(first) = events.first() {
                self.running.push(Reverse((first.at, self.next_session, 0)));
                self.events.insert(self.next_session, events);
            }
            self.next_session += 1;
        }
        let event_at = self.running.peek().map(|Reverse((t, _, _))| *t);
        let probe_at = w.probes.get(self.next_probe).map(|p| p.at);
        match (event_at, probe_at) {
            (None, None) => None,
            (Some(e), Some(p)) if p < e => self.probe(),
            (None, Some(_)) => self.probe(),
            _ => {
                let Reverse((_, session, position)) = self.running.pop()?;
                let events = self.events.get(&session)?;
                let event = events[position].clone();
                let last = position + 1 == events.len();
                if last {
                    self.events.remove(&session);
                } else {
                    let at = events[position + 1].at;
                    self.running.push(Reverse((at, session, position + 1)));
                }
                Some(Step::Event {
                    session,
                    event,
                    last,
                })
            }
        }
    }
}

impl Timeline<'_> {
    fn probe(&mut self) -> Option<Step> {
        let i = self.next_probe;
        self.next_probe += 1;
        Some(Step::Probe(i))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(seed: u64) -> WorkloadSpec {
        WorkloadSpec {
            agents: 4,
            sessions: 200,
            days: 30,
            events_per_session: 20,
            seed,
        }
    }

    fn fingerprint(w: &Workload) -> Vec<String> {
        w.timeline()
            .map(|s| match s {
                Step::Event { session, event, .. } => {
                    format!("{} {session} {} {}", event.at, event.kind, event.text)
                }
                Step::Probe(i) => format!("{} probe {}", w.probes[i].at, w.probes[i].plant),
            })
            .collect()
    }

    #[test]
    fn a_seed_gives_the_same_workload_and_another_seed_another() {
        let a = Workload::generate(spec(7));
        let b = Workload::generate(spec(7));
        assert_eq!(fingerprint(&a), fingerprint(&b));
        assert_eq!(a.plants, b.plants);
        let c = Workload::generate(spec(8));
        assert_ne!(fingerprint(&a), fingerprint(&c));
    }

    #[test]
    fn the_timeline_is_in_time_order_and_has_every_event_and_probe_once() {
        let w = Workload::generate(spec(1));
        let steps: Vec<Step> = w.timeline().collect();
        let times: Vec<Timestamp> = steps.iter().map(|s| s.at(&w)).collect();
        assert!(times.windows(2).all(|p| p[0] <= p[1]), "out of order");
        let events = steps
            .iter()
            .filter(|s| matches!(s, Step::Event { .. }))
            .count();
        assert_eq!(events, 200 * 20);
        let lasts = steps
            .iter()
            .filter(|s| matches!(s, Step::Event { last: true, .. }))
            .count();
        assert_eq!(lasts, 200, "each session ends once");
        let probes = steps.iter().filter(|s| matches!(s, Step::Probe(_))).count();
        assert_eq!(probes, w.probes.len());
        // Every planted item is told where its plan says, once per session.
        for (p, plant) in w.plants.iter().enumerate() {
            for &s in &plant.sessions {
                let told = w.events(s).iter().filter(|e| e.plant == Some(p)).count();
                assert_eq!(told, 1, "plant {p} in session {s}");
            }
        }
    }

    #[test]
    fn planted_items_have_their_ground_truth() {
        let w = Workload::generate(spec(3));
        let count = |f: &dyn Fn(&PlantKind) -> bool| w.plants.iter().filter(|p| f(&p.kind)).count();
        assert!(count(&|k| *k == PlantKind::Fact) >= 30);
        assert!(count(&|k| matches!(k, PlantKind::Superseded { .. })) >= 5);
        assert!(count(&|k| *k == PlantKind::Trivia) >= 30);
        assert_eq!(count(&|k| *k == PlantKind::GoodLesson), 5);
        assert_eq!(count(&|k| *k == PlantKind::BadLesson), 5);
        let told = |p: usize| w.sessions[w.plants[p].sessions[0]].start;
        for (i, plant) in w.plants.iter().enumerate() {
            // Codes are unique and only in their own plant's text.
            assert_eq!(
                w.plants
                    .iter()
                    .filter(|q| q.text.contains(&plant.code))
                    .count(),
                1
            );
            match plant.kind {
                PlantKind::Superseded { newer } => {
                    assert!(told(newer) > told(i), "the newer value comes later");
                    assert_eq!(w.plants[newer].query, plant.query);
                    for probe in w.probes.iter().filter(|p| p.plant == i) {
                        assert!(probe.at > told(newer), "asked after the update");
                    }
                }
                PlantKind::GoodLesson | PlantKind::BadLesson => {
                    assert!(plant.sessions.len() >= 3, "a lesson recurs: {plant:?}");
                }
                _ => {}
            }
        }
        for probe in &w.probes {
            assert!(
                probe.at > told(probe.plant),
                "a probe follows what it asks about"
            );
        }
        // Noise never carries a plant's code.
        for s in 0..w.sessions.len() {
            for e in w.events(s).iter().filter(|e| e.plant.is_none()) {
                assert!(
                    !w.plants.iter().any(|p| e.text.contains(&p.code)),
                    "{}",
                    e.text
                );
            }
        }
    }
}
