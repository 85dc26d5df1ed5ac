//! Facts that change, on the write path's background side: records written under a policy
//! whose `[updates]` section is on are queued ([`Queue::Updates`]) in the same write that
//! stores them, and a detection round compares each with its nearest older records in
//! scope ([`crate::updates::compare`]) once it has its embedding. The ack never waits for
//! it; a crash loses nothing, since the queue item goes in the same write as the findings.
//!
//! What a finding writes:
//! - **supersedes**: an edge newer → older, and the older record's validity
//!   (`superseded_by`, `valid_until` = the newer event time, `learned_at` = now); recall
//!   demotes it and says so;
//! - **contradicts** (incompatible claims without a clear order: the same event time in
//!   two sessions, or the older record reinforced since the newer was written): an edge and
//!   an open conflict on both records, until someone resolves it;
//! - **duplicate**: the older record is reinforced, the newer is marked as its repeat.
//!
//! Each is audited on both records, with the reason in words, by `updates:<mode>`.
//!
//! A namespace spread over several stores by session (a cluster placed by session,
//! docs/cluster-placement.md) is compared as one store holding every record: beyond the
//! session, a record's round also asks the other parts for their nearest records recorded
//! before it ([`PartAsk::Neighbours`](crate::PartAsk)), and sends each the sides of the
//! pairs it found that fall on its records ([`PartAsk::Marks`](crate::PartAsk)) before
//! writing its own. A pair across two parts is decided once, by the record recorded later.
//! Detection runs after each keyword indexing pass ([`Substrate::index_step`]), so both
//! schedulers — the substrate's own indexer thread and the runtime's Indexer actor — run
//! it without knowing about it.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::{PartLink, Substrate};
use crate::clock::Timestamp;
use crate::error::{Error, Result};
use crate::model::{
    AuditAction, AuditEntry, Edge, MemoryId, MemoryRecord, Reinforce, Relation, Tier,
};
use crate::policy::{Policy, UpdatesMode, UpdatesScope};
use crate::store::{Filter, Mutation, Queue, Reinforcement, Validity, ValidityChange, WriteSet};
use crate::updates::{Change, Claims, Finding, compare};

/// How many queued records one scheduled round takes: about a tenth of a second of
/// searches and comparisons (about half a millisecond per record on BEAM).
const ROUND: usize = 256;

/// How many records waiting for an embedding a part reads to tell whether a record of
/// another part must wait for one of them ([`Substrate::older_here`]); past it, all wait.
const PENDING_SCAN: usize = 4096;

/// Bytes of embeddings one ask to another part carries at most (a NATS message is limited
/// to 1 MiB by default).
const PROBE_BYTES: usize = 256 * 1024;

/// What one detection round did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UpdatesRound {
    /// Records compared with their neighbours (and taken off the queue).
    pub compared: usize,
    /// Records left queued because their embedding is not stored yet.
    pub waiting: usize,
    /// Supersessions found.
    pub superseded: usize,
    /// Contradictions found.
    pub contradicted: usize,
    /// Repeats found.
    pub repeated: usize,
    /// Pairs an LLM judge decided.
    pub judged: usize,
    /// Pairs that went to the rules because the judge could not decide them (missing,
    /// failed, over budget, or an unusable answer).
    pub fell_back: usize,
}

/// A pair as the LLM judge sees it: which record is newer, and what the rules made of it.
#[derive(Debug, Clone, PartialEq)]
pub struct PairItem {
    /// The newer record's text.
    pub newer: String,
    /// The older record's text.
    pub older: String,
    /// Their embeddings' cosine similarity.
    pub similarity: f32,
    /// What the rules decided (the fallback).
    pub rules: Change,
}

/// One call's worth of pairs, all of one namespace.
#[derive(Debug, Clone, Copy)]
pub struct PairBatch<'a> {
    /// The namespace the records belong to (budgets are per namespace).
    pub namespace: &'a str,
    /// The pairs.
    pub items: &'a [PairItem],
    /// Runtime-clock time of the call (the token budget's hours follow this clock).
    pub now: Timestamp,
}

/// The judge's decision about one pair, or why the rules decide it.
pub type PairVerdict = std::result::Result<Finding, String>;

/// Decides what newer records are to older ones (an LLM, or anything else): the judge of
/// `[updates] mode = "llm"` and `"hybrid"`.
#[async_trait]
pub trait UpdateJudge: Send + Sync + std::fmt::Debug {
    /// Short name for the audit log (`llm:qwen2.5`).
    fn name(&self) -> &str;
    /// One verdict per pair, in order. An `Err` verdict leaves that pair to the rules with
    /// the reason audited; an error leaves the whole batch to them.
    async fn judge(&self, batch: PairBatch<'_>) -> Result<Vec<PairVerdict>>;
}

/// A pair a round decides about.
struct Pair {
    newer: MemoryRecord,
    older: MemoryRecord,
    similarity: f32,
    rules: Finding,
    policy: Arc<Policy>,
    /// The part holding one of the two, when another part does (placed by session).
    there: Option<Arc<dyn PartLink>>,
}

/// A record compared with another: the other, their similarity, and the part holding it
/// (`None`: this store).
type Neighbour = (MemoryRecord, f32, Option<Arc<dyn PartLink>>);

/// A part's answer about one probe ([`Substrate::older_here`]): whether it waits, and its
/// older neighbours there with their similarity.
pub(in crate::engine) type OlderThere = (bool, Vec<(MemoryRecord, f32)>);

/// A record's nearest older neighbours held by other parts ([`Substrate::older_elsewhere`]).
#[derive(Default)]
struct Elsewhere {
    /// One of its part's older records in scope is still to be embedded.
    pending: bool,
    /// Records, their similarity and the part holding them.
    near: Vec<Neighbour>,
}

/// A record about to be compared, as another part is asked for its older neighbours
/// ([`PartAsk::Neighbours`](crate::PartAsk)).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UpdateProbe {
    embedding: Vec<f32>,
    tier: Tier,
    /// The agent whose records are in scope (`[updates] scope = "agent"`), or the whole
    /// namespace.
    agent: Option<String>,
    /// Its recorded time and id: the neighbours answered were recorded before it.
    recorded: (Timestamp, MemoryId),
}

