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

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::Substrate;
use crate::error::{Error, Result};
use crate::model::{AuditAction, AuditEntry, Edge, MemoryId, MemoryRecord, Reinforce, Relation};
use crate::policy::{UpdatesMode, UpdatesScope};
use crate::store::{Filter, Mutation, Queue, Reinforcement, Validity, ValidityChange, WriteSet};
use crate::updates::{Change, Claims, compare};

/// How many queued records one scheduled round takes: about a tenth of a second of
/// searches and comparisons (453 µs per record measured on BEAM).
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
            // The policy was turned off since the record was queued, or the record is too
            // long to state one fact.
            let short = |r: &MemoryRecord| r.text.len() <= u.max_chars as usize;
            if !u.on() || !short(&record) {
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
            // Long neighbours are passed over: a few more are asked for so that `candidates`
            // short ones are still compared where there are some.
            let hits =
                self.inner
                    .vectors
                    .search(embedding, 4 * u.candidates as usize, Some(&pool))?;
            let mut compared = 0;
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
                if !short(&other) {
                    continue;
                }
                if compared == u.candidates {
                    break;
                }
                compared += 1;
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
                                ValidityChange::Conflict {
                                    with: b,
                                    open: true,
                                },
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
            next = store.validity(n)?.superseded_by;
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
                    let Some(loser) = store.get_light(other)? else {
                        continue;
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
                    for (a, b) in [(id, other), (other, id)] {
                        writes.push(Mutation::Validity(
                            a,
                            ValidityChange::Conflict {
                                with: b,
                                open: false,
                            },
                        ));
                    }
                    writes.push(audit(id, format!("kept against {other}")));
                    writes.push(audit(other, format!("superseded by {id}, kept by hand")));
                }
            }
            Resolution::Dismiss => {
                for &other in &validity.conflicts {
                    writes.0.extend(contradiction(id, other));
                    for (a, b) in [(id, other), (other, id)] {
                        writes.push(Mutation::Validity(
                            a,
                            ValidityChange::Conflict {
                                with: b,
                                open: false,
                            },
                        ));
                        writes.push(audit(a, format!("conflict with {b} dismissed")));
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
                writes.push(audit(by_id, format!("no longer supersedes {id}")));
            }
        }
        store.write(writes)?;
        self.chain(namespace, id)
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
