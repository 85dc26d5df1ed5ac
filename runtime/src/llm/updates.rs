//! The LLM judge of facts that change: the [`UpdateJudge`] of `[updates] mode = "llm"` /
//! `"hybrid"` on an [`Llm`]. One request shows the model a batch of pairs (an older and a
//! newer record) and asks, for each, whether the newer one supersedes, contradicts or
//! repeats the older one, or neither, with a short reason, answering JSON that must match
//! a schema.
//!
//! The same spares and safeguards as the importance judge ([`super::judge`]):
//! - **cache**: a pair of texts decided before takes that decision (the last
//!   `cache_entries` pairs are remembered);
//! - **batching**: pairs go `batch_size` to a request;
//! - **budget**: a namespace over its hourly tokens gets the rules without a call
//!   ([`super::cost`]), and the reason is audited;
//! - **fallback**: an answer that cannot be read, or breaks the schema, is asked for once
//!   more with the fault shown to the model; if that fails too, the pairs of the call are
//!   left to the rules, with the reason in each record's history. The provider's own
//!   faults (timeouts, 429, 5xx) are retried inside the client.
//!
//! Detection runs in the background, on records the store already holds: nothing here
//! ever blocks a write.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::chat::ChatRequest;
use super::cost::Llm;
use super::json::{self, JsonFault};
use crate::engine::{PairBatch, PairItem, PairVerdict, UpdateJudge};
use crate::error::{Error, Result};
use crate::updates::{Change, Finding};

/// What the judge is told.
pub const GUIDANCE: &str = "You maintain the long-term memory of an AI agent. Each numbered \
pair holds an OLDER and a NEWER record. Decide what the NEWER one is to the OLDER one: \
\"supersedes\" (the same fact, setting or rule with a new value: it replaces the older one), \
\"contradicts\" (both cannot be true, and nothing says the newer one replaces the older), \
\"duplicate\" (the same fact said again, possibly in other words), or \"unrelated\" (about \
different things, or both can hold at once). Give a reason of at most 12 words.";

/// How the answer must look.
pub const ANSWER_FORMAT: &str = "Answer with only a JSON object: \
{\"items\":[{\"index\":0,\"relation\":\"supersedes\",\"reason\":\"...\"}, ...]} with \
exactly one item per pair, in any order.";

/// Longest text of one record put in the prompt (the rest is cut with an ellipsis):
/// detection compares records of at most `max_chars` anyway.
const MAX_TEXT_CHARS: usize = 1_000;

/// Answer tokens allowed per pair.
const TOKENS_PER_PAIR: u32 = 60;

/// The judge on an OpenAI-compatible chat endpoint.
#[derive(Debug)]
pub struct LlmUpdateJudge {
    llm: Arc<Llm>,
    name: String,
    cache_entries: usize,
    batch_size: usize,
    cache: Mutex<Cache>,
}

#[derive(Debug, Default)]
struct Cache {
    decided: HashMap<u128, Finding>,
    /// Keys, oldest first, to evict in insertion order.
    order: VecDeque<u128>,
}

