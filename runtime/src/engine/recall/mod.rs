//! Recall: "what should I remember now?". Candidates from four paths — vector, keyword
//! (each hit read with its neighbouring turns), the session's latest records and the
//! knowledge pool — are fused and ranked by the policy (the pure parts are in
//! `crate::retrieval`), diversified, trimmed to the token budget and rendered. A recall is
//! remembered under its `rcl-` id so feedback can name it, and what it returned is
//! reinforced after the answer, in the next group commit.

use std::borrow::Cow;
use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use roaring::RoaringBitmap;
use serde::{Deserialize, Serialize};

use super::Substrate;
use crate::clock::Timestamp;
use crate::error::{Error, Result};
use crate::index::passage::is_long;
use crate::index::text::analyze;
use crate::index::{QueryStats, ScopeCounts, TermCounts, cosine};
use crate::model::{
    MemoryId, MemoryRecord, Passage, PolicyStamp, Reinforce, Tier, validate_embedding, validate_id,
};
use crate::policy::{Fusion, Policy, ScoreInput};
use crate::retrieval::{self, Candidates, FusionMethod, Scope};
use crate::store::{
    Filter, Mutation, RawJson, Reinforcement, RememberedRecall, Store, Validity, WriteSet,
    neighbours_in,
};

mod rank;
mod remote;
mod scatter;

pub(in crate::engine) use remote::Carried;
pub use remote::{PartAsk, PartFuture, PartLink, Spread};
pub use scatter::{PartHits, PartRecord, PartScope, Plan, RecallPart, recall_across};

/// A recall question.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RecallRequest {
    /// Namespace (nothing crosses it).
    pub namespace: String,
    /// The asking session (scope `session`, and the recent path).
    pub session_id: String,
    /// The asking agent (scope `agent`).
    pub agent_id: Option<String>,
    /// What to remember about.
    pub query: String,
    /// A precomputed query vector (the embedder is skipped).
    pub query_embedding: Option<Vec<f32>>,
    /// How many memories to return.
    pub k: usize,
    /// Where to look.
    pub scope: Scope,
    /// Only these kinds.
    pub kinds: Option<Vec<String>>,
    /// Only events at or after this time.
    pub since: Option<Timestamp>,
    /// Only events at or before this time.
    pub until: Option<Timestamp>,
    /// Also search the namespace knowledge pool.
    pub include_knowledge: bool,
    /// Trim the result to fit this many tokens.
    pub token_budget: Option<usize>,
    /// Strengthen what is returned (the policy's `reinforce_on_recall`).
    pub reinforce: bool,
    /// Rank superseded records as if they were current (they are always eligible, and
    /// `why.superseded_by` says what replaced them); also when the query asks about the
    /// past ("what did we use before?").
    pub include_superseded: bool,
}

impl RecallRequest {
    /// A session-scoped question with defaults (k = 10, knowledge included, reinforcing).
    pub fn new(namespace: &str, session_id: &str, query: &str) -> Self {
        RecallRequest {
            namespace: namespace.into(),
            session_id: session_id.into(),
            agent_id: None,
            query: query.into(),
            query_embedding: None,
            k: 10,
            scope: Scope::Session,
            kinds: None,
            since: None,
            until: None,
            include_knowledge: true,
            token_budget: None,
            reinforce: true,
            include_superseded: false,
        }
    }
}

/// Why a memory ranked where it did: each policy component's weighted contribution, and
/// for a long record the passage that matched.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Why {
    /// Query relevance (fused vector + keyword).
    pub relevance: f32,
    /// Recency.
    pub recency: f32,
    /// Importance.
    pub importance: f32,
    /// Utility.
    pub utility: f32,
    /// A long record's best passage for the query (the one the context shows); `None` for
    /// a record that is one passage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub passage: Option<PassageHit>,
    /// The record that states a newer value of this one's fact: it is returned as history,
    /// ranked below that record when both are candidates (which is lifted above it; its own
    /// score is multiplied by the
    /// policy's `updates.superseded_weight`), unless the query asks about the past or the
    /// request includes superseded records.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub superseded_by: Option<MemoryId>,
    /// When it stopped being true (the newer record's event time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub valid_until: Option<Timestamp>,
    /// Records it is in open conflict with: both sides are returned as they rank, and the
    /// caller decides (or resolves the conflict with `PATCH`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conflicts_with: Vec<MemoryId>,
}

