//! Requests between nodes: a node that does not own a request's partition sends the whole
//! HTTP request (method, path, headers, body) over NATS request/reply to the partition's
//! subject, where the owner answers it with its own router and sends the whole answer back.
//! Clients need not know the topology; the owner checks the API key again.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use async_nats::client::RequestErrorKind;
use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode};
use axum::response::IntoResponse;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tower::ServiceExt;

use crate::server::ApiError;

/// Marks a request that came over NATS (never forwarded again) and, on answers, which node
/// answered it.
pub(super) const FORWARDED_BY: &str = "x-shadowbrain-forwarded-by";
/// On every answer in cluster mode: the node that answered.
pub(super) const ANSWERED_BY: &str = "x-shadowbrain-node";

/// How long one attempt of a request that may be sent again waits for its answer.
const ATTEMPT: Duration = Duration::from_secs(3);

/// A request on the wire.
#[derive(Debug, Serialize, Deserialize)]
struct WireRequest {
    method: String,
    uri: String,
    headers: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
}

/// An answer on the wire.
#[derive(Debug, Serialize, Deserialize)]
struct WireAnswer {
    status: u16,
    headers: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
}

fn headers_of(map: &HeaderMap) -> Vec<(String, Vec<u8>)> {
    map.iter()
        .map(|(k, v)| (k.as_str().to_string(), v.as_bytes().to_vec()))
        .collect()
}

fn header_map(pairs: Vec<(String, Vec<u8>)>) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (k, v) in pairs {
        if let (Ok(k), Ok(v)) = (HeaderName::try_from(k), HeaderValue::from_bytes(&v)) {
            map.append(k, v);
        }
    }
    map
}

/// The headers of an owner's answer as the client gets them: all but `Set-Cookie`. Only
/// the front's own sign-in and sign-out set cookies (`crate::server::served_by_front`), so
/// an answer from across NATS that sets one is not the owner's work: it is never handed to
/// a browser.
fn answer_headers(pairs: Vec<(String, Vec<u8>)>) -> HeaderMap {
    let mut map = header_map(pairs);
    map.remove(axum::http::header::SET_COOKIE);
    map
}

/// Forwards `request` to whoever owns `subject`'s partition, waiting through a takeover
/// (nobody answering yet) until `deadline` passes.
pub(super) async fn forward(
    client: &async_nats::Client,
    subject: String,
    node: &str,
    request: Request<Body>,
    max_body: usize,
    deadline: Duration,
) -> Response<Body> {
    let (parts, body) = request.into_parts();
    let body = match axum::body::to_bytes(body, max_body).await {
        Ok(b) => b,
        Err(_) => {
            return ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body_too_large",
                format!(
                    "the body is over limits.max_body_bytes ({max_body} bytes); send fewer \
                     or smaller events per call"
                ),
            )
            .into_response();
        }
    };
    let mut headers = parts.headers;
    headers.insert(
        HeaderName::from_static(FORWARDED_BY),
        HeaderValue::from_str(node).unwrap_or(HeaderValue::from_static("?")),
    );
    let wire = WireRequest {
        method: parts.method.as_str().to_string(),
        uri: parts.uri.to_string(),
        headers: headers_of(&headers),
        body: body.to_vec(),
    };
    let payload = bytes::Bytes::from(postcard::to_stdvec(&wire).expect("a request serialises"));
    // A request safe to send twice ([`safe_to_resend`]) is sent again when an attempt goes
    // unanswered: the owner may have stopped (a paused process keeps its subscription until
    // NATS drops it) or died holding it, while a new owner answers. Any other request gets
    // one attempt of the whole deadline, so it is never stored twice.
    let retry_unanswered = safe_to_resend(&parts.method, parts.uri.path(), &headers, &body);
    let until = Instant::now() + deadline;
    loop {
        let left = until.saturating_duration_since(Instant::now());
        let attempt = if retry_unanswered {
            left.min(ATTEMPT)
        } else {
            left
        };
        let ask = async_nats::Request::new()
            .payload(payload.clone())
            .timeout(Some(attempt.max(Duration::from_millis(1))));
        match client.send_request(subject.clone(), ask).await {
            Ok(message) => match postcard::from_bytes::<WireAnswer>(&message.payload) {
                Ok(answer) => {
                    let mut response = Response::new(Body::from(answer.body));
                    *response.status_mut() =
                        StatusCode::from_u16(answer.status).unwrap_or(StatusCode::BAD_GATEWAY);
                    *response.headers_mut() = answer_headers(answer.headers);
                    return response;
                }
                Err(e) => {
                    return unavailable(format!(
                        "the partition's owner answered something unreadable ({e}); is every \
                         node on the same shadowbrain version?"
                    ));
                }
            },
            Err(e) if e.kind() == RequestErrorKind::NoResponders && !left.is_zero() => {
                // The partition is between owners: the new one subscribes once it caught up.
                tokio::time::sleep(Duration::from_millis(50).min(left)).await;
            }
            Err(e)
                if e.kind() == RequestErrorKind::TimedOut
                    && retry_unanswered
                    && Instant::now() < until => {}
            Err(e) if e.kind() == RequestErrorKind::MaxPayloadExceeded => {
                return ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "body_too_large",
                    "the request is larger than the NATS servers' max_payload, so it cannot \
                     be forwarded to its partition's owner; send fewer or smaller events per \
                     call, or raise max_payload on the NATS servers",
                )
                .into_response();
            }
            Err(e) => {
                return unavailable(format!(
                    "the partition's owner did not answer within {} ({e})",
                    humantime::format_duration(deadline)
                ));
            }
        }
        if Instant::now() >= until {
            return unavailable(format!(
                "no node took the partition over within {}",
                humantime::format_duration(deadline)
            ));
        }
    }
}

