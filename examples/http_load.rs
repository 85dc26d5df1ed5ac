//! Load over HTTP on loopback: a real `shadowbrain` server (in this process, on port 0) and
//! `--clients` concurrent keep-alive clients.
//!
//! ```text
//! cargo run --release --example http_load -- --clients 32 --events 100000 --batch 100 --recalls 2000
//! ```
//!
//! Phase 1: the clients write `--events` events in batches of `--batch` (`POST
//! /v1/sessions/{id}/events`, batch `b` to session `s{b % sessions}`), each answered only
//! once durable.
//! Then both indexes are flushed (built). Phase 2 (saturation): `--recalls` session-scoped
//! recalls (`POST /v1/sessions/{id}/recall`), each client sending the next as soon as the
//! last is answered. With 32 clients on 2 cores this measures throughput; its latency is
//! queueing (Little's law: latency ≈ clients / throughput). Phase 3 (paced, `--rates
//! 500,1000`): for `--paced-secs` each, the clients together send recalls at a fixed rate,
//! each client on its own schedule, and latency counts from when a request was *due* (so
//! a slow answer that delays the next request is not hidden). Phase 4 (mixed,
//! `--mixed-secs 20`): `--mixed-clients` keep-alive clients each loop over a write of 1–50
//! events to one of 2,000 sessions or a recall, half and half, for that long — first
//! against a fresh server with admission control off (the anchor), then with the limits
//! refusing at once (`queue_wait = "0s"`, as before requests could wait for a slot), then
//! with the default `[server]` limits (`--mixed-max-recalls` to try another); a refused
//! request (503) waits what the answer asks, as a client should. Beside them a probe recalls
//! every 50 ms from one of 100 sessions nobody writes to: its p99 per third of the phase
//! shows what a recall of a fixed scope costs while the store grows around it.
//! `--paced-mixed 1000` adds the same mix paced at that many requests per second from
//! `--paced-mixed-clients` (20) clients, writes of 1–10 events, latency from when each
//! request was due: refusing at once, then waiting for a slot; with `--idle 2000`, once more
//! beside 2,000 idle keep-alive connections (more than `max_connections`). Prints
//! progress on stderr and, last, one JSON line.
//!
//! `--policy FILE` runs the in-process servers on that policy instead of the default one
//! (a file with `[scoring] reinforce_on_recall = 0` measures recall without the
//! reinforcement writes each recall makes).
//!
//! `--target HOST:PORT --mixed-secs 60`: only the mixed load, against a server already
//! running in another process (the release binary, on an empty data directory), so the
//! clients and the server are separate processes as in production; with `--paced-mixed`,
//! paced, and with `--idle N` beside N idle keep-alive connections. `--slow 15` prints
//! each mixed-load request slower than 15 ms, and each refusal, with the wall-clock time it
//! was due, to line up with the server's log and a profiler's samples.
//!
//! The clients check each answer's shape without building a JSON tree: they share the
//! cores with the server, and their own parsing would be counted against it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use serde::de::IgnoredAny;
use serde_json::{Value, json};
use shadowbrain::auth::Auth;
use shadowbrain::http::{self, ServerLimits};
use shadowbrain::{Policy, Runtime, RuntimeConfig};
use shadowbrain_test_support::flags::{non_negative, positive};
use shadowbrain_test_support::stats::percentile;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

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

