//! The OpenAI-compatible embedder: `POST {base_url}/embeddings` against OpenAI itself or
//! any compatible server (Ollama, vLLM, TEI, LM Studio), through the one provider
//! transport (`provider`: timeout, bounded concurrency, retries with backoff and
//! jitter honouring `Retry-After`, the key).
//!
//! It owns what is particular to embeddings: batching (`batch_size` texts per request,
//! batches spawned together and bounded by the transport's `max_concurrency`, results
//! re-assembled in input order), the request's shape (async-openai's type), and the checks
//! of every answer: one vector per input, each index once, the configured dimension, and a
//! usable norm; every vector is unit-normalised.
//!
//! This module must never log, store or put into an error message the API key.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_openai::types::embeddings::{CreateEmbeddingRequest, EmbeddingInput};
use serde::Deserialize;
use tokio::task::JoinSet;

use super::{Embedder, EmbedderConfig};
use crate::error::{Error, Result};
use crate::provider::{self, Refusal, Settings, Transport, provider_error, truncate};

/// API root used when `base_url` is not configured.
pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";

/// Embeddings from an OpenAI-compatible HTTP endpoint.
pub struct OpenAiEmbedder {
    name: String,
    inner: Arc<Inner>,
}

/// Everything a request task needs; shared with spawned batch tasks.
struct Inner {
    transport: Transport,
    dimensions: usize,
    send_dimensions: bool,
    batch_size: usize,
    /// The transport's bound, kept to size the enricher's rounds.
    max_concurrency: usize,
}

impl fmt::Debug for OpenAiEmbedder {
    // Hand-written so that no field can ever print the credentials.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let i = &self.inner;
        f.debug_struct("OpenAiEmbedder")
            .field("transport", &i.transport)
            .field("dimensions", &i.dimensions)
            .field("batch_size", &i.batch_size)
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
        let base_url = provider::base_url(
            "embedder.base_url",
            cfg.base_url.as_deref().unwrap_or(DEFAULT_BASE_URL),
        )?;
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
        let transport = Transport::new(Settings {
            section: "embedder",
            what: "embedding",
            base_url,
            model: model.clone(),
            api_key_env: &cfg.api_key_env,
            timeout,
            max_concurrency: cfg.max_concurrency,
            max_retries: cfg.max_retries,
            backoff_base: Self::DEFAULT_BACKOFF_BASE,
            backoff_max: Self::DEFAULT_BACKOFF_MAX,
        })?;
        Ok(OpenAiEmbedder {
            name: format!("openai:{model}"),
            inner: Arc::new(Inner {
                transport,
                dimensions,
                send_dimensions: cfg.send_dimensions,
                batch_size: cfg.batch_size,
                max_concurrency: cfg.max_concurrency,
            }),
        })
    }

    /// Changes the retry backoff (first delay, doubled per retry up to `max`). Meant for
    /// tests and simulations that cannot wait seconds between attempts.
    pub fn with_backoff(mut self, base: Duration, max: Duration) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.transport.set_backoff(base, max);
        }
        self
    }

    /// The API root requests go to.
    pub fn base_url(&self) -> &str {
        self.inner.transport.base_url()
    }

    /// The model name sent with every request.
    pub fn model(&self) -> &str {
        self.inner.transport.model()
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

    fn texts_per_call(&self) -> usize {
        self.inner.batch_size * self.inner.max_concurrency
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

        // All batches are spawned at once; the transport decides how many are on the wire.
        // Dropping the JoinSet on the first error aborts the rest.
        let n = batches.len();
        let mut tasks = JoinSet::new();
        for (i, batch) in batches.into_iter().enumerate() {
            let inner = Arc::clone(&self.inner);
            tasks.spawn(async move { (i, inner.embed_batch(batch).await) });
        }
        let mut parts: Vec<Option<Vec<Vec<f32>>>> = vec![None; n];
        while let Some(joined) = tasks.join_next().await {
            let (i, result) =
                joined.map_err(|e| Error::internal("an embedding request task", e))?;
            parts[i] = Some(result?);
        }
        let mut out = Vec::with_capacity(texts.len());
        for part in parts {
            out.extend(
                part.ok_or_else(|| Error::internal("embedding", "a batch produced no result"))?,
            );
        }
        Ok(out)
    }
}

/// The parts of an embeddings response this client reads. Lenient (only `data` with
/// `index` and `embedding`): compatible servers leave out fields OpenAI always sends.
#[derive(Deserialize)]
struct WireEmbeddings {
    data: Vec<WireEmbedding>,
}

#[derive(Deserialize)]
struct WireEmbedding {
    index: usize,
    embedding: Vec<f32>,
}

