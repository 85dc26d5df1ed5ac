//! One cluster node: its partitions (owned, or kept as warm standbys), the lease keeper and
//! role task of each, the membership heartbeat, and the front router every request enters.
//!
//! Per partition two tasks cooperate. The **keeper** holds the lease: every quarter TTL it
//! refreshes a held lease (compare-and-set on its revision) or, when the lease is vacant and
//! rendezvous hashing names this node (or nobody took it for three TTLs), creates it. The
//! **role** task follows the keeper: with a lease it catches the standby up to the stream's
//! end and opens the partition's runtime on it, logging to JetStream; without one (or when
//! its log was fenced) it closes the runtime and goes back to following the stream. A node
//! that should no longer own a partition (its rendezvous winner is back) hands it over: it
//! closes the runtime first (its last writes logged), then deletes the lease.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use async_nats::jetstream::{self, consumer, kv, stream};
use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderName, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::{FutureExt, StreamExt};
use serde_json::json;
use shadowbrain_actors::{Runtime, RuntimeConfig, WeakRuntime};
use shadowbrain_runtime::{Backend, Limits, Substrate};
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use super::forward::{self, ANSWERED_BY};
use super::log::{self, JetStreamLog, Lease, LogCounters};
use super::policy;
use super::seal::{Sealer, SeenNonces};
use super::signins::{self, KvSignIns};
use super::{Cluster, partition_of, rendezvous};
use crate::api::ApiError;
use crate::auth::{Auth, AuthThrottle, Verified};
use crate::config::ConfigFile;
use crate::http::dashboard::{Door, Logins};
use crate::http::{ClusterNode, InCluster, NodeFuture};
use crate::http::{Drained, ServerLimits};
use crate::metrics::{Metrics, NodeFigures, Totals};

/// Entries a standby applies in one transaction at most.
const APPLY_BATCH: usize = 512;

/// How long a standby's consumer may stay quiet before the stream is asked whether it is
/// behind (a consumer on a server that died notices late).
const IDLE_CHECK: Duration = Duration::from_secs(2);

/// How old a standby's oldest unbuilt change may get before its indexes are built.
const STANDBY_BUILD_DELAY: Duration = Duration::from_secs(30);

/// How long a node waits for a partition's files to be released before it says it cannot
/// open them (the role task tries again later).
const RELEASE_WAIT: Duration = Duration::from_secs(30);

/// How long a takeover waits for the standby to reach the stream's end.
const CATCH_UP_LIMIT: Duration = Duration::from_secs(60);

/// The lease a node holds, as its keeper knows it.
#[derive(Debug, Clone)]
struct Held {
    revision: u64,
    lease: Arc<Lease>,
}

/// A standby: the task applying the stream to the partition's standby substrate (its
/// store and its own indexes), and how far it got.
struct Follower {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<Substrate>,
    applied: watch::Receiver<u64>,
}

/// An owned partition.
struct Owned {
    rt: Runtime,
    log: Arc<JetStreamLog>,
    /// The lease the log appends under.
    lease: Arc<Lease>,
    rpc: tokio::task::JoinHandle<()>,
    /// Cancelled when the node steps down: the runtime's open MCP sessions end with it.
    closing: CancellationToken,
    epoch: u64,
}

enum Role {
    Standby(Follower),
    Owner(Owned),
    /// Between the two (only while the role lock is held), or after a failure.
    Idle,
}

struct Partition {
    id: u16,
    /// The partition's data directory: a whole runtime's (`store/`, `vectors/`, `keywords/`).
    dir: PathBuf,
    key: String,
    stream: String,
    subject: String,
    rpc_subject: String,
    held: Mutex<Option<Held>>,
    changed: Notify,
    /// The keeper asks the role task to hand the partition over.
    hand_over: AtomicBool,
    role: tokio::sync::Mutex<Role>,
    /// The router of the owned runtime: the front's fast path.
    router: RwLock<Option<Router>>,
    /// When the lease was first seen vacant (keeper only).
    vacant_since: Mutex<Option<Instant>>,
    /// The runtime this node last closed here: who still holds it when its files are
    /// not free yet.
    closed: Mutex<Option<WeakRuntime>>,
}

struct Node {
    /// This node, for the routers of the partitions it owns ([`Lent`]); weak, since the
    /// node holds those routers.
    me: Weak<Node>,
    cfg: Cluster,
    client: async_nats::Client,
    js: jetstream::Context,
    leases: kv::Store,
    members: kv::Store,
    live: watch::Receiver<Vec<String>>,
    partitions: Vec<Arc<Partition>>,
    rt_config: RuntimeConfig,
    limits: Limits,
    auth: Auth,
    edge: ServerLimits,
    metrics: Arc<Metrics>,
    closing: CancellationToken,
    max_entry: usize,
    counters: Arc<LogCounters>,
    /// The cluster's I/O runtime: the NATS connection, the lease keepers and membership.
    io: tokio::runtime::Handle,
    /// The main runtime: the partitions' runtimes and requests.
    work: tokio::runtime::Handle,
    /// The policies the last cluster-wide reload made active: every runtime this node
    /// opens from then on runs them (`rt_config` holds the ones it started with).
    reloaded: RwLock<Option<policy::Loaded>>,
    /// One reload applied at a time.
    applying: tokio::sync::Mutex<()>,
    /// What the front needs to sign visitors in and see who they are.
    door: Door,
    /// Seals what this node tells the others, and checks what they tell it.
    sealer: Arc<Sealer>,
    /// The forwarded requests answered lately (each is answered once).
    seen: Arc<SeenNonces>,
    /// The dashboard pages the front answers itself: signing in and out, the assets.
    front_ui: Router,
    /// What the runtimes this node closed had counted (`/metrics` counters never go back
    /// when a partition moves away).
    retired: Mutex<Totals>,
}

fn partition_dir(data: &Path, p: u16) -> PathBuf {
    data.join("partitions").join(format!("p{p:03}"))
}

