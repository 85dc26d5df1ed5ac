//! The wire types of the HTTP contract (docs/http-api.md): every request body the handlers
//! read and every answer they write, as typed structs. The handlers serialize these
//! directly (no intermediate `serde_json::Value`), and `/openapi.json` is derived from the
//! same structs, so the published schema cannot drift from what the server sends.
//!
//! Runtime types (tiers, statuses, kinds, audit actions) keep their own serde form; their
//! schema is declared here as strings with the values listed, so the runtime crate does not
//! depend on the OpenAPI generator.
//!
//! The same structs are the MCP tools' structured output (`crate::mcp`): they also derive
//! a JSON Schema (schemars), which the tools publish as their `outputSchema`.
//!
//! The answers a client reads back into objects (a record, a recall) also deserialize: the
//! Python package builds its answer objects from these structs, from a server's JSON or
//! straight from the runtime in-process. Fields a server leaves out when empty default;
//! no `#[serde(default)]` is added to a field the server always sends, since it would mark
//! the field optional in `/openapi.json` and the MCP tools' output schemas.

use std::collections::BTreeMap;

use crate::{
    AuditAction, AuditEntry, Chain, Edge, Kind, MemoryId, MemoryRecord, Outcome, PolicyStamp,
    RecallResult, Relation, Resolution, Scope, SessionStats, Status, Tier, Utility, Validity, Why,
    to_rfc3339,
};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

/// The answer of every `/v1` route (and `/metrics`) to a request without a known API key
/// while keys are configured: one response for the OpenAPI document, named once.
#[derive(utoipa::IntoResponses)]
#[response(
    status = 401,
    description = "Keys are configured and none, or an unknown one, was sent"
)]
pub struct Unauthorized(pub ErrorBody);

/// Every error answer: `{"error":{"code","message"}}`.
#[derive(Debug, Serialize, Deserialize, ToSchema, JsonSchema)]
pub struct ErrorBody {
    /// What went wrong.
    pub error: ErrorDetail,
}

/// The code and message of an error answer.
#[derive(Debug, Serialize, Deserialize, ToSchema, JsonSchema)]
pub struct ErrorDetail {
    /// A stable snake_case code, e.g. `malformed_json`, `invalid_kind`, `not_found`,
    /// `body_too_large`, `unauthorized`.
    #[schema(example = "invalid_kind")]
    pub code: String,
    /// What was wrong and how to fix it, for a person.
    pub message: String,
    /// On `503 overloaded`: the wait the server expected, in milliseconds (`Retry-After`
    /// carries it in whole seconds, at least 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
}

/// `GET /healthz`.
#[derive(Debug, Serialize, ToSchema, JsonSchema)]
pub struct Health {
    /// Always `ok` while the server answers.
    #[schema(example = "ok")]
    pub status: &'static str,
    /// The server's version.
    pub version: &'static str,
}

/// One event, as an agent sends it. `kind` is required; `text` is required unless
/// `content` is given (then `text` is derived from it).
#[derive(Debug, Deserialize, ToSchema, JsonSchema)]
#[allow(dead_code)] // The handler reads events as JSON values first (RFC 3339 times); this is their schema.
pub struct EventIn {
    /// `thought`, `action`, `observation`, `user_message`, `goal`, `feedback`, or any custom
    /// `[a-z][a-z0-9_]{0,31}`.
    #[schema(example = "observation", pattern = "^[a-z][a-z0-9_]{0,31}$")]
    pub kind: String,
    /// The text (at most 1 MiB by default; a long one is indexed as passages).
    #[schema(example = "the nightly backup job timed out")]
    pub text: Option<String>,
    /// Structured content (at most 256 KiB encoded by default).
    #[schema(value_type = Option<Object>)]
    pub content: Option<Value>,
    /// The agent that produced it.
    pub agent_id: Option<String>,
    /// Free-form metadata.
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Value>,
    /// The event this one follows from.
    pub parent_id: Option<String>,
    /// When it happened, RFC 3339 (default: when the server received it).
    #[schema(value_type = Option<String>, format = DateTime)]
    pub timestamp: Option<Value>,
    /// Importance 0..=10 (default: scored by the policy).
    #[schema(minimum = 0, maximum = 10)]
    pub importance: Option<f32>,
    /// A vector the client already has: the store's dimension, finite numbers. The
    /// embedder is skipped.
    pub embedding: Option<Vec<f32>>,
    /// Written pinned: it never fades (as `PATCH {"status":"pinned"}` would), in the same
    /// write. Default false.
    pub pinned: Option<bool>,
}

