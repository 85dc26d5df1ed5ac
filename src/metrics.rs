//! What `GET /metrics` reports, in the Prometheus text format (prometheus-client).
//!
//! Two kinds of figures: those the server counts as requests pass (requests by route,
//! method and status; their latency; events ingested; recalls), and those read from the
//! runtime when Prometheus scrapes (live session actors, session messages in flight,
//! actor restarts, quarantined inputs, records by tier, archived records, work-queue and
//! commit backlogs, changes the indexes have not built yet, promotions, embedder errors,
//! index rebuilds). Reading the latter at scrape time keeps the write path free of
//! bookkeeping. A cluster node (`serve --cluster`) reports its own: the runtime figures
//! summed over the partitions it owns, and its partitions, members and log appends.

use std::sync::{Arc, Mutex};

use crate::internals::Queue;
use crate::{Runtime, Tier};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// A request's route (the path pattern, not the path: ids would explode the label set),
/// method and status.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    route: String,
    method: String,
    status: u16,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    route: String,
}

/// An MCP tool call: the tool (one of the contract's names, else `unknown`) and whether it
/// answered a result or a tool error.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolLabels {
    tool: &'static str,
    outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct IndexLabels {
    index: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TierLabels {
    tier: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueLabels {
    queue: &'static str,
}

/// The content type of the text exposition.
pub(crate) const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A work queue is counted up to this many items per scrape.
const QUEUE_COUNT_CAP: usize = 1_000_000;

/// The server's metrics and their registry.
#[derive(Debug)]
pub struct Metrics {
    registry: Mutex<Registry>,
    requests: Family<RequestLabels, Counter>,
    latency: Family<RouteLabels, Histogram>,
    events: Counter,
    recalls: Counter,
    tool_calls: Family<ToolLabels, Counter>,
    live_sessions: Gauge,
    restarts: Gauge,
    quarantined: Gauge,
    records: Gauge,
    unbuilt: Family<IndexLabels, Gauge>,
    in_flight: Gauge,
    by_tier: Family<TierLabels, Gauge>,
    archived: Gauge,
    queues: Family<QueueLabels, Gauge>,
    queue_age: Family<QueueLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    commit_backlog: Gauge,
    promotions: Counter,
    provider_errors: Counter,
    embed_cache: Family<CacheLabels, Counter>,
    rebuilds: Counter,
    llm: LlmMetrics,
    connections: ConnectionMetrics,
    /// Registered by [`Metrics::for_cluster`] only.
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    cluster: ClusterMetrics,
}

/// A cluster node's own figures (`serve --cluster`).
#[cfg_attr(not(feature = "cluster"), allow(dead_code))]
#[derive(Debug, Default)]
struct ClusterMetrics {
    partitions: Family<RoleLabels, Gauge>,
    members: Gauge,
    log_entries: Counter,
    log_bytes: Counter,
    log_retries: Counter,
    log_duplicates: Counter,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RoleLabels {
    role: &'static str,
}

/// What a cluster node reports of itself at a scrape: its partitions by role (`owner`,
/// `standby`, `moving`), the live members it sees, and what it appended to the log.
#[cfg_attr(not(feature = "cluster"), allow(dead_code))]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct NodeFigures {
    pub(crate) owner: u64,
    pub(crate) standby: u64,
    pub(crate) moving: u64,
    pub(crate) members: u64,
    pub(crate) log_entries: u64,
    pub(crate) log_bytes: u64,
    pub(crate) log_retries: u64,
    pub(crate) log_duplicates: u64,
}

/// What the accept loop counts (`http::connections::serve_connections`): connections open,
/// refused past `server.max_connections`, and cut at the drain deadline.
#[derive(Debug, Clone, Default)]
pub struct ConnectionMetrics {
    /// Connections being served now.
    pub open: Gauge,
    /// Connections answered 503 at once: `max_connections` (or the address's share) were
    /// open and every one was answering a request.
    pub refused: Counter,
    /// Idle connections closed to make room for a new one.
    pub evicted: Counter,
    /// Connections still open at the drain deadline, closed without their answer.
    pub cut: Counter,
}

/// The LLM layer's counters (registered whether or not an LLM is configured, so dashboards
/// see zeros rather than gaps).
#[derive(Debug, Default)]
struct LlmMetrics {
    requests: Counter,
    retries: Counter,
    failures: Counter,
    tokens: Family<TokenLabels, Counter>,
    records: Family<OutcomeLabels, Counter>,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CacheLabels {
    result: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TokenLabels {
    kind: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Every metric, registered under the `shadowbrain_` prefix.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("shadowbrain");
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "http_requests",
            "HTTP requests answered, by route, method and status",
            requests.clone(),
        );
        // 100 µs to ~6.5 s: recall sits near the bottom, a batch of 1000 events near the top.
        let latency = Family::<RouteLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.0001, 2.0, 17))
        });
        registry.register(
            "http_request_duration_seconds",
            "Time to answer an HTTP request, by route",
            latency.clone(),
        );
        let events = Counter::default();
        registry.register(
            "events_ingested",
            "Events written durably through the API",
            events.clone(),
        );
        let recalls = Counter::default();
        registry.register("recalls", "Recalls answered", recalls.clone());
        let tool_calls = Family::<ToolLabels, Counter>::default();
        registry.register(
            "mcp_tool_calls",
            "MCP tool calls answered over /mcp, by tool and outcome (ok, or error: a tool \
             error the model was shown)",
            tool_calls.clone(),
        );
        let live_sessions = Gauge::default();
        registry.register(
            "live_session_actors",
            "Session actors running now (idle ones passivate)",
            live_sessions.clone(),
        );
        let restarts = Gauge::default();
        registry.register(
            "actor_restarts",
            "Actor restarts by their supervisors since start",
            restarts.clone(),
        );
        let quarantined = Gauge::default();
        registry.register(
            "quarantined_inputs",
            "Inputs and records set aside because processing them kept failing",
            quarantined.clone(),
        );
        let records = Gauge::default();
        registry.register("records", "Records in the store", records.clone());
        let unbuilt = Family::<IndexLabels, Gauge>::default();
        registry.register(
            "index_unbuilt_changes",
            "Changes staged in an index's tail and not yet built (enrichment lag)",
            unbuilt.clone(),
        );
        let in_flight = Gauge::default();
        registry.register(
            "session_messages_in_flight",
            "Messages sent to session actors and not yet answered (their mailboxes' depth)",
            in_flight.clone(),
        );
        let by_tier = Family::<TierLabels, Gauge>::default();
        registry.register(
            "records_by_tier",
            "Records in the store by tier (knowledge: promoted lessons)",
            by_tier.clone(),
        );
        let archived = Gauge::default();
        registry.register(
            "archived_records",
            "Records archived by the forgetting policy or by DELETE, kept until purged",
            archived.clone(),
        );
        let queues = Family::<QueueLabels, Gauge>::default();
        registry.register(
            "work_queue_depth",
            "Records waiting in a durable work queue (enrich: embedding lag; evaluate: the \
             judge; condense; promote; updates: update detection)",
            queues.clone(),
        );
        let queue_age = Family::<QueueLabels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
        registry.register(
            "work_queue_oldest_seconds",
            "Age on the runtime clock of the oldest record waiting in a work queue (0 when \
             empty): the enrichment lag of embedding (enrich) and of the judge (evaluate)",
            queue_age.clone(),
        );
        let commit_backlog = Gauge::default();
        registry.register(
            "store_commit_backlog",
            "Write sets waiting for the store's group commit",
            commit_backlog.clone(),
        );
        let promotions = Counter::default();
        registry.register(
            "promotions",
            "Condensed records promoted into, or merged with, the knowledge pool",
            promotions.clone(),
        );
        let provider_errors = Counter::default();
        registry.register(
            "provider_errors",
            "Embedder and LLM calls that failed after their retries",
            provider_errors.clone(),
        );
        let embed_cache = Family::<CacheLabels, Counter>::default();
        registry.register(
            "embed_cache_lookups",
            "Texts looked up in the embedder's cache, by result (hit: not embedded again)",
            embed_cache.clone(),
        );
        let llm = LlmMetrics::default();
        registry.register(
            "llm_requests",
            "HTTP requests sent to the LLM endpoint, retries included",
            llm.requests.clone(),
        );
        registry.register(
            "llm_retries",
            "LLM requests that were retries (timeouts, 429, 5xx, connection errors, schema \
             refusals)",
            llm.retries.clone(),
        );
        registry.register(
            "llm_failures",
            "LLM calls that failed after their retries (rules or extractive stood in)",
            llm.failures.clone(),
        );
        registry.register(
            "llm_tokens",
            "Tokens the LLM endpoint reported, by kind (prompt, completion)",
            llm.tokens.clone(),
        );
        registry.register(
            "llm_records",
            "Records judged and windows condensed, by outcome: judged and condensed (by the \
             model), cached and reused (a call spared), over_budget and fallback (rules or \
             extractive stood in)",
            llm.records.clone(),
        );
        let rebuilds = Counter::default();
        registry.register(
            "index_rebuilds",
            "Index rebuilds from the store (a clean restart causes none)",
            rebuilds.clone(),
        );
        let connections = ConnectionMetrics::default();
        registry.register(
            "http_connections_open",
            "HTTP connections being served",
            connections.open.clone(),
        );
        registry.register(
            "http_connections_refused",
            "Connections answered 503 overloaded because server.max_connections (or the address's share) were open, all busy",
            connections.refused.clone(),
        );
        registry.register(
            "http_connections_evicted",
            "Idle keep-alive connections closed to make room for a new connection at server.max_connections",
            connections.evicted.clone(),
        );
        registry.register(
            "http_connections_cut",
            "Connections closed at the drain deadline without their answer",
            connections.cut.clone(),
        );
        Metrics {
            registry: Mutex::new(registry),
            requests,
            latency,
            events,
            recalls,
            tool_calls,
            live_sessions,
            restarts,
            quarantined,
            records,
            unbuilt,
            in_flight,
            by_tier,
            archived,
            queues,
            queue_age,
            commit_backlog,
            promotions,
            provider_errors,
            embed_cache,
            rebuilds,
            llm,
            connections,
            cluster: ClusterMetrics::default(),
        }
    }

    /// [`Metrics::new`] with a cluster node's own figures ([`Metrics::set_node`]): every
    /// node is scraped on its own, and reports the partitions it owns.
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    pub(crate) fn for_cluster() -> Self {
        let metrics = Metrics::new();
        {
            let c = &metrics.cluster;
            let mut registry = metrics.registry.lock().unwrap_or_else(|p| p.into_inner());
            registry.register(
                "cluster_partitions",
                "Partitions on this node by role: owner (its runtime answers them; the \
                 runtime figures above sum these), standby (a copy following the log), \
                 moving (a takeover or hand-over under way)",
                c.partitions.clone(),
            );
            registry.register(
                "cluster_members",
                "Live nodes this node sees",
                c.members.clone(),
            );
            registry.register(
                "cluster_log_entries",
                "Commit groups this node appended to its partitions' JetStream logs",
                c.log_entries.clone(),
            );
            registry.register(
                "cluster_log_bytes",
                "Bytes of the entries this node appended to the logs",
                c.log_bytes.clone(),
            );
            registry.register(
                "cluster_log_retries",
                "Log appends this node sent again (no acknowledgement in time)",
                c.log_retries.clone(),
            );
            registry.register(
                "cluster_log_duplicates",
                "Appends JetStream recognised as already stored (a retry of one that was)",
                c.log_duplicates.clone(),
            );
        }
        metrics
    }

    /// A cluster node's own figures, read now (before [`Metrics::render_all`]).
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    pub(crate) fn set_node(&self, f: NodeFigures) {
        let c = &self.cluster;
        for (role, n) in [
            ("owner", f.owner),
            ("standby", f.standby),
            ("moving", f.moving),
        ] {
            c.partitions
                .get_or_create(&RoleLabels { role })
                .set(gauge(n));
        }
        c.members.set(gauge(f.members));
        catch_up(&c.log_entries, f.log_entries);
        catch_up(&c.log_bytes, f.log_bytes);
        catch_up(&c.log_retries, f.log_retries);
        catch_up(&c.log_duplicates, f.log_duplicates);
    }

    /// The accept loop's counters, shared with these metrics.
    pub fn connections(&self) -> ConnectionMetrics {
        self.connections.clone()
    }

    /// Counts one answered request.
    pub fn observe(&self, route: &str, method: &str, status: u16, seconds: f64) {
        self.requests
            .get_or_create(&RequestLabels {
                route: route.to_string(),
                method: method.to_string(),
                status,
            })
            .inc();
        self.latency
            .get_or_create(&RouteLabels {
                route: route.to_string(),
            })
            .observe(seconds);
    }

    /// Counts `n` events written.
    pub fn events_ingested(&self, n: usize) {
        self.events.inc_by(n as u64);
    }

    /// Counts one recall answered.
    pub fn recall(&self) {
        self.recalls.inc();
    }

    /// Events written and recalls answered since start (what the dashboard turns into
    /// rates).
    pub fn served(&self) -> (u64, u64) {
        (self.events.get(), self.recalls.get())
    }

    /// Counts one MCP tool call: `tool` is one of the contract's names, or `unknown` (a
    /// static name, so a client cannot grow the label set).
    pub fn tool_call(&self, tool: &'static str, ok: bool) {
        let outcome = if ok { "ok" } else { "error" };
        self.tool_calls
            .get_or_create(&ToolLabels { tool, outcome })
            .inc();
    }

    /// The text exposition, with the runtime's figures read now. A figure the runtime
    /// cannot give (it is shutting down) keeps its last value.
    pub async fn render(&self, rt: &Runtime) -> String {
        self.render_all(std::slice::from_ref(rt), Totals::default())
            .await
    }

    /// [`Metrics::render`] for a cluster node: the figures of every runtime it owns now,
    /// summed (the oldest queue item: the oldest of all), and the counters summed with
    /// `retired`, what the runtimes it closed had counted, so they never go back when a
    /// partition moves away.
    pub(crate) async fn render_all(&self, runtimes: &[Runtime], retired: Totals) -> String {
        // `None` once a runtime could not give its part: the gauge keeps its last value.
        let mut live = Some(0u64);
        let mut restarts = Some(0u64);
        let mut quarantined = Some(0u64);
        let mut totals = retired;
        let (mut records, mut in_flight, mut archived, mut backlog) = (0u64, 0u64, 0u64, 0u64);
        let mut unbuilt = [0u64; 2];
        let mut tiers = [0u64; 3];
        let mut queues: Vec<(&'static str, Option<u64>, f64)> = Vec::new();
        // Runtimes may share one embedder: each cache is counted once.
        // (Addresses as numbers: a raw pointer held across an await is not `Send`.)
        let mut caches: Vec<usize> = Vec::new();
        let mut cache = [0u64; 2];
        for rt in runtimes {
            let add = |sum: &mut Option<u64>, part: Option<u64>| {
                *sum = sum.zip(part).map(|(a, b)| a + b);
            };
            add(&mut live, rt.live_sessions().await.ok().map(|n| n as u64));
            add(&mut restarts, rt.restarts().await.ok());
            add(
                &mut quarantined,
                rt.quarantined(None).await.ok().map(|q| q.len() as u64),
            );
            let sub = rt.substrate();
            let store = sub.store();
            records += store.len();
            unbuilt[0] += sub.vectors().pending() as u64;
            unbuilt[1] += sub.keywords().pending() as u64;
            in_flight += rt.session_calls_in_flight();
            for (i, tier) in [Tier::Episodic, Tier::Condensed, Tier::Knowledge]
                .into_iter()
                .enumerate()
            {
                tiers[i] += store.tier_len(tier);
            }
            archived += store.archived_len();
            backlog += store.commit_backlog();
            for (queue, depth, age) in work_queues(sub) {
                let depth = depth.map(|n| n as u64);
                match queues.iter_mut().find(|(q, _, _)| *q == queue) {
                    Some((_, sum, oldest)) => {
                        *sum = sum.zip(depth).map(|(a, b)| a + b);
                        *oldest = oldest.max(age.unwrap_or(0.0));
                    }
                    None => queues.push((queue, depth, age.unwrap_or(0.0))),
                }
            }
            totals.add(&Totals::of(rt));
            let embedder = sub.embedder();
            let id = Arc::as_ptr(embedder) as *const () as usize;
            if let Some(stats) = embedder.cache_stats()
                && !caches.contains(&id)
            {
                caches.push(id);
                cache[0] += stats.hits;
                cache[1] += stats.misses;
            }
        }
        for (result, total) in ["hit", "miss"].into_iter().zip(cache) {
            catch_up(
                &self.embed_cache.get_or_create(&CacheLabels { result }),
                total,
            );
        }
        if let Some(n) = live {
            self.live_sessions.set(gauge(n));
        }
        if let Some(n) = restarts {
            self.restarts.set(gauge(n));
        }
        if let Some(n) = quarantined {
            self.quarantined.set(gauge(n));
        }
        self.records.set(gauge(records));
        for (index, pending) in [("vectors", unbuilt[0]), ("keywords", unbuilt[1])] {
            self.unbuilt
                .get_or_create(&IndexLabels { index })
                .set(gauge(pending));
        }
        self.in_flight.set(gauge(in_flight));
        for (tier, n) in ["episodic", "condensed", "knowledge"]
            .into_iter()
            .zip(tiers)
        {
            self.by_tier
                .get_or_create(&TierLabels { tier })
                .set(gauge(n));
        }
        self.archived.set(gauge(archived));
        for (queue, depth, age) in queues {
            if let Some(n) = depth {
                self.queues
                    .get_or_create(&QueueLabels { queue })
                    .set(gauge(n));
            }
            self.queue_age
                .get_or_create(&QueueLabels { queue })
                .set(age);
        }
        self.commit_backlog.set(gauge(backlog));
        catch_up(&self.promotions, totals.promotions);
        catch_up(&self.provider_errors, totals.provider_errors);
        catch_up(&self.llm.requests, totals.llm_requests);
        catch_up(&self.llm.retries, totals.llm_retries);
        catch_up(&self.llm.failures, totals.llm_failures);
        for (kind, total) in ["prompt", "completion"].into_iter().zip(totals.llm_tokens) {
            catch_up(&self.llm.tokens.get_or_create(&TokenLabels { kind }), total);
        }
        for (outcome, total) in OUTCOMES.into_iter().zip(totals.llm_records) {
            catch_up(
                &self.llm.records.get_or_create(&OutcomeLabels { outcome }),
                total,
            );
        }
        catch_up(&self.rebuilds, totals.rebuilds);
        let mut text = String::new();
        let registry = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &registry);
        text
    }
}

