//! The local embedder on the real all-MiniLM-L6-v2 weights (installed by
//! `scripts/install-model`): its vectors match an independent numpy computation of the same
//! model (`tests/reference/encoder.py`, its output in `tests/reference/minilm.json`), and a
//! paraphrase with no word in common is nearer than an unrelated text. Skipped when the
//! model is not installed, unless SHADOWBRAIN_REQUIRE_MODEL is set (CI sets it).

use std::path::PathBuf;

use serde_json::Value;
use shadowbrain_runtime::embed::{
    Embedder, EmbedderConfig, EmbedderKind, LocalEmbedder, Precision, build_embedder,
    default_model_dir, installed_model_dir, is_model_dir,
};

/// The installed model's directory, or `None` (the test skips) when there is none.
pub(crate) fn model() -> Option<PathBuf> {
    let dir = default_model_dir().filter(|d| is_model_dir(d));
    if dir.is_none() {
        assert!(
            std::env::var_os("SHADOWBRAIN_REQUIRE_MODEL").is_none(),
            "the local model is not installed at {:?}; run scripts/install-model",
            default_model_dir()
        );
        eprintln!("skipped: the local model is not installed (run scripts/install-model)");
    }
    dir
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// The installed all-mpnet-base-v2 (`scripts/install-model all-mpnet-base-v2`, beside the
/// default model), or `None` (the test skips) when there is none, unless
/// SHADOWBRAIN_REQUIRE_MPNET is set.
fn mpnet() -> Option<PathBuf> {
    let dir = installed_model_dir("all-mpnet-base-v2").filter(|d| is_model_dir(d));
    if dir.is_none() {
        assert!(
            std::env::var_os("SHADOWBRAIN_REQUIRE_MPNET").is_none(),
            "all-mpnet-base-v2 is not installed at {:?}; run scripts/install-model \
             all-mpnet-base-v2",
            installed_model_dir("all-mpnet-base-v2")
        );
        eprintln!("skipped: all-mpnet-base-v2 is not installed");
    }
    dir
}

/// The reference texts and their vectors (`tests/reference/{file}`).
fn reference(file: &str) -> (Vec<String>, Vec<Vec<f32>>) {
    let path = format!("{}/../tests/reference/{file}", env!("CARGO_MANIFEST_DIR"));
    let reference: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    reference["texts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let vector = c["vector"].as_array().unwrap();
            (
                c["text"].as_str().unwrap().to_string(),
                vector.iter().map(|v| v.as_f64().unwrap() as f32).collect(),
            )
        })
        .unzip()
}

/// Every reference text of the model in `dir`, in one call and alone (the float engine
/// pads a batch, the int8 engine packs it: neither may change a vector), at `floor`
/// cosine or better.
async fn matches_the_reference(
    dir: PathBuf,
    name: &str,
    dimensions: usize,
    precision: Precision,
    floor: f32,
) {
    let embedder = LocalEmbedder::open_with(&dir, None, precision).unwrap();
    assert_eq!(embedder.name(), format!("local:{name}"));
    assert_eq!(embedder.dimensions(), dimensions);
    let file = match name {
        "all-MiniLM-L6-v2" => "minilm.json",
        _ => "mpnet.json",
    };
    let (texts, expected) = reference(file);
    let together = embedder.embed(&texts).await.unwrap();
    let background = embedder.embed_background(&texts).await.unwrap();
    assert_eq!(
        together, background,
        "the enricher's path computes the same vectors"
    );
    let mut lowest = f32::MAX;
    let mut failures = Vec::new();
    for (i, expected) in expected.iter().enumerate() {
        let alone = embedder.embed(&texts[i..=i]).await.unwrap().remove(0);
        for (how, got) in [("in a batch", &together[i]), ("alone", &alone)] {
            let norm = got.iter().map(|x| x * x).sum::<f32>().sqrt();
            assert!((norm - 1.0).abs() < 1e-4, "{how}: norm {norm}");
            let c = cosine(got, expected);
            lowest = lowest.min(c);
            if c < floor {
                failures.push(format!("{:.60?} {how}: cosine {c}", texts[i]));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} engine, below {floor} with the reference: {failures:#?}",
        embedder.engine()
    );
    eprintln!(
        "{}: lowest cosine with the numpy reference over {} texts: {lowest}",
        embedder.engine(),
        texts.len()
    );
}

#[tokio::test]
async fn the_float_engine_matches_a_numpy_reference_of_the_model() {
    let Some(dir) = model() else { return };
    matches_the_reference(dir, "all-MiniLM-L6-v2", 384, Precision::F32, 0.9999).await;
}

#[tokio::test]
async fn the_int8_engine_stays_within_0_999_of_the_reference() {
    // On a CPU without AVX-512 VNNI this runs the portable kernel: the same integers.
    let Some(dir) = model() else { return };
    matches_the_reference(dir, "all-MiniLM-L6-v2", 384, Precision::Int8, 0.999).await;
}

#[tokio::test]
async fn mpnet_runs_on_the_int8_engine_within_0_999_of_the_reference() {
    let Some(dir) = mpnet() else { return };
    // Every CPU runs an MPNet on the int8 engine: candle has no MPNet.
    matches_the_reference(
        dir.clone(),
        "all-mpnet-base-v2",
        768,
        Precision::Auto,
        0.999,
    )
    .await;
    let err = LocalEmbedder::open_with(&dir, None, Precision::F32)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("BERT models only") && err.contains("precision = \"auto\""),
        "{err}"
    );
}

#[test]
fn the_default_engine_is_int8_where_the_cpu_runs_it_fast() {
    let Some(dir) = model() else { return };
    let engine = LocalEmbedder::open(&dir, None).unwrap().engine();
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512vnni")
        && std::arch::is_x86_feature_detected!("avx512bw")
    {
        assert_eq!(engine, "int8 (avx512-vnni)");
        return;
    }
    assert_eq!(
        engine, "f32",
        "without the fast kernel, the float model runs"
    );
}

#[tokio::test]
async fn a_paraphrase_is_nearer_than_an_unrelated_text() {
    let Some(dir) = model() else { return };
    let embedder = build_embedder(&EmbedderConfig {
        kind: EmbedderKind::Local,
        model_dir: Some(dir.display().to_string()),
        ..EmbedderConfig::default()
    })
    .unwrap();
    assert!(
        !embedder.embeds_inline(),
        "milliseconds per text stay off ingest"
    );
    let v = embedder
        .embed(&[
            "we bought a new car for the team".into(),
            "the group acquired an automobile".into(),
            "the printer on the third floor is out of toner".into(),
        ])
        .await
        .unwrap();
    let (near, far) = (cosine(&v[0], &v[1]), cosine(&v[0], &v[2]));
    assert!(near > far + 0.2, "paraphrase {near}, unrelated {far}");
}

#[test]
fn a_model_directory_that_is_not_one_is_refused_with_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let err = LocalEmbedder::open(dir.path(), None)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("config.json is missing") && err.contains("scripts/install-model"),
        "{err}"
    );
    for f in ["config.json", "tokenizer.json", "model.safetensors"] {
        std::fs::write(dir.path().join(f), "{}").unwrap();
    }
    let err = LocalEmbedder::open(dir.path(), None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("config.json:"), "{err}");
    let err = build_embedder(&EmbedderConfig {
        kind: EmbedderKind::Local,
        model_dir: Some("/nonexistent/model".into()),
        ..EmbedderConfig::default()
    })
    .unwrap_err()
    .to_string();
    assert!(err.contains("embedder.model_dir"), "{err}");
}
