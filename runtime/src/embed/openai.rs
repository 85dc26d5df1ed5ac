//! The OpenAI-compatible embedder: `POST {base_url}/embeddings` through `async-openai`, against
//! OpenAI itself or any compatible server (Ollama, vLLM, TEI, LM Studio).
//!
//! It owns batching (`batch_size` texts per request), bounded concurrency (`max_concurrency`
//! requests in flight across every caller, results re-assembled in input order), the
//! per-request timeout, and retries: timeouts, 429, 5xx and connection errors are retried with
//! exponential backoff and jitter, at most `max_retries` times. async-openai's own retry layer
//! is replaced by a bare transport so that those bounds are the only ones. Every returned
//! vector is checked against the configured dimension and unit-normalised.
//!
//! This module must never log, store or put into an error message the API key; it reads the
//! key once from the environment variable the configuration names.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_openai::Client;
use async_openai::config::OpenAIConfig;
use async_openai::error::OpenAIError;
use async_openai::middleware::ReqwestService;
use async_openai::types::embeddings::{CreateEmbeddingRequest, EmbeddingInput};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::{Embedder, EmbedderConfig};
use crate::error::{Error, Result};

/// API root used when `base_url` is not configured.
pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";

/// Provider name in [`Error::Provider`].
const PROVIDER: &str = "openai";

/// Embeddings from an OpenAI-compatible HTTP endpoint.
pub struct OpenAiEmbedder {
    name: String,
    inner: Arc<Inner>,
}

/// Everything a request task needs; shared with spawned batch tasks.
struct Inner {
    client: Client<OpenAIConfig>,
    base_url: String,
    model: String,
    dimensions: usize,
    send_dimensions: bool,
    api_key_env: String,
    timeout: Duration,
    batch_size: usize,
    max_retries: u32,
    backoff_base: Duration,
    backoff_max: Duration,
    /// One permit per request in flight; shared by every caller of this embedder.
    in_flight: Semaphore,
}

impl fmt::Debug for OpenAiEmbedder {
    // Hand-written so that no field can ever print the client's credentials.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let i = &self.inner;
        f.debug_struct("OpenAiEmbedder")
            .field("base_url", &i.base_url)
            .field("model", &i.model)
            .field("dimensions", &i.dimensions)
            .field("api_key_env", &i.api_key_env)
            .field("timeout", &i.timeout)
            .field("batch_size", &i.batch_size)
            .field("max_retries", &i.max_retries)
            .finish_non_exhaustive()
    }
}

impl OpenAiEmbedder {
    /// First delay between retries; doubled each time, with jitter.
    pub const DEFAULT_BACKOFF_BASE: Duration = Duration::from_millis(250);
    /// Longest delay between retries.
    pub const DEFAULT_BACKOFF_MAX: Duration = Duration::from_secs(10);

