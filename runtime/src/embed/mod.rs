//! Embedders: the [`Embedder`] trait, the `[embedder]` configuration (DESIGN §6) and the
//! factory that turns one into the other. Implementations live in [`hash`] (the in-process
//! default) and [`openai`] (any OpenAI-compatible endpoint).
//!
//! This module must never read secrets from the configuration (only the *name* of the
//! environment variable holding a key) and never hand out an embedder whose settings were not
//! validated: a bad `[embedder]` section fails at start-up with a message naming the key.

pub mod hash;
pub mod openai;

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::Result;

pub use hash::HashEmbedder;
pub use openai::OpenAiEmbedder;

/// Turns texts into vectors of a fixed dimension.
#[async_trait::async_trait]
pub trait Embedder: Send + Sync + std::fmt::Debug {
    /// Short name recorded in the store (`hash`, `openai:nomic-embed-text`).
    fn name(&self) -> &str;
    /// Dimension of every vector it returns.
    fn dimensions(&self) -> usize;
    /// Whether it is cheap enough (in-process, microseconds) for ingest to embed inline
    /// instead of queueing the record for background enrichment. Remote providers never
    /// are, and neither is a local neural model: milliseconds per text would be on every
    /// acknowledgement.
    fn embeds_inline(&self) -> bool {
        false
    }
    /// How many texts one [`Embedder::embed`] call should carry to keep it busy (the
    /// background enricher takes this many queued records per round): for a remote
    /// provider, its batch size times its requests in flight.
    fn texts_per_call(&self) -> usize {
        64
    }
    /// One vector per text, in order, unit-normalised.
    async fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>>;
}

/// Which embedder `[embedder] kind` selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EmbedderKind {
    /// In-process feature hashing ([`HashEmbedder`]); needs nothing else.
    #[default]
    Hash,
    /// An OpenAI-compatible `/v1/embeddings` endpoint ([`OpenAiEmbedder`]).
    Openai,
}

impl<'de> Deserialize<'de> for EmbedderKind {
    // By hand, because the `config` crate's message for an unknown enum variant does not
    // list the valid ones.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        match s.trim().to_ascii_lowercase().as_str() {
            "hash" => Ok(EmbedderKind::Hash),
            "openai" | "openai-compatible" => Ok(EmbedderKind::Openai),
            _ => Err(serde::de::Error::custom(format!(
                "unknown embedder kind `{s}`; use \"hash\" (built in) or \"openai\" (any \
                 OpenAI-compatible endpoint)"
            ))),
        }
    }
}

/// The `[embedder]` section of the server configuration (DESIGN §6). Every key is optional;
/// an empty section is the hash embedder with 384 dimensions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EmbedderConfig {
    /// `hash` (default) or `openai`.
    pub kind: EmbedderKind,
    /// `openai`: the API root, e.g. `http://127.0.0.1:11434/v1` (default: OpenAI's own).
    pub base_url: Option<String>,
    /// `openai`: the model name (required for `openai`).
    pub model: Option<String>,
    /// Vector dimension. `hash`: default 384. `openai`: required, must match the model.
    pub dimensions: Option<usize>,
    /// `openai`: ask the server for `dimensions`-long vectors (OpenAI `text-embedding-3-*`
    /// can shorten its vectors; most other servers reject the parameter). Default false.
    pub send_dimensions: bool,
    /// Name of the environment variable holding the API key; an unset variable means no key
    /// (fine for local servers). Default `OPENAI_API_KEY`.
    pub api_key_env: String,
    /// Per-request timeout, a human duration (`"30s"`, `"500ms"`). Default `"30s"`.
    pub timeout: String,
    /// Texts per request. Default 64.
    pub batch_size: usize,
    /// Retries after a timeout, 429, 5xx or connection error, with exponential backoff.
    /// Default 3.
    pub max_retries: u32,
    /// Requests in flight at once, across all callers of one embedder. Default 4.
    pub max_concurrency: usize,
}

impl Default for EmbedderConfig {
    fn default() -> Self {
        EmbedderConfig {
            kind: EmbedderKind::Hash,
            base_url: None,
            model: None,
            dimensions: None,
            send_dimensions: false,
            api_key_env: "OPENAI_API_KEY".to_owned(),
            timeout: "30s".to_owned(),
            batch_size: 64,
            max_retries: 3,
            max_concurrency: 4,
        }
    }
}

impl EmbedderConfig {
    /// Largest accepted `batch_size` (OpenAI's own limit on inputs per request).
    pub const MAX_BATCH_SIZE: usize = 2048;
    /// Largest accepted `max_concurrency`.
    pub const MAX_CONCURRENCY: usize = 256;
    /// Largest accepted `max_retries`; past this, a dead provider stalls ingest for hours.
    pub const MAX_RETRIES: u32 = 20;

    /// `timeout` parsed, or an error naming the key and the expected form.
    pub fn timeout(&self) -> Result<Duration> {
        crate::provider::timeout("embedder.timeout", &self.timeout)
    }
}