/// `serve --cluster`: joins the cluster, serves `listener` until `shutdown`, then hands
/// every owned partition over (its writes logged and its lease deleted) and stops.
pub async fn serve_cluster(
    listener: tokio::net::TcpListener,
    data: &Path,
    rt_config: RuntimeConfig,
    file: ConfigFile,
    cfg: Cluster,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<Drained> {
    // The NATS connection runs on a runtime of its own. The store's commit thread waits
    // for JetStream's acknowledgement while a request handler may wait for that commit on
    // a worker of the main runtime: were the connection driven by those workers, a few
    // such waits would starve it and nothing would ever be acknowledged. The lease keepers
    // run there too, so busy workers never let a lease lapse.
    let io = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("cluster-io")
        .enable_all()
        .build()
        .context("starting the cluster's I/O thread")?;
    let outcome = run_node(&io, listener, data, rt_config, file, cfg, shutdown).await;
    // Whatever happened: a runtime may not be dropped inside another one.
    io.shutdown_background();
    outcome
}

/// How long a starting node waits for the NATS servers (they may be starting too).
const CONNECT_PATIENCE: Duration = Duration::from_secs(30);

async fn run_node(
    io: &tokio::runtime::Runtime,
    listener: tokio::net::TcpListener,
    data: &Path,
    rt_config: RuntimeConfig,
    file: ConfigFile,
    cfg: Cluster,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<Drained> {
    let mut options = async_nats::ConnectOptions::new()
        .name(format!("shadowbrain {}", cfg.node))
        .connection_timeout(Duration::from_secs(5));
    if let Some((user, password)) = &cfg.user_password {
        options = options.user_and_password(user.clone(), password.clone());
    }
    if let Some(token) = &cfg.token {
        options = options.token(token.clone());
    }
    if let Some(seed) = &cfg.nkey_seed {
        options = options.nkey(seed.clone());
    }
    if let Some(path) = &cfg.credentials_file {
        options = options
            .credentials_file(path)
            .await
            .with_context(|| format!("[cluster] credentials_file `{}`", path.display()))?;
    }
    if let Some(tls) = &cfg.tls {
        options = options
            .require_tls(true)
            .add_root_certificates(tls.ca.clone());
        if let Some((cert, key)) = &tls.client {
            options = options.add_client_certificate(cert.clone(), key.clone());
        }
    }
    if cfg.insecure_loopback {
        // The servers' own list may name addresses off this machine; plain text goes only
        // to the loopback servers the config lists.
        options = options.ignore_discovered_servers();
    }
    let addrs = cfg
        .urls
        .iter()
        .map(|u| {
            u.parse::<async_nats::ServerAddr>().with_context(|| {
                format!("[cluster] urls: `{u}` is not a NATS URL (nats://host:port)")
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let started = Instant::now();
    let client = loop {
        let (options, addrs) = (options.clone(), addrs.clone());
        match io
            .spawn(async move { options.connect(addrs).await })
            .await?
        {
            Ok(client) => break Ok(client),
            Err(e) if started.elapsed() < CONNECT_PATIENCE => {
                tracing::info!(error = %e, "waiting for the NATS servers");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => break Err(e),
        }
    }
    .with_context(|| {
        format!(
            "connecting to NATS at {}; start the NATS servers (see docs/cluster.md) or \
                 fix [cluster] urls",
            cfg.urls.join(", ")
        )
    })?;
    let max_payload = client.server_info().max_payload;
    // Room for the headers and postcard's lengths; an entry is never split.
    let max_entry = max_payload.saturating_sub(4096).max(64 * 1024);
    let js = jetstream::new(client.clone());
    let bucket = |name: &str| kv::Config {
        bucket: format!("{}_{name}", cfg.prefix),
        history: 1,
        max_age: cfg.lease_ttl,
        num_replicas: cfg.replicas,
        storage: stream::StorageType::File,
        ..Default::default()
    };
    let leases = create_bucket(&js, bucket("leases")).await?;
    let members = create_bucket(&js, bucket("nodes")).await?;
    let sign_ins = create_bucket(
        &js,
        kv::Config {
            max_age: crate::http::dashboard::SIGN_IN_FOR,
            max_bytes: signins::MAX_BYTES,
            ..bucket("signins")
        },
    )
    .await?;
    let sealer = Arc::new(Sealer::new(&cfg.secret));
    let door = Door::new(
        Arc::new(file.auth.clone()),
        Arc::new(AuthThrottle::default()),
        Arc::new(Logins::shared(Arc::new(KvSignIns {
            bucket: sign_ins,
            sealer: sealer.clone(),
        }))),
    );
    ensure_name_free(&members, &cfg.node, cfg.lease_ttl).await?;
    let mut partitions = Vec::with_capacity(cfg.partitions as usize);
    for p in 0..cfg.partitions {
        let stream = format!("{}_P{p:03}", cfg.prefix.to_uppercase());
        let subject = format!("{}.log.{p:03}", cfg.prefix);
        js.get_or_create_stream(stream::Config {
            name: stream.clone(),
            subjects: vec![subject.clone()],
            storage: stream::StorageType::File,
            num_replicas: cfg.replicas,
            ..Default::default()
        })
        .await
        .with_context(|| {
            format!(
                "creating the stream {stream} ({} replicas); a NATS cluster of at least that \
                 many servers with JetStream enabled is needed",
                cfg.replicas
            )
        })?;
        let dir = partition_dir(data, p);
        partitions.push(Arc::new(Partition {
            id: p,
            key: format!("p{p:03}"),
            rpc_subject: format!("{}.rpc.{p:03}", cfg.prefix),
            stream,
            subject,
            dir,
            held: Mutex::new(None),
            changed: Notify::new(),
            hand_over: AtomicBool::new(false),
            role: tokio::sync::Mutex::new(Role::Idle),
            router: RwLock::new(None),
            vacant_since: Mutex::new(None),
            closed: Mutex::new(None),
        }));
    }
    let (live_tx, live) = watch::channel(Vec::new());
    let node = Arc::new_cyclic(|me| Node {
        me: me.clone(),
        front_ui: crate::http::dashboard::front(door.clone()),
        door,
        sealer,
        seen: Arc::new(SeenNonces::default()),
        client: client.clone(),
        js,
        leases,
        members,
        live,
        partitions,
        limits: file.limits,
        auth: file.auth,
        edge: file.server,
        metrics: Arc::new(Metrics::for_cluster()),
        retired: Mutex::new(Totals::default()),
        closing: CancellationToken::new(),
        max_entry,
        counters: Arc::new(LogCounters::default()),
        io: io.handle().clone(),
        work: tokio::runtime::Handle::current(),
        reloaded: RwLock::new(None),
        applying: tokio::sync::Mutex::new(()),
        rt_config,
        cfg,
    });
    for part in &node.partitions {
        let standby = node.open_standby(part).await?;
        *part.role.lock().await = Role::Standby(node.follow(part, standby));
    }
    let asks = client
        .subscribe(format!("{}.policy", node.cfg.prefix))
        .await
        .context("subscribing to policy reloads")?;
    let status_asks = client
        .subscribe(format!("{}.status", node.cfg.prefix))
        .await
        .context("subscribing to status asks")?;
    let stop = CancellationToken::new();
    let mut tasks = vec![io.spawn(membership(node.clone(), live_tx, stop.clone()))];
    tasks.push(tokio::spawn(answer_policy_asks(
        node.clone(),
        asks,
        stop.clone(),
    )));
    tasks.push(tokio::spawn(answer_status_asks(
        node.clone(),
        status_asks,
        stop.clone(),
    )));
    for part in &node.partitions {
        tasks.push(io.spawn(keeper(node.clone(), part.clone(), stop.clone())));
        tasks.push(tokio::spawn(role_task(
            node.clone(),
            part.clone(),
            stop.clone(),
        )));
    }
    tracing::info!(node = %node.cfg.node, partitions = node.cfg.partitions, "joined the cluster");

    let app = Router::new()
        .route("/healthz", axum::routing::get(healthz))
        .route("/cluster", axum::routing::get(status))
        .fallback(front)
        .with_state(node.clone());
    let counts = node.metrics.connections();
    let drained = crate::http::serve_app(
        listener,
        app,
        node.edge.clone().lingering_for(node.limits.max_body_bytes),
        counts,
        node.closing.clone(),
        shutdown,
    )
    .await;
    // Hand over: the keepers stop refreshing, each owned partition closes (its writes
    // logged) and its lease is deleted so another node takes it at once.
    stop.cancel();
    for t in tasks {
        let _ = t.await;
    }
    for part in &node.partitions {
        let mut role = part.role.lock().await;
        let held = part.held.lock().unwrap_or_else(|p| p.into_inner()).take();
        node.close_owned(part, &mut role, false).await;
        if let Some(held) = held {
            let _ = node
                .leases
                .delete_expect_revision(&part.key, Some(held.revision))
                .await;
        }
        if let Role::Standby(f) = std::mem::replace(&mut *role, Role::Idle) {
            stop_following(f).await;
        }
    }
    let _ = node.members.delete(&node.cfg.node).await;
    let _ = node.client.flush().await;
    drained
}

async fn create_bucket(js: &jetstream::Context, config: kv::Config) -> anyhow::Result<kv::Store> {
    let name = config.bucket.clone();
    match js.get_key_value(&name).await {
        Ok(store) => Ok(store),
        Err(_) => js
            .create_key_value(config)
            .await
            .or(js.get_key_value(&name).await.map_err(anyhow::Error::from))
            .with_context(|| format!("creating the KV bucket {name}")),
    }
}

/// Stops a standby and closes its substrate (its indexes saved), so that the partition's
/// files can be opened again.
async fn stop_following(follower: Follower) {
    follower.stop.cancel();
    match follower.task.await {
        Ok(standby) => {
            let closed = tokio::task::spawn_blocking(move || standby.close()).await;
            if let Ok(Err(e)) = closed {
                tracing::warn!(error = %e, "the standby did not close cleanly");
            }
        }
        Err(e) => tracing::error!(error = %e, "the standby's task failed"),
    }
}

/// The revision of `node`'s heartbeat when one is in the members bucket (`None`: none, or
/// it could not be read).
async fn heartbeat_of(members: &kv::Store, node: &str) -> Option<u64> {
    match members.entry(node).await {
        Ok(Some(e)) if e.operation == kv::Operation::Put => Some(e.revision),
        _ => None,
    }
}

/// Refuses to join while another live process heartbeats under this node's name. Two
/// processes with one name would each hold leases the other takes for its own, and the
/// partitions rendezvous hashing gives that name could stay without an owner. A
/// heartbeat a stopped process left is not refreshed and expires within a lease TTL:
/// one that is refreshed meanwhile is another process's.
async fn ensure_name_free(members: &kv::Store, node: &str, ttl: Duration) -> anyhow::Result<()> {
    let Some(first) = heartbeat_of(members, node).await else {
        return Ok(());
    };
    tracing::info!(
        node,
        "a heartbeat under this node's name is in the cluster; waiting for it to expire"
    );
    let until = Instant::now() + ttl * 2;
    while Instant::now() < until {
        tokio::time::sleep(ttl / 4).await;
        match heartbeat_of(members, node).await {
            None => return Ok(()),
            Some(revision) if revision != first => anyhow::bail!(
                "another process is running as node `{node}` in this cluster (its heartbeat \
                 in the members bucket is being refreshed); give every node its own \
                 [cluster] node name, or stop the other process first"
            ),
            Some(_) => {}
        }
    }
    Ok(())
}

/// Heartbeats this node into the members bucket and publishes who is live.
async fn membership(node: Arc<Node>, live: watch::Sender<Vec<String>>, stop: CancellationToken) {
    let period = node.cfg.lease_ttl / 4;
    loop {
        if let Err(e) = node.members.put(&node.cfg.node, "up".into()).await {
            tracing::warn!(error = %e, "cannot heartbeat into the members bucket");
        }
        match node.members.keys().await {
            Ok(keys) => {
                let mut names: Vec<String> = keys.filter_map(|k| async { k.ok() }).collect().await;
                if !names.contains(&node.cfg.node) {
                    names.push(node.cfg.node.clone());
                }
                names.sort();
                live.send_if_modified(|old| {
                    let changed = *old != names;
                    if changed {
                        tracing::info!(live = ?names, "cluster members");
                        *old = names;
                    }
                    changed
                });
            }
            Err(e) => tracing::warn!(error = %e, "cannot list the cluster members"),
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(period) => {}
        }
    }
}

/// Holds, refreshes, takes and gives up a partition's lease (see the module doc).
async fn keeper(node: Arc<Node>, part: Arc<Partition>, stop: CancellationToken) {
    let ttl = node.cfg.lease_ttl;
    let me = node.cfg.node.clone();
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(ttl / 4) => {}
        }
        let holder = match node.leases.entry(&part.key).await {
            Ok(Some(e)) if e.operation == kv::Operation::Put => {
                Some((String::from_utf8_lossy(&e.value).into_owned(), e.revision))
            }
            Ok(_) => None,
            Err(e) => {
                tracing::warn!(error = %e, partition = part.id, "cannot read the lease");
                continue;
            }
        };
        let live = node.live.borrow().clone();
        let desired = rendezvous(part.id, &live).cloned();
        let held = part.held.lock().unwrap_or_else(|p| p.into_inner()).clone();
        match held {
            Some(h) if holder.as_ref() == Some(&(me.clone(), h.revision)) => {
                if desired.as_ref().is_some_and(|d| *d != me) {
                    part.hand_over.store(true, Ordering::SeqCst);
                    part.changed.notify_one();
                }
                let sent = Instant::now();
                match node
                    .leases
                    .update(&part.key, me.clone().into(), h.revision)
                    .await
                {
                    Ok(revision) => {
                        h.lease.renew(revision, sent + ttl * 3 / 4);
                        if let Some(held) =
                            part.held.lock().unwrap_or_else(|p| p.into_inner()).as_mut()
                            && Arc::ptr_eq(&held.lease, &h.lease)
                        {
                            held.revision = revision;
                        }
                    }
                    Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => {
                        node.retake(&part, &h, desired.as_ref() == Some(&me)).await;
                    }
                    // A slow answer: keep trying; the lease's own deadline stops writes.
                    Err(e) => {
                        tracing::warn!(error = %e, partition = part.id, "cannot refresh the lease")
                    }
                }
            }
            Some(h) => node.retake(&part, &h, desired.as_ref() == Some(&me)).await,
            None => {
                if holder.is_some() {
                    *part.vacant_since.lock().unwrap_or_else(|p| p.into_inner()) = None;
                    continue;
                }
                let since = *part
                    .vacant_since
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get_or_insert_with(Instant::now);
                let mine = desired.as_ref() == Some(&me) || since.elapsed() > ttl * 3;
                if !mine {
                    continue;
                }
                let sent = Instant::now();
                if let Ok(revision) = node.leases.create(&part.key, me.clone().into()).await {
                    tracing::info!(partition = part.id, revision, "took the lease");
                    let lease = Arc::new(Lease::new(revision, sent + ttl * 3 / 4));
                    *part.held.lock().unwrap_or_else(|p| p.into_inner()) =
                        Some(Held { revision, lease });
                    *part.vacant_since.lock().unwrap_or_else(|p| p.into_inner()) = None;
                    part.changed.notify_one();
                }
            }
        }
    }
}

/// Makes the partition's role follow its lease (see the module doc).
async fn role_task(node: Arc<Node>, part: Arc<Partition>, stop: CancellationToken) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = part.changed.notified() => {}
            _ = tokio::time::sleep(node.cfg.lease_ttl / 4) => {}
        }
        let held = part.held.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let mut role = part.role.lock().await;
        match (&*role, held) {
            (Role::Standby(_), Some(h)) => {
                if let Err(e) = node.take(&part, &mut role, &h).await {
                    tracing::warn!(error = %format!("{e:#}"), partition = part.id, "could not take the partition over; giving the lease back");
                    node.give_back(&part, &h).await;
                }
            }
            (Role::Owner(o), Some(h)) => {
                if part.hand_over.swap(false, Ordering::SeqCst) {
                    tracing::info!(
                        partition = part.id,
                        "handing the partition over to its rendezvous owner"
                    );
                    node.step_down(&part, &mut role, true).await;
                    node.give_back(&part, &h).await;
                    continue;
                }
                let fenced = o.log.fenced();
                if fenced.is_none() && Arc::ptr_eq(&o.lease, &h.lease) {
                    continue;
                }
                // A newer lease of this node (the old one lapsed while NATS elected a
                // leader), or a fenced log: carry on under the held lease when the stream
                // ends where this store does, else catch up from the stream first (the
                // lease stays this node's while the keeper refreshes it).
                // Bounded: while JetStream elects a leader its API may not answer for
                // seconds, and stepping down then costs no more than waiting.
                let last = tokio::time::timeout(Duration::from_secs(2), node.stream_last(&part))
                    .await
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("the stream's state did not come")));
                let rearmed = last.as_ref().is_ok_and(|last| {
                    o.log
                        .rearm(h.lease.clone(), node.id_prefix(&part, &h), *last)
                });
                if rearmed {
                    tracing::info!(
                        partition = part.id,
                        epoch = h.revision,
                        "carrying on under a new lease"
                    );
                    if let Role::Owner(o) = &mut *role {
                        o.lease = h.lease.clone();
                        o.epoch = h.revision;
                    }
                } else if let Some(why) = fenced {
                    tracing::warn!(partition = part.id, %why, "the partition's log is fenced; catching up");
                    node.step_down(&part, &mut role, false).await;
                }
            }
            (Role::Owner(_), None) => node.step_down(&part, &mut role, false).await,
            (Role::Idle, _) => match node.open_standby_patiently(&part).await {
                Ok(standby) => *role = Role::Standby(node.follow(&part, standby)),
                Err(e) => {
                    tracing::error!(error = %format!("{e:#}"), partition = part.id, "cannot open the standby store")
                }
            },
            (Role::Standby(_), None) => {}
        }
    }
}