/// `POST /v1/sessions/{session_id}/events`: one event, or a batch of at most 1000.
#[derive(Debug, Deserialize, ToSchema, JsonSchema)]
#[serde(untagged)]
#[allow(dead_code)] // Schema only, as for `EventIn`.
#[allow(clippy::large_enum_variant)] // Never built: its size costs nothing.
pub enum EventsIn {
    /// A single event.
    One(EventIn),
    /// Several events, written together.
    Batch {
        /// At most 1000 events.
        events: Vec<EventIn>,
    },
}

/// The ids of the events written, in the order sent.
#[derive(Debug, Serialize, ToSchema, JsonSchema)]
pub struct Ids {
    /// `mem-…` ids.
    pub ids: Vec<String>,
}

/// `POST /v1/sessions/{session_id}/recall`; only `query` is required.
#[derive(Debug, Deserialize, ToSchema, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RecallIn {
    /// What the agent wants to remember.
    #[schema(example = "why do deploys fail?")]
    pub query: String,
    /// How many memories (1..=200, default 10).
    #[serde(default)]
    #[schema(minimum = 1, maximum = 200, default = 10)]
    pub k: Option<usize>,
    /// `session` (default), `agent` (needs `agent_id`) or `namespace`.
    #[serde(default)]
    #[schema(value_type = Option<String>, example = "session")]
    #[schemars(with = "Option<ScopeName>")]
    pub scope: Option<Scope>,
    /// The agent, for `agent` scope.
    #[serde(default)]
    pub agent_id: Option<String>,
    /// Only these kinds.
    #[serde(default)]
    pub kinds: Option<Vec<String>>,
    /// Only events at or after this time (RFC 3339, or milliseconds since the epoch).
    #[serde(default)]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub since: Option<Value>,
    /// Only events at or before this time.
    #[serde(default)]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub until: Option<Value>,
    /// Also search the namespace's knowledge pool (default true).
    #[serde(default)]
    pub include_knowledge: Option<bool>,
    /// Trim the memories to this many tokens of context (at most 32768).
    #[serde(default)]
    #[schema(maximum = 32768)]
    pub token_budget: Option<usize>,
    /// Rank memories a newer one superseded as if they were current (default false: they
    /// rank below, and `why.superseded_by` says so).
    #[serde(default)]
    pub include_superseded: Option<bool>,
}

/// The policy that ranked an answer or decided about a record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema, JsonSchema)]
pub struct PolicyRef {
    /// Its `name`.
    pub name: String,
    /// The hex content hash of the compiled policy.
    pub hash: String,
}

impl From<PolicyStamp> for PolicyRef {
    fn from(p: PolicyStamp) -> Self {
        PolicyRef {
            name: p.name,
            hash: p.hash,
        }
    }
}

/// Success and failure counts from feedback.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema, JsonSchema)]
pub struct UtilityOut {
    /// Recalls that returned it and ended in success.
    pub successes: u32,
    /// Those that ended in failure.
    pub failures: u32,
}

impl From<Utility> for UtilityOut {
    fn from(u: Utility) -> Self {
        UtilityOut {
            successes: u.successes,
            failures: u.failures,
        }
    }
}

