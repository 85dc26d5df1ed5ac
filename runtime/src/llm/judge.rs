//! The LLM judge: the [`Judge`] of `[evaluation] mode = "llm"` / `"hybrid"` on an [`Llm`].
//! One request rates a whole batch of records for long-term importance and reusability,
//! each with a short reason, answering JSON that must match a schema.
//!
//! The answer is read with [`super::json`]: fences, prose and common faults are tolerated
//! (and the repairs named in the reason). An answer that still cannot be read, or breaks the
//! schema, is asked for once more with the fault shown to the model; if that fails too, the
//! records of the call keep the rules' scores, with the reason in each one's audit log. The
//! provider's own faults (timeouts, 429, 5xx) are retried inside the client; a namespace
//! over its token budget gets rules without a call ([`super::cost`]).
//!
//! Calls are spared before they are made, since each costs tokens and seconds:
//! - **cache**: a record whose kind and text (under the same guidance) were judged before
//!   takes that judgement; the cache holds the last `cache_entries` texts;
//! - **semantic reuse**: a record whose embedding is within `reuse_similarity` (cosine) of
//!   a recently judged record of the same kind and namespace takes its judgement, as does
//!   one close to another record of the same batch — only the first goes to the model.
//!
//! Both are audited: the reason says `cached` or `reused from <id>` with the similarity.
//! Nothing here ever blocks ingest: the evaluator calls the judge in the background, on
//! records the store already holds.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use std::collections::BTreeMap;

use async_trait::async_trait;
use serde_json::json;
use sha2::{Digest, Sha256};

use super::chat::ChatRequest;
use super::cost::{Counters, Llm};
use serde_json::Value;

use super::json::{self, JsonFault, describe, shape_fault, whole_number};
use crate::engine::{Judge, JudgeBatch, JudgeItem, Judgement, Verdict};
use crate::error::{Error, Result};
use crate::model::MemoryId;

/// What the judge is told about rating, unless the policy's `[evaluation] prompt` says
/// otherwise.
pub const GUIDANCE: &str = "You judge memories of an AI agent for its long-term memory. \
For each numbered record, rate: importance (0-10: how much the agent's future work depends on \
remembering it; trivia and chit-chat score 0-2, decisions, failures, user preferences and \
facts that will be asked about score 7-10) and reusability (0-10: how likely it helps in \
other tasks or sessions). Give a reason of at most 12 words.";

/// How the answer must look; always appended, so a policy's guidance cannot break parsing.
pub const ANSWER_FORMAT: &str = "Answer with only a JSON object: \
{\"items\":[{\"index\":0,\"importance\":7,\"reusability\":5,\"reason\":\"...\"}, ...]} with \
exactly one item per record, in any order.";

/// Longest text of one record put in the prompt (the rest is cut with an ellipsis): a judge
/// needs the gist, and a huge record must not crowd out the batch.
const MAX_ITEM_CHARS: usize = 1_500;

/// Answer tokens allowed per record (a verdict is ~30 tokens; room for the model's quirks).
const TOKENS_PER_ITEM: u32 = 80;

/// Judged records remembered per namespace for semantic reuse. A linear scan of this many
/// vectors costs well under a millisecond, against a model call of a second or more.
const REUSE_WINDOW: usize = 2_048;

/// How the judge spares calls. [`Default`] is `[llm]`'s defaults.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct JudgeOptions {
    /// Texts whose judgement is cached; 0 turns the cache off.
    pub cache_entries: usize,
    /// Cosine similarity at or above which a near-duplicate's judgement is reused; `None`
    /// turns semantic reuse off.
    pub reuse_similarity: Option<f32>,
    /// Records per request: what a call cannot spare is asked about in requests of this
    /// many, sent together.
    pub batch_size: usize,
}

impl Default for JudgeOptions {
    fn default() -> Self {
        super::LlmConfig::default().judge_options()
    }
}

/// The judge on an OpenAI-compatible chat endpoint.
#[derive(Debug)]
pub struct LlmJudge {
    llm: Arc<Llm>,
    name: String,
    options: JudgeOptions,
    memory: Mutex<Memory>,
}

/// What the judge remembers of earlier verdicts.
#[derive(Debug, Default)]
struct Memory {
    cache: HashMap<u128, Judgement>,
    /// Cache keys, oldest first, to evict in insertion order.
    order: VecDeque<u128>,
    /// Per namespace, the most recently judged records with embeddings.
    recent: HashMap<String, VecDeque<Judged>>,
}

