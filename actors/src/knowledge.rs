//! The KnowledgeGraph actor: owns each namespace's knowledge pool as a petgraph graph.
//!
//! It is the one writer of knowledge records and graph edges, so two promotions never race
//! to create the same knowledge twice (the second merges into the first). Feedback and the
//! condenser *tell* it about candidates; the handle *asks* it for graph queries, links and
//! explicit promotions. A namespace's graph is loaded from the store on first use and kept
//! in step with its own writes; edges written elsewhere (update detection, resolutions by
//! hand) move the store's edge count, and a graph cached at another count is loaded again.
//! A restart simply loads it again.

use std::collections::HashMap;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use shadowbrain_runtime::{Edge, Graph, MemoryId, Promotion, Relation, Result, Substrate};

/// Who the audit log names for promotions.
const BY: &str = "knowledge";

/// The knowledge-graph actor.
pub(crate) struct KnowledgeGraph;

/// Its state.
pub(crate) struct KnowledgeState {
    substrate: Substrate,
    graphs: HashMap<String, Graph>,
    /// The store's edge count when the cached graphs were last known to be current.
    edge_changes: u64,
}

/// A neighbourhood: the records around one, and the edges among them.
pub(crate) type Neighbourhood = (Vec<MemoryId>, Vec<Edge>);

/// The knowledge-graph actor's protocol.
pub(crate) enum KnowledgeMessage {
    /// Promote these condensed records (each merged or created, or left out with the
    /// policy's reason); the answer, when asked for, says what happened to each.
    Promote {
        namespace: String,
        ids: Vec<MemoryId>,
        reply: Option<RpcReplyPort<Result<Vec<Promotion>>>>,
    },
    /// The records within `depth` edges of `around`.
    Neighbourhood {
        namespace: String,
        around: MemoryId,
        depth: usize,
        reply: RpcReplyPort<Result<Neighbourhood>>,
    },
    /// Add an edge between two records of the namespace.
    Link {
        namespace: String,
        edge: Edge,
        reply: RpcReplyPort<Result<()>>,
    },
    /// Answers once every message sent before it is handled (`Runtime::settle`).
    Sync { reply: RpcReplyPort<()> },
    /// Fault injection for supervision tests: the handler panics.
    #[cfg(feature = "failpoints")]
    Panic,
}

impl KnowledgeState {
    fn graph(&mut self, namespace: &str) -> Result<&mut Graph> {
        // Read before loading: an edge committed during the load moves the count again,
        // so the next query loads once more rather than missing it.
        let changes = self.substrate.store().edge_changes();
        if changes != self.edge_changes {
            self.graphs.clear();
            self.edge_changes = changes;
        }
        if !self.graphs.contains_key(namespace) {
            let graph = self.substrate.knowledge_graph(namespace)?;
            self.graphs.insert(namespace.to_string(), graph);
        }
        Ok(self
            .graphs
            .get_mut(namespace)
            .unwrap_or_else(|| unreachable!("inserted above")))
    }

    async fn promote(&mut self, namespace: &str, ids: Vec<MemoryId>) -> Result<Vec<Promotion>> {
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            let promotion = self.substrate.promote(namespace, id, BY).await?;
            match &promotion {
                Promotion::Created { edges, .. } => {
                    let graph = self.graph(namespace)?;
                    for e in edges {
                        graph.add(*e);
                    }
                }
                Promotion::Merged { knowledge, .. } => self.graph(namespace)?.add(Edge {
                    from: *knowledge,
                    to: id,
                    relation: Relation::DerivedFrom,
                }),
                Promotion::Held { .. }
                | Promotion::AlreadyPromoted { .. }
                | Promotion::NotEligible(_) => {}
            }
            out.push(promotion);
        }
        Ok(out)
    }
}

impl Actor for KnowledgeGraph {
    type Msg = KnowledgeMessage;
    type State = KnowledgeState;
    type Arguments = Substrate;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        substrate: Substrate,
    ) -> std::result::Result<KnowledgeState, ActorProcessingErr> {
        Ok(KnowledgeState {
            edge_changes: substrate.store().edge_changes(),
            substrate,
            graphs: HashMap::new(),
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        message: KnowledgeMessage,
        state: &mut KnowledgeState,
    ) -> std::result::Result<(), ActorProcessingErr> {
        match message {
            KnowledgeMessage::Promote {
                namespace,
                ids,
                reply,
            } => {
                let result = state.promote(&namespace, ids).await;
                match reply {
                    Some(reply) => {
                        let _ = reply.send(result);
                    }
                    None => match result {
                        Ok(done) => tracing::debug!(namespace, ?done, "promotion"),
                        Err(e) => tracing::warn!(namespace, error = %e, "promotion failed"),
                    },
                }
            }
            KnowledgeMessage::Neighbourhood {
                namespace,
                around,
                depth,
                reply,
            } => {
                let result = state
                    .substrate
                    .get(&namespace, around)
                    .and_then(|_| Ok(state.graph(&namespace)?.neighbourhood(around, depth)));
                let _ = reply.send(result);
            }
            KnowledgeMessage::Link {
                namespace,
                edge,
                reply,
            } => {
                let result = state.substrate.link(&namespace, edge, BY).and_then(|()| {
                    state.graph(&namespace)?.add(edge);
                    Ok(())
                });
                let _ = reply.send(result);
            }
            KnowledgeMessage::Sync { reply } => {
                let _ = reply.send(());
            }
            #[cfg(feature = "failpoints")]
            KnowledgeMessage::Panic => panic!("fault injected into the knowledge graph"),
        }
        Ok(())
    }
}