/// Whether a request may be sent again when an attempt goes unanswered (its owner may have
/// died holding it, having stored its effects or not) with nothing stored beyond what one
/// delivery stores and the same answer: a read (`GET`; recall and knowledge search, whose
/// own writes — reinforcement and the recall's memory for feedback — are best effort by
/// design, see `Substrate::recall`), a change that is the same however often it is made
/// (setting a memory's status, archiving it; not settling a conflict, which a second time
/// is refused as settled), a write under an Idempotency-Key, and the MCP messages
/// [`crate::mcp::safe_to_resend`] names. Anything else gets one attempt: a second one could
/// store it twice.
fn safe_to_resend(method: &Method, path: &str, headers: &HeaderMap, body: &[u8]) -> bool {
    let session_route = |verb: &str| {
        path.strip_prefix("/v1/sessions/")
            .and_then(|rest| rest.strip_suffix(verb))
            .is_some_and(|id| !id.is_empty() && !id.contains('/'))
    };
    let memory_route = path
        .strip_prefix("/v1/memories/")
        .is_some_and(|id| !id.is_empty() && !id.contains('/'));
    match *method {
        Method::GET | Method::HEAD => true,
        _ if headers.contains_key(crate::server::IDEMPOTENCY_KEY) => true,
        Method::POST if path == "/mcp" => crate::mcp::safe_to_resend(body),
        Method::POST => session_route("/recall") || path == "/v1/knowledge/search",
        Method::DELETE => memory_route,
        Method::PATCH => {
            memory_route
                && serde_json::from_slice::<serde_json::Value>(body)
                    .is_ok_and(|b| b.get("resolve").is_none())
        }
        _ => false,
    }
}

fn unavailable(why: String) -> Response<Body> {
    let mut e = ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "partition_unavailable",
        format!("{why}; retry shortly (with an Idempotency-Key, a retried write is stored once)"),
    );
    e.retry_after = Some(1);
    e.into_response()
}

/// Answers the requests forwarded to `subject` with `router`, until the subscription ends
/// (it is dropped when the partition is given up).
pub(super) async fn answer_forwarded(
    client: async_nats::Client,
    mut requests: async_nats::Subscriber,
    router: Router,
    node: String,
) {
    while let Some(message) = requests.next().await {
        let Some(reply) = message.reply.clone() else {
            continue;
        };
        let (client, router, node) = (client.clone(), router.clone(), node.clone());
        tokio::spawn(async move {
            let answer = match postcard::from_bytes::<WireRequest>(&message.payload) {
                Ok(wire) => answer_one(wire, router, &node).await,
                Err(e) => WireAnswer {
                    status: 400,
                    headers: vec![("content-type".into(), b"application/json".to_vec())],
                    body: format!(
                        "{{\"error\":{{\"code\":\"bad_forward\",\"message\":\"a forwarded request \
                         was unreadable ({e}); is every node on the same version?\"}}}}"
                    )
                    .into_bytes(),
                },
            };
            let payload = postcard::to_stdvec(&answer).expect("an answer serialises");
            if let Err(e) = client.publish(reply, payload.into()).await {
                tracing::warn!(error = %e, "could not send a forwarded request's answer");
            }
        });
    }
}

async fn answer_one(wire: WireRequest, router: Router, node: &str) -> WireAnswer {
    let mut request = Request::new(Body::from(wire.body));
    *request.method_mut() = Method::from_bytes(wire.method.as_bytes()).unwrap_or(Method::GET);
    *request.uri_mut() = wire.uri.parse().unwrap_or_default();
    *request.headers_mut() = header_map(wire.headers);
    let response = match router.oneshot(request).await {
        Ok(r) => r,
        Err(never) => match never {},
    };
    let (mut parts, body) = response.into_parts();
    parts.headers.insert(
        HeaderName::from_static(ANSWERED_BY),
        HeaderValue::from_str(node).unwrap_or(HeaderValue::from_static("?")),
    );
    // Answers are whole JSON documents or an MCP call's finished event stream.
    let body = axum::body::to_bytes(body, usize::MAX)
        .await
        .map(|b| b.to_vec())
        .unwrap_or_default();
    parts.headers.remove(axum::http::header::CONTENT_LENGTH);
    WireAnswer {
        status: parts.status.as_u16(),
        headers: headers_of(&parts.headers),
        body,
    }
}

