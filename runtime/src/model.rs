//! The memory model: what a record is, the vocabulary around it (tier, status, kind, utility),
//! the audit entry, and the validation every incoming event goes through. Pure data and
//! checks — nothing here touches storage.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::clock::Timestamp;
use crate::error::{Error, Result};

/// The stable id of a memory record, shown as `mem-` and 8 hex digits (`mem-0000002a`).
///
/// The number is also the record's item id in the vector index and the keyword index, and
/// ids grow in write order, so big-endian keys built from it sort by age.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MemoryId(pub u32);

impl MemoryId {
    /// The prefix of every printed id.
    pub const PREFIX: &'static str = "mem-";
}

impl fmt::Display for MemoryId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{:08x}", Self::PREFIX, self.0)
    }
}

impl FromStr for MemoryId {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let hex = s
            .strip_prefix(Self::PREFIX)
            .filter(|h| h.len() == 8 && h.bytes().all(|b| b.is_ascii_hexdigit()));
        match hex.and_then(|h| u32::from_str_radix(h, 16).ok()) {
            Some(n) => Ok(MemoryId(n)),
            None => Err(Error::invalid(
                "memory id",
                format!(
                    "`{s}` is not a memory id; ids look like `mem-0000002a` (as returned by record)"
                ),
            )),
        }
    }
}

impl Serialize for MemoryId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if s.is_human_readable() {
            s.collect_str(self)
        } else {
            s.serialize_u32(self.0)
        }
    }
}

impl<'de> Deserialize<'de> for MemoryId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        if d.is_human_readable() {
            let s = String::deserialize(d)?;
            s.parse().map_err(serde::de::Error::custom)
        } else {
            u32::deserialize(d).map(MemoryId)
        }
    }
}

/// Which layer of memory a record belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Tier {
    /// Made from one event: raw memory.
    Episodic,
    /// Made by condensing a window of a session's records.
    Condensed,
    /// Promoted into the namespace-wide knowledge pool.
    Knowledge,
}

impl Tier {
    /// All tiers, in order.
    pub const ALL: [Tier; 3] = [Tier::Episodic, Tier::Condensed, Tier::Knowledge];

    /// The lower-case name used in JSON and in rendered context.
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Episodic => "episodic",
            Tier::Condensed => "condensed",
            Tier::Knowledge => "knowledge",
        }
    }
}

/// Lifecycle state of a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Normal: recalled, decays.
    Active,
    /// Recalled, never decays.
    Pinned,
    /// Kept for history, never recalled.
    Obsolete,
    /// Forgotten (soft-deleted): never recalled, recoverable until purged.
    Archived,
    /// Judged wrong by a person or a client (with the reason in its history): never
    /// recalled, kept for the record, and counted once as a failure in its utility. Last
    /// so that the stored bytes of the other statuses are those of format 1.
    Wrong,
}

impl Status {
    /// All statuses, in order.
    pub const ALL: [Status; 5] = [
        Status::Active,
        Status::Pinned,
        Status::Obsolete,
        Status::Archived,
        Status::Wrong,
    ];

    /// Whether recall may return a record in this status.
    pub fn recallable(self) -> bool {
        matches!(self, Status::Active | Status::Pinned)
    }

    /// The lower-case name used in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Active => "active",
            Status::Pinned => "pinned",
            Status::Obsolete => "obsolete",
            Status::Archived => "archived",
            Status::Wrong => "wrong",
        }
    }
}

/// The kind of an event: a built-in (`thought`, `action`, `observation`, `user_message`,
/// `goal`, `feedback`) or a custom name matching `[a-z][a-z0-9_]{0,31}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Kind(String);

impl Kind {
    /// The kinds every agent framework knows.
    pub const BUILT_IN: [&'static str; 6] = [
        "thought",
        "action",
        "observation",
        "user_message",
        "goal",
        "feedback",
    ];

