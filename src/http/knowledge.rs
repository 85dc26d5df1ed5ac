//! The namespace's knowledge pool: search (like recall, over the knowledge tier only) and
//! the graph around a record.

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Query, State};
use serde::Deserialize;

use super::auth::Namespace;
use super::state::AppState;
use crate::api::requests::graph;
use crate::api::{
    ApiError, ApiResult, ErrorBody, Graph, KnowledgeSearchIn, RecallOut, Unauthorized, from_json,
};

/// `POST /v1/knowledge/search`: like recall, over the knowledge tier only.
#[utoipa::path(post, path = "/v1/knowledge/search", tag = "knowledge",
    request_body = KnowledgeSearchIn,
    responses(
        (status = 200, description = "Ranked knowledge records", body = RecallOut),
        (status = 400, description = "Malformed JSON", body = ErrorBody),
        Unauthorized,
        (status = 422, description = "`k` out of range", body = ErrorBody),
    ))]
pub(super) async fn post_knowledge_search(
    State(s): State<AppState>,
    ns: Namespace,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Json<RecallOut>> {
    let body: KnowledgeSearchIn = from_json("search", body)?;
    let k = s.limits.k(body.k)?;
    let result = s.rt.knowledge(&ns.0)?.search(&body.query, k).await?;
    Ok(Json(result.into()))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct GraphQuery {
    /// The record to start from (`mem-…`).
    around: Option<String>,
    /// How many edges away (0..=5, default 2).
    depth: Option<usize>,
}

/// `GET /v1/knowledge/graph?around={id}&depth=2`: the records within `depth` edges and the
/// edges among them.
#[utoipa::path(get, path = "/v1/knowledge/graph", tag = "knowledge",
    params(GraphQuery),
    responses(
        (status = 200, description = "Nodes and edges", body = Graph),
        Unauthorized,
        (status = 404, description = "No such record in this namespace", body = ErrorBody),
        (status = 422, description = "`around` missing or `depth` too deep", body = ErrorBody),
    ))]
pub(super) async fn get_knowledge_graph(
    State(s): State<AppState>,
    ns: Namespace,
    query: Result<Query<GraphQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<Json<Graph>> {
    let Query(query) = query.map_err(|e| ApiError::invalid("query", e.body_text()))?;
    let Some(around) = query.around else {
        return Err(ApiError::invalid(
            "around",
            "name the record to start from: `?around=mem-…&depth=2`",
        ));
    };
    Ok(Json(graph(&s.rt, &ns.0, &around, query.depth).await?))
}
