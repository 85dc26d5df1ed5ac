//! What happens to memories after they are written, as plain calls on the [`Substrate`]:
//! decay sweeps (strength lowered, archives, purges), extractive condensation of a
//! session's window, feedback (utility and strength from how using memories went), and
//! the status changes an operator makes (pin, obsolete, archive, purge) with the audit
//! history they leave. The actors decide *when* (policy interval, triggers, requests);
//! this module decides *what*, from the policy and the runtime clock only, so a simulation
//! on the virtual clock gets the same result every time.
//!
//! It never calls an LLM itself: in `[condensation] mode = "llm"` a [`Summarizer`] passed
//! in by the caller writes the condensed text (a summary, or a lesson: the record's kind
//! says which), and any failure of it falls back to the extractive text, with the reason
//! audited. And it never loses a decision to a race: decay writes are conditional on the
//! snapshot they were decided on ([`Mutation::PatchIf`]), and a condensation moves its
//! session's watermark in the same write as the condensed record.

use std::collections::HashMap;

use async_trait::async_trait;

use super::{Substrate, recall_number};
use crate::background::Priority;
use crate::clock::{Timestamp, to_human};
use crate::error::{Error, Result};
use crate::model::{AuditAction, AuditEntry, Kind, MemoryId, MemoryRecord, Status, Tier};
use crate::policy::{CondensationMode, ForgetDecision};
use crate::store::{Mutation, Queue, RecordPatch, Visit, WriteSet};

/// Records examined per write during a sweep: one commit per batch keeps a sweep of a
/// large store from holding one huge transaction.
const SWEEP_BATCH: usize = 512;

/// At most this many of a window's events are quoted in its condensed record.
const MAX_PICKS: usize = 5;

/// Quoted events are cut to this many characters.
const PICK_CHARS: usize = 240;

/// The largest window one condensation covers; older events wait for the next one.
const MAX_WINDOW: usize = 500;

/// What one decay sweep did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// Records looked at.
    pub examined: u64,
    /// Records whose stored strength was lowered.
    pub decayed: u64,
    /// Records archived (strength under `archive_below`).
    pub archived: u64,
    /// Archived records purged (`purge_archived_after` passed).
    pub purged: u64,
}

/// A condensed record just written.
#[derive(Debug, Clone, PartialEq)]
pub struct Condensed {
    /// Its id.
    pub id: MemoryId,
    /// The episodic records it condenses, oldest first.
    pub sources: Vec<MemoryId>,
    /// The events quoted in its text.
    pub picked: Vec<MemoryId>,
    /// Its text.
    pub text: String,
}

