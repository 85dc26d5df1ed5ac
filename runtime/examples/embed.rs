//! The local embedder's speed on this machine, as `serve` uses it: batch throughput on the
//! enricher's path (`embed_background`, rounds of `texts_per_call`) and single-query
//! latency on recall's (what recall pays per question), on LoCoMo's turns and questions
//! when the data is beside the repository, else on generated texts. With BEAM beside it
//! too, the same for BEAM's long messages cut into passages as ingest cuts them (texts and
//! tokens per second). With the int8 engine, how close its vectors are to the float
//! model's (the reference) over the first `--agree` turns: mean and lowest cosine (where
//! candle runs the model: BERT, not MPNet). The embedder's cache is off: every text is
//! embedded. Prints one JSON line with the figures, last. The model is the one
//! `SHADOWBRAIN_MODEL_DIR` names, else the default one.
//!
//! `--dump DIR` writes the texts it embedded (`turns.jsonl`, `queries.jsonl`,
//! `passages.jsonl`, one JSON string a line) and its vectors of the first `--agree` turns
//! and passages (`agree_turns.jsonl`, `agree_passages.jsonl`) for `bench/embed_anchor.py
//! --texts-dir DIR`, so the anchor embeds exactly the same texts and (with `--torch`)
//! measures how close it is to them.
//!
//! ```text
//! scripts/install-model
//! cargo run --release -p shadowbrain-runtime --example embed -- [--texts 2000] [--queries 300] \
//!     [--agree 300] [--beam-messages 300] [--precision auto|int8|f32] [--dump DIR]
//! ```

use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::{Parser, ValueEnum};
use shadowbrain_runtime::embed::{
    Embedder, EmbedderConfig, EmbedderKind, Precision, build_embedder, default_model_dir,
};
use shadowbrain_runtime::internals::{is_long, split};
use shadowbrain_test_support::stats::percentile;

/// The local embedder's speed on this machine: batch throughput, single-query latency,
/// BEAM's passages, and agreement with the float model; one JSON line, last.
#[derive(Parser)]
#[command(name = "embed")]
struct Args {
    /// Texts embedded in batches (LoCoMo's turns, else generated ones).
    #[arg(long, default_value_t = 2000)]
    texts: usize,
    /// Queries embedded one at a time (LoCoMo's questions, else generated ones).
    #[arg(long, default_value_t = 300)]
    queries: usize,
    /// Turns compared with the float model's vectors.
    #[arg(long, default_value_t = 300)]
    agree: usize,
    /// BEAM's long messages cut into passages, when BEAM is beside the repository.
    #[arg(long, default_value_t = 300)]
    beam_messages: usize,
    /// The engine: the int8 one where the CPU has VNNI (auto), always int8, or the float model.
    #[arg(long, value_enum, default_value_t = Engine::Auto)]
    precision: Engine,
    /// Write the texts and the first --agree vectors to DIR for bench/embed_anchor.py.
    #[arg(long, value_name = "DIR")]
    dump: Option<PathBuf>,
}

/// `--precision`, as the embedder's configuration names it.
#[derive(Clone, Copy, ValueEnum)]
enum Engine {
    Auto,
    Int8,
    F32,
}

