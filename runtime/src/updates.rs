//! Facts that change: deciding, without a model, whether a newer record updates, contradicts
//! or repeats an older one. Pure — text in, a [`Finding`] out — so the same decision is made
//! on the write path's background side, in tests and in the evaluations.
//!
//! A text is read once into [`Claims`]: its sentences (split again at `but`, `however` …,
//! so a negation covers only its own clause), each with its content terms (the keyword
//! index's analysis: stop words out, stems), its values (numbers with their unit, dates,
//! versions, identifiers such as `eu-2`), whether it is negated, whether it carries a cue of
//! change (`now`, `moved to`, `instead of`, `no longer` …), and, for a rule, its condition.
//! Comparing two [`Claims`] then costs a few set intersections per sentence pair, so a
//! record can be compared with its nearest neighbours without reading any text again.
//!
//! The decision, for a newer text against an older one whose embeddings are `similarity`
//! apart:
//! - **supersedes**: a value of the same kind about the same thing changed (the two
//!   clauses share at least two terms, a unit counting, and not both name, within a few
//!   words before the value, a subject the other text never mentions); or an aligned sentence of the newer text negates the
//!   older with a cue of change (`no longer`, `stopped`); or it names a new term with a
//!   cue (`switched from Postgres to MySQL`, `CSV instead of XLSX`); or a rule keeps its
//!   condition and changes its action;
//! - **contradicts**: aligned sentences, one negated and one not, without a cue of change
//!   (`I've never written a Flask route` against `I added the /login route in Flask`);
//! - **duplicate**: no conflict and either the embeddings are within the duplicate
//!   threshold or the texts share nearly all their terms, with every aligned value equal;
//! - **unrelated** otherwise.
//!
//! Whether a conflict with no clear order (written at the same moment, or the older record
//! reinforced since) is a contradiction rather than an update is for the caller to decide
//! from times it knows; [`Finding::change`] says what the texts say.

use std::collections::HashSet;

use crate::index::text::for_each_token;
use crate::retrieval::MONTHS;

/// What a newer record is to an older one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Change {
    /// It states a newer value of the same fact: the older one stops being current.
    Supersedes,
    /// The two claims cannot both hold, and nothing says which came later.
    Contradicts,
    /// The same fact again.
    Duplicate,
    /// Nothing to link.
    Unrelated,
}

impl Change {
    /// The lower-case name used in APIs and in the labelled test set.
    pub fn as_str(self) -> &'static str {
        match self {
            Change::Supersedes => "supersedes",
            Change::Contradicts => "contradicts",
            Change::Duplicate => "duplicate",
            Change::Unrelated => "unrelated",
        }
    }
}

/// The decision about one pair, with the evidence in words (for the history and `why`).
#[derive(Debug, Clone, PartialEq)]
pub struct Finding {
    /// What the newer record is to the older.
    pub change: Change,
    /// What decided it, e.g. `replica: 4 -> 6` or `negated: "never written … flask route"`.
    pub reason: String,
}

/// The thresholds the decision uses (the policy's `[updates]` section sets them).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Thresholds {
    /// Embedding similarity at or above which two records without a conflict are one fact.
    pub duplicate_similarity: f32,
    /// Share of the shorter sentence's terms two sentences must share to be about the same
    /// thing (negation and cue checks look only at such aligned pairs).
    pub sentence_overlap: f32,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            duplicate_similarity: 0.85,
            sentence_overlap: 0.5,
        }
    }
}

/// What a text claims, read once (see the module docs).
#[derive(Debug, Clone, Default)]
pub struct Claims {
    sentences: Vec<Sentence>,
    /// Every content term of the text.
    terms: HashSet<String>,
}

#[derive(Debug, Clone, Default)]
struct Sentence {
    /// The original clause, for reasons.
    text: String,
    /// Content terms by word position (`None`: a stop word, a value or punctuation).
    words: Vec<Option<String>>,
    terms: HashSet<String>,
    values: Vec<Value>,
    negated: bool,
    /// Whether it says something changed (`now`, `switched`, `instead of` …).
    cue: bool,
    /// Whether it names what it replaces (`instead of`, `from … to`, `replaced`, `rather`).
    replaces: bool,
    /// Whether the change cue is a negation of the past (`no longer`, `stopped`).
    ceased: bool,
    /// A rule's condition (`when the build fails`), when the sentence is one.
    condition: Option<HashSet<String>>,
}

