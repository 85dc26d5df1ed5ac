//! Command-line parsing and the commands themselves: `serve` and `mcp` (the MCP server over
//! stdio, [`shadowbrain::mcp`]) here, the one-shot commands
//! in the submodules — [`memory`] (record, recall, timeline, inspect), [`policy`] (policy
//! check), [`transfer`] (export, import, reindex), [`simulate`] (the policy lab) and
//! [`eval`] (retrieval benchmarks). Commands go through the library and
//! never touch store files themselves. One that opens a data directory first checks that no
//! other process holds it, and refuses politely instead of failing on the store's lock; a
//! command that only reads refuses a directory that does not exist rather than creating an
//! empty one.

mod cluster;
mod eval;
mod memory;
mod policy;
mod simulate;
mod transfer;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use shadowbrain::auth::DEFAULT_NAMESPACE;
use shadowbrain::config::ConfigFile;
use shadowbrain::http;
use shadowbrain::setup::{
    Choice, HOLDER, SERVE_URL, backend_of, embedder_for, refuse_if_held, with_namespace_policies,
};
use shadowbrain::{Runtime, RuntimeConfig};

/// shadowbrain: long-term memory for LLM agents.
#[derive(Debug, Parser)]
#[command(version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Where the data lives.
#[derive(Debug, Args)]
struct DataDir {
    /// The data directory.
    #[arg(long, env = "SHADOWBRAIN_DATA", default_value = "./shadowbrain-data")]
    data: PathBuf,
}

/// What a command that embeds (or checks embeddings) needs: the data directory and the
/// config file naming the embedder.
#[derive(Debug, Args)]
struct StoreArgs {
    #[command(flatten)]
    dir: DataDir,
    /// A config file (TOML) whose `[embedder]` section names the embedder the directory
    /// was made with (default: `auto`, the local model when installed, else `hash`); the
    /// same file `serve --config` reads.
    #[arg(long)]
    config: Option<PathBuf>,
}

/// What a command that runs the memory runtime needs.
#[derive(Debug, Args)]
struct RuntimeArgs {
    #[command(flatten)]
    store: StoreArgs,
    /// The namespace to act in (the one an API key maps to under `serve`).
    #[arg(long, default_value = DEFAULT_NAMESPACE)]
    namespace: String,
    /// A policy file (TOML); the built-in default policy without one.
    #[arg(long)]
    policy: Option<PathBuf>,
}

