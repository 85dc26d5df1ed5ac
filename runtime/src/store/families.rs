//! The store's small typed tables, kept for the layers above it: what each recall returned,
//! knowledge-graph edges, promotion markers, strike counts and quarantine entries, where a
//! session's condensation stands, when the last decay sweep ran, whether a record still
//! holds (its validity), and what recalls' reinforcements did, per session. Each has a type
//! here, a [`Mutation`](super::Mutation) that writes it and a reader on [`Store`]; the key
//! bytes and the encoding stay inside the store (built by `keys`, encoded by `codec`), so
//! no caller ever builds or parses a key. Tables that existed in format 1 keep its bytes;
//! later formats only added tables.

use serde::{Deserialize, Serialize};

use super::keys::{self, layer};
use super::kv::{Op, Visit};
use super::{Store, codec, read_fixed};
use crate::clock::Timestamp;
use crate::error::{Error, Result};
use crate::model::{AuditAction, AuditEntry, Edge, MemoryId, Relation};

/// What a recall returned, kept so feedback can name the recall instead of its records.
/// Postcard is positional: these fields, in this order, are the stored bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RememberedRecall {
    /// The namespace that asked.
    pub namespace: String,
    /// The session that asked.
    pub session: String,
    /// When (runtime clock).
    pub at: Timestamp,
    /// The records it returned, best first.
    pub ids: Vec<MemoryId>,
}

/// What a write sent with an idempotency key did, kept for
/// [`crate::engine::IDEMPOTENCY_WINDOW`] so that the same write sent again answers these
/// ids instead of storing its events twice.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Idempotent {
    /// The session written to.
    pub session: String,
    /// What the write carried (a digest of the request), to tell a retry from another
    /// request that reuses the key.
    pub fingerprint: String,
    /// When (runtime clock).
    pub at: Timestamp,
    /// The ids it answered, in order.
    pub ids: Vec<MemoryId>,
}

/// What one recall's reinforcement did to the records of one session: an entry of that
/// session's reinforcement log. Recall reinforces what it returns, and keeping each
/// record's entry under the record (as other audit entries are) would dirty a page per record
/// reinforced; a session's log takes one append per recall, and
/// [`Store::history`](super::Store::history) merges it back into each record's history.
/// Postcard is positional: these fields, in this order, are the stored bytes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reinforcements {
    /// When (runtime clock).
    pub at: Timestamp,
    /// Who reinforced (`recall`).
    pub by: String,
    /// Each record reinforced, with its strength before and after.
    pub items: Vec<(MemoryId, f32, f32)>,
}

impl Reinforcements {
    /// The audit entries this log entry holds for record `id`, in the order they were made
    /// (a record reinforced twice in one write has two).
    pub fn entries_for(&self, id: MemoryId) -> impl Iterator<Item = AuditEntry> + '_ {
        self.items
            .iter()
            .filter(move |item| item.0 == id)
            .map(|(_, before, after)| AuditEntry {
                at: self.at,
                action: AuditAction::Reinforced,
                by: self.by.clone(),
                detail: format!("strength {before:.3} -> {after:.3}"),
            })
    }
}

/// How often processing a record made an actor fail.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Strikes {
    /// Failures so far.
    pub count: u32,
    /// The actor that failed last.
    pub actor: String,
    /// Its error (the panic message).
    pub last_error: String,
}

/// Something set aside because processing it kept failing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QuarantineEntry {
    /// The record's id, or the id given to an input that never became a record.
    pub id: MemoryId,
    /// Its namespace.
    pub namespace: String,
    /// Its session, when known.
    pub session_id: Option<String>,
    /// The actor that kept failing on it.
    pub actor: String,
    /// The last error.
    pub error: String,
    /// Failures counted before it was set aside.
    pub strikes: u32,
    /// When (runtime clock).
    pub at: Timestamp,
    /// The events as they were sent (JSON), for an input that never became a record.
    pub input: Option<String>,
}

