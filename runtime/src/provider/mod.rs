//! The one OpenAI-compatible transport: every call to an embedding or chat endpoint
//! (OpenAI itself, Ollama, vLLM, TEI, LM Studio) goes through a [`Transport`], so the
//! plumbing is written once and the embedder ([`crate::embed`]) and the chat client of the
//! judge and condenser ([`crate::llm`]) differ only in what they send and read.
//!
//! It owns: the checks of the settings both config sections share (`base_url`, the name
//! of the key's environment variable, `timeout`); reading the key once; the per-request
//! timeout; bounded concurrency (`max_concurrency` requests on the wire across every caller,
//! a permit held only while a request is in flight, never while it backs off); and retries.
//! Timeouts, connection errors, 408, 429 and 5xx are retried at most `max_retries` times,
//! after exponential backoff with jitter, or after the server's `Retry-After` (capped at
//! [`Transport::RETRY_AFTER_MAX`]). A 429 for lack of quota and a refused key fail at once.
//! Any other status goes back to the caller, which knows what its endpoint means by it
//! (the chat client asks again without `response_format`; the embedder names `/embeddings`).
//!
//! It must never log, print or put into an error the API key: the key is read from the
//! environment variable the configuration names, sent only as a bearer token, and scrubbed
//! from anything a server echoes back.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::Semaphore;

use crate::error::{Error, Result};

/// Provider name in [`Error::Provider`].
const PROVIDER: &str = "openai";

/// How to reach one endpoint, already read from its config section.
#[derive(Debug, Clone)]
pub(crate) struct Settings<'a> {
    /// The config section the settings came from (`embedder`, `llm`), for messages.
    pub section: &'static str,
    /// What a request asks for (`embedding`, `chat`), for messages.
    pub what: &'static str,
    /// The API root, checked by [`base_url`] (no trailing slash).
    pub base_url: String,
    /// The model every request names.
    pub model: String,
    /// The environment variable holding the key (unset: no key, as local servers expect).
    pub api_key_env: &'a str,
    /// Per-request timeout.
    pub timeout: Duration,
    /// Requests on the wire at once, across every caller.
    pub max_concurrency: usize,
    /// Retries of a transient failure after the first attempt.
    pub max_retries: u32,
    /// First delay between retries; doubled each time up to `backoff_max`, with jitter.
    pub backoff_base: Duration,
    /// Longest computed delay between retries.
    pub backoff_max: Duration,
}

/// A 2xx answer, read to the end.
#[derive(Debug)]
pub(crate) struct Answer {
    /// The body.
    pub body: Vec<u8>,
}

/// A request that did not get a 2xx answer.
#[derive(Debug)]
pub(crate) enum Refusal {
    /// The endpoint answered a status the transport leaves to the caller (400, 404,
    /// 422 …); never retried. `message` is the server's, truncated and scrubbed.
    Status {
        /// The HTTP status.
        status: u16,
        /// What the server said.
        message: String,
    },
    /// Failed for good: a refused key, no quota, or every retry spent.
    Failed(Error),
}

/// One OpenAI-compatible endpoint: its HTTP client, key, bounds and counters. Cheap to
/// share behind an `Arc`; every caller shares the concurrency bound and the counters.
pub(crate) struct Transport {
    section: &'static str,
    what: &'static str,
    base_url: String,
    model: String,
    api_key_env: String,
    /// Sent as the bearer token and scrubbed from server messages; never printed.
    api_key: String,
    http: reqwest::Client,
    timeout: Duration,
    max_retries: u32,
    backoff_base: Duration,
    backoff_max: Duration,
    /// One permit per request on the wire.
    in_flight: Semaphore,
    max_concurrency: usize,
    requests: AtomicU64,
    retries: AtomicU64,
}

impl fmt::Debug for Transport {
    // Hand-written so that no field can ever print the key.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Transport")
            .field("base_url", &self.base_url)
            .field("model", &self.model)
            .field("api_key_env", &self.api_key_env)
            .field("timeout", &self.timeout)
            .field("max_concurrency", &self.max_concurrency)
            .field("max_retries", &self.max_retries)
            .finish_non_exhaustive()
    }
}