/// `shadowbrain mcp`.
#[derive(Debug, Args)]
struct McpArgs {
    /// The data directory (created when missing).
    #[arg(long, env = "SHADOWBRAIN_DATA", default_value = "./shadowbrain-data")]
    data: PathBuf,
    /// A config file (TOML), as for `serve`: `[embedder]`, `[llm]`, `[limits]`.
    #[arg(long)]
    config: Option<PathBuf>,
    /// A policy file (TOML); the built-in default policy without one.
    #[arg(long)]
    policy: Option<PathBuf>,
    /// The namespace every call acts in.
    #[arg(long, default_value = DEFAULT_NAMESPACE)]
    namespace: String,
    /// The session a tool call acts in when it names none.
    #[arg(long, default_value = shadowbrain::mcp::DEFAULT_SESSION)]
    session: String,
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
        /// A config file (TOML): `[embedder]` (default `auto`: the local model when installed,
        /// else `hash`), `[llm]`, `[[auth.keys]]`, `[limits]`, `[server]`, `[[namespaces]]`
        /// and `[cluster]`; any key can be overridden as `SHADOWBRAIN__SECTION__KEY`.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Join a cluster on NATS JetStream, configured by the config file's `[cluster]`
        /// section (docs/cluster.md); the data directory then holds this node's copies
        /// of the partitions.
        #[arg(long)]
        cluster: bool,
    },
    /// Serve the memory as an MCP server over stdio, for an agent host that starts it
    /// (Claude Desktop, Claude Code, Cursor, …); `serve` offers the same at `/mcp`.
    ///
    /// stdout carries the protocol only; messages go to stderr. Ends when the host closes
    /// stdin, or on SIGINT or SIGTERM, after flushing every write.
    Mcp(McpArgs),
    /// Record one event into a session and print its id.
    Record(memory::RecordArgs),
    /// Ask what a session should remember: the ranked memories with why they ranked, and
    /// the context block to put in a prompt.
    Recall(memory::RecallArgs),
    /// A session's records, newest first.
    Timeline(memory::TimelineArgs),
    /// One record with every field, and its audit history.
    Inspect(memory::InspectArgs),
    /// Policy files.
    Policy {
        #[command(subcommand)]
        command: policy::PolicyCommand,
    },
    /// Write every record of every tier and status as JSON lines, after a header line.
    ///
    /// Then purged records' tombstones, quarantine entries and recalls. The lines go to
    /// stdout (or --output), the summary to stderr.
    Export(transfer::ExportArgs),
    /// Read JSON lines written by `export` into a data directory (empty or not).
    ///
    /// Every id is kept and nothing is ever overwritten; the summary goes to stderr.
    Import(transfer::ImportArgs),
    /// Re-embed every record with the configured embedder and rebuild the vector and keyword
    /// indexes (after changing embedders, or if an index is damaged).
    Reindex(transfer::ReindexArgs),
    /// Run policies on one synthetic multi-agent workload on the virtual clock and compare
    /// them: `report.json` and `report.md` in --out (the same seed, the same workload).
    Simulate(simulate::SimulateArgs),
    /// A cluster's credentials: `cluster init` makes an nkey per node and the cluster
    /// secret (docs/cluster.md, "Securing the cluster").
    Cluster {
        #[command(subcommand)]
        command: cluster::ClusterCommand,
    },
    /// Retrieval benchmarks through the real recall path (no LLM): `eval locomo`.
    Eval {
        #[command(subcommand)]
        command: eval::EvalCommand,
    },
}

/// Reads and checks the config file (TOML), with `SHADOWBRAIN__SECTION__KEY` environment
/// overrides (see [`shadowbrain::config`]).
fn load_config(path: Option<&Path>) -> anyhow::Result<ConfigFile> {
    ConfigFile::load(path)
}

/// Opens the runtime, listens, and serves until a shutdown signal.
async fn serve(
    addr: SocketAddr,
    data: &Path,
    config: RuntimeConfig,
    file: ConfigFile,
) -> anyhow::Result<()> {
    let auth = file.auth;
    let rt = Runtime::open(config)
        .await
        .with_context(|| format!("opening the data directory {}", data.display()))?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("listening on {addr}; pick another with --addr"))?;
    if !addr.ip().is_loopback() && !auth.required() {
        tracing::warn!(%addr, "serving beyond this machine without API keys: anyone who can reach the address reads and writes namespace `default`");
    }
    let url = format!("http://{}", listener.local_addr()?);
    // Read by `shadowbrain mcp` and `Memory(path)` when they find the directory held (a
    // stale file after a crash is only ever read while a server holds the directory again
    // and rewrote it). Written before the ready line: whoever waits for that line and then
    // opens the directory is told this server's URL, not a placeholder.
    if let Err(e) = std::fs::write(data.join(SERVE_URL), &url) {
        tracing::warn!(error = %e, "cannot write {SERVE_URL} in the data directory");
    }
    // This process holds the directory now: what an in-process holder that crashed left
    // would name the wrong holder.
    let _ = std::fs::remove_file(data.join(HOLDER));
    say(format_args!("serving {} on {url}", data.display()));
    say(format_args!("MCP (Streamable HTTP) at {url}/mcp"));
    let options = http::Options {
        limits: file.limits,
        auth,
        server: file.server,
    };
    let drained = http::serve(listener, rt, options, shutdown_signal()).await;
    let _ = std::fs::remove_file(data.join(SERVE_URL));
    let drained = drained?;
    match drained.cut {
        0 => say(format_args!("drained and flushed; bye")),
        n => say(format_args!(
            "flushed; {n} connection(s) were still open at the drain deadline and were closed              (server.drain_timeout); bye"
        )),
    }
    Ok(())
}