/// Load over HTTP on loopback: ingest, saturating and paced recalls, and a mixed load of
/// writes and recalls under each admission variant; one JSON line, last.
#[derive(Parser)]
#[command(name = "http_load")]
struct Args {
    /// Keep-alive clients of phases 1–3 (0 counts as 1).
    #[arg(long, default_value_t = 32)]
    clients: usize,
    /// Sessions phases 1–3 write to and recall from (0 counts as 1).
    #[arg(long, default_value_t = 1_000)]
    sessions: usize,
    /// Phase 1: events written.
    #[arg(long, default_value_t = 100_000)]
    events: usize,
    /// Phase 1: events per write (clamped to 1..=1000).
    #[arg(long, default_value_t = 100)]
    batch: usize,
    /// Phase 2: recalls, each client sending the next as soon as the last is answered.
    #[arg(long, default_value_t = 2_000)]
    recalls: usize,
    /// Phase 3: recall rates per second, comma-separated, each paced for --paced-secs.
    #[arg(long, value_delimiter = ',', value_parser = positive)]
    rates: Vec<f64>,
    /// Phase 3: seconds at each rate (at least 1).
    #[arg(long, value_name = "SECS", default_value_t = 10.0, value_parser = non_negative)]
    paced_secs: f64,
    /// Phase 4: seconds of mixed load per admission variant (0: none; 20 with --target).
    #[arg(long, value_name = "SECS", default_value_t = 0.0, value_parser = non_negative)]
    mixed_secs: f64,
    /// Phase 4: keep-alive clients (0 counts as 1).
    #[arg(long, default_value_t = 200)]
    mixed_clients: usize,
    /// Phase 4: `max_recalls` of the limited variants (0 counts as 1).
    #[arg(long, default_value_t = ServerLimits::default().max_recalls)]
    mixed_max_recalls: usize,
    /// Phase 4: `max_writes` of the waiting variant (0 counts as 1).
    #[arg(long, default_value_t = ServerLimits::default().max_writes)]
    mixed_max_writes: usize,
    /// Phase 4: `queue_wait` of the waiting variant, in ms.
    #[arg(long, value_name = "MS",
          default_value_t = ServerLimits::default().queue_wait.as_millis() as u64)]
    mixed_queue_wait: u64,
    /// Phase 4: `write_queue_wait` of the waiting variant, in ms.
    #[arg(long, value_name = "MS",
          default_value_t = ServerLimits::default().write_queue_wait.as_millis() as u64)]
    mixed_write_wait: u64,
    /// Phase 4: the admission variants run, comma-separated.
    #[arg(long, value_delimiter = ',', default_values = ["off", "at_once", "queue"],
          value_parser = ["off", "at_once", "queue"])]
    mixed_variants: Vec<String>,
    /// The paced mixed load: requests per second over all its clients (0: none).
    #[arg(long, value_name = "RATE", default_value_t = 0.0, value_parser = non_negative)]
    paced_mixed: f64,
    /// The paced mixed load's clients (0 counts as 1).
    #[arg(long, default_value_t = 20)]
    paced_mixed_clients: usize,
    /// Run the paced mixed load once more beside N idle keep-alive connections.
    #[arg(long, value_name = "N", default_value_t = 0)]
    idle: usize,
    /// Print each mixed-load request slower than MS, and each refusal, with when it was due.
    #[arg(long, value_name = "MS")]
    slow: Option<u64>,
    /// Only the mixed load, against a server already running at HOST:PORT.
    #[arg(long, value_name = "HOST:PORT")]
    target: Option<SocketAddr>,
    /// Run the in-process servers on the policy in FILE (TOML) instead of the default one.
    #[arg(long, value_name = "FILE", value_parser = policy)]
    policy: Option<Policy>,
}

/// `--slow MS`: the mixed loads print each request slower than this, and each refusal.
static SLOW_MS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();

/// One line on stderr for a slow or refused request: when it was due on the wall clock
/// (seconds within the hour, to line up with the server's log and a profiler's samples),
/// write or recall, status, latency, and a refusal's body.
fn log_slow(due: Instant, write: bool, status: u16, ms: f64, answer: &[u8]) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let at = now % 3600.0 - due.elapsed().as_secs_f64();
    let body = if status == 503 {
        String::from_utf8_lossy(answer).into_owned()
    } else {
        String::new()
    };
    let kind = if write { "write" } else { "recall" };
    eprintln!("http_load: slow at {at:.3} s: {kind} {status} {ms:.1} ms {body}");
}

fn args() -> Args {
    let a = Args::parse();
    if let Some(ms) = a.slow {
        let _ = SLOW_MS.set(ms as f64);
    }
    Args {
        clients: a.clients.max(1),
        sessions: a.sessions.max(1),
        batch: a.batch.clamp(1, 1000),
        paced_secs: a.paced_secs.max(1.0),
        mixed_clients: a.mixed_clients.max(1),
        mixed_max_recalls: a.mixed_max_recalls.max(1),
        mixed_max_writes: a.mixed_max_writes.max(1),
        paced_mixed_clients: a.paced_mixed_clients.max(1),
        ..a
    }
}

/// The `q` quantile of the latencies `sorted` (ms), 0 when there are none (nothing refused,
/// say): the JSON line stays numbers.
fn ms_at(sorted: &[f64], q: f64) -> f64 {
    percentile(sorted, q).unwrap_or(0.0)
}

/// `--policy FILE`: the policy the file holds (and the environment overrides), checked.
fn policy(file: &str) -> Result<Policy, String> {
    Policy::load(std::path::Path::new(file)).map_err(|e| e.to_string())
}

/// One keep-alive HTTP/1.1 connection: a request, then its status and JSON body.
struct Client {
    stream: BufReader<TcpStream>,
    addr: SocketAddr,
    /// The server closed after the last answer: the next request needs a new connection.
    closed: bool,
}

impl Client {
    async fn connect(addr: SocketAddr) -> Client {
        let stream = TcpStream::connect(addr).await.expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        Client {
            stream: BufReader::new(stream),
            addr,
            closed: false,
        }
    }

