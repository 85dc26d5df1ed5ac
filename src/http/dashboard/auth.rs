//! Who is looking: signing in with an API key, the session cookie that stands for it, the
//! CSRF token every form carries, and the checks on a state-changing request. The key
//! itself is read once, at sign-in, and never stored or sent back; the cookie holds a
//! random token whose SHA-256 names the sign-in. One server keeps its sign-ins in memory;
//! a cluster's nodes keep theirs where every node reads them ([`SharedSignIns`]: a NATS KV
//! bucket), so a visitor signed in at one node is signed in at all of them.

use std::net::IpAddr;
use std::sync::Arc;

use axum::extract::rejection::FormRejection;
use axum::extract::{Form, FromRef, FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use maud::html;
use serde::Deserialize;

use super::answer::{UiError, redirect};
use super::page;
use super::signins::{Logins, SIGN_IN_FOR};
use super::viewer::Viewer;
use crate::auth::{Auth, AuthThrottle, DEFAULT_NAMESPACE, Role, digest};
use crate::http::state::AppState;

/// The cookie that carries a sign-in's token over plain HTTP.
const COOKIE: &str = "shadowbrain_ui";

/// The same cookie behind a TLS-terminating proxy: `Secure`, and the `__Host-` prefix, so
/// no other host or path (and no plain-HTTP page) can set or shadow it.
const SECURE_COOKIE: &str = "__Host-shadowbrain_ui";

/// What signing in and seeing who is looking need: the keys, the failed-attempt throttle
/// and the sign-ins. Part of every router's state; a cluster node's front has one of its
/// own, sharing the sign-ins with the routers of the partitions it owns.
#[derive(Clone)]
pub(crate) struct DashboardAccess {
    auth: Arc<Auth>,
    throttle: Arc<AuthThrottle>,
    logins: Arc<Logins>,
}

impl DashboardAccess {
    pub(crate) fn new(auth: Arc<Auth>, throttle: Arc<AuthThrottle>, logins: Arc<Logins>) -> Self {
        DashboardAccess {
            auth,
            throttle,
            logins,
        }
    }

    /// The caller an API key names, failures counted per client address as one server's
    /// routers count them (a cluster node's front checks keys with it).
    #[cfg(feature = "cluster")]
    pub(crate) fn caller(
        &self,
        header: Option<&str>,
        ip: Option<std::net::IpAddr>,
    ) -> crate::api::ApiResult<(String, crate::auth::Role)> {
        crate::auth::throttled_caller(&self.auth, &self.throttle, header, ip)
    }

    /// The sign-ins behind this door (a cluster node lends them to the partitions it owns).
    #[cfg(feature = "cluster")]
    pub(crate) fn logins(&self) -> Arc<Logins> {
        self.logins.clone()
    }
}

impl FromRef<AppState> for DashboardAccess {
    fn from_ref(s: &AppState) -> DashboardAccess {
        DashboardAccess::new(s.auth.clone(), s.throttle.clone(), s.ui.logins.clone())
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Viewer
where
    DashboardAccess: FromRef<S>,
{
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, s: &S) -> Result<Self, Response> {
        // In cluster mode, the node the visitor reached read the cookie and sent who they
        // are, sealed (the cookie itself never crosses NATS).
        if let Some(verified) = parts.extensions.get::<crate::auth::Verified>()
            && let Some((csrf, signed_in)) = &verified.viewer
        {
            return Ok(Viewer {
                namespace: verified.namespace.clone(),
                role: if verified.admin {
                    Role::Admin
                } else {
                    Role::Tenant
                },
                csrf: csrf.clone(),
                signed_in: *signed_in,
                key: verified.key.clone(),
            });
        }
        let door = DashboardAccess::from_ref(s);
        if !door.auth.required() {
            // A keyless server listens on loopback only; a page elsewhere that makes a
            // browser resolve its own name to 127.0.0.1 (DNS rebinding) is refused here.
            if !loopback_host(&parts.headers) {
                return Err(UiError::new(
                    StatusCode::FORBIDDEN,
                    "forbidden_host",
                    "a server without API keys shows its dashboard at a loopback name only \
                     (localhost, 127.0.0.1, [::1]); configure keys to serve it under another",
                )
                .into_response());
            }
            return Ok(Viewer {
                namespace: DEFAULT_NAMESPACE.to_string(),
                role: Role::Admin,
                csrf: door
                    .logins
                    .open_csrf()
                    .await
                    .map_err(|e| e.into_response())?,
                signed_in: false,
                key: String::new(),
            });
        }
        let found = match cookie_token(&parts.headers) {
            Some(token) => door
                .logins
                .find(&token)
                .await
                .map_err(|e| e.into_response())?,
            None => None,
        };
        match found {
            Some(sign_in) => Ok(Viewer {
                namespace: sign_in.namespace,
                role: if sign_in.admin {
                    Role::Admin
                } else {
                    Role::Tenant
                },
                csrf: sign_in.csrf,
                signed_in: true,
                key: sign_in.key,
            }),
            None => {
                let next = match parts.method {
                    axum::http::Method::GET => parts
                        .uri
                        .path_and_query()
                        .map_or("/".to_string(), |p| p.as_str().to_string()),
                    _ => "/".to_string(),
                };
                Err(sign_in_page(&next, None, StatusCode::UNAUTHORIZED))
            }
        }
    }
}

/// Whether the `Host` names this machine's loopback (or is absent, as from HTTP/1.0).
fn loopback_host(headers: &HeaderMap) -> bool {
    let Some(host) = headers.get(header::HOST).and_then(|h| h.to_str().ok()) else {
        return headers.get(header::HOST).is_none();
    };
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    }
    .to_ascii_lowercase();
    name == "localhost"
        || name.ends_with(".localhost")
        || name.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The sign-in's token: the `__Host-` cookie when there is one, else the plain one.
fn cookie_token(headers: &HeaderMap) -> Option<String> {
    let pairs = || {
        headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .filter_map(|pair| pair.trim().split_once('='))
    };
    let named = |cookie: &str| {
        pairs()
            .find(|(name, _)| *name == cookie)
            .map(|(_, value)| value.to_string())
    };
    named(SECURE_COOKIE).or_else(|| named(COOKIE))
}

/// Refuses a state change this server's own page did not send: a cross-site
/// `Sec-Fetch-Site`, an `Origin` other than this server, or a CSRF token other than the
/// visitor's.
pub(super) fn check_form(viewer: &Viewer, headers: &HeaderMap, csrf: &str) -> Result<(), UiError> {
    same_origin(headers)?;
    let (a, b) = (csrf.as_bytes(), viewer.csrf.as_bytes());
    // Compared in full whatever differs first, so the time taken says nothing of the token.
    let same = a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0;
    if !same {
        return Err(UiError::new(
            StatusCode::FORBIDDEN,
            "csrf",
            "this form did not come from this dashboard's own page (its token is missing or \
             stale); reload the page and submit it again",
        ));
    }
    Ok(())
}

fn same_origin(headers: &HeaderMap) -> Result<(), UiError> {
    let cross = || {
        UiError::new(
            StatusCode::FORBIDDEN,
            "cross_site",
            "another site's page sent this request; the dashboard takes changes from its own \
             pages only",
        )
    };
    let text = |name| {
        headers
            .get(name)
            .and_then(|v: &HeaderValue| v.to_str().ok())
    };
    if let Some(site) = text(header::HeaderName::from_static("sec-fetch-site"))
        && !matches!(site, "same-origin" | "none")
    {
        return Err(cross());
    }
    if let Some(origin) = text(header::ORIGIN) {
        let host = origin
            .strip_prefix("http://")
            .or_else(|| origin.strip_prefix("https://"));
        let this = text(header::HOST);
        if !matches!((host, this), (Some(h), Some(t)) if h.eq_ignore_ascii_case(t)) {
            return Err(cross());
        }
    }
    Ok(())
}

/// Where to go after signing in: a path of this server only, never another site. Browsers
/// drop tabs and newlines from a `Location` and read `\\` as `/`, so `/<TAB>/evil.example`
/// would become `//evil.example`: only visible ASCII is accepted, starting with one `/` and
/// with no backslash anywhere; anything else goes to the overview.
fn safe_next(next: Option<&str>) -> String {
    match next {
        Some(n)
            if n.starts_with('/')
                && !n.starts_with("//")
                && n.bytes().all(|b| b.is_ascii_graphic() && b != b'\\') =>
        {
            n.to_string()
        }
        _ => "/".to_string(),
    }
}

/// The sign-in page: a key prompt and nothing else.
fn sign_in_page(next: &str, error: Option<&str>, status: StatusCode) -> Response {
    let body = page::bare(
        "Sign in",
        html! {
            h1 { "Sign in to shadowbrain" }
            p { "This server has API keys. Enter one to see its namespace; an admin key also \
                 shows the server's figures." }
            @if let Some(error) = error {
                p.error role="alert" { (error) }
            }
            form.signin method="post" action="/ui/login" {
                input type="hidden" name="next" value=(next);
                label for="key" { "API key" }
                input #key type="password" name="key" required autocomplete="off" autofocus;
                button type="submit" { "Sign in" }
            }
        },
    );
    (status, axum::response::Html(body.into_string())).into_response()
}

#[derive(Debug, Deserialize)]
pub(super) struct NextQuery {
    next: Option<String>,
}

/// `GET /ui/login`: the key prompt (or, when already signed in or no keys are
/// configured, straight on).
pub(super) async fn login_page(
    State(s): State<DashboardAccess>,
    headers: HeaderMap,
    query: axum::extract::Query<NextQuery>,
) -> Response {
    let next = safe_next(query.next.as_deref());
    let signed_in = match cookie_token(&headers) {
        Some(token) => matches!(s.logins.find(&token).await, Ok(Some(_))),
        None => false,
    };
    if !s.auth.required() || signed_in {
        return redirect(&next);
    }
    sign_in_page(&next, None, StatusCode::OK)
}

#[derive(Debug, Deserialize)]
pub(super) struct SignInForm {
    key: String,
    next: Option<String>,
}

/// The client's address, for the failed-sign-in throttle, and whether it reached a
/// trusted TLS-terminating proxy over HTTPS (the cookie is `Secure` then).
pub(super) struct ClientIp(Option<IpAddr>, bool);

impl<S: Send + Sync> FromRequestParts<S> for ClientIp {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let https = parts
            .extensions
            .get::<crate::http::Client>()
            .is_some_and(|c| c.https);
        Ok(ClientIp(crate::http::auth::client_ip(parts), https))
    }
}

/// `POST /ui/login`: checks the key as `/v1` would (same failed-attempt throttle), then
/// sets the session cookie and goes on to `next`.
pub(super) async fn login(
    State(s): State<DashboardAccess>,
    ClientIp(ip, https): ClientIp,
    headers: HeaderMap,
    form: Result<Form<SignInForm>, FormRejection>,
) -> Response {
    if let Err(e) = same_origin(&headers) {
        return e.into_response();
    }
    let Ok(Form(form)) = form else {
        return sign_in_page(
            "/",
            Some("The form was incomplete; enter a key."),
            StatusCode::BAD_REQUEST,
        );
    };
    let next = safe_next(form.next.as_deref());
    if !s.auth.required() {
        return redirect(&next);
    }
    let now = std::time::Instant::now();
    let key = form.key.trim();
    let bearer = format!("Bearer {key}");
    let caller = s.auth.caller(Some(&bearer));
    // Only failing sign-ins are throttled (and counted): a valid key is never refused for
    // others' mistakes from the same address.
    if caller.is_err()
        && let Some(wait) = ip.and_then(|ip| s.throttle.refuse(ip, now))
    {
        let message = format!(
            "Too many failed sign-ins from this address; wait {}s and try again.",
            wait.as_secs().max(1)
        );
        return sign_in_page(&next, Some(&message), StatusCode::TOO_MANY_REQUESTS);
    }
    match caller {
        Ok((namespace, role)) => {
            let token = match s.logins.start(digest(key), namespace, role).await {
                Ok(token) => token,
                Err(e) => return e.into_response(),
            };
            let mut answer = redirect(&next);
            if let Some(cookie) = set_cookie(https, &token, SIGN_IN_FOR.as_secs()) {
                answer.headers_mut().insert(header::SET_COOKIE, cookie);
            }
            answer
        }
        Err(_) => sign_in_page(
            &next,
            Some("That key is not one of this server's keys."),
            StatusCode::UNAUTHORIZED,
        ),
    }
}

#[derive(Debug, Deserialize)]
pub(super) struct CsrfForm {
    pub(super) csrf: String,
}

/// `POST /ui/logout`: ends the sign-in and clears the cookie.
pub(super) async fn logout(
    State(s): State<DashboardAccess>,
    viewer: Viewer,
    headers: HeaderMap,
    form: Result<Form<CsrfForm>, FormRejection>,
) -> Response {
    let csrf = form.map(|Form(f)| f.csrf).unwrap_or_default();
    if let Err(e) = check_form(&viewer, &headers, &csrf) {
        return e.into_response();
    }
    if let Some(token) = cookie_token(&headers)
        && let Err(e) = s.logins.end(&token).await
    {
        return e.into_response();
    }
    let mut answer = redirect("/ui/login");
    // Both cookies: the visitor may have signed in over HTTP or behind an HTTPS proxy.
    for secure in [false, true] {
        if let Some(cleared) = set_cookie(secure, "", 0) {
            answer.headers_mut().append(header::SET_COOKIE, cleared);
        }
    }
    answer
}

/// The `Set-Cookie` value that sets the sign-in cookie to `token` for `max_age` seconds (0
/// clears it): [`SECURE_COOKIE`] when the visitor came over HTTPS, else [`COOKIE`].
fn set_cookie(secure: bool, token: &str, max_age: u64) -> Option<HeaderValue> {
    let (name, flag) = match secure {
        true => (SECURE_COOKIE, "Secure; "),
        false => (COOKIE, ""),
    };
    HeaderValue::from_str(&format!(
        "{name}={token}; {flag}HttpOnly; SameSite=Strict; Path=/; Max-Age={max_age}"
    ))
    .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(name: header::HeaderName, value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(name, HeaderValue::from_str(value).unwrap());
        h
    }

    #[test]
    fn only_loopback_names_pass_the_keyless_host_check() {
        for ok in [
            "localhost:7420",
            "127.0.0.1:7420",
            "[::1]:7420",
            "a.localhost",
            "127.0.0.1",
        ] {
            assert!(loopback_host(&with(header::HOST, ok)), "{ok}");
        }
        for bad in [
            "evil.example:7420",
            "10.0.0.1:7420",
            "localhost.evil.example",
            "[fe80::1]:1",
        ] {
            assert!(!loopback_host(&with(header::HOST, bad)), "{bad}");
        }
    }

    #[test]
    fn the_next_page_is_always_on_this_server() {
        assert_eq!(safe_next(Some("/ui/search?query=x")), "/ui/search?query=x");
        for bad in [
            "//evil.example/",
            "https://evil.example/",
            "/\\evil.example",
            "\\\\evil.example",
            "ui",
            "/\t/evil.example",
            "/\n/evil.example",
            "/\r/evil.example",
            "/ /evil.example",
            "/\u{3000}/evil.example",
            "/\u{ff0f}evil.example",
            "/。/evil.example",
            "\t//evil.example",
            "https:evil.example",
            "javascript:alert(1)",
            "",
        ] {
            assert_eq!(safe_next(Some(bad)), "/", "{bad:?}");
        }
        // Encoded forms stay one path on this server (a browser does not decode them into
        // an authority).
        assert_eq!(
            safe_next(Some("/%2F%2Fevil.example")),
            "/%2F%2Fevil.example"
        );
        assert_eq!(safe_next(None), "/");
    }

    #[test]
    fn a_cross_site_request_is_refused_and_a_same_origin_one_passes() {
        let mut h = with(header::HOST, "127.0.0.1:7420");
        assert!(same_origin(&h).is_ok());
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://127.0.0.1:7420"),
        );
        assert!(same_origin(&h).is_ok());
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://evil.example"),
        );
        assert!(same_origin(&h).is_err());
        h.insert(header::ORIGIN, HeaderValue::from_static("null"));
        assert!(same_origin(&h).is_err());
        let mut h = with(header::HOST, "127.0.0.1:7420");
        h.insert("sec-fetch-site", HeaderValue::from_static("cross-site"));
        assert!(same_origin(&h).is_err());
    }

    #[test]
    fn the_cookie_token_is_read_among_other_cookies() {
        let h = with(header::COOKIE, "a=1; shadowbrain_ui=abc; b=2");
        assert_eq!(cookie_token(&h).as_deref(), Some("abc"));
        assert_eq!(cookie_token(&HeaderMap::new()), None);
    }
}
