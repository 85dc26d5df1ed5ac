//! `shadowbrain cluster init`: the credentials a secured cluster needs (docs/cluster.md,
//! "Securing the cluster"; `docs/cluster/`), made on one machine and handed out: an nkey
//! per node (the node keeps its seed; the NATS servers are given only the public key, so
//! nothing on a NATS server lets anyone sign in as a node) and the cluster secret every
//! node shares.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use nkeys::KeyPair;

/// The files [`init`] writes, by the machines they go to.
#[derive(Debug)]
pub struct Made {
    /// For the NATS servers' environment: each node's public key
    /// (`SB_NODE<i>_NKEY`, which `docs/cluster/shadowbrain.conf` reads).
    pub servers: PathBuf,
    /// One per node, for its environment only: its seed (`SB_NATS_NKEY_SEED`) and the
    /// cluster secret (`SB_CLUSTER_SECRET`), as `docs/cluster/node.toml` names them.
    pub nodes: Vec<PathBuf>,
}

/// Writes `text` to a new file readable by its owner only; an existing file is never
/// overwritten (it may hold the keys of a running cluster).
fn write_new(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| {
            format!(
                "writing {} (an existing file is never overwritten: it may hold the keys of \
                 a running cluster; choose another --dir)",
                path.display()
            )
        })?;
    file.write_all(text.as_bytes())?;
    Ok(())
}

/// Makes the credentials of `nodes` nodes (named `node0`, `node1`, … as the example
/// configuration names them) in `dir`.
pub fn init(nodes: usize, dir: &Path) -> anyhow::Result<Made> {
    anyhow::ensure!(
        (1..=64).contains(&nodes),
        "--nodes is {nodes}; use 1 to 64 (three for a cluster that survives one node's loss)"
    );
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    // 32 random bytes, hex: as the dashboard makes its tokens.
    let secret = crate::auth::random_token();
    let mut servers = String::from(
        "# The public nkeys of the shadowbrain nodes, for the NATS servers' environment\n\
         # (docs/cluster/shadowbrain.conf reads them). Public: not a secret.\n",
    );
    let mut made = Vec::with_capacity(nodes);
    for i in 0..nodes {
        let key = KeyPair::new_user();
        let seed = key.seed().context("reading the nkey's seed")?;
        servers.push_str(&format!("SB_NODE{i}_NKEY={}\n", key.public_key()));
        let path = dir.join(format!("node{i}.env"));
        write_new(
            &path,
            &format!(
                "# node{i}'s environment only: its NATS nkey seed and the cluster secret\n\
                 # (docs/cluster/node.toml names both). Keep it secret.\n\
                 SB_NATS_NKEY_SEED={seed}\nSB_CLUSTER_SECRET={secret}\n"
            ),
        )?;
        made.push(path);
    }
    let server_file = dir.join("nats-servers.env");
    write_new(&server_file, &servers)?;
    Ok(Made {
        servers: server_file,
        nodes: made,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_file(path: &Path) -> std::collections::BTreeMap<String, String> {
        std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn each_node_gets_its_own_key_and_all_the_same_secret() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let made = init(3, dir.path()).unwrap();
        let servers = env_file(&made.servers);
        let mut secrets = Vec::new();
        for (i, path) in made.nodes.iter().enumerate() {
            let node = env_file(path);
            let seed = KeyPair::from_seed(&node["SB_NATS_NKEY_SEED"]).unwrap();
            assert_eq!(seed.public_key(), servers[&format!("SB_NODE{i}_NKEY")]);
            assert!(seed.public_key().starts_with('U'));
            assert_eq!(node["SB_CLUSTER_SECRET"].len(), 64);
            secrets.push(node["SB_CLUSTER_SECRET"].clone());
            let mode = std::fs::metadata(path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600, "{}", path.display());
        }
        assert!(secrets.iter().all(|s| *s == secrets[0]));
        assert_eq!(
            servers
                .values()
                .collect::<std::collections::BTreeSet<_>>()
                .len(),
            3
        );
        // Never over the keys of a running cluster.
        let again = init(3, dir.path()).unwrap_err();
        assert!(
            format!("{again:#}").contains("never overwritten"),
            "{again:#}"
        );
        assert!(init(0, dir.path()).is_err());
    }
}
