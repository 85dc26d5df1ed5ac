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
use std::sync::Arc;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use shadowbrain::Backend;
use shadowbrain::auth::DEFAULT_NAMESPACE;
use shadowbrain::config::ConfigFile;
use shadowbrain::embed::{Embedder, EmbedderConfig, EmbedderKind, build_embedder, is_model_dir};
use shadowbrain::http;
use shadowbrain::internals::{Store, StoreOptions};
use shadowbrain::llm::LlmKind;
use shadowbrain::llm::chat::ChatClient;
use shadowbrain::llm::condense::LlmCondenser;
use shadowbrain::llm::cost::Llm;
use shadowbrain::llm::judge::LlmJudge;
use shadowbrain::llm::updates::LlmUpdateJudge;
use shadowbrain::policy::{CondensationMode, EvaluationMode, Policy};
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

/// How [`embedder_for`] decides `auto`.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Choice {
    /// Keep the embedder the directory was made with; a new directory takes the one named
    /// (an import's source) or, with none, the best installed. Every command but `reindex`.
    Keep(Option<String>),
    /// The best one installed, whatever the directory has (`reindex`: switching is its job).
    Best,
}

/// The embedder for the data directory `data`: the `[embedder]` section, with `auto` decided
/// by what is installed and what the directory's store records ([`EmbedderConfig::resolve`]).
/// With `announce`, says which embedder is in force and, when it is `hash`, how to get the
/// semantic one.
fn embedder_for(
    cfg: &EmbedderConfig,
    data: &Path,
    choice: Choice,
    announce: bool,
) -> anyhow::Result<Arc<dyn Embedder>> {
    let recorded = match (cfg.kind, choice) {
        (EmbedderKind::Auto, Choice::Keep(source)) => recorded_embedder(data).or(source),
        _ => None,
    };
    let resolved = cfg.resolve(recorded.as_deref());
    let embedder = build_embedder(&resolved).context("setting up the [embedder]")?;
    if announce {
        let installed = cfg.model_dir().filter(|d| is_model_dir(d));
        let why = match (cfg.kind, resolved.kind, installed) {
            (EmbedderKind::Auto, EmbedderKind::Hash, Some(_)) => format!(
                "the data directory was made with it; the local model is installed: stop \
                 the server and run `shadowbrain reindex --data {}` for semantic recall",
                data.display()
            ),
            (EmbedderKind::Auto, EmbedderKind::Hash, None) => "lexical vectors only, no \
                 synonyms or paraphrases; for semantic recall install the local model with \
                 `scripts/install-model` (or configure [embedder])"
                .to_string(),
            (_, EmbedderKind::Local, _) => {
                "in-process; records are embedded in the background".to_string()
            }
            (_, EmbedderKind::Openai, _) => format!(
                "at {}; records are embedded in the background",
                resolved.base_url.as_deref().unwrap_or("OpenAI")
            ),
            _ => "as configured".to_string(),
        };
        say(format_args!(
            "embedder in force: {} ({} dimensions; {why})",
            embedder.name(),
            embedder.dimensions()
        ));
    }
    Ok(embedder)
}