    /// Validates and wraps a kind name.
    pub fn new(s: impl Into<String>) -> Result<Self> {
        let s = s.into();
        let mut bytes = s.bytes();
        let ok = s.len() <= 32
            && bytes.next().is_some_and(|b| b.is_ascii_lowercase())
            && bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        if ok {
            Ok(Kind(s))
        } else {
            Err(Error::invalid(
                "kind",
                format!(
                    "`{s}` is not a valid kind; use one of {} or a custom name matching \
                     [a-z][a-z0-9_]{{0,31}}",
                    Self::BUILT_IN.join(", ")
                ),
            ))
        }
    }

    /// The kind's name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for Kind {
    type Error = Error;
    fn try_from(s: String) -> Result<Self> {
        Kind::new(s)
    }
}

impl From<Kind> for String {
    fn from(k: Kind) -> String {
        k.0
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// How useful a record proved, from success/failure feedback.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Utility {
    /// Times a recall that returned it ended in success.
    pub successes: u32,
    /// Times it ended in failure.
    pub failures: u32,
}

impl Utility {
    /// The Beta mean (s+1)/(s+f+2): 0.5 with no evidence.
    pub fn mean(&self) -> f32 {
        (self.successes as f32 + 1.0) / (self.successes as f32 + self.failures as f32 + 2.0)
    }
}

/// The policy that last decided about a record: name and content hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct PolicyStamp {
    /// The policy's `name`.
    pub name: String,
    /// The hex content hash of the compiled policy.
    pub hash: String,
}

/// A stored memory record: the unit that is stored, indexed, scored and recalled.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemoryRecord {
    /// Stable id.
    pub id: MemoryId,
    /// The organisation / tenant; nothing crosses namespaces.
    pub namespace: String,
    /// The session the record belongs to.
    pub session_id: String,
    /// The agent that produced it, when known.
    pub agent_id: Option<String>,
    /// Episodic, condensed or knowledge.
    pub tier: Tier,
    /// What kind of event or memory this is.
    pub kind: Kind,
    /// The text that is embedded, indexed and shown.
    pub text: String,
    /// Structured content sent with the event (`null` when none).
    pub content: serde_json::Value,
    /// Free-form metadata (`null` when none).
    pub metadata: serde_json::Value,
    /// The event this one follows from, as sent by the agent.
    pub parent_id: Option<String>,
    /// When it happened (agent's clock, or the runtime clock when not sent).
    pub event_time: Timestamp,
    /// When the store accepted it (runtime clock).
    pub recorded_time: Timestamp,
    /// Importance, 0..=10.
    pub importance: f32,
    /// How alive the record is (1.0 fresh); decays and is reinforced.
    pub strength: f32,
    /// When `strength` was last set (decay is computed from here).
    pub strength_at: Timestamp,
    /// How many times recall or success reinforced it.
    pub reinforcements: u32,
    /// Success/failure counts.
    pub utility: Utility,
    /// Lifecycle state.
    pub status: Status,
    /// When `status` last changed (purge ages count from here).
    pub status_at: Timestamp,
    /// Records this one was made from (condensed and knowledge tiers).
    pub sources: Vec<MemoryId>,
    /// The policy that last decided about it.
    pub policy: PolicyStamp,
    /// Its embedding, when enriched (`None` while waiting for the embedder).
    pub embedding: Option<Vec<f32>>,
}

impl MemoryRecord {
    /// A fresh, active episodic record written at `at`: no agent, content, metadata, parent,
    /// sources or embedding; importance 0, strength 1, no feedback. Callers override what
    /// they know with struct-update syntax.
    pub fn episodic(
        id: MemoryId,
        namespace: impl Into<String>,
        session_id: impl Into<String>,
        kind: Kind,
        text: impl Into<String>,
        at: Timestamp,
    ) -> Self {
        MemoryRecord {
            id,
            namespace: namespace.into(),
            session_id: session_id.into(),
            agent_id: None,
            tier: Tier::Episodic,
            kind,
            text: text.into(),
            content: serde_json::Value::Null,
            metadata: serde_json::Value::Null,
            parent_id: None,
            event_time: at,
            recorded_time: at,
            importance: 0.0,
            strength: 1.0,
            strength_at: at,
            reinforcements: 0,
            utility: Utility::default(),
            status: Status::Active,
            status_at: at,
            sources: Vec::new(),
            policy: PolicyStamp::default(),
            embedding: None,
        }
    }

