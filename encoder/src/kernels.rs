//! The arithmetic of the int8 encoder: matrix products with 8-bit
//! weights and activations accumulated in 32-bit integers, and the elementwise maths around
//! them (layer norm, softmax, GELU) written as plain loops that the compiler vectorises.
//!
//! A product `x · Wᵀ` is computed as `Σ (q(x) − z) · q(W)` times two scales, where `q(W)`
//! holds each output row of the weights as signed bytes with its own scale (quantised once,
//! at load) and `q(x)` each input row as unsigned bytes with its own scale and zero point
//! (quantised per product, so a token with large activations does not cost the others
//! their precision). The zero point's share, `z · Σ q(W)`, is one multiply per output
//! because the column sums are kept with the weights.
//!
//! Two kernels compute the same integers: [`Kernel::Vnni512`], for x86-64 CPUs with
//! AVX-512 VNNI (one instruction multiplies 64 byte pairs and adds them in fours), and
//! [`Kernel::Portable`], plain Rust for every other CPU and the reference the fast one is
//! tested against — their integer sums are equal, bit for bit.

/// Output columns one weight panel holds: two 512-bit registers of 32-bit sums.
pub(crate) const PANEL: usize = 32;
/// Rows of activations one register tile multiplies (16 accumulators with [`PANEL`]).
const TILE_ROWS: usize = 8;
/// Rows between two pause points (see [`matmul`]): about a third of a millisecond of work.
const ROWS_PER_PAUSE: usize = 64;

/// Which code computes the integer products.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// AVX-512 VNNI (`vpdpbusd`): x86-64 since Ice Lake and Zen 4.
    Vnni512,
    /// Plain Rust, any CPU.
    Portable,
}

impl Kernel {
    /// The fastest kernel this CPU runs.
    pub fn detect() -> Kernel {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("avx512vnni")
            && std::arch::is_x86_feature_detected!("fma")
        {
            return Kernel::Vnni512;
        }
        Kernel::Portable
    }
}

/// `k` rounded up to whole groups of four bytes, the unit `vpdpbusd` sums.
pub(crate) fn padded_k(k: usize) -> usize {
    k.div_ceil(4) * 4
}

/// A weight matrix `[n, k]` (PyTorch's `Linear` layout: one row per output) quantised to
/// signed bytes per output row, laid out in panels of [`PANEL`] outputs: within a panel,
/// for each group of four inputs, the four bytes of output 0, then of output 1, and so on
/// — what one 64-byte load hands `vpdpbusd`.
pub(crate) struct PackedWeights {
    n: usize,
    k4: usize,
    data: Vec<i8>,
    /// Per output: the scale of its bytes.
    scale: Vec<f32>,
    /// Per output: the sum of its bytes (for the activations' zero point).
    colsum: Vec<i32>,
    bias: Vec<f32>,
    /// Per input: what its activations are multiplied by before they are quantised (the
    /// weights' column was multiplied by its inverse); empty for none. See
    /// [`PackedWeights::smoothed`].
    smooth: Vec<f32>,
    /// The weights' second byte: what the first misses, quantised with scales of its own
    /// (see [`PackedWeights::smoothed`]).
    fine: Option<Box<PackedWeights>>,
    /// Whether its inputs are quantised to two bytes (see [`quantize_rows`]).
    fine_inputs: bool,
}

