//! The pure half of recall: BM25 of a record read with its neighbours, the speaker and time
//! cues a query names, fusing the candidate paths, diversifying (MMR), trimming to a token
//! budget and rendering the context block. No I/O here — the substrate gathers the
//! candidates and records, this module decides their order and shape, so every rule is
//! table-tested without a store.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::clock::{self, Timestamp};
use crate::index::{QueryStats, TermCounts, cosine, text};
use crate::model::{MemoryId, MemoryRecord, Tier};

/// RRF's damping constant. Cormack et al. (2009) use 60, which only orders; here the fused
/// value is also the `relevance` the policy weighs against importance and recency, so it
/// must fall off visibly with rank: with 10, first place in both paths is 1, fifth ≈ 0.69,
/// tenth ≈ 0.52, first in one path only 0.5.
pub const RRF_K: f32 = 10.0;

/// Where recall looks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// The calling session only (default).
    #[default]
    Session,
    /// Every session of the calling agent.
    Agent,
    /// The whole namespace.
    Namespace,
}

/// How the candidate paths are fused into one relevance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FusionMethod {
    /// Reciprocal-rank fusion of the vector and keyword ranks.
    Rrf,
    /// Weighted sum of normalised scores (cosine, BM25 / best BM25).
    Weighted,
    /// Weighted sum of scores each put on 0..=1 per query by min-max over the candidates:
    /// a neural model's raw cosines bunch in a narrow band (MiniLM on LoCoMo: median ~0.2,
    /// best ~0.6) that BM25 / best BM25 does not share, so without it the weight says little
    /// about the share each path really has.
    Calibrated,
}

/// What each path said about one candidate.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Evidence {
    /// Rank (0 = best) and cosine similarity in the vector path.
    pub vector: Option<(usize, f32)>,
    /// Rank and BM25 score in the keyword path.
    pub keyword: Option<(usize, f32)>,
    /// Rank in the session's most-recent path.
    pub recent: Option<usize>,
    /// Exact cosine similarity with the query, when the record has an embedding.
    pub similarity: Option<f32>,
}

impl Evidence {
    /// The candidate's cosine with the query: the exact one, else the vector path's.
    fn cosine(&self) -> Option<f32> {
        self.similarity.or(self.vector.map(|(_, s)| s))
    }
}

/// Collects the evidence of every path per id.
#[derive(Debug, Default)]
pub struct Candidates {
    /// Evidence per id, in first-seen order.
    pub by_id: HashMap<MemoryId, Evidence>,
}

impl Candidates {
    /// Adds a ranked vector-path list (best first).
    pub fn add_vector(&mut self, hits: &[(u32, f32)]) {
        for (rank, (id, sim)) in hits.iter().enumerate() {
            let e = self.by_id.entry(MemoryId(*id)).or_default();
            if e.vector.is_none_or(|(r, _)| rank < r) {
                e.vector = Some((rank, *sim));
            }
        }
    }

    /// Adds a ranked keyword-path list (best first).
    pub fn add_keyword(&mut self, hits: &[(u32, f32)]) {
        for (rank, (id, score)) in hits.iter().enumerate() {
            let e = self.by_id.entry(MemoryId(*id)).or_default();
            if e.keyword.is_none_or(|(r, _)| rank < r) {
                e.keyword = Some((rank, *score));
            }
        }
    }

    /// Adds the session's most recent records (newest first).
    pub fn add_recent(&mut self, ids: &[MemoryId]) {
        for (rank, id) in ids.iter().enumerate() {
            self.by_id
                .entry(*id)
                .or_default()
                .recent
                .get_or_insert(rank);
        }
    }
}

