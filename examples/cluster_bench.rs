//! What cluster mode costs (docs/benchmarks.md, "Cluster"), measured against its anchor in the same run:
//! the same fixed load on one embedded `serve` and on three `serve --cluster` nodes over
//! three NATS servers, all on this machine's loopback.
//!
//! ```text
//! cargo build --release && scripts/install-nats-server
//! cargo run --release --example cluster_bench -- --secs 30 --records 1000000
//! ```
//!
//! In the configuration users run, the local model (what `serve` embeds with once
//! `scripts/setup` installed it), at a load the model keeps up with, the cost alone:
//!
//! ```text
//! cargo run --release --example cluster_bench -- --embedder default --cost-only \
//!     --writers 4 --batch 1 --pace-ms 200 --secs 60
//! ```
//!
//! Each setup gets two seconds of the load first (a model loaded, caches warm); its CPU
//! time then counts from the load's start until every embedding is made and, in the
//! cluster, every copy has applied the log. The processes' CPU time with no load (20 s,
//! just before) is reported per second beside it, and what an event costs beyond it: at a
//! light load, what a cluster spends anyway (heartbeats, leases, consumers) is most of
//! what an event seems to cost.
//!
//! The cluster runs secured as `docs/cluster/` says (TLS, a NATS user per node, sealed
//! messages) and, for the cost of that, once more in plain text on loopback
//! (`insecure_loopback`) with the same load in the same run.
//!
//! Reports, for each: CPU time per acknowledged event (shadowbrain and NATS), disk bytes and
//! loopback bytes (NATS's own count, clients and routes) per event, and acknowledgement
//! latency p50/p99/p99.9; then the extra latency of a request entering at a node that does
//! not own its partition; the rate a standby catches up at after a restart; the failover
//! of big partitions and recall in them while their takers build what was not built; and a cold
//! rebuild: a node with an empty data directory joining a cluster that holds `--records`
//! events. Progress on stderr; last, one JSON line.

#[path = "../tests/cluster_harness.rs"]
mod harness;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::{CommandFactory, Parser};
use harness::{
    Harness, NODES, PARTITIONS, Security, Shape, Written, cpu_time, disk_bytes, keys, request,
};
use serde_json::{Value, json};
use shadowbrain_test_support::stats::percentile;

/// What cluster mode costs against one embedded `serve` under the same load, then
/// forwarding, catch-up, failover and a cold rebuild; one JSON line, last.
#[derive(Parser, Clone)]
#[command(name = "cluster_bench")]
struct Args {
    /// Seconds of load on each setup.
    #[arg(long, default_value_t = 30)]
    secs: u64,
    /// Writers, each in a tenant of its own.
    #[arg(long, default_value_t = 8)]
    writers: usize,
    /// Events per write.
    #[arg(long, default_value_t = 10)]
    batch: usize,
    /// Each writer's pause between writes, in ms.
    #[arg(long, value_name = "MS", default_value_t = 40)]
    pace_ms: u64,
    /// Records the cluster holds for the failover and the cold rebuild.
    #[arg(long, default_value_t = 1_000_000)]
    records: u64,
    /// The embedder every `serve` runs: `hash`, or `default` for `serve`'s own default
    /// (the local model once `scripts/setup` installed it: the configuration users run).
    #[arg(long, default_value = "hash", value_parser = ["hash", "default"])]
    embedder: String,
    /// Only what an event costs, embedded and on the secured cluster (no plain-text run,
    /// forwarding, catch-up, failover or cold rebuild): with `--embedder default`, where
    /// filling the cluster for the failover would take hours.
    #[arg(long)]
    cost_only: bool,
    /// Copies of each partition (`[cluster] copies`) in the `--cost-only` cluster: what a
    /// copy costs per event, 1 (no standby) to 3 (the default, every node).
    #[arg(long, requires = "cost_only", default_value_t = harness::COPIES as u8,
          value_parser = clap::value_parser!(u8).range(1..=3))]
    copies: u8,
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
    if a.writers == 0 || a.writers > harness::TENANTS {
        invalid(format!("--writers must be 1 to {}", harness::TENANTS));
    }
    if !a.bin.is_file() {
        invalid(format!(
            "{} is missing: run `cargo build --release` first (or pass --bin)",
            a.bin.display()
        ));
    }
    a
}

