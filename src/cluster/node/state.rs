//! What a node is made of: its partitions (the lease it holds on each, its role there —
//! no copy, a warm standby following the log, or the owner with a runtime), the live
//! members as their heartbeats describe them, the node itself, and the timings they keep.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, kv};
use axum::Router;
use shadowbrain_actors::{Runtime, RuntimeConfig, WeakRuntime};
use shadowbrain_runtime::{Limits, Substrate};
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use super::super::Cluster;
use super::super::log::{JetStreamLog, Lease, LogCounters};
use super::super::parts::Asker;
use super::super::policy;
use super::super::seal::{Sealer, SeenNonces};
use super::super::snapshot::Snapshots;
use crate::auth::Auth;
use crate::http::ServerLimits;
use crate::http::dashboard::DashboardAccess;
use crate::metrics::{Metrics, Totals};

/// Entries a standby applies in one transaction at most.
pub(super) const APPLY_BATCH: usize = 512;

/// How long a standby's consumer may stay quiet before the stream is asked whether it is
/// behind (a consumer on a server that died notices late).
pub(super) const IDLE_CHECK: Duration = Duration::from_secs(2);

/// How old a standby's oldest unbuilt change may get before its indexes are built.
pub(super) const STANDBY_BUILD_DELAY: Duration = Duration::from_secs(30);

/// How long a standby's indexes wait after the last change before they are built.
pub(super) const STANDBY_QUIET: Duration = Duration::from_secs(5);

/// How long a standby waits for more entries before it applies what it has received in
/// one transaction. A takeover first catches the copy up, so this bounds what the linger
/// adds to one.
pub(super) const STANDBY_LINGER: Duration = Duration::from_millis(100);

/// How long a node waits for a partition's files to be released before it says it cannot
/// open them (the role task tries again later).
pub(super) const RELEASE_WAIT: Duration = Duration::from_secs(30);

/// How long a takeover waits for the standby to reach the stream's end.
pub(super) const CATCH_UP_LIMIT: Duration = Duration::from_secs(60);

/// How long a partition must stay out of a node's replica sets before the node deletes its
/// copy: a member whose heartbeat lapses for a moment (a loaded machine) must not make the
/// others drop and rebuild copies.
pub(super) const DROP_AFTER: Duration = Duration::from_secs(15);

/// How often the node that snapshots a partition asks how big its stream's tail is.
pub(super) const SNAPSHOT_ASK_EVERY: Duration = Duration::from_secs(10);

/// The least time between two snapshots of a partition by one node: under a write load
/// heavier than a snapshot's pace, the stream's tail grows instead of the node doing
/// nothing but snapshots.
pub(super) const SNAPSHOT_GAP: Duration = Duration::from_secs(30);

/// Changes a standby's indexes may lack for it to be snapshotted (below four times the
/// stream's threshold): what a close builds anyway.
pub(super) const SNAPSHOT_UNBUILT: u64 = shadowbrain_runtime::CLOSE_BUILD_LIMIT as u64;

/// Snapshots a node restores at once: a joining node's copies arrive a few at a time, so
/// those it is to own (restored first) are not slowed by all the others.
pub(super) const RESTORES_AT_ONCE: usize = 2;

/// How long a copy a node will keep only as a standby waits for the copies it is to own to
/// catch up before it is restored.
pub(super) const OWNED_FIRST_FOR: Duration = Duration::from_secs(60);

/// The live members, as their heartbeats in the members bucket say.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Members {
    /// Their names, sorted.
    pub(super) names: Vec<String>,
    /// The partitions each holds a caught-up copy of (owned, or a standby that reached the
    /// stream's end since it opened).
    pub(super) warm: BTreeMap<String, BTreeSet<u16>>,
    /// The members leaving the cluster (stopping gracefully): ranked after every other
    /// member, so the others take their partitions and copies while they still serve.
    pub(super) leaving: BTreeSet<String>,
}

