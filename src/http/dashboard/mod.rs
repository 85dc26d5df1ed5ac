//! The dashboard (docs/dashboard.md): `GET /` and the views under `/ui/`, served by `serve`
//! on its own port, as server-rendered HTML (maud templates, which escape every value) with
//! two small ES modules for what HTML cannot do alone (the graph, drawn by the vendored
//! Cytoscape.js, and the overview's live figures). Every asset is compiled into the binary;
//! the pages fetch nothing from anywhere else.
//!
//! Who sees what follows the API keys: with none configured, a loopback visitor sees
//! namespace `default` with every operation (as `/v1` does); with keys, a visitor signs in
//! with one (`/ui/login`) and sees only that key's namespace, and the server-wide figures
//! and policy reload need an admin key. The key is never put in a URL or a cookie: signing
//! in makes a random session token, kept in an `HttpOnly; SameSite=Strict` cookie and mapped
//! to the key's namespace and role in memory (a restart signs everyone out) or, in cluster
//! mode, in a NATS KV bucket every node reads (see [`front`]). Every state
//! change is a `POST` carrying the page's CSRF token and, when the browser sends them, an
//! `Origin` of this server and a `Sec-Fetch-Site` of `same-origin`.
//!
//! The views only read, except the memory actions (pin, obsolete, wrong, archive, restore)
//! and the policy reload, which go through the same handles and audit trail as `/v1`.

mod answer;
mod auth;
mod insights;
mod knowledge;
mod memory;
mod overview;
mod page;
mod policy;
mod search;
mod sessions;
pub(crate) mod signins;
pub(in crate::http) mod ui;
mod viewer;

use axum::Router;
use axum::extract::{Path, Request};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use super::state::AppState;
use answer::{UiError, redirect};
#[cfg(feature = "cluster")]
pub(crate) use auth::DashboardAccess;
pub(crate) use signins::Logins;
#[cfg(feature = "cluster")]
pub(crate) use signins::{SIGN_IN_FOR, Shared, SharedSignIns, SignIn};
pub(in crate::http) use ui::Ui;
use viewer::Viewer;

/// The dashboard's routes, to merge into the server's router.
pub(super) fn routes() -> Router<AppState> {
    Router::new()
        .route("/", get(overview::page))
        .route("/ui", get(|| async { redirect("/") }))
        .route("/ui/", get(|| async { redirect("/") }))
        .route("/ui/login", get(auth::login_page).post(auth::login))
        .route("/ui/logout", post(auth::logout))
        .route("/ui/sessions", get(sessions::list))
        .route("/ui/sessions/{id}", get(sessions::timeline))
        .route("/ui/search", get(search::page))
        .route("/ui/memories/{id}", get(memory::page))
        .route("/ui/memories/{id}/status", post(memory::set_status))
        .route("/ui/knowledge", get(knowledge::pool))
        .route("/ui/graph", get(knowledge::graph))
        .route("/ui/insights", get(insights::page))
        .route("/ui/policy", get(policy::page))
        .route("/ui/policy/reload", post(policy::reload))
        .route("/ui/assets/{name}", get(asset))
        .route("/ui/{*rest}", get(not_found))
        .layer(middleware::from_fn(protect))
}

#[cfg(feature = "cluster")]
/// What a cluster node's front serves itself (`crate::cluster`): signing in and out, whose
/// sign-ins every node reads, and the assets. Every other page is its visitor's namespace's:
/// the front finds the namespace with [`visitor`] and hands the request to its partition.
pub(crate) fn front(door: DashboardAccess) -> Router {
    Router::new()
        .route("/ui/login", get(auth::login_page).post(auth::login))
        .route("/ui/logout", post(auth::logout))
        .route("/ui/assets/{name}", get(asset))
        .layer(middleware::from_fn(protect))
        .with_state(door)
}