impl Substrate {
    /// One decay sweep over every record, at the runtime clock's `now`, each by its
    /// namespace's policy: lowers strength that fell by at least a step, archives what fell under
    /// `archive_below`, purges archives older than `purge_archived_after`. Pinned records,
    /// obsolete ones and protected kinds are left alone. Every change is audited as `by`.
    pub fn decay_sweep(&self, by: &str) -> Result<SweepReport> {
        let policies = self.policies();
        let now = self.clock().now();
        let store = self.store();
        // Decide on every reinforcement queued so far (recall does not wait for its own).
        store.write(WriteSet::new())?;
        let mut ids = Vec::new();
        store.for_each_id(|id| {
            ids.push(id);
            Ok(Visit::Continue)
        })?;
        let mut report = SweepReport::default();
        for chunk in ids.chunks(SWEEP_BATCH) {
            let mut writes = WriteSet::new();
            for &id in chunk {
                let Some(r) = store.get_light(id)? else {
                    continue;
                };
                report.examined += 1;
                let policy = policies.get(&r.namespace);
                let audit = |action, detail: String| AuditEntry {
                    at: now,
                    action,
                    by: by.to_string(),
                    detail,
                };
                match policy.forgetting(&r, now) {
                    ForgetDecision::Keep => {}
                    ForgetDecision::Decay { strength } => {
                        report.decayed += 1;
                        writes.push(Mutation::PatchIf {
                            id,
                            if_strength_at: r.strength_at,
                            patch: RecordPatch {
                                strength: Some((strength, now)),
                                policy: Some(policy.stamp()),
                                ..RecordPatch::default()
                            },
                            audit: audit(
                                AuditAction::Decayed,
                                format!("strength {:.3} -> {strength:.3}", r.strength),
                            ),
                        });
                    }
                    ForgetDecision::Archive { strength } => {
                        report.archived += 1;
                        writes.push(Mutation::PatchIf {
                            id,
                            if_strength_at: r.strength_at,
                            patch: RecordPatch {
                                status: Some((Status::Archived, now)),
                                strength: Some((strength, now)),
                                policy: Some(policy.stamp()),
                                ..RecordPatch::default()
                            },
                            audit: audit(
                                AuditAction::Archived,
                                format!(
                                    "strength {strength:.3} below forgetting.archive_below {}",
                                    policy.forgetting.archive_below
                                ),
                            ),
                        });
                    }
                    ForgetDecision::Purge => {
                        report.purged += 1;
                        let detail = format!(
                            "archived since {}, past forgetting.purge_archived_after",
                            to_human(r.status_at)
                        );
                        writes.push(Mutation::Audit(id, audit(AuditAction::Purged, detail)));
                        writes.push(Mutation::Purge(Box::new(r)));
                    }
                }
            }
            if !writes.0.is_empty() {
                store.write(writes)?;
            }
        }
        if report.purged > 0 {
            self.after_write(false);
        }
        tracing::debug!(?report, "decay sweep");
        Ok(report)
    }

    /// The session's episodic records not condensed yet, oldest first (at most
    /// [`MAX_WINDOW`]), with the largest id ever condensed.
    fn uncondensed(&self, namespace: &str, session: &str) -> Result<Vec<MemoryRecord>> {
        let store = self.store();
        let upto = store.condensed_upto(namespace, session)?;
        // Ids follow write order; condense in that order, oldest writes first. Only the
        // listing is read whole: records are read in id order until the window is full, so
        // a session that received thousands of events at once costs one window's reads.
        let mut ids = store.session_ids(namespace, session, None, usize::MAX)?;
        ids.retain(|id| upto.is_none_or(|u| *id > u));
        ids.sort_unstable();
        let mut window = Vec::new();
        for id in ids {
            if window.len() == MAX_WINDOW {
                break;
            }
            if let Some(r) = store.get_light(id)?
                && r.tier == Tier::Episodic
                && r.status.recallable()
            {
                window.push(r);
            }
        }
        Ok(window)
    }

    /// How many of the session's episodic records wait for condensation, and when the
    /// oldest of them was written; with [`Policy::condensation_due`](crate::policy::Policy::condensation_due)
    /// this says whether to condense now.
    pub fn condensation_backlog(
        &self,
        namespace: &str,
        session: &str,
    ) -> Result<(u64, Option<Timestamp>)> {
        let window = self.uncondensed(namespace, session)?;
        Ok((
            window.len() as u64,
            window.iter().map(|r| r.recorded_time).min(),
        ))
    }

    /// [`Substrate::condense_with`] without a summarizer: always extractive.
    pub async fn condense(
        &self,
        namespace: &str,
        session: &str,
        by: &str,
    ) -> Result<Option<Condensed>> {
        self.condense_with(namespace, session, by, None).await
    }

