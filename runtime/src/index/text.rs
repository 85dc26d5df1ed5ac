//! Text analysis: the one pipeline that turns text into terms, shared by the keyword index
//! (registered in tantivy under [`ANALYZER_NAME`]) and the hash embedder, so a word means the
//! same thing to BM25 and to vector search. Also the token estimate used for prompt budgets.
//!
//! The pipeline is [`CjkAwareTokenizer`] (words for Latin and other spaced scripts, overlapping
//! character bigrams for Chinese, Japanese and Korean) → ASCII folding → over-long term removal
//! → English stop words → English stemming.
//!
//! This module must never hold state between calls that changes a result or depend on
//! anything but the text: index terms written today have to match query terms computed next
//! year. Changing the pipeline changes every stored keyword term and every hash embedding, so
//! it requires a reindex. (The one state it keeps, [`MemoStemmer`]'s memo of recent stems,
//! only spares recomputing what the stemmer would answer again.)

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::LazyLock;

use tantivy::tokenizer::{
    AsciiFoldingFilter, LowerCaser, RemoveLongFilter, StopWordFilter, TextAnalyzer, Token,
    TokenFilter, TokenStream, Tokenizer,
};

/// Version of what [`analyzer`] produces and of how texts become keyword documents. Bump it
/// with any change to tokenisation, stop words, stemming or passages: the substrate then
/// rebuilds the keyword index from the store on open, since terms indexed the old way
/// would no longer match queries. 2: a long text is one document per passage.
pub const ANALYZER_VERSION: u32 = 2;

/// Name under which [`analyzer`] is registered in tantivy.
pub const ANALYZER_NAME: &str = "shadowbrain";

/// Terms of this many bytes or more are dropped: they are base64 blobs or minified data, which
/// no query will ever repeat, and tantivy rejects terms over 64 KiB outright. 100 bytes keeps
/// every real identifier (a SHA-256 in hex is 64).
pub const MAX_TERM_BYTES: usize = 100;

/// English stop words: the classic NLTK / Snowball list, plus the fragments that
/// contractions leave behind once apostrophes split words (`don't` → `don`, `t`).
pub const ENGLISH_STOP_WORDS: &[&str] = &[
    "a",
    "about",
    "above",
    "after",
    "again",
    "against",
    "ain",
    "all",
    "am",
    "an",
    "and",
    "any",
    "are",
    "aren",
    "as",
    "at",
    "be",
    "because",
    "been",
    "before",
    "being",
    "below",
    "between",
    "both",
    "but",
    "by",
    "can",
    "couldn",
    "d",
    "did",
    "didn",
    "do",
    "does",
    "doesn",
    "doing",
    "don",
    "down",
    "during",
    "each",
    "few",
    "for",
    "from",
    "further",
    "had",
    "hadn",
    "has",
    "hasn",
    "have",
    "haven",
    "having",
    "he",
    "her",
    "here",
    "hers",
    "herself",
    "him",
    "himself",
    "his",
    "how",
    "i",
    "if",
    "in",
    "into",
    "is",
    "isn",
    "it",
    "its",
    "itself",
    "just",
    "ll",
    "m",
    "me",
    "mightn",
    "more",
    "most",
    "mustn",
    "my",
    "myself",
    "needn",
    "no",
    "nor",
    "not",
    "now",
    "o",
    "of",
    "off",
    "on",
    "once",
    "only",
    "or",
    "other",
    "our",
    "ours",
    "ourselves",
    "out",
    "over",
    "own",
    "re",
    "s",
    "same",
    "shan",
    "she",
    "should",
    "shouldn",
    "so",
    "some",
    "such",
    "t",
    "than",
    "that",
    "the",
    "their",
    "theirs",
    "them",
    "themselves",
    "then",
    "there",
    "these",
    "they",
    "this",
    "those",
    "through",
    "to",
    "too",
    "under",
    "until",
    "up",
    "ve",
    "very",
    "was",
    "wasn",
    "we",
    "were",
    "weren",
    "what",
    "when",
    "where",
    "which",
    "while",
    "who",
    "whom",
    "why",
    "will",
    "with",
    "wouldn",
    "y",
    "you",
    "your",
    "yours",
    "yourself",
    "yourselves",
];

