//! Workload W1 (its figures: docs/benchmarks.md): 1,000 sessions × 100 events with 384-d
//! clustered embeddings. Ingests durably through the substrate, waits for the indexes, runs
//! the 1,000 session-scoped (Q1) and 1,000 global (Q2) top-10 queries against the vector
//! index, rebuilds the vector index from scratch, reopens the store, and prints one JSON
//! line with the figures, last.
//!
//! ```text
//! python3 ../shared/bench/gen_w1.py /tmp/w1-data
//! cargo run --release -p shadowbrain-runtime --example w1 -- --data /tmp/w1-data [--backend sled|lmdb]
//! ```
//!
//! `--work DIR --reuse` reopens a store an earlier run left in `DIR` and runs only the full
//! recall loop (`--recalls N`): what a profiler or `valgrind --tool=callgrind` should watch,
//! without the ingest and index builds around it.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use shadowbrain_runtime::internals::Filter;
use shadowbrain_runtime::{Backend, MemoryId, NewMemory, Substrate, SubstrateOptions};
use shadowbrain_test_support::stats::percentile;

const DIM: usize = 384;

/// Workload W1 through the substrate: durable ingest, index catch-up, Q1 and Q2 top-10,
/// the full recall path, a rebuild and a reopen; one JSON line of figures, last.
#[derive(Parser)]
#[command(name = "w1")]
struct Args {
    /// W1's data directory (made by ../shared/bench/gen_w1.py DIR).
    #[arg(long, value_name = "DIR")]
    data: PathBuf,
    /// The store's backend: lmdb or sled.
    #[arg(long, default_value = "lmdb")]
    backend: Backend,
    /// Keep the store in DIR (emptied first, unless --reuse) instead of a scratch directory.
    #[arg(long, value_name = "DIR")]
    work: Option<PathBuf>,
    /// Reopen the store an earlier run left in --work and run only the full recall loop.
    #[arg(long, requires = "work")]
    reuse: bool,
    /// Threads ingesting at once.
    #[arg(long, default_value_t = 10)]
    writers: usize,
    /// Index nothing during ingest: one flush catches up afterwards.
    #[arg(long)]
    defer_index: bool,
    /// The vector index's tree count (default: the index's own).
    #[arg(long)]
    trees: Option<usize>,
    /// The vector index's search_k factor (default: the index's own).
    #[arg(long)]
    search_k_factor: Option<usize>,
    /// Full session recalls to time (the recall path's p50 and p99).
    #[arg(long, default_value_t = 200)]
    recalls: usize,
}

