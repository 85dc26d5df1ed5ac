//! The update detector ([`shadowbrain_runtime::updates`]) on a labelled set of 262 pairs
//! written for it (`tests/data/updates_pairs.jsonl`: updates, contradictions, paraphrased
//! duplicates and unrelated near-misses, by someone who had not seen the rules). Odd ids
//! are the half the rules were tuned on, even ids the held-out half; precision and recall
//! per class are printed for both, and the held-out half must keep the floors below.
//! Similarity comes from the local model when it is installed (as in `serve`), else from
//! the hash embedder. Then the detector on a real substrate: what a supersession, a
//! contradiction and a repeat write, and how recall shows them.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::Value;
use shadowbrain_runtime::embed::{Embedder, HashEmbedder, LocalEmbedder};
use shadowbrain_runtime::internals::Queue;
use shadowbrain_runtime::llm::chat::ChatClient;
use shadowbrain_runtime::llm::cost::Llm;
use shadowbrain_runtime::llm::updates::LlmUpdateJudge;
use shadowbrain_runtime::llm::{LlmConfig, LlmKind};
use shadowbrain_runtime::policy::Policy;
use shadowbrain_runtime::updates::{Change, Claims, Thresholds, compare};
use shadowbrain_runtime::{
    AuditAction, Edge, FeedbackTarget, IndexingOptions, MemoryId, NewMemory, Outcome, PartFuture,
    PartLink, Promotion, RecallRequest, Relation, Resolution, Scope, Spread, Substrate,
    SubstrateOptions, UpdatesRound, VirtualClock,
};
use shadowbrain_runtime::{PairBatch, PairItem};
use shadowbrain_test_support::{Endpoint, Reply};

const CLASSES: [Change; 4] = [
    Change::Supersedes,
    Change::Contradicts,
    Change::Duplicate,
    Change::Unrelated,
];

struct Pair {
    id: u32,
    class: Change,
    older: String,
    newer: String,
}

fn pairs() -> Vec<Pair> {
    let text = include_str!("../data/updates_pairs.jsonl");
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            let class = match v["class"].as_str().unwrap() {
                "supersedes" => Change::Supersedes,
                "contradicts" => Change::Contradicts,
                "duplicate" => Change::Duplicate,
                "unrelated" => Change::Unrelated,
                other => panic!("unknown class {other}"),
            };
            Pair {
                id: v["id"].as_str().unwrap()[1..].parse().unwrap(),
                class,
                older: v["older"]["text"].as_str().unwrap().to_string(),
                newer: v["newer"]["text"].as_str().unwrap().to_string(),
            }
        })
        .collect()
}

/// Precision and recall of each class over `decided` (label, decision).
fn scores(decided: &[(Change, Change)]) -> HashMap<Change, (f32, f32)> {
    CLASSES
        .iter()
        .map(|&c| {
            let tp = decided.iter().filter(|(l, d)| *l == c && *d == c).count() as f32;
            let said = decided.iter().filter(|(_, d)| *d == c).count() as f32;
            let truth = decided.iter().filter(|(l, _)| *l == c).count() as f32;
            (c, (tp / said.max(1.0), tp / truth.max(1.0)))
        })
        .collect()
}

#[tokio::test]
async fn the_rules_find_updates_contradictions_and_duplicates_in_the_labelled_set() {
    let pairs = pairs();
    assert!(
        pairs.len() >= 200,
        "the labelled set has {} pairs",
        pairs.len()
    );
    let embedder: Box<dyn Embedder> = match crate::local_model::model() {
        Some(dir) => Box::new(LocalEmbedder::open(&dir, None).unwrap()),
        None => Box::new(HashEmbedder::new(384).unwrap()),
    };
    let texts: Vec<String> = pairs
        .iter()
        .flat_map(|p| [p.newer.clone(), p.older.clone()])
        .collect();
    let vectors = embedder.embed(&texts).await.unwrap();
    let t = Thresholds::default();
    let mut halves: [Vec<(Change, Change)>; 2] = [Vec::new(), Vec::new()];
    let mut wrong = Vec::new();
    let mut sims: HashMap<&str, Vec<f32>> = HashMap::new();
    for (i, p) in pairs.iter().enumerate() {
        let similarity =
            shadowbrain_runtime::internals::cosine(&vectors[2 * i], &vectors[2 * i + 1]);
        let f = compare(&Claims::of(&p.newer), &Claims::of(&p.older), similarity, &t);
        halves[(p.id % 2) as usize].push((p.class, f.change));
        sims.entry(p.class.as_str()).or_default().push(similarity);
        if f.change != p.class && (p.id % 2 == 1 || std::env::var_os("UPDATES_SHOW_ALL").is_some())
        {
            wrong.push(format!(
                "p{:03} {} as {} (sim {similarity:.2}; {})",
                p.id,
                p.class.as_str(),
                f.change.as_str(),
                f.reason
            ));
        }
    }
    println!("{} on the tuning half:\n{}", wrong.len(), wrong.join("\n"));
    println!("embedder: {}", embedder.name());
    for (class, mut s) in sims {
        s.sort_by(f32::total_cmp);
        let q = |f: f32| s[((s.len() - 1) as f32 * f) as usize];
        println!(
            "  similarity of {class}: p10 {:.2} median {:.2} p90 {:.2}",
            q(0.1),
            q(0.5),
            q(0.9)
        );
    }
    let held_out = scores(&halves[0]);
    let local = embedder.name().starts_with("local:");
    for (name, half) in [
        ("tuning (odd ids)", &halves[1]),
        ("held out (even ids)", &halves[0]),
    ] {
        let s = scores(half);
        let correct = half.iter().filter(|(l, d)| l == d).count();
        println!(
            "{name}: {} pairs, accuracy {:.3}",
            half.len(),
            correct as f32 / half.len() as f32
        );
        for c in CLASSES {
            println!(
                "  {:<12} precision {:.3} recall {:.3}",
                c.as_str(),
                s[&c].0,
                s[&c].1
            );
        }
    }
    // Floors a little under what the held-out half reaches with the local model (this
    // test prints it): a change to the rules that loses ground fails here. Conflicts are
    // decided before similarity is looked at, so their floors hold with either embedder.
    let mut floors = vec![
        (Change::Supersedes, 0.75, 0.35),
        (Change::Contradicts, 0.75, 0.35),
    ];
    if local {
        floors.push((Change::Duplicate, 0.70, 0.40));
    }
    for (class, precision, recall) in floors {
        let (p, r) = held_out[&class];
        assert!(
            p >= precision && r >= recall,
            "{}: precision {p:.3} (floor {precision}), recall {r:.3} (floor {recall})",
            class.as_str()
        );
    }
}

/// A substrate with `[updates]` as `updates` says, on the local model when installed
/// (else the hash embedder, whose similarities are lower: the threshold follows).
fn open_with_updates(dir: &std::path::Path, updates: &str) -> Substrate {
    open_with_policy(dir, "", updates)
}

/// [`open_with_updates`] with other policy sections (`before`) too.
fn open_with_policy(dir: &std::path::Path, before: &str, updates: &str) -> Substrate {
    open_spread(dir, before, updates, None, None)
}

/// [`open_with_policy`], as partition `part` of three (its id block) with `spread`.
fn open_spread(
    dir: &std::path::Path,
    before: &str,
    updates: &str,
    part: Option<u16>,
    spread: Option<crate::scatter::Others>,
) -> Substrate {
    let (embedder, floor) = embedder();
    let spread = spread.map(|s| Arc::new(s) as Arc<dyn Spread>);
    let clock = Arc::new(VirtualClock::new(1_780_000_000_000));
    open_part(dir, before, updates, (embedder, floor), part, spread, clock)
}

