//! Recall through the substrate on a real store and real indexes: scope isolation, fusion
//! and the score breakdown, MMR, token budgets, filters, read-your-writes before any index
//! build, self-healing indexes and dimension safety.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use shadowbrain_runtime::embed::HashEmbedder;
use shadowbrain_runtime::policy::Policy;
use shadowbrain_runtime::{
    DAY_MS, Error, IndexKind, IndexingOptions, MemoryId, NewMemory, RecallRequest, Scope, Status,
    Substrate, SubstrateOptions, VirtualClock,
};

const T0: i64 = 1_780_000_000_000;

fn opts(clock: Arc<VirtualClock>) -> SubstrateOptions {
    SubstrateOptions {
        clock,
        // Nothing is built unless a test asks: recall must work from the tails alone.
        indexing: IndexingOptions {
            background: false,
            ..IndexingOptions::default()
        },
        ..SubstrateOptions::default()
    }
}

fn open(dir: &Path) -> (Substrate, Arc<VirtualClock>) {
    let clock = Arc::new(VirtualClock::new(T0));
    (Substrate::open(dir, opts(clock.clone())).unwrap(), clock)
}

async fn rec(sub: &Substrate, ns: &str, session: &str, kind: &str, text: &str) -> MemoryId {
    sub.record(ns, session, vec![NewMemory::new(kind, text)])
        .await
        .unwrap()[0]
}

fn ids(r: &shadowbrain_runtime::RecallResult) -> Vec<MemoryId> {
    r.memories.iter().map(|m| m.record.id).collect()
}

#[tokio::test]
async fn read_your_writes_before_any_index_build() {
    let dir = tempfile::tempdir().unwrap();
    let (sub, _) = open(dir.path());
    let id = rec(
        &sub,
        "default",
        "s1",
        "observation",
        "the deploy to staging failed with a TLS handshake error",
    )
    .await;
    assert_eq!(sub.vectors().watermark().unwrap(), 0, "nothing was built");
    // Namespace scope, so the recent path cannot be what finds it.
    let mut req = RecallRequest::new("default", "other-session", "TLS handshake error on staging");
    req.scope = Scope::Namespace;
    let res = sub.recall(&req).await.unwrap();
    assert_eq!(ids(&res), vec![id]);
    let m = &res.memories[0];
    assert!(m.why.relevance > 0.5, "found by both paths: {:?}", m.why);
    assert!(
        res.context
            .contains("observation: the deploy to staging failed"),
        "{}",
        res.context
    );
    assert_eq!(res.policy.name, "default");
    sub.close().unwrap();
}

#[tokio::test]
async fn keyword_commits_do_not_wait_for_tree_builds_and_a_spilled_tail_still_recalls() {
    let dir = tempfile::tempdir().unwrap();
    let mut o = opts(Arc::new(VirtualClock::new(T0)));
    // Every staged vector goes past the budget: the tail holds ids, the store the vectors.
    o.vector.tail_memory_bytes = 0;
    o.indexing.keyword_every = 5;
    o.indexing.build_every = 1_000_000;
    o.indexing.debounce = Duration::from_secs(3_600);
    o.indexing.max_delay = Duration::from_secs(3_600);
    let sub = Substrate::open(dir.path(), o).unwrap();
    let texts: Vec<String> = (0..12)
        .map(|i| format!("incident {i}: the cache node number {i} ran out of disk"))
        .collect();
    let mut ids_written = Vec::new();
    for t in &texts {
        ids_written.push(rec(&sub, "default", "s1", "observation", t).await);
    }
    let pass = sub.index_pass(false).unwrap();
    assert!(pass.built);
    let last = sub.store().next_seq() - 1;
    assert_eq!(
        sub.keywords().watermark().unwrap(),
        last,
        "keywords committed"
    );
    assert_eq!(sub.keywords().pending(), 0);
    assert_eq!(
        sub.vectors().watermark().unwrap(),
        0,
        "no tree build was due"
    );
    assert_eq!(sub.vectors().pending(), 12);
    assert_eq!(sub.vectors().tail_bytes(), 0, "nothing held in memory");
    assert!(
        sub.store()
            .first_change()
            .unwrap()
            .is_some_and(|f| f + 11 <= last),
        "the log keeps the 12 changes until the trees have them too"
    );

    // A vector-only query (no text) finds a spilled record: read back from the store.
    let embedding = sub.embedder().embed(&texts[7..8]).await.unwrap().remove(0);
    let mut req = RecallRequest::new("default", "other-session", "");
    req.query_embedding = Some(embedding.clone());
    req.scope = Scope::Namespace;
    req.k = 1;
    assert_eq!(ids(&sub.recall(&req).await.unwrap()), vec![ids_written[7]]);

    sub.index_pass(true).unwrap();
    assert_eq!(sub.vectors().pending(), 0);
    assert!(sub.vectors().watermark().unwrap() >= last);
    assert!(
        sub.store().first_change().unwrap().is_none_or(|f| f > last),
        "both indexes have it: the log is truncated"
    );
    assert_eq!(ids(&sub.recall(&req).await.unwrap()), vec![ids_written[7]]);
    sub.close().unwrap();
}

