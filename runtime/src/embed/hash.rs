//! The default embedder: deterministic feature hashing, in-process, no model and no network.
//!
//! A text becomes a bag of features — its analyzed terms (`index::text`, the same terms the
//! keyword index uses), pairs of consecutive terms, and character trigrams of each word with
//! boundary markers (`<ru`, `run`, …, `ng>`), which make it tolerant of inflection and typos.
//! Each feature is hashed with FNV-1a 64 (written here, so vectors are identical on every
//! machine, build and run) into a bucket and a sign, weighted by kind and by sublinear term
//! frequency, and the vector is unit-normalised.
//!
//! This module must never use a seeded or per-process hash (std `RandomState`) and never read
//! anything but the text: stored embeddings are compared with query embeddings made much later,
//! and any change to the feature scheme requires `shadowbrain reindex`.

use crate::error::{Error, Result};
use crate::index::text;

use super::Embedder;

/// Weight of an analyzed term: the main signal.
const UNIGRAM_WEIGHT: f32 = 1.0;
/// Weight of two consecutive terms: word order and phrases, weaker than the words themselves.
const BIGRAM_WEIGHT: f32 = 0.6;
/// Weight of one character trigram; a word has several, so together they carry about as
/// much as the word's unigram.
const CHAR_NGRAM_WEIGHT: f32 = 0.3;
/// Weight of a trigram of the raw text, used only when analysis leaves no term at all.
const FALLBACK_WEIGHT: f32 = 1.0;

/// Feature kinds, hashed in front of the feature so equal strings of different kinds land in
/// different buckets.
const KIND_UNIGRAM: u8 = b'u';
const KIND_BIGRAM: u8 = b'b';
const KIND_CHAR: u8 = b'c';
const KIND_FALLBACK: u8 = b'f';
const KIND_EMPTY: u8 = b'e';

/// Batches with more text than this are embedded on the blocking pool, so a bulk import never
/// stalls the async workers for more than about a millisecond.
const INLINE_BATCH_BYTES: usize = 64 * 1024;

/// FNV-1a, 64-bit (offset basis and prime from the FNV specification).
#[derive(Clone, Copy)]
struct Fnv1a(u64);

impl Fnv1a {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;

    fn new() -> Self {
        Fnv1a(Self::OFFSET)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(Self::PRIME);
        }
    }

    fn write_char(&mut self, c: char) {
        let mut buf = [0u8; 4];
        self.write(c.encode_utf8(&mut buf).as_bytes());
    }

    /// FNV's low bits mix poorly for short keys; MurmurHash3's 64-bit finaliser spreads every
    /// input bit over the bucket index and the sign bit.
    fn finish(self) -> u64 {
        let mut h = self.0;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        h ^ (h >> 33)
    }
}

/// Deterministic feature-hashing embedder (`hash`, docs/configuration.md).
#[derive(Debug, Clone)]
pub struct HashEmbedder {
    dimensions: usize,
}

impl HashEmbedder {
    /// The dimension used when none is configured.
    pub const DEFAULT_DIMENSIONS: usize = 384;
    /// Largest accepted dimension; far past the point where more buckets stop helping.
    pub const MAX_DIMENSIONS: usize = 65_536;

    /// An embedder producing `dimensions`-dimensional vectors.
    ///
    /// Fails if `dimensions` is 0 or over [`Self::MAX_DIMENSIONS`].
    pub fn new(dimensions: usize) -> Result<Self> {
        if dimensions == 0 || dimensions > Self::MAX_DIMENSIONS {
            return Err(Error::invalid(
                "embedder.dimensions",
                format!(
                    "the hash embedder cannot make {dimensions}-dimensional vectors; use 1..={}, \
                     typically {} (the default)",
                    Self::MAX_DIMENSIONS,
                    Self::DEFAULT_DIMENSIONS
                ),
            ));
        }
        Ok(HashEmbedder { dimensions })
    }

