//! The HTTP edge (`shadowbrain serve`): axum over the actor runtime's [`Runtime`] handle,
//! implementing the contract of docs/http-api.md — paths, bodies, status codes and the error
//! shape `{"error":{"code","message"}}` — for the endpoints listed in [`router`], with API
//! keys that map to namespaces ([`crate::auth`]) and Prometheus metrics ([`crate::metrics`]);
//! `/mcp`, the MCP server of [`crate::mcp`] over Streamable HTTP, behind the same keys, body
//! limit, admission slots and metrics; and the dashboard (`GET /`, `/ui/…`, [`dashboard`]),
//! HTML for people, through a sign-in with the same keys.
//!
//! Handlers only translate: they parse and bound the request, call the handle, and map the
//! answer or the error. Validation of events, ids and limits on text and content lives in
//! the substrate, so an embedded application gets the same errors; this layer adds what
//! only HTTP has (body size, malformed JSON, query parameters) and maps each error variant
//! to a status without rewriting its message, which already says how to fix the request.
//!
//! One file per route group (`events`, `sessions`, `memories`, `knowledge`, `policy`,
//! `operations`), the router's shared state (`state`), who the caller is (`auth`), what
//! runs around every request (`middleware`), the OpenAPI document (`openapi`) and the
//! connections under it all (`connections`).

use std::future::Future;
use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::middleware::{from_fn_with_state, map_response};
use axum::routing::{get, post};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;

use crate::admission::Admission;
use crate::auth::{Auth, AuthThrottle};
use crate::mcp::McpServer;
use crate::metrics::Metrics;
use crate::{Limits, Runtime};
use state::{AppState, McpSessions};

mod auth;
mod connections;
pub(crate) mod dashboard;
mod events;
mod knowledge;
mod memories;
mod middleware;
mod openapi;
mod operations;
mod policy;
mod sessions;
mod state;

#[cfg(feature = "cluster")]
pub(crate) use auth::client_ip_in;
pub use connections::{Client, Drained, Proxies, ServerConfig, ServerLimits, raise_to_realtime};
pub use events::{IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED};
pub(crate) use events::{record, record_read};
pub use openapi::ApiDoc;
#[cfg(feature = "cluster")]
pub(crate) use openapi::get_openapi;
pub(crate) use sessions::recall;
#[cfg(feature = "cluster")]
pub(crate) use state::{ClusterNode, InCluster, NodeFuture};

/// What a router serves by: the limits of every door, the API keys, and the `[server]`
/// settings (connections, timeouts, admission). `Options::default()` is a keyless server
/// with the default limits.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// The limits of every door (`[limits]`).
    pub limits: Limits,
    /// Who may call (`[[auth.keys]]`).
    pub auth: Auth,
    /// Connections, timeouts and admission (`[server]`).
    pub server: ServerLimits,
}

/// What the server itself wires into a router beyond [`Options`]: where admitted requests
/// are answered, the metrics counted into, what ends open MCP streams, and the cluster
/// node a partition's router belongs to.
#[derive(Default)]
pub(crate) struct Wiring {
    /// Where admitted requests are answered, when not on the connections' own runtime
    /// (see [`serve`]).
    pub(crate) work: Option<tokio::runtime::Handle>,
    /// The metrics every request counts into (a fresh set when `None`).
    pub(crate) metrics: Option<Arc<Metrics>>,
    /// Cancelled to end every open MCP session's streams.
    pub(crate) closing: CancellationToken,
    /// The cluster node this router serves a partition of (`None`: a single server).
    pub(crate) cluster: Option<state::InCluster>,
}

/// The routes of docs/http-api.md: health and metrics, session events, recall, feedback,
/// condense and timeline, the session list, one memory (get, status, archive, history),
/// knowledge search and graph, the policy (get, reload), `/mcp` and the dashboard
/// (docs/mcp.md, docs/dashboard.md).
/// Every request's body is held to `server.body_timeout` between chunks and, when it
/// declares its length, to the body limit before a byte of it is read
/// (`middleware::guard_body`).
pub fn router(rt: Runtime, options: Options) -> Router {
    router_with(rt, options, Wiring::default())
}

