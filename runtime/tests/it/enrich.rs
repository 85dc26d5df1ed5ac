//! Remote embedding through the durable enrichment queue, against a real OpenAI-compatible
//! HTTP server served by the test on 127.0.0.1: ingest acknowledges without waiting for the
//! provider, records are embedded in the background, and records queued while the provider
//! is down (even across a restart) are embedded once it is back.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use shadowbrain_runtime::embed::HashEmbedder;
use shadowbrain_runtime::embed::{EmbedderConfig, EmbedderKind, build_embedder};
use shadowbrain_runtime::internals::Queue;
use shadowbrain_runtime::{NewMemory, RecallRequest, Scope, Substrate, SubstrateOptions};
use shadowbrain_test_support::{Endpoint, Reply};

/// The provider: the shared scripted endpoint, answering 503 while it is down and, once
/// up, with the hash embedder's vectors (a deterministic "model": similar texts land close).
struct Provider {
    up: Arc<AtomicBool>,
    endpoint: Endpoint,
}

impl Provider {
    async fn start() -> Provider {
        let up = Arc::new(AtomicBool::new(false));
        let is_up = up.clone();
        let endpoint = Endpoint::start(move |request| {
            if !is_up.load(Ordering::SeqCst) {
                return Reply::error(503, "the provider is down");
            }
            let model = HashEmbedder::default();
            request.embedded_by(|t| model.embed_one(t))
        })
        .await;
        Provider { up, endpoint }
    }

    fn requests(&self) -> usize {
        self.endpoint.requests()
    }
}

fn options(base_url: &str) -> SubstrateOptions {
    let cfg = EmbedderConfig {
        kind: EmbedderKind::Openai,
        base_url: Some(base_url.to_string()),
        model: Some("test-embed".into()),
        dimensions: Some(384),
        timeout: "2s".into(),
        max_retries: 0,
        ..EmbedderConfig::default()
    };
    SubstrateOptions {
        embedder: build_embedder(&cfg).unwrap(),
        ..SubstrateOptions::default()
    }
}

async fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn found_by_vector(sub: &Substrate, query: &str) -> bool {
    sub.catch_up().unwrap();
    let q = HashEmbedder::default().embed_one(query);
    let all = sub
        .store()
        .candidates(&shadowbrain_runtime::internals::Filter {
            namespace: "default",
            ..Default::default()
        });
    !sub.vectors().search(&q, 1, Some(&all)).unwrap().is_empty()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_embeddings_arrive_in_the_background_and_survive_outages() {
    let provider = Provider::start().await;
    let url = provider.endpoint.base_url();
    let dir = tempfile::tempdir().unwrap();

    // Provider down: ingest still acknowledges; the records wait in the durable queue.
    let sub = Substrate::open(dir.path(), options(&url)).unwrap();
    let ids = sub
        .record(
            "default",
            "s",
            vec![NewMemory::new(
                "observation",
                "the certificate of the load balancer expired",
            )],
        )
        .await
        .unwrap();
    assert_eq!(sub.store().queued(Queue::Enrich, 10).unwrap(), ids);
    wait_until("the enricher tried", || provider.requests() > 0).await;
    // What an operator sees: the failure counted, the record waiting in the queue.
    wait_until("the failure is counted", || sub.provider_errors() > 0).await;
    assert_eq!(sub.store().queue_depth(Queue::Enrich, 100).unwrap(), 1);
    assert!(
        sub.store()
            .get(ids[0])
            .unwrap()
            .unwrap()
            .embedding
            .is_none()
    );
    // Keyword search works at once, whatever the provider does.
    let mut req = RecallRequest::new("default", "other", "load balancer certificate");
    req.scope = Scope::Namespace;
    req.query_embedding = Some(HashEmbedder::default().embed_one("load balancer certificate"));
    assert_eq!(sub.recall(&req).await.unwrap().memories.len(), 1);
    sub.close().unwrap();
    drop(sub);
    reopen_and_finish(dir.path(), &url, &provider, ids[0]).await;
}

async fn reopen_and_finish(
    dir: &Path,
    url: &str,
    provider: &Provider,
    id: shadowbrain_runtime::MemoryId,
) {
    provider.up.store(true, Ordering::SeqCst);
    // After a restart the queue is picked up again.
    let sub = Substrate::open(dir, options(url)).unwrap();
    wait_until("the queued record is embedded", || {
        sub.store().queued(Queue::Enrich, 10).unwrap().is_empty()
    })
    .await;
    assert_eq!(sub.store().queue_depth(Queue::Enrich, 100).unwrap(), 0);
    let r = sub.store().get(id).unwrap().unwrap();
    assert_eq!(r.embedding.as_ref().map(Vec::len), Some(384));
    assert!(found_by_vector(&sub, "load balancer certificate").await);
    let history: Vec<String> = sub
        .history("default", id)
        .unwrap()
        .iter()
        .map(|e| format!("{:?}", e.action))
        .collect();
    assert!(history.contains(&"Embedded".to_string()), "{history:?}");
    // New records flow through without a restart.
    let ids = sub
        .record(
            "default",
            "s",
            vec![NewMemory::new("thought", "rotate the certificate monthly")],
        )
        .await
        .unwrap();
    wait_until("the new record is embedded", || {
        sub.store()
            .get(ids[0])
            .unwrap()
            .unwrap()
            .embedding
            .is_some()
    })
    .await;
    sub.close().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_arriving_embedding_leaves_the_keyword_statistics_alone() {
    let provider = Provider::start().await;
    let dir = tempfile::tempdir().unwrap();
    let sub = Substrate::open(dir.path(), options(&provider.endpoint.base_url())).unwrap();
    let texts = [
        "the certificate of the load balancer expired",
        "rotate the certificate monthly",
        "the load balancer answers on port 443",
    ];
    // Two come with their vectors, one waits for the provider: only part of the committed
    // segment would be written again.
    for (i, t) in texts.into_iter().enumerate() {
        let embedding = (i != 1).then(|| HashEmbedder::default().embed_one(t));
        let event = NewMemory {
            embedding,
            ..NewMemory::new("observation", t)
        };
        sub.record("default", "s", vec![event]).await.unwrap();
    }
    // The texts are committed to the keyword index before any embedding arrives.
    sub.flush_indexes().unwrap();
    let before = sub.keywords().query_stats("certificate load").unwrap();
    provider.up.store(true, Ordering::SeqCst);
    wait_until("every record is embedded", || {
        sub.store().queue_depth(Queue::Enrich, 10).unwrap() == 0
    })
    .await;
    sub.flush_indexes().unwrap();
    // Indexing the unchanged texts again would leave deleted copies in tantivy's term
    // statistics until a merge, and move every BM25 score.
    let after = sub.keywords().query_stats("certificate load").unwrap();
    assert_eq!(format!("{after:?}"), format!("{before:?}"));
    assert!(found_by_vector(&sub, "rotate the certificate").await);
    sub.close().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_round_carries_about_as_many_texts_as_asked_whatever_the_records_length() {
    let provider = Provider::start().await;
    let dir = tempfile::tempdir().unwrap();
    // No enricher of its own: the test runs the rounds.
    let opts = SubstrateOptions {
        indexing: shadowbrain_runtime::IndexingOptions {
            background: false,
            ..Default::default()
        },
        ..options(&provider.endpoint.base_url())
    };
    let sub = Substrate::open(dir.path(), opts).unwrap();
    let long = "The billing service moved to a new region after the audit. ".repeat(100);
    let passages = shadowbrain_runtime::internals::split(&long).len();
    assert!(passages > 8);
    let mut events: Vec<NewMemory> = (0..3)
        .map(|_| NewMemory::new("observation", &long))
        .collect();
    events.extend((0..4).map(|i| NewMemory::new("observation", format!("short note {i}"))));
    sub.record("default", "s", events).await.unwrap();
    provider.up.store(true, Ordering::SeqCst);
    // A long record alone is more than a round of 8 texts: it goes alone.
    assert_eq!(sub.enrich_pending(8).await.unwrap(), 1);
    // Two long records fit in a round of 2 × their passages, the third waits.
    assert_eq!(sub.enrich_pending(2 * passages).await.unwrap(), 2);
    assert_eq!(sub.enrich_pending(passages).await.unwrap(), 4);
    assert_eq!(sub.store().queue_depth(Queue::Enrich, 10).unwrap(), 0);
    sub.close().unwrap();
}
