//! Recall over a namespace whose sessions are spread over several stores (a cluster's
//! partitions, placed by session: docs/cluster-placement.md). Each store — a *part* —
//! answers for its own records in up to four rounds, and a coordinator
//! ([`recall_across`]) merges what they answer with the same pure stages a single store's
//! recall ranks with (`rank.rs`), so the ranking is the one one store holding every record
//! gives:
//!
//! 1. [`Substrate::part_scope`]: how many records the request may see here, and the keyword
//!    index's statistics for the query; the coordinator sums both.
//! 2. [`Substrate::part_hits`]: this part's best candidates on the vector and keyword paths,
//!    keywords scored with the summed statistics, and the session's latest records where
//!    the session lives. Merged, each path's best `depth` are the single store's.
//! 3. [`Substrate::part_context`]: the neighbouring-turn scores of this part's hits among
//!    the merged keyword path's first 30 (a hit's neighbours are in its session, so here).
//! 4. [`Substrate::part_load`]: the final candidates held here, read with their exact
//!    similarity, validity and the passage a long one is shown by.
//!
//! Fusion, the policy's score at an instant the coordinator pins, diversification, the
//! token budget and rendering then run once, at the coordinator; each part receives the
//! reinforcement of its own returned records.
//!
//! The equivalence holds with exact vector search on every part (a scope at most the vector
//! index's `exact_threshold`, summed over the parts): arroy's approximate search depends on
//! each index's trees. The passage scan's budget (`PASSAGE_SCAN_BUDGET`) applies per part;
//! ties in score and time break on ids, which differ between one store and several.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::Arc;

use roaring::RoaringBitmap;
use serde::{Deserialize, Serialize};

use super::rank::{finish, order, relevance, score_rows};
use super::*;
use crate::index::CorpusStats;
use crate::store::IdBlock;

/// Round one's answer: what one part's scope holds.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PartScope {
    /// Records the request may see in this part.
    pub allowed: u64,
    /// The part's keyword statistics for the query.
    pub corpus: CorpusStats,
}

/// What the coordinator sends with rounds two to four: the whole scope's size (which
/// decides exact vector search and the passage scan) and its keyword statistics.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Plan {
    /// Records the request may see, over every part.
    pub allowed: u64,
    /// The keyword statistics summed over every part.
    pub corpus: CorpusStats,
    /// The coordinator's policy's neighbouring-turn window and weight (`scoring.
    /// context_window`, `scoring.context_weight`), which round three scores with.
    pub context: (u32, f32),
}

/// Round two's answer: a part's candidates on each path, best first.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PartHits {
    /// The vector path's (long records by their best passage when scanned), with their
    /// similarity.
    pub vector: Vec<PathHit>,
    /// The keyword path's, with their BM25 score under the plan's statistics.
    pub keyword: Vec<PathHit>,
    /// The session's latest records, newest first (from the part holding the session).
    pub recent: Vec<MemoryId>,
    /// What the part went without.
    pub notes: Vec<String>,
}

/// Round four's answer: one candidate as its part read it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PartRecord {
    /// The record, its content and metadata read, without its embedding.
    pub record: MemoryRecord,
    /// Its embedding, when diversification needs it.
    pub embedding: Option<Vec<f32>>,
    /// Its exact similarity to the query (a long record's best passage counted).
    pub similarity: Option<f32>,
    /// What is known against it, when anything is.
    pub validity: Option<Validity>,
    /// The passage a long record is shown by.
    pub passage: Option<PassageHit>,
}

/// One part of a scattered recall: a store answering the rounds for its own records,
/// here in this process or, in a cluster, at the node that owns the partition.
pub trait RecallPart {
    /// The ids the part's store hands out: an id names the part that holds it.
    fn ids(&self) -> IdBlock;
    /// Round one ([`Substrate::part_scope`]).
    fn scope(&self, req: &RecallRequest) -> impl Future<Output = Result<PartScope>> + Send;
    /// Round two ([`Substrate::part_hits`]).
    fn hits(
        &self,
        req: &RecallRequest,
        query_vec: Option<&[f32]>,
        plan: &Plan,
    ) -> impl Future<Output = Result<PartHits>> + Send;
    /// Round three ([`Substrate::part_context`]).
    fn context(
        &self,
        req: &RecallRequest,
        plan: &Plan,
        hits: &[MemoryId],
    ) -> impl Future<Output = Result<Vec<PathHit>>> + Send;
    /// Round four ([`Substrate::part_load`]).
    fn load(
        &self,
        req: &RecallRequest,
        query_vec: Option<&[f32]>,
        plan: &Plan,
        ids: &[MemoryId],
        embeddings: bool,
    ) -> impl Future<Output = Result<Vec<PartRecord>>> + Send;
}