    /// The unit vector of one text. Never fails and never returns a zero vector: text with no
    /// terms (empty, punctuation, only stop words) falls back to its raw characters.
    pub fn embed_one(&self, text: &str) -> Vec<f32> {
        let mut features = collect_features(text);
        let mut v = vec![0.0f32; self.dimensions];
        // Sorting makes accumulation order (and so every float rounding) independent of the
        // order features were produced in, and groups repeats for the tf weighting. Equal
        // hashes have equal weights (the kind is part of the hash), so the key is enough.
        features.sort_unstable_by_key(|f| f.0);
        let mut i = 0;
        while i < features.len() {
            let (hash, weight) = features[i];
            let mut j = i + 1;
            while j < features.len() && features[j].0 == hash {
                j += 1;
            }
            let tf = (j - i) as f32;
            let w = weight * (1.0 + tf.ln());
            let bucket = ((hash & 0x7fff_ffff_ffff_ffff) % self.dimensions as u64) as usize;
            if hash >> 63 == 0 {
                v[bucket] += w;
            } else {
                v[bucket] -= w;
            }
            i = j;
        }
        normalise_or_basis(&mut v, &features);
        v
    }
}

impl Default for HashEmbedder {
    fn default() -> Self {
        HashEmbedder {
            dimensions: Self::DEFAULT_DIMENSIONS,
        }
    }
}

#[async_trait::async_trait]
impl Embedder for HashEmbedder {
    fn name(&self) -> &str {
        "hash"
    }

    fn dimensions(&self) -> usize {
        self.dimensions
    }

    fn embeds_inline(&self) -> bool {
        true
    }

    fn is_semantic(&self) -> bool {
        false
    }

    async fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>> {
        let bytes: usize = texts.iter().map(String::len).sum();
        let Some(handle) = tokio::runtime::Handle::try_current()
            .ok()
            .filter(|_| bytes > INLINE_BATCH_BYTES)
        else {
            return Ok(texts.iter().map(|t| self.embed_one(t)).collect());
        };
        // A large batch is a client waiting on its acknowledgement: split it over the
        // cores, so the write is not held up by one core's embedding while the others
        // idle (each text's vector is its own, so the split changes no vector).
        let parts = std::thread::available_parallelism()
            .map_or(1, usize::from)
            .min(bytes.div_ceil(INLINE_BATCH_BYTES / 2))
            .max(1);
        let per = texts.len().div_ceil(parts).max(1);
        let tasks: Vec<_> = texts
            .chunks(per)
            .map(|chunk| {
                let this = self.clone();
                let owned = chunk.to_vec();
                handle.spawn_blocking(move || {
                    owned.iter().map(|t| this.embed_one(t)).collect::<Vec<_>>()
                })
            })
            .collect();
        let mut out = Vec::with_capacity(texts.len());
        for task in tasks {
            out.extend(
                task.await
                    .map_err(|e| Error::internal("the hash embedder's task", e))?,
            );
        }
        Ok(out)
    }
}

