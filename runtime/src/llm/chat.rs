//! The chat-completions client behind the LLM judge and condenser: `POST
//! {base_url}/chat/completions` against OpenAI or any compatible server (Ollama, vLLM,
//! LM Studio), temperature 0, one system and one user message, optionally with a JSON schema
//! the answer must follow.
//!
//! It owns the faults (DESIGN §6, issue 5): the per-request timeout, bounded concurrency
//! (`max_concurrency` requests in flight across every caller), and retries — timeouts, 429,
//! 5xx and connection errors are retried with exponential backoff and jitter, at most
//! `max_retries` times, and a `Retry-After` from the server replaces the computed delay. An
//! endpoint that rejects `response_format` is asked again without it, and remembered, so
//! later calls do not pay for the refusal. Counters for metrics are kept here; what to do
//! with a failure (fall back to rules) is the caller's business.
//!
//! Requests and answers are shaped with async-openai's chat types, but the HTTP exchange is
//! made with reqwest directly, because async-openai drops the response headers of a failed
//! request and so would hide `Retry-After`.
//!
//! This module must never log, store in a printable field, or put into an error message the
//! API key; it reads the key once from the environment variable the configuration names.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use async_openai::types::chat::{
    ChatCompletionRequestMessage, ChatCompletionRequestSystemMessage,
    ChatCompletionRequestSystemMessageContent, ChatCompletionRequestUserMessage,
    ChatCompletionRequestUserMessageContent, CreateChatCompletionRequest, ResponseFormat,
    ResponseFormatJsonSchema,
};
use serde::Deserialize;
use tokio::sync::Semaphore;

use super::{LlmConfig, LlmKind};
use crate::embed::openai::{read_api_key, truncate};
use crate::error::{Error, Result};

/// Provider name in [`Error::Provider`].
const PROVIDER: &str = "openai";

/// One prompt for the model: a system message, a user message, and how the answer should look.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatRequest {
    /// The system message (instructions).
    pub system: String,
    /// The user message (the material to judge or condense).
    pub user: String,
    /// A JSON schema the answer must follow, with its name (`[a-zA-Z0-9_-]`, at most 64
    /// characters). Sent as a strict `response_format` while the endpoint accepts it.
    pub json_schema: Option<(String, serde_json::Value)>,
    /// Upper bound on the answer's tokens; `None` leaves it to the server.
    pub max_tokens: Option<u32>,
}

impl ChatRequest {
    /// A free-text request with no token bound.
    pub fn new(system: impl Into<String>, user: impl Into<String>) -> Self {
        ChatRequest {
            system: system.into(),
            user: user.into(),
            json_schema: None,
            max_tokens: None,
        }
    }

    /// Asks for an answer following `schema`, named `name`.
    pub fn with_schema(mut self, name: impl Into<String>, schema: serde_json::Value) -> Self {
        self.json_schema = Some((name.into(), schema));
        self
    }

    /// Bounds the answer to `max_tokens` tokens.
    pub fn with_max_tokens(mut self, max_tokens: u32) -> Self {
        self.max_tokens = Some(max_tokens);
        self
    }
}

/// Tokens one exchange cost, as the server reported them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TokenUsage {
    /// Tokens of the prompt.
    pub prompt: u64,
    /// Tokens of the answer.
    pub completion: u64,
    /// Both, as reported (or their sum when the server left the total out).
    pub total: u64,
}

/// The model's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatAnswer {
    /// The text of the first choice; for a schema request, JSON (possibly malformed when the
    /// endpoint could not enforce the schema — see `structured`).
    pub content: String,
    /// Token usage from the response's `usage`; zeros when the server sent none.
    pub usage: TokenUsage,
    /// Whether the endpoint was made to enforce the request's schema. `false` for a schema
    /// request means the model was only asked nicely, so the caller must check the JSON.
    pub structured: bool,
    /// The answer was cut off at `max_tokens` (`finish_reason = "length"`).
    pub truncated: bool,
}

/// A snapshot of the client's counters, for metrics. Every count is since the client was built.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChatStats {
    /// HTTP requests sent, retries included.
    pub requests: u64,
    /// Requests beyond the first of a call: backoff retries and re-asks without
    /// `response_format`.
    pub retries: u64,
    /// Calls to [`ChatClient::complete`] that returned an error.
    pub failures: u64,
    /// Prompt tokens of successful answers.
    pub prompt_tokens: u64,
    /// Completion tokens of successful answers.
    pub completion_tokens: u64,
}

/// Chat completions from an OpenAI-compatible HTTP endpoint, with the faults handled.
/// Cheap to share behind an `Arc`; every caller shares the concurrency bound and counters.
pub struct ChatClient {
    transport: Box<Transport>,
    url: String,
    base_url: String,
    model: String,
    api_key_env: String,
    /// Kept only to scrub it from server messages that echo it back; never printed.
    api_key: String,
    timeout: Duration,
    max_concurrency: usize,
    max_retries: u32,
    backoff_base: Duration,
    backoff_max: Duration,
    /// Cleared for good the first time the endpoint rejects `response_format`.
    schema_supported: AtomicBool,
    /// One permit per request on the wire; shared by every caller.
    in_flight: Semaphore,
    requests: AtomicU64,
    retries: AtomicU64,
    failures: AtomicU64,
    prompt_tokens: AtomicU64,
    completion_tokens: AtomicU64,
}

