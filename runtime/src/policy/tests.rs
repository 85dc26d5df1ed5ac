//! Tests of reading, compiling and hashing policies: the shipped files, every error class,
//! environment overrides and the content hash. Decision tests live in `decide.rs`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::*;

const H: u64 = 3600;
const D: u64 = 86_400;

fn policies_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies")
}

fn no_env() -> Option<HashMap<String, String>> {
    Some(HashMap::new())
}

fn env(pairs: &[(&str, &str)]) -> Option<HashMap<String, String>> {
    Some(
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    )
}

fn errors(toml: &str) -> Vec<PolicyIssue> {
    match Policy::from_toml("bad.toml", toml) {
        Ok(p) => panic!("expected errors, compiled to {}", p.to_json()),
        Err(PolicyErrors(issues)) => issues,
    }
}

/// The issue at `key`, checked to name the file and to contain every needle.
fn assert_issue(issues: &[PolicyIssue], key: &str, needles: &[&str]) {
    let Some(issue) = issues.iter().find(|i| i.key == key) else {
        panic!("no issue at `{key}`; got {issues:#?}");
    };
    assert_eq!(issue.file, "bad.toml");
    let shown = issue.to_string();
    assert!(shown.starts_with("bad.toml: `"), "{shown}");
    for n in needles {
        assert!(shown.contains(n), "issue at `{key}` lacks {n:?}: {shown}");
    }
}

#[test]
fn every_shipped_policy_compiles_and_says_what_it_claims() {
    type Check = fn(&Policy);
    let expectations: Vec<(&str, Check)> = vec![
        ("default.toml", |p| {
            let d = Policy::default_policy();
            assert_eq!(
                p.hash, d.hash,
                "default.toml must be exactly the built-in default"
            );
            assert_eq!(p.name, "default");
        }),
        ("generative-agents.toml", |p| {
            assert_eq!(p.name, "generative-agents");
            let s = &p.scoring;
            assert_eq!((s.relevance, s.recency, s.importance), (1.0, 1.0, 1.0));
            assert_eq!(s.utility, 0.0);
            assert_eq!(s.recency_basis, RecencyBasis::LastAccess);
            // 0.995 per hour, as in the paper.
            let per_hour = p.recency(3_600_000);
            assert!((per_hour - 0.995).abs() < 1e-5, "{per_hour}");
            let per_day = p.recency(86_400_000);
            assert!((per_day - 0.995f32.powi(24)).abs() < 1e-4, "{per_day}");
            assert_eq!(p.forgetting.half_life, None);
            assert_eq!(p.forgetting.archive_below, 0.0);
            assert_eq!(p.forgetting.purge_archived_after, None);
        }),
        ("ebbinghaus.toml", |p| {
            assert_eq!(p.name, "ebbinghaus");
            assert_eq!(p.forgetting.curve, Curve::Ebbinghaus);
            assert_eq!(p.forgetting.stability, Duration::from_secs(D));
            assert_eq!(p.forgetting.stability_growth, 1.0);
            assert_eq!(p.scoring.reinforce_on_recall, 1.0);
            assert!(p.forgetting.protect_kinds.is_empty());
            // S grows with recalls: 1 day, then 2, then 3 (MemoryBank's S += 1).
            assert_eq!(p.stability_ms(0), 86_400_000.0);
            assert_eq!(p.stability_ms(2), 3.0 * 86_400_000.0);
        }),
        ("facts-change.toml", |p| {
            assert_eq!(p.name, "facts-change");
            let u = &p.updates;
            assert_eq!(u.mode, UpdatesMode::Rules);
            assert_eq!(u.scope, UpdatesScope::Namespace);
            assert_eq!((u.candidates, u.max_chars), (5, 600));
            assert_eq!((u.min_similarity, u.superseded_weight), (0.5, 1.0));
            assert_eq!(u.thresholds, crate::updates::Thresholds::default());
            // Ranking and forgetting are the default's, so runs differ only in detection.
            let d = Policy::default_policy();
            assert_eq!(p.scoring.relevance, d.scoring.relevance);
            assert_eq!(p.scoring.recency_half_life, d.scoring.recency_half_life);
            assert_eq!(p.forgetting.half_life, d.forgetting.half_life);
            assert_eq!(p.promotion.merge_similarity, d.promotion.merge_similarity);
        }),
        ("keep-everything.toml", |p| {
            assert_eq!(p.name, "keep-everything");
            assert_eq!(p.forgetting.half_life, None);
            assert_eq!(p.forgetting.archive_below, 0.0);
            assert_eq!(p.forgetting.purge_archived_after, None);
            assert_eq!(p.forgetting.interval, None);
            // Ranking is the default's, so runs differ only in forgetting.
            let d = Policy::default_policy();
            assert_eq!(p.scoring.recency_half_life, d.scoring.recency_half_life);
            assert_eq!(p.scoring.relevance, d.scoring.relevance);
        }),
    ];
    let mut seen = Vec::new();
    for entry in std::fs::read_dir(policies_dir()).expect("policies/ exists") {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("toml") {
            continue;
        }
        let file = path.file_name().unwrap().to_str().unwrap().to_string();
        let policy = Policy::load_with_env(&path, no_env())
            .unwrap_or_else(|e| panic!("{file} does not compile: {e}"));
        assert_eq!(policy.file, path.display().to_string());
        assert_eq!(policy.hash.len(), 16);
        let Some((_, check)) = expectations.iter().find(|(f, _)| *f == file) else {
            panic!("{file} is shipped but not checked here; add what it claims to this test");
        };
        check(&policy);
        seen.push(file);
    }
    seen.sort();
    assert_eq!(
        seen,
        vec![
            "default.toml",
            "ebbinghaus.toml",
            "facts-change.toml",
            "generative-agents.toml",
            "keep-everything.toml"
        ]
    );
}

