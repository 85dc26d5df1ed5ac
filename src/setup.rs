//! Opening a data directory as `serve` opens it: the config file and the policies read into
//! the runtime's configuration, the embedder chosen by what is installed and what the
//! directory was made with, the `[llm]` judge and condenser set up, and a directory another
//! process holds refused with the way out. The binary's commands and [`crate::embedded`]
//! (the Python package's `Memory(path)`) open directories here, so an application embedding
//! the server's contract gets the defaults `serve` has.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;

use crate::config::ConfigFile;
use crate::embed::{Embedder, EmbedderConfig, EmbedderKind, build_embedder, is_model_dir};
use crate::internals::{Store, StoreOptions};
use crate::llm::LlmKind;
use crate::llm::chat::ChatClient;
use crate::llm::condense::LlmCondenser;
use crate::llm::cost::Llm;
use crate::llm::judge::LlmJudge;
use crate::llm::updates::LlmUpdateJudge;
use crate::policy::{CondensationMode, EvaluationMode, Policy};
use crate::{Backend, RuntimeConfig};

/// How [`embedder_for`] decides `auto`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    /// Keep the embedder the directory was made with; a new directory takes the one named
    /// (an import's source) or, with none, the best installed. Every command but `reindex`.
    Keep(Option<String>),
    /// The best one installed, whatever the directory has (`reindex`: switching is its job).
    Best,
}

/// The embedder for the data directory `data`: the `[embedder]` section, with `auto` decided
/// by what is installed and what the directory's store records ([`EmbedderConfig::resolve`]);
/// and a line for the operator saying which embedder is in force and, when it is `hash`,
/// how to get the semantic one.
pub fn embedder_for(
    cfg: &EmbedderConfig,
    data: &Path,
    choice: Choice,
) -> anyhow::Result<(Arc<dyn Embedder>, String)> {
    let recorded = match (cfg.kind, choice) {
        (EmbedderKind::Auto, Choice::Keep(source)) => recorded_embedder(data).or(source),
        _ => None,
    };
    let resolved = cfg.resolve(recorded.as_deref());
    let embedder = build_embedder(&resolved).context("setting up the [embedder]")?;
    let installed = cfg.model_dir().filter(|d| is_model_dir(d));
    let why = match (cfg.kind, resolved.kind, installed) {
        (EmbedderKind::Auto, EmbedderKind::Hash, Some(_)) => format!(
            "the data directory was made with it; the local model is installed: stop the \
             server and run `shadowbrain reindex --data {}` for semantic recall",
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
    let note = format!(
        "embedder in force: {} ({} dimensions; {why})",
        embedder.name(),
        embedder.dimensions()
    );
    Ok((embedder, note))
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

/// What a long-running server opens `data` with (`serve`, `mcp`, an embedded server).
pub struct ServerSetup {
    /// The runtime's configuration: the policies, the embedder, the limits, the
    /// directory's backend, and the `[llm]` judge and condenser when configured.
    pub runtime: RuntimeConfig,
    /// The config file as read.
    pub file: ConfigFile,
    /// The line that says which embedder is in force (see [`embedder_for`]).
    pub embedder_note: String,
}

/// The runtime configuration and config file of a long-running server on `data` (`serve`,
/// `mcp` and [`crate::embedded`]), from the policy file `policy` and the config file
/// `config` (with `SHADOWBRAIN__SECTION__KEY` overrides; none: the defaults).
pub fn server_config(
    data: &Path,
    policy: Option<&Path>,
    config: Option<&Path>,
) -> anyhow::Result<ServerSetup> {
    let mut rt_config = RuntimeConfig::new(data);
    if let Some(policy) = policy {
        rt_config = rt_config
            .with_policy_file(policy)
            .with_context(|| format!("loading the policy {}", policy.display()))?;
    }
    let cfg = ConfigFile::load(config)?;
    rt_config = with_namespace_policies(rt_config, &cfg)?;
    let (embedder, embedder_note) = embedder_for(&cfg.embedder, data, Choice::Keep(None))?;
    rt_config.substrate.embedder = embedder;
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
    Ok(ServerSetup {
        runtime: rt_config,
        file: cfg,
        embedder_note,
    })
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

/// `config` with the policies of the config file's `[[namespaces]]` read.
pub fn with_namespace_policies(
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

/// The backend the directory's store was made with (a new store gets the default).
pub fn backend_of(data: &Path) -> Backend {
    Store::detect_backend(&data.join("store")).unwrap_or_default()
}

/// The file in a data directory where `serve` writes the URL it listens on, so a command
/// refused the directory can say where the server is.
pub const SERVE_URL: &str = "serve.url";

/// The file in a data directory where a process that opened it in-process
/// ([`crate::embedded`]) says who it is, so another one refused the directory can name it.
pub const HOLDER: &str = "holder";

/// Refuses a data directory that another process holds (its store's lock is taken), naming
/// the holder: the URL of the `serve` that holds it (from the directory's [`SERVE_URL`]
/// file), with the way out `way_out` gives for it, or what the in-process holder wrote in
/// [`HOLDER`]. The store checks its lock again when it opens, so a process that starts in
/// between is still refused, only less kindly.
pub fn refuse_if_held(data: &Path, way_out: impl FnOnce(&str) -> String) -> anyhow::Result<()> {
    let busy = Store::in_use(&data.join("store"))
        .with_context(|| format!("checking whether {} is in use", data.display()))?;
    if !busy {
        return Ok(());
    }
    let why = match std::fs::read_to_string(data.join(HOLDER)) {
        Ok(holder) => format!(
            "the data directory {} is in use by {}; close it there or wait for that process \
             to end",
            data.display(),
            holder.trim()
        ),
        Err(_) => {
            let url = std::fs::read_to_string(data.join(SERVE_URL));
            let url = url.as_deref().map_or("http://HOST:PORT", str::trim);
            format!(
                "the data directory {} is in use by another shadowbrain process (a running \
                 `shadowbrain serve`?); {}",
                data.display(),
                way_out(url)
            )
        }
    };
    Err(DirectoryHeld(why).into())
}

/// [`refuse_if_held`]'s refusal: another process holds the data directory. Its message
/// names the holder and the way out.
#[derive(Debug)]
pub struct DirectoryHeld(pub String);

impl std::fmt::Display for DirectoryHeld {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for DirectoryHeld {}
