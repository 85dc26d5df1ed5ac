//! Embedders: the [`Embedder`] trait, the `[embedder]` configuration
//! (docs/configuration.md) and the factory that turns one into the other. Implementations
//! live in [`hash`] (feature hashing, in-process, no semantics), [`local`] (a
//! sentence-transformers model run in-process, when its weights are installed) and
//! [`openai`] (any OpenAI-compatible endpoint). `kind = "auto"`, the default, is `local` when the model is installed and
//! `hash` otherwise ([`EmbedderConfig::resolve`]).
//!
//! This module must never read secrets from the configuration (only the *name* of the
//! environment variable holding a key) and never hand out an embedder whose settings were not
//! validated: a bad `[embedder]` section fails at start-up with a message naming the key.

pub mod cache;
pub mod hash;
#[cfg(feature = "local")]
pub mod local;
pub mod openai;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::index::passage;
use crate::model::Passage;

pub use cache::{CacheStats, CachedEmbedder};
pub use hash::HashEmbedder;
#[cfg(feature = "local")]
pub use local::LocalEmbedder;
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
    /// Whether its vectors carry meaning beyond the words (a neural model), so recall gives
    /// the vector path more weight by default (see `Policy::for_embedder`). The hash
    /// embedder's are lexical.
    fn is_semantic(&self) -> bool {
        true
    }
    /// How many texts one [`Embedder::embed`] call should carry to keep it busy (the
    /// background enricher takes this many queued records per round): for a remote
    /// provider, its batch size times its requests in flight.
    fn texts_per_call(&self) -> usize {
        64
    }
    /// One vector per text, in order, unit-normalised.
    async fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>>;
    /// [`Embedder::embed`] for work nobody waits on (the enricher's batches): an embedder
    /// that shares the machine with recall runs it at a lower priority, so a query never
    /// waits behind it. By default, the same as `embed`.
    async fn embed_background(&self, texts: &[String]) -> Result<Vec<Vec<f32>>> {
        self.embed(texts).await
    }
    /// Its cache's hits and misses, when it has one ([`CachedEmbedder`]).
    fn cache_stats(&self) -> Option<CacheStats> {
        None
    }
}

/// Answers, once, the question the local model's kernels ask on every matrix product — how
/// many threads to split it over — by setting `RAYON_NUM_THREADS` to candle's own answer
/// when it is unset. candle reads `RAYON_NUM_THREADS` first and otherwise counts the
/// physical cores from `/proc/cpuinfo` each time, which costs a quarter of a short query's
/// embedding time. Nothing else changes: candle splits its work the same way, and rayon's
/// pool takes the same number.
///
/// # Safety
///
/// Sets an environment variable: call it before the process starts any thread (first
/// thing in `main`), as [`std::env::set_var`] requires.
#[cfg(feature = "local")]
pub unsafe fn settle_model_threads() {
    if std::env::var_os("RAYON_NUM_THREADS").is_none() {
        let n = candle_core::utils::get_num_threads();
        // SAFETY: the caller guarantees no other thread runs yet.
        unsafe { std::env::set_var("RAYON_NUM_THREADS", n.to_string()) };
    }
}

/// Which embedder `[embedder] kind` selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EmbedderKind {
    /// `local` when its model is installed, else `hash` (see [`EmbedderConfig::resolve`]).
    #[default]
    Auto,
    /// In-process feature hashing ([`HashEmbedder`]); needs nothing else, knows no synonyms.
    Hash,
    /// A sentence-transformers model run in-process (`LocalEmbedder`), read from
    /// `model_dir` or where `scripts/install-model` put it.
    Local,
    /// An OpenAI-compatible `/v1/embeddings` endpoint ([`OpenAiEmbedder`]).
    Openai,
}

impl<'de> Deserialize<'de> for EmbedderKind {
    // By hand, because the `config` crate's message for an unknown enum variant does not
    // list the valid ones.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(EmbedderKind::Auto),
            "hash" => Ok(EmbedderKind::Hash),
            "local" => Ok(EmbedderKind::Local),
            "openai" | "openai-compatible" => Ok(EmbedderKind::Openai),
            _ => Err(serde::de::Error::custom(format!(
                "unknown embedder kind `{s}`; use \"auto\" (the default: local if installed, \
                 else hash), \"local\" (a sentence-transformers model in-process), \"hash\" \
                 (built in, no semantics) or \"openai\" (any OpenAI-compatible endpoint)"
            ))),
        }
    }
}