/// Sends `payload` to every node listening on `subject` and gathers the answers of
/// `members` (the live nodes, this one included; `node_of` says whose each answer is),
/// waiting `patience` at most: the answers got, keyed by node. An error only when NATS
/// itself cannot be used.
pub(super) async fn gather<A: serde::de::DeserializeOwned, T>(
    client: &async_nats::Client,
    subject: &str,
    payload: Vec<u8>,
    members: &[String],
    patience: Duration,
    node_of: impl Fn(A) -> (String, T),
) -> Result<BTreeMap<String, T>, String> {
    let inbox = client.new_inbox();
    let mut replies = client
        .subscribe(inbox.clone())
        .await
        .map_err(|e| e.to_string())?;
    client
        .publish_with_reply(subject.to_string(), inbox, payload.into())
        .await
        .map_err(|e| e.to_string())?;
    let deadline = tokio::time::Instant::now() + patience;
    let mut got = BTreeMap::new();
    while members.iter().any(|m| !got.contains_key(m)) {
        match tokio::time::timeout_at(deadline, replies.next()).await {
            Ok(Some(message)) => match serde_json::from_slice::<A>(&message.payload) {
                Ok(answer) => {
                    let (node, answer) = node_of(answer);
                    got.insert(node, answer);
                }
                Err(e) => tracing::warn!(error = %e, subject, "an unreadable answer from a node"),
            },
            Ok(None) | Err(_) => break,
        }
    }
    Ok(got)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resend(method: Method, path: &str, body: &str) -> bool {
        safe_to_resend(&method, path, &HeaderMap::new(), body.as_bytes())
    }

    #[test]
    fn a_forwarded_answer_never_sets_a_cookie() {
        let headers = answer_headers(vec![
            ("content-type".into(), b"application/json".to_vec()),
            ("set-cookie".into(), b"sb_session=forged; Path=/".to_vec()),
            ("Set-Cookie".into(), b"another=1".to_vec()),
            ("x-shadowbrain-node".into(), b"node1".to_vec()),
        ]);
        assert!(headers.get(axum::http::header::SET_COOKIE).is_none());
        assert_eq!(headers["content-type"], "application/json");
        assert_eq!(headers["x-shadowbrain-node"], "node1");
    }

    #[test]
    fn only_what_one_delivery_equals_is_sent_again() {
        assert!(resend(Method::GET, "/v1/sessions/s/timeline", ""));
        assert!(resend(Method::POST, "/v1/sessions/s/recall", "{}"));
        assert!(resend(Method::POST, "/v1/knowledge/search", "{}"));
        assert!(!resend(Method::POST, "/v1/sessions/s/events", "{}"));
        assert!(!resend(Method::POST, "/v1/sessions/s/feedback", "{}"));
        assert!(!resend(Method::POST, "/v1/sessions/s/condense", "{}"));
        assert!(!resend(Method::POST, "/v1/sessions/a/b/recall", "{}"));
        assert!(resend(Method::DELETE, "/v1/memories/mem-1", ""));
        assert!(resend(
            Method::PATCH,
            "/v1/memories/mem-1",
            r#"{"status":"wrong"}"#
        ));
        assert!(!resend(
            Method::PATCH,
            "/v1/memories/mem-1",
            r#"{"resolve":"keep"}"#
        ));
        let mut keyed = HeaderMap::new();
        keyed.insert(
            crate::server::IDEMPOTENCY_KEY,
            HeaderValue::from_static("k-1"),
        );
        assert!(safe_to_resend(
            &Method::POST,
            "/v1/sessions/s/events",
            &keyed,
            b"{}"
        ));

        let call = |tool: &str| {
            format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"{tool}"}}}}"#
            )
        };
        for tool in [
            "recall",
            "timeline",
            "sessions",
            "knowledge_search",
            "knowledge_graph",
        ] {
            assert!(resend(Method::POST, "/mcp", &call(tool)), "{tool}");
        }
        for tool in ["forget", "mark"] {
            assert!(resend(Method::POST, "/mcp", &call(tool)), "{tool}");
        }
        for tool in ["remember", "feedback", "condense"] {
            assert!(!resend(Method::POST, "/mcp", &call(tool)), "{tool}");
        }
        let batch = format!("[{},{}]", call("recall"), call("remember"));
        assert!(!resend(Method::POST, "/mcp", &batch));
        assert!(resend(
            Method::POST,
            "/mcp",
            r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}"#
        ));
    }
}
