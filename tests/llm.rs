//! The LLM judge and condenser end to end, through the actor runtime, against a
//! real OpenAI-compatible HTTP server this file starts on 127.0.0.1 and scripts: good JSON,
//! JSON in code fences, broken JSON, the wrong schema, 429 with Retry-After, 500, a hang
//! past the timeout, slow answers. What must hold: the model's scores and lessons when it
//! answers well, the rules' and the extractive text when it does not (with the reason in
//! the audit log), batching and reuse cutting calls, the token budget on the runtime clock,
//! and ingest acknowledging while the provider hangs.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use shadowbrain::VirtualClock;
use shadowbrain::llm::chat::ChatClient;
use shadowbrain::llm::condense::LlmCondenser;
use shadowbrain::llm::cost::Llm;
use shadowbrain::llm::judge::{JudgeOptions, LlmJudge};
use shadowbrain::llm::{LlmConfig, LlmKind};
use shadowbrain::policy::Policy;
use shadowbrain::{MemoryId, NewMemory};
use shadowbrain::{Runtime, RuntimeConfig};
use shadowbrain_test_support::{self as support, Reply};

/// How the scripted endpoint behaves.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    /// Correct JSON: notes score 1, anything mentioning an error 9; windows become a lesson.
    Good,
    /// The same JSON inside prose and a code fence.
    Fenced,
    /// Prose, no JSON.
    Broken,
    /// JSON of the wrong shape.
    WrongSchema,
    /// `429` with `Retry-After: 1` this many times, then good answers.
    RateLimited(usize),
    /// `500` every time.
    ServerError,
    /// Never answers.
    Hang,
    /// Good answers after this many milliseconds.
    Slow(u64),
}

/// The scripted endpoint (the shared one) and the state its script reads and records: the
/// mode a test may change, and the records numbered in each judge request's prompt.
struct Endpoint {
    server: support::Endpoint,
    mode: Arc<Mutex<Mode>>,
    batch_sizes: Arc<Mutex<Vec<usize>>>,
}

impl Endpoint {
    fn set(&self, mode: Mode) {
        *self.mode.lock().unwrap() = mode;
    }

    /// Chat requests received (every attempt).
    fn requests(&self) -> usize {
        self.server.requests()
    }

    /// Requests being answered right now.
    fn in_flight(&self) -> usize {
        self.server.in_flight()
    }

    /// The most requests ever answered at once.
    fn peak(&self) -> usize {
        self.server.max_in_flight()
    }

    /// Records numbered in each judge request's prompt.
    fn batch_sizes(&self) -> Vec<usize> {
        self.batch_sizes.lock().unwrap().clone()
    }
}

/// What the endpoint answers in `mode` (and counts) for one request.
fn chat(request: &support::Request, mode: &Mutex<Mode>, batch_sizes: &Mutex<Vec<usize>>) -> Reply {
    let condensing = request.body["response_format"]["json_schema"]["name"] == "condensed_memory"
        || request.system().contains("condense");
    let lines = request.numbered_records();
    if !condensing {
        batch_sizes.lock().unwrap().push(lines.len());
    }
    let mode = {
        let mut mode = mode.lock().unwrap();
        let now = *mode;
        if let Mode::RateLimited(n) = now {
            *mode = if n > 1 {
                Mode::RateLimited(n - 1)
            } else {
                Mode::Good
            };
        }
        now
    };
    let good = if condensing {
        json!({"kind": "lesson", "text": "When a deploy fails on a cold cache, warm the cache first.",
               "sources": [0]})
        .to_string()
    } else {
        support::verdicts(lines.iter().map(|l| {
            let importance = if l.contains("error") { 9.0 } else { 1.0 };
            (importance, 4, "scripted verdict".to_string())
        }))
    };
    let answer = |content: &str| Reply::chat(content, Some((100, 20)));
    match mode {
        Mode::Good => answer(&good),
        Mode::Fenced => answer(&format!(
            "Sure! Here is the JSON:\n```json\n{good}\n```\nHope it helps."
        )),
        Mode::Broken => answer("I would rate these as fairly important overall."),
        Mode::WrongSchema if condensing => {
            answer(&json!({"kind": "poem", "text": "roses", "sources": [0]}).to_string())
        }
        Mode::WrongSchema => {
            answer(&json!({"items": [{"index": 0, "importance": "very"}]}).to_string())
        }
        Mode::RateLimited(_) => {
            Reply::error_typed(429, "rate limited", "requests").with_header("retry-after", "1")
        }
        Mode::ServerError => Reply::error_typed(500, "the model crashed", "server"),
        Mode::Hang => Reply::after(Duration::from_secs(3600), answer(&good)),
        Mode::Slow(ms) => Reply::after(Duration::from_millis(ms), answer(&good)),
    }
}