/// Whether a record still holds: what the update detector (or a person resolving a
/// conflict) found about it. Bi-temporal: `valid_until` is when the fact stopped being true
/// (the newer record's event time), `learned_at` when the runtime learned it. A record
/// without an entry is current and unchallenged. Postcard is positional: these fields, in
/// this order, are the stored bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Validity {
    /// The record that states its newer value.
    pub superseded_by: Option<MemoryId>,
    /// When it stopped being true (event time of `superseded_by`).
    pub valid_until: Option<Timestamp>,
    /// When that was learned (runtime clock).
    pub learned_at: Option<Timestamp>,
    /// Records it is in open conflict with.
    pub conflicts: Vec<MemoryId>,
    /// The older record this one repeats.
    pub duplicate_of: Option<MemoryId>,
}

impl Validity {
    /// Whether a newer record replaced it.
    pub fn superseded(&self) -> bool {
        self.superseded_by.is_some()
    }

    /// Whether nothing is known against it (no entry needs to be kept).
    pub fn is_clear(&self) -> bool {
        *self == Validity::default()
    }
}

/// One change to a record's [`Validity`], applied at commit time to the entry as it is
/// then, so the detector and a person resolving a conflict never undo each other.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ValidityChange {
    /// `by` states a newer value; the fact stopped being true `until`, learned `at`. The
    /// first supersession stays: a later record naming the same old value extends the
    /// chain from its successor, and the time it stopped being true does not move.
    SupersededBy {
        /// The newer record.
        by: MemoryId,
        /// Its event time.
        until: Timestamp,
        /// Runtime clock.
        at: Timestamp,
    },
    /// Current again (a person said the newer record was wrong about it).
    Reinstated,
    /// In open conflict with `with` (`open`), or no longer (`!open`: resolved).
    Conflict {
        /// The other record.
        with: MemoryId,
        /// Whether the conflict is open.
        open: bool,
    },
    /// It repeats the older record `of`.
    DuplicateOf(MemoryId),
}

impl ValidityChange {
    /// Applies the change to `v`.
    pub fn apply(&self, v: &mut Validity) {
        match *self {
            ValidityChange::SupersededBy { .. } if v.superseded() => {}
            ValidityChange::SupersededBy { by, until, at } => {
                v.superseded_by = Some(by);
                v.valid_until = Some(until);
                v.learned_at = Some(at);
            }
            ValidityChange::Reinstated => {
                v.superseded_by = None;
                v.valid_until = None;
                v.learned_at = None;
            }
            ValidityChange::Conflict { with, open } => {
                v.conflicts.retain(|c| *c != with);
                if open {
                    v.conflicts.push(with);
                    v.conflicts.sort_unstable();
                }
            }
            ValidityChange::DuplicateOf(of) => v.duplicate_of = Some(of),
        }
    }
}

/// The backend write of a typed-table mutation (called by the commit thread).
pub(super) fn recall_op(n: u32, recall: &RememberedRecall) -> Op {
    Op::Put(keys::recall(n).to_vec(), codec::encode(recall))
}

pub(super) fn recall_outcome_op(n: u32, seq: u64, success: bool) -> Op {
    Op::Put(
        keys::recall_outcome(n, seq).to_vec(),
        vec![u8::from(success)],
    )
}

/// The two entries of an idempotency key: by key (read by retries) and by time (read by
/// expiry).
pub(super) fn idempotent_ops(namespace: &str, key: &str, entry: &Idempotent) -> [Op; 2] {
    [
        Op::Put(keys::idempotent(namespace, key), codec::encode(entry)),
        Op::Put(
            keys::idempotent_by_time(entry.at, namespace, key),
            Vec::new(),
        ),
    ]
}

pub(super) fn reinforcements_op(
    namespace: &str,
    session: &str,
    seq: u64,
    entry: &Reinforcements,
) -> Op {
    Op::Put(
        keys::reinforced(namespace, session, seq),
        codec::encode(entry),
    )
}

pub(super) fn purged_session_op(id: MemoryId, session: &str) -> Op {
    Op::Put(
        keys::purged_session(id).to_vec(),
        session.as_bytes().to_vec(),
    )
}