/// What went wrong with one attempt.
enum Attempt {
    /// Worth retrying, after `retry_after` if the server said so.
    Transient {
        why: String,
        retry_after: Option<Duration>,
    },
    /// Not worth retrying.
    Refused(Refusal),
}

impl Transport {
    /// Longest wait a server's `Retry-After` can impose; a larger value is cut to this, so a
    /// misconfigured proxy cannot park a caller for an hour.
    pub const RETRY_AFTER_MAX: Duration = Duration::from_secs(60);

    /// A transport for `settings`; reads the key from its environment variable.
    pub fn new(settings: Settings<'_>) -> Result<Self> {
        let field = format!("{}.api_key_env", settings.section);
        let api_key = read_api_key(&field, settings.api_key_env)?;
        // reqwest is built without a TLS crypto provider (ring is lighter than its default
        // aws-lc); one must be installed process-wide before the first client. Ignoring the
        // result is right: it only fails when a provider is already installed.
        let _ = rustls::crypto::ring::default_provider().install_default();
        Ok(Transport {
            section: settings.section,
            what: settings.what,
            base_url: settings.base_url,
            model: settings.model,
            api_key_env: settings.api_key_env.to_string(),
            api_key,
            http: reqwest::Client::new(),
            timeout: settings.timeout,
            max_retries: settings.max_retries,
            backoff_base: settings.backoff_base,
            backoff_max: settings.backoff_max.max(settings.backoff_base),
            in_flight: Semaphore::new(settings.max_concurrency),
            max_concurrency: settings.max_concurrency,
            requests: AtomicU64::new(0),
            retries: AtomicU64::new(0),
        })
    }

    /// Changes the retry backoff (first delay, doubled per retry up to `max`): for tests
    /// and simulations that cannot wait seconds between attempts. `Retry-After` still wins.
    pub fn set_backoff(&mut self, base: Duration, max: Duration) {
        self.backoff_base = base;
        self.backoff_max = max.max(base);
    }

    /// Retries of a transient failure after the first attempt.
    pub fn set_max_retries(&mut self, max_retries: u32) {
        self.max_retries = max_retries;
    }

    /// The API root requests go to.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// The model every request names.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// The retry bound.
    #[cfg(test)]
    pub fn max_retries(&self) -> u32 {
        self.max_retries
    }

    /// HTTP requests sent so far, retries included.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// Requests beyond the first of a call so far (the caller's own re-asks included, see
    /// [`Transport::count_retry`]).
    pub fn retries(&self) -> u64 {
        self.retries.load(Ordering::Relaxed)
    }

    /// Counts a request the caller sends again on its own account (the chat client's re-ask
    /// without `response_format`).
    pub fn count_retry(&self) {
        self.retries.fetch_add(1, Ordering::Relaxed);
    }

