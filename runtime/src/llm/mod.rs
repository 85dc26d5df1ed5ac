//! The `[llm]` section of the server configuration (docs/configuration.md): which chat-completions
//! endpoint judges importance and condenses windows when the policy asks for `llm` or
//! `hybrid` evaluation. This module holds the section's shape and its validation, so a
//! config file is checked, with every mistake named, when the server starts; the provider
//! that speaks to the endpoint plugs into the judge seam of [`crate::Substrate::evaluate`].
//!
//! Submodules: [`json`] (reading JSON out of a model's answer: fences, stray prose, common
//! faults repaired), [`chat`] (the chat-completions client over the provider transport:
//! timeouts, retries, backoff), [`cost`] (the gateway shared by judge and condenser: per-namespace token budget
//! and counters) and [`judge`] (the LLM judge of `[evaluation] mode = "llm"` / `"hybrid"`,
//! with its cache and semantic reuse).

pub mod chat;
pub mod condense;
pub mod cost;
pub mod json;
pub mod judge;
#[cfg(test)]
mod script;
pub mod updates;

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Who answers the judge's and the condenser's prompts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LlmKind {
    /// No model: rules score importance and condensation is extractive.
    #[default]
    None,
    /// Any OpenAI-compatible chat-completions endpoint (OpenAI, Ollama, vLLM, LM Studio).
    Openai,
}

/// The `[llm]` section. Every key is optional; an absent section is `kind = "none"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LlmConfig {
    /// `none` (default) or `openai`.
    pub kind: LlmKind,
    /// `openai`: the API root, e.g. `http://127.0.0.1:11434/v1`.
    pub base_url: Option<String>,
    /// `openai`: the model name (required for `openai`).
    pub model: Option<String>,
    /// Name of the environment variable holding the API key (the key itself never appears
    /// in a file or a log). Default `OPENAI_API_KEY`.
    pub api_key_env: String,
    /// Per-request timeout, a human duration (`"30s"`). Default `"30s"`.
    pub timeout: String,
    /// Requests in flight at once. Default 4.
    pub max_concurrency: usize,
    /// Retries after a timeout, 429, 5xx or connection error, with exponential backoff and
    /// jitter (a 429's `Retry-After` is honoured), 0 to 10. Default 3.
    pub max_retries: u32,
    /// Records per judge request. Default 24: a verdict is ~30 answer tokens and a record
    /// ~40 prompt tokens, so a request stays near 1k tokens each way, within any current
    /// model's context, while 1,000 events cost ~40 requests (measured by `llm_load`).
    pub batch_size: usize,
    /// How long a part-filled batch waits for more records before it is sent anyway, a
    /// human duration. Default `"2s"`; `"0s"` sends at once.
    pub batch_wait: String,
    /// Tokens one namespace may spend per hour; over it, rules and extractive condensation
    /// take over until the hour turns. Default 200,000; 0 means no limit.
    pub tokens_per_hour: u64,
    /// Texts whose judgement is remembered, so the same text is never judged twice.
    /// Default 100,000; 0 turns the cache off.
    pub cache_entries: usize,
    /// Cosine similarity at or above which a record reuses a near-duplicate's judgement
    /// instead of a call, 0.5 to 1. Default 0.9; 1 leaves only exact duplicates.
    pub reuse_similarity: f32,
}

impl Default for LlmConfig {
    fn default() -> Self {
        LlmConfig {
            kind: LlmKind::None,
            base_url: None,
            model: None,
            api_key_env: "OPENAI_API_KEY".into(),
            timeout: "30s".into(),
            max_concurrency: 4,
            max_retries: chat::ChatClient::DEFAULT_MAX_RETRIES,
            batch_size: 24,
            batch_wait: "2s".into(),
            tokens_per_hour: 200_000,
            cache_entries: 100_000,
            reuse_similarity: 0.9,
        }
    }
}