/// The session or the agent whose records `record` is compared with (`(None, None)`: the
/// namespace's), as its policy's `[updates] scope` says: an agent's scope without an agent
/// is its session's.
fn scope_of<'a>(record: &'a MemoryRecord, policy: &Policy) -> (Option<&'a str>, Option<&'a str>) {
    match (policy.updates.scope, record.agent_id.as_deref()) {
        (UpdatesScope::Namespace, _) => (None, None),
        (UpdatesScope::Agent, Some(agent)) => (None, Some(agent)),
        (UpdatesScope::Session | UpdatesScope::Agent, _) => {
            (Some(record.session_id.as_str()), None)
        }
    }
}

impl UpdateProbe {
    fn of(record: &MemoryRecord, policy: &Policy) -> UpdateProbe {
        UpdateProbe {
            embedding: record.embedding.clone().unwrap_or_default(),
            tier: record.tier,
            agent: scope_of(record, policy).1.map(str::to_string),
            recorded: (record.recorded_time, record.id),
        }
    }
}

/// `at` (indexes into `ready`) in chunks whose embeddings stay within [`PROBE_BYTES`].
fn probe_chunks(ready: &[(MemoryRecord, Arc<Policy>)], at: &[usize]) -> Vec<Vec<usize>> {
    let mut chunks: Vec<Vec<usize>> = Vec::new();
    let mut bytes = 0;
    for &i in at {
        let size = 4 * ready[i].0.embedding.as_ref().map_or(0, Vec::len);
        match chunks.last_mut() {
            Some(chunk) if bytes + size <= PROBE_BYTES => {
                chunk.push(i);
                bytes += size;
            }
            _ => {
                chunks.push(vec![i]);
                bytes = size;
            }
        }
    }
    chunks
}

/// One record's side of what was found about a pair: what is written on it (the newer
/// record's side, or the older's), the pair's edge with it. A pair across two parts sends
/// the other part its side ([`PartAsk::Marks`](crate::PartAsk)), which writes it once
/// however often it is sent.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UpdateMark {
    change: Change,
    newer: MemoryId,
    /// The newer record's event time (when the older stopped being true).
    newer_time: Timestamp,
    older: MemoryId,
    /// Written on the newer record (else on the older).
    on_newer: bool,
    by: String,
    reason: String,
    at: Timestamp,
}

impl UpdateMark {
    /// The record it is written on.
    fn on(&self) -> MemoryId {
        if self.on_newer {
            self.newer
        } else {
            self.older
        }
    }

    /// What is audited on the record: the action and the detail, whose start up to the
    /// reason (`"superseded by 12 ("`) says it was written already.
    fn audit(&self) -> Option<(AuditAction, String)> {
        let (newer, older, reason) = (self.newer, self.older, &self.reason);
        Some(match (self.change, self.on_newer) {
            (Change::Supersedes, false) => (
                AuditAction::Superseded,
                format!("superseded by {newer} ({reason})"),
            ),
            (Change::Supersedes, true) => (
                AuditAction::Superseded,
                format!("supersedes {older} ({reason})"),
            ),
            (Change::Contradicts, on_newer) => {
                let with = if on_newer { older } else { newer };
                (
                    AuditAction::Contradicted,
                    format!("in conflict with {with} ({reason})"),
                )
            }
            (Change::Duplicate, true) => {
                (AuditAction::Repeated, format!("repeats {older} ({reason})"))
            }
            (Change::Duplicate, false) => (
                AuditAction::Repeated,
                format!("repeated by {newer} ({reason})"),
            ),
            (Change::Unrelated, _) => return None,
        })
    }

    /// What it writes in `namespace`'s store under `policy`, with the pair's edge when
    /// `edge` (each store holding one of the two keeps it; one holding both, once).
    fn writes(&self, namespace: &str, policy: &Arc<Policy>, edge: bool) -> Vec<Mutation> {
        let Some((action, detail)) = self.audit() else {
            return Vec::new();
        };
        let on = self.on();
        let mut out = Vec::new();
        let relation = match self.change {
            Change::Supersedes => Some(Relation::Supersedes),
            Change::Contradicts => Some(Relation::Contradicts),
            Change::Duplicate | Change::Unrelated => None,
        };
        if let Some(relation) = relation.filter(|_| edge) {
            out.push(Mutation::PutEdge(
                namespace.to_string(),
                Edge {
                    from: self.newer,
                    to: self.older,
                    relation,
                },
            ));
        }
        let other = if self.on_newer {
            self.older
        } else {
            self.newer
        };
        match (self.change, self.on_newer) {
            (Change::Supersedes, false) => out.push(Mutation::Validity(
                on,
                ValidityChange::SupersededBy {
                    by: self.newer,
                    until: self.newer_time,
                    at: self.at,
                },
            )),
            (Change::Contradicts, _) => out.push(Mutation::Validity(
                on,
                ValidityChange::Conflict {
                    with: other,
                    open: true,
                },
            )),
            (Change::Duplicate, true) => out.push(Mutation::Validity(
                on,
                ValidityChange::DuplicateOf(self.older),
            )),
            _ => {}
        }
        out.push(Mutation::Audit(
            on,
            AuditEntry {
                at: self.at,
                action,
                by: self.by.clone(),
                detail,
            },
        ));
        if let (Change::Duplicate, false) = (self.change, self.on_newer) {
            // Stating a fact again is evidence that it matters, as a recall is.
            out.push(Mutation::Reinforce {
                id: on,
                reinforcement: Reinforcement {
                    curve: Arc::clone(policy) as Arc<dyn Reinforce>,
                    at: self.at,
                    amount: policy.scoring.reinforce_on_recall,
                },
                by: format!("{} (repeated by {})", self.by, self.newer),
            });
        }
        out
    }
}

