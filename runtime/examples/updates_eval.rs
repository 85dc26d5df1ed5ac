//! Facts that change, measured on BEAM and LoCoMo with the policy's `[updates]` section off
//! and on, in one run, on the same embedder. Each data set is ingested once with
//! `[updates] mode = "rules"`; "off" is the same store asked with `include_superseded`,
//! which ranks exactly as a store without detection would (detection changes no scored
//! component: it only adds validity, edges and, for repeats, strength, which the default
//! scoring weighs 0). `--off-run` also ingests each data set without the section, to check
//! that equality and to compare the cost of ingest, off against on.
//!
//! - BEAM's `knowledge_update` and `contradiction_resolution` questions: R@5, and
//!   "newest first @5" (the newest evidence message is in the top 5 and above every older
//!   evidence message), off against on;
//! - the share of BEAM's probed pairs the detector links: `updated_info` → `original_info`
//!   as `supersedes`, `first_statement` ↔ `second_statement` as either relation; and the
//!   share of the edges touching a probed record that are the probed pair (a lower bound of
//!   precision: other edges may be true updates nobody asked about);
//! - every overall figure at R@10 (BEAM abilities, LoCoMo categories 1–4), off against on;
//! - cost: process CPU and wall time of each ingest (acks, embedding, detection), and one
//!   detection pass over every BEAM record timed alone.
//!
//! The rules were tuned on the odd half of `runtime/tests/data/updates_pairs.jsonl` only;
//! neither data set here was looked at while writing them. Prints a table, then one JSON
//! line with every figure.
//!
//! ```text
//! scripts/install-model     # else the hash embedder is used, and said so
//! cargo run --release -p shadowbrain-runtime --example updates_eval -- \
//!     [--beam ../shared/data/beam/100K] [--locomo ../shared/data/locomo/locomo10.json] \
//!     [--embedder local|hash] [--off-run]
//! ```

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use clap::{Parser, ValueEnum};
use serde_json::{Value, json};
use shadowbrain_runtime::embed::{Embedder, EmbedderConfig, EmbedderKind, build_embedder};
use shadowbrain_runtime::eval::{self, Answer, Conversation, Ingested, Layout, Ranking, Report};
use shadowbrain_runtime::internals::{Mutation, Queue, Visit, WriteSet};
use shadowbrain_runtime::policy::Policy;
use shadowbrain_runtime::{MemoryId, Relation, Substrate, SubstrateOptions};

const GROUPS: [&str; 2] = ["knowledge_update", "contradiction_resolution"];

/// Facts that change: BEAM and LoCoMo with the policy's `[updates]` section off and on, in
/// one run; a table, then one JSON line.
#[derive(Parser)]
#[command(name = "updates_eval")]
struct Args {
    /// BEAM's 100K split (a directory).
    #[arg(long, value_name = "DIR", default_value_os_t = shared("beam/100K"))]
    beam: PathBuf,
    /// LoCoMo's locomo10.json.
    #[arg(long, value_name = "FILE", default_value_os_t = shared("locomo/locomo10.json"))]
    locomo: PathBuf,
    /// The embedder: the local model (the hash embedder when it is not installed) or hash.
    #[arg(long, value_enum, default_value_t = EmbedderArg::Local)]
    embedder: EmbedderArg,
    /// Also ingest each data set without the section: the equality check, and ingest's cost.
    #[arg(long)]
    off_run: bool,
}

/// `--embedder`.
#[derive(Clone, Copy, ValueEnum)]
enum EmbedderArg {
    Local,
    Hash,
}

/// A data set in `../shared/data`, beside the repository.
fn shared(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/data")
        .join(name)
}

/// Process CPU time (user + system), seconds.
fn cpu_seconds() -> f64 {
    // SAFETY: getrusage writes into the struct it is given, nothing else.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(u.ru_utime) + secs(u.ru_stime)
}

/// One data set ingested under one policy, and its answers.
struct Run {
    sub: Substrate,
    _dir: tempfile::TempDir,
    ingested: Ingested,
    report: Report,
    /// The same questions with `include_superseded`: the ranking without detection.
    as_off: Report,
    record_seconds: f64,
    ingest_seconds: f64,
    ingest_cpu: f64,
}

