//! Export and import: a whole store (or one namespace) as JSON lines, with what it takes to
//! restore it exactly. Every line is one JSON object with `"format":1` and one of:
//!
//! - `header` — always the first line ([`Header`]): the embedder that made the vectors and
//!   their dimension, and the source's next id and next recall number. Import refuses
//!   another embedder (vectors of different models cannot be compared) and never hands out
//!   an id below `next_id` or a recall number below `next_recall`, so a recall id, a
//!   quarantined input's id or a purged record's id of the source never comes back meaning
//!   something else.
//! - `record` — one per record of every tier and status ([`Exported`]), in id order: the
//!   record itself (id, sources, status, strength, utility, timestamps, metadata, embedding),
//!   its audit history, its knowledge-graph links, the knowledge record it was promoted
//!   into, what is known against it (its `validity`: superseded by, valid until, open
//!   conflicts, the record it repeats; absent while clear, so older exports import
//!   unchanged), and the work queues it waits on.
//! - `purged` — a purged record's tombstone ([`Purged`]): its namespace, its audit history
//!   and the graph edges that still start at it.
//! - `quarantine` — an entry set aside because processing it kept failing, with the audit
//!   history of an input that never became a record.
//! - `recall` — what a recall returned ([`RecallLog`]), so feedback on a recall id given
//!   before the move keeps working after it, and how the feedback on it went so far.
//!
//! What is **not** exported, because it is derived or local to a running process: the
//! vector and keyword indexes (rebuilt from the records), the change log, strike counts of
//! records not (yet) quarantined, and the time of the last decay sweep (the importing
//! server sweeps on its own schedule). Session statistics are rebuilt from the imported
//! records, so events of records purged before the export are no longer counted.
//!
//! Exporting, importing into an empty store and exporting again gives the same bytes: lines
//! come in a fixed order, the header holds nothing that changes between runs (no export
//! time, for that reason), and import keeps every id and writes nothing of its own (no extra
//! audit entry).
//!
//! Import goes through the store's ordinary commit path ([`Mutation::Insert`]), so the
//! catalog, the listings, the session statistics and the change log follow as for any new
//! record, and the vector and keyword indexes pick the records up from the change log. It
//! never overwrites anything: an id already in the store is skipped when it holds the same
//! thing (a re-run after an interrupted import), reported as [`Outcome::Different`] when it
//! holds the same record in another state (a newer or older export), and refused when it
//! is another record altogether.

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::clock::Timestamp;
use crate::engine::{Substrate, recall_id};
use crate::error::{Error, Result};
use crate::index::passage::is_long;
use crate::model::{
    AuditAction, AuditEntry, Edge, MemoryId, MemoryRecord, Relation, Tier, validate_embedding,
    validate_id,
};
use crate::store::{
    Filter, Mutation, QuarantineEntry, Queue, RememberedRecall, Store, Validity, ValidityChange,
    Visit, WriteSet,
};

/// The version of the line format this build writes and reads.
pub const FORMAT: u32 = 1;

/// Lines written in one commit by [`Importer`]: large enough that fsyncs do not dominate,
/// small enough that an interrupted import redoes little.
const BATCH: usize = 512;

/// The first line of every export: what the importing directory must agree with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Header {
    /// The name of the embedder that made the exported embeddings (`None` when the source
    /// never stored one).
    pub embedder: Option<String>,
    /// Their dimension.
    pub dimension: Option<usize>,
    /// The source's next id: every id below it was handed out there (records, quarantined
    /// inputs, purged records), so the importing store reserves them all.
    pub next_id: u32,
    /// The source's next recall number (recalls count apart from records): the importing
    /// store reserves every number below it, so an old `rcl-…` id never names a new recall.
    pub next_recall: u32,
    /// The one namespace exported, when `--namespace` chose one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// A work queue a record waits on, by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Waiting {
    /// Waiting for its embedding.
    Enrich,
    /// Waiting for the LLM judge's importance.
    Evaluate,
    /// Waiting for condensation.
    Condense,
    /// Waiting to be compared with older records (`[updates]`).
    Updates,
    /// Admitted by the promotion policy, waiting to be promoted into the knowledge pool.
    Promote,
}

impl Waiting {
    const ALL: [Waiting; 5] = [
        Waiting::Enrich,
        Waiting::Evaluate,
        Waiting::Condense,
        Waiting::Updates,
        Waiting::Promote,
    ];

    fn queue(self) -> Queue {
        match self {
            Waiting::Enrich => Queue::Enrich,
            Waiting::Evaluate => Queue::Evaluate,
            Waiting::Condense => Queue::Condense,
            Waiting::Updates => Queue::Updates,
            Waiting::Promote => Queue::Promote,
        }
    }
}

/// A knowledge-graph edge that starts at the exported record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Link {
    /// What the edge means.
    pub relation: Relation,
    /// Where it ends.
    pub to: MemoryId,
}

/// A `record` line: a record and everything attached to it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Exported {
    /// [`FORMAT`] of the build that wrote the line.
    pub format: u32,
    /// The record, with its embedding when it has one.
    pub record: MemoryRecord,
    /// Its audit log, oldest first.
    #[serde(default)]
    pub history: Vec<AuditEntry>,
    /// Knowledge-graph edges from it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub links: Vec<Link>,
    /// The knowledge record a condensed record was promoted (or merged) into.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub promoted_into: Option<MemoryId>,
    /// What is known against it: superseded, in open conflict, a repeat.
    #[serde(default, skip_serializing_if = "Validity::is_clear")]
    pub validity: Validity,
    /// The work queues it waits on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waiting: Vec<Waiting>,
}

/// A `purged` line: what is left of a purged record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Purged {
    /// Its id (never handed out again).
    pub id: MemoryId,
    /// The namespace it belonged to, which alone may read its history.
    pub namespace: String,
    /// Its audit log, oldest first (the last entry says why it was purged).
    pub history: Vec<AuditEntry>,
    /// Knowledge-graph edges that still start at it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub links: Vec<Link>,
}

/// A `recall` line: what one recall returned, so feedback can still name it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecallLog {
    /// The recall id the client was given, `rcl-` and 8 hex digits.
    pub id: String,
    /// The namespace that asked.
    pub namespace: String,
    /// The session that asked.
    pub session: String,
    /// When (runtime clock).
    pub at: Timestamp,
    /// The records it returned, best first.
    pub ids: Vec<MemoryId>,
    /// Feedback on it that said it went well (absent: none, as in exports made before
    /// feedback on recalls was kept apart).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub successes: u32,
    /// Feedback on it that said it did not.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub failures: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// One line of an export.
#[derive(Debug, Clone, PartialEq)]
pub enum Line {
    /// The first line.
    Header(Header),
    /// A record.
    Record(Box<Exported>),
    /// A purged record's tombstone.
    Purged(Purged),
    /// A quarantine entry; `history` is the audit log of an input that never became a
    /// record (a record's own line carries its history).
    Quarantine {
        /// The entry.
        entry: QuarantineEntry,
        /// The audit log of an input that never became a record; empty otherwise.
        history: Vec<AuditEntry>,
    },
    /// A recall.
    Recall(RecallLog),
}

