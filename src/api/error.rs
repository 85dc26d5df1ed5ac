//! The one error shape of every answer (`{"error":{"code","message"}}`, docs/http-api.md)
//! and how each runtime error maps to a status and a stable code without rewriting its
//! message, which already says how to fix the request.

use axum::Json;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use super::{ErrorBody, ErrorDetail};
use crate::Error;

/// An error answer: a status and the contract's body.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: String,
    message: String,
    /// Seconds for a `Retry-After` header, when waiting is the fix.
    pub(crate) retry_after: Option<u64>,
    /// The expected wait in milliseconds, in the body, when HTTP's whole seconds say too
    /// little (an admission refusal).
    pub(crate) retry_after_ms: Option<u64>,
}

impl ApiError {
    pub(crate) fn new(
        status: StatusCode,
        code: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        ApiError {
            status,
            code: code.into(),
            message: message.into(),
            retry_after: None,
            retry_after_ms: None,
        }
    }

    /// The status the HTTP API answers this error with.
    pub(crate) fn status(&self) -> StatusCode {
        self.status
    }

    /// The error's stable snake_case code (`invalid_k`, `not_found`, …).
    pub(crate) fn code(&self) -> &str {
        &self.code
    }

    /// What was wrong and how to fix it.
    pub(crate) fn message(&self) -> &str {
        &self.message
    }

    pub(crate) fn invalid(field: &str, reason: impl Into<String>) -> Self {
        let reason = reason.into();
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("invalid_{field}"),
            format!("invalid {field}: {reason}"),
        )
    }

    /// A body over the limit: `declared` is the length it announced, `limit` the limit
    /// when the caller knows it.
    pub(crate) fn too_large(limit: Option<usize>, declared: Option<u64>) -> Self {
        let size = match declared {
            Some(n) => format!(" declares {n} bytes, which is"),
            None => " is".to_string(),
        };
        let limit = match limit {
            Some(n) => format!("of {n} bytes ([limits] body_bytes)"),
            None => "([limits] body_bytes, 8 MiB by default)".to_string(),
        };
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            format!(
                "the request body{size} over the server's limit {limit}; send fewer events \
                 per call or shorter texts"
            ),
        )
    }

    /// A body axum could not read: too large, stalled, or cut off.
    pub(crate) fn body(rejection: BytesRejection) -> Self {
        let status = rejection.status();
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            return ApiError::too_large(None, None);
        }
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&rejection);
        while let Some(e) = cause {
            if e.is::<tower_http::timeout::TimeoutError>() {
                return ApiError::new(
                    StatusCode::REQUEST_TIMEOUT,
                    "body_timeout",
                    "the request body stopped arriving before it was complete \
                     (server.body_timeout); send the whole body without pausing",
                );
            }
            cause = e.source();
        }
        ApiError::new(status, "unreadable_body", rejection.body_text())
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        let (status, code) = match &e {
            Error::Invalid { field, .. } => {
                // `events[3].kind` → `invalid_kind`: the code names the field, the message
                // says where it is.
                let name = field.rsplit('.').next().unwrap_or(field);
                let name = name.split('[').next().unwrap_or(name);
                let code = format!("invalid_{}", name.replace([' ', '-'], "_"));
                (StatusCode::UNPROCESSABLE_ENTITY, code)
            }
            Error::DimensionMismatch { .. } => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "dimension_mismatch".into(),
            ),
            Error::TooLarge { .. } => (StatusCode::PAYLOAD_TOO_LARGE, "too_large".into()),
            Error::NotFound { .. } => (StatusCode::NOT_FOUND, "not_found".into()),
            Error::Policy(_) => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_policy".into()),
            Error::Quarantined { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "quarantined".into()),
            Error::Closed | Error::Unavailable { .. } => {
                (StatusCode::SERVICE_UNAVAILABLE, "unavailable".into())
            }
            Error::Timeout { .. } => (StatusCode::SERVICE_UNAVAILABLE, "timeout".into()),
            Error::StorageFull { .. } => (StatusCode::INSUFFICIENT_STORAGE, "storage_full".into()),
            _ => (StatusCode::INTERNAL_SERVER_ERROR, "internal".into()),
        };
        if status == StatusCode::INTERNAL_SERVER_ERROR {
            tracing::error!(error = %e, "request failed");
        }
        ApiError::new(status, code, e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code,
                message: self.message,
                retry_after_ms: self.retry_after_ms,
            },
        };
        let mut answer = (self.status, Json(body)).into_response();
        if let Some(seconds) = self.retry_after {
            answer
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        answer
    }
}

pub(crate) type ApiResult<T> = Result<T, ApiError>;

#[cfg(test)]
mod tests {
    use super::*;

    /// What an error becomes on the wire: status and code.
    fn answered(e: Error) -> (u16, String) {
        let api = ApiError::from(e);
        (api.status.as_u16(), api.code)
    }

    #[test]
    fn a_failure_inside_the_server_is_a_500_never_the_callers_fault() {
        // A ranking task that panicked, an actor that panicked, a store that failed.
        for e in [
            Error::internal("recall ranking", "task panicked"),
            Error::Panicked {
                what: "session `s`".into(),
                message: "boom".into(),
            },
            Error::storage("lmdb", "MDB_PANIC"),
        ] {
            assert_eq!(answered(e), (500, "internal".to_string()));
        }
        // The caller's own mistakes stay 4xx, named by field.
        assert_eq!(
            answered(Error::invalid("k", "0 is out of range")),
            (422, "invalid_k".to_string())
        );
    }
}
