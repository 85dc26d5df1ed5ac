//! Knowledge promotion as a user meets it under an embedder that works in the background:
//! the `serve` binary, feedback that makes a condensed record eligible before its embedding
//! is stored, and the knowledge pool polled over HTTP. With the local model (the default
//! once `scripts/setup` ran) and with a remote OpenAI-compatible endpoint served by the test
//! that answers slowly, or not at all across a restart.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use shadowbrain_runtime::embed::{default_model_dir, is_model_dir};
use shadowbrain_test_support::concepts::ConceptProvider;
use shadowbrain_test_support::{Endpoint, Reply};

use crate::common::config::remote_config;
use crate::common::http::{http, post};
use crate::common::serve::{self, Served};

/// A policy that promotes a condensed record after one success (as the report).
fn policy(dir: &Path) -> PathBuf {
    let path = dir.join("promote.toml");
    std::fs::write(
        &path,
        "name = \"promote-early\"\n[promotion]\nmin_importance = 0\nmin_successes = 1\n\
         min_utility = 0.5\n[condensation]\nmin_events = 5\n",
    )
    .unwrap();
    path
}

/// `serve` over `data` with `policy` (and the config file `config`), and its address.
fn serve(data: &Path, config: Option<&Path>, policy: &Path) -> (Served, std::net::SocketAddr) {
    let mut serve = serve::new().data(data).policy(policy);
    if let Some(config) = config {
        serve = serve.config_file(config);
    }
    let served = serve.start();
    let addr = served.addr;
    (served, addr)
}

const LESSON: [&str; 6] = [
    "the deploy failed because the staging database password had expired",
    "rotating the staging database password fixed the failed deploy",
    "deploys to staging fail when the database password expires",
    "we set a reminder to rotate the staging database password monthly",
    "the error said authentication failed for the staging database",
    "after rotating the password the deploy went through",
];

/// Six events, a recall with success feedback, a condensation, and success feedback on
/// the condensed record: the steps. Answers the condensed record's id.
fn make_eligible(addr: std::net::SocketAddr) -> String {
    for text in LESSON {
        let (status, answer) = post(
            addr,
            "/v1/sessions/ops/events",
            &json!({"kind": "observation", "text": text}),
        );
        assert_eq!(status, 201, "{answer}");
    }
    let (status, recalled) = post(
        addr,
        "/v1/sessions/ops/recall",
        &json!({"query": "why did the deploy fail", "k": 5}),
    );
    assert_eq!(status, 200, "{recalled}");
    let (status, answer) = post(
        addr,
        "/v1/sessions/ops/feedback",
        &json!({"recall_id": recalled["recall_id"], "outcome": "success"}),
    );
    assert_eq!(status, 200, "{answer}");
    let (status, condensed) = post(addr, "/v1/sessions/ops/condense", &json!({}));
    assert_eq!(status, 200, "{condensed}");
    let id = condensed["memory_id"]
        .as_str()
        .expect("condensed")
        .to_string();
    let (status, answer) = post(
        addr,
        "/v1/sessions/ops/feedback",
        &json!({"memory_ids": [id], "outcome": "success"}),
    );
    assert_eq!(status, 200, "{answer}");
    id
}

/// The actions of a record's history, oldest first.
fn history(addr: std::net::SocketAddr, id: &str) -> Vec<String> {
    let (status, answer) = http(addr, "GET", &format!("/v1/memories/{id}/history"), None);
    assert_eq!(status, 200, "{answer}");
    answer["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["action"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// Polls the knowledge pool until a lesson promoted from `condensed` is there.
fn promoted(addr: std::net::SocketAddr, condensed: &str, within: Duration) -> Value {
    let started = Instant::now();
    loop {
        let (status, found) = post(
            addr,
            "/v1/knowledge/search",
            &json!({"query": "staging database password deploy", "k": 5}),
        );
        assert_eq!(status, 200, "{found}");
        let hit = found["memories"].as_array().and_then(|m| {
            m.iter()
                .find(|k| {
                    k["sources"]
                        .as_array()
                        .is_some_and(|s| s.iter().any(|s| s == condensed))
                })
                .cloned()
        });
        if let Some(hit) = hit {
            return hit;
        }
        assert!(
            started.elapsed() < within,
            "nothing promoted from {condensed} within {within:?}; its history: {:?}",
            history(addr, condensed)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// An embeddings endpoint that answers after `delay` milliseconds (settable while it runs).
fn slow_provider() -> (Arc<ConceptProvider>, Arc<AtomicU64>, Endpoint) {
    let provider = Arc::new(ConceptProvider::default());
    let delay = Arc::new(AtomicU64::new(0));
    let (p, d) = (provider.clone(), delay.clone());
    let endpoint = Endpoint::start_in_thread(move |r| {
        Reply::after(Duration::from_millis(d.load(Ordering::SeqCst)), p.answer(r))
    });
    (provider, delay, endpoint)
}

#[test]
fn feedback_before_a_slow_embedding_still_promotes() {
    let (_provider, delay, endpoint) = slow_provider();
    let dir = tempfile::tempdir().unwrap();
    let config = remote_config(dir.path(), &endpoint);
    let (served, addr) = serve(&dir.path().join("data"), Some(&config), &policy(dir.path()));
    // Every embedding takes 1.5 s to arrive: the feedback lands long before it.
    delay.store(1500, Ordering::SeqCst);
    let condensed = make_eligible(addr);
    let order = history(addr, &condensed);
    assert!(
        !order.iter().any(|a| a == "embedded"),
        "the embedding arrived before the feedback; the test shows nothing: {order:?}"
    );
    let knowledge = promoted(addr, &condensed, Duration::from_secs(60));
    let order = history(addr, &condensed);
    let at = |action: &str| order.iter().position(|a| a == action);
    assert!(
        at("reinforced") < at("embedded") && at("embedded") < at("promoted"),
        "feedback, then the embedding, then the promotion: {order:?}"
    );
    assert_eq!(knowledge["tier"], "knowledge", "{knowledge}");
    served.stop();
}

#[test]
fn a_promotion_waiting_for_its_embedding_survives_a_restart() {
    let (provider, _delay, endpoint) = slow_provider();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = remote_config(dir.path(), &endpoint);
    let policy = policy(dir.path());
    let (served, addr) = serve(&data, Some(&config), &policy);
    // The provider goes down before anything is embedded: the condensed record cannot be
    // embedded before the server stops.
    provider.set_down(true);
    let condensed = make_eligible(addr);
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        !history(addr, &condensed).iter().any(|a| a == "promoted"),
        "promoted without an embedding"
    );
    served.stop();
    provider.set_down(false);
    let (served, addr) = serve(&data, Some(&config), &policy);
    promoted(addr, &condensed, Duration::from_secs(90));
    served.stop();
}

#[test]
fn with_the_local_model_feedback_before_the_embedding_still_promotes() {
    let Some(_) = default_model_dir().filter(|d| is_model_dir(d)) else {
        assert!(
            std::env::var_os("SHADOWBRAIN_REQUIRE_MODEL").is_none(),
            "the local model is not installed; run scripts/install-model"
        );
        eprintln!("skipped: the local model is not installed (run scripts/install-model)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // No config: the default configuration, which embeds with the local model.
    let (served, addr) = serve(&dir.path().join("data"), None, &policy(dir.path()));
    let condensed = make_eligible(addr);
    promoted(addr, &condensed, Duration::from_secs(60));
    served.stop();
}