/// Starts the endpoint in `mode`; returns its state and base URL.
async fn endpoint(mode: Mode) -> (Arc<Endpoint>, String) {
    let mode = Arc::new(Mutex::new(mode));
    let batch_sizes = Arc::new(Mutex::new(Vec::new()));
    let (m, b) = (mode.clone(), batch_sizes.clone());
    let server = support::Endpoint::start(move |request| chat(request, &m, &b)).await;
    let url = server.base_url();
    let ep = Endpoint {
        server,
        mode,
        batch_sizes,
    };
    (Arc::new(ep), url)
}

/// What a test changes about the LLM set-up.
struct Setup {
    timeout: &'static str,
    batch: usize,
    concurrency: usize,
    wait: Duration,
    options: JudgeOptions,
    tokens_per_hour: u64,
    policy: &'static str,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            timeout: "5s",
            batch: 16,
            concurrency: 1,
            wait: Duration::ZERO,
            options: JudgeOptions::default(),
            tokens_per_hour: 0,
            policy: "[evaluation]\nmode = \"llm\"\n\
                     [condensation]\nmode = \"llm\"\nmin_events = 2\nevery_events = 10000\n\
                     max_age = \"never\"\n",
        }
    }
}

/// A runtime whose judge and condenser ask `base_url`.
async fn runtime(
    dir: &tempfile::TempDir,
    base_url: &str,
    setup: Setup,
    clock: Option<Arc<VirtualClock>>,
) -> (Runtime, Arc<Llm>) {
    let cfg = LlmConfig {
        kind: LlmKind::Openai,
        base_url: Some(base_url.to_string()),
        model: Some("scripted".into()),
        api_key_env: "SHADOWBRAIN_TEST_NO_SUCH_KEY".into(),
        timeout: setup.timeout.into(),
        max_retries: 1,
        ..LlmConfig::default()
    };
    let client = ChatClient::new(&cfg)
        .unwrap()
        .with_backoff(Duration::from_millis(10), Duration::from_millis(50));
    let llm = Arc::new(Llm::new(Arc::new(client), setup.tokens_per_hour));
    let mut config = RuntimeConfig::new(dir.path());
    config.substrate.policy = Policy::from_toml("<test>", setup.policy).unwrap();
    if let Some(clock) = clock {
        config.substrate.clock = clock;
    }
    let options = JudgeOptions {
        batch_size: setup.batch,
        ..setup.options
    };
    config.judge = Some(Arc::new(LlmJudge::with_options(llm.clone(), options)));
    config.summarizer = Some(Arc::new(LlmCondenser::new(llm.clone())));
    config.llm = Some(llm.clone());
    config.evaluation_batch = setup.batch;
    config.evaluation_concurrency = setup.concurrency;
    config.evaluation_wait = setup.wait;
    (Runtime::open(config).await.unwrap(), llm)
}

/// Records a test's judge spares nothing: every distinct record reaches the endpoint.
fn spare_nothing() -> JudgeOptions {
    JudgeOptions {
        cache_entries: 0,
        reuse_similarity: None,
        ..JudgeOptions::default()
    }
}

