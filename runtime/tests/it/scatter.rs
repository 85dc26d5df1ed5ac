//! A namespace spread over several stores by session, recalled with `recall_across`, ranks
//! as one store holding every record does: the same texts in the same order, the same
//! scores and the same rendered context, for many queries, every scope and two policies
//! (one diversifying, so embeddings cross the merge too, and reading more neighbours); and
//! on LoCoMo's ten conversations, one session each, spread over three stores and asked
//! namespace-wide.

use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use shadowbrain_runtime::embed::{Embedder, HashEmbedder};
use shadowbrain_runtime::policy::Policy;
use shadowbrain_runtime::{
    IdBlock, IndexingOptions, MemoryId, NewMemory, PartFuture, PartLink, RecallRequest,
    RecallResult, Scope, Spread, Substrate, SubstrateOptions, VirtualClock, recall_across,
};
use shadowbrain_test_support::words::WORDS;

const T0: i64 = 1_780_000_000_000;

fn open(dir: &std::path::Path, ids: Option<IdBlock>) -> Substrate {
    open_with(dir, ids, Arc::new(HashEmbedder::default()))
}

fn open_with(
    dir: &std::path::Path,
    ids: Option<IdBlock>,
    embedder: Arc<dyn Embedder>,
) -> Substrate {
    let mut opts = SubstrateOptions {
        clock: Arc::new(VirtualClock::new(T0)),
        // The hash embedder embeds as records are written; a model embeds them in the
        // background, which must run then.
        indexing: IndexingOptions {
            background: !embedder.embeds_inline(),
            ..IndexingOptions::default()
        },
        embedder,
        ids,
        ..SubstrateOptions::default()
    };
    // Every scope here is searched exactly, as the equivalence needs (module docs).
    opts.vector.exact_threshold = 10_000;
    Substrate::open(dir, opts).unwrap()
}

fn sentence(rng: &mut StdRng, n: usize) -> String {
    (0..n)
        .map(|_| WORDS[rng.random_range(0..WORDS.len())])
        .collect::<Vec<_>>()
        .join(" ")
}

fn view(r: &RecallResult) -> Vec<(String, i64)> {
    r.memories
        .iter()
        .map(|m| (m.record.text.clone(), m.record.event_time))
        .collect()
}

/// The spread recall's answer is the one store's: the same texts and times in the same
/// order, the same scores (to rounding), passages and rendered context.
fn assert_same(spread: &RecallResult, one: &RecallResult, at: &str) {
    assert_eq!(view(spread), view(one), "{at}");
    for (a, b) in spread.memories.iter().zip(&one.memories) {
        assert!(
            (a.score - b.score).abs() <= 1e-5,
            "{at}: {} vs {}",
            a.score,
            b.score
        );
        assert_eq!(a.why.passage, b.why.passage, "{at}");
    }
    assert_eq!(spread.context, one.context, "{at}");
}

/// Twelve sessions of two agents, 30 turns each, a turn a minute and sessions a day
/// apart, every seventh turn a long record (passages), each text unique: all of them in
/// `whole`, and session `s` in `parts[s mod len]`.
async fn write_sessions(rng: &mut StdRng, whole: &Substrate, parts: &[Substrate]) {
    let mut time = T0 - 30 * 86_400_000;
    for s in 0..12usize {
        let session = format!("s{s}");
        let part = &parts[s % parts.len()];
        for t in 0..30 {
            time += 60_000;
            let speaker = if t % 2 == 0 { "Alice" } else { "Bob" };
            let words = if t % 7 == 3 { 900 } else { 12 };
            let text = format!("{speaker}: {} (turn {s}.{t})", sentence(rng, words));
            let mut m = NewMemory::new("message", &text);
            m.timestamp = Some(time);
            m.agent_id = Some(format!("agent-{}", s % 2));
            whole.record("ns", &session, vec![m.clone()]).await.unwrap();
            part.record("ns", &session, vec![m]).await.unwrap();
        }
        time += 86_400_000;
    }
}