    /// An embedder for the `[embedder]` section `cfg` (its `kind` is not looked at). Checks
    /// every setting and reads the API key from the environment variable `api_key_env`.
    pub fn new(cfg: &EmbedderConfig) -> Result<Self> {
        let model = match cfg.model.as_deref().map(str::trim) {
            Some(m) if !m.is_empty() => m.to_owned(),
            _ => {
                return Err(Error::invalid(
                    "embedder.model",
                    "kind = \"openai\" needs the embedding model's name; set [embedder] \
                     model = \"...\" (e.g. \"nomic-embed-text\" on Ollama, \
                     \"text-embedding-3-small\" on OpenAI)",
                ));
            }
        };
        let dimensions = match cfg.dimensions {
            Some(d) if (1..=65_536).contains(&d) => d,
            Some(d) => {
                return Err(Error::invalid(
                    "embedder.dimensions",
                    format!("{d} is not a usable dimension; use the model's, in 1..=65536"),
                ));
            }
            None => {
                return Err(Error::invalid(
                    "embedder.dimensions",
                    format!(
                        "kind = \"openai\" needs the dimension of `{model}`'s vectors, so the \
                         store can check it; set [embedder] dimensions = N (e.g. 768 for \
                         nomic-embed-text, 1536 for text-embedding-3-small)"
                    ),
                ));
            }
        };
        let base_url = base_url(cfg.base_url.as_deref())?;
        let timeout = cfg.timeout()?;
        if cfg.batch_size == 0 || cfg.batch_size > EmbedderConfig::MAX_BATCH_SIZE {
            return Err(Error::invalid(
                "embedder.batch_size",
                format!(
                    "{} texts per request is out of range; use 1..={} (64 is a good default)",
                    cfg.batch_size,
                    EmbedderConfig::MAX_BATCH_SIZE
                ),
            ));
        }
        if cfg.max_concurrency == 0 || cfg.max_concurrency > EmbedderConfig::MAX_CONCURRENCY {
            return Err(Error::invalid(
                "embedder.max_concurrency",
                format!(
                    "{} requests in flight is out of range; use 1..={} (4 is a good default)",
                    cfg.max_concurrency,
                    EmbedderConfig::MAX_CONCURRENCY
                ),
            ));
        }
        if cfg.max_retries > EmbedderConfig::MAX_RETRIES {
            return Err(Error::invalid(
                "embedder.max_retries",
                format!(
                    "{} retries could stall ingest for hours on a dead provider; use 0..={}",
                    cfg.max_retries,
                    EmbedderConfig::MAX_RETRIES
                ),
            ));
        }
        let api_key = read_api_key("embedder.api_key_env", &cfg.api_key_env)?;

        // async-openai is built without a TLS crypto provider (ring is lighter than its
        // default aws-lc); one must be installed process-wide before the first HTTP client.
        // Ignoring the result is right: it only fails when a provider is already installed.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let config = OpenAIConfig::new()
            .with_api_base(base_url.clone())
            .with_api_key(api_key)
            // Cleared so OPENAI_ORG_ID / OPENAI_PROJECT_ID meant for OpenAI are never sent to
            // a third-party endpoint.
            .with_org_id("")
            .with_project_id("");
        // A bare transport: the default client wraps it in a retry layer of its own, which
        // would multiply our attempts and ignore `max_retries`.
        let client = Client::with_config(config).with_http_service(ReqwestService::default());

        Ok(OpenAiEmbedder {
            name: format!("openai:{model}"),
            inner: Arc::new(Inner {
                client,
                base_url,
                model,
                dimensions,
                send_dimensions: cfg.send_dimensions,
                api_key_env: cfg.api_key_env.clone(),
                timeout,
                batch_size: cfg.batch_size,
                max_retries: cfg.max_retries,
                backoff_base: Self::DEFAULT_BACKOFF_BASE,
                backoff_max: Self::DEFAULT_BACKOFF_MAX,
                in_flight: Semaphore::new(cfg.max_concurrency),
            }),
        })
    }

    /// Changes the retry backoff (first delay, doubled per retry up to `max`). Meant for
    /// tests and simulations that cannot wait seconds between attempts.
    pub fn with_backoff(mut self, base: Duration, max: Duration) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.backoff_base = base;
            inner.backoff_max = max.max(base);
        }
        self
    }

    /// The API root requests go to.
    pub fn base_url(&self) -> &str {
        &self.inner.base_url
    }

    /// The model name sent with every request.
    pub fn model(&self) -> &str {
        &self.inner.model
    }
}

#[async_trait::async_trait]
impl Embedder for OpenAiEmbedder {
    fn name(&self) -> &str {
        &self.name
    }

    fn dimensions(&self) -> usize {
        self.inner.dimensions
    }

    async fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>> {
        if let Some(i) = texts.iter().position(String::is_empty) {
            return Err(Error::invalid(
                format!("texts[{i}]"),
                "is empty, and embedding APIs reject empty input; skip empty texts or embed \
                 a placeholder",
            ));
        }
        let batches: Vec<Vec<String>> = texts
            .chunks(self.inner.batch_size)
            .map(<[String]>::to_vec)
            .collect();
        match batches.len() {
            0 => return Ok(Vec::new()),
            1 => {
                let batch = batches.into_iter().next().unwrap_or_default();
                return self.inner.embed_batch(batch).await;
            }
            _ => {}
        }

        // All batches are spawned at once; the semaphore decides how many are on the wire.
        // Dropping the JoinSet on the first error aborts the rest.
        let n = batches.len();
        let mut tasks = JoinSet::new();
        for (i, batch) in batches.into_iter().enumerate() {
            let inner = Arc::clone(&self.inner);
            tasks.spawn(async move { (i, inner.embed_batch(batch).await) });
        }
        let mut parts: Vec<Option<Vec<Vec<f32>>>> = vec![None; n];
        while let Some(joined) = tasks.join_next().await {
            let (i, result) = joined.map_err(|e| {
                provider_error(format!(
                    "an embedding request task failed ({e}); this is a bug, please report it"
                ))
            })?;
            parts[i] = Some(result?);
        }
        let mut out = Vec::with_capacity(texts.len());
        for part in parts {
            out.extend(part.ok_or_else(|| {
                provider_error("an embedding batch produced no result; this is a bug")
            })?);
        }
        Ok(out)
    }
}

