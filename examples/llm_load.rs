//! The LLM judge under load, against an OpenAI-compatible endpoint this process serves
//! itself on 127.0.0.1 (scripted: it sleeps, then rates every record).
//!
//! ```text
//! cargo run --release --example llm_load -- --events 20000 --delay-ms 2000 --runs 3
//! ```
//!
//! Phase 1 (**acknowledgement**): `--clients` sessions write `--events` events in batches
//! of `--batch`, each batch answered once durable, first with the policy's `rules` mode,
//! then with `llm` evaluation against an endpoint that takes `--delay-ms` per call, `--runs`
//! times alternating. Reported: ack latency p50 / p99 / max and events/s per mode, and for
//! `llm` the calls made meanwhile and the records still waiting for the judge (ingest does
//! not wait for them). Then the shutdown time (one round of calls, not the queue).
//!
//! Phase 2 (**cost**): `--cost-events` events of which `--near` (default 0.3) are
//! near-duplicates of earlier ones (a word changed, punctuation, case, a number), sent one
//! at a time by 10 sessions at each of `--rates` events/s, judged in the background with
//! the `[llm]` defaults (batches of 16, batch_wait 2 s, cache, reuse at 0.9). Reported:
//! calls per 1,000 events and how records were served (model, cache, reuse). Unique texts
//! are LoCoMo's dialogue turns when `../shared/data/locomo/locomo10.json` is there (real,
//! varied language), otherwise generated.
//!
//! `--cost-events 0` skips phase 2; `--batch-wait 5s` changes `[llm] batch_wait` there.
//! Progress goes to stderr; the last line on stdout is one JSON object with every figure.

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use serde_json::{Value, json};
use shadowbrain::NewMemory;
use shadowbrain::embed::Embedder;
use shadowbrain::embed::HashEmbedder;
use shadowbrain::llm::chat::ChatClient;
use shadowbrain::llm::cost::{Llm, LlmStats};
use shadowbrain::llm::judge::LlmJudge;
use shadowbrain::llm::{LlmConfig, LlmKind};
use shadowbrain::policy::Policy;
use shadowbrain::{Runtime, RuntimeConfig};
use shadowbrain_test_support::flags::{non_negative, positive};
use shadowbrain_test_support::stats::percentile;
use shadowbrain_test_support::{Endpoint, Reply, verdicts};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The LLM judge under load: ingest's acknowledgements beside a slow judge, then the calls
/// a stream with near-duplicates costs; one JSON line, last.
#[derive(Parser)]
#[command(name = "llm_load")]
struct Args {
    /// Phase 1: events written in each run of each mode.
    #[arg(long, default_value_t = 20_000)]
    events: usize,
    /// Phase 1: sessions writing at once (0 counts as 1).
    #[arg(long, default_value_t = 8)]
    clients: usize,
    /// Phase 1: events per write (clamped to 1..=1000).
    #[arg(long, default_value_t = 10)]
    batch: usize,
    /// Phase 1: how long the endpoint takes per call, in ms.
    #[arg(long, value_name = "MS", default_value_t = 2_000)]
    delay_ms: u64,
    /// Phase 1: runs of each mode, alternating (0 counts as 1).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Phase 2: events sent at each rate (0 skips phase 2).
    #[arg(long, default_value_t = 1_000)]
    cost_events: usize,
    /// Phase 2: the share of the events that are near-duplicates (at most 0.9).
    #[arg(long, default_value_t = 0.3, value_parser = non_negative)]
    near: f64,
    /// Phase 2: arrival rates, events per second, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [200.0, 20.0], value_parser = positive)]
    rates: Vec<f64>,
    /// Phase 2: how long the endpoint takes per call, in ms.
    #[arg(long, value_name = "MS", default_value_t = 500)]
    cost_delay_ms: u64,
    /// Phase 2: `[llm] batch_wait`, a duration such as 5s (default: the `[llm]` default).
    #[arg(long, value_name = "DURATION")]
    batch_wait: Option<String>,
}

fn args() -> Args {
    let a = Args::parse();
    Args {
        clients: a.clients.max(1),
        batch: a.batch.clamp(1, 1000),
        runs: a.runs.max(1),
        near: a.near.min(0.9),
        ..a
    }
}

