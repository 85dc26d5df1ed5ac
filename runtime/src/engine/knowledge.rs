//! The namespace knowledge pool: knowledge-tier records, and typed edges between records
//! (`derived_from`, `similar_to`, `supersedes`, `contradicts`) kept in the store's edge
//! table and loaded into a petgraph [`GraphMap`](petgraph::graphmap::GraphMap) for queries.
//!
//! Promotion takes a condensed record that the policy admits (importance, utility,
//! successes) into the pool. If a knowledge record is already within `merge_similarity`
//! of it, the candidate is merged into that one — its sources and support grow — instead
//! of adding a near-duplicate; otherwise a new knowledge record is written, linked
//! `derived_from` its source and `similar_to` related knowledge. Each condensed record is
//! promoted at most once (a marker is written in the same commit).
//!
//! Promotion is durable work, like embedding: feedback and condensation put a record the
//! policy admits on the store's promotion queue in the same commit that made it eligible,
//! and [`Substrate::promote_waiting`] takes it off the queue only once a promotion decided
//! about it. A candidate needs its embedding (to find the knowledge it merges with), which
//! under a model that embeds in the background usually lands after the feedback: it stays
//! queued ([`Promotion::Waiting`]) and the enricher's commit wakes the promotion again
//! ([`Substrate::on_promotion_ready`]), whatever the order, and across restarts.
//!
//! Under a policy whose `[updates]` section is on, a candidate is also read against the
//! knowledge it is near ([`crate::updates::compare`]) before it is merged or written:
//! - a newer value of a lesson (a changed number, place, rule …) becomes a new knowledge
//!   record that supersedes the old one (a `supersedes` edge and the old one's validity),
//!   never merged into it;
//! - a claim incompatible with a lesson, with no clear order between them, is **held for
//!   review**: a `contradicts` edge and an open conflict on both sides (listed in the
//!   insights and on the records), nothing promoted or merged until a person settles it
//!   ([`Substrate::resolve`]); a candidate already in an open conflict is held too;
//! - a candidate that is itself superseded (unless it has more successes than the record
//!   that superseded it), or an older value than the lesson, is not promoted.
//!
//! Knowledge records live in the namespace's [`KNOWLEDGE_SESSION`], so they are recalled
//! by any session of the namespace that asks for `include_knowledge`, and by no other
//! namespace.

use std::collections::{HashSet, VecDeque};

use petgraph::Direction;
use petgraph::graphmap::DiGraphMap;

use super::Substrate;
use super::updates::{clear_order, is_newer};
use crate::clock::Timestamp;
use crate::error::Result;
use crate::model::{AuditAction, AuditEntry, Edge, Kind, MemoryId, MemoryRecord, Relation, Tier};
use crate::policy::Policy;
use crate::store::{Filter, Mutation, Queue, ValidityChange, WriteSet};
use crate::updates::{Change, Claims, compare};

/// The session that holds a namespace's knowledge records.
pub const KNOWLEDGE_SESSION: &str = "_knowledge";

/// Knowledge at least this similar to a new node (but under `merge_similarity`) is linked
/// `similar_to` it.
const SIMILAR_TO: f32 = 0.75;

/// Knowledge records compared with each promotion candidate.
const MERGE_CANDIDATES: usize = 5;

/// Candidates one [`Substrate::promote_waiting`] call looks at by default (the queue holds
/// condensed records with feedback, a few per session).
pub const PROMOTE_ROUND: usize = 1024;

/// What a promotion did.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Promotion {
    /// A new knowledge record.
    Created {
        /// The knowledge record.
        knowledge: MemoryId,
        /// The edges written with it.
        edges: Vec<Edge>,
    },
    /// Merged into an existing knowledge record, whose support grew.
    Merged {
        /// The knowledge record.
        knowledge: MemoryId,
        /// Its support (condensed records merged into it) now.
        support: usize,
    },
    /// Promoted before, into this knowledge record; nothing changed.
    AlreadyPromoted {
        /// The knowledge record.
        knowledge: MemoryId,
    },
    /// Held for review: it contradicts knowledge (or is one side of an open conflict), so
    /// nothing was promoted or merged until a person settles the conflict.
    Held {
        /// The records it is in open conflict with.
        against: Vec<MemoryId>,
        /// The edges written now (none when the conflict was open already).
        edges: Vec<Edge>,
        /// Why, and what to do.
        reason: String,
    },
    /// The policy does not admit it (every reason, joined with `; `).
    NotEligible(String),
    /// Admitted, but its embedding is not stored yet: it waits on the promotion queue and
    /// is promoted as soon as the enricher stores it (the reason says so).
    Waiting(String),
}