/// Whenever a superseded record and the record that superseded it are both candidates, the
/// newer one is lifted to just above it: they state one fact, and the current value comes
/// first. Lifting the newer (rather than sinking the older below it) moves the older down
/// one place at most, so a wrong supersession costs little (on BEAM with the hash embedder,
/// sinking cost 0.006 of R@10). Chains (`a` superseded by `b`, `b` by `c`) settle in a few
/// passes.
fn lift_successors(scored: &mut [(f32, Why, usize)], id_of: impl Fn(usize) -> MemoryId) {
    for _ in 0..4 {
        let mut lift: HashMap<MemoryId, f32> = HashMap::new();
        for s in scored.iter() {
            if let Some(by) = s.1.superseded_by {
                let above = s.0 + s.0.abs().max(1e-6) * 1e-4;
                let v = lift.entry(by).or_insert(f32::MIN);
                *v = v.max(above);
            }
        }
        let mut changed = false;
        for s in scored.iter_mut() {
            if let Some(&above) = lift.get(&id_of(s.2))
                && s.0 < above
            {
                s.0 = above;
                changed = true;
            }
        }
        if !changed {
            return;
        }
    }
}

/// Which passage of a long record matched: its place among the record's passages and its
/// byte range in the record's text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PassageHit {
    /// 0-based.
    pub index: u32,
    /// How many passages the record has.
    pub of: u32,
    /// First byte in the record's text.
    pub start: u32,
    /// One past its last byte.
    pub end: u32,
}

/// One recalled memory.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Recalled {
    /// The record (without its embedding).
    pub record: MemoryRecord,
    /// Total score.
    pub score: f32,
    /// The breakdown of the score.
    pub why: Why,
}

/// What recall answers.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RecallResult {
    /// The policy that ranked the result.
    pub policy: PolicyStamp,
    /// Best first.
    pub memories: Vec<Recalled>,
    /// The rendered context block (time-ordered).
    pub context: String,
    /// Names this recall for feedback ([`Substrate::feedback`]); `None` from
    /// [`Substrate::rank`], which remembers nothing.
    pub recall_id: Option<String>,
    /// What the answer went without and why (the query could not be embedded, say);
    /// empty when nothing was missing.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// Neighbours further apart in time than this are not a record's context: after an hour's
/// pause a session has moved on (LoCoMo's conversations resume days later, and reading
/// across the pause lowers R@10 on conversations 0–4).
const CONTEXT_GAP_MS: Timestamp = 3_600_000;

/// The keyword path's best hits read with their neighbours. Each costs a session scan and
/// the index's term counts of up to `4 × context_window` more records; past the first 30, a
/// hit and its neighbours almost never reach a top 20 (LoCoMo: the same figures with 30 as
/// with 80).
const CONTEXT_HITS: usize = 30;

/// The neighbouring-turn step reads a session of up to this many records whole, once,
/// rather than scanning around each of its hits (two scans a hit).
const SESSION_READ_MAX: usize = 1024;

/// What the neighbouring-turn step works with (see `keyword_in_context`).
#[derive(Clone, Copy)]
struct Context<'a> {
    query: &'a str,
    /// Only these records are read or counted.
    allowed: &'a roaring::RoaringBitmap,
    /// What the keyword search read of a small scope, when it did.
    counts: Option<&'a ScopeCounts>,
    /// Neighbours counted on each side of a hit.
    window: usize,
    /// What a neighbour's words weigh beside the hit's own.
    weight: f32,
    /// How many of the step's results are kept.
    depth: usize,
    /// The namespace and session a session-scoped recall is about (`None` for a wider
    /// scope): its hits' times are read from one listing of that session.
    session: Option<(&'a str, &'a str)>,
}

