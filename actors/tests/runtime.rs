//! The actor runtime end to end, on a real LMDB store in a temp dir: ordering under
//! concurrency, passivation and revival, supervision, shutdown and reopen, bad input.

use std::sync::Arc;
use std::time::{Duration, Instant};

use shadowbrain_actors::substrate::error::Error;
use shadowbrain_actors::substrate::model::NewMemory;
use shadowbrain_actors::{Fault, Runtime, RuntimeConfig};

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
async fn the_condenser_and_decay_actors_are_restarted_and_keep_working() {
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
    eventually("three restarts", Duration::from_secs(10), || async {
        rt.restarts().await.unwrap() == 3
    })
    .await;
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
            Ok(shadowbrain_actors::substrate::kv::Visit::Continue)
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
    use shadowbrain_actors::substrate::clock::{DAY_MS, VirtualClock};
    use shadowbrain_actors::substrate::lifecycle::{FeedbackTarget, Outcome};
    use shadowbrain_actors::substrate::model::Tier;
    use shadowbrain_actors::substrate::policy::Policy;
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
                Ok(shadowbrain_actors::substrate::kv::Visit::Continue)
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
    use shadowbrain_actors::substrate::clock::VirtualClock;
    use shadowbrain_actors::substrate::model::AuditAction;
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