/// The scripted endpoint (the tests' own): sleeps `delay`, then rates every numbered
/// record, reporting about a token per four characters of prompt and answer.
async fn endpoint(delay: Duration) -> (Endpoint, String) {
    let ep = Endpoint::start(move |request| {
        let items = request.numbered_records().into_iter().map(|line| {
            let importance = (line.len() % 11) as f64;
            (importance, 3, "scripted".to_string())
        });
        let content = verdicts(items);
        let prompt = (request.system().len() + request.user().len()) / 4;
        let completion = content.len() / 4;
        Reply::after(
            delay,
            Reply::chat(&content, Some((prompt as u64, completion as u64))),
        )
    })
    .await;
    let url = ep.base_url();
    (ep, url)
}

/// A runtime in `dir`, judging with the `[llm]` defaults (but `batch_wait`) against `url`
/// when given.
async fn open(
    dir: &std::path::Path,
    url: Option<&str>,
    batch_wait: Option<&str>,
) -> (Runtime, Option<Arc<Llm>>) {
    let mut config = RuntimeConfig::new(dir);
    let mode = if url.is_some() { "llm" } else { "rules" };
    config.substrate.policy =
        Policy::from_toml("<llm_load>", &format!("[evaluation]\nmode = \"{mode}\"\n"))
            .expect("policy");
    let mut llm = None;
    if let Some(url) = url {
        let cfg = LlmConfig {
            kind: LlmKind::Openai,
            base_url: Some(url.to_string()),
            model: Some("scripted".into()),
            api_key_env: "SHADOWBRAIN_LLM_LOAD_NO_KEY".into(),
            batch_wait: batch_wait.map_or_else(|| LlmConfig::default().batch_wait, str::to_string),
            ..LlmConfig::default()
        };
        cfg.validate()
            .expect("--batch-wait must be a duration such as 5s");
        let client = Arc::new(ChatClient::new(&cfg).expect("client"));
        let shared = Arc::new(Llm::new(client, cfg.tokens_per_hour));
        config.judge = Some(Arc::new(LlmJudge::with_options(
            shared.clone(),
            cfg.judge_options(),
        )));
        config.llm = Some(shared.clone());
        config.evaluation_batch = cfg.batch_size;
        config.evaluation_concurrency = cfg.max_concurrency;
        config.evaluation_wait = cfg.batch_wait().expect("batch_wait");
        llm = Some(shared);
    }
    (Runtime::open(config).await.expect("open"), llm)
}

/// Pieces of generated sentences (phase 1, and phase 2 without LoCoMo).
const SUBJECTS: [&str; 12] = [
    "the backup job",
    "the customer",
    "the deploy",
    "the invoice run",
    "the on-call rota",
    "the search index",
    "the billing API",
    "the nightly report",
    "the payroll export",
    "the staging cluster",
    "the mobile release",
    "the data warehouse",
];
const PREDICATES: [&str; 12] = [
    "failed after the upgrade",
    "needs a manual approval",
    "was moved to thursday",
    "ran out of disk",
    "asked about the refund policy",
    "is blocked on legal review",
    "doubled its latency",
    "skipped the archived rows",
    "lost its credentials",
    "was rolled back",
    "hit the rate limit",
    "finished early",
];

