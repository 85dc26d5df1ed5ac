//! The local embedder's speed on this machine: batch throughput (texts per second, the
//! enricher's rounds) and single-query latency (what recall pays per question), on LoCoMo's
//! turns and questions when the data is beside the repository, else on generated texts.
//! Prints one JSON line with the figures, last.
//!
//! With the int8 engine, it also reports how close its vectors are to the float model's
//! (the reference) over the first `--agree` texts: mean and lowest cosine.
//!
//! ```text
//! scripts/install-model
//! cargo run --release -p shadowbrain-runtime --example embed -- [--texts 2000] [--queries 300] \
//!     [--agree 300] [--precision auto|int8|f32]
//! ```

use std::time::Instant;

use shadowbrain_runtime::embed::{EmbedderConfig, EmbedderKind, Precision, build_embedder};

fn arg<T: std::str::FromStr>(name: &str, default: T) -> T {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn precision(name: &str) -> Precision {
    match name {
        "int8" => Precision::Int8,
        "f32" => Precision::F32,
        _ => Precision::Auto,
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    // As `serve` does, before any thread starts (see `settle_model_threads`).
    // SAFETY: first thing in main: no other thread has started.
    unsafe { shadowbrain_runtime::embed::settle_model_threads() };
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
        .block_on(run());
}

async fn run() {
    let (n_texts, n_queries) = (arg("--texts", 2000usize), arg("--queries", 300usize));
    let n_agree = arg("--agree", 300usize);
    let local = |p: Precision| {
        build_embedder(&EmbedderConfig {
            kind: EmbedderKind::Local,
            precision: p,
            ..EmbedderConfig::default()
        })
        .expect("the local model (run scripts/install-model)")
    };
    let embedder = local(precision(&arg("--precision", String::from("auto"))));
    let locomo = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/data/locomo/locomo10.json");
    let (texts, queries, source): (Vec<String>, Vec<String>, &str) =
        match shadowbrain_runtime::eval::locomo::load(&locomo) {
            Ok(convs) => (
                convs
                    .iter()
                    .flat_map(|c| c.turns.iter().map(|t| t.text.clone()))
                    .take(n_texts)
                    .collect(),
                convs
                    .iter()
                    .flat_map(|c| c.questions.iter().map(|q| q.question.clone()))
                    .take(n_queries)
                    .collect(),
                "locomo",
            ),
            Err(_) => (
                (0..n_texts)
                    .map(|i| format!("event {i}: the nightly job {} finished late", i % 97))
                    .collect(),
                (0..n_queries)
                    .map(|i| format!("which job finished late on night {i}?"))
                    .collect(),
                "generated",
            ),
        };
    // Warm up (the weights are memory-mapped: the first pass pages them in).
    embedder.embed(&texts[..32.min(texts.len())]).await.unwrap();
    let round = embedder.texts_per_call();
    let started = Instant::now();
    for chunk in texts.chunks(round) {
        embedder.embed(chunk).await.unwrap();
    }
    let batch_secs = started.elapsed().as_secs_f64();
    let mut latencies = Vec::with_capacity(queries.len());
    for q in &queries {
        let t = Instant::now();
        embedder.embed(std::slice::from_ref(q)).await.unwrap();
        latencies.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    latencies.sort_by(f64::total_cmp);
    // Agreement with the float model, text by text.
    let sample = &texts[..n_agree.min(texts.len())];
    let (ours, reference) = (
        embedder.embed(sample).await.unwrap(),
        local(Precision::F32).embed(sample).await.unwrap(),
    );
    let cosines: Vec<f32> = ours
        .iter()
        .zip(&reference)
        .map(|(a, b)| a.iter().zip(b).map(|(x, y)| x * y).sum())
        .collect();
    let mean_cos = cosines.iter().sum::<f32>() / cosines.len().max(1) as f32;
    let min_cos = cosines.iter().copied().fold(f32::MAX, f32::min);
    let mean_words = texts
        .iter()
        .map(|t| t.split_whitespace().count())
        .sum::<usize>() as f64
        / texts.len() as f64;
    println!(
        "{}",
        serde_json::json!({
            "embedder": embedder.name(),
            "source": source,
            "texts": texts.len(),
            "mean_words": (mean_words * 10.0).round() / 10.0,
            "round": round,
            "batch_texts_per_s": (texts.len() as f64 / batch_secs).round(),
            "queries": queries.len(),
            "query_p50_ms": (percentile(&latencies, 0.5) * 100.0).round() / 100.0,
            "query_p99_ms": (percentile(&latencies, 0.99) * 100.0).round() / 100.0,
            "agree_texts": cosines.len(),
            "cosine_with_f32_mean": mean_cos,
            "cosine_with_f32_min": min_cos,
        })
    );
}
