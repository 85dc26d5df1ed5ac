//! The HTTP edge (`shadowbrain serve`): axum over the actor runtime's [`Runtime`] handle,
//! implementing the contract of docs/http-api.md — paths, bodies, status codes and the error
//! shape `{"error":{"code","message"}}` — for the endpoints listed in [`router`], with API
//! keys that map to namespaces ([`Auth`]) and Prometheus metrics (`crate::metrics`); and
//! `/mcp`, the MCP server of [`crate::mcp`] over Streamable HTTP, behind the same keys,
//! body limit, admission slots and metrics; and the dashboard (`GET /`, `/ui/…`,
//! `dashboard`), HTML for people, through a sign-in with the same keys.
//!
//! Handlers only translate: they parse and bound the request, call the handle, and map the
//! answer or the error. Validation of events, ids and limits on text and content lives in
//! the substrate, so an embedded application gets the same errors; this layer adds what
//! only HTTP has (body size, malformed JSON, query parameters) and maps each error variant
//! to a status without rewriting its message, which already says how to fix the request.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::{
    Error, FeedbackTarget, Limits, MemoryId, NewMemory, RecallRequest, Runtime, Status, Timestamp,
    parse_rfc3339,
};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{
    DefaultBodyLimit, FromRequest, FromRequestParts, MatchedPath, Path, Query, Request, State,
};
use axum::http::header::{AUTHORIZATION, CONNECTION, CONTENT_LENGTH};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tracing::Instrument;
use utoipa::OpenApi;

mod admission;
mod dashboard;

pub(crate) use admission::{Admission, Slot, Work};

#[cfg(feature = "cluster")]
pub(crate) use dashboard::{
    Door, Logins, SIGN_IN_FOR, Shared, SharedSignIns, SignIn, front as dashboard_front,
    is_dashboard, random_token, served_by_front, visitor,
};

use crate::api::{
    CondenseOut, ErrorBody, ErrorDetail, EventsIn, FeedbackIn, Graph, Health, History, Ids,
    KnowledgeSearchIn, Memory, PolicyOut, RecallIn, RecallOut, Sessions, StatusIn, Timeline,
    Updated,
};
use crate::listen::{Drained, Edge};
use crate::mcp::{Caller, McpServer};
use crate::metrics::Metrics;
use rmcp::transport::streamable_http_server::session::SessionManager;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;

/// The namespace of every request while no API keys are configured.
pub const DEFAULT_NAMESPACE: &str = "default";