#[test]
fn an_empty_file_is_designs_default() {
    let p = Policy::from_toml("<inline>", "").unwrap();
    assert_eq!(p.name, "default");
    assert_eq!(p.hash, Policy::default_policy().hash);
    let s = &p.scoring;
    assert_eq!(
        (s.relevance, s.recency, s.importance, s.utility),
        (1.0, 0.5, 0.5, 0.5)
    );
    assert_eq!(s.strength, 0.0);
    assert_eq!(s.recency_half_life, Some(Duration::from_secs(3 * D)));
    assert_eq!(s.fusion, Fusion::Weighted);
    assert_eq!(s.mmr_lambda, 1.0);
    assert_eq!(s.reinforce_on_recall, 0.05);
    assert_eq!(p.evaluation.mode, EvaluationMode::Rules);
    assert_eq!(p.evaluation.default_importance, 3.0);
    assert_eq!(p.evaluation.rules.len(), 2);
    assert_eq!(p.evaluation.rules[0].kinds, vec!["goal"]);
    assert_eq!(p.evaluation.rules[0].importance, 9.0);
    assert_eq!(
        p.evaluation.rules[1].matches.as_ref().map(|r| r.as_str()),
        Some("(?i)error|failed|exception")
    );
    let c = &p.condensation;
    assert_eq!(c.mode, CondensationMode::Extractive);
    assert_eq!((c.every_events, c.min_events), (50, 5));
    assert_eq!(c.max_age, Some(Duration::from_secs(H)));
    let f = &p.forgetting;
    assert_eq!(f.curve, Curve::HalfLife);
    assert_eq!(f.half_life, Some(Duration::from_secs(30 * D)));
    assert_eq!(f.archive_below, 0.05);
    assert_eq!(f.purge_archived_after, Some(Duration::from_secs(180 * D)));
    assert_eq!(f.protect_kinds, vec!["goal"]);
    assert_eq!(f.interval, Some(Duration::from_secs(H)));
    let pr = &p.promotion;
    assert_eq!((pr.min_importance, pr.min_utility), (6.0, 0.6));
    assert_eq!((pr.min_successes, pr.merge_similarity), (1, 0.9));
}