/// A stored record: all fields, status, strength, utility and sources (its embedding is
/// left out; clients that want vectors keep their own).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema, JsonSchema)]
pub struct Memory {
    /// `mem-…`.
    #[schema(example = "mem-0000002a")]
    pub id: String,
    /// The namespace (tenant).
    pub namespace: String,
    /// The session it belongs to.
    pub session_id: String,
    /// The agent that produced it.
    pub agent_id: Option<String>,
    /// `episodic`, `condensed` or `knowledge`.
    #[schema(value_type = String, example = "episodic")]
    #[schemars(with = "TierName")]
    pub tier: Tier,
    /// The event's kind.
    #[schema(value_type = String, example = "observation")]
    #[schemars(with = "String")]
    pub kind: Kind,
    /// The text that is embedded, indexed and shown.
    pub text: String,
    /// Structured content (`null` when none).
    #[schema(value_type = Object)]
    pub content: Value,
    /// Free-form metadata (`null` when none).
    #[schema(value_type = Object)]
    pub metadata: Value,
    /// The event this one follows from.
    pub parent_id: Option<String>,
    /// When it happened, in milliseconds since the epoch.
    pub event_time: i64,
    /// `event_time` in RFC 3339.
    #[schema(format = DateTime)]
    pub timestamp: String,
    /// When the store accepted it, in milliseconds since the epoch.
    pub recorded_time: i64,
    /// 0..=10.
    pub importance: f32,
    /// How alive it is (1 fresh); decays and is reinforced.
    pub strength: f32,
    /// When `strength` was last set (milliseconds).
    pub strength_at: i64,
    /// Times recall or success reinforced it.
    pub reinforcements: u32,
    /// Feedback counts.
    pub utility: UtilityOut,
    /// `active`, `pinned`, `obsolete`, `archived` or `wrong`.
    #[schema(value_type = String, example = "active")]
    #[schemars(with = "StatusName")]
    pub status: Status,
    /// When `status` last changed (milliseconds).
    pub status_at: i64,
    /// The records it was made from (condensed and knowledge tiers).
    pub sources: Vec<String>,
    /// The policy that last decided about it.
    pub policy: PolicyRef,
    /// The record that states a newer value of its fact (set by the policy's `[updates]`
    /// detection or by a resolved conflict); `null` while it is current.
    pub superseded_by: Option<String>,
    /// When it stopped being true (the newer record's event time, milliseconds); `null`
    /// while it is current.
    pub valid_until: Option<i64>,
    /// Records it is in open conflict with (settle with `PATCH` and `resolve`).
    pub conflicts: Vec<String>,
    /// Its place among the values of its fact: on `GET` and `PATCH` of one memory only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chain: Option<ChainOut>,
}

/// A memory's place among the values of its fact.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema, JsonSchema)]
pub struct ChainOut {
    /// The records it superseded.
    pub supersedes: Vec<String>,
    /// The newer values after it, oldest first, ending with the current one.
    pub newer: Vec<String>,
    /// When the runtime learned it was superseded (milliseconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub learned_at: Option<i64>,
    /// The older record it repeats (the older was reinforced instead).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duplicate_of: Option<String>,
}

impl Memory {
    /// The memory with what is known against it (from [`crate::Substrate::validity_of`]).
    pub fn with_validity(mut self, v: Option<&Validity>) -> Self {
        if let Some(v) = v {
            self.superseded_by = v.superseded_by.map(|id| id.to_string());
            self.valid_until = v.valid_until;
            self.conflicts = v.conflicts.iter().map(ToString::to_string).collect();
        }
        self
    }

    /// Records as memories, each with what is known against it.
    pub fn all_of(sub: &crate::Substrate, records: Vec<MemoryRecord>) -> crate::Result<Vec<Self>> {
        let ids: Vec<MemoryId> = records.iter().map(|r| r.id).collect();
        let known = sub.validity_of(&ids)?;
        Ok(records
            .into_iter()
            .map(|r| {
                let v = known.get(&r.id);
                Memory::from(r).with_validity(v)
            })
            .collect())
    }

    /// The memory with its validity and chain filled in.
    pub fn with_chain(self, c: Chain) -> Self {
        let ids = |v: &[MemoryId]| v.iter().map(ToString::to_string).collect::<Vec<_>>();
        let mut this = self.with_validity(Some(&c.validity));
        this.chain = Some(ChainOut {
            supersedes: ids(&c.supersedes),
            newer: ids(&c.newer),
            learned_at: c.validity.learned_at,
            duplicate_of: c.validity.duplicate_of.map(|id| id.to_string()),
        });
        this
    }
}