/// What went wrong with one attempt.
enum Failure {
    /// Worth retrying: the server may answer next time.
    Transient(String),
    /// Retrying cannot help (bad key, unknown model, malformed answer …).
    Permanent(Error),
}

impl Inner {
    /// Embeds one batch, retrying transient failures with backoff.
    async fn embed_batch(&self, batch: Vec<String>) -> Result<Vec<Vec<f32>>> {
        let count = batch.len();
        let request = CreateEmbeddingRequest {
            model: self.model.clone(),
            input: EmbeddingInput::StringArray(batch),
            encoding_format: None,
            user: None,
            dimensions: if self.send_dimensions {
                u32::try_from(self.dimensions).ok()
            } else {
                None
            },
        };

        let mut attempt: u32 = 0;
        loop {
            let failure = match self.attempt(request.clone()).await {
                Ok(response) => return self.check_response(response, count),
                Err(Failure::Permanent(e)) => return Err(e),
                Err(Failure::Transient(why)) => why,
            };
            if attempt >= self.max_retries {
                return Err(provider_error(format!(
                    "embedding request to {} (model `{}`) failed after {} attempt{}; last \
                     error: {failure}. Check that the server is up and reachable at base_url, \
                     that it serves model `{}`, and raise [embedder] timeout or max_retries \
                     if it is only slow or busy",
                    self.base_url,
                    self.model,
                    attempt + 1,
                    if attempt == 0 { "" } else { "s" },
                    self.model,
                )));
            }
            let delay = self.backoff(attempt);
            tracing::warn!(
                base_url = %self.base_url,
                model = %self.model,
                attempt = attempt + 1,
                retry_in_ms = delay.as_millis() as u64,
                "embedding request failed, retrying: {failure}"
            );
            tokio::time::sleep(delay).await;
            attempt += 1;
        }
    }

    /// One request, holding an in-flight permit only while it is on the wire (not while
    /// backing off), so a struggling batch does not starve the others.
    async fn attempt(
        &self,
        request: CreateEmbeddingRequest,
    ) -> std::result::Result<async_openai::types::embeddings::CreateEmbeddingResponse, Failure>
    {
        let _permit = self.in_flight.acquire().await.map_err(|_| {
            Failure::Permanent(provider_error("the embedder is shutting down; retry later"))
        })?;
        match tokio::time::timeout(self.timeout, self.client.embeddings().create(request)).await {
            Err(_) => Err(Failure::Transient(format!(
                "no answer within the {} timeout",
                humantime::format_duration(self.timeout)
            ))),
            Ok(Ok(response)) => Ok(response),
            Ok(Err(e)) => Err(self.classify(e)),
        }
    }

