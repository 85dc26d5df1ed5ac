//! Long events on a real store: kept whole as sent, embedded passage by passage, found by a
//! detail deep inside them, and shown by the passage that matched (named in `why`) so the
//! context stays small — with the hash embedder inline, and with the real local model
//! through the enrichment queue (skipped when the model is not installed).

use std::sync::Arc;

use roaring::RoaringBitmap;
use shadowbrain_runtime::embed::{HashEmbedder, LocalEmbedder};
use shadowbrain_runtime::internals::{Mutation, WriteSet, split};
use shadowbrain_runtime::{
    IndexingOptions, MemoryId, NewMemory, RecallRequest, RecallResult, Substrate, SubstrateOptions,
};

use super::local_model::model;

/// Plain prose on many topics, `sentences` long, none of it about cars or buying.
fn prose(sentences: usize) -> String {
    const TOPICS: &[&str] = &[
        "The quarterly report shows that rainfall in the northern valley rose by {} percent.",
        "Maria practised the violin for {} minutes before the evening rehearsal began.",
        "The library moved {} boxes of old newspapers into the basement archive.",
        "Our gardener planted {} tulip bulbs along the path to the greenhouse.",
        "The committee discussed whether the bridge needs {} new support cables.",
        "A flock of {} geese landed on the frozen lake just after sunrise.",
        "The bakery on the corner sold {} loaves of rye bread on Saturday.",
        "Engineers measured a latency of {} milliseconds on the staging cluster.",
    ];
    (0..sentences)
        .map(|i| TOPICS[i % TOPICS.len()].replace("{}", &(i * 7 + 3).to_string()))
        .collect::<Vec<_>>()
        .join(" ")
}

const DETAIL: &str = "Vehicles. After weeks of comparing offers we finally purchased a blue \
                      sedan from the dealer in Lyon for the field team. The car has four doors, \
                      a large trunk for their equipment and a hybrid engine. The engineers \
                      will drive it to the customer sites, and the dealer services it every \
                      spring.";

/// A long text with [`DETAIL`] about two thirds of the way in.
fn long_text() -> String {
    format!("{}\n\n{DETAIL}\n\n{}", prose(160), prose(80))
}

fn options(embedder: Option<Arc<dyn shadowbrain_runtime::embed::Embedder>>) -> SubstrateOptions {
    let mut opts = SubstrateOptions {
        indexing: IndexingOptions {
            background: false,
            ..IndexingOptions::default()
        },
        ..SubstrateOptions::default()
    };
    if let Some(e) = embedder {
        opts.embedder = e;
    }
    opts
}

async fn record(sub: &Substrate, text: &str) -> MemoryId {
    sub.record("ns", "s", vec![NewMemory::new("observation", text)])
        .await
        .unwrap()[0]
}

async fn ask(sub: &Substrate, query: &str) -> RecallResult {
    sub.recall(&RecallRequest::new("ns", "s", query))
        .await
        .unwrap()
}

/// The byte range of [`DETAIL`] in `text`.
fn detail_range(text: &str) -> std::ops::Range<usize> {
    let at = text.find(DETAIL).unwrap();
    at..at + DETAIL.len()
}

fn check_the_long_record_is_shown_by_its_detail(
    sub: &Substrate,
    answer: &RecallResult,
    long: MemoryId,
    text: &str,
) {
    let top = &answer.memories[0];
    assert_eq!(top.record.id, long, "{:#?}", answer.context);
    assert_eq!(top.record.text, text, "the record comes back whole");
    let hit = top.why.passage.expect("a long record names its passage");
    let passages = sub.store().passages(long).unwrap();
    assert_eq!(hit.of as usize, passages.len());
    let d = detail_range(text);
    assert!(
        (hit.end as usize)
            .min(d.end)
            .saturating_sub((hit.start as usize).max(d.start))
            >= d.len() / 2,
        "passage {hit:?} holds most of the detail at {d:?}"
    );
    let line = answer
        .context
        .lines()
        .find(|l| l.contains("(part"))
        .unwrap_or_else(|| panic!("no passage in the context: {}", answer.context));
    assert!(line.contains("blue sedan"), "{line}");
    assert!(
        line.len() < 2 * shadowbrain_runtime::internals::PASSAGE_CHARS,
        "the context shows a passage, not the whole {}-byte text: {line}",
        text.len(),
    );
}

