//! The LLM condenser: the [`Summarizer`] of `[condensation] mode = "llm"` on an [`Llm`].
//! One request turns a session's window into one condensed record: a summary of what
//! happened, or a lesson phrased as a rule an agent can follow ("When …, do …", "Avoid …"),
//! with the positions of the records it draws on.
//!
//! The answer is read like the judge's ([`super::json`]): repaired where it can be, asked
//! for once more with the fault shown where it cannot — including a "lesson" that is not
//! phrased as a rule. A second lesson that is still not rule-shaped is kept as a summary
//! (it says something true, just not something to follow). Any other failure — the
//! provider's, the budget's, an unusable second answer — is an error, and
//! [`crate::Substrate::condense_with`] keeps the extractive text with the reason in the audit log.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::json;

use super::chat::ChatRequest;
use super::cost::{Counters, Llm};
use std::fmt;

use serde_json::Value;

use super::json::{self, JsonFault, describe, shape_fault, whole_number};
use crate::engine::{Summarizer, Summary, SummaryRequest};
use crate::error::{Error, Result};
use crate::model::MemoryRecord;

/// What the condenser is told about writing, unless the policy's `[condensation] prompt`
/// says otherwise.
pub const GUIDANCE: &str = "You condense a window of an AI agent's memories (numbered, \
oldest first) into one long-term memory. If the window shows something that worked or \
failed and would help again, write a lesson phrased as a rule: \"When <situation>, <do \
this>.\" or \"Avoid <this> because <why>.\" Otherwise write a short factual summary of what \
happened, keeping names, numbers, dates and decisions. At most 3 sentences.";

/// How the answer must look; always appended, so a policy's guidance cannot break parsing.
pub const ANSWER_FORMAT: &str = "Answer with only a JSON object: {\"kind\": \"summary\" or \
\"lesson\", \"text\": \"...\", \"sources\": [indices of the records the text draws on]}.";

/// Characters of the whole window put in the prompt; each record gets an equal share (at
/// least [`MIN_ITEM_CHARS`]), so a long window is still seen whole.
const WINDOW_CHARS: usize = 16_000;
const MIN_ITEM_CHARS: usize = 160;

/// Answer tokens: a few sentences of text plus the sources.
const MAX_ANSWER_TOKENS: u32 = 600;

/// The condenser on an OpenAI-compatible chat endpoint.
#[derive(Debug)]
pub struct LlmCondenser {
    llm: Arc<Llm>,
    name: String,
}

impl LlmCondenser {
    /// A condenser asking `llm`'s model; its audit name is `llm:<model>`.
    pub fn new(llm: Arc<Llm>) -> Self {
        let name = format!("llm:{}", llm.model());
        LlmCondenser { llm, name }
    }

    fn request(
        &self,
        instructions: Option<&str>,
        window: &[MemoryRecord],
        fault: Option<&str>,
    ) -> ChatRequest {
        let share = (WINDOW_CHARS / window.len().max(1)).max(MIN_ITEM_CHARS);
        let mut user = String::from("Window:\n");
        for (i, r) in window.iter().enumerate() {
            let text: String = r.text.chars().take(share).collect();
            let cut = if text.len() < r.text.len() { "…" } else { "" };
            user.push_str(&format!("{i}. [{}] {text}{cut}\n", r.kind.as_str()));
        }
        if let Some(fault) = fault {
            user.push('\n');
            user.push_str(fault);
        }
        let system = format!("{}\n\n{ANSWER_FORMAT}", instructions.unwrap_or(GUIDANCE));
        ChatRequest::new(system, user)
            .with_schema("condensed_memory", schema(window.len()))
            .with_max_tokens(MAX_ANSWER_TOKENS)
    }

