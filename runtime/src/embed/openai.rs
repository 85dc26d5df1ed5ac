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
        let api_key = read_api_key(&cfg.api_key_env)?;

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

fn truncate(s: &str, max_chars: usize) -> String {
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
fn read_api_key(var: &str) -> Result<String> {
    let valid_name = !var.is_empty() && var.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if !valid_name {
        return Err(Error::invalid(
            "embedder.api_key_env",
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
                "embedder.api_key_env",
                format!("the environment variable `{var}` is not valid UTF-8; re-export the key"),
            ));
        }
    };
    // The HTTP client would panic on a header value with control characters.
    if key.bytes().any(|b| !(0x20..0x7f).contains(&b)) {
        return Err(Error::invalid(
            "embedder.api_key_env",
            format!(
                "the key in `{var}` contains characters an HTTP header cannot carry (a line \
                 break or non-ASCII); re-export it as plain text"
            ),
        ));
    }
    Ok(key)
}