/// The local model when it is installed (as in `serve`), else the hash embedder, with the
/// similarity floor that suits each.
fn embedder() -> (Arc<dyn Embedder>, f32) {
    match crate::local_model::model() {
        Some(dir) => (Arc::new(LocalEmbedder::open(&dir, None).unwrap()), 0.5),
        None => (Arc::new(HashEmbedder::new(384).unwrap()), 0.2),
    }
}

/// A store of one policy's `[updates]` (`updates`, other sections `before`), as partition
/// `part` of three with `spread`, on `clock`.
fn open_part(
    dir: &std::path::Path,
    before: &str,
    updates: &str,
    (embedder, floor): (Arc<dyn Embedder>, f32),
    part: Option<u16>,
    spread: Option<Arc<dyn Spread>>,
    clock: Arc<VirtualClock>,
) -> Substrate {
    let toml = format!("{before}[updates]\n{updates}\nmin_similarity = {floor}\n");
    Substrate::open(
        dir,
        SubstrateOptions {
            clock,
            policy: Policy::from_toml("<test>", &toml).unwrap(),
            embedder,
            indexing: IndexingOptions {
                background: false,
                ..IndexingOptions::default()
            },
            ids: part.map(|p| shadowbrain_runtime::IdBlock::of_partition(p, 3)),
            spread,
            ..SubstrateOptions::default()
        },
    )
    .unwrap()
}

async fn write(sub: &Substrate, session: &str, at: i64, text: &str) -> MemoryId {
    sub.record(
        "acme",
        session,
        vec![NewMemory {
            timestamp: Some(at),
            ..NewMemory::new("observation", text)
        }],
    )
    .await
    .unwrap()[0]
}

async fn settle(sub: &Substrate) -> UpdatesRound {
    while sub.enrich_pending(64).await.unwrap() > 0 {}
    sub.detect_all_updates().unwrap()
}

const DAY: i64 = 86_400_000;

#[tokio::test]
async fn a_newer_value_supersedes_the_older_which_stays_readable_and_ranks_below_it() {
    let dir = tempfile::tempdir().unwrap();
    let sub = open_with_updates(dir.path(), "mode = \"rules\"");
    let t0 = 1_770_000_000_000;
    let old = write(
        &sub,
        "ops",
        t0,
        "The deploy runner for production is in eu-1.",
    )
    .await;
    write(
        &sub,
        "ops",
        t0 + DAY,
        "I ordered pizza for the team lunch on Friday.",
    )
    .await;
    let new = write(
        &sub,
        "planning",
        t0 + 30 * DAY,
        "The deploy runner for production moved to eu-2.",
    )
    .await;
    let round = settle(&sub).await;
    assert_eq!(round.superseded, 1, "{round:?}");
    assert_eq!(round.contradicted, 0, "{round:?}");

    // Validity, not deletion: the old record is still there, and says what replaced it
    // and since when; both histories say why and by whom.
    let v = sub.store().validity(old).unwrap();
    assert_eq!(v.superseded_by, Some(new));
    assert_eq!(v.valid_until, Some(t0 + 30 * DAY));
    assert!(v.learned_at.is_some());
    assert_eq!(
        sub.get("acme", old).unwrap().text,
        "The deploy runner for production is in eu-1."
    );
    let history = sub.history("acme", old).unwrap();
    let entry = history
        .iter()
        .find(|e| e.action == AuditAction::Superseded)
        .expect("the old record's history says it was superseded");
    assert_eq!(entry.by, "updates:rules");
    assert!(
        entry.detail.contains(&new.to_string()) && entry.detail.contains("eu-1"),
        "{entry:?}"
    );
    assert!(
        sub.history("acme", new)
            .unwrap()
            .iter()
            .any(|e| e.action == AuditAction::Superseded && e.detail.contains(&old.to_string()))
    );
    assert!(sub.store().edges("acme", None).unwrap().contains(&Edge {
        from: new,
        to: old,
        relation: Relation::Supersedes
    }));

    // Recall prefers the current value and says what the old one is.
    sub.flush_indexes().unwrap();
    let ask = |query: &str, include_superseded: bool| RecallRequest {
        scope: Scope::Namespace,
        include_superseded,
        reinforce: false,
        ..RecallRequest::new("acme", "asker", query)
    };
    let r = sub
        .recall(&ask("where is the production deploy runner?", false))
        .await
        .unwrap();
    let ids: Vec<MemoryId> = r.memories.iter().map(|m| m.record.id).collect();
    let (at_new, at_old) = (
        ids.iter().position(|i| *i == new).unwrap(),
        ids.iter()
            .position(|i| *i == old)
            .expect("the old value is still returned"),
    );
    assert!(at_new < at_old, "{ids:?}");
    let old_why = &r.memories[at_old].why;
    assert_eq!(old_why.superseded_by, Some(new));
    assert_eq!(old_why.valid_until, Some(t0 + 30 * DAY));
    assert_eq!(r.memories[at_new].why.superseded_by, None);
    // Asked about the past, the old value is ranked as it matches.
    let before = sub
        .recall(&ask(
            "where was the production deploy runner before?",
            false,
        ))
        .await
        .unwrap();
    let included = sub
        .recall(&ask("where is the production deploy runner?", true))
        .await
        .unwrap();
    // The same question with include_superseded ranks the pair by its own scores: the
    // old record's score is untouched, the new one is no longer lifted above it.
    let score = |r: &shadowbrain_runtime::RecallResult, id| {
        r.memories.iter().find(|m| m.record.id == id).unwrap().score
    };
    assert_eq!(score(&included, old), score(&r, old));
    assert!(score(&included, new) <= score(&r, new));
    assert!(score(&r, new) > score(&r, old));
    let past = before.memories.iter().find(|m| m.record.id == old).unwrap();
    assert_eq!(
        past.why.superseded_by,
        Some(new),
        "history still says what replaced it"
    );
}

#[tokio::test]
async fn a_contradiction_without_order_is_kept_open_on_both_sides_and_a_repeat_reinforces() {
    let dir = tempfile::tempdir().unwrap();
    let sub = open_with_updates(dir.path(), "mode = \"rules\"");
    let t0 = 1_770_000_000_000;
    // The same moment in two sessions: nothing says which came later.
    let a = write(
        &sub,
        "s1",
        t0,
        "I have never written a Flask route for this project.",
    )
    .await;
    let b = write(
        &sub,
        "s2",
        t0,
        "I wrote the /login route in Flask for this project.",
    )
    .await;
    let round = settle(&sub).await;
    assert_eq!(round.contradicted, 1, "{round:?}");
    assert_eq!(sub.store().validity(a).unwrap().conflicts, vec![b]);
    assert_eq!(sub.store().validity(b).unwrap().conflicts, vec![a]);
    assert!(
        sub.history("acme", a)
            .unwrap()
            .iter()
            .any(|e| e.action == AuditAction::Contradicted)
    );
    // Held for review where a person looks.
    let held = sub.insights("acme", t0, 10).await.unwrap().conflicts;
    let held: Vec<(MemoryId, Vec<MemoryId>)> = held.into_iter().map(|(r, w)| (r.id, w)).collect();
    assert_eq!(held, vec![(a, vec![b]), (b, vec![a])]);
    sub.flush_indexes().unwrap();
    let r = sub
        .recall(&RecallRequest {
            scope: Scope::Namespace,
            reinforce: false,
            ..RecallRequest::new("acme", "asker", "have I written Flask routes?")
        })
        .await
        .unwrap();
    for m in r.memories.iter().filter(|m| [a, b].contains(&m.record.id)) {
        assert_eq!(m.why.conflicts_with.len(), 1, "{:?}", m.why);
    }

    // Settled by hand: `a` was right; `b` becomes superseded by it, the conflict closes.
    sub.resolve("acme", a, Resolution::Keep, Some("checked the repo"), "ops")
        .unwrap();
    assert!(sub.store().validity(a).unwrap().conflicts.is_empty());
    assert_eq!(sub.store().validity(b).unwrap().superseded_by, Some(a));
    assert!(
        sub.insights("acme", t0, 10)
            .await
            .unwrap()
            .conflicts
            .is_empty()
    );
    let err = sub
        .resolve("acme", a, Resolution::Dismiss, None, "ops")
        .unwrap_err()
        .to_string();
    assert!(err.contains("no open conflict"), "{err}");

    let first = write(
        &sub,
        "s3",
        t0 + DAY,
        "Our staging database runs Postgres 15.",
    )
    .await;
    let before = sub.get("acme", first).unwrap().reinforcements;
    let again = write(
        &sub,
        "s4",
        t0 + 2 * DAY,
        "Our staging database runs Postgres 15.",
    )
    .await;
    let round = settle(&sub).await;
    assert_eq!(round.repeated, 1, "{round:?}");
    assert_eq!(
        sub.store().validity(again).unwrap().duplicate_of,
        Some(first)
    );
    assert_eq!(sub.get("acme", first).unwrap().reinforcements, before + 1);
}