#[derive(Debug, Clone, PartialEq)]
struct Value {
    kind: ValueKind,
    /// Normalised: `1,200` → `1200`, `April 5, 2024` → `april 5 2024`.
    text: String,
    /// Its word position in the sentence.
    at: usize,
}

#[derive(Debug, Clone, PartialEq)]
enum ValueKind {
    /// A number and the unit beside it, when there is one (`replica`, `ms`, `%`).
    Number(Option<String>),
    Date,
    /// A version, and the word before it (`flask` of `Flask 2.3.1`).
    Version(Option<String>),
    /// An identifier with digits, by its leading letters (`eu` of `eu-2`) and its shape
    /// (`aa-dddd` of `qx-4821`: a letter, a digit or the character itself, in order).
    Ident(String, String),
    Time,
}

/// Words that negate their clause.
const NEGATIONS: &[&str] = &[
    "not", "no", "never", "none", "nobody", "nothing", "neither", "nor", "cannot",
];

/// Words that say a value changed.
const CUES: &[&str] = &[
    "now",
    "new",
    "newly",
    "changed",
    "change",
    "changes",
    "moved",
    "moving",
    "switched",
    "switching",
    "switch",
    "updated",
    "update",
    "instead",
    "replaced",
    "replacing",
    "migrated",
    "recently",
    "currently",
    "anymore",
    "longer",
    "increased",
    "decreased",
    "raised",
    "lowered",
    "reduced",
    "bumped",
    "upgraded",
    "downgraded",
    "improved",
    "dropped",
    "grew",
    "reached",
    "became",
    "become",
    "latest",
    "since",
    "stopped",
    "quit",
    "relocated",
    "revised",
    "extended",
    "postponed",
    "rescheduled",
    "handed",
    "went",
    "gone",
    "started",
    "ripped",
    "removed",
    "retired",
    "abandoned",
    "discontinued",
    "going",
    "forward",
];

/// Words that say the older state ended (with `no longer`): a negation with one of them is
/// an update, not a contradiction.
const CEASED: &[&str] = &[
    "anymore",
    "stopped",
    "quit",
    "discontinued",
    "dropped",
    "removed",
    "abandoned",
    "retired",
    "ripped",
];

/// Words that open a rule's condition.
const CONDITIONS: &[&str] = &[
    "if", "when", "whenever", "before", "after", "once", "unless",
];

/// Number words read as numbers (not `one`: far more often a pronoun).
const NUMBER_WORDS: &[(&str, u32)] = &[
    ("two", 2),
    ("three", 3),
    ("four", 4),
    ("five", 5),
    ("six", 6),
    ("seven", 7),
    ("eight", 8),
    ("nine", 9),
    ("ten", 10),
    ("eleven", 11),
    ("twelve", 12),
    ("fifteen", 15),
    ("twenty", 20),
    ("thirty", 30),
    ("fifty", 50),
    ("hundred", 100),
];

/// Words before a value within which a term the other text never uses marks another subject.
const NEAR: usize = 3;

impl Claims {
    /// Reads a text's claims.
    pub fn of(text: &str) -> Claims {
        let mut claims = Claims::default();
        for clause in clauses(text) {
            let s = sentence(clause);
            if s.words.is_empty() {
                continue;
            }
            claims.terms.extend(s.terms.iter().cloned());
            claims.sentences.push(s);
        }
        claims
    }

    /// Whether the text had anything to compare.
    pub fn is_empty(&self) -> bool {
        self.sentences.is_empty()
    }
}