impl From<MemoryRecord> for Memory {
    fn from(r: MemoryRecord) -> Self {
        Memory {
            id: r.id.to_string(),
            namespace: r.namespace,
            session_id: r.session_id,
            agent_id: r.agent_id,
            tier: r.tier,
            kind: r.kind,
            text: r.text,
            content: r.content,
            metadata: r.metadata,
            parent_id: r.parent_id,
            event_time: r.event_time,
            timestamp: to_rfc3339(r.event_time),
            recorded_time: r.recorded_time,
            importance: r.importance,
            strength: r.strength,
            strength_at: r.strength_at,
            reinforcements: r.reinforcements,
            utility: r.utility.into(),
            status: r.status,
            status_at: r.status_at,
            sources: r.sources.iter().map(ToString::to_string).collect(),
            policy: r.policy.into(),
            superseded_by: None,
            valid_until: None,
            conflicts: Vec::new(),
            chain: None,
        }
    }
}

/// Why a memory ranked where it did: each policy component's weighted contribution.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema, JsonSchema)]
pub struct WhyOut {
    /// Query relevance (fused vector and keyword).
    pub relevance: f32,
    /// Recency.
    pub recency: f32,
    /// Importance.
    pub importance: f32,
    /// Utility from feedback.
    pub utility: f32,
    /// For a long memory (indexed as passages): the passage that matched, which the
    /// context shows in place of the whole text. Absent for a memory that is one passage.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub passage: Option<PassageOut>,
    /// The record that states a newer value of this one's fact: it was ranked as history,
    /// below the current value, unless the request set `include_superseded` or the query
    /// asked about the past.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub superseded_by: Option<String>,
    /// When it stopped being true (milliseconds).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub valid_until: Option<i64>,
    /// Records it is in open conflict with: both sides rank as they match.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conflicts_with: Vec<String>,
}

/// Which passage of a long memory matched the query.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema, JsonSchema)]
pub struct PassageOut {
    /// Its place among the memory's passages, from 0.
    pub index: u32,
    /// How many passages the memory has.
    pub of: u32,
    /// Its first byte in the memory's `text`.
    pub start: u32,
    /// One past its last byte.
    pub end: u32,
}

impl From<Why> for WhyOut {
    fn from(w: Why) -> Self {
        WhyOut {
            relevance: w.relevance,
            recency: w.recency,
            importance: w.importance,
            utility: w.utility,
            passage: w.passage.map(|p| PassageOut {
                index: p.index,
                of: p.of,
                start: p.start,
                end: p.end,
            }),
            superseded_by: w.superseded_by.map(|id| id.to_string()),
            valid_until: w.valid_until,
            conflicts_with: w.conflicts_with.iter().map(ToString::to_string).collect(),
        }
    }
}

/// A recalled memory: the record's fields, its score and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema, JsonSchema)]
pub struct Recalled {
    /// The record.
    #[serde(flatten)]
    pub memory: Memory,
    /// The policy's total score.
    pub score: f32,
    /// The score's parts.
    pub why: WhyOut,
}

/// A recall's answer (also knowledge search's).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema, JsonSchema)]
pub struct RecallOut {
    /// Send it back with feedback to credit every memory of this answer.
    pub recall_id: Option<String>,
    /// The policy that ranked it.
    pub policy: PolicyRef,
    /// Best first.
    pub memories: Vec<Recalled>,
    /// The memories rendered for a prompt, in time order, within the token budget.
    pub context: String,
    /// What the answer went without and why (e.g. the embedder was unreachable, so only
    /// keywords and recency ranked it). Absent when nothing was missing.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

impl From<RecallResult> for RecallOut {
    fn from(r: RecallResult) -> Self {
        RecallOut {
            recall_id: r.recall_id,
            policy: r.policy.into(),
            memories: r
                .memories
                .into_iter()
                .map(|m| {
                    let why = WhyOut::from(m.why);
                    let mut memory = Memory::from(m.record);
                    memory.superseded_by = why.superseded_by.clone();
                    memory.valid_until = why.valid_until;
                    memory.conflicts = why.conflicts_with.clone();
                    Recalled {
                        memory,
                        score: m.score,
                        why,
                    }
                })
                .collect(),
            context: r.context,
            notes: r.notes,
        }
    }
}

/// `POST /v1/sessions/{session_id}/feedback`: a recall or some memories, and the outcome.
#[derive(Debug, Deserialize, ToSchema, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FeedbackIn {
    /// Credit every memory of this recall …
    #[serde(default)]
    pub recall_id: Option<String>,
    /// … or these memories.
    #[serde(default)]
    pub memory_ids: Option<Vec<String>>,
    /// `success` or `failure`.
    #[schema(value_type = String, example = "success")]
    #[schemars(with = "OutcomeName")]
    pub outcome: Outcome,
}