impl PackedWeights {
    /// Quantises `w` (`n` rows of `k`) with `bias` (`n`).
    pub(crate) fn quantize(w: &[f32], n: usize, k: usize, bias: &[f32]) -> PackedWeights {
        assert_eq!(w.len(), n * k, "weights are n × k");
        assert_eq!(bias.len(), n, "one bias per output");
        let k4 = padded_k(k) / 4;
        let panels = n.div_ceil(PANEL);
        let mut data = vec![0i8; panels * PANEL * k4 * 4];
        let mut scale = vec![1.0f32; panels * PANEL];
        let mut colsum = vec![0i32; panels * PANEL];
        let mut bias_padded = vec![0.0f32; panels * PANEL];
        bias_padded[..n].copy_from_slice(bias);
        for (o, row) in w.chunks_exact(k).enumerate() {
            let max = row.iter().fold(0.0f32, |m, x| m.max(x.abs()));
            let s = if max > 0.0 { max / 127.0 } else { 1.0 };
            scale[o] = s;
            let (panel, col) = (o / PANEL, o % PANEL);
            let base = panel * PANEL * k4 * 4;
            for (i, x) in row.iter().enumerate() {
                let q = round(x / s).clamp(-127.0, 127.0) as i8;
                colsum[o] += q as i32;
                data[base + (i / 4) * PANEL * 4 + col * 4 + i % 4] = q;
            }
        }
        PackedWeights {
            n,
            k4,
            data,
            scale,
            colsum,
            bias: bias_padded,
            smooth: Vec::new(),
            fine: None,
            fine_inputs: false,
        }
    }

    /// Quantises `w` as [`PackedWeights::quantize`] does after moving part of each input's
    /// range from the activations to the weights (SmoothQuant, α = ½): input `j`, whose
    /// activations reach `act_max[j]` in absolute value, is divided by
    /// `s = √(act_max[j] / w_max[j])` and its weight column multiplied by it, so a few
    /// inputs with activations ten times the others' no longer cost every other input of the
    /// row its precision. The product is unchanged in exact arithmetic. With `two_bytes`,
    /// what the bytes miss is quantised again into a second matrix that [`matmul`] adds:
    /// weights to about sixteen bits, for a second pass over the same activations. With
    /// `fine_inputs`, its activations get a second byte too ([`quantize_rows`]).
    pub(crate) fn smoothed(
        w: &[f32],
        n: usize,
        k: usize,
        bias: &[f32],
        act_max: &[f32],
        two_bytes: bool,
        fine_inputs: bool,
    ) -> PackedWeights {
        assert_eq!(act_max.len(), k, "one activation range per input");
        let mut w_max = vec![0.0f32; k];
        for row in w.chunks_exact(k) {
            for (m, x) in w_max.iter_mut().zip(row) {
                *m = m.max(x.abs());
            }
        }
        let s: Vec<f32> = act_max
            .iter()
            .zip(&w_max)
            .map(|(&a, &w)| match a > 0.0 && w > 0.0 {
                true => (a / w).sqrt().clamp(1e-3, 1e3),
                false => 1.0,
            })
            .collect();
        let scaled: Vec<f32> = w
            .chunks_exact(k)
            .flat_map(|row| row.iter().zip(&s).map(|(x, s)| x * s))
            .collect();
        let mut packed = PackedWeights::quantize(&scaled, n, k, bias);
        packed.smooth = s.iter().map(|s| 1.0 / s).collect();
        packed.fine_inputs = fine_inputs;
        if two_bytes {
            let mut resid = scaled;
            for (o, row) in resid.chunks_exact_mut(k).enumerate() {
                let (panel, col) = (o / PANEL, o % PANEL);
                let base = panel * PANEL * packed.k4 * 4;
                for (i, x) in row.iter_mut().enumerate() {
                    let q = packed.data[base + (i / 4) * PANEL * 4 + col * 4 + i % 4];
                    *x -= q as f32 * packed.scale[o];
                }
            }
            packed.fine = Some(Box::new(PackedWeights::quantize(
                &resid,
                n,
                k,
                &vec![0.0; n],
            )));
        }
        packed
    }

    /// Whether its inputs are to be quantised to two bytes.
    pub(crate) fn fine_inputs(&self) -> bool {
        self.fine_inputs
    }

    /// What each input is multiplied by before quantisation (empty: nothing).
    pub(crate) fn smoothing(&self) -> &[f32] {
        &self.smooth
    }

    /// Outputs per row.
    pub(crate) fn outputs(&self) -> usize {
        self.n
    }

