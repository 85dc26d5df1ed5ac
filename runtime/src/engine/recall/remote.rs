//! Parts of a scattered recall held elsewhere — in a cluster placed by session, the other
//! partitions' stores, at the nodes that own them (docs/cluster-placement.md). A round
//! crosses as bytes ([`PartAsk`] in, an answer out) over a [`PartLink`] the host provides
//! (the cluster's sealed requests); the store that holds the part answers it with
//! [`Substrate::answer_part`]. A substrate given a [`Spread`] recalls over its own store
//! and every part the spread names, through [`recall_across`], so the ranking is the one
//! one store holding every record gives.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;

use serde::{Deserialize, Serialize};

use super::*;
use crate::engine::insights::InsightsShare;
use crate::engine::knowledge::Conflicts;
use crate::engine::updates::{OlderThere, UpdateMark, UpdateProbe};
use crate::engine::{FeedbackReport, Outcome, Promotion};
use crate::store::codec::{decode_record, encode_record};
use crate::store::{Census, IdBlock, SessionStats};

/// Another part, and the memories of a request it holds.
pub(in crate::engine) type Share = (Arc<dyn PartLink>, Vec<MemoryId>);

/// A future a [`PartLink`] answers.
pub type PartFuture<'a> = Pin<Box<dyn Future<Output = Result<Vec<u8>>> + Send + 'a>>;

/// The way to a part held elsewhere: its id block, and a round sent as bytes and answered
/// as bytes (what [`Substrate::answer_part`] answers, there).
pub trait PartLink: Send + Sync + fmt::Debug {
    /// The ids the part's store hands out.
    fn ids(&self) -> IdBlock;
    /// Sends one ask and waits for its answer. `repeatable`: sending it again when an
    /// attempt goes unanswered stores nothing twice (every recall round, a promotion,
    /// which the home remembers, a settlement); feedback is not, and gets one attempt.
    fn ask(&self, ask: Vec<u8>, repeatable: bool) -> PartFuture<'_>;
}

/// What a substrate whose namespaces are spread over several stores recalls across: the
/// other parts (this store is always one), and where each namespace's knowledge pool is.
pub trait Spread: Send + Sync + fmt::Debug {
    /// Every other part that may hold records of `namespace`.
    fn others(&self, namespace: &str) -> Vec<Arc<dyn PartLink>>;
    /// The part holding `namespace`'s knowledge pool, when it is not this store: promotion
    /// happens there, and a session's recall asks it for knowledge. `None`: this store.
    fn home(&self, namespace: &str) -> Option<Arc<dyn PartLink>>;
}

