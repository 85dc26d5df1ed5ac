//! The cluster's fault scenarios (docs/cluster.md), on the harness of
//! `tests/cluster_harness.rs`: three NATS servers and three nodes on 127.0.0.1, eight
//! paced writers recording every acknowledgement, one fault, then the checks:
//!
//! - every acknowledged event is present exactly once, and each session's events are in
//!   the order they were sent;
//! - the epochs stamped on each partition's log never go backwards;
//! - every session accepts writes again within 15 s of the fault (of its end, for faults
//!   that last: a pause, an outage; CI allows 60 s, see [`recovery_limit`]);
//! - scenario 7: no lease changes hands;
//! - once settled, every partition is kept by exactly its replica set (the first
//!   `copies` nodes rendezvous hashing ranks for it among the live members), and no live
//!   node keeps a directory for a partition it does not keep.
//!
//! Scenarios: 1 `kill -9` of the node owning most partitions; 2 `kill -9` of the NATS
//! server leading most streams; 3 `SIGSTOP` of an owner for twice the lease TTL, then
//! `SIGCONT` (the paused node must not write); 4 the killed node back, partitions moving
//! back to it; 5 all three NATS servers killed, restarted after 5 s; 6 a third of the
//! publish acknowledgements dropped (the nodes retry); 7 a CPU hog on both cores; on four
//! nodes keeping three copies of each partition: 8 `kill -9` of two of a partition's three
//! nodes at once (its owner and a standby); 9 a fifth node joins and, while it catches up,
//! another node leaves (SIGTERM), handing its partitions and copies on first.
//!
//! CI runs scenarios 1–3 and 9 once (the README's test command). All nine, twenty times:
//! `SHADOWBRAIN_CLUSTER_RUNS=20 SHADOWBRAIN_CLUSTER_SCENARIOS=1,2,3,4,5,6,7,8,9 cargo test
//! --test tests cluster::scenarios -- --nocapture` (a debug build, as docs/cluster.md and
//! the recorded results use; about two hours). Needs the NATS server of
//! `scripts/install-nats-server`; without it the test says it was skipped (and fails under
//! `SHADOWBRAIN_REQUIRE_NATS=1`, as in CI).

#[path = "cluster_harness.rs"]
mod harness;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use harness::{Harness, LEASE_TTL, NODES, PARTITIONS, Shape, Written};

use crate::common::python::{python_client, python_sdk};
use crate::common::serve;

