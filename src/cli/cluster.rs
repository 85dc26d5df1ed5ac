//! `shadowbrain cluster init`: makes the credentials of a secured cluster (an nkey per
//! node, the cluster secret) as files to hand to the NATS servers and to each node
//! (docs/cluster.md, "Securing the cluster").

use std::path::PathBuf;

use clap::Subcommand;

/// `shadowbrain cluster …`.
#[derive(Debug, Subcommand)]
pub enum ClusterCommand {
    /// Make an nkey per node and the cluster secret: `nats-servers.env` (the nodes' public
    /// keys, for the NATS servers) and `node<i>.env` (one node's seed and the secret, for
    /// that node only). Never overwrites a file.
    Init {
        /// How many nodes (named node0, node1, … as docs/cluster/ names them).
        #[arg(long, default_value_t = 3)]
        nodes: usize,
        /// Where to write the files (created when missing).
        #[arg(long)]
        dir: PathBuf,
    },
}

pub fn run(command: ClusterCommand) -> anyhow::Result<()> {
    match command {
        ClusterCommand::Init { nodes, dir } => {
            let made = shadowbrain::cluster::init::init(nodes, &dir)?;
            eprintln!(
                "for the NATS servers' environment (public keys): {}",
                made.servers.display()
            );
            for (i, path) in made.nodes.iter().enumerate() {
                eprintln!(
                    "for node{i}'s environment only (secret): {}",
                    path.display()
                );
            }
            Ok(())
        }
    }
}