/// Relevance in 0..=1 for every candidate.
///
/// RRF sums 1/(k + 1 + rank) over the vector and keyword paths (see [`RRF_K`]) and scales
/// the sum so first place in both paths is 1. Weighted fusion averages the cosine similarity (negative
/// counts as 0) and the BM25 score divided by the best BM25 score of this query. A
/// candidate found only through the recent path gets its exact similarity (weighted) or
/// nothing (RRF): recency, not relevance, is why it is there.
pub fn fuse(c: &Candidates, method: FusionMethod, vector_weight: f32) -> HashMap<MemoryId, f32> {
    let kw_weight = 1.0 - vector_weight;
    let rrf = |rank: Option<usize>| rank.map_or(0.0, |r| 1.0 / (RRF_K + 1.0 + r as f32));
    match method {
        FusionMethod::Rrf => c
            .by_id
            .iter()
            .map(|(id, e)| {
                let v = rrf(e.vector.map(|(r, _)| r));
                let k = rrf(e.keyword.map(|(r, _)| r));
                // First place in both paths sums to 1/(k+1): scale that to 1.
                (*id, (vector_weight * v + kw_weight * k) * (RRF_K + 1.0))
            })
            .collect(),
        FusionMethod::Calibrated => {
            let (mut lo_s, mut hi_s) = (f32::MAX, f32::MIN);
            let (mut lo_k, mut hi_k) = (f32::MAX, f32::MIN);
            for e in c.by_id.values() {
                if let Some(s) = e.cosine() {
                    (lo_s, hi_s) = (lo_s.min(s), hi_s.max(s));
                }
                if let Some((_, k)) = e.keyword {
                    (lo_k, hi_k) = (lo_k.min(k), hi_k.max(k));
                }
            }
            // One candidate, or all equal: each path's best is 1.
            let scale = |x: f32, lo: f32, hi: f32| {
                if hi > lo { (x - lo) / (hi - lo) } else { 1.0 }
            };
            c.by_id
                .iter()
                .map(|(id, e)| {
                    let sim = e.cosine().map_or(0.0, |s| scale(s, lo_s, hi_s));
                    let kw = e.keyword.map_or(0.0, |(_, k)| scale(k, lo_k, hi_k));
                    (*id, (vector_weight * sim + kw_weight * kw).clamp(0.0, 1.0))
                })
                .collect()
        }
        FusionMethod::Weighted => {
            let best_bm25 = c
                .by_id
                .values()
                .filter_map(|e| e.keyword.map(|(_, s)| s))
                .fold(0.0f32, f32::max);
            c.by_id
                .iter()
                .map(|(id, e)| {
                    let sim = e.cosine().unwrap_or(0.0);
                    let kw = match e.keyword {
                        Some((_, s)) if best_bm25 > 0.0 => s / best_bm25,
                        _ => 0.0,
                    };
                    (
                        *id,
                        (vector_weight * sim.max(0.0) + kw_weight * kw).clamp(0.0, 1.0),
                    )
                })
                .collect()
        }
    }
}

/// BM25's term-frequency saturation and length normalisation, tantivy's values.
const BM25_K1: f32 = 1.2;
const BM25_B: f32 = 0.75;

/// BM25 of a record read together with its neighbours: each query term's frequency is its
/// count in `own` plus `weight` × its count in each of `neighbours`, and the length is
/// counted the same way, against a mean length grown by the same share (`2 × window`
/// neighbours at `weight`). A conversation's answer often shares no word with the question
/// while the turn before it does ("What did you paint?" — "A sunset"); counting the
/// neighbours at a discount finds it without letting it outrank a turn that matches on its
/// own. Counts are in the order of `stats.terms` ([`TermCounts`]).
pub fn context_bm25(
    stats: &QueryStats,
    own: &TermCounts,
    neighbours: &[&TermCounts],
    weight: f32,
    window: u32,
) -> f32 {
    let mean = stats.mean_len * (1.0 + weight * 2.0 * window as f32);
    if mean <= 0.0 {
        return 0.0;
    }
    let len = own.len as f32 + weight * neighbours.iter().map(|n| n.len as f32).sum::<f32>();
    let norm = BM25_K1 * (1.0 - BM25_B + BM25_B * len / mean);
    let count = |c: &TermCounts, i: usize| c.tf.get(i).copied().unwrap_or(0) as f32;
    stats
        .terms
        .iter()
        .enumerate()
        .map(|(i, (_, idf))| {
            let tf = count(own, i) + weight * neighbours.iter().map(|n| count(n, i)).sum::<f32>();
            if tf == 0.0 {
                0.0
            } else {
                idf * tf * (BM25_K1 + 1.0) / (tf + norm)
            }
        })
        .sum()
}