#[cfg(feature = "cluster")]
/// Whether a path is the dashboard's (`/`, `/ui` and below).
pub(crate) fn is_dashboard(path: &str) -> bool {
    path == "/" || path == "/ui" || path.starts_with("/ui/")
}

#[cfg(feature = "cluster")]
/// Whether a cluster node's front answers `path` itself ([`front`]).
pub(crate) fn served_by_front(path: &str) -> bool {
    matches!(path, "/ui/login" | "/ui/logout") || path.starts_with("/ui/assets/")
}

#[cfg(feature = "cluster")]
/// Who the visitor of a dashboard page is (what the partition's owner is told instead of
/// the cookie), with the request to hand on; or the answer when there is none to show (the
/// sign-in page, a refused host).
pub(crate) async fn visitor(
    door: &DashboardAccess,
    request: Request,
) -> Result<(crate::auth::Verified, Request), Response> {
    use axum::extract::FromRequestParts;
    let (mut parts, body) = request.into_parts();
    match Viewer::from_request_parts(&mut parts, door).await {
        Ok(viewer) => {
            let verified = crate::auth::Verified {
                admin: viewer.admin(),
                namespace: viewer.namespace,
                key: viewer.key,
                client: crate::http::client_ip_in(&parts.extensions),
                viewer: Some((viewer.csrf, viewer.signed_in)),
            };
            Ok((verified, Request::from_parts(parts, body)))
        }
        Err(mut answer) => {
            secure(&mut answer, false);
            Err(answer)
        }
    }
}

/// Every dashboard answer: what the page may load (itself only, no inline script), never
/// framed, never sniffed, never cached when it shows data.
async fn protect(request: Request, next: Next) -> Response {
    let is_asset = request.uri().path().starts_with("/ui/assets/");
    let mut answer = next.run(request).await;
    secure(&mut answer, is_asset);
    answer
}

/// The headers of [`protect`].
fn secure(answer: &mut Response, is_asset: bool) {
    let headers = answer.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
             connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    if !is_asset {
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
}

/// An unknown view: only a visitor who may see the dashboard learns that it is unknown.
async fn not_found(_viewer: Viewer) -> UiError {
    UiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        "the dashboard has no such page; its views are listed in the navigation",
    )
}

/// The assets, compiled in: the stylesheet, the icon, the two modules and the vendored
/// Cytoscape.js (MIT, its licence beside it and served at `cytoscape.LICENSE.txt`).
const ASSETS: [(&str, &str, &[u8]); 6] = [
    (
        "favicon.svg",
        "image/svg+xml",
        include_bytes!("assets/favicon.svg"),
    ),
    (
        "app.css",
        "text/css; charset=utf-8",
        include_bytes!("assets/app.css"),
    ),
    (
        "live.js",
        "text/javascript; charset=utf-8",
        include_bytes!("assets/live.js"),
    ),
    (
        "graph.js",
        "text/javascript; charset=utf-8",
        include_bytes!("assets/graph.js"),
    ),
    (
        "cytoscape.esm.min.mjs",
        "text/javascript; charset=utf-8",
        include_bytes!("assets/vendor/cytoscape/cytoscape.esm.min.mjs"),
    ),
    (
        "cytoscape.LICENSE.txt",
        "text/plain; charset=utf-8",
        include_bytes!("assets/vendor/cytoscape/LICENSE"),
    ),
];

/// `GET /ui/assets/{name}`: public (the sign-in page needs its stylesheet) and cacheable
/// for an hour; the names change with their content's version.
async fn asset(Path(name): Path<String>) -> Response {
    match ASSETS.iter().find(|(n, _, _)| *n == name) {
        Some((_, kind, bytes)) => (
            [
                (header::CONTENT_TYPE, *kind),
                (header::CACHE_CONTROL, "public, max-age=3600"),
            ],
            *bytes,
        )
            .into_response(),
        None => UiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no asset `{name}`"),
        )
        .into_response(),
    }
}