/// `serve --cluster`: joins the cluster of the config file's `[cluster]` section and serves
/// until a shutdown signal, then hands its partitions over.
async fn serve_cluster(
    addr: SocketAddr,
    data: &Path,
    config: RuntimeConfig,
    file: ConfigFile,
) -> anyhow::Result<()> {
    let cluster = file.cluster.check()?;
    std::fs::create_dir_all(data)
        .with_context(|| format!("creating the data directory {}", data.display()))?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("listening on {addr}; pick another with --addr"))?;
    if !addr.ip().is_loopback() && !file.auth.required() {
        tracing::warn!(%addr, "serving beyond this machine without API keys: anyone who can reach the address reads and writes namespace `default`");
    }
    let url = format!("http://{}", listener.local_addr()?);
    say(format_args!(
        "node {} of the cluster at {} serving on {url} ({} partitions, data in {})",
        cluster.node,
        cluster.urls.join(","),
        cluster.partitions,
        data.display()
    ));
    let drained = shadowbrain::cluster::serve_cluster(
        listener,
        data,
        config,
        file,
        cluster,
        shutdown_signal(),
    )
    .await?;
    match drained.cut {
        0 => say(format_args!("drained, partitions handed over; bye")),
        n => say(format_args!(
            "partitions handed over; {n} connection(s) were still open at the drain deadline \
             and were closed (server.drain_timeout); bye"
        )),
    }
    Ok(())
}

/// A line for the operator on stderr. A closed stderr (a supervisor that stopped reading)
/// must not turn a clean shutdown into a panic, as `eprintln!` would.
fn say(line: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "shadowbrain: {line}");
}

/// Writes `text` and a newline to stdout. A closed stdout (`| head`) ends the command
/// quietly instead of panicking as `println!` would.
fn out(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    match writeln!(stdout, "{text}").and_then(|()| stdout.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e).context("writing to stdout"),
        _ => Ok(()),
    }
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
            cluster,
        } => {
            let (rt_config, cfg) = server_config(&data, policy.as_deref(), config.as_deref())?;
            let runtime = tokio::runtime::Runtime::new()?;
            if cluster {
                runtime.block_on(serve_cluster(addr, &data, rt_config, cfg))
            } else {
                runtime.block_on(serve(addr, &data, rt_config, cfg))
            }
        }
        Command::Mcp(args) => mcp(args),
        Command::Record(args) => memory::record(args),
        Command::Recall(args) => memory::recall(args),
        Command::Timeline(args) => memory::timeline(args),
        Command::Inspect(args) => memory::inspect(args),
        Command::Policy { command } => policy::run(command),
        Command::Export(args) => transfer::export(args),
        Command::Import(args) => transfer::import(args),
        Command::Reindex(args) => transfer::reindex(args),
        Command::Simulate(args) => simulate::simulate(args),
        Command::Cluster { command } => cluster::run(command),
        Command::Eval { command } => eval::run(command),
    }
}

/// The runtime configuration and config file of a long-running server on `data` (`serve`
/// and `mcp`, [`shadowbrain::setup::server_config`]), saying which embedder is in force.
fn server_config(
    data: &Path,
    policy: Option<&Path>,
    config: Option<&Path>,
) -> anyhow::Result<(RuntimeConfig, ConfigFile)> {
    let setup = shadowbrain::setup::server_config(data, policy, config)?;
    say(format_args!("{}", setup.embedder_note));
    Ok((setup.runtime, setup.file))
}

