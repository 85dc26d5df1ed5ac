//! How fast the dashboard's pages load on a large store: builds a store of `--records`
//! records (default 100,000: `--sessions` sessions of the hash embedder's records, some
//! recalled, some with feedback, some condensed), serves it on 127.0.0.1:0 as `serve`
//! does, then loads every view `--rounds` times and reports p50, p99 and the page size,
//! beside anchors measured in the same run: `GET /healthz` (the server's floor), `GET
//! /v1/sessions/{id}/timeline?limit=50` (the API reading what the timeline page shows) and
//! `POST /v1/sessions/{id}/recall` with the search page's query (the recall it makes).
//! Insights are reported twice: computed (`?fresh=1`, every record read) and as cached.
//!
//! ```sh
//! cargo run --release --example dashboard_load                       # 100k records
//! cargo run --release --example dashboard_load -- --records 5000 --rounds 5   # CI's size
//! ```
//!
//! It checks every answer is a 200 page with the view's heading, so it fails when a view
//! breaks.

use std::time::{Duration, Instant};

use clap::{CommandFactory, Parser};
use serde_json::json;

use shadowbrain::auth::Auth;
use shadowbrain::http::{self, ServerLimits};
use shadowbrain::{NewMemory, Runtime, RuntimeConfig};
use shadowbrain_test_support::stats::percentile;

/// How fast the dashboard's pages load on a large store, beside the API's anchors: p50,
/// p99 and size of every view, as a Markdown table.
#[derive(Parser)]
#[command(name = "dashboard_load")]
struct Args {
    /// Records in the store.
    #[arg(long, default_value_t = 100_000)]
    records: usize,
    /// Sessions the records are spread over (at most --records).
    #[arg(long, default_value_t = 1_000)]
    sessions: usize,
    /// Loads of every view.
    #[arg(long, default_value_t = 20)]
    rounds: usize,
}

fn args() -> Args {
    let a = Args::parse();
    if a.records == 0 || a.sessions == 0 || a.rounds == 0 || a.sessions > a.records {
        Args::command()
            .error(
                clap::error::ErrorKind::ValueValidation,
                "--records, --sessions and --rounds must be positive, sessions ≤ records",
            )
            .exit();
    }
    a
}

const TOPICS: [&str; 8] = [
    "the deploy runner moved to eu-2",
    "invoices are sent on the first of the month",
    "the user prefers CSV reports",
    "flaky test in the payments suite",
    "database failover drill passed",
    "the cache warms in ninety seconds",
    "release notes go out on fridays",
    "api keys rotate every quarter",
];

