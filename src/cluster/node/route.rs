//! Which partition answers a request (docs/cluster-placement.md, "What has to change, by
//! kind of request"). Placed by namespace, the caller's namespace's. Placed by session:
//! a session's requests its session's partition, a memory's the partition whose id block
//! holds it, and everything namespace-wide (the knowledge pool, the session list, the
//! dashboard's pages, the policy) the namespace's *home*, the partition of its knowledge
//! pool's session — whose runtime gathers what the other partitions hold (recall, the
//! session list) through its spread (`crate::cluster::parts`).

use axum::http::{HeaderMap, Method, StatusCode};
use serde_json::Value;
use shadowbrain_runtime::{IdBlock, KNOWLEDGE_SESSION, MemoryId};

use super::super::{Placement, partition_of, session_partition};
use super::state::Layout;
use crate::api::ApiError;

impl Layout {
    fn session(&self, namespace: &str, session: &str) -> u16 {
        session_partition(namespace, session, self.partitions)
    }

    /// The partition of a namespace's knowledge pool, which answers its namespace-wide
    /// requests.
    fn home(&self, namespace: &str) -> u16 {
        self.session(namespace, KNOWLEDGE_SESSION)
    }

    /// The partition holding memory `id` (printed `mem-…`); the home for what is not an id
    /// (its runtime answers the error).
    fn memory(&self, namespace: &str, id: &str) -> u16 {
        match id.parse::<MemoryId>() {
            Ok(id) => IdBlock::partition_of(id.0, self.partitions),
            Err(_) => self.home(namespace),
        }
    }

    /// Whether `request`'s partition depends on its body (an MCP message names its tool
    /// and session there).
    pub(super) fn needs_body(&self, method: &Method, path: &str) -> bool {
        self.placement == Placement::Session && path == "/mcp" && method == Method::POST
    }

    /// The partition that answers `caller`'s request; `body` when [`Layout::needs_body`].
    pub(super) fn partition(
        &self,
        namespace: &str,
        path: &str,
        headers: &HeaderMap,
        body: Option<&[u8]>,
    ) -> Result<u16, ApiError> {
        if self.placement == Placement::Namespace {
            return Ok(partition_of(namespace, self.partitions));
        }
        let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        Ok(match segments.as_slice() {
            ["v1", "sessions", session, _] | ["ui", "sessions", session] => {
                self.session(namespace, session)
            }
            ["v1", "memories", id, ..] | ["ui", "memories", id, ..] => self.memory(namespace, id),
            ["mcp"] => match body {
                Some(body) => self.mcp(namespace, headers, body)?,
                None => self.home(namespace),
            },
            _ => self.home(namespace),
        })
    }

