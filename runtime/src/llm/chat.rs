//! The chat-completions client behind the LLM judge and condenser: `POST
//! {base_url}/chat/completions` against OpenAI or any compatible server (Ollama, vLLM,
//! LM Studio), temperature 0, one system and one user message, optionally with a JSON schema
//! the answer must follow.
//!
//! The faults (docs/configuration.md) are the provider transport's (`provider`): the
//! per-request timeout, bounded concurrency, retries with backoff and jitter honouring
//! `Retry-After`. What is particular to chat is here: an endpoint that rejects
//! `response_format` is asked again without it, and remembered, so later calls do not pay
//! for the refusal; the answer is read leniently; counters for metrics are kept. What to do
//! with a failure (fall back to rules) is the caller's business.
//!
//! Requests are shaped with async-openai's chat types; the exchange is the transport's,
//! which reads the response headers (async-openai drops a failed response's headers, and so
//! would hide `Retry-After`).
//!
//! This module must never log, store in a printable field, or put into an error message the
//! API key.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use async_openai::types::chat::{
    ChatCompletionRequestMessage, ChatCompletionRequestSystemMessage,
    ChatCompletionRequestSystemMessageContent, ChatCompletionRequestUserMessage,
    ChatCompletionRequestUserMessageContent, CreateChatCompletionRequest, ResponseFormat,
    ResponseFormatJsonSchema,
};
use serde::Deserialize;

use super::{LlmConfig, LlmKind};
use crate::error::{Error, Result};
use crate::provider::{self, Refusal, Settings, Transport, provider_error, truncate};

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
    transport: Transport,
    /// Cleared for good the first time the endpoint rejects `response_format`.
    schema_supported: AtomicBool,
    failures: AtomicU64,
    prompt_tokens: AtomicU64,
    completion_tokens: AtomicU64,
}

