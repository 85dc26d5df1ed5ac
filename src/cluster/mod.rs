//! Cluster mode (`serve --cluster`, docs/cluster.md): several nodes share the
//! work on NATS JetStream, which replicates the write log, holds the ownership leases and
//! carries forwarded requests. There is no replication or membership protocol of our own.
//!
//! - A namespace belongs to one of a fixed number of **partitions** ([`partition_of`]), so
//!   its sessions, knowledge pool and namespace-wide recall stay on one owner.
//! - Each partition has a file-backed, replicated JetStream **stream**. The owner's store
//!   appends every commit group to it before committing locally ([`log`]); a write is
//!   acknowledged after JetStream's publish acknowledgement.
//! - **Ownership** is a lease in a replicated KV bucket with a short TTL; rendezvous hashing
//!   over the live nodes ([`rendezvous`]) says who should own a partition, the lease says who
//!   does, and its revision is the fencing epoch stamped on every log entry ([`node`]).
//! - Each partition has a **replica set** of `copies` nodes, the first ones rendezvous
//!   hashing ranks for it ([`ranked`]): the owner and warm standbys, which keep the
//!   partition's store by applying the stream, so a takeover replays only the tail. A node
//!   keeps copies of its replica sets' partitions only.
//! - A standby of each partition periodically writes a **snapshot** of it to the JetStream
//!   object store and truncates the stream beneath it ([`snapshot`]); a new copy restores
//!   the latest snapshot and replays only the tail.
//! - Any node accepts any request and forwards it to the owner over NATS request/reply
//!   ([`forward`]); a policy reload goes to every node ([`policy`]). The dashboard's
//!   sign-ins are kept in a KV bucket every node reads ([`signins`]), so its pages are
//!   forwarded like `/v1` requests, by the visitor's namespace.
//!
//! Single-node mode (plain `serve`) uses none of this and needs no NATS.

mod forward;
pub mod init;
mod log;
mod node;
mod parts;
mod policy;
mod seal;
mod signins;
mod snapshot;

use std::time::Duration;

use serde::Deserialize;

pub use node::serve_cluster;