#[tokio::test]
async fn an_open_stages_again_only_what_each_index_lacks() {
    let dir = tempfile::tempdir().unwrap();
    let mut o = opts(Arc::new(VirtualClock::new(T0)));
    o.indexing.keyword_every = 1_000_000;
    o.indexing.build_every = 1_000_000;
    // More than a close or an open builds: the vectors stay unbuilt across the reopen.
    let n = 4_200;
    let sub = Substrate::open(dir.path(), o.clone()).unwrap();
    rec(
        &sub,
        "default",
        "s0",
        "observation",
        "built before the rest",
    )
    .await;
    sub.index_pass(true).unwrap();
    let built = sub.vectors().watermark().unwrap();
    assert!(built > 0);
    for b in 0..n / 100 {
        let batch = (0..100)
            .map(|i| {
                NewMemory::new(
                    "observation",
                    format!("batch {b} item {i}: the build runner {b}-{i} timed out"),
                )
            })
            .collect();
        sub.record("default", "s1", batch).await.unwrap();
    }
    sub.index_pass_for(IndexKind::Keywords, true).unwrap();
    let last = sub.store().next_seq() - 1;
    assert_eq!(sub.keywords().watermark().unwrap(), last);
    assert_eq!(sub.vectors().watermark().unwrap(), built);
    assert_eq!(sub.vectors().pending(), n);
    sub.close().unwrap();
    drop(sub);

    let sub = Substrate::open(dir.path(), o).unwrap();
    // The log is read from the vectors' watermark, but the keyword index committed all
    // of it: staging it again would tokenise and re-commit every document.
    assert_eq!(
        sub.keywords().pending(),
        0,
        "nothing staged again for keywords"
    );
    assert_eq!(
        sub.vectors().pending(),
        n,
        "every vector staged for the build"
    );
    let mut req = RecallRequest::new("default", "other-session", "build runner 41-7 timed out");
    req.scope = Scope::Namespace;
    req.k = 1;
    let hit = ids(&sub.recall(&req).await.unwrap());
    let text = |id| sub.store().get(id).unwrap().unwrap().text;
    assert!(text(hit[0]).contains("41-7"), "{}", text(hit[0]));
    // A vector-only query finds the same record in the unbuilt tail.
    let embedding = sub
        .embedder()
        .embed(&[text(hit[0])])
        .await
        .unwrap()
        .remove(0);
    let mut req = RecallRequest::new("default", "other-session", "");
    req.query_embedding = Some(embedding);
    req.scope = Scope::Namespace;
    req.k = 1;
    assert_eq!(ids(&sub.recall(&req).await.unwrap()), hit);
    sub.index_pass(true).unwrap();
    assert_eq!(sub.vectors().pending(), 0);
    assert_eq!(ids(&sub.recall(&req).await.unwrap()), hit);
    sub.close().unwrap();
}

#[tokio::test]
async fn session_scope_and_namespaces_never_leak() {
    let dir = tempfile::tempdir().unwrap();
    let (sub, _) = open(dir.path());
    let mine = rec(
        &sub,
        "acme",
        "s1",
        "thought",
        "the invoice parser breaks on unicode names",
    )
    .await;
    let other_session = rec(
        &sub,
        "acme",
        "s2",
        "thought",
        "the invoice parser breaks on unicode names too",
    )
    .await;
    let other_ns = rec(
        &sub,
        "globex",
        "s1",
        "thought",
        "the invoice parser breaks on unicode names as well",
    )
    .await;
    sub.flush_indexes().unwrap();
    let res = sub
        .recall(&RecallRequest::new("acme", "s1", "invoice parser unicode"))
        .await
        .unwrap();
    assert_eq!(ids(&res), vec![mine]);
    let mut req = RecallRequest::new("acme", "s1", "invoice parser unicode");
    req.scope = Scope::Namespace;
    let mut got = ids(&sub.recall(&req).await.unwrap());
    got.sort();
    assert_eq!(got, vec![mine, other_session]);
    assert!(!got.contains(&other_ns));
    // Another namespace's id is simply not found, and its history neither.
    assert!(matches!(
        sub.get("acme", other_ns),
        Err(Error::NotFound { .. })
    ));
    assert!(matches!(
        sub.history("acme", other_ns),
        Err(Error::NotFound { .. })
    ));
    sub.close().unwrap();
}

