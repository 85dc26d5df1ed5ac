//! What `shadowbrain simulate` writes: `report.json` (every figure, per policy) and
//! `report.md` (the policies side by side in one table).
//!
//! Everything in a report follows from the workload and the policies, except the measured
//! times and memory (`wall_s`, `peak_rss_mb`, `recall_p50_ms`, `recall_p99_ms`); with
//! `deterministic` those are written as `null`, so the same command gives the same bytes.

use serde::Serialize;

use super::run::PolicyRun;
use super::workload::{PlantKind, Workload};

/// Probes are grouped by simulated week for the hit rate over time.
const BUCKET_DAYS: i64 = 7;

/// A hit rate and how many probes it is over.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Rate {
    /// Hits / probes (`null` when there were no probes).
    pub rate: Option<f64>,
    /// Probes counted.
    pub probes: usize,
}

impl Rate {
    fn of(hits: usize, probes: usize) -> Rate {
        Rate {
            rate: (probes > 0).then(|| round(hits as f64 / probes as f64)),
            probes,
        }
    }
}

/// The hit rate in one period of simulated time.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Period {
    /// First day of the period.
    pub from_day: i64,
    /// The rate in it.
    #[serde(flatten)]
    pub rate: Rate,
}

/// Hit rates of the probes that ask for something worth remembering (facts, and the newer
/// value of superseded facts).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct HitRates {
    /// Over every such probe.
    pub overall: Rate,
    /// Facts told once.
    pub facts: Rate,
    /// Superseded facts (hit: the newer value came back).
    pub superseded: Rate,
    /// Later probes of facts whose earlier probe found them (the recall reinforced them):
    /// what a forgetting curve should keep.
    pub reinforced: Rate,
    /// Per week of simulated time.
    pub over_time: Vec<Period>,
}

/// The store on one simulated day.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct StorePoint {
    /// Days since the start.
    pub day: u32,
    /// Records in the store.
    pub records: u64,
    /// Archived ones among them.
    pub archived: u64,
    /// Knowledge records.
    pub knowledge: u64,
}

/// One policy's figures.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PolicyReport {
    /// The policy's name.
    pub name: String,
    /// Its content hash.
    pub hash: String,
    /// Hit rates at `k`.
    pub probe_hit_rate_at_k: HitRates,
    /// Share of trivia probes whose trivia was still found a month later (a forgetting
    /// policy should keep this low).
    pub trivia_retained: Rate,
    /// Records in the store at the end.
    pub store_records_final: u64,
    /// Archived records at the end.
    pub archived_final: u64,
    /// Of the lessons in the knowledge pool, the share that are good ones (`null` when
    /// none was promoted).
    pub promotion_precision: Option<f64>,
    /// Of the good lessons, the share in the knowledge pool.
    pub promotion_recall: Option<f64>,
    /// Good and misleading lessons promoted, by name of their runbook code.
    pub promoted_good: Vec<String>,
    /// Misleading lessons promoted.
    pub promoted_bad: Vec<String>,
    /// Probes of superseded facts where the old value ranked above the newer one, or came
    /// back alone.
    pub superseded_errors: usize,
    /// Events written.
    pub events: u64,
    /// The store, day by day.
    pub store_over_time: Vec<StorePoint>,
    /// Median probe recall time, ms (measured).
    pub recall_p50_ms: Option<f64>,
    /// 99th percentile probe recall time, ms (measured).
    pub recall_p99_ms: Option<f64>,
    /// Probe recall times, ms, for the distribution plot (measured; not in the JSON).
    #[serde(skip)]
    pub recall_ms: Vec<f64>,
    /// Wall time of the run, s (measured).
    pub wall_s: Option<f64>,
    /// Peak resident memory during the run, MB (measured).
    pub peak_rss_mb: Option<f64>,
}

/// The workload a report is about.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct WorkloadSummary {
    /// Agents.
    pub agents: usize,
    /// Sessions.
    pub sessions: usize,
    /// Simulated days.
    pub days: u32,
    /// Events per session.
    pub events_per_session: usize,
    /// The seed.
    pub seed: u64,
    /// Memories each probe looks at.
    pub k: usize,
    /// Probes asked.
    pub probes: usize,
    /// Planted items by kind.
    pub planted: PlantCounts,
}

/// Planted items by kind.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq, Default)]
pub struct PlantCounts {
    /// Facts told once (not superseded).
    pub facts: usize,
    /// Facts replaced by a newer value later.
    pub superseded: usize,
    /// Recurring lessons that work.
    pub good_lessons: usize,
    /// Recurring lessons that fail.
    pub bad_lessons: usize,
    /// Trivia.
    pub trivia: usize,
}