#[tokio::test]
async fn without_the_section_nothing_is_queued_and_the_hash_is_unchanged() {
    let plain = Policy::from_toml("<test>", "").unwrap();
    let off = Policy::from_toml("<test>", "[updates]\nmode = \"off\"\ncandidates = 9\n").unwrap();
    let on = Policy::from_toml("<test>", "[updates]\nmode = \"rules\"\n").unwrap();
    assert_eq!(plain.hash, off.hash);
    assert_ne!(plain.hash, on.hash);
    let bad = Policy::from_toml(
        "<test>",
        "[updates]\nmode = \"sometimes\"\ncandidates = 0\n",
    )
    .unwrap_err()
    .to_string();
    assert!(
        bad.contains("updates.mode") && bad.contains("updates.candidates"),
        "{bad}"
    );

    let dir = tempfile::tempdir().unwrap();
    let sub = open_with_updates(dir.path(), "mode = \"off\"");
    write(&sub, "ops", 1, "The deploy runner is in eu-1.").await;
    write(&sub, "ops", 2, "The deploy runner moved to eu-2.").await;
    assert_eq!(sub.store().queue_depth(Queue::Updates, 10).unwrap(), 0);
    assert_eq!(settle(&sub).await, UpdatesRound::default());
}

/// A condensed record of `session` (three events at `at` stating `lesson`), proven by a
/// success so that promotion admits it.
async fn proven_lesson(sub: &Substrate, session: &str, at: i64, lesson: &str) -> MemoryId {
    let events = ["tried it", "it worked", "note for next time"]
        .into_iter()
        .map(|what| NewMemory {
            importance: Some(8.0),
            timestamp: Some(at),
            ..NewMemory::new("observation", format!("{what}: {lesson}"))
        })
        .collect();
    sub.record("acme", session, events).await.unwrap();
    let c = sub.condense("acme", session, "condenser").await.unwrap();
    let c = c.expect("three events condense").id;
    while sub.enrich_pending(64).await.unwrap() > 0 {}
    sub.feedback(
        "acme",
        &FeedbackTarget::Memories(vec![c]),
        Outcome::Success,
        session,
    )
    .await
    .unwrap();
    c
}

#[tokio::test]
async fn promotion_supersedes_an_old_lesson_and_holds_a_contradicting_one_for_review() {
    let dir = tempfile::tempdir().unwrap();
    // Scope `session`: the condensed records of the three sessions are not compared with
    // each other, so what is seen here is promotion's own check against the pool.
    let promotion = "[condensation]\nevery_events = 50\nmin_events = 3\n\
                     [promotion]\nmin_importance = 6\nmin_utility = 0.6\nmin_successes = 1\n";
    let sub = open_with_policy(
        dir.path(),
        promotion,
        "mode = \"rules\"\nscope = \"session\"",
    );
    let t0 = 1_770_000_000_000;
    let c1 = proven_lesson(&sub, "a", t0, "the deploy runner for production is in eu-1").await;
    let Promotion::Created { knowledge: k1, .. } = sub.promote("acme", c1, "kg").await.unwrap()
    else {
        panic!("the first lesson is created");
    };

    // A newer value: a new knowledge record that supersedes the old one, never merged.
    let c2 = proven_lesson(
        &sub,
        "b",
        t0 + 30 * DAY,
        "the deploy runner for production moved to eu-2",
    )
    .await;
    let promoted = sub.promote("acme", c2, "kg").await.unwrap();
    let Promotion::Created {
        knowledge: k2,
        edges,
    } = &promoted
    else {
        panic!("a newer value is a new lesson, not a merge: {promoted:?}");
    };
    let k2 = *k2;
    let supersedes = Edge {
        from: k2,
        to: k1,
        relation: Relation::Supersedes,
    };
    assert!(edges.contains(&supersedes), "{edges:?}");
    assert!(
        sub.store()
            .edges("acme", None)
            .unwrap()
            .contains(&supersedes)
    );
    let v1 = sub.store().validity(k1).unwrap();
    assert_eq!(v1.superseded_by, Some(k2));
    assert_eq!(v1.valid_until, Some(t0 + 30 * DAY));
    assert!(
        sub.history("acme", k1)
            .unwrap()
            .iter()
            .any(|e| e.action == AuditAction::Superseded && e.detail.contains(&c2.to_string())),
        "the old lesson's history says what replaced it"
    );

    // A claim against the current lesson from the same moment, in another session: no
    // order, so it is held for review: an edge, open on both sides, nothing merged.
    let c3 = proven_lesson(
        &sub,
        "c",
        t0 + 30 * DAY,
        "the deploy runner for production moved to eu-3",
    )
    .await;
    let held = sub.promote("acme", c3, "kg").await.unwrap();
    let Promotion::Held {
        against,
        edges,
        reason,
    } = &held
    else {
        panic!("a contradicting lesson is held: {held:?}");
    };
    assert_eq!(against, &vec![k2]);
    assert!(reason.contains("resolve"), "{reason}");
    let contradicts = Edge {
        from: c3,
        to: k2,
        relation: Relation::Contradicts,
    };
    assert_eq!(edges, &vec![contradicts]);
    assert_eq!(sub.store().validity(c3).unwrap().conflicts, vec![k2]);
    assert_eq!(sub.store().validity(k2).unwrap().conflicts, vec![c3]);
    assert_eq!(sub.store().promoted_into(c3).unwrap(), None);
    assert_eq!(
        sub.get("acme", k2).unwrap().sources.len(),
        1,
        "nothing merged"
    );
    let insights = sub.insights("acme", t0 + 31 * DAY, 10).await.unwrap();
    assert!(
        insights
            .conflicts
            .iter()
            .any(|(r, with)| r.id == c3 && with == &vec![k2]),
        "{:?}",
        insights.conflicts
    );
    // Offered again while the conflict is open: still held, nothing written twice.
    let again = sub.promote("acme", c3, "kg").await.unwrap();
    assert!(
        matches!(&again, Promotion::Held { edges, .. } if edges.is_empty()),
        "{again:?}"
    );

    // A person keeps the newer claim: the lesson it contradicted is superseded, and the
    // promotion that follows makes it knowledge that takes the old lesson's place.
    sub.resolve("acme", c3, Resolution::Keep, Some("eu-3 is right"), "ops")
        .unwrap();
    let after = sub.promote("acme", c3, "kg").await.unwrap();
    let Promotion::Created { knowledge: k3, .. } = after else {
        panic!("settled, it is promoted: {after:?}");
    };
    let v2 = sub.store().validity(k2).unwrap();
    assert_eq!(v2.superseded_by, Some(k3));
    assert!(v2.conflicts.is_empty());
    assert_eq!(
        sub.chain("acme", k1).unwrap().newer,
        vec![k2, k3],
        "the pool's chain of values"
    );
    // The old value itself is not promoted any more.
    let c0 = proven_lesson(
        &sub,
        "d",
        t0 - DAY,
        "the deploy runner for production is in eu-0",
    )
    .await;
    let refused = sub.promote("acme", c0, "kg").await.unwrap();
    assert!(
        matches!(&refused, Promotion::NotEligible(why) if why.contains("older value")),
        "{refused:?}"
    );
}