/// The lessons a candidate is held against, each with why.
pub(super) type Conflicts = Vec<(MemoryId, String)>;

/// What the candidate is to the knowledge near it (see the module docs).
#[derive(Default)]
struct Against {
    /// Current lessons it states a newer value of, with the reason.
    supersedes: Vec<(MemoryId, String)>,
    /// Lessons a person already took as superseded by the candidate itself (kept by hand):
    /// the new knowledge record takes the candidate's place in their chain.
    kept_against: Vec<MemoryId>,
    /// Lessons it contradicts, with the reason.
    contradicts: Conflicts,
    /// A lesson it states an older value of, with the reason.
    older_than: Option<(MemoryId, String)>,
}

/// A namespace's knowledge graph, in memory.
#[derive(Debug, Clone, Default)]
pub struct Graph {
    graph: DiGraphMap<u32, Relation>,
}

impl Graph {
    /// Adds (or replaces) an edge.
    pub fn add(&mut self, e: Edge) {
        self.graph.add_edge(e.from.0, e.to.0, e.relation);
    }

    /// Every edge.
    pub fn edges(&self) -> Vec<Edge> {
        self.graph
            .all_edges()
            .map(|(from, to, &relation)| Edge {
                from: MemoryId(from),
                to: MemoryId(to),
                relation,
            })
            .collect()
    }

    /// The records within `depth` edges of `around` (edges followed both ways), `around`
    /// first, and the edges among them.
    pub fn neighbourhood(&self, around: MemoryId, depth: usize) -> (Vec<MemoryId>, Vec<Edge>) {
        self.neighbourhood_within(around, depth, usize::MAX)
            .unwrap_or_else(|| unreachable!("no graph has more than usize::MAX records"))
    }

    /// [`Graph::neighbourhood`], or `None` as soon as it would hold more than `max`
    /// records: the walk stops there, so a deep query over a dense graph costs no more
    /// than `max` records' worth.
    pub fn neighbourhood_within(
        &self,
        around: MemoryId,
        depth: usize,
        max: usize,
    ) -> Option<(Vec<MemoryId>, Vec<Edge>)> {
        let mut seen = HashSet::from([around.0]);
        let mut order = vec![around];
        let mut queue = VecDeque::from([(around.0, 0usize)]);
        while let Some((node, d)) = queue.pop_front() {
            if d == depth || !self.graph.contains_node(node) {
                continue;
            }
            let next = self
                .graph
                .neighbors_directed(node, Direction::Outgoing)
                .chain(self.graph.neighbors_directed(node, Direction::Incoming));
            for n in next {
                if seen.insert(n) {
                    if order.len() >= max {
                        return None;
                    }
                    order.push(MemoryId(n));
                    queue.push_back((n, d + 1));
                }
            }
        }
        let edges = self
            .graph
            .all_edges()
            .filter(|(from, to, _)| seen.contains(from) && seen.contains(to))
            .map(|(from, to, &relation)| Edge {
                from: MemoryId(from),
                to: MemoryId(to),
                relation,
            })
            .collect();
        Some((order, edges))
    }
}

impl Substrate {
    /// Loads a namespace's knowledge graph from the store.
    pub fn knowledge_graph(&self, namespace: &str) -> Result<Graph> {
        let mut graph = Graph::default();
        for edge in self.store().edges(namespace, None)? {
            graph.add(edge);
        }
        Ok(graph)
    }

    /// Writes an edge between two records of the namespace (both must exist there).
    pub fn link(&self, namespace: &str, edge: Edge, by: &str) -> Result<()> {
        self.get(namespace, edge.from)?;
        self.get(namespace, edge.to)?;
        let now = self.clock().now();
        self.store().write(WriteSet(vec![
            edge_write(namespace, edge),
            Mutation::Audit(
                edge.from,
                AuditEntry {
                    at: now,
                    action: AuditAction::Linked,
                    by: by.to_string(),
                    detail: format!("{} {}", edge.relation.as_str(), edge.to),
                },
            ),
        ]))
    }