/// Decides what `newer` is to `older` (see the module docs).
pub fn compare(newer: &Claims, older: &Claims, similarity: f32, t: &Thresholds) -> Finding {
    if let Some(reason) = value_change(newer, older) {
        return Finding {
            change: Change::Supersedes,
            reason,
        };
    }
    let mut contradiction = None;
    for a in &newer.sentences {
        for b in &older.sentences {
            let shared = a.terms.intersection(&b.terms).count();
            if !aligned(a, b, shared, t) {
                continue;
            }
            if a.negated != b.negated {
                if a.ceased || (a.cue && !b.cue) {
                    return Finding {
                        change: Change::Supersedes,
                        reason: format!("ended: \"{}\" after \"{}\"", a.text, b.text),
                    };
                }
                contradiction.get_or_insert_with(|| {
                    format!("negated: \"{}\" against \"{}\"", a.text, b.text)
                });
                continue;
            }
            if a.cue && !b.cue && novel(a, b, older) {
                return Finding {
                    change: Change::Supersedes,
                    reason: format!("changed: \"{}\" after \"{}\"", a.text, b.text),
                };
            }
            if let (Some(ca), Some(cb)) = (&a.condition, &b.condition)
                && !ca.is_empty()
                && ca == cb
                && a.terms != b.terms
            {
                return Finding {
                    change: Change::Supersedes,
                    reason: format!("rule changed: \"{}\" after \"{}\"", a.text, b.text),
                };
            }
        }
    }
    if let Some(reason) = contradiction {
        return Finding {
            change: Change::Contradicts,
            reason,
        };
    }
    let jaccard = jaccard(&newer.terms, &older.terms);
    if similarity >= t.duplicate_similarity || jaccard >= 0.75 {
        return Finding {
            change: Change::Duplicate,
            reason: format!("same fact (similarity {similarity:.3}, shared terms {jaccard:.2})"),
        };
    }
    Finding {
        change: Change::Unrelated,
        reason: String::new(),
    }
}

/// Two sentences are about the same thing when they share at least two terms, making up
/// `sentence_overlap` of the shorter one.
fn aligned(a: &Sentence, b: &Sentence, shared: usize, t: &Thresholds) -> bool {
    let shorter = a.terms.len().min(b.terms.len()).max(1);
    shared >= 2.min(shorter) && shared as f32 / shorter as f32 >= t.sentence_overlap
}

/// Whether the newer sentence names something the older text never did while the older
/// sentence names something the newer one dropped: a replacement, not a rewording.
fn novel(a: &Sentence, b: &Sentence, older: &Claims) -> bool {
    let added = a
        .terms
        .iter()
        .any(|w| !older.terms.contains(w) && !is_cue_term(w));
    // `CSV instead of XLSX` keeps the old value in the newer sentence; otherwise the older
    // sentence must have lost a term.
    let dropped = b.terms.iter().any(|w| !a.terms.contains(w));
    added && (dropped || a.replaces)
}

/// The first value of the newer text that changes a value of the older one about the same
/// thing, as `thing: old -> new`.
fn value_change(newer: &Claims, older: &Claims) -> Option<String> {
    for a in &newer.sentences {
        for u in &a.values {
            // A value the older text also states is not new: the newer text is listing
            // facts (a count beside a date), not changing one.
            if older
                .sentences
                .iter()
                .flat_map(|s| &s.values)
                .any(|o| o.text == u.text)
            {
                continue;
            }
            for b in &older.sentences {
                for v in &b.values {
                    if u.text == v.text || !same_kind(&u.kind, &v.kind) {
                        continue;
                    }
                    // About the same thing: the two clauses share terms (a number's unit is
                    // one of its clause's terms, so a shared unit counts).
                    let mut shared: Vec<&String> = a.terms.intersection(&b.terms).collect();
                    if shared.len() < 2 {
                        continue;
                    }
                    // The same attribute of another subject (`staging has 4` against
                    // `production has 6`) names, just before each value, a term the other
                    // text never uses.
                    let other_subject = |s: &Sentence, at: usize, other: &Claims| {
                        before(s, at).any(|w| !other.terms.contains(w) && !is_cue_term(w))
                    };
                    if other_subject(a, u.at, older) && other_subject(b, v.at, newer) {
                        continue;
                    }
                    shared.sort();
                    let thing: Vec<&str> = shared.iter().map(|s| s.as_str()).collect();
                    return Some(format!("{}: {} -> {}", thing.join(" "), v.text, u.text));
                }
            }
        }
    }
    None
}

