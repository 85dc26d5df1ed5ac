//! The second stage of a policy: [`Policy::compile`] turns a [`RawPolicy`] into the typed,
//! validated sections ([`Scoring`], [`Evaluation`], …) with the defaults of
//! docs/policy.md filled in.
//!
//! Owns every rule about what a valid policy is (ranges, durations, enum values, regexes,
//! kind names) and reports **every** violation at once with its dotted key. It must never
//! read files or the environment (that is [`super::raw`]) and never makes decisions about
//! records (that is [`super::decide`]).
//!
//! Accepted ranges, so a policy author can look them up in one place:
//!
//! | key | range |
//! | --- | --- |
//! | `scoring.relevance / recency / importance / utility / strength` | finite, `0..=10`, not all 0 |
//! | `scoring.mmr_lambda`, `scoring.reinforce_on_recall`, `scoring.vector_weight`, `scoring.context_weight` | `0..=1` |
//! | `scoring.context_window` | `0..=8` |
//! | `scoring.speaker_boost`, `scoring.time_boost` | `0..=10` |
//! | `evaluation.default_importance`, `evaluation.rules[i].importance` | `0..=10` |
//! | `condensation.every_events` | `1..=100000` |
//! | `condensation.min_events` | `1..=every_events` |
//! | `forgetting.archive_below` | `0 <= x < 1` (0 never archives) |
//! | `forgetting.stability_growth` | `0..=100` |
//! | `promotion.min_importance` | `0..=10` |
//! | `promotion.min_utility`, `promotion.merge_similarity` | `0..=1` |
//! | `promotion.min_successes` | `0..=1000000` |
//! | `updates.candidates` | `1..=50` |
//! | `updates.max_chars` | `20..=1048576` |
//! | `updates.min_similarity`, `updates.duplicate_similarity`, `updates.sentence_overlap`, `updates.superseded_weight` | `0..=1` |
//! | `evaluation.prompt`, `condensation.prompt` | not blank, at most 8 KiB |
//! | durations | `"90s"`, `"1h"`, `"3d"`, `"1h 30m"` … up to 1000 years; `"never"` where noted |

use std::time::Duration;

use regex::Regex;

use super::Policy;
use super::raw::RawPolicy;
use crate::error::{PolicyErrors, PolicyIssue};
use crate::model::Kind;

/// How recall fuses the vector and keyword candidate lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fusion {
    /// Reciprocal rank fusion: robust to incomparable score scales.
    Rrf,
    /// Weighted sum of the normalised scores.
    Weighted,
    /// Weighted sum of the scores, each min-max scaled per query first.
    Calibrated,
}

/// What "age" means for the recency component.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecencyBasis {
    /// Age since the event happened (the default).
    Event,
    /// Age since the record was last reinforced (`strength_at`), as in Generative Agents.
    LastAccess,
}

/// Who scores importance at write time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvaluationMode {
    /// The policy's rules only (in-process, default).
    Rules,
    /// An LLM judge, falling back to rules when the provider fails.
    Llm,
    /// Rules first; the LLM judge for records no rule matched.
    Hybrid,
}

/// How a window of records is condensed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CondensationMode {
    /// Pick representative sentences, no LLM (default).
    Extractive,
    /// An LLM writes the condensed record.
    Llm,
}

/// The shape of strength decay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Curve {
    /// `s(t) = s0 * 2^(-t / half_life)` (the default curve).
    HalfLife,
    /// `s(t) = s0 * e^(-t / S)` with `S = stability * (1 + stability_growth * reinforcements)`:
    /// every recall makes the memory fade more slowly (MemoryBank).
    Ebbinghaus,
}

