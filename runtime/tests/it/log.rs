//! The cluster's seam under the store (`store/log.rs`): every commit group goes to a log
//! before it is committed, and a replica that applies the log ends up key for key equal to
//! the owner's store — also for what a recall, feedback, condensation, a status change and
//! a decay sweep decided, which a replay must not decide again.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use shadowbrain_runtime::policy::Policy;
use shadowbrain_runtime::{
    Backend, CommitLog, DAY_MS, Error, FeedbackTarget, IndexingOptions, MemoryId, NewMemory,
    Outcome, RecallRequest, Replica, Result, Status, Substrate, SubstrateOptions, VirtualClock,
};

/// A log in memory: entries at positions 1, 2, …; it can be told to refuse appends.
#[derive(Debug, Default)]
struct MemoryLog {
    entries: Mutex<Vec<Vec<u8>>>,
    refuse: AtomicBool,
    max_entry: usize,
}

impl CommitLog for MemoryLog {
    fn append(&self, entry: &[u8]) -> Result<u64> {
        if self.refuse.load(Ordering::SeqCst) {
            return Err(Error::Unavailable {
                what: "the test's log".into(),
                message: "refusing appends".into(),
            });
        }
        let mut entries = self.entries.lock().unwrap();
        entries.push(entry.to_vec());
        Ok(entries.len() as u64)
    }

    fn max_entry_bytes(&self) -> usize {
        self.max_entry
    }

    fn local_commit_failed(&self, _position: u64, _error: &Error) {
        self.refuse.store(true, Ordering::SeqCst);
    }
}

fn open(dir: &Path, log: Arc<MemoryLog>, clock: Arc<VirtualClock>) -> Substrate {
    Substrate::open(dir, options(Some(log), clock)).unwrap()
}

fn options(log: Option<Arc<MemoryLog>>, clock: Arc<VirtualClock>) -> SubstrateOptions {
    SubstrateOptions {
        clock,
        policy: Policy::default_policy(),
        indexing: IndexingOptions {
            background: false,
            ..IndexingOptions::default()
        },
        log: log.map(|l| l as Arc<dyn CommitLog>),
        ..SubstrateOptions::default()
    }
}

/// What `sub` ranks for `query` in `acme`: ids and scores, best first.
fn ranked(sub: &Substrate, query: &RecallRequest) -> Vec<(MemoryId, f32)> {
    let (result, _) = sub.rank(query, None, &sub.policy_for("acme")).unwrap();
    result
        .memories
        .iter()
        .map(|m| (m.record.id, m.score))
        .collect()
}

/// Every key and value of a store's files that the log carries.
fn contents(dir: &Path) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let replica = Replica::open(dir, Backend::Lmdb).unwrap();
    let mut all = BTreeMap::new();
    replica
        .for_each_logged(&mut |k, v| {
            all.insert(k.to_vec(), v.to_vec());
        })
        .unwrap();
    all
}