#[test]
fn unknown_fields_are_named_with_their_key_and_the_valid_ones() {
    let issues = errors("nmae = \"x\"\n[scoring]\nrecencyy = 0.2\n");
    assert_issue(
        &issues,
        "nmae",
        &["unknown field `nmae`", "`name`", "`scoring`"],
    );
    assert_issue(
        &issues,
        "scoring.recencyy",
        &[
            "unknown field `recencyy`",
            "`recency`",
            "`recency_half_life`",
        ],
    );
    let issues = errors("[[evaluation.rules]]\nkind = [\"goal\"]\nimportance = 9\n");
    assert_issue(
        &issues,
        "evaluation.rules[0].kind",
        &["unknown field `kind`", "`kinds`", "`matches`"],
    );
    let issues = errors("[memory]\nx = 1\n");
    assert_issue(
        &issues,
        "memory",
        &["unknown field `memory`", "`forgetting`"],
    );
    // Key case matters: TOML keys are case-sensitive and so is the schema.
    let issues = errors("[Scoring]\nrecency = 0.2\n");
    assert_issue(&issues, "Scoring", &["unknown field `Scoring`"]);
}

#[test]
fn bad_durations_say_the_accepted_forms() {
    let issues = errors(
        "[scoring]\nrecency_half_life = \"3x\"\n[forgetting]\nhalf_life = \"0s\"\n\
         stability = \"never\"\ninterval = 5\n",
    );
    for key in ["scoring.recency_half_life", "forgetting.interval"] {
        assert_issue(
            &issues,
            key,
            &["not a duration", "\"90s\"", "\"1h\"", "\"3d\"", "\"never\""],
        );
    }
    assert_issue(&issues, "scoring.recency_half_life", &["`3x`"]);
    assert_issue(
        &issues,
        "forgetting.half_life",
        &["zero", "positive duration"],
    );
    assert_issue(&issues, "forgetting.stability", &["cannot be \"never\""]);
    assert_eq!(issues.len(), 4, "{issues:#?}");
}

#[test]
fn bad_regexes_show_the_regex_error() {
    let issues = errors("[[evaluation.rules]]\nmatches = \"(unclosed\"\nimportance = 5\n");
    assert_issue(
        &issues,
        "evaluation.rules[0].matches",
        &["`(unclosed` is not a valid regex", "unclosed group"],
    );
}

#[test]
fn out_of_range_values_say_the_range() {
    let issues = errors(
        "[scoring]\nrelevance = -1\nrecency = 11\nmmr_lambda = 1.5\nutility = nan\n\
         [evaluation]\ndefault_importance = 12\n[[evaluation.rules]]\nimportance = 10.5\n\
         [forgetting]\narchive_below = 1.0\n[promotion]\nmin_utility = 2\n\
         [condensation]\nevery_events = 0\n",
    );
    assert_issue(
        &issues,
        "scoring.relevance",
        &["-1 is out of range", "from 0 to 10"],
    );
    assert_issue(&issues, "scoring.recency", &["11 is out of range"]);
    assert_issue(&issues, "scoring.mmr_lambda", &["1.5", "from 0 to 1"]);
    assert_issue(&issues, "scoring.utility", &["NaN", "from 0 to 10"]);
    assert_issue(
        &issues,
        "evaluation.default_importance",
        &["12", "from 0 to 10"],
    );
    assert_issue(
        &issues,
        "evaluation.rules[0].importance",
        &["10.5", "from 0 to 10"],
    );
    assert_issue(&issues, "forgetting.archive_below", &["not including 1"]);
    assert_issue(&issues, "promotion.min_utility", &["from 0 to 1"]);
    assert_issue(
        &issues,
        "condensation.every_events",
        &["whole number from 1"],
    );
    assert_eq!(issues.len(), 9, "{issues:#?}");
}