/// The whole report.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Report {
    /// The workload.
    pub workload: WorkloadSummary,
    /// One entry per policy, in the order given.
    pub policies: Vec<PolicyReport>,
}

fn round(x: f64) -> f64 {
    (x * 1e4).round() / 1e4
}

/// The `p`-quantile of `sorted` (nearest rank).
fn quantile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    Some((sorted[i.min(sorted.len() - 1)] * 1e3).round() / 1e3)
}

impl PlantCounts {
    fn of(w: &Workload) -> PlantCounts {
        let mut c = PlantCounts::default();
        for p in &w.plants {
            match p.kind {
                PlantKind::Fact => c.facts += 1,
                PlantKind::Superseded { .. } => c.superseded += 1,
                PlantKind::GoodLesson => c.good_lessons += 1,
                PlantKind::BadLesson => c.bad_lessons += 1,
                PlantKind::Trivia => c.trivia += 1,
            }
        }
        // The newer values of superseded facts are planted as facts; count them there
        // only as the updates they are.
        c.facts -= c.superseded;
        c
    }
}

impl PolicyReport {
    /// The figures of one run; `peak_rss_mb` as measured by the caller.
    pub fn of(w: &Workload, run: &PolicyRun, peak_rss_mb: Option<f64>) -> PolicyReport {
        let start = super::workload::START;
        let day = |t: i64| (t - start).div_euclid(86_400_000);
        let (mut facts, mut superseded, mut trivia) = ((0, 0), (0, 0), (0, 0));
        let mut errors = 0;
        let mut reinforced = (0, 0);
        let mut found_before: std::collections::HashSet<usize> = Default::default();
        let mut buckets: std::collections::BTreeMap<i64, (usize, usize)> = Default::default();
        for p in &run.probes {
            let tally = match w.plants[p.plant].kind {
                PlantKind::Fact => &mut facts,
                PlantKind::Superseded { .. } => {
                    errors += usize::from(p.stale);
                    &mut superseded
                }
                PlantKind::Trivia => &mut trivia,
                _ => continue,
            };
            tally.0 += usize::from(p.hit);
            tally.1 += 1;
            if w.plants[p.plant].kind == PlantKind::Fact {
                if found_before.contains(&p.plant) {
                    reinforced.0 += usize::from(p.hit);
                    reinforced.1 += 1;
                }
                if p.hit {
                    found_before.insert(p.plant);
                }
            }
            if !matches!(w.plants[p.plant].kind, PlantKind::Trivia) {
                let b = buckets
                    .entry(day(p.at) / BUCKET_DAYS * BUCKET_DAYS)
                    .or_default();
                b.0 += usize::from(p.hit);
                b.1 += 1;
            }
        }
        let good: Vec<usize> = (0..w.plants.len())
            .filter(|&i| w.plants[i].kind == PlantKind::GoodLesson)
            .collect();
        let promoted_good: Vec<usize> = run
            .promoted
            .iter()
            .copied()
            .filter(|&i| w.plants[i].kind == PlantKind::GoodLesson)
            .collect();
        let promoted_bad: Vec<usize> = run
            .promoted
            .iter()
            .copied()
            .filter(|&i| w.plants[i].kind == PlantKind::BadLesson)
            .collect();
        let promoted = promoted_good.len() + promoted_bad.len();
        let mut recall_ms = run.recall_ms.clone();
        recall_ms.sort_by(f64::total_cmp);
        let last = run.days.last().copied().unwrap_or(super::run::DaySample {
            day: 0,
            records: 0,
            archived: 0,
            knowledge: 0,
        });
        let code = |i: &usize| w.plants[*i].code.clone();
        PolicyReport {
            name: run.name.clone(),
            hash: run.hash.clone(),
            probe_hit_rate_at_k: HitRates {
                overall: Rate::of(facts.0 + superseded.0, facts.1 + superseded.1),
                facts: Rate::of(facts.0, facts.1),
                superseded: Rate::of(superseded.0, superseded.1),
                reinforced: Rate::of(reinforced.0, reinforced.1),
                over_time: buckets
                    .into_iter()
                    .map(|(from_day, (hits, n))| Period {
                        from_day,
                        rate: Rate::of(hits, n),
                    })
                    .collect(),
            },
            trivia_retained: Rate::of(trivia.0, trivia.1),
            store_records_final: last.records,
            archived_final: last.archived,
            promotion_precision: (promoted > 0)
                .then(|| round(promoted_good.len() as f64 / promoted as f64)),
            promotion_recall: (!good.is_empty())
                .then(|| round(promoted_good.len() as f64 / good.len() as f64)),
            promoted_good: promoted_good.iter().map(code).collect(),
            promoted_bad: promoted_bad.iter().map(code).collect(),
            superseded_errors: errors,
            events: run.events,
            store_over_time: run
                .days
                .iter()
                .map(|d| StorePoint {
                    day: d.day,
                    records: d.records,
                    archived: d.archived,
                    knowledge: d.knowledge,
                })
                .collect(),
            recall_p50_ms: quantile(&recall_ms, 0.5),
            recall_p99_ms: quantile(&recall_ms, 0.99),
            recall_ms,
            wall_s: Some((run.wall_s * 1e3).round() / 1e3),
            peak_rss_mb,
        }
    }