impl fmt::Debug for ChatClient {
    // Hand-written so that no field can ever print the API key.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChatClient")
            .field("transport", &self.transport)
            .field("schema_supported", &self.schema_supported())
            .finish_non_exhaustive()
    }
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
        let transport = Transport::new(Settings {
            section: "llm",
            what: "chat",
            base_url: provider::base_url("llm.base_url", cfg.base_url.as_deref().unwrap_or(""))?,
            model: cfg
                .model
                .as_deref()
                .map(str::trim)
                .unwrap_or_default()
                .to_owned(),
            api_key_env: &cfg.api_key_env,
            timeout: cfg.timeout()?,
            max_concurrency: cfg.max_concurrency,
            max_retries: cfg.max_retries.min(Self::MAX_RETRIES),
            backoff_base: Self::DEFAULT_BACKOFF_BASE,
            backoff_max: Self::DEFAULT_BACKOFF_MAX,
        })?;
        Ok(ChatClient {
            transport,
            schema_supported: AtomicBool::new(true),
            failures: AtomicU64::new(0),
            prompt_tokens: AtomicU64::new(0),
            completion_tokens: AtomicU64::new(0),
        })
    }

    /// Retries a transient failure at most `max_retries` times (capped at
    /// [`ChatClient::MAX_RETRIES`]); 0 gives up after the first failure.
    pub fn with_retries(mut self, max_retries: u32) -> Self {
        self.transport
            .set_max_retries(max_retries.min(Self::MAX_RETRIES));
        self
    }

    /// Changes the retry backoff (first delay, doubled per retry up to `max`). Meant for
    /// tests and simulations that cannot wait seconds between attempts; a server's
    /// `Retry-After` still wins.
    pub fn with_backoff(mut self, base: Duration, max: Duration) -> Self {
        self.transport.set_backoff(base, max);
        self
    }

    /// The API root requests go to.
    pub fn base_url(&self) -> &str {
        self.transport.base_url()
    }

    /// The model name sent with every request.
    pub fn model(&self) -> &str {
        self.transport.model()
    }

    /// Whether `response_format` is still sent with schema requests (`false` once the
    /// endpoint has rejected it).
    pub fn schema_supported(&self) -> bool {
        self.schema_supported.load(Ordering::Relaxed)
    }

    /// The counters so far.
    pub fn stats(&self) -> ChatStats {
        ChatStats {
            requests: self.transport.requests(),
            retries: self.transport.retries(),
            failures: self.failures.load(Ordering::Relaxed),
            prompt_tokens: self.prompt_tokens.load(Ordering::Relaxed),
            completion_tokens: self.completion_tokens.load(Ordering::Relaxed),
        }
    }

    /// Asks the model, at temperature 0, retrying transient failures with backoff. Errors
    /// are [`Error::Provider`] (the endpoint failed or refused) or [`Error::Invalid`] (the
    /// request itself is unusable); the caller falls back to rules on either.
    pub async fn complete(&self, request: ChatRequest) -> Result<ChatAnswer> {
        let result = self.complete_once(&request).await;
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

    async fn complete_once(&self, request: &ChatRequest) -> Result<ChatAnswer> {
        if let Some((name, _)) = &request.json_schema {
            check_schema_name(name)?;
        }
        let mut with_schema = request.json_schema.is_some() && self.schema_supported();
        loop {
            let body = self.body(request, with_schema)?;
            let (status, message) = match self.transport.post("/chat/completions", &body).await {
                Ok(answer) => return self.answer(&answer.body, with_schema),
                Err(Refusal::Failed(e)) => return Err(e),
                Err(Refusal::Status { status, message }) => (status, message),
            };
            let (base_url, model) = (self.base_url(), self.model());
            let lower = message.to_lowercase();
            let schema_refused = matches!(status, 400 | 422)
                && (lower.contains("response_format") || lower.contains("json_schema"));
            return Err(match status {
                404 => provider_error(format!(
                    "{base_url}/chat/completions answered 404 ({message}); check base_url \
                     (compatible servers usually end in /v1) and that model `{model}` exists \
                     there (for Ollama: `ollama pull {model}`)"
                )),
                // OpenAI's strict mode rejects schemas it cannot enforce with a message
                // naming response_format; that is our schema's fault, not a missing feature,
                // so the endpoint must not be marked as lacking response_format.
                400 | 422 if lower.contains("invalid schema") => provider_error(format!(
                    "{base_url} rejected the answer's JSON schema (HTTP {status}: {message}); \
                     strict schemas need \"additionalProperties\": false and every property \
                     listed in \"required\""
                )),
                _ if schema_refused && with_schema => {
                    // Not counted against max_retries: nothing is wrong with the server, it
                    // only lacks a feature, and the re-ask is the one that matters.
                    self.schema_supported.store(false, Ordering::Relaxed);
                    tracing::warn!(
                        base_url = %base_url,
                        model = %model,
                        "the endpoint rejected response_format; asking without it from now \
                         on: HTTP {status}: {message}"
                    );
                    with_schema = false;
                    self.transport.count_retry();
                    continue;
                }
                _ => provider_error(format!(
                    "{base_url} rejected the chat request (HTTP {status}: {message}); check \
                     that model `{model}` is a chat model served there"
                )),
            });
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
            model: self.model().to_owned(),
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
        serde_json::to_vec(&body).map_err(|e| Error::internal("encoding a chat request", e))
    }

    /// Reads the first choice and the usage out of a successful response.
    fn answer(&self, body: &[u8], structured: bool) -> Result<ChatAnswer> {
        let (base_url, model) = (self.base_url(), self.model());
        let parsed: WireResponse = serde_json::from_slice(body).map_err(|e| {
            provider_error(format!(
                "{base_url} answered with something that is not a chat completion ({e}; body \
                 starts with {:?}); check that base_url points at an OpenAI-compatible API \
                 root such as http://host:port/v1",
                self.transport
                    .scrub(&truncate(&String::from_utf8_lossy(body), 200))
            ))
        })?;
        let Some(choice) = parsed.choices.into_iter().next() else {
            return Err(provider_error(format!(
                "model `{model}` at {base_url} returned no choices; the server is not \
                 OpenAI-compatible or dropped the answer"
            )));
        };
        let content = match (choice.message.content, choice.message.refusal) {
            (Some(text), _) => text,
            (None, Some(refusal)) => {
                return Err(provider_error(format!(
                    "model `{model}` refused to answer: {}; check the prompt",
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::{Value, json};
    use shadowbrain_test_support::{self as support, Endpoint};

    use super::*;
    use crate::provider::tests::provider_message;

    /// What the scripted endpoint does with one request.
    enum Reply {
        /// `{"verdict": "keep"}` with usage 12 + 5 = 17 tokens.
        Answer,
        /// The same answer without a `usage` object.
        AnswerWithoutUsage,
        /// 400 when the body carries `response_format` (as older Ollama / LM Studio
        /// builds do), a normal answer otherwise.
        NoResponseFormat,
        /// A 400 the way OpenAI refuses a schema strict mode cannot enforce.
        InvalidSchema,
    }

    const ANSWER: &str = r#"{"verdict": "keep"}"#;
    const KEY_ENV: &str = "SHADOWBRAIN_TEST_SURELY_UNSET_KEY_7F3A";

    fn reply(scripted: Reply, request: &support::Request) -> support::Reply {
        let answer = support::Reply::chat(ANSWER, Some((12, 5)));
        match scripted {
            Reply::Answer => answer,
            Reply::AnswerWithoutUsage => support::Reply::chat(ANSWER, None),
            Reply::NoResponseFormat if request.body.get("response_format").is_some() => {
                support::Reply::raw(
                    400,
                    json!({"error": "'response_format.type' must be 'json_schema' or \
                        'text'; json_schema is not supported by this model"}),
                )
            }
            Reply::NoResponseFormat => answer,
            Reply::InvalidSchema => support::Reply::error_typed(
                400,
                "Invalid schema for response_format 'verdict': In context=(), \
                 'additionalProperties' is required to be supplied and to be false.",
                "invalid_request_error",
            ),
        }
    }

    /// The scripted endpoint, answering per request number after `delay` (so concurrent
    /// requests overlap); its base URL.
    async fn start(
        delay: Duration,
        script: impl Fn(usize) -> Reply + Send + Sync + 'static,
    ) -> (Arc<Endpoint>, String) {
        let server = Endpoint::start(move |request| {
            support::Reply::after(delay, reply(script(request.n), request))
        })
        .await;
        let url = server.base_url();
        (Arc::new(server), url)
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
        assert_eq!(server.authorizations()[0], None);
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
        let max = server.max_in_flight();
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
    fn retries_are_capped() {
        let c = ChatClient::new(&config("http://127.0.0.1:9/v1"))
            .unwrap()
            .with_retries(1000);
        assert_eq!(c.transport.max_retries(), ChatClient::MAX_RETRIES);
    }
}
