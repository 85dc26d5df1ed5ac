//! A BERT-class sentence encoder with 8-bit weights: shadowbrain's local embedder's
//! default engine on CPUs with integer dot-product instructions. It computes what the float
//! model computes (cosine ≥ 0.999 with it, tested on the real weights) at a quarter of the
//! multiply cost, and without padding: the texts of a batch are packed one after the
//! other, the matrix products run over all their tokens at once, and only attention looks
//! at each text alone. The weights are quantised from the float checkpoint when the model
//! is opened (a fraction of a second); nothing else is installed.
//!
//! Supports what sentence-transformers' BERT-class models use: BERT (absolute positions,
//! one token type) and MPNet (absolute positions after the padding id, plus a learned bias
//! per head and bucket of relative distance added to every layer's attention scores), erf
//! GELU; [`Int8Encoder::load`] refuses anything else, and the embedder then runs the float
//! model (a BERT; nothing, for an MPNet). Its own crate so that it is optimised even in
//! test builds (the workspace's `profile.dev` says why); it reads no file itself: the
//! caller hands it the checkpoint's tensors by name.

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
    /// `bert` (also when absent) or `mpnet`.
    #[serde(default = "default_model_type")]
    pub model_type: String,
    /// MPNet: buckets of relative distance, half for each direction.
    #[serde(default = "default_buckets")]
    relative_attention_num_buckets: usize,
}

impl BertShape {
    /// Whether the model is an MPNet (else BERT).
    pub fn is_mpnet(&self) -> bool {
        self.model_type == "mpnet"
    }

    /// The first position a sequence's tokens take in the position table: MPNet numbers
    /// them from the padding id plus one (the RoBERTa convention), BERT from zero.
    fn first_position(&self) -> usize {
        match self.is_mpnet() {
            true => self.pad_token_id + 1,
            false => 0,
        }
    }