/// The request header that makes a write safe to retry (see [`crate::Substrate::record_once`]).
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// The answer header saying a write was a retry of one already made: the ids are that
/// write's and nothing was stored again.
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";

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
    fn caller(&self) -> (String, Role) {
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

/// The caller's namespace and role (see [`Auth::caller`]), with failed attempts counted
/// per client address and refused with 429 once there are too many ([`AuthThrottle`]).
fn authenticate(parts: &Parts, s: &AppState) -> ApiResult<(String, Role)> {
    if let Some(verified) = parts.extensions.get::<Verified>() {
        return Ok(verified.caller());
    }
    let header = parts
        .headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    throttled_caller(&s.auth, &s.throttle, header, client_ip(parts))
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

/// The client's address: as the edge resolved it (through a trusted proxy, the address it
/// forwarded; `crate::listen::Client`), else the connection's.
pub(crate) fn client_ip(parts: &Parts) -> Option<std::net::IpAddr> {
    client_ip_in(&parts.extensions)
}

/// [`client_ip`] from a request's extensions.
pub(crate) fn client_ip_in(extensions: &axum::http::Extensions) -> Option<std::net::IpAddr> {
    if let Some(verified) = extensions.get::<Verified>() {
        return verified.client;
    }
    extensions
        .get::<crate::listen::Client>()
        .map(|c| c.ip)
        .or_else(|| {
            extensions
                .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
                .map(|c| c.0.ip())
        })
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

/// A caller with an `admin` key (or any caller when no keys are configured): the
/// extractor of server-wide operations; a tenant key gets 403 `forbidden`.
struct Admin;

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
struct Namespace(String);

impl FromRequestParts<AppState> for Namespace {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, s: &AppState) -> ApiResult<Self> {
        authenticate(parts, s).map(|(ns, _)| Namespace(ns))
    }
}

#[derive(Clone)]
struct AppState {
    rt: Runtime,
    limits: Arc<Limits>,
    auth: Arc<Auth>,
    metrics: Arc<Metrics>,
    edge: Edge,
    throttle: Arc<AuthThrottle>,
    admission: Arc<Admission>,
    /// Where admitted requests are answered, when not on the connections' own runtime
    /// (see [`serve`]).
    work: Option<tokio::runtime::Handle>,
    /// The dashboard's sign-ins, rates and cached insights.
    ui: Arc<dashboard::Ui>,
    /// The cluster node this router serves a partition of (`None`: a single server).
    cluster: Option<InCluster>,
    /// `/mcp`'s protocol sessions and the keys that opened them.
    mcp_sessions: Arc<McpSessions>,
}

/// Protocol sessions of `/mcp` open at most per API key: one agent opening sessions in a
/// loop cannot fill the server's memory.
pub(crate) const MCP_SESSIONS_PER_KEY: usize = 256;

/// `/mcp`'s protocol sessions (rmcp keeps them) and, for each, the SHA-256 of the key that
/// opened it: a session answers only that key, so one tenant can neither use nor end
/// another's.
pub(crate) struct McpSessions {
    manager: Arc<LocalSessionManager>,
    owners: std::sync::Mutex<HashMap<String, String>>,
}

impl McpSessions {
    fn new() -> Self {
        McpSessions {
            manager: Arc::new(LocalSessionManager::default()),
            owners: std::sync::Mutex::new(HashMap::new()),
        }
    }

    fn owners(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        self.owners.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sessions `key` holds open now (forgetting those rmcp ended: idle or closed).
    async fn held_by(&self, key: &str) -> usize {
        let theirs: Vec<String> = self
            .owners()
            .iter()
            .filter(|(_, k)| k.as_str() == key)
            .map(|(id, _)| id.clone())
            .collect();
        let mut open = 0;
        for id in theirs {
            let live = self
                .manager
                .has_session(&Arc::from(id.as_str()))
                .await
                .unwrap_or(false);
            match live {
                true => open += 1,
                false => {
                    self.owners().remove(&id);
                }
            }
        }
        open
    }
}

/// What a cluster node lends the router of each partition it owns (`crate::cluster`).
#[derive(Clone)]
pub(crate) struct InCluster {
    /// The dashboard's sign-ins, which every node shares.
    pub(crate) logins: Arc<dashboard::Logins>,
    /// What acts on, or shows, the whole cluster.
    pub(crate) node: Arc<dyn ClusterNode>,
    /// The partition this router serves.
    pub(crate) partition: u16,
}

/// A future a [`ClusterNode`] answers.
pub(crate) type NodeFuture<'a, T> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<T, ApiError>> + Send + 'a>>;

/// The cluster node behind a partition's router: what the dashboard needs beyond the
/// partition's runtime.
pub(crate) trait ClusterNode: Send + Sync {
    /// This node's name.
    fn name(&self) -> &str;
    /// Makes the policy files active on every partition of every node, or changes nothing
    /// and says why (as `POST /v1/policy/reload` does in cluster mode).
    fn reload_policies(&self) -> NodeFuture<'_, ()>;
    /// Every live node's `GET /cluster` view, by node.
    fn statuses(&self) -> NodeFuture<'_, Vec<serde_json::Value>>;
}

/// The routes of docs/http-api.md: health and metrics, session events, recall, feedback,
/// condense and timeline, the session list, one memory (get, status, archive, history),
/// knowledge search and graph, the policy (get, reload), `/mcp` and the dashboard
/// (docs/mcp.md, docs/dashboard.md).
/// Every request's body is held to `edge.body_timeout` between chunks and, when it
/// declares its length, to the body limit before a byte of it is read ([`guard_body`]).
pub fn router(rt: Runtime, limits: Limits, auth: Auth, edge: Edge) -> Router {
    router_on(rt, limits, auth, edge, None)
}

/// [`router`], answering every admitted request on `work` (a runtime other than the one
/// the connections run on) when given one: see [`serve`].
pub fn router_on(
    rt: Runtime,
    limits: Limits,
    auth: Auth,
    edge: Edge,
    work: Option<tokio::runtime::Handle>,
) -> Router {
    router_with(
        rt,
        limits,
        auth,
        edge,
        work,
        Arc::new(Metrics::new()),
        CancellationToken::new(),
        None,
    )
}

/// [`router_on`], counting into `metrics`; `closing` ends every open MCP session (its
/// streams) when cancelled. Cluster mode builds one per partition it owns, `cluster` saying
/// which and of what node.
#[allow(clippy::too_many_arguments)]
pub(crate) fn router_with(
    rt: Runtime,
    limits: Limits,
    auth: Auth,
    edge: Edge,
    work: Option<tokio::runtime::Handle>,
    metrics: Arc<Metrics>,
    closing: CancellationToken,
    cluster: Option<InCluster>,
) -> Router {
    let body_limit = limits.max_body_bytes;
    let state = AppState {
        rt,
        limits: Arc::new(limits),
        auth: Arc::new(auth),
        metrics,
        admission: Arc::new(Admission::new(&edge)),
        edge,
        throttle: Arc::new(AuthThrottle::default()),
        work,
        ui: Arc::new(dashboard::Ui::new(match &cluster {
            Some(c) => c.logins.clone(),
            None => Arc::new(dashboard::Logins::here()),
        })),
        cluster,
        mcp_sessions: Arc::new(McpSessions::new()),
    };
    let mcp = mcp_service(&state, closing);
    Router::new()
        .route("/healthz", get(healthz))
        .route("/v1/sessions/{session_id}/events", post(post_events))
        .route("/v1/sessions/{session_id}/recall", post(post_recall))
        .route("/v1/sessions/{session_id}/feedback", post(post_feedback))
        .route("/v1/sessions/{session_id}/condense", post(post_condense))
        .route("/v1/sessions/{session_id}/timeline", get(get_timeline))
        .route("/v1/sessions", get(get_sessions))
        .route(
            "/v1/memories/{id}",
            get(get_memory).patch(patch_memory).delete(delete_memory),
        )
        .route("/v1/memories/{id}/history", get(get_history))
        .route("/v1/knowledge/search", post(post_knowledge_search))
        .route("/v1/knowledge/graph", get(get_knowledge_graph))
        .route("/v1/policy", get(get_policy))
        .route("/v1/policy/reload", post(post_policy_reload))
        .route("/metrics", get(get_metrics))
        .route("/openapi.json", get(get_openapi))
        .merge(dashboard::routes())
        .route_service(
            "/mcp",
            axum::routing::any_service(mcp)
                .layer(middleware::from_fn_with_state(state.clone(), mcp_caller)),
        )
        .route_layer(middleware::from_fn_with_state(state.clone(), admit))
        .route_layer(middleware::from_fn_with_state(state.clone(), track))
        .fallback(no_route)
        .layer(middleware::from_fn_with_state(state.clone(), guard_body))
        .layer(middleware::map_response(errors_in_the_contract_shape))
        .layer(DefaultBodyLimit::max(body_limit))
        .with_state(state)
}

/// `/mcp`: the MCP server of [`crate::mcp`] over Streamable HTTP (rmcp), one server per
/// protocol session, bounded by the same body limit and admission slots as `/v1`.
fn mcp_service(
    state: &AppState,
    closing: CancellationToken,
) -> StreamableHttpService<McpServer, LocalSessionManager> {
    let server = McpServer::http(
        state.rt.clone(),
        state.limits.clone(),
        state.metrics.clone(),
        state.admission.clone(),
    );
    let mut config = StreamableHttpServerConfig::default()
        .with_cancellation_token(closing)
        .with_max_request_body_bytes(state.limits.max_body_bytes);
    // The SDK refuses a `Host` other than a loopback name, against DNS rebinding: a web
    // page making a browser talk to a keyless server on this machine. With API keys, a
    // page cannot send a key it does not have, and the server answers its real hostname.
    if state.auth.required() {
        config = config.disable_allowed_hosts();
    }
    // In cluster mode a partition's owner changes (a takeover, a hand-over), and a protocol
    // session held in the old owner's memory would end with it: every client would have to
    // notice and start again. Served statelessly, every POST stands alone, any owner answers
    // it, and a client's connection outlives a takeover. (Only the standalone event stream,
    // `GET`, goes: the MCP specification lets a server answer it 405.)
    if state.cluster.is_some() {
        config = config.with_legacy_session_mode(false);
    }
    StreamableHttpService::new(
        move || Ok(server.clone()),
        state.mcp_sessions.manager.clone(),
        config,
    )
}

/// In front of `/mcp`: the API key's namespace into the request (the MCP server reads it
/// per request, so a protocol session cannot outlive its key's reach), or the same 401 /
/// 429 as `/v1`.
async fn mcp_caller(State(s): State<AppState>, request: Request, next: Next) -> Response {
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

/// Serves `rt` on `listener` until `shutdown` completes, then stops accepting, lets the
/// requests in flight finish within `edge.drain_timeout` (closing the connections still
/// open after it), and shuts the runtime down (drain and flush). See [`crate::listen`].
///
/// The connections (reading requests, the admission decision, writing answers) run on a
/// thread of their own, and every admitted request is answered on the calling runtime.
/// When the calling runtime's workers are all busy (ingest, recall, background work),
/// a request past the admission limits need not wait for them to be refused: with 200
/// mixed clients on 2 cores, refusals' p99 went from 33 ms on the shared workers to
/// 15–21 ms (`examples/http_load.rs --mixed-secs`).
pub async fn serve(
    listener: tokio::net::TcpListener,
    rt: Runtime,
    limits: Limits,
    auth: Auth,
    edge: Edge,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<Drained> {
    let work = tokio::runtime::Handle::current();
    let metrics = Arc::new(Metrics::new());
    let counts = metrics.connections();
    let closing = CancellationToken::new();
    let edge = edge.lingering_for(limits.max_body_bytes);
    let app = router_with(
        rt.clone(),
        limits,
        auth,
        edge.clone(),
        Some(work),
        metrics,
        closing.clone(),
        None,
    );
    let drained = serve_app(listener, app, edge, counts, closing, shutdown).await?;
    rt.shutdown().await?;
    Ok(drained)
}

/// The edge of [`serve`] for any `app`: the connections on a thread of their own until
/// `shutdown` completes (cancelling `closing` then, which ends open MCP streams), then the
/// drain. Cluster mode serves its front router with it (`crate::cluster`).
pub(crate) async fn serve_app(
    listener: tokio::net::TcpListener,
    app: Router,
    edge: Edge,
    counts: crate::metrics::ConnectionMetrics,
    closing: CancellationToken,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<Drained> {
    // At shutdown the MCP sessions end their open streams, so their connections can drain
    // instead of waiting for the drain deadline.
    let shutdown = async move {
        shutdown.await;
        closing.cancel();
    };
    // The listener moves to the edge thread's runtime, whose reactor then drives every
    // accepted connection.
    let listener = listener.into_std()?;
    let (done, drained) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("shadowbrain-edge".into())
        .spawn(move || {
            if edge.realtime
                && let Err(e) = crate::listen::raise_to_realtime()
            {
                tracing::warn!("{e}");
            }
            let outcome = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(anyhow::Error::from)
                .and_then(|edge_rt| {
                    edge_rt.block_on(async move {
                        let listener = tokio::net::TcpListener::from_std(listener)?;
                        let served =
                            crate::listen::serve_connections(listener, app, edge, counts, shutdown);
                        Ok(served.await)
                    })
                });
            let _ = done.send(outcome);
        })?;
    drained
        .await
        .map_err(|_| anyhow::anyhow!("the connections' thread panicked"))?
}

/// The answer past `server.request_timeout` (`limit`): 503 `timeout`, the connection closed.
fn late(limit: std::time::Duration) -> Response {
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
async fn answer_on(
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
fn closing(e: ApiError) -> Response {
    let mut answer = e.into_response();
    answer
        .headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("close"));
    answer
}

/// `application/json` or a `+json` type, with any parameters (`; charset=utf-8`).
fn is_json(content_type: &str) -> bool {
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
fn is_form(content_type: &str) -> bool {
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
async fn errors_in_the_contract_shape(response: Response) -> Response {
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
async fn guard_body(State(s): State<AppState>, request: Request, next: Next) -> Response {
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
    fn too_large(limit: Option<usize>, declared: Option<u64>) -> Self {
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
    fn body(rejection: BytesRejection) -> Self {
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

/// Parses a JSON body: 400 when it is not JSON, with where it broke; 422 when an object
/// in it repeats a key (serde_json would keep the last one silently, while the typed
/// bodies refuse a repeated field: one rule for both).
fn parse_json(body: Result<Bytes, BytesRejection>) -> ApiResult<Value> {
    let body = body.map_err(ApiError::body)?;
    match serde_json::from_slice::<Strict>(&body) {
        Ok(Strict(value)) => Ok(value),
        Err(e) if e.classify() == serde_json::error::Category::Data => {
            Err(ApiError::invalid("event", e.to_string()))
        }
        Err(e) => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "malformed_json",
            format!("the body is not valid JSON ({e}); send one JSON object"),
        )),
    }
}

/// A JSON value whose objects never repeat a key.
struct Strict(Value);

impl<'de> Deserialize<'de> for Strict {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(StrictVisitor).map(Strict)
    }
}

struct StrictVisitor;

impl<'de> serde::de::Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(Strict(v)) = seq.next_element()? {
            items.push(v);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut object = serde_json::Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let Strict(value) = map.next_value()?;
            if object.contains_key(&key) {
                return Err(serde::de::Error::custom(format!(
                    "the key `{key}` appears twice in one object; send each key once"
                )));
            }
            object.insert(key, value);
        }
        Ok(Value::Object(object))
    }
}

/// Reads a JSON value into `T`: 422 when it is JSON of the wrong shape.
pub(crate) fn from_value<T: serde::de::DeserializeOwned>(what: &str, value: Value) -> ApiResult<T> {
    serde_json::from_value(value).map_err(|e| ApiError::invalid(what, e.to_string()))
}

/// Reads a JSON body straight into `T` (no intermediate value): 400 when it is not JSON,
/// 422 when it is JSON of the wrong shape.
fn from_json<T: serde::de::DeserializeOwned>(
    what: &str,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<T> {
    let body = body.map_err(ApiError::body)?;
    serde_json::from_slice(&body).map_err(|e| match e.classify() {
        serde_json::error::Category::Data => ApiError::invalid(what, e.to_string()),
        _ => ApiError::new(
            StatusCode::BAD_REQUEST,
            "malformed_json",
            format!("the body is not valid JSON ({e}); send one JSON object"),
        ),
    })
}

/// Admission control (`admission`): recalls and writes past `[server] max_recalls` /
/// `max_writes` in flight wait for a slot within `queue_wait`, or are answered
/// `503 overloaded` with the expected wait. Without a bound a burst queues behind the
/// cores, and every caller waits seconds instead of a few being told to come back.
async fn admit(
    State(s): State<AppState>,
    matched: Option<MatchedPath>,
    request: Request,
    next: Next,
) -> Response {
    let route = matched.as_ref().map_or("", |m| m.as_str());
    let work = match (request.method().as_str(), route) {
        ("POST", "/v1/sessions/{session_id}/recall" | "/v1/knowledge/search")
        | ("GET", "/v1/knowledge/graph") => Work::Recall,
        (
            "POST" | "PATCH" | "DELETE",
            "/v1/sessions/{session_id}/events"
            | "/v1/sessions/{session_id}/feedback"
            | "/v1/sessions/{session_id}/condense"
            | "/v1/memories/{id}",
        ) => Work::Write,
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
async fn track(
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

/// `GET /metrics`: Prometheus text. It shows every namespace's activity, so with API keys
/// configured it needs an admin key.
#[utoipa::path(get, path = "/metrics", tag = "operations",
    responses(
        (status = 200, description = "Prometheus / OpenMetrics text", content_type = "application/openmetrics-text"),
        (status = 401, description = "Keys are configured and none, or an unknown one, was sent", body = ErrorBody),
        (status = 403, description = "A tenant key: metrics need an admin key", body = ErrorBody),
    ))]
async fn get_metrics(State(s): State<AppState>, _admin: Admin) -> Response {
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
async fn healthz() -> Json<Health> {
    Json(Health {
        status: "ok",
        version: env!("CARGO_PKG_VERSION"),
    })
}

/// The OpenAPI document of every endpoint, built once from the handlers' annotations and
/// the wire types of [`crate::api`].
#[derive(OpenApi)]
#[openapi(
    info(
        title = "shadowbrain",
        description = "Long-term memory for LLM agents: the HTTP contract of the repository's \
                       docs/http-api.md. \
                       With API keys configured, every /v1 request needs \
                       `Authorization: Bearer <key>`."
    ),
    paths(
        healthz, get_metrics, get_openapi, post_events, post_recall, post_feedback,
        post_condense, get_timeline, get_sessions, get_memory, patch_memory, delete_memory,
        get_history, post_knowledge_search, get_knowledge_graph, get_policy, post_policy_reload
    ),
    components(schemas(ErrorBody, ErrorDetail)),
    tags(
        (name = "sessions", description = "Events, recall, feedback, condensation, timelines"),
        (name = "memories", description = "One record: read, status, archive, history"),
        (name = "knowledge", description = "The namespace's shared knowledge pool"),
        (name = "policy", description = "The active memory policy"),
        (name = "operations", description = "Health, metrics, this document"),
    )
)]
pub struct ApiDoc;

/// `GET /openapi.json`: the document, rendered once.
#[utoipa::path(get, path = "/openapi.json", tag = "operations",
    responses((status = 200, description = "The OpenAPI 3.1 document", content_type = "application/json")))]
pub(crate) async fn get_openapi() -> Response {
    static DOC: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let doc = DOC.get_or_init(|| {
        ApiDoc::openapi()
            .to_pretty_json()
            .unwrap_or_else(|e| format!("{{\"error\":\"the document could not be built: {e}\"}}"))
    });
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        doc.as_str(),
    )
        .into_response()
}

async fn no_route() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "no_such_route",
        "no endpoint at this path and method; docs/http-api.md lists them",
    )
}

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
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 413, description = "Body, text or content over a limit", body = ErrorBody),
        (status = 422, description = "A field is invalid (`invalid_<field>`, `dimension_mismatch`), or the Idempotency-Key was used for another request (`invalid_idempotency_key`)", body = ErrorBody),
    ))]