    /// An MCP message's partition: a tool call's by what it acts on, a resource's by its
    /// URI, anything else (the handshake, listings) the home's. A batch whose messages
    /// would go to different partitions is refused.
    fn mcp(&self, namespace: &str, headers: &HeaderMap, body: &[u8]) -> Result<u16, ApiError> {
        let default_session = headers
            .get(crate::mcp::SESSION_HEADER)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("default");
        let one = |message: &Value| -> u16 {
            let params = message.get("params");
            let arg = |name: &str| {
                params
                    .and_then(|p| p.pointer(&format!("/arguments/{name}")))
                    .and_then(Value::as_str)
            };
            match message.get("method").and_then(Value::as_str) {
                Some("tools/call") => {
                    match params.and_then(|p| p.get("name")).and_then(Value::as_str) {
                        Some("remember" | "recall" | "feedback" | "timeline" | "condense") => {
                            self.session(namespace, arg("session_id").unwrap_or(default_session))
                        }
                        Some("forget" | "mark") => match arg("id") {
                            Some(id) => self.memory(namespace, id),
                            None => self.home(namespace),
                        },
                        _ => self.home(namespace),
                    }
                }
                Some("resources/read") => {
                    let uri = params
                        .and_then(|p| p.get("uri"))
                        .and_then(Value::as_str)
                        .unwrap_or_default();
                    if let Some(id) = uri.strip_prefix("shadowbrain://memories/") {
                        self.memory(namespace, id)
                    } else if let Some(session) = uri
                        .strip_prefix("shadowbrain://sessions/")
                        .and_then(|rest| rest.strip_suffix("/timeline"))
                    {
                        self.session(namespace, session)
                    } else {
                        self.home(namespace)
                    }
                }
                _ => self.home(namespace),
            }
        };
        match serde_json::from_slice::<Value>(body) {
            Ok(Value::Array(batch)) => {
                let mut parts: Vec<u16> = batch.iter().map(one).collect();
                parts.sort_unstable();
                parts.dedup();
                match parts.as_slice() {
                    [] => Ok(self.home(namespace)),
                    [p] => Ok(*p),
                    _ => Err(ApiError::new(
                        StatusCode::BAD_REQUEST,
                        "batch_spans_partitions",
                        "this cluster places sessions on different partitions, and the \
                         messages of this batch act on more than one; send them one by one",
                    )),
                }
            }
            Ok(message) => Ok(one(&message)),
            // The home's runtime answers what is not JSON with the protocol's error.
            Err(_) => Ok(self.home(namespace)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> Layout {
        Layout {
            partitions: 8,
            placement: Placement::Session,
        }
    }

    #[test]
    fn placed_by_session_each_request_goes_where_what_it_acts_on_lives() {
        let l = layout();
        let h = HeaderMap::new();
        let at = |path: &str| l.partition("acme", path, &h, None).unwrap();
        let home = session_partition("acme", KNOWLEDGE_SESSION, 8);
        // Sessions spread: forty of them use every partition.
        let spread: std::collections::BTreeSet<u16> = (0..40)
            .map(|s| at(&format!("/v1/sessions/s{s}/events")))
            .collect();
        assert_eq!(spread.len(), 8, "{spread:?}");
        for verb in ["events", "recall", "feedback", "condense", "timeline"] {
            assert_eq!(
                at(&format!("/v1/sessions/s7/{verb}")),
                session_partition("acme", "s7", 8)
            );
        }
        assert_eq!(at("/ui/sessions/s7"), session_partition("acme", "s7", 8));
        // A memory by its id's block.
        let id = format!("{}", MemoryId(IdBlock::of_partition(5, 8).first + 3));
        assert_eq!(at(&format!("/v1/memories/{id}")), 5);
        assert_eq!(at(&format!("/v1/memories/{id}/history")), 5);
        assert_eq!(at(&format!("/ui/memories/{id}/status")), 5);
        // Namespace-wide: the home.
        for path in [
            "/v1/sessions",
            "/v1/knowledge/search",
            "/v1/knowledge/graph",
            "/v1/policy",
            "/",
            "/ui/insights",
            "/v1/memories/not-an-id",
        ] {
            assert_eq!(at(path), home, "{path}");
        }
        // Placed by namespace, all of it the namespace's.
        let whole = Layout {
            placement: Placement::Namespace,
            ..l
        };
        assert_eq!(
            whole
                .partition("acme", "/v1/sessions/s7/events", &h, None)
                .unwrap(),
            partition_of("acme", 8)
        );
    }

    #[test]
    fn an_mcp_message_goes_where_its_tool_acts() {
        let l = layout();
        let mut h = HeaderMap::new();
        let call = |tool: &str, args: &str| {
            format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"{tool}","arguments":{args}}}}}"#
            )
        };
        let at = |h: &HeaderMap, body: &str| l.partition("acme", "/mcp", h, Some(body.as_bytes()));
        let s7 = session_partition("acme", "s7", 8);
        assert_eq!(
            at(&h, &call("recall", r#"{"session_id":"s7"}"#)).unwrap(),
            s7
        );
        // The session header, else `default`.
        assert_eq!(
            at(&h, &call("remember", "{}")).unwrap(),
            session_partition("acme", "default", 8)
        );
        h.insert(crate::mcp::SESSION_HEADER, "s7".parse().unwrap());
        assert_eq!(at(&h, &call("remember", "{}")).unwrap(), s7);
        let id = format!("{}", MemoryId(IdBlock::of_partition(6, 8).first));
        assert_eq!(
            at(&h, &call("forget", &format!(r#"{{"id":"{id}"}}"#))).unwrap(),
            6
        );
        let read = format!(
            r#"{{"jsonrpc":"2.0","id":2,"method":"resources/read","params":{{"uri":"shadowbrain://memories/{id}"}}}}"#
        );
        assert_eq!(at(&h, &read).unwrap(), 6);
        let home = session_partition("acme", KNOWLEDGE_SESSION, 8);
        assert_eq!(at(&h, &call("sessions", "{}")).unwrap(), home);
        assert_eq!(at(&h, &call("knowledge_search", "{}")).unwrap(), home);
        assert_eq!(
            at(
                &h,
                r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}"#
            )
            .unwrap(),
            home
        );
        // A batch over one partition goes there; over two, it is refused.
        let same = format!(
            "[{},{}]",
            call("recall", r#"{"session_id":"s7"}"#),
            call("remember", r#"{"session_id":"s7"}"#)
        );
        assert_eq!(at(&h, &same).unwrap(), s7);
        let other = (0..100)
            .map(|s| format!("t{s}"))
            .find(|s| session_partition("acme", s, 8) != s7)
            .unwrap();
        let mixed = format!(
            "[{},{}]",
            call("recall", r#"{"session_id":"s7"}"#),
            call("recall", &format!(r#"{{"session_id":"{other}"}}"#))
        );
        let refused = at(&h, &mixed).unwrap_err();
        assert_eq!(refused.status(), StatusCode::BAD_REQUEST);
    }
}