impl Line {
    /// The line as JSON, without the newline.
    pub fn to_json(&self) -> Result<String> {
        let value = match self {
            Line::Header(h) => serde_json::json!({"format": FORMAT, "header": h}),
            Line::Record(e) => serde_json::to_value(e).map_err(json_error)?,
            Line::Purged(p) => serde_json::json!({"format": FORMAT, "purged": p}),
            Line::Quarantine { entry, history } if history.is_empty() => {
                serde_json::json!({"format": FORMAT, "quarantine": entry})
            }
            Line::Quarantine { entry, history } => {
                serde_json::json!({"format": FORMAT, "quarantine": entry, "history": history})
            }
            Line::Recall(r) => serde_json::json!({"format": FORMAT, "recall": r}),
        };
        serde_json::to_string(&value).map_err(json_error)
    }
}

/// A value that did not turn into JSON (cannot happen for these types; kept an error
/// rather than a panic all the same).
fn json_error(e: serde_json::Error) -> Error {
    Error::invalid("line", format!("cannot be written as JSON: {e}"))
}

/// The header an export of `store` (or of one namespace) starts with.
pub fn export_header(store: &Store, namespace: Option<&str>) -> Result<Header> {
    Ok(Header {
        embedder: store.embedder_name()?,
        dimension: store.dimension()?,
        next_id: store.next_id(),
        next_recall: store.next_recall(),
        namespace: namespace.map(str::to_string),
    })
}

/// The ids an export visits, in id order: every record, or one namespace's.
pub fn export_ids(store: &Store, namespace: Option<&str>) -> Result<Vec<MemoryId>> {
    if let Some(ns) = namespace {
        return Ok(store
            .candidates(&Filter {
                namespace: ns,
                ..Filter::default()
            })
            .into_iter()
            .map(MemoryId)
            .collect());
    }
    let mut ids = Vec::with_capacity(store.len() as usize);
    store.for_each_id(|id| {
        ids.push(id);
        Ok(Visit::Continue)
    })?;
    Ok(ids)
}

/// One record's export line; `None` when it no longer exists.
pub fn export_record(store: &Store, id: MemoryId) -> Result<Option<Exported>> {
    let Some(record) = store.get(id)? else {
        return Ok(None);
    };
    let history = store.history(id)?;
    let links = links_from(store, &record.namespace, id)?;
    let promoted_into = store.promoted_into(id)?;
    let validity = store.validity(id)?;
    let mut waiting = Vec::new();
    for w in Waiting::ALL {
        if store.is_queued(w.queue(), id)? {
            waiting.push(w);
        }
    }
    Ok(Some(Exported {
        format: FORMAT,
        record,
        history,
        links,
        promoted_into,
        validity,
        waiting,
    }))
}

/// The changes that give a record with no validity yet the validity `v`.
fn validity_changes(v: &Validity) -> Vec<ValidityChange> {
    let mut changes = Vec::new();
    if let (Some(by), Some(until), Some(at)) = (v.superseded_by, v.valid_until, v.learned_at) {
        changes.push(ValidityChange::SupersededBy { by, until, at });
    }
    changes.extend(
        v.conflicts
            .iter()
            .map(|&with| ValidityChange::Conflict { with, open: true }),
    );
    changes.extend(v.duplicate_of.map(ValidityChange::DuplicateOf));
    changes
}

/// The knowledge-graph edges that start at `id`.
fn links_from(store: &Store, namespace: &str, id: MemoryId) -> Result<Vec<Link>> {
    Ok(store
        .edges(namespace, Some(id))?
        .into_iter()
        .filter(|e| e.from == id)
        .map(|e| Link {
            relation: e.relation,
            to: e.to,
        })
        .collect())
}

/// The edge a link of record `from` stands for.
fn edge(namespace: &str, from: MemoryId, link: Link) -> Mutation {
    Mutation::PutEdge(
        namespace.to_string(),
        Edge {
            from,
            to: link.to,
            relation: link.relation,
        },
    )
}

/// Something an export writes after the records (see [`export_extras`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Extra {
    /// A purged record's tombstone.
    Purged(MemoryId),
    /// A quarantine entry.
    Quarantine(MemoryId),
    /// A recall, by the number in its id.
    Recall(u32),
}

/// What an export writes after the records, in the order it writes them: tombstones,
/// quarantine entries, recalls (each in id order), all of them or one namespace's.
pub fn export_extras(store: &Store, namespace: Option<&str>) -> Result<Vec<Extra>> {
    let wanted = |ns: &str| namespace.is_none_or(|n| n == ns);
    let mut out = Vec::new();
    store.for_each_tombstone(|id, ns| {
        if wanted(&ns) {
            out.push(Extra::Purged(id));
        }
        Ok(Visit::Continue)
    })?;
    store.for_each_quarantined(|entry| {
        if wanted(&entry.namespace) {
            out.push(Extra::Quarantine(entry.id));
        }
        Ok(Visit::Continue)
    })?;
    store.for_each_recall(|n, recall| {
        if wanted(&recall.namespace) {
            out.push(Extra::Recall(n));
        }
        Ok(Visit::Continue)
    })?;
    Ok(out)
}

/// The line of one [`Extra`]; `None` when it is gone.
pub fn export_extra(store: &Store, extra: Extra) -> Result<Option<Line>> {
    Ok(match extra {
        Extra::Purged(id) => match store.tombstone(id)? {
            Some(namespace) => Some(Line::Purged(Purged {
                id,
                history: store.history(id)?,
                links: links_from(store, &namespace, id)?,
                namespace,
            })),
            None => None,
        },
        Extra::Quarantine(id) => {
            match store.quarantine_entry(id)? {
                Some(entry) => {
                    // A record's (or purged record's) line carries its history already.
                    let history = if store.owner(id)?.is_none() {
                        store.history(id)?
                    } else {
                        Vec::new()
                    };
                    Some(Line::Quarantine { entry, history })
                }
                None => None,
            }
        }
        Extra::Recall(n) => match store.recall(n)? {
            Some(r) => {
                let (successes, failures) = store.recall_outcomes(n)?;
                Some(Line::Recall(RecallLog {
                    id: recall_id(n),
                    namespace: r.namespace,
                    session: r.session,
                    at: r.at,
                    ids: r.ids,
                    successes,
                    failures,
                }))
            }
            None => None,
        },
    })
}

