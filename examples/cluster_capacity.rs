//! What each node holds as a cluster grows (docs/benchmarks.md, "Cluster"): the same
//! records written to one embedded `serve` (the anchor), to three `serve --cluster` nodes
//! and to six, each cluster keeping `--copies` copies of each of `--partitions` partitions
//! over three NATS servers, all on this machine's loopback, secured as `docs/cluster/` says.
//!
//! ```text
//! cargo build --release && scripts/install-nats-server
//! cargo run --release --example cluster_capacity -- --records 200000
//! ```
//!
//! The records go to 16 tenants (namespaces, `--tenants`) and 10,000 sessions in all. A
//! namespace lives on one partition, so the tenants spread the data over the partitions;
//! with `--placement session` (`[cluster] placement`) sessions are spread, and one
//! namespace (`--tenants 1`) uses every partition. Once every copy has
//! applied its partition's log and built its indexes (a standby builds every 30 s), it
//! reports each node's data directory on disk, its resident memory and the partitions it
//! keeps, beside the anchor's. Then, once the streams are truncated beneath their snapshots
//! (`[cluster] snapshot_tail_mib`, default 64), one more node with an empty data directory
//! joins the larger cluster: the time until it owns its share (its partitions' ownership
//! moves only to a caught-up copy) and until every copy it keeps has caught up, each
//! restored from a snapshot and the stream's tail, with where its time went per copy (when
//! restored, how long the restore took and its size, when caught up, when owning; read
//! from the node's log). `--join-only` runs the larger cluster and the join alone. With
//! `--history 10`, the joined node then leaves, ten times the fill's log bytes more are
//! written as records that the forgetting policy archives and purges within seconds
//! (their log entries truncated away beneath new snapshots, while the records the fill
//! wrote, of a protected kind, stay), and it joins again, empty: the join after the history
//! beside the one before it. Progress on stderr; last, one JSON line.

#[path = "../tests/cluster_harness.rs"]
mod harness;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::{CommandFactory, Parser};
use harness::{Harness, Security, Shape, disk_bytes, rss_bytes};
use serde_json::{Value, json};
use shadowbrain_test_support::serve::Served;

/// What each node of a three- and a six-node cluster holds, against one embedded `serve`
/// holding the same records; one JSON line, last.
#[derive(Parser, Clone)]
#[command(name = "cluster_capacity")]
struct Args {
    /// Records written to each setup.
    #[arg(long, default_value_t = 200_000)]
    records: u64,
    /// Sessions the records are spread over.
    #[arg(long, default_value_t = 10_000)]
    sessions: u64,
    /// Nodes of the larger cluster.
    #[arg(long, default_value_t = 6)]
    nodes: usize,
    /// Partitions of each cluster.
    #[arg(long, default_value_t = 32)]
    partitions: u16,
    /// Copies of each partition (`[cluster] copies`).
    #[arg(long, default_value_t = 3)]
    copies: usize,
    /// What a partition holds (`[cluster] placement`): `namespace` or `session`.
    #[arg(long, default_value = "namespace", value_parser = ["namespace", "session"])]
    placement: String,
    /// Namespaces the records are written to (one: a single organisation, which only
    /// `--placement session` spreads over the partitions).
    #[arg(long, default_value_t = harness::TENANTS)]
    tenants: usize,
    /// Namespace-wide recalls compared between the anchor and each cluster.
    #[arg(long, default_value_t = 40)]
    compare: usize,
    /// Only the larger cluster and the cold join (no anchor, no three-node cluster): the
    /// join's figures alone, in half the time.
    #[arg(long)]
    join_only: bool,
    /// After the cold join, the joined node leaves, records that fade within seconds are
    /// written until the nodes have appended this many times the fill's log bytes more
    /// (history the snapshots truncate away; the nodes' disk before and after says how
    /// much of it the sweeps had not purged yet),
    /// and the node joins again with an empty data directory: the join before and after
    /// the history, in the same run. 0: one join.
    #[arg(long, default_value_t = 0.0)]
    history: f64,
    /// Each history record carries this many KiB of structured content (stored and logged,
    /// not embedded or indexed): the history's log bytes with fewer records, for a machine
    /// that cannot write ten times a large fill's records. 0: text only, as the fill's.
    #[arg(long, default_value_t = 0)]
    history_content_kib: usize,
    /// The history's records per second, all writers together (0: as fast as the nodes
    /// take them).
    #[arg(long, default_value_t = 0)]
    history_rate: u64,
    /// The `shadowbrain` binary the nodes run.
    #[arg(long, value_name = "PATH",
          default_value_os_t = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/release/shadowbrain"))]
    bin: PathBuf,
}

