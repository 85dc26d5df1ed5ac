//! The local embedder: a sentence-transformers encoder (all-MiniLM-L6-v2, or another
//! BERT or MPNet model with mean or CLS pooling) run in-process on the CPU. It
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
//! Two engines run the model. On CPUs with integer dot-product instructions the default is
//! the int8 encoder (the `shadowbrain-encoder` crate): 8-bit weights quantised from the
//! installed file at start-up, texts packed without padding, elementwise maths vectorised
//! (cosine ≥ 0.999 with the float model, several times its speed). Elsewhere, or with
//! `[embedder] precision = "f32"`, candle runs the float model, the reference (BERT only:
//! an MPNet runs on the int8 engine on every CPU): texts of one call are tokenised
//! together, sorted by length and run in sub-batches of similar length, so one long text
//! does not pad a whole batch to the longest.
//!
//! Recall's query comes first: background batches (the enricher's, through
//! [`Embedder::embed_background`]) run on their own threads in the idle scheduling class
//! (Linux's `SCHED_IDLE`: a core only when no other thread wants it) and, between pieces of
//! work of a fraction of a millisecond, step aside while queries are being embedded, so a
//! query never waits behind a batch and the batches use the cores the foreground leaves.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config};
use serde::Deserialize;
use shadowbrain_encoder::{BertShape, Int8Encoder, Kernel};
use tokenizers::{Tokenizer, TruncationParams};

use super::{Embedder, MODEL_FILES, Precision};
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
    engine: Engine,
    tokenizer: Tokenizer,
    pooling: Pooling,
    pad_id: u32,
    gate: Gate,
}

/// What runs the model (see the module docs).
enum Engine {
    Int8(Int8Encoder),
    Float(BertModel),
}

/// Tokens one int8 pass carries at most: bounds the activations' memory (about 17 KB a
/// token for MiniLM, so 17 MB a background thread) while keeping the products long enough
/// that the weights are read once for many rows.
const PASS_TOKENS: usize = 1024;

impl std::fmt::Debug for LocalEmbedder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalEmbedder")
            .field("name", &self.name)
            .field("dimensions", &self.dimensions)
            .field("pooling", &self.model.pooling)
            .field("engine", &self.engine())
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
    /// (default: `local:` and the directory's name). The engine is the fastest this CPU
    /// runs ([`Precision::Auto`]).
    pub fn open(dir: &Path, name: Option<&str>) -> Result<LocalEmbedder> {
        LocalEmbedder::open_with(dir, name, Precision::Auto)
    }

    /// [`LocalEmbedder::open`] with the engine chosen by `precision`: `Int8` runs the int8
    /// engine even where only its portable (slow) kernel runs; `Auto` runs it where the
    /// CPU has its fast kernel and the model is one it supports, else the float model.
    pub fn open_with(
        dir: &Path,
        name: Option<&str>,
        precision: Precision,
    ) -> Result<LocalEmbedder> {
        if let Some(missing) = MODEL_FILES.iter().find(|f| !dir.join(f).is_file()) {
            return Err(unreadable(dir, format_args!("{missing} is missing")));
        }
        let read = |file: &str| -> Result<Vec<u8>> {
            let path = dir.join(file);
            std::fs::read(&path).map_err(|e| Error::io(path, e))
        };
        let config_json = read("config.json")?;
        let shape: BertShape = serde_json::from_slice(&config_json)
            .map_err(|e| unreadable(dir, format_args!("config.json: {e}")))?;
        let max_tokens = match dir.join("sentence_bert_config.json").is_file() {
            true => {
                serde_json::from_slice::<SentenceConfig>(&read("sentence_bert_config.json")?)
                    .map_err(|e| unreadable(dir, format_args!("sentence_bert_config.json: {e}")))?
                    .max_seq_length
            }
            false => None,
        }
        .unwrap_or(shape.max_tokens())
        .min(shape.max_tokens());
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
        let engine = load_engine(dir, &config_json, &shape, &tokenizer, precision)?;
        let name = match name {
            Some(n) => format!("local:{n}"),
            None => format!("local:{}", model_name(dir)),
        };
        Ok(LocalEmbedder {
            name,
            dimensions: shape.hidden_size,
            model: Arc::new(Model {
                engine,
                tokenizer,
                pooling,
                pad_id: shape.pad_token_id as u32,
                gate: Gate::new(std::thread::available_parallelism().map_or(1, |n| n.get())),
            }),
        })
    }
}