#[tokio::test]
async fn a_namespace_spread_by_session_ranks_as_one_store() {
    const PARTS: u16 = 3;
    let dirs: Vec<_> = (0..=PARTS).map(|_| tempfile::tempdir().unwrap()).collect();
    let whole = open(dirs[0].path(), None);
    let parts: Vec<Substrate> = (0..PARTS)
        .map(|p| {
            open(
                dirs[p as usize + 1].path(),
                Some(IdBlock::of_partition(p, PARTS)),
            )
        })
        .collect();
    let mut rng = StdRng::seed_from_u64(49);
    write_sessions(&mut rng, &whole, &parts).await;
    let embedder = HashEmbedder::default();
    let default = Arc::new(Policy::default_policy());
    // Diversifying, and with a wider neighbouring-turn window than the parts' own policy:
    // every round follows the coordinator's.
    let mut diverse = Policy::default_policy();
    diverse.scoring.mmr_lambda = 0.7;
    diverse.scoring.context_window += 2;
    let diverse = Arc::new(diverse);
    let mut compared = 0;
    for q in 0..24 {
        let query = sentence(&mut rng, 1 + q % 4);
        let vector = embedder
            .embed(std::slice::from_ref(&query))
            .await
            .unwrap()
            .pop();
        for scope in [Scope::Namespace, Scope::Agent, Scope::Session] {
            for policy in [&default, &diverse] {
                let mut req = RecallRequest::new("ns", &format!("s{}", q % 12), &query);
                req.scope = scope;
                req.agent_id = Some(format!("agent-{}", q % 2));
                req.k = 8;
                let (one, _) = whole.rank(&req, vector.as_deref(), policy).unwrap();
                let (spread, writes) = recall_across(&parts, &req, vector.as_deref(), policy, T0)
                    .await
                    .unwrap();
                let at = format!(
                    "query {q} {query:?}, {scope:?}, mmr {}",
                    policy.scoring.mmr_lambda
                );
                assert_same(&spread, &one, &at);
                // Each part is sent the reinforcement of its own returned records.
                let sent: usize = writes.iter().map(|w| w.0.len()).sum();
                assert_eq!(sent, spread.memories.len(), "{at}");
                for (p, w) in writes.iter().enumerate() {
                    let block = IdBlock::of_partition(p as u16, PARTS);
                    let theirs = spread
                        .memories
                        .iter()
                        .filter(|m| block.contains(m.record.id.0));
                    assert_eq!(w.0.len(), theirs.count(), "{at}, part {p}");
                }
                compared += usize::from(!one.memories.is_empty());
            }
        }
    }
    assert!(compared > 100, "only {compared} recalls found anything");
    whole.close().unwrap();
    for p in parts {
        p.close().unwrap();
    }
}

/// Another store reached as the cluster reaches one: what is asked of it as bytes,
/// answered by [`Substrate::answer_part`].
#[derive(Debug)]
pub(crate) struct Link(pub(crate) Substrate);

impl PartLink for Link {
    fn ids(&self) -> IdBlock {
        self.0.store().id_block()
    }

    fn ask(&self, ask: Vec<u8>, _repeatable: bool) -> PartFuture<'_> {
        Box::pin(async move { Ok(self.0.answer_part(ask).await) })
    }
}

/// The other stores of a spread, and the one holding the knowledge pool (`None`: the
/// store given this spread).
#[derive(Debug)]
pub(crate) struct Others {
    pub(crate) parts: Vec<Substrate>,
    pub(crate) home: Option<Substrate>,
}

impl Spread for Others {
    fn others(&self, _namespace: &str) -> Vec<Arc<dyn PartLink>> {
        self.parts
            .iter()
            .map(|s| Arc::new(Link(s.clone())) as Arc<dyn PartLink>)
            .collect()
    }