impl Node {
    fn id_prefix(&self, part: &Partition, held: &Held) -> String {
        format!("{}-{}-{}", self.cfg.node, part.id, held.revision)
    }

    /// The last sequence of the partition's stream.
    async fn stream_last(&self, part: &Partition) -> anyhow::Result<u64> {
        let mut stream = self.js.get_stream(&part.stream).await?;
        Ok(stream.info().await?.state.last_sequence)
    }

    /// Where the partition's stream ends, asked again while the lease is held: after a
    /// NATS restart the stream's API answers only once JetStream elected its leader
    /// (seconds), and giving the lease back meanwhile only started the takeover over.
    async fn stream_end_while_held(&self, part: &Partition, held: &Held) -> anyhow::Result<u64> {
        let started = Instant::now();
        loop {
            let asked = tokio::time::timeout(Duration::from_secs(2), self.stream_last(part)).await;
            match asked {
                Ok(Ok(end)) => return Ok(end),
                _ if held.lease.valid() && started.elapsed() < CATCH_UP_LIMIT => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Ok(Err(e)) => return Err(e.context("reading where the partition's stream ends")),
                Err(_) => anyhow::bail!("the partition's stream did not say where it ends"),
            }
        }
    }

    /// The held lease expired in NATS (it could not be refreshed for a TTL: a leader
    /// election, a NATS outage) or moved: take it again at once if it is vacant, so the
    /// partition's runtime carries on under the new lease (see `JetStreamLog::rearm`)
    /// instead of closing; otherwise give it up. Only the partition's rendezvous owner takes
    /// it again: a node handing it over (its lease just deleted) must not.
    async fn retake(&self, part: &Partition, held: &Held, rendezvous_owner: bool) {
        if !rendezvous_owner {
            tracing::info!(partition = part.id, "the lease expired or moved");
            self.lose(part, held);
            return;
        }
        let ttl = self.cfg.lease_ttl;
        let sent = Instant::now();
        match self
            .leases
            .create(&part.key, self.cfg.node.clone().into())
            .await
        {
            Ok(revision) => {
                tracing::info!(
                    partition = part.id,
                    revision,
                    "the lease lapsed in NATS; took it again"
                );
                held.lease.renew(held.lease.epoch(), Instant::now());
                let lease = Arc::new(Lease::new(revision, sent + ttl * 3 / 4));
                *part.held.lock().unwrap_or_else(|p| p.into_inner()) =
                    Some(Held { revision, lease });
                part.changed.notify_one();
            }
            Err(_) => {
                tracing::warn!(
                    partition = part.id,
                    "the lease expired or moved to another node"
                );
                self.lose(part, held);
            }
        }
    }