/// The speaker of a transcript line, `Name: text` — one to three capitalised words before
/// a colon — as analysed terms; `None` for anything else (an error message's `Error: …`
/// counts too, harmlessly: a query naming "error" prefers errors).
pub fn speaker_terms(text: &str) -> Option<Vec<String>> {
    let (head, rest) = text.split_once(':')?;
    let head = head.trim();
    if head.is_empty() || head.len() > 40 || rest.starts_with("//") {
        return None;
    }
    let words: Vec<&str> = head.split_whitespace().collect();
    let name_like = |w: &&str| {
        w.chars().next().is_some_and(char::is_uppercase)
            && w.chars()
                .all(|c| c.is_alphanumeric() || matches!(c, '-' | '.' | '\''))
    };
    if words.len() > 3 || !words.iter().all(name_like) {
        return None;
    }
    let terms = text::analyze(head);
    (!terms.is_empty()).then_some(terms)
}

/// Whether the analysed `query` names every term of a speaker.
pub fn names_speaker(query: &[String], speaker: &[String]) -> bool {
    speaker.iter().all(|t| query.contains(t))
}

/// A time a query names: "on October 13, 2023", "in July 2023", "in June", "in 2022".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeCue {
    /// Event times in `[from, to)`.
    Span(Timestamp, Timestamp),
    /// A month (1–12) of any year.
    Month(u32),
}

impl TimeCue {
    /// Whether an event at `t` fits the cue. People mention an event in the days after it
    /// (the question says the day it happened, the memory is the talk about it), so a day
    /// reaches three days on and a month the first week of the next.
    pub fn fits(&self, t: Timestamp) -> bool {
        match *self {
            TimeCue::Span(from, to) => (from..to).contains(&t),
            TimeCue::Month(m) => {
                let Some(d) = chrono::DateTime::from_timestamp_millis(t) else {
                    return false;
                };
                use chrono::Datelike;
                d.month() == m || (d.month() == m % 12 + 1 && d.day() <= 7)
            }
        }
    }
}

/// English month names, lower case, January first (time cues here, dates in `updates`).
pub(crate) const MONTHS: [&str; 12] = [
    "january",
    "february",
    "march",
    "april",
    "may",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
];