async fn run(
    conversations: &[Conversation],
    layout: Layout,
    policy: &str,
    embedder: &Arc<dyn Embedder>,
) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let sub = Substrate::open(
        dir.path(),
        SubstrateOptions {
            policy: Policy::from_toml("<updates_eval>", policy).unwrap(),
            embedder: Arc::clone(embedder),
            ..SubstrateOptions::default()
        },
    )
    .unwrap();
    let (started, cpu) = (Instant::now(), cpu_seconds());
    let mut recorded = None;
    let ingested = eval::ingest(&sub, conversations, |stage, _| {
        if stage == eval::Stage::Embedding && recorded.is_none() {
            recorded = Some(started.elapsed().as_secs_f64());
        }
    })
    .await
    .unwrap();
    let ingest_seconds = started.elapsed().as_secs_f64();
    let ingest_cpu = cpu_seconds() - cpu;
    sub.flush_indexes().unwrap();
    let report = eval::ask(
        &sub,
        conversations,
        &ingested,
        &[5, 10],
        layout.clone(),
        |_| {},
    )
    .await
    .unwrap();
    let as_off = eval::ask_with(
        &sub,
        conversations,
        &ingested,
        &[5, 10],
        layout,
        |r| r.include_superseded = true,
        |_| {},
    )
    .await
    .unwrap();
    Run {
        sub,
        _dir: dir,
        ingested,
        report,
        as_off,
        record_seconds: recorded.unwrap_or(ingest_seconds),
        ingest_seconds,
        ingest_cpu,
    }
}

/// Whether the newest evidence message (BEAM's ids grow with time) is in the top `k` and
/// above every older one.
fn newest_first(a: &Answer, k: usize) -> bool {
    let newest = a
        .evidence
        .iter()
        .max_by_key(|e| e.parse::<u64>().unwrap_or(0))
        .expect("questions have evidence");
    let rank = |e: &String| a.ranked.iter().position(|r| r == e);
    match rank(newest) {
        Some(r) if r < k => a
            .evidence
            .iter()
            .filter(|e| *e != newest)
            .all(|e| rank(e).is_none_or(|o| o > r)),
        _ => false,
    }
}

fn group_figures(report: &Report, group: &str) -> (usize, f64, f64) {
    let answers: Vec<&Answer> = report.answers.iter().filter(|a| a.group == group).collect();
    let n = answers.len().max(1) as f64;
    let r5 = answers
        .iter()
        .map(|a| a.recall_at(Ranking::Recall, 5))
        .sum::<f64>()
        / n;
    let nf = answers.iter().filter(|a| newest_first(a, 5)).count() as f64 / n;
    (answers.len(), r5, nf)
}

fn r10(report: &Report) -> f64 {
    report.headline(Ranking::Recall).recall[&10]
}

/// BEAM's probed pairs (older message ids, newer message ids) per conversation, by group.
fn probed_pairs(
    beam: &Path,
    conversations: &[Conversation],
) -> Vec<(usize, &'static str, Vec<u64>, Vec<u64>)> {
    let mut out = Vec::new();
    for (i, c) in conversations.iter().enumerate() {
        let path = beam
            .join(c.index.to_string())
            .join("probing_questions.json");
        let probing: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        let ids = |v: &Value| -> Vec<u64> {
            v.as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_u64)
                .collect()
        };
        for q in probing["knowledge_update"].as_array().into_iter().flatten() {
            let s = &q["source_chat_ids"];
            out.push((
                i,
                GROUPS[0],
                ids(&s["original_info"]),
                ids(&s["updated_info"]),
            ));
        }
        for q in probing["contradiction_resolution"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let s = &q["source_chat_ids"];
            out.push((
                i,
                GROUPS[1],
                ids(&s["first_statement"]),
                ids(&s["second_statement"]),
            ));
        }
    }
    out
}