/// An endpoint in `mode` and a runtime on the system clock judging against it (the
/// directory must outlive the runtime).
async fn start(mode: Mode, setup: Setup) -> (Arc<Endpoint>, tempfile::TempDir, Runtime, Arc<Llm>) {
    let (ep, url) = endpoint(mode).await;
    let dir = tempfile::tempdir().unwrap();
    let (rt, llm) = runtime(&dir, &url, setup, None).await;
    (ep, dir, rt, llm)
}

/// Every record's history, joined, for assertions on what was audited.
async fn audit(rt: &Runtime, id: MemoryId) -> String {
    let history = rt.memory("default", id).unwrap().history().await.unwrap();
    history
        .iter()
        .map(|e| format!("[{}] {}", e.by, e.detail))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Judges queued records until the queue is empty.
async fn judge_all(rt: &Runtime) {
    for _ in 0..100 {
        rt.evaluate_now().await.unwrap();
        if rt.substrate().evaluation_queue(1).unwrap().is_empty() {
            return;
        }
    }
    panic!("the evaluation queue never emptied");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_decides_when_it_answers_well_and_the_rules_when_it_does_not() {
    let setup = Setup {
        timeout: "1s",
        // Every text is distinct, but spare nothing so every mode reaches the endpoint.
        options: spare_nothing(),
        ..Setup::default()
    };
    let (ep, _dir, rt, llm) = start(Mode::Good, setup).await;
    // (mode, the model decides, what the audit log must say)
    let cases = [
        (Mode::Good, true, "scripted verdict"),
        (Mode::Fenced, true, "scripted verdict"),
        (Mode::Broken, false, "twice"),
        (Mode::WrongSchema, false, "twice"),
        (Mode::RateLimited(1), true, "scripted verdict"),
        (Mode::ServerError, false, "HTTP 500"),
        (Mode::Hang, false, "no answer within the 1s timeout"),
        (Mode::Slow(300), true, "scripted verdict"),
    ];
    for (i, (mode, by_model, reason)) in cases.into_iter().enumerate() {
        ep.set(mode);
        let session = rt.session("default", &format!("case-{i}")).unwrap();
        let ids = session
            .record_batch(vec![
                NewMemory::new("note", format!("case {i}: the meeting moved to room {i}")),
                NewMemory::new(
                    "observation",
                    format!("case {i}: deploy error, the cache was cold on node {i}"),
                ),
            ])
            .await
            .unwrap();
        judge_all(&rt).await;
        let note = rt.memory("default", ids[0]).unwrap().get().await.unwrap();
        let error = rt.memory("default", ids[1]).unwrap().get().await.unwrap();
        let history = audit(&rt, ids[1]).await;
        if by_model {
            assert_eq!((note.importance, error.importance), (1.0, 9.0), "{mode:?}");
            assert!(
                history.contains("[llm:scripted] importance 9"),
                "{mode:?}: {history}"
            );
        } else {
            // The rules: default 3 for a note, 7 for an observation mentioning an error.
            assert_eq!((note.importance, error.importance), (3.0, 7.0), "{mode:?}");
            assert!(
                history.contains("kept from the rules"),
                "{mode:?}: {history}"
            );
        }
        assert!(history.contains(reason), "{mode:?}: {history}");

        let condensed = session
            .condense()
            .await
            .unwrap()
            .expect("two events condense");
        let record = rt
            .memory("default", condensed.id)
            .unwrap()
            .get()
            .await
            .unwrap();
        let history = audit(&rt, condensed.id).await;
        if by_model {
            assert_eq!(record.kind.as_str(), "lesson", "{mode:?}");
            assert!(record.text.starts_with("When a deploy fails"), "{mode:?}");
            assert!(
                history.contains("written by llm:scripted"),
                "{mode:?}: {history}"
            );
        } else {
            assert_eq!(record.kind.as_str(), "summary", "{mode:?}");
            assert!(
                record.text.contains(&format!("case {i}")),
                "{}",
                record.text
            );
            assert!(
                history.contains("extractive; llm:scripted failed"),
                "{mode:?}: {history}"
            );
        }
        assert_eq!(record.sources, ids, "{mode:?}: every source linked");
    }
    let stats = llm.stats();
    assert!(stats.chat.retries >= 1, "the 429 was retried: {stats:?}");
    assert_eq!(stats.judged, 8, "four modes answered well: {stats:?}");
    assert_eq!(stats.condensed, 4, "{stats:?}");
    assert_eq!(stats.fallbacks, 2 * 4 + 4, "{stats:?}");
    // Tokens are counted from every HTTP answer's `usage` (100 prompt, 20 completion).
    assert!(stats.chat.prompt_tokens > 0, "{stats:?}");
    assert_eq!(
        stats.chat.prompt_tokens,
        5 * stats.chat.completion_tokens,
        "{stats:?}"
    );
    assert_eq!(ep.in_flight(), 0, "the hung call was abandoned");
    rt.shutdown().await.unwrap();
}

/// `n` distinct one-line facts, far apart in the hash embedder's space.
fn facts(n: usize, tag: &str) -> Vec<NewMemory> {
    const WORDS: [&str; 10] = [
        "invoice",
        "glacier",
        "compiler",
        "violin",
        "harbour",
        "enzyme",
        "satellite",
        "orchard",
        "ledger",
        "volcano",
    ];
    (0..n)
        .map(|i| {
            let text = format!(
                "{tag} {} {} {} number {i}",
                WORDS[i % 10],
                WORDS[(i / 10) % 10],
                WORDS[(i * 7 + 3) % 10]
            );
            NewMemory::new("note", text)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batching_the_cache_and_semantic_reuse_cut_calls() {
    let setup = Setup {
        batch: 10,
        options: JudgeOptions {
            cache_entries: 10_000,
            reuse_similarity: Some(0.9),
            ..JudgeOptions::default()
        },
        ..Setup::default()
    };
    let (ep, _dir, rt, llm) = start(Mode::Good, setup).await;
    let session = rt.session("default", "batching").unwrap();
    // 100 records written in one call are judged 10 to a request: 10 requests.
    let first = session.record_batch(facts(100, "fact")).await.unwrap();
    judge_all(&rt).await;
    assert_eq!(ep.requests(), 10, "100 records in batches of 10");
    assert!(ep.batch_sizes().iter().all(|&n| n == 10));
    for id in &first {
        let r = rt.memory("default", *id).unwrap().get().await.unwrap();
        assert_eq!(r.importance, 1.0, "judged by the model");
    }
    // The same 100 texts again: every verdict from the cache, no request.
    let again = session.record_batch(facts(100, "fact")).await.unwrap();
    judge_all(&rt).await;
    assert_eq!(ep.requests(), 10, "the cache answered");
    assert!(audit(&rt, again[0]).await.contains("cached"));
    // Near-duplicates (one character added): reused from their neighbours, no request.
    let near: Vec<NewMemory> = facts(100, "fact")
        .into_iter()
        .map(|m| NewMemory::new("note", format!("{}!", m.text.unwrap_or_default())))
        .collect();
    let near = session.record_batch(near).await.unwrap();
    judge_all(&rt).await;
    assert_eq!(ep.requests(), 10, "semantic reuse answered");
    let history = audit(&rt, near[5]).await;
    assert!(history.contains("reused from near-duplicate"), "{history}");
    let stats = llm.stats();
    assert_eq!(
        (stats.judged, stats.cache_hits, stats.reuse_hits),
        (100, 100, 100)
    );
    // A new text is asked about.
    session
        .record(NewMemory::new(
            "note",
            "the quarterly tax filing is due on April 15",
        ))
        .await
        .unwrap();
    judge_all(&rt).await;
    assert_eq!(ep.requests(), 11, "a new text reaches the model");
    rt.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_budget_switches_to_rules_and_back_the_next_hour() {
    let (ep, url) = endpoint(Mode::Good).await;
    let dir = tempfile::tempdir().unwrap();
    // Half past an hour on the virtual clock (20:30 UTC); each request costs 120 tokens, so
    // 300 allow 3 calls.
    let start = 1_780_000_000_000 - 1_780_000_000_000 % 3_600_000 + 1_800_000;
    let clock = Arc::new(VirtualClock::new(start));
    let setup = Setup {
        batch: 5,
        tokens_per_hour: 300,
        options: spare_nothing(),
        ..Setup::default()
    };
    let (rt, llm) = runtime(&dir, &url, setup, Some(clock.clone())).await;
    let session = rt.session("default", "budget").unwrap();
    let ids = session.record_batch(facts(20, "hour-one")).await.unwrap();
    judge_all(&rt).await;
    // 3 requests (360 tokens, over the 300) then rules for the last 5.
    assert_eq!(ep.requests(), 3);
    let by_model = |r: &shadowbrain::MemoryRecord| r.importance == 1.0;
    let mut judged = 0;
    for id in &ids {
        let r = rt.memory("default", *id).unwrap().get().await.unwrap();
        judged += usize::from(by_model(&r));
    }
    assert_eq!(judged, 15);
    let history = audit(&rt, ids[19]).await;
    assert!(
        history.contains("has spent its LLM budget for this hour (360 of 300 tokens)")
            && history.contains("until 21:00 UTC"),
        "{history}"
    );
    assert_eq!(llm.stats().over_budget, 5);
    assert_eq!(
        llm.budget()
            .spent("default", shadowbrain::Clock::now(&*clock)),
        360
    );
    // The clock crosses the hour: the model is asked again.
    clock.advance(Duration::from_secs(1800));
    let later = session.record_batch(facts(5, "hour-two")).await.unwrap();
    judge_all(&rt).await;
    assert_eq!(ep.requests(), 4);
    let r = rt.memory("default", later[0]).unwrap().get().await.unwrap();
    assert!(by_model(&r), "{}", audit(&rt, later[0]).await);
    rt.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_keeps_acknowledging_while_the_provider_hangs() {
    let setup = Setup {
        timeout: "60s",
        ..Setup::default()
    };
    let (ep, _dir, rt, _llm) = start(Mode::Hang, setup).await;
    let session = rt.session("default", "hang").unwrap();
    session
        .record(NewMemory::new("note", "the first event"))
        .await
        .unwrap();
    // The evaluator picks it up and its call hangs.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while ep.in_flight() == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the judge never called"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // 200 batches of 10 are acknowledged while the call hangs (the provider's timeout is a
    // minute; were ingest waiting on it, this would not finish within its 20 s bound).
    let acked = tokio::time::timeout(Duration::from_secs(20), async {
        let mut acked = 0;
        for b in 0..200 {
            let ids = session
                .record_batch(facts(10, &format!("b{b}")))
                .await
                .unwrap();
            acked += ids.len();
        }
        acked
    })
    .await
    .expect("ingest waited for the hung provider");
    assert_eq!(acked, 2000);
    assert_eq!(ep.in_flight(), 1, "the call is still hanging");
    let queued = rt.substrate().evaluation_queue(5000).unwrap().len();
    assert!(queued >= 2000, "the records wait for the judge: {queued}");
    // Every acknowledged event is readable now, with the rules' score.
    let timeline = session.timeline(3000).await.unwrap();
    assert_eq!(timeline.len(), 2001);
    // The lag is visible in the metrics: the queue's depth and its oldest record's age.
    let metrics = shadowbrain::metrics::Metrics::new().render(&rt).await;
    let value = |name: &str| -> f64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {metrics}"))
    };
    assert!(value("shadowbrain_work_queue_depth{queue=\"evaluate\"}") >= 2000.0);
    assert!(value("shadowbrain_work_queue_oldest_seconds{queue=\"evaluate\"}") > 0.0);
    assert_eq!(
        value("shadowbrain_llm_records_total{outcome=\"judged\"}"),
        0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hybrid_asks_only_about_what_the_rules_left_at_the_default() {
    let setup = Setup {
        policy: "[evaluation]\nmode = \"hybrid\"\n",
        ..Setup::default()
    };
    let (ep, _dir, rt, _llm) = start(Mode::Good, setup).await;
    let session = rt.session("default", "hybrid").unwrap();
    let ids = session
        .record_batch(vec![
            NewMemory::new("goal", "ship the release on friday"),
            NewMemory::new("observation", "the build failed with an error"),
            NewMemory::new("note", "the standup moved to 10:15"),
        ])
        .await
        .unwrap();
    judge_all(&rt).await;
    assert_eq!(ep.batch_sizes(), vec![1], "only the note was asked about");
    let mut importance = Vec::new();
    for id in &ids {
        importance.push(
            rt.memory("default", *id)
                .unwrap()
                .get()
                .await
                .unwrap()
                .importance,
        );
    }
    // The goal and the error keep their rules (9, 7); the note gets the model's 1.
    assert_eq!(importance, vec![9.0, 7.0, 1.0]);
    rt.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_model_is_asked_about_several_batches_at_once() {
    let setup = Setup {
        batch: 5,
        concurrency: 4,
        options: spare_nothing(),
        ..Setup::default()
    };
    let (ep, _dir, rt, llm) = start(Mode::Slow(400), setup).await;
    let session = rt.session("default", "wide").unwrap();
    session.record_batch(facts(20, "wide")).await.unwrap();
    judge_all(&rt).await;
    assert_eq!(ep.requests(), 4);
    assert_eq!(ep.peak(), 4, "four batches in flight together");
    assert_eq!(llm.stats().judged, 20);
    rt.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_waits_for_one_round_of_a_slow_model_and_the_rest_is_judged_after_restart() {
    let (ep, url) = endpoint(Mode::Slow(1_000)).await;
    let dir = tempfile::tempdir().unwrap();
    let setup = Setup {
        batch: 5,
        // Ticks every 500 ms against rounds of a second: ticks that pile up in the mailbox
        // meanwhile must not each become a round during shutdown.
        wait: Duration::from_secs(2),
        options: spare_nothing(),
        ..Setup::default()
    };
    let (rt, _llm) = runtime(&dir, &url, setup, None).await;
    let session = rt.session("default", "slow").unwrap();
    let ids = session.record_batch(facts(100, "slow")).await.unwrap();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let before_stop = ep.requests();
    // 20 rounds of a second each remain; shutdown must not wait for them (the queue is in
    // the store). Bounded generously: the point is "one round", not a speed target.
    let stopped = std::time::Instant::now();
    tokio::time::timeout(Duration::from_secs(15), rt.shutdown())
        .await
        .expect("shutdown waited for the whole queue")
        .unwrap();
    let took = stopped.elapsed();
    drop(session);
    drop(rt);
    let judged_before = ep.requests();
    assert!(
        judged_before <= before_stop + 1,
        "{before_stop} requests before the stop, {judged_before} after ({took:?})"
    );
    assert!(judged_before < 20, "the queue was not worked through");

    ep.set(Mode::Good);
    let setup = Setup {
        batch: 50,
        options: spare_nothing(),
        ..Setup::default()
    };
    let (rt, _llm) = runtime(&dir, &url, setup, None).await;
    judge_all(&rt).await;
    for id in &ids {
        let r = rt.memory("default", *id).unwrap().get().await.unwrap();
        assert_eq!(r.importance, 1.0, "{id} judged after the restart");
    }
    rt.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_trickling_in_wait_for_each_other_and_share_a_call() {
    let setup = Setup {
        batch: 10,
        wait: Duration::from_millis(800),
        options: spare_nothing(),
        ..Setup::default()
    };
    let (ep, _dir, rt, _llm) = start(Mode::Good, setup).await;
    let session = rt.session("default", "trickle").unwrap();
    let mut ids = Vec::new();
    for m in facts(3, "trickle") {
        ids.push(session.record(m).await.unwrap());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Judged in the background, by one call, once the first record's wait is over.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !rt.substrate().evaluation_queue(1).unwrap().is_empty() {
        assert!(std::time::Instant::now() < deadline, "never judged");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(ep.batch_sizes(), vec![3], "one call for the three");
    let last = rt.memory("default", ids[2]).unwrap().get().await.unwrap();
    assert_eq!(last.importance, 1.0);
    rt.shutdown().await.unwrap();
}