/// `[scoring]`, compiled: how recall ranks candidates.
#[derive(Debug, Clone)]
pub struct Scoring {
    /// Weight of query similarity.
    pub relevance: f32,
    /// Weight of `2^(-age / recency_half_life)`.
    pub recency: f32,
    /// Weight of `importance / 10`.
    pub importance: f32,
    /// Weight of utility (Beta mean).
    pub utility: f32,
    /// Weight of current strength (extension; 0 by default).
    pub strength: f32,
    /// Recency halves over this; `None` ("never") keeps recency at 1.
    pub recency_half_life: Option<Duration>,
    /// Which age recency is computed from.
    pub recency_basis: RecencyBasis,
    /// How vector and keyword candidates are fused.
    pub fusion: Fusion,
    /// Whether the policy file set `fusion`; when it did not, the default follows the
    /// embedder in force ([`crate::Policy::for_embedder`]).
    pub fusion_set: bool,
    /// Share of the vector path in fused relevance; the keyword path gets `1 - vector_weight`.
    pub vector_weight: f32,
    /// Whether the policy file set `vector_weight`; when it did not, the default follows
    /// the embedder in force ([`crate::Policy::for_embedder`]).
    pub vector_weight_set: bool,
    /// MMR trade-off between relevance (1.0) and diversity (0.0).
    pub mmr_lambda: f32,
    /// Strength added to each record a recall returns.
    pub reinforce_on_recall: f32,
    /// Neighbouring records of the same session, on each side, whose words count toward a
    /// record's keyword match (0 = the record's own words only).
    pub context_window: u32,
    /// How much a neighbour's word counts, against 1 for the record's own.
    pub context_weight: f32,
    /// Relevance × `1 + speaker_boost` for records whose speaker (`Name: …`) the query
    /// names, when it names one.
    pub speaker_boost: f32,
    /// Relevance × `1 + time_boost` for records from a time the query names ("on October
    /// 13, 2023", "in July"), when it names one.
    pub time_boost: f32,
}

/// One importance rule: applies when the kind is listed (or no kinds are given) and the
/// regex matches the text (or no regex is given).
#[derive(Debug, Clone)]
pub struct Rule {
    /// Kinds the rule applies to; empty means every kind.
    pub kinds: Vec<String>,
    /// Regex the text must match.
    pub matches: Option<Regex>,
    /// Importance given, 0..=10.
    pub importance: f32,
}

/// `[evaluation]`, compiled: importance at write time.
#[derive(Debug, Clone)]
pub struct Evaluation {
    /// Who scores importance.
    pub mode: EvaluationMode,
    /// Importance when no rule matches, 0..=10.
    pub default_importance: f32,
    /// Rules in file order; the first match wins.
    pub rules: Vec<Rule>,
    /// The LLM judge's rating guidance; `None` = the built-in one.
    pub prompt: Option<String>,
}

/// `[condensation]`, compiled.
#[derive(Debug, Clone)]
pub struct Condensation {
    /// How records are condensed.
    pub mode: CondensationMode,
    /// Condense when this many uncondensed events accumulate.
    pub every_events: u32,
    /// ...or when the oldest uncondensed event is this old; `None` = no age trigger.
    pub max_age: Option<Duration>,
    /// Never condense fewer events than this.
    pub min_events: u32,
    /// The LLM condenser's writing guidance; `None` = the built-in one.
    pub prompt: Option<String>,
}

/// `[forgetting]`, compiled.
#[derive(Debug, Clone)]
pub struct Forgetting {
    /// The decay curve.
    pub curve: Curve,
    /// Half-life of strength (half-life curve); `None` = no decay.
    pub half_life: Option<Duration>,
    /// Initial stability S (Ebbinghaus curve).
    pub stability: Duration,
    /// Initial stabilities added to S by each reinforcement (Ebbinghaus curve).
    pub stability_growth: f32,
    /// Active records whose strength falls below this are archived; 0 never archives.
    pub archive_below: f32,
    /// Archived records are purged this long after archiving; `None` = never.
    pub purge_archived_after: Option<Duration>,
    /// Kinds that never decay.
    pub protect_kinds: Vec<String>,
    /// Decay sweep period on the runtime clock; `None` = no sweeps.
    pub interval: Option<Duration>,
}

/// `[promotion]`, compiled: which condensed records enter the knowledge pool.
#[derive(Debug, Clone)]
pub struct Promotion {
    /// Minimum importance, 0..=10.
    pub min_importance: f32,
    /// Minimum utility (Beta mean), 0..=1.
    pub min_utility: f32,
    /// Minimum successful recalls.
    pub min_successes: u32,
    /// Cosine similarity at or above which a promotion merges into an existing node.
    pub merge_similarity: f32,
}