async fn post_events(
    State(s): State<AppState>,
    ns: Namespace,
    Path(session_id): Path<String>,
    headers: axum::http::HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    let body = body.map_err(ApiError::body)?;
    // A retry sends the same bytes: their digest tells it from another request that
    // reuses the key.
    let idempotency = match headers.get(IDEMPOTENCY_KEY) {
        None => None,
        Some(key) => Some(crate::Idempotency {
            key: key
                .to_str()
                .map_err(|_| {
                    ApiError::invalid(
                        "idempotency_key",
                        "must be 1 to 255 visible ASCII characters; a UUID is a good key",
                    )
                })?
                .to_string(),
            fingerprint: hex(&Sha256::digest(&body)),
        }),
    };
    let events = events_from(parse_json(Ok(body))?)?;
    let session = s.rt.session(&ns.0, &session_id)?;
    let recorded = session.record_idempotent(events, idempotency).await?;
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

/// The events of a write's body: one event, or `{"events":[…]}`, with their RFC 3339 times
/// read. HTTP's `POST …/events` and MCP's `remember` read their events here, so both
/// refuse the same things with the same words.
pub(crate) fn events_from(mut value: Value) -> ApiResult<Vec<NewMemory>> {
    let batch = value.get("kind").is_none();
    let mut events = match value.get_mut("events") {
        Some(Value::Array(events)) if batch => std::mem::take(events),
        Some(_) if batch => {
            return Err(ApiError::invalid(
                "events",
                "`events` must be an array of events; send {\"events\":[{\"kind\":…}]}",
            ));
        }
        _ => vec![value],
    };
    for event in &mut events {
        // The contract's times are RFC 3339; the substrate counts milliseconds. A number
        // would be taken as milliseconds unchecked, so the wire refuses it.
        match event.get_mut("timestamp") {
            Some(t @ Value::String(_)) => {
                let text = t.as_str().unwrap_or_default().to_string();
                *t = json!(parse_rfc3339("timestamp", &text)?);
            }
            None | Some(Value::Null) => {}
            Some(other) => {
                return Err(ApiError::invalid(
                    "timestamp",
                    format!(
                        "{other} is not an RFC 3339 time; send a string like \
                         \"2026-05-08T13:56:00Z\""
                    ),
                ));
            }
        }
    }
    from_value("event", Value::Array(events))
}

/// `POST /v1/sessions/{id}/recall`.
#[utoipa::path(post, path = "/v1/sessions/{session_id}/recall", tag = "sessions",
    params(("session_id" = String, Path, description = "`[A-Za-z0-9._:-]{1,128}`")),
    request_body = RecallIn,
    responses(
        (status = 200, description = "Ranked, explained memories and a prompt-ready context", body = RecallOut),
        (status = 400, description = "Malformed JSON", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 422, description = "`k`, `token_budget`, `scope`, a time or the session id is invalid", body = ErrorBody),
    ))]
