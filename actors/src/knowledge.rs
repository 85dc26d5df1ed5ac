//! The KnowledgeGraph actor: owns each namespace's knowledge pool as a petgraph graph.
//!
//! It is the one writer of knowledge records and graph edges, so two promotions never race
//! to create the same knowledge twice (the second merges into the first). Feedback and the
//! condenser *tell* it about candidates; the handle *asks* it for graph queries, links and
//! explicit promotions. A namespace's graph is loaded from the store on first use and kept
//! in step with its own writes; edges written elsewhere (update detection, resolutions by
//! hand) move the store's count of that namespace's edge changes, and a graph cached at
//! another count is loaded again (other namespaces' graphs stay).
//! A restart simply loads it again.
//!
//! Candidates reach it through the store's promotion queue, written in the same commit as
//! the feedback or condensation that made them eligible: feedback and the condenser only
//! wake it ([`KnowledgeMessage::Drain`]), and so does the enricher when it stores the
//! embedding a queued candidate waited for. It drains the queue at start too, so what an
//! earlier process (or owner, in a cluster) left queued is promoted.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::enricher::wake_once;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use shadowbrain_runtime::{
    Edge, Error, Graph, MemoryId, PROMOTE_ROUND, Promotion, Relation, Result, Substrate,
};

/// Who the audit log names for promotions.
const BY: &str = "knowledge";

/// Records one graph query answers at most: the actor serves every namespace, so one
/// query over a dense graph must not hold it for long.
pub const MAX_NEIGHBOURHOOD: usize = 500;

/// The knowledge-graph actor.
pub(crate) struct KnowledgeGraph;

/// Its state.
pub(crate) struct KnowledgeState {
    substrate: Substrate,
    /// Each namespace's graph, with the store's count of that namespace's edge changes
    /// when it was loaded.
    graphs: HashMap<String, (u64, Graph)>,
    /// Set while a [`KnowledgeMessage::Drain`] waits in the mailbox, so a burst of wake-ups
    /// sends one.
    woken: Arc<AtomicBool>,
}

/// A neighbourhood: the records around one, and the edges among them.
pub(crate) type Neighbourhood = (Vec<MemoryId>, Vec<Edge>);

/// The knowledge-graph actor's protocol.
pub(crate) enum KnowledgeMessage {
    /// Promote these condensed records now (each merged or created, queued to wait for
    /// its embedding, or left out with the policy's reason); the answer says which.
    Promote {
        namespace: String,
        ids: Vec<MemoryId>,
        reply: RpcReplyPort<Result<Vec<Promotion>>>,
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
    /// Promote what waits on the store's promotion queue and is ready.
    Drain,
    /// Answers once every message sent before it is handled (`Runtime::settle`).
    Sync { reply: RpcReplyPort<()> },
    /// Fault injection for supervision tests: the handler panics.
    #[cfg(feature = "failpoints")]
    Panic,
}

impl KnowledgeState {
    fn graph(&mut self, namespace: &str) -> Result<&mut Graph> {
        // Read before loading: an edge committed during the load moves the count again,
        // so the next query loads once more rather than missing it. Only this namespace's
        // count matters: another namespace's edges never make this graph stale.
        let changes = self.substrate.store().edge_changes_in(namespace);
        if self
            .graphs
            .get(namespace)
            .is_none_or(|(at, _)| *at != changes)
        {
            let graph = self.substrate.knowledge_graph(namespace)?;
            self.graphs.insert(namespace.to_string(), (changes, graph));
        }
        Ok(self
            .graphs
            .get_mut(namespace)
            .map(|(_, graph)| graph)
            .unwrap_or_else(|| unreachable!("inserted above")))
    }

    async fn promote(&mut self, namespace: &str, ids: Vec<MemoryId>) -> Result<Vec<Promotion>> {
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            let promotion = self.substrate.promote(namespace, id, BY).await?;
            self.follow(namespace, id, &promotion)?;
            out.push(promotion);
        }
        Ok(out)
    }

    /// Promotes what the queue holds and is ready; each candidate is told apart in the log.
    async fn drain(&mut self) -> Result<()> {
        self.woken.store(false, Ordering::Release);
        // The promotions' edges move their namespace's edge count, so a cached graph is
        // loaded again on its next query: nothing to follow here.
        for (id, promotion) in self.substrate.promote_waiting(PROMOTE_ROUND, BY).await? {
            tracing::debug!(%id, ?promotion, "queued promotion");
        }
        Ok(())
    }

    /// Keeps the cached graph in step with a promotion's edges.
    fn follow(&mut self, namespace: &str, id: MemoryId, promotion: &Promotion) -> Result<()> {
        match promotion {
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
            | Promotion::NotEligible(_)
            | Promotion::Waiting(_) => {}
        }
        Ok(())
    }
}

impl Actor for KnowledgeGraph {
    type Msg = KnowledgeMessage;
    type State = KnowledgeState;
    type Arguments = Substrate;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        substrate: Substrate,
    ) -> std::result::Result<KnowledgeState, ActorProcessingErr> {
        // What an earlier process left queued is promoted now.
        let woken = Arc::new(AtomicBool::new(true));
        myself.send_message(KnowledgeMessage::Drain)?;
        let (me, flag) = (myself.clone(), woken.clone());
        substrate.on_promotion_ready(Some(Arc::new(move || {
            wake_once(&me, &flag, || KnowledgeMessage::Drain)
        })));
        Ok(KnowledgeState {
            substrate,
            graphs: HashMap::new(),
            woken,
        })
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut KnowledgeState,
    ) -> std::result::Result<(), ActorProcessingErr> {
        state.substrate.on_promotion_ready(None);
        Ok(())
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
                let _ = reply.send(state.promote(&namespace, ids).await);
            }
            KnowledgeMessage::Neighbourhood {
                namespace,
                around,
                depth,
                reply,
            } => {
                let result = state.substrate.get(&namespace, around).and_then(|_| {
                    state
                        .graph(&namespace)?
                        .neighbourhood_within(around, depth, MAX_NEIGHBOURHOOD)
                        .ok_or_else(|| {
                            Error::invalid(
                                "depth",
                                format!(
                                    "the records within {depth} edges of {around} are more \
                                         than {MAX_NEIGHBOURHOOD}; ask for a smaller depth"
                                ),
                            )
                        })
                });
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
            KnowledgeMessage::Drain => {
                if let Err(e) = state.drain().await {
                    // The candidates stay queued: the next wake-up or start tries again.
                    tracing::warn!(error = %e, "promoting queued candidates failed");
                }
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
