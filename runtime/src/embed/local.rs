//! The local embedder: a sentence-transformers encoder (all-MiniLM-L6-v2, or another
//! BERT-class model with mean or CLS pooling) run in-process on the CPU with candle. It
//! reads `config.json`, `tokenizer.json` and `model.safetensors` (and, when present,
//! `sentence_bert_config.json` and `1_Pooling/config.json`) from a local directory:
//! nothing is downloaded, ever. A Hugging Face snapshot directory of such a model works as
//! it is; `scripts/install-model` puts all-MiniLM-L6-v2 where [`super::default_model_dir`]
//! looks.
//!
//! A text costs milliseconds on a small CPU, so this embedder does not embed inline:
//! ingest queues each record and the enricher embeds it in the background, and recall
//! embeds only its query. Texts longer than the model reads (256 tokens for MiniLM) are
//! truncated, as sentence-transformers does; records never are, since a long record is
//! embedded passage by passage (`crate::index::passage`).
//!
//! Texts of one call are tokenised together, sorted by length and run in sub-batches of
//! similar length, so one long text does not pad a whole batch to the longest.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config};
use serde::Deserialize;
use tokenizers::{Tokenizer, TruncationParams};

use super::{Embedder, MODEL_FILES};
use crate::error::{Error, Result};

/// Texts per forward pass. Larger batches use the matrix kernels better; attention grows
/// with the square of the longest text of the batch, which sorting by length keeps close
/// to each text's own length.
const SUB_BATCH: usize = 32;

/// How a token sequence becomes one vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pooling {
    /// The mean of the token vectors under the attention mask (sentence-transformers'
    /// default, and all-MiniLM-L6-v2's).
    Mean,
    /// The `[CLS]` token's vector.
    Cls,
}

/// A sentence encoder on the CPU (see the module docs).
pub struct LocalEmbedder {
    name: String,
    dimensions: usize,
    model: Arc<Model>,
}

struct Model {
    bert: BertModel,
    tokenizer: Tokenizer,
    pooling: Pooling,
    pad_id: u32,
}

impl std::fmt::Debug for LocalEmbedder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalEmbedder")
            .field("name", &self.name)
            .field("dimensions", &self.dimensions)
            .field("pooling", &self.model.pooling)
            .finish_non_exhaustive()
    }
}

#[derive(Deserialize)]
struct SentenceConfig {
    max_seq_length: Option<usize>,
}

#[derive(Deserialize)]
struct PoolingConfig {
    #[serde(default)]
    pooling_mode_mean_tokens: bool,
    #[serde(default)]
    pooling_mode_cls_token: bool,
}

fn unreadable(dir: &Path, what: impl std::fmt::Display) -> Error {
    Error::invalid(
        "embedder.model_dir",
        format!(
            "{} is not a usable sentence-transformers model directory: {what}; install \
             all-MiniLM-L6-v2 with `scripts/install-model`, or point model_dir at a \
             downloaded Hugging Face snapshot (config.json, tokenizer.json, \
             model.safetensors)",
            dir.display()
        ),
    )
}

impl LocalEmbedder {
    /// The model `scripts/install-model` installs.
    pub const DEFAULT_MODEL: &'static str = "all-MiniLM-L6-v2";

    /// Loads the model in `dir`; `name` overrides the name recorded in the store
    /// (default: `local:` and the directory's name).
    pub fn open(dir: &Path, name: Option<&str>) -> Result<LocalEmbedder> {
        if let Some(missing) = MODEL_FILES.iter().find(|f| !dir.join(f).is_file()) {
            return Err(unreadable(dir, format_args!("{missing} is missing")));
        }
        let read = |file: &str| -> Result<Vec<u8>> {
            let path = dir.join(file);
            std::fs::read(&path).map_err(|e| Error::io(path, e))
        };
        let config: Config = serde_json::from_slice(&read("config.json")?)
            .map_err(|e| unreadable(dir, format_args!("config.json: {e}")))?;
        let max_tokens = match dir.join("sentence_bert_config.json").is_file() {
            true => {
                serde_json::from_slice::<SentenceConfig>(&read("sentence_bert_config.json")?)
                    .map_err(|e| unreadable(dir, format_args!("sentence_bert_config.json: {e}")))?
                    .max_seq_length
            }
            false => None,
        }
        .unwrap_or(config.max_position_embeddings)
        .min(config.max_position_embeddings);
        let pooling = match dir.join("1_Pooling/config.json").is_file() {
            true => {
                let p: PoolingConfig = serde_json::from_slice(&read("1_Pooling/config.json")?)
                    .map_err(|e| unreadable(dir, format_args!("1_Pooling/config.json: {e}")))?;
                match (p.pooling_mode_mean_tokens, p.pooling_mode_cls_token) {
                    (true, _) => Pooling::Mean,
                    (false, true) => Pooling::Cls,
                    (false, false) => {
                        return Err(unreadable(
                            dir,
                            "its pooling is neither mean nor CLS, which this embedder does not do",
                        ));
                    }
                }
            }
            false => Pooling::Mean,
        };
        let mut tokenizer = Tokenizer::from_file(dir.join("tokenizer.json"))
            .map_err(|e| unreadable(dir, format_args!("tokenizer.json: {e}")))?;
        // The file's own padding (MiniLM's pads every text to 128) is dropped: sub-batches
        // are padded to their longest text below. Truncation is the model's reading length.
        tokenizer.with_padding(None);
        tokenizer
            .with_truncation(Some(TruncationParams {
                max_length: max_tokens,
                ..TruncationParams::default()
            }))
            .map_err(|e| unreadable(dir, format_args!("tokenizer.json: {e}")))?;
        let weights = dir.join("model.safetensors");
        // SAFETY: the weights are memory-mapped read-only; shadowbrain never writes them,
        // and a file changed under a running process is the operator's mistake to avoid
        // (as with any mmapped model).
        let vb =
            unsafe { VarBuilder::from_mmaped_safetensors(&[&weights], DType::F32, &Device::Cpu) }
                .map_err(|e| unreadable(dir, format_args!("model.safetensors: {e}")))?;
        let bert = BertModel::load(vb, &config).map_err(|e| {
            unreadable(dir, format_args!("the weights do not fit config.json: {e}"))
        })?;
        let name = match name {
            Some(n) => format!("local:{n}"),
            None => format!("local:{}", model_name(dir)),
        };
        Ok(LocalEmbedder {
            name,
            dimensions: config.hidden_size,
            model: Arc::new(Model {
                bert,
                tokenizer,
                pooling,
                pad_id: config.pad_token_id as u32,
            }),
        })
    }
}