async fn post_recall(
    State(s): State<AppState>,
    ns: Namespace,
    Path(session_id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Json<RecallOut>> {
    let body: RecallIn = from_json("recall", body)?;
    let session = s.rt.session(&ns.0, &session_id)?;
    let request = recall_request(&s.limits, &ns.0, &session_id, body)?;
    let result = session.recall_with(request).await?;
    s.metrics.recall();
    Ok(Json(result.into()))
}

/// A recall's body as the runtime's request, within the limits (HTTP and MCP).
pub(crate) fn recall_request(
    limits: &Limits,
    namespace: &str,
    session_id: &str,
    body: RecallIn,
) -> ApiResult<RecallRequest> {
    let mut request = RecallRequest::new(namespace, session_id, &body.query);
    request.k = limits.k(body.k)?;
    request.token_budget = limits.token_budget(body.token_budget)?;
    request.scope = body.scope.unwrap_or_default();
    request.agent_id = body.agent_id;
    request.kinds = body.kinds;
    request.since = body.since.map(|t| time("since", t)).transpose()?;
    request.until = body.until.map(|t| time("until", t)).transpose()?;
    request.include_knowledge = body.include_knowledge.unwrap_or(true);
    request.include_superseded = body.include_superseded.unwrap_or(false);
    Ok(request)
}

/// A time given as RFC 3339 text or as milliseconds since the epoch.
fn time(field: &str, value: Value) -> ApiResult<Timestamp> {
    match value {
        Value::String(text) => Ok(parse_rfc3339(field, &text)?),
        Value::Number(n) if n.as_i64().is_some() => Ok(n.as_i64().unwrap_or_default()),
        other => Err(ApiError::invalid(
            field,
            format!("{other} is not a time; write RFC 3339, e.g. `2026-05-08T13:56:00Z`"),
        )),
    }
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct TimelineQuery {
    /// How many records (1..=1000, default 100).
    limit: Option<usize>,
}

/// `GET /v1/sessions/{id}/timeline?limit=`: newest first.
#[utoipa::path(get, path = "/v1/sessions/{session_id}/timeline", tag = "sessions",
    params(("session_id" = String, Path, description = "`[A-Za-z0-9._:-]{1,128}`"), TimelineQuery),
    responses(
        (status = 200, description = "Records, newest first", body = Timeline),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 422, description = "`limit` out of range or a bad session id", body = ErrorBody),
    ))]
