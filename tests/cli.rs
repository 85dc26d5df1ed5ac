//! The binary, run as a user would: `record`, `recall`, `timeline`, `inspect`, `policy
//! check`, `export` / `import` and `reindex`, their happy paths and their main errors, and
//! the polite refusal of a data directory a running server holds.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::Arc;

use serde_json::{Value, json};
use shadowbrain::embed::HashEmbedder;
use shadowbrain::{
    FeedbackTarget, NewMemory, Outcome, Promotion, RecallRequest, Scope, Substrate,
    SubstrateOptions,
};

use crate::common::http::post;
use crate::common::serve;

#[tokio::test]
async fn reindex_moves_a_store_to_another_dimension() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let sub = Substrate::open(&data, SubstrateOptions::default()).unwrap();
    let id = sub
        .record(
            "default",
            "s",
            vec![NewMemory::new(
                "observation",
                "the nightly backup job timed out",
            )],
        )
        .await
        .unwrap()[0];
    sub.close().unwrap();
    drop(sub);

    let small = || SubstrateOptions {
        embedder: Arc::new(HashEmbedder::new(128).unwrap()),
        ..SubstrateOptions::default()
    };
    let err = Substrate::open(&data, small()).unwrap_err().to_string();
    assert!(err.contains("shadowbrain reindex"), "{err}");

    let config = dir.path().join("shadowbrain.toml");
    std::fs::write(&config, "[embedder]\nkind = \"hash\"\ndimensions = 128\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_shadowbrain"))
        .args(["reindex", "--data"])
        .arg(&data)
        .arg("--config")
        .arg(&config)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("reindexed 1 records") && stderr.contains("128 dimensions"),
        "{stderr}"
    );

    let sub = Substrate::open(&data, small()).unwrap();
    let mut req = RecallRequest::new("default", "elsewhere", "backup job timed out");
    req.scope = Scope::Namespace;
    let res = sub.recall(&req).await.unwrap();
    assert_eq!(res.memories.first().map(|m| m.record.id), Some(id));
    assert_eq!(
        sub.store()
            .get(id)
            .unwrap()
            .unwrap()
            .embedding
            .unwrap()
            .len(),
        128
    );
    sub.close().unwrap();
}

#[test]
fn reindex_of_a_missing_directory_fails_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope");
    let err = fails(sb(&["reindex"], &missing));
    assert!(err.contains("no shadowbrain data directory"), "{err}");
    assert!(!missing.exists(), "reindex must not create a directory");
    // A backend clap does not know is a usage error, before any directory is looked at.
    let bad = sb(&["reindex", "--backend", "nope"], &missing);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("use `lmdb` or `sled`"));
}

/// Runs the binary with `args`, with no `SHADOWBRAIN_*` settings from the environment.
fn sb(args: &[&str], data: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_shadowbrain"))
        .args(args)
        .arg("--data")
        .arg(data)
        .env_remove("SHADOWBRAIN_DATA")
        .env_remove("RUST_LOG")
        .output()
        .unwrap()
}

/// Stdout of a run that must succeed.
fn ok(out: Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Stderr of a run that must succeed (where summaries go).
fn ok_said(out: Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    stderr
}

/// Stderr of a run that must fail cleanly: exit code 1 (not a panic's 101, not clap's 2).
fn fails(out: Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}\n{stderr}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    stderr
}

