//! Reading JSON out of a model's answer, for the LLM judge and the condenser. Local models
//! wrap their JSON in prose, Markdown fences and `<think>` blocks, and
//! get its syntax a little wrong; this module finds the JSON the model meant ([`extract`]),
//! repairs the common faults while saying which ones it repaired ([`Repair`]), and checks the
//! two answers the runtime asks for ([`judge_answer`], [`condense_answer`]).
//!
//! It is pure and synchronous — no I/O, no clock, no logging — so the provider, the audit log
//! and the retry loop decide what to do with a [`JsonFault`]; its message is short and quotes
//! at most about 120 characters of the answer, so it can be shown back to the model
//! ([`JsonFault::retry_prompt`]). Repairs change syntax only: no value is ever guessed, and
//! the validators report an out-of-range score as a fault instead of clamping it. Nothing
//! here may panic on any input; a proptest feeds it arbitrary and mutated answers.

use std::collections::BTreeMap;
use std::fmt;

use serde_json::Value;

/// Most characters of the model's answer a fault message quotes.
const SNIPPET_CHARS: usize = 120;

/// How many times the search for JSON may start again inside a candidate that ran to the
/// end of the answer without closing.
const MAX_RESTARTS: usize = 8;

/// Longest text a condensed record may have, in characters.
pub const MAX_CONDENSED_CHARS: usize = 2000;

/// The judge's scale: importance and reusability are numbers from 0 to this, inclusive.
pub const SCORE_MAX: f64 = 10.0;

/// A syntax fault that [`extract`] repaired. `Display` reads well after "repaired: ".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Repair {
    /// A comma right before `}` or `]`: `[1, 2,]`.
    TrailingComma,
    /// Strings or keys in single quotes: `{'kind': 'summary'}`.
    SingleQuotes,
    /// Keys without quotes: `{importance: 7}`.
    UnquotedKeys,
    /// Python's `True`, `False` and `None` for `true`, `false` and `null`.
    PythonLiterals,
    /// Typographic quotes (“ ” ‘ ’) used as string delimiters.
    SmartQuotes,
    /// `//` and `/* */` comments.
    Comments,
    /// Raw newlines, tabs or other control characters inside a string.
    ControlCharacters,
    /// Escapes JSON does not have, such as `\'`.
    BadEscapes,
    /// A `"` inside a string that the model forgot to escape.
    UnescapedQuotes,
    /// A closing bracket that skipped over unclosed inner ones: `{"a": [1, 2}`.
    MissingBrackets,
    /// The answer stopped inside the JSON; the open strings and brackets were closed.
    ClosedTruncated,
    /// The answer stopped inside the JSON and its last, incomplete element was dropped.
    DroppedIncompleteTail,
}

impl fmt::Display for Repair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Repair::TrailingComma => "trailing comma",
            Repair::SingleQuotes => "single-quoted strings",
            Repair::UnquotedKeys => "unquoted keys",
            Repair::PythonLiterals => "Python literals (True/False/None)",
            Repair::SmartQuotes => "smart quotes",
            Repair::Comments => "comments",
            Repair::ControlCharacters => "raw control characters in strings",
            Repair::BadEscapes => "invalid escapes",
            Repair::UnescapedQuotes => "unescaped quotes inside a string",
            Repair::MissingBrackets => "missing closing brackets",
            Repair::ClosedTruncated => "closed a truncated answer",
            Repair::DroppedIncompleteTail => "dropped an incomplete last element",
        })
    }
}

/// The JSON found in an answer, and the repairs it needed (empty when it parsed as written).
#[derive(Debug, Clone, PartialEq)]
pub struct Extracted {
    /// The parsed value: always an object or an array.
    pub value: Value,
    /// Each repair applied, once, in the order first met.
    pub repairs: Vec<Repair>,
}

impl Extracted {
    /// A line for the audit log, such as `repaired: trailing comma, unquoted keys`, or `None`
    /// when the JSON parsed as written.
    pub fn repair_note(&self) -> Option<String> {
        if self.repairs.is_empty() {
            return None;
        }
        let list: Vec<String> = self.repairs.iter().map(Repair::to_string).collect();
        Some(format!("repaired: {}", list.join(", ")))
    }
}

/// Why an answer could not be read, or did not have the shape asked for. Every message is
/// short, quotes at most about 120 characters of the answer, and is fit to show the model.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JsonFault {
    /// The answer was empty or only whitespace.
    #[error("the answer was empty")]
    Empty,
    /// A `<think>` block and nothing after it: the model never gave its answer.
    #[error("the answer holds only reasoning (a <think> block) and no JSON after it")]
    OnlyReasoning,
    /// No `{` or `[` that starts JSON anywhere in the answer.
    #[error("no JSON object or array found in the answer: \"{snippet}\"")]
    NotFound {
        /// The start of the answer.
        snippet: String,
    },
    /// The JSON stops before its brackets close, or a bracket closes the wrong one.
    #[error("the JSON is cut off or its brackets do not match: \"{snippet}\"")]
    Unbalanced {
        /// The text around the problem (the end of the answer when it was cut off).
        snippet: String,
    },
    /// Found and balanced, but still not JSON after every repair.
    #[error("the JSON is invalid even after repair ({detail}) near \"{snippet}\"")]
    Invalid {
        /// The parser's complaint, e.g. `expected value`.
        detail: String,
        /// The (repaired) text around the place the parser gave up.
        snippet: String,
    },
    /// Valid JSON, but not the answer asked for.
    #[error("{path}: {problem}")]
    Schema {
        /// Where in the answer, e.g. `items[2] (index 4)` or `sources[1]`.
        path: String,
        /// What is wrong there and what to write instead.
        problem: String,
    },
}

impl JsonFault {
    /// True when the answer was not readable JSON at all; false for [`JsonFault::Schema`].
    pub fn is_syntax(&self) -> bool {
        !matches!(self, JsonFault::Schema { .. })
    }

    /// The message for the one retry: the fault, then what to answer instead.
    pub fn retry_prompt(&self) -> String {
        if self.is_syntax() {
            format!(
                "Your answer was not valid JSON: {self}. Answer with only the JSON object, \
                 without prose or code fences."
            )
        } else {
            format!(
                "Your answer did not have the requested shape: {self}. Answer with only the \
                 corrected JSON object."
            )
        }
    }
}

fn schema(path: impl Into<String>, problem: impl Into<String>) -> JsonFault {
    JsonFault::Schema {
        path: path.into(),
        problem: problem.into(),
    }
}

/// The JSON schema of a judge's answer for `n` items: `{"items": [...]}` with exactly one
/// object per index `0..n`, each holding `index` and the `fields` given (name → schema),
/// all required. Shared by the importance judge and the update judge.
pub fn items_schema(n: usize, fields: &[(&str, Value)]) -> Value {
    let mut properties = serde_json::Map::new();
    properties.insert(
        "index".into(),
        serde_json::json!({"type": "integer", "minimum": 0, "maximum": n.saturating_sub(1)}),
    );
    let mut required = vec![Value::from("index")];
    for (name, schema) in fields {
        properties.insert((*name).into(), schema.clone());
        required.push(Value::from(*name));
    }
    serde_json::json!({
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "minItems": n,
                "maxItems": n,
                "items": {
                    "type": "object",
                    "properties": properties,
                    "required": required,
                    "additionalProperties": false
                }
            }
        },
        "required": ["items"],
        "additionalProperties": false
    })
}

