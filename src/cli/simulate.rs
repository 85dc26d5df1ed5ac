//! `shadowbrain simulate`: the policy lab's command. It plans one workload from the seed,
//! runs every policy on it in a fresh store of its own (one after the other, in this
//! process, on the virtual clock), and writes `report.json`, `report.md` and SVG plots to
//! `--out`.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use shadowbrain::policy::Policy;
use shadowbrain::sim::report::{PolicyReport, Report, WorkloadSummary};
use shadowbrain::sim::run::{RunOptions, run};
use shadowbrain::sim::workload::{Workload, WorkloadSpec};

use super::transfer::bar;

/// Arguments of `simulate`.
#[derive(Debug, Args)]
pub(super) struct SimulateArgs {
    /// A policy file (TOML); give the flag once per policy to compare (at least one).
    #[arg(long = "policy", required = true)]
    policies: Vec<PathBuf>,
    /// Simulated agents.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    agents: u32,
    /// Sessions in all.
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    sessions: u32,
    /// Simulated days.
    #[arg(long, default_value_t = 90, value_parser = clap::value_parser!(u32).range(1..=3650))]
    days: u32,
    /// Events per session.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(2..=10_000))]
    events: u32,
    /// The seed: the same seed, the same workload.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Memories each probe looks at.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=shadowbrain::Limits::K_CEILING as i64))]
    k: u32,
    /// Where to write the reports (created; existing reports are replaced).
    #[arg(long)]
    out: PathBuf,
    /// Leave the measured figures (times, memory) out of the reports, so the same command
    /// gives byte-identical files.
    #[arg(long)]
    deterministic: bool,
    /// Where the runs' scratch stores go (removed after each run). Default: /dev/shm when
    /// there is one — the stores are throw-away, and on tmpfs a durable commit costs no
    /// disk flush — else the system's temporary directory.
    #[arg(long)]
    scratch: Option<PathBuf>,
}

pub(super) fn simulate(args: SimulateArgs) -> anyhow::Result<()> {
    let mut policies = Vec::with_capacity(args.policies.len());
    for path in &args.policies {
        policies.push(
            Policy::load(path).with_context(|| format!("loading the policy {}", path.display()))?,
        );
    }
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating the output directory {}", args.out.display()))?;
    let spec = WorkloadSpec {
        agents: args.agents as usize,
        sessions: args.sessions as usize,
        days: args.days,
        events_per_session: args.events as usize,
        seed: args.seed,
    };
    let workload = Workload::generate(spec);
    let options = RunOptions { k: args.k as usize };
    let steps = (spec.sessions * spec.events_per_session + workload.probes.len()) as u64;
    let tokio = tokio::runtime::Runtime::new()?;
    let mut reports = Vec::with_capacity(policies.len());
    for policy in policies {
        let scratch = tempfile::Builder::new()
            .prefix("shadowbrain-simulate-")
            .tempdir_in(scratch_root(args.scratch.as_deref()))
            .context(
                "creating a scratch store for the run (choose another place with --scratch)",
            )?;
        let name = policy.name.clone();
        let progress = bar(Some(steps), "simulate");
        progress.set_message(name.clone());
        reset_peak_rss();
        let outcome = tokio
            .block_on(run(&workload, policy, scratch.path(), options, |done| {
                progress.set_position(done)
            }))
            .with_context(|| format!("running the policy `{name}`"))?;
        progress.finish_and_clear();
        let report = PolicyReport::of(&workload, &outcome, peak_rss_mb());
        eprintln!(
            "shadowbrain: {name}: hit rate {} over {} probes, {} records ({} archived), {:.1}s",
            report
                .probe_hit_rate_at_k
                .overall
                .rate
                .map_or_else(|| "–".into(), |r| format!("{r:.3}")),
            report.probe_hit_rate_at_k.overall.probes,
            report.store_records_final,
            report.archived_final,
            outcome.wall_s
        );
        reports.push(if args.deterministic {
            report.without_measurements()
        } else {
            report
        });
    }
    let report = Report {
        workload: WorkloadSummary::of(&workload, options.k),
        policies: reports,
    };
    let json = args.out.join("report.json");
    let mut text = serde_json::to_string_pretty(&report)?;
    text.push('\n');
    std::fs::write(&json, text).with_context(|| format!("writing {}", json.display()))?;
    let md = args.out.join("report.md");
    std::fs::write(&md, report.markdown()).with_context(|| format!("writing {}", md.display()))?;
    let plots = shadowbrain::sim::plots::write_all(&report, &args.out)?;
    eprintln!(
        "shadowbrain: wrote {}, {} and {} plots ({})",
        json.display(),
        md.display(),
        plots.len(),
        plots
            .iter()
            .filter_map(|p| p.file_name().and_then(|n| n.to_str()))
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(())
}

/// The scratch directory's parent: as asked, else tmpfs, else the temporary directory.
pub(super) fn scratch_root(asked: Option<&std::path::Path>) -> PathBuf {
    if let Some(dir) = asked {
        return dir.to_path_buf();
    }
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

/// Resets the kernel's peak-RSS mark for this process (Linux: `clear_refs` 5), so each
/// policy's run reports its own peak. Elsewhere the peak is the process's.
fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// Peak resident memory since the last reset, in MB (Linux `VmHWM`).
fn peak_rss_mb() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some((kb / 1024.0 * 10.0).round() / 10.0)
}