impl Inner {
    /// Embeds one batch (the transport retries what is worth retrying).
    async fn embed_batch(&self, batch: Vec<String>) -> Result<Vec<Vec<f32>>> {
        let count = batch.len();
        let request = CreateEmbeddingRequest {
            model: self.transport.model().to_owned(),
            input: EmbeddingInput::StringArray(batch),
            encoding_format: None,
            user: None,
            dimensions: if self.send_dimensions {
                u32::try_from(self.dimensions).ok()
            } else {
                None
            },
        };
        let body = serde_json::to_vec(&request)
            .map_err(|e| Error::internal("encoding an embedding request", e))?;
        let base_url = self.transport.base_url();
        let model = self.transport.model();
        let answer = match self.transport.post("/embeddings", &body).await {
            Ok(answer) => answer,
            Err(Refusal::Failed(e)) => return Err(e),
            Err(Refusal::Status {
                status: 404,
                message,
            }) => {
                return Err(provider_error(format!(
                    "{base_url}/embeddings answered 404 ({message}); check base_url \
                     (compatible servers usually end in /v1) and that model `{model}` \
                     exists there"
                )));
            }
            Err(Refusal::Status { status, message }) => {
                return Err(provider_error(format!(
                    "{base_url} rejected the embedding request (HTTP {status}: {message}); \
                     check that model `{model}` is an embedding model{}",
                    if self.send_dimensions {
                        " and that it supports the `dimensions` parameter (or set \
                         send_dimensions = false)"
                    } else {
                        ""
                    }
                )));
            }
        };
        let response: WireEmbeddings = serde_json::from_slice(&answer.body).map_err(|e| {
            provider_error(format!(
                "{base_url} answered with something that is not an embeddings response ({e}; \
                 body starts with {:?}); check that base_url points at an OpenAI-compatible \
                 API root such as http://host:port/v1",
                self.transport
                    .scrub(&truncate(&String::from_utf8_lossy(&answer.body), 200))
            ))
        })?;
        self.check_response(response, count)
    }

    /// Puts the answer in input order, checks counts and dimensions, unit-normalises.
    fn check_response(&self, response: WireEmbeddings, count: usize) -> Result<Vec<Vec<f32>>> {
        let (base_url, model) = (self.transport.base_url(), self.transport.model());
        if response.data.len() != count {
            return Err(provider_error(format!(
                "{base_url} returned {} embeddings for {count} inputs; check that base_url is \
                 an OpenAI-compatible embeddings endpoint",
                response.data.len()
            )));
        }
        let mut slots: Vec<Option<Vec<f32>>> = vec![None; count];
        for item in response.data {
            let i = item.index;
            let got = item.embedding.len();
            if got != self.dimensions {
                return Err(provider_error(format!(
                    "model `{model}` at {base_url} returned {got}-dimensional vectors but \
                     [embedder] dimensions = {}; set dimensions = {got} to match the model \
                     (then run `shadowbrain reindex` if the store holds {}-dimensional \
                     vectors){}",
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
                    "{base_url} returned an embedding with index {i}, which is out of range or \
                     repeated for a batch of {count}; the server is not OpenAI-compatible"
                ))
            })?;
            let mut v = item.embedding;
            let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
            if !norm.is_finite() || norm <= f32::MIN_POSITIVE {
                return Err(provider_error(format!(
                    "model `{model}` returned a zero or non-finite vector for input #{i}; check \
                     the model (is it an embedding model?) and the input text"
                )));
            }
            v.iter_mut().for_each(|x| *x /= norm);
            *slot = Some(v);
        }
        // Every slot is filled: `count` distinct in-range indexes were seen.
        Ok(slots.into_iter().flatten().collect())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use shadowbrain_test_support::{self as support, Endpoint};

    use super::*;
    use crate::embed::{EmbedderKind, HashEmbedder};
    use crate::provider::tests::provider_message;

    /// What the scripted endpoint does with one request.
    enum Reply {
        /// Embeddings of the configured dimension (scaled, so normalisation is observable).
        Vectors,
        /// Embeddings of this dimension.
        WrongDim(usize),
        /// This status with an OpenAI-style error body.
        Status(u16),
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

    /// Vectors of `dims` for every input, in reverse order with correct `index` fields:
    /// clients must sort by index.
    fn vectors(request: &support::Request, dims: usize) -> support::Reply {
        let vectors = request
            .inputs()
            .iter()
            .enumerate()
            .rev()
            .map(|(i, t)| (i, server_vector(t, dims)))
            .collect();
        support::Reply::embeddings(&request.body["model"], vectors)
    }

    /// The scripted endpoint, answering per request number after `delay` (so concurrent
    /// requests overlap); its base URL.
    async fn start(
        dims: usize,
        delay: Duration,
        script: impl Fn(usize) -> Reply + Send + Sync + 'static,
    ) -> (Endpoint, String) {
        let server = Endpoint::start(move |request| {
            let reply = match script(request.n) {
                Reply::Vectors => vectors(request, dims),
                Reply::WrongDim(d) => vectors(request, d),
                Reply::Status(code) => support::Reply::error(code, &format!("scripted {code}")),
            };
            support::Reply::after(delay, reply)
        })
        .await;
        let url = server.base_url();
        (server, url)
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
        let body = server.body(0);
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
        let sizes: Vec<usize> = server.seen().iter().map(|r| r.inputs().len()).collect();
        assert_eq!(sizes.iter().sum::<usize>(), 100);
        assert!(sizes.iter().all(|&n| n == 16 || n == 4), "{sizes:?}");
        let max = server.max_in_flight();
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
    fn base_url_defaults_to_openai_and_is_checked() {
        let mut cfg = config("http://127.0.0.1:9/v1/", 4);
        assert_eq!(embedder(&cfg).base_url(), "http://127.0.0.1:9/v1");
        cfg.base_url = None;
        assert_eq!(embedder(&cfg).base_url(), DEFAULT_BASE_URL);
    }
}