    /// Condenses the session's uncondensed episodic records (at least the policy's
    /// `min_events`; `None` when there are fewer) into one condensed record, extractively:
    /// the most representative and important events are quoted, in time order. The sources
    /// are linked and audited (`condensed into`), and the session's watermark moves in the
    /// same write, so each event is condensed once.
    ///
    /// Representativeness is centrality: an event's mean cosine similarity to the rest of
    /// the window, which favours what the window keeps coming back to over one-off noise.
    ///
    /// In `llm` mode, `summarizer` writes the text instead (given the window and the
    /// extractive picks); when it is missing, fails or answers nothing usable, the
    /// extractive text is kept and the condensed record's audit entry says why.
    pub async fn condense_with(
        &self,
        namespace: &str,
        session: &str,
        by: &str,
        summarizer: Option<&dyn Summarizer>,
    ) -> Result<Option<Condensed>> {
        self.condense_at(namespace, session, by, summarizer, Priority::Client)
            .await
    }

    /// [`Substrate::condense_with`] with its blocking part (reading and ranking the window)
    /// at `priority`: [`Priority::Background`] for a condensation nobody waits on (a policy
    /// trigger fired), so a burst of writes that fires triggers is not slowed by them.
    pub async fn condense_at(
        &self,
        namespace: &str,
        session: &str,
        by: &str,
        summarizer: Option<&dyn Summarizer>,
        priority: Priority,
    ) -> Result<Option<Condensed>> {
        let policy = self.policy_for(namespace);
        // Reading up to 500 records with their vectors and ranking them is blocking work:
        // off the async workers, which every request shares.
        let prepared = {
            let sub = self.clone();
            let (namespace, session) = (namespace.to_string(), session.to_string());
            let min_events = policy.condensation.min_events as usize;
            let promotable = policy.promotion.min_importance;
            crate::background::spawn_at(priority, move || -> Result<_> {
                let window = sub.uncondensed(&namespace, &session)?;
                if window.is_empty() || window.len() < min_events {
                    return Ok(None);
                }
                let mut embeddings = Vec::with_capacity(window.len());
                for r in &window {
                    embeddings.push(sub.store().embedding(r.id)?);
                }
                let picks = pick_representatives(&window, &embeddings, promotable);
                let text = summary_text(&window, &picks);
                Ok(Some((window, picks, text)))
            })
            .await
            .map_err(|e| Error::internal("preparing a condensation", e))??
        };
        let Some((window, picks, extractive)) = prepared else {
            return Ok(None);
        };
        let store = self.store();
        let now = self.clock().now();
        let extractive = Summary {
            text: extractive,
            lesson: false,
            cited: Vec::new(),
        };
        let (written, mode, how) = match policy.condensation.mode {
            CondensationMode::Extractive => (extractive, "extractive", "extractive".to_string()),
            CondensationMode::Llm => {
                let written = match summarizer {
                    None => Err("no summarizer is configured for `llm` mode".to_string()),
                    Some(w) => {
                        let picked: Vec<MemoryId> = picks.iter().map(|&i| window[i].id).collect();
                        let request = SummaryRequest {
                            namespace,
                            window: &window,
                            picked: &picked,
                            instructions: policy.condensation.prompt.as_deref(),
                            now,
                        };
                        match w.summarize(request).await {
                            Ok(t) if usable(&t.text, self.limits().max_text_bytes) => {
                                Ok((t, w.name()))
                            }
                            Ok(t) => Err(format!(
                                "{} wrote {} bytes, not a usable summary (empty or over {})",
                                w.name(),
                                t.text.len(),
                                self.limits().max_text_bytes
                            )),
                            Err(e) => Err(format!("{} failed: {e}", w.name())),
                        }
                    }
                };
                match written {
                    Ok((mut t, name)) => {
                        t.text = t.text.trim().to_string();
                        // Only the window's own records may be cited.
                        t.cited.retain(|id| window.iter().any(|r| r.id == *id));
                        (t, "llm", format!("written by {name}"))
                    }
                    Err(why) => (extractive, "extractive", format!("extractive; {why}")),
                }
            }
        };
        let text = written.text;
        let kind = if written.lesson {
            condensed_kind("lesson")
        } else {
            condensed_kind("summary")
        };
        let id = store.allocate_ids(1)?[0];
        let importance = picks
            .iter()
            .map(|&i| window[i].importance)
            .fold(0.0f32, f32::max);
        let sources: Vec<MemoryId> = window.iter().map(|r| r.id).collect();
        let picked: Vec<MemoryId> = picks.iter().map(|&i| window[i].id).collect();
        let (embedding, passages) = if self.embedder().embeds_inline() {
            match self.embed_records(&[text.as_str()]).await?.pop() {
                Some(e) => (Some(e.vector), e.passages),
                None => (None, Vec::new()),
            }
        } else {
            (None, Vec::new())
        };
        let last = window
            .last()
            .map_or(now, |r| r.event_time.max(r.recorded_time));
        let record = MemoryRecord {
            tier: Tier::Condensed,
            importance,
            strength: policy.initial_strength(importance),
            sources: sources.clone(),
            event_time: window.iter().map(|r| r.event_time).max().unwrap_or(last),
            agent_id: common_agent(&window),
            metadata: serde_json::json!({
                "condensed": {
                    "events": window.len(),
                    "from": window.iter().map(|r| r.event_time).min().unwrap_or(now),
                    "to": window.iter().map(|r| r.event_time).max().unwrap_or(now),
                    "picked": picked.iter().map(MemoryId::to_string).collect::<Vec<_>>(),
                    "mode": mode,
                }
            }),
            policy: policy.stamp(),
            embedding,
            ..MemoryRecord::episodic(id, namespace, session, kind, text.clone(), now)
        };
        let mut record = record;
        if !written.cited.is_empty()
            && let Some(condensed) = record.metadata.get_mut("condensed")
        {
            condensed["cited"] = serde_json::json!(
                written
                    .cited
                    .iter()
                    .map(MemoryId::to_string)
                    .collect::<Vec<_>>()
            );
        }
        let queued = record.embedding.is_none();
        let mut writes = WriteSet::new();
        // Eligible as written (a policy that asks for no successes): queued for promotion in
        // the same commit.
        if policy.promotion(&record).is_ok() {
            writes.push(Mutation::Enqueue(Queue::Promote, id));
        }
        writes.push(Mutation::Audit(
            id,
            AuditEntry {
                at: now,
                action: AuditAction::Created,
                by: by.to_string(),
                detail: format!("condensed from {} events ({how})", sources.len()),
            },
        ));
        for &source in &sources {
            writes.push(Mutation::Audit(
                source,
                AuditEntry {
                    at: now,
                    action: AuditAction::CondensedInto,
                    by: by.to_string(),
                    detail: format!("into {id}"),
                },
            ));
        }
        writes.push(Mutation::SetCondensedUpto {
            namespace: namespace.to_string(),
            session: session.to_string(),
            upto: sources.iter().copied().max().unwrap_or(MemoryId(0)),
        });
        if queued {
            writes.push(Mutation::Enqueue(Queue::Enrich, id));
        }
        if policy.updates.on() {
            writes.push(Mutation::Enqueue(Queue::Updates, id));
        }
        writes.push(Mutation::Insert(Box::new(record)));
        if !passages.is_empty() {
            writes.push(Mutation::SetPassages(id, passages));
        }
        store.write_async(writes).await?;
        self.after_write(queued);
        Ok(Some(Condensed {
            id,
            sources,
            picked,
            text,
        }))
    }
}