impl LlmConfig {
    /// Checks every key, naming each mistake and how to fix it (all of them, not the first).
    pub fn validate(&self) -> Result<()> {
        let mut problems = Vec::new();
        if let Err(reason) = crate::provider::parse_timeout(&self.timeout) {
            problems.push(format!("timeout = {:?}: {reason}", self.timeout));
        }
        if self.max_concurrency == 0 {
            problems.push("max_concurrency must be at least 1".to_string());
        }
        match self.batch_wait() {
            Ok(wait) if wait > Duration::from_secs(600) => problems.push(format!(
                "batch_wait = {:?} is too long; use at most \"10m\"",
                self.batch_wait
            )),
            Ok(_) => {}
            Err(_) => problems.push(format!(
                "batch_wait = {:?} is not a duration; write e.g. \"2s\" or \"0s\"",
                self.batch_wait
            )),
        }
        if self.max_retries > chat::ChatClient::MAX_RETRIES {
            problems.push(format!(
                "max_retries = {} is out of range; use 0 to {}",
                self.max_retries,
                chat::ChatClient::MAX_RETRIES
            ));
        }
        if !(1..=256).contains(&self.batch_size) {
            problems.push(format!(
                "batch_size = {} is out of range; use 1 to 256 records per request",
                self.batch_size
            ));
        }
        if !(0.5..=1.0).contains(&self.reuse_similarity) {
            problems.push(format!(
                "reuse_similarity = {} is out of range; use 0.5 to 1 (1 reuses only exact \
                 duplicates' judgements)",
                self.reuse_similarity
            ));
        }
        if self.kind == LlmKind::Openai {
            match self.base_url.as_deref() {
                None => problems.push(
                    "kind = \"openai\" needs base_url, e.g. \"http://127.0.0.1:11434/v1\""
                        .to_string(),
                ),
                Some(url) => {
                    if let Some(problem) = crate::provider::base_url_problem(url.trim()) {
                        problems.push(format!("base_url: {problem}"));
                    }
                }
            }
            if self.model.as_deref().is_none_or(|m| m.trim().is_empty()) {
                problems.push(
                    "kind = \"openai\" needs model, e.g. \"qwen2.5:7b-instruct\"".to_string(),
                );
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(Error::invalid("[llm]", problems.join("; ")))
        }
    }

    /// The judge's cache and reuse settings.
    pub fn judge_options(&self) -> judge::JudgeOptions {
        judge::JudgeOptions {
            batch_size: self.batch_size,
            cache_entries: self.cache_entries,
            reuse_similarity: (self.reuse_similarity < 1.0).then_some(self.reuse_similarity),
        }
    }

    /// How long a part-filled batch waits.
    pub fn batch_wait(&self) -> Result<Duration> {
        humantime::parse_duration(&self.batch_wait).map_err(|e| {
            Error::invalid(
                "[llm] batch_wait",
                format!("{:?}: {e}; write e.g. \"2s\"", self.batch_wait),
            )
        })
    }

    /// The per-request timeout.
    pub fn timeout(&self) -> Result<Duration> {
        crate::provider::timeout("llm.timeout", &self.timeout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::condense::{condense_answer, is_rule_shaped};
    use crate::llm::json::{extract, tests::ok};
    use crate::llm::judge::judge_answer;

    #[test]
    fn the_default_is_no_model_and_valid() {
        let c = LlmConfig::default();
        assert_eq!(c.kind, LlmKind::None);
        c.validate().unwrap();
        assert_eq!(c.timeout().unwrap(), Duration::from_secs(30));
    }

    #[test]
    fn every_mistake_is_named_at_once() {
        let c = LlmConfig {
            kind: LlmKind::Openai,
            base_url: Some("127.0.0.1:11434".into()),
            timeout: "soon".into(),
            batch_size: 0,
            ..LlmConfig::default()
        };
        let err = c.validate().unwrap_err().to_string();
        for part in ["timeout", "batch_size", "base_url", "needs model"] {
            assert!(err.contains(part), "`{part}` missing from: {err}");
        }
    }

    #[test]
    fn unknown_keys_are_refused() {
        let err =
            serde_json::from_str::<LlmConfig>(r#"{"kind":"openai","modle":"x"}"#).unwrap_err();
        assert!(err.to_string().contains("modle"), "{err}");
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