#[test]
fn record_recall_timeline_and_inspect_work_on_a_data_directory() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let goal = ok(sb(
        &[
            "record",
            "--session",
            "s1",
            "--kind",
            "goal",
            "--text",
            "ship the quarterly report",
        ],
        &data,
    ));
    let backup = ok(sb(
        &[
            "record",
            "--session",
            "s1",
            "--kind",
            "observation",
            "--text",
            "the nightly backup job timed out",
            "--agent",
            "ops-bot",
            "--importance",
            "8",
            "--metadata",
            r#"{"host":"db1"}"#,
        ],
        &data,
    ));
    let grep = ok(sb(
        &[
            "record",
            "--session",
            "s1",
            "--kind",
            "action",
            "--content",
            r#"{"tool":"grep","args":["-r","TODO"]}"#,
        ],
        &data,
    ));
    let ids: Vec<&str> = [&goal, &backup, &grep].iter().map(|s| s.trim()).collect();
    assert!(ids.iter().all(|id| id.starts_with("mem-")), "{ids:?}");
    assert_eq!(ids, ["mem-00000000", "mem-00000001", "mem-00000002"]);

    let recall = ok(sb(
        &["recall", "--session", "s1", "why did the backup time out?"],
        &data,
    ));
    let first = recall.lines().nth(1).unwrap_or_default();
    assert!(
        first.contains(ids[1]) && first.contains("relevance"),
        "{recall}"
    );
    assert!(
        recall.contains("context:\nRelevant memories")
            && recall.contains("observation: the nightly backup job timed out"),
        "{recall}"
    );

    let answer: Value = serde_json::from_str(&ok(sb(
        &[
            "recall",
            "--session",
            "s1",
            "--k",
            "2",
            "--json",
            "grep TODO",
        ],
        &data,
    )))
    .unwrap();
    assert_eq!(
        answer["memories"].as_array().map(Vec::len),
        Some(2),
        "{answer}"
    );
    assert_eq!(answer["memories"][0]["id"], ids[2], "{answer}");
    assert!(
        answer["memories"][0]["why"]["relevance"].is_number(),
        "{answer}"
    );
    assert!(answer["memories"][0].get("embedding").is_none(), "{answer}");
    assert!(answer["recall_id"].is_string() && answer["context"].is_string());

    // Other namespaces see nothing of `default`.
    let elsewhere = ok(sb(
        &[
            "recall",
            "--session",
            "s1",
            "--namespace",
            "acme",
            "--json",
            "backup",
        ],
        &data,
    ));
    let elsewhere: Value = serde_json::from_str(&elsewhere).unwrap();
    assert_eq!(elsewhere["memories"], json!([]), "{elsewhere}");

    let timeline = ok(sb(&["timeline", "--session", "s1", "--limit", "2"], &data));
    let order: Vec<&str> = timeline
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(order, [ids[2], ids[1]], "{timeline}");
    let items: Value =
        serde_json::from_str(&ok(sb(&["timeline", "--session", "s1", "--json"], &data))).unwrap();
    assert_eq!(items["items"].as_array().map(Vec::len), Some(3), "{items}");

    let inspect = ok(sb(&["inspect", ids[1]], &data));
    for needle in [
        "agent_id: ops-bot",
        "importance: 8.0",
        r#"metadata: {"host":"db1"}"#,
        "embedding: 384 dimensions",
        "created        by ops-bot",
        "importance 8 (client)",
        "reinforced",
    ] {
        assert!(inspect.contains(needle), "`{needle}` missing:\n{inspect}");
    }
    let inspected: Value =
        serde_json::from_str(&ok(sb(&["inspect", "--json", ids[2]], &data))).unwrap();
    assert_eq!(
        inspected["memory"]["content"]["tool"], "grep",
        "{inspected}"
    );
    assert_eq!(inspected["history"][0]["action"], "created", "{inspected}");

    // Errors say what was wrong and how to fix it, and exit 1.
    let bad_kind = fails(sb(
        &[
            "record",
            "--session",
            "s1",
            "--kind",
            "Bad Kind",
            "--text",
            "x",
        ],
        &data,
    ));
    assert!(bad_kind.contains("[a-z][a-z0-9_]"), "{bad_kind}");
    let bad_session = fails(sb(
        &[
            "record",
            "--session",
            "a/b",
            "--kind",
            "goal",
            "--text",
            "x",
        ],
        &data,
    ));
    assert!(bad_session.contains("A-Z a-z 0-9"), "{bad_session}");
    let bad_k = fails(sb(
        &["recall", "--session", "s1", "--k", "0", "backup"],
        &data,
    ));
    assert!(bad_k.contains("1 to 200"), "{bad_k}");
    let no_agent = fails(sb(
        &["recall", "--session", "s1", "--scope", "agent", "backup"],
        &data,
    ));
    assert!(no_agent.contains("agent_id"), "{no_agent}");
    let unknown = fails(sb(&["inspect", "mem-000000ff"], &data));
    assert!(unknown.contains("`mem-000000ff` not found"), "{unknown}");
    let other_ns = fails(sb(&["inspect", "--namespace", "acme", ids[0]], &data));
    assert!(other_ns.contains("not found"), "{other_ns}");
    let not_an_id = fails(sb(&["inspect", "42"], &data));
    assert!(not_an_id.contains("mem-0000002a"), "{not_an_id}");
    let missing = fails(sb(
        &["timeline", "--session", "s1"],
        &dir.path().join("nope"),
    ));
    assert!(
        missing.contains("no shadowbrain data directory"),
        "{missing}"
    );
    assert!(
        !dir.path().join("nope").exists(),
        "a read must not create a directory"
    );
    // Malformed JSON is a usage error (clap's exit code 2), with the fix.
    let bad_json = sb(
        &[
            "record",
            "--session",
            "s1",
            "--kind",
            "action",
            "--content",
            "{tool",
        ],
        &data,
    );
    assert_eq!(bad_json.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad_json.stderr).contains("quote it for the shell"));

    // None of the failed writes wrote anything.
    let items: Value =
        serde_json::from_str(&ok(sb(&["timeline", "--session", "s1", "--json"], &data))).unwrap();
    assert_eq!(items["items"].as_array().map(Vec::len), Some(3), "{items}");
}