async fn get_timeline(
    State(s): State<AppState>,
    ns: Namespace,
    Path(session_id): Path<String>,
    query: Result<Query<TimelineQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<Json<Timeline>> {
    let Query(query) = query.map_err(|e| ApiError::invalid("query", e.body_text()))?;
    let limit = timeline_limit(&s.limits, query.limit)?;
    let session = s.rt.session(&ns.0, &session_id)?;
    let items = Memory::all_of(s.rt.substrate(), session.timeline(limit).await?)?;
    Ok(Json(Timeline { items }))
}

/// How many records a timeline asks for: 100 by default, at most `[limits] timeline`.
pub(crate) fn timeline_limit(limits: &Limits, limit: Option<usize>) -> ApiResult<usize> {
    let limit = limit.unwrap_or(100);
    if !(1..=limits.max_timeline).contains(&limit) {
        return Err(ApiError::invalid(
            "limit",
            format!(
                "{limit} is out of range; ask for 1 to {} items",
                limits.max_timeline
            ),
        ));
    }
    Ok(limit)
}

/// `GET /v1/memories/{id}`.
#[utoipa::path(get, path = "/v1/memories/{id}", tag = "memories",
    params(("id" = String, Path, description = "`mem-…`")),
    responses(
        (status = 200, description = "The record", body = Memory),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such record in this namespace", body = ErrorBody),
        (status = 422, description = "Not a `mem-…` id", body = ErrorBody),
    ))]