    /// `POST {base_url}{path}` with the JSON `body`, retrying transient failures (see the
    /// module docs). A 2xx is the [`Answer`]; any other outcome a [`Refusal`].
    pub async fn post(&self, path: &str, body: &[u8]) -> std::result::Result<Answer, Refusal> {
        let url = format!("{}{path}", self.base_url);
        let mut attempt: u32 = 0;
        loop {
            let (why, retry_after) = match self.attempt(&url, body).await {
                Ok(answer) => return Ok(answer),
                Err(Attempt::Refused(refusal)) => return Err(refusal),
                Err(Attempt::Transient { why, retry_after }) => (why, retry_after),
            };
            if attempt >= self.max_retries {
                return Err(Refusal::Failed(provider_error(format!(
                    "{} request to {} (model `{}`) failed after {} attempt{}; last error: \
                     {why}. Check that the server is up and reachable at base_url and that it \
                     serves model `{}`; if it is only slow or busy, raise [{}] timeout or \
                     max_retries, or lower max_concurrency",
                    self.what,
                    self.base_url,
                    self.model,
                    attempt + 1,
                    if attempt == 0 { "" } else { "s" },
                    self.model,
                    self.section,
                ))));
            }
            let delay = self.retry_delay(attempt, retry_after);
            tracing::warn!(
                base_url = %self.base_url,
                model = %self.model,
                attempt = attempt + 1,
                retry_in_ms = delay.as_millis() as u64,
                "{} request failed, retrying: {why}",
                self.what
            );
            tokio::time::sleep(delay).await;
            attempt += 1;
            self.retries.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// One request, holding an in-flight permit only while it is on the wire (not while
    /// backing off), so a struggling call does not starve the others.
    async fn attempt(&self, url: &str, body: &[u8]) -> std::result::Result<Answer, Attempt> {
        let _permit = self.in_flight.acquire().await.map_err(|_| {
            Attempt::Refused(Refusal::Failed(provider_error(format!(
                "the {} client is shutting down; retry later",
                self.what
            ))))
        })?;
        self.requests.fetch_add(1, Ordering::Relaxed);
        let mut request = self
            .http
            .post(url)
            .header("content-type", "application/json")
            .body(body.to_vec());
        if !self.api_key.is_empty() {
            // bearer_auth marks the header sensitive, so reqwest never prints it either.
            request = request.bearer_auth(&self.api_key);
        }
        let exchange = async {
            let response = request.send().await?;
            let status = response.status().as_u16();
            let headers = response.headers();
            let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
            let retry_after = header("retry-after-ms")
                .and_then(|ms| parse_seconds(ms).map(|d| d / 1000))
                .or_else(|| header("retry-after").and_then(parse_seconds));
            let body = response.bytes().await?;
            Ok::<_, reqwest::Error>((status, retry_after, body.to_vec()))
        };
        let (status, retry_after, body) = match tokio::time::timeout(self.timeout, exchange).await {
            Err(_) => {
                return Err(Attempt::Transient {
                    why: format!(
                        "no answer within the {} timeout",
                        humantime::format_duration(self.timeout)
                    ),
                    retry_after: None,
                });
            }
            Ok(Err(e)) if e.is_timeout() || e.is_connect() || e.is_request() || e.is_body() => {
                return Err(Attempt::Transient {
                    why: format!("could not talk to {}: {}", self.base_url, error_chain(&e)),
                    retry_after: None,
                });
            }
            Ok(Err(e)) => {
                return Err(Attempt::Refused(Refusal::Failed(provider_error(format!(
                    "{} request to {} failed: {}",
                    self.what,
                    self.base_url,
                    error_chain(&e)
                )))));
            }
            Ok(Ok(exchanged)) => exchanged,
        };
        if (200..300).contains(&status) {
            return Ok(Answer { body });
        }
        Err(self.classify(status, retry_after, &body))
    }

    /// The error classes every OpenAI-compatible endpoint shares.
    fn classify(&self, status: u16, retry_after: Option<Duration>, body: &[u8]) -> Attempt {
        let (message, kind) = error_message(body);
        let message = self.scrub(&truncate(&message, 300));
        let failed = |message: String| Attempt::Refused(Refusal::Failed(provider_error(message)));
        match status {
            429 if kind.as_deref() == Some("insufficient_quota") => failed(format!(
                "{} refused the request for lack of quota (HTTP 429 insufficient_quota: \
                 {message}); check the account's plan and billing",
                self.base_url
            )),
            408 | 429 | 500..=599 => Attempt::Transient {
                why: format!("HTTP {status} from the server: {message}"),
                retry_after,
            },
            401 => failed(format!(
                "{} rejected the credentials (HTTP 401: {message}); check the API key in the \
                 environment variable `{}` (unset sends no key, which only local servers \
                 accept)",
                self.base_url, self.api_key_env
            )),
            403 => failed(format!(
                "{} refused access (HTTP 403: {message}); check that the key in `{}` may use \
                 model `{}`",
                self.base_url, self.api_key_env, self.model
            )),
            _ => Attempt::Refused(Refusal::Status { status, message }),
        }
    }

    /// How long to wait before retry number `attempt + 1`: what the server asked for, up to
    /// [`Transport::RETRY_AFTER_MAX`], else the computed backoff.
    fn retry_delay(&self, attempt: u32, retry_after: Option<Duration>) -> Duration {
        match retry_after {
            Some(asked) => asked.min(Self::RETRY_AFTER_MAX),
            None => self.backoff(attempt),
        }
    }

    /// Exponential backoff with "equal jitter": half the delay is fixed, half random, so
    /// retries from concurrent calls spread out but never collapse to zero.
    fn backoff(&self, attempt: u32) -> Duration {
        let exp = self
            .backoff_base
            .saturating_mul(1u32.checked_shl(attempt.min(20)).unwrap_or(u32::MAX));
        let capped = exp.min(self.backoff_max);
        let half = capped / 2;
        half + half.mul_f64(rand::random::<f64>())
    }

    /// Removes the key from text a server sent, which some servers and proxies echo.
    pub fn scrub(&self, text: &str) -> String {
        if self.api_key.len() < 4 {
            text.to_owned()
        } else {
            text.replace(&self.api_key, "[redacted]")
        }
    }
}

/// An [`Error::Provider`] of the OpenAI-compatible provider.
pub(crate) fn provider_error(message: impl Into<String>) -> Error {
    Error::Provider {
        provider: PROVIDER.into(),
        message: message.into(),
    }
}

/// `s` cut to `max_chars` characters, with an ellipsis when cut.
pub(crate) fn truncate(s: &str, max_chars: usize) -> String {
    match s.char_indices().nth(max_chars) {
        Some((cut, _)) => format!("{}…", &s[..cut]),
        None => s.to_owned(),
    }
}

/// Why `url` is not an API root (`None`: it is): an http(s) URL with a host.
pub(crate) fn base_url_problem(url: &str) -> Option<String> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"));
    match rest {
        Some(host)
            if !host.is_empty() && !host.starts_with('/') && !url.contains(char::is_whitespace) =>
        {
            None
        }
        _ => Some(format!(
            "`{url}` is not an http(s) URL; write the API root with its scheme, e.g. \
             \"http://127.0.0.1:11434/v1\""
        )),
    }
}

/// The configured API root, trimmed, checked and without a trailing slash (paths are
/// appended to it); `field` names the config key in the error.
pub(crate) fn base_url(field: &str, url: &str) -> Result<String> {
    let url = url.trim();
    match base_url_problem(url) {
        None => Ok(url.trim_end_matches('/').to_owned()),
        Some(problem) => Err(Error::invalid(field, problem)),
    }
}

/// A `timeout` setting parsed, or why not; a zero timeout fails every request.
pub(crate) fn timeout(field: &str, text: &str) -> Result<Duration> {
    parse_timeout(text).map_err(|reason| Error::invalid(field, reason))
}

/// A `timeout` setting parsed, or what is wrong with it (for sections that list every
/// problem at once).
pub(crate) fn parse_timeout(text: &str) -> std::result::Result<Duration, String> {
    let t = humantime::parse_duration(text.trim()).map_err(|e| {
        format!("`{text}` is not a duration ({e}); write it like \"30s\", \"500ms\" or \"2m\"")
    })?;
    if t.is_zero() {
        return Err(
            "a zero timeout fails every request; use at least a few seconds, e.g. \"30s\"".into(),
        );
    }
    Ok(t)
}

/// The API key from the environment variable `var`; unset means no key (local servers).
/// `field` names the config key in errors (`embedder.api_key_env`, `llm.api_key_env`).
pub(crate) fn read_api_key(field: &str, var: &str) -> Result<String> {
    let valid_name = !var.is_empty() && var.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if !valid_name {
        return Err(Error::invalid(
            field,
            format!(
                "`{var}` is not an environment variable name; give the variable's name (like \
                 OPENAI_API_KEY), never the key itself"
            ),
        ));
    }
    let key = match std::env::var(var) {
        Ok(k) => k.trim().to_owned(),
        Err(std::env::VarError::NotPresent) => String::new(),
        Err(std::env::VarError::NotUnicode(_)) => {
            return Err(Error::invalid(
                field,
                format!("the environment variable `{var}` is not valid UTF-8; re-export the key"),
            ));
        }
    };
    // The HTTP client would panic on a header value with control characters.
    if key.bytes().any(|b| !(0x20..0x7f).contains(&b)) {
        return Err(Error::invalid(
            field,
            format!(
                "the key in `{var}` contains characters an HTTP header cannot carry (a line \
                 break or non-ASCII); re-export it as plain text"
            ),
        ));
    }
    Ok(key)
}

/// The message and type out of an error body, whatever its shape: OpenAI's
/// `{"error": {"message", "type"}}`, LM Studio's `{"error": "…"}`, or plain text.
fn error_message(body: &[u8]) -> (String, Option<String>) {
    let text = String::from_utf8_lossy(body);
    match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(v) => match &v["error"] {
            serde_json::Value::Object(e) => (
                e.get("message")
                    .and_then(serde_json::Value::as_str)
                    .map_or_else(|| text.trim().to_owned(), str::to_owned),
                e.get("type")
                    .and_then(serde_json::Value::as_str)
                    .map(str::to_owned),
            ),
            serde_json::Value::String(s) => (s.clone(), None),
            _ => (text.trim().to_owned(), None),
        },
        Err(_) => (text.trim().to_owned(), None),
    }
}