/// Who decides whether a newer record updates an older one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpdatesMode {
    /// Nobody: records are never compared (default).
    Off,
    /// The in-process rules of [`crate::updates`].
    Rules,
    /// The LLM judge decides every pair the rules would look at (the rules when it is
    /// missing, fails or is over budget, with the reason audited).
    Llm,
    /// The rules first; the pairs they find nothing in go to the LLM judge.
    Hybrid,
}

impl UpdatesMode {
    /// The name used in policy files and audit entries.
    pub fn as_str(self) -> &'static str {
        match self {
            UpdatesMode::Off => "off",
            UpdatesMode::Rules => "rules",
            UpdatesMode::Llm => "llm",
            UpdatesMode::Hybrid => "hybrid",
        }
    }

    /// Whether an LLM judge is asked about some pairs.
    pub fn asks_llm(self) -> bool {
        matches!(self, UpdatesMode::Llm | UpdatesMode::Hybrid)
    }
}

/// Where a new record's older neighbours are looked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpdatesScope {
    /// Anywhere in its namespace (default): a fact stated in one session and changed in
    /// another is still one fact.
    Namespace,
    /// Only in its own session.
    Session,
    /// Only among the records of its own agent (`agent_id`), in any session: agents of
    /// one namespace may each hold their own value of the same thing. A record without
    /// an agent is compared within its session.
    Agent,
}

/// `[updates]`, compiled: detecting facts that change.
#[derive(Debug, Clone)]
pub struct Updates {
    /// Off, or who decides.
    pub mode: UpdatesMode,
    /// Where older records are looked for.
    pub scope: UpdatesScope,
    /// How many nearest older records each new one is compared with.
    pub candidates: u32,
    /// Records longer than this (bytes of text) are neither compared nor compared with.
    pub max_chars: u32,
    /// Neighbours less similar than this are not compared.
    pub min_similarity: f32,
    /// The decision's thresholds.
    pub thresholds: crate::updates::Thresholds,
    /// What a superseded record's recall score is multiplied by (besides ranking below
    /// the record that superseded it, when both are candidates).
    pub superseded_weight: f32,
}

impl Updates {
    /// Whether new records are compared at all.
    pub fn on(&self) -> bool {
        self.mode != UpdatesMode::Off
    }
}