/// A judged record kept for semantic reuse.
#[derive(Debug)]
struct Judged {
    id: MemoryId,
    kind: String,
    /// Which guidance judged it (a policy's new prompt must not reuse old verdicts).
    guidance: u64,
    embedding: Vec<f32>,
    judgement: Judgement,
}

/// Where a verdict that spared a call came from.
enum Borrowed {
    /// The same text earlier in the batch.
    Same(usize),
    /// A near-duplicate earlier in the batch, with the similarity.
    Near(usize, f32),
}

impl LlmJudge {
    /// A judge asking `llm`'s model with the default [`JudgeOptions`]; its audit name is
    /// `llm:<model>`.
    pub fn new(llm: Arc<Llm>) -> Self {
        Self::with_options(llm, JudgeOptions::default())
    }

    /// A judge with explicit cache and reuse settings.
    pub fn with_options(llm: Arc<Llm>, options: JudgeOptions) -> Self {
        let name = format!("llm:{}", llm.model());
        LlmJudge {
            llm,
            name,
            options,
            memory: Mutex::new(Memory::default()),
        }
    }

    fn request(
        &self,
        instructions: Option<&str>,
        items: &[&JudgeItem],
        fault: Option<&JsonFault>,
    ) -> ChatRequest {
        let mut user = String::from("Records:\n");
        for (i, item) in items.iter().enumerate() {
            let text: String = item.text.chars().take(MAX_ITEM_CHARS).collect();
            let cut = if text.len() < item.text.len() {
                "…"
            } else {
                ""
            };
            user.push_str(&format!("{i}. [{}] {text}{cut}\n", item.kind));
        }
        if let Some(fault) = fault {
            user.push('\n');
            user.push_str(&fault.retry_prompt());
        }
        let system = format!("{}\n\n{ANSWER_FORMAT}", instructions.unwrap_or(GUIDANCE));
        let max_tokens = TOKENS_PER_ITEM.saturating_mul(items.len() as u32).max(256);
        ChatRequest::new(system, user)
            .with_schema("memory_judgements", schema(items.len()))
            .with_max_tokens(max_tokens)
    }

    /// Asks the model about `items`, once more with the fault shown if the answer is
    /// unusable.
    async fn ask(&self, batch: &JudgeBatch<'_>, items: &[&JudgeItem]) -> Result<Vec<Judgement>> {
        let (namespace, now) = (batch.namespace, batch.now);
        let request = self.request(batch.instructions, items, None);
        let first = self.llm.complete(namespace, now, request).await?;
        let fault = match read(&first.content, items.len()) {
            Ok(judgements) => return Ok(judgements),
            Err(fault) => fault,
        };
        // Once more, with what was wrong: local models usually fix it when told.
        let request = self.request(batch.instructions, items, Some(&fault));
        let second = self.llm.complete(namespace, now, request).await?;
        read(&second.content, items.len()).map_err(|again| Error::Provider {
            provider: self.name.clone(),
            message: format!(
                "the model's answer could not be used, twice ({fault}; then {again}); the \
                 rules' scores stay"
            ),
        })
    }

    fn memory(&self) -> std::sync::MutexGuard<'_, Memory> {
        // A panic while holding it leaves verdicts that are still verdicts.
        self.memory.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Remembers the model's verdicts for the cache and for reuse.
    fn remember(
        &self,
        namespace: &str,
        guidance: u64,
        items: &[&JudgeItem],
        keys: &[u128],
        judgements: &[Judgement],
    ) {
        let mut memory = self.memory();
        for ((item, &key), judgement) in items.iter().zip(keys).zip(judgements) {
            if self.options.cache_entries > 0 && !memory.cache.contains_key(&key) {
                while memory.order.len() >= self.options.cache_entries {
                    if let Some(old) = memory.order.pop_front() {
                        memory.cache.remove(&old);
                    }
                }
                memory.cache.insert(key, judgement.clone());
                memory.order.push_back(key);
            }
            if let (Some(_), Some(embedding)) = (self.options.reuse_similarity, &item.embedding) {
                let recent = memory.recent.entry(namespace.to_string()).or_default();
                if recent.len() >= REUSE_WINDOW {
                    recent.pop_front();
                }
                recent.push_back(Judged {
                    id: item.id,
                    kind: item.kind.clone(),
                    guidance,
                    embedding: embedding.clone(),
                    judgement: judgement.clone(),
                });
            }
        }
    }
}