/// Built once: the stop-word set is a few hundred allocations, and [`TextAnalyzer`] clones
/// share it through an `Arc`.
static ANALYZER: LazyLock<TextAnalyzer> = LazyLock::new(|| {
    TextAnalyzer::builder(CjkAwareTokenizer::default())
        .filter(AsciiFoldingFilter)
        // Folding can yield capitals from caseless letters (mathematical 𝖸 folds to `Y`),
        // so lower-case once more after it.
        .filter(LowerCaser)
        .filter(RemoveLongFilter::limit(MAX_TERM_BYTES))
        .filter(StopWordFilter::remove(
            ENGLISH_STOP_WORDS.iter().map(|w| (*w).to_owned()),
        ))
        .filter(MemoStemmer)
        .build()
});

/// How many words each thread's stem memo holds before it starts afresh: the common
/// vocabulary of a workload (Zipf's law: a few thousand words are most of any text) in
/// about half a megabyte per thread.
const STEM_MEMO_WORDS: usize = 8192;

/// English stemming (Snowball's, as tantivy's `Stemmer` does it) with a per-thread memo of
/// recent words. Every text is analysed more than once as it is written (the hash embedder,
/// the keyword index's in-memory tail, tantivy), and stemming was the largest single cost
/// of ingest with the hash embedder; most words repeat, so most stems are looked up.
#[derive(Clone, Copy, Debug)]
pub struct MemoStemmer;

/// [`MemoStemmer`] over a tokenizer.
#[derive(Clone)]
pub struct MemoStemmerFilter<T> {
    inner: T,
}

/// [`MemoStemmer`]'s token stream.
pub struct MemoStemmerStream<T> {
    tail: T,
}

/// One thread's stemmer and its memo.
struct Stems {
    stemmer: frostem::Stemmer,
    memo: HashMap<String, String>,
}

thread_local! {
    static STEMS: RefCell<Stems> = RefCell::new(Stems {
        stemmer: frostem::Stemmer::new(frostem::Algorithm::English),
        memo: HashMap::new(),
    });
}

impl Stems {
    /// Replaces `word` with its stem.
    fn stem(&mut self, word: &mut String) {
        if let Some(stem) = self.memo.get(word.as_str()) {
            word.clear();
            word.push_str(stem);
            return;
        }
        let stem = self.stemmer.stem(word).into_owned();
        if self.memo.len() >= STEM_MEMO_WORDS {
            self.memo.clear();
        }
        let surface = std::mem::replace(word, stem.clone());
        self.memo.insert(surface, stem);
    }
}

impl TokenFilter for MemoStemmer {
    type Tokenizer<T: Tokenizer> = MemoStemmerFilter<T>;

    fn transform<T: Tokenizer>(self, inner: T) -> MemoStemmerFilter<T> {
        MemoStemmerFilter { inner }
    }
}

impl<T: Tokenizer> Tokenizer for MemoStemmerFilter<T> {
    type TokenStream<'a> = MemoStemmerStream<T::TokenStream<'a>>;

    fn token_stream<'a>(&'a mut self, text: &'a str) -> Self::TokenStream<'a> {
        MemoStemmerStream {
            tail: self.inner.token_stream(text),
        }
    }
}

impl<T: TokenStream> TokenStream for MemoStemmerStream<T> {
    fn advance(&mut self) -> bool {
        if !self.tail.advance() {
            return false;
        }
        let token = self.tail.token_mut();
        STEMS.with(|stems| match stems.try_borrow_mut() {
            Ok(mut stems) => stems.stem(&mut token.text),
            // Unreachable unless a stemmer re-enters this one; stem without the memo.
            Err(_) => {
                let stemmer = frostem::Stemmer::new(frostem::Algorithm::English);
                token.text = stemmer.stem(&token.text).into_owned();
            }
        });
        true
    }

    fn token(&self) -> &Token {
        self.tail.token()
    }

    fn token_mut(&mut self) -> &mut Token {
        self.tail.token_mut()
    }
}

thread_local! {
    /// A per-thread analyzer, so [`analyze`] on the ingest path neither clones nor locks.
    static LOCAL_ANALYZER: RefCell<TextAnalyzer> = RefCell::new(ANALYZER.clone());
}

/// The analyzer registered with the keyword index under [`ANALYZER_NAME`].
pub fn analyzer() -> TextAnalyzer {
    ANALYZER.clone()
}

/// Index terms of `text`, in order, exactly as the keyword index sees them.
pub fn analyze(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for_each_token(text, |token| out.push(token.text.clone()));
    out
}