fn read_f32(path: &Path) -> Vec<f32> {
    let b = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn read_i64(path: &Path) -> Vec<i64> {
    let b = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    b.chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn read_i32(path: &Path) -> Vec<i32> {
    let b = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    b.chunks_exact(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

struct Row {
    session: String,
    kind: String,
    importance: f32,
    ts_ms: i64,
    text: String,
}

/// Runs `n` full session recalls (vector, keyword, recent paths, scoring, context) with
/// W1's Q1 queries and their vectors, one at a time; returns their p50 and p99 in ms.
fn full_recalls(sub: &Substrate, rows: &[Row], data: &Path, n: usize) -> (f64, f64) {
    let q1 = read_f32(&data.join("q1.f32"));
    let q1_s = read_i32(&data.join("q1_session.i32"));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let mut recall_lat = Vec::new();
    for i in (0..n).map(|i| i % 1000) {
        let sid = format!("s{:04}", q1_s[i]);
        let mut req = shadowbrain_runtime::RecallRequest::new(
            "default",
            &sid,
            &rows[q1_s[i] as usize * 100].text,
        );
        req.query_embedding = Some(q1[i * DIM..(i + 1) * DIM].to_vec());
        req.reinforce = false;
        let t = Instant::now();
        rt.block_on(sub.recall(&req)).unwrap();
        recall_lat.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    recall_lat.sort_by(f64::total_cmp);
    let at = |q| percentile(&recall_lat, q).expect("--recalls is at least 1");
    let (p50, p99) = (at(0.5), at(0.99));
    eprintln!(
        "w1: full session recall (4 paths, scoring, context) p50 {p50:.3} ms p99 {p99:.3} ms"
    );
    (p50, p99)
}

fn main() {
    let a = Args::parse();
    let emb = read_f32(&a.data.join("emb.f32"));
    let n = emb.len() / DIM;
    let mut rows = Vec::with_capacity(n);
    let f = std::fs::File::open(a.data.join("w1.jsonl")).expect("w1.jsonl");
    let mut text_bytes = 0u64;
    for line in std::io::BufReader::new(f).lines() {
        let v: serde_json::Value = serde_json::from_str(&line.unwrap()).unwrap();
        let text = v["text"].as_str().unwrap().to_string();
        text_bytes += text.len() as u64;
        rows.push(Row {
            session: v["session_id"].as_str().unwrap().to_string(),
            kind: v["event_type"].as_str().unwrap().to_string(),
            importance: v["importance"].as_f64().unwrap() as f32,
            ts_ms: v["ts_epoch"].as_i64().unwrap() * 1000,
            text,
        });
    }
    assert_eq!(rows.len(), n, "w1.jsonl and emb.f32 disagree");
    let tmp;
    let work = match &a.work {
        Some(w) => {
            if !a.reuse {
                let _ = std::fs::remove_dir_all(w);
            }
            w.clone()
        }
        None => {
            tmp = tempfile::tempdir_in(std::env::temp_dir()).unwrap();
            tmp.path().to_path_buf()
        }
    };
    let mut opts = SubstrateOptions {
        backend: a.backend,
        ..SubstrateOptions::default()
    };
    // --defer-index: nothing indexes during ingest; the catch-up is one flush afterwards.
    opts.indexing.background = !a.defer_index;
    if let Some(t) = a.trees {
        opts.vector.n_trees = Some(t);
    }
    if let Some(f) = a.search_k_factor {
        opts.vector.search_k_factor = f;
    }
    let sub = Substrate::open(&work, opts.clone()).unwrap();
    if a.reuse {
        assert_eq!(
            sub.store().len(),
            n as u64,
            "{} holds another store",
            work.display()
        );
        let (p50, p99) = full_recalls(&sub, &rows, &a.data, a.recalls);
        sub.close().unwrap();
        println!(
            "{}",
            serde_json::json!({
                "recall_path_p50_ms": p50,
                "recall_path_p99_ms": p99,
            })
        );
        return;
    }

    // Ingest: batches of 1,000 events (10 sessions × 100), several writers at once; each
    // call returns after its events are durable.
    eprintln!(
        "w1: ingesting {n} events with {} writers ({})",
        a.writers,
        a.backend.as_str()
    );
    let rows = Arc::new(rows);
    let emb = Arc::new(emb);
    let sessions = n / 100;
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let id_of = Arc::new(std::sync::Mutex::new(vec![MemoryId(0); n]));
    let t0 = Instant::now();
    let writers: Vec<_> = (0..a.writers)
        .map(|_| {
            let (sub, rows, emb, next, id_of) = (
                sub.clone(),
                rows.clone(),
                emb.clone(),
                next.clone(),
                id_of.clone(),
            );
            std::thread::spawn(move || {
                loop {
                    let s = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    if s >= sessions {
                        break;
                    }
                    let range = s * 100..(s + 1) * 100;
                    let events: Vec<NewMemory> = range
                        .clone()
                        .map(|i| {
                            let r = &rows[i];
                            NewMemory {
                                kind: r.kind.clone(),
                                text: Some(r.text.clone()),
                                importance: Some(r.importance),
                                timestamp: Some(r.ts_ms),
                                embedding: Some(emb[i * DIM..(i + 1) * DIM].to_vec()),
                                metadata: Some(serde_json::json!({ "w1_id": i })),
                                ..NewMemory::default()
                            }
                        })
                        .collect();
                    let ids = sub
                        .record_blocking("default", &rows[range.start].session, events)
                        .unwrap();
                    let mut map = id_of.lock().unwrap();
                    for (i, id) in range.zip(ids) {
                        map[i] = id;
                    }
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    let ingest_s = t0.elapsed().as_secs_f64();
    let ingest_per_s = n as f64 / ingest_s;
    eprintln!(
        "w1: ingest {ingest_per_s:.0} events/s ({ingest_s:.2} s); commits {:?}",
        sub.store().commit_stats()
    );
    let t1 = Instant::now();
    if a.defer_index {
        sub.flush_indexes().unwrap();
    }
    while !sub.indexes_caught_up().unwrap() {
        std::thread::sleep(Duration::from_millis(20));
    }
    let index_catchup_s = t1.elapsed().as_secs_f64();
    eprintln!("w1: indexes caught up {index_catchup_s:.2} s after the last write");

    let id_of = id_of.lock().unwrap().clone();
    // Ids are handed out in write order, which differs from W1 row order: map back.
    let mut back = std::collections::HashMap::with_capacity(n);
    for (row, id) in id_of.iter().enumerate() {
        back.insert(id.0, row as i64);
    }
    let run_queries =
        |name: &str, q: &[f32], gt: &[i64], sessions: Option<&[i32]>| -> (f64, f64, f64) {
            let nq = gt.len() / 10;
            let mut lat = Vec::with_capacity(nq);
            let mut hits = 0usize;
            let all = sub.store().candidates(&Filter {
                namespace: "default",
                recallable_only: true,
                ..Default::default()
            });
            for i in 0..nq {
                let query = &q[i * DIM..(i + 1) * DIM];
                let t = Instant::now();
                let res = match sessions {
                    Some(s) => {
                        let sid = format!("s{:04}", s[i]);
                        let cands = sub.store().candidates(&Filter {
                            namespace: "default",
                            session: Some(&sid),
                            recallable_only: true,
                            ..Default::default()
                        });
                        sub.vectors().search(query, 10, Some(&cands)).unwrap()
                    }
                    None => sub.vectors().search(query, 10, Some(&all)).unwrap(),
                };
                lat.push(t.elapsed().as_secs_f64() * 1000.0);
                let want: std::collections::HashSet<i64> =
                    gt[i * 10..(i + 1) * 10].iter().copied().collect();
                hits += res
                    .iter()
                    .filter(|(id, _)| want.contains(&back[id]))
                    .count();
            }
            lat.sort_by(f64::total_cmp);
            let recall = hits as f64 / (nq * 10) as f64;
            let at = |q| percentile(&lat, q).expect("W1 has queries");
            let (p50, p95, p99) = (at(0.5), at(0.95), at(0.99));
            eprintln!(
                "w1: {name} p50 {p50:.3} ms p95 {p95:.3} ms p99 {p99:.3} ms recall@10 {recall:.4}"
            );
            (p50, p99, recall)
        };
    let q1 = read_f32(&a.data.join("q1.f32"));
    let q1_gt = read_i64(&a.data.join("q1_gt.i64"));
    let q1_s = read_i32(&a.data.join("q1_session.i32"));
    let (q1_p50, q1_p99, q1_recall) = run_queries("Q1 session top-10", &q1, &q1_gt, Some(&q1_s));
    let q2 = read_f32(&a.data.join("q2.f32"));
    let q2_gt = read_i64(&a.data.join("q2_gt.i64"));
    let (q2_p50, q2_p99, q2_recall) = run_queries("Q2 global top-10", &q2, &q2_gt, None);

    // Full recall path (vector + keyword + recent, policy scoring), for context.
    let (recall_p50, recall_p99) = full_recalls(&sub, &rows, &a.data, a.recalls);

    // Footprint of the workload as ingested and indexed (a forced rebuild below leaves
    // LMDB free pages behind, which is not what the workload costs).
    sub.flush_indexes().unwrap();
    let disk_bytes = shadowbrain_runtime::internals::dir_disk_bytes(&work).unwrap();
    for part in ["store", "vectors", "keywords"] {
        eprintln!(
            "w1: {part}/ {} MB",
            shadowbrain_runtime::internals::dir_disk_bytes(&work.join(part)).unwrap() / 1_000_000
        );
    }
    let t2 = Instant::now();
    sub.rebuild(true, false).unwrap();
    let build_100k_s = t2.elapsed().as_secs_f64();
    eprintln!("w1: vector index rebuilt from scratch in {build_100k_s:.2} s");
    run_queries("Q2 global top-10 after the rebuild", &q2, &q2_gt, None);

    sub.close().unwrap();
    drop(sub);
    let t3 = Instant::now();
    let sub = Substrate::open(&work, opts).unwrap();
    let reopen_s = t3.elapsed().as_secs_f64();
    assert_eq!(sub.store().len(), n as u64);
    sub.close().unwrap();
    let raw_bytes = (n * DIM * 4) as u64 + text_bytes;
    eprintln!(
        "w1: reopen {reopen_s:.3} s; disk {disk_bytes} bytes = {:.2}x raw {raw_bytes}",
        disk_bytes as f64 / raw_bytes as f64
    );
    println!(
        "{}",
        serde_json::json!({
            "ingest_per_s": ingest_per_s.round(),
            "index_catchup_s": index_catchup_s,
            "q1_p50_ms": q1_p50, "q1_p99_ms": q1_p99, "q1_recall_at_10": q1_recall,
            "q2_p50_ms": q2_p50, "q2_p99_ms": q2_p99, "q2_recall_at_10": q2_recall,
            "build_100k_s": build_100k_s, "reopen_s": reopen_s,
            "disk_bytes": disk_bytes, "raw_bytes": raw_bytes,
            "recall_path_p50_ms": recall_p50,
            "recall_path_p99_ms": recall_p99,
            "backend": a.backend.as_str(),
        })
    );
}