    /// The lease is gone: writes stop at once (the lease's deadline), and the role task
    /// steps down.
    fn lose(&self, part: &Partition, held: &Held) {
        held.lease.renew(held.lease.epoch(), Instant::now());
        let mut slot = part.held.lock().unwrap_or_else(|p| p.into_inner());
        if slot
            .as_ref()
            .is_some_and(|h| Arc::ptr_eq(&h.lease, &held.lease))
        {
            *slot = None;
        }
        drop(slot);
        part.changed.notify_one();
    }

    /// Deletes a lease this node holds, so another node may take it at once. The entry is
    /// read first: a refresh the keeper had in flight may have moved its revision on.
    async fn give_back(&self, part: &Partition, held: &Held) {
        self.lose(part, held);
        for _ in 0..3 {
            let revision = match self.leases.entry(&part.key).await {
                Ok(Some(e))
                    if e.operation == kv::Operation::Put
                        && *e.value == *self.cfg.node.as_bytes() =>
                {
                    e.revision
                }
                Ok(_) => return,
                Err(_) => continue,
            };
            match self
                .leases
                .delete_expect_revision(&part.key, Some(revision))
                .await
            {
                Ok(()) => return,
                Err(e) => {
                    tracing::debug!(error = %e, partition = part.id, "the lease was not deleted yet")
                }
            }
        }
    }

