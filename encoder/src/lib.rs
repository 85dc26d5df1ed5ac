//! A BERT-class sentence encoder with 8-bit weights: shadowbrain's local embedder's
//! default engine on CPUs with integer dot-product instructions. It computes what the float
//! model computes (cosine ≥ 0.999 with it, tested on the real weights) at a quarter of the
//! multiply cost, and without padding: the texts of a batch are packed one after the other, the matrix
//! products run over all their tokens at once, and only attention looks at each text
//! alone. The weights are quantised from the float checkpoint when the model is opened (a
//! fraction of a second); nothing else is installed.
//!
//! Supports what sentence-transformers' BERT-class models use: absolute positions, one
//! token type, erf GELU; [`Int8Encoder::load`] refuses anything else, and the embedder
//! then runs the float model. Its own crate so that it is optimised even in test builds
//! (the workspace's `profile.dev` says why); it reads no file itself: the caller hands it
//! the checkpoint's tensors by name.

mod kernels;

use serde::Deserialize;

pub use kernels::Kernel;
use kernels::{PackedWeights, QuantRows};

/// The model's shape, from its `config.json`.
#[derive(Debug, Clone, Deserialize)]
pub struct BertShape {
    /// Width of a token's vector (and of the sentence vector).
    pub hidden_size: usize,
    num_attention_heads: usize,
    num_hidden_layers: usize,
    intermediate_size: usize,
    /// Longest sequence the position table holds.
    pub max_position_embeddings: usize,
    #[serde(default = "default_eps")]
    layer_norm_eps: f64,
    #[serde(default = "default_act")]
    hidden_act: String,
    #[serde(default = "default_positions")]
    position_embedding_type: String,
    /// The padding token's id.
    #[serde(default)]
    pub pad_token_id: usize,
}

fn default_eps() -> f64 {
    1e-12
}
fn default_act() -> String {
    "gelu".into()
}
fn default_positions() -> String {
    "absolute".into()
}

struct Norm {
    gamma: Vec<f32>,
    beta: Vec<f32>,
}

/// A linear layer's float weights, kept from loading until [`Int8Encoder::calibrate`].
struct Source {
    w: Vec<f32>,
    b: Vec<f32>,
    n: usize,
    k: usize,
}

impl Source {
    fn quantize(&self) -> PackedWeights {
        PackedWeights::quantize(&self.w, self.n, self.k, &self.b)
    }
}

/// Per layer, per product (query-key-value, output, up, down): each input's largest
/// absolute activation seen.
type Ranges = Vec<[Vec<f32>; 4]>;

struct Layer {
    /// Query, key and value in one product (`3 × hidden` outputs).
    qkv: PackedWeights,
    out: PackedWeights,
    norm1: Norm,
    up: PackedWeights,
    down: PackedWeights,
    norm2: Norm,
}

/// The encoder (see the module docs).
pub struct Int8Encoder {
    hidden: usize,
    heads: usize,
    eps: f32,
    word: Vec<f32>,
    position: Vec<f32>,
    token_type: Vec<f32>,
    norm: Norm,
    layers: Vec<Layer>,
    kernel: Kernel,
    /// The float weights, until calibration smooths and drops them.
    sources: Vec<[Source; 4]>,
}

/// Why a model cannot run on this engine (the embedder then runs the float model).
pub type Unsupported = String;

/// A checkpoint's tensors: each one's values, flattened, by name (`None`: no such tensor).
pub type Tensors<'a> = &'a dyn Fn(&str) -> Option<Result<Vec<f32>, String>>;

