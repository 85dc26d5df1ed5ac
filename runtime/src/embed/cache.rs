//! A bounded cache of vectors by text in front of a slow embedder, so a text already
//! embedded is not embedded again: agents repeat themselves (status lines, tool outputs,
//! the same question asked twice), and a neural model or a paid provider costs
//! milliseconds or money per text. Exact text, exact vector: a hit returns the vector the
//! embedder returned the first time, bit for bit, so caching never changes an answer.
//! Least recently used entries go first; texts repeated within one call are embedded once.
//!
//! In memory only: a restart starts cold. The store keeps every record's vector, so a
//! record is never re-embedded anyway; what repeats is new records with old texts, and
//! those repeat while they are recent.

use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use lru::LruCache;

use super::Embedder;
use crate::error::Result;

/// How often the cache answered, since the embedder was built.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Texts answered from the cache.
    pub hits: u64,
    /// Texts the embedder had to embed.
    pub misses: u64,
}

impl CacheStats {
    /// Hits over lookups (0 before any).
    pub fn hit_rate(&self) -> f64 {
        match self.hits + self.misses {
            0 => 0.0,
            n => self.hits as f64 / n as f64,
        }
    }
}

/// An embedder with a cache in front (see the module docs).
pub struct CachedEmbedder {
    inner: Arc<dyn Embedder>,
    entries: Mutex<LruCache<Box<str>, Arc<[f32]>>>,
    hits: AtomicU64,
    misses: AtomicU64,
}

impl std::fmt::Debug for CachedEmbedder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachedEmbedder")
            .field("inner", &self.inner)
            .field("capacity", &self.lock().cap())
            .finish_non_exhaustive()
    }
}

/// Which of a call's texts to embed, and where each answer comes from.
enum Slot {
    Cached(Arc<[f32]>),
    /// Index into the texts sent to the embedder.
    Embedded(usize),
}

impl CachedEmbedder {
    /// `inner` behind a cache of at most `capacity` texts.
    pub fn new(inner: Arc<dyn Embedder>, capacity: NonZeroUsize) -> CachedEmbedder {
        CachedEmbedder {
            inner,
            entries: Mutex::new(LruCache::new(capacity)),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LruCache<Box<str>, Arc<[f32]>>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    async fn run(&self, texts: &[String], background: bool) -> Result<Vec<Vec<f32>>> {
        let mut missing: Vec<String> = Vec::new();
        let slots: Vec<Slot> = {
            let mut entries = self.lock();
            let mut first_of: std::collections::HashMap<&str, usize> = Default::default();
            texts
                .iter()
                .map(|t| match entries.get(t.as_str()) {
                    Some(v) => Slot::Cached(v.clone()),
                    None => Slot::Embedded(*first_of.entry(t.as_str()).or_insert_with(|| {
                        missing.push(t.clone());
                        missing.len() - 1
                    })),
                })
                .collect()
        };
        let sent = missing.len() as u64;
        self.misses.fetch_add(sent, Ordering::Relaxed);
        self.hits
            .fetch_add(texts.len() as u64 - sent, Ordering::Relaxed);
        let embedded: Vec<Arc<[f32]>> = match missing.is_empty() {
            true => Vec::new(),
            false => {
                let vectors = match background {
                    true => self.inner.embed_background(&missing).await?,
                    false => self.inner.embed(&missing).await?,
                };
                let vectors: Vec<Arc<[f32]>> = vectors.into_iter().map(Arc::from).collect();
                let mut entries = self.lock();
                for (text, v) in missing.into_iter().zip(&vectors) {
                    entries.put(text.into_boxed_str(), v.clone());
                }
                vectors
            }
        };
        slots
            .into_iter()
            .map(|slot| match slot {
                Slot::Cached(v) => Ok(v.to_vec()),
                Slot::Embedded(i) => embedded.get(i).map(|v| v.to_vec()).ok_or_else(|| {
                    crate::error::Error::internal(
                        "embedding",
                        format!(
                            "the embedder returned {} vectors for more texts",
                            embedded.len()
                        ),
                    )
                }),
            })
            .collect()
    }
}

#[async_trait::async_trait]
impl Embedder for CachedEmbedder {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn dimensions(&self) -> usize {
        self.inner.dimensions()
    }
    fn embeds_inline(&self) -> bool {
        self.inner.embeds_inline()
    }
    fn is_semantic(&self) -> bool {
        self.inner.is_semantic()
    }
    fn texts_per_call(&self) -> usize {
        self.inner.texts_per_call()
    }
    fn cache_stats(&self) -> Option<CacheStats> {
        Some(CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
        })
    }
    async fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>> {
        self.run(texts, false).await
    }
    async fn embed_background(&self, texts: &[String]) -> Result<Vec<Vec<f32>>> {
        self.run(texts, true).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::embed::HashEmbedder;

    /// Counts the texts it is asked to embed.
    #[derive(Debug)]
    struct Counting {
        inner: HashEmbedder,
        texts: AtomicU64,
    }

    #[async_trait::async_trait]
    impl Embedder for Counting {
        fn name(&self) -> &str {
            "counting"
        }
        fn dimensions(&self) -> usize {
            self.inner.dimensions()
        }
        async fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>> {
            self.texts.fetch_add(texts.len() as u64, Ordering::Relaxed);
            self.inner.embed(texts).await
        }
    }

    #[tokio::test]
    async fn a_text_is_embedded_once_and_answered_the_same_after() {
        let counting = Arc::new(Counting {
            inner: HashEmbedder::new(64).unwrap(),
            texts: AtomicU64::new(0),
        });
        let cached = CachedEmbedder::new(counting.clone(), NonZeroUsize::new(2).unwrap());
        let t = |s: &str| s.to_string();
        let first = cached
            .embed(&[t("status: ok"), t("disk full"), t("status: ok")])
            .await
            .unwrap();
        assert_eq!(first[0], first[2]);
        assert_eq!(
            counting.texts.load(Ordering::Relaxed),
            2,
            "a repeat within a call"
        );
        let again = cached
            .embed_background(&[t("disk full"), t("status: ok")])
            .await
            .unwrap();
        assert_eq!(again, vec![first[1].clone(), first[0].clone()]);
        assert_eq!(
            counting.texts.load(Ordering::Relaxed),
            2,
            "both answered from the cache"
        );
        assert_eq!(
            cached.cache_stats(),
            Some(CacheStats { hits: 3, misses: 2 })
        );
        // Capacity 2: a third text evicts the least recently used ("disk full" was used
        // before "status: ok").
        cached.embed(&[t("new text")]).await.unwrap();
        cached.embed(&[t("disk full")]).await.unwrap();
        assert_eq!(counting.texts.load(Ordering::Relaxed), 4);
        cached.embed(&[t("new text")]).await.unwrap();
        assert_eq!(counting.texts.load(Ordering::Relaxed), 4);
    }
}
