//! The one percentile every example's figures are read with, so that a p99 from one tool
//! compares with a p99 from another, and with the same tool's earlier runs; and the one
//! fixed pseudo-random sequence their workloads and pinned tests draw from.

use std::cmp::Ordering;

/// The `q` quantile (`0 ≤ q ≤ 1`) of `sorted`, which is in ascending order: the sample at
/// index `round(q × (n − 1))`, halves rounded up. Always a measured sample, never an
/// interpolation between two; with 1,000 samples p50 is the 501st, p99 the 990th and p99.9
/// the 999th. `None` when there are no samples: each caller says what it prints then.
pub fn percentile<T: Copy + PartialOrd>(sorted: &[T], q: f64) -> Option<T> {
    debug_assert!((0.0..=1.0).contains(&q), "a quantile is within 0..=1: {q}");
    // No sample below the one before it; a NaN compares with nothing and passes.
    debug_assert!(
        sorted.is_sorted_by(|a, b| b.partial_cmp(a) != Some(Ordering::Less)),
        "percentile of unsorted samples"
    );
    let last = sorted.len().checked_sub(1)?;
    let i = (last as f64 * q).round() as usize;
    Some(sorted[i.min(last)])
}

/// Numbers in `0..2^31` from `seed`, the same on every machine, build and version (Knuth's
/// MMIX linear congruential step, its top bits): workloads that every run writes alike, and
/// tests whose pinned figures a library's new random generator must not move.
pub fn fixed_sequence(mut seed: u64) -> impl FnMut() -> usize {
    move || {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (seed >> 33) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::percentile;

    #[test]
    fn picks_the_sample_at_the_rounded_rank() {
        let v: Vec<f64> = (1..=1000).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.5), Some(501.0));
        assert_eq!(percentile(&v, 0.99), Some(990.0));
        assert_eq!(percentile(&v, 0.999), Some(999.0));
        assert_eq!(percentile(&v, 0.0), Some(1.0));
        assert_eq!(percentile(&v, 1.0), Some(1000.0));
        // An even count's median is the upper of the middle two, as `v[n / 2]`.
        assert_eq!(percentile(&[1.0, 2.0, 3.0, 4.0], 0.5), Some(3.0));
        assert_eq!(percentile(&[7.0], 0.99), Some(7.0));
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "unsorted")]
    fn refuses_unsorted_samples() {
        percentile(&[2.0, 1.0], 0.5);
    }

    #[test]
    fn says_none_of_no_samples() {
        assert_eq!(percentile::<f64>(&[], 0.5), None);
    }
}