/// A scripted model on a real OpenAI-compatible endpoint: it answers each pair of a
/// request with `label(older, newer)`, except that every fourth request first gets an
/// answer that is no JSON at all (the judge must ask again), and requests while `down`
/// answer 500. An [`Llm`] on it, `tokens_per_hour` per namespace.
async fn scripted_model(
    label: impl Fn(&str, &str) -> &'static str + Send + Sync + 'static,
    down: Arc<std::sync::atomic::AtomicBool>,
    tokens_per_hour: u64,
) -> (Arc<Llm>, Endpoint) {
    use std::sync::atomic::Ordering;
    let endpoint = Endpoint::start(move |request| {
        if down.load(Ordering::SeqCst) {
            return Reply::error(500, "the model is down");
        }
        let retry = request.user().contains("was not valid JSON");
        if request.n % 4 == 3 && !retry {
            return Reply::chat(
                "Sure! Here is what I think about these pairs.",
                Some((10, 5)),
            );
        }
        let lines: Vec<&str> = request.user().lines().collect();
        let mut items = Vec::new();
        for (i, line) in lines.iter().enumerate() {
            let Some((n, older)) = line.split_once(". OLDER: ") else {
                continue;
            };
            let newer = lines[i + 1].trim_start().trim_start_matches("NEWER: ");
            items.push(serde_json::json!({
                "index": n.parse::<usize>().unwrap(),
                "relation": label(older, newer),
                "reason": "scripted",
            }));
        }
        Reply::chat(
            &serde_json::json!({ "items": items }).to_string(),
            Some((10, 5)),
        )
    })
    .await;
    let cfg = LlmConfig {
        kind: LlmKind::Openai,
        base_url: Some(endpoint.base_url()),
        model: Some("scripted".into()),
        api_key_env: "SHADOWBRAIN_TEST_NO_SUCH_KEY".into(),
        timeout: "5s".into(),
        max_retries: 0,
        ..LlmConfig::default()
    };
    let client = ChatClient::new(&cfg).unwrap();
    (
        Arc::new(Llm::new(Arc::new(client), tokens_per_hour)),
        endpoint,
    )
}

/// The labelled set through the LLM judge on a scripted model that knows the labels but
/// gets one pair in ten wrong (a model is not an oracle) and answers every fourth request
/// with prose first. What this measures is the LLM path, not a model: the figures should
/// be those of the script (0.9 of the labels) with nothing lost to batching, retries or
/// parsing; a pair the judge cannot decide would fall back to the rules.
#[tokio::test]
async fn the_llm_judge_decides_the_labelled_set_through_faults_without_losing_a_pair() {
    let pairs = pairs();
    let labels: HashMap<(String, String), (u32, Change)> = pairs
        .iter()
        .map(|p| ((p.older.clone(), p.newer.clone()), (p.id, p.class)))
        .collect();
    let label = move |older: &str, newer: &str| {
        let (id, class) = labels[&(older.to_string(), newer.to_string())];
        // One pair in ten, of both halves, gets the next class: the script's own errors.
        let class = match id % 20 == 3 || id % 20 == 8 {
            false => class,
            true => CLASSES[(CLASSES.iter().position(|c| *c == class).unwrap() + 1) % 4],
        };
        class.as_str()
    };
    let down = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (llm, endpoint) = scripted_model(label, down, 0).await;
    let judge = LlmUpdateJudge::new(llm.clone(), 24, 1000);
    let items: Vec<PairItem> = pairs
        .iter()
        .map(|p| PairItem {
            newer: p.newer.clone(),
            older: p.older.clone(),
            similarity: 0.7,
            rules: Change::Unrelated,
        })
        .collect();
    let verdicts = shadowbrain_runtime::UpdateJudge::judge(
        &judge,
        PairBatch {
            namespace: "acme",
            items: &items,
            now: 0,
        },
    )
    .await
    .unwrap();
    let mut halves: [Vec<(Change, Change)>; 2] = [Vec::new(), Vec::new()];
    let mut fell_back = 0;
    for (p, v) in pairs.iter().zip(&verdicts) {
        let decided = match v {
            Ok(f) => f.change,
            Err(_) => {
                fell_back += 1;
                compare(
                    &Claims::of(&p.newer),
                    &Claims::of(&p.older),
                    0.7,
                    &Thresholds::default(),
                )
                .change
            }
        };
        halves[(p.id % 2) as usize].push((p.class, decided));
    }
    let requests = endpoint.requests();
    let retries = endpoint
        .seen()
        .iter()
        .filter(|r| r.user().contains("was not valid JSON"))
        .count();
    println!(
        "scripted LLM: {} pairs in {requests} requests ({retries} asked again after prose), \
         {fell_back} left to the rules",
        pairs.len()
    );
    for (name, half) in [
        ("tuning (odd ids)", &halves[1]),
        ("held out (even ids)", &halves[0]),
    ] {
        let s = scores(half);
        println!("{name}:");
        for c in CLASSES {
            println!(
                "  {:<12} precision {:.3} recall {:.3}",
                c.as_str(),
                s[&c].0,
                s[&c].1
            );
        }
    }
    assert_eq!(fell_back, 0, "every pair decided by the judge");
    assert!(retries > 0, "the prose answers were asked again");
    // 262 pairs in requests of 24: 11 requests, and a retry for every fourth.
    assert_eq!(requests, pairs.len().div_ceil(24) + retries);
    let all: Vec<(Change, Change)> = halves.concat();
    let agree = all.iter().filter(|(l, d)| l == d).count() as f32 / all.len() as f32;
    assert!(
        (0.85..0.95).contains(&agree),
        "the script's 0.9 comes through: {agree}"
    );
    // The same pairs again cost nothing: the cache answers.
    let again = shadowbrain_runtime::UpdateJudge::judge(
        &judge,
        PairBatch {
            namespace: "acme",
            items: &items,
            now: 0,
        },
    )
    .await
    .unwrap();
    assert!(
        again
            .iter()
            .all(|v| v.as_ref().is_ok_and(|f| f.reason.contains("cached")))
    );
    assert_eq!(endpoint.requests(), requests);
}