/// The defaults (docs/policy.md): what an empty file means.
pub(crate) mod defaults {
    pub const NAME: &str = "default";
    pub const RELEVANCE: f64 = 1.0;
    pub const RECENCY: f64 = 0.5;
    pub const IMPORTANCE: f64 = 0.5;
    pub const UTILITY: f64 = 0.5;
    pub const STRENGTH: f64 = 0.0;
    pub const RECENCY_HALF_LIFE: &str = "3d";
    pub const MMR_LAMBDA: f64 = 1.0;
    /// The default embedder (`hash`) is lexical, like BM25, and noisier: once the keyword
    /// path reads context it only adds noise (on LoCoMo conversations 0–4, R@10 falls as
    /// its weight grows; 0.1 keeps the multi-hop questions' small gain from it). A semantic
    /// embedder gets [`VECTOR_WEIGHT_SEMANTIC`].
    pub const VECTOR_WEIGHT: f64 = 0.1;
    /// The default with a semantic embedder (`local`, `openai`), with calibrated fusion.
    /// Chosen on LoCoMo conversations 0–4 with all-MiniLM-L6-v2 (R@10, every conversation
    /// ingested before the first question): calibrated fusion at 0.3 ranks above every
    /// weighted setting and every other calibrated weight.
    pub const VECTOR_WEIGHT_SEMANTIC: f64 = 0.3;
    pub const REINFORCE_ON_RECALL: f64 = 0.05;
    /// A turn's answer often sits next to the words that ask for it (on LoCoMo
    /// conversations 0–4, R@10 rises with ±1 and again with ±2 at weight 0.4; ±3 adds
    /// nothing).
    pub const CONTEXT_WINDOW: u32 = 2;
    pub const CONTEXT_WEIGHT: f64 = 0.4;
    pub const SPEAKER_BOOST: f64 = 1.0;
    pub const TIME_BOOST: f64 = 2.0;
    pub const DEFAULT_IMPORTANCE: f64 = 3.0;
    pub const EVERY_EVENTS: u32 = 50;
    pub const MAX_AGE: &str = "1h";
    pub const MIN_EVENTS: u32 = 5;
    pub const HALF_LIFE: &str = "30d";
    pub const STABILITY: &str = "1d";
    pub const STABILITY_GROWTH: f64 = 1.0;
    pub const ARCHIVE_BELOW: f64 = 0.05;
    pub const PURGE_ARCHIVED_AFTER: &str = "180d";
    pub const PROTECT_KINDS: [&str; 1] = ["goal"];
    pub const INTERVAL: &str = "1h";
    pub const MIN_IMPORTANCE: f64 = 6.0;
    pub const MIN_UTILITY: f64 = 0.6;
    pub const MIN_SUCCESSES: u32 = 1;
    pub const MERGE_SIMILARITY: f64 = 0.9;
    /// A few neighbours find the record a fact was last stated in without comparing with
    /// the whole topic.
    pub const UPDATES_CANDIDATES: u32 = 5;
    /// Below this, MiniLM pairs in the labelled set are on different subjects.
    pub const UPDATES_MIN_SIMILARITY: f64 = 0.5;
    /// A stated fact is a sentence or two; a long answer holds many claims whose values and
    /// negations the rules would set against each other (on BEAM, long assistant answers
    /// without the bound gave 3,670 supersessions, mostly spurious; its probed update
    /// messages are 220 bytes at the median).
    pub const UPDATES_MAX_CHARS: u32 = 600;
    pub const DUPLICATE_SIMILARITY: f64 = 0.85;
    pub const SENTENCE_OVERLAP: f64 = 0.5;
    /// No demotion beyond ranking below its successor: on BEAM (hash embedder) halving the
    /// score of every superseded record cost 0.015 of R@10 through false supersessions
    /// whose newer record the question did not match.
    pub const SUPERSEDED_WEIGHT: f64 = 1.0;

    /// The two default rules: goals matter most, failed observations next.
    pub fn rules() -> Vec<crate::policy::raw::RawRule> {
        use crate::policy::raw::RawRule;
        vec![
            RawRule {
                kinds: Some(vec!["goal".into()]),
                matches: None,
                importance: Some(9.0),
            },
            RawRule {
                kinds: Some(vec!["observation".into()]),
                matches: Some("(?i)error|failed|exception".into()),
                importance: Some(7.0),
            },
        ]
    }
}

/// Durations longer than this are typos (or overflow later arithmetic in ms).
const MAX_DURATION: Duration = Duration::from_secs(1000 * 365 * 86_400);
const DURATION_FORMS: &str =
    "write a number with a unit, e.g. \"90s\", \"1h\", \"3d\" or \"1h 30m\", or \"never\"";

/// Longest prompt override: it rides on every LLM request, so a runaway one costs tokens.
const MAX_PROMPT_BYTES: usize = 8 * 1024;

/// Collects issues while the sections are compiled, so one pass reports them all.
struct Ctx<'a> {
    file: &'a str,
    issues: Vec<PolicyIssue>,
}

