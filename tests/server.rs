//! The HTTP server, spoken to over real sockets: a server on port 0 in this process for the
//! contract's answers and errors, and the binary itself for a graceful SIGTERM.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::{Value, json};
use shadowbrain::auth::{ApiKey, Auth, Role};
use shadowbrain::{Runtime, RuntimeConfig};

use crate::common::config::sha256_hex;
use crate::common::http::{exchange, http, http_as, http_text, post};
use crate::common::serve;

fn error_code(answer: &Value) -> &str {
    answer["error"]["code"]
        .as_str()
        .unwrap_or("<no error code>")
}

#[test]
fn record_recall_timeline_and_get_follow_the_contract() {
    let server = serve::in_process(Auth::open());
    let addr = server.addr;

    let (status, health) = http(addr, "GET", "/healthz", None);
    assert_eq!((status, health["status"].as_str()), (200, Some("ok")));

    let (status, one) = post(
        addr,
        "/v1/sessions/agent-7:run.1/events",
        &json!({"kind": "observation", "text": "the nightly backup job timed out at 02:00",
                "timestamp": "2026-05-08T13:56:00Z", "agent_id": "a7"}),
    );
    assert_eq!(status, 201, "{one}");
    assert_eq!(one["ids"].as_array().map(Vec::len), Some(1));
    let (status, two) = post(
        addr,
        "/v1/sessions/agent-7:run.1/events",
        &json!({"events": [
            {"kind": "action", "text": "raised the backup timeout to 4 hours"},
            {"kind": "user_message", "text": "thanks, the backups look healthy now"}
        ]}),
    );
    assert_eq!(status, 201, "{two}");
    assert_eq!(two["ids"].as_array().map(Vec::len), Some(2));

    let (status, recall) = post(
        addr,
        "/v1/sessions/agent-7:run.1/recall",
        &json!({"query": "why did the backup fail?", "k": 5}),
    );
    assert_eq!(status, 200, "{recall}");
    assert!(recall["recall_id"].is_string(), "{recall}");
    assert!(recall["policy"]["name"].is_string() && recall["policy"]["hash"].is_string());
    let memories = recall["memories"].as_array().expect("memories");
    assert!(!memories.is_empty(), "{recall}");
    let first = &memories[0];
    for field in [
        "id",
        "tier",
        "kind",
        "text",
        "session_id",
        "timestamp",
        "score",
    ] {
        assert!(!first[field].is_null(), "`{field}` missing from {first}");
    }
    for part in ["relevance", "recency", "importance", "utility"] {
        assert!(
            first["why"][part].is_number(),
            "why.{part} missing from {first}"
        );
    }
    assert!(
        memories
            .iter()
            .any(|m| m["text"].as_str().is_some_and(|t| t.contains("timed out")))
    );
    let timed_out = memories
        .iter()
        .find(|m| m["text"].as_str().is_some_and(|t| t.contains("timed out")))
        .unwrap();
    assert_eq!(timed_out["timestamp"], "2026-05-08T13:56:00.000Z");
    assert!(
        recall["context"]
            .as_str()
            .is_some_and(|c| c.contains("backup"))
    );

    let (status, timeline) = http(
        addr,
        "GET",
        "/v1/sessions/agent-7:run.1/timeline?limit=10",
        None,
    );
    assert_eq!(status, 200, "{timeline}");
    let items = timeline["items"].as_array().expect("items");
    assert_eq!(items.len(), 3);
    assert!(
        items[0]["text"].as_str().unwrap().contains("healthy"),
        "newest first"
    );

    let id = one["ids"][0].as_str().unwrap();
    let (status, record) = http(addr, "GET", &format!("/v1/memories/{id}"), None);
    assert_eq!(status, 200, "{record}");
    assert_eq!(record["id"], id);
    assert_eq!(record["agent_id"], "a7");
    assert!(record.get("embedding").is_none());

    let metrics = http_text(addr, "/metrics");
    for line in [
        "shadowbrain_events_ingested_total 3",
        "shadowbrain_recalls_total 1",
        r#"shadowbrain_http_requests_total{route="/v1/sessions/{session_id}/events",method="POST",status="201"} 2"#,
        "shadowbrain_records 3",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "`{line}` missing from:\n{metrics}"
        );
    }
    for name in [
        "shadowbrain_http_request_duration_seconds_bucket",
        "shadowbrain_live_session_actors",
        "shadowbrain_actor_restarts",
        "shadowbrain_quarantined_inputs",
        r#"shadowbrain_index_unbuilt_changes{index="vectors"}"#,
    ] {
        assert!(metrics.contains(name), "`{name}` missing from:\n{metrics}");
    }
}