    /// Bytes held (for the model's memory figure).
    pub(crate) fn bytes(&self) -> usize {
        self.data.len() + 12 * self.scale.len() + self.fine.as_ref().map_or(0, |f| f.bytes())
    }
}

/// Rows of activations quantised to unsigned bytes, each with its scale and zero point; a
/// buffer reused from one product to the next.
#[derive(Default)]
pub(crate) struct QuantRows {
    k4: usize,
    rows: usize,
    data: Vec<u8>,
    scale: Vec<f32>,
    zero: Vec<i32>,
    /// The activations' second byte, when asked for: what the first misses, quantised
    /// again per row (see [`quantize_rows`]).
    fine: Option<Box<QuantRows>>,
    /// A row of what the first byte misses, reused.
    missed: Vec<f32>,
}

impl QuantRows {
    fn reset(&mut self, rows: usize, k: usize) {
        let kp = padded_k(k);
        self.k4 = kp / 4;
        self.rows = rows;
        self.data.clear();
        self.data.resize(rows * kp, 0);
        self.scale.clear();
        self.zero.clear();
    }

    /// Quantises `row` into row `r`: its range [min, max] (with 0 in it) mapped onto
    /// 0..=255.
    #[inline(always)]
    fn push(&mut self, r: usize, row: &[f32]) {
        let kp = self.k4 * 4;
        let dst = &mut self.data[r * kp..r * kp + row.len()];
        let (lo, hi) = min_max(row);
        let (lo, hi) = (lo.min(0.0), hi.max(0.0));
        let s = if hi > lo { (hi - lo) / 255.0 } else { 1.0 };
        let inv = 1.0 / s;
        let z = to_byte(-lo * inv);
        for (d, &v) in dst.iter_mut().zip(row) {
            *d = to_byte(v * inv + z as f32);
        }
        // Padding inputs meet zero weights: their value does not matter.
        self.scale.push(s);
        self.zero.push(z as i32);
    }
}

/// Quantises the rows of `x` (`k` wide), each multiplied by `smooth` (per input; empty:
/// as they are), into `out`: per row, the range [min, max] (with 0 in it) mapped onto
/// 0..=255. With `second`, what those bytes miss is quantised again, row by row, into
/// `out.fine`, which [`matmul`] multiplies too: activations to about sixteen bits, for a
/// second pass over the same weights.
#[inline(always)]
pub(crate) fn quantize_rows(
    x: &[f32],
    k: usize,
    smooth: &[f32],
    out: &mut QuantRows,
    second: bool,
) {
    let rows = x.len() / k;
    out.reset(rows, k);
    let mut fine = match second {
        true => {
            let mut fine = out.fine.take().unwrap_or_default();
            fine.reset(rows, k);
            Some(fine)
        }
        false => None,
    };
    let mut smoothed = Vec::new();
    let mut missed = std::mem::take(&mut out.missed);
    for (r, row) in x.chunks_exact(k).enumerate() {
        let row = match smooth.is_empty() {
            true => row,
            false => {
                smoothed.clear();
                smoothed.extend(row.iter().zip(smooth).map(|(x, s)| x * s));
                &smoothed[..]
            }
        };
        out.push(r, row);
        if let Some(fine) = fine.as_mut() {
            let (s, z) = (out.scale[r], out.zero[r] as f32);
            let kp = out.k4 * 4;
            let bytes = &out.data[r * kp..r * kp + k];
            missed.clear();
            missed.extend(row.iter().zip(bytes).map(|(&v, &b)| v - (b as f32 - z) * s));
            fine.push(r, &missed);
        }
    }
    out.missed = missed;
    // Kept when not asked for this time, so its buffers are reused; `matmul` reads it only
    // when `second` was set (`fine.rows` then matches).
    out.fine = fine.or(out.fine.take().map(|mut f| {
        f.rows = 0;
        f
    }));
}