    fn classify(&self, error: OpenAIError) -> Failure {
        match error {
            OpenAIError::ApiError(api) => {
                let status = api.status_code.as_u16();
                let message = truncate(&api.api_error.message, 300);
                match status {
                    429 if api.api_error.r#type.as_deref() == Some("insufficient_quota") => {
                        Failure::Permanent(provider_error(format!(
                            "{} refused the request for lack of quota (HTTP 429 \
                             insufficient_quota: {message}); check the account's plan and \
                             billing",
                            self.base_url
                        )))
                    }
                    408 | 429 | 500..=599 => {
                        Failure::Transient(format!("HTTP {status} from the server: {message}"))
                    }
                    401 | 403 => Failure::Permanent(provider_error(format!(
                        "{} rejected the credentials (HTTP {status}: {message}); check the API \
                         key in the environment variable `{}`",
                        self.base_url, self.api_key_env
                    ))),
                    404 => Failure::Permanent(provider_error(format!(
                        "{}/embeddings answered 404 ({message}); check base_url (compatible \
                         servers usually end in /v1) and that model `{}` exists there",
                        self.base_url, self.model
                    ))),
                    _ => Failure::Permanent(provider_error(format!(
                        "{} rejected the embedding request (HTTP {status}: {message}); check \
                         that model `{}` is an embedding model{}",
                        self.base_url,
                        self.model,
                        if self.send_dimensions {
                            " and that it supports the `dimensions` parameter (or set \
                             send_dimensions = false)"
                        } else {
                            ""
                        }
                    ))),
                }
            }
            OpenAIError::Reqwest(e)
                if e.is_timeout() || e.is_connect() || e.is_request() || e.is_body() =>
            {
                Failure::Transient(format!("could not talk to {}: {e}", self.base_url))
            }
            OpenAIError::JSONDeserialize(e, body) => Failure::Permanent(provider_error(format!(
                "{} answered with something that is not an embeddings response ({e}; body \
                 starts with {:?}); check that base_url points at an OpenAI-compatible API \
                 root such as http://host:port/v1",
                self.base_url,
                truncate(&body, 200)
            ))),
            other => Failure::Permanent(provider_error(format!(
                "embedding request to {} failed: {other}",
                self.base_url
            ))),
        }
    }

    /// Puts the answer in input order, checks counts and dimensions, unit-normalises.
    fn check_response(
        &self,
        response: async_openai::types::embeddings::CreateEmbeddingResponse,
        count: usize,
    ) -> Result<Vec<Vec<f32>>> {
        if response.data.len() != count {
            return Err(provider_error(format!(
                "{} returned {} embeddings for {count} inputs; check that base_url is an \
                 OpenAI-compatible embeddings endpoint",
                self.base_url,
                response.data.len()
            )));
        }
        let mut slots: Vec<Option<Vec<f32>>> = vec![None; count];
        for item in response.data {
            let i = item.index as usize;
            let got = item.embedding.len();
            if got != self.dimensions {
                return Err(provider_error(format!(
                    "model `{}` at {} returned {got}-dimensional vectors but [embedder] \
                     dimensions = {}; set dimensions = {got} to match the model (then run \
                     `shadowbrain reindex` if the store holds {}-dimensional vectors){}",
                    self.model,
                    self.base_url,
                    self.dimensions,
                    self.dimensions,
                    if self.send_dimensions {
                        ""
                    } else {
                        ", or set send_dimensions = true if the model can shorten its vectors"
                    }
                )));
            }
            let slot = slots.get_mut(i).filter(|s| s.is_none()).ok_or_else(|| {
                provider_error(format!(
                    "{} returned an embedding with index {i}, which is out of range or \
                     repeated for a batch of {count}; the server is not OpenAI-compatible",
                    self.base_url
                ))
            })?;
            let mut v = item.embedding;
            let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
            if !norm.is_finite() || norm <= f32::MIN_POSITIVE {
                return Err(provider_error(format!(
                    "model `{}` returned a zero or non-finite vector for input #{i}; check the \
                     model (is it an embedding model?) and the input text",
                    self.model
                )));
            }
            v.iter_mut().for_each(|x| *x /= norm);
            *slot = Some(v);
        }
        // Every slot is filled: `count` distinct in-range indexes were seen.
        Ok(slots.into_iter().flatten().collect())
    }

    /// Exponential backoff with "equal jitter": half the delay is fixed, half random, so
    /// retries from concurrent batches spread out but never collapse to zero.
    fn backoff(&self, attempt: u32) -> Duration {
        let exp = self
            .backoff_base
            .saturating_mul(1u32.checked_shl(attempt.min(20)).unwrap_or(u32::MAX));
        let capped = exp.min(self.backoff_max);
        let half = capped / 2;
        half + half.mul_f64(rand::random::<f64>())
    }
}

fn provider_error(message: impl Into<String>) -> Error {
    Error::Provider {
        provider: PROVIDER.into(),
        message: message.into(),
    }
}

pub(crate) fn truncate(s: &str, max_chars: usize) -> String {
    match s.char_indices().nth(max_chars) {
        Some((cut, _)) => format!("{}…", &s[..cut]),
        None => s.to_owned(),
    }
}