/// Builds the embedder `cfg` describes, after checking every setting it uses.
pub fn build_embedder(cfg: &EmbedderConfig) -> Result<Arc<dyn Embedder>> {
    match cfg.kind {
        EmbedderKind::Hash => {
            if cfg.model.is_some() || cfg.base_url.is_some() {
                tracing::warn!(
                    "[embedder] model and base_url are ignored with kind = \"hash\"; \
                     set kind = \"openai\" to use a provider"
                );
            }
            let dims = cfg.dimensions.unwrap_or(HashEmbedder::DEFAULT_DIMENSIONS);
            Ok(Arc::new(HashEmbedder::new(dims)?))
        }
        EmbedderKind::Openai => Ok(Arc::new(OpenAiEmbedder::new(cfg)?)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(toml: &str) -> std::result::Result<EmbedderConfig, String> {
        config::Config::builder()
            .add_source(config::File::from_str(toml, config::FileFormat::Toml))
            .build()
            .and_then(|c| c.get::<EmbedderConfig>("embedder"))
            .map_err(|e| e.to_string())
    }

    fn build_err(cfg: &EmbedderConfig) -> String {
        match build_embedder(cfg) {
            Ok(e) => panic!("expected an error, got {e:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn empty_section_is_the_default_hash_embedder() {
        let cfg = parse("[embedder]\n").unwrap();
        assert_eq!(cfg, EmbedderConfig::default());
        let e = build_embedder(&cfg).unwrap();
        assert_eq!((e.name(), e.dimensions()), ("hash", 384));
        assert_eq!(cfg.timeout().unwrap(), Duration::from_secs(30));
    }

    #[test]
    fn full_openai_section_parses() {
        let cfg = parse(
            r#"
            [embedder]
            kind = "openai"
            base_url = "http://127.0.0.1:11434/v1"
            model = "nomic-embed-text"
            dimensions = 768
            api_key_env = "MY_KEY"
            timeout = "750ms"
            batch_size = 16
            max_retries = 5
            max_concurrency = 2
            "#,
        )
        .unwrap();
        assert_eq!(cfg.kind, EmbedderKind::Openai);
        assert_eq!(cfg.dimensions, Some(768));
        assert_eq!(cfg.timeout().unwrap(), Duration::from_millis(750));
        let e = build_embedder(&cfg).unwrap();
        assert_eq!((e.name(), e.dimensions()), ("openai:nomic-embed-text", 768));
    }

    #[test]
    fn unknown_keys_and_kinds_are_rejected() {
        let err = parse("[embedder]\nmodle = \"x\"\n").unwrap_err();
        assert!(err.contains("modle"), "{err}");
        let err = parse("[embedder]\nkind = \"bert\"\n").unwrap_err();
        assert!(err.contains("bert") && err.contains("hash"), "{err}");
    }

    #[test]
    fn hash_dimensions_are_configurable_and_checked() {
        let cfg = EmbedderConfig {
            dimensions: Some(128),
            ..Default::default()
        };
        assert_eq!(build_embedder(&cfg).unwrap().dimensions(), 128);
        let err = build_err(&EmbedderConfig {
            dimensions: Some(0),
            ..Default::default()
        });
        assert!(err.contains("embedder.dimensions"), "{err}");
    }

    #[test]
    fn openai_needs_model_and_dimensions() {
        let base = EmbedderConfig {
            kind: EmbedderKind::Openai,
            model: Some("m".into()),
            dimensions: Some(8),
            ..Default::default()
        };
        assert!(build_embedder(&base).is_ok());

        let err = build_err(&EmbedderConfig {
            model: None,
            ..base.clone()
        });
        assert!(
            err.contains("embedder.model") && err.contains("model ="),
            "{err}"
        );
        let err = build_err(&EmbedderConfig {
            model: Some("  ".into()),
            ..base.clone()
        });
        assert!(err.contains("embedder.model"), "{err}");
        let err = build_err(&EmbedderConfig {
            dimensions: None,
            ..base.clone()
        });
        assert!(
            err.contains("embedder.dimensions") && err.contains("dimensions ="),
            "{err}"
        );
    }

    #[test]
    fn openai_limits_and_formats_are_checked() {
        let base = EmbedderConfig {
            kind: EmbedderKind::Openai,
            model: Some("m".into()),
            dimensions: Some(8),
            ..Default::default()
        };
        let cases: Vec<(EmbedderConfig, &str)> = vec![
            (
                EmbedderConfig {
                    timeout: "soon".into(),
                    ..base.clone()
                },
                "embedder.timeout",
            ),
            (
                EmbedderConfig {
                    timeout: "0s".into(),
                    ..base.clone()
                },
                "embedder.timeout",
            ),
            (
                EmbedderConfig {
                    batch_size: 0,
                    ..base.clone()
                },
                "embedder.batch_size",
            ),
            (
                EmbedderConfig {
                    batch_size: 5000,
                    ..base.clone()
                },
                "embedder.batch_size",
            ),
            (
                EmbedderConfig {
                    max_concurrency: 0,
                    ..base.clone()
                },
                "embedder.max_concurrency",
            ),
            (
                EmbedderConfig {
                    max_retries: 100,
                    ..base.clone()
                },
                "embedder.max_retries",
            ),
            (
                EmbedderConfig {
                    base_url: Some("127.0.0.1:11434/v1".into()),
                    ..base.clone()
                },
                "embedder.base_url",
            ),
            (
                EmbedderConfig {
                    api_key_env: "".into(),
                    ..base.clone()
                },
                "embedder.api_key_env",
            ),
            (
                EmbedderConfig {
                    api_key_env: "MY KEY=".into(),
                    ..base.clone()
                },
                "embedder.api_key_env",
            ),
        ];
        for (cfg, key) in cases {
            let err = build_err(&cfg);
            assert!(err.contains(key), "expected `{key}` in: {err}");
        }
    }
}
