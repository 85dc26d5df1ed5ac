//! Embedders: the trait and its implementations (STUB: being written).

use crate::error::Result;

/// Turns texts into vectors of a fixed dimension.
#[async_trait::async_trait]
pub trait Embedder: Send + Sync + std::fmt::Debug {
    /// Short name recorded in the store (`hash`, `openai:nomic-embed-text`).
    fn name(&self) -> &str;
    /// Dimension of every vector it returns.
    fn dimensions(&self) -> usize;
    /// One vector per text, in order, unit-normalised.
    async fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>>;
}