/// Writers, each its own session, in namespaces of their own (so over partitions).
const WRITERS: usize = 8;
/// Each writer's pace: about 160 acknowledged events a second in all, a small fixed load
/// on two cores that six debug-built processes share, so CPU saturation does not hide a
/// failover.
const PACE: Duration = Duration::from_millis(50);
/// Every session must accept writes again within this long of a fault: the issue's 15 s,
/// or `SHADOWBRAIN_CLUSTER_RECOVERY_SECS`. CI sets 60: scenario 2 (a NATS stream leader
/// killed) is bounded below by JetStream's own leader election, which has taken close to
/// 15 s on this machine (docs/cluster.md), and a CI run must not fail on a known,
/// documented miss; every correctness check stays the same there.
fn recovery_limit() -> Duration {
    let secs = std::env::var("SHADOWBRAIN_CLUSTER_RECOVERY_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(15);
    Duration::from_secs(secs)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scenario {
    KillOwner = 1,
    KillStreamLeader = 2,
    PauseOwner = 3,
    OwnerBack = 4,
    NatsOutage = 5,
    DroppedAcks = 6,
    CpuHog = 7,
    KillReplicas = 8,
    JoinAndLeave = 9,
}

const ALL: [Scenario; 9] = [
    Scenario::KillOwner,
    Scenario::KillStreamLeader,
    Scenario::PauseOwner,
    Scenario::OwnerBack,
    Scenario::NatsOutage,
    Scenario::DroppedAcks,
    Scenario::CpuHog,
    Scenario::KillReplicas,
    Scenario::JoinAndLeave,
];

fn run(nats: &std::path::Path, scenario: Scenario, tokio: &tokio::runtime::Runtime) -> String {
    let env: &[(&str, &str)] = match scenario {
        Scenario::DroppedAcks => &[("SHADOWBRAIN_FAULT_DROP_ACKS", "0.33")],
        _ => &[],
    };
    // More nodes than copies: each node keeps only its replica sets' partitions.
    let shape = match scenario {
        Scenario::KillReplicas | Scenario::JoinAndLeave => Shape {
            nodes: 5,
            started: 4,
            ..Shape::default()
        },
        _ => Shape::default(),
    };
    // `SHADOWBRAIN_CLUSTER_PLACEMENT=session`: the same faults on a cluster placed by
    // session.
    let shape = Shape {
        placement: match std::env::var("SHADOWBRAIN_CLUSTER_PLACEMENT").as_deref() {
            Ok("session") => "session",
            _ => "namespace",
        },
        ..shape
    };
    let mut h = Harness::start_shaped(
        harness::Security::Secured,
        nats,
        env!("CARGO_BIN_EXE_shadowbrain").as_ref(),
        env,
        &[],
        shape,
    );
    h.wait_copies_settled(Duration::from_secs(90));
    let live = Arc::new(Mutex::new(h.alive_nodes()));
    let stop = Arc::new(AtomicBool::new(false));
    let writers = harness::load(live.clone(), stop.clone(), WRITERS, PACE, 1);
    std::thread::sleep(Duration::from_secs(3));
    let owned = h.owned();
    let busiest = (0..h.nodes.len()).max_by_key(|i| owned[*i]).unwrap();
    let owners_before = h.owners();
    // When the fault ended: recovery is measured from here.
    let fault_end = match scenario {
        Scenario::KillOwner => {
            h.kill_node(busiest);
            *live.lock().unwrap() = h.alive_nodes();
            Instant::now()
        }
        Scenario::KillStreamLeader => {
            let leader = tokio.block_on(harness::busiest_leader(&h.nats_access()));
            let i = h.nats.iter().position(|n| n.name == leader).unwrap();
            h.kill_nats(i);
            Instant::now()
        }
        Scenario::PauseOwner => {
            let pid = h.node_pid(busiest);
            h.signal(pid, "-STOP");
            std::thread::sleep(LEASE_TTL * 2);
            h.signal(pid, "-CONT");
            Instant::now()
        }
        Scenario::OwnerBack => {
            h.kill_node(busiest);
            *live.lock().unwrap() = h.alive_nodes();
            std::thread::sleep(LEASE_TTL * 3);
            h.start_node(busiest);
            let back = Instant::now();
            // Its partitions move back once it is a member again.
            let until = Instant::now() + Duration::from_secs(60);
            while h.owned()[busiest] < owned[busiest] {
                assert!(
                    Instant::now() < until,
                    "the partitions did not move back: {:?}",
                    h.owned()
                );
                std::thread::sleep(Duration::from_millis(200));
            }
            *live.lock().unwrap() = h.alive_nodes();
            back
        }
        Scenario::NatsOutage => {
            for i in 0..3 {
                h.kill_nats(i);
            }
            std::thread::sleep(Duration::from_secs(5));
            for i in 0..3 {
                h.start_nats(i);
            }
            Instant::now()
        }
        Scenario::DroppedAcks => Instant::now(),
        Scenario::KillReplicas => {
            // The first writer's partition: its owner and one of its two standbys.
            let ns = &harness::keys()[0].0;
            let p = match h.shape.placement {
                "session" => shadowbrain::cluster::session_partition(ns, "writer-0", PARTITIONS),
                _ => shadowbrain::cluster::partition_of(ns, PARTITIONS),
            };
            let set = h.replica_sets().expect("the members agree")[&p].clone();
            let owner = owners_before[&p].clone();
            let standby = set.iter().find(|n| **n != owner).unwrap().clone();
            for name in [owner, standby] {
                let i = h.nodes.iter().position(|n| n.name == name).unwrap();
                h.kill_node(i);
            }
            *live.lock().unwrap() = h.alive_nodes();
            Instant::now()
        }
        Scenario::JoinAndLeave => {
            let joining = h.nodes.iter().position(|n| n.served.is_none()).unwrap();
            h.start_node(joining);
            std::thread::sleep(LEASE_TTL);
            // While it catches up, the busiest node hands its partitions and copies on and
            // leaves: it stops once the nodes replacing its copies have caught up, within
            // its leave_timeout (60 s).
            let pid = h.node_pid(busiest);
            h.signal(pid, "-TERM");
            let stopped = h.nodes[busiest]
                .served
                .take()
                .unwrap()
                .exit_within(Duration::from_secs(90));
            assert!(stopped.is_some(), "the leaving node did not stop");
            let name = &h.nodes[busiest].name;
            let log = std::fs::read_to_string(h.dir.path().join(format!("{name}.log"))).unwrap();
            let handed = log
                .lines()
                .find(|l| l.contains("handed every partition and copy on"))
                .unwrap_or_else(|| {
                    panic!(
                        "{name} left before its copies were kept elsewhere: {}",
                        log.lines().rev().take(5).collect::<Vec<_>>().join(" | ")
                    )
                });
            eprintln!(
                "scenario 9: {name} {}",
                handed.rsplit(": ").next().unwrap_or(handed)
            );
            *live.lock().unwrap() = h.alive_nodes();
            Instant::now()
        }
        Scenario::CpuHog => {
            let hogs: Vec<_> = (0..4)
                .map(|_| {
                    std::process::Command::new("sh")
                        .args(["-c", "while :; do :; done"])
                        .spawn()
                        .unwrap()
                })
                .collect();
            std::thread::sleep(Duration::from_secs(10));
            for mut hog in hogs {
                let _ = hog.kill();
                let _ = hog.wait();
            }
            Instant::now()
        }
    };
    // Load through the fault and 8 s after it, then settle.
    std::thread::sleep(Duration::from_secs(8));
    stop.store(true, Ordering::SeqCst);
    let written: Vec<Written> = writers.into_iter().map(|t| t.join().unwrap()).collect();
    h.wait_settled(Duration::from_secs(60));
    h.wait_copies_settled(Duration::from_secs(90));
    if scenario == Scenario::CpuHog {
        assert_eq!(
            h.owners(),
            owners_before,
            "a lease moved under a CPU hog alone"
        );
    }

    let mut acked = 0;
    let mut latencies = Vec::new();
    let mut recovery = Duration::ZERO;
    for w in &written {
        harness::check_stored(&h, w, &format!("{scenario:?}"));
        let first_after = w
            .acked
            .iter()
            .map(|(_, at)| *at)
            .find(|at| *at >= fault_end)
            .expect("writes after the fault");
        let took = first_after - fault_end;
        recovery = recovery.max(took);
        acked += w.acked.len();
        latencies.extend(w.latencies.iter().copied());
    }
    let logs = tokio.block_on(harness::epochs(&h.nats_access(), PARTITIONS));
    for (p, (_, backwards)) in &logs {
        assert!(
            backwards.is_none(),
            "{scenario:?}: partition {p}'s epochs went backwards: {backwards:?}"
        );
    }
    let copies = same_as_the_log(&mut h, tokio, &written[0]);
    latencies.sort();
    let pct = |q: f64| latencies[((latencies.len() - 1) as f64 * q) as usize];
    let longest = written.iter().map(|w| w.longest_wait).max().unwrap();
    let mut failed = std::collections::BTreeMap::<String, u64>::new();
    for w in &written {
        for (why, n) in &w.failures {
            *failed.entry(why.clone()).or_default() += n;
        }
    }
    let line = format!(
        "scenario {} {scenario:?}: {acked} acknowledged events, all present once and in order; \
         epochs monotonic in {} log entries; {copies}; writes again {recovery:.1?} after the fault \
         (longest wait for one write {longest:.1?}; attempts retried: {failed:?}); ack \
         p50 {:.1?} p99 {:.1?}",
        scenario as u8,
        logs.values().map(|(n, _)| n).sum::<u64>(),
        pct(0.5),
        pct(0.99),
    );
    eprintln!("{line}");
    // Checked last, so that a run past the bound still shows every other check holding.
    assert!(
        recovery < recovery_limit(),
        "{scenario:?}: a session wrote again only {recovery:?} after the fault"
    );
    line
}

/// After the nodes stop (SIGTERM), every copy of a partition that applied its whole log
/// equals a store rebuilt from the log key for key (there is at least one: its last
/// owner's); and recall on the last owner's copy, opened by one process, answers what the
/// rebuilt store answers.
fn same_as_the_log(h: &mut Harness, tokio: &tokio::runtime::Runtime, probe: &Written) -> String {
    let nats = h.nats_access();
    h.stop_nodes();
    let rebuilt_root = h.dir.path().join("rebuilt");
    let mut compared = 0;
    // What each partition's log rebuilds to, kept for the recall check below.
    let mut rebuilt_contents = std::collections::BTreeMap::new();
    for p in 0..PARTITIONS {
        let entries = tokio.block_on(harness::read_log(&nats, p));
        let rebuilt = rebuilt_root.join(format!("p{p:03}"));
        let mut replica =
            shadowbrain::Replica::open(&rebuilt.join("store"), shadowbrain::Backend::Lmdb).unwrap();
        let borrowed: Vec<(u64, &[u8])> = entries.iter().map(|(s, b)| (*s, b.as_slice())).collect();
        replica.apply_all(&borrowed).unwrap();
        let end = replica.applied();
        replica.close();
        let expected = harness::contents(&rebuilt.join("store"));
        let mut whole = 0;
        for copy in harness::copies_on_disk(h, p) {
            if copy.applied != end {
                continue;
            }
            assert!(
                copy.contents == expected,
                "{}'s copy of partition {p} differs from the store rebuilt from its log",
                copy.node
            );
            whole += 1;
        }
        assert!(
            whole > 0,
            "no copy of partition {p} applied its whole log ({end} entries)"
        );
        compared += whole;
        rebuilt_contents.insert(p, expected);
    }
    // Recall, one process each: the last owner's copy and the rebuilt store.
    let (ns, key) = harness::keys().into_iter().next().unwrap();
    assert_eq!(key, probe.key);
    let p = match h.shape.placement {
        "session" => shadowbrain::cluster::session_partition(&ns, &probe.session, PARTITIONS),
        _ => shadowbrain::cluster::partition_of(&ns, PARTITIONS),
    };
    let config = h.nodes[0].config.clone();
    let recall = |data: &std::path::Path| -> Vec<String> {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_shadowbrain"))
            .args([
                "recall",
                "--namespace",
                &ns,
                "--session",
                &probe.session,
                "--config",
            ])
            .arg(&config)
            .args(["--json", "--k", "20", "--data"])
            .arg(data)
            .arg(format!("{} event 7", probe.session))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["memories"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["id"].as_str().unwrap().to_string())
            .collect()
    };
    let owner_copy = h
        .nodes
        .iter()
        .map(|n| n.partition_dir(p))
        .find(|d| {
            d.join("store").exists() && harness::contents(&d.join("store")) == rebuilt_contents[&p]
        })
        .unwrap();
    let scratch = h.dir.path().join("owner-copy");
    copy_dir(&owner_copy.join("store"), &scratch.join("store"));
    let from_cluster = recall(&scratch);
    let from_log = recall(&rebuilt_root.join(format!("p{p:03}")));
    assert!(!from_cluster.is_empty());
    assert_eq!(
        from_cluster, from_log,
        "recall differs between the cluster's copy and the log's"
    );
    format!("{compared} whole copies equal their logs, recall the same")
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_file() && entry.file_name() != "LOCK" {
            std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
        }
    }
}

/// `serve --cluster` with NATS reached in plain text and without a credential of the node's
/// own is refused at start, before it connects anywhere, with both ways out named; so is
/// `insecure_loopback` with a server off this machine. (No NATS server is needed: the
/// section is checked first.)
#[test]
fn a_cluster_without_tls_or_its_own_credential_is_refused() {
    let refused = |section: &str| -> String {
        let out = serve::new()
            .cluster()
            .config(&format!("[cluster]\nnode = \"n1\"\n{section}"))
            .output();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!out.status.success(), "{section}: {stderr}");
        stderr
    };
    let e = refused("urls = [\"nats://10.0.0.7:4222\"]\n");
    assert!(
        e.contains("tls_ca is not set") && e.contains("insecure_loopback = true"),
        "{e}"
    );
    let e = refused("urls = [\"nats://127.0.0.1:4222\"]\n");
    assert!(e.contains("no credential of this node's own"), "{e}");
    let e = refused(
        "urls = [\"nats://127.0.0.1:4222\", \"nats://10.0.0.7:4222\"]\ninsecure_loopback = true\n",
    );
    assert!(
        e.contains("`nats://10.0.0.7:4222` is not on loopback"),
        "{e}"
    );
}