#[test]
fn policy_check_prints_the_compiled_policy_or_every_error() {
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_shadowbrain"))
            .args(args)
            .output()
            .unwrap()
    };
    let file = dir.path().join("tuned.toml");
    std::fs::write(
        &file,
        "name = \"tuned\"\n[scoring]\nrecency = 0.2\nrecency_half_life = \"72h\"\n\
         [[evaluation.rules]]\nkinds = [\"observation\"]\nmatches = '(?i)error|\"failed\"'\n\
         importance = 7\n",
    )
    .unwrap();
    let file = file.to_str().unwrap();
    let toml = ok(run(&["policy", "check", file]));
    let json: Value = serde_json::from_str(&ok(run(&["policy", "check", "--json", file]))).unwrap();
    let hash = json["hash"].as_str().unwrap().to_string();
    assert_eq!(json["name"], "tuned");
    assert_eq!(
        json["policy"]["scoring"]["recency_half_life"], "3days",
        "{json}"
    );
    assert!(
        toml.contains(&format!("policy `tuned`, hash {hash}")),
        "{toml}"
    );
    assert!(
        toml.contains("[[evaluation.rules]]") && toml.contains("[forgetting]"),
        "{toml}"
    );
    // The resolved text is a complete policy file that compiles to the same policy.
    let resolved = dir.path().join("resolved.toml");
    std::fs::write(&resolved, &toml).unwrap();
    let again: Value = serde_json::from_str(&ok(run(&[
        "policy",
        "check",
        "--json",
        resolved.to_str().unwrap(),
    ])))
    .unwrap();
    assert_eq!(again, json);

    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "surprise = 1\n[scoring]\nrecency_half_life = \"3 fortnights\"\n\
         [forgetting]\narchive_below = 2\n",
    )
    .unwrap();
    let errors = fails(run(&["policy", "check", bad.to_str().unwrap()]));
    assert!(errors.contains("policy has 3 errors"), "{errors}");
    for key in [
        "`surprise`",
        "`scoring.recency_half_life`",
        "`forgetting.archive_below`",
    ] {
        assert!(errors.contains(key), "{key} missing: {errors}");
    }
    assert!(
        errors.contains("e.g. \"90s\"") && errors.contains("from 0 to 1"),
        "{errors}"
    );
    let missing = fails(run(&["policy", "check", "no-such-policy.toml"]));
    assert!(missing.contains("cannot read the policy file"), "{missing}");
}

/// Writes a store with every tier and several statuses through the library: events in two
/// namespaces, a condensed record, the knowledge record it was promoted into (with its
/// `derived_from` edge), an archived event.
async fn varied_store(data: &Path) {
    let sub = Substrate::open(data, SubstrateOptions::default()).unwrap();
    let texts = [
        "the nightly backup job timed out at 02:00",
        "raised the backup timeout to four hours",
        "the backup finished in three hours",
        "disk usage on db1 is at 91 percent",
        "rotated the old backups to cold storage",
        "the user asked for a weekly backup report",
    ];
    let events = texts
        .iter()
        .map(|t| NewMemory {
            importance: Some(8.0),
            ..NewMemory::new("observation", *t)
        })
        .collect();
    let ids = sub.record("default", "s1", events).await.unwrap();
    sub.record(
        "acme",
        "s9",
        vec![NewMemory::new("goal", "win the acme contract")],
    )
    .await
    .unwrap();
    let condensed = sub
        .condense("default", "s1", "test")
        .await
        .unwrap()
        .unwrap();
    for _ in 0..2 {
        sub.feedback(
            "default",
            &FeedbackTarget::Memories(vec![condensed.id]),
            Outcome::Success,
            "test",
        )
        .await
        .unwrap();
    }
    let promotion = sub.promote("default", condensed.id, "test").await.unwrap();
    assert!(
        matches!(promotion, Promotion::Created { .. }),
        "{promotion:?}"
    );
    sub.archive("default", ids[3], "test").unwrap();
    sub.close().unwrap();
}