/// Reads one line of an export. Errors say which field is wrong; the caller adds the line
/// number.
pub fn parse_line(text: &str) -> Result<Line> {
    let value: Value = serde_json::from_str(text).map_err(|e| {
        Error::invalid(
            "line",
            format!("is not JSON ({e}); every line must be one JSON object as written by `shadowbrain export`"),
        )
    })?;
    let Some(object) = value.as_object() else {
        return Err(Error::invalid(
            "line",
            "is not a JSON object; every line of an export is one object with a `format`",
        ));
    };
    match object.get("format") {
        Some(Value::Number(n)) if n.as_u64() == Some(u64::from(FORMAT)) => {}
        Some(Value::Number(n)) => {
            return Err(Error::invalid(
                "format",
                format!(
                    "is {n}, but this build reads format {FORMAT}; import with the shadowbrain \
                     version that exported the file, or a newer one"
                ),
            ));
        }
        Some(other) => {
            return Err(Error::invalid(
                "format",
                format!("is {other}, not a number; it must be the number {FORMAT}, unquoted"),
            ));
        }
        None => {
            return Err(Error::invalid(
                "format",
                format!(
                    "is missing; lines written by `shadowbrain export` start with \
                     {{\"format\":{FORMAT},…}}"
                ),
            ));
        }
    }
    let kinds = ["header", "record", "purged", "quarantine", "recall"];
    let present: Vec<&str> = kinds
        .iter()
        .copied()
        .filter(|k| object.contains_key(*k))
        .collect();
    let kind = match present.as_slice() {
        [one] => *one,
        _ => {
            return Err(Error::invalid(
                "line",
                format!(
                    "has {}; every line holds exactly one of `{}` as written by `shadowbrain \
                     export`",
                    if present.is_empty() {
                        "none of them".to_string()
                    } else {
                        present.join(" and ")
                    },
                    kinds.join("`, `")
                ),
            ));
        }
    };
    let fields_error = |e: serde_json::Error| {
        Error::invalid(
            "line",
            format!("{e}; fields and their types are those `shadowbrain export` writes"),
        )
    };
    let allowed: &[&str] = match kind {
        "record" => &[],
        "quarantine" => &["format", "quarantine", "history"],
        _ => &["format", kind],
    };
    if let Some(extra) = object
        .keys()
        .find(|k| !allowed.is_empty() && !allowed.contains(&k.as_str()))
    {
        return Err(Error::invalid(
            "line",
            format!("unknown field `{extra}` beside `{kind}`; remove it"),
        ));
    }
    let inner = &object[kind];
    Ok(match kind {
        "header" => Line::Header(Header::deserialize(inner).map_err(|e| in_field("header", e))?),
        "record" => {
            let exported = Exported::deserialize(&value).map_err(fields_error)?;
            // `MemoryRecord` itself ignores unknown fields; an export never has any, so one
            // here is a typo or a file from another program, and must not vanish silently.
            let known = serde_json::to_value(&exported.record).map_err(json_error)?;
            for sub in [None, Some("utility"), Some("policy")] {
                let (given, known) = match sub {
                    None => (Some(inner), Some(&known)),
                    Some(k) => (inner.get(k), known.get(k)),
                };
                if let (Some(Value::Object(given)), Some(Value::Object(known))) = (given, known)
                    && let Some(extra) = given.keys().find(|k| !known.contains_key(*k))
                {
                    let path = sub.map_or("record".to_string(), |s| format!("record.{s}"));
                    return Err(Error::invalid(
                        path,
                        format!("has an unknown field `{extra}`; remove it"),
                    ));
                }
            }
            Line::Record(Box::new(exported))
        }
        "purged" => Line::Purged(Purged::deserialize(inner).map_err(|e| in_field("purged", e))?),
        "quarantine" => {
            let entry =
                QuarantineEntry::deserialize(inner).map_err(|e| in_field("quarantine", e))?;
            let known = serde_json::to_value(&entry).map_err(json_error)?;
            if let (Value::Object(given), Value::Object(known)) = (inner, &known)
                && let Some(extra) = given.keys().find(|k| !known.contains_key(*k))
            {
                return Err(Error::invalid(
                    "quarantine",
                    format!("has an unknown field `{extra}`; remove it"),
                ));
            }
            let history = match object.get("history") {
                Some(h) => Vec::<AuditEntry>::deserialize(h).map_err(|e| in_field("history", e))?,
                None => Vec::new(),
            };
            Line::Quarantine { entry, history }
        }
        _ => Line::Recall(RecallLog::deserialize(inner).map_err(|e| in_field("recall", e))?),
    })
}

fn in_field(field: &str, e: serde_json::Error) -> Error {
    Error::invalid(
        field,
        format!("{e}; fields and their types are those `shadowbrain export` writes"),
    )
}

/// What [`Importer::add`] did with a line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Written (durable after the next [`Importer::flush`]).
    Imported,
    /// The store already holds exactly this: left alone.
    AlreadyPresent,
    /// The store holds this id for the same thing, in another state (later reinforcement,
    /// decay, feedback, history): the store's version was kept. The id, for the report.
    Different(String),
    /// The header: checked, and the source's ids reserved.
    Header,
}

/// Why [`Importer::add`] or [`Importer::flush`] failed.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// The line is wrong (or clashes with the store); nothing of it was written.
    #[error("{0}")]
    Line(Error),
    /// Reading or writing the data directory failed: the line may be fine.
    #[error("{0}")]
    Store(Error),
}

/// A reference from one imported line to a record that is neither in the store nor in the
/// file (after the whole file was imported).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dangling {
    /// The record that refers.
    pub from: MemoryId,
    /// What refers: `sources`, `links` or `promoted_into`.
    pub field: &'static str,
    /// The record referred to, missing from the namespace.
    pub to: MemoryId,
}

impl std::fmt::Display for Dangling {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{} → {}", self.from, self.field, self.to)
    }
}

/// Writes exported lines into a substrate, in batches. Call [`Importer::finish`] at the end
/// (or [`Importer::flush`] before giving up on a bad line: what was added before it is then
/// durable).
#[derive(Debug)]
pub struct Importer {
    sub: Substrate,
    writes: WriteSet,
    /// Lines added since the last flush (not yet in the store).
    pending: usize,
    /// Lines made durable so far.
    committed: u64,
    highest: Option<MemoryId>,
    queued: bool,
    /// Per (namespace, session): the largest source id its condensed records cover (see
    /// `Store::condensed_upto`), so the condenser does not condense imported events again.
    condensed_upto: HashMap<(String, String), MemoryId>,
    /// Tombstones to write once the batch holding their history is durable.
    tombstones: Vec<(MemoryId, String)>,
    header: Option<Header>,
    /// Line numbers of the ids seen in this file, per kind of line: an export lists each once.
    seen: HashMap<(u8, u32), u64>,
    /// Ids referred to by imported lines, checked by [`Importer::finish`]: (from, field, to).
    references: Vec<(MemoryId, &'static str, MemoryId)>,
}

impl Importer {
    /// An importer into `sub`.
    pub fn new(sub: &Substrate) -> Importer {
        Importer {
            sub: sub.clone(),
            writes: WriteSet::new(),
            pending: 0,
            committed: 0,
            highest: None,
            queued: false,
            condensed_upto: HashMap::new(),
            tombstones: Vec::new(),
            header: None,
            seen: HashMap::new(),
            references: Vec::new(),
        }
    }

    /// Lines made durable so far (header excluded).
    pub fn committed(&self) -> u64 {
        self.committed
    }

