//! Decay sweeps and extractive condensation on a real store, on the virtual clock.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use shadowbrain_runtime::internals::{Mutation, RecordPatch, WriteSet};
use shadowbrain_runtime::policy::Policy;
use shadowbrain_runtime::{
    AuditAction, Clock, DAY_MS, IndexingOptions, MemoryId, NewMemory, RecallRequest, Status,
    Substrate, SubstrateOptions, SweepReport, Tier, VirtualClock,
};

const T0: i64 = 1_780_000_000_000;

fn open(dir: &Path, policy: Policy) -> (Substrate, Arc<VirtualClock>) {
    let clock = Arc::new(VirtualClock::new(T0));
    let opts = SubstrateOptions {
        clock: clock.clone(),
        policy,
        indexing: IndexingOptions {
            background: false,
            ..IndexingOptions::default()
        },
        ..SubstrateOptions::default()
    };
    (Substrate::open(dir, opts).unwrap(), clock)
}

async fn rec(sub: &Substrate, session: &str, kind: &str, text: &str) -> MemoryId {
    sub.record("default", session, vec![NewMemory::new(kind, text)])
        .await
        .unwrap()[0]
}

fn actions(sub: &Substrate, id: MemoryId) -> Vec<AuditAction> {
    sub.history("default", id)
        .unwrap()
        .into_iter()
        .map(|e| e.action)
        .collect()
}

/// The default policy: half-life 30 days, archive under 0.05, purge archives after 180
/// days, goals protected. An observation of importance 3 starts at strength 0.65.
#[tokio::test]
async fn decay_archives_then_purges_on_the_virtual_clock_and_spares_the_protected() {
    let dir = tempfile::tempdir().unwrap();
    let (sub, clock) = open(dir.path(), Policy::default_policy());
    let fading = rec(
        &sub,
        "s",
        "observation",
        "the cafeteria serves soup on tuesdays",
    )
    .await;
    let goal = rec(&sub, "s", "goal", "ship the billing migration").await;
    let pinned = rec(
        &sub,
        "s",
        "observation",
        "the on-call phone number is 555-0100",
    )
    .await;
    sub.set_status("default", pinned, Status::Pinned, "test")
        .unwrap();
    // Written pinned: pinned from its first write, with no status change in its history.
    let written_pinned = sub
        .record(
            "default",
            "s",
            vec![NewMemory {
                pinned: true,
                ..NewMemory::new("agent_item", "the user asked for the quarterly report")
            }],
        )
        .await
        .unwrap()[0];
    let r = sub.get("default", written_pinned).unwrap();
    assert_eq!(r.status, Status::Pinned);
    assert_eq!(
        actions(&sub, written_pinned),
        vec![AuditAction::Created, AuditAction::Scored]
    );
    assert_eq!(sub.get("default", fading).unwrap().strength, 0.65);

    clock.advance(Duration::from_millis(60 * DAY_MS as u64));
    let report = sub.decay_sweep("decay").unwrap();
    assert_eq!(
        report,
        SweepReport {
            examined: 4,
            decayed: 1,
            archived: 0,
            purged: 0
        }
    );
    let r = sub.get("default", fading).unwrap();
    assert!(
        (r.strength - 0.1625).abs() < 1e-4,
        "two half-lives: {}",
        r.strength
    );
    assert_eq!(r.strength_at, clock.now());

    // 150 days in all: 0.65 / 2^5 = 0.020 < 0.05.
    clock.advance(Duration::from_millis(90 * DAY_MS as u64));
    let report = sub.decay_sweep("decay").unwrap();
    assert_eq!((report.archived, report.purged), (1, 0));
    assert_eq!(sub.get("default", fading).unwrap().status, Status::Archived);
    let mut req = RecallRequest::new("default", "s", "cafeteria soup tuesdays");
    req.reinforce = false;
    let recalled = sub.recall(&req).await.unwrap();
    assert!(
        recalled.memories.iter().all(|m| m.record.id != fading),
        "archived records are never recalled"
    );

    // A sweep before purge_archived_after keeps the archive; after it, the record is gone.
    clock.advance(Duration::from_millis(179 * DAY_MS as u64));
    assert_eq!(sub.decay_sweep("decay").unwrap().purged, 0);
    clock.advance(Duration::from_millis(DAY_MS as u64));
    assert_eq!(sub.decay_sweep("decay").unwrap().purged, 1);
    assert!(sub.get("default", fading).is_err());
    assert_eq!(
        actions(&sub, fading),
        vec![
            AuditAction::Created,
            AuditAction::Scored,
            AuditAction::Decayed,
            AuditAction::Archived,
            AuditAction::Purged
        ]
    );
    // Protected kinds and pinned records never decay, however long it takes.
    for id in [goal, pinned, written_pinned] {
        let r = sub.get("default", id).unwrap();
        assert!(r.status.recallable(), "{id} stays recallable");
        assert!(
            r.strength >= 0.5,
            "{id} never fell below a new record's strength: {}",
            r.strength
        );
        assert!(!actions(&sub, id).contains(&AuditAction::Decayed));
    }
}