/// How many records a feedback changed.
#[derive(Debug, Serialize, ToSchema, JsonSchema)]
pub struct Updated {
    /// Records updated.
    pub updated: usize,
}

/// The condensed record, or `null` when there was nothing to condense.
#[derive(Debug, Serialize, ToSchema, JsonSchema)]
pub struct CondenseOut {
    /// `mem-…` or `null`.
    pub memory_id: Option<String>,
}

/// One session of the namespace.
#[derive(Debug, Serialize, ToSchema, JsonSchema)]
pub struct SessionOut {
    /// The session id.
    pub session_id: String,
    /// Events written.
    pub events: u64,
    /// Records of every tier in the session.
    pub memories: u64,
    /// When the latest record was written, RFC 3339.
    #[schema(format = DateTime)]
    pub last_active: String,
}

impl From<SessionStats> for SessionOut {
    fn from(s: SessionStats) -> Self {
        SessionOut {
            session_id: s.session_id,
            events: s.events,
            memories: s.memories,
            last_active: to_rfc3339(s.last_active),
        }
    }
}

/// `GET /v1/sessions`.
#[derive(Debug, Serialize, ToSchema, JsonSchema)]
pub struct Sessions {
    /// Every session of the namespace.
    pub sessions: Vec<SessionOut>,
}

/// `GET /v1/sessions/{session_id}/timeline`: newest first.
#[derive(Debug, Serialize, ToSchema, JsonSchema)]
pub struct Timeline {
    /// Records, newest first.
    pub items: Vec<Memory>,
}

/// `PATCH /v1/memories/{id}`.
#[derive(Debug, Deserialize, ToSchema, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StatusIn {
    /// `pinned`, `obsolete`, `wrong` or `active` (archive with DELETE). Send this or
    /// `resolve`.
    #[serde(default)]
    #[schema(value_type = Option<String>, example = "pinned")]
    #[schemars(with = "Option<SettableStatusSchema>")]
    pub status: Option<Status>,
    /// Settle what was found about it: `keep` (it is right; the records in conflict with it
    /// become superseded by it), `dismiss` (the conflicts are not real) or `reinstate` (it
    /// was wrongly taken for superseded). Audited on every record it changes.
    #[serde(default)]
    #[schema(value_type = Option<String>, example = "keep")]
    #[schemars(with = "Option<ResolveName>")]
    pub resolve: Option<ResolveName>,
    /// Why, kept in the record's history with the change (at most 1024 bytes).
    #[serde(default)]
    pub reason: Option<String>,
}

/// One audited change.
#[derive(Debug, Serialize, ToSchema, JsonSchema)]
pub struct HistoryEntry {
    /// When, RFC 3339.
    #[schema(format = DateTime)]
    pub at: String,
    /// `created`, `scored`, `embedded`, `reinforced`, `status_changed`, …
    #[schema(value_type = String, example = "created")]
    #[schemars(with = "String")]
    pub action: AuditAction,
    /// Who: `api`, `recall`, a policy stage, …
    pub by: String,
    /// What changed.
    pub detail: String,
}

impl From<AuditEntry> for HistoryEntry {
    fn from(e: AuditEntry) -> Self {
        HistoryEntry {
            at: to_rfc3339(e.at),
            action: e.action,
            by: e.by,
            detail: e.detail,
        }
    }
}

/// `GET /v1/memories/{id}/history`: oldest first.
#[derive(Debug, Serialize, ToSchema, JsonSchema)]
pub struct History {
    /// The audit entries.
    pub entries: Vec<HistoryEntry>,
}

