//! Who a caller is, for every door (HTTP, MCP over HTTP, the dashboard, a cluster node's
//! front): API keys kept as their SHA-256, each mapping to one namespace and a role
//! ([`Auth`]); the throttle on failed attempts per client address ([`AuthThrottle`]); the
//! caller a cluster node verified for another ([`Verified`]); and the random tokens
//! sign-ins and secrets are made of.

use std::collections::HashMap;

use axum::http::StatusCode;
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::api::{ApiError, ApiResult};

/// The namespace of every request while no API keys are configured.
pub const DEFAULT_NAMESPACE: &str = "default";

/// One API key of the config file's `[[auth.keys]]`: the hex SHA-256 of the key (the file
/// never holds a key itself), the namespace it may see, and its role.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiKey {
    /// Hex SHA-256 of the bearer token (e.g. `printf %s "$KEY" | sha256sum`).
    pub sha256: String,
    /// The namespace requests with this key read and write.
    pub namespace: String,
    /// `tenant` (the default) or `admin`.
    #[serde(default)]
    pub role: Role,
}

/// What a key may do beyond its namespace's data.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Its namespace's data only.
    #[default]
    Tenant,
    /// Also what acts on or shows the whole server: `POST /v1/policy/reload` and
    /// `GET /metrics` (every namespace's activity).
    Admin,
}

/// Who may call `/v1`: nobody needs a key when no keys are configured (namespace
/// `default`, every operation allowed, as on a loopback development server); otherwise
/// every request needs `Authorization: Bearer <key>` of a known key, sees only that key's
/// namespace, and server-wide operations need an `admin` key.
#[derive(Debug, Clone, Default)]
pub struct Auth {
    /// Namespace and role by hex SHA-256 of the key.
    keys: HashMap<String, (String, Role)>,
}

impl Auth {
    /// Every request in namespace `default`, no key needed.
    pub fn open() -> Self {
        Auth::default()
    }

    /// The given keys; errors name each bad entry and how to fix it.
    pub fn with_keys(keys: &[ApiKey]) -> anyhow::Result<Self> {
        let mut map = HashMap::new();
        for (i, key) in keys.iter().enumerate() {
            let hash = key.sha256.trim().to_ascii_lowercase();
            if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
                anyhow::bail!(
                    "auth.keys[{i}].sha256 is not a hex SHA-256 (64 hex digits); write the \
                     hash of the key, e.g. `printf %s \"$KEY\" | sha256sum`, never the key"
                );
            }
            if !valid_namespace(&key.namespace) {
                anyhow::bail!(
                    "auth.keys[{i}].namespace `{}` is not a namespace; use 1 to 128 of \
                     A-Z a-z 0-9 . _ : -",
                    key.namespace
                );
            }
            if map
                .insert(hash, (key.namespace.clone(), key.role))
                .is_some()
            {
                anyhow::bail!("auth.keys[{i}] repeats a key hash; give each key one entry");
            }
        }
        Ok(Auth { keys: map })
    }

    /// Whether requests need a key.
    pub fn required(&self) -> bool {
        !self.keys.is_empty()
    }

    /// [`Auth::caller`], for what only an admin key may do: 403 with `why` for a tenant
    /// key.
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    pub(crate) fn admin(&self, authorization: Option<&str>, why: &str) -> ApiResult<()> {
        match self.caller(authorization)? {
            (_, Role::Admin) => Ok(()),
            (_, Role::Tenant) => Err(ApiError::new(StatusCode::FORBIDDEN, "forbidden", why)),
        }
    }

    /// The caller's namespace and role, from the `Authorization` header.
    pub(crate) fn caller(&self, authorization: Option<&str>) -> ApiResult<(String, Role)> {
        if !self.required() {
            return Ok((DEFAULT_NAMESPACE.to_string(), Role::Admin));
        }
        let Some(token) = bearer_token(authorization) else {
            return Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "this server needs an API key: send `Authorization: Bearer <key>`",
            ));
        };
        self.keys.get(&digest(token)).cloned().ok_or_else(|| {
            ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "the API key is not known to this server; check the key, or add its SHA-256 \
                 to `[[auth.keys]]` in the config file",
            )
        })
    }
}

/// Who sent a request, as the cluster node the client reached verified it (an API key, or
/// a dashboard sign-in), with the throttle of one server. The partition's owner trusts it
/// instead of credentials, which never cross NATS (`crate::cluster`): only a node puts it
/// in a request's extensions, once the seal it came with verified.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, Deserialize)]
pub(crate) struct Verified {
    /// The caller's namespace.
    pub(crate) namespace: String,
    /// Whether the caller holds an admin key.
    pub(crate) admin: bool,
    /// The hex SHA-256 of the caller's key, as `mcp_caller` names a protocol session's
    /// owner (that of the empty key when none was sent; empty for a dashboard visitor
    /// while no keys are configured).
    pub(crate) key: String,
    /// The client's address as the front saw it.
    pub(crate) client: Option<std::net::IpAddr>,
    /// For a dashboard page: the token the visitor's forms carry, and whether they signed
    /// in with a key.
    pub(crate) viewer: Option<(String, bool)>,
}

impl Verified {
    /// The caller's namespace and role.
    pub(crate) fn caller(&self) -> (String, Role) {
        let role = if self.admin {
            Role::Admin
        } else {
            Role::Tenant
        };
        (self.namespace.clone(), role)
    }
}