#[tokio::test]
async fn a_replica_of_the_log_equals_the_owners_store_key_for_key() {
    let dir = tempfile::tempdir().unwrap();
    // Small entries: groups are cut, and each part is still applied once.
    let log = Arc::new(MemoryLog {
        max_entry: 4096,
        ..MemoryLog::default()
    });
    let clock = Arc::new(VirtualClock::new(1_780_000_000_000));
    let sub = open(&dir.path().join("owner"), log.clone(), clock.clone());
    let mut ids = Vec::new();
    for s in 0..4 {
        let events: Vec<NewMemory> = (0..30)
            .map(|i| {
                NewMemory::new(
                    "observation",
                    format!("session {s} talked about topic {i} and the weather"),
                )
            })
            .collect();
        ids.extend(sub.record("acme", &format!("s{s}"), events).await.unwrap());
    }
    sub.record(
        "acme",
        "s0",
        vec![NewMemory::new("goal", "ship the billing migration")],
    )
    .await
    .unwrap();
    sub.enrich_pending(usize::MAX).await.unwrap();
    let recalled = sub
        .recall(&RecallRequest::new("acme", "s0", "what about topic 3"))
        .await
        .unwrap();
    assert!(!recalled.memories.is_empty());
    sub.feedback(
        "acme",
        &FeedbackTarget::Recall(recalled.recall_id.clone().unwrap()),
        Outcome::Success,
        "test",
    )
    .await
    .unwrap();
    sub.set_status("acme", ids[5], Status::Pinned, "test")
        .unwrap();
    sub.condense("acme", "s1", "test").await.unwrap();
    clock.advance(std::time::Duration::from_millis(20 * DAY_MS as u64));
    sub.decay_sweep("test").unwrap();
    sub.purge("acme", ids[7], "test").unwrap();
    sub.archive("acme", ids[9], "test").unwrap();
    let before: Vec<_> = ids[..10]
        .iter()
        .filter(|id| **id != ids[7])
        .map(|id| sub.get("acme", *id).unwrap())
        .collect();
    let query = RecallRequest::new("acme", "s2", "topic 4 and the weather");
    let ranked = |sub: &Substrate| ranked(sub, &query);
    let owner_ranked = ranked(&sub);
    assert!(!owner_ranked.is_empty());
    sub.close().unwrap();
    drop(sub);

    let entries = log.entries.lock().unwrap().clone();
    assert!(entries.len() > 5, "{} entries", entries.len());
    let replica_dir = dir.path().join("replica");
    let mut replica = Replica::open(&replica_dir.join("store"), Backend::Lmdb).unwrap();
    for (i, entry) in entries.iter().enumerate() {
        assert!(replica.apply(i as u64 + 1, entry).unwrap());
    }
    // Delivered again (a consumer's redelivery), nothing is applied twice.
    assert!(!replica.apply(1, &entries[0]).unwrap());
    assert_eq!(replica.applied(), entries.len() as u64);
    replica.close();
    let owner = contents(&dir.path().join("owner").join("store"));
    let copy = contents(&replica_dir.join("store"));
    let differ: Vec<_> = owner
        .iter()
        .filter(|(k, v)| copy.get(*k) != Some(*v))
        .map(|(k, _)| String::from_utf8_lossy(k).into_owned())
        .chain(
            copy.keys()
                .filter(|k| !owner.contains_key(*k))
                .map(|k| format!("only in the copy: {}", String::from_utf8_lossy(k))),
        )
        .collect();
    assert!(differ.is_empty(), "{differ:?}");
    assert!(owner == copy, "the replica differs from the owner's store");

    // Taken over: the replica opens as a store (its indexes rebuilt from its change log)
    // and answers what the owner answered, with the strength the owner's recall, feedback
    // and decay decided.
    let next = Arc::new(MemoryLog {
        max_entry: 1 << 20,
        ..MemoryLog::default()
    });
    let taken = open(&replica_dir, next.clone(), clock.clone());
    for record in &before {
        let copy = taken.get("acme", record.id).unwrap();
        assert_eq!(copy.strength, record.strength);
        assert_eq!(copy.status, record.status);
        assert_eq!(copy.text, record.text);
    }
    assert!(taken.get("acme", ids[7]).is_err(), "the purge was replayed");
    let again = taken
        .recall(&RecallRequest::new("acme", "s2", "topic 4 and the weather"))
        .await
        .unwrap();
    assert!(
        again
            .memories
            .iter()
            .any(|m| m.record.text.contains("topic 4"))
    );

    // A log that refuses: the write is answered with its error, and nothing is committed.
    next.refuse.store(true, Ordering::SeqCst);
    let err = taken
        .record(
            "acme",
            "s9",
            vec![NewMemory::new("observation", "never logged")],
        )
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Unavailable { .. }), "{err}");
    assert!(taken.store().session_stats("acme", "s9").unwrap().is_none());
}

/// An owner logging to memory, and a standby in `dir` that applies what the log holds
/// whenever [`Follower::follow`] is called.
struct Follower {
    log: Arc<MemoryLog>,
    applied: usize,
}

impl Follower {
    fn start(dir: &Path) -> (Substrate, Substrate, Follower, Arc<VirtualClock>) {
        let log = Arc::new(MemoryLog {
            max_entry: 1 << 20,
            ..MemoryLog::default()
        });
        let clock = Arc::new(VirtualClock::new(1_780_000_000_000));
        let owner = open(&dir.join("owner"), log.clone(), clock.clone());
        let mut standby_opts = options(None, clock.clone());
        standby_opts.standby = true;
        let standby = Substrate::open(&dir.join("standby"), standby_opts).unwrap();
        (owner, standby, Follower { log, applied: 0 }, clock)
    }

    /// Applies to `standby` what the log holds past what it applied, delivered twice (a
    /// consumer's redelivery), which must apply it once.
    fn follow(&mut self, standby: &Substrate) {
        let entries: Vec<(u64, Vec<u8>)> = self.log.entries.lock().unwrap()[self.applied..]
            .iter()
            .enumerate()
            .map(|(i, e)| ((self.applied + i + 1) as u64, e.clone()))
            .collect();
        self.applied += entries.len();
        let again = entries.clone();
        assert_eq!(standby.apply_logged(entries).unwrap(), self.applied as u64);
        assert_eq!(standby.apply_logged(again).unwrap(), self.applied as u64);
    }
}