impl RecallPart for Substrate {
    fn ids(&self) -> IdBlock {
        self.inner.store.id_block()
    }

    async fn scope(&self, req: &RecallRequest) -> Result<PartScope> {
        self.part_scope(req)
    }

    async fn hits(
        &self,
        req: &RecallRequest,
        query_vec: Option<&[f32]>,
        plan: &Plan,
    ) -> Result<PartHits> {
        self.part_hits(req, query_vec, plan)
    }

    async fn context(
        &self,
        req: &RecallRequest,
        plan: &Plan,
        hits: &[MemoryId],
    ) -> Result<Vec<PathHit>> {
        self.part_context(req, plan, hits)
    }

    async fn load(
        &self,
        req: &RecallRequest,
        query_vec: Option<&[f32]>,
        plan: &Plan,
        ids: &[MemoryId],
        embeddings: bool,
    ) -> Result<Vec<PartRecord>> {
        self.part_load(req, query_vec, plan, ids, embeddings)
    }
}

/// How many candidates each path keeps for `req`.
fn depth(req: &RecallRequest) -> usize {
    (req.k * 4).max(50)
}

impl Substrate {
    /// Round one of a scattered recall (module docs): the records `req` may see here and
    /// the keyword statistics of its query.
    pub fn part_scope(&self, req: &RecallRequest) -> Result<PartScope> {
        // Read-your-writes, as in a single store's recall.
        self.catch_up()?;
        let allowed = self.scope_of(req)?;
        Ok(PartScope {
            allowed: allowed.len(),
            corpus: self.inner.keywords.corpus_stats(&req.query)?,
        })
    }

    /// Round two: this part's best `depth` candidates on the vector path (exact when the
    /// whole scope is within the index's exact threshold; long records by their best
    /// passage when the whole scope is small enough to scan), on the keyword path (scored
    /// with the plan's statistics), and the session's latest records if it lives here.
    pub fn part_hits(
        &self,
        req: &RecallRequest,
        query_vec: Option<&[f32]>,
        plan: &Plan,
    ) -> Result<PartHits> {
        let allowed = self.scope_of(req)?;
        let depth = depth(req);
        let mut out = PartHits::default();
        if allowed.is_empty() {
            return Ok(out);
        }
        let store = &self.inner.store;
        if let Some(q) = query_vec {
            let exact = plan.allowed <= self.inner.vectors.options().exact_threshold;
            let mut hits = match exact {
                true => self
                    .inner
                    .vectors
                    .search(q, allowed.len() as usize, Some(&allowed))?,
                false => self.inner.vectors.search(q, depth, Some(&allowed))?,
            };
            if plan.allowed <= PASSAGE_SCAN_MAX {
                let mut passages = PassageCache::default();
                let scanned = self.scan_passages(q, &allowed, &mut passages, &mut hits)?;
                out.notes.extend(scanned);
            }
            settle(store, &mut hits, depth)?;
            out.vector = with_times(store, &hits)?;
        }
        let mut keyword =
            self.inner
                .keywords
                .search_in_corpus(&req.query, depth, &allowed, &plan.corpus)?;
        settle(store, &mut keyword, depth)?;
        out.keyword = with_times(store, &keyword)?;
        if req.scope == Scope::Session {
            out.recent = self.recent_of(req, &allowed)?;
        }
        Ok(out)
    }

    /// Round three: the neighbouring-turn scores of `hits` (this part's among the merged
    /// keyword path's first [`CONTEXT_HITS`]) and of their neighbours, under the plan's
    /// statistics.
    pub fn part_context(
        &self,
        req: &RecallRequest,
        plan: &Plan,
        hits: &[MemoryId],
    ) -> Result<Vec<PathHit>> {
        let allowed = self.scope_of(req)?;
        let cx = Context {
            query: &req.query,
            allowed: &allowed,
            counts: None,
            window: plan.context.0 as usize,
            weight: plan.context.1,
            depth: depth(req),
            session: (req.scope == Scope::Session)
                .then_some((req.namespace.as_str(), req.session_id.as_str())),
        };
        let scores = self.context_scores(&cx, &plan.corpus.query_stats(), hits)?;
        let scores: Vec<(u32, f32)> = scores.into_iter().map(|(id, s)| (id.0, s)).collect();
        with_times(&self.inner.store, &scores)
    }