impl Ctx<'_> {
    fn issue(&mut self, key: &str, reason: impl Into<String>) {
        self.issues.push(PolicyIssue {
            file: self.file.to_string(),
            key: key.to_string(),
            reason: reason.into(),
        });
    }

    /// A number in `lo..=hi`; on error the default stands in so compilation can go on.
    fn ranged(&mut self, key: &str, v: Option<f64>, default: f64, lo: f64, hi: f64) -> f32 {
        let Some(x) = v else { return default as f32 };
        if !x.is_finite() || x < lo || x > hi {
            self.issue(
                key,
                format!("{x} is out of range; use a number from {lo} to {hi}"),
            );
            return default as f32;
        }
        x as f32
    }

    fn count(&mut self, key: &str, v: Option<u32>, default: u32, lo: u32, hi: u32) -> u32 {
        let x = v.unwrap_or(default);
        if x < lo || x > hi {
            self.issue(
                key,
                format!("{x} is out of range; use a whole number from {lo} to {hi}"),
            );
            return default;
        }
        x
    }

    /// An LLM prompt override: absent is the built-in one; blank or huge is a mistake.
    fn prompt(&mut self, key: &str, v: Option<&str>) -> Option<String> {
        let text = v?;
        if text.trim().is_empty() {
            self.issue(
                key,
                "is blank; write the guidance for the model, or remove the key to use the \
                 built-in prompt",
            );
            return None;
        }
        if text.len() > MAX_PROMPT_BYTES {
            self.issue(
                key,
                format!(
                    "is {} bytes; keep it under {MAX_PROMPT_BYTES} (it is sent with every \
                     request and paid for in tokens)",
                    text.len()
                ),
            );
            return None;
        }
        Some(text.trim().to_string())
    }

    /// A duration string; `never_ok` says whether `"never"` (`None`) is allowed.
    fn duration(
        &mut self,
        key: &str,
        v: Option<&str>,
        default: &str,
        never_ok: bool,
        zero_ok: bool,
    ) -> Option<Duration> {
        let s = v.unwrap_or(default).trim();
        let fallback = || parse_duration(default).ok().flatten();
        match parse_duration(s) {
            Ok(None) if never_ok => None,
            Ok(None) => {
                self.issue(
                    key,
                    format!(
                        "cannot be \"never\"; {}",
                        DURATION_FORMS.trim_end_matches(", or \"never\"")
                    ),
                );
                fallback()
            }
            Ok(Some(d)) if d.is_zero() && !zero_ok => {
                self.issue(
                    key,
                    format!("`{s}` is zero, which would divide by zero; use a positive duration such as \"1h\"{}",
                        if never_ok { ", or \"never\"" } else { "" }),
                );
                fallback()
            }
            Ok(Some(d)) if d > MAX_DURATION => {
                self.issue(
                    key,
                    format!("`{s}` is longer than 1000 years; use a shorter duration or \"never\""),
                );
                fallback()
            }
            Ok(Some(d)) => Some(d),
            Err(e) => {
                self.issue(key, e);
                fallback()
            }
        }
    }

    /// One of a fixed set of names.
    fn choice<T: Copy>(
        &mut self,
        key: &str,
        v: Option<&str>,
        default: T,
        options: &[(&str, T)],
    ) -> T {
        let Some(s) = v else { return default };
        match options.iter().find(|(name, _)| *name == s.trim()) {
            Some((_, t)) => *t,
            None => {
                let names: Vec<String> = options.iter().map(|(n, _)| format!("\"{n}\"")).collect();
                self.issue(
                    key,
                    format!("`{s}` is not one of its values; use {}", names.join(" or ")),
                );
                default
            }
        }
    }

    fn kinds(&mut self, key: &str, kinds: &[String]) -> Vec<String> {
        let mut out = Vec::with_capacity(kinds.len());
        for (i, k) in kinds.iter().enumerate() {
            match Kind::new(k.as_str()) {
                Ok(kind) => out.push(kind.as_str().to_string()),
                Err(e) => {
                    let reason = match e {
                        crate::Error::Invalid { reason, .. } => reason,
                        other => other.to_string(),
                    };
                    self.issue(&format!("{key}[{i}]"), reason);
                }
            }
        }
        out
    }
}

/// Parses a human duration or `"never"` (`Ok(None)`).
pub fn parse_duration(s: &str) -> Result<Option<Duration>, String> {
    let t = s.trim();
    if t == "never" {
        return Ok(None);
    }
    humantime::parse_duration(t)
        .map(Some)
        .map_err(|e| format!("`{s}` is not a duration ({e}); {DURATION_FORMS}"))
}

/// Formats a duration the way [`parse_duration`] reads it back (`None` is `"never"`).
pub fn format_duration(d: Option<Duration>) -> String {
    match d {
        Some(d) => humantime::format_duration(d).to_string(),
        None => "never".to_string(),
    }
}

const WEIGHT_MAX: f64 = 10.0;
/// More neighbours than this is no longer a record's context but its session.
const MAX_CONTEXT_WINDOW: u32 = 8;