/// A decision taken on a snapshot does not overwrite a change that committed after it.
#[tokio::test]
async fn a_stale_decay_decision_leaves_no_trace() {
    let dir = tempfile::tempdir().unwrap();
    let (sub, clock) = open(dir.path(), Policy::default_policy());
    let id = rec(
        &sub,
        "s",
        "observation",
        "reinforced while the sweep decided",
    )
    .await;
    let snapshot = sub.get("default", id).unwrap();
    clock.advance(Duration::from_millis(DAY_MS as u64));
    // A reinforcement commits first (strength_at moves)...
    sub.store()
        .write(WriteSet(vec![Mutation::Patch(
            id,
            RecordPatch {
                strength: Some((0.9, clock.now())),
                add_reinforcements: 1,
                ..RecordPatch::default()
            },
        )]))
        .unwrap();
    // ...then the sweep's decision, taken on the older snapshot, arrives.
    sub.store()
        .write(WriteSet(vec![Mutation::PatchIf {
            id,
            if_strength_at: snapshot.strength_at,
            patch: RecordPatch {
                strength: Some((0.1, clock.now())),
                ..RecordPatch::default()
            },
            audit: shadowbrain_runtime::AuditEntry {
                at: clock.now(),
                action: AuditAction::Decayed,
                by: "decay".into(),
                detail: "stale".into(),
            },
        }]))
        .unwrap();
    assert_eq!(sub.get("default", id).unwrap().strength, 0.9);
    assert!(!actions(&sub, id).contains(&AuditAction::Decayed));
}

#[tokio::test]
async fn condensation_quotes_the_recurring_theme_links_sources_and_condenses_each_event_once() {
    let dir = tempfile::tempdir().unwrap();
    let policy = Policy::from_toml(
        "<test>",
        "[condensation]\nevery_events = 12\nmin_events = 3\nmax_age = \"never\"\n",
    )
    .unwrap();
    let (sub, clock) = open(dir.path(), policy.clone());
    let texts = [
        "the payment service timed out calling the bank gateway",
        "lunch order placed for the team",
        "retried the payment service call, the bank gateway timed out again",
        "the bank gateway timeout hits the payment service under load",
        "someone renamed the wiki page about holidays",
        "raised the payment service timeout for the bank gateway to 30 seconds",
        "the printer on floor two is out of toner",
        "payment service calls to the bank gateway succeed with the longer timeout",
        "coffee machine descaled",
        "the bank gateway latency dashboard shows p99 of 12 seconds",
        "weather is nice today",
        "payment service and bank gateway healthy after the timeout change",
    ];
    let mut ids = Vec::new();
    for t in texts {
        clock.advance(Duration::from_secs(60));
        ids.push(rec(&sub, "ops", "observation", t).await);
    }
    let (events, oldest) = sub.condensation_backlog("default", "ops").unwrap();
    assert_eq!(events, 12);
    assert!(policy.condensation_due(events, oldest, clock.now()));

    let condensed = sub
        .condense("default", "ops", "condenser")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(condensed.sources, ids);
    assert!(!condensed.picked.is_empty() && condensed.picked.len() <= 5);
    assert!(
        condensed.text.starts_with("12 events, "),
        "{}",
        condensed.text
    );
    assert!(
        condensed.text.contains("bank gateway"),
        "{}",
        condensed.text
    );
    for noise in ["lunch", "toner", "coffee", "weather", "wiki"] {
        assert!(
            !condensed.text.contains(noise),
            "quoted noise `{noise}`: {}",
            condensed.text
        );
    }
    let record = sub.get("default", condensed.id).unwrap();
    assert_eq!(record.tier, Tier::Condensed);
    assert_eq!(record.sources, ids);
    assert_eq!(record.session_id, "ops");
    for id in &ids {
        assert!(
            actions(&sub, *id).contains(&AuditAction::CondensedInto),
            "{id}"
        );
    }

    // Nothing new: nothing to condense, and the trigger is quiet.
    assert_eq!(
        sub.condense("default", "ops", "condenser").await.unwrap(),
        None
    );
    assert_eq!(sub.condensation_backlog("default", "ops").unwrap().0, 0);
    // New events are condensed on their own, once there are min_events of them.
    let mut later = Vec::new();
    for t in [
        "deploy of payment service v2 started",
        "deploy of payment service v2 finished",
    ] {
        later.push(rec(&sub, "ops", "observation", t).await);
    }
    assert_eq!(
        sub.condense("default", "ops", "condenser").await.unwrap(),
        None,
        "below min_events"
    );
    later.push(
        rec(
            &sub,
            "ops",
            "observation",
            "payment service v2 smoke tests passed",
        )
        .await,
    );
    let second = sub
        .condense("default", "ops", "condenser")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(second.sources, later);

    // The condensed record is recalled like any memory.
    let mut req = RecallRequest::new("default", "elsewhere", "bank gateway timeout payment");
    req.scope = shadowbrain_runtime::Scope::Namespace;
    req.reinforce = false;
    let recalled = sub.recall(&req).await.unwrap();
    assert!(
        recalled
            .memories
            .iter()
            .any(|m| m.record.id == condensed.id)
    );
}

