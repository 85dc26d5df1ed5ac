//! The LLM judge: the [`Judge`] of `[evaluation] mode = "llm"` / `"hybrid"` on a
//! [`ChatClient`]. One request rates a whole batch of records for long-term importance and
//! reusability, each with a short reason, answering JSON that must match a schema.
//!
//! The answer is read with [`super::json`]: fences, prose and common faults are tolerated
//! (and the repairs named in the reason). An answer that still cannot be read, or breaks the
//! schema, is asked for once more with the fault shown to the model; if that fails too, the
//! judge returns an error and [`crate::evaluate`] keeps the rules' scores, with the reason in
//! each record's audit log. The provider's own faults (timeouts, 429, 5xx) are retried inside
//! the client. Nothing here ever blocks ingest: the evaluator calls the judge in the
//! background, on records the store already holds.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::json;

use super::chat::{ChatClient, ChatRequest};
use super::json::{self, JsonFault, JudgeVerdict};
use crate::error::{Error, Result};
use crate::evaluate::{Judge, JudgeItem, Judgement};

/// What the judge is told, before the records.
pub const SYSTEM_PROMPT: &str = "You judge memories of an AI agent for its long-term memory. \
For each numbered record, rate: importance (0-10: how much the agent's future work depends on \
remembering it; trivia and chit-chat score 0-2, decisions, failures, user preferences and \
facts that will be asked about score 7-10) and reusability (0-10: how likely it helps in \
other tasks or sessions). Give a reason of at most 12 words. Answer with only a JSON object: \
{\"items\":[{\"index\":0,\"importance\":7,\"reusability\":5,\"reason\":\"...\"}, ...]} with \
exactly one item per record, in any order.";

/// Longest text of one record put in the prompt (the rest is cut with an ellipsis): a judge
/// needs the gist, and a huge record must not crowd out the batch.
const MAX_ITEM_CHARS: usize = 1_500;

/// Answer tokens allowed per record (a verdict is ~30 tokens; room for the model's quirks).
const TOKENS_PER_ITEM: u32 = 80;

/// The judge on an OpenAI-compatible chat endpoint.
#[derive(Debug, Clone)]
pub struct LlmJudge {
    client: Arc<ChatClient>,
    name: String,
}

impl LlmJudge {
    /// A judge asking `client`'s model; its audit name is `llm:<model>`.
    pub fn new(client: Arc<ChatClient>) -> Self {
        let name = format!("llm:{}", client.model());
        LlmJudge { client, name }
    }

    fn request(&self, items: &[JudgeItem], fault: Option<&JsonFault>) -> ChatRequest {
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
        let max_tokens = TOKENS_PER_ITEM.saturating_mul(items.len() as u32).max(256);
        ChatRequest::new(SYSTEM_PROMPT, user)
            .with_schema("memory_judgements", schema(items.len()))
            .with_max_tokens(max_tokens)
    }
}

/// The JSON schema of the answer for `n` records.
fn schema(n: usize) -> serde_json::Value {
    json!({
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "minItems": n,
                "maxItems": n,
                "items": {
                    "type": "object",
                    "properties": {
                        "index": {"type": "integer", "minimum": 0, "maximum": n.saturating_sub(1)},
                        "importance": {"type": "number", "minimum": 0, "maximum": 10},
                        "reusability": {"type": "number", "minimum": 0, "maximum": 10},
                        "reason": {"type": "string"}
                    },
                    "required": ["index", "importance", "reusability", "reason"],
                    "additionalProperties": false
                }
            }
        },
        "required": ["items"],
        "additionalProperties": false
    })
}

/// Reads an answer into one judgement per record, in the records' order.
fn read(content: &str, n: usize) -> std::result::Result<Vec<Judgement>, JsonFault> {
    let extracted = json::extract(content)?;
    let mut verdicts: Vec<JudgeVerdict> = json::judge_answer(&extracted.value, n)?;
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

    async fn judge(&self, items: &[JudgeItem]) -> Result<Vec<Judgement>> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        let first = self.client.complete(self.request(items, None)).await?;
        let fault = match read(&first.content, items.len()) {
            Ok(judgements) => return Ok(judgements),
            Err(fault) => fault,
        };
        // Once more, with what was wrong: local models usually fix it when told.
        let second = self
            .client
            .complete(self.request(items, Some(&fault)))
            .await?;
        read(&second.content, items.len()).map_err(|again| Error::Provider {
            provider: self.name.clone(),
            message: format!(
                "the model's answer could not be used, twice ({fault}; then {again}); the \
                 rules' scores stay"
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use axum::Json;
    use axum::extract::State;
    use axum::routing::post;
    use serde_json::Value;

    use super::*;
    use crate::llm::{LlmConfig, LlmKind};
    use crate::model::MemoryId;

    /// A scripted endpoint: answers the queued contents in order (the last one repeats),
    /// and keeps every request body.
    #[derive(Default)]
    struct Script {
        answers: Mutex<Vec<String>>,
        seen: Mutex<Vec<Value>>,
    }

    async fn chat(State(s): State<Arc<Script>>, Json(body): Json<Value>) -> Json<Value> {
        s.seen.lock().unwrap().push(body);
        let content = {
            let mut answers = s.answers.lock().unwrap();
            if answers.len() > 1 {
                answers.remove(0)
            } else {
                answers[0].clone()
            }
        };
        Json(json!({
            "id": "x", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": content}}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        }))
    }

    async fn judge(answers: &[&str]) -> (LlmJudge, Arc<Script>) {
        let script = Arc::new(Script {
            answers: Mutex::new(answers.iter().map(|a| a.to_string()).collect()),
            ..Script::default()
        });
        let app = axum::Router::new()
            .route("/v1/chat/completions", post(chat))
            .with_state(script.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        let cfg = LlmConfig {
            kind: LlmKind::Openai,
            base_url: Some(format!("http://{addr}/v1")),
            model: Some("judge-model".into()),
            api_key_env: "SHADOWBRAIN_TEST_NO_SUCH_KEY".into(),
            timeout: "5s".into(),
            ..LlmConfig::default()
        };
        let client = ChatClient::new(&cfg).unwrap();
        (LlmJudge::new(Arc::new(client)), script)
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
        let got = judge.judge(&items()).await.unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].importance, 8.0);
        assert!(
            got[0]
                .reason
                .starts_with("a lasting preference (reusability 9")
        );
        assert_eq!(got[1].importance, 1.0);
        let seen = script.seen.lock().unwrap();
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
        let got = judge.judge(&items()).await.unwrap();
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
        let got = judge.judge(&items()).await.unwrap();
        assert_eq!(got[0].importance, 9.0);
        let seen = script.seen.lock().unwrap();
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
        let err = judge.judge(&items()).await.unwrap_err().to_string();
        assert!(err.contains("twice") && err.contains("rules"), "{err}");
        assert_eq!(script.seen.lock().unwrap().len(), 2);
    }

    #[tokio::test]
    async fn the_substrate_keeps_the_models_score_or_the_rules_with_the_reason() {
        use crate::model::NewMemory;
        use crate::substrate::{Substrate, SubstrateOptions};
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
}
