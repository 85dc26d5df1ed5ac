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
//! The records go to 16 tenants (namespaces) and 10,000 sessions in all. A namespace lives
//! on one partition, so the tenants spread the data over the partitions. Once every copy has
//! applied its partition's log and built its indexes (a standby builds every 30 s), it
//! reports each node's data directory on disk, its resident memory and the partitions it
//! keeps, beside the anchor's. Progress on stderr; last, one JSON line.

#[path = "../tests/cluster_harness.rs"]
mod harness;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::{CommandFactory, Parser};
use harness::{Harness, Security, Shape, disk_bytes, keys, rss_bytes};
use serde_json::{Value, json};
use shadowbrain_test_support::serve::Serve;

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
    if a.records < a.sessions {
        invalid("--records must be at least --sessions".into());
    }
    a
}

/// How long after the last write every standby has built its indexes: a standby builds
/// at the latest 30 s after its oldest unbuilt change.
const BUILT_AFTER: Duration = Duration::from_secs(35);

/// The anchor: one embedded `serve` holding the same records.
fn embedded(a: &Args) -> Value {
    let dir = tempfile::tempdir().unwrap();
    let mut auth = String::new();
    for (ns, key) in keys() {
        auth.push_str(&format!(
            "[[auth.keys]]\nsha256 = \"{}\"\nnamespace = \"{ns}\"\n",
            harness::sha256_hex(&key)
        ));
    }
    let config = dir.path().join("serve.toml");
    std::fs::write(&config, format!("[embedder]\nkind = \"hash\"\n\n{auth}")).unwrap();
    let served = Serve::new(&a.bin)
        .data(dir.path().join("data"))
        .config_file(&config)
        .start();
    let started = Instant::now();
    harness::fill(&[served.addr], a.records, harness::TENANTS, a.sessions);
    let fill_secs = started.elapsed().as_secs_f64();
    std::thread::sleep(BUILT_AFTER);
    let out = json!({
        "disk_bytes": disk_bytes(&served.data),
        "rss_bytes": rss_bytes(served.pid()),
        "fill_secs": fill_secs,
    });
    eprintln!("embedded: {out}");
    served.kill();
    out
}

/// A cluster of `nodes` nodes holding the records: each node's disk, memory and copies.
fn cluster(a: &Args, nats: &Path, nodes: usize) -> Value {
    let shape = Shape {
        nodes,
        started: nodes,
        copies: a.copies,
        partitions: a.partitions,
    };
    let h = Harness::start_shaped(Security::Secured, nats, &a.bin, &[], &[], shape);
    h.wait_copies_settled(Duration::from_secs(120));
    let started = Instant::now();
    harness::fill(&h.alive_nodes(), a.records, harness::TENANTS, a.sessions);
    let fill_secs = started.elapsed().as_secs_f64();
    let tokio = tokio::runtime::Runtime::new().unwrap();
    let ends = tokio.block_on(harness::log_ends(&h.nats_access(), a.partitions));
    let waited = Instant::now();
    while !(0..nodes).all(|i| caught_up(&h, i, &ends)) {
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
    for (i, n) in h.nodes.iter().enumerate() {
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
    let out = json!({
        "nodes": nodes,
        "copies": a.copies,
        "partitions": a.partitions,
        "fill_secs": fill_secs,
        "log_entries": entries.values().sum::<u64>(),
        "per_node": per_node,
    });
    eprintln!("{nodes} nodes: {out}");
    out
}

/// Until every standby of node `i` has applied its partition's log to `ends`.
fn caught_up(h: &Harness, i: usize, ends: &BTreeMap<u16, u64>) -> bool {
    let Some(s) = h.status(i) else { return false };
    s["partitions"].as_array().unwrap().iter().all(|p| {
        let id = p["partition"].as_u64().unwrap() as u16;
        p["role"] == "owner"
            || p["role"] == "none"
            || p["applied"].as_u64().unwrap_or(0) >= ends[&id]
    })
}

fn main() {
    let a = args();
    let Some(nats) = harness::nats_server() else {
        std::process::exit(2);
    };
    eprintln!(
        "{} records over {} tenants and {} sessions; clusters of 3 and {} nodes, {} partitions, {} copies",
        a.records,
        harness::TENANTS,
        a.sessions,
        a.nodes,
        a.partitions,
        a.copies
    );
    let anchor = embedded(&a);
    let three = cluster(&a, &nats, 3);
    let many = cluster(&a, &nats, a.nodes);
    let line = json!({
        "records": a.records,
        "sessions": a.sessions,
        "embedded": anchor,
        "three_nodes": three,
        "more_nodes": many,
    });
    println!("{line}");
}