/// A lesson written once among routine events is the least central thing in its window;
/// it is quoted anyway because it is as important as the promotion threshold — otherwise
/// no condensed record would carry it and it could never be promoted.
#[tokio::test]
async fn condensation_quotes_an_important_outlier_a_promotion_could_need() {
    let dir = tempfile::tempdir().unwrap();
    let policy = Policy::from_toml(
        "<test>",
        "[condensation]\nevery_events = 12\nmin_events = 3\nmax_age = \"never\"\n",
    )
    .unwrap();
    let (sub, clock) = open(dir.path(), policy);
    for i in 0..9 {
        clock.advance(Duration::from_secs(60));
        rec(
            &sub,
            "ops",
            "action",
            &format!("restarted the cache cluster node {i}"),
        )
        .await;
    }
    clock.advance(Duration::from_secs(60));
    let lesson = NewMemory {
        importance: Some(10.0),
        ..NewMemory::new(
            "thought",
            "when the payment gateway returns 502, retry with backoff",
        )
    };
    sub.record("default", "ops", vec![lesson]).await.unwrap();
    let condensed = sub
        .condense("default", "ops", "condenser")
        .await
        .unwrap()
        .unwrap();
    assert!(
        condensed.text.contains("retry with backoff"),
        "{}",
        condensed.text
    );
    assert!(
        condensed.text.contains("cache cluster"),
        "{}",
        condensed.text
    );
    assert_eq!(sub.get("default", condensed.id).unwrap().importance, 10.0);
}

/// A record marked wrong is kept but never recalled, is spared by decay, counts one
/// failure, and its history keeps the reason; restoring it brings it back with the failure
/// still counted. The census and insights see it retired.
#[tokio::test]
async fn a_record_marked_wrong_leaves_recall_with_its_reason_and_one_failure() {
    let dir = tempfile::tempdir().unwrap();
    let (sub, clock) = open(dir.path(), Policy::default_policy());
    let wrong = rec(&sub, "s", "observation", "the deploy runner is eu-1").await;
    let right = rec(&sub, "s", "observation", "the deploy runner is eu-2").await;
    sub.catch_up().unwrap();
    let recalled = |sub: &Substrate| {
        let sub = sub.clone();
        async move {
            sub.recall(&RecallRequest::new("default", "s", "deploy runner"))
                .await
                .unwrap()
                .memories
                .iter()
                .map(|m| m.record.id)
                .collect::<Vec<_>>()
        }
    };
    assert!(recalled(&sub).await.contains(&wrong));

    let too_long = "x".repeat(shadowbrain_runtime::MAX_REASON_BYTES + 1);
    let refused = sub.set_status_because("default", wrong, Status::Wrong, Some(&too_long), "test");
    assert!(refused.unwrap_err().to_string().contains("reason"));
    assert_eq!(
        sub.get("default", wrong).unwrap().status,
        Status::Active,
        "a refusal changes nothing"
    );

    let r = sub
        .set_status_because(
            "default",
            wrong,
            Status::Wrong,
            Some(" eu-1 was retired "),
            "curator",
        )
        .unwrap();
    assert_eq!((r.status, r.utility.failures), (Status::Wrong, 1));
    let last = sub.history("default", wrong).unwrap().pop().unwrap();
    assert_eq!(
        (last.action, last.by.as_str()),
        (AuditAction::StatusChanged, "curator")
    );
    assert_eq!(last.detail, "active -> wrong: eu-1 was retired");
    let got = recalled(&sub).await;
    assert!(!got.contains(&wrong) && got.contains(&right), "{got:?}");

    // Marking it wrong again counts nothing more.
    let again = sub
        .set_status("default", wrong, Status::Wrong, "curator")
        .unwrap();
    assert_eq!(again.utility.failures, 1);
    let census = sub.store().census("default");
    assert_eq!(
        (census.status(Status::Wrong), census.status(Status::Active)),
        (1, 1)
    );
    assert_eq!(census.tier(Tier::Episodic), 2);
    // Decay spares it, like an obsolete record: it is kept for the record.
    clock.advance(Duration::from_secs(400 * 24 * 3600));
    sub.decay_sweep("decay").unwrap();
    assert_eq!(sub.get("default", wrong).unwrap().status, Status::Wrong);
    let insights = sub.insights("default", clock.now(), 10).await.unwrap();
    assert!(
        insights.retired.iter().any(|r| r.id == wrong),
        "{:?}",
        insights.retired
    );

    let back = sub
        .set_status("default", wrong, Status::Active, "curator")
        .unwrap();
    assert_eq!((back.status, back.utility.failures), (Status::Active, 1));
}