fn same_kind(a: &ValueKind, b: &ValueKind) -> bool {
    match (a, b) {
        (ValueKind::Number(x), ValueKind::Number(y)) => match (x, y) {
            (Some(x), Some(y)) => x == y,
            _ => true,
        },
        (ValueKind::Version(x), ValueKind::Version(y)) => match (x, y) {
            (Some(x), Some(y)) => x == y,
            _ => true,
        },
        // The same prefix (`eu-1`, `eu-2`), or codes of one format (`QX-4821`, `BT-0397`:
        // a reference, a ticket, a room) with at least two digits, so that `v2` and `b7`
        // stay apart.
        (ValueKind::Ident(x, xs), ValueKind::Ident(y, ys)) => {
            x == y || (xs == ys && xs.bytes().filter(|&b| b == b'd').count() >= 2)
        }
        (ValueKind::Date, ValueKind::Date) | (ValueKind::Time, ValueKind::Time) => true,
        _ => false,
    }
}

/// The content terms within [`NEAR`] words before position `at`.
fn before(s: &Sentence, at: usize) -> impl Iterator<Item = &String> {
    s.words[at.saturating_sub(NEAR)..at].iter().flatten()
}

fn jaccard(a: &HashSet<String>, b: &HashSet<String>) -> f32 {
    let shared = a.intersection(b).count();
    let union = a.len() + b.len() - shared;
    if union == 0 {
        0.0
    } else {
        shared as f32 / union as f32
    }
}

fn is_cue_term(stem: &str) -> bool {
    CUE_STEMS.with(|set| set.contains(stem))
}

thread_local! {
    /// The cue words as the analyzer stems them (`moved` → `move`), to recognise them among
    /// a sentence's terms.
    static CUE_STEMS: HashSet<String> = {
        let mut set = HashSet::new();
        for cue in CUES {
            for_each_token(cue, |t| {
                set.insert(t.text.clone());
            });
        }
        set
    };
}

/// Splits a text into clauses: at sentence ends, line breaks and semicolons, and before
/// the conjunctions that turn a clause around (`but`, `however`, `although` …), so that a
/// negation covers only its own clause. Questions are left out: they claim nothing.
fn clauses(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    // Where the current sentence's clauses begin in `out`: a question drops them all.
    let mut sentence_start = 0;
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        let end_of_sentence = matches!(c, b'.' | b'!' | b'?')
            && bytes.get(i + 1).is_none_or(|n| n.is_ascii_whitespace());
        if end_of_sentence && c == b'?' {
            // A question states nothing to update or contradict ("is the runner still in
            // eu-1?"); on BEAM, users' questions naming numbers would otherwise make most
            // of the false supersessions.
            out.truncate(sentence_start);
            start = i + 1;
            sentence_start = out.len();
        } else if end_of_sentence || matches!(c, b'\n' | b';') {
            out.push(&text[start..i]);
            start = i + 1;
            sentence_start = out.len();
        } else if c == b' ' {
            let rest = &text[i + 1..];
            let turn = [
                "but ",
                "however",
                "although ",
                "though ",
                "whereas ",
                "yet ",
            ]
            .iter()
            .any(|w| {
                rest.len() >= w.len()
                    && rest.as_bytes()[..w.len()].eq_ignore_ascii_case(w.as_bytes())
            });
            if turn {
                out.push(&text[start..i]);
                start = i + 1;
            }
        }
        i += 1;
    }
    let rest = text[start..].trim_end();
    if rest.ends_with('?') {
        out.truncate(sentence_start);
    } else {
        out.push(&text[start..]);
    }
    out.retain(|c| !c.trim().is_empty());
    out
}

/// A raw word of a clause and where it is.
struct RawWord<'a> {
    text: &'a str,
    start: usize,
    end: usize,
}

fn raw_words(clause: &str) -> Vec<RawWord<'_>> {
    let mut words = Vec::new();
    let mut start = None;
    for (i, c) in clause.char_indices() {
        if c.is_whitespace() {
            if let Some(s) = start.take() {
                words.push(trimmed(clause, s, i));
            }
        } else if start.is_none() {
            start = Some(i);
        }
    }
    if let Some(s) = start {
        words.push(trimmed(clause, s, clause.len()));
    }
    words.retain(|w| !w.text.is_empty());
    words
}

