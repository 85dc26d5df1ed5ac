//! What every handler of a router reads: the runtime, the limits, the keys, the metrics,
//! the admission slots, the dashboard's own state, `/mcp`'s protocol sessions and, in
//! cluster mode, the node the router serves a partition for.

use std::collections::HashMap;
use std::sync::Arc;

use rmcp::transport::streamable_http_server::session::SessionManager;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;

use super::ServerLimits;
use super::dashboard::signins::Logins;
use super::dashboard::ui::Ui;
use crate::admission::Admission;
use crate::api::ApiError;
use crate::auth::{Auth, AuthThrottle};
use crate::metrics::Metrics;
use crate::{Limits, Runtime};

#[derive(Clone)]
pub(super) struct AppState {
    pub(super) rt: Runtime,
    pub(super) limits: Arc<Limits>,
    pub(super) auth: Arc<Auth>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) edge: ServerLimits,
    pub(super) throttle: Arc<AuthThrottle>,
    pub(super) admission: Arc<Admission>,
    /// Where admitted requests are answered, when not on the connections' own runtime
    /// (see [`serve`]).
    pub(super) work: Option<tokio::runtime::Handle>,
    /// The dashboard's sign-ins, rates and cached insights.
    pub(super) ui: Arc<Ui>,
    /// The cluster node this router serves a partition of (`None`: a single server).
    pub(super) cluster: Option<InCluster>,
    /// `/mcp`'s protocol sessions and the keys that opened them.
    pub(super) mcp_sessions: Arc<McpSessions>,
}

/// Protocol sessions of `/mcp` open at most per API key: one agent opening sessions in a
/// loop cannot fill the server's memory.
pub(crate) const MCP_SESSIONS_PER_KEY: usize = 256;

/// `/mcp`'s protocol sessions (rmcp keeps them) and, for each, the SHA-256 of the key that
/// opened it: a session answers only that key, so one tenant can neither use nor end
/// another's.
pub(crate) struct McpSessions {
    pub(super) manager: Arc<LocalSessionManager>,
    owners: std::sync::Mutex<HashMap<String, String>>,
}

impl McpSessions {
    pub(super) fn new() -> Self {
        McpSessions {
            manager: Arc::new(LocalSessionManager::default()),
            owners: std::sync::Mutex::new(HashMap::new()),
        }
    }

    pub(super) fn owners(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        self.owners.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sessions `key` holds open now (forgetting those rmcp ended: idle or closed).
    pub(super) async fn held_by(&self, key: &str) -> usize {
        let theirs: Vec<String> = self
            .owners()
            .iter()
            .filter(|(_, k)| k.as_str() == key)
            .map(|(id, _)| id.clone())
            .collect();
        let mut open = 0;
        for id in theirs {
            let live = self
                .manager
                .has_session(&Arc::from(id.as_str()))
                .await
                .unwrap_or(false);
            match live {
                true => open += 1,
                false => {
                    self.owners().remove(&id);
                }
            }
        }
        open
    }
}

/// What a cluster node lends the router of each partition it owns (`crate::cluster`).
#[derive(Clone)]
pub(crate) struct InCluster {
    /// The dashboard's sign-ins, which every node shares.
    pub(crate) logins: Arc<Logins>,
    /// What acts on, or shows, the whole cluster.
    pub(crate) node: Arc<dyn ClusterNode>,
    /// The partition this router serves.
    pub(crate) partition: u16,
}

/// A future a [`ClusterNode`] answers.
pub(crate) type NodeFuture<'a, T> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<T, ApiError>> + Send + 'a>>;

/// The cluster node behind a partition's router: what the dashboard needs beyond the
/// partition's runtime.
pub(crate) trait ClusterNode: Send + Sync {
    /// This node's name.
    fn name(&self) -> &str;
    /// Makes the policy files active on every partition of every node, or changes nothing
    /// and says why (as `POST /v1/policy/reload` does in cluster mode).
    fn reload_policies(&self) -> NodeFuture<'_, ()>;
    /// Every live node's `GET /cluster` view, by node.
    fn statuses(&self) -> NodeFuture<'_, Vec<serde_json::Value>>;
}