    /// Round four: the candidates `ids` held here that `req` may see, each with its exact
    /// similarity (the exact search's score when the whole scope is searched exactly, else
    /// the cosine with its stored embedding; a long record's best passage counted), what
    /// is known against it and the passage a long one is shown by.
    pub fn part_load(
        &self,
        req: &RecallRequest,
        query_vec: Option<&[f32]>,
        plan: &Plan,
        ids: &[MemoryId],
        embeddings: bool,
    ) -> Result<Vec<PartRecord>> {
        let store = &self.inner.store;
        let exact =
            query_vec.is_some() && plan.allowed <= self.inner.vectors.options().exact_threshold;
        let scores: HashMap<u32, f32> = match (query_vec, exact) {
            (Some(q), true) => {
                let set: RoaringBitmap = ids.iter().map(|id| id.0).collect();
                let hits = self.inner.vectors.search(q, ids.len(), Some(&set))?;
                hits.into_iter().collect()
            }
            _ => HashMap::new(),
        };
        let read_embeddings = query_vec.is_some() && (embeddings || !exact);
        let validity = self.validity_of(ids)?;
        let query_terms = analyze(&req.query);
        let mut passages = PassageCache::default();
        let mut out = Vec::with_capacity(ids.len());
        for (mut record, json) in store
            .get_many_deferred(ids, read_embeddings)?
            .into_iter()
            .flatten()
        {
            if !record.recallable() || record.namespace != req.namespace {
                continue;
            }
            json.fill(&mut record)?;
            let emb = record.embedding.take();
            let own = match (query_vec, exact, emb.as_deref()) {
                (Some(_), true, _) => scores.get(&record.id.0).copied(),
                (Some(q), false, Some(e)) => Some(cosine(q, e)),
                _ => None,
            };
            let mut similarity = None;
            if let (Some(q), Some(own)) = (query_vec, own) {
                let best = match is_long(&record.text) {
                    true => passages.best(store, record.id, q)?.map(|b| b.1),
                    false => None,
                };
                similarity = Some(best.map_or(own, |b| b.max(own)));
            }
            let passage = passages.hit(store, &record, query_vec, &query_terms)?;
            out.push(PartRecord {
                validity: validity.get(&record.id).cloned(),
                embedding: emb.filter(|_| embeddings),
                similarity,
                passage,
                record,
            });
        }
        Ok(out)
    }

    /// The session's latest records `allowed` holds, newest first: the recent path.
    pub(super) fn recent_of(
        &self,
        req: &RecallRequest,
        allowed: &RoaringBitmap,
    ) -> Result<Vec<MemoryId>> {
        Ok(self
            .inner
            .store
            .session_ids(
                &req.namespace,
                &req.session_id,
                None,
                self.inner.recent_n * 4,
            )?
            .into_iter()
            .filter(|id| allowed.contains(id.0))
            .take(self.inner.recent_n)
            .collect())
    }
}

