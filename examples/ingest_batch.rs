//! Batch ingest through the library's facade: events recorded `--batch` at a time
//! (`SessionHandle::record_batch`, each batch one durable commit) into `--sessions` sessions
//! in turn, as a simulation or an importer writes; how many events a second are durable, and
//! what they cost in CPU (the process's, background indexing included).
//!
//! ```text
//! cargo run --release --example ingest_batch -- --events 100000 --batch 1000
//! ```
//!
//! Each run opens a fresh scratch store with the `hash` embedder (the local model embeds
//! after the ack, in the background: see `sessions_scale --embedder local`), and waits for
//! the indexes to catch up before it reads the CPU, so the figure is the whole cost of the
//! events. Prints progress on stderr and, last, one JSON line.

use std::time::{Duration, Instant};

use clap::Parser;
use shadowbrain::embed::{EmbedderConfig, EmbedderKind, build_embedder};
use shadowbrain::{NewMemory, Runtime, RuntimeConfig};
use shadowbrain_test_support::stats::{fixed_sequence, percentile};

// The server binary's allocator, so the figures are the server's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Batch ingest through the facade: events/s and CPU per event; one JSON line, last.
#[derive(Parser)]
#[command(name = "ingest_batch")]
struct Args {
    /// Events recorded.
    #[arg(long, default_value_t = 100_000)]
    events: usize,
    /// Events per `record_batch` call (0 counts as 1).
    #[arg(long, default_value_t = 1_000)]
    batch: usize,
    /// Sessions written in turn, one batch each (0 counts as 1).
    #[arg(long, default_value_t = 100)]
    sessions: usize,
}

/// Words of the texts: twelve of them, drawn at random, and a number.
const WORDS: &str = "deploy runner cache database region cluster token rotate backup restore \
    queue worker latency invoice customer refund ticket escalate outage alert metric \
    dashboard config secret schema migration index shard replica leader follower lease \
    snapshot archive agent session memory recall policy budget plan goal step tool result \
    error retry";

/// The CPU time this process has used, user and system.
fn cpu_time() -> Duration {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage fills the struct it is given; on failure it stays zeroed.
    let usage = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr());
        usage.assume_init()
    };
    let time = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    time(usage.ru_utime) + time(usage.ru_stime)
}

#[tokio::main]
async fn main() {
    let a = Args::parse();
    let (batch, sessions) = (a.batch.max(1), a.sessions.max(1));
    let words: Vec<&str> = WORDS.split_whitespace().collect();
    // Every run writes the same texts.
    let mut next = fixed_sequence(7);
    let texts: Vec<String> = (0..a.events)
        .map(|i| {
            let mut text: Vec<&str> = (0..12).map(|_| words[next() % words.len()]).collect();
            let n = format!("#{i}");
            text.push(&n);
            text.join(" ")
        })
        .collect();

    let scratch = tempfile::tempdir().expect("a scratch directory");
    let mut config = RuntimeConfig::new(scratch.path());
    config.call_timeout = Duration::from_secs(120);
    config.substrate.embedder = build_embedder(&EmbedderConfig {
        kind: EmbedderKind::Hash,
        ..Default::default()
    })
    .expect("the hash embedder");
    let rt = Runtime::open(config).await.expect("open the runtime");

    eprintln!(
        "ingest_batch: {} events, {batch} a call, {sessions} sessions",
        a.events
    );
    let cpu0 = cpu_time();
    let started = Instant::now();
    let mut took = Vec::new();
    for (n, chunk) in texts.chunks(batch).enumerate() {
        let session = rt
            .session("default", &format!("s{}", n % sessions))
            .expect("a valid session id");
        let events = chunk
            .iter()
            .map(|t| NewMemory::new("observation", t.as_str()))
            .collect();
        let t0 = Instant::now();
        session.record_batch(events).await.expect("a durable write");
        took.push(t0.elapsed().as_secs_f64() * 1e3);
        if n % 20 == 19 {
            eprintln!("  {} events", (n + 1) * batch);
        }
    }
    let acked = started.elapsed();
    let cpu_acked = cpu_time() - cpu0;
    // The indexes catch up after the acks: their work is part of what the events cost.
    rt.settle().await.expect("settle");
    while !rt.substrate().indexes_caught_up().expect("the index state") {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let caught_up = started.elapsed();
    let cpu = cpu_time() - cpu0;
    rt.shutdown().await.expect("shut down");

    took.sort_by(f64::total_cmp);
    let events = a.events.max(1) as f64;
    let rate = events / acked.as_secs_f64();
    eprintln!(
        "{rate:.0} events/s acked; {:.1} µs of CPU an event ({:.1} by the last ack); indexes \
         caught up after {:.2} s",
        cpu.as_secs_f64() * 1e6 / events,
        cpu_acked.as_secs_f64() * 1e6 / events,
        caught_up.as_secs_f64()
    );
    println!(
        "{}",
        serde_json::json!({
            "events": a.events,
            "batch": batch,
            "sessions": sessions,
            "embedder": "hash",
            "events_per_s": rate,
            "batch_p50_ms": percentile(&took, 0.5),
            "batch_p99_ms": percentile(&took, 0.99),
            "caught_up_s": caught_up.as_secs_f64(),
            "cpu_us_per_event": cpu.as_secs_f64() * 1e6 / events,
            "cpu_us_per_event_at_last_ack": cpu_acked.as_secs_f64() * 1e6 / events,
        })
    );
}
