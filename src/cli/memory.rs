//! The commands an agent's developer runs by hand against a data directory: `record`,
//! `recall`, `timeline` and `inspect`. Each opens the actor runtime, as `serve` does, and
//! calls its handle, so importance rules, condensation triggers, recall reinforcement and
//! namespace isolation behave exactly as over HTTP; `--json` prints the HTTP API's body for
//! the same question (the same [`api`] types), so scripts can move between the two without
//! translating.

use clap::{Args, ValueEnum};
use serde_json::{Value, json};
use shadowbrain::Limits;
use shadowbrain::api;
use shadowbrain::{
    MemoryId, NewMemory, RecallRequest, Scope, Timestamp, parse_rfc3339, to_human, to_rfc3339,
};

use super::{RuntimeArgs, load_config, out, with_runtime};

/// `shadowbrain record`.
#[derive(Debug, Args)]
pub struct RecordArgs {
    #[command(flatten)]
    runtime: RuntimeArgs,
    /// The session to record into (1–128 of A-Z a-z 0-9 . _ : -).
    #[arg(long)]
    session: String,
    /// The event kind: thought, action, observation, user_message, goal, feedback, or a
    /// custom name matching [a-z][a-z0-9_]{0,31}.
    #[arg(long)]
    kind: String,
    /// The text to remember (derived from --content when left out).
    #[arg(long, required_unless_present = "content")]
    text: Option<String>,
    /// Structured content, as JSON (e.g. '{"tool":"grep","args":["-r","TODO"]}').
    #[arg(long, value_name = "JSON", value_parser = json_arg)]
    content: Option<Value>,
    /// The agent that produced the event.
    #[arg(long)]
    agent: Option<String>,
    /// Importance from 0 to 10 (the policy's rules decide without it).
    #[arg(long)]
    importance: Option<f32>,
    /// Free-form metadata, as JSON.
    #[arg(long, value_name = "JSON", value_parser = json_arg)]
    metadata: Option<Value>,
    /// The id of the event this one follows from.
    #[arg(long)]
    parent: Option<String>,
    /// When it happened, RFC 3339 (default: now).
    #[arg(long, value_name = "RFC3339")]
    timestamp: Option<String>,
    /// Write it pinned: it never fades.
    #[arg(long)]
    pinned: bool,
}

/// Where recall looks (`--scope`).
#[derive(Debug, Clone, Copy, ValueEnum)]
enum ScopeArg {
    /// The session only.
    Session,
    /// Every session of `--agent`.
    Agent,
    /// The whole namespace.
    Namespace,
}

impl From<ScopeArg> for Scope {
    fn from(s: ScopeArg) -> Scope {
        match s {
            ScopeArg::Session => Scope::Session,
            ScopeArg::Agent => Scope::Agent,
            ScopeArg::Namespace => Scope::Namespace,
        }
    }
}

/// `shadowbrain recall`.
#[derive(Debug, Args)]
pub struct RecallArgs {
    #[command(flatten)]
    runtime: RuntimeArgs,
    /// The asking session.
    #[arg(long)]
    session: String,
    /// What to remember about.
    query: String,
    /// How many memories (1 to 200, or the config file's `[limits] max_k`).
    #[arg(long, default_value_t = 10)]
    k: usize,
    /// Where to look.
    #[arg(long, value_enum, default_value = "session")]
    scope: ScopeArg,
    /// The asking agent (needed by `--scope agent`).
    #[arg(long)]
    agent: Option<String>,
    /// Only these kinds (comma-separated).
    #[arg(long, value_delimiter = ',')]
    kinds: Option<Vec<String>>,
    /// Only events at or after this time (RFC 3339).
    #[arg(long, value_name = "RFC3339")]
    since: Option<String>,
    /// Only events at or before this time (RFC 3339).
    #[arg(long, value_name = "RFC3339")]
    until: Option<String>,
    /// Leave the namespace's knowledge pool out.
    #[arg(long)]
    no_knowledge: bool,
    /// Trim the answer to about this many tokens (at most 32768, or the config file's
    /// `[limits] max_token_budget`).
    #[arg(long)]
    token_budget: Option<usize>,
    /// Print the HTTP API's recall answer (JSON) instead.
    #[arg(long)]
    json: bool,
}