    /// Whether recall may return it.
    pub fn recallable(&self) -> bool {
        self.status.recallable()
    }
}

/// One passage of a long record (see [`crate::index::passage`]): a byte range of its text
/// and that range's embedding. Derived from the text by the embedder, kept by the store
/// beside the record's own embedding; a record that is not long has none.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Passage {
    /// First byte of the passage in the record's text.
    pub start: u32,
    /// One past its last byte.
    pub end: u32,
    /// Its embedding.
    pub embedding: Vec<f32>,
}

/// What happened to a record, for its audit log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AuditAction {
    /// Written.
    Created,
    /// Importance set (by rules, an LLM judge, or the client).
    Scored,
    /// Embedded and handed to the indexes.
    Embedded,
    /// Became a source of a condensed record.
    CondensedInto,
    /// Promoted into, or merged into, the knowledge pool.
    Promoted,
    /// Strength raised by recall or success; utility updated.
    Reinforced,
    /// Status changed (active / pinned / obsolete).
    StatusChanged,
    /// Decayed (strength lowered by a sweep).
    Decayed,
    /// Archived (soft-deleted).
    Archived,
    /// Purged: the record is gone; only this entry remains.
    Purged,
    /// Set aside because processing it kept failing.
    Quarantined,
    /// Linked to another record in the knowledge graph.
    Linked,
    /// A newer record states a newer value of its fact (or it supersedes an older one).
    Superseded,
    /// Found in conflict with another record.
    Contradicted,
    /// Found to repeat an older record (which was reinforced instead).
    Repeated,
    /// A conflict or a supersession settled by hand.
    Resolved,
}

/// How two records are related.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Relation {
    /// Knowledge → the condensed record it was promoted from.
    DerivedFrom = 1,
    /// Related knowledge.
    SimilarTo = 2,
    /// The newer record replaces the older.
    Supersedes = 3,
    /// The two disagree.
    Contradicts = 4,
}

impl Relation {
    /// The name used in APIs.
    pub fn as_str(self) -> &'static str {
        match self {
            Relation::DerivedFrom => "derived_from",
            Relation::SimilarTo => "similar_to",
            Relation::Supersedes => "supersedes",
            Relation::Contradicts => "contradicts",
        }
    }

    /// The relation stored as `b` (its discriminant), if any.
    pub fn from_u8(b: u8) -> Option<Relation> {
        Some(match b {
            1 => Relation::DerivedFrom,
            2 => Relation::SimilarTo,
            3 => Relation::Supersedes,
            4 => Relation::Contradicts,
            _ => return None,
        })
    }
}

impl std::str::FromStr for Relation {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s {
            "derived_from" => Relation::DerivedFrom,
            "similar_to" => Relation::SimilarTo,
            "supersedes" => Relation::Supersedes,
            "contradicts" => Relation::Contradicts,
            other => {
                return Err(Error::invalid(
                    "relation",
                    format!(
                        "`{other}` is not a relation; use derived_from, similar_to, supersedes or contradicts"
                    ),
                ));
            }
        })
    }
}

/// One edge.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Edge {
    /// Where it starts.
    pub from: MemoryId,
    /// Where it ends.
    pub to: MemoryId,
    /// What it means.
    pub relation: Relation,
}

/// How a record's strength grows when it is reinforced: the policy's forgetting curve and
/// bounds. The store applies it when a reinforcement commits (to the record as it is then),
/// so the store needs this much of a policy and no more.
pub trait Reinforce: Send + Sync {
    /// Reinforces `record` by `amount` at `now`: new strength and `strength_at`, one more
    /// reinforcement, and the deciding policy's stamp. Those four fields are all the store
    /// keeps of what it changes (in its strength table, beside the record's unchanged
    /// bytes); the record it is given has null `content` and `metadata`.
    fn apply(&self, record: &mut MemoryRecord, now: Timestamp, amount: f32);
    /// The policy that decides, for logs.
    fn stamp(&self) -> PolicyStamp;
}

