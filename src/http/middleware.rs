//! What runs around every request: the body guard (declared length and type, the pause
//! between chunks), admission and the request deadline, the request span and metrics,
//! `/mcp`'s caller and protocol-session owners, and the contract's error shape for the
//! answers axum makes itself.

use std::sync::atomic::{AtomicU64, Ordering};

use axum::body::Bytes;
use axum::extract::{FromRequest, MatchedPath, Request, State};
use axum::http::header::{AUTHORIZATION, CONNECTION, CONTENT_LENGTH};
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tracing::Instrument;

use super::auth::authenticate;
use super::state::{AppState, MCP_SESSIONS_PER_KEY};
use crate::admission::WorkClass;
use crate::api::ApiError;
use crate::auth::{Verified, bearer_token, digest};
use crate::mcp::Caller;

/// In front of `/mcp`: the API key's namespace into the request (the MCP server reads it
/// per request, so a protocol session cannot outlive its key's reach), or the same 401 /
/// 429 as `/v1`.
pub(super) async fn mcp_caller(
    State(s): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    let (mut parts, body) = request.into_parts();
    match authenticate(&parts, &s) {
        Ok((namespace, _)) => {
            let ending = parts.method == axum::http::Method::DELETE;
            // Who opened a session, by the SHA-256 of its key (none when keys are off).
            let key = match parts.extensions.get::<Verified>() {
                Some(verified) => verified.key.clone(),
                None => digest(
                    bearer_token(
                        parts
                            .headers
                            .get(AUTHORIZATION)
                            .and_then(|v| v.to_str().ok()),
                    )
                    .unwrap_or_default(),
                ),
            };
            let session = parts
                .headers
                .get("mcp-session-id")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            match &session {
                // Another key's session is answered as an unknown one: its existence is
                // not this caller's to learn.
                Some(id) if s.mcp_sessions.owners().get(id).is_some_and(|k| *k != key) => {
                    return ApiError::new(
                        StatusCode::NOT_FOUND,
                        "not_found",
                        "no MCP session with this Mcp-Session-Id is open for this API key; \
                         start a new one (initialize)",
                    )
                    .into_response();
                }
                Some(_) => {}
                None if parts.method == axum::http::Method::POST
                    && s.mcp_sessions.held_by(&key).await >= MCP_SESSIONS_PER_KEY =>
                {
                    let mut e = ApiError::new(
                        StatusCode::TOO_MANY_REQUESTS,
                        "too_many_sessions",
                        format!(
                            "this API key holds {MCP_SESSIONS_PER_KEY} open MCP sessions; end \
                             one (DELETE /mcp with its Mcp-Session-Id) or reuse it, or wait for \
                             idle ones to expire"
                        ),
                    );
                    e.retry_after = Some(60);
                    return e.into_response();
                }
                None => {}
            }
            parts.extensions.insert(Caller(namespace));
            let mut answer = next.run(Request::from_parts(parts, body)).await;
            if session.is_none()
                && let Some(opened) = answer
                    .headers()
                    .get("mcp-session-id")
                    .and_then(|v| v.to_str().ok())
            {
                s.mcp_sessions.owners().insert(opened.to_string(), key);
            }
            if ending
                && answer.status().is_success()
                && let Some(id) = &session
            {
                s.mcp_sessions.owners().remove(id);
            }
            // The SDK answers a session's end (`DELETE`) 202 with no body; the Python SDK's
            // client warns on anything but 200 or 204. Nothing is pending: say 204.
            if ending && answer.status() == StatusCode::ACCEPTED {
                *answer.status_mut() = StatusCode::NO_CONTENT;
            }
            answer
        }
        Err(e) => {
            let mut answer = e.into_response();
            answer.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer"),
            );
            answer
        }
    }
}

/// The answer past `server.request_timeout` (`limit`): 503 `timeout`, the connection closed.
pub(super) fn late(limit: std::time::Duration) -> Response {
    let mut e = ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "timeout",
        format!(
            "answering took longer than server.request_timeout ({}), so the request was \
             abandoned; a write may have been stored all the same (send writes with an \
             Idempotency-Key to retry them safely); retry shortly",
            humantime::format_duration(limit)
        ),
    );
    e.retry_after = Some(1);
    // The body may be unread: the connection cannot carry another request.
    closing(e)
}