/// p50, p99 and p99.9 of `v` in ms, and its count; null when it is empty.
fn percentiles(mut v: Vec<Duration>) -> Value {
    v.sort();
    let ms = |q| percentile(&v, q).map(|d| d.as_secs_f64() * 1e3);
    let (Some(p50), Some(p99), Some(p999)) = (ms(0.5), ms(0.99), ms(0.999)) else {
        return Value::Null;
    };
    json!({"p50_ms": p50, "p99_ms": p99, "p999_ms": p999, "n": v.len()})
}

/// Runs the load for `secs` against `nodes`; returns the writers' records.
fn drive(nodes: Vec<SocketAddr>, a: &Args) -> Vec<Written> {
    let live = Arc::new(Mutex::new(nodes));
    let stop = Arc::new(AtomicBool::new(false));
    let writers = harness::load(
        live,
        stop.clone(),
        a.writers,
        Duration::from_millis(a.pace_ms),
        a.batch,
    );
    std::thread::sleep(Duration::from_secs(a.secs));
    stop.store(true, Ordering::SeqCst);
    writers.into_iter().map(|t| t.join().unwrap()).collect()
}

fn summary(written: &[Written]) -> (u64, Vec<Duration>) {
    let events = written.iter().map(|w| w.acked.len() as u64).sum();
    let lat = written
        .iter()
        .flat_map(|w| w.latencies.iter().copied())
        .collect();
    (events, lat)
}

