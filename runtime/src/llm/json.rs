//! Reading JSON out of a model's answer, for the LLM judge and the condenser. Local models
//! wrap their JSON in prose, Markdown fences and `<think>` blocks, and
//! get its syntax a little wrong; this module finds the JSON the model meant ([`extract`]),
//! and repairs the common faults while saying which ones it repaired ([`Repair`]). Each
//! answer's shape is checked where it is asked for (`judge::judge_answer`,
//! `condense::condense_answer`), with the fault type and the small readers here.
//!
//! It is pure and synchronous — no I/O, no clock, no logging — so the provider, the audit log
//! and the retry loop decide what to do with a [`JsonFault`]; its message is short and quotes
//! at most about 120 characters of the answer, so it can be shown back to the model
//! ([`JsonFault::retry_prompt`]). Repairs change syntax only: no value is ever guessed.
//! Nothing here may panic on any input; a proptest (in `llm`'s tests, with the answers'
//! readers) feeds it arbitrary and mutated answers.

use std::fmt;

use serde_json::Value;

/// Most characters of the model's answer a fault message quotes.
const SNIPPET_CHARS: usize = 120;

/// How many times the search for JSON may start again inside a candidate that ran to the
/// end of the answer without closing.
const MAX_RESTARTS: usize = 8;

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

pub(super) fn shape_fault(path: impl Into<String>, problem: impl Into<String>) -> JsonFault {
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

/// A non-negative whole number: `3`, `3.0` or `"3"`.
pub(super) fn whole_number(v: &Value) -> Option<usize> {
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
pub(super) fn describe(v: &Value) -> String {
    match v {
        Value::Null => "null".to_string(),
        Value::Array(_) => "an array".to_string(),
        Value::Object(_) => "an object".to_string(),
        other => snippet(&other.to_string()),
    }
}

#[cfg(test)]
pub(super) mod tests {
    use serde_json::json;

    use super::*;

    pub(in crate::llm) fn ok(text: &str) -> Extracted {
        extract(text).unwrap_or_else(|e| panic!("no JSON in {text:?}: {e}"))
    }

    pub(in crate::llm) fn schema_fault(result: Result<impl fmt::Debug, JsonFault>) -> String {
        match result {
            Err(fault @ JsonFault::Schema { .. }) => fault.to_string(),
            other => panic!("expected a schema fault, got {other:?}"),
        }
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
}
