//! The actor runtime end to end, on a real LMDB store in a temp dir: ordering under
//! concurrency, passivation and revival, supervision, shutdown and reopen, bad input.

use std::sync::Arc;
use std::time::{Duration, Instant};

use shadowbrain_actors::{Fault, Runtime, RuntimeConfig};
use shadowbrain_runtime::{Error, NewMemory};

fn event(text: &str) -> NewMemory {
    NewMemory {
        kind: "observation".into(),
        text: Some(text.into()),
        ..NewMemory::default()
    }
}

fn config(dir: &tempfile::TempDir) -> RuntimeConfig {
    let mut config = RuntimeConfig::new(dir.path());
    config.call_timeout = Duration::from_secs(60);
    config
}

/// Polls `cond` until it holds or `deadline` passes.
async fn eventually<F, Fut>(what: &str, deadline: Duration, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !cond().await {
        assert!(start.elapsed() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_sessions_keep_their_order_and_exact_counts() {
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::open(config(&dir)).await.unwrap();
    let sessions = 10_000;
    let mut tasks = tokio::task::JoinSet::new();
    for s in 0..sessions {
        let session = rt.session("default", &format!("s{s:05}")).unwrap();
        tasks.spawn(async move {
            // A batch, then a single event: ids follow the order the actor acknowledged
            // them in, while 10,000 sessions write at once through one group commit.
            let batch = session
                .record_batch(vec![
                    event(&format!("{s} first")),
                    event(&format!("{s} second")),
                ])
                .await
                .unwrap();
            let third = session.record(event(&format!("{s} third"))).await.unwrap();
            assert!(batch[0] < batch[1] && batch[1] < third);
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
    assert_eq!(rt.substrate().store().len(), 3 * sessions as u64);
    for s in (0..sessions).step_by(97) {
        let timeline = rt
            .session("default", &format!("s{s:05}"))
            .unwrap()
            .timeline(10)
            .await
            .unwrap();
        let texts: Vec<&str> = timeline.iter().map(|r| r.text.as_str()).collect();
        let (a, b, c) = (
            format!("{s} third"),
            format!("{s} second"),
            format!("{s} first"),
        );
        assert_eq!(
            texts,
            vec![a.as_str(), b.as_str(), c.as_str()],
            "session {s}"
        );
    }
    rt.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_session_actors_stop_and_come_back_with_their_state() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(&dir);
    config.session_idle = Duration::from_millis(100);
    let rt = Runtime::open(config).await.unwrap();
    let session = rt.session("default", "passivated").unwrap();
    session.record(event("before the nap")).await.unwrap();
    assert_eq!(rt.live_sessions().await.unwrap(), 1);
    eventually(
        "the idle actor to stop",
        Duration::from_secs(10),
        || async { rt.live_sessions().await.unwrap() == 0 },
    )
    .await;
    // Revival: the next request spawns a new actor, which finds everything in the store.
    session.record(event("after the nap")).await.unwrap();
    assert_eq!(rt.live_sessions().await.unwrap(), 1);
    let texts: Vec<String> = session
        .timeline(10)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.text)
        .collect();
    assert_eq!(texts, vec!["after the nap", "before the nap"]);
    let recalled = session.recall("nap").await.unwrap();
    assert_eq!(recalled.memories.len(), 2);
    rt.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_session_actor_is_replaced_and_nothing_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::open(config(&dir)).await.unwrap();
    let session = rt.session("default", "fragile").unwrap();
    let first = session
        .record(event("written before the fault"))
        .await
        .unwrap();
    rt.inject_panic(Fault::Session("default".into(), "fragile".into()))
        .await
        .unwrap();
    eventually(
        "the failed actor to be forgotten",
        Duration::from_secs(10),
        || async { rt.live_sessions().await.unwrap() == 0 },
    )
    .await;
    let second = session
        .record(event("written after the fault"))
        .await
        .unwrap();
    assert!(second > first);
    assert_eq!(session.timeline(10).await.unwrap().len(), 2);
    rt.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_session_supervisor_is_restarted_by_the_root() {
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::open(config(&dir)).await.unwrap();
    let session = rt.session("default", "survivor").unwrap();
    session
        .record(event("kept through a restart"))
        .await
        .unwrap();
    assert_eq!(rt.restarts().await.unwrap(), 0);
    rt.inject_panic(Fault::SessionSupervisor).await.unwrap();
    eventually(
        "the root to restart its child",
        Duration::from_secs(10),
        || async { rt.restarts().await.unwrap() == 1 },
    )
    .await;
    // The old session actor died with its supervisor; a request gets a new one.
    session
        .record(event("written to the new tree"))
        .await
        .unwrap();
    assert_eq!(session.timeline(10).await.unwrap().len(), 2);
    assert_eq!(rt.live_sessions().await.unwrap(), 1);
    rt.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_then_reopen_shows_everything() {
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::open(config(&dir)).await.unwrap();
    let mut ids = Vec::new();
    for s in 0..20 {
        let session = rt.session("team", &format!("agent-{s}")).unwrap();
        ids.push(
            session
                .record(event(&format!("lesson {s}: retry with backoff")))
                .await
                .unwrap(),
        );
    }
    rt.shutdown().await.unwrap();
    let closed = rt.session("team", "agent-0").unwrap().timeline(1).await;
    assert!(closed.is_err(), "a shut-down runtime must refuse requests");
    drop(rt);

    let rt = Runtime::open(config(&dir)).await.unwrap();
    assert_eq!(rt.substrate().store().len(), 20);
    let session = rt.session("team", "agent-7").unwrap();
    let recalled = session.recall("backoff lesson").await.unwrap();
    assert_eq!(recalled.memories[0].record.id, ids[7]);
    rt.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_a_clear_error_and_the_session_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::open(config(&dir)).await.unwrap();
    let err = rt.session("default", "no spaces allowed").unwrap_err();
    assert!(
        matches!(err, Error::Invalid { ref field, .. } if field == "session_id"),
        "{err}"
    );
    let session = rt.session("default", "careful").unwrap();
    let empty = NewMemory {
        kind: "observation".into(),
        text: Some("   ".into()),
        ..NewMemory::default()
    };
    let err = session
        .record_batch(vec![event("fine"), empty])
        .await
        .unwrap_err();
    assert!(err.to_string().contains("text"), "{err}");
    // The batch was rejected whole, and the actor still serves.
    assert_eq!(session.timeline(10).await.unwrap().len(), 0);
    session.record(event("fine now")).await.unwrap();
    assert_eq!(session.timeline(10).await.unwrap().len(), 1);
    rt.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_condenser_decay_knowledge_and_evaluator_actors_are_restarted_and_keep_working() {
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::open(config(&dir)).await.unwrap();
    let session = rt.session("default", "busy").unwrap();
    for i in 0..6 {
        session
            .record(event(&format!("deploy step {i} done")))
            .await
            .unwrap();
    }
    rt.inject_panic(Fault::Condenser).await.unwrap();
    rt.inject_panic(Fault::Decay).await.unwrap();
    rt.inject_panic(Fault::Knowledge).await.unwrap();
    rt.inject_panic(Fault::Evaluator).await.unwrap();
    eventually("four restarts", Duration::from_secs(10), || async {
        rt.restarts().await.unwrap() == 4
    })
    .await;
    assert_eq!(rt.evaluate_now().await.unwrap().judged, 0);
    let condensed = session
        .condense()
        .await
        .unwrap()
        .expect("six events, min_events 5");
    assert_eq!(condensed.sources.len(), 6);
    assert_eq!(rt.decay_now().await.unwrap().examined, 7);
    let (nodes, _) = rt
        .knowledge("default")
        .unwrap()
        .graph(condensed.id, 1)
        .await
        .unwrap();
    assert_eq!(nodes, vec![condensed.id]);
    rt.shutdown().await.unwrap();
}

/// Everything a run leaves behind that a person would compare: text, tier, status,
/// strength (rounded) and sources of every record, in id order.
fn digest(rt: &Runtime) -> Vec<String> {
    let store = rt.substrate().store();
    let mut ids = Vec::new();
    store
        .for_each_id(|id| {
            ids.push(id);
            Ok(shadowbrain_runtime::internals::Visit::Continue)
        })
        .unwrap();
    ids.into_iter()
        .filter_map(|id| store.get_light(id).unwrap())
        .map(|r| {
            format!(
                "{} {:?} {} {:.4} {:?} {}",
                r.id,
                r.tier,
                r.status.as_str(),
                r.strength,
                r.sources,
                r.text
            )
        })
        .collect()
}

/// The whole life of a lesson on the virtual clock: recorded, condensed by the policy's
/// `every_events` trigger, recalled, proven by feedback, promoted into the knowledge pool,
/// recalled by another agent's session; then 60 simulated days pass and a sweep archives
/// what the policy says.
async fn simulated_run(dir: &tempfile::TempDir) -> Vec<String> {
    use shadowbrain_runtime::policy::Policy;
    use shadowbrain_runtime::{DAY_MS, FeedbackTarget, Outcome, Tier, VirtualClock};
    let clock = Arc::new(VirtualClock::new(1_780_000_000_000));
    let mut config = config(dir);
    config.substrate.clock = clock.clone();
    config.substrate.policy = Policy::from_toml(
        "<test>",
        "[condensation]\nevery_events = 8\nmin_events = 4\nmax_age = \"never\"\n\
         [forgetting]\nhalf_life = \"10d\"\narchive_below = 0.05\nprotect_kinds = [\"goal\"]\n\
         [promotion]\nmin_importance = 6\nmin_utility = 0.6\nmin_successes = 1\n",
    )
    .unwrap();
    // Exact replays: sweeps only when asked.
    config.decay_check = None;
    let rt = Runtime::open(config).await.unwrap();
    let session = rt.session("sim", "agent-1").unwrap();
    session
        .record(NewMemory::new(
            "goal",
            "keep the payment service under 1% errors",
        ))
        .await
        .unwrap();
    for i in 0..7 {
        clock.advance(Duration::from_secs(600));
        let event = if i % 2 == 0 {
            NewMemory {
                importance: Some(8.0),
                ..event(&format!(
                    "payment gateway timeouts fixed by retrying with backoff, try {i}"
                ))
            }
        } else {
            event(&format!("unrelated chatter number {i}"))
        };
        session.record(event).await.unwrap();
    }
    let tier_count = |tier: Tier| {
        let store = rt.substrate().store();
        let mut n = 0;
        store
            .for_each_id(|id| {
                if store.get_light(id)?.is_some_and(|r| r.tier == tier) {
                    n += 1;
                }
                Ok(shadowbrain_runtime::internals::Visit::Continue)
            })
            .unwrap();
        n
    };
    eventually(
        "the trigger to condense the session",
        Duration::from_secs(10),
        || async { tier_count(Tier::Condensed) == 1 },
    )
    .await;

    let recalled = session
        .recall("payment gateway timeouts retry")
        .await
        .unwrap();
    assert!(
        recalled
            .memories
            .iter()
            .any(|m| m.record.tier == Tier::Condensed),
        "{}",
        recalled.context
    );
    let report = session
        .feedback(
            FeedbackTarget::Recall(recalled.recall_id.unwrap()),
            Outcome::Success,
        )
        .await
        .unwrap();
    assert_eq!(report.promotable.len(), 1);
    eventually("the promotion", Duration::from_secs(10), || async {
        tier_count(Tier::Knowledge) == 1
    })
    .await;

    // Another agent's session, which never saw any of it, gets the lesson.
    let other = rt.session("sim", "agent-2").unwrap();
    let recalled = other
        .recall("how do I handle payment gateway timeouts?")
        .await
        .unwrap();
    assert_eq!(
        recalled.memories[0].record.tier,
        Tier::Knowledge,
        "{}",
        recalled.context
    );
    let found = rt
        .knowledge("sim")
        .unwrap()
        .search("payment gateway", 5)
        .await
        .unwrap();
    assert_eq!(found.memories.len(), 1);

    clock.advance(Duration::from_millis(60 * DAY_MS as u64));
    let report = rt.decay_now().await.unwrap();
    // Six half-lives: every active record but the protected goal falls under 0.05 — the
    // seven observations, the condensed record and the knowledge.
    assert_eq!(report.archived, 9, "{report:?}");
    let out = digest(&rt);
    rt.shutdown().await.unwrap();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn end_to_end_on_the_virtual_clock_and_replays_identically() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let first = simulated_run(&a).await;
    let second = simulated_run(&b).await;
    assert_eq!(
        first, second,
        "the same run twice must leave the same records"
    );
    let condensed: Vec<&String> = first.iter().filter(|l| l.contains(" Condensed ")).collect();
    assert_eq!(condensed.len(), 1);
    assert!(condensed[0].contains("payment gateway"), "{}", condensed[0]);
    assert!(
        first
            .iter()
            .any(|l| l.contains(" Episodic active ") && l.contains("keep the payment"))
    );
    assert_eq!(first.iter().filter(|l| l.contains(" archived ")).count(), 9);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decay_sweeps_by_itself_when_an_interval_of_runtime_time_passes() {
    use shadowbrain_runtime::{AuditAction, VirtualClock};
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(VirtualClock::new(1_780_000_000_000));
    let mut config = config(&dir);
    config.substrate.clock = clock.clone();
    config.decay_check = Some(Duration::from_millis(20));
    let rt = Runtime::open(config).await.unwrap();
    let session = rt.session("default", "slow").unwrap();
    let id = session.record(event("a fading thought")).await.unwrap();
    // Real time passes, runtime time does not: no sweep.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let decayed = || {
        rt.substrate()
            .history("default", id)
            .unwrap()
            .iter()
            .any(|e| e.action == AuditAction::Decayed)
    };
    assert!(!decayed());
    // Ten simulated days (the default interval is 1h, half-life 30d): the ticker sweeps.
    clock.advance(Duration::from_secs(10 * 86_400));
    eventually("a sweep", Duration::from_secs(10), || async { decayed() }).await;
    rt.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_indexer_actor_builds_the_indexes_and_resumes_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::open(config(&dir)).await.unwrap();
    let session = rt.session("default", "indexed").unwrap();
    session
        .record(event("the first batch of notes"))
        .await
        .unwrap();
    let built = || async {
        let sub = rt.substrate();
        sub.indexes_caught_up().unwrap() && sub.vectors().watermark().unwrap() > 0
    };
    eventually("the first build", Duration::from_secs(20), built).await;
    let first = rt.substrate().vectors().watermark().unwrap();

    rt.inject_panic(Fault::Indexer).await.unwrap();
    eventually("the restart", Duration::from_secs(10), || async {
        rt.restarts().await.unwrap() == 1
    })
    .await;
    session
        .record(event("written after the restart"))
        .await
        .unwrap();
    eventually(
        "a build by the new indexer",
        Duration::from_secs(20),
        || async {
            rt.substrate().indexes_caught_up().unwrap()
                && rt.substrate().vectors().watermark().unwrap() > first
        },
    )
    .await;
    rt.shutdown().await.unwrap();
}

// ----- evaluation, poison input, the record/policy/session handles ----------------------

use shadowbrain_runtime::embed::Embedder;
use shadowbrain_runtime::embed::HashEmbedder;
use shadowbrain_runtime::policy::Policy;
use shadowbrain_runtime::{AuditAction, Judge, JudgeBatch, Judgement, Status, Verdict};
use std::sync::atomic::{AtomicUsize, Ordering};

/// A judge scripted by the text it sees: `nonsense` gets an impossible score, `POISON`
/// makes it panic (while `panics_left` lasts), everything else gets 8.5.
#[derive(Debug, Default)]
struct ScriptedJudge {
    calls: AtomicUsize,
    panics_left: AtomicUsize,
}

#[async_trait::async_trait]
impl Judge for ScriptedJudge {
    fn name(&self) -> &str {
        "scripted-judge"
    }

    async fn judge(&self, batch: JudgeBatch<'_>) -> shadowbrain_runtime::Result<Vec<Verdict>> {
        let items = batch.items;
        self.calls.fetch_add(1, Ordering::SeqCst);
        if items.iter().any(|i| i.text.contains("POISON"))
            && self
                .panics_left
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
        {
            panic!("the judge choked on a POISON record");
        }
        Ok(items
            .iter()
            .map(|i| {
                Ok(Judgement {
                    importance: if i.text.contains("nonsense") {
                        f32::NAN
                    } else {
                        8.5
                    },
                    reason: format!("looked at {}", i.id),
                })
            })
            .collect())
    }
}

fn judged_config(
    dir: &tempfile::TempDir,
    mode: &str,
    judge: Option<Arc<ScriptedJudge>>,
) -> RuntimeConfig {
    let mut config = config(dir);
    config.substrate.policy = Policy::from_toml(
        "<test>",
        &format!(
            "[evaluation]\nmode = \"{mode}\"\ndefault_importance = 3\n\
             [[evaluation.rules]]\nkinds = [\"goal\"]\nimportance = 9\n"
        ),
    )
    .unwrap();
    config.evaluation_batch = 16;
    config.judge = judge.map(|j| j as Arc<dyn Judge>);
    config
}

fn has_audit(history: &[shadowbrain_runtime::AuditEntry], needle: &str) -> bool {
    history
        .iter()
        .any(|e| e.action == AuditAction::Scored && e.detail.contains(needle))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_evaluator_scores_with_the_judge_in_batches_and_falls_back_to_the_rules() {
    let dir = tempfile::tempdir().unwrap();
    let judge = Arc::new(ScriptedJudge::default());
    let rt = Runtime::open(judged_config(&dir, "llm", Some(judge.clone())))
        .await
        .unwrap();
    let session = rt.session("default", "judged").unwrap();
    let mut events: Vec<NewMemory> = (0..39).map(|i| event(&format!("note {i}"))).collect();
    events.push(event("utter nonsense"));
    let ids = session.record_batch(events).await.unwrap();
    // The write is acknowledged with the rules' provisional score.
    eventually("the queue to drain", Duration::from_secs(20), || async {
        rt.evaluate_now()
            .await
            .is_ok_and(|r| r.judged + r.kept_rules == 40)
    })
    .await;
    // 40 records queued in one commit, 16 per call: three calls.
    assert_eq!(judge.calls.load(Ordering::SeqCst), 3);
    let first = rt.memory("default", ids[0]).unwrap();
    assert_eq!(first.get().await.unwrap().importance, 8.5);
    let history = first.history().await.unwrap();
    assert!(
        has_audit(&history, "provisional, queued for the judge"),
        "{history:?}"
    );
    assert!(
        has_audit(&history, "(judge; was 3 by the rules)"),
        "{history:?}"
    );
    // An impossible score keeps the rules' one, and says why.
    let odd = rt.memory("default", ids[39]).unwrap();
    assert_eq!(odd.get().await.unwrap().importance, 3.0);
    assert!(has_audit(
        &odd.history().await.unwrap(),
        "kept from the rules: the judge's importance NaN"
    ));
    assert!(rt.substrate().evaluation_queue(10).unwrap().is_empty());
    rt.shutdown().await.unwrap();

    // Hybrid: only what no rule matched goes to the judge; without a judge, the rules'
    // score stays and the audit log says so.
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::open(judged_config(&dir, "hybrid", None))
        .await
        .unwrap();
    let session = rt.session("default", "hybrid").unwrap();
    let ids = session
        .record_batch(vec![
            NewMemory::new("goal", "ship the release"),
            event("the build is green"),
        ])
        .await
        .unwrap();
    eventually("the queue to drain", Duration::from_secs(20), || async {
        rt.evaluate_now().await.is_ok_and(|r| r.kept_rules == 1)
    })
    .await;
    let goal = rt
        .memory("default", ids[0])
        .unwrap()
        .history()
        .await
        .unwrap();
    assert!(!has_audit(&goal, "queued for the judge"), "{goal:?}");
    let plain = rt
        .memory("default", ids[1])
        .unwrap()
        .history()
        .await
        .unwrap();
    assert!(has_audit(&plain, "no judge is configured"), "{plain:?}");
    rt.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_that_keeps_crashing_the_judge_is_quarantined_and_the_rest_is_judged() {
    let dir = tempfile::tempdir().unwrap();
    let judge = Arc::new(ScriptedJudge::default());
    judge.panics_left.store(usize::MAX, Ordering::SeqCst);
    let rt = Runtime::open(judged_config(&dir, "llm", Some(judge.clone())))
        .await
        .unwrap();
    let session = rt.session("default", "poisoned").unwrap();
    let mut events: Vec<NewMemory> = (0..10).map(|i| event(&format!("fine {i}"))).collect();
    events.insert(4, event("a POISON pill"));
    let ids = session.record_batch(events).await.unwrap();
    eventually(
        "the poison to be quarantined",
        Duration::from_secs(30),
        || async { rt.quarantined(Some("default")).await.unwrap().len() == 1 },
    )
    .await;
    eventually("the queue to drain", Duration::from_secs(20), || async {
        rt.substrate().evaluation_queue(10).unwrap().is_empty()
    })
    .await;
    let entry = &rt.quarantined(None).await.unwrap()[0];
    assert_eq!(entry.id, ids[4]);
    assert_eq!(entry.actor, "evaluator");
    assert!(
        entry.error.contains("choked on a POISON record"),
        "{entry:?}"
    );
    // The batch failed once, then the poison alone twice more: three restarts.
    assert!(rt.restarts().await.unwrap() >= 3);
    // The poison record is kept, with the rules' score and the reason in its history.
    let poison = rt.memory("default", ids[4]).unwrap();
    assert_eq!(poison.get().await.unwrap().importance, 3.0);
    let history = poison.history().await.unwrap();
    assert!(
        history
            .iter()
            .any(|e| e.action == AuditAction::Quarantined && e.detail.contains("POISON")),
        "{history:?}"
    );
    // Its neighbours in the failed batch were judged after the restart.
    for (i, id) in ids.iter().enumerate().filter(|(i, _)| *i != 4) {
        let r = rt.memory("default", *id).unwrap().get().await.unwrap();
        assert_eq!(r.importance, 8.5, "record {i}");
        assert!(rt.substrate().strikes(*id).unwrap().is_none());
    }
    // And the runtime keeps serving.
    session.record(event("after the poison")).await.unwrap();
    assert!(!session.recall("fine").await.unwrap().memories.is_empty());
    rt.shutdown().await.unwrap();
}

/// The default embedder, except that it panics on text containing `POISON` — a buggy
/// embedder plugin.
#[derive(Debug, Default)]
struct PanickyEmbedder(HashEmbedder);

#[async_trait::async_trait]
impl Embedder for PanickyEmbedder {
    fn name(&self) -> &str {
        self.0.name()
    }
    fn dimensions(&self) -> usize {
        self.0.dimensions()
    }
    fn embeds_inline(&self) -> bool {
        true
    }
    async fn embed(&self, texts: &[String]) -> shadowbrain_runtime::Result<Vec<Vec<f32>>> {
        assert!(
            !texts.iter().any(|t| t.contains("POISON")),
            "the embedder cannot take this text"
        );
        self.0.embed(texts).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_that_crashes_the_session_actor_is_quarantined_with_its_input() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(&dir);
    config.substrate.embedder = Arc::new(PanickyEmbedder::default());
    let rt = Runtime::open(config).await.unwrap();
    let session = rt.session("default", "fragile").unwrap();
    let before = session.record(event("accepted before")).await.unwrap();
    let err = session.record(event("a POISON pill")).await.unwrap_err();
    let Error::Quarantined { id, message } = &err else {
        panic!("expected a quarantine, got {err:?}");
    };
    assert!(message.contains("cannot take this text"), "{err}");
    assert!(
        err.to_string()
            .contains("send it again once the fault is fixed")
    );
    let entries = rt.quarantined(Some("default")).await.unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].id.to_string(), *id);
    assert_eq!(entries[0].strikes, 3);
    assert_eq!(entries[0].session_id.as_deref(), Some("fragile"));
    let input = entries[0].input.clone().unwrap();
    assert!(input.contains("a POISON pill"), "{input}");
    let history = rt
        .memory("default", entries[0].id)
        .unwrap()
        .history()
        .await
        .unwrap();
    assert_eq!(history[0].action, AuditAction::Quarantined);
    // Another namespace does not see it.
    assert!(
        rt.memory("other", entries[0].id)
            .unwrap()
            .history()
            .await
            .is_err()
    );
    // The session keeps serving, and nothing accepted was lost.
    let after = session.record(event("accepted after")).await.unwrap();
    assert!(after > before);
    let texts: Vec<String> = session
        .timeline(10)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.text)
        .collect();
    assert_eq!(texts, vec!["accepted after", "accepted before"]);
    rt.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_sessions_and_the_policy_through_the_handle() {
    let dir = tempfile::tempdir().unwrap();
    let policy_path = dir.path().join("policy.toml");
    std::fs::write(&policy_path, "name = \"first\"\n").unwrap();
    let with_file = config(&dir).with_policy_file(&policy_path).unwrap();
    let rt = Runtime::open(with_file).await.unwrap();
    assert_eq!(rt.policy().name, "first");

    let a = rt.session("default", "a").unwrap();
    let id = a.record(event("keep this one")).await.unwrap();
    rt.session("default", "b")
        .unwrap()
        .record_batch(vec![event("one"), event("two")])
        .await
        .unwrap();
    let sessions = rt.sessions("default").await.unwrap();
    let summary: Vec<(String, u64)> = sessions
        .iter()
        .map(|s| (s.session_id.clone(), s.events))
        .collect();
    assert_eq!(summary, vec![("a".to_string(), 1), ("b".to_string(), 2)]);
    assert!(rt.sessions("other").await.unwrap().is_empty());

    let memory = rt.memory("default", id).unwrap();
    assert_eq!(memory.get().await.unwrap().text, "keep this one");
    assert_eq!(
        memory
            .set_status(Status::Pinned, "tester")
            .await
            .unwrap()
            .status,
        Status::Pinned
    );
    assert_eq!(
        memory.archive("tester").await.unwrap().status,
        Status::Archived
    );
    let actions: Vec<AuditAction> = memory
        .history()
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.action)
        .collect();
    assert_eq!(
        actions,
        vec![
            AuditAction::Created,
            AuditAction::Scored,
            AuditAction::StatusChanged,
            AuditAction::Archived
        ]
    );
    assert!(matches!(
        rt.memory("other", id).unwrap().get().await,
        Err(Error::NotFound { .. })
    ));

    // Reloading picks up the edited file; a broken file changes nothing.
    std::fs::write(&policy_path, "name = \"second\"\n").unwrap();
    assert_eq!(rt.reload_policy().await.unwrap().default.name, "second");
    std::fs::write(&policy_path, "name = \"third\"\n[scoring]\nrecency = -1\n").unwrap();
    let err = rt.reload_policy().await.unwrap_err();
    assert!(matches!(err, Error::Policy(_)), "{err}");
    assert_eq!(rt.policy().name, "second");
    rt.shutdown().await.unwrap();

    // Opened without a file, there is nothing to reload.
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::open(config(&dir)).await.unwrap();
    let err = rt.reload_policy().await.unwrap_err();
    assert!(err.to_string().contains("without a policy file"), "{err}");
    rt.shutdown().await.unwrap();
}

/// A summarizer scripted by the window: a window mentioning `PANIC` makes it panic, one
/// mentioning `FAIL` makes it fail; otherwise it writes a lesson.
#[derive(Debug)]
struct ScriptedSummarizer;

#[async_trait::async_trait]
impl shadowbrain_runtime::Summarizer for ScriptedSummarizer {
    fn name(&self) -> &str {
        "scripted-summarizer"
    }

    async fn summarize(
        &self,
        request: shadowbrain_runtime::SummaryRequest<'_>,
    ) -> shadowbrain_runtime::Result<shadowbrain_runtime::Summary> {
        let (window, picked) = (request.window, request.picked);
        let all: String = window.iter().map(|r| r.text.as_str()).collect();
        assert!(!all.contains("PANIC"), "the summarizer fell over");
        if all.contains("FAIL") {
            return Err(Error::Provider {
                provider: "scripted".into(),
                message: "the model answered garbage".into(),
            });
        }
        Ok(shadowbrain_runtime::Summary {
            text: format!(
                "When the cache is cold, warm it first ({} events, {} picked).",
                window.len(),
                picked.len()
            ),
            lesson: true,
            cited: vec![window[1].id],
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llm_condensation_uses_the_summarizer_and_falls_back_to_extractive() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(&dir);
    config.substrate.policy = Policy::from_toml(
        "<test>",
        "[condensation]\nmode = \"llm\"\nevery_events = 1000\nmin_events = 2\nmax_age = \"never\"\n",
    )
    .unwrap();
    config.summarizer = Some(Arc::new(ScriptedSummarizer));
    let rt = Runtime::open(config).await.unwrap();
    let cases = [
        (
            "fine",
            "written by scripted-summarizer",
            "When the cache is cold",
        ),
        ("failing", "the model answered garbage", "2 events"),
        (
            "panicking",
            "it panicked: the summarizer fell over",
            "2 events",
        ),
    ];
    for (session, audit, text) in cases {
        let handle = rt.session("default", session).unwrap();
        let marker = match session {
            "failing" => "FAIL",
            "panicking" => "PANIC",
            _ => "",
        };
        handle
            .record_batch(vec![
                event(&format!("the cache was cold {marker}")),
                event("warming it fixed the latency"),
            ])
            .await
            .unwrap();
        let condensed = handle
            .condense()
            .await
            .unwrap()
            .expect("a condensed record");
        assert!(
            condensed.text.starts_with(text),
            "{session}: {}",
            condensed.text
        );
        let history = rt
            .memory("default", condensed.id)
            .unwrap()
            .history()
            .await
            .unwrap();
        assert!(history[0].detail.contains(audit), "{session}: {history:?}");
        // The model's lesson is a `lesson` with its citation; the fallback a `summary`.
        let record = rt
            .memory("default", condensed.id)
            .unwrap()
            .get()
            .await
            .unwrap();
        let (kind, cited) = match session {
            "fine" => ("lesson", Some(condensed.sources[1].to_string())),
            _ => ("summary", None),
        };
        assert_eq!(record.kind.as_str(), kind, "{session}");
        assert_eq!(
            record.metadata["condensed"]["cited"][0]
                .as_str()
                .map(str::to_string),
            cited,
            "{session}"
        );
    }
    // The condenser caught the panic itself: nothing was restarted.
    assert_eq!(rt.restarts().await.unwrap(), 0);
    rt.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settle_waits_for_the_condensations_and_promotions_writes_triggered() {
    use shadowbrain_runtime::Tier;
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(&dir);
    config.substrate.policy = Policy::from_toml(
        "<test>",
        "[condensation]\nevery_events = 4\nmin_events = 2\nmax_age = \"1s\"\n",
    )
    .unwrap();
    // Idle ticks every 500 ms, but they must not condense by age.
    config.session_idle = Duration::from_secs(2);
    config.age_trigger = false;
    let rt = Runtime::open(config).await.unwrap();
    let condensed = |rt: &Runtime| {
        let store = rt.substrate().store();
        store.tier_len(Tier::Condensed)
    };
    for round in 0..20u64 {
        let session = rt.session("default", &format!("s{round}")).unwrap();
        session
            .record_batch(
                (0..4)
                    .map(|i| event(&format!("round {round} event {i}")))
                    .collect(),
            )
            .await
            .unwrap();
        rt.settle().await.unwrap();
        assert_eq!(
            condensed(&rt),
            round + 1,
            "the triggered condensation is done"
        );
    }
    // Two events, then real time passes with idle ticks: no condensation by age.
    let session = rt.session("default", "aged").unwrap();
    session
        .record_batch(vec![event("old one"), event("old two")])
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1_800)).await;
    rt.settle().await.unwrap();
    assert_eq!(condensed(&rt), 20, "age triggers are the caller's");
    rt.shutdown().await.unwrap();
}