#[tokio::test]
async fn agent_scope_spans_sessions_of_one_agent() {
    let dir = tempfile::tempdir().unwrap();
    let (sub, _) = open(dir.path());
    let mut e = NewMemory::new("action", "rotated the database credentials");
    e.agent_id = Some("ops-bot".into());
    let a = sub.record("default", "s1", vec![e.clone()]).await.unwrap()[0];
    let b = sub.record("default", "s2", vec![e]).await.unwrap()[0];
    let _c = rec(
        &sub,
        "default",
        "s3",
        "action",
        "rotated the database credentials",
    )
    .await;
    let mut req = RecallRequest::new("default", "s9", "database credentials");
    req.scope = Scope::Agent;
    req.agent_id = Some("ops-bot".into());
    let mut got = ids(&sub.recall(&req).await.unwrap());
    got.sort();
    assert_eq!(got, vec![a, b]);
    req.agent_id = None;
    let err = sub.recall(&req).await.unwrap_err();
    assert!(err.to_string().contains("agent_id"), "{err}");
    sub.close().unwrap();
}

#[tokio::test]
async fn breakdown_follows_the_policy() {
    let dir = tempfile::tempdir().unwrap();
    let (sub, clock) = open(dir.path());
    let old = sub
        .record(
            "default",
            "s",
            vec![NewMemory {
                importance: Some(2.0),
                ..NewMemory::new("observation", "the cache layer uses redis cluster")
            }],
        )
        .await
        .unwrap()[0];
    clock.advance(Duration::from_millis(6 * DAY_MS as u64));
    let new = sub
        .record(
            "default",
            "s",
            vec![NewMemory {
                importance: Some(9.0),
                ..NewMemory::new("observation", "the cache layer uses redis cluster mode")
            }],
        )
        .await
        .unwrap()[0];
    let res = sub
        .recall(&RecallRequest::new("default", "s", "redis cluster cache"))
        .await
        .unwrap();
    assert_eq!(ids(&res), vec![new, old]);
    let (n, o) = (&res.memories[0], &res.memories[1]);
    // Default policy: recency weight 0.5 with a 3-day half-life; importance weight 0.5.
    assert!((n.why.recency - 0.5).abs() < 1e-3, "{:?}", n.why);
    assert!(
        (o.why.recency - 0.5 * 0.25).abs() < 1e-3,
        "two half-lives: {:?}",
        o.why
    );
    assert!((n.why.importance - 0.45).abs() < 1e-3);
    assert!((o.why.importance - 0.1).abs() < 1e-3);
    assert!(
        (n.why.utility - 0.25).abs() < 1e-3,
        "utility 0.5 with no feedback, weight 0.5"
    );
    let total = n.why.relevance + n.why.recency + n.why.importance + n.why.utility;
    assert!((n.score - total).abs() < 1e-4);
    sub.close().unwrap();
}

/// `scoring.recency_basis = "last_access"`: recall counts a record's age from its last
/// reinforcement, so a record recalled lately is as recent as a new one.
#[tokio::test]
async fn recency_counts_from_the_last_access_when_the_policy_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(VirtualClock::new(T0));
    let mut o = opts(clock.clone());
    o.policy = Policy::from_toml(
        "access.toml",
        "[scoring]\nrecency_basis = \"last_access\"\n",
    )
    .unwrap();
    let sub = Substrate::open(dir.path(), o).unwrap();
    let id = rec(
        &sub,
        "default",
        "s",
        "observation",
        "the deploy key rotates monthly",
    )
    .await;
    let ask = || RecallRequest::new("default", "s", "deploy key rotation");
    // Six days on (two half-lives), a recall reinforces it...
    clock.advance(Duration::from_millis(6 * DAY_MS as u64));
    let first = sub.recall(&ask()).await.unwrap();
    assert!(
        (first.memories[0].why.recency - 0.5 * 0.25).abs() < 1e-3,
        "{:?}",
        first.memories[0].why
    );
    sub.store().sync().await.unwrap();
    assert_eq!(sub.get("default", id).unwrap().strength_at, T0 + 6 * DAY_MS);
    // ...so, asked again at once, it is as recent as a record just written; by its event
    // time it would still be two half-lives old.
    let again = sub.recall(&ask()).await.unwrap();
    assert_eq!(ids(&again), vec![id]);
    assert!(
        (again.memories[0].why.recency - 0.5).abs() < 1e-3,
        "{:?}",
        again.memories[0].why
    );
    sub.close().unwrap();
}

