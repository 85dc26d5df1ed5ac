//! The first stage of a policy: [`RawPolicy`], the file as written (docs/policy.md), read
//! with the `config` crate from TOML plus `SHADOWBRAIN_POLICY__SECTION__KEY` environment
//! overrides.
//!
//! Owns the serde shape of the file and the translation of every read problem (TOML syntax,
//! unknown field, wrong type) into [`PolicyIssue`]s with the file and the dotted key. It must
//! never validate meaning (ranges, durations, regexes, enum values) — that is
//! [`super::compile`]'s job — and never applies defaults: every field is `Option`, `None`
//! meaning "the default".

use std::collections::HashMap;
use std::fmt;

use config::{Config, ConfigError, Environment, File, FileFormat, Source, Value, ValueKind};
use serde::de::{self, DeserializeOwned, Deserializer, Visitor};
use serde::{Deserialize, Serialize};

use crate::error::{PolicyErrors, PolicyIssue};

/// Prefix of the environment variables that override a policy file
/// (`SHADOWBRAIN_POLICY__SCORING__RECENCY=0.2`).
pub const ENV_PREFIX: &str = "SHADOWBRAIN_POLICY";
/// Separator between the prefix and each level of the key in an override variable.
pub const ENV_SEPARATOR: &str = "__";
/// Separator of list items in an override variable
/// (`SHADOWBRAIN_POLICY__FORGETTING__PROTECT_KINDS=goal,user_message`).
pub const ENV_LIST_SEPARATOR: &str = ",";
/// Keys whose override value is always a comma-separated list, even with a single item.
pub const ENV_LIST_KEYS: [&str; 1] = ["forgetting.protect_kinds"];

/// Pseudo-key of issues about the file as a whole (unreadable, or not TOML).
pub const FILE_KEY: &str = "(file)";

/// A policy file as written. Every field is optional; `None` means the default.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPolicy {
    /// The policy's name, recorded with every decision.
    #[serde(default)]
    pub name: Option<String>,
    /// How recall ranks candidates.
    #[serde(default)]
    pub scoring: RawScoring,
    /// Importance at write time.
    #[serde(default)]
    pub evaluation: RawEvaluation,
    /// When and how a session's records are condensed.
    #[serde(default)]
    pub condensation: RawCondensation,
    /// How strength decays and what is archived and purged.
    #[serde(default)]
    pub forgetting: RawForgetting,
    /// Which condensed records enter the knowledge pool.
    #[serde(default)]
    pub promotion: RawPromotion,
    /// Extension: whether and how newer records are checked against older ones for
    /// updates, contradictions and duplicates (off when absent).
    #[serde(default)]
    pub updates: RawUpdates,
}

/// `[scoring]` as written.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawScoring {
    /// Weight of query similarity.
    #[serde(default, deserialize_with = "number")]
    pub relevance: Option<f64>,
    /// Weight of `2^(-age / recency_half_life)`.
    #[serde(default, deserialize_with = "number")]
    pub recency: Option<f64>,
    /// Weight of `importance / 10`.
    #[serde(default, deserialize_with = "number")]
    pub importance: Option<f64>,
    /// Weight of utility (Beta mean).
    #[serde(default, deserialize_with = "number")]
    pub utility: Option<f64>,
    /// Extension: weight of the record's current strength (default 0).
    #[serde(default, deserialize_with = "number")]
    pub strength: Option<f64>,
    /// Duration string, or `"never"` for no recency decay.
    #[serde(default)]
    pub recency_half_life: Option<String>,
    /// Extension: `"event"` (age from the event time, the default) or `"last_access"`.
    #[serde(default)]
    pub recency_basis: Option<String>,
    /// `"rrf"` or `"weighted"`.
    #[serde(default)]
    pub fusion: Option<String>,
    /// Share of the vector path in fused relevance (the keyword path gets the rest).
    #[serde(default, deserialize_with = "number")]
    pub vector_weight: Option<f64>,
    /// MMR trade-off; below 1.0 turns on diversity re-ranking.
    #[serde(default, deserialize_with = "number")]
    pub mmr_lambda: Option<f64>,
    /// Strength added to each returned record.
    #[serde(default, deserialize_with = "number")]
    pub reinforce_on_recall: Option<f64>,
    /// Extension: neighbouring records of the same session, on each side, whose words count
    /// toward a record's keyword match.
    #[serde(default)]
    pub context_window: Option<u32>,
    /// Extension: how much a neighbour's word counts, against 1 for the record's own.
    #[serde(default, deserialize_with = "number")]
    pub context_weight: Option<f64>,
    /// Extension: relevance bonus for records whose speaker (`Name: …`) the query names.
    #[serde(default, deserialize_with = "number")]
    pub speaker_boost: Option<f64>,
    /// Extension: relevance bonus for records from a time the query names.
    #[serde(default, deserialize_with = "number")]
    pub time_boost: Option<f64>,
}

