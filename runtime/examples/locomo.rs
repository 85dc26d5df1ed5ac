//! LoCoMo evidence recall through the real recall path, with the default `hash` embedder
//! and BM25 (no LLM, no network). Prints a table, then one JSON line with `r5`, `r10` for
//! categories 1–4 and a `per_category` object, last.
//!
//! ```text
//! cargo run --release -p shadowbrain-runtime --example locomo -- \
//!     [--data ../shared/data/locomo/locomo10.json] [--policy policies/default.toml] [--conversations 0-9]
//! ```

use std::path::PathBuf;
use std::time::Instant;

use shadowbrain_runtime::eval::locomo;
use shadowbrain_runtime::policy::Policy;
use shadowbrain_runtime::substrate::{Substrate, SubstrateOptions};

fn main() {
    let mut data =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/data/locomo/locomo10.json");
    let mut policy = None;
    let mut range = (0usize, usize::MAX);
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let val = it.next().unwrap_or_else(|| {
            eprintln!("locomo: {flag} needs a value");
            std::process::exit(2)
        });
        match flag.as_str() {
            "--data" => data = PathBuf::from(val),
            "--policy" => policy = Some(PathBuf::from(val)),
            "--conversations" => {
                let (a, b) = val.split_once('-').unwrap_or((&val, &val));
                range = (
                    a.parse().expect("--conversations A-B"),
                    b.parse().expect("--conversations A-B"),
                );
            }
            other => {
                eprintln!(
                    "locomo: unknown argument {other}; use --data FILE --policy FILE --conversations A-B"
                );
                std::process::exit(2);
            }
        }
    }
    let convs = locomo::load(&data).unwrap_or_else(|e| {
        eprintln!("locomo: {e}");
        std::process::exit(1)
    });
    let convs: Vec<_> = convs
        .into_iter()
        .enumerate()
        .filter(|(i, _)| *i >= range.0 && *i <= range.1)
        .map(|(_, c)| c)
        .collect();
    let mut opts = SubstrateOptions::default();
    if let Some(p) = &policy {
        opts.policy = Policy::load(p).unwrap_or_else(|e| {
            eprintln!("locomo: {e}");
            std::process::exit(1)
        });
    }
    let dir = tempfile::tempdir().unwrap();
    let sub = Substrate::open(dir.path(), opts).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let t = Instant::now();
    let ks = [5, 10, 20];
    let report = rt
        .block_on(locomo::run(&sub, &convs, &ks, |done, total| {
            eprintln!(
                "locomo: conversation {done}/{total} ({:.1} s)",
                t.elapsed().as_secs_f64()
            )
        }))
        .unwrap();
    let secs = t.elapsed().as_secs_f64();
    eprintln!(
        "{:<12} {:>6} {:>7} {:>7} {:>7} {:>7}",
        "category", "n", "R@5", "R@10", "hit@5", "hit@10"
    );
    let row = |name: &str, f: &locomo::Figures| {
        eprintln!(
            "{name:<12} {:>6} {:>7.3} {:>7.3} {:>7.3} {:>7.3}",
            f.questions, f.recall[&5], f.recall[&10], f.hit[&5], f.hit[&10]
        );
    };
    for (c, f) in &report.per_category {
        row(&format!("{c}"), f);
    }
    row("cats 1-4", &report.cats_1_4);
    eprintln!(
        "{} questions in {secs:.1} s, policy {}",
        report.ranked.len(),
        sub.policy().name
    );
    let per_category: serde_json::Map<String, serde_json::Value> = report
        .per_category
        .iter()
        .map(|(c, f)| (c.to_string(), serde_json::json!({"n": f.questions, "r5": f.recall[&5], "r10": f.recall[&10], "hit5": f.hit[&5], "hit10": f.hit[&10]})))
        .collect();
    println!(
        "{}",
        serde_json::json!({
            "r5": report.cats_1_4.recall[&5],
            "r10": report.cats_1_4.recall[&10],
            "r20": report.cats_1_4.recall[&20],
            "hit5": report.cats_1_4.hit[&5],
            "hit10": report.cats_1_4.hit[&10],
            "questions": report.cats_1_4.questions,
            "per_category": per_category,
            "policy": sub.policy().name,
            "seconds": secs,
        })
    );
    sub.close().unwrap();
}