impl fmt::Debug for ChatClient {
    // Hand-written so that no field can ever print the API key.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChatClient")
            .field("base_url", &self.base_url)
            .field("model", &self.model)
            .field("api_key_env", &self.api_key_env)
            .field("timeout", &self.timeout)
            .field("max_concurrency", &self.max_concurrency)
            .field("max_retries", &self.max_retries)
            .field("schema_supported", &self.schema_supported())
            .finish_non_exhaustive()
    }
}

/// Sends one JSON body and returns what came back; built once in [`ChatClient::new`] around
/// the HTTP client, so no transport type appears in this module's fields.
type Transport = dyn Fn(
        Vec<u8>,
    )
        -> Pin<Box<dyn Future<Output = std::result::Result<RawResponse, TransportError>> + Send>>
    + Send
    + Sync;

/// An HTTP response, read to the end.
struct RawResponse {
    status: u16,
    /// `Retry-After` or `retry-after-ms`, already converted.
    retry_after: Option<Duration>,
    body: Vec<u8>,
}

/// The request never got an HTTP answer.
struct TransportError {
    /// Connection refused or reset, or the body broke off: the next attempt may work.
    retryable: bool,
    message: String,
}

/// What went wrong with one attempt.
enum Failure {
    /// Worth retrying: the server may answer next time, after `retry_after` if it said so.
    Transient {
        why: String,
        retry_after: Option<Duration>,
    },
    /// The endpoint does not understand `response_format`; ask again without it.
    SchemaRejected(String),
    /// Retrying cannot help (bad key, unknown model, malformed answer …).
    Permanent(Error),
}

impl ChatClient {
    /// Retries after the first attempt unless [`ChatClient::with_retries`] says otherwise.
    pub const DEFAULT_MAX_RETRIES: u32 = 3;
    /// The most retries [`ChatClient::with_retries`] accepts: more would hold a batch for
    /// many minutes against a dead provider, while ingest has long moved on.
    pub const MAX_RETRIES: u32 = 10;
    /// First delay between retries; doubled each time, with jitter.
    pub const DEFAULT_BACKOFF_BASE: Duration = Duration::from_millis(500);
    /// Longest computed delay between retries.
    pub const DEFAULT_BACKOFF_MAX: Duration = Duration::from_secs(20);
    /// Longest wait a server's `Retry-After` can impose; a larger value is cut to this, so a
    /// misconfigured proxy cannot park the judge for an hour.
    pub const RETRY_AFTER_MAX: Duration = Duration::from_secs(60);

    /// A client for the `[llm]` section `cfg`, which must be `kind = "openai"`. Checks every
    /// setting and reads the API key from the environment variable `api_key_env` (unset
    /// means no key, as local servers expect).
    pub fn new(cfg: &LlmConfig) -> Result<Self> {
        if cfg.kind != LlmKind::Openai {
            return Err(Error::invalid(
                "llm.kind",
                "the chat client needs kind = \"openai\"; with kind = \"none\" rules score \
                 importance and condensation is extractive, so no client should be built",
            ));
        }
        cfg.validate()?;
        let timeout = cfg.timeout()?;
        let base_url = cfg
            .base_url
            .as_deref()
            .map(|u| u.trim().trim_end_matches('/').to_owned())
            .unwrap_or_default();
        let model = cfg.model.as_deref().map(str::trim).unwrap_or_default();
        let api_key = read_api_key("llm.api_key_env", &cfg.api_key_env)?;
        let url = format!("{base_url}/chat/completions");
        let transport = http_transport(url.clone(), api_key.clone());
        Ok(ChatClient {
            transport,
            url,
            base_url,
            model: model.to_owned(),
            api_key_env: cfg.api_key_env.clone(),
            api_key,
            timeout,
            max_concurrency: cfg.max_concurrency,
            max_retries: cfg.max_retries.min(Self::MAX_RETRIES),
            backoff_base: Self::DEFAULT_BACKOFF_BASE,
            backoff_max: Self::DEFAULT_BACKOFF_MAX,
            schema_supported: AtomicBool::new(true),
            in_flight: Semaphore::new(cfg.max_concurrency),
            requests: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            prompt_tokens: AtomicU64::new(0),
            completion_tokens: AtomicU64::new(0),
        })
    }

    /// Retries a transient failure at most `max_retries` times (capped at
    /// [`ChatClient::MAX_RETRIES`]); 0 gives up after the first failure.
    pub fn with_retries(mut self, max_retries: u32) -> Self {
        self.max_retries = max_retries.min(Self::MAX_RETRIES);
        self
    }

    /// Changes the retry backoff (first delay, doubled per retry up to `max`). Meant for
    /// tests and simulations that cannot wait seconds between attempts; a server's
    /// `Retry-After` still wins.
    pub fn with_backoff(mut self, base: Duration, max: Duration) -> Self {
        self.backoff_base = base;
        self.backoff_max = max.max(base);
        self
    }

    /// The API root requests go to.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// The model name sent with every request.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// Whether `response_format` is still sent with schema requests (`false` once the
    /// endpoint has rejected it).
    pub fn schema_supported(&self) -> bool {
        self.schema_supported.load(Ordering::Relaxed)
    }

    /// The counters so far.
    pub fn stats(&self) -> ChatStats {
        ChatStats {
            requests: self.requests.load(Ordering::Relaxed),
            retries: self.retries.load(Ordering::Relaxed),
            failures: self.failures.load(Ordering::Relaxed),
            prompt_tokens: self.prompt_tokens.load(Ordering::Relaxed),
            completion_tokens: self.completion_tokens.load(Ordering::Relaxed),
        }
    }