/// Finds the JSON a model meant in its answer, repairing common faults.
///
/// Tolerated around the JSON: a byte-order mark and whitespace, prose before and after,
/// Markdown fences (the fenced blocks are searched first), and `<think>…</think>` reasoning
/// (only what follows the last `</think>` counts). The first complete top-level object or
/// array is taken — except that an array of plain scalars or an empty container, such as a
/// `[0]` cited in prose, yields to a richer candidate later in the answer.
///
/// Each candidate is parsed strictly first; only if that fails are the faults listed in
/// [`Repair`] repaired, and the value is returned with the repairs it needed. A candidate the
/// answer stops inside is closed, or cut back to its last complete element, when that parses.
pub fn extract(text: &str) -> Result<Extracted, JsonFault> {
    let text = text.trim_start_matches('\u{feff}').trim();
    if text.is_empty() {
        return Err(JsonFault::Empty);
    }
    let answer = strip_reasoning(text)?;

    // The first weak candidate (scalar array, empty container) and the failed candidate
    // spanning the most text, which is the likeliest to be the answer the model meant.
    let mut weak: Option<(usize, Extracted)> = None;
    let mut failed: Option<(usize, JsonFault)> = None;
    let mut restarts = 0;
    for region in regions(answer) {
        let chars: Vec<char> = region.chars().collect();
        let mut i = 0;
        while i < chars.len() {
            if chars[i] != '{' && chars[i] != '[' {
                i += 1;
                continue;
            }
            let (result, next) = candidate(&chars, i);
            let span = next.unwrap_or(chars.len()) - i;
            match result {
                Ok(found) if is_strong(&found.value) => return Ok(found),
                Ok(found) => {
                    if weak.is_none() {
                        weak = Some((span, found));
                    }
                }
                Err(fault) => {
                    if failed.as_ref().is_none_or(|(longest, _)| span > *longest) {
                        failed = Some((span, fault));
                    }
                }
            }
            match next {
                Some(next) => i = next.max(i + 1),
                // A stray quote or bracket in prose (`[it's]`) can swallow the rest of the
                // answer; look again from the next bracket, a bounded number of times so an
                // answer of ten thousand `{` stays linear.
                None if restarts < MAX_RESTARTS => {
                    restarts += 1;
                    i += 1;
                }
                None => break,
            }
        }
    }
    match (weak, failed) {
        (Some((weak_span, _)), Some((failed_span, fault))) if failed_span > weak_span => Err(fault),
        (Some((_, found)), _) => Ok(found),
        (None, Some((_, fault))) => Err(fault),
        (None, None) => Err(JsonFault::NotFound {
            snippet: snippet(answer),
        }),
    }
}

/// What follows the last `</think>` (or an unclosed `<think>`), where reasoning models put
/// their answer; the whole text when there is no such tag.
fn strip_reasoning(text: &str) -> Result<&str, JsonFault> {
    // ASCII lowercasing keeps every byte offset, so positions found in `lower` index `text`.
    let lower = text.to_ascii_lowercase();
    if let Some(at) = lower.rfind("</think") {
        let after = lower[at..].find('>').map_or(text.len(), |gt| at + gt + 1);
        let answer = &text[after..];
        return if answer.contains(['{', '[']) {
            Ok(answer)
        } else {
            Err(JsonFault::OnlyReasoning)
        };
    }
    if let Some(at) = lower.find("<think") {
        // Never closed: the model may have answered inside it, so search what follows.
        let after = lower[at..].find('>').map_or(text.len(), |gt| at + gt + 1);
        return Ok(&text[after..]);
    }
    Ok(text)
}

/// The places to look for JSON, in order: each Markdown fenced block, then the whole answer.
fn regions(answer: &str) -> Vec<&str> {
    let mut found = Vec::new();
    let mut rest = answer;
    while let Some(open) = rest.find("```") {
        let after = &rest[open + 3..];
        // The info string (`json`, `JSON5`) is ASCII, so its char count is its byte count.
        let info = after
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '+' | '-'))
            .count();
        let body = &after[info..];
        match body.find("```") {
            Some(close) => {
                found.push(&body[..close]);
                rest = &body[close + 3..];
            }
            None => {
                // An unclosed fence: a truncated answer, still worth reading.
                found.push(body);
                break;
            }
        }
    }
    found.push(answer);
    found
}

/// Richer than a `[0]` or `{}` that prose might contain: a non-empty object, or an array
/// holding objects or arrays.
fn is_strong(value: &Value) -> bool {
    match value {
        Value::Object(map) => !map.is_empty(),
        Value::Array(items) => items.iter().any(|v| v.is_object() || v.is_array()),
        _ => false,
    }
}

/// Parses the candidate starting at `chars[start]` (a `{` or `[`). Returns the result and
/// where the search continues (`None`: the answer ended inside this candidate).
fn candidate(chars: &[char], start: usize) -> (Result<Extracted, JsonFault>, Option<usize>) {
    let scan = Scanner::new(chars, start).run();
    match scan.end {
        End::Closed(end) => {
            let raw: String = chars[start..end].iter().collect();
            if let Ok(value) = serde_json::from_str(&raw) {
                let repairs = Vec::new();
                return (Ok(Extracted { value, repairs }), Some(end));
            }
            let result = match serde_json::from_str(&scan.out) {
                Ok(value) => Ok(Extracted {
                    value,
                    repairs: scan.repairs,
                }),
                Err(e) => Err(invalid(&scan.out, &e)),
            };
            (result, Some(end))
        }
        End::Mismatched(at) => {
            let from = at.saturating_sub(SNIPPET_CHARS / 2);
            let near: String = chars[from..(at + 1).min(chars.len())].iter().collect();
            let fault = JsonFault::Unbalanced {
                snippet: snippet(&near),
            };
            (Err(fault), Some(at + 1))
        }
        End::Truncated { in_string } => (close_truncated(scan, in_string, chars), None),
    }
}

/// An answer that stopped inside the JSON: first close what is open (a string, then the
/// brackets); if that does not parse, cut back to the last complete element and close there.
fn close_truncated(scan: Scan, in_string: bool, chars: &[char]) -> Result<Extracted, JsonFault> {
    let mut closed = scan.out.clone();
    if in_string {
        closed.push('"');
    }
    let trimmed = closed.trim_end().trim_end_matches(',').len();
    closed.truncate(trimmed);
    closed.extend(scan.stack.iter().rev());
    // Closing `{"impor` to `{}` finds nothing the model meant; better to say it was cut off.
    let parse = |text: &str| {
        serde_json::from_str::<Value>(text)
            .ok()
            .filter(|value| match value {
                Value::Object(map) => !map.is_empty(),
                Value::Array(items) => !items.is_empty(),
                _ => false,
            })
    };
    let mut repairs = scan.repairs.clone();
    if let Some(value) = parse(&closed) {
        repairs.push(Repair::ClosedTruncated);
        return Ok(Extracted { value, repairs });
    }

    let (len, depth) = scan.safe;
    let mut cut = scan.out[..len].to_string();
    cut.extend(scan.stack[..depth].iter().rev());
    if let Some(value) = parse(&cut) {
        repairs.push(Repair::DroppedIncompleteTail);
        return Ok(Extracted { value, repairs });
    }

    let from = chars.len().saturating_sub(SNIPPET_CHARS);
    let tail: String = chars[from..].iter().collect();
    Err(JsonFault::Unbalanced {
        snippet: snippet(&tail),
    })
}

/// [`JsonFault::Invalid`] for text that failed to parse, quoting the text around the place
/// the parser gave up (serde_json's line and column are 1-based; column counts bytes).
fn invalid(text: &str, error: &serde_json::Error) -> JsonFault {
    let message = error.to_string();
    // The position refers to the repaired text, not the model's; the quoted text shows where.
    let detail = message
        .rsplit_once(" at line ")
        .map_or(message.as_str(), |(what, _)| what)
        .to_string();
    let line_start: usize = text
        .split_inclusive('\n')
        .take(error.line().saturating_sub(1))
        .map(str::len)
        .sum();
    let mut at = (line_start + error.column().saturating_sub(1)).min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    let before: Vec<char> = text[..at].chars().rev().take(SNIPPET_CHARS / 2).collect();
    let mut near: String = before.into_iter().rev().collect();
    near.extend(text[at..].chars().take(SNIPPET_CHARS / 2));
    JsonFault::Invalid {
        detail,
        snippet: snippet(&near),
    }
}