/// A round as it is sent to a part.
#[derive(Debug, Serialize, Deserialize)]
pub enum PartAsk {
    /// Round one.
    Scope(RecallRequest),
    /// Round two.
    Hits(RecallRequest, Option<Vec<f32>>, Plan),
    /// Round three.
    Context(RecallRequest, Plan, Vec<MemoryId>),
    /// Round four (`bool`: with embeddings).
    Load(RecallRequest, Option<Vec<f32>>, Plan, Vec<MemoryId>, bool),
    /// After the ranking: reinforce these records of `namespace` by `amount` at `at`, under
    /// the part's own policy for the namespace (every node runs the same policies).
    Reinforce {
        /// The records' namespace.
        namespace: String,
        /// The recall's instant.
        at: Timestamp,
        /// The policy's `reinforce_on_recall`.
        amount: f32,
        /// The part's returned records.
        ids: Vec<MemoryId>,
    },
    /// The sessions of a namespace the part holds records of.
    Sessions(String),
    /// Feedback on memories of `namespace` the part holds ([`Substrate::feedback`]).
    Feedback {
        /// Their namespace.
        namespace: String,
        /// The memories.
        ids: Vec<MemoryId>,
        /// How it went.
        outcome: Outcome,
        /// Who, for the audit log.
        by: String,
        /// Where the feedback came from (a recall id, or memory ids), for the audit log.
        source: String,
    },
    /// Settle, on this part's side, a conflict between its record `id` and another part's
    /// record `with` (made at `with_time`) that a person resolved there: `keep` (the other
    /// is kept, so this one is superseded by it) or dismiss.
    Settle {
        /// Their namespace.
        namespace: String,
        /// This part's record.
        id: MemoryId,
        /// The other part's record, settled by hand.
        with: MemoryId,
        /// Its event time.
        with_time: Timestamp,
        /// Kept against this part's record (else the conflict is dismissed).
        keep: bool,
        /// Who, for the audit log.
        by: String,
        /// The reason given, as the audit shows it (`: …`, or empty).
        because: String,
        /// When it was settled.
        at: Timestamp,
    },
    /// Promote a candidate of another part into this part's knowledge pool (the
    /// namespace's home), deciding and writing the pool's side only.
    Promote {
        /// Its namespace.
        namespace: String,
        /// The candidate, in the store's encoding.
        candidate: Vec<u8>,
        /// Its id.
        id: MemoryId,
        /// Its embedding.
        embedding: Vec<f32>,
        /// A person settled a conflict of it by hand (its history says so).
        settled: bool,
        /// Who, for the audit log.
        by: String,
    },
    /// The part's share of a namespace's insights ([`Substrate::insights`]).
    Insights {
        /// The namespace.
        namespace: String,
        /// As of when (the asker's clock).
        now: Timestamp,
        /// Entries per list.
        limit: usize,
    },
    /// The part's census of a namespace, with its sessions that have records.
    Census(String),
    /// The records of `namespace` (without embeddings) among `ids` the part holds.
    Records {
        /// Their namespace.
        namespace: String,
        /// The memories.
        ids: Vec<MemoryId>,
    },
    /// Update detection: each probe's nearest older records in its scope the part holds,
    /// and whether one of them still waits for its embedding.
    Neighbours {
        /// The probes' namespace.
        namespace: String,
        /// Records of another part about to be compared.
        probes: Vec<UpdateProbe>,
    },
    /// What is known against the part's record `id` of `namespace` (a chain of newer values
    /// followed across parts).
    Validity {
        /// Its namespace.
        namespace: String,
        /// The record.
        id: MemoryId,
    },
    /// A person reinstated another part's record `older`, which this part's `newer` had
    /// superseded: `newer` no longer supersedes it (its edge removed, audited).
    Reinstated {
        /// Their namespace.
        namespace: String,
        /// This part's record.
        newer: MemoryId,
        /// The other part's record, current again.
        older: MemoryId,
        /// Who, for the audit log.
        by: String,
        /// The reason given, as the audit shows it (`: …`, or empty).
        because: String,
        /// When.
        at: Timestamp,
    },
    /// Update detection: write the sides of pairs found elsewhere that fall on the part's
    /// records (each once, however often asked).
    Marks {
        /// Their namespace.
        namespace: String,
        /// The sides.
        marks: Vec<UpdateMark>,
    },
}

/// A record (without its embedding) as it crosses between parts: in the store's own
/// encoding, which carries the JSON fields as text, so the wire's format needs nothing
/// self-describing.
#[derive(Debug, Clone)]
pub(in crate::engine) struct Carried(pub MemoryRecord);

impl Serialize for Carried {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        (self.0.id, encode_record(&self.0)).serialize(s)
    }
}

impl<'de> Deserialize<'de> for Carried {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let (id, bytes) = <(MemoryId, Vec<u8>)>::deserialize(d)?;
        let key = crate::store::keys::record(id);
        decode_record(id, &key, &bytes, None)
            .map(Carried)
            .map_err(serde::de::Error::custom)
    }
}

/// A record as round four sends it: the store's own encoding (which carries the JSON
/// fields as text, so the wire's format needs nothing self-describing).
#[derive(Debug, Serialize, Deserialize)]
struct WireRecord {
    id: MemoryId,
    record: Vec<u8>,
    embedding: Option<Vec<f32>>,
    similarity: Option<f32>,
    validity: Option<Validity>,
    passage: Option<PassageHit>,
}

/// A part's answer to one round.
#[derive(Debug, Serialize, Deserialize)]
enum PartReply {
    Scope(PartScope),
    Hits(PartHits),
    Context(Vec<PathHit>),
    Load(Vec<WireRecord>),
    Sessions(Vec<SessionStats>),
    /// What feedback changed: memories updated, and those now promotable.
    Feedback(usize, Vec<MemoryId>),
    /// What became of a promotion, and the lessons the candidate is held against (why).
    Promoted(Promotion, Conflicts),
    Insights(InsightsShare),
    /// The census, and the sessions with records.
    Census(Census, Vec<String>),
    Records(Vec<Carried>),
    Done,
    /// It failed there.
    Failed(WireError),
    // Later answers go last: the wire names a variant by its place.
    Validity(Validity),
    /// Per probe: whether it waits, and its older neighbours with their similarity.
    Neighbours(Vec<(bool, Vec<(Carried, f32)>)>),
}

/// A part's error as it crosses: what the asker's client must be told alike (an unknown
/// memory, a bad input) keeps its kind; anything else is the part being unavailable.
#[derive(Debug, Serialize, Deserialize)]
enum WireError {
    NotFound { what: String, id: String },
    Invalid { field: String, reason: String },
    Other(String),
}

