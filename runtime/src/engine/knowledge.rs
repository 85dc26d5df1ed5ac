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
//! Knowledge records live in the namespace's [`KNOWLEDGE_SESSION`], so they are recalled
//! by any session of the namespace that asks for `include_knowledge`, and by no other
//! namespace.

use std::collections::{HashSet, VecDeque};

use petgraph::Direction;
use petgraph::graphmap::DiGraphMap;

use super::Substrate;
use crate::error::Result;
use crate::model::{AuditAction, AuditEntry, Edge, Kind, MemoryId, MemoryRecord, Relation, Tier};
use crate::store::{Filter, Mutation, WriteSet};

/// The session that holds a namespace's knowledge records.
pub const KNOWLEDGE_SESSION: &str = "_knowledge";

/// Knowledge at least this similar to a new node (but under `merge_similarity`) is linked
/// `similar_to` it.
const SIMILAR_TO: f32 = 0.75;

/// Knowledge records compared with each promotion candidate.
const MERGE_CANDIDATES: usize = 5;

/// What a promotion did.
#[derive(Debug, Clone, PartialEq)]
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
    /// The policy does not admit it (every reason, joined with `; `).
    NotEligible(String),
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
                    order.push(MemoryId(n));
                    queue.push_back((n, d + 1));
                }
            }
        }
        let edges = self
            .edges()
            .into_iter()
            .filter(|e| seen.contains(&e.from.0) && seen.contains(&e.to.0))
            .collect();
        (order, edges)
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
    pub async fn promote(&self, namespace: &str, id: MemoryId, by: &str) -> Result<Promotion> {
        let promotion = self.promote_once(namespace, id, by).await?;
        if matches!(
            promotion,
            Promotion::Created { .. } | Promotion::Merged { .. }
        ) {
            self.count_promotion();
        }
        Ok(promotion)
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
        let Some(embedding) = store.embedding(id)? else {
            return Ok(Promotion::NotEligible(
                "its embedding is not ready yet (the enricher is behind); try again shortly".into(),
            ));
        };
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
        let outcome =
            match near.first() {
                Some(&(k, similarity)) if similarity >= policy.promotion.merge_similarity => {
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
                    writes.push(Mutation::Audit(
                        id,
                        audit(
                            AuditAction::Promoted,
                            format!("merged into {}", knowledge.id),
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
                    writes.push(marker(id, knowledge.id));
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
                    edges.extend(near.iter().filter(|(_, s)| *s >= SIMILAR_TO).map(
                        |&(other, _)| Edge {
                            from: k,
                            to: MemoryId(other),
                            relation: Relation::SimilarTo,
                        },
                    ));
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
                    writes.push(Mutation::Audit(
                        id,
                        audit(AuditAction::Promoted, format!("into {k}")),
                    ));
                    for e in &edges {
                        writes.push(edge_write(namespace, *e));
                    }
                    writes.push(marker(id, k));
                    writes.push(Mutation::Insert(Box::new(record)));
                    Promotion::Created {
                        knowledge: k,
                        edges,
                    }
                }
            };
        store.write_async(writes).await?;
        self.after_write(false);
        Ok(outcome)
    }
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