#[tokio::test]
async fn mmr_diversifies() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(VirtualClock::new(T0));
    let mut o = opts(clock);
    o.policy = Policy::from_toml(
        "mmr.toml",
        "[scoring]\nmmr_lambda = 0.3\nrecency = 0.0\nimportance = 0.0\nutility = 0.0\n",
    )
    .unwrap();
    let sub = Substrate::open(dir.path(), o).unwrap();
    let a = rec(
        &sub,
        "default",
        "s",
        "thought",
        "postgres connection pool exhausted under load",
    )
    .await;
    let _a2 = rec(
        &sub,
        "default",
        "s",
        "thought",
        "postgres connection pool exhausted under load again",
    )
    .await;
    let b = rec(
        &sub,
        "default",
        "s",
        "thought",
        "postgres vacuum settings need tuning for load",
    )
    .await;
    let mut req = RecallRequest::new("default", "s", "postgres connection pool load");
    req.k = 2;
    let got = ids(&sub.recall(&req).await.unwrap());
    assert_eq!(
        got,
        vec![a, b],
        "the near-duplicate gives way to a different memory"
    );
    sub.close().unwrap();
}

#[tokio::test]
async fn filters_statuses_and_budget() {
    let dir = tempfile::tempdir().unwrap();
    let (sub, clock) = open(dir.path());
    let goal = rec(
        &sub,
        "default",
        "s",
        "goal",
        "migrate billing service to the new queue",
    )
    .await;
    clock.advance(Duration::from_secs(3600));
    let obs = rec(
        &sub,
        "default",
        "s",
        "observation",
        "billing service queue consumer lags behind",
    )
    .await;
    clock.advance(Duration::from_secs(3600));
    let gone = rec(
        &sub,
        "default",
        "s",
        "observation",
        "billing service queue was restarted",
    )
    .await;
    let stale = rec(
        &sub,
        "default",
        "s",
        "observation",
        "billing service queue uses the old broker",
    )
    .await;
    sub.archive("default", gone, "test").unwrap();
    sub.set_status("default", stale, Status::Obsolete, "test")
        .unwrap();
    let q = "billing service queue";
    let got = ids(&sub
        .recall(&RecallRequest::new("default", "s", q))
        .await
        .unwrap());
    assert!(
        !got.contains(&gone) && !got.contains(&stale),
        "archived and obsolete never return: {got:?}"
    );
    assert_eq!(got.len(), 2);

    let mut req = RecallRequest::new("default", "s", q);
    req.kinds = Some(vec!["goal".into()]);
    assert_eq!(ids(&sub.recall(&req).await.unwrap()), vec![goal]);

    let mut req = RecallRequest::new("default", "s", q);
    req.since = Some(T0 + 1800 * 1000);
    assert_eq!(ids(&sub.recall(&req).await.unwrap()), vec![obs]);
    req.since = None;
    req.until = Some(T0 + 1800 * 1000);
    assert_eq!(ids(&sub.recall(&req).await.unwrap()), vec![goal]);

    let mut req = RecallRequest::new("default", "s", q);
    req.token_budget = Some(40);
    let res = sub.recall(&req).await.unwrap();
    assert_eq!(res.memories.len(), 1, "{}", res.context);
    assert!(shadowbrain_runtime::internals::estimate_tokens(&res.context) <= 40);

    let mut req = RecallRequest::new("default", "s", q);
    req.k = 0;
    assert!(
        sub.recall(&req)
            .await
            .unwrap_err()
            .to_string()
            .contains("1 to 200")
    );
    req.k = 5;
    req.since = Some(10);
    req.until = Some(5);
    assert!(sub.recall(&req).await.is_err());
    // The history says what happened.
    let actions: Vec<_> = sub
        .history("default", gone)
        .unwrap()
        .iter()
        .map(|e| format!("{:?}", e.action))
        .collect();
    assert_eq!(actions, vec!["Created", "Scored", "Archived"]);
    sub.close().unwrap();
}

