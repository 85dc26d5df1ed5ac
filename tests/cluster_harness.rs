//! The cluster harness's machinery, shared by the scenarios (`tests/cluster.rs`) and the
//! cost figures (`examples/cluster_bench.rs`): three real NATS servers (JetStream, file
//! storage, `sync_interval: always`) and three `shadowbrain serve --cluster` nodes on
//! 127.0.0.1 as child processes, paced writers that record every acknowledgement, and
//! readers of what the cluster stored and logged.
//!
//! Secured ([`Security::Secured`], the default) the servers and nodes run the example
//! configuration of `docs/cluster/` as docs/cluster.md tells an operator to: certificates from
//! `make-certs.sh`, an nkey per node and the cluster secret from `shadowbrain cluster
//! init`, `nats-server.conf` with `shadowbrain.conf` (TLS, an account, an nkey and
//! permissions per node), `node.toml` (TLS, its nkey, the secret); only the lines those
//! files mark "per server" or "per node" are changed.
// Each includer uses a part of it.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::Value;
use shadowbrain_test_support::serve::{Serve, Served};

pub const NODES: usize = 3;
pub const PARTITIONS: u16 = 8;
/// Nodes keeping a copy of each partition (`[cluster] copies`, its default).
pub const COPIES: usize = 3;

/// How big a harness is: the nodes configured (`cluster init` makes keys for all), how
/// many of them start with it (the rest can join later with [`Harness::start_node`]), and
/// each node's `copies`, and the cluster's partitions.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub nodes: usize,
    pub started: usize,
    pub copies: usize,
    pub partitions: u16,
    /// `[cluster] placement`: `namespace` or `session`.
    pub placement: &'static str,
}

impl Default for Shape {
    fn default() -> Self {
        Shape {
            nodes: NODES,
            started: NODES,
            copies: COPIES,
            partitions: PARTITIONS,
            placement: "namespace",
        }
    }
}
pub const LEASE_TTL: Duration = Duration::from_secs(3);
/// Namespaces with a key each: writers use the first ones.
pub const TENANTS: usize = 16;

/// The hex SHA-256 of a key, as the config file's `[[auth.keys]]` holds it.
pub fn sha256_hex(key: &str) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(key.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The NATS server of `scripts/install-nats-server`, or `None` (after saying so) when it
/// is not installed and `SHADOWBRAIN_REQUIRE_NATS` is unset.
pub fn nats_server() -> Option<PathBuf> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/nats-venv/bin/nats-server");
    if path.is_file() {
        return Some(path);
    }
    if std::env::var_os("SHADOWBRAIN_REQUIRE_NATS").is_some() {
        panic!(
            "SHADOWBRAIN_REQUIRE_NATS is set but {} is missing; run scripts/install-nats-server",
            path.display()
        );
    }
    eprintln!("skipped: the cluster harness needs the NATS server (scripts/install-nats-server)");
    None
}

/// `n` distinct free ports: all bound at once, then released (one at a time, the system may
/// hand the same port out twice, and a node then fails to listen).
pub fn free_ports(n: usize) -> Vec<u16> {
    let held: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    held.iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect()
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub struct Nats {
    pub name: String,
    pub port: u16,
    /// The monitoring port (`/varz`: bytes in and out).
    pub http: u16,
    pub conf: PathBuf,
    pub child: Option<Child>,
}

pub struct NodeProc {
    pub name: String,
    pub addr: SocketAddr,
    pub data: PathBuf,
    pub config: PathBuf,
    /// Its command line: `serve --cluster` on `addr` over `data` with `config`, the
    /// harness's environment and arguments, stderr appended to `<name>.log`.
    pub serve: Serve,
    /// The running node (`None`: killed, or not started again yet).
    pub served: Option<Served>,
}

impl NodeProc {
    /// This node's copy of partition `p` (a whole single-node data directory).
    pub fn partition_dir(&self, p: u16) -> PathBuf {
        self.data.join("partitions").join(format!("p{p:03}"))
    }
}

/// The namespaces the writers use, and their API keys (`[[auth.keys]]`).
pub fn keys() -> Vec<(String, String)> {
    (0..TENANTS)
        .map(|i| (format!("tenant-{i}"), format!("key-of-tenant-{i}")))
        .collect()
}
pub const ADMIN: &str = "the-admin-key";

/// The `[[auth.keys]]` of every tenant and of the admin key.
fn auth_keys() -> String {
    let mut auth = String::new();
    for (ns, key) in keys() {
        auth.push_str(&format!(
            "[[auth.keys]]\nsha256 = \"{}\"\nnamespace = \"{ns}\"\n",
            sha256_hex(&key)
        ));
    }
    auth.push_str(&format!(
        "[[auth.keys]]\nsha256 = \"{}\"\nnamespace = \"ops\"\nrole = \"admin\"\n",
        sha256_hex(ADMIN)
    ));
    auth
}

/// The `[embedder]` section every node and [`embedded_serve`] is given: `hash` unless
/// [`use_embedder`] said otherwise.
static EMBEDDER: Mutex<Option<&'static str>> = Mutex::new(Some("hash"));

/// The embedder the harness's `serve` processes run from now on: `Some(kind)`, or `None`
/// for no `[embedder]` section — `serve`'s default (the local model once installed).
pub fn use_embedder(kind: Option<&'static str>) {
    *EMBEDDER.lock().unwrap_or_else(|p| p.into_inner()) = kind;
}

fn embedder_section() -> String {
    match *EMBEDDER.lock().unwrap_or_else(|p| p.into_inner()) {
        Some(kind) => format!("[embedder]\nkind = \"{kind}\"\n\n"),
        None => String::new(),
    }
}

/// How the harness's NATS servers and nodes are configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Security {
    /// As `docs/cluster/` says: TLS, a NATS user and permissions per node, the cluster
    /// secret.
    Secured,
    /// Plain text, no users, no secret (`insecure_loopback = true`).
    InsecureLoopback,
}

/// The passwords of the secured configuration's other NATS users (the environment
/// variables `docs/cluster/shadowbrain.conf` reads).
pub const OPERATOR_PASSWORD: &str = "operator-password-of-the-harness";
pub const OTHER_PASSWORD: &str = "other-password-of-the-harness";

/// The `NAME=value` lines of an environment file `shadowbrain cluster init` wrote.
pub fn env_file(path: &Path) -> Vec<(String, String)> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// How to reach the harness's NATS servers as one of its users.
#[derive(Debug, Clone)]
pub struct NatsAccess {
    pub urls: Vec<String>,
    /// The CA of the servers' certificates, when they speak TLS.
    pub ca: Option<PathBuf>,
    /// A user and password, when the servers want one.
    pub user: Option<(String, String)>,
    /// Or an nkey seed.
    pub nkey: Option<String>,
}