impl LocalEmbedder {
    /// Which engine runs the model: `int8 (avx512-vnni)`, `int8 (portable)` or `f32`.
    pub fn engine(&self) -> &'static str {
        match &self.model.engine {
            Engine::Int8(e) => match e.kernel() {
                Kernel::Vnni512 => "int8 (avx512-vnni)",
                Kernel::Portable => "int8 (portable)",
            },
            Engine::Float(_) => "f32",
        }
    }
}

/// Loads the engine `precision` asks for (see [`LocalEmbedder::open_with`]).
fn load_engine(
    dir: &Path,
    config_json: &[u8],
    shape: &BertShape,
    tokenizer: &Tokenizer,
    precision: Precision,
) -> Result<Engine> {
    let weights = dir.join("model.safetensors");
    let kernel = Kernel::detect();
    // candle runs BERT only: an MPNet runs on the int8 engine on every CPU.
    let float_runs_it = !shape.is_mpnet();
    let int8 = match precision {
        Precision::F32 if !float_runs_it => {
            return Err(Error::invalid(
                "embedder.precision",
                format!(
                    "is \"f32\", but the float engine runs BERT models only and the model in \
                     {} is an MPNet; set precision = \"auto\" or \"int8\"",
                    dir.display()
                ),
            ));
        }
        Precision::F32 => false,
        Precision::Int8 => true,
        Precision::Auto => kernel != Kernel::Portable || !float_runs_it,
    };
    if int8 {
        let tensors = candle_core::safetensors::load(&weights, &Device::Cpu)
            .map_err(|e| unreadable(dir, format_args!("model.safetensors: {e}")))?;
        let values = |name: &str| {
            tensors.get(name).map(|t| {
                t.to_dtype(DType::F32)
                    .and_then(|t| t.flatten_all())
                    .and_then(|t| t.to_vec1::<f32>())
                    .map_err(|e| e.to_string())
            })
        };
        match Int8Encoder::load(&values, shape, kernel) {
            Ok(mut encoder) => {
                let calibration = tokenizer
                    .encode_batch(CALIBRATION.to_vec(), true)
                    .map_err(|e| unreadable(dir, format_args!("tokenizer.json: {e}")))?;
                let ids: Vec<&[u32]> = calibration.iter().map(|e| e.get_ids()).collect();
                encoder.calibrate(&ids);
                tracing::debug!(
                    kernel = ?encoder.kernel(),
                    mib = encoder.bytes() >> 20,
                    "local embedder: int8 engine"
                );
                return Ok(Engine::Int8(encoder));
            }
            Err(why) if precision == Precision::Int8 || !float_runs_it => {
                let hint = match float_runs_it {
                    true => "; set precision = \"f32\"",
                    false => " and the float engine runs BERT models only",
                };
                return Err(unreadable(
                    dir,
                    format_args!("the int8 engine cannot run it ({why}){hint}"),
                ));
            }
            Err(why) => {
                tracing::info!("local embedder: the float engine runs this model ({why})");
            }
        }
    }
    let config: Config = serde_json::from_slice(config_json)
        .map_err(|e| unreadable(dir, format_args!("config.json: {e}")))?;
    // SAFETY: the weights are memory-mapped read-only; shadowbrain never writes them,
    // and a file changed under a running process is the operator's mistake to avoid
    // (as with any mmapped model).
    let vb = unsafe { VarBuilder::from_mmaped_safetensors(&[&weights], DType::F32, &Device::Cpu) }
        .map_err(|e| unreadable(dir, format_args!("model.safetensors: {e}")))?;
    let bert = BertModel::load(vb, &config)
        .map_err(|e| unreadable(dir, format_args!("the weights do not fit config.json: {e}")))?;
    Ok(Engine::Float(bert))
}

