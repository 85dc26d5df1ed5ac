//! The MCP door as agent hosts meet it: the official SDK's client (rmcp) talking to the
//! `shadowbrain mcp` binary over its stdio, and to `serve`'s `/mcp` over Streamable HTTP
//! with API keys — every tool, the error paths a model will hit, namespace isolation,
//! the protocol versions, and SIGTERM while a protocol session is open.

use std::process::{Command, Stdio};
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientConfig, GetPromptRequestParams, JsonObject,
    ProtocolVersion, ReadResourceRequestParams, ResourceContents,
};
use rmcp::service::{ClientLifecycleMode, ClientServiceExt, RoleClient, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{ConfigureCommandExt, StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{ServiceError, ServiceExt};
use serde_json::{Value, json};

use crate::common::python::{python_client, python_sdk};
use crate::common::serve::{self, Served};

type Client = RunningService<RoleClient, ClientConfig>;

/// The tools of the contract (docs/mcp.md), in the order the server lists them.
const TOOLS: [&str; 10] = [
    "remember",
    "recall",
    "feedback",
    "forget",
    "mark",
    "timeline",
    "sessions",
    "knowledge_search",
    "knowledge_graph",
    "condense",
];

/// Keys and the hex SHA-256 the config file holds for them.
const ALPHA: (&str, &str) = (
    "alpha-key",
    "677509799af78b2efa2f2af71d0f906e0a0c50c048efd3b515625f788e92b99a",
);
const BETA: (&str, &str) = (
    "beta-key",
    "7a3d637bc601f7000cc2c33141c8c8a7554e02e319fa8b293a0c88c613b77620",
);
const ADMIN: (&str, &str) = (
    "admin-key",
    "69a5265506c94c77b787a7d7377b7685a0eff82e33920a71e7ee22cd6154953e",
);

/// A client that asks for `version` in its `initialize`.
fn client_info(version: ProtocolVersion) -> ClientConfig {
    let mut info = ClientConfig::default();
    info.protocol_version = version;
    info
}

/// `shadowbrain mcp` on `data` as a child process, with the SDK's client on its stdio; and
/// the child's stderr.
async fn stdio_client(
    data: &std::path::Path,
    version: ProtocolVersion,
    extra: &[&str],
) -> (Client, tokio::process::ChildStderr, u32) {
    let config = data.with_extension("toml");
    std::fs::write(&config, "[embedder]\nkind = \"hash\"\n").unwrap();
    let command = tokio::process::Command::new(env!("CARGO_BIN_EXE_shadowbrain")).configure(|c| {
        c.arg("mcp")
            .arg("--data")
            .arg(data)
            .arg("--config")
            .arg(&config)
            .args(extra);
    });
    let (transport, stderr) = TokioChildProcess::builder(command)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = transport.id().expect("a running child");
    let client = client_info(version)
        .serve(transport)
        .await
        .expect("the MCP handshake over stdio");
    (client, stderr.expect("the child's stderr"), pid)
}

/// Closes the client's side (stdin) and checks that the server flushed and said goodbye.
async fn close_stdio(client: Client, stderr: tokio::process::ChildStderr) {
    client.cancel().await.unwrap();
    said_goodbye(stderr).await;
}

/// Reads the server's stderr to its end (the server exited) and checks it flushed.
async fn said_goodbye(mut stderr: tokio::process::ChildStderr) {
    use tokio::io::AsyncReadExt;
    let mut said = String::new();
    tokio::time::timeout(Duration::from_secs(30), stderr.read_to_string(&mut said))
        .await
        .expect("the server exits when its host closes stdin")
        .unwrap();
    assert!(said.contains("flushed; bye"), "{said}");
}

/// A client of `/mcp` on `served`, with `key` as its bearer token when given.
async fn http_client(
    served: &Served,
    key: Option<&str>,
    lifecycle: ClientLifecycleMode,
    version: ProtocolVersion,
) -> Result<Client, rmcp::service::ClientInitializeError> {
    http_client_with(served, key, lifecycle, version, &[]).await
}

/// [`http_client`] sending `headers` with every request.
async fn http_client_with(
    served: &Served,
    key: Option<&str>,
    lifecycle: ClientLifecycleMode,
    version: ProtocolVersion,
    headers: &[(&'static str, &str)],
) -> Result<Client, rmcp::service::ClientInitializeError> {
    let headers = headers
        .iter()
        .map(|(k, v)| {
            (
                reqwest::header::HeaderName::from_static(k),
                reqwest::header::HeaderValue::from_str(v).unwrap(),
            )
        })
        .collect();
    let mut config =
        StreamableHttpClientTransportConfig::with_uri(format!("http://{}/mcp", served.addr));
    if let Some(key) = key {
        config = config.auth_header(key);
    }
    config = config.custom_headers(headers);
    let transport = StreamableHttpClientTransport::with_client(http(), config);
    client_info(version)
        .serve_with_lifecycle(transport, lifecycle)
        .await
}

/// An HTTP client for raw requests (TLS is never used here, but reqwest wants a provider).
fn http() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::new()
}

/// The body of `GET path` on `served` with `key`.
async fn get(served: &Served, path: &str, key: &str) -> String {
    let answer = http()
        .get(format!("http://{}{path}", served.addr))
        .bearer_auth(key)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200, "GET {path}");
    answer.text().await.unwrap()
}

async fn call(client: &Client, tool: &str, args: Value) -> CallToolResult {
    let args: JsonObject = serde_json::from_value(args).unwrap();
    client
        .call_tool(CallToolRequestParams::new(tool.to_string()).with_arguments(args))
        .await
        .unwrap_or_else(|e| panic!("calling {tool}: {e}"))
}

/// A successful call's structured answer (the HTTP API's JSON), checked to have a text too.
async fn ok(client: &Client, tool: &str, args: Value) -> Value {
    let result = call(client, tool, args.clone()).await;
    assert_eq!(
        result.is_error,
        Some(false),
        "{tool} {args}: {}",
        text(&result)
    );
    assert!(!text(&result).is_empty(), "{tool} answers a text too");
    result.structured_content.expect("structured content")
}

/// A failed call's text, checked to be a tool error (never a protocol error).
async fn refused(client: &Client, tool: &str, args: Value) -> String {
    let result = call(client, tool, args.clone()).await;
    assert_eq!(
        result.is_error,
        Some(true),
        "{tool} {args} should be refused"
    );
    assert!(result.structured_content.is_none());
    text(&result)
}

fn text(result: &CallToolResult) -> String {
    result
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect::<Vec<_>>()
        .join("\n")
}

async fn read(client: &Client, uri: &str) -> Result<Value, ServiceError> {
    let result = client
        .read_resource(ReadResourceRequestParams::new(uri))
        .await?;
    match &result.contents[0] {
        ResourceContents::TextResourceContents { text, .. } => {
            Ok(serde_json::from_str(text).unwrap())
        }
        other => panic!("a JSON text resource, not {other:?}"),
    }
}

/// Every tool once, over `client`, with the answers checked against what was written.
async fn every_tool(client: &Client, session: &str) {
    let listed = client.list_all_tools().await.unwrap();
    let names: Vec<&str> = listed.iter().map(|t| t.name.as_ref()).collect();
    assert_eq!(names, TOOLS);
    for tool in &listed {
        assert!(
            tool.output_schema.is_some(),
            "{} has an output schema",
            tool.name
        );
    }

    let one = ok(
        client,
        "remember",
        json!({"session_id": session, "kind": "observation", "text": "the nightly backup job timed out at 02:00"}),
    )
    .await;
    let first = one["ids"][0].as_str().unwrap().to_string();
    let batch = ok(
        client,
        "remember",
        json!({"session_id": session, "events": [
            {"text": "raised the backup timeout to one hour", "kind": "action", "importance": 7},
            {"text": "the user prefers reports as CSV", "kind": "user_message"},
            {"text": "the backup finished in 41 minutes", "kind": "observation"},
            {"text": "keep the backup timeout at one hour", "kind": "thought"}
        ]}),
    )
    .await;
    assert_eq!(batch["ids"].as_array().unwrap().len(), 4);

    let recalled = ok(
        client,
        "recall",
        json!({"session_id": session, "query": "when did the nightly backup time out?", "k": 5}),
    )
    .await;
    let memories = recalled["memories"].as_array().unwrap();
    assert!(!memories.is_empty());
    assert!(
        memories.iter().any(|m| m["id"] == first.as_str()),
        "{recalled}"
    );
    assert!(memories[0]["why"]["relevance"].is_number());
    assert!(recalled["context"].as_str().unwrap().contains("backup"));
    let recall_id = recalled["recall_id"].as_str().unwrap().to_string();

    let updated = ok(
        client,
        "feedback",
        json!({"session_id": session, "recall_id": recall_id, "outcome": "success"}),
    )
    .await;
    assert!(updated["updated"].as_u64().unwrap() >= 1, "{updated}");

    let pinned = ok(client, "mark", json!({"id": first, "status": "pinned"})).await;
    assert_eq!(pinned["status"], "pinned");
    let forgotten = ok(client, "forget", json!({"id": first})).await;
    assert_eq!(forgotten["status"], "archived");
    let restored = ok(client, "mark", json!({"id": first, "status": "active"})).await;
    assert_eq!(restored["status"], "active");

    let timeline = ok(
        client,
        "timeline",
        json!({"session_id": session, "limit": 10}),
    )
    .await;
    let items = timeline["items"].as_array().unwrap();
    assert_eq!(items.len(), 5, "{timeline}");
    assert_eq!(items[4]["id"], first.as_str(), "newest first");

    let sessions = ok(client, "sessions", json!({})).await;
    assert!(
        sessions["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["session_id"] == session),
        "{sessions}"
    );

    let condensed = ok(client, "condense", json!({"session_id": session})).await;
    let condensed_id = condensed["memory_id"]
        .as_str()
        .expect("five events condense (the default policy's minimum)");
    let knowledge = ok(
        client,
        "knowledge_search",
        json!({"query": "backup", "k": 5}),
    )
    .await;
    assert!(knowledge["memories"].is_array());
    let graph = ok(
        client,
        "knowledge_graph",
        json!({"around": condensed_id, "depth": 1}),
    )
    .await;
    assert_eq!(graph["nodes"][0]["id"], condensed_id);

    // The resources and the prompt.
    let policy = read(client, "shadowbrain://policy").await.unwrap();
    assert_eq!(policy["name"], "default");
    let memory = read(client, &format!("shadowbrain://memories/{first}"))
        .await
        .unwrap();
    assert_eq!(memory["memory"]["id"], first.as_str());
    let actions: Vec<&str> = memory["history"]["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert!(actions.contains(&"status_changed"), "{actions:?}");
    let timeline = read(
        client,
        &format!("shadowbrain://sessions/{session}/timeline"),
    )
    .await
    .unwrap();
    assert_eq!(
        timeline["items"].as_array().unwrap().len(),
        6,
        "with the condensed one"
    );
    let missing = read(client, "shadowbrain://memories/mem-ffffffff").await;
    assert!(missing.unwrap_err().to_string().contains("not_found"));
    let prompts = client.list_all_prompts().await.unwrap();
    assert_eq!(prompts[0].name, "use_memory");
    let prompt = client
        .get_prompt(
            GetPromptRequestParams::new("use_memory")
                .with_arguments(serde_json::from_value(json!({"task": "fix the backup"})).unwrap()),
        )
        .await
        .unwrap();
    let said = serde_json::to_string(&prompt.messages).unwrap();
    assert!(
        said.contains("fix the backup") && said.contains("`recall`") && said.contains("`feedback`")
    );
}

/// What a model gets wrong, each answered as a tool error that says what to do.
async fn bad_calls(client: &Client) {
    let too_long = "s".repeat(129);
    for (tool, args, expect) in [
        ("recall", json!({"query": "x", "k": 0}), "invalid_k"),
        ("recall", json!({"query": "x", "k": 201}), "1 to 200"),
        ("recall", json!({"k": 3}), "missing field `query`"),
        (
            "recall",
            json!({"query": "x", "scope": "world"}),
            "unknown variant `world`",
        ),
        (
            "recall",
            json!({"query": "x", "session_id": too_long}),
            "invalid_session_id",
        ),
        (
            "remember",
            json!({"session_id": too_long, "text": "x"}),
            "invalid_session_id",
        ),
        (
            "remember",
            json!({"kind": "Bad Kind", "text": "x"}),
            "invalid_kind",
        ),
        ("remember", json!({"kind": "observation"}), "text"),
        (
            "remember",
            json!({"text": "x", "events": [{"text": "y"}]}),
            "not both",
        ),
        (
            "remember",
            json!({"text": "x", "colour": "red"}),
            "unknown field `colour`",
        ),
        (
            "remember",
            json!({"text": "x", "timestamp": "yesterday"}),
            "RFC 3339",
        ),
        (
            "remember",
            json!({"session_id": 7, "text": "x"}),
            "not a session id",
        ),
        (
            "feedback",
            json!({"outcome": "success"}),
            "either `recall_id`",
        ),
        (
            "feedback",
            json!({"recall_id": "rcl-ffffffff", "outcome": "success"}),
            "not_found",
        ),
        (
            "feedback",
            json!({"memory_ids": ["nope"], "outcome": "maybe"}),
            "unknown variant `maybe`",
        ),
        ("forget", json!({"id": "mem-ffffffff"}), "not_found"),
        ("forget", json!({"id": "nope"}), "mem-"),
        (
            "mark",
            json!({"id": "mem-00000000", "status": "archived"}),
            "`forget`",
        ),
        ("timeline", json!({"limit": 0}), "invalid_limit"),
        ("sessions", json!({"page": 2}), "unknown field `page`"),
        (
            "knowledge_search",
            json!({"query": "x", "k": 1000}),
            "invalid_k",
        ),
        (
            "knowledge_graph",
            json!({"around": "mem-00000000", "depth": 9}),
            "too deep",
        ),
        ("no_such_tool", json!({}), "there is no tool"),
    ] {
        let said = refused(client, tool, args.clone()).await;
        assert!(said.contains(expect), "{tool} {args}: {said}");
    }
    // The server is still there and answers.
    ok(client, "sessions", json!({})).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_stdio_every_tool_answers_and_every_bad_call_is_a_tool_error() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (client, stderr, _) = stdio_client(&data, ProtocolVersion::V_2025_06_18, &[]).await;
    let info = client.peer_info().expect("the server's initialize answer");
    assert_eq!(info.protocol_version, ProtocolVersion::V_2025_06_18);
    assert_eq!(
        info.server_info.as_ref().map(|s| s.name.as_str()),
        Some("shadowbrain")
    );
    every_tool(&client, "ops").await;
    bad_calls(&client).await;
    // The host closes stdin: the server flushes and exits; what it acknowledged is there
    // for the next one, which negotiates the newer revision.
    close_stdio(client, stderr).await;
    let (client, stderr, _) =
        stdio_client(&data, ProtocolVersion::V_2025_11_25, &["--session", "ops"]).await;
    assert_eq!(
        client.peer_info().unwrap().protocol_version,
        ProtocolVersion::V_2025_11_25
    );
    // No session named: `--session ops` is the default.
    let timeline = ok(&client, "timeline", json!({})).await;
    assert_eq!(timeline["items"].as_array().unwrap().len(), 6, "{timeline}");
    let remembered = ok(
        &client,
        "remember",
        json!({"text": "a model that names no session"}),
    )
    .await;
    let id = remembered["ids"][0].as_str().unwrap();
    let memory = read(&client, &format!("shadowbrain://memories/{id}"))
        .await
        .unwrap();
    assert_eq!(memory["memory"]["session_id"], "ops");
    assert_eq!(memory["memory"]["kind"], "observation", "the default kind");
    close_stdio(client, stderr).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdio_refuses_a_directory_a_server_holds_and_points_at_its_mcp() {
    let served = serve::new().config("[embedder]\nkind = \"hash\"\n").start();
    let out = Command::new(env!("CARGO_BIN_EXE_shadowbrain"))
        .arg("mcp")
        .arg("--data")
        .arg(&served.data)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty(), "stdout is the protocol's");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains(&format!("http://{}/mcp", served.addr)),
        "{said}"
    );
}

/// A server with three keys: alpha and beta tenants, and an admin (namespace `ops`).
fn keyed_server() -> Served {
    let keys: String = [
        (ALPHA, "alpha", "tenant"),
        (BETA, "beta", "tenant"),
        (ADMIN, "ops", "admin"),
    ]
    .iter()
    .map(|((_, hash), ns, role)| {
        format!("[[auth.keys]]\nsha256 = \"{hash}\"\nnamespace = \"{ns}\"\nrole = \"{role}\"\n")
    })
    .collect();
    serve::new()
        .config(&format!("[embedder]\nkind = \"hash\"\n{keys}"))
        .start()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_http_every_tool_answers_behind_the_keys_and_namespaces_stay_apart() {
    let served = keyed_server();
    let initialize = || ClientLifecycleMode::Initialize;

    // No key, or an unknown one: the handshake is refused with the API's 401.
    assert!(
        http_client(&served, None, initialize(), ProtocolVersion::V_2025_06_18)
            .await
            .is_err()
    );
    assert!(
        http_client(
            &served,
            Some("guess"),
            initialize(),
            ProtocolVersion::V_2025_06_18
        )
        .await
        .is_err()
    );
    let raw = http()
        .post(format!("http://{}/mcp", served.addr))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(raw.status(), 401);
    assert_eq!(raw.headers()["www-authenticate"], "Bearer");
    let body: Value = serde_json::from_str(&raw.text().await.unwrap()).unwrap();
    assert_eq!(body["error"]["code"], "unauthorized");

    let alpha = http_client(
        &served,
        Some(ALPHA.0),
        initialize(),
        ProtocolVersion::V_2025_11_25,
    )
    .await
    .unwrap();
    assert_eq!(
        alpha.peer_info().unwrap().protocol_version,
        ProtocolVersion::V_2025_11_25
    );
    every_tool(&alpha, "ops").await;
    bad_calls(&alpha).await;
    let secret = ok(
        &alpha,
        "remember",
        json!({"session_id": "shared-name", "text": "alpha's launch code is 7741"}),
    )
    .await;
    let secret_id = secret["ids"][0].as_str().unwrap().to_string();

    // Beta, on the revision without protocol sessions (2026-07-28, `server/discover`).
    let discover = ClientLifecycleMode::Discover {
        preferred_versions: vec![ProtocolVersion::V_2026_07_28],
    };
    let beta = http_client(
        &served,
        Some(BETA.0),
        discover,
        ProtocolVersion::V_2026_07_28,
    )
    .await
    .unwrap();
    assert_eq!(
        beta.peer_info().unwrap().protocol_version,
        ProtocolVersion::V_2026_07_28
    );
    let recalled = ok(
        &beta,
        "recall",
        json!({"session_id": "shared-name", "query": "launch code", "scope": "namespace"}),
    )
    .await;
    assert_eq!(
        recalled["memories"],
        json!([]),
        "beta sees none of alpha's memories"
    );
    let timeline = ok(&beta, "timeline", json!({"session_id": "shared-name"})).await;
    assert_eq!(timeline["items"], json!([]));
    assert!(
        refused(&beta, "forget", json!({"id": secret_id}))
            .await
            .contains("not_found")
    );
    assert!(
        read(&beta, &format!("shadowbrain://memories/{secret_id}"))
            .await
            .is_err()
    );
    let sessions = ok(&beta, "sessions", json!({})).await;
    assert_eq!(sessions["sessions"], json!([]));
    // Alpha's memory is untouched by beta's attempt.
    let memory = read(&alpha, &format!("shadowbrain://memories/{secret_id}"))
        .await
        .unwrap();
    assert_eq!(memory["memory"]["status"], "active");

    // A host that names its default session in a header: calls without `session_id` land
    // there.
    let hosted = http_client_with(
        &served,
        Some(ALPHA.0),
        ClientLifecycleMode::Initialize,
        ProtocolVersion::V_2025_06_18,
        &[("shadowbrain-session", "from-header")],
    )
    .await
    .unwrap();
    let remembered = ok(&hosted, "remember", json!({"text": "named by the host"})).await;
    let id = remembered["ids"][0].as_str().unwrap();
    let memory = read(&hosted, &format!("shadowbrain://memories/{id}"))
        .await
        .unwrap();
    assert_eq!(memory["memory"]["session_id"], "from-header");
    hosted.cancel().await.unwrap();

    // Metrics: the route and each tool are counted (an admin key reads them).
    let metrics = get(&served, "/metrics", ADMIN.0).await;
    assert!(
        metrics.contains("route=\"/mcp\""),
        "http_requests_total counts /mcp"
    );
    for line in [
        "shadowbrain_mcp_tool_calls_total{tool=\"remember\",outcome=\"ok\"}",
        "shadowbrain_mcp_tool_calls_total{tool=\"recall\",outcome=\"error\"}",
        "shadowbrain_mcp_tool_calls_total{tool=\"unknown\",outcome=\"error\"}",
    ] {
        assert!(metrics.contains(line), "{line} in\n{metrics}");
    }
    alpha.cancel().await.unwrap();
    beta.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_an_open_mcp_session_drains_in_time_and_keeps_what_was_acknowledged() {
    let mut served = keyed_server();
    let alpha = http_client(
        &served,
        Some(ALPHA.0),
        ClientLifecycleMode::Initialize,
        ProtocolVersion::V_2025_06_18,
    )
    .await
    .unwrap();
    let mut ids = Vec::new();
    for i in 0..20 {
        let answer = ok(
            &alpha,
            "remember",
            json!({"session_id": "s", "text": format!("event {i}")}),
        )
        .await;
        ids.push(answer["ids"][0].as_str().unwrap().to_string());
    }
    // The protocol session stays open (its event stream too) while the server is told to
    // stop: it must end the session's streams, not wait for the drain deadline (10 s).
    let started = std::time::Instant::now();
    served.terminate();
    let status = served
        .exit_within(Duration::from_secs(30))
        .expect("the server stops");
    assert!(status.success(), "{status:?}");
    let said = served.said();
    assert!(said.contains("drained and flushed"), "{said}");
    assert!(
        started.elapsed() < Duration::from_secs(9),
        "stopped at the drain deadline, not by ending the MCP streams: {:?}",
        started.elapsed()
    );
    drop(alpha);

    // Every acknowledged event is there after a restart.
    let served = served.restart_stopped();
    let timeline = get(&served, "/v1/sessions/s/timeline", ALPHA.0).await;
    let timeline: Value = serde_json::from_str(&timeline).unwrap();
    let mut kept: Vec<String> = timeline["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_string())
        .collect();
    kept.sort();
    ids.sort();
    assert_eq!(kept, ids);
}

#[test]
fn the_python_sdk_lists_remembers_recalls_and_sends_feedback_over_both_transports() {
    let Some(python) = python_sdk() else {
        return;
    };
    // Each run connects twice: `auto` (what the SDK does by default: `server/discover`, the
    // stateless 2026-07-28 revision) and `legacy` (the initialize handshake).
    let versions = |runs: &[Value]| -> Vec<String> {
        runs.iter()
            .map(|r| {
                assert_eq!(r["tools"], 10);
                assert!(r["recalled"].as_u64().unwrap() >= 1);
                format!(
                    "{}={}",
                    r["mode"].as_str().unwrap(),
                    r["protocol_version"].as_str().unwrap()
                )
            })
            .collect()
    };
    let dir = tempfile::tempdir().unwrap();
    let stdio = python_client(
        &python,
        &[
            "stdio",
            env!("CARGO_BIN_EXE_shadowbrain"),
            dir.path().join("stdio").to_str().unwrap(),
        ],
    );
    assert_eq!(versions(&stdio), ["auto=2026-07-28", "legacy=2025-11-25"]);

    let served = keyed_server();
    let url = format!("http://{}/mcp", served.addr);
    let http = python_client(&python, &["http", &url, ALPHA.0]);
    assert_eq!(versions(&http), ["auto=2026-07-28", "legacy=2025-11-25"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_to_the_stdio_server_flushes_what_it_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (client, stderr, pid) = stdio_client(&data, ProtocolVersion::V_2025_11_25, &[]).await;
    for i in 0..10 {
        ok(&client, "remember", json!({"text": format!("event {i}")})).await;
    }
    // The host still holds stdin open: the signal alone must stop the server cleanly.
    let sent = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    said_goodbye(stderr).await;
    drop(client);
    let (client, stderr, _) = stdio_client(&data, ProtocolVersion::V_2025_11_25, &[]).await;
    let timeline = ok(&client, "timeline", json!({})).await;
    assert_eq!(
        timeline["items"].as_array().unwrap().len(),
        10,
        "{timeline}"
    );
    close_stdio(client, stderr).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn condense_never_waits_for_an_llm_condenser() {
    // A policy that condenses with an LLM; none is configured here, so the extractive
    // condenser stands in, in the background, and the tool answers at once.
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("llm.toml");
    let default = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("policies/default.toml"),
    )
    .unwrap();
    assert!(default.contains("mode = \"extractive\""));
    std::fs::write(
        &policy,
        default.replace("mode = \"extractive\"", "mode = \"llm\""),
    )
    .unwrap();
    let data = dir.path().join("data");
    let (client, stderr, _) = stdio_client(
        &data,
        ProtocolVersion::V_2025_11_25,
        &["--policy", policy.to_str().unwrap()],
    )
    .await;
    for i in 0..6 {
        ok(
            &client,
            "remember",
            json!({"text": format!("step {i} of the migration")}),
        )
        .await;
    }
    let result = call(&client, "condense", json!({})).await;
    assert_eq!(result.is_error, Some(false));
    assert!(
        text(&result).contains("in the background"),
        "{}",
        text(&result)
    );
    assert_eq!(result.structured_content.unwrap()["memory_id"], Value::Null);
    let mut condensed = false;
    for _ in 0..100 {
        let timeline = ok(&client, "timeline", json!({})).await;
        if timeline["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["tier"] == "condensed")
        {
            condensed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(condensed, "the background condensation wrote its record");
    close_stdio(client, stderr).await;
}
