//! Recall while the enricher works through a backlog, against a `serve` already running in
//! its own process (the release binary on an empty data directory; with no config, the
//! default configuration: the local model when `scripts/setup` installed it):
//!
//! ```text
//! target/release/shadowbrain serve --addr 127.0.0.1:7499 --data "$(mktemp -d)" &
//! cargo run --release --example recall_backlog -- --target 127.0.0.1:7499 \
//!     [--records 10000] [--rate 40] [--secs 60]
//! ```
//!
//! It writes `--records` events (100 per call, to 100 sessions), which the server
//! acknowledges at once and queues for embedding; then one client recalls at `--rate` a
//! second (session scope, a question about one of the topics written) for as long as the
//! enrich queue is not empty (read from `/metrics` every 100 ms, which needs no key on a
//! server without keys), `--secs` at most, each latency counted from when the recall was
//! due, so a slow answer delaying the next is not hidden: the backlog figure. Once the
//! queue is empty, as many recalls again on the same store: the idle figure, its anchor.
//! Prints both and their ratio, last, as one JSON line.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use serde_json::json;
use shadowbrain_test_support::flags::positive;
use shadowbrain_test_support::stats::percentile;

const TOPICS: [&str; 8] = [
    "the nightly backup job timed out",
    "deploys fail when the cache is cold",
    "the customer asked for a refund of the annual plan",
    "latency spiked after the config change",
    "the migration script skipped the archived rows",
    "tests are flaky when the clock crosses midnight",
    "the invoice PDF had the wrong tax rate",
    "the on-call rota has a gap on sunday",
];

const QUESTIONS: [&str; 8] = [
    "why did the backup fail last night?",
    "what happens to deploys with a cold cache?",
    "which customer wanted their money back?",
    "what made latency go up?",
    "which rows did the migration miss?",
    "when do the tests become unreliable?",
    "what was wrong with the invoice?",
    "who is on call on the weekend?",
];

/// Recall while a running `serve` embeds a backlog, against recall once it is idle: p50,
/// p99 and their ratios.
#[derive(Parser)]
#[command(name = "recall_backlog")]
struct Args {
    /// The running `shadowbrain serve`'s address, e.g. 127.0.0.1:7499.
    #[arg(long, value_name = "HOST:PORT")]
    target: String,
    /// Events written first (100 per call, to 100 sessions).
    #[arg(long, default_value_t = 10_000,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    records: usize,
    /// Recalls per second.
    #[arg(long, default_value_t = 40.0, value_parser = positive)]
    rate: f64,
    /// The longest the recalls beside the backlog go on, in seconds.
    #[arg(long, default_value_t = 60.0, value_parser = positive)]
    secs: f64,
}