#[tokio::test]
async fn in_llm_mode_the_judge_decides_and_a_failing_judge_leaves_the_rules_audited() {
    use std::sync::atomic::Ordering;
    let dir = tempfile::tempdir().unwrap();
    let sub = open_with_updates(dir.path(), "mode = \"llm\"");
    // The model takes the lunch pair (which the rules call unrelated) for a repeat.
    let label = |older: &str, _newer: &str| match older.contains("lunch") {
        true => "duplicate",
        false => "supersedes",
    };
    let down = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (llm, endpoint) = scripted_model(label, down.clone(), 0).await;
    let judge = LlmUpdateJudge::new(llm, 24, 1000);
    sub.attach_update_judge();
    let t0 = 1_770_000_000_000;
    let old = write(
        &sub,
        "ops",
        t0,
        "The deploy runner for production is in eu-1.",
    )
    .await;
    let new = write(
        &sub,
        "ops",
        t0 + DAY,
        "The deploy runner for production moved to eu-2.",
    )
    .await;
    while sub.enrich_pending(64).await.unwrap() > 0 {}
    // Scheduled indexing passes leave the queue to the judge's rounds now.
    sub.flush_indexes().unwrap();
    assert!(sub.store().is_queued(Queue::Updates, new).unwrap());
    let round = sub.detect_all_updates_with(&judge).await.unwrap();
    assert_eq!(
        (round.superseded, round.judged, round.fell_back),
        (1, 1, 0),
        "{round:?}"
    );
    assert!(endpoint.requests() >= 1);
    assert_eq!(sub.store().validity(old).unwrap().superseded_by, Some(new));
    let entry = sub
        .history("acme", old)
        .unwrap()
        .into_iter()
        .find(|e| e.action == AuditAction::Superseded)
        .unwrap();
    assert_eq!(entry.by, "updates:llm:scripted");
    assert!(entry.detail.contains("scripted"), "{entry:?}");

    // The model is down: the pair goes to the rules, and the history says why.
    down.store(true, Ordering::SeqCst);
    let a = write(
        &sub,
        "ops",
        t0 + 2 * DAY,
        "The staging database is on port 5432.",
    )
    .await;
    let b = write(
        &sub,
        "ops",
        t0 + 3 * DAY,
        "The staging database moved to port 6543.",
    )
    .await;
    while sub.enrich_pending(64).await.unwrap() > 0 {}
    let round = sub.detect_all_updates_with(&judge).await.unwrap();
    assert!(round.fell_back >= 1, "{round:?}");
    assert_eq!(sub.store().validity(a).unwrap().superseded_by, Some(b));
    let entry = sub
        .history("acme", a)
        .unwrap()
        .into_iter()
        .find(|e| e.action == AuditAction::Superseded)
        .unwrap();
    assert_eq!(entry.by, "updates:rules");
    assert!(entry.detail.contains("could not decide"), "{entry:?}");
}

#[tokio::test]
async fn with_scope_agent_each_agent_keeps_its_own_value_and_its_own_update_supersedes_it() {
    let dir = tempfile::tempdir().unwrap();
    let sub = open_with_updates(dir.path(), "mode = \"rules\"\nscope = \"agent\"");
    let t0 = 1_770_000_000_000;
    let told = |agent: &str, session: &str, at: i64, text: &str| {
        let (agent, session, text) = (agent.to_string(), session.to_string(), text.to_string());
        let sub = sub.clone();
        async move {
            sub.record(
                "acme",
                &session,
                vec![NewMemory {
                    agent_id: Some(agent),
                    timestamp: Some(at),
                    ..NewMemory::new("observation", text)
                }],
            )
            .await
            .unwrap()[0]
        }
    };
    let a_old = told("a", "a-1", t0, "The Acme account reference code is K3X9.").await;
    let b_own = told(
        "b",
        "b-1",
        t0 + DAY,
        "The Acme account reference code is P2Q8.",
    )
    .await;
    let a_new = told(
        "a",
        "a-2",
        t0 + 2 * DAY,
        "The Acme account reference code is now Z7W1.",
    )
    .await;
    let round = settle(&sub).await;
    assert_eq!(round.superseded, 1, "{round:?}");
    assert_eq!(
        sub.store().validity(a_old).unwrap().superseded_by,
        Some(a_new)
    );
    // Another agent's value is neither superseded by a's update nor superseding a's.
    assert!(sub.store().validity(b_own).unwrap().is_clear());
}

/// Placed by session, a lesson held against the pool at the namespace's home (another
/// store) is settled by hand where it lives: the home's side follows (the lesson kept
/// against supersedes the pool's, both conflicts closed), and the promotion that follows
/// makes it the pool's current value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflict_with_the_pool_at_another_store_is_settled_on_both_sides() {
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let promotion = "[condensation]\nevery_events = 50\nmin_events = 3\n\
                     [promotion]\nmin_importance = 6\nmin_utility = 0.6\nmin_successes = 1\n";
    let updates = "mode = \"rules\"\nscope = \"session\"";
    let home = open_spread(dirs[0].path(), promotion, updates, Some(2), None);
    let spread = crate::scatter::Others {
        parts: vec![home.clone()],
        home: Some(home.clone()),
    };
    let a = open_spread(dirs[1].path(), promotion, updates, Some(0), Some(spread));
    let t0 = 1_770_000_000_000;
    let c1 = proven_lesson(
        &a,
        "a",
        t0,
        "the deploy runner for production moved to eu-2",
    )
    .await;
    let Promotion::Created { knowledge: k1, .. } = a.promote("acme", c1, "kg").await.unwrap()
    else {
        panic!("the first lesson is created at the home");
    };
    assert!(home.store().id_block().contains(k1.0));
    let c3 = proven_lesson(
        &a,
        "c",
        t0,
        "the deploy runner for production moved to eu-3",
    )
    .await;
    let held = a.promote("acme", c3, "kg").await.unwrap();
    assert!(
        matches!(&held, Promotion::Held { against, .. } if against == &vec![k1]),
        "{held:?}"
    );
    // Open on both sides, each in its own store.
    assert_eq!(a.store().validity(c3).unwrap().conflicts, vec![k1]);
    assert_eq!(home.store().validity(k1).unwrap().conflicts, vec![c3]);
    // Kept by hand where the candidate lives: the home's side follows.
    a.resolve("acme", c3, Resolution::Keep, Some("eu-3 is right"), "ops")
        .unwrap();
    assert!(a.store().validity(c3).unwrap().conflicts.is_empty());
    let v1 = home.store().validity(k1).unwrap();
    assert!(v1.conflicts.is_empty());
    assert_eq!(v1.superseded_by, Some(c3));
    assert!(
        home.history("acme", k1)
            .unwrap()
            .iter()
            .any(|e| e.action == AuditAction::Resolved && e.detail.contains("eu-3 is right")),
        "the home's side says who settled it and why"
    );
    // Settled, it is promoted, and its knowledge takes the old lesson's place.
    let after = a.promote("acme", c3, "kg").await.unwrap();
    let Promotion::Created { knowledge: k3, .. } = after else {
        panic!("settled, it is promoted: {after:?}");
    };
    assert_eq!(home.store().validity(k1).unwrap().superseded_by, Some(k3));
    for s in [a, home] {
        s.close().unwrap();
    }
}