    /// Reconnects if the server closed after the last answer. Done before a request's
    /// clock starts, so a refusal's latency is the time to its answer, not to the next
    /// connection.
    async fn ready(&mut self) {
        if self.closed {
            *self = Client::connect(self.addr).await;
        }
    }

    async fn post(&mut self, path: &str, body: &str) -> (u16, Vec<u8>) {
        self.ready().await;
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n",
            self.addr,
            body.len()
        );
        let w = self.stream.get_mut();
        w.write_all(head.as_bytes()).await.expect("write");
        w.write_all(body.as_bytes()).await.expect("write");
        let mut status = 0;
        let mut length = 0;
        let mut close = false;
        let mut line = String::new();
        loop {
            line.clear();
            self.stream.read_line(&mut line).await.expect("read");
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            if let Some(rest) = l.strip_prefix("HTTP/1.1 ") {
                status = rest[..3].parse().unwrap_or(0);
            } else if let Some((name, value)) = l.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                length = value.trim().parse().unwrap_or(0);
            } else if let Some((name, value)) = l.split_once(':')
                && name.eq_ignore_ascii_case("connection")
            {
                close = value.trim().eq_ignore_ascii_case("close");
            }
        }
        let mut body = vec![0; length];
        self.stream.read_exact(&mut body).await.expect("body");
        // The server closes after this answer (a refusal whose body it did not read):
        // the next request goes on a new connection.
        self.closed = close;
        (status, body)
    }

    /// A recall of session `s`; panics unless it is a 200 with memories.
    async fn recall(&mut self, session: usize, query: &str) {
        let body = json!({"query": query, "k": 10}).to_string();
        let (status, answer) = self
            .post(&format!("/v1/sessions/s{session}/recall"), &body)
            .await;
        let shape = serde_json::from_slice::<Recalled>(&answer);
        assert!(
            status == 200 && shape.is_ok_and(|r| !r.memories.is_empty()),
            "{status} {}",
            String::from_utf8_lossy(&answer)
        );
    }
}

/// What a recall answer must hold, checked without building a JSON tree.
#[derive(serde::Deserialize)]
struct Recalled {
    memories: Vec<IgnoredAny>,
}

/// What an ingest answer must hold.
#[derive(serde::Deserialize)]
struct Written {
    ids: Vec<IgnoredAny>,
}