    /// Checks line `number` of the file and queues its writes; commits a batch when one is
    /// full. Nothing of a line that fails its checks is written.
    pub fn add(&mut self, line: Line, number: u64) -> Result<Outcome, ImportError> {
        let Some(header) = &self.header else {
            let Line::Header(h) = line else {
                return Err(ImportError::Line(Error::invalid(
                    "header",
                    format!(
                        "is missing: an export starts with a header line \
                         ({{\"format\":{FORMAT},\"header\":{{\"embedder\":…}}}}) naming the \
                         embedder and the ids in use. Files written before exports had one \
                         cannot be imported; export the source again with this build"
                    ),
                )));
            };
            self.check_header(&h).map_err(ImportError::Line)?;
            if let Some(last) = h.next_id.checked_sub(1) {
                self.sub
                    .store()
                    .reserve_ids_through(MemoryId(last))
                    .map_err(ImportError::Store)?;
            }
            if let Some(last) = h.next_recall.checked_sub(1) {
                self.sub
                    .store()
                    .reserve_recalls_through(last)
                    .map_err(ImportError::Store)?;
            }
            self.header = Some(h);
            return Ok(Outcome::Header);
        };
        let (kind, id, line_ns) = match &line {
            Line::Record(e) => (0u8, e.record.id.0, &e.record.namespace),
            Line::Purged(p) => (0, p.id.0, &p.namespace),
            Line::Quarantine { entry, .. } => (1, entry.id.0, &entry.namespace),
            Line::Recall(r) => (
                2,
                recall_number(&r.id).map_err(ImportError::Line)?,
                &r.namespace,
            ),
            Line::Header(_) => return Err(second_header()),
        };
        let (bound, bound_name, shown) = if kind == 2 {
            (header.next_recall, "next_recall", recall_id(id))
        } else {
            (header.next_id, "next_id", MemoryId(id).to_string())
        };
        if id >= bound {
            return Err(ImportError::Line(Error::invalid(
                "id",
                format!(
                    "{shown} is not below the header's {bound_name} ({bound}), so the source \
                     never handed it out; the file was edited or is damaged. Export the \
                     source again"
                ),
            )));
        }
        if let Some(ns) = &header.namespace
            && line_ns != ns
        {
            return Err(ImportError::Line(Error::invalid(
                "namespace",
                format!(
                    "is `{line_ns}`, but the header says this is an export of namespace \
                     `{ns}` only; the file was edited or two exports were mixed"
                ),
            )));
        }
        if let Some(first) = self.seen.insert((kind, id), number) {
            let what = match kind {
                0 => MemoryId(id).to_string(),
                1 => format!("the quarantine entry of {}", MemoryId(id)),
                _ => recall_id(id),
            };
            return Err(ImportError::Line(Error::invalid(
                "id",
                format!(
                    "{what} is also on line {first}; an export lists each once, so the file \
                     was edited or two exports were mixed. Keep one of the two lines"
                ),
            )));
        }
        let outcome = match line {
            Line::Record(e) => self.add_record(*e)?,
            Line::Purged(p) => self.add_purged(p)?,
            Line::Quarantine { entry, history } => self.add_quarantine(entry, history)?,
            Line::Recall(r) => self.add_recall(r, id)?,
            Line::Header(_) => return Err(second_header()),
        };
        if outcome == Outcome::Imported {
            // Recall numbers are reserved by the header alone; they are not record ids.
            if kind != 2 {
                self.highest = self.highest.max(Some(MemoryId(id)));
            }
            self.pending += 1;
            if self.pending >= BATCH {
                self.flush()?;
            }
        }
        Ok(outcome)
    }

    fn check_header(&self, h: &Header) -> Result<()> {
        let embedder = self.sub.embedder();
        if let Some(name) = &h.embedder
            && name != embedder.name()
        {
            return Err(Error::invalid(
                "header.embedder",
                format!(
                    "the export's embeddings were made by `{name}`, but this data directory's \
                     embedder is `{}`, and vectors of different models cannot be compared; \
                     import into a fresh data directory with a --config whose [embedder] is \
                     `{name}` (as the source's), then run `shadowbrain reindex` with the new \
                     embedder's config there to re-embed every record",
                    embedder.name()
                ),
            ));
        }
        if let Some(d) = h.dimension
            && d != embedder.dimensions()
        {
            return Err(Error::invalid(
                "header.dimension",
                format!(
                    "the export's embeddings have {d} dimensions, but this data directory's \
                     embedder (`{}`) makes {}; import with the --config whose [embedder] made \
                     the export, then `shadowbrain reindex` to change embedders",
                    embedder.name(),
                    embedder.dimensions()
                ),
            ));
        }
        if let Some(ns) = &h.namespace {
            validate_id("header.namespace", ns)?;
        }
        Ok(())
    }

    fn add_record(&mut self, mut line: Exported) -> Result<Outcome, ImportError> {
        self.check(&line).map_err(ImportError::Line)?;
        let id = line.record.id;
        // A record without its embedding waits for the enricher, like any new record —
        // unless the source set it aside because embedding it kept failing.
        let quarantined = line
            .history
            .iter()
            .any(|e| e.action == AuditAction::Quarantined);
        // A long record's passages are not in the export (they follow from its text and
        // the embedder): embed it again, passage by passage, as when it was first written.
        if is_long(&line.record.text) && !quarantined {
            line.record.embedding = None;
        }
        if line.record.embedding.is_none()
            && !quarantined
            && !line.waiting.contains(&Waiting::Enrich)
        {
            line.waiting.push(Waiting::Enrich);
        }
        // The cheap look first: most lines of an import are new.
        let present = self
            .sub
            .store()
            .get_light(id)
            .map_err(ImportError::Store)?
            .is_some();
        if present
            && let Some(existing) =
                export_record(self.sub.store(), id).map_err(ImportError::Store)?
        {
            return if !same_record(&existing.record, &line.record) {
                Err(ImportError::Line(Error::invalid(
                    "record.id",
                    format!(
                        "{id} is already used in this data directory by another record \
                         (namespace `{}`, session `{}`, {} {}); import into an empty data \
                         directory",
                        existing.record.namespace,
                        existing.record.session_id,
                        existing.record.tier.as_str(),
                        existing.record.kind
                    ),
                )))
            } else if existing == line {
                Ok(Outcome::AlreadyPresent)
            } else {
                Ok(Outcome::Different(id.to_string()))
            };
        }
        self.refuse_if_taken(id, "record.id")?;
        let r = &line.record;
        for s in &r.sources {
            self.references.push((id, "sources", *s));
        }
        for l in &line.links {
            self.references.push((id, "links", l.to));
        }
        if let Some(k) = line.promoted_into {
            self.references.push((id, "promoted_into", k));
        }
        let v = &line.validity;
        for (field, other) in (v
            .superseded_by
            .iter()
            .map(|o| ("validity.superseded_by", *o)))
        .chain(v.conflicts.iter().map(|o| ("validity.conflicts", *o)))
        .chain(v.duplicate_of.iter().map(|o| ("validity.duplicate_of", *o)))
        {
            self.references.push((id, field, other));
        }
        self.push(line).map_err(ImportError::Store)?;
        Ok(Outcome::Imported)
    }

    /// Refuses an id that the store uses for something other than a record (a purged
    /// record, a quarantined input). Recall numbers are counted apart and cannot clash.
    fn refuse_if_taken(&self, id: MemoryId, field: &str) -> Result<(), ImportError> {
        let store = self.sub.store();
        let taken = if store.tombstone(id).map_err(ImportError::Store)?.is_some() {
            Some("a purged record")
        } else if store
            .quarantine_entry(id)
            .map_err(ImportError::Store)?
            .is_some()
        {
            Some("a quarantined input")
        } else {
            None
        };
        match taken {
            Some(what) => Err(ImportError::Line(Error::invalid(
                field,
                format!(
                    "{id} is already used in this data directory by {what}; import into an \
                     empty data directory"
                ),
            ))),
            None => Ok(()),
        }
    }

