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
//! Then both indexes are flushed (built). Phase 2: `--recalls` session-scoped recalls (`POST /v1/sessions/{id}/recall`) spread over
//! the clients. Prints progress on stderr and, last, one JSON line.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use shadowbrain::server::{self, Auth, Limits};
use shadowbrain::{Runtime, RuntimeConfig};
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

struct Args {
    clients: usize,
    sessions: usize,
    events: usize,
    batch: usize,
    recalls: usize,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        clients: 32,
        sessions: 1_000,
        events: 100_000,
        batch: 100,
        recalls: 2_000,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || -> Result<usize, String> {
            it.next()
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| format!("{flag} needs a positive number"))
        };
        match flag.as_str() {
            "--clients" => a.clients = value()?.max(1),
            "--sessions" => a.sessions = value()?.max(1),
            "--events" => a.events = value()?,
            "--batch" => a.batch = value()?.clamp(1, 1000),
            "--recalls" => a.recalls = value()?,
            other => {
                return Err(format!(
                    "unknown flag {other}; use --clients, --sessions, --events, --batch, --recalls"
                ));
            }
        }
    }
    Ok(a)
}

/// One keep-alive HTTP/1.1 connection: a request, then its status and JSON body.
struct Client {
    stream: BufReader<TcpStream>,
    addr: SocketAddr,
}

impl Client {
    async fn connect(addr: SocketAddr) -> Client {
        let stream = TcpStream::connect(addr).await.expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        Client {
            stream: BufReader::new(stream),
            addr,
        }
    }

    async fn post(&mut self, path: &str, body: &str) -> (u16, Value) {
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
            }
        }
        let mut body = vec![0; length];
        self.stream.read_exact(&mut body).await.expect("body");
        (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

#[tokio::main]
async fn main() {
    let a = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("http_load: {e}");
            std::process::exit(2);
        }
    };
    let dir = tempfile::tempdir().expect("a temporary directory");
    let rt = Runtime::open(RuntimeConfig::new(dir.path()))
        .await
        .expect("open the runtime");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("listen");
    let addr = listener.local_addr().expect("an address");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(server::serve(
        listener,
        rt.clone(),
        Limits::default(),
        Auth::open(),
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
                assert_eq!(status, 201, "{answer}");
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
                let body = json!({"query": TOPICS[(c + i) % TOPICS.len()], "k": 10}).to_string();
                let t = Instant::now();
                let (status, answer) = client
                    .post(
                        &format!("/v1/sessions/s{}/recall", (c * 7_919 + i * 31) % sessions),
                        &body,
                    )
                    .await;
                assert_eq!(status, 200, "{answer}");
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

    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(120), served)
        .await
        .expect("the server drains")
        .expect("the server task")
        .expect("a clean shutdown");
    println!(
        "{{\"clients\":{},\"sessions\":{},\"events\":{},\"batch\":{},\"events_per_s\":{:.0},\"batch_p50_ms\":{:.2},\"batch_p99_ms\":{:.2},\"recalls\":{},\"recalls_per_s\":{:.0},\"recall_p50_ms\":{:.3},\"recall_p99_ms\":{:.3}}}",
        a.clients,
        a.sessions,
        a.events,
        a.batch,
        a.events as f64 / ingest_s,
        percentile(&write_lat, 0.5),
        percentile(&write_lat, 0.99),
        recall_lat.len(),
        recall_lat.len() as f64 / recall_s,
        percentile(&recall_lat, 0.5),
        percentile(&recall_lat, 0.99),
    );
}