/// `x` clamped to [0, 255] and rounded to the nearest integer (ties to even): adding 2²³
/// leaves the integer in the low mantissa bits. Bit operations, so loops vectorise (a
/// float-to-int cast is a scalar saturating conversion, `round` a call into libm).
#[inline(always)]
fn to_byte(x: f32) -> u8 {
    (x.clamp(0.0, 255.0) + 8_388_608.0).to_bits() as u8
}

/// The sum of `x` over sixteen lanes, so it vectorises (a plain float sum must add in
/// order, one at a time).
#[inline(always)]
pub(crate) fn sum(x: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 16];
    let chunks = x.chunks_exact(16);
    let rest = chunks.remainder();
    for c in chunks {
        for (l, v) in lanes.iter_mut().zip(c) {
            *l += v;
        }
    }
    lanes.iter().sum::<f32>() + rest.iter().sum::<f32>()
}

/// The smallest and largest value of `x` (0 and 0 when empty), over sixteen lanes.
#[inline(always)]
fn min_max(x: &[f32]) -> (f32, f32) {
    let first = x.first().copied().unwrap_or(0.0);
    let (mut lo, mut hi) = ([first; 16], [first; 16]);
    let chunks = x.chunks_exact(16);
    let rest = chunks.remainder();
    for c in chunks {
        for i in 0..16 {
            lo[i] = lo[i].min(c[i]);
            hi[i] = hi[i].max(c[i]);
        }
    }
    for &v in rest {
        lo[0] = lo[0].min(v);
        hi[0] = hi[0].max(v);
    }
    let (mut l, mut h) = (lo[0], hi[0]);
    for i in 1..16 {
        l = l.min(lo[i]);
        h = h.max(hi[i]);
    }
    (l, h)
}

/// `out[m, n] = x[m, :] · W[n, :] + bias[n]` for the rows `a` quantised from `x`, over the
/// weights' second byte and the activations' too when they have one, with `pause` called
/// every [`ROWS_PER_PAUSE`] rows (where background work lets foreground work pass).
#[inline(always)]
pub(crate) fn matmul(
    kernel: Kernel,
    a: &QuantRows,
    w: &PackedWeights,
    out: &mut [f32],
    pause: &dyn Fn(),
) {
    product(kernel, a, w, out, false, pause);
    if let Some(fine) = &w.fine {
        product(kernel, a, fine, out, true, pause);
    }
    if let Some(fine) = a.fine.as_deref().filter(|f| f.rows > 0) {
        product(kernel, fine, w, out, true, pause);
    }
}

/// [`matmul`] over one byte of the weights; with `accumulate`, added to `out` instead of
/// the bias.
#[inline(always)]
fn product(
    kernel: Kernel,
    a: &QuantRows,
    w: &PackedWeights,
    out: &mut [f32],
    accumulate: bool,
    pause: &dyn Fn(),
) {
    assert_eq!(a.k4, w.k4, "inputs and weights disagree on k");
    assert_eq!(out.len(), a.rows * w.n, "the output is m × n");
    let panels = w.n.div_ceil(PANEL);
    let mut m0 = 0;
    while m0 < a.rows {
        pause();
        let m1 = (m0 + ROWS_PER_PAUSE).min(a.rows);
        for panel in 0..panels {
            let mut r0 = m0;
            while r0 < m1 {
                let rows = (m1 - r0).min(TILE_ROWS);
                match kernel {
                    #[cfg(target_arch = "x86_64")]
                    // SAFETY: `Kernel::Vnni512` is only chosen by `Kernel::detect` when the
                    // CPU has these features; the tile reads inside `a` and `w` (asserted
                    // above) and writes inside `out`.
                    Kernel::Vnni512 => unsafe {
                        vnni::tile(a, w, out, r0, rows, panel, accumulate)
                    },
                    _ => portable_tile(a, w, out, r0, rows, panel, accumulate),
                }
                r0 += rows;
            }
        }
        m0 = m1;
    }
}