#[tokio::main]
async fn main() {
    let a = args();
    if let Some(addr) = a.target {
        return against(addr, &a).await;
    }
    let dir = tempfile::tempdir().expect("a temporary directory");
    let rt = Runtime::open(config(dir.path(), a.policy.as_ref()))
        .await
        .expect("open the runtime");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("listen");
    let addr = listener.local_addr().expect("an address");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    // Phases 1–3 measure the throughput and latency of admitted work with a fixed set of
    // clients, so none of them may be refused: the admission limits are raised to the
    // client count. Phase 4 is where the default limits are measured.
    let edge = ServerLimits {
        max_recalls: ServerLimits::default().max_recalls.max(a.clients),
        max_writes: ServerLimits::default().max_writes.max(a.clients),
        ..ServerLimits::default()
    };
    let served = tokio::spawn(http::serve(
        listener,
        rt.clone(),
        http::Options {
            auth: Auth::open(),
            server: edge,
            ..http::Options::default()
        },
        async {
            let _ = stopped.await;
        },
    ));
    eprintln!(
        "http_load: {} events in batches of {} from {} clients, then {} recalls, on http://{addr}",
        a.events, a.batch, a.clients, a.recalls
    );

    let batches = a.events.div_ceil(a.batch);
    let next = Arc::new(AtomicUsize::new(0));
    let t0 = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..a.clients {
        let (next, batch, events, sessions) = (next.clone(), a.batch, a.events, a.sessions);
        tasks.spawn(async move {
            let mut client = Client::connect(addr).await;
            let mut lat = Vec::new();
            loop {
                let b = next.fetch_add(1, Ordering::Relaxed);
                if b >= batches {
                    return lat;
                }
                let n = batch.min(events - b * batch);
                let body: Vec<Value> = (0..n)
                    .map(|i| {
                        json!({"kind": "observation",
                               "text": format!("{} (batch {b}, event {i})", TOPICS[(b + i) % TOPICS.len()])})
                    })
                    .collect();
                let body = json!({ "events": body }).to_string();
                let t = Instant::now();
                let (status, answer) = client
                    .post(&format!("/v1/sessions/s{}/events", b % sessions), &body)
                    .await;
                let shape = serde_json::from_slice::<Written>(&answer);
                assert!(
                    status == 201 && shape.is_ok_and(|w| w.ids.len() == n),
                    "{status} {}",
                    String::from_utf8_lossy(&answer)
                );
                lat.push(t.elapsed().as_secs_f64() * 1000.0);
                if b % 100 == 0 {
                    eprintln!(
                        "http_load: {} events, {:.0} events/s",
                        b * batch,
                        (b * batch) as f64 / t0.elapsed().as_secs_f64()
                    );
                }
            }
        });
    }
    let mut write_lat = Vec::new();
    while let Some(t) = tasks.join_next().await {
        write_lat.extend(t.expect("a writer"));
    }
    let ingest_s = t0.elapsed().as_secs_f64();
    write_lat.sort_by(f64::total_cmp);

    // Recall is measured on built indexes: catching up with the burst shares the cores.
    let sub = rt.substrate().clone();
    let t_flush = Instant::now();
    tokio::task::spawn_blocking(move || sub.flush_indexes())
        .await
        .expect("the flush task")
        .expect("the indexes built");
    eprintln!(
        "http_load: indexes built {:.1} s after the last write",
        t_flush.elapsed().as_secs_f64()
    );
    let per_client = a.recalls.div_ceil(a.clients);
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..a.clients {
        let sessions = a.sessions.min(batches);
        tasks.spawn(async move {
            let mut client = Client::connect(addr).await;
            let mut lat = Vec::with_capacity(per_client);
            for i in 0..per_client {
                let t = Instant::now();
                client
                    .recall(
                        (c * 7_919 + i * 31) % sessions,
                        TOPICS[(c + i) % TOPICS.len()],
                    )
                    .await;
                lat.push(t.elapsed().as_secs_f64() * 1000.0);
            }
            lat
        });
    }
    let t1 = Instant::now();
    let mut recall_lat = Vec::new();
    while let Some(t) = tasks.join_next().await {
        recall_lat.extend(t.expect("a reader"));
    }
    let recall_s = t1.elapsed().as_secs_f64();
    recall_lat.sort_by(f64::total_cmp);
    // Recall's reinforcement is committed after the answer: how far behind is it?
    let t_sync = Instant::now();
    rt.substrate()
        .store()
        .sync()
        .await
        .expect("the store syncs");
    let backlog_s = t_sync.elapsed().as_secs_f64();
    eprintln!("http_load: reinforcement writes caught up {backlog_s:.2} s after the last recall");

    let mut paced = Vec::new();
    for &rate in &a.rates {
        let (lat, achieved) =
            paced_recalls(addr, a.clients, a.sessions.min(batches), rate, a.paced_secs).await;
        eprintln!(
            "http_load: paced {rate:.0}/s: achieved {achieved:.0}/s, p50 {:.2} ms, p99 {:.2} ms",
            ms_at(&lat, 0.5),
            ms_at(&lat, 0.99)
        );
        paced.push(format!(
            "{{\"rate\":{rate:.0},\"achieved_per_s\":{achieved:.0},\"p50_ms\":{:.3},\"p99_ms\":{:.3},\"p999_ms\":{:.3},\"max_ms\":{:.3}}}",
            ms_at(&lat, 0.5),
            ms_at(&lat, 0.99),
            ms_at(&lat, 0.999),
            lat.last().copied().unwrap_or(0.0),
        ));
    }

    // Each variant on a fresh runtime loaded alike, so none runs on another's writes: the
    // anchor with limits that never bind, the limits refusing at once (`queue_wait = 0`,
    // admission before requests could wait for a slot), then the default limits.
    let unbounded = ServerLimits {
        max_recalls: 1 << 20,
        max_writes: 1 << 20,
        ..ServerLimits::default()
    };
    let at_once = ServerLimits {
        max_recalls: a.mixed_max_recalls,
        // The limits as they were before requests could wait: 512 writes.
        max_writes: 512,
        queue_wait: Duration::ZERO,
        write_queue_wait: Duration::ZERO,
        ..ServerLimits::default()
    };
    let waiting = ServerLimits {
        max_recalls: a.mixed_max_recalls,
        max_writes: a.mixed_max_writes,
        queue_wait: Duration::from_millis(a.mixed_queue_wait),
        write_queue_wait: Duration::from_millis(a.mixed_write_wait),
        ..ServerLimits::default()
    };
    let variants: Vec<(&str, ServerLimits)> = [
        ("off", unbounded),
        ("at_once", at_once),
        ("queue", waiting.clone()),
    ]
    .into_iter()
    .filter(|(name, _)| a.mixed_variants.iter().any(|v| v == name))
    .collect();
    let mut mixed = Vec::new();
    if a.paced_mixed > 0.0 {
        let secs = a.mixed_secs.max(10.0);
        let pace = Some(a.paced_mixed);
        let clients = a.paced_mixed_clients;
        for (name, edge) in variants.iter().filter(|(name, _)| *name != "off") {
            let m = mixed_phase(edge.clone(), a.policy.as_ref(), clients, secs, pace, 0).await;
            eprintln!(
                "http_load: paced mixed {:.0}/s, admission {name}: {}",
                a.paced_mixed,
                m.line()
            );
            mixed.push(m.json(("paced_admission", name)));
        }
        if a.idle > 0 {
            let edge = waiting.clone();
            let m = mixed_phase(edge, a.policy.as_ref(), clients, secs, pace, a.idle).await;
            eprintln!(
                "http_load: paced mixed {:.0}/s beside {} idle connections: {}",
                a.paced_mixed,
                a.idle,
                m.line()
            );
            mixed.push(m.json(("paced_idle", &a.idle.to_string())));
        }
    }
    if a.mixed_secs > 0.0 {
        for (name, edge) in variants.iter().cloned() {
            let m = mixed_phase(
                edge,
                a.policy.as_ref(),
                a.mixed_clients,
                a.mixed_secs,
                None,
                0,
            )
            .await;
            eprintln!("http_load: mixed, admission {name}: {}", m.line());
            mixed.push(m.json(("admission", name)));
        }
    }

    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(120), served)
        .await
        .expect("the server drains")
        .expect("the server task")
        .expect("a clean shutdown");
    println!(
        "{{\"clients\":{},\"sessions\":{},\"events\":{},\"batch\":{},\"events_per_s\":{:.0},\"batch_p50_ms\":{:.2},\"batch_p99_ms\":{:.2},\"recalls\":{},\"recalls_per_s\":{:.0},\"recall_p50_ms\":{:.3},\"recall_p99_ms\":{:.3},\"reinforcement_backlog_s\":{:.2},\"paced\":[{}],\"mixed\":[{}]}}",
        a.clients,
        a.sessions,
        a.events,
        a.batch,
        a.events as f64 / ingest_s,
        ms_at(&write_lat, 0.5),
        ms_at(&write_lat, 0.99),
        recall_lat.len(),
        recall_lat.len() as f64 / recall_s,
        ms_at(&recall_lat, 0.5),
        ms_at(&recall_lat, 0.99),
        backlog_s,
        paced.join(","),
        mixed.join(","),
    );
}

