//! Passages: how a long text is cut into overlapping pieces that are embedded and searched
//! one by one, so a detail deep inside a long tool output or model answer is found by its
//! own words and not lost in one vector for the whole text (a MiniLM-class model reads its
//! first ~256 tokens and ignores the rest).
//!
//! The record stays whole and durable as sent; passages are derived from its text by
//! [`split`], a pure function of the text, and are byte ranges into it. Their embeddings
//! are kept by the store beside the record's own (for a long text, the normalised mean of
//! its passages'), and recall scores a long record by its best passage and shows that
//! passage first.

use std::ops::Range;

/// Characters per passage: about 120–150 word pieces of English prose. A MiniLM-class
/// model reads 256 but was trained on pairs of at most 128, and one vector for a longer
/// span blurs a detail among its neighbours (a sentence's cosine to a paraphrase of it,
/// 0.47, fell to 0.15 inside a 1,000-character passage of unrelated prose).
pub const PASSAGE_CHARS: usize = 600;

/// Characters each passage repeats from the end of the one before, so a sentence on a
/// boundary is whole in at least one of them.
pub const OVERLAP_CHARS: usize = 150;

/// Texts up to this many characters are one passage: splitting a text barely over
/// [`PASSAGE_CHARS`] would make a second passage that is mostly overlap.
pub const SPLIT_FROM_CHARS: usize = PASSAGE_CHARS + PASSAGE_CHARS / 5;

/// Whether `text` is long enough to be split (cheap: looks at the byte length first).
pub fn is_long(text: &str) -> bool {
    text.len() > SPLIT_FROM_CHARS && text.chars().count() > SPLIT_FROM_CHARS
}

/// The passages of `text` as byte ranges, in order, each on character boundaries, covering
/// the whole text: one range `0..len` for a text that is not [`is_long`]. A passage ends
/// after a sentence or line where one falls in its last fifth, else after a word, else
/// anywhere (a text without spaces); the next starts [`OVERLAP_CHARS`] before that end, at
/// a word's start when there is one nearby.
pub fn split(text: &str) -> Vec<Range<usize>> {
    if !is_long(text) {
        return std::iter::once(0..text.len()).collect();
    }
    // Byte offset of every character, and the text's end.
    let bounds: Vec<usize> = text
        .char_indices()
        .map(|(i, _)| i)
        .chain(std::iter::once(text.len()))
        .collect();
    let chars = bounds.len() - 1;
    let bytes = text.as_bytes();
    let char_at = |c: usize| bytes[bounds[c]];
    let mut out = Vec::new();
    let mut start = 0usize;
    loop {
        if chars - start <= SPLIT_FROM_CHARS {
            out.push(bounds[start]..text.len());
            return out;
        }
        let limit = start + PASSAGE_CHARS;
        let floor = limit - PASSAGE_CHARS / 5;
        // The end, in characters (exclusive): after a sentence or line end, else after a word.
        let after = |pred: &dyn Fn(usize) -> bool| (floor..limit).rev().find(|&c| pred(c));
        let end = after(&|c| {
            let b = char_at(c);
            b == b'\n'
                || (matches!(b, b' ' | b'\t')
                    && c > 0
                    && matches!(char_at(c - 1), b'.' | b'!' | b'?' | b';' | b':'))
        })
        .or_else(|| after(&|c| char_at(c).is_ascii_whitespace()))
        .map_or(limit, |c| c + 1);
        out.push(bounds[start]..bounds[end]);
        // The next passage starts OVERLAP_CHARS back, moved forward to a sentence's start
        // or else a word's when one is near.
        let back = end - OVERLAP_CHARS;
        let near = back..(back + OVERLAP_CHARS / 2).min(end);
        let word_start = |c: usize| {
            c > 0 && char_at(c - 1).is_ascii_whitespace() && !char_at(c).is_ascii_whitespace()
        };
        let sentence_start = |c: usize| {
            word_start(c)
                && (char_at(c - 1) == b'\n'
                    || (c > 1 && matches!(char_at(c - 2), b'.' | b'!' | b'?' | b';' | b':')))
        };
        let next = near
            .clone()
            .find(|&c| sentence_start(c))
            .or_else(|| near.clone().find(|&c| word_start(c)))
            .unwrap_or(back);
        start = next.max(start + 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prose(sentences: usize) -> String {
        (0..sentences)
            .map(|i| format!("Sentence number {i} says something about topic {}.", i % 7))
            .collect::<Vec<_>>()
            .join(" ")
    }

    #[test]
    fn a_short_text_is_one_passage() {
        assert_eq!(split(""), vec![0..0]);
        assert_eq!(split("hello world"), vec![0..11]);
        let t = "x".repeat(SPLIT_FROM_CHARS);
        assert_eq!(split(&t), vec![0..t.len()]);
    }

    #[test]
    fn passages_cover_the_text_overlap_and_stay_in_size() {
        let t = prose(400);
        let p = split(&t);
        assert!(p.len() > 10, "{} passages", p.len());
        assert_eq!(p[0].start, 0);
        assert_eq!(p.last().unwrap().end, t.len());
        for w in p.windows(2) {
            assert!(w[1].start < w[0].end, "consecutive passages overlap");
            assert!(w[1].start > w[0].start, "and move forward");
        }
        for r in &p {
            let n = t[r.clone()].chars().count();
            assert!(n <= SPLIT_FROM_CHARS, "{n} chars");
        }
        for r in &p[..p.len() - 1] {
            // Cut after a sentence: every passage but the last ends in ". " or "."
            assert!(
                t[r.clone()].trim_end().ends_with('.'),
                "{:?}",
                &t[r.clone()]
            );
        }
        for r in &p[1..] {
            assert!(t[..r.start].ends_with(". "), "starts at a sentence");
        }
    }

    #[test]
    fn text_without_spaces_or_ascii_splits_on_char_boundaries() {
        let t = "記憶".repeat(2_000);
        let p = split(&t);
        assert!(p.len() > 3);
        for r in &p {
            assert!(t.is_char_boundary(r.start) && t.is_char_boundary(r.end));
        }
        assert_eq!(p.last().unwrap().end, t.len());
        let t = "a".repeat(10_000);
        let p = split(&t);
        assert_eq!(p[0], 0..PASSAGE_CHARS);
        assert_eq!(p[1].start, PASSAGE_CHARS - OVERLAP_CHARS);
    }
}