/// One tile in plain Rust: the reference for the fast kernel.
fn portable_tile(
    a: &QuantRows,
    w: &PackedWeights,
    out: &mut [f32],
    r0: usize,
    rows: usize,
    panel: usize,
    accumulate: bool,
) {
    let k4 = a.k4;
    let bw = &w.data[panel * PANEL * k4 * 4..(panel + 1) * PANEL * k4 * 4];
    for r in r0..r0 + rows {
        let ar = &a.data[r * k4 * 4..(r + 1) * k4 * 4];
        let mut acc = [0i32; PANEL];
        for g in 0..k4 {
            let ab = &ar[g * 4..g * 4 + 4];
            let wb = &bw[g * PANEL * 4..(g + 1) * PANEL * 4];
            for (c, slot) in acc.iter_mut().enumerate() {
                for t in 0..4 {
                    *slot += ab[t] as i32 * wb[c * 4 + t] as i32;
                }
            }
        }
        store_row(a, w, out, r, panel, &acc, accumulate);
    }
}

/// Turns one row's integer sums for one panel into floats in `out`.
#[inline(always)]
fn store_row(
    a: &QuantRows,
    w: &PackedWeights,
    out: &mut [f32],
    r: usize,
    panel: usize,
    acc: &[i32],
    accumulate: bool,
) {
    let c0 = panel * PANEL;
    let valid = (w.n - c0).min(PANEL);
    let (sa, za) = (a.scale[r], a.zero[r]);
    let dst = &mut out[r * w.n + c0..r * w.n + c0 + valid];
    for (c, d) in dst.iter_mut().enumerate() {
        let o = c0 + c;
        let base = if accumulate { *d } else { w.bias[o] };
        *d = (acc[c] - za * w.colsum[o]) as f32 * (sa * w.scale[o]) + base;
    }
}

#[cfg(target_arch = "x86_64")]
mod vnni {
    //! The AVX-512 VNNI tile.

    use std::arch::x86_64::*;

    use super::{PANEL, PackedWeights, QuantRows, TILE_ROWS};