#[tokio::test]
async fn export_import_export_is_byte_identical_and_recall_finds_imported_records() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    varied_store(&a).await;
    let first = dir.path().join("first.jsonl");
    let said = sb(&["export", "-o", first.to_str().unwrap()], &a);
    let stderr = String::from_utf8_lossy(&said.stderr).into_owned();
    ok(said);
    assert!(
        stderr.contains("exported 9 records, 0 purged, 0 quarantined and 0 recalls"),
        "{stderr}"
    );
    // Not a terminal: progress is a plain line now and then, without control characters.
    assert!(
        !stderr.contains('\r') && !stderr.contains("\u{1b}["),
        "{stderr:?}"
    );
    assert!(
        stderr.lines().any(|l| l.starts_with("export [")),
        "{stderr}"
    );
    let text = std::fs::read_to_string(&first).unwrap();
    assert_eq!(text.lines().count(), 10);
    assert!(
        text.starts_with(
            r#"{"format":1,"header":{"dimension":384,"embedder":"hash","next_id":9,"next_recall":0}}"#
        ),
        "{text}"
    );
    for needle in [
        r#""tier":"episodic""#,
        r#""tier":"condensed""#,
        r#""tier":"knowledge""#,
        r#""status":"archived""#,
        r#""namespace":"acme""#,
        r#""relation":"derived_from""#,
        r#""promoted_into":"mem-"#,
        r#""action":"condensed_into""#,
        r#""embedding":[0."#,
    ] {
        assert!(text.contains(needle), "{needle} missing from the export");
    }
    // Stdout is the default, for pipes.
    assert_eq!(ok(sb(&["export"], &a)), text);
    let acme = ok(sb(&["export", "--namespace", "acme"], &a));
    assert_eq!(acme.lines().count(), 2, "{acme}");
    assert!(
        acme.contains(r#""namespace":"acme","next_id":9,"next_recall":0}}"#),
        "{acme}"
    );

    let imported = ok_said(sb(&["import", first.to_str().unwrap()], &b));
    assert!(
        imported.contains("9 lines imported, 0 already present"),
        "{imported}"
    );
    let second = dir.path().join("second.jsonl");
    ok(sb(&["export", "--output", second.to_str().unwrap()], &b));
    assert!(
        std::fs::read(&first).unwrap() == std::fs::read(&second).unwrap(),
        "export -> import -> export changed the file"
    );
    let again = ok_said(sb(&["import", first.to_str().unwrap()], &b));
    assert!(
        again.contains("0 lines imported, 9 already present"),
        "{again}"
    );
    // The condenser does not condense the imported events again: the watermark came along.
    {
        let sub = Substrate::open(&b, SubstrateOptions::default()).unwrap();
        assert!(
            sub.condense("default", "s1", "test")
                .await
                .unwrap()
                .is_none(),
            "imported events were condensed a second time"
        );
        sub.close().unwrap();
    }

    // A newer state of a record already there is reported, not overwritten, and exits 1.
    let mut changed: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    changed[1]["record"]["strength"] = json!(0.25);
    let newer = dir.path().join("newer.jsonl");
    let changed_text: String = changed.iter().map(|v| format!("{v}\n")).collect();
    std::fs::write(&newer, changed_text).unwrap();
    let err = fails(sb(&["import", newer.to_str().unwrap()], &b));
    assert!(
        err.contains("0 lines imported, 8 already present and skipped, 1 present but different")
            && err.contains("present but different: 1 (mem-00000000)"),
        "{err}"
    );
    assert!(
        std::fs::read(&first).unwrap() == ok(sb(&["export"], &b)).into_bytes(),
        "import overwrote a record"
    );

    // The imported records are indexed: recall finds them, by keyword and vector alike,
    // and still leaves the archived one out.
    let answer: Value = serde_json::from_str(&ok(sb(
        &[
            "recall",
            "--session",
            "s1",
            "--json",
            "--k",
            "20",
            "backup timed out",
        ],
        &b,
    )))
    .unwrap();
    let texts: Vec<&str> = answer["memories"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["text"].as_str())
        .collect();
    assert_eq!(
        answer["memories"][0]["text"],
        "the nightly backup job timed out at 02:00"
    );
    assert!(!texts.iter().any(|t| t.contains("disk usage")), "{texts:?}");
    let tiers: Vec<&str> = answer["memories"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["tier"].as_str())
        .collect();
    assert!(
        tiers.contains(&"condensed") && tiers.contains(&"knowledge"),
        "{tiers:?}"
    );
    let acme: Value = serde_json::from_str(&ok(sb(
        &[
            "recall",
            "--namespace",
            "acme",
            "--session",
            "s9",
            "--json",
            "contract",
        ],
        &b,
    )))
    .unwrap();
    assert_eq!(
        acme["memories"][0]["text"], "win the acme contract",
        "{acme}"
    );
    // New records get ids after the imported ones.
    let fresh = ok(sb(
        &[
            "record",
            "--session",
            "s2",
            "--kind",
            "goal",
            "--text",
            "later",
        ],
        &b,
    ));
    assert!(fresh.trim() > "mem-00000008", "{fresh}");
}