/// Recall and the precision lower bound of the links against BEAM's probed pairs.
fn links(run: &Run, beam: &Path, conversations: &[Conversation]) -> Value {
    let edges = run.sub.store().edges("default", None).unwrap();
    let mut by_relation: HashMap<&str, usize> = HashMap::new();
    for e in &edges {
        *by_relation.entry(e.relation.as_str()).or_default() += 1;
    }
    let mut out = serde_json::Map::new();
    for group in GROUPS {
        let (mut pairs, mut linked) = (0, 0);
        let mut probed_records: HashSet<MemoryId> = HashSet::new();
        let mut pair_edges: HashSet<(MemoryId, MemoryId)> = HashSet::new();
        for (i, g, older, newer) in probed_pairs(beam, conversations) {
            if g != group {
                continue;
            }
            let turns = run.ingested.turns_of(i).unwrap();
            let record = |m: u64| {
                turns
                    .iter()
                    .find(|(_, t)| **t == m.to_string())
                    .map(|(id, _)| *id)
            };
            let older: Vec<MemoryId> = older.into_iter().filter_map(record).collect();
            let newer: Vec<MemoryId> = newer.into_iter().filter_map(record).collect();
            if older.is_empty() || newer.is_empty() {
                continue;
            }
            pairs += 1;
            probed_records.extend(older.iter().chain(&newer));
            for &o in &older {
                for &n in &newer {
                    pair_edges.insert((n, o));
                    pair_edges.insert((o, n));
                }
            }
            let fits = |e: &&shadowbrain_runtime::Edge| {
                let forward = newer.contains(&e.from) && older.contains(&e.to);
                let either = forward || (older.contains(&e.from) && newer.contains(&e.to));
                match group {
                    "knowledge_update" => e.relation == Relation::Supersedes && forward,
                    _ => {
                        either && matches!(e.relation, Relation::Supersedes | Relation::Contradicts)
                    }
                }
            };
            if edges.iter().any(|e| fits(&e)) {
                linked += 1;
            }
        }
        let touching: Vec<_> = edges
            .iter()
            .filter(|e| matches!(e.relation, Relation::Supersedes | Relation::Contradicts))
            .filter(|e| probed_records.contains(&e.from) || probed_records.contains(&e.to))
            .collect();
        let on_pair = touching
            .iter()
            .filter(|e| pair_edges.contains(&(e.from, e.to)))
            .count();
        out.insert(
            group.to_string(),
            json!({
                "pairs": pairs,
                "linked": linked,
                "recall": linked as f64 / pairs.max(1) as f64,
                "edges_touching_probed": touching.len(),
                "precision_lower_bound": on_pair as f64 / touching.len().max(1) as f64,
            }),
        );
    }
    out.insert("edges".into(), json!(by_relation));
    Value::Object(out)
}

/// A few supersedes edges with their texts, for a reader to judge.
fn samples(run: &Run, n: usize) -> Vec<String> {
    let store = run.sub.store();
    let edges = store.edges("default", None).unwrap();
    let short = |id: MemoryId| -> String {
        let t = store
            .get_light(id)
            .unwrap()
            .map(|r| r.text)
            .unwrap_or_default();
        t.chars().take(110).collect()
    };
    let wanted: Vec<_> = edges
        .iter()
        .filter(|e| e.relation == Relation::Supersedes)
        .collect();
    let step = (wanted.len() / n.max(1)).max(1);
    wanted
        .iter()
        .step_by(step)
        .take(n)
        .map(|e| {
            format!(
                "  {} ⇒ {}\n      over {}",
                e.from,
                short(e.from),
                short(e.to)
            )
        })
        .collect()
}

/// Queues every record again and times one detection pass over all of them.
fn detection_alone(run: &Run) -> (usize, f64) {
    let store = run.sub.store();
    let mut ids = Vec::new();
    store
        .for_each_id(|id| {
            ids.push(id);
            Ok(Visit::Continue)
        })
        .unwrap();
    let writes = WriteSet(
        ids.iter()
            .map(|&id| Mutation::Enqueue(Queue::Updates, id))
            .collect(),
    );
    store.write(writes).unwrap();
    let started = Instant::now();
    let round = run.sub.detect_all_updates().unwrap();
    (round.compared, started.elapsed().as_secs_f64())
}