/// One entry of a record's append-only audit log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditEntry {
    /// When (runtime clock).
    pub at: Timestamp,
    /// What happened.
    pub action: AuditAction,
    /// Who did it: `client`, `rules`, `decay`, a policy name, an actor name …
    pub by: String,
    /// Human-readable detail, e.g. `importance 3 -> 7 (rule 2)`.
    pub detail: String,
}

/// The limits every door enforces (docs/http-api.md; these defaults are the contract's): the
/// config file's `[limits]` section, read by the server, the CLI and the runtime alike, so
/// an embedded application, a CLI command and an HTTP request meet the same bounds with
/// the same messages. Keys in the file are the serde names (`body_bytes`, `max_k` …).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Largest request body in bytes (HTTP: 413 above).
    #[serde(rename = "body_bytes")]
    pub max_body_bytes: usize,
    /// Most events in one call (413 above).
    #[serde(rename = "events_per_call")]
    pub max_events_per_call: usize,
    /// Longest event `text` in bytes (413 above). Long texts are kept whole and indexed as
    /// passages; a recall's query is bounded by this or [`Limits::QUERY_CEILING`], the
    /// smaller.
    #[serde(rename = "text_bytes")]
    pub max_text_bytes: usize,
    /// Largest serialized event `content` in bytes (413 above).
    #[serde(rename = "content_bytes")]
    pub max_content_bytes: usize,
    /// Largest serialized event `metadata` in bytes (413 above).
    #[serde(rename = "metadata_bytes")]
    pub max_metadata_bytes: usize,
    /// Most memories one recall may ask for, at most [`Limits::K_CEILING`] (422 above).
    pub max_k: usize,
    /// Largest recall `token_budget` (422 above).
    pub max_token_budget: usize,
    /// Most timeline items one request returns (422 above).
    pub max_timeline: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: 8 << 20,
            max_events_per_call: 1000,
            max_text_bytes: 1 << 20,
            max_content_bytes: 256 * 1024,
            max_metadata_bytes: 64 * 1024,
            max_k: Limits::K_CEILING,
            max_token_budget: 32_768,
            max_timeline: 1_000,
        }
    }
}

impl Limits {
    /// Most memories recall ranks: no configuration may raise `max_k` past it.
    pub const K_CEILING: usize = 200;
    /// Longest recall query in bytes whatever `text_bytes` allows: a question, not a
    /// document (every distinct word of it is a term the keyword index looks up).
    pub const QUERY_CEILING: usize = 64 * 1024;
    /// The longest query a recall accepts under these limits.
    pub fn max_query_bytes(&self) -> usize {
        self.max_text_bytes.min(Limits::QUERY_CEILING)
    }
    /// How many memories a recall returns when it does not say.
    pub const DEFAULT_K: usize = 10;

    /// Every value out of range, named by its config key (all of them, not the first).
    pub fn validate(&self) -> Result<()> {
        let problems = self.problems();
        if problems.is_empty() {
            Ok(())
        } else {
            Err(Error::invalid("limits", problems.join("; ")))
        }
    }

    /// What [`Limits::validate`] finds wrong, one line per value.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        for (name, value) in [
            ("body_bytes", self.max_body_bytes),
            ("events_per_call", self.max_events_per_call),
            ("text_bytes", self.max_text_bytes),
            ("content_bytes", self.max_content_bytes),
            ("metadata_bytes", self.max_metadata_bytes),
            ("max_k", self.max_k),
            ("max_token_budget", self.max_token_budget),
            ("max_timeline", self.max_timeline),
        ] {
            if value == 0 {
                problems.push(format!("{name} must be at least 1"));
            }
        }
        if self.max_k > Limits::K_CEILING {
            problems.push(format!(
                "max_k = {} is above what recall ranks ({ceiling}); use 1 to {ceiling}",
                self.max_k,
                ceiling = Limits::K_CEILING
            ));
        }
        problems
    }

    /// A recall's `k` ([`Limits::DEFAULT_K`] when absent), or an error outside `1..=max_k`.
    pub fn k(&self, k: Option<usize>) -> Result<usize> {
        let k = k.unwrap_or(Limits::DEFAULT_K);
        if (1..=self.max_k).contains(&k) {
            Ok(k)
        } else {
            Err(Error::invalid(
                "k",
                format!("{k} is out of range; ask for 1 to {} memories", self.max_k),
            ))
        }
    }

    /// A recall's token budget, or an error when it is over `max_token_budget`.
    pub fn token_budget(&self, budget: Option<usize>) -> Result<Option<usize>> {
        match budget {
            Some(b) if b > self.max_token_budget => Err(Error::invalid(
                "token_budget",
                format!(
                    "{b} is over the limit of {}; ask for a smaller context",
                    self.max_token_budget
                ),
            )),
            other => Ok(other),
        }
    }
}

