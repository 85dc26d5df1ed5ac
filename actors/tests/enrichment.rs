//! Embedding under the actor runtime with a remote embedder, against a real scripted
//! OpenAI-compatible endpoint on 127.0.0.1: every record is embedded once by the Enricher
//! actor, a paraphrase finds its record by the vector path, a provider that is down loses
//! nothing and keeps records keyword-recallable, and a restart mid-queue resumes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use shadowbrain_actors::{Runtime, RuntimeConfig};
use shadowbrain_runtime::embed::{EmbedderConfig, EmbedderKind, OpenAiEmbedder};
use shadowbrain_runtime::internals::{Queue, stored_embedding};
use shadowbrain_runtime::{MemoryId, NewMemory, RecallRequest, Scope};
use shadowbrain_test_support::Endpoint;
use shadowbrain_test_support::concepts::{ConceptProvider, DIMENSIONS, concepts};

fn event(text: &str) -> NewMemory {
    NewMemory {
        kind: "observation".into(),
        text: Some(text.into()),
        ..NewMemory::default()
    }
}

/// Unrelated chatter: no word of it is in a synonym group of the toy model.
fn chatter(i: usize) -> String {
    const WORDS: &[&str] = &[
        "weather", "sunny", "beach", "meeting", "agenda", "report", "printer", "coffee", "garden",
        "invoice", "server", "ticket", "window", "river", "pencil", "orange",
    ];
    format!(
        "note {i}: {} {} {}",
        WORDS[i % WORDS.len()],
        WORDS[(i * 7 + 3) % WORDS.len()],
        WORDS[(i * 5 + 1) % WORDS.len()]
    )
}

/// A provider of the toy concept model (down from the start if `down`), its endpoint, and
/// a scratch data directory.
async fn start_provider(down: bool) -> (Arc<ConceptProvider>, Endpoint, tempfile::TempDir) {
    let provider = Arc::new(ConceptProvider::default());
    provider.set_down(down);
    let p = provider.clone();
    let endpoint = Endpoint::start(move |r| p.answer(r)).await;
    (provider, endpoint, tempfile::tempdir().unwrap())
}

fn config(dir: &tempfile::TempDir, endpoint: &Endpoint) -> RuntimeConfig {
    let mut config = RuntimeConfig::new(dir.path());
    config.call_timeout = Duration::from_secs(60);
    let embedder = OpenAiEmbedder::new(&EmbedderConfig {
        kind: EmbedderKind::Openai,
        base_url: Some(endpoint.base_url()),
        model: Some("concepts".into()),
        dimensions: Some(DIMENSIONS),
        batch_size: 8,
        max_concurrency: 2,
        max_retries: 1,
        timeout: "5s".into(),
        ..EmbedderConfig::default()
    })
    .unwrap()
    .with_backoff(Duration::from_millis(10), Duration::from_millis(50));
    config.substrate.embedder = Arc::new(embedder);
    config
}

fn queued(rt: &Runtime) -> usize {
    rt.substrate()
        .store()
        .queue_depth(Queue::Enrich, 1_000_000)
        .unwrap()
}

