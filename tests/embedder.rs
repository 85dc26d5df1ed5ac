//! Embedders as a user meets them: the `shadowbrain` binary (`serve`, `reindex`) with a
//! remote OpenAI-compatible embeddings endpoint served by the test on 127.0.0.1 — records
//! are embedded in the background, once, through the provider being down and a restart,
//! and a paraphrase with no word in common finds its record.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use shadowbrain_test_support::Endpoint;
use shadowbrain_test_support::concepts::ConceptProvider;

use crate::common::config::remote_config;
use crate::common::http::{http, http_text, post};
use crate::common::serve::{self, Served};

/// A scripted embeddings provider of the toy concept model, on a thread of its own.
fn provider() -> (Arc<ConceptProvider>, Endpoint) {
    let provider = Arc::new(ConceptProvider::default());
    let p = provider.clone();
    let endpoint = Endpoint::start_in_thread(move |r| p.answer(r));
    (provider, endpoint)
}

/// `serve` over `data` with the config file `config`, and its address.
fn serve(data: &Path, config: &Path) -> (Served, std::net::SocketAddr) {
    let served = serve::new().data(data).config_file(config).start();
    let addr = served.addr;
    (served, addr)
}

/// The value of the metric line that starts with `name` (labels included).
fn metric(addr: std::net::SocketAddr, name: &str) -> f64 {
    let metrics = http_text(addr, "/metrics");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("`{name}` missing from:\n{metrics}"))
}

const QUEUED: &str = r#"shadowbrain_work_queue_depth{queue="enrich"}"#;
const OLDEST: &str = r#"shadowbrain_work_queue_oldest_seconds{queue="enrich"}"#;