/// The JSON schema of the answer for `n` records.
fn schema(n: usize) -> serde_json::Value {
    let score = json!({"type": "number", "minimum": 0, "maximum": 10});
    json::items_schema(
        n,
        &[
            ("importance", score.clone()),
            ("reusability", score),
            ("reason", json!({"type": "string"})),
        ],
    )
}

/// Reads an answer into one judgement per record, in the records' order.
fn read(content: &str, n: usize) -> std::result::Result<Vec<Judgement>, JsonFault> {
    let extracted = json::extract(content)?;
    let mut verdicts: Vec<JudgeVerdict> = judge_answer(&extracted.value, n)?;
    verdicts.sort_by_key(|v| v.index);
    let repaired = extracted.repair_note();
    Ok(verdicts
        .into_iter()
        .map(|v| Judgement {
            importance: v.importance,
            reason: match &repaired {
                Some(note) => format!(
                    "{} (reusability {}; {note})",
                    v.reason.trim(),
                    v.reusability
                ),
                None => format!("{} (reusability {})", v.reason.trim(), v.reusability),
            },
        })
        .collect())
}

#[async_trait]
impl Judge for LlmJudge {
    fn name(&self) -> &str {
        &self.name
    }

    async fn judge(&self, batch: JudgeBatch<'_>) -> Result<Vec<Verdict>> {
        let items = batch.items;
        let guidance = fingerprint(batch.instructions.unwrap_or(GUIDANCE));
        let keys: Vec<u128> = items
            .iter()
            .map(|i| content_key(guidance, &i.kind, &i.text))
            .collect();
        let threshold = self.options.reuse_similarity;
        let mut verdicts: Vec<Option<Verdict>> = vec![None; items.len()];
        // Positions sent to the model, and positions that copy one of them.
        let mut ask: Vec<usize> = Vec::new();
        let mut borrowed: Vec<(usize, Borrowed)> = Vec::new();
        {
            let memory = self.memory();
            for (i, item) in items.iter().enumerate() {
                if let Some(j) = memory.cache.get(&keys[i]) {
                    verdicts[i] = Some(Ok(Judgement {
                        importance: j.importance,
                        reason: format!("{} (cached: the same text was judged before)", j.reason),
                    }));
                    Counters::add(&self.llm.counters.cache_hits, 1);
                    continue;
                }
                if let Some(&a) = ask.iter().find(|&&a| keys[a] == keys[i]) {
                    borrowed.push((i, Borrowed::Same(a)));
                    continue;
                }
                if let (Some(threshold), Some(e)) = (threshold, &item.embedding) {
                    let earlier = memory.recent.get(batch.namespace).and_then(|recent| {
                        nearest(
                            recent
                                .iter()
                                .filter(|r| r.kind == item.kind && r.guidance == guidance)
                                .map(|r| (r, r.embedding.as_slice())),
                            e,
                            threshold,
                        )
                    });
                    if let Some((r, similarity)) = earlier {
                        verdicts[i] = Some(Ok(Judgement {
                            importance: r.judgement.importance,
                            reason: format!(
                                "{} (reused from near-duplicate {}, similarity {similarity:.3})",
                                r.judgement.reason, r.id
                            ),
                        }));
                        Counters::add(&self.llm.counters.reuse_hits, 1);
                        continue;
                    }
                    let in_batch = nearest(
                        ask.iter()
                            .filter(|&&a| items[a].kind == item.kind)
                            .filter_map(|&a| items[a].embedding.as_deref().map(|v| (a, v))),
                        e,
                        threshold,
                    );
                    if let Some((a, similarity)) = in_batch {
                        borrowed.push((i, Borrowed::Near(a, similarity)));
                        continue;
                    }
                }
                ask.push(i);
            }
        }
        // What nothing could spare goes to the model in full requests, sent together (the
        // client bounds how many are in flight).
        let requests: Vec<&[usize]> = ask.chunks(self.options.batch_size.max(1)).collect();
        let answers = futures::future::join_all(requests.iter().map(|positions| {
            let asked: Vec<&JudgeItem> = positions.iter().map(|&a| &items[a]).collect();
            async move {
                let answer = self.ask(&batch, &asked).await;
                (asked, answer)
            }
        }))
        .await;
        for (positions, (asked, answer)) in requests.iter().zip(answers) {
            match answer {
                Ok(judgements) => {
                    let asked_keys: Vec<u128> = positions.iter().map(|&a| keys[a]).collect();
                    self.remember(batch.namespace, guidance, &asked, &asked_keys, &judgements);
                    Counters::add(&self.llm.counters.judged, positions.len());
                    for (&a, j) in positions.iter().zip(judgements) {
                        verdicts[a] = Some(Ok(j));
                    }
                }
                Err(e) => {
                    let why = e.to_string();
                    for &a in *positions {
                        verdicts[a] = Some(Err(why.clone()));
                    }
                    // Records copying one of these fail with them, and count alike.
                    let copies = borrowed
                        .iter()
                        .filter(|(_, from)| match from {
                            Borrowed::Same(a) | Borrowed::Near(a, _) => positions.contains(a),
                        })
                        .count();
                    let counter = match e {
                        Error::OverBudget { .. } => &self.llm.counters.over_budget,
                        _ => &self.llm.counters.fallbacks,
                    };
                    Counters::add(counter, positions.len() + copies);
                }
            }
        }
        for (i, from) in borrowed {
            let (a, note) = match from {
                Borrowed::Same(a) => (a, "the same text".to_string()),
                Borrowed::Near(a, s) => (a, format!("near-duplicate, similarity {s:.3}")),
            };
            let copied = match &verdicts[a] {
                Some(Ok(j)) => {
                    let counter = match from {
                        Borrowed::Same(_) => &self.llm.counters.cache_hits,
                        Borrowed::Near(..) => &self.llm.counters.reuse_hits,
                    };
                    Counters::add(counter, 1);
                    Ok(Judgement {
                        importance: j.importance,
                        reason: format!("{} (as {}: {note})", j.reason, items[a].id),
                    })
                }
                Some(Err(why)) => Err(why.clone()),
                None => Err("the judge lost track of this record".to_string()),
            };
            verdicts[i] = Some(copied);
        }
        Ok(verdicts
            .into_iter()
            .map(|v| v.unwrap_or_else(|| Err("the judge gave no verdict".to_string())))
            .collect())
    }
}