/// The embedder a data directory's store records, if it has a store that can be read now
/// (one held by a running server cannot; the command then refuses it anyway).
fn recorded_embedder(data: &Path) -> Option<String> {
    let dir = data.join("store");
    if !dir.is_dir() {
        return None;
    }
    let store = Store::open(
        &dir,
        StoreOptions {
            backend: backend_of(data),
            ..Default::default()
        },
    )
    .ok()?;
    store.embedder_name().ok().flatten()
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
    say(format_args!("serving {} on {url}", data.display()));
    say(format_args!("MCP (Streamable HTTP) at {url}/mcp"));
    // Read by `shadowbrain mcp` when it finds the directory held (a stale file after a
    // crash is only ever read while a server holds the directory again and rewrote it).
    if let Err(e) = std::fs::write(data.join(SERVE_URL), &url) {
        tracing::warn!(error = %e, "cannot write {SERVE_URL} in the data directory");
    }
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

/// Says so at start-up when the policies and the `[llm]` section disagree: a policy asking
/// for an LLM without one configured quietly gets rules, and an LLM no policy mode uses
/// costs nothing but is probably a mistake.
fn warn_on_llm_mismatch<'a>(policies: impl IntoIterator<Item = &'a Policy>, llm: LlmKind) {
    let wants = |p: &Policy| {
        p.evaluation.mode != EvaluationMode::Rules
            || p.condensation.mode == CondensationMode::Llm
            || p.updates.mode.asks_llm()
    };
    let policies: Vec<&Policy> = policies.into_iter().collect();
    match llm {
        LlmKind::None => {
            for policy in policies.iter().filter(|p| wants(p)) {
                tracing::warn!(
                    policy = %policy.name,
                    "the policy asks for an LLM ([evaluation] or [updates] mode `llm`/`hybrid`, \
                     or [condensation] mode `llm`) but the config has no [llm] section: rules \
                     and extractive condensation stand in, and each record's history says so; \
                     add [llm] kind = \"openai\" to use one"
                );
            }
        }
        LlmKind::Openai if !policies.iter().any(|p| wants(p)) => tracing::info!(
            "[llm] is configured, but every policy uses rules and extractive condensation, \
             so it is never called; set [evaluation] mode or [condensation] mode to use it"
        ),
        LlmKind::Openai => {}
    }
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
/// and `mcp`): the policies, the embedder (announced on stderr), the limits, the
/// directory's backend, and the `[llm]` judge and condenser when configured.
fn server_config(
    data: &Path,
    policy: Option<&Path>,
    config: Option<&Path>,
) -> anyhow::Result<(RuntimeConfig, ConfigFile)> {
    let mut rt_config = RuntimeConfig::new(data);
    if let Some(policy) = policy {
        rt_config = rt_config
            .with_policy_file(policy)
            .with_context(|| format!("loading the policy {}", policy.display()))?;
    }
    let cfg = load_config(config)?;
    rt_config = with_namespace_policies(rt_config, &cfg)?;
    rt_config.substrate.embedder = embedder_for(&cfg.embedder, data, Choice::Keep(None), true)?;
    rt_config.substrate.limits = cfg.limits;
    // As for the one-shot commands: a directory made with another backend is opened
    // with it (serve has no --backend to say so).
    rt_config.substrate.backend = backend_of(data);
    if cfg.llm.kind == LlmKind::Openai {
        // The judge of `[evaluation] mode = "llm"` / `"hybrid"`, in batches of the
        // section's `batch_size`; ingest never waits for it.
        let client = ChatClient::new(&cfg.llm).context("setting up the [llm] endpoint")?;
        let llm = Arc::new(Llm::new(Arc::new(client), cfg.llm.tokens_per_hour));
        let judge = LlmJudge::with_options(llm.clone(), cfg.llm.judge_options());
        rt_config.judge = Some(Arc::new(judge));
        // The judge of `[updates] mode = "llm"` / `"hybrid"`: same client, budget, batch
        // size and cache size; asked by the Evaluator in the background.
        rt_config.update_judge = Some(Arc::new(LlmUpdateJudge::new(
            llm.clone(),
            cfg.llm.batch_size,
            cfg.llm.cache_entries,
        )));
        // The condenser of `[condensation] mode = "llm"`, on the same client and
        // budget.
        rt_config.summarizer = Some(Arc::new(LlmCondenser::new(llm.clone())));
        rt_config.llm = Some(llm);
        rt_config.evaluation_batch = cfg.llm.batch_size;
        rt_config.evaluation_concurrency = cfg.llm.max_concurrency;
        rt_config.evaluation_wait = cfg.llm.batch_wait()?;
    }
    let substrate = &rt_config.substrate;
    warn_on_llm_mismatch(
        std::iter::once(&substrate.policy).chain(substrate.namespace_policies.values()),
        cfg.llm.kind,
    );
    Ok((rt_config, cfg))
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

/// The file in a data directory where `serve` writes the URL it listens on, so a command
/// refused the directory can say where the server is.
const SERVE_URL: &str = "serve.url";

/// Refuses a data directory that another process holds (its store's lock is taken), with
/// the way out. The store checks its lock again when it opens, so a process that starts in
/// between is still refused, only less kindly.
fn refuse_if_in_use(data: &Path) -> anyhow::Result<()> {
    refuse_if_held(data, |url| {
        format!("stop it, or talk to it over HTTP at {url} instead")
    })
}

/// [`refuse_if_in_use`] with the way out said by `way_out`, given the holding server's URL
/// (from the directory's [`SERVE_URL`] file, which `serve` writes).
fn refuse_if_held(data: &Path, way_out: impl FnOnce(&str) -> String) -> anyhow::Result<()> {
    let busy = Store::in_use(&data.join("store"))
        .with_context(|| format!("checking whether {} is in use", data.display()))?;
    if busy {
        let url = std::fs::read_to_string(data.join(SERVE_URL));
        let url = url.as_deref().map_or("http://HOST:PORT", str::trim);
        anyhow::bail!(
            "the data directory {} is in use by another shadowbrain process (a running \
             `shadowbrain serve`?); {}",
            data.display(),
            way_out(url)
        );
    }
    Ok(())
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

/// The backend the directory's store was made with (a new store gets the default).
fn backend_of(data: &Path) -> Backend {
    Store::detect_backend(&data.join("store")).unwrap_or_default()
}

/// `config` with the policies of the config file's `[[namespaces]]` read.
fn with_namespace_policies(
    mut config: RuntimeConfig,
    cfg: &ConfigFile,
) -> anyhow::Result<RuntimeConfig> {
    for entry in &cfg.namespaces {
        config = config
            .with_namespace_policy_file(&entry.name, &entry.policy)
            .with_context(|| {
                format!(
                    "loading the policy {} of namespace {:?} ([[namespaces]])",
                    entry.policy.display(),
                    entry.name
                )
            })?;
    }
    Ok(config)
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
    config.substrate.embedder = embedder_for(&cfg.embedder, data, Choice::Keep(None), false)?;
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