    /// Promotes a condensed record into the namespace knowledge pool, or merges it into a
    /// knowledge record within the policy's `merge_similarity` (see the module docs).
    ///
    /// A candidate whose embedding is not stored yet is queued and answered
    /// [`Promotion::Waiting`]; every other answer takes it off the promotion queue.
    pub async fn promote(&self, namespace: &str, id: MemoryId, by: &str) -> Result<Promotion> {
        // One promotion at a time: two candidates near each other must not both create a
        // knowledge record (the second merges into the first).
        let _one = self.inner.promoting.lock().await;
        let promotion = self.promote_once(namespace, id, by).await?;
        let store = self.store();
        match &promotion {
            // Dequeued in the promotion's own commit.
            Promotion::Created { .. } | Promotion::Merged { .. } => self.count_promotion(),
            // Queued in its own commit when it was not already.
            Promotion::Waiting(_) => {}
            // Decided without a write: nothing left to wait for.
            _ if store.is_queued(Queue::Promote, id)? => {
                store
                    .write_async(WriteSet(vec![Mutation::Dequeue(Queue::Promote, id)]))
                    .await?;
            }
            _ => {}
        }
        Ok(promotion)
    }

    /// Promotes what waits on the promotion queue (up to `max` candidates, oldest first)
    /// whose embeddings are stored; the rest stay queued. Returns each candidate tried and
    /// what became of it. The owner of promotion calls it when woken
    /// ([`Substrate::on_promotion_ready`]) and at start, for what an earlier process left.
    pub async fn promote_waiting(
        &self,
        max: usize,
        by: &str,
    ) -> Result<Vec<(MemoryId, Promotion)>> {
        let store = self.store();
        let mut out = Vec::new();
        for id in store.queued(Queue::Promote, max)? {
            // Still waiting: nothing to decide (and nothing to read past the two lookups).
            if store.is_queued(Queue::Enrich, id)? && store.embedding(id)?.is_none() {
                continue;
            }
            let Some(record) = store.get_light(id)? else {
                // Purged while queued.
                store
                    .write_async(WriteSet(vec![Mutation::Dequeue(Queue::Promote, id)]))
                    .await?;
                continue;
            };
            let promotion = self.promote(&record.namespace, id, by).await?;
            out.push((id, promotion));
        }
        Ok(out)
    }

    /// Makes `wake` the owner of promotion's wake-up, called when the enricher stores the
    /// embedding of a queued candidate (`None` removes it). The actor runtime hands it to
    /// its knowledge actor, which calls [`Substrate::promote_waiting`]; a caller of the
    /// substrate alone decides when to promote and calls it itself.
    pub fn on_promotion_ready(&self, wake: Option<super::EnrichWake>) {
        self.inner.promotion_wake.set(wake);
    }