    /// Asks the model, at temperature 0, retrying transient failures with backoff. Errors
    /// are [`Error::Provider`] (the endpoint failed or refused) or [`Error::Invalid`] (the
    /// request itself is unusable); the caller falls back to rules on either.
    pub async fn complete(&self, request: ChatRequest) -> Result<ChatAnswer> {
        let result = self.complete_with_retries(&request).await;
        match &result {
            Ok(answer) => {
                self.prompt_tokens
                    .fetch_add(answer.usage.prompt, Ordering::Relaxed);
                self.completion_tokens
                    .fetch_add(answer.usage.completion, Ordering::Relaxed);
            }
            Err(_) => {
                self.failures.fetch_add(1, Ordering::Relaxed);
            }
        }
        result
    }

    async fn complete_with_retries(&self, request: &ChatRequest) -> Result<ChatAnswer> {
        if let Some((name, _)) = &request.json_schema {
            check_schema_name(name)?;
        }
        let mut with_schema = request.json_schema.is_some() && self.schema_supported();
        let mut attempt: u32 = 0;
        loop {
            let body = self.body(request, with_schema)?;
            let (failure, retry_after) = match self.attempt(body).await {
                Ok(raw) => return self.answer(&raw, with_schema),
                Err(Failure::Permanent(e)) => return Err(e),
                Err(Failure::SchemaRejected(why)) if with_schema => {
                    // Not counted against max_retries: nothing is wrong with the server, it
                    // only lacks a feature, and the re-ask is the one that matters.
                    self.schema_supported.store(false, Ordering::Relaxed);
                    tracing::warn!(
                        base_url = %self.base_url,
                        model = %self.model,
                        "the endpoint rejected response_format; asking without it from now \
                         on: {why}"
                    );
                    with_schema = false;
                    self.retries.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                Err(Failure::SchemaRejected(why)) => {
                    // The 400 names response_format although none was sent: nothing to drop,
                    // and asking again cannot help.
                    return Err(provider_error(format!(
                        "{} rejected the chat request ({why}); check that model `{}` is a \
                         chat model served there",
                        self.base_url, self.model
                    )));
                }
                Err(Failure::Transient { why, retry_after }) => (why, retry_after),
            };
            if attempt >= self.max_retries {
                return Err(provider_error(format!(
                    "chat request to {} (model `{}`) failed after {} attempt{}; last error: \
                     {failure}. Check that the server is up and reachable at base_url and \
                     that it serves model `{}`; if it is only slow or busy, raise [llm] \
                     timeout or lower max_concurrency",
                    self.base_url,
                    self.model,
                    attempt + 1,
                    if attempt == 0 { "" } else { "s" },
                    self.model,
                )));
            }
            let delay = self.retry_delay(attempt, retry_after);
            tracing::warn!(
                base_url = %self.base_url,
                model = %self.model,
                attempt = attempt + 1,
                retry_in_ms = delay.as_millis() as u64,
                "chat request failed, retrying: {failure}"
            );
            tokio::time::sleep(delay).await;
            attempt += 1;
            self.retries.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The JSON body for `request`, with or without its schema.
    fn body(&self, request: &ChatRequest, with_schema: bool) -> Result<Vec<u8>> {
        let response_format = match &request.json_schema {
            Some((name, schema)) if with_schema => Some(ResponseFormat::JsonSchema {
                json_schema: ResponseFormatJsonSchema {
                    description: None,
                    name: name.clone(),
                    schema: schema.clone(),
                    strict: Some(true),
                },
            }),
            _ => None,
        };
        // `max_tokens` is deprecated by OpenAI in favour of `max_completion_tokens`, but it
        // is the one every compatible server (Ollama, vLLM, LM Studio) understands.
        #[allow(deprecated)]
        let body = CreateChatCompletionRequest {
            model: self.model.clone(),
            messages: vec![
                ChatCompletionRequestMessage::System(ChatCompletionRequestSystemMessage {
                    content: ChatCompletionRequestSystemMessageContent::Text(
                        request.system.clone(),
                    ),
                    name: None,
                }),
                ChatCompletionRequestMessage::User(ChatCompletionRequestUserMessage {
                    content: ChatCompletionRequestUserMessageContent::Text(request.user.clone()),
                    name: None,
                }),
            ],
            temperature: Some(0.0),
            max_tokens: request.max_tokens,
            response_format,
            ..CreateChatCompletionRequest::default()
        };
        serde_json::to_vec(&body).map_err(|e| {
            provider_error(format!(
                "could not encode the chat request ({e}); this is a bug, please report it"
            ))
        })
    }

    /// One request, holding an in-flight permit only while it is on the wire (not while
    /// backing off), so a struggling call does not starve the others.
    async fn attempt(&self, body: Vec<u8>) -> std::result::Result<RawResponse, Failure> {
        let _permit = self.in_flight.acquire().await.map_err(|_| {
            Failure::Permanent(provider_error(
                "the chat client is shutting down; retry later",
            ))
        })?;
        self.requests.fetch_add(1, Ordering::Relaxed);
        let raw = match tokio::time::timeout(self.timeout, (self.transport)(body)).await {
            Err(_) => {
                return Err(Failure::Transient {
                    why: format!(
                        "no answer within the {} timeout",
                        humantime::format_duration(self.timeout)
                    ),
                    retry_after: None,
                });
            }
            Ok(Err(e)) if e.retryable => {
                return Err(Failure::Transient {
                    why: format!("could not talk to {}: {}", self.base_url, e.message),
                    retry_after: None,
                });
            }
            Ok(Err(e)) => {
                return Err(Failure::Permanent(provider_error(format!(
                    "chat request to {} failed: {}",
                    self.base_url, e.message
                ))));
            }
            Ok(Ok(raw)) => raw,
        };
        if (200..300).contains(&raw.status) {
            Ok(raw)
        } else {
            Err(self.classify(&raw))
        }
    }

    fn classify(&self, raw: &RawResponse) -> Failure {
        let status = raw.status;
        let (message, kind) = error_message(&raw.body);
        let message = self.scrub(&truncate(&message, 300));
        let lower = message.to_lowercase();
        match status {
            429 if kind.as_deref() == Some("insufficient_quota") => {
                Failure::Permanent(provider_error(format!(
                    "{} refused the request for lack of quota (HTTP 429 insufficient_quota: \
                     {message}); check the account's plan and billing",
                    self.base_url
                )))
            }
            408 | 429 | 500..=599 => Failure::Transient {
                why: format!("HTTP {status} from the server: {message}"),
                retry_after: raw.retry_after,
            },
            401 => Failure::Permanent(provider_error(format!(
                "{} rejected the credentials (HTTP 401: {message}); check the API key in the \
                 environment variable `{}` (unset sends no key, which only local servers \
                 accept)",
                self.base_url, self.api_key_env
            ))),
            403 => Failure::Permanent(provider_error(format!(
                "{} refused access (HTTP 403: {message}); check that the key in `{}` may use \
                 model `{}`",
                self.base_url, self.api_key_env, self.model
            ))),
            404 => Failure::Permanent(provider_error(format!(
                "{} answered 404 ({message}); check base_url (compatible servers usually end \
                 in /v1) and that model `{}` exists there (for Ollama: `ollama pull {}`)",
                self.url, self.model, self.model
            ))),
            // OpenAI's strict mode rejects schemas it cannot enforce with a message naming
            // response_format; that is our schema's fault, not a missing feature, so the
            // endpoint must not be marked as lacking response_format.
            400 | 422 if lower.contains("invalid schema") => {
                Failure::Permanent(provider_error(format!(
                    "{} rejected the answer's JSON schema (HTTP {status}: {message}); strict \
                     schemas need \"additionalProperties\": false and every property listed \
                     in \"required\"",
                    self.base_url
                )))
            }
            400 | 422 if lower.contains("response_format") || lower.contains("json_schema") => {
                Failure::SchemaRejected(format!("HTTP {status}: {message}"))
            }
            _ => Failure::Permanent(provider_error(format!(
                "{} rejected the chat request (HTTP {status}: {message}); check that model \
                 `{}` is a chat model served there",
                self.base_url, self.model
            ))),
        }
    }

    /// Reads the first choice and the usage out of a successful response.
    fn answer(&self, raw: &RawResponse, structured: bool) -> Result<ChatAnswer> {
        let parsed: WireResponse = serde_json::from_slice(&raw.body).map_err(|e| {
            provider_error(format!(
                "{} answered with something that is not a chat completion ({e}; body starts \
                 with {:?}); check that base_url points at an OpenAI-compatible API root such \
                 as http://host:port/v1",
                self.base_url,
                self.scrub(&truncate(&String::from_utf8_lossy(&raw.body), 200))
            ))
        })?;
        let Some(choice) = parsed.choices.into_iter().next() else {
            return Err(provider_error(format!(
                "model `{}` at {} returned no choices; the server is not OpenAI-compatible \
                 or dropped the answer",
                self.model, self.base_url
            )));
        };
        let content = match (choice.message.content, choice.message.refusal) {
            (Some(text), _) => text,
            (None, Some(refusal)) => {
                return Err(provider_error(format!(
                    "model `{}` refused to answer: {}; check the prompt",
                    self.model,
                    truncate(&refusal, 300)
                )));
            }
            (None, None) => String::new(),
        };
        let usage = parsed.usage.unwrap_or_default();
        let prompt = usage.prompt_tokens.unwrap_or(0);
        let completion = usage.completion_tokens.unwrap_or(0);
        Ok(ChatAnswer {
            content,
            usage: TokenUsage {
                prompt,
                completion,
                total: usage
                    .total_tokens
                    .unwrap_or_else(|| prompt.saturating_add(completion)),
            },
            structured,
            truncated: choice.finish_reason.as_deref() == Some("length"),
        })
    }

    /// How long to wait before retry number `attempt + 1`: what the server asked for, up to
    /// [`ChatClient::RETRY_AFTER_MAX`], else the computed backoff.
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

    /// Removes the key from text the server sent, which some servers and proxies echo.
    fn scrub(&self, text: &str) -> String {
        if self.api_key.len() < 4 {
            text.to_owned()
        } else {
            text.replace(&self.api_key, "[redacted]")
        }
    }
}

/// The parts of a chat completion this client reads. Deliberately lenient (every field
/// optional) rather than async-openai's response type: compatible servers leave out or null
/// fields OpenAI always sends, and a missing `system_fingerprint` must not fail a judgement.
#[derive(Deserialize)]
struct WireResponse {
    #[serde(default)]
    choices: Vec<WireChoice>,
    #[serde(default)]
    usage: Option<WireUsage>,
}

#[derive(Deserialize)]
struct WireChoice {
    message: WireMessage,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct WireMessage {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    refusal: Option<String>,
}

#[derive(Deserialize, Default)]
struct WireUsage {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
    #[serde(default)]
    total_tokens: Option<u64>,
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

/// The HTTP exchange, with reqwest directly (async-openai's own transport, already built):
/// async-openai drops a failed response's headers, and a 429's `Retry-After` is one of them.
fn http_transport(url: String, api_key: String) -> Box<Transport> {
    // reqwest is built without a TLS crypto provider (ring is lighter than its default
    // aws-lc); one must be installed process-wide before the first HTTP client. Ignoring the
    // result is right: it only fails when a provider is already installed.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::new();
    Box::new(move |body: Vec<u8>| {
        let mut builder = http
            .post(&url)
            .header("content-type", "application/json")
            .body(body);
        if !api_key.is_empty() {
            // bearer_auth marks the header sensitive, so reqwest never prints it either.
            builder = builder.bearer_auth(&api_key);
        }
        Box::pin(async move {
            let fail = |e: &dyn std::error::Error, retryable: bool| TransportError {
                retryable,
                message: error_chain(e),
            };
            let response = builder.send().await.map_err(|e| {
                let retryable = e.is_timeout() || e.is_connect() || e.is_request() || e.is_body();
                fail(&e, retryable)
            })?;
            let status = response.status().as_u16();
            let headers = response.headers();
            let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
            let retry_after = header("retry-after-ms")
                .and_then(|ms| parse_seconds(ms).map(|d| d / 1000))
                .or_else(|| header("retry-after").and_then(parse_seconds));
            let body = response.bytes().await.map_err(|e| fail(&e, true))?;
            Ok(RawResponse {
                status,
                retry_after,
                body: body.to_vec(),
            })
        })
    })
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

/// OpenAI requires schema names of at most 64 characters from `[a-zA-Z0-9_-]`; checked here
/// so a bad name fails before any request instead of as an opaque HTTP 400.
fn check_schema_name(name: &str) -> Result<()> {
    let ok = (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(
            "json_schema name",
            format!(
                "{name:?} is not a usable schema name; use 1 to 64 letters, digits, `_` or `-`"
            ),
        ))
    }
}

fn provider_error(message: impl Into<String>) -> Error {
    Error::Provider {
        provider: PROVIDER.into(),
        message: message.into(),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
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

    /// What the scripted server does with one request.
    enum Reply {
        /// `{"verdict": "keep"}` with usage 12 + 5 = 17 tokens.
        Answer,
        /// The same answer without a `usage` object.
        AnswerWithoutUsage,
        /// This status with an OpenAI-style error body.
        Status(u16),
        /// This status, with `Retry-After` set to the given value.
        StatusRetryAfter(u16, &'static str),
        /// 400 when the body carries `response_format` (as older Ollama / LM Studio
        /// builds do), a normal answer otherwise.
        NoResponseFormat,
        /// A 400 the way OpenAI refuses a schema strict mode cannot enforce.
        InvalidSchema,
        /// 401 whose message echoes the Authorization header, as some proxies do.
        EchoAuth401,
        /// Sleep this long, then answer normally.
        Hang(Duration),
    }

    type Script = dyn Fn(usize) -> Reply + Send + Sync;

    /// A real OpenAI-compatible `/v1/chat/completions` endpoint on 127.0.0.1, scripted per
    /// request number, recording what arrives and when.
    struct Server {
        script: Box<Script>,
        requests: AtomicUsize,
        in_flight: AtomicUsize,
        max_in_flight: AtomicUsize,
        bodies: Mutex<Vec<Value>>,
        auth: Mutex<Vec<Option<String>>>,
        arrivals: Mutex<Vec<Instant>>,
        /// Per-request service time, so concurrent requests overlap.
        delay: Duration,
    }

    impl Server {
        fn requests(&self) -> usize {
            self.requests.load(Ordering::SeqCst)
        }

        fn body(&self, i: usize) -> Value {
            self.bodies.lock().unwrap()[i].clone()
        }
    }

    const ANSWER: &str = r#"{"verdict": "keep"}"#;
    const KEY_ENV: &str = "SHADOWBRAIN_TEST_SURELY_UNSET_KEY_7F3A";

    fn error_body(message: &str) -> Json<Value> {
        Json(
            json!({"error": {"message": message, "type": "invalid_request_error",
            "param": null, "code": null}}),
        )
    }

    async fn handle(
        State(s): State<Arc<Server>>,
        headers: HeaderMap,
        Json(body): Json<Value>,
    ) -> Response {
        s.arrivals.lock().unwrap().push(Instant::now());
        let n = s.requests.fetch_add(1, Ordering::SeqCst);
        let now = s.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        s.max_in_flight.fetch_max(now, Ordering::SeqCst);
        let auth = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        s.auth.lock().unwrap().push(auth.clone());
        s.bodies.lock().unwrap().push(body.clone());
        tokio::time::sleep(s.delay).await;
        let mut scripted = (s.script)(n);
        if let Reply::Hang(d) = scripted {
            tokio::time::sleep(d).await;
            scripted = Reply::Answer;
        }
        let response = reply(scripted, &body, auth);
        s.in_flight.fetch_sub(1, Ordering::SeqCst);
        response
    }

    fn reply(scripted: Reply, body: &Value, auth: Option<String>) -> Response {
        let mut usage = true;
        match scripted {
            Reply::Answer | Reply::Hang(_) => {}
            Reply::AnswerWithoutUsage => usage = false,
            Reply::Status(code) => {
                let status = StatusCode::from_u16(code).unwrap();
                return (status, error_body(&format!("scripted {code}"))).into_response();
            }
            Reply::StatusRetryAfter(code, after) => {
                let status = StatusCode::from_u16(code).unwrap();
                return (
                    status,
                    [("retry-after", after)],
                    error_body("rate limited, slow down"),
                )
                    .into_response();
            }
            Reply::NoResponseFormat if body.get("response_format").is_some() => {
                return (
                    StatusCode::BAD_REQUEST,
                    Json(
                        json!({"error": "'response_format.type' must be 'json_schema' or \
                        'text'; json_schema is not supported by this model"}),
                    ),
                )
                    .into_response();
            }
            Reply::NoResponseFormat => {}
            Reply::InvalidSchema => {
                return (
                    StatusCode::BAD_REQUEST,
                    error_body(
                        "Invalid schema for response_format 'verdict': In context=(), \
                         'additionalProperties' is required to be supplied and to be false.",
                    ),
                )
                    .into_response();
            }
            Reply::EchoAuth401 => {
                let echoed = format!("bad credentials: {}", auth.unwrap_or_default());
                return (StatusCode::UNAUTHORIZED, error_body(&echoed)).into_response();
            }
        }
        let mut answer = json!({
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1_700_000_000,
            "model": body["model"],
            "choices": [{"index": 0, "finish_reason": "stop",
                "message": {"role": "assistant", "content": ANSWER}}],
        });
        if usage {
            answer["usage"] =
                json!({"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17});
        }
        Json(answer).into_response()
    }

    async fn start(
        delay: Duration,
        script: impl Fn(usize) -> Reply + Send + Sync + 'static,
    ) -> (Arc<Server>, String) {
        let server = Arc::new(Server {
            script: Box::new(script),
            requests: AtomicUsize::new(0),
            in_flight: AtomicUsize::new(0),
            max_in_flight: AtomicUsize::new(0),
            bodies: Mutex::new(Vec::new()),
            auth: Mutex::new(Vec::new()),
            arrivals: Mutex::new(Vec::new()),
            delay,
        });
        let app = axum::Router::new()
            .route("/v1/chat/completions", post(handle))
            .with_state(Arc::clone(&server));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (server, format!("http://{addr}/v1"))
    }

    fn config(base_url: &str) -> LlmConfig {
        LlmConfig {
            kind: LlmKind::Openai,
            base_url: Some(base_url.to_owned()),
            model: Some("test-chat".to_owned()),
            api_key_env: KEY_ENV.to_owned(),
            timeout: "2s".to_owned(),
            ..LlmConfig::default()
        }
    }

    fn client(cfg: &LlmConfig) -> ChatClient {
        ChatClient::new(cfg)
            .unwrap()
            .with_backoff(Duration::from_millis(10), Duration::from_millis(40))
    }

    fn request() -> ChatRequest {
        ChatRequest::new(
            "You rate memories.",
            "Rate: the deploy key rotates monthly.",
        )
        .with_max_tokens(200)
    }

    fn schema() -> Value {
        json!({"type": "object", "properties": {"verdict": {"type": "string"}},
            "required": ["verdict"], "additionalProperties": false})
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
    async fn an_answer_comes_back_with_its_usage() {
        let (server, url) = start(Duration::ZERO, |_| Reply::Answer).await;
        let c = client(&config(&url));
        let answer = c.complete(request()).await.unwrap();

        assert_eq!(answer.content, ANSWER);
        assert_eq!(
            answer.usage,
            TokenUsage {
                prompt: 12,
                completion: 5,
                total: 17
            }
        );
        assert!(!answer.structured && !answer.truncated);
        let body = server.body(0);
        assert_eq!(body["model"], "test-chat");
        assert_eq!(body["temperature"], 0.0);
        assert_eq!(body["max_tokens"], 200);
        assert_eq!(
            body["messages"],
            json!([
                {"role": "system", "content": "You rate memories."},
                {"role": "user", "content": "Rate: the deploy key rotates monthly."},
            ])
        );
        assert!(body.get("response_format").is_none(), "{body}");
        // No key configured: no Authorization header at all, as local servers expect.
        assert_eq!(server.auth.lock().unwrap()[0], None);
        assert_eq!(
            c.stats(),
            ChatStats {
                requests: 1,
                retries: 0,
                failures: 0,
                prompt_tokens: 12,
                completion_tokens: 5
            }
        );
    }

    #[tokio::test]
    async fn missing_usage_counts_as_zero() {
        let (_server, url) = start(Duration::ZERO, |_| Reply::AnswerWithoutUsage).await;
        let c = client(&config(&url));
        let answer = c.complete(request()).await.unwrap();
        assert_eq!(answer.content, ANSWER);
        assert_eq!(answer.usage, TokenUsage::default());
        assert_eq!(c.stats().prompt_tokens, 0);
    }

    #[tokio::test]
    async fn a_schema_is_sent_as_a_strict_response_format() {
        let (server, url) = start(Duration::ZERO, |_| Reply::Answer).await;
        let c = client(&config(&url));
        let answer = c
            .complete(request().with_schema("verdict", schema()))
            .await
            .unwrap();
        assert!(answer.structured);
        assert_eq!(
            server.body(0)["response_format"],
            json!({"type": "json_schema",
                "json_schema": {"name": "verdict", "schema": schema(), "strict": true}})
        );
    }

    #[tokio::test]
    async fn a_rejected_response_format_is_dropped_and_remembered() {
        let (server, url) = start(Duration::ZERO, |_| Reply::NoResponseFormat).await;
        let c = client(&config(&url));
        let first = c
            .complete(request().with_schema("verdict", schema()))
            .await
            .unwrap();
        assert_eq!(server.requests(), 2, "one refusal, one re-ask");
        assert!(server.body(0).get("response_format").is_some());
        assert!(server.body(1).get("response_format").is_none());
        assert_eq!(first.content, ANSWER);
        assert!(!first.structured, "the schema was not enforced");
        assert!(!c.schema_supported());

        // Later calls skip the doomed first attempt.
        let second = c
            .complete(request().with_schema("verdict", schema()))
            .await
            .unwrap();
        assert_eq!(server.requests(), 3);
        assert!(server.body(2).get("response_format").is_none());
        assert!(!second.structured);
        let stats = c.stats();
        assert_eq!((stats.requests, stats.retries, stats.failures), (3, 1, 0));
    }

    #[tokio::test]
    async fn an_invalid_schema_is_our_fault_and_not_remembered_as_unsupported() {
        let (server, url) = start(Duration::ZERO, |_| Reply::InvalidSchema).await;
        let c = client(&config(&url));
        let msg = provider_message(
            c.complete(request().with_schema("verdict", schema()))
                .await
                .unwrap_err(),
        );
        assert_eq!(server.requests(), 1);
        assert!(
            msg.contains("JSON schema") && msg.contains("additionalProperties"),
            "{msg}"
        );
        assert!(c.schema_supported());
    }

    #[tokio::test]
    async fn a_bad_schema_name_fails_before_any_request() {
        let (server, url) = start(Duration::ZERO, |_| Reply::Answer).await;
        let err = client(&config(&url))
            .complete(request().with_schema("my verdict!", schema()))
            .await
            .unwrap_err();
        assert!(matches!(&err, Error::Invalid { .. }), "{err}");
        assert!(err.to_string().contains("my verdict!"), "{err}");
        assert_eq!(server.requests(), 0);
    }

    #[tokio::test]
    async fn a_429_waits_for_retry_after() {
        let (server, url) = start(Duration::ZERO, |n| {
            if n == 0 {
                Reply::StatusRetryAfter(429, "1")
            } else {
                Reply::Answer
            }
        })
        .await;
        // Backoff alone would wait at most 40 ms; only the header can explain a second.
        let c = client(&config(&url));
        let answer = c.complete(request()).await.unwrap();
        assert_eq!(answer.content, ANSWER);
        assert_eq!(server.requests(), 2);
        let arrivals = server.arrivals.lock().unwrap().clone();
        let waited = arrivals[1] - arrivals[0];
        assert!(waited >= Duration::from_millis(950), "{waited:?}");
        assert!(waited < Duration::from_secs(3), "{waited:?}");
        assert_eq!(c.stats().retries, 1);
    }

    #[test]
    fn retry_after_is_read_and_capped() {
        assert_eq!(parse_seconds("1"), Some(Duration::from_secs(1)));
        assert_eq!(parse_seconds(" 0.5 "), Some(Duration::from_millis(500)));
        assert_eq!(parse_seconds("Wed, 21 Oct 2015 07:28:00 GMT"), None);
        assert_eq!(parse_seconds("-3"), None);
        let c = client(&config("http://127.0.0.1:9/v1"));
        let hour = Some(Duration::from_secs(3600));
        assert_eq!(c.retry_delay(0, hour), ChatClient::RETRY_AFTER_MAX);
        assert_eq!(c.retry_delay(5, Some(Duration::ZERO)), Duration::ZERO);
        assert!(c.retry_delay(0, None) <= Duration::from_millis(10));
    }

    #[tokio::test]
    async fn a_500_is_retried() {
        let (server, url) = start(Duration::ZERO, |n| {
            if n == 0 {
                Reply::Status(500)
            } else {
                Reply::Answer
            }
        })
        .await;
        let c = client(&config(&url));
        assert_eq!(c.complete(request()).await.unwrap().content, ANSWER);
        assert_eq!(server.requests(), 2);
        assert_eq!(c.stats().retries, 1);
    }

    #[tokio::test]
    async fn persistent_5xx_gives_up_after_max_retries() {
        let (server, url) = start(Duration::ZERO, |_| Reply::Status(503)).await;
        let c = client(&config(&url)).with_retries(2);
        let msg = provider_message(c.complete(request()).await.unwrap_err());
        assert_eq!(server.requests(), 3, "1 attempt + 2 retries");
        assert!(msg.contains("3 attempts") && msg.contains("503"), "{msg}");
        assert!(msg.contains(&url) && msg.contains("test-chat"), "{msg}");
        let stats = c.stats();
        assert_eq!((stats.requests, stats.retries, stats.failures), (3, 2, 1));
    }

    #[tokio::test]
    async fn the_default_is_three_retries() {
        let (server, url) = start(Duration::ZERO, |_| Reply::Status(502)).await;
        client(&config(&url)).complete(request()).await.unwrap_err();
        assert_eq!(server.requests(), 4);
    }

    #[tokio::test]
    async fn a_hang_times_out_is_retried_then_fails_clearly() {
        let (server, url) = start(Duration::ZERO, |_| Reply::Hang(Duration::from_secs(5))).await;
        let cfg = LlmConfig {
            timeout: "200ms".into(),
            ..config(&url)
        };
        let c = client(&cfg).with_retries(2);
        let started = Instant::now();
        let msg = provider_message(c.complete(request()).await.unwrap_err());
        let took = started.elapsed();
        assert_eq!(server.requests(), 3);
        assert!(took >= Duration::from_millis(600), "{took:?}");
        assert!(
            took < Duration::from_secs(3),
            "timeouts were not enforced: {took:?}"
        );
        assert!(msg.contains("200ms timeout"), "{msg}");
        assert!(
            msg.contains("server is up") && msg.contains("timeout"),
            "{msg}"
        );
    }

    #[tokio::test]
    async fn a_slow_first_answer_is_retried_successfully() {
        let (server, url) = start(Duration::ZERO, |n| {
            if n == 0 {
                Reply::Hang(Duration::from_secs(5))
            } else {
                Reply::Answer
            }
        })
        .await;
        let cfg = LlmConfig {
            timeout: "200ms".into(),
            ..config(&url)
        };
        let answer = client(&cfg).complete(request()).await.unwrap();
        assert_eq!(server.requests(), 2);
        assert_eq!(answer.content, ANSWER);
    }

    #[tokio::test]
    async fn a_401_is_not_retried_and_names_the_variable() {
        let (server, url) = start(Duration::ZERO, |_| Reply::Status(401)).await;
        let c = client(&config(&url));
        let msg = provider_message(c.complete(request()).await.unwrap_err());
        assert_eq!(server.requests(), 1);
        assert!(msg.contains(KEY_ENV) && msg.contains("401"), "{msg}");
        assert_eq!(c.stats().failures, 1);
    }

    #[tokio::test]
    async fn other_4xx_are_not_retried() {
        let (server, url) = start(Duration::ZERO, |_| Reply::Status(404)).await;
        let msg = provider_message(client(&config(&url)).complete(request()).await.unwrap_err());
        assert_eq!(server.requests(), 1);
        assert!(msg.contains("404") && msg.contains("test-chat"), "{msg}");
    }

    #[tokio::test]
    async fn the_key_is_sent_but_never_shown() {
        // Tests cannot set variables safely (other test threads read the environment), so
        // this uses one Cargo sets for every test process it runs.
        let key = std::env::var("CARGO_PKG_NAME").expect("run under cargo");
        let (server, url) = start(Duration::ZERO, |n| {
            if n == 0 {
                Reply::Answer
            } else {
                Reply::EchoAuth401
            }
        })
        .await;
        let cfg = LlmConfig {
            api_key_env: "CARGO_PKG_NAME".into(),
            ..config(&url)
        };
        let c = client(&cfg);
        c.complete(request()).await.unwrap();
        assert_eq!(
            server.auth.lock().unwrap()[0].as_deref(),
            Some(format!("Bearer {key}").as_str())
        );
        let debug = format!("{c:?}");
        assert!(!debug.contains(&key), "the key leaked into Debug: {debug}");
        assert!(debug.contains("CARGO_PKG_NAME"), "{debug}");

        // The server echoes the key back in its error; the error must not carry it on.
        let msg = provider_message(c.complete(request()).await.unwrap_err());
        assert!(msg.contains("[redacted]"), "{msg}");
        assert!(!msg.contains(&key), "the key leaked into an error: {msg}");
    }

    #[tokio::test]
    async fn a_dead_endpoint_is_retried_then_reported() {
        // Bind and drop: nothing listens on this port any more.
        let port = {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            l.local_addr().unwrap().port()
        };
        let url = format!("http://127.0.0.1:{port}/v1");
        let c = client(&config(&url)).with_retries(1);
        let msg = provider_message(c.complete(request()).await.unwrap_err());
        assert!(msg.contains("2 attempts") && msg.contains(&url), "{msg}");
        assert_eq!(c.stats().requests, 2);
    }

    #[tokio::test]
    async fn concurrency_is_bounded_across_callers() {
        let (server, url) = start(Duration::from_millis(60), |_| Reply::Answer).await;
        let cfg = LlmConfig {
            max_concurrency: 2,
            ..config(&url)
        };
        let c = Arc::new(client(&cfg));
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..6 {
            let c = Arc::clone(&c);
            tasks.spawn(async move { c.complete(request()).await });
        }
        while let Some(done) = tasks.join_next().await {
            done.unwrap().unwrap();
        }
        assert_eq!(server.requests(), 6);
        let max = server.max_in_flight.load(Ordering::SeqCst);
        assert!(max <= 2, "{max} requests in flight, limit 2");
        assert!(max >= 2, "calls were not sent concurrently");
        assert_eq!(c.stats().prompt_tokens, 6 * 12);
    }

    #[test]
    fn only_an_openai_section_builds_a_client() {
        let err = ChatClient::new(&LlmConfig::default()).unwrap_err();
        assert!(err.to_string().contains("kind = \"openai\""), "{err}");
        let err = ChatClient::new(&LlmConfig {
            kind: LlmKind::Openai,
            ..LlmConfig::default()
        })
        .unwrap_err();
        let err = err.to_string();
        assert!(err.contains("base_url") && err.contains("model"), "{err}");
        let err = ChatClient::new(&LlmConfig {
            api_key_env: "sk-not-a-name".into(),
            ..config("http://127.0.0.1:9/v1")
        })
        .unwrap_err();
        assert!(err.to_string().contains("never the key itself"), "{err}");
    }

    #[test]
    fn backoff_grows_with_jitter_and_is_capped() {
        let c = ChatClient::new(&config("http://127.0.0.1:9/v1"))
            .unwrap()
            .with_backoff(Duration::from_millis(100), Duration::from_millis(1000));
        for attempt in 0..30 {
            let d = c.backoff(attempt);
            let full = Duration::from_millis(100 * (1u64 << attempt.min(10)))
                .min(Duration::from_millis(1000));
            assert!(
                d >= full / 2 && d <= full,
                "attempt {attempt}: {d:?} vs {full:?}"
            );
        }
        assert_eq!(
            ChatClient::new(&config("http://127.0.0.1:9/v1"))
                .unwrap()
                .with_retries(1000)
                .max_retries,
            ChatClient::MAX_RETRIES
        );
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
}
