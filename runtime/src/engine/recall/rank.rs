//! Ranking a recall, stage by stage: what the request may see, the candidates of each path,
//! the candidates read with their exact similarity, their fused relevance, the policy's
//! score, the order returned and what is shown of it.

use super::*;

impl Substrate {
    /// The synchronous core of recall; also returns the reinforcement writes to make. It
    /// runs as named stages: what the request may see ([`Substrate::scope_of`]), the
    /// candidates each path finds ([`Substrate::gather`]), the candidates read with their
    /// exact similarity ([`Substrate::load`]), their fused relevance ([`relevance`]), the
    /// policy's score ([`Substrate::score`]), the order returned ([`order`]) and what is
    /// shown of it ([`Substrate::present`]).
    pub fn rank(
        &self,
        req: &RecallRequest,
        query_vec: Option<&[f32]>,
        policy: &Arc<Policy>,
    ) -> Result<(RecallResult, WriteSet)> {
        // Read-your-writes: whatever was acknowledged is in the tails before we search.
        self.catch_up()?;
        let allowed = self.scope_of(req)?;
        let mut passages = PassageCache::default();
        let mut gathered = self.gather(req, query_vec, policy, &allowed, &mut passages)?;
        let loaded = self.load(req, query_vec, policy, &mut gathered, &mut passages)?;
        let records: Vec<&MemoryRecord> = loaded.records.iter().map(|(r, _)| r).collect();
        let relevance = relevance(req, policy, &gathered.cands, &records);
        let scored = self.score(req, policy, &records, &relevance)?;
        let embeddings: Vec<Option<&[f32]>> =
            loaded.records.iter().map(|(_, e)| e.as_deref()).collect();
        let order = order(req, policy, &scored.rows, &embeddings);
        self.present(
            req,
            query_vec,
            policy,
            Ranked {
                loaded,
                scored,
                order,
            },
            &mut passages,
            gathered.notes,
        )
    }

    /// The records `req` may see: its scope's episodic and condensed records (and the
    /// namespace's knowledge when asked), of the kinds asked, within its time window.
    pub(super) fn scope_of(&self, req: &RecallRequest) -> Result<RoaringBitmap> {
        let store = &self.inner.store;
        let episodic = [Tier::Episodic, Tier::Condensed];
        let (session, agent) = match req.scope {
            Scope::Session => (Some(req.session_id.as_str()), None),
            Scope::Agent => (
                None,
                Some(req.agent_id.as_deref().ok_or_else(|| {
                    Error::invalid(
                        "scope",
                        "`agent` scope needs an agent_id; send one or use `session`",
                    )
                })?),
            ),
            Scope::Namespace => (None, None),
        };
        let mut allowed = store.candidates(&Filter {
            namespace: &req.namespace,
            session,
            agent,
            tiers: Some(&episodic),
            kinds: req.kinds.as_deref(),
            recallable_only: true,
        });
        if req.include_knowledge {
            allowed |= store.candidates(&Filter {
                namespace: &req.namespace,
                tiers: Some(&[Tier::Knowledge]),
                kinds: req.kinds.as_deref(),
                recallable_only: true,
                ..Default::default()
            });
        }
        if req.since.is_some() || req.until.is_some() {
            allowed &= self.window_ids(req, session)?;
        }
        Ok(allowed)
    }

    /// The candidates of each path among `allowed`: the vector index's (long records by
    /// their best passage), the keyword index's (each hit read with its neighbouring turns
    /// when the policy says so) and, in a session, its latest records.
    fn gather(
        &self,
        req: &RecallRequest,
        query_vec: Option<&[f32]>,
        policy: &Policy,
        allowed: &RoaringBitmap,
        passages: &mut PassageCache,
    ) -> Result<Gathered> {
        let depth = (req.k * 4).max(50);
        let mut gathered = Gathered::default();
        if allowed.is_empty() {
            return Ok(gathered);
        }
        let store = &self.inner.store;
        if let Some(q) = query_vec {
            // A scope the vector index scores exactly (a session) is scored whole: those
            // are the candidates' similarities too, so their embeddings need not be read
            // again.
            let mut hits = if allowed.len() <= self.inner.vectors.options().exact_threshold {
                let all = self
                    .inner
                    .vectors
                    .search(q, allowed.len() as usize, Some(allowed))?;
                gathered.exact = Some(all.iter().copied().collect());
                all
            } else {
                self.inner.vectors.search(q, depth, Some(allowed))?
            };
            if allowed.len() <= PASSAGE_SCAN_MAX {
                gathered
                    .notes
                    .extend(self.scan_passages(q, allowed, passages, &mut hits)?);
            }
            settle(store, &mut hits, depth)?;
            gathered.cands.add_vector(&hits);
        }
        let (mut hits, counts) = self
            .inner
            .keywords
            .search_with_counts(&req.query, depth, allowed)?;
        settle(store, &mut hits, depth)?;
        let window = policy.scoring.context_window as usize;
        let weight = policy.scoring.context_weight;
        if window > 0 && weight > 0.0 && !hits.is_empty() {
            let context = Context {
                query: &req.query,
                allowed,
                counts: counts.as_ref(),
                window,
                weight,
                depth,
                session: (req.scope == Scope::Session)
                    .then_some((req.namespace.as_str(), req.session_id.as_str())),
            };
            gathered
                .cands
                .add_keyword(&self.keyword_in_context(&context, &hits)?);
        } else {
            gathered.cands.add_keyword(&hits);
        }
        if req.scope == Scope::Session {
            gathered.cands.add_recent(&self.recent_of(req, allowed)?);
        }
        Ok(gathered)
    }