/// At most [`SNIPPET_CHARS`] of `text`, whitespace runs folded to one space, with `…` when cut.
fn snippet(text: &str) -> String {
    let folded = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut out: String = folded.chars().take(SNIPPET_CHARS).collect();
    if folded.chars().nth(SNIPPET_CHARS).is_some() {
        out.push('…');
    }
    out
}

/// How the scan of one candidate ended.
enum End {
    /// The top-level bracket closed; the candidate is `chars[start..end]`.
    Closed(usize),
    /// The closing bracket at this position matches no open one.
    Mismatched(usize),
    /// The text ended with brackets (and perhaps a string) still open.
    Truncated {
        /// The text ended inside a string.
        in_string: bool,
    },
}

/// The result of scanning one candidate.
struct Scan {
    end: End,
    /// The candidate rewritten as strict JSON, as far as the repairs could.
    out: String,
    repairs: Vec<Repair>,
    /// The closers still owed when the text ended.
    stack: Vec<char>,
    /// The last place the candidate could be cut and closed: (length of `out`, depth).
    safe: (usize, usize),
}

/// One pass over a candidate that finds where it ends (respecting strings and escapes) and
/// rewrites it as strict JSON on the way. On valid JSON the rewrite is the identity and the
/// end is the true end, so the strict parse of the raw candidate sees the same text.
struct Scanner<'a> {
    chars: &'a [char],
    i: usize,
    out: String,
    repairs: Vec<Repair>,
    stack: Vec<char>,
    safe: (usize, usize),
}

impl<'a> Scanner<'a> {
    fn new(chars: &'a [char], start: usize) -> Self {
        Scanner {
            chars,
            i: start,
            out: String::new(),
            repairs: Vec::new(),
            stack: Vec::new(),
            safe: (0, 0),
        }
    }

    fn note(&mut self, repair: Repair) {
        if !self.repairs.contains(&repair) {
            self.repairs.push(repair);
        }
    }

    fn at(&self, i: usize) -> Option<char> {
        self.chars.get(i).copied()
    }

    fn finish(self, end: End) -> Scan {
        Scan {
            end,
            out: self.out,
            repairs: self.repairs,
            stack: self.stack,
            safe: self.safe,
        }
    }

    fn run(mut self) -> Scan {
        while let Some(c) = self.at(self.i) {
            match c {
                '{' | '[' => {
                    self.stack.push(if c == '{' { '}' } else { ']' });
                    self.out.push(c);
                    self.i += 1;
                    self.safe = (self.out.len(), self.stack.len());
                }
                '}' | ']' => {
                    if self.stack.last() != Some(&c) {
                        if !self.stack.contains(&c) {
                            let at = self.i;
                            return self.finish(End::Mismatched(at));
                        }
                        // `{"a": [1, 2}`: close the inner brackets the model skipped.
                        while let Some(&owed) = self.stack.last().filter(|&&o| o != c) {
                            self.out.push(owed);
                            self.stack.pop();
                        }
                        self.note(Repair::MissingBrackets);
                    }
                    self.stack.pop();
                    self.out.push(c);
                    self.i += 1;
                    if self.stack.is_empty() {
                        let end = self.i;
                        return self.finish(End::Closed(end));
                    }
                    self.safe = (self.out.len(), self.stack.len());
                }
                '"' => {
                    if !self.string(&['"'], None) {
                        return self.finish(End::Truncated { in_string: true });
                    }
                }
                '\'' => {
                    if !self.string(&['\''], Some(Repair::SingleQuotes)) {
                        return self.finish(End::Truncated { in_string: true });
                    }
                }
                '‘' | '’' => {
                    if !self.string(&['’', '‘'], Some(Repair::SmartQuotes)) {
                        return self.finish(End::Truncated { in_string: true });
                    }
                }
                '“' | '”' | '„' => {
                    if !self.string(&['”', '“'], Some(Repair::SmartQuotes)) {
                        return self.finish(End::Truncated { in_string: true });
                    }
                }
                '/' if matches!(self.at(self.i + 1), Some('/' | '*')) => {
                    self.i = self.skip_comment(self.i);
                    self.note(Repair::Comments);
                }
                ',' => {
                    match self.next_significant(self.i + 1) {
                        Some('}' | ']') => self.note(Repair::TrailingComma),
                        // At the end of the text the truncation repair decides.
                        None => {}
                        Some(_) => {
                            self.safe = (self.out.len(), self.stack.len());
                            self.out.push(',');
                        }
                    }
                    self.i += 1;
                }
                c if c.is_alphabetic() || c == '_' || c == '$' => self.word(),
                c => {
                    self.out.push(c);
                    self.i += 1;
                }
            }
        }
        self.finish(End::Truncated { in_string: false })
    }

    /// Past the comment starting at `i` (`//` to the end of the line, `/*` to `*/`).
    fn skip_comment(&self, i: usize) -> usize {
        let mut j = i + 2;
        if self.at(i + 1) == Some('/') {
            while self.at(j).is_some_and(|c| c != '\n') {
                j += 1;
            }
            return j;
        }
        while let Some(c) = self.at(j) {
            if c == '*' && self.at(j + 1) == Some('/') {
                return j + 2;
            }
            j += 1;
        }
        j
    }

    /// The first character from `i` on that is not whitespace or inside a comment.
    fn next_significant(&self, mut i: usize) -> Option<char> {
        loop {
            match self.at(i)? {
                c if c.is_whitespace() => i += 1,
                '/' if matches!(self.at(i + 1), Some('/' | '*')) => i = self.skip_comment(i),
                c => return Some(c),
            }
        }
    }

    /// Whether a quote at `i - 1` can end a string: what follows it (after whitespace) is the
    /// end of the text, `,` `:` `}` `]`, or a comment. Always true in valid JSON, which is
    /// why it is safe; it lets `'don't'` and `"say "hi" now"` keep their inner quotes.
    fn ends_string(&self, mut i: usize) -> bool {
        while self.at(i).is_some_and(char::is_whitespace) {
            i += 1;
        }
        match self.at(i) {
            None | Some(',' | ':' | '}' | ']') => true,
            Some('/') => matches!(self.at(i + 1), Some('/' | '*')),
            Some(_) => false,
        }
    }

    /// Copies the string opening at `self.i` as a double-quoted JSON string. `closers` are
    /// the quotes that may end it; `conversion` is the repair its delimiters need (`None` for
    /// an ordinary `"` string). Returns false when the text ends inside the string.
    fn string(&mut self, closers: &[char], conversion: Option<Repair>) -> bool {
        if let Some(repair) = conversion {
            self.note(repair);
        }
        self.out.push('"');
        self.i += 1;
        while let Some(c) = self.at(self.i) {
            if closers.contains(&c) {
                if self.ends_string(self.i + 1) {
                    self.out.push('"');
                    self.i += 1;
                    return true;
                }
                if conversion.is_none() {
                    self.note(Repair::UnescapedQuotes);
                }
            }
            match c {
                '\\' => self.escape(conversion.is_some()),
                '"' => {
                    self.out.push_str("\\\"");
                    self.i += 1;
                }
                c if (c as u32) < 0x20 => {
                    self.note(Repair::ControlCharacters);
                    match c {
                        '\n' => self.out.push_str("\\n"),
                        '\r' => self.out.push_str("\\r"),
                        '\t' => self.out.push_str("\\t"),
                        c => self.out.push_str(&format!("\\u{:04x}", c as u32)),
                    }
                    self.i += 1;
                }
                c => {
                    self.out.push(c);
                    self.i += 1;
                }
            }
        }
        false
    }