#[test]
fn feedback_condense_sessions_memories_knowledge_and_policy_answer() {
    let server = serve::in_process(Auth::open());
    let addr = server.addr;
    let texts = [
        "deploys fail when the cache is cold",
        "warmed the cache before the deploy",
        "the deploy went through after warming the cache",
        "note to self: always warm the cache before deploying",
        "the second deploy of the day was quick with a warm cache",
        "wrote a runbook step: warm the cache, then deploy",
    ];
    let events: Vec<Value> = texts
        .iter()
        .map(|t| json!({"kind": "observation", "text": t}))
        .collect();
    let (status, recorded) = post(addr, "/v1/sessions/ops/events", &json!({"events": events}));
    assert_eq!(status, 201, "{recorded}");
    let id = recorded["ids"][0].as_str().unwrap().to_string();

    let (_, recall) = post(
        addr,
        "/v1/sessions/ops/recall",
        &json!({"query": "deploy cache"}),
    );
    let recall_id = recall["recall_id"].as_str().unwrap();
    let (status, fed) = post(
        addr,
        "/v1/sessions/ops/feedback",
        &json!({"recall_id": recall_id, "outcome": "success"}),
    );
    assert_eq!(status, 200, "{fed}");
    assert!(fed["updated"].as_u64().unwrap() >= 1, "{fed}");
    let (status, fed) = post(
        addr,
        "/v1/sessions/ops/feedback",
        &json!({"memory_ids": [id], "outcome": "failure"}),
    );
    assert_eq!((status, fed["updated"].as_u64()), (200, Some(1)), "{fed}");
    let (status, both) = post(
        addr,
        "/v1/sessions/ops/feedback",
        &json!({"recall_id": recall_id, "memory_ids": [id], "outcome": "success"}),
    );
    assert_eq!(
        (status, error_code(&both)),
        (422, "invalid_feedback"),
        "{both}"
    );

    let (status, condensed) = post(addr, "/v1/sessions/ops/condense", &json!({}));
    assert_eq!(status, 200, "{condensed}");
    let condensed_id = condensed["memory_id"]
        .as_str()
        .expect("six events condense (the default policy's minimum is five)");
    let (status, record) = http(addr, "GET", &format!("/v1/memories/{condensed_id}"), None);
    assert_eq!(
        (status, record["tier"].as_str()),
        (200, Some("condensed")),
        "{record}"
    );

    let (status, sessions) = http(addr, "GET", "/v1/sessions", None);
    assert_eq!(status, 200, "{sessions}");
    let ops = sessions["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["session_id"] == "ops")
        .expect("the session is listed");
    assert_eq!(ops["events"], 6, "{ops}");
    assert!(ops["last_active"].is_string(), "{ops}");

    let memory = format!("/v1/memories/{id}");
    let (status, pinned) = http(addr, "PATCH", &memory, Some(br#"{"status":"pinned"}"#));
    assert_eq!(
        (status, pinned["status"].as_str()),
        (200, Some("pinned")),
        "{pinned}"
    );
    let (status, wrong) = http(addr, "PATCH", &memory, Some(br#"{"status":"archived"}"#));
    assert_eq!(
        (status, error_code(&wrong)),
        (422, "invalid_status"),
        "{wrong}"
    );
    let (status, archived) = http(addr, "DELETE", &memory, None);
    assert_eq!(
        (status, archived["status"].as_str()),
        (200, Some("archived"))
    );
    let (status, history) = http(addr, "GET", &format!("{memory}/history"), None);
    assert_eq!(status, 200, "{history}");
    let entries = history["entries"].as_array().unwrap();
    assert!(entries.len() >= 3, "recorded, pinned, archived: {history}");
    assert!(
        entries
            .iter()
            .all(|e| e["at"].is_string() && e["by"].is_string())
    );
    assert!(entries.iter().any(|e| e["by"] == "api"), "{history}");

    // The runtime's figures, read when scraped.
    let metrics = http_text(addr, "/metrics");
    for line in [
        "shadowbrain_archived_records 1",
        r#"shadowbrain_records_by_tier{tier="condensed"} 1"#,
        r#"shadowbrain_records_by_tier{tier="knowledge"} 0"#,
        "shadowbrain_session_messages_in_flight 0",
        "shadowbrain_provider_errors_total 0",
        "shadowbrain_index_rebuilds_total 0",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "`{line}` missing from:\n{metrics}"
        );
    }
    for name in [
        r#"shadowbrain_work_queue_depth{queue="enrich"}"#,
        r#"shadowbrain_work_queue_depth{queue="condense"}"#,
        "shadowbrain_store_commit_backlog",
        "shadowbrain_promotions_total",
    ] {
        assert!(metrics.contains(name), "`{name}` missing from:\n{metrics}");
    }

    let (status, knowledge) = post(
        addr,
        "/v1/knowledge/search",
        &json!({"query": "cache deploy", "k": 5}),
    );
    assert_eq!(status, 200, "{knowledge}");
    assert!(knowledge["memories"].is_array(), "{knowledge}");
    let (status, graph) = http(
        addr,
        "GET",
        &format!("/v1/knowledge/graph?around={condensed_id}&depth=1"),
        None,
    );
    assert_eq!(status, 200, "{graph}");
    assert!(
        graph["nodes"].is_array() && graph["edges"].is_array(),
        "{graph}"
    );
    let (status, deep) = http(
        addr,
        "GET",
        &format!("/v1/knowledge/graph?around={condensed_id}&depth=50"),
        None,
    );
    assert_eq!(
        (status, error_code(&deep)),
        (422, "invalid_depth"),
        "{deep}"
    );

    let (status, policy) = http(addr, "GET", "/v1/policy", None);
    assert_eq!(status, 200, "{policy}");
    assert!(policy["name"].is_string() && policy["hash"].is_string());
    assert!(policy["policy"].is_object(), "{policy}");
    // Opened without a policy file: nothing to reload, and it says how to get one.
    let (status, reload) = http(addr, "POST", "/v1/policy/reload", None);
    assert_eq!(
        (status, error_code(&reload)),
        (422, "invalid_policy"),
        "{reload}"
    );
    assert!(
        reload["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--policy")
    );
}

#[test]
fn api_keys_separate_namespaces_and_unknown_keys_get_401() {
    let keys = [("key-of-acme", "acme"), ("key-of-globex", "globex")].map(|(k, ns)| ApiKey {
        sha256: sha256_hex(k),
        namespace: ns.into(),
        role: Role::Tenant,
    });
    let server = serve::in_process(Auth::with_keys(&keys).unwrap());
    let addr = server.addr;
    let event = json!({"kind": "goal", "text": "the acme launch is on friday"});
    let body = event.to_string();
    let events = "/v1/sessions/s1/events";

    let (status, none) = http(addr, "POST", events, Some(body.as_bytes()));
    assert_eq!((status, error_code(&none)), (401, "unauthorized"), "{none}");
    let (status, wrong) = http_as(
        addr,
        Some("not-a-key"),
        "POST",
        events,
        Some(body.as_bytes()),
    );
    assert_eq!(
        (status, error_code(&wrong)),
        (401, "unauthorized"),
        "{wrong}"
    );
    assert_eq!(
        http(addr, "GET", "/healthz", None).0,
        200,
        "health needs no key"
    );

    let (status, acme) = http_as(
        addr,
        Some("key-of-acme"),
        "POST",
        events,
        Some(body.as_bytes()),
    );
    assert_eq!(status, 201, "{acme}");
    let id = acme["ids"][0].as_str().unwrap();
    let memory = format!("/v1/memories/{id}");
    let (status, _) = http_as(addr, Some("key-of-acme"), "GET", &memory, None);
    assert_eq!(status, 200);
    // Another namespace's record cannot be named as a parent.
    let linked = json!({"kind": "goal", "text": "ours", "parent_id": id}).to_string();
    let (status, refused) = http_as(
        addr,
        Some("key-of-globex"),
        "POST",
        events,
        Some(linked.as_bytes()),
    );
    assert_eq!(
        (status, error_code(&refused)),
        (422, "invalid_parent_id"),
        "{refused}"
    );
    let (status, hidden) = http_as(addr, Some("key-of-globex"), "GET", &memory, None);
    assert_eq!(
        (status, error_code(&hidden)),
        (404, "not_found"),
        "{hidden}"
    );
    let (status, hidden) = http_as(addr, Some("key-of-globex"), "DELETE", &memory, None);
    assert_eq!(status, 404, "{hidden}");

    // The same session id in the other namespace is another session.
    let recall = json!({"query": "when is the launch?"}).to_string();
    let (status, theirs) = http_as(
        addr,
        Some("key-of-globex"),
        "POST",
        "/v1/sessions/s1/recall",
        Some(recall.as_bytes()),
    );
    assert_eq!(status, 200, "{theirs}");
    assert_eq!(
        theirs["memories"].as_array().map(Vec::len),
        Some(0),
        "{theirs}"
    );
    let (_, sessions) = http_as(addr, Some("key-of-globex"), "GET", "/v1/sessions", None);
    assert!(
        sessions["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["events"] == 0),
        "globex has written nothing: {sessions}"
    );
    let (_, ours) = http_as(
        addr,
        Some("key-of-acme"),
        "POST",
        "/v1/sessions/s1/recall",
        Some(recall.as_bytes()),
    );
    assert_eq!(ours["memories"].as_array().map(Vec::len), Some(1), "{ours}");

    let bad = [ApiKey {
        sha256: "the-key-itself".into(),
        namespace: "acme".into(),
        role: Role::Tenant,
    }];
    let err = Auth::with_keys(&bad).unwrap_err().to_string();
    assert!(err.contains("sha256sum"), "{err}");
}

#[test]
fn server_wide_operations_need_an_admin_key() {
    let keys = [
        ("key-of-acme", "acme", Role::Tenant),
        ("key-of-ops", "ops", Role::Admin),
    ]
    .map(|(k, ns, role)| ApiKey {
        sha256: sha256_hex(k),
        namespace: ns.into(),
        role,
    });
    let server = serve::in_process(Auth::with_keys(&keys).unwrap());
    let addr = server.addr;
    let reload = "/v1/policy/reload";

    // A tenant can neither change the policy every namespace runs nor read every
    // namespace's activity; without a key, 401 as everywhere.
    let (status, tenant) = http_as(addr, Some("key-of-acme"), "POST", reload, None);
    assert_eq!(
        (status, error_code(&tenant)),
        (403, "forbidden"),
        "{tenant}"
    );
    assert!(
        tenant["error"]["message"]
            .as_str()
            .unwrap()
            .contains("role = \"admin\"")
    );
    let (status, tenant) = http_as(addr, Some("key-of-acme"), "GET", "/metrics", None);
    assert_eq!(
        (status, error_code(&tenant)),
        (403, "forbidden"),
        "{tenant}"
    );
    let (status, none) = http_as(addr, None, "GET", "/metrics", None);
    assert_eq!((status, error_code(&none)), (401, "unauthorized"), "{none}");
    let (status, none) = http_as(addr, None, "POST", reload, None);
    assert_eq!((status, error_code(&none)), (401, "unauthorized"), "{none}");

    // The admin key can, and still sees only its own namespace's data.
    // (This server runs without a policy file, so the reload itself answers 422.)
    let (status, policy) = http_as(addr, Some("key-of-ops"), "POST", reload, None);
    assert_eq!(
        (status, error_code(&policy)),
        (422, "invalid_policy"),
        "{policy}"
    );
    let (status, text) = exchange(addr, Some("key-of-ops"), "GET", "/metrics", None).unwrap();
    assert_eq!(status, 200);
    assert!(text.contains("shadowbrain_"), "{text}");
    let event = json!({"kind": "goal", "text": "acme ships on friday"}).to_string();
    let (status, _) = http_as(
        addr,
        Some("key-of-acme"),
        "POST",
        "/v1/sessions/s1/events",
        Some(event.as_bytes()),
    );
    assert_eq!(status, 201);
    let recall = json!({"query": "when does acme ship?"}).to_string();
    let (_, seen) = http_as(
        addr,
        Some("key-of-ops"),
        "POST",
        "/v1/sessions/s1/recall",
        Some(recall.as_bytes()),
    );
    assert_eq!(seen["memories"].as_array().map(Vec::len), Some(0), "{seen}");

    // The scheme is case-insensitive.
    let mut stream = TcpStream::connect(addr).unwrap();
    write!(
        stream,
        "GET /v1/sessions HTTP/1.1\r\nHost: x\r\nAuthorization: bearer key-of-acme\r\n\
         Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).unwrap();
    assert!(raw.starts_with("HTTP/1.1 200"), "{raw}");

    // A role the config does not know is refused with the choices.
    let err = toml::from_str::<ApiKey>("sha256 = \"x\"\nnamespace = \"a\"\nrole = \"root\"")
        .unwrap_err()
        .to_string();
    assert!(err.contains("tenant") && err.contains("admin"), "{err}");
}

#[test]
fn bad_requests_get_the_right_status_and_code_and_the_server_keeps_serving() {
    let server = serve::in_process(Auth::open());
    let addr = server.addr;
    let events = "/v1/sessions/s1/events";
    let (status, first) = post(addr, events, &json!({"kind": "goal", "text": "ship it"}));
    assert_eq!(status, 201);

    let cases: Vec<(&str, (u16, Value), u16, &str)> = vec![
        (
            "malformed JSON",
            http(addr, "POST", events, Some(b"{\"kind\": \"goal\", ")),
            400,
            "malformed_json",
        ),
        (
            "bad kind",
            post(addr, events, &json!({"kind": "Not A Kind!", "text": "x"})),
            422,
            "invalid_kind",
        ),
        (
            "missing kind",
            post(addr, events, &json!({"text": "no kind"})),
            422,
            "invalid_event",
        ),
        (
            "bad session id",
            post(
                addr,
                "/v1/sessions/bad%20id/events",
                &json!({"kind": "goal", "text": "x"}),
            ),
            422,
            "invalid_session_id",
        ),
        (
            "oversize text",
            post(
                addr,
                events,
                &json!({"kind": "goal", "text": "x".repeat((1 << 20) + 1)}),
            ),
            413,
            "too_large",
        ),
        (
            "oversize body",
            http(addr, "POST", events, Some(&vec![b' '; 9 << 20])),
            413,
            "body_too_large",
        ),
        (
            "wrong-dimension embedding",
            post(
                addr,
                events,
                &json!({"kind": "goal", "text": "x", "embedding": [0.1, 0.2, 0.3]}),
            ),
            422,
            "dimension_mismatch",
        ),
        (
            "k out of range",
            post(
                addr,
                "/v1/sessions/s1/recall",
                &json!({"query": "ship", "k": 0}),
            ),
            422,
            "invalid_k",
        ),
        (
            "token budget over the limit",
            post(
                addr,
                "/v1/sessions/s1/recall",
                &json!({"query": "ship", "token_budget": 40_000}),
            ),
            422,
            "invalid_token_budget",
        ),
        (
            "unknown memory",
            http(addr, "GET", "/v1/memories/mem-0000ffff", None),
            404,
            "not_found",
        ),
        (
            "malformed memory id",
            http(addr, "GET", "/v1/memories/m_0000ffff", None),
            422,
            "invalid_memory_id",
        ),
        (
            "unknown route",
            http(addr, "GET", "/v1/nothing-here", None),
            404,
            "no_such_route",
        ),
        (
            "a repeated key in an event",
            http(
                addr,
                "POST",
                events,
                Some(br#"{"kind": "goal", "text": "one", "text": "two"}"#),
            ),
            422,
            "invalid_event",
        ),
        (
            "a repeated key in a recall",
            http(
                addr,
                "POST",
                "/v1/sessions/s1/recall",
                Some(br#"{"query": "one", "query": "two"}"#),
            ),
            422,
            "invalid_recall",
        ),
        (
            "a number for a timestamp",
            post(
                addr,
                events,
                &json!({"kind": "goal", "text": "x", "timestamp": 9_223_372_036_854_775_807i64}),
            ),
            422,
            "invalid_timestamp",
        ),
        (
            "a parent that is no record",
            post(
                addr,
                events,
                &json!({"kind": "goal", "text": "x", "parent_id": "mem-7fffffff"}),
            ),
            422,
            "invalid_parent_id",
        ),
        (
            "a parent that is not an id",
            post(
                addr,
                events,
                &json!({"events": [
                    {"kind": "goal", "text": "fine"},
                    {"kind": "goal", "text": "x", "parent_id": "my-own-id"}
                ]}),
            ),
            422,
            "invalid_parent_id",
        ),
    ];
    // A real parent is accepted.
    let parent = first["ids"][0].as_str().unwrap();
    let (status, child) = post(
        addr,
        events,
        &json!({"kind": "action", "text": "shipped", "parent_id": parent}),
    );
    assert_eq!(status, 201, "{child}");
    for (what, (status, answer), want_status, want_code) in cases {
        assert_eq!(status, want_status, "{what}: {answer}");
        assert_eq!(error_code(&answer), want_code, "{what}: {answer}");
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(message.len() > 20, "{what}: a message that helps: {answer}");
    }

    // Still serving, and what was accepted is still there.
    assert_eq!(http(addr, "GET", "/healthz", None).0, 200);
    let id = first["ids"][0].as_str().unwrap();
    let (status, record) = http(addr, "GET", &format!("/v1/memories/{id}"), None);
    assert_eq!((status, record["text"].as_str()), (200, Some("ship it")));
}

#[test]
fn sigterm_drains_flushes_and_exits_zero() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut served = serve::new()
        .data(&data)
        .env("RUST_LOG", "shadowbrain=debug")
        // The hash embedder, which the library default below opens the directory with.
        .env("SHADOWBRAIN_MODEL_DIR", "")
        .start();
    let addr = served.addr;
    let mut ids = Vec::new();
    for i in 0..20 {
        let (status, answer) = post(
            addr,
            "/v1/sessions/s1/events",
            &json!({"kind": "observation", "text": format!("event number {i}")}),
        );
        assert_eq!(status, 201, "{answer}");
        ids.push(answer["ids"][0].as_str().unwrap().to_string());
    }
    served.terminate();
    let exit = served.wait();
    let said = served.said();
    assert_eq!(exit.code(), Some(0), "{exit:?}: {said}");
    assert!(said.contains("drained and flushed"), "{said}");
    // Each request ran in a span naming it, and was logged when answered.
    let answered = said
        .lines()
        .filter(|l| {
            l.contains("request{id=")
                && l.contains("method=POST route=/v1/sessions/{session_id}/events")
                && l.contains("answered status=201")
        })
        .count();
    assert_eq!(answered, 20, "{said}");

    let tokio = tokio::runtime::Runtime::new().unwrap();
    tokio.block_on(async {
        let rt = Runtime::open(RuntimeConfig::new(&data)).await.unwrap();
        let timeline = rt
            .session("default", "s1")
            .unwrap()
            .timeline(100)
            .await
            .unwrap();
        let mut found: Vec<String> = timeline.iter().map(|r| r.id.to_string()).collect();
        found.sort();
        ids.sort();
        assert_eq!(found, ids);
        rt.shutdown().await.unwrap();
    });
}

#[test]
fn kill_9_during_concurrent_ingest_loses_no_acknowledged_event() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let served = serve::new().data(&data).start();
    let addr = served.addr;
    let acknowledged = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let writers: Vec<_> = (0..8)
        .map(|w| {
            let acknowledged = acknowledged.clone();
            std::thread::spawn(move || {
                for batch in 0.. {
                    let events: Vec<Value> = (0..20)
                        .map(|i| json!({"kind": "observation", "text": format!("writer {w} batch {batch} event {i}")}))
                        .collect();
                    let body = json!({ "events": events }).to_string();
                    // Once the server is killed, connecting or reading fails: stop there.
                    let answer = exchange(
                        addr,
                        None,
                        "POST",
                        &format!("/v1/sessions/w{w}/events"),
                        Some(body.as_bytes()),
                    );
                    match answer {
                        Ok((201, text)) => {
                            let ids: Value = serde_json::from_str(&text).unwrap();
                            acknowledged.lock().unwrap().extend(
                                ids["ids"]
                                    .as_array()
                                    .unwrap()
                                    .iter()
                                    .map(|id| id.as_str().unwrap().to_string()),
                            )
                        }
                        _ => return,
                    }
                }
            })
        })
        .collect();
    // Let the writers get going, then kill the server with no chance to flush.
    while acknowledged.lock().unwrap().len() < 2_000 {
        std::thread::sleep(Duration::from_millis(20));
    }
    served.kill();
    for w in writers {
        w.join().unwrap();
    }
    let acknowledged = acknowledged.lock().unwrap().clone();
    assert!(acknowledged.len() >= 2_000);

    // Restarted: every acknowledged id is there.
    let served = serve::new().data(&data).start();
    let addr = served.addr;
    for id in &acknowledged {
        let (status, record) = http(addr, "GET", &format!("/v1/memories/{id}"), None);
        assert_eq!(status, 200, "{id} was acknowledged but is gone: {record}");
    }
    served.kill();
}

/// The keys of a JSON object, sorted.
fn keys(value: &Value) -> Vec<String> {
    let mut keys: Vec<String> = value
        .as_object()
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default();
    keys.sort();
    keys
}

#[test]
fn openapi_documents_every_route_and_answers_match_its_schemas() {
    let server = serve::in_process(Auth::open());
    let addr = server.addr;
    let (status, doc) = http(addr, "GET", "/openapi.json", None);
    assert_eq!(status, 200, "{doc}");
    assert!(
        doc["openapi"].as_str().is_some_and(|v| v.starts_with("3.")),
        "{}",
        doc["openapi"]
    );
    // Every route of docs/http-api.md, and this document itself.
    let contract = [
        ("/healthz", "get"),
        ("/metrics", "get"),
        ("/openapi.json", "get"),
        ("/v1/sessions/{session_id}/events", "post"),
        ("/v1/sessions/{session_id}/recall", "post"),
        ("/v1/sessions/{session_id}/feedback", "post"),
        ("/v1/sessions/{session_id}/condense", "post"),
        ("/v1/sessions", "get"),
        ("/v1/sessions/{session_id}/timeline", "get"),
        ("/v1/memories/{id}", "get"),
        ("/v1/memories/{id}", "patch"),
        ("/v1/memories/{id}", "delete"),
        ("/v1/memories/{id}/history", "get"),
        ("/v1/knowledge/search", "post"),
        ("/v1/knowledge/graph", "get"),
        ("/v1/policy", "get"),
        ("/v1/policy/reload", "post"),
    ];
    for (path, method) in contract {
        assert!(
            doc["paths"][path][method].is_object(),
            "{method} {path} is not in /openapi.json"
        );
    }
    let documented: usize = doc["paths"]
        .as_object()
        .expect("paths")
        .values()
        .map(|ops| ops.as_object().map_or(0, |o| o.len()))
        .sum();
    assert_eq!(documented, contract.len(), "an undocumented extra route?");

    // Real answers carry exactly the documented fields.
    let schemas = &doc["components"]["schemas"];
    let (status, written) = post(
        addr,
        "/v1/sessions/s1/events",
        &json!({"kind": "observation", "text": "the invoice PDF had the wrong tax rate"}),
    );
    assert_eq!(status, 201, "{written}");
    assert_eq!(keys(&written), keys(&schemas["Ids"]["properties"]));
    let id = written["ids"][0].as_str().unwrap();
    let (_, record) = http(addr, "GET", &format!("/v1/memories/{id}"), None);
    assert_eq!(keys(&record), keys(&schemas["Memory"]["properties"]));
    let (_, recall) = post(
        addr,
        "/v1/sessions/s1/recall",
        &json!({"query": "tax rate"}),
    );
    // `notes` appears only when the answer went without something (the vector path).
    let mut expected = keys(&schemas["RecallOut"]["properties"]);
    expected.retain(|k| k != "notes");
    assert_eq!(keys(&recall), expected);
    let (status, bad) = post(
        addr,
        "/v1/sessions/s1/recall",
        &json!({"query": "x", "k": 0}),
    );
    assert_eq!(status, 422);
    assert_eq!(keys(&bad), keys(&schemas["ErrorBody"]["properties"]));
    // `retry_after_ms` appears only on an admission refusal (503 overloaded).
    let mut detail = keys(&schemas["ErrorDetail"]["properties"]);
    detail.retain(|k| k != "retry_after_ms");
    assert_eq!(keys(&bad["error"]), detail);
    // A request schema: recall's body names its fields, `query` required.
    let recall_in = &schemas["RecallIn"];
    assert_eq!(recall_in["required"], json!(["query"]), "{recall_in}");
}

#[test]
fn the_config_file_sets_limits_and_keys_with_environment_overrides() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("shadowbrain.toml");
    std::fs::write(
        &config,
        format!(
            "[limits]\nmax_k = 5\ntext_bytes = 64\n\n[[auth.keys]]\nsha256 = \"{}\"\nnamespace = \"acme\"\n",
            sha256_hex("secret-key")
        ),
    )
    .unwrap();
    let served = serve::new()
        .data(dir.path().join("data"))
        .config_file(&config)
        // The environment wins over the file.
        .env("SHADOWBRAIN__LIMITS__MAX_K", "3")
        .start();
    let addr = served.addr;
    let key = Some("secret-key");
    let (status, _) = http(addr, "GET", "/v1/sessions", None);
    assert_eq!(status, 401, "keys from the file are required");
    let (status, long) = http_as(
        addr,
        key,
        "POST",
        "/v1/sessions/s/events",
        Some(
            json!({"kind": "observation", "text": "x".repeat(65)})
                .to_string()
                .as_bytes(),
        ),
    );
    assert_eq!((status, error_code(&long)), (413, "too_large"), "{long}");
    let (status, ok) = http_as(
        addr,
        key,
        "POST",
        "/v1/sessions/s/events",
        Some(br#"{"kind":"observation","text":"short enough"}"#),
    );
    assert_eq!(status, 201, "{ok}");
    let (status, four) = http_as(
        addr,
        key,
        "POST",
        "/v1/sessions/s/recall",
        Some(br#"{"query":"short","k":4}"#),
    );
    assert_eq!((status, error_code(&four)), (422, "invalid_k"), "{four}");
    let (status, three) = http_as(
        addr,
        key,
        "POST",
        "/v1/sessions/s/recall",
        Some(br#"{"query":"short","k":3}"#),
    );
    assert_eq!(status, 200, "{three}");
    served.kill();

    // A mistake in the file stops the start with what to fix.
    std::fs::write(&config, "[limits]\nmax_kk = 5\n").unwrap();
    let refused = serve::new()
        .data(dir.path().join("data"))
        .config_file(&config)
        .output();
    let said = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{said}");
    assert!(said.contains("max_kk"), "{said}");
}

/// The scripted OpenAI-compatible chat endpoint, on a thread of its own (this test drives
/// the binary), rating every numbered record of a judge prompt 8.
fn scripted_judge() -> shadowbrain_test_support::Endpoint {
    use shadowbrain_test_support::{Endpoint, Reply, verdicts};
    Endpoint::start_in_thread(|request| {
        let n = request.numbered_records().len();
        let content = verdicts((0..n).map(|_| (8.0, 7, "scripted".to_string())));
        Reply::chat(&content, Some((10, 5)))
    })
}

#[test]
fn serve_with_an_llm_section_judges_importance_in_the_background() {
    let llm = scripted_judge();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("shadowbrain.toml");
    std::fs::write(
        &config,
        // The endpoint comes from [provider], as one section serving embedder and LLM would.
        format!(
            "[provider]\nbase_url = \"{}\"\n\
             [llm]\nkind = \"openai\"\nmodel = \"judge\"\nbatch_wait = \"0s\"\n",
            llm.base_url()
        ),
    )
    .unwrap();
    let policy = dir.path().join("policy.toml");
    let default = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("policies/default.toml"),
    )
    .unwrap();
    std::fs::write(
        &policy,
        default.replace("mode = \"rules\"", "mode = \"llm\""),
    )
    .unwrap();
    let served = serve::new()
        .data(dir.path().join("data"))
        .config_file(&config)
        .policy(&policy)
        .start();
    let addr = served.addr;
    let (status, written) = post(
        addr,
        "/v1/sessions/s/events",
        &json!({"kind": "observation", "text": "the user prefers invoices in EUR"}),
    );
    assert_eq!(status, 201, "{written}");
    let id = written["ids"][0].as_str().unwrap().to_string();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let judged = loop {
        let (_, record) = http(addr, "GET", &format!("/v1/memories/{id}"), None);
        if record["importance"] == 8.0 {
            break record;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never judged: {record}; {} calls",
            llm.requests()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let (_, history) = http(addr, "GET", &format!("/v1/memories/{id}/history"), None);
    assert!(
        history["entries"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["by"] == "llm:judge" && e["detail"].as_str().unwrap().contains("scripted")),
        "{judged} {history}"
    );
    let metrics = http_text(addr, "/metrics");
    for line in [
        "shadowbrain_llm_records_total{outcome=\"judged\"} 1",
        "shadowbrain_llm_tokens_total{kind=\"prompt\"} 10",
        "shadowbrain_llm_failures_total 0",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "no `{line}` in:\n{metrics}"
        );
    }
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("shadowbrain_llm_requests_total ")
                && l != "shadowbrain_llm_requests_total 0"),
        "{metrics}"
    );
    // Judged: nothing waits, so the judge's lag is zero.
    assert!(
        metrics
            .lines()
            .any(|l| l == "shadowbrain_work_queue_oldest_seconds{queue=\"evaluate\"} 0.0"),
        "{metrics}"
    );
    served.kill();
}

#[test]
fn serve_with_updates_in_llm_mode_asks_the_model_in_the_background() {
    use shadowbrain_test_support::{Endpoint, Reply};
    // A scripted model that takes every pair it is shown for a newer value.
    let llm = Endpoint::start_in_thread(|request| {
        let pairs = request.user().matches(". OLDER: ").count();
        let items: Vec<Value> = (0..pairs)
            .map(|i| json!({"index": i, "relation": "supersedes", "reason": "scripted update"}))
            .collect();
        Reply::chat(&json!({ "items": items }).to_string(), Some((10, 5)))
    });
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("shadowbrain.toml");
    std::fs::write(
        &config,
        format!(
            "[embedder]\nkind = \"hash\"\n\
             [llm]\nkind = \"openai\"\nbase_url = \"{}\"\nmodel = \"judge\"\n",
            llm.base_url()
        ),
    )
    .unwrap();
    let policy = dir.path().join("updates.toml");
    std::fs::write(
        &policy,
        "name = \"facts-change-llm\"\n[updates]\nmode = \"llm\"\nmin_similarity = 0.2\n",
    )
    .unwrap();
    let served = serve::new()
        .data(dir.path().join("data"))
        .config_file(&config)
        .policy(&policy)
        .start();
    let addr = served.addr;
    let (status, written) = post(
        addr,
        "/v1/sessions/ops/events",
        &json!({"events": [
            {"kind": "observation", "text": "The nightly backup runs at 02:00 on the NAS.",
             "timestamp": "2026-03-01T10:00:00Z"},
            {"kind": "observation", "text": "The nightly backup now runs at 04:30 on the NAS.",
             "timestamp": "2026-04-01T10:00:00Z"},
        ]}),
    );
    assert_eq!(status, 201, "{written}");
    let (old, new) = (
        written["ids"][0].as_str().unwrap().to_string(),
        written["ids"][1].as_str().unwrap().to_string(),
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (_, record) = http(addr, "GET", &format!("/v1/memories/{old}"), None);
        if !record["superseded_by"].is_null() {
            assert_eq!(record["superseded_by"], new.as_str(), "{record}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never linked: {record}; {} calls",
            llm.requests()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let (_, history) = http(addr, "GET", &format!("/v1/memories/{old}/history"), None);
    assert!(
        history["entries"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["by"] == "updates:llm:judge"
                && e["detail"].as_str().unwrap().contains("scripted update")),
        "{history}"
    );
    assert!(llm.requests() >= 1);
    served.kill();
}

#[test]
fn namespaces_run_the_policies_the_operator_assigned_them() {
    let dir = tempfile::tempdir().unwrap();
    let policies = dir.path().join("policies");
    std::fs::create_dir(&policies).unwrap();
    let shared = policies.join("shared.toml");
    std::fs::write(&shared, "name = \"shared\"\n").unwrap();
    // alpha forgets within seconds; beta runs the shared policy (30 days' half-life).
    let alpha = policies.join("alpha.toml");
    let forgetful = |name: &str| {
        format!(
            "name = \"{name}\"\n[forgetting]\nhalf_life = \"1s\"\narchive_below = 0.5\n\
             interval = \"1s\"\n"
        )
    };
    std::fs::write(&alpha, forgetful("alpha-forgets")).unwrap();
    let config = dir.path().join("shadowbrain.toml");
    let key = |k: &str, ns: &str, role: &str| {
        format!(
            "[[auth.keys]]\nsha256 = \"{}\"\nnamespace = \"{ns}\"\nrole = \"{role}\"\n",
            sha256_hex(k)
        )
    };
    std::fs::write(
        &config,
        format!(
            "[embedder]\nkind = \"hash\"\n{}{}{}\
             [[namespaces]]\nname = \"alpha\"\npolicy = \"policies/alpha.toml\"\n",
            key("key-a", "alpha", "tenant"),
            key("key-b", "beta", "tenant"),
            key("key-ops", "ops", "admin"),
        ),
    )
    .unwrap();
    let served = serve::new()
        .data(dir.path().join("data"))
        .config_file(&config)
        .policy(&shared)
        .start();
    let addr = served.addr;
    let name_for = |key: &str| {
        let (status, policy) = http_as(addr, Some(key), "GET", "/v1/policy", None);
        assert_eq!(status, 200, "{policy}");
        policy["name"].as_str().unwrap().to_string()
    };
    assert_eq!(name_for("key-a"), "alpha-forgets");
    assert_eq!(name_for("key-b"), "shared");
    assert_eq!(name_for("key-ops"), "shared");

    // Each namespace's records are decided, and its recalls ranked, by its own policy.
    let event = json!({"kind": "observation", "text": "the runner lives in eu-1"}).to_string();
    let recall = json!({"query": "where is the runner?"}).to_string();
    let mut ids = Vec::new();
    for k in ["key-a", "key-b"] {
        let (status, written) = http_as(
            addr,
            Some(k),
            "POST",
            "/v1/sessions/s1/events",
            Some(event.as_bytes()),
        );
        assert_eq!(status, 201, "{written}");
        ids.push(written["ids"][0].as_str().unwrap().to_string());
        let (status, found) = http_as(
            addr,
            Some(k),
            "POST",
            "/v1/sessions/s1/recall",
            Some(recall.as_bytes()),
        );
        assert_eq!(status, 200, "{found}");
        assert_eq!(found["policy"]["name"], name_for(k).as_str(), "{found}");
    }
    let status_of = |k: &str, id: &str| {
        let (code, memory) = http_as(addr, Some(k), "GET", &format!("/v1/memories/{id}"), None);
        assert_eq!(code, 200, "{memory}");
        memory["status"].as_str().unwrap().to_string()
    };
    let started = std::time::Instant::now();
    while status_of("key-a", &ids[0]) != "archived" {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "alpha's policy archives its record within seconds"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        status_of("key-b", &ids[1]),
        "active",
        "beta keeps the shared policy"
    );

    // A reload reads every file again, all or nothing, and only with the admin key.
    let reload = "/v1/policy/reload";
    let (status, refused) = http_as(addr, Some("key-a"), "POST", reload, None);
    assert_eq!(
        (status, error_code(&refused)),
        (403, "forbidden"),
        "{refused}"
    );
    std::fs::write(&shared, "name = \"shared-2\"\n").unwrap();
    std::fs::write(
        &alpha,
        "name = \"alpha-2\"\n[forgetting]\nhalf_lief = \"1s\"\n",
    )
    .unwrap();
    let (status, refused) = http_as(addr, Some("key-ops"), "POST", reload, None);
    assert_eq!(
        (status, error_code(&refused)),
        (422, "invalid_policy"),
        "{refused}"
    );
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("alpha.toml") && message.contains("half_lief"),
        "{message}"
    );
    assert_eq!(
        name_for("key-b"),
        "shared",
        "a refused reload changes no namespace"
    );
    assert_eq!(name_for("key-a"), "alpha-forgets");
    std::fs::write(&alpha, forgetful("alpha-2")).unwrap();
    let (status, reloaded) = http_as(addr, Some("key-ops"), "POST", reload, None);
    assert_eq!(status, 200, "{reloaded}");
    assert_eq!(reloaded["name"], "shared-2", "{reloaded}");
    assert_eq!(
        reloaded["namespaces"]["alpha"]["name"], "alpha-2",
        "{reloaded}"
    );
    assert_eq!(name_for("key-a"), "alpha-2");
    assert_eq!(name_for("key-b"), "shared-2");
    served.kill();

    // A [[namespaces]] entry whose file is missing stops the start, naming it.
    std::fs::remove_file(&alpha).unwrap();
    let refused = serve::new()
        .data(dir.path().join("data2"))
        .config_file(&config)
        .output();
    let said = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{said}");
    assert!(
        said.contains("alpha.toml") && said.contains("\"alpha\""),
        "{said}"
    );
}

#[test]
fn serve_with_updates_links_a_changed_fact_recall_says_so_and_patch_settles_it() {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("updates.toml");
    // The hash embedder's similarities are lower than a model's: the floor follows.
    std::fs::write(
        &policy,
        "name = \"facts-change\"\n[updates]\nmode = \"rules\"\nmin_similarity = 0.2\n",
    )
    .unwrap();
    let config = dir.path().join("shadowbrain.toml");
    std::fs::write(&config, "[embedder]\nkind = \"hash\"\n").unwrap();
    let served = serve::new()
        .data(dir.path().join("data"))
        .config_file(&config)
        .policy(&policy)
        .start();
    let addr = served.addr;
    let post = |path: &str, body: Value| {
        let (status, answer) = http(addr, "POST", path, Some(body.to_string().as_bytes()));
        assert!(status == 200 || status == 201, "{status} {answer}");
        answer
    };
    let written = post(
        "/v1/sessions/ops/events",
        json!({"events": [
            {"kind": "observation", "text": "The deploy runner for production is in eu-1.",
             "timestamp": "2026-03-01T10:00:00Z"},
            {"kind": "observation", "text": "Lunch on Friday is pizza for the whole team.",
             "timestamp": "2026-03-02T10:00:00Z"},
            {"kind": "observation", "text": "The deploy runner for production moved to eu-2.",
             "timestamp": "2026-05-01T10:00:00Z"},
        ]}),
    );
    let old = written["ids"][0].as_str().unwrap().to_string();
    let new = written["ids"][2].as_str().unwrap().to_string();
    let get = |id: &str| {
        let (status, memory) = http(addr, "GET", &format!("/v1/memories/{id}"), None);
        assert_eq!(status, 200, "{memory}");
        memory
    };
    // Detection runs in the background, after the write was acknowledged.
    let started = std::time::Instant::now();
    while get(&old)["superseded_by"].is_null() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the older value is linked within seconds: {}",
            get(&old)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let memory = get(&old);
    assert_eq!(memory["superseded_by"], new.as_str(), "{memory}");
    assert_eq!(memory["chain"]["newer"], json!([new]), "{memory}");
    assert_eq!(
        memory["text"],
        "The deploy runner for production is in eu-1."
    );
    assert!(memory["valid_until"].as_i64().is_some(), "{memory}");
    assert_eq!(get(&new)["chain"]["supersedes"], json!([old]));
    // The knowledge graph shows what detection wrote in the background (its cached graph
    // follows edges written by others), and, below, what a resolution removed.
    let supersedes = json!({"from": new, "to": old, "relation": "supersedes"});
    let graph_edges = || {
        let (status, graph) = http(
            addr,
            "GET",
            &format!("/v1/knowledge/graph?around={old}"),
            None,
        );
        assert_eq!(status, 200, "{graph}");
        graph["edges"].as_array().unwrap().clone()
    };
    assert!(graph_edges().contains(&supersedes), "{:?}", graph_edges());

    let recall = |body: Value| post("/v1/sessions/asker/recall", body);
    let found =
        recall(json!({"query": "where is the production deploy runner?", "scope": "namespace"}));
    let ids: Vec<&str> = found["memories"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    let at = |id: &str| ids.iter().position(|i| *i == id).unwrap();
    assert!(at(&new) < at(&old), "the current value first: {found}");
    let old_memory = &found["memories"][at(&old)];
    assert_eq!(old_memory["why"]["superseded_by"], new.as_str(), "{found}");
    assert_eq!(old_memory["superseded_by"], new.as_str(), "{found}");

    // Resolving by hand is audited; nothing to resolve is a clear 422.
    let patch = |id: &str, body: Value| {
        http(
            addr,
            "PATCH",
            &format!("/v1/memories/{id}"),
            Some(body.to_string().as_bytes()),
        )
    };
    let (status, refused) = patch(&new, json!({"resolve": "keep"}));
    assert_eq!(
        (status, error_code(&refused)),
        (422, "invalid_resolve"),
        "{refused}"
    );
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no open conflict")
    );
    let (status, refused) = patch(&old, json!({"resolve": "keep", "status": "pinned"}));
    assert_eq!(status, 422, "{refused}");
    let (status, reinstated) = patch(
        &old,
        json!({"resolve": "reinstate", "reason": "eu-1 is back"}),
    );
    assert_eq!(status, 200, "{reinstated}");
    assert!(reinstated["superseded_by"].is_null(), "{reinstated}");
    assert!(!graph_edges().contains(&supersedes), "{:?}", graph_edges());
    let (_, history) = http(addr, "GET", &format!("/v1/memories/{old}/history"), None);
    let actions: Vec<&str> = history["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert!(
        actions.contains(&"superseded") && actions.contains(&"resolved"),
        "{history}"
    );
    let text = history.to_string();
    assert!(
        text.contains("eu-1 is back") && text.contains("updates:rules"),
        "{history}"
    );
    served.kill();
}