    /// `rows` (≤ [`TILE_ROWS`]) rows from `r0` times one panel, into `out`.
    ///
    /// # Safety
    ///
    /// The CPU has AVX-512 F, BW and VNNI; `r0 + rows ≤ a.rows`, `panel` is one of `w`'s,
    /// `out` is `a.rows × w.n`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(crate) unsafe fn tile(
        a: &QuantRows,
        w: &PackedWeights,
        out: &mut [f32],
        r0: usize,
        rows: usize,
        panel: usize,
        accumulate: bool,
    ) {
        // SAFETY (all arms): as the function's contract.
        unsafe {
            match rows {
                8 => tile_n::<8>(a, w, out, r0, panel, accumulate),
                7 => tile_n::<7>(a, w, out, r0, panel, accumulate),
                6 => tile_n::<6>(a, w, out, r0, panel, accumulate),
                5 => tile_n::<5>(a, w, out, r0, panel, accumulate),
                4 => tile_n::<4>(a, w, out, r0, panel, accumulate),
                3 => tile_n::<3>(a, w, out, r0, panel, accumulate),
                2 => tile_n::<2>(a, w, out, r0, panel, accumulate),
                _ => tile_n::<1>(a, w, out, r0, panel, accumulate),
            }
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    unsafe fn tile_n<const R: usize>(
        a: &QuantRows,
        w: &PackedWeights,
        out: &mut [f32],
        r0: usize,
        panel: usize,
        accumulate: bool,
    ) {
        const { assert!(R <= TILE_ROWS) };
        let k4 = a.k4;
        let lda = k4 * 4;
        let ap = a.data[r0 * lda..(r0 + R) * lda].as_ptr();
        let bp = w.data[panel * PANEL * lda..(panel + 1) * PANEL * lda].as_ptr();
        let mut acc = [[_mm512_setzero_si512(); 2]; R];
        for g in 0..k4 {
            // SAFETY: `g < k4`: both loads stay inside this panel's slice of `w.data`, and
            // each row's four bytes inside its row of `a.data` (bounds taken above).
            unsafe {
                let b0 = _mm512_loadu_si512(bp.add(g * PANEL * 4).cast());
                let b1 = _mm512_loadu_si512(bp.add(g * PANEL * 4 + 64).cast());
                for (r, acc) in acc.iter_mut().enumerate() {
                    let av =
                        _mm512_set1_epi32(ap.add(r * lda + g * 4).cast::<i32>().read_unaligned());
                    acc[0] = _mm512_dpbusd_epi32(acc[0], av, b0);
                    acc[1] = _mm512_dpbusd_epi32(acc[1], av, b1);
                }
            }
        }
        let c0 = panel * PANEL;
        let valid = (w.n - c0).min(PANEL);
        for (r, acc) in acc.iter().enumerate() {
            let row = r0 + r;
            let (sa, za) = (a.scale[row], a.zero[row]);
            for (h, sums) in acc.iter().enumerate() {
                let c = c0 + h * 16;
                if c >= c0 + valid {
                    break;
                }
                let lanes = (c0 + valid - c).min(16);
                let mask: __mmask16 = if lanes == 16 { !0 } else { (1u16 << lanes) - 1 };
                // SAFETY: `c + 16 ≤` the panel's padded width, inside `w`'s per-output
                // arrays; the store writes only `lanes` columns, inside row `row` of `out`.
                unsafe {
                    let colsum = _mm512_loadu_si512(w.colsum.as_ptr().add(c).cast());
                    let scale = _mm512_loadu_ps(w.scale.as_ptr().add(c));
                    let dst = out.as_mut_ptr().add(row * w.n + c);
                    let base = match accumulate {
                        true => _mm512_maskz_loadu_ps(mask, dst),
                        false => _mm512_loadu_ps(w.bias.as_ptr().add(c)),
                    };
                    let centred =
                        _mm512_sub_epi32(*sums, _mm512_mullo_epi32(_mm512_set1_epi32(za), colsum));
                    let scaled = _mm512_mul_ps(scale, _mm512_set1_ps(sa));
                    let v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(centred), scaled, base);
                    _mm512_mask_storeu_ps(dst, mask, v);
                }
            }
        }
    }
}

/// Layer norm of each `x.len() / gamma.len()`-wide row, in place.
#[inline(always)]
pub(crate) fn layer_norm(x: &mut [f32], gamma: &[f32], beta: &[f32], eps: f32) {
    let h = gamma.len();
    let mut centred = vec![0.0f32; h];
    for row in x.chunks_exact_mut(h) {
        let mean = sum(row) / h as f32;
        centred
            .iter_mut()
            .zip(row.iter())
            .for_each(|(c, v)| *c = (v - mean) * (v - mean));
        let inv = 1.0 / (sum(&centred) / h as f32 + eps).sqrt();
        for ((v, g), b) in row.iter_mut().zip(gamma).zip(beta) {
            *v = (*v - mean) * inv * g + b;
        }
    }
}

/// `x` rounded to the nearest integer, ties to even, for |x| < 2²²: adding and taking
/// away 1.5 · 2²³ leaves no fraction bits. `f32::round_ties_even` is a call into libm
/// that stops the loops around it from vectorising.
#[inline(always)]
fn round(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    (x + MAGIC) - MAGIC
}

/// `e^x` to about 2 ulp for the range softmax meets, in operations that vectorise (no
/// call into libm): `2^n · e^r` with `r` in [−ln 2 / 2, ln 2 / 2] by a degree-6 polynomial.
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let x = x.clamp(-87.0, 88.0);
    let n = round(x * std::f32::consts::LOG2_E);
    let r = x - n * LN2_HI - n * LN2_LO;
    // 2^n: n + 127 (in 1..=254) in the low mantissa bits of 2²³ + n + 127, moved to the
    // exponent (bit operations, so the loop vectorises).
    let biased = (n + (127.0 + 8_388_608.0)).to_bits() & 0x7f_ffff;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    p * f32::from_bits(biased << 23)
}

