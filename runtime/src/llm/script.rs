//! The judge's and condenser's tests' scripted endpoint: the shared one of
//! `shadowbrain-test-support`, answering the queued contents in order (the last one
//! repeats), with an [`Llm`] on it. The client's own fault handling (429, 5xx, hangs) is
//! tested in [`super::chat`].

use std::sync::{Arc, Mutex};

use serde_json::Value;
use shadowbrain_test_support::{self as support, Endpoint};

use super::chat::ChatClient;
use super::cost::Llm;
use super::{LlmConfig, LlmKind};

/// The endpoint and what it was asked.
pub(crate) struct Script {
    endpoint: Endpoint,
}

impl Script {
    /// Every request body so far, in arrival order.
    pub(crate) fn seen(&self) -> Vec<Value> {
        self.endpoint.seen().into_iter().map(|r| r.body).collect()
    }
}

/// A scripted answer that rates however many records the request numbers, 1, 2, 3 …
pub(crate) const AUTO: &str = "AUTO";

/// A judge answer rating `n` records 1, 2, 3 …, with reasons `r0`, `r1` …
pub(crate) fn answer(n: usize) -> String {
    support::verdicts((0..n).map(|i| ((i + 1) as f64, 1, format!("r{i}"))))
}

/// Starts an endpoint answering `answers` and an [`Llm`] on it (model `judge-model`, each
/// exchange reported as 15 tokens, `tokens_per_hour` per namespace).
pub(crate) async fn scripted(answers: &[&str], tokens_per_hour: u64) -> (Arc<Llm>, Arc<Script>) {
    let queue = Mutex::new(answers.iter().map(|a| a.to_string()).collect::<Vec<_>>());
    let endpoint = Endpoint::start(move |request| {
        let content = {
            let mut answers = queue.lock().unwrap();
            if answers.len() > 1 {
                answers.remove(0)
            } else {
                answers[0].clone()
            }
        };
        let content = if content == AUTO {
            answer(request.numbered_records().len())
        } else {
            content
        };
        support::Reply::chat(&content, Some((10, 5)))
    })
    .await;
    let cfg = LlmConfig {
        kind: LlmKind::Openai,
        base_url: Some(endpoint.base_url()),
        model: Some("judge-model".into()),
        api_key_env: "SHADOWBRAIN_TEST_NO_SUCH_KEY".into(),
        timeout: "5s".into(),
        ..LlmConfig::default()
    };
    let client = ChatClient::new(&cfg).unwrap();
    (
        Arc::new(Llm::new(Arc::new(client), tokens_per_hour)),
        Arc::new(Script { endpoint }),
    )
}