/// `--target`: the mixed load against a server in another process (the release binary, as
/// an operator runs it), after loading it as [`mixed_phase`] loads its own, over HTTP.
async fn against(addr: SocketAddr, a: &Args) {
    if let Err(e) = TcpStream::connect(addr).await {
        eprintln!(
            "http_load: cannot reach {addr} ({e}); start the server first, e.g. \
             `shadowbrain serve --addr {addr} --data /tmp/load`"
        );
        std::process::exit(2);
    }
    preload(addr).await;
    let secs = if a.mixed_secs > 0.0 {
        a.mixed_secs
    } else {
        20.0
    };
    let pace = (a.paced_mixed > 0.0).then_some(a.paced_mixed);
    let clients = if pace.is_some() {
        a.paced_mixed_clients
    } else {
        a.mixed_clients
    };
    let held = hold_idle(addr, a.idle).await;
    let m = mixed_load(addr, clients, secs, pace).await;
    drop(held);
    eprintln!("http_load: mixed, against {addr}: {}", m.line());
    println!("{}", m.json(("target", &addr.to_string())));
}

/// What one mixed phase measured.
struct Mixed {
    secs: f64,
    events: usize,
    writes: Vec<f64>,
    recalls: Vec<f64>,
    /// Recall p99 in each third of the phase: flat if recall cost does not grow with the
    /// store, which grows by the writes of the phase.
    recall_thirds: [f64; 3],
    /// The probe's recall p99 in each third (see [`PROBES`]), and how many it sent.
    probe_thirds: [f64; 3],
    probes: usize,
    refused: Vec<f64>,
}

impl Mixed {
    fn line(&self) -> String {
        format!(
            "{:.0} events/s, write p99 {:.0} ms, {:.0} recalls/s, recall p50 {:.1} ms p99 {:.1} ms \
             max {:.0} ms (p99 by third {:.0} / {:.0} / {:.0} ms; a fixed scope's {:.0} / {:.0} / \
             {:.0} ms), {} refused (p50 {:.2} ms, p99 {:.2} ms)",
            self.events as f64 / self.secs,
            ms_at(&self.writes, 0.99),
            self.recalls.len() as f64 / self.secs,
            ms_at(&self.recalls, 0.5),
            ms_at(&self.recalls, 0.99),
            self.recalls.last().copied().unwrap_or(0.0),
            self.recall_thirds[0],
            self.recall_thirds[1],
            self.recall_thirds[2],
            self.probe_thirds[0],
            self.probe_thirds[1],
            self.probe_thirds[2],
            self.refused.len(),
            ms_at(&self.refused, 0.5),
            ms_at(&self.refused, 0.99),
        )
    }

