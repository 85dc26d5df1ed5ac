//! The cluster harness (README "Cluster"): three real NATS servers (JetStream, file
//! storage, `sync_interval: always`) and three `shadowbrain serve --cluster` nodes on
//! 127.0.0.1, a fixed load of writers that record every acknowledgement, a fault, and the
//! checks that must hold after it:
//!
//! - every acknowledged event is present exactly once, and each session's events are in
//!   the order they were sent;
//! - the epochs stamped on each partition's log never go backwards;
//! - every session accepts writes again within 15 s of the fault.
//!
//! Scenarios: 1 `kill -9` of the node owning most partitions; 2 `kill -9` of the NATS
//! server leading most streams; 3 `SIGSTOP` of an owner for twice the lease TTL, then
//! `SIGCONT` (the paused node must not write). CI runs each once (the README's test
//! command); `SHADOWBRAIN_CLUSTER_RUNS=20 cargo test --release --test tests cluster::`
//! repeats them. Needs the NATS server of `scripts/install-nats-server`; without it the
//! test says it was skipped (and fails under `SHADOWBRAIN_REQUIRE_NATS=1`, as in CI).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::Value;

use crate::server::sha256_hex;

const NODES: usize = 3;
const PARTITIONS: u16 = 8;
const LEASE_TTL: Duration = Duration::from_secs(3);
/// Writers, each its own session, spread over namespaces (so over partitions).
const WRITERS: usize = 8;
/// Each writer's pace: about 160 acknowledged events a second in all, a small fixed load
/// on two cores that six processes share, so CPU saturation does not hide a failover.
const PACE: Duration = Duration::from_millis(50);
/// Every session must accept writes again within this long of a fault.
const RECOVERY_LIMIT: Duration = Duration::from_secs(15);

fn nats_server() -> Option<PathBuf> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/nats-venv/bin/nats-server");
    if path.is_file() {
        return Some(path);
    }
    if std::env::var_os("SHADOWBRAIN_REQUIRE_NATS").is_some() {
        panic!(
            "SHADOWBRAIN_REQUIRE_NATS is set but {} is missing; run scripts/install-nats-server",
            path.display()
        );
    }
    eprintln!("skipped: the cluster harness needs the NATS server (scripts/install-nats-server)");
    None
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Nats {
    name: String,
    port: u16,
    conf: PathBuf,
    child: Option<Child>,
}

struct NodeProc {
    name: String,
    addr: SocketAddr,
    data: PathBuf,
    config: PathBuf,
    child: Option<Child>,
}

/// The namespaces the writers use, and their API keys (`[[auth.keys]]`), plus an admin.
fn keys() -> Vec<(String, String)> {
    (0..WRITERS)
        .map(|i| (format!("tenant-{i}"), format!("key-of-tenant-{i}")))
        .collect()
}
const ADMIN: &str = "the-admin-key";

struct Harness {
    dir: tempfile::TempDir,
    bin: PathBuf,
    nats: Vec<Nats>,
    nodes: Vec<NodeProc>,
}

