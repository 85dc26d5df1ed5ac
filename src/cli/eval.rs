//! `shadowbrain eval`: retrieval benchmarks through the real recall path. `eval locomo`
//! and `eval beam` ingest each conversation into a scratch store, ask every question
//! through recall and through plain BM25, print recall@k per group beside the baseline, and
//! write `summary.json` and `ranked.jsonl` to `--out`, so a failure can be studied question
//! by question and the figures re-checked by anyone.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use clap::{Args, Subcommand};
use shadowbrain::embed::{CacheStats, EmbedderConfig, EmbedderKind, build_embedder};
use shadowbrain::eval::{self, Conversation, Layout};
use shadowbrain::policy::Policy;
use shadowbrain::{Substrate, SubstrateOptions};

use super::simulate::scratch_root;
use super::transfer::bar;

/// The benchmarks `eval` runs.
#[derive(Debug, Subcommand)]
pub(super) enum EvalCommand {
    /// LoCoMo evidence recall: R@k and hit@k per question category, beside plain BM25.
    Locomo(EvalArgs),
    /// BEAM evidence recall (a split directory such as shared/data/beam/100K): R@k and
    /// hit@k per ability, beside plain BM25.
    Beam(EvalArgs),
}

/// The embedder an evaluation runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum EmbedderArg {
    /// `local` when the model is installed, else `hash` (as `serve`).
    Auto,
    /// The built-in feature hashing.
    Hash,
    /// The local sentence-transformers model (see scripts/install-model).
    Local,
}

/// Arguments of `eval locomo` and `eval beam`.
#[derive(Debug, Args)]
pub(super) struct EvalArgs {
    /// LoCoMo: `locomo10.json`; BEAM: the split's directory (`100K`). Both are in this
    /// repository's sibling `shared/data/`; neither is shipped with shadowbrain.
    #[arg(long)]
    data: PathBuf,
    /// A policy file (TOML); the built-in default policy without one. Give it several
    /// times to compare policies that differ only in `[scoring]` on one ingest: each gets
    /// its table, and with --out its own `DIR/<file stem>/`.
    #[arg(long)]
    policy: Vec<PathBuf>,
    /// The embedder.
    #[arg(long, value_enum, default_value = "auto")]
    embedder: EmbedderArg,
    /// The k values to report, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "5,10,20",
          value_parser = clap::value_parser!(u32).range(1..=shadowbrain::Limits::K_CEILING as i64))]
    k: Vec<u32>,
    /// Only these conversations, by index (LoCoMo: position in the file from 0; BEAM: the
    /// chat's number from 1): `3`, `0-4`.
    #[arg(long, value_parser = parse_range)]
    conversations: Option<(usize, usize)>,
    /// Write `summary.json` and `ranked.jsonl` here (created when missing).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Where the scratch store goes (removed at the end). Default: /dev/shm when there is
    /// one, else the system's temporary directory.
    #[arg(long)]
    scratch: Option<PathBuf>,
}

/// `A` or `A-B`, inclusive.
fn parse_range(s: &str) -> Result<(usize, usize), String> {
    let bad =
        || format!("`{s}` is not a conversation range; write one index (`3`) or a range (`0-4`)");
    let (a, b) = s.split_once('-').unwrap_or((s, s));
    let (a, b) = (
        a.trim().parse().map_err(|_| bad())?,
        b.trim().parse().map_err(|_| bad())?,
    );
    if a > b {
        return Err(format!("`{s}`: the range runs backwards; write `{b}-{a}`"));
    }
    Ok((a, b))
}

pub(super) fn run(command: EvalCommand) -> anyhow::Result<()> {
    match command {
        EvalCommand::Locomo(args) => {
            let conversations = eval::locomo::load(&args.data).with_context(|| {
                format!(
                    "reading the LoCoMo data {} (it is `locomo10.json` from shared/data/locomo/)",
                    args.data.display()
                )
            })?;
            evaluate("locomo", args, conversations, eval::locomo::LAYOUT)
        }
        EvalCommand::Beam(args) => {
            let conversations = eval::beam::load(&args.data).with_context(|| {
                format!(
                    "reading the BEAM data {} (the split's directory, e.g. shared/data/beam/100K)",
                    args.data.display()
                )
            })?;
            evaluate("beam", args, conversations, eval::beam::LAYOUT)
        }
    }
}