/// The `[cluster]` section of the config file, read by `serve --cluster`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// The NATS servers to connect to (any of them; the client follows the cluster).
    pub urls: Vec<String>,
    /// This node's name, unique in the cluster (default: the host name).
    pub node: Option<String>,
    /// Partitions namespaces are spread over. Fixed for the cluster's life: every node
    /// must say the same, and changing it moves namespaces (a new cluster).
    pub partitions: u16,
    /// What a partition holds: whole namespaces (`"namespace"`, the default) or sessions
    /// (`"session"`: a namespace's sessions spread over every partition, its recall and
    /// listings gathered from all of them; docs/cluster-placement.md). Fixed for the
    /// cluster's life, like `partitions`: the first node records both and a node that says
    /// otherwise is refused.
    pub placement: Placement,
    /// JetStream replicas of each partition's stream and of the lease buckets (1 or 3 on a
    /// three-server NATS cluster).
    pub replicas: usize,
    /// Nodes that keep a copy of each partition: its owner and `copies - 1` warm standbys
    /// (fewer while the cluster has fewer nodes). A node stores only the partitions whose
    /// replica set it is in, so each holds about `copies / nodes` of the data.
    pub copies: usize,
    /// A partition's stream holding this many MiB is snapshotted (by a standby, into the
    /// JetStream object store) and truncated beneath the snapshot; 0: never.
    pub snapshot_tail_mib: u64,
    /// How long a lease lives without a refresh (`"3s"`): a node that stops refreshing
    /// loses its partitions after it.
    pub lease_ttl: String,
    /// How long a forwarded request may wait for its partition's owner, through a
    /// takeover (`"15s"`).
    pub forward_timeout: String,
    /// How long a node told to stop keeps serving while the others take over its
    /// partitions and its copies catch up elsewhere (`"60s"`); past it, it stops anyway.
    pub leave_timeout: String,
    /// Prefix of the streams, buckets and subjects, so several clusters can share NATS.
    pub prefix: String,
    /// NATS user name (with `password_env`).
    pub user: Option<String>,
    /// The environment variable holding the NATS password (never the password itself).
    pub password_env: Option<String>,
    /// The environment variable holding this node's NATS nkey seed (`SU…`, made by
    /// `shadowbrain cluster init`): the NATS servers hold only its public key. Instead of
    /// `user` and `password_env`.
    pub nkey_seed_env: Option<String>,
    /// A NATS credentials file (a user JWT and its nkey seed, for NATS servers run in
    /// operator mode). Instead of `user` and `password_env`.
    pub credentials_file: Option<String>,
    /// The environment variable holding a NATS token (shared by every client that knows
    /// it, so accepted only with `insecure_loopback`).
    pub token_env: Option<String>,
    /// The PEM file of the certificate authority that signed the NATS servers'
    /// certificates: turns TLS on and makes it required. Needed unless `insecure_loopback`.
    pub tls_ca: Option<String>,
    /// This node's client certificate (PEM), for NATS servers that verify clients (with
    /// `tls_key`).
    pub tls_cert: Option<String>,
    /// The private key of `tls_cert` (PEM).
    pub tls_key: Option<String>,
    /// The environment variable holding the cluster secret (at least 32 bytes, the same on
    /// every node, never the secret itself): what nodes tell each other over NATS is sealed
    /// with it ([`seal`]). Needed unless `insecure_loopback`.
    pub secret_env: Option<String>,
    /// Lets the node talk to NATS without TLS and without a credential of its own, which
    /// is safe only when NATS is reachable from this machine alone: accepted only when
    /// every URL is on loopback (127.0.0.0/8, ::1, localhost). Default false.
    pub insecure_loopback: bool,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            urls: vec!["nats://127.0.0.1:4222".into()],
            node: None,
            partitions: 16,
            placement: Placement::Namespace,
            replicas: 3,
            copies: 3,
            snapshot_tail_mib: 64,
            lease_ttl: "3s".into(),
            forward_timeout: "15s".into(),
            leave_timeout: "60s".into(),
            prefix: "sb".into(),
            user: None,
            password_env: None,
            token_env: None,
            nkey_seed_env: None,
            credentials_file: None,
            tls_ca: None,
            tls_cert: None,
            tls_key: None,
            secret_env: None,
            insecure_loopback: false,
        }
    }
}

/// What a partition holds ([`ClusterConfig::placement`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Placement {
    /// Whole namespaces: `hash(namespace)`.
    #[default]
    Namespace,
    /// Sessions: `hash(namespace, session)`.
    Session,
}

/// TLS to NATS: the servers' certificate authority and, optionally, this node's client
/// certificate and key.
#[derive(Debug, Clone)]
pub struct Tls {
    /// The CA's PEM file.
    pub ca: std::path::PathBuf,
    /// The client certificate and its key, for servers that verify clients.
    pub client: Option<(std::path::PathBuf, std::path::PathBuf)>,
}

/// [`ClusterConfig`] checked, with durations parsed and the node named.
#[derive(Debug, Clone)]
pub struct Cluster {
    /// NATS servers.
    pub urls: Vec<String>,
    /// This node.
    pub node: String,
    /// Partitions.
    pub partitions: u16,
    /// What a partition holds.
    pub placement: Placement,
    /// Replicas of streams and buckets.
    pub replicas: usize,
    /// Nodes keeping a copy of each partition.
    pub copies: usize,
    /// Stream bytes past which a partition is snapshotted (0: never).
    pub snapshot_tail: u64,
    /// Lease TTL.
    pub lease_ttl: Duration,
    /// Forwarding deadline.
    pub forward_timeout: Duration,
    /// How long a graceful stop hands on at most.
    pub leave_timeout: Duration,
    /// Name prefix.
    pub prefix: String,
    /// User and password.
    pub user_password: Option<(String, String)>,
    /// Token.
    pub token: Option<String>,
    /// An nkey seed.
    pub nkey_seed: Option<String>,
    /// A credentials file.
    pub credentials_file: Option<std::path::PathBuf>,
    /// TLS, required when set.
    pub tls: Option<Tls>,
    /// The cluster secret the nodes seal what they tell each other with.
    pub secret: Vec<u8>,
    /// Plain text and shared credentials allowed (every server on loopback).
    pub insecure_loopback: bool,
}