/// How the local embedder computes (`[embedder] precision`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// 8-bit weights where the CPU has integer dot-product instructions (x86-64 with
    /// AVX-512 VNNI) and the model is one the int8 engine runs, else float.
    #[default]
    Auto,
    /// 8-bit weights everywhere (on other CPUs, a portable kernel several times slower
    /// than the float engine: for testing).
    Int8,
    /// The float model (candle), the reference.
    F32,
}

impl<'de> Deserialize<'de> for Precision {
    // By hand, for a message that lists the valid values.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Precision::Auto),
            "int8" => Ok(Precision::Int8),
            "f32" | "float32" => Ok(Precision::F32),
            _ => Err(serde::de::Error::custom(format!(
                "unknown precision `{s}`; use \"auto\" (the default: int8 where the CPU \
                 runs it fast, else f32), \"int8\" or \"f32\""
            ))),
        }
    }
}

/// The `[embedder]` section of the server configuration (docs/configuration.md). Every key
/// is optional; an empty section is `auto`: the local model when it is installed, else the
/// hash embedder with 384 dimensions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EmbedderConfig {
    /// `auto` (default), `local`, `hash` or `openai`.
    pub kind: EmbedderKind,
    /// `openai`: the API root, e.g. `http://127.0.0.1:11434/v1` (default: OpenAI's own).
    pub base_url: Option<String>,
    /// `openai`: the model name (required). `local`: the name recorded in the store
    /// (default: the model directory's name).
    pub model: Option<String>,
    /// `local`: the model directory (`config.json`, `tokenizer.json`, `model.safetensors`;
    /// a Hugging Face snapshot works). Default: [`default_model_dir`].
    pub model_dir: Option<String>,
    /// Vector dimension. `hash`: default 384. `openai`: required, must match the model.
    /// `local`: the model's; if set, it must match.
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
    /// `local`: `auto` (default), `int8` or `f32` (see [`Precision`]).
    pub precision: Precision,
    /// `local` and `openai`: texts whose vectors are kept in memory so a text seen again
    /// is not embedded again ([`CachedEmbedder`]); 0 turns the cache off. Default 8192
    /// (about 13 MB of 384-dimension vectors).
    pub cache_entries: usize,
}