fn evaluate(
    name: &'static str,
    args: EvalArgs,
    mut conversations: Vec<Conversation>,
    layout: Layout,
) -> anyhow::Result<()> {
    let mut policies = Vec::new();
    for path in &args.policy {
        let policy =
            Policy::load(path).with_context(|| format!("loading the policy {}", path.display()))?;
        policies.push((
            path.file_stem().map(|s| s.to_string_lossy().into_owned()),
            policy,
        ));
    }
    if policies.is_empty() {
        policies.push((None, Policy::default_policy()));
    }
    // One ingest serves every policy only if they would have ingested alike.
    let beyond_scoring = |p: &Policy| {
        let mut v = p.to_json();
        if let serde_json::Value::Object(m) = &mut v {
            m.remove("scoring");
            m.remove("name");
        }
        v
    };
    if let Some((i, _)) = policies
        .iter()
        .enumerate()
        .skip(1)
        .find(|(_, (_, p))| beyond_scoring(p) != beyond_scoring(&policies[0].1))
    {
        anyhow::bail!(
            "{} differs from {} beyond [scoring], so one ingest cannot serve both; evaluate \
             them one at a time",
            args.policy[i].display(),
            args.policy[0].display()
        );
    }
    let mut opts = SubstrateOptions {
        policy: policies[0].1.clone(),
        ..SubstrateOptions::default()
    };
    let kind = match args.embedder {
        EmbedderArg::Auto => EmbedderKind::Auto,
        EmbedderArg::Hash => EmbedderKind::Hash,
        EmbedderArg::Local => EmbedderKind::Local,
    };
    let config = EmbedderConfig {
        kind,
        ..EmbedderConfig::default()
    };
    opts.embedder = build_embedder(&config.resolve(None)).context("setting up the embedder")?;
    let (first, last) = match (conversations.first(), conversations.last()) {
        (Some(f), Some(l)) => (f.index, l.index),
        _ => anyhow::bail!("{} holds no conversations", args.data.display()),
    };
    if let Some((from, to)) = args.conversations {
        conversations.retain(|c| (from..=to).contains(&c.index));
        if conversations.is_empty() {
            anyhow::bail!(
                "--conversations {from}-{to} selects nothing: the data has conversations \
                 numbered {first} to {last}"
            );
        }
    }
    let mut ks: Vec<usize> = args.k.iter().map(|&k| k as usize).collect();
    ks.sort_unstable();
    ks.dedup();
    let scratch = tempfile::Builder::new()
        .prefix("shadowbrain-eval-")
        .tempdir_in(scratch_root(args.scratch.as_deref()))
        .context("creating a scratch store (choose another place with --scratch)")?;
    let sub = Substrate::open(scratch.path(), opts).context("opening the scratch store")?;
    let embedder = sub.embedder().name().to_string();
    let tokio = tokio::runtime::Runtime::new()?;
    let turns: u64 = conversations.iter().map(|c| c.turns.len() as u64).sum();
    let progress = bar(Some(turns), name);
    let started = Instant::now();
    let ingested = tokio
        .block_on(eval::ingest(&sub, &conversations, |stage, done| {
            progress.set_message(format!(
                "{} {} conversations, {embedder}",
                stage.as_str(),
                conversations.len()
            ));
            progress.set_position(done)
        }))
        .with_context(|| format!("ingesting the {name} data"))?;
    progress.finish_and_clear();
    let ingest_seconds = started.elapsed().as_secs_f64();
    let ingest_cache = sub.embedder().cache_stats();
    let several = policies.len() > 1;
    for (stem, policy) in &policies {
        sub.set_policy(policy.clone());
        let policy = sub.policy();
        let questions: u64 = conversations.iter().map(|c| c.questions.len() as u64).sum();
        let progress = bar(Some(questions), name);
        let started = Instant::now();
        let report = tokio
            .block_on(eval::ask(
                &sub,
                &conversations,
                &ingested,
                &ks,
                layout.clone(),
                |done| progress.set_position(done),
            ))
            .with_context(|| format!("running the {name} evaluation"))?;
        let seconds = started.elapsed().as_secs_f64();
        progress.finish_and_clear();
        // The cache's answers while the questions were asked (the ingest's are before).
        let ask_cache = sub
            .embedder()
            .cache_stats()
            .zip(ingest_cache)
            .map(|(now, before)| CacheStats {
                hits: now.hits - before.hits,
                misses: now.misses - before.misses,
            });
        if several {
            eprintln!(
                "\npolicy {} ({}):",
                stem.as_deref().unwrap_or("?"),
                policy.hash
            );
        }
        eprint!("{}", report.table());
        eprintln!(
            "shadowbrain: {} questions of {} conversations (ingest {ingest_seconds:.1}s, \
             questions {seconds:.1}s), embedder {embedder}, policy {} ({})",
            report.answers.len(),
            conversations.len(),
            policy.name,
            policy.hash
        );
        if let (Some(ingest), Some(ask)) = (ingest_cache, ask_cache) {
            eprintln!(
                "shadowbrain: embedder cache hits {:.1}% of {} texts at ingest, {:.1}% of {} \
                 questions",
                100.0 * ingest.hit_rate(),
                ingest.hits + ingest.misses,
                100.0 * ask.hit_rate(),
                ask.hits + ask.misses
            );
        }
        if let Some(out) = &args.out {
            let out = match (several, stem) {
                (true, Some(stem)) => out.join(stem),
                _ => out.clone(),
            };
            write_report(
                &out,
                &report,
                &policy,
                &embedder,
                conversations.len(),
                seconds,
                ingest_cache.zip(ask_cache),
            )?;
        }
    }
    sub.close().context("closing the scratch store")?;
    Ok(())
}

