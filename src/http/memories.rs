//! One record's routes: read it, set its status or settle what `[updates]` found about it,
//! archive it, and its history.

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};

use super::auth::Namespace;
use super::state::AppState;
use crate::MemoryId;
use crate::api::requests::{history, settable};
use crate::api::{
    ApiError, ApiResult, ErrorBody, History, Memory, StatusIn, Unauthorized, from_json,
};

/// `GET /v1/memories/{id}`.
#[utoipa::path(get, path = "/v1/memories/{id}", tag = "memories",
    params(("id" = String, Path, description = "`mem-…`")),
    responses(
        (status = 200, description = "The record", body = Memory),
        Unauthorized,
        (status = 404, description = "No such record in this namespace", body = ErrorBody),
        (status = 422, description = "Not a `mem-…` id", body = ErrorBody),
    ))]
pub(super) async fn get_memory(
    State(s): State<AppState>,
    ns: Namespace,
    Path(id): Path<String>,
) -> ApiResult<Json<Memory>> {
    let id: MemoryId = id.parse()?;
    let memory = s.rt.memory(&ns.0, id)?;
    let record = memory.get().await?;
    let chain = memory.chain().await?;
    Ok(Json(Memory::from(record).with_chain(chain)))
}

/// Who changed a record, in its history.
const BY_API: &str = "api";

/// `PATCH /v1/memories/{id}`: `{"status":"pinned"|"obsolete"|"wrong"|"active",
/// "reason":"…"}` (the reason is optional and goes into the history), or
/// `{"resolve":"keep"|"dismiss"|"reinstate","reason":"…"}` to settle what the `[updates]`
/// detection found about it.
#[utoipa::path(patch, path = "/v1/memories/{id}", tag = "memories",
    params(("id" = String, Path, description = "`mem-…`")),
    request_body = StatusIn,
    responses(
        (status = 200, description = "The record with its new status", body = Memory),
        (status = 400, description = "Malformed JSON", body = ErrorBody),
        Unauthorized,
        (status = 404, description = "No such record in this namespace", body = ErrorBody),
        (status = 422, description = "Not a status that can be set, or nothing to resolve", body = ErrorBody),
    ))]
pub(super) async fn patch_memory(
    State(s): State<AppState>,
    ns: Namespace,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Json<Memory>> {
    let body: StatusIn = from_json("status", body)?;
    let memory = s.rt.memory(&ns.0, id.parse()?)?;
    let record = match (body.status, body.resolve) {
        (Some(status), None) => {
            settable(status, "archive with DELETE")?;
            memory
                .set_status_because(status, body.reason, BY_API)
                .await?
        }
        (None, Some(resolve)) => {
            memory.resolve(resolve.into(), body.reason, BY_API).await?;
            memory.get().await?
        }
        _ => {
            return Err(ApiError::invalid(
                "status",
                "send either `status` (pinned, obsolete, wrong or active) or `resolve` \
                 (keep, dismiss or reinstate), not both and not neither",
            ));
        }
    };
    let chain = memory.chain().await?;
    Ok(Json(Memory::from(record).with_chain(chain)))
}

/// `DELETE /v1/memories/{id}`: archives it (a soft delete) and answers the record.
#[utoipa::path(delete, path = "/v1/memories/{id}", tag = "memories",
    params(("id" = String, Path, description = "`mem-…`")),
    responses(
        (status = 200, description = "The archived record", body = Memory),
        Unauthorized,
        (status = 404, description = "No such record in this namespace", body = ErrorBody),
    ))]
pub(super) async fn delete_memory(
    State(s): State<AppState>,
    ns: Namespace,
    Path(id): Path<String>,
) -> ApiResult<Json<Memory>> {
    let memory = s.rt.memory(&ns.0, id.parse()?)?;
    let record = memory.archive(BY_API).await?;
    Ok(Json(
        Memory::all_of(s.rt.substrate(), vec![record])?.remove(0),
    ))
}

/// `GET /v1/memories/{id}/history`.
#[utoipa::path(get, path = "/v1/memories/{id}/history", tag = "memories",
    params(("id" = String, Path, description = "`mem-…`")),
    responses(
        (status = 200, description = "Every audited change, oldest first", body = History),
        Unauthorized,
        (status = 404, description = "No such record in this namespace", body = ErrorBody),
    ))]
pub(super) async fn get_history(
    State(s): State<AppState>,
    ns: Namespace,
    Path(id): Path<String>,
) -> ApiResult<Json<History>> {
    let memory = s.rt.memory(&ns.0, id.parse()?)?;
    Ok(Json(history(&memory).await?))
}