/// One window to condense, as a [`Summarizer`] sees it.
#[derive(Debug, Clone, Copy)]
pub struct SummaryRequest<'a> {
    /// The namespace the window belongs to (budgets are per namespace).
    pub namespace: &'a str,
    /// The session's uncondensed episodic records, in time order.
    pub window: &'a [MemoryRecord],
    /// The events the extractive condenser would quote, a hint of what matters.
    pub picked: &'a [MemoryId],
    /// The policy's `[condensation] prompt`, when it overrides the built-in guidance.
    pub instructions: Option<&'a str>,
    /// Runtime-clock time of the call.
    pub now: Timestamp,
}

/// What a [`Summarizer`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// The condensed text.
    pub text: String,
    /// A rule / lesson ("When …, do …", "Avoid …") rather than a summary: the condensed
    /// record's kind is `lesson` instead of `summary`.
    pub lesson: bool,
    /// The records of the window the text says it draws on (kept in the record's metadata;
    /// every record of the window is linked as a source either way).
    pub cited: Vec<MemoryId>,
}

/// Writes a condensed record's text from a window of episodic records (the `llm` mode of
/// `[condensation]`; [`crate::llm::condense::LlmCondenser`] is the LLM-backed one).
#[async_trait]
pub trait Summarizer: Send + Sync + std::fmt::Debug {
    /// Short name for the audit log (`llm:qwen2.5`).
    fn name(&self) -> &str;
    /// The condensed text of the request's window.
    async fn summarize(&self, request: SummaryRequest<'_>) -> Result<Summary>;
}

/// Whether a summarizer's text can be stored: not blank, within the text limit.
fn usable(text: &str, max_bytes: usize) -> bool {
    !text.trim().is_empty() && text.len() <= max_bytes
}

/// The kind of a condensed record: `summary` or `lesson`, both valid kind names.
fn condensed_kind(name: &'static str) -> Kind {
    Kind::new(name).unwrap_or_else(|_| unreachable!("`{name}` is a valid kind"))
}

/// `v` scaled to length 1 (all zeros for a near-zero vector, whose cosine with anything
/// is 0, as [`crate::index::cosine`] has it).
fn unit(v: &[f32]) -> Vec<f32> {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    match norm > f32::EPSILON.sqrt() {
        true => v.iter().map(|x| x / norm).collect(),
        false => vec![0.0; v.len()],
    }
}

/// Indexes into `window` of the events to quote, in time order: about √n of them
/// (1..=[`MAX_PICKS`]), the best by `centrality + importance / 10` — except that events as
/// important as the promotion threshold (`promotable`) come first, most important first.
/// Centrality favours what a window keeps coming back to, so without that rule a lesson
/// written once among routine events (the least central thing there) would never reach a
/// condensed record, and so could never be promoted. The count stays √n either way: a
/// window of important events is not quoted whole.
fn pick_representatives(
    window: &[MemoryRecord],
    embeddings: &[Option<Vec<f32>>],
    promotable: f32,
) -> Vec<usize> {
    let n = window.len();
    // Each event's mean cosine with the others. Cosine is the dot product of unit vectors,
    // so the sum over the others is the event's unit vector against the sum of all unit
    // vectors, less itself: one pass over the window instead of one per pair (pairwise, a
    // 500-event window would hold a core for tens of milliseconds).
    let units: Vec<Option<Vec<f32>>> = embeddings.iter().map(|e| e.as_deref().map(unit)).collect();
    let dims = units.iter().flatten().map(Vec::len).max().unwrap_or(0);
    let mut total = vec![0.0f64; dims];
    for u in units.iter().flatten() {
        for (t, x) in total.iter_mut().zip(u) {
            *t += f64::from(*x);
        }
    }
    let with_vectors = units.iter().flatten().count();
    let centrality: Vec<f32> = units
        .iter()
        .map(|u| {
            let Some(u) = u else {
                return 0.0;
            };
            let others = with_vectors - 1;
            if others == 0 {
                return 0.0;
            }
            let own: f64 = u.iter().map(|x| f64::from(*x) * f64::from(*x)).sum();
            let dot: f64 = u.iter().zip(&total).map(|(x, t)| f64::from(*x) * t).sum();
            ((dot - own) / others as f64) as f32
        })
        .collect();
    let (lo, hi) = centrality
        .iter()
        .fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &c| {
            (lo.min(c), hi.max(c))
        });
    let span = hi - lo;
    let score = |i: usize| {
        let c = if span > f32::EPSILON {
            (centrality[i] - lo) / span
        } else {
            1.0
        };
        c + window[i].importance / 10.0
    };
    let important = |i: usize| window[i].importance >= promotable;
    let want = ((n as f64).sqrt().round() as usize).clamp(1, MAX_PICKS);
    let mut order: Vec<usize> = (0..n).collect();
    // Promotable events first (most important first), then the best by score; ties keep
    // the earlier event.
    order.sort_by(|&a, &b| {
        important(b)
            .cmp(&important(a))
            .then_with(|| {
                if important(a) && important(b) {
                    window[b].importance.total_cmp(&window[a].importance)
                } else {
                    std::cmp::Ordering::Equal
                }
            })
            .then_with(|| score(b).total_cmp(&score(a)))
            .then(a.cmp(&b))
    });
    order.truncate(want);
    order.sort_by_key(|&i| (window[i].event_time, window[i].id));
    order
}