impl From<Error> for WireError {
    fn from(e: Error) -> Self {
        match e {
            Error::NotFound { what, id } => WireError::NotFound {
                what: what.into(),
                id,
            },
            Error::Invalid { field, reason } => WireError::Invalid { field, reason },
            e => WireError::Other(e.to_string()),
        }
    }
}

impl WireError {
    fn into_error(self, part: IdBlock) -> Error {
        match self {
            WireError::NotFound { what, id } => Error::NotFound {
                // The kinds a part reports (the error's field is a static name).
                what: match what.as_str() {
                    "memory" => "memory",
                    "recall" => "recall",
                    "session" => "session",
                    _ => "record",
                },
                id,
            },
            WireError::Invalid { field, reason } => Error::Invalid { field, reason },
            WireError::Other(message) => Error::Unavailable {
                what: format!("the part holding ids {part}"),
                message,
            },
        }
    }
}

fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    postcard::to_stdvec(v).expect("a round serialises")
}

fn unreadable(what: &str, e: impl fmt::Display) -> Error {
    Error::Unavailable {
        what: "a part of a scattered recall".into(),
        message: format!(
            "{what} was unreadable ({e}); is every node on the same shadowbrain version?"
        ),
    }
}

impl Substrate {
    /// Answers what another part asked of this store's records (the bytes a [`PartLink`]
    /// carried): a round of a scattered recall, a session list, a share of the insights,
    /// a census, records by id or a settlement (on a blocking thread), feedback, or a
    /// promotion into this store's pool. A failure is
    /// answered as such, for the asker to report.
    pub async fn answer_part(&self, ask: Vec<u8>) -> Vec<u8> {
        let reply = match postcard::from_bytes::<PartAsk>(&ask) {
            Ok(PartAsk::Feedback {
                namespace,
                ids,
                outcome,
                by,
                source,
            }) => match self
                .feedback_on(&namespace, ids, None, outcome, &by, &source)
                .await
            {
                Ok(report) => {
                    if !report.promotable.is_empty() {
                        // They are queued (the feedback's commit put them there); the
                        // owner's knowledge actor drains the queue when woken, or at its
                        // next start.
                        self.inner.promotion_wake.fire();
                    }
                    PartReply::Feedback(report.updated, report.promotable)
                }
                Err(e) => PartReply::Failed(e.into()),
            },
            Ok(PartAsk::Promote {
                namespace,
                candidate,
                id,
                embedding,
                settled,
                by,
            }) => match self
                .promote_here(&namespace, &candidate, id, embedding, settled, &by)
                .await
            {
                Ok((promotion, conflicts)) => PartReply::Promoted(promotion, conflicts),
                Err(e) => PartReply::Failed(e.into()),
            },
            Ok(ask) => {
                let sub = self.clone();
                match tokio::task::spawn_blocking(move || sub.answer(ask)).await {
                    Ok(Ok(reply)) => reply,
                    Ok(Err(e)) => PartReply::Failed(e.into()),
                    Err(e) => PartReply::Failed(Error::internal("a part's round", e).into()),
                }
            }
            Err(e) => PartReply::Failed(unreadable("the round", e).into()),
        };
        encode(&reply)
    }

    /// `ids` split into those this store holds (or that no part does: reading them says
    /// they are unknown) and, per other part of the spread, those it holds.
    pub(in crate::engine) fn held_here(
        &self,
        namespace: &str,
        ids: Vec<MemoryId>,
    ) -> (Vec<MemoryId>, Vec<Share>) {
        let mut here = Vec::new();
        let mut there: Vec<Share> = Vec::new();
        for id in ids {
            let Some(part) = self.holder_of(namespace, id) else {
                here.push(id);
                continue;
            };
            match there.iter_mut().find(|(p, _)| p.ids() == part.ids()) {
                Some((_, theirs)) => theirs.push(id),
                None => there.push((part, vec![id])),
            }
        }
        (here, there)
    }

    /// The other part holding `id`, when a spread names one (`None`: this store, or no
    /// part holds it).
    pub(in crate::engine) fn holder_of(
        &self,
        namespace: &str,
        id: MemoryId,
    ) -> Option<Arc<dyn PartLink>> {
        let spread = self.inner.spread.as_ref()?;
        if self.inner.store.id_block().contains(id.0) {
            return None;
        }
        spread
            .others(namespace)
            .into_iter()
            .find(|p| p.ids().contains(id.0))
    }