/// (hash, weight) of every feature occurrence in `text`.
fn collect_features(text: &str) -> Vec<(u64, f32)> {
    let mut features: Vec<(u64, f32)> = Vec::with_capacity(text.len());
    let mut prev_term: Option<u64> = None;
    let mut word: Vec<char> = Vec::with_capacity(32);

    text::for_each_token(text, |token| {
        let term_hash = hash_feature(KIND_UNIGRAM, &[token.text.as_bytes()]);
        features.push((term_hash, UNIGRAM_WEIGHT));

        // The bigram hashes the two terms' own hashes, so it needs no string concatenation.
        if let Some(prev) = prev_term {
            let pair = (u128::from(prev) << 64 | u128::from(term_hash)).to_le_bytes();
            features.push((hash_feature(KIND_BIGRAM, &[&pair]), BIGRAM_WEIGHT));
        }
        prev_term = Some(term_hash);

        // Trigrams of the surface word, not the stem: the stemmer already unifies regular
        // inflections, the trigrams add what it cannot (`databse`/`database`,
        // `runner`/`running`). CJK terms are character bigrams already.
        let surface = &text[token.offset_from..token.offset_to];
        if surface.chars().next().is_some_and(text::is_cjk) {
            return;
        }
        word.clear();
        word.push('<');
        if surface.is_ascii() {
            // The same characters, without Unicode's case tables.
            word.extend(surface.bytes().map(|b| char::from(b.to_ascii_lowercase())));
        } else {
            word.extend(surface.chars().flat_map(char::to_lowercase));
        }
        word.push('>');
        push_char_ngrams(&word, KIND_CHAR, CHAR_NGRAM_WEIGHT, &mut features);
    });

    if features.is_empty() {
        // Nothing survived analysis ("the of and", "!!!", emoji): the raw characters are all
        // there is, and they still tell two such texts apart.
        word.clear();
        word.push('<');
        let mut last_space = true;
        for c in text.trim().chars().flat_map(char::to_lowercase) {
            let space = c.is_whitespace();
            if !(space && last_space) {
                word.push(if space { ' ' } else { c });
            }
            last_space = space;
        }
        word.push('>');
        if word.len() > 2 {
            push_char_ngrams(&word, KIND_FALLBACK, FALLBACK_WEIGHT, &mut features);
        } else {
            features.push((hash_feature(KIND_EMPTY, &[]), FALLBACK_WEIGHT));
        }
    }
    features
}

/// Pushes every character trigram of `chars` (or the whole of it when shorter than three).
fn push_char_ngrams(chars: &[char], kind: u8, weight: f32, out: &mut Vec<(u64, f32)>) {
    let hash = |gram: &[char]| {
        let mut h = Fnv1a::new();
        h.write(&[kind]);
        for &c in gram {
            h.write_char(c);
        }
        h.finish()
    };
    if chars.len() < 3 {
        out.push((hash(chars), weight));
        return;
    }
    for gram in chars.windows(3) {
        out.push((hash(gram), weight));
    }
}

fn hash_feature(kind: u8, parts: &[&[u8]]) -> u64 {
    let mut h = Fnv1a::new();
    h.write(&[kind]);
    for part in parts {
        h.write(part);
    }
    h.finish()
}