impl LlmUpdateJudge {
    /// A judge asking `llm`'s model, `batch_size` pairs per request, remembering the last
    /// `cache_entries` decisions (0: no cache); its audit name is `llm:<model>`.
    pub fn new(llm: Arc<Llm>, batch_size: usize, cache_entries: usize) -> Self {
        LlmUpdateJudge {
            name: format!("llm:{}", llm.model()),
            llm,
            cache_entries,
            batch_size: batch_size.max(1),
            cache: Mutex::new(Cache::default()),
        }
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, Cache> {
        // A panic while holding it leaves decisions that are still decisions.
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn request(items: &[&PairItem], fault: Option<&JsonFault>) -> ChatRequest {
        let cut = |text: &str| {
            let short: String = text.chars().take(MAX_TEXT_CHARS).collect();
            match short.len() < text.len() {
                true => format!("{short}…"),
                false => short,
            }
        };
        let mut user = String::from("Pairs:\n");
        for (i, item) in items.iter().enumerate() {
            user.push_str(&format!(
                "{i}. OLDER: {}\n   NEWER: {}\n",
                cut(&item.older),
                cut(&item.newer)
            ));
        }
        if let Some(fault) = fault {
            user.push('\n');
            user.push_str(&fault.retry_prompt());
        }
        let max_tokens = TOKENS_PER_PAIR.saturating_mul(items.len() as u32).max(256);
        ChatRequest::new(format!("{GUIDANCE}\n\n{ANSWER_FORMAT}"), user)
            .with_schema("memory_updates", schema(items.len()))
            .with_max_tokens(max_tokens)
    }

    /// Asks the model about `items`, once more with the fault shown if the answer is
    /// unusable.
    async fn ask(&self, batch: &PairBatch<'_>, items: &[&PairItem]) -> Result<Vec<Finding>> {
        let (namespace, now) = (batch.namespace, batch.now);
        let first = self
            .llm
            .complete(namespace, now, Self::request(items, None))
            .await?;
        let fault = match read(&first.content, items.len()) {
            Ok(found) => return Ok(found),
            Err(fault) => fault,
        };
        // Once more, with what was wrong: local models usually fix it when told.
        let second = self
            .llm
            .complete(namespace, now, Self::request(items, Some(&fault)))
            .await?;
        read(&second.content, items.len()).map_err(|again| Error::Provider {
            provider: self.name.clone(),
            message: format!("the model's answer could not be used, twice ({fault}; then {again})"),
        })
    }
}

#[async_trait]
impl UpdateJudge for LlmUpdateJudge {
    fn name(&self) -> &str {
        &self.name
    }

    async fn judge(&self, batch: PairBatch<'_>) -> Result<Vec<PairVerdict>> {
        let keys: Vec<u128> = batch.items.iter().map(pair_key).collect();
        let mut verdicts: Vec<Option<PairVerdict>> = vec![None; batch.items.len()];
        // Positions to ask about, and the first position of each key among them (a repeat
        // later in the batch takes that one's verdict).
        let mut ask: Vec<usize> = Vec::new();
        let mut first_of: HashMap<u128, usize> = HashMap::new();
        {
            let cache = self.cache();
            for (i, key) in keys.iter().enumerate() {
                if let Some(f) = cache.decided.get(key) {
                    verdicts[i] = Some(Ok(Finding {
                        change: f.change,
                        reason: format!("{} (cached: the same pair was judged before)", f.reason),
                    }));
                } else if let Entry::Vacant(e) = first_of.entry(*key) {
                    e.insert(i);
                    ask.push(i);
                }
            }
        }
        for chunk in ask.chunks(self.batch_size) {
            let items: Vec<&PairItem> = chunk.iter().map(|&i| &batch.items[i]).collect();
            match self.ask(&batch, &items).await {
                Ok(found) => {
                    let mut cache = self.cache();
                    for (&i, finding) in chunk.iter().zip(found) {
                        if self.cache_entries > 0 {
                            while cache.order.len() >= self.cache_entries {
                                if let Some(old) = cache.order.pop_front() {
                                    cache.decided.remove(&old);
                                }
                            }
                            cache.decided.insert(keys[i], finding.clone());
                            cache.order.push_back(keys[i]);
                        }
                        verdicts[i] = Some(Ok(finding));
                    }
                }
                Err(e) => {
                    for &i in chunk {
                        verdicts[i] = Some(Err(e.to_string()));
                    }
                }
            }
        }
        Ok((0..batch.items.len())
            .map(|i| {
                verdicts[i]
                    .clone()
                    .or_else(|| verdicts[first_of[&keys[i]]].clone())
                    .unwrap_or_else(|| Err("no verdict".to_string()))
            })
            .collect())
    }
}

/// The cache key of a pair: both texts, in order.
fn pair_key(item: &PairItem) -> u128 {
    let mut h = Sha256::new();
    h.update(item.older.as_bytes());
    h.update([0]);
    h.update(item.newer.as_bytes());
    let digest = h.finalize();
    u128::from_be_bytes(digest[..16].try_into().unwrap_or([0; 16]))
}

/// The JSON schema of the answer for `n` pairs.
fn schema(n: usize) -> Value {
    let relations = ["supersedes", "contradicts", "duplicate", "unrelated"];
    json::items_schema(
        n,
        &[
            ("relation", json!({"type": "string", "enum": relations})),
            ("reason", json!({"type": "string"})),
        ],
    )
}

fn fault(path: impl Into<String>, problem: impl Into<String>) -> JsonFault {
    JsonFault::Schema {
        path: path.into(),
        problem: problem.into(),
    }
}

/// Reads an answer into one finding per pair, in the pairs' order. Nothing is guessed: a
/// relation outside the four, an index out of range, a repeated or a missing index is a
/// fault naming the item.
fn read(content: &str, n: usize) -> std::result::Result<Vec<Finding>, JsonFault> {
    const SHAPE: &str = "answer {\"items\": [{\"index\": 0, \"relation\": \"supersedes\" | \
                         \"contradicts\" | \"duplicate\" | \"unrelated\", \"reason\": \"...\"}]}";
    let extracted = json::extract(content)?;
    let items = match &extracted.value {
        Value::Array(items) => items.as_slice(),
        Value::Object(map) => match map.get("items") {
            Some(Value::Array(items)) => items.as_slice(),
            None if map.contains_key("index") => std::slice::from_ref(&extracted.value),
            _ => return Err(fault("answer", format!("has no \"items\" array; {SHAPE}"))),
        },
        _ => return Err(fault("answer", format!("is not an object; {SHAPE}"))),
    };
    let wanted = format!(
        "give exactly one item per index 0 to {}",
        n.saturating_sub(1)
    );
    let mut found: Vec<Option<Finding>> = vec![None; n];
    for (position, item) in items.iter().enumerate() {
        let path = format!("items[{position}]");
        let index = item
            .get("index")
            .and_then(|v| {
                v.as_u64()
                    .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
            })
            .ok_or_else(|| fault(&path, format!("has no whole \"index\"; {wanted}")))?
            as usize;
        if index >= n {
            return Err(fault(
                path,
                format!("index {index} is out of range; {wanted}"),
            ));
        }
        let relation = item.get("relation").and_then(Value::as_str).unwrap_or("");
        let change = match relation.trim().to_ascii_lowercase().as_str() {
            "supersedes" => Change::Supersedes,
            "contradicts" => Change::Contradicts,
            "duplicate" => Change::Duplicate,
            "unrelated" => Change::Unrelated,
            other => {
                return Err(fault(
                    format!("{path} (index {index})"),
                    format!(
                        "relation \"{other}\" is not one of supersedes, contradicts, duplicate, \
                         unrelated"
                    ),
                ));
            }
        };
        let reason = item
            .get("reason")
            .and_then(Value::as_str)
            .unwrap_or("")
            .trim()
            .to_string();
        let reason = match extracted.repair_note() {
            Some(note) => format!("{reason} ({note})"),
            None => reason,
        };
        if found[index].replace(Finding { change, reason }).is_some() {
            return Err(fault(
                path,
                format!("index {index} appears twice; {wanted}"),
            ));
        }
    }
    if let Some(missing) = found.iter().position(Option::is_none) {
        return Err(fault(
            "items",
            format!("index {missing} is missing; {wanted}"),
        ));
    }
    Ok(found.into_iter().flatten().collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::script::scripted;

    fn pair(older: &str, newer: &str) -> PairItem {
        PairItem {
            newer: newer.into(),
            older: older.into(),
            similarity: 0.8,
            rules: Change::Unrelated,
        }
    }

    #[test]
    fn answers_are_read_strictly_and_faults_name_the_item() {
        let ok = read(
            "```json\n{\"items\":[{\"index\":1,\"relation\":\"duplicate\",\"reason\":\"same\"},\
             {\"index\":0,\"relation\":\"Supersedes\",\"reason\":\"new region\"}]}\n```",
            2,
        )
        .unwrap();
        assert_eq!(ok[0].change, Change::Supersedes);
        assert_eq!(ok[1].change, Change::Duplicate);
        let bad = read("{\"items\":[{\"index\":0,\"relation\":\"replaces\"}]}", 1).unwrap_err();
        assert!(bad.to_string().contains("\"replaces\""), "{bad}");
        let missing = read("{\"items\":[{\"index\":0,\"relation\":\"unrelated\"}]}", 2);
        assert!(
            missing
                .unwrap_err()
                .to_string()
                .contains("index 1 is missing")
        );
        let twice = read(
            "[{\"index\":0,\"relation\":\"unrelated\"},{\"index\":0,\"relation\":\"duplicate\"}]",
            2,
        );
        assert!(twice.unwrap_err().to_string().contains("appears twice"));
    }

    #[tokio::test]
    async fn pairs_are_batched_cached_and_a_broken_answer_is_asked_again_then_left_to_rules() {
        let good = |relations: &[&str]| {
            let items: Vec<Value> = relations
                .iter()
                .enumerate()
                .map(|(i, r)| json!({"index": i, "relation": r, "reason": format!("r{i}")}))
                .collect();
            json!({ "items": items }).to_string()
        };
        let first = good(&["supersedes", "unrelated"]);
        let second = good(&["contradicts"]);
        let (llm, script) = scripted(&[&first, &second, "not json", "still not json"], 0).await;
        let judge = LlmUpdateJudge::new(llm, 2, 100);
        let items = [
            pair("the runner is in eu-1", "the runner moved to eu-2"),
            pair("lunch is pizza", "the build uses cargo"),
            pair("the runner is in eu-1", "the runner moved to eu-2"),
            pair("tabs", "spaces"),
        ];
        let batch = PairBatch {
            namespace: "acme",
            items: &items,
            now: 0,
        };
        let v = judge.judge(batch).await.unwrap();
        let changes: Vec<Change> = v.iter().map(|v| v.as_ref().unwrap().change).collect();
        // Three distinct pairs in requests of two: two calls; the repeat takes the first's.
        assert_eq!(
            changes,
            [
                Change::Supersedes,
                Change::Unrelated,
                Change::Supersedes,
                Change::Contradicts
            ]
        );
        assert_eq!(script.seen().len(), 2);
        let prompt = script.seen()[0]["messages"][1]["content"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(
            prompt.contains("0. OLDER: the runner is in eu-1\n   NEWER: the runner moved to eu-2")
        );

        // The same pairs again: all from the cache, no call.
        let again = judge.judge(batch).await.unwrap();
        assert!(again[0].as_ref().unwrap().reason.contains("cached"));
        assert_eq!(script.seen().len(), 2);

        // A new pair, answered with nonsense twice: asked once more with the fault, then
        // left to the rules with the reason.
        let new = [pair("the port is 80", "the port is 8080")];
        let v = judge
            .judge(PairBatch {
                namespace: "acme",
                items: &new,
                now: 0,
            })
            .await
            .unwrap();
        let why = v[0].as_ref().unwrap_err();
        assert!(why.contains("twice"), "{why}");
        let seen = script.seen();
        assert_eq!(seen.len(), 4);
        let retry = seen[3]["messages"][1]["content"].as_str().unwrap();
        assert!(retry.contains("not valid JSON"), "{retry}");
    }

    #[tokio::test]
    async fn a_namespace_over_its_budget_gets_no_call() {
        let (llm, script) = scripted(&["{}"], 1).await;
        llm.budget().charge("acme", 0, 10);
        let judge = LlmUpdateJudge::new(llm, 8, 100);
        let items = [pair("a is 1", "a is 2")];
        let v = judge
            .judge(PairBatch {
                namespace: "acme",
                items: &items,
                now: 0,
            })
            .await
            .unwrap();
        assert!(v[0].is_err());
        assert!(script.seen().is_empty());
    }
}