impl Pair {
    /// Whether the judge is asked about it (else the rules' finding stands).
    fn asks_judge(&self) -> bool {
        match self.policy.updates.mode {
            UpdatesMode::Llm => true,
            UpdatesMode::Hybrid => self.rules.change == Change::Unrelated,
            UpdatesMode::Off | UpdatesMode::Rules => false,
        }
    }
}

/// What a round found to decide, and the queue items it takes.
#[derive(Default)]
struct Plan {
    writes: WriteSet,
    pairs: Vec<Pair>,
    round: UpdatesRound,
}

/// How a pair was decided.
enum Decided {
    /// By the rules, as the policy asks.
    Rules,
    /// By the judge of this name.
    Judge(String),
    /// By the rules, because the judge could not (why).
    FellBack(String),
}

impl Substrate {
    /// Compares up to `max` queued records (oldest first) with their nearest older records
    /// by the rules and writes what it finds (see the module docs). Records still waiting
    /// for their embedding stay queued for a later round. Policies in `llm` or `hybrid`
    /// mode get the rules here, with the reason audited: the judge is asked only through
    /// [`Substrate::detect_updates_with`].
    pub fn detect_updates(&self, max: usize) -> Result<UpdatesRound> {
        let _one_round = self
            .inner
            .updates_lock
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let mut plan = self.plan_updates(max)?;
        let decided = plan
            .pairs
            .iter()
            .map(|p| match p.asks_judge() {
                true => (
                    p.rules.clone(),
                    Decided::FellBack(
                        "no LLM judge is configured ([llm] in the server config)".into(),
                    ),
                ),
                false => (p.rules.clone(), Decided::Rules),
            })
            .collect();
        self.apply_updates(&mut plan, decided)
    }

    /// [`Substrate::detect_updates`] with `judge` asked about the pairs the policy gives it
    /// (`llm`: every pair; `hybrid`: those the rules find nothing in), one call per
    /// namespace. A verdict the judge cannot give leaves its pair to the rules, audited.
    pub async fn detect_updates_with(
        &self,
        judge: &dyn UpdateJudge,
        max: usize,
    ) -> Result<UpdatesRound> {
        // One round at a time; the queue items it takes are written with its findings.
        let _one_round = self.inner.updates_round.lock().await;
        let mut plan = {
            let _sync = self
                .inner
                .updates_lock
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            self.plan_updates(max)?
        };
        let mut decided: Vec<Option<(Finding, Decided)>> = plan
            .pairs
            .iter()
            .map(|p| (!p.asks_judge()).then(|| (p.rules.clone(), Decided::Rules)))
            .collect();
        let mut by_namespace: HashMap<&str, Vec<usize>> = HashMap::new();
        for (i, p) in plan.pairs.iter().enumerate() {
            if decided[i].is_none() {
                by_namespace.entry(&p.newer.namespace).or_default().push(i);
            }
        }
        let now = self.inner.clock.now();
        for (namespace, at) in by_namespace {
            let items: Vec<PairItem> = at
                .iter()
                .map(|&i| {
                    let p = &plan.pairs[i];
                    PairItem {
                        newer: p.newer.text.clone(),
                        older: p.older.text.clone(),
                        similarity: p.similarity,
                        rules: p.rules.change,
                    }
                })
                .collect();
            let verdicts = judge
                .judge(PairBatch {
                    namespace,
                    items: &items,
                    now,
                })
                .await;
            let verdicts: Vec<PairVerdict> = match verdicts {
                Ok(v) if v.len() == items.len() => v,
                Ok(v) => vec![
                    Err(format!(
                        "the judge answered {} verdicts for {} pairs",
                        v.len(),
                        items.len()
                    ));
                    items.len()
                ],
                Err(e) => vec![Err(e.to_string()); items.len()],
            };
            for (&i, verdict) in at.iter().zip(verdicts) {
                let rules = plan.pairs[i].rules.clone();
                decided[i] = Some(match verdict {
                    Ok(f) => (f, Decided::Judge(judge.name().to_string())),
                    Err(why) => (rules, Decided::FellBack(why)),
                });
            }
        }
        let decided = decided
            .into_iter()
            .map(|d| d.unwrap_or_else(|| unreachable!("every pair is decided above")))
            .collect();
        let _sync = self
            .inner
            .updates_lock
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        self.apply_updates(&mut plan, decided)
    }