impl Default for EmbedderConfig {
    fn default() -> Self {
        EmbedderConfig {
            kind: EmbedderKind::Auto,
            base_url: None,
            model: None,
            model_dir: None,
            dimensions: None,
            send_dimensions: false,
            api_key_env: "OPENAI_API_KEY".to_owned(),
            timeout: "30s".to_owned(),
            batch_size: 64,
            max_retries: 3,
            max_concurrency: 4,
            precision: Precision::Auto,
            cache_entries: 8192,
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
    /// Largest accepted `cache_entries` (about 1.5 GB of 384-dimension vectors).
    pub const MAX_CACHE_ENTRIES: usize = 1 << 20;

    /// `timeout` parsed, or an error naming the key and the expected form.
    pub fn timeout(&self) -> Result<Duration> {
        crate::provider::timeout("embedder.timeout", &self.timeout)
    }

    /// The directory `local` reads its model from: `model_dir`, else [`default_model_dir`].
    pub fn model_dir(&self) -> Option<PathBuf> {
        match &self.model_dir {
            Some(dir) => Some(PathBuf::from(dir)),
            None => default_model_dir(),
        }
    }

    /// This configuration with `auto` decided, for a data directory whose store records
    /// the embedder `recorded` made its vectors with (`None`: a new directory). A directory
    /// made by `hash` or `local` keeps it, so installing the model never locks an existing
    /// directory out (`shadowbrain reindex` switches it); anything else gets `local` when
    /// the model is installed, else `hash`. Other kinds are returned as they are.
    pub fn resolve(&self, recorded: Option<&str>) -> EmbedderConfig {
        self.resolve_with(recorded, self.model_dir())
    }

    fn resolve_with(&self, recorded: Option<&str>, model_dir: Option<PathBuf>) -> EmbedderConfig {
        if self.kind != EmbedderKind::Auto {
            return self.clone();
        }
        let installed = model_dir.filter(|d| is_model_dir(d));
        let kind = match recorded {
            Some(r) if r == "hash" || r.starts_with("hash:") => EmbedderKind::Hash,
            Some(r) if r.starts_with("local:") => EmbedderKind::Local,
            _ if installed.is_some() => EmbedderKind::Local,
            _ => EmbedderKind::Hash,
        };
        EmbedderConfig {
            kind,
            model_dir: match kind {
                EmbedderKind::Local => self
                    .model_dir
                    .clone()
                    .or_else(|| installed.map(|d| d.display().to_string())),
                _ => self.model_dir.clone(),
            },
            ..self.clone()
        }
    }
}

/// The environment variable that names the local model's directory.
pub const MODEL_DIR_ENV: &str = "SHADOWBRAIN_MODEL_DIR";

/// Where `local` (and `auto`) look for the model when `model_dir` is not set:
/// `$SHADOWBRAIN_MODEL_DIR`, else `$XDG_DATA_HOME/shadowbrain/models/all-MiniLM-L6-v2`,
/// else `~/.local/share/shadowbrain/models/all-MiniLM-L6-v2` — where
/// `scripts/install-model` puts it. An empty `SHADOWBRAIN_MODEL_DIR` means no model.
pub fn default_model_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os(MODEL_DIR_ENV) {
        return (!dir.is_empty()).then(|| PathBuf::from(dir));
    }
    installed_model_dir("all-MiniLM-L6-v2")
}

/// Where `scripts/install-model NAME` installs the model `name`:
/// `$XDG_DATA_HOME/shadowbrain/models/NAME`, else `~/.local/share/shadowbrain/models/NAME`
/// (`None` without HOME).
pub fn installed_model_dir(name: &str) -> Option<PathBuf> {
    let data = match std::env::var_os("XDG_DATA_HOME").filter(|d| !d.is_empty()) {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(std::env::var_os("HOME")?).join(".local/share"),
    };
    Some(data.join("shadowbrain/models").join(name))
}

/// The files a local model's directory must hold.
pub(crate) const MODEL_FILES: [&str; 3] = ["config.json", "tokenizer.json", "model.safetensors"];

/// Whether `dir` holds a model the local embedder can load (its required files).
pub fn is_model_dir(dir: &Path) -> bool {
    MODEL_FILES.iter().all(|f| dir.join(f).is_file())
}

/// Builds the embedder `cfg` describes, after checking every setting it uses, behind a
/// cache of `cache_entries` texts unless it embeds inline (the hash embedder: a lookup
/// would cost as much as the embedding).
pub fn build_embedder(cfg: &EmbedderConfig) -> Result<Arc<dyn Embedder>> {
    if cfg.cache_entries > EmbedderConfig::MAX_CACHE_ENTRIES {
        return Err(Error::invalid(
            "embedder.cache_entries",
            format!(
                "is {}; the most is {} (0 turns the cache off)",
                cfg.cache_entries,
                EmbedderConfig::MAX_CACHE_ENTRIES
            ),
        ));
    }
    let embedder = build_uncached(cfg)?;
    Ok(match std::num::NonZeroUsize::new(cfg.cache_entries) {
        Some(n) if !embedder.embeds_inline() => Arc::new(CachedEmbedder::new(embedder, n)),
        _ => embedder,
    })
}

fn build_uncached(cfg: &EmbedderConfig) -> Result<Arc<dyn Embedder>> {
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
        EmbedderKind::Auto => build_uncached(&cfg.resolve(None)),
        EmbedderKind::Local => build_local(cfg),
    }
}

#[cfg(feature = "local")]
fn build_local(cfg: &EmbedderConfig) -> Result<Arc<dyn Embedder>> {
    let dir = cfg.model_dir().ok_or_else(|| {
        crate::error::Error::invalid(
            "embedder.model_dir",
            "no model directory: set model_dir, or SHADOWBRAIN_MODEL_DIR, or HOME so the \
             default (~/.local/share/shadowbrain/models/all-MiniLM-L6-v2) can be found",
        )
    })?;
    let embedder = LocalEmbedder::open_with(&dir, cfg.model.as_deref(), cfg.precision)?;
    if let Some(d) = cfg.dimensions
        && d != embedder.dimensions()
    {
        return Err(crate::error::Error::invalid(
            "embedder.dimensions",
            format!(
                "is {d}, but the model in {} makes {}-dimensional vectors; remove the key or \
                 set it to {}",
                dir.display(),
                embedder.dimensions(),
                embedder.dimensions()
            ),
        ));
    }
    Ok(Arc::new(embedder))
}

#[cfg(not(feature = "local"))]
fn build_local(_cfg: &EmbedderConfig) -> Result<Arc<dyn Embedder>> {
    Err(crate::error::Error::invalid(
        "embedder.kind",
        "this build has no local embedder (shadowbrain-runtime's `local` feature is off); \
         use \"hash\" or \"openai\", or build with the feature",
    ))
}

/// A text's embedding and, for a long text, its passages' (see [`crate::index::passage`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Embedded {
    /// The record's vector: the text's own, or for a long text the normalised mean of its
    /// passages' (what the vector index holds, and what similarity links and diversity
    /// compare).
    pub vector: Vec<f32>,
    /// The passages of a long text with their vectors; empty for any other.
    pub passages: Vec<Passage>,
}