    /// Drops the measured figures, so the report depends on its inputs alone.
    pub fn without_measurements(mut self) -> PolicyReport {
        self.recall_p50_ms = None;
        self.recall_p99_ms = None;
        self.wall_s = None;
        self.peak_rss_mb = None;
        self.recall_ms.clear();
        self
    }
}

impl WorkloadSummary {
    /// The summary of `w`, probed at `k`.
    pub fn of(w: &Workload, k: usize) -> WorkloadSummary {
        WorkloadSummary {
            agents: w.spec.agents,
            sessions: w.spec.sessions,
            days: w.spec.days,
            events_per_session: w.spec.events_per_session,
            seed: w.spec.seed,
            k,
            probes: w.probes.len(),
            planted: PlantCounts::of(w),
        }
    }
}

/// One cell of the Markdown table, from a policy's report.
type Cell = Box<dyn Fn(&PolicyReport) -> String>;

fn show(x: Option<f64>, digits: usize) -> String {
    x.map_or_else(|| "–".to_string(), |v| format!("{v:.digits$}"))
}

impl Report {
    /// `report.md`: the workload, then one table with a column per policy.
    pub fn markdown(&self) -> String {
        let w = &self.workload;
        let mut md = format!(
            "# Policy lab report\n\n{} agents, {} sessions × {} events over {} simulated days, \
             seed {}; {} probes at k = {}. Planted: {} facts, {} superseded facts, {} good and \
             {} misleading recurring lessons, {} trivia.\n\n",
            w.agents,
            w.sessions,
            w.events_per_session,
            w.days,
            w.seed,
            w.probes,
            w.k,
            w.planted.facts,
            w.planted.superseded,
            w.planted.good_lessons,
            w.planted.bad_lessons,
            w.planted.trivia
        );
        md.push_str("| | ");
        md.push_str(
            &self
                .policies
                .iter()
                .map(|p| format!("{} (`{}`)", p.name, p.hash))
                .collect::<Vec<_>>()
                .join(" | "),
        );
        md.push_str(" |\n|---|");
        md.push_str(&"---|".repeat(self.policies.len()));
        md.push('\n');
        let rows: Vec<(&str, Cell)> = vec![
            (
                "probe hit rate @k (facts + newer values)",
                Box::new(|p| show(p.probe_hit_rate_at_k.overall.rate, 3)),
            ),
            (
                "– facts",
                Box::new(|p| show(p.probe_hit_rate_at_k.facts.rate, 3)),
            ),
            (
                "– superseded facts (newer value found)",
                Box::new(|p| show(p.probe_hit_rate_at_k.superseded.rate, 3)),
            ),
            (
                "– facts found again after a recall",
                Box::new(|p| show(p.probe_hit_rate_at_k.reinforced.rate, 3)),
            ),
            (
                "superseded-fact errors",
                Box::new(|p| p.superseded_errors.to_string()),
            ),
            (
                "trivia still found after 30 days",
                Box::new(|p| show(p.trivia_retained.rate, 3)),
            ),
            (
                "records at the end",
                Box::new(|p| p.store_records_final.to_string()),
            ),
            (
                "archived at the end",
                Box::new(|p| p.archived_final.to_string()),
            ),
            (
                "promotion precision",
                Box::new(|p| show(p.promotion_precision, 3)),
            ),
            (
                "promotion recall",
                Box::new(|p| show(p.promotion_recall, 3)),
            ),
            (
                "recall p50 / p99 (ms)",
                Box::new(|p| {
                    format!(
                        "{} / {}",
                        show(p.recall_p50_ms, 2),
                        show(p.recall_p99_ms, 2)
                    )
                }),
            ),
            ("wall time (s)", Box::new(|p| show(p.wall_s, 1))),
            ("peak RSS (MB)", Box::new(|p| show(p.peak_rss_mb, 0))),
        ];
        for (label, cell) in rows {
            md.push_str(&format!("| {label} | "));
            md.push_str(
                &self
                    .policies
                    .iter()
                    .map(cell.as_ref())
                    .collect::<Vec<_>>()
                    .join(" | "),
            );
            md.push_str(" |\n");
        }
        md
    }
}