#[tokio::test]
async fn a_bad_line_stops_the_import_naming_it_and_keeps_the_lines_before() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    varied_store(&a).await;
    let text = ok(sb(&["export"], &a));
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    // Line 1 is the header; line 4 holds the third record.
    let good_third = lines[3].clone();
    lines[3] = lines[3].replacen(r#""importance":8.0"#, r#""importance":80.0"#, 1);
    assert_ne!(
        lines[3], good_third,
        "the fixture changed: no importance to break"
    );
    let file = dir.path().join("bad.jsonl");
    std::fs::write(&file, lines.join("\n") + "\n").unwrap();

    let err = fails(sb(&["import", file.to_str().unwrap()], &b));
    assert!(err.contains("line 4 of"), "{err}");
    assert!(
        err.contains("record.importance: 80 is out of range"),
        "{err}"
    );
    assert!(
        err.contains("the 2 lines imported before it are durable")
            && err.contains("Fix or remove the line"),
        "{err}"
    );
    // Those two are durable and complete (the header is the source's: same ids reserved).
    let kept = ok(sb(&["export"], &b));
    assert_eq!(kept, lines[..3].join("\n") + "\n");

    // Not JSON at all: the line number again.
    lines[3] = "{\"format\":1,".into();
    std::fs::write(&file, lines.join("\n") + "\n").unwrap();
    let err = fails(sb(&["import", file.to_str().unwrap()], &b));
    assert!(
        err.contains("line 4 of") && err.contains("is not JSON"),
        "{err}"
    );
    assert!(
        err.contains("the 0 lines imported before it are durable")
            && err.contains("(2 already present"),
        "{err}"
    );

    // Fixed, the same import finishes; what was there is skipped, and the result is the
    // original export.
    lines[3] = good_third;
    std::fs::write(&file, lines.join("\n") + "\n").unwrap();
    let done = ok_said(sb(&["import", file.to_str().unwrap()], &b));
    assert!(
        done.contains("7 lines imported, 2 already present"),
        "{done}"
    );
    assert_eq!(ok(sb(&["export"], &b)), text);

    // A record of another store under an id this one uses is refused, not overwritten.
    let other = lines[1].replacen("the nightly backup", "a different", 1);
    std::fs::write(&file, format!("{}\n{other}\n", lines[0])).unwrap();
    let err = fails(sb(&["import", file.to_str().unwrap()], &b));
    assert!(
        err.contains("line 2 of") && err.contains("already used"),
        "{err}"
    );

    // The same record twice in one file.
    std::fs::write(
        &file,
        format!("{}\n{}\n\n{}\n", lines[0], lines[1], lines[1]),
    )
    .unwrap();
    let err = fails(sb(
        &["import", file.to_str().unwrap()],
        &dir.path().join("c"),
    ));
    assert!(
        err.contains("line 4 of") && err.contains("mem-00000000 is also on line 2"),
        "{err}"
    );

    // Another embedder's vectors are refused up front, pointing at reindex.
    let other_embedder = lines[0].replacen(
        r#""embedder":"hash""#,
        r#""embedder":"openai:text-embedding-3-small""#,
        1,
    );
    assert_ne!(other_embedder, lines[0]);
    std::fs::write(&file, format!("{other_embedder}\n{}\n", lines[1])).unwrap();
    let err = fails(sb(
        &["import", file.to_str().unwrap()],
        &dir.path().join("d"),
    ));
    assert!(
        err.contains("line 1 of")
            && err.contains("made by `openai:text-embedding-3-small`")
            && err.contains("shadowbrain reindex"),
        "{err}"
    );
    assert!(
        err.contains("the 0 lines imported before it are durable"),
        "{err}"
    );

    // An export without its header (none of this build's exports lacks one) is refused.
    std::fs::write(&file, format!("{}\n", lines[1])).unwrap();
    let err = fails(sb(
        &["import", file.to_str().unwrap()],
        &dir.path().join("e"),
    ));
    assert!(
        err.contains("line 1 of") && err.contains("header: is missing"),
        "{err}"
    );

    // The importing directory's [limits] apply, as for `record`.
    let config = dir.path().join("small.toml");
    std::fs::write(&config, "[limits]\ntext_bytes = 20\n").unwrap();
    let err = fails(sb(
        &[
            "import",
            "--config",
            config.to_str().unwrap(),
            &file_str(&text, dir.path()),
        ],
        &dir.path().join("f"),
    ));
    assert!(
        err.contains("line 2 of")
            && err.contains("record.text is too large")
            && err.contains("the limit is 20"),
        "{err}"
    );

    // A line cut from the middle of the file: the reference to it dangles, and import says
    // so (after importing the rest) with a non-zero exit.
    let knowledge = text
        .lines()
        .position(|l| l.contains(r#""tier":"knowledge""#))
        .unwrap();
    let without: String = text
        .lines()
        .enumerate()
        .filter(|(i, _)| *i != knowledge)
        .map(|(_, l)| format!("{l}\n"))
        .collect();
    std::fs::write(&file, without).unwrap();
    let err = fails(sb(
        &["import", file.to_str().unwrap()],
        &dir.path().join("g"),
    ));
    assert!(
        err.contains("8 lines imported")
            && err.contains("dangling references: 1 (mem-")
            && err.contains(".promoted_into → mem-"),
        "{err}"
    );
    let missing = fails(sb(&["import", "no-such-export.jsonl"], &b));
    assert!(
        missing.contains("opening no-such-export.jsonl"),
        "{missing}"
    );
}

/// Writes `text` to a file under `dir` and returns its path.
fn file_str(text: &str, dir: &Path) -> String {
    let path = dir.join("export-copy.jsonl");
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}

/// The keys of a JSON object, sorted.
fn keys(v: &Value) -> Vec<String> {
    let mut k: Vec<String> = v
        .as_object()
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default();
    k.sort();
    k
}

#[test]
fn a_data_directory_held_by_a_server_is_refused_politely() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = serve::new().data(&data).start();
    let addr = server.addr;
    let (status, answer) = post(
        addr,
        "/v1/sessions/s1/events",
        &json!({"kind": "observation", "text": "the nightly backup job timed out"}),
    );
    assert_eq!(status, 201, "{answer}");
    let (status, http_recall) = post(addr, "/v1/sessions/s1/recall", &json!({"query": "backup"}));
    assert_eq!(status, 200, "{http_recall}");

    let export = dir.path().join("x.jsonl");
    std::fs::write(&export, "").unwrap();
    let export = export.to_str().unwrap();
    let commands: [&[&str]; 7] = [
        &[
            "record",
            "--session",
            "s1",
            "--kind",
            "goal",
            "--text",
            "must not be written",
        ],
        &["recall", "--session", "s1", "backup"],
        &["timeline", "--session", "s1"],
        &["inspect", "mem-00000000"],
        &["export"],
        &["import", export],
        &["reindex"],
    ];
    for args in commands {
        let err = fails(sb(args, &data));
        assert!(
            err.contains(&format!(
                "the data directory {} is in use by another shadowbrain process (a running \
                 `shadowbrain serve`?); stop it, or talk to it over HTTP",
                data.display()
            )),
            "{args:?}: {err}"
        );
    }
    server.kill();

    // Nothing was touched: the one event sent over HTTP, and the refused `record` absent.
    let timeline: Value =
        serde_json::from_str(&ok(sb(&["timeline", "--session", "s1", "--json"], &data))).unwrap();
    let texts: Vec<&str> = timeline["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|i| i["text"].as_str())
        .collect();
    assert_eq!(texts, ["the nightly backup job timed out"]);

    // `recall --json` answers in the shape of the HTTP API's recall.
    let cli_recall: Value = serde_json::from_str(&ok(sb(
        &["recall", "--session", "s1", "--json", "backup"],
        &data,
    )))
    .unwrap();
    assert_eq!(keys(&cli_recall), keys(&http_recall));
    assert_eq!(
        keys(&cli_recall["memories"][0]),
        keys(&http_recall["memories"][0])
    );
    assert_eq!(
        keys(&cli_recall["memories"][0]["why"]),
        keys(&http_recall["memories"][0]["why"])
    );
    assert_eq!(
        cli_recall["memories"][0]["id"],
        http_recall["memories"][0]["id"]
    );
    assert_eq!(cli_recall["policy"], http_recall["policy"]);
}

#[tokio::test]
async fn waiting_queues_survive_export_and_import() {
    use shadowbrain::internals::Mutation;
    use shadowbrain::internals::{Queue, WriteSet};
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    let sub = Substrate::open(&a, SubstrateOptions::default()).unwrap();
    let ids = sub
        .record(
            "default",
            "s1",
            vec![
                NewMemory::new("goal", "waits for the judge"),
                NewMemory::new("goal", "waits for condensation"),
            ],
        )
        .await
        .unwrap();
    sub.store()
        .write(WriteSet(vec![
            Mutation::Enqueue(Queue::Evaluate, ids[0]),
            Mutation::Enqueue(Queue::Condense, ids[1]),
        ]))
        .unwrap();
    sub.close().unwrap();
    drop(sub);
    let text = ok(sb(&["export"], &a));
    assert!(text.contains(r#""waiting":["evaluate"]"#), "{text}");
    let file = file_str(&text, dir.path());
    ok_said(sb(&["import", &file], &b));
    let sub = Substrate::open(&b, SubstrateOptions::default()).unwrap();
    for (queue, id) in [(Queue::Evaluate, ids[0]), (Queue::Condense, ids[1])] {
        assert!(sub.store().is_queued(queue, id).unwrap(), "{queue:?} {id}");
    }
    assert!(!sub.store().is_queued(Queue::Evaluate, ids[1]).unwrap());
    sub.close().unwrap();
    drop(sub);
    assert_eq!(ok(sb(&["export"], &b)), text);
}

#[tokio::test]
async fn export_into_a_closed_pipe_or_a_directory() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let sub = Substrate::open(&data, SubstrateOptions::default()).unwrap();
    // Far more than a pipe buffers (each line carries a 384-dimension embedding).
    let events = (0..200)
        .map(|i| NewMemory::new("observation", format!("event number {i}")))
        .collect();
    sub.record("default", "s1", events).await.unwrap();
    sub.close().unwrap();
    drop(sub);

    // `export | head -1`: the reader stops early; export ends quietly, exit 0.
    let mut child = Command::new(env!("CARGO_BIN_EXE_shadowbrain"))
        .args(["export", "--data"])
        .arg(&data)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(first.contains(r#""header""#), "{first}");
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.to_lowercase().contains("broken pipe"), "{stderr}");

    // A directory as --output is refused before anything is written.
    let target = dir.path().join("exports");
    std::fs::create_dir(&target).unwrap();
    let err = fails(sb(&["export", "-o", target.to_str().unwrap()], &data));
    assert!(err.contains("is a directory; name a file"), "{err}");
    assert!(!dir.path().join("exports.partial").exists());
    // A path that cannot be written is refused, and leaves nothing behind.
    let blocked = dir.path().join("blocked");
    std::fs::create_dir(&blocked).unwrap();
    std::fs::write(blocked.join("x"), "").unwrap();
    let out_file = blocked.join("x").join("export.jsonl");
    let err = fails(sb(&["export", "-o", out_file.to_str().unwrap()], &data));
    assert!(err.contains("creating"), "{err}");
    assert_eq!(std::fs::read_dir(&blocked).unwrap().count(), 1);
}

#[test]
fn import_refuses_a_line_longer_than_64_mib() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("huge.jsonl");
    {
        let mut f = std::io::BufWriter::new(std::fs::File::create(&file).unwrap());
        let chunk = vec![b'x'; 1 << 20];
        for _ in 0..65 {
            f.write_all(&chunk).unwrap();
        }
    }
    let err = fails(sb(
        &["import", file.to_str().unwrap()],
        &dir.path().join("data"),
    ));
    assert!(
        err.contains("line 1 of") && err.contains("is over 64 MiB"),
        "{err}"
    );
}

#[test]
fn serve_opens_a_sled_directory_without_being_told() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let sub = Substrate::open(
        &data,
        SubstrateOptions {
            backend: shadowbrain::Backend::Sled,
            ..SubstrateOptions::default()
        },
    )
    .unwrap();
    sub.close().unwrap();
    drop(sub);
    let server = serve::new()
        .data(&data)
        .env_remove("SHADOWBRAIN_DATA")
        .start();
    let said = server.startup();
    server.kill();
    assert!(
        said.last().is_some_and(|l| l.contains("serving")),
        "{}",
        said.join("\n")
    );
}

#[test]
fn policy_check_writes_valid_toml_for_any_string() {
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_shadowbrain"))
            .args(args)
            .output()
            .unwrap()
    };
    let file = dir.path().join("del.toml");
    // U+007F must be escaped in TOML (JSON leaves it raw).
    std::fs::write(
        &file,
        "name = \"del\"\n[[evaluation.rules]]\nkinds = [\"observation\"]\n\
         matches = \"a\\u007Fb\"\nimportance = 7\n",
    )
    .unwrap();
    let toml = ok(run(&["policy", "check", file.to_str().unwrap()]));
    assert!(!toml.contains('\u{7f}'), "{toml:?}");
    let resolved = dir.path().join("resolved.toml");
    std::fs::write(&resolved, &toml).unwrap();
    let a: Value = serde_json::from_str(&ok(run(&[
        "policy",
        "check",
        "--json",
        file.to_str().unwrap(),
    ])))
    .unwrap();
    let b: Value = serde_json::from_str(&ok(run(&[
        "policy",
        "check",
        "--json",
        resolved.to_str().unwrap(),
    ])))
    .unwrap();
    assert_eq!(a, b);
}

#[test]
fn recall_and_timeline_limits_come_from_the_config_file() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    ok(sb(
        &["record", "--session", "s1", "--kind", "goal", "--text", "x"],
        &data,
    ));
    let config = dir.path().join("limits.toml");
    std::fs::write(
        &config,
        "[limits]\nmax_timeline = 5\nmax_token_budget = 100\nmax_k = 3\n",
    )
    .unwrap();
    let config = config.to_str().unwrap();
    let err = fails(sb(
        &[
            "timeline",
            "--session",
            "s1",
            "--limit",
            "10",
            "--config",
            config,
        ],
        &data,
    ));
    assert!(err.contains("ask for 1 to 5 records"), "{err}");
    let err = fails(sb(
        &[
            "recall",
            "--session",
            "s1",
            "--k",
            "1",
            "--token-budget",
            "200",
            "--config",
            config,
            "x",
        ],
        &data,
    ));
    assert!(err.contains("over the limit of 100"), "{err}");
    let err = fails(sb(
        &[
            "recall",
            "--session",
            "s1",
            "--k",
            "4",
            "--config",
            config,
            "x",
        ],
        &data,
    ));
    assert!(err.contains("ask for 1 to 3 memories"), "{err}");
    ok(sb(
        &[
            "timeline",
            "--session",
            "s1",
            "--limit",
            "5",
            "--config",
            config,
        ],
        &data,
    ));
    // Without the file, the defaults.
    ok(sb(&["timeline", "--session", "s1", "--limit", "10"], &data));
    let err = fails(sb(
        &[
            "record",
            "--session",
            "s1",
            "--kind",
            "goal",
            "--text",
            "x",
            "--importance",
            "NaN",
        ],
        &data,
    ));
    assert!(
        err.contains("--importance NaN is not a number from 0 to 10") && !err.contains("events[0]"),
        "{err}"
    );
}