    /// Asks `part` to settle its record `theirs`'s side of a conflict with this store's
    /// `ours` (see [`PartAsk::Settle`]), waiting for it: from a blocking thread.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::engine) fn settle_at(
        &self,
        part: Arc<dyn PartLink>,
        namespace: &str,
        theirs: MemoryId,
        ours: &MemoryRecord,
        keep: bool,
        by: &str,
        because: &str,
        at: Timestamp,
    ) -> Result<()> {
        let ask = PartAsk::Settle {
            namespace: namespace.to_string(),
            id: theirs,
            with: ours.id,
            with_time: ours.event_time,
            keep,
            by: by.to_string(),
            because: because.to_string(),
            at,
        };
        self.done_at(part, ask, "a settlement")
    }

    /// Sends `ask` to `part` from synchronous code, which answers that it is done (`what`:
    /// the ask, for the error of any other answer).
    fn done_at(&self, part: Arc<dyn PartLink>, ask: PartAsk, what: &str) -> Result<()> {
        match self.wait_for_parts("resolve", AnyPart::There(part).ask(ask))? {
            PartReply::Done => Ok(()),
            _ => Err(unexpected(what)),
        }
    }

    /// Waits for `answer` (asks to other parts) from synchronous code: a worker of a
    /// multi-thread runtime hands its other tasks on meanwhile; any other thread (an
    /// indexer's, a blocking pool's) drives it on the runtime the store was opened in,
    /// whose timers and connections the parts' links use. `what` names the caller for the
    /// error a current-thread runtime gets, which cannot wait there.
    fn wait_for_parts<T>(&self, what: &str, answer: impl Future<Output = Result<T>>) -> Result<T> {
        let current = tokio::runtime::Handle::try_current().ok();
        if current
            .as_ref()
            .is_some_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread)
        {
            return Err(Error::invalid(
                what,
                "asking another store waits for it: call it inside a multi-thread tokio \
                 runtime, or outside any",
            ));
        }
        let Some(handle) = self.inner.runtime.clone().or(current) else {
            return Err(Error::invalid(
                what,
                "asking another store needs a tokio runtime: open the store inside one",
            ));
        };
        tokio::task::block_in_place(|| handle.block_on(answer))
    }

    /// [`PartAsk::Neighbours`] to each part, all at once, from synchronous code: their
    /// answers in order (per probe: whether it waits, and its neighbours there).
    pub(in crate::engine) fn neighbours_elsewhere(
        &self,
        asks: Vec<(Arc<dyn PartLink>, String, Vec<UpdateProbe>)>,
    ) -> Result<Vec<Vec<OlderThere>>> {
        let asks = asks
            .into_iter()
            .map(|(part, namespace, probes)| async move {
                let n = probes.len();
                match AnyPart::There(part)
                    .ask(PartAsk::Neighbours { namespace, probes })
                    .await?
                {
                    PartReply::Neighbours(answers) if answers.len() == n => Ok(answers
                        .into_iter()
                        .map(|(pending, near)| {
                            let near = near.into_iter().map(|(r, s)| (r.0, s)).collect();
                            (pending, near)
                        })
                        .collect()),
                    _ => Err(unexpected("update detection's neighbours")),
                }
            });
        self.wait_for_parts("updates", futures::future::try_join_all(asks))
    }

    /// What `part` knows against its record `id` ([`PartAsk::Validity`]), from synchronous
    /// code.
    pub(in crate::engine) fn validity_at(
        &self,
        part: Arc<dyn PartLink>,
        namespace: &str,
        id: MemoryId,
    ) -> Result<Validity> {
        let ask = PartAsk::Validity {
            namespace: namespace.to_string(),
            id,
        };
        match self.wait_for_parts("chain", AnyPart::There(part).ask(ask))? {
            PartReply::Validity(v) => Ok(v),
            _ => Err(unexpected("a record's validity")),
        }
    }

    /// Tells `part` that its record `newer` no longer supersedes this store's `older`
    /// ([`PartAsk::Reinstated`]), from synchronous code.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::engine) fn reinstated_at(
        &self,
        part: Arc<dyn PartLink>,
        namespace: &str,
        newer: MemoryId,
        older: MemoryId,
        by: &str,
        because: &str,
        at: Timestamp,
    ) -> Result<()> {
        let ask = PartAsk::Reinstated {
            namespace: namespace.to_string(),
            newer,
            older,
            by: by.to_string(),
            because: because.to_string(),
            at,
        };
        self.done_at(part, ask, "a reinstatement")
    }

    /// [`PartAsk::Marks`] to each part, all at once, from synchronous code.
    pub(in crate::engine) fn marks_elsewhere(
        &self,
        asks: Vec<(Arc<dyn PartLink>, String, Vec<UpdateMark>)>,
    ) -> Result<()> {
        let asks = asks.into_iter().map(|(part, namespace, marks)| async move {
            match AnyPart::There(part)
                .ask(PartAsk::Marks { namespace, marks })
                .await?
            {
                PartReply::Done => Ok(()),
                _ => Err(unexpected("update detection's marks")),
            }
        });
        self.wait_for_parts("updates", futures::future::try_join_all(asks))
            .map(drop)
    }

    /// The part holding `namespace`'s knowledge pool, when it is not this store.
    pub(in crate::engine) fn knowledge_home(&self, namespace: &str) -> Option<Arc<dyn PartLink>> {
        self.inner.spread.as_ref()?.home(namespace)
    }

    /// Promotes `candidate` (of this store) at `home`, the namespace's pool: what became
    /// of it and the lessons it is held against. The home decides and writes the pool's
    /// side, and remembers the candidate it promoted, so asking again (after a crash
    /// before this store wrote the candidate's side) answers where it went.
    pub(in crate::engine) async fn promote_at(
        &self,
        home: Arc<dyn PartLink>,
        namespace: &str,
        candidate: &MemoryRecord,
        embedding: Vec<f32>,
        settled: bool,
        by: &str,
    ) -> Result<(Promotion, Conflicts)> {
        let ask = PartAsk::Promote {
            namespace: namespace.to_string(),
            candidate: encode_record(candidate),
            id: candidate.id,
            embedding,
            settled,
            by: by.to_string(),
        };
        match AnyPart::There(home).ask(ask).await? {
            PartReply::Promoted(promotion, conflicts) => Ok((promotion, conflicts)),
            _ => Err(unexpected("a promotion")),
        }
    }

    /// The home's side of [`Substrate::promote_at`]: one promotion at a time, as here.
    async fn promote_here(
        &self,
        namespace: &str,
        candidate: &[u8],
        id: MemoryId,
        embedding: Vec<f32>,
        settled: bool,
        by: &str,
    ) -> Result<(Promotion, Conflicts)> {
        let key = crate::store::keys::record(id);
        let candidate = decode_record(id, &key, candidate, None)?;
        if candidate.namespace != namespace {
            return Err(Error::invalid(
                "candidate",
                "is of another namespace than the promotion names",
            ));
        }
        let _one = self.inner.promoting.lock().await;
        let store = self.store();
        if let Some(knowledge) = store.promoted_into(id)? {
            return Ok((Promotion::AlreadyPromoted { knowledge }, Vec::new()));
        }
        let (outcome, mut writes, conflicts) =
            self.pool_side(namespace, &candidate, embedding, settled, by)?;
        if let Promotion::Created { knowledge, .. } | Promotion::Merged { knowledge, .. } = &outcome
        {
            // The home remembers it too: a repeated ask answers where it went.
            writes.push(Mutation::MarkPromoted {
                condensed: id,
                knowledge: *knowledge,
            });
        }
        if !writes.0.is_empty() {
            store.write_async(writes).await?;
            self.after_write(false);
        }
        Ok((outcome, conflicts))
    }

    /// Sends each part its share of a feedback, all at once: the parts' reports summed.
    pub(in crate::engine) async fn feedback_elsewhere(
        &self,
        namespace: &str,
        shares: Vec<Share>,
        outcome: Outcome,
        by: &str,
        source: &str,
    ) -> Result<FeedbackReport> {
        let asks = shares.into_iter().map(|(part, ids)| async move {
            let part = AnyPart::There(part);
            let ask = PartAsk::Feedback {
                namespace: namespace.to_string(),
                ids,
                outcome,
                by: by.to_string(),
                source: source.to_string(),
            };
            match part.ask(ask).await? {
                PartReply::Feedback(updated, promotable) => Ok(FeedbackReport {
                    updated,
                    promotable,
                }),
                _ => Err(unexpected("feedback")),
            }
        });
        let mut report = FeedbackReport::default();
        for r in futures::future::try_join_all(asks).await? {
            report.updated += r.updated;
            report.promotable.extend(r.promotable);
        }
        Ok(report)
    }

    fn answer(&self, ask: PartAsk) -> Result<PartReply> {
        Ok(match ask {
            PartAsk::Scope(req) => PartReply::Scope(self.part_scope(&req)?),
            PartAsk::Hits(req, q, plan) => {
                PartReply::Hits(self.part_hits(&req, q.as_deref(), &plan)?)
            }
            PartAsk::Context(req, plan, hits) => {
                PartReply::Context(self.part_context(&req, &plan, &hits)?)
            }
            PartAsk::Load(req, q, plan, ids, embeddings) => PartReply::Load(
                self.part_load(&req, q.as_deref(), &plan, &ids, embeddings)?
                    .into_iter()
                    .map(|r| WireRecord {
                        id: r.record.id,
                        record: encode_record(&r.record),
                        embedding: r.embedding,
                        similarity: r.similarity,
                        validity: r.validity,
                        passage: r.passage,
                    })
                    .collect(),
            ),
            PartAsk::Reinforce {
                namespace,
                at,
                amount,
                ids,
            } => {
                let policy = self.policy_for(&namespace);
                let block = self.inner.store.id_block();
                let writes = ids
                    .into_iter()
                    .filter(|id| block.contains(id.0))
                    .map(|id| Mutation::Reinforce {
                        id,
                        reinforcement: Reinforcement {
                            curve: Arc::clone(&policy) as Arc<dyn Reinforce>,
                            at,
                            amount,
                        },
                        by: "recall".into(),
                    })
                    .collect();
                self.inner.store.write_detached(WriteSet(writes))?;
                PartReply::Done
            }
            PartAsk::Sessions(namespace) => {
                PartReply::Sessions(self.inner.store.sessions(&namespace)?)
            }
            PartAsk::Insights {
                namespace,
                now,
                limit,
            } => PartReply::Insights(self.insights_share(&namespace, now, limit)?),
            PartAsk::Census(namespace) => {
                let store = &self.inner.store;
                PartReply::Census(
                    store.census(&namespace),
                    store.sessions_with_records(&namespace),
                )
            }
            PartAsk::Records { namespace, ids } => {
                let mut records = Vec::with_capacity(ids.len());
                for id in ids {
                    match self.inner.store.get_light(id)? {
                        Some(r) if r.namespace == namespace => records.push(Carried(r)),
                        _ => {}
                    }
                }
                PartReply::Records(records)
            }
            PartAsk::Settle {
                namespace,
                id,
                with,
                with_time,
                keep,
                by,
                because,
                at,
            } => {
                self.settle_here(&namespace, id, with, with_time, keep, &by, &because, at)?;
                PartReply::Done
            }
            PartAsk::Neighbours { namespace, probes } => PartReply::Neighbours(
                self.older_here(&namespace, &probes)?
                    .into_iter()
                    .map(|(pending, near)| {
                        let near = near.into_iter().map(|(r, s)| (Carried(r), s)).collect();
                        (pending, near)
                    })
                    .collect(),
            ),
            PartAsk::Marks { namespace, marks } => {
                self.mark_here(&namespace, &marks)?;
                PartReply::Done
            }
            PartAsk::Validity { namespace, id } => {
                self.inner.store.get_in(&namespace, id)?;
                PartReply::Validity(self.inner.store.validity(id)?)
            }
            PartAsk::Reinstated {
                namespace,
                newer,
                older,
                by,
                because,
                at,
            } => {
                self.reinstated_here(&namespace, newer, older, &by, &because, at)?;
                PartReply::Done
            }
            PartAsk::Feedback { .. } | PartAsk::Promote { .. } => {
                return Err(Error::internal(
                    "a part",
                    "feedback and promotion are answered by answer_part, not on a blocking \
                     thread",
                ));
            }
        })
    }
}

