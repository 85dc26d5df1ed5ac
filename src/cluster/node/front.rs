//! The front router every request enters: the dashboard's own pages, a node's status and
//! health, and every other request answered by the partition's owned runtime here or
//! forwarded, sealed, to the node that owns it.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderName, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use tower::ServiceExt;

use super::super::forward::{self, ANSWERED_BY};
use super::state::*;
use crate::api::ApiError;
use crate::auth::Verified;

/// Every request but `/healthz` and `/cluster`: answered by this node's runtime of the
/// caller's partition, or forwarded to its owner.
pub(super) async fn front(State(node): State<Arc<Node>>, request: Request) -> Response {
    let path = request.uri().path();
    if crate::http::dashboard::is_dashboard(path) {
        return answered_by(&node, dashboard(&node, request).await);
    }
    if path == "/mcp" && request.method() != Method::POST {
        // Each POST stands alone (no protocol sessions, so a takeover never ends a
        // client's connection; see `crate::http`'s `mcp_service`): there is no standalone
        // event stream to open (GET) nor session to end (DELETE). The MCP specification
        // lets a server answer 405, and clients carry on without them.
        let mut answer = ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            "in cluster mode /mcp serves each POST on its own, with no protocol session: \
             there is no event stream to open (GET) or session to end (DELETE); POST works",
        )
        .into_response();
        answer
            .headers_mut()
            .insert(axum::http::header::ALLOW, HeaderValue::from_static("POST"));
        return answered_by(&node, answer);
    }
    let header = request
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    if path == "/openapi.json" {
        // Public, as on one server, and the same on every node.
        return answered_by(&node, crate::http::get_openapi().await);
    }
    // Keys are checked here, at the node the client reached, with the failed-key throttle
    // of one server: a client without a valid key is answered 401, and 429 past the limit
    // of its address, before anything goes to another node.
    let ip = crate::http::client_ip_in(request.extensions());
    let caller = match node.door.caller(header, ip) {
        Ok((namespace, role)) => Verified {
            namespace,
            admin: role == crate::auth::Role::Admin,
            key: crate::auth::digest(crate::auth::bearer_token(header).unwrap_or_default()),
            client: ip,
            viewer: None,
        },
        Err(e) => return answered_by(&node, e.into_response()),
    };
    if path == "/v1/policy/reload" && request.method() == Method::POST {
        // Every partition's runtime, not only the admin namespace's.
        return answered_by(&node, node.reload_policies(header).await);
    }
    if path == "/metrics" && request.method() == Method::GET {
        // This node's own, not those of the node owning the admin namespace's partition.
        return answered_by(&node, node.metrics(header).await);
    }
    answered_by(&node, to_partition(&node, caller, request).await)
}

/// A dashboard page: signing in and out (whose sign-ins every node reads) and the assets
/// are answered here; every other page shows its visitor's namespace, so it goes to that
/// namespace's partition like a `/v1` request of the visitor's key would.
pub(super) async fn dashboard(node: &Node, request: Request) -> Response {
    if crate::http::dashboard::served_by_front(request.uri().path()) {
        return match node.front_ui.clone().oneshot(request).await {
            Ok(r) => r,
            Err(never) => match never {},
        };
    }
    match crate::http::dashboard::visitor(&node.door, request).await {
        Ok((caller, request)) => to_partition(node, caller, request).await,
        Err(answer) => answer,
    }
}

/// Answers `caller`'s `request` with this node's runtime of the caller's partition, or
/// forwards it to the partition's owner.
pub(super) async fn to_partition(node: &Node, caller: Verified, request: Request) -> Response {
    let layout = Layout::of(&node.cfg);
    // Placed by session, an MCP message says in its body what it acts on.
    let (mut request, body) = match layout.needs_body(request.method(), request.uri().path()) {
        true => {
            let max = node.limits.max_body_bytes;
            let (parts, body) = request.into_parts();
            let Ok(bytes) = axum::body::to_bytes(body, max).await else {
                return forward::too_large(max);
            };
            (
                Request::from_parts(parts, Body::from(bytes.clone())),
                Some(bytes),
            )
        }
        false => (request, None),
    };
    let p = match layout.partition(
        &caller.namespace,
        request.uri().path(),
        request.headers(),
        body.as_deref(),
    ) {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    let part = &node.partitions[usize::from(p)];
    let local = part
        .router
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    match local {
        Some(router) => {
            // The owner's router believes the caller the front verified, as it does a
            // forwarded request's.
            request.extensions_mut().insert(caller);
            match router.oneshot(request).await {
                Ok(r) => r,
                Err(never) => match never {},
            }
        }
        None => {
            let via = forward::Forwarder {
                client: &node.client,
                node: &node.cfg.node,
                sealer: &node.sealer,
                max_body: node.limits.max_body_bytes,
                deadline: node.cfg.forward_timeout,
            };
            forward::forward(&via, part.rpc_subject.clone(), caller, request).await
        }
    }
}

/// Names this node as the one that answered, unless the owner that did already said so.
pub(super) fn answered_by(node: &Node, mut answer: Response) -> Response {
    if !answer.headers().contains_key(ANSWERED_BY)
        && let Ok(v) = HeaderValue::from_str(&node.cfg.node)
    {
        answer
            .headers_mut()
            .insert(HeaderName::from_static(ANSWERED_BY), v);
    }
    answer
}

pub(super) async fn healthz(State(node): State<Arc<Node>>) -> Response {
    axum::Json(json!({"status": "ok", "node": node.cfg.node})).into_response()
}

/// `GET /cluster`: this node's view — members, and per partition its role, epoch and
/// applied position. Needs an admin key when keys are configured.
pub(super) async fn status(State(node): State<Arc<Node>>, request: Request<Body>) -> Response {
    let header = request
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let ip = crate::http::client_ip_in(request.extensions());
    if let Err(e) = node.door.caller(header, ip) {
        return e.into_response();
    }
    if let Err(e) = node.auth.admin(header, "GET /cluster needs an admin key") {
        return e.into_response();
    }
    axum::Json(node.status()).into_response()
}