    /// Adds to `hits` each long record of `allowed` by its best passage for `q`, newest
    /// records first, until [`PASSAGE_SCAN_BUDGET`] passages were scored; says so when the
    /// budget stopped it. A long record's detail lives in one passage, which its mean
    /// vector blurs: the best passage stands for the record.
    pub(super) fn scan_passages(
        &self,
        q: &[f32],
        allowed: &RoaringBitmap,
        passages: &mut PassageCache,
        hits: &mut Vec<(u32, f32)>,
    ) -> Result<Option<String>> {
        let store = &self.inner.store;
        let mut scanned = 0;
        for id in store.with_passages(allowed).iter().rev() {
            if scanned >= PASSAGE_SCAN_BUDGET {
                return Ok(Some(format!(
                    "only the newest long records' passages were compared with the query \
                     ({scanned} passages, the limit of one recall); older long records were \
                     found by their keywords and overall meaning only — narrow the scope or \
                     the time window to reach their passages"
                )));
            }
            if let Some(best) = passages.best(store, MemoryId(id), q)? {
                scanned += passages.of(store, MemoryId(id))?.len();
                hits.push((id, best.1));
            }
        }
        Ok(None)
    }

    /// Loads the candidates and their exact similarity to the query: the exact scope's
    /// scores, or computed here from the stored embedding. Every copy of a vector (the
    /// store's, the index's tail, cache and trees) holds the same stored values, so an exact
    /// score does not depend on where the index found the vector, and a replay ranks
    /// identically whatever the indexes had built by then; arroy's approximate scores are
    /// never used as similarities.
    fn load(
        &self,
        req: &RecallRequest,
        query_vec: Option<&[f32]>,
        policy: &Policy,
        gathered: &mut Gathered,
        passages: &mut PassageCache,
    ) -> Result<Loaded> {
        let store = &self.inner.store;
        let lambda = policy.scoring.mmr_lambda;
        let embeddings = query_vec.is_some() && (lambda < 1.0 || gathered.exact.is_none());
        let cands = &mut gathered.cands;
        let mut loaded = Loaded {
            records: Vec::with_capacity(cands.by_id.len()),
            unparsed: Vec::with_capacity(cands.by_id.len()),
        };
        let ids: Vec<MemoryId> = cands.by_id.keys().copied().collect();
        for ((mut r, json), ev) in store
            .get_many_deferred(&ids, embeddings)?
            .into_iter()
            .zip(cands.by_id.values_mut())
            .filter_map(|(r, ev)| Some((r?, ev)))
        {
            if !r.recallable() || r.namespace != req.namespace {
                continue;
            }
            let emb = r.embedding.take();
            let own = match (query_vec, &gathered.exact, emb.as_deref()) {
                (Some(_), Some(scores), _) => scores.get(&r.id.0).copied(),
                (Some(q), None, Some(e)) => Some(cosine(q, e)),
                _ => None,
            };
            if let (Some(q), Some(own)) = (query_vec, own) {
                let best = match is_long(&r.text) {
                    true => passages.best(store, r.id, q)?.map(|b| b.1),
                    false => None,
                };
                ev.similarity = Some(best.map_or(own, |b| b.max(own)));
            }
            loaded.records.push((r, emb));
            loaded.unparsed.push(Some(json));
        }
        Ok(loaded)
    }

    /// Each loaded record's score by the policy, best first (ties: newer first, then lower
    /// id): its relevance, recency, importance, utility and strength, a superseded record
    /// demoted unless the query asks about the past, and what is known against it.
    fn score(
        &self,
        req: &RecallRequest,
        policy: &Policy,
        records: &[&MemoryRecord],
        relevance: &HashMap<MemoryId, f32>,
    ) -> Result<Scored> {
        let now = self.inner.clock.now();
        // What is known against the candidates (few have an entry).
        let ids: Vec<MemoryId> = records.iter().map(|r| r.id).collect();
        let validity = self.validity_of(&ids)?;
        Ok(Scored {
            rows: score_rows(req, policy, records, &validity, relevance, now),
            now,
        })
    }