/// Placed by session, the insights and the census of a namespace asked of one of its
/// stores are gathered from every part: the same lists (supersessions and contradictions
/// found within sessions, retired records, recall counts, feedback, fading records) and
/// the same figures as one store holding every record. Ids differ between the two sides
/// (each store hands out its own), so lists are compared by text, whole, and then cut to a
/// few entries by the keys they are ranked by.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_insights_of_a_namespace_spread_by_session_are_one_stores() {
    let dirs: Vec<_> = (0..4).map(|_| tempfile::tempdir().unwrap()).collect();
    let updates = "mode = \"rules\"\nscope = \"session\"";
    let whole = open_with_updates(dirs[0].path(), updates);
    let others: Vec<Substrate> = (1..3u16)
        .map(|p| open_spread(dirs[p as usize + 1].path(), "", updates, Some(p), None))
        .collect();
    let spread = crate::scatter::Others {
        parts: others.clone(),
        home: None,
    };
    let here = open_spread(dirs[1].path(), "", updates, Some(0), Some(spread));
    let parts = [here.clone(), others[0].clone(), others[1].clone()];
    let holder = |id: MemoryId| {
        parts
            .iter()
            .find(|p| p.store().id_block().contains(id.0))
            .unwrap()
    };
    let t0 = 1_770_000_000_000;
    // Pairs of the labelled set, each in a session of its own (six sessions, two per
    // store), the older statement an hour before the newer.
    let chosen: Vec<Pair> = pairs().into_iter().take(36).collect();
    let mut ids: Vec<(MemoryId, MemoryId)> = Vec::new();
    for (i, p) in chosen.iter().enumerate() {
        let session = format!("s{}", i % 6);
        let at = t0 + i as i64 * DAY;
        let part = &parts[i % 6 % 3];
        for (text, at) in [(&p.older, at), (&p.newer, at + 3_600_000)] {
            let w = write(&whole, &session, at, text).await;
            let s = write(part, &session, at, text).await;
            ids.push((w, s));
        }
    }
    let round = settle(&whole).await;
    for p in &parts {
        settle(p).await;
    }
    assert!(
        round.superseded > 0 && round.contradicted > 0,
        "the pairs found something of each: {round:?}"
    );
    // Recalls on both sides (the same queries), feedback on some of them.
    for (q, p) in chosen.iter().enumerate().take(12) {
        let req = RecallRequest {
            scope: Scope::Namespace,
            reinforce: false,
            k: 6,
            ..RecallRequest::new("acme", "asker", &p.newer)
        };
        for side in [&whole, &here] {
            let r = side.recall(&req).await.unwrap();
            if q % 3 != 2 {
                let outcome = [Outcome::Success, Outcome::Failure][q % 3];
                let target = FeedbackTarget::Recall(r.recall_id.clone().unwrap());
                side.feedback("acme", &target, outcome, "asker")
                    .await
                    .unwrap();
            }
        }
    }
    // Records retired by hand, and one pinned (never fading).
    for (n, status) in [
        (3, shadowbrain_runtime::Status::Wrong),
        (10, shadowbrain_runtime::Status::Archived),
        (17, shadowbrain_runtime::Status::Obsolete),
        (24, shadowbrain_runtime::Status::Pinned),
    ] {
        let (w, s) = ids[n];
        whole.set_status("acme", w, status, "ops").unwrap();
        holder(s).set_status("acme", s, status, "ops").unwrap();
    }
    for p in &parts {
        p.store().sync().await.unwrap();
    }
    whole.store().sync().await.unwrap();

    assert_eq!(
        here.census("acme").await.unwrap(),
        whole.census("acme").await.unwrap()
    );
    assert_eq!(here.census("acme").await.unwrap().sessions, 6);
    let now = t0 + 40 * DAY;
    let text_in = |subs: &[&Substrate], id: MemoryId| -> String {
        subs.iter()
            .find_map(|s| s.get("acme", id).ok())
            .unwrap()
            .text
    };
    let spread_subs: Vec<&Substrate> = parts.iter().collect();
    let whole_subs = [&whole];
    // Everything each list holds, by text: the same on both sides.
    let everything = |i: &shadowbrain_runtime::Insights, subs: &[&Substrate]| {
        let mut recalled: Vec<(String, u64)> = (i.most_recalled.iter())
            .map(|c| (c.record.text.clone(), c.times))
            .collect();
        let mut in_success: Vec<(String, u64)> = (i.in_successful_recalls.iter())
            .map(|c| (c.record.text.clone(), c.times))
            .collect();
        let mut useful: Vec<(String, u32, u32)> = (i.most_useful.iter())
            .map(|r| (r.text.clone(), r.utility.successes, r.utility.failures))
            .collect();
        let mut fading: Vec<(String, i64, i64)> = (i.fading.iter())
            .map(|f| {
                let s = (f.strength_now * 1e4).round() as i64;
                (f.record.text.clone(), s, f.archive_at)
            })
            .collect();
        let mut retired: Vec<(String, String)> = (i.retired.iter())
            .map(|r| (r.text.clone(), format!("{:?}", r.status)))
            .collect();
        let mut superseded: Vec<(String, String)> = (i.superseded.iter())
            .map(|s| (s.record.text.clone(), text_in(subs, s.by)))
            .collect();
        let mut conflicts: Vec<(String, Vec<String>)> = (i.conflicts.iter())
            .map(|(r, with)| {
                let with = with.iter().map(|id| text_in(subs, *id)).collect();
                (r.text.clone(), with)
            })
            .collect();
        recalled.sort();
        in_success.sort();
        useful.sort();
        fading.sort();
        retired.sort();
        superseded.sort();
        conflicts.sort();
        (
            (recalled, in_success, useful),
            (fading, retired, superseded, conflicts),
            (i.records, i.recalls),
        )
    };
    let one = whole.insights("acme", now, 1000).await.unwrap();
    let spread = here.insights("acme", now, 1000).await.unwrap();
    assert_eq!(
        everything(&spread, &spread_subs),
        everything(&one, &whole_subs)
    );
    assert_eq!((one.records, one.recalls), (72, 12));
    for (what, n) in [
        ("recalled", one.most_recalled.len()),
        ("useful", one.most_useful.len()),
        ("in successful recalls", one.in_successful_recalls.len()),
        ("fading", one.fading.len()),
        ("retired", one.retired.len()),
        ("superseded", one.superseded.len()),
        ("conflicts", one.conflicts.len()),
    ] {
        assert!(
            n > 0,
            "no {what} record: the comparison would prove nothing"
        );
    }
    // Records of every store in the spread answer.
    let from: std::collections::HashSet<_> = (spread.most_recalled.iter())
        .map(|c| holder(c.record.id).store().id_block().first)
        .collect();
    assert_eq!(from.len(), 3, "the recalls returned records of every store");
    // Cut to three entries each: the same ranking keys, in order.
    let keys = |i: &shadowbrain_runtime::Insights| {
        (
            i.most_recalled.iter().map(|c| c.times).collect::<Vec<_>>(),
            i.in_successful_recalls
                .iter()
                .map(|c| c.times)
                .collect::<Vec<_>>(),
            (i.most_useful.iter())
                .map(|r| (r.utility.successes, r.utility.failures))
                .collect::<Vec<_>>(),
            // Ties (the same strength) are broken by id, which differ between the sides.
            (i.fading.iter())
                .map(|f| (f.archive_at, (f.strength_now * 1e4).round() as i64))
                .collect::<Vec<_>>(),
            (i.retired.iter()).map(|r| r.status_at).collect::<Vec<_>>(),
            (i.superseded.len(), i.conflicts.len()),
        )
    };
    let one = whole.insights("acme", now, 3).await.unwrap();
    let spread = here.insights("acme", now, 3).await.unwrap();
    assert_eq!(keys(&spread), keys(&one));
    whole.close().unwrap();
    for p in parts {
        p.close().unwrap();
    }
}

/// The parts of a namespace spread by session, each reaching every other as the cluster
/// does (the asks as bytes) — and every ask delivered twice, as a link that retries an
/// unanswered ask may: the second delivery's answer is the one returned.
#[derive(Debug)]
struct Ring {
    parts: Arc<std::sync::OnceLock<Vec<Substrate>>>,
    me: usize,
}

#[derive(Debug)]
struct Twice(Substrate);

impl PartLink for Twice {
    fn ids(&self) -> shadowbrain_runtime::IdBlock {
        self.0.store().id_block()
    }

    fn ask(&self, ask: Vec<u8>, _repeatable: bool) -> PartFuture<'_> {
        Box::pin(async move {
            self.0.answer_part(ask.clone()).await;
            Ok(self.0.answer_part(ask).await)
        })
    }
}

