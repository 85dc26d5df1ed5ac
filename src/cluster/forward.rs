//! Requests between nodes: a node that does not own a request's partition sends the HTTP
//! request (method, path, headers, body) over NATS request/reply to the partition's
//! subject, where the owner answers it with its own router and sends the whole answer back.
//! Clients need not know the topology.
//!
//! No credential crosses NATS: the node the client reached checks its key or sign-in (with
//! the failed-key throttle), removes `Authorization` and `Cookie`, and sends who the caller
//! is ([`Verified`]) sealed under the cluster secret with a fresh nonce and the time
//! ([`super::seal`]). The owner believes only a request whose seal verifies, once; its
//! answer is sealed to that nonce, and the front hands on only an answer whose seal does.

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

use super::seal::{self, Kind, Sealer, SeenNonces};
use crate::api::ApiError;
use crate::auth::Verified;

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
    /// Who sent it, as the front verified.
    caller: Verified,
    /// Fresh per attempt: the answer is sealed to it, and the owner answers it once.
    nonce: [u8; 16],
    /// When the front sealed it (Unix ms): the owner refuses stale ones.
    issued: u64,
}

/// The headers that carry a client's credentials: the front checked them, and they never
/// go on the wire.
const CREDENTIALS: [HeaderName; 2] = [
    axum::http::header::AUTHORIZATION,
    axum::http::header::COOKIE,
];

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
/// the front's own sign-in and sign-out set cookies (`crate::http::dashboard::served_by_front`), so
/// an answer from across NATS that sets one is not the owner's work: it is never handed to
/// a browser.
fn answer_headers(pairs: Vec<(String, Vec<u8>)>) -> HeaderMap {
    let mut map = header_map(pairs);
    map.remove(axum::http::header::SET_COOKIE);
    map
}

/// What forwarding needs of its node: the NATS client, its name, the seals, the largest
/// body and how long to wait through a takeover.
pub(super) struct Forwarder<'a> {
    pub(super) client: &'a async_nats::Client,
    pub(super) node: &'a str,
    pub(super) sealer: &'a Sealer,
    pub(super) max_body: usize,
    pub(super) deadline: Duration,
}

/// Forwards `request` of `caller` to whoever owns `subject`'s partition, waiting through a
/// takeover (nobody answering yet) until the deadline passes.
pub(super) async fn forward(
    via: &Forwarder<'_>,
    subject: String,
    caller: Verified,
    request: Request<Body>,
) -> Response<Body> {
    let Forwarder {
        client,
        node,
        sealer,
        max_body,
        deadline,
    } = *via;
    let (parts, body) = request.into_parts();
    let body = match axum::body::to_bytes(body, max_body).await {
        Ok(b) => b,
        Err(_) => return too_large(max_body),
    };
    let mut headers = parts.headers;
    for name in CREDENTIALS {
        headers.remove(name);
    }
    headers.insert(
        HeaderName::from_static(FORWARDED_BY),
        HeaderValue::from_str(node).unwrap_or(HeaderValue::from_static("?")),
    );
    let mut wire = WireRequest {
        method: parts.method.as_str().to_string(),
        uri: parts.uri.to_string(),
        headers: headers_of(&headers),
        body: body.to_vec(),
        caller,
        nonce: [0; 16],
        issued: 0,
    };
    // A request safe to send twice ([`safe_to_resend`]) is sent again when an attempt goes
    // unanswered: the owner may have stopped (a paused process keeps its subscription until
    // NATS drops it) or died holding it, while a new owner answers. Any other request gets
    // one attempt of the whole deadline, so it is never stored twice.
    let retry_unanswered = safe_to_resend(&parts.method, parts.uri.path(), &headers, &body);
    let asked = ask_owner(
        client,
        &subject,
        deadline,
        retry_unanswered,
        |nonce, issued| {
            wire.nonce = nonce;
            wire.issued = issued;
            sealer.seal(
                Kind::Request,
                &[subject.as_bytes()],
                &postcard::to_stdvec(&wire).expect("a request serialises"),
            )
        },
    )
    .await;
    let (message, nonce) = match asked {
        Ok(answered) => answered,
        Err(Unanswered::Failed(e)) if e.kind() == RequestErrorKind::MaxPayloadExceeded => {
            return ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body_too_large",
                "the request is larger than the NATS servers' max_payload, so it cannot be \
                 forwarded to its partition's owner; send fewer or smaller events per call, \
                 or raise max_payload on the NATS servers",
            )
            .into_response();
        }
        Err(Unanswered::Failed(e)) => {
            return unavailable(format!(
                "the partition's owner did not answer within {} ({e})",
                humantime::format_duration(deadline)
            ));
        }
        Err(Unanswered::NoOwner) => {
            return unavailable(format!(
                "no node took the partition over within {}",
                humantime::format_duration(deadline)
            ));
        }
    };
    let opened = sealer
        .open(Kind::Answer, &[&nonce], &message.payload)
        .map_err(|e| e.to_string())
        .and_then(|body| {
            postcard::from_bytes::<WireAnswer>(body).map_err(|e| {
                format!(
                    "the partition's owner answered something unreadable ({e}); is every \
                     node on the same shadowbrain version?"
                )
            })
        });
    match opened {
        Ok(answer) => {
            let mut response = Response::new(Body::from(answer.body));
            *response.status_mut() =
                StatusCode::from_u16(answer.status).unwrap_or(StatusCode::BAD_GATEWAY);
            *response.headers_mut() = answer_headers(answer.headers);
            response
        }
        Err(why) => {
            tracing::warn!(subject, why, "refusing the answer to a forwarded request");
            ApiError::new(
                StatusCode::BAD_GATEWAY,
                "bad_forward_answer",
                format!(
                    "{why}; the answer was not handed on. Check that every node has the same \
                     cluster secret (secret_env) and version, and that only nodes may answer \
                     on the cluster's subjects (docs/cluster.md, \"Securing the cluster\")"
                ),
            )
            .into_response()
        }
    }
}