    fn check(&self, line: &Exported) -> Result<()> {
        let r = &line.record;
        validate_id("record.namespace", &r.namespace)?;
        validate_id("record.session_id", &r.session_id)?;
        if let Some(a) = &r.agent_id {
            validate_id("record.agent_id", a)?;
        }
        if r.text.trim().is_empty() {
            return Err(Error::invalid(
                "record.text",
                "is empty; every record needs the text it is recalled by",
            ));
        }
        // The limits the importing directory applies to new events (its config's
        // `[limits]`): an import must not bring in what `record` would refuse.
        let limits = self.sub.limits();
        let json_len = |v: &Value| match v {
            Value::Null => 0,
            v => serde_json::to_vec(v).map(|b| b.len()).unwrap_or(usize::MAX),
        };
        for (field, size, limit) in [
            ("record.text", r.text.len(), limits.max_text_bytes),
            (
                "record.content",
                json_len(&r.content),
                limits.max_content_bytes,
            ),
            (
                "record.metadata",
                json_len(&r.metadata),
                limits.max_metadata_bytes,
            ),
        ] {
            if size > limit {
                return Err(Error::TooLarge {
                    field: field.into(),
                    size,
                    limit,
                    hint: "raise the limit in the [limits] section of the --config file, or \
                           shorten the field in the file"
                        .into(),
                });
            }
        }
        if !(r.importance.is_finite() && (0.0..=10.0).contains(&r.importance)) {
            return Err(Error::invalid(
                "record.importance",
                format!(
                    "{} is out of range; it must be a number from 0 to 10",
                    r.importance
                ),
            ));
        }
        if !(r.strength.is_finite() && r.strength >= 0.0) {
            return Err(Error::invalid(
                "record.strength",
                format!(
                    "{} is not a strength; it must be a finite number ≥ 0",
                    r.strength
                ),
            ));
        }
        if let Some(e) = &r.embedding {
            let dims = self.sub.embedder().dimensions();
            validate_embedding(e, Some(dims)).map_err(|err| match err {
                Error::DimensionMismatch { got, expected } => Error::invalid(
                    "record.embedding",
                    format!(
                        "has {got} dimensions but this data directory's embedder (`{}`) makes \
                         {expected}; import with the `--config` whose [embedder] made the \
                         export, then `shadowbrain reindex` to change embedders",
                        self.sub.embedder().name()
                    ),
                ),
                Error::Invalid { reason, .. } => Error::invalid("record.embedding", reason),
                other => other,
            })?;
        }
        Ok(())
    }

    fn add_purged(&mut self, p: Purged) -> Result<Outcome, ImportError> {
        validate_id("purged.namespace", &p.namespace).map_err(ImportError::Line)?;
        let store = self.sub.store();
        if let Some(r) = store.get_light(p.id).map_err(ImportError::Store)? {
            return Err(ImportError::Line(Error::invalid(
                "purged.id",
                format!(
                    "{} is a live record in this data directory (namespace `{}`), not a \
                     purged one; import into an empty data directory",
                    p.id, r.namespace
                ),
            )));
        }
        let history = store.history(p.id).map_err(ImportError::Store)?;
        let tombstone = store.tombstone(p.id).map_err(ImportError::Store)?;
        match tombstone {
            Some(ns) if ns != p.namespace => {
                return Err(ImportError::Line(Error::invalid(
                    "purged.id",
                    format!(
                        "{} was purged from namespace `{ns}` in this data directory, not from \
                         `{}`; import into an empty data directory",
                        p.id, p.namespace
                    ),
                )));
            }
            Some(_)
                if history == p.history
                    && links_from(store, &p.namespace, p.id).map_err(ImportError::Store)?
                        == p.links =>
            {
                return Ok(Outcome::AlreadyPresent);
            }
            Some(_) => return Ok(Outcome::Different(p.id.to_string())),
            // An import interrupted between the history and the tombstone: finish it.
            None if !history.is_empty() && history == p.history => {
                self.tombstones.push((p.id, p.namespace));
                return Ok(Outcome::Imported);
            }
            None if !history.is_empty() => {
                return Err(ImportError::Line(Error::invalid(
                    "purged.id",
                    format!(
                        "{} already has another audit history in this data directory; \
                         import into an empty data directory",
                        p.id
                    ),
                )));
            }
            None => {}
        }
        self.refuse_if_taken(p.id, "purged.id")?;
        for entry in p.history {
            self.writes.push(Mutation::Audit(p.id, entry));
        }
        for link in p.links {
            self.writes.push(edge(&p.namespace, p.id, link));
        }
        self.tombstones.push((p.id, p.namespace));
        Ok(Outcome::Imported)
    }

    fn add_quarantine(
        &mut self,
        entry: QuarantineEntry,
        history: Vec<AuditEntry>,
    ) -> Result<Outcome, ImportError> {
        validate_id("quarantine.namespace", &entry.namespace).map_err(ImportError::Line)?;
        let present = self
            .sub
            .store()
            .quarantine_entry(entry.id)
            .map_err(ImportError::Store)?;
        if let Some(existing) = present {
            return Ok(if existing == entry {
                Outcome::AlreadyPresent
            } else {
                Outcome::Different(format!("quarantine of {}", entry.id))
            });
        }
        if !history.is_empty() {
            // An input that never became a record: its id is its own.
            let store = self.sub.store();
            if store.owner(entry.id).map_err(ImportError::Store)?.is_some()
                || store
                    .recall(entry.id.0)
                    .map_err(ImportError::Store)?
                    .is_some()
            {
                return Err(ImportError::Line(Error::invalid(
                    "quarantine.id",
                    format!(
                        "{} is already used in this data directory by something else; import \
                         into an empty data directory",
                        entry.id
                    ),
                )));
            }
            for e in history {
                self.writes.push(Mutation::Audit(entry.id, e));
            }
        }
        self.writes.push(Mutation::Quarantine(Box::new(entry)));
        Ok(Outcome::Imported)
    }

    fn add_recall(&mut self, r: RecallLog, n: u32) -> Result<Outcome, ImportError> {
        validate_id("recall.namespace", &r.namespace).map_err(ImportError::Line)?;
        validate_id("recall.session", &r.session).map_err(ImportError::Line)?;
        let stored = RememberedRecall {
            namespace: r.namespace,
            session: r.session,
            at: r.at,
            ids: r.ids,
        };
        if let Some(existing) = self.sub.store().recall(n).map_err(ImportError::Store)? {
            return Ok(if existing == stored {
                Outcome::AlreadyPresent
            } else {
                Outcome::Different(r.id)
            });
        }
        self.writes.push(Mutation::RememberRecall(n, stored));
        for success in std::iter::repeat_n(true, r.successes as usize)
            .chain(std::iter::repeat_n(false, r.failures as usize))
        {
            self.writes
                .push(Mutation::RecallOutcome { recall: n, success });
        }
        Ok(Outcome::Imported)
    }