impl Spread for Ring {
    fn others(&self, _namespace: &str) -> Vec<Arc<dyn PartLink>> {
        let parts = self.parts.get().expect("every part is open");
        (0..parts.len())
            .filter(|&i| i != self.me)
            .map(|i| Arc::new(Twice(parts[i].clone())) as Arc<dyn PartLink>)
            .collect()
    }

    fn home(&self, _namespace: &str) -> Option<Arc<dyn PartLink>> {
        None
    }
}

/// `n` stores as partitions of a namespace spread by session, each with the others as its
/// spread, on `clock`.
fn ring(
    dirs: &[tempfile::TempDir],
    updates: &str,
    embedder: &(Arc<dyn Embedder>, f32),
    clock: &Arc<VirtualClock>,
) -> Vec<Substrate> {
    let all = Arc::new(std::sync::OnceLock::new());
    let parts: Vec<Substrate> = dirs
        .iter()
        .enumerate()
        .map(|(me, dir)| {
            let spread = Ring {
                parts: Arc::clone(&all),
                me,
            };
            open_part(
                dir.path(),
                "",
                updates,
                embedder.clone(),
                Some(me as u16),
                Some(Arc::new(spread)),
                Arc::clone(clock),
            )
        })
        .collect();
    all.set(parts.clone()).unwrap();
    parts
}

/// What detection wrote about a record, in words: what supersedes it, what it is in
/// conflict with and what it repeats (by text), and its audit's update entries (actions).
fn found(
    parts: &[&Substrate],
    id: MemoryId,
) -> (Option<String>, Vec<String>, Option<String>, Vec<String>) {
    let holder = |id: MemoryId| {
        *parts
            .iter()
            .find(|p| p.store().id_block().contains(id.0))
            .unwrap()
    };
    let text = |id: MemoryId| holder(id).store().get(id).unwrap().unwrap().text;
    let at = holder(id);
    let v = at.store().validity(id).unwrap();
    let mut conflicts: Vec<String> = v.conflicts.iter().map(|&c| text(c)).collect();
    conflicts.sort();
    let audit = at
        .history("acme", id)
        .unwrap()
        .into_iter()
        .filter(|e| e.by.starts_with("updates:"))
        .map(|e| format!("{:?}", e.action))
        .collect();
    (
        v.superseded_by.map(text),
        conflicts,
        v.duplicate_of.map(text),
        audit,
    )
}

/// Update detection over a namespace spread by session (`[updates] scope = "namespace"`,
/// three stores each asking the others, every ask delivered twice) finds what one store
/// holding every record finds: the labelled pairs, some with both statements in one store
/// and most across two, each record superseded, in conflict or repeated as in the one
/// store, audited once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn update_detection_across_parts_finds_what_one_store_finds() {
    let dirs: Vec<_> = (0..4).map(|_| tempfile::tempdir().unwrap()).collect();
    let updates = "mode = \"rules\"\nscope = \"namespace\"";
    let embedder = embedder();
    let clock = Arc::new(VirtualClock::new(1_780_000_000_000));
    let whole = open_part(
        dirs[0].path(),
        "",
        updates,
        embedder.clone(),
        None,
        None,
        Arc::clone(&clock),
    );
    let parts = ring(&dirs[1..], updates, &embedder, &clock);
    let t0 = 1_770_000_000_000;
    let chosen: Vec<Pair> = pairs().into_iter().take(60).collect();
    let mut ids: Vec<(MemoryId, MemoryId)> = Vec::new();
    let (mut one, mut spread) = (UpdatesRound::default(), UpdatesRound::default());
    let add = |total: &mut UpdatesRound, r: UpdatesRound| {
        total.compared += r.compared;
        total.superseded += r.superseded;
        total.contradicted += r.contradicted;
        total.repeated += r.repeated;
    };
    for (i, p) in chosen.iter().enumerate() {
        let at = t0 + i as i64 * DAY;
        // The older statement's part, and the newer's: one in three pairs in one part.
        let (po, pn) = (i % 3, (i + i / 3) % 3);
        for (text, at, part) in [(&p.older, at, po), (&p.newer, at + 3_600_000, pn)] {
            // Recorded one after the other on both sides, as they are written.
            clock.advance(std::time::Duration::from_millis(1));
            let session = format!("p{part}-{}", i % 2);
            let w = write(&whole, &session, at, text).await;
            let s = write(&parts[part], &session, at, text).await;
            ids.push((w, s));
            // Compared as it arrives, as a server's rounds do under a live load (and so in
            // the same order on both sides: a repeat's reinforcement of the older record
            // decides whether a later supersession of it is clear).
            add(&mut one, settle(&whole).await);
            let p = &parts[part];
            while p.enrich_pending(64).await.unwrap() > 0 {}
            let r = p.detect_all_updates().unwrap();
            assert_eq!(r.waiting, 0, "every record is embedded: {r:?}");
            add(&mut spread, r);
        }
    }
    // Nothing is left to compare anywhere.
    for p in &parts {
        assert_eq!(p.detect_all_updates().unwrap().compared, 0);
    }
    assert!(
        one.superseded > 0 && one.contradicted > 0 && one.repeated > 0,
        "the pairs found something of each: {one:?}"
    );
    assert_eq!(
        (
            spread.compared,
            spread.superseded,
            spread.contradicted,
            spread.repeated
        ),
        (one.compared, one.superseded, one.contradicted, one.repeated),
        "the same findings: spread {spread:?}, one store {one:?}"
    );
    let all: Vec<&Substrate> = parts.iter().collect();
    let mut across = 0;
    for (n, &(w, s)) in ids.iter().enumerate() {
        let (one, spread) = (found(&[&whole], w), found(&all, s));
        assert_eq!(
            spread,
            one,
            "statement {n}: {:?}",
            whole.store().get(w).unwrap().unwrap().text
        );
        let v = all
            .iter()
            .find(|p| p.store().id_block().contains(s.0))
            .unwrap()
            .store()
            .validity(s)
            .unwrap();
        let others = v
            .superseded_by
            .into_iter()
            .chain(v.conflicts)
            .chain(v.duplicate_of);
        let block = all
            .iter()
            .find(|p| p.store().id_block().contains(s.0))
            .unwrap()
            .store()
            .id_block();
        across += others.filter(|o| !block.contains(o.0)).count();
    }
    eprintln!("one store {one:?}; {across} findings across two parts");
    assert!(across >= 10, "findings across two parts: {across}");
}

/// An embedder that embeds in the background (as the local model does) with the hash
/// embedder's vectors: records wait in the enrichment queue until `enrich_pending`.
#[derive(Debug)]
struct Deferred(HashEmbedder);

#[async_trait::async_trait]
impl Embedder for Deferred {
    fn name(&self) -> &str {
        "deferred-hash"
    }

    fn dimensions(&self) -> usize {
        self.0.dimensions()
    }

    fn embeds_inline(&self) -> bool {
        false
    }

    fn is_semantic(&self) -> bool {
        false
    }

    async fn embed(&self, texts: &[String]) -> shadowbrain_runtime::Result<Vec<Vec<f32>>> {
        self.0.embed(texts).await
    }
}