/// The best of `candidates` at or above `threshold` cosine similarity to `query`.
fn nearest<'a, T>(
    candidates: impl Iterator<Item = (T, &'a [f32])>,
    query: &[f32],
    threshold: f32,
) -> Option<(T, f32)> {
    let mut best: Option<(T, f32)> = None;
    for (candidate, vector) in candidates {
        // Another embedder's vector (another dimension) is never a near-duplicate.
        if vector.len() != query.len() {
            continue;
        }
        let s = crate::index::cosine(query, vector);
        if s >= threshold && best.as_ref().is_none_or(|(_, b)| s > *b) {
            best = Some((candidate, s));
        }
    }
    best
}

/// A short fingerprint of the guidance a verdict was given under.
fn fingerprint(guidance: &str) -> u64 {
    let digest = Sha256::digest(guidance.as_bytes());
    u64::from_be_bytes(digest[..8].try_into().unwrap_or([0; 8]))
}

/// The cache key of a record: its kind and text under one guidance.
fn content_key(guidance: u64, kind: &str, text: &str) -> u128 {
    let mut h = Sha256::new();
    h.update(guidance.to_be_bytes());
    h.update(kind.as_bytes());
    h.update([0]);
    h.update(text.as_bytes());
    let digest = h.finalize();
    u128::from_be_bytes(digest[..16].try_into().unwrap_or([0; 16]))
}