    /// Copies the escape at `self.i` (a backslash), mending the ones JSON lacks: `\'` becomes
    /// `'`, and a backslash before anything else is kept as a literal backslash.
    fn escape(&mut self, single_quoted: bool) {
        let is_hex = |c: Option<char>| c.is_some_and(|c| c.is_ascii_hexdigit());
        match self.at(self.i + 1) {
            None => self.i += 1,
            Some(c @ ('"' | '\\' | '/' | 'b' | 'f' | 'n' | 'r' | 't')) => {
                self.out.push('\\');
                self.out.push(c);
                self.i += 2;
            }
            Some('u') if (2..6).all(|k| is_hex(self.at(self.i + k))) => {
                self.out.extend(&self.chars[self.i..self.i + 6]);
                self.i += 6;
            }
            Some('\'') => {
                if !single_quoted {
                    self.note(Repair::BadEscapes);
                }
                self.out.push('\'');
                self.i += 2;
            }
            Some(_) => {
                self.note(Repair::BadEscapes);
                self.out.push_str("\\\\");
                self.i += 1;
            }
        }
    }

    /// A bare word: a key missing its quotes, a Python literal, or a JSON literal (copied).
    fn word(&mut self) {
        let start = self.i;
        while self
            .at(self.i)
            .is_some_and(|c| c.is_alphanumeric() || matches!(c, '_' | '$' | '-'))
        {
            self.i += 1;
        }
        let word: String = self.chars[start..self.i].iter().collect();
        let is_key = {
            let mut j = self.i;
            while self.at(j).is_some_and(char::is_whitespace) {
                j += 1;
            }
            self.at(j) == Some(':')
        };
        // Mend only where a key or a value can start, so `1e5` (seen here as `e5`) and the
        // `http` of an unquoted `http://…` value are left alone for the parser to refuse.
        let before = self.out.trim_end().chars().next_back();
        if is_key && matches!(before, Some('{' | ',')) {
            self.note(Repair::UnquotedKeys);
            self.out.push('"');
            self.out.push_str(&word);
            self.out.push('"');
            return;
        }
        let literal = match word.as_str() {
            "True" => Some("true"),
            "False" => Some("false"),
            "None" => Some("null"),
            _ => None,
        };
        match literal {
            Some(literal) if matches!(before, Some(':' | ',' | '[')) => {
                self.note(Repair::PythonLiterals);
                self.out.push_str(literal);
            }
            _ => self.out.push_str(&word),
        }
    }
}

/// The judge's verdict on one record of the batch.
#[derive(Debug, Clone, PartialEq)]
pub struct JudgeVerdict {
    /// The record's position in the batch sent to the judge.
    pub index: usize,
    /// Long-term importance, 0 to [`SCORE_MAX`].
    pub importance: f32,
    /// How reusable the record is beyond its session, 0 to [`SCORE_MAX`].
    pub reusability: f32,
    /// The judge's short reason, trimmed (empty when it gave none).
    pub reason: String,
}

/// Checks a judge answer for a batch of `expected` records and returns one verdict per
/// index `0..expected`, in index order.
///
/// Accepted shapes: `{"items": [{"index": 0, "importance": 7, "reusability": 3, "reason":
/// "…"}, …]}`, a bare array of items, or a single item object for a batch of one. Scores may
/// be integers, floats or numeric strings (`"7"`). Nothing is clamped: a score outside 0 to
/// 10, an index out of range, a duplicate or a missing index is a fault naming the item.
pub fn judge_answer(value: &Value, expected: usize) -> Result<Vec<JudgeVerdict>, JsonFault> {
    const SHAPE: &str = "answer {\"items\": [{\"index\": 0, \"importance\": 0-10, \
                         \"reusability\": 0-10, \"reason\": \"...\"}]}";
    let items: &[Value] = match value {
        Value::Array(items) => items,
        Value::Object(map) => match map.get("items") {
            Some(Value::Array(items)) => items,
            Some(other) => {
                let problem = format!("is {}, not an array; {SHAPE}", describe(other));
                return Err(schema("items", problem));
            }
            None if map.contains_key("index") => std::slice::from_ref(value),
            None => return Err(schema("answer", format!("has no \"items\" array; {SHAPE}"))),
        },
        other => {
            let problem = format!("is {}, not an object; {SHAPE}", describe(other));
            return Err(schema("answer", problem));
        }
    };
    let wanted = match expected {
        0 => "no items were asked for".to_string(),
        n => format!("give exactly one item per index 0 to {}", n - 1),
    };

    let mut verdicts = BTreeMap::new();
    for (position, item) in items.iter().enumerate() {
        let path = format!("items[{position}]");
        let Some(fields) = item.as_object() else {
            let problem = format!("is {}, not an object; {SHAPE}", describe(item));
            return Err(schema(path, problem));
        };
        let index = match fields.get("index") {
            None => return Err(schema(path, format!("has no \"index\"; {wanted}"))),
            Some(v) => whole_number(v).ok_or_else(|| {
                let problem = format!("index {} is not a whole number; {wanted}", describe(v));
                schema(&path, problem)
            })?,
        };
        if index >= expected {
            let problem = format!("index {index} is out of range; {wanted}");
            return Err(schema(path, problem));
        }
        let path = format!("items[{position}] (index {index})");
        let importance = score(fields, "importance", &path)?;
        let reusability = score(fields, "reusability", &path)?;
        let reason = match fields.get("reason") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(reason)) => reason.trim().to_string(),
            Some(other) => {
                let problem = format!("reason is {}, not a string", describe(other));
                return Err(schema(path, problem));
            }
        };
        let verdict = JudgeVerdict {
            index,
            importance,
            reusability,
            reason,
        };
        if verdicts.insert(index, verdict).is_some() {
            let problem = format!("index {index} appears twice; {wanted}");
            return Err(schema(path, problem));
        }
    }
    if verdicts.len() < expected {
        // Stops after a few, so a caller passing a huge `expected` cannot make this loop long.
        let missing: Vec<String> = (0..expected)
            .filter(|i| !verdicts.contains_key(i))
            .take(5)
            .map(|i| i.to_string())
            .collect();
        let problem = format!("no verdict for index {}; {wanted}", missing.join(", "));
        return Err(schema("items", problem));
    }
    Ok(verdicts.into_values().collect())
}

/// A score field of a judge item: a number or a numeric string, finite, 0 to [`SCORE_MAX`].
fn score(
    fields: &serde_json::Map<String, Value>,
    name: &str,
    path: &str,
) -> Result<f32, JsonFault> {
    let range = format!("give a number from 0 to {SCORE_MAX}");
    let Some(v) = fields.get(name) else {
        return Err(schema(path, format!("has no \"{name}\"; {range}")));
    };
    let number = match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse::<f64>().ok(),
        _ => None,
    };
    match number {
        Some(n) if n.is_finite() && (0.0..=SCORE_MAX).contains(&n) => Ok(n as f32),
        Some(n) if n.is_finite() => {
            let problem = format!("{name} {} is out of range; {range}", describe(v));
            Err(schema(path, problem))
        }
        _ => {
            let problem = format!("{name} {} is not a number; {range}", describe(v));
            Err(schema(path, problem))
        }
    }
}

/// A non-negative whole number: `3`, `3.0` or `"3"`.
fn whole_number(v: &Value) -> Option<usize> {
    let n = match v {
        Value::Number(n) => match n.as_u64() {
            Some(n) => n,
            None => {
                let f = n.as_f64()?;
                // Below 2^53 every whole f64 converts exactly.
                if f.fract() != 0.0 || !(0.0..9.0e15).contains(&f) {
                    return None;
                }
                f as u64
            }
        },
        Value::String(s) => s.trim().parse::<u64>().ok()?,
        _ => return None,
    };
    usize::try_from(n).ok()
}