#[test]
fn bad_enum_values_list_the_choices() {
    let issues = errors(
        "[scoring]\nfusion = \"sum\"\nrecency_basis = \"access\"\n[evaluation]\nmode = \"gpt\"\n\
         [condensation]\nmode = \"abstractive\"\n[forgetting]\ncurve = \"power\"\n",
    );
    assert_issue(
        &issues,
        "scoring.fusion",
        &["`sum`", "\"rrf\" or \"weighted\""],
    );
    assert_issue(
        &issues,
        "scoring.recency_basis",
        &["\"event\" or \"last_access\""],
    );
    assert_issue(
        &issues,
        "evaluation.mode",
        &["`gpt`", "\"rules\" or \"llm\" or \"hybrid\""],
    );
    assert_issue(&issues, "condensation.mode", &["\"extractive\" or \"llm\""]);
    assert_issue(
        &issues,
        "forgetting.curve",
        &["\"half_life\" or \"ebbinghaus\""],
    );
}

#[test]
fn wrong_types_kinds_and_cross_field_rules_are_reported() {
    let issues = errors(
        "scoring = 3\n[evaluation]\ndefault_importance = true\n[[evaluation.rules]]\n\
         kinds = []\n[[evaluation.rules]]\nkinds = [\"Goal\"]\nimportance = 1\n\
         [forgetting]\nprotect_kinds = [\"goal\", \"bad kind\"]\n\
         [condensation]\nevery_events = 5\nmin_events = 6\n[promotion]\nmin_successes = 1.5\n",
    );
    assert_issue(
        &issues,
        "scoring",
        &["is the number 3", "must be a table", "[scoring]"],
    );
    assert_issue(
        &issues,
        "evaluation.default_importance",
        &["boolean", "a number"],
    );
    assert_issue(
        &issues,
        "evaluation.rules[0].kinds",
        &["is empty", "remove `kinds`"],
    );
    assert_issue(
        &issues,
        "evaluation.rules[0].importance",
        &["is missing", "0 to 10"],
    );
    assert_issue(
        &issues,
        "evaluation.rules[1].kinds[0]",
        &["`Goal` is not a valid kind"],
    );
    assert_issue(
        &issues,
        "forgetting.protect_kinds[1]",
        &["`bad kind`", "[a-z][a-z0-9_]"],
    );
    assert_issue(
        &issues,
        "condensation.min_events",
        &["more than", "every_events"],
    );
    assert_issue(&issues, "promotion.min_successes", &["1.5", "whole number"]);
}

#[test]
fn sections_and_lists_must_have_their_shape() {
    // serde alone would read `[]` as an all-default struct and `[0.1, 0.2]` positionally.
    let issues = errors(
        "evaluation = []\nscoring = [0.1, 0.2]\n[forgetting]\nprotect_kinds = \"goal\"\n\
         [[condensation]]\nmode = \"llm\"\n",
    );
    assert_issue(&issues, "evaluation", &["is an array", "must be a table"]);
    assert_issue(&issues, "scoring", &["is an array", "[scoring]"]);
    assert_issue(&issues, "condensation", &["is an array", "[condensation]"]);
    assert_issue(
        &issues,
        "forgetting.protect_kinds",
        &["expected a sequence", "[\"goal\"]"],
    );
    let issues = errors("[evaluation]\nrules = 3\n");
    assert_issue(&issues, "evaluation.rules", &["[[evaluation.rules]]"]);
    let issues = errors("[evaluation]\nrules = [1]\n");
    assert_issue(
        &issues,
        "evaluation.rules[0]",
        &["the number 1", "must be a table"],
    );
}

#[test]
fn all_weights_zero_is_an_error() {
    let issues = errors("[scoring]\nrelevance = 0\nrecency = 0\nimportance = 0\nutility = 0\n");
    assert_issue(&issues, "scoring", &["every weight is 0"]);
}

#[test]
fn several_errors_are_reported_together_in_key_order() {
    // Read errors (unknown field, wrong type) come back together...
    let issues =
        errors("colour = 1\n[scoring]\nrecency = \"high\"\nfoo = 1\n[promotion]\nbar = 2\n");
    let keys: Vec<&str> = issues.iter().map(|i| i.key.as_str()).collect();
    assert_eq!(
        keys,
        vec!["colour", "promotion.bar", "scoring.foo", "scoring.recency"]
    );
    assert_issue(&issues, "scoring.recency", &["\"high\"", "a number"]);
    // ...and so do compile errors, in key order.
    let issues = errors(
        "[scoring]\nfusion = \"x\"\nrecency_half_life = \"soon\"\n[forgetting]\narchive_below = 7\n",
    );
    let keys: Vec<&str> = issues.iter().map(|i| i.key.as_str()).collect();
    assert_eq!(
        keys,
        vec![
            "forgetting.archive_below",
            "scoring.fusion",
            "scoring.recency_half_life"
        ]
    );
    let shown = PolicyErrors(issues).to_string();
    assert!(shown.starts_with("policy has 3 errors"), "{shown}");
}