#[tokio::test]
async fn a_standby_indexes_as_the_log_arrives_and_its_takeover_rebuilds_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (owner, standby, mut follower, clock) = Follower::start(dir.path());
    let mut ids = Vec::new();
    let mut follow = |standby: &Substrate| follower.follow(standby);
    for round in 0..3 {
        for s in 0..3 {
            let events: Vec<NewMemory> = (0..20)
                .map(|i| {
                    NewMemory::new(
                        "observation",
                        format!("round {round} session {s} noted fact {i} about the harbour"),
                    )
                })
                .collect();
            ids.extend(
                owner
                    .record("acme", &format!("s{s}"), events)
                    .await
                    .unwrap(),
            );
        }
        owner.enrich_pending(usize::MAX).await.unwrap();
        // The owner builds its indexes and truncates its change log before the standby
        // built the same changes: the truncation is the owner's own, never logged.
        owner.flush_indexes().unwrap();
        follow(&standby);
        standby.flush_indexes().unwrap();
    }
    // A status change and a condensation move records between the catalog's sets.
    owner
        .set_status("acme", ids[3], Status::Archived, "test")
        .unwrap();
    owner.condense("acme", "s1", "test").await.unwrap();
    follow(&standby);
    standby.flush_indexes().unwrap();
    assert_eq!(owner.store().census("acme"), standby.store().census("acme"));

    // A standby's store takes writes only from the log.
    let refused = standby
        .record(
            "acme",
            "s0",
            vec![NewMemory::new("observation", "written to a copy")],
        )
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("standby"), "{refused}");

    // The standby ranks what the owner ranks: same catalog, same indexes.
    let query = RecallRequest::new("acme", "s2", "fact 4 about the harbour");
    let ranked = |sub: &Substrate| ranked(sub, &query);
    let owner_ranked = ranked(&owner);
    assert!(owner_ranked.len() >= 5, "{owner_ranked:?}");
    assert_eq!(ranked(&standby), owner_ranked);
    owner.close().unwrap();
    drop(owner);
    standby.close().unwrap();
    drop(standby);
    assert_eq!(
        contents(&dir.path().join("owner").join("store")),
        contents(&dir.path().join("standby").join("store"))
    );

    // Taken over: the indexes were built as the log arrived, nothing is rebuilt.
    let next = Arc::new(MemoryLog {
        max_entry: 1 << 20,
        ..MemoryLog::default()
    });
    let taken = open(&dir.path().join("standby"), next, clock);
    assert_eq!(taken.rebuilds(), 0, "the takeover rebuilt an index");
    assert_eq!(ranked(&taken), owner_ranked);
}

/// The cluster snapshots a standby only once its indexes are nearly built, asking it how
/// many changes they lack: feedback writes audit entries and recall outcomes, which take
/// log sequences but no index ever builds, so a burst of it must not read as unbuilt
/// changes (it did: counted as sequences past the watermark, an idle standby after a
/// feedback burst was never snapshotted again).
#[tokio::test]
async fn a_standby_counts_only_changes_its_indexes_lack() {
    let dir = tempfile::tempdir().unwrap();
    let (owner, standby, mut follower, _) = Follower::start(dir.path());
    let mut follow = |standby: &Substrate| follower.follow(standby);
    let events: Vec<NewMemory> = (0..30)
        .map(|i| NewMemory::new("observation", format!("the ferry left at {i} past nine")))
        .collect();
    let ids = owner.record("acme", "s0", events).await.unwrap();
    owner.enrich_pending(usize::MAX).await.unwrap();
    follow(&standby);
    // One change per record (the hash embedder embeds as the record is written);
    // counted no further than asked.
    assert_eq!(standby.unbuilt(usize::MAX).unwrap(), 30);
    assert_eq!(standby.unbuilt(10).unwrap(), 10);
    standby.flush_indexes().unwrap();
    assert_eq!(standby.unbuilt(usize::MAX).unwrap(), 0);

    for round in 0..5 {
        let outcome = if round % 2 == 0 {
            Outcome::Success
        } else {
            Outcome::Failure
        };
        owner
            .feedback(
                "acme",
                &FeedbackTarget::Memories(ids.clone()),
                outcome,
                "s0",
            )
            .await
            .unwrap();
    }
    follow(&standby);
    assert_eq!(
        standby.unbuilt(usize::MAX).unwrap(),
        0,
        "feedback changes no index"
    );
    owner
        .record(
            "acme",
            "s0",
            vec![NewMemory::new("observation", "the ferry came back")],
        )
        .await
        .unwrap();
    follow(&standby);
    assert_eq!(standby.unbuilt(usize::MAX).unwrap(), 1);
}

#[test]
fn an_entry_with_nothing_to_write_still_passes_its_position() {
    // A cluster node hands its standby an empty group for an entry it will not apply (one
    // no node sealed): the position must move past it, or it would be read forever.
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(VirtualClock::new(1_780_000_000_000));
    let mut opts = options(None, clock);
    opts.standby = true;
    let standby = Substrate::open(dir.path(), opts).unwrap();
    let empty = shadowbrain_runtime::internals::encode_entry(&[]);
    assert_eq!(
        standby
            .apply_logged(vec![(1, empty.clone()), (2, empty)])
            .unwrap(),
        2
    );
    // Positions already passed are not decoded again, whatever they hold.
    assert_eq!(
        standby
            .apply_logged(vec![(2, b"not a group".to_vec())])
            .unwrap(),
        2
    );
    assert_eq!(standby.store().census("acme"), Default::default());
}