impl Int8Encoder {
    /// Quantises the weights in `tensors` (a BERT checkpoint, names with or without the
    /// `bert.` prefix) for a model of `shape`, for `kernel`.
    pub fn load(
        tensors: Tensors<'_>,
        shape: &BertShape,
        kernel: Kernel,
    ) -> Result<Int8Encoder, Unsupported> {
        if shape.hidden_act != "gelu" {
            return Err(format!("activation {:?} (only erf GELU)", shape.hidden_act));
        }
        if shape.position_embedding_type != "absolute" {
            return Err(format!(
                "position embeddings {:?}",
                shape.position_embedding_type
            ));
        }
        if shape.num_attention_heads == 0
            || !shape.hidden_size.is_multiple_of(shape.num_attention_heads)
            || !(shape.hidden_size / shape.num_attention_heads).is_multiple_of(LANES)
        {
            return Err(format!(
                "a head width ({} / {}) that is not a multiple of {LANES}",
                shape.hidden_size, shape.num_attention_heads
            ));
        }
        let get = |name: &str| -> Result<Vec<f32>, Unsupported> {
            let alternatives = [
                name.to_string(),
                format!("bert.{name}"),
                name.replace("LayerNorm.weight", "LayerNorm.gamma"),
                name.replace("LayerNorm.bias", "LayerNorm.beta"),
            ];
            alternatives
                .iter()
                .find_map(|n| tensors(n).or_else(|| tensors(&format!("bert.{n}"))))
                .ok_or_else(|| format!("no tensor {name}"))?
                .map_err(|e| format!("{name}: {e}"))
        };
        let h = shape.hidden_size;
        let sized = |name: &str, len: usize| -> Result<Vec<f32>, Unsupported> {
            let v = get(name)?;
            match v.len() == len {
                true => Ok(v),
                false => Err(format!("{name} has {} values, not {len}", v.len())),
            }
        };
        let norm = |prefix: &str| -> Result<Norm, Unsupported> {
            Ok(Norm {
                gamma: sized(&format!("{prefix}.LayerNorm.weight"), h)?,
                beta: sized(&format!("{prefix}.LayerNorm.bias"), h)?,
            })
        };
        let linear = |prefix: &str, n: usize, k: usize| -> Result<Source, Unsupported> {
            let w = sized(&format!("{prefix}.weight"), n * k)?;
            let b = sized(&format!("{prefix}.bias"), n)?;
            Ok(Source { w, b, n, k })
        };
        let mut layers = Vec::with_capacity(shape.num_hidden_layers);
        let mut sources = Vec::with_capacity(shape.num_hidden_layers);
        for i in 0..shape.num_hidden_layers {
            let p = format!("encoder.layer.{i}");
            let mut w = Vec::with_capacity(3 * h * h);
            let mut b = Vec::with_capacity(3 * h);
            for part in ["query", "key", "value"] {
                w.extend(sized(&format!("{p}.attention.self.{part}.weight"), h * h)?);
                b.extend(sized(&format!("{p}.attention.self.{part}.bias"), h)?);
            }
            let inter = shape.intermediate_size;
            let source = [
                Source {
                    w,
                    b,
                    n: 3 * h,
                    k: h,
                },
                linear(&format!("{p}.attention.output.dense"), h, h)?,
                linear(&format!("{p}.intermediate.dense"), inter, h)?,
                linear(&format!("{p}.output.dense"), h, inter)?,
            ];
            layers.push(Layer {
                qkv: source[0].quantize(),
                out: source[1].quantize(),
                norm1: norm(&format!("{p}.attention.output"))?,
                up: source[2].quantize(),
                down: source[3].quantize(),
                norm2: norm(&format!("{p}.output"))?,
            });
            sources.push(source);
        }
        let word = get("embeddings.word_embeddings.weight")?;
        if word.is_empty() || word.len() % h != 0 {
            return Err("the word embeddings are not rows of the hidden size".into());
        }
        let token_type = get("embeddings.token_type_embeddings.weight")?;
        Ok(Int8Encoder {
            hidden: h,
            heads: shape.num_attention_heads,
            eps: shape.layer_norm_eps as f32,
            word,
            position: sized(
                "embeddings.position_embeddings.weight",
                shape.max_position_embeddings * h,
            )?,
            token_type: token_type
                .get(..h)
                .ok_or("no token type embedding")?
                .to_vec(),
            norm: norm("embeddings")?,
            layers,
            kernel,
            sources,
        })
    }

    /// Measures each product's input ranges on `seqs` (token ids of typical texts) and
    /// quantises the weights again with those ranges smoothed into them (SmoothQuant: see
    /// `PackedWeights::smoothed`); then drops the float weights. Without it the
    /// encoder works, less precisely.
    pub fn calibrate(&mut self, seqs: &[&[u32]]) {
        if self.sources.is_empty() {
            return;
        }
        let mut ranges: Ranges = self
            .sources
            .iter()
            .map(|s| std::array::from_fn(|i| vec![0.0f32; s[i].k]))
            .collect();
        self.forward(seqs, true, &|| {}, Some(&mut ranges));
        for ((layer, source), ranges) in self.layers.iter_mut().zip(&self.sources).zip(&ranges) {
            let [qkv, out, up, down] = std::array::from_fn(|i| {
                let s = &source[i];
                // The down projection (the fourth) reads GELU's output, four times the
                // hidden width, and its weights' rounding costs the most: they get a
                // second byte (the README's figures for the local embedder weigh it).
                PackedWeights::smoothed(&s.w, s.n, s.k, &s.b, &ranges[i], i == 3)
            });
            (layer.qkv, layer.out, layer.up, layer.down) = (qkv, out, up, down);
        }
        self.sources = Vec::new();
    }

    /// The kernel its products run on.
    pub fn kernel(&self) -> Kernel {
        self.kernel
    }

