//! One cluster node: its partitions (owned, kept as warm standbys, or not kept here), the
//! lease keeper and role task of each, the membership heartbeat, and the front router every
//! request enters.
//!
//! Per partition two tasks cooperate. The **keeper** holds the lease: every quarter TTL it
//! refreshes a held lease (compare-and-set on its revision) or, when the lease is vacant and
//! rendezvous hashing names this node (or nobody took it for three TTLs), creates it. The
//! **role** task follows the keeper: with a lease it catches the standby up to the stream's
//! end and opens the partition's runtime on it, logging to JetStream; without one (or when
//! its log was fenced) it closes the runtime and goes back to following the stream. A node
//! that should no longer own a partition (a better-ranked node's copy is caught up) hands it
//! over: it closes the runtime first (its last writes logged), then deletes the lease. The
//! role task also keeps a copy only where the partition's replica set names this node:
//! it opens one when the set gains the node and deletes it once the set has gone on
//! without the node for a while and every node in it is caught up.
//!
//! By job: this file starts a node (NATS, the buckets, membership, the tasks of each
//! partition, the front's listener); `state` is what a node and its partitions are made of;
//! `roles` the keeper and role tasks; `copies` which partitions a node keeps, restoring,
//! snapshotting and deleting its copies; `front` the router every request enters and
//! `route` the partition it goes to; `operations` what acts on or shows the whole cluster.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use async_nats::jetstream::{self, kv, stream};
use axum::Router;
use futures::StreamExt;
use shadowbrain_actors::RuntimeConfig;
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use super::Cluster;
use super::log::LogCounters;
use super::parts::Asker;
use super::seal::{Sealer, SeenNonces};
use super::signins::{self, KvSignIns};
use super::snapshot::Snapshots;
use crate::auth::AuthThrottle;
use crate::config::ConfigFile;
use crate::http::Drained;
use crate::http::dashboard::{DashboardAccess, Logins};
use crate::metrics::{Metrics, Totals};
use front::{front, healthz, status};
use operations::{answer_policy_asks, answer_status_asks};
use roles::{keeper, role_task, stop_following};
use state::*;

mod copies;
mod front;
mod operations;
mod roles;
mod route;
mod state;

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

/// How long a starting node waits for the NATS servers (they may be starting too), and
/// then for JetStream to answer its set-up requests.
const CONNECT_PATIENCE: Duration = Duration::from_secs(30);

