//! The policy engine: one TOML file (docs/policy.md) decides scoring, evaluation, condensation,
//! forgetting and promotion, so researchers compare memory policies by swapping a file.
//!
//! Two stages, like ripgrep's `LowArgs -> HiArgs`: [`raw`] reads a [`RawPolicy`] with the
//! `config` crate (file + `SHADOWBRAIN_POLICY__SECTION__KEY` overrides, unknown fields are
//! errors), [`Policy::compile`] validates it and reports every problem with file and key.
//! The compiled [`Policy`] carries a content hash, recorded with every decision, and the
//! pure decision functions in [`decide`].
//!
//! This module owns what a policy *means*. It must never do I/O beyond reading the policy
//! file, never read a clock (callers pass `now`), and never touch the store: actors apply
//! the decisions it returns.

pub mod compile;
pub mod decide;
pub mod raw;

use std::collections::HashMap;
use std::path::Path;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::error::{PolicyErrors, PolicyIssue};
use crate::model::PolicyStamp;

pub use compile::{
    Condensation, CondensationMode, Curve, Evaluation, EvaluationMode, Forgetting, Fusion,
    Promotion, RecencyBasis, Rule, Scoring, Updates, UpdatesMode, UpdatesScope, format_duration,
    parse_duration,
};
pub use decide::{ForgetDecision, ImportanceDecision, ScoreBreakdown, ScoreInput};
pub use raw::{
    RawCondensation, RawEvaluation, RawForgetting, RawPolicy, RawPromotion, RawRule, RawScoring,
    RawUpdates,
};

/// The file label of [`Policy::default_policy`].
pub const DEFAULT_FILE: &str = "<default>";

/// A compiled, validated policy. Build it with [`Policy::load`], [`Policy::from_toml`] or
/// [`Policy::compile`]; every field is already checked and defaulted.
#[derive(Debug, Clone)]
pub struct Policy {
    /// The policy's `name` (default `"default"`).
    pub name: String,
    /// First 16 hex digits of the SHA-256 of the canonical compiled policy (see
    /// [`Policy::content_hash`]).
    pub hash: String,
    /// Where it came from: a path, `<inline>` or `<default>`.
    pub file: String,
    /// How recall ranks candidates.
    pub scoring: Scoring,
    /// Importance at write time.
    pub evaluation: Evaluation,
    /// When and how sessions are condensed.
    pub condensation: Condensation,
    /// Decay, archiving and purging.
    pub forgetting: Forgetting,
    /// Promotion into the knowledge pool.
    pub promotion: Promotion,
    /// Detecting facts that change.
    pub updates: Updates,
}

impl Default for Policy {
    fn default() -> Self {
        Policy::default_policy()
    }
}

impl Policy {
    /// The default policy (docs/policy.md): exactly what an empty file compiles to.
    pub fn default_policy() -> Policy {
        match Policy::compile(RawPolicy::default(), DEFAULT_FILE) {
            Ok(p) => p,
            // The defaults are constants checked by the tests; reaching this is a build bug.
            Err(e) => unreachable!("the built-in default policy does not compile: {e}"),
        }
    }

    /// Loads a policy file and applies `SHADOWBRAIN_POLICY__SECTION__KEY` overrides from the
    /// process environment.
    pub fn load(path: &Path) -> Result<Policy, PolicyErrors> {
        Policy::load_with_env(path, None)
    }