/// The outcomes of `shadowbrain_llm_records`, in [`Totals::llm_records`]' order.
const OUTCOMES: [&str; 6] = [
    "judged",
    "cached",
    "reused",
    "condensed",
    "over_budget",
    "fallback",
];

/// What a runtime counted since it opened, for the counters of [`Metrics`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Totals {
    promotions: u64,
    provider_errors: u64,
    rebuilds: u64,
    llm_requests: u64,
    llm_retries: u64,
    llm_failures: u64,
    /// Prompt, completion.
    llm_tokens: [u64; 2],
    /// By [`OUTCOMES`].
    llm_records: [u64; 6],
}

impl Totals {
    /// `rt`'s totals now.
    pub(crate) fn of(rt: &Runtime) -> Totals {
        let sub = rt.substrate();
        let llm = rt.llm_stats().unwrap_or_default();
        Totals {
            promotions: sub.promotions(),
            provider_errors: sub.provider_errors() + llm.chat.failures,
            rebuilds: sub.rebuilds(),
            llm_requests: llm.chat.requests,
            llm_retries: llm.chat.retries,
            llm_failures: llm.chat.failures,
            llm_tokens: [llm.chat.prompt_tokens, llm.chat.completion_tokens],
            llm_records: [
                llm.judged,
                llm.cache_hits,
                llm.reuse_hits,
                llm.condensed,
                llm.over_budget,
                llm.fallbacks,
            ],
        }
    }