/// `[evaluation]` as written.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawEvaluation {
    /// `"rules"`, `"llm"` or `"hybrid"`.
    #[serde(default)]
    pub mode: Option<String>,
    /// Importance when no rule matches.
    #[serde(default, deserialize_with = "number")]
    pub default_importance: Option<f64>,
    /// The rules, first match wins; absent means the two default rules, `[]` means none.
    #[serde(default)]
    pub rules: Option<Vec<RawRule>>,
    /// What the LLM judge is told about rating (`llm`/`hybrid`); absent means the built-in
    /// guidance. The answer format is always appended by the judge.
    #[serde(default)]
    pub prompt: Option<String>,
}

/// One `[[evaluation.rules]]` entry as written.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRule {
    /// Kinds the rule applies to; absent means every kind.
    #[serde(default)]
    pub kinds: Option<Vec<String>>,
    /// A regex the text must match; absent means any text.
    #[serde(default)]
    pub matches: Option<String>,
    /// The importance the rule gives (required).
    #[serde(default, deserialize_with = "number")]
    pub importance: Option<f64>,
}

/// `[condensation]` as written.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCondensation {
    /// `"extractive"` or `"llm"`.
    #[serde(default)]
    pub mode: Option<String>,
    /// Condense when this many uncondensed events accumulate.
    #[serde(default, deserialize_with = "count")]
    pub every_events: Option<u32>,
    /// ...or when the oldest uncondensed event is this old (duration or `"never"`).
    #[serde(default)]
    pub max_age: Option<String>,
    /// Never condense fewer events than this.
    #[serde(default, deserialize_with = "count")]
    pub min_events: Option<u32>,
    /// What the LLM condenser is told about writing (`llm` mode); absent means the built-in
    /// guidance. The answer format is always appended by the condenser.
    #[serde(default)]
    pub prompt: Option<String>,
}

/// `[forgetting]` as written.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawForgetting {
    /// Extension: `"half_life"` (the default) or `"ebbinghaus"`.
    #[serde(default)]
    pub curve: Option<String>,
    /// Strength halves over this without reinforcement (duration or `"never"`).
    #[serde(default)]
    pub half_life: Option<String>,
    /// Extension (ebbinghaus): initial stability S of `R = e^(-t/S)`.
    #[serde(default)]
    pub stability: Option<String>,
    /// Extension (ebbinghaus): each reinforcement adds this many initial stabilities to S.
    #[serde(default, deserialize_with = "number")]
    pub stability_growth: Option<f64>,
    /// Active records whose strength falls below this are archived.
    #[serde(default, deserialize_with = "number")]
    pub archive_below: Option<f64>,
    /// Archived records are purged this long after archiving (duration or `"never"`).
    #[serde(default)]
    pub purge_archived_after: Option<String>,
    /// Kinds that never decay.
    #[serde(default)]
    pub protect_kinds: Option<Vec<String>>,
    /// Decay sweep period on the runtime clock (duration or `"never"`).
    #[serde(default)]
    pub interval: Option<String>,
}

/// `[updates]` as written.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawUpdates {
    /// `"off"` (default), `"rules"`, `"llm"` or `"hybrid"`.
    #[serde(default)]
    pub mode: Option<String>,
    /// `"namespace"` (default), `"session"` or `"agent"`: where older records are looked for.
    #[serde(default)]
    pub scope: Option<String>,
    /// How many nearest older records each new record is compared with.
    #[serde(default, deserialize_with = "count")]
    pub candidates: Option<u32>,
    /// Records longer than this (bytes of text) are neither compared nor compared with.
    #[serde(default, deserialize_with = "count")]
    pub max_chars: Option<u32>,
    /// Embedding similarity below which a neighbour is not compared at all.
    #[serde(default, deserialize_with = "number")]
    pub min_similarity: Option<f64>,
    /// Similarity at or above which two records without a conflict are one fact.
    #[serde(default, deserialize_with = "number")]
    pub duplicate_similarity: Option<f64>,
    /// Share of the shorter sentence's terms two sentences must share to be aligned.
    #[serde(default, deserialize_with = "number")]
    pub sentence_overlap: Option<f64>,
    /// What a superseded record's recall score is multiplied by (1 keeps it as it was).
    #[serde(default, deserialize_with = "number")]
    pub superseded_weight: Option<f64>,
}