/// The word between `s` and `e` without the punctuation around it (keeping `$` before and
/// `%` after, which are units).
fn trimmed(clause: &str, s: usize, e: usize) -> RawWord<'_> {
    let w = &clause[s..e];
    let lead = w.len()
        - w.trim_start_matches(|c: char| !c.is_alphanumeric() && c != '$')
            .len();
    let inner = &w[lead..];
    let kept = inner.trim_end_matches(|c: char| !c.is_alphanumeric() && c != '%');
    RawWord {
        text: kept,
        start: s + lead,
        end: s + lead + kept.len(),
    }
}

fn sentence(clause: &str) -> Sentence {
    let raw = raw_words(clause);
    let mut s = Sentence {
        text: clause.trim().chars().take(120).collect(),
        words: vec![None; raw.len()],
        ..Sentence::default()
    };
    // Content terms from the keyword index's own analysis, placed at the raw word holding
    // them (a word like `eu-2` yields several tokens; values are kept apart below).
    let mut w = 0;
    for_each_token(clause, |t| {
        while w < raw.len() && raw[w].end <= t.offset_from {
            w += 1;
        }
        if w < raw.len()
            && raw[w].start <= t.offset_from
            && !t.text.bytes().any(|b| b.is_ascii_digit())
            && s.words[w].is_none()
        {
            s.words[w] = Some(t.text.clone());
        }
    });
    let lower: Vec<String> = raw.iter().map(|r| r.text.to_lowercase()).collect();
    let mut i = 0;
    while i < raw.len() {
        let word = lower[i].as_str();
        // `no more than`, `no later than` bound a value; they deny nothing.
        let bound = word == "no"
            && lower.get(i + 1).is_some_and(|w| {
                matches!(w.as_str(), "more" | "less" | "later" | "earlier" | "fewer")
            });
        // `2-space indentation, not tabs`: a correction naming what it replaces.
        let correction = matches!(word, "not" | "never")
            && i > 0
            && clause[raw[i - 1].end..raw[i].start].contains(',');
        if correction {
            s.cue = true;
            s.replaces = true;
        } else if !bound
            && (NEGATIONS.contains(&word) || word.ends_with("n't") || word.ends_with("n’t"))
        {
            s.negated = true;
        }
        if CUES.contains(&word) {
            s.cue = true;
        }
        if matches!(
            word,
            "instead" | "replaced" | "replacing" | "rather" | "from"
        ) {
            s.replaces = true;
        }
        if let Some((value, used)) = value_at(&lower, &raw, i) {
            for slot in &mut s.words[i..i + used] {
                *slot = None;
            }
            s.values.push(Value { at: i, ..value });
            i += used;
            continue;
        }
        i += 1;
    }
    // `no longer`, `stopped`, `not … anymore`: the earlier state ended, which negates it.
    s.ceased = lower.windows(2).any(|p| p[0] == "no" && p[1] == "longer")
        || lower.iter().any(|w| CEASED.contains(&w.as_str()));
    s.negated |= s.ceased;
    if lower
        .first()
        .is_some_and(|w| CONDITIONS.contains(&w.as_str()))
    {
        // The condition runs to the first comma or `then`.
        let end = raw
            .iter()
            .position(|r| clause[r.end..].starts_with(','))
            .map(|p| p + 1)
            .or_else(|| lower.iter().position(|w| w == "then"));
        if let Some(end) = end {
            s.condition = Some(s.words[..end].iter().flatten().cloned().collect());
        }
    }
    s.terms = s.words.iter().flatten().cloned().collect();
    for v in &s.values {
        if let ValueKind::Number(Some(unit)) = &v.kind {
            s.terms.insert(unit.clone());
        }
    }
    s
}