async fn get_memory(
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

/// `POST /v1/sessions/{id}/feedback`.
#[utoipa::path(post, path = "/v1/sessions/{session_id}/feedback", tag = "sessions",
    params(("session_id" = String, Path, description = "`[A-Za-z0-9._:-]{1,128}`")),
    request_body = FeedbackIn,
    responses(
        (status = 200, description = "Utility and strength updated", body = Updated),
        (status = 400, description = "Malformed JSON", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "Unknown recall or memory", body = ErrorBody),
        (status = 422, description = "Neither or both of `recall_id` and `memory_ids`, or a bad outcome", body = ErrorBody),
    ))]
async fn post_feedback(
    State(s): State<AppState>,
    ns: Namespace,
    Path(session_id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Json<Updated>> {
    let body: FeedbackIn = from_json("feedback", body)?;
    let outcome = body.outcome;
    let target = feedback_target(body)?;
    let session = s.rt.session(&ns.0, &session_id)?;
    let report = session.feedback(target, outcome).await?;
    Ok(Json(Updated {
        updated: report.updated,
    }))
}

/// What a feedback credits: a recall's memories, or memories named (HTTP and MCP).
pub(crate) fn feedback_target(body: FeedbackIn) -> ApiResult<FeedbackTarget> {
    Ok(match (body.recall_id, body.memory_ids) {
        (Some(recall), None) => FeedbackTarget::Recall(recall),
        (None, Some(ids)) => FeedbackTarget::Memories(
            ids.iter()
                .map(|id| id.parse())
                .collect::<Result<_, Error>>()?,
        ),
        _ => {
            return Err(ApiError::invalid(
                "feedback",
                "send either `recall_id` (every memory of that recall) or `memory_ids`, \
                 not both and not neither",
            ));
        }
    })
}

/// `POST /v1/sessions/{id}/condense`: the condensed record's id, or `null`.
#[utoipa::path(post, path = "/v1/sessions/{session_id}/condense", tag = "sessions",
    params(("session_id" = String, Path, description = "`[A-Za-z0-9._:-]{1,128}`")),
    responses(
        (status = 200, description = "The condensed record, or null", body = CondenseOut),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 422, description = "A bad session id", body = ErrorBody),
    ))]
