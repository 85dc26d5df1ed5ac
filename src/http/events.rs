//! `POST /v1/sessions/{id}/events`: what happened to an agent, durable before the answer,
//! safe to retry under an `Idempotency-Key`.

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};

use super::auth::Namespace;
use super::state::AppState;
use crate::MemoryId;
use crate::api::requests::events_from;
use crate::api::{ApiError, ApiResult, ErrorBody, EventsIn, Ids, Unauthorized, parse_json};
use crate::auth::hex;

/// The request header that makes a write safe to retry (see [`crate::Substrate::record_once`]).
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// The answer header saying a write was a retry of one already made: the ids are that
/// write's and nothing was stored again.
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";

/// `POST /v1/sessions/{id}/events`: one event, or `{"events":[…]}`; 201 once durable.
#[utoipa::path(post, path = "/v1/sessions/{session_id}/events", tag = "sessions",
    params(
        ("session_id" = String, Path, description = "`[A-Za-z0-9._:-]{1,128}`"),
        ("Idempotency-Key" = Option<String>, Header, description = "Makes the write safe to retry: the same request sent again with the same key within 24 hours answers the first write's ids (with `Idempotent-Replayed: true`) and stores nothing; another request with the key gets 422 `invalid_idempotency_key`. 1 to 255 visible ASCII characters, e.g. a UUID."),
    ),
    request_body = EventsIn,
    responses(
        (status = 201, description = "Durable; the ids in the order sent (a retry under an Idempotency-Key: the first write's)", body = Ids),
        (status = 400, description = "Malformed JSON", body = ErrorBody),
        Unauthorized,
        (status = 413, description = "Body, text or content over a limit", body = ErrorBody),
        (status = 422, description = "A field is invalid (`invalid_<field>`, `dimension_mismatch`), or the Idempotency-Key was used for another request (`invalid_idempotency_key`)", body = ErrorBody),
    ))]
pub(super) async fn post_events(
    State(s): State<AppState>,
    ns: Namespace,
    Path(session_id): Path<String>,
    headers: axum::http::HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    let body = body.map_err(ApiError::body)?;
    let key = headers
        .get(IDEMPOTENCY_KEY)
        .map(|key| {
            key.to_str().map_err(|_| {
                ApiError::invalid(
                    "idempotency_key",
                    "must be 1 to 255 visible ASCII characters; a UUID is a good key",
                )
            })
        })
        .transpose()?;
    let recorded = record(&s.rt, &ns.0, &session_id, key, body).await?;
    if !recorded.replayed {
        s.metrics.events_ingested(recorded.ids.len());
    }
    let ids = recorded.ids.iter().map(MemoryId::to_string).collect();
    let mut answer = (StatusCode::CREATED, Json(Ids { ids })).into_response();
    if recorded.replayed {
        answer
            .headers_mut()
            .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    }
    Ok(answer)
}

/// A write's work, from the request's body (and its `Idempotency-Key`) to the durable ids:
/// the route's, and the embedded handle's without the router ([`crate::embedded`]), so both
/// answer alike.
pub(crate) async fn record(
    rt: &crate::Runtime,
    namespace: &str,
    session_id: &str,
    key: Option<&str>,
    body: Bytes,
) -> ApiResult<crate::Recorded> {
    // A retry sends the same bytes: their digest tells it from another request that
    // reuses the key.
    let idempotency = key.map(|key| crate::Idempotency {
        key: key.to_string(),
        fingerprint: hex(&Sha256::digest(&body)),
    });
    let events = events_from(parse_json(Ok(body))?)?;
    record_read(rt, namespace, session_id, events, idempotency).await
}

/// [`record`] with the events already read (the embedded handle reads plain ones straight
/// from Python): the same write and refusals from there on.
pub(crate) async fn record_read(
    rt: &crate::Runtime,
    namespace: &str,
    session_id: &str,
    events: Vec<crate::NewMemory>,
    idempotency: Option<crate::Idempotency>,
) -> ApiResult<crate::Recorded> {
    let session = rt.session(namespace, session_id)?;
    Ok(session.record_idempotent(events, idempotency).await?)
}