/// What a node writes into the members bucket: that it is live, and its caught-up copies.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub(super) struct Heartbeat {
    #[serde(default)]
    pub(super) warm: Vec<u16>,
    /// The node is stopping and hands its partitions and copies on first.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(super) leaving: bool,
    /// How the node cuts the data into partitions (absent from nodes of before it was
    /// said): a node that says otherwise is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) layout: Option<Layout>,
}

/// What every node of a cluster must say alike: `[cluster] partitions` and `placement`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(super) struct Layout {
    pub(super) partitions: u16,
    pub(super) placement: super::super::Placement,
}

impl Layout {
    pub(super) fn of(cfg: &Cluster) -> Layout {
        Layout {
            partitions: cfg.partitions,
            placement: cfg.placement,
        }
    }
}

impl std::fmt::Display for Layout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let placement = match self.placement {
            super::super::Placement::Namespace => "namespace",
            super::super::Placement::Session => "session",
        };
        write!(
            f,
            "partitions = {} and placement = \"{placement}\"",
            self.partitions
        )
    }
}

impl Members {
    /// The nodes that should keep `partition`: the first `copies` of its rendezvous
    /// ranking (all of them in a smaller cluster).
    pub(super) fn replica_set(&self, partition: u16, copies: usize) -> Vec<&String> {
        let mut order = self.ranking(partition);
        order.truncate(copies);
        order
    }

    /// The members in the order they should keep `partition`: its rendezvous ranking,
    /// with the members that are leaving moved to its end (in the same order), so their
    /// copies fall out of replica sets that have other nodes to take them, and they own a
    /// partition only while no other copy of it has caught up.
    pub(super) fn ranking(&self, partition: u16) -> Vec<&String> {
        let mut order = super::super::ranked(partition, &self.names);
        order.sort_by_key(|n| self.leaving.contains(*n));
        order
    }

    /// Whether `node` said it holds a caught-up copy of `partition`.
    pub(super) fn is_warm(&self, node: &str, partition: u16) -> bool {
        self.warm.get(node).is_some_and(|w| w.contains(&partition))
    }

    /// Who should own `partition`, as node `me` sees it: the best-ranked live node whose
    /// copy is caught up, so a partition moves only to a node that can serve it within the
    /// takeover bound (a node that just joined is caught up first); the first of its
    /// replica set when no copy is. Whether `me`'s own copy is caught up is `me_warm`, not
    /// what its last heartbeat said: a node that just took a partition over, judged by its
    /// heartbeat of a moment before, would hand it on to a worse-ranked node, which would
    /// hand it back once that heartbeat caught up, and so on.
    pub(super) fn owner_for(&self, partition: u16, me: &str, me_warm: bool) -> Option<&String> {
        let order = self.ranking(partition);
        order
            .iter()
            .find(|n| match n.as_str() == me {
                true => me_warm,
                false => self.is_warm(n, partition),
            })
            .or(order.first())
            .copied()
    }
}

/// The lease a node holds, as its keeper knows it.
#[derive(Debug, Clone)]
pub(super) struct HeldLease {
    pub(super) revision: u64,
    pub(super) lease: Arc<Lease>,
}

/// A standby: the task applying the stream to the partition's standby substrate (its
/// store and its own indexes), and how far it got.
pub(super) struct Follower {
    pub(super) stop: CancellationToken,
    pub(super) task: tokio::task::JoinHandle<Substrate>,
    pub(super) applied: watch::Receiver<u64>,
}

/// An owned partition.
pub(super) struct Owned {
    pub(super) rt: Runtime,
    pub(super) log: Arc<JetStreamLog>,
    /// The lease the log appends under.
    pub(super) lease: Arc<Lease>,
    pub(super) rpc: tokio::task::JoinHandle<()>,
    /// Answers the other partitions' rounds (placed by session).
    pub(super) parts: Option<tokio::task::JoinHandle<()>>,
    /// Cancelled when the node steps down: the runtime's open MCP sessions end with it.
    pub(super) closing: CancellationToken,
    pub(super) epoch: u64,
}