#[test]
fn toml_syntax_errors_and_missing_files_are_issues_too() {
    let issues = errors("[scoring\nrecency = 1\n");
    assert_issue(&issues, raw::FILE_KEY, &["not valid TOML"]);
    let missing = policies_dir().join("no-such-policy.toml");
    let PolicyErrors(issues) = Policy::load_with_env(&missing, no_env()).unwrap_err();
    assert_eq!(issues.len(), 1);
    assert_eq!(issues[0].file, missing.display().to_string());
    assert!(
        issues[0].reason.contains("cannot read the policy file"),
        "{:?}",
        issues[0]
    );
}

#[test]
fn environment_overrides_apply_and_are_named_in_errors() {
    let dir = tempfile::TempDir::new().unwrap();
    let path = dir.path().join("p.toml");
    std::fs::write(&path, "name = \"file\"\n[scoring]\nrecency = 0.5\n").unwrap();
    let p = Policy::load_with_env(
        &path,
        env(&[
            ("SHADOWBRAIN_POLICY__SCORING__RECENCY", "0.2"),
            ("SHADOWBRAIN_POLICY__SCORING__RECENCY_HALF_LIFE", "12h"),
            (
                "SHADOWBRAIN_POLICY__FORGETTING__PROTECT_KINDS",
                "goal,user_message",
            ),
            ("SHADOWBRAIN_POLICY__PROMOTION__MIN_SUCCESSES", "3"),
            ("SHADOWBRAIN_POLICY__NAME", "from-env"),
            // Not ours: a different prefix, and the --policy path variable itself.
            ("SHADOWBRAIN__SCORING__RECENCY", "9"),
            ("SHADOWBRAIN_POLICY", "/elsewhere.toml"),
        ]),
    )
    .unwrap();
    assert_eq!(p.name, "from-env");
    assert_eq!(p.scoring.recency, 0.2);
    assert_eq!(
        p.scoring.recency_half_life,
        Some(Duration::from_secs(12 * H))
    );
    assert_eq!(p.forgetting.protect_kinds, vec!["goal", "user_message"]);
    assert_eq!(p.promotion.min_successes, 3);
    // A single-item list is still a list.
    let p = Policy::load_with_env(
        &path,
        env(&[(
            "SHADOWBRAIN_POLICY__FORGETTING__PROTECT_KINDS",
            "user_message",
        )]),
    )
    .unwrap();
    assert_eq!(p.forgetting.protect_kinds, vec!["user_message"]);
    // Without overrides the file's values stand.
    let p = Policy::load_with_env(&path, no_env()).unwrap();
    assert_eq!((p.name.as_str(), p.scoring.recency), ("file", 0.5));

    let PolicyErrors(issues) = Policy::load_with_env(
        &path,
        env(&[
            ("SHADOWBRAIN_POLICY__SCORING__RECENCY", "lots"),
            ("SHADOWBRAIN_POLICY__SCORING__MMR_LAMBDA", "3"),
            ("SHADOWBRAIN_POLICY__SCORING__TYPO", "1"),
        ]),
    )
    .unwrap_err();
    let file = path.display().to_string();
    let find = |key: &str| {
        issues
            .iter()
            .find(|i| i.key == key)
            .unwrap_or_else(|| panic!("{key}: {issues:#?}"))
    };
    let typo = find("scoring.typo");
    assert_eq!(typo.file, file);
    assert!(typo.reason.contains("unknown field `typo`"), "{typo}");
    assert!(
        typo.reason.contains("SHADOWBRAIN_POLICY__SCORING__TYPO"),
        "{typo}"
    );
    let recency = find("scoring.recency");
    assert!(recency.reason.contains("\"lots\""), "{recency}");
    assert!(
        recency
            .reason
            .contains("SHADOWBRAIN_POLICY__SCORING__RECENCY"),
        "{recency}"
    );
    // Read errors and compile errors come back together.
    let mmr = find("scoring.mmr_lambda");
    assert!(mmr.reason.contains("from 0 to 1"), "{mmr}");
    assert!(
        mmr.reason
            .contains("SHADOWBRAIN_POLICY__SCORING__MMR_LAMBDA"),
        "{mmr}"
    );
    assert_eq!(issues.len(), 3, "{issues:#?}");
}