/// The value starting at word `i`, if one does, and how many words it takes.
fn value_at(lower: &[String], raw: &[RawWord<'_>], i: usize) -> Option<(Value, usize)> {
    let word = lower[i].as_str();
    let value = |kind, text: String| Value { kind, text, at: i };
    // A month and a day (and a year): `April 5, 2024`; or a day and a month: `5 April`.
    if let Some(m) = month(word) {
        let day = lower.get(i + 1).and_then(|d| day_number(d));
        if let Some(day) = day {
            let year = lower.get(i + 2).filter(|y| is_year(y));
            let text = match year {
                Some(y) => format!("{m} {day} {y}"),
                None => format!("{m} {day}"),
            };
            return Some((
                value(ValueKind::Date, text),
                2 + usize::from(year.is_some()),
            ));
        }
        return None;
    }
    if let Some((m, d, y)) = dashed_date(word) {
        return Some((value(ValueKind::Date, format!("{m} {d} {y}")), 1));
    }
    if !word.bytes().any(|b| b.is_ascii_digit()) {
        let n = NUMBER_WORDS.iter().find(|(w, _)| *w == word)?.1;
        let unit = unit_after(lower, raw, i)?;
        return Some((value(ValueKind::Number(Some(unit)), n.to_string()), 1));
    }
    if let Some(day) = day_number(word)
        && let Some(m) = lower.get(i + 1).and_then(|w| month(w))
    {
        return Some((value(ValueKind::Date, format!("{m} {day}")), 2));
    }
    if is_year(word) && !lower.get(i + 1).is_some_and(|w| is_unit_word(w)) {
        return Some((value(ValueKind::Date, word.to_string()), 1));
    }
    if word.contains(':')
        && word
            .split(':')
            .all(|p| p.bytes().all(|b| b.is_ascii_digit()))
    {
        return Some((value(ValueKind::Time, word.to_string()), 1));
    }
    let bare = word.strip_prefix('v').unwrap_or(word);
    if bare.contains('.')
        && bare
            .split('.')
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        && (bare.matches('.').count() >= 2 || word.starts_with('v'))
    {
        let thing = i
            .checked_sub(1)
            .and_then(|p| lower.get(p))
            .filter(|w| w.bytes().all(|b| b.is_ascii_alphabetic()))
            .cloned();
        return Some((value(ValueKind::Version(thing), bare.to_string()), 1));
    }
    let digits: String = word
        .trim_start_matches('$')
        .chars()
        .filter(|c| *c != ',')
        .collect();
    let numeric_end = digits
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(digits.len());
    let (number, suffix) = digits.split_at(numeric_end);
    if !number.is_empty() && number.bytes().next().is_some_and(|b| b.is_ascii_digit()) {
        let suffix = suffix.trim_start_matches('-');
        if suffix.is_empty() || suffix.bytes().all(|b| b.is_ascii_alphabetic() || b == b'%') {
            let unit = if word.starts_with('$') {
                Some("$".to_string())
            } else if !suffix.is_empty() {
                Some(suffix.to_string())
            } else {
                unit_after(lower, raw, i)
            };
            let text = number.trim_end_matches('.').to_string();
            return Some((value(ValueKind::Number(unit), text), 1));
        }
    }
    // An identifier with digits: `eu-2`, `gpt-4o`, `node20`.
    let prefix: String = word
        .chars()
        .take_while(|c| c.is_ascii_alphabetic())
        .collect();
    if !prefix.is_empty() {
        let shape = word
            .chars()
            .map(|c| match c {
                c if c.is_ascii_alphabetic() => 'a',
                c if c.is_ascii_digit() => 'd',
                c => c,
            })
            .collect();
        return Some((value(ValueKind::Ident(prefix, shape), word.to_string()), 1));
    }
    None
}

fn month(word: &str) -> Option<&'static str> {
    let w = word.trim_end_matches('.');
    MONTHS
        .iter()
        .find(|m| w == **m || (w.len() == 3 && m.starts_with(w) && w != "may"))
        .copied()
        .or_else(|| (w == "may").then_some("may"))
}

fn day_number(word: &str) -> Option<u32> {
    let d = word
        .trim_end_matches(',')
        .trim_end_matches("st")
        .trim_end_matches("nd")
        .trim_end_matches("rd")
        .trim_end_matches("th");
    d.parse().ok().filter(|d| (1..=31).contains(d))
}

fn is_year(word: &str) -> bool {
    word.len() == 4
        && word
            .parse::<u32>()
            .is_ok_and(|y| (1900..=2100).contains(&y))
}