/// Embeds `texts` as records are embedded: a text that is not long as itself, a long one
/// passage by passage, all in one [`Embedder::embed`] call so a remote embedder batches
/// them together. One [`Embedded`] per text, in order.
pub async fn embed_records(embedder: &dyn Embedder, texts: &[&str]) -> Result<Vec<Embedded>> {
    let splits: Vec<Vec<std::ops::Range<usize>>> =
        texts.iter().map(|t| passage::split(t)).collect();
    let flat: Vec<String> = texts
        .iter()
        .zip(&splits)
        .flat_map(|(t, ranges)| ranges.iter().map(|r| t[r.clone()].to_string()))
        .collect();
    let vectors = embedder.embed_background(&flat).await?;
    if vectors.len() != flat.len() {
        return Err(Error::internal(
            "embedding",
            format!(
                "the embedder returned {} vectors for {} texts",
                vectors.len(),
                flat.len()
            ),
        ));
    }
    let mut vectors = vectors.into_iter();
    let mut out = Vec::with_capacity(texts.len());
    for ranges in splits {
        let vecs: Vec<Vec<f32>> = vectors.by_ref().take(ranges.len()).collect();
        if ranges.len() == 1 {
            out.push(Embedded {
                vector: vecs.into_iter().next().unwrap_or_default(),
                passages: Vec::new(),
            });
            continue;
        }
        let mut mean = vec![0.0f32; vecs[0].len()];
        for v in &vecs {
            for (m, x) in mean.iter_mut().zip(v) {
                *m += x;
            }
        }
        let norm = mean.iter().map(|x| x * x).sum::<f32>().sqrt();
        if norm > f32::EPSILON {
            mean.iter_mut().for_each(|x| *x /= norm);
        }
        let passages = ranges
            .into_iter()
            .zip(vecs)
            .map(|(r, embedding)| Passage {
                start: u32::try_from(r.start).unwrap_or(u32::MAX),
                end: u32::try_from(r.end).unwrap_or(u32::MAX),
                embedding,
            })
            .collect();
        out.push(Embedded {
            vector: mean,
            passages,
        });
    }
    Ok(out)
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
    fn empty_section_is_auto_which_is_hash_without_a_model() {
        let cfg = parse("[embedder]\n").unwrap();
        assert_eq!(cfg, EmbedderConfig::default());
        assert_eq!(cfg.kind, EmbedderKind::Auto);
        assert_eq!(cfg.timeout().unwrap(), Duration::from_secs(30));
        let nowhere = Some(PathBuf::from("/nonexistent/model"));
        let resolved = cfg.resolve_with(None, nowhere);
        assert_eq!(resolved.kind, EmbedderKind::Hash);
        let e = build_embedder(&resolved).unwrap();
        assert_eq!((e.name(), e.dimensions()), ("hash", 384));
    }

    #[test]
    fn auto_takes_an_installed_model_but_keeps_a_directory_on_its_embedder() {
        let dir = tempfile::tempdir().unwrap();
        for f in ["config.json", "tokenizer.json", "model.safetensors"] {
            std::fs::write(dir.path().join(f), "").unwrap();
        }
        let model = Some(dir.path().to_path_buf());
        let auto = EmbedderConfig::default();
        let fresh = auto.resolve_with(None, model.clone());
        assert_eq!(fresh.kind, EmbedderKind::Local);
        assert_eq!(fresh.model_dir, Some(dir.path().display().to_string()));
        assert_eq!(
            auto.resolve_with(Some("hash"), model.clone()).kind,
            EmbedderKind::Hash
        );
        assert_eq!(
            auto.resolve_with(Some("local:all-MiniLM-L6-v2"), None).kind,
            EmbedderKind::Local
        );
        // A directory made by a provider gets the best local choice; opening it with
        // that then names `reindex` as the way out.
        assert_eq!(
            auto.resolve_with(Some("openai:m"), model).kind,
            EmbedderKind::Local
        );
        let hash = EmbedderConfig {
            kind: EmbedderKind::Hash,
            ..Default::default()
        };
        assert_eq!(hash.resolve_with(None, None), hash);
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
        assert!(
            err.contains("bert") && err.contains("hash") && err.contains("local"),
            "{err}"
        );
    }

    #[test]
    fn hash_dimensions_are_configurable_and_checked() {
        let cfg = EmbedderConfig {
            kind: EmbedderKind::Hash,
            dimensions: Some(128),
            ..Default::default()
        };
        assert_eq!(build_embedder(&cfg).unwrap().dimensions(), 128);
        let err = build_err(&EmbedderConfig {
            kind: EmbedderKind::Hash,
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