/// `shadowbrain timeline`.
#[derive(Debug, Args)]
pub struct TimelineArgs {
    #[command(flatten)]
    runtime: RuntimeArgs,
    /// The session.
    #[arg(long)]
    session: String,
    /// How many records, newest first (1 to 1000, or the config file's `[limits]
    /// max_timeline`).
    #[arg(long, default_value_t = 20)]
    limit: usize,
    /// Print the HTTP API's timeline answer (JSON) instead.
    #[arg(long)]
    json: bool,
}

/// `shadowbrain inspect`.
#[derive(Debug, Args)]
pub struct InspectArgs {
    #[command(flatten)]
    runtime: RuntimeArgs,
    /// The record's id, e.g. mem-0000002a.
    id: String,
    /// Print `{"memory": record, "history": entries}` as the HTTP API shapes them.
    #[arg(long)]
    json: bool,
}

/// Parses a JSON argument, saying how to quote it when it is not JSON.
fn json_arg(s: &str) -> Result<Value, String> {
    serde_json::from_str(s).map_err(|e| {
        format!("not JSON ({e}); quote it for the shell, e.g. --content '{{\"tool\":\"grep\"}}'")
    })
}

fn time_arg(field: &str, s: Option<&str>) -> anyhow::Result<Option<Timestamp>> {
    Ok(s.map(|s| parse_rfc3339(field, s)).transpose()?)
}

fn out_json(value: &impl serde::Serialize) -> anyhow::Result<()> {
    out(&serde_json::to_string_pretty(value)?)
}

pub(super) fn record(args: RecordArgs) -> anyhow::Result<()> {
    // Checked here so the error names the flag, not the HTTP body's field.
    if let Some(i) = args.importance
        && !(i.is_finite() && (0.0..=10.0).contains(&i))
    {
        anyhow::bail!(
            "--importance {i} is not a number from 0 to 10; pass one, e.g. --importance 7"
        );
    }
    let event = NewMemory {
        kind: args.kind,
        text: args.text,
        content: args.content,
        agent_id: args.agent,
        metadata: args.metadata,
        parent_id: args.parent,
        timestamp: time_arg("timestamp", args.timestamp.as_deref())?,
        importance: args.importance,
        embedding: None,
        pinned: args.pinned,
    };
    let (namespace, session) = (args.runtime.namespace.clone(), args.session);
    let id = with_runtime(&args.runtime, true, async |rt| {
        Ok(rt.session(&namespace, &session)?.record(event).await?)
    })?;
    out(&id.to_string())
}

/// The `[limits]` of the config file the command was given: the CLI enforces what `serve`
/// with the same file would.
fn config_limits(args: &RuntimeArgs) -> anyhow::Result<Limits> {
    Ok(load_config(args.store.config.as_deref())?.limits)
}

pub(super) fn recall(args: RecallArgs) -> anyhow::Result<()> {
    let limits = config_limits(&args.runtime)?;
    if !(1..=limits.max_k).contains(&args.k) {
        anyhow::bail!(
            "--k {} is out of range; ask for 1 to {} memories",
            args.k,
            limits.max_k
        );
    }
    let max_budget = limits.max_token_budget;
    if let Some(budget) = args.token_budget.filter(|&b| b > max_budget) {
        anyhow::bail!("--token-budget {budget} is over the limit of {max_budget}; ask for less");
    }
    let namespace = args.runtime.namespace.clone();
    let mut request = RecallRequest::new(&namespace, &args.session, &args.query);
    request.k = args.k;
    request.scope = args.scope.into();
    request.agent_id = args.agent;
    request.kinds = args.kinds;
    request.since = time_arg("since", args.since.as_deref())?;
    request.until = time_arg("until", args.until.as_deref())?;
    request.include_knowledge = !args.no_knowledge;
    request.token_budget = args.token_budget;
    let session = args.session;
    let result = with_runtime(&args.runtime, false, async |rt| {
        Ok(rt
            .session(&namespace, &session)?
            .recall_with(request)
            .await?)
    })?;
    if args.json {
        return out_json(&api::RecallOut::from(result));
    }
    let n = result.memories.len();
    out(&format!(
        "{n} memor{} for \"{}\" (policy {} {}; feedback id {})",
        if n == 1 { "y" } else { "ies" },
        args.query,
        result.policy.name,
        result.policy.hash,
        result.recall_id.as_deref().unwrap_or("none"),
    ))?;
    for (i, m) in result.memories.iter().enumerate() {
        let r = &m.record;
        out(&format!(
            "{:>3}. {}  score {:.3}  (relevance {:.3}, recency {:.3}, importance {:.3}, utility {:.3})",
            i + 1,
            r.id,
            m.score,
            m.why.relevance,
            m.why.recency,
            m.why.importance,
            m.why.utility
        ))?;
        out(&format!(
            "     {} {} in {} at {}: {}",
            r.tier.as_str(),
            r.kind,
            r.session_id,
            to_human(r.event_time),
            one_line(&r.text)
        ))?;
    }
    out("\ncontext:")?;
    out(&result.context)
}