/// Recalls `req` over `parts` (every store holding some of its namespace's records) as
/// one store holding all of them would: the four rounds of the module docs, then fusion,
/// the policy's score at `now`, the order and what is shown, here. Returns the answer
/// and, per part (by index in `parts`), the reinforcement of its returned records.
pub async fn recall_across<P: RecallPart + Sync>(
    parts: &[P],
    req: &RecallRequest,
    query_vec: Option<&[f32]>,
    policy: &Arc<Policy>,
    now: Timestamp,
) -> Result<(RecallResult, Vec<WriteSet>)> {
    let depth = depth(req);
    let scopes = futures::future::try_join_all(parts.iter().map(|p| p.scope(req))).await?;
    let mut plan = Plan {
        context: (policy.scoring.context_window, policy.scoring.context_weight),
        ..Plan::default()
    };
    for s in &scopes {
        plan.allowed += s.allowed;
        plan.corpus.add(&s.corpus);
    }
    // A part whose scope is empty has no candidate (nor the session's latest records).
    let answers = futures::future::try_join_all(
        parts
            .iter()
            .zip(&scopes)
            .filter(|(_, s)| s.allowed > 0)
            .map(|(p, _)| p.hits(req, query_vec, &plan)),
    )
    .await?;
    let (mut vector, mut keyword, mut recent, mut notes) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for a in answers {
        vector.extend(a.vector);
        keyword.extend(a.keyword);
        recent.extend(a.recent);
        for n in a.notes {
            if !notes.contains(&n) {
                notes.push(n);
            }
        }
    }
    let vector = merge_hits(vector, depth);
    let keyword = merge_hits(keyword, depth);
    let part_of = |id: u32| parts.iter().position(|p| p.ids().contains(id));
    let (window, weight) = plan.context;
    let keyword: Vec<PathHit> = if window > 0 && weight > 0.0 && !keyword.is_empty() {
        let mut first: BTreeMap<usize, Vec<MemoryId>> = BTreeMap::new();
        for h in keyword.iter().take(CONTEXT_HITS) {
            if let Some(p) = part_of(h.id) {
                first.entry(p).or_default().push(MemoryId(h.id));
            }
        }
        let rescored = futures::future::try_join_all(
            first
                .iter()
                .map(|(&p, hits)| parts[p].context(req, &plan, hits)),
        )
        .await?;
        let mut times: HashMap<u32, Timestamp> = keyword.iter().map(|h| (h.id, h.time)).collect();
        let mut scores = HashMap::new();
        for h in rescored.into_iter().flatten() {
            times.insert(h.id, h.time);
            scores.insert(MemoryId(h.id), h.score);
        }
        let own: Vec<(u32, f32)> = keyword.iter().map(|h| (h.id, h.score)).collect();
        let ranked = context_ranking(scores, &own)
            .into_iter()
            .map(|(id, score)| PathHit {
                id,
                score,
                time: times.get(&id).copied().unwrap_or(Timestamp::MAX),
            })
            .collect();
        merge_hits(ranked, depth)
    } else {
        keyword
    };
    let pairs =
        |hits: &[PathHit]| -> Vec<(u32, f32)> { hits.iter().map(|h| (h.id, h.score)).collect() };
    let mut cands = Candidates::default();
    cands.add_vector(&pairs(&vector));
    cands.add_keyword(&pairs(&keyword));
    cands.add_recent(&recent);
    let mut wanted: BTreeMap<usize, Vec<MemoryId>> = BTreeMap::new();
    for id in cands.by_id.keys() {
        if let Some(p) = part_of(id.0) {
            wanted.entry(p).or_default().push(*id);
        }
    }
    let diversify = policy.scoring.mmr_lambda < 1.0;
    let loaded = futures::future::try_join_all(
        wanted
            .iter()
            .map(|(&p, ids)| parts[p].load(req, query_vec, &plan, ids, diversify)),
    )
    .await?;
    let loaded: Vec<PartRecord> = loaded.into_iter().flatten().collect();
    for r in &loaded {
        if let (Some(ev), Some(s)) = (cands.by_id.get_mut(&r.record.id), r.similarity) {
            ev.similarity = Some(s);
        }
    }
    let records: Vec<&MemoryRecord> = loaded.iter().map(|r| &r.record).collect();
    let validity: HashMap<MemoryId, Validity> = loaded
        .iter()
        .filter_map(|r| Some((r.record.id, r.validity.clone()?)))
        .collect();
    let relevance = relevance(req, policy, &cands, &records);
    let rows = score_rows(req, policy, &records, &validity, &relevance, now);
    let embeddings: Vec<Option<&[f32]>> = loaded.iter().map(|r| r.embedding.as_deref()).collect();
    let order = order(req, policy, &rows, &embeddings);
    // Each returned record is moved out once (`order` names an index at most once).
    let mut why_of: HashMap<usize, (f32, Why)> =
        rows.into_iter().map(|r| (r.2, (r.0, r.1))).collect();
    let mut loaded: Vec<Option<PartRecord>> = loaded.into_iter().map(Some).collect();
    let ordered = order
        .iter()
        .filter_map(|&i| {
            let (score, mut why) = why_of.remove(&i)?;
            let part = loaded[i].take()?;
            why.passage = part.passage;
            Some((part.record, score, why))
        })
        .collect();
    let (result, reinforce) = finish(req, policy, ordered, now, notes);
    let mut per_part: Vec<WriteSet> = parts.iter().map(|_| WriteSet::new()).collect();
    for m in reinforce.0 {
        if let Mutation::Reinforce { id, .. } = &m
            && let Some(p) = part_of(id.0)
        {
            per_part[p].push(m);
        }
    }
    Ok((result, per_part))
}