    /// Opens the partition's files as a standby: its store written only from the stream,
    /// its indexes built as the entries arrive by threads of its own, so that a takeover
    /// builds only the last changes (building all of a big partition's took a minute).
    async fn open_standby(&self, part: &Partition) -> anyhow::Result<Substrate> {
        let mut opts = self.rt_config.substrate.clone();
        opts.backend = Backend::Lmdb;
        opts.log = None;
        opts.standby = true;
        opts.indexing.background = true;
        // Nobody searches a standby: it builds three times less often than an owner (each
        // build has a cost of its own besides its items'), and what it has not built when
        // it takes over is built in the background after the takeover.
        opts.indexing.max_delay = STANDBY_BUILD_DELAY;
        let dir = part.dir.clone();
        tokio::task::spawn_blocking(move || Substrate::open(&dir, opts))
            .await?
            .with_context(|| format!("opening the standby of {}", part.dir.display()))
    }

    /// [`Node::open_standby`], retried for up to [`RELEASE_WAIT`] while the files are
    /// still held: the last requests of a runtime that just closed may hold it for a moment
    /// (up to 2.5 s seen under a saturating bulk load).
    async fn open_standby_patiently(&self, part: &Partition) -> anyhow::Result<Substrate> {
        let started = Instant::now();
        let mut said = false;
        loop {
            let attempt = Instant::now();
            match self.open_standby(part).await {
                Ok(standby) => {
                    if said {
                        // The open itself apart: it takes the change log's tail, which
                        // once passed for a long hold of the files.
                        tracing::info!(
                            partition = part.id,
                            waited_ms = (attempt - started).as_millis() as u64,
                            opened_ms = attempt.elapsed().as_millis() as u64,
                            "the partition's files were released; following it"
                        );
                    }
                    return Ok(standby);
                }
                Err(e) if started.elapsed() < RELEASE_WAIT => {
                    if !said {
                        said = true;
                        let closed = part
                            .closed
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .clone();
                        tracing::info!(
                            error = %format!("{e:#}"),
                            partition = part.id,
                            runtimes = closed.as_ref().map(|w| w.runtimes()),
                            substrates = closed.as_ref().map(|w| w.substrates()),
                            "the partition's files are not free yet; waiting"
                        );
                    }
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Starts applying the partition's stream to `standby`.
    fn follow(&self, part: &Partition, standby: Substrate) -> Follower {
        let stop = CancellationToken::new();
        let position = match standby.store().log_applied() {
            Ok(p) => p,
            Err(e) => {
                tracing::error!(error = %e, partition = part.id, "cannot read the standby's position");
                0
            }
        };
        let (tx, applied) = watch::channel(position);
        let task = tokio::spawn(follow(
            self.js.clone(),
            self.sealer.clone(),
            part.stream.clone(),
            part.id,
            standby,
            tx,
            stop.clone(),
        ));
        Follower {
            stop,
            task,
            applied,
        }
    }

    /// Standby → owner: catch up to the stream's end, open the runtime over the store with
    /// the log, and answer the partition's forwarded requests.
    async fn take(&self, part: &Partition, role: &mut Role, held: &Held) -> anyhow::Result<()> {
        let started = Instant::now();
        let Role::Standby(follower) = role else {
            return Ok(());
        };
        let end = self.stream_end_while_held(part, held).await?;
        let mut applied = follower.applied.clone();
        tokio::time::timeout(CATCH_UP_LIMIT, applied.wait_for(|a| *a >= end))
            .await
            .context("the standby did not catch up in time")??;
        let caught_up = started.elapsed();
        let Role::Standby(follower) = std::mem::replace(role, Role::Idle) else {
            unreachable!()
        };
        follower.stop.cancel();
        let standby = follower.task.await.context("the standby's task failed")?;
        let last = standby.store().log_applied()?;
        // Closing saves the standby's indexes (building a small unbuilt tail); the runtime
        // opens on them and takes the rest of the change log's tail (`reconcile`).
        tokio::task::spawn_blocking(move || standby.close())
            .await
            .context("closing the standby")??;
        let closed = started.elapsed();
        let log = Arc::new(JetStreamLog::new(
            self.js.clone(),
            self.sealer.clone(),
            self.io.clone(),
            part.subject.clone(),
            self.id_prefix(part, held),
            held.lease.clone(),
            last,
            self.max_entry,
            self.counters.clone(),
        ));
        let mut config = self.rt_config.clone();
        if let Some(loaded) = self.reloaded_policies() {
            config.substrate.policy = loaded.default;
            config.substrate.namespace_policies = loaded.namespaces;
        }
        config.data_dir = part.dir.clone();
        config.substrate.backend = Backend::Lmdb;
        config.substrate.log = Some(log.clone());
        let rt = match Runtime::open(config).await {
            Ok(rt) => rt,
            Err(e) => {
                *role = Role::Standby(self.follow(part, self.open_standby(part).await?));
                return Err(e).context("opening the partition's runtime");
            }
        };
        let closing = self.closing.child_token();
        let options = crate::http::Options {
            limits: self.limits,
            auth: self.auth.clone(),
            server: self.edge.clone(),
        };
        let wiring = crate::http::Wiring {
            work: Some(self.work.clone()),
            metrics: Some(self.metrics.clone()),
            closing: closing.clone(),
            cluster: Some(InCluster {
                logins: self.door.logins(),
                node: Arc::new(Lent(self.me.clone(), self.cfg.node.clone())),
                partition: part.id,
            }),
        };
        let router = crate::http::router_with(rt.clone(), options, wiring);
        let requests = self
            .client
            .queue_subscribe(part.rpc_subject.clone(), "owners".into())
            .await?;
        let rpc = tokio::spawn(forward::answer_forwarded(
            forward::Answerer {
                client: self.client.clone(),
                node: self.cfg.node.clone(),
                sealer: self.sealer.clone(),
                seen: self.seen.clone(),
            },
            requests,
            router.clone(),
        ));
        *part.router.write().unwrap_or_else(|p| p.into_inner()) = Some(router);
        tracing::info!(
            partition = part.id,
            epoch = held.revision,
            log_end = last,
            caught_up_ms = caught_up.as_millis() as u64,
            closed_ms = closed.as_millis() as u64,
            took_ms = started.elapsed().as_millis() as u64,
            "owning the partition"
        );
        *role = Role::Owner(Owned {
            rt,
            log,
            lease: held.lease.clone(),
            rpc,
            closing,
            epoch: held.revision,
        });
        Ok(())
    }

    fn reloaded_policies(&self) -> Option<policy::Loaded> {
        self.reloaded
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// `POST /v1/policy/reload` (an admin key): every live node reads its policy files;
    /// when all read the same valid policies, all make them active (see [`policy`]).
    async fn reload_policies(&self, authorization: Option<&str>) -> Response {
        if let Err(e) = self.auth.admin(
            authorization,
            "this acts on the whole cluster and needs an admin key (`role = \"admin\"` in \
             `[[auth.keys]]`); a tenant key reaches its own namespace only",
        ) {
            return e.into_response();
        }
        if let Err(e) = self.reload_everywhere().await {
            return e.into_response();
        }
        let loaded = match self.reloaded_policies() {
            Some(loaded) => loaded,
            // Not a member yet when the reload began: what every member made active.
            None => match policy::read(&self.rt_config) {
                Ok(loaded) => loaded,
                Err(e) => return e.into_response(),
            },
        };
        let semantic = self.rt_config.substrate.embedder.is_semantic();
        axum::Json(loaded.answer(semantic)).into_response()
    }

    /// This node's view: members, and per partition its role, epoch and applied position
    /// (`GET /cluster`, and this node's part of the dashboard's cluster overview).
    fn status(&self) -> serde_json::Value {
        let mut parts = Vec::new();
        for part in &self.partitions {
            // A takeover holds the role for as long as it takes (an index rebuild can take a
            // minute): say so rather than wait.
            let (name, epoch, applied, unbuilt) = match part.role.try_lock().as_deref() {
                Ok(Role::Owner(o)) => {
                    // Changes the indexes have not built yet (searched exactly meanwhile): a
                    // takeover of a big partition builds them in the background.
                    let sub = o.rt.substrate();
                    let unbuilt = json!({
                        "vectors": sub.vectors().pending(),
                        "keywords": sub.keywords().pending(),
                    });
                    ("owner", Some(o.epoch), None, Some(unbuilt))
                }
                Ok(Role::Standby(f)) => ("standby", None, Some(*f.applied.borrow()), None),
                Ok(Role::Idle) => ("idle", None, None, None),
                Err(_) => ("moving", None, None, None),
            };
            parts.push(json!({
                "partition": part.id,
                "role": name,
                "epoch": epoch,
                "applied": applied,
                "unbuilt": unbuilt,
            }));
        }
        let counters = &self.counters;
        json!({
            "node": self.cfg.node,
            "members": *self.live.borrow(),
            "partitions": parts,
            "log": {
                "entries": counters.entries.load(Ordering::Relaxed),
                "bytes": counters.bytes.load(Ordering::Relaxed),
                "retries": counters.retries.load(Ordering::Relaxed),
                "duplicates": counters.duplicates.load(Ordering::Relaxed),
            },
        })
    }

    /// `GET /metrics` (an admin key): this node's figures — the requests it answered, the
    /// runtimes of the partitions it owns (summed), its partitions by role and what it
    /// appended to the log. Each node is scraped on its own, as with any cluster.
    async fn metrics(&self, authorization: Option<&str>) -> Response {
        if let Err(e) = self.auth.admin(
            authorization,
            "GET /metrics needs an admin key (`role = \"admin\"` in `[[auth.keys]]`): it \
             shows every namespace's activity on this node",
        ) {
            return e.into_response();
        }
        // Read before the runtimes: a runtime closed in between is then counted in
        // neither (the counters catch up at the next scrape), never in both.
        let retired = *self.retired.lock().unwrap_or_else(|p| p.into_inner());
        let mut runtimes = Vec::new();
        let mut figures = NodeFigures::default();
        for part in &self.partitions {
            match part.role.try_lock().as_deref() {
                Ok(Role::Owner(o)) => {
                    figures.owner += 1;
                    runtimes.push(o.rt.clone());
                }
                Ok(Role::Standby(_)) => figures.standby += 1,
                Ok(Role::Idle) | Err(_) => figures.moving += 1,
            }
        }
        let counters = &self.counters;
        figures.members = self.live.borrow().len() as u64;
        figures.log_entries = counters.entries.load(Ordering::Relaxed);
        figures.log_bytes = counters.bytes.load(Ordering::Relaxed);
        figures.log_retries = counters.retries.load(Ordering::Relaxed);
        figures.log_duplicates = counters.duplicates.load(Ordering::Relaxed);
        self.metrics.set_node(figures);
        let text = self.metrics.render_all(&runtimes, retired).await;
        (
            [(
                axum::http::header::CONTENT_TYPE,
                crate::metrics::CONTENT_TYPE,
            )],
            text,
        )
            .into_response()
    }

    /// The check and the apply of a reload on every live node (see [`policy`]).
    async fn reload_everywhere(&self) -> Result<(), ApiError> {
        let subject = format!("{}.policy", self.cfg.prefix);
        let members = self.live.borrow().clone();
        let patience = self.cfg.forward_timeout;
        let checked = policy::ask_all(
            &self.client,
            &self.sealer,
            &subject,
            &policy::Ask::Check,
            &members,
            patience,
        )
        .await?;
        let expect = policy::agreed(&checked, false)?;
        let ask = policy::Ask::Apply { expect };
        let applied = policy::ask_all(
            &self.client,
            &self.sealer,
            &subject,
            &ask,
            &members,
            patience,
        )
        .await?;
        policy::agreed(&applied, true).map(|_| ())
    }

    /// Every live node's [`Node::status`], gathered over NATS; a member that did not
    /// answer in time is listed with `"answered": false`.
    async fn statuses(&self) -> Result<Vec<serde_json::Value>, ApiError> {
        let members = self.live.borrow().clone();
        let got = forward::gather(
            &self.client,
            &self.sealer,
            &format!("{}.status", self.cfg.prefix),
            Vec::new(),
            &members,
            Duration::from_secs(2),
            |v: serde_json::Value| (v["node"].as_str().unwrap_or("?").to_string(), v),
        )
        .await
        .map_err(|e| {
            let mut e = ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                format!("cannot reach the other nodes over NATS ({e}); retry shortly"),
            );
            e.retry_after = Some(1);
            e
        })?;
        let silent = members.iter().filter(|m| !got.contains_key(*m));
        let silent: Vec<serde_json::Value> = silent
            .map(|m| json!({"node": m, "answered": false}))
            .collect();
        Ok(got.into_values().chain(silent).collect())
    }

    /// This node's part of a reload: read the files; on `Apply`, make them active on every
    /// partition it owns and for every runtime it opens from now on.
    async fn answer_policy_ask(&self, ask: policy::Ask) -> policy::Outcome {
        let config = self.rt_config.clone();
        let read = tokio::task::spawn_blocking(move || policy::read(&config))
            .await
            .unwrap_or_else(|e| {
                Err(ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    format!("reading the policy files failed inside the server: {e}"),
                ))
            });
        let loaded = match read {
            Ok(loaded) => loaded,
            Err(e) => return policy::Outcome::failed(&e),
        };
        let stamps = loaded.stamps();
        let policy::Ask::Apply { expect } = ask else {
            return policy::Outcome::Read(stamps);
        };
        if stamps != expect {
            return policy::Outcome::failed(&ApiError::new(
                StatusCode::CONFLICT,
                "policy_changed",
                "the policy files changed between the check and the apply; reload again",
            ));
        }
        let _one = self.applying.lock().await;
        // Set first: a takeover under way reads it when it opens its runtime, or its role
        // lock, taken below, waits for it to end.
        *self.reloaded.write().unwrap_or_else(|p| p.into_inner()) = Some(loaded.clone());
        for part in &self.partitions {
            if let Role::Owner(o) = &*part.role.lock().await {
                o.rt.substrate()
                    .set_policies(loaded.default.clone(), loaded.namespaces.clone());
            }
        }
        for (namespace, stamp) in &stamps {
            tracing::info!(namespace = %namespace, name = %stamp.name, hash = %stamp.hash, "policy reloaded on every partition of this node");
        }
        policy::Outcome::Read(stamps)
    }

    /// Owner → standby: [`Node::close_owned`], then follow the stream again.
    async fn step_down(&self, part: &Partition, role: &mut Role, graceful: bool) {
        if !self.close_owned(part, role, graceful).await {
            return;
        }
        tracing::info!(partition = part.id, "following the partition as a standby");
        match self.open_standby_patiently(part).await {
            Ok(standby) => *role = Role::Standby(self.follow(part, standby)),
            Err(e) => {
                tracing::error!(error = %format!("{e:#}"), partition = part.id, "cannot open the standby store")
            }
        }
    }

    /// Owner → idle: stops answering for the partition and closes its runtime; whether it
    /// was owned. `graceful`: the runtime's last writes are logged before the log is
    /// fenced (a handover); otherwise the log is fenced first (the lease is gone).
    async fn close_owned(&self, part: &Partition, role: &mut Role, graceful: bool) -> bool {
        let Role::Owner(owned) = std::mem::replace(role, Role::Idle) else {
            return false;
        };
        *part.router.write().unwrap_or_else(|p| p.into_inner()) = None;
        owned.rpc.abort();
        owned.closing.cancel();
        if !graceful {
            owned
                .log
                .fence("this node no longer holds the partition's lease");
        }
        if let Err(e) = owned.rt.shutdown().await {
            tracing::warn!(error = %e, partition = part.id, "the partition's runtime did not close cleanly");
        }
        self.retired
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .add(&Totals::of(&owned.rt));
        *part.closed.lock().unwrap_or_else(|p| p.into_inner()) = Some(owned.rt.downgrade());
        owned.log.fence("the partition was handed over");
        true
    }
}

/// Applies the stream to `standby` from its applied position on, in batches, until stopped;
/// returns the standby. An ordered consumer delivers every entry once and in order (it
/// restarts itself on a gap); a broken one is recreated from the applied position.
async fn follow(
    js: jetstream::Context,
    sealer: Arc<Sealer>,
    stream: String,
    partition: u16,
    standby: Substrate,
    applied: watch::Sender<u64>,
    stop: CancellationToken,
) -> Substrate {
    'outer: while !stop.is_cancelled() {
        let start = *applied.borrow() + 1;
        let messages = async {
            let s = js.get_stream(&stream).await?;
            let c = s
                .create_consumer(consumer::pull::OrderedConfig {
                    deliver_policy: consumer::DeliverPolicy::ByStartSequence {
                        start_sequence: start,
                    },
                    ..Default::default()
                })
                .await?;
            anyhow::Ok(c.messages().await?)
        };
        let mut messages = tokio::select! {
            _ = stop.cancelled() => break,
            m = messages => match m {
                Ok(m) => m,
                Err(e) => {
                    tracing::debug!(error = %format!("{e:#}"), partition, "cannot follow the stream yet");
                    tokio::select! {
                        _ = stop.cancelled() => break,
                        _ = tokio::time::sleep(Duration::from_millis(500)) => continue,
                    }
                }
            }
        };
        loop {
            let first = tokio::select! {
                _ = stop.cancelled() => break 'outer,
                m = tokio::time::timeout(IDLE_CHECK, messages.next()) => m,
            };
            let Ok(first) = first else {
                // Quiet for a while: fine if the stream has nothing new, but a consumer
                // whose server died can stay quiet for half a minute before it notices.
                // If the stream is ahead of the replica, follow it again at once.
                let applied_now = *applied.borrow();
                let ahead = match js.get_stream(&stream).await {
                    Ok(mut s) => s
                        .info()
                        .await
                        .is_ok_and(|i| i.state.last_sequence > applied_now),
                    Err(_) => true,
                };
                if ahead {
                    tracing::debug!(
                        partition,
                        "the stream's consumer went quiet behind the stream; following again"
                    );
                    continue 'outer;
                }
                continue;
            };
            let mut batch = match first {
                Some(Ok(m)) => vec![m],
                Some(Err(e)) => {
                    tracing::debug!(error = %e, partition, "the stream's consumer broke; following again");
                    continue 'outer;
                }
                None => continue 'outer,
            };
            while batch.len() < APPLY_BATCH {
                match messages.next().now_or_never() {
                    Some(Some(Ok(m))) => batch.push(m),
                    _ => break,
                }
            }
            let entries: Vec<(u64, Vec<u8>)> = batch
                .iter()
                .filter_map(|m| {
                    let position = m.info().ok()?.stream_sequence;
                    Some((position, log::checked_entry(&sealer, m, position)))
                })
                .collect();
            let target = standby.clone();
            let done = tokio::task::spawn_blocking(move || target.apply_logged(entries)).await;
            match done {
                Ok(Ok(position)) => {
                    applied.send_replace(position);
                }
                Ok(Err(e)) => {
                    tracing::error!(error = %e, partition, "cannot apply the stream to the standby store");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue 'outer;
                }
                Err(e) => {
                    tracing::error!(error = %e, partition, "the standby's apply task failed");
                    continue 'outer;
                }
            }
        }
    }
    standby
}

/// Every request but `/healthz` and `/cluster`: answered by this node's runtime of the
/// caller's partition, or forwarded to its owner.
async fn front(State(node): State<Arc<Node>>, request: Request) -> Response {
    let path = request.uri().path();
    if crate::http::dashboard::is_dashboard(path) {
        return answered_by(&node, dashboard(&node, request).await);
    }
    if path == "/mcp" && request.method() != Method::POST {
        // Each POST stands alone (no protocol sessions, so a takeover never ends a
        // client's connection; see `crate::server::mcp_service`): there is no standalone
        // event stream to open (GET) nor session to end (DELETE). The MCP specification
        // lets a server answer 405, and clients carry on without them.
        let mut answer = ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            "in cluster mode /mcp serves each POST on its own, with no protocol session: \
             there is no event stream to open (GET) or session to end (DELETE); POST works",
        )
        .into_response();
        answer
            .headers_mut()
            .insert(axum::http::header::ALLOW, HeaderValue::from_static("POST"));
        return answered_by(&node, answer);
    }
    let header = request
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    if path == "/openapi.json" {
        // Public, as on one server, and the same on every node.
        return answered_by(&node, crate::http::get_openapi().await);
    }
    // Keys are checked here, at the node the client reached, with the failed-key throttle
    // of one server: a client without a valid key is answered 401, and 429 past the limit
    // of its address, before anything goes to another node.
    let ip = crate::http::client_ip_in(request.extensions());
    let caller = match node.door.caller(header, ip) {
        Ok((namespace, role)) => Verified {
            namespace,
            admin: role == crate::auth::Role::Admin,
            key: crate::auth::digest(crate::auth::bearer_token(header).unwrap_or_default()),
            client: ip,
            viewer: None,
        },
        Err(e) => return answered_by(&node, e.into_response()),
    };
    if path == "/v1/policy/reload" && request.method() == Method::POST {
        // Every partition's runtime, not only the admin namespace's.
        return answered_by(&node, node.reload_policies(header).await);
    }
    if path == "/metrics" && request.method() == Method::GET {
        // This node's own, not those of the node owning the admin namespace's partition.
        return answered_by(&node, node.metrics(header).await);
    }
    answered_by(&node, to_partition(&node, caller, request).await)
}

/// A dashboard page: signing in and out (whose sign-ins every node reads) and the assets
/// are answered here; every other page shows its visitor's namespace, so it goes to that
/// namespace's partition like a `/v1` request of the visitor's key would.
async fn dashboard(node: &Node, request: Request) -> Response {
    if crate::http::dashboard::served_by_front(request.uri().path()) {
        return match node.front_ui.clone().oneshot(request).await {
            Ok(r) => r,
            Err(never) => match never {},
        };
    }
    match crate::http::dashboard::visitor(&node.door, request).await {
        Ok((caller, request)) => to_partition(node, caller, request).await,
        Err(answer) => answer,
    }
}

/// Answers `caller`'s `request` with this node's runtime of the caller's partition, or
/// forwards it to the partition's owner.
async fn to_partition(node: &Node, caller: Verified, mut request: Request) -> Response {
    let part = &node.partitions[partition_of(&caller.namespace, node.cfg.partitions) as usize];
    let local = part
        .router
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    match local {
        Some(router) => {
            // The owner's router believes the caller the front verified, as it does a
            // forwarded request's.
            request.extensions_mut().insert(caller);
            match router.oneshot(request).await {
                Ok(r) => r,
                Err(never) => match never {},
            }
        }
        None => {
            let via = forward::Forwarder {
                client: &node.client,
                node: &node.cfg.node,
                sealer: &node.sealer,
                max_body: node.limits.max_body_bytes,
                deadline: node.cfg.forward_timeout,
            };
            forward::forward(&via, part.rpc_subject.clone(), caller, request).await
        }
    }
}

/// What the router of an owned partition may ask of its node ([`ClusterNode`]).
struct Lent(Weak<Node>, String);

impl Lent {
    fn node(&self) -> Result<Arc<Node>, ApiError> {
        self.0.upgrade().ok_or_else(|| {
            let mut e = ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "this node is stopping; retry shortly (another node takes its partitions)",
            );
            e.retry_after = Some(1);
            e
        })
    }
}

