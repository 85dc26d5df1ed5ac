//! The products every scoring of the index is made of: float with float, and the query
//! with a vector held at half precision (F16C where the CPU has it), each summed in the
//! same lanes so that every copy of a vector scores the same.

use super::*;

/// Elements a half-precision vector is widened at a time to be multiplied.
pub(super) const WIDEN: usize = 64;

/// Independent sums a dot product is split into, so the compiler can vectorise it without
/// reassociating floats.
pub(super) const LANES: usize = 8;

/// [`dot`] of `query` and `halves × scale`: the same products summed in the same lanes and
/// order, so the same bits as the dot of the widened vector. On a CPU with F16C (x86-64
/// since 2013) the halves are widened eight at a time in registers: widening them into a
/// buffer first would take about 40 % of a session search's time.
#[inline]
pub(super) fn dot_half(query: &[f32], halves: &[half::f16], scale: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("f16c") && std::arch::is_x86_feature_detected!("avx") {
        // SAFETY: the CPU has the features the function is compiled for (checked above).
        return unsafe { dot_half_f16c(query, halves, scale) };
    }
    dot_half_widened(query, halves, scale)
}

/// [`dot_half`] on any CPU: the lanes of [`dot`], fed a widened block at a time.
pub(super) fn dot_half_widened(query: &[f32], halves: &[half::f16], scale: f32) -> f32 {
    let mut lanes = [0f32; LANES];
    let mut widened = [0f32; WIDEN];
    let (mut left, mut left_q, mut left_v) = (0, [0f32; LANES], [0f32; LANES]);
    for (h, q) in halves.chunks(WIDEN).zip(query.chunks(WIDEN)) {
        let w = &mut widened[..h.len()];
        codec::from_halves(h, scale, w);
        let (qc, wc) = (q.chunks_exact(LANES), w.chunks_exact(LANES));
        let (qr, wr) = (qc.remainder(), wc.remainder());
        for (x, y) in qc.zip(wc) {
            for i in 0..LANES {
                lanes[i] += x[i] * y[i];
            }
        }
        // Only the last block can leave a remainder (WIDEN is a multiple of LANES).
        left = qr.len().min(wr.len());
        left_q[..left].copy_from_slice(&qr[..left]);
        left_v[..left].copy_from_slice(&wr[..left]);
    }
    let mut d: f32 = lanes.iter().sum();
    for (x, y) in left_q[..left].iter().zip(&left_v[..left]) {
        d += x * y;
    }
    d
}

/// [`dot_half`] with F16C: one register of eight lanes, each lane `+= q × (h × scale)` with
/// separate multiplies and adds (never fused), as [`dot`] computes them.
///
/// # Safety
/// The CPU must have AVX and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,f16c")]
pub(super) unsafe fn dot_half_f16c(query: &[f32], halves: &[half::f16], scale: f32) -> f32 {
    use std::arch::x86_64::{
        __m128i, _mm_loadu_si128, _mm256_add_ps, _mm256_cvtph_ps, _mm256_loadu_ps, _mm256_mul_ps,
        _mm256_set1_ps, _mm256_setzero_ps, _mm256_storeu_ps,
    };
    const _: () = assert!(LANES == 8, "one 256-bit register holds the lanes");
    let n = query.len().min(halves.len());
    let whole = n - n % LANES;
    let scale8 = _mm256_set1_ps(scale);
    let mut acc = _mm256_setzero_ps();
    for i in (0..whole).step_by(LANES) {
        // SAFETY: i + 8 <= n, so both reads are within their slices; the loads are
        // unaligned, and f16 is two plain bytes.
        let (h, q) = unsafe {
            (
                _mm_loadu_si128(halves.as_ptr().add(i).cast::<__m128i>()),
                _mm256_loadu_ps(query.as_ptr().add(i)),
            )
        };
        let w = _mm256_mul_ps(_mm256_cvtph_ps(h), scale8);
        acc = _mm256_add_ps(acc, _mm256_mul_ps(q, w));
    }
    let mut lanes = [0f32; LANES];
    // SAFETY: `lanes` has room for the eight floats written.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), acc) };
    let mut d: f32 = lanes.iter().sum();
    for (x, h) in query[whole..n].iter().zip(&halves[whole..n]) {
        d += x * (h.to_f32() * scale);
    }
    d
}

/// Dot product of `a` and `b`, summed exactly as [`dot_and_norm2`] sums it (the same
/// bits), for vectors whose norm is known already.
#[inline]
pub(super) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut dot = [0f32; LANES];
    let (ac, bc) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let (ar, br) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        for i in 0..LANES {
            dot[i] += x[i] * y[i];
        }
    }
    let mut d: f32 = dot.iter().sum();
    for (x, y) in ar.iter().zip(br) {
        d += x * y;
    }
    d
}

/// Dot product of `a` and `b` and the squared norm of `b`, in eight independent lanes so
/// the compiler can vectorise without reassociating floats.
#[inline]
pub(super) fn dot_and_norm2(a: &[f32], b: &[f32]) -> (f32, f32) {
    let mut dot = [0f32; LANES];
    let mut norm = [0f32; LANES];
    let (ac, bc) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let (ar, br) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        for i in 0..LANES {
            dot[i] += x[i] * y[i];
            norm[i] += y[i] * y[i];
        }
    }
    let mut d: f32 = dot.iter().sum();
    let mut n: f32 = norm.iter().sum();
    for (x, y) in ar.iter().zip(br) {
        d += x * y;
        n += y * y;
    }
    (d, n)
}