    /// Reads up to `max` queued records and their neighbours: the pairs to decide and the
    /// queue items to take.
    fn plan_updates(&self, max: usize) -> Result<Plan> {
        let store = &self.inner.store;
        let ids = store.queued(Queue::Updates, max)?;
        let mut plan = Plan::default();
        if ids.is_empty() {
            return Ok(plan);
        }
        // The older records' vectors must be searchable, even those still in the tails.
        self.catch_up()?;
        // Compared in this round: their queue items go with this write, so a newer record
        // later in the round must not take them for ones still waiting.
        let mut done: HashSet<MemoryId> = HashSet::new();
        let mut ready: Vec<(MemoryRecord, Arc<Policy>)> = Vec::new();
        for id in ids {
            let Some(record) = store.get(id)? else {
                plan.writes.push(Mutation::Dequeue(Queue::Updates, id));
                continue;
            };
            let policy = self.policy_for(&record.namespace);
            let u = &policy.updates;
            if record.embedding.is_none() {
                if u.on() && store.is_queued(Queue::Enrich, id)? {
                    plan.round.waiting += 1;
                } else {
                    plan.writes.push(Mutation::Dequeue(Queue::Updates, id));
                }
                continue;
            }
            // The policy was turned off since the record was queued, or the record is too
            // long to state one fact.
            if !u.on() || record.text.len() > u.max_chars as usize {
                plan.writes.push(Mutation::Dequeue(Queue::Updates, id));
                done.insert(id);
                plan.round.compared += 1;
                continue;
            }
            ready.push((record, policy));
        }
        let mut elsewhere = self.older_elsewhere(&ready)?.into_iter();
        for (record, policy) in ready {
            let far = elsewhere.next().unwrap_or_default();
            // An older record in scope held by another part has no embedding yet: this one
            // waits for it, as it decides their pair (see `older_elsewhere`).
            if far.pending {
                plan.round.waiting += 1;
                continue;
            }
            let id = record.id;
            plan.writes.push(Mutation::Dequeue(Queue::Updates, id));
            done.insert(id);
            plan.round.compared += 1;
            let u = &policy.updates;
            let short = |r: &MemoryRecord| r.text.len() <= u.max_chars as usize;
            let embedding = record.embedding.as_deref().unwrap_or_default();
            // Within its tier: a condensed record restates its own sources, and knowledge
            // is checked against knowledge when it is promoted.
            let tier = [record.tier];
            let (session, agent) = scope_of(&record, &policy);
            let mut pool = store.candidates(&Filter {
                namespace: &record.namespace,
                session,
                agent,
                tiers: Some(&tier),
                recallable_only: true,
                ..Filter::default()
            });
            pool.remove(id.0);
            // Long neighbours are passed over: a few more are asked for so that `candidates`
            // short ones are still compared where there are some.
            let hits =
                self.inner
                    .vectors
                    .search(embedding, 4 * u.candidates as usize, Some(&pool))?;
            let mut near: Vec<Neighbour> = Vec::new();
            for (n, similarity) in hits {
                let other_id = MemoryId(n);
                if similarity < u.min_similarity {
                    continue;
                }
                // A neighbour still queued compares itself with this record in its turn.
                if !done.contains(&other_id) && store.is_queued(Queue::Updates, other_id)? {
                    continue;
                }
                let Some(other) = store.get_light(other_id)? else {
                    continue;
                };
                if !short(&other) {
                    continue;
                }
                if near.len() == u.candidates as usize {
                    break;
                }
                near.push((other, similarity, None));
            }
            if !far.near.is_empty() {
                // The nearest over every part, as one store holding them all finds them.
                near.extend(far.near);
                near.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.id.cmp(&b.0.id)));
                near.truncate(u.candidates as usize);
            }
            let claims = Claims::of(&record.text);
            for (other, similarity, there) in near {
                let other_claims = Claims::of(&other.text);
                let mut light = record.clone();
                light.embedding = None;
                let pair = if is_newer(&record, &other) {
                    let rules = compare(&claims, &other_claims, similarity, &u.thresholds);
                    (light, other, rules)
                } else {
                    let rules = compare(&other_claims, &claims, similarity, &u.thresholds);
                    (other, light, rules)
                };
                plan.pairs.push(Pair {
                    newer: pair.0,
                    older: pair.1,
                    similarity,
                    rules: pair.2,
                    policy: Arc::clone(&policy),
                    there,
                });
            }
        }
        Ok(plan)
    }

    /// For each of `ready` (records about to be compared), its nearest older records in
    /// scope held by the other parts of a spread namespace (placed by session), asked of
    /// every part at once; nothing without a spread, or when the scope is the session
    /// (which one part holds whole).
    ///
    /// A pair across two parts is decided once, by the round of the record *recorded*
    /// later (recorded time, then id: an order both parts agree on), which compares it with
    /// the other part's records recorded before it. Those the other part has not embedded
    /// yet cannot be searched, so it says so (`pending`) and this record waits for a later
    /// round. The other part reads what lacks an embedding before it searches, so a record
    /// embedded in between is found by the search.
    fn older_elsewhere(&self, ready: &[(MemoryRecord, Arc<Policy>)]) -> Result<Vec<Elsewhere>> {
        let mut out: Vec<Elsewhere> = ready.iter().map(|_| Elsewhere::default()).collect();
        let Some(spread) = self.inner.spread.as_ref() else {
            return Ok(out);
        };
        let mut by_namespace: Vec<(&str, Vec<usize>)> = Vec::new();
        for (i, (record, policy)) in ready.iter().enumerate() {
            // A session is held whole by one part.
            if scope_of(record, policy).0.is_some() {
                continue;
            }
            match by_namespace
                .iter_mut()
                .find(|(n, _)| *n == record.namespace)
            {
                Some((_, at)) => at.push(i),
                None => by_namespace.push((&record.namespace, vec![i])),
            }
        }
        let mut asks: Vec<(Arc<dyn PartLink>, String, Vec<UpdateProbe>)> = Vec::new();
        let mut asked: Vec<(Arc<dyn PartLink>, Vec<usize>)> = Vec::new();
        for (namespace, at) in by_namespace {
            let parts = spread.others(namespace);
            if parts.is_empty() {
                continue;
            }
            // An ask carries a few hundred KiB of embeddings at most (a NATS message is
            // limited to 1 MiB by default).
            for chunk in probe_chunks(ready, &at) {
                let probes: Vec<UpdateProbe> = chunk
                    .iter()
                    .map(|&i| UpdateProbe::of(&ready[i].0, &ready[i].1))
                    .collect();
                for part in &parts {
                    asks.push((Arc::clone(part), namespace.to_string(), probes.clone()));
                    asked.push((Arc::clone(part), chunk.clone()));
                }
            }
        }
        if asks.is_empty() {
            return Ok(out);
        }
        let answers = self.neighbours_elsewhere(asks)?;
        for ((part, at), answer) in asked.into_iter().zip(answers) {
            for (&i, (pending, near)) in at.iter().zip(answer) {
                out[i].pending |= pending;
                out[i].near.extend(
                    near.into_iter()
                        .map(|(record, similarity)| (record, similarity, Some(Arc::clone(&part)))),
                );
            }
        }
        Ok(out)
    }

    /// The other side of [`Substrate::older_elsewhere`]: for each probe, this store's
    /// records in its scope recorded before it, nearest first (up to the policy's
    /// `candidates`, each short enough and similar enough), and whether one recorded
    /// before it still waits for its embedding (read before the search).
    pub(in crate::engine) fn older_here(
        &self,
        namespace: &str,
        probes: &[UpdateProbe],
    ) -> Result<Vec<OlderThere>> {
        let store = &self.inner.store;
        let policy = self.policy_for(namespace);
        let u = &policy.updates;
        if !u.on() {
            return Ok(probes.iter().map(|_| (false, Vec::new())).collect());
        }
        // What is still to be embedded: read first (see above). Past a few thousand, every
        // probe waits as if one of them were in its scope: the backlog drains first.
        let mut unembedded: Vec<(Tier, Option<String>, (Timestamp, MemoryId))> = Vec::new();
        let queued = store.queued(Queue::Enrich, PENDING_SCAN)?;
        let backlog = queued.len() == PENDING_SCAN;
        if !backlog {
            for id in queued {
                if let Some(r) = store.get_light(id)?
                    && r.namespace == namespace
                {
                    unembedded.push((r.tier, r.agent_id, (r.recorded_time, r.id)));
                }
            }
        }
        self.catch_up()?;
        let mut out = Vec::with_capacity(probes.len());
        for probe in probes {
            let before = |r: &MemoryRecord| (r.recorded_time, r.id) < probe.recorded;
            let pending = backlog
                || unembedded.iter().any(|(tier, agent, at)| {
                    *tier == probe.tier
                        && *at < probe.recorded
                        && (probe.agent.is_none() || *agent == probe.agent)
                });
            let tier = [probe.tier];
            let pool = store.candidates(&Filter {
                namespace,
                agent: probe.agent.as_deref(),
                tiers: Some(&tier),
                recallable_only: true,
                ..Filter::default()
            });
            let hits = self.inner.vectors.search(
                &probe.embedding,
                4 * u.candidates as usize,
                Some(&pool),
            )?;
            let mut near = Vec::new();
            for (n, similarity) in hits {
                if similarity < u.min_similarity || near.len() == u.candidates as usize {
                    continue;
                }
                let Some(other) = store.get_light(MemoryId(n))? else {
                    continue;
                };
                if other.text.len() <= u.max_chars as usize && before(&other) {
                    near.push((other, similarity));
                }
            }
            out.push((pending, near));
        }
        Ok(out)
    }

    /// Writes what was decided about each of the plan's pairs (in order), with its queue
    /// items, in one write.
    fn apply_updates(
        &self,
        plan: &mut Plan,
        decided: Vec<(Finding, Decided)>,
    ) -> Result<UpdatesRound> {
        let store = &self.inner.store;
        let block = store.id_block();
        let now = self.inner.clock.now();
        let mut round = plan.round;
        let mut writes = std::mem::take(&mut plan.writes);
        let mut elsewhere: Vec<(Arc<dyn PartLink>, String, Vec<UpdateMark>)> = Vec::new();
        for (pair, (finding, how)) in plan.pairs.iter().zip(decided) {
            let (newer, older, policy) = (&pair.newer, &pair.older, &pair.policy);
            let mode = policy.updates.mode.as_str();
            let (by, reason) = match how {
                Decided::Rules => ("updates:rules".to_string(), finding.reason.clone()),
                Decided::Judge(name) => {
                    round.judged += 1;
                    (format!("updates:{name}"), finding.reason.clone())
                }
                Decided::FellBack(why) => {
                    round.fell_back += 1;
                    (
                        "updates:rules".to_string(),
                        format!(
                            "{}; rules, as the {mode} judge could not decide: {why}",
                            finding.reason
                        ),
                    )
                }
            };
            let change = match finding.change {
                Change::Supersedes if !clear_order(newer, older) => Change::Contradicts,
                c => c,
            };
            match change {
                Change::Supersedes => round.superseded += 1,
                Change::Contradicts => round.contradicted += 1,
                Change::Duplicate => round.repeated += 1,
                Change::Unrelated => continue,
            }
            let mark = |on_newer: bool| UpdateMark {
                change,
                newer: newer.id,
                newer_time: newer.event_time,
                older: older.id,
                on_newer,
                by: by.clone(),
                reason: reason.clone(),
                at: now,
            };
            let namespace = &newer.namespace;
            // The newer record's side first (the older's for a supersession), the edge
            // with the first side.
            let first = change != Change::Supersedes;
            let Some(part) = &pair.there else {
                writes.0.extend(mark(first).writes(namespace, policy, true));
                writes
                    .0
                    .extend(mark(!first).writes(namespace, policy, false));
                continue;
            };
            let theirs = if block.contains(newer.id.0) {
                older
            } else {
                newer
            };
            let (here, there) = match theirs.id == newer.id {
                true => (mark(false), mark(true)),
                false => (mark(true), mark(false)),
            };
            writes.0.extend(here.writes(namespace, policy, true));
            match elsewhere
                .iter_mut()
                .find(|(p, n, _)| p.ids() == part.ids() && n == namespace)
            {
                Some((_, _, marks)) => marks.push(there),
                None => elsewhere.push((Arc::clone(part), namespace.clone(), vec![there])),
            }
        }
        // The other parts' sides first: written there once however often they are sent,
        // so a failure here (the queue items stay) only sends them again.
        if !elsewhere.is_empty() {
            self.marks_elsewhere(elsewhere)?;
        }
        if !writes.0.is_empty() {
            store.write(writes)?;
        }
        Ok(round)
    }

    /// Runs detection rounds until nothing that can be compared is queued (tests, evals
    /// and `flush`-style callers); records waiting for an embedding are left.
    pub fn detect_all_updates(&self) -> Result<UpdatesRound> {
        let mut total = UpdatesRound::default();
        loop {
            let r = self.detect_updates(ROUND)?;
            if total.add(r) {
                return Ok(total);
            }
        }
    }

    /// [`Substrate::detect_all_updates`] with a judge ([`Substrate::detect_updates_with`]).
    pub async fn detect_all_updates_with(&self, judge: &dyn UpdateJudge) -> Result<UpdatesRound> {
        let mut total = UpdatesRound::default();
        loop {
            let r = self.detect_updates_with(judge, ROUND).await?;
            if total.add(r) {
                return Ok(total);
            }
        }
    }

    /// Says that a runtime asks `judge` rounds from now on (its Evaluator runs them): the
    /// scheduled rules-only rounds stop, so no record of an `llm` or `hybrid` policy is
    /// decided by the rules while a judge could decide it.
    pub fn attach_update_judge(&self) {
        self.inner
            .update_judge
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// One scheduled round, logged; whether more waits to be compared now.
    pub(super) fn updates_step(&self) -> bool {
        if self
            .inner
            .update_judge
            .load(std::sync::atomic::Ordering::Acquire)
        {
            return false;
        }
        match self.detect_updates(ROUND) {
            Ok(r) => {
                if r.superseded + r.contradicted + r.repeated > 0 {
                    tracing::debug!(?r, "updates detected");
                }
                r.compared == ROUND
            }
            Err(crate::error::Error::Closed) => false,
            Err(e) => {
                tracing::warn!(error = %e, "update detection failed; the next pass retries");
                false
            }
        }
    }
}