    async fn promote_once(&self, namespace: &str, id: MemoryId, by: &str) -> Result<Promotion> {
        let store = self.store();
        if let Some(knowledge) = store.promoted_into(id)? {
            return Ok(Promotion::AlreadyPromoted { knowledge });
        }
        let policy = self.policy_for(namespace);
        let candidate = self.get(namespace, id)?;
        if let Err(why) = policy.promotion(&candidate) {
            return Ok(Promotion::NotEligible(why));
        }
        let validity = store.validity(id)?;
        if let Some(newer) = validity.superseded_by {
            // A lesson proven by more successes than the claim that replaced it stays
            // eligible: for what to do, outcomes are better evidence than which was said
            // last (two remedies told for one situation read as a rule that changed).
            let successor = store.get_light(newer)?;
            if successor.is_none_or(|s| s.utility.successes >= candidate.utility.successes) {
                return Ok(Promotion::NotEligible(format!(
                    "it is superseded by {newer}; the current value is what gets promoted"
                )));
            }
        }
        if !validity.conflicts.is_empty() {
            return Ok(Promotion::Held {
                reason: held_reason(id, &validity.conflicts),
                against: validity.conflicts,
                edges: Vec::new(),
            });
        }
        let Some(embedding) = store.embedding(id)? else {
            // No embedding is coming: making it kept failing and the record was set aside
            // (quarantined), or the embedder never made one.
            if !store.is_queued(Queue::Enrich, id)? {
                return Ok(Promotion::NotEligible(
                    "it has no embedding and none is queued (embedding it kept failing: see \
                     the quarantine); it cannot be compared with the knowledge pool"
                        .into(),
                ));
            }
            // Queued (durably) rather than refused: the enricher's commit wakes it again.
            if !store.is_queued(Queue::Promote, id)? {
                store
                    .write_async(WriteSet(vec![Mutation::Enqueue(Queue::Promote, id)]))
                    .await?;
            }
            return Ok(Promotion::Waiting(
                "its embedding is not stored yet; it is queued and promoted once the enricher \
                 stores it"
                    .into(),
            ));
        };
        // A person who settled a conflict of this candidate by hand decided about it: it
        // is not held again for the same knowledge (read only when updates are compared).
        let settled = policy.updates.on()
            && store
                .audit_entries(id)?
                .iter()
                .any(|e| e.action == AuditAction::Resolved);
        if let Some(home) = self.knowledge_home(namespace) {
            // Placed by session, the namespace's pool lives in one partition: it decides
            // and writes the pool's side; this store writes the candidate's.
            let (outcome, conflicts) = self
                .promote_at(home, namespace, &candidate, embedding, settled, by)
                .await?;
            let writes = candidate_side(id, &outcome, &conflicts, by, self.clock().now());
            if !writes.0.is_empty() {
                store.write_async(writes).await?;
            }
            return Ok(outcome);
        }
        let (outcome, mut writes, conflicts) =
            self.pool_side(namespace, &candidate, embedding, settled, by)?;
        writes
            .0
            .extend(candidate_side(id, &outcome, &conflicts, by, self.clock().now()).0);
        if !writes.0.is_empty() {
            store.write_async(writes).await?;
            self.after_write(false);
        }
        Ok(outcome)
    }