impl ClusterConfig {
    /// Checks the section: every problem says what to write instead.
    pub fn check(&self) -> anyhow::Result<Cluster> {
        let mut problems = Vec::new();
        if self.urls.is_empty() {
            problems.push(
                "urls is empty; list the NATS servers, e.g. [\"nats://127.0.0.1:4222\"]"
                    .to_string(),
            );
        }
        if !(1..=1024).contains(&self.partitions) {
            problems.push(format!("partitions is {}; use 1 to 1024", self.partitions));
        }
        if !(1..=5).contains(&self.replicas) {
            problems.push(format!("replicas is {}; use 1, 3 or 5", self.replicas));
        }
        if self.snapshot_tail_mib > 1024 * 1024 {
            problems.push(format!(
                "snapshot_tail_mib is {}; use 0 (never) to 1048576",
                self.snapshot_tail_mib
            ));
        }
        if !(1..=16).contains(&self.copies) {
            problems.push(format!(
                "copies is {}; use 1 to 16 (the owner and copies - 1 standbys; 3 keeps a \
                 partition served with two of its nodes lost)",
                self.copies
            ));
        }
        let duration =
            |name: &str, text: &str, problems: &mut Vec<String>| match humantime::parse_duration(
                text,
            ) {
                Ok(d) if d >= Duration::from_millis(500) => d,
                Ok(_) => {
                    problems.push(format!("{name} `{text}` is under 500ms"));
                    Duration::ZERO
                }
                Err(e) => {
                    problems.push(format!(
                        "{name} `{text}` is not a duration ({e}); write e.g. \"3s\""
                    ));
                    Duration::ZERO
                }
            };
        let lease_ttl = duration("lease_ttl", &self.lease_ttl, &mut problems);
        let forward_timeout = duration("forward_timeout", &self.forward_timeout, &mut problems);
        let leave_timeout = duration("leave_timeout", &self.leave_timeout, &mut problems);
        let name_ok = |s: &str| {
            !s.is_empty()
                && s.len() <= 64
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        };
        if !name_ok(&self.prefix) {
            problems.push(format!(
                "prefix `{}` must be 1 to 64 of A-Z a-z 0-9 - _",
                self.prefix
            ));
        }
        let node = match &self.node {
            Some(n) => n.clone(),
            None => host_name().unwrap_or_default(),
        };
        if !name_ok(&node) {
            problems.push(format!(
                "node `{node}` must be 1 to 64 of A-Z a-z 0-9 - _ (set [cluster] node, or \
                 SHADOWBRAIN__CLUSTER__NODE)"
            ));
        }
        let secret = |env: &Option<String>, problems: &mut Vec<String>| {
            env.as_ref().and_then(|var| match std::env::var(var) {
                Ok(v) => Some(v),
                Err(_) => {
                    problems.push(format!("the environment variable {var} is not set"));
                    None
                }
            })
        };
        let password = secret(&self.password_env, &mut problems);
        let token = secret(&self.token_env, &mut problems);
        let cluster_secret = secret(&self.secret_env, &mut problems);
        let nkey_seed = secret(&self.nkey_seed_env, &mut problems);
        if let (Some(var), Some(seed)) = (&self.nkey_seed_env, &nkey_seed)
            && nkeys::KeyPair::from_seed(seed.trim()).is_err()
        {
            problems.push(format!(
                "{var} does not hold an nkey seed (`SU…`, as `shadowbrain cluster init` \
                 writes one)"
            ));
        }
        if let (Some(var), Some(value)) = (&self.secret_env, &cluster_secret)
            && value.len() < seal::MIN_SECRET
        {
            problems.push(format!(
                "the cluster secret in {var} has {} bytes; use at least {} random ones, the \
                 same on every node (e.g. `openssl rand -hex 32`)",
                value.len(),
                seal::MIN_SECRET
            ));
        }
        let user_password = match (&self.user, password) {
            (Some(u), Some(p)) => Some((u.clone(), p)),
            (None, None) => None,
            _ => {
                problems.push("user and password_env go together".into());
                None
            }
        };
        let file = |key: &str, path: &Option<String>, problems: &mut Vec<String>| {
            let path = std::path::PathBuf::from(path.as_ref()?);
            match path.is_file() {
                true => Some(path),
                false => {
                    problems.push(format!("{key} `{}` is not a readable file", path.display()));
                    None
                }
            }
        };
        let ca = file("tls_ca", &self.tls_ca, &mut problems);
        let client = match (
            file("tls_cert", &self.tls_cert, &mut problems),
            file("tls_key", &self.tls_key, &mut problems),
        ) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            _ => {
                problems.push("tls_cert and tls_key go together".into());
                None
            }
        };
        if client.is_some() && self.tls_ca.is_none() {
            problems.push("tls_cert and tls_key need tls_ca (the servers' CA)".into());
        }
        let tls = ca.map(|ca| Tls { ca, client });
        let credentials_file = file("credentials_file", &self.credentials_file, &mut problems);
        let ways = [
            self.user.is_some() || self.password_env.is_some(),
            self.nkey_seed_env.is_some(),
            self.credentials_file.is_some(),
        ];
        if ways.iter().filter(|w| **w).count() > 1 {
            problems.push(
                "give one NATS credential: user and password_env, nkey_seed_env, or \
                 credentials_file"
                    .into(),
            );
        }
        if self.insecure_loopback {
            for url in self.urls.iter().filter(|u| !on_loopback(u)) {
                problems.push(format!(
                    "insecure_loopback is set, but `{url}` is not on loopback: NATS \
                     reachable from other machines needs tls_ca and a user per node \
                     (docs/cluster.md, \"Securing the cluster\")"
                ));
            }
        } else {
            if self.tls_ca.is_none() {
                problems.push(
                    "tls_ca is not set: cluster traffic (requests, answers, the write log) \
                     crosses the network, so NATS must be reached over TLS; set tls_ca to the \
                     PEM file of the CA that signed the NATS servers' certificates, or, when \
                     every NATS server is on this machine, insecure_loopback = true"
                        .to_string(),
                );
            }
            // Half a credential (or an unset variable) is reported above already.
            if !ways.contains(&true) {
                problems.push(
                    "no credential of this node's own: set nkey_seed_env (a NATS nkey per \
                     node, made by `shadowbrain cluster init`), user and password_env, or \
                     credentials_file (docs/cluster.md, \"Securing the cluster\"), or, when \
                     every NATS server is on this machine, insecure_loopback = true"
                        .to_string(),
                );
            }
            if self.secret_env.is_none() {
                problems.push(
                    "secret_env is not set: nodes seal what they tell each other (forwarded \
                     identities, answers, the write log, sign-ins) with a cluster secret; \
                     put at least 32 random bytes, the same on every node, in an environment \
                     variable and name it in secret_env (docs/cluster.md, \"Securing the cluster\")"
                        .to_string(),
                );
            }
            if self.token_env.is_some() {
                problems.push(
                    "token_env is one secret every client shares, so anyone holding it is \
                     a node; give each node its own user and password_env instead"
                        .to_string(),
                );
            }
        }
        if !problems.is_empty() {
            anyhow::bail!("the [cluster] section is invalid: {}", problems.join("; "));
        }
        Ok(Cluster {
            urls: self.urls.clone(),
            node,
            partitions: self.partitions,
            placement: self.placement,
            replicas: self.replicas,
            copies: self.copies,
            snapshot_tail: self.snapshot_tail_mib * 1024 * 1024,
            lease_ttl,
            forward_timeout,
            leave_timeout,
            prefix: self.prefix.clone(),
            user_password,
            token,
            nkey_seed: nkey_seed.map(|s| s.trim().to_string()),
            credentials_file,
            tls,
            // Without a secret (accepted on loopback only) the seals are still made and
            // checked, under a secret anyone can read here: they then protect nothing,
            // which is what insecure_loopback says.
            secret: cluster_secret
                .map(String::into_bytes)
                .unwrap_or_else(|| INSECURE_SECRET.to_vec()),
            insecure_loopback: self.insecure_loopback,
        })
    }
}