    /// The longest sequence the position table holds.
    pub fn max_tokens(&self) -> usize {
        self.max_position_embeddings
            .saturating_sub(self.first_position())
    }
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
fn default_model_type() -> String {
    "bert".into()
}
fn default_buckets() -> usize {
    32
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
    /// The position table's rows from the first position a sequence takes.
    position: Vec<f32>,
    /// What every token's embedding gets besides its word and position: BERT's token type
    /// 0, zeros for MPNet.
    token_type: Vec<f32>,
    /// MPNet's attention bias (see [`relative_bias`]); empty for BERT.
    relative: Vec<f32>,
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
    /// Quantises the weights in `tensors` (a BERT or MPNet checkpoint, names with or
    /// without the `bert.` or `mpnet.` prefix) for a model of `shape`, for `kernel`.
    pub fn load(
        tensors: Tensors<'_>,
        shape: &BertShape,
        kernel: Kernel,
    ) -> Result<Int8Encoder, Unsupported> {
        if shape.hidden_act != "gelu" {
            return Err(format!("activation {:?} (only erf GELU)", shape.hidden_act));
        }
        if !matches!(shape.model_type.as_str(), "bert" | "mpnet") {
            return Err(format!(
                "model type {:?} (BERT and MPNet only)",
                shape.model_type
            ));
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
                .find_map(|n| {
                    tensors(n)
                        .or_else(|| tensors(&format!("bert.{n}")))
                        .or_else(|| tensors(&format!("mpnet.{n}")))
                })
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
            // The same products under other names: MPNet's attention is `attn.{q,k,v,o}`
            // and its first layer norm sits in `attention`, BERT's in `attention.output`.
            let (parts, out, norm1) = match shape.is_mpnet() {
                true => (
                    ["attn.q", "attn.k", "attn.v"],
                    "attention.attn.o",
                    "attention",
                ),
                false => (
                    ["self.query", "self.key", "self.value"],
                    "attention.output.dense",
                    "attention.output",
                ),
            };
            let mut w = Vec::with_capacity(3 * h * h);
            let mut b = Vec::with_capacity(3 * h);
            for part in parts {
                w.extend(sized(&format!("{p}.attention.{part}.weight"), h * h)?);
                b.extend(sized(&format!("{p}.attention.{part}.bias"), h)?);
            }
            let inter = shape.intermediate_size;
            let source = [
                Source {
                    w,
                    b,
                    n: 3 * h,
                    k: h,
                },
                linear(&format!("{p}.{out}"), h, h)?,
                linear(&format!("{p}.intermediate.dense"), inter, h)?,
                linear(&format!("{p}.output.dense"), h, inter)?,
            ];
            layers.push(Layer {
                qkv: source[0].quantize(),
                out: source[1].quantize(),
                norm1: norm(&format!("{p}.{norm1}"))?,
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
        let (token_type, relative) = match shape.is_mpnet() {
            true => {
                let buckets = shape.relative_attention_num_buckets;
                let table = sized(
                    "encoder.relative_attention_bias.weight",
                    buckets * shape.num_attention_heads,
                )?;
                let heads = shape.num_attention_heads;
                let relative = relative_bias(&table, buckets, heads, shape.max_tokens());
                (vec![0.0; h], relative)
            }
            false => {
                let token_type = get("embeddings.token_type_embeddings.weight")?;
                let first = token_type.get(..h).ok_or("no token type embedding")?;
                (first.to_vec(), Vec::new())
            }
        };
        let mut position = sized(
            "embeddings.position_embeddings.weight",
            shape.max_position_embeddings * h,
        )?;
        position.drain(..shape.first_position() * h);
        Ok(Int8Encoder {
            hidden: h,
            heads: shape.num_attention_heads,
            eps: shape.layer_norm_eps as f32,
            word,
            position,
            token_type,
            relative,
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
        // Errors add up layer by layer: past six layers (MPNet-base has twelve) the inputs
        // of the query-key-value and down projections get a second byte too, which brings
        // the twelve-layer model to the six-layer one's agreement with the float model or
        // better, for about a sixth more work (docs/configuration.md, 'Embedders', has the
        // agreement with and without it).
        let deep = self.layers.len() > 6;
        for ((layer, source), ranges) in self.layers.iter_mut().zip(&self.sources).zip(&ranges) {
            let [qkv, out, up, down] = std::array::from_fn(|i| {
                let s = &source[i];
                // The down projection (the fourth) reads GELU's output, four times the
                // hidden width, and its weights' rounding costs the most: they get a
                // second byte.
                let down = i == 3;
                let fine_inputs = deep && (down || i == 0);
                PackedWeights::smoothed(&s.w, s.n, s.k, &s.b, &ranges[i], down, fine_inputs)
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
        layers + 4 * (self.word.len() + self.position.len() + self.relative.len())
    }

    /// The token vectors' mean (`mean = true`) or first token's vector for each sequence of
    /// token ids, not normalised. No sequence may be longer than [`BertShape::max_tokens`]
    /// (the tokenizer truncates). `pause` is called between pieces of work of a fraction of
    /// a millisecond (see `kernels::matmul`).
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
        let bias = (!self.relative.is_empty()).then(|| Bias {
            table: &self.relative,
            width: self.relative.len() / self.heads,
        });
        let kernel = self.kernel;
        for (l, layer) in self.layers.iter().enumerate() {
            let mut r = ranges.as_deref_mut().map(|r| r[l].iter_mut());
            let mut next = || r.as_mut().and_then(|r| r.next());
            product(kernel, next(), &x, h, &layer.qkv, &mut qkv, &mut q, pause);
            let mut offset = 0;
            for seq in seqs {
                scratch.run(&qkv, &mut ctx, offset, seq.len(), h, self.heads, bias);
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
    kernels::quantize_rows(x, k, w.smoothing(), q, w.fine_inputs());
    kernels::matmul(kernel, q, w, out, pause);
}

/// MPNet's attention bias as a table `[head][distance]` for every distance `j − i` a key
/// `j` and a query `i` of a sequence of up to `longest` tokens can be apart, from
/// `−(longest − 1)` at index 0, so a query's biases over its keys are one contiguous run.
/// `weights` is the checkpoint's `[bucket][head]` table.
fn relative_bias(weights: &[f32], buckets: usize, heads: usize, longest: usize) -> Vec<f32> {
    let longest = longest.max(1) as isize;
    let width = (2 * longest - 1) as usize;
    let mut table = vec![0.0f32; heads * width];
    for (index, distance) in (1 - longest..longest).enumerate() {
        let bucket = relative_bucket(distance, buckets);
        for head in 0..heads {
            table[head * width + index] = weights[bucket * heads + head];
        }
    }
    table
}

/// The bucket of relative distance `distance` (key position minus query position) as MPNet
/// (and T5, bidirectionally) computes it: half the buckets for keys before the query, half
/// for keys after; in each half, one bucket per distance below a quarter of the buckets,
/// then buckets growing logarithmically up to 128 tokens, beyond which all share the last.
fn relative_bucket(distance: isize, buckets: usize) -> usize {
    const MAX_DISTANCE: f32 = 128.0;
    let half = buckets / 2;
    let exact = half / 2;
    // The definition's `n` is the query's position minus the key's.
    let n = -distance;
    let side = if n < 0 { half } else { 0 };
    let n = n.unsigned_abs();
    if n < exact {
        return side + n;
    }
    // In f32 as the reference computes it, so the bucket edges (16, 32, 64 tokens) fall
    // where its do.
    let exact_f = exact as f32;
    let log = (n as f32 / exact_f).ln() / (MAX_DISTANCE / exact_f).ln();
    let large = exact + (log * (half - exact) as f32) as usize;
    side + large.min(half - 1)
}

/// MPNet's relative attention bias, borrowed by the attention loop: `table` holds `width`
/// distances per head (see [`relative_bias`]).
#[derive(Clone, Copy)]
struct Bias<'a> {
    table: &'a [f32],
    width: usize,
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
    /// `qkv`), every head, into `ctx`, with MPNet's `bias` on the scores when given.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn run(
        &mut self,
        qkv: &[f32],
        ctx: &mut [f32],
        offset: usize,
        len: usize,
        h: usize,
        heads: usize,
        bias: Option<Bias<'_>>,
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
                if let Some(Bias { table, width }) = bias {
                    // Key j is j − i from query i: index j − i + (width − 1) / 2.
                    let start = head * width + (width - 1) / 2 - i;
                    let row = &table[start..start + len];
                    scores.iter_mut().zip(row).for_each(|(s, b)| *s += b);
                }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mpnet_buckets_are_those_of_the_reference() {
        // (key − query distance, bucket), from `tests/reference/encoder.py`, itself checked
        // against transformers' MPNet in float64.
        let expected = [
            (-200, 15),
            (-129, 15),
            (-128, 15),
            (-127, 15),
            (-64, 14),
            (-63, 13),
            (-32, 12),
            (-31, 11),
            (-17, 10),
            (-16, 10),
            (-15, 9),
            (-9, 8),
            (-8, 8),
            (-7, 7),
            (-1, 1),
            (0, 0),
            (1, 17),
            (7, 23),
            (8, 24),
            (9, 24),
            (15, 25),
            (16, 26),
            (17, 26),
            (31, 27),
            (32, 28),
            (63, 29),
            (64, 30),
            (127, 31),
            (128, 31),
            (200, 31),
        ];
        for (distance, bucket) in expected {
            assert_eq!(relative_bucket(distance, 32), bucket, "distance {distance}");
        }
    }

    #[test]
    fn a_query_reads_its_biases_as_one_run() {
        // Two heads, four buckets: the table holds, per head, distances −3 … 3.
        let weights: Vec<f32> = (0..8).map(|i| i as f32).collect();
        let table = relative_bias(&weights, 4, 2, 4);
        assert_eq!(table.len(), 2 * 7);
        for head in 0..2 {
            for d in -3isize..=3 {
                let want = weights[relative_bucket(d, 4) * 2 + head];
                assert_eq!(table[head * 7 + (d + 3) as usize], want, "head {head}, {d}");
            }
        }
    }
}