/// Scopes up to this many records have every long record's passages scored against the
/// query (a store read per long record, found by the catalog, and a dot product per
/// passage); a wider scope finds long records through their mean vector and their
/// keywords, and scores the passages of those.
const PASSAGE_SCAN_MAX: u64 = 4096;

/// At most this many passages are scored per recall by that scan, newest records first
/// (at 384 dimensions, 30 MB of vectors decoded and 7.7 M multiply-adds): a scope full of
/// long tool outputs must not make every recall read them all. The answer's `notes` say
/// when the scan stopped short.
const PASSAGE_SCAN_BUDGET: usize = 20_000;

impl Substrate {
    /// Answers "what should I remember now?": candidates from the vector, keyword, recent and
    /// knowledge paths, fused and ranked by the policy, diversified, trimmed to the token
    /// budget and rendered. Obsolete and archived records are never returned.
    pub async fn recall(&self, req: &RecallRequest) -> Result<RecallResult> {
        validate_id("namespace", &req.namespace)?;
        validate_id("session_id", &req.session_id)?;
        if let Some(a) = &req.agent_id {
            validate_id("agent_id", a)?;
        }
        self.inner.limits.k(Some(req.k))?;
        if req.query.len() > self.inner.limits.max_query_bytes() {
            return Err(Error::TooLarge {
                field: "query".into(),
                size: req.query.len(),
                limit: self.inner.limits.max_query_bytes(),
                hint: "ask a shorter question".into(),
            });
        }
        if let (Some(s), Some(u)) = (req.since, req.until)
            && s > u
        {
            return Err(Error::invalid("since", "is after `until`; swap them"));
        }
        let mut notes = Vec::new();
        let query_vec = match &req.query_embedding {
            Some(v) => {
                validate_embedding(v, Some(self.inner.embedder.dimensions()))?;
                Some(v.clone())
            }
            None if req.query.trim().is_empty() => None,
            None => match self.embed(std::slice::from_ref(&req.query)).await {
                Ok(mut v) => v.pop(),
                // A provider that is down must not take recall with it: the keyword and
                // recent paths still answer, and the answer says what it went without.
                Err(
                    e
                    @ (Error::Provider { .. } | Error::Timeout { .. } | Error::Unavailable { .. }),
                ) => {
                    notes.push(format!(
                        "the query could not be embedded, so this answer has no vector \
                         path (keywords and recency only): {e}"
                    ));
                    None
                }
                Err(e) => return Err(e),
            },
        };
        let policy = self.policy_for(&req.namespace);
        let sub = self.clone();
        let req2 = req.clone();
        let _turn = self
            .inner
            .ranking
            .acquire()
            .await
            .map_err(|_| Error::Closed)?;
        // Spread by session, every scope asks every store: a session's records are here
        // and its knowledge at the namespace's home, but keyword scores take the
        // statistics of every store (as one store holding every record would), and a
        // store whose scope is empty is asked nothing more.
        let others = match &self.inner.spread {
            Some(spread) => spread.others(&req.namespace),
            None => Vec::new(),
        };
        let (mut result, mut writes) = match others.is_empty() {
            true => {
                tokio::task::spawn_blocking(move || sub.rank(&req2, query_vec.as_deref(), &policy))
                    .await
                    .map_err(|e| Error::internal("recall ranking", e))??
            }
            false => {
                self.recall_spread(others, req, query_vec.as_deref(), &policy)
                    .await?
            }
        };
        if !req.reinforce {
            writes.0.clear();
        }
        let (recall_id, remember) = self.remember_recall(req, &result)?;
        result.recall_id = Some(recall_id);
        notes.append(&mut result.notes);
        result.notes = notes;
        writes.push(remember);
        // Nothing the caller sees depends on these writes (reinforcement, the recall's
        // memory for feedback): queue them for the next group commit and answer now. A
        // crash before the flush costs a reinforcement and makes feedback on this recall
        // unknown; it never loses an event.
        self.inner.store.write_detached(writes)?;
        Ok(result)
    }