    /// Bytes its weights take in memory.
    pub fn bytes(&self) -> usize {
        let layers: usize = self
            .layers
            .iter()
            .map(|l| l.qkv.bytes() + l.out.bytes() + l.up.bytes() + l.down.bytes())
            .sum();
        layers + 4 * (self.word.len() + self.position.len())
    }

    /// The token vectors' mean (`mean = true`) or first token's vector for each sequence of
    /// token ids, not normalised. Every sequence must fit the position table (the
    /// tokenizer truncates). `pause` is called between pieces of work of a fraction of a
    /// millisecond (see `kernels::matmul`).
    pub fn encode(&self, seqs: &[&[u32]], mean: bool, pause: &dyn Fn()) -> Vec<Vec<f32>> {
        match self.kernel {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the VNNI kernel is chosen only on CPUs with these features
            // (`Kernel::detect`).
            Kernel::Vnni512 => unsafe { self.encode_avx512(seqs, mean, pause) },
            _ => self.encode_any(seqs, mean, pause),
        }
    }

    /// [`Int8Encoder::encode`] compiled for AVX-512, so the elementwise loops (layer norm,
    /// softmax, GELU) vectorise sixteen wide.
    ///
    /// # Safety
    ///
    /// The CPU has the features named.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma")]
    unsafe fn encode_avx512(&self, seqs: &[&[u32]], mean: bool, pause: &dyn Fn()) -> Vec<Vec<f32>> {
        self.forward(seqs, mean, pause, None)
    }

    fn encode_any(&self, seqs: &[&[u32]], mean: bool, pause: &dyn Fn()) -> Vec<Vec<f32>> {
        self.forward(seqs, mean, pause, None)
    }

    /// The forward pass; with `ranges`, also records every product's input ranges.
    #[inline(always)]
    fn forward(
        &self,
        seqs: &[&[u32]],
        mean: bool,
        pause: &dyn Fn(),
        mut ranges: Option<&mut Ranges>,
    ) -> Vec<Vec<f32>> {
        let h = self.hidden;
        let total: usize = seqs.iter().map(|s| s.len()).sum();
        let mut x = vec![0.0f32; total * h];
        // Embeddings: word + position + token type 0, then layer norm.
        let mut row = 0;
        for seq in seqs {
            for (pos, &id) in seq.iter().enumerate() {
                let id = (id as usize).min(self.word.len() / h - 1);
                let dst = &mut x[row * h..(row + 1) * h];
                let word = &self.word[id * h..(id + 1) * h];
                let position = &self.position[pos * h..(pos + 1) * h];
                for (((d, w), p), t) in dst.iter_mut().zip(word).zip(position).zip(&self.token_type)
                {
                    *d = w + p + t;
                }
                row += 1;
            }
        }
        kernels::layer_norm(&mut x, &self.norm.gamma, &self.norm.beta, self.eps);
        let inter = self.layers.first().map_or(0, |l| l.up.outputs());
        let mut q = QuantRows::default();
        let mut qkv = vec![0.0f32; total * 3 * h];
        let mut ctx = vec![0.0f32; total * h];
        let mut proj = vec![0.0f32; total * h];
        let mut up = vec![0.0f32; total * inter];
        let longest = seqs.iter().map(|s| s.len()).max().unwrap_or(0);
        let mut scratch = Attention::new(longest, h / self.heads);
        let kernel = self.kernel;
        for (l, layer) in self.layers.iter().enumerate() {
            let mut r = ranges.as_deref_mut().map(|r| r[l].iter_mut());
            let mut next = || r.as_mut().and_then(|r| r.next());
            product(kernel, next(), &x, h, &layer.qkv, &mut qkv, &mut q, pause);
            let mut offset = 0;
            for seq in seqs {
                scratch.run(&qkv, &mut ctx, offset, seq.len(), h, self.heads);
                offset += seq.len();
            }
            product(
                kernel,
                next(),
                &ctx,
                h,
                &layer.out,
                &mut proj,
                &mut q,
                pause,
            );
            x.iter_mut().zip(&proj).for_each(|(x, p)| *x += p);
            kernels::layer_norm(&mut x, &layer.norm1.gamma, &layer.norm1.beta, self.eps);
            product(kernel, next(), &x, h, &layer.up, &mut up, &mut q, pause);
            kernels::gelu(&mut up);
            product(
                kernel,
                next(),
                &up,
                inter,
                &layer.down,
                &mut proj,
                &mut q,
                pause,
            );
            x.iter_mut().zip(&proj).for_each(|(x, p)| *x += p);
            kernels::layer_norm(&mut x, &layer.norm2.gamma, &layer.norm2.beta, self.eps);
        }
        let mut out = Vec::with_capacity(seqs.len());
        let mut offset = 0;
        for seq in seqs {
            let rows = &x[offset * h..(offset + seq.len()) * h];
            let pooled = match mean {
                true => {
                    let mut v = vec![0.0f32; h];
                    for r in rows.chunks_exact(h) {
                        v.iter_mut().zip(r).for_each(|(v, x)| *v += x);
                    }
                    let inv = 1.0 / seq.len().max(1) as f32;
                    v.iter_mut().for_each(|v| *v *= inv);
                    v
                }
                false => rows.get(..h).map_or_else(|| vec![0.0; h], <[f32]>::to_vec),
            };
            out.push(pooled);
            offset += seq.len();
        }
        out
    }
}