/// Texts of the kinds agents remember, on which the int8 engine measures its activations'
/// ranges once at start-up (see `Int8Encoder::calibrate`). Fixed, so every start quantises
/// the same way.
const CALIBRATION: &[&str] = &[
    "Caroline: I went to a LGBTQ support group yesterday and it was so powerful.",
    "Melanie: That's great! What did you talk about there? Did you meet anyone new?",
    "The deploy runner moved from eu-1 to eu-2 last Tuesday after the disk filled up.",
    "user asked to book a table for four at 7:30 pm on Friday; confirmed with the restaurant",
    "ERROR 2026-11-30T04:12:09Z job=nightly-backup exit=137 (OOM killed) retry 3/5",
    "tool_result: {\"status\": \"ok\", \"rows\": 42, \"elapsed_ms\": 118}",
    "fn main() { let v: Vec<u32> = (0..10).collect(); println!(\"{:?}\", v); }",
    "What did the team decide about the database migration during the last meeting?",
    "Remember: the customer prefers email over phone calls and is in the CET time zone.",
    "When is Jon's birthday, and what did Gina give him last year?",
    "Lesson learned: always pin the compiler version in CI, the nightly broke the build twice.",
    "The quarterly revenue grew 14.2% to $3.8M, driven by the enterprise tier.",
    "Je pense que nous devrions reporter la réunion à jeudi prochain.",
    "I've been painting a lot lately — mostly landscapes of the lake near my grandparents' house.",
    "SELECT id, name FROM users WHERE created_at > now() - interval '7 days' ORDER BY id;",
    "The agent retried the API call after a 429 and succeeded on the second attempt.",
    "Step 3 of the plan: summarise the findings, then ask the reviewer for approval.",
    "a",
    "ok",
    "Thanks! See you tomorrow.",
    "The patient reported mild headaches in the mornings, improving after hydration.",
    "Meeting notes: budget approved; hire two engineers in Q1; revisit pricing in March.",
    "In 1998 she moved to Lisbon, where she opened a small bookshop by the river.",
    "The vector index rebuild finished in 41 seconds with 120,000 records and no errors.",
];

/// Who is waiting for an embedding: recall (a person or an agent, now) or the enricher.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Priority {
    Foreground,
    Background,
}

/// Lets foreground embeddings pass background ones: background worker `i` runs only while
/// fewer than `cores − i` foreground embeddings are running, so with one query in flight
/// on two cores one background worker steps aside, with two both do.
struct Gate {
    cores: usize,
    foreground: AtomicUsize,
    lock: Mutex<()>,
    turn: Condvar,
}

impl Gate {
    fn new(cores: usize) -> Gate {
        Gate {
            cores: cores.max(1),
            foreground: AtomicUsize::new(0),
            lock: Mutex::new(()),
            turn: Condvar::new(),
        }
    }

    /// Marks a foreground embedding running until the guard drops.
    fn enter(&self) -> Foreground<'_> {
        self.foreground.fetch_add(1, Ordering::SeqCst);
        Foreground(self)
    }

    /// Blocks background worker `worker` while foreground work needs its core.
    fn pause(&self, worker: usize) {
        let must_wait = |g: &Gate| worker + g.foreground.load(Ordering::SeqCst) >= g.cores;
        if !must_wait(self) {
            return;
        }
        let mut held = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        while must_wait(self) {
            held = self.turn.wait(held).unwrap_or_else(|p| p.into_inner());
        }
    }
}

struct Foreground<'a>(&'a Gate);

impl Drop for Foreground<'_> {
    fn drop(&mut self) {
        // Under the lock, so a worker between its check and its wait cannot miss this.
        let _held = self.0.lock.lock().unwrap_or_else(|p| p.into_inner());
        self.0.foreground.fetch_sub(1, Ordering::SeqCst);
        self.0.turn.notify_all();
    }
}