/// Why [`ask_owner`] got no answer.
pub(super) enum Unanswered {
    /// NATS said why (the owner did not answer in time, the payload is too large …).
    Failed(async_nats::RequestError),
    /// Nobody answered on the subject until the deadline: no node owned the partition.
    NoOwner,
}

/// Sends a sealed request to whoever answers `subject` (a partition's owner), waiting
/// through a takeover until `deadline`: the answer and the nonce it must be sealed to.
/// Each attempt is a new request — `sealed(nonce, issued)` makes its payload with a fresh
/// nonce and time. While nobody answers on the subject (the partition is between owners:
/// the new one subscribes once it caught up) it is sent again; an attempt that goes
/// unanswered is sent again only when `repeatable` (the owner may have stopped, or died
/// holding it, while a new owner answers), else it has the whole deadline, so it is never
/// stored twice.
pub(super) async fn ask_owner(
    client: &async_nats::Client,
    subject: &str,
    deadline: Duration,
    repeatable: bool,
    mut sealed: impl FnMut([u8; 16], u64) -> Vec<u8>,
) -> Result<(async_nats::Message, [u8; 16]), Unanswered> {
    let until = Instant::now() + deadline;
    loop {
        let left = until.saturating_duration_since(Instant::now());
        let attempt = match repeatable {
            true => left.min(ATTEMPT),
            false => left,
        };
        let nonce = seal::nonce();
        let request = async_nats::Request::new()
            .payload(sealed(nonce, seal::now_ms()).into())
            .timeout(Some(attempt.max(Duration::from_millis(1))));
        match client.send_request(subject.to_string(), request).await {
            Ok(message) => return Ok((message, nonce)),
            Err(e) if e.kind() == RequestErrorKind::NoResponders && !left.is_zero() => {
                tokio::time::sleep(Duration::from_millis(50).min(left)).await;
            }
            Err(e)
                if e.kind() == RequestErrorKind::TimedOut
                    && repeatable
                    && Instant::now() < until => {}
            Err(e) => return Err(Unanswered::Failed(e)),
        }
        if Instant::now() >= until {
            return Err(Unanswered::NoOwner);
        }
    }
}

/// The answer to a body over `limits.max_body_bytes`.
pub(super) fn too_large(max_body: usize) -> Response<Body> {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "body_too_large",
        format!(
            "the body is over limits.max_body_bytes ({max_body} bytes); send fewer or smaller \
             events per call"
        ),
    )
    .into_response()
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
        _ if headers.contains_key(crate::http::IDEMPOTENCY_KEY) => true,
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