    /// The pool's side of promoting `candidate` (with its `embedding`) into this store's
    /// knowledge pool: what became of it, the writes on the pool (knowledge records,
    /// edges, their audits and validity), and the lessons it contradicts with why. The
    /// candidate's own side (its audit, marker, dequeue, conflicts) is
    /// [`candidate_side`]'s, written where the candidate lives.
    pub(super) fn pool_side(
        &self,
        namespace: &str,
        candidate: &MemoryRecord,
        embedding: Vec<f32>,
        settled: bool,
        by: &str,
    ) -> Result<(Promotion, WriteSet, Conflicts)> {
        let store = self.store();
        let id = candidate.id;
        let policy = self.policy_for(namespace);
        // The indexes must hold every knowledge record written so far.
        self.catch_up()?;
        let pool = store.candidates(&Filter {
            namespace,
            tiers: Some(&[Tier::Knowledge]),
            recallable_only: true,
            ..Filter::default()
        });
        let near = if pool.is_empty() {
            Vec::new()
        } else {
            self.vectors()
                .search(&embedding, MERGE_CANDIDATES, Some(&pool))?
        };
        let now = self.clock().now();
        let audit = |action, detail: String| AuditEntry {
            at: now,
            action,
            by: by.to_string(),
            detail,
        };
        let mut writes = WriteSet::new();
        let against = self.against_knowledge(&policy, candidate, &near, settled)?;
        if let Some((k, reason)) = against.older_than {
            let why = format!("it states an older value than knowledge {k} ({reason})");
            return Ok((Promotion::NotEligible(why), writes, Vec::new()));
        }
        if !against.contradicts.is_empty() {
            let mut edges = Vec::new();
            let mut ids = Vec::new();
            for (k, reason) in &against.contradicts {
                let e = Edge {
                    from: id,
                    to: *k,
                    relation: Relation::Contradicts,
                };
                writes.push(edge_write(namespace, e));
                edges.push(e);
                ids.push(*k);
                writes.push(Mutation::Validity(
                    *k,
                    ValidityChange::Conflict {
                        with: id,
                        open: true,
                    },
                ));
                writes.push(Mutation::Audit(
                    *k,
                    audit(
                        AuditAction::Contradicted,
                        format!("in conflict with {id}, held for review ({reason})"),
                    ),
                ));
            }
            let held = Promotion::Held {
                reason: held_reason(id, &ids),
                against: ids,
                edges,
            };
            return Ok((held, writes, against.contradicts));
        }
        let superseding = !against.supersedes.is_empty() || !against.kept_against.is_empty();
        let outcome = match near.first() {
            Some(&(k, similarity))
                if similarity >= policy.promotion.merge_similarity && !superseding =>
            {
                let mut knowledge = self.get(namespace, MemoryId(k))?;
                knowledge.sources.push(id);
                knowledge.importance = knowledge.importance.max(candidate.importance);
                knowledge.utility.successes += candidate.utility.successes;
                knowledge.utility.failures += candidate.utility.failures;
                let support = knowledge.sources.len();
                writes.push(Mutation::Audit(
                    knowledge.id,
                    audit(
                        AuditAction::Promoted,
                        format!("merged {id} (similarity {similarity:.3}); support {support}"),
                    ),
                ));
                writes.push(edge_write(
                    namespace,
                    Edge {
                        from: knowledge.id,
                        to: id,
                        relation: Relation::DerivedFrom,
                    },
                ));
                let k = knowledge.id;
                writes.push(Mutation::Update {
                    record: Box::new(knowledge),
                    reindex: false,
                });
                Promotion::Merged {
                    knowledge: k,
                    support,
                }
            }
            _ => {
                let k = store.allocate_ids(1)?[0];
                let mut edges = vec![Edge {
                    from: k,
                    to: id,
                    relation: Relation::DerivedFrom,
                }];
                let replaced: Vec<MemoryId> = (against.supersedes.iter().map(|(o, _)| *o))
                    .chain(against.kept_against.iter().copied())
                    .collect();
                edges.extend(
                    near.iter()
                        .filter(|&&(o, s)| s >= SIMILAR_TO && !replaced.contains(&MemoryId(o)))
                        .map(|&(other, _)| Edge {
                            from: k,
                            to: MemoryId(other),
                            relation: Relation::SimilarTo,
                        }),
                );
                for (old, reason) in &against.supersedes {
                    edges.push(Edge {
                        from: k,
                        to: *old,
                        relation: Relation::Supersedes,
                    });
                    writes.push(Mutation::Validity(
                        *old,
                        ValidityChange::SupersededBy {
                            by: k,
                            until: candidate.event_time,
                            at: now,
                        },
                    ));
                    writes.push(Mutation::Audit(
                        *old,
                        audit(
                            AuditAction::Superseded,
                            format!("superseded by {k}, promoted from {id} ({reason})"),
                        ),
                    ));
                    writes.push(Mutation::Audit(
                        k,
                        audit(
                            AuditAction::Superseded,
                            format!("supersedes {old} ({reason})"),
                        ),
                    ));
                }
                for old in &against.kept_against {
                    // Kept by hand against the candidate: its newer value is now this
                    // knowledge record, from the same moment.
                    let was = store.validity(*old)?;
                    edges.push(Edge {
                        from: k,
                        to: *old,
                        relation: Relation::Supersedes,
                    });
                    writes.push(Mutation::Validity(*old, ValidityChange::Reinstated));
                    writes.push(Mutation::Validity(
                        *old,
                        ValidityChange::SupersededBy {
                            by: k,
                            until: was.valid_until.unwrap_or(candidate.event_time),
                            at: was.learned_at.unwrap_or(now),
                        },
                    ));
                    writes.push(Mutation::Audit(
                        *old,
                        audit(
                            AuditAction::Superseded,
                            format!("superseded by {k}, promoted from {id} (kept by hand)"),
                        ),
                    ));
                }
                let lesson = Kind::new("lesson")
                    .unwrap_or_else(|_| unreachable!("`lesson` is a valid kind"));
                let record = MemoryRecord {
                    tier: Tier::Knowledge,
                    importance: candidate.importance,
                    strength: policy.initial_strength(candidate.importance),
                    utility: candidate.utility,
                    sources: vec![id],
                    event_time: candidate.event_time,
                    metadata: serde_json::json!({
                        "knowledge": { "from_session": candidate.session_id }
                    }),
                    policy: policy.stamp(),
                    embedding: Some(embedding),
                    ..MemoryRecord::episodic(
                        k,
                        namespace,
                        KNOWLEDGE_SESSION,
                        lesson,
                        candidate.text.clone(),
                        now,
                    )
                };
                writes.push(Mutation::Audit(
                    k,
                    audit(AuditAction::Created, format!("promoted from {id}")),
                ));
                for e in &edges {
                    writes.push(edge_write(namespace, *e));
                }
                writes.push(Mutation::Insert(Box::new(record)));
                Promotion::Created {
                    knowledge: k,
                    edges,
                }
            }
        };
        Ok((outcome, writes, Vec::new()))
    }
}