/// Softmax of `x` in place.
#[inline(always)]
pub(crate) fn softmax(x: &mut [f32]) {
    let (_, max) = min_max(x);
    x.iter_mut().for_each(|v| *v = exp(*v - max));
    let inv = 1.0 / sum(x);
    x.iter_mut().for_each(|v| *v *= inv);
}

/// The error function by a rational approximation accurate to float precision (the
/// odd/even minimax pair on [−4, 4] also used by XLA and Eigen; beyond ±4, erf is ±1 in
/// `f32`), in operations that vectorise.
#[inline(always)]
pub(crate) fn erf(x: f32) -> f32 {
    let x = x.clamp(-4.0, 4.0);
    let x2 = x * x;
    let p = -2.726_142_3e-10f32;
    let p = p * x2 + 2.770_681_4e-8;
    let p = p * x2 - 2.101_024e-6;
    let p = p * x2 - 5.692_506_4e-5;
    let p = p * x2 - 7.349_906_3e-4;
    let p = p * x2 - 2.954_600_1e-3;
    let p = p * x2 - 1.609_603_3e-2;
    let q = -1.456_607_2e-5f32;
    let q = q * x2 - 2.133_740_6e-4;
    let q = q * x2 - 1.682_827e-3;
    let q = q * x2 - 7.373_329e-3;
    let q = q * x2 - 1.426_473_9e-2;
    x * p / q
}