pub(super) fn timeline(args: TimelineArgs) -> anyhow::Result<()> {
    let max = config_limits(&args.runtime)?.max_timeline;
    if !(1..=max).contains(&args.limit) {
        anyhow::bail!(
            "--limit {} is out of range; ask for 1 to {max} records",
            args.limit
        );
    }
    let (namespace, session, limit) = (args.runtime.namespace.clone(), args.session, args.limit);
    let records = with_runtime(&args.runtime, false, async |rt| {
        Ok(rt.session(&namespace, &session)?.timeline(limit).await?)
    })?;
    if args.json {
        return out_json(&api::Timeline {
            items: records.iter().cloned().map(api::Memory::from).collect(),
        });
    }
    if records.is_empty() {
        return out(&format!(
            "session `{session}` of namespace `{namespace}` has no records"
        ));
    }
    for r in &records {
        out(&format!(
            "{}  {}  {:<12} {} {} importance {}  {}",
            r.id,
            to_human(r.event_time),
            r.kind,
            r.tier.as_str(),
            r.status.as_str(),
            r.importance,
            one_line(&r.text)
        ))?;
    }
    Ok(())
}

pub(super) fn inspect(args: InspectArgs) -> anyhow::Result<()> {
    let id: MemoryId = args.id.parse()?;
    let namespace = args.runtime.namespace.clone();
    let (record, history) = with_runtime(&args.runtime, false, async |rt| {
        let memory = rt.memory(&namespace, id)?;
        Ok((memory.get().await?, memory.history().await?))
    })?;
    if args.json {
        let history: Vec<api::HistoryEntry> = history.into_iter().map(Into::into).collect();
        return out_json(&json!({ "memory": api::Memory::from(record), "history": history }));
    }
    let mut fields = serde_json::to_value(api::Memory::from(record.clone()))?;
    if let Some(map) = fields.as_object_mut() {
        // The vector itself is noise on a terminal; its size says whether it is there.
        let embedding = match &record.embedding {
            Some(v) => format!("{} dimensions", v.len()),
            None => "none yet (waiting for the embedder)".into(),
        };
        map.insert("embedding".into(), json!(embedding));
        for (key, value) in map.iter() {
            let shown = match value {
                Value::String(s) => s.clone(),
                Value::Null => "-".into(),
                other => other.to_string(),
            };
            out(&format!("{key:>14}: {shown}"))?;
        }
    }
    out(&format!("\nhistory ({} entries):", history.len()))?;
    for e in &history {
        out(&format!(
            "  {}  {:<14} by {}: {}",
            to_rfc3339(e.at),
            serde_json::to_value(e.action)?.as_str().unwrap_or("?"),
            e.by,
            e.detail
        ))?;
    }
    Ok(())
}

/// Text on one terminal line: newlines folded, long text cut.
fn one_line(text: &str) -> String {
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() > 160 {
        format!("{}…", flat.chars().take(160).collect::<String>())
    } else {
        flat
    }
}