/// One product `out = x · Wᵀ + b` through 8-bit activations, recording `x`'s input ranges
/// when asked (calibration). A function, not a closure, because closures are not compiled
/// with the target features of the function around them and would not vectorise.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn product(
    kernel: Kernel,
    ranges: Option<&mut Vec<f32>>,
    x: &[f32],
    k: usize,
    w: &PackedWeights,
    out: &mut [f32],
    q: &mut QuantRows,
    pause: &dyn Fn(),
) {
    if let Some(r) = ranges {
        for row in x.chunks_exact(k) {
            r.iter_mut().zip(row).for_each(|(m, v)| *m = m.max(v.abs()));
        }
    }
    kernels::quantize_rows(x, k, w.smoothing(), q);
    kernels::matmul(kernel, q, w, out, pause);
}

/// Lanes of the attention loops: scores and context columns are computed sixteen at a time
/// in registers (a head's width must be a multiple; [`Int8Encoder::load`] checks).
const LANES: usize = 16;

/// Attention's buffers for one sequence and head, reused. Keys and values are laid out
/// in blocks of [`LANES`] so the inner loops read whole contiguous rows: keys by blocks of
/// sixteen tokens (`[block][dimension][16]`, padded with zeros), values by blocks of
/// sixteen dimensions (`[block][token][16]`).
struct Attention {
    keys: Vec<f32>,
    values: Vec<f32>,
    scores: Vec<f32>,
    head: usize,
}

impl Attention {
    fn new(longest: usize, head: usize) -> Attention {
        let padded = longest.div_ceil(LANES) * LANES;
        Attention {
            keys: vec![0.0; padded * head],
            values: vec![0.0; longest * head],
            scores: vec![0.0; padded],
            head,
        }
    }

    /// Self-attention of the `len` tokens from `offset` (their query, key and value rows in
    /// `qkv`), every head, into `ctx`.
    #[inline(always)]
    fn run(
        &mut self,
        qkv: &[f32],
        ctx: &mut [f32],
        offset: usize,
        len: usize,
        h: usize,
        heads: usize,
    ) {
        let d = self.head;
        let padded = len.div_ceil(LANES) * LANES;
        let scale = 1.0 / (d as f32).sqrt();
        let keys = &mut self.keys[..padded * d];
        let values = &mut self.values[..len * d];
        for head in 0..heads {
            let col = head * d;
            keys.fill(0.0);
            for j in 0..len {
                let base = (offset + j) * 3 * h;
                let key = &qkv[base + h + col..base + h + col + d];
                let block = &mut keys[(j / LANES) * d * LANES..(j / LANES + 1) * d * LANES];
                for (t, &k) in key.iter().enumerate() {
                    block[t * LANES + j % LANES] = k;
                }
                let value = &qkv[base + 2 * h + col..base + 2 * h + col + d];
                for (c, chunk) in value.chunks_exact(LANES).enumerate() {
                    values[(c * len + j) * LANES..(c * len + j + 1) * LANES].copy_from_slice(chunk);
                }
            }
            for i in 0..len {
                let base = (offset + i) * 3 * h;
                let query = &qkv[base + col..base + col + d];
                let scores = &mut self.scores[..padded];
                for (block, out) in keys
                    .chunks_exact(d * LANES)
                    .zip(scores.chunks_exact_mut(LANES))
                {
                    let mut acc = [0.0f32; LANES];
                    for (row, &q) in block.chunks_exact(LANES).zip(query) {
                        for l in 0..LANES {
                            acc[l] = q.mul_add(row[l], acc[l]);
                        }
                    }
                    for l in 0..LANES {
                        out[l] = acc[l] * scale;
                    }
                }
                let scores = &mut scores[..len];
                kernels::softmax(scores);
                let out = &mut ctx[(offset + i) * h + col..(offset + i) * h + col + d];
                for (chunk, block) in out
                    .chunks_exact_mut(LANES)
                    .zip(values.chunks_exact(len * LANES))
                {
                    let mut acc = [0.0f32; LANES];
                    for (row, &p) in block.chunks_exact(LANES).zip(scores.iter()) {
                        for l in 0..LANES {
                            acc[l] = p.mul_add(row[l], acc[l]);
                        }
                    }
                    chunk.copy_from_slice(&acc);
                }
            }
        }
    }
}