/// A JSON value for a fault message: its JSON text, cut to the snippet length.
fn describe(v: &Value) -> String {
    match v {
        Value::Null => "null".to_string(),
        Value::Array(_) => "an array".to_string(),
        Value::Object(_) => "an object".to_string(),
        other => snippet(&other.to_string()),
    }
}

/// What a condensed record is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CondenseKind {
    /// A summary of what happened in the window.
    Summary,
    /// A rule learned from the window, ideally phrased "When …, do …" or "Avoid …".
    Lesson,
}

impl fmt::Display for CondenseKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CondenseKind::Summary => "summary",
            CondenseKind::Lesson => "lesson",
        })
    }
}

/// The condenser's answer for one window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CondenseVerdict {
    /// Summary or lesson.
    pub kind: CondenseKind,
    /// The condensed text, trimmed, 1 to [`MAX_CONDENSED_CHARS`] characters.
    pub text: String,
    /// Positions in the window of the records the text was drawn from: sorted, distinct,
    /// never empty, each below the window's length.
    pub sources: Vec<usize>,
}

/// Checks a condenser answer `{"kind": "summary"|"lesson", "text": "…", "sources": [0, 2]}`
/// for a window of `window_len` records.
///
/// `kind` is case-insensitive and `rule` is read as `lesson`; sources may be numbers or
/// numeric strings, and repeats are merged. The text must be non-empty and at most
/// [`MAX_CONDENSED_CHARS`] characters, and every source must index the window. Whether a
/// lesson is phrased as a rule is not enforced; see [`is_rule_shaped`].
pub fn condense_answer(value: &Value, window_len: usize) -> Result<CondenseVerdict, JsonFault> {
    const SHAPE: &str = "answer {\"kind\": \"summary\" or \"lesson\", \"text\": \"...\", \
                         \"sources\": [indices]}";
    let Some(fields) = value.as_object() else {
        let problem = format!("is {}, not an object; {SHAPE}", describe(value));
        return Err(schema("answer", problem));
    };

    let kind = match fields.get("kind") {
        None => return Err(schema("kind", format!("is missing; {SHAPE}"))),
        Some(v) => match v.as_str().map(|s| s.trim().to_ascii_lowercase()).as_deref() {
            Some("summary") => CondenseKind::Summary,
            Some("lesson" | "rule") => CondenseKind::Lesson,
            _ => {
                let problem = format!("{} is not \"summary\" or \"lesson\"", describe(v));
                return Err(schema("kind", problem));
            }
        },
    };

    let text = match fields.get("text") {
        Some(Value::String(text)) => text.trim(),
        None => return Err(schema("text", format!("is missing; {SHAPE}"))),
        Some(other) => {
            let problem = format!("is {}, not a string", describe(other));
            return Err(schema("text", problem));
        }
    };
    if text.is_empty() {
        return Err(schema("text", "is empty; write the summary or lesson"));
    }
    let length = text.chars().count();
    if length > MAX_CONDENSED_CHARS {
        let problem =
            format!("is {length} characters long; keep it to at most {MAX_CONDENSED_CHARS}");
        return Err(schema("text", problem));
    }

    let range = match window_len {
        0 => "the window is empty".to_string(),
        n => format!("use indices 0 to {} of the window", n - 1),
    };
    let sources = match fields.get("sources") {
        Some(Value::Array(sources)) => sources,
        None => {
            let problem = format!("is missing; list the records the text comes from ({range})");
            return Err(schema("sources", problem));
        }
        Some(other) => {
            let problem = format!("is {}, not an array of indices; {range}", describe(other));
            return Err(schema("sources", problem));
        }
    };
    if sources.is_empty() {
        let problem = format!("is empty; list the records the text comes from ({range})");
        return Err(schema("sources", problem));
    }
    let mut indices = Vec::with_capacity(sources.len());
    for (position, source) in sources.iter().enumerate() {
        match whole_number(source) {
            Some(index) if index < window_len => indices.push(index),
            Some(index) => {
                let problem = format!("index {index} is out of range; {range}");
                return Err(schema(format!("sources[{position}]"), problem));
            }
            None => {
                let problem = format!("{} is not a whole number; {range}", describe(source));
                return Err(schema(format!("sources[{position}]"), problem));
            }
        }
    }
    indices.sort_unstable();
    indices.dedup();

    Ok(CondenseVerdict {
        kind,
        text: text.to_string(),
        sources: indices,
    })
}

