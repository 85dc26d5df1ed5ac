//! Feedback, promotion into the namespace knowledge pool, merging, and graph queries, on a
//! real store.

use std::path::Path;
use std::sync::Arc;

use shadowbrain_runtime::policy::Policy;
use shadowbrain_runtime::{
    Edge, Error, FeedbackTarget, Graph, IndexingOptions, KNOWLEDGE_SESSION, MemoryId, NewMemory,
    Outcome, Promotion, RecallRequest, Relation, Scope, Substrate, SubstrateOptions, Tier,
    VirtualClock,
};

const POLICY: &str = "[condensation]\nevery_events = 50\nmin_events = 3\n\
                      [promotion]\nmin_importance = 6\nmin_utility = 0.6\nmin_successes = 1\nmerge_similarity = 0.8\n";

fn open(dir: &Path) -> Substrate {
    let opts = SubstrateOptions {
        clock: Arc::new(VirtualClock::new(1_780_000_000_000)),
        policy: Policy::from_toml("<test>", POLICY).unwrap(),
        indexing: IndexingOptions {
            background: false,
            ..IndexingOptions::default()
        },
        ..SubstrateOptions::default()
    };
    Substrate::open(dir, opts).unwrap()
}

/// Writes a session about one lesson and condenses it.
async fn condensed_lesson(sub: &Substrate, ns: &str, session: &str, lesson: &str) -> MemoryId {
    let events: Vec<NewMemory> = [
        format!("tried it: {lesson}"),
        format!("it worked: {lesson}"),
        format!("note for next time: {lesson}"),
    ]
    .into_iter()
    .map(|text| NewMemory {
        importance: Some(8.0),
        ..NewMemory::new("observation", text)
    })
    .collect();
    sub.record(ns, session, events).await.unwrap();
    sub.condense(ns, session, "condenser")
        .await
        .unwrap()
        .unwrap()
        .id
}

#[tokio::test]
async fn a_proven_lesson_is_promoted_merged_and_recalled_by_other_sessions_only_in_its_namespace() {
    let dir = tempfile::tempdir().unwrap();
    let sub = open(dir.path());
    let lesson = "retry the bank gateway with exponential backoff and jitter";
    let c1 = condensed_lesson(&sub, "acme", "agent-a", lesson).await;

    // Not proven yet: no success, utility 0.5.
    let not_yet = sub.promote("acme", c1, "kg").await.unwrap();
    assert!(
        matches!(&not_yet, Promotion::NotEligible(why) if why.contains("min_utility")),
        "{not_yet:?}"
    );

    // The agent recalls it, uses it, and says it worked.
    let recall = sub
        .recall(&RecallRequest::new(
            "acme",
            "agent-a",
            "bank gateway retry backoff",
        ))
        .await
        .unwrap();
    assert!(recall.memories.iter().any(|m| m.record.id == c1));
    let recall_id = recall.recall_id.clone().unwrap();
    let report = sub
        .feedback(
            "acme",
            &FeedbackTarget::Recall(recall_id.clone()),
            Outcome::Success,
            "agent-a",
        )
        .await
        .unwrap();
    assert_eq!(report.updated, recall.memories.len());
    assert_eq!(report.promotable, vec![c1]);
    assert_eq!(sub.get("acme", c1).unwrap().utility.successes, 1);

    let Promotion::Created { knowledge, edges } = sub.promote("acme", c1, "kg").await.unwrap()
    else {
        panic!("expected a new knowledge record");
    };
    assert_eq!(
        edges[0],
        Edge {
            from: knowledge,
            to: c1,
            relation: Relation::DerivedFrom
        }
    );
    let k = sub.get("acme", knowledge).unwrap();
    assert_eq!(
        (k.tier, k.session_id.as_str(), k.sources.clone()),
        (Tier::Knowledge, KNOWLEDGE_SESSION, vec![c1])
    );
    assert_eq!(
        sub.promote("acme", c1, "kg").await.unwrap(),
        Promotion::AlreadyPromoted { knowledge }
    );

    // A second agent proves the same lesson: merged, support 2, no duplicate.
    let c2 = condensed_lesson(&sub, "acme", "agent-b", lesson).await;
    sub.feedback(
        "acme",
        &FeedbackTarget::Memories(vec![c2]),
        Outcome::Success,
        "agent-b",
    )
    .await
    .unwrap();
    assert_eq!(
        sub.promote("acme", c2, "kg").await.unwrap(),
        Promotion::Merged {
            knowledge,
            support: 2
        }
    );
    assert_eq!(sub.get("acme", knowledge).unwrap().sources, vec![c1, c2]);
    // Created and merged count; "not yet" and "already" do not.
    assert_eq!(sub.promotions(), 2);
    assert_eq!(sub.store().tier_len(Tier::Knowledge), 1);

    // A misleading lesson that failed is never admitted.
    let bad = condensed_lesson(
        &sub,
        "acme",
        "agent-c",
        "disable TLS verification to fix handshake errors",
    )
    .await;
    let report = sub
        .feedback(
            "acme",
            &FeedbackTarget::Memories(vec![bad]),
            Outcome::Failure,
            "agent-c",
        )
        .await
        .unwrap();
    assert!(report.promotable.is_empty());
    assert!(matches!(
        sub.promote("acme", bad, "kg").await.unwrap(),
        Promotion::NotEligible(_)
    ));

    // A new agent of the namespace gets the knowledge; another namespace does not.
    let mut ask = RecallRequest::new("acme", "agent-new", "how to call the bank gateway reliably");
    ask.scope = Scope::Session;
    let found = sub.recall(&ask).await.unwrap();
    assert_eq!(
        found.memories.first().map(|m| m.record.id),
        Some(knowledge),
        "{:?}",
        found.context
    );
    let mut other = ask.clone();
    other.namespace = "globex".into();
    let none = sub.recall(&other).await.unwrap();
    assert!(none.memories.iter().all(|m| m.record.id != knowledge));

    // The graph around the knowledge record.
    let graph = sub.knowledge_graph("acme").unwrap();
    let (nodes, edges) = graph.neighbourhood(knowledge, 1);
    assert_eq!(nodes, vec![knowledge, c1, c2]);
    assert_eq!(edges.len(), 2);
    assert!(
        edges
            .iter()
            .all(|e| e.relation == Relation::DerivedFrom && e.from == knowledge)
    );
    assert!(sub.knowledge_graph("globex").unwrap().edges().is_empty());

    // Explicit links, and the depth limit.
    sub.link(
        "acme",
        Edge {
            from: bad,
            to: knowledge,
            relation: Relation::Contradicts,
        },
        "reviewer",
    )
    .unwrap();
    let graph = sub.knowledge_graph("acme").unwrap();
    assert_eq!(graph.neighbourhood(c1, 1).0, vec![c1, knowledge]);
    assert_eq!(graph.neighbourhood(c1, 2).0.len(), 4);
}