/// "12 events, 2026-03-01 09:00 – 2026-03-01 11:30. goal: …; observation: …"
fn summary_text(window: &[MemoryRecord], picks: &[usize]) -> String {
    let from: Timestamp = window.iter().map(|r| r.event_time).min().unwrap_or(0);
    let to: Timestamp = window.iter().map(|r| r.event_time).max().unwrap_or(0);
    let quoted: Vec<String> = picks
        .iter()
        .map(|&i| {
            let r = &window[i];
            let text: String = r.text.chars().take(PICK_CHARS).collect();
            let cut = if r.text.chars().count() > PICK_CHARS {
                "…"
            } else {
                ""
            };
            format!("{}: {}{cut}", r.kind, text.trim())
        })
        .collect();
    format!(
        "{} events, {} – {}. {}",
        window.len(),
        to_human(from),
        to_human(to),
        quoted.join("; ")
    )
}

/// The agent every event of the window came from, if there is exactly one.
fn common_agent(window: &[MemoryRecord]) -> Option<String> {
    let mut agents: HashMap<Option<&str>, usize> = HashMap::new();
    for r in window {
        *agents.entry(r.agent_id.as_deref()).or_default() += 1;
    }
    match agents.into_iter().collect::<Vec<_>>().as_slice() {
        [(Some(agent), _)] => Some(agent.to_string()),
        _ => None,
    }
}