    /// Plain BM25 over the keyword index: the `k` best records of one session for `query`,
    /// best first, on the same analysed text recall searches but with nothing else (no
    /// vectors, neighbouring turns, recency, importance or utility). The baseline the
    /// evaluations print beside recall's figures.
    pub fn bm25(
        &self,
        namespace: &str,
        session: &str,
        query: &str,
        k: usize,
    ) -> Result<Vec<MemoryId>> {
        self.catch_up()?;
        let episodic = [Tier::Episodic, Tier::Condensed];
        let allowed = self.inner.store.candidates(&Filter {
            namespace,
            session: Some(session),
            tiers: Some(&episodic),
            recallable_only: true,
            ..Default::default()
        });
        let hits = self.inner.keywords.search(query, k, Some(&allowed))?;
        Ok(hits.into_iter().map(|(id, _)| MemoryId(id)).collect())
    }

    /// Re-scores the best [`CONTEXT_HITS`] of the keyword path's `hits` with each record's
    /// neighbours in its session (`cx.window` each side, within [`CONTEXT_GAP_MS`]) counted
    /// at `cx.weight` ([`retrieval::context_bm25`]), and brings in the neighbours
    /// themselves, scored the same way: the turn that answers a question is often the one
    /// after the turn that matches it. Only `cx.allowed` records are read or counted. The
    /// other hits keep their scores. Returns the best `cx.depth`, best first, as the keyword
    /// path's new ranking.
    fn keyword_in_context(&self, cx: &Context<'_>, hits: &[(u32, f32)]) -> Result<Vec<(u32, f32)>> {
        // A session's search read every turn's counts already; a wider scope asks again.
        let stats = match cx.counts {
            Some(c) => c.stats.clone(),
            None => self.inner.keywords.query_stats(cx.query)?,
        };
        let first: Vec<MemoryId> = hits
            .iter()
            .take(CONTEXT_HITS)
            .map(|&(id, _)| MemoryId(id))
            .collect();
        let scores = self.context_scores(cx, &stats, &first)?;
        let mut ranked = context_ranking(scores, hits);
        settle(&self.inner.store, &mut ranked, cx.depth)?;
        Ok(ranked)
    }