/// The judge's scale: importance and reusability are numbers from 0 to this, inclusive.
pub const SCORE_MAX: f64 = 10.0;

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
                return Err(shape_fault("items", problem));
            }
            None if map.contains_key("index") => std::slice::from_ref(value),
            None => {
                return Err(shape_fault(
                    "answer",
                    format!("has no \"items\" array; {SHAPE}"),
                ));
            }
        },
        other => {
            let problem = format!("is {}, not an object; {SHAPE}", describe(other));
            return Err(shape_fault("answer", problem));
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
            return Err(shape_fault(path, problem));
        };
        let index = match fields.get("index") {
            None => return Err(shape_fault(path, format!("has no \"index\"; {wanted}"))),
            Some(v) => whole_number(v).ok_or_else(|| {
                let problem = format!("index {} is not a whole number; {wanted}", describe(v));
                shape_fault(&path, problem)
            })?,
        };
        if index >= expected {
            let problem = format!("index {index} is out of range; {wanted}");
            return Err(shape_fault(path, problem));
        }
        let path = format!("items[{position}] (index {index})");
        let importance = score(fields, "importance", &path)?;
        let reusability = score(fields, "reusability", &path)?;
        let reason = match fields.get("reason") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(reason)) => reason.trim().to_string(),
            Some(other) => {
                let problem = format!("reason is {}, not a string", describe(other));
                return Err(shape_fault(path, problem));
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
            return Err(shape_fault(path, problem));
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
        return Err(shape_fault("items", problem));
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
        return Err(shape_fault(path, format!("has no \"{name}\"; {range}")));
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
            Err(shape_fault(path, problem))
        }
        _ => {
            let problem = format!("{name} {} is not a number; {range}", describe(v));
            Err(shape_fault(path, problem))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::json::Repair;
    use crate::llm::json::tests::{ok as extracted, schema_fault};
    use crate::llm::script::{AUTO, Script, scripted};
    use crate::model::MemoryId;

    async fn judge(answers: &[&str]) -> (LlmJudge, Arc<Script>) {
        judge_with(answers, JudgeOptions::default(), 0).await
    }

    async fn judge_with(
        answers: &[&str],
        options: JudgeOptions,
        tokens_per_hour: u64,
    ) -> (LlmJudge, Arc<Script>) {
        let (llm, script) = scripted(answers, tokens_per_hour).await;
        (LlmJudge::with_options(llm, options), script)
    }

    const NOW: crate::clock::Timestamp = 1_780_002_000_000;

    fn batch(items: &[JudgeItem]) -> JudgeBatch<'_> {
        JudgeBatch {
            namespace: "default",
            items,
            instructions: None,
            now: NOW,
        }
    }

    fn ok(verdicts: Vec<Verdict>) -> Vec<Judgement> {
        verdicts.into_iter().map(|v| v.unwrap()).collect()
    }

    fn items() -> Vec<JudgeItem> {
        ["the user prefers invoices in EUR", "ok thanks"]
            .iter()
            .enumerate()
            .map(|(i, t)| JudgeItem {
                id: MemoryId(i as u32),
                kind: "user_message".into(),
                text: t.to_string(),
                rules_importance: 3.0,
                embedding: None,
            })
            .collect()
    }

    #[tokio::test]
    async fn a_good_answer_scores_every_record_in_order_in_one_request() {
        let (judge, script) = judge(&[r#"{"items":[
            {"index":1,"importance":1,"reusability":0,"reason":"chit-chat"},
            {"index":0,"importance":8,"reusability":9,"reason":"a lasting preference"}]}"#])
        .await;
        assert_eq!(judge.name(), "llm:judge-model");
        let got = ok(judge.judge(batch(&items())).await.unwrap());
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].importance, 8.0);
        assert!(
            got[0]
                .reason
                .starts_with("a lasting preference (reusability 9")
        );
        assert_eq!(got[1].importance, 1.0);
        let seen = script.seen();
        assert_eq!(seen.len(), 1, "one request for the batch");
        assert_eq!(seen[0]["temperature"], 0.0);
        assert_eq!(
            seen[0]["response_format"]["json_schema"]["name"],
            "memory_judgements"
        );
        let user = seen[0]["messages"][1]["content"].as_str().unwrap();
        assert!(user.contains("0. [user_message] the user prefers invoices in EUR"));
        assert!(user.contains("1. [user_message] ok thanks"));
    }

    #[tokio::test]
    async fn fenced_and_faulty_json_is_repaired_and_the_repair_named() {
        let (judge, _) = judge(&["Sure!\n```json\n{'items': [{index: 0, importance: 7, \
             reusability: 6, reason: 'a preference',}, {index: 1, importance: 0, \
             reusability: 0, reason: 'noise'},],}\n```"])
        .await;
        let got = ok(judge.judge(batch(&items())).await.unwrap());
        assert_eq!(got[0].importance, 7.0);
        assert!(got[0].reason.contains("repaired"), "{}", got[0].reason);
    }

    #[tokio::test]
    async fn a_broken_answer_is_asked_again_with_the_fault_shown() {
        let (judge, script) = judge(&[
            "I think the first one matters.",
            r#"{"items":[{"index":0,"importance":9,"reusability":8,"reason":"preference"},
                         {"index":1,"importance":0,"reusability":0,"reason":"noise"}]}"#,
        ])
        .await;
        let got = ok(judge.judge(batch(&items())).await.unwrap());
        assert_eq!(got[0].importance, 9.0);
        let seen = script.seen();
        assert_eq!(seen.len(), 2);
        let retry = seen[1]["messages"][1]["content"].as_str().unwrap();
        assert!(retry.contains("Answer with only the JSON"), "{retry}");
    }

    #[tokio::test]
    async fn two_unusable_answers_are_an_error_so_the_rules_stay() {
        let (judge, script) = judge(&[
            r#"{"items":[{"index":0,"importance":42,"reusability":1,"reason":"x"},
                         {"index":1,"importance":1,"reusability":1,"reason":"y"}]}"#,
        ])
        .await;
        let got = judge.judge(batch(&items())).await.unwrap();
        let err = got[0].clone().unwrap_err();
        assert!(err.contains("twice") && err.contains("rules"), "{err}");
        assert_eq!(got[1], Err(err));
        assert_eq!(script.seen().len(), 2);
    }

    fn item(id: u32, kind: &str, text: &str, embedding: Option<Vec<f32>>) -> JudgeItem {
        JudgeItem {
            id: MemoryId(id),
            kind: kind.into(),
            text: text.into(),
            rules_importance: 3.0,
            embedding,
        }
    }

    #[tokio::test]
    async fn the_same_text_is_judged_once_then_served_from_the_cache() {
        let (judge, script) = judge(&[AUTO]).await;
        let first = ok(judge.judge(batch(&items())).await.unwrap());
        let again = ok(judge.judge(batch(&items())).await.unwrap());
        assert_eq!(script.seen().len(), 1, "the second batch cost nothing");
        assert_eq!(again[0].importance, first[0].importance);
        assert!(again[1].reason.contains("cached"), "{}", again[1].reason);
        // Twice the same text in one batch: asked once, copied once.
        let twins = [
            item(10, "observation", "disk full", None),
            item(11, "observation", "disk full", None),
        ];
        let got = ok(judge.judge(batch(&twins)).await.unwrap());
        let seen = script.seen();
        assert_eq!(seen.len(), 2);
        let user = seen[1]["messages"][1]["content"].as_str().unwrap();
        assert!(
            user.contains("0. [observation] disk full") && !user.contains("1. "),
            "{user}"
        );
        assert!(
            got[1].reason.contains("as mem-0000000a: the same text"),
            "{}",
            got[1].reason
        );
        let stats = judge.llm.stats();
        assert_eq!((stats.judged, stats.cache_hits), (3, 3));
    }

    #[tokio::test]
    async fn near_duplicates_reuse_a_verdict_within_a_batch_and_across_batches() {
        let (judge, script) = judge(&[AUTO]).await;
        let first = [
            item(
                1,
                "observation",
                "build failed on step 3",
                Some(vec![1.0, 0.0, 0.0]),
            ),
            item(
                2,
                "observation",
                "build failed at step 3",
                Some(vec![0.99, 0.1, 0.0]),
            ),
            item(
                3,
                "observation",
                "lunch was good",
                Some(vec![0.0, 1.0, 0.0]),
            ),
            // Close in vector space but another kind: judged on its own.
            item(4, "goal", "fix the build", Some(vec![0.98, 0.0, 0.1])),
        ];
        let got = ok(judge.judge(batch(&first)).await.unwrap());
        assert_eq!(got.len(), 4);
        assert!(
            got[1]
                .reason
                .contains("as mem-00000001: near-duplicate, similarity 0.99"),
            "{}",
            got[1].reason
        );
        assert_eq!(got[1].importance, got[0].importance);
        {
            let seen = script.seen();
            let user = seen[0]["messages"][1]["content"].as_str().unwrap();
            assert!(!user.contains("build failed at step 3"), "{user}");
            assert!(user.contains("2. [goal] fix the build"), "{user}");
        }
        let later = [item(
            9,
            "observation",
            "the build failed on step 3!",
            Some(vec![0.995, 0.05, 0.0]),
        )];
        let got = ok(judge.judge(batch(&later)).await.unwrap());
        assert!(
            got[0]
                .reason
                .contains("reused from near-duplicate mem-00000001"),
            "{}",
            got[0].reason
        );
        assert_eq!(script.seen().len(), 1);
        // Another namespace never borrows.
        let other = JudgeBatch {
            namespace: "other",
            ..batch(&later)
        };
        judge.judge(other).await.unwrap();
        assert_eq!(script.seen().len(), 2);
        // Reuse off: every distinct text is asked.
        let (strict, script) = judge_with(
            &[AUTO],
            JudgeOptions {
                reuse_similarity: None,
                ..JudgeOptions::default()
            },
            0,
        )
        .await;
        strict.judge(batch(&first[..3])).await.unwrap();
        let seen = script.seen();
        assert!(
            seen[0]["messages"][1]["content"]
                .as_str()
                .unwrap()
                .contains("2. ")
        );
    }

    #[tokio::test]
    async fn what_cannot_be_spared_goes_out_in_full_requests() {
        let options = JudgeOptions {
            batch_size: 2,
            ..JudgeOptions::default()
        };
        let (judge, script) = judge_with(&[AUTO], options, 0).await;
        let round = [
            item(
                1,
                "observation",
                "disk full on db-1",
                Some(vec![1.0, 0.0, 0.0]),
            ),
            item(
                2,
                "observation",
                "disk full on db-1 again",
                Some(vec![0.99, 0.1, 0.0]),
            ),
            item(3, "observation", "lunch", Some(vec![0.0, 1.0, 0.0])),
            item(4, "observation", "deploy", Some(vec![0.0, 0.0, 1.0])),
            item(5, "observation", "backup", Some(vec![0.6, 0.0, 0.8])),
        ];
        let got = ok(judge.judge(batch(&round)).await.unwrap());
        assert_eq!(got.len(), 5);
        let seen = script.seen();
        let sizes: Vec<usize> = seen
            .iter()
            .map(|b| {
                b["messages"][1]["content"]
                    .as_str()
                    .unwrap()
                    .lines()
                    .count()
                    - 1
            })
            .collect();
        assert_eq!(
            sizes,
            vec![2, 2],
            "four asked (one spared), two full requests"
        );
    }

    #[tokio::test]
    async fn a_policy_prompt_replaces_the_guidance_but_not_the_answer_format() {
        let (judge, script) = judge(&[AUTO]).await;
        let items = items();
        let custom = JudgeBatch {
            instructions: Some("Invoices matter most."),
            ..batch(&items)
        };
        judge.judge(custom).await.unwrap();
        // The same texts under the built-in guidance are not served from the cache.
        judge.judge(batch(&items)).await.unwrap();
        let seen = script.seen();
        assert_eq!(seen.len(), 2);
        let system = seen[0]["messages"][0]["content"].as_str().unwrap();
        assert!(system.starts_with("Invoices matter most.") && system.ends_with(ANSWER_FORMAT));
        let system = seen[1]["messages"][0]["content"].as_str().unwrap();
        assert!(system.starts_with(GUIDANCE));
    }

    #[tokio::test]
    async fn a_spent_budget_keeps_the_rules_until_the_hour_turns() {
        // Each exchange reports 15 tokens; 20 per hour allows two calls.
        let off = JudgeOptions {
            cache_entries: 0,
            reuse_similarity: None,
            ..JudgeOptions::default()
        };
        let (judge, script) = judge_with(&[AUTO], off, 20).await;
        let items = items();
        ok(judge.judge(batch(&items)).await.unwrap());
        ok(judge.judge(batch(&items)).await.unwrap());
        let refused = judge.judge(batch(&items)).await.unwrap();
        let why = refused[0].clone().unwrap_err();
        assert!(
            why.contains("budget") && why.contains("30 of 20") && why.contains(":00 UTC"),
            "{why}"
        );
        assert_eq!(script.seen().len(), 2, "no call over budget");
        assert_eq!(judge.llm.stats().over_budget, 2);
        let next_hour = JudgeBatch {
            now: NOW + 3_600_000,
            ..batch(&items)
        };
        ok(judge.judge(next_hour).await.unwrap());
        assert_eq!(script.seen().len(), 3);
    }

    #[tokio::test]
    async fn the_substrate_keeps_the_models_score_or_the_rules_with_the_reason() {
        use crate::engine::{Substrate, SubstrateOptions};
        use crate::model::NewMemory;
        let dir = tempfile::tempdir().unwrap();
        let sub = Substrate::open(dir.path(), SubstrateOptions::default()).unwrap();
        let ids = sub
            .record(
                "default",
                "s",
                vec![
                    NewMemory::new("user_message", "the user prefers invoices in EUR"),
                    NewMemory::new("user_message", "ok thanks"),
                ],
            )
            .await
            .unwrap();
        let (good, _) = judge(&[r#"{"items":[
            {"index":0,"importance":8,"reusability":9,"reason":"a lasting preference"},
            {"index":1,"importance":1,"reusability":0,"reason":"chit-chat"}]}"#])
        .await;
        let report = sub.evaluate(&ids, Some(&good)).await.unwrap();
        assert_eq!(report.judged, 2);
        assert_eq!(sub.get("default", ids[0]).unwrap().importance, 8.0);
        let history = sub.history("default", ids[0]).unwrap();
        assert!(
            history
                .iter()
                .any(|e| e.by == "llm:judge-model" && e.detail.contains("a lasting preference")),
            "{history:?}"
        );

        let (broken, _) = judge(&["no idea"]).await;
        let report = sub.evaluate(&ids, Some(&broken)).await.unwrap();
        assert_eq!(report.kept_rules, 2);
        let history = sub.history("default", ids[1]).unwrap();
        assert!(
            history
                .iter()
                .any(|e| e.detail.contains("kept from the rules") && e.detail.contains("twice")),
            "{history:?}"
        );
        sub.close().unwrap();
    }

    // --- the judge's answer ----------------------------------------------------------------

    fn verdicts_of(text: &str, expected: usize) -> Result<Vec<JudgeVerdict>, JsonFault> {
        judge_answer(&extracted(text).value, expected)
    }

    #[test]
    fn a_judge_answer_gives_one_verdict_per_index_in_order() {
        let text = r#"{"items": [
            {"index": 1, "importance": 3, "reusability": 8, "reason": " generic fix "},
            {"index": 0, "importance": 7.5, "reusability": 0, "reason": "user preference"}
        ]}"#;
        let verdicts = verdicts_of(text, 2).unwrap();
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
        let verdicts = verdicts_of(bare, 1).unwrap();
        assert_eq!(
            (verdicts[0].importance, verdicts[0].reusability),
            (7.0, 2.5)
        );
        assert_eq!(verdicts[0].reason, "");
        let single = r#"{"index": 0.0, "importance": 10, "reusability": 0}"#;
        assert_eq!(verdicts_of(single, 1).unwrap()[0].importance, 10.0);
    }

    #[test]
    fn a_judge_answer_missing_an_index_names_it() {
        let text = r#"{"items": [{"index": 0, "importance": 1, "reusability": 1},
                                 {"index": 2, "importance": 1, "reusability": 1}]}"#;
        let message = schema_fault(verdicts_of(text, 4));
        assert_eq!(
            message,
            "items: no verdict for index 1, 3; give exactly one item per index 0 to 3"
        );
    }

    #[test]
    fn a_judge_answer_with_a_duplicate_or_foreign_index_names_it() {
        let text = r#"[{"index": 0, "importance": 1, "reusability": 1},
                       {"index": 0, "importance": 2, "reusability": 2}]"#;
        let message = schema_fault(verdicts_of(text, 2));
        assert!(
            message.starts_with("items[1] (index 0): index 0 appears twice"),
            "{message}"
        );
        let text = r#"[{"index": 5, "importance": 1, "reusability": 1}]"#;
        let message = schema_fault(verdicts_of(text, 2));
        assert!(message.contains("index 5 is out of range"), "{message}");
        let text = r#"[{"index": -1, "importance": 1, "reusability": 1}]"#;
        let message = schema_fault(verdicts_of(text, 2));
        assert!(
            message.contains("index -1 is not a whole number"),
            "{message}"
        );
    }

    #[test]
    fn out_of_range_or_non_numeric_scores_are_faults_not_clamped() {
        let text = r#"[{"index": 0, "importance": 12, "reusability": 1}]"#;
        assert_eq!(
            schema_fault(verdicts_of(text, 1)),
            "items[0] (index 0): importance 12 is out of range; give a number from 0 to 10"
        );
        let text = r#"[{"index": 0, "importance": 5, "reusability": -0.5}]"#;
        let message = schema_fault(verdicts_of(text, 1));
        assert!(
            message.contains("reusability -0.5 is out of range"),
            "{message}"
        );
        let text = r#"[{"index": 0, "importance": "high", "reusability": 1}]"#;
        let message = schema_fault(verdicts_of(text, 1));
        assert!(
            message.contains("importance \"high\" is not a number"),
            "{message}"
        );
        let text = r#"[{"index": 0, "importance": "NaN", "reusability": 1}]"#;
        assert!(schema_fault(verdicts_of(text, 1)).contains("is not a number"));
        let text = r#"[{"index": 0, "importance": 5}]"#;
        assert!(schema_fault(verdicts_of(text, 1)).contains("has no \"reusability\""));
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
        let found = extracted(text);
        let verdicts = judge_answer(&found.value, 2).unwrap();
        assert_eq!(verdicts[0].importance, 8.0);
        assert_eq!(verdicts[0].reason, "user's preference");
        assert_eq!(verdicts[1].reason, "");
        assert!(found.repairs.contains(&Repair::TrailingComma));
    }
}