/// Failed authentications counted per client address: past [`AUTH_FAILURES`] in
/// [`AUTH_WINDOW`], every request from the address that fails authentication is answered
/// 429 `too_many_failed_auth` until the window ends, so wrong keys are not answered at
/// line rate. A request with a valid key is never refused for it: one misconfigured agent
/// behind a NAT, a proxy or a Kubernetes node must not lock out every client there.
#[derive(Debug, Default)]
pub struct AuthThrottle {
    /// Per address: failures in the current window, and when the window began.
    failures: std::sync::Mutex<HashMap<std::net::IpAddr, (u32, std::time::Instant)>>,
}

/// Failed authentications one address may make per window.
pub const AUTH_FAILURES: u32 = 20;

/// The window failed authentications are counted in.
pub const AUTH_WINDOW: std::time::Duration = std::time::Duration::from_secs(60);

/// Addresses remembered at most; past it, those whose window ended are forgotten.
const AUTH_ADDRESSES: usize = 100_000;

impl AuthThrottle {
    /// How long `ip` must wait before trying again, if it has used up its failures.
    pub fn blocked(
        &self,
        ip: std::net::IpAddr,
        now: std::time::Instant,
    ) -> Option<std::time::Duration> {
        let failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        let (count, since) = failures.get(&ip)?;
        let left = AUTH_WINDOW.checked_sub(now.duration_since(*since))?;
        (*count >= AUTH_FAILURES && !left.is_zero()).then_some(left)
    }

    /// A request from `ip` failed authentication: how long it must wait when its address
    /// has used up its failures (answer 429), else the failure is counted (answer 401).
    pub fn refuse(
        &self,
        ip: std::net::IpAddr,
        now: std::time::Instant,
    ) -> Option<std::time::Duration> {
        let wait = self.blocked(ip, now);
        if wait.is_none() {
            self.failed(ip, now);
        }
        wait
    }

    /// Counts one failed authentication from `ip`.
    pub fn failed(&self, ip: std::net::IpAddr, now: std::time::Instant) {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        if failures.len() >= AUTH_ADDRESSES {
            failures.retain(|_, (_, since)| now.duration_since(*since) < AUTH_WINDOW);
        }
        let entry = failures.entry(ip).or_insert((0, now));
        if now.duration_since(entry.1) >= AUTH_WINDOW {
            *entry = (0, now);
        }
        entry.0 += 1;
    }
}

/// `bytes` as lowercase hex.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The hex SHA-256 of `text`: how a key is named where it is kept (the config, sign-ins,
/// MCP sessions), never the key itself.
pub(crate) fn digest(text: &str) -> String {
    hex(&Sha256::digest(text.as_bytes()))
}

/// The key an `Authorization` header carries, trimmed. The scheme is case-insensitive (RFC
/// 9110 §11.1): `bearer` is as good as `Bearer`.
pub(crate) fn bearer_token(authorization: Option<&str>) -> Option<&str> {
    let (scheme, token) = authorization?.trim_start().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then_some(token.trim())
}

/// Namespaces follow the session id pattern: `[A-Za-z0-9._:-]{1,128}`.
fn valid_namespace(ns: &str) -> bool {
    (1..=128).contains(&ns.len())
        && ns
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".:_-".contains(&b))
}

/// [`Auth::caller`] for `header`, a failure counted against the client's address `ip` in
/// `throttle` and answered 429 past the limit (a cluster node's front checks keys the same
/// way, `crate::cluster`).
pub(crate) fn throttled_caller(
    auth: &Auth,
    throttle: &AuthThrottle,
    header: Option<&str>,
    ip: Option<std::net::IpAddr>,
) -> ApiResult<(String, Role)> {
    if !auth.required() {
        return auth.caller(None);
    }
    let caller = auth.caller(header);
    if caller.is_ok() {
        return caller;
    }
    match ip.and_then(|ip| throttle.refuse(ip, std::time::Instant::now())) {
        Some(wait) => Err(throttled(wait)),
        None => caller,
    }
}

/// The answer to a failing request from an address past its failures.
fn throttled(wait: std::time::Duration) -> ApiError {
    let seconds = wait.as_secs().max(1);
    let mut e = ApiError::new(
        StatusCode::TOO_MANY_REQUESTS,
        "too_many_failed_auth",
        format!(
            "more than {AUTH_FAILURES} requests from this address had no valid API key in \
             the last {}s; wait {seconds}s, then send a valid `Authorization: Bearer <key>` \
             (requests with a valid key are answered meanwhile)",
            AUTH_WINDOW.as_secs()
        ),
    );
    e.retry_after = Some(seconds);
    e
}

/// 32 random bytes, hex.
pub(crate) fn random_token() -> String {
    let mut bytes = [0u8; 32];
    // The operating system's generator; without it no token would be safe to hand out.
    getrandom::fill(&mut bytes).expect("the operating system's random generator failed");
    hex(&bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_authentication_is_throttled_per_address_for_a_window() {
        let throttle = AuthThrottle::default();
        let (a, b): (std::net::IpAddr, std::net::IpAddr) =
            ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let t0 = std::time::Instant::now();
        for i in 0..AUTH_FAILURES {
            assert_eq!(throttle.blocked(a, t0), None, "after {i} failures");
            throttle.failed(a, t0);
        }
        let wait = throttle.blocked(a, t0).expect("blocked after the limit");
        assert!(wait <= AUTH_WINDOW && wait > AUTH_WINDOW / 2, "{wait:?}");
        assert_eq!(throttle.blocked(b, t0), None, "another address is not");
        // When the window ends the address may try again, counted afresh.
        let later = t0 + AUTH_WINDOW + std::time::Duration::from_secs(1);
        assert_eq!(throttle.blocked(a, later), None);
        throttle.failed(a, later);
        assert_eq!(throttle.blocked(a, later), None);
    }
}
