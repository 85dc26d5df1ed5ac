//! What a node is made of: its partitions (the lease it holds on each, its role there —
//! a warm standby following the log, or the owner with a runtime), the node itself, and the
//! timings they keep.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
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
use super::super::policy;
use super::super::seal::{Sealer, SeenNonces};
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

/// How long a node waits for a partition's files to be released before it says it cannot
/// open them (the role task tries again later).
pub(super) const RELEASE_WAIT: Duration = Duration::from_secs(30);

/// How long a takeover waits for the standby to reach the stream's end.
pub(super) const CATCH_UP_LIMIT: Duration = Duration::from_secs(60);

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
    /// Cancelled when the node steps down: the runtime's open MCP sessions end with it.
    pub(super) closing: CancellationToken,
    pub(super) epoch: u64,
}

pub(super) enum Role {
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
    pub(super) live: watch::Receiver<Vec<String>>,
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
    /// The dashboard pages the front answers itself: signing in and out, the assets.
    pub(super) front_ui: Router,
    /// What the runtimes this node closed had counted (`/metrics` counters never go back
    /// when a partition moves away).
    pub(super) retired: Mutex<Totals>,
}

pub(super) fn partition_dir(data: &Path, p: u16) -> PathBuf {
    data.join("partitions").join(format!("p{p:03}"))
}