    /// The same figures as [`Mixed::line`], with `tag` (what was measured) first.
    fn json(&self, tag: (&str, &str)) -> String {
        let ms = |v: f64| (v * 1000.0).round() / 1000.0;
        let p = |v: &[f64], q: f64| ms(ms_at(v, q));
        json!({
            tag.0: tag.1,
            "events_per_s": (self.events as f64 / self.secs).round(),
            "write_p50_ms": p(&self.writes, 0.5),
            "write_p99_ms": p(&self.writes, 0.99),
            "recalls_per_s": (self.recalls.len() as f64 / self.secs).round(),
            "recall_p50_ms": p(&self.recalls, 0.5),
            "recall_p99_ms": p(&self.recalls, 0.99),
            "recall_max_ms": ms(self.recalls.last().copied().unwrap_or(0.0)),
            "recall_p99_by_third_ms": self.recall_thirds.map(ms),
            "probe_p99_by_third_ms": self.probe_thirds.map(ms),
            "probes": self.probes,
            "refused": self.refused.len(),
            "refused_p50_ms": p(&self.refused, 0.5),
            "refused_p99_ms": p(&self.refused, 0.99),
        })
        .to_string()
    }
}

/// The events each mixed phase's server holds before its clients start: 20 in each of the
/// 2,000 sessions the clients write to and recall from, and in each of the [`PROBES`].
const MIXED_PRELOAD: usize = 20 * (2_000 + PROBES);

/// Sessions `p0…` that only the probe recalls from and nobody writes to: their recalls'
/// latency shows what a recall of a fixed scope costs while the store grows around it.
const PROBES: usize = 100;

/// Loads [`MIXED_PRELOAD`] events into the server at `addr`, over HTTP.
async fn preload(addr: SocketAddr) {
    eprintln!("http_load: loading {MIXED_PRELOAD} events into http://{addr}");
    let mut client = Client::connect(addr).await;
    let sessions = (0..2_000)
        .map(|s| format!("m{s}"))
        .chain((0..PROBES).map(|s| format!("p{s}")));
    for (s, session) in sessions.enumerate() {
        let events: Vec<Value> = (0..20)
            .map(|i| {
                json!({"kind": "observation",
                            "text": format!("{} (preload {i})", TOPICS[(s + i) % TOPICS.len()])})
            })
            .collect();
        let (status, answer) = client
            .post(
                &format!("/v1/sessions/{session}/events"),
                &json!({ "events": events }).to_string(),
            )
            .await;
        assert!(
            status == 201,
            "{status} {}",
            String::from_utf8_lossy(&answer)
        );
    }
}

/// The in-process runtime's configuration: the defaults, on `policy` when one is given.
fn config(dir: &std::path::Path, policy: Option<&Policy>) -> RuntimeConfig {
    let mut config = RuntimeConfig::new(dir);
    if let Some(policy) = policy {
        config.substrate.policy = policy.clone();
    }
    config
}

/// One mixed phase: a fresh runtime with [`MIXED_PRELOAD`] events, served with `edge`, and
/// [`mixed_load`] against it.
async fn mixed_phase(
    edge: ServerLimits,
    policy: Option<&Policy>,
    clients: usize,
    secs: f64,
    pace: Option<f64>,
    idle: usize,
) -> Mixed {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let rt = Runtime::open(config(dir.path(), policy))
        .await
        .expect("open the runtime");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("listen");
    let addr = listener.local_addr().expect("an address");
    // Served as `serve` serves: the connections on a thread of their own, the answers on
    // this runtime.
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(http::serve(
        listener,
        rt,
        http::Options {
            auth: Auth::open(),
            server: edge,
            ..http::Options::default()
        },
        async {
            let _ = stopped.await;
        },
    ));
    preload(addr).await;
    let held = hold_idle(addr, idle).await;
    // The clients run on a runtime of their own, as separate processes would: sharing the
    // server's workers, their own scheduling would be counted as the server's latency.
    let m = tokio::task::spawn_blocking(move || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("mixed-client")
            .enable_all()
            .build()
            .expect("the clients' runtime")
            .block_on(mixed_load(addr, clients, secs, pace))
    })
    .await
    .expect("the mixed clients");
    drop(held);
    let _ = stop.send(());
    served
        .await
        .expect("the server task")
        .expect("a clean shutdown");
    m
}

