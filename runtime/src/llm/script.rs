//! A scripted OpenAI-compatible endpoint for the judge's and condenser's tests: a real
//! HTTP server on 127.0.0.1, port 0, answering the queued contents in order (the last one
//! repeats) and keeping every request body. The client's own fault handling (429, 5xx,
//! hangs) is tested against its own server in [`super::chat`].

use std::sync::{Arc, Mutex};

use axum::Json;
use axum::extract::State;
use axum::routing::post;
use serde_json::{Value, json};

use super::chat::ChatClient;
use super::cost::Llm;
use super::{LlmConfig, LlmKind};

/// What the endpoint answers and what it was asked.
#[derive(Default)]
pub(crate) struct Script {
    pub(crate) answers: Mutex<Vec<String>>,
    pub(crate) seen: Mutex<Vec<Value>>,
}

/// A scripted answer that rates however many records the request numbers, 1, 2, 3 …
pub(crate) const AUTO: &str = "AUTO";

/// A judge answer rating `n` records 1, 2, 3 …, with reasons `r0`, `r1` …
pub(crate) fn answer(n: usize) -> String {
    let items: Vec<Value> = (0..n)
        .map(|i| json!({"index": i, "importance": i + 1, "reusability": 1, "reason": format!("r{i}")}))
        .collect();
    json!({ "items": items }).to_string()
}

async fn chat(State(s): State<Arc<Script>>, Json(body): Json<Value>) -> Json<Value> {
    let records = body["messages"][1]["content"]
        .as_str()
        .unwrap_or("")
        .lines()
        .filter(|l| {
            l.split_once(". [")
                .is_some_and(|(n, _)| n.parse::<usize>().is_ok())
        })
        .count();
    s.seen.lock().unwrap().push(body);
    let content = {
        let mut answers = s.answers.lock().unwrap();
        if answers.len() > 1 {
            answers.remove(0)
        } else {
            answers[0].clone()
        }
    };
    let content = if content == AUTO {
        answer(records)
    } else {
        content
    };
    Json(json!({
        "id": "x", "object": "chat.completion", "created": 0, "model": "m",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": content}}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    }))
}

/// Starts an endpoint answering `answers` and an [`Llm`] on it (model `judge-model`, each
/// exchange reported as 15 tokens, `tokens_per_hour` per namespace).
pub(crate) async fn scripted(answers: &[&str], tokens_per_hour: u64) -> (Arc<Llm>, Arc<Script>) {
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
    (
        Arc::new(Llm::new(Arc::new(client), tokens_per_hour)),
        script,
    )
}
