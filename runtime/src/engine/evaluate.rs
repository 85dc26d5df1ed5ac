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
//! after it. The LLM-backed judge is [`crate::llm::judge::LlmJudge`]; tests also drive the
//! seam with judges of their own. A batch is split by namespace before it reaches a judge,
//! so budgets and reuse stay per namespace and no prompt mixes two tenants' records.

use async_trait::async_trait;

use super::Substrate;
use crate::clock::Timestamp;
use crate::error::Result;
use crate::model::{AuditAction, AuditEntry, MemoryId};
use crate::store::{Mutation, Queue, RecordPatch, WriteSet};

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
    /// Its stored embedding, when it has one yet (for reusing a near-duplicate's verdict).
    pub embedding: Option<Vec<f32>>,
}

/// One call's worth of records, all of one namespace.
#[derive(Debug, Clone, Copy)]
pub struct JudgeBatch<'a> {
    /// The namespace the records belong to (budgets and reuse are per namespace).
    pub namespace: &'a str,
    /// The records, oldest first.
    pub items: &'a [JudgeItem],
    /// The policy's `[evaluation] prompt`, when it overrides the judge's built-in guidance.
    pub instructions: Option<&'a str>,
    /// Runtime-clock time of the call (the token budget's hours follow this clock).
    pub now: Timestamp,
}

/// The judge's verdict on one record, or why the rules' score stays for it.
pub type Verdict = std::result::Result<Judgement, String>;

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
    /// One verdict per item, in order. An `Err` verdict keeps that record's rules' score
    /// with the reason audited; an error keeps the rules' scores of the whole batch.
    async fn judge(&self, batch: JudgeBatch<'_>) -> Result<Vec<Verdict>>;
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
    /// actor; see `super::quarantine`).
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
        let policies = self.policies();
        let now = self.clock().now();
        let mut items = Vec::with_capacity(records.len());
        for r in &records {
            items.push(JudgeItem {
                id: r.id,
                kind: r.kind.as_str().to_string(),
                text: r.text.clone(),
                rules_importance: r.importance,
                embedding: self.store().embedding(r.id)?,
            });
        }
        // One call per namespace in the batch: budgets and reuse are per namespace, and a
        // judge must never see two namespaces' records side by side.
        let mut verdicts: Vec<Verdict> = vec![Err(String::new()); items.len()];
        let mut namespaces: Vec<&str> = records.iter().map(|r| r.namespace.as_str()).collect();
        namespaces.sort_unstable();
        namespaces.dedup();
        for namespace in namespaces {
            let positions: Vec<usize> = (0..records.len())
                .filter(|&i| records[i].namespace == namespace)
                .collect();
            let group: Vec<JudgeItem> = positions.iter().map(|&i| items[i].clone()).collect();
            let answered: Vec<Verdict> = match judge {
                None => vec![
                    Err("no judge is configured; set one up for `llm`/`hybrid` mode".into());
                    group.len()
                ],
                Some(j) => {
                    let batch = JudgeBatch {
                        namespace,
                        items: &group,
                        instructions: policies.get(namespace).evaluation.prompt.as_deref(),
                        now,
                    };
                    match j.judge(batch).await {
                        Ok(v) if v.len() == group.len() => v,
                        Ok(v) => vec![
                            Err(format!(
                                "the judge answered {} verdicts for {} records",
                                v.len(),
                                group.len()
                            ));
                            group.len()
                        ],
                        Err(e) => vec![Err(e.to_string()); group.len()],
                    }
                }
            };
            for (&i, verdict) in positions.iter().zip(answered) {
                verdicts[i] = verdict;
            }
        }
        let by = judge.map_or("evaluator", |j| j.name()).to_string();
        let scored = |detail: String| AuditEntry {
            at: now,
            action: AuditAction::Scored,
            by: by.clone(),
            detail,
        };
        for (i, r) in records.iter().enumerate() {
            let verdict = verdicts[i].as_ref().map_err(Clone::clone).and_then(valid);
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
                                    policies.get(&r.namespace).initial_strength(j.importance),
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
