//! `shadowbrain simulate` through the binary: the same command twice gives the same report,
//! byte for byte, and the report tells the shipped policies apart in the expected direction.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

fn policies() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("policies")
}

/// Runs `simulate` with `args` into `out` and returns the parsed report.
fn simulate(out: &Path, policies_used: &[&str], args: &[&str]) -> Value {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_shadowbrain"));
    cmd.arg("simulate");
    for p in policies_used {
        cmd.arg("--policy")
            .arg(policies().join(format!("{p}.toml")));
    }
    let output = cmd.args(args).arg("--out").arg(out).output().unwrap();
    assert!(
        output.status.success(),
        "simulate failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&std::fs::read(out.join("report.json")).unwrap()).unwrap()
}

const SMALL: [&str; 10] = [
    "--agents",
    "2",
    "--sessions",
    "30",
    "--days",
    "20",
    "--events",
    "8",
    "--seed",
    "11",
];

#[test]
fn the_same_command_twice_writes_the_same_report() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    let mut args = SMALL.to_vec();
    args.push("--deterministic");
    simulate(&a, &["default", "ebbinghaus"], &args);
    simulate(&b, &["default", "ebbinghaus"], &args);
    for file in ["report.json", "report.md"] {
        assert_eq!(
            std::fs::read(a.join(file)).unwrap(),
            std::fs::read(b.join(file)).unwrap(),
            "{file} differs between two runs of the same command"
        );
    }
    // Without --deterministic the measured figures are there; everything else is the same.
    let c = dir.path().join("c");
    let measured = simulate(&c, &["default", "ebbinghaus"], &SMALL);
    let fixed: Value =
        serde_json::from_slice(&std::fs::read(a.join("report.json")).unwrap()).unwrap();
    for (m, f) in measured["policies"]
        .as_array()
        .unwrap()
        .iter()
        .zip(fixed["policies"].as_array().unwrap())
    {
        let mut m = m.clone();
        for key in ["wall_s", "peak_rss_mb", "recall_p50_ms", "recall_p99_ms"] {
            assert!(m[key].as_f64().is_some_and(|v| v > 0.0), "{key}: {m}");
            m[key] = Value::Null;
        }
        assert_eq!(&m, f);
    }
    let md = std::fs::read_to_string(a.join("report.md")).unwrap();
    assert!(
        md.contains("| default (`") && md.contains("| ebbinghaus (`"),
        "{md}"
    );
    // Every plot is there, titled, with both policies named.
    for (file, title) in [
        ("hit_rate.svg", "Probe hit rate"),
        ("store_size.svg", "Store size"),
        ("promotion.svg", "Promotion of recurring lessons"),
        ("superseded_errors.svg", "Superseded-fact errors"),
        ("recall_latency.svg", "Probe recall latency"),
    ] {
        let svg = std::fs::read_to_string(c.join(file)).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains(title), "{file}");
        assert!(
            svg.contains("default") && svg.contains("ebbinghaus"),
            "{file}"
        );
    }
}

#[test]
fn the_report_tells_the_policies_apart_in_the_expected_direction() {
    let dir = tempfile::tempdir().unwrap();
    let report = simulate(
        dir.path(),
        &["keep-everything", "ebbinghaus", "default"],
        &[
            "--agents",
            "3",
            "--sessions",
            "80",
            "--days",
            "45",
            "--events",
            "10",
            "--seed",
            "7",
            "--deterministic",
        ],
    );
    let by_name = |name: &str| -> Value {
        report["policies"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .cloned()
            .unwrap()
    };
    let (keep, ebb, default) = (
        by_name("keep-everything"),
        by_name("ebbinghaus"),
        by_name("default"),
    );
    let records = |p: &Value| p["store_records_final"].as_u64().unwrap();
    let rate = |p: &Value, path: &[&str]| {
        let mut v = p;
        for key in path {
            v = &v[*key];
        }
        v["rate"].as_f64().unwrap()
    };
    // Keep-everything keeps the most.
    assert!(
        records(&keep) >= records(&default) && records(&keep) > records(&ebb),
        "{report}"
    );
    assert_eq!(keep["archived_final"], 0);
    // Ebbinghaus forgets the trivia, and keeps what was recalled better than that.
    let trivia = |p: &Value| rate(p, &["trivia_retained"]);
    assert_eq!(trivia(&keep), 1.0);
    assert!(trivia(&ebb) < 0.2, "{ebb}");
    let reinforced = rate(&ebb, &["probe_hit_rate_at_k", "reinforced"]);
    assert!(reinforced > trivia(&ebb) + 0.3, "{ebb}");
    assert!(ebb["archived_final"].as_u64().unwrap() > 0);
    // Promotion admits the recurring good lessons and refuses the misleading ones.
    assert!(
        !default["promoted_good"].as_array().unwrap().is_empty(),
        "{default}"
    );
    assert_eq!(default["promoted_bad"], serde_json::json!([]), "{default}");
    assert_eq!(default["promotion_precision"], 1.0);
}
