//! Operations routes: `/healthz`, `/metrics` (admin), and the answer to a path no route
//! serves.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use super::auth::Admin;
use super::state::AppState;
use crate::api::{ApiError, ErrorBody, Health, Unauthorized};

/// `GET /metrics`: Prometheus text. It shows every namespace's activity, so with API keys
/// configured it needs an admin key.
#[utoipa::path(get, path = "/metrics", tag = "operations",
    responses(
        (status = 200, description = "Prometheus / OpenMetrics text", content_type = "application/openmetrics-text"),
        Unauthorized,
        (status = 403, description = "A tenant key: metrics need an admin key", body = ErrorBody),
    ))]
pub(super) async fn get_metrics(State(s): State<AppState>, _admin: Admin) -> Response {
    let text = s.metrics.render(&s.rt).await;
    (
        [(
            axum::http::header::CONTENT_TYPE,
            crate::metrics::CONTENT_TYPE,
        )],
        text,
    )
        .into_response()
}

#[utoipa::path(get, path = "/healthz", tag = "operations",
    responses((status = 200, description = "The server answers", body = Health)))]
pub(super) async fn healthz() -> Json<Health> {
    Json(Health {
        status: "ok",
        version: env!("CARGO_PKG_VERSION"),
    })
}

pub(super) async fn no_route() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "no_such_route",
        "no endpoint at this path and method; docs/http-api.md lists them",
    )
}