impl NatsAccess {
    /// The same servers as another user (or none).
    pub fn as_user(&self, user: Option<(&str, &str)>) -> NatsAccess {
        NatsAccess {
            user: user.map(|(u, p)| (u.to_string(), p.to_string())),
            nkey: None,
            ..self.clone()
        }
    }

    /// The same servers, signing in with an nkey seed.
    pub fn with_nkey(&self, seed: &str) -> NatsAccess {
        NatsAccess {
            user: None,
            nkey: Some(seed.to_string()),
            ..self.clone()
        }
    }

    pub async fn connect(&self) -> Result<async_nats::Client, async_nats::ConnectError> {
        let addrs: Vec<async_nats::ServerAddr> =
            self.urls.iter().map(|u| u.parse().unwrap()).collect();
        let mut options = async_nats::ConnectOptions::new()
            .connection_timeout(Duration::from_secs(5))
            .ignore_discovered_servers();
        if let Some(ca) = &self.ca {
            options = options.require_tls(true).add_root_certificates(ca.clone());
        }
        if let Some((user, password)) = &self.user {
            options = options.user_and_password(user.clone(), password.clone());
        }
        if let Some(seed) = &self.nkey {
            options = options.nkey(seed.clone());
        }
        options.connect(addrs).await
    }
}

/// A file of `docs/cluster/`.
pub fn cluster_doc(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("docs/cluster")
        .join(name)
}

/// `text` with the value of each line marked `# {mark}` whose key is a key of `values`
/// replaced (in order of appearance, for keys that appear twice), and every such key
/// used: a change to the example that the harness no longer matches fails here.
fn per_line(text: &str, mark: &str, values: &[(&str, String)]) -> String {
    let mut used = vec![false; values.len()];
    let mut out = String::new();
    for line in text.lines() {
        let key = line
            .trim_start()
            .split([':', ' ', '='])
            .next()
            .unwrap_or("");
        let slot = line
            .contains(&format!("# {mark}"))
            .then(|| {
                values
                    .iter()
                    .enumerate()
                    .position(|(i, (k, _))| *k == key && !used[i])
            })
            .flatten();
        match slot {
            Some(i) => {
                used[i] = true;
                out.push_str(&values[i].1);
            }
            None => out.push_str(line),
        }
        out.push('\n');
    }
    for (i, (k, _)) in values.iter().enumerate() {
        assert!(
            used[i],
            "no line `{k}` marked `# {mark}` left in the example to set"
        );
    }
    out
}

/// One cluster at a time in a test process: each is three NATS servers and three to seven
/// nodes, and two at once on two cores (with the rest of the suite) made servers miss
/// their start and timings meaningless.
static ONE_CLUSTER_AT_A_TIME: Mutex<()> = Mutex::new(());

pub struct Harness {
    /// This harness's turn ([`ONE_CLUSTER_AT_A_TIME`]), given back when it is dropped.
    _turn: std::sync::MutexGuard<'static, ()>,
    pub dir: tempfile::TempDir,
    pub security: Security,
    pub bin: PathBuf,
    pub nats_bin: PathBuf,
    pub nats: Vec<Nats>,
    pub nodes: Vec<NodeProc>,
    pub shape: Shape,
}

/// Three NATS servers' configurations on fresh ports (routes, clients, monitoring), in
/// the cluster `cluster`.
fn nats_servers(dir: &Path, cluster: &str, security: Security) -> Vec<Nats> {
    let mut ports = free_ports(9).into_iter();
    let routes: Vec<u16> = ports.by_ref().take(3).collect();
    let route_list = routes
        .iter()
        .map(|p| format!("nats://127.0.0.1:{p}"))
        .collect::<Vec<_>>()
        .join(", ");
    let mut nats = Vec::new();
    for (i, route) in routes.iter().enumerate() {
        let port = ports.next().unwrap();
        let http = ports.next().unwrap();
        let name = format!("nats{i}");
        let conf = dir.join(format!("{name}.conf"));
        let others = routes
            .iter()
            .filter(|p| *p != route)
            .map(|p| format!("\"nats-route://127.0.0.1:{p}\""))
            .collect::<Vec<_>>()
            .join(", ");
        let secured = (security == Security::Secured).then(|| {
            let example = std::fs::read_to_string(cluster_doc("nats-server.conf")).unwrap();
            let example = per_line(
                &example,
                "per server",
                &[
                    ("server_name", format!("server_name: {name}")),
                    ("listen", format!("listen: 127.0.0.1:{port}")),
                    ("http", format!("http: 127.0.0.1:{http}")),
                    (
                        "store_dir",
                        format!("  store_dir: \"{}\"", dir.join(&name).display()),
                    ),
                    ("listen", format!("  listen: 127.0.0.1:{route}")),
                    ("routes", format!("  routes: [{others}]")),
                ],
            );
            // A cluster name of this harness's own (see `start_with`).
            let named = example.replace("  name: shadowbrain\n", &format!("  name: {cluster}\n"));
            assert_ne!(
                named, example,
                "the example names its cluster `shadowbrain`"
            );
            named
        });
        // Pings every second, two missed: a paused client's subscriptions go within
        // seconds, not the default two minutes.
        std::fs::write(
            &conf,
            secured.unwrap_or_else(|| format!(
                "server_name: {name}\nlisten: 127.0.0.1:{port}\nhttp: 127.0.0.1:{http}\n\
                 max_payload: 8MB\nping_interval: \"1s\"\nping_max: 2\n\
                 jetstream {{ store_dir: \"{}\", sync_interval: always }}\n\
                 cluster {{ name: {cluster}, listen: 127.0.0.1:{route}, routes: [{route_list}] }}\n",
                dir.join(&name).display()
            )),
        )
        .unwrap();
        nats.push(Nats {
            name,
            port,
            http,
            conf,
            child: None,
        });
    }
    nats
}

fn spawn_nats(bin: &Path, dir: &Path, n: &Nats) -> Child {
    let log = std::fs::File::options()
        .create(true)
        .append(true)
        .open(dir.join(format!("{}.log", n.name)))
        .unwrap();
    // In the directory of the TLS files and `shadowbrain.conf`, which the example names
    // relative to it; with the passwords it reads from the environment.
    let servers_env = dir.join("keys/nats-servers.env");
    let mut passwords = match servers_env.exists() {
        true => env_file(&servers_env),
        false => Vec::new(),
    };
    passwords.push(("SB_OPERATOR_PASSWORD".into(), OPERATOR_PASSWORD.into()));
    passwords.push(("SB_OTHER_PASSWORD".into(), OTHER_PASSWORD.into()));
    Command::new(bin)
        .arg("-c")
        .arg(&n.conf)
        .current_dir(dir)
        .envs(passwords)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("nats-server starts")
}