    /// The neighbouring-turn scores of `first` (keyword hits) and of their neighbours in
    /// their sessions, under `stats`: what [`Substrate::keyword_in_context`] ranks by, and
    /// what each part of a scattered recall answers for its own hits (a session's records
    /// are all in one part).
    fn context_scores(
        &self,
        cx: &Context<'_>,
        stats: &QueryStats,
        first: &[MemoryId],
    ) -> Result<HashMap<MemoryId, f32>> {
        let Context {
            allowed,
            counts,
            window,
            weight,
            session,
            ..
        } = *cx;
        let store = &self.inner.store;
        // One run of the session around each hit, `2 × window` each side, holds every member
        // within `window` of it together with that member's own neighbours.
        let mut runs: Vec<(usize, Vec<(Timestamp, MemoryId)>)> = Vec::new();
        let mut members: Vec<u32> = Vec::new();
        // A session's hits (a session-scoped recall's all are) find their neighbours in
        // one read of the session when it is small, not in two scans each. A session-scoped
        // recall reads their times there too, not from each record.
        let mut listing = match session {
            Some((namespace, session)) => {
                store.session_listing(namespace, session, SESSION_READ_MAX)?
            }
            None => None,
        };
        let read;
        let places: Vec<Option<(&str, &str, Timestamp)>> = match (&listing, session) {
            (Some(listed), Some((namespace, session))) => {
                let times: HashMap<MemoryId, Timestamp> =
                    listed.iter().map(|&(time, id)| (id, time)).collect();
                first
                    .iter()
                    .map(|id| Some((namespace, session, *times.get(id)?)))
                    .collect()
            }
            _ => {
                read = store.places(first)?;
                read.iter()
                    .map(|p| p.as_ref().map(|(n, s, t)| (n.as_str(), s.as_str(), *t)))
                    .collect()
            }
        };
        if listing.is_none() && session.is_none() {
            let mut sessions = places.iter().flatten().map(|&(ns, s, _)| (ns, s));
            listing = match sessions.next() {
                Some(one) if sessions.all(|other| other == one) => {
                    store.session_listing(one.0, one.1, SESSION_READ_MAX)?
                }
                _ => None,
            };
        }
        for (hit, place) in first.iter().copied().zip(places) {
            let Some((namespace, session, time)) = place else {
                continue;
            };
            let keep = |n: MemoryId| allowed.contains(n.0);
            let (before, after) = match &listing {
                Some(listing) => {
                    neighbours_in(listing, (time, hit), 2 * window, CONTEXT_GAP_MS, keep)
                }
                None => store.session_neighbours(
                    namespace,
                    session,
                    (time, hit),
                    2 * window,
                    CONTEXT_GAP_MS,
                    keep,
                )?,
            };
            let at = before.len();
            let run: Vec<(Timestamp, MemoryId)> = before
                .into_iter()
                .rev()
                .chain(std::iter::once((time, hit)))
                .chain(after)
                .collect();
            members.extend(run.iter().map(|(_, id)| id.0));
            runs.push((at, run));
        }
        members.sort_unstable();
        members.dedup();
        // Each member's query-term counts, from the index (no text is read or analysed): a
        // turn's one document, or a long record's best passage by plain BM25, as the keyword
        // index scores it. Long records are documents, not turns: they neither borrow nor
        // lend words.
        let member_counts = match counts {
            Some(c) => c.term_counts(&members),
            None => self.inner.keywords.term_counts(stats, &members)?,
        };
        let profiles: HashMap<MemoryId, (TermCounts, bool)> = member_counts
            .into_iter()
            .map(|(id, docs)| {
                let document = docs.len() > 1;
                let best = docs
                    .into_iter()
                    .map(|c| (retrieval::context_bm25(stats, &c, &[], 0.0, 0), c))
                    .max_by(|a, b| a.0.total_cmp(&b.0))
                    .map(|(_, c)| c)
                    .unwrap_or_default();
                (MemoryId(id), (best, document))
            })
            .collect();
        let is_document = |id: &MemoryId| profiles.get(id).is_some_and(|p| p.1);
        let none = TermCounts::default();
        let mut scores: HashMap<MemoryId, f32> = HashMap::new();
        for (at, run) in &runs {
            let at = *at;
            for q in at.saturating_sub(window)..=(at + window).min(run.len() - 1) {
                let (t, id) = run[q];
                if scores.contains_key(&id) {
                    continue;
                }
                let own = profiles.get(&id).map_or(&none, |p| &p.0);
                if is_document(&id) {
                    scores.insert(id, retrieval::context_bm25(stats, own, &[], 0.0, 0));
                    continue;
                }
                let neighbours: Vec<&TermCounts> = run
                    [q.saturating_sub(window)..=(q + window).min(run.len() - 1)]
                    .iter()
                    .filter(|(tn, n)| *n != id && tn.abs_diff(t) <= CONTEXT_GAP_MS.unsigned_abs())
                    .filter(|(_, n)| !is_document(n))
                    .filter_map(|(_, n)| profiles.get(n).map(|p| &p.0))
                    .collect();
                let score = retrieval::context_bm25(stats, own, &neighbours, weight, window as u32);
                scores.insert(id, score);
            }
        }
        Ok(scores)
    }

