//! Command-line parsing and the commands themselves. Each command opens the data directory
//! through the library; a directory held by a running process is refused by the store's
//! lock with a message that says so.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, Subcommand};
use shadowbrain_runtime::embed::{EmbedderConfig, build_embedder};
use shadowbrain_runtime::kv::Backend;
use shadowbrain_runtime::substrate::{Substrate, SubstrateOptions};

/// shadowbrain: long-term memory for LLM agents.
#[derive(Debug, Parser)]
#[command(version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Re-embed every record with the configured embedder and rebuild the vector and keyword
    /// indexes (after changing embedders, or if an index is damaged).
    Reindex {
        /// The data directory.
        #[arg(long, env = "SHADOWBRAIN_DATA", default_value = "./shadowbrain-data")]
        data: PathBuf,
        /// The store backend the directory was created with.
        #[arg(long, default_value = "lmdb")]
        backend: Backend,
        /// A config file whose `[embedder]` section names the embedder (default: `hash`).
        #[arg(long)]
        config: Option<PathBuf>,
    },
}

/// Reads the `[embedder]` section of a config file (env overrides `SHADOWBRAIN__EMBEDDER__…`).
fn embedder_config(path: Option<&Path>) -> anyhow::Result<EmbedderConfig> {
    let mut builder = config::Config::builder();
    if let Some(p) = path {
        builder = builder.add_source(config::File::from(p).format(config::FileFormat::Toml));
    }
    let cfg = builder
        .add_source(
            config::Environment::with_prefix("SHADOWBRAIN")
                .prefix_separator("__")
                .separator("__")
                .try_parsing(true),
        )
        .build()
        .with_context(|| "reading the config file")?;
    match cfg.get::<EmbedderConfig>("embedder") {
        Ok(c) => Ok(c),
        Err(config::ConfigError::NotFound(_)) => Ok(EmbedderConfig::default()),
        Err(e) => Err(anyhow::anyhow!("the [embedder] section is invalid: {e}")),
    }
}

/// Runs a parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Reindex {
            data,
            backend,
            config,
        } => {
            let embedder = build_embedder(&embedder_config(config.as_deref())?)?;
            let opts = SubstrateOptions {
                backend,
                embedder: Arc::clone(&embedder),
                ..SubstrateOptions::default()
            };
            let rt = tokio::runtime::Runtime::new()?;
            let started = std::time::Instant::now();
            let sub = rt.block_on(Substrate::reindex(&data, opts, |done, total| {
                if done == total || done % 10_000 < 256 {
                    eprintln!("reindex: {done}/{total} records re-embedded");
                }
            }))?;
            let n = sub.store().len();
            sub.close()?;
            println!(
                "reindexed {n} records in {} with `{}` ({} dimensions) in {:.1} s",
                data.display(),
                embedder.name(),
                embedder.dimensions(),
                started.elapsed().as_secs_f64()
            );
            Ok(())
        }
    }
}