pub(super) fn edge_op(namespace: &str, edge: &Edge) -> Op {
    Op::Put(
        keys::graph_edge(namespace, edge.from, edge.relation as u8, edge.to),
        Vec::new(),
    )
}

pub(super) fn promoted_op(condensed: MemoryId, knowledge: MemoryId) -> Op {
    Op::Put(
        keys::promoted(condensed).to_vec(),
        knowledge.0.to_be_bytes().to_vec(),
    )
}

pub(super) fn strikes_op(id: MemoryId, strikes: Option<&Strikes>) -> Op {
    match strikes {
        Some(s) => Op::Put(keys::strikes(id).to_vec(), codec::encode(s)),
        None => Op::Delete(keys::strikes(id).to_vec()),
    }
}

pub(super) fn quarantine_op(entry: &QuarantineEntry) -> Op {
    Op::Put(keys::quarantine(entry.id).to_vec(), codec::encode(entry))
}

pub(super) fn condensed_upto_op(namespace: &str, session: &str, upto: MemoryId) -> Op {
    Op::Put(
        keys::condensed_upto(namespace, session),
        upto.0.to_be_bytes().to_vec(),
    )
}

pub(super) fn last_decay_sweep_op(at: Timestamp) -> Op {
    Op::Put(keys::last_decay_sweep(), at.to_be_bytes().to_vec())
}

impl Store {
    /// The value under `key`, decoded, if there is one.
    pub(super) fn decoded<T: serde::de::DeserializeOwned>(&self, key: &[u8]) -> Result<Option<T>> {
        match self.inner.kv.get(key)? {
            Some(v) => codec::decode(key, &v).map(Some),
            None => Ok(None),
        }
    }

    /// A record's validity (clear when nothing is known against it).
    pub fn validity(&self, id: MemoryId) -> Result<Validity> {
        Ok(self.decoded(&keys::validity(id))?.unwrap_or_default())
    }

    /// What recall number `n` returned, if it was remembered.
    pub fn recall(&self, n: u32) -> Result<Option<RememberedRecall>> {
        self.decoded(&keys::recall(n))
    }

    /// Every remembered recall, by number.
    pub fn for_each_recall(
        &self,
        mut f: impl FnMut(u32, RememberedRecall) -> Result<Visit>,
    ) -> Result<()> {
        self.scan_prefix(&[layer::RECALL], &mut |k, v| match keys::id_from_key(k) {
            Some(n) => f(n.0, codec::decode(k, v)?),
            None => Ok(Visit::Continue),
        })
    }

    /// How the feedback on recall `n` went: (successes, failures).
    pub fn recall_outcomes(&self, n: u32) -> Result<(u32, u32)> {
        let mut counts = (0, 0);
        let prefix = &keys::recall_outcome(n, 0)[..5];
        self.scan_prefix(prefix, &mut |_, v| {
            if v.first() == Some(&1) {
                counts.0 += 1;
            } else {
                counts.1 += 1;
            }
            Ok(Visit::Continue)
        })?;
        Ok(counts)
    }

    /// Every piece of feedback given on a recall id, in recall order: the recall's number
    /// and whether it was a success.
    pub fn for_each_recall_outcome(
        &self,
        mut f: impl FnMut(u32, bool) -> Result<Visit>,
    ) -> Result<()> {
        self.scan_prefix(
            &[layer::RECALL_OUTCOME],
            &mut |k, v| match keys::recall_outcome_number(k) {
                Some(n) => f(n, v.first() == Some(&1)),
                None => Ok(Visit::Continue),
            },
        )
    }