#[tokio::test]
async fn recall_reinforces_what_it_returns() {
    let dir = tempfile::tempdir().unwrap();
    let (sub, clock) = open(dir.path());
    let id = rec(
        &sub,
        "default",
        "s",
        "observation",
        "flaky test in the payments suite",
    )
    .await;
    // A record with JSON beside its text: recall parses it only for what it returns, and
    // the reinforcement rewrites the record without parsing it.
    let content = serde_json::json!({"suite": "payments", "failures": [3, 5], "rate": 0.25});
    let metadata = serde_json::json!({"ci": {"run": 41, "flaky": true}});
    let with_json = sub
        .record(
            "default",
            "s",
            vec![NewMemory {
                content: Some(content.clone()),
                metadata: Some(metadata.clone()),
                ..NewMemory::new("observation", "payments suite flaky on the retry path")
            }],
        )
        .await
        .unwrap()[0];
    let before = sub.get("default", id).unwrap();
    clock.advance(Duration::from_secs(86_400));
    let answer = sub
        .recall(&RecallRequest::new("default", "s", "flaky payments test"))
        .await
        .unwrap();
    let returned = answer
        .memories
        .iter()
        .find(|m| m.record.id == with_json)
        .expect("both records are returned");
    assert_eq!(returned.record.content, content);
    assert_eq!(returned.record.metadata, metadata);
    // Recall does not wait for its reinforcement to be flushed; this does.
    sub.store().sync().await.unwrap();
    let after = sub.get("default", id).unwrap();
    assert_eq!(after.reinforcements, before.reinforcements + 1);
    assert_eq!(after.strength_at, T0 + 86_400_000);
    let rewritten = sub.get("default", with_json).unwrap();
    assert_eq!(rewritten.reinforcements, 1);
    assert_eq!((rewritten.content, rewritten.metadata), (content, metadata));
    assert!(
        sub.history("default", id)
            .unwrap()
            .iter()
            .any(|e| format!("{:?}", e.action) == "Reinforced")
    );
    sub.close().unwrap();
}

/// The actions of a record's history, with each reinforcement's detail.
fn actions(sub: &Substrate, id: MemoryId) -> Vec<String> {
    sub.history("default", id)
        .unwrap()
        .iter()
        .map(|e| match format!("{:?}", e.action).as_str() {
            "Reinforced" => format!("Reinforced {} by {}", e.detail, e.by),
            other => other.to_string(),
        })
        .collect()
}

#[tokio::test]
async fn each_reinforcement_is_in_its_records_history_in_order_even_after_a_purge() {
    // Reinforcements are logged per session, one entry per recall; a record's history
    // merges them back in sequence with the entries kept under the record.
    let dir = tempfile::tempdir().unwrap();
    let (sub, clock) = open(dir.path());
    let a = rec(
        &sub,
        "default",
        "s",
        "observation",
        "the deploy key expired",
    )
    .await;
    let b = rec(
        &sub,
        "default",
        "t",
        "observation",
        "the deploy key rotates weekly",
    )
    .await;
    let untouched = rec(&sub, "default", "s", "observation", "lunch was at noon").await;
    let mut req = RecallRequest::new("default", "s", "deploy key");
    req.scope = Scope::Namespace;
    req.k = 2;
    let strength = |id| sub.get("default", id).unwrap().strength;
    let (a0, b0) = (strength(a), strength(b));
    let first = sub.recall(&req).await.unwrap();
    assert_eq!(ids(&first).len(), 2, "{:?}", ids(&first));
    sub.store().sync().await.unwrap();
    let (a1, b1) = (strength(a), strength(b));
    assert!(a1 > a0 && b1 > b0, "{a0} -> {a1}, {b0} -> {b1}");
    // Something kept under the record between two recalls stays between them.
    sub.set_status("default", a, Status::Pinned, "test")
        .unwrap();
    clock.advance(Duration::from_secs(3_600));
    sub.recall(&req).await.unwrap();
    sub.store().sync().await.unwrap();
    let a2 = strength(a);
    let reinforced =
        |from: f32, to: f32| format!("Reinforced strength {from:.3} -> {to:.3} by recall");
    let a_history = actions(&sub, a);
    let tail = &a_history[a_history.len() - 3..];
    assert_eq!(tail[0], reinforced(a0, a1), "{a_history:?}");
    assert_eq!(tail[1], "StatusChanged", "{a_history:?}");
    assert_eq!(tail[2], reinforced(a1, a2), "{a_history:?}");
    // Only a record's own entries: b shares a's recalls but is in another session, and
    // `untouched` shares a's session but was never returned.
    let count = |id| {
        actions(&sub, id)
            .iter()
            .filter(|a| a.starts_with("Reinforced"))
            .count()
    };
    assert_eq!((count(a), count(b), count(untouched)), (2, 2, 0));
    let b2 = strength(b);
    sub.purge("default", b, "test").unwrap();
    let check_b = |sub: &Substrate| {
        let history = actions(sub, b);
        let n = history.len();
        assert_eq!(
            history[n - 3..],
            [reinforced(b0, b1), reinforced(b1, b2), "Purged".to_string()],
            "{history:?}"
        );
    };
    check_b(&sub);
    sub.close().unwrap();
    drop(sub);
    // All of it is durable.
    let (sub, _) = open(dir.path());
    check_b(&sub);
    assert_eq!(actions(&sub, a), a_history);
    sub.close().unwrap();
}