#[tokio::test]
async fn feedback_on_unknown_or_foreign_ids_is_a_clear_error_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let sub = open(dir.path());
    let id = sub
        .record("acme", "s", vec![NewMemory::new("observation", "kept")])
        .await
        .unwrap()[0];
    let recall = sub
        .recall(&RecallRequest::new("acme", "s", "kept"))
        .await
        .unwrap();
    let foreign = sub
        .feedback(
            "globex",
            &FeedbackTarget::Recall(recall.recall_id.clone().unwrap()),
            Outcome::Success,
            "x",
        )
        .await
        .unwrap_err();
    assert!(
        matches!(foreign, Error::NotFound { what: "recall", .. }),
        "{foreign}"
    );
    let malformed = sub
        .feedback(
            "acme",
            &FeedbackTarget::Recall("r-1".into()),
            Outcome::Success,
            "x",
        )
        .await
        .unwrap_err();
    assert!(malformed.to_string().contains("recall_id"), "{malformed}");
    let unknown = sub
        .feedback(
            "acme",
            &FeedbackTarget::Memories(vec![id, MemoryId(999_999)]),
            Outcome::Failure,
            "x",
        )
        .await
        .unwrap_err();
    assert!(matches!(unknown, Error::NotFound { .. }), "{unknown}");
    assert_eq!(
        sub.get("acme", id).unwrap().utility.failures,
        0,
        "nothing was applied"
    );
}

#[test]
fn a_neighbourhood_past_its_cap_is_refused_without_walking_the_rest() {
    // A star: one record linked to 600 others.
    let mut graph = Graph::default();
    for i in 1..=600 {
        graph.add(Edge {
            from: MemoryId(0),
            to: MemoryId(i),
            relation: Relation::SimilarTo,
        });
    }
    assert!(graph.neighbourhood_within(MemoryId(0), 1, 500).is_none());
    let (nodes, edges) = graph.neighbourhood_within(MemoryId(0), 1, 601).unwrap();
    assert_eq!((nodes.len(), edges.len()), (601, 600));
    // From a leaf, depth 1 is two records, well within the cap.
    let (nodes, _) = graph.neighbourhood_within(MemoryId(7), 1, 500).unwrap();
    assert_eq!(nodes, vec![MemoryId(7), MemoryId(0)]);
}

