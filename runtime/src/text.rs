//! Text analysis shared by the keyword index and the hash embedder (STUB: being written).

use tantivy::tokenizer::{LowerCaser, SimpleTokenizer, TextAnalyzer, TokenStream};

/// The analyzer registered with the keyword index under [`ANALYZER_NAME`].
pub fn analyzer() -> TextAnalyzer {
    TextAnalyzer::builder(SimpleTokenizer::default())
        .filter(LowerCaser)
        .build()
}

/// Name under which [`analyzer`] is registered in tantivy.
pub const ANALYZER_NAME: &str = "shadowbrain";

/// Index terms of `text`, exactly as the keyword index sees them.
pub fn analyze(text: &str) -> Vec<String> {
    let mut a = analyzer();
    let mut stream = a.token_stream(text);
    let mut out = Vec::new();
    while stream.advance() {
        out.push(stream.token().text.clone());
    }
    out
}

/// A rough token count for budget trimming.
pub fn estimate_tokens(text: &str) -> usize {
    text.len().div_ceil(4)
}