    fn window_ids(
        &self,
        req: &RecallRequest,
        session: Option<&str>,
    ) -> Result<roaring::RoaringBitmap> {
        let store = &self.inner.store;
        let mut ids = roaring::RoaringBitmap::new();
        // Listings are time-ordered: walk back from `until` and stop at `since`.
        let before = req.until.map(|u| (u.saturating_add(1), MemoryId(0)));
        let mut cursor = before;
        loop {
            let page = match session {
                Some(s) => store.session_ids(&req.namespace, s, cursor, 4096)?,
                None => store.namespace_ids(&req.namespace, cursor, 4096)?,
            };
            if page.is_empty() {
                break;
            }
            let mut done = false;
            let mut last = None;
            for id in &page {
                let Some(r) = store.get_light(*id)? else {
                    continue;
                };
                last = Some((r.event_time, r.id));
                if req.since.is_some_and(|s| r.event_time < s) {
                    done = true;
                    break;
                }
                ids.insert(id.0);
            }
            if done || page.len() < 4096 {
                break;
            }
            cursor = last;
        }
        // Knowledge records are namespace-wide: their own window check.
        if req.include_knowledge {
            let k = store.candidates(&Filter {
                namespace: &req.namespace,
                tiers: Some(&[Tier::Knowledge]),
                ..Default::default()
            });
            for id in k {
                if let Some(r) = store.get_light(MemoryId(id))?
                    && retrieval::in_window(r.event_time, req.since, req.until)
                {
                    ids.insert(id);
                }
            }
        }
        Ok(ids)
    }
}
impl Substrate {
    /// The recall id for a result, and the write that remembers what it returned.
    fn remember_recall(
        &self,
        req: &RecallRequest,
        result: &RecallResult,
    ) -> Result<(String, Mutation)> {
        let n = self.store().allocate_recall()?;
        let remembered = RememberedRecall {
            namespace: req.namespace.clone(),
            session: req.session_id.clone(),
            at: self.clock().now(),
            ids: result.memories.iter().map(|m| m.record.id).collect(),
        };
        Ok((recall_id(n), Mutation::RememberRecall(n, remembered)))
    }

    /// The ids a recall returned.
    pub(super) async fn recalled(&self, namespace: &str, recall_id: &str) -> Result<Vec<MemoryId>> {
        let unknown = || Error::NotFound {
            what: "recall",
            id: recall_id.to_string(),
        };
        let n = recall_number(recall_id).ok_or_else(|| {
                Error::invalid(
                    "recall_id",
                    format!("`{recall_id}` is not a recall id; use the `recall_id` a recall answered (rcl- and 8 hex digits)"),
                )
            })?;
        let remembered = match self.store().recall(n)? {
            Some(remembered) => remembered,
            None => {
                // Recall queues its memory without waiting for the flush; feedback sent right
                // after it may arrive first.
                self.store().sync().await?;
                self.store().recall(n)?.ok_or_else(unknown)?
            }
        };
        if remembered.namespace != namespace {
            return Err(unknown());
        }
        Ok(remembered.ids)
    }
}

/// Best first by score, then lower id, each id once at its best.
fn sort_hits(hits: &mut Vec<(u32, f32)>) {
    hits.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut seen = HashSet::new();
    hits.retain(|(id, _)| seen.insert(*id));
}

/// Orders a path's hits best first, records of the same score by their event time (older
/// first), then id, and keeps the best `depth`. Ties are common (short turns with the same
/// query-term counts score the same BM25), and broken by time they fall the same way in
/// one store and in a namespace spread over several, whose ids differ ([`merge_hits`]).
/// Only tied records' times are read.
fn settle(store: &Store, hits: &mut Vec<(u32, f32)>, depth: usize) -> Result<()> {
    sort_hits(hits);
    let mut i = 0;
    while i < hits.len().min(depth) {
        let j = i + hits[i..].iter().take_while(|h| h.1 == hits[i].1).count();
        if j - i > 1 {
            let ids: Vec<MemoryId> = hits[i..j].iter().map(|h| MemoryId(h.0)).collect();
            let times = store.places(&ids)?;
            let mut run: Vec<(Timestamp, (u32, f32))> = times
                .into_iter()
                .zip(&hits[i..j])
                .map(|(p, h)| (p.map_or(Timestamp::MAX, |p| p.2), *h))
                .collect();
            run.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.0.cmp(&b.1.0)));
            for (slot, (_, h)) in hits[i..j].iter_mut().zip(run) {
                *slot = h;
            }
        }
        i = j;
    }
    hits.truncate(depth);
    Ok(())
}