async fn post_condense(
    State(s): State<AppState>,
    ns: Namespace,
    Path(session_id): Path<String>,
) -> ApiResult<Json<CondenseOut>> {
    let session = s.rt.session(&ns.0, &session_id)?;
    let condensed = session.condense().await?;
    Ok(Json(CondenseOut {
        memory_id: condensed.map(|c| c.id.to_string()),
    }))
}

/// `GET /v1/sessions`.
#[utoipa::path(get, path = "/v1/sessions", tag = "sessions",
    responses(
        (status = 200, description = "The namespace's sessions", body = Sessions),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
    ))]
async fn get_sessions(State(s): State<AppState>, ns: Namespace) -> ApiResult<Json<Sessions>> {
    let sessions =
        s.rt.sessions(&ns.0)
            .await?
            .into_iter()
            .map(Into::into)
            .collect();
    Ok(Json(Sessions { sessions }))
}

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
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such record in this namespace", body = ErrorBody),
        (status = 422, description = "Not a status that can be set, or nothing to resolve", body = ErrorBody),
    ))]
async fn patch_memory(
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

/// Refuses a status a caller cannot set (`archived`: archiving is its own operation, named
/// by `how_to_archive`).
pub(crate) fn settable(status: Status, how_to_archive: &str) -> ApiResult<()> {
    match status {
        Status::Pinned | Status::Obsolete | Status::Wrong | Status::Active => Ok(()),
        Status::Archived => Err(ApiError::invalid(
            "status",
            format!("set `pinned`, `obsolete`, `wrong` or `active`; {how_to_archive}"),
        )),
    }
}

/// `DELETE /v1/memories/{id}`: archives it (a soft delete) and answers the record.
#[utoipa::path(delete, path = "/v1/memories/{id}", tag = "memories",
    params(("id" = String, Path, description = "`mem-…`")),
    responses(
        (status = 200, description = "The archived record", body = Memory),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such record in this namespace", body = ErrorBody),
    ))]
async fn delete_memory(
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
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such record in this namespace", body = ErrorBody),
    ))]
async fn get_history(
    State(s): State<AppState>,
    ns: Namespace,
    Path(id): Path<String>,
) -> ApiResult<Json<History>> {
    let memory = s.rt.memory(&ns.0, id.parse()?)?;
    Ok(Json(history(&memory).await?))
}

/// A memory's audited changes, oldest first (HTTP and MCP).
pub(crate) async fn history(memory: &crate::MemoryHandle) -> ApiResult<History> {
    let entries = memory
        .history()
        .await?
        .into_iter()
        .map(Into::into)
        .collect();
    Ok(History { entries })
}

/// `POST /v1/knowledge/search`: like recall, over the knowledge tier only.
#[utoipa::path(post, path = "/v1/knowledge/search", tag = "knowledge",
    request_body = KnowledgeSearchIn,
    responses(
        (status = 200, description = "Ranked knowledge records", body = RecallOut),
        (status = 400, description = "Malformed JSON", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 422, description = "`k` out of range", body = ErrorBody),
    ))]
async fn post_knowledge_search(
    State(s): State<AppState>,
    ns: Namespace,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Json<RecallOut>> {
    let body: KnowledgeSearchIn = from_json("search", body)?;
    let k = s.limits.k(body.k)?;
    let result = s.rt.knowledge(&ns.0)?.search(&body.query, k).await?;
    Ok(Json(result.into()))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct GraphQuery {
    /// The record to start from (`mem-…`).
    around: Option<String>,
    /// How many edges away (0..=5, default 2).
    depth: Option<usize>,
}

/// Deepest neighbourhood a graph query may ask for.
const MAX_GRAPH_DEPTH: usize = 5;

/// `GET /v1/knowledge/graph?around={id}&depth=2`: the records within `depth` edges and the
/// edges among them.
#[utoipa::path(get, path = "/v1/knowledge/graph", tag = "knowledge",
    params(GraphQuery),
    responses(
        (status = 200, description = "Nodes and edges", body = Graph),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such record in this namespace", body = ErrorBody),
        (status = 422, description = "`around` missing or `depth` too deep", body = ErrorBody),
    ))]