    /// Like [`Policy::load`], with the override variables taken from `env` instead of the
    /// process environment when it is `Some` (tests, or a captured environment).
    pub fn load_with_env(
        path: &Path,
        env: Option<HashMap<String, String>>,
    ) -> Result<Policy, PolicyErrors> {
        let label = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| {
            PolicyErrors(vec![PolicyIssue {
                file: label.clone(),
                key: raw::FILE_KEY.to_string(),
                reason: format!(
                    "cannot read the policy file: {e}; check the path (e.g. `--policy \
                     policies/default.toml`)"
                ),
            }])
        })?;
        Policy::from_toml_with_env(&label, &text, env)
    }

    /// Compiles a policy from TOML text, without environment overrides.
    pub fn from_toml(file_label: &str, toml: &str) -> Result<Policy, PolicyErrors> {
        Policy::from_toml_with_env(file_label, toml, Some(HashMap::new()))
    }

    /// Compiles a policy from TOML text plus the overrides found in `env` (`None`: the
    /// process environment). Issues about overridden keys name the variable that set them.
    pub fn from_toml_with_env(
        file_label: &str,
        toml: &str,
        env: Option<HashMap<String, String>>,
    ) -> Result<Policy, PolicyErrors> {
        let env = env.unwrap_or_else(raw::process_env);
        let env_keys = raw::env_keys(&env);
        let (partial, mut issues) = RawPolicy::read_partial(file_label, toml, Some(env));
        let Some(raw) = partial else {
            return Err(PolicyErrors(issues));
        };
        match Policy::compile(raw, file_label) {
            Ok(policy) if issues.is_empty() => return Ok(policy),
            Ok(_) => {}
            Err(PolicyErrors(compiled)) => {
                // A key that could not be read fell back to its default; anything compile
                // says under it (e.g. "importance is missing") is the same problem again.
                let read_keys: Vec<String> = issues.iter().map(|i| i.key.clone()).collect();
                let under = |key: &str, parent: &str| {
                    key == parent
                        || key.strip_prefix(parent).is_some_and(|rest| {
                            parent.is_empty() || rest.starts_with('.') || rest.starts_with('[')
                        })
                };
                issues.extend(
                    compiled
                        .into_iter()
                        .filter(|i| !read_keys.iter().any(|r| under(&i.key, r)))
                        .map(|i| PolicyIssue {
                            reason: raw::annotate_env(&env_keys, &i.key, i.reason),
                            ..i
                        }),
                );
            }
        }
        issues.sort_by(|a, b| a.key.cmp(&b.key));
        Err(PolicyErrors(issues))
    }

    /// This policy as it decides with an embedder that is `semantic` or not. A policy file
    /// that leaves `scoring.vector_weight` or `scoring.fusion` out gets the default of that
    /// kind of embedder: the hash embedder's vectors are lexical, like BM25, and earn little
    /// weight (`weighted`, 0.1); a semantic model's earn more once its cosines are put on
    /// BM25's scale (`calibrated`, 0.3). The hash follows, so every record says how it was
    /// ranked.
    pub fn for_embedder(mut self, semantic: bool) -> Policy {
        let before = (self.scoring.fusion, self.scoring.vector_weight);
        if !self.scoring.vector_weight_set {
            self.scoring.vector_weight = if semantic {
                compile::defaults::VECTOR_WEIGHT_SEMANTIC
            } else {
                compile::defaults::VECTOR_WEIGHT
            } as f32;
        }
        if !self.scoring.fusion_set {
            self.scoring.fusion = if semantic {
                Fusion::Calibrated
            } else {
                Fusion::Weighted
            };
        }
        if (self.scoring.fusion, self.scoring.vector_weight) != before {
            self.hash = self.content_hash();
        }
        self
    }

    /// The name and hash to record with a decision.
    pub fn stamp(&self) -> PolicyStamp {
        PolicyStamp {
            name: self.name.clone(),
            hash: self.hash.clone(),
        }
    }

    /// The compiled policy as JSON (the `policy` of `GET /v1/policy`): the same keys as the
    /// file, with every default filled in. Written back as TOML it compiles to the same hash.
    pub fn to_json(&self) -> Value {
        let mut v = self.canonical();
        if let Value::Object(map) = &mut v {
            map.insert("name".into(), json!(self.name));
        }
        v
    }

    /// The hash of the behaviour: SHA-256 over the canonical JSON of the compiled sections
    /// (keys sorted, defaults filled in, durations normalised), first 16 hex digits. Comments,
    /// whitespace, key order, `3d` vs `72h`, and the `name` do not change it — a renamed copy
    /// decides identically, and the name is recorded next to the hash anyway.
    pub fn content_hash(&self) -> String {
        let bytes = serde_json::to_vec(&sorted(self.canonical())).unwrap_or_default();
        let digest = Sha256::digest(&bytes);
        digest[..8].iter().map(|b| format!("{b:02x}")).collect()
    }

    fn canonical(&self) -> Value {
        let s = &self.scoring;
        let e = &self.evaluation;
        let k = &self.condensation;
        let f = &self.forgetting;
        let p = &self.promotion;
        let rules: Vec<Value> = e
            .rules
            .iter()
            .map(|r| {
                let mut rule = serde_json::Map::new();
                if !r.kinds.is_empty() {
                    rule.insert("kinds".into(), json!(r.kinds));
                }
                if let Some(re) = &r.matches {
                    rule.insert("matches".into(), json!(re.as_str()));
                }
                rule.insert("importance".into(), json!(r.importance));
                Value::Object(rule)
            })
            .collect();
        let mut v = json!({
            "scoring": {
                "relevance": s.relevance,
                "recency": s.recency,
                "importance": s.importance,
                "utility": s.utility,
                "strength": s.strength,
                "recency_half_life": format_duration(s.recency_half_life),
                "recency_basis": match s.recency_basis {
                    RecencyBasis::Event => "event",
                    RecencyBasis::LastAccess => "last_access",
                },
                "fusion": match s.fusion {
                    Fusion::Rrf => "rrf",
                    Fusion::Weighted => "weighted",
                    Fusion::Calibrated => "calibrated",
                },
                "vector_weight": s.vector_weight,
                "mmr_lambda": s.mmr_lambda,
                "reinforce_on_recall": s.reinforce_on_recall,
                "context_window": s.context_window,
                "context_weight": s.context_weight,
                "speaker_boost": s.speaker_boost,
                "time_boost": s.time_boost,
            },
            "evaluation": {
                "mode": match e.mode {
                    EvaluationMode::Rules => "rules",
                    EvaluationMode::Llm => "llm",
                    EvaluationMode::Hybrid => "hybrid",
                },
                "default_importance": e.default_importance,
                "rules": rules,
            },
            "condensation": {
                "mode": match k.mode {
                    CondensationMode::Extractive => "extractive",
                    CondensationMode::Llm => "llm",
                },
                "every_events": k.every_events,
                "max_age": format_duration(k.max_age),
                "min_events": k.min_events,
            },
            "forgetting": {
                "curve": match f.curve { Curve::HalfLife => "half_life", Curve::Ebbinghaus => "ebbinghaus" },
                "half_life": format_duration(f.half_life),
                "stability": format_duration(Some(f.stability)),
                "stability_growth": f.stability_growth,
                "archive_below": f.archive_below,
                "purge_archived_after": format_duration(f.purge_archived_after),
                "protect_kinds": f.protect_kinds,
                "interval": format_duration(f.interval),
            },
            "promotion": {
                "min_importance": p.min_importance,
                "min_utility": p.min_utility,
                "min_successes": p.min_successes,
                "merge_similarity": p.merge_similarity,
            },
        });
        // Prompt overrides join the canonical form only when set, so every policy written
        // before they existed keeps its hash (and the stamps on its records stay true).
        for (section, prompt) in [("evaluation", &e.prompt), ("condensation", &k.prompt)] {
            if let (Some(text), Some(Value::Object(map))) = (prompt, v.get_mut(section)) {
                map.insert("prompt".into(), json!(text));
            }
        }
        // Likewise `[updates]`: a policy that does not turn it on behaves as before it
        // existed, whatever else the section says, and keeps its hash.
        let u = &self.updates;
        if let (true, Value::Object(map)) = (u.on(), &mut v) {
            map.insert(
                "updates".into(),
                json!({
                    "mode": u.mode.as_str(),
                    "scope": match u.scope {
                        UpdatesScope::Namespace => "namespace",
                        UpdatesScope::Session => "session",
                        UpdatesScope::Agent => "agent",
                    },
                    "candidates": u.candidates,
                    "max_chars": u.max_chars,
                    "min_similarity": u.min_similarity,
                    "duplicate_similarity": u.thresholds.duplicate_similarity,
                    "sentence_overlap": u.thresholds.sentence_overlap,
                    "superseded_weight": u.superseded_weight,
                }),
            );
        }
        v
    }
}

/// Sorts object keys recursively, so the hash does not depend on whether serde_json was
/// built with `preserve_order` by some other crate in the graph.
fn sorted(v: Value) -> Value {
    match v {
        Value::Object(map) => {
            let mut entries: Vec<(String, Value)> = map.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            Value::Object(entries.into_iter().map(|(k, v)| (k, sorted(v))).collect())
        }
        Value::Array(items) => Value::Array(items.into_iter().map(sorted).collect()),
        other => other,
    }
}

#[cfg(test)]
mod tests;
