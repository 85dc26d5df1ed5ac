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
//! Detection runs after each keyword indexing pass ([`Substrate::index_step`]), so both
//! schedulers — the substrate's own indexer thread and the runtime's Indexer actor — run
//! it without knowing about it.

use std::collections::HashSet;
use std::sync::Arc;

use super::Substrate;
use crate::error::Result;
use crate::model::{AuditAction, AuditEntry, Edge, MemoryId, MemoryRecord, Reinforce, Relation};
use crate::policy::{UpdatesMode, UpdatesScope};
use crate::store::{Filter, Mutation, Queue, Reinforcement, ValidityChange, WriteSet};
use crate::updates::{Change, Claims, compare};

/// How many queued records one scheduled round takes: a few milliseconds of searches.
const ROUND: usize = 256;

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
}

impl Substrate {
    /// Compares up to `max` queued records (oldest first) with their nearest older records
    /// and writes what it finds (see the module docs). Records still waiting for their
    /// embedding stay queued for a later round.
    pub fn detect_updates(&self, max: usize) -> Result<UpdatesRound> {
        let _one_round = self
            .inner
            .updates_lock
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let store = &self.inner.store;
        let ids = store.queued(Queue::Updates, max)?;
        let mut round = UpdatesRound::default();
        if ids.is_empty() {
            return Ok(round);
        }
        // The older records' vectors must be searchable, even those still in the tails.
        self.catch_up()?;
        let now = self.inner.clock.now();
        let mut writes = WriteSet::new();
        // Compared in this round: their queue items go with this write, so a newer record
        // later in the round must not take them for ones still waiting.
        let mut done: HashSet<MemoryId> = HashSet::new();
        for id in ids {
            let Some(record) = store.get(id)? else {
                writes.push(Mutation::Dequeue(Queue::Updates, id));
                continue;
            };
            let policy = self.policy_for(&record.namespace);
            let u = &policy.updates;
            let Some(embedding) = record.embedding.as_deref() else {
                if u.on() && store.is_queued(Queue::Enrich, id)? {
                    round.waiting += 1;
                } else {
                    writes.push(Mutation::Dequeue(Queue::Updates, id));
                }
                continue;
            };
            writes.push(Mutation::Dequeue(Queue::Updates, id));
            done.insert(id);
            round.compared += 1;
            // The policy was turned off since the record was queued.
            if !u.on() {
                continue;
            }
            // Within its tier: a condensed record restates its own sources, and knowledge
            // is checked against knowledge when it is promoted.
            let tier = [record.tier];
            let mut pool = store.candidates(&Filter {
                namespace: &record.namespace,
                session: (u.scope == UpdatesScope::Session).then_some(record.session_id.as_str()),
                tiers: Some(&tier),
                recallable_only: true,
                ..Filter::default()
            });
            pool.remove(id.0);
            let hits = self
                .inner
                .vectors
                .search(embedding, u.candidates as usize, Some(&pool))?;
            let by = format!(
                "updates:{}",
                match u.mode {
                    UpdatesMode::Off => "off",
                    UpdatesMode::Rules => "rules",
                }
            );
            let claims = Claims::of(&record.text);
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
                let other_claims = Claims::of(&other.text);
                let (newer, older, finding) = if is_newer(&record, &other) {
                    let f = compare(&claims, &other_claims, similarity, &u.thresholds);
                    (&record, &other, f)
                } else {
                    let f = compare(&other_claims, &claims, similarity, &u.thresholds);
                    (&other, &record, f)
                };
                let change = match finding.change {
                    Change::Supersedes if !clear_order(newer, older) => Change::Contradicts,
                    c => c,
                };
                let audit = |id: MemoryId, action: AuditAction, detail: String| {
                    Mutation::Audit(
                        id,
                        AuditEntry {
                            at: now,
                            action,
                            by: by.clone(),
                            detail,
                        },
                    )
                };
                let reason = &finding.reason;
                match change {
                    Change::Supersedes => {
                        round.superseded += 1;
                        writes.push(edge(newer, older, Relation::Supersedes));
                        writes.push(Mutation::Validity(
                            older.id,
                            ValidityChange::SupersededBy {
                                by: newer.id,
                                until: newer.event_time,
                                at: now,
                            },
                        ));
                        writes.push(audit(
                            older.id,
                            AuditAction::Superseded,
                            format!("superseded by {} ({reason})", newer.id),
                        ));
                        writes.push(audit(
                            newer.id,
                            AuditAction::Superseded,
                            format!("supersedes {} ({reason})", older.id),
                        ));
                    }
                    Change::Contradicts => {
                        round.contradicted += 1;
                        writes.push(edge(newer, older, Relation::Contradicts));
                        for (a, b) in [(newer.id, older.id), (older.id, newer.id)] {
                            writes.push(Mutation::Validity(
                                a,
                                ValidityChange::Conflict { with: b, open: true },
                            ));
                            writes.push(audit(
                                a,
                                AuditAction::Contradicted,
                                format!("in conflict with {b} ({reason})"),
                            ));
                        }
                    }
                    Change::Duplicate => {
                        round.repeated += 1;
                        writes.push(Mutation::Validity(
                            newer.id,
                            ValidityChange::DuplicateOf(older.id),
                        ));
                        writes.push(audit(
                            newer.id,
                            AuditAction::Repeated,
                            format!("repeats {} ({reason})", older.id),
                        ));
                        // Stating a fact again is evidence that it matters, as a recall is.
                        writes.push(Mutation::Reinforce {
                            id: older.id,
                            reinforcement: Reinforcement {
                                curve: Arc::clone(&policy) as Arc<dyn Reinforce>,
                                at: now,
                                amount: policy.scoring.reinforce_on_recall,
                            },
                            by: format!("{by} (repeated by {})", newer.id),
                        });
                    }
                    Change::Unrelated => {}
                }
            }
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
            total.compared += r.compared;
            total.superseded += r.superseded;
            total.contradicted += r.contradicted;
            total.repeated += r.repeated;
            total.waiting = r.waiting;
            if r.compared == 0 {
                return Ok(total);
            }
        }
    }

    /// One scheduled round, logged; whether more waits to be compared now.
    pub(super) fn updates_step(&self) -> bool {
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

/// Whether `a` happened after `b`: later event time, or the same time and written later.
fn is_newer(a: &MemoryRecord, b: &MemoryRecord) -> bool {
    (a.event_time, a.id) > (b.event_time, b.id)
}

/// Whether a newer value clearly replaces the older one: the two happened at different
/// times, or in one session (where arrival order is the order), and nobody reinforced the
/// older one after the newer was written.
fn clear_order(newer: &MemoryRecord, older: &MemoryRecord) -> bool {
    let ordered = newer.event_time != older.event_time || newer.session_id == older.session_id;
    let reinforced_since = older.reinforcements > 0 && older.strength_at > newer.recorded_time;
    ordered && !reinforced_since
}

fn edge(from: &MemoryRecord, to: &MemoryRecord, relation: Relation) -> Mutation {
    Mutation::PutEdge(
        from.namespace.clone(),
        Edge {
            from: from.id,
            to: to.id,
            relation,
        },
    )
}