/// Puts the calling thread in Linux's idle scheduling class (`SCHED_IDLE`, per thread), so
/// the background batches it runs get a core only when no other thread wants it, and any
/// thread that wakes takes the core at once; where that is refused, nice 19. A nice level
/// alone lets a background thread keep a core for milliseconds after a recall's thread
/// wakes, which recall's tail latency shows.
fn lower_priority() {
    #[cfg(target_os = "linux")]
    // SAFETY: plain system calls on the calling thread (pid 0 and its own id); a failure
    // only leaves the priority as it was.
    unsafe {
        let param = libc::sched_param { sched_priority: 0 };
        if libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) != 0 {
            libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 19);
        }
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
    fn embed(&self, texts: &[String], priority: Priority) -> Result<Vec<Vec<f32>>> {
        let failed = |e: &dyn std::fmt::Display| Error::Provider {
            provider: "local".into(),
            message: e.to_string(),
        };
        let encodings = self
            .tokenizer
            .encode_batch(texts.iter().map(String::as_str).collect::<Vec<_>>(), true)
            .map_err(|e| failed(&e))?;
        let ids: Vec<&[u32]> = encodings.iter().map(|e| e.get_ids()).collect();
        let mut out = match &self.engine {
            Engine::Int8(encoder) => self.run_int8(encoder, &ids, priority).ok_or_else(|| {
                failed(&"a thread of the int8 engine panicked; the texts were not embedded")
            })?,
            Engine::Float(bert) => self.run_float(bert, &ids).map_err(|e| failed(&e))?,
        };
        for v in &mut out {
            let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
            if norm > 0.0 {
                v.iter_mut().for_each(|x| *x /= norm);
            }
        }
        Ok(out)
    }

    /// The float engine's pooled vectors for `ids`, in order: sorted by length and run in
    /// padded sub-batches of similar length.
    fn run_float(&self, bert: &BertModel, ids: &[&[u32]]) -> candle_core::Result<Vec<Vec<f32>>> {
        let mut order: Vec<usize> = (0..ids.len()).collect();
        order.sort_by_key(|&i| ids[i].len());
        let mut out = vec![Vec::new(); ids.len()];
        for chunk in order.chunks(SUB_BATCH) {
            let len = chunk
                .iter()
                .map(|&i| ids[i].len())
                .max()
                .unwrap_or(0)
                .max(1);
            let mut padded = vec![self.pad_id; chunk.len() * len];
            let mut mask = vec![0u32; chunk.len() * len];
            for (row, &i) in chunk.iter().enumerate() {
                let tokens = ids[i];
                padded[row * len..row * len + tokens.len()].copy_from_slice(tokens);
                mask[row * len..row * len + tokens.len()].fill(1);
            }
            let rows = self.forward(bert, padded, mask, chunk.len(), len)?;
            for (&i, v) in chunk.iter().zip(rows) {
                out[i] = v;
            }
        }
        Ok(out)
    }

    /// The int8 engine's pooled vectors for `ids`, in order. The foreground runs on the
    /// calling thread, marked so background work steps aside; the background splits the
    /// texts over one thread per core (balanced by tokens), each in the idle scheduling
    /// class and pausing for the foreground.
    /// `None` when a background thread panicked (the caller reports it; nothing is
    /// half-embedded).
    fn run_int8(
        &self,
        encoder: &Int8Encoder,
        ids: &[&[u32]],
        priority: Priority,
    ) -> Option<Vec<Vec<f32>>> {
        let mean = self.pooling == Pooling::Mean;
        let passes = |worker: Option<usize>, mine: &[usize]| -> Vec<(usize, Vec<f32>)> {
            let pause = || {
                if let Some(w) = worker {
                    self.gate.pause(w);
                }
            };
            let mut out = Vec::with_capacity(mine.len());
            let mut start = 0;
            while start < mine.len() {
                let mut end = start;
                let mut tokens = 0;
                while end < mine.len()
                    && (end == start || tokens + ids[mine[end]].len() <= PASS_TOKENS)
                {
                    tokens += ids[mine[end]].len();
                    end += 1;
                }
                let seqs: Vec<&[u32]> = mine[start..end].iter().map(|&i| ids[i]).collect();
                let vectors = encoder.encode(&seqs, mean, &pause);
                out.extend(mine[start..end].iter().copied().zip(vectors));
                start = end;
            }
            out
        };
        let all: Vec<usize> = (0..ids.len()).collect();
        let workers = self.gate.cores.min(ids.len());
        let parts = match priority {
            Priority::Foreground => {
                let _running = self.gate.enter();
                Some(passes(None, &all))
            }
            Priority::Background if workers <= 1 => std::thread::scope(|s| {
                s.spawn(|| {
                    lower_priority();
                    passes(Some(0), &all)
                })
                .join()
                .ok()
            }),
            Priority::Background => {
                // Longest first onto the least loaded worker.
                let mut order = all;
                order.sort_by_key(|&i| std::cmp::Reverse(ids[i].len()));
                let mut shares = vec![(0usize, Vec::new()); workers];
                for i in order {
                    let least = shares
                        .iter_mut()
                        .min_by_key(|(load, _)| *load)
                        .expect("workers ≥ 1");
                    least.0 += ids[i].len();
                    least.1.push(i);
                }
                std::thread::scope(|s| {
                    let handles: Vec<_> = shares
                        .iter()
                        .enumerate()
                        .map(|(w, (_, mine))| {
                            let passes = &passes;
                            s.spawn(move || {
                                lower_priority();
                                passes(Some(w), mine)
                            })
                        })
                        .collect();
                    handles
                        .into_iter()
                        .map(|h| h.join().ok())
                        .collect::<Option<Vec<_>>>()
                        .map(|parts| parts.into_iter().flatten().collect())
                })
            }
        }?;
        let mut out = vec![Vec::new(); ids.len()];
        for (i, v) in parts {
            out[i] = v;
        }
        Some(out)
    }

    /// The float engine's pooled vectors of one padded sub-batch.
    fn forward(
        &self,
        bert: &BertModel,
        ids: Vec<u32>,
        mask: Vec<u32>,
        n: usize,
        len: usize,
    ) -> candle_core::Result<Vec<Vec<f32>>> {
        let ids = Tensor::from_vec(ids, (n, len), &Device::Cpu)?;
        let types = ids.zeros_like()?;
        let mask = Tensor::from_vec(mask, (n, len), &Device::Cpu)?;
        let hidden = bert.forward(&ids, &types, Some(&mask))?;
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
        self.run(texts, Priority::Foreground).await
    }

    async fn embed_background(&self, texts: &[String]) -> Result<Vec<Vec<f32>>> {
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        self.run(texts, Priority::Background).await
    }
}