impl UpdatesRound {
    /// Adds one round's counts (the waiting count is the latest round's); whether that
    /// round compared nothing, so the queue holds nothing more to compare now.
    fn add(&mut self, r: UpdatesRound) -> bool {
        self.compared += r.compared;
        self.superseded += r.superseded;
        self.contradicted += r.contradicted;
        self.repeated += r.repeated;
        self.judged += r.judged;
        self.fell_back += r.fell_back;
        self.waiting = r.waiting;
        r.compared == 0
    }
}

/// How a person settles what was found about a record ([`Substrate::resolve`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution {
    /// This record is right: every record in open conflict with it is superseded by it.
    Keep,
    /// The conflicts are not real (both can hold): they are closed, nothing superseded.
    Dismiss,
    /// It was wrongly taken for superseded: it is current again.
    Reinstate,
}

impl Resolution {
    /// The name used in APIs.
    pub fn as_str(self) -> &'static str {
        match self {
            Resolution::Keep => "keep",
            Resolution::Dismiss => "dismiss",
            Resolution::Reinstate => "reinstate",
        }
    }
}

/// A record's place among the values of its fact ([`Substrate::chain`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Chain {
    /// What is known against it.
    pub validity: Validity,
    /// The records it superseded.
    pub supersedes: Vec<MemoryId>,
    /// The newer values after it, oldest first: its `superseded_by`, what superseded that,
    /// and so on to the current one.
    pub newer: Vec<MemoryId>,
}