/// What answering forwarded requests needs: the NATS client, the node's name, its seals and
/// the nonces already answered.
#[derive(Clone)]
pub(super) struct Answerer {
    pub(super) client: async_nats::Client,
    pub(super) node: String,
    pub(super) sealer: std::sync::Arc<Sealer>,
    pub(super) seen: std::sync::Arc<SeenNonces>,
}

/// Answers the requests forwarded to `requests`' subject with `router`, until the
/// subscription ends (it is dropped when the partition is given up). A request whose seal
/// does not verify, or that is stale or answered already, is not served: its sender gets an
/// answer it cannot verify either, and the refusal is logged here.
pub(super) async fn answer_forwarded(
    with: Answerer,
    mut requests: async_nats::Subscriber,
    router: Router,
) {
    while let Some(message) = requests.next().await {
        let Some(reply) = message.reply.clone() else {
            continue;
        };
        let (with, router) = (with.clone(), router.clone());
        tokio::spawn(async move {
            let opened = with
                .sealer
                .open(
                    Kind::Request,
                    &[message.subject.as_bytes()],
                    &message.payload,
                )
                .map_err(|e| e.to_string())
                .and_then(|body| {
                    postcard::from_bytes::<WireRequest>(body).map_err(|e| {
                        format!(
                            "a forwarded request was unreadable ({e}); is every node on the \
                             same version?"
                        )
                    })
                })
                .and_then(|wire| {
                    with.seen
                        .admit(wire.nonce, wire.issued, seal::now_ms())
                        .map(|()| wire)
                });
            let payload = match opened {
                Ok(wire) => {
                    let nonce = wire.nonce;
                    let answer = answer_one(wire, router, &with.node).await;
                    let body = postcard::to_stdvec(&answer).expect("an answer serialises");
                    with.sealer.seal(Kind::Answer, &[&nonce], &body)
                }
                Err(why) => {
                    tracing::warn!(subject = %message.subject, why, "refusing a forwarded request");
                    b"refused".to_vec()
                }
            };
            if let Err(e) = with.client.publish(reply, payload.into()).await {
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
    for name in CREDENTIALS {
        request.headers_mut().remove(name);
    }
    // Who the caller is: what the front verified, never a header.
    request.extensions_mut().insert(wire.caller);
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
    sealer: &Sealer,
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
    let payload = sealer.seal(Kind::Ask, &[subject.as_bytes(), inbox.as_bytes()], &payload);
    client
        .publish_with_reply(subject.to_string(), inbox.clone(), payload.into())
        .await
        .map_err(|e| e.to_string())?;
    let deadline = tokio::time::Instant::now() + patience;
    let mut got = BTreeMap::new();
    while members.iter().any(|m| !got.contains_key(m)) {
        match tokio::time::timeout_at(deadline, replies.next()).await {
            Ok(Some(message)) => {
                let Ok(body) = sealer.open(Kind::Reply, &[inbox.as_bytes()], &message.payload)
                else {
                    tracing::warn!(subject, "an answer without the cluster's seal; ignored");
                    continue;
                };
                match serde_json::from_slice::<A>(body) {
                    Ok(answer) => {
                        let (node, answer) = node_of(answer);
                        got.insert(node, answer);
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, subject, "an unreadable answer from a node")
                    }
                }
            }
            Ok(None) | Err(_) => break,
        }
    }
    Ok(got)
}

/// The body of an ask [`gather`] sent (`message`, to be answered on `reply`), once its seal
/// verified.
pub(super) fn open_ask<'a>(
    sealer: &Sealer,
    message: &'a async_nats::Message,
    reply: &async_nats::Subject,
) -> Result<&'a [u8], seal::Refused> {
    sealer.open(
        Kind::Ask,
        &[message.subject.as_bytes(), reply.as_bytes()],
        &message.payload,
    )
}

/// An answer to an ask, sealed for the asker's `reply` subject.
pub(super) fn seal_reply(sealer: &Sealer, reply: &async_nats::Subject, body: &[u8]) -> Vec<u8> {
    sealer.seal(Kind::Reply, &[reply.as_bytes()], body)
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
            crate::http::IDEMPOTENCY_KEY,
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