#[tokio::test]
async fn bad_input_is_rejected_and_nothing_accepted_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let (sub, _) = open(dir.path());
    let kept = rec(&sub, "default", "s", "thought", "keep me").await;
    let cases: Vec<(Vec<NewMemory>, &str)> = vec![
        (vec![], "at least one"),
        (
            vec![NewMemory::new("thought", "ok"), NewMemory::new("BAD", "x")],
            "events[1].kind",
        ),
        (
            vec![NewMemory {
                embedding: Some(vec![0.5; 3]),
                ..NewMemory::new("thought", "x")
            }],
            "shadowbrain reindex",
        ),
        (
            vec![NewMemory {
                embedding: Some(vec![f32::INFINITY; 384]),
                ..NewMemory::new("thought", "x")
            }],
            "finite",
        ),
        (vec![NewMemory::new("thought", "")], "non-empty"),
    ];
    for (events, needle) in cases {
        let err = sub
            .record("default", "s", events)
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains(needle), "{needle}: {err}");
    }
    let err = sub
        .record(
            "default",
            "bad/session",
            vec![NewMemory::new("thought", "x")],
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("session_id"), "{err}");
    assert_eq!(sub.store().len(), 1);
    assert_eq!(sub.get("default", kept).unwrap().text, "keep me");
    sub.close().unwrap();
}

#[tokio::test]
async fn lost_indexes_rebuild_themselves_and_dimension_is_checked() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(VirtualClock::new(T0));
    let id = {
        let sub = Substrate::open(dir.path(), opts(clock.clone())).unwrap();
        let id = rec(
            &sub,
            "default",
            "s",
            "observation",
            "kubernetes node ran out of disk",
        )
        .await;
        sub.close().unwrap();
        id
    };
    std::fs::remove_dir_all(dir.path().join("vectors")).unwrap();
    std::fs::remove_dir_all(dir.path().join("keywords")).unwrap();
    let sub = Substrate::open(dir.path(), opts(clock.clone())).unwrap();
    assert_eq!(sub.vectors().len().unwrap(), 1);
    assert_eq!(sub.keywords().len().unwrap(), 1);
    let mut req = RecallRequest::new("default", "elsewhere", "node out of disk");
    req.scope = Scope::Namespace;
    assert_eq!(ids(&sub.recall(&req).await.unwrap()), vec![id]);
    sub.close().unwrap();
    drop(sub);
    let mut o = opts(clock);
    o.embedder = Arc::new(HashEmbedder::new(128).unwrap());
    let err = Substrate::open(dir.path(), o).unwrap_err().to_string();
    assert!(
        err.contains("128") && err.contains("384") && err.contains("shadowbrain reindex"),
        "{err}"
    );
}

#[tokio::test]
async fn purge_removes_from_store_and_indexes_but_keeps_history() {
    let dir = tempfile::tempdir().unwrap();
    let (sub, _) = open(dir.path());
    let id = rec(
        &sub,
        "default",
        "s",
        "observation",
        "secret rotated at midnight",
    )
    .await;
    sub.flush_indexes().unwrap();
    sub.purge("default", id, "test").unwrap();
    assert!(matches!(
        sub.get("default", id),
        Err(Error::NotFound { .. })
    ));
    let mut req = RecallRequest::new("default", "s", "secret rotated midnight");
    req.scope = Scope::Namespace;
    assert!(sub.recall(&req).await.unwrap().memories.is_empty());
    sub.flush_indexes().unwrap();
    assert_eq!(sub.vectors().len().unwrap(), 0);
    assert_eq!(sub.keywords().len().unwrap(), 0);
    let last = sub.history("default", id).unwrap().pop().unwrap();
    assert_eq!(format!("{:?}", last.action), "Purged");
    sub.close().unwrap();
}

/// The hash embedder under another name: same dimension, "another model".
#[derive(Debug)]
struct Renamed(HashEmbedder);

#[async_trait::async_trait]
impl shadowbrain_runtime::embed::Embedder for Renamed {
    fn name(&self) -> &str {
        "other-model"
    }
    fn dimensions(&self) -> usize {
        shadowbrain_runtime::embed::Embedder::dimensions(&self.0)
    }
    async fn embed(&self, texts: &[String]) -> shadowbrain_runtime::Result<Vec<Vec<f32>>> {
        self.0.embed(texts).await
    }
}

#[tokio::test]
async fn another_model_of_the_same_dimension_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(VirtualClock::new(T0));
    let sub = Substrate::open(dir.path(), opts(clock.clone())).unwrap();
    rec(
        &sub,
        "default",
        "s",
        "thought",
        "vectors of different models do not mix",
    )
    .await;
    sub.close().unwrap();
    drop(sub);
    let mut o = opts(clock);
    o.embedder = Arc::new(Renamed(HashEmbedder::default()));
    let err = Substrate::open(dir.path(), o).unwrap_err().to_string();
    assert!(
        err.contains("`hash`")
            && err.contains("`other-model`")
            && err.contains("shadowbrain reindex"),
        "{err}"
    );
}