/// A `Retry-After` in (possibly fractional) seconds. The HTTP-date form is not read: no
/// model provider sends it, and the computed backoff is a fine answer to one that does.
fn parse_seconds(value: &str) -> Option<Duration> {
    let secs: f64 = value.trim().parse().ok()?;
    (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs.min(86_400.0)))
}

/// An error with its causes, `outer: inner: innermost` (reqwest's own Display stops at
/// "error sending request", which hides "connection refused").
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use std::time::Instant;

    use shadowbrain_test_support::{self as support, Endpoint, Route};

    use super::*;
    use crate::embed::{Embedder, EmbedderConfig, EmbedderKind, HashEmbedder, OpenAiEmbedder};
    use crate::llm::chat::{ChatClient, ChatRequest, ChatStats};
    use crate::llm::{LlmConfig, LlmKind};

    const KEY_ENV: &str = "SHADOWBRAIN_TEST_SURELY_UNSET_KEY_7F3A";

    /// What the endpoint does with one request; `Ok` answers the route's success (vectors
    /// of 4 dimensions, or a chat answer).
    #[derive(Clone, Copy)]
    enum Script {
        Ok,
        Status(u16),
        StatusRetryAfter(u16, &'static str),
        Hang(Duration),
        /// 401 whose message echoes the Authorization header, as some proxies do.
        EchoAuth401,
    }

    fn answer(script: Script, request: &support::Request) -> support::Reply {
        let ok = match request.route {
            Route::Embeddings => {
                let model = HashEmbedder::new(4).unwrap();
                request.embedded_by(|t| model.embed_one(t))
            }
            Route::Chat => support::Reply::chat("{\"verdict\": \"keep\"}", Some((12, 5))),
        };
        match script {
            Script::Ok => ok,
            Script::Status(code) => support::Reply::error(code, &format!("scripted {code}")),
            Script::StatusRetryAfter(code, after) => {
                support::Reply::error(code, "rate limited, slow down")
                    .with_header("retry-after", after)
            }
            Script::Hang(d) => support::Reply::after(d, ok),
            Script::EchoAuth401 => support::Reply::error(
                401,
                &format!(
                    "bad credentials: {}",
                    request.authorization.clone().unwrap_or_default()
                ),
            ),
        }
    }

    /// Each door's call meets `fault` on its first attempt and a good answer on the next.
    fn once(fault: Script) -> impl Fn(usize) -> Script + Send + Sync + 'static {
        move |n| if n % 2 == 0 { fault } else { Script::Ok }
    }

    /// An endpoint answering request `n` by `script(n)`.
    async fn start(script: impl Fn(usize) -> Script + Send + Sync + 'static) -> Endpoint {
        Endpoint::start(move |request| answer(script(request.n), request)).await
    }

    /// What a test tunes on both doors.
    #[derive(Clone)]
    struct Knobs {
        url: String,
        timeout: &'static str,
        max_retries: u32,
        api_key_env: &'static str,
    }

    impl Knobs {
        fn new(url: &str) -> Knobs {
            Knobs {
                url: url.to_string(),
                timeout: "2s",
                max_retries: 3,
                api_key_env: KEY_ENV,
            }
        }
    }

    /// The two doors onto the transport, the embedder and the chat client, called the same
    /// way: every fault below must be handled alike by both.
    enum Door {
        Embedder(OpenAiEmbedder),
        Chat(Box<ChatClient>),
    }

    impl Door {
        fn both(k: &Knobs) -> [Door; 2] {
            let embedder = OpenAiEmbedder::new(&EmbedderConfig {
                kind: EmbedderKind::Openai,
                base_url: Some(k.url.clone()),
                model: Some("test-embed".into()),
                dimensions: Some(4),
                api_key_env: k.api_key_env.into(),
                timeout: k.timeout.into(),
                max_retries: k.max_retries,
                ..EmbedderConfig::default()
            })
            .unwrap()
            .with_backoff(Duration::from_millis(10), Duration::from_millis(40));
            let chat = ChatClient::new(&LlmConfig {
                kind: LlmKind::Openai,
                base_url: Some(k.url.clone()),
                model: Some("test-chat".into()),
                api_key_env: k.api_key_env.into(),
                timeout: k.timeout.into(),
                max_retries: k.max_retries,
                ..LlmConfig::default()
            })
            .unwrap()
            .with_backoff(Duration::from_millis(10), Duration::from_millis(40));
            [Door::Embedder(embedder), Door::Chat(Box::new(chat))]
        }

        async fn call(&self) -> Result<()> {
            match self {
                Door::Embedder(e) => e.embed(&["the deploy key rotates".into()]).await.map(drop),
                Door::Chat(c) => c
                    .complete(ChatRequest::new(
                        "You rate memories.",
                        "Rate: the deploy key.",
                    ))
                    .await
                    .map(drop),
            }
        }

        fn model(&self) -> &str {
            match self {
                Door::Embedder(_) => "test-embed",
                Door::Chat(_) => "test-chat",
            }
        }

        fn debug(&self) -> String {
            match self {
                Door::Embedder(e) => format!("{e:?}"),
                Door::Chat(c) => format!("{c:?}"),
            }
        }

        /// The chat client's counters (the embedder keeps none of its own).
        fn stats(&self) -> Option<ChatStats> {
            match self {
                Door::Embedder(_) => None,
                Door::Chat(c) => Some(c.stats()),
            }
        }
    }

    /// The message of a provider error (the test fails on any other error).
    pub(crate) fn provider_message(e: Error) -> String {
        match e {
            Error::Provider { provider, message } => {
                assert_eq!(provider, "openai");
                message
            }
            other => panic!("expected a provider error, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_500_is_retried() {
        let server = start(once(Script::Status(500))).await;
        for door in Door::both(&Knobs::new(&server.base_url())) {
            let before = server.requests();
            door.call().await.unwrap();
            assert_eq!(server.requests() - before, 2, "{}", door.model());
            if let Some(stats) = door.stats() {
                assert_eq!(stats.retries, 1);
            }
        }
    }

    #[tokio::test]
    async fn a_429_waits_for_retry_after() {
        let server = start(once(Script::StatusRetryAfter(429, "1"))).await;
        for door in Door::both(&Knobs::new(&server.base_url())) {
            let before = server.requests();
            // Backoff alone would wait at most 40 ms; only the header can explain a second.
            door.call().await.unwrap();
            assert_eq!(server.requests() - before, 2, "{}", door.model());
            let arrivals = server.arrivals();
            let waited = arrivals[before + 1] - arrivals[before];
            assert!(waited >= Duration::from_millis(950), "{waited:?}");
            assert!(waited < Duration::from_secs(3), "{waited:?}");
            if let Some(stats) = door.stats() {
                assert_eq!(stats.retries, 1);
            }
        }
    }

    #[tokio::test]
    async fn persistent_5xx_gives_up_after_max_retries() {
        let server = start(|_| Script::Status(503)).await;
        let url = server.base_url();
        let knobs = Knobs {
            max_retries: 2,
            ..Knobs::new(&url)
        };
        for door in Door::both(&knobs) {
            let before = server.requests();
            let msg = provider_message(door.call().await.unwrap_err());
            assert_eq!(server.requests() - before, 3, "1 attempt + 2 retries");
            assert!(msg.contains("3 attempts") && msg.contains("503"), "{msg}");
            assert!(msg.contains(&url) && msg.contains(door.model()), "{msg}");
            if let Some(stats) = door.stats() {
                assert_eq!((stats.requests, stats.retries, stats.failures), (3, 2, 1));
            }
        }
    }

    #[tokio::test]
    async fn the_default_is_three_retries() {
        let server = start(|_| Script::Status(502)).await;
        for door in Door::both(&Knobs::new(&server.base_url())) {
            let before = server.requests();
            door.call().await.unwrap_err();
            assert_eq!(server.requests() - before, 4, "{}", door.model());
        }
    }

    #[tokio::test]
    async fn a_hang_times_out_is_retried_then_fails_clearly() {
        let server = start(|_| Script::Hang(Duration::from_secs(5))).await;
        let url = server.base_url();
        let knobs = Knobs {
            timeout: "200ms",
            max_retries: 2,
            ..Knobs::new(&url)
        };
        for door in Door::both(&knobs) {
            let before = server.requests();
            let started = Instant::now();
            let msg = provider_message(door.call().await.unwrap_err());
            let took = started.elapsed();
            assert_eq!(server.requests() - before, 3);
            assert!(took >= Duration::from_millis(600), "{took:?}");
            assert!(
                took < Duration::from_secs(3),
                "timeouts were not enforced: {took:?}"
            );
            assert!(msg.contains("200ms timeout"), "{msg}");
            assert!(msg.contains("server is up") && msg.contains(&url), "{msg}");
        }
    }

    #[tokio::test]
    async fn a_slow_first_answer_is_retried_successfully() {
        let server = start(once(Script::Hang(Duration::from_secs(5)))).await;
        let url = server.base_url();
        let knobs = Knobs {
            timeout: "200ms",
            ..Knobs::new(&url)
        };
        for door in Door::both(&knobs) {
            let before = server.requests();
            door.call().await.unwrap();
            assert_eq!(server.requests() - before, 2, "{}", door.model());
        }
    }

    #[tokio::test]
    async fn a_401_is_not_retried_and_names_the_variable() {
        let server = start(|_| Script::Status(401)).await;
        for door in Door::both(&Knobs::new(&server.base_url())) {
            let before = server.requests();
            let msg = provider_message(door.call().await.unwrap_err());
            assert_eq!(server.requests() - before, 1);
            assert!(msg.contains(KEY_ENV) && msg.contains("401"), "{msg}");
            if let Some(stats) = door.stats() {
                assert_eq!(stats.failures, 1);
            }
        }
    }

    #[tokio::test]
    async fn other_4xx_are_not_retried() {
        let server = start(|_| Script::Status(404)).await;
        for door in Door::both(&Knobs::new(&server.base_url())) {
            let before = server.requests();
            let msg = provider_message(door.call().await.unwrap_err());
            assert_eq!(server.requests() - before, 1);
            assert!(msg.contains("404") && msg.contains(door.model()), "{msg}");
        }
    }

    #[tokio::test]
    async fn the_key_is_sent_but_never_shown() {
        // Tests cannot set variables safely (other test threads read the environment), so
        // this uses one Cargo sets for every test process it runs.
        let key = std::env::var("CARGO_PKG_NAME").expect("run under cargo");
        let server = start(|n| {
            if n % 2 == 0 {
                Script::Ok
            } else {
                Script::EchoAuth401
            }
        })
        .await;
        let knobs = Knobs {
            api_key_env: "CARGO_PKG_NAME",
            ..Knobs::new(&server.base_url())
        };
        for door in Door::both(&knobs) {
            let before = server.requests();
            door.call().await.unwrap();
            assert_eq!(
                server.authorizations()[before].as_deref(),
                Some(format!("Bearer {key}").as_str())
            );
            let debug = door.debug();
            assert!(!debug.contains(&key), "the key leaked into Debug: {debug}");
            assert!(debug.contains("CARGO_PKG_NAME"), "{debug}");
            // The server echoes the key back in its error; the error must not carry it on.
            let msg = provider_message(door.call().await.unwrap_err());
            assert!(msg.contains("[redacted]"), "{msg}");
            assert!(!msg.contains(&key), "the key leaked into an error: {msg}");
        }
        // An unset variable sends no key at all (no empty `Bearer`), as local servers expect.
        let server = start(|_| Script::Ok).await;
        for door in Door::both(&Knobs::new(&server.base_url())) {
            door.call().await.unwrap();
        }
        assert_eq!(server.authorizations(), vec![None, None]);
    }

    #[tokio::test]
    async fn a_dead_endpoint_is_retried_then_reported() {
        // Bind and drop: nothing listens on this port any more.
        let port = {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            l.local_addr().unwrap().port()
        };
        let url = format!("http://127.0.0.1:{port}/v1");
        let knobs = Knobs {
            max_retries: 1,
            ..Knobs::new(&url)
        };
        for door in Door::both(&knobs) {
            let msg = provider_message(door.call().await.unwrap_err());
            assert!(msg.contains("2 attempts") && msg.contains(&url), "{msg}");
            if let Some(stats) = door.stats() {
                assert_eq!(stats.requests, 2);
            }
        }
    }

    fn transport(base: Duration, max: Duration) -> Transport {
        Transport::new(Settings {
            section: "llm",
            what: "chat",
            base_url: "http://127.0.0.1:9/v1".into(),
            model: "m".into(),
            api_key_env: "SHADOWBRAIN_TEST_SURELY_UNSET_KEY_7F3A",
            timeout: Duration::from_secs(1),
            max_concurrency: 1,
            max_retries: 3,
            backoff_base: base,
            backoff_max: max,
        })
        .unwrap()
    }

    #[test]
    fn backoff_grows_with_jitter_and_is_capped() {
        let t = transport(Duration::from_millis(100), Duration::from_millis(1000));
        for attempt in 0..30 {
            let d = t.backoff(attempt);
            let full = Duration::from_millis(100 * (1u64 << attempt.min(10)))
                .min(Duration::from_millis(1000));
            assert!(
                d >= full / 2 && d <= full,
                "attempt {attempt}: {d:?} vs {full:?}"
            );
        }
    }

    #[test]
    fn retry_after_is_read_and_capped() {
        assert_eq!(parse_seconds("1"), Some(Duration::from_secs(1)));
        assert_eq!(parse_seconds(" 0.5 "), Some(Duration::from_millis(500)));
        assert_eq!(parse_seconds("Wed, 21 Oct 2015 07:28:00 GMT"), None);
        assert_eq!(parse_seconds("-3"), None);
        let t = transport(Duration::from_millis(10), Duration::from_millis(40));
        let hour = Some(Duration::from_secs(3600));
        assert_eq!(t.retry_delay(0, hour), Transport::RETRY_AFTER_MAX);
        assert_eq!(t.retry_delay(5, Some(Duration::ZERO)), Duration::ZERO);
        assert!(t.retry_delay(0, None) <= Duration::from_millis(10));
    }

    #[test]
    fn error_bodies_of_every_shape_are_read() {
        let (m, t) =
            error_message(br#"{"error":{"message":"no quota","type":"insufficient_quota"}}"#);
        assert_eq!(
            (m.as_str(), t.as_deref()),
            ("no quota", Some("insufficient_quota"))
        );
        let (m, t) = error_message(br#"{"error":"model not loaded"}"#);
        assert_eq!((m.as_str(), t), ("model not loaded", None));
        let (m, _) = error_message(b" Bad Gateway \n");
        assert_eq!(m, "Bad Gateway");
    }

    #[test]
    fn base_url_forms() {
        assert_eq!(
            base_url("x.base_url", " http://localhost:11434/v1/ ").unwrap(),
            "http://localhost:11434/v1"
        );
        for bad in [
            "localhost:11434",
            "ftp://x",
            "http://",
            "http:///v1",
            "http://a b/v1",
        ] {
            let err = base_url("x.base_url", bad).unwrap_err().to_string();
            assert!(err.contains("x.base_url"), "{bad}: {err}");
        }
    }

    #[test]
    fn timeouts_are_durations_above_zero() {
        assert_eq!(timeout("t", "750ms").unwrap(), Duration::from_millis(750));
        for bad in ["soon", "0s"] {
            assert!(
                timeout("llm.timeout", bad)
                    .unwrap_err()
                    .to_string()
                    .contains("llm.timeout")
            );
        }
    }
}
