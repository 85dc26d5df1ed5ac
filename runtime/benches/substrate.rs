//! Micro-benchmarks of the substrate's hot paths: the hash embedder, a durable batch write
//! (group commit, LMDB), and session-scoped and namespace-wide vector search. The whole-
//! workload figures (W1) come from `cargo run --release -p shadowbrain-runtime --example w1`.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use rand::{RngExt, SeedableRng};
use shadowbrain_runtime::embed::Embedder;
use shadowbrain_runtime::embed::hash::HashEmbedder;
use shadowbrain_runtime::model::NewMemory;
use shadowbrain_runtime::store::Filter;
use shadowbrain_runtime::substrate::{Substrate, SubstrateOptions};

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
}

criterion_group! {
    name = substrate;
    config = Criterion::default().sample_size(20);
    targets = benches
}
criterion_main!(substrate);