/// A model's name from its directory: the directory's own name, or, in a Hugging Face
/// cache (`models--org--name/snapshots/<revision>`), the model's.
fn model_name(dir: &Path) -> String {
    let dir: PathBuf = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    let own = dir.file_name().map(|n| n.to_string_lossy().into_owned());
    let parent = dir.parent();
    if parent
        .and_then(Path::file_name)
        .is_some_and(|n| n == "snapshots")
        && let Some(repo) = parent.and_then(Path::parent).and_then(Path::file_name)
        && let Some(name) = repo.to_string_lossy().rsplit("--").next()
    {
        return name.to_string();
    }
    own.unwrap_or_else(|| "model".into())
}

impl Model {
    /// One unit vector per text, in order (blocking: runs the model).
    fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>> {
        let failed = |e: &dyn std::fmt::Display| Error::Provider {
            provider: "local".into(),
            message: e.to_string(),
        };
        let encodings = self
            .tokenizer
            .encode_batch(texts.iter().map(String::as_str).collect::<Vec<_>>(), true)
            .map_err(|e| failed(&e))?;
        let mut order: Vec<usize> = (0..texts.len()).collect();
        order.sort_by_key(|&i| encodings[i].get_ids().len());
        let mut out = vec![Vec::new(); texts.len()];
        for chunk in order.chunks(SUB_BATCH) {
            let len = chunk
                .iter()
                .map(|&i| encodings[i].get_ids().len())
                .max()
                .unwrap_or(0)
                .max(1);
            let mut ids = vec![self.pad_id; chunk.len() * len];
            let mut mask = vec![0u32; chunk.len() * len];
            for (row, &i) in chunk.iter().enumerate() {
                let tokens = encodings[i].get_ids();
                ids[row * len..row * len + tokens.len()].copy_from_slice(tokens);
                mask[row * len..row * len + tokens.len()].fill(1);
            }
            let rows = self
                .forward(ids, mask, chunk.len(), len)
                .map_err(|e| failed(&e))?;
            for (&i, mut v) in chunk.iter().zip(rows) {
                let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
                if norm > 0.0 {
                    v.iter_mut().for_each(|x| *x /= norm);
                }
                out[i] = v;
            }
        }
        Ok(out)
    }

    /// The pooled vectors of one padded sub-batch.
    fn forward(
        &self,
        ids: Vec<u32>,
        mask: Vec<u32>,
        n: usize,
        len: usize,
    ) -> candle_core::Result<Vec<Vec<f32>>> {
        let ids = Tensor::from_vec(ids, (n, len), &Device::Cpu)?;
        let types = ids.zeros_like()?;
        let mask = Tensor::from_vec(mask, (n, len), &Device::Cpu)?;
        let hidden = self.bert.forward(&ids, &types, Some(&mask))?;
        let pooled = match self.pooling {
            Pooling::Cls => hidden.narrow(1, 0, 1)?.squeeze(1)?,
            Pooling::Mean => {
                let weights = mask.to_dtype(DType::F32)?.unsqueeze(2)?;
                let summed = hidden.broadcast_mul(&weights)?.sum(1)?;
                summed.broadcast_div(&weights.sum(1)?)?
            }
        };
        pooled.to_vec2::<f32>()
    }
}

#[async_trait::async_trait]
impl Embedder for LocalEmbedder {
    fn name(&self) -> &str {
        &self.name
    }

    fn dimensions(&self) -> usize {
        self.dimensions
    }

    fn texts_per_call(&self) -> usize {
        2 * SUB_BATCH
    }

    async fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>> {
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        let model = self.model.clone();
        let texts = texts.to_vec();
        // Tens of milliseconds of CPU per sub-batch: off the async workers.
        tokio::task::spawn_blocking(move || model.embed(&texts))
            .await
            .map_err(|e| Error::internal("the local embedder", e))?
    }
}