/// A part of a scattered recall: this store (its rounds on a blocking thread) or one
/// reached through a [`PartLink`].
#[derive(Debug, Clone)]
pub(super) enum AnyPart {
    Here(Substrate),
    There(Arc<dyn PartLink>),
}

impl AnyPart {
    async fn ask(&self, ask: PartAsk) -> Result<PartReply> {
        let reply = match self {
            AnyPart::Here(sub) => {
                let sub = sub.clone();
                tokio::task::spawn_blocking(move || sub.answer(ask))
                    .await
                    .map_err(|e| Error::internal("a recall's part", e))??
            }
            AnyPart::There(link) => {
                let repeatable = !matches!(ask, PartAsk::Feedback { .. });
                let bytes = link.ask(encode(&ask), repeatable).await?;
                postcard::from_bytes::<PartReply>(&bytes)
                    .map_err(|e| unreadable("a part's answer", e))?
            }
        };
        match reply {
            PartReply::Failed(e) => Err(e.into_error(self.ids())),
            reply => Ok(reply),
        }
    }
}

fn unexpected(round: &str) -> Error {
    Error::internal(
        "a scattered recall",
        format!("a part answered {round} with another round's answer"),
    )
}

impl RecallPart for AnyPart {
    fn ids(&self) -> IdBlock {
        match self {
            AnyPart::Here(sub) => sub.inner.store.id_block(),
            AnyPart::There(link) => link.ids(),
        }
    }