/// `2024-03-15` or `march-15-2024`.
fn dashed_date(word: &str) -> Option<(String, u32, u32)> {
    let parts: Vec<&str> = word.split('-').collect();
    if parts.len() != 3 {
        return None;
    }
    if let (Ok(y), Ok(m), Ok(d)) = (
        parts[0].parse::<u32>(),
        parts[1].parse::<usize>(),
        parts[2].parse::<u32>(),
    ) && (1900..=2100).contains(&y)
        && (1..=12).contains(&m)
    {
        return Some((MONTHS[m - 1].to_string(), d, y));
    }
    let m = month(parts[0])?;
    Some((
        m.to_string(),
        parts[1].parse().ok()?,
        parts[2].parse().ok()?,
    ))
}

/// The stem of the word after a number when it names what is counted (`4 replicas` →
/// `replica`); not a stop word, a cue or another value.
fn unit_after(lower: &[String], raw: &[RawWord<'_>], i: usize) -> Option<String> {
    let next = lower.get(i + 1)?;
    if next == "percent" || next == "per" && lower.get(i + 2).is_some_and(|w| w == "cent") {
        return Some("%".to_string());
    }
    if !is_unit_word(next) {
        return None;
    }
    let mut stem = None;
    for_each_token(raw[i + 1].text, |t| {
        stem.get_or_insert_with(|| t.text.clone());
    });
    stem.filter(|s| !is_cue_term(s))
}

fn is_unit_word(word: &str) -> bool {
    word.bytes().all(|b| b.is_ascii_alphabetic())
        && !word.is_empty()
        && !NEGATIONS.contains(&word)
        && month(word).is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decide(newer: &str, older: &str) -> Finding {
        compare(
            &Claims::of(newer),
            &Claims::of(older),
            0.0,
            &Thresholds::default(),
        )
    }

    #[test]
    fn a_new_count_of_the_same_thing_supersedes() {
        let f = decide(
            "The staging DB has 6 replicas.",
            "The staging DB has 4 replicas.",
        );
        assert_eq!(f.change, Change::Supersedes, "{f:?}");
        assert!(f.reason.contains("4 -> 6"), "{}", f.reason);
    }

    #[test]
    fn the_same_count_of_another_subject_is_unrelated() {
        let f = decide("Production has 6 replicas.", "Staging has 4 replicas.");
        assert_eq!(f.change, Change::Unrelated, "{f:?}");
    }

    #[test]
    fn a_moved_identifier_supersedes_and_a_denial_contradicts() {
        let f = decide(
            "The deploy runner moved to eu-2 this morning.",
            "Deploys run on the eu-1 runner.",
        );
        assert_eq!(f.change, Change::Supersedes, "{f:?}");
        let f = decide(
            "I added a /login route in Flask yesterday and it handles POST requests.",
            "I've never written any Flask routes or handled HTTP requests in this project.",
        );
        assert_eq!(f.change, Change::Contradicts, "{f:?}");
    }

    #[test]
    fn no_longer_is_an_update_and_a_replacement_with_a_cue_too() {
        let f = decide(
            "The user no longer wants XLSX exports.",
            "The user wants XLSX exports.",
        );
        assert_eq!(f.change, Change::Supersedes, "{f:?}");
        let f = decide(
            "The user now wants the reports as CSV instead of XLSX.",
            "The user wants the reports as XLSX.",
        );
        assert_eq!(f.change, Change::Supersedes, "{f:?}");
    }

    #[test]
    fn dates_numbers_and_versions_are_read_as_values() {
        let c =
            Claims::of("The deadline is April 5, 2024; we run Flask 2.3.1 on 1,200 calls per day.");
        let values: Vec<&str> = c
            .sentences
            .iter()
            .flat_map(|s| s.values.iter().map(|v| v.text.as_str()))
            .collect();
        assert_eq!(values, ["april 5 2024", "2.3.1", "1200"]);
    }

    #[test]
    fn the_same_fact_again_is_a_duplicate() {
        let f = decide(
            "Deploys run from the eu-1 runner.",
            "Deploys run from the eu-1 runner!",
        );
        assert_eq!(f.change, Change::Duplicate, "{f:?}");
    }
}