/// What feedback is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FeedbackTarget {
    /// Every memory a recall returned (its `recall_id`).
    Recall(String),
    /// These memories.
    Memories(Vec<MemoryId>),
}

/// How it went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Using the memories helped.
    Success,
    /// Using them did not.
    Failure,
}

/// What feedback changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FeedbackReport {
    /// Memories whose utility was updated.
    pub updated: usize,
    /// Condensed memories that the promotion policy now admits into the knowledge pool.
    pub promotable: Vec<MemoryId>,
}

impl Substrate {
    /// Records how using some memories went: a success or failure is added to each one's
    /// utility, a success also reinforces its strength (by the policy's
    /// `reinforce_on_recall`), and both are audited. Unknown ids (or a recall of another
    /// namespace) are an error and change nothing. With a spread (a cluster placed by
    /// session), the memories other parts hold are sent to them; each part applies all of
    /// its memories or none, and this store's are checked before any part is sent its own
    /// and written after every part applied its own.
    pub async fn feedback(
        &self,
        namespace: &str,
        target: &FeedbackTarget,
        outcome: Outcome,
        by: &str,
    ) -> Result<FeedbackReport> {
        let (ids, source) = match target {
            FeedbackTarget::Recall(recall_id) => (
                self.recalled(namespace, recall_id).await?,
                format!("recall {recall_id}"),
            ),
            FeedbackTarget::Memories(ids) => (ids.clone(), "memory ids".to_string()),
        };
        let recall = match target {
            FeedbackTarget::Recall(recall_id) => recall_number(recall_id),
            FeedbackTarget::Memories(_) => None,
        };
        let (ids, elsewhere) = self.held_here(namespace, ids);
        if elsewhere.is_empty() {
            return self
                .feedback_on(namespace, ids, recall, outcome, by, &source)
                .await;
        }
        for &id in &ids {
            self.get(namespace, id)?;
        }
        let mut report = self
            .feedback_elsewhere(namespace, elsewhere, outcome, by, &source)
            .await?;
        let here = self
            .feedback_on(namespace, ids, recall, outcome, by, &source)
            .await?;
        report.updated += here.updated;
        report.promotable.extend(here.promotable);
        Ok(report)
    }