/// The explicit times a query names, most specific kind only: full dates (`October 13,
/// 2023`, `13 October 2023`, `2023-10-13`), else months with or without a year (`July
/// 2023`, `in June`; a bare "may" is the verb unless "in" or "of" comes before it), else
/// years (`in 2022`). Relative phrases ("last year") are left alone: they are relative to
/// when the question was asked, which recall does not know.
pub fn time_cues(query: &str) -> Vec<TimeCue> {
    use std::sync::LazyLock;
    static DAY_MONTH_YEAR: LazyLock<regex::Regex> = LazyLock::new(|| {
        regex::Regex::new(&format!(
            r"(?i)\b(\d{{1,2}})(?:st|nd|rd|th)?\s+({m}),?\s+(\d{{4}})\b|\b({m})\s+(\d{{1,2}})(?:st|nd|rd|th)?,?\s+(\d{{4}})\b|\b(\d{{4}})-(\d{{2}})-(\d{{2}})\b",
            m = MONTHS.join("|")
        ))
        .expect("a valid date pattern")
    });
    static MONTH_YEAR: LazyLock<regex::Regex> = LazyLock::new(|| {
        regex::Regex::new(&format!(
            r"(?i)(\b(?:in|of)\s+)?\b({m})\b(?:,?\s+(\d{{4}})\b)?",
            m = MONTHS.join("|")
        ))
        .expect("a valid month pattern")
    });
    static YEAR: LazyLock<regex::Regex> =
        LazyLock::new(|| regex::Regex::new(r"\b(19\d\d|20\d\d)\b").expect("a valid year pattern"));
    let month_of = |name: &str| {
        MONTHS
            .iter()
            .position(|m| m.eq_ignore_ascii_case(name))
            .map(|i| i as u32 + 1)
    };
    let start_of = |y: i32, m: u32, d: u32| {
        chrono::NaiveDate::from_ymd_opt(y, m, d)
            .and_then(|d| d.and_hms_opt(0, 0, 0))
            .map(|t| t.and_utc().timestamp_millis())
    };
    let mut days = Vec::new();
    for c in DAY_MONTH_YEAR.captures_iter(query) {
        let num = |i: usize| c.get(i).and_then(|m| m.as_str().parse::<u32>().ok());
        let (y, m, d) = if let (Some(d), Some(m), Some(y)) = (num(1), c.get(2), num(3)) {
            (y, month_of(m.as_str()), d)
        } else if let (Some(m), Some(d), Some(y)) = (c.get(4), num(5), num(6)) {
            (y, month_of(m.as_str()), d)
        } else if let (Some(y), Some(m), Some(d)) = (num(7), num(8), num(9)) {
            (y, Some(m), d)
        } else {
            continue;
        };
        if let Some(from) = m.and_then(|m| start_of(y as i32, m, d)) {
            days.push(TimeCue::Span(
                from - clock::DAY_MS,
                from + 4 * clock::DAY_MS,
            ));
        }
    }
    if !days.is_empty() {
        return days;
    }
    let mut months = Vec::new();
    for c in MONTH_YEAR.captures_iter(query) {
        let Some(m) = c.get(2).and_then(|m| month_of(m.as_str())) else {
            continue;
        };
        match c.get(3).and_then(|y| y.as_str().parse::<i32>().ok()) {
            Some(y) => {
                let next = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
                if let (Some(from), Some(to)) = (start_of(y, m, 1), start_of(next.0, next.1, 1)) {
                    months.push(TimeCue::Span(from, to + 7 * clock::DAY_MS));
                }
            }
            None if m != 5 || c.get(1).is_some() => months.push(TimeCue::Month(m)),
            None => {}
        }
    }
    if !months.is_empty() {
        return months;
    }
    YEAR.captures_iter(query)
        .filter_map(|c| c[1].parse::<i32>().ok())
        .filter_map(|y| Some(TimeCue::Span(start_of(y, 1, 1)?, start_of(y + 1, 1, 1)?)))
        .collect()
}

/// Maximal marginal relevance: picks `k` of `scores` (index-aligned with `embeddings`),
/// each time the item maximising `λ·score − (1−λ)·max similarity to those already picked`.
/// Scores are divided by the best one so λ weighs like against like. Items without an
/// embedding are never penalised. Returns indexes in pick order.
pub fn mmr(scores: &[f32], embeddings: &[Option<&[f32]>], lambda: f32, k: usize) -> Vec<usize> {
    let best = scores
        .iter()
        .copied()
        .fold(f32::MIN, f32::max)
        .max(f32::EPSILON);
    let mut picked: Vec<usize> = Vec::with_capacity(k.min(scores.len()));
    let mut left: Vec<usize> = (0..scores.len()).collect();
    while picked.len() < k && !left.is_empty() {
        let (pos, _) = left
            .iter()
            .enumerate()
            .map(|(pos, &i)| {
                let redundancy = match embeddings[i] {
                    Some(e) => picked
                        .iter()
                        .filter_map(|&j| embeddings[j].map(|f| cosine(e, f)))
                        .fold(0.0f32, f32::max),
                    None => 0.0,
                };
                (pos, lambda * scores[i] / best - (1.0 - lambda) * redundancy)
            })
            .fold((0, f32::MIN), |acc, x| if x.1 > acc.1 { x } else { acc });
        picked.push(left.remove(pos));
    }
    picked
}