impl Nats {
    /// Whether this server runs and is the one its ports were chosen for: its monitoring
    /// port names it and its cluster, and its client port answers.
    fn is_ours(&mut self, cluster: &str) -> bool {
        // Generous: with other cluster tests and the Python package's build sharing two
        // cores, a server with JetStream has been seen to take seconds to answer.
        let until = Instant::now() + Duration::from_secs(30);
        let http: SocketAddr = format!("127.0.0.1:{}", self.http).parse().unwrap();
        while Instant::now() < until {
            if self
                .child
                .as_mut()
                .is_none_or(|c| c.try_wait().ok().flatten().is_some())
            {
                return false;
            }
            if let Ok((200, varz, _)) = request(http, "GET", "/varz", None, None, None) {
                return varz["server_name"] == self.name.as_str()
                    && varz["cluster"]["name"] == cluster
                    && varz["port"] == self.port
                    && TcpStream::connect(("127.0.0.1", self.port)).is_ok();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }
}

impl Harness {
    /// Starts the three NATS servers and the three nodes, with `env` in every node's
    /// environment, and waits until every partition has an owner.
    pub fn start(nats_bin: &Path, bin: &Path, env: &[(&str, &str)]) -> Harness {
        Harness::start_with(nats_bin, bin, env, &[])
    }

    /// [`Harness::start`], with `args` added to every node's `serve` command.
    pub fn start_with(nats_bin: &Path, bin: &Path, env: &[(&str, &str)], args: &[&str]) -> Harness {
        Harness::start_as(Security::Secured, nats_bin, bin, env, args)
    }

    /// [`Harness::start_with`], configured as `security` says.
    pub fn start_as(
        security: Security,
        nats_bin: &Path,
        bin: &Path,
        env: &[(&str, &str)],
        args: &[&str],
    ) -> Harness {
        Harness::start_shaped(security, nats_bin, bin, env, args, Shape::default())
    }

    /// [`Harness::start_as`] with `shape.nodes` nodes configured, the first
    /// `shape.started` of them started.
    pub fn start_shaped(
        security: Security,
        nats_bin: &Path,
        bin: &Path,
        env: &[(&str, &str)],
        args: &[&str],
        shape: Shape,
    ) -> Harness {
        // A test that failed with its cluster up poisoned nothing of ours.
        let turn = ONE_CLUSTER_AT_A_TIME
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let dir = tempfile::tempdir().unwrap();
        if security == Security::Secured {
            let made = Command::new("sh")
                .arg(cluster_doc("make-certs.sh"))
                .arg(dir.path())
                .output()
                .expect("sh runs docs/cluster/make-certs.sh");
            assert!(
                made.status.success(),
                "docs/cluster/make-certs.sh (needs openssl, which scripts/install-nats-server \
                 installs): {}",
                String::from_utf8_lossy(&made.stderr)
            );
            // The example names three nodes and says to add one line per node.
            let example = std::fs::read_to_string(cluster_doc("shadowbrain.conf")).unwrap();
            let last = "      {nkey: $SB_NODE2_NKEY, permissions: $NODE}\n";
            assert!(example.contains(last), "the example's node lines changed");
            let more: String = (3..shape.nodes)
                .map(|i| format!("      {{nkey: $SB_NODE{i}_NKEY, permissions: $NODE}}\n"))
                .collect();
            std::fs::write(
                dir.path().join("shadowbrain.conf"),
                example.replace(last, &format!("{last}{more}")),
            )
            .unwrap();
            let init = Command::new(bin)
                .args([
                    "cluster",
                    "init",
                    "--nodes",
                    &shape.nodes.to_string(),
                    "--dir",
                ])
                .arg(dir.path().join("keys"))
                .output()
                .expect("shadowbrain cluster init runs");
            assert!(
                init.status.success(),
                "shadowbrain cluster init: {}",
                String::from_utf8_lossy(&init.stderr)
            );
        }
        // A NATS cluster name of this harness's own: another harness's servers (tests run
        // in parallel) can never route into this cluster.
        let cluster: String = dir
            .path()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .chars()
            .filter(char::is_ascii_alphanumeric)
            .collect();
        let cluster = format!("sb{cluster}");
        let mut nats = Vec::new();
        for attempt in 1.. {
            nats = nats_servers(dir.path(), &cluster, security);
            for n in &mut nats {
                n.child = Some(spawn_nats(nats_bin, dir.path(), n));
            }
            if nats.iter_mut().all(|n| n.is_ours(&cluster)) {
                break;
            }
            // A port chosen was taken before the server bound it (another test): were
            // the nodes pointed at it they would join whatever listens there.
            for n in &mut nats {
                if let Some(mut c) = n.child.take() {
                    let _ = c.kill();
                    let _ = c.wait();
                }
            }
            if attempt == 5 {
                // What the servers said, since the directory goes with the panic.
                let said: String = nats
                    .iter()
                    .map(|n| {
                        let log =
                            std::fs::read_to_string(dir.path().join(format!("{}.log", n.name)))
                                .unwrap_or_default();
                        let tail: Vec<&str> = log.lines().rev().take(8).collect();
                        format!(
                            "\n{}:\n{}",
                            n.name,
                            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                        )
                    })
                    .collect();
                panic!(
                    "the NATS servers did not start on free ports in 5 attempts; the last lines of their logs:{said}"
                );
            }
        }
        let mut ports = free_ports(shape.nodes).into_iter();
        let scheme = match security {
            Security::Secured => "tls",
            Security::InsecureLoopback => "nats",
        };
        let urls = nats
            .iter()
            .map(|n| format!("\"{scheme}://127.0.0.1:{}\"", n.port))
            .collect::<Vec<_>>()
            .join(", ");
        let auth = auth_keys();
        let mut nodes = Vec::new();
        for i in 0..shape.nodes {
            let name = format!("node{i}");
            let config = dir.path().join(format!("{name}.toml"));
            let cluster = match security {
                Security::Secured => {
                    let example = std::fs::read_to_string(cluster_doc("node.toml")).unwrap();
                    per_line(
                        &example,
                        "per node",
                        &[("node", format!("node = \"{name}\""))],
                    )
                    .lines()
                    .map(|line| {
                        if line.starts_with("urls = ") {
                            format!("urls = [{urls}]")
                        } else if line.starts_with("tls_ca = ") {
                            format!("tls_ca = \"{}\"", dir.path().join("ca.pem").display())
                        } else {
                            line.to_string()
                        }
                    })
                    .collect::<Vec<_>>()
                    .join("\n")
                }
                Security::InsecureLoopback => format!(
                    "[cluster]\nurls = [{urls}]\nnode = \"{name}\"\ninsecure_loopback = true"
                ),
            };
            std::fs::write(
                &config,
                format!(
                    "{}{auth}\n{cluster}\npartitions = {}\nplacement = \"{}\"\n\
                     copies = {}\nlease_ttl = \"{}s\"\n",
                    embedder_section(),
                    shape.partitions,
                    shape.placement,
                    shape.copies,
                    LEASE_TTL.as_secs()
                ),
            )
            .unwrap();
            let addr = format!("127.0.0.1:{}", ports.next().unwrap())
                .parse()
                .unwrap();
            let data = dir.path().join(&name);
            // What docs/cluster/node.toml names: this node's nkey seed, the secret; then
            // the harness's own environment (fault injection).
            let keys = match security {
                Security::Secured => env_file(&dir.path().join(format!("keys/{name}.env"))),
                Security::InsecureLoopback => Vec::new(),
            };
            let serve = Serve::new(bin)
                .cluster()
                .addr(addr)
                .data(&data)
                .config_file(&config)
                .args(args)
                .env("RUST_LOG", "info,async_nats=warn")
                .envs(keys)
                .envs(env.iter().copied())
                .log(dir.path().join(format!("{name}.log")));
            nodes.push(NodeProc {
                name,
                addr,
                data,
                config,
                serve,
                served: None,
            });
        }
        let mut h = Harness {
            _turn: turn,
            dir,
            security,
            bin: bin.to_path_buf(),
            nats_bin: nats_bin.to_path_buf(),
            nats,
            nodes,
            shape,
        };
        for i in 0..shape.started {
            h.start_node(i);
        }
        h.wait_ready();
        h.wait_settled(Duration::from_secs(90));
        h
    }

    /// Until every node printed its ready line; a node that exited first (another test
    /// took its port between our choosing and its binding) is started again on a new port.
    fn wait_ready(&mut self) {
        let until = Instant::now() + Duration::from_secs(90);
        for i in 0..self.nodes.len() {
            if self.nodes[i].served.is_none() {
                continue;
            }
            loop {
                let left = until.saturating_duration_since(Instant::now());
                let served = self.nodes[i].served.as_mut().unwrap();
                let not = match served.wait_ready(left) {
                    Ok(()) => break,
                    Err(not) => not,
                };
                assert!(
                    not.exited.is_some() && !left.is_zero(),
                    "{}: {not}; logs in {}",
                    self.nodes[i].name,
                    self.dir.path().display()
                );
                let n = &mut self.nodes[i];
                n.addr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
                n.serve = n.serve.clone().addr(n.addr);
                self.start_node(i);
            }
        }
    }

    pub fn start_nats(&mut self, i: usize) {
        let child = spawn_nats(&self.nats_bin, self.dir.path(), &self.nats[i]);
        self.nats[i].child = Some(child);
    }

    /// Starts node `i` again, as it was first started, without waiting for it.
    pub fn start_node(&mut self, i: usize) {
        let n = &mut self.nodes[i];
        n.served = Some(n.serve.clone().spawn());
    }

    pub fn signal(&mut self, pid: u32, signal: &str) {
        let ok = Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {signal} {pid}");
    }

    pub fn kill_node(&mut self, i: usize) {
        self.nodes[i].served.take().unwrap().kill();
    }

    pub fn kill_nats(&mut self, i: usize) {
        let mut child = self.nats[i].child.take().unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
    }

    pub fn node_pid(&self, i: usize) -> u32 {
        self.nodes[i].served.as_ref().unwrap().pid()
    }

    pub fn alive_nodes(&self) -> Vec<SocketAddr> {
        self.nodes
            .iter()
            .filter(|n| n.served.is_some())
            .map(|n| n.addr)
            .collect()
    }

    /// Each node's `/cluster` view (`None`: not answering).
    pub fn status(&self, i: usize) -> Option<Value> {
        let (code, body, _) = request(
            self.nodes[i].addr,
            "GET",
            "/cluster",
            Some(ADMIN),
            None,
            None,
        )
        .ok()?;
        (code == 200).then_some(body)
    }

    /// Partitions each node owns.
    pub fn owned(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .map(|i| {
                self.status(i).map_or(0, |s| {
                    s["partitions"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .filter(|p| p["role"] == "owner")
                        .count()
                })
            })
            .collect()
    }

    /// Until the live nodes agree on the members and every partition is owned by the
    /// member rendezvous hashing picks for it (the handovers a join or a loss starts are
    /// done), the same for half a lease period. Owners stable for a while are not enough: a
    /// node that joins late (a loaded machine) is handed its partitions seconds after the
    /// others have settled among themselves.
    pub fn wait_settled(&self, limit: Duration) {
        let until = Instant::now() + limit;
        let mut last = BTreeMap::new();
        let mut since = Instant::now();
        loop {
            let owners = self.owners();
            if owners != last {
                last = owners;
                since = Instant::now();
            } else if last.len() == self.shape.partitions as usize
                && self.rendezvous_owners().as_ref() == Some(&last)
                && since.elapsed() >= LEASE_TTL / 2
            {
                return;
            }
            assert!(
                Instant::now() < until,
                "the partitions did not settle: owners {last:?}, rendezvous over the members \
                 {:?}; logs in {}",
                self.rendezvous_owners(),
                self.dir.path().display()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The owner rendezvous hashing picks for each partition among the members the live
    /// nodes agree on (`None` while they do not agree, or one does not answer).
    fn rendezvous_owners(&self) -> Option<BTreeMap<u16, String>> {
        let members = self.agreed_members()?;
        (0..self.shape.partitions)
            .map(|p| Some((p, shadowbrain::cluster::rendezvous(p, &members)?.clone())))
            .collect()
    }

    /// The members the live nodes agree on, sorted (`None` while they do not agree, or one
    /// does not answer).
    pub fn agreed_members(&self) -> Option<Vec<String>> {
        let mut agreed: Option<Vec<String>> = None;
        for i in 0..self.nodes.len() {
            if self.nodes[i].served.is_none() {
                continue;
            }
            let status = self.status(i)?;
            let mut members: Vec<String> = status["members"]
                .as_array()?
                .iter()
                .filter_map(|m| m.as_str().map(str::to_string))
                .collect();
            members.sort();
            match &agreed {
                Some(seen) if *seen != members => return None,
                _ => agreed = Some(members),
            }
        }
        agreed
    }

    /// Each partition's replica set among the agreed members: the first `copies` nodes
    /// rendezvous hashing ranks for it.
    pub fn replica_sets(&self) -> Option<BTreeMap<u16, BTreeSet<String>>> {
        let members = self.agreed_members()?;
        Some(
            (0..self.shape.partitions)
                .map(|p| {
                    let set = shadowbrain::cluster::ranked(p, &members)
                        .into_iter()
                        .take(self.shape.copies)
                        .cloned()
                        .collect();
                    (p, set)
                })
                .collect(),
        )
    }

    /// Which live nodes keep a copy of each partition (owner or standby), as they say, and
    /// which nodes (live or not) have a copy's directory on disk.
    pub fn copies(
        &self,
    ) -> (
        BTreeMap<u16, BTreeSet<String>>,
        BTreeMap<u16, BTreeSet<String>>,
    ) {
        let mut kept: BTreeMap<u16, BTreeSet<String>> = BTreeMap::new();
        let mut on_disk: BTreeMap<u16, BTreeSet<String>> = BTreeMap::new();
        for (i, n) in self.nodes.iter().enumerate() {
            for p in 0..self.shape.partitions {
                if n.partition_dir(p).exists() {
                    on_disk.entry(p).or_default().insert(n.name.clone());
                }
            }
            if n.served.is_none() {
                continue;
            }
            if let Some(s) = self.status(i) {
                for part in s["partitions"].as_array().unwrap() {
                    if part["role"] == "owner" || part["role"] == "standby" {
                        let p = part["partition"].as_u64().unwrap() as u16;
                        kept.entry(p).or_default().insert(n.name.clone());
                    }
                }
            }
        }
        (kept, on_disk)
    }

    /// Until every partition is kept by exactly its replica set among the live members,
    /// and no live node has a directory for a partition it does not keep.
    pub fn wait_copies_settled(&self, limit: Duration) {
        let until = Instant::now() + limit;
        loop {
            let sets = self.replica_sets();
            let (kept, on_disk) = self.copies();
            let live: BTreeSet<String> = self
                .nodes
                .iter()
                .filter(|n| n.served.is_some())
                .map(|n| n.name.clone())
                .collect();
            let live_on_disk: BTreeMap<u16, BTreeSet<String>> = on_disk
                .iter()
                .map(|(p, nodes)| (*p, nodes.intersection(&live).cloned().collect()))
                .filter(|(_, nodes): &(u16, BTreeSet<String>)| !nodes.is_empty())
                .collect();
            if sets.as_ref() == Some(&kept) && kept == live_on_disk {
                return;
            }
            assert!(
                Instant::now() < until,
                "the copies did not settle: replica sets {sets:?}, kept {kept:?}, on disk \
                 {live_on_disk:?}; logs in {}",
                self.dir.path().display()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// [`Harness::start`] with every node's `serve --policy` reading one file that first
    /// names the policy `name`: the harness, and the file's directory and path.
    pub fn start_with_policy(
        nats_bin: &Path,
        bin: &Path,
        name: &str,
    ) -> (Harness, tempfile::TempDir, PathBuf) {
        let files = tempfile::tempdir().unwrap();
        let file = files.path().join("policy.toml");
        std::fs::write(&file, format!("name = \"{name}\"\n")).unwrap();
        let h = Harness::start_with(nats_bin, bin, &[], &["--policy", file.to_str().unwrap()]);
        (h, files, file)
    }

    /// The name of the policy of every tenant's namespace (spread over the partitions and
    /// their owners), each asked through the live nodes in turn.
    pub fn policy_names(&self) -> Vec<String> {
        let alive = self.alive_nodes();
        keys()
            .iter()
            .enumerate()
            .map(|(i, (_, key))| {
                let (code, body, _) = request(
                    alive[i % alive.len()],
                    "GET",
                    "/v1/policy",
                    Some(key),
                    None,
                    None,
                )
                .unwrap();
                assert_eq!(code, 200, "{body}");
                body["name"].as_str().unwrap().to_string()
            })
            .collect()
    }

    /// Node `i`'s environment file of `shadowbrain cluster init` (none when insecure).
    pub fn node_env(&self, i: usize) -> Vec<(String, String)> {
        let path = self.dir.path().join(format!("keys/node{i}.env"));
        match self.security {
            Security::Secured => env_file(&path),
            Security::InsecureLoopback => Vec::new(),
        }
    }

    /// Node `i`'s nkey seed.
    pub fn node_seed(&self, i: usize) -> String {
        self.node_env(i)
            .into_iter()
            .find(|(k, _)| k == "SB_NATS_NKEY_SEED")
            .expect("a secured harness")
            .1
    }

    /// The running NATS servers, as the operator user of the secured configuration.
    pub fn nats_access(&self) -> NatsAccess {
        let secured = self.security == Security::Secured;
        NatsAccess {
            urls: self
                .nats
                .iter()
                .filter(|n| n.child.is_some())
                .map(|n| match secured {
                    true => format!("tls://127.0.0.1:{}", n.port),
                    false => format!("nats://127.0.0.1:{}", n.port),
                })
                .collect(),
            ca: secured.then(|| self.dir.path().join("ca.pem")),
            user: secured.then(|| ("operator".to_string(), OPERATOR_PASSWORD.to_string())),
            nkey: None,
        }
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        // Each node dies of SIGKILL as its `Served` drops, stopped (SIGSTOP) or not.
        for n in &mut self.nodes {
            n.served = None;
        }
        for n in &mut self.nats {
            if let Some(c) = &mut n.child {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        if std::thread::panicking() || std::env::var_os("SHADOWBRAIN_KEEP_CLUSTER").is_some() {
            // Keep the logs of a failed run (or of every run, when asked).
            let kept = self.dir.path().to_path_buf();
            let _ = std::mem::replace(&mut self.dir, tempfile::tempdir().unwrap()).keep();
            eprintln!("the cluster's logs and data are kept in {}", kept.display());
        }
    }
}

/// One HTTP/1.1 exchange with optional key, body and idempotency key: status, JSON body,
/// and the node that answered (`x-shadowbrain-node`).
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    key: Option<&str>,
    body: Option<&str>,
    idempotency: Option<&str>,
) -> std::io::Result<(u16, Value, String)> {
    let (code, body, node) = request_text(addr, method, path, key, body, idempotency)?;
    Ok((
        code,
        serde_json::from_str(&body).unwrap_or(Value::Null),
        node,
    ))
}

/// [`request`], with the body as text.
pub fn request_text(
    addr: SocketAddr,
    method: &str,
    path: &str,
    key: Option<&str>,
    body: Option<&str>,
    idempotency: Option<&str>,
) -> std::io::Result<(u16, String, String)> {
    request_within(
        addr,
        method,
        path,
        key,
        body,
        idempotency,
        Duration::from_secs(20),
    )
}

/// [`request_text`], waiting `patience` for the answer.
pub fn request_within(
    addr: SocketAddr,
    method: &str,
    path: &str,
    key: Option<&str>,
    body: Option<&str>,
    idempotency: Option<&str>,
    patience: Duration,
) -> std::io::Result<(u16, String, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(patience))?;
    let body = body.unwrap_or("");
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    if let Some(k) = key {
        head.push_str(&format!("Authorization: Bearer {k}\r\n"));
    }
    if let Some(k) = idempotency {
        head.push_str(&format!("Idempotency-Key: {k}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    stream.write_all(body.as_bytes())?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    let (head, rest) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("not an HTTP answer"))?;
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other("no status"))?;
    let node = head
        .lines()
        .find_map(|l| l.strip_prefix("x-shadowbrain-node: "))
        .unwrap_or("")
        .to_string();
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    let body = if chunked {
        dechunk(rest)
    } else {
        rest.to_string()
    };
    Ok((code, body, node))
}

/// The records waiting for their embedding on the node at `addr` (its owned runtimes'
/// `enrich` work queues, from `/metrics`); `None` when it does not answer.
pub fn enrich_backlog(addr: SocketAddr) -> Option<u64> {
    queue_depth(addr, "enrich")
}

/// The records waiting in `queue` (`shadowbrain_work_queue_depth`) on the node at `addr`,
/// over the partitions it owns; `None` when its metrics do not answer.
pub fn queue_depth(addr: SocketAddr, queue: &str) -> Option<u64> {
    let (code, body, _) = request_text(addr, "GET", "/metrics", Some(ADMIN), None, None).ok()?;
    if code != 200 {
        return None;
    }
    let label = format!("queue=\"{queue}\"");
    Some(
        body.lines()
            .filter(|l| l.starts_with("shadowbrain_work_queue_depth{") && l.contains(&label))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64,
    )
}

fn dechunk(mut rest: &str) -> String {
    let mut out = String::new();
    while let Some((size, after)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || after.len() < n {
            break;
        }
        out.push_str(&after[..n]);
        rest = after[n..].trim_start_matches("\r\n");
    }
    out
}

/// What one writer saw.
#[derive(Debug, Default)]
pub struct Written {
    pub key: String,
    pub session: String,
    /// Sequence numbers acknowledged (201), in order (a request of `batch` events acknowledges
    /// `batch` numbers), with when.
    pub acked: Vec<(u64, Instant)>,
    /// Acknowledgement latencies of requests answered at their first attempt.
    pub latencies: Vec<Duration>,
    /// The longest time from a write's first attempt to its acknowledgement.
    pub longest_wait: Duration,
    /// Attempts that failed (and were retried), by status (`io` for no answer).
    pub failures: BTreeMap<String, u64>,
}

/// The load: `writers` writers, each a session of its own in a namespace of its own,
/// sending `batch` events every `pace` to the live nodes in turn, each request under an
/// Idempotency-Key and retried (on another node) until acknowledged.
pub fn load(
    nodes: Arc<Mutex<Vec<SocketAddr>>>,
    stop: Arc<AtomicBool>,
    writers: usize,
    pace: Duration,
    batch: usize,
) -> Vec<std::thread::JoinHandle<Written>> {
    keys()
        .into_iter()
        .take(writers)
        .enumerate()
        .map(|(w, (_, key))| {
            let (nodes, stop) = (nodes.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut out = Written {
                    session: format!("writer-{w}"),
                    key,
                    ..Written::default()
                };
                let mut seq = 0u64;
                let mut attempt = w;
                let path = format!("/v1/sessions/{}/events", out.session);
                while !stop.load(Ordering::SeqCst) {
                    let first = Instant::now();
                    let events: Vec<String> = (seq..seq + batch as u64)
                        .map(|n| {
                            format!(
                                "{{\"kind\":\"observation\",\"text\":\"{} event {n}\"}}",
                                out.session
                            )
                        })
                        .collect();
                    let body = format!("{{\"events\":[{}]}}", events.join(","));
                    let idem = format!("{}-{seq}", out.session);
                    let mut tries = 0;
                    loop {
                        let addr = {
                            let live = nodes.lock().unwrap();
                            live[attempt % live.len()]
                        };
                        attempt += 1;
                        match request(
                            addr,
                            "POST",
                            &path,
                            Some(&out.key),
                            Some(&body),
                            Some(&idem),
                        ) {
                            Ok((201, _, _)) => break,
                            other => {
                                tries += 1;
                                let why = match other {
                                    Ok((code, body, _)) => {
                                        format!(
                                            "{code} {}",
                                            body["error"]["code"].as_str().unwrap_or("")
                                        )
                                    }
                                    Err(e) => format!("io {:?} {addr}", e.kind()),
                                };
                                *out.failures.entry(why).or_default() += 1;
                                std::thread::sleep(Duration::from_millis(100));
                            }
                        }
                        assert!(
                            first.elapsed() < Duration::from_secs(120),
                            "{} could not write event {seq} for 120 s",
                            out.session
                        );
                    }
                    let took = first.elapsed();
                    if tries == 0 {
                        out.latencies.push(took);
                    }
                    out.longest_wait = out.longest_wait.max(took);
                    let now = Instant::now();
                    out.acked
                        .extend((seq..seq + batch as u64).map(|n| (n, now)));
                    seq += batch as u64;
                    std::thread::sleep(pace.saturating_sub(took));
                }
                out
            })
        })
        .collect()
}

/// Bulk writes of `records` events to the nodes in turn, spread evenly over the first
/// `tenants` tenants and `sessions` sessions in all, by at least eight writer threads
/// (each tenant's sessions split between its writers), in requests of up to 100 events
/// (one session's), each under an Idempotency-Key and retried until acknowledged.
pub fn fill(nodes: &[SocketAddr], records: u64, tenants: usize, sessions: u64) {
    let started = Instant::now();
    let per_tenant = records / tenants as u64;
    let per_session = (records / sessions.max(1)).max(1);
    let batch = per_session.min(100);
    // A tenant's writers, each a share of its sessions (whole sessions, in order).
    let shares = 8usize.div_ceil(tenants) as u64;
    let threads: Vec<_> = (0..tenants)
        .flat_map(|t| (0..shares).map(move |w| (t, w)))
        .map(|(t, w)| {
            let (_, key) = keys()[t].clone();
            let nodes = nodes.to_vec();
            let tenant_sessions = per_tenant.div_ceil(per_session);
            let first = tenant_sessions * w / shares * per_session;
            let end = (tenant_sessions * (w + 1) / shares * per_session).min(per_tenant);
            std::thread::spawn(move || {
                let mut n = first;
                while n < end {
                    let events: Vec<String> = (n..n + batch)
                        .map(|i| {
                            format!(
                                r#"{{"kind":"observation","text":"bulk {t} record {i}: {} about topic {}","timestamp":"{}"}}"#,
                                bulk_words(t, i),
                                i % 997,
                                bulk_time(i)
                            )
                        })
                        .collect();
                    let body = format!(r#"{{"events":[{}]}}"#, events.join(","));
                    let idem = format!("bulk-{t}-{n}");
                    let addr = nodes[(n / batch) as usize % nodes.len()];
                    let path = format!("/v1/sessions/bulk-{t}-{}/events", n / per_session);
                    match request(addr, "POST", &path, Some(&key), Some(&body), Some(&idem)) {
                        Ok((201, _, _)) => n += batch,
                        _ => std::thread::sleep(Duration::from_millis(100)),
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let total = per_tenant * tenants as u64;
    eprintln!(
        "wrote {total} records in {:.0} s ({:.0}/s)",
        started.elapsed().as_secs_f64(),
        total as f64 / started.elapsed().as_secs_f64()
    );
}

/// The words [`fill`]'s records are made of (the same on every run, so two setups holding
/// the same records can be asked alike).
pub use shadowbrain_test_support::words::WORDS as BULK_WORDS;

fn bulk_mix(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// Six words of [`BULK_WORDS`] for record `i` of tenant `t`.
pub fn bulk_words(t: usize, i: u64) -> String {
    let h = bulk_mix((t as u64) << 40 ^ i);
    (0..6)
        .map(|k| BULK_WORDS[((h >> (k * 6)) % BULK_WORDS.len() as u64) as usize])
        .collect::<Vec<_>>()
        .join(" ")
}

/// Record `i`'s event time: a second apart from 2026-11-01, the same on every run.
pub fn bulk_time(i: u64) -> String {
    let at = std::time::UNIX_EPOCH + Duration::from_secs(1_793_491_200 + i);
    humantime::format_rfc3339_seconds(at).to_string()
}

/// Resident memory of a process, from `/proc/PID/status` (0 when it is gone).
pub fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// The sequence numbers of a session's events as stored, oldest first.
pub fn stored(h: &Harness, w: &Written) -> Vec<u64> {
    for addr in h.alive_nodes() {
        let path = format!("/v1/sessions/{}/timeline?limit=1000", w.session);
        if let Ok((200, body, _)) = request(addr, "GET", &path, Some(&w.key), None, None) {
            // The events only: condensed records (every 50 events) quote some of them.
            let mut seqs: Vec<u64> = body["items"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|m| m["tier"] == "episodic")
                .map(|m| {
                    m["text"]
                        .as_str()
                        .unwrap()
                        .rsplit(' ')
                        .next()
                        .unwrap()
                        .parse()
                        .unwrap()
                })
                .collect();
            seqs.reverse();
            return seqs;
        }
    }
    panic!("no node answered the timeline of {}", w.session);
}

/// Every partition's log: (entries, whether its epochs never went backwards, the first
/// place they did).
pub async fn epochs(nats: &NatsAccess, partitions: u16) -> BTreeMap<u16, (u64, Option<String>)> {
    let client = nats.connect().await.unwrap();
    let js = async_nats::jetstream::new(client);
    let mut out = BTreeMap::new();
    for p in 0..partitions {
        let mut stream = js.get_stream(format!("SB_P{p:03}")).await.unwrap();
        let end = stream.info().await.unwrap().state.last_sequence;
        let mut backwards = None;
        if end > 0 {
            let consumer = stream
                .create_consumer(async_nats::jetstream::consumer::pull::OrderedConfig::default())
                .await
                .unwrap();
            let mut messages = consumer.messages().await.unwrap();
            let mut last_epoch = 0u64;
            while let Some(m) = messages.next().await {
                let m = m.unwrap();
                let seq = m.info().unwrap().stream_sequence;
                let epoch: u64 = m
                    .headers
                    .as_ref()
                    .and_then(|h| h.get("Sb-Epoch"))
                    .map(|v| v.as_str().parse().unwrap())
                    .expect("every entry carries its epoch");
                if epoch < last_epoch && backwards.is_none() {
                    backwards = Some(format!("entry {seq}: epoch {epoch} after {last_epoch}"));
                }
                last_epoch = last_epoch.max(epoch);
                if seq >= end {
                    break;
                }
            }
        }
        out.insert(p, (end, backwards));
    }
    out
}

/// The NATS server leading most partition streams.
pub async fn busiest_leader(nats: &NatsAccess) -> String {
    let js = async_nats::jetstream::new(nats.connect().await.unwrap());
    let mut count: BTreeMap<String, usize> = BTreeMap::new();
    for p in 0..PARTITIONS {
        let mut s = js.get_stream(format!("SB_P{p:03}")).await.unwrap();
        let info = s.info().await.unwrap();
        if let Some(leader) = info.cluster.as_ref().and_then(|c| c.leader.clone()) {
            *count.entry(leader).or_default() += 1;
        }
    }
    count.into_iter().max_by_key(|(_, n)| *n).unwrap().0
}

impl Harness {
    /// Which node owns each partition, as the live nodes say.
    pub fn owners(&self) -> BTreeMap<u16, String> {
        let mut out = BTreeMap::new();
        for i in 0..self.nodes.len() {
            if self.nodes[i].served.is_none() {
                continue;
            }
            if let Some(s) = self.status(i) {
                for p in s["partitions"].as_array().unwrap() {
                    if p["role"] == "owner" {
                        out.insert(
                            p["partition"].as_u64().unwrap() as u16,
                            self.nodes[i].name.clone(),
                        );
                    }
                }
            }
        }
        out
    }

    /// Bytes the NATS servers received and sent in all (`/varz`), clients and routes.
    pub fn nats_bytes(&self) -> u64 {
        self.nats
            .iter()
            .filter(|n| n.child.is_some())
            .filter_map(|n| {
                let addr: SocketAddr = format!("127.0.0.1:{}", n.http).parse().unwrap();
                let (_, v, _) = request(addr, "GET", "/varz", None, None, None).ok()?;
                Some(v["in_bytes"].as_u64()? + v["out_bytes"].as_u64()?)
            })
            .sum()
    }

    /// The process ids of the nodes and of the NATS servers still running.
    pub fn pids(&self) -> (Vec<u32>, Vec<u32>) {
        (
            self.nodes
                .iter()
                .filter_map(|n| n.served.as_ref().map(Served::pid))
                .collect(),
            self.nats
                .iter()
                .filter_map(|n| n.child.as_ref().map(Child::id))
                .collect(),
        )
    }
}

/// CPU time (user + system) a process used so far, from `/proc/PID/stat`.
pub fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // After the command name in parentheses: fields 14 and 15 (utime, stime) in ticks.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields.get(11).and_then(|f| f.parse().ok()).unwrap_or(0)
        + fields.get(12).and_then(|f| f.parse().ok()).unwrap_or(0);
    // SAFETY: sysconf reads a constant.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    Duration::from_micros(ticks * 1_000_000 / hz.max(1))
}

/// Bytes under `dir`, as allocated on disk.
pub fn disk_bytes(dir: &Path) -> u64 {
    shadowbrain::internals::dir_disk_bytes(dir).unwrap_or(0)
}

/// Every entry of partition `p`'s log: (position, bytes).
pub async fn read_log(nats: &NatsAccess, p: u16) -> Vec<(u64, Vec<u8>)> {
    let js = async_nats::jetstream::new(nats.connect().await.unwrap());
    let mut stream = js.get_stream(format!("SB_P{p:03}")).await.unwrap();
    let end = stream.info().await.unwrap().state.last_sequence;
    let mut out = Vec::new();
    if end == 0 {
        return out;
    }
    let consumer = stream
        .create_consumer(async_nats::jetstream::consumer::pull::OrderedConfig::default())
        .await
        .unwrap();
    let mut messages = consumer.messages().await.unwrap();
    while let Some(m) = messages.next().await {
        let m = m.unwrap();
        let seq = m.info().unwrap().stream_sequence;
        out.push((seq, m.payload.to_vec()));
        if seq >= end {
            break;
        }
    }
    out
}

/// A store's keys and values that the log carries.
pub fn contents(store: &Path) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let replica = shadowbrain::Replica::open(store, shadowbrain::Backend::Lmdb).unwrap();
    let mut all = BTreeMap::new();
    replica
        .for_each_logged(&mut |k, v| {
            all.insert(k.to_vec(), v.to_vec());
        })
        .unwrap();
    all
}

/// A node's copy of a partition, as found on disk.
pub struct DiskCopy {
    pub node: String,
    /// Its logged keys and values ([`contents`]).
    pub contents: BTreeMap<Vec<u8>, Vec<u8>>,
    /// The log position it applied.
    pub applied: u64,
}

/// Every node's copy of partition `p` found on disk.
pub fn copies_on_disk(h: &Harness, p: u16) -> Vec<DiskCopy> {
    let mut out = Vec::new();
    for node in &h.nodes {
        let store = node.partition_dir(p).join("store");
        if !store.exists() {
            continue;
        }
        let copy = contents(&store);
        let applied = copy
            .get(&[&[0u8][..], b"log_applied"].concat())
            .map_or(0, |v| u64::from_be_bytes(v[..8].try_into().unwrap()));
        out.push(DiskCopy {
            node: node.name.clone(),
            contents: copy,
            applied,
        });
    }
    out
}

/// One embedded (single-node) `serve` of `bin` with the harness's keys and embedder (see
/// [`use_embedder`]), on a fresh data directory (kept with the returned directory).
pub fn embedded_serve(bin: &Path) -> (tempfile::TempDir, Served) {
    embedded_serve_with(bin, &[])
}

/// [`embedded_serve`] with `args` added to its `serve` command.
pub fn embedded_serve_with(bin: &Path, args: &[&str]) -> (tempfile::TempDir, Served) {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("serve.toml");
    std::fs::write(&config, format!("{}{}", embedder_section(), auth_keys())).unwrap();
    let served = Serve::new(bin)
        .data(dir.path().join("data"))
        .config_file(&config)
        .args(args)
        .start();
    (dir, served)
}

impl Harness {
    /// Whether every standby of node `i` has applied its partition's log to `ends` (a
    /// partition it keeps no copy of is not waited for).
    pub fn caught_up(&self, i: usize, ends: &BTreeMap<u16, u64>) -> bool {
        let Some(s) = self.status(i) else {
            return false;
        };
        s["partitions"].as_array().unwrap().iter().all(|p| {
            let id = p["partition"].as_u64().unwrap() as u16;
            p["role"] == "owner"
                || p["role"] == "none"
                || p["applied"].as_u64().unwrap_or(0) >= ends[&id]
        })
    }
}

/// Where each partition's log begins and ends (its stream's first and last sequence: a
/// snapshot truncates the stream beneath it) and the bytes it holds.
pub async fn log_spans(nats: &NatsAccess, partitions: u16) -> BTreeMap<u16, (u64, u64, u64)> {
    let js = async_nats::jetstream::new(nats.connect().await.unwrap());
    let mut out = BTreeMap::new();
    for p in 0..partitions {
        let mut stream = js.get_stream(format!("SB_P{p:03}")).await.unwrap();
        let state = &stream.info().await.unwrap().state;
        out.insert(p, (state.first_sequence, state.last_sequence, state.bytes));
    }
    out
}

/// The log position of each partition's stored snapshot, where one is stored.
pub async fn snapshot_positions(nats: &NatsAccess, partitions: u16) -> BTreeMap<u16, u64> {
    let js = async_nats::jetstream::new(nats.connect().await.unwrap());
    let mut out = BTreeMap::new();
    let Ok(store) = js.get_object_store("sb_snapshots").await else {
        return out;
    };
    for p in 0..partitions {
        if let Ok(info) = store.info(format!("SB_P{p:03}")).await
            && let Some(position) = info.metadata.get("position")
        {
            out.insert(p, position.parse().unwrap());
        }
    }
    out
}

/// Checks what a writer saw against what the cluster stored: every acknowledged event
/// present once, and the session's events in the order sent.
pub fn check_stored(h: &Harness, w: &Written, what: &str) {
    let seqs = stored(h, w);
    // In order and each once: strictly increasing.
    for pair in seqs.windows(2) {
        assert!(
            pair[0] < pair[1],
            "{what}: {} holds event {} before {} (order or a duplicate): {seqs:?}",
            w.session,
            pair[0],
            pair[1]
        );
    }
    for (seq, _) in &w.acked {
        assert!(
            seqs.binary_search(seq).is_ok(),
            "{what}: {} lost acknowledged event {seq}",
            w.session
        );
    }
}

/// Where each partition's log ends (its stream's last sequence), from the streams' state
/// alone: nothing of the logs is read.
pub async fn log_ends(nats: &NatsAccess, partitions: u16) -> BTreeMap<u16, u64> {
    let js = async_nats::jetstream::new(nats.connect().await.unwrap());
    let mut out = BTreeMap::new();
    for p in 0..partitions {
        let mut stream = js.get_stream(format!("SB_P{p:03}")).await.unwrap();
        out.insert(p, stream.info().await.unwrap().state.last_sequence);
    }
    out
}

impl Harness {
    /// SIGTERM to every node, and waits for each to exit (handing its partitions over).
    pub fn stop_nodes(&mut self) {
        let pids: Vec<u32> = self.pids().0;
        for pid in &pids {
            let _ = Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status();
        }
        for n in &mut self.nodes {
            if let Some(mut served) = n.served.take() {
                let stopped = served.exit_within(Duration::from_secs(60));
                assert!(
                    stopped.is_some(),
                    "{} did not stop within 60 s of SIGTERM",
                    n.name
                );
            }
        }
    }
}