/// `POST /v1/knowledge/search`.
#[derive(Debug, Deserialize, ToSchema, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KnowledgeSearchIn {
    /// What to look for.
    pub query: String,
    /// How many (1..=200, default 10).
    #[serde(default)]
    #[schema(minimum = 1, maximum = 200, default = 10)]
    pub k: Option<usize>,
}

/// An edge of the knowledge graph.
#[derive(Debug, Serialize, ToSchema, JsonSchema)]
pub struct EdgeOut {
    /// Where it starts (`mem-…`).
    pub from: String,
    /// Where it ends.
    pub to: String,
    /// `derived_from`, `similar_to`, `supersedes`, …
    #[schema(value_type = String, example = "derived_from")]
    #[schemars(with = "RelationName")]
    pub relation: Relation,
}

impl From<Edge> for EdgeOut {
    fn from(e: Edge) -> Self {
        EdgeOut {
            from: e.from.to_string(),
            to: e.to.to_string(),
            relation: e.relation,
        }
    }
}

/// `GET /v1/knowledge/graph`: the records within `depth` edges and the edges among them.
#[derive(Debug, Serialize, ToSchema, JsonSchema)]
pub struct Graph {
    /// The records.
    pub nodes: Vec<Memory>,
    /// The edges.
    pub edges: Vec<EdgeOut>,
}

/// `GET /v1/policy` and `POST /v1/policy/reload`.
#[derive(Debug, Serialize, ToSchema, JsonSchema)]
pub struct PolicyOut {
    /// The policy's `name`.
    pub name: String,
    /// The hex content hash of the compiled policy.
    pub hash: String,
    /// The compiled policy, every section resolved.
    #[schema(value_type = Object)]
    pub policy: Value,
    /// After a reload, when the operator gave namespaces policies of their own
    /// (`[[namespaces]]`): each one's name and hash, by namespace. The fields above are
    /// then the default policy's, in force for every other namespace.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub namespaces: BTreeMap<String, PolicyRef>,
}

// The JSON Schema of the runtime's enums, by their wire names (schema only: the runtime's
// own serde form is what goes over the wire).

/// A record's tier.
#[derive(JsonSchema)]
#[serde(rename_all = "snake_case")]
#[allow(dead_code)]
enum TierName {
    Episodic,
    Condensed,
    Knowledge,
}

/// A record's status.
#[derive(JsonSchema)]
#[serde(rename_all = "snake_case")]
#[allow(dead_code)]
enum StatusName {
    Active,
    Pinned,
    Obsolete,
    Archived,
    Wrong,
}

/// A status a caller may set (archiving is its own operation).
#[derive(JsonSchema)]
#[serde(rename_all = "snake_case")]
#[allow(dead_code)]
pub(crate) enum SettableStatusSchema {
    Pinned,
    Obsolete,
    Wrong,
    Active,
}

/// How a conflict or a supersession is settled by hand.
#[derive(Debug, Clone, Copy, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ResolveName {
    /// It is right: the records in conflict with it become superseded by it.
    Keep,
    /// The conflicts are not real.
    Dismiss,
    /// It was wrongly taken for superseded.
    Reinstate,
}

impl From<ResolveName> for Resolution {
    fn from(r: ResolveName) -> Self {
        match r {
            ResolveName::Keep => Resolution::Keep,
            ResolveName::Dismiss => Resolution::Dismiss,
            ResolveName::Reinstate => Resolution::Reinstate,
        }
    }
}

/// Where recall looks.
#[derive(JsonSchema)]
#[serde(rename_all = "snake_case")]
#[allow(dead_code)]
enum ScopeName {
    Session,
    Agent,
    Namespace,
}

/// How it went.
#[derive(JsonSchema)]
#[serde(rename_all = "snake_case")]
#[allow(dead_code)]
enum OutcomeName {
    Success,
    Failure,
}

/// How two records are related.
#[derive(JsonSchema)]
#[serde(rename_all = "snake_case")]
#[allow(dead_code)]
enum RelationName {
    DerivedFrom,
    SimilarTo,
    Supersedes,
    Contradicts,
}