/// `[promotion]` as written.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPromotion {
    /// Minimum importance of a condensed record to be promoted.
    #[serde(default, deserialize_with = "number")]
    pub min_importance: Option<f64>,
    /// Minimum utility (Beta mean).
    #[serde(default, deserialize_with = "number")]
    pub min_utility: Option<f64>,
    /// Minimum successful recalls.
    #[serde(default, deserialize_with = "count")]
    pub min_successes: Option<u32>,
    /// Cosine similarity at or above which a promotion merges into an existing node.
    #[serde(default, deserialize_with = "number")]
    pub merge_similarity: Option<f64>,
}

/// Numbers only: `config` would otherwise turn `true` or `"yes"` into `1.0` without a word.
/// Numeric strings are accepted because environment overrides arrive as strings.
fn number<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    struct Num;
    impl Visitor<'_> for Num {
        type Value = f64;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a number")
        }
        fn visit_f64<E: de::Error>(self, v: f64) -> Result<f64, E> {
            Ok(v)
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<f64, E> {
            Ok(v as f64)
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<f64, E> {
            Ok(v as f64)
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<f64, E> {
            v.trim()
                .parse()
                .map_err(|_| E::invalid_type(de::Unexpected::Str(v), &self))
        }
    }
    d.deserialize_any(Num).map(Some)
}

/// Whole numbers only, `0..=u32::MAX` (a count of events or successes).
fn count<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    struct Count;
    impl Count {
        fn whole<E: de::Error>(self, v: f64, unexp: de::Unexpected) -> Result<u32, E> {
            if v.fract() == 0.0 && (0.0..=u32::MAX as f64).contains(&v) {
                Ok(v as u32)
            } else {
                Err(E::invalid_value(unexp, &self))
            }
        }
    }
    impl Visitor<'_> for Count {
        type Value = u32;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a whole number from 0 to 4294967295")
        }
        fn visit_f64<E: de::Error>(self, v: f64) -> Result<u32, E> {
            self.whole(v, de::Unexpected::Float(v))
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<u32, E> {
            u32::try_from(v).map_err(|_| E::invalid_value(de::Unexpected::Signed(v), &self))
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<u32, E> {
            u32::try_from(v).map_err(|_| E::invalid_value(de::Unexpected::Unsigned(v), &self))
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<u32, E> {
            v.trim()
                .parse()
                .map_err(|_| E::invalid_type(de::Unexpected::Str(v), &self))
        }
    }
    d.deserialize_any(Count).map(Some)
}

impl RawPolicy {
    /// Reads a policy from TOML text plus environment overrides.
    ///
    /// `env` is the variable set to read overrides from: `None` reads the process
    /// environment, `Some(map)` reads only the map (tests, and callers that already hold a
    /// snapshot). Only variables starting with `SHADOWBRAIN_POLICY__` are used. Every read
    /// problem comes back at once, each with `file` and its dotted key.
    pub fn read(
        file: &str,
        toml: &str,
        env: Option<HashMap<String, String>>,
    ) -> Result<RawPolicy, PolicyErrors> {
        match RawPolicy::read_partial(file, toml, env) {
            (Some(raw), issues) if issues.is_empty() => Ok(raw),
            (_, issues) => Err(PolicyErrors(issues)),
        }
    }

    /// Like [`RawPolicy::read`], but also returns what could be read: the policy without
    /// the keys that had problems (they fall back to their defaults), so compilation can
    /// still report its own issues alongside the read issues. `None` when the text is not
    /// TOML at all.
    pub fn read_partial(
        file: &str,
        toml: &str,
        env: Option<HashMap<String, String>>,
    ) -> (Option<RawPolicy>, Vec<PolicyIssue>) {
        let env = env.unwrap_or_else(process_env);
        let env_keys = env_keys(&env);
        let issue = |key: String, reason: String| PolicyIssue {
            file: file.to_string(),
            reason: annotate_env(&env_keys, &key, reason),
            key,
        };
        let mut environment = Environment::with_prefix(ENV_PREFIX)
            .separator(ENV_SEPARATOR)
            .try_parsing(true)
            .ignore_empty(true)
            .list_separator(ENV_LIST_SEPARATOR);
        for key in ENV_LIST_KEYS {
            environment = environment.with_list_parse_key(key);
        }
        let built = Config::builder()
            .add_source(File::from_str(toml, FileFormat::Toml))
            .add_source(environment.source(Some(env)))
            .build();
        let table = match built.and_then(|config| config.collect()) {
            Ok(table) => table,
            Err(ConfigError::FileParse { cause, .. }) => {
                let reason = format!("is not valid TOML: {cause}");
                return (None, vec![issue(FILE_KEY.to_string(), reason)]);
            }
            Err(other) => {
                let reason = format!(
                    "the {ENV_PREFIX}{ENV_SEPARATOR}* overrides could not be read: {other}; \
                     write them as {ENV_PREFIX}{ENV_SEPARATOR}SECTION{ENV_SEPARATOR}KEY=value"
                );
                return (None, vec![issue("(environment)".to_string(), reason)]);
            }
        };
        // serde stops at the first problem, and would accept a section written as an array
        // (`scoring = [1, 2]` fills fields by position); walking the tree key by key finds
        // every problem, and keeps what is good so compilation can check it too.
        let mut found = Vec::new();
        let cleaned = diagnose_policy(Value::new(None, ValueKind::Table(table)), &mut found);
        let partial = match cleaned.map(Value::try_deserialize::<RawPolicy>) {
            Some(Ok(raw)) => Some(raw),
            Some(Err(e)) => {
                // Every key passed on its own, so this is a bug in the walk; say so plainly.
                found.push((String::new(), reason_of(&e)));
                None
            }
            None => None,
        };
        found.sort();
        let issues = found.into_iter().map(|(k, r)| issue(k, r)).collect();
        (partial, issues)
    }
}

/// The `SHADOWBRAIN_POLICY__*` variables of the process environment. Names and values
/// that are not valid Unicode are converted lossily (and then fail validation visibly)
/// instead of panicking as `std::env::vars` would.
pub fn process_env() -> HashMap<String, String> {
    let pattern = format!("{ENV_PREFIX}{ENV_SEPARATOR}").to_lowercase();
    std::env::vars_os()
        .map(|(k, v)| {
            (
                k.to_string_lossy().into_owned(),
                v.to_string_lossy().into_owned(),
            )
        })
        .filter(|(k, _)| k.to_lowercase().starts_with(&pattern))
        .collect()
}

/// The dotted keys set by override variables, each with the variable that set it.
pub(crate) fn env_keys(env: &HashMap<String, String>) -> Vec<(String, String)> {
    let pattern = format!("{ENV_PREFIX}{ENV_SEPARATOR}").to_lowercase();
    let mut keys: Vec<(String, String)> = env
        .iter()
        .filter(|(_, v)| !v.is_empty())
        .filter_map(|(var, _)| {
            let lower = var.to_lowercase();
            let rest = lower.strip_prefix(&pattern)?;
            Some((rest.replace(ENV_SEPARATOR, "."), var.clone()))
        })
        .collect();
    keys.sort();
    keys
}

/// Says which variable set a key, because the file itself will look right to its reader.
pub(crate) fn annotate_env(env_keys: &[(String, String)], key: &str, reason: String) -> String {
    match env_keys.iter().find(|(k, _)| {
        key == k
            || key
                .strip_prefix(k.as_str())
                .is_some_and(|rest| rest.starts_with('.') || rest.starts_with('['))
    }) {
        Some((_, var)) => {
            format!("{reason} (this value comes from the environment variable {var})")
        }
        None => reason,
    }
}

/// `config` wraps errors with the key and origin; the issue carries the key already, so only
/// the core message is kept.
fn reason_of(e: &ConfigError) -> String {
    match e {
        ConfigError::At { error, .. } => reason_of(error),
        ConfigError::Type {
            unexpected,
            expected,
            ..
        } => format!("invalid type: {unexpected}, expected {expected}"),
        ConfigError::NotFound(key) => format!("missing field `{key}`"),
        other => other.to_string(),
    }
}

/// Checks the value at a dotted path, records its problems, returns what is good in it.
type Diagnose = fn(&str, Value, &mut Vec<(String, String)>) -> Option<Value>;

fn diagnose_policy(tree: Value, issues: &mut Vec<(String, String)>) -> Option<Value> {
    diagnose_table::<RawPolicy>(
        "",
        tree,
        issues,
        &[
            ("scoring", diagnose_table_at::<RawScoring>),
            ("evaluation", diagnose_evaluation),
            ("condensation", diagnose_table_at::<RawCondensation>),
            ("forgetting", diagnose_table_at::<RawForgetting>),
            ("promotion", diagnose_table_at::<RawPromotion>),
            ("updates", diagnose_table_at::<RawUpdates>),
        ],
    )
}

fn diagnose_table_at<T: DeserializeOwned>(
    path: &str,
    v: Value,
    issues: &mut Vec<(String, String)>,
) -> Option<Value> {
    diagnose_table::<T>(path, v, issues, &[])
}

fn diagnose_evaluation(path: &str, v: Value, issues: &mut Vec<(String, String)>) -> Option<Value> {
    diagnose_table::<RawEvaluation>(path, v, issues, &[("rules", diagnose_rules)])
}

fn diagnose_rules(path: &str, v: Value, issues: &mut Vec<(String, String)>) -> Option<Value> {
    let origin = v.origin().map(str::to_string);
    match v.kind {
        ValueKind::Array(items) => {
            let good: Vec<Value> = items
                .into_iter()
                .enumerate()
                .filter_map(|(i, item)| {
                    diagnose_table::<RawRule>(&format!("{path}[{i}]"), item, issues, &[])
                })
                .collect();
            Some(Value::new(origin.as_ref(), ValueKind::Array(good)))
        }
        other => {
            let e = Value::new(origin.as_ref(), other)
                .try_deserialize::<Vec<RawRule>>()
                .err()?;
            issues.push((
                path.to_string(),
                format!(
                    "{}; write each rule as a [[evaluation.rules]] table",
                    reason_of(&e)
                ),
            ));
            None
        }
    }
}

/// Reads each key of a table on its own into `T` (every field of `T` is optional, so a
/// one-key table is a complete `T`), which names the exact key of every bad field.
/// Returns the table without its bad keys, or `None` when the value is not a table.
fn diagnose_table<T: DeserializeOwned>(
    path: &str,
    v: Value,
    issues: &mut Vec<(String, String)>,
    nested: &[(&str, Diagnose)],
) -> Option<Value> {
    let origin = v.origin().map(str::to_string);
    let table = match v.kind {
        ValueKind::Table(table) => table,
        other => {
            issues.push((
                path.to_string(),
                format!(
                    "is {}, but must be a table; write it as a [{path}] section",
                    describe(&other)
                ),
            ));
            return None;
        }
    };
    let mut keys: Vec<_> = table.into_iter().collect();
    keys.sort_by(|a, b| a.0.cmp(&b.0));
    let mut good = config::Map::new();
    for (key, value) in keys {
        let dotted = if path.is_empty() {
            key.clone()
        } else {
            format!("{path}.{key}")
        };
        if let Some((_, recurse)) = nested.iter().find(|(n, _)| *n == key) {
            if let Some(cleaned) = recurse(&dotted, value, issues) {
                good.insert(key, cleaned);
            }
            continue;
        }
        let mut one = config::Map::new();
        one.insert(key.clone(), value.clone());
        match Value::new(origin.as_ref(), ValueKind::Table(one)).try_deserialize::<T>() {
            Ok(_) => {
                good.insert(key, value);
            }
            Err(e) => {
                let mut reason = reason_of(&e);
                if reason.starts_with("unknown field") {
                    reason.push_str("; remove it or correct its spelling");
                } else if reason.ends_with("expected a sequence") {
                    reason.push_str(", write a list such as [\"goal\"]");
                }
                issues.push((dotted, reason));
            }
        }
    }
    Some(Value::new(origin.as_ref(), ValueKind::Table(good)))
}

fn describe(kind: &ValueKind) -> String {
    match kind {
        ValueKind::Nil => "empty".to_string(),
        ValueKind::Boolean(b) => format!("the boolean {b}"),
        ValueKind::I64(n) => format!("the number {n}"),
        ValueKind::I128(n) => format!("the number {n}"),
        ValueKind::U64(n) => format!("the number {n}"),
        ValueKind::U128(n) => format!("the number {n}"),
        ValueKind::Float(n) => format!("the number {n}"),
        ValueKind::String(s) => format!("the string {s:?}"),
        ValueKind::Table(_) => "a table".to_string(),
        ValueKind::Array(_) => "an array".to_string(),
    }
}
