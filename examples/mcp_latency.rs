//! The cost of the MCP door: the same recall, on the same data and server, asked through
//! the plain HTTP API (`POST /v1/sessions/{id}/recall`, the anchor) and through `/mcp`'s
//! `recall` tool with the official SDK's client — once on a protocol session (the
//! 2025-11-25 revision, `initialize` and `Mcp-Session-Id`) and once on the stateless
//! 2026-07-28 revision.
//!
//! ```text
//! cargo run --release --example mcp_latency -- --sessions 100 --events 100 --recalls 2000
//! ```
//!
//! A real server (in this process, on port 0) is loaded with `--events` events in each of
//! `--sessions` sessions over HTTP and its indexes are built. Then one client at a time asks
//! `--recalls` recalls per door, the doors taking turns query by query (each query asked of
//! every door, the order rotating), so every door meets the same queries on the same store
//! in the same seconds. Prints p50/p99 per door on stderr and one JSON line on stdout.

use std::time::{Duration, Instant};

use clap::Parser;
use rmcp::model::{CallToolRequestParams, ClientConfig, JsonObject, ProtocolVersion};
use rmcp::service::{ClientLifecycleMode, ClientServiceExt, RoleClient, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::{Value, json};
use shadowbrain::auth::Auth;
use shadowbrain::http::{self, ServerLimits};
use shadowbrain::{Runtime, RuntimeConfig};
use shadowbrain_test_support::stats::percentile;

/// Words the events are made of; a query is two of them.
const WORDS: [&str; 24] = [
    "backup",
    "deploy",
    "runner",
    "timeout",
    "invoice",
    "customer",
    "report",
    "csv",
    "region",
    "database",
    "latency",
    "cache",
    "ticket",
    "refund",
    "schedule",
    "budget",
    "alert",
    "disk",
    "certificate",
    "login",
    "export",
    "migration",
    "queue",
    "billing",
];

/// The same recall through the HTTP API and through /mcp's `recall` tool (a protocol
/// session, and stateless): p50 and p99 per door.
#[derive(Parser)]
#[command(name = "mcp_latency")]
struct Args {
    /// Sessions written to (0 counts as 1).
    #[arg(long, default_value_t = 100)]
    sessions: usize,
    /// Events written to each session (0 counts as 1).
    #[arg(long, default_value_t = 100)]
    events: usize,
    /// Recalls asked of each door (0 counts as 1).
    #[arg(long, default_value_t = 2000)]
    recalls: usize,
}

fn args() -> Args {
    let a = Args::parse();
    Args {
        sessions: a.sessions.max(1),
        events: a.events.max(1),
        recalls: a.recalls.max(1),
    }
}

type Mcp = RunningService<RoleClient, ClientConfig>;

async fn mcp_client(url: &str, version: ProtocolVersion) -> Mcp {
    let transport = StreamableHttpClientTransport::with_client(
        reqwest::Client::new(),
        StreamableHttpClientTransportConfig::with_uri(url),
    );
    let mut info = ClientConfig::default();
    info.protocol_version = version.clone();
    let lifecycle = if version == ProtocolVersion::V_2026_07_28 {
        ClientLifecycleMode::Discover {
            preferred_versions: vec![version],
        }
    } else {
        ClientLifecycleMode::Initialize
    };
    info.serve_with_lifecycle(transport, lifecycle)
        .await
        .expect("an MCP client")
}

#[tokio::main]
async fn main() {
    let a = args();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let rt = Runtime::open(RuntimeConfig::new(dir.path()))
        .await
        .expect("open the runtime");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("listen");
    let addr = listener.local_addr().expect("an address");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(http::serve(
        listener,
        rt.clone(),
        http::Options {
            auth: Auth::open(),
            server: ServerLimits::default(),
            ..http::Options::default()
        },
        async {
            let _ = stopped.await;
        },
    ));
    let http = reqwest::Client::new();
    let base = format!("http://{addr}");

    eprintln!(
        "mcp_latency: {} sessions × {} events over HTTP …",
        a.sessions, a.events
    );
    for s in 0..a.sessions {
        let events: Vec<Value> = (0..a.events)
            .map(|i| {
                let n = s * a.events + i;
                let (w1, w2, w3) = (WORDS[n % 24], WORDS[(n / 24) % 24], WORDS[(n * 7 + s) % 24]);
                json!({"kind": "observation", "text": format!("event {i}: the {w1} {w2} needs a {w3} check")})
            })
            .collect();
        let answer = http
            .post(format!("{base}/v1/sessions/s{s}/events"))
            .header("content-type", "application/json")
            .body(json!({ "events": events }).to_string())
            .send()
            .await
            .expect("a write");
        assert_eq!(answer.status(), 201);
    }
    let sub = rt.substrate().clone();
    tokio::task::spawn_blocking(move || sub.flush_indexes())
        .await
        .expect("the flush task")
        .expect("the indexes built");

    let url = format!("{base}/mcp");
    let sessioned = mcp_client(&url, ProtocolVersion::V_2025_11_25).await;
    let stateless = mcp_client(&url, ProtocolVersion::V_2026_07_28).await;
    let doors = ["http", "mcp 2025-11-25", "mcp 2026-07-28"];
    let mut latencies: Vec<Vec<f64>> = vec![Vec::new(); doors.len()];
    eprintln!(
        "mcp_latency: {} recalls per door, taking turns …",
        a.recalls
    );
    for i in 0..a.recalls {
        let session = format!("s{}", i % a.sessions);
        let query = format!("{} {}", WORDS[i % 24], WORDS[(i * 5 + 3) % 24]);
        for turn in 0..doors.len() {
            let door = (i + turn) % doors.len();
            let started = Instant::now();
            let memories = match door {
                0 => {
                    let answer = http
                        .post(format!("{base}/v1/sessions/{session}/recall"))
                        .header("content-type", "application/json")
                        .body(json!({"query": query, "k": 10}).to_string())
                        .send()
                        .await
                        .expect("a recall");
                    assert_eq!(answer.status(), 200);
                    let body: Value =
                        serde_json::from_str(&answer.text().await.expect("a body")).unwrap();
                    body["memories"].as_array().map_or(0, Vec::len)
                }
                _ => {
                    let client = if door == 1 { &sessioned } else { &stateless };
                    let args: JsonObject = serde_json::from_value(
                        json!({"session_id": session, "query": query, "k": 10}),
                    )
                    .unwrap();
                    let result = client
                        .call_tool(CallToolRequestParams::new("recall").with_arguments(args))
                        .await
                        .expect("a tool call");
                    assert_eq!(result.is_error, Some(false));
                    let structured = result.structured_content.expect("structured");
                    structured["memories"].as_array().map_or(0, Vec::len)
                }
            };
            latencies[door].push(started.elapsed().as_secs_f64() * 1e3);
            assert!(memories > 0, "{} found nothing for {query}", doors[door]);
        }
    }
    let mut rows = Vec::new();
    let mut p50s = Vec::new();
    for (door, lat) in doors.iter().zip(&mut latencies) {
        lat.sort_by(f64::total_cmp);
        let at = |q| percentile(lat, q).expect("--recalls is at least 1");
        let (p50, p99) = (at(0.5), at(0.99));
        eprintln!("mcp_latency: {door:>15}: recall p50 {p50:.3} ms, p99 {p99:.3} ms");
        rows.push(json!({"door": door, "p50_ms": p50, "p99_ms": p99, "recalls": lat.len()}));
        p50s.push(p50);
    }
    let anchor = p50s[0];
    println!(
        "{}",
        json!({
            "sessions": a.sessions,
            "events_per_session": a.events,
            "doors": rows,
            "mcp_p50_over_http": [p50s[1] / anchor, p50s[2] / anchor],
        })
    );
    drop((sessioned, stateless));
    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(30), served)
        .await
        .expect("the server stops")
        .expect("the server task")
        .expect("served");
}
