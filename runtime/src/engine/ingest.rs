//! Writing events: validation, ids, the rules' importance, durable records with their audit
//! entries and work items in one commit — and enrichment, which embeds the records an
//! embedder could not embed inline, from the durable enrichment queue, in the background
//! (rounds of [`Substrate::enrich_pending`], run by the substrate's own enricher thread or,
//! under the actor runtime, by its Enricher actor: one owner either way). Ingest never
//! waits on a model: the hash embedder embeds inline, any other queues the record, and an
//! acknowledged write is never lost while the provider is down. A write may carry an
//! idempotency key ([`Substrate::record_once`]) that makes it safe to retry.

use std::sync::atomic::Ordering;
use std::sync::{Arc, mpsc};
use std::time::Duration;

use super::{EnrichWake, Substrate};
use crate::clock::Timestamp;
use crate::embed::{Embedded, embed_records};
use crate::error::{Error, Result};
use crate::index::passage;
use crate::model::{
    AuditAction, AuditEntry, MemoryId, MemoryRecord, NewMemory, Passage, Status,
    validate_embedding, validate_id,
};
use crate::policy::EvaluationMode;
use crate::store::{Idempotent, Mutation, Queue, WriteSet, stored_embedding};

/// How long a write's idempotency key is remembered: a retry within this window answers
/// the first write's ids and stores nothing; after it, the key is forgotten and a write
/// that reuses it is a new write. A day covers any client's retries, a restart, and a
/// deploy in between.
pub const IDEMPOTENCY_WINDOW: Timestamp = 24 * 3_600_000;

/// The idempotency key a write was sent with, and a digest of what it carried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Idempotency {
    /// The client's key: 1 to 255 visible ASCII characters.
    pub key: String,
    /// A digest of the request (the HTTP edge uses the SHA-256 of its body), to tell a
    /// retry (same key, same digest) from a different request that reuses the key.
    pub fingerprint: String,
}

/// What a write with an idempotency key did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// The ids of the events, in order.
    pub ids: Vec<MemoryId>,
    /// True when the key had been used by the same write before: the ids are that
    /// write's, and nothing was stored this time.
    pub replayed: bool,
}

impl Substrate {
    /// [`Substrate::record`] made safe to retry: with `idempotency`, a write whose key was
    /// used in the last [`IDEMPOTENCY_WINDOW`] by the same request to the same session
    /// answers that write's ids and stores nothing, and one that reuses the key for a
    /// different request is refused. The key is stored in the same commit as the events,
    /// so a crash or a cut connection after the commit still leaves it. Concurrent retries
    /// of one write are serialised by the caller (the session actor handles one write at a
    /// time).
    pub async fn record_once(
        &self,
        namespace: &str,
        session: &str,
        events: Vec<NewMemory>,
        idempotency: Option<&Idempotency>,
    ) -> Result<Recorded> {
        let Some(once) = idempotency else {
            let ids = self.record(namespace, session, events).await?;
            return Ok(Recorded {
                ids,
                replayed: false,
            });
        };
        validate_idempotency_key(&once.key)?;
        validate_id("namespace", namespace)?;
        let now = self.inner.clock.now();
        if let Some(first) = self.inner.store.idempotent(namespace, &once.key)?
            && now - first.at < IDEMPOTENCY_WINDOW
        {
            if first.session == session && first.fingerprint == once.fingerprint {
                return Ok(Recorded {
                    ids: first.ids,
                    replayed: true,
                });
            }
            return Err(Error::invalid(
                "idempotency_key",
                format!(
                    "`{}` was used within the last 24 hours for a different request (session \
                     `{}`); a retry must send the same request, and a new request needs a new \
                     key",
                    once.key, first.session
                ),
            ));
        }
        let (ids, queued, mut writes) = self.prepare(namespace, session, events).await?;
        writes.push(Mutation::RememberIdempotent {
            namespace: namespace.to_string(),
            key: once.key.clone(),
            entry: Idempotent {
                session: session.to_string(),
                fingerprint: once.fingerprint.clone(),
                at: now,
                ids: ids.clone(),
            },
        });
        // Each keyed write also forgets the keys that have expired since the last one: the
        // time-ordered scan reads only those.
        writes.push(Mutation::ExpireIdempotent(now - IDEMPOTENCY_WINDOW));
        self.inner.store.write_async(writes).await?;
        self.after_write(queued);
        Ok(Recorded {
            ids,
            replayed: false,
        })
    }