impl Harness {
    fn start(nats_bin: &Path) -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let routes: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let route_list = routes
            .iter()
            .map(|p| format!("nats://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(", ");
        let mut nats = Vec::new();
        for (i, route) in routes.iter().enumerate() {
            let port = free_port();
            let name = format!("nats{i}");
            let conf = dir.path().join(format!("{name}.conf"));
            // Pings every second, two missed: a paused client's subscriptions go within
            // seconds, not the default two minutes.
            std::fs::write(
                &conf,
                format!(
                    "server_name: {name}\nlisten: 127.0.0.1:{port}\nmax_payload: 8MB\n\
                     ping_interval: \"1s\"\nping_max: 2\n\
                     jetstream {{ store_dir: \"{}\", sync_interval: always }}\n\
                     cluster {{ name: sb, listen: 127.0.0.1:{route}, routes: [{route_list}] }}\n",
                    dir.path().join(&name).display()
                ),
            )
            .unwrap();
            nats.push(Nats {
                name,
                port,
                conf,
                child: None,
            });
        }
        let urls = nats
            .iter()
            .map(|n| format!("\"nats://127.0.0.1:{}\"", n.port))
            .collect::<Vec<_>>()
            .join(", ");
        let mut auth = String::new();
        for (ns, key) in keys() {
            auth.push_str(&format!(
                "[[auth.keys]]\nsha256 = \"{}\"\nnamespace = \"{ns}\"\n",
                sha256_hex(&key)
            ));
        }
        auth.push_str(&format!(
            "[[auth.keys]]\nsha256 = \"{}\"\nnamespace = \"ops\"\nrole = \"admin\"\n",
            sha256_hex(ADMIN)
        ));
        let mut nodes = Vec::new();
        for i in 0..NODES {
            let name = format!("node{i}");
            let config = dir.path().join(format!("{name}.toml"));
            std::fs::write(
                &config,
                format!(
                    "[embedder]\nkind = \"hash\"\n\n{auth}\n[cluster]\nurls = [{urls}]\n\
                     node = \"{name}\"\npartitions = {PARTITIONS}\nlease_ttl = \"{}s\"\n",
                    LEASE_TTL.as_secs()
                ),
            )
            .unwrap();
            nodes.push(NodeProc {
                addr: format!("127.0.0.1:{}", free_port()).parse().unwrap(),
                data: dir.path().join(&name),
                name,
                config,
                child: None,
            });
        }
        let mut h = Harness {
            dir,
            bin: PathBuf::from(env!("CARGO_BIN_EXE_shadowbrain")),
            nats,
            nodes,
        };
        for i in 0..3 {
            h.start_nats(i, nats_bin);
        }
        for i in 0..NODES {
            h.start_node(i);
        }
        h.wait_settled(Duration::from_secs(90));
        h
    }

    fn start_nats(&mut self, i: usize, bin: &Path) {
        let log = std::fs::File::create(self.dir.path().join(format!("{}.log", self.nats[i].name)))
            .unwrap();
        let child = Command::new(bin)
            .arg("-c")
            .arg(&self.nats[i].conf)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("nats-server starts");
        self.nats[i].child = Some(child);
    }

    fn start_node(&mut self, i: usize) {
        let n = &mut self.nodes[i];
        let log = std::fs::File::options()
            .create(true)
            .append(true)
            .open(self.dir.path().join(format!("{}.log", n.name)))
            .unwrap();
        let child = Command::new(&self.bin)
            .args([
                "serve",
                "--cluster",
                "--addr",
                &n.addr.to_string(),
                "--data",
            ])
            .arg(&n.data)
            .arg("--config")
            .arg(&n.config)
            .env("RUST_LOG", "info,async_nats=warn")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("the node starts");
        n.child = Some(child);
    }

    fn signal(&mut self, pid: u32, signal: &str) {
        let ok = Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {signal} {pid}");
    }

    fn kill_node(&mut self, i: usize) {
        let mut child = self.nodes[i].child.take().unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
    }

    fn kill_nats(&mut self, i: usize) {
        let mut child = self.nats[i].child.take().unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
    }

    fn node_pid(&self, i: usize) -> u32 {
        self.nodes[i].child.as_ref().unwrap().id()
    }

    fn alive_nodes(&self) -> Vec<SocketAddr> {
        self.nodes
            .iter()
            .filter(|n| n.child.is_some())
            .map(|n| n.addr)
            .collect()
    }

    /// Each node's `/cluster` view (`None`: not answering).
    fn status(&self, i: usize) -> Option<Value> {
        let (code, body, _) = request(
            self.nodes[i].addr,
            "GET",
            "/cluster",
            Some(ADMIN),
            None,
            None,
        )
        .ok()?;
        (code == 200).then_some(body)
    }

    /// Partitions each node owns.
    fn owned(&self) -> Vec<usize> {
        (0..NODES)
            .map(|i| {
                self.status(i).map_or(0, |s| {
                    s["partitions"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .filter(|p| p["role"] == "owner")
                        .count()
                })
            })
            .collect()
    }

    /// Until every partition has exactly one owner among the live nodes.
    fn wait_settled(&self, limit: Duration) {
        let until = Instant::now() + limit;
        loop {
            let owned = self.owned();
            if owned.iter().sum::<usize>() == PARTITIONS as usize {
                return;
            }
            assert!(
                Instant::now() < until,
                "the partitions did not settle: owned per node {owned:?}; logs in {}",
                self.dir.path().display()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn nats_urls(&self) -> Vec<String> {
        self.nats
            .iter()
            .filter(|n| n.child.is_some())
            .map(|n| format!("nats://127.0.0.1:{}", n.port))
            .collect()
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        for n in &mut self.nodes {
            if let Some(c) = &mut n.child {
                let _ = Command::new("kill")
                    .args(["-CONT", &c.id().to_string()])
                    .status();
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        for n in &mut self.nats {
            if let Some(c) = &mut n.child {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        if std::thread::panicking() {
            // Keep the logs of a failed run.
            let kept = self.dir.path().to_path_buf();
            let _ = std::mem::replace(&mut self.dir, tempfile::tempdir().unwrap()).keep();
            eprintln!("the cluster's logs and data are kept in {}", kept.display());
        }
    }
}

/// One HTTP/1.1 exchange with optional key, body and idempotency key: status, JSON body,
/// and the node that answered (`x-shadowbrain-node`).
fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    key: Option<&str>,
    body: Option<&str>,
    idempotency: Option<&str>,
) -> std::io::Result<(u16, Value, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(20)))?;
    let body = body.unwrap_or("");
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    if let Some(k) = key {
        head.push_str(&format!("Authorization: Bearer {k}\r\n"));
    }
    if let Some(k) = idempotency {
        head.push_str(&format!("Idempotency-Key: {k}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    stream.write_all(body.as_bytes())?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    let (head, rest) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("not an HTTP answer"))?;
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other("no status"))?;
    let node = head
        .lines()
        .find_map(|l| l.strip_prefix("x-shadowbrain-node: "))
        .unwrap_or("")
        .to_string();
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    let body = if chunked {
        dechunk(rest)
    } else {
        rest.to_string()
    };
    Ok((
        code,
        serde_json::from_str(&body).unwrap_or(Value::Null),
        node,
    ))
}

fn dechunk(mut rest: &str) -> String {
    let mut out = String::new();
    while let Some((size, after)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || after.len() < n {
            break;
        }
        out.push_str(&after[..n]);
        rest = after[n..].trim_start_matches("\r\n");
    }
    out
}

/// What one writer saw.
#[derive(Debug, Default)]
struct Written {
    key: String,
    session: String,
    /// Sequence numbers acknowledged (201), in order.
    acked: Vec<u64>,
    /// Acknowledgement latencies of first attempts that succeeded.
    latencies: Vec<Duration>,
    /// The longest time from a write's first attempt to its acknowledgement.
    longest_wait: Duration,
}

/// Writers, each a session of its own in a namespace of its own, sending one event every
/// `PACE` to the live nodes in turn, each under an Idempotency-Key and retried (on
/// another node) until acknowledged.
fn load(
    nodes: Arc<Mutex<Vec<SocketAddr>>>,
    stop: Arc<AtomicBool>,
) -> Vec<std::thread::JoinHandle<Written>> {
    keys()
        .into_iter()
        .enumerate()
        .map(|(w, (_, key))| {
            let (nodes, stop) = (nodes.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut out = Written {
                    session: format!("writer-{w}"),
                    key,
                    ..Written::default()
                };
                let mut seq = 0u64;
                let mut attempt = w;
                while !stop.load(Ordering::SeqCst) {
                    let first = Instant::now();
                    let body = format!(
                        "{{\"events\":[{{\"kind\":\"observation\",\"text\":\"{} event {seq}\"}}]}}",
                        out.session
                    );
                    let idem = format!("{}-{seq}", out.session);
                    let mut tries = 0;
                    loop {
                        let addr = {
                            let live = nodes.lock().unwrap();
                            live[attempt % live.len()]
                        };
                        attempt += 1;
                        let path = format!("/v1/sessions/{}/events", out.session);
                        match request(
                            addr,
                            "POST",
                            &path,
                            Some(&out.key),
                            Some(&body),
                            Some(&idem),
                        ) {
                            Ok((201, _, _)) => break,
                            _ => {
                                tries += 1;
                                std::thread::sleep(Duration::from_millis(100));
                            }
                        }
                        if first.elapsed() > Duration::from_secs(120) {
                            panic!("{} could not write event {seq} for 120 s", out.session);
                        }
                    }
                    let took = first.elapsed();
                    if tries == 0 {
                        out.latencies.push(took);
                    }
                    out.longest_wait = out.longest_wait.max(took);
                    out.acked.push(seq);
                    seq += 1;
                    std::thread::sleep(PACE.saturating_sub(took));
                }
                out
            })
        })
        .collect()
}

/// The sequence numbers of a session's events as stored, oldest first.
fn stored(h: &Harness, w: &Written) -> Vec<u64> {
    for addr in h.alive_nodes() {
        let path = format!("/v1/sessions/{}/timeline?limit=1000", w.session);
        if let Ok((200, body, _)) = request(addr, "GET", &path, Some(&w.key), None, None) {
            // The events only: condensed records (every 50 events) quote some of them.
            let mut seqs: Vec<u64> = body["items"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|m| m["tier"] == "episodic")
                .map(|m| {
                    m["text"]
                        .as_str()
                        .unwrap()
                        .rsplit(' ')
                        .next()
                        .unwrap()
                        .parse()
                        .unwrap()
                })
                .collect();
            seqs.reverse();
            return seqs;
        }
    }
    panic!("no node answered the timeline of {}", w.session);
}

/// Every partition's log: (entries, whether its epochs never went backwards, the first
/// place they did).
async fn epochs(urls: &[String], partitions: u16) -> BTreeMap<u16, (u64, Option<String>)> {
    let addrs: Vec<async_nats::ServerAddr> = urls.iter().map(|u| u.parse().unwrap()).collect();
    let client = async_nats::connect(addrs).await.unwrap();
    let js = async_nats::jetstream::new(client);
    let mut out = BTreeMap::new();
    for p in 0..partitions {
        let mut stream = js.get_stream(format!("SB_P{p:03}")).await.unwrap();
        let end = stream.info().await.unwrap().state.last_sequence;
        let mut backwards = None;
        if end > 0 {
            let consumer = stream
                .create_consumer(async_nats::jetstream::consumer::pull::OrderedConfig::default())
                .await
                .unwrap();
            let mut messages = consumer.messages().await.unwrap();
            let mut last_epoch = 0u64;
            while let Some(m) = messages.next().await {
                let m = m.unwrap();
                let seq = m.info().unwrap().stream_sequence;
                let epoch: u64 = m
                    .headers
                    .as_ref()
                    .and_then(|h| h.get("Sb-Epoch"))
                    .map(|v| v.as_str().parse().unwrap())
                    .expect("every entry carries its epoch");
                if epoch < last_epoch && backwards.is_none() {
                    backwards = Some(format!("entry {seq}: epoch {epoch} after {last_epoch}"));
                }
                last_epoch = last_epoch.max(epoch);
                if seq >= end {
                    break;
                }
            }
        }
        out.insert(p, (end, backwards));
    }
    out
}

#[derive(Debug, Clone, Copy)]
enum Scenario {
    KillOwner,
    KillStreamLeader,
    PauseOwner,
}

/// The NATS server leading most partition streams.
async fn busiest_leader(urls: &[String]) -> String {
    let addrs: Vec<async_nats::ServerAddr> = urls.iter().map(|u| u.parse().unwrap()).collect();
    let js = async_nats::jetstream::new(async_nats::connect(addrs).await.unwrap());
    let mut count: BTreeMap<String, usize> = BTreeMap::new();
    for p in 0..PARTITIONS {
        let mut s = js.get_stream(format!("SB_P{p:03}")).await.unwrap();
        let info = s.info().await.unwrap();
        if let Some(leader) = info.cluster.as_ref().and_then(|c| c.leader.clone()) {
            *count.entry(leader).or_default() += 1;
        }
    }
    count.into_iter().max_by_key(|(_, n)| *n).unwrap().0
}

fn run(nats_bin: &Path, scenario: Scenario, tokio: &tokio::runtime::Runtime) {
    let mut h = Harness::start(nats_bin);
    let live = Arc::new(Mutex::new(h.alive_nodes()));
    let stop = Arc::new(AtomicBool::new(false));
    let writers = load(live.clone(), stop.clone());
    std::thread::sleep(Duration::from_secs(3));
    let owned = h.owned();
    let busiest = (0..NODES).max_by_key(|i| owned[*i]).unwrap();
    let fault_at = Instant::now();
    match scenario {
        Scenario::KillOwner => {
            h.kill_node(busiest);
            *live.lock().unwrap() = h.alive_nodes();
        }
        Scenario::KillStreamLeader => {
            let leader = tokio.block_on(busiest_leader(&h.nats_urls()));
            let i = h.nats.iter().position(|n| n.name == leader).unwrap();
            h.kill_nats(i);
        }
        Scenario::PauseOwner => {
            let pid = h.node_pid(busiest);
            h.signal(pid, "-STOP");
            std::thread::sleep(LEASE_TTL * 2);
            h.signal(pid, "-CONT");
        }
    }
    // Load through the fault and a while after it, then settle.
    std::thread::sleep(Duration::from_secs(12).saturating_sub(fault_at.elapsed()));
    std::thread::sleep(Duration::from_secs(6));
    stop.store(true, Ordering::SeqCst);
    let written: Vec<Written> = writers.into_iter().map(|t| t.join().unwrap()).collect();
    h.wait_settled(Duration::from_secs(60));

    let mut acked = 0;
    let mut latencies = Vec::new();
    for w in &written {
        let seqs = stored(&h, w);
        // In order and each once: strictly increasing.
        for pair in seqs.windows(2) {
            assert!(
                pair[0] < pair[1],
                "{scenario:?}: {} holds event {} before {} (order or a duplicate): {seqs:?}",
                w.session,
                pair[0],
                pair[1]
            );
        }
        for seq in &w.acked {
            assert!(
                seqs.binary_search(seq).is_ok(),
                "{scenario:?}: {} lost acknowledged event {seq}",
                w.session
            );
        }
        assert!(
            w.longest_wait < RECOVERY_LIMIT,
            "{scenario:?}: {} waited {:?} for a write",
            w.session,
            w.longest_wait
        );
        acked += w.acked.len();
        latencies.extend(w.latencies.iter().copied());
    }
    let logs = tokio.block_on(epochs(&h.nats_urls(), PARTITIONS));
    for (p, (_, backwards)) in &logs {
        assert!(
            backwards.is_none(),
            "{scenario:?}: partition {p}'s epochs went backwards: {backwards:?}"
        );
    }
    latencies.sort();
    let pct = |q: f64| latencies[((latencies.len() - 1) as f64 * q) as usize];
    let longest = written.iter().map(|w| w.longest_wait).max().unwrap();
    eprintln!(
        "cluster {scenario:?}: {acked} acknowledged events, all present once and in order; \
         ack p50 {:?} p99 {:?}; longest wait for a write {longest:?}; log entries {}",
        pct(0.5),
        pct(0.99),
        logs.values().map(|(n, _)| n).sum::<u64>()
    );
}

#[test]
fn scenarios_keep_every_acknowledged_event() {
    let Some(nats) = nats_server() else {
        return;
    };
    let runs: usize = std::env::var("SHADOWBRAIN_CLUSTER_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let tokio = tokio::runtime::Runtime::new().unwrap();
    for run_no in 0..runs {
        for scenario in [
            Scenario::KillOwner,
            Scenario::KillStreamLeader,
            Scenario::PauseOwner,
        ] {
            eprintln!("cluster run {} of {runs}: {scenario:?}", run_no + 1);
            run(&nats, scenario, &tokio);
        }
    }
}