    fn push(&mut self, line: Exported) -> Result<()> {
        let Exported {
            record,
            history,
            links,
            promoted_into,
            validity,
            waiting,
            ..
        } = line;
        let id = record.id;
        for entry in history {
            self.writes.push(Mutation::Audit(id, entry));
        }
        for link in links {
            self.writes.push(edge(&record.namespace, id, link));
        }
        if let Some(knowledge) = promoted_into {
            self.writes.push(Mutation::MarkPromoted {
                condensed: id,
                knowledge,
            });
        }
        for w in waiting {
            self.queued |= w == Waiting::Enrich;
            self.writes.push(Mutation::Enqueue(w.queue(), id));
        }
        if record.tier == Tier::Condensed
            && let Some(upto) = record.sources.iter().copied().max()
        {
            let key = (record.namespace.clone(), record.session_id.clone());
            let current = match self.condensed_upto.get(&key) {
                Some(v) => Some(*v),
                None => self.sub.store().condensed_upto(&key.0, &key.1)?,
            };
            if current.is_none_or(|c| c < upto) {
                self.condensed_upto.insert(key, upto);
            }
        }
        self.writes.push(Mutation::Insert(Box::new(record)));
        // After the insert: a validity change applies to a record that exists.
        for change in validity_changes(&validity) {
            self.writes.push(Mutation::Validity(id, change));
        }
        Ok(())
    }

    /// Commits what was added since the last flush and returns once it is durable; the
    /// indexes then follow in a bounded pass, as under ingest.
    pub fn flush(&mut self) -> Result<(), ImportError> {
        self.flush_inner().map_err(ImportError::Store)
    }

    fn flush_inner(&mut self) -> Result<()> {
        if self.writes.is_empty() && self.tombstones.is_empty() {
            return Ok(());
        }
        if let Some(h) = self.highest.take() {
            self.sub.store().reserve_ids_through(h)?;
        }
        let mut writes = std::mem::take(&mut self.writes);
        for ((namespace, session), upto) in self.condensed_upto.drain() {
            writes.push(Mutation::SetCondensedUpto {
                namespace,
                session,
                upto,
            });
        }
        self.sub.store().write(writes)?;
        // After the history they guard is durable: an interruption in between leaves a
        // history without its tombstone, which the next run of the import completes.
        for (id, ns) in std::mem::take(&mut self.tombstones) {
            self.sub.store().restore_tombstone(id, &ns)?;
        }
        self.committed += std::mem::take(&mut self.pending) as u64;
        self.sub.after_write(std::mem::take(&mut self.queued));
        self.sub.index_pass(false)?;
        Ok(())
    }

    /// Flushes, then checks every reference the imported lines made (`sources`, `links`,
    /// `promoted_into`) against the store: each must name a record, live or purged, of the
    /// same namespace. Returns the ones that do not, in file order; the records are
    /// imported either way.
    pub fn finish(mut self) -> Result<Vec<Dangling>, ImportError> {
        self.flush()?;
        if self.header.is_none() {
            return Err(ImportError::Line(Error::invalid(
                "file",
                "is empty; an export has at least its header line. Check the file name, or \
                 that the export finished",
            )));
        }
        let store = self.sub.store();
        let mut owners: HashMap<MemoryId, Option<String>> = HashMap::new();
        let mut owner = |id: MemoryId| -> Result<Option<String>> {
            if let Some(o) = owners.get(&id) {
                return Ok(o.clone());
            }
            let o = store.owner(id)?;
            owners.insert(id, o.clone());
            Ok(o)
        };
        let mut dangling = Vec::new();
        let mut reported = HashSet::new();
        for (from, field, to) in std::mem::take(&mut self.references) {
            let from_ns = owner(from).map_err(ImportError::Store)?;
            if owner(to).map_err(ImportError::Store)? != from_ns && reported.insert((from, to)) {
                dangling.push(Dangling { from, field, to });
            }
        }
        Ok(dangling)
    }
}

fn second_header() -> ImportError {
    ImportError::Line(Error::invalid(
        "header",
        "appears a second time; an export has one header, on its first line (were two \
         exports concatenated? import them one by one)",
    ))
}

/// The number in a recall id (`rcl-` and 8 hex digits).
fn recall_number(id: &str) -> Result<u32> {
    crate::engine::recall_number(id).ok_or_else(|| {
        Error::invalid(
            "recall.id",
            format!("`{id}` is not a recall id; recall ids are `rcl-` and 8 hex digits"),
        )
    })
}

/// Whether two records with one id are the same record (later reinforcement, decay or
/// feedback may have changed the rest).
fn same_record(a: &MemoryRecord, b: &MemoryRecord) -> bool {
    a.namespace == b.namespace
        && a.session_id == b.session_id
        && a.tier == b.tier
        && a.kind == b.kind
        && a.text == b.text
        && a.event_time == b.event_time
        && a.recorded_time == b.recorded_time
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{FeedbackTarget, Outcome as Feedback};
    use crate::engine::{RecallRequest, SubstrateOptions};
    use crate::model::NewMemory;
    use crate::store::Strikes;

    fn export_all(store: &Store) -> Vec<String> {
        let mut lines = vec![
            Line::Header(export_header(store, None).unwrap())
                .to_json()
                .unwrap(),
        ];
        for id in export_ids(store, None).unwrap() {
            if let Some(e) = export_record(store, id).unwrap() {
                lines.push(Line::Record(Box::new(e)).to_json().unwrap());
            }
        }
        for extra in export_extras(store, None).unwrap() {
            if let Some(l) = export_extra(store, extra).unwrap() {
                lines.push(l.to_json().unwrap());
            }
        }
        lines
    }

    /// Imports `lines` (numbered from 1) and finishes; the outcomes and dangling references.
    fn import_all(sub: &Substrate, lines: &[String]) -> (Vec<Outcome>, Vec<Dangling>) {
        let mut importer = Importer::new(sub);
        let outcomes = lines
            .iter()
            .zip(1..)
            .map(|(l, n)| importer.add(parse_line(l).unwrap(), n).unwrap())
            .collect();
        (outcomes, importer.finish().unwrap())
    }

    fn import_err(sub: &Substrate, lines: &[String]) -> String {
        let mut importer = Importer::new(sub);
        for (l, n) in lines.iter().zip(1..) {
            if let Err(e) = parse_line(l)
                .map_err(ImportError::Line)
                .and_then(|l| importer.add(l, n))
            {
                importer.flush().unwrap();
                return e.to_string();
            }
        }
        panic!("every line was accepted")
    }

    #[tokio::test]
    async fn an_imported_long_record_gets_its_passages_back() {
        let dir = tempfile::tempdir().unwrap();
        let a = Substrate::open(&dir.path().join("a"), SubstrateOptions::default()).unwrap();
        let text = "The rollout of the new billing service went through four stages. ".repeat(60);
        let id = a
            .record("default", "s1", vec![NewMemory::new("observation", &text)])
            .await
            .unwrap()[0];
        let passages = a.store().passages(id).unwrap();
        assert!(passages.len() > 3, "{} passages", passages.len());
        a.close().unwrap();
        let lines = export_all(a.store());
        let b = Substrate::open(&dir.path().join("b"), SubstrateOptions::default()).unwrap();
        import_all(&b, &lines);
        while b.enrich_pending(16).await.unwrap() > 0 {}
        assert_eq!(b.store().passages(id).unwrap(), passages);
        assert_eq!(b.store().get(id).unwrap().unwrap().text, text);
    }

    #[tokio::test]
    async fn validity_and_the_updates_queue_survive_a_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let opts = || SubstrateOptions {
            policy: crate::policy::Policy::from_toml("<test>", "[updates]\nmode = \"rules\"\n")
                .unwrap(),
            // No background pass: nothing is embedded, so detection cannot change the
            // validity written below, and every record stays queued for it.
            indexing: crate::engine::IndexingOptions {
                background: false,
                ..Default::default()
            },
            ..SubstrateOptions::default()
        };
        let a = Substrate::open(&dir.path().join("a"), opts()).unwrap();
        let texts = [
            "the runner is in eu-1",
            "the runner moved to eu-2",
            "tabs, not spaces",
        ];
        let mut ids = Vec::new();
        for text in texts {
            ids.extend(
                a.record("default", "s1", vec![NewMemory::new("observation", text)])
                    .await
                    .unwrap(),
            );
        }
        // Written by hand, so the test does not depend on what the rules find: one
        // supersession, one open conflict both ways, one repeat.
        let store = a.store();
        let now = 1_780_000_000_000;
        store
            .write(WriteSet(vec![
                Mutation::Validity(
                    ids[0],
                    ValidityChange::SupersededBy {
                        by: ids[1],
                        until: now - 5,
                        at: now,
                    },
                ),
                Mutation::Validity(
                    ids[1],
                    ValidityChange::Conflict {
                        with: ids[2],
                        open: true,
                    },
                ),
                Mutation::Validity(
                    ids[2],
                    ValidityChange::Conflict {
                        with: ids[1],
                        open: true,
                    },
                ),
                Mutation::Validity(ids[2], ValidityChange::DuplicateOf(ids[0])),
            ]))
            .unwrap();
        let before: Vec<Validity> = ids.iter().map(|i| store.validity(*i).unwrap()).collect();
        assert!(before[0].superseded() && before[2].duplicate_of.is_some());
        let lines = export_all(store);
        assert!(
            lines.iter().any(|l| l.contains("\"validity\"")),
            "validity is exported"
        );
        let b = Substrate::open(&dir.path().join("b"), opts()).unwrap();
        let (_, dangling) = import_all(&b, &lines);
        assert!(dangling.is_empty(), "{dangling:?}");
        let after: Vec<Validity> = ids
            .iter()
            .map(|i| b.store().validity(*i).unwrap())
            .collect();
        assert_eq!(after, before);
        let all: roaring::RoaringBitmap = ids.iter().map(|i| i.0).collect();
        assert_eq!(b.store().superseded(&all), a.store().superseded(&all));
        assert_eq!(b.store().conflicted(&all).len(), 2);
        for id in &ids {
            assert!(b.store().is_queued(Queue::Updates, *id).unwrap());
        }
        assert_eq!(export_all(b.store()), lines, "the same bytes again");
    }