    /// Adds `other`'s counts to these.
    pub(crate) fn add(&mut self, other: &Totals) {
        self.promotions += other.promotions;
        self.provider_errors += other.provider_errors;
        self.rebuilds += other.rebuilds;
        self.llm_requests += other.llm_requests;
        self.llm_retries += other.llm_retries;
        self.llm_failures += other.llm_failures;
        for (a, b) in self.llm_tokens.iter_mut().zip(other.llm_tokens) {
            *a += b;
        }
        for (a, b) in self.llm_records.iter_mut().zip(other.llm_records) {
            *a += b;
        }
    }
}

/// Each work queue (`enrich`, `evaluate`, `condense`, `promote`, `updates`): its depth, counted up to
/// [`QUEUE_COUNT_CAP`] (`None` when the store could not count it), and the age in seconds
/// of its oldest item (`None` when it is empty). Read from the store: call it off the async
/// workers when the answer must not wait on a busy disk.
pub(crate) fn work_queues(
    sub: &crate::Substrate,
) -> Vec<(&'static str, Option<usize>, Option<f64>)> {
    let store = sub.store();
    [
        ("enrich", Queue::Enrich),
        ("evaluate", Queue::Evaluate),
        ("condense", Queue::Condense),
        ("promote", Queue::Promote),
        ("updates", Queue::Updates),
    ]
    .into_iter()
    .map(|(name, q)| {
        let depth = store.queue_depth(q, QUEUE_COUNT_CAP).ok();
        // The queues are in id order, and ids follow arrival: the first is the oldest.
        let age = store
            .queued(q, 1)
            .ok()
            .and_then(|ids| ids.first().copied())
            .and_then(|id| store.get_light(id).ok().flatten())
            .map(|r| (sub.clock().now() - r.recorded_time).max(0) as f64 / 1000.0);
        (name, depth, age)
    })
    .collect()
}

/// A count as a gauge value (saturating: a gauge is an `i64`).
fn gauge(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Moves a Prometheus counter up to a total the runtime keeps (counters only go up; the
/// runtime's totals are since open, like the counter's).
fn catch_up(counter: &Counter, total: u64) {
    let seen = counter.get();
    if total > seen {
        counter.inc_by(total - seen);
    }
}