impl ClusterNode for Lent {
    fn name(&self) -> &str {
        &self.1
    }

    fn reload_policies(&self) -> NodeFuture<'_, ()> {
        Box::pin(async move { self.node()?.reload_everywhere().await })
    }

    fn statuses(&self) -> NodeFuture<'_, Vec<serde_json::Value>> {
        Box::pin(async move { self.node()?.statuses().await })
    }
}

/// Answers every node's asks for this node's [`Node::status`] until stopped.
async fn answer_status_asks(
    node: Arc<Node>,
    mut asks: async_nats::Subscriber,
    stop: CancellationToken,
) {
    while let Some((message, reply)) = next_ask(&mut asks, &stop).await {
        if let Err(e) = forward::open_ask(&node.sealer, &message, &reply) {
            tracing::warn!(error = %e, "refusing a status ask");
            continue;
        }
        // `status` waits for nothing (a partition that is moving says so).
        let body = serde_json::to_vec(&node.status()).expect("a status serializes");
        let payload = forward::seal_reply(&node.sealer, &reply, &body);
        if let Err(e) = node.client.publish(reply, payload.into()).await {
            tracing::warn!(error = %e, "cannot answer a status ask");
        }
    }
}

/// The next ask another node sent on `asks` (with the subject to answer it on), or `None`
/// once stopped or unsubscribed; asks that want no answer are skipped.
async fn next_ask(
    asks: &mut async_nats::Subscriber,
    stop: &CancellationToken,
) -> Option<(async_nats::Message, async_nats::Subject)> {
    loop {
        let message = tokio::select! {
            _ = stop.cancelled() => return None,
            m = asks.next() => m?,
        };
        if let Some(reply) = message.reply.clone() {
            return Some((message, reply));
        }
    }
}