    #[tokio::test]
    async fn a_round_trip_keeps_every_byte_and_recall_and_feedback_work() {
        let dir = tempfile::tempdir().unwrap();
        let a = Substrate::open(&dir.path().join("a"), SubstrateOptions::default()).unwrap();
        let ids = a
            .record(
                "default",
                "s1",
                vec![
                    NewMemory::new("goal", "ship the quarterly report"),
                    NewMemory {
                        metadata: Some(serde_json::json!({"tool": "grep", "n": 1.5})),
                        ..NewMemory::new("observation", "the nightly backup job timed out")
                    },
                    NewMemory::new("thought", "a passing thought to purge"),
                ],
            )
            .await
            .unwrap();
        a.archive("default", ids[0], "test").unwrap();
        a.link(
            "default",
            crate::model::Edge {
                from: ids[1],
                to: ids[0],
                relation: Relation::Contradicts,
            },
            "test",
        )
        .unwrap();
        a.link(
            "default",
            crate::model::Edge {
                from: ids[2],
                to: ids[1],
                relation: Relation::SimilarTo,
            },
            "test",
        )
        .unwrap();
        a.purge("default", ids[2], "test").unwrap();
        let quarantined = a
            .quarantine_input("default", "s1", "session", "boom", 3, "[{}]".into())
            .await
            .unwrap()
            .id;
        let recall = a
            .recall(&RecallRequest::new("default", "s1", "backup job"))
            .await
            .unwrap()
            .recall_id
            .unwrap();
        // How that recall went travels with it (it counts toward "in successful recalls").
        a.feedback(
            "default",
            &FeedbackTarget::Recall(recall.clone()),
            Feedback::Success,
            "test",
        )
        .await
        .unwrap();
        a.close().unwrap();
        let first = export_all(a.store());
        let next_id = a.store().next_id();
        let next_recall = a.store().next_recall();
        assert_eq!(first.len(), 1 + 2 + 3, "{first:#?}");
        assert!(
            first[0].starts_with(r#"{"format":1,"header":{"dimension":384,"embedder":"hash","#),
            "{}",
            first[0]
        );
        assert!(first[1].contains("\"status\":\"archived\""), "{}", first[1]);
        assert!(
            first[2].contains("\"relation\":\"contradicts\""),
            "{}",
            first[2]
        );
        assert!(
            first[3].contains("\"purged\"") && first[3].contains("\"similar_to\""),
            "{}",
            first[3]
        );
        assert!(first[4].contains("\"quarantine\"") && first[4].contains("\"history\""));
        assert!(
            first[5].contains(&format!("\"id\":\"{recall}\""))
                && first[5].contains("\"successes\":1"),
            "{}",
            first[5]
        );
        drop(a);

        let b = Substrate::open(&dir.path().join("b"), SubstrateOptions::default()).unwrap();
        let (outcomes, dangling) = import_all(&b, &first);
        assert_eq!(outcomes[0], Outcome::Header);
        assert!(
            outcomes[1..].iter().all(|o| *o == Outcome::Imported),
            "{outcomes:?}"
        );
        assert_eq!(dangling, []);
        // Again: already there, nothing written twice.
        let (outcomes, _) = import_all(&b, &first);
        assert!(
            outcomes[1..].iter().all(|o| *o == Outcome::AlreadyPresent),
            "{outcomes:?}"
        );
        assert_eq!(export_all(b.store()), first);
        // Session statistics are rebuilt from the records: the purged one is not counted.
        assert_eq!(
            b.store()
                .session_stats("default", "s1")
                .unwrap()
                .unwrap()
                .events,
            2
        );
        // The purged record's and the quarantined input's histories stay in their namespace.
        assert!(b.history("default", ids[2]).unwrap().len() >= 2);
        assert!(b.history("acme", ids[2]).is_err());
        assert_eq!(b.history("default", quarantined).unwrap().len(), 1);
        assert!(b.quarantine_entry(quarantined).unwrap().is_some());
        // Feedback on a recall id given before the move still names that recall.
        let report = b
            .feedback(
                "default",
                &FeedbackTarget::Recall(recall.clone()),
                Feedback::Success,
                "test",
            )
            .await
            .unwrap();
        assert!(report.updated >= 1, "{report:?}");
        // New ids never reuse an id the source handed out, the recall's included.
        let fresh = b
            .record("default", "s1", vec![NewMemory::new("thought", "later")])
            .await
            .unwrap()[0];
        assert!(fresh.0 >= next_id, "{fresh} reuses an id below {next_id}");
        let res = b
            .recall(&RecallRequest::new("default", "s1", "backup job timed out"))
            .await
            .unwrap();
        assert_eq!(res.memories.first().map(|m| m.record.id), Some(ids[1]));
        let new_recall = res.recall_id.unwrap();
        assert!(
            new_recall.as_str() >= format!("rcl-{next_recall:08x}").as_str(),
            "{new_recall} reuses a recall number below {next_recall}"
        );
        assert_ne!(new_recall, recall);
        b.close().unwrap();
    }

    #[tokio::test]
    async fn a_newer_export_is_reported_as_different_and_nothing_is_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let a = Substrate::open(&dir.path().join("a"), SubstrateOptions::default()).unwrap();
        let id = a
            .record("default", "s", vec![NewMemory::new("goal", "keep it")])
            .await
            .unwrap()[0];
        let old = export_all(a.store());
        a.feedback(
            "default",
            &FeedbackTarget::Memories(vec![id]),
            Feedback::Success,
            "test",
        )
        .await
        .unwrap();
        a.close().unwrap();
        let newer = export_all(a.store());
        assert_ne!(old, newer);
        let b = Substrate::open(&dir.path().join("b"), SubstrateOptions::default()).unwrap();
        import_all(&b, &old);
        let (outcomes, _) = import_all(&b, &newer);
        assert_eq!(outcomes[1], Outcome::Different(id.to_string()));
        assert_eq!(export_all(b.store()), old, "the store's version is kept");
        b.close().unwrap();
    }