/// An event as an agent sends it; [`NewMemory::validate`] turns it into something storable.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewMemory {
    /// Event kind (required).
    pub kind: String,
    /// The text; derived from `content` when absent.
    #[serde(default)]
    pub text: Option<String>,
    /// Structured content.
    #[serde(default)]
    pub content: Option<serde_json::Value>,
    /// The agent that produced it.
    #[serde(default)]
    pub agent_id: Option<String>,
    /// Free-form metadata.
    #[serde(default)]
    pub metadata: Option<serde_json::Value>,
    /// The event this one follows from.
    #[serde(default)]
    pub parent_id: Option<String>,
    /// Event time; the runtime clock when absent.
    #[serde(default)]
    pub timestamp: Option<Timestamp>,
    /// Client-given importance 0..=10; the evaluator decides when absent.
    #[serde(default)]
    pub importance: Option<f32>,
    /// A precomputed embedding (the embedder is skipped).
    #[serde(default)]
    pub embedding: Option<Vec<f32>>,
    /// Written pinned: the record never fades, as if marked `pinned` at once, in the same
    /// write (no window in which a decay sweep could archive it). For what a client keeps
    /// whole and in order, such as a conversation's items.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pinned: bool,
}

/// A validated event, ready to become a record.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidMemory {
    /// Validated kind.
    pub kind: Kind,
    /// Non-empty text.
    pub text: String,
    /// Content or `null`.
    pub content: serde_json::Value,
    /// Agent id, validated.
    pub agent_id: Option<String>,
    /// Metadata or `null`.
    pub metadata: serde_json::Value,
    /// Parent id as sent.
    pub parent_id: Option<String>,
    /// Event time, if sent.
    pub timestamp: Option<Timestamp>,
    /// Importance, if sent (0..=10).
    pub importance: Option<f32>,
    /// Embedding, if sent (finite, right dimension).
    pub embedding: Option<Vec<f32>>,
    /// Written pinned.
    pub pinned: bool,
}

/// Checks an id (session, agent, namespace) against `[A-Za-z0-9._:-]{1,128}`.
pub fn validate_id(field: &str, s: &str) -> Result<()> {
    let ok = !s.is_empty()
        && s.len() <= 128
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(
            field,
            format!(
                "`{}` is not a valid {field}; use 1 to 128 characters from A-Z a-z 0-9 . _ : -",
                truncate_for_message(s)
            ),
        ))
    }
}

/// Checks an embedding: finite numbers, the expected dimension, not all zero.
pub fn validate_embedding(v: &[f32], expected: Option<usize>) -> Result<()> {
    if let Some(expected) = expected
        && v.len() != expected
    {
        return Err(Error::DimensionMismatch {
            got: v.len(),
            expected,
        });
    }
    if v.is_empty() {
        return Err(Error::invalid(
            "embedding",
            "is empty; send a non-empty vector or omit it",
        ));
    }
    if let Some(i) = v.iter().position(|x| !x.is_finite()) {
        return Err(Error::invalid(
            "embedding",
            format!(
                "element {i} is {} ; every element must be a finite number",
                v[i]
            ),
        ));
    }
    if v.iter().all(|x| *x == 0.0) {
        return Err(Error::invalid(
            "embedding",
            "is all zeros, which has no direction for cosine similarity; send a real vector or omit it",
        ));
    }
    Ok(())
}