impl LocalEmbedder {
    async fn run(&self, texts: &[String], priority: Priority) -> Result<Vec<Vec<f32>>> {
        let model = self.model.clone();
        let texts = texts.to_vec();
        // Milliseconds of CPU or more: off the async workers.
        tokio::task::spawn_blocking(move || model.embed(&texts, priority))
            .await
            .map_err(|e| Error::internal("the local embedder", e))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    #[test]
    fn a_background_worker_steps_aside_while_the_foreground_needs_its_core() {
        let gate = Arc::new(Gate::new(2));
        let running = gate.enter();
        // Two cores, one foreground embedding: worker 0 keeps its core…
        gate.pause(0);
        // …worker 1 waits until the foreground is done.
        let (tx, rx) = mpsc::channel();
        let g = gate.clone();
        let worker = std::thread::spawn(move || {
            g.pause(1);
            tx.send(()).unwrap();
        });
        assert!(
            rx.recv_timeout(Duration::from_millis(200)).is_err(),
            "worker 1 ran beside the foreground"
        );
        drop(running);
        rx.recv_timeout(Duration::from_secs(30))
            .expect("worker 1 resumes once the foreground is done");
        worker.join().unwrap();
        // With two foreground embeddings, both workers wait.
        let (a, b) = (gate.enter(), gate.enter());
        let (tx, rx) = mpsc::channel();
        let g = gate.clone();
        let worker = std::thread::spawn(move || {
            g.pause(0);
            tx.send(()).unwrap();
        });
        assert!(rx.recv_timeout(Duration::from_millis(200)).is_err());
        drop(a);
        rx.recv_timeout(Duration::from_secs(30))
            .expect("one core free again");
        drop(b);
        worker.join().unwrap();
    }
}