    async fn scope(&self, req: &RecallRequest) -> Result<PartScope> {
        match self.ask(PartAsk::Scope(req.clone())).await? {
            PartReply::Scope(s) => Ok(s),
            _ => Err(unexpected("round one")),
        }
    }

    async fn hits(
        &self,
        req: &RecallRequest,
        query_vec: Option<&[f32]>,
        plan: &Plan,
    ) -> Result<PartHits> {
        let ask = PartAsk::Hits(req.clone(), query_vec.map(<[f32]>::to_vec), plan.clone());
        match self.ask(ask).await? {
            PartReply::Hits(h) => Ok(h),
            _ => Err(unexpected("round two")),
        }
    }

    async fn context(
        &self,
        req: &RecallRequest,
        plan: &Plan,
        hits: &[MemoryId],
    ) -> Result<Vec<PathHit>> {
        match self
            .ask(PartAsk::Context(req.clone(), plan.clone(), hits.to_vec()))
            .await?
        {
            PartReply::Context(c) => Ok(c),
            _ => Err(unexpected("round three")),
        }
    }

    async fn load(
        &self,
        req: &RecallRequest,
        query_vec: Option<&[f32]>,
        plan: &Plan,
        ids: &[MemoryId],
        embeddings: bool,
    ) -> Result<Vec<PartRecord>> {
        let ask = PartAsk::Load(
            req.clone(),
            query_vec.map(<[f32]>::to_vec),
            plan.clone(),
            ids.to_vec(),
            embeddings,
        );
        let PartReply::Load(records) = self.ask(ask).await? else {
            return Err(unexpected("round four"));
        };
        records
            .into_iter()
            .map(|w| {
                let key = crate::store::keys::record(w.id);
                Ok(PartRecord {
                    record: decode_record(w.id, &key, &w.record, None)?,
                    embedding: w.embedding,
                    similarity: w.similarity,
                    validity: w.validity,
                    passage: w.passage,
                })
            })
            .collect()
    }
}

