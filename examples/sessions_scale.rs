//! Many sessions through the actor runtime: how much memory 100,000 touched sessions cost
//! (idle session actors passivate), how fast durable writes go with many sessions writing
//! at once, how long a new session takes to answer its first write, and what a
//! session-scoped recall costs through the handle (actor hop included).
//!
//! ```text
//! cargo run --release --example sessions_scale -- --sessions 100000 --events 10
//! ```
//!
//! Each session writes its events one call at a time (as an agent does), `--concurrency`
//! sessions at once. Prints progress on stderr and, last, one JSON line.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use shadowbrain::NewMemory;
use shadowbrain::embed::EmbedderKind;
use shadowbrain_test_support::stats::percentile;

// The server binary's allocator, so the figures are the server's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
use shadowbrain::{Runtime, RuntimeConfig};

/// Many sessions through the actor runtime: memory, durable write rate, first-write and
/// recall latency; one JSON line, last.
#[derive(Parser)]
#[command(name = "sessions_scale")]
struct Args {
    /// Sessions touched.
    #[arg(long, default_value_t = 100_000)]
    sessions: usize,
    /// Events each session writes, one call each (0 counts as 1).
    #[arg(long, default_value_t = 10)]
    events: usize,
    /// Sessions writing at once (0 counts as 1).
    #[arg(long, default_value_t = 1_000)]
    concurrency: usize,
    /// Session-scoped recalls timed, before and after the indexes catch up.
    #[arg(long, default_value_t = 2_000)]
    recalls: usize,
    /// How long an idle session actor lives before it passivates, in ms.
    #[arg(long, value_name = "MS", default_value_t = 2_000)]
    idle_ms: u64,
    /// Keep the data in DIR instead of a scratch directory.
    #[arg(long, value_name = "DIR")]
    data: Option<std::path::PathBuf>,
    /// Threads of each vector index build, foreground and background (0 counts as 1).
    #[arg(long)]
    build_threads: Option<usize>,
    /// Build the vector index once this many changes are staged (0 counts as 1).
    #[arg(long)]
    build_every: Option<usize>,
    /// The embedder; with `local`, records are embedded in the background, and the acks
    /// show what that costs the write path.
    #[arg(long, value_enum, default_value_t = Embedder::Hash)]
    embedder: Embedder,
}

/// `--embedder`.
#[derive(Clone, Copy, ValueEnum)]
enum Embedder {
    Hash,
    Local,
}

fn args() -> Args {
    let a = Args::parse();
    Args {
        events: a.events.max(1),
        concurrency: a.concurrency.max(1),
        build_threads: a.build_threads.map(|n| n.max(1)),
        build_every: a.build_every.map(|n| n.max(1)),
        ..a
    }
}

/// Peak resident memory of this process, from the kernel (Linux).
fn peak_rss_mb() -> f64 {
    status_mb("VmHWM:")
}

/// A field of `/proc/self/status` in MB (`RssAnon`, `RssFile`, …).
fn status_mb(field: &str) -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

/// Peaks of the heap (`RssAnon`) and of mapped file pages (`RssFile`: the LMDB maps,
/// page cache the kernel may reclaim), sampled every 50 ms: `VmHWM` counts both.
#[derive(Default)]
struct Peaks {
    anon: std::sync::atomic::AtomicU64,
    file: std::sync::atomic::AtomicU64,
}

impl Peaks {
    fn sample(&self) {
        self.anon
            .fetch_max(status_mb("RssAnon:") as u64, Ordering::Relaxed);
        self.file
            .fetch_max(status_mb("RssFile:") as u64, Ordering::Relaxed);
    }
}

const TOPICS: [&str; 8] = [
    "the payment gateway timed out",
    "the user asked for a refund",
    "deploy finished on staging",
    "the search index is stale",
    "tests failed on the billing module",
    "the customer prefers email over phone",
    "retrying with backoff fixed the error",
    "the report is due on friday",
];