#[tokio::test]
async fn a_long_event_is_kept_whole_split_into_passages_and_found_by_a_detail() {
    let dir = tempfile::tempdir().unwrap();
    let sub =
        Substrate::open(dir.path(), options(Some(Arc::new(HashEmbedder::default())))).unwrap();
    for i in 0..30 {
        record(
            &sub,
            &prose(3 + i % 4).replace("The", &format!("Note {i}: the")),
        )
        .await;
    }
    let text = long_text();
    let long = record(&sub, &text).await;
    let stored = sub.store().get(long).unwrap().unwrap();
    assert_eq!(stored.text, text);
    let passages = sub.store().passages(long).unwrap();
    let ranges = split(&text);
    assert!(ranges.len() > 20, "{} passages", ranges.len());
    assert_eq!(passages.len(), ranges.len());
    for (p, r) in passages.iter().zip(&ranges) {
        assert_eq!((p.start as usize, p.end as usize), (r.start, r.end));
        assert_eq!(p.embedding.len(), stored.embedding.as_ref().unwrap().len());
    }
    // A short record has no passages and no passage in its `why`.
    let short = record(&sub, "the printer on floor two is out of toner").await;
    assert!(sub.store().passages(short).unwrap().is_empty());
    let answer = ask(&sub, "printer toner").await;
    assert_eq!(answer.memories[0].record.id, short);
    assert!(answer.memories[0].why.passage.is_none());

    let answer = ask(&sub, "which sedan did we purchase from the dealer in Lyon?").await;
    check_the_long_record_is_shown_by_its_detail(&sub, &answer, long, &text);

    // The catalog knows which records have passages, and rebuilds that on open.
    let everything: RoaringBitmap = (0..=short.0).collect();
    let marked =
        |sub: &Substrate| -> Vec<u32> { sub.store().with_passages(&everything).iter().collect() };
    assert_eq!(marked(&sub), [long.0]);
    sub.close().unwrap();
    drop(sub);
    let sub =
        Substrate::open(dir.path(), options(Some(Arc::new(HashEmbedder::default())))).unwrap();
    assert_eq!(marked(&sub), [long.0]);
    // Removing the record for good removes its passages.
    sub.store()
        .write(WriteSet(vec![Mutation::Purge(Box::new(stored))]))
        .unwrap();
    assert!(sub.store().passages(long).unwrap().is_empty());
    assert!(marked(&sub).is_empty());
}

#[tokio::test]
async fn the_text_limit_admits_a_long_event_and_refuses_past_it_with_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let sub = Substrate::open(dir.path(), options(None)).unwrap();
    let limit = sub.limits().max_text_bytes;
    let big = "word ".repeat(limit / 5);
    let id = record(&sub, &big).await;
    assert_eq!(sub.store().get(id).unwrap().unwrap().text.len(), big.len());
    let err = sub
        .record(
            "ns",
            "s",
            vec![NewMemory::new("observation", "x".repeat(limit + 1))],
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains(&limit.to_string()), "{err}");
}

#[tokio::test]
async fn with_the_local_model_a_paraphrase_finds_a_detail_deep_in_a_long_event() {
    let Some(model_dir) = model() else { return };
    let embedder = Arc::new(LocalEmbedder::open(&model_dir, None).unwrap());
    let dir = tempfile::tempdir().unwrap();
    let sub = Substrate::open(dir.path(), options(Some(embedder))).unwrap();
    let text = long_text();
    let long = record(&sub, &text).await;
    // A short record about a vehicle: nearer the question than the long record's mean
    // vector, so only the passage can put the long record first.
    record(
        &sub,
        "The vehicle inspection for the office van is due next month.",
    )
    .await;
    record(
        &sub,
        "We talked about which restaurant to book for the team dinner.",
    )
    .await;
    drain(&sub).await;
    assert!(sub.store().passages(long).unwrap().len() > 20);
    let answer = ask(
        &sub,
        "Which automobile did we acquire for the crew working outdoors?",
    )
    .await;
    check_the_long_record_is_shown_by_its_detail(&sub, &answer, long, &text);
}

/// Embeds everything queued, as the enricher would.
async fn drain(sub: &Substrate) {
    while sub.enrich_pending(64).await.unwrap() > 0 {}
}

#[tokio::test]
async fn a_scope_of_more_passages_than_one_recall_scans_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let sub =
        Substrate::open(dir.path(), options(Some(Arc::new(HashEmbedder::default())))).unwrap();
    // 11 records of ~2,000 passages each: more than one recall compares (20,000).
    let text = prose(12_000);
    for _ in 0..11 {
        record(&sub, &text).await;
    }
    let newest = record(&sub, &format!("{text} {DETAIL}")).await;
    let answer = ask(&sub, "blue sedan dealer in Lyon").await;
    assert_eq!(answer.memories[0].record.id, newest);
    assert!(
        answer
            .notes
            .iter()
            .any(|n| n.contains("only the newest long records")),
        "{:?}",
        answer.notes
    );
    // A recall whose scope is small enough says nothing.
    let small = tempfile::tempdir().unwrap();
    let sub = Substrate::open(
        small.path(),
        options(Some(Arc::new(HashEmbedder::default()))),
    )
    .unwrap();
    record(&sub, &text).await;
    assert!(ask(&sub, "rainfall").await.notes.is_empty());
}