/// Runs the analyzer over `text` and hands every resulting token (term, position, byte offsets
/// into `text`) to `sink`, without collecting them.
pub fn for_each_token(text: &str, mut sink: impl FnMut(&Token)) {
    LOCAL_ANALYZER.with(|cell| match cell.try_borrow_mut() {
        Ok(mut analyzer) => analyzer.token_stream(text).process(&mut sink),
        // Only reachable if `sink` itself analyzes text; a fresh clone keeps that correct.
        Err(_) => ANALYZER.clone().token_stream(text).process(&mut sink),
    });
}

/// A token estimate for prompt budgets, close to what BPE tokenizers (cl100k, Llama) count:
/// about 1.3 tokens per Latin word (long words and identifiers cost more), one per CJK
/// character, about one per two characters of other scripts, and half a token per
/// punctuation mark. Never 0 for text that has any visible character.
pub fn estimate_tokens(text: &str) -> usize {
    let mut tenths: usize = 0;
    let mut word_chars: usize = 0;
    let mut word_non_ascii = false;

    // Tenths of a token, so the sum is exact integer arithmetic.
    let word_cost = |chars: usize, non_ascii: bool| -> usize {
        if chars == 0 {
            0
        } else if non_ascii {
            // Cyrillic, Greek, Arabic, Devanagari … split into ~2-character pieces.
            chars.div_ceil(2) * 10
        } else {
            // Common words are one token; what is past ~8 characters costs about 1 per 4.
            13 + chars.saturating_sub(8) * 10 / 4
        }
    };

    for c in text.chars() {
        if c.is_alphanumeric() && !is_cjk(c) {
            word_chars += 1;
            word_non_ascii |= !c.is_ascii();
            continue;
        }
        tenths += word_cost(word_chars, word_non_ascii);
        word_chars = 0;
        word_non_ascii = false;
        if is_cjk(c) {
            tenths += 10;
        } else if !c.is_whitespace() && !c.is_control() {
            tenths += 5;
        }
    }
    tenths += word_cost(word_chars, word_non_ascii);
    tenths.div_ceil(10)
}

/// Whether `c` belongs to a script written without spaces between words, which the tokenizer
/// turns into character bigrams: Han (Chinese characters, kanji, hanja), Hiragana, Katakana
/// and Hangul. Callers also require `c.is_alphanumeric()`.
pub fn is_cjk(c: char) -> bool {
    matches!(c as u32,
        // Han: CJK unified ideographs and extensions A–H, compatibility ideographs,
        // the iteration mark 々, the ideographic zero 〇 and the Hangzhou numerals.
        0x3005 | 0x3007 | 0x3021..=0x3029
        | 0x3400..=0x4DBF | 0x4E00..=0x9FFF | 0xF900..=0xFAFF
        | 0x20000..=0x2FA1F | 0x30000..=0x323AF
        // Hiragana, Katakana (incl. ー), phonetic extensions, half-width Katakana, kana supplements.
        | 0x3040..=0x309F | 0x30A0..=0x30FF | 0x31F0..=0x31FF | 0xFF66..=0xFF9F
        | 0x1B000..=0x1B16F
        // Hangul jamo, compatibility jamo, extended jamo, syllables, half-width jamo.
        | 0x1100..=0x11FF | 0x3130..=0x318F | 0xA960..=0xA97F | 0xAC00..=0xD7FF
        | 0xFFA0..=0xFFDC)
}

/// Splits on everything that is not a letter or digit. Runs of CJK characters become
/// overlapping character bigrams (`北京大学` → `北京`, `京大`, `大学`; a lone character stays a
/// unigram), because those scripts do not mark word boundaries and bigrams are the
/// dictionary-free standard for indexing them. Everything else becomes one lower-cased word.
///
/// Offsets are byte offsets into the original text; every token, bigram or word, takes the
/// next position.
#[derive(Clone, Default)]
pub struct CjkAwareTokenizer {
    token: Token,
    /// Byte boundaries of the CJK run being turned into bigrams (reused between calls).
    run: Vec<usize>,
}

/// The [`TokenStream`] of [`CjkAwareTokenizer`].
pub struct CjkAwareTokenStream<'a> {
    text: &'a str,
    /// Byte offset where scanning resumes once the current CJK run is exhausted.
    cursor: usize,
    token: &'a mut Token,
    run: &'a mut Vec<usize>,
    /// Index into `run` of the next n-gram's first character.
    run_next: usize,
}

impl Tokenizer for CjkAwareTokenizer {
    type TokenStream<'a> = CjkAwareTokenStream<'a>;