/// Phase 1, one run of one mode.
async fn acknowledge(a: &Args, url: Option<&str>, run: usize) -> Value {
    let dir = tempfile::tempdir().expect("tempdir");
    let (rt, llm) = open(dir.path(), url, None).await;
    let per_client = a.events / a.clients / a.batch;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..a.clients {
        let session = rt.session("default", &format!("c{c}")).expect("session");
        let batch = a.batch;
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::with_capacity(per_client);
            for b in 0..per_client {
                let events: Vec<NewMemory> = (0..batch)
                    .map(|e| {
                        let n = (c * per_client + b) * batch + e;
                        let text = format!(
                            "{} {} (client {c}, event {n})",
                            SUBJECTS[n % SUBJECTS.len()],
                            PREDICATES[(n / SUBJECTS.len()) % PREDICATES.len()]
                        );
                        NewMemory::new("observation", text)
                    })
                    .collect();
                let t = Instant::now();
                session.record_batch(events).await.expect("ingest");
                latencies.push(t.elapsed().as_secs_f64() * 1e3);
            }
            latencies
        }));
    }
    let mut latencies = Vec::new();
    for t in tasks {
        latencies.extend(t.await.expect("client"));
    }
    let wall = started.elapsed().as_secs_f64();
    latencies.sort_by(f64::total_cmp);
    // No acknowledgements (fewer events than clients × batch) read as NaN: null in the JSON.
    let ms = |q| percentile(&latencies, q).unwrap_or(f64::NAN);
    let events = per_client * a.clients * a.batch;
    let waiting = rt
        .substrate()
        .evaluation_queue(events + 1)
        .map_or(0, |q| q.len());
    let stats = llm.as_ref().map(|l| l.stats()).unwrap_or_default();
    assert_eq!(stats.fallbacks, 0, "the endpoint never fails: {stats:?}");
    let stopping = Instant::now();
    rt.shutdown().await.expect("shutdown");
    let shutdown_s = stopping.elapsed().as_secs_f64();
    let mode = if url.is_some() { "llm" } else { "rules" };
    let figures = json!({
        "mode": mode, "run": run, "events": events, "events_per_s": events as f64 / wall,
        "ack_p50_ms": ms(0.5), "ack_p99_ms": ms(0.99),
        "ack_max_ms": latencies.last().copied().unwrap_or(f64::NAN),
        "llm_requests": stats.chat.requests, "records_judged": stats.judged,
        "waiting_for_judge": waiting, "shutdown_s": shutdown_s,
    });
    eprintln!(
        "ack  run {run} {mode:5}: {events} events in {wall:.2}s ({:.0}/s), ack p50 {:.2} ms \
         p99 {:.2} ms max {:.1} ms; {} LLM calls, {waiting} waiting for the judge; shutdown \
         {shutdown_s:.2}s",
        events as f64 / wall,
        ms(0.5),
        ms(0.99),
        latencies.last().copied().unwrap_or(f64::NAN),
        stats.chat.requests,
    );
    figures
}

/// A deterministic generator (SplitMix64): the same workload every run, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Distinct texts: LoCoMo's turns when the data is there (longer than five words, first
/// occurrence only), otherwise generated sentences.
fn unique_texts(n: usize, rng: &mut Rng) -> (Vec<String>, &'static str) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/data/locomo/locomo10.json");
    if let Ok(conversations) = shadowbrain::eval::locomo::load(&path) {
        let mut seen = std::collections::HashSet::new();
        let texts: Vec<String> = conversations
            .iter()
            .flat_map(|c| c.turns.iter().map(|t| t.text.clone()))
            .filter(|t| t.split_whitespace().count() > 5 && seen.insert(t.to_lowercase()))
            .take(n)
            .collect();
        if texts.len() == n {
            return (texts, "locomo turns");
        }
    }
    let texts = (0..n)
        .map(|i| {
            format!(
                "{} {} on day {} ({})",
                SUBJECTS[rng.below(12)],
                PREDICATES[rng.below(12)],
                rng.below(365),
                i
            )
        })
        .collect();
    (texts, "generated sentences")
}

/// A near-duplicate of `text`: one small edit that changes its words (case and
/// punctuation alone would give the hash embedder the very same vector), as an agent's
/// repeated observation has.
fn perturb(text: &str, rng: &mut Rng) -> String {
    const FILLERS: [&str; 6] = ["again", "today", "also", "still", "now", "really"];
    let mut words: Vec<String> = text.split_whitespace().map(str::to_string).collect();
    let at = 1 + rng.below(words.len().saturating_sub(1).max(1));
    let at = at.min(words.len().saturating_sub(1));
    match rng.below(4) {
        // A word dropped.
        0 if words.len() > 3 => {
            words.remove(at);
        }
        // A word added.
        1 => words.insert(at, FILLERS[rng.below(FILLERS.len())].to_string()),
        // Two neighbours swapped.
        2 if words.len() > 3 => words.swap(at - 1, at),
        // A word replaced.
        _ => words[at] = FILLERS[rng.below(FILLERS.len())].to_string(),
    }
    words.join(" ")
}