pub(super) enum Role {
    /// No copy here: the partition's replica set does not name this node.
    Absent,
    Standby(Follower),
    Owner(Owned),
    /// Between the two (only while the role lock is held), or after a failure.
    Idle,
}

pub(super) struct Partition {
    pub(super) id: u16,
    /// The partition's data directory: a whole runtime's (`store/`, `vectors/`, `keywords/`).
    pub(super) dir: PathBuf,
    pub(super) key: String,
    pub(super) stream: String,
    pub(super) subject: String,
    pub(super) rpc_subject: String,
    pub(super) held: Mutex<Option<HeldLease>>,
    pub(super) changed: Notify,
    /// The keeper asks the role task to hand the partition over.
    pub(super) hand_over: AtomicBool,
    pub(super) role: tokio::sync::Mutex<Role>,
    /// The router of the owned runtime: the front's fast path.
    pub(super) router: RwLock<Option<Router>>,
    /// When the lease was first seen vacant (keeper only).
    pub(super) vacant_since: Mutex<Option<Instant>>,
    /// The runtime this node last closed here: who still holds it when its files are
    /// not free yet.
    pub(super) closed: Mutex<Option<WeakRuntime>>,
    /// This node's copy is caught up: owned, or a standby that reached the stream's end
    /// since it opened (told the others in the heartbeat).
    pub(super) warm: Arc<AtomicBool>,
    /// Since when the partition's replica set has not named this node (role task only).
    pub(super) unwanted_since: Mutex<Option<Instant>>,
    /// The stream was truncated beyond this node's copy (set by its standby): the copy
    /// must restore the latest snapshot before it can follow again.
    pub(super) behind: Arc<AtomicBool>,
    /// When this node last asked whether the partition needs a snapshot, and last took
    /// one (role task only).
    pub(super) snapshot_clock: Mutex<(Option<Instant>, Option<Instant>)>,
    /// A snapshot of this node's is being stored and the stream truncated.
    pub(super) storing: Arc<AtomicBool>,
    /// Changes this node's standby has applied that its indexes have not built yet (set
    /// by the standby as it applies the stream).
    pub(super) unbuilt: Arc<AtomicU64>,
}

impl Partition {
    pub(super) fn is_warm(&self) -> bool {
        self.warm.load(Ordering::Relaxed)
    }

    pub(super) fn set_warm(&self, warm: bool) {
        self.warm.store(warm, Ordering::Relaxed);
    }
}

pub(super) struct Node {
    /// This node, for the routers of the partitions it owns ([`NodeHandle`]); weak, since the
    /// node holds those routers.
    pub(super) me: Weak<Node>,
    pub(super) cfg: Cluster,
    pub(super) client: async_nats::Client,
    pub(super) js: jetstream::Context,
    pub(super) leases: kv::Store,
    pub(super) members: kv::Store,
    pub(super) live: watch::Receiver<Members>,
    pub(super) partitions: Vec<Arc<Partition>>,
    pub(super) rt_config: RuntimeConfig,
    pub(super) limits: Limits,
    pub(super) auth: Auth,
    pub(super) edge: ServerLimits,
    pub(super) metrics: Arc<Metrics>,
    pub(super) closing: CancellationToken,
    pub(super) max_entry: usize,
    pub(super) counters: Arc<LogCounters>,
    /// The cluster's I/O runtime: the NATS connection, the lease keepers and membership.
    pub(super) io: tokio::runtime::Handle,
    /// The main runtime: the partitions' runtimes and requests.
    pub(super) work: tokio::runtime::Handle,
    /// The policies the last cluster-wide reload made active: every runtime this node
    /// opens from then on runs them (`rt_config` holds the ones it started with).
    pub(super) reloaded: RwLock<Option<policy::Loaded>>,
    /// One reload applied at a time.
    pub(super) applying: tokio::sync::Mutex<()>,
    /// What the front needs to sign visitors in and see who they are.
    pub(super) door: DashboardAccess,
    /// Seals what this node tells the others, and checks what they tell it.
    pub(super) sealer: Arc<Sealer>,
    /// The forwarded requests answered lately (each is answered once).
    pub(super) seen: Arc<SeenNonces>,
    /// How this node's runtimes ask the other partitions (placed by session).
    pub(super) asker: Arc<Asker>,
    /// The dashboard pages the front answers itself: signing in and out, the assets.
    pub(super) front_ui: Router,
    /// What the runtimes this node closed had counted (`/metrics` counters never go back
    /// when a partition moves away).
    pub(super) retired: Mutex<Totals>,
    /// The partitions' snapshots in the object store.
    pub(super) snapshots: Arc<Snapshots>,
    /// Where this node writes and reads snapshot archives (`snapshots/` in its data
    /// directory).
    pub(super) scratch: PathBuf,
    /// Turns to restore a snapshot ([`RESTORES_AT_ONCE`]).
    pub(super) restores: tokio::sync::Semaphore,
    /// This node is stopping: its heartbeat says so, and it hands its partitions and
    /// copies on before it stops serving.
    pub(super) leaving: AtomicBool,
}