#[test]
fn the_process_environment_is_read_by_load() {
    // The only test that touches the process environment; the variable name is unique to it.
    let dir = tempfile::TempDir::new().unwrap();
    let path = dir.path().join("p.toml");
    std::fs::write(&path, "").unwrap();
    let var = "SHADOWBRAIN_POLICY__PROMOTION__MERGE_SIMILARITY";
    // SAFETY: no other test reads or writes this variable, and `load` reads the environment
    // only through `std::env::vars_os`, which is synchronised by the standard library.
    unsafe { std::env::set_var(var, "0.75") };
    let loaded = Policy::load(&path);
    unsafe { std::env::remove_var(var) };
    assert_eq!(loaded.unwrap().promotion.merge_similarity, 0.75);
}

#[test]
fn the_hash_follows_behaviour_not_formatting() {
    let a = Policy::from_toml(
        "a.toml",
        "[scoring]\nrecency = 0.5\nrecency_half_life = \"3d\"\n",
    )
    .unwrap();
    let b = Policy::from_toml(
        "b.toml",
        "# a comment\n\n[scoring]\n  recency_half_life = \"72h\"   # same as 3d\nrecency=0.50\n",
    )
    .unwrap();
    let renamed = Policy::from_toml("c.toml", "name = \"other\"").unwrap();
    let changed = Policy::from_toml("d.toml", "[scoring]\nrecency = 0.51\n").unwrap();
    let rule_changed = Policy::from_toml(
        "e.toml",
        "[[evaluation.rules]]\nkinds = [\"goal\"]\nimportance = 8\n",
    )
    .unwrap();
    let default = Policy::default_policy();
    assert_eq!(a.hash, b.hash);
    assert_eq!(
        a.hash, default.hash,
        "explicit defaults hash like omitted ones"
    );
    assert_eq!(renamed.hash, default.hash, "the name is not behaviour");
    assert_ne!(changed.hash, default.hash);
    assert_ne!(rule_changed.hash, default.hash);
    assert!(default.hash.bytes().all(|b| b.is_ascii_hexdigit()) && default.hash.len() == 16);
    assert_eq!(
        renamed.stamp(),
        crate::model::PolicyStamp {
            name: "other".into(),
            hash: default.hash.clone()
        }
    );
}

#[test]
fn to_json_round_trips_through_toml() {
    for entry in std::fs::read_dir(policies_dir()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("toml") {
            continue;
        }
        let p = Policy::load_with_env(&path, no_env()).unwrap();
        let json = p.to_json();
        assert_eq!(json["name"], p.name.as_str());
        let toml_text = toml_from_json(&json);
        let again = Policy::from_toml("<json>", &toml_text)
            .unwrap_or_else(|e| panic!("{}: {e}\n{toml_text}", path.display()));
        assert_eq!(again.hash, p.hash, "{}", path.display());
        assert_eq!(again.name, p.name);
    }
    let d = Policy::default_policy().to_json();
    assert_eq!(d["scoring"]["recency_half_life"], "3days");
    assert_eq!(
        d["forgetting"]["protect_kinds"],
        serde_json::json!(["goal"])
    );
}