    /// Feedback on memories this store holds (every one of them checked before anything is
    /// written): [`Substrate::feedback`]'s work in one store, and what a part asked by
    /// another does with its share.
    pub(super) async fn feedback_on(
        &self,
        namespace: &str,
        ids: Vec<MemoryId>,
        recall: Option<u32>,
        outcome: Outcome,
        by: &str,
        source: &str,
    ) -> Result<FeedbackReport> {
        let policy = self.policy_for(namespace);
        let now = self.clock().now();
        // Read what recalls have queued (their reinforcement) before deciding on top of it.
        self.store().sync().await?;
        let mut records = Vec::with_capacity(ids.len());
        for id in ids {
            // Validate everything before writing anything.
            records.push(self.get(namespace, id)?);
        }
        let mut writes = WriteSet::new();
        // Candidates this feedback makes eligible are queued for promotion in the same
        // commit, so a crash after it cannot lose the promotion.
        let mut queued = Vec::new();
        for r in &records {
            let success = outcome == Outcome::Success;
            let mut after = r.clone();
            after.utility.successes += u32::from(success);
            after.utility.failures += u32::from(!success);
            if policy.promotion(&after).is_ok() && self.store().promoted_into(r.id)?.is_none() {
                writes.push(Mutation::Enqueue(Queue::Promote, r.id));
                queued.push(r.id);
            }
            let strength =
                success.then(|| policy.reinforce(r, now, policy.scoring.reinforce_on_recall));
            writes.push(Mutation::Audit(
                r.id,
                AuditEntry {
                    at: now,
                    action: AuditAction::Reinforced,
                    by: by.to_string(),
                    detail: match strength {
                        Some(s) => {
                            format!("success ({source}); strength {:.3} -> {s:.3}", r.strength)
                        }
                        None => format!("failure ({source})"),
                    },
                },
            ));
            writes.push(Mutation::Patch(
                r.id,
                RecordPatch {
                    strength: strength.map(|s| (s, now)),
                    add_reinforcements: u32::from(success),
                    add_successes: u32::from(success),
                    add_failures: u32::from(!success),
                    ..RecordPatch::default()
                },
            ));
        }
        if let Some(recall) = recall {
            writes.push(Mutation::RecallOutcome {
                recall,
                success: outcome == Outcome::Success,
            });
        }
        if !writes.0.is_empty() {
            self.store().write_async(writes).await?;
        }
        // Feedback from elsewhere may have landed between the read and the write: what is
        // eligible now is queued too.
        let mut promotable = Vec::new();
        let mut late = WriteSet::new();
        for r in &records {
            if let Ok(now) = self.get(namespace, r.id)
                && policy.promotion(&now).is_ok()
            {
                if !queued.contains(&now.id) && self.store().promoted_into(now.id)?.is_none() {
                    late.push(Mutation::Enqueue(Queue::Promote, now.id));
                }
                promotable.push(now.id);
            }
        }
        if !late.0.is_empty() {
            self.store().write_async(late).await?;
        }
        Ok(FeedbackReport {
            updated: records.len(),
            promotable,
        })
    }
}

/// The longest reason a status change may carry (it is kept in the record's history).
pub const MAX_REASON_BYTES: usize = 1024;

impl Substrate {
    /// Reads a record of `namespace` (another namespace's ids are not found).
    pub fn get(&self, namespace: &str, id: MemoryId) -> Result<MemoryRecord> {
        self.inner.store.get_in(namespace, id)
    }