#[tokio::test]
async fn a_clean_restart_after_recalls_rebuilds_no_index() {
    // Recalls write audit entries, which take sequence numbers from the same counter as
    // the change log; once the log is truncated, the indexes' watermarks sit below the
    // last sequence. That must not read as "the index missed changes" on the next start.
    let dir = tempfile::tempdir().unwrap();
    {
        let (sub, _) = open(dir.path());
        rec(
            &sub,
            "default",
            "s1",
            "observation",
            "the invoice PDF had the wrong tax rate",
        )
        .await;
        sub.flush_indexes().unwrap();
        let hit = sub
            .recall(&RecallRequest::new("default", "s1", "tax rate"))
            .await
            .unwrap();
        assert_eq!(hit.memories.len(), 1);
        sub.flush_indexes().unwrap();
        sub.close().unwrap();
    }
    let (sub, _) = open(dir.path());
    assert_eq!(sub.rebuilds(), 0, "a clean restart rebuilt an index");
    let hit = sub
        .recall(&RecallRequest::new("default", "s1", "tax rate"))
        .await
        .unwrap();
    assert_eq!(hit.memories.len(), 1);
    sub.close().unwrap();
    drop(sub);

    // A lost index is still noticed and rebuilt.
    std::fs::remove_dir_all(dir.path().join("keywords")).unwrap();
    let (sub, _) = open(dir.path());
    assert_eq!(sub.rebuilds(), 1, "a missing keyword index was not rebuilt");
    sub.close().unwrap();
}