fn truncate_for_message(s: &str) -> String {
    if s.chars().count() <= 40 {
        s.to_string()
    } else {
        let head: String = s.chars().take(40).collect();
        format!("{head}…")
    }
}

/// Derives display text from structured content: strings are taken whole, objects become
/// `key: value` pairs, so a record made from content alone is still searchable.
pub fn text_from_content(content: &serde_json::Value) -> String {
    fn walk(v: &serde_json::Value, out: &mut Vec<String>, key: Option<&str>) {
        match v {
            serde_json::Value::Null => {}
            serde_json::Value::String(s) => match key {
                Some(k) => out.push(format!("{k}: {s}")),
                None => out.push(s.clone()),
            },
            serde_json::Value::Object(map) => {
                for (k, v) in map {
                    walk(v, out, Some(k));
                }
            }
            serde_json::Value::Array(items) => {
                for v in items {
                    walk(v, out, key);
                }
            }
            other => match key {
                Some(k) => out.push(format!("{k}: {other}")),
                None => out.push(other.to_string()),
            },
        }
    }
    let mut parts = Vec::new();
    walk(content, &mut parts, None);
    parts.join("; ")
}

impl NewMemory {
    /// A minimal event: kind and text.
    pub fn new(kind: impl Into<String>, text: impl Into<String>) -> Self {
        NewMemory {
            kind: kind.into(),
            text: Some(text.into()),
            ..Default::default()
        }
    }