/// [`router`], wired as [`Wiring`] says. Cluster mode builds one per partition it owns.
pub(crate) fn router_with(rt: Runtime, options: Options, wiring: Wiring) -> Router {
    let Options {
        limits,
        auth,
        server,
    } = options;
    let body_limit = limits.max_body_bytes;
    let state = AppState {
        rt,
        limits: Arc::new(limits),
        auth: Arc::new(auth),
        metrics: wiring.metrics.unwrap_or_else(|| Arc::new(Metrics::new())),
        admission: Arc::new(Admission::new(server.admission())),
        edge: server,
        throttle: Arc::new(AuthThrottle::default()),
        work: wiring.work,
        ui: Arc::new(dashboard::Ui::new(match &wiring.cluster {
            Some(c) => c.logins.clone(),
            None => Arc::new(dashboard::Logins::here()),
        })),
        cluster: wiring.cluster,
        mcp_sessions: Arc::new(McpSessions::new()),
    };
    let mcp = mcp_service(&state, wiring.closing);
    Router::new()
        .route("/healthz", get(operations::healthz))
        .route(
            "/v1/sessions/{session_id}/events",
            post(events::post_events),
        )
        .route(
            "/v1/sessions/{session_id}/recall",
            post(sessions::post_recall),
        )
        .route(
            "/v1/sessions/{session_id}/feedback",
            post(sessions::post_feedback),
        )
        .route(
            "/v1/sessions/{session_id}/condense",
            post(sessions::post_condense),
        )
        .route(
            "/v1/sessions/{session_id}/timeline",
            get(sessions::get_timeline),
        )
        .route("/v1/sessions", get(sessions::get_sessions))
        .route(
            "/v1/memories/{id}",
            get(memories::get_memory)
                .patch(memories::patch_memory)
                .delete(memories::delete_memory),
        )
        .route("/v1/memories/{id}/history", get(memories::get_history))
        .route(
            "/v1/knowledge/search",
            post(knowledge::post_knowledge_search),
        )
        .route("/v1/knowledge/graph", get(knowledge::get_knowledge_graph))
        .route("/v1/policy", get(policy::get_policy))
        .route("/v1/policy/reload", post(policy::post_policy_reload))
        .route("/metrics", get(operations::get_metrics))
        .route("/openapi.json", get(openapi::get_openapi))
        .merge(dashboard::routes())
        .route_service(
            "/mcp",
            axum::routing::any_service(mcp)
                .layer(from_fn_with_state(state.clone(), middleware::mcp_caller)),
        )
        .route_layer(from_fn_with_state(state.clone(), middleware::admit))
        .route_layer(from_fn_with_state(state.clone(), middleware::track))
        .fallback(operations::no_route)
        .layer(from_fn_with_state(state.clone(), middleware::guard_body))
        .layer(map_response(middleware::errors_in_the_contract_shape))
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

/// Serves `rt` on `listener` until `shutdown` completes, then stops accepting, lets the
/// requests in flight finish within `server.drain_timeout` (closing the connections still
/// open after it), and shuts the runtime down (drain and flush). See `connections`.
///
/// The connections (reading requests, the admission decision, writing answers) run on a
/// thread of their own, and every admitted request is answered on the calling runtime:
/// when the calling runtime's workers are all busy (ingest, recall, background work), a
/// request past the admission limits need not wait for one of them to be refused.
pub async fn serve(
    listener: tokio::net::TcpListener,
    rt: Runtime,
    options: Options,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<Drained> {
    let metrics = Arc::new(Metrics::new());
    let counts = metrics.connections();
    let closing = CancellationToken::new();
    let edge = options
        .server
        .clone()
        .lingering_for(options.limits.max_body_bytes);
    let wiring = Wiring {
        work: Some(tokio::runtime::Handle::current()),
        metrics: Some(metrics),
        closing: closing.clone(),
        cluster: None,
    };
    let options = Options {
        server: edge.clone(),
        ..options
    };
    let app = router_with(rt.clone(), options, wiring);
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
    edge: ServerLimits,
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
                && let Err(e) = connections::raise_to_realtime()
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
                            connections::serve_connections(listener, app, edge, counts, shutdown);
                        Ok(served.await)
                    })
                });
            let _ = done.send(outcome);
        })?;
    drained
        .await
        .map_err(|_| anyhow::anyhow!("the connections' thread panicked"))?
}