/// A pair across two parts is decided by the record recorded later, which waits while the
/// other part has not embedded the older one yet; then it finds it, and the older
/// record's own round (which does not decide pairs with records recorded after it in
/// other parts) finds nothing twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_waits_for_an_older_one_another_part_has_not_embedded() {
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let updates = "mode = \"rules\"\nscope = \"namespace\"";
    let embedder: (Arc<dyn Embedder>, f32) =
        (Arc::new(Deferred(HashEmbedder::new(384).unwrap())), 0.2);
    let clock = Arc::new(VirtualClock::new(1_780_000_000_000));
    let parts = ring(&dirs, updates, &embedder, &clock);
    let (a, b) = (&parts[0], &parts[1]);
    let t0 = 1_770_000_000_000;
    let old = write(
        a,
        "ops-a",
        t0,
        "The deploy runner for production is in eu-1.",
    )
    .await;
    clock.advance(std::time::Duration::from_millis(1));
    let new = write(
        b,
        "ops-b",
        t0 + DAY,
        "The deploy runner for production is in eu-2 now.",
    )
    .await;
    // The newer is embedded, the older not yet: the newer waits for it.
    while b.enrich_pending(64).await.unwrap() > 0 {}
    let r = b.detect_all_updates().unwrap();
    assert_eq!((r.compared, r.waiting), (0, 1), "{r:?}");
    assert!(a.store().validity(old).unwrap().is_clear());
    // Once it is embedded, the older record's own round leaves the pair to the newer's.
    while a.enrich_pending(64).await.unwrap() > 0 {}
    let r = a.detect_all_updates().unwrap();
    assert_eq!((r.compared, r.superseded), (1, 0), "{r:?}");
    let r = b.detect_all_updates().unwrap();
    assert_eq!((r.compared, r.superseded, r.waiting), (1, 1, 0), "{r:?}");
    let v = a.store().validity(old).unwrap();
    assert_eq!(v.superseded_by, Some(new));
    assert_eq!(v.valid_until, Some(t0 + DAY));
    // Both sides audited, once each (every ask went twice), and the edge in both stores.
    for (sub, id, detail) in [
        (a, old, format!("superseded by {new} (")),
        (b, new, format!("supersedes {old} (")),
    ] {
        let entries: Vec<_> = sub
            .history("acme", id)
            .unwrap()
            .into_iter()
            .filter(|e| e.action == AuditAction::Superseded)
            .collect();
        assert_eq!(entries.len(), 1, "{entries:?}");
        assert!(entries[0].detail.starts_with(&detail), "{entries:?}");
        let edge = Edge {
            from: new,
            to: old,
            relation: Relation::Supersedes,
        };
        assert!(
            sub.store()
                .edges("acme", Some(new))
                .unwrap()
                .contains(&edge)
        );
    }
    // Recall through the spread ranks the newer value first and says the older is
    // superseded.
    let r = b
        .recall(&RecallRequest {
            scope: Scope::Namespace,
            reinforce: false,
            ..RecallRequest::new("acme", "asker", "where is the production deploy runner")
        })
        .await
        .unwrap();
    let order: Vec<MemoryId> = r.memories.iter().map(|m| m.record.id).collect();
    assert_eq!(order, vec![new, old], "{:?}", r.memories);
    // A third value, back in the first part: the chain of newer values is followed across
    // the parts.
    clock.advance(std::time::Duration::from_millis(1));
    let third = write(
        a,
        "ops-a",
        t0 + 2 * DAY,
        "The deploy runner for production is in eu-3 now.",
    )
    .await;
    while a.enrich_pending(64).await.unwrap() > 0 {}
    let r = a.detect_all_updates().unwrap();
    assert_eq!((r.compared, r.superseded), (1, 2), "{r:?}");
    assert_eq!(b.store().validity(new).unwrap().superseded_by, Some(third));
    assert_eq!(a.chain("acme", old).unwrap().newer, vec![new, third]);
    // Reinstated by hand where it is held, the older record is no longer superseded by
    // the other part's record, which says so.
    a.resolve(
        "acme",
        old,
        Resolution::Reinstate,
        Some("eu-1 still runs the canary"),
        "ops",
    )
    .unwrap();
    assert!(!a.store().validity(old).unwrap().superseded());
    let edge = Edge {
        from: new,
        to: old,
        relation: Relation::Supersedes,
    };
    assert!(!b.store().edges("acme", Some(new)).unwrap().contains(&edge));
    assert!(
        b.history("acme", new)
            .unwrap()
            .iter()
            .any(|e| e.action == AuditAction::Resolved
                && e.detail == format!("no longer supersedes {old}: eu-1 still runs the canary")),
        "{:?}",
        b.history("acme", new).unwrap()
    );
}

/// An LLM judge (a real OpenAI-compatible endpoint served by the test) decides pairs across
/// two parts as it decides them in one store: the other part's record is marked with the
/// judge's name, a repeat the rules would not see reinforces the older record there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_llm_judge_decides_pairs_across_parts() {
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let label = |older: &str, _newer: &str| match older.contains("lunch") {
        true => "duplicate",
        false => "supersedes",
    };
    let down = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (llm, endpoint) = scripted_model(label, down, 0).await;
    let judge = LlmUpdateJudge::new(llm, 24, 1000);
    let clock = Arc::new(VirtualClock::new(1_780_000_000_000));
    let updates = "mode = \"llm\"\nscope = \"namespace\"";
    let parts = ring(&dirs, updates, &embedder(), &clock);
    let (a, b) = (&parts[0], &parts[1]);
    for p in &parts {
        p.attach_update_judge();
    }
    let t0 = 1_770_000_000_000;
    let old = write(
        a,
        "ops-a",
        t0,
        "The deploy runner for production is in eu-1.",
    )
    .await;
    clock.advance(std::time::Duration::from_millis(1));
    let lunch = write(a, "ops-a", t0 + 1, "The team lunch is at noon on Fridays.").await;
    clock.advance(std::time::Duration::from_millis(1));
    let new = write(
        b,
        "ops-b",
        t0 + DAY,
        "The deploy runner for production moved to eu-2.",
    )
    .await;
    clock.advance(std::time::Duration::from_millis(1));
    let again = write(b, "ops-b", t0 + DAY + 1, "Friday team lunch: 12:00.").await;
    for p in &parts {
        while p.enrich_pending(64).await.unwrap() > 0 {}
    }
    // The older part's records, recorded first, leave their pairs to the newer part.
    let round = a.detect_all_updates_with(&judge).await.unwrap();
    assert_eq!((round.compared, round.judged), (2, 0), "{round:?}");
    let round = b.detect_all_updates_with(&judge).await.unwrap();
    assert_eq!(round.compared, 2, "{round:?}");
    assert!(
        round.superseded >= 1 && round.fell_back == 0 && round.judged >= 1,
        "{round:?}"
    );
    assert!(endpoint.requests() >= 1);
    assert_eq!(a.store().validity(old).unwrap().superseded_by, Some(new));
    let entry = a
        .history("acme", old)
        .unwrap()
        .into_iter()
        .find(|e| e.action == AuditAction::Superseded)
        .unwrap();
    assert_eq!(entry.by, "updates:llm:scripted");
    assert!(
        entry.detail.starts_with(&format!("superseded by {new} (")),
        "{entry:?}"
    );
    // The lunch pair, which the rules take for unrelated: a repeat marked where the newer
    // is, the older reinforced and audited where it is.
    assert_eq!(
        b.store().validity(again).unwrap().duplicate_of,
        Some(lunch),
        "{round:?}"
    );
    assert_eq!(round.repeated, 1, "{round:?}");
    let record = a.store().get(lunch).unwrap().unwrap();
    assert_eq!(record.reinforcements, 1);
    assert!(
        a.history("acme", lunch).unwrap().iter().any(|e| {
            e.action == AuditAction::Repeated
                && e.by == "updates:llm:scripted"
                && e.detail.starts_with(&format!("repeated by {again} ("))
        }),
        "{:?}",
        a.history("acme", lunch).unwrap()
    );
}
