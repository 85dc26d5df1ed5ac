//! The derived indexes recall searches: vectors (arroy on LMDB, with an in-memory tail) in
//! [`vector`], BM25 keywords (tantivy, with a tail of its own) in [`keyword`], and the text
//! analysis both the keyword index and the hash embedder tokenise with in [`text`]; how a
//! long text is cut into passages, each embedded and searched, in [`passage`]. Every
//! index here is derived data: the store keeps everything they hold, so each can be
//! cleared and rebuilt from it at any time; none may ever be the only copy of anything.
//! The one cosine similarity every layer compares vectors with lives here too.

pub(crate) mod keyword;
pub(crate) mod passage;
pub(crate) mod text;
pub(crate) mod vector;

pub use keyword::{CorpusStats, KeywordIndex, QueryStats, ScopeCounts, TermCounts};
pub use vector::{BuildStats, VectorIndex, VectorOptions, VectorSource};

/// Cosine similarity of two vectors (0 when either is all zero). Recall's exact
/// similarity, the condenser's centrality and the judge's reuse all compare with this one.
pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    // Eight independent lanes, so the compiler vectorises without reassociating floats
    // (one accumulator each would make this a chain of dependent scalar adds).
    const LANES: usize = 8;
    let (mut dot, mut na, mut nb) = ([0f32; LANES], [0f32; LANES], [0f32; LANES]);
    let (ac, bc) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let (ar, br) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        for i in 0..LANES {
            dot[i] += x[i] * y[i];
            na[i] += x[i] * x[i];
            nb[i] += y[i] * y[i];
        }
    }
    let (mut d, mut n1, mut n2): (f32, f32, f32) =
        (dot.iter().sum(), na.iter().sum(), nb.iter().sum());
    for (x, y) in ar.iter().zip(br) {
        d += x * y;
        n1 += x * x;
        n2 += y * y;
    }
    cosine_of(d, n1.sqrt(), n2.sqrt())
}

/// The cosine of a dot product and two norms: the one formula, also the last step of the
/// vector index's search, which computes dot products in lanes and keeps norms ahead of
/// time. Within -1..=1 whatever the rounding; 0 for a (near-)zero vector.
pub(crate) fn cosine_of(dot: f32, norm_a: f32, norm_b: f32) -> f32 {
    let denom = norm_a * norm_b;
    if denom > f32::EPSILON {
        (dot / denom).clamp(-1.0, 1.0)
    } else {
        0.0
    }
}
