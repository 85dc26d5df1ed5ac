//! The OpenAPI document of every route (`GET /openapi.json`), built from the handlers'
//! annotations and the wire types of [`crate::api`].

use axum::response::{IntoResponse, Response};
use utoipa::OpenApi;

use super::{events, knowledge, memories, operations, policy, sessions};
use crate::api::{ErrorBody, ErrorDetail};

/// The OpenAPI document of every endpoint, built once from the handlers' annotations and
/// the wire types of [`crate::api`].
#[derive(OpenApi)]
#[openapi(
    info(
        title = "shadowbrain",
        description = "Long-term memory for LLM agents: the HTTP contract of the repository's \
                       docs/http-api.md. \
                       With API keys configured, every /v1 request needs \
                       `Authorization: Bearer <key>`."
    ),
    paths(
        operations::healthz, operations::get_metrics, get_openapi, events::post_events,
        sessions::post_recall, sessions::post_feedback, sessions::post_condense,
        sessions::get_timeline, sessions::get_sessions, memories::get_memory,
        memories::patch_memory, memories::delete_memory, memories::get_history,
        knowledge::post_knowledge_search, knowledge::get_knowledge_graph, policy::get_policy,
        policy::post_policy_reload
    ),
    components(schemas(ErrorBody, ErrorDetail)),
    tags(
        (name = "sessions", description = "Events, recall, feedback, condensation, timelines"),
        (name = "memories", description = "One record: read, status, archive, history"),
        (name = "knowledge", description = "The namespace's shared knowledge pool"),
        (name = "policy", description = "The active memory policy"),
        (name = "operations", description = "Health, metrics, this document"),
    )
)]
pub struct ApiDoc;

/// `GET /openapi.json`: the document, rendered once.
#[utoipa::path(get, path = "/openapi.json", tag = "operations",
    responses((status = 200, description = "The OpenAPI 3.1 document", content_type = "application/json")))]
pub(crate) async fn get_openapi() -> Response {
    static DOC: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let doc = DOC.get_or_init(|| {
        ApiDoc::openapi()
            .to_pretty_json()
            .unwrap_or_else(|e| format!("{{\"error\":\"the document could not be built: {e}\"}}"))
    });
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        doc.as_str(),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/http-api.md is the HTTP contract: every path of the OpenAPI document (what the
    /// router serves) must be named there, so a route added without its documentation
    /// fails here.
    #[test]
    fn the_http_contract_names_every_route() {
        let doc = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/http-api.md"),
        )
        .unwrap();
        let api = serde_json::to_value(super::ApiDoc::openapi()).unwrap();
        let paths = api["paths"].as_object().unwrap();
        assert!(paths.len() >= 15, "{:?}", paths.keys());
        // Each path named whole (`/v1/policy` is not named by `/v1/policy/reload`), with its
        // parameters as the code names them or a session's `{id}` as the table does.
        let named = |path: &str| {
            ["`", "?", " "]
                .iter()
                .any(|end| doc.contains(&format!("{path}{end}")))
        };
        let missing: Vec<&String> = paths
            .keys()
            .filter(|path| !named(path) && !named(&path.replace("{session_id}", "{id}")))
            .collect();
        assert!(
            missing.is_empty(),
            "docs/http-api.md does not name these routes: {missing:?}"
        )
    }
}