    async fn ask(&self, request: &SummaryRequest<'_>) -> Result<Summary> {
        let window = request.window;
        let (namespace, now) = (request.namespace, request.now);
        let first = self
            .llm
            .complete(
                namespace,
                now,
                self.request(request.instructions, window, None),
            )
            .await?;
        let fault = match read(&first.content, window.len()) {
            Ok(verdict) if rule_or_summary(&verdict) => return Ok(summary(verdict, window)),
            Ok(_) => "Your lesson is not phrased as a rule. Write it as \"When <situation>, \
                      <do this>.\" or \"Avoid <this> because <why>.\", or make it a summary. \
                      Answer with only the corrected JSON object."
                .to_string(),
            Err(fault) => fault.retry_prompt(),
        };
        // Once more, with what was wrong: local models usually fix it when told.
        let second = self
            .llm
            .complete(
                namespace,
                now,
                self.request(request.instructions, window, Some(&fault)),
            )
            .await?;
        match read(&second.content, window.len()) {
            Ok(mut verdict) => {
                if !rule_or_summary(&verdict) {
                    verdict.kind = CondenseKind::Summary;
                }
                Ok(summary(verdict, window))
            }
            Err(again) => Err(Error::Provider {
                provider: self.name.clone(),
                message: format!(
                    "the model's answer could not be used, twice ({}; then {again})",
                    fault.lines().next().unwrap_or_default()
                ),
            }),
        }
    }
}

/// A summary, or a lesson that reads as a rule.
fn rule_or_summary(v: &CondenseVerdict) -> bool {
    v.kind == CondenseKind::Summary || is_rule_shaped(&v.text)
}

fn summary(v: CondenseVerdict, window: &[MemoryRecord]) -> Summary {
    Summary {
        text: v.text,
        lesson: v.kind == CondenseKind::Lesson,
        cited: v.sources.iter().map(|&i| window[i].id).collect(),
    }
}

/// Reads an answer for a window of `n` records.
fn read(content: &str, n: usize) -> std::result::Result<CondenseVerdict, JsonFault> {
    let extracted = json::extract(content)?;
    condense_answer(&extracted.value, n)
}

/// The JSON schema of the answer for a window of `n` records.
fn schema(n: usize) -> serde_json::Value {
    json!({
        "type": "object",
        "properties": {
            "kind": {"type": "string", "enum": ["summary", "lesson"]},
            "text": {"type": "string", "minLength": 1, "maxLength": MAX_CONDENSED_CHARS},
            "sources": {
                "type": "array",
                "minItems": 1,
                "items": {"type": "integer", "minimum": 0, "maximum": n.saturating_sub(1)}
            }
        },
        "required": ["kind", "text", "sources"],
        "additionalProperties": false
    })
}

#[async_trait]
impl Summarizer for LlmCondenser {
    fn name(&self) -> &str {
        &self.name
    }

    async fn summarize(&self, request: SummaryRequest<'_>) -> Result<Summary> {
        let outcome = self.ask(&request).await;
        let counters = &self.llm.counters;
        match &outcome {
            Ok(_) => Counters::add(&counters.condensed, 1),
            Err(Error::OverBudget { .. }) => Counters::add(&counters.over_budget, 1),
            Err(_) => Counters::add(&counters.fallbacks, 1),
        }
        outcome
    }
}