impl Policy {
    /// Validates a raw policy and fills in the defaults. Every problem is reported,
    /// each with `file` and its dotted key; nothing is returned half-valid.
    pub fn compile(raw: RawPolicy, file: &str) -> Result<Policy, PolicyErrors> {
        let mut c = Ctx {
            file,
            issues: Vec::new(),
        };

        let name = raw.name.unwrap_or_else(|| defaults::NAME.to_string());
        if name.trim().is_empty() || name.len() > 128 || name.chars().any(char::is_control) {
            c.issue(
                "name",
                "must be 1 to 128 printable characters; it is recorded with every decision",
            );
        }

        let s = &raw.scoring;
        let scoring = Scoring {
            relevance: c.ranged(
                "scoring.relevance",
                s.relevance,
                defaults::RELEVANCE,
                0.0,
                WEIGHT_MAX,
            ),
            recency: c.ranged(
                "scoring.recency",
                s.recency,
                defaults::RECENCY,
                0.0,
                WEIGHT_MAX,
            ),
            importance: c.ranged(
                "scoring.importance",
                s.importance,
                defaults::IMPORTANCE,
                0.0,
                WEIGHT_MAX,
            ),
            utility: c.ranged(
                "scoring.utility",
                s.utility,
                defaults::UTILITY,
                0.0,
                WEIGHT_MAX,
            ),
            strength: c.ranged(
                "scoring.strength",
                s.strength,
                defaults::STRENGTH,
                0.0,
                WEIGHT_MAX,
            ),
            recency_half_life: c.duration(
                "scoring.recency_half_life",
                s.recency_half_life.as_deref(),
                defaults::RECENCY_HALF_LIFE,
                true,
                false,
            ),
            recency_basis: c.choice(
                "scoring.recency_basis",
                s.recency_basis.as_deref(),
                RecencyBasis::Event,
                &[
                    ("event", RecencyBasis::Event),
                    ("last_access", RecencyBasis::LastAccess),
                ],
            ),
            fusion_set: s.fusion.is_some(),
            fusion: c.choice(
                "scoring.fusion",
                s.fusion.as_deref(),
                // Scores, not ranks: RRF gives the tenth keyword hit as much as the tenth
                // vector hit however far apart their scores are (on LoCoMo 0–4, RRF
                // ranks below weighted fusion, and further below at a higher
                // vector_weight).
                Fusion::Weighted,
                &[
                    ("rrf", Fusion::Rrf),
                    ("weighted", Fusion::Weighted),
                    ("calibrated", Fusion::Calibrated),
                ],
            ),
            vector_weight_set: s.vector_weight.is_some(),
            vector_weight: c.ranged(
                "scoring.vector_weight",
                s.vector_weight,
                defaults::VECTOR_WEIGHT,
                0.0,
                1.0,
            ),
            mmr_lambda: c.ranged(
                "scoring.mmr_lambda",
                s.mmr_lambda,
                defaults::MMR_LAMBDA,
                0.0,
                1.0,
            ),
            reinforce_on_recall: c.ranged(
                "scoring.reinforce_on_recall",
                s.reinforce_on_recall,
                defaults::REINFORCE_ON_RECALL,
                0.0,
                1.0,
            ),
            context_window: c.count(
                "scoring.context_window",
                s.context_window,
                defaults::CONTEXT_WINDOW,
                0,
                MAX_CONTEXT_WINDOW,
            ),
            context_weight: c.ranged(
                "scoring.context_weight",
                s.context_weight,
                defaults::CONTEXT_WEIGHT,
                0.0,
                1.0,
            ),
            speaker_boost: c.ranged(
                "scoring.speaker_boost",
                s.speaker_boost,
                defaults::SPEAKER_BOOST,
                0.0,
                WEIGHT_MAX,
            ),
            time_boost: c.ranged(
                "scoring.time_boost",
                s.time_boost,
                defaults::TIME_BOOST,
                0.0,
                WEIGHT_MAX,
            ),
        };
        let all_weights = [
            scoring.relevance,
            scoring.recency,
            scoring.importance,
            scoring.utility,
            scoring.strength,
        ];
        if all_weights.iter().all(|w| *w == 0.0) {
            c.issue(
                "scoring",
                "every weight is 0, so recall could not rank anything; give at least one of \
                 relevance, recency, importance, utility, strength a weight above 0",
            );
        }

        let e = &raw.evaluation;
        let mode = c.choice(
            "evaluation.mode",
            e.mode.as_deref(),
            EvaluationMode::Rules,
            &[
                ("rules", EvaluationMode::Rules),
                ("llm", EvaluationMode::Llm),
                ("hybrid", EvaluationMode::Hybrid),
            ],
        );
        let default_importance = c.ranged(
            "evaluation.default_importance",
            e.default_importance,
            defaults::DEFAULT_IMPORTANCE,
            0.0,
            10.0,
        );
        let raw_rules = e.rules.clone().unwrap_or_else(defaults::rules);
        let mut rules = Vec::with_capacity(raw_rules.len());
        for (i, r) in raw_rules.iter().enumerate() {
            let key = format!("evaluation.rules[{i}]");
            let kinds = match &r.kinds {
                Some(k) if k.is_empty() => {
                    c.issue(
                        &format!("{key}.kinds"),
                        "is empty, so the rule could never match; list kinds, or remove \
                         `kinds` to match every kind",
                    );
                    Vec::new()
                }
                Some(k) => c.kinds(&format!("{key}.kinds"), k),
                None => Vec::new(),
            };
            let matches = match &r.matches {
                Some(src) => match Regex::new(src) {
                    Ok(re) => Some(re),
                    Err(err) => {
                        c.issue(
                            &format!("{key}.matches"),
                            format!(
                                "`{src}` is not a valid regex: {err}; see \
                                 https://docs.rs/regex/#syntax (write `(?i)` for case-insensitive)"
                            ),
                        );
                        None
                    }
                },
                None => None,
            };
            let importance = match r.importance {
                Some(_) => c.ranged(&format!("{key}.importance"), r.importance, 0.0, 0.0, 10.0),
                None => {
                    c.issue(
                        &format!("{key}.importance"),
                        "is missing; every rule must say the importance (0 to 10) it gives",
                    );
                    0.0
                }
            };
            rules.push(Rule {
                kinds,
                matches,
                importance,
            });
        }
        let evaluation = Evaluation {
            mode,
            default_importance,
            rules,
            prompt: c.prompt("evaluation.prompt", e.prompt.as_deref()),
        };

        let k = &raw.condensation;
        let every_events = c.count(
            "condensation.every_events",
            k.every_events,
            defaults::EVERY_EVENTS,
            1,
            100_000,
        );
        let min_events = c.count(
            "condensation.min_events",
            k.min_events,
            defaults::MIN_EVENTS,
            1,
            100_000,
        );
        if min_events > every_events {
            c.issue(
                "condensation.min_events",
                format!(
                    "{min_events} is more than condensation.every_events ({every_events}), so \
                     the count trigger could never condense; make min_events <= every_events"
                ),
            );
        }
        let condensation = Condensation {
            mode: c.choice(
                "condensation.mode",
                k.mode.as_deref(),
                CondensationMode::Extractive,
                &[
                    ("extractive", CondensationMode::Extractive),
                    ("llm", CondensationMode::Llm),
                ],
            ),
            every_events,
            max_age: c.duration(
                "condensation.max_age",
                k.max_age.as_deref(),
                defaults::MAX_AGE,
                true,
                false,
            ),
            min_events,
            prompt: c.prompt("condensation.prompt", k.prompt.as_deref()),
        };

        let f = &raw.forgetting;
        let protect_kinds = match &f.protect_kinds {
            Some(k) => c.kinds("forgetting.protect_kinds", k),
            None => defaults::PROTECT_KINDS
                .iter()
                .map(|s| s.to_string())
                .collect(),
        };
        let forgetting = Forgetting {
            curve: c.choice(
                "forgetting.curve",
                f.curve.as_deref(),
                Curve::HalfLife,
                &[
                    ("half_life", Curve::HalfLife),
                    ("ebbinghaus", Curve::Ebbinghaus),
                ],
            ),
            half_life: c.duration(
                "forgetting.half_life",
                f.half_life.as_deref(),
                defaults::HALF_LIFE,
                true,
                false,
            ),
            stability: c
                .duration(
                    "forgetting.stability",
                    f.stability.as_deref(),
                    defaults::STABILITY,
                    false,
                    false,
                )
                .unwrap_or(Duration::from_secs(86_400)),
            stability_growth: c.ranged(
                "forgetting.stability_growth",
                f.stability_growth,
                defaults::STABILITY_GROWTH,
                0.0,
                100.0,
            ),
            archive_below: {
                let v = c.ranged(
                    "forgetting.archive_below",
                    f.archive_below,
                    defaults::ARCHIVE_BELOW,
                    0.0,
                    1.0,
                );
                if v >= 1.0 {
                    c.issue(
                        "forgetting.archive_below",
                        "1 would archive every record at once; use a number from 0 (never \
                         archive) up to but not including 1",
                    );
                    defaults::ARCHIVE_BELOW as f32
                } else {
                    v
                }
            },
            purge_archived_after: c.duration(
                "forgetting.purge_archived_after",
                f.purge_archived_after.as_deref(),
                defaults::PURGE_ARCHIVED_AFTER,
                true,
                true,
            ),
            protect_kinds,
            interval: c.duration(
                "forgetting.interval",
                f.interval.as_deref(),
                defaults::INTERVAL,
                true,
                false,
            ),
        };

        let p = &raw.promotion;
        let promotion = Promotion {
            min_importance: c.ranged(
                "promotion.min_importance",
                p.min_importance,
                defaults::MIN_IMPORTANCE,
                0.0,
                10.0,
            ),
            min_utility: c.ranged(
                "promotion.min_utility",
                p.min_utility,
                defaults::MIN_UTILITY,
                0.0,
                1.0,
            ),
            min_successes: c.count(
                "promotion.min_successes",
                p.min_successes,
                defaults::MIN_SUCCESSES,
                0,
                1_000_000,
            ),
            merge_similarity: c.ranged(
                "promotion.merge_similarity",
                p.merge_similarity,
                defaults::MERGE_SIMILARITY,
                0.0,
                1.0,
            ),
        };

        let u = &raw.updates;
        let updates = Updates {
            mode: c.choice(
                "updates.mode",
                u.mode.as_deref(),
                UpdatesMode::Off,
                &[
                    ("off", UpdatesMode::Off),
                    ("rules", UpdatesMode::Rules),
                    ("llm", UpdatesMode::Llm),
                    ("hybrid", UpdatesMode::Hybrid),
                ],
            ),
            scope: c.choice(
                "updates.scope",
                u.scope.as_deref(),
                UpdatesScope::Namespace,
                &[
                    ("namespace", UpdatesScope::Namespace),
                    ("session", UpdatesScope::Session),
                    ("agent", UpdatesScope::Agent),
                ],
            ),
            candidates: c.count(
                "updates.candidates",
                u.candidates,
                defaults::UPDATES_CANDIDATES,
                1,
                50,
            ),
            max_chars: c.count(
                "updates.max_chars",
                u.max_chars,
                defaults::UPDATES_MAX_CHARS,
                20,
                1_048_576,
            ),
            min_similarity: c.ranged(
                "updates.min_similarity",
                u.min_similarity,
                defaults::UPDATES_MIN_SIMILARITY,
                0.0,
                1.0,
            ),
            thresholds: crate::updates::Thresholds {
                duplicate_similarity: c.ranged(
                    "updates.duplicate_similarity",
                    u.duplicate_similarity,
                    defaults::DUPLICATE_SIMILARITY,
                    0.0,
                    1.0,
                ),
                sentence_overlap: c.ranged(
                    "updates.sentence_overlap",
                    u.sentence_overlap,
                    defaults::SENTENCE_OVERLAP,
                    0.0,
                    1.0,
                ),
            },
            superseded_weight: c.ranged(
                "updates.superseded_weight",
                u.superseded_weight,
                defaults::SUPERSEDED_WEIGHT,
                0.0,
                1.0,
            ),
        };

        if !c.issues.is_empty() {
            c.issues.sort_by(|a, b| a.key.cmp(&b.key));
            return Err(PolicyErrors(c.issues));
        }
        let mut policy = Policy {
            name,
            hash: String::new(),
            file: file.to_string(),
            scoring,
            evaluation,
            condensation,
            forgetting,
            promotion,
            updates,
        };
        policy.hash = policy.content_hash();
        Ok(policy)
    }
}