/// How long a snapshot's upload waits for the acknowledgement of each of its chunks.
const SNAPSHOT_ACK_WAIT: Duration = Duration::from_secs(60);

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
    let setup = Instant::now();
    let bucket = |name: &str| kv::Config {
        bucket: format!("{}_{name}", cfg.prefix),
        history: 1,
        max_age: cfg.lease_ttl,
        num_replicas: cfg.replicas,
        storage: stream::StorageType::File,
        ..Default::default()
    };
    let leases = patiently(setup, || create_bucket(&js, bucket("leases"))).await?;
    let members = patiently(setup, || create_bucket(&js, bucket("nodes"))).await?;
    let sign_ins = patiently(setup, || {
        create_bucket(
            &js,
            kv::Config {
                max_age: crate::http::dashboard::SIGN_IN_FOR,
                max_bytes: signins::MAX_BYTES,
                ..bucket("signins")
            },
        )
    })
    .await?;
    let sealer = Arc::new(Sealer::new(&cfg.secret));
    // A snapshot is hundreds of chunks, each published and acknowledged in turn: under a
    // write load that keeps the NATS servers busy, one acknowledgement can take longer
    // than the context's default 5 s, and a chunk's timeout failed the whole upload (the
    // stream then went untruncated until an upload got through). The snapshots' own
    // context waits longer for each.
    let mut snapshot_js = js.clone();
    snapshot_js.set_timeout(SNAPSHOT_ACK_WAIT);
    let snapshots = patiently(setup, || async {
        let js = &snapshot_js;
        let name = format!("{}_snapshots", cfg.prefix);
        let store = match js.get_object_store(&name).await {
            Ok(store) => store,
            Err(_) => js
                .create_object_store(jetstream::object_store::Config {
                    bucket: name.clone(),
                    description: Some("shadowbrain: the partitions' latest snapshots".into()),
                    num_replicas: cfg.replicas,
                    storage: stream::StorageType::File,
                    ..Default::default()
                })
                .await
                .or(js
                    .get_object_store(&name)
                    .await
                    .map_err(anyhow::Error::from))
                .with_context(|| format!("creating the object store {name}"))?,
        };
        anyhow::Ok(store)
    })
    .await?;
    let snapshots = Arc::new(Snapshots {
        store: snapshots,
        sealer: sealer.clone(),
    });
    let scratch = data.join("snapshots");
    // Archives a run stopped in the middle of are of no use.
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch).with_context(|| format!("creating {}", scratch.display()))?;
    let door = DashboardAccess::new(
        Arc::new(file.auth.clone()),
        Arc::new(AuthThrottle::default()),
        Arc::new(Logins::shared(Arc::new(KvSignIns {
            bucket: sign_ins,
            sealer: sealer.clone(),
        }))),
    );
    // The layout the cluster was made with, kept for its life (no expiry): a whole cluster
    // restarted with another one would find no live heartbeat to disagree with.
    let made = patiently(setup, || {
        create_bucket(
            &js,
            kv::Config {
                max_age: Duration::ZERO,
                ..bucket("cluster")
            },
        )
    })
    .await?;
    ensure_name_free(&members, &cfg.node, cfg.lease_ttl).await?;
    agree_layout(&members, &cfg).await?;
    // A bucket just made by another node may not answer for a moment.
    let recorded = patiently(setup, || recorded_layout(&made, &cfg)).await?;
    agree_recorded(recorded, &cfg)?;
    let mut partitions = Vec::with_capacity(cfg.partitions as usize);
    for p in 0..cfg.partitions {
        let stream = format!("{}_P{p:03}", cfg.prefix.to_uppercase());
        let subject = format!("{}.log.{p:03}", cfg.prefix);
        patiently(setup, || async {
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
                    "creating the stream {stream} ({} replicas); a NATS cluster of at least \
                     that many servers with JetStream enabled is needed",
                    cfg.replicas
                )
            })
        })
        .await?;
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
            warm: Arc::new(AtomicBool::new(false)),
            unwanted_since: Mutex::new(None),
            behind: Arc::new(AtomicBool::new(false)),
            snapshot_clock: Mutex::new((None, None)),
            storing: Arc::new(AtomicBool::new(false)),
            unbuilt: Arc::new(AtomicU64::new(0)),
        }));
    }
    let (live_tx, live) = watch::channel(Members::default());
    let asker = Arc::new(Asker {
        client: client.clone(),
        sealer: sealer.clone(),
        prefix: cfg.prefix.clone(),
        partitions: cfg.partitions,
        deadline: cfg.forward_timeout,
    });
    let node = Arc::new_cyclic(|me| Node {
        me: me.clone(),
        front_ui: crate::http::dashboard::front(door.clone()),
        door,
        sealer,
        seen: Arc::new(SeenNonces::default()),
        asker,
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
        snapshots,
        scratch,
        restores: tokio::sync::Semaphore::new(RESTORES_AT_ONCE),
        leaving: AtomicBool::new(false),
    });
    // The copies this node kept are followed again at once (a restart serves its share
    // soonest); the role tasks open the ones its replica sets name once the members are
    // known, and delete those they no longer name.
    for part in &node.partitions {
        if part.dir.exists() {
            let standby = node.open_standby(part).await?;
            *part.role.lock().await = Role::Standby(node.follow(part, standby));
        } else {
            *part.role.lock().await = Role::Absent;
        }
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
    // Told to stop, the node first hands on what it keeps, serving meanwhile (its front
    // forwards to the new owners); then the server drains.
    let leaving = node.clone();
    let shutdown = async move {
        shutdown.await;
        leaving.hand_on().await;
    };
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

/// Runs a JetStream set-up request again, a second apart, until it succeeds or
/// [`CONNECT_PATIENCE`] has passed since `setup`. JetStream servers that have just started
/// answer a stream or bucket creation with a timeout, "no leader" or "insufficient
/// resources" until they have met and elected a meta leader; a node started with them
/// waits for that instead of exiting. Past the patience, the last error stands.
async fn patiently<T, F, Fut>(setup: Instant, mut request: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<T>>,
{
    loop {
        match request().await {
            Ok(t) => return Ok(t),
            Err(e) if setup.elapsed() < CONNECT_PATIENCE => {
                tracing::info!(error = %format!("{e:#}"), "waiting for JetStream");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => return Err(e),
        }
    }
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

/// Refuses to join a cluster whose live members say another layout (`[cluster]
/// partitions` or `placement`) in their heartbeats: this node's requests would go to other
/// partitions than the data's, and its stores would hand out other ids. (Every node's
/// stores also record their id block, which refuses another number of partitions.)
async fn agree_layout(members: &kv::Store, cfg: &Cluster) -> anyhow::Result<()> {
    let mine = Layout::of(cfg);
    let mut names = members
        .keys()
        .await
        .context("listing the cluster's members")?;
    while let Some(name) = names.next().await {
        let Ok(name) = name else { continue };
        let Ok(Some(beat)) = members.get(&name).await else {
            continue;
        };
        let Ok(Heartbeat {
            layout: Some(theirs),
            ..
        }) = serde_json::from_slice::<Heartbeat>(&beat)
        else {
            continue;
        };
        anyhow::ensure!(
            theirs == mine,
            "node `{name}` of this cluster (prefix `{}`) runs with {theirs}, and this node's \
             [cluster] section says {mine}; both are fixed for a cluster's life: use the \
             cluster's values, or another prefix for a new cluster",
            cfg.prefix,
        );
    }
    Ok(())
}

/// The layout (`[cluster] partitions` and `placement`) the cluster was made with: this
/// node's, recorded in the cluster's bucket when it is the first node of a cluster (or of
/// one made before the layout was recorded), else the one recorded.
async fn recorded_layout(made: &kv::Store, cfg: &Cluster) -> anyhow::Result<Layout> {
    let mine = Layout::of(cfg);
    let bytes = serde_json::to_vec(&mine).expect("a layout serialises");
    match made.create(LAYOUT_KEY, bytes.into()).await {
        Ok(_) => {
            tracing::info!(layout = %mine, "recorded the cluster's layout");
            return Ok(mine);
        }
        Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => {}
        Err(e) => {
            return Err(e).with_context(|| {
                format!(
                    "recording the cluster's layout in `$KV.{}_cluster`; a secured cluster's \
                     NATS servers must let nodes publish there (docs/cluster/shadowbrain.conf)",
                    cfg.prefix
                )
            });
        }
    }
    let recorded = made
        .get(LAYOUT_KEY)
        .await
        .context("reading the cluster's layout")?
        .context("the cluster's layout was recorded, then deleted")?;
    serde_json::from_slice(&recorded).with_context(|| {
        format!(
            "the cluster's recorded layout (key `{LAYOUT_KEY}` of the bucket `{}_cluster`) is \
             unreadable; is every node on the same shadowbrain version?",
            cfg.prefix
        )
    })
}

/// Refuses to start with another layout than the one the cluster was made with
/// ([`recorded_layout`]): the partitions' data was placed by it, and a whole cluster
/// restarted with another (no live heartbeat left to disagree with) would route requests
/// to other partitions than the data's.
fn agree_recorded(recorded: Layout, cfg: &Cluster) -> anyhow::Result<()> {
    let mine = Layout::of(cfg);
    anyhow::ensure!(
        recorded == mine,
        "this cluster (prefix `{}`) was made with {recorded}, and this node's [cluster] section \
         says {mine}; both are fixed for a cluster's life (its data is placed by them): use \
         the cluster's values, or another prefix for a new cluster",
        cfg.prefix,
    );
    Ok(())
}

/// The key of the cluster's layout in its `cluster` bucket.
const LAYOUT_KEY: &str = "layout";

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

/// Heartbeats this node into the members bucket (with the partitions it holds caught-up
/// copies of) and publishes who is live and what they hold.
async fn membership(node: Arc<Node>, live: watch::Sender<Members>, stop: CancellationToken) {
    let period = node.cfg.lease_ttl / 4;
    loop {
        let beat = Heartbeat {
            warm: node
                .partitions
                .iter()
                .filter(|p| p.is_warm())
                .map(|p| p.id)
                .collect(),
            leaving: node.leaving.load(Ordering::SeqCst),
            layout: Some(Layout::of(&node.cfg)),
        };
        let beat = serde_json::to_vec(&beat).expect("a heartbeat serializes");
        if let Err(e) = node.members.put(&node.cfg.node, beat.into()).await {
            tracing::warn!(error = %e, "cannot heartbeat into the members bucket");
        }
        match read_members(&node.members).await {
            Ok(mut members) => {
                if !members.names.contains(&node.cfg.node) {
                    members.names.push(node.cfg.node.clone());
                    members.names.sort();
                }
                live.send_if_modified(|old| {
                    let changed = *old != members;
                    if changed {
                        if old.names != members.names {
                            tracing::info!(live = ?members.names, "cluster members");
                        }
                        *old = members;
                    }
                    changed
                });
            }
            Err(e) => tracing::warn!(error = %format!("{e:#}"), "cannot list the cluster members"),
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(period) => {}
        }
    }
}

/// Every member's heartbeat. One that cannot be read as a [`Heartbeat`] (a node of an
/// earlier version wrote `up`) is live with no caught-up copies.
async fn read_members(bucket: &kv::Store) -> anyhow::Result<Members> {
    let names: Vec<String> = bucket
        .keys()
        .await?
        .filter_map(|k| async { k.ok() })
        .collect()
        .await;
    let mut members = Members::default();
    for name in names {
        let Ok(Some(value)) = bucket.get(&name).await else {
            continue;
        };
        let beat: Heartbeat = serde_json::from_slice(&value).unwrap_or_default();
        members
            .warm
            .insert(name.clone(), beat.warm.into_iter().collect());
        if beat.leaving {
            members.leaving.insert(name.clone());
        }
        members.names.push(name);
    }
    members.names.sort();
    Ok(members)
}