    /// A namespace's knowledge-graph edges; only those starting at `from` when given.
    pub fn edges(&self, namespace: &str, from: Option<MemoryId>) -> Result<Vec<Edge>> {
        // An edge key is the namespace's prefix, `from`, the relation byte and `to`: the
        // prefix plus `from` selects exactly one record's outgoing edges.
        let mut prefix = keys::graph_edge_prefix(namespace);
        if let Some(id) = from {
            prefix.extend_from_slice(&id.0.to_be_bytes());
        }
        let mut edges = Vec::new();
        self.scan_prefix(&prefix, &mut |k, _| {
            let Some((from, rel, to)) = keys::graph_edge_parts(k) else {
                return Ok(Visit::Continue);
            };
            let relation = Relation::from_u8(rel).ok_or_else(|| Error::Corrupt {
                key: format!("{k:02x?}"),
                message: format!("unknown knowledge-graph relation {rel}"),
            })?;
            edges.push(Edge { from, to, relation });
            Ok(Visit::Continue)
        })?;
        Ok(edges)
    }

    /// The knowledge record a condensed record was promoted (or merged) into, if any.
    pub fn promoted_into(&self, condensed: MemoryId) -> Result<Option<MemoryId>> {
        let key = keys::promoted(condensed);
        let what = format!("promoted {condensed}");
        let id = read_fixed(self.inner.kv.as_ref(), &key, &what)?;
        Ok(id.map(|b| MemoryId(u32::from_be_bytes(b))))
    }

    /// What the write sent with idempotency key `key` in `namespace` did, if it is still
    /// remembered (expired keys are removed by [`super::Mutation::ExpireIdempotent`]).
    pub fn idempotent(&self, namespace: &str, key: &str) -> Result<Option<Idempotent>> {
        self.decoded(&keys::idempotent(namespace, key))
    }

    /// The reinforcement-log entries of `namespace`/`session` that name `id`, as audit
    /// entries with their sequence numbers, oldest first.
    pub(super) fn reinforcements_of(
        &self,
        namespace: &str,
        session: &str,
        id: MemoryId,
    ) -> Result<Vec<(u64, AuditEntry)>> {
        let mut out = Vec::new();
        self.scan_prefix(&keys::reinforced_prefix(namespace, session), &mut |k, v| {
            let entry: Reinforcements = codec::decode(k, v)?;
            if let Some(seq) = keys::trailing_seq(k) {
                out.extend(entry.entries_for(id).map(|audit| (seq, audit)));
            }
            Ok(Visit::Continue)
        })?;
        Ok(out)
    }

    /// The session a purged record belonged to, when the purge recorded it (purges before
    /// the reinforcement log did not, and did not need to).
    pub(super) fn purged_session(&self, id: MemoryId) -> Result<Option<String>> {
        Ok(self
            .inner
            .kv
            .get(&keys::purged_session(id))?
            .map(|v| String::from_utf8_lossy(&v).into_owned()))
    }

    /// The strikes counted against a record, if any.
    pub fn strikes(&self, id: MemoryId) -> Result<Option<Strikes>> {
        self.decoded(&keys::strikes(id))
    }

    /// The quarantine entry of an id, if it was set aside.
    pub fn quarantine_entry(&self, id: MemoryId) -> Result<Option<QuarantineEntry>> {
        self.decoded(&keys::quarantine(id))
    }

    /// Every quarantine entry, in id order.
    pub fn for_each_quarantined(
        &self,
        mut f: impl FnMut(QuarantineEntry) -> Result<Visit>,
    ) -> Result<()> {
        self.scan_prefix(&[layer::QUARANTINE], &mut |k, v| f(codec::decode(k, v)?))
    }

    /// The largest record id a condensation of the session has covered, if any.
    pub fn condensed_upto(&self, namespace: &str, session: &str) -> Result<Option<MemoryId>> {
        let key = keys::condensed_upto(namespace, session);
        let id = read_fixed(self.inner.kv.as_ref(), &key, "condensed_upto")?;
        Ok(id.map(|b| MemoryId(u32::from_be_bytes(b))))
    }

    /// Runtime-clock time of the last decay sweep, if one was recorded.
    pub fn last_decay_sweep(&self) -> Result<Option<Timestamp>> {
        let key = keys::last_decay_sweep();
        let at = read_fixed(self.inner.kv.as_ref(), &key, "last_decay_sweep")?;
        Ok(at.map(Timestamp::from_be_bytes))
    }
}