    #[tokio::test]
    async fn a_quarantined_record_is_not_queued_again() {
        let dir = tempfile::tempdir().unwrap();
        let a = Substrate::open(&dir.path().join("a"), SubstrateOptions::default()).unwrap();
        let id = a
            .record("default", "s", vec![NewMemory::new("goal", "poison")])
            .await
            .unwrap()[0];
        // As if embedding it kept failing: no embedding, off the queue, quarantined.
        let mut r = a.store().get(id).unwrap().unwrap();
        r.embedding = None;
        let strikes = Strikes {
            count: 3,
            actor: "enricher".into(),
            last_error: "boom".into(),
        };
        a.quarantine_record(
            "default",
            id,
            "enricher",
            &strikes,
            vec![Mutation::Dequeue(Queue::Enrich, id)],
        )
        .await
        .unwrap();
        a.close().unwrap();
        let mut lines = export_all(a.store());
        let mut v: Value = serde_json::from_str(&lines[1]).unwrap();
        v["record"]["embedding"] = Value::Null;
        lines[1] = v.to_string();
        let b = Substrate::open(&dir.path().join("b"), SubstrateOptions::default()).unwrap();
        import_all(&b, &lines);
        assert!(!b.store().is_queued(Queue::Enrich, id).unwrap());
        assert!(b.quarantine_entry(id).unwrap().is_some());
        b.close().unwrap();
    }

    #[tokio::test]
    async fn bad_lines_are_refused_with_the_field() {
        let dir = tempfile::tempdir().unwrap();
        let sub = Substrate::open(dir.path(), SubstrateOptions::default()).unwrap();
        let id = sub
            .record("default", "s", vec![NewMemory::new("goal", "keep it")])
            .await
            .unwrap()[0];
        let lines = export_all(sub.store());
        let header = lines[0].clone();
        let good: Value = serde_json::from_str(&lines[1]).unwrap();
        let edit = |f: &dyn Fn(&mut Value)| {
            let mut v = good.clone();
            v["record"]["id"] = serde_json::json!("mem-00000000");
            f(&mut v);
            v.to_string()
        };
        let header_with = |f: &dyn Fn(&mut Value)| {
            let mut v: Value = serde_json::from_str(&header).unwrap();
            f(&mut v);
            v.to_string()
        };
        let cases: Vec<(Vec<String>, &str)> = vec![
            (vec![lines[1].clone()], "header: is missing"),
            (vec![r#"{"record": {}}"#.into()], "format: is missing"),
            (vec![r#"{"format": 99, "record": {}}"#.into()], "format 1"),
            (
                vec![r#"{"format": "1", "record": {}}"#.into()],
                "not a number",
            ),
            (
                vec![
                    header_with(&|v| v["header"]["embedder"] = "openai:small".into()),
                    lines[1].clone(),
                ],
                "shadowbrain reindex",
            ),
            (
                vec![header_with(&|v| v["header"]["dimension"] = 128.into())],
                "128 dimensions",
            ),
            (vec![header.clone(), header.clone()], "second time"),
            (
                vec![
                    header.clone(),
                    edit(&|v| v["record"]["importance"] = 12.0.into()),
                ],
                "0 to 10",
            ),
            (
                vec![
                    header.clone(),
                    edit(&|v| v["record"]["embedding"] = serde_json::json!([0.5, 0.5])),
                ],
                "2 dimensions",
            ),
            (
                vec![
                    header.clone(),
                    edit(&|v| v["record"]["text"] = "x".repeat((1 << 20) + 1).into()),
                ],
                "record.text is too large",
            ),
            (
                vec![
                    header.clone(),
                    edit(&|v| v["record"]["surprise"] = 1.into()),
                ],
                "record: has an unknown field `surprise`",
            ),
            (
                vec![
                    header.clone(),
                    edit(&|v| v["record"]["utility"]["wins"] = 1.into()),
                ],
                "record.utility: has an unknown field `wins`",
            ),
            (
                vec![header.clone(), edit(&|v| v["surprise"] = 1.into())],
                "surprise",
            ),
            (
                vec![header.clone(), lines[1].clone(), lines[1].clone()],
                "also on line 2",
            ),
            (
                vec![
                    header.clone(),
                    edit(&|v| v["record"]["id"] = "mem-000000ff".into()),
                ],
                "not below the header's next_id",
            ),
        ];
        for (lines, needle) in cases {
            let err = import_err(&sub, &lines);
            assert!(err.contains(needle), "{lines:?}: {err}");
        }
        // Another record under a used id is refused.
        let fresh = Substrate::open(&dir.path().join("b"), SubstrateOptions::default()).unwrap();
        drop(fresh);
        let other = {
            let mut v = good.clone();
            v["record"]["text"] = "another text".into();
            v.to_string()
        };
        assert!(import_err(&sub, &[header.clone(), other]).contains("already used"));
        assert!(
            parse_line("{not json")
                .unwrap_err()
                .to_string()
                .contains("not JSON")
        );
        assert_eq!(sub.store().len(), 1);
        assert!(sub.store().get(id).unwrap().is_some());
        sub.close().unwrap();
    }

    #[tokio::test]
    async fn references_to_records_missing_from_file_and_store_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        let a = Substrate::open(&dir.path().join("a"), SubstrateOptions::default()).unwrap();
        let ids = a
            .record(
                "default",
                "s",
                vec![NewMemory::new("goal", "one"), NewMemory::new("goal", "two")],
            )
            .await
            .unwrap();
        a.link(
            "default",
            crate::model::Edge {
                from: ids[1],
                to: ids[0],
                relation: Relation::SimilarTo,
            },
            "test",
        )
        .unwrap();
        a.close().unwrap();
        let lines = export_all(a.store());
        let b = Substrate::open(&dir.path().join("b"), SubstrateOptions::default()).unwrap();
        // The first record left out: the link from the second dangles.
        let (_, dangling) = import_all(&b, &[lines[0].clone(), lines[2].clone()]);
        assert_eq!(
            dangling,
            [Dangling {
                from: ids[1],
                field: "links",
                to: ids[0]
            }]
        );
        b.close().unwrap();
    }
}