/// The configured API root, checked and without a trailing slash (paths are appended to it).
fn base_url(configured: Option<&str>) -> Result<String> {
    let url = configured.map(str::trim).unwrap_or(DEFAULT_BASE_URL);
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"));
    match rest {
        Some(host)
            if !host.is_empty() && !host.starts_with('/') && !url.contains(char::is_whitespace) =>
        {
            Ok(url.trim_end_matches('/').to_owned())
        }
        _ => Err(Error::invalid(
            "embedder.base_url",
            format!(
                "`{url}` is not an http(s) URL; write the API root with its scheme, e.g. \
                 \"http://127.0.0.1:11434/v1\" or \"{DEFAULT_BASE_URL}\""
            ),
        )),
    }
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

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Instant;

    use axum::Json;
    use axum::extract::State;
    use axum::http::{HeaderMap, StatusCode};
    use axum::response::{IntoResponse, Response};
    use axum::routing::post;
    use serde_json::{Value, json};

    use super::*;
    use crate::embed::{EmbedderKind, HashEmbedder};

    /// What the scripted server does with one request.
    enum Reply {
        /// Embeddings of the configured dimension (scaled, so normalisation is observable).
        Vectors,
        /// Embeddings of this dimension.
        WrongDim(usize),
        /// This status with an OpenAI-style error body.
        Status(u16),
        /// Sleep this long, then answer normally.
        Hang(Duration),
    }

    type Script = dyn Fn(usize) -> Reply + Send + Sync;

    /// A real OpenAI-compatible `/v1/embeddings` endpoint on 127.0.0.1, scripted per request
    /// number, recording what arrives.
    struct Server {
        dims: usize,
        script: Box<Script>,
        requests: AtomicUsize,
        in_flight: AtomicUsize,
        max_in_flight: AtomicUsize,
        bodies: Mutex<Vec<Value>>,
        auth: Mutex<Vec<Option<String>>>,
        /// Per-request service time, so concurrent requests overlap.
        delay: Duration,
    }

    impl Server {
        fn requests(&self) -> usize {
            self.requests.load(Ordering::SeqCst)
        }
    }

    /// The vector the server returns for `text`: a deterministic unit vector times 3, so the
    /// client has to normalise it.
    fn server_vector(text: &str, dims: usize) -> Vec<f32> {
        HashEmbedder::new(dims)
            .unwrap()
            .embed_one(text)
            .into_iter()
            .map(|x| x * 3.0)
            .collect()
    }

    fn expected(text: &str, dims: usize) -> Vec<f32> {
        HashEmbedder::new(dims).unwrap().embed_one(text)
    }

    async fn handle(
        State(s): State<Arc<Server>>,
        headers: HeaderMap,
        Json(body): Json<Value>,
    ) -> Response {
        let n = s.requests.fetch_add(1, Ordering::SeqCst);
        let now = s.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        s.max_in_flight.fetch_max(now, Ordering::SeqCst);
        s.auth.lock().unwrap().push(
            headers
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
        );
        s.bodies.lock().unwrap().push(body.clone());
        tokio::time::sleep(s.delay).await;

        let reply = (s.script)(n);
        let dims = match reply {
            Reply::Vectors => s.dims,
            Reply::WrongDim(d) => d,
            Reply::Hang(d) => {
                tokio::time::sleep(d).await;
                s.dims
            }
            Reply::Status(code) => {
                s.in_flight.fetch_sub(1, Ordering::SeqCst);
                let status = StatusCode::from_u16(code).unwrap();
                let body = json!({"error": {"message": format!("scripted {code}"),
                    "type": "scripted", "param": null, "code": null}});
                return (status, Json(body)).into_response();
            }
        };
        let inputs: Vec<String> = body["input"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_owned())
            .collect();
        // Reverse order with correct `index` fields: clients must sort by index.
        let data: Vec<Value> = inputs
            .iter()
            .enumerate()
            .rev()
            .map(|(i, t)| json!({"object": "embedding", "index": i, "embedding": server_vector(t, dims)}))
            .collect();
        s.in_flight.fetch_sub(1, Ordering::SeqCst);
        Json(json!({
            "object": "list",
            "model": body["model"],
            "data": data,
            "usage": {"prompt_tokens": inputs.len(), "total_tokens": inputs.len()},
        }))
        .into_response()
    }

    async fn start(
        dims: usize,
        delay: Duration,
        script: impl Fn(usize) -> Reply + Send + Sync + 'static,
    ) -> (Arc<Server>, String) {
        let server = Arc::new(Server {
            dims,
            script: Box::new(script),
            requests: AtomicUsize::new(0),
            in_flight: AtomicUsize::new(0),
            max_in_flight: AtomicUsize::new(0),
            bodies: Mutex::new(Vec::new()),
            auth: Mutex::new(Vec::new()),
            delay,
        });
        let app = axum::Router::new()
            .route("/v1/embeddings", post(handle))
            .with_state(Arc::clone(&server));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (server, format!("http://{addr}/v1"))
    }

    fn config(base_url: &str, dims: usize) -> EmbedderConfig {
        EmbedderConfig {
            kind: EmbedderKind::Openai,
            base_url: Some(base_url.to_owned()),
            model: Some("test-embed".to_owned()),
            dimensions: Some(dims),
            api_key_env: "SHADOWBRAIN_TEST_SURELY_UNSET_KEY_7F3A".to_owned(),
            timeout: "2s".to_owned(),
            ..EmbedderConfig::default()
        }
    }

    fn embedder(cfg: &EmbedderConfig) -> OpenAiEmbedder {
        OpenAiEmbedder::new(cfg)
            .unwrap()
            .with_backoff(Duration::from_millis(10), Duration::from_millis(40))
    }

    fn texts(n: usize) -> Vec<String> {
        (0..n)
            .map(|i| format!("memory {i}: topic {}", i % 5))
            .collect()
    }

    fn provider_message(e: Error) -> String {
        match e {
            Error::Provider { provider, message } => {
                assert_eq!(provider, "openai");
                message
            }
            other => panic!("expected a provider error, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn vectors_come_back_in_order_and_normalised() {
        let (server, url) = start(8, Duration::ZERO, |_| Reply::Vectors).await;
        let e = embedder(&config(&url, 8));
        let input = texts(5);
        let got = e.embed(&input).await.unwrap();

        assert_eq!(server.requests(), 1);
        assert_eq!(got.len(), 5);
        for (t, v) in input.iter().zip(&got) {
            let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
            assert!((norm - 1.0).abs() < 1e-5, "norm {norm}");
            let want = expected(t, 8);
            assert!(
                v.iter().zip(&want).all(|(a, b)| (a - b).abs() < 1e-5),
                "{t}"
            );
        }
        let body = server.bodies.lock().unwrap()[0].clone();
        assert_eq!(body["model"], "test-embed");
        assert_eq!(body["input"], json!(input));
        // Not asked for: most non-OpenAI servers reject the parameter.
        assert!(body.get("dimensions").is_none());
        assert_eq!((e.name(), e.dimensions()), ("openai:test-embed", 8));
        assert!(e.embed(&[]).await.unwrap().is_empty());
        assert_eq!(
            server.requests(),
            1,
            "an empty call must not hit the server"
        );
    }

    #[tokio::test]
    async fn batches_are_split_bounded_and_reassembled() {
        let (server, url) = start(4, Duration::from_millis(40), |_| Reply::Vectors).await;
        let cfg = EmbedderConfig {
            batch_size: 16,
            max_concurrency: 3,
            ..config(&url, 4)
        };
        let e = embedder(&cfg);
        let input = texts(100);
        let got = e.embed(&input).await.unwrap();

        assert_eq!(server.requests(), 7, "100 texts in batches of 16");
        let sizes: Vec<usize> = server
            .bodies
            .lock()
            .unwrap()
            .iter()
            .map(|b| b["input"].as_array().unwrap().len())
            .collect();
        assert_eq!(sizes.iter().sum::<usize>(), 100);
        assert!(sizes.iter().all(|&n| n == 16 || n == 4), "{sizes:?}");
        let max = server.max_in_flight.load(Ordering::SeqCst);
        assert!(max <= 3, "{max} requests in flight, limit 3");
        assert!(max >= 2, "batches were not sent concurrently");
        assert_eq!(got.len(), 100);
        for (t, v) in input.iter().zip(&got) {
            let want = expected(t, 4);
            assert!(
                v.iter().zip(&want).all(|(a, b)| (a - b).abs() < 1e-5),
                "{t}"
            );
        }
    }

    #[tokio::test]
    async fn a_500_is_retried() {
        let (server, url) = start(4, Duration::ZERO, |n| {
            if n == 0 {
                Reply::Status(500)
            } else {
                Reply::Vectors
            }
        })
        .await;
        let got = embedder(&config(&url, 4)).embed(&texts(3)).await.unwrap();
        assert_eq!(server.requests(), 2);
        assert_eq!(got.len(), 3);
    }

    #[tokio::test]
    async fn a_429_is_retried() {
        let (server, url) = start(4, Duration::ZERO, |n| {
            if n == 0 {
                Reply::Status(429)
            } else {
                Reply::Vectors
            }
        })
        .await;
        let got = embedder(&config(&url, 4)).embed(&texts(2)).await.unwrap();
        assert_eq!(server.requests(), 2);
        let want = expected(&texts(2)[1], 4);
        assert!(got[1].iter().zip(&want).all(|(a, b)| (a - b).abs() < 1e-5));
    }

    #[tokio::test]
    async fn persistent_5xx_gives_up_after_max_retries() {
        let (server, url) = start(4, Duration::ZERO, |_| Reply::Status(503)).await;
        let cfg = EmbedderConfig {
            max_retries: 2,
            ..config(&url, 4)
        };
        let err = embedder(&cfg).embed(&texts(1)).await.unwrap_err();
        assert_eq!(server.requests(), 3, "1 attempt + 2 retries");
        let msg = provider_message(err);
        assert!(msg.contains("3 attempts") && msg.contains("503"), "{msg}");
        assert!(msg.contains(&url) && msg.contains("test-embed"), "{msg}");
    }

    #[tokio::test]
    async fn a_hang_times_out_is_retried_then_fails_clearly() {
        let (server, url) = start(4, Duration::ZERO, |_| Reply::Hang(Duration::from_secs(5))).await;
        let cfg = EmbedderConfig {
            timeout: "200ms".into(),
            max_retries: 2,
            ..config(&url, 4)
        };
        let started = Instant::now();
        let err = embedder(&cfg).embed(&texts(2)).await.unwrap_err();
        let took = started.elapsed();
        assert_eq!(server.requests(), 3);
        assert!(took >= Duration::from_millis(600), "{took:?}");
        assert!(
            took < Duration::from_secs(3),
            "timeouts were not enforced: {took:?}"
        );
        let msg = provider_message(err);
        assert!(msg.contains("200ms timeout"), "{msg}");
        assert!(msg.contains("server is up") && msg.contains(&url), "{msg}");
    }

    #[tokio::test]
    async fn a_slow_first_answer_is_retried_successfully() {
        let (server, url) = start(4, Duration::ZERO, |n| {
            if n == 0 {
                Reply::Hang(Duration::from_secs(5))
            } else {
                Reply::Vectors
            }
        })
        .await;
        let cfg = EmbedderConfig {
            timeout: "200ms".into(),
            ..config(&url, 4)
        };
        let got = embedder(&cfg).embed(&texts(2)).await.unwrap();
        assert_eq!(server.requests(), 2);
        assert_eq!(got.len(), 2);
    }

    #[tokio::test]
    async fn wrong_dimension_is_a_clear_error_and_not_retried() {
        let (server, url) = start(8, Duration::ZERO, |_| Reply::WrongDim(5)).await;
        let err = embedder(&config(&url, 8))
            .embed(&texts(2))
            .await
            .unwrap_err();
        assert_eq!(server.requests(), 1);
        let msg = provider_message(err);
        assert!(msg.contains("returned 5-dimensional"), "{msg}");
        assert!(
            msg.contains("dimensions = 8") && msg.contains("dimensions = 5"),
            "{msg}"
        );
    }

    #[tokio::test]
    async fn the_key_comes_from_the_configured_env_var() {
        // Tests cannot set variables safely (other test threads read the environment), so
        // this uses one Cargo sets for every test process it runs.
        let key = std::env::var("CARGO_PKG_NAME").expect("run under cargo");
        let (server, url) = start(4, Duration::ZERO, |_| Reply::Vectors).await;
        let cfg = EmbedderConfig {
            api_key_env: "CARGO_PKG_NAME".into(),
            ..config(&url, 4)
        };
        let e = embedder(&cfg);
        e.embed(&texts(1)).await.unwrap();
        assert_eq!(
            server.auth.lock().unwrap()[0].as_deref(),
            Some(format!("Bearer {key}").as_str())
        );
        assert!(
            !format!("{e:?}").contains(&key),
            "the key leaked into Debug"
        );

        // Unset variable: no key, as local servers expect.
        let (server, url) = start(4, Duration::ZERO, |_| Reply::Vectors).await;
        embedder(&config(&url, 4)).embed(&texts(1)).await.unwrap();
        let auth = server.auth.lock().unwrap()[0].clone().unwrap_or_default();
        assert_eq!(auth.trim(), "Bearer");
    }

    #[tokio::test]
    async fn auth_failures_are_not_retried_and_name_the_variable() {
        let (server, url) = start(4, Duration::ZERO, |_| Reply::Status(401)).await;
        let err = embedder(&config(&url, 4))
            .embed(&texts(1))
            .await
            .unwrap_err();
        assert_eq!(server.requests(), 1);
        let msg = provider_message(err);
        assert!(
            msg.contains("SHADOWBRAIN_TEST_SURELY_UNSET_KEY_7F3A"),
            "{msg}"
        );
    }

    #[tokio::test]
    async fn a_dead_endpoint_is_retried_then_reported() {
        // Bind and drop: nothing listens on this port any more.
        let port = {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            l.local_addr().unwrap().port()
        };
        let url = format!("http://127.0.0.1:{port}/v1");
        let cfg = EmbedderConfig {
            max_retries: 1,
            ..config(&url, 4)
        };
        let msg = provider_message(embedder(&cfg).embed(&texts(1)).await.unwrap_err());
        assert!(msg.contains("2 attempts") && msg.contains(&url), "{msg}");
    }

    #[tokio::test]
    async fn a_failing_batch_fails_the_whole_call() {
        let (_server, url) = start(4, Duration::ZERO, |n| {
            if n == 2 {
                Reply::Status(400)
            } else {
                Reply::Vectors
            }
        })
        .await;
        let cfg = EmbedderConfig {
            batch_size: 2,
            max_concurrency: 1,
            ..config(&url, 4)
        };
        let msg = provider_message(embedder(&cfg).embed(&texts(8)).await.unwrap_err());
        assert!(
            msg.contains("HTTP 400") && msg.contains("scripted 400"),
            "{msg}"
        );
    }

    #[tokio::test]
    async fn empty_text_is_rejected_before_any_request() {
        let (server, url) = start(4, Duration::ZERO, |_| Reply::Vectors).await;
        let input = vec!["fine".to_owned(), String::new()];
        let err = embedder(&config(&url, 4)).embed(&input).await.unwrap_err();
        assert!(
            matches!(&err, Error::Invalid { field, .. } if field == "texts[1]"),
            "{err}"
        );
        assert_eq!(server.requests(), 0);
    }

    #[test]
    fn backoff_grows_with_jitter_and_is_capped() {
        let e = OpenAiEmbedder::new(&config("http://127.0.0.1:9/v1", 4))
            .unwrap()
            .with_backoff(Duration::from_millis(100), Duration::from_millis(1000));
        for attempt in 0..30 {
            let d = e.inner.backoff(attempt);
            let full = Duration::from_millis(100 * (1u64 << attempt.min(10)))
                .min(Duration::from_millis(1000));
            assert!(
                d >= full / 2 && d <= full,
                "attempt {attempt}: {d:?} vs {full:?}"
            );
        }
    }

    #[test]
    fn base_url_forms() {
        assert_eq!(base_url(None).unwrap(), DEFAULT_BASE_URL);
        assert_eq!(
            base_url(Some(" http://localhost:11434/v1/ ")).unwrap(),
            "http://localhost:11434/v1"
        );
        for bad in [
            "localhost:11434",
            "ftp://x",
            "http://",
            "http:///v1",
            "http://a b/v1",
        ] {
            assert!(base_url(Some(bad)).is_err(), "{bad}");
        }
    }
}