/// Longest chain of newer values followed (a fact changed more often is still readable
/// record by record).
const MAX_CHAIN: usize = 64;

impl Substrate {
    /// The validity of those of `ids` that are superseded or in a conflict (the catalog's
    /// bitmaps say which, so a list of current records reads nothing).
    pub fn validity_of(&self, ids: &[MemoryId]) -> Result<HashMap<MemoryId, Validity>> {
        let store = &self.inner.store;
        let set: roaring::RoaringBitmap = ids.iter().map(|id| id.0).collect();
        let mut out = HashMap::new();
        for n in &(store.superseded(&set) | store.conflicted(&set)) {
            out.insert(MemoryId(n), store.validity(MemoryId(n))?);
        }
        Ok(out)
    }

    /// A record's validity, the records it superseded, and the newer values after it.
    pub fn chain(&self, namespace: &str, id: MemoryId) -> Result<Chain> {
        let store = &self.inner.store;
        store.get_in(namespace, id)?;
        let validity = store.validity(id)?;
        let supersedes = store
            .edges(namespace, Some(id))?
            .into_iter()
            .filter(|e| e.relation == Relation::Supersedes)
            .map(|e| e.to)
            .collect();
        let mut newer = Vec::new();
        let mut next = validity.superseded_by;
        while let Some(n) = next {
            if n == id || newer.contains(&n) || newer.len() >= MAX_CHAIN {
                break;
            }
            newer.push(n);
            // Placed by session, a newer value may be held by another part.
            next = match self.holder_of(namespace, n) {
                Some(part) => self.validity_at(part, namespace, n)?.superseded_by,
                None => store.validity(n)?.superseded_by,
            };
        }
        Ok(Chain {
            validity,
            supersedes,
            newer,
        })
    }

