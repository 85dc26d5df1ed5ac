//! The dashboard over HTTP as a browser would reach it, without one: pages with their
//! status and headers (redirects shown, not followed), form posts from the site itself
//! or from elsewhere, and `/v1` calls with an API key, against any server's address (a
//! single `serve` or any node of a cluster).

use serde_json::{Value, json};

use super::serve::Served;

/// A page: status, headers, body.
pub(crate) struct Page {
    pub(crate) status: u16,
    pub(crate) headers: reqwest::header::HeaderMap,
    pub(crate) body: String,
}

impl Page {
    /// The value of header `name` (empty when absent).
    pub(crate) fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }
}

/// An HTTP client that shows redirects instead of following them.
fn client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// A server's site: its base URL and a client.
pub(crate) struct Site {
    pub(crate) base: String,
    pub(crate) http: reqwest::Client,
}

impl Site {
    /// The server `served`.
    pub(crate) fn of(served: &Served) -> Site {
        Site::at(served.addr)
    }

    /// The server listening at `addr`.
    pub(crate) fn at(addr: std::net::SocketAddr) -> Site {
        Site {
            base: format!("http://{addr}"),
            http: client(),
        }
    }

    /// A GET, with the sign-in cookie when given.
    pub(crate) async fn get(&self, path: &str, cookie: Option<&str>) -> Page {
        let mut request = self.http.get(format!("{}{path}", self.base));
        if let Some(c) = cookie {
            request = request.header("cookie", c);
        }
        page(request).await
    }

    /// A form post as a browser on this site sends it.
    pub(crate) async fn post(
        &self,
        path: &str,
        cookie: Option<&str>,
        fields: &[(&str, &str)],
    ) -> Page {
        self.post_from(path, cookie, fields, Some(&self.base)).await
    }

    /// A form post with `origin` as its Origin header (none: `None`).
    pub(crate) async fn post_from(
        &self,
        path: &str,
        cookie: Option<&str>,
        fields: &[(&str, &str)],
        origin: Option<&str>,
    ) -> Page {
        let body = fields
            .iter()
            .map(|(k, v)| format!("{}={}", enc(k), enc(v)))
            .collect::<Vec<_>>()
            .join("&");
        let mut request = self
            .http
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body);
        if let Some(c) = cookie {
            request = request.header("cookie", c);
        }
        if let Some(o) = origin {
            request = request.header("origin", o);
        }
        page(request).await
    }

    /// Any request with an API key, its answer as it comes (no status expected).
    pub(crate) async fn keyed(&self, method: &str, path: &str, key: Option<&str>) -> Page {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(k) = key {
            request = request.bearer_auth(k);
        }
        page(request).await
    }

    /// A `/v1` call that must succeed: its answer as JSON.
    pub(crate) async fn api(
        &self,
        method: &str,
        path: &str,
        key: Option<&str>,
        body: Option<Value>,
    ) -> Value {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(k) = key {
            request = request.bearer_auth(k);
        }
        if let Some(b) = body {
            request = request
                .header("content-type", "application/json")
                .body(b.to_string());
        }
        let answer = request.send().await.unwrap();
        let status = answer.status().as_u16();
        let text = answer.text().await.unwrap();
        assert!(status < 300, "{path}: {status} {text}");
        serde_json::from_str(&text).unwrap_or(Value::Null)
    }

    /// Writes a session's events through `/v1` and answers their ids.
    pub(crate) async fn write(
        &self,
        key: Option<&str>,
        session: &str,
        texts: &[&str],
    ) -> Vec<String> {
        let events: Vec<Value> = texts
            .iter()
            .map(|t| json!({"kind": "observation", "text": t}))
            .collect();
        let ids = self
            .api(
                "POST",
                &format!("/v1/sessions/{session}/events"),
                key,
                Some(json!({ "events": events })),
            )
            .await;
        ids["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect()
    }

    /// A namespace-wide recall through `/v1`.
    pub(crate) async fn recall(&self, key: Option<&str>, session: &str, query: &str) -> Value {
        self.api(
            "POST",
            &format!("/v1/sessions/{session}/recall"),
            key,
            Some(json!({"query": query, "scope": "namespace", "k": 20})),
        )
        .await
    }
}

/// Sends `request`; its answer as a page.
async fn page(request: reqwest::RequestBuilder) -> Page {
    let answer = request.send().await.unwrap();
    Page {
        status: answer.status().as_u16(),
        headers: answer.headers().clone(),
        body: answer.text().await.unwrap(),
    }
}

/// `v` percent-encoded for a form.
fn enc(v: &str) -> String {
    v.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The value of the page's first hidden `csrf` field.
pub(crate) fn csrf_of(body: &str) -> String {
    let at = body
        .find("name=\"csrf\" value=\"")
        .expect("a form with a CSRF token");
    let rest = &body[at + "name=\"csrf\" value=\"".len()..];
    rest[..rest.find('"').unwrap()].to_string()
}

/// The `name=value` of the sign-in cookie a login answered.
pub(crate) fn cookie_of(page: &Page) -> String {
    let set = page.header("set-cookie");
    assert!(
        set.contains("HttpOnly") && set.contains("SameSite=Strict"),
        "{set}"
    );
    set.split(';').next().unwrap().to_string()
}