/// Waits until no node at `addrs` has a record waiting for its embedding (the load's
/// embeddings are part of what it costs: with a model they are most of it); how long
/// that took after the load.
fn drained(addrs: &[SocketAddr]) -> Duration {
    let started = Instant::now();
    while !addrs.iter().all(|a| harness::enrich_backlog(*a) == Some(0)) {
        assert!(
            started.elapsed() < Duration::from_secs(1800),
            "the embeddings did not catch up"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    started.elapsed()
}

/// Two seconds of the load, its embeddings made: a model loaded, caches warm, before the
/// CPU time counts.
fn warm_up(addrs: &[SocketAddr], a: &Args) {
    drive(
        addrs.to_vec(),
        &Args {
            secs: 2,
            ..a.clone()
        },
    );
    drained(addrs);
}

/// How long the processes' CPU time is read with no load: what they spend anyway
/// (heartbeats, leases, consumers, timers), per second — at a light load, much of what an
/// event seems to cost.
const IDLE: Duration = Duration::from_secs(20);

/// CPU time per second that each of `cpu`'s readings grows by with no load, over [`IDLE`].
fn idle_rate<const N: usize>(cpu: impl Fn() -> [Duration; N]) -> [f64; N] {
    let before = cpu();
    std::thread::sleep(IDLE);
    let after = cpu();
    std::array::from_fn(|i| (after[i] - before[i]).as_secs_f64() / IDLE.as_secs_f64())
}

/// CPU µs per event beyond the idle rate, over `took`.
fn marginal(cpu: Duration, idle_per_s: f64, took: Duration, events: u64) -> f64 {
    (cpu.as_secs_f64() - idle_per_s * took.as_secs_f64()).max(0.0) * 1e6 / events as f64
}

/// The anchor: one embedded `serve`, the same keys, the same load.
fn embedded(a: &Args) -> Value {
    let (_dir, served) = harness::embedded_serve(&a.bin);
    warm_up(&[served.addr], a);
    let [idle] = idle_rate(|| [cpu_time(served.pid())]);
    let cpu0 = cpu_time(served.pid());
    let started = Instant::now();
    let written = drive(vec![served.addr], a);
    let drain = drained(&[served.addr]);
    let took = started.elapsed();
    let cpu = cpu_time(served.pid()) - cpu0;
    let (events, lat) = summary(&written);
    let disk = disk_bytes(&served.data);
    served.kill();
    eprintln!(
        "embedded: {events} events, {:.1} CPU-µs each",
        cpu.as_secs_f64() * 1e6 / events as f64
    );
    json!({
        "events": events,
        "events_per_s": events as f64 / a.secs as f64,
        "shadowbrain_cpu_us_per_event": cpu.as_secs_f64() * 1e6 / events as f64,
        "disk_bytes_per_event": disk as f64 / events as f64,
        "ack": percentiles(lat),
        "embeddings_drained_secs": drain.as_secs_f64(),
        "idle_cpu_us_per_s": idle * 1e6,
        "shadowbrain_marginal_cpu_us_per_event": marginal(cpu, idle, took, events),
    })
}

fn cluster(h: &Harness, a: &Args) -> Value {
    warm_up(&h.alive_nodes(), a);
    let (nodes, nats) = h.pids();
    let cpu = |pids: &[u32]| pids.iter().map(|p| cpu_time(*p)).sum::<Duration>();
    let [idle_nodes, idle_nats] = idle_rate(|| [cpu(&nodes), cpu(&nats)]);
    let started = Instant::now();
    let (n0, s0, b0) = (cpu(&nodes), cpu(&nats), h.nats_bytes());
    let disk0 = disk_bytes(h.dir.path());
    let written = drive(h.alive_nodes(), a);
    // Every embedding made and every copy caught up with the log, the embeddings' log
    // entries included: a standby's share of the cost is counted too.
    let drain = drained(&h.alive_nodes());
    let tokio = tokio::runtime::Runtime::new().unwrap();
    let ends = tokio.block_on(harness::log_ends(&h.nats_access(), PARTITIONS));
    let waited = Instant::now();
    while !(0..h.nodes.len()).all(|i| h.nodes[i].served.is_none() || h.caught_up(i, &ends)) {
        assert!(
            waited.elapsed() < Duration::from_secs(600),
            "the standbys did not catch up"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let drain = drain + waited.elapsed();
    let (n1, s1, b1) = (cpu(&nodes), cpu(&nats), h.nats_bytes());
    let took = started.elapsed();
    let (events, lat) = summary(&written);
    let disk = disk_bytes(h.dir.path()) - disk0;
    let per = |d: Duration| d.as_secs_f64() * 1e6 / events as f64;
    eprintln!(
        "cluster: {events} events, {:.1} CPU-µs each in the nodes, {:.1} in NATS",
        per(n1 - n0),
        per(s1 - s0)
    );
    json!({
        "events": events,
        "events_per_s": events as f64 / a.secs as f64,
        "shadowbrain_cpu_us_per_event": per(n1 - n0),
        "nats_cpu_us_per_event": per(s1 - s0),
        "disk_bytes_per_event": disk as f64 / events as f64,
        "loopback_bytes_per_event": (b1 - b0) as f64 / events as f64,
        "ack": percentiles(lat),
        "retried_attempts": written.iter().map(|w| w.failures.values().sum::<u64>()).sum::<u64>(),
        "embeddings_and_copies_drained_secs": drain.as_secs_f64(),
        "idle_cpu_us_per_s": idle_nodes * 1e6,
        "nats_idle_cpu_us_per_s": idle_nats * 1e6,
        "shadowbrain_marginal_cpu_us_per_event": marginal(n1 - n0, idle_nodes, took, events),
        "nats_marginal_cpu_us_per_event": marginal(s1 - s0, idle_nats, took, events),
    })
}

/// The same recall sent to the partition's owner and to another node, one at a time,
/// alternating.
fn non_owner_latency(h: &Harness) -> Value {
    let (ns, key) = keys().into_iter().next().unwrap();
    let p = shadowbrain::cluster::partition_of(&ns, PARTITIONS);
    let owners = h.owners();
    let owner = &owners[&p];
    let owner_i = h.nodes.iter().position(|n| &n.name == owner).unwrap();
    let other_i = (owner_i + 1) % NODES;
    let body = r#"{"query":"writer event"}"#;
    let path = "/v1/sessions/writer-0/recall";
    // Alternating, so both see the same state and the same machine.
    let (owner_addr, other_addr) = (h.nodes[owner_i].addr, h.nodes[other_i].addr);
    let (mut direct, mut forwarded) = (Vec::new(), Vec::new());
    for round in 0..600 {
        let (addr, into) = if round % 2 == 0 {
            (owner_addr, &mut direct)
        } else {
            (other_addr, &mut forwarded)
        };
        let t = Instant::now();
        let (code, _, _) = request(addr, "POST", path, Some(&key), Some(body), None).unwrap();
        assert_eq!(code, 200);
        into.push(t.elapsed());
    }
    let med = |mut v: Vec<Duration>| {
        v.sort();
        percentile(&v, 0.5).expect("300 recalls").as_secs_f64() * 1e3
    };
    let (d, f) = (med(direct.clone()), med(forwarded.clone()));
    eprintln!("recall at the owner {d:.2} ms, at another node {f:.2} ms (medians)");
    json!({"owner": percentiles(direct), "non_owner": percentiles(forwarded), "extra_p50_ms": f - d})
}

/// Recall right after the failover, in the partitions that moved, while their takers
/// build in the background what the standbys had not built (searched exactly meanwhile),
/// and after: the anchor is the same recalls once the indexes are built.
fn recall_after_takeover(h: &Harness, tenants: &[usize]) -> Value {
    let tenant_keys = keys();
    let body = r#"{"query":"bulk record about topic 123"}"#;
    // The partition's owner and how much of its indexes is not built yet.
    let state = |t: usize| -> Option<(SocketAddr, u64)> {
        let p = shadowbrain::cluster::partition_of(&tenant_keys[t].0, PARTITIONS);
        (0..NODES).find_map(|i| {
            let s = h.status(i)?;
            let part = s["partitions"]
                .as_array()?
                .iter()
                .find(|x| x["partition"].as_u64() == Some(u64::from(p)) && x["role"] == "owner")?;
            Some((h.nodes[i].addr, part["unbuilt"]["vectors"].as_u64()?))
        })
    };
    let started = Instant::now();
    let (mut building, mut built) = (Vec::new(), Vec::new());
    let (mut rounds, mut first_unbuilt) = (0, 0);
    let mut built_after: Option<f64> = None;
    while built.len() < 200 * tenants.len() && started.elapsed() < Duration::from_secs(900) {
        let mut all_built = true;
        for &t in tenants {
            let Some((addr, unbuilt)) = state(t) else {
                all_built = false;
                continue;
            };
            if rounds == 0 {
                first_unbuilt = first_unbuilt.max(unbuilt);
            }
            all_built &= unbuilt == 0;
            let path = format!("/v1/sessions/bulk-{t}-0/recall");
            for _ in 0..10 {
                let q = Instant::now();
                let (code, _, _) = request(
                    addr,
                    "POST",
                    &path,
                    Some(&tenant_keys[t].1),
                    Some(body),
                    None,
                )
                .unwrap();
                assert_eq!(code, 200);
                if unbuilt > 0 {
                    building.push(q.elapsed());
                } else {
                    built.push(q.elapsed());
                }
            }
        }
        if all_built && built_after.is_none() {
            built_after = Some(started.elapsed().as_secs_f64());
        }
        rounds += 1;
    }
    eprintln!(
        "recall after the takeover: {} while building (at most {first_unbuilt} changes unbuilt \
         at first, all built after {:.1} s), {} once built",
        percentiles(building.clone()),
        built_after.unwrap_or(f64::NAN),
        percentiles(built.clone())
    );
    json!({
        "unbuilt_at_first": first_unbuilt,
        "built_after_secs": built_after,
        "while_building": percentiles(building),
        "once_built": percentiles(built),
    })
}

fn main() {
    let a = args();
    let Some(nats) = harness::nats_server() else {
        std::process::exit(2);
    };
    eprintln!(
        "load: {} writers, {} events every {} ms each ({:.0} events/s offered), {} s",
        a.writers,
        a.batch,
        a.pace_ms,
        (a.writers * a.batch) as f64 * 1000.0 / a.pace_ms as f64,
        a.secs
    );
    harness::use_embedder(match a.embedder.as_str() {
        "default" => None,
        _ => Some("hash"),
    });
    let anchor = embedded(&a);
    if a.cost_only {
        eprintln!("cluster secured as docs/cluster/ says (TLS, an nkey per node, seals):");
        let shape = Shape {
            copies: usize::from(a.copies),
            ..Shape::default()
        };
        let h = Harness::start_shaped(Security::Secured, &nats, &a.bin, &[], &[], shape);
        let clustered = cluster(&h, &a);
        let line = json!({
            "load": {"writers": a.writers, "batch": a.batch, "pace_ms": a.pace_ms, "secs": a.secs},
            "embedder": a.embedder,
            "copies": a.copies,
            "embedded": anchor,
            "cluster": clustered,
        });
        println!("{line}");
        return;
    }
    eprintln!("cluster in plain text on loopback (insecure_loopback):");
    let plain = {
        let h = Harness::start_as(Security::InsecureLoopback, &nats, &a.bin, &[], &[]);
        cluster(&h, &a)
    };
    eprintln!("cluster secured as docs/cluster/ says (TLS, an nkey per node, seals):");
    let mut h = Harness::start(&nats, &a.bin, &[]);
    let clustered = cluster(&h, &a);
    let forwarding = non_owner_latency(&h);

    // Catch-up: a node down while 20 s of the load go on, then back.
    let tokio = tokio::runtime::Runtime::new().unwrap();
    let victim = NODES - 1;
    h.kill_node(victim);
    h.wait_settled(Duration::from_secs(60));
    let written = drive(
        h.alive_nodes(),
        &Args {
            secs: 20,
            ..a.clone()
        },
    );
    let behind: u64 = summary(&written).0;
    let ends = tokio.block_on(harness::log_ends(&h.nats_access(), PARTITIONS));
    h.start_node(victim);
    let back = Instant::now();
    while !h.caught_up(victim, &ends) {
        assert!(
            back.elapsed() < Duration::from_secs(600),
            "the restarted node did not catch up"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let catch_up = back.elapsed();
    eprintln!(
        "caught up with {behind} events in {:.1} s (process start included)",
        catch_up.as_secs_f64()
    );
    h.wait_settled(Duration::from_secs(60));

    // Cold rebuild: fill, then a node with an empty data directory joins.
    harness::fill(&h.alive_nodes(), a.records, 8, a.records / 5000);
    let ends = tokio.block_on(harness::log_ends(&h.nats_access(), PARTITIONS));
    let entries: u64 = ends.values().sum();
    // Failover with big partitions: the victim's partitions move to the others.
    let owned_before = h.owned()[victim];
    let victim_name = h.nodes[victim].name.clone();
    let owners = h.owners();
    let moved: Vec<usize> = (0..keys().len())
        .filter(|&t| {
            owners.get(&shadowbrain::cluster::partition_of(
                &keys()[t].0,
                PARTITIONS,
            )) == Some(&victim_name)
        })
        .collect();
    h.kill_node(victim);
    let killed = Instant::now();
    h.wait_settled(Duration::from_secs(1800));
    let failover = killed.elapsed();
    eprintln!(
        "failover of {owned_before} partitions ({} records over 8 namespaces, spread unevenly): {:.1} s",
        a.records,
        failover.as_secs_f64()
    );
    let after_takeover = recall_after_takeover(&h, &moved);
    std::fs::remove_dir_all(&h.nodes[victim].data).unwrap();
    h.start_node(victim);
    let cold = Instant::now();
    while !h.caught_up(victim, &ends) {
        assert!(
            cold.elapsed() < Duration::from_secs(3600),
            "the cold node did not catch up"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let rebuilt = cold.elapsed();
    h.wait_settled(Duration::from_secs(1800));
    let owned_by_cold = h.owned()[victim];
    let settled = cold.elapsed();
    eprintln!(
        "cold node: applied {entries} log entries ({} records) in {:.1} s; owning {owned_by_cold} partitions after {:.1} s",
        a.records,
        rebuilt.as_secs_f64(),
        settled.as_secs_f64()
    );
    let line = json!({
        "load": {"writers": a.writers, "batch": a.batch, "pace_ms": a.pace_ms, "secs": a.secs},
        "embedded": anchor,
        "cluster": clustered,
        "cluster_insecure_loopback": plain,
        "forwarding": forwarding,
        "catch_up": {"events": behind, "secs": catch_up.as_secs_f64(), "events_per_s": behind as f64 / catch_up.as_secs_f64()},
        "big_failover": {"partitions": owned_before, "records": a.records, "secs": failover.as_secs_f64()},
        "recall_after_takeover": after_takeover,
        "cold_rebuild": {"records": a.records, "log_entries": entries, "standby_secs": rebuilt.as_secs_f64(),
                         "records_per_s": a.records as f64 / rebuilt.as_secs_f64(),
                         "owning_partitions": owned_by_cold, "until_owning_secs": settled.as_secs_f64()},
    });
    println!("{line}");
}