    /// Settles what was found about record `id` by hand (see [`Resolution`]), audited on
    /// every record it changes as done by `by`, with `reason`. Answers the record's chain
    /// as it is now. Refused, with what to do instead, when there is nothing to settle.
    pub fn resolve(
        &self,
        namespace: &str,
        id: MemoryId,
        resolution: Resolution,
        reason: Option<&str>,
        by: &str,
    ) -> Result<Chain> {
        super::lifecycle::check_reason(reason)?;
        let store = &self.inner.store;
        let record = store.get_in(namespace, id)?;
        let validity = store.validity(id)?;
        let now = self.inner.clock.now();
        let because = match reason.map(str::trim).filter(|r| !r.is_empty()) {
            Some(r) => format!(": {r}"),
            None => String::new(),
        };
        let audit = |on: MemoryId, detail: String| {
            Mutation::Audit(
                on,
                AuditEntry {
                    at: now,
                    action: AuditAction::Resolved,
                    by: by.to_string(),
                    detail: format!("{detail}{because}"),
                },
            )
        };
        let mut writes = WriteSet::new();
        let contradiction = |a: MemoryId, b: MemoryId| {
            // Detection writes the edge from the newer record; either way round is removed.
            [(a, b), (b, a)].map(|(from, to)| {
                Mutation::DeleteEdge(
                    namespace.to_string(),
                    Edge {
                        from,
                        to,
                        relation: Relation::Contradicts,
                    },
                )
            })
        };
        let close = |a: MemoryId, b: MemoryId| {
            Mutation::Validity(
                a,
                ValidityChange::Conflict {
                    with: b,
                    open: false,
                },
            )
        };
        match resolution {
            Resolution::Keep | Resolution::Dismiss if validity.conflicts.is_empty() => {
                return Err(Error::invalid(
                    "resolve",
                    format!(
                        "{id} is in no open conflict; `keep` and `dismiss` settle conflicts \
                         (see `conflicts` on the record), `reinstate` undoes a supersession"
                    ),
                ));
            }
            Resolution::Reinstate if !validity.superseded() => {
                return Err(Error::invalid(
                    "resolve",
                    format!(
                        "{id} is not superseded; `reinstate` makes a superseded record \
                         current again (see `superseded_by` on the record)"
                    ),
                ));
            }
            Resolution::Keep => {
                for &other in &validity.conflicts {
                    // Placed by session, the other record may live in another store: that
                    // store settles its side first, and only this one's is written here.
                    let elsewhere = self.holder_of(namespace, other);
                    let loser = match &elsewhere {
                        Some(part) => {
                            self.settle_at(
                                part.clone(),
                                namespace,
                                other,
                                &record,
                                true,
                                by,
                                &because,
                                now,
                            )?;
                            None
                        }
                        None => match store.get_light(other)? {
                            Some(loser) => Some(loser),
                            None => continue,
                        },
                    };
                    writes.0.extend(contradiction(id, other));
                    writes.push(Mutation::PutEdge(
                        namespace.to_string(),
                        Edge {
                            from: id,
                            to: other,
                            relation: Relation::Supersedes,
                        },
                    ));
                    writes.push(close(id, other));
                    writes.push(audit(id, format!("kept against {other}")));
                    if let Some(loser) = loser {
                        writes.push(Mutation::Validity(
                            other,
                            ValidityChange::SupersededBy {
                                by: id,
                                // It stopped holding when the kept claim was made, or never
                                // held if it came later.
                                until: record.event_time.max(loser.event_time),
                                at: now,
                            },
                        ));
                        writes.push(close(other, id));
                        writes.push(audit(other, format!("superseded by {id}, kept by hand")));
                    }
                }
            }
            Resolution::Dismiss => {
                for &other in &validity.conflicts {
                    let elsewhere = self.holder_of(namespace, other);
                    if let Some(part) = &elsewhere {
                        self.settle_at(
                            part.clone(),
                            namespace,
                            other,
                            &record,
                            false,
                            by,
                            &because,
                            now,
                        )?;
                    }
                    writes.0.extend(contradiction(id, other));
                    writes.push(close(id, other));
                    writes.push(audit(id, format!("conflict with {other} dismissed")));
                    if elsewhere.is_none() {
                        writes.push(close(other, id));
                        writes.push(audit(other, format!("conflict with {id} dismissed")));
                    }
                }
            }
            Resolution::Reinstate => {
                let by_id = validity.superseded_by.unwrap_or(id);
                writes.push(Mutation::DeleteEdge(
                    namespace.to_string(),
                    Edge {
                        from: by_id,
                        to: id,
                        relation: Relation::Supersedes,
                    },
                ));
                writes.push(Mutation::Validity(id, ValidityChange::Reinstated));
                writes.push(audit(id, format!("reinstated: not superseded by {by_id}")));
                // Placed by session, the newer record's store writes its side first.
                match self.holder_of(namespace, by_id) {
                    Some(part) => {
                        self.reinstated_at(part, namespace, by_id, id, by, &because, now)?;
                    }
                    None => {
                        writes.push(audit(by_id, format!("no longer supersedes {id}")));
                    }
                }
            }
        }
        store.write(writes)?;
        self.chain(namespace, id)
    }
}