/// The enrich queue's depth from `/metrics`.
async fn enrich_depth(http: &reqwest::Client, base: &str) -> u64 {
    let text = http
        .get(format!("{base}/metrics"))
        .send()
        .await
        .and_then(|r| r.error_for_status())
        .expect("GET /metrics (a server without keys)")
        .text()
        .await
        .expect("the metrics text");
    text.lines()
        .find(|l| l.starts_with("shadowbrain_work_queue_depth{queue=\"enrich\"}"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// At most `n` recalls paced at `rate`, until `stop` says so; latencies in ms from when
/// each was due, sorted.
async fn paced_recalls(
    http: &reqwest::Client,
    base: &str,
    rate: f64,
    n: usize,
    stop: &AtomicBool,
) -> Vec<f64> {
    let interval = Duration::from_secs_f64(1.0 / rate);
    let start = Instant::now();
    let mut lat = Vec::with_capacity(n);
    for i in 0..n {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let due = start + interval * i as u32;
        tokio::time::sleep_until(due.into()).await;
        let answer = http
            .post(format!("{base}/v1/sessions/s{}/recall", i % 100))
            .json(&json!({ "query": QUESTIONS[i % QUESTIONS.len()], "k": 10 }))
            .send()
            .await
            .expect("recall");
        assert!(answer.status().is_success(), "recall: {}", answer.status());
        answer.bytes().await.expect("the recall's body");
        lat.push(due.elapsed().as_secs_f64() * 1000.0);
    }
    lat.sort_by(f64::total_cmp);
    lat
}

#[tokio::main]
async fn main() {
    let a = Args::parse();
    let base = format!("http://{}", a.target);
    // Plain HTTP on loopback, but reqwest is built with rustls and no provider chosen.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::new();
    let embedder = http
        .get(format!("{base}/healthz"))
        .send()
        .await
        .expect("GET /healthz: is the server running?")
        .text()
        .await
        .unwrap_or_default();
    let started = Instant::now();
    for b in 0..a.records.div_ceil(100) {
        let n = 100.min(a.records - b * 100);
        let events: Vec<_> = (0..n)
            .map(|i| {
                json!({"kind": "observation",
                       "text": format!("{} (batch {b}, event {i})", TOPICS[(b + i) % TOPICS.len()])})
            })
            .collect();
        let answer = http
            .post(format!("{base}/v1/sessions/s{}/events", b % 100))
            .json(&json!({ "events": events }))
            .send()
            .await
            .expect("write");
        assert!(answer.status().is_success(), "write: {}", answer.status());
    }
    let write_s = started.elapsed().as_secs_f64();
    let before = enrich_depth(&http, &base).await;
    eprintln!(
        "recall_backlog: {} events acknowledged in {write_s:.1} s; {before} queued for embedding",
        a.records
    );
    let empty = Arc::new(AtomicBool::new(false));
    let watch = {
        let (http, base, empty) = (http.clone(), base.clone(), empty.clone());
        tokio::spawn(async move {
            while enrich_depth(&http, &base).await > 0 {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            empty.store(true, Ordering::Relaxed);
        })
    };
    let most = (a.rate * a.secs) as usize;
    let recalling = Instant::now();
    let busy = paced_recalls(&http, &base, a.rate, most, &empty).await;
    let busy_s = recalling.elapsed().as_secs_f64();
    let after = enrich_depth(&http, &base).await;
    eprintln!(
        "recall_backlog: {} recalls in {busy_s:.1} s beside the backlog; {after} still queued",
        busy.len()
    );
    watch.await.expect("the queue watcher");
    eprintln!("recall_backlog: queue empty; as many recalls again");
    let idle = paced_recalls(&http, &base, a.rate, busy.len(), &AtomicBool::new(false)).await;
    let at = |sorted: &[f64], q| {
        percentile(sorted, q).expect("recalls (none ran: the queue was empty before the first)")
    };
    let (bp50, bp99) = (at(&busy, 0.5), at(&busy, 0.99));
    let (ip50, ip99) = (at(&idle, 0.5), at(&idle, 0.99));
    eprintln!(
        "recall_backlog: beside the backlog p50 {bp50:.2} ms, p99 {bp99:.2} ms; idle p50 \
         {ip50:.2} ms, p99 {ip99:.2} ms; ratio {:.2} / {:.2}",
        bp50 / ip50,
        bp99 / ip99,
    );
    println!(
        "{}",
        json!({
            "server": embedder.trim(),
            "records": a.records,
            "write_s": (write_s * 100.0).round() / 100.0,
            "rate": a.rate,
            "recalls": busy.len(),
            "backlog_secs": (busy_s * 10.0).round() / 10.0,
            "queued_before": before,
            "queued_after": after,
            "backlog_p50_ms": (bp50 * 100.0).round() / 100.0,
            "backlog_p99_ms": (bp99 * 100.0).round() / 100.0,
            "idle_p50_ms": (ip50 * 100.0).round() / 100.0,
            "idle_p99_ms": (ip99 * 100.0).round() / 100.0,
            "p50_ratio": (bp50 / ip50 * 100.0).round() / 100.0,
            "p99_ratio": (bp99 / ip99 * 100.0).round() / 100.0,
        })
    );
}
