//! Requests read into the runtime's terms, for HTTP's handlers and MCP's tools alike: the
//! events of a write, a recall's request within the limits, a timeline's length, what a
//! feedback credits, which statuses a caller may set, and the answers both give the same way
//! (a history, a graph, the policy).

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::{
    ApiError, ApiResult, FeedbackIn, Graph, History, Memory, PolicyOut, RecallIn, from_value,
};
use crate::{
    Error, FeedbackTarget, Limits, NewMemory, RecallRequest, Runtime, Status, Timestamp,
    parse_rfc3339,
};

/// The events of a write's body: one event, or `{"events":[…]}`, with their RFC 3339 times
/// read. HTTP's `POST …/events` and MCP's `remember` read their events here, so both
/// refuse the same things with the same words.
pub(crate) fn events_from(mut value: Value) -> ApiResult<Vec<NewMemory>> {
    let batch = value.get("kind").is_none();
    let mut events = match value.get_mut("events") {
        Some(Value::Array(events)) if batch => std::mem::take(events),
        Some(_) if batch => {
            return Err(ApiError::invalid(
                "events",
                "`events` must be an array of events; send {\"events\":[{\"kind\":…}]}",
            ));
        }
        _ => vec![value],
    };
    for event in &mut events {
        // The contract's times are RFC 3339; the substrate counts milliseconds. A number
        // would be taken as milliseconds unchecked, so the wire refuses it.
        match event.get_mut("timestamp") {
            Some(t @ Value::String(_)) => {
                let text = t.as_str().unwrap_or_default().to_string();
                *t = json!(parse_rfc3339("timestamp", &text)?);
            }
            None | Some(Value::Null) => {}
            Some(other) => {
                return Err(ApiError::invalid(
                    "timestamp",
                    format!(
                        "{other} is not an RFC 3339 time; send a string like \
                         \"2026-05-08T13:56:00Z\""
                    ),
                ));
            }
        }
    }
    from_value("event", Value::Array(events))
}

/// A recall's body as the runtime's request, within the limits (HTTP and MCP).
pub(crate) fn recall_request(
    limits: &Limits,
    namespace: &str,
    session_id: &str,
    body: RecallIn,
) -> ApiResult<RecallRequest> {
    let mut request = RecallRequest::new(namespace, session_id, &body.query);
    request.k = limits.k(body.k)?;
    request.token_budget = limits.token_budget(body.token_budget)?;
    request.scope = body.scope.unwrap_or_default();
    request.agent_id = body.agent_id;
    request.kinds = body.kinds;
    request.since = body.since.map(|t| time("since", t)).transpose()?;
    request.until = body.until.map(|t| time("until", t)).transpose()?;
    request.include_knowledge = body.include_knowledge.unwrap_or(true);
    request.include_superseded = body.include_superseded.unwrap_or(false);
    Ok(request)
}

/// A time given as RFC 3339 text or as milliseconds since the epoch.
fn time(field: &str, value: Value) -> ApiResult<Timestamp> {
    match value {
        Value::String(text) => Ok(parse_rfc3339(field, &text)?),
        Value::Number(n) if n.as_i64().is_some() => Ok(n.as_i64().unwrap_or_default()),
        other => Err(ApiError::invalid(
            field,
            format!("{other} is not a time; write RFC 3339, e.g. `2026-05-08T13:56:00Z`"),
        )),
    }
}

/// How many records a timeline asks for: 100 by default, at most `[limits] timeline`.
pub(crate) fn timeline_limit(limits: &Limits, limit: Option<usize>) -> ApiResult<usize> {
    let limit = limit.unwrap_or(100);
    if !(1..=limits.max_timeline).contains(&limit) {
        return Err(ApiError::invalid(
            "limit",
            format!(
                "{limit} is out of range; ask for 1 to {} items",
                limits.max_timeline
            ),
        ));
    }
    Ok(limit)
}

/// What a feedback credits: a recall's memories, or memories named (HTTP and MCP).
pub(crate) fn feedback_target(body: FeedbackIn) -> ApiResult<FeedbackTarget> {
    Ok(match (body.recall_id, body.memory_ids) {
        (Some(recall), None) => FeedbackTarget::Recall(recall),
        (None, Some(ids)) => FeedbackTarget::Memories(
            ids.iter()
                .map(|id| id.parse())
                .collect::<Result<_, Error>>()?,
        ),
        _ => {
            return Err(ApiError::invalid(
                "feedback",
                "send either `recall_id` (every memory of that recall) or `memory_ids`, \
                 not both and not neither",
            ));
        }
    })
}

/// Refuses a status a caller cannot set (`archived`: archiving is its own operation, named
/// by `how_to_archive`).
pub(crate) fn settable(status: Status, how_to_archive: &str) -> ApiResult<()> {
    match status {
        Status::Pinned | Status::Obsolete | Status::Wrong | Status::Active => Ok(()),
        Status::Archived => Err(ApiError::invalid(
            "status",
            format!("set `pinned`, `obsolete`, `wrong` or `active`; {how_to_archive}"),
        )),
    }
}

/// A memory's audited changes, oldest first (HTTP and MCP).
pub(crate) async fn history(memory: &crate::MemoryHandle) -> ApiResult<History> {
    let entries = memory
        .history()
        .await?
        .into_iter()
        .map(Into::into)
        .collect();
    Ok(History { entries })
}

/// Deepest neighbourhood a graph query may ask for.
const MAX_GRAPH_DEPTH: usize = 5;

/// The records within `depth` edges of `around` (default 2) and the edges among them.
pub(crate) async fn graph(
    rt: &Runtime,
    ns: &str,
    around: &str,
    depth: Option<usize>,
) -> ApiResult<Graph> {
    let (nodes, edges) = graph_records(rt, ns, around, depth).await?;
    Ok(Graph {
        nodes: Memory::all_of(rt.substrate(), nodes)?,
        edges: edges.into_iter().map(Into::into).collect(),
    })
}

/// [`graph`] as the runtime's records and edges (what the dashboard draws).
pub(crate) async fn graph_records(
    rt: &Runtime,
    ns: &str,
    around: &str,
    depth: Option<usize>,
) -> ApiResult<(Vec<crate::MemoryRecord>, Vec<crate::Edge>)> {
    let depth = depth.unwrap_or(2);
    if depth > MAX_GRAPH_DEPTH {
        return Err(ApiError::invalid(
            "depth",
            format!("{depth} is too deep; ask for 0 to {MAX_GRAPH_DEPTH}"),
        ));
    }
    let (ids, edges) = rt.knowledge(ns)?.graph(around.parse()?, depth).await?;
    let mut nodes = Vec::with_capacity(ids.len());
    for id in ids {
        nodes.push(rt.memory(ns, id)?.get().await?);
    }
    Ok((nodes, edges))
}

/// The policy answer: its name, hash and compiled form.
pub(crate) fn policy_out(policy: &crate::policy::Policy) -> PolicyOut {
    let stamp = policy.stamp();
    PolicyOut {
        name: stamp.name,
        hash: stamp.hash,
        policy: policy.to_json(),
        namespaces: BTreeMap::new(),
    }
}