    /// Validates everything about the event; `dimension` is the store's, when known.
    pub fn validate(self, limits: &Limits, dimension: Option<usize>) -> Result<ValidMemory> {
        let kind = Kind::new(self.kind)?;
        if let Some(c) = &self.content {
            let size = serde_json::to_vec(c).map(|v| v.len()).unwrap_or(usize::MAX);
            if size > limits.max_content_bytes {
                return Err(Error::TooLarge {
                    field: "content".into(),
                    size,
                    limit: limits.max_content_bytes,
                    hint: "store large payloads elsewhere and keep a reference in content".into(),
                });
            }
        }
        if let Some(m) = &self.metadata {
            let size = serde_json::to_vec(m).map(|v| v.len()).unwrap_or(usize::MAX);
            if size > limits.max_metadata_bytes {
                return Err(Error::TooLarge {
                    field: "metadata".into(),
                    size,
                    limit: limits.max_metadata_bytes,
                    hint: "keep metadata to small tags and references".into(),
                });
            }
        }
        let text = match (self.text, &self.content) {
            (Some(t), _) if !t.trim().is_empty() => t,
            (Some(_), None) | (None, None) => {
                return Err(Error::invalid(
                    "text",
                    "is empty; send non-empty `text`, or `content` to derive it from",
                ));
            }
            (_, Some(c)) => {
                let t = text_from_content(c);
                if t.trim().is_empty() {
                    return Err(Error::invalid(
                        "content",
                        "holds no text to remember; send `text`, or content with string values",
                    ));
                }
                t
            }
        };
        if text.len() > limits.max_text_bytes {
            return Err(Error::TooLarge {
                field: "text".into(),
                size: text.len(),
                limit: limits.max_text_bytes,
                hint: "split it into several events, or summarise it first".into(),
            });
        }
        if let Some(a) = &self.agent_id {
            validate_id("agent_id", a)?;
        }
        if let Some(p) = &self.parent_id
            && (p.is_empty() || p.len() > 128)
        {
            return Err(Error::invalid(
                "parent_id",
                "must be 1 to 128 characters (the id of the event this one follows)",
            ));
        }
        if let Some(i) = self.importance
            && !(i.is_finite() && (0.0..=10.0).contains(&i))
        {
            return Err(Error::invalid(
                "importance",
                format!("{i} is out of range; send a number from 0 to 10, or omit it"),
            ));
        }
        if let Some(e) = &self.embedding {
            validate_embedding(e, dimension)?;
        }
        Ok(ValidMemory {
            kind,
            text,
            content: self.content.unwrap_or(serde_json::Value::Null),
            agent_id: self.agent_id,
            metadata: self.metadata.unwrap_or(serde_json::Value::Null),
            parent_id: self.parent_id,
            timestamp: self.timestamp,
            importance: self.importance,
            embedding: self.embedding,
            pinned: self.pinned,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_id_round_trips_and_rejects_garbage() {
        let id = MemoryId(42);
        assert_eq!(id.to_string(), "mem-0000002a");
        assert_eq!("mem-0000002a".parse::<MemoryId>().unwrap(), id);
        for bad in [
            "",
            "mem-",
            "mem-2a",
            "mem-0000002g",
            "m-0000002a",
            "mem-0000002a0",
        ] {
            let err = bad.parse::<MemoryId>().unwrap_err();
            assert!(err.to_string().contains("mem-0000002a"), "{bad}: {err}");
        }
        let json = serde_json::to_string(&id).unwrap();
        assert_eq!(json, "\"mem-0000002a\"");
        assert_eq!(postcard::to_allocvec(&id).unwrap(), vec![42]);
    }

    #[test]
    fn kinds_follow_the_pattern() {
        for ok in ["goal", "user_message", "x", "tool_call_2"] {
            assert!(Kind::new(ok).is_ok(), "{ok}");
        }
        for bad in ["", "Goal", "2x", "a-b", &"a".repeat(33)] {
            let err = Kind::new(bad).unwrap_err().to_string();
            assert!(err.contains("[a-z][a-z0-9_]"), "{bad}: {err}");
        }
    }

    #[test]
    fn utility_is_the_beta_mean() {
        assert_eq!(Utility::default().mean(), 0.5);
        let u = Utility {
            successes: 3,
            failures: 1,
        };
        assert!((u.mean() - 4.0 / 6.0).abs() < 1e-6);
    }

    #[test]
    fn validation_rejects_bad_events_with_fixes() {
        let limits = Limits::default();
        let cases: Vec<(NewMemory, &str)> = vec![
            (NewMemory::new("thought", "   "), "non-empty"),
            (NewMemory::new("Bad Kind", "x"), "valid kind"),
            (
                NewMemory::new("thought", "x".repeat((1 << 20) + 1)),
                "too large",
            ),
            (
                NewMemory {
                    embedding: Some(vec![0.1, f32::NAN, 0.2, 0.3]),
                    ..NewMemory::new("thought", "x")
                },
                "finite",
            ),
            (
                NewMemory {
                    embedding: Some(vec![0.1; 3]),
                    ..NewMemory::new("thought", "x")
                },
                "shadowbrain reindex",
            ),
            (
                NewMemory {
                    importance: Some(11.0),
                    ..NewMemory::new("thought", "x")
                },
                "0 to 10",
            ),
            (
                NewMemory {
                    agent_id: Some("bad agent".into()),
                    ..NewMemory::new("thought", "x")
                },
                "A-Z a-z",
            ),
        ];
        for (event, needle) in cases {
            let err = event
                .clone()
                .validate(&limits, Some(4))
                .unwrap_err()
                .to_string();
            assert!(err.contains(needle), "{event:?}: {err}");
        }
    }

    #[test]
    fn text_is_derived_from_content() {
        let e = NewMemory {
            kind: "action".into(),
            content: Some(serde_json::json!({"tool": "grep", "args": ["-r", "TODO"]})),
            ..Default::default()
        };
        let v = e.validate(&Limits::default(), None).unwrap();
        // serde_json maps iterate in key order.
        assert_eq!(v.text, "args: -r; args: TODO; tool: grep");
    }

    #[test]
    fn ids_follow_the_pattern() {
        assert!(validate_id("session_id", "run-1:agent.a_b").is_ok());
        assert!(validate_id("session_id", "").is_err());
        assert!(validate_id("session_id", "a/b").is_err());
        assert!(validate_id("session_id", &"a".repeat(129)).is_err());
    }
}