/// Longest text a condensed record may have, in characters.
pub const MAX_CONDENSED_CHARS: usize = 2000;

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
        return Err(shape_fault("answer", problem));
    };

    let kind = match fields.get("kind") {
        None => return Err(shape_fault("kind", format!("is missing; {SHAPE}"))),
        Some(v) => match v.as_str().map(|s| s.trim().to_ascii_lowercase()).as_deref() {
            Some("summary") => CondenseKind::Summary,
            Some("lesson" | "rule") => CondenseKind::Lesson,
            _ => {
                let problem = format!("{} is not \"summary\" or \"lesson\"", describe(v));
                return Err(shape_fault("kind", problem));
            }
        },
    };

    let text = match fields.get("text") {
        Some(Value::String(text)) => text.trim(),
        None => return Err(shape_fault("text", format!("is missing; {SHAPE}"))),
        Some(other) => {
            let problem = format!("is {}, not a string", describe(other));
            return Err(shape_fault("text", problem));
        }
    };
    if text.is_empty() {
        return Err(shape_fault("text", "is empty; write the summary or lesson"));
    }
    let length = text.chars().count();
    if length > MAX_CONDENSED_CHARS {
        let problem =
            format!("is {length} characters long; keep it to at most {MAX_CONDENSED_CHARS}");
        return Err(shape_fault("text", problem));
    }

    let range = match window_len {
        0 => "the window is empty".to_string(),
        n => format!("use indices 0 to {} of the window", n - 1),
    };
    let sources = match fields.get("sources") {
        Some(Value::Array(sources)) => sources,
        None => {
            let problem = format!("is missing; list the records the text comes from ({range})");
            return Err(shape_fault("sources", problem));
        }
        Some(other) => {
            let problem = format!("is {}, not an array of indices; {range}", describe(other));
            return Err(shape_fault("sources", problem));
        }
    };
    if sources.is_empty() {
        let problem = format!("is empty; list the records the text comes from ({range})");
        return Err(shape_fault("sources", problem));
    }
    let mut indices = Vec::with_capacity(sources.len());
    for (position, source) in sources.iter().enumerate() {
        match whole_number(source) {
            Some(index) if index < window_len => indices.push(index),
            Some(index) => {
                let problem = format!("index {index} is out of range; {range}");
                return Err(shape_fault(format!("sources[{position}]"), problem));
            }
            None => {
                let problem = format!("{} is not a whole number; {range}", describe(source));
                return Err(shape_fault(format!("sources[{position}]"), problem));
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
    use super::*;
    use crate::engine::{Substrate, SubstrateOptions};
    use crate::llm::json::tests::schema_fault;
    use crate::llm::script::scripted;
    use crate::model::{MemoryId, NewMemory};
    use crate::policy::Policy;

    const NOW: crate::clock::Timestamp = 1_780_002_000_000;

    fn window() -> Vec<MemoryRecord> {
        [
            "deploy failed: the cache was cold",
            "warmed the cache, deploy passed",
        ]
        .iter()
        .enumerate()
        .map(|(i, t)| {
            MemoryRecord::episodic(
                MemoryId(i as u32 + 1),
                "default",
                "s",
                crate::model::Kind::new("observation").unwrap(),
                t.to_string(),
                NOW,
            )
        })
        .collect()
    }

    fn request<'a>(window: &'a [MemoryRecord], picked: &'a [MemoryId]) -> SummaryRequest<'a> {
        SummaryRequest {
            namespace: "default",
            window,
            picked,
            instructions: None,
            now: NOW,
        }
    }

    const LESSON: &str = r#"{"kind":"lesson","text":"When a deploy fails on a cold cache, warm the cache first.","sources":[0,1]}"#;

    #[tokio::test]
    async fn a_good_lesson_is_kept_with_its_sources_in_one_request() {
        let (llm, script) = scripted(&[LESSON], 0).await;
        let condenser = LlmCondenser::new(llm.clone());
        let window = window();
        let got = condenser.summarize(request(&window, &[])).await.unwrap();
        assert!(got.lesson);
        assert!(got.text.starts_with("When a deploy fails"));
        assert_eq!(got.cited, vec![MemoryId(1), MemoryId(2)]);
        let seen = script.seen();
        assert_eq!(seen.len(), 1);
        assert_eq!(
            seen[0]["response_format"]["json_schema"]["name"],
            "condensed_memory"
        );
        let system = seen[0]["messages"][0]["content"].as_str().unwrap();
        assert!(system.starts_with(GUIDANCE) && system.ends_with(ANSWER_FORMAT));
        let user = seen[0]["messages"][1]["content"].as_str().unwrap();
        assert!(
            user.contains("1. [observation] warmed the cache, deploy passed"),
            "{user}"
        );
        assert_eq!(llm.stats().condensed, 1);
    }

    #[tokio::test]
    async fn a_fenced_summary_is_read_and_a_policy_prompt_leads_the_system_message() {
        let (llm, script) = scripted(
            &["Here you go:\n```json\n{'kind': 'summary', 'text': 'Deploy fixed by warming the cache.', 'sources': [1],}\n```"],
            0,
        )
        .await;
        let condenser = LlmCondenser::new(llm);
        let window = window();
        let custom = SummaryRequest {
            instructions: Some("Summaries only, in one sentence."),
            ..request(&window, &[])
        };
        let got = condenser.summarize(custom).await.unwrap();
        assert!(!got.lesson);
        assert_eq!(got.cited, vec![MemoryId(2)]);
        let seen = script.seen();
        let system = seen[0]["messages"][0]["content"].as_str().unwrap();
        assert!(system.starts_with("Summaries only") && system.ends_with(ANSWER_FORMAT));
    }

    #[tokio::test]
    async fn a_lesson_that_is_no_rule_is_asked_again_then_kept_as_a_summary() {
        let vague = r#"{"kind":"lesson","text":"Caches are important.","sources":[0]}"#;
        let (llm, script) = scripted(&[vague, LESSON], 0).await;
        let condenser = LlmCondenser::new(llm);
        let window = window();
        let got = condenser.summarize(request(&window, &[])).await.unwrap();
        assert!(got.lesson && got.text.starts_with("When"));
        {
            let seen = script.seen();
            assert_eq!(seen.len(), 2);
            let retry = seen[1]["messages"][1]["content"].as_str().unwrap();
            assert!(retry.contains("not phrased as a rule"), "{retry}");
        }
        let (llm, _) = scripted(&[vague], 0).await;
        let got = LlmCondenser::new(llm)
            .summarize(request(&window, &[]))
            .await
            .unwrap();
        assert!(!got.lesson, "still no rule: a summary, not a lesson");
        assert_eq!(got.text, "Caches are important.");
    }

    #[tokio::test]
    async fn wrong_schema_twice_is_an_error_and_counted() {
        let (llm, script) = scripted(&[r#"{"kind":"poem","text":"roses","sources":[0]}"#], 0).await;
        let condenser = LlmCondenser::new(llm.clone());
        let window = window();
        let err = condenser
            .summarize(request(&window, &[]))
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("twice") && err.contains("kind"), "{err}");
        assert_eq!(script.seen().len(), 2);
        assert_eq!(llm.stats().fallbacks, 1);
    }

    #[tokio::test]
    async fn the_budget_stops_condensing_until_the_next_hour() {
        let (llm, script) = scripted(&[LESSON], 10).await;
        let condenser = LlmCondenser::new(llm.clone());
        let window = window();
        condenser.summarize(request(&window, &[])).await.unwrap();
        let err = condenser
            .summarize(request(&window, &[]))
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                Error::OverBudget {
                    spent: 15,
                    limit: 10,
                    ..
                }
            ),
            "{err}"
        );
        assert_eq!(script.seen().len(), 1);
        assert_eq!(llm.stats().over_budget, 1);
        let next = SummaryRequest {
            now: NOW + 3_600_000,
            ..request(&window, &[])
        };
        condenser.summarize(next).await.unwrap();
    }

    #[tokio::test]
    async fn the_substrate_stores_the_models_lesson_or_the_extractive_text_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let options = SubstrateOptions {
            policy: Policy::from_toml(
                "<test>",
                "[condensation]\nmode = \"llm\"\nmin_events = 2\nevery_events = 100\n",
            )
            .unwrap(),
            ..SubstrateOptions::default()
        };
        let sub = Substrate::open(dir.path(), options).unwrap();
        let texts = [
            "deploy failed: the cache was cold",
            "warmed the cache, deploy passed",
        ];
        let events = || {
            texts
                .iter()
                .map(|t| NewMemory::new("observation", *t))
                .collect::<Vec<_>>()
        };
        let (good, _) = scripted(&[LESSON], 0).await;
        let good = LlmCondenser::new(good);
        sub.record("default", "good", events()).await.unwrap();
        let made = sub
            .condense_with("default", "good", "condenser", Some(&good))
            .await
            .unwrap()
            .unwrap();
        let record = sub.get("default", made.id).unwrap();
        assert_eq!(record.kind.as_str(), "lesson");
        assert!(record.text.starts_with("When a deploy fails"));
        assert_eq!(record.sources, made.sources);
        assert_eq!(record.metadata["condensed"]["mode"], "llm");
        let history = sub.history("default", made.id).unwrap();
        assert!(
            history[0].detail.contains("written by llm:judge-model"),
            "{history:?}"
        );

        let (broken, _) = scripted(&["I cannot do that."], 0).await;
        let broken = LlmCondenser::new(broken);
        sub.record("default", "broken", events()).await.unwrap();
        let made = sub
            .condense_with("default", "broken", "condenser", Some(&broken))
            .await
            .unwrap()
            .unwrap();
        let record = sub.get("default", made.id).unwrap();
        assert_eq!(record.kind.as_str(), "summary");
        assert_eq!(record.metadata["condensed"]["mode"], "extractive");
        assert!(record.text.contains("cache was cold"), "{}", record.text);
        let history = sub.history("default", made.id).unwrap();
        assert!(
            history[0]
                .detail
                .contains("extractive; llm:judge-model failed")
                && history[0].detail.contains("twice"),
            "{history:?}"
        );
        sub.close().unwrap();
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
}
