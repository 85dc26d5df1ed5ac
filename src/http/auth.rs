//! Who sent a request, for the handlers: its namespace and role from the API key (or from
//! what a cluster node verified), failures throttled per client address, and the client's
//! address as the connections resolved it.

use axum::extract::FromRequestParts;
use axum::http::StatusCode;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;

use super::state::AppState;
use crate::api::{ApiError, ApiResult};
use crate::auth::{Role, Verified, throttled_caller};

/// The caller's namespace and role (see [`Auth::caller`]), with failed attempts counted
/// per client address and refused with 429 once there are too many ([`AuthThrottle`]).
pub(super) fn authenticate(parts: &Parts, s: &AppState) -> ApiResult<(String, Role)> {
    if let Some(verified) = parts.extensions.get::<Verified>() {
        return Ok(verified.caller());
    }
    let header = parts
        .headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    throttled_caller(&s.auth, &s.throttle, header, client_ip(parts))
}

/// The client's address: as the edge resolved it (through a trusted proxy, the address it
/// forwarded; `crate::http::Client`), else the connection's.
pub(crate) fn client_ip(parts: &Parts) -> Option<std::net::IpAddr> {
    client_ip_in(&parts.extensions)
}

/// [`client_ip`] from a request's extensions.
pub(crate) fn client_ip_in(extensions: &axum::http::Extensions) -> Option<std::net::IpAddr> {
    if let Some(verified) = extensions.get::<Verified>() {
        return verified.client;
    }
    extensions
        .get::<crate::http::Client>()
        .map(|c| c.ip)
        .or_else(|| {
            extensions
                .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
                .map(|c| c.0.ip())
        })
}

/// A caller with an `admin` key (or any caller when no keys are configured): the
/// extractor of server-wide operations; a tenant key gets 403 `forbidden`.
pub(super) struct Admin;

impl FromRequestParts<AppState> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, s: &AppState) -> ApiResult<Self> {
        match authenticate(parts, s)? {
            (_, Role::Admin) => Ok(Admin),
            (_, Role::Tenant) => Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                "this acts on the whole server and needs an admin key (`role = \"admin\"` \
                 in `[[auth.keys]]`); a tenant key reaches its own namespace only",
            )),
        }
    }
}

/// The namespace a `/v1` request acts in, from its API key (see [`Auth`]).
pub(super) struct Namespace(pub(super) String);

impl FromRequestParts<AppState> for Namespace {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, s: &AppState) -> ApiResult<Self> {
        authenticate(parts, s).map(|(ns, _)| Namespace(ns))
    }
}