/// Waits until `/metrics` says no record waits for its embedding.
fn drained(addr: std::net::SocketAddr) {
    let start = Instant::now();
    while metric(addr, QUEUED) > 0.0 {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{} records still wait for their embedding",
            metric(addr, QUEUED)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn chatter(i: usize) -> String {
    const WORDS: &[&str] = &["weather", "agenda", "printer", "coffee", "invoice", "river"];
    format!("note {i}: {} {}", WORDS[i % 6], WORDS[(i * 5 + 1) % 6])
}

fn record(addr: std::net::SocketAddr, session: &str, text: &str) -> String {
    let (status, answer) = post(
        addr,
        &format!("/v1/sessions/{session}/events"),
        &json!({"kind": "observation", "text": text}),
    );
    assert_eq!(status, 201, "{answer}");
    answer["ids"][0].as_str().unwrap().to_string()
}

/// A namespace-wide recall from a session that wrote nothing.
fn ask(addr: std::net::SocketAddr, query: &str) -> Value {
    let (status, answer) = post(
        addr,
        "/v1/sessions/asker/recall",
        &json!({"query": query, "k": 5, "scope": "namespace"}),
    );
    assert_eq!(status, 200, "{answer}");
    answer
}

fn top(answer: &Value) -> Option<&str> {
    answer["memories"][0]["id"].as_str()
}

#[test]
fn serve_embeds_every_record_once_and_a_paraphrase_finds_its_record() {
    let (provider, endpoint) = provider();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (served, addr) = serve(&data, &remote_config(dir.path(), &endpoint));
    for i in 0..42 {
        record(addr, &format!("s{}", i % 3), &chatter(i));
    }
    let target = record(addr, "s1", "we bought a sedan for the team last week");
    drained(addr);
    assert_eq!(metric(addr, OLDEST), 0.0);
    for i in 0..42 {
        assert_eq!(provider.times_embedded(&chatter(i)), 1, "{}", chatter(i));
    }
    assert!(endpoint.max_in_flight() <= 2);
    let answer = ask(addr, "acquired automobile");
    assert_eq!(top(&answer), Some(target.as_str()), "{answer}");
    assert!(answer.get("notes").is_none(), "{answer}");
    served.stop();
}

const HITS: &str = r#"shadowbrain_embed_cache_lookups_total{result="hit"}"#;
const MISSES: &str = r#"shadowbrain_embed_cache_lookups_total{result="miss"}"#;

#[test]
fn serve_embeds_a_text_it_has_seen_once() {
    let (provider, endpoint) = provider();
    let dir = tempfile::tempdir().unwrap();
    let (served, addr) = serve(
        &dir.path().join("data"),
        &remote_config(dir.path(), &endpoint),
    );
    let (hits, misses) = (metric(addr, HITS), metric(addr, MISSES));
    // An agent's status line, written by five sessions, each enriched in its own round
    // (so the cache answers, not the batching of one round), and once more twice in one
    // call.
    const STATUS: &str = "status: the nightly build is green";
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(record(addr, &format!("s{i}"), STATUS));
        drained(addr);
    }
    let (status, answer) = post(
        addr,
        "/v1/sessions/s5/events",
        &json!({"events": [{"kind": "observation", "text": STATUS},
                           {"kind": "observation", "text": STATUS}]}),
    );
    assert_eq!(status, 201, "{answer}");
    drained(addr);
    assert_eq!(
        provider.times_embedded(STATUS),
        1,
        "embedded once for 7 records"
    );
    // A question asked twice is embedded once too.
    let question = "is the build green tonight?";
    let first = ask(addr, question);
    // (Its answer may rank differently: the first recall reinforced what it returned.)
    ask(addr, question);
    assert_eq!(provider.times_embedded(question), 1);
    assert_eq!(
        metric(addr, HITS) - hits,
        6.0 + 1.0,
        "six records and one question"
    );
    assert_eq!(
        metric(addr, MISSES) - misses,
        2.0,
        "the status line and the question"
    );
    // The copies are what the question finds (k = 5 of the 7), each with the one vector.
    let found = first["memories"].as_array().unwrap();
    assert_eq!(found.len(), 5, "{first}");
    assert!(found.iter().all(|m| m["text"] == STATUS), "{first}");
    assert!(
        ids.iter()
            .any(|id| found.iter().any(|m| m["id"] == id.as_str()))
    );
    served.stop();
}

#[test]
fn serve_outlasts_a_provider_outage_and_a_restart_mid_queue() {
    let (provider, endpoint) = provider();
    provider.set_down(true);
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = remote_config(dir.path(), &endpoint);
    let (served, addr) = serve(&data, &config);
    for i in 0..20 {
        record(addr, "ops", &chatter(i));
    }
    let runner = record(addr, "ops", "the deploy runner moved to eu-2");
    std::thread::sleep(Duration::from_millis(1_200));
    // The lag shows in records and in seconds.
    assert_eq!(metric(addr, QUEUED), 21.0);
    assert!(metric(addr, OLDEST) >= 1.0, "{}", metric(addr, OLDEST));
    // Keyword recall still answers, and says what it went without.
    let (status, answer) = post(
        addr,
        "/v1/sessions/ops/recall",
        &json!({"query": "deploy runner"}),
    );
    assert_eq!(status, 200, "{answer}");
    assert_eq!(top(&answer), Some(runner.as_str()), "{answer}");
    assert!(
        answer["notes"][0]
            .as_str()
            .is_some_and(|n| n.contains("no vector path")),
        "{answer}"
    );
    // Stopped with the records still queued, started again with the provider back.
    served.stop();
    provider.set_down(false);
    let (served, addr) = serve(&data, &config);
    drained(addr);
    for i in 0..20 {
        assert_eq!(provider.times_embedded(&chatter(i)), 1, "{}", chatter(i));
    }
    assert_eq!(
        provider.times_embedded("the deploy runner moved to eu-2"),
        1
    );
    let (_, answer) = post(
        addr,
        "/v1/sessions/ops/recall",
        &json!({"query": "deploy runner"}),
    );
    assert!(answer.get("notes").is_none(), "{answer}");
    served.stop();
}

#[test]
fn reindex_moves_a_hash_store_to_a_remote_embedder() {
    let (provider, endpoint) = provider();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let hash = dir.path().join("hash.toml");
    std::fs::write(&hash, "[embedder]\nkind = \"hash\"\n").unwrap();
    let (served, addr) = serve(&data, &hash);
    for i in 0..10 {
        record(addr, "s", &chatter(i));
    }
    let target = record(addr, "s", "we bought a sedan for the team last week");
    served.stop();

    let remote = remote_config(dir.path(), &endpoint);
    // The other embedder is refused on this directory, with the way out.
    let refused = serve::new().data(&data).config_file(&remote).output();
    let said = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{said}");
    assert!(said.contains("shadowbrain reindex"), "{said}");

    let out = Command::new(env!("CARGO_BIN_EXE_shadowbrain"))
        .args(["reindex", "--data"])
        .arg(&data)
        .arg("--config")
        .arg(&remote)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    assert!(said.contains("reindexed 11 records"), "{said}");
    for i in 0..10 {
        assert_eq!(provider.times_embedded(&chatter(i)), 1, "{}", chatter(i));
    }
    let (served, addr) = serve(&data, &remote);
    assert_eq!(metric(addr, QUEUED), 0.0);
    assert_eq!(
        top(&ask(addr, "acquired automobile")),
        Some(target.as_str())
    );
    served.stop();
}

/// A long tool output: a table of `rows` border lines (no words), with `detail` in the
/// middle.
fn tool_output(rows: usize, detail: &str) -> String {
    let border = "+----------+----------+----------+----------+";
    let mut lines = vec![border; rows];
    lines.insert(rows * 2 / 3, detail);
    lines.join("\n")
}

#[test]
fn serve_keeps_a_long_event_whole_and_finds_it_by_a_passage_deep_inside() {
    let (provider, endpoint) = provider();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (served, addr) = serve(&data, &remote_config(dir.path(), &endpoint));
    let detail = "| note: we bought a sedan for the team |";
    // 150 KB: well past 64 KiB, a common default body limit, to show the limit is ours.
    let text = tool_output(3_300, detail);
    assert!(text.len() > 150_000);
    let long = record(addr, "ops", &text);
    // Nearer the question than the long record's mean vector, which the borders dilute.
    let near = record(addr, "ops", "the vehicle inspection is due");
    for i in 0..10 {
        record(addr, "ops", &chatter(i));
    }
    drained(addr);
    // Every passage was embedded once (the detail's passages each hold it).
    for i in 0..10 {
        assert_eq!(provider.times_embedded(&chatter(i)), 1);
    }
    let (status, stored) = http(addr, "GET", &format!("/v1/memories/{long}"), None);
    assert_eq!(status, 200, "{stored}");
    assert_eq!(stored["text"].as_str(), Some(text.as_str()), "kept whole");

    let (status, answer) = post(
        addr,
        "/v1/sessions/ops/recall",
        &json!({"query": "acquired automobile", "k": 3}),
    );
    assert_eq!(status, 200, "{answer}");
    assert_eq!(top(&answer), Some(long.as_str()), "{answer}");
    assert_eq!(answer["memories"][1]["id"].as_str(), Some(near.as_str()));
    let passage = &answer["memories"][0]["why"]["passage"];
    let (start, end) = (
        passage["start"].as_u64().unwrap() as usize,
        passage["end"].as_u64().unwrap() as usize,
    );
    assert!(text[start..end].contains(detail), "{passage}");
    assert!(passage["of"].as_u64().unwrap() > 100, "{passage}");
    assert!(answer["memories"][1]["why"].get("passage").is_none());
    let context = answer["context"].as_str().unwrap();
    assert!(context.contains("we bought a sedan"), "{context}");
    assert!(context.len() < 2_000, "a passage, not 150 KB: {context}");
    served.stop();
}