/// `clients` keep-alive clients, for `secs`: each in turn writes 1–50 events to one of
/// 2,000 sessions or recalls in one, half and half (a fixed pseudo-random sequence per
/// client). A 503 is counted as refused and the client waits what the answer asks
/// (`retry_after_ms` when the body has it, else `Retry-After`).
///
/// Paced (`pace`: requests per second over all clients), each client sends on its own
/// schedule, writes of 1–10 events, and a latency counts from when its request was due.
async fn mixed_load(addr: SocketAddr, clients: usize, secs: f64, pace: Option<f64>) -> Mixed {
    let begin = Instant::now();
    let end = begin + Duration::from_secs_f64(secs);
    let interval = pace.map(|rate| Duration::from_secs_f64(clients as f64 / rate));
    let max_events = if pace.is_some() { 10 } else { 50 };
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..clients {
        let first = pace.map(|rate| begin + Duration::from_secs_f64(c as f64 / rate));
        tasks.spawn(async move {
            let mut sent = 0u32;
            let mut client = Client::connect(addr).await;
            let mut state = 0x9e37_79b9_7f4a_7c15u64 ^ (c as u64 + 1);
            let mut next = move || {
                // xorshift64: the same sequence every run.
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state
            };
            let (mut events, mut writes, mut recalls, mut refused) = (0, vec![], vec![], vec![]);
            while Instant::now() < end {
                let session = next() % 2_000;
                let write = next() % 2 == 0;
                // The request is built before its clock starts: the client's own work is
                // not the server's latency.
                let (path, body, n) = if write {
                    let n = 1 + (next() % max_events) as usize;
                    let body: Vec<Value> = (0..n)
                        .map(|i| {
                            let topic = TOPICS[(next() as usize) % TOPICS.len()];
                            json!({"kind": "observation",
                                   "text": format!("{topic} (client {c}, event {i})")})
                        })
                        .collect();
                    let body = json!({ "events": body }).to_string();
                    (format!("/v1/sessions/m{session}/events"), body, n)
                } else {
                    let query = TOPICS[(next() as usize) % TOPICS.len()];
                    let body = json!({"query": query, "k": 10}).to_string();
                    (format!("/v1/sessions/m{session}/recall"), body, 0)
                };
                client.ready().await;
                let mut t = Instant::now();
                if let (Some(first), Some(interval)) = (first, interval) {
                    let due = first + interval * sent;
                    sent += 1;
                    if due >= end {
                        break;
                    }
                    // Behind (the last answer came late): counted from when it was due.
                    let behind = t > due;
                    tokio::time::sleep_until(due.into()).await;
                    t = if behind { due } else { Instant::now() };
                }
                let (status, answer) = client.post(&path, &body).await;
                if write && status == 201 {
                    events += n;
                }
                let ms = t.elapsed().as_secs_f64() * 1000.0;
                if let Some(&slow) = SLOW_MS.get()
                    && (ms > slow || status == 503)
                {
                    log_slow(t, write, status, ms, &answer);
                }
                match status {
                    201 if write => writes.push(ms),
                    200 if !write => recalls.push((third(begin, t, secs), ms)),
                    503 => {
                        refused.push(ms);
                        tokio::time::sleep(retry_after(&answer)).await;
                    }
                    other => panic!("{other} {}", String::from_utf8_lossy(&answer)),
                }
            }
            (events, writes, recalls, refused)
        });
    }
    // The probe: every 50 ms a recall from a session nobody writes to.
    let probe = tokio::spawn(async move {
        let mut client = Client::connect(addr).await;
        let mut timed = Vec::new();
        let mut n = 0usize;
        while Instant::now() < end {
            let body = json!({"query": TOPICS[n % TOPICS.len()], "k": 10}).to_string();
            let path = format!("/v1/sessions/p{}/recall", n % PROBES);
            n += 1;
            client.ready().await;
            let t = Instant::now();
            let (status, answer) = client.post(&path, &body).await;
            let ms = t.elapsed().as_secs_f64() * 1000.0;
            match status {
                200 => timed.push((third(begin, t, secs), ms)),
                503 => {}
                other => panic!("probe: {other} {}", String::from_utf8_lossy(&answer)),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        (n, timed)
    });
    let t0 = Instant::now();
    let mut m = Mixed {
        secs: 0.0,
        events: 0,
        writes: Vec::new(),
        recalls: Vec::new(),
        recall_thirds: [0.0; 3],
        probe_thirds: [0.0; 3],
        probes: 0,
        refused: Vec::new(),
    };
    let mut timed_recalls = Vec::new();
    while let Some(t) = tasks.join_next().await {
        let (events, writes, recalls, refused) = t.expect("a mixed client");
        m.events += events;
        m.writes.extend(writes);
        m.recalls.extend(recalls.iter().map(|&(_, ms)| ms));
        timed_recalls.extend(recalls);
        m.refused.extend(refused);
    }
    let (probes, timed_probes) = probe.await.expect("the probe");
    m.probes = probes;
    m.recall_thirds = p99_by_third(timed_recalls);
    m.probe_thirds = p99_by_third(timed_probes);
    m.secs = t0.elapsed().as_secs_f64();
    for v in [&mut m.writes, &mut m.recalls, &mut m.refused] {
        v.sort_by(f64::total_cmp);
    }
    m
}

/// `n` keep-alive connections, each answered once (`GET /healthz`) and then silent, as an
/// agent fleet's idle connection pools are.
async fn hold_idle(addr: SocketAddr, n: usize) -> Vec<Client> {
    let mut held = Vec::with_capacity(n);
    for _ in 0..n {
        let mut client = Client::connect(addr).await;
        let head = format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\n\r\n");
        let w = client.stream.get_mut();
        w.write_all(head.as_bytes()).await.expect("write");
        // A connection the server closed to make room for a later one may go unanswered.
        let mut buf = [0u8; 256];
        let _ = tokio::time::timeout(Duration::from_millis(50), client.stream.read(&mut buf)).await;
        held.push(client);
    }
    if n > 0 {
        eprintln!("http_load: holding {n} idle keep-alive connections");
    }
    held
}

/// How long a refused client waits: the expected wait the body gives in milliseconds, or
/// a second (what `Retry-After` says when the body does not).
fn retry_after(answer: &[u8]) -> Duration {
    #[derive(serde::Deserialize)]
    struct Refusal {
        error: Detail,
    }
    #[derive(serde::Deserialize)]
    struct Detail {
        retry_after_ms: Option<u64>,
    }
    serde_json::from_slice::<Refusal>(answer)
        .ok()
        .and_then(|r| r.error.retry_after_ms)
        .map_or(Duration::from_secs(1), Duration::from_millis)
}

/// Which third (0, 1, 2) of a phase of `secs` begun at `begin` the instant `t` falls in.
fn third(begin: Instant, t: Instant, secs: f64) -> usize {
    ((t.duration_since(begin).as_secs_f64() * 3.0 / secs) as usize).min(2)
}

/// The p99 of each third, from latencies tagged with their [`third`].
fn p99_by_third(timed: Vec<(usize, f64)>) -> [f64; 3] {
    let mut thirds = [vec![], vec![], vec![]];
    for (third, ms) in timed {
        thirds[third].push(ms);
    }
    thirds.map(|mut third| {
        third.sort_by(f64::total_cmp);
        ms_at(&third, 0.99)
    })
}

/// `clients` connections send recalls together at `rate` per second for `secs`: client `c`
/// is due every `clients / rate` seconds, offset by `c / rate` so the arrivals interleave.
/// Latency counts from when each request was due if the client was already behind (the
/// last answer came late), else from when it was sent. Returns the sorted latencies (ms) and
/// the rate achieved.
async fn paced_recalls(
    addr: SocketAddr,
    clients: usize,
    sessions: usize,
    rate: f64,
    secs: f64,
) -> (Vec<f64>, f64) {
    let interval = Duration::from_secs_f64(clients as f64 / rate);
    let per_client = ((secs * rate) / clients as f64).ceil().max(1.0) as usize;
    let start = Instant::now() + Duration::from_millis(200);
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..clients {
        tasks.spawn(async move {
            let mut client = Client::connect(addr).await;
            let first = start + Duration::from_secs_f64(c as f64 / rate);
            let mut lat = Vec::with_capacity(per_client);
            for i in 0..per_client {
                let due = first + interval * i as u32;
                // Late because the last answer was late: count from when it was due.
                // Late because the timer wheel ticks in milliseconds: that is this
                // client's slack, not the server's, so count from the send.
                let behind = Instant::now() > due;
                tokio::time::sleep_until(due.into()).await;
                let from = if behind { due } else { Instant::now() };
                client
                    .recall(
                        (c * 7_919 + i * 31) % sessions,
                        TOPICS[(c + i) % TOPICS.len()],
                    )
                    .await;
                lat.push(from.elapsed().as_secs_f64() * 1000.0);
            }
            lat
        });
    }
    let mut lat = Vec::new();
    while let Some(t) = tasks.join_next().await {
        lat.extend(t.expect("a paced reader"));
    }
    let took = start.elapsed().as_secs_f64();
    lat.sort_by(f64::total_cmp);
    let achieved = lat.len() as f64 / took;
    (lat, achieved)
}