pub(super) fn partition_dir(data: &Path, p: u16) -> PathBuf {
    data.join("partitions").join(format!("p{p:03}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partition_moves_only_up_its_ranking_to_a_caught_up_copy() {
        let names: Vec<String> = (0..4).map(|i| format!("node{i}")).collect();
        let p = 5;
        let order: Vec<String> = super::super::super::ranked(p, &names)
            .into_iter()
            .cloned()
            .collect();
        let (first, second, third) = (&order[0], &order[1], &order[2]);
        let mut members = Members {
            names: names.clone(),
            ..Members::default()
        };
        // Nobody caught up: the first of the ranking.
        assert_eq!(members.owner_for(p, third, false), Some(first));
        // The second and third caught up: the second, whoever asks.
        for n in [second, third] {
            members.warm.entry(n.clone()).or_default().insert(p);
        }
        assert_eq!(members.owner_for(p, third, true), Some(second));
        assert_eq!(members.owner_for(p, first, false), Some(second));
        // The first, which just took the partition, counts its own copy as caught up
        // whatever its last heartbeat said: it keeps the partition.
        assert_eq!(members.owner_for(p, first, true), Some(first));
        assert_eq!(members.replica_set(p, 3), vec![first, second, third]);
        assert!(members.is_warm(second, p) && !members.is_warm(first, p));
    }

    #[test]
    fn a_leaving_member_hands_its_copies_on_and_owns_only_until_another_caught_up() {
        let names: Vec<String> = (0..5).map(|i| format!("node{i}")).collect();
        let p = 9;
        let order: Vec<String> = super::super::super::ranked(p, &names)
            .into_iter()
            .cloned()
            .collect();
        let mut members = Members {
            names: names.clone(),
            ..Members::default()
        };
        members.warm.entry(order[0].clone()).or_default().insert(p);
        // The owner leaves: it falls out of the replica set, the fourth-ranked node joins it.
        members.leaving.insert(order[0].clone());
        assert_eq!(
            members.replica_set(p, 3),
            vec![&order[1], &order[2], &order[3]]
        );
        // It keeps owning while no other copy has caught up...
        assert_eq!(members.owner_for(p, &order[0], true), Some(&order[0]));
        assert_eq!(members.owner_for(p, &order[1], false), Some(&order[0]));
        // ...and hands the partition to the best-ranked one that has.
        members.warm.entry(order[2].clone()).or_default().insert(p);
        assert_eq!(members.owner_for(p, &order[0], true), Some(&order[2]));
        // In a cluster with no one else to take a copy, a leaving node stays in the set,
        // last.
        let three = Members {
            names: order[..3].to_vec(),
            leaving: [order[0].clone()].into(),
            ..Members::default()
        };
        assert_eq!(
            three.replica_set(p, 3),
            vec![&order[1], &order[2], &order[0]]
        );
    }
}