#[tokio::main]
async fn main() {
    let a = args();
    let tmp;
    let dir = match &a.data {
        Some(d) => d.clone(),
        None => {
            tmp = tempfile::tempdir().expect("a temporary directory");
            tmp.path().to_path_buf()
        }
    };
    let mut config = RuntimeConfig::new(&dir);
    config.session_idle = Duration::from_millis(a.idle_ms);
    config.call_timeout = Duration::from_secs(120);
    let kind = match a.embedder {
        Embedder::Hash => EmbedderKind::Hash,
        Embedder::Local => EmbedderKind::Local,
    };
    config.substrate.embedder =
        shadowbrain::embed::build_embedder(&shadowbrain::embed::EmbedderConfig {
            kind,
            ..Default::default()
        })
        .unwrap_or_else(|e| {
            eprintln!("{e}");
            std::process::exit(1);
        });
    if let Some(n) = a.build_threads {
        config.substrate.vector.build_threads = n;
        config.substrate.vector.background_build_threads = n;
    }
    if let Some(n) = a.build_every {
        config.substrate.indexing.build_every = n;
    }
    let rt = Runtime::open(config).await.expect("open the runtime");

    eprintln!(
        "sessions_scale: {} sessions × {} events, {} at a time",
        a.sessions, a.events, a.concurrency
    );
    let peaks = Arc::new(Peaks::default());
    {
        let peaks = peaks.clone();
        std::thread::spawn(move || {
            loop {
                peaks.sample();
                std::thread::sleep(Duration::from_millis(50));
            }
        });
    }
    let next = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let t0 = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..a.concurrency {
        let (rt, next, done) = (rt.clone(), next.clone(), done.clone());
        let (sessions, events) = (a.sessions, a.events);
        workers.spawn(async move {
            let mut first_acks = Vec::new();
            loop {
                let s = next.fetch_add(1, Ordering::Relaxed);
                if s >= sessions {
                    return first_acks;
                }
                let session = rt.session("scale", &format!("s{s:06}")).expect("valid id");
                for e in 0..events {
                    let text = format!("{} (session {s}, step {e})", TOPICS[(s + e) % TOPICS.len()]);
                    let t = Instant::now();
                    session
                        .record(NewMemory::new("observation", text))
                        .await
                        .expect("a durable write");
                    if e == 0 {
                        first_acks.push(t.elapsed().as_secs_f64() * 1000.0);
                    }
                }
                let n = done.fetch_add(1, Ordering::Relaxed) + 1;
                if n % 10_000 == 0 {
                    eprintln!(
                        "sessions_scale: {n} sessions, {:.0} events/s, {} live actors, RSS peak {:.0} MB (now: heap {:.0} MB, mapped files {:.0} MB); unbuilt: {} vectors, {} keyword docs",
                        (n * events) as f64 / t0.elapsed().as_secs_f64(),
                        rt.live_sessions().await.unwrap_or(0),
                        peak_rss_mb(),
                        status_mb("RssAnon:"),
                        status_mb("RssFile:"),
                        rt.substrate().vectors().pending(),
                        rt.substrate().keywords().pending(),
                    );
                }
            }
        });
    }
    let mut first_acks = Vec::with_capacity(a.sessions);
    while let Some(w) = workers.join_next().await {
        first_acks.extend(w.expect("a worker"));
    }
    let ingest_s = t0.elapsed().as_secs_f64();
    // What touching the sessions took; the whole run's peak below adds the tree builds
    // that catch up with the burst afterwards (they map the whole vector index).
    let ingest_peak = peak_rss_mb();
    let events = a.sessions * a.events;
    let events_per_s = events as f64 / ingest_s;
    first_acks.sort_by(f64::total_cmp);
    let commits = rt.substrate().store().commit_stats();
    eprintln!(
        "sessions_scale: ingest {events_per_s:.0} events/s ({ingest_s:.1} s); {} durable commits, {:.1} writes each",
        commits.commits,
        commits.write_sets as f64 / commits.commits.max(1) as f64
    );

    // Session-scoped recall through the handle, over the whole store: first while the
    // indexes catch up with the burst (tree builds and keyword commits share the cores),
    // then once they have.
    let lat = recalls(&rt, &a, 0).await;
    let catch_up = Instant::now();
    let sub = rt.substrate().clone();
    tokio::task::spawn_blocking(move || sub.flush_indexes())
        .await
        .expect("the flush task")
        .expect("the indexes built");
    eprintln!(
        "sessions_scale: indexes caught up {:.1} s after the recalls",
        catch_up.elapsed().as_secs_f64()
    );
    let settled = recalls(&rt, &a, 1).await;
    let live = rt.live_sessions().await.unwrap_or(0);
    let peak = peak_rss_mb();
    peaks.sample();
    let (peak_anon, peak_file) = (
        peaks.anon.load(Ordering::Relaxed),
        peaks.file.load(Ordering::Relaxed),
    );
    // No samples (`--recalls 0`) print as 0.
    let ms = |sorted: &[f64], q| percentile(sorted, q).unwrap_or(0.0);
    eprintln!(
        "sessions_scale: recall p50 {:.3} ms p99 {:.3} ms (indexes built: {:.3} / {:.3} ms); {live} live session actors; peak RSS {peak:.0} MB",
        ms(&lat, 0.5),
        ms(&lat, 0.99),
        ms(&settled, 0.5),
        ms(&settled, 0.99)
    );
    rt.shutdown().await.expect("a clean shutdown");
    println!(
        "{{\"sessions\":{},\"events\":{},\"peak_rss_mb\":{:.0},\"peak_rss_ingest_mb\":{ingest_peak:.0},\"events_per_s\":{:.0},\"first_ack_p50_ms\":{:.3},\"first_ack_p99_ms\":{:.3},\"recall_p50_ms\":{:.3},\"recall_p99_ms\":{:.3},\"recall_built_p50_ms\":{:.3},\"recall_built_p99_ms\":{:.3},\"peak_heap_mb\":{peak_anon},\"peak_mapped_files_mb\":{peak_file},\"live_sessions_at_end\":{live}}}",
        a.sessions,
        events,
        peak,
        events_per_s,
        ms(&first_acks, 0.5),
        ms(&first_acks, 0.99),
        ms(&lat, 0.5),
        ms(&lat, 0.99),
        ms(&settled, 0.5),
        ms(&settled, 0.99),
    );
}

/// `a.recalls` session-scoped recalls through the handle, spread over the sessions (`round`
/// shifts which ones); their latencies in ms, sorted.
async fn recalls(rt: &Runtime, a: &Args, round: usize) -> Vec<f64> {
    let mut lat = Vec::with_capacity(a.recalls);
    for i in 0..a.recalls {
        let s = (i * 7_919 + round * 104_729) % a.sessions;
        let session = rt.session("scale", &format!("s{s:06}")).expect("valid id");
        let query = TOPICS[(i + round) % TOPICS.len()];
        let t = Instant::now();
        session.recall(query).await.expect("a recall");
        lat.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    lat.sort_by(f64::total_cmp);
    lat
}