/// The cluster secret under `insecure_loopback` without `secret_env`: public, so the seals
/// keep their shape and cost but protect nothing.
const INSECURE_SECRET: &[u8] = b"shadowbrain insecure_loopback: this secret is public";

/// Whether a NATS URL's host is on loopback (127.0.0.0/8, ::1, localhost).
fn on_loopback(url: &str) -> bool {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    // No user info, path or port: `user:pw@host:port/...`.
    let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
    let rest = rest.split('/').next().unwrap_or("");
    let host = match rest.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => rest.rsplit_once(':').map_or(rest, |(h, _)| h),
    };
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

fn host_name() -> Option<String> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())?;
    let name: String = name
        .trim()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .collect();
    (!name.is_empty()).then_some(name)
}

/// FNV-1a, 64-bit: stable across versions and platforms, which a partition map must be
/// (every node, every release, computes the same partition for a namespace).
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for b in *part {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        // A separator, so ("ab", "c") and ("a", "bc") differ.
        h ^= 0xff;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// MurmurHash3's 64-bit finalizer: FNV-1a alone barely moves its high bits for names that
/// differ in their last byte (`node1`, `node2`), and rendezvous hashing compares whole
/// hashes, so every partition went to one node.
fn mix(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// The partition a namespace lives in.
pub fn partition_of(namespace: &str, partitions: u16) -> u16 {
    (mix(fnv1a(&[namespace.as_bytes()])) % u64::from(partitions)) as u16
}

/// The partition a session lives in when sessions are placed ([`Placement::Session`]).
pub fn session_partition(namespace: &str, session: &str, partitions: u16) -> u16 {
    (mix(fnv1a(&[namespace.as_bytes(), session.as_bytes()])) % u64::from(partitions)) as u16
}

/// `nodes` ranked for `partition` by rendezvous hashing, best first: the first owns it
/// when its copy is caught up, and the first `copies` keep it (its replica set). A node
/// joining or leaving moves only the partitions it wins or held, one rank each.
pub fn ranked(partition: u16, nodes: &[String]) -> Vec<&String> {
    let mut scored: Vec<(u64, &String)> = nodes
        .iter()
        .map(|n| (mix(fnv1a(&[n.as_bytes(), &partition.to_be_bytes()])), n))
        .collect();
    // Highest score first; the name breaks a tie so every node ranks alike.
    scored.sort_unstable_by(|a, b| b.cmp(a));
    scored.into_iter().map(|(_, n)| n).collect()
}

/// Which of `nodes` should own `partition` when every copy is caught up: the first of
/// [`ranked`].
pub fn rendezvous(partition: u16, nodes: &[String]) -> Option<&String> {
    ranked(partition, nodes).into_iter().next()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_are_stable_and_spread() {
        // Pinned: a change here moves every namespace of every running cluster.
        assert_eq!(partition_of("default", 16), partition_of("default", 16));
        let mut counts = [0u32; 16];
        for i in 0..16_000 {
            counts[partition_of(&format!("tenant-{i}"), 16) as usize] += 1;
        }
        assert!(counts.iter().all(|c| (800..1200).contains(c)), "{counts:?}");
    }

    #[test]
    fn rendezvous_moves_only_what_a_node_held() {
        // Names that differ in their last character only, as operators name nodes.
        let three: Vec<String> = ["node1", "node2", "node3"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let two: Vec<String> = ["node1", "node2"].iter().map(|s| s.to_string()).collect();
        let mut owned = [0; 3];
        for p in 0..64 {
            let before = rendezvous(p, &three).unwrap();
            let after = rendezvous(p, &two).unwrap();
            if before != "node3" {
                assert_eq!(before, after, "partition {p} moved without reason");
            }
            owned[three.iter().position(|n| n == before).unwrap()] += 1;
        }
        assert!(owned.iter().all(|&n| n > 12), "{owned:?}");
        let mut small = [0; 3];
        for p in 0..8 {
            small[three
                .iter()
                .position(|n| n == rendezvous(p, &three).unwrap())
                .unwrap()] += 1;
        }
        assert!(
            small.iter().all(|&n| n > 0),
            "8 partitions over 3 nodes: {small:?}"
        );
        assert_eq!(rendezvous(0, &[]), None);
    }

    #[test]
    fn replica_sets_spread_and_move_one_rank_at_a_time() {
        let six: Vec<String> = (0..6).map(|i| format!("node{i}")).collect();
        let mut held = [0usize; 6];
        for p in 0..32u16 {
            let order = ranked(p, &six);
            assert_eq!(order.len(), 6);
            assert_eq!(Some(order[0]), rendezvous(p, &six));
            for n in &order[..3] {
                held[six.iter().position(|m| m == *n).unwrap()] += 1;
            }
            // A node leaving takes itself out of the order and moves nothing else: the
            // partitions it kept gain the next node as their last copy.
            let five: Vec<String> = six.iter().filter(|n| *n != "node2").cloned().collect();
            let without: Vec<&String> = order.iter().copied().filter(|n| *n != "node2").collect();
            assert_eq!(ranked(p, &five), without, "partition {p}");
        }
        // 32 partitions × 3 copies over 6 nodes: 16 each on average.
        assert_eq!(held.iter().sum::<usize>(), 96);
        assert!(held.iter().all(|&n| (8..=24).contains(&n)), "{held:?}");
    }

    #[test]
    fn the_section_says_what_is_wrong() {
        let bad = ClusterConfig {
            urls: vec![],
            partitions: 0,
            copies: 0,
            lease_ttl: "soon".into(),
            leave_timeout: "100ms".into(),
            node: Some("a b".into()),
            user: Some("u".into()),
            ..ClusterConfig::default()
        };
        let e = bad.check().unwrap_err().to_string();
        for part in [
            "urls is empty",
            "partitions is 0",
            "copies is 0",
            "lease_ttl `soon`",
            "leave_timeout `100ms` is under 500ms",
            "node `a b`",
            "user and password_env",
        ] {
            assert!(e.contains(part), "{e}");
        }
        let good = ClusterConfig {
            node: Some("n1".into()),
            insecure_loopback: true,
            ..ClusterConfig::default()
        };
        let c = good.check().unwrap();
        assert_eq!(c.lease_ttl, Duration::from_secs(3));
        assert_eq!(c.leave_timeout, Duration::from_secs(60));
        assert_eq!(c.partitions, 16);
        assert!(c.tls.is_none() && c.insecure_loopback);
    }

    #[test]
    fn plain_text_or_shared_credentials_only_on_loopback() {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, "not checked here: NATS's TLS handshake reads it").unwrap();
        let base = ClusterConfig {
            node: Some("n1".into()),
            ..ClusterConfig::default()
        };
        // The default section (NATS on loopback, nothing else) is refused without the
        // explicit setting, with both ways out named.
        let e = base.check().unwrap_err().to_string();
        assert!(
            e.contains("tls_ca is not set")
                && e.contains("insecure_loopback = true")
                && e.contains("no credential of this node's own"),
            "{e}"
        );
        // The setting is refused when any server is elsewhere.
        let e = refused(ClusterConfig {
            urls: vec![
                "nats://127.0.0.1:4222".into(),
                "nats://10.0.0.7:4222".into(),
            ],
            insecure_loopback: true,
            ..base.clone()
        });
        assert!(
            e.contains("`nats://10.0.0.7:4222` is not on loopback"),
            "{e}"
        );
        for url in [
            "nats://localhost:4222",
            "tls://127.0.0.9:4",
            "nats://[::1]:4222",
            "u:p@127.0.0.1:1",
        ] {
            assert!(on_loopback(url), "{url}");
        }
        for url in [
            "nats://10.0.0.1:4222",
            "nats://nats.example:4222",
            "nats://[::2]:1",
            "127.0.0.1.example:4",
        ] {
            assert!(!on_loopback(url), "{url}");
        }
        // TLS and a user of its own: accepted anywhere; a shared token is not.
        unsafe_set_env("SB_TEST_NATS_PASSWORD", "secret");
        unsafe_set_env("SB_TEST_CLUSTER_SECRET", &"s".repeat(32));
        unsafe_set_env("SB_TEST_SHORT_SECRET", "short");
        let secure = ClusterConfig {
            urls: vec!["tls://10.0.0.7:4222".into()],
            tls_ca: Some(ca.display().to_string()),
            user: Some("node0".into()),
            password_env: Some("SB_TEST_NATS_PASSWORD".into()),
            secret_env: Some("SB_TEST_CLUSTER_SECRET".into()),
            ..base.clone()
        };
        let c = secure.check().unwrap();
        assert_eq!(c.tls.unwrap().ca, ca);
        assert_eq!(c.secret, "s".repeat(32).into_bytes());
        // Without a cluster secret, or with a short one: refused, saying how to make one.
        let e = refused(ClusterConfig {
            secret_env: None,
            ..secure.clone()
        });
        assert!(e.contains("secret_env is not set"), "{e}");
        let e = refused(ClusterConfig {
            secret_env: Some("SB_TEST_SHORT_SECRET".into()),
            ..secure.clone()
        });
        assert!(
            e.contains("SB_TEST_SHORT_SECRET has 5 bytes") && e.contains("openssl rand"),
            "{e}"
        );
        // An nkey instead of a password: a seed is checked; one credential only.
        let seed = nkeys::KeyPair::new_user().seed().unwrap();
        unsafe_set_env("SB_TEST_NKEY_SEED", &seed);
        unsafe_set_env("SB_TEST_NOT_A_SEED", "SUnot-a-seed");
        let keyed = ClusterConfig {
            user: None,
            password_env: None,
            nkey_seed_env: Some("SB_TEST_NKEY_SEED".into()),
            ..secure.clone()
        };
        assert_eq!(keyed.check().unwrap().nkey_seed, Some(seed));
        let e = refused(ClusterConfig {
            nkey_seed_env: Some("SB_TEST_NOT_A_SEED".into()),
            ..keyed.clone()
        });
        assert!(e.contains("does not hold an nkey seed"), "{e}");
        let e = refused(ClusterConfig {
            nkey_seed_env: Some("SB_TEST_NKEY_SEED".into()),
            ..secure.clone()
        });
        assert!(e.contains("give one NATS credential"), "{e}");
        let e = refused(ClusterConfig {
            token_env: Some("SB_TEST_NATS_PASSWORD".into()),
            ..secure.clone()
        });
        assert!(
            e.contains("token_env is one secret every client shares"),
            "{e}"
        );
        let e = refused(ClusterConfig {
            tls_cert: Some(ca.display().to_string()),
            tls_ca: Some("/nonexistent/ca.pem".into()),
            ..secure
        });
        assert!(
            e.contains("tls_ca `/nonexistent/ca.pem` is not a readable file")
                && e.contains("tls_cert and tls_key go together"),
            "{e}"
        );
    }

    /// Why `section` is refused.
    fn refused(section: ClusterConfig) -> String {
        section.check().unwrap_err().to_string()
    }

    /// Sets a variable only this test reads.
    fn unsafe_set_env(name: &str, value: &str) {
        // SAFETY: the variable is this test's own; no other thread reads or writes it.
        unsafe { std::env::set_var(name, value) };
    }
}
