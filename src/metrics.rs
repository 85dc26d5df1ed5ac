//! What `GET /metrics` reports, in the Prometheus text format (prometheus-client).
//!
//! Two kinds of figures: those the server counts as requests pass (requests by route,
//! method and status; their latency; events ingested; recalls), and those read from the
//! runtime when Prometheus scrapes (live session actors, actor restarts, quarantined
//! inputs, stored records, changes the indexes have not built yet). Reading the latter at
//! scrape time keeps the write path free of bookkeeping.

use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use shadowbrain_actors::Runtime;

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

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct IndexLabels {
    index: &'static str,
}

/// The server's metrics and their registry.
#[derive(Debug)]
pub struct Metrics {
    registry: Mutex<Registry>,
    requests: Family<RequestLabels, Counter>,
    latency: Family<RouteLabels, Histogram>,
    events: Counter,
    recalls: Counter,
    live_sessions: Gauge,
    restarts: Gauge,
    quarantined: Gauge,
    records: Gauge,
    unbuilt: Family<IndexLabels, Gauge>,
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
        Metrics {
            registry: Mutex::new(registry),
            requests,
            latency,
            events,
            recalls,
            live_sessions,
            restarts,
            quarantined,
            records,
            unbuilt,
        }
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

    /// The text exposition, with the runtime's figures read now. A figure the runtime
    /// cannot give (it is shutting down) keeps its last value.
    pub async fn render(&self, rt: &Runtime) -> String {
        if let Ok(n) = rt.live_sessions().await {
            self.live_sessions.set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        if let Ok(n) = rt.restarts().await {
            self.restarts.set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        if let Ok(entries) = rt.quarantined(None).await {
            self.quarantined
                .set(i64::try_from(entries.len()).unwrap_or(i64::MAX));
        }
        let sub = rt.substrate();
        self.records
            .set(i64::try_from(sub.store().len()).unwrap_or(i64::MAX));
        for (index, pending) in [
            ("vectors", sub.vectors().pending()),
            ("keywords", sub.keywords().pending()),
        ] {
            self.unbuilt
                .get_or_create(&IndexLabels { index })
                .set(i64::try_from(pending).unwrap_or(i64::MAX));
        }
        let mut text = String::new();
        let registry = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &registry);
        text
    }
}
