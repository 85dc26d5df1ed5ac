//! Importance from a judge: the `llm` and `hybrid` modes of `[evaluation]`.
//!
//! Ingest never waits for a judge. At write time the policy's rules score every event (a
//! pure function of the policy, microseconds); in `llm` mode every event, and in `hybrid`
//! mode every event no rule matched, is also put on the store's evaluation queue in the
//! same commit. The Evaluator actor drains that queue in batches through
//! [`Substrate::evaluate`], which asks a [`Judge`] and writes each judged importance with
//! an audit entry. A judge that is missing, fails, or answers nonsense leaves the rules'
//! score in place — with the reason in the audit log — and the record leaves the queue
//! either way, so a broken provider never blocks anything.
//!
//! The queue lives in the store, so records accepted before a crash or a restart are judged
//! after it. The LLM-backed judge plugs in here (a separate piece of work); tests drive the
//! seam with judges of their own.

use async_trait::async_trait;

use crate::error::Result;
use crate::model::{AuditAction, AuditEntry, MemoryId};
use crate::store::{Mutation, Queue, RecordPatch, WriteSet};
use crate::substrate::Substrate;

/// A record as the judge sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct JudgeItem {
    /// The record.
    pub id: MemoryId,
    /// Its kind.
    pub kind: String,
    /// Its text.
    pub text: String,
    /// What the rules gave it (the fallback).
    pub rules_importance: f32,
}

/// The judge's verdict on one record.
#[derive(Debug, Clone, PartialEq)]
pub struct Judgement {
    /// Long-term importance, 0..=10.
    pub importance: f32,
    /// Why, in a few words (kept in the audit log).
    pub reason: String,
}

/// Scores the importance of a batch of records (an LLM judge, or anything else).
#[async_trait]
pub trait Judge: Send + Sync + std::fmt::Debug {
    /// Short name for the audit log (`llm:qwen2.5`).
    fn name(&self) -> &str;
    /// One judgement per item, in order. An error keeps the rules' scores.
    async fn judge(&self, items: &[JudgeItem]) -> Result<Vec<Judgement>>;
}

/// What one evaluation pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EvaluationReport {
    /// Records whose importance now comes from the judge.
    pub judged: usize,
    /// Records that kept the rules' score (no judge, judge error, invalid answer).
    pub kept_rules: usize,
    /// Queue entries whose record was gone (purged meanwhile).
    pub gone: usize,
    /// Records set aside because judging them kept failing (counted by the evaluator
    /// actor; see `crate::quarantine`).
    pub quarantined: usize,
}

impl Substrate {
    /// Up to `limit` records waiting for the judge, oldest first.
    pub fn evaluation_queue(&self, limit: usize) -> Result<Vec<MemoryId>> {
        self.store().queued(Queue::Evaluate, limit)
    }

    /// Judges `ids` (taken from [`Substrate::evaluation_queue`]) in one call to `judge`,
    /// writes the outcome of each with an audit entry, and takes them off the queue — all
    /// in one commit. `judge` is `None` when no judge is configured: the rules' scores stay.
    pub async fn evaluate(
        &self,
        ids: &[MemoryId],
        judge: Option<&dyn Judge>,
    ) -> Result<EvaluationReport> {
        let mut report = EvaluationReport::default();
        let mut writes = WriteSet::new();
        let mut records = Vec::with_capacity(ids.len());
        for &id in ids {
            writes.push(Mutation::Dequeue(Queue::Evaluate, id));
            writes.push(Substrate::clear_strikes(id));
            match self.store().get_light(id)? {
                Some(r) => records.push(r),
                None => report.gone += 1,
            }
        }
        let items: Vec<JudgeItem> = records
            .iter()
            .map(|r| JudgeItem {
                id: r.id,
                kind: r.kind.as_str().to_string(),
                text: r.text.clone(),
                rules_importance: r.importance,
            })
            .collect();
        let verdicts: std::result::Result<Vec<Judgement>, String> = match judge {
            None => Err("no judge is configured; set one up for `llm`/`hybrid` mode".into()),
            Some(_) if items.is_empty() => Ok(Vec::new()),
            Some(j) => match j.judge(&items).await {
                Ok(v) if v.len() == items.len() => Ok(v),
                Ok(v) => Err(format!(
                    "the judge answered {} verdicts for {} records",
                    v.len(),
                    items.len()
                )),
                Err(e) => Err(e.to_string()),
            },
        };
        let policy = self.policy();
        let now = self.clock().now();
        let by = judge.map_or("evaluator", |j| j.name()).to_string();
        let scored = |detail: String| AuditEntry {
            at: now,
            action: AuditAction::Scored,
            by: by.clone(),
            detail,
        };
        for (i, r) in records.iter().enumerate() {
            let verdict = match &verdicts {
                Ok(v) => valid(&v[i]),
                Err(e) => Err(e.clone()),
            };
            match verdict {
                Ok(j) => {
                    report.judged += 1;
                    writes.push(Mutation::Patch(
                        r.id,
                        RecordPatch {
                            importance: Some(j.importance),
                            ..RecordPatch::default()
                        },
                    ));
                    writes.push(Mutation::Audit(
                        r.id,
                        scored(format!(
                            "importance {} (judge; was {} by the rules): {}",
                            j.importance, r.importance, j.reason
                        )),
                    ));
                    // A record nothing has touched yet starts from the strength its judged
                    // importance gives; one already reinforced or decayed keeps its own.
                    if r.reinforcements == 0 {
                        writes.push(Mutation::PatchIf {
                            id: r.id,
                            if_strength_at: r.strength_at,
                            patch: RecordPatch {
                                strength: Some((
                                    policy.initial_strength(j.importance),
                                    r.strength_at,
                                )),
                                ..RecordPatch::default()
                            },
                            audit: scored("initial strength follows the judged importance".into()),
                        });
                    }
                }
                Err(reason) => {
                    report.kept_rules += 1;
                    writes.push(Mutation::Audit(
                        r.id,
                        scored(format!(
                            "importance {} kept from the rules: {reason}",
                            r.importance
                        )),
                    ));
                }
            }
        }
        self.store().write_async(writes).await?;
        Ok(report)
    }
}

/// A verdict the store can take: a finite importance in 0..=10.
fn valid(j: &Judgement) -> std::result::Result<Judgement, String> {
    if j.importance.is_finite() && (0.0..=10.0).contains(&j.importance) {
        Ok(j.clone())
    } else {
        Err(format!(
            "the judge's importance {} is not a number in 0..=10",
            j.importance
        ))
    }
}