    /// What is returned of the ranking: the records in order, a long one by its best
    /// passage, within the token budget, rendered as the context, each with its score and
    /// why; and the reinforcement of each returned record.
    fn present(
        &self,
        req: &RecallRequest,
        query_vec: Option<&[f32]>,
        policy: &Arc<Policy>,
        ranked: Ranked,
        passages: &mut PassageCache,
        notes: Vec<String>,
    ) -> Result<(RecallResult, WriteSet)> {
        let store = &self.inner.store;
        let Ranked {
            loaded:
                Loaded {
                    records: mut loaded,
                    mut unparsed,
                },
            scored,
            order,
        } = ranked;
        for &i in &order {
            if let Some(json) = unparsed[i].take() {
                json.fill(&mut loaded[i].0)?;
            }
        }
        // A long record is shown by its best passage: the context names what matched and
        // stays within a prompt's budget whatever the record's length.
        let query_terms = analyze(&req.query);
        let mut hit_of: HashMap<MemoryId, PassageHit> = HashMap::new();
        for &i in &order {
            let r = &loaded[i].0;
            if let Some(hit) = passages.hit(store, r, query_vec, &query_terms)? {
                hit_of.insert(r.id, hit);
            }
        }
        // Each returned record is moved out once (`order` names an index at most once).
        let mut why_of: HashMap<usize, (f32, Why)> =
            scored.rows.into_iter().map(|s| (s.2, (s.0, s.1))).collect();
        let mut records: Vec<Option<MemoryRecord>> =
            loaded.into_iter().map(|(r, _)| Some(r)).collect();
        let ordered = order
            .iter()
            .filter_map(|&i| {
                let (score, mut why) = why_of.remove(&i)?;
                let record = records[i].take()?;
                why.passage = hit_of.get(&record.id).copied();
                Some((record, score, why))
            })
            .collect();
        Ok(finish(req, policy, ordered, scored.now, notes))
    }
}

/// What is returned of `ordered` (records best first, each with its score and why, a
/// long one's best passage in `why.passage`): as many as fit the token budget, a long
/// record shown by that passage, rendered as the context; and the reinforcement of each
/// returned record at `now`.
pub(super) fn finish(
    req: &RecallRequest,
    policy: &Arc<Policy>,
    ordered: Vec<(MemoryRecord, f32, Why)>,
    now: Timestamp,
    notes: Vec<String>,
) -> (RecallResult, WriteSet) {
    let shown: Vec<Cow<'_, MemoryRecord>> = ordered
        .iter()
        .map(|(r, _, why)| match &why.passage {
            Some(h) => Cow::Owned(passage_view(r, h)),
            None => Cow::Borrowed(r),
        })
        .collect();
    let ranked: Vec<&MemoryRecord> = shown.iter().map(|r| r.as_ref()).collect();
    let keep = retrieval::fit_budget(&ranked, req.token_budget);
    let context = retrieval::render_context(&ranked[..keep]);
    drop(shown);
    let mut memories = Vec::with_capacity(keep);
    let mut reinforce = WriteSet::new();
    let amount = policy.scoring.reinforce_on_recall;
    for (record, score, why) in ordered.into_iter().take(keep) {
        if amount > 0.0 {
            reinforce.push(Mutation::Reinforce {
                id: record.id,
                reinforcement: Reinforcement {
                    curve: Arc::clone(policy) as Arc<dyn Reinforce>,
                    at: now,
                    amount,
                },
                by: "recall".into(),
            });
        }
        memories.push(Recalled { record, score, why });
    }
    (
        RecallResult {
            policy: policy.stamp(),
            memories,
            context,
            recall_id: None,
            notes,
        },
        reinforce,
    )
}

/// The candidates of a recall's paths, before any is read ([`Substrate::gather`]).
#[derive(Default)]
struct Gathered {
    cands: Candidates,
    /// A scope scored whole by the vector index: every allowed record's similarity.
    exact: Option<HashMap<u32, f32>>,
    /// What the answer should say it went without.
    notes: Vec<String>,
}

/// The candidates read ([`Substrate::load`]): each recallable record with its embedding
/// when one was read, and its `content` and `metadata`, parsed only for those returned.
struct Loaded {
    records: Vec<(MemoryRecord, Option<Vec<f32>>)>,
    unparsed: Vec<Option<RawJson>>,
}

/// The loaded records scored, best first, as (score, why, index into the loaded records),
/// and the time they were scored at ([`Substrate::score`]).
struct Scored {
    rows: Vec<(f32, Why, usize)>,
    now: Timestamp,
}

/// A ranking to present: the loaded records, their scores and the order returned.
struct Ranked {
    loaded: Loaded,
    scored: Scored,
    order: Vec<usize>,
}