/// The attacks an unsecured cluster fell to, made through the binaries against a cluster
/// configured as `docs/cluster/` says (the harness's default), each refused:
///
/// - who may connect: plain text, no user, a wrong password and an nkey no server was given
///   are refused, and a user of another account sees none of the cluster's traffic and
///   reaches none of its subjects;
/// - credentials in clear: a thief holding a node's nkey seed (not the cluster secret)
///   subscribes to `sb.rpc.>` and captures forwarded requests: neither the API key nor the
///   dashboard cookie is in them, and replaying one is refused;
/// - a forged admin sign-in written to the sign-ins bucket signs nobody in;
/// - lease theft and impersonation: the thief rewrites the partition's lease and answers
///   its forwarded requests; no forged answer reaches a client (they get 502
///   `bad_forward_answer`), and the partition serves again once the thief stops;
/// - log poisoning: garbage and a well-formed but unsealed entry in the partition's log
///   neither stop the partition nor write a key.
#[test]
fn the_attacks_on_the_cluster_are_refused() {
    use crate::common::site::{Site, cookie_of};
    use futures::StreamExt;
    let Some(nats_bin) = harness::nats_server() else {
        return;
    };
    let mut h = Harness::start(&nats_bin, env!("CARGO_BIN_EXE_shadowbrain").as_ref(), &[]);
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (ns, key) = harness::keys().into_iter().next().unwrap();
    let p = shadowbrain::cluster::partition_of(&ns, PARTITIONS);
    let owner_name = h.owners()[&p].clone();
    let front = (0..NODES).find(|&i| h.nodes[i].name != owner_name).unwrap();
    let site = Site::at(h.nodes[front].addr);
    let access = h.nats_access();
    let rpc = format!("sb.rpc.{p:03}");
    let log = format!("sb.log.{p:03}");
    let within = |limit: Duration| tokio::time::sleep(limit);

    tokio.block_on(async {
        // Who may connect.
        let seed = h.node_seed(0);
        let plain = harness::NatsAccess {
            urls: access.urls.iter().map(|u| u.replace("tls://", "nats://")).collect(),
            ca: None,
            ..access.with_nkey(&seed)
        };
        // An nkey no server was given (made as `cluster init` makes them).
        let stranger = tempfile::tempdir().unwrap();
        let made = std::process::Command::new(env!("CARGO_BIN_EXE_shadowbrain"))
            .args(["cluster", "init", "--nodes", "1", "--dir"])
            .arg(stranger.path())
            .output()
            .unwrap();
        assert!(made.status.success());
        let unknown = harness::env_file(&stranger.path().join("node0.env"))[0].1.clone();
        for (what, attempt) in [
            ("plain text", plain),
            ("no user", access.as_user(None)),
            ("a wrong password", access.as_user(Some(("operator", "guess")))),
            ("an nkey no server knows", access.with_nkey(&unknown)),
        ] {
            let got = tokio::time::timeout(Duration::from_secs(10), attempt.connect()).await;
            assert!(!matches!(got, Ok(Ok(_))), "{what} was let in");
        }
        let other = access
            .as_user(Some(("other", harness::OTHER_PASSWORD)))
            .connect()
            .await
            .unwrap();
        let mut other_sees = other.subscribe(">").await.unwrap();
        let thief = access.with_nkey(&h.node_seed(2)).connect().await.unwrap();
        let mut captured = thief.subscribe(rpc.clone()).await.unwrap();
        thief.flush().await.unwrap();

        // Traffic with a key and a cookie, through a node that forwards it to the owner.
        site.write(Some(&key), "attacked", &["the eu-1 runner is down since Monday"])
            .await;
        let login = site
            .post("/ui/login", None, &[("key", &key), ("next", "/ui/sessions")])
            .await;
        assert_eq!(login.status, 303, "{}", login.body);
        let cookie = cookie_of(&login);
        let page = site.get("/ui/sessions", Some(&cookie)).await;
        assert_eq!(page.status, 200, "{}", page.body);
        assert_eq!(page.header("x-shadowbrain-node"), owner_name);
        let token = cookie.split_once('=').unwrap().1.to_string();
        let mut requests = Vec::new();
        while let Ok(Some(m)) =
            tokio::time::timeout(Duration::from_secs(1), captured.next()).await
        {
            requests.push(m);
        }
        assert!(
            requests.len() >= 2,
            "the thief captured {} forwarded requests; the test needs some",
            requests.len()
        );
        let holds = |hay: &[u8], needle: &str| {
            hay.windows(needle.len()).any(|w| w == needle.as_bytes())
        };
        for m in &requests {
            assert!(!holds(&m.payload, &key), "an API key crossed NATS");
            assert!(!holds(&m.payload, &token), "a dashboard cookie crossed NATS");
            assert!(holds(&m.payload, "/v1/") || holds(&m.payload, "/ui/"));
        }
        // A captured request sent again is answered with nothing the front would accept.
        let replayed = thief
            .request(rpc.clone(), requests[0].payload.clone())
            .await
            .unwrap();
        assert_eq!(&replayed.payload[..], b"refused");
        drop(captured);

        // Another account saw nothing of it, and what it publishes reaches nothing.
        let before = harness::log_ends(&access, PARTITIONS).await;
        other.publish(log.clone(), "poison".into()).await.unwrap();
        other.publish("$KV.sb_leases.p000", "other".into()).await.unwrap();
        other.flush().await.unwrap();
        while let Ok(Some(m)) =
            tokio::time::timeout(Duration::from_millis(500), other_sees.next()).await
        {
            assert!(
                m.subject.as_str() == log || m.subject.as_str() == "$KV.sb_leases.p000",
                "another account saw the cluster's {}",
                m.subject
            );
        }
        assert_eq!(harness::log_ends(&access, PARTITIONS).await, before);

        // A forged admin sign-in.
        let js = async_nats::jetstream::new(thief.clone());
        let sign_ins = js.get_key_value("sb_signins").await.unwrap();
        let forged = serde_json::json!({
            "namespace": "ops", "admin": true, "csrf": "x", "key": "",
            "expires": std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() + 3600,
        });
        sign_ins
            .put(harness::sha256_hex("forged-token"), forged.to_string().into())
            .await
            .unwrap();
        for i in 0..NODES {
            let page = Site::at(h.nodes[i].addr)
                .get("/ui/", Some("shadowbrain_ui=forged-token"))
                .await;
            assert_eq!(page.status, 401, "a forged sign-in let node{i} in: {}", page.body);
            assert!(page.body.contains("Sign in to shadowbrain"));
        }
        // The genuine sign-in still works, everywhere.
        let page = Site::at(h.nodes[front].addr).get("/ui/sessions", Some(&cookie)).await;
        assert_eq!(page.status, 200, "{}", page.body);

        // Lease theft and impersonation, for a few lease lifetimes.
        let leases = js.get_key_value("sb_leases").await.unwrap();
        let mut impostor = thief
            .queue_subscribe(rpc.clone(), "owners".into())
            .await
            .unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let attack = {
            let (thief, stop) = (thief.clone(), stop.clone());
            tokio::spawn(async move {
                let mut answered = 0;
                let mut tick = tokio::time::interval(Duration::from_millis(400));
                while !stop.load(Ordering::SeqCst) {
                    tokio::select! {
                        _ = tick.tick() => {
                            let _ = leases.put(format!("p{p:03}"), "thief".into()).await;
                        }
                        Some(m) = impostor.next() => {
                            if let Some(reply) = m.reply {
                                let forged = "HTTP/1.1 200 OK\r\nSet-Cookie: shadowbrain_ui=forged\r\n\r\n{\"forged\":true}";
                                let _ = thief.publish(reply, forged.into()).await;
                                answered += 1;
                            }
                        }
                    }
                }
                answered
            })
        };
        let mut refused = 0;
        let until = Instant::now() + 4 * LEASE_TTL;
        while Instant::now() < until {
            let answer = site
                .keyed("GET", "/v1/sessions/attacked/timeline", Some(&key))
                .await;
            assert!(!answer.body.contains("forged"), "{}", answer.body);
            assert!(answer.header("set-cookie").is_empty(), "a forwarded answer set a cookie");
            if answer.status == 502 {
                assert!(answer.body.contains("bad_forward_answer"), "{}", answer.body);
                refused += 1;
            }
            within(Duration::from_millis(100)).await;
        }
        stop.store(true, Ordering::SeqCst);
        let answered = attack.await.unwrap();
        assert!(
            answered > 0 && refused > 0,
            "the impostor answered {answered} requests; clients were refused {refused} forged answers"
        );

        // Log poisoning: garbage and a well-formed entry that no node sealed.
        let poison = shadowbrain::internals::encode_entry(&[shadowbrain::internals::Op::Put(
            b"forged-key".to_vec(),
            b"forged".to_vec(),
        )]);
        js.publish(log.clone(), vec![0u8; 13].into()).await.unwrap().await.unwrap();
        js.publish(log.clone(), poison.into()).await.unwrap().await.unwrap();
    });

    // The partition serves again (after the lease theft and the poisoned log).
    let limit = recovery_limit();
    let until = Instant::now() + limit;
    loop {
        let answer = harness::request(
            h.nodes[front].addr,
            "POST",
            "/v1/sessions/attacked/events",
            Some(&key),
            Some(r#"{"events":[{"kind":"observation","text":"written after the attacks"}]}"#),
            None,
        );
        if matches!(answer, Ok((201, _, _))) {
            break;
        }
        assert!(
            Instant::now() < until,
            "the attacked partition did not take a write within {limit:?}: {answer:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // Every copy of the partition passed the poisoned entries without writing them.
    h.stop_nodes();
    for node in &h.nodes {
        let store = node.partition_dir(p).join("store");
        if store.exists() {
            let copy = harness::contents(&store);
            assert!(
                !copy.contains_key(&b"forged-key"[..]),
                "{} applied an unsealed log entry",
                node.name
            );
        }
    }
}

#[test]
fn scenarios_keep_every_acknowledged_event() {
    let Some(nats) = harness::nats_server() else {
        return;
    };
    let runs: usize = std::env::var("SHADOWBRAIN_CLUSTER_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let chosen: Vec<Scenario> = match std::env::var("SHADOWBRAIN_CLUSTER_SCENARIOS") {
        Ok(list) => list
            .split(',')
            .map(|n| {
                let n: usize = n.trim().parse().expect("scenario numbers, e.g. 1,2,3");
                ALL[n - 1]
            })
            .collect(),
        // The three oldest faults and a join with a leave on a cluster larger than its
        // replica sets.
        Err(_) => vec![ALL[0], ALL[1], ALL[2], Scenario::JoinAndLeave],
    };
    let tokio = tokio::runtime::Runtime::new().unwrap();
    // Many runs go on past a failed one (its logs kept) and fail at the end, listing
    // every failure: a batch of twenty shows how often, not only that.
    let mut failures = Vec::new();
    for run_no in 0..runs {
        for &scenario in &chosen {
            eprintln!("cluster run {} of {runs}: {scenario:?}", run_no + 1);
            let once = || run(&nats, scenario, &tokio);
            if runs == 1 {
                once();
            } else if let Err(e) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(once)) {
                let why = e
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                failures.push(format!("run {}: {why}", run_no + 1));
            }
        }
    }
    assert!(failures.is_empty(), "failed runs: {failures:#?}");
}

/// Snapshots: with a small `snapshot_tail_mib`, each written partition is snapshotted into
/// the object store and its stream truncated beneath the snapshot (a forged snapshot stored
/// by a thief of a node's nkey is passed over and replaced); a fourth node joining
/// under load restores the snapshots of its new partitions instead of replaying them, every
/// acknowledged write is kept, and after the nodes stop every copy that reached a
/// partition's end equals every other key for key, the restored ones included.
#[test]
fn a_new_copy_restores_the_latest_snapshot_and_replays_only_the_tail() {
    let Some(nats) = harness::nats_server() else {
        return;
    };
    let tokio = tokio::runtime::Runtime::new().unwrap();
    let shape = Shape {
        nodes: 4,
        started: 3,
        ..Shape::default()
    };
    let mut h = Harness::start_shaped(
        harness::Security::Secured,
        &nats,
        env!("CARGO_BIN_EXE_shadowbrain").as_ref(),
        &[("SHADOWBRAIN__CLUSTER__SNAPSHOT_TAIL_MIB", "1")],
        &[],
        shape,
    );
    let access = h.nats_access();
    let written_to: std::collections::BTreeSet<u16> = harness::keys()[..WRITERS]
        .iter()
        .map(|(ns, _)| shadowbrain::cluster::partition_of(ns, PARTITIONS))
        .collect();
    // A thief holding a node's nkey (not the cluster secret) stores a snapshot of its own
    // for a written partition, claiming a position past the stream's end: the nodes pass
    // over it, and the partition's real snapshot replaces it.
    let forged = *written_to.first().unwrap();
    tokio.block_on(async {
        let thief = access.with_nkey(&h.node_seed(3)).connect().await.unwrap();
        let store = async_nats::jetstream::new(thief)
            .get_object_store("sb_snapshots")
            .await
            .unwrap();
        let meta = async_nats::jetstream::object_store::ObjectMetadata {
            name: format!("SB_P{forged:03}"),
            metadata: [
                ("position".to_string(), "1000000".to_string()),
                ("sha256".to_string(), "00".repeat(32)),
                ("seal".to_string(), "11".repeat(32)),
            ]
            .into(),
            ..Default::default()
        };
        store.put(meta, &mut &b"not a snapshot"[..]).await.unwrap();
    });
    // About 3 MiB of log for each of the first eight tenants' partitions.
    harness::fill(&h.alive_nodes(), 16_000, WRITERS, 160);
    let until = Instant::now() + Duration::from_secs(120);
    loop {
        let spans = tokio.block_on(harness::log_spans(&access, PARTITIONS));
        let snapshots = tokio.block_on(harness::snapshot_positions(&access, PARTITIONS));
        let truncated = written_to
            .iter()
            .all(|p| snapshots.get(p).is_some_and(|s| spans[p].0 == s + 1));
        if truncated {
            break;
        }
        assert!(
            Instant::now() < until,
            "the written partitions were not snapshotted and truncated: streams {spans:?}, \
             snapshots {snapshots:?}; logs in {}",
            h.dir.path().display()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    // A fourth node joins under load.
    let live = Arc::new(Mutex::new(h.alive_nodes()));
    let stop = Arc::new(AtomicBool::new(false));
    let writers = harness::load(live.clone(), stop.clone(), WRITERS, PACE, 1);
    std::thread::sleep(Duration::from_secs(2));
    h.start_node(3);
    h.wait_settled(Duration::from_secs(90));
    h.wait_copies_settled(Duration::from_secs(120));
    *live.lock().unwrap() = h.alive_nodes();
    std::thread::sleep(Duration::from_secs(3));
    stop.store(true, Ordering::SeqCst);
    let written: Vec<Written> = writers.into_iter().map(|t| t.join().unwrap()).collect();
    for w in &written {
        harness::check_stored(&h, w, "joining from snapshots");
    }
    let joined = std::fs::read_to_string(h.dir.path().join("node3.log")).unwrap();
    let restored = joined
        .matches("restored the partition's latest snapshot")
        .count();
    let (kept, _) = h.copies();
    let new_truncated = kept
        .iter()
        .filter(|(p, holders)| holders.contains("node3") && written_to.contains(p))
        .count();
    assert!(
        new_truncated > 0,
        "node3 keeps none of the written partitions"
    );
    // (More when a newer snapshot truncated the stream again before a copy caught up.)
    assert!(
        restored >= new_truncated,
        "node3 restored {restored} snapshots for the {new_truncated} truncated partitions it \
         keeps; logs in {}",
        h.dir.path().display()
    );
    // Every copy at a partition's end equals the others.
    h.stop_nodes();
    let ends = tokio.block_on(harness::log_ends(&access, PARTITIONS));
    for p in 0..PARTITIONS {
        let whole: Vec<_> = harness::copies_on_disk(&h, p)
            .into_iter()
            .filter(|copy| copy.applied == ends[&p])
            .collect();
        assert!(
            !whole.is_empty(),
            "no copy of partition {p} reached its end"
        );
        for copy in &whole[1..] {
            assert!(
                copy.contents == whole[0].contents,
                "{}'s copy of partition {p} differs from {}'s",
                copy.node,
                whole[0].node
            );
        }
    }
}

/// The way hosts and agents meet a cluster: the official Python MCP SDK and plain HTTP,
/// entering at every node, answered by the owner of the caller's partition.
#[test]
fn the_python_mcp_sdk_and_http_work_through_any_node() {
    let Some(nats) = harness::nats_server() else {
        return;
    };
    let Some(python) = python_sdk() else {
        return;
    };
    let mut h = Harness::start(&nats, env!("CARGO_BIN_EXE_shadowbrain").as_ref(), &[]);
    let (ns, key) = harness::keys().into_iter().nth(3).unwrap();
    let p = shadowbrain::cluster::partition_of(&ns, PARTITIONS);
    let owner = h.owners()[&p].clone();
    for (i, node) in h.nodes.iter().enumerate() {
        let url = format!("http://{}/mcp", node.addr);
        for answer in python_client(&python, &["http", &url, &key]) {
            assert_eq!(answer["tools"], 10, "through {}: {answer}", node.name);
            assert!(
                answer["recalled"].as_u64().unwrap() >= 1,
                "through {}: {answer}",
                node.name
            );
        }
        let body =
            format!(r#"{{"events":[{{"kind":"observation","text":"plain HTTP via node {i}"}}]}}"#);
        let (code, _, answered) = harness::request(
            node.addr,
            "POST",
            "/v1/sessions/plain/events",
            Some(&key),
            Some(&body),
            None,
        )
        .unwrap();
        assert_eq!(
            (code, answered.as_str()),
            (201, owner.as_str()),
            "through {}",
            node.name
        );
    }
    let (code, timeline, _) = harness::request(
        h.nodes[0].addr,
        "GET",
        "/v1/sessions/plain/timeline",
        Some(&key),
        None,
        None,
    )
    .unwrap();
    assert_eq!(code, 200);
    assert_eq!(timeline["items"].as_array().unwrap().len(), NODES);
    let (code, doc, _) =
        harness::request(h.nodes[1].addr, "GET", "/openapi.json", None, None, None).unwrap();
    assert_eq!(code, 200, "the document is public, as on one server");
    assert!(doc["paths"]["/v1/sessions/{session_id}/events"].is_object());
    // What cluster mode does not serve says so, in the one error shape.
    let (code, _, _) =
        harness::request(h.nodes[1].addr, "GET", "/mcp", Some(&key), None, None).unwrap();
    assert_eq!(code, 405);
    let (code, body, _) =
        harness::request(h.nodes[1].addr, "GET", "/cluster", Some(&key), None, None).unwrap();
    assert_eq!(
        (code, body["error"]["code"].as_str()),
        (403, Some("forbidden"))
    );
    // A second process under a live node's name is refused, saying why; the cluster is
    // left as it was.
    let data = tempfile::tempdir().unwrap();
    let out = serve::new()
        .cluster()
        .data(data.path())
        .config_file(&h.nodes[0].config)
        .envs(h.node_env(0))
        .output();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("another process is running as node `node0`"),
        "{stderr}"
    );
    assert_eq!(h.owners()[&p], owner);

    // A client that keeps one MCP connection (the session-based mode most clients speak)
    // through a node that does not own its namespace's partition: the owner dies holding a
    // call (stopped first, so one is in its hands for certain), and every call still
    // succeeds, the ones during the takeover after a wait: a recall is safe to send again.
    let entry = (0..NODES).find(|&i| h.nodes[i].name != owner).unwrap();
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/mcp_client.py");
    let url = format!("http://{}/mcp", h.nodes[entry].addr);
    let held = std::process::Command::new(&python)
        .arg(script)
        .args(["hold", &url, &key, "14"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(4));
    let killed_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let owner_index = h.nodes.iter().position(|n| n.name == owner).unwrap();
    let pid = h.node_pid(owner_index);
    h.signal(pid, "-STOP");
    std::thread::sleep(Duration::from_millis(500));
    h.kill_node(owner_index);
    let out = held.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let calls: Vec<(&str, u64)> = stdout
        .lines()
        .map(|l| {
            let mut words = l.split_whitespace();
            (
                words.next().unwrap(),
                words.next().unwrap().parse().unwrap(),
            )
        })
        .collect();
    let failed: Vec<&str> = stdout.lines().filter(|l| l.starts_with("error")).collect();
    assert!(
        failed.is_empty(),
        "calls failed across the takeover (the owner died at {killed_at}): {failed:?}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let after = calls.iter().filter(|(_, at)| *at > killed_at).count();
    assert!(
        calls.len() > 20 && after > 10,
        "{} calls, {after} after the owner died",
        calls.len()
    );
    assert_ne!(h.owners()[&p], owner);

    // Wrong keys are throttled at the node the client reached, as one server throttles
    // them: 401 up to the limit, then 429 with a wait, while the same address's valid key
    // is still answered (through that node, to its partition's owner).
    let addr = h.nodes[entry].addr;
    for i in 0..shadowbrain::auth::AUTH_FAILURES {
        let (code, _, _) =
            harness::request(addr, "GET", "/v1/sessions", Some("a-wrong-key"), None, None).unwrap();
        assert_eq!(code, 401, "failure {i}");
    }
    let (code, body, _) =
        harness::request(addr, "GET", "/v1/sessions", Some("a-wrong-key"), None, None).unwrap();
    assert_eq!(
        (code, body["error"]["code"].as_str()),
        (429, Some("too_many_failed_auth")),
        "{body}"
    );
    let (code, _, _) =
        harness::request(addr, "GET", "/v1/sessions", Some(&key), None, None).unwrap();
    assert_eq!(code, 200, "a valid key is never throttled");
}

/// A policy reload entering at any node reaches every partition on every node, a takeover
/// keeps it, and a file with errors changes nothing anywhere.
#[test]
fn a_policy_reload_reaches_every_partition_and_outlives_a_takeover() {
    let Some(nats) = harness::nats_server() else {
        return;
    };
    let (mut h, _files, file) = Harness::start_with_policy(
        &nats,
        env!("CARGO_BIN_EXE_shadowbrain").as_ref(),
        "cluster-a",
    );
    let names = Harness::policy_names;
    let owners: std::collections::BTreeSet<String> = h.owners().into_values().collect();
    assert!(owners.len() > 1, "the partitions are spread: {owners:?}");
    assert!(names(&h).iter().all(|n| n == "cluster-a"));

    let reload = |h: &Harness, node: usize, key: &str| {
        harness::request(
            h.nodes[node].addr,
            "POST",
            "/v1/policy/reload",
            Some(key),
            Some("{}"),
            None,
        )
        .unwrap()
    };
    std::fs::write(&file, "name = \"cluster-b\"\n").unwrap();
    let (_, tenant_key) = harness::keys().into_iter().next().unwrap();
    let (code, body, _) = reload(&h, 1, &tenant_key);
    assert_eq!(
        (code, body["error"]["code"].as_str()),
        (403, Some("forbidden"))
    );
    assert!(
        names(&h).iter().all(|n| n == "cluster-a"),
        "a tenant changed nothing"
    );
    let (code, body, _) = reload(&h, 1, harness::ADMIN);
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["name"], "cluster-b");
    assert!(
        names(&h).iter().all(|n| n == "cluster-b"),
        "every partition runs the new policy: {:?}",
        names(&h)
    );

    // A file with errors: the answer lists them, every partition keeps what it ran.
    std::fs::write(
        &file,
        "name = \"cluster-c\"\n[scoring]\nrecency = \"high\"\n",
    )
    .unwrap();
    let (code, body, _) = reload(&h, 2, harness::ADMIN);
    assert_eq!(
        (code, body["error"]["code"].as_str()),
        (422, Some("invalid_policy")),
        "{body}"
    );
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("recency"), "{message}");
    assert!(names(&h).iter().all(|n| n == "cluster-b"));

    // The node owning most partitions dies: whoever takes them over runs the reloaded
    // policy, not the one it started with (the file still has errors, and is not read).
    let busiest = (0..NODES).max_by_key(|&i| h.owned()[i]).unwrap();
    h.kill_node(busiest);
    h.wait_settled(Duration::from_secs(60));
    assert!(
        names(&h).iter().all(|n| n == "cluster-b"),
        "after the takeover: {:?}",
        names(&h)
    );
}

/// The dashboard through any node: a visitor signed in at one node is signed in at every
/// node, and each page is answered by the owner of its namespace's partition; the policy
/// reload button reaches every partition; signing out at one node ends the sign-in at all.
/// Then, in Chromium, through a node that does not own the namespace's partition: sign in,
/// browse, the owner is killed, and the same browser, still signed in, browses and marks
/// a memory wrong on the partition's new owner.
#[test]
fn the_dashboard_works_through_any_node_and_across_a_takeover() {
    use crate::common::browser::{browser, click, open, screenshot, wait_for};
    use crate::common::site::{Site, cookie_of, csrf_of};
    let Some(nats) = harness::nats_server() else {
        return;
    };
    let (mut h, _files, file) =
        Harness::start_with_policy(&nats, env!("CARGO_BIN_EXE_shadowbrain").as_ref(), "ui-a");
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (ns, key) = harness::keys().into_iter().nth(5).unwrap();
    let p = shadowbrain::cluster::partition_of(&ns, PARTITIONS);
    let owner_name = h.owners()[&p].clone();
    let owner = h.nodes.iter().position(|n| n.name == owner_name).unwrap();
    let others: Vec<usize> = (0..NODES).filter(|&i| i != owner).collect();
    let (front, third) = (others[0], others[1]);
    let site = |h: &Harness, i: usize| Site::at(h.nodes[i].addr);
    let policy_names = Harness::policy_names;

    let ids = tokio.block_on(async {
        let ids = site(&h, front)
            .write(
                Some(&key),
                "deploys",
                &[
                    "the eu-1 runner is down since Monday",
                    "deploys go through eu-2 until eu-1 is back",
                ],
            )
            .await;
        // Not signed in: the node entered answers the sign-in page itself.
        let page = site(&h, front).get("/ui/sessions", None).await;
        assert_eq!(page.status, 401, "{}", page.body);
        assert!(
            page.body.contains("Sign in to shadowbrain"),
            "{}",
            page.body
        );
        assert_eq!(page.header("x-shadowbrain-node"), h.nodes[front].name);
        // Signed in at one node, signed in at every node; the owner answers each page.
        let login = site(&h, front)
            .post(
                "/ui/login",
                None,
                &[("key", &key), ("next", "/ui/sessions")],
            )
            .await;
        assert_eq!(login.status, 303, "{}", login.body);
        let cookie = cookie_of(&login);
        for i in 0..NODES {
            let page = site(&h, i).get("/ui/sessions", Some(&cookie)).await;
            assert_eq!(page.status, 200, "through node{i}: {}", page.body);
            assert!(page.body.contains("deploys"), "through node{i}");
            assert_eq!(
                page.header("x-shadowbrain-node"),
                owner_name,
                "through node{i}"
            );
        }
        // A form through a node that does not own the partition: pin a memory.
        let path = format!("/ui/memories/{}", ids[0]);
        let page = site(&h, third).get(&path, Some(&cookie)).await;
        assert_eq!(page.status, 200, "{}", page.body);
        let csrf = csrf_of(&page.body);
        let done = site(&h, third)
            .post(
                &format!("{path}/status"),
                Some(&cookie),
                &[("csrf", &csrf), ("status", "pinned"), ("reason", "keep")],
            )
            .await;
        assert_eq!(done.status, 303, "{}", done.body);
        let memory = site(&h, front)
            .api("GET", &format!("/v1/memories/{}", ids[0]), Some(&key), None)
            .await;
        assert_eq!(memory["status"], "pinned");
        // A tenant's sign-in cannot reload the policy.
        let page = site(&h, third).get("/ui/policy", Some(&cookie)).await;
        let refused = site(&h, third)
            .post(
                "/ui/policy/reload",
                Some(&cookie),
                &[("csrf", &csrf_of(&page.body))],
            )
            .await;
        assert_eq!(refused.status, 403, "{}", refused.body);

        // An admin sees the whole cluster on the overview, and reloads every partition's
        // policy from the dashboard.
        let login = site(&h, third)
            .post("/ui/login", None, &[("key", harness::ADMIN), ("next", "/")])
            .await;
        let admin = cookie_of(&login);
        let overview = site(&h, front).get("/", Some(&admin)).await;
        assert_eq!(overview.status, 200, "{}", overview.body);
        assert!(overview.body.contains("3 live nodes"), "{}", overview.body);
        for n in &h.nodes {
            assert!(
                overview
                    .body
                    .contains(&format!("<th scope=\"row\">{}</th>", n.name))
            );
        }
        let partition_rows = overview
            .body
            .split("<table class=\"partitions\">")
            .nth(1)
            .unwrap()
            .matches("<tr>")
            .count();
        assert_eq!(
            partition_rows,
            1 + PARTITIONS as usize,
            "a row per partition"
        );
        std::fs::write(&file, "name = \"ui-b\"\n").unwrap();
        let page = site(&h, front).get("/ui/policy", Some(&admin)).await;
        let admin_csrf = csrf_of(&page.body);
        let reloaded = site(&h, front)
            .post("/ui/policy/reload", Some(&admin), &[("csrf", &admin_csrf)])
            .await;
        assert_eq!(reloaded.status, 303, "{}", reloaded.body);
        assert_eq!(reloaded.header("location"), "/ui/policy?reloaded=1");
        // (Plain blocking requests: the nodes are other processes.)
        assert!(
            policy_names(&h).iter().all(|n| n == "ui-b"),
            "the dashboard's reload reached every partition: {:?}",
            policy_names(&h)
        );
        std::fs::write(&file, "name = \"ui-c\"\n[scoring]\nrecency = \"high\"\n").unwrap();
        let refused = site(&h, third)
            .post("/ui/policy/reload", Some(&admin), &[("csrf", &admin_csrf)])
            .await;
        assert_eq!(refused.status, 422, "{}", refused.body);
        assert!(refused.body.contains("invalid_policy"), "{}", refused.body);
        assert!(refused.body.contains("recency"), "{}", refused.body);

        // Signing out at one node ends the sign-in at every node.
        let out = site(&h, owner)
            .post("/ui/logout", Some(&admin), &[("csrf", &admin_csrf)])
            .await;
        assert_eq!(out.status, 303, "{}", out.body);
        for i in 0..NODES {
            assert_eq!(site(&h, i).get("/", Some(&admin)).await.status, 401);
        }
        ids
    });
    assert!(
        policy_names(&h).iter().all(|n| n == "ui-b"),
        "the refused reload changed nothing: {:?}",
        policy_names(&h)
    );

    // `/metrics` at each node is that node's own: the partitions it owns, and the records
    // of their runtimes (summed over the nodes, every record once).
    let scrape = |i: usize, key: &str| {
        tokio.block_on(async {
            let answer = reqwest::Client::new()
                .get(format!("http://{}/metrics", h.nodes[i].addr))
                .bearer_auth(key)
                .send()
                .await
                .unwrap();
            (answer.status().as_u16(), answer.text().await.unwrap())
        })
    };
    let value = |text: &str, name: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {text}"))
    };
    let owned = h.owned();
    let mut records = 0;
    for (i, &owns) in owned.iter().enumerate() {
        let (code, text) = scrape(i, harness::ADMIN);
        assert_eq!(code, 200, "{text}");
        let partitions = "shadowbrain_cluster_partitions{role=\"owner\"}";
        assert_eq!(value(&text, partitions), owns as u64, "node{i}");
        assert_eq!(value(&text, "shadowbrain_cluster_members"), NODES as u64);
        records += value(&text, "shadowbrain_records");
    }
    assert_eq!(
        records,
        ids.len() as u64,
        "every record once over the nodes"
    );
    assert_eq!(
        scrape(0, &key).0,
        403,
        "a tenant key sees no node's figures"
    );

    // In Chromium, through `front`, which does not own the namespace's partition.
    let Some((_driver, client)) = tokio.block_on(browser()) else {
        return;
    };
    let base = site(&h, front).base;
    let browse = |marks: bool| {
        tokio.block_on(async {
            let h1 = open(&client, &base, "/ui/sessions").await;
            if h1 == "Sign in to shadowbrain" {
                client
                    .find(fantoccini::Locator::Css("#key"))
                    .await
                    .unwrap()
                    .send_keys(&key)
                    .await
                    .unwrap();
                click(&client, "form.signin button").await;
                wait_for(&client, "main table").await;
            }
            let text = wait_for(&client, "main").await.text().await.unwrap();
            assert!(text.contains("deploys"), "{text}");
            open(&client, &base, "/ui/search?query=eu-1+runner").await;
            let target = &ids[1];
            click(
                &client,
                &format!("ol.results a[href='/ui/memories/{target}']"),
            )
            .await;
            wait_for(&client, "textarea#reason").await;
            if marks {
                click(&client, "button.to-wrong").await;
                let done = wait_for(&client, "p.done").await.text().await.unwrap();
                assert!(done.contains("wrong"), "{done}");
                screenshot(&client, "cluster-after-takeover").await;
            }
        })
    };
    browse(false);
    h.kill_node(owner);
    h.wait_settled(Duration::from_secs(60));
    let new_owner = h.owners()[&p].clone();
    assert_ne!(new_owner, owner_name);
    // The same browser, still signed in (no key typed again), on the new owner.
    browse(true);
    let (code, memory, answered) = harness::request(
        h.nodes[front].addr,
        "GET",
        &format!("/v1/memories/{}", ids[1]),
        Some(&key),
        None,
        None,
    )
    .unwrap();
    assert_eq!((code, memory["status"].as_str()), (200, Some("wrong")));
    assert_eq!(answered, new_owner);
    tokio.block_on(client.close()).unwrap();
}

/// How the scenarios' fixed load compares with what the harness's writers can push: the
/// same eight writers without a pace for 20 s, against the cluster and against one plain
/// `serve` (the same binary and keys) in the same run. Not a check (`--ignored`, prints).
/// `cargo test --test tests cluster::load_against_capacity -- --ignored --nocapture`
#[test]
#[ignore]
fn load_against_capacity() {
    let Some(nats) = harness::nats_server() else {
        return;
    };
    let rate = |nodes: Vec<std::net::SocketAddr>| {
        let live = Arc::new(Mutex::new(nodes));
        let stop = Arc::new(AtomicBool::new(false));
        let writers = harness::load(live, stop.clone(), WRITERS, Duration::ZERO, 1);
        std::thread::sleep(Duration::from_secs(3));
        let from = Instant::now();
        std::thread::sleep(Duration::from_secs(20));
        stop.store(true, Ordering::SeqCst);
        let until = from + Duration::from_secs(20);
        let acked: usize = writers
            .into_iter()
            .map(|w| {
                let w = w.join().unwrap();
                w.acked
                    .iter()
                    .filter(|(_, at)| *at >= from && *at < until)
                    .count()
            })
            .sum();
        acked as f64 / 20.0
    };
    let bin = env!("CARGO_BIN_EXE_shadowbrain");
    let mut h = Harness::start(&nats, bin.as_ref(), &[]);
    let cluster = rate(h.alive_nodes());
    let config = h.nodes[0].config.clone();
    h.stop_nodes();
    let data = tempfile::tempdir().unwrap();
    let one = serve::new().data(data.path()).config_file(&config).start();
    let single = rate(vec![one.addr]);
    drop(one);
    let paced = WRITERS as f64 / PACE.as_secs_f64();
    println!(
        "acknowledged events/s with {WRITERS} unpaced writers: cluster {cluster:.0}, one \
         `serve` {single:.0}; the scenarios offer {paced:.0}/s: {:.0}% of the cluster's, \
         {:.0}% of one process's",
        100.0 * paced / cluster,
        100.0 * paced / single
    );
}

/// Whether `SHADOWBRAIN_PLACEMENT_LOCAL` is set (run by hand; the suite runs `hash`): then
/// every process the test starts embeds with `serve`'s default, the local model once
/// installed, until the test sets `hash` back.
fn placement_local() -> bool {
    let local = std::env::var_os("SHADOWBRAIN_PLACEMENT_LOCAL").is_some();
    if local {
        harness::use_embedder(None);
    }
    local
}

/// A secured three-node cluster placed by session and one embedded `serve` beside it, both
/// run with the policy `toml`: the cluster, the one server, and the directories to keep
/// while they run.
fn by_session_beside_one_serve(
    nats: &std::path::Path,
    bin: &std::path::Path,
    toml: &str,
) -> (Harness, serve::Served, [tempfile::TempDir; 2]) {
    let files = tempfile::tempdir().unwrap();
    let policy = files.path().join("policy.toml");
    std::fs::write(&policy, toml).unwrap();
    let policy = policy.to_str().unwrap();
    let shape = Shape {
        placement: "session",
        ..Shape::default()
    };
    let h = Harness::start_shaped(
        harness::Security::Secured,
        nats,
        bin,
        &[],
        &["--policy", policy],
        shape,
    );
    let (one_dir, one) = harness::embedded_serve_with(bin, &["--policy", policy]);
    (h, one, [files, one_dir])
}

/// Update detection over a namespace placed by session (`[updates] scope = "namespace"`)
/// finds what one `serve` holding the same records finds: facts stated in one session and
/// changed, contradicted or repeated in another — most of them held by another partition,
/// at another node — mark the same records superseded, in conflict or repeated, as read
/// through any node. Each statement is written, and compared, before the next (as a live
/// agent's are), so both sides decide in the same order.
#[test]
fn facts_changed_in_sessions_of_other_partitions_are_found_as_one_server_finds_them() {
    let Some(nats) = harness::nats_server() else {
        return;
    };
    let bin = env!("CARGO_BIN_EXE_shadowbrain");
    let local = placement_local();
    // The hash embedder's vectors of two statements of one fact are less alike than the
    // model's.
    let floor = if local { 0.5 } else { 0.2 };
    let policy = format!(
        "name = \"facts\"\n[scoring]\nreinforce_on_recall = 0.0\n[updates]\nmode = \"rules\"\n\
         scope = \"namespace\"\nmin_similarity = {floor}\n"
    );
    let (h, one, _dirs) = by_session_beside_one_serve(&nats, bin.as_ref(), &policy);
    let (_, key) = harness::keys().into_iter().next().unwrap();
    let key = key.as_str();
    let pairs: Vec<(String, String)> = include_str!("../runtime/tests/data/updates_pairs.jsonl")
        .lines()
        .filter(|l| !l.trim().is_empty())
        .take(20)
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            let text = |k: &str| v[k]["text"].as_str().unwrap().to_string();
            (text("older"), text("newer"))
        })
        .collect();
    let everywhere: Vec<std::net::SocketAddr> = std::iter::once(one.addr)
        .chain(h.nodes.iter().map(|n| n.addr))
        .collect();
    let settled = || {
        everywhere.iter().all(|&a| {
            harness::queue_depth(a, "enrich") == Some(0)
                && harness::queue_depth(a, "updates") == Some(0)
        })
    };
    // (text, id in the cluster, id in the one server)
    let mut written: Vec<(String, String, String)> = Vec::new();
    for (i, (older, newer)) in pairs.iter().enumerate() {
        for (n, text) in [older, newer].into_iter().enumerate() {
            let body = serde_json::json!({ "events": [{
                "kind": "observation",
                "text": text,
                "timestamp": format!("2026-05-{:02}T{:02}:00:00Z", 1 + i, 8 + n),
            }] })
            .to_string();
            // The older statement in one session, the newer in another.
            let path = format!("/v1/sessions/fact{i}-{n}/events");
            let node = h.nodes[(2 * i + n) % NODES].addr;
            let mut ids = Vec::new();
            for addr in [node, one.addr] {
                let (code, got, _) =
                    harness::request(addr, "POST", &path, Some(key), Some(&body), None).unwrap();
                assert_eq!(code, 201, "{got}");
                ids.push(got["ids"][0].as_str().unwrap().to_string());
            }
            written.push((text.clone(), ids[0].clone(), ids[1].clone()));
            let waited = Instant::now();
            while !settled() {
                assert!(
                    waited.elapsed() < Duration::from_secs(120),
                    "statement {i}.{n} was not compared within 2 min"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
    let memory = |addr, id: &str| -> serde_json::Value {
        let path = format!("/v1/memories/{id}");
        let (code, got, _) = harness::request(addr, "GET", &path, Some(key), None, None).unwrap();
        assert_eq!(code, 200, "{got}");
        got
    };
    let text_of = |addr, id: &str| memory(addr, id)["text"].as_str().unwrap().to_string();
    // What is known against a record, in words.
    let found = |addr, id: &str| {
        let got = memory(addr, id);
        let texts = |v: &serde_json::Value| -> Vec<String> {
            let mut t: Vec<String> = v
                .as_array()
                .into_iter()
                .flatten()
                .map(|id| text_of(addr, id.as_str().unwrap()))
                .collect();
            t.sort();
            t
        };
        (
            got["superseded_by"].as_str().map(|id| text_of(addr, id)),
            texts(&got["conflicts"]),
            got["chain"]["duplicate_of"]
                .as_str()
                .map(|id| text_of(addr, id)),
            got["chain"]["supersedes"].as_array().map_or(0, Vec::len),
        )
    };
    let partition = |id: &str| {
        let id: shadowbrain_runtime::MemoryId = id.parse().unwrap();
        shadowbrain_runtime::IdBlock::partition_of(id.0, PARTITIONS)
    };
    let (mut marked, mut across) = (0, 0);
    for (i, (text, in_cluster, in_one)) in written.iter().enumerate() {
        let node = h.nodes[i % NODES].addr;
        let (c, o) = (found(node, in_cluster), found(one.addr, in_one));
        assert_eq!(c, o, "{text:?}: the cluster (left) and one server (right)");
        let got = memory(node, in_cluster);
        let related: Vec<&str> = got["superseded_by"]
            .as_str()
            .into_iter()
            .chain(
                got["conflicts"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|v| v.as_str()),
            )
            .chain(got["chain"]["duplicate_of"].as_str())
            .collect();
        marked += usize::from(!related.is_empty());
        across += related
            .iter()
            .filter(|r| partition(r) != partition(in_cluster))
            .count();
    }
    println!(
        "{marked} of {} statements marked; {across} marks across partitions",
        written.len()
    );
    assert!(
        marked >= 10,
        "the pairs found something: {marked} statements marked"
    );
    assert!(across >= 5, "findings across partitions: {across}");
    drop(h);
    if local {
        harness::use_embedder(Some("hash"));
    }
}

/// A namespace's sessions placed over every partition (`placement = "session"`) are
/// recalled, namespace- and agent-wide, with the very ranking one `serve` holding the same
/// records gives; sessions are listed from every partition; a memory is read by its id
/// through any node; feedback on a recall reaches every partition holding what it
/// returned; a lesson proven away from the namespace's home is promoted into the pool
/// there; a node configured to place by namespace is refused. Both sides run with recall's reinforcement off (a policy file), so
/// each query's scores do not depend on when the one before it was written back.
#[test]
fn a_namespace_placed_by_session_recalls_as_one_server() {
    let Some(nats) = harness::nats_server() else {
        return;
    };
    let bin = env!("CARGO_BIN_EXE_shadowbrain");
    let local = placement_local();
    let policy = "name = \"no-reinforce\"\n[scoring]\nreinforce_on_recall = 0.0\n\
         [condensation]\nevery_events = 50\nmin_events = 3\n\
         [promotion]\nmin_importance = 6\nmin_utility = 0.6\nmin_successes = 1\n";
    let (h, one, _dirs) = by_session_beside_one_serve(&nats, bin.as_ref(), policy);
    let (ns, key) = harness::keys().into_iter().next().unwrap();
    let words = [
        "deploy", "staging", "invoice", "garden", "tomato", "python", "rust", "paris", "budget",
        "meeting", "report", "guitar", "concert", "recipe", "pasta", "library", "camera", "river",
        "kayak", "puppy", "exam", "bakery", "piano", "museum", "flight", "coffee", "laptop",
        "server", "database", "birthday",
    ];
    let mut seed: u64 = 49;
    let mut word = || {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        words[(seed >> 33) as usize % words.len()]
    };
    // Twenty-four sessions of two agents, twelve turns each, written through the three
    // nodes in turn and to the one server.
    const SESSIONS: usize = 24;
    let mut ids = Vec::new();
    for s in 0..SESSIONS {
        let events: Vec<serde_json::Value> = (0..12)
            .map(|t| {
                let text: Vec<&str> = (0..8).map(|_| word()).collect();
                serde_json::json!({
                    "kind": "message",
                    "text": format!("{} (turn {s}.{t})", text.join(" ")),
                    "agent_id": format!("agent-{}", s % 2),
                    "timestamp": format!("2026-06-{:02}T10:{t:02}:00Z", 1 + s),
                })
            })
            .collect();
        let body = serde_json::json!({ "events": events }).to_string();
        let path = format!("/v1/sessions/s{s}/events");
        let node = h.nodes[s % NODES].addr;
        let (code, got, _) =
            harness::request(node, "POST", &path, Some(&key), Some(&body), None).unwrap();
        assert_eq!(code, 201, "{got}");
        ids.extend(
            got["ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap().to_string()),
        );
        let (code, got, _) =
            harness::request(one.addr, "POST", &path, Some(&key), Some(&body), None).unwrap();
        assert_eq!(code, 201, "{got}");
    }
    // A model embeds in the background: both sides rank once every record is embedded.
    let waited = Instant::now();
    while local
        && !std::iter::once(one.addr)
            .chain(h.nodes.iter().map(|n| n.addr))
            .all(|a| harness::enrich_backlog(a) == Some(0))
    {
        assert!(
            waited.elapsed() < Duration::from_secs(600),
            "embedding took over 10 min"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    // The namespace is spread: its ids come from most partitions' blocks.
    let used: std::collections::BTreeSet<u16> = ids
        .iter()
        .map(|id| {
            let id: shadowbrain_runtime::MemoryId = id.parse().unwrap();
            shadowbrain_runtime::IdBlock::partition_of(id.0, PARTITIONS)
        })
        .collect();
    assert!(
        used.len() >= 5,
        "the sessions went to partitions {used:?} only"
    );
    // Any node reads any memory, by the partition its id names.
    for (i, id) in ids.iter().step_by(41).enumerate() {
        let node = h.nodes[i % NODES].addr;
        let (code, got, _) = harness::request(
            node,
            "GET",
            &format!("/v1/memories/{id}"),
            Some(&key),
            None,
            None,
        )
        .unwrap();
        assert_eq!(
            (code, got["id"].as_str()),
            (200, Some(id.as_str())),
            "{got}"
        );
    }
    // The session list gathers every partition's.
    let listed = |addr| {
        let (code, got, _) =
            harness::request(addr, "GET", "/v1/sessions", Some(&key), None, None).unwrap();
        assert_eq!(code, 200, "{got}");
        let mut sessions: Vec<(String, u64)> = got["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                (
                    s["session_id"].as_str().unwrap().to_string(),
                    s["events"].as_u64().unwrap(),
                )
            })
            .collect();
        sessions.sort();
        sessions
    };
    let expected = listed(one.addr);
    assert_eq!(expected.len(), SESSIONS);
    for node in &h.nodes {
        assert_eq!(listed(node.addr), expected, "through {}", node.name);
    }
    // Recall, through every node, as the one server answers.
    let texts = |got: &serde_json::Value| -> Vec<String> {
        got["memories"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["text"].as_str().unwrap().to_string())
            .collect()
    };
    let mut compared = 0;
    for q in 0..18 {
        let query: Vec<&str> = (0..1 + q % 3).map(|_| word()).collect();
        let scope = ["namespace", "agent", "session"][q % 3];
        let body = serde_json::json!({
            "query": query.join(" "),
            "k": 8,
            "scope": scope,
            "agent_id": format!("agent-{}", q % 2),
        })
        .to_string();
        let path = format!("/v1/sessions/s{}/recall", (5 * q) % SESSIONS);
        let (code, want, _) =
            harness::request(one.addr, "POST", &path, Some(&key), Some(&body), None).unwrap();
        assert_eq!(code, 200, "{want}");
        let node = h.nodes[q % NODES].addr;
        let (code, got, _) =
            harness::request(node, "POST", &path, Some(&key), Some(&body), None).unwrap();
        assert_eq!(code, 200, "{got}");
        assert_eq!(texts(&got), texts(&want), "query {q} {query:?} ({scope})");
        assert_eq!(got["context"], want["context"], "query {q}");
        compared += usize::from(!texts(&want).is_empty());
    }
    assert!(compared >= 12, "only {compared} recalls found anything");
    // The dashboard's overview and insights gather every partition's share: the one
    // server's census, record and recall counts, and recall counts in their order (ids
    // differ between the two, and so do the records tied at a count).
    let dash = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let seen = |addr| {
        use crate::common::site::{Site, cookie_of};
        let (overview, insights) = dash.block_on(async {
            let site = Site::at(addr);
            let login = site
                .post("/ui/login", None, &[("key", &key), ("next", "/")])
                .await;
            assert_eq!(login.status, 303, "{}", login.body);
            let cookie = cookie_of(&login);
            let overview = site.get("/", Some(&cookie)).await;
            let insights = site.get("/ui/insights?fresh=1", Some(&cookie)).await;
            assert_eq!((overview.status, insights.status), (200, 200));
            (overview.body, insights.body)
        });
        let start = overview
            .find(r#"<section aria-labelledby="ns-h">"#)
            .unwrap_or_else(|| panic!("no namespace section: {overview}"));
        let end = start + overview[start..].find("</section>").unwrap();
        let census = overview[start..end].to_string();
        // "From N records and M remembered recalls".
        let from: Vec<String> = insights[insights.find("From ").expect("the counts")..]
            .split_whitespace()
            .take(7)
            .map(str::to_string)
            .collect();
        let from = (from[1].clone(), from[4].clone());
        let times: Vec<String> = insights
            .match_indices(" times returned")
            .map(|(at, _)| {
                let before = &insights[..at];
                let digits = before.len()
                    - before
                        .chars()
                        .rev()
                        .take_while(char::is_ascii_digit)
                        .count();
                before[digits..].to_string()
            })
            .collect();
        (census, from, times)
    };
    let want = seen(one.addr);
    assert_eq!(
        want.1,
        ((SESSIONS * 12).to_string(), "18".to_string()),
        "{want:?}"
    );
    assert_eq!(want.2.len(), 20, "{want:?}");
    for node in &h.nodes {
        assert_eq!(seen(node.addr), want, "through {}", node.name);
    }
    // Feedback on a namespace-wide recall reaches each returned memory's partition.
    let body = r#"{"query":"deploy server database","k":10,"scope":"namespace"}"#;
    let (code, got, _) = harness::request(
        h.nodes[1].addr,
        "POST",
        "/v1/sessions/s3/recall",
        Some(&key),
        Some(body),
        None,
    )
    .unwrap();
    assert_eq!(code, 200, "{got}");
    let returned: Vec<String> = got["memories"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_string())
        .collect();
    let partitions: std::collections::BTreeSet<u16> = returned
        .iter()
        .map(|id| {
            let id: shadowbrain_runtime::MemoryId = id.parse().unwrap();
            shadowbrain_runtime::IdBlock::partition_of(id.0, PARTITIONS)
        })
        .collect();
    assert!(partitions.len() >= 2, "{partitions:?}");
    let feedback = format!(
        r#"{{"recall_id":"{}","outcome":"success"}}"#,
        got["recall_id"].as_str().unwrap()
    );
    let (code, got, _) = harness::request(
        h.nodes[2].addr,
        "POST",
        "/v1/sessions/s3/feedback",
        Some(&key),
        Some(&feedback),
        None,
    )
    .unwrap();
    assert_eq!(
        (code, got["updated"].as_u64()),
        (200, Some(returned.len() as u64)),
        "{got}"
    );
    for id in &returned {
        let (code, got, _) = harness::request(
            h.nodes[0].addr,
            "GET",
            &format!("/v1/memories/{id}"),
            Some(&key),
            None,
            None,
        )
        .unwrap();
        assert_eq!(code, 200, "{got}");
        assert_eq!(got["utility"]["successes"], 1, "{id}: {got}");
    }
    // A lesson proven in a session away from the namespace's home is promoted into the
    // pool there, and found by knowledge search through any node.
    let home = shadowbrain::cluster::session_partition(&ns, "_knowledge", PARTITIONS);
    let session = (0..100)
        .map(|i| format!("lesson-{i}"))
        .find(|s| shadowbrain::cluster::session_partition(&ns, s, PARTITIONS) != home)
        .unwrap();
    let lesson = "retry the bank gateway with exponential backoff and jitter";
    let events: Vec<serde_json::Value> = ["tried it", "it worked", "note for next time"]
        .iter()
        .map(|what| serde_json::json!({"kind": "observation", "text": format!("{what}: {lesson}"), "importance": 8}))
        .collect();
    let through = |i: usize, method: &str, path: &str, body: Option<&str>| {
        let (code, got, _) = harness::request(
            h.nodes[i % NODES].addr,
            method,
            path,
            Some(&key),
            body,
            None,
        )
        .unwrap();
        assert!((200..300).contains(&code), "{method} {path}: {code} {got}");
        got
    };
    let body = serde_json::json!({ "events": events }).to_string();
    through(
        0,
        "POST",
        &format!("/v1/sessions/{session}/events"),
        Some(&body),
    );
    let condensed = through(1, "POST", &format!("/v1/sessions/{session}/condense"), None);
    let condensed = condensed["memory_id"].as_str().unwrap().to_string();
    let feedback = format!(r#"{{"memory_ids":["{condensed}"],"outcome":"success"}}"#);
    through(
        2,
        "POST",
        &format!("/v1/sessions/{session}/feedback"),
        Some(&feedback),
    );
    let search = serde_json::json!({"query": lesson, "k": 5}).to_string();
    let waited = Instant::now();
    let knowledge = loop {
        let found = through(0, "POST", "/v1/knowledge/search", Some(&search));
        let lesson = found["memories"].as_array().and_then(|m| {
            m.iter()
                .find(|m| m["tier"] == "knowledge")
                .map(|m| (m["id"].as_str().unwrap().to_string(), m["sources"].clone()))
        });
        if let Some(lesson) = lesson {
            break lesson;
        }
        assert!(
            waited.elapsed() < Duration::from_secs(60),
            "the lesson was not promoted: {found}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let id: shadowbrain_runtime::MemoryId = knowledge.0.parse().unwrap();
    assert_eq!(
        shadowbrain_runtime::IdBlock::partition_of(id.0, PARTITIONS),
        home,
        "the pool is at the namespace's home"
    );
    assert_eq!(knowledge.1, serde_json::json!([condensed]));
    // The Python MCP SDK through a node: the handshake and listings at the home, each tool
    // call where its session lives, recall and feedback across partitions.
    if let Some(python) = python_sdk() {
        let url = format!("http://{}/mcp", h.nodes[1].addr);
        for answer in python_client(&python, &["http", &url, &key]) {
            assert_eq!(answer["tools"], 10, "{answer}");
            assert!(answer["recalled"].as_u64().unwrap() >= 1, "{answer}");
        }
    }
    // An MCP batch acting on two partitions is refused, saying what to do.
    let call = |session: &str| {
        format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"timeline","arguments":{{"session_id":"{session}"}}}}}}"#
        )
    };
    let other = (0..100)
        .map(|i| format!("s{i}"))
        .find(|s| {
            shadowbrain::cluster::session_partition(&ns, s, PARTITIONS)
                != shadowbrain::cluster::session_partition(&ns, "s0", PARTITIONS)
        })
        .unwrap();
    let batch = format!("[{},{}]", call("s0"), call(&other));
    let (code, got, _) = harness::request(
        h.nodes[0].addr,
        "POST",
        "/mcp",
        Some(&key),
        Some(&batch),
        None,
    )
    .unwrap();
    assert_eq!(
        (code, got["error"]["code"].as_str()),
        (400, Some("batch_spans_partitions")),
        "{got}"
    );
    // A node that would place by namespace is refused by this cluster.
    let config = std::fs::read_to_string(h.dir.path().join("node0.toml"))
        .unwrap()
        .replace("node = \"node0\"", "node = \"node9\"")
        .replace("placement = \"session\"", "placement = \"namespace\"");
    assert!(config.contains("node9") && config.contains("\"namespace\""));
    let path = h.dir.path().join("node9.toml");
    std::fs::write(&path, config).unwrap();
    // Node 9 started: it stops, and what it said.
    let refused = |h: &Harness| {
        let mut other = serve::Serve::new(bin)
            .cluster()
            .data(h.dir.path().join("node9"))
            .config_file(&path)
            .envs(h.node_env(0))
            .spawn();
        let stopped = other.exit_within(Duration::from_secs(60));
        assert!(stopped.is_some_and(|s| !s.success()), "{}", other.said());
        other.said()
    };
    let said = refused(&h);
    assert!(
        said.contains("placement = \"session\"") && said.contains("another prefix"),
        "{said}"
    );
    // So is it when the whole cluster stopped and no heartbeat is left to disagree with:
    // the layout the cluster was made with is recorded.
    let mut h = h;
    h.stop_nodes();
    std::thread::sleep(2 * LEASE_TTL + Duration::from_secs(1));
    let said = refused(&h);
    assert!(
        said.contains(&format!(
            "was made with partitions = {PARTITIONS} and placement = \"session\""
        )),
        "{said}"
    );
    drop(h);
    if local {
        harness::use_embedder(Some("hash"));
    }
}