/// Answers an admitted request: on the work runtime when there is one (see [`serve`]),
/// within `server.request_timeout`; past it the work is abandoned and the answer is 503.
pub(super) async fn answer_on(
    s: &AppState,
    request: Request,
    next: Next,
    started: std::time::Instant,
) -> Response {
    // The deadline counts from when the request arrived: reading its body and waiting for
    // a slot spend it too.
    let limit = s.edge.request_timeout.saturating_sub(started.elapsed());
    let late = || late(s.edge.request_timeout);
    let Some(work) = &s.work else {
        return tokio::time::timeout(limit, next.run(request))
            .await
            .unwrap_or_else(|_| late());
    };
    // The request's span follows it, so what the handler logs names the request.
    let task = work.spawn(tracing::Instrument::in_current_span(next.run(request)));
    let abandon = task.abort_handle();
    match tokio::time::timeout(limit, task).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(e)) => {
            let panic = e.is_panic().then(|| crate::panic_message(&*e.into_panic()));
            tracing::error!(panic, "a request handler failed");
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "answering this request failed inside the server (a bug: the log has the \
                 details); the server keeps serving",
            )
            .into_response()
        }
        Err(_) => {
            abandon.abort();
            late()
        }
    }
}

/// A refusal made before the request's body was read: that body is still on the
/// connection, so it cannot carry another request. `Connection: close` says so, and the
/// client opens a fresh one for its next request.
pub(super) fn closing(e: ApiError) -> Response {
    let mut answer = e.into_response();
    answer
        .headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("close"));
    answer
}

/// `application/json` or a `+json` type, with any parameters (`; charset=utf-8`).
pub(super) fn is_json(content_type: &str) -> bool {
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
}

/// `application/x-www-form-urlencoded`, with any parameters.
pub(super) fn is_form(content_type: &str) -> bool {
    content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .eq_ignore_ascii_case("application/x-www-form-urlencoded")
}

/// Gives every error answer made inside the router the contract's shape: axum's own
/// rejections (a 405 for a method a route does not have, a path segment that is not
/// UTF-8, …) come as empty or plain-text bodies. Their text, when they have one, becomes
/// the message; the code follows the status.
pub(super) async fn errors_in_the_contract_shape(response: Response) -> Response {
    let status = response.status();
    // The dashboard's error pages are for people: HTML, shown as they are.
    let shaped = response
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json") || v.starts_with("text/html"));
    if !(status.is_client_error() || status.is_server_error()) || shaped {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    // A rejection's text is one short line; a longer body is dropped and the status's
    // name stands in for it.
    let text = axum::body::to_bytes(body, 16 << 10)
        .await
        .unwrap_or_default();
    let text = String::from_utf8_lossy(&text).trim().to_string();
    let (code, hint) = match status {
        StatusCode::METHOD_NOT_ALLOWED => (
            "method_not_allowed",
            "this path does not take that method; the Allow header lists the ones it takes \
             (see GET /openapi.json)",
        ),
        StatusCode::NOT_FOUND => ("not_found", "see GET /openapi.json for the routes"),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => (
            "unsupported_media_type",
            "send the body as JSON with `Content-Type: application/json`",
        ),
        s if s.is_server_error() => ("internal", "the server failed; the log says why"),
        _ => (
            "bad_request",
            "check the path and the query parameters against GET /openapi.json",
        ),
    };
    let message = match text.is_empty() {
        true => format!("{}: {hint}", status.canonical_reason().unwrap_or("error")),
        false => format!("{text}: {hint}"),
    };
    parts.headers.remove(axum::http::header::CONTENT_LENGTH);
    let mut answer = ApiError::new(status, code, message).into_response();
    // Keep what the original answer said beyond its body (Allow, Retry-After, …).
    for (name, value) in parts.headers.iter() {
        if name != axum::http::header::CONTENT_TYPE {
            answer.headers_mut().insert(name.clone(), value.clone());
        }
    }
    answer
}

/// Refuses a body that declares a length over the limit, or a type other than JSON,
/// before reading any of it (no `100 Continue` is sent, since hyper sends one only when the
/// body is read), and bounds the pause between the chunks of every other body to
/// `edge.body_timeout`.
pub(super) async fn guard_body(
    State(s): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    let declared = request
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if let Some(length) = declared
        && length > s.limits.max_body_bytes as u64
    {
        return closing(ApiError::too_large(
            Some(s.limits.max_body_bytes),
            Some(length),
        ));
    }
    // JSON in (docs/http-api.md): a body declared as anything else is refused unread. A body
    // without a declared type is read as JSON.
    let declared_type = request
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .map(|v| v.to_str().unwrap_or("?").to_string());
    // The dashboard's forms post as browsers do.
    let form = request.uri().path().starts_with("/ui/");
    if let Some(kind) = declared_type
        && declared.is_none_or(|n| n > 0)
        && !is_json(&kind)
        && !(form && is_form(&kind))
    {
        return closing(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            format!(
                "the body is declared as `{kind}`; this API reads JSON: send `Content-Type: \
                 application/json` (with curl: -H 'content-type: application/json')"
            ),
        ));
    }
    let timeout = s.edge.body_timeout;
    let request = request
        .map(|body| axum::body::Body::new(tower_http::timeout::TimeoutBody::new(timeout, body)));
    next.run(request).await
}