    fn home(&self, _namespace: &str) -> Option<Arc<dyn PartLink>> {
        let home = self.home.clone()?;
        Some(Arc::new(Link(home)))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_with_a_spread_recalls_over_the_wire_as_one_store() {
    const PARTS: u16 = 3;
    let dirs: Vec<_> = (0..=PARTS).map(|_| tempfile::tempdir().unwrap()).collect();
    let whole = open(dirs[0].path(), None);
    let others: Vec<Substrate> = (1..PARTS)
        .map(|p| {
            open(
                dirs[p as usize + 1].path(),
                Some(IdBlock::of_partition(p, PARTS)),
            )
        })
        .collect();
    // The coordinator is the store a request reaches: the asking session's.
    let mut opts = SubstrateOptions {
        clock: Arc::new(VirtualClock::new(T0)),
        indexing: IndexingOptions {
            background: false,
            ..IndexingOptions::default()
        },
        ids: Some(IdBlock::of_partition(0, PARTS)),
        spread: Some(Arc::new(Others {
            parts: others.clone(),
            home: None,
        })),
        ..SubstrateOptions::default()
    };
    opts.vector.exact_threshold = 10_000;
    let here = Substrate::open(dirs[1].path(), opts).unwrap();
    let mut parts = vec![here.clone()];
    parts.extend(others.iter().cloned());
    let mut rng = StdRng::seed_from_u64(7);
    write_sessions(&mut rng, &whole, &parts).await;
    let mut compared = 0;
    for q in 0..12 {
        let query = sentence(&mut rng, 1 + q % 3);
        for scope in [Scope::Namespace, Scope::Agent, Scope::Session] {
            // Sessions 0, 3, 6 and 9 are the coordinator's own.
            let mut req = RecallRequest::new("ns", &format!("s{}", 3 * (q % 4)), &query);
            req.scope = scope;
            req.agent_id = Some(format!("agent-{}", q % 2));
            req.k = 8;
            // Reinforcement would change the next query's scores on each side at its own
            // pace; it is checked below.
            req.reinforce = false;
            let one = whole.recall(&req).await.unwrap();
            let spread = here.recall(&req).await.unwrap();
            assert_same(&spread, &one, &format!("query {q} {query:?}, {scope:?}"));
            assert!(spread.recall_id.is_some());
            compared += usize::from(!one.memories.is_empty());
        }
    }
    assert!(compared > 24, "only {compared} recalls found anything");
    // The namespace's sessions are listed from every part.
    let listed = here.sessions("ns").await.unwrap();
    assert_eq!(listed.len(), 12);
    assert_eq!(listed, whole.sessions("ns").await.unwrap());
    // A recall's reinforcement reaches the parts holding what it returned.
    let mut req = RecallRequest::new("ns", "s0", "deploy staging invoice garden");
    req.scope = Scope::Namespace;
    req.k = 20;
    let got = here.recall(&req).await.unwrap();
    let elsewhere: Vec<_> = got
        .memories
        .iter()
        .filter(|m| !here.store().id_block().contains(m.record.id.0))
        .map(|m| m.record.id)
        .collect();
    assert!(
        !elsewhere.is_empty(),
        "the recall returned only its own records"
    );
    let reinforced = |id| {
        others.iter().any(|o| {
            o.store()
                .get(id)
                .unwrap()
                .is_some_and(|r| r.reinforcements > 0)
        })
    };
    for _ in 0..200 {
        for o in &others {
            o.store().sync().await.unwrap();
        }
        if elsewhere.iter().all(|&id| reinforced(id)) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(elsewhere.iter().all(|&id| reinforced(id)), "{elsewhere:?}");
    // Feedback on that recall reaches every part holding what it returned.
    let target = shadowbrain_runtime::FeedbackTarget::Recall(got.recall_id.clone().unwrap());
    let report = here
        .feedback("ns", &target, shadowbrain_runtime::Outcome::Success, "s0")
        .await
        .unwrap();
    assert_eq!(report.updated, got.memories.len());
    for m in &got.memories {
        let holder = parts
            .iter()
            .find(|p| p.store().id_block().contains(m.record.id.0))
            .unwrap();
        holder.store().sync().await.unwrap();
        let now = holder.get("ns", m.record.id).unwrap();
        assert_eq!(now.utility.successes, 1, "{}", m.record.id);
    }
    // An unknown id another part would hold is refused, and nothing is written here.
    let unknown = MemoryId(IdBlock::of_partition(2, PARTS).first + 99_999);
    let mine = got
        .memories
        .iter()
        .map(|m| m.record.id)
        .find(|id| here.store().id_block().contains(id.0))
        .unwrap();
    let target = shadowbrain_runtime::FeedbackTarget::Memories(vec![mine, unknown]);
    let refused = here
        .feedback("ns", &target, shadowbrain_runtime::Outcome::Failure, "s0")
        .await
        .unwrap_err();
    assert!(
        matches!(
            refused,
            shadowbrain_runtime::Error::NotFound { what: "memory", .. }
        ),
        "{refused}"
    );
    assert_eq!(here.get("ns", mine).unwrap().utility.failures, 0);
    whole.close().unwrap();
    for p in parts {
        p.close().unwrap();
    }
}

/// LoCoMo's conversations (the sibling `shared/data/locomo/`, or `SHADOWBRAIN_LOCOMO`);
/// without them the test says so and passes, unless `SHADOWBRAIN_REQUIRE_LOCOMO` is set.
fn locomo() -> Option<Vec<shadowbrain_runtime::eval::Conversation>> {
    let path = std::env::var_os("SHADOWBRAIN_LOCOMO").map_or_else(
        || {
            std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../../shared/data/locomo/locomo10.json")
        },
        std::path::PathBuf::from,
    );
    if !path.is_file() {
        assert!(
            std::env::var_os("SHADOWBRAIN_REQUIRE_LOCOMO").is_none(),
            "the LoCoMo data is missing at {}; set SHADOWBRAIN_LOCOMO to locomo10.json",
            path.display()
        );
        eprintln!("skipped: no LoCoMo data at {}", path.display());
        return None;
    }
    Some(shadowbrain_runtime::eval::locomo::load(&path).unwrap())
}

/// LoCoMo's ten conversations, one session each, in one store and spread over three; every
/// fifth question asked of the whole namespace ranks the same in both. With the `hash`
/// embedder; `SHADOWBRAIN_SCATTER_LOCAL=1` runs it with the local model (the default
/// configuration once `scripts/setup` ran; slow in a debug build: run it with `--release`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locomo_spread_over_three_stores_ranks_as_one() {
    let Some(conversations) = locomo() else {
        return;
    };
    let embedder: Arc<dyn Embedder> = match std::env::var_os("SHADOWBRAIN_SCATTER_LOCAL") {
        Some(_) => {
            let dir = crate::local_model::model().expect("the local model is not installed");
            Arc::new(shadowbrain_runtime::embed::LocalEmbedder::open(&dir, None).unwrap())
        }
        None => Arc::new(HashEmbedder::default()),
    };
    const PARTS: u16 = 3;
    let dirs: Vec<_> = (0..=PARTS).map(|_| tempfile::tempdir().unwrap()).collect();
    let whole = open_with(dirs[0].path(), None, embedder.clone());
    shadowbrain_runtime::eval::ingest(&whole, &conversations, |_, _| {})
        .await
        .unwrap();
    let mut parts = Vec::new();
    for p in 0..PARTS {
        let part = open_with(
            dirs[p as usize + 1].path(),
            Some(IdBlock::of_partition(p, PARTS)),
            embedder.clone(),
        );
        let mine: Vec<_> = conversations
            .iter()
            .filter(|c| c.index % usize::from(PARTS) == usize::from(p))
            .cloned()
            .collect();
        shadowbrain_runtime::eval::ingest(&part, &mine, |_, _| {})
            .await
            .unwrap();
        parts.push(part);
    }
    // The policy the store runs with its embedder (a semantic one fuses differently).
    let policy = whole.policy_for("default");
    let mut asked = 0;
    for conv in &conversations {
        for q in conv.questions.iter().step_by(5) {
            let mut req = RecallRequest::new("default", &conv.sample_id, &q.question);
            req.scope = Scope::Namespace;
            req.include_knowledge = false;
            req.reinforce = false;
            let vector = embedder
                .embed(std::slice::from_ref(&q.question))
                .await
                .unwrap()
                .pop();
            let (one, _) = whole.rank(&req, vector.as_deref(), &policy).unwrap();
            let (spread, _) = recall_across(&parts, &req, vector.as_deref(), &policy, T0)
                .await
                .unwrap();
            let at = format!(
                "{} question {}: {:?}",
                conv.sample_id, q.qa_index, q.question
            );
            assert_same(&spread, &one, &at);
            asked += 1;
        }
    }
    assert!(asked > 350, "only {asked} questions asked");
    eprintln!(
        "{asked} questions ranked the same in one store and in three ({})",
        embedder.name()
    );
    whole.close().unwrap();
    for p in parts {
        p.close().unwrap();
    }
}