#[tokio::main]
async fn main() {
    let a = Args::parse();
    let (beam_dir, locomo_path) = (a.beam, a.locomo);
    let hash = || {
        build_embedder(&EmbedderConfig {
            kind: EmbedderKind::Hash,
            ..EmbedderConfig::default()
        })
        .unwrap()
    };
    let embedder: Arc<dyn Embedder> = match a.embedder {
        EmbedderArg::Hash => hash(),
        EmbedderArg::Local => build_embedder(&EmbedderConfig {
            kind: EmbedderKind::Local,
            ..EmbedderConfig::default()
        })
        .unwrap_or_else(|e| {
            eprintln!("the local model is not installed ({e}); using the hash embedder");
            hash()
        }),
    };
    let on = "[updates]\nmode = \"rules\"\n";
    let beam = eval::beam::load(&beam_dir).expect("BEAM data (pass --beam DIR)");
    let locomo = eval::locomo::load(&locomo_path).expect("LoCoMo data (pass --locomo FILE)");
    let records = |c: &[Conversation]| c.iter().map(|c| c.turns.len()).sum::<usize>();
    eprintln!(
        "embedder {}; BEAM {} chats, {} records; LoCoMo {} conversations, {} records",
        embedder.name(),
        beam.len(),
        records(&beam),
        locomo.len(),
        records(&locomo)
    );
    // BEAM first, printed as soon as it is measured: with the local model its ingest
    // alone takes tens of minutes.
    let beam_on = run(&beam, eval::beam::LAYOUT, on, &embedder).await;
    println!("BEAM, {} (off → on):", embedder.name());
    let mut groups = serde_json::Map::new();
    for g in GROUPS {
        let (n, r5_off, nf_off) = group_figures(&beam_on.as_off, g);
        let (_, r5_on, nf_on) = group_figures(&beam_on.report, g);
        println!(
            "  {g:<26} n={n:<3} R@5 {r5_off:.4} → {r5_on:.4}   newest first @5 {nf_off:.4} → {nf_on:.4}"
        );
        groups.insert(
            g.into(),
            json!({"n": n, "r5_off": r5_off, "r5_on": r5_on,
                   "newest_first5_off": nf_off, "newest_first5_on": nf_on}),
        );
    }
    let halves = |r: &Report| {
        let [(a, b), (c, d)] = eval::beam::LAYOUT.halves;
        [
            r.split(Ranking::Recall, a, b).recall[&10],
            r.split(Ranking::Recall, c, d).recall[&10],
        ]
    };
    let (off, on_) = (&beam_on.as_off, &beam_on.report);
    println!(
        "  overall R@10 {:.4} → {:.4} (chats 1-10 {:.4} → {:.4}, 11-20 {:.4} → {:.4})",
        r10(off),
        r10(on_),
        halves(off)[0],
        halves(on_)[0],
        halves(off)[1],
        halves(on_)[1],
    );
    let linked = links(&beam_on, &beam_dir, &beam);
    println!("links against BEAM's probed pairs: {linked}");
    println!("a sample of supersedes edges (newer ⇒ over older):");
    for s in samples(&beam_on, 8) {
        println!("{s}");
    }
    let locomo_on = run(&locomo, eval::locomo::LAYOUT, on, &embedder).await;
    println!(
        "LoCoMo cats 1-4 R@10 {:.4} → {:.4}",
        r10(&locomo_on.as_off),
        r10(&locomo_on.report)
    );
    let (beam_off, locomo_off) = match a.off_run {
        true => (
            Some(run(&beam, eval::beam::LAYOUT, "", &embedder).await),
            Some(run(&locomo, eval::locomo::LAYOUT, "", &embedder).await),
        ),
        false => (None, None),
    };
    let cost = |r: &Run, n: usize| {
        json!({"record_s": r.record_seconds, "ingest_s": r.ingest_seconds,
               "cpu_s": r.ingest_cpu, "cpu_us_per_record": r.ingest_cpu * 1e6 / n as f64})
    };
    let mut off_runs = serde_json::Map::new();
    for (name, off, on, n) in [
        ("beam", &beam_off, &beam_on, records(&beam)),
        ("locomo", &locomo_off, &locomo_on, records(&locomo)),
    ] {
        let Some(off) = off else { continue };
        let same = r10(&off.report) == r10(&on.as_off);
        println!(
            "{name} without the section: R@10 {:.4} (the include_superseded ranking: {:.4}, \
             {}); acks {:.2}s → {:.2}s, ingest {:.1}s → {:.1}s, CPU {:.1}s → {:.1}s",
            r10(&off.report),
            r10(&on.as_off),
            if same { "equal" } else { "DIFFERENT" },
            off.record_seconds,
            on.record_seconds,
            off.ingest_seconds,
            on.ingest_seconds,
            off.ingest_cpu,
            on.ingest_cpu,
        );
        off_runs.insert(
            name.into(),
            json!({"r10": r10(&off.report), "equal": same,
                   "cost_off": cost(off, n), "cost_on": cost(on, n)}),
        );
    }
    let (compared, alone) = detection_alone(&beam_on);
    let per_record_us = alone * 1e6 / compared.max(1) as f64;
    println!(
        "detection alone (BEAM, every record queued again): {compared} records in {alone:.2}s \
         = {per_record_us:.0} µs per record, one thread"
    );
    let figures = json!({
        "embedder": embedder.name(),
        "beam": {"groups": groups, "r10_off": r10(off), "r10_on": r10(on_),
                 "halves_r10_off": halves(off), "halves_r10_on": halves(on_),
                 "links": linked, "cost_on": cost(&beam_on, records(&beam)),
                 "detection_alone": {"records": compared, "seconds": alone, "us_per_record": per_record_us}},
        "locomo": {"r10_off": r10(&locomo_on.as_off), "r10_on": r10(&locomo_on.report),
                   "cost_on": cost(&locomo_on, records(&locomo))},
        "off_runs": off_runs,
    });
    println!("{figures}");
}