fn args() -> Args {
    let a = Args::parse();
    let invalid = |message: String| -> ! {
        Args::command()
            .error(clap::error::ErrorKind::ValueValidation, message)
            .exit()
    };
    if !a.bin.is_file() {
        invalid(format!(
            "{} is missing: run `cargo build --release` first (or pass --bin)",
            a.bin.display()
        ));
    }
    if a.nodes < 3 {
        invalid("--nodes must be at least 3 (the smaller cluster has three)".into());
    }
    if !(1..=harness::TENANTS).contains(&a.tenants) {
        invalid(format!("--tenants must be 1 to {}", harness::TENANTS));
    }
    if a.records < a.sessions {
        invalid("--records must be at least --sessions".into());
    }
    a
}

/// How long after the last write every standby has built its indexes: a standby builds
/// at the latest 30 s after its oldest unbuilt change.
const BUILT_AFTER: Duration = Duration::from_secs(35);

/// The anchor: one embedded `serve` holding the same records, kept running (with its
/// directory) for the comparison of rankings.
fn embedded(a: &Args) -> (Value, tempfile::TempDir, Served) {
    let (dir, served) = harness::embedded_serve(&a.bin);
    let started = Instant::now();
    harness::fill(&[served.addr], a.records, a.tenants, a.sessions);
    let fill_secs = started.elapsed().as_secs_f64();
    std::thread::sleep(BUILT_AFTER);
    let out = json!({
        "disk_bytes": disk_bytes(&served.data),
        "rss_bytes": rss_bytes(served.pid()),
        "fill_secs": fill_secs,
    });
    eprintln!("embedded: {out}");
    (out, dir, served)
}

/// `queries` namespace-wide recalls of the first tenant (k = 10), asked of the anchor and
/// of a cluster holding the same records (through its nodes in turn): how many rank the
/// same records in the same order, and the mean share of the anchor's ten the cluster
/// returned. A scope past the vector index's exact threshold is searched approximately
/// on both sides, by one index there and by each partition's here, so only exact search
/// promises the same ranking (docs/cluster-placement.md).
fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

fn compare(anchor: SocketAddr, nodes: &[SocketAddr], queries: usize) -> Value {
    let (_, key) = harness::keys()[0].clone();
    let words = harness::BULK_WORDS;
    let (mut identical, mut overlap, mut asked) = (0, 0.0, 0);
    let (mut anchor_ms, mut cluster_ms) = (Vec::new(), Vec::new());
    for q in 0..queries {
        let query: Vec<&str> = (0..2 + q % 2)
            .map(|k| words[(q * 7 + k * 13) % words.len()])
            .collect();
        let body = json!({"query": query.join(" "), "k": 10, "scope": "namespace"}).to_string();
        let path = format!("/v1/sessions/bulk-0-{q}/recall");
        let texts = |addr, took: &mut Vec<f64>| -> Vec<String> {
            // A partition moving (a lease lost under this load) answers 503 meanwhile.
            let started = Instant::now();
            let got = loop {
                let (code, got, _) = harness::request_within(
                    addr,
                    "POST",
                    &path,
                    Some(&key),
                    Some(&body),
                    None,
                    Duration::from_secs(120),
                )
                .expect("a recall is answered");
                match code {
                    200 => break got,
                    503 if started.elapsed() < Duration::from_secs(120) => {
                        std::thread::sleep(Duration::from_millis(500))
                    }
                    _ => panic!("a recall answered {code}: {got}"),
                }
            };
            took.push(started.elapsed().as_secs_f64() * 1000.0);
            let got: Value = serde_json::from_str(&got).unwrap_or(Value::Null);
            got["memories"]
                .as_array()
                .map(|m| {
                    m.iter()
                        .map(|m| m["text"].as_str().unwrap_or_default().to_string())
                        .collect()
                })
                .unwrap_or_default()
        };
        let want = texts(anchor, &mut anchor_ms);
        let got = texts(nodes[q % nodes.len()], &mut cluster_ms);
        if want.is_empty() {
            continue;
        }
        asked += 1;
        identical += usize::from(got == want);
        overlap += want.iter().filter(|t| got.contains(t)).count() as f64 / want.len() as f64;
    }
    let out = json!({
        "queries": asked,
        "identical": identical,
        "mean_overlap_at_10": if asked > 0 { overlap / asked as f64 } else { 0.0 },
        "anchor_ms_median": median(&mut anchor_ms),
        "cluster_ms_median": median(&mut cluster_ms),
    });
    eprintln!("rankings against the anchor: {out}");
    out
}

