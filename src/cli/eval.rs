//! `shadowbrain eval`: retrieval benchmarks through the real recall path. `eval locomo`
//! ingests each LoCoMo conversation into a scratch store of its own, asks every question,
//! prints recall@k per category and writes `summary.json` and `ranked.jsonl` to `--out`,
//! so a failure can be studied question by question and the figures re-checked by anyone.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use clap::{Args, Subcommand};
use shadowbrain::eval::locomo;
use shadowbrain::policy::Policy;
use shadowbrain::{Substrate, SubstrateOptions};

use super::simulate::scratch_root;
use super::transfer::bar;

/// The benchmarks `eval` runs.
#[derive(Debug, Subcommand)]
pub(super) enum EvalCommand {
    /// LoCoMo evidence recall: R@k and hit@k per question category, no LLM.
    Locomo(LocomoArgs),
}

/// Arguments of `eval locomo`.
#[derive(Debug, Args)]
pub(super) struct LocomoArgs {
    /// `locomo10.json` (in this repository's sibling `shared/data/locomo/`; not shipped
    /// with shadowbrain, its licence is non-commercial).
    #[arg(long)]
    data: PathBuf,
    /// A policy file (TOML); the built-in default policy without one.
    #[arg(long)]
    policy: Option<PathBuf>,
    /// The k values to report, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "5,10,20",
          value_parser = clap::value_parser!(u32).range(1..=shadowbrain::Limits::K_CEILING as i64))]
    k: Vec<u32>,
    /// Only these conversations, by position in the file: `3`, `0-4`.
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
        EvalCommand::Locomo(args) => locomo_eval(args),
    }
}

fn locomo_eval(args: LocomoArgs) -> anyhow::Result<()> {
    let mut opts = SubstrateOptions::default();
    if let Some(path) = &args.policy {
        opts.policy =
            Policy::load(path).with_context(|| format!("loading the policy {}", path.display()))?;
    }
    let mut conversations = locomo::load(&args.data).with_context(|| {
        format!(
            "reading the LoCoMo data {} (it is `locomo10.json` from shared/data/locomo/)",
            args.data.display()
        )
    })?;
    let available = conversations.len();
    if let Some((from, to)) = args.conversations {
        conversations.retain(|c| (from..=to).contains(&c.index));
        if conversations.is_empty() {
            anyhow::bail!(
                "--conversations {from}-{to} selects nothing: the file has {available} \
                 conversations, numbered 0 to {}",
                available.saturating_sub(1)
            );
        }
    }
    let mut ks: Vec<usize> = args.k.iter().map(|&k| k as usize).collect();
    ks.sort_unstable();
    ks.dedup();
    if let Some(out) = &args.out {
        std::fs::create_dir_all(out)
            .with_context(|| format!("creating the output directory {}", out.display()))?;
    }
    let scratch = tempfile::Builder::new()
        .prefix("shadowbrain-eval-")
        .tempdir_in(scratch_root(args.scratch.as_deref()))
        .context("creating a scratch store (choose another place with --scratch)")?;
    let sub = Substrate::open(scratch.path(), opts).context("opening the scratch store")?;
    let policy = sub.policy();
    let progress = bar(Some(locomo::steps(&conversations)), "locomo");
    progress.set_message(format!("{} conversations", conversations.len()));
    let started = Instant::now();
    let report = tokio::runtime::Runtime::new()?
        .block_on(locomo::run(&sub, &conversations, &ks, |done| {
            progress.set_position(done)
        }))
        .context("running the LoCoMo evaluation")?;
    let seconds = started.elapsed().as_secs_f64();
    progress.finish_and_clear();
    sub.close().context("closing the scratch store")?;
    eprint!("{}", report.table());
    eprintln!(
        "shadowbrain: {} questions of {} conversations in {seconds:.1}s, policy {} ({})",
        report.answers.len(),
        conversations.len(),
        policy.name,
        policy.hash
    );
    if let Some(out) = &args.out {
        let mut summary = report.summary();
        if let serde_json::Value::Object(m) = &mut summary {
            m.insert(
                "policy".into(),
                serde_json::json!({ "name": policy.name, "hash": policy.hash }),
            );
            m.insert("conversations".into(), conversations.len().into());
            m.insert("seconds".into(), ((seconds * 10.0).round() / 10.0).into());
        }
        let path = out.join("summary.json");
        let mut text = serde_json::to_string_pretty(&summary)?;
        text.push('\n');
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        let ranked = out.join("ranked.jsonl");
        let file = std::fs::File::create(&ranked)
            .with_context(|| format!("writing {}", ranked.display()))?;
        let mut w = std::io::BufWriter::new(file);
        for a in &report.answers {
            let line = serde_json::json!({
                "sample_id": a.sample_id,
                "qa_index": a.qa_index,
                "category": a.category,
                "evidence": a.evidence,
                "ranked_dia_ids": &a.ranked_dia_ids[..a.ranked_dia_ids.len().min(locomo::RANKED_KEPT)],
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
    }
    Ok(())
}
