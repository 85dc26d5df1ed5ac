//! Command-line parsing and the commands themselves. Each command opens the data directory
//! through the library; a directory held by a running process is refused by the store's
//! lock with a message that says so.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, Subcommand};
use shadowbrain::server::{self, ApiKey, Auth, Limits};
use shadowbrain::{Runtime, RuntimeConfig};
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
    /// Serve the HTTP API on the data directory until SIGINT or SIGTERM, then drain, flush
    /// and exit 0.
    Serve {
        /// Address to listen on.
        #[arg(long, env = "SHADOWBRAIN_ADDR", default_value = "127.0.0.1:7420")]
        addr: SocketAddr,
        /// The data directory (created when missing).
        #[arg(long, env = "SHADOWBRAIN_DATA", default_value = "./shadowbrain-data")]
        data: PathBuf,
        /// A policy file (TOML); the built-in default policy without one.
        #[arg(long)]
        policy: Option<PathBuf>,
        /// A config file (TOML): `[embedder]` (default: `hash`) and `[[auth.keys]]`.
        #[arg(long)]
        config: Option<PathBuf>,
    },
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

/// Reads the config file (TOML), with `SHADOWBRAIN__SECTION__KEY` environment overrides.
fn load_config(path: Option<&Path>) -> anyhow::Result<config::Config> {
    let mut builder = config::Config::builder();
    if let Some(p) = path {
        builder = builder.add_source(config::File::from(p).format(config::FileFormat::Toml));
    }
    builder
        .add_source(
            config::Environment::with_prefix("SHADOWBRAIN")
                .prefix_separator("__")
                .separator("__")
                .try_parsing(true),
        )
        .build()
        .with_context(|| "reading the config file")
}

/// The `[embedder]` section (default: `hash`).
fn embedder_config(cfg: &config::Config) -> anyhow::Result<EmbedderConfig> {
    match cfg.get::<EmbedderConfig>("embedder") {
        Ok(c) => Ok(c),
        Err(config::ConfigError::NotFound(_)) => Ok(EmbedderConfig::default()),
        Err(e) => Err(anyhow::anyhow!("the [embedder] section is invalid: {e}")),
    }
}

/// The `[[auth.keys]]` of the config file (none: no key needed, namespace `default`).
fn auth(cfg: &config::Config) -> anyhow::Result<Auth> {
    match cfg.get::<Vec<ApiKey>>("auth.keys") {
        Ok(keys) => Auth::with_keys(&keys),
        Err(config::ConfigError::NotFound(_)) => Ok(Auth::open()),
        Err(e) => Err(anyhow::anyhow!(
            "the [[auth.keys]] entries are invalid: {e}; each needs `sha256` (hex SHA-256 of \
             the key) and `namespace`"
        )),
    }
}

/// Opens the runtime, listens, and serves until a shutdown signal.
async fn serve(
    addr: SocketAddr,
    data: &Path,
    config: RuntimeConfig,
    auth: Auth,
) -> anyhow::Result<()> {
    let rt = Runtime::open(config)
        .await
        .with_context(|| format!("opening the data directory {}", data.display()))?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("listening on {addr}; pick another with --addr"))?;
    if !addr.ip().is_loopback() && !auth.required() {
        tracing::warn!(%addr, "serving beyond this machine without API keys: anyone who can reach the address reads and writes namespace `default`");
    }
    say(format_args!(
        "serving {} on http://{}",
        data.display(),
        listener.local_addr()?
    ));
    server::serve(listener, rt, Limits::default(), auth, shutdown_signal()).await?;
    say(format_args!("drained and flushed; bye"));
    Ok(())
}

/// A line for the operator on stderr. A closed stderr (a supervisor that stopped reading)
/// must not turn a clean shutdown into a panic, as `eprintln!` would.
fn say(line: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "shadowbrain: {line}");
}

/// Completes on SIGINT (Ctrl-C) or SIGTERM.
async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(
            tokio::signal::unix::SignalKind::terminate(),
        ) {
            Ok(term) => term,
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM; Ctrl-C still stops the server");
                let _ = interrupt.await;
                return;
            }
        };
        tokio::select! {
            _ = interrupt => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = interrupt.await;
}

/// Runs a parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve {
            addr,
            data,
            policy,
            config,
        } => {
            let mut rt_config = RuntimeConfig::new(&data);
            if let Some(policy) = policy {
                rt_config = rt_config
                    .with_policy_file(&policy)
                    .with_context(|| format!("loading the policy {}", policy.display()))?;
            }
            let cfg = load_config(config.as_deref())?;
            rt_config.substrate.embedder = build_embedder(&embedder_config(&cfg)?)?;
            let auth = auth(&cfg)?;
            tokio::runtime::Runtime::new()?.block_on(serve(addr, &data, rt_config, auth))
        }
        Command::Reindex {
            data,
            backend,
            config,
        } => {
            let embedder = build_embedder(&embedder_config(&load_config(config.as_deref())?)?)?;
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
