//! The update detector ([`shadowbrain_runtime::updates`]) on a labelled set of 262 pairs
//! written for it (`tests/data/updates_pairs.jsonl`: updates, contradictions, paraphrased
//! duplicates and unrelated near-misses, by someone who had not seen the rules). Odd ids
//! are the half the rules were tuned on, even ids the held-out half; precision and recall
//! per class are printed for both, and the held-out half must keep the floors below.
//! Similarity comes from the local model when it is installed (as in `serve`), else from
//! the hash embedder.

use std::collections::HashMap;

use serde_json::Value;
use shadowbrain_runtime::embed::{Embedder, HashEmbedder, LocalEmbedder};
use shadowbrain_runtime::updates::{Change, Claims, Thresholds, compare};

const CLASSES: [Change; 4] = [
    Change::Supersedes,
    Change::Contradicts,
    Change::Duplicate,
    Change::Unrelated,
];

struct Pair {
    id: u32,
    class: Change,
    older: String,
    newer: String,
}

fn pairs() -> Vec<Pair> {
    let text = include_str!("../data/updates_pairs.jsonl");
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            let class = match v["class"].as_str().unwrap() {
                "supersedes" => Change::Supersedes,
                "contradicts" => Change::Contradicts,
                "duplicate" => Change::Duplicate,
                "unrelated" => Change::Unrelated,
                other => panic!("unknown class {other}"),
            };
            Pair {
                id: v["id"].as_str().unwrap()[1..].parse().unwrap(),
                class,
                older: v["older"]["text"].as_str().unwrap().to_string(),
                newer: v["newer"]["text"].as_str().unwrap().to_string(),
            }
        })
        .collect()
}

/// Precision and recall of each class over `decided` (label, decision).
fn scores(decided: &[(Change, Change)]) -> HashMap<Change, (f32, f32)> {
    CLASSES
        .iter()
        .map(|&c| {
            let tp = decided.iter().filter(|(l, d)| *l == c && *d == c).count() as f32;
            let said = decided.iter().filter(|(_, d)| *d == c).count() as f32;
            let truth = decided.iter().filter(|(l, _)| *l == c).count() as f32;
            (c, (tp / said.max(1.0), tp / truth.max(1.0)))
        })
        .collect()
}

#[tokio::test]
async fn the_rules_find_updates_contradictions_and_duplicates_in_the_labelled_set() {
    let pairs = pairs();
    assert!(
        pairs.len() >= 200,
        "the labelled set has {} pairs",
        pairs.len()
    );
    let embedder: Box<dyn Embedder> = match crate::local_model::model() {
        Some(dir) => Box::new(LocalEmbedder::open(&dir, None).unwrap()),
        None => Box::new(HashEmbedder::new(384).unwrap()),
    };
    let texts: Vec<String> = pairs
        .iter()
        .flat_map(|p| [p.newer.clone(), p.older.clone()])
        .collect();
    let vectors = embedder.embed(&texts).await.unwrap();
    let t = Thresholds::default();
    let mut halves: [Vec<(Change, Change)>; 2] = [Vec::new(), Vec::new()];
    let mut wrong = Vec::new();
    let mut sims: HashMap<&str, Vec<f32>> = HashMap::new();
    for (i, p) in pairs.iter().enumerate() {
        let similarity =
            shadowbrain_runtime::internals::cosine(&vectors[2 * i], &vectors[2 * i + 1]);
        let f = compare(&Claims::of(&p.newer), &Claims::of(&p.older), similarity, &t);
        halves[(p.id % 2) as usize].push((p.class, f.change));
        sims.entry(p.class.as_str()).or_default().push(similarity);
        if f.change != p.class && (p.id % 2 == 1 || std::env::var_os("UPDATES_SHOW_ALL").is_some())
        {
            wrong.push(format!(
                "p{:03} {} as {} (sim {similarity:.2}; {})",
                p.id,
                p.class.as_str(),
                f.change.as_str(),
                f.reason
            ));
        }
    }
    println!("{} on the tuning half:\n{}", wrong.len(), wrong.join("\n"));
    println!("embedder: {}", embedder.name());
    for (class, mut s) in sims {
        s.sort_by(f32::total_cmp);
        let q = |f: f32| s[((s.len() - 1) as f32 * f) as usize];
        println!(
            "  similarity of {class}: p10 {:.2} median {:.2} p90 {:.2}",
            q(0.1),
            q(0.5),
            q(0.9)
        );
    }
    let held_out = scores(&halves[0]);
    let local = embedder.name().starts_with("local:");
    for (name, half) in [
        ("tuning (odd ids)", &halves[1]),
        ("held out (even ids)", &halves[0]),
    ] {
        let s = scores(half);
        let correct = half.iter().filter(|(l, d)| l == d).count();
        println!(
            "{name}: {} pairs, accuracy {:.3}",
            half.len(),
            correct as f32 / half.len() as f32
        );
        for c in CLASSES {
            println!(
                "  {:<12} precision {:.3} recall {:.3}",
                c.as_str(),
                s[&c].0,
                s[&c].1
            );
        }
    }
    // Floors a little under what the held-out half measured on 2026-12-02 (supersedes
    // 0.850 / 0.415, contradicts 1.000 / 0.423, duplicate 0.789 / 0.469 with the local
    // model): a change to the rules that loses ground fails here. Conflicts are decided
    // before similarity is looked at, so their floors hold with either embedder.
    let mut floors = vec![
        (Change::Supersedes, 0.75, 0.35),
        (Change::Contradicts, 0.75, 0.35),
    ];
    if local {
        floors.push((Change::Duplicate, 0.70, 0.40));
    }
    for (class, precision, recall) in floors {
        let (p, r) = held_out[&class];
        assert!(
            p >= precision && r >= recall,
            "{}: precision {p:.3} (floor {precision}), recall {r:.3} (floor {recall})",
            class.as_str()
        );
    }
}