impl Substrate {
    /// This store and, with a [`Spread`], every other part that may hold `namespace`.
    fn every_part(&self, namespace: &str) -> Vec<AnyPart> {
        let mut parts = vec![AnyPart::Here(self.clone())];
        if let Some(spread) = &self.inner.spread {
            parts.extend(spread.others(namespace).into_iter().map(AnyPart::There));
        }
        parts
    }

    /// `ask` put to every part of `namespace` at once: their answers, this store's first.
    async fn ask_every(
        &self,
        namespace: &str,
        ask: impl Fn() -> PartAsk,
    ) -> Result<Vec<PartReply>> {
        let parts = self.every_part(namespace);
        futures::future::try_join_all(parts.iter().map(|p| p.ask(ask()))).await
    }

    /// Every session of `namespace` that has records, by session id: this store's and,
    /// with a [`Spread`], every other part's (a session whose records are in several parts
    /// — the knowledge pool's — counted once, over all of them).
    pub async fn sessions(&self, namespace: &str) -> Result<Vec<SessionStats>> {
        let answers = self
            .ask_every(namespace, || PartAsk::Sessions(namespace.to_string()))
            .await?;
        let mut merged: BTreeMap<String, SessionStats> = BTreeMap::new();
        for answer in answers {
            let PartReply::Sessions(sessions) = answer else {
                return Err(unexpected("a session list"));
            };
            for s in sessions {
                match merged.entry(s.session_id.clone()) {
                    std::collections::btree_map::Entry::Vacant(v) => {
                        v.insert(s);
                    }
                    std::collections::btree_map::Entry::Occupied(mut o) => {
                        let m = o.get_mut();
                        m.events += s.events;
                        m.memories += s.memories;
                        m.first_active = m.first_active.min(s.first_active);
                        m.last_active = m.last_active.max(s.last_active);
                    }
                }
            }
        }
        Ok(merged.into_values().collect())
    }

    /// `namespace`'s records by tier and status and its sessions with records: this
    /// store's and, with a [`Spread`], every other part's (a session with records in
    /// several parts counted once).
    pub async fn census(&self, namespace: &str) -> Result<Census> {
        if self.inner.spread.is_none() {
            return Ok(self.inner.store.census(namespace));
        }
        let answers = self
            .ask_every(namespace, || PartAsk::Census(namespace.to_string()))
            .await?;
        let mut census = Census::default();
        let mut sessions = std::collections::HashSet::new();
        for answer in answers {
            let PartReply::Census(part, theirs) = answer else {
                return Err(unexpected("a census"));
            };
            for (sum, add) in census
                .by_tier_status
                .iter_mut()
                .flatten()
                .zip(part.by_tier_status.iter().flatten())
            {
                *sum += add;
            }
            sessions.extend(theirs);
        }
        census.sessions = sessions.len();
        Ok(census)
    }

