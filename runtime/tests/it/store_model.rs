//! Model test of the store: random operations — insert, status changes, archive,
//! reinforcement, purge and reopen — applied to a real store (LMDB and sled in temp dirs) and
//! to a `BTreeMap` reference; after every step the two must agree on records (read whole,
//! light and many at a time), listings, catalog and stats.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use proptest::prelude::*;
use shadowbrain_runtime::internals::{
    Filter, Mutation, Queue, RecordPatch, Reinforce, Reinforcement, Store, StoreOptions, WriteSet,
    neighbours_in,
};
use shadowbrain_runtime::{AuditEntry, Backend, Kind, MemoryId, MemoryRecord, PolicyStamp, Status};

#[derive(Debug, Clone)]
enum Step {
    Insert {
        session: u8,
        ns: u8,
        text: String,
        with_embedding: bool,
    },
    SetStatus {
        pick: usize,
        status: Status,
    },
    Purge {
        pick: usize,
    },
    /// Reinforce several records in one write, as a recall does.
    Reinforce {
        picks: Vec<usize>,
        other_policy: bool,
    },
    Reopen,
}

/// A reinforcement curve for the model: adds the amount, and stamps the record with a
/// policy of its own when asked, so both kinds of strength entry are written.
#[derive(Debug)]
struct Curve {
    other_policy: bool,
}

impl Reinforce for Curve {
    fn apply(&self, r: &mut MemoryRecord, now: i64, amount: f32) {
        r.strength = (r.strength + amount).min(1.0);
        r.strength_at = now;
        r.reinforcements += 1;
        r.policy = self.stamp_for(&r.policy);
    }

    fn stamp(&self) -> PolicyStamp {
        self.stamp_for(&policy())
    }
}

impl Curve {
    fn stamp_for(&self, stored: &PolicyStamp) -> PolicyStamp {
        if self.other_policy {
            PolicyStamp {
                name: "reinforcer".into(),
                hash: "def".into(),
            }
        } else {
            stored.clone()
        }
    }
}

fn policy() -> PolicyStamp {
    PolicyStamp {
        name: "default".into(),
        hash: "abc".into(),
    }
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        5 => (0u8..4, 0u8..2, "[a-z ]{1,30}", any::<bool>()).prop_map(|(session, ns, text, with_embedding)| Step::Insert { session, ns, text, with_embedding }),
        2 => (any::<usize>(), prop_oneof![Just(Status::Active), Just(Status::Pinned), Just(Status::Obsolete), Just(Status::Archived)])
            .prop_map(|(pick, status)| Step::SetStatus { pick, status }),
        1 => any::<usize>().prop_map(|pick| Step::Purge { pick }),
        2 => (proptest::collection::vec(any::<usize>(), 1..4), any::<bool>())
            .prop_map(|(picks, other_policy)| Step::Reinforce { picks, other_policy }),
        1 => Just(Step::Reopen),
    ]
}

fn record(id: MemoryId, ns: u8, session: u8, text: String, t: i64, emb: bool) -> MemoryRecord {
    let kind = Kind::new("observation").unwrap();
    MemoryRecord {
        agent_id: Some(format!("agent{}", session % 2)),
        content: serde_json::json!({"n": id.0}),
        importance: 3.0,
        policy: policy(),
        embedding: emb.then(|| vec![id.0 as f32 + 1.0, 0.5, -0.25]),
        ..MemoryRecord::episodic(id, format!("ns{ns}"), format!("s{session}"), kind, text, t)
    }
}