/// One line of the rendered context for a record.
pub fn render_line(r: &MemoryRecord) -> String {
    let tier = match r.tier {
        Tier::Episodic => String::new(),
        t => format!(" [{}]", t.as_str()),
    };
    let text: String = r.text.split_whitespace().collect::<Vec<_>>().join(" ");
    format!(
        "- {} {}{}: {}",
        clock::to_human(r.event_time),
        r.kind,
        tier,
        text
    )
}

/// Keeps the longest prefix of `ranked` whose rendered lines fit in `budget` tokens
/// (estimated as [`text::estimate_tokens`] does). Returns how many fit.
pub fn fit_budget(ranked: &[&MemoryRecord], budget: Option<usize>) -> usize {
    let Some(budget) = budget else {
        return ranked.len();
    };
    let mut used = text::estimate_tokens(CONTEXT_HEADER);
    for (i, r) in ranked.iter().enumerate() {
        used += text::estimate_tokens(&render_line(r));
        if used > budget {
            return i;
        }
    }
    ranked.len()
}

const CONTEXT_HEADER: &str = "Relevant memories (oldest first):";

/// The context block: the chosen records in time order, with dates and kinds, ready to
/// paste into a prompt. Empty when nothing was recalled.
pub fn render_context(records: &[&MemoryRecord]) -> String {
    if records.is_empty() {
        return String::new();
    }
    let mut sorted: Vec<&&MemoryRecord> = records.iter().collect();
    sorted.sort_by_key(|r| (r.event_time, r.id));
    let mut out = String::from(CONTEXT_HEADER);
    for r in sorted {
        out.push('\n');
        out.push_str(&render_line(r));
    }
    out
}

/// Whether `t` lies inside the optional `[since, until]` window.
pub fn in_window(t: Timestamp, since: Option<Timestamp>, until: Option<Timestamp>) -> bool {
    since.is_none_or(|s| t >= s) && until.is_none_or(|u| t <= u)
}

/// Words with which a question asks about an earlier state ("what did we use before?",
/// "my original deadline", "where did I live previously?"): recall then ranks superseded
/// records as if they were current, since the old value is what is asked for.
const PAST_WORDS: [&str; 12] = [
    "before",
    "previously",
    "previous",
    "originally",
    "original",
    "formerly",
    "former",
    "earlier",
    "initially",
    "initial",
    "prior",
    "old",
];