/// GELU as BERT defines it (with erf, not the tanh approximation), in place.
#[inline(always)]
pub(crate) fn gelu(x: &mut [f32]) {
    for v in x.iter_mut() {
        *v = 0.5 * *v * (1.0 + erf(*v * std::f32::consts::FRAC_1_SQRT_2));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic spread of values in [-1, 1).
    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    fn product(kernel: Kernel, x: &[f32], w: &PackedWeights, k: usize) -> Vec<f32> {
        product_with(kernel, x, w, k, false)
    }

    fn product_with(
        kernel: Kernel,
        x: &[f32],
        w: &PackedWeights,
        k: usize,
        second: bool,
    ) -> Vec<f32> {
        let mut q = QuantRows::default();
        quantize_rows(x, k, w.smoothing(), &mut q, second);
        let mut out = vec![0.0; q.rows * w.outputs()];
        matmul(kernel, &q, w, &mut out, &|| {});
        out
    }

    /// Relative RMS error of `got` against the float product of `x` and `wf` plus `bias`.
    fn relative_error(got: &[f32], x: &[f32], wf: &[f32], bias: &[f32], k: usize) -> f64 {
        let n = bias.len();
        let (mut squared, mut exact_squared) = (0.0f64, 0.0f64);
        for (r, row) in x.chunks_exact(k).enumerate() {
            for (c, w) in wf.chunks_exact(k).enumerate() {
                let exact: f32 = row.iter().zip(w).map(|(a, b)| a * b).sum::<f32>() + bias[c];
                squared += ((got[r * n + c] - exact) as f64).powi(2);
                exact_squared += (exact as f64).powi(2);
            }
        }
        (squared / exact_squared).sqrt()
    }

    #[test]
    fn a_second_byte_of_the_inputs_takes_their_rounding_away() {
        let (m, n, k) = (19, 70, 384);
        let x = values(m * k, 7);
        let (wf, bias) = (values(n * k, 8), values(n, 9));
        let w = PackedWeights::smoothed(&wf, n, k, &bias, &vec![1.0; k], true, true);
        let one = relative_error(
            &product_with(Kernel::detect(), &x, &w, k, false),
            &x,
            &wf,
            &bias,
            k,
        );
        let two = relative_error(
            &product_with(Kernel::detect(), &x, &w, k, true),
            &x,
            &wf,
            &bias,
            k,
        );
        // Both weights and inputs to about sixteen bits: what is left is far below one
        // byte's rounding.
        assert!(two < one / 10.0, "one byte {one}, two bytes {two}");
        let fast = product_with(Kernel::detect(), &x, &w, k, true);
        let slow = product_with(Kernel::Portable, &x, &w, k, true);
        for (f, s) in fast.iter().zip(&slow) {
            assert!((f - s).abs() <= 1e-5 * s.abs().max(1.0), "{f} vs {s}");
        }
        // The buffers are reused: one byte again after two is one byte's product.
        let mut q = QuantRows::default();
        quantize_rows(&x, k, w.smoothing(), &mut q, true);
        quantize_rows(&x, k, w.smoothing(), &mut q, false);
        let mut again = vec![0.0; m * n];
        matmul(Kernel::detect(), &q, &w, &mut again, &|| {});
        assert_eq!(again, product_with(Kernel::detect(), &x, &w, k, false));
    }

    #[test]
    fn the_fast_kernel_sums_the_same_integers_as_the_portable_one() {
        // Odd sizes on purpose: k not a multiple of 4, n not of the panel, rows not of
        // the tile.
        for (m, n, k) in [(1, 32, 4), (13, 70, 37), (67, 96, 384), (9, 1536, 96)] {
            let x = values(m * k, 1);
            let w = PackedWeights::quantize(&values(n * k, 2), n, k, &values(n, 3));
            let fast = product(Kernel::detect(), &x, &w, k);
            let slow = product(Kernel::Portable, &x, &w, k);
            assert_eq!(fast.len(), m * n);
            for (i, (f, s)) in fast.iter().zip(&slow).enumerate() {
                assert!(
                    (f - s).abs() <= 1e-5 * s.abs().max(1.0),
                    "{m}×{n}×{k} [{i}]: {f} vs {s}"
                );
            }
        }
        if Kernel::detect() == Kernel::Portable {
            eprintln!("this CPU has no AVX-512 VNNI: only the portable kernel was run");
        }
    }

    #[test]
    fn an_int8_product_is_close_to_the_float_one() {
        let (m, n, k) = (16, 64, 384);
        let x = values(m * k, 4);
        let wf = values(n * k, 5);
        let bias = values(n, 6);
        let w = PackedWeights::quantize(&wf, n, k, &bias);
        let got = product(Kernel::detect(), &x, &w, k);
        let (mut squared, mut exact_squared) = (0.0f64, 0.0f64);
        for r in 0..m {
            for c in 0..n {
                let exact: f32 =
                    (0..k).map(|i| x[r * k + i] * wf[c * k + i]).sum::<f32>() + bias[c];
                let err = got[r * n + c] - exact;
                // Two 8-bit roundings over 384 terms of size ≤ 1: an error of about 0.035
                // (one standard deviation) on sums of about 6.
                assert!(err.abs() < 0.2, "[{r},{c}]: {} vs {exact}", got[r * n + c]);
                squared += (err as f64).powi(2);
                exact_squared += (exact as f64).powi(2);
            }
        }
        let relative = (squared / exact_squared).sqrt();
        assert!(relative < 0.01, "relative RMS error {relative}");
    }

    #[test]
    fn exp_and_erf_match_libm() {
        for i in -2000..=2000 {
            let x = i as f32 / 100.0;
            let (e, want) = (exp(x), x.exp());
            assert!(
                (e - want).abs() <= 4e-7 * want,
                "exp({x}) = {e}, libm {want}"
            );
            let (f, want) = (erf(x / 4.0), libm_erf(x / 4.0));
            assert!(
                (f - want).abs() <= 5e-7,
                "erf({}) = {f}, libm {want}",
                x / 4.0
            );
        }
    }

    fn libm_erf(x: f32) -> f32 {
        libm::erf(x as f64) as f32
    }

    #[test]
    fn softmax_sums_to_one_and_keeps_order() {
        let mut x = vec![3.0, -1.0, 0.5, 80.0, 79.0];
        softmax(&mut x);
        assert!((x.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(x[3] > x[4] && x[4] > x[0] && x[0] > x[2] && x[2] > x[1]);
    }
}