impl From<Engine> for Precision {
    fn from(engine: Engine) -> Precision {
        match engine {
            Engine::Auto => Precision::Auto,
            Engine::Int8 => Precision::Int8,
            Engine::F32 => Precision::F32,
        }
    }
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

fn main() {
    // As `serve` does, before any thread starts (see `settle_model_threads`).
    // SAFETY: first thing in main: no other thread has started.
    unsafe { shadowbrain_runtime::embed::settle_model_threads() };
    let a = Args::parse();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
        .block_on(run(a));
}

/// Texts per second through the enricher's path, in its rounds.
async fn batch_speed(embedder: &dyn Embedder, texts: &[String]) -> f64 {
    let started = Instant::now();
    for chunk in texts.chunks(embedder.texts_per_call().max(1)) {
        embedder.embed_background(chunk).await.unwrap();
    }
    texts.len() as f64 / started.elapsed().as_secs_f64()
}

fn dump(dir: &Path, name: &str, texts: &[String]) {
    std::fs::create_dir_all(dir).expect("the --dump directory");
    let lines: String = texts
        .iter()
        .map(|t| serde_json::to_string(t).unwrap() + "\n")
        .collect();
    std::fs::write(dir.join(name), lines).expect("writing a dump");
}

async fn run(a: Args) {
    let (n_texts, n_queries, n_agree, n_beam) = (a.texts, a.queries, a.agree, a.beam_messages);
    let local = |p: Precision| {
        build_embedder(&EmbedderConfig {
            kind: EmbedderKind::Local,
            precision: p,
            cache_entries: 0,
            ..EmbedderConfig::default()
        })
    };
    let embedder = local(a.precision.into()).expect("the local model (run scripts/install-model)");
    let shared = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/data");
    let (texts, queries, source): (Vec<String>, Vec<String>, &str) =
        match shadowbrain_runtime::eval::locomo::load(&shared.join("locomo/locomo10.json")) {
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
    // BEAM's long messages, cut as ingest cuts them.
    let passages: Vec<String> = shadowbrain_runtime::eval::beam::load(&shared.join("beam/100K"))
        .map(|convs| {
            convs
                .iter()
                .flat_map(|c| c.turns.iter())
                .filter(|t| is_long(&t.text))
                .take(n_beam)
                .flat_map(|t| split(&t.text).into_iter().map(|r| t.text[r].to_string()))
                .collect()
        })
        .unwrap_or_default();
    if let Some(dir) = &a.dump {
        dump(dir, "turns.jsonl", &texts);
        dump(dir, "queries.jsonl", &queries);
        dump(dir, "passages.jsonl", &passages);
    }
    // Warm up (the first pass pages in and caches what it touches).
    embedder
        .embed_background(&texts[..32.min(texts.len())])
        .await
        .unwrap();
    let batch = batch_speed(embedder.as_ref(), &texts).await;
    let mut latencies = Vec::with_capacity(queries.len());
    for q in &queries {
        let t = Instant::now();
        embedder.embed(std::slice::from_ref(q)).await.unwrap();
        latencies.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    latencies.sort_by(f64::total_cmp);
    let query_ms = |q| percentile(&latencies, q).expect("--queries is at least 1");
    let passage_speed = match passages.is_empty() {
        true => 0.0,
        false => batch_speed(embedder.as_ref(), &passages).await,
    };
    // Tokens as the model reads them: the text's own, up to the model's reading length.
    let dir = default_model_dir().expect("the model directory");
    let mut tokenizer = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json"))
        .expect("the model's tokenizer");
    tokenizer.with_padding(None);
    tokenizer.with_truncation(None).expect("no truncation");
    let reads = std::fs::read(dir.join("sentence_bert_config.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .and_then(|v| v["max_seq_length"].as_u64())
        .unwrap_or(256) as usize;
    let tokens = |texts: &[String]| -> usize {
        texts
            .iter()
            .map(|t| tokenizer.encode(t.as_str(), true).unwrap().len().min(reads))
            .sum()
    };
    let (turn_tokens, passage_tokens) = (tokens(&texts), tokens(&passages));
    // Agreement with the float model, text by text, where candle runs the model.
    let sample = &texts[..n_agree.min(texts.len())];
    let ours = embedder.embed_background(sample).await.unwrap();
    if let Some(dir) = &a.dump {
        // For the anchor's agreement: these turns', and as many passages' (long texts).
        let passages = &passages[..n_agree.min(passages.len())];
        let passage_vectors = embedder.embed_background(passages).await.unwrap();
        for (name, vectors) in [
            ("agree_turns.jsonl", &ours),
            ("agree_passages.jsonl", &passage_vectors),
        ] {
            let lines: String = vectors
                .iter()
                .map(|v| serde_json::to_string(v).unwrap() + "\n")
                .collect();
            std::fs::write(dir.join(name), lines).expect("writing a dump");
        }
    }
    let cosines: Vec<f32> = match local(Precision::F32) {
        Ok(float) => {
            let reference = float.embed_background(sample).await.unwrap();
            ours.iter()
                .zip(&reference)
                .map(|(a, b)| a.iter().zip(b).map(|(x, y)| x * y).sum())
                .collect()
        }
        Err(e) => {
            eprintln!("no agreement with the float model: {e}");
            Vec::new()
        }
    };
    // None (null) where there is no float model to agree with.
    let mean_cos =
        (!cosines.is_empty()).then(|| cosines.iter().sum::<f32>() / cosines.len() as f32);
    let min_cos = cosines.iter().copied().reduce(f32::min);
    let mean_words = texts
        .iter()
        .map(|t| t.split_whitespace().count())
        .sum::<usize>() as f64
        / texts.len() as f64;
    let per_text = |tokens: usize, n: usize| round2(tokens as f64 / n.max(1) as f64);
    println!(
        "{}",
        serde_json::json!({
            "embedder": embedder.name(),
            "source": source,
            "texts": texts.len(),
            "mean_words": (mean_words * 10.0).round() / 10.0,
            "tokens_per_text": per_text(turn_tokens, texts.len()),
            "round": embedder.texts_per_call(),
            "batch_texts_per_s": batch.round(),
            "batch_tokens_per_s": (batch * turn_tokens as f64 / texts.len() as f64).round(),
            "queries": queries.len(),
            "query_p50_ms": round2(query_ms(0.5)),
            "query_p99_ms": round2(query_ms(0.99)),
            "beam_passages": passages.len(),
            "beam_tokens_per_passage": per_text(passage_tokens, passages.len()),
            "beam_passages_per_s": passage_speed.round(),
            "beam_tokens_per_s": (passage_speed * passage_tokens as f64
                / passages.len().max(1) as f64)
                .round(),
            "agree_texts": cosines.len(),
            "cosine_with_f32_mean": mean_cos,
            "cosine_with_f32_min": min_cos,
        })
    );
}