#[tokio::test]
async fn recall_ids_are_counted_apart_from_records_and_never_reused() {
    // A recall between two writes must not leave a gap in record ids (the vector index is
    // sharded by id range), and a reopened store must not hand out a recall id again.
    let dir = tempfile::tempdir().unwrap();
    let first_recall = {
        let (sub, _) = open(dir.path());
        let a = rec(&sub, "default", "s1", "observation", "the cache was cold").await;
        let r = sub
            .recall(&RecallRequest::new("default", "s1", "cache"))
            .await
            .unwrap()
            .recall_id
            .unwrap();
        let b = rec(&sub, "default", "s1", "observation", "deploys failed").await;
        assert_eq!(b.0, a.0 + 1, "the recall took a record id");
        sub.close().unwrap();
        r
    };
    let (sub, _) = open(dir.path());
    let second = sub
        .recall(&RecallRequest::new("default", "s1", "cache"))
        .await
        .unwrap()
        .recall_id
        .unwrap();
    assert!(second > first_recall, "{second} after {first_recall}");
    sub.close().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_recalls_each_reinforce_what_they_return() {
    // Recall queues its reinforcement without waiting for it. Decided on the record as
    // ranked, five recalls that all ranked it before any commit would each write
    // "0.65 + 0.05" and four reinforcements would be lost; applied at commit time, each
    // counts.
    let dir = tempfile::tempdir().unwrap();
    let (sub, _) = open(dir.path());
    let id = rec(
        &sub,
        "default",
        "s1",
        "observation",
        "the invoice PDF had the wrong tax rate",
    )
    .await;
    let before = sub.get("default", id).unwrap().strength;
    let recalls: Vec<_> = (0..5)
        .map(|_| {
            let sub = sub.clone();
            tokio::spawn(async move {
                sub.recall(&RecallRequest::new("default", "s1", "tax rate"))
                    .await
                    .unwrap()
                    .memories
                    .len()
            })
        })
        .collect();
    for r in recalls {
        assert_eq!(r.await.unwrap(), 1);
    }
    sub.store().sync().await.unwrap();
    let after = sub.get("default", id).unwrap();
    assert_eq!(after.reinforcements, 5);
    assert!(
        (after.strength - (before + 5.0 * 0.05)).abs() < 1e-5,
        "{before} + 5 × 0.05 != {}",
        after.strength
    );
    let reinforced = sub
        .history("default", id)
        .unwrap()
        .iter()
        .filter(|e| format!("{:?}", e.action) == "Reinforced")
        .count();
    assert_eq!(reinforced, 5);
    sub.close().unwrap();
}

#[tokio::test]
async fn neighbouring_turns_and_named_dates_lead_recall_to_the_answer() {
    let dir = tempfile::tempdir().unwrap();
    let (sub, _) = open(dir.path());
    let at = |s: &str| shadowbrain_runtime::parse_rfc3339("t", s).unwrap();
    let turn = |t: i64, text: &str| NewMemory {
        timestamp: Some(t),
        ..NewMemory::new("user_message", text)
    };
    let t0 = at("2023-05-08T13:00:00Z");
    let mut turns = vec![
        turn(t0, "Caroline: What did you paint last weekend?"),
        turn(
            t0 + 1_000,
            "Melanie: A sunset over the lake, purple clouds and all.",
        ),
        // Two hours later the conversation has moved on: no context across the pause.
        turn(t0 + 7_200_000, "Melanie: The pottery class was fun."),
    ];
    for (i, text) in [
        "Caroline: I bought paint for the fence.",
        "Melanie: The weekend market had paint brushes.",
        "Caroline: Paint dries slowly when it rains.",
    ]
    .iter()
    .enumerate()
    {
        turns.push(turn(t0 + 86_400_000 + i as i64 * 1_000, text));
    }
    // Filler after everything, so the session's recent path holds none of the above.
    for i in 0..12 {
        turns.push(turn(
            t0 + 3 * 86_400_000 + i * 1_000,
            &format!("Caroline: filler number {i} about the football match"),
        ));
    }
    let camping = [
        turn(
            at("2023-06-10T10:00:00Z"),
            "Melanie: we went camping by the river",
        ),
        turn(
            at("2023-08-10T10:00:00Z"),
            "Melanie: we went camping by the river",
        ),
    ];
    turns.extend(camping);
    let recorded = sub.record("default", "chat", turns).await.unwrap();
    let (sunset, pottery) = (recorded[1], recorded[2]);
    let (june, august) = (recorded[recorded.len() - 2], recorded[recorded.len() - 1]);

    let ask = |query: &str, policy: &str| {
        let sub = sub.clone();
        let mut req = RecallRequest::new("default", "chat", query);
        req.k = 3;
        req.include_knowledge = false;
        req.reinforce = false;
        let policy = Arc::new(Policy::from_toml("test.toml", policy).unwrap());
        async move {
            let q = sub
                .embedder()
                .embed(&[req.query.clone()])
                .await
                .unwrap()
                .pop();
            sub.rank(&req, q.as_deref(), &policy).unwrap().0
        }
    };
    // Keyword evidence only, so the hash embedder's weak votes cannot decide.
    let with = "[scoring]\nvector_weight = 0.0\n";
    let without = "[scoring]\nvector_weight = 0.0\ncontext_window = 0\ntime_boost = 0.0\n";

    let found = ids(&ask("What did you paint last weekend?", with).await);
    assert!(found.contains(&sunset), "{found:?}");
    // The pottery turn two hours on takes nothing from the question before the pause.
    let mut req = RecallRequest::new("default", "chat", "What did you paint last weekend?");
    req.k = 30;
    req.reinforce = false;
    let policy = Arc::new(Policy::from_toml("test.toml", with).unwrap());
    let all = sub.rank(&req, None, &policy).unwrap().0;
    let relevance = |id| {
        all.memories
            .iter()
            .find(|m| m.record.id == id)
            .map(|m| m.why.relevance)
    };
    assert!(relevance(sunset) > Some(0.0));
    assert_eq!(
        relevance(pottery).unwrap_or(0.0),
        0.0,
        "not a candidate, or one without relevance"
    );
    let alone = ids(&ask("What did you paint last weekend?", without).await);
    assert!(!alone.contains(&sunset), "{alone:?}");

    // The same words on two dates: the date the question names comes first; without the
    // cue the newer one does (ties go to the most recent).
    let q = "When did Melanie go camping in June?";
    assert_eq!(ids(&ask(q, with).await)[0], june);
    assert_eq!(ids(&ask(q, without).await)[0], august);
    sub.close().unwrap();
}

#[tokio::test]
async fn a_recall_for_many_memories_keeps_every_keyword_hit_past_the_context_pass() {
    let dir = tempfile::tempdir().unwrap();
    let (sub, _) = open(dir.path());
    // 45 matching turns a day apart (no context between them), more than the 30 hits the
    // context pass reads.
    let turns: Vec<NewMemory> = (0..45)
        .map(|i| NewMemory {
            timestamp: Some(T0 - (i + 1) * DAY_MS),
            ..NewMemory::new(
                "user_message",
                format!("Melanie: day {i} of the pottery course"),
            )
        })
        .collect();
    sub.record("default", "chat", turns).await.unwrap();
    let mut req = RecallRequest::new("default", "elsewhere", "pottery course");
    req.k = 45;
    req.scope = Scope::Namespace;
    req.reinforce = false;
    let policy =
        Arc::new(Policy::from_toml("test.toml", "[scoring]\nvector_weight = 0.0\n").unwrap());
    let res = sub.rank(&req, None, &policy).unwrap().0;
    assert_eq!(res.memories.len(), 45);
    assert!(res.memories.iter().all(|m| m.why.relevance > 0.0));
    sub.close().unwrap();
}