/// Phase 2 at one arrival rate.
async fn cost(a: &Args, rate: f64, url: &str) -> Value {
    let mut rng = Rng(20_251_130);
    let near = ((a.cost_events as f64) * a.near).round() as usize;
    let (uniques, source) = unique_texts(a.cost_events - near, &mut rng);
    // Each near-duplicate comes after its original, at a random later position.
    let mut texts: Vec<String> = uniques.clone();
    let embedder = HashEmbedder::new(384).expect("embedder");
    let mut similarity = Vec::with_capacity(near);
    for _ in 0..near {
        let of = rng.below(uniques.len());
        let copy = perturb(&uniques[of], &mut rng);
        let vectors = embedder
            .embed(&[uniques[of].clone(), copy.clone()])
            .await
            .expect("embed");
        similarity.push(
            vectors[0]
                .iter()
                .zip(&vectors[1])
                .map(|(x, y)| x * y)
                .sum::<f32>(),
        );
        let at = of + 1 + rng.below(texts.len() - of);
        texts.insert(at.min(texts.len()), copy);
    }
    similarity.sort_by(f32::total_cmp);
    let above = similarity.iter().filter(|s| **s >= 0.9).count();

    let dir = tempfile::tempdir().expect("tempdir");
    let (rt, llm) = open(dir.path(), Some(url), a.batch_wait.as_deref()).await;
    let llm = llm.expect("llm");
    let sessions: Vec<_> = (0..10)
        .map(|s| {
            rt.session("default", &format!("agent{s}"))
                .expect("session")
        })
        .collect();
    let started = Instant::now();
    let gap = Duration::from_secs_f64(1.0 / rate);
    for (i, text) in texts.iter().enumerate() {
        let due = started + gap.mul_f64(i as f64);
        tokio::time::sleep_until(due.into()).await;
        sessions[i % sessions.len()]
            .record(NewMemory::new("observation", text.clone()))
            .await
            .expect("ingest");
    }
    let sent = started.elapsed().as_secs_f64();
    // Wait for the background judge (batch_wait and all), not an explicit drain.
    while !rt
        .substrate()
        .evaluation_queue(1)
        .map(|q| q.is_empty())
        .unwrap_or(true)
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let lag = started.elapsed().as_secs_f64() - sent;
    let s: LlmStats = llm.stats();
    rt.shutdown().await.expect("shutdown");
    let events = texts.len();
    // The endpoint always answers well: every record got a verdict from the model, the
    // cache or a near-duplicate, none fell back to the rules.
    assert_eq!(
        (
            s.judged + s.cache_hits + s.reuse_hits,
            s.fallbacks,
            s.over_budget
        ),
        (events as u64, 0, 0),
        "{s:?}"
    );
    let per_1000 = s.chat.requests as f64 * 1000.0 / events as f64;
    eprintln!(
        "cost {rate:>6.0} ev/s, batch_wait {}: {events} events ({near} near-duplicates of {source}; {above} \
         of them at cosine >= 0.9, median {:.3}) -> {} LLM calls = {per_1000:.1} per 1,000 \
         events (1 per {:.1}); {} judged by the model, {} cached, {} reused; {} tokens; \
         judged {lag:.1}s after the last event",
        a.batch_wait.as_deref().unwrap_or("2s"),
        percentile(&similarity, 0.5).unwrap_or(f32::NAN),
        s.chat.requests,
        events as f64 / s.chat.requests.max(1) as f64,
        s.judged,
        s.cache_hits,
        s.reuse_hits,
        s.chat.prompt_tokens + s.chat.completion_tokens,
    );
    json!({
        "rate_per_s": rate, "batch_wait": a.batch_wait.as_deref().unwrap_or("2s"), "events": events, "near_duplicates": near, "texts": source,
        "near_at_or_above_0_9": above, "llm_calls": s.chat.requests,
        "calls_per_1000_events": per_1000, "judged": s.judged, "cached": s.cache_hits,
        "reused": s.reuse_hits, "tokens": s.chat.prompt_tokens + s.chat.completion_tokens,
        "lag_after_last_event_s": lag,
    })
}

#[tokio::main]
async fn main() {
    let a = args();
    let (slow, slow_url) = endpoint(Duration::from_millis(a.delay_ms)).await;
    let mut ack = Vec::new();
    for run in 1..=a.runs {
        ack.push(acknowledge(&a, None, run).await);
        ack.push(acknowledge(&a, Some(&slow_url), run).await);
    }
    eprintln!("the slow endpoint answered {} calls", slow.requests());
    let (_fast, fast_url) = endpoint(Duration::from_millis(a.cost_delay_ms)).await;
    let mut costs = Vec::new();
    for &rate in a.rates.iter().filter(|_| a.cost_events > 0) {
        costs.push(cost(&a, rate, &fast_url).await);
    }
    println!("{}", json!({"ack": ack, "cost": costs}));
}