/// The candidate's side of a promotion decided by [`Substrate::pool_side`] (here or at
/// the namespace's pool's home): its audit, the marker saying where it went and its
/// dequeue, or the conflicts it is held in (`conflicts`: each lesson, and why).
pub(super) fn candidate_side(
    id: MemoryId,
    outcome: &Promotion,
    conflicts: &[(MemoryId, String)],
    by: &str,
    now: Timestamp,
) -> WriteSet {
    let audit = |action, detail: String| AuditEntry {
        at: now,
        action,
        by: by.to_string(),
        detail,
    };
    let mut writes = WriteSet::new();
    match outcome {
        Promotion::Created { knowledge, .. } | Promotion::Merged { knowledge, .. } => {
            let detail = match outcome {
                Promotion::Merged { .. } => format!("merged into {knowledge}"),
                _ => format!("into {knowledge}"),
            };
            writes.push(Mutation::Audit(id, audit(AuditAction::Promoted, detail)));
            writes.push(marker(id, *knowledge));
            writes.push(Mutation::Dequeue(Queue::Promote, id));
        }
        Promotion::Held { .. } => {
            for (k, reason) in conflicts {
                writes.push(Mutation::Validity(
                    id,
                    ValidityChange::Conflict {
                        with: *k,
                        open: true,
                    },
                ));
                writes.push(Mutation::Audit(
                    id,
                    audit(
                        AuditAction::Contradicted,
                        format!("in conflict with {k}, held for review ({reason})"),
                    ),
                ));
            }
        }
        _ => {}
    }
    writes
}

impl Substrate {
    /// Reads the candidate against the knowledge near it (`near`, most similar first) by
    /// the `[updates]` rules; nothing when the section is off.
    fn against_knowledge(
        &self,
        policy: &Policy,
        candidate: &MemoryRecord,
        near: &[(u32, f32)],
        settled: bool,
    ) -> Result<Against> {
        let u = &policy.updates;
        let mut against = Against::default();
        if !u.on() || candidate.text.len() > u.max_chars as usize {
            return Ok(against);
        }
        let store = self.store();
        let claims = Claims::of(&candidate.text);
        for &(n, similarity) in near {
            if similarity < u.min_similarity {
                continue;
            }
            let k = MemoryId(n);
            let Some(knowledge) = store.get_light(k)? else {
                continue;
            };
            let validity = store.validity(k)?;
            if validity.superseded_by == Some(candidate.id) {
                against.kept_against.push(k);
                continue;
            }
            if validity.superseded() || knowledge.text.len() > u.max_chars as usize {
                continue;
            }
            let knowledge_claims = Claims::of(&knowledge.text);
            let newer = is_newer(candidate, &knowledge);
            let finding = if newer {
                compare(&claims, &knowledge_claims, similarity, &u.thresholds)
            } else {
                compare(&knowledge_claims, &claims, similarity, &u.thresholds)
            };
            let (first, second) = match newer {
                true => (candidate, &knowledge),
                false => (&knowledge, candidate),
            };
            match finding.change {
                Change::Supersedes if clear_order(first, second) => match newer {
                    true => against.supersedes.push((k, finding.reason)),
                    false => {
                        against.older_than.get_or_insert((k, finding.reason));
                    }
                },
                Change::Supersedes | Change::Contradicts if !settled => {
                    against.contradicts.push((k, finding.reason));
                }
                _ => {}
            }
        }
        Ok(against)
    }
}

/// Why a candidate is held, and how to settle it.
fn held_reason(id: MemoryId, against: &[MemoryId]) -> String {
    let list: Vec<String> = against.iter().map(ToString::to_string).collect();
    format!(
        "it contradicts {}, held for review: settle it by hand (PATCH /v1/memories/{id} with \
         \"resolve\": \"keep\" or \"dismiss\"); it is offered again with its next feedback",
        list.join(", ")
    )
}

fn edge_write(namespace: &str, e: Edge) -> Mutation {
    Mutation::PutEdge(namespace.to_string(), e)
}

fn marker(condensed: MemoryId, knowledge: MemoryId) -> Mutation {
    Mutation::MarkPromoted {
        condensed,
        knowledge,
    }
}