    fn token_stream<'a>(&'a mut self, text: &'a str) -> CjkAwareTokenStream<'a> {
        self.token.reset();
        self.run.clear();
        CjkAwareTokenStream {
            text,
            cursor: 0,
            token: &mut self.token,
            run: &mut self.run,
            run_next: 0,
        }
    }
}

impl CjkAwareTokenStream<'_> {
    /// Emits the next bigram (or the unigram of a one-character run) of the pending CJK run.
    fn next_from_run(&mut self) -> bool {
        let chars = self.run.len().saturating_sub(1);
        let (from, to) = match chars {
            0 => return false,
            1 if self.run_next == 0 => (self.run[0], self.run[1]),
            n if n >= 2 && self.run_next + 2 <= n => {
                (self.run[self.run_next], self.run[self.run_next + 2])
            }
            _ => return false,
        };
        self.run_next += 1;
        self.emit(from, to);
        self.token.text.push_str(&self.text[from..to]);
        true
    }

    fn emit(&mut self, from: usize, to: usize) {
        self.token.position = self.token.position.wrapping_add(1);
        self.token.offset_from = from;
        self.token.offset_to = to;
        self.token.text.clear();
    }
}

impl TokenStream for CjkAwareTokenStream<'_> {
    fn advance(&mut self) -> bool {
        if self.next_from_run() {
            return true;
        }
        self.run.clear();
        self.run_next = 0;

        let rest = &self.text[self.cursor..];
        let Some((start_rel, first)) = rest.char_indices().find(|(_, c)| c.is_alphanumeric())
        else {
            self.cursor = self.text.len();
            return false;
        };
        let start = self.cursor + start_rel;

        if is_cjk(first) {
            let mut end = self.text.len();
            for (i, c) in self.text[start..].char_indices() {
                if !(c.is_alphanumeric() && is_cjk(c)) {
                    end = start + i;
                    break;
                }
                self.run.push(start + i);
            }
            self.run.push(end);
            self.cursor = end;
            return self.next_from_run();
        }

        let mut end = self.text.len();
        for (i, c) in self.text[start..].char_indices() {
            if !c.is_alphanumeric() || is_cjk(c) {
                end = start + i;
                break;
            }
        }
        self.cursor = end;
        self.emit(start, end);
        for c in self.text[start..end].chars() {
            if c.is_ascii() {
                self.token.text.push(c.to_ascii_lowercase());
            } else {
                self.token.text.extend(c.to_lowercase());
            }
        }
        true
    }

    fn token(&self) -> &Token {
        self.token
    }

    fn token_mut(&mut self) -> &mut Token {
        self.token
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (term, position, original slice) of every token the full analyzer emits.
    fn tokens(text: &str) -> Vec<(String, usize, String)> {
        let mut out = Vec::new();
        for_each_token(text, |t| {
            out.push((
                t.text.clone(),
                t.position,
                text[t.offset_from..t.offset_to].to_owned(),
            ))
        });
        out
    }

    fn terms(text: &str) -> Vec<String> {
        analyze(text)
    }

    #[test]
    fn english_punctuation_and_stop_words() {
        assert_eq!(
            terms("The deployment FAILED, again: it couldn't reach the database!"),
            ["deploy", "fail", "reach", "databas"]
        );
        assert_eq!(terms("this is the one that I was"), ["one"]);
        assert!(terms("the of and, to! is?").is_empty());
        assert!(terms("").is_empty());
        assert!(terms("  \n\t ... --- !!! ").is_empty());
    }

    #[test]
    fn the_memo_stems_as_the_stemmer_does() {
        // More distinct words than the memo holds, twice over, so it fills, starts afresh
        // and answers from the memo as well as from the stemmer.
        let stemmer = frostem::Stemmer::new(frostem::Algorithm::English);
        let words: Vec<String> = (0..STEM_MEMO_WORDS * 2 + 10)
            .map(|i| {
                format!("running{}ings", char::from(b'a' + (i % 26) as u8)).repeat(1 + i / 26 % 3)
                    + &i.to_string()
            })
            .chain(["running", "databases", "flies", "agreed", "caresses"].map(String::from))
            .collect();
        for _ in 0..2 {
            for w in &words {
                let mut memo = w.clone();
                STEMS.with(|s| s.borrow_mut().stem(&mut memo));
                assert_eq!(memo, stemmer.stem(w), "{w}");
            }
        }
        assert_eq!(terms("running databases"), ["run", "databas"]);
    }

    #[test]
    fn stemming_merges_inflections() {
        assert_eq!(terms("running runs run"), ["run", "run", "run"]);
        assert_eq!(terms("Connections connected connecting"), ["connect"; 3]);
        // Irregular forms are out of a suffix stemmer's reach; it must not invent a match.
        assert_eq!(terms("ran"), ["ran"]);
    }

    #[test]
    fn chinese_becomes_overlapping_bigrams() {
        assert_eq!(
            terms("我们今天去北京"),
            ["我们", "们今", "今天", "天去", "去北", "北京"]
        );
        // A lone character is a unigram; punctuation (full-width too) splits runs.
        assert_eq!(terms("好。北京，上海"), ["好", "北京", "上海"]);
    }

    #[test]
    fn japanese_mixed_with_latin() {
        assert_eq!(
            terms("東京でRustを書く"),
            ["東京", "京で", "rust", "を書", "書く"]
        );
        assert_eq!(
            terms("データベース"),
            ["デー", "ータ", "タベ", "ベー", "ース"]
        );
    }

    #[test]
    fn korean_is_bigrammed_per_word() {
        assert_eq!(terms("서울 날씨"), ["서울", "날씨"]);
        assert_eq!(
            terms("데이터베이스"),
            ["데이", "이터", "터베", "베이", "이스"]
        );
    }

    #[test]
    fn numbers_and_identifiers_are_kept() {
        assert_eq!(
            terms("Order 12345 failed with code E42 for id abc-123 on v2.0.1"),
            [
                "order", "12345", "fail", "code", "e42", "id", "abc", "123", "v2", "0", "1"
            ]
        );
        let sha = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
        assert_eq!(terms(&format!("hash {sha}")), ["hash", sha]);
    }

    #[test]
    fn folding_and_full_width_letters() {
        assert_eq!(terms("Café naïve"), ["cafe", "naiv"]);
        // Full-width Latin (common in CJK input) matches its ASCII spelling.
        assert_eq!(terms("Ｒｕｓｔ"), terms("rust"));
    }

    #[test]
    fn overlong_tokens_are_dropped() {
        let blob = "A".repeat(MAX_TERM_BYTES + 5);
        assert_eq!(terms(&format!("image {blob} attached")), ["imag", "attach"]);
    }

    #[test]
    fn positions_and_offsets_point_into_the_original_text() {
        let text = "The Runner ran: 東京でRust!";
        let got = tokens(text);
        let expect = [
            ("runner", 1, "Runner"),
            ("ran", 2, "ran"),
            ("東京", 3, "東京"),
            ("京で", 4, "京で"),
            ("rust", 5, "Rust"),
        ];
        assert_eq!(got.len(), expect.len(), "{got:?}");
        for ((term, pos, slice), (e_term, e_pos, e_slice)) in got.iter().zip(expect) {
            assert_eq!(
                (term.as_str(), *pos, slice.as_str()),
                (e_term, e_pos, e_slice)
            );
        }
    }

    #[test]
    fn raw_tokenizer_offsets_cover_multibyte_text() {
        let text = "é東京x";
        let mut tok = CjkAwareTokenizer::default();
        let mut stream = tok.token_stream(text);
        let mut seen = Vec::new();
        while stream.advance() {
            let t = stream.token();
            seen.push((t.text.clone(), t.offset_from, t.offset_to, t.position));
        }
        assert_eq!(
            seen,
            [
                ("é".to_owned(), 0, 2, 0),
                ("東京".to_owned(), 2, 8, 1),
                ("x".to_owned(), 8, 9, 2),
            ]
        );
    }

    #[test]
    fn analyzer_is_reusable_and_registered_name_is_stable() {
        let mut a = analyzer();
        let mut first = Vec::new();
        a.token_stream("running fast")
            .process(&mut |t| first.push(t.text.clone()));
        let mut second = Vec::new();
        a.token_stream("running fast")
            .process(&mut |t| second.push(t.text.clone()));
        assert_eq!(first, ["run", "fast"]);
        assert_eq!(first, second);
        assert_eq!(ANALYZER_NAME, "shadowbrain");
    }

    /// The analyzer inside a real tantivy index: documents and queries meet on the same terms,
    /// including CJK text and inflected English, and phrase positions survive stop words.
    #[test]
    fn works_inside_a_tantivy_index() {
        use tantivy::collector::TopDocs;
        use tantivy::query::QueryParser;
        use tantivy::schema::{IndexRecordOption, STORED, Schema, TextFieldIndexing, TextOptions};
        use tantivy::{Index, TantivyDocument, doc};

        let dir = tempfile::TempDir::new().unwrap();
        let mut schema = Schema::builder();
        let indexing = TextFieldIndexing::default()
            .set_tokenizer(ANALYZER_NAME)
            .set_index_option(IndexRecordOption::WithFreqsAndPositions);
        let body = schema.add_text_field(
            "body",
            TextOptions::default().set_indexing_options(indexing),
        );
        let id = schema.add_u64_field("id", STORED);
        let index = Index::create_in_dir(dir.path(), schema.build()).unwrap();
        index.tokenizers().register(ANALYZER_NAME, analyzer());

        let mut writer = index.writer_with_num_threads(1, 15_000_000).unwrap();
        let docs = [
            (1u64, "我们今天去北京开会"),
            (
                2,
                "The deployment failed because the database connection timed out",
            ),
            (3, "東京でRustを書く"),
            (4, "上海的天气很好"),
        ];
        for (n, text) in docs {
            writer.add_document(doc!(id => n, body => text)).unwrap();
        }
        writer.commit().unwrap();

        let searcher = index.reader().unwrap().searcher();
        let parser = QueryParser::for_index(&index, vec![body]);
        let hits = |q: &str| -> Vec<u64> {
            let query = parser.parse_query(q).unwrap();
            searcher
                .search(&query, &TopDocs::with_limit(10).order_by_score())
                .unwrap()
                .into_iter()
                .map(|(_, addr)| {
                    let d: TantivyDocument = searcher.doc(addr).unwrap();
                    d.get_first(id)
                        .and_then(|v| tantivy::schema::Value::as_u64(&v))
                        .unwrap()
                })
                .collect()
        };
        assert_eq!(hits("北京"), [1]);
        assert_eq!(hits("database connections failing"), [2]);
        assert_eq!(hits("rust"), [3]);
        assert_eq!(hits("天气"), [4]);
        // "failed because the database": `because` and `the` are stop words, yet the phrase
        // matches, because removed words keep their positions.
        assert_eq!(hits("\"failed because the database\""), [2]);
    }

    #[test]
    fn folding_never_leaves_capitals() {
        // Some caseless letters fold to ASCII capitals (found by the property test below):
        // every term of every single letter or digit must come out lower-case.
        let bad: Vec<char> = (0..=0x2FFFFu32)
            .filter_map(char::from_u32)
            .filter(|c| c.is_alphanumeric() && !is_cjk(*c))
            .filter(|c| {
                analyze(&format!("{c}x"))
                    .iter()
                    .any(|t| t.to_lowercase() != *t)
            })
            .collect();
        assert!(bad.is_empty(), "{bad:?}");
    }

    proptest::proptest! {
        /// Any text, any script mix: no panic, offsets on char boundaries and in order,
        /// positions strictly increasing, every term non-empty and lower-case.
        #[test]
        fn arbitrary_text_tokenizes_sanely(text in "(\\PC|[東京北京でをデータ서울 ,.!'-]){0,80}") {
            let mut last_pos: Option<usize> = None;
            let mut last_from = 0;
            for_each_token(&text, |t| {
                assert!(text.is_char_boundary(t.offset_from) && text.is_char_boundary(t.offset_to));
                assert!(t.offset_from < t.offset_to && t.offset_from >= last_from);
                assert!(last_pos.is_none_or(|p| t.position > p));
                assert!(!t.text.is_empty());
                assert_eq!(t.text.to_lowercase(), t.text);
                last_pos = Some(t.position);
                last_from = t.offset_from;
            });
            let _ = estimate_tokens(&text);
        }
    }

    #[test]
    fn token_estimates() {
        assert_eq!(estimate_tokens(""), 0);
        assert_eq!(estimate_tokens("   \n"), 0);
        assert_eq!(estimate_tokens("hello"), 2);
        // 10 ordinary words ≈ 13 tokens.
        assert_eq!(
            estimate_tokens("the quick brown fox jumps over the lazy dog again"),
            13
        );
        // One per CJK character.
        assert_eq!(estimate_tokens("我们今天去北京"), 7);
        // Identifiers cost more than their word count.
        let id =
            estimate_tokens("9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08");
        assert!((14..=20).contains(&id), "{id}");
        // Monotone in length: budgets trimmed by this never grow when text is removed.
        let long = "error: connection refused, retrying in 5s. ".repeat(20);
        assert!(estimate_tokens(&long) > estimate_tokens(&long[..long.len() / 2]));
    }
}