/// One hit of a path with its record's event time, as a part of a scattered recall
/// answers it, so the coordinator orders ties as [`settle`] does.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PathHit {
    /// The record.
    pub id: u32,
    /// Its score on the path.
    pub score: f32,
    /// Its event time.
    pub time: Timestamp,
}

/// `hits` with each record's event time.
fn with_times(store: &Store, hits: &[(u32, f32)]) -> Result<Vec<PathHit>> {
    let ids: Vec<MemoryId> = hits.iter().map(|h| MemoryId(h.0)).collect();
    Ok(store
        .places(&ids)?
        .into_iter()
        .zip(hits)
        .map(|(p, &(id, score))| PathHit {
            id,
            score,
            time: p.map_or(Timestamp::MAX, |p| p.2),
        })
        .collect())
}

/// Several parts' hits of one path merged as [`settle`] orders one store's: best first,
/// then older, then lower id, the best `depth`.
fn merge_hits(mut hits: Vec<PathHit>, depth: usize) -> Vec<PathHit> {
    hits.sort_by(|a, b| {
        b.score
            .total_cmp(&a.score)
            .then(a.time.cmp(&b.time))
            .then(a.id.cmp(&b.id))
    });
    let mut seen = HashSet::new();
    hits.retain(|h| seen.insert(h.id));
    hits.truncate(depth);
    hits
}

/// The keyword path's hits after the neighbouring-turn step, unordered: the `scores` it
/// gave the first hits and their neighbours; hits past the first [`CONTEXT_HITS`] keep
/// their own BM25 score, so a recall asking for many memories still gets every keyword
/// hit. Records scoring nothing are dropped.
fn context_ranking(mut scores: HashMap<MemoryId, f32>, hits: &[(u32, f32)]) -> Vec<(u32, f32)> {
    for &(id, score) in hits.iter().skip(CONTEXT_HITS) {
        scores.entry(MemoryId(id)).or_insert(score);
    }
    scores
        .into_iter()
        .filter(|(_, s)| *s > 0.0)
        .map(|(id, s)| (id.0, s))
        .collect()
}

/// The id a client is given for recall number `n`: `rcl-` and 8 hex digits.
pub(crate) fn recall_id(n: u32) -> String {
    format!("rcl-{n:08x}")
}

/// The number in a recall id, `None` when `id` is not one.
pub(crate) fn recall_number(id: &str) -> Option<u32> {
    id.strip_prefix("rcl-")
        .filter(|hex| hex.len() == 8)
        .and_then(|hex| u32::from_str_radix(hex, 16).ok())
}

/// The passage of `text` that holds the most of the query's analysed terms (distinct terms
/// first, then occurrences; the first on a tie): the one to show when there is no query
/// vector to choose by.
fn best_by_terms(text: &str, passages: &[Passage], query: &[String]) -> usize {
    let wanted: HashSet<&str> = query.iter().map(String::as_str).collect();
    let mut best = (0usize, (0usize, 0usize));
    for (i, p) in passages.iter().enumerate() {
        let Some(slice) = text.get(p.start as usize..p.end as usize) else {
            continue;
        };
        let terms = analyze(slice);
        let hits: Vec<&str> = terms
            .iter()
            .map(String::as_str)
            .filter(|t| wanted.contains(t))
            .collect();
        let distinct: HashSet<&str> = hits.iter().copied().collect();
        let score = (distinct.len(), hits.len());
        if score > best.1 {
            best = (i, score);
        }
    }
    best.0
}

/// `r` as the context shows it: its text cut to the passage `hit` names, marked as a part.
fn passage_view(r: &MemoryRecord, hit: &PassageHit) -> MemoryRecord {
    let part = r
        .text
        .get(hit.start as usize..hit.end as usize)
        .unwrap_or(&r.text);
    MemoryRecord {
        text: format!("(part {} of {}) {part}", hit.index + 1, hit.of),
        content: serde_json::Value::Null,
        metadata: serde_json::Value::Null,
        embedding: None,
        ..r.clone()
    }
}