/// Waits until the enrichment queue is empty.
async fn drained(rt: &Runtime, deadline: Duration) {
    let start = Instant::now();
    while queued(rt) > 0 {
        assert!(
            start.elapsed() < deadline,
            "{} records still wait for their embedding after {deadline:?}",
            queued(rt)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A namespace-wide recall asked from a session that wrote nothing, so the session's recent
/// records cannot put anything in front of it.
fn ask(query: &str) -> RecallRequest {
    RecallRequest {
        scope: Scope::Namespace,
        k: 5,
        ..RecallRequest::new("default", "asker", query)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_record_is_embedded_once_and_a_paraphrase_finds_its_record() {
    let (provider, endpoint, dir) = start_provider(false).await;
    let rt = Runtime::open(config(&dir, &endpoint)).await.unwrap();
    // 43 events over three sessions: several of the enricher's rounds.
    let target = "we bought a sedan for the team last week";
    let mut ids: Vec<(MemoryId, String)> = Vec::new();
    for i in 0..42 {
        let text = chatter(i);
        let session = rt.session("default", &format!("s{}", i % 3)).unwrap();
        ids.push((session.record(event(&text)).await.unwrap(), text));
    }
    let session = rt.session("default", "s1").unwrap();
    let target_id = session.record(event(target)).await.unwrap();
    ids.push((target_id, target.into()));

    drained(&rt, Duration::from_secs(30)).await;
    for (id, text) in &ids {
        // The provider's vector, as the store keeps it (half precision).
        let embedding = rt.substrate().store().embedding(*id).unwrap().unwrap();
        assert_eq!(embedding, stored_embedding(&concepts(text)), "{text}");
        assert_eq!(provider.times_embedded(text), 1, "{text}");
    }
    // Batches of 8, at most 2 on the wire.
    assert!(endpoint.seen().iter().all(|r| r.inputs().len() <= 8));
    assert!(
        endpoint.max_in_flight() <= 2,
        "{}",
        endpoint.max_in_flight()
    );

    // No word in common with the target: only the vector path can find it.
    let asker = rt.session("default", "asker").unwrap();
    let answer = asker.recall_with(ask("acquired automobile")).await.unwrap();
    assert!(answer.notes.is_empty(), "{:?}", answer.notes);
    assert_eq!(
        answer.memories.first().map(|m| m.record.id),
        Some(target_id),
        "{:?}",
        answer
            .memories
            .iter()
            .map(|m| (&m.record.text, m.why.relevance))
            .collect::<Vec<_>>()
    );
    rt.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_down_for_a_while_loses_nothing_and_embeds_each_record_once() {
    let (provider, endpoint, dir) = start_provider(true).await;
    let rt = Runtime::open(config(&dir, &endpoint)).await.unwrap();
    let session = rt.session("default", "ops").unwrap();
    let mut ids = Vec::new();
    for i in 0..20 {
        ids.push(session.record(event(&chatter(i))).await.unwrap());
    }
    let written = session
        .record(event("the deploy runner moved to eu-2"))
        .await
        .unwrap();
    ids.push(written);
    // The enricher tried and failed, and keeps the records queued.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(endpoint.requests() > 0, "the enricher never asked");
    assert_eq!(queued(&rt), ids.len());
    // Readable and keyword-recallable meanwhile; the answer says what it went without.
    assert_eq!(session.timeline(100).await.unwrap().len(), ids.len());
    let answer = session.recall("deploy runner").await.unwrap();
    assert_eq!(answer.memories.first().map(|m| m.record.id), Some(written));
    assert!(
        answer.notes.iter().any(|n| n.contains("no vector path")),
        "{:?}",
        answer.notes
    );

    provider.set_down(false);
    drained(&rt, Duration::from_secs(60)).await;
    for id in &ids {
        let record = rt.memory("default", *id).unwrap().get().await.unwrap();
        assert!(rt.substrate().store().embedding(*id).unwrap().is_some());
        assert_eq!(provider.times_embedded(&record.text), 1, "{}", record.text);
    }
    let answer = session.recall("deploy runner").await.unwrap();
    assert!(answer.notes.is_empty(), "{:?}", answer.notes);
    rt.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_with_records_still_queued_resumes_their_embedding() {
    let (provider, endpoint, dir) = start_provider(true).await;
    let mut ids = Vec::new();
    {
        let rt = Runtime::open(config(&dir, &endpoint)).await.unwrap();
        let session = rt.session("default", "ops").unwrap();
        for i in 0..30 {
            ids.push(session.record(event(&chatter(i))).await.unwrap());
        }
        rt.shutdown().await.unwrap();
    }
    provider.set_down(false);
    let rt = Runtime::open(config(&dir, &endpoint)).await.unwrap();
    drained(&rt, Duration::from_secs(30)).await;
    for (i, id) in ids.iter().enumerate() {
        assert!(rt.substrate().store().embedding(*id).unwrap().is_some());
        assert_eq!(provider.times_embedded(&chatter(i)), 1, "{}", chatter(i));
    }
    rt.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_enricher_goes_on_embedding() {
    let (provider, endpoint, dir) = start_provider(false).await;
    let rt = Runtime::open(config(&dir, &endpoint)).await.unwrap();
    let session = rt.session("default", "ops").unwrap();
    session.record(event(&chatter(0))).await.unwrap();
    drained(&rt, Duration::from_secs(30)).await;
    rt.inject_panic(shadowbrain_actors::Fault::Enricher)
        .await
        .unwrap();
    let start = Instant::now();
    while rt.restarts().await.unwrap() == 0 {
        assert!(start.elapsed() < Duration::from_secs(10), "no restart");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for i in 1..10 {
        session.record(event(&chatter(i))).await.unwrap();
    }
    drained(&rt, Duration::from_secs(30)).await;
    for i in 0..10 {
        assert_eq!(provider.times_embedded(&chatter(i)), 1, "{}", chatter(i));
    }
    rt.shutdown().await.unwrap();
}