    /// Changes a record's status (`active`, `pinned`, `obsolete`, `archived`, `wrong`),
    /// audited; [`Substrate::set_status_because`] with no reason.
    pub fn set_status(
        &self,
        namespace: &str,
        id: MemoryId,
        status: Status,
        by: &str,
    ) -> Result<MemoryRecord> {
        self.set_status_because(namespace, id, status, None, by)
    }

    /// Changes a record's status with the reason a person or client gave, which goes into
    /// its history with the change. Marking a record `wrong` also counts one failure in its
    /// utility, in the same write: the evidence that it misled is kept even if the record
    /// is later restored. Setting the status it already has changes nothing.
    pub fn set_status_because(
        &self,
        namespace: &str,
        id: MemoryId,
        status: Status,
        reason: Option<&str>,
        by: &str,
    ) -> Result<MemoryRecord> {
        check_reason(reason)?;
        let r = self.inner.store.get_in(namespace, id)?;
        if r.status == status {
            return Ok(r);
        }
        let now = self.inner.clock.now();
        let action = if status == Status::Archived {
            AuditAction::Archived
        } else {
            AuditAction::StatusChanged
        };
        let mut detail = format!("{} -> {}", r.status.as_str(), status.as_str());
        if let Some(reason) = reason.map(str::trim).filter(|r| !r.is_empty()) {
            detail.push_str(": ");
            detail.push_str(reason);
        }
        self.inner.store.write(WriteSet(vec![
            Mutation::Audit(
                id,
                AuditEntry {
                    at: now,
                    action,
                    by: by.into(),
                    detail,
                },
            ),
            Mutation::Patch(
                id,
                RecordPatch {
                    status: Some((status, now)),
                    add_failures: u32::from(status == Status::Wrong),
                    ..RecordPatch::default()
                },
            ),
        ]))?;
        self.inner.store.get_in(namespace, id)
    }

    /// Archives a record (soft delete: never recalled, recoverable until purged).
    pub fn archive(&self, namespace: &str, id: MemoryId, by: &str) -> Result<MemoryRecord> {
        self.set_status(namespace, id, Status::Archived, by)
    }

    /// Removes a record for good; its audit log keeps a `purged` entry.
    pub fn purge(&self, namespace: &str, id: MemoryId, by: &str) -> Result<()> {
        let r = self.inner.store.get_in(namespace, id)?;
        let now = self.inner.clock.now();
        self.inner.store.write(WriteSet(vec![
            Mutation::Audit(
                id,
                AuditEntry {
                    at: now,
                    action: AuditAction::Purged,
                    by: by.into(),
                    detail: format!("purged after {} as {}", r.status.as_str(), r.kind),
                },
            ),
            Mutation::Purge(Box::new(r)),
        ]))?;
        self.wake_indexer();
        Ok(())
    }

    /// A record's audit log (namespace-checked; kept after a purge).
    pub fn history(&self, namespace: &str, id: MemoryId) -> Result<Vec<AuditEntry>> {
        // Purged records keep a tombstone naming their namespace, so history stays isolated.
        // So does a quarantined input that never became a record.
        let owner = match self.inner.store.owner(id)? {
            Some(owner) => Some(owner),
            None => self.quarantine_entry(id)?.map(|q| q.namespace),
        };
        match owner {
            Some(owner) if owner == namespace => self.inner.store.history(id),
            _ => Err(Error::NotFound {
                what: "memory",
                id: id.to_string(),
            }),
        }
    }
}

/// Refuses a reason too long to keep in a history (a status change's, a resolution's).
pub(super) fn check_reason(reason: Option<&str>) -> Result<()> {
    match reason {
        Some(reason) if reason.len() > MAX_REASON_BYTES => Err(Error::invalid(
            "reason",
            format!(
                "is {} bytes; say why in at most {MAX_REASON_BYTES} bytes",
                reason.len()
            ),
        )),
        _ => Ok(()),
    }
}