/// `shadowbrain mcp`: the MCP server of [`shadowbrain::mcp`] over stdio until the host
/// closes stdin or a signal, then a flushed shutdown.
fn mcp(args: McpArgs) -> anyhow::Result<()> {
    use rmcp::ServiceExt;
    let data = &args.data;
    refuse_if_held(data, |url| {
        format!(
            "point the MCP host at {url}/mcp (Streamable HTTP, the same tools), or stop the \
             server and start `shadowbrain mcp` again"
        )
    })?;
    let (rt_config, cfg) = server_config(data, args.policy.as_deref(), args.config.as_deref())?;
    let runtime = tokio::runtime::Runtime::new()?;
    let outcome = runtime.block_on(async {
        let rt = Runtime::open(rt_config)
            .await
            .with_context(|| format!("opening the data directory {}", data.display()))?;
        let server = shadowbrain::mcp::McpServer::stdio(
            rt.clone(),
            cfg.limits,
            &args.namespace,
            &args.session,
        );
        say(format_args!(
            "MCP over stdio on {} (namespace `{}`, default session `{}`)",
            data.display(),
            args.namespace,
            args.session
        ));
        let served = match server.serve(rmcp::transport::stdio()).await {
            Ok(running) => {
                let cancel = running.cancellation_token();
                tokio::select! {
                    ended = running.waiting() => ended.map(|_| ()).map_err(anyhow::Error::from),
                    () = shutdown_signal() => {
                        cancel.cancel();
                        Ok(())
                    }
                }
            }
            // The host went away before the handshake (or sent something else): nothing was
            // written; still close the store cleanly.
            Err(e) => Err(anyhow::anyhow!("the MCP handshake on stdin failed: {e}")),
        };
        let closed = rt
            .shutdown()
            .await
            .with_context(|| format!("closing the data directory {}", data.display()));
        served?;
        closed?;
        say(format_args!("flushed; bye"));
        Ok(())
    });
    // Stdin is read on a blocking thread, which a signal leaves waiting for a line that may
    // never come; everything is flushed by now, so the runtime does not wait for it.
    runtime.shutdown_background();
    outcome
}

/// Refuses a data directory that another process holds (its store's lock is taken), with
/// the way out. The store checks its lock again when it opens, so a process that starts in
/// between is still refused, only less kindly.
fn refuse_if_in_use(data: &Path) -> anyhow::Result<()> {
    refuse_if_held(data, |url| {
        format!("stop it, or talk to it over HTTP at {url} instead")
    })
}

/// Refuses a data directory without a store, for commands that only read: opening would
/// create an empty one and answer "nothing", hiding a mistyped path.
fn require_store(data: &Path) -> anyhow::Result<()> {
    if !data.join("store").is_dir() {
        anyhow::bail!(
            "there is no shadowbrain data directory at {}; pass the one `serve` uses with \
             --data (or SHADOWBRAIN_DATA)",
            data.display()
        );
    }
    Ok(())
}

/// The runtime configuration `serve` would use for these arguments, minus what only a
/// long-running server wants: no periodic decay sweep (a one-shot command must not forget
/// on the side; sweeps are the server's job).
fn runtime_config(args: &RuntimeArgs) -> anyhow::Result<RuntimeConfig> {
    let data = &args.store.dir.data;
    let mut config = RuntimeConfig::new(data);
    if let Some(policy) = &args.policy {
        config = config
            .with_policy_file(policy)
            .with_context(|| format!("loading the policy {}", policy.display()))?;
    }
    let cfg = load_config(args.store.config.as_deref())?;
    let mut config = with_namespace_policies(config, &cfg)?;
    config.substrate.embedder = embedder_for(&cfg.embedder, data, Choice::Keep(None))?.0;
    config.substrate.limits = cfg.limits;
    config.substrate.backend = backend_of(data);
    config.decay_check = None;
    Ok(config)
}

/// Opens the runtime on the data directory, runs `work`, and shuts the runtime down
/// (flushing every write, reinforcements included) whether `work` succeeded or not.
fn with_runtime<T>(
    args: &RuntimeArgs,
    create: bool,
    work: impl AsyncFnOnce(&Runtime) -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    let data = &args.store.dir.data;
    if !create {
        require_store(data)?;
    }
    refuse_if_in_use(data)?;
    let config = runtime_config(args)?;
    tokio::runtime::Runtime::new()?.block_on(async {
        let rt = Runtime::open(config)
            .await
            .with_context(|| format!("opening the data directory {}", data.display()))?;
        let out = work(&rt).await;
        let closed = rt
            .shutdown()
            .await
            .with_context(|| format!("closing the data directory {}", data.display()));
        let out = out?;
        closed?;
        Ok(out)
    })
}