/// Scales `v` to unit length. If every feature cancelled out (possible in principle: opposite
/// signs in one bucket), the vector becomes a basis vector chosen by the features, so the
/// result is still a deterministic, valid unit vector.
fn normalise_or_basis(v: &mut [f32], features: &[(u64, f32)]) {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > f32::MIN_POSITIVE && norm.is_finite() {
        for x in v.iter_mut() {
            *x /= norm;
        }
        return;
    }
    let seed = features.iter().fold(Fnv1a::new(), |mut h, (f, _)| {
        h.write(&f.to_le_bytes());
        h
    });
    v.iter_mut().for_each(|x| *x = 0.0);
    let i = (seed.finish() % v.len() as u64) as usize;
    v[i] = 1.0;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The FNV-1a digest of `vectors_are_bit_for_bit_the_pinned_ones`'s vectors.
    const PINNED_DIGEST: u64 = 0x8a6f_2b0a_6c21_aac5;

    fn cos(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| x * y).sum()
    }

    fn norm(v: &[f32]) -> f32 {
        v.iter().map(|x| x * x).sum::<f32>().sqrt()
    }

    #[test]
    fn fnv1a_matches_the_reference_vectors() {
        // From the FNV reference test suite (fnv1a64 of "", "a", "foobar").
        let raw = |s: &str| {
            let mut h = Fnv1a::new();
            h.write(s.as_bytes());
            h.0
        };
        assert_eq!(raw(""), 0xcbf29ce484222325);
        assert_eq!(raw("a"), 0xaf63dc4c8601ec8c);
        assert_eq!(raw("foobar"), 0x85944171f73967e8);
    }

    /// Every bit of many texts' vectors, pinned: the vectors of the scheme as first
    /// released (features sorted by hash), so no rewrite of the arithmetic changes a stored
    /// embedding. Small dimensions pile many features into one bucket, where the order of
    /// the additions shows; the words mix ASCII, case that widens when lowered (`İ`), CJK,
    /// stop words only, punctuation only and over-long words.
    #[test]
    fn vectors_are_bit_for_bit_the_pinned_ones() {
        const WORDS: &[&str] = &[
            "Deploy",
            "database",
            "DataBase",
            "the",
            "of",
            "and",
            "Straße",
            "ÉCOLE",
            "İstanbul",
            "ΣΊΣΥΦΟΣ",
            "東京タワー",
            "数据库连接",
            "🙂",
            "!!!",
            "runner's",
            "x",
            "supercalifragilisticexpialidocious-and-then-some-more-characters-beyond-limits",
            "42",
            "v1.2.3",
            "naïve",
            "co-operate",
            "ÅNGSTRÖM",
            "ﬁle",
            "données",
        ];
        let mut next = shadowbrain_test_support::stats::fixed_sequence(11);
        let mut digest = Fnv1a::new();
        for dims in [384, 64, 7, 1] {
            let e = HashEmbedder::new(dims).unwrap();
            for _ in 0..400 {
                let n = next() % 30;
                let text: Vec<&str> = (0..n).map(|_| WORDS[next() % WORDS.len()]).collect();
                for x in e.embed_one(&text.join(" ")) {
                    digest.write(&x.to_bits().to_le_bytes());
                }
            }
        }
        assert_eq!(digest.0, PINNED_DIGEST, "{:#x}", digest.0);
    }

    #[test]
    fn deterministic_and_pinned() {
        let e = HashEmbedder::default();
        let a = e.embed_one("The deployment failed: database connection timed out.");
        let b = HashEmbedder::new(384)
            .unwrap()
            .embed_one("The deployment failed: database connection timed out.");
        assert_eq!(a, b);
        // Pinned: if this changes, every stored hash embedding is stale (needs a reindex).
        let v = e.embed_one("hello world");
        let top: Vec<(usize, bool)> = top_components(&v, 3);
        assert_eq!(top, PINNED_HELLO_WORLD, "hash embedding scheme changed");
        assert!(
            (v[58] - 0.553_849).abs() < 1e-5,
            "hash embedding weights changed: {}",
            v[58]
        );
    }

    /// The three largest-magnitude components of `hello world`: (index, positive).
    const PINNED_HELLO_WORLD: [(usize, bool); 3] = [(58, true), (204, false), (285, true)];

    fn top_components(v: &[f32], n: usize) -> Vec<(usize, bool)> {
        let mut idx: Vec<usize> = (0..v.len()).collect();
        idx.sort_by(|&a, &b| v[b].abs().total_cmp(&v[a].abs()).then(a.cmp(&b)));
        idx.into_iter().take(n).map(|i| (i, v[i] > 0.0)).collect()
    }

    #[test]
    fn unit_norm_and_dimension() {
        for dims in [1, 7, 64, 384, 1024] {
            let e = HashEmbedder::new(dims).unwrap();
            assert_eq!(e.dimensions(), dims);
            for text in [
                "hello",
                "我们今天去北京",
                "a much longer text about retries, backoff and jitter in HTTP clients",
                "",
                "the of and",
                "🙂🙂",
            ] {
                let v = e.embed_one(text);
                assert_eq!(v.len(), dims);
                assert!(v.iter().all(|x| x.is_finite()), "{text:?}");
                assert!((norm(&v) - 1.0).abs() < 1e-5, "{text:?} in {dims}d");
            }
        }
        assert!(matches!(HashEmbedder::new(0), Err(Error::Invalid { .. })));
        assert!(HashEmbedder::new(HashEmbedder::MAX_DIMENSIONS + 1).is_err());
    }

    #[test]
    fn similar_texts_are_closer_than_unrelated_ones() {
        let e = HashEmbedder::default();
        let q = e.embed_one("the database connection timed out during deployment");
        let near = e.embed_one("deployment failed because database connections time out");
        let far = e.embed_one("she baked a chocolate cake for her grandmother's birthday");
        assert!(cos(&q, &near) > 0.3, "{}", cos(&q, &near));
        assert!(cos(&q, &near) > cos(&q, &far) + 0.2);

        // Typos and inflections still land close, thanks to character trigrams.
        let typo = e.embed_one("databse conection timeout");
        let other = e.embed_one("grocery list: apples, bread, milk");
        let clean = e.embed_one("database connection timeout");
        assert!(cos(&clean, &typo) > 0.35, "{}", cos(&clean, &typo));
        assert!(cos(&clean, &typo) > cos(&clean, &other) + 0.25);
    }

    #[test]
    fn cjk_texts_sharing_words_are_closer() {
        let e = HashEmbedder::default();
        let a = e.embed_one("我们明天去北京开会");
        let b = e.embed_one("北京的会议明天开始");
        let c = e.embed_one("这只猫喜欢吃鱼");
        assert!(
            cos(&a, &b) > cos(&a, &c) + 0.15,
            "{} vs {}",
            cos(&a, &b),
            cos(&a, &c)
        );

        let ja1 = e.embed_one("東京でRustを書く");
        let ja2 = e.embed_one("東京のRustの勉強会");
        let ja3 = e.embed_one("猫が魚を食べる");
        assert!(cos(&ja1, &ja2) > cos(&ja1, &ja3) + 0.15);
    }

    #[test]
    fn empty_ish_input_gives_valid_distinct_vectors() {
        let e = HashEmbedder::default();
        let empty = e.embed_one("");
        assert_eq!(empty, e.embed_one("   \n\t"));
        let stops = e.embed_one("the of and");
        let other_stops = e.embed_one("is it was");
        let bang = e.embed_one("!!!");
        for v in [&empty, &stops, &other_stops, &bang] {
            assert!((norm(v) - 1.0).abs() < 1e-5);
        }
        assert_ne!(stops, other_stops);
        assert_ne!(stops, empty);
        assert_ne!(bang, empty);
        // Stop-word-only texts still match themselves better than each other.
        assert!(cos(&stops, &e.embed_one("the  of and")) > cos(&stops, &other_stops));
    }

    #[test]
    fn word_order_matters_a_little() {
        let e = HashEmbedder::default();
        let a = e.embed_one("dog bites man");
        let b = e.embed_one("man bites dog");
        let c = cos(&a, &b);
        assert!(c > 0.6 && c < 0.999, "{c}");
    }

    #[tokio::test]
    async fn trait_batch_matches_single_and_large_batches_work() {
        let e = HashEmbedder::default();
        let texts: Vec<String> = (0..50)
            .map(|i| format!("memory number {i} about topic {}", i % 7))
            .collect();
        let got = e.embed(&texts).await.unwrap();
        assert_eq!(got.len(), texts.len());
        for (t, v) in texts.iter().zip(&got) {
            assert_eq!(v, &e.embed_one(t));
        }
        // Over the inline threshold: goes through the blocking pool, same answers.
        let big: Vec<String> = (0..40)
            .map(|i| format!("{i} {}", "lorem ipsum dolor ".repeat(120)))
            .collect();
        let got = e.embed(&big).await.unwrap();
        assert_eq!(got[39], e.embed_one(&big[39]));
        assert!(e.embed(&[]).await.unwrap().is_empty());
        assert_eq!(e.name(), "hash");
    }

    #[test]
    fn speed_report() {
        let e = HashEmbedder::default();
        let texts: Vec<String> = (0..2000)
            .map(|i| {
                format!(
                    "Agent {i} observed that the deployment of service billing-{} failed because \
                     the database connection pool was exhausted after the nightly batch job \
                     started; retrying with backoff resolved it",
                    i % 13
                )
            })
            .collect();
        let start = std::time::Instant::now();
        let mut sink = 0.0f32;
        for t in &texts {
            sink += e.embed_one(t)[0];
        }
        let per = start.elapsed().as_secs_f64() * 1e6 / texts.len() as f64;
        println!(
            "hash embedder: {per:.1} µs per ~25-word text ({} dims, {} build){}",
            e.dimensions(),
            if cfg!(debug_assertions) {
                "debug"
            } else {
                "release"
            },
            if sink.is_nan() { "!" } else { "" }
        );
    }
}