pub(crate) fn open_store(dir: &Path, backend: Backend) -> Store {
    // sled's background threads may hold its lock for a moment after a drop.
    let mut last = None;
    for _ in 0..50 {
        match Store::open(
            dir,
            StoreOptions {
                backend,
                ..Default::default()
            },
        ) {
            Ok(s) => return s,
            Err(e) => last = Some(e),
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    panic!("store did not reopen: {last:?}");
}

fn check(store: &Store, model: &BTreeMap<u32, MemoryRecord>) {
    for (id, want) in model {
        let got = store
            .get(MemoryId(*id))
            .unwrap()
            .expect("record in the model is in the store");
        assert_eq!(&got, want);
        let light = MemoryRecord {
            embedding: None,
            ..want.clone()
        };
        assert_eq!(
            store.get_light(MemoryId(*id)).unwrap().as_ref(),
            Some(&light)
        );
    }
    let ids: Vec<MemoryId> = model.keys().map(|&id| MemoryId(id)).collect();
    let many = store.get_many_with(&ids, false).unwrap();
    for (got, want) in many.iter().zip(model.values()) {
        assert_eq!(
            got.as_ref()
                .map(|r| (r.strength, r.reinforcements, &r.policy)),
            Some((want.strength, want.reinforcements, &want.policy))
        );
    }
    assert_eq!(store.len(), model.len() as u64);
    for ns in 0..2u8 {
        let ns_name = format!("ns{ns}");
        for session in 0..4u8 {
            let s_name = format!("s{session}");
            let mut want: Vec<&MemoryRecord> = model
                .values()
                .filter(|r| r.namespace == ns_name && r.session_id == s_name)
                .collect();
            want.sort_by_key(|r| std::cmp::Reverse((r.event_time, r.id)));
            let got = store
                .session_ids(&ns_name, &s_name, None, usize::MAX)
                .unwrap();
            assert_eq!(got, want.iter().map(|r| r.id).collect::<Vec<_>>());
            let stats = store.session_stats(&ns_name, &s_name).unwrap();
            assert_eq!(stats.map_or(0, |s| s.memories), want.len() as u64);
            let recallable: Vec<u32> = want
                .iter()
                .filter(|r| r.status.recallable())
                .map(|r| r.id.0)
                .collect();
            let mut cands: Vec<u32> = store
                .candidates(&Filter {
                    namespace: &ns_name,
                    session: Some(&s_name),
                    recallable_only: true,
                    ..Default::default()
                })
                .iter()
                .collect();
            cands.sort();
            let mut recallable = recallable;
            recallable.sort();
            assert_eq!(cands, recallable, "{ns_name}/{s_name}");
        }
    }
}

fn run(backend: Backend, steps: Vec<Step>) {
    let dir = tempfile::tempdir().unwrap();
    let mut store = open_store(dir.path(), backend);
    let mut model: BTreeMap<u32, MemoryRecord> = BTreeMap::new();
    let mut t = 1_000i64;
    for step in steps {
        t += 7;
        match step {
            Step::Insert {
                session,
                ns,
                text,
                with_embedding,
            } => {
                let id = store.allocate_ids(1).unwrap()[0];
                // Event times are not monotonic: agents send their own.
                let r = record(
                    id,
                    ns,
                    session,
                    text,
                    t - (id.0 as i64 % 3) * 5,
                    with_embedding,
                );
                store
                    .write(WriteSet(vec![Mutation::Insert(Box::new(r.clone()))]))
                    .unwrap();
                model.insert(id.0, r);
            }
            Step::SetStatus { pick, status } => {
                if model.is_empty() {
                    continue;
                }
                let key = *model.keys().nth(pick % model.len()).unwrap();
                let r = model.get_mut(&key).unwrap();
                r.status = status;
                r.status_at = t;
                // Odd picks rewrite the record (and its strength, as a caller that decays
                // it would); even ones patch it at commit time.
                let m = if pick % 2 == 1 {
                    r.strength *= 0.5;
                    Mutation::Update {
                        record: Box::new(r.clone()),
                        reindex: false,
                    }
                } else {
                    Mutation::Patch(
                        r.id,
                        RecordPatch {
                            status: Some((status, t)),
                            ..RecordPatch::default()
                        },
                    )
                };
                store.write(WriteSet(vec![m])).unwrap();
            }
            Step::Purge { pick } => {
                if model.is_empty() {
                    continue;
                }
                let key = *model.keys().nth(pick % model.len()).unwrap();
                let r = model.remove(&key).unwrap();
                store
                    .write(WriteSet(vec![Mutation::Purge(Box::new(r.clone()))]))
                    .unwrap();
                assert!(store.get(r.id).unwrap().is_none());
            }
            Step::Reinforce {
                picks,
                other_policy,
            } => {
                if model.is_empty() {
                    continue;
                }
                let curve = Arc::new(Curve { other_policy });
                let mut writes = Vec::new();
                for pick in picks {
                    let key = *model.keys().nth(pick % model.len()).unwrap();
                    let r = model.get_mut(&key).unwrap();
                    curve.apply(r, t, 0.125);
                    writes.push(Mutation::Reinforce {
                        id: r.id,
                        reinforcement: Reinforcement {
                            curve: curve.clone() as Arc<dyn Reinforce>,
                            at: t,
                            amount: 0.125,
                        },
                        by: "recall".into(),
                    });
                }
                store.write(WriteSet(writes)).unwrap();
            }
            Step::Reopen => {
                drop(store);
                store = open_store(dir.path(), backend);
            }
        }
        check(&store, &model);
    }
    // Ids are never reused, even after purges and reopens.
    let fresh = store.allocate_ids(1).unwrap()[0];
    assert!(model.keys().all(|k| *k < fresh.0));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn lmdb_store_matches_the_model(steps in proptest::collection::vec(step(), 1..40)) {
        run(Backend::Lmdb, steps);
    }

    #[test]
    fn sled_store_matches_the_model(steps in proptest::collection::vec(step(), 1..40)) {
        run(Backend::Sled, steps);
    }
}

#[test]
fn concurrent_writers_share_flushes() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path(), Backend::Lmdb);
    let threads: Vec<_> = (0..8u8)
        .map(|s| {
            let store = store.clone();
            std::thread::spawn(move || {
                for i in 0..50 {
                    let id = store.allocate_ids(1).unwrap()[0];
                    let r = record(id, 0, s % 4, format!("event {i}"), 10 + i, true);
                    store
                        .write(WriteSet(vec![Mutation::Insert(Box::new(r))]))
                        .unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let stats = store.commit_stats();
    assert_eq!(stats.write_sets, 400);
    assert!(stats.commits <= stats.write_sets);
    assert_eq!(store.len(), 400);
    let total: u64 = store
        .sessions("ns0")
        .unwrap()
        .iter()
        .map(|s| s.events)
        .sum();
    assert_eq!(total, 400);
}

#[test]
fn a_second_opener_is_refused_politely() {
    let dir = tempfile::tempdir().unwrap();
    let _store = open_store(dir.path(), Backend::Lmdb);
    let err = Store::open(
        dir.path(),
        StoreOptions {
            backend: Backend::Lmdb,
            ..Default::default()
        },
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("in use by another shadowbrain process"),
        "{err}"
    );
}

#[test]
fn the_other_backend_is_refused_with_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    drop(open_store(dir.path(), Backend::Lmdb));
    let err = Store::open(
        dir.path(),
        StoreOptions {
            backend: Backend::Sled,
            ..Default::default()
        },
    )
    .unwrap_err();
    assert!(err.to_string().contains("--backend lmdb"), "{err}");
}

#[test]
fn history_orders_reinforcements_among_a_writes_other_entries() {
    use shadowbrain_runtime::AuditAction;
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path(), Backend::Lmdb);
    let ids = store.allocate_ids(2).unwrap();
    let (a, b) = (ids[0], ids[1]);
    let entry = |action, detail: &str| AuditEntry {
        at: 5,
        action,
        by: "test".into(),
        detail: detail.into(),
    };
    let reinforce = |id| Mutation::Reinforce {
        id,
        reinforcement: Reinforcement {
            curve: Arc::new(Curve {
                other_policy: false,
            }) as Arc<dyn Reinforce>,
            at: 6,
            amount: 0.125,
        },
        by: "recall".into(),
    };
    let half = |id, session| MemoryRecord {
        strength: 0.5,
        ..record(id, 0, session, "text".into(), 5, false)
    };
    store
        .write(WriteSet(vec![
            Mutation::Insert(Box::new(half(a, 0))),
            Mutation::Insert(Box::new(half(b, 1))),
            Mutation::Audit(a, entry(AuditAction::Created, "by test")),
        ]))
        .unwrap();
    // One write: a reinforced, then resolved, then reinforced twice more (once beside a
    // record of another session, as a recall across sessions does).
    store
        .write(WriteSet(vec![
            reinforce(a),
            Mutation::Audit(a, entry(AuditAction::Resolved, "kept")),
            reinforce(a),
            reinforce(b),
            reinforce(a),
        ]))
        .unwrap();
    let details: Vec<(AuditAction, String)> = store
        .history(a)
        .unwrap()
        .into_iter()
        .map(|e| (e.action, e.detail))
        .collect();
    let strength = |s: &str| (AuditAction::Reinforced, format!("strength {s}"));
    assert_eq!(
        details,
        vec![
            (AuditAction::Created, "by test".into()),
            strength("0.500 -> 0.625"),
            (AuditAction::Resolved, "kept".into()),
            strength("0.625 -> 0.750"),
            strength("0.750 -> 0.875"),
        ]
    );
    assert_eq!(store.history(b).unwrap().len(), 1);
    // A record's own entries, without the session's reinforcement log.
    let own: Vec<AuditAction> = store
        .audit_entries(a)
        .unwrap()
        .into_iter()
        .map(|e| e.action)
        .collect();
    assert_eq!(own, vec![AuditAction::Created, AuditAction::Resolved]);
}

#[test]
fn audit_log_and_queues_and_changes_are_durable() {
    use shadowbrain_runtime::AuditAction;
    use shadowbrain_runtime::internals::Change;
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path(), Backend::Lmdb);
    let id = store.allocate_ids(1).unwrap()[0];
    let r = record(id, 0, 0, "hello".into(), 5, false);
    let entry = |action, detail: &str| AuditEntry {
        at: 5,
        action,
        by: "test".into(),
        detail: detail.into(),
    };
    store
        .write(WriteSet(vec![
            Mutation::Insert(Box::new(r.clone())),
            Mutation::Audit(id, entry(AuditAction::Created, "by test")),
            Mutation::Enqueue(Queue::Enrich, id),
        ]))
        .unwrap();
    let first_seq = store.changes_after(0, 10).unwrap();
    assert_eq!(first_seq.len(), 1);
    assert_eq!(first_seq[0].1, Change::Upsert(id));
    assert_eq!(store.queued(Queue::Enrich, 10).unwrap(), vec![id]);
    store
        .write(WriteSet(vec![
            Mutation::Dequeue(Queue::Enrich, id),
            Mutation::Purge(Box::new(r)),
            Mutation::Audit(id, entry(AuditAction::Purged, "gone")),
        ]))
        .unwrap();
    drop(store);
    let store = open_store(dir.path(), Backend::Lmdb);
    let history: Vec<AuditAction> = store
        .history(id)
        .unwrap()
        .into_iter()
        .map(|e| e.action)
        .collect();
    assert_eq!(history, vec![AuditAction::Created, AuditAction::Purged]);
    assert!(store.queued(Queue::Enrich, 10).unwrap().is_empty());
    let changes = store.changes_after(0, 10).unwrap();
    assert_eq!(
        changes.iter().map(|c| c.1).collect::<Vec<_>>(),
        vec![Change::Upsert(id), Change::Remove(id)]
    );
    store
        .write(WriteSet(vec![Mutation::TruncateChanges(changes[0].0)]))
        .unwrap();
    assert_eq!(store.first_change().unwrap(), Some(changes[1].0));
}

/// The typed tables the layers above keep in the store (no caller builds a key any more:
/// raw keys of the store's own families cannot even be written) survive a reopen on both
/// backends, and each read answers only what was written.
#[test]
fn typed_tables_are_durable_on_both_backends() {
    use shadowbrain_runtime::internals::RememberedRecall;
    use shadowbrain_runtime::{Edge, QuarantineEntry, Relation, Strikes};
    for backend in [Backend::Lmdb, Backend::Sled] {
        let dir = tempfile::tempdir().unwrap();
        let (a, b, c) = (MemoryId(1), MemoryId(2), MemoryId(3));
        let recall = RememberedRecall {
            namespace: "ns".into(),
            session: "s".into(),
            at: 42,
            ids: vec![b, a],
        };
        let strikes = Strikes {
            count: 2,
            actor: "evaluator".into(),
            last_error: "boom".into(),
        };
        let entry = QuarantineEntry {
            id: c,
            namespace: "ns".into(),
            session_id: Some("s".into()),
            actor: "session actor".into(),
            error: "boom".into(),
            strikes: 3,
            at: 43,
            input: Some("[]".into()),
        };
        let edge = Edge {
            from: b,
            to: a,
            relation: Relation::Supersedes,
        };
        {
            let store = open_store(dir.path(), backend);
            store
                .write(WriteSet(vec![
                    Mutation::RememberRecall(7, recall.clone()),
                    Mutation::PutEdge("ns".into(), edge),
                    Mutation::MarkPromoted {
                        condensed: a,
                        knowledge: b,
                    },
                    Mutation::SetStrikes(a, strikes.clone()),
                    Mutation::SetStrikes(b, strikes.clone()),
                    Mutation::Quarantine(Box::new(entry.clone())),
                    Mutation::SetCondensedUpto {
                        namespace: "ns".into(),
                        session: "s".into(),
                        upto: b,
                    },
                    Mutation::SetLastDecaySweep(-5),
                ]))
                .unwrap();
            store
                .write(WriteSet(vec![Mutation::ClearStrikes(b)]))
                .unwrap();
        }
        let store = open_store(dir.path(), backend);
        assert_eq!(store.recall(7).unwrap(), Some(recall.clone()));
        assert_eq!(store.recall(8).unwrap(), None);
        let mut recalls = Vec::new();
        store
            .for_each_recall(|n, r| {
                recalls.push((n, r));
                Ok(shadowbrain_runtime::internals::Visit::Continue)
            })
            .unwrap();
        assert_eq!(recalls, vec![(7, recall)]);
        assert_eq!(store.edges("ns", None).unwrap(), vec![edge]);
        assert_eq!(store.edges("ns", Some(b)).unwrap(), vec![edge]);
        assert!(store.edges("ns", Some(a)).unwrap().is_empty());
        assert!(store.edges("other", None).unwrap().is_empty());
        assert_eq!(store.promoted_into(a).unwrap(), Some(b));
        assert_eq!(store.promoted_into(b).unwrap(), None);
        assert_eq!(store.strikes(a).unwrap(), Some(strikes));
        assert_eq!(store.strikes(b).unwrap(), None);
        assert_eq!(store.quarantine_entry(c).unwrap(), Some(entry));
        assert_eq!(store.quarantine_entry(a).unwrap(), None);
        assert_eq!(store.condensed_upto("ns", "s").unwrap(), Some(b));
        assert_eq!(store.condensed_upto("ns", "s2").unwrap(), None);
        assert_eq!(store.last_decay_sweep().unwrap(), Some(-5));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    /// Recall's neighbouring-turn step reads a small session once and finds each hit's
    /// neighbours in memory: the same neighbours the store's scans find, whatever the
    /// times (repeated, far apart), the filter and the count.
    #[test]
    fn neighbours_in_a_session_read_once_equal_the_scans(
        gaps in proptest::collection::vec(prop_oneof![3 => 0i64..5, 1 => 0i64..100_000], 1..40),
        dropped in proptest::collection::vec(any::<bool>(), 40),
        n in 0usize..6,
        max_gap in prop_oneof![Just(10i64), Just(1_000), Just(i64::MAX / 4)],
    ) {
        let dir = tempfile::tempdir().unwrap();
        let store = open_store(dir.path(), Backend::Lmdb);
        let mut t = 1_700_000_000_000i64;
        let mut writes = Vec::new();
        for (i, gap) in gaps.iter().enumerate() {
            t += gap;
            let r = record(MemoryId(i as u32), 0, 1, format!("turn {i}"), t, false);
            writes.push(Mutation::Insert(Box::new(r)));
            // Another session between: never a neighbour.
            let other = record(MemoryId(100 + i as u32), 0, 2, "elsewhere".into(), t, false);
            writes.push(Mutation::Insert(Box::new(other)));
        }
        store.write(WriteSet(writes)).unwrap();
        let listing = store.session_listing("ns0", "s1", 1024).unwrap().unwrap();
        prop_assert_eq!(listing.len(), gaps.len());
        prop_assert!(store.session_listing("ns0", "s1", gaps.len() - 1).unwrap().is_none());
        let keep = |id: MemoryId| !dropped[id.0 as usize % 40];
        for &at in &listing {
            let scanned = store.session_neighbours("ns0", "s1", at, n, max_gap, keep).unwrap();
            prop_assert_eq!(neighbours_in(&listing, at, n, max_gap, keep), scanned);
        }
    }
}