impl Substrate {
    /// This store's side of a reinstatement made in another store (placed by session):
    /// its record `newer` no longer supersedes the other's `older`.
    pub(in crate::engine) fn reinstated_here(
        &self,
        namespace: &str,
        newer: MemoryId,
        older: MemoryId,
        by: &str,
        because: &str,
        at: Timestamp,
    ) -> Result<()> {
        self.inner.store.get_in(namespace, newer)?;
        let mut writes = WriteSet::new();
        writes.push(Mutation::DeleteEdge(
            namespace.to_string(),
            Edge {
                from: newer,
                to: older,
                relation: Relation::Supersedes,
            },
        ));
        writes.push(Mutation::Audit(
            newer,
            AuditEntry {
                at,
                action: AuditAction::Resolved,
                by: by.to_string(),
                detail: format!("no longer supersedes {older}{because}"),
            },
        ));
        self.inner.store.write(writes)
    }

    /// Writes the sides of pairs another part decided that fall on this store's records
    /// ([`UpdateMark`]), each once: one already audited (its detail up to the reason) is
    /// not written again, so an ask sent twice writes nothing twice. A record no longer
    /// held (purged meanwhile) has nothing to mark.
    pub(in crate::engine) fn mark_here(&self, namespace: &str, marks: &[UpdateMark]) -> Result<()> {
        let store = &self.inner.store;
        let policy = self.policy_for(namespace);
        let mut writes = WriteSet::new();
        for mark in marks {
            let on = mark.on();
            let Some((_, detail)) = mark.audit() else {
                continue;
            };
            match store.get_light(on)? {
                Some(r) if r.namespace == namespace => {}
                _ => continue,
            }
            let written = detail
                .split_once(" (")
                .map(|(start, _)| format!("{start} ("))
                .unwrap_or(detail);
            if store
                .history(on)?
                .iter()
                .any(|e| e.by.starts_with("updates:") && e.detail.starts_with(&written))
            {
                continue;
            }
            writes.0.extend(mark.writes(namespace, &policy, true));
        }
        if !writes.0.is_empty() {
            store.write(writes)?;
        }
        Ok(())
    }
}

impl Substrate {
    /// This store's side of a conflict settled by hand in another store (placed by
    /// session): `id` (here) against `with` (there, made at `with_time`); with `keep`,
    /// `with` was kept, so `id` is superseded by it.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn settle_here(
        &self,
        namespace: &str,
        id: MemoryId,
        with: MemoryId,
        with_time: Timestamp,
        keep: bool,
        by: &str,
        because: &str,
        at: Timestamp,
    ) -> Result<()> {
        let record = self.inner.store.get_in(namespace, id)?;
        let audit = |detail: String| {
            Mutation::Audit(
                id,
                AuditEntry {
                    at,
                    action: AuditAction::Resolved,
                    by: by.to_string(),
                    detail: format!("{detail}{because}"),
                },
            )
        };
        let mut writes = WriteSet::new();
        for (from, to) in [(id, with), (with, id)] {
            writes.push(Mutation::DeleteEdge(
                namespace.to_string(),
                Edge {
                    from,
                    to,
                    relation: Relation::Contradicts,
                },
            ));
        }
        writes.push(Mutation::Validity(
            id,
            ValidityChange::Conflict { with, open: false },
        ));
        if keep {
            writes.push(Mutation::PutEdge(
                namespace.to_string(),
                Edge {
                    from: with,
                    to: id,
                    relation: Relation::Supersedes,
                },
            ));
            writes.push(Mutation::Validity(
                id,
                ValidityChange::SupersededBy {
                    by: with,
                    until: with_time.max(record.event_time),
                    at,
                },
            ));
            writes.push(audit(format!("superseded by {with}, kept by hand")));
        } else {
            writes.push(audit(format!("conflict with {with} dismissed")));
        }
        self.inner.store.write(writes)
    }
}

/// Whether `a` happened after `b`: later event time, or the same time and written later.
pub(super) fn is_newer(a: &MemoryRecord, b: &MemoryRecord) -> bool {
    (a.event_time, a.id) > (b.event_time, b.id)
}

/// Whether a newer value clearly replaces the older one: the two happened at different
/// times, or in one session (where arrival order is the order), and nobody reinforced the
/// older one after the newer was written.
pub(super) fn clear_order(newer: &MemoryRecord, older: &MemoryRecord) -> bool {
    let ordered = newer.event_time != older.event_time || newer.session_id == older.session_id;
    let reinforced_since = older.reinforcements > 0 && older.strength_at > newer.recorded_time;
    ordered && !reinforced_since
}