/// A cluster of `nodes` nodes holding the records: each node's disk, memory and copies;
/// with `join`, then a node joining it with an empty data directory.
fn cluster(a: &Args, nats: &Path, nodes: usize, join: bool, anchor: Option<SocketAddr>) -> Value {
    let shape = Shape {
        nodes: nodes + usize::from(join),
        started: nodes,
        copies: a.copies,
        partitions: a.partitions,
        placement: if a.placement == "session" {
            "session"
        } else {
            "namespace"
        },
    };
    // With a history to write, its records fade by policy; the fill's are protected.
    let policy = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(policy.path(), HISTORY_POLICY).unwrap();
    let policy_path = policy.path().to_str().unwrap().to_string();
    let args: &[&str] = if a.history > 0.0 && join {
        &["--policy", &policy_path]
    } else {
        &[]
    };
    let h = Harness::start_shaped(Security::Secured, nats, &a.bin, &[], args, shape);
    h.wait_copies_settled(Duration::from_secs(120));
    let started = Instant::now();
    harness::fill(&h.alive_nodes(), a.records, a.tenants, a.sessions);
    let fill_secs = started.elapsed().as_secs_f64();
    let tokio = tokio::runtime::Runtime::new().unwrap();
    let ends = tokio.block_on(harness::log_ends(&h.nats_access(), a.partitions));
    let waited = Instant::now();
    while !(0..nodes).all(|i| h.caught_up(i, &ends)) {
        assert!(
            waited.elapsed() < Duration::from_secs(1800),
            "the standbys did not catch up"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    std::thread::sleep(BUILT_AFTER);
    h.wait_copies_settled(Duration::from_secs(120));
    let (kept, _) = h.copies();
    let mut per_node = Vec::new();
    for (i, n) in h.nodes.iter().enumerate().take(nodes) {
        let partitions: Vec<u16> = kept
            .iter()
            .filter(|(_, holders)| holders.contains(&n.name))
            .map(|(p, _)| *p)
            .collect();
        per_node.push(json!({
            "node": n.name,
            "disk_bytes": disk_bytes(&n.data),
            "rss_bytes": rss_bytes(h.node_pid(i)),
            "partitions_kept": partitions.len(),
        }));
    }
    let entries: BTreeMap<u16, u64> = ends;
    let fill_log_bytes = log_bytes(&h);
    let fill_log_entries = log_counter(&h, "shadowbrain_cluster_log_entries");
    let rankings = anchor.map(|anchor| compare(anchor, &h.alive_nodes(), a.compare));
    let mut after_history = Value::Null;
    let joined = join.then(|| {
        let (first, mut served) = cold_join(&h, a, nodes, &tokio);
        if a.history <= 0.0 {
            served.kill();
            return first;
        }
        // It leaves as a node does (handing its partitions and copies on), and its
        // data directory goes: the second join starts as empty as the first.
        let termed = std::process::Command::new("kill")
            .args(["-TERM", &served.pid().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(termed, "the joined node could not be told to leave");
        assert!(
            served.exit_within(Duration::from_secs(120)).is_some(),
            "the joined node did not leave"
        );
        std::fs::remove_dir_all(&h.nodes[nodes].data).unwrap();
        h.wait_copies_settled(Duration::from_secs(300));
        let history = churn(&h, a, fill_log_bytes);
        let (second, served) = cold_join(&h, a, nodes, &tokio);
        served.kill();
        after_history = json!({ "history": history, "cold_join": second });
        first
    });
    let out = json!({
        "nodes": nodes,
        "copies": a.copies,
        "partitions": a.partitions,
        "fill_secs": fill_secs,
        "log_entries": entries.values().sum::<u64>(),
        "per_node": per_node,
        "log_bytes_after_fill": fill_log_bytes,
        "log_entries_after_fill": fill_log_entries,
        "rankings": rankings,
        "cold_join": joined,
        "after_history": after_history,
    });
    eprintln!("{nodes} nodes: {out}");
    out
}

/// Bytes of log entries the live nodes have appended since they started
/// (`cluster_log_bytes` in each node's `/metrics`, summed).
fn log_bytes(h: &Harness) -> u64 {
    log_counter(h, "shadowbrain_cluster_log_bytes")
}

/// A log counter of every live node's `/metrics` (`name`'s lines), summed.
fn log_counter(h: &Harness, name: &str) -> u64 {
    let mut sum = 0.0;
    for addr in h.alive_nodes() {
        let (code, text, _) =
            harness::request_text(addr, "GET", "/metrics", Some(harness::ADMIN), None, None)
                .expect("a node answers /metrics");
        assert_eq!(code, 200, "{text}");
        sum += text
            .lines()
            .filter(|l| l.starts_with(name))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>();
    }
    sum as u64
}

/// The policy of a run with a history: the default's, but records of any kind but the
/// fill's (`observation`) fade within seconds — archived once half as strong, purged a
/// second later, a sweep every five seconds — so the history's records come and go while
/// the fill's stay.
const HISTORY_POLICY: &str = r#"name = "history-fades"

[forgetting]
half_life = "5s"
archive_below = 0.5
purge_archived_after = "1s"
protect_kinds = ["observation"]
interval = "5s"
"#;

/// Records of a kind [`HISTORY_POLICY`] lets fade, written to every tenant (requests of
/// 100, as the fill's, or of about 512 KiB with `--history-content-kib`, by eight writers
/// at `--history-rate` in all) until the nodes have appended `--history` times
/// `fill_bytes` more to the logs: history that the snapshots truncate away. Written
/// faster than the sweeps purge them, they accumulate meanwhile: the nodes' disk before
/// and after is reported.
fn churn(h: &Harness, a: &Args, fill_bytes: u64) -> Value {
    // Requests of 100 records, or of about 512 KiB with content (a commit group is one log
    // entry, within a NATS message).
    let batch: u64 = match a.history_content_kib {
        0 => 100,
        kib => (512 / kib as u64).clamp(1, 100),
    };
    // The content of each history record: `kib` KiB of words, the same for every record
    // (what the log and the stores carry is what counts here).
    let content: String = match a.history_content_kib {
        0 => String::new(),
        kib => {
            let words = harness::bulk_words(0, 0);
            let mut blob = String::with_capacity(kib * 1024);
            while blob.len() < kib * 1024 {
                blob.push_str(&words);
                blob.push(' ');
            }
            blob.truncate(kib * 1024);
            format!(r#","content":{{"notes":"{blob}"}}"#)
        }
    };
    let content = std::sync::Arc::new(content);
    // Each writer's share of the pace: the time its `n`th request may start.
    let per_writer = a.history_rate as f64 / 8.0;
    let started = Instant::now();
    let before = log_bytes(h);
    let entries_before = log_counter(h, "shadowbrain_cluster_log_entries");
    let target = (a.history * fill_bytes as f64) as u64;
    let nodes = h.alive_nodes();
    let disk = || -> u64 {
        (0..h.nodes.len())
            .filter(|&i| h.nodes[i].served.is_some())
            .map(|i| disk_bytes(&h.nodes[i].data))
            .sum()
    };
    let disk_before = disk();
    eprintln!(
        "history: records that fade, {batch} a request ({} KiB of content each; {}), until \
         {target} more log bytes are appended",
        a.history_content_kib,
        match a.history_rate {
            0 => "unpaced".to_string(),
            r => format!("{r} records/s"),
        }
    );
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let tenants = a.tenants;
    let writers: Vec<_> = (0..8)
        .map(|w| {
            let (done, nodes, content) = (done.clone(), nodes.clone(), content.clone());
            std::thread::spawn(move || {
                let keys = harness::keys();
                let mut written = 0u64;
                let mut n = 0u64;
                while !done.load(std::sync::atomic::Ordering::SeqCst) {
                    if per_writer > 0.0 {
                        let due = Duration::from_secs_f64((n * batch) as f64 / per_writer);
                        if let Some(wait) = due.checked_sub(started.elapsed()) {
                            std::thread::sleep(wait);
                        }
                    }
                    let t = (w + 8 * n as usize) % tenants;
                    let key = &keys[t].1;
                    let first = ((w as u64) << 40) | (n * batch);
                    let events: Vec<String> = (first..first + batch)
                        .map(|i| {
                            format!(
                                r#"{{"kind":"passing","text":"passing {t} record {i}: {} about topic {}"{content}}}"#,
                                harness::bulk_words(t, i),
                                i % 997
                            )
                        })
                        .collect();
                    let body = format!(r#"{{"events":[{}]}}"#, events.join(","));
                    let path = format!("/v1/sessions/passing-{t}-{w}/events");
                    let addr = nodes[n as usize % nodes.len()];
                    match harness::request(addr, "POST", &path, Some(key), Some(&body), None) {
                        Ok((201, _, _)) => written += batch,
                        Ok((503, _, _)) | Err(_) => std::thread::sleep(Duration::from_millis(200)),
                        Ok((code, got, _)) => panic!("a history write answered {code}: {got}"),
                    }
                    n += 1;
                }
                written
            })
        })
        .collect();
    let mut reported = Instant::now();
    while log_bytes(h) - before < target {
        std::thread::sleep(Duration::from_secs(1));
        if reported.elapsed() >= Duration::from_secs(30) {
            reported = Instant::now();
            eprintln!(
                "history: {} log bytes appended after {:.0} s",
                log_bytes(h) - before,
                started.elapsed().as_secs_f64()
            );
        }
    }
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let records: u64 = writers.into_iter().map(|w| w.join().unwrap()).sum();
    let appended = log_bytes(h) - before;
    json!({
        "log_entries_appended": log_counter(h, "shadowbrain_cluster_log_entries") - entries_before,
        "records_written": records,
        "content_kib_per_record": a.history_content_kib,
        "records_per_second_asked": a.history_rate,
        "log_bytes_appended": appended,
        "times_the_fill": appended as f64 / fill_bytes.max(1) as f64,
        "secs": started.elapsed().as_secs_f64(),
        "nodes_disk_bytes_before": disk_before,
        "nodes_disk_bytes_after": disk(),
    })
}

/// Node `i`, configured but not started, joins with an empty data directory once the
/// streams are truncated beneath their snapshots: how long until it owns its share, and
/// until every copy it keeps has caught up (and the node, still running).
fn cold_join(h: &Harness, a: &Args, i: usize, tokio: &tokio::runtime::Runtime) -> (Value, Served) {
    let access = h.nats_access();
    let tail = 64 * 1024 * 1024;
    let waited = Instant::now();
    let spans = loop {
        let spans = tokio.block_on(harness::log_spans(&access, a.partitions));
        if spans.values().all(|(_, _, bytes)| *bytes < tail) {
            break spans;
        }
        assert!(
            waited.elapsed() < Duration::from_secs(600),
            "the streams were not truncated beneath snapshots: {spans:?}"
        );
        std::thread::sleep(Duration::from_secs(1));
    };
    let snapshots = tokio.block_on(harness::snapshot_positions(&access, a.partitions));
    let truncated: u64 = spans
        .values()
        .map(|(first, _, _)| first.saturating_sub(1))
        .sum();
    let tail_entries: u64 = spans
        .values()
        .map(|(first, last, _)| (last + 1).saturating_sub(*first))
        .sum();
    let tail_bytes: u64 = spans.values().map(|(_, _, b)| *b).sum();
    eprintln!(
        "streams truncated beneath {} snapshots: {truncated} entries gone, {tail_entries} left ({tail_bytes} B)",
        snapshots.len()
    );
    let ends = tokio.block_on(harness::log_ends(&access, a.partitions));
    let started = Instant::now();
    let wall = std::time::SystemTime::now();
    // Started like the others (its keys, its config), with an empty data directory.
    let node = &h.nodes[i];
    assert!(!node.data.exists());
    let mut served = node.serve.clone().spawn();
    served
        .wait_ready(Duration::from_secs(120))
        .expect("the joining node starts");
    let ready = started.elapsed();
    let mut caught = None;
    let mut owning = None;
    let status = |h: &Harness| -> Option<Value> {
        let (code, body, _) = harness::request(
            h.nodes[i].addr,
            "GET",
            "/cluster",
            Some(harness::ADMIN),
            None,
            None,
        )
        .ok()?;
        (code == 200).then_some(body)
    };
    while caught.is_none() || owning.is_none() {
        assert!(
            started.elapsed() < Duration::from_secs(1800),
            "the joining node did not catch up"
        );
        if let Some(s) = status(h) {
            let parts = s["partitions"].as_array().unwrap();
            let kept: Vec<&Value> = parts.iter().filter(|p| p["role"] != "none").collect();
            let members: Vec<String> = s["members"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| m.as_str().unwrap().to_string())
                .collect();
            let name = &h.nodes[i].name;
            let share: Vec<u16> = (0..a.partitions)
                .filter(|p| shadowbrain::cluster::rendezvous(*p, &members) == Some(name))
                .collect();
            let all_caught = !kept.is_empty()
                && members.contains(name)
                && kept.iter().all(|p| {
                    p["role"] == "owner"
                        || p["applied"].as_u64().unwrap_or(0)
                            >= ends[&(p["partition"].as_u64().unwrap() as u16)]
                });
            if caught.is_none() && all_caught {
                caught = Some((started.elapsed(), kept.len()));
            }
            let owned: usize = parts.iter().filter(|p| p["role"] == "owner").count();
            if owning.is_none() && members.contains(name) && owned >= share.len() {
                owning = Some((started.elapsed(), owned));
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let (caught_up, kept) = caught.unwrap();
    let (owning_after, owned) = owning.unwrap();
    let disk = disk_bytes(&h.nodes[i].data);
    let log = std::fs::read_to_string(h.dir.path().join(format!("{}.log", h.nodes[i].name)))
        .unwrap_or_default();
    let phases = phases(&log, wall);
    eprintln!("cold join, per partition (seconds after the start): {phases}");
    eprintln!(
        "cold join: ready after {:.1} s, owning its {owned} partitions after {:.1} s, its {kept} copies caught up after {:.1} s ({disk} B on disk)",
        ready.as_secs_f64(),
        owning_after.as_secs_f64(),
        caught_up.as_secs_f64()
    );
    let out = json!({
        "snapshots": snapshots.len(),
        "entries_truncated": truncated,
        "tail_entries": tail_entries,
        "tail_bytes": tail_bytes,
        "ready_secs": ready.as_secs_f64(),
        "owning_secs": owning_after.as_secs_f64(),
        "partitions_owned": owned,
        "caught_up_secs": caught_up.as_secs_f64(),
        "copies_kept": kept,
        "disk_bytes": disk,
        "phases": phases,
    });
    (out, served)
}

/// Where a joining node's time went, from its log: per partition, when its snapshot was
/// restored (and how long that took, and its size), when its standby caught up with the
/// stream and when it began owning the partition, in seconds after `start`.
fn phases(log: &str, start: std::time::SystemTime) -> Value {
    let mut parts: BTreeMap<u64, serde_json::Map<String, Value>> = BTreeMap::new();
    let field = |line: &str, name: &str| -> Option<u64> {
        let at = line.find(&format!(" {name}="))? + name.len() + 2;
        line[at..]
            .split(|c: char| !c.is_ascii_digit())
            .next()?
            .parse()
            .ok()
    };
    for line in log.lines() {
        let phase = [
            ("restored the partition's latest snapshot", "restored"),
            ("the standby caught up with the stream", "caught_up"),
            ("owning the partition", "owning"),
        ]
        .into_iter()
        .find(|(said, _)| line.contains(said));
        let (Some((_, phase)), Some(p)) = (phase, field(line, "partition")) else {
            continue;
        };
        let Some(at) = line
            .split_whitespace()
            .next()
            .and_then(|t| humantime::parse_rfc3339_weak(t).ok())
            .and_then(|t| t.duration_since(start).ok())
        else {
            continue;
        };
        let entry = parts.entry(p).or_default();
        entry.insert(format!("{phase}_secs"), json!(at.as_secs_f64()));
        if phase == "restored" {
            entry.insert("restore_ms".into(), json!(field(line, "took_ms")));
            entry.insert("restore_bytes".into(), json!(field(line, "bytes")));
        }
    }
    json!(parts)
}

fn main() {
    let a = args();
    let Some(nats) = harness::nats_server() else {
        std::process::exit(2);
    };
    eprintln!(
        "{} records over {} tenants and {} sessions; clusters of 3 and {} nodes, {} partitions, {} copies, placed by {}",
        a.records, a.tenants, a.sessions, a.nodes, a.partitions, a.copies, a.placement
    );
    let (anchor, served, three) = match a.join_only {
        true => (Value::Null, None, Value::Null),
        false => {
            let (anchor, dir, served) = embedded(&a);
            let three = cluster(&a, &nats, 3, false, Some(served.addr));
            (anchor, Some((dir, served)), three)
        }
    };
    let many = cluster(&a, &nats, a.nodes, true, served.as_ref().map(|s| s.1.addr));
    if let Some((_dir, served)) = served {
        served.kill();
    }
    let line = json!({
        "records": a.records,
        "sessions": a.sessions,
        "tenants": a.tenants,
        "placement": a.placement,
        "embedded": anchor,
        "three_nodes": three,
        "more_nodes": many,
    });
    println!("{line}");
}