    /// Every part's share of `namespace`'s insights, this store's first.
    pub(in crate::engine) async fn insight_shares(
        &self,
        namespace: &str,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<InsightsShare>> {
        let ask = || PartAsk::Insights {
            namespace: namespace.to_string(),
            now,
            limit,
        };
        let answers = self.ask_every(namespace, ask).await?;
        answers
            .into_iter()
            .map(|a| match a {
                PartReply::Insights(share) => Ok(share),
                _ => Err(unexpected("insights")),
            })
            .collect()
    }

    /// The records of `namespace` among `ids` (without embeddings), wherever they are
    /// held; an id no part holds is left out.
    pub(in crate::engine) async fn records_anywhere(
        &self,
        namespace: &str,
        ids: Vec<MemoryId>,
    ) -> Result<HashMap<MemoryId, MemoryRecord>> {
        let (here, there) = self.held_here(namespace, ids);
        let mut asks = vec![(AnyPart::Here(self.clone()), here)];
        asks.extend(there.into_iter().map(|(p, ids)| (AnyPart::There(p), ids)));
        let answers =
            futures::future::try_join_all(asks.into_iter().filter(|(_, ids)| !ids.is_empty()).map(
                |(part, ids)| async move {
                    let ask = PartAsk::Records {
                        namespace: namespace.to_string(),
                        ids,
                    };
                    part.ask(ask).await
                },
            ))
            .await?;
        let mut found = HashMap::new();
        for answer in answers {
            let PartReply::Records(records) = answer else {
                return Err(unexpected("a read of records"));
            };
            found.extend(records.into_iter().map(|r| (r.0.id, r.0)));
        }
        Ok(found)
    }

    /// Recall over this store and the parts `spread` names (module docs): ranked at
    /// `now` by the coordinator, this store's reinforcement returned with the answer (to be
    /// written with the recall's memory), the others' sent to their parts without waiting
    /// (best effort, as a single store's are).
    pub(super) async fn recall_spread(
        &self,
        others: Vec<Arc<dyn PartLink>>,
        req: &RecallRequest,
        query_vec: Option<&[f32]>,
        policy: &Arc<Policy>,
    ) -> Result<(RecallResult, WriteSet)> {
        let now = self.clock().now();
        let mut parts = vec![AnyPart::Here(self.clone())];
        parts.extend(others.into_iter().map(AnyPart::There));
        let (result, mut per_part) = recall_across(&parts, req, query_vec, policy, now).await?;
        let own = std::mem::take(&mut per_part[0]);
        if req.reinforce && policy.scoring.reinforce_on_recall > 0.0 {
            for (part, writes) in parts.into_iter().zip(per_part).skip(1) {
                let ids: Vec<MemoryId> = writes
                    .0
                    .iter()
                    .filter_map(|m| match m {
                        Mutation::Reinforce { id, .. } => Some(*id),
                        _ => None,
                    })
                    .collect();
                if ids.is_empty() {
                    continue;
                }
                let ask = PartAsk::Reinforce {
                    namespace: req.namespace.clone(),
                    at: now,
                    amount: policy.scoring.reinforce_on_recall,
                    ids,
                };
                tokio::spawn(async move {
                    if let Err(e) = part.ask(ask).await {
                        tracing::warn!(error = %e, "a recall's reinforcement did not reach its part");
                    }
                });
            }
        }
        Ok((result, own))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_round_and_its_answers_cross_the_wire() {
        let mut req = RecallRequest::new("acme", "s-1", "what broke the deploy?");
        req.scope = Scope::Namespace;
        req.since = Some(5);
        let plan = Plan {
            allowed: 7,
            context: (2, 0.5),
            ..Plan::default()
        };
        let ask = encode(&PartAsk::Hits(req, Some(vec![0.5, -1.0]), plan));
        let PartAsk::Hits(req, q, plan) = postcard::from_bytes(&ask).unwrap() else {
            panic!("another round")
        };
        assert_eq!(
            (req.namespace.as_str(), req.scope),
            ("acme", Scope::Namespace)
        );
        assert_eq!(req.since, Some(5));
        assert_eq!(
            (q, plan.allowed, plan.context),
            (Some(vec![0.5, -1.0]), 7, (2, 0.5))
        );

        let kind = crate::model::Kind::new("tool_result").unwrap();
        let mut record =
            MemoryRecord::episodic(MemoryId(3), "acme", "s-1", kind, "the deploy broke", 9);
        record.content = serde_json::json!({"tool": "deploy", "exit": 1});
        let reply = encode(&PartReply::Load(vec![WireRecord {
            id: record.id,
            record: encode_record(&record),
            embedding: None,
            similarity: Some(0.25),
            validity: None,
            passage: None,
        }]));
        let PartReply::Load(got) = postcard::from_bytes(&reply).unwrap() else {
            panic!("another answer")
        };
        let key = crate::store::keys::record(got[0].id);
        assert_eq!(
            decode_record(got[0].id, &key, &got[0].record, None).unwrap(),
            record
        );
    }
}