/// Names this node as the one that answered, unless the owner that did already said so.
fn answered_by(node: &Node, mut answer: Response) -> Response {
    if !answer.headers().contains_key(ANSWERED_BY)
        && let Ok(v) = HeaderValue::from_str(&node.cfg.node)
    {
        answer
            .headers_mut()
            .insert(HeaderName::from_static(ANSWERED_BY), v);
    }
    answer
}

/// Answers the policy reloads of every node (this one's included), each on a task of its
/// own, until stopped.
async fn answer_policy_asks(
    node: Arc<Node>,
    mut asks: async_nats::Subscriber,
    stop: CancellationToken,
) {
    while let Some((message, reply)) = next_ask(&mut asks, &stop).await {
        let node = node.clone();
        let Ok(body) = forward::open_ask(&node.sealer, &message, &reply) else {
            tracing::warn!("refusing a policy ask without the cluster's seal");
            continue;
        };
        let ask = serde_json::from_slice::<policy::Ask>(body);
        tokio::spawn(async move {
            let outcome = match ask {
                Ok(ask) => node.answer_policy_ask(ask).await,
                Err(e) => policy::Outcome::failed(&ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_ask",
                    format!(
                        "an unreadable policy reload ask ({e}): are all nodes the same version?"
                    ),
                )),
            };
            let answer = policy::Reply {
                node: node.cfg.node.clone(),
                outcome,
            };
            let body = serde_json::to_vec(&answer).expect("a reply serializes");
            let payload = forward::seal_reply(&node.sealer, &reply, &body);
            if let Err(e) = node.client.publish(reply, payload.into()).await {
                tracing::warn!(error = %e, "cannot answer a policy reload");
            }
        });
    }
}

async fn healthz(State(node): State<Arc<Node>>) -> Response {
    axum::Json(json!({"status": "ok", "node": node.cfg.node})).into_response()
}

/// `GET /cluster`: this node's view — members, and per partition its role, epoch and
/// applied position. Needs an admin key when keys are configured.
async fn status(State(node): State<Arc<Node>>, request: Request<Body>) -> Response {
    let header = request
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let ip = crate::http::client_ip_in(request.extensions());
    if let Err(e) = node.door.caller(header, ip) {
        return e.into_response();
    }
    if let Err(e) = node.auth.admin(header, "GET /cluster needs an admin key") {
        return e.into_response();
    }
    axum::Json(node.status()).into_response()
}
