//! Micro-benchmarks of the substrate's hot paths: the hash embedder, a durable batch write
//! (group commit, LMDB), session-scoped and namespace-wide vector search, and full recall in
//! a long conversation with and without the neighbouring-turn step. The whole-
//! workload figures (W1) come from `cargo run --release -p shadowbrain-runtime --example w1`.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use rand::{RngExt, SeedableRng};
use shadowbrain_runtime::embed::Embedder;
use shadowbrain_runtime::embed::HashEmbedder;
use shadowbrain_runtime::internals::Filter;
use shadowbrain_runtime::policy::Policy;
use shadowbrain_runtime::{NewMemory, RecallRequest, Substrate, SubstrateOptions};

fn unit(rng: &mut rand::rngs::StdRng, dim: usize) -> Vec<f32> {
    let v: Vec<f32> = (0..dim).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    v.into_iter().map(|x| x / n).collect()
}

fn benches(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let embedder = HashEmbedder::default();
    let text = vec!["the deploy to staging failed because the TLS certificate of the load balancer expired yesterday night".to_string()];
    c.bench_function("hash_embed_one_text", |b| {
        b.iter(|| black_box(rt.block_on(embedder.embed(&text)).unwrap()))
    });

    let dir = tempfile::tempdir().unwrap();
    let sub = Substrate::open(dir.path(), SubstrateOptions::default()).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let mut session = 0u32;
    c.bench_function("durable_write_100_events_with_embeddings", |b| {
        b.iter(|| {
            session += 1;
            let events: Vec<NewMemory> = (0..100)
                .map(|i| NewMemory {
                    embedding: Some(unit(&mut rng, 384)),
                    ..NewMemory::new("observation", format!("event {i} of session {session}"))
                })
                .collect();
            black_box(
                sub.record_blocking("default", &format!("s{session}"), events)
                    .unwrap(),
            )
        })
    });
    sub.flush_indexes().unwrap();
    let q = unit(&mut rng, 384);
    let scoped = sub.store().candidates(&Filter {
        namespace: "default",
        session: Some("s1"),
        recallable_only: true,
        ..Default::default()
    });
    c.bench_function("vector_top10_session_scope", |b| {
        b.iter(|| black_box(sub.vectors().search(&q, 10, Some(&scoped)).unwrap()))
    });
    let all = sub.store().candidates(&Filter {
        namespace: "default",
        recallable_only: true,
        ..Default::default()
    });
    c.bench_function("vector_top10_namespace", |b| {
        b.iter(|| black_box(sub.vectors().search(&q, 10, Some(&all)).unwrap()))
    });
    sub.close().unwrap();
    recall_in_a_long_conversation(c, &rt);
}

/// Full recall (every path, the policy, the context block) in one 600-turn conversation,
/// the length of a LoCoMo one, with the default policy and with the neighbouring-turn and
/// cue steps off: what reading each keyword hit with its neighbours costs.
fn recall_in_a_long_conversation(c: &mut Criterion, rt: &tokio::runtime::Runtime) {
    const WORDS: &[&str] = &[
        "paint",
        "camping",
        "river",
        "dance",
        "studio",
        "adoption",
        "school",
        "speech",
        "pottery",
        "garden",
        "concert",
        "violin",
        "marathon",
        "bakery",
        "puppy",
        "beach",
        "museum",
        "novel",
        "career",
        "counseling",
        "festival",
        "sunset",
        "mountain",
        "recipe",
        "guitar",
        "trip",
    ];
    let dir = tempfile::tempdir().unwrap();
    let sub = Substrate::open(dir.path(), SubstrateOptions::default()).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let t0 = 1_683_550_000_000i64;
    let turns: Vec<NewMemory> = (0..600)
        .map(|i| {
            let speaker = if i % 2 == 0 { "Caroline" } else { "Melanie" };
            let words: Vec<&str> = (0..12)
                .map(|_| WORDS[rng.random_range(0..WORDS.len())])
                .collect();
            NewMemory {
                // 20 sessions of 30 turns, a week apart.
                timestamp: Some(t0 + (i / 30) * 7 * 86_400_000 + (i % 30) * 1_000),
                ..NewMemory::new(
                    "user_message",
                    format!(
                        "{speaker}: we talked about the {} today",
                        words.join(" and the ")
                    ),
                )
            }
        })
        .collect();
    rt.block_on(sub.record("default", "conv", turns)).unwrap();
    sub.flush_indexes().unwrap();
    let mut req = RecallRequest::new(
        "default",
        "conv",
        "When did Melanie go camping by the river?",
    );
    req.include_knowledge = false;
    req.reinforce = false;
    let query = rt
        .block_on(sub.embedder().embed(std::slice::from_ref(&req.query)))
        .unwrap()
        .pop();
    let plain = Arc::new(
        Policy::from_toml(
            "plain.toml",
            "[scoring]\ncontext_window = 0\nspeaker_boost = 0.0\ntime_boost = 0.0\n",
        )
        .unwrap(),
    );
    for (name, policy) in [
        ("recall_top10_600_turns_default", sub.policy()),
        ("recall_top10_600_turns_no_context_or_cues", plain),
    ] {
        c.bench_function(name, |b| {
            b.iter(|| black_box(sub.rank(&req, query.as_deref(), &policy).unwrap()))
        });
    }
    sub.close().unwrap();
}

criterion_group! {
    name = substrate;
    config = Criterion::default().sample_size(20);
    targets = benches
}
criterion_main!(substrate);