/// Whether a lesson reads as a rule an agent can follow: an imperative ("Avoid …", "Never …",
/// "Always …", "Do not …", "Prefer …") or a condition followed by an instruction ("When …,
/// do …", "If …, …", "Before …, …"). Advisory: the condenser may prefer such lessons, but
/// [`condense_answer`] accepts any non-empty text.
pub fn is_rule_shaped(text: &str) -> bool {
    const IMPERATIVES: &[&str] = &[
        "avoid ", "never ", "always ", "do not ", "don't ", "don’t ", "prefer ",
    ];
    const CONDITIONS: &[&str] = &["when ", "whenever ", "if ", "before ", "after ", "once "];
    let text = text
        .trim_start_matches(|c: char| !c.is_alphanumeric())
        .to_lowercase();
    if IMPERATIVES.iter().any(|p| text.starts_with(p)) {
        return true;
    }
    CONDITIONS.iter().any(|p| {
        text.strip_prefix(p).is_some_and(|rest| {
            // The instruction after the condition: "…, do …" or "… then do …".
            let instruction = rest
                .split_once(',')
                .or_else(|| rest.split_once(" then "))
                .map(|(_, instruction)| instruction);
            instruction.is_some_and(|i| i.trim().chars().any(char::is_alphabetic))
        })
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn ok(text: &str) -> Extracted {
        extract(text).unwrap_or_else(|e| panic!("no JSON in {text:?}: {e}"))
    }

    // --- finding the JSON -------------------------------------------------------------

    #[test]
    fn correct_json_parses_with_no_repairs() {
        let found = ok(r#"{"kind":"summary","text":"ok","sources":[0,1]}"#);
        assert_eq!(found.value["sources"], json!([0, 1]));
        assert!(found.repairs.is_empty());
        assert_eq!(found.repair_note(), None);
    }

    #[test]
    fn json_in_code_fences_is_found() {
        let fenced = "Here you go:\n```json\n{\"importance\": 7}\n```\nDone.";
        assert_eq!(ok(fenced).value, json!({"importance": 7}));
        let plain = "```\n[{\"index\": 0}]\n```";
        assert_eq!(ok(plain).value, json!([{"index": 0}]));
        let one_line = "```json {\"a\": 1}```";
        assert_eq!(ok(one_line).value, json!({"a": 1}));
    }

    #[test]
    fn fenced_block_wins_over_braces_in_the_prose_before_it() {
        let text = "I considered {importance} first.\n```json\n{\"importance\": 3}\n```";
        assert_eq!(ok(text).value, json!({"importance": 3}));
    }

    #[test]
    fn json_surrounded_by_prose_is_found() {
        let text = "Sure! Here is the JSON: {\"items\": []} Hope this helps!";
        let found = ok(text);
        assert_eq!(found.value, json!({"items": []}));
        assert!(found.repairs.is_empty());
    }

    #[test]
    fn a_bom_and_whitespace_are_skipped() {
        assert_eq!(ok("\u{feff}  \n {\"a\": true}\n").value, json!({"a": true}));
    }

    #[test]
    fn think_blocks_are_skipped_even_when_they_contain_json() {
        let text = "<think>Maybe {\"importance\": 2}? No, it matters more.</think>\n\
                    {\"importance\": 8}";
        assert_eq!(ok(text).value, json!({"importance": 8}));
        // Some servers strip the opening tag and leave only the closing one.
        let text = "so the answer is 5</think>{\"importance\": 5}";
        assert_eq!(ok(text).value, json!({"importance": 5}));
        let text = "<THINKING>\nlet me see [draft]\n</THINKING>\n```json\n{\"a\": 1}\n```";
        assert_eq!(ok(text).value, json!({"a": 1}));
    }

    #[test]
    fn reasoning_with_no_answer_is_its_own_fault() {
        let fault = extract("<think>the user wants {\"a\": 1} hmm</think>\nOK.").unwrap_err();
        assert_eq!(fault, JsonFault::OnlyReasoning);
        assert!(
            fault
                .retry_prompt()
                .contains("Answer with only the JSON object")
        );
    }

    #[test]
    fn the_first_of_two_objects_wins() {
        let text = "{\"importance\": 1} and also {\"importance\": 9}";
        assert_eq!(ok(text).value, json!({"importance": 1}));
    }

    #[test]
    fn brackets_and_quotes_inside_strings_do_not_end_the_json() {
        let text = r#"{"reason": "use {x} and [y] and \"}\" here", "n": 1} trailing }"#;
        let found = ok(text);
        assert_eq!(found.value["reason"], "use {x} and [y] and \"}\" here");
        assert_eq!(found.value["n"], 1);
        assert!(found.repairs.is_empty());
    }

    #[test]
    fn a_scalar_array_in_prose_yields_to_the_object_after_it() {
        let text = "Records [0] and [1] are similar. {\"items\": [{\"index\": 0}]}";
        assert_eq!(ok(text).value, json!({"items": [{"index": 0}]}));
        // With nothing richer, the scalar array is the answer.
        assert_eq!(ok("sources: [0, 2]").value, json!([0, 2]));
    }

    #[test]
    fn prose_brackets_that_are_not_json_are_skipped() {
        let text = "[see below] The answer: {\"a\": [1, 2]}";
        assert_eq!(ok(text).value, json!({"a": [1, 2]}));
        // The apostrophe opens a single-quoted string that never closes; the search goes on.
        let text = "[it's long] The answer: {\"a\": 1}";
        assert_eq!(ok(text).value, json!({"a": 1}));
    }

    // --- repairs -------------------------------------------------------------------------

    #[test]
    fn trailing_commas_are_removed() {
        let found = ok("{\"a\": [1, 2,], \"b\": {\"c\": 3,},}");
        assert_eq!(found.value, json!({"a": [1, 2], "b": {"c": 3}}));
        assert_eq!(found.repairs, vec![Repair::TrailingComma]);
        assert_eq!(
            found.repair_note().as_deref(),
            Some("repaired: trailing comma")
        );
        // A comment between the comma and the bracket does not hide it.
        let found = ok("[1, 2, // last\n]");
        assert_eq!(found.value, json!([1, 2]));
        assert_eq!(found.repairs, vec![Repair::TrailingComma, Repair::Comments]);
    }

    #[test]
    fn single_quotes_are_converted_and_apostrophes_survive() {
        let text = r#"{'kind': 'lesson', "note": "it's fine", 'text': 'don't "quote" me'}"#;
        let found = ok(text);
        assert_eq!(
            found.value,
            json!({"kind": "lesson", "note": "it's fine", "text": "don't \"quote\" me"})
        );
        assert_eq!(found.repairs, vec![Repair::SingleQuotes]);
    }

    #[test]
    fn unquoted_keys_are_quoted() {
        let found = ok("{importance: 7, reusability: 2.5, reason_code: \"x\"}");
        assert_eq!(
            found.value,
            json!({"importance": 7, "reusability": 2.5, "reason_code": "x"})
        );
        assert_eq!(found.repairs, vec![Repair::UnquotedKeys]);
    }

    #[test]
    fn an_unquoted_url_is_refused_rather_than_cut_at_its_colon() {
        let fault = extract("{\"url\": http://example.com}").unwrap_err();
        assert!(matches!(fault, JsonFault::Unbalanced { .. }), "{fault:?}");
    }

    #[test]
    fn python_literals_become_json_literals() {
        let found = ok("{\"a\": True, \"b\": False, \"c\": None, \"d\": \"True\", \"e\": 1e5}");
        assert_eq!(
            found.value,
            json!({"a": true, "b": false, "c": null, "d": "True", "e": 1e5})
        );
        assert_eq!(found.repairs, vec![Repair::PythonLiterals]);
    }

    #[test]
    fn smart_quotes_delimit_strings() {
        let found = ok("{“kind”: “summary”, ‘text’: ‘it’s done’}");
        assert_eq!(found.value, json!({"kind": "summary", "text": "it’s done"}));
        assert_eq!(found.repairs, vec![Repair::SmartQuotes]);
        // Inside an ordinary string they are just text.
        let found = ok("{\"text\": \"she said “hi”\"}");
        assert_eq!(found.value["text"], "she said “hi”");
        assert!(found.repairs.is_empty());
    }

    #[test]
    fn comments_are_removed_but_urls_in_strings_survive() {
        let text = "{\n  // the score\n  \"importance\": 7, /* high */\n  \
                    \"url\": \"http://example.com/a\"\n}";
        let found = ok(text);
        assert_eq!(
            found.value,
            json!({"importance": 7, "url": "http://example.com/a"})
        );
        assert_eq!(found.repairs, vec![Repair::Comments]);
    }

    #[test]
    fn raw_newlines_and_bad_escapes_in_strings_are_mended() {
        let found = ok("{\"reason\": \"line one\nline two\", \"b\": \"it\\'s C:\\d\"}");
        assert_eq!(found.value["reason"], "line one\nline two");
        assert_eq!(found.value["b"], "it's C:\\d");
        assert_eq!(
            found.repairs,
            vec![Repair::ControlCharacters, Repair::BadEscapes]
        );
    }

    #[test]
    fn unescaped_quotes_inside_a_string_are_escaped() {
        let found = ok(r#"{"reason": "the user said "stop" twice", "n": 1}"#);
        assert_eq!(found.value["reason"], "the user said \"stop\" twice");
        assert_eq!(found.repairs, vec![Repair::UnescapedQuotes]);
    }

    #[test]
    fn a_closer_that_skips_an_open_bracket_closes_it() {
        let found = ok("{\"sources\": [1, 2}");
        assert_eq!(found.value, json!({"sources": [1, 2]}));
        assert_eq!(found.repairs, vec![Repair::MissingBrackets]);
    }

    #[test]
    fn several_repairs_are_reported_together_in_order() {
        let found = ok("Sure!\n```json\n{kind: 'lesson', done: True, sources: [0,],}\n```");
        assert_eq!(
            found.value,
            json!({"kind": "lesson", "done": true, "sources": [0]})
        );
        assert_eq!(
            found.repair_note().as_deref(),
            Some(
                "repaired: unquoted keys, single-quoted strings, \
                 Python literals (True/False/None), trailing comma"
            )
        );
    }

    #[test]
    fn a_truncated_answer_is_closed() {
        let found = ok("{\"items\": [{\"index\": 0, \"importance\": 7}, {\"index\": 1");
        assert_eq!(
            found.value,
            json!({"items": [{"index": 0, "importance": 7}, {"index": 1}]})
        );
        assert_eq!(found.repairs, vec![Repair::ClosedTruncated]);
        // Cut inside a string: the string is closed too.
        let found = ok("{\"text\": \"When the build fails");
        assert_eq!(found.value, json!({"text": "When the build fails"}));
        // Cut after a comma.
        assert_eq!(ok("[1, 2,").value, json!([1, 2]));
    }

    #[test]
    fn a_truncated_answer_drops_its_incomplete_last_element() {
        let found = ok("{\"items\": [{\"index\": 0, \"importance\": 7}, {\"impor");
        assert_eq!(
            found.value,
            json!({"items": [{"index": 0, "importance": 7}, {}]})
        );
        assert_eq!(found.repairs, vec![Repair::DroppedIncompleteTail]);
        let found = ok("{\"a\": 1, \"b\":");
        assert_eq!(found.value, json!({"a": 1}));
        assert_eq!(
            found.repair_note().as_deref(),
            Some("repaired: dropped an incomplete last element")
        );
    }

    // --- faults --------------------------------------------------------------------------

    #[test]
    fn no_json_is_a_fault_quoting_the_start_of_the_answer() {
        let long = "I cannot rate these records because ".repeat(10);
        let fault = extract(&long).unwrap_err();
        let JsonFault::NotFound { snippet } = &fault else {
            panic!("expected NotFound, got {fault:?}");
        };
        assert_eq!(snippet.chars().count(), SNIPPET_CHARS + 1, "{snippet}");
        assert!(snippet.starts_with("I cannot rate") && snippet.ends_with('…'));
        assert_eq!(extract(" \n\t").unwrap_err(), JsonFault::Empty);
    }

    #[test]
    fn broken_beyond_repair_is_a_fault_with_a_useful_message() {
        let text = "{\"importance\": 7 \"reusability\": high, \"reason\": \"fine\"}";
        let fault = extract(text).unwrap_err();
        let JsonFault::Invalid { detail, snippet } = &fault else {
            panic!("expected Invalid, got {fault:?}");
        };
        assert!(detail.contains("expected"), "{detail}");
        assert!(snippet.contains("reusability"), "{snippet}");
        assert!(snippet.chars().count() <= SNIPPET_CHARS + 1);
        let prompt = fault.retry_prompt();
        assert!(prompt.starts_with("Your answer was not valid JSON: the JSON is invalid"));
        assert!(
            prompt.ends_with("Answer with only the JSON object, without prose or code fences.")
        );
    }

    #[test]
    fn the_fault_quotes_at_most_120_characters_of_a_long_answer() {
        let text = format!("{{\"reason\": \"{}\", \"x\": ???}}", "word ".repeat(200));
        let fault = extract(&text).unwrap_err();
        let JsonFault::Invalid { snippet, .. } = &fault else {
            panic!("expected Invalid, got {fault:?}");
        };
        assert!(snippet.chars().count() <= SNIPPET_CHARS + 1, "{snippet}");
        assert!(
            snippet.contains("???"),
            "the snippet shows the fault: {snippet}"
        );
    }

    #[test]
    fn a_hopelessly_truncated_answer_is_unbalanced() {
        let fault = extract("Here: {\"importance").unwrap_err();
        let JsonFault::Unbalanced { snippet } = &fault else {
            panic!("expected Unbalanced, got {fault:?}");
        };
        assert_eq!(snippet, "Here: {\"importance");
        let fault = extract("{\"a\": 1]").unwrap_err();
        assert!(matches!(fault, JsonFault::Unbalanced { .. }), "{fault:?}");
    }

    // --- the judge's answer ----------------------------------------------------------------

    fn judge(text: &str, expected: usize) -> Result<Vec<JudgeVerdict>, JsonFault> {
        judge_answer(&ok(text).value, expected)
    }

    fn schema_fault(result: Result<impl fmt::Debug, JsonFault>) -> String {
        match result {
            Err(fault @ JsonFault::Schema { .. }) => fault.to_string(),
            other => panic!("expected a schema fault, got {other:?}"),
        }
    }

    #[test]
    fn a_judge_answer_gives_one_verdict_per_index_in_order() {
        let text = r#"{"items": [
            {"index": 1, "importance": 3, "reusability": 8, "reason": " generic fix "},
            {"index": 0, "importance": 7.5, "reusability": 0, "reason": "user preference"}
        ]}"#;
        let verdicts = judge(text, 2).unwrap();
        assert_eq!(
            verdicts,
            vec![
                JudgeVerdict {
                    index: 0,
                    importance: 7.5,
                    reusability: 0.0,
                    reason: "user preference".into()
                },
                JudgeVerdict {
                    index: 1,
                    importance: 3.0,
                    reusability: 8.0,
                    reason: "generic fix".into()
                },
            ]
        );
    }

    #[test]
    fn a_judge_answer_may_be_a_bare_array_or_a_single_item_with_string_numbers() {
        let bare = r#"[{"index": "0", "importance": "7", "reusability": " 2.5 "}]"#;
        let verdicts = judge(bare, 1).unwrap();
        assert_eq!(
            (verdicts[0].importance, verdicts[0].reusability),
            (7.0, 2.5)
        );
        assert_eq!(verdicts[0].reason, "");
        let single = r#"{"index": 0.0, "importance": 10, "reusability": 0}"#;
        assert_eq!(judge(single, 1).unwrap()[0].importance, 10.0);
    }

    #[test]
    fn a_judge_answer_missing_an_index_names_it() {
        let text = r#"{"items": [{"index": 0, "importance": 1, "reusability": 1},
                                 {"index": 2, "importance": 1, "reusability": 1}]}"#;
        let message = schema_fault(judge(text, 4));
        assert_eq!(
            message,
            "items: no verdict for index 1, 3; give exactly one item per index 0 to 3"
        );
    }

    #[test]
    fn a_judge_answer_with_a_duplicate_or_foreign_index_names_it() {
        let text = r#"[{"index": 0, "importance": 1, "reusability": 1},
                       {"index": 0, "importance": 2, "reusability": 2}]"#;
        let message = schema_fault(judge(text, 2));
        assert!(
            message.starts_with("items[1] (index 0): index 0 appears twice"),
            "{message}"
        );
        let text = r#"[{"index": 5, "importance": 1, "reusability": 1}]"#;
        let message = schema_fault(judge(text, 2));
        assert!(message.contains("index 5 is out of range"), "{message}");
        let text = r#"[{"index": -1, "importance": 1, "reusability": 1}]"#;
        let message = schema_fault(judge(text, 2));
        assert!(
            message.contains("index -1 is not a whole number"),
            "{message}"
        );
    }

    #[test]
    fn out_of_range_or_non_numeric_scores_are_faults_not_clamped() {
        let text = r#"[{"index": 0, "importance": 12, "reusability": 1}]"#;
        assert_eq!(
            schema_fault(judge(text, 1)),
            "items[0] (index 0): importance 12 is out of range; give a number from 0 to 10"
        );
        let text = r#"[{"index": 0, "importance": 5, "reusability": -0.5}]"#;
        let message = schema_fault(judge(text, 1));
        assert!(
            message.contains("reusability -0.5 is out of range"),
            "{message}"
        );
        let text = r#"[{"index": 0, "importance": "high", "reusability": 1}]"#;
        let message = schema_fault(judge(text, 1));
        assert!(
            message.contains("importance \"high\" is not a number"),
            "{message}"
        );
        let text = r#"[{"index": 0, "importance": "NaN", "reusability": 1}]"#;
        assert!(schema_fault(judge(text, 1)).contains("is not a number"));
        let text = r#"[{"index": 0, "importance": 5}]"#;
        assert!(schema_fault(judge(text, 1)).contains("has no \"reusability\""));
    }

    #[test]
    fn a_judge_answer_of_the_wrong_shape_says_what_to_send() {
        let fault = judge_answer(&json!({"scores": [1, 2]}), 2).unwrap_err();
        assert!(!fault.is_syntax());
        assert!(
            fault.to_string().contains("has no \"items\" array"),
            "{fault}"
        );
        assert!(
            fault
                .retry_prompt()
                .contains("did not have the requested shape")
        );
        let message = schema_fault(judge_answer(&json!({"items": "none"}), 1));
        assert!(message.contains("not an array"), "{message}");
        let message = schema_fault(judge_answer(&json!([3]), 1));
        assert!(
            message.starts_with("items[0]: is 3, not an object"),
            "{message}"
        );
        assert_eq!(judge_answer(&json!({"items": []}), 0).unwrap(), vec![]);
    }

    #[test]
    fn a_messy_local_model_answer_reads_end_to_end() {
        let text = "<think>Record 0 is a preference; record 1 is chatter.</think>\n\
                    Sure! Here are the scores:\n```json\n{items: [\n  \
                    {index: 0, importance: '8', reusability: 6, reason: 'user's preference',},\n  \
                    {index: 1, importance: 1, reusability: 0, reason: None}, // chatter\n]}\n```";
        let found = ok(text);
        let verdicts = judge_answer(&found.value, 2).unwrap();
        assert_eq!(verdicts[0].importance, 8.0);
        assert_eq!(verdicts[0].reason, "user's preference");
        assert_eq!(verdicts[1].reason, "");
        assert!(found.repairs.contains(&Repair::TrailingComma));
    }

    // --- the condenser's answer --------------------------------------------------------------

    #[test]
    fn a_condenser_answer_reads_kind_text_and_sources() {
        let value = json!({"kind": "Lesson", "text": " When tests hang, check the timeout. ",
                           "sources": [2, "0", 2]});
        let verdict = condense_answer(&value, 3).unwrap();
        assert_eq!(
            verdict,
            CondenseVerdict {
                kind: CondenseKind::Lesson,
                text: "When tests hang, check the timeout.".into(),
                sources: vec![0, 2],
            }
        );
        let value = json!({"kind": "rule", "text": "Avoid sudo.", "sources": [0]});
        assert_eq!(
            condense_answer(&value, 1).unwrap().kind,
            CondenseKind::Lesson
        );
        let value = json!({"kind": "summary", "text": "Deployed.", "sources": [0]});
        assert_eq!(
            condense_answer(&value, 1).unwrap().kind.to_string(),
            "summary"
        );
    }

    #[test]
    fn a_condenser_answer_with_bad_sources_names_them() {
        let value = json!({"kind": "summary", "text": "x", "sources": [0, 7]});
        assert_eq!(
            schema_fault(condense_answer(&value, 3)),
            "sources[1]: index 7 is out of range; use indices 0 to 2 of the window"
        );
        let value = json!({"kind": "summary", "text": "x", "sources": [0, "two"]});
        let message = schema_fault(condense_answer(&value, 3));
        assert!(
            message.starts_with("sources[1]: \"two\" is not a whole number"),
            "{message}"
        );
        let value = json!({"kind": "summary", "text": "x", "sources": []});
        assert!(schema_fault(condense_answer(&value, 3)).starts_with("sources: is empty"));
        let value = json!({"kind": "summary", "text": "x"});
        assert!(schema_fault(condense_answer(&value, 3)).starts_with("sources: is missing"));
        let value = json!({"kind": "summary", "text": "x", "sources": 1});
        assert!(schema_fault(condense_answer(&value, 3)).contains("not an array"));
    }

    #[test]
    fn a_condenser_answer_needs_a_kind_and_a_sensible_text() {
        let value = json!({"kind": "story", "text": "x", "sources": [0]});
        assert_eq!(
            schema_fault(condense_answer(&value, 1)),
            "kind: \"story\" is not \"summary\" or \"lesson\""
        );
        let value = json!({"kind": "summary", "text": "  ", "sources": [0]});
        assert!(schema_fault(condense_answer(&value, 1)).starts_with("text: is empty"));
        let value = json!({"kind": "summary", "text": "é".repeat(2001), "sources": [0]});
        assert_eq!(
            schema_fault(condense_answer(&value, 1)),
            "text: is 2001 characters long; keep it to at most 2000"
        );
        let value = json!({"kind": "summary", "text": "é".repeat(2000), "sources": [0]});
        assert!(condense_answer(&value, 1).is_ok());
        let message = schema_fault(condense_answer(&json!([1]), 1));
        assert!(
            message.starts_with("answer: is an array, not an object"),
            "{message}"
        );
    }

    #[test]
    fn rule_shaped_lessons_are_recognised() {
        for rule in [
            "When the build fails on CI, rerun it with --verbose.",
            "Avoid force-pushing to main.",
            "  \"Never log the API key.",
            "If the user asks for tea, offer green tea first.",
            "Don't retry a 400.",
            "when deploying then tag the release",
        ] {
            assert!(is_rule_shaped(rule), "{rule}");
        }
        for prose in [
            "The user deployed the service twice.",
            "When the build failed.",
            "When it rains,",
            "",
            "Avoidance of conflict was discussed.",
        ] {
            assert!(!is_rule_shaped(prose), "{prose}");
        }
    }

    // --- never panic ---------------------------------------------------------------------------

    const VALID_ANSWERS: &[&str] = &[
        r#"{"items":[{"index":0,"importance":7,"reusability":3,"reason":"it's a preference"},{"index":1,"importance":"2","reusability":0.5,"reason":"chatter"}]}"#,
        r#"```json
{"kind":"lesson","text":"When tests hang, check the timeout.","sources":[0,2]}
```"#,
        "<think>hmm</think>{'kind': 'summary', text: “done”, sources: [0,], ok: True} // end",
    ];

    /// Applies `edits` (position, operation, character) to `text`: delete, insert, replace,
    /// or cut the text there — the ways a model's answer gets mangled.
    fn mutate(text: &str, edits: &[(usize, u8, char)]) -> String {
        let mut chars: Vec<char> = text.chars().collect();
        for &(position, op, c) in edits {
            let at = position % (chars.len() + 1);
            match op % 4 {
                0 if at < chars.len() => {
                    chars.remove(at);
                }
                1 => chars.insert(at, c),
                2 if at < chars.len() => chars[at] = c,
                _ => chars.truncate(at.max(chars.len() / 2)),
            }
        }
        chars.into_iter().collect()
    }

    fn exercise(text: &str) {
        match extract(text) {
            Ok(found) => {
                let _ = judge_answer(&found.value, 2);
                let _ = judge_answer(&found.value, usize::MAX);
                let _ = condense_answer(&found.value, 3);
                let _ = found.repair_note();
            }
            Err(fault) => {
                let _ = fault.retry_prompt();
            }
        }
        let _ = is_rule_shaped(text);
    }

    proptest::proptest! {
        /// Arbitrary text, including any Unicode: extract and the validators return.
        #[test]
        fn arbitrary_text_never_panics(text in "\\PC{0,200}") {
            exercise(&text);
        }

        /// Text made of JSON's own punctuation, quotes of every kind, comments and literals.
        #[test]
        fn json_like_text_never_panics(
            text in "([{}\\[\\]\"',:/*\\\\ \n0-9a-z“”‘’`<>-]|True|None|think|```|\\\\u){0,120}"
        ) {
            exercise(&text);
        }

        /// Valid answers with random deletions, insertions, replacements and truncations.
        #[test]
        fn mutated_valid_answers_never_panic(
            which in 0..VALID_ANSWERS.len(),
            edits in proptest::collection::vec(
                (0usize..400, 0u8..4, proptest::char::any()), 0..8),
        ) {
            exercise(&mutate(VALID_ANSWERS[which], &edits));
        }
    }

    #[test]
    fn the_valid_answers_used_for_mutation_are_valid() {
        assert_eq!(
            judge_answer(&ok(VALID_ANSWERS[0]).value, 2).unwrap().len(),
            2
        );
        for text in &VALID_ANSWERS[1..] {
            condense_answer(&ok(text).value, 3).unwrap();
        }
    }
}