/// Placed by session, a namespace's knowledge pool lives in one store (its home): a lesson
/// proven in another store is promoted there — the pool's side written at the home, the
/// candidate's (its marker, its dequeue) where it lives — merged there with the same
/// lesson proven in a third store, recalled by a session of the first through the home,
/// and a promotion asked again answers where the lesson went.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lesson_proven_elsewhere_is_promoted_into_the_namespace_pool_at_its_home() {
    use shadowbrain_runtime::IdBlock;

    use crate::scatter::Others;
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let open_part = |p: u16, spread: Option<Others>| {
        let opts = SubstrateOptions {
            clock: Arc::new(VirtualClock::new(1_780_000_000_000)),
            policy: Policy::from_toml("<test>", POLICY).unwrap(),
            indexing: IndexingOptions {
                background: false,
                ..IndexingOptions::default()
            },
            ids: Some(IdBlock::of_partition(p, 3)),
            spread: spread.map(|s| Arc::new(s) as Arc<dyn shadowbrain_runtime::Spread>),
            ..SubstrateOptions::default()
        };
        Substrate::open(dirs[usize::from(p)].path(), opts).unwrap()
    };
    let home = open_part(2, None);
    let spread = |parts: Vec<Substrate>| Others {
        parts,
        home: Some(home.clone()),
    };
    let a = open_part(0, Some(spread(vec![home.clone()])));
    let b = open_part(1, Some(spread(vec![home.clone(), a.clone()])));
    let lesson = "retry the bank gateway with exponential backoff and jitter";
    let mut promoted = Vec::new();
    for (part, session) in [(&a, "agent-a"), (&b, "agent-b")] {
        let c = condensed_lesson(part, "acme", session, lesson).await;
        let report = part
            .feedback(
                "acme",
                &FeedbackTarget::Memories(vec![c]),
                Outcome::Success,
                session,
            )
            .await
            .unwrap();
        assert_eq!(report.promotable, vec![c]);
        promoted.push((c, part.promote("acme", c, "kg").await.unwrap()));
    }
    let [(c1, first), (c2, second)] = promoted.try_into().unwrap();
    let Promotion::Created { knowledge, .. } = first else {
        panic!("expected a new knowledge record: {first:?}");
    };
    assert_eq!(
        second,
        Promotion::Merged {
            knowledge,
            support: 2
        }
    );
    // The pool is at the home only, its record in the home's block, sourced from both.
    assert!(home.store().id_block().contains(knowledge.0));
    let k = home.get("acme", knowledge).unwrap();
    assert_eq!((k.tier, k.sources.clone()), (Tier::Knowledge, vec![c1, c2]));
    assert_eq!(a.store().tier_len(Tier::Knowledge), 0);
    assert_eq!(b.store().tier_len(Tier::Knowledge), 0);
    // Each candidate's side where it lives: marked, off the queue, counted there.
    for (part, c) in [(&a, c1), (&b, c2)] {
        assert_eq!(part.store().promoted_into(c).unwrap(), Some(knowledge));
        assert!(
            !part
                .store()
                .is_queued(shadowbrain_runtime::internals::Queue::Promote, c)
                .unwrap()
        );
        assert_eq!(part.promotions(), 1);
        assert_eq!(
            part.promote("acme", c, "kg").await.unwrap(),
            Promotion::AlreadyPromoted { knowledge }
        );
    }
    // The graph is the home's: the lesson derived from both candidates.
    let (nodes, _) = home
        .knowledge_graph("acme")
        .unwrap()
        .neighbourhood(knowledge, 1);
    assert_eq!(nodes, vec![knowledge, c1, c2]);
    // A new session of the first store recalls the lesson from the home.
    let mut ask = RecallRequest::new("acme", "agent-new", "how to call the bank gateway reliably");
    ask.scope = Scope::Session;
    let found = a.recall(&ask).await.unwrap();
    assert_eq!(found.memories.first().map(|m| m.record.id), Some(knowledge));
    for s in [a, b, home] {
        s.close().unwrap();
    }
}