/// Minimal JSON -> TOML for the round-trip test (tables of scalars, arrays, rule arrays).
fn toml_from_json(v: &serde_json::Value) -> String {
    fn scalar(v: &serde_json::Value) -> String {
        match v {
            serde_json::Value::Array(items) => {
                let parts: Vec<String> = items.iter().map(scalar).collect();
                format!("[{}]", parts.join(", "))
            }
            other => other.to_string(),
        }
    }
    let obj = v.as_object().unwrap();
    let mut out = format!("name = {}\n", obj["name"]);
    for (section, table) in obj {
        let Some(table) = table.as_object() else {
            continue;
        };
        out.push_str(&format!("[{section}]\n"));
        for (k, v) in table {
            if k != "rules" {
                out.push_str(&format!("{k} = {}\n", scalar(v)));
            }
        }
        if let Some(rules) = table.get("rules").and_then(|r| r.as_array()) {
            if rules.is_empty() {
                out.push_str("rules = []\n");
            }
            for rule in rules {
                out.push_str(&format!("[[{section}.rules]]\n"));
                for (k, v) in rule.as_object().unwrap() {
                    out.push_str(&format!("{k} = {}\n", scalar(v)));
                }
            }
        }
    }
    out
}

#[test]
fn prompt_overrides_are_checked_hashed_and_shown() {
    let default = Policy::default_policy();
    assert_eq!(default.evaluation.prompt, None);
    assert!(
        default.to_json()["evaluation"].get("prompt").is_none(),
        "no override, no key: existing policies keep their hash"
    );
    let p = Policy::from_toml(
        "p.toml",
        "[evaluation]\nmode = \"llm\"\nprompt = \"  Rate customer complaints 9.  \"\n\
         [condensation]\nprompt = \"Write lessons.\"\n",
    )
    .unwrap();
    assert_eq!(
        p.evaluation.prompt.as_deref(),
        Some("Rate customer complaints 9.")
    );
    assert_eq!(p.condensation.prompt.as_deref(), Some("Write lessons."));
    assert_eq!(
        p.to_json()["evaluation"]["prompt"],
        "Rate customer complaints 9."
    );
    let other = Policy::from_toml(
        "q.toml",
        "[evaluation]\nmode = \"llm\"\nprompt = \"Rate everything 1.\"\n\
         [condensation]\nprompt = \"Write lessons.\"\n",
    )
    .unwrap();
    assert_ne!(p.hash, other.hash, "the prompt is behaviour");
    let again = Policy::from_toml("<json>", &toml_from_json(&p.to_json())).unwrap();
    assert_eq!(again.hash, p.hash);

    let huge = format!("[condensation]\nprompt = \"{}\"\n", "x".repeat(9000));
    let issues = errors(&format!("[evaluation]\nprompt = \"   \"\n{huge}"));
    assert_issue(&issues, "evaluation.prompt", &["blank", "built-in"]);
    assert_issue(&issues, "condensation.prompt", &["9000 bytes", "8192"]);
}

/// docs/policy.md is the contract policy files are read by: every key a file may hold (the
/// fields of [`RawPolicy`], each section's) must be named there, so a key added to the
/// code without its documentation fails here.
#[test]
fn the_policy_contract_names_every_key() {
    let doc_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/policy.md");
    let doc = std::fs::read_to_string(&doc_path).unwrap();
    let raw = serde_json::to_value(RawPolicy {
        evaluation: RawEvaluation {
            rules: Some(vec![RawRule::default()]),
            ..RawEvaluation::default()
        },
        ..RawPolicy::default()
    })
    .unwrap();
    let mut keys = Vec::new();
    for (section, value) in raw.as_object().unwrap() {
        match value.as_object() {
            Some(fields) => {
                assert!(
                    doc.contains(&format!("`[{section}]`")),
                    "docs/policy.md does not name the section [{section}]"
                );
                for (key, inner) in fields {
                    keys.push(key.clone());
                    // The rules' own keys.
                    if let Some(rule) = inner.as_array().and_then(|a| a.first()) {
                        keys.extend(rule.as_object().unwrap().keys().cloned());
                    }
                }
            }
            None => keys.push(section.clone()),
        }
    }
    assert!(keys.len() > 40, "{keys:?}");
    let missing: Vec<&String> = keys
        .iter()
        .filter(|k| !doc.contains(&format!("`{k}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/policy.md does not name these policy keys: {missing:?}"
    );
}