/// The fused relevance of each candidate (the policy's fusion of its paths). When the query
/// names a speaker or a time, what that speaker said and what happened then come first: the
/// others' relevance is divided by 1 + boost (dividing keeps relevance within 0..=1). A
/// query naming nothing any candidate fits changes nothing.
pub(super) fn relevance(
    req: &RecallRequest,
    policy: &Policy,
    cands: &Candidates,
    records: &[&MemoryRecord],
) -> HashMap<MemoryId, f32> {
    let fusion = match policy.scoring.fusion {
        Fusion::Rrf => FusionMethod::Rrf,
        Fusion::Weighted => FusionMethod::Weighted,
        Fusion::Calibrated => FusionMethod::Calibrated,
    };
    let mut relevance = retrieval::fuse(cands, fusion, policy.scoring.vector_weight);
    let mut prefer = |boost: f32, fits: &dyn Fn(&MemoryRecord) -> bool| {
        let fitting: HashSet<MemoryId> = records.iter().filter(|r| fits(r)).map(|r| r.id).collect();
        if boost > 0.0 && !fitting.is_empty() {
            for (id, v) in relevance.iter_mut() {
                if !fitting.contains(id) {
                    *v /= 1.0 + boost;
                }
            }
        }
    };
    if policy.scoring.speaker_boost > 0.0 {
        let query = analyze(&req.query);
        prefer(policy.scoring.speaker_boost, &|r| {
            retrieval::speaker_terms(&r.text).is_some_and(|s| retrieval::names_speaker(&query, &s))
        });
    }
    if policy.scoring.time_boost > 0.0 {
        let cues = retrieval::time_cues(&req.query);
        if !cues.is_empty() {
            prefer(policy.scoring.time_boost, &|r| {
                cues.iter().any(|c| c.fits(r.event_time))
            });
        }
    }
    relevance
}

/// Each record's score by the policy at `now`, best first (ties: newer first, then lower
/// id), as (score, why, index into `records`): its relevance, recency, importance, utility
/// and strength, a superseded record demoted unless the query asks about the past, and
/// what is known against it (`validity`, by id; a record without an entry is current).
pub(super) fn score_rows(
    req: &RecallRequest,
    policy: &Policy,
    records: &[&MemoryRecord],
    validity: &HashMap<MemoryId, Validity>,
    relevance: &HashMap<MemoryId, f32>,
    now: Timestamp,
) -> Vec<(f32, Why, usize)> {
    let as_history = !req.include_superseded && !retrieval::asks_about_past(&req.query);
    let demote = match as_history {
        true => policy.updates.superseded_weight,
        false => 1.0,
    };
    let mut rows: Vec<(f32, Why, usize)> = records
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let b = policy.score(&ScoreInput {
                relevance: relevance.get(&r.id).copied().unwrap_or(0.0),
                age_ms: policy.recency_age(r, now),
                importance: r.importance,
                utility: r.utility.mean(),
                strength: policy.strength_at(r, now),
            });
            let v = validity.get(&r.id);
            let why = Why {
                relevance: b.relevance,
                recency: b.recency,
                importance: b.importance,
                utility: b.utility,
                passage: None,
                superseded_by: v.and_then(|v| v.superseded_by),
                valid_until: v.and_then(|v| v.valid_until),
                conflicts_with: v.map(|v| v.conflicts.clone()).unwrap_or_default(),
            };
            let total = match why.superseded_by {
                Some(_) => b.total * demote,
                None => b.total,
            };
            (total, why, i)
        })
        .collect();
    if as_history {
        lift_successors(&mut rows, |i| records[i].id);
    }
    rows.sort_by(|a, b| {
        b.0.total_cmp(&a.0)
            .then_with(|| records[b.2].event_time.cmp(&records[a.2].event_time))
            .then_with(|| records[a.2].id.cmp(&records[b.2].id))
    });
    rows
}

/// The order returned: the best `k` by score, or, when the policy diversifies
/// (`mmr_lambda` < 1), maximal marginal relevance over the best `4k`.
/// `embeddings` holds each scored record's embedding, by its index.
pub(super) fn order(
    req: &RecallRequest,
    policy: &Policy,
    rows: &[(f32, Why, usize)],
    embeddings: &[Option<&[f32]>],
) -> Vec<usize> {
    let lambda = policy.scoring.mmr_lambda;
    if lambda < 1.0 {
        let pool = &rows[..rows.len().min(req.k * 4)];
        let scores: Vec<f32> = pool.iter().map(|s| s.0).collect();
        let embs: Vec<Option<&[f32]>> = pool.iter().map(|s| embeddings[s.2]).collect();
        retrieval::mmr(&scores, &embs, lambda, req.k)
            .into_iter()
            .map(|i| pool[i].2)
            .collect()
    } else {
        rows.iter().take(req.k).map(|s| s.2).collect()
    }
}