/// Long records' passages as one recall read them (each at most once), with each record's
/// best passage for the query once computed.
#[derive(Default)]
struct PassageCache(HashMap<MemoryId, Read>);

/// One record's passages, and its best for the query as (index, cosine) once computed.
type Read = (Vec<Passage>, Option<(usize, f32)>);

impl PassageCache {
    fn entry(&mut self, store: &Store, id: MemoryId) -> Result<&mut Read> {
        Ok(match self.0.entry(id) {
            Entry::Occupied(o) => o.into_mut(),
            Entry::Vacant(v) => v.insert((store.passages(id)?, None)),
        })
    }

    /// `id`'s passages (empty when it has none: not long, or not embedded yet).
    fn of(&mut self, store: &Store, id: MemoryId) -> Result<&[Passage]> {
        Ok(&self.entry(store, id)?.0)
    }

    /// The passage a long record `r` is shown by: its best for the query vector, else the
    /// one with most query words; `None` for a record that is not long (or has no passages
    /// yet).
    fn hit(
        &mut self,
        store: &Store,
        r: &MemoryRecord,
        query_vec: Option<&[f32]>,
        query_terms: &[String],
    ) -> Result<Option<PassageHit>> {
        if !is_long(&r.text) {
            return Ok(None);
        }
        let best = match query_vec {
            Some(q) => self.best(store, r.id, q)?.map(|b| b.0),
            None => None,
        };
        let all = self.of(store, r.id)?;
        if all.is_empty() {
            return Ok(None);
        }
        let index = best.unwrap_or_else(|| best_by_terms(&r.text, all, query_terms));
        let p = &all[index];
        Ok(Some(PassageHit {
            index: index as u32,
            of: all.len() as u32,
            start: p.start,
            end: p.end,
        }))
    }

    /// `id`'s best passage for `query` as (index, cosine); `None` when it has none.
    fn best(&mut self, store: &Store, id: MemoryId, query: &[f32]) -> Result<Option<(usize, f32)>> {
        let (all, best) = self.entry(store, id)?;
        if best.is_none() {
            *best = all
                .iter()
                .enumerate()
                .map(|(i, p)| (i, cosine(query, &p.embedding)))
                .max_by(|a, b| a.1.total_cmp(&b.1).then(b.0.cmp(&a.0)));
        }
        Ok(*best)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn passages(text: &str) -> Vec<Passage> {
        crate::index::passage::split(text)
            .into_iter()
            .map(|r| Passage {
                start: r.start as u32,
                end: r.end as u32,
                embedding: Vec::new(),
            })
            .collect()
    }

    #[test]
    fn without_a_query_vector_the_passage_with_most_query_words_is_shown() {
        let filler = "The weather was mild and the meeting ran long again. ".repeat(40);
        let text = format!("{filler} The invoice for the Lyon dealer was paid in March. {filler}");
        let all = passages(&text);
        assert!(all.len() > 4);
        let query = analyze("when was the Lyon dealer invoice paid?");
        let best = &all[best_by_terms(&text, &all, &query)];
        assert!(text[best.start as usize..best.end as usize].contains("Lyon dealer"));
        // Nothing matches: the first passage.
        assert_eq!(best_by_terms(&text, &all, &analyze("zebra")), 0);
    }

    #[test]
    fn a_passage_view_shows_the_part_and_says_which() {
        let r = MemoryRecord::episodic(
            MemoryId(7),
            "ns",
            "s",
            crate::model::Kind::new("observation").unwrap(),
            "abcdefghij",
            0,
        );
        let hit = PassageHit {
            index: 1,
            of: 3,
            start: 2,
            end: 5,
        };
        assert_eq!(passage_view(&r, &hit).text, "(part 2 of 3) cde");
    }
}