#[tokio::main]
async fn main() {
    let a = args();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let rt = Runtime::open(RuntimeConfig::new(dir.path()))
        .await
        .expect("open the runtime");

    let t0 = Instant::now();
    let per = a.records / a.sessions;
    for s in 0..a.sessions {
        let session = rt
            .session("default", &format!("s{s:05}"))
            .expect("a session");
        let n = if s + 1 == a.sessions {
            a.records - per * s
        } else {
            per
        };
        for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
            let events: Vec<NewMemory> = chunk
                .iter()
                .map(|i| {
                    let text = format!(
                        "{} (note {i} of session {s})",
                        TOPICS[(s + i) % TOPICS.len()]
                    );
                    NewMemory::new("observation", text)
                })
                .collect();
            session.record_batch(events).await.expect("recorded");
        }
    }
    rt.settle().await.expect("indexed");
    let ingest = t0.elapsed();
    // Recalls, a quarter of them with success feedback, and some condensed sessions, so
    // insights and the knowledge views have something to show.
    for s in 0..a.sessions.min(200) {
        let session = rt
            .session("default", &format!("s{s:05}"))
            .expect("a session");
        let result = session
            .recall(TOPICS[s % TOPICS.len()])
            .await
            .expect("recalled");
        if s % 4 == 0
            && let Some(id) = result.recall_id
        {
            session
                .feedback(
                    shadowbrain::FeedbackTarget::Recall(id),
                    shadowbrain::Outcome::Success,
                )
                .await
                .expect("feedback");
        }
        if s % 10 == 0 {
            session.condense().await.expect("condensed");
        }
    }
    rt.settle().await.expect("settled");
    let records = rt.substrate().store().len();
    eprintln!(
        "dashboard_load: {records} records in {} sessions, written and indexed in {:.1} s",
        a.sessions,
        ingest.as_secs_f64()
    );

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
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::new();
    let base = format!("http://{addr}");
    let some = rt
        .session("default", "s00000")
        .expect("a session")
        .timeline(1)
        .await
        .expect("a record")[0]
        .id;

    // A recall the API answers: the anchor of the search page's.
    let recall = |scope: &str| json!({"query": "deploy runner", "scope": scope}).to_string();
    let views: Vec<(&str, String, &str)> = vec![
        ("anchor: GET /healthz", "/healthz".into(), "ok"),
        (
            "anchor: GET /v1 timeline (50)",
            "/v1/sessions/s00001/timeline?limit=50".into(),
            "items",
        ),
        (
            "anchor: POST /v1 recall (namespace, k 10)",
            "/v1/sessions/default/recall".into(),
            "context",
        ),
        (
            "anchor: POST /v1 recall (session, k 10)",
            "/v1/sessions/s00001/recall".into(),
            "context",
        ),
        ("/", "/".into(), "<h1>Overview"),
        ("/ui/sessions", "/ui/sessions".into(), "<h1>Sessions"),
        (
            "/ui/sessions/{id}",
            "/ui/sessions/s00001".into(),
            "<h1>Session s00001",
        ),
        (
            "/ui/search (namespace, k 10)",
            "/ui/search?query=deploy+runner".into(),
            "Context block",
        ),
        (
            "/ui/search (session, k 10)",
            "/ui/search?query=deploy+runner&session=s00001&scope=session".into(),
            "Context block",
        ),
        (
            "/ui/memories/{id}",
            format!("/ui/memories/{some}"),
            "<h1>Memory",
        ),
        ("/ui/knowledge", "/ui/knowledge".into(), "<h1>Knowledge"),
        ("/ui/graph", "/ui/graph".into(), "<h1>Graph"),
        (
            "/ui/insights (computed)",
            "/ui/insights?fresh=1".into(),
            "Most recalled",
        ),
        (
            "/ui/insights (cached)",
            "/ui/insights".into(),
            "Most recalled",
        ),
        ("/ui/policy", "/ui/policy".into(), "<h1>Policy"),
    ];
    println!("| view | p50 ms | p99 ms | bytes |");
    println!("| --- | ---: | ---: | ---: |");
    for (name, path, wanted) in &views {
        let mut times = Vec::new();
        let mut bytes = 0;
        for _ in 0..a.rounds {
            let url = format!("{base}{path}");
            let request = match path.strip_suffix("/recall") {
                Some(session) => http
                    .post(url)
                    .header("content-type", "application/json")
                    .body(recall(if session.ends_with("default") {
                        "namespace"
                    } else {
                        "session"
                    })),
                None => http.get(url),
            };
            let started = Instant::now();
            let answer = request.send().await.expect("an answer");
            let status = answer.status();
            let body = answer.text().await.expect("a body");
            times.push(started.elapsed().as_secs_f64() * 1e3);
            assert!(
                status.is_success() && body.contains(wanted),
                "{path}: {status} {}",
                &body[..body.len().min(300)]
            );
            bytes = body.len();
        }
        times.sort_by(f64::total_cmp);
        let at = |q| percentile(&times, q).expect("--rounds is at least 1");
        println!("| {name} | {:.2} | {:.2} | {bytes} |", at(0.5), at(0.99));
    }
    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(60), served).await;
}