/// `summary.json` and `ranked.jsonl` of one report, in `out` (created when missing).
fn write_report(
    out: &std::path::Path,
    report: &eval::Report,
    policy: &Policy,
    embedder: &str,
    conversations: usize,
    seconds: f64,
    cache: Option<(CacheStats, CacheStats)>,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(out)
        .with_context(|| format!("creating the output directory {}", out.display()))?;
    let mut summary = report.summary();
    if let serde_json::Value::Object(m) = &mut summary {
        m.insert(
            "policy".into(),
            serde_json::json!({ "name": policy.name, "hash": policy.hash }),
        );
        m.insert("embedder".into(), embedder.into());
        m.insert("conversations".into(), conversations.into());
        m.insert("seconds".into(), ((seconds * 10.0).round() / 10.0).into());
        if let Some((ingest, ask)) = cache {
            let part = |c: CacheStats| serde_json::json!({ "hits": c.hits, "misses": c.misses });
            m.insert(
                "embed_cache".into(),
                serde_json::json!({ "ingest": part(ingest), "questions": part(ask) }),
            );
        }
    }
    let path = out.join("summary.json");
    let mut text = serde_json::to_string_pretty(&summary)?;
    text.push('\n');
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    let ranked = out.join("ranked.jsonl");
    let file =
        std::fs::File::create(&ranked).with_context(|| format!("writing {}", ranked.display()))?;
    let mut w = std::io::BufWriter::new(file);
    let top = |ids: &[String]| ids[..ids.len().min(eval::RANKED_KEPT)].to_vec();
    for a in &report.answers {
        // LoCoMo's categories are numbers, BEAM's abilities names.
        let group = a
            .group
            .parse::<u64>()
            .map_or_else(|_| serde_json::Value::from(a.group.clone()), Into::into);
        let line = serde_json::json!({
            "sample_id": a.sample_id,
            "qa_index": a.qa_index,
            "category": group,
            "evidence": a.evidence,
            "ranked_dia_ids": top(&a.ranked),
            "bm25_dia_ids": top(&a.baseline),
            "bm25_whole_dia_ids": top(&a.whole),
        });
        writeln!(w, "{line}")?;
    }
    w.flush()
        .with_context(|| format!("writing {}", ranked.display()))?;
    eprintln!(
        "shadowbrain: wrote {} and {}",
        path.display(),
        ranked.display()
    );
    Ok(())
}