/// Whether `query` asks about an earlier state (see [`PAST_WORDS`]; also "used to").
pub fn asks_about_past(query: &str) -> bool {
    let words: Vec<String> = query
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect();
    words.iter().any(|w| PAST_WORDS.contains(&w.as_str()))
        || words.windows(2).any(|p| p[0] == "used" && p[1] == "to")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Kind;

    fn rec(id: u32, t: Timestamp, kind: &str, text: &str) -> MemoryRecord {
        MemoryRecord {
            importance: 3.0,
            ..MemoryRecord::episodic(MemoryId(id), "ns", "s", Kind::new(kind).unwrap(), text, t)
        }
    }

    #[test]
    fn a_neighbour_s_words_count_at_a_discount() {
        let stats = QueryStats {
            docs: 100,
            mean_len: 4.0,
            terms: vec![("paint".into(), 2.0), ("sunset".into(), 3.0)],
        };
        let terms = |text: &str| TermCounts::of(&stats, &text::analyze(text));
        let question = terms("what did you paint");
        let answer = terms("a sunset over the lake");
        let other = terms("the lake was cold today");
        let alone = context_bm25(&stats, &answer, &[], 0.4, 2);
        let in_context = context_bm25(&stats, &answer, &[&question, &other], 0.4, 2);
        assert!(alone > 0.0);
        assert!(in_context > alone, "{in_context} > {alone}");
        // A turn whose only match is a neighbour's word ranks below one that has it itself.
        let via_neighbour = context_bm25(&stats, &other, &[&question], 0.4, 2);
        let own_paint = context_bm25(&stats, &terms("I paint on weekends"), &[], 0.4, 2);
        assert!(via_neighbour > 0.0 && via_neighbour < own_paint);
        // Weight 0 is plain BM25 of the record's own words.
        assert_eq!(context_bm25(&stats, &other, &[&question], 0.0, 2), 0.0);
        let empty = QueryStats::default();
        assert_eq!(context_bm25(&empty, &answer, &[], 0.4, 2), 0.0);
    }

    #[test]
    fn explicit_times_in_questions_become_cues() {
        let at = |s: &str| clock::parse_rfc3339("t", s).unwrap();
        let day = |c: &[TimeCue], s: &str| c.iter().any(|c| c.fits(at(s)));
        for q in [
            "What painting did Melanie show on October 13, 2023?",
            "What happened on 13 October 2023?",
            "what happened on the 13th October, 2023",
            "and on 2023-10-13?",
        ] {
            let c = time_cues(q);
            assert_eq!(c.len(), 1, "{q}: {c:?}");
            assert!(day(&c, "2023-10-13T18:00:00Z"), "{q}");
            assert!(
                day(&c, "2023-10-16T10:00:00Z"),
                "{q}: told a few days later"
            );
            assert!(!day(&c, "2023-10-20T10:00:00Z"), "{q}");
            assert!(!day(&c, "2022-10-13T10:00:00Z"), "{q}");
        }
        let july = time_cues("What did they paint in July 2023?");
        assert!(day(&july, "2023-07-30T10:00:00Z") && day(&july, "2023-08-03T10:00:00Z"));
        assert!(!day(&july, "2024-07-10T10:00:00Z") && !day(&july, "2023-06-30T10:00:00Z"));
        let june = time_cues("When did Melanie go camping in June?");
        assert_eq!(june, vec![TimeCue::Month(6)]);
        assert!(day(&june, "2021-06-10T10:00:00Z") && !day(&june, "2021-07-20T10:00:00Z"));
        assert_eq!(
            time_cues("What did they do in May?"),
            vec![TimeCue::Month(5)]
        );
        assert!(time_cues("May I ask what she painted?").is_empty());
        let y = time_cues("How many times has she gone to the beach in 2023?");
        assert!(day(&y, "2023-12-31T23:00:00Z") && !day(&y, "2024-01-01T01:00:00Z"));
        for none in ["What did Caroline research?", "call 555-1234 at 10:30"] {
            assert!(time_cues(none).is_empty(), "{none}");
        }
        // No such day: the month still counts.
        let feb = time_cues("on 31 February 2023");
        assert!(day(&feb, "2023-02-10T10:00:00Z") && !day(&feb, "2023-03-10T10:00:00Z"));
    }

    #[test]
    fn speakers_are_capitalised_names_before_a_colon() {
        assert_eq!(
            speaker_terms("Caroline: I went to a group"),
            Some(text::analyze("Caroline"))
        );
        assert_eq!(
            speaker_terms("Mary Ann: hi"),
            Some(text::analyze("Mary Ann"))
        );
        for not_a_speaker in [
            "no colon here",
            "caroline: lower case",
            "see https://example.com",
            "This is a long sentence: with a colon",
            ": nothing before",
            "Note (draft): punctuation",
        ] {
            assert_eq!(speaker_terms(not_a_speaker), None, "{not_a_speaker}");
        }
        let q = text::analyze("What did Caroline's friends say?");
        assert!(names_speaker(&q, &text::analyze("Caroline")));
        assert!(!names_speaker(&q, &text::analyze("Melanie")));
        assert!(!names_speaker(&q, &text::analyze("Mary Caroline")));
    }

    #[test]
    fn rrf_rewards_agreement_between_paths() {
        let mut c = Candidates::default();
        c.add_vector(&[(1, 0.9), (2, 0.8), (3, 0.1)]);
        c.add_keyword(&[(2, 12.0), (4, 3.0)]);
        c.add_recent(&[MemoryId(5)]);
        let r = fuse(&c, FusionMethod::Rrf, 0.5);
        // Found by both paths beats first in one path only.
        assert!(r[&MemoryId(2)] > r[&MemoryId(1)]);
        assert!(r[&MemoryId(1)] > r[&MemoryId(4)]);
        assert_eq!(r[&MemoryId(5)], 0.0);
        // First in one path only is half; relevance falls off visibly with rank.
        assert!((r[&MemoryId(1)] - 0.5).abs() < 1e-6, "{r:?}");
        assert!(r[&MemoryId(3)] < 0.85 * r[&MemoryId(1)], "{r:?}");
        // First place in both paths is the maximum, 1.0.
        let mut both = Candidates::default();
        both.add_vector(&[(7, 0.5)]);
        both.add_keyword(&[(7, 1.0)]);
        assert!((fuse(&both, FusionMethod::Rrf, 0.5)[&MemoryId(7)] - 1.0).abs() < 1e-6);
    }

    #[test]
    fn weighted_fusion_normalises_bm25_by_the_best_hit() {
        let mut c = Candidates::default();
        c.add_vector(&[(1, 0.8), (2, -0.3)]);
        c.add_keyword(&[(2, 10.0), (3, 5.0)]);
        let r = fuse(&c, FusionMethod::Weighted, 0.5);
        assert!((r[&MemoryId(1)] - 0.4).abs() < 1e-6);
        assert!(
            (r[&MemoryId(2)] - 0.5).abs() < 1e-6,
            "negative cosine counts as 0"
        );
        assert!((r[&MemoryId(3)] - 0.25).abs() < 1e-6);
    }

    #[test]
    fn mmr_skips_near_duplicates() {
        let a = [1.0, 0.0];
        let a2 = [0.99, 0.01];
        let b = [0.0, 1.0];
        let scores = [1.0, 0.95, 0.6];
        let embs = [Some(&a[..]), Some(&a2[..]), Some(&b[..])];
        assert_eq!(mmr(&scores, &embs, 1.0, 2), vec![0, 1]);
        assert_eq!(mmr(&scores, &embs, 0.5, 2), vec![0, 2]);
        assert_eq!(mmr(&scores, &embs, 0.5, 10).len(), 3);
    }

    #[test]
    fn context_is_time_ordered_with_dates_and_kinds() {
        let a = rec(
            1,
            1_683_554_160_000,
            "observation",
            "the build failed\n  on arm64",
        );
        let b = rec(2, 1_683_550_000_000, "goal", "ship the release");
        let ctx = render_context(&[&a, &b]);
        assert_eq!(
            ctx,
            "Relevant memories (oldest first):\n\
             - 2023-05-08 12:46 goal: ship the release\n\
             - 2023-05-08 13:56 observation: the build failed on arm64"
        );
        assert_eq!(render_context(&[]), "");
    }

    #[test]
    fn budget_keeps_a_prefix_that_fits() {
        let long = "word ".repeat(200);
        let a = rec(1, 0, "thought", "short one");
        let b = rec(2, 0, "thought", &long);
        let c = rec(3, 0, "thought", "another short one");
        let ranked = [&a, &b, &c];
        assert_eq!(fit_budget(&ranked, None), 3);
        assert_eq!(fit_budget(&ranked, Some(40)), 1);
        assert_eq!(fit_budget(&ranked, Some(100_000)), 3);
        assert_eq!(fit_budget(&ranked, Some(1)), 0);
    }

    #[test]
    fn window_bounds_are_inclusive() {
        assert!(in_window(5, Some(5), Some(5)));
        assert!(!in_window(4, Some(5), None));
        assert!(!in_window(6, None, Some(5)));
        assert!(in_window(6, None, None));
    }

    #[test]
    fn a_question_about_an_earlier_state_is_told_apart() {
        assert!(asks_about_past("Where was the runner before the move?"));
        assert!(asks_about_past("what did we used to deploy with"));
        assert!(asks_about_past("my original deadline"));
        assert!(!asks_about_past("Where is the deploy runner now?"));
        assert!(!asks_about_past("Have I ever completed a first draft?"));
    }
}