async fn get_knowledge_graph(
    State(s): State<AppState>,
    ns: Namespace,
    query: Result<Query<GraphQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<Json<Graph>> {
    let Query(query) = query.map_err(|e| ApiError::invalid("query", e.body_text()))?;
    let Some(around) = query.around else {
        return Err(ApiError::invalid(
            "around",
            "name the record to start from: `?around=mem-…&depth=2`",
        ));
    };
    Ok(Json(graph(&s.rt, &ns.0, &around, query.depth).await?))
}

/// The records within `depth` edges of `around` (default 2) and the edges among them.
pub(crate) async fn graph(
    rt: &Runtime,
    ns: &str,
    around: &str,
    depth: Option<usize>,
) -> ApiResult<Graph> {
    let (nodes, edges) = graph_records(rt, ns, around, depth).await?;
    Ok(Graph {
        nodes: Memory::all_of(rt.substrate(), nodes)?,
        edges: edges.into_iter().map(Into::into).collect(),
    })
}

/// [`graph`] as the runtime's records and edges (what the dashboard draws).
pub(crate) async fn graph_records(
    rt: &Runtime,
    ns: &str,
    around: &str,
    depth: Option<usize>,
) -> ApiResult<(Vec<crate::MemoryRecord>, Vec<crate::Edge>)> {
    let depth = depth.unwrap_or(2);
    if depth > MAX_GRAPH_DEPTH {
        return Err(ApiError::invalid(
            "depth",
            format!("{depth} is too deep; ask for 0 to {MAX_GRAPH_DEPTH}"),
        ));
    }
    let (ids, edges) = rt.knowledge(ns)?.graph(around.parse()?, depth).await?;
    let mut nodes = Vec::with_capacity(ids.len());
    for id in ids {
        nodes.push(rt.memory(ns, id)?.get().await?);
    }
    Ok((nodes, edges))
}

/// The policy answer: its name, hash and compiled form.
pub(crate) fn policy_out(policy: &crate::policy::Policy) -> PolicyOut {
    let stamp = policy.stamp();
    PolicyOut {
        name: stamp.name,
        hash: stamp.hash,
        policy: policy.to_json(),
        namespaces: BTreeMap::new(),
    }
}

/// `GET /v1/policy`.
#[utoipa::path(get, path = "/v1/policy", tag = "policy",
    responses(
        (status = 200, description = "The policy in force for the caller's namespace (its own when `[[namespaces]]` gives it one, else the default)", body = PolicyOut),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
    ))]
async fn get_policy(State(s): State<AppState>, ns: Namespace) -> Json<PolicyOut> {
    Json(policy_out(&s.rt.policy_for(&ns.0)))
}

/// `POST /v1/policy/reload`: the new policy, or 422 with every error of the file (the
/// running policy stays).
#[utoipa::path(post, path = "/v1/policy/reload", tag = "policy",
    responses(
        (status = 200, description = "The newly active default policy, and the name and hash of each namespace's own", body = PolicyOut),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "A tenant key: the policy is server-wide, reloading it needs an admin key", body = ErrorBody),
        (status = 422, description = "Every error of every policy file; all the running policies stay", body = ErrorBody),
        (status = 409, description = "Cluster mode: the nodes read different policies (`policy_differs`, each node's name and hash); all the running policies stay", body = ErrorBody),
        (status = 503, description = "Cluster mode: a live node did not answer; the message says what changed", body = ErrorBody),
    ))]
async fn post_policy_reload(
    State(s): State<AppState>,
    _admin: Admin,
) -> ApiResult<Json<PolicyOut>> {
    let policies = s.rt.reload_policy().await?;
    let mut out = policy_out(&policies.default);
    out.namespaces = policies
        .namespaces
        .iter()
        .map(|(ns, p)| (ns.clone(), p.stamp().into()))
        .collect();
    Ok(Json(out))
}

#[cfg(test)]
mod tests {
    /// docs/http-api.md is the HTTP contract: every path of the OpenAPI document (what the
    /// router serves) must be named there, so a route added without its documentation
    /// fails here.
    #[test]
    fn the_http_contract_names_every_route() {
        let doc = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/http-api.md"),
        )
        .unwrap();
        let api = serde_json::to_value(super::ApiDoc::openapi()).unwrap();
        let paths = api["paths"].as_object().unwrap();
        assert!(paths.len() >= 15, "{:?}", paths.keys());
        // Each path named whole (`/v1/policy` is not named by `/v1/policy/reload`), with its
        // parameters as the code names them or a session's `{id}` as the table does.
        let named = |path: &str| {
            ["`", "?", " "]
                .iter()
                .any(|end| doc.contains(&format!("{path}{end}")))
        };
        let missing: Vec<&String> = paths
            .keys()
            .filter(|path| !named(path) && !named(&path.replace("{session_id}", "{id}")))
            .collect();
        assert!(
            missing.is_empty(),
            "docs/http-api.md does not name these routes: {missing:?}"
        )
    }

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