    /// Validates `events`, writes them as episodic records of `session` and returns their ids
    /// once they are durable. Importance comes from the event or the policy's rules; events
    /// without an embedding are embedded inline by a local embedder, or queued for
    /// enrichment. An invalid event rejects the whole call before anything is written.
    pub async fn record(
        &self,
        namespace: &str,
        session: &str,
        events: Vec<NewMemory>,
    ) -> Result<Vec<MemoryId>> {
        let (ids, queued, writes) = self.prepare(namespace, session, events).await?;
        self.inner.store.write_async(writes).await?;
        self.after_write(queued);
        Ok(ids)
    }

    /// [`Substrate::record`] for synchronous callers with a local embedder or precomputed
    /// embeddings (benchmarks, the crash-test writer). Must not be called inside an async
    /// runtime.
    pub fn record_blocking(
        &self,
        namespace: &str,
        session: &str,
        events: Vec<NewMemory>,
    ) -> Result<Vec<MemoryId>> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .map_err(|e| Error::io("tokio runtime", e))?;
        let (ids, queued, writes) = rt.block_on(self.prepare(namespace, session, events))?;
        self.inner.store.write(writes)?;
        self.after_write(queued);
        Ok(ids)
    }

    async fn prepare(
        &self,
        namespace: &str,
        session: &str,
        events: Vec<NewMemory>,
    ) -> Result<(Vec<MemoryId>, bool, WriteSet)> {
        validate_id("namespace", namespace)?;
        validate_id("session_id", session)?;
        let limits = &self.inner.limits;
        if events.is_empty() {
            return Err(Error::invalid(
                "events",
                "no events sent; send at least one",
            ));
        }
        if events.len() > limits.max_events_per_call {
            return Err(Error::TooLarge {
                field: "events".into(),
                size: events.len(),
                limit: limits.max_events_per_call,
                hint: "send them in several calls".into(),
            });
        }
        let dims = self.inner.embedder.dimensions();
        let mut valid = Vec::with_capacity(events.len());
        for (i, e) in events.into_iter().enumerate() {
            let v = e
                .validate(limits, Some(dims))
                .map_err(|err| at_event(i, err))?;
            if let Some(parent) = &v.parent_id {
                self.check_parent(namespace, parent)
                    .map_err(|err| at_event(i, err))?;
            }
            valid.push(v);
        }
        // An inline embedder (hash) costs microseconds: embed now so the acknowledged record
        // is complete. Any other would make ingest wait on the network or on milliseconds
        // of model per text: queue instead, for the enricher.
        // A client's vector as the store will keep it (half precision), so what this
        // write hands on equals what every later read sees.
        let mut embeddings: Vec<Option<Vec<f32>>> = valid
            .iter_mut()
            .map(|v| v.embedding.take().map(|e| stored_embedding(&e)))
            .collect();
        let mut passages: Vec<Vec<Passage>> = vec![Vec::new(); valid.len()];
        if self.inner.embedder.embeds_inline() {
            let missing: Vec<usize> = (0..valid.len())
                .filter(|i| embeddings[*i].is_none())
                .collect();
            if !missing.is_empty() {
                let texts: Vec<&str> = missing.iter().map(|i| valid[*i].text.as_str()).collect();
                let embedded = self.embed_records(&texts).await?;
                for (i, e) in missing.into_iter().zip(embedded) {
                    embeddings[i] = Some(e.vector);
                    passages[i] = e.passages;
                }
            }
        }
        let policy = self.policy_for(namespace);
        let stamp = policy.stamp();
        let now = self.inner.clock.now();
        let ids = self.inner.store.allocate_ids(valid.len())?;
        let mut out = Vec::with_capacity(valid.len());
        let mut queued = false;
        let mut writes = WriteSet::new();
        for (((v, id), embedding), passages) in
            valid.into_iter().zip(ids).zip(embeddings).zip(passages)
        {
            // The rules score every event now; in `llm` mode (every event) and `hybrid`
            // mode (events no rule matched) that score is provisional, and the record
            // waits on the evaluation queue for the judge (see `super::evaluate`).
            let (importance, scored_by, judge) = match v.importance {
                Some(i) => (i, "client".to_string(), false),
                None => {
                    let d = policy.importance(v.kind.as_str(), &v.text);
                    let by = match d.rule {
                        Some(r) => format!("rule {}", r + 1),
                        None => "default_importance".to_string(),
                    };
                    let judge = match policy.evaluation.mode {
                        EvaluationMode::Rules => false,
                        EvaluationMode::Llm => true,
                        EvaluationMode::Hybrid => d.defaulted,
                    };
                    (d.importance, by, judge)
                }
            };
            let provisional = if judge {
                "; provisional, queued for the judge"
            } else {
                ""
            };
            let status = if v.pinned {
                Status::Pinned
            } else {
                Status::Active
            };
            let record = MemoryRecord {
                status,
                agent_id: v.agent_id,
                content: v.content,
                metadata: v.metadata,
                parent_id: v.parent_id,
                event_time: v.timestamp.unwrap_or(now),
                importance,
                strength: policy.initial_strength(importance),
                policy: stamp.clone(),
                embedding,
                ..MemoryRecord::episodic(id, namespace, session, v.kind, v.text, now)
            };
            let by = record.agent_id.clone().unwrap_or_else(|| "client".into());
            writes.push(Mutation::Audit(
                id,
                AuditEntry {
                    at: now,
                    action: AuditAction::Created,
                    by,
                    detail: format!(
                        "{} in session {}{}",
                        record.kind,
                        record.session_id,
                        if v.pinned { ", pinned" } else { "" }
                    ),
                },
            ));
            writes.push(Mutation::Audit(
                id,
                AuditEntry {
                    at: now,
                    action: AuditAction::Scored,
                    by: stamp.name.clone(),
                    detail: format!("importance {importance} ({scored_by}{provisional})"),
                },
            ));
            if judge {
                writes.push(Mutation::Enqueue(Queue::Evaluate, id));
            }
            if record.embedding.is_none() {
                writes.push(Mutation::Enqueue(Queue::Enrich, id));
            }
            if policy.updates.on() {
                writes.push(Mutation::Enqueue(Queue::Updates, id));
            }
            queued |= record.embedding.is_none();
            out.push(record.id);
            writes.push(Mutation::Insert(Box::new(record)));
            if !passages.is_empty() {
                writes.push(Mutation::SetPassages(id, passages));
            }
        }
        Ok((out, queued, writes))
    }

    /// A `parent_id` must name a record of the writer's own namespace: a link to another
    /// tenant's record (or to none) would show up in the graph and the history as if it
    /// were this namespace's.
    fn check_parent(&self, namespace: &str, parent: &str) -> Result<()> {
        let found = match parent.parse::<MemoryId>() {
            Ok(id) => self.inner.store.get_light(id)?,
            Err(_) => None,
        };
        match found {
            Some(r) if r.namespace == namespace => Ok(()),
            _ => Err(Error::invalid(
                "parent_id",
                format!(
                    "`{parent}` is not a record of this namespace; send the id a write or a \
                     recall answered (like `mem-0000002a`), or leave parent_id out"
                ),
            )),
        }
    }

    /// Wakes the indexer (and the enricher when some records wait for their embedding).
    /// The write is already in the change log, so recall's catch-up sees it even before the
    /// indexer does; ingest does no index work itself.
    pub(crate) fn after_write(&self, queued: bool) {
        if queued {
            self.wake_enricher();
        }
        self.wake_indexer();
    }

    /// Embeds queued records (oldest first), up to `max` texts — a long record counts
    /// once per passage, and the first is taken whatever its length — and hands them to
    /// the indexes. Returns how many records were enriched. A crash in the middle loses
    /// nothing: the queue items are removed in the same write that stores the embeddings.
    pub async fn enrich_pending(&self, max: usize) -> Result<usize> {
        let ids = self.inner.store.queued(Queue::Enrich, max)?;
        if ids.is_empty() {
            return Ok(0);
        }
        let mut records = Vec::with_capacity(ids.len());
        let mut writes = WriteSet::new();
        let mut texts = 0;
        for id in ids {
            match self.inner.store.get_light(id)? {
                // A round stays about `max` texts long: a remote provider's batches in
                // flight, or a few seconds of a local model, whatever the records' length.
                Some(r) => {
                    let n = passage::split(&r.text).len();
                    if !records.is_empty() && texts + n > max {
                        break;
                    }
                    texts += n;
                    records.push(r);
                }
                // Purged while queued.
                None => {
                    writes.push(Mutation::Dequeue(Queue::Enrich, id));
                }
            }
        }
        let texts: Vec<&str> = records.iter().map(|r| r.text.as_str()).collect();
        let embedded = if texts.is_empty() {
            Vec::new()
        } else {
            self.embed_records(&texts).await?
        };
        let now = self.inner.clock.now();
        let dims = self.inner.embedder.dimensions();
        for (r, e) in records.iter().zip(embedded) {
            validate_embedding(&e.vector, Some(dims))?;
            for p in &e.passages {
                validate_embedding(&p.embedding, Some(dims))?;
            }
            let detail = match e.passages.len() {
                0 => format!("{dims} dimensions"),
                n => format!("{dims} dimensions, {n} passages"),
            };
            writes.push(Mutation::Audit(
                r.id,
                AuditEntry {
                    at: now,
                    action: AuditAction::Embedded,
                    by: self.inner.embedder.name().to_string(),
                    detail,
                },
            ));
            writes.push(Mutation::Dequeue(Queue::Enrich, r.id));
            // Only the embedding is written: the record may have changed while the provider
            // was answering, and rewriting it would undo that.
            writes.push(Mutation::SetEmbedding(r.id, e.vector));
            if !e.passages.is_empty() {
                writes.push(Mutation::SetPassages(r.id, e.passages));
            }
        }
        let n = records.len();
        self.inner.store.write_async(writes).await?;
        self.wake_indexer();
        // A candidate waited for one of these embeddings to be promoted: wake promotion.
        // The queue is empty nearly always, and one seek says so.
        let store = &self.inner.store;
        let mut waited = false;
        if store.queue_depth(Queue::Promote, 1)? > 0 {
            for r in &records {
                if store.is_queued(Queue::Promote, r.id)? {
                    waited = true;
                    break;
                }
            }
        }
        if waited {
            // Without an owner (the substrate alone, whose caller decides when to promote)
            // the candidates wait for its next `promote_waiting`.
            self.inner.promotion_wake.fire();
        }
        Ok(n)
    }

    /// [`embed_records`] with the substrate's embedder, its failures counted for the
    /// metrics: records' vectors, long ones passage by passage.
    pub(super) async fn embed_records(&self, texts: &[&str]) -> Result<Vec<Embedded>> {
        let embedded = embed_records(self.inner.embedder.as_ref(), texts).await;
        if embedded.is_err() {
            self.inner.provider_errors.fetch_add(1, Ordering::Relaxed);
        }
        embedded
    }

    /// The embedder, with its failures counted for the metrics.
    pub(super) async fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>> {
        let embedded = self.inner.embedder.embed(texts).await;
        if embedded.is_err() {
            self.inner.provider_errors.fetch_add(1, Ordering::Relaxed);
        }
        embedded
    }

    pub(super) fn wake_enricher(&self) {
        self.inner.enrich_wake.fire();
    }

    /// Makes `wake` the owner of enrichment's wake-up, called whenever records are queued
    /// for their embedding (`None` removes it). The actor runtime, which runs without the
    /// substrate's background threads, hands it to its Enricher actor; the owner drains the
    /// queue with [`Substrate::enrich_pending`] and should also look at it now and then,
    /// since records queued by an earlier process wake nobody.
    pub fn on_enrich_queued(&self, wake: Option<EnrichWake>) {
        self.inner.enrich_wake.set(wake);
    }

    /// How many queued records one [`Substrate::enrich_pending`] round should take to keep
    /// the embedder busy: a remote one's batch size times its requests in flight.
    pub fn enrich_round(&self) -> usize {
        self.inner.embedder.texts_per_call().max(1)
    }

    /// Embeds queued records in the background with the substrate's embedder, on its own
    /// thread and runtime, backing off while the provider fails. Records wait in the durable
    /// queue meanwhile, so nothing is lost when it is down or the process dies.
    pub(super) fn start_enricher(&self) -> Result<()> {
        let (tx, rx) = mpsc::channel::<()>();
        // Work left from a previous run starts at once.
        let _ = tx.send(());
        self.on_enrich_queued(Some(Arc::new(move || {
            let _ = tx.send(());
        })));
        let weak = Arc::downgrade(&self.inner);
        let handle = std::thread::Builder::new()
            .name("enricher".into())
            .spawn(move || {
                let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build()
                else {
                    tracing::error!("the enricher could not start a runtime; queued records wait");
                    return;
                };
                let mut backoff = Duration::from_millis(100);
                loop {
                    match rx.recv_timeout(Duration::from_secs(1)) {
                        Ok(()) => while rx.try_recv().is_ok() {},
                        Err(mpsc::RecvTimeoutError::Timeout) => {}
                        Err(mpsc::RecvTimeoutError::Disconnected) => return,
                    }
                    loop {
                        let Some(inner) = weak.upgrade() else { return };
                        if inner.closed.load(Ordering::SeqCst) {
                            return;
                        }
                        let sub = Substrate { inner };
                        match rt.block_on(sub.enrich_pending(sub.enrich_round())) {
                            Ok(0) => {
                                backoff = Duration::from_millis(100);
                                break;
                            }
                            Ok(_) => continue,
                            Err(e) => {
                                tracing::warn!(error = %e, retry_in = ?backoff, "enrichment failed; records stay queued");
                                drop(sub);
                                std::thread::sleep(backoff);
                                backoff = (backoff * 2).min(Duration::from_secs(30));
                                break;
                            }
                        }
                    }
                }
            })
            .map_err(|e| Error::io("enricher thread", e))?;
        *self
            .inner
            .enricher
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(handle);
        Ok(())
    }
}

fn at_event(i: usize, err: Error) -> Error {
    match err {
        Error::Invalid { field, reason } => Error::Invalid {
            field: format!("events[{i}].{field}"),
            reason,
        },
        Error::TooLarge {
            field,
            size,
            limit,
            hint,
        } => Error::TooLarge {
            field: format!("events[{i}].{field}"),
            size,
            limit,
            hint,
        },
        other => other,
    }
}

/// An idempotency key is 1 to 255 visible ASCII characters (what an HTTP header carries
/// safely; a UUID is the usual choice).
fn validate_idempotency_key(key: &str) -> Result<()> {
    if (1..=255).contains(&key.len()) && key.bytes().all(|b| b.is_ascii_graphic()) {
        return Ok(());
    }
    Err(Error::invalid(
        "idempotency_key",
        "must be 1 to 255 visible ASCII characters without spaces; a UUID is a good key",
    ))
}