/// Admission control (`admission`): recalls and writes past `[server] max_recalls` /
/// `max_writes` in flight wait for a slot within `queue_wait`, or are answered
/// `503 overloaded` with the expected wait. Without a bound a burst queues behind the
/// cores, and every caller waits seconds instead of a few being told to come back.
pub(super) async fn admit(
    State(s): State<AppState>,
    matched: Option<MatchedPath>,
    request: Request,
    next: Next,
) -> Response {
    let route = matched.as_ref().map_or("", |m| m.as_str());
    let work = match (request.method().as_str(), route) {
        ("POST", "/v1/sessions/{session_id}/recall" | "/v1/knowledge/search")
        | ("GET", "/v1/knowledge/graph") => WorkClass::Recall,
        (
            "POST" | "PATCH" | "DELETE",
            "/v1/sessions/{session_id}/events"
            | "/v1/sessions/{session_id}/feedback"
            | "/v1/sessions/{session_id}/condense"
            | "/v1/memories/{id}",
        ) => WorkClass::Write,
        _ => return answer_on(&s, request, next, std::time::Instant::now()).await,
    };
    let started = std::time::Instant::now();
    // The body is read before a slot is taken: a client trickling its body must not hold
    // one of the few slots while it does (the connection bound and the body timeout limit
    // what it holds instead). Read whole, a refused request also leaves its connection
    // ready for the next one.
    let (parts, body) = request.into_parts();
    let mut reading = Request::new(body);
    // The body limit travels in the extensions (`DefaultBodyLimit`).
    *reading.extensions_mut() = parts.extensions.clone();
    let read = tokio::time::timeout(s.edge.request_timeout, Bytes::from_request(reading, &()));
    let body = match read.await {
        Ok(Ok(body)) => body,
        Ok(Err(rejection)) => return closing(ApiError::body(rejection)),
        Err(_) => return late(s.edge.request_timeout),
    };
    let request = Request::from_parts(parts, axum::body::Body::from(body));
    let slot = match s.admission.enter(work).await {
        Ok(slot) => slot,
        Err(e) => return e.into_response(),
    };
    let answer = answer_on(&s, request, next, started).await;
    drop(slot);
    answer
}

/// Counts every routed request by its route pattern, method and status, with its latency.
pub(super) async fn track(
    State(s): State<AppState>,
    matched: Option<MatchedPath>,
    request: Request,
    next: Next,
) -> Response {
    static NEXT_REQUEST: AtomicU64 = AtomicU64::new(1);
    let route = matched.map_or_else(|| "unmatched".to_string(), |m| m.as_str().to_string());
    let method = request.method().to_string();
    // Everything logged while the request runs (a failed write, a provider error) carries
    // its id, method and route; `RUST_LOG=shadowbrain=debug` also logs each answer.
    let span = tracing::info_span!(
        "request",
        id = NEXT_REQUEST.fetch_add(1, Ordering::Relaxed),
        method = %method,
        route = %route,
    );
    let started = std::time::Instant::now();
    let response = next.run(request).instrument(span.clone()).await;
    let status = response.status().as_u16();
    let seconds = started.elapsed().as_secs_f64();
    span.in_scope(|| tracing::debug!(status, ms = seconds * 1e3, "answered"));
    s.metrics.observe(&route, &method, status, seconds);
    response
}
