//! A session's routes beyond its events: recall, feedback, condensation, its timeline, and
//! the namespace's list of sessions.

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, Query, State};
use serde::Deserialize;

use super::auth::Namespace;
use super::state::AppState;
use crate::api::requests::{feedback_target, recall_request, timeline_limit};
use crate::api::{
    ApiError, ApiResult, CondenseOut, ErrorBody, FeedbackIn, Memory, RecallIn, RecallOut, Sessions,
    Timeline, Unauthorized, Updated, from_json,
};

/// `POST /v1/sessions/{id}/recall`.
#[utoipa::path(post, path = "/v1/sessions/{session_id}/recall", tag = "sessions",
    params(("session_id" = String, Path, description = "`[A-Za-z0-9._:-]{1,128}`")),
    request_body = RecallIn,
    responses(
        (status = 200, description = "Ranked, explained memories and a prompt-ready context", body = RecallOut),
        (status = 400, description = "Malformed JSON", body = ErrorBody),
        Unauthorized,
        (status = 422, description = "`k`, `token_budget`, `scope`, a time or the session id is invalid", body = ErrorBody),
    ))]
pub(super) async fn post_recall(
    State(s): State<AppState>,
    ns: Namespace,
    Path(session_id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Json<RecallOut>> {
    let body: RecallIn = from_json("recall", body)?;
    let answer = recall(&s.rt, &s.limits, &ns.0, &session_id, body).await?;
    s.metrics.recall();
    Ok(Json(answer))
}

/// A recall's work, from the request's body (read) to the answer: the route's, and the
/// embedded handle's without the router ([`crate::embedded`]), so both answer alike.
pub(crate) async fn recall(
    rt: &crate::Runtime,
    limits: &crate::Limits,
    namespace: &str,
    session_id: &str,
    body: RecallIn,
) -> ApiResult<RecallOut> {
    let session = rt.session(namespace, session_id)?;
    let request = recall_request(limits, namespace, session_id, body)?;
    Ok(session.recall_with(request).await?.into())
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct TimelineQuery {
    /// How many records (1..=1000, default 100).
    limit: Option<usize>,
    /// The next page: the records older than this one (the last id of the previous page).
    before: Option<String>,
}

/// `GET /v1/sessions/{id}/timeline?limit=&before=`: newest first.
#[utoipa::path(get, path = "/v1/sessions/{session_id}/timeline", tag = "sessions",
    params(("session_id" = String, Path, description = "`[A-Za-z0-9._:-]{1,128}`"), TimelineQuery),
    responses(
        (status = 200, description = "Records, newest first", body = Timeline),
        Unauthorized,
        (status = 422, description = "`limit` out of range, a bad session id, or `before` not a record of the session", body = ErrorBody),
    ))]
pub(super) async fn get_timeline(
    State(s): State<AppState>,
    ns: Namespace,
    Path(session_id): Path<String>,
    query: Result<Query<TimelineQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<Json<Timeline>> {
    let Query(query) = query.map_err(|e| ApiError::invalid("query", e.body_text()))?;
    let limit = timeline_limit(&s.limits, query.limit)?;
    let before = query
        .before
        .map(|id| {
            id.parse::<crate::MemoryId>().map_err(|_| {
                ApiError::invalid(
                    "before",
                    format!(
                        "`{id}` is not a memory id (`mem-` and 8 hex digits); pass the id of \
                         the last record of the previous page"
                    ),
                )
            })
        })
        .transpose()?;
    let session = s.rt.session(&ns.0, &session_id)?;
    let items = Memory::all_of(
        s.rt.substrate(),
        session.timeline_before(limit, before).await?,
    )?;
    Ok(Json(Timeline { items }))
}

/// `POST /v1/sessions/{id}/feedback`.
#[utoipa::path(post, path = "/v1/sessions/{session_id}/feedback", tag = "sessions",
    params(("session_id" = String, Path, description = "`[A-Za-z0-9._:-]{1,128}`")),
    request_body = FeedbackIn,
    responses(
        (status = 200, description = "Utility and strength updated", body = Updated),
        (status = 400, description = "Malformed JSON", body = ErrorBody),
        Unauthorized,
        (status = 404, description = "Unknown recall or memory", body = ErrorBody),
        (status = 422, description = "Neither or both of `recall_id` and `memory_ids`, or a bad outcome", body = ErrorBody),
    ))]
pub(super) async fn post_feedback(
    State(s): State<AppState>,
    ns: Namespace,
    Path(session_id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Json<Updated>> {
    let body: FeedbackIn = from_json("feedback", body)?;
    let outcome = body.outcome;
    let target = feedback_target(body)?;
    let session = s.rt.session(&ns.0, &session_id)?;
    let report = session.feedback(target, outcome).await?;
    Ok(Json(Updated {
        updated: report.updated,
    }))
}

/// `POST /v1/sessions/{id}/condense`: the condensed record's id, or `null`.
#[utoipa::path(post, path = "/v1/sessions/{session_id}/condense", tag = "sessions",
    params(("session_id" = String, Path, description = "`[A-Za-z0-9._:-]{1,128}`")),
    responses(
        (status = 200, description = "The condensed record, or null", body = CondenseOut),
        Unauthorized,
        (status = 422, description = "A bad session id", body = ErrorBody),
    ))]
pub(super) async fn post_condense(
    State(s): State<AppState>,
    ns: Namespace,
    Path(session_id): Path<String>,
) -> ApiResult<Json<CondenseOut>> {
    let session = s.rt.session(&ns.0, &session_id)?;
    let condensed = session.condense().await?;
    Ok(Json(CondenseOut {
        memory_id: condensed.map(|c| c.id.to_string()),
    }))
}

/// `GET /v1/sessions`.
#[utoipa::path(get, path = "/v1/sessions", tag = "sessions",
    responses(
        (status = 200, description = "The namespace's sessions", body = Sessions),
        Unauthorized,
    ))]
pub(super) async fn get_sessions(
    State(s): State<AppState>,
    ns: Namespace,
) -> ApiResult<Json<Sessions>> {
    let sessions =
        s.rt.sessions(&ns.0)
            .await?
            .into_iter()
            .map(Into::into)
            .collect();
    Ok(Json(Sessions { sessions }))
}
