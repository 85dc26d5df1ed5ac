//! Generated input through the real doors: request bodies mutated from valid ones, sent
//! through the server's router (a real runtime on a scratch directory), and policy files
//! mutated from the default one. Nothing may panic, no request may get a 5xx, every error
//! has the contract's shape, and what was accepted stays readable.
//!
//! `.ci/run` runs proptest's default number of cases; a long run sets `PROPTEST_CASES`:
//!
//! ```text
//! PROPTEST_CASES=200000 cargo test --release --test tests fuzz::
//! ```

use axum::body::Body;
use axum::http::{Request, StatusCode};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::Value;
use shadowbrain::http;
use shadowbrain::policy::Policy;
use shadowbrain::{Runtime, RuntimeConfig};
use tower::ServiceExt;

/// Valid bodies for each route: what mutation starts from.
const SEEDS: &[(&str, &str)] = &[
    (
        "/v1/sessions/s1/events",
        r#"{"kind": "observation", "text": "the nightly backup timed out", "agent_id": "a1", "importance": 4, "metadata": {"k": [1, 2.5, null, true]}, "timestamp": "2026-05-08T13:56:00Z"}"#,
    ),
    (
        "/v1/sessions/s1/events",
        r#"{"events": [{"kind": "goal", "text": "ship it"}, {"kind": "action", "content": {"tool": "grep", "args": ["-r", "x"]}}]}"#,
    ),
    (
        "/v1/sessions/s1/recall",
        r#"{"query": "backup", "k": 5, "scope": "session", "kinds": ["observation"], "since": "2026-01-01T00:00:00Z", "token_budget": 500}"#,
    ),
    (
        "/v1/sessions/s1/feedback",
        r#"{"memory_ids": ["mem-00000000"], "outcome": "success"}"#,
    ),
    ("/v1/knowledge/search", r#"{"query": "backup", "k": 3}"#),
];

/// `text` with `edits` applied: (position, operation, character) — delete, insert,
/// replace, or cut the rest.
fn mutate(text: &str, edits: &[(usize, u8, char)]) -> String {
    let mut chars: Vec<char> = text.chars().collect();
    for &(at, op, c) in edits {
        let at = at % (chars.len() + 1);
        match op {
            0 if at < chars.len() => {
                chars.remove(at);
            }
            1 => chars.insert(at, c),
            2 if at < chars.len() => chars[at] = c,
            3 => chars.truncate(at),
            _ => {}
        }
    }
    chars.into_iter().collect()
}

/// Characters that make JSON interesting: its punctuation, quotes, digits, escapes, and
/// now and then anything at all.
fn edit_char() -> impl Strategy<Value = char> {
    prop_oneof![
        8 => proptest::sample::select(
            "{}[]\":,.-+eE0123456789 \\ntrufalsn/".chars().collect::<Vec<_>>()
        ),
        1 => proptest::char::any(),
    ]
}

#[test]
fn mutated_bodies_never_get_a_5xx_and_every_error_has_the_contract_shape() {
    let dir = tempfile::tempdir().unwrap();
    let tokio = tokio::runtime::Runtime::new().unwrap();
    let rt = tokio
        .block_on(Runtime::open(RuntimeConfig::new(dir.path())))
        .unwrap();
    let app = http::router(rt.clone(), http::Options::default());
    let send = |path: &str, body: String| {
        let request = Request::post(path)
            .header("content-type", "application/json")
            .body(Body::from(body))
            .unwrap();
        tokio.block_on(async {
            let answer = app.clone().oneshot(request).await.unwrap();
            let status = answer.status();
            let bytes = axum::body::to_bytes(answer.into_body(), 1 << 24)
                .await
                .unwrap();
            (status, bytes)
        })
    };
    // Something accepted before the storm, to read back after it.
    let (status, first) = send(SEEDS[0].0, SEEDS[0].1.to_string());
    assert_eq!(status, StatusCode::CREATED);
    let first: Value = serde_json::from_slice(&first).unwrap();

    let mut runner = TestRunner::new(Config {
        failure_persistence: None,
        ..Config::default()
    });
    let strategy = (
        0..SEEDS.len(),
        proptest::collection::vec((0usize..400, 0u8..4, edit_char()), 0..10),
    );
    let statuses = std::cell::RefCell::new(std::collections::BTreeMap::<u16, usize>::new());
    runner
        .run(&strategy, |(which, edits)| {
            let (path, seed) = SEEDS[which];
            let body = mutate(seed, &edits);
            let (status, bytes) = send(path, body.clone());
            *statuses.borrow_mut().entry(status.as_u16()).or_default() += 1;
            prop_assert!(
                !status.is_server_error(),
                "{status} for {path} {body:?}: {}",
                String::from_utf8_lossy(&bytes)
            );
            if status.is_client_error() {
                let v: Value = serde_json::from_slice(&bytes).map_err(|e| {
                    TestCaseError::fail(format!("{status} not JSON ({e}) for {body:?}"))
                })?;
                prop_assert!(
                    v["error"]["code"].is_string() && v["error"]["message"].is_string(),
                    "{status} for {body:?}: {v}"
                );
            }
            Ok(())
        })
        .unwrap();
    // Both kinds of answers were reached: the mutations are neither all valid nor all noise.
    let statuses = statuses.into_inner();
    let accepted: usize = statuses
        .iter()
        .filter(|(s, _)| **s < 300)
        .map(|(_, n)| n)
        .sum();
    let refused: usize = statuses
        .iter()
        .filter(|(s, _)| **s >= 400)
        .map(|(_, n)| n)
        .sum();
    assert!(accepted > 0 && refused > 0, "{statuses:?}");
    eprintln!("fuzz: answers by status {statuses:?}");

    // What was accepted first is still there, unchanged.
    let id = first["ids"][0].as_str().unwrap();
    let request = Request::get(format!("/v1/memories/{id}"))
        .body(Body::empty())
        .unwrap();
    let (status, record) = tokio.block_on(async {
        let answer = app.clone().oneshot(request).await.unwrap();
        let status = answer.status();
        let bytes = axum::body::to_bytes(answer.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, serde_json::from_slice::<Value>(&bytes).unwrap())
    });
    assert_eq!(status, StatusCode::OK);
    assert_eq!(record["text"], "the nightly backup timed out");
    tokio.block_on(rt.shutdown()).unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]

    /// The default policy file, mutated: it compiles or is refused with issues that each
    /// say something; it never panics.
    #[test]
    fn mutated_policy_files_compile_or_are_refused_with_reasons(
        edits in proptest::collection::vec(
            (0usize..6000, 0u8..4, prop_oneof![
                6 => proptest::sample::select("=[]\"#.,0123456789 \nabcdefghijklmnopqrstuvwxyz_-".chars().collect::<Vec<_>>()),
                1 => proptest::char::any(),
            ]),
            0..6,
        ),
    ) {
        let text = mutate(DEFAULT_POLICY, &edits);
        if let Err(errors) = Policy::from_toml("fuzz.toml", &text) {
            let shown = errors.to_string();
            prop_assert!(shown.len() > 10, "{shown}");
        }
    }
}

/// The documented default policy file.
const DEFAULT_POLICY: &str = include_str!("../policies/default.toml");
